//! The clients of an external broker (mosquitto; modes 1 and 2, reference §4.2): a subscriber
//! and a publisher, MQTT 3.1.1 with clean sessions. A lost connection is retried every
//! `reconnect_interval` (KubeEdge: 5 s) forever; on every (re)connect the subscriber subscribes
//! again, QoS 1, to the fixed topics and every cloud subscription.

use super::EventBusConfig;
use super::config::BrokerAddress;
use super::dispatch::Dispatcher;
use super::metrics::{BrokerLabel, Malformed};
use super::topics::Subscriptions;
use rumqttc::{
    AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, Outgoing, Packet, QoS, StateError,
    SubscribeFilter, SubscribeReasonCode,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const BROKER: BrokerLabel = BrokerLabel { broker: "external" };
/// Filters per SUBSCRIBE packet when (re)subscribing many.
const FILTERS_PER_SUBSCRIBE: usize = 64;
/// MQTT keepalive (Paho's default).
const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// Handles on the two clients; their event loops run as tasks.
pub(super) struct ExternalClients {
    pub subscriber: AsyncClient,
    pub publisher: AsyncClient,
    pub offline: Arc<OfflineQueue>,
    pub tasks: Vec<JoinHandle<()>>,
}

/// What the publisher may queue while its broker is not connected: publishes wait in the
/// client's queue until it connects, so without a budget in bytes a broker that is down (or was
/// never installed) holds up to `publish_queue` × the payload limit of the edge's memory.
/// While connected the queue drains, and only its length bounds it.
#[derive(Debug)]
pub(super) struct OfflineQueue {
    connected: AtomicBool,
    /// Payload bytes queued since the connection was lost (or since start).
    bytes: AtomicUsize,
    budget: usize,
}

impl OfflineQueue {
    pub fn new(budget: usize) -> Self {
        OfflineQueue {
            connected: AtomicBool::new(false),
            bytes: AtomicUsize::new(0),
            budget,
        }
    }

    /// Takes room for a payload of `len` bytes: false when the broker is not connected and the
    /// budget is spent.
    pub fn admit(&self, len: usize) -> bool {
        if self.connected.load(Ordering::Acquire) {
            return true;
        }
        self.bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                b.checked_add(len).filter(|n| *n <= self.budget)
            })
            .is_ok()
    }

    /// Gives back what [`OfflineQueue::admit`] took for a publish that was not queued after all.
    pub fn release(&self, len: usize) {
        let _ = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                Some(b.saturating_sub(len))
            });
    }

    /// Connected: what was queued is on its way.
    fn up(&self) {
        self.connected.store(true, Ordering::Release);
        self.bytes.store(0, Ordering::Release);
    }

    fn down(&self) {
        self.connected.store(false, Ordering::Release);
    }
}

pub(super) fn start(
    config: &EventBusConfig,
    address: &BrokerAddress,
    subscriptions: Arc<RwLock<Subscriptions>>,
    dispatcher: Dispatcher,
    cancel: CancellationToken,
) -> ExternalClients {
    let sub_id = config.sub_client_id();
    let pub_id = config.pub_client_id();
    tracing::info!(
        broker = %address.socket_text(),
        subscriber = %sub_id,
        publisher = %pub_id,
        "eventbus: connecting to the external MQTT broker"
    );
    let (subscriber, sub_loop) =
        AsyncClient::new(options(config, address, sub_id), config.publish_queue);
    let (publisher, pub_loop) =
        AsyncClient::new(options(config, address, pub_id), config.publish_queue);
    let offline = Arc::new(OfflineQueue::new(config.offline_queue_bytes));
    let sub_task = tokio::spawn(run(
        Role::Subscriber {
            client: subscriber.clone(),
            subscriptions,
        },
        sub_loop,
        dispatcher.clone(),
        config.reconnect_interval,
        cancel.clone(),
    ));
    let pub_task = tokio::spawn(run(
        Role::Publisher {
            client: publisher.clone(),
            offline: offline.clone(),
        },
        pub_loop,
        dispatcher,
        config.reconnect_interval,
        cancel,
    ));
    ExternalClients {
        subscriber,
        publisher,
        offline,
        tasks: vec![sub_task, pub_task],
    }
}

fn options(config: &EventBusConfig, address: &BrokerAddress, id: String) -> MqttOptions {
    let mut o = MqttOptions::new(id, address.host.clone(), address.port);
    o.set_clean_session(true);
    o.set_keep_alive(KEEP_ALIVE);
    // Incoming packets up to 4× the payload limit are read and dropped with a count; only larger
    // ones cost the connection (the client cannot skip a packet it refuses to read).
    let topic_room = 64 * 1024;
    o.set_max_packet_size(
        config.max_payload.saturating_mul(4) + topic_room,
        config.max_payload + topic_room,
    );
    if !config.username.is_empty() {
        o.set_credentials(config.username.clone(), config.password.clone());
    }
    o
}

enum Role {
    Subscriber {
        client: AsyncClient,
        subscriptions: Arc<RwLock<Subscriptions>>,
    },
    Publisher {
        client: AsyncClient,
        offline: Arc<OfflineQueue>,
    },
}

impl Role {
    fn name(&self) -> &'static str {
        match self {
            Role::Subscriber { .. } => "subscriber",
            Role::Publisher { .. } => "publisher",
        }
    }

    fn client(&self) -> &AsyncClient {
        match self {
            Role::Subscriber { client, .. } | Role::Publisher { client, .. } => client,
        }
    }
}

/// While the broker stays unreachable, one warning per this many attempts.
const WARN_EVERY: u32 = 60;

async fn run(
    role: Role,
    mut events: EventLoop,
    dispatcher: Dispatcher,
    reconnect_interval: Duration,
    cancel: CancellationToken,
) {
    let metrics = dispatcher.metrics().clone();
    // Failed attempts since the last connection: the first is a warning, then one every
    // `WARN_EVERY` (a broker that is not installed must not flood the log).
    let mut failures: u32 = 0;
    loop {
        let event = tokio::select! {
            _ = cancel.cancelled() => break,
            e = events.poll() => e,
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                failures = 0;
                tracing::info!(
                    client = role.name(),
                    "eventbus: connected to the MQTT broker"
                );
                match &role {
                    Role::Subscriber {
                        client,
                        subscriptions,
                    } => subscribe_all(client, subscriptions),
                    Role::Publisher { offline, .. } => offline.up(),
                }
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                if matches!(role, Role::Subscriber { .. }) {
                    dispatcher.deliver(&p.topic, p.payload);
                }
            }
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                let refused = ack
                    .return_codes
                    .iter()
                    .filter(|c| matches!(c, SubscribeReasonCode::Failure))
                    .count();
                if refused > 0 {
                    tracing::warn!(refused, "eventbus: the MQTT broker refused subscriptions");
                }
            }
            Ok(_) => {}
            Err(e) => {
                if let Role::Publisher { offline, .. } = &role {
                    offline.down();
                }
                if let Some(kind) = malformed(&e) {
                    metrics.count_malformed(kind);
                }
                metrics.connection_losses.get_or_create(&BROKER).inc();
                if failures.is_multiple_of(WARN_EVERY) {
                    tracing::warn!(
                        client = role.name(),
                        error = %e,
                        attempts = failures + 1,
                        "eventbus: MQTT broker connection lost or refused; retrying every {:?} \
                         (is the broker of modules.eventBus.mqttServerExternal running?)",
                        reconnect_interval
                    );
                } else {
                    tracing::debug!(client = role.name(), error = %e, "eventbus: MQTT broker still unreachable");
                }
                failures = failures.saturating_add(1);
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(reconnect_interval) => {}
                }
            }
        }
    }
    disconnect(role.client(), &mut events).await;
}

/// Subscribes, QoS 1, to every filter the bus listens to, in a few SUBSCRIBE packets.
fn subscribe_all(client: &AsyncClient, subscriptions: &RwLock<Subscriptions>) {
    let filters: Vec<SubscribeFilter> = match subscriptions.read() {
        Ok(s) => s
            .all()
            .map(|f| SubscribeFilter::new(f.to_string(), QoS::AtLeastOnce))
            .collect(),
        Err(_) => return,
    };
    let total = filters.len();
    let mut chunks = filters.into_iter().peekable();
    while chunks.peek().is_some() {
        let chunk: Vec<SubscribeFilter> = chunks.by_ref().take(FILTERS_PER_SUBSCRIBE).collect();
        if let Err(e) = client.try_subscribe_many(chunk) {
            tracing::error!(error = %e, "eventbus: cannot queue the MQTT subscriptions");
            return;
        }
    }
    tracing::info!(filters = total, "eventbus: subscribed to the MQTT topics");
}

/// The malformed-input kind behind a connection error, if that is what ended it.
fn malformed(e: &ConnectionError) -> Option<Malformed> {
    use rumqttc::mqttbytes::Error as Wire;
    match e {
        ConnectionError::MqttState(StateError::Deserialization(w)) => Some(match w {
            Wire::TopicNotUtf8 => Malformed::TopicNotUtf8,
            Wire::PayloadSizeLimitExceeded(_) => Malformed::PacketTooLarge,
            _ => Malformed::Protocol,
        }),
        _ => None,
    }
}

/// Says goodbye to the broker if connected, within a second.
async fn disconnect(client: &AsyncClient, events: &mut EventLoop) {
    if client.try_disconnect().is_err() {
        return;
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            match events.poll().await {
                Ok(Event::Outgoing(Outgoing::Disconnect)) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::OfflineQueue;

    #[test]
    fn the_offline_budget_counts_bytes_until_connected() {
        let q = OfflineQueue::new(100);
        assert!(q.admit(60));
        assert!(!q.admit(41), "over the budget while offline");
        assert!(q.admit(40));
        q.release(40); // a publish the client refused after all
        assert!(q.admit(40));
        q.up();
        assert!(
            q.admit(10_000),
            "connected: the queue drains, only its length bounds it"
        );
        q.down();
        assert!(
            q.admit(100),
            "what waited went out on connecting: the budget is whole again"
        );
        assert!(!q.admit(1));
        assert!(!q.admit(usize::MAX), "no overflow");
    }
}
