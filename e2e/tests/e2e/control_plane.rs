//! A failing control plane: cloudcore and a real edgecore (with its MetaServer, on containerd)
//! while the apiserver answers 429, 500 or 503 to everything, is unreachable, restarts (its
//! watch history gone), or expires every watch at once. Throughout, the edge stays connected,
//! its pod runs and its MetaServer answers; after each fault the cluster and the edge converge:
//! a pod created afterwards runs, the node and the pods are Ready, a ConfigMap change reaches
//! the edge.
//!
//! The faults are the in-memory apiserver's switches (kube-memserver APISERVER.md "Faults");
//! on a real cluster (`E2E_KUBECONFIG`) the test prints SKIPPED: nothing there can make the
//! apiserver fail on demand.

use e2e::edge::{EdgeEnv, EdgeOptions, WAIT, container_id, exec, is_running_and_ready, wait_for};
use e2e::images::BUSYBOX_IMAGE;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_memserver::Failure;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::Duration;

/// How long each fault lasts. In production "unreachable for minutes"; here 6 s by default,
/// which the test edge's timers (node status every second, a 4 s lease, the in-memory
/// apiserver's node monitor grace period) make as long as minutes are for a default edge: every
/// periodic request of the edge meets the fault several times, the lease lapses and the node
/// lifecycle controller marks the node Unknown. `E2E_FAULT_SECONDS` sets it (e.g. 180 for
/// three minutes per fault).
fn fault() -> Duration {
    let secs = std::env::var("E2E_FAULT_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    Duration::from_secs(secs)
}

fn sleeper(name: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
                "env": [{"name": "V", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "v"}}}],
                "volumeMounts": [{"name": "settings", "mountPath": "/settings"}]}],
            "volumes": [{"name": "settings", "configMap": {"name": "settings"}}]},
    })
}

fn metaserver_client(addr: SocketAddr) -> kube::Client {
    let config = kube::Config::new(format!("http://{addr}").parse().expect("a URL"));
    kube::Client::try_from(config).expect("a client")
}

/// What must hold while the control plane fails: the edge is connected to cloudcore and its
/// MetaServer lists the running pods.
async fn edge_keeps_serving(env: &EdgeEnv, edge_pods: &Api<Pod>, running: &[String], phase: &str) {
    let deadline = tokio::time::Instant::now() + fault();
    loop {
        assert!(
            env.edge_connected(),
            "{phase}: the edge lost its cloudcore link"
        );
        let listed =
            tokio::time::timeout(Duration::from_secs(5), edge_pods.list(&Default::default()))
                .await
                .unwrap_or_else(|_| panic!("{phase}: the MetaServer did not answer within 5 s"))
                .unwrap_or_else(|e| panic!("{phase}: the MetaServer failed: {e}"));
        let names: Vec<String> = listed
            .items
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        for want in running {
            assert!(
                names.contains(want),
                "{phase}: the MetaServer lost pod {want}: {names:?}"
            );
        }
        if tokio::time::Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What must hold after the fault: the node and every pod are Ready again, a new pod runs,
/// and a ConfigMap change reaches the pods' volume on the edge.
async fn converges(env: &EdgeEnv, running: &mut Vec<String>, phase: &str, n: usize) {
    env.wait_node_condition("True").await;
    for p in running.iter() {
        env.wait_pod(
            p,
            &format!("Ready again after {phase}"),
            is_running_and_ready,
        )
        .await;
    }
    let name = format!("after-{n}");
    env.create_pod(sleeper(&name)).await;
    let pod = env.wait_running(&name).await;
    running.push(name.clone());
    let cms: Api<ConfigMap> = Api::namespaced(env.cluster.client(), &env.ns);
    let value = format!("v{n}");
    cms.patch(
        "settings",
        &PatchParams::default(),
        &Patch::Merge(&json!({"data": {"v": value}})),
    )
    .await
    .expect("ConfigMap patched");
    let cri = env.cri().await;
    let id = container_id(&pod, 0);
    wait_for(
        &format!("{phase}: the ConfigMap change in pod {name}'s volume"),
        WAIT,
        || async {
            let (code, out) = exec(&cri, &id, &["cat", "/settings/v"]).await;
            (code == 0 && out == value).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cloudcore_and_the_edge_ride_out_apiserver_faults() {
    if e2e::cluster::real_cluster_configured() {
        println!(
            "SKIPPED on a real cluster (E2E_KUBECONFIG is set): this test needs the in-memory \
             apiserver's fault switches (failures, outages, expired watches); kube-memserver \
             APISERVER.md \"Faults\" gives the same scenario by hand"
        );
        return;
    }
    let env = EdgeEnv::start_with(EdgeOptions {
        metaserver: true,
        ..EdgeOptions::new("cpfault")
    })
    .await;
    env.wait_node_ready().await;
    let cms: Api<ConfigMap> = Api::namespaced(env.cluster.client(), &env.ns);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "settings"}, "data": {"v": "v0"}}))
            .expect("a ConfigMap"),
    )
    .await
    .expect("ConfigMap created");
    env.create_pod(sleeper("before")).await;
    env.wait_running("before").await;
    let addr = env
        .edge
        .as_ref()
        .and_then(|e| e.metaserver_addr())
        .expect("the MetaServer runs");
    let edge_pods: Api<Pod> = Api::namespaced(metaserver_client(addr), &env.ns);
    let mut running = vec!["before".to_string()];

    let phases: [(&str, Option<Failure>); 3] = [
        (
            "429 Too Many Requests",
            Some(Failure::TooManyRequests {
                retry_after_seconds: 1,
            }),
        ),
        ("500 InternalError", Some(Failure::Internal)),
        ("503 ServiceUnavailable", Some(Failure::Unavailable)),
    ];
    let mut n = 0;
    for (phase, failure) in phases {
        n += 1;
        let srv = env.cluster.in_memory().expect("in-memory apiserver");
        srv.fail_requests(failure.expect("a failure"));
        edge_keeps_serving(&env, &edge_pods, &running, phase).await;
        srv.heal();
        converges(&env, &mut running, phase, n).await;
    }

    // Unreachable: every connection dropped, new ones refused.
    n += 1;
    {
        let srv = env.cluster.in_memory().expect("in-memory apiserver");
        let outage = srv.outage();
        edge_keeps_serving(&env, &edge_pods, &running, "unreachable").await;
        drop(outage);
    }
    converges(&env, &mut running, "unreachable", n).await;

    // A restart: unreachable, then back with a watch cache that starts now (every watch
    // resumed from before gets 410 Gone and relists).
    n += 1;
    {
        let srv = env.cluster.in_memory().expect("in-memory apiserver");
        let outage = srv.outage();
        edge_keeps_serving(&env, &edge_pods, &running, "restart").await;
        srv.compact_history();
        drop(outage);
    }
    converges(&env, &mut running, "restart", n).await;

    // Every watch expires at once (410 Gone), with changes made meanwhile.
    n += 1;
    {
        let srv = env.cluster.in_memory().expect("in-memory apiserver");
        srv.expire_watches();
        edge_keeps_serving(&env, &edge_pods, &running, "every watch expired").await;
    }
    converges(&env, &mut running, "every watch expired", n).await;

    env.finish().await;
}
