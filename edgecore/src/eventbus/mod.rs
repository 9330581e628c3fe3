//! EventBus: the MQTT bridge between devices/mappers and edgecore (KubeEdge `edge/pkg/eventbus`,
//! devices reference §4).
//!
//! | mode (`mqttMode`) | what runs |
//! |---|---|
//! | 2 (default) | a subscriber and a publisher client of an external broker (`external.rs`) |
//! | 0 | an embedded MQTT 3.1.1 broker (`broker/`) the bus taps and publishes into |
//! | 1 | both; publishes go to both brokers |
//!
//! - **In**: messages on the fixed topics and on every cloud subscription (`topics.rs`; the
//!   cloud's subscriptions persist in `sub_topics`). Topics under `$hw/events/device` and
//!   `$hw/events/node` go to [`BusSinks::twin`] (devicetwin), all others to [`BusSinks::cloud`]
//!   (the caller makes KubeEdge `upload` messages of them). Sinks are bounded: a full sink drops
//!   the message with a throttled warning and a counter (`dispatch.rs`).
//! - **Out**: [`EventBus::publish`] never waits: a full queue is [`PublishError::Full`], and so
//!   is more than 4 MiB of payloads waiting for an external broker that is not connected
//!   (`external::OfflineQueue`).
//! - **Cloud operations** `subscribe` / `unsubscribe`: [`EventBus::subscribe`] and
//!   [`EventBus::unsubscribe`].
//! - **Limits**: payloads over `max_payload` (1 MiB) are dropped and counted, malformed packets
//!   are counted (`metrics.rs`); nothing a device sends can panic the bus. TLS to an external
//!   broker is not supported yet (refused at start).

mod broker;
pub(crate) mod cloud_ops;
pub(crate) mod config;
mod dispatch;
mod external;
pub(crate) mod metrics;
#[cfg(test)]
mod tests;
pub(crate) mod topics;

pub use config::{EventBusConfig, MqttMode};
pub use metrics::{BrokerLabel, DropReason, EventBusMetrics};

use crate::metamanager::store::{MetaStore, StoreError};
use broker::{BrokerHandle, BrokerSettings, InjectError};
use bytes::Bytes;
use config::BrokerAddress;
use dispatch::Dispatcher;
use metrics::Rejected;
use rumqttc::{AsyncClient, QoS};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use topics::{Subscriptions, sub_topics};

/// One MQTT message the bus received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusMessage {
    pub topic: String,
    pub payload: Bytes,
}

/// Where received messages go. Both are bounded; the bus never waits on them.
pub struct BusSinks {
    /// `$hw/events/device…` and `$hw/events/node…` topics.
    pub twin: mpsc::Sender<BusMessage>,
    /// Everything else (to the cloud as `upload`).
    pub cloud: mpsc::Sender<BusMessage>,
}

#[derive(Debug, thiserror::Error)]
pub enum EventBusError {
    #[error("eventbus configuration: {0}")]
    Config(String),
    #[error(
        "TLS to the MQTT broker (modules.eventBus.eventBusTLS.enable) is not supported yet: \
         disable it, or use the internal broker (mqttMode 0)"
    )]
    TlsUnsupported,
    #[error("not a valid MQTT topic filter: {0:?}")]
    InvalidFilter(String),
    #[error("the internal MQTT broker cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("eventbus subscriptions (sub_topics): {0}")]
    Store(#[from] StoreError),
    #[error("the eventbus has shut down")]
    Closed,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    #[error("the eventbus publish queue is full")]
    Full,
    #[error("not an MQTT topic one can publish to: {0:?}")]
    InvalidTopic(String),
    #[error("a payload of {size} bytes is over the {max}-byte limit")]
    TooLarge { size: usize, max: usize },
    #[error("the eventbus has shut down")]
    Closed,
}

/// The running bus; cheap to clone. Stops on [`EventBus::shutdown`] or when the last clone is
/// dropped.
#[derive(Clone)]
pub struct EventBus {
    inner: Arc<Inner>,
}

struct Inner {
    mode: MqttMode,
    internal_qos: QoS,
    internal_retain: bool,
    max_payload: usize,
    subscriptions: Arc<RwLock<Subscriptions>>,
    external: Option<External>,
    internal: Option<BrokerHandle>,
    store: Option<MetaStore>,
    metrics: EventBusMetrics,
    cancel: CancellationToken,
    tasks: std::sync::Mutex<Vec<JoinHandle<()>>>,
    /// Keeps `sub_topics`, the filter set and the broker subscriptions in step.
    subscribing: tokio::sync::Mutex<()>,
}

struct External {
    subscriber: AsyncClient,
    publisher: AsyncClient,
    offline: Arc<external::OfflineQueue>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl EventBus {
    /// Starts the clients and/or the internal broker of `config.mqtt_mode`. Returns once the
    /// internal broker listens; external brokers are connected (and reconnected) in the
    /// background. With a `store`, the cloud's subscriptions in `sub_topics` are restored.
    pub async fn start(
        config: EventBusConfig,
        store: Option<MetaStore>,
        sinks: BusSinks,
    ) -> Result<EventBus, EventBusError> {
        let mode = config.mode()?;
        let internal_qos = config.internal_qos()?;
        if config.tls_enable && mode.uses_external() {
            return Err(EventBusError::TlsUnsupported);
        }
        let external_address = mode
            .uses_external()
            .then(|| {
                BrokerAddress::parse(
                    "modules.eventBus.mqttServerExternal",
                    &config.server_external,
                )
            })
            .transpose()?;
        let internal_address = mode
            .uses_internal()
            .then(|| {
                BrokerAddress::parse(
                    "modules.eventBus.mqttServerInternal",
                    &config.server_internal,
                )
            })
            .transpose()?;

        let mut restored = Vec::new();
        if let Some(store) = &store {
            for topic in sub_topics::load(store).await? {
                if topics::valid_filter(&topic) {
                    restored.push(topic);
                } else {
                    tracing::warn!(topic, "eventbus: ignoring an invalid filter in sub_topics");
                }
            }
        }
        if !restored.is_empty() {
            tracing::info!(
                count = restored.len(),
                "eventbus: restored cloud subscriptions"
            );
        }
        let subscriptions = Arc::new(RwLock::new(Subscriptions::with(restored)));
        let metrics = EventBusMetrics::default();
        let dispatcher = Dispatcher::new(sinks, metrics.clone(), config.max_payload);
        let cancel = CancellationToken::new();
        let mut tasks = Vec::new();

        let internal = match internal_address {
            Some(address) => {
                let subs = subscriptions.clone();
                let d = dispatcher.clone();
                let tap: broker::Tap = Arc::new(move |topic: &str, payload: &Bytes| {
                    let wanted = subs.read().map(|s| s.matches(topic)).unwrap_or(false);
                    if wanted {
                        d.deliver(topic, payload.clone());
                    }
                });
                let settings = BrokerSettings {
                    session_queue: config.session_queue_size,
                    max_packet: config.max_payload.saturating_mul(8).max(64 * 1024),
                    ..BrokerSettings::default()
                };
                let listen = address.socket_text();
                let (handle, broker_tasks) = broker::start(
                    &listen,
                    settings,
                    tap,
                    metrics.clone(),
                    cancel.child_token(),
                )
                .await
                .map_err(|source| EventBusError::Listen {
                    addr: listen.clone(),
                    source,
                })?;
                tasks.extend(broker_tasks);
                Some(handle)
            }
            None => None,
        };

        let external = external_address.map(|address| {
            let clients = external::start(
                &config,
                &address,
                subscriptions.clone(),
                dispatcher,
                cancel.child_token(),
            );
            tasks.extend(clients.tasks);
            External {
                subscriber: clients.subscriber,
                publisher: clients.publisher,
                offline: clients.offline,
            }
        });

        Ok(EventBus {
            inner: Arc::new(Inner {
                mode,
                internal_qos,
                internal_retain: config.retain,
                max_payload: config.max_payload,
                subscriptions,
                external,
                internal,
                store,
                metrics,
                cancel,
                tasks: std::sync::Mutex::new(tasks),
                subscribing: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// Publishes to the broker(s) of the mode: QoS 1 without retain on an external broker,
    /// `mqttQOS`/`mqttRetain` into the internal one. Never waits: a full queue is
    /// [`PublishError::Full`] (in mode 1, if either broker's queue was full).
    pub fn publish(&self, topic: &str, payload: impl Into<Bytes>) -> Result<(), PublishError> {
        let inner = &self.inner;
        let payload: Bytes = payload.into();
        let refuse = |why: Rejected, e: PublishError| {
            inner.metrics.count_rejected(why);
            Err(e)
        };
        if inner.cancel.is_cancelled() {
            return refuse(Rejected::Closed, PublishError::Closed);
        }
        if !topics::valid_topic(topic) {
            return refuse(
                Rejected::InvalidTopic,
                PublishError::InvalidTopic(topic.to_string()),
            );
        }
        if payload.len() > inner.max_payload {
            return refuse(
                Rejected::TooLarge,
                PublishError::TooLarge {
                    size: payload.len(),
                    max: inner.max_payload,
                },
            );
        }
        let mut result = Ok(());
        if let Some(internal) = &inner.internal {
            match internal.inject(
                topic,
                payload.clone(),
                inner.internal_qos,
                inner.internal_retain,
            ) {
                Ok(()) => count_published(&inner.metrics, "internal"),
                Err(InjectError::Full) => {
                    result = refuse(Rejected::QueueFull, PublishError::Full);
                }
                Err(InjectError::Closed) => {
                    result = refuse(Rejected::Closed, PublishError::Closed);
                }
            }
        }
        if let Some(external) = &inner.external {
            let len = payload.len();
            if !external.offline.admit(len) {
                result = refuse(Rejected::QueueFull, PublishError::Full);
            } else {
                match external.publisher.try_publish(
                    topic,
                    QoS::AtLeastOnce,
                    false,
                    payload.to_vec(),
                ) {
                    Ok(()) => count_published(&inner.metrics, "external"),
                    Err(_) => {
                        external.offline.release(len);
                        result = refuse(Rejected::QueueFull, PublishError::Full);
                    }
                }
            }
        }
        result
    }

    /// The cloud's `subscribe`: remembers `filter` in `sub_topics` (with a store) and listens to
    /// it from now on, on every (re)connection.
    pub async fn subscribe(&self, filter: &str) -> Result<(), EventBusError> {
        let inner = &self.inner;
        if inner.cancel.is_cancelled() {
            return Err(EventBusError::Closed);
        }
        if !topics::valid_filter(filter) {
            return Err(EventBusError::InvalidFilter(filter.to_string()));
        }
        let _serial = inner.subscribing.lock().await;
        if let Some(store) = &inner.store {
            sub_topics::insert(store, filter).await?;
        }
        if let Ok(mut s) = inner.subscriptions.write() {
            s.add(filter);
        }
        if let Some(external) = &inner.external
            && let Err(e) = external.subscriber.try_subscribe(filter, QoS::AtLeastOnce)
        {
            // The subscription is in the set: the next (re)connection subscribes it.
            tracing::warn!(filter, error = %e, "eventbus: cannot queue an MQTT subscription now");
        }
        tracing::info!(filter, "eventbus: subscribed for the cloud");
        Ok(())
    }

    /// The cloud's `unsubscribe`: forgets `filter` (the fixed topics stay subscribed).
    pub async fn unsubscribe(&self, filter: &str) -> Result<(), EventBusError> {
        let inner = &self.inner;
        if inner.cancel.is_cancelled() {
            return Err(EventBusError::Closed);
        }
        let _serial = inner.subscribing.lock().await;
        if let Some(store) = &inner.store {
            sub_topics::delete(store, filter).await?;
        }
        let removed = inner
            .subscriptions
            .write()
            .map(|mut s| s.remove(filter))
            .unwrap_or(false);
        if removed
            && let Some(external) = &inner.external
            && let Err(e) = external.subscriber.try_unsubscribe(filter)
        {
            tracing::warn!(filter, error = %e, "eventbus: cannot queue an MQTT unsubscription now");
        }
        tracing::info!(filter, "eventbus: unsubscribed for the cloud");
        Ok(())
    }

    /// Disconnects from the brokers, stops the internal broker and waits (a few seconds at
    /// most) for every task to end.
    pub async fn shutdown(self) {
        self.inner.cancel.cancel();
        let tasks = match self.inner.tasks.lock() {
            Ok(mut t) => std::mem::take(&mut *t),
            Err(_) => return,
        };
        for task in tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(3), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        tracing::info!("eventbus: stopped");
    }

    pub fn mode(&self) -> MqttMode {
        self.inner.mode
    }

    pub fn metrics(&self) -> &EventBusMetrics {
        &self.inner.metrics
    }

    /// Where the internal broker listens (useful with port 0).
    pub fn internal_broker_addr(&self) -> Option<SocketAddr> {
        self.inner.internal.as_ref().map(BrokerHandle::local_addr)
    }

    /// The filters the bus listens to: the fixed ones, then the cloud's.
    pub fn subscriptions(&self) -> Vec<String> {
        self.inner
            .subscriptions
            .read()
            .map(|s| s.all().map(str::to_string).collect())
            .unwrap_or_default()
    }
}

fn count_published(metrics: &EventBusMetrics, broker: &'static str) {
    metrics
        .published
        .get_or_create(&BrokerLabel { broker })
        .inc();
}
