use super::*;
use crate::edgehub::HubError;
use crate::metamanager::{MetaClient, MetaManager};
use serde_json::json;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// A cloud link whose state and replies the test sets.
#[derive(Clone)]
struct FakeLink {
    connected: Arc<AtomicBool>,
    sent: Arc<Mutex<Vec<Message>>>,
    requests: Arc<Mutex<Vec<Message>>>,
    reply: Arc<Mutex<Option<Value>>>,
    events: broadcast::Sender<LinkEvent>,
}

impl FakeLink {
    fn new(connected: bool) -> Self {
        FakeLink {
            connected: Arc::new(AtomicBool::new(connected)),
            sent: Default::default(),
            requests: Default::default(),
            reply: Default::default(),
            events: broadcast::channel(16).0,
        }
    }

    fn sent(&self) -> Vec<Message> {
        self.sent.lock().unwrap().clone()
    }
}

impl CloudLink for FakeLink {
    fn is_connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }

    async fn send(&self, msg: Message) -> Result<(), HubError> {
        if !self.is_connected() {
            return Err(HubError::NotConnected);
        }
        self.sent.lock().unwrap().push(msg);
        Ok(())
    }

    async fn request(&self, msg: Message, _timeout: Duration) -> Result<Message, HubError> {
        if !self.is_connected() {
            return Err(HubError::NotConnected);
        }
        self.requests.lock().unwrap().push(msg.clone());
        let content = self.reply.lock().unwrap().clone();
        match content {
            Some(c) => {
                let mut r = Message::response_to(&msg, c);
                r.route.source = "edgecontroller".into();
                r.route.group = Group::Resource;
                Ok(r)
            }
            None => Err(HubError::Timeout(Duration::from_millis(1))),
        }
    }

    fn subscribe(&self) -> broadcast::Receiver<LinkEvent> {
        self.events.subscribe()
    }
}

struct Rig {
    _dir: tempfile::TempDir,
    store: MetaStore,
    link: FakeLink,
    cloud: mpsc::Sender<Message>,
    client: MetaClient,
    edged: mpsc::Receiver<ObjectChange>,
    manager: MetaManager,
}

async fn rig(connected: bool) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(dir.path().join("edgecore.db"))
        .await
        .unwrap();
    let link = FakeLink::new(connected);
    let (cloud, from_cloud) = mpsc::channel(16);
    let config = MetaManagerConfig {
        node_name: "edge-1".into(),
        remote_query_timeout: Duration::from_secs(1),
        ..MetaManagerConfig::default()
    };
    let (manager, client, edged) =
        MetaManager::start(config, store.clone(), link.clone(), from_cloud);
    Rig {
        _dir: dir,
        store,
        link,
        cloud,
        client,
        edged,
        manager,
    }
}

fn pod_msg(op: Operation, name: &str, uid: &str, rv: &str) -> Message {
    Message::new(
        source::EDGE_CONTROLLER,
        Group::Resource,
        op,
        format!("default/pod/{name}"),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default", "uid": uid, "resourceVersion": rv},
               "spec": {"nodeName": "edge-1"}}),
    )
    .with_resource_version(rv)
}

async fn next_change(rx: &mut mpsc::Receiver<ObjectChange>) -> ObjectChange {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap()
}

async fn wait_for_acks(link: &FakeLink, n: usize) -> Vec<Message> {
    for _ in 0..500 {
        let acks: Vec<_> = link
            .sent()
            .into_iter()
            .filter(|m| m.route.operation == Operation::Response)
            .collect();
        if acks.len() >= n {
            return acks;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("expected {n} ACKs, got {:?}", link.sent());
}

#[tokio::test]
async fn cloud_update_of_unknown_pod_is_stored_forwarded_and_acked() {
    let mut r = rig(true).await;
    let msg = pod_msg(Operation::Update, "web-0", "u1", "5");
    r.cloud.send(msg.clone()).await.unwrap();
    let change = next_change(&mut r.edged).await;
    assert_eq!(change.kind, ResourceType::Pod);
    assert_eq!(change.action, ChangeAction::Upsert);
    assert_eq!(change.key, "default/pod/web-0");
    assert_eq!(change.object["metadata"]["uid"], "u1");
    let acks = wait_for_acks(&r.link, 1).await;
    assert_eq!(acks[0].parent_id(), msg.id());
    assert_eq!(acks[0].content, json!("OK"));
    assert!(r.store.get("default/pod/web-0").await.unwrap().is_some());
    r.manager.shutdown().await;
}

#[tokio::test]
async fn service_account_access_is_stored_updated_deleted_and_acked() {
    let r = rig(true).await;
    let acc = |rv: &str, verbs: Value| {
        json!({"apiVersion": "policy.kubeedge.io/v1alpha1", "kind": "ServiceAccountAccess",
            "metadata": {"name": "sa", "namespace": "ns", "uid": "u1", "resourceVersion": rv},
            "spec": {"accessClusterRoleBinding": [{"rules": [{"verbs": verbs}]}]}})
    };
    let msg = |op: Operation, rv: &str, content: Value| {
        Message::new(
            source::POLICY_CONTROLLER,
            Group::Resource,
            op,
            "ns/serviceaccountaccess/sa",
            content,
        )
        .with_resource_version(rv)
    };
    // An object of that type from anyone else (an application's watch) is not stored.
    let mut foreign = msg(Operation::Insert, "9", acc("9", json!(["*"])));
    foreign.route.source = source::DYNAMIC_CONTROLLER.into();
    r.cloud.send(foreign).await.unwrap();
    wait_for_acks(&r.link, 1).await;
    assert!(
        r.store
            .service_account_accesses("ns", "sa")
            .await
            .unwrap()
            .is_empty()
    );
    let stored = || async {
        r.store
            .service_account_accesses("ns", "sa")
            .await
            .unwrap()
            .first()
            .cloned()
    };
    let insert = msg(Operation::Insert, "10", acc("10", json!(["get"])));
    r.cloud.send(insert.clone()).await.unwrap();
    assert_eq!(wait_for_acks(&r.link, 2).await[1].parent_id(), insert.id());
    assert_eq!(stored().await, Some(acc("10", json!(["get"]))));
    let row = r.store.list_type("serviceaccountaccess").await.unwrap();
    assert_eq!(row.len(), 1);
    assert_eq!(row[0].key, "ns/serviceaccountaccess/sa");

    r.cloud
        .send(msg(Operation::Update, "12", acc("12", json!(["list"]))))
        .await
        .unwrap();
    wait_for_acks(&r.link, 3).await;
    // An older version arriving late (a resend) does not win.
    r.cloud
        .send(msg(Operation::Update, "11", acc("11", json!(["*"]))))
        .await
        .unwrap();
    wait_for_acks(&r.link, 4).await;
    assert_eq!(stored().await, Some(acc("12", json!(["list"]))));

    let gone = json!({"metadata": {"name": "sa", "namespace": "ns", "uid": "u1", "resourceVersion": "13"}});
    r.cloud
        .send(msg(Operation::Delete, "13", gone))
        .await
        .unwrap();
    wait_for_acks(&r.link, 5).await;
    assert_eq!(stored().await, None);
    r.manager.shutdown().await;
}

#[tokio::test]
async fn malformed_cloud_messages_are_rejected_not_acked() {
    let r = rig(true).await;
    let mut bad = pod_msg(Operation::Insert, "x", "u", "1");
    bad.content = json!("not json at all");
    r.cloud.send(bad.clone()).await.unwrap();
    let mut short = pod_msg(Operation::Insert, "y", "u", "1");
    short.route.resource = "default/pod".into();
    r.cloud.send(short).await.unwrap();
    let good = pod_msg(Operation::Insert, "z", "u", "1");
    r.cloud.send(good.clone()).await.unwrap();
    let acks = wait_for_acks(&r.link, 1).await;
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].parent_id(), good.id());
    let errors: Vec<_> = r
        .link
        .sent()
        .into_iter()
        .filter(|m| m.route.operation == Operation::Error)
        .collect();
    assert_eq!(errors.len(), 2);
    assert_eq!(r.store.count().await.unwrap(), 1);
}

#[tokio::test]
async fn offline_queries_come_from_the_database_and_remote_writes_fail_fast() {
    let mut r = rig(true).await;
    let cm = Message::new(
        source::EDGE_CONTROLLER,
        Group::Resource,
        Operation::Insert,
        "default/configmap/cfg",
        json!({"metadata": {"name": "cfg", "namespace": "default", "uid": "c1", "resourceVersion": "3"}, "data": {"k": "v"}}),
    );
    r.cloud.send(cm).await.unwrap();
    r.cloud
        .send(pod_msg(Operation::Insert, "a", "u1", "1"))
        .await
        .unwrap();
    next_change(&mut r.edged).await;
    next_change(&mut r.edged).await;
    r.link.connected.store(false, Ordering::SeqCst);

    let got = r.client.get_configmap("default", "cfg").await.unwrap();
    assert_eq!(got["data"]["k"], "v");
    assert_eq!(r.client.list_pods().await.unwrap().len(), 1);
    assert!(matches!(
        r.client.get_secret("default", "nope").await,
        Err(MetaError::NotFound { .. })
    ));
    let err = r
        .client
        .register_node(json!({"metadata": {"name": "edge-1"}}))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "failed to process remote: not connected");
    assert!(matches!(
        r.client
            .patch_pod_status("default", "a", &json!({"status": {}}))
            .await,
        Err(MetaError::NotConnected)
    ));
    assert!(r.link.requests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn events_go_to_the_cloud_unstored_and_fail_fast_offline() {
    let r = rig(true).await;
    let event = json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "web.17a", "namespace": "ns"}, "reason": "Started", "count": 1});
    r.client.create_event(&event).await.unwrap();
    r.client
        .patch_event(&event, &json!({"count": 2}))
        .await
        .unwrap();
    let events = |link: &FakeLink| -> Vec<Message> {
        link.sent()
            .into_iter()
            .filter(|m| m.route.resource.contains("/event/"))
            .collect()
    };
    let sent = events(&r.link);
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].route.resource, "ns/event/web.17a");
    assert_eq!(sent[0].route.operation, Operation::Insert);
    assert_eq!(sent[0].content["reason"], "Started");
    assert_eq!(sent[1].route.operation, Operation::Patch);
    assert_eq!(sent[1].content["event"]["metadata"]["name"], "web.17a");
    assert_eq!(sent[1].content["patchData"], r#"{"count":2}"#);
    assert!(
        r.link.requests.lock().unwrap().is_empty(),
        "no reply awaited"
    );
    assert_eq!(r.store.count().await.unwrap(), 0, "events are not stored");

    r.link.connected.store(false, Ordering::SeqCst);
    assert!(matches!(
        r.client.create_event(&event).await,
        Err(MetaError::NotConnected)
    ));
    assert_eq!(events(&r.link).len(), 2);
}

#[tokio::test]
async fn remote_query_stores_the_object_and_acks_the_reply() {
    let r = rig(true).await;
    *r.link.reply.lock().unwrap() = Some(
        json!({"metadata": {"name": "s", "namespace": "ns", "uid": "s1", "resourceVersion": "9"}, "data": {}}),
    );
    let got = r.client.get_secret("ns", "s").await.unwrap();
    assert_eq!(got["metadata"]["uid"], "s1");
    let reqs = r.link.requests.lock().unwrap().clone();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].route.source, "edged");
    assert_eq!(reqs[0].route.group, Group::Meta);
    assert_eq!(reqs[0].route.operation, Operation::Query);
    assert_eq!(reqs[0].route.resource, "ns/secret/s");
    assert!(r.store.get("ns/secret/s").await.unwrap().is_some());
    // The reply carries an object, so the cloud waits for an ACK of it.
    let acks = wait_for_acks(&r.link, 1).await;
    assert_eq!(acks[0].route.resource, "ns/secret/s");

    // A timeout falls back to the stored copy.
    *r.link.reply.lock().unwrap() = None;
    let again = r.client.get_secret("ns", "s").await.unwrap();
    assert_eq!(again["metadata"]["uid"], "s1");
}

#[tokio::test]
async fn status_patch_reply_updates_only_the_same_pod() {
    let mut r = rig(true).await;
    r.cloud
        .send(pod_msg(Operation::Insert, "a", "u1", "1"))
        .await
        .unwrap();
    next_change(&mut r.edged).await;
    *r.link.reply.lock().unwrap() = Some(
        ObjectResp::object(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "namespace": "default", "uid": "u1", "resourceVersion": "2"},
            "spec": {"nodeName": "edge-1"}, "status": {"phase": "Running"}}))
        .to_value(),
    );
    let pod = r
        .client
        .patch_pod_status("default", "a", &json!({"status": {"phase": "Running"}}))
        .await
        .unwrap();
    assert_eq!(pod["status"]["phase"], "Running");
    let stored: Value =
        serde_json::from_str(&r.store.get("default/pod/a").await.unwrap().unwrap()).unwrap();
    assert_eq!(stored["status"]["phase"], "Running");
    let req = r.link.requests.lock().unwrap()[0].clone();
    assert_eq!(req.route.resource, "default/podpatch/a");
    assert!(req.content.is_string(), "patches travel as JSON strings");
    assert!(r.store.get("default/podpatch/a").await.unwrap().is_some());

    // The pod was deleted meanwhile: the patch reply must not bring it back.
    r.cloud
        .send(pod_msg(Operation::Delete, "a", "u1", "3"))
        .await
        .unwrap();
    assert_eq!(next_change(&mut r.edged).await.action, ChangeAction::Delete);
    r.client
        .patch_pod_status("default", "a", &json!({"status": {}}))
        .await
        .unwrap();
    assert_eq!(r.store.get("default/pod/a").await.unwrap(), None);
}

/// A status patch's reply showing the pod being deleted (its `deletionTimestamp` newer than
/// anything the cloud sent) reaches edged; the cloud's older copy that follows is kept out.
#[tokio::test]
async fn a_patch_reply_with_a_deletion_reaches_edged() {
    let mut r = rig(true).await;
    r.cloud
        .send(pod_msg(Operation::Insert, "a", "u1", "1"))
        .await
        .unwrap();
    next_change(&mut r.edged).await;
    *r.link.reply.lock().unwrap() = Some(
        ObjectResp::object(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "namespace": "default", "uid": "u1", "resourceVersion": "9",
                "deletionTimestamp": "2026-11-26T12:00:00Z", "deletionGracePeriodSeconds": 30},
            "spec": {"nodeName": "edge-1"}, "status": {"phase": "Running"}}))
        .to_value(),
    );
    r.client
        .patch_pod_status("default", "a", &json!({"status": {"phase": "Running"}}))
        .await
        .unwrap();
    let change = next_change(&mut r.edged).await;
    assert_eq!(change.action, ChangeAction::Upsert);
    assert_eq!(
        change.object["metadata"]["deletionTimestamp"],
        "2026-11-26T12:00:00Z"
    );
    // A status-only reply tells edged nothing.
    *r.link.reply.lock().unwrap() = Some(
        ObjectResp::object(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "namespace": "default", "uid": "u1", "resourceVersion": "10",
                "deletionTimestamp": "2026-11-26T12:00:00Z", "deletionGracePeriodSeconds": 30},
            "spec": {"nodeName": "edge-1"}, "status": {"phase": "Succeeded"}}))
        .to_value(),
    );
    r.client
        .patch_pod_status("default", "a", &json!({"status": {"phase": "Succeeded"}}))
        .await
        .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), r.edged.recv())
            .await
            .is_err(),
        "status-only replies are edged's own news"
    );
}

#[tokio::test]
async fn node_registration_returns_the_object_or_the_api_error() {
    let r = rig(true).await;
    *r.link.reply.lock().unwrap() =
        Some(ObjectResp::object(json!({"metadata": {"name": "edge-1", "uid": "n1"}})).to_value());
    let node = r
        .client
        .register_node(json!({"metadata": {"name": "edge-1"}}))
        .await
        .unwrap();
    assert_eq!(node["metadata"]["uid"], "n1");
    assert!(r.store.get("default/node/edge-1").await.unwrap().is_some());
    *r.link.reply.lock().unwrap() =
        Some(ObjectResp::error(StatusError::already_exists("nodes", "edge-1")).to_value());
    match r
        .client
        .register_node(json!({"metadata": {"name": "edge-1"}}))
        .await
    {
        Err(MetaError::Api(e)) => assert_eq!(e.reason(), "AlreadyExists"),
        other => panic!("unexpected {other:?}"),
    }
    // No ACK is owed for these replies.
    assert!(
        r.link
            .sent()
            .iter()
            .all(|m| m.route.operation != Operation::Response)
    );
}

/// Frames exactly as a KubeEdge v1.15 cloudhub writes them (gorilla `WriteJSON`: Go key
/// order, `\u003c` escapes, trailing newline). Device-twin, router and upgrade traffic
/// (`cloud/pkg/devicecontroller/controller/downstream.go` membership updates with group
/// `twin`, its `twin` ACKs, router `user` messages, `nodeupgradejobcontroller` jobs) is for
/// modules this edgecore does not run: dropped with a log, never ACKed or answered with an
/// `error`, and the pod behind it is still stored and ACKed the way
/// `cloud/pkg/cloudhub/dispatcher/message_dispatcher.go` (`ReceiveMessageAck` on
/// `parent_msg_id`) expects.
#[tokio::test]
async fn kubeedge_twin_router_and_upgrade_traffic_is_ignored_and_pods_still_acked() {
    let mut r = rig(true).await;
    let frames = [
        r#"{"header":{"msg_id":"0b6c6c1e-6f0a-4bd4-9d7a-6a2f4ad0a001","timestamp":1718000000001},"route":{"source":"devicecontroller","group":"twin","operation":"update","resource":"membership"},"content":{"event_id":"","timestamp":1718000000001,"added_devices":[{"id":"dev-1","name":"dev-1","description":"","state":"","last_online":""}],"removed_devices":null}}
"#,
        r#"{"header":{"msg_id":"0b6c6c1e-6f0a-4bd4-9d7a-6a2f4ad0a002","parent_msg_id":"5f1b2d0e-0000-4000-8000-000000000001","timestamp":1718000000002},"route":{"source":"devicecontroller","group":"twin","operation":"response","resource":"twin"},"content":"OK"}
"#,
        r#"{"header":{"msg_id":"0b6c6c1e-6f0a-4bd4-9d7a-6a2f4ad0a003","timestamp":1718000000003},"route":{"source":"router_eventbus","group":"user","operation":"publish","resource":"default/topic/a"},"content":"aGVsbG8="}
"#,
        r#"{"header":{"msg_id":"0b6c6c1e-6f0a-4bd4-9d7a-6a2f4ad0a004","timestamp":1718000000004},"route":{"source":"nodeupgradejobcontroller","group":"nodeupgradejobcontroller","operation":"upgrade","resource":"nodeupgradejob/job-1/node/edge-1"},"content":{"UpgradeID":"job-1","HistoryID":"h","Version":"v1.15.3","UpgradeTool":"keadm","Image":"kubeedge/installation-package"}}
"#,
        r#"{"header":{"msg_id":"0b6c6c1e-6f0a-4bd4-9d7a-6a2f4ad0a005","timestamp":1718000000005,"resourceversion":"48213"},"route":{"source":"edgecontroller","group":"resource","operation":"insert","resource":"default/pod/nginx"},"content":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"nginx","namespace":"default","uid":"7d1c","resourceVersion":"48213","annotations":{"note":"<b> &"}},"spec":{"nodeName":"edge-1"},"status":{}}}
"#,
    ];
    let codec = kubeedge_shared::FrameCodec::default();
    for f in frames {
        r.cloud
            .send(codec.decode(f.as_bytes()).unwrap())
            .await
            .unwrap();
    }
    let change = next_change(&mut r.edged).await;
    assert_eq!(change.key, "default/pod/nginx");
    assert_eq!(change.object["metadata"]["annotations"]["note"], "<b> &");
    let acks = wait_for_acks(&r.link, 1).await;
    let ack: Value = serde_json::from_str(&codec.encode(&acks[0]).unwrap()).unwrap();
    assert_eq!(
        ack["header"]["parent_msg_id"],
        "0b6c6c1e-6f0a-4bd4-9d7a-6a2f4ad0a005"
    );
    assert_eq!(
        ack["route"],
        json!({"source": "edgecontroller", "group": "resource", "operation": "response", "resource": "default/pod/nginx"})
    );
    assert_eq!(ack["content"], "OK");
    assert!(ack["header"]["timestamp"].is_i64());
    // Cloud messages are handled in arrival order, so the ignored ones, before the pod,
    // are done with; shutdown drains anything still in flight.
    r.manager.shutdown().await;
    let sent: Vec<_> = r
        .link
        .sent()
        .into_iter()
        .filter(|m| !Inventory::is_inventory(m))
        .collect();
    assert_eq!(sent.len(), 1, "only the pod's ACK: {sent:?}");
    assert_eq!(r.store.count().await.unwrap(), 1);
}

#[tokio::test]
async fn inventory_is_sent_when_the_link_comes_up() {
    let r = rig(false).await;
    r.store
        .upsert(MetaRecord::new(
            "default/pod/a",
            "pod",
            json!({"metadata": {"uid": "u1", "resourceVersion": "4"}}).to_string(),
        ))
        .await
        .unwrap();
    r.link.connected.store(true, Ordering::SeqCst);
    r.link.events.send(LinkEvent::Connected).unwrap();
    let mut inv = None;
    for _ in 0..500 {
        inv = r.link.sent().into_iter().find(Inventory::is_inventory);
        if inv.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let inv = inv.expect("inventory sent");
    assert_eq!(inv.route.resource, "default/inventory/edge-1");
    let parsed = Inventory::from_message(&inv).unwrap();
    assert_eq!(parsed.objects.len(), 1);
    assert_eq!(parsed.objects[0].uid, "u1");
    assert_eq!(parsed.objects[0].resource_version, "4");
}

#[test]
fn reply_objects_are_recognised_in_every_shape() {
    let path = ResourcePath::parse("default/podpatch/a").unwrap();
    let pod = json!({"metadata": {"name": "a", "uid": "u"}});
    let plan = store_plan(
        &Operation::Patch,
        &path,
        &ObjectResp::object(pod.clone()).to_value(),
    )
    .unwrap();
    assert_eq!(plan.record.key, "default/pod/a");
    assert!(plan.same_uid_only);
    assert!(store_plan(&Operation::Patch, &path, &json!("OK")).is_none());
    let err = ObjectResp::error(StatusError::not_found("pods", "a")).to_value();
    assert!(store_plan(&Operation::Patch, &path, &err).is_none());
    assert!(
        store_plan(
            &Operation::Query,
            &path,
            &StatusError::not_found("pods", "a").to_value()
        )
        .is_none()
    );
    let node = ResourcePath::parse("default/nodepatch/edge-1").unwrap();
    let plan = store_plan(
        &Operation::Patch,
        &node,
        &ObjectResp::object(pod).to_value(),
    )
    .unwrap();
    assert_eq!(plan.record.key, "default/node/edge-1");
    assert!(!plan.same_uid_only);
    let cm = ResourcePath::parse("default/configmap/c").unwrap();
    let as_string = json!(r#"{"metadata":{"name":"c"}}"#);
    assert_eq!(
        store_plan(&Operation::Query, &cm, &as_string)
            .unwrap()
            .record
            .key,
        "default/configmap/c"
    );
    assert!(store_plan(&Operation::Delete, &cm, &as_string).is_none());
}
