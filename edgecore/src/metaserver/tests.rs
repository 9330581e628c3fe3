//! The MetaServer over real HTTP on loopback, with a real edge database and a fake cloud link
//! (offline, or answering Applications as the test says).

use super::*;
use crate::edgehub::HubError;
use crate::metamanager::MetaRecord;
use kubeedge_shared::Message;
use kubeedge_shared::application::Application;
use serde_json::{Value, json};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::broadcast;

type Answerer = Box<dyn Fn(&Application) -> Application + Send>;

#[derive(Clone)]
pub(super) struct FakeLink {
    connected: Arc<AtomicBool>,
    /// Answers an Application (None: no answer, the request times out).
    answer: Arc<Mutex<Option<Answerer>>>,
    requests: Arc<Mutex<Vec<Application>>>,
    events: broadcast::Sender<LinkEvent>,
}

impl FakeLink {
    pub(super) fn new(connected: bool) -> Self {
        FakeLink {
            connected: Arc::new(AtomicBool::new(connected)),
            answer: Arc::default(),
            requests: Arc::default(),
            events: broadcast::channel(16).0,
        }
    }
}

impl CloudLink for FakeLink {
    fn is_connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }

    async fn send(&self, _msg: Message) -> Result<(), HubError> {
        Ok(())
    }

    async fn request(&self, msg: Message, _timeout: Duration) -> Result<Message, HubError> {
        let app = Application::from_message(&msg).expect("an Application");
        self.requests.lock().unwrap().push(app.clone());
        let answered = self.answer.lock().unwrap().as_ref().map(|f| f(&app));
        match answered {
            Some(a) => Ok(a.to_response(&msg)),
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
    server: MetaServer,
    link: FakeLink,
}

async fn rig(connected: bool, limits: Limits) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(dir.path().join("edge.db")).await.unwrap();
    let link = FakeLink::new(connected);
    let config = MetaServerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        node: "edge-1".into(),
        remote_timeout: Duration::from_secs(1),
        bookmark_interval: Duration::from_millis(200),
        limits,
        secure: None,
        serve: true,
        standing: Vec::new(),
        held_pods: None,
        confirm_upgrade: None,
    };
    let server = MetaServer::start(config, store.clone(), link.clone())
        .await
        .unwrap();
    Rig {
        _dir: dir,
        store,
        server,
        link,
    }
}

fn pod(name: &str, rv: u64, app: &str) -> MetaRecord {
    MetaRecord::new(
        format!("default/pod/{name}"),
        "pod",
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}"),
                            "resourceVersion": rv.to_string(), "labels": {"app": app}},
               "spec": {"nodeName": "edge-1"}})
        .to_string(),
    )
}

/// One HTTP/1.1 request; the whole response (status line, headers, body) as text.
pub(super) async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n{headers}\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("response within 10 s")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

pub(super) fn body_json(resp: &str) -> Value {
    let body = resp.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {resp}"))
}

/// Watch event lines of a (chunked) response: the JSON objects among its lines.
fn events(resp: &str) -> Vec<Value> {
    resp.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .filter(|v| v.get("type").is_some())
        .collect()
}

#[tokio::test]
async fn lists_and_gets_answer_from_the_database_with_selectors_and_versions() {
    let r = rig(false, Limits::default()).await;
    r.store.upsert(pod("a", 5, "web")).await.unwrap();
    r.store.upsert(pod("b", 7, "db")).await.unwrap();
    let addr = r.server.local_addr();
    let list = body_json(&http(addr, "GET", "/api/v1/namespaces/default/pods", "", "").await);
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    assert_eq!(list["metadata"]["resourceVersion"], "7");
    let web = body_json(&http(addr, "GET", "/api/v1/pods?labelSelector=app%3Dweb", "", "").await);
    assert_eq!(web["items"].as_array().unwrap().len(), 1);
    assert_eq!(web["items"][0]["metadata"]["name"], "a");
    let one = body_json(&http(addr, "GET", "/api/v1/namespaces/default/pods/b", "", "").await);
    assert_eq!(one["metadata"]["resourceVersion"], "7");
    let missing = http(addr, "GET", "/api/v1/namespaces/default/pods/zz", "", "").await;
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    assert_eq!(body_json(&missing)["reason"], "NotFound");
    let table = body_json(
        &http(
            addr,
            "GET",
            "/api/v1/namespaces/default/pods",
            "Accept: application/json;as=Table;v=v1;g=meta.k8s.io,application/json\r\n",
            "",
        )
        .await,
    );
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["rows"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn bad_requests_get_kubernetes_status_errors() {
    let r = rig(false, Limits::default()).await;
    let addr = r.server.local_addr();
    let bad = http(addr, "GET", "/api/v1/pods?labelSelector=a%20in%20b", "", "").await;
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    assert_eq!(body_json(&bad)["kind"], "Status");
    let rv = http(addr, "GET", "/api/v1/pods?resourceVersion=abc", "", "").await;
    assert!(rv.starts_with("HTTP/1.1 400"), "{rv}");
    assert!(
        http(addr, "GET", "/nope", "", "")
            .await
            .starts_with("HTTP/1.1 404")
    );
    assert!(
        http(addr, "POST", "/version", "", "")
            .await
            .starts_with("HTTP/1.1 405")
    );
    let coll = http(addr, "DELETE", "/api/v1/namespaces/default/pods", "", "").await;
    assert!(coll.starts_with("HTTP/1.1 405"), "{coll}");
    let offline = http(
        addr,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "Content-Type: application/json\r\n",
        "{}",
    )
    .await;
    assert!(offline.starts_with("HTTP/1.1 503"), "{offline}");
    assert!(
        body_json(&offline)["message"]
            .as_str()
            .unwrap()
            .contains("disconnected")
    );
    let proto = http(
        addr,
        "GET",
        "/api/v1/pods",
        "Accept: application/vnd.kubernetes.protobuf\r\n",
        "",
    )
    .await;
    assert!(proto.starts_with("HTTP/1.1 406"), "{proto}");
    let unknown = http(addr, "GET", "/apis/example.com/v1/widgets", "", "").await;
    assert!(unknown.starts_with("HTTP/1.1 404"), "{unknown}");
    // Discovery answers for kubectl.
    let core = body_json(&http(addr, "GET", "/api/v1", "", "").await);
    assert_eq!(core["kind"], "APIResourceList");
    assert_eq!(
        body_json(&http(addr, "GET", "/api", "", "").await)["versions"][0],
        "v1"
    );
}

#[tokio::test]
async fn watches_resume_from_a_version_follow_selectors_and_expire() {
    let r = rig(
        false,
        Limits {
            max_events: 3,
            max_bytes: 1 << 20,
        },
    )
    .await;
    let addr = r.server.local_addr();
    r.store.upsert(pod("a", 10, "web")).await.unwrap();
    let listed = body_json(&http(addr, "GET", "/api/v1/pods", "", "").await);
    let rv = listed["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(rv, "10");
    // A watch from the list's version with a selector, while changes happen.
    let watch = tokio::spawn(async move {
        http(addr, "GET", &format!("/api/v1/pods?watch=1&resourceVersion={rv}&labelSelector=app%3Dweb&timeoutSeconds=2&allowWatchBookmarks=true"), "", "").await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    r.store.upsert(pod("a", 11, "db")).await.unwrap(); // leaves the selection
    r.store.upsert(pod("c", 12, "web")).await.unwrap(); // new
    r.store.upsert(pod("c", 12, "web")).await.unwrap(); // unchanged: no event
    r.store.delete("default/pod/c").await.unwrap();
    let evs = events(&watch.await.unwrap());
    let kinds: Vec<(String, String)> = evs
        .iter()
        .filter(|e| e["type"] != "BOOKMARK")
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_string(),
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("DELETED".into(), "a".into()),
            ("ADDED".into(), "c".into()),
            ("DELETED".into(), "c".into())
        ]
    );
    assert!(
        evs.iter().any(|e| e["type"] == "BOOKMARK"),
        "bookmarks were allowed: {evs:?}"
    );
    // Resuming from the middle replays only what came after.
    let resumed = events(
        &http(
            addr,
            "GET",
            "/api/v1/pods?watch=1&resourceVersion=11&timeoutSeconds=1",
            "",
            "",
        )
        .await,
    );
    let names: Vec<&str> = resumed
        .iter()
        .map(|e| e["object"]["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["c", "c"]);
    // The history keeps 3 events: version 10 is no longer covered.
    r.store.upsert(pod("d", 13, "web")).await.unwrap();
    let gone = events(
        &http(
            addr,
            "GET",
            "/api/v1/pods?watch=1&resourceVersion=10&timeoutSeconds=1",
            "",
            "",
        )
        .await,
    );
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert_eq!(gone[0]["type"], "ERROR");
    assert_eq!(gone[0]["object"]["code"], 410);
    // Without a version: the current objects as ADDED, then an end-of-initial-events bookmark.
    let initial = events(&http(addr, "GET", "/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1", "", "").await);
    assert_eq!(initial[0]["type"], "ADDED");
    let end = initial
        .iter()
        .find(|e| e["type"] == "BOOKMARK")
        .expect("a bookmark");
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
}

#[tokio::test]
async fn other_kinds_come_from_the_cloud_and_stay_cached_offline() {
    let r = rig(true, Limits::default()).await;
    let addr = r.server.local_addr();
    *r.link.answer.lock().unwrap() = Some(Box::new(|app: &Application| {
        let mut a = app.clone();
        match app.verb.as_str() {
            "list" => a.approve(&json!({"kind": "ServiceList", "apiVersion": "v1", "metadata": {"resourceVersion": "50"},
                "items": [{"metadata": {"name": "web", "namespace": "default", "resourceVersion": "40"}}]})),
            "create" => a.reject(&kubeedge_shared::StatusError::new(403, "Forbidden", "node restriction")),
            _ => a.approve(&json!({})),
        }
        a
    }));
    let list = body_json(&http(addr, "GET", "/api/v1/namespaces/default/services", "", "").await);
    assert_eq!(list["items"][0]["metadata"]["name"], "web");
    let sent = r.link.requests.lock().unwrap().clone();
    assert_eq!(sent[0].key, "/core/v1/services/default/null");
    assert_eq!(sent[0].verb, "list");
    let refused = http(
        addr,
        "POST",
        "/api/v1/namespaces/default/services",
        "Content-Type: application/json\r\n",
        "{\"metadata\":{\"name\":\"x\"}}",
    )
    .await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    // Offline: the cached copy, with the kind the cloud's list named.
    r.link.connected.store(false, Ordering::SeqCst);
    let cached = body_json(
        &http(
            addr,
            "GET",
            "/api/v1/namespaces/default/services/web",
            "",
            "",
        )
        .await,
    );
    assert_eq!(cached["kind"], "Service");
    assert_eq!(cached["metadata"]["resourceVersion"], "40");
}

/// A list answer applied after changes the cloud sent once it had made the list (they were
/// stored while the answer was on its way) does not undo them: a Service created since stays,
/// one deleted since is not brought back; what the cloud no longer had before goes.
#[tokio::test]
async fn a_list_does_not_undo_changes_stored_while_it_was_on_its_way() {
    let r = rig(true, Limits::default()).await;
    let addr = r.server.local_addr();
    let svc = |name: &str, rv: u64| {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}"),
                            "resourceVersion": rv.to_string()}})
    };
    r.store
        .cache_objects(vec![svc("stale", 30), svc("old", 45), svc("kept", 40)])
        .await
        .unwrap();
    // After the cloud listed at 50: "new" created at 60, "old" deleted at 55.
    r.store.cache_objects(vec![svc("new", 60)]).await.unwrap();
    r.store
        .call(|c| {
            crate::metamanager::changes::with_delete_rv(Some(55), || {
                crate::metamanager::store::delete_object_in(c, "default/service/old", None)
            })
        })
        .await
        .unwrap();
    let listed = json!({"kind": "ServiceList", "apiVersion": "v1", "metadata": {"resourceVersion": "50"},
                        "items": [svc("old", 45), svc("kept", 40)]});
    *r.link.answer.lock().unwrap() = Some(Box::new(move |app: &Application| {
        let mut a = app.clone();
        a.approve(&listed);
        a
    }));
    http(addr, "GET", "/api/v1/namespaces/default/services", "", "").await;
    r.link.connected.store(false, Ordering::SeqCst);
    let cached = body_json(&http(addr, "GET", "/api/v1/namespaces/default/services", "", "").await);
    let mut names: Vec<&str> = cached["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o.pointer("/metadata/name").and_then(Value::as_str))
        .collect();
    names.sort();
    assert_eq!(names, ["kept", "new"], "{cached}");
}
