//! KubeEdge v1.22+ hold-upgrade end to end: pods annotated `edge.kubeedge.io/hold-upgrade:
//! "true"` wait at the edge, `Pending` with the `HeldUpgrade` condition in the API server and
//! nothing in the runtime, until the edge's MetaServer is asked to release them
//! (`POST /api/v1/pods/unhold-upgrade`, `POST /api/v1/nodes/unhold-upgrade`, as
//! `keadm ctl unhold-upgrade` does); then edged runs them. Real edgecore and containerd; the
//! API server in memory or a real cluster (`E2E_KUBECONFIG`).

use e2e::edge::{EdgeEnv, EdgeOptions, WAIT, condition, runtime_objects, wait_for};
use e2e::images::BUSYBOX_IMAGE;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::Duration;

const ANNOTATION: &str = "edge.kubeedge.io/hold-upgrade";

fn held_sleeper(name: &str) -> Value {
    json!({
        "metadata": {"name": name, "annotations": {ANNOTATION: "true"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]}],
        },
    })
}

/// `POST <path>` to the edge's MetaServer with a text body; the status code and the Status
/// message.
async fn unhold(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    let config = kube::Config::new(format!("http://{addr}").parse().expect("a URL"));
    let client = kube::Client::try_from(config).expect("a client");
    let req = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "text/plain")
        .body(kube::client::Body::from(body.as_bytes().to_vec()))
        .expect("a request");
    let resp = tokio::time::timeout(Duration::from_secs(30), client.send(req))
        .await
        .expect("the MetaServer answered within 30 s")
        .expect("the MetaServer answers");
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("a body").to_bytes();
    let status: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let message = status["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
    (code, message)
}

fn held_condition(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter().any(|c| {
            c["type"] == "HeldUpgrade"
                && c["status"] == "True"
                && c["reason"] == "HoldUpgradeEnabled"
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_pods_wait_at_the_edge_until_the_metaserver_releases_them() {
    let env = EdgeEnv::start_with(EdgeOptions {
        metaserver: true,
        ..EdgeOptions::new("hold")
    })
    .await;
    env.wait_node_ready().await;
    let addr = env
        .edge
        .as_ref()
        .and_then(|e| e.metaserver_addr())
        .expect("the MetaServer runs");
    let first = env.create_pod(held_sleeper("first")).await;
    let second = env.create_pod(held_sleeper("second")).await;
    let uids = [&first, &second].map(|p| p.metadata.uid.clone().expect("a uid"));

    // Held: Pending with the HeldUpgrade condition, nothing in the runtime.
    for name in ["first", "second"] {
        let pod = env
            .wait_pod(name, "the HeldUpgrade condition", held_condition)
            .await;
        assert_eq!(pod["status"]["phase"], "Pending", "{:#}", pod["status"]);
        let c = condition(&pod, "HeldUpgrade");
        assert_eq!(
            c["message"],
            "Upgrade is currently held due to edge-hold-upgrade annotation"
        );
        assert!(c["lastTransitionTime"].is_string(), "{c}");
    }
    let cri = env.cri().await;
    // Long enough for edged to have pulled and started them, were they not held.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for uid in &uids {
        let (containers, sandboxes) = runtime_objects(&cri, uid).await;
        assert!(
            containers.is_empty() && sandboxes.is_empty(),
            "a held pod has nothing in the runtime: {containers:?} {sandboxes:?}"
        );
    }
    let ns = &env.ns;
    let (code, message) = unhold(addr, "/api/v1/pods/unhold-upgrade", &format!("{ns}/nope")).await;
    assert_eq!(code, 404, "{message}");

    // One pod released by name: it runs, the other stays held.
    let (code, message) = unhold(addr, "/api/v1/pods/unhold-upgrade", &format!("{ns}/first")).await;
    assert_eq!(code, 200, "{message}");
    assert!(message.contains("released"), "{message}");
    let running = env.wait_running("first").await;
    let c = condition(&running, "HeldUpgrade");
    assert_eq!(
        (&c["status"], &c["reason"]),
        (&json!("False"), &json!("HoldUpgradeReleased"))
    );
    let (containers, sandboxes) = runtime_objects(&cri, &uids[1]).await;
    assert!(
        containers.is_empty() && sandboxes.is_empty(),
        "the other pod stays held"
    );
    // A running pod is no longer held: the edge's copy says Running and unhold refuses.
    let refused = wait_for("unhold refusing the running pod", WAIT, || async {
        let (code, message) =
            unhold(addr, "/api/v1/pods/unhold-upgrade", &format!("{ns}/first")).await;
        (code == 400).then_some(message)
    })
    .await;
    assert!(
        refused.contains("is not Pending (phase Running)"),
        "{refused}"
    );

    // The rest, node-wide.
    let (code, message) = unhold(addr, "/api/v1/nodes/unhold-upgrade", "another-node").await;
    assert_eq!(code, 404, "{message}");
    let (code, message) = unhold(addr, "/api/v1/nodes/unhold-upgrade", &env.node).await;
    assert_eq!(code, 200, "{message}");
    assert!(message.contains(&format!("{ns}/second")), "{message}");
    env.wait_running("second").await;
    env.finish().await;
}
