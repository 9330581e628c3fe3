//! The embedded MQTT 3.1.1 broker (modes 0 and 1, reference §4.3): plain TCP, no
//! authentication, in memory, clean sessions only (a client asking for a persistent session gets
//! a new one, `session present = 0`).
//!
//! One router task owns every subscription and the retained messages and never waits on the
//! network: it hands each delivery to the client's bounded queue (`mqttSessionQueueSize`),
//! dropping it (counted) when full. One task per connection reads and writes the socket
//! (`session.rs`). The packet codec is rumqttc's.
//!
//! The eventbus is not a client: it sees every PUBLISH a client sends through a `Tap`, and
//! injects its own publishes with [`BrokerHandle::inject`]; those do not go back to the tap.

mod session;

use super::metrics::EventBusMetrics;
use super::topics;
use bytes::Bytes;
use rumqttc::{Publish, QoS};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Called with every PUBLISH a client sends (topic, payload).
pub(super) type Tap = Arc<dyn Fn(&str, &Bytes) + Send + Sync>;

/// Commands queued for the router, at most.
const COMMAND_QUEUE: usize = 4096;

#[derive(Debug, Clone)]
pub(super) struct BrokerSettings {
    /// Deliveries queued per client (`mqttSessionQueueSize`).
    pub session_queue: usize,
    /// Largest packet a client may send.
    pub max_packet: usize,
    pub max_clients: usize,
    pub max_retained: usize,
}

impl Default for BrokerSettings {
    fn default() -> Self {
        BrokerSettings {
            session_queue: 100,
            max_packet: 8 * 1024 * 1024,
            max_clients: 1024,
            max_retained: 10_000,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum InjectError {
    #[error("the internal broker's queue is full")]
    Full,
    #[error("the internal broker has stopped")]
    Closed,
}

/// Talks to a running broker; cheap to clone.
#[derive(Clone)]
pub(super) struct BrokerHandle {
    commands: mpsc::Sender<Command>,
    local_addr: SocketAddr,
}

impl BrokerHandle {
    /// Publishes as the broker itself (not seen by the tap). Never waits.
    pub fn inject(
        &self,
        topic: &str,
        payload: Bytes,
        qos: QoS,
        retain: bool,
    ) -> Result<(), InjectError> {
        let mut publish = Publish::from_bytes(topic, qos, payload);
        publish.retain = retain;
        self.commands
            .try_send(Command::Publish {
                from: None,
                publish,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => InjectError::Full,
                mpsc::error::TrySendError::Closed(_) => InjectError::Closed,
            })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

/// Listens on `addr` and runs until `cancel`.
pub(super) async fn start(
    addr: &str,
    settings: BrokerSettings,
    tap: Tap,
    metrics: EventBusMetrics,
    cancel: CancellationToken,
) -> std::io::Result<(BrokerHandle, Vec<JoinHandle<()>>)> {
    let listener = TcpListener::bind(addr).await?;
    let local_addr = listener.local_addr()?;
    let (commands, rx) = mpsc::channel(COMMAND_QUEUE);
    let router = Router {
        sessions: HashMap::new(),
        by_client_id: HashMap::new(),
        retained: HashMap::new(),
        next_id: 1,
        settings: settings.clone(),
        tap,
        metrics: metrics.clone(),
    };
    let router_task = tokio::spawn(router.run(rx, cancel.clone()));
    let accept_task = tokio::spawn(accept(
        listener,
        commands.clone(),
        settings,
        metrics,
        cancel,
    ));
    tracing::info!(%local_addr, "eventbus: internal MQTT broker listening");
    Ok((
        BrokerHandle {
            commands,
            local_addr,
        },
        vec![router_task, accept_task],
    ))
}

async fn accept(
    listener: TcpListener,
    commands: mpsc::Sender<Command>,
    settings: BrokerSettings,
    metrics: EventBusMetrics,
    cancel: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(settings.max_clients));
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and the like: wait a little rather than spin.
                tracing::warn!(error = %e, "eventbus: internal broker cannot accept");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics.broker_refused_clients.inc();
            tracing::warn!(%peer, "eventbus: internal broker at its client limit, connection refused");
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(session::serve(
            stream,
            peer,
            commands.clone(),
            settings.clone(),
            metrics.clone(),
            cancel.child_token(),
            slot,
        ));
    }
}

enum Command {
    Connect {
        client_id: String,
        outbox: mpsc::Sender<Publish>,
        kick: CancellationToken,
        will: Option<Publish>,
        reply: oneshot::Sender<u64>,
    },
    Subscribe {
        session: u64,
        filters: Vec<(String, QoS)>,
        /// The retained messages the new filters match.
        reply: oneshot::Sender<Vec<Publish>>,
    },
    Unsubscribe {
        session: u64,
        filters: Vec<String>,
    },
    Publish {
        /// The sending session; `None` for the eventbus.
        from: Option<u64>,
        publish: Publish,
    },
    Disconnect {
        session: u64,
        /// Whether to publish the will (the client went away without DISCONNECT).
        send_will: bool,
    },
}

struct SessionEntry {
    client_id: String,
    outbox: mpsc::Sender<Publish>,
    kick: CancellationToken,
    will: Option<Publish>,
    filters: Vec<(String, QoS)>,
}

struct Router {
    sessions: HashMap<u64, SessionEntry>,
    by_client_id: HashMap<String, u64>,
    retained: HashMap<String, Publish>,
    next_id: u64,
    settings: BrokerSettings,
    tap: Tap,
    metrics: EventBusMetrics,
}

impl Router {
    async fn run(mut self, mut rx: mpsc::Receiver<Command>, cancel: CancellationToken) {
        loop {
            let command = tokio::select! {
                _ = cancel.cancelled() => break,
                c = rx.recv() => match c {
                    Some(c) => c,
                    None => break,
                },
            };
            self.handle(command);
        }
        for s in self.sessions.values() {
            s.kick.cancel();
        }
        self.metrics.broker_clients.set(0);
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Connect {
                client_id,
                outbox,
                kick,
                will,
                reply,
            } => {
                let id = self.next_id;
                self.next_id += 1;
                // MQTT 3.1.1 §3.1.4: a second connection with the same client ID takes over.
                if let Some(old) = self.by_client_id.insert(client_id.clone(), id)
                    && let Some(old) = self.sessions.remove(&old)
                {
                    tracing::info!(client_id, "eventbus: internal broker: client taken over");
                    old.kick.cancel();
                }
                self.sessions.insert(
                    id,
                    SessionEntry {
                        client_id,
                        outbox,
                        kick,
                        will,
                        filters: Vec::new(),
                    },
                );
                self.metrics.broker_clients.set(self.sessions.len() as i64);
                let _ = reply.send(id);
            }
            Command::Subscribe {
                session,
                filters,
                reply,
            } => {
                let Some(entry) = self.sessions.get_mut(&session) else {
                    return;
                };
                let mut retained = Vec::new();
                for (filter, qos) in filters {
                    for r in self.retained.values() {
                        if topics::matches(&filter, &r.topic) {
                            let mut p = r.clone();
                            p.qos = min_qos(p.qos, qos);
                            retained.push(p);
                        }
                    }
                    match entry.filters.iter_mut().find(|(f, _)| *f == filter) {
                        Some(existing) => existing.1 = qos,
                        None => entry.filters.push((filter, qos)),
                    }
                }
                let _ = reply.send(retained);
            }
            Command::Unsubscribe { session, filters } => {
                if let Some(entry) = self.sessions.get_mut(&session) {
                    entry.filters.retain(|(f, _)| !filters.contains(f));
                }
            }
            Command::Publish { from, publish } => self.publish(from, publish),
            Command::Disconnect { session, send_will } => {
                let Some(entry) = self.sessions.remove(&session) else {
                    return;
                };
                if self.by_client_id.get(&entry.client_id) == Some(&session) {
                    self.by_client_id.remove(&entry.client_id);
                }
                self.metrics.broker_clients.set(self.sessions.len() as i64);
                if send_will && let Some(will) = entry.will {
                    self.publish(Some(session), will);
                }
            }
        }
    }

    fn publish(&mut self, from: Option<u64>, publish: Publish) {
        if publish.retain {
            self.retain(&publish);
        }
        for entry in self.sessions.values() {
            let granted = entry
                .filters
                .iter()
                .filter(|(f, _)| topics::matches(f, &publish.topic))
                .map(|(_, q)| *q)
                .max_by_key(|q| *q as u8);
            let Some(granted) = granted else { continue };
            let mut p = Publish::from_bytes(
                publish.topic.clone(),
                min_qos(publish.qos, granted),
                publish.payload.clone(),
            );
            p.retain = false;
            if entry.outbox.try_send(p).is_err() {
                self.metrics.broker_deliveries_dropped.inc();
            }
        }
        if from.is_some() {
            (self.tap)(&publish.topic, &publish.payload);
        }
    }

    fn retain(&mut self, publish: &Publish) {
        if publish.payload.is_empty() {
            self.retained.remove(&publish.topic);
        } else if self.retained.len() < self.settings.max_retained
            || self.retained.contains_key(&publish.topic)
        {
            let mut kept = publish.clone();
            kept.pkid = 0;
            kept.dup = false;
            self.retained.insert(publish.topic.clone(), kept);
        } else {
            tracing::warn!(
                max = self.settings.max_retained,
                "eventbus: internal broker holds its maximum of retained messages; not retained"
            );
        }
    }
}

fn min_qos(a: QoS, b: QoS) -> QoS {
    if (a as u8) <= (b as u8) { a } else { b }
}
