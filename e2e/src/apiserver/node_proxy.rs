//! `GET /api/v1/nodes/<name>[:<port>]/proxy/<path>`: like the real apiserver's node proxy,
//! the request goes to the node's kubelet endpoint (`status.addresses` and
//! `daemonEndpoints.kubeletEndpoint.Port`, over TLS with the kubelet client certificate) as
//! `GET /<path>?<query>` with the client's headers (its credentials left out, as the
//! authentication filter removes them) and the reverse-proxy headers apimachinery's proxy
//! `Transport` sets: `X-Forwarded-Uri` (the original path), `X-Forwarded-Host` and
//! `X-Forwarded-Proto`. The kubelet's status, headers and body come back as they are; a
//! kubelet that cannot be reached is a 503 "error trying to reach service".

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;

use super::handlers::Body;
use super::kubelet;
use super::query::percent_decode_path;
use super::state::State;
use super::status::{ApiError, ApiResult};

/// `(node, path on the kubelet)` when `path` is a node proxy request.
pub fn target(method: &Method, path: &str) -> Option<(String, String)> {
    if method != Method::GET {
        return None;
    }
    let rest = path.strip_prefix("/api/v1/nodes/")?;
    let (name, rest) = rest.split_once('/')?;
    let sub = rest.strip_prefix("proxy")?;
    if !(sub.is_empty() || sub.starts_with('/')) {
        return None;
    }
    // `<name>:<port>` picks the port; the kubelet's own port is what it reports here.
    let name = percent_decode_path(name.split(':').next().unwrap_or_default());
    if name.is_empty() {
        return None;
    }
    let sub = if sub.is_empty() { "/" } else { sub };
    Some((name, sub.to_string()))
}

/// Headers that belong to one hop, or to the client's credentials.
fn dropped(name: &str) -> bool {
    [
        "authorization",
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

pub async fn serve(
    st: &State,
    req: Request<Incoming>,
    node: &str,
    sub: &str,
) -> ApiResult<Response<Body>> {
    let forwarded_uri = req.uri().path().to_string();
    let mut target = sub.to_string();
    if let Some(q) = req.uri().query() {
        target.push('?');
        target.push_str(q);
    }
    let (tls, authority) = kubelet::connect_node(st, node, "Get", &target)
        .await
        .map_err(|e| match e.code {
            500 => ApiError::service_unavailable(format!(
                "error trying to reach service: {}",
                e.message
            )),
            _ => e,
        })?;
    let unreachable = |e: &dyn std::fmt::Display| {
        ApiError::service_unavailable(format!("error trying to reach service: {e}"))
    };
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| unreachable(&e))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let client_host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let mut out = Request::get(target.as_str())
        .header(http::header::HOST, authority.as_str())
        .body(Empty::<Bytes>::new())
        .map_err(|e| unreachable(&e))?;
    let h = out.headers_mut();
    for (k, v) in req.headers() {
        if !dropped(k.as_str()) {
            h.append(k.clone(), v.clone());
        }
    }
    let set = |h: &mut http::HeaderMap, k: &'static str, v: &str| {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(HeaderName::from_static(k), v);
        }
    };
    set(h, "x-forwarded-uri", &forwarded_uri);
    if !client_host.is_empty() {
        set(h, "x-forwarded-host", &client_host);
    }
    set(h, "x-forwarded-proto", "https");
    let resp = sender
        .send_request(out)
        .await
        .map_err(|e| unreachable(&e))?;
    let status = resp.status();
    let headers = resp.headers().clone();
    // An upstream error ends the body, as a proxy would.
    use futures::StreamExt;
    let frames = http_body_util::BodyStream::new(resp.into_body())
        .take_while(|r| futures::future::ready(r.is_ok()))
        .filter_map(|r| futures::future::ready(r.ok().map(Ok::<_, std::convert::Infallible>)));
    let mut r = Response::new(BodyExt::boxed(http_body_util::StreamBody::new(frames)));
    *r.status_mut() = if status == StatusCode::SWITCHING_PROTOCOLS {
        StatusCode::BAD_GATEWAY
    } else {
        status
    };
    for (k, v) in &headers {
        if !dropped(k.as_str()) {
            r.headers_mut().append(k.clone(), v.clone());
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_proxy_paths() {
        let get = Method::GET;
        assert_eq!(
            target(&get, "/api/v1/nodes/edge-1/proxy/stats/summary"),
            Some(("edge-1".into(), "/stats/summary".into()))
        );
        assert_eq!(
            target(&get, "/api/v1/nodes/edge-1:10250/proxy"),
            Some(("edge-1".into(), "/".into()))
        );
        assert_eq!(target(&get, "/api/v1/nodes/edge-1/proxyx"), None);
        assert_eq!(target(&get, "/api/v1/nodes/edge-1"), None);
        assert_eq!(target(&get, "/api/v1/nodes/edge-1/status"), None);
        assert_eq!(target(&Method::DELETE, "/api/v1/nodes/e/proxy/x"), None);
    }
}
