//! The tunnel server (`:10004`, WSS `GET /v1/kubeedge/connect`, mTLS): edges connect with
//! their hub certificate and headers `SessionHostNameOverride` / `SessionInternalIP`; each
//! connection becomes a [`Session`]. Tunnel messages travel in TEXT frames with binary
//! payloads (read with [`kubeedge_shared::stream::ws`], never UTF-8 checked).

use super::session::{OUT_BUFFER, Outgoing, Session, Sessions};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
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

pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    sessions: Arc<Sessions>,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "tunnel accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (acceptor, sessions, shutdown) = (acceptor.clone(), sessions.clone(), shutdown.clone());
        tokio::spawn(async move {
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(t)) => t,
                    Ok(Err(e)) => {
                        tracing::info!(%peer, error = %e, "tunnel TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                };
            let svc = hyper::service::service_fn(move |req| {
                let (sessions, shutdown) = (sessions.clone(), shutdown.clone());
                async move { Ok::<_, std::convert::Infallible>(upgrade(req, peer, sessions, shutdown)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), svc)
                .with_upgrades();
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "tunnel HTTP connection ended");
            }
        });
    }
}

fn plain(status: StatusCode, msg: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(msg.to_string())));
    *r.status_mut() = status;
    r
}

fn upgrade(
    req: Request<Incoming>,
    peer: SocketAddr,
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
    let node = header(stream::HEADER_HOSTNAME);
    let mut ip = header(stream::HEADER_INTERNAL_IP);
    if ip.is_empty() {
        ip = peer.ip().to_string();
    }
    if node.is_empty() {
        return plain(
            StatusCode::BAD_REQUEST,
            "missing SessionHostNameOverride header",
        );
    }
    let accept = ws::accept_key(key.as_bytes());
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => run_session(TokioIo::new(io), node, ip, sessions, shutdown).await,
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

async fn run_session<S>(
    io: S,
    node: String,
    ip: String,
    sessions: Arc<Sessions>,
    shutdown: CancellationToken,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let (r, w) = tokio::io::split(io);
    let (out_tx, mut out_rx) = mpsc::channel(OUT_BUFFER);
    let session = sessions.add(&node, &ip, out_tx);
    tracing::info!(%node, %ip, "edge stream tunnel connected");
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
