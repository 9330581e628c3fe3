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
//! What the routes share (the pod's tunnel, opening a connection on it) is in [`super::relay`].

use super::client_auth::Authenticator;
use super::relay::{Body, connect, session_for_pod, text, tokio_stream_from};
use super::session::Sessions;
use crate::metrics::{ReasonLabel, StreamMetrics};
use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use kubeedge_shared::stream::MessageType;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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
