//! The pod worker's executor against the fake CRI runtime: what it asks of the runtime, and
//! what it reports, for each step of a pod's life. The reported statuses are the patches it
//! hands to metamanager (answered "not connected", as when the cloud is away).

use super::*;
use crate::cri::api::ContainerState;
use crate::cri::fake::{FakeCri, image_id};
use crate::events::Recorder;
use crate::meta::MetaCall;
use crate::objects::ObjectCache;
use crate::status_report::StatusReports;

struct Harness {
    fake: FakeCri,
    worker: PodWorker,
    intent: watch::Sender<PodIntent>,
    /// Status patches sent to the cloud, in order.
    patches: Arc<Mutex<Vec<Value>>>,
    /// Kubernetes Events the worker recorded.
    events: tokio::sync::mpsc::Receiver<crate::events::Occurrence>,
    _root: tempfile::TempDir,
}

const IMAGE: &str = "registry.example/app:1";

fn pod(containers: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "uid": "uid-1",
            "resourceVersion": "5", "creationTimestamp": "2026-11-26T10:00:00Z"},
        "spec": {"nodeName": "edge-1", "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 1, "containers": containers},
    })
}

fn app(image: &str) -> Value {
    json!([{"name": "app", "image": image}])
}

impl Shared {
    /// edged of node `edge-1` with its directories under `root`, on `runtime`, its cloud side
    /// `meta` (tests).
    pub(crate) fn for_tests(root: &std::path::Path, runtime: Runtime, meta: MetaClient) -> Shared {
        let config = EdgedConfig {
            node_name: "edge-1".into(),
            node_ip: "10.254.254.1".into(),
            root_directory: root.join("kubelet"),
            pod_logs_directory: root.join("pods"),
            static_pod_path: None,
            ..EdgedConfig::default()
        };
        let (events, _) = Recorder::new(256);
        Shared {
            objects: ObjectCache::new(meta.clone(), Duration::from_secs(5)),
            meta,
            runtime,
            events,
            runtime_name: OnceLock::new(),
            allocatable: Allocatable::default(),
            known_pods: Mutex::new(HashSet::new()),
            pull_lock: tokio::sync::Mutex::new(()),
            resync: watch::channel(0).0,
            image_gc_now: Notify::new(),
            pressure: Default::default(),
            node_status_now: Notify::new(),
            lease_self: Default::default(),
            lease_self_now: Notify::new(),
            terms: tokio::sync::watch::channel(kubeedge_shared::link::CloudTerms::default()).1,
            status_reports: Arc::new(StatusReports::default()),
            observer: None,
            cgroups: crate::cgroups::PodCgroups::new(crate::cgroups::CgroupSettings {
                per_qos: false,
                ..Default::default()
            }),
            config,
        }
    }
}

async fn harness(object: Value) -> Harness {
    let root = tempfile::tempdir().expect("temporary directory");
    let fake = FakeCri::start();
    let runtime = Runtime::new(
        fake.client().await,
        EdgedConfig::default().runtime_request_timeout,
    );

    let (requests, mut rx) = tokio::sync::mpsc::channel::<MetaCall>(16);
    let patches: Arc<Mutex<Vec<Value>>> = Arc::default();
    let seen = patches.clone();
    tokio::spawn(async move {
        while let Some(req) = rx.recv().await {
            if req.req.path.resource_type == kubeedge_shared::ResourceType::PodPatch {
                let patch = req.req.content.clone();
                let patch = match patch {
                    Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::Null),
                    other => other,
                };
                seen.lock().unwrap().push(patch);
            }
            let _ = req.reply.send(Err(MetaError::NotConnected));
        }
    });
    let meta = MetaClient::new(Arc::new(requests), "edge-1", "default");
    let (events, occurrences) = Recorder::new(256);
    let shared = Arc::new(Shared {
        events,
        ..Shared::for_tests(root.path(), runtime, meta)
    });
    let (intent, rx) = watch::channel(PodIntent {
        object: Arc::new(object),
        deleted: false,
        config_version: 0,
        evicted: None,
    });
    let worker = PodWorker::new(
        shared,
        "uid-1".into(),
        rx,
        Arc::new(Notify::new()),
        CancellationToken::new(),
    );
    Harness {
        fake,
        worker,
        intent,
        patches,
        events: occurrences,
        _root: root,
    }
}

impl Harness {
    /// Syncs until `done` holds for the last status sent (at most 10 syncs).
    async fn sync_until(&mut self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..10 {
            self.worker.sync().await;
            if let Some(last) = self.last_status()
                && done(&last)
            {
                return last;
            }
        }
        panic!(
            "{what}: not reported after 10 syncs; last status {:?}; runtime calls {:?}",
            self.last_status(),
            self.fake.state().calls
        );
    }

    fn last_status(&self) -> Option<Value> {
        self.patches
            .lock()
            .unwrap()
            .last()
            .map(|p| p["status"].clone())
    }

    /// `reason: message` of the events recorded so far.
    fn events(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            out.push(format!("{}: {}", e.reason, e.message));
        }
        out
    }

    fn update(&self, object: Value, deleted: bool) {
        self.intent.send_replace(PodIntent {
            object: Arc::new(object),
            deleted,
            config_version: 0,
            evicted: None,
        });
    }
}

fn container_state<'a>(status: &'a Value, key: &str) -> &'a Value {
    &status["containerStatuses"][0]["state"][key]
}

#[tokio::test]
async fn a_new_pod_gets_its_image_a_sandbox_and_a_running_container_and_reports_running() {
    let mut h = harness(pod(app(IMAGE))).await;
    let status = h.sync_until("Running", |s| s["phase"] == "Running").await;
    let c = &status["containerStatuses"][0];
    assert_eq!(c["ready"], true, "{status}");
    assert!(!container_state(&status, "running").is_null(), "{status}");
    let st = h.fake.state();
    assert_eq!(st.count("PullImage"), 1, "{:?}", st.calls);
    assert_eq!(st.count("RunPodSandbox"), 1, "{:?}", st.calls);
    assert_eq!(st.count("StartContainer"), 1, "{:?}", st.calls);
    let running = st.containers_named("app");
    assert_eq!(running.len(), 1);
    let (id, ct) = running[0];
    assert_eq!(ct.state, ContainerState::ContainerRunning);
    assert_eq!(c["containerID"], format!("containerd://{id}"), "{status}");
    let sandbox = &st.sandboxes[&ct.sandbox_id];
    assert_eq!(status["podIP"], sandbox.ip, "{status}");
    assert_eq!(
        sandbox
            .config
            .labels
            .get("io.kubernetes.pod.uid")
            .map(String::as_str),
        Some("uid-1")
    );
}

#[tokio::test]
async fn a_failed_pull_is_err_image_pull_then_back_off_without_pulling_again() {
    let mut h = harness(pod(app(IMAGE))).await;
    h.fake
        .state()
        .pull_errors
        .insert(IMAGE.into(), "manifest unknown".into());
    let status = h
        .sync_until("ErrImagePull", |s| {
            container_state(s, "waiting")["reason"] == "ErrImagePull"
        })
        .await;
    let message = container_state(&status, "waiting")["message"]
        .as_str()
        .unwrap_or("");
    assert!(message.contains("manifest unknown"), "{status}");
    h.sync_until("ImagePullBackOff", |s| {
        container_state(s, "waiting")["reason"] == "ImagePullBackOff"
    })
    .await;
    let st = h.fake.state();
    assert_eq!(
        st.count("PullImage"),
        1,
        "back-off not respected: {:?}",
        st.calls
    );
    assert_eq!(st.count("CreateContainer"), 0, "{:?}", st.calls);
}

#[tokio::test]
async fn a_sandbox_that_cannot_start_leaves_the_containers_creating_with_the_reason() {
    let mut h = harness(pod(app(IMAGE))).await;
    h.fake.state().sandbox_error = Some("failed to set up the network".into());
    let status = h
        .sync_until("ContainerCreating with the error", |s| {
            container_state(s, "waiting")["message"]
                .as_str()
                .is_some_and(|m| m.contains("failed to set up the network"))
        })
        .await;
    assert_eq!(status["phase"], "Pending", "{status}");
    assert_eq!(
        container_state(&status, "waiting")["reason"],
        "ContainerCreating"
    );
    assert_eq!(h.fake.state().count("CreateContainer"), 0);
}

#[tokio::test]
async fn a_container_that_exits_is_restarted_then_held_in_crash_loop_back_off() {
    let mut h = harness(pod(app(IMAGE))).await;
    h.sync_until("Running", |s| s["phase"] == "Running").await;
    assert!(h.fake.state().exit("app", 1));
    let status = h
        .sync_until("restarted once", |s| {
            s["containerStatuses"][0]["restartCount"] == 1
                && !container_state(s, "running").is_null()
        })
        .await;
    let last = &status["containerStatuses"][0]["lastState"]["terminated"];
    assert_eq!(last["exitCode"], 1, "{status}");
    assert!(h.fake.state().exit("app", 1));
    h.sync_until("CrashLoopBackOff", |s| {
        container_state(s, "waiting")["reason"] == "CrashLoopBackOff"
    })
    .await;
    let events = h.events();
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("BackOff: Back-off restarting failed container app")),
        "{events:?}"
    );
    let st = h.fake.state();
    assert_eq!(st.count("StartContainer"), 2, "{:?}", st.calls);
    assert!(
        st.containers_named("app")
            .iter()
            .all(|(_, c)| c.state == ContainerState::ContainerExited)
    );
}

#[tokio::test]
async fn a_changed_image_replaces_the_container() {
    let mut h = harness(pod(app(IMAGE))).await;
    h.sync_until("Running", |s| s["phase"] == "Running").await;
    h.events();
    let mut changed = pod(app("registry.example/app:2"));
    changed["metadata"]["resourceVersion"] = json!("6");
    h.update(changed, false);
    h.sync_until("running the new image", |s| {
        s["containerStatuses"][0]["image"] == "registry.example/app:2"
            && !container_state(s, "running").is_null()
    })
    .await;
    let events = h.events();
    assert!(
        events.contains(&"Killing: Container app definition changed, will be restarted".into()),
        "{events:?}"
    );
    let st = h.fake.state();
    assert_eq!(st.count("StopContainer"), 1, "{:?}", st.calls);
    let named = st.containers_named("app");
    assert_eq!(named[0].1.state, ContainerState::ContainerRunning);
    // Created from the pulled image's ID, as the kubelet does.
    let created_from = named[0].1.config.image.as_ref().map(|i| i.image.clone());
    assert_eq!(created_from, Some(image_id("registry.example/app:2")));
    assert_eq!(
        st.count("RunPodSandbox"),
        1,
        "the sandbox is kept: {:?}",
        st.calls
    );
}

#[tokio::test]
async fn a_pod_gone_from_the_node_is_stopped_and_removed_from_the_runtime() {
    let mut h = harness(pod(app(IMAGE))).await;
    h.sync_until("Running", |s| s["phase"] == "Running").await;
    h.update(pod(app(IMAGE)), true);
    let next = h.worker.sync().await;
    assert!(matches!(next, Next::Done));
    let st = h.fake.state();
    assert!(st.containers.is_empty(), "{:?}", st.calls);
    assert!(st.sandboxes.is_empty(), "{:?}", st.calls);
    assert_eq!(st.count("RemovePodSandbox"), 1, "{:?}", st.calls);
    assert_eq!(st.count("RemoveContainer"), 1, "{:?}", st.calls);
}

fn evict(h: &Harness, message: &str) {
    let e = Arc::new(crate::eviction::Eviction {
        message: message.into(),
        grace: Duration::ZERO,
    });
    h.intent.send_modify(|i| i.evicted = Some(e));
}

#[tokio::test]
async fn an_evicted_pod_is_stopped_reported_failed_evicted_and_not_restarted() {
    let mut h = harness(pod(app(IMAGE))).await;
    h.sync_until("Running", |s| s["phase"] == "Running").await;
    evict(&h, "The node was low on resource: memory. ");
    let status = h
        .sync_until("Failed/Evicted", |s| {
            s["phase"] == "Failed" && !container_state(s, "terminated").is_null()
        })
        .await;
    assert_eq!(status["reason"], "Evicted", "{status}");
    assert_eq!(
        status["message"], "The node was low on resource: memory. ",
        "{status}"
    );
    assert!(
        h.events()
            .contains(&"Evicted: The node was low on resource: memory. ".to_string())
    );
    for _ in 0..3 {
        h.worker.sync().await;
    }
    let st = h.fake.state();
    assert_eq!(
        st.count("StartContainer"),
        1,
        "not restarted: {:?}",
        st.calls
    );
    assert!(
        st.containers
            .values()
            .all(|c| c.state != ContainerState::ContainerRunning),
        "{:?}",
        st.calls
    );
}

#[tokio::test]
async fn a_pod_rejected_on_admission_never_starts() {
    let mut h = harness(pod(app(IMAGE))).await;
    evict(&h, "The node had condition: [DiskPressure]. ");
    let status = h
        .sync_until("Failed/Evicted", |s| s["phase"] == "Failed")
        .await;
    assert_eq!(status["reason"], "Evicted", "{status}");
    let st = h.fake.state();
    assert_eq!(st.count("RunPodSandbox"), 0, "{:?}", st.calls);
    assert_eq!(st.count("PullImage"), 0, "{:?}", st.calls);
}

#[tokio::test]
async fn a_failed_pod_keeps_its_reason_after_a_restart() {
    let mut object = pod(app(IMAGE));
    object["status"] = json!({"phase": "Failed", "reason": "Evicted",
        "message": "The node had condition: [DiskPressure]. "});
    let mut h = harness(object).await;
    for _ in 0..3 {
        h.worker.sync().await;
    }
    if let Some(s) = h.last_status() {
        assert_eq!(s["reason"], "Evicted", "{s}");
        assert_eq!(s["phase"], "Failed", "{s}");
    }
    assert_eq!(h.fake.state().count("RunPodSandbox"), 0);
}
