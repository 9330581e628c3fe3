//! The stream server (`:10003`, HTTPS): kubelet-compatible routes the apiserver calls as if
//! cloudcore were the node's kubelet. For `GET /containerLogs/{ns}/{pod}/{container}` the
//! node is `spec.nodeName` of the pod (read from the API); the request goes to that node's
//! tunnel as LOGS_CONNECT with the URL rewritten to `http://127.0.0.1:10350`, and the DATA
//! the edge sends back is the response body. Like KubeEdge, the answer is 200 with a chunked
//! body once the tunnel is found; edge-side errors arrive as text in the body.
//! `GET|POST /exec/…`, `/attach/…` and `/portForward/{ns}/{pod}[/{uid}]` are upgrades
//! relayed byte for byte (see [`super::exec`]); `GET /stats…` and `/metrics…` go to the node found by IP or name (see
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

/// What a stream server request asks for: parsed once from the method and path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Logs {
        ns: String,
        pod: String,
    },
    /// exec, attach or port-forward: an upgrade relayed to the pod's node as `kind`.
    Upgrade {
        kind: MessageType,
        ns: String,
        pod: String,
    },
    Metrics,
    NotFound,
}

impl Route {
    /// The kubelet's routes: `/containerLogs/{ns}/{pod}/{container}`,
    /// `/exec|attach/{ns}/{pod}[/{uid}]/{container}`, `/portForward/{ns}/{pod}[/{uid}]`
    /// (GET or POST), `/stats…` and `/metrics…`.
    fn parse(method: &http::Method, path: &str) -> Route {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let upgrade = |kind, ns: &str, pod: &str| Route::Upgrade {
            kind,
            ns: ns.to_string(),
            pod: pod.to_string(),
        };
        let up = method == http::Method::GET || method == http::Method::POST;
        match parts.as_slice() {
            ["containerLogs", ns, pod, container]
                if method == http::Method::GET
                    && !ns.is_empty()
                    && !pod.is_empty()
                    && !container.is_empty() =>
            {
                Route::Logs {
                    ns: ns.to_string(),
                    pod: pod.to_string(),
                }
            }
            [kind @ ("exec" | "attach"), ns, pod, rest @ ..]
                if up
                    && !ns.is_empty()
                    && !pod.is_empty()
                    && matches!(rest, [c] | [_, c] if !c.is_empty()) =>
            {
                let kind = if *kind == "exec" {
                    MessageType::ExecConnect
                } else {
                    MessageType::AttachConnect
                };
                upgrade(kind, ns, pod)
            }
            ["portForward", ns, pod] | ["portForward", ns, pod, _]
                if up && !ns.is_empty() && !pod.is_empty() =>
            {
                upgrade(MessageType::PortForwardConnect, ns, pod)
            }
            parts if method == http::Method::GET && super::metrics::is_route(parts) => {
                Route::Metrics
            }
            _ => Route::NotFound,
        }
    }
}

async fn route(
    req: Request<Incoming>,
    sessions: &Sessions,
    client: kube::Client,
) -> Response<Body> {
    match Route::parse(req.method(), req.uri().path()) {
        Route::Logs { ns, pod } => logs(req, sessions, client, &ns, &pod).await,
        Route::Upgrade { kind, ns, pod } => {
            super::exec::serve(req, kind, sessions, client, &ns, &pod).await
        }
        Route::Metrics => super::metrics::serve(req, sessions).await,
        Route::NotFound => text(StatusCode::NOT_FOUND, "404 page not found".into()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn upgrade(kind: MessageType) -> Route {
        Route::Upgrade {
            kind,
            ns: "ns".into(),
            pod: "web".into(),
        }
    }

    #[test]
    fn kubelet_routes_are_recognised() {
        assert_eq!(
            Route::parse(&Method::GET, "/containerLogs/ns/web/main"),
            Route::Logs {
                ns: "ns".into(),
                pod: "web".into()
            }
        );
        assert_eq!(
            Route::parse(&Method::POST, "/exec/ns/web/main"),
            upgrade(MessageType::ExecConnect)
        );
        assert_eq!(
            Route::parse(&Method::GET, "/attach/ns/web/uid/main"),
            upgrade(MessageType::AttachConnect)
        );
        assert_eq!(Route::parse(&Method::GET, "/stats/summary"), Route::Metrics);
    }

    #[test]
    fn port_forward_is_the_kubelet_s_path_with_or_without_uid() {
        // What the apiserver sends (`PortForwardLocation`): POST /portForward/{ns}/{pod}.
        for (m, p) in [
            (Method::POST, "/portForward/ns/web"),
            (Method::GET, "/portForward/ns/web"),
            (Method::POST, "/portForward/ns/web/0c1f-uid"),
        ] {
            assert_eq!(
                Route::parse(&m, p),
                upgrade(MessageType::PortForwardConnect),
                "{m} {p}"
            );
        }
        for (m, p) in [
            (Method::PUT, "/portForward/ns/web"),
            (Method::POST, "/portforward/ns/web"),
            (Method::POST, "/portForward/ns"),
            (Method::POST, "/portForward//web"),
            (Method::POST, "/portForward/ns/web/uid/extra"),
        ] {
            assert_eq!(Route::parse(&m, p), Route::NotFound, "{m} {p}");
        }
    }
}
