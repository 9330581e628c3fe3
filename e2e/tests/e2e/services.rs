//! Services at the edge (edgemesh) on real containerd with bridge networking: pods resolve
//! Services by name through the edge's DNS server and reach them by name and ClusterIP through
//! the rules edgecore programs — also while the cloud is away, following a backend that
//! restarted with a new IP; headless and UDP Services; a Service whose backends run on
//! another edge node, relayed through cloudcore; bad DNS input.
//!
//! Each test edge has its own DNS address (169.254.96.x) and chain prefix, removed at the end.
//! Needs root (iptables, addresses on `lo`); prints SKIPPED otherwise.

use e2e::edge::{EdgeEnv, EdgeOptions, MeshOptions, WAIT, wait_for};
use e2e::images::BUSYBOX_IMAGE;
use e2e::pod_probe;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use std::time::Duration;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED: edgemesh needs root (iptables, an address on lo)");
        return false;
    }
    true
}

/// Removes the mesh's chains and address when the test ends, however it ends.
struct MeshCleanup(MeshOptions);
impl Drop for MeshCleanup {
    fn drop(&mut self) {
        self.0.cleanup();
    }
}

async fn mesh_env(prefix: &str, mesh: &MeshOptions) -> EdgeEnv {
    let env = EdgeEnv::start_with(EdgeOptions {
        mesh: Some(mesh.clone()),
        ..EdgeOptions::new(prefix)
    })
    .await;
    env.wait_node_ready().await;
    env
}

/// A busybox httpd answering `/` with its pod name, labelled `app=<app>`, port `http` 8080.
fn web_pod(name: &str, app: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", format!("mkdir -p /www && echo {name} > /www/index.html && exec httpd -f -p 8080 -h /www")],
                "ports": [{"name": "http", "containerPort": 8080}]}]},
    })
}

/// A pod running `script` (rounds of probes, see [`pod_probe`]) with `env` variables.
fn probe_pod(name: &str, script: &str, env: &[(&str, &str)]) -> Value {
    let env: Vec<Value> = env
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    json!({
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script], "env": env}]},
    })
}

async fn create_service(env: &EdgeEnv, spec: Value) -> Service {
    let mut svc = spec;
    svc["apiVersion"] = json!("v1");
    svc["kind"] = json!("Service");
    let svc: Service = serde_json::from_value(svc).expect("a Service");
    Api::<Service>::namespaced(env.cluster.client(), &env.ns)
        .create(&PostParams::default(), &svc)
        .await
        .expect("service created")
}

fn cluster_ip(svc: &Service) -> String {
    svc.spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .expect("a ClusterIP")
}

fn log_of(env: &EdgeEnv, pod: &str, uid: &str) -> String {
    pod_probe::container_log(&env.dir.path().join("pod-logs"), &env.ns, pod, uid, "main")
}

/// Waits for a round of `name` after round `after` that succeeded with output containing
/// `want`; returns its round.
async fn wait_round(
    env: &EdgeEnv,
    pod: &str,
    uid: &str,
    name: &str,
    after: u64,
    want: &str,
) -> u64 {
    wait_for(
        &format!("{pod}: a successful {name:?} round after {after} printing {want:?}"),
        WAIT,
        || async {
            pod_probe::since(&log_of(env, pod, uid), name, after)
                .into_iter()
                .find(|r| r.rc == 0 && r.output.contains(want))
                .map(|r| r.round)
        },
    )
    .await
}

fn last_round(env: &EdgeEnv, pod: &str, uid: &str) -> u64 {
    pod_probe::rounds(&log_of(env, pod, uid))
        .last()
        .map(|r| r.round)
        .unwrap_or(0)
}

/// The pod's sandbox IDs on the node, to kill them (a "reboot" of one pod).
async fn stop_sandboxes(env: &EdgeEnv, uid: &str) {
    use edgecore::cri::api;
    let cri = env.cri().await;
    let mut rt = cri.runtime();
    let list = rt
        .list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: std::collections::HashMap::from([(
                    "io.kubernetes.pod.uid".to_string(),
                    uid.to_string(),
                )]),
                ..Default::default()
            }),
        })
        .await
        .expect("ListPodSandbox")
        .into_inner();
    for s in list.items {
        rt.stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: s.id,
        })
        .await
        .expect("StopPodSandbox");
    }
}

const CLIENT_SCRIPT: &str = "i=0; while true; do i=$((i+1)); \
    nslookup web.$NS.svc.cluster.local 2>&1; echo \"@@ $i dns $?\"; \
    timeout 3 wget -q -O - http://web/ 2>&1; echo \"@@ $i name $?\"; \
    timeout 3 wget -q -O - http://$CIP/ 2>&1; echo \"@@ $i ip $?\"; \
    sleep 0.3; done";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_reaches_a_service_by_name_and_cluster_ip_online_and_offline() {
    if !root() {
        return;
    }
    let mesh = MeshOptions::unique();
    let _cleanup = MeshCleanup(mesh.clone());
    let env = mesh_env("svc", &mesh).await;
    let ns = env.ns.clone();

    let web1 = env.create_pod(web_pod("web-1", "web")).await;
    env.wait_running("web-1").await;
    let svc = create_service(
        &env,
        json!({"metadata": {"name": "web"},
               "spec": {"selector": {"app": "web"},
                        "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
    )
    .await;
    let cip = cluster_ip(&svc);
    let client = env
        .create_pod(probe_pod(
            "client",
            CLIENT_SCRIPT,
            &[("NS", ns.as_str()), ("CIP", cip.as_str())],
        ))
        .await;
    let uid = client.metadata.uid.clone().expect("a uid");
    env.wait_running("client").await;

    // The name resolves through the edge's DNS (search path and ndots:5 from edged), and
    // the Service answers by name and by ClusterIP.
    wait_round(&env, "client", &uid, "dns", 0, &cip).await;
    wait_round(&env, "client", &uid, "name", 0, "web-1").await;
    wait_round(&env, "client", &uid, "ip", 0, "web-1").await;

    // A second backend: traffic reaches it too.
    env.create_pod(web_pod("web-2", "web")).await;
    env.wait_running("web-2").await;
    let now = last_round(&env, "client", &uid);
    wait_round(&env, "client", &uid, "name", now, "web-2").await;

    // Offline: both backends restart with new sandboxes (new IPs); the Service follows
    // them from what edged reports, without the cloud.
    env.link.freeze();
    env.wait_edge_link(false).await;
    let web2 = env
        .pods()
        .get("web-2")
        .await
        .expect("web-2")
        .metadata
        .uid
        .expect("a uid");
    let web1_uid = web1.metadata.uid.clone().expect("a uid");
    stop_sandboxes(&env, &web1_uid).await;
    stop_sandboxes(&env, &web2).await;
    let after = last_round(&env, "client", &uid) + 1;
    for (round, want) in [("name", "web-1"), ("name", "web-2"), ("ip", "web-1")] {
        wait_round(&env, "client", &uid, round, after, want).await;
    }
    let r = wait_round(&env, "client", &uid, "dns", after, &cip).await;
    assert!(r > after);
    env.link.thaw();
    env.wait_edge_link(true).await;

    // The edge's metrics count what it did.
    let mesh_metrics = env
        .edge
        .as_ref()
        .and_then(|e| e.mesh())
        .map(|m| {
            let mut r = prometheus_client::registry::Registry::default();
            m.register_metrics(&mut r);
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &r).expect("metrics encode");
            out
        })
        .expect("edgemesh runs");
    assert!(
        mesh_metrics.contains("edgemesh_rule_syncs_total{result=\"applied\"}"),
        "{mesh_metrics}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    env.finish().await;
}
