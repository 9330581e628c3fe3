//! TLS accept loop and the WebSocket upgrade.

use super::Inner;
use super::handshake::{Accepted, check_request};
use super::session::{self, Ws};
use crate::metrics::ReasonLabel;
use http::StatusCode;
use kubeedge_shared::tls::common_name;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

/// [`super::OFFERED`] as the header value (a KubeEdge edge ignores it).
const OFFERED_HEADER: &str = "inventory-resync,ping-keepalive,cloud-lease";

/// Small buffers: an idle session must stay cheap (≤ 50 KB target); they grow when needed.
pub(crate) fn ws_config(max_frame_bytes: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(1024)
        .write_buffer_size(16 * 1024)
        .max_write_buffer_size(max_frame_bytes.saturating_mul(2).max(64 * 1024))
        .max_message_size(Some(max_frame_bytes))
        .max_frame_size(Some(max_frame_bytes))
}

/// The kernel's cap on a listener's accept queue (`net.core.somaxconn`), 4096 when unreadable.
fn somaxconn() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|v| *v > 0)
        .unwrap_or(4096)
}

/// The cloudhub listener, with an accept queue as long as the kernel allows (Go's `net.Listen`,
/// and so KubeEdge's cloudhub, asks for `somaxconn`; tokio's `bind` for 1,024): when thousands
/// of edges redial at once, connections beyond the queue are dropped and wait for their SYN
/// to be resent (1 s, 3 s, 7 s …) or time out into the edge's back-off.
pub(super) fn listen(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(somaxconn())
}

pub(super) async fn accept_loop(
    inner: Arc<Inner>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
) {
    let acceptor = TlsAcceptor::from(tls);
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = inner.shutdown.cancelled() => break,
        };
        let (tcp, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let inner = inner.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let timeout = inner.config.handshake_timeout;
            let done =
                tokio::time::timeout(timeout, admitted_handshake(&inner, acceptor, tcp, peer))
                    .await;
            match done {
                Ok(Ok((ws, accepted))) => Box::pin(session::run(inner, ws, accepted, peer)).await,
                Ok(Err(reason)) => tracing::debug!(%peer, %reason, "handshake refused"),
                Err(_) => {
                    refused(&inner, "handshake_timeout");
                    tracing::warn!(%peer, ?timeout, "TLS/WebSocket handshake timed out");
                }
            }
        });
    }
    tracing::info!("cloudhub stopped accepting");
}

/// Adds one to `gauge` until dropped.
struct Counted(prometheus_client::metrics::gauge::Gauge);

impl Counted {
    fn new(gauge: &prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Counted(gauge.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Waits for the peer's first bytes and a handshake slot ([`super::admission`]), then runs
/// the handshake within the admitted deadline; the slot is free again when it returns.
async fn admitted_handshake(
    inner: &Arc<Inner>,
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
) -> Result<(Ws, Accepted), String> {
    let metrics = &inner.metrics;
    let waiting = Counted::new(&metrics.handshakes_waiting);
    // A silent connection costs a socket, never a slot. A peek waits for a byte or EOF
    // (`readable()` may report a false positive).
    let first = tcp
        .peek(&mut [0u8; 1])
        .await
        .map_err(|e| format!("waiting for the ClientHello: {e}"))?;
    if first == 0 {
        // Connected and closed (a TCP health check): nothing to admit.
        return Err("closed before the ClientHello".into());
    }
    let _admitted = inner.admission.admit(peer.ip()).await;
    drop(waiting);
    let _working = Counted::new(&metrics.handshakes_in_progress);
    let limit = inner.config.admitted_handshake_timeout;
    // Boxed: the handshake's state (TLS and HTTP buffers) would otherwise stay part of the
    // connection's task for the life of the session.
    match tokio::time::timeout(limit, Box::pin(handshake(inner, acceptor, tcp, peer))).await {
        Ok(done) => done,
        Err(_) => {
            refused(inner, "admitted_handshake_timeout");
            tracing::warn!(%peer, ?limit, "admitted TLS/WebSocket handshake did not finish in time");
            Err("admitted handshake timed out".into())
        }
    }
}

fn refused(inner: &Inner, reason: &'static str) {
    inner
        .metrics
        .sessions_refused
        .get_or_create(&ReasonLabel { reason })
        .inc();
}

// tungstenite's callback type fixes the (large) error response type.
#[allow(clippy::result_large_err)]
async fn handshake(
    inner: &Arc<Inner>,
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
) -> Result<(Ws, Accepted), String> {
    let tls = acceptor.accept(tcp).await.map_err(|e| {
        refused(inner, "tls");
        tracing::warn!(%peer, error = %e, "TLS handshake failed (is the edge certificate signed by this cloudcore's CA?)");
        format!("tls: {e}")
    })?;
    let cn = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(common_name);
    let mut outcome: Option<Accepted> = None;
    let callback = |req: &Request, resp: Response| {
        let accepted = match check_request(req, cn.as_deref(), inner.config.allow_legacy_cn) {
            Ok(a) => a,
            Err(refusal) => {
                refused(inner, refusal.reason);
                tracing::warn!(%peer, status = %refusal.status, reason = refusal.reason, message = %refusal.message, "edge connection refused");
                return Err(refusal.into_response());
            }
        };
        let at_limit = inner.sessions.len() >= inner.config.node_limit;
        if at_limit && !inner.sessions.contains_key(&accepted.node) {
            refused(inner, "node_limit");
            tracing::warn!(%peer, node = %accepted.node, limit = inner.config.node_limit, "node limit reached; connection refused");
            let mut resp = tokio_tungstenite::tungstenite::handshake::server::ErrorResponse::new(
                Some(format!("node limit of {} reached", inner.config.node_limit)),
            );
            *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            return Err(resp);
        }
        outcome = Some(accepted);
        let mut resp = resp;
        resp.headers_mut().insert(
            kubeedge_shared::constants::HEADER_CAPABILITIES,
            http::HeaderValue::from_static(OFFERED_HEADER),
        );
        Ok(resp)
    };
    let ws = tokio_tungstenite::accept_hdr_async_with_config(
        tls,
        callback,
        Some(ws_config(inner.config.max_frame_bytes)),
    )
    .await
    .map_err(|e| format!("websocket: {e}"))?;
    let accepted = outcome.ok_or_else(|| "handshake ended without identity".to_string())?;
    if accepted.legacy_cn {
        tracing::warn!(node = %accepted.node, "edge uses the legacy shared certificate CN; its identity rests on the node_id header alone");
    }
    Ok((ws, accepted))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_offered_header_lists_every_offered_capability() {
        assert_eq!(super::OFFERED_HEADER, super::super::OFFERED.join(","));
    }
}
