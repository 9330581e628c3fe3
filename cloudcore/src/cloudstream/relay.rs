//! The relay every stream route shares: the tunnel of a pod's node, a connection opened on
//! it (announced to the edge with the request's connect payload, ended when its guard drops),
//! and the plain-text answers for what went wrong.

use super::session::{MAX_CONNS, OpenError, Session, Sessions};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kubeedge_shared::stream::{self, Connector, GoUrl, MessageType, TunnelMessage};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

pub(super) type Body = BoxBody<Bytes, Infallible>;

pub(super) fn text(status: StatusCode, msg: String) -> Response<Body> {
    tracing::info!(%status, %msg, "stream request refused");
    let mut r = Response::new(Full::new(Bytes::from(msg)).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The tunnel of the node the pod runs on.
pub(super) async fn session_for_pod(
    sessions: &Sessions,
    client: kube::Client,
    ns: &str,
    pod: &str,
) -> Result<Arc<Session>, Response<Body>> {
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let found = pods.get_opt(pod).await.map_err(|e| {
        text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot read pod {ns}/{pod}: {e}"),
        )
    })?;
    let Some(found) = found else {
        return Err(text(
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{pod} not found"),
        ));
    };
    let node = found
        .spec
        .and_then(|s| s.node_name)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            text(
                StatusCode::BAD_REQUEST,
                format!("pod {ns}/{pod} is not bound to a node"),
            )
        })?;
    sessions.get(&node).ok_or_else(|| {
        text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "no stream tunnel from edge node {node}: is modules.edgeStream enabled on it and connected?"
            ),
        )
    })
}

/// Go's canonical MIME header key (`user-agent` → `User-Agent`).
fn canonical_header(name: &str) -> String {
    name.split('-')
        .map(|p| {
            let mut c = p.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + &c.as_str().to_ascii_lowercase(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// The connect payload for `req` (URL rewritten to edged's local server).
pub fn connector(id: u64, req: &Request<Incoming>, method: Option<String>) -> Connector {
    let mut header: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in req.headers() {
        if let Ok(v) = v.to_str() {
            header
                .entry(canonical_header(k.as_str()))
                .or_default()
                .push(v.to_string());
        }
    }
    Connector {
        mess_id: id,
        url: GoUrl {
            scheme: "http".into(),
            host: stream::EDGED_SERVER_HOST.into(),
            path: req.uri().path().to_string(),
            raw_query: req.uri().query().unwrap_or_default().to_string(),
            ..GoUrl::default()
        },
        header: Some(header),
        method,
    }
}

/// Ends the connection when the apiserver's response is dropped, telling the edge unless it
/// ended the connection itself (as KubeEdge: no REMOVE_CONNECT echo).
pub(super) struct ConnGuard {
    pub(super) session: Arc<Session>,
    pub(super) id: u64,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if !self.session.remove_conn(self.id) {
            return;
        }
        self.session.try_send(TunnelMessage::new(
            self.id,
            MessageType::RemoveConnect,
            Vec::new(),
        ));
    }
}

/// What the edge sends on one connection.
pub(super) type ConnData = tokio::sync::mpsc::Receiver<Vec<u8>>;

/// A new connection on the session's tunnel, announced to the edge as `kind` with the
/// connect payload for `req`; ended (and the edge told) when the guard drops.
pub(super) async fn connect(
    sessions: &Sessions,
    session: &Arc<Session>,
    kind: MessageType,
    req: &Request<Incoming>,
    method: Option<String>,
) -> Result<(ConnGuard, ConnData), Response<Body>> {
    let (id, rx) = match sessions.open(session) {
        Ok(c) => c,
        Err(OpenError::Closed) => return Err(tunnel_closed(session)),
        Err(OpenError::Full) => {
            return Err(text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "edge node {} already has {MAX_CONNS} open streams (logs -f, exec, attach); end some and retry",
                    session.node
                ),
            ));
        }
    };
    let guard = ConnGuard {
        session: session.clone(),
        id,
    };
    let payload = serde_json::to_vec(&connector(id, req, method))
        .map_err(|e| text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    if !session.send(TunnelMessage::new(id, kind, payload)).await {
        return Err(tunnel_closed(session));
    }
    Ok((guard, rx))
}

fn tunnel_closed(session: &Session) -> Response<Body> {
    text(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("the stream tunnel of {} has closed", session.node),
    )
}

pub(super) fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Vec<u8>>,
) -> impl futures_util::Stream<Item = Vec<u8>> + Send {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_are_canonical_like_go() {
        assert_eq!(canonical_header("user-agent"), "User-Agent");
        assert_eq!(canonical_header("x-forwarded-uri"), "X-Forwarded-Uri");
        assert_eq!(canonical_header("accept"), "Accept");
    }
}
