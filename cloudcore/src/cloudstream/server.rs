//! The stream server (`:10003`, HTTPS): kubelet-compatible routes the apiserver calls as if
//! cloudcore were the node's kubelet. For `GET /containerLogs/{ns}/{pod}/{container}` the
//! node is `spec.nodeName` of the pod (read from the API); the request goes to that node's
//! tunnel as LOGS_CONNECT with the URL rewritten to `http://127.0.0.1:10350`, and the DATA
//! the edge sends back is the response body. Like KubeEdge, the answer is 200 with a chunked
//! body once the tunnel is found; edge-side errors arrive as text in the body.
//! `GET|POST /exec/…` and `/attach/…` are upgrades relayed byte for byte (see
//! [`super::exec`]); `GET /stats…` and `/metrics…` go to the node found by IP or name (see
//! [`super::metrics`]). Every request on a connection whose client certificate does not
//! chain to the stream CA is answered 401 Unauthorized, as the kubelet ([`super::client_auth`]).

use super::client_auth::Authenticator;
use super::session::{MAX_CONNS, OpenError, Session, Sessions};
use crate::metrics::{ReasonLabel, StreamMetrics};
use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kubeedge_shared::stream::{self, Connector, GoUrl, MessageType, TunnelMessage};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub(super) type Body = BoxBody<Bytes, Infallible>;

/// Who may use the stream server, and the count of those refused.
#[derive(Clone)]
pub struct Access {
    pub auth: Authenticator,
    pub metrics: StreamMetrics,
}

pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    access: Access,
    sessions: Arc<Sessions>,
    client: kube::Client,
    shutdown: CancellationToken,
) {
    super::accept_loop(
        "stream server",
        listener,
        tls,
        shutdown,
        move |tls, peer| {
            let (sessions, client) = (sessions.clone(), client.clone());
            let authenticated = access.auth.check(tls.get_ref().1.peer_certificates());
            match &authenticated {
                Ok(cn) => tracing::debug!(%peer, client = %cn, "stream client authenticated"),
                Err(refusal) => tracing::info!(%peer, %refusal, "stream client not authenticated"),
            }
            let metrics = access.metrics.clone();
            async move {
                let svc = hyper::service::service_fn(move |req| {
                    let (sessions, client) = (sessions.clone(), client.clone());
                    let refused = authenticated.as_ref().err().map(|r| r.reason());
                    let metrics = metrics.clone();
                    async move {
                        if let Some(reason) = refused {
                            metrics
                                .requests_refused
                                .get_or_create(&ReasonLabel { reason })
                                .inc();
                            return Ok::<_, Infallible>(unauthorized());
                        }
                        Ok::<_, Infallible>(route(req, &sessions, client).await)
                    }
                });
                if let Err(e) = super::http1_server(super::HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(tls), svc)
                    .with_upgrades()
                    .await
                {
                    tracing::debug!(%peer, error = %e, "stream server connection ended");
                }
            }
        },
    )
    .await
}

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

/// The kubelet's answer to an unauthenticated request.
fn unauthorized() -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(b"Unauthorized")).boxed());
    *r.status_mut() = StatusCode::UNAUTHORIZED;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

async fn route(
    req: Request<Incoming>,
    sessions: &Sessions,
    client: kube::Client,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (req.method(), parts.as_slice()) {
        (&http::Method::GET, ["containerLogs", ns, pod, container])
            if !ns.is_empty() && !pod.is_empty() && !container.is_empty() =>
        {
            let (ns, pod) = (ns.to_string(), pod.to_string());
            logs(req, sessions, client, &ns, &pod).await
        }
        (
            &http::Method::GET | &http::Method::POST,
            [kind @ ("exec" | "attach"), ns, pod, rest @ ..],
        ) if !ns.is_empty() && !pod.is_empty() && matches!(rest, [c] | [_, c] if !c.is_empty()) => {
            let kind = if *kind == "exec" {
                MessageType::ExecConnect
            } else {
                MessageType::AttachConnect
            };
            let (ns, pod) = (ns.to_string(), pod.to_string());
            super::exec::serve(req, kind, sessions, client, &ns, &pod).await
        }
        (&http::Method::GET, parts) if super::metrics::is_route(parts) => {
            super::metrics::serve(req, sessions).await
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found".into()),
    }
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

async fn logs(
    req: Request<Incoming>,
    sessions: &Sessions,
    client: kube::Client,
    ns: &str,
    pod: &str,
) -> Response<Body> {
    let session = match session_for_pod(sessions, client, ns, pod).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let (guard, rx) = match connect(sessions, &session, MessageType::LogsConnect, &req, None).await
    {
        Ok(c) => c,
        Err(r) => return r,
    };
    let id = guard.id;
    tracing::debug!(node = %session.node, id, path = %req.uri(), "logs connection opened");
    let frames = tokio_stream_from(rx).map(move |chunk| {
        let _keep = &guard;
        Ok::<_, Infallible>(Frame::data(Bytes::from(chunk)))
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(frames)));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    r
}

fn tokio_stream_from(
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
