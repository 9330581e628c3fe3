//! The router without a cluster: the rule actor against a fake hub, and the REST listener on a
//! loopback port with a fake edge answering (or not) through the hub.

use super::*;
use crate::cloudhub::queue::Enqueued;
use crate::cloudhub::{Capabilities, SendError};
use bytes::Bytes;
use http_body_util::Full;
use kubeedge_shared::servicebus::{HttpRequest, HttpResponse};
use kubeedge_shared::{Message, Operation};
use rules::{ObjKey, Rule, RuleEndpointSpec, RuleSpec};
use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

#[derive(Default)]
struct FakeHub {
    connected: Mutex<HashSet<String>>,
    sent: Mutex<Vec<(String, Message)>>,
    tx: Mutex<Option<mpsc::UnboundedSender<(String, Message)>>>,
}

impl HubSink for FakeHub {
    fn send(&self, node: &str, msg: Message) -> Result<Enqueued, SendError> {
        if !self.is_connected(node) {
            return Err(SendError::NotConnected(node.into()));
        }
        if let Some(tx) = self.tx.lock().unwrap().as_ref() {
            let _ = tx.send((node.to_string(), msg.clone()));
        }
        self.sent.lock().unwrap().push((node.to_string(), msg));
        Ok(Enqueued::Queued)
    }
    fn is_connected(&self, node: &str) -> bool {
        self.connected.lock().unwrap().contains(node)
    }
    fn connected_nodes(&self) -> Vec<String> {
        self.connected.lock().unwrap().iter().cloned().collect()
    }
    fn capabilities(&self, _: &str) -> Option<Capabilities> {
        None
    }
    fn disconnect(&self, node: &str) -> bool {
        self.connected.lock().unwrap().remove(node)
    }
}

impl FakeHub {
    fn connect(&self, node: &str) {
        self.connected.lock().unwrap().insert(node.into());
    }

    fn take(&self) -> Vec<(String, Operation, String)> {
        self.sent
            .lock()
            .unwrap()
            .drain(..)
            .map(|(n, m)| (n, m.route.operation, m.route.resource))
            .collect()
    }
}

fn endpoint(ty: &str, port: Option<&str>) -> RuleEndpointSpec {
    RuleEndpointSpec {
        rule_endpoint_type: ty.into(),
        properties: port
            .map(|p| BTreeMap::from([("service_port".to_string(), p.to_string())]))
            .unwrap_or_default(),
    }
}

fn key(name: &str) -> ObjKey {
    ("default".into(), name.into())
}

fn rule(name: &str, source: &str, sr: &[(&str, &str)], target: &str, tr: &[(&str, &str)]) -> Rule {
    let m = |l: &[(&str, &str)]| {
        l.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    Rule {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        created: "2026-01-01T00:00:00Z".into(),
        spec: RuleSpec {
            source: source.into(),
            source_resource: m(sr),
            target: target.into(),
            target_resource: m(tr),
        },
    }
}

fn listed(set: &mut RuleSet) {
    for (name, ty, port) in [
        ("rest", "rest", None),
        ("bus", "eventbus", None),
        ("sb", "servicebus", Some("8080")),
    ] {
        set.handle(Input::EndpointApplied(key(name), endpoint(ty, port)));
    }
    set.handle(Input::EndpointsListed);
    set.handle(Input::RulesListed);
}

fn ruleset(hub: Arc<FakeHub>) -> (RuleSet, TableHandle, RouterMetrics) {
    let table = TableHandle::default();
    let metrics = RouterMetrics::default();
    let set = RuleSet::new(table.clone(), hub, StatusTally::default(), metrics.clone());
    (set, table, metrics)
}

#[test]
fn edges_get_their_subscriptions_when_rules_change_and_when_they_connect() {
    let hub = Arc::new(FakeHub::default());
    hub.connect("edge-1");
    let (mut set, table, metrics) = ruleset(hub.clone());
    listed(&mut set);
    let up = rule(
        "up",
        "bus",
        &[("topic", "sensors"), ("node_name", "edge-1")],
        "rest",
        &[("resource", "http://cloud/in")],
    );
    set.handle(Input::RuleApplied(up.clone()));
    assert_eq!(
        hub.take(),
        vec![(
            "edge-1".into(),
            Operation::Subscribe,
            "default/sensors".into()
        )]
    );
    // The same rule again (a status write): nothing to do.
    set.handle(Input::RuleApplied(up.clone()));
    assert!(hub.take().is_empty());
    // Edited: the old subscription goes, the new one comes.
    let mut edited = up.clone();
    edited
        .spec
        .source_resource
        .insert("topic".into(), "sensors/+".into());
    set.handle(Input::RuleApplied(edited));
    assert_eq!(
        hub.take(),
        vec![
            (
                "edge-1".into(),
                Operation::Unsubscribe,
                "default/sensors".into()
            ),
            (
                "edge-1".into(),
                Operation::Subscribe,
                "default/sensors/+".into()
            ),
        ]
    );
    // A servicebus source for a node that is not connected here: sent when it connects.
    set.handle(Input::RuleApplied(rule(
        "app",
        "sb",
        &[("target_url", "http://cloud/api"), ("node_name", "edge-2")],
        "rest",
        &[("resource", "http://cloud/api")],
    )));
    assert!(hub.take().is_empty());
    hub.connect("edge-2");
    set.handle(Input::NodeConnected("edge-2".into()));
    assert_eq!(
        hub.take(),
        vec![("edge-2".into(), Operation::Start, "http://cloud/api".into())]
    );
    assert_eq!(metrics.rules.get(), 2);
    set.handle(Input::RuleDeleted(key("app")));
    assert_eq!(
        hub.take(),
        vec![("edge-2".into(), Operation::Stop, "http://cloud/api".into())]
    );
    assert_eq!(table.current().len(), 1);
}

#[test]
fn nothing_is_built_before_both_kinds_are_listed_and_a_missing_endpoint_is_reported() {
    let hub = Arc::new(FakeHub::default());
    hub.connect("edge-1");
    let (mut set, table, metrics) = ruleset(hub.clone());
    set.handle(Input::RuleApplied(rule(
        "up",
        "bus",
        &[("topic", "t"), ("node_name", "edge-1")],
        "nowhere",
        &[("resource", "http://cloud/in")],
    )));
    set.handle(Input::RulesListed);
    assert!(hub.take().is_empty() && table.current().is_empty());
    set.handle(Input::EndpointApplied(
        key("bus"),
        endpoint("eventbus", None),
    ));
    set.handle(Input::EndpointsListed);
    assert_eq!(metrics.rules_rejected.get(), 1);
    // The endpoint appears later: the rule comes into force.
    set.handle(Input::EndpointApplied(
        key("nowhere"),
        endpoint("rest", None),
    ));
    assert_eq!(metrics.rules.get(), 1);
    assert_eq!(hub.take().len(), 1);
}

#[test]
fn a_rule_out_of_force_is_reported_only_when_that_lasts() {
    use ruleset::PROBLEM_GRACE;
    use std::time::Instant;
    let hub = Arc::new(FakeHub::default());
    let tally = StatusTally::default();
    let mut set = RuleSet::new(
        TableHandle::default(),
        hub,
        tally.clone(),
        RouterMetrics::default(),
    );
    listed(&mut set);
    let waits_for = |name: &str, endpoint: &str| {
        rule(
            name,
            "rest",
            &[("path", &format!("/{name}"))],
            endpoint,
            &[("topic", "t")],
        )
    };
    // Its endpoint arrives just after it (kubectl apply of both): nothing to report.
    set.handle(Input::RuleApplied(waits_for("soon", "late")));
    set.report_problems(Instant::now());
    set.handle(Input::EndpointApplied(
        key("late"),
        endpoint("eventbus", None),
    ));
    set.report_problems(Instant::now() + PROBLEM_GRACE * 2);
    assert!(tally.errors_of(&key("soon")).is_empty());
    // Its endpoint never comes: reported once the grace has passed, and only once.
    set.handle(Input::RuleApplied(waits_for("never", "missing")));
    set.report_problems(Instant::now());
    assert!(tally.errors_of(&key("never")).is_empty());
    set.report_problems(Instant::now() + PROBLEM_GRACE * 2);
    set.report_problems(Instant::now() + PROBLEM_GRACE * 3);
    let errors = tally.errors_of(&key("never"));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("target ruleEndpoint default/missing does not exist"),
        "{errors:?}"
    );
}

#[test]
fn a_relist_drops_what_it_did_not_see() {
    let hub = Arc::new(FakeHub::default());
    let (mut set, table, _) = ruleset(hub);
    listed(&mut set);
    set.handle(Input::RuleApplied(rule(
        "a",
        "rest",
        &[("path", "/a")],
        "bus",
        &[("topic", "t")],
    )));
    assert_eq!(table.current().len(), 1);
    set.handle(Input::RulesRelisting);
    set.handle(Input::RulesListed);
    assert!(table.current().is_empty());
}

/// A router on a loopback port with a fake hub; rules `web` (rest → servicebus) and `pub`
/// (rest → eventbus, only to edge-1).
async fn serving(hub: Arc<FakeHub>, settings: RouterSettings) -> (Arc<Shared>, SocketAddr) {
    let table = TableHandle::default();
    let metrics = RouterMetrics::default();
    let mut set = RuleSet::new(
        table.clone(),
        hub.clone(),
        StatusTally::default(),
        metrics.clone(),
    );
    listed(&mut set);
    set.handle(Input::RuleApplied(rule(
        "web",
        "rest",
        &[("path", "/web")],
        "sb",
        &[("path", "/app")],
    )));
    set.handle(Input::RuleApplied(rule(
        "pub",
        "rest",
        &[("path", "/pub"), ("node_name", "edge-1")],
        "bus",
        &[("topic", "out")],
    )));
    let shared = Arc::new(Shared {
        calls: Calls::new(settings.max_calls, metrics.calls_in_flight.clone()),
        targets: Arc::new(Semaphore::new(4)),
        table,
        hub,
        tally: StatusTally::default(),
        metrics,
        http: target::HttpClient::new(),
        replicas: None,
        bodies: crate::cloudhub::ByteBudget::new(settings.request_bytes),
        settings,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(rest::serve(
        listener,
        shared.clone(),
        CancellationToken::new(),
    ));
    (shared, addr)
}

async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &'static [u8],
) -> (u16, http::HeaderMap, String) {
    let req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("X-Trace", "t-1")
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    let r = target::HttpClient::new()
        .call(req, Duration::from_secs(10), 1 << 20)
        .await
        .unwrap();
    (
        r.status.as_u16(),
        r.headers,
        String::from_utf8_lossy(&r.body).into_owned(),
    )
}

#[tokio::test]
async fn a_rest_call_reaches_the_edge_and_its_answer_comes_back() {
    let hub = Arc::new(FakeHub::default());
    hub.connect("edge-1");
    let (tx, mut rx) = mpsc::unbounded_channel();
    *hub.tx.lock().unwrap() = Some(tx);
    let (shared, addr) = serving(hub.clone(), RouterSettings::default()).await;
    // The fake edge answers every call.
    let edge = shared.clone();
    tokio::spawn(async move {
        while let Some((node, call)) = rx.recv().await {
            let req: HttpRequest = serde_json::from_value(call.content.clone()).unwrap();
            let answer = HttpResponse {
                header: BTreeMap::from([("X-Echo".into(), req.header["X-Trace"].clone())]),
                status_code: 201,
                body: format!(
                    "{} {} {}",
                    call.route.operation,
                    call.route.resource,
                    String::from_utf8_lossy(&req.body)
                )
                .into_bytes(),
            };
            let reply = Message::new(
                "servicebus",
                kubeedge_shared::Group::User,
                Operation::Upload,
                "",
                serde_json::to_value(answer).unwrap(),
            )
            .with_parent(call.id());
            let held = crate::cloudhub::ByteBudget::new(1).try_take(0).unwrap();
            edge.calls.answer(&node, call.id(), reply, held);
        }
    });
    let (status, headers, body) = request(addr, "POST", "/edge-1/default/web/x/y?q=1", b"hi").await;
    assert_eq!(status, 201);
    assert_eq!(headers["x-echo"], "t-1");
    assert_eq!(body, "POST 8080:/app/x/y?q=1 hi");
    let (status, _, body) = request(addr, "GET", "/edge-1/default/web", b"").await;
    assert_eq!((status, body.as_str()), (201, "GET 8080:/app "));
    assert!(shared.calls.is_empty());
}

#[tokio::test]
async fn errors_are_answered_as_kubeedge_answers_them() {
    let hub = Arc::new(FakeHub::default());
    hub.connect("edge-1");
    hub.connect("edge-2");
    let settings = RouterSettings {
        rest_timeout: Duration::from_millis(300),
        max_body_bytes: 16,
        ..RouterSettings::default()
    };
    let (shared, addr) = serving(hub.clone(), settings).await;
    let cases: [(&str, &str, &[u8], u16, &str); 7] = [
        (
            "start",
            "/edge-1/default/web",
            b"",
            405,
            "method \"start\" is not relayed to edge applications",
        ),
        ("GET", "/edge-1/default/none", b"", 404, "Request error"),
        ("GET", "/edge-1/other/web", b"", 404, "Request error"),
        (
            "POST",
            "/edge-1/default/web",
            &[b'x'; 17],
            400,
            "http: request body too large",
        ),
        (
            "POST",
            "/offline/default/web",
            b"",
            500,
            "cloudcore doesn't have session for node:offline",
        ),
        (
            "POST",
            "/edge-2/default/pub",
            b"",
            403,
            "rule default/pub does not route to node edge-2",
        ),
        (
            "GET",
            "/edge-1/default/web",
            b"",
            408,
            "wait to get response time out",
        ),
    ];
    for (method, path, body, want_status, want_body) in cases {
        let (status, _, text) = request(addr, method, path, body).await;
        assert_eq!(
            (status, text.as_str()),
            (want_status, want_body),
            "{method} {path}"
        );
    }
    assert!(shared.calls.is_empty(), "timed-out calls are forgotten");
    let (status, _, text) = request(addr, "POST", "/edge-1/default/pub/a", b"m").await;
    assert_eq!((status, text.as_str()), (200, "message delivered"));
    let sent = hub.take();
    let publish = sent.last().unwrap();
    assert_eq!(
        (publish.1.clone(), publish.2.as_str()),
        (Operation::Publish, "out/a")
    );
}

#[tokio::test]
async fn a_node_that_disconnects_fails_its_calls_at_once() {
    let hub = Arc::new(FakeHub::default());
    hub.connect("edge-1");
    let (shared, addr) = serving(hub.clone(), RouterSettings::default()).await;
    let call = tokio::spawn(request(addr, "GET", "/edge-1/default/web", b""));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while shared.calls.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call never waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    hub.disconnect("edge-1");
    shared.calls.node_gone("edge-1");
    let (status, _, text) = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("answered at once, not at restTimeout")
        .unwrap();
    assert_eq!(
        (status, text.as_str()),
        (500, "node edge-1 disconnected before answering")
    );
}

#[test]
fn the_byte_budget_refuses_beyond_its_limit_and_takes_back_on_drop() {
    let budget = crate::cloudhub::ByteBudget::new(10);
    let a = budget.try_take(6).expect("within the limit");
    assert!(budget.try_take(5).is_none(), "over the limit");
    let b = budget.try_take(4).expect("exactly the limit");
    drop(a);
    assert_eq!(budget.used(), 4);
    drop(b);
    assert_eq!(budget.used(), 0);
}
