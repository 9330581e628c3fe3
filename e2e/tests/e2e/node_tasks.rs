//! KubeEdge's node tasks (`operations.kubeedge.io/v1alpha2`) end to end: cloudcore's task
//! manager and edgecore's — ImagePrePullJobs on real containerd (per-node and per-image results,
//! KubeEdge's refusals), ConfigUpdateJobs and NodeUpgradeJobs against the edgecore binary
//! (restarts, roll-backs, confirmation through the MetaServer, shell payloads refused) — and a
//! KubeEdge-shaped raw edge against our cloud, in KubeEdge v1.23's message shapes.

use cloudcore::controller::Kind;
use e2e::channel::{Pki, RawEdge};
use e2e::cloud::CloudFixture;
use e2e::edge::{EdgeEnv, WAIT, init_logs, node_name, wait_for};
use e2e::images::{LayerBuilder, OciImage, repository_and_tag};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kubeedge_edged::cri::api;
use kubeedge_shared::{Group, Message, Operation};
use serde_json::{Value, json};
use std::time::Duration;

const CRDS_YAML: &str = include_str!("../../../manifests/crds/operations-crds.yaml");

fn jobs(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &Kind::ImagePrePullJob.api_resource())
}

async fn install(client: &kube::Client) {
    e2e::crds::install(
        client,
        CRDS_YAML,
        &[
            Kind::ImagePrePullJob.api_resource(),
            Kind::NodeUpgradeJob.api_resource(),
        ],
    )
    .await
    .expect("operations CRDs");
}

fn job(name: &str, template: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "operations.kubeedge.io/v1alpha2", "kind": "ImagePrePullJob",
        "metadata": {"name": name, "labels": {"e2e.kubeedge-rs/test": "true"}},
        "spec": {"imagePrePullTemplate": template}
    }))
    .expect("job object")
}

/// The job once its phase is final.
async fn finished(client: &kube::Client, name: &str) -> Value {
    let api = jobs(client);
    let mut last = Value::Null;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(Some(j)) = api.get_opt(name).await {
            last = serde_json::to_value(j).unwrap_or_default();
            if matches!(
                last["status"]["phase"].as_str(),
                Some("Completed" | "Failure")
            ) {
                return last;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job {name} not finished: {last}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An edge Node `name` that reports Ready (node tasks go only to ready edge nodes).
async fn ready_edge_node(cluster: &e2e::cluster::TestCluster, name: &str) {
    e2e::sim_edge::edge_node(cluster, name).await;
    mark_ready(&cluster.client(), name).await;
}

/// Node `name` Ready as of now (an edge without edged sends no node status of its own).
async fn mark_ready(client: &kube::Client, name: &str) {
    use k8s_openapi::api::core::v1::Node;
    // Now: a heartbeat from the past would be a lapsed node to the cloud's node lifecycle.
    let now = k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now())
        .to_string();
    Api::<Node>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"conditions": [{"type": "Ready", "status": "True",
                "reason": "EdgeReady", "lastHeartbeatTime": now,
                "lastTransitionTime": now}]}}),
            ),
        )
        .await
        .expect("node ready");
}

/// The task message for `resource` the raw edge receives (acknowledging resource messages
/// meanwhile), within [`WAIT`].
async fn task_message(edge: &mut RawEdge, resource: &str) -> Message {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no task message for {resource}"
        );
        if let Ok(Some(m)) = edge.recv(Duration::from_millis(500)).await {
            if m.route.resource == resource {
                return m;
            }
            if m.route.group == Group::Resource && m.route.operation != Operation::Response {
                edge.ack(&m).await.unwrap();
            }
        }
    }
}

fn node_status<'a>(job: &'a Value, node: &str) -> &'a Value {
    job["status"]["nodeStatus"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["nodeName"] == node))
        .unwrap_or_else(|| panic!("no status of {node} in {job}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn image_pre_pull_jobs_pull_on_the_edge_and_report_per_node_and_image() {
    let (containerd, env) = EdgeEnv::start_on_own_containerd("prepull").await;
    let client = env.cluster.client();
    install(&client).await;
    let cri = env.cri().await;
    // An image only the registry has.
    let suffix = format!("{:08x}", rand::random::<u32>());
    let wanted = format!("localhost:5000/prepull-{suffix}:1");
    let mut layer = LayerBuilder::new();
    layer
        .file("prepulled", 0o644, suffix.as_bytes())
        .expect("layer entry");
    let image = OciImage::from_layers(vec![layer.finish().expect("layer")], &["/prepulled"], &[]);
    let (repository, tag) = repository_and_tag(&wanted);
    tokio::task::block_in_place(|| containerd.registry().push(&image, repository, tag))
        .expect("push");
    let present = |reference: String| {
        let mut cri = cri.image();
        async move {
            cri.image_status(api::ImageStatusRequest {
                image: Some(api::ImageSpec {
                    image: reference,
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
            .ok()
            .and_then(|r| r.into_inner().image)
            .is_some()
        }
    };
    assert!(!present(wanted.clone()).await, "not on the edge yet");

    // A job that succeeds: the image is on the edge afterwards.
    let good = format!("prepull-ok-{suffix}");
    jobs(&client)
        .create(
            &PostParams::default(),
            &job(
                &good,
                json!({"images": [wanted], "nodeNames": [env.node],
                "checkItems": [], "concurrency": 1, "retryTimes": 1, "timeoutSeconds": 120}),
            ),
        )
        .await
        .expect("create job");
    let done = finished(&client, &good).await;
    assert_eq!(done["status"]["phase"], "Completed", "{done}");
    let node = node_status(&done, &env.node);
    assert_eq!(node["phase"], "Successful", "{done}");
    let flow: Vec<&str> = node["actionFlow"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["action"].as_str())
        .collect();
    assert_eq!(flow, ["Check", "Pull"], "{done}");
    assert_eq!(
        node["imageStatus"],
        json!([{"image": wanted, "status": "True"}])
    );
    assert!(present(wanted.clone()).await, "pulled through CRI");

    // A job that fails: a node that does not exist, an image no registry has, and a
    // reference made to reach a shell (refused before the runtime sees it).
    let bad = format!("prepull-bad-{suffix}");
    let missing = format!("localhost:5000/prepull-missing-{suffix}:1");
    let injected = "busybox;touch${IFS}/tmp/kubeedge-rs-pwned";
    let ghost = format!("no-such-node-{suffix}");
    jobs(&client)
        .create(
            &PostParams::default(),
            &job(
                &bad,
                json!({"images": [missing, injected], "nodeNames": [env.node, ghost],
                "failureTolerate": "0.1", "concurrency": 2, "retryTimes": 0}),
            ),
        )
        .await
        .expect("create job");
    let done = finished(&client, &bad).await;
    assert_eq!(done["status"]["phase"], "Failure", "{done}");
    assert!(
        done["status"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("2/2"),
        "{done}"
    );
    let ghost_status = node_status(&done, &ghost);
    assert_eq!(ghost_status["phase"], "Failure");
    assert!(
        ghost_status["reason"]
            .as_str()
            .unwrap_or_default()
            .starts_with("failed to get node"),
        "{done}"
    );
    let node = node_status(&done, &env.node);
    assert_eq!(node["phase"], "Failure", "{done}");
    assert_eq!(
        node["reason"], "there were some failures when pulling images",
        "{done}"
    );
    let images = node["imageStatus"].as_array().expect("image statuses");
    assert_eq!(images.len(), 2, "{done}");
    assert_eq!(images[0]["status"], "False");
    assert_eq!(images[1]["status"], "False");
    assert_eq!(images[1]["reason"], "invalid image reference");
    assert!(!std::path::Path::new("/tmp/kubeedge-rs-pwned").exists());
    for name in [good, bad] {
        let _ = jobs(&client).delete(&name, &DeleteParams::default()).await;
    }
    env.finish().await;
    drop(containerd);
}

/// The messages a KubeEdge edge sees for an ImagePrePullJob, and its reports written back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kubeedge_edge_runs_our_pre_pull_and_upgrade_jobs_in_kubeedges_shapes() {
    use e2e::sim_edge::delete_node;
    init_logs();
    let cluster = e2e::cluster::connect().await.expect("test cluster");
    let client = cluster.client();
    install(&client).await;
    let pki = Pki::new().expect("test PKI");
    let cloud = CloudFixture::start(client.clone(), &pki)
        .await
        .expect("cloudcore starts");
    let node = node_name("ke-prepull");
    ready_edge_node(&cluster, &node).await;
    let tls = pki.edge_tls(&pki.node_cert(&node).unwrap()).unwrap();
    let mut edge = RawEdge::connect(cloud.hub.local_addr(), &node, tls)
        .await
        .expect("connects");
    let name = format!("ke-prepull-{:08x}", rand::random::<u32>());
    jobs(&client)
        .create(
            &PostParams::default(),
            &job(
                &name,
                json!({"images": ["nginx:1.27"], "nodeNames": [node],
                "checkItems": ["disk"], "imageSecrets": "default/regcred", "retryTimes": 1}),
            ),
        )
        .await
        .expect("create job");
    let resource = format!("operations.kubeedge.io/v1alpha2/imageprepulljob/{name}/node/{node}");
    let task = task_message(&mut edge, &resource).await;
    assert_eq!(task.route.source, "taskmanager");
    assert_eq!(task.route.group.to_string(), "taskmanager");
    assert_eq!(task.route.operation.to_string(), "Check");
    assert_eq!(
        task.content["imagePrePullTemplate"]["images"],
        json!(["nginx:1.27"])
    );
    assert_eq!(
        task.content["imagePrePullTemplate"]["imageSecrets"],
        "default/regcred"
    );
    // The job shows the node in progress.
    wait_for("node InProgress", WAIT, || {
        let api = jobs(&client);
        let (name, node) = (name.clone(), node.clone());
        async move {
            let j = serde_json::to_value(api.get(&name).await.ok()?).ok()?;
            (node_status(&j, &node)["phase"] == "InProgress").then_some(())
        }
    })
    .await;
    // KubeEdge v1.23's reports: one per action.
    let report = |action: &str, extend: &str| {
        Message::new(
            "websocket",
            Group::Hub,
            Operation::from("UpdateNodeActionStatus"),
            resource.clone(),
            json!({"action": action, "succ": true, "finishTime": "2026-11-27T12:00:01Z",
                "reason": "", "extend": extend}),
        )
    };
    edge.send(&report("Check", "")).await.unwrap();
    edge.send(&report(
        "Pull",
        r#"[{"image":"nginx:1.27","status":"True"}]"#,
    ))
    .await
    .unwrap();
    let done = finished(&client, &name).await;
    assert_eq!(done["status"]["phase"], "Completed", "{done}");
    let n = node_status(&done, &node);
    assert_eq!(n["phase"], "Successful");
    assert_eq!(n["actionFlow"][0]["time"], "2026-11-27T12:00:01Z");
    assert_eq!(
        n["imageStatus"],
        json!([{"image": "nginx:1.27", "status": "True"}])
    );
    // A report for another node's task over this link is refused.
    let other = format!("operations.kubeedge.io/v1alpha2/imageprepulljob/{name}/node/someone-else");
    let mut forged = report("Pull", "[]");
    forged.route.resource = other;
    edge.send(&forged).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = serde_json::to_value(jobs(&client).get(&name).await.unwrap()).unwrap();
    assert_eq!(still["status"], done["status"]);
    let _ = jobs(&client).delete(&name, &DeleteParams::default()).await;

    // A NodeUpgradeJob in KubeEdge's shapes: the spec as sent, v1.23's reports (no finishTime
    // in some), versions from `extend`.
    mark_ready(&client, &node).await;
    let upgrades = upgrade_jobs(&client);
    let up = format!("ke-upgrade-{:08x}", rand::random::<u32>());
    let job: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "operations.kubeedge.io/v1alpha2", "kind": "NodeUpgradeJob",
        "metadata": {"name": up, "labels": {"e2e.kubeedge-rs/test": "true"}},
        "spec": {"version": "v1.23.1", "image": "kubeedge/installation-package",
                 "nodeNames": [node], "requireConfirmation": true, "timeoutSeconds": 300}
    }))
    .unwrap();
    upgrades
        .create(&PostParams::default(), &job)
        .await
        .expect("create NodeUpgradeJob");
    let resource = format!("operations.kubeedge.io/v1alpha2/nodeupgradejob/{up}/node/{node}");
    let task = task_message(&mut edge, &resource).await;
    assert_eq!(task.route.operation.to_string(), "Check");
    assert_eq!(task.content["version"], "v1.23.1");
    assert_eq!(task.content["requireConfirmation"], true);
    let step = |action: &str, extend: &str| {
        Message::new(
            "websocket",
            Group::Hub,
            Operation::from("UpdateNodeActionStatus"),
            resource.clone(),
            json!({"action": action, "succ": true, "reason": "", "extend": extend}),
        )
    };
    for (action, extend) in [
        ("Check", ""),
        ("WaitingConfirmation", ""),
        ("BackUp", "v1.22.1,v1.23.1"),
        ("Upgrade", "v1.22.1,v1.23.1"),
    ] {
        edge.send(&step(action, extend)).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    let done = loop {
        let j = serde_json::to_value(upgrades.get(&up).await.unwrap()).unwrap();
        if j["status"]["phase"] == "Completed" {
            break j;
        }
        assert!(tokio::time::Instant::now() < deadline, "{j}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let n = node_status(&done, &node);
    assert_eq!(n["phase"], "Successful", "{done}");
    assert_eq!(n["currentVersion"], "v1.23.1", "{done}");
    assert_eq!(n["historicVersion"], "v1.22.1", "{done}");
    assert_eq!(n["actionFlow"].as_array().map(Vec::len), Some(4), "{done}");
    let _ = upgrades.delete(&up, &DeleteParams::default()).await;
    drop(edge);
    delete_node(&cluster, &node).await;
}

fn config_jobs(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &Kind::ConfigUpdateJob.api_resource())
}

/// A ConfigUpdateJob against the real edgecore binary: a setting changed with a restart; a
/// change that loses the cloud rolled back; a shell payload refused at the check.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn config_update_jobs_change_edgecore_yaml_and_roll_back_when_the_cloud_is_lost() {
    use e2e::process::LoggedProcess;
    use e2e::sim_edge::delete_node;
    init_logs();
    let cluster = e2e::cluster::connect().await.expect("test cluster");
    let client = cluster.client();
    e2e::crds::install(
        &client,
        CRDS_YAML,
        &[
            Kind::ImagePrePullJob.api_resource(),
            Kind::ConfigUpdateJob.api_resource(),
        ],
    )
    .await
    .expect("operations CRDs");
    let pki = Pki::new().expect("test PKI");
    let cloud = CloudFixture::start(client.clone(), &pki)
        .await
        .expect("cloudcore starts");
    let node = node_name("cfg-update");
    ready_edge_node(&cluster, &node).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let cert = pki.node_cert(&node).expect("edge certificate");
    std::fs::write(d.join("ca.crt"), &pki.ca.cert.cert_pem).unwrap();
    std::fs::write(d.join("edge.crt"), &cert.cert_pem).unwrap();
    std::fs::write(d.join("edge.key"), &cert.key_pem).unwrap();
    let server = cloud.hub.local_addr().to_string();
    let yaml = format!(
        "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\n\
         database:\n  dataSource: {d}/edgecore.db\n\
         modules:\n  edgeHub:\n    heartbeat: 1\n    tlsCaFile: {d}/ca.crt\n    tlsCertFile: {d}/edge.crt\n    tlsPrivateKeyFile: {d}/edge.key\n\
         \x20   websocket:\n      server: {server}\n\
         \x20 edged:\n    enable: false\n    hostnameOverride: {node}\n\
         \x20 deviceTwin:\n    dmiSockPath: {d}\n\
         \x20 taskManager:\n    enable: true\n",
        d = d.display(),
    );
    let path = d.join("edgecore.yaml");
    std::fs::write(&path, yaml).unwrap();
    let bin = e2e::devices::workspace_binary("edgecore", "edgecore").expect("edgecore binary");
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("--config").arg(&path).env("RUST_LOG", "info");
    let mut edge = LoggedProcess::spawn("edgecore", cmd, d).expect("edgecore runs");
    wait_for("the edge connected", WAIT, || async {
        cloud.hub.is_connected(&node).then_some(())
    })
    .await;
    let loaded = || edgecore::config::EdgeCoreConfig::load(&path).expect("edgecore.yaml loads");
    let suffix = format!("{:08x}", rand::random::<u32>());
    let create = |name: String, fields: Value, timeout: u64| {
        let api = config_jobs(&client);
        let node = node.clone();
        async move {
            let job: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "operations.kubeedge.io/v1alpha2", "kind": "ConfigUpdateJob",
                "metadata": {"name": name, "labels": {"e2e.kubeedge-rs/test": "true"}},
                "spec": {"nodeNames": [node], "updateFields": fields, "timeoutSeconds": timeout}
            }))
            .unwrap();
            api.create(&PostParams::default(), &job)
                .await
                .expect("create ConfigUpdateJob");
        }
    };
    let finished_config = |name: String| {
        let api = config_jobs(&client);
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
            loop {
                let j = serde_json::to_value(api.get(&name).await.unwrap()).unwrap();
                if matches!(j["status"]["phase"].as_str(), Some("Completed" | "Failure")) {
                    return j;
                }
                assert!(tokio::time::Instant::now() < deadline, "job {name}: {j}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let actions = |job: &Value| -> Vec<String> {
        node_status(job, &node)["actionFlow"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["action"].as_str().map(str::to_string))
            .collect()
    };

    // 1. A setting changed: the edge restarts with it and says so.
    let ok = format!("cfg-ok-{suffix}");
    create(ok.clone(), json!({"modules.edgeHub.heartbeat": "7"}), 60).await;
    let done = finished_config(ok.clone()).await;
    assert_eq!(done["status"]["phase"], "Completed", "{done}");
    assert_eq!(actions(&done), ["Check", "BackUp", "Update"], "{done}");
    assert_eq!(loaded().modules.edge_hub.heartbeat, 7);
    assert!(!edgecore::taskmanager::config_update_marker(&path).exists());

    // 2. A shell payload: refused at the check, nothing changes, no restart.
    let bad = format!("cfg-bad-{suffix}");
    create(
        bad.clone(),
        json!({"modules.edgeHub.heartbeat": "5;touch${IFS}/tmp/kubeedge-rs-cfg-pwned"}),
        60,
    )
    .await;
    let done = finished_config(bad.clone()).await;
    assert_eq!(done["status"]["phase"], "Failure", "{done}");
    assert_eq!(actions(&done), ["Check"], "{done}");
    assert!(
        node_status(&done, &node)["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("expected an integer"),
        "{done}"
    );
    assert_eq!(loaded().modules.edge_hub.heartbeat, 7);
    assert!(!std::path::Path::new("/tmp/kubeedge-rs-cfg-pwned").exists());

    // 3. A change that loses the cloud: rolled back after half the time-out (10 s).
    let lost = format!("cfg-lost-{suffix}");
    create(
        lost.clone(),
        json!({"modules.edgeHub.websocket.server": "127.0.0.1:1"}),
        20,
    )
    .await;
    let done = finished_config(lost.clone()).await;
    assert_eq!(done["status"]["phase"], "Failure", "{done}");
    assert_eq!(actions(&done), ["Check", "BackUp", "RollBack"], "{done}");
    assert!(
        node_status(&done, &node)["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("did not reach the cloud"),
        "{done}"
    );
    assert_eq!(loaded().modules.edge_hub.websocket.server, server);
    assert!(cloud.hub.is_connected(&node));
    assert!(edge.is_running(), "the same process, re-executed");

    for name in [ok, bad, lost] {
        let _ = config_jobs(&client)
            .delete(&name, &DeleteParams::default())
            .await;
    }
    drop(edge);
    delete_node(&cluster, &node).await;
}

fn upgrade_jobs(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &Kind::NodeUpgradeJob.api_resource())
}

/// `POST path` to the edge's MetaServer (plain HTTP on loopback): status and body.
async fn post_metaserver(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::time::timeout(WAIT, tokio::net::TcpStream::connect(addr))
        .await
        .expect("MetaServer answers in time")
        .expect("MetaServer reachable");
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.expect("request sent");
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut out))
        .await
        .expect("MetaServer answer in time")
        .expect("MetaServer answer");
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

/// NodeUpgradeJobs against the real edgecore binary, run from a copy in a temporary directory:
/// a new build taken from an image in the harness registry, swapped in and re-executed; job
/// fields built to reach a shell and a wrong digest refused at the check; and an upgrade that
/// waits for its confirmation through the MetaServer and is rolled back when the new binary
/// cannot reach the cloud.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_upgrade_jobs_swap_the_binary_and_roll_back_when_the_cloud_is_lost() {
    use e2e::process::LoggedProcess;
    use e2e::sim_edge::delete_node;
    let digest = |data: &[u8]| -> String {
        use sha2::Digest;
        sha2::Sha256::digest(data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    init_logs();
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let registry = match e2e::registry::Registry::start(&d.join("registry")) {
        Ok(r) => r,
        Err(e2e::registry::RegistryError::NotInstalled) => {
            eprintln!(
                "skipped: {} is missing (scripts/setup.sh installs docker-registry)",
                e2e::registry::REGISTRY_BINARY
            );
            return;
        }
        Err(e) => panic!("registry: {e}"),
    };
    let cluster = e2e::cluster::connect().await.expect("test cluster");
    let client = cluster.client();
    e2e::crds::install(&client, CRDS_YAML, &[Kind::NodeUpgradeJob.api_resource()])
        .await
        .expect("operations CRDs");
    let pki = Pki::new().expect("test PKI");
    let cloud = CloudFixture::start(client.clone(), &pki)
        .await
        .expect("cloudcore starts");
    let proxy = e2e::wire_proxy::CountingProxy::start(cloud.hub.local_addr())
        .await
        .expect("link proxy");
    let node = node_name("upgrade");

    // Three builds of edgecore: the one running, and two "new" ones (the same program with a
    // different trailer, which the ELF loader ignores: other files, other digests).
    let original = std::fs::read(
        e2e::devices::workspace_binary("edgecore", "edgecore").expect("edgecore binary"),
    )
    .expect("edgecore readable");
    let build = |n: u8| {
        let mut b = original.clone();
        b.extend_from_slice(format!("\nkubeedge-rs e2e upgrade build {n}\n").as_bytes());
        b
    };
    let (build2, build3) = (build(2), build(3));
    let repository = "kubeedge-rs/edgecore-package";
    for (bin, tag) in [(&build2, "v9.9.2"), (&build3, "v9.9.3")] {
        let mut layer = LayerBuilder::new();
        layer
            .dir("usr", 0o755)
            .and_then(|l| l.dir("usr/local", 0o755))
            .and_then(|l| l.dir("usr/local/bin", 0o755))
            .and_then(|l| l.file("usr/local/bin/edgecore", 0o755, bin))
            .expect("layer entries");
        let image = OciImage::from_layers(
            vec![layer.finish().expect("layer")],
            &["/usr/local/bin/edgecore"],
            &[],
        );
        tokio::task::block_in_place(|| registry.push(&image, repository, tag)).expect("push");
    }
    let image = format!("{}/{repository}", registry.host());

    let bin_dir = d.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let exe = bin_dir.join("edgecore");
    std::fs::write(&exe, &original).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let cert = pki.node_cert(&node).expect("edge certificate");
    std::fs::write(d.join("ca.crt"), &pki.ca.cert.cert_pem).unwrap();
    std::fs::write(d.join("edge.crt"), &cert.cert_pem).unwrap();
    std::fs::write(d.join("edge.key"), &cert.key_pem).unwrap();
    let meta_addr = std::net::SocketAddr::from(([127, 0, 0, 1], e2e::router::free_port()));
    let yaml = format!(
        "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\n\
         database:\n  dataSource: {d}/edgecore.db\n\
         modules:\n  edgeHub:\n    heartbeat: 1\n    tlsCaFile: {d}/ca.crt\n    tlsCertFile: {d}/edge.crt\n    tlsPrivateKeyFile: {d}/edge.key\n\
         \x20   websocket:\n      server: {server}\n\
         \x20 edged:\n    enable: false\n    hostnameOverride: {node}\n\
         \x20 deviceTwin:\n    dmiSockPath: {d}\n\
         \x20 metaManager:\n    metaServer:\n      enable: true\n      server: {meta_addr}\n\
         \x20 taskManager:\n    enable: true\n",
        d = d.display(),
        server = proxy.addr,
    );
    let config = d.join("edgecore.yaml");
    std::fs::write(&config, yaml).unwrap();
    ready_edge_node(&cluster, &node).await;
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("--config").arg(&config).env("RUST_LOG", "info");
    let mut edge = LoggedProcess::spawn("edgecore", cmd, d).expect("edgecore runs");
    wait_for("the edge connected", WAIT, || async {
        cloud.hub.is_connected(&node).then_some(())
    })
    .await;
    let exe_digest = || digest(&std::fs::read(&exe).unwrap_or_default());
    // Which build is in place, cheaply: the builds differ in their last bytes.
    let exe_tail = || {
        use std::io::{Read, Seek, SeekFrom};
        let mut tail = vec![0u8; 48];
        std::fs::File::open(&exe)
            .and_then(|mut f| {
                f.seek(SeekFrom::End(-48))?;
                f.read_exact(&mut tail)
            })
            .map(|()| tail)
            .unwrap_or_default()
    };
    let tail_of = |b: &[u8]| b[b.len() - 48..].to_vec();

    let suffix = format!("{:08x}", rand::random::<u32>());
    let create = |name: String, spec: Value| {
        let api = upgrade_jobs(&client);
        let (client, node) = (client.clone(), node.clone());
        async move {
            mark_ready(&client, &node).await;
            let mut spec = spec;
            spec["nodeNames"] = json!([node]);
            let job: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "operations.kubeedge.io/v1alpha2", "kind": "NodeUpgradeJob",
                "metadata": {"name": name, "labels": {"e2e.kubeedge-rs/test": "true"}},
                "spec": spec
            }))
            .unwrap();
            api.create(&PostParams::default(), &job)
                .await
                .expect("create NodeUpgradeJob");
        }
    };
    let get = |name: String| {
        let api = upgrade_jobs(&client);
        async move { serde_json::to_value(api.get(&name).await.expect("job")).unwrap() }
    };
    let finished_upgrade = |name: String| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
        loop {
            let j = get(name.clone()).await;
            if matches!(j["status"]["phase"].as_str(), Some("Completed" | "Failure")) {
                return j;
            }
            assert!(tokio::time::Instant::now() < deadline, "job {name}: {j}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let flow = |job: &Value| -> Vec<String> {
        node_status(job, &node)["actionFlow"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| {
                Some(format!(
                    "{}={}",
                    s["action"].as_str()?,
                    s["status"].as_str()?
                ))
            })
            .collect()
    };

    // 1. An upgrade: the new build in place, re-executed, back with the cloud.
    let up = format!("upgrade-ok-{suffix}");
    create(
        up.clone(),
        json!({"version": "v9.9.2", "image": image, "timeoutSeconds": 120}),
    )
    .await;
    let done = finished_upgrade(up.clone()).await;
    assert_eq!(done["status"]["phase"], "Completed", "{done}");
    assert_eq!(
        flow(&done),
        [
            "Check=True",
            "WaitingConfirmation=True",
            "BackUp=True",
            "Upgrade=True"
        ],
        "{done}"
    );
    assert_eq!(
        node_status(&done, &node)["currentVersion"],
        "v9.9.2",
        "{done}"
    );
    // The version the running binary reports of itself.
    let running = node_status(&done, &node)["historicVersion"].clone();
    assert!(
        running.as_str().is_some_and(|v| v.starts_with('v')),
        "{done}"
    );
    assert_eq!(exe_digest(), digest(&build2), "the new build is in place");
    assert_eq!(
        std::fs::read(d.join("upgrade-backup/edgecore")).unwrap_or_default(),
        original,
        "the previous build is kept"
    );
    assert!(cloud.hub.is_connected(&node));
    assert!(edge.is_running(), "the same process, re-executed");

    // 2. Refused at the check, nothing changed: a shell payload in the version, an image
    //    reference built to reach a shell, a digest that is not the image's.
    let pwned = "/tmp/kubeedge-rs-upgrade-pwned";
    for (n, spec, why) in [
        (
            "ver",
            json!({"version": format!("v9.9.3;touch${{IFS}}{pwned}"), "image": image}),
            "invalid version",
        ),
        (
            "img",
            json!({"version": "v9.9.3", "image": format!("$(touch {pwned})/x")}),
            "invalid image repo",
        ),
        (
            "dig",
            json!({"version": "v9.9.3", "image": image, "imageDigestGatter": {
                "amd64": format!("sha256:{}", "0".repeat(64)),
                "arm64": format!("sha256:{}", "0".repeat(64))}}),
            "digest",
        ),
    ] {
        let name = format!("upgrade-bad-{n}-{suffix}");
        create(name.clone(), spec).await;
        let done = finished_upgrade(name).await;
        assert_eq!(done["status"]["phase"], "Failure", "{done}");
        assert_eq!(flow(&done), ["Check=False"], "{done}");
        assert!(
            node_status(&done, &node)["reason"]
                .as_str()
                .unwrap_or_default()
                .contains(why),
            "{why}: {done}"
        );
    }
    assert!(!std::path::Path::new(pwned).exists());
    assert_eq!(exe_digest(), digest(&build2), "nothing changed");

    // 3. Nothing waits for confirmation: KubeEdge's 400.
    let (code, body) = post_metaserver(meta_addr, "/api/v1/taskupgrade/confirm-upgrade").await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("no valid upgrade tasks"), "{body}");

    // 4. An upgrade that waits for its confirmation, confirmed while the cloud cannot be
    //    reached by a new connection: the new build does not get through, the previous one
    //    comes back and reports the failure and the roll-back.
    let lost = format!("upgrade-lost-{suffix}");
    create(
        lost.clone(),
        json!({"version": "v9.9.3", "image": image, "requireConfirmation": true, "timeoutSeconds": 100}),
    )
    .await;
    wait_for(
        "the upgrade waits for its confirmation",
        Duration::from_secs(120),
        || {
            let lost = lost.clone();
            async move {
                let j = get(lost).await;
                let started = j["status"]["nodeStatus"][0]["phase"] == "InProgress";
                (started && flow(&j).len() == 2).then_some(())
            }
        },
    )
    .await;
    let j = get(lost.clone()).await;
    assert_eq!(flow(&j), ["Check=True", "WaitingConfirmation=True"], "{j}");
    assert_eq!(
        exe_digest(),
        digest(&build2),
        "nothing before the confirmation"
    );
    proxy.refuse_new(true);
    let (code, body) = post_metaserver(meta_addr, "/api/v1/taskupgrade/confirm-upgrade").await;
    assert_eq!(code, 200, "{body}");
    wait_for(
        "the new build in place",
        Duration::from_secs(60),
        || async { (exe_tail() == tail_of(&build3)).then_some(()) },
    )
    .await;
    wait_for(
        "the previous build back",
        Duration::from_secs(180),
        || async { (exe_tail() == tail_of(&build2)).then_some(()) },
    )
    .await;
    proxy.refuse_new(false);
    let done = finished_upgrade(lost.clone()).await;
    assert_eq!(done["status"]["phase"], "Failure", "{done}");
    assert_eq!(
        flow(&done),
        [
            "Check=True",
            "WaitingConfirmation=True",
            "BackUp=True",
            "Upgrade=False",
            "RollBack=True"
        ],
        "{done}"
    );
    assert!(
        node_status(&done, &node)["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("did not reach the cloud"),
        "{done}"
    );
    assert_eq!(
        node_status(&done, &node)["currentVersion"],
        running,
        "{done}"
    );
    assert_eq!(
        node_status(&done, &node)["historicVersion"],
        "v9.9.3",
        "{done}"
    );
    wait_for("the edge back", WAIT, || async {
        cloud.hub.is_connected(&node).then_some(())
    })
    .await;
    assert!(edge.is_running(), "the same process, re-executed twice");

    for name in upgrade_jobs(&client)
        .list(&kube::api::ListParams::default().labels("e2e.kubeedge-rs/test=true"))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|j| j.metadata.name)
        .filter(|n| n.ends_with(&suffix))
    {
        let _ = upgrade_jobs(&client)
            .delete(&name, &DeleteParams::default())
            .await;
    }
    drop(edge);
    delete_node(&cluster, &node).await;
}
