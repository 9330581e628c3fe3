//! `GET /stats…` and `/metrics…` on the stream server: the kubelet's resource usage
//! endpoints of an edge node (metrics-server, `kubectl top`, `kubectl get --raw
//! /api/v1/nodes/<node>/proxy/stats/summary`). As KubeEdge, the node is the one named in an
//! `X-Forwarded-Uri: /api/v1/nodes/<node>/proxy/…` header (the apiserver's node proxy sets
//! it) or else the one whose internal IP is the `Host` of the request (clients that call the
//! "kubelet" directly); the request goes to its tunnel as METRIC_CONNECT and the DATA that
//! comes back is the response body, which ends with the edge's REMOVE_CONNECT. The edge
//! sends the body only, so the answer is 200 once it starts; an edge that says nothing
//! within [`FIRST_DATA_TIMEOUT`] gets a 504, and the body is cut at [`MAX_BODY`] bytes or
//! after [`IDLE_TIMEOUT`] of silence.

use super::relay::{Body, ConnGuard, connect, text};
use super::session::{Session, Sessions};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use kubeedge_shared::stream::MessageType;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// How long the edge may take to start its answer (it reads the runtime's stats).
pub const FIRST_DATA_TIMEOUT: Duration = Duration::from_secs(30);
/// Silence within an answer that ends it.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest answer relayed (a node's cAdvisor metrics are a few MiB).
pub const MAX_BODY: usize = 64 << 20;

/// Whether `parts` (the path's segments) is one of the kubelet's stats or metrics routes
/// that KubeEdge's stream server serves.
pub fn is_route(parts: &[&str]) -> bool {
    match parts {
        ["stats"] | ["stats", ""] | ["stats", "summary"] | ["stats", "container"] => true,
        ["stats", pod, c] => !pod.is_empty() && !c.is_empty(),
        ["stats", ns, pod, uid, c] => [ns, pod, uid, c].iter().all(|s| !s.is_empty()),
        ["metrics"] | ["metrics", ""] => true,
        ["metrics", "cadvisor" | "probes" | "resource"] => true,
        _ => false,
    }
}

/// The node named by an `X-Forwarded-Uri: /api/v1/nodes/<node>[:<port>]/proxy/…`.
pub fn forwarded_node(uri: &str) -> Option<&str> {
    let rest = uri.strip_prefix("/api/v1/nodes/")?;
    let (name, rest) = rest.split_once('/')?;
    if !rest.starts_with("proxy") {
        return None;
    }
    let name = name.split(':').next().unwrap_or_default();
    (!name.is_empty()).then_some(name)
}

/// The host of a `Host` header value (`10.0.0.1:10350`, `[fd00::1]:10350`, `node`).
pub fn host_of(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    match authority.rsplit_once(':') {
        Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) && !h.contains(':') => h,
        _ => authority,
    }
}

fn find_session(req: &Request<Incoming>, sessions: &Sessions) -> Result<Arc<Session>, String> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    };
    let forwarded = forwarded_node(header("x-forwarded-uri"));
    if let Some(s) = forwarded.and_then(|n| sessions.get(n)) {
        return Ok(s);
    }
    let host = host_of(req.uri().host().unwrap_or(header("host")));
    if let Some(s) = sessions.get(host) {
        return Ok(s);
    }
    Err(match forwarded {
        Some(node) => format!(
            "no stream tunnel from edge node {node}: is modules.edgeStream enabled on it and connected?"
        ),
        None => format!(
            "Can not find {host} session: no edge node with that internal IP has a stream tunnel"
        ),
    })
}

fn content_type(path: &str) -> &'static str {
    if path.starts_with("/metrics") {
        "text/plain; version=0.0.4; charset=utf-8"
    } else {
        "application/json"
    }
}

pub async fn serve(req: Request<Incoming>, sessions: &Sessions) -> Response<Body> {
    let session = match find_session(&req, sessions) {
        Ok(s) => s,
        Err(msg) => return text(StatusCode::INTERNAL_SERVER_ERROR, msg),
    };
    let (guard, mut rx) =
        match connect(sessions, &session, MessageType::MetricConnect, &req, None).await {
            Ok(c) => c,
            Err(r) => return r,
        };
    let id = guard.id;
    let path = req.uri().path().to_string();
    tracing::debug!(node = %session.node, id, %path, "metrics connection opened");
    let first = match tokio::time::timeout(FIRST_DATA_TIMEOUT, rx.recv()).await {
        Ok(Some(chunk)) => chunk,
        Ok(None) => {
            return text(
                StatusCode::BAD_GATEWAY,
                format!(
                    "edge node {} ended the {path} request without an answer",
                    session.node
                ),
            );
        }
        Err(_) => {
            return text(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "edge node {} did not answer the {path} request within {FIRST_DATA_TIMEOUT:?}",
                    session.node
                ),
            );
        }
    };
    let mut r = Response::new(relay(first, rx, guard));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type(&path)),
    );
    r
}

/// The body: `first`, then what the edge sends until it ends the connection, goes silent
/// for [`IDLE_TIMEOUT`] or passes [`MAX_BODY`].
fn relay(first: Vec<u8>, rx: mpsc::Receiver<Vec<u8>>, guard: ConnGuard) -> Body {
    struct State {
        first: Option<Vec<u8>>,
        rx: mpsc::Receiver<Vec<u8>>,
        sent: usize,
        guard: ConnGuard,
    }
    let state = State {
        first: Some(first),
        rx,
        sent: 0,
        guard,
    };
    let frames = futures_util::stream::unfold(state, |mut st| async move {
        let chunk = match st.first.take() {
            Some(c) => c,
            None => match tokio::time::timeout(IDLE_TIMEOUT, st.rx.recv()).await {
                Ok(Some(c)) => c,
                Ok(None) => return None,
                Err(_) => {
                    tracing::info!(
                        id = st.guard.id,
                        "edge went silent within a metrics answer; ending it"
                    );
                    return None;
                }
            },
        };
        if st.sent + chunk.len() > MAX_BODY {
            tracing::warn!(id = st.guard.id, "metrics answer over {MAX_BODY} bytes cut");
            return None;
        }
        st.sent += chunk.len();
        Some((Ok::<_, Infallible>(Frame::data(Bytes::from(chunk))), st))
    });
    BodyExt::boxed(StreamBody::new(frames))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_stats_and_metrics_routes() {
        for p in [
            "/stats",
            "/stats/",
            "/stats/summary",
            "/stats/container",
            "/stats/web/main",
            "/stats/ns/web/uid/main",
            "/metrics",
            "/metrics/cadvisor",
            "/metrics/probes",
            "/metrics/resource",
        ] {
            let parts: Vec<&str> = p.trim_start_matches('/').split('/').collect();
            assert!(is_route(&parts), "{p}");
        }
        for p in ["/stats/x", "/metrics/other", "/metricsx", "/stats/a/b/c"] {
            let parts: Vec<&str> = p.trim_start_matches('/').split('/').collect();
            assert!(!is_route(&parts), "{p}");
        }
    }

    #[test]
    fn the_node_comes_from_the_forwarded_uri_or_the_host() {
        assert_eq!(
            forwarded_node("/api/v1/nodes/edge-1/proxy/stats/summary"),
            Some("edge-1")
        );
        assert_eq!(
            forwarded_node("/api/v1/nodes/edge-1:10250/proxy/metrics"),
            Some("edge-1")
        );
        assert_eq!(forwarded_node("/api/v1/nodes/edge-1/status"), None);
        assert_eq!(forwarded_node("/api/v1/namespaces/x/pods/y/proxy"), None);
        assert_eq!(forwarded_node(""), None);
        assert_eq!(host_of("10.0.0.7:10350"), "10.0.0.7");
        assert_eq!(host_of("[fd00::7]:10350"), "fd00::7");
        assert_eq!(host_of("fd00::7"), "fd00::7");
        assert_eq!(host_of("edge-1"), "edge-1");
    }
}
