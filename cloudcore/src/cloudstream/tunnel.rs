//! The tunnel server (`:10004`, WSS `GET /v1/kubeedge/connect`, mTLS): edges connect with
//! their hub certificate and headers `SessionHostNameOverride` / `SessionInternalIP`; each
//! connection becomes a [`Session`]. Tunnel messages travel in TEXT frames with binary
//! payloads (read with [`kubeedge_shared::stream::ws`], never UTF-8 checked).

use super::session::{EdgeCapabilities, OUT_BUFFER, Outgoing, Session, Sessions};
use crate::cloudhub::handshake::certificate_identity;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kubeedge_shared::constants::HEADER_CAPABILITIES;
use kubeedge_shared::names::valid_node_name;
use kubeedge_shared::stream::ws::{self, WsEvent, WsReader, WsWriter};
use kubeedge_shared::stream::{self, MessageType, TunnelMessage};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Edges ping every 5 s; a tunnel silent this long is dead.
pub const IDLE_LIMIT: Duration = Duration::from_secs(30);

/// Where a connecting edge's kubelet port is written (the negotiated tunnel port).
#[derive(Clone)]
pub struct NodePort {
    pub client: kube::Client,
    pub port: u16,
}

pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    allow_legacy_cn: bool,
    node_port: Option<NodePort>,
    relay: super::mesh_relay::Relay,
    shutdown: CancellationToken,
) {
    let sessions = relay.sessions.clone();
    super::accept_loop(
        "tunnel",
        listener,
        tls,
        shutdown.clone(),
        move |tls, peer| {
            let (sessions, shutdown) = (sessions.clone(), shutdown.clone());
            let node_port = node_port.clone();
            let relay = relay.clone();
            async move {
                let cn = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(kubeedge_shared::tls::common_name);
                let svc = hyper::service::service_fn(move |req| {
                    let (sessions, shutdown) = (sessions.clone(), shutdown.clone());
                    let node_port = node_port.clone();
                    let relay = relay.clone();
                    let identity = Identity {
                        peer,
                        cn: cn.clone(),
                        allow_legacy_cn,
                    };
                    async move {
                        if req.uri().path() == stream::RELAY_PATH {
                            let cn = identity.cn.clone();
                            return Ok::<_, std::convert::Infallible>(
                                super::mesh_relay::handle(req, cn, allow_legacy_cn, relay).await,
                            );
                        }
                        Ok::<_, std::convert::Infallible>(upgrade(
                            req, identity, node_port, sessions, shutdown,
                        ))
                    }
                });
                let conn = super::http1_server(super::HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(tls), svc)
                    .with_upgrades();
                if let Err(e) = conn.await {
                    tracing::debug!(%peer, error = %e, "tunnel HTTP connection ended");
                }
            }
        },
    )
    .await
}

fn plain(status: StatusCode, msg: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(msg.to_string())));
    *r.status_mut() = status;
    r
}

/// Who is at the other end of a tunnel connection.
struct Identity {
    peer: SocketAddr,
    /// CN of the client certificate (verified against the CA by the TLS layer).
    cn: Option<String>,
    allow_legacy_cn: bool,
}

/// The node a tunnel may serve: a valid node name whose certificate it holds (as cloudHub
/// checks), so that one edge cannot take over another node's tunnel and its logs requests.
fn check_node(
    node: &str,
    cn: Option<&str>,
    allow_legacy_cn: bool,
) -> Result<(), (StatusCode, String)> {
    if node.is_empty() {
        return Err((
            StatusCode::BAD_REQUEST,
            "missing SessionHostNameOverride header: set it to the edge node name".into(),
        ));
    }
    if !valid_node_name(node) {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("SessionHostNameOverride {node:?} is not a valid Kubernetes node name"),
        ));
    }
    certificate_identity(cn, node, allow_legacy_cn)
        .map(|_| ())
        .map_err(|r| (r.status, r.message))
}

fn upgrade(
    req: Request<Incoming>,
    identity: Identity,
    node_port: Option<NodePort>,
    sessions: Arc<Sessions>,
    shutdown: CancellationToken,
) -> Response<Full<Bytes>> {
    if req.uri().path().trim_end_matches('/') != stream::CONNECT_PATH {
        return plain(StatusCode::NOT_FOUND, "404 page not found");
    }
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let is_ws = header("upgrade").eq_ignore_ascii_case("websocket");
    let key = header("sec-websocket-key");
    if req.method() != http::Method::GET || !is_ws || key.is_empty() {
        return plain(StatusCode::BAD_REQUEST, "websocket upgrade expected");
    }
    let node = header(stream::HEADER_HOSTNAME).trim().to_string();
    let mut ip = header(stream::HEADER_INTERNAL_IP);
    if ip.is_empty() {
        ip = identity.peer.ip().to_string();
    }
    if let Err((status, msg)) = check_node(&node, identity.cn.as_deref(), identity.allow_legacy_cn)
    {
        tracing::warn!(peer = %identity.peer, %node, %status, %msg, "stream tunnel refused");
        return plain(status, &msg);
    }
    let capabilities = EdgeCapabilities::parse(&header(HEADER_CAPABILITIES));
    let accept = ws::accept_key(key.as_bytes());
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => {
                let edge = Edge {
                    node,
                    ip,
                    capabilities,
                };
                run_session(TokioIo::new(io), edge, node_port, sessions, shutdown).await
            }
            Err(e) => tracing::info!(%node, error = %e, "tunnel upgrade failed"),
        }
    });
    let mut r = plain(StatusCode::SWITCHING_PROTOCOLS, "");
    let h = r.headers_mut();
    h.insert(
        http::header::UPGRADE,
        http::HeaderValue::from_static("websocket"),
    );
    h.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("Upgrade"),
    );
    if let Ok(v) = http::HeaderValue::from_str(&accept) {
        h.insert(http::header::SEC_WEBSOCKET_ACCEPT, v);
    }
    r
}

/// The edge a tunnel connects, as its handshake named it.
struct Edge {
    node: String,
    ip: String,
    capabilities: EdgeCapabilities,
}

async fn run_session<S>(
    io: S,
    edge: Edge,
    node_port: Option<NodePort>,
    sessions: Arc<Sessions>,
    shutdown: CancellationToken,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let (r, w) = tokio::io::split(io);
    let (out_tx, mut out_rx) = mpsc::channel(OUT_BUFFER);
    let Edge {
        node,
        ip,
        capabilities,
    } = edge;
    let session = sessions.add(&node, &ip, capabilities, out_tx);
    tracing::info!(%node, %ip, port_forward = capabilities.port_forward, relay = capabilities.relay, "edge stream tunnel connected");
    if let Some(np) = node_port {
        tokio::spawn(set_kubelet_port(np, session.clone()));
    }
    let closed = session.closed.clone();
    let writer = tokio::spawn(async move {
        let mut w = WsWriter::new(w, false);
        loop {
            let item = tokio::select! {
                _ = closed.cancelled() => break,
                m = out_rx.recv() => match m { Some(m) => m, None => break },
            };
            let res = match item {
                Outgoing::Message(m) => w.send(ws::OP_TEXT, &m.encode()).await,
                Outgoing::Pong(p) => w.send(ws::OP_PONG, &p).await,
            };
            if let Err(e) = res {
                tracing::info!(error = %e, "writing to the stream tunnel failed");
                closed.cancel();
                break;
            }
        }
        w.shutdown().await;
    });
    read_loop(WsReader::new(r, stream::MAX_DATA + 32), &session, &shutdown).await;
    sessions.remove(&session);
    let _ = writer.await;
    tracing::info!(%node, "edge stream tunnel closed");
}

/// Writes the tunnel port into the node's status; on failure ends the tunnel with
/// CLOSE_CONNECT (KubeEdge's behaviour), so the edge reconnects and it is tried again.
async fn set_kubelet_port(np: NodePort, session: Arc<Session>) {
    let update = super::node_port::update(
        &np.client,
        &session.node,
        np.port,
        Duration::from_secs(2),
        super::node_port::GIVE_UP_AFTER,
    );
    let result = tokio::select! {
        _ = session.closed.cancelled() => return,
        r = update => r,
    };
    if let Err(e) = result {
        tracing::warn!(node = %session.node, error = %e, "closing the stream tunnel");
        session
            .send(TunnelMessage::new(
                0,
                MessageType::CloseConnect,
                e.into_bytes(),
            ))
            .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        session.closed.cancel();
    }
}

async fn read_loop<R: tokio::io::AsyncRead + Unpin>(
    mut reader: WsReader<R>,
    session: &Session,
    shutdown: &CancellationToken,
) {
    let node = &session.node;
    loop {
        let ev = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = session.closed.cancelled() => return,
            ev = tokio::time::timeout(IDLE_LIMIT, reader.next()) => ev,
        };
        let ev = match ev {
            Err(_) => {
                tracing::warn!(%node, "no ping from the edge in {IDLE_LIMIT:?}; closing its tunnel");
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(%node, error = %e, "stream tunnel read failed (frames over 1 MiB are rejected)");
                return;
            }
            Ok(Ok(None)) | Ok(Ok(Some(WsEvent::Close))) => return,
            Ok(Ok(Some(ev))) => ev,
        };
        let payload = match ev {
            WsEvent::Ping(p) => {
                session.pong(p).await;
                continue;
            }
            WsEvent::Pong(_) | WsEvent::Close => continue,
            WsEvent::Data { payload, .. } => payload,
        };
        let m = match TunnelMessage::decode(&payload) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(%node, error = %e, "bad tunnel message ignored");
                continue;
            }
        };
        match m.kind {
            MessageType::Data => session.deliver(m.connect_id, m.data).await,
            MessageType::RemoveConnect => {
                session.remove_conn(m.connect_id);
            }
            other => {
                tracing::warn!(%node, kind = ?other, id = m.connect_id, "unexpected tunnel message type from the edge ignored")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check_node;
    use http::StatusCode;

    #[test]
    fn a_tunnel_serves_only_the_node_of_its_certificate() {
        assert!(check_node("edge-1", Some("system:node:edge-1"), false).is_ok());
        let other = check_node("edge-2", Some("system:node:edge-1"), false).unwrap_err();
        assert_eq!(other.0, StatusCode::FORBIDDEN);
        assert!(other.1.contains("edge-2"), "{}", other.1);
        assert!(check_node("edge-2", Some("kubeedge.io"), false).is_err());
        assert!(check_node("edge-2", Some("kubeedge.io"), true).is_ok());
        assert!(check_node("edge-1", None, true).is_err());
        assert_eq!(
            check_node("", Some("system:node:"), false).unwrap_err().0,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            check_node("../x", Some("system:node:../x"), false)
                .unwrap_err()
                .0,
            StatusCode::BAD_REQUEST
        );
    }
}
