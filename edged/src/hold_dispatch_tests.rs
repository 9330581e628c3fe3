//! The dispatcher holding pods back: from the database at start and from the cloud after,
//! released by the MetaServer's requests, forgotten when deleted, started when the annotation
//! goes. Pods run on the fake CRI runtime; the cloud side records the status patches.

use super::*;
use crate::cri::fake::FakeCri;
use crate::meta::{MetaCall, MetaError};
use kubeedge_shared::{Operation, ResourceType};
use serde_json::json;

struct Rig {
    dispatcher: Dispatcher,
    /// Status patches sent, in order: (`<ns>/podpatch/<name>`, patch).
    patches: Arc<Mutex<Vec<(String, Value)>>>,
    _fake: FakeCri,
    _root: tempfile::TempDir,
}

fn pod(name: &str, uid: &str, rv: u64, hold: bool) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid,
                     "resourceVersion": rv.to_string()},
        "spec": {"nodeName": "edge-1", "containers": [{"name": "app", "image": "registry.example/app:1"}]},
        "status": {"phase": "Pending"},
    });
    if hold {
        p["metadata"]["annotations"] = json!({hold::ANNOTATION: "true"});
    }
    p
}

/// A dispatcher whose database lists `stored` at start; status patches fail (cloud away).
async fn rig(stored: Vec<Value>) -> Rig {
    let root = tempfile::tempdir().expect("temporary directory");
    let fake = FakeCri::start();
    let runtime = Runtime::new(fake.client().await, Duration::from_secs(10));
    let (requests, mut rx) = mpsc::channel::<MetaCall>(16);
    let patches: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
    let seen = patches.clone();
    tokio::spawn(async move {
        while let Some(req) = rx.recv().await {
            let (op, resource) = (&req.req.operation, req.req.path.to_wire());
            let reply = if *op == Operation::Query && resource == "default/pod" {
                Ok(Value::Array(stored.clone()))
            } else {
                if resource.contains("/podpatch/") {
                    let patch = match req.req.content.clone() {
                        Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::Null),
                        other => other,
                    };
                    seen.lock().unwrap().push((resource, patch));
                }
                Err(MetaError::NotConnected)
            };
            let _ = req.reply.send(reply);
        }
    });
    let meta = MetaClient::new(Arc::new(requests), "edge-1", "default");
    let shared = Arc::new(Shared::for_tests(root.path(), runtime, meta));
    let dispatcher = Dispatcher {
        shared,
        workers: HashMap::new(),
        cancel: CancellationToken::new(),
        relisted: HashMap::new(),
        gc: None,
        statics: static_pods::StaticPods::default(),
        mirrors: None,
        eviction: None,
        held: hold::HeldPods::default(),
    };
    Rig {
        dispatcher,
        patches,
        _fake: fake,
        _root: root,
    }
}

impl Rig {
    /// Waits (5 s at most) for a patch of `name` whose `HeldUpgrade` condition has `status`.
    async fn wait_condition(&self, name: &str, status: &str) -> Value {
        let resource = format!("default/podpatch/{name}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let found = self.patches.lock().unwrap().iter().find_map(|(r, p)| {
                let c = p["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == hold::CONDITION && c["status"] == status)?;
                (*r == resource).then(|| json!({"patch": p, "condition": c}))
            });
            if let Some(f) = found {
                return f;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no HeldUpgrade={status} patch of {name}; patches: {:?}",
                self.patches.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn runs(&self, uid: &str) -> bool {
        self.dispatcher.workers.contains_key(uid)
    }

    fn known(&self, uid: &str) -> bool {
        self.dispatcher
            .shared
            .known_pods
            .lock()
            .unwrap()
            .contains(uid)
    }

    fn delete(&mut self, name: &str, uid: &str) {
        self.dispatcher.apply(ObjectChange {
            kind: ResourceType::Pod,
            action: ChangeAction::Delete,
            key: format!("default/pod/{name}"),
            namespace: "default".into(),
            name: name.into(),
            object: json!({"metadata": {"name": name, "namespace": "default", "uid": uid}}),
        });
    }

    async fn stop(self) {
        self.dispatcher.cancel.cancel();
        for (_, w) in self.dispatcher.workers {
            let _ = tokio::time::timeout(Duration::from_secs(10), w.task).await;
        }
    }
}

#[tokio::test]
async fn held_pods_from_the_database_wait_for_their_release_and_then_start() {
    let mut r = rig(vec![
        pod("held", "u-held", 3, true),
        pod("plain", "u-plain", 3, false),
    ])
    .await;
    let cancel = CancellationToken::new();
    assert!(r.dispatcher.start_up(&cancel).await);
    assert!(r.runs("u-plain"), "a pod without the annotation starts");
    assert!(!r.runs("u-held"), "the annotated Pending pod is held");
    assert!(
        r.known("u-held"),
        "what the runtime may already have of a held pod is not garbage"
    );
    let held = r.wait_condition("held", "True").await;
    assert_eq!(
        held["patch"]["metadata"]["uid"], "u-held",
        "UID precondition"
    );
    assert_eq!(held["condition"]["reason"], hold::HELD_REASON);
    assert_eq!(held["condition"]["message"], hold::HELD_MESSAGE);
    assert!(held["condition"]["lastTransitionTime"].is_string());
    assert!(
        !r.patches
            .lock()
            .unwrap()
            .iter()
            .any(|(res, p)| res == "default/podpatch/plain"
                && p.to_string().contains(hold::CONDITION)),
        "no HeldUpgrade for the pod that runs"
    );

    // A newer copy (the patched pod coming back) stays held; an older one is ignored.
    let mut newer = pod("held", "u-held", 5, true);
    newer["status"]["conditions"] = json!([held["condition"]]);
    r.dispatcher.upsert(newer);
    r.dispatcher.upsert(pod("held", "u-held", 4, true));
    assert!(!r.runs("u-held"));
    // A release for a pod not held changes nothing.
    let none = r.dispatcher.release(hold::Release::Pod {
        namespace: "default".into(),
        name: "plain".into(),
    });
    assert!(none.is_empty());

    let released = r.dispatcher.release(hold::Release::Pod {
        namespace: "default".into(),
        name: "held".into(),
    });
    assert_eq!(released, ["default/held"]);
    assert!(r.runs("u-held"), "released: edged starts it");
    let worker_copy = r.dispatcher.workers["u-held"]
        .intent
        .borrow()
        .object
        .clone();
    assert_eq!(
        worker_copy["metadata"]["resourceVersion"], "5",
        "the newest held copy"
    );
    let released = r.wait_condition("held", "False").await;
    assert_eq!(released["condition"]["reason"], hold::RELEASED_REASON);
    // Updates of a pod edged runs are not held again, though it is still Pending.
    r.dispatcher.upsert(pod("held", "u-held", 6, true));
    assert!(r.dispatcher.held.is_empty());
    assert_eq!(
        r.dispatcher.workers["u-held"].intent.borrow().object["metadata"]["resourceVersion"],
        "6"
    );
    r.stop().await;
}

#[tokio::test]
async fn held_pods_are_forgotten_when_deleted_and_start_when_the_annotation_goes() {
    let mut r = rig(Vec::new()).await;
    r.dispatcher.upsert(pod("gone", "u-gone", 1, true));
    assert!(r.dispatcher.held.is_held("default/gone"));
    r.delete("gone", "u-gone");
    assert!(
        r.dispatcher.held.is_empty(),
        "a deleted held pod leaves no trace"
    );
    assert!(!r.runs("u-gone") && !r.known("u-gone"));

    r.dispatcher.upsert(pod("later", "u-later", 1, true));
    assert!(!r.runs("u-later"));
    r.dispatcher.upsert(pod("later", "u-later", 2, false));
    assert!(r.runs("u-later"), "without the annotation the pod starts");
    assert!(r.dispatcher.held.is_empty());

    // Deleting while held: the update with a deletionTimestamp is not held.
    r.dispatcher.upsert(pod("bye", "u-bye", 1, true));
    let mut deleting = pod("bye", "u-bye", 2, true);
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    r.dispatcher.upsert(deleting);
    assert!(r.dispatcher.held.is_empty());

    // The node's release starts every held pod.
    r.dispatcher.upsert(pod("b", "u-b", 1, true));
    r.dispatcher.upsert(pod("a", "u-a", 1, true));
    let released = r.dispatcher.release(hold::Release::All);
    assert_eq!(released, ["default/a", "default/b"]);
    assert!(r.runs("u-a") && r.runs("u-b"));
    assert!(r.dispatcher.held.is_empty());
    r.stop().await;
}
