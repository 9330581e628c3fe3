//! cloudhub: the WSS server edge nodes dial (protocol §2), one session per node, with
//! per-node ordered, at-least-once send queues (protocol §3).
//!
//! Controllers use [`CloudHub`]: `send` to a node, `connected_nodes`, `subscribe` to connect /
//! disconnect events, and read upstream messages from the receiver returned by `bind`.

mod admission;
pub(crate) mod handshake;
pub(crate) mod queue;
mod server;
mod session;
mod sink;
pub(crate) mod upstream;

pub use queue::Enqueued;
pub use sink::HubSink;

use crate::metrics::{HubMetrics, ReasonLabel};
use dashmap::DashMap;
use kubeedge_shared::config::ConfigError;
use kubeedge_shared::{CodecError, FrameCodec, Message};
use queue::{AckedMessage, NodeQueue, QueueFull, QueueLimits};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub struct HubConfig {
    pub listen: SocketAddr,
    /// Drop a session when no keepalive arrived for this long (KubeEdge `keepaliveInterval`).
    pub keepalive_interval: Duration,
    /// Most nodes connected at once; further connections are refused.
    pub node_limit: usize,
    /// Accept KubeEdge ≤ v1.15 certificates whose CN is the shared `kubeedge.io`.
    pub allow_legacy_cn: bool,
    pub max_frame_bytes: usize,
    pub queue: QueueLimits,
    /// TLS + WebSocket handshake must finish within this (waiting for admission included).
    pub handshake_timeout: Duration,
    /// Most handshakes past their first bytes at once (`cloudHub.maxConcurrentHandshakes`);
    /// the rest wait their turn (`admission`).
    pub max_handshakes: usize,
    /// An admitted handshake must finish within this.
    pub admitted_handshake_timeout: Duration,
    /// A write that does not complete within this ends the session.
    pub write_timeout: Duration,
    /// Capacity of the upstream channel shared by all sessions (backpressure beyond it).
    pub upstream_capacity: usize,
}

impl HubConfig {
    /// cloudhub's settings from `modules.cloudHub` of a cloudcore configuration.
    pub fn from_cloudcore(c: &crate::config::CloudCoreConfig) -> Result<Self, ConfigError> {
        let hub = &c.modules.cloud_hub;
        let q = &hub.node_queue;
        let listen = crate::config::listen_addr(&hub.websocket, "modules.cloudHub.websocket")
            .map_err(|(path, reason)| ConfigError::invalid(&path, reason))?;
        Ok(HubConfig {
            listen,
            keepalive_interval: Duration::from_secs(hub.keepalive_interval),
            node_limit: hub.node_limit,
            allow_legacy_cn: hub.allow_legacy_certificates,
            max_frame_bytes: hub.max_message_bytes,
            queue: QueueLimits {
                max_messages: q.max_messages,
                max_bytes: q.max_bytes,
                window: q.ack_window,
                retry_interval: Duration::from_secs(q.ack_retry_interval.max(1)),
                ..QueueLimits::default()
            },
            write_timeout: Duration::from_secs(hub.write_timeout.clamp(1, 60)),
            max_handshakes: hub.max_concurrent_handshakes.max(1),
            ..HubConfig::default()
        })
    }
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig {
            listen: SocketAddr::from((
                [0, 0, 0, 0],
                kubeedge_shared::constants::DEFAULT_CLOUDHUB_PORT,
            )),
            keepalive_interval: Duration::from_secs(
                kubeedge_shared::constants::DEFAULT_KEEPALIVE_INTERVAL_SECS,
            ),
            node_limit: kubeedge_shared::constants::DEFAULT_NODE_LIMIT,
            allow_legacy_cn: false,
            max_frame_bytes: kubeedge_shared::codec::DEFAULT_MAX_FRAME_BYTES,
            queue: QueueLimits::default(),
            handshake_timeout: Duration::from_secs(30),
            max_handshakes: kubeedge_shared::constants::DEFAULT_MAX_HANDSHAKES,
            admitted_handshake_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(15),
            upstream_capacity: 4096,
        }
    }
}

/// What a connected edge said about itself in the handshake (this cloudcore offers every
/// one of them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// The edge sends an inventory on connect and expects only the difference.
    pub inventory_resync: bool,
    /// The edge's heartbeat is a WebSocket ping alone.
    pub ping_keepalive: bool,
    /// This cloudcore renews the edge's Lease (of this many seconds) when it hears from it,
    /// and sends the edge its Node when the cluster marks it Unknown.
    pub cloud_lease: Option<u32>,
}

/// The capabilities this cloudcore advertises in its answer to the upgrade.
#[cfg(test)]
pub(crate) const OFFERED: &[&str] = &[
    kubeedge_shared::constants::CAPABILITY_INVENTORY,
    kubeedge_shared::constants::CAPABILITY_PING_KEEPALIVE,
    kubeedge_shared::constants::CAPABILITY_CLOUD_LEASE,
];

/// The cloud heard from an edge that lets it renew its Lease (`cloud_lease`), at least a
/// quarter of the lease's duration after the last report.
#[derive(Debug, Clone)]
pub struct Heard {
    pub node: String,
    pub at: std::time::SystemTime,
    /// The edge's `nodeLeaseDurationSeconds`.
    pub lease_secs: u32,
}

#[derive(Debug, Clone)]
pub enum NodeEvent {
    Connected {
        node: String,
        session: u64,
        capabilities: Capabilities,
    },
    Disconnected {
        node: String,
        session: u64,
        reason: String,
    },
    /// A message to this node was refused because its queue is full: the node's copy may now
    /// be behind, and a controller should resynchronise it once the queue drains.
    QueueOverflow { node: String },
}

/// A message from an edge: the session's node, the message's resource parsed once (wire form,
/// as the edge sent it), and the message.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub node: String,
    pub path: kubeedge_shared::ResourcePath,
    pub message: Message,
}

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("node {0} is not connected")]
    NotConnected(String),
    #[error("node {node}: {source}")]
    QueueFull { node: String, source: QueueFull },
    #[error("cannot encode message for node {node}: {source}")]
    Encode { node: String, source: CodecError },
}

struct SessionHandle {
    id: u64,
    queue: Arc<NodeQueue>,
    cancel: CancellationToken,
    capabilities: Capabilities,
}

pub(crate) struct Inner {
    config: HubConfig,
    codec: FrameCodec,
    sessions: DashMap<String, SessionHandle>,
    events: broadcast::Sender<NodeEvent>,
    upstream: mpsc::Sender<Upstream>,
    metrics: HubMetrics,
    admission: Arc<admission::Admission>,
    next_session: AtomicU64,
    shutdown: CancellationToken,
    acks: std::sync::Mutex<Option<mpsc::Sender<Acked>>>,
    heard: std::sync::Mutex<Option<mpsc::Sender<Heard>>>,
    router: std::sync::Mutex<Option<(mpsc::Sender<RouterMessage>, ByteBudget)>>,
}

/// A message of group `user` from an edge (the router's traffic: eventbus and servicebus
/// uploads, servicebus answers), with the node of the session it came on, and the bytes it
/// holds of the router's budget (given back when the router drops `held`).
#[derive(Debug)]
pub struct RouterMessage {
    pub node: String,
    pub message: Message,
    pub held: BudgetTicket,
}

/// A limit on the bytes held by messages between cloudhub and a consumer (and wherever the
/// consumer keeps their tickets): beyond it new messages are refused.
#[derive(Debug, Clone)]
pub struct ByteBudget {
    used: Arc<AtomicUsize>,
    limit: usize,
}

/// Bytes taken from a [`ByteBudget`]; given back on drop.
#[derive(Debug)]
pub struct BudgetTicket {
    used: Arc<AtomicUsize>,
    bytes: usize,
}

impl ByteBudget {
    pub fn new(limit: usize) -> Self {
        ByteBudget {
            used: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// `bytes` of the budget, unless that would pass its limit.
    pub fn try_take(&self, bytes: usize) -> Option<BudgetTicket> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(bytes).filter(|t| *t <= self.limit)
            })
            .ok()
            .map(|_| BudgetTicket {
                used: self.used.clone(),
                bytes,
            })
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

impl Drop for BudgetTicket {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A delivery the edge confirmed (for controllers that record delivery state, e.g. the
/// ObjectSync compatibility mode for KubeEdge edges).
#[derive(Debug, Clone)]
pub struct Acked {
    pub node: String,
    pub message: AckedMessage,
}

/// Handle to the running hub; cheap to clone.
#[derive(Clone)]
pub struct CloudHub {
    inner: Arc<Inner>,
    local_addr: SocketAddr,
}

impl CloudHub {
    /// Binds the listener and starts accepting. Upstream messages arrive on the receiver.
    pub async fn bind(
        config: HubConfig,
        tls: Arc<rustls::ServerConfig>,
        metrics: HubMetrics,
    ) -> std::io::Result<(CloudHub, mpsc::Receiver<Upstream>)> {
        let listener = server::listen(config.listen)?;
        let local_addr = listener.local_addr()?;
        let (up_tx, up_rx) = mpsc::channel(config.upstream_capacity.max(1));
        let (events, _) = broadcast::channel(65_536);
        let inner = Arc::new(Inner {
            codec: FrameCodec::new(config.max_frame_bytes),
            admission: admission::Admission::new(config.max_handshakes),
            config,
            sessions: DashMap::new(),
            events,
            upstream: up_tx,
            metrics,
            next_session: AtomicU64::new(1),
            shutdown: CancellationToken::new(),
            acks: std::sync::Mutex::new(None),
            heard: std::sync::Mutex::new(None),
            router: std::sync::Mutex::new(None),
        });
        tokio::spawn(server::accept_loop(inner.clone(), listener, tls));
        tracing::info!(%local_addr, "cloudhub listening");
        Ok((CloudHub { inner, local_addr }, up_rx))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Queues `msg` for `node`; its resource is in wire form (`<ns>/<type>/<name>`): the node
    /// is this argument, never part of the path (KubeEdge glues `node/<n>/` on between its
    /// modules and strips it again in `TrimMessage`; nothing here needs that).
    pub fn send(&self, node: &str, msg: Message) -> Result<Enqueued, SendError> {
        let Some(queue) = self.inner.sessions.get(node).map(|s| s.queue.clone()) else {
            return Err(SendError::NotConnected(node.to_string()));
        };
        let frame = self.inner.codec.encode(&msg).map_err(|source| {
            self.inner
                .metrics
                .messages_dropped
                .get_or_create(&ReasonLabel { reason: "encode" })
                .inc();
            SendError::Encode {
                node: node.to_string(),
                source,
            }
        })?;
        match queue.push(&msg, frame.into()) {
            Ok(e) => Ok(e),
            Err(source) => {
                tracing::warn!(node, %source, "downstream message refused");
                let _ = self.inner.events.send(NodeEvent::QueueOverflow {
                    node: node.to_string(),
                });
                Err(SendError::QueueFull {
                    node: node.to_string(),
                    source,
                })
            }
        }
    }

    pub fn is_connected(&self, node: &str) -> bool {
        self.inner.sessions.contains_key(node)
    }

    pub fn connected_nodes(&self) -> Vec<String> {
        self.inner
            .sessions
            .iter()
            .map(|s| s.key().clone())
            .collect()
    }

    pub fn connected_count(&self) -> usize {
        self.inner.sessions.len()
    }

    pub fn capabilities(&self, node: &str) -> Option<Capabilities> {
        self.inner
            .sessions
            .get(node)
            .map(|s| s.capabilities.clone())
    }

    /// Messages held for a node (pending + awaiting ACK).
    pub fn queue_len(&self, node: &str) -> Option<usize> {
        self.inner.sessions.get(node).map(|s| s.queue.len())
    }

    /// Connect / disconnect / overflow events. A receiver that lags gets `Lagged` and should
    /// treat every node as possibly changed (`connected_nodes` tells the current state).
    pub fn subscribe(&self) -> broadcast::Receiver<NodeEvent> {
        self.inner.events.subscribe()
    }

    /// Ends a node's session (e.g. the Node object was deleted).
    pub fn disconnect(&self, node: &str) -> bool {
        match self.inner.sessions.get(node) {
            Some(s) => {
                s.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Starts reporting every matched ACK on the returned channel (one consumer; a later call
    /// replaces the earlier). When the consumer falls `capacity` behind, reports are dropped
    /// and counted in `cloudhub_messages_dropped{reason="ack_report"}`.
    pub fn subscribe_acks(&self, capacity: usize) -> mpsc::Receiver<Acked> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        *self.inner.acks.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        rx
    }

    /// Reports, on the returned channel, edges with `cloud_lease` heard from (one consumer; a
    /// later call replaces the earlier). A report the consumer has no room for is dropped and
    /// counted in `cloudhub_messages_dropped{reason="heard_report"}`; the next frame from that
    /// edge reports again.
    pub fn subscribe_heard(&self, capacity: usize) -> mpsc::Receiver<Heard> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        *self.inner.heard.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        rx
    }

    /// Hands every upstream message of group `user` to the returned channel (the router; one
    /// consumer, a later call replaces the earlier), each holding its frame's size of
    /// `budget`. Without a consumer, when it falls `capacity` messages behind or the messages
    /// it holds reach the budget, they are dropped and counted in
    /// `cloudhub_messages_dropped{reason="no_router"|"router_full"}`: the router never slows
    /// a node's other traffic, and its memory stays bounded.
    pub fn subscribe_router(
        &self,
        capacity: usize,
        budget: ByteBudget,
    ) -> mpsc::Receiver<RouterMessage> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        *self.inner.router.lock().unwrap_or_else(|e| e.into_inner()) = Some((tx, budget));
        rx
    }

    /// Stops accepting and ends every session.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }
}

impl Inner {
    fn next_session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }

    fn dispatch_router(&self, node: &str, message: Message, frame_bytes: usize) {
        let reason = {
            let guard = self.router.lock().unwrap_or_else(|e| e.into_inner());
            match guard.as_ref() {
                None => "no_router",
                Some((tx, budget)) => match budget.try_take(frame_bytes) {
                    None => "router_full",
                    Some(held) => match tx.try_send(RouterMessage {
                        node: node.to_string(),
                        message,
                        held,
                    }) {
                        Ok(()) => return,
                        Err(mpsc::error::TrySendError::Full(_)) => "router_full",
                        Err(mpsc::error::TrySendError::Closed(_)) => "no_router",
                    },
                },
            }
        };
        tracing::debug!(node, reason, "router message from edge dropped");
        self.metrics
            .messages_dropped
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// True when the report was taken (or nobody listens).
    fn notify_heard(&self, node: &str, at: std::time::SystemTime, lease_secs: u32) -> bool {
        let guard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = guard.as_ref() else {
            return true;
        };
        let report = Heard {
            node: node.to_string(),
            at,
            lease_secs,
        };
        match tx.try_send(report) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Closed(_)) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.metrics
                    .messages_dropped
                    .get_or_create(&ReasonLabel {
                        reason: "heard_report",
                    })
                    .inc();
                false
            }
        }
    }

    fn notify_acked(&self, node: &str, message: AckedMessage) {
        let guard = self.acks.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = guard.as_ref() else { return };
        let report = Acked {
            node: node.to_string(),
            message,
        };
        if tx.try_send(report).is_err() {
            self.metrics
                .messages_dropped
                .get_or_create(&ReasonLabel {
                    reason: "ack_report",
                })
                .inc();
        }
    }
}
