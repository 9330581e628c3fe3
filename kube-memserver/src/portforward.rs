//! `pods/<name>/portforward` (GET or POST), as a kube-apiserver ≥ 1.31 serves it (feature
//! `PortForwardWebsockets`, on by default): the request goes to the node's kubelet endpoint
//! as `/portForward/<ns>/<pod>` (`PortForwardLocation`), with `port=<p1>,<p2>` only when the
//! client named `ports` in the URL (`streamParams`; kubectl does not, its ports travel in
//! the SPDY stream headers).
//!
//! - A SPDY client (`Upgrade: SPDY/3.1`, `X-Stream-Protocol-Version: portforward.k8s.io`)
//!   is proxied as exec is: the kubelet's `101` joins the two connections.
//! - A WebSocket client asking for `SPDY/3.1+portforward.k8s.io` (kubectl ≥ 1.31 tries it
//!   first) is translated as the apiserver's `TunnelingHandler` does: the kubelet gets a
//!   plain SPDY upgrade (`POST`, `Upgrade: SPDY/3.1`, `X-Stream-Protocol-Version` = the
//!   offered protocols without the `SPDY/3.1+` prefix, WebSocket headers dropped); once it
//!   answers `101`, the client's handshake completes with the kubelet's protocol prefixed
//!   again, and the SPDY bytes travel in binary WebSocket messages towards the client and
//!   out of them towards the kubelet. A kubelet refusal goes back to the client as it is.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kubeedge_shared::stream::ws::{self, WsEvent, WsReader, WsWriter};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::handlers::Body;
use super::remotecommand::{kubelet_upgrade, refusal, splice, switching_protocols};
use super::state::State;
use super::status::{ApiError, ApiResult};
use super::verbs;

/// The WebSocket subprotocol prefix that marks SPDY tunneled over WebSocket.
pub const TUNNELING_PREFIX: &str = "SPDY/3.1+";
/// Largest WebSocket message accepted from the client (kubectl writes one per SPDY write).
const MAX_MESSAGE: usize = 1 << 20;
/// Bytes read from the kubelet per WebSocket message.
const CHUNK: usize = 32 * 1024;

/// The kubelet query for the client's `ports` options: `port=` with the ports joined by
/// commas, or nothing (Go's `url.Values.Encode` escapes the comma). Each `ports` value may
/// itself hold comma-separated ports, each a 16-bit unsigned number, else `400`, as the
/// apiserver's `Convert_Slice_string_To_Slice_int32` reads them (0 passes; the kubelet
/// refuses it).
pub fn kubelet_query(raw_query: &str) -> ApiResult<String> {
    let mut ports = Vec::new();
    for (k, v) in kubeedge_shared::stream::parse_query(raw_query) {
        if k != "ports" {
            continue;
        }
        for p in v.split(',') {
            let n: u16 = p.parse().map_err(|_| {
                let why = if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                    "value out of range"
                } else {
                    "invalid syntax"
                };
                ApiError::bad_request(format!(
                    "cannot convert to []int32: strconv.ParseUint: parsing {p:?}: {why}"
                ))
            })?;
            ports.push(n.to_string());
        }
    }
    Ok(if ports.is_empty() {
        String::new()
    } else {
        format!("port={}", ports.join("%2C"))
    })
}

/// The SPDY protocols a WebSocket tunneling request offers (`SPDY/3.1+…k8s.io`, prefix
/// removed), or `None` when it is not a WebSocket request asking for a SPDY tunnel.
pub fn tunneled_protocols(headers: &HeaderMap) -> Option<Vec<String>> {
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !upgrade.eq_ignore_ascii_case("websocket") {
        return None;
    }
    let offered: Vec<String> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .collect();
    if !offered.iter().any(|p| p.starts_with(TUNNELING_PREFIX)) {
        return None;
    }
    Some(
        offered
            .iter()
            .filter_map(|p| p.strip_prefix(TUNNELING_PREFIX))
            .filter(|p| p.ends_with("k8s.io"))
            .map(str::to_string)
            .collect(),
    )
}

/// The kubelet's headers for a tunneled request (`createSPDYRequest`).
pub fn spdy_headers(ws: &HeaderMap, protocols: &[String]) -> HeaderMap {
    let mut h = ws.clone();
    for name in [
        header::SEC_WEBSOCKET_PROTOCOL,
        header::SEC_WEBSOCKET_KEY,
        header::SEC_WEBSOCKET_VERSION,
        header::SEC_WEBSOCKET_EXTENSIONS,
        header::UPGRADE,
    ] {
        h.remove(name);
    }
    h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.remove("x-stream-protocol-version");
    for p in protocols {
        if let Ok(v) = HeaderValue::from_str(p) {
            h.append("x-stream-protocol-version", v);
        }
    }
    h
}

pub async fn serve(
    st: &State,
    req: Request<Incoming>,
    ns: &str,
    pod_name: &str,
) -> ApiResult<Response<Body>> {
    let pod: Value = verbs::get(st, &st.core("pods"), ns, pod_name)?.value();
    let q = kubelet_query(req.uri().query().unwrap_or_default())?;
    let path = if q.is_empty() {
        format!("/portForward/{ns}/{pod_name}")
    } else {
        format!("/portForward/{ns}/{pod_name}?{q}")
    };
    let Some(protocols) = tunneled_protocols(req.headers()) else {
        tracing::debug!(%ns, pod = %pod_name, "port-forward: upgrade relayed to the kubelet as it is");
        let resp = kubelet_upgrade(st, &pod, pod_name, req.method(), &path, req.headers()).await?;
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            return Ok(refusal(resp).await);
        }
        let out = switching_protocols(resp.headers());
        let kubelet_side = hyper::upgrade::on(resp);
        let client_side = hyper::upgrade::on(req);
        tokio::spawn(async move {
            let (Ok(k), Ok(c)) = (kubelet_side.await, client_side.await) else {
                tracing::debug!("port-forward upgrade did not complete");
                return;
            };
            splice(TokioIo::new(c), TokioIo::new(k)).await;
        });
        return Ok(out);
    };
    if protocols.is_empty() {
        return Err(ApiError::bad_request(
            "unable to upgrade: no tunneling spdy protocols provided",
        ));
    }
    tracing::debug!(%ns, pod = %pod_name, ?protocols, "port-forward: SPDY tunneled over WebSocket, sent to the kubelet as SPDY");
    let key = req
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|k| ws::accept_key(k.as_bytes()))
        .ok_or_else(|| ApiError::bad_request("missing Sec-WebSocket-Key"))?;
    let headers = spdy_headers(req.headers(), &protocols);
    let resp = kubelet_upgrade(st, &pod, pod_name, &Method::POST, &path, &headers).await?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Ok(refusal(resp).await);
    }
    let value = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase()
    };
    if !value("connection").contains("upgrade") || !value("upgrade").contains("spdy/3.1") {
        return Err(ApiError::internal(
            "unable to upgrade: missing upgrade headers in response",
        ));
    }
    let chosen = resp
        .headers()
        .get("x-stream-protocol-version")
        .and_then(|v| v.to_str().ok())
        .map(|p| format!("{TUNNELING_PREFIX}{}", p.trim()));
    let mut out = Response::new(Empty::<Bytes>::new().boxed());
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = out.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(&key) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if let Some(v) = chosen.and_then(|c| HeaderValue::from_str(&c).ok()) {
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, v);
    }
    let kubelet_side = hyper::upgrade::on(resp);
    let client_side = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let (Ok(k), Ok(c)) = (kubelet_side.await, client_side.await) else {
            tracing::debug!("port-forward tunnel upgrade did not complete");
            return;
        };
        tunnel(TokioIo::new(c), TokioIo::new(k)).await;
    });
    Ok(out)
}

/// Carries the kubelet's SPDY bytes in binary WebSocket messages to the client and the
/// client's messages' payloads to the kubelet, until either side ends.
async fn tunnel<C, K>(client: C, kubelet: K)
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
    K: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let (cr, cw) = tokio::io::split(client);
    let (mut kr, mut kw) = tokio::io::split(kubelet);
    let (pong_tx, mut pong_rx) = mpsc::channel::<Vec<u8>>(4);
    let upstream = tokio::spawn(async move {
        let mut reader = WsReader::new(cr, MAX_MESSAGE);
        loop {
            match reader.next().await {
                Ok(Some(WsEvent::Data { payload, .. })) => {
                    if kw.write_all(&payload).await.is_err() {
                        break;
                    }
                }
                Ok(Some(WsEvent::Ping(p))) => {
                    let _ = pong_tx.try_send(p);
                }
                Ok(Some(WsEvent::Pong(_))) => {}
                Ok(Some(WsEvent::Close)) | Ok(None) | Err(_) => break,
            }
        }
        let _ = kw.shutdown().await;
    });
    let mut writer = WsWriter::new(cw, false);
    let mut buf = vec![0u8; CHUNK];
    loop {
        tokio::select! {
            n = kr.read(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if writer.send(ws::OP_BINARY, &buf[..n]).await.is_err() {
                        break;
                    }
                }
            },
            p = pong_rx.recv() => match p {
                Some(p) => {
                    if writer.send(ws::OP_PONG, &p).await.is_err() {
                        break;
                    }
                }
                // The client side ended.
                None => break,
            },
        }
    }
    // A normal closure (code 1000), as the apiserver's tunneling connection sends.
    let _ = writer.send(ws::OP_CLOSE, &1000u16.to_be_bytes()).await;
    writer.shutdown().await;
    upstream.abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_tunnel_carries_spdy_bytes_in_binary_messages_both_ways() {
        let (client, client_peer) = tokio::io::duplex(1 << 16);
        let (kubelet, mut kubelet_peer) = tokio::io::duplex(1 << 16);
        let task = tokio::spawn(tunnel(client_peer, kubelet));
        let (cr, mut cw) = tokio::io::split(client);
        let mut from_server = WsReader::new(cr, MAX_MESSAGE);
        // kubectl's side: masked binary messages, a ping in between.
        let mask = Some([1, 2, 3, 4]);
        cw.write_all(&ws::encode_frame(ws::OP_BINARY, b"\x80\x03spdy", mask))
            .await
            .unwrap();
        cw.write_all(&ws::encode_frame(ws::OP_PING, b"p", mask))
            .await
            .unwrap();
        cw.write_all(&ws::encode_frame(ws::OP_BINARY, b"-frames", mask))
            .await
            .unwrap();
        let mut got = vec![0u8; 13];
        kubelet_peer.read_exact(&mut got).await.unwrap();
        assert_eq!(got, b"\x80\x03spdy-frames");
        assert_eq!(
            from_server.next().await.unwrap(),
            Some(WsEvent::Pong(b"p".to_vec()))
        );
        // The kubelet's bytes come back as binary messages.
        kubelet_peer.write_all(b"\x80\x03reply").await.unwrap();
        assert_eq!(
            from_server.next().await.unwrap(),
            Some(WsEvent::Data {
                opcode: ws::OP_BINARY,
                payload: b"\x80\x03reply".to_vec()
            })
        );
        // The kubelet ending ends the tunnel with a normal closure.
        drop(kubelet_peer);
        assert_eq!(from_server.next().await.unwrap(), Some(WsEvent::Close));
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("the tunnel ends")
            .unwrap();
    }

    #[test]
    fn ports_become_the_kubelet_s_port_param() {
        assert_eq!(kubelet_query("").unwrap(), "");
        assert_eq!(
            kubelet_query("ports=8080&ports=9090").unwrap(),
            "port=8080%2C9090"
        );
        assert_eq!(
            kubelet_query("ports=80%2C443&ports=8080").unwrap(),
            "port=80%2C443%2C8080"
        );
        for bad in ["ports=x", "ports=70000", "ports=-1", "ports=80,"] {
            assert_eq!(kubelet_query(bad).unwrap_err().code, 400, "{bad}");
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn kubectl_s_websocket_request_becomes_a_spdy_upgrade() {
        // What kubectl ≥ 1.31 sends first.
        let ws = headers(&[
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("sec-websocket-version", "13"),
            ("sec-websocket-protocol", "SPDY/3.1+portforward.k8s.io"),
            ("user-agent", "kubectl/v1.32.0"),
        ]);
        let protocols = tunneled_protocols(&ws).unwrap();
        assert_eq!(protocols, ["portforward.k8s.io"]);
        let spdy = spdy_headers(&ws, &protocols);
        assert_eq!(spdy["upgrade"], "SPDY/3.1");
        assert_eq!(spdy["connection"], "Upgrade");
        assert_eq!(spdy["x-stream-protocol-version"], "portforward.k8s.io");
        assert_eq!(spdy["user-agent"], "kubectl/v1.32.0");
        for gone in [
            "sec-websocket-key",
            "sec-websocket-version",
            "sec-websocket-protocol",
        ] {
            assert!(spdy.get(gone).is_none(), "{gone}");
        }
    }

    #[test]
    fn other_requests_are_not_tunneled() {
        // kubectl's SPDY fallback and exec-style WebSocket protocols go through unchanged.
        assert_eq!(
            tunneled_protocols(&headers(&[
                ("upgrade", "SPDY/3.1"),
                ("x-stream-protocol-version", "portforward.k8s.io"),
            ])),
            None
        );
        assert_eq!(
            tunneled_protocols(&headers(&[
                ("upgrade", "websocket"),
                ("sec-websocket-protocol", "v4.channel.k8s.io"),
            ])),
            None
        );
        // A tunneling request whose protocols are not Kubernetes' is refused (400).
        assert_eq!(
            tunneled_protocols(&headers(&[
                ("upgrade", "websocket"),
                ("sec-websocket-protocol", "SPDY/3.1+other"),
            ])),
            Some(vec![])
        );
    }
}
