//! The router's REST listener (`modules.router.address:port`, 9443): a call to
//! `http://<router>/<node>/<namespace>/<rule path>[/<rest>][?<query>]` goes to `<node>` as the
//! rule says — an HTTP call to an application on the node (servicebus target; its status,
//! headers and body come back) or an MQTT publish there (eventbus target; `200 message
//! delivered`). The rest of the path (and the query) is appended to the target's path or topic,
//! as KubeEdge does.
//!
//! Answers as KubeEdge's: `404 Request error` (no rule), `400` (body over the limit),
//! `408 wait to get response time out` (`restTimeout`), `500` (node not connected, edge gone,
//! unreadable answer). Beyond KubeEdge: `403` for a node a rule's `node_name` does not list,
//! `503` when too many calls wait already, an edge that disconnects fails its calls at once,
//! and a call for a node connected to another replica is forwarded there (`replicas.rs`).

use super::Shared;
use super::calls::CallEnd;
use super::metrics::Outcome;
use super::path;
use super::replicas::{FORWARDED_HEADER, announced};
use super::rules::{Route, Source, Target};
use crate::cloudhub::{BudgetTicket, SendError};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Body as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use kubeedge_shared::names::valid_node_name;
use kubeedge_shared::operation::source;
use kubeedge_shared::servicebus::{
    EDGE_SERVER_HEADER, HeaderMap, HttpRequest, HttpResponse, ServiceCall, canonical_header_name,
    is_hop_by_hop,
};
use kubeedge_shared::{Group, Message, Operation};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

type Resp = Response<Full<Bytes>>;

/// Longest life of one client connection's request (beyond `restTimeout`: reading the body).
const READ_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>, shutdown: CancellationToken) {
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "router: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let (shared, stop) = (shared.clone(), shutdown.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(&shared, req, peer).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(READ_TIMEOUT)
                .serve_connection(TokioIo::new(tcp), svc);
            tokio::select! {
                _ = stop.cancelled() => {}
                r = conn => if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "router connection ended");
                }
            }
        });
    }
}

fn text(status: StatusCode, body: impl Into<String>) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(body.into())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// A request's path, split as KubeEdge reads it: `/<node>/<namespace>/<segments…>`.
struct Addressed<'a> {
    node: &'a str,
    namespace: &'a str,
    segments: Vec<&'a str>,
}

fn address(path: &str) -> Option<Addressed<'_>> {
    let mut parts = path.strip_prefix('/')?.split('/');
    let node = parts.next().filter(|n| !n.is_empty())?;
    let namespace = parts.next().filter(|n| !n.is_empty())?;
    Some(Addressed {
        node,
        namespace,
        segments: parts.collect(),
    })
}

async fn handle(shared: &Arc<Shared>, req: Request<Incoming>, peer: SocketAddr) -> Resp {
    let metrics = &shared.metrics;
    let (parts, body) = req.into_parts();
    let Some(to) = address(parts.uri.path()).filter(|a| valid_node_name(a.node)) else {
        metrics.request("none", Outcome::NoRule);
        return text(StatusCode::NOT_FOUND, "Request error");
    };
    let Some((route, consumed)) = shared
        .table
        .current()
        .match_rest(to.namespace, &to.segments)
    else {
        metrics.request("none", Outcome::NoRule);
        return text(StatusCode::NOT_FOUND, "Request error");
    };
    let kind = route.kind().label();
    let started = Instant::now();
    if let Source::Rest {
        nodes: Some(nodes), ..
    } = &route.source
        && !nodes.contains(to.node)
    {
        metrics.request(kind, Outcome::NodeNotAllowed);
        return text(
            StatusCode::FORBIDDEN,
            format!(
                "rule {}/{} does not route to node {}",
                route.namespace, route.name, to.node
            ),
        );
    }
    // The body's bytes (its length, or the limit when it is chunked) are reserved before it is
    // read and until it is on its way: many slow uploads cannot exhaust memory.
    let max_body = shared.settings.max_body_bytes;
    let announced_len = usize::try_from(body.size_hint().exact().unwrap_or(u64::MAX)).ok();
    if announced_len.is_some_and(|n| n > max_body) {
        metrics.request(kind, Outcome::TooLarge);
        return text(StatusCode::BAD_REQUEST, "http: request body too large");
    }
    let Some(reserved) = shared.bodies.try_take(announced_len.unwrap_or(max_body)) else {
        metrics.request(kind, Outcome::Busy);
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many request bodies in flight",
        );
    };
    let rest = &to.segments[consumed..];
    let param = if rest.is_empty() {
        String::new()
    } else {
        format!("/{}", rest.join("/"))
    };
    let body = match tokio::time::timeout(
        READ_TIMEOUT,
        Limited::new(body, announced_len.unwrap_or(max_body)).collect(),
    )
    .await
    {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => {
            metrics.request(kind, Outcome::TooLarge);
            return text(StatusCode::BAD_REQUEST, "http: request body too large");
        }
        Err(_) => {
            metrics.request(kind, Outcome::ClientGone);
            return text(
                StatusCode::REQUEST_TIMEOUT,
                "request body not received in time",
            );
        }
    };
    let node = to.node.to_string();
    if !shared.hub.is_connected(&node) {
        let forwarded = parts.headers.contains_key(FORWARDED_HEADER);
        if let (false, Some(replicas)) = (forwarded, &shared.replicas)
            && let Some(holder) = replicas.holder(&node)
        {
            let r = forward(shared, &parts, body, holder, &route, peer).await;
            observe(shared, kind, started);
            return r;
        }
        metrics.request(kind, Outcome::NotConnected);
        let e = format!("cloudcore doesn't have session for node:{node}");
        shared.tally.failure(&route, &e);
        return text(StatusCode::INTERNAL_SERVER_ERROR, e);
    }
    let r = match &route.target {
        Target::ServiceBus { port, path } => {
            let mut target = path::join(path, &param);
            if let Some(q) = parts.uri.query() {
                target.push('?');
                target.push_str(q);
            }
            call_edge(
                shared,
                &route,
                &node,
                &parts,
                (body, reserved),
                *port,
                target,
            )
            .await
        }
        Target::EventBus { topic } => {
            let r = publish(shared, &route, &node, &path::join(topic, &param), body);
            drop(reserved);
            r
        }
        Target::Rest { .. } => text(StatusCode::INTERNAL_SERVER_ERROR, "rule has no edge target"),
    };
    observe(shared, kind, started);
    r
}

fn observe(shared: &Shared, route: &'static str, started: Instant) {
    shared
        .metrics
        .request_duration
        .get_or_create(&super::metrics::RouteLabel { route })
        .observe(started.elapsed().as_secs_f64());
}

/// The request's headers as Go's `http.Header`, without per-connection ones.
fn relayed_headers(headers: &http::HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in headers {
        let name = name.as_str();
        if is_hop_by_hop(name) || name.eq_ignore_ascii_case(FORWARDED_HEADER) {
            continue;
        }
        out.entry(canonical_header_name(name))
            .or_default()
            .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
    }
    out
}

/// rest → servicebus: the call to `127.0.0.1:<port><target>` on the node, and its answer.
async fn call_edge(
    shared: &Shared,
    route: &Route,
    node: &str,
    parts: &http::request::Parts,
    (body, reserved): (Bytes, BudgetTicket),
    port: u16,
    target: String,
) -> Resp {
    let metrics = &shared.metrics;
    let kind = route.kind().label();
    // The method becomes the message's operation: a lower-case `start` or `stop` would be
    // taken by the servicebus as a registration. HTTP's methods are upper case.
    let method = parts.method.as_str();
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        metrics.request(kind, Outcome::MethodNotAllowed);
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("method {method:?} is not relayed to edge applications"),
        );
    }
    let call = match ServiceCall::parse(&format!("{port}:{target}")) {
        Ok(c) => c,
        Err(e) => {
            metrics.request(kind, Outcome::NoRule);
            return text(StatusCode::BAD_REQUEST, e.to_string());
        }
    };
    let request = HttpRequest {
        header: relayed_headers(&parts.headers),
        body: body.to_vec(),
        method: parts.method.as_str().to_string(),
        url: String::new(),
    };
    let msg = Message::new(
        source::ROUTER_SERVICEBUS,
        Group::User,
        Operation::from(parts.method.as_str()),
        call.resource(),
        serde_json::to_value(&request).unwrap_or_default(),
    );
    let (guard, answer) = match shared.calls.register(msg.id(), node) {
        Ok(c) => c,
        Err(e) => {
            metrics.request(kind, Outcome::Busy);
            return text(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
        }
    };
    let sent = shared.hub.send(node, msg);
    drop(reserved);
    if let Err(e) = sent {
        drop(guard);
        return send_failed(shared, route, node, e);
    }
    let end = tokio::time::timeout(shared.settings.rest_timeout, answer).await;
    drop(guard);
    // The answer keeps its bytes of the router's budget until it is relayed.
    let (msg, _held) = match end {
        Err(_) => {
            metrics.request(kind, Outcome::Timeout);
            shared
                .tally
                .failure(route, &format!("node {node}: no answer within restTimeout"));
            return text(StatusCode::REQUEST_TIMEOUT, "wait to get response time out");
        }
        Ok(Err(_)) | Ok(Ok(CallEnd::Disconnected)) => {
            metrics.request(kind, Outcome::NotConnected);
            let e = format!("node {node} disconnected before answering");
            shared.tally.failure(route, &e);
            return text(StatusCode::INTERNAL_SERVER_ERROR, e);
        }
        Ok(Ok(CallEnd::Answer(m, held))) => (m, held),
    };
    let Some(answer) = parse_answer(&msg.content) else {
        metrics.request(kind, Outcome::BadReply);
        shared
            .tally
            .failure(route, &format!("node {node}: invalid response"));
        return text(StatusCode::INTERNAL_SERVER_ERROR, "invalid response");
    };
    let edge_error = answer
        .header
        .get("Server")
        .is_some_and(|v| v.iter().any(|s| s == EDGE_SERVER_HEADER));
    if edge_error {
        metrics.request(kind, Outcome::TargetError);
        shared.tally.failure(
            route,
            &format!("node {node}: {}", String::from_utf8_lossy(&answer.body)),
        );
    } else {
        metrics.request(kind, Outcome::Ok);
        shared.tally.success(route);
    }
    to_response(answer)
}

/// The servicebus's answer: an `HTTPResponse` object, or JSON text holding one.
fn parse_answer(content: &serde_json::Value) -> Option<HttpResponse> {
    let r: HttpResponse = match content {
        serde_json::Value::String(s) => serde_json::from_str(s).ok()?,
        v => serde_json::from_value(v.clone()).ok()?,
    };
    StatusCode::from_u16(r.status_code).ok()?;
    Some(r)
}

fn to_response(answer: HttpResponse) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(answer.body)));
    *r.status_mut() = StatusCode::from_u16(answer.status_code).unwrap_or(StatusCode::OK);
    let headers = r.headers_mut();
    for (name, values) in &answer.header {
        if is_hop_by_hop(name) {
            continue;
        }
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            continue;
        };
        for v in values {
            if let Ok(v) = HeaderValue::from_str(v) {
                headers.append(name.clone(), v);
            }
        }
    }
    r
}

/// rest → eventbus: the body published on the node's bus.
fn publish(shared: &Shared, route: &Route, node: &str, topic: &str, body: Bytes) -> Resp {
    let msg = Message::new(
        source::ROUTER_EVENTBUS,
        Group::User,
        Operation::Publish,
        topic,
        serde_json::Value::String(String::from_utf8_lossy(&body).into_owned()),
    );
    match shared.hub.send(node, msg) {
        Ok(_) => {
            shared.metrics.request(route.kind().label(), Outcome::Ok);
            shared.tally.success(route);
            text(StatusCode::OK, "message delivered")
        }
        Err(e) => send_failed(shared, route, node, e),
    }
}

fn send_failed(shared: &Shared, route: &Route, node: &str, e: SendError) -> Resp {
    let kind = route.kind().label();
    let (outcome, status, msg) = match e {
        SendError::NotConnected(_) => (
            Outcome::NotConnected,
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cloudcore doesn't have session for node:{node}"),
        ),
        SendError::QueueFull { .. } => (
            Outcome::Busy,
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the queue of node {node} is full"),
        ),
        SendError::Encode { .. } => (
            Outcome::TooLarge,
            StatusCode::BAD_REQUEST,
            "http: request body too large".to_string(),
        ),
    };
    shared.metrics.request(kind, outcome);
    shared.tally.failure(route, &msg);
    text(status, msg)
}

/// Relays the request to the replica holding the node and its answer back.
async fn forward(
    shared: &Shared,
    parts: &http::request::Parts,
    body: Bytes,
    holder: SocketAddr,
    route: &Route,
    peer: SocketAddr,
) -> Resp {
    let kind = route.kind().label();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut req = Request::builder()
        .method(parts.method.clone())
        .uri(format!("http://{holder}{path}"));
    for (name, value) in &parts.headers {
        if !is_hop_by_hop(name.as_str()) {
            req = req.header(name, value);
        }
    }
    let me = shared.settings.advertise.map(announced).unwrap_or_default();
    let req = match req.header(FORWARDED_HEADER, me).body(Full::new(body)) {
        Ok(r) => r,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let timeout = shared.settings.rest_timeout + Duration::from_secs(5);
    match shared
        .http
        .call(req, timeout, shared.settings.max_body_bytes)
        .await
    {
        Ok(reply) => {
            shared.metrics.request(kind, Outcome::Forwarded);
            let mut r = Response::new(Full::new(reply.body));
            *r.status_mut() = reply.status;
            for (name, value) in &reply.headers {
                if !is_hop_by_hop(name.as_str()) {
                    r.headers_mut().append(name, value.clone());
                }
            }
            r
        }
        Err(e) => {
            shared.metrics.request(kind, Outcome::ForwardFailed);
            let e = format!("forwarding to the cloudcore holding the node ({holder}): {e}");
            tracing::warn!(%peer, error = %e, "router request not forwarded");
            shared.tally.failure(route, &e);
            text(StatusCode::INTERNAL_SERVER_ERROR, e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_are_read_as_node_namespace_and_segments() {
        let a = address("/edge-1/default/web/a/b").unwrap();
        assert_eq!(
            (a.node, a.namespace, a.segments),
            ("edge-1", "default", vec!["web", "a", "b"])
        );
        assert!(address("/edge-1").is_none());
        assert!(address("//default/x").is_none());
        assert_eq!(address("/n/ns/").unwrap().segments, vec![""]);
    }

    #[test]
    fn headers_are_relayed_in_go_form_without_connection_ones() {
        let mut h = http::HeaderMap::new();
        h.append("x-trace", HeaderValue::from_static("1"));
        h.append("x-trace", HeaderValue::from_static("2"));
        h.insert("connection", HeaderValue::from_static("keep-alive"));
        h.insert("host", HeaderValue::from_static("router:9443"));
        h.insert(FORWARDED_HEADER, HeaderValue::from_static("10.0.0.1"));
        let g = relayed_headers(&h);
        assert_eq!(g.len(), 1);
        assert_eq!(g["X-Trace"], vec!["1", "2"]);
    }

    #[test]
    fn answers_are_read_as_objects_or_json_text() {
        let v = json!({"header": {"X-A": ["1"]}, "status_code": 201, "body": "aGk="});
        let a = parse_answer(&v).unwrap();
        assert_eq!((a.status_code, a.body.as_slice()), (201, &b"hi"[..]));
        assert_eq!(parse_answer(&json!(v.to_string())).unwrap(), a);
        assert!(parse_answer(&json!({"status_code": 0})).is_none());
        assert!(parse_answer(&json!("garbage")).is_none());
        let r = to_response(a);
        assert_eq!(r.status(), StatusCode::CREATED);
        assert_eq!(r.headers()["x-a"], "1");
    }
}
