//! Edge autonomy end to end: a real edgecore on a real containerd, our cloudcore and the
//! Kubernetes API (in-memory, with its node lifecycle controller: 2 s grace), through outages.
//!
//! * the machine reboots while the cloud is unreachable: pods come back from the edge
//!   database, then edge and cloud converge, including what changed in the cloud meanwhile;
//! * healthy pods are not restarted when the link comes back (with and without an edgecore
//!   restart during the outage);
//! * a node the cloud marked Unknown is Ready again right after the edge reconnects.
//!
//! The edge reaches cloudcore through a `FaultProxy` (`env.link`): `freeze` makes a half-open
//! link (nothing forwarded, nothing closed), `thaw` restores it. `E2E_LOG=edgecore=debug`
//! shows edgecore's log.

use e2e::edge::{
    EdgeEnv, EdgeOptions, WAIT, condition, container_id, exec, is_running_and_ready, poll_until,
    runtime_objects, wait_for,
};
use e2e::images::BUSYBOX_IMAGE;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use kubeedge_edged::cri::{CriClient, api};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::time::{Duration, Instant};

fn sleeper(name: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"]}]},
    })
}

/// What must not change when a healthy pod is left alone: container IDs, restart counts,
/// start times.
fn identity(pod: &Value) -> Vec<(Value, Value, Value)> {
    pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["containerID"].clone(),
                c["restartCount"].clone(),
                c["state"]["running"]["startedAt"].clone(),
            )
        })
        .collect()
}

/// The running containers and ready sandboxes of a pod in the runtime.
async fn live_objects(cri: &CriClient, uid: &str) -> (Vec<api::Container>, Vec<api::PodSandbox>) {
    let (containers, sandboxes) = runtime_objects(cri, uid).await;
    (
        containers
            .into_iter()
            .filter(|c| c.state() == api::ContainerState::ContainerRunning)
            .collect(),
        sandboxes
            .into_iter()
            .filter(|s| s.state() == api::PodSandboxState::SandboxReady)
            .collect(),
    )
}

/// The IDs of the pods' containers and sandboxes in the runtime.
async fn runtime_ids(cri: &CriClient, pods: &[Value]) -> HashSet<String> {
    let mut ids = HashSet::new();
    for p in pods {
        let uid = p["metadata"]["uid"].as_str().expect("a pod UID");
        let (c, s) = runtime_objects(cri, uid).await;
        ids.extend(c.into_iter().map(|c| c.id));
        ids.extend(s.into_iter().map(|s| s.id));
    }
    ids
}

/// The node is Ready; the pods run, Ready, with the containers, restart counts and start times of `before`, and
/// the runtime holds the same objects.
async fn assert_unchanged(
    env: &EdgeEnv,
    cri: &CriClient,
    before: &[Value],
    ids_before: &HashSet<String>,
    what: &str,
) {
    env.wait_node_ready().await;
    for b in before {
        let name = b["metadata"]["name"].as_str().expect("a pod name");
        let p = env.wait_running(name).await;
        assert_eq!(identity(&p), identity(b), "{name} after {what}");
        assert_eq!(
            condition(&p, "Ready")["status"],
            "True",
            "{name} after {what}"
        );
    }
    assert_eq!(
        &runtime_ids(cri, before).await,
        ids_before,
        "runtime objects after {what}"
    );
}

/// Waits until the cloud has marked the node Unknown and `pod` not ready (the node lifecycle
/// controller's 2 s grace); returns the node's Ready condition.
async fn marked_unreachable(env: &EdgeEnv, pod: &str) -> Value {
    let unknown = env.wait_node_condition("Unknown").await;
    env.wait_pod(pod, "marked not ready by the cloud", |p| {
        condition(p, "Ready")["status"] == "False"
    })
    .await;
    unknown
}

/// Once the edge is connected again, the node and the pod `before` are Ready again, the pod
/// with the same containers; prints how long after the reconnect each was seen (polled every
/// 10 ms).
async fn ready_again(env: &EdgeEnv, before: &Value, what: &str) {
    let back = env.wait_edge_link(true).await;
    let name = before["metadata"]["name"].as_str().expect("a pod name");
    let every = Duration::from_millis(10);
    poll_until("the node Ready again", WAIT, every, || async {
        env.node_ready_condition()
            .await
            .filter(|c| c["status"] == "True")
    })
    .await;
    let node_ready = back.elapsed();
    let pod = poll_until("the pod Ready again", WAIT, every, || async {
        let p = serde_json::to_value(env.pods().get_opt(name).await.ok()??).ok()?;
        is_running_and_ready(&p).then_some(p)
    })
    .await;
    eprintln!(
        "{what}: node Ready {node_ready:?}, pod Ready {:?} after the edge reconnected",
        back.elapsed()
    );
    assert_eq!(identity(&pod), identity(before), "{what}");
}

/// The node's taint keys.
async fn taints(env: &EdgeEnv) -> Vec<String> {
    let node = env.nodes().get(&env.node).await.expect("the node");
    node.spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect()
}

/// How often events with this reason were recorded about the object with this UID (a node's
/// UID in its events is its name), over all namespaces.
async fn event_count(env: &EdgeEnv, uid: &str, reason: &str) -> i64 {
    let events: Api<Event> = Api::all(env.cluster.client());
    let lp = ListParams::default().fields(&format!("involvedObject.uid={uid}"));
    let Ok(list) = events.list(&lp).await else {
        return 0;
    };
    list.items
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| i64::from(e.count.unwrap_or(1)))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reboot_without_the_cloud_pods_come_back_from_the_database_and_converge() {
    // The reboot kills every container of the runtime: this test has a containerd of its own.
    let (containerd, mut env) = EdgeEnv::start_on_own_containerd("autonomy-reboot").await;
    let cms: Api<ConfigMap> = Api::namespaced(env.cluster.client(), &env.ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "settings"}, "data": {"greeting": "before"},
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let mut keeper = sleeper("keeper");
    keeper["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "cfg", "mountPath": "/etc/cfg"}]);
    keeper["spec"]["volumes"] = json!([{"name": "cfg", "configMap": {"name": "settings"}}]);
    env.create_pod(keeper).await;
    env.create_pod(sleeper("doomed")).await;
    let before = env.wait_running("keeper").await;
    let doomed = env.wait_running("doomed").await;
    let uid = before["metadata"]["uid"].as_str().unwrap().to_string();
    let doomed_uid = doomed["metadata"]["uid"].as_str().unwrap().to_string();
    let cri = env.cri().await;
    let (_, old_sandboxes) = runtime_objects(&cri, &uid).await;
    let old_sandbox = old_sandboxes[0].id.clone();
    let old_container = container_id(&before, 0);

    // The cloud becomes unreachable, then the machine reboots: edgecore stops, every
    // container dies with the runtime's state.
    env.stop_cloud();
    env.wait_edge_link(false).await;
    env.stop_edge().await;
    tokio::task::block_in_place(|| containerd.reboot()).unwrap_or_else(|e| panic!("{e}"));
    let cri = env.cri().await;
    let (live_containers, live_sandboxes) = live_objects(&cri, &uid).await;
    assert!(
        live_containers.is_empty() && live_sandboxes.is_empty(),
        "nothing runs after the reboot"
    );

    // edgecore starts without the cloud: the pods come from its database and run again.
    let offline = Instant::now();
    env.start_edge().await;
    for pod_uid in [&uid, &doomed_uid] {
        wait_for("the pod running again, offline", WAIT, || async {
            let (c, s) = live_objects(&cri, pod_uid).await;
            (c.len() == 1 && s.len() == 1 && s[0].id != old_sandbox).then_some(())
        })
        .await;
    }
    eprintln!(
        "edgecore start (offline, after a reboot) → both pods running again: {:?}",
        offline.elapsed()
    );
    assert!(!env.edge_connected(), "the cloud is still unreachable");
    let (running, _) = live_objects(&cri, &uid).await;
    let new_container = running[0].id.clone();
    assert_ne!(new_container, old_container);
    let (code, out) = exec(&cri, &new_container, &["cat", "/etc/cfg/greeting"]).await;
    assert_eq!(
        (code, out.as_str()),
        (0, "before"),
        "volumes are rebuilt offline from the database"
    );

    // Meanwhile in the cloud: a configmap edit, a pod deleted, a pod created.
    let mut edited = cms.get("settings").await.unwrap();
    edited
        .data
        .as_mut()
        .unwrap()
        .insert("greeting".into(), "edited while offline".into());
    cms.replace("settings", &PostParams::default(), &edited)
        .await
        .unwrap();
    env.pods()
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    env.create_pod(sleeper("newcomer")).await;

    // The cloud comes back: a new cloudcore.
    env.start_cloud().await;
    let reconnected = env.wait_edge_link(true).await;
    env.wait_node_ready().await;
    eprintln!("reconnect → node Ready: {:?}", reconnected.elapsed());
    let after = env
        .wait_pod(
            "keeper",
            "Running and Ready with the container of after the reboot",
            |p| {
                is_running_and_ready(p)
                    && p["status"]["containerStatuses"][0]["containerID"]
                        == format!("containerd://{new_container}")
            },
        )
        .await;
    eprintln!(
        "reconnect → pod status converged: {:?}",
        reconnected.elapsed()
    );
    // As the kubelet counts it: the container of before the reboot exited, this is a restart.
    assert_eq!(after["status"]["containerStatuses"][0]["restartCount"], 1);
    let (_, sandboxes) = live_objects(&cri, &uid).await;
    let ip = cri
        .runtime()
        .pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: sandboxes[0].id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .and_then(|s| s.network)
        .map(|n| n.ip)
        .unwrap_or_default();
    assert_eq!(
        after["status"]["podIP"],
        ip.as_str(),
        "the new sandbox's IP"
    );
    assert_eq!(condition(&after, "Ready")["status"], "True");
    wait_for(
        "the offline configmap edit in the container",
        WAIT,
        || async {
            let (_, out) = exec(&cri, &new_container, &["cat", "/etc/cfg/greeting"]).await;
            (out == "edited while offline").then_some(())
        },
    )
    .await;
    env.wait_running("newcomer").await;
    // Events raised while the cloud was away reach the API once it is back: the keeper's
    // container started again offline (a second Started), and so did edgecore (a second
    // Starting on the node, in namespace default as the kubelet records node events).
    wait_for("the events raised offline", WAIT, || async {
        let started = event_count(&env, &uid, "Started").await;
        let starting = event_count(&env, &env.node, "Starting").await;
        (started >= 2 && starting >= 2).then_some(())
    })
    .await;
    wait_for("the pod deleted while offline to go", WAIT, || async {
        let gone = env.pods().get_opt("doomed").await.ok()?.is_none();
        let (c, s) = runtime_objects(&cri, &doomed_uid).await;
        (gone && c.is_empty() && s.is_empty()).then_some(())
    })
    .await;
    // The sandboxes of before the reboot are stopped: their IPs are released (CNI DEL); the
    // runtime holds leases for the running pods only.
    wait_for("IP leases of the running pods only", WAIT, || async {
        let mut running = Vec::new();
        for name in ["keeper", "newcomer"] {
            let p = env.pods().get(name).await.ok()?;
            running.push(p.status?.pod_ip?.parse::<std::net::Ipv4Addr>().ok()?);
        }
        running.sort();
        let leases = containerd.ip_leases();
        (leases == running).then_some(())
    })
    .await;
    assert_eq!(container_id(&after, 0), new_container);
    env.finish().await;
    drop(containerd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_pods_are_not_restarted_when_the_link_comes_back() {
    let mut env = EdgeEnv::start("autonomy-steady").await;
    let mut probed = sleeper("probed");
    probed["spec"]["containers"][0]["readinessProbe"] =
        json!({"exec": {"command": ["true"]}, "periodSeconds": 1});
    env.create_pod(sleeper("steady")).await;
    env.create_pod(probed).await;
    let mut before = Vec::new();
    for n in ["steady", "probed"] {
        before.push(env.wait_running(n).await);
    }
    let cri = env.cri().await;
    let ids_before = runtime_ids(&cri, &before).await;
    assert_eq!(ids_before.len(), 4, "one container and one sandbox per pod");

    // 1. The link freezes long enough for the cloud to mark the node and its pods not
    //    ready; edgecore keeps running.
    env.link.freeze();
    env.wait_edge_link(false).await;
    marked_unreachable(&env, "steady").await;
    env.link.thaw();
    let back = env.wait_edge_link(true).await;
    assert_unchanged(&env, &cri, &before, &ids_before, "a link outage").await;
    eprintln!("link back → node and pods Ready: {:?}", back.elapsed());

    // 2. The link goes again and edgecore restarts during the outage: it adopts what runs.
    env.link.freeze();
    env.wait_edge_link(false).await;
    env.stop_edge().await;
    env.wait_node_condition("Unknown").await;
    env.start_edge().await;
    // Let the offline edged list, adopt and relist a few times before the link returns.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        runtime_ids(&cri, &before).await,
        ids_before,
        "nothing restarted by an offline edgecore start"
    );
    env.link.thaw();
    let back = env.wait_edge_link(true).await;
    assert_unchanged(
        &env,
        &cri,
        &before,
        &ids_before,
        "an offline edgecore restart",
    )
    .await;
    eprintln!(
        "link back after an offline restart → node and pods Ready: {:?}",
        back.elapsed()
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_marked_unknown_is_ready_again_right_after_the_edge_returns() {
    // A status period longer than the test's waits: the node can only be Ready again in
    // time if the edge reports when the link comes back (a node waiting for its next periodic
    // report stays NotReady that long: KubeEdge's default period is 10 s). The lease (4 s) is
    // renewed every second and keeps the node alive between reports.
    let mut env = EdgeEnv::start_with(EdgeOptions {
        node_status_update_frequency_secs: 120,
        ..EdgeOptions::new("autonomy-ready")
    })
    .await;
    env.wait_node_ready().await;
    env.create_pod(sleeper("steady")).await;
    let before = env.wait_running("steady").await;

    // 1. The link freezes: the node lifecycle controller marks the node Unknown, taints it
    //    unreachable and marks its pods not ready.
    env.link.freeze();
    let unknown = marked_unreachable(&env, "steady").await;
    assert_eq!(unknown["reason"], "NodeStatusUnknown", "{unknown}");
    let t = taints(&env).await;
    assert!(
        t.iter().any(|k| k == "node.kubernetes.io/unreachable"),
        "{t:?}"
    );
    env.wait_edge_link(false).await;
    env.link.thaw();
    ready_again(&env, &before, "link back").await;
    wait_for("the unreachable taint to go", WAIT, || async {
        taints(&env).await.is_empty().then_some(())
    })
    .await;

    // 2. edgecore goes away (stopped), the node goes Unknown; edgecore starts again.
    env.stop_edge().await;
    marked_unreachable(&env, "steady").await;
    env.start_edge().await;
    ready_again(&env, &before, "edgecore restarted").await;
    env.finish().await;
}
