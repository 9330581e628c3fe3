//! The relay of edgemesh connections (kubeedge-rs only): an edge whose pod calls a Service
//! with an endpoint on another edge, which it cannot route to, asks here — an HTTP upgrade
//! `GET /v1/kubeedge-rs/relay` on the tunnel port, with its own certificate, naming the
//! endpoint's node and address. The address must be a TCP endpoint an EndpointSlice places on
//! that node ([`RelayTargets`]), and that node's tunnel must advertise `relay`; then a
//! RELAY_CONNECT goes through its tunnel, the edge there dials the endpoint and answers with
//! a [`RelayStatus`], and after `101 Switching Protocols` the bytes flow both ways.
//!
//! A node whose tunnel is held by another cloudcore replica is answered `503`: the asking
//! edge's relay then tries another endpoint.

use super::session::{MAX_CONNS, OpenError, Sessions};
use crate::cloudhub::handshake::certificate_identity;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kubeedge_shared::names::valid_node_name;
use kubeedge_shared::stream::{self, MessageType, RelayConnect, RelayStatus, TunnelMessage};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Which addresses the relay may connect an edge to.
pub trait RelayTargets: Send + Sync {
    /// Whether an EndpointSlice places a TCP endpoint `addr` on `node`.
    fn endpoint_on_node(&self, node: &str, addr: SocketAddr) -> bool;
}

impl RelayTargets for crate::controller::services::ServiceCache {
    fn endpoint_on_node(&self, node: &str, addr: SocketAddr) -> bool {
        crate::controller::services::ServiceCache::endpoint_on_node(self, node, addr)
    }
}

/// How long the far edge may take to dial the endpoint and answer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A relayed connection idle this long ends.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Outcome {
    Relayed,
    BadRequest,
    Forbidden,
    NoTunnel,
    DialFailed,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Relayed => "relayed",
            Outcome::BadRequest => "bad_request",
            Outcome::Forbidden => "forbidden",
            Outcome::NoTunnel => "no_tunnel",
            Outcome::DialFailed => "dial_failed",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

#[derive(Clone, Default)]
pub struct RelayMetrics {
    pub connections: Family<OutcomeLabel, Counter>,
    pub bytes: Counter,
}

impl RelayMetrics {
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "cloudstream_mesh_relay_connections",
            "edgemesh connections relayed between edges, by outcome",
            self.connections.clone(),
        );
        r.register(
            "cloudstream_mesh_relay_bytes",
            "Bytes relayed between edges for edgemesh (both directions)",
            self.bytes.clone(),
        );
    }

    fn count(&self, outcome: Outcome) {
        self.connections
            .get_or_create(&OutcomeLabel {
                outcome: outcome.label(),
            })
            .inc();
    }
}

/// What the relay needs besides the request.
#[derive(Clone)]
pub struct Relay {
    pub sessions: Arc<Sessions>,
    pub targets: Option<Arc<dyn RelayTargets>>,
    pub metrics: RelayMetrics,
}

fn plain(status: StatusCode, msg: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(msg)));
    *r.status_mut() = status;
    r
}

/// Answers a relay request from the edge whose certificate CN is `cn`.
pub async fn handle(
    req: Request<Incoming>,
    cn: Option<String>,
    allow_legacy_cn: bool,
    relay: Relay,
) -> Response<Full<Bytes>> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let refuse = |outcome: Outcome, status: StatusCode, msg: String| {
        relay.metrics.count(outcome);
        tracing::info!(%status, %msg, "edgemesh relay refused");
        plain(status, msg)
    };
    if !header("upgrade").eq_ignore_ascii_case(stream::RELAY_PROTOCOL) {
        return refuse(
            Outcome::BadRequest,
            StatusCode::BAD_REQUEST,
            format!("upgrade to {} expected", stream::RELAY_PROTOCOL),
        );
    }
    let from = header(stream::HEADER_HOSTNAME);
    if !valid_node_name(&from) {
        return refuse(
            Outcome::BadRequest,
            StatusCode::BAD_REQUEST,
            format!("{} must name the asking edge node", stream::HEADER_HOSTNAME),
        );
    }
    if let Err(r) = certificate_identity(cn.as_deref(), &from, allow_legacy_cn) {
        return refuse(Outcome::Forbidden, r.status, r.message);
    }
    let to = header(stream::HEADER_RELAY_NODE);
    let Ok(addr) = header(stream::HEADER_RELAY_TARGET).parse::<SocketAddr>() else {
        return refuse(
            Outcome::BadRequest,
            StatusCode::BAD_REQUEST,
            format!("{} must be ip:port", stream::HEADER_RELAY_TARGET),
        );
    };
    if !valid_node_name(&to) {
        return refuse(
            Outcome::BadRequest,
            StatusCode::BAD_REQUEST,
            format!("{} must name a node", stream::HEADER_RELAY_NODE),
        );
    }
    let allowed = relay
        .targets
        .as_ref()
        .is_some_and(|t| t.endpoint_on_node(&to, addr));
    if !allowed {
        return refuse(
            Outcome::Forbidden,
            StatusCode::FORBIDDEN,
            format!("{addr} is not a TCP endpoint of a Service on node {to}"),
        );
    }
    let Some(session) = relay.sessions.get(&to) else {
        return refuse(
            Outcome::NoTunnel,
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "edge node {to} has no stream tunnel to this cloudcore (offline, modules.edgeStream off, or connected to another replica)"
            ),
        );
    };
    if !session.capabilities.relay {
        return refuse(
            Outcome::NoTunnel,
            StatusCode::SERVICE_UNAVAILABLE,
            format!("edge node {to} does not relay Service connections (not a kubeedge-rs edge)"),
        );
    }
    let (id, mut rx) = match relay.sessions.open(&session) {
        Ok(c) => c,
        Err(OpenError::Closed) => {
            return refuse(
                Outcome::NoTunnel,
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the stream tunnel of {to} has closed"),
            );
        }
        Err(OpenError::Full) => {
            return refuse(
                Outcome::NoTunnel,
                StatusCode::SERVICE_UNAVAILABLE,
                format!("edge node {to} already has {MAX_CONNS} open streams"),
            );
        }
    };
    let guard = super::relay::ConnGuard {
        session: session.clone(),
        id,
    };
    let payload = serde_json::to_vec(&RelayConnect { addr }).unwrap_or_default();
    if !session
        .send(TunnelMessage::new(id, MessageType::RelayConnect, payload))
        .await
    {
        return refuse(
            Outcome::NoTunnel,
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the stream tunnel of {to} has closed"),
        );
    }
    // The far edge dials, then says how it went in its first DATA message.
    let status = match tokio::time::timeout(CONNECT_TIMEOUT, rx.recv()).await {
        Ok(Some(first)) => {
            serde_json::from_slice::<RelayStatus>(&first).unwrap_or_else(|e| RelayStatus {
                error: format!("unreadable relay status from {to}: {e}"),
            })
        }
        Ok(None) => RelayStatus {
            error: format!("edge node {to} ended the connection"),
        },
        Err(_) => RelayStatus {
            error: format!("edge node {to} did not connect within {CONNECT_TIMEOUT:?}"),
        },
    };
    if !status.error.is_empty() {
        return refuse(Outcome::DialFailed, StatusCode::BAD_GATEWAY, status.error);
    }
    relay.metrics.count(Outcome::Relayed);
    let metrics = relay.metrics.clone();
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => pump(TokioIo::new(io), rx, guard, &metrics).await,
            Err(e) => tracing::debug!(%from, error = %e, "relay upgrade failed"),
        }
    });
    let mut r = plain(StatusCode::SWITCHING_PROTOCOLS, String::new());
    let h = r.headers_mut();
    h.insert(
        http::header::UPGRADE,
        http::HeaderValue::from_static(stream::RELAY_PROTOCOL),
    );
    h.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("Upgrade"),
    );
    r
}

/// Bytes both ways between the asking edge's upgraded connection and the tunnel connection,
/// until either ends or it idles for [`IDLE_TIMEOUT`].
async fn pump<S>(
    io: S,
    mut rx: tokio::sync::mpsc::Receiver<Vec<u8>>,
    guard: super::relay::ConnGuard,
    metrics: &RelayMetrics,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let id = guard.id;
    let session = guard.session.clone();
    let moved = std::sync::atomic::AtomicU64::new(0);
    let why = kubeedge_shared::stream::pump::duplex(
        io,
        Vec::new(),
        &mut rx,
        |chunk| {
            let session = session.clone();
            async move {
                session
                    .send(TunnelMessage::new(id, MessageType::Data, chunk))
                    .await
            }
        },
        IDLE_TIMEOUT,
        &moved,
    )
    .await;
    metrics
        .bytes
        .inc_by(moved.load(std::sync::atomic::Ordering::Relaxed));
    tracing::debug!(id, why = why.as_str(), "relayed connection ended");
    drop(guard);
}
