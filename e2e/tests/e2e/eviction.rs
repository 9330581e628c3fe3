//! Eviction on real containerd, decided at the edge: pods over their own local-storage limits
//! (an emptyDir `sizeLimit`, a container's `ephemeral-storage` limit) are evicted whatever
//! the node's pressure, and under memory pressure a memory hog over its request goes before a
//! Guaranteed pod within its own. Evicted pods are `Failed`/`Evicted` with the kubelet's
//! message and event, and do not restart.

use e2e::edge::{EdgeEnv, EdgeOptions, WAIT, wait_for};
use e2e::images::BUSYBOX_IMAGE;
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

fn pod(name: &str, script: &str, resources: Value, volumes: Value) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 1, "volumes": volumes,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script], "resources": resources,
                "volumeMounts": if volumes.as_array().is_some_and(|v| !v.is_empty()) {
                    json!([{"name": "scratch", "mountPath": "/scratch"}])
                } else {
                    json!([])
                }}]},
    })
}

async fn wait_evicted(env: &EdgeEnv, name: &str) -> Value {
    env.wait_pod(name, "Failed/Evicted", |p| {
        p["status"]["phase"] == "Failed" && p["status"]["reason"] == "Evicted"
    })
    .await
}

async fn evicted_event(env: &EdgeEnv, name: &str) -> Event {
    let events: Api<Event> = Api::namespaced(env.cluster.client(), &env.ns);
    wait_for(&format!("an Evicted event for {name}"), WAIT, || async {
        let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
        events
            .list(&lp)
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Evicted"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_over_their_local_storage_limits_are_evicted() {
    let env = EdgeEnv::start("evict-disk").await;
    let fill = |path: &str| {
        format!("dd if=/dev/zero of={path} bs=1M count=6 2>/dev/null; exec sleep 3600")
    };
    env.create_pod(pod(
        "fills-empty-dir",
        &fill("/scratch/f"),
        json!({}),
        json!([{"name": "scratch", "emptyDir": {"sizeLimit": "2Mi"}}]),
    ))
    .await;
    env.create_pod(pod(
        "fills-its-layer",
        &fill("/tmp/f"),
        json!({"limits": {"ephemeral-storage": "2Mi"}}),
        json!([]),
    ))
    .await;
    env.create_pod(pod(
        "within-limits",
        "dd if=/dev/zero of=/tmp/f bs=1M count=1 2>/dev/null; exec sleep 3600",
        json!({"limits": {"ephemeral-storage": "100Mi"}}),
        json!([]),
    ))
    .await;
    let a = wait_evicted(&env, "fills-empty-dir").await;
    assert_eq!(
        a["status"]["message"],
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"2Mi\". "
    );
    let b = wait_evicted(&env, "fills-its-layer").await;
    assert_eq!(
        b["status"]["message"],
        "Container main exceeded its local ephemeral storage limit \"2Mi\". "
    );
    let e = evicted_event(&env, "fills-its-layer").await;
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    // Evicted pods stay down; the one within its limits runs on.
    let within = env.wait_running("within-limits").await;
    let b_now = env
        .wait_pod("fills-its-layer", "its container stopped", |p| {
            p["status"]["containerStatuses"][0]["state"]["terminated"].is_object()
        })
        .await;
    assert_eq!(b_now["status"]["containerStatuses"][0]["restartCount"], 0);
    assert_eq!(within["status"]["phase"], "Running");
    env.finish().await;
}

/// What edgemesh's and the kubelet's `memory.available` reads now: capacity minus the working
/// set.
fn memory_available() -> u64 {
    let m = kubeedge_edged::stats::host::read_memory().expect("/proc/meminfo");
    m.capacity.saturating_sub(m.working_set)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_memory_hog_is_evicted_before_a_guaranteed_pod_under_memory_pressure() {
    // A threshold 300 MiB below what is available now: a pod taking 600 MB crosses it.
    let threshold = memory_available().saturating_sub(300 << 20);
    if threshold < (256 << 20) {
        println!("SKIPPED: not enough free memory on this machine for a memory-pressure test");
        return;
    }
    let env = EdgeEnv::start_with(EdgeOptions {
        customize: Some(Box::new(move |c| {
            c.modules
                .edged
                .tailored_kubelet_config
                .eviction_hard
                .insert("memory.available".into(), threshold.to_string());
        })),
        ..EdgeOptions::new("evict-mem")
    })
    .await;
    env.wait_node_ready().await;
    env.create_pod(pod(
        "guaranteed",
        "exec sleep 3600",
        json!({"limits": {"cpu": "100m", "memory": "64Mi"}}),
        json!([]),
    ))
    .await;
    env.wait_running("guaranteed").await;
    env.create_pod(pod(
        "hog",
        "sleep 1; x=$(head -c 600000000 /dev/zero | tr '\\0' a); exec sleep 3600",
        json!({}),
        json!([]),
    ))
    .await;
    let hog = wait_evicted(&env, "hog").await;
    let message = hog["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        message.starts_with("The node was low on resource: memory."),
        "{message}"
    );
    let g = env.pods().get("guaranteed").await.expect("guaranteed");
    let g = serde_json::to_value(g).unwrap();
    assert_eq!(g["status"]["phase"], "Running", "the Guaranteed pod stays");
    assert!(g["status"]["reason"].is_null());
    // The node reports MemoryPressure (held for evictionPressureTransitionPeriod), and new
    // BestEffort pods are turned away while Burstable ones start, as the kubelet admits them.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.cluster.client());
    wait_for("the node's MemoryPressure condition", WAIT, || async {
        let n = nodes.get(&env.node).await.ok()?;
        n.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "MemoryPressure" && c.status == "True")
    })
    .await;
    env.create_pod(pod(
        "late-best-effort",
        "exec sleep 3600",
        json!({}),
        json!([]),
    ))
    .await;
    env.create_pod(pod(
        "late-burstable",
        "exec sleep 3600",
        json!({"requests": {"memory": "8Mi"}}),
        json!([]),
    ))
    .await;
    let rejected = wait_evicted(&env, "late-best-effort").await;
    assert_eq!(
        rejected["status"]["message"],
        "The node had condition: [MemoryPressure]. "
    );
    assert!(rejected["status"]["containerStatuses"][0]["state"]["running"].is_null());
    env.wait_running("late-burstable").await;
    env.finish().await;
}
