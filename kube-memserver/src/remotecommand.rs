//! `pods/<name>/exec` and `pods/<name>/attach` (GET or POST): like an apiserver that proxies
//! these upgrades to the kubelet (every apiserver before 1.30, and later ones for SPDY), the
//! request goes to the node's kubelet endpoint as `/exec|attach/<ns>/<pod>/<container>`
//! with the options re-encoded as the kubelet reads them (`input=1`, `command=…`) and the
//! client's headers (its credentials left out), and the kubelet's answer comes back: a `101` joins the two
//! connections until either ends, anything else is relayed as the response. kubectl ≥ 1.30
//! asks for WebSocket `v5.channel.k8s.io` first; a runtime's streaming server refuses that
//! (it speaks SPDY and the older WebSocket protocols), kubectl sees the failed upgrade and
//! falls back to SPDY, as it does against such an apiserver.

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::handlers::Body;
use super::kubelet;
use super::query::{Query, percent_decode_path};
use super::state::State;
use super::status::{ApiError, ApiResult};
use super::verbs;

/// Largest kubelet error body relayed.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// `(namespace, pod, "exec"|"attach"|"portforward")` when `path` is such a request.
pub fn target(method: &Method, path: &str) -> Option<(String, String, &'static str)> {
    if method != Method::GET && method != Method::POST {
        return None;
    }
    let segs: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .map(percent_decode_path)
        .collect();
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    match s.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", name, sub]
            if !ns.is_empty() && !name.is_empty() =>
        {
            let sub = match *sub {
                "exec" => "exec",
                "attach" => "attach",
                "portforward" => "portforward",
                _ => return None,
            };
            Some((ns.to_string(), name.to_string(), sub))
        }
        _ => None,
    }
}

/// Go's `strconv.ParseBool`, as the options decoder uses it.
fn parse_bool(name: &str, v: &str) -> ApiResult<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" | "" => Ok(false),
        _ => Err(ApiError::bad_request(format!(
            "{name}: invalid value {v:?}: strconv.ParseBool: parsing {v:?}: invalid syntax"
        ))),
    }
}

/// The kubelet query for the options in `raw_query`, as the real apiserver builds it
/// (`streamParams` in `pkg/registry/core/pod/strategy.go`, the same in 1.26–1.34): each set
/// flag under the kubelet's name (`input`, `output`, `error`, `tty`) with value `1`, `command`
/// once per argument (exec only), encoded by Go's `url.Values.Encode` (keys sorted, each
/// key's values in order).
pub fn kubelet_query(sub: &str, raw_query: &str) -> ApiResult<String> {
    let pairs = kubeedge_shared::stream::parse_query(raw_query);
    let mut out: Vec<(&str, String)> = Vec::new();
    for (option, param) in [
        ("stdin", "input"),
        ("stdout", "output"),
        ("stderr", "error"),
        ("tty", "tty"),
    ] {
        let mut set = false;
        for (_, v) in pairs.iter().filter(|(k, _)| k == option) {
            set = parse_bool(option, v)?;
        }
        if set {
            out.push((param, "1".into()));
        }
    }
    if sub == "exec" {
        for (_, c) in pairs.iter().filter(|(k, _)| k == "command") {
            out.push(("command", encode(c)));
        }
    }
    // A stable sort by key keeps each key's values in order, as `Encode` does.
    out.sort_by_key(|(k, _)| *k);
    Ok(out
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&"))
}

/// Query-escapes `s` (Go's `url.QueryEscape`).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Request headers the kubelet gets: the client's, without its credentials and hop headers.
fn forwarded(name: &header::HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "authorization" | "host" | "content-length" | "transfer-encoding" | "keep-alive" | "te"
    )
}

pub async fn serve(
    st: &State,
    req: Request<Incoming>,
    ns: &str,
    pod_name: &str,
    sub: &str,
) -> ApiResult<Response<Body>> {
    let query = Query::parse(req.uri().query());
    let pod: Value = verbs::get(st, &st.core("pods"), ns, pod_name)?.value();
    let container = kubelet::pick_container(&pod, pod_name, &query)?;
    let q = kubelet_query(sub, req.uri().query().unwrap_or_default())?;
    let path = format!("/{sub}/{ns}/{pod_name}/{container}?{q}");
    let resp = kubelet_upgrade(st, &pod, pod_name, req.method(), &path, req.headers()).await?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // The kubelet's refusal goes back as it is (a WebSocket client sees the failed
        // handshake and may fall back to SPDY).
        return Ok(refusal(resp).await);
    }
    let out = switching_protocols(resp.headers());
    let kubelet_side = hyper::upgrade::on(resp);
    let client_side = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let (Ok(k), Ok(c)) = (kubelet_side.await, client_side.await) else {
            tracing::debug!("exec/attach upgrade did not complete");
            return;
        };
        splice(TokioIo::new(c), TokioIo::new(k)).await;
    });
    Ok(out)
}

/// Sends the upgrade request `method path` with `headers` (those [`forwarded`]) to the
/// kubelet of the node `pod` runs on, and returns its answer (a `101` can be upgraded).
pub(super) async fn kubelet_upgrade(
    st: &State,
    pod: &Value,
    pod_name: &str,
    method: &Method,
    path: &str,
    headers: &http::HeaderMap,
) -> ApiResult<Response<Incoming>> {
    let verb = if method == Method::POST {
        "Post"
    } else {
        "Get"
    };
    let (tls, authority) =
        kubelet::connect(st, pod, pod_name, verb, path, &st.kubelet_tls.default).await?;
    let fail = |e: &dyn std::fmt::Display| {
        ApiError::internal(format!("{verb} https://{authority}{path}: {e}"))
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| fail(&e))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let mut upstream = Request::builder()
        .method(method.clone())
        .uri(path)
        .header(header::HOST, authority.as_str());
    for (k, v) in headers {
        if forwarded(k) {
            upstream = upstream.header(k, v);
        }
    }
    let upstream = upstream.body(Empty::<Bytes>::new()).map_err(|e| fail(&e))?;
    sender.send_request(upstream).await.map_err(|e| fail(&e))
}

/// A kubelet's non-upgrade answer, relayed: its status, content type and (bounded) body.
pub(super) async fn refusal(resp: Response<Incoming>) -> Response<Body> {
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = Limited::new(resp.into_body(), MAX_ERROR_BODY)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut out = Response::new(Full::new(body).boxed());
    *out.status_mut() = status;
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        out.headers_mut().insert(header::CONTENT_TYPE, ct.clone());
    }
    out
}

/// The client's `101` with the kubelet's upgrade headers.
pub(super) fn switching_protocols(kubelet: &http::HeaderMap) -> Response<Body> {
    let mut out = Response::new(Empty::new().boxed());
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    for (k, v) in kubelet {
        if k != header::CONTENT_LENGTH && k != header::TRANSFER_ENCODING {
            out.headers_mut().append(k, v.clone());
        }
    }
    if !out.headers().contains_key(header::CONNECTION) {
        out.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    }
    out
}

/// Copies both ways until one direction ends, then closes both (the apiserver's
/// upgrade-aware proxy does the same).
pub(super) async fn splice<A, B>(a: A, b: B)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    tokio::select! {
        _ = tokio::io::copy(&mut ar, &mut bw) => {}
        _ = tokio::io::copy(&mut br, &mut aw) => {}
    }
    let _ = aw.shutdown().await;
    let _ = bw.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(
            target(&Method::POST, "/api/v1/namespaces/ns/pods/web/exec"),
            Some(("ns".into(), "web".into(), "exec"))
        );
        assert_eq!(
            target(&Method::GET, "/api/v1/namespaces/ns/pods/web/attach"),
            Some(("ns".into(), "web".into(), "attach"))
        );
        assert_eq!(
            target(&Method::POST, "/api/v1/namespaces/ns/pods/web/portforward"),
            Some(("ns".into(), "web".into(), "portforward"))
        );
        assert_eq!(
            target(&Method::PUT, "/api/v1/namespaces/ns/pods/web/exec"),
            None
        );
        assert_eq!(
            target(&Method::GET, "/api/v1/namespaces/ns/pods/web/log"),
            None
        );
        assert_eq!(target(&Method::GET, "/api/v1/pods/web/exec"), None);
    }

    #[test]
    fn options_become_kubelet_params() {
        assert_eq!(
            kubelet_query(
                "exec",
                "command=sh&command=-c&command=echo+%24HOSTNAME%3B+exit+3&container=main&stdin=true&stdout=true&stderr=true&tty=false"
            )
            .unwrap(),
            "command=sh&command=-c&command=echo+%24HOSTNAME%3B+exit+3&error=1&input=1&output=1"
        );
        assert_eq!(
            kubelet_query("exec", "stdin=true&stdout=true&tty=true&command=sh").unwrap(),
            "command=sh&input=1&output=1&tty=1"
        );
        assert_eq!(
            kubelet_query("attach", "stdout=1&command=x").unwrap(),
            "output=1"
        );
        assert_eq!(kubelet_query("exec", "stdin=maybe").unwrap_err().code, 400);
    }
}
