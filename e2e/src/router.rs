//! The cloud router in tests: KubeEdge's Rule/RuleEndpoint CRDs installed from cloudcore's
//! manifest (`manifests/crds/router-crds.yaml`), rules and endpoints created as a user would,
//! a router on a [`CloudFixture`]'s hub, an HTTP client, and a cloud endpoint (a rest target)
//! that records what it receives.

use crate::cloud::CloudFixture;
use bytes::Bytes;
use cloudcore::controller::Kind;
use cloudcore::router::HttpClient;
use cloudcore::router::{Router, RouterMetrics, RouterSettings};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub const CRDS_YAML: &str = include_str!("../../manifests/crds/router-crds.yaml");

/// How long these helpers wait for something that should happen.
pub const WAIT: Duration = Duration::from_secs(30);

/// Creates both CRDs (existing ones are kept) and waits until they are served.
pub async fn install(client: &kube::Client) -> anyhow::Result<()> {
    crate::crds::install(
        client,
        CRDS_YAML,
        &[Kind::Rule.api_resource(), Kind::RuleEndpoint.api_resource()],
    )
    .await
}

/// A router on loopback with test timers: a 10 s `restTimeout`, status written every 200 ms.
pub fn test_settings() -> RouterSettings {
    RouterSettings {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        rest_timeout: Duration::from_secs(10),
        status_interval: Duration::from_millis(200),
        ..RouterSettings::default()
    }
}

/// Starts a router on `fx`'s cloudhub.
pub async fn start(fx: &CloudFixture, client: kube::Client, settings: RouterSettings) -> Router {
    Router::start(
        settings,
        client,
        fx.hub.clone(),
        RouterMetrics::default(),
        CancellationToken::new(),
    )
    .await
    .expect("router starts")
}

fn map(pairs: &[(&str, &str)]) -> Value {
    Value::Object(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect(),
    )
}

/// Creates RuleEndpoint `name` of type `ty` (`rest`, `eventbus`, `servicebus`).
pub async fn create_endpoint(
    client: &kube::Client,
    ns: &str,
    name: &str,
    ty: &str,
    properties: &[(&str, &str)],
) {
    let obj = json!({
        "apiVersion": "rules.kubeedge.io/v1", "kind": "RuleEndpoint",
        "metadata": {"name": name},
        "spec": {"ruleEndpointType": ty, "properties": map(properties)}
    });
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &Kind::RuleEndpoint.api_resource());
    api.create(
        &PostParams::default(),
        &serde_json::from_value(obj).expect("a RuleEndpoint"),
    )
    .await
    .expect("RuleEndpoint created");
}

/// Creates Rule `name` from `source` (with its resource) to `target`.
pub async fn create_rule(
    client: &kube::Client,
    ns: &str,
    name: &str,
    source: (&str, &[(&str, &str)]),
    target: (&str, &[(&str, &str)]),
) {
    let obj = json!({
        "apiVersion": "rules.kubeedge.io/v1", "kind": "Rule",
        "metadata": {"name": name},
        "spec": {"source": source.0, "sourceResource": map(source.1),
                 "target": target.0, "targetResource": map(target.1)}
    });
    rules(client, ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(obj).expect("a Rule"),
        )
        .await
        .expect("Rule created");
}

pub fn rules(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &Kind::Rule.api_resource())
}

pub async fn delete_rule(client: &kube::Client, ns: &str, name: &str) {
    rules(client, ns)
        .delete(name, &DeleteParams::default())
        .await
        .expect("Rule deleted");
}

/// A rule's `status` (null while it has none).
pub async fn rule_status(client: &kube::Client, ns: &str, name: &str) -> Value {
    rules(client, ns)
        .get(name)
        .await
        .ok()
        .and_then(|r| r.data.get("status").cloned())
        .unwrap_or(Value::Null)
}

/// Waits until the rule's status satisfies `ok`; returns it.
pub async fn rule_status_until(
    client: &kube::Client,
    ns: &str,
    name: &str,
    what: &str,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let s = rule_status(client, ns, name).await;
        if ok(&s) {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "rule {ns}/{name}: {what} not within {WAIT:?}; status {s}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An HTTP answer, the body as text.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
}

/// One request (at most 30 s); `Err` for a transport failure.
pub async fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Result<Answer, String> {
    let mut req = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(body.into()))
        .map_err(|e| e.to_string())?;
    let r = HttpClient::new()
        .call(req, Duration::from_secs(30), 64 << 20)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Answer {
        status: r.status.as_u16(),
        headers: r.headers,
        body: String::from_utf8_lossy(&r.body).into_owned(),
    })
}

/// Repeats a request until its answer is not the router's `404` (the rule is in force) and
/// satisfies `ok`; returns that answer.
pub async fn request_until(
    method: &str,
    url: &str,
    body: &'static [u8],
    what: &str,
    ok: impl Fn(&Answer) -> bool,
) -> Answer {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let last = match request(method, url, &[], body).await {
            Ok(a) if ok(&a) => return a,
            Ok(a) => format!("{} {}", a.status, a.body),
            Err(e) => e,
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {method} {url} not answered as expected within {WAIT:?}; last: {last}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a [`CloudEndpoint`] received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// The `NodeName` header KubeEdge's rest target sends.
    pub node: String,
    pub content_type: String,
    pub body: Bytes,
}

/// An HTTP server in the test process standing for a cloud application (a rest target): it
/// records every request and answers `answer`.
pub struct CloudEndpoint {
    pub addr: SocketAddr,
    pub received: mpsc::UnboundedReceiver<Received>,
    stop: CancellationToken,
}

impl CloudEndpoint {
    pub async fn start(answer: &'static str) -> CloudEndpoint {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("endpoint listens");
        let addr = listener.local_addr().expect("endpoint address");
        let (tx, received) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let token = stop.clone();
        tokio::spawn(async move {
            loop {
                let tcp = tokio::select! {
                    _ = token.cancelled() => return,
                    r = listener.accept() => match r { Ok((t, _)) => t, Err(_) => continue },
                };
                let tx = tx.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let tx = tx.clone();
                            async move {
                                let (parts, body) = req.into_parts();
                                let body = Limited::new(body, 64 << 20)
                                    .collect()
                                    .await
                                    .map(|b| b.to_bytes())
                                    .unwrap_or_default();
                                let header = |n: &str| {
                                    parts
                                        .headers
                                        .get(n)
                                        .and_then(|v| v.to_str().ok())
                                        .unwrap_or_default()
                                        .to_string()
                                };
                                let _ = tx.send(Received {
                                    method: parts.method.to_string(),
                                    path: parts.uri.path().to_string(),
                                    node: header("NodeName"),
                                    content_type: header("content-type"),
                                    body,
                                });
                                Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                                    Bytes::from_static(answer.as_bytes()),
                                )))
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        CloudEndpoint {
            addr,
            received,
            stop,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The next request it received, within [`WAIT`].
    pub async fn next(&mut self, what: &str) -> Received {
        tokio::time::timeout(WAIT, self.received.recv())
            .await
            .unwrap_or_else(|_| {
                panic!("{what}: nothing reached the cloud endpoint within {WAIT:?}")
            })
            .expect("endpoint running")
    }
}

impl Drop for CloudEndpoint {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A free TCP port on loopback (for a host-network server or the servicebus).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
