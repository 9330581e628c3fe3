//! edgehub: the edge end of the cloud channel (protocol §2.1, §2.3).
//!
//! Dials cloudhub, sends keepalives, detects a dead link (also a half-open one, by WebSocket
//! pings the cloud must answer), reconnects with jittered exponential backoff, rate-limits
//! edge-originated requests, matches replies to waiting requests by `parent_msg_id` and hands
//! everything else to the module that owns its group ([`Routes`]).

mod connection;
pub(crate) mod dial;
mod link;
pub(crate) mod ratelimit;
mod routes;

pub use kubeedge_shared::link::{CloudTerms, LinkEvent};
use kubeedge_shared::{Message, Operation};
pub use link::CloudLink;
use ratelimit::TokenBucket;
pub use routes::Routes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub struct EdgeHubConfig {
    /// cloudhub address, `host:port` (KubeEdge `edgeHub.websocket.server`).
    pub server: String,
    pub project_id: String,
    /// The node name, sent as `node_id`.
    pub node_name: String,
    /// Keepalive period (KubeEdge `edgeHub.heartbeat`, 15 s).
    pub heartbeat: Duration,
    /// No frame from the cloud for this long (pings are answered) means the link is dead.
    pub dead_link_timeout: Duration,
    pub handshake_timeout: Duration,
    pub write_timeout: Duration,
    pub message_qps: u32,
    pub message_burst: u32,
    pub max_frame_bytes: usize,
    pub reconnect_initial: Duration,
    pub reconnect_max: Duration,
    /// Advertised in the handshake extension header (e.g. `inventory-resync`).
    pub capabilities: Vec<String>,
    /// Messages for the edge modules buffered before reading from the cloud pauses.
    pub inbound_capacity: usize,
}

impl EdgeHubConfig {
    /// edgehub's settings from `modules.edgeHub` (and `kubeedgeRs`) of a validated
    /// configuration (negative values are clamped).
    pub fn from_edgecore(c: &crate::config::EdgeCoreConfig) -> EdgeHubConfig {
        let hub = &c.modules.edge_hub;
        let ws = &hub.websocket;
        let secs = |s: i32| Duration::from_secs(s.max(0) as u64);
        let heartbeat = secs(hub.heartbeat.max(1));
        let ext = c.kubeedge_rs_settings();
        let dead_link_timeout = if ext.dead_link_timeout > 0 {
            secs(ext.dead_link_timeout)
        } else {
            heartbeat * 2
        };
        use kubeedge_shared::constants::{
            CAPABILITY_CLOUD_LEASE, CAPABILITY_INVENTORY, CAPABILITY_PING_KEEPALIVE,
        };
        let edged = &c.modules.edged;
        let lease_secs = edged
            .tailored_kubelet_config
            .node_lease_duration_seconds
            .max(1) as u64;
        // The cloud renews at each frame it hears: a heartbeat of at most half the lease keeps
        // it alive with a renewal to spare.
        let cloud_lease = ext.cloud_lease
            && edged.enable
            && edged
                .tailored_kubelet_config
                .register_node
                .unwrap_or(edged.register_node)
            && heartbeat.as_secs() * 2 <= lease_secs;
        let capabilities = [
            (ext.inventory_resync, CAPABILITY_INVENTORY.to_string()),
            (ext.ping_keepalive, CAPABILITY_PING_KEEPALIVE.to_string()),
            (
                cloud_lease,
                format!("{CAPABILITY_CLOUD_LEASE}={lease_secs}"),
            ),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, c)| c)
        .collect();
        EdgeHubConfig {
            server: ws.server.clone(),
            project_id: hub.project_id.clone(),
            node_name: c.node_name().to_string(),
            heartbeat,
            dead_link_timeout,
            handshake_timeout: secs(ws.handshake_timeout.max(1)),
            write_timeout: secs(ws.write_deadline.max(1)),
            message_qps: hub.message_qps.max(0) as u32,
            message_burst: hub.message_burst.max(0) as u32,
            capabilities,
            ..EdgeHubConfig::default()
        }
    }
}

impl Default for EdgeHubConfig {
    fn default() -> Self {
        use kubeedge_shared::constants::*;
        EdgeHubConfig {
            server: format!("127.0.0.1:{DEFAULT_CLOUDHUB_PORT}"),
            project_id: DEFAULT_PROJECT_ID.to_string(),
            node_name: String::new(),
            heartbeat: Duration::from_secs(DEFAULT_HEARTBEAT_SECS),
            dead_link_timeout: Duration::from_secs(2 * DEFAULT_HEARTBEAT_SECS),
            handshake_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(15),
            message_qps: DEFAULT_MESSAGE_QPS,
            message_burst: DEFAULT_MESSAGE_BURST,
            max_frame_bytes: kubeedge_shared::codec::DEFAULT_MAX_FRAME_BYTES,
            reconnect_initial: Duration::from_secs(1),
            reconnect_max: Duration::from_secs(30),
            capabilities: Vec::new(),
            inbound_capacity: 1024,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("not connected to the cloud")]
    NotConnected,
    #[error("connection to the cloud was lost before the reply arrived")]
    Disconnected,
    #[error("no reply from the cloud within {0:?}")]
    Timeout(Duration),
    #[error("edgehub is shut down")]
    Shutdown,
}

pub(crate) struct Shared {
    config: EdgeHubConfig,
    tls: Mutex<Arc<rustls::ClientConfig>>,
    connected: AtomicBool,
    outbound: mpsc::Sender<Message>,
    pending: Mutex<HashMap<String, oneshot::Sender<Message>>>,
    events: broadcast::Sender<LinkEvent>,
    terms: tokio::sync::watch::Sender<CloudTerms>,
    limiter: TokenBucket,
    shutdown: CancellationToken,
    /// Cancelled to recycle the current connection (e.g. after certificate rotation).
    recycle: Mutex<CancellationToken>,
}

#[derive(Clone)]
pub struct EdgeHub {
    shared: Arc<Shared>,
}

/// An edgehub that does not dial yet: it waits to be told where the modules take what the
/// cloud sends.
pub struct Routing {
    shared: Arc<Shared>,
    outbound: mpsc::Receiver<Message>,
}

impl Routing {
    /// Starts the connect loop, handing cloud messages to `routes`.
    pub fn serve(self, routes: Routes) {
        tokio::spawn(connection::connect_loop(self.shared, self.outbound, routes));
    }
}

impl EdgeHub {
    /// Starts the connect loop; what the cloud sends arrives on the receiver (metamanager's
    /// groups only: [`Routes::meta_only`]).
    pub fn start(
        config: EdgeHubConfig,
        tls: Arc<rustls::ClientConfig>,
    ) -> (EdgeHub, mpsc::Receiver<Message>) {
        let (in_tx, in_rx) = mpsc::channel(config.inbound_capacity.max(1));
        let (hub, routing) = Self::start_routed(config, tls);
        routing.serve(Routes::meta_only(in_tx));
        (hub, in_rx)
    }

    /// Starts edgehub without dialling: it connects once [`Routing::serve`] says where each
    /// module takes its messages (the modules need the hub to start; then they are routed).
    /// Dropping the [`Routing`] unserved leaves the hub offline.
    pub fn start_routed(
        config: EdgeHubConfig,
        tls: Arc<rustls::ClientConfig>,
    ) -> (EdgeHub, Routing) {
        let (out_tx, out_rx) = mpsc::channel(1024);
        let (events, _) = broadcast::channel(64);
        let shared = Arc::new(Shared {
            limiter: TokenBucket::new(config.message_qps, config.message_burst),
            config,
            tls: Mutex::new(tls),
            connected: AtomicBool::new(false),
            outbound: out_tx,
            pending: Mutex::new(HashMap::new()),
            events,
            terms: tokio::sync::watch::channel(CloudTerms::default()).0,
            shutdown: CancellationToken::new(),
            recycle: Mutex::new(CancellationToken::new()),
        });
        let routing = Routing {
            shared: shared.clone(),
            outbound: out_rx,
        };
        (EdgeHub { shared }, routing)
    }

    /// The capacity a module's queue from edgehub should have (`inbound_capacity`).
    pub fn inbound_capacity(&self) -> usize {
        self.shared.config.inbound_capacity.max(1)
    }

    pub fn is_connected(&self) -> bool {
        self.shared.connected.load(Ordering::Acquire)
    }

    pub fn subscribe(&self) -> broadcast::Receiver<LinkEvent> {
        self.shared.events.subscribe()
    }

    /// What the cloud of the current link agreed to, and its changes.
    pub fn terms(&self) -> tokio::sync::watch::Receiver<CloudTerms> {
        self.shared.terms.subscribe()
    }

    /// Sends a message to the cloud. Edge-originated requests are rate-limited
    /// (`messageQPS`/`messageBurst`); responses (ACKs, answers carrying a `parent_msg_id`) and
    /// keepalives are not, since their pace is set by the cloud and throttling them only causes
    /// resends or time-outs there.
    pub async fn send(&self, msg: Message) -> Result<(), HubError> {
        if !self.is_connected() {
            return Err(HubError::NotConnected);
        }
        // Answers to the cloud's requests (ACKs, the servicebus's call answers) are paced by
        // the cloud, not limited here.
        let answer = matches!(
            msg.route.operation,
            Operation::Response | Operation::Keepalive | Operation::Error
        ) || !msg.header.parent_id.is_empty();
        if !answer {
            self.shared.limiter.acquire().await;
        }
        self.shared
            .outbound
            .send(msg)
            .await
            .map_err(|_| HubError::Shutdown)
    }

    /// Sends a message that can wait (events): it is rate-limited like a request but only takes
    /// spare capacity, leaving half the burst to [`Self::send`], so a burst of events never
    /// delays status patches or queries.
    pub async fn send_background(&self, msg: Message) -> Result<(), HubError> {
        if !self.is_connected() {
            return Err(HubError::NotConnected);
        }
        self.shared.limiter.acquire_spare().await;
        if !self.is_connected() {
            return Err(HubError::NotConnected);
        }
        self.shared
            .outbound
            .send(msg)
            .await
            .map_err(|_| HubError::Shutdown)
    }

    /// Sends a request and waits for the message whose `parent_msg_id` is its `msg_id`.
    pub async fn request(&self, msg: Message, timeout: Duration) -> Result<Message, HubError> {
        let id = msg.header.id.clone();
        let (tx, rx) = oneshot::channel();
        self.shared.lock_pending().insert(id.clone(), tx);
        let result = async {
            self.send(msg).await?;
            match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(reply)) => Ok(reply),
                Ok(Err(_)) => Err(HubError::Disconnected),
                Err(_) => Err(HubError::Timeout(timeout)),
            }
        }
        .await;
        self.shared.lock_pending().remove(&id);
        result
    }

    /// Replaces the TLS configuration (new client certificate) and reconnects with it.
    pub fn set_tls_config(&self, tls: Arc<rustls::ClientConfig>) {
        *self.shared.tls.lock().unwrap_or_else(|e| e.into_inner()) = tls;
        self.shared.recycle_connection();
    }

    pub fn shutdown(&self) {
        self.shared.shutdown.cancel();
    }
}

impl Shared {
    fn lock_pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<Message>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn recycle_connection(&self) {
        self.recycle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .cancel();
    }

    fn tls(&self) -> Arc<rustls::ClientConfig> {
        self.tls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
