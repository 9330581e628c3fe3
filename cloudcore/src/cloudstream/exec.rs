//! `GET|POST /exec/{ns}/{pod}[/{uid}]/{container}`, `/attach/…` and
//! `/portForward/{ns}/{pod}[/{uid}]` on the stream server: the apiserver's upgrade request
//! (SPDY, or WebSocket from apiservers that proxy it) goes to the pod's node as
//! EXEC_CONNECT/ATTACH_CONNECT/PORT_FORWARD_CONNECT with the method, the URL rewritten to
//! `http://127.0.0.1:10350` and the request headers (KubeEdge's `EdgedExecConnection`).
//! The edge answers with the raw HTTP response of its streaming server in DATA frames;
//! KubeEdge writes those bytes to the hijacked client connection, and since hyper parses the
//! request here, the response head is parsed back out of them: `101` upgrades the client
//! connection and from then on bytes are relayed both ways; any other status is answered
//! with its headers and body. Either side ending ends both (as the apiserver's proxy does).
//! PORT_FORWARD_CONNECT (type 7, as in KubeEdge's pending port-forward change) goes only to
//! edges whose tunnel handshake advertised it; others get 501.

use super::relay::{Body, ConnGuard, connect, session_for_pod, text};
use super::session::Sessions;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kubeedge_shared::stream::http::{ResponseHead, decode_chunked, parse_response_head};
use kubeedge_shared::stream::{MessageType, TunnelMessage};
use std::time::Duration;
use tokio::sync::mpsc;

/// How long the edge may take to answer (find the container, ask the runtime, connect).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest error body relayed for a refused upgrade.
pub const MAX_ERROR_BODY: usize = 64 * 1024;
/// The kubelet's default `streamingConnectionIdleTimeout`: a stream silent this long ends.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(4 * 60 * 60);

pub async fn serve(
    req: Request<Incoming>,
    kind: MessageType,
    sessions: &Sessions,
    client: kube::Client,
    ns: &str,
    pod: &str,
) -> Response<Body> {
    let session = match session_for_pod(sessions, client, ns, pod).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    if kind == MessageType::PortForwardConnect && !session.capabilities.port_forward {
        // Released KubeEdge edges crash on a connect type they do not know: never send it.
        return text(
            StatusCode::NOT_IMPLEMENTED,
            format!(
                "edge node {} does not serve port-forward through the stream tunnel (KubeEdge's edgecore does not); it needs kubeedge-rs edgecore",
                session.node
            ),
        );
    }
    let method = Some(req.method().to_string());
    let (guard, mut rx) = match connect(sessions, &session, kind, &req, method).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let id = guard.id;
    tracing::debug!(node = %session.node, id, ?kind, path = %req.uri().path(), "upgrade connection opened");
    let (head, rest) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut rx)).await {
        Ok(Ok(x)) => x,
        Ok(Err(msg)) => {
            return text(
                StatusCode::BAD_GATEWAY,
                format!("edge node {}: {msg}", session.node),
            );
        }
        Err(_) => {
            return text(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "edge node {} did not answer the {} request within {HEAD_TIMEOUT:?}",
                    session.node,
                    req.uri().path()
                ),
            );
        }
    };
    if head.status != 101 {
        tracing::info!(node = %session.node, id, ?kind, status = head.status, "edge refused the upgrade");
        let body = read_body(&head, rest, &mut rx).await;
        return respond(&head, Full::new(Bytes::from(body)).boxed());
    }
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => relay(TokioIo::new(io), rest, rx, guard).await,
            Err(e) => tracing::info!(id, error = %e, "client upgrade failed"),
        }
    });
    respond(&head, Empty::new().boxed())
}

/// Reads DATA until a whole response head: the head and the bytes after it.
async fn read_head(rx: &mut mpsc::Receiver<Vec<u8>>) -> Result<(ResponseHead, Vec<u8>), String> {
    let mut buf = Vec::new();
    loop {
        let Some(chunk) = rx.recv().await else {
            return Err(if buf.is_empty() {
                "the edge ended the connection without an answer".into()
            } else {
                format!(
                    "the edge ended the connection within its answer: {:?}",
                    String::from_utf8_lossy(&buf[..buf.len().min(200)])
                )
            });
        };
        buf.extend_from_slice(&chunk);
        match parse_response_head(&buf) {
            Ok(Some((head, used))) => return Ok((head, buf.split_off(used))),
            Ok(None) => {}
            Err(e) => return Err(format!("bad answer from the edge: {e}")),
        }
    }
}

/// The body of a refused upgrade: by Content-Length, chunked, or up to the end of the
/// connection; at most [`MAX_ERROR_BODY`] bytes, within [`HEAD_TIMEOUT`].
async fn read_body(
    head: &ResponseHead,
    mut body: Vec<u8>,
    rx: &mut mpsc::Receiver<Vec<u8>>,
) -> Vec<u8> {
    let length = head
        .header("content-length")
        .and_then(|l| l.parse::<usize>().ok());
    let chunked = head
        .header("transfer-encoding")
        .is_some_and(|t| t.eq_ignore_ascii_case("chunked"));
    let complete = |b: &[u8]| -> Option<Vec<u8>> {
        match (length, chunked) {
            (_, true) => decode_chunked(b),
            (Some(n), _) => (b.len() >= n).then(|| b[..n].to_vec()),
            (None, false) => None,
        }
    };
    let collect = async {
        loop {
            if let Some(done) = complete(&body) {
                return done;
            }
            if body.len() >= MAX_ERROR_BODY {
                body.truncate(MAX_ERROR_BODY);
                return body;
            }
            match rx.recv().await {
                Some(chunk) => body.extend_from_slice(&chunk),
                None => return body,
            }
        }
    };
    tokio::time::timeout(HEAD_TIMEOUT, collect)
        .await
        .unwrap_or_default()
}

/// The client's response with the edge's status and headers (framing headers recomputed).
fn respond(head: &ResponseHead, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(head.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let upgrade = head.status == 101;
    for (k, v) in &head.headers {
        let framing = ["content-length", "transfer-encoding", "keep-alive"]
            .iter()
            .any(|h| k.eq_ignore_ascii_case(h));
        let hop = ["connection", "upgrade"]
            .iter()
            .any(|h| k.eq_ignore_ascii_case(h));
        if framing || (hop && !upgrade) {
            continue;
        }
        if let (Ok(k), Ok(v)) = (
            HeaderName::try_from(k.as_str()),
            HeaderValue::try_from(v.as_str()),
        ) {
            r.headers_mut().append(k, v);
        }
    }
    r
}

/// Relays the upgraded client connection and the tunnel connection until either ends (both
/// directions at once, see [`kubeedge_shared::stream::pump`]).
async fn relay<S>(io: S, rest: Vec<u8>, mut rx: mpsc::Receiver<Vec<u8>>, guard: ConnGuard)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let id = guard.id;
    let session = guard.session.clone();
    let moved = std::sync::atomic::AtomicU64::new(0);
    let why = kubeedge_shared::stream::pump::duplex(
        io,
        rest,
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
    tracing::debug!(id, why = why.as_str(), "upgrade connection ended");
    drop(guard);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &[u8]) -> ResponseHead {
        parse_response_head(raw).unwrap().unwrap().0
    }

    #[tokio::test]
    async fn refused_upgrades_keep_their_body_however_it_is_framed() {
        let (tx, mut rx) = mpsc::channel(8);
        let h = head(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 10\r\n\r\n");
        tx.send(b"67890extra".to_vec()).await.unwrap();
        assert_eq!(
            read_body(&h, b"12345".to_vec(), &mut rx).await,
            b"1234567890"
        );

        let h = head(b"HTTP/1.1 500 x\r\nTransfer-Encoding: chunked\r\n\r\n");
        tx.send(b"\r\n0\r\n\r\n".to_vec()).await.unwrap();
        assert_eq!(read_body(&h, b"3\r\nabc".to_vec(), &mut rx).await, b"abc");

        // No length: up to the end of the connection.
        let h = head(b"HTTP/1.1 403 Forbidden\r\n\r\n");
        tx.send(b"b".to_vec()).await.unwrap();
        drop(tx);
        assert_eq!(read_body(&h, b"a".to_vec(), &mut rx).await, b"ab");
    }

    #[test]
    fn upgrade_answers_keep_their_upgrade_headers() {
        let up = respond(
            &head(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"),
            Empty::new().boxed(),
        );
        assert_eq!(up.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(up.headers()["upgrade"], "SPDY/3.1");
        assert_eq!(
            up.headers()["x-stream-protocol-version"],
            "v4.channel.k8s.io"
        );
        let refused = respond(
            &head(b"HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 3\r\nContent-Type: text/plain\r\n\r\n"),
            Empty::new().boxed(),
        );
        assert_eq!(refused.status(), StatusCode::NOT_FOUND);
        assert!(refused.headers().get("connection").is_none());
        assert!(refused.headers().get("content-length").is_none());
        assert_eq!(refused.headers()["content-type"], "text/plain");
    }
}
