//! The upstream handler's contract with the API server: for each edge request, the HTTP
//! requests it makes (method, path, patch type, body) and the reply the edge gets, against a
//! recording API server behind a real `kube::Client`.

use super::*;
use crate::cloudhub::SendError;
use crate::cloudhub::queue::Enqueued;
use http_body_util::BodyExt;
use std::sync::Mutex;

const NODE: &str = "edge-a";

/// One request the handler made.
#[derive(Debug, Clone)]
struct Call {
    method: String,
    /// Path and query.
    uri: String,
    content_type: String,
    body: Value,
}

impl Call {
    fn line(&self) -> String {
        format!("{} {}", self.method, self.uri)
    }
}

type Calls = Arc<Mutex<Vec<Call>>>;

/// What the recording API server answers: the pod asked for is bound to [`NODE`], a token
/// request gets a token, writes echo their body with a resourceVersion, deletes succeed.
fn answer(method: &str, path: &str, body: &Value) -> (u16, Value) {
    match method {
        "GET" if path.contains("/pods/") => (
            200,
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "web-0", "namespace": "ns", "uid": "u-1",
                                "resourceVersion": "7"},
                   "spec": {"nodeName": NODE, "serviceAccountName": "default"}}),
        ),
        "GET" if path.contains("/configmaps/") => (
            200,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "cfg", "namespace": "ns", "resourceVersion": "5"},
                   "data": {"k": "v"}}),
        ),
        "GET" => (
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "reason": "NotFound", "code": 404, "message": "not found"}),
        ),
        "POST" if path.ends_with("/token") => (
            201,
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "status": {"token": "t0ken", "expirationTimestamp": "2030-01-01T00:00:00Z"}}),
        ),
        "DELETE" => (200, json!({"kind": "Status", "status": "Success"})),
        _ => {
            let mut echoed = body.clone();
            if echoed.is_object() {
                echoed["metadata"]["resourceVersion"] = json!("8");
            }
            (if method == "POST" { 201 } else { 200 }, echoed)
        }
    }
}

fn recording_client() -> (kube::Client, Calls) {
    let calls: Calls = Arc::default();
    let seen = calls.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let seen = seen.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect().await?.to_bytes();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let uri = parts
                .uri
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default();
            let content_type = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let (code, reply) = answer(parts.method.as_str(), parts.uri.path(), &body);
            seen.lock().unwrap().push(Call {
                method: parts.method.to_string(),
                uri,
                content_type,
                body,
            });
            let resp = http::Response::builder()
                .status(code)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(kube::client::Body::from(reply.to_string().into_bytes()))
                .expect("a valid response");
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(resp)
        }
    });
    (kube::Client::new(service, "default"), calls)
}

/// The replies (and other messages) sent to edges.
#[derive(Default)]
struct Sent(Mutex<Vec<(String, Message)>>);

impl HubSink for Sent {
    fn send(&self, node: &str, msg: Message) -> Result<Enqueued, SendError> {
        self.0.lock().unwrap().push((node.to_string(), msg));
        Ok(Enqueued::Queued)
    }
    fn is_connected(&self, _: &str) -> bool {
        true
    }
    fn connected_nodes(&self) -> Vec<String> {
        vec![NODE.to_string()]
    }
    fn capabilities(&self, _: &str) -> Option<crate::cloudhub::Capabilities> {
        None
    }
    fn disconnect(&self, _: &str) -> bool {
        false
    }
}

struct Fixture {
    handler: UpstreamHandler,
    calls: Calls,
    sent: Arc<Sent>,
}

impl Fixture {
    fn new() -> Self {
        let (client, calls) = recording_client();
        let sent = Arc::new(Sent::default());
        let handler = UpstreamHandler::new(
            client,
            sent.clone(),
            4,
            ControllerMetrics::default(),
            ServiceCache::default(),
            SharedLocation::default(),
        );
        Fixture {
            handler,
            calls,
            sent,
        }
    }

    /// Handles one edge message; returns the requests it made and the reply's content.
    async fn ask(&self, op: Operation, resource: &str, content: Value) -> (Vec<Call>, Value) {
        self.calls.lock().unwrap().clear();
        self.sent.0.lock().unwrap().clear();
        let message = Message::new("edged", Group::Resource, op, resource, content);
        let up = Upstream {
            node: NODE.to_string(),
            path: ResourcePath::parse(resource).expect("a valid resource"),
            message: message.clone(),
        };
        assert_eq!(
            self.handler.handle(&up).await,
            Handled::Replied,
            "{resource}"
        );
        let sent = self.sent.0.lock().unwrap().clone();
        let reply = sent
            .iter()
            .find(|(_, m)| m.header.parent_id == message.header.id)
            .map(|(node, m)| {
                assert_eq!(node, NODE);
                assert_eq!(m.route.operation, Operation::Response);
                assert_eq!(m.route.resource, resource);
                m.content.clone()
            })
            .expect("a reply to the edge");
        (self.calls.lock().unwrap().clone(), reply)
    }
}

fn lines(calls: &[Call]) -> Vec<String> {
    calls.iter().map(Call::line).collect()
}

#[tokio::test]
async fn node_registration_and_status_reach_the_api_server_as_kubeedge_sends_them() {
    let f = Fixture::new();
    let (calls, reply) = f
        .ask(
            Operation::Insert,
            "default/node/edge-a",
            json!({"metadata": {"name": "whatever", "labels": {"a": "1"}}}),
        )
        .await;
    assert_eq!(lines(&calls), ["POST /api/v1/nodes?"]);
    assert_eq!(
        calls[0].body["metadata"]["name"], NODE,
        "named after the resource"
    );
    assert_eq!(
        reply["Object"]["kind"], "Node",
        "KubeEdge's ObjectResp: {reply}"
    );

    let (calls, _) = f
        .ask(
            Operation::Patch,
            "default/nodepatch/edge-a",
            json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
        )
        .await;
    assert_eq!(lines(&calls), ["PATCH /api/v1/nodes/edge-a/status?"]);
    assert_eq!(
        calls[0].content_type,
        "application/strategic-merge-patch+json"
    );
    assert_eq!(calls[0].body["status"]["conditions"][0]["type"], "Ready");

    let (calls, _) = f
        .ask(
            Operation::Update,
            "default/nodestatus/edge-a",
            json!({"Status": {"phase": "Running"}}),
        )
        .await;
    assert_eq!(lines(&calls), ["PATCH /api/v1/nodes/edge-a/status?"]);
    assert_eq!(calls[0].content_type, "application/merge-patch+json");
    assert_eq!(calls[0].body, json!({"status": {"phase": "Running"}}));

    let (calls, _) = f
        .ask(
            Operation::Update,
            "default/node/edge-a",
            json!({"metadata": {"labels": {"zone": "z1"}}}),
        )
        .await;
    assert_eq!(lines(&calls), ["PATCH /api/v1/nodes/edge-a?"]);
    assert_eq!(
        calls[0].content_type,
        "application/strategic-merge-patch+json"
    );
    assert_eq!(calls[0].body["metadata"]["labels"]["zone"], "z1");
}

#[tokio::test]
async fn pod_status_and_delete_are_checked_against_the_pods_node_first() {
    let f = Fixture::new();
    let (calls, _) = f
        .ask(
            Operation::Patch,
            "ns/podpatch/web-0",
            json!({"status": {"phase": "Running"}}),
        )
        .await;
    assert_eq!(
        lines(&calls),
        [
            "GET /api/v1/namespaces/ns/pods/web-0",
            "PATCH /api/v1/namespaces/ns/pods/web-0/status?"
        ],
        "the pod's node is read before its status is written"
    );
    assert_eq!(
        calls[1].content_type,
        "application/strategic-merge-patch+json"
    );

    let (calls, reply) = f.ask(Operation::Delete, "ns/pod/web-0", json!("u-1")).await;
    assert_eq!(
        lines(&calls),
        [
            "GET /api/v1/namespaces/ns/pods/web-0",
            "DELETE /api/v1/namespaces/ns/pods/web-0?"
        ]
    );
    assert_eq!(
        calls[1].body,
        json!({"gracePeriodSeconds": 0, "preconditions": {"uid": "u-1"}}),
        "an old edge's UID content becomes a UID precondition"
    );
    assert_eq!(reply, json!("OK"));
}

#[tokio::test]
async fn reads_leases_and_tokens_use_their_own_resources() {
    let f = Fixture::new();
    let (calls, reply) = f
        .ask(Operation::Query, "ns/configmap/cfg", json!(null))
        .await;
    assert_eq!(lines(&calls), ["GET /api/v1/namespaces/ns/configmaps/cfg"]);
    assert_eq!(reply["data"]["k"], "v");
    assert_eq!(reply["kind"], "ConfigMap");

    let lease = json!({"metadata": {"name": NODE, "namespace": "kube-node-lease"},
                       "spec": {"holderIdentity": NODE}});
    let (calls, reply) = f
        .ask(
            Operation::Update,
            "kube-node-lease/lease/edge-a",
            lease.clone(),
        )
        .await;
    assert_eq!(
        lines(&calls),
        ["PUT /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-a?"]
    );
    assert_eq!(calls[0].body["spec"], lease["spec"]);
    assert_eq!(reply["Object"]["kind"], "Lease", "{reply}");

    let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"boundObjectRef": {"kind": "Pod", "name": "web-0", "uid": "u-1"}}});
    let (calls, reply) = f
        .ask(Operation::Query, "ns/serviceaccounttoken/default", request)
        .await;
    assert_eq!(
        lines(&calls),
        [
            "GET /api/v1/namespaces/ns/pods/web-0",
            "POST /api/v1/namespaces/ns/serviceaccounts/default/token?"
        ],
        "the bound pod is checked to be this node's and to run as that account"
    );
    assert_eq!(calls[1].body["spec"]["boundObjectRef"]["name"], "web-0");
    assert_eq!(reply["status"]["token"], "t0ken");

    // A token bound to no pod is refused without asking the API server.
    let (calls, reply) = f
        .ask(
            Operation::Query,
            "ns/serviceaccounttoken/default",
            json!({"spec": {}}),
        )
        .await;
    assert!(calls.is_empty(), "{:?}", lines(&calls));
    assert_eq!(reply["ErrStatus"]["code"], 403, "{reply}");
}

#[tokio::test]
async fn events_are_created_without_the_edges_version_and_bad_names_never_reach_the_api_server() {
    let f = Fixture::new();
    let event = json!({"metadata": {"name": "web-0.1", "namespace": "ns", "resourceVersion": "3"},
                       "involvedObject": {"kind": "Pod", "name": "web-0", "namespace": "ns"},
                       "reason": "Started"});
    let (calls, reply) = f.ask(Operation::Insert, "ns/event/web-0.1", event).await;
    assert_eq!(lines(&calls), ["POST /api/v1/namespaces/ns/events?"]);
    assert_eq!(calls[0].body["kind"], "Event");
    assert!(
        calls[0].body["metadata"].get("resourceVersion").is_none(),
        "the edge's resourceVersion is not sent: {}",
        calls[0].body
    );
    assert_eq!(reply, json!("OK"));

    // Invalid names never become a request path.
    let (calls, reply) = f
        .ask(Operation::Query, "ns/configmap/..", json!(null))
        .await;
    assert!(calls.is_empty(), "{:?}", lines(&calls));
    assert_eq!(reply["ErrStatus"]["code"], 400, "{reply}");
}
