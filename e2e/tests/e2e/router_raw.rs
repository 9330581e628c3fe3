//! The cloud router against hand-driven edges that speak as KubeEdge's edgecore does (no
//! kubeedge-rs capabilities): the exact messages each rule type puts on the wire and the
//! answers a KubeEdge servicebus and eventbus send back (including the servicebus's error
//! answer without operation or resource); an edge answering or uploading for another node;
//! an offline or vanishing edge (a clear error at once, never a hang); an oversized body; a
//! rule deleted while calls are in flight; and a call reaching the edge through another
//! cloudcore replica.

use cloudcore::router::RouterSettings;
use e2e::channel::Pki;
use e2e::cloud::CloudFixture;
use e2e::cluster::TestCluster;
use e2e::router::{self as r, CloudEndpoint};
use e2e::sim_edge::{SimEdge, delete_node, edge_node, unique};
use kubeedge_shared::{Group, Message, Operation};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message as WsMessage;

struct Cloud {
    cluster: TestCluster,
    pki: Pki,
    fx: CloudFixture,
    router: cloudcore::router::Router,
    ns: String,
    nodes: Vec<String>,
}

impl Cloud {
    async fn start(settings: RouterSettings) -> Cloud {
        e2e::edge::init_logs();
        let cluster = e2e::cluster::connect().await.expect("test cluster");
        r::install(&cluster.client()).await.expect("router CRDs");
        let pki = Pki::new().expect("test PKI");
        let fx = CloudFixture::start(cluster.client(), &pki)
            .await
            .expect("cloudcore starts");
        let router = r::start(&fx, cluster.client(), settings).await;
        let ns = cluster.temp_namespace("router").await.expect("namespace");
        Cloud {
            cluster,
            pki,
            fx,
            router,
            ns,
            nodes: Vec::new(),
        }
    }

    fn client(&self) -> kube::Client {
        self.cluster.client()
    }

    /// A KubeEdge-shaped edge for a new edge node.
    async fn edge(&mut self, prefix: &str) -> (String, SimEdge) {
        let node = unique(prefix);
        edge_node(&self.cluster, &node).await;
        self.nodes.push(node.clone());
        let edge = SimEdge::connect(&self.fx, &self.pki, &node, &[]).await;
        (node, edge)
    }

    fn url(&self, node: &str, path: &str) -> String {
        format!(
            "http://{}/{node}/{}{path}",
            self.router.local_addr(),
            self.ns
        )
    }

    /// Endpoints `rest`, `bus` and `sb` (servicebus, port 8080).
    async fn endpoints(&self) {
        let (c, ns) = (self.client(), &self.ns);
        r::create_endpoint(&c, ns, "rest", "rest", &[]).await;
        r::create_endpoint(&c, ns, "bus", "eventbus", &[]).await;
        r::create_endpoint(&c, ns, "sb", "servicebus", &[("service_port", "8080")]).await;
    }

    async fn finish(self) {
        self.router.shutdown();
        self.fx.shutdown().await;
        for n in &self.nodes {
            delete_node(&self.cluster, n).await;
        }
        self.cluster.delete_namespace(&self.ns).await;
    }
}

/// The next message of group `user` (others, e.g. the node's own objects, are skipped).
async fn next_user(edge: &mut SimEdge, what: &str) -> Message {
    let deadline = tokio::time::Instant::now() + r::WAIT;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let m = edge
            .next(left)
            .await
            .unwrap_or_else(|| panic!("{what}: nothing for the edge within {:?}", r::WAIT));
        if m.route.group == Group::User {
            return m;
        }
    }
}

/// A frame as KubeEdge's edgecore writes it (Go field order, omitted empty fields).
async fn send_kubeedge_frame(edge: &mut SimEdge, frame: Value) {
    edge.raw
        .send_frame(WsMessage::Text(format!("{frame}\n").into()))
        .await
        .expect("frame sent");
}

/// KubeEdge's servicebus answer to `call`: `upload`, no resource, an `HTTPResponse`.
fn kubeedge_answer(call: &Message, status: u16, header: Value, body: &[u8]) -> Value {
    use base64::Engine;
    json!({
        "header": {"msg_id": uuid::Uuid::new_v4().to_string(), "parent_msg_id": call.id(),
                   "timestamp": kubeedge_shared::message::now_millis()},
        "route": {"source": "servicebus", "group": "user", "operation": "upload"},
        "content": {"header": header, "status_code": status,
                    "body": base64::engine::general_purpose::STANDARD.encode(body)}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn router_speaks_kubeedges_messages_with_a_kubeedge_shaped_edge() {
    let mut cloud = Cloud::start(r::test_settings()).await;
    let (node, mut edge) = cloud.edge("router-ke").await;
    let (_other_node, mut other) = cloud.edge("router-ke-other").await;
    let mut endpoint = CloudEndpoint::start("stored").await;
    let (c, ns) = (cloud.client(), cloud.ns.clone());
    cloud.endpoints().await;
    r::create_rule(
        &c,
        &ns,
        "app",
        ("rest", &[("path", "/app")]),
        ("sb", &[("path", "/v1")]),
    )
    .await;
    r::create_rule(
        &c,
        &ns,
        "pub",
        ("rest", &[("path", "/pub")]),
        ("bus", &[("topic", "out")]),
    )
    .await;
    r::create_rule(
        &c,
        &ns,
        "up",
        ("bus", &[("topic", "in"), ("node_name", &node)]),
        ("rest", &[("resource", &endpoint.url("/in"))]),
    )
    .await;

    // eventbus source: the edge is told to subscribe to <namespace>/<topic>.
    let sub = next_user(&mut edge, "subscribe").await;
    assert_eq!(
        (
            sub.route.source.as_str(),
            &sub.route.operation,
            sub.route.resource.as_str()
        ),
        (
            "router_eventbus",
            &Operation::Subscribe,
            format!("{ns}/in").as_str()
        )
    );
    assert_eq!(sub.content, Value::Null);

    // rest → servicebus: KubeEdge's call, answered as KubeEdge's servicebus answers.
    let url = cloud.url(&node, "/app/items/7?full=1");
    let call = tokio::spawn(async move {
        r::request_until("PUT", &url, b"payload", "call answered", |a| {
            a.status != 404
        })
        .await
    });
    let m = next_user(&mut edge, "the call").await;
    assert_eq!(
        (
            m.route.source.as_str(),
            &m.route.operation,
            m.route.resource.as_str()
        ),
        (
            "router_servicebus",
            &Operation::from("PUT"),
            "8080:/v1/items/7?full=1"
        )
    );
    let req: kubeedge_shared::servicebus::HttpRequest =
        serde_json::from_value(m.content.clone()).expect("an HTTPRequest");
    assert_eq!(
        (req.method.as_str(), req.body.as_slice()),
        ("PUT", &b"payload"[..])
    );
    // Another edge answering this call is ignored.
    send_kubeedge_frame(&mut other, kubeedge_answer(&m, 500, json!({}), b"forged")).await;
    send_kubeedge_frame(
        &mut edge,
        kubeedge_answer(
            &m,
            202,
            json!({"Content-Type": ["text/plain"], "X-App": ["1"]}),
            b"accepted",
        ),
    )
    .await;
    let a = call.await.unwrap();
    assert_eq!((a.status, a.body.as_str()), (202, "accepted"));
    assert_eq!(a.headers["content-type"], "text/plain");
    assert_eq!(a.headers["x-app"], "1");

    // KubeEdge's error answer (no operation, no resource): relayed as it is.
    let url = cloud.url(&node, "/app");
    let call = tokio::spawn(async move { r::request("GET", &url, &[], "").await });
    let m = next_user(&mut edge, "the second call").await;
    let mut err = kubeedge_answer(
        &m,
        404,
        json!({"Server": ["kubeedge-edgecore"]}),
        b"error to call service",
    );
    err["route"] = json!({"source": "servicebus", "group": "user"});
    send_kubeedge_frame(&mut edge, err).await;
    let a = call.await.unwrap().expect("an answer");
    assert_eq!((a.status, a.body.as_str()), (404, "error to call service"));
    assert_eq!(a.headers["server"], "kubeedge-edgecore");

    // rest → eventbus: KubeEdge's publish.
    let a = r::request("POST", &cloud.url(&node, "/pub/a"), &[], "m-1")
        .await
        .unwrap();
    assert_eq!((a.status, a.body.as_str()), (200, "message delivered"));
    let p = next_user(&mut edge, "the publish").await;
    assert_eq!(
        (
            p.route.source.as_str(),
            &p.route.operation,
            p.route.resource.as_str()
        ),
        ("router_eventbus", &Operation::Publish, "out/a")
    );
    assert_eq!(p.content, json!("m-1"));

    // eventbus → rest: KubeEdge's upload; another node's upload on this node's topic goes
    // nowhere.
    let upload = |payload: &str| {
        json!({"header": {"msg_id": uuid::Uuid::new_v4().to_string(),
                          "timestamp": kubeedge_shared::message::now_millis()},
               "route": {"source": "bus", "group": "user", "operation": "upload",
                         "resource": format!("{ns}/in")},
               "content": payload})
    };
    send_kubeedge_frame(&mut other, upload("forged")).await;
    send_kubeedge_frame(&mut edge, upload("21.5")).await;
    let got = endpoint.next("the upload").await;
    assert_eq!(
        (&got.body[..], got.node.as_str()),
        (&b"21.5"[..], node.as_str())
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(500), endpoint.received.recv())
            .await
            .is_err(),
        "another node's upload reached the endpoint"
    );
    r::rule_status_until(&c, &ns, "up", "upload counted", |s| {
        s["successMessages"] == 1
    })
    .await;
    r::rule_status_until(&c, &ns, "app", "calls counted", |s| {
        s["successMessages"] == 1 && s["failMessages"] == 1
    })
    .await;
    cloud.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn router_answers_at_once_for_an_edge_that_is_offline_or_goes_away() {
    let mut cloud = Cloud::start(RouterSettings {
        rest_timeout: Duration::from_secs(30),
        ..r::test_settings()
    })
    .await;
    let (c, ns) = (cloud.client(), cloud.ns.clone());
    cloud.endpoints().await;
    r::create_rule(
        &c,
        &ns,
        "app",
        ("rest", &[("path", "/app")]),
        ("sb", &[("path", "/")]),
    )
    .await;
    let (node, mut edge) = cloud.edge("router-gone").await;

    // Never connected: a clear 500 at once.
    let a = r::request_until(
        "GET",
        &cloud.url("no-such-node", "/app"),
        b"",
        "rule in force",
        |a| a.status != 404,
    )
    .await;
    assert_eq!(
        (a.status, a.body.as_str()),
        (500, "cloudcore doesn't have session for node:no-such-node")
    );
    // Connected, then gone before answering: the call fails when the session ends, not at
    // restTimeout.
    let url = cloud.url(&node, "/app");
    let started = Instant::now();
    let call = tokio::spawn(async move { r::request("GET", &url, &[], "").await });
    next_user(&mut edge, "the call").await;
    drop(edge);
    let a = tokio::time::timeout(Duration::from_secs(15), call)
        .await
        .expect("answered without waiting for restTimeout")
        .unwrap()
        .expect("an answer");
    assert_eq!(
        (a.status, a.body.as_str()),
        (
            500,
            format!("node {node} disconnected before answering").as_str()
        )
    );
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(cloud.router.calls_waiting(), 0);
    let s = r::rule_status_until(&c, &ns, "app", "failures counted", |s| {
        s["failMessages"] == 2
    })
    .await;
    assert!(
        s["errors"][0]
            .as_str()
            .unwrap_or_default()
            .contains("disconnected"),
        "{s}"
    );
    cloud.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn router_refuses_bodies_over_the_limit_and_answers_408_when_the_edge_is_silent() {
    let mut cloud = Cloud::start(RouterSettings {
        max_body_bytes: 64 * 1024,
        rest_timeout: Duration::from_secs(2),
        ..r::test_settings()
    })
    .await;
    let (c, ns) = (cloud.client(), cloud.ns.clone());
    cloud.endpoints().await;
    r::create_rule(
        &c,
        &ns,
        "app",
        ("rest", &[("path", "/app")]),
        ("sb", &[("path", "/")]),
    )
    .await;
    let (node, mut edge) = cloud.edge("router-big").await;
    let url = cloud.url(&node, "/app");
    r::request_until("POST", &url, &[0u8; 10], "rule in force", |a| {
        a.status != 404
    })
    .await;
    next_user(&mut edge, "the probe call").await;
    let a = r::request("POST", &url, &[], vec![b'x'; 64 * 1024 + 1])
        .await
        .unwrap();
    assert_eq!(
        (a.status, a.body.as_str()),
        (400, "http: request body too large")
    );
    let started = Instant::now();
    let a = r::request("POST", &url, &[], vec![b'x'; 64 * 1024])
        .await
        .unwrap();
    assert_eq!(
        (a.status, a.body.as_str()),
        (408, "wait to get response time out")
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(cloud.router.calls_waiting(), 0);
    cloud.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn router_rule_deleted_while_calls_are_in_flight() {
    let mut cloud = Cloud::start(r::test_settings()).await;
    let (c, ns) = (cloud.client(), cloud.ns.clone());
    cloud.endpoints().await;
    let (node, mut edge) = cloud.edge("router-del").await;
    let endpoint = CloudEndpoint::start("ok").await;
    r::create_rule(
        &c,
        &ns,
        "app",
        ("rest", &[("path", "/app")]),
        ("sb", &[("path", "/")]),
    )
    .await;
    r::create_rule(
        &c,
        &ns,
        "up",
        ("bus", &[("topic", "t"), ("node_name", &node)]),
        ("rest", &[("resource", &endpoint.url("/"))]),
    )
    .await;
    r::create_rule(
        &c,
        &ns,
        "report",
        (
            "sb",
            &[
                ("target_url", "http://cloud.example/api"),
                ("node_name", &node),
            ],
        ),
        ("rest", &[("resource", &endpoint.url("/"))]),
    )
    .await;
    let mut registered = Vec::new();
    while registered.len() < 2 {
        let m = next_user(&mut edge, "registrations").await;
        registered.push((m.route.operation, m.route.resource));
    }
    registered.sort_by_key(|(op, _)| op.to_string());
    assert_eq!(
        registered,
        vec![
            (Operation::Start, "http://cloud.example/api".to_string()),
            (Operation::Subscribe, format!("{ns}/t")),
        ]
    );

    // Both registrations came from a table holding all three rules. Three calls wait at the
    // edge.
    let url = cloud.url(&node, "/app");
    let mut calls = Vec::new();
    let mut at_edge = Vec::new();
    for i in 0..3 {
        let url = url.clone();
        calls.push(tokio::spawn(async move {
            r::request("POST", &url, &[], format!("call-{i}")).await
        }));
    }
    while at_edge.len() < 3 {
        let m = next_user(&mut edge, "the calls").await;
        if m.route.operation == Operation::from("POST") {
            at_edge.push(m);
        }
    }
    // The rules go: new calls find none, the edge is told to drop the subscription and the
    // URL, and the calls in flight still get their answers.
    for name in ["app", "up", "report"] {
        r::delete_rule(&c, &ns, name).await;
    }
    r::request_until("GET", &url, b"", "rule gone", |a| a.status == 404).await;
    let mut dropped = Vec::new();
    while dropped.len() < 2 {
        let m = next_user(&mut edge, "unsubscribe and stop").await;
        if matches!(m.route.operation, Operation::Unsubscribe | Operation::Stop) {
            dropped.push(m.route.operation);
        }
    }
    for m in &at_edge {
        let body = String::from_utf8_lossy(
            &serde_json::from_value::<kubeedge_shared::servicebus::HttpRequest>(m.content.clone())
                .unwrap()
                .body,
        )
        .into_owned();
        send_kubeedge_frame(
            &mut edge,
            kubeedge_answer(m, 200, json!({}), format!("done {body}").as_bytes()),
        )
        .await;
    }
    let mut bodies = Vec::new();
    for call in calls {
        let a = call.await.unwrap().expect("an answer");
        assert_eq!(a.status, 200, "{}", a.body);
        bodies.push(a.body);
    }
    bodies.sort();
    assert_eq!(bodies, ["done call-0", "done call-1", "done call-2"]);
    assert_eq!(cloud.router.calls_waiting(), 0);
    cloud.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn router_call_reaches_the_edge_through_another_replica() {
    // Replica A holds the edge; the call goes to replica B, which forwards it to A.
    let port_b = r::free_port();
    let port_a = r::free_port();
    let settings = |port: u16| RouterSettings {
        listen: ([127, 0, 0, 1], port).into(),
        advertise: Some(([127, 0, 0, 1], port).into()),
        ..r::test_settings()
    };
    let mut a = Cloud::start(settings(port_a)).await;
    let b_fx = CloudFixture::start(a.client(), &a.pki)
        .await
        .expect("replica B");
    let b_router = r::start(&b_fx, a.client(), settings(port_b)).await;
    let (c, ns) = (a.client(), a.ns.clone());
    a.endpoints().await;
    r::create_rule(
        &c,
        &ns,
        "app",
        ("rest", &[("path", "/app")]),
        ("sb", &[("path", "/")]),
    )
    .await;
    let (node, mut edge) = a.edge("router-ha").await;
    // A records itself as the node's cloudcore (the Node annotation KubeEdge uses).
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(c.clone());
    e2e::edge::wait_for("the node's cloudcore annotation", r::WAIT, || async {
        let n = nodes.get(&node).await.ok()?;
        (n.metadata.annotations?.get("cloudcore")? == &format!("127.0.0.1:{port_a}")).then_some(())
    })
    .await;
    let url = format!("http://127.0.0.1:{port_b}/{node}/{ns}/app/x");
    let call = tokio::spawn(async move {
        r::request_until("GET", &url, b"", "forwarded call answered", |a| {
            a.status == 200
        })
        .await
    });
    loop {
        let m = next_user(&mut edge, "the forwarded call").await;
        if m.route.operation == Operation::from("GET") {
            assert_eq!(m.route.resource, "8080:/x");
            send_kubeedge_frame(
                &mut edge,
                kubeedge_answer(&m, 200, json!({"X-Via": ["a"]}), b"from the edge"),
            )
            .await;
            break;
        }
    }
    let answer = call.await.unwrap();
    assert_eq!(answer.body, "from the edge");
    assert_eq!(answer.headers["x-via"], "a");
    b_router.shutdown();
    b_fx.shutdown().await;
    a.finish().await;
}
