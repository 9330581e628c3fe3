//! The router (`modules.router`, KubeEdge's `cloud/pkg/router`; devices reference §4.6, §7):
//! KubeEdge's `rules.kubeedge.io/v1` Rules between rule endpoints of type `rest` (a cloud HTTP
//! side), `eventbus` (MQTT at an edge) and `servicebus` (HTTP servers on an edge node).
//!
//! | rule (source → target) | traffic |
//! |---|---|
//! | rest → servicebus | `http://<router>:9443/<node>/<ns>/<path>…` → the edge calls `127.0.0.1:<service_port><target path>…` → its answer (status, headers, body) back to the caller |
//! | rest → eventbus | the same URL → the body published on `<topic>…` at the node |
//! | eventbus → rest | MQTT messages on `<ns>/<topic>` at `node_name` → POST to the rule's URL |
//! | servicebus → rest | an application on `node_name` posting to its servicebus (`:9060`) for `target_url` → POST to the rule's URL, the answer back to it |
//!
//! Pieces: `rules.rs` (CRD types, compiling a rule), `table.rs` (the routes in force),
//! `ruleset.rs` (the actor that watches rules and endpoints and keeps edges' subscriptions in
//! step), `rest.rs` (the REST listener), `calls.rs` (calls waiting for edges), `edge.rs` (what
//! edges send), `target.rs` (HTTP to rest targets and peers), `replicas.rs` (several
//! cloudcores), `status.rs` (Rule status), `metrics.rs`. Off by default, as in KubeEdge.

pub(crate) mod calls;
pub(crate) mod edge;
pub(crate) mod metrics;
pub(crate) mod path;
pub(crate) mod replicas;
pub(crate) mod rest;
pub(crate) mod rules;
pub(crate) mod ruleset;
pub(crate) mod status;
pub(crate) mod table;
pub(crate) mod target;

use crate::cloudhub::HubSink;
use crate::cloudhub::{ByteBudget, CloudHub, NodeEvent};
use calls::Calls;
use kubeedge_shared::config::ConfigError;
use kubeedge_shared::servicebus::max_body_for_frame;
pub use metrics::{EdgeLabel, RouterMetrics};
use replicas::Replicas;
use ruleset::{Input, RuleSet, TableHandle};
use status::StatusTally;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
pub use target::HttpClient;
use tokio::sync::{Semaphore, broadcast, mpsc};
use tokio_util::sync::CancellationToken;

/// How the router runs.
#[derive(Debug, Clone)]
pub struct RouterSettings {
    /// The REST listener (`modules.router.address`/`port`).
    pub listen: SocketAddr,
    /// `restTimeout`: how long a REST call waits for the edge, and a rest target for its answer.
    pub rest_timeout: Duration,
    /// Largest REST request body (what fits a cloudhub frame once base64-encoded).
    pub max_body_bytes: usize,
    /// This replica's router address for its peers (the Node annotation `cloudcore`); `None`:
    /// no forwarding between replicas.
    pub advertise: Option<SocketAddr>,
    /// Between Rule status writes.
    pub status_interval: Duration,
    /// Calls waiting for edges at once, at most.
    pub max_calls: usize,
    /// Rest target calls (eventbus → rest, servicebus → rest) at once, at most.
    pub target_concurrency: usize,
    /// Edge messages buffered between cloudhub and the router.
    pub edge_buffer: usize,
    /// Bytes of edge messages the router holds at most (buffered, queued for a rest target,
    /// answers on their way to the caller); beyond, cloudhub drops them.
    pub edge_bytes: usize,
    /// Bytes of REST request bodies read at once, at most (each reserves its
    /// `Content-Length`, or `max_body_bytes`); beyond, requests get `503`.
    pub request_bytes: usize,
}

impl RouterSettings {
    /// From `modules.router` (and cloudhub's frame limit); the advertised address is this
    /// replica's (`POD_IP` or the host's) with the router's port.
    pub fn from_cloudcore(c: &crate::config::CloudCoreConfig) -> Result<Self, ConfigError> {
        let r = &c.modules.router;
        let ip: std::net::IpAddr = r.address.parse().map_err(|_| {
            ConfigError::invalid(
                "modules.router.address",
                format!("{:?} is not an IP address", r.address),
            )
        })?;
        let port = if r.port == 0 {
            replicas::DEFAULT_PORT
        } else {
            r.port
        };
        let advertise = crate::cloudstream::tunnel_port::local_ip()
            .parse::<std::net::IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, port));
        Ok(RouterSettings {
            listen: SocketAddr::new(ip, port),
            rest_timeout: Duration::from_secs(if r.rest_timeout == 0 {
                60
            } else {
                r.rest_timeout
            }),
            max_body_bytes: max_body_for_frame(c.modules.cloud_hub.max_message_bytes),
            advertise,
            ..RouterSettings::default()
        })
    }
}

impl Default for RouterSettings {
    fn default() -> Self {
        RouterSettings {
            listen: SocketAddr::from(([0, 0, 0, 0], replicas::DEFAULT_PORT)),
            rest_timeout: Duration::from_secs(60),
            max_body_bytes: max_body_for_frame(kubeedge_shared::codec::DEFAULT_MAX_FRAME_BYTES),
            advertise: None,
            status_interval: Duration::from_secs(1),
            max_calls: 10_000,
            target_concurrency: 256,
            edge_buffer: 4096,
            edge_bytes: 64 << 20,
            request_bytes: 256 << 20,
        }
    }
}

/// What the router's tasks share.
pub(crate) struct Shared {
    settings: RouterSettings,
    table: TableHandle,
    hub: Arc<dyn HubSink>,
    calls: Calls,
    tally: StatusTally,
    metrics: RouterMetrics,
    http: target::HttpClient,
    replicas: Option<Arc<Replicas>>,
    targets: Arc<Semaphore>,
    /// REST request bodies being read or relayed.
    bodies: ByteBudget,
}

/// The running router.
pub struct Router {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
}

impl Router {
    /// Binds the REST listener and starts the router on `hub`. Returns once it listens.
    pub async fn start(
        settings: RouterSettings,
        client: kube::Client,
        hub: CloudHub,
        metrics: RouterMetrics,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Router> {
        let listener = tokio::net::TcpListener::bind(settings.listen)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "router cannot listen on {} (modules.router): {e}",
                    settings.listen
                )
            })?;
        let local_addr = listener.local_addr()?;
        let shutdown = shutdown.child_token();
        let replicas = settings
            .advertise
            .map(|me| Replicas::new(client.clone(), me));
        let table = TableHandle::default();
        let tally = StatusTally::default();
        let shared = Arc::new(Shared {
            calls: Calls::new(settings.max_calls, metrics.calls_in_flight.clone()),
            targets: Arc::new(Semaphore::new(settings.target_concurrency.max(1))),
            table: table.clone(),
            hub: Arc::new(hub.clone()),
            tally: tally.clone(),
            metrics: metrics.clone(),
            http: target::HttpClient::new(),
            replicas: replicas.clone(),
            bodies: ByteBudget::new(settings.request_bytes),
            settings,
        });
        let (tx, rx) = mpsc::channel(1024);
        let ruleset = RuleSet::new(table, shared.hub.clone(), tally.clone(), metrics.clone());
        tokio::spawn(ruleset.run(rx, shutdown.clone()));
        tokio::spawn(ruleset::watch(client.clone(), tx.clone(), shutdown.clone()));
        tokio::spawn(status::run(
            client.clone(),
            tally,
            shared.settings.status_interval,
            metrics,
            shutdown.clone(),
        ));
        if let Some(r) = &replicas {
            tokio::spawn(r.clone().watch(shutdown.clone()));
        }
        tokio::spawn(node_events(
            shared.clone(),
            hub.subscribe(),
            tx,
            shutdown.clone(),
        ));
        let from_edges = hub.subscribe_router(
            shared.settings.edge_buffer,
            ByteBudget::new(shared.settings.edge_bytes),
        );
        tokio::spawn(edge::run(shared.clone(), from_edges, shutdown.clone()));
        tokio::spawn(rest::serve(listener, shared.clone(), shutdown.clone()));
        tracing::info!(%local_addr, advertise = ?shared.settings.advertise, "router listening");
        Ok(Router {
            local_addr,
            shared,
            shutdown,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Calls waiting for edges now.
    pub fn calls_waiting(&self) -> usize {
        self.shared.calls.len()
    }

    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Connections: a node that connects gets its registrations (and, with several replicas, is
/// recorded as held here); one that disconnects fails its waiting calls.
async fn node_events(
    shared: Arc<Shared>,
    mut events: broadcast::Receiver<NodeEvent>,
    ruleset: mpsc::Sender<Input>,
    shutdown: CancellationToken,
) {
    loop {
        let ev = tokio::select! {
            _ = shutdown.cancelled() => return,
            e = events.recv() => e,
        };
        let input = match ev {
            Ok(NodeEvent::Connected { node, .. }) => {
                if let Some(r) = &shared.replicas {
                    r.announce(node.clone(), shutdown.clone());
                }
                Input::NodeConnected(node)
            }
            Ok(NodeEvent::Disconnected { node, .. }) => {
                if !shared.hub.is_connected(&node) {
                    let failed = shared.calls.node_gone(&node);
                    if failed > 0 {
                        tracing::info!(%node, failed, "node disconnected: its waiting calls fail");
                    }
                }
                continue;
            }
            Ok(NodeEvent::QueueOverflow { .. }) => continue,
            Err(broadcast::error::RecvError::Lagged(_)) => Input::AllConnected,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if ruleset.send(input).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
