//! Our edgehub and metamanager against a hand-written KubeEdge v1.15 cloudhub: a TLS WebSocket
//! server that checks what `cloud/pkg/cloudhub` needs from an edge (URL, `node_id` /
//! `project_id` / `ConnectionUse` headers, one client certificate named `system:node:<node>` as
//! HEAD's `cloudHub.authorization` requires, keepalives of the exact shape) and writes frames
//! the way gorilla's `WriteJSON` does (Go key order, `\u003c` escapes, trailing newline, TEXT
//! frames). Replies are shaped like `cloud/pkg/edgecontroller/controller/upstream.go` builds
//! them; ACKs are checked the way `dispatcher/message_dispatcher.go` consumes them
//! (`operation: response`, matched on `parent_msg_id` only). A whole edgecore's servicebus and
//! eventbus get KubeEdge's router frames (`cloud/pkg/router`) the same way.

use e2e::channel::{Pki, start_edge, test_edge_config};
use edgecore::metamanager::{MetaError, MetaManager, MetaManagerConfig, MetaStore};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use kubeedge_shared::constants::{CAPABILITY_INVENTORY, DEFAULT_PROJECT_ID};
use kubeedge_shared::tls;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};

const NODE: &str = "edge-1";
const WAIT: Duration = Duration::from_secs(10);

type ServerWs = WebSocketStream<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>;

/// What the cloud saw of the handshake.
#[derive(Debug, Default, Clone)]
struct Handshake {
    path: String,
    headers: Vec<(String, String)>,
    peer_cert_count: usize,
    peer_cn: Option<String>,
}

impl Handshake {
    /// Go's `Header.Get`: case-insensitive.
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

struct GoCloud {
    handshake: Handshake,
    sink: SplitSink<ServerWs, WsMessage>,
    /// Every frame from the edge, as JSON.
    frames: mpsc::UnboundedReceiver<Value>,
    /// Non-keepalive frames read while waiting for keepalives.
    held: std::collections::VecDeque<Value>,
}

impl GoCloud {
    /// Writes `json` as gorilla's `WriteJSON` does: one TEXT frame, trailing newline.
    async fn write(&mut self, json: &str) {
        self.sink
            .send(WsMessage::Text(format!("{json}\n").into()))
            .await
            .unwrap();
    }

    /// The next frame that is not a keepalive and satisfies `pred`.
    async fn next_where(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.held.iter().position(&pred) {
            return self.held.remove(i).unwrap();
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let frame = tokio::time::timeout_at(deadline, self.frames.recv())
                .await
                .unwrap_or_else(|_| panic!("no {what} from the edge"))
                .expect("edge connection ended");
            if frame["route"]["operation"] == "keepalive" {
                continue;
            }
            if pred(&frame) {
                return frame;
            }
            self.held.push_back(frame);
        }
    }

    /// Keepalives received from now until `n` have arrived (panics after WAIT).
    async fn keepalives(&mut self, n: usize) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut seen = Vec::new();
        while seen.len() < n {
            let frame = tokio::time::timeout_at(deadline, self.frames.recv())
                .await
                .expect("keepalives stopped: the link broke")
                .expect("edge connection ended");
            if frame["route"]["operation"] == "keepalive" {
                seen.push(frame);
            } else {
                self.held.push_back(frame);
            }
        }
        seen
    }
}

/// Accepts one edge connection the way viaduct's WebSocket server does.
#[allow(clippy::result_large_err)] // tungstenite's handshake callback type
async fn accept(listener: &TcpListener, pki: &Pki) -> GoCloud {
    let (tcp, _) = tokio::time::timeout(WAIT, listener.accept())
        .await
        .expect("edge never dialed")
        .unwrap();
    let tls = tokio_rustls::TlsAcceptor::from(pki.server_tls().unwrap())
        .accept(tcp)
        .await
        .unwrap();
    let certs = tls.get_ref().1.peer_certificates().unwrap_or_default();
    let handshake = Arc::new(Mutex::new(Handshake {
        peer_cert_count: certs.len(),
        peer_cn: certs.first().and_then(tls::common_name),
        ..Handshake::default()
    }));
    let seen = handshake.clone();
    let ws = tokio_tungstenite::accept_hdr_async(tls, move |req: &Request, resp: Response| {
        let mut h = seen.lock().unwrap();
        h.path = req.uri().path().to_string();
        h.headers = req
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_string()))
            .collect();
        Ok(resp)
    })
    .await
    .unwrap();
    let (sink, mut stream) = ws.split();
    let (tx, frames) = mpsc::unbounded_channel();
    // The read loop also answers the edge's WebSocket pings, as gorilla's default handler does.
    tokio::spawn(async move {
        while let Some(Ok(frame)) = stream.next().await {
            let bytes = match frame {
                WsMessage::Text(t) => t.as_bytes().to_vec(),
                WsMessage::Binary(b) => b.to_vec(),
                _ => continue,
            };
            let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
                continue;
            };
            if tx.send(v).is_err() {
                return;
            }
        }
    });
    let handshake = handshake.lock().unwrap().clone();
    GoCloud {
        handshake,
        sink,
        frames,
        held: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edgecore_speaks_kubeedge_cloudhub_wire_protocol() {
    let pki = Pki::new().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(dir.path().join("edgecore.db"))
        .await
        .unwrap();
    let mut hub_cfg = test_edge_config(listener.local_addr().unwrap(), NODE);
    hub_cfg.capabilities = vec![CAPABILITY_INVENTORY.to_string()];
    let (hub, from_cloud) = start_edge(&pki, hub_cfg).unwrap();
    let config = MetaManagerConfig {
        node_name: NODE.into(),
        remote_query_timeout: Duration::from_secs(5),
        ..MetaManagerConfig::default()
    };
    let (manager, client, mut changes) =
        MetaManager::start(config, store.clone(), hub.clone(), from_cloud);

    let mut cloud = accept(&listener, &pki).await;

    // Handshake: what cloudhub reads (server.go, message_handler.go, authorizer.go).
    let h = &cloud.handshake;
    assert_eq!(h.path, format!("/{DEFAULT_PROJECT_ID}/{NODE}/events"));
    assert_eq!(h.header("node_id"), Some(NODE));
    assert_eq!(h.header("project_id"), Some(DEFAULT_PROJECT_ID));
    assert_eq!(h.header("ConnectionUse"), Some("msg"));
    assert_eq!(
        h.peer_cert_count, 1,
        "HEAD refuses intermediate certificates"
    );
    assert_eq!(h.peer_cn.as_deref(), Some("system:node:edge-1"));

    // Keepalive: `operation == "keepalive"` is all cloudhub checks; the rest as edgehub sends it.
    let ka = cloud.keepalives(1).await.remove(0);
    assert_eq!(
        ka["route"],
        json!({"source": "websocket", "group": "resource", "operation": "keepalive", "resource": "node"})
    );
    assert_eq!(ka["content"], "ping");
    assert!(ka["header"]["timestamp"].is_i64());
    assert!(!ka["header"]["msg_id"].as_str().unwrap().is_empty());

    // The inventory extension is an ordinary `update` a KubeEdge cloud routes to edgecontroller
    // (which logs "resource type: inventory unsupported"); no reply is awaited.
    let inv = cloud
        .next_where("inventory", |f| {
            f["route"]["resource"] == "default/inventory/edge-1"
        })
        .await;
    assert_eq!(inv["route"]["operation"], "update");

    // Device-twin membership (group twin) and a router message: not for modules we run.
    cloud
        .write(r#"{"header":{"msg_id":"a1b2c3d4-0000-4000-8000-000000000001","timestamp":1718000000001},"route":{"source":"devicecontroller","group":"twin","operation":"update","resource":"membership"},"content":{"event_id":"","timestamp":1718000000001,"added_devices":[{"id":"dev-1","name":"dev-1"}],"removed_devices":null}}"#)
        .await;
    cloud
        .write(r#"{"header":{"msg_id":"a1b2c3d4-0000-4000-8000-000000000002","timestamp":1718000000002},"route":{"source":"router_eventbus","group":"user","operation":"publish","resource":"default/topic/a"},"content":"aGVsbG8="}"#)
        .await;
    // A pod bound to the node: edgecontroller's `update` with the object's RV in the header.
    cloud
        .write(r#"{"header":{"msg_id":"a1b2c3d4-0000-4000-8000-000000000003","timestamp":1718000000003,"resourceversion":"1234"},"route":{"source":"edgecontroller","group":"resource","operation":"update","resource":"default/pod/web-0"},"content":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-0","namespace":"default","uid":"9f1e","resourceVersion":"1234","annotations":{"a":"\u003cx\u003e"}},"spec":{"nodeName":"edge-1","containers":[{"name":"c","image":"busybox"}]},"status":{}}}"#)
        .await;
    let change = tokio::time::timeout(WAIT, changes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(change.key, "default/pod/web-0");
    let ack = cloud
        .next_where("ACK", |f| f["route"]["operation"] == "response")
        .await;
    assert_eq!(
        ack["header"]["parent_msg_id"],
        "a1b2c3d4-0000-4000-8000-000000000003"
    );
    assert_eq!(
        ack["route"],
        json!({"source": "edgecontroller", "group": "resource", "operation": "response", "resource": "default/pod/web-0"})
    );
    assert_eq!(ack["content"], "OK");

    // ConfigMap query (queryInner): the reply carries the object and its RV, and is ACK-mode.
    let get = {
        let client = client.clone();
        tokio::spawn(async move { client.get_configmap("default", "cfg").await })
    };
    let query = cloud
        .next_where("configmap query", |f| f["route"]["operation"] == "query")
        .await;
    assert_eq!(
        query["route"],
        json!({"source": "edged", "group": "meta", "operation": "query", "resource": "default/configmap/cfg"})
    );
    let reply = format!(
        r#"{{"header":{{"msg_id":"a1b2c3d4-0000-4000-8000-000000000004","parent_msg_id":"{}","timestamp":1718000000004,"resourceversion":"77"}},"route":{{"source":"edgecontroller","group":"resource","operation":"response","resource":"default/configmap/cfg"}},"content":{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"cfg","namespace":"default","uid":"c0f1","resourceVersion":"77"}},"data":{{"k":"v"}}}}}}"#,
        query["header"]["msg_id"].as_str().unwrap()
    );
    cloud.write(&reply).await;
    let cm = get.await.unwrap().unwrap();
    assert_eq!(cm["data"]["k"], "v");
    let ack = cloud
        .next_where("query reply ACK", |f| f["route"]["operation"] == "response")
        .await;
    assert_eq!(
        ack["header"]["parent_msg_id"],
        "a1b2c3d4-0000-4000-8000-000000000004"
    );
    assert_eq!(ack["route"]["resource"], "default/configmap/cfg");

    // Not found: queryInner answers with the StatusError itself (NO-ACK).
    let get = {
        let client = client.clone();
        tokio::spawn(async move { client.get_secret("default", "nope").await })
    };
    let query = cloud
        .next_where("secret query", |f| f["route"]["operation"] == "query")
        .await;
    cloud
        .write(&format!(
            r#"{{"header":{{"msg_id":"a1b2c3d4-0000-4000-8000-000000000005","parent_msg_id":"{}","timestamp":1718000000005}},"route":{{"source":"edgecontroller","group":"resource","operation":"response","resource":"default/secret/nope"}},"content":{{"ErrStatus":{{"metadata":{{}},"status":"Failure","message":"secret \"nope\" not found","reason":"NotFound","details":{{"name":"nope","kind":"secret"}},"code":404}}}}}}"#,
            query["header"]["msg_id"].as_str().unwrap()
        ))
        .await;
    assert!(matches!(
        get.await.unwrap(),
        Err(MetaError::NotFound { .. })
    ));

    // Node status patch (patchNode): the content is the patch as a JSON string, which
    // `GetContentData` hands to `Nodes().Patch(..., StrategicMergePatchType, ..., "status")`.
    let patch = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .patch_node_status(
                    &json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
                )
                .await
        })
    };
    let req = cloud
        .next_where("node patch", |f| f["route"]["operation"] == "patch")
        .await;
    assert_eq!(req["route"]["resource"], "default/nodepatch/edge-1");
    let body: Value = serde_json::from_str(req["content"].as_str().expect("a JSON string"))
        .expect("the string holds the patch");
    assert_eq!(body["status"]["conditions"][0]["type"], "Ready");
    cloud
        .write(&format!(
            r#"{{"header":{{"msg_id":"a1b2c3d4-0000-4000-8000-000000000006","parent_msg_id":"{}","timestamp":1718000000006,"resourceversion":"900"}},"route":{{"source":"edgecontroller","group":"resource","operation":"response","resource":"default/nodepatch/edge-1"}},"content":{{"Object":{{"kind":"Node","apiVersion":"v1","metadata":{{"name":"edge-1","uid":"n1","resourceVersion":"900"}},"status":{{"conditions":[{{"type":"Ready","status":"True"}}]}}}},"Err":null}}}}"#,
            req["header"]["msg_id"].as_str().unwrap()
        ))
        .await;
    let node = patch.await.unwrap().unwrap();
    assert_eq!(node["metadata"]["resourceVersion"], "900");

    // Lease renewal failing below HTTP (client-go *url.Error in ObjectResp.Err).
    let renew = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .update_lease(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": "edge-1", "namespace": "kube-node-lease", "resourceVersion": "5"},
                    "spec": {"holderIdentity": "edge-1", "leaseDurationSeconds": 40}}))
                .await
        })
    };
    let req = cloud
        .next_where("lease update", |f| {
            f["route"]["resource"] == "kube-node-lease/lease/edge-1"
        })
        .await;
    assert_eq!(req["route"]["operation"], "update");
    assert_eq!(req["content"]["metadata"]["resourceVersion"], "5");
    cloud
        .write(&format!(
            r#"{{"header":{{"msg_id":"a1b2c3d4-0000-4000-8000-000000000007","parent_msg_id":"{}","timestamp":1718000000007}},"route":{{"source":"edgecontroller","group":"resource","operation":"response","resource":"kube-node-lease/lease/edge-1"}},"content":{{"Object":{{"metadata":{{"creationTimestamp":null}},"spec":{{}}}},"Err":{{"Op":"Put","URL":"https://10.96.0.1:443/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-1","Err":{{}}}}}}}}"#,
            req["header"]["msg_id"].as_str().unwrap()
        ))
        .await;
    match renew.await.unwrap() {
        Err(MetaError::Api(e)) => assert_eq!(e.code(), 500),
        other => panic!("a failed renewal must be an error, got {other:?}"),
    }

    // Nothing above broke the link: keepalives keep coming on the same connection.
    cloud.keepalives(2).await;
    assert!(hub.is_connected());

    manager.shutdown().await;
    hub.shutdown();
    store.close().await;
}

/// A local HTTP server on the edge node for the router's calls: answers `201` with the request
/// line and body.
async fn edge_app() -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut got = Vec::new();
                // Read the head and a Content-Length body.
                loop {
                    let Ok(n) = s.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if body.len() >= len {
                            break;
                        }
                    }
                }
                let text = String::from_utf8_lossy(&got).to_string();
                let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
                let answer = format!("{} {body}", head.lines().next().unwrap_or_default());
                let resp = format!(
                    "HTTP/1.1 201 Created\r\nX-App: yes\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                    answer.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    port
}

/// Our edgecore's servicebus and eventbus against KubeEdge's router (`cloud/pkg/router`), its
/// frames as KubeEdge's cloudhub writes them after `TrimMessage`: `start` for a servicebus
/// source, a call of a local server (answered as KubeEdge's servicebus answers: `upload`,
/// `parent_msg_id`, `HTTPResponse`), an application's request through the servicebus (answered
/// with the router's `response`), `subscribe` (the edge's uploads on that topic) and `publish`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn edgecore_serves_kubeedges_router_on_its_servicebus_and_eventbus() {
    let Some(broker) = e2e::mosquitto::Mosquitto::start_or_skip(
        "edgecore_serves_kubeedges_router_on_its_servicebus_and_eventbus",
    ) else {
        return;
    };
    let pki = Pki::new().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cert = pki.node_cert(NODE).unwrap();
    std::fs::write(d.join("ca.crt"), &pki.ca.cert.cert_pem).unwrap();
    std::fs::write(d.join("edge.crt"), &cert.cert_pem).unwrap();
    std::fs::write(d.join("edge.key"), &cert.key_pem).unwrap();
    let servicebus_port = e2e::router::free_port();
    let yaml = format!(
        "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\n\
         database:\n  dataSource: {db}\n\
         modules:\n  edgeHub:\n    heartbeat: 1\n    tlsCaFile: {ca}\n    tlsCertFile: {crt}\n    tlsPrivateKeyFile: {key}\n\
         \x20   websocket:\n      server: {server}\n\
         \x20 edged:\n    enable: false\n    hostnameOverride: {NODE}\n\
         \x20 deviceTwin:\n    dmiSockPath: {dir}\n\
         \x20 eventBus:\n    mqttMode: 2\n    mqttServerExternal: {mqtt}\n\
         \x20 serviceBus:\n    enable: true\n    port: {servicebus_port}\n",
        db = d.join("edgecore.db").display(),
        ca = d.join("ca.crt").display(),
        crt = d.join("edge.crt").display(),
        key = d.join("edge.key").display(),
        dir = d.display(),
        server = listener.local_addr().unwrap(),
        mqtt = broker.url(),
    );
    std::fs::write(d.join("edgecore.yaml"), yaml).unwrap();
    let config = edgecore::config::EdgeCoreConfig::load(&d.join("edgecore.yaml")).unwrap();
    let edge = edgecore::app::EdgeCore::start_with(&config, None)
        .await
        .unwrap();
    let mut cloud = accept(&listener, &pki).await;
    let frame = |id: &str, route: Value, content: Value| {
        json!({"header": {"msg_id": id, "timestamp": 1718000000000i64}, "route": route, "content": content})
            .to_string()
    };

    // rest → servicebus: the call and KubeEdge's answer shape.
    let app = edge_app().await;
    cloud
        .write(&frame(
            "call-1",
            json!({"source": "router_servicebus", "group": "user", "operation": "POST",
                   "resource": format!("{app}:/items/7?x=1")}),
            json!({"header": {"X-Trace": ["t"]}, "body": "aGk=", "method": "POST", "url": ""}),
        ))
        .await;
    let answer = cloud
        .next_where("the servicebus's answer", |f| {
            f["header"]["parent_msg_id"] == "call-1"
        })
        .await;
    assert_eq!(
        answer["route"],
        json!({"source": "servicebus", "group": "user", "operation": "upload"}),
        "resource \"\" is omitted as Go's omitempty does"
    );
    let r: kubeedge_shared::servicebus::HttpResponse =
        serde_json::from_value(answer["content"].clone()).unwrap();
    assert_eq!(r.status_code, 201);
    assert_eq!(r.header["X-App"], vec!["yes"]);
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        "POST /items/7?x=1 HTTP/1.1 hi"
    );

    // servicebus → rest: `start`, then an application's request through the servicebus.
    let url = "http://cloud.example/api";
    cloud
        .write(&frame(
            "start-1",
            json!({"source": "router_servicebus", "group": "user", "operation": "start", "resource": url}),
            Value::Null,
        ))
        .await;
    let request = json!({"method": "POST", "targetURL": url, "payload": {"t": 21}}).to_string();
    let app_call = tokio::spawn({
        let request = request.clone();
        async move {
            let deadline = tokio::time::Instant::now() + WAIT;
            loop {
                if let Ok(a) = e2e::router::request(
                    "POST",
                    &format!("http://127.0.0.1:{servicebus_port}/"),
                    &[],
                    request.clone(),
                )
                .await
                {
                    return a.body;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "servicebus never listened"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let upload = cloud
        .next_where("the application's upload", |f| {
            f["route"]["resource"] == url
        })
        .await;
    assert_eq!(
        upload["route"],
        json!({"source": "servicebus", "group": "user", "operation": "upload", "resource": url})
    );
    assert_eq!(
        kubeedge_shared::servicebus::decode_bytes_content(&upload["content"]).unwrap(),
        request.as_bytes()
    );
    let reply = json!({
        "header": {"msg_id": "reply-1", "parent_msg_id": upload["header"]["msg_id"], "timestamp": 1718000000001i64},
        "route": {"source": "servicebus", "group": "user", "operation": "response", "resource": url},
        "content": "pong"});
    cloud.write(&reply.to_string()).await;
    let body: Value = serde_json::from_str(&app_call.await.unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"code": 200, "msg": "receive response from cloud successfully", "body": "pong"})
    );

    // eventbus: `subscribe` (then the edge uploads that topic) and `publish`.
    let mut device = e2e::mqtt::MqttClient::connect(broker.addr(), "ke-router-device").await;
    device.subscribe("out/#").await;
    cloud
        .write(&frame(
            "sub-1",
            json!({"source": "router_eventbus", "group": "user", "operation": "subscribe", "resource": "default/rule-topic"}),
            Value::Null,
        ))
        .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let up = loop {
        device.publish("default/rule-topic", "21.5").await;
        let got = tokio::time::timeout(Duration::from_millis(300), async {
            loop {
                match cloud.frames.recv().await {
                    Some(f) if f["route"]["resource"] == "default/rule-topic" => return f,
                    Some(_) => continue,
                    None => panic!("edge connection ended"),
                }
            }
        })
        .await;
        if let Ok(f) = got {
            break f;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no upload on the subscribed topic"
        );
    };
    assert_eq!(
        up["route"],
        json!({"source": "bus", "group": "user", "operation": "upload", "resource": "default/rule-topic"})
    );
    assert_eq!(up["content"], "21.5");
    cloud
        .write(&frame(
            "pub-1",
            json!({"source": "router_eventbus", "group": "user", "operation": "publish", "resource": "out/a"}),
            json!("smoke"),
        ))
        .await;
    let p = device
        .next_on("out/a", WAIT)
        .await
        .expect("the router's publish at the edge");
    assert_eq!(&p.payload[..], b"smoke");
    edge.shutdown().await;
}
