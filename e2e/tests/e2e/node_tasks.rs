//! KubeEdge's node tasks (`operations.kubeedge.io/v1alpha2` ImagePrePullJob) end to end:
//! cloudcore's task manager and edgecore's on real containerd — images pulled through CRI,
//! per-node and per-image results in the job's status, KubeEdge's refusals (a node that does
//! not exist, images that cannot be pulled, a reference built to reach a shell) — and a
//! KubeEdge-shaped raw edge against our cloud, in KubeEdge v1.23's message shapes.

use e2e::channel::{Pki, RawEdge};
use e2e::cloud::CloudFixture;
use e2e::edge::{EdgeEnv, WAIT, init_logs, node_name, wait_for};
use e2e::images::{LayerBuilder, OciImage, repository_and_tag};
use edgecore::cri::api;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kubeedge_shared::{Group, Message, Operation};
use serde_json::{Value, json};
use std::time::Duration;

const CRDS_YAML: &str = include_str!("../../../manifests/crds/operations-crds.yaml");

fn jobs(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &cloudcore::controller::nodetask::image_prepull_resource(),
    )
}

async fn install(client: &kube::Client) {
    e2e::crds::install(
        client,
        CRDS_YAML,
        &[cloudcore::controller::nodetask::image_prepull_resource()],
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
    use k8s_openapi::api::core::v1::Node;
    e2e::sim_edge::edge_node(cluster, name).await;
    Api::<Node>::all(cluster.client())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"conditions": [{"type": "Ready", "status": "True",
                "reason": "EdgeReady", "lastHeartbeatTime": "2026-11-27T12:00:00Z",
                "lastTransitionTime": "2026-11-27T12:00:00Z"}]}}),
            ),
        )
        .await
        .expect("node ready");
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
async fn a_kubeedge_edge_runs_our_image_pre_pull_job_in_kubeedges_shapes() {
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
    let deadline = tokio::time::Instant::now() + WAIT;
    let task = loop {
        assert!(tokio::time::Instant::now() < deadline, "no task message");
        if let Ok(Some(m)) = edge.recv(Duration::from_millis(500)).await {
            if m.route.resource == resource {
                break m;
            }
            if m.route.group == Group::Resource && m.route.operation != Operation::Response {
                edge.ack(&m).await.unwrap();
            }
        }
    };
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
    drop(edge);
    delete_node(&cluster, &node).await;
}

fn config_jobs(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &cloudcore::controller::nodetask::config_update_resource(),
    )
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
            cloudcore::controller::nodetask::image_prepull_resource(),
            cloudcore::controller::nodetask::config_update_resource(),
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
    assert!(!edgecore::taskmanager::config_update::marker_path(&path).exists());

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
