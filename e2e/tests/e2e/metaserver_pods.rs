//! Edge pods using the MetaServer with in-cluster configuration (KubeEdge v1.17+
//! `requireAuthorization`): a real edgecore creates the dummy interface, obtains its serving
//! certificate through cloudcore from the cluster's signer, and a pod on the bridge network
//! runs kubectl with nothing but its service-account volume and the injected
//! `KUBERNETES_SERVICE_HOST/PORT`. RBAC is the cluster's, decided at the edge from what the
//! cloud's policy controller sent — also while the cloud is away.

use e2e::edge::{EdgeEnv, EdgeOptions, WAIT, wait_for};
use e2e::images::BUSYBOX_IMAGE;
use e2e::pod_probe;
use serde_json::json;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The kubectl binary on this machine, when it is a static one a container can run.
fn static_kubectl() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    let found = std::env::split_paths(&path)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())?;
    let real = std::fs::canonicalize(found).ok()?;
    let elf = std::fs::read(&real).ok()?;
    // A dynamically linked binary names its interpreter; a static Go binary does not.
    let dynamic = elf.windows(b"ld-linux".len()).any(|w| w == b"ld-linux");
    (!dynamic).then_some(real)
}

fn free_dummy_address() -> SocketAddr {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(10550);
    SocketAddr::from(([169, 254, 30, 10], port))
}

fn rbac(ns: &str, name: &str, resources: &[&str]) -> Vec<serde_json::Value> {
    vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": name, "namespace": ns},
               "rules": [{"apiGroups": [""], "resources": resources, "verbs": ["get", "list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": name, "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}]}),
    ]
}

async fn apply(env: &EdgeEnv, objects: &[serde_json::Value]) {
    for o in objects {
        let out = env
            .cluster
            .kubectl_run(&["apply", "-f", "-"], Some(&o.to_string()))
            .await
            .expect("kubectl apply runs");
        assert!(out.success, "kubectl apply: {}", out.stderr);
    }
}

/// The container's log lines so far (CRI log files under the test's pod-logs dir).
fn pod_log(env: &EdgeEnv, pod: &str, uid: &str) -> String {
    pod_probe::container_log(&env.dir.path().join("pod-logs"), &env.ns, pod, uid, "main")
}

fn last(log: &str, cmd: &str) -> Option<(u64, i32, String)> {
    pod_probe::last(log, cmd).map(|r| (r.round, r.rc, r.output))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_edge_pod_reads_the_metaserver_with_its_service_account_online_and_offline() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED: the dummy interface needs root");
        return;
    }
    let Some(kubectl) = static_kubectl() else {
        println!("SKIPPED: no statically linked kubectl to run inside a container");
        return;
    };
    let dummy = free_dummy_address();
    let env = EdgeEnv::start_with(EdgeOptions {
        metaserver: true,
        metaserver_dummy: Some(dummy),
        ..EdgeOptions::new("msauth")
    })
    .await;
    env.wait_node_ready().await;
    let ns = env.ns.clone();
    apply(
        &env,
        &[json!({"apiVersion": "v1", "kind": "ServiceAccount",
                 "metadata": {"name": "reader", "namespace": ns}})],
    )
    .await;
    apply(&env, &rbac(&ns, "pod-reader", &["pods"])).await;

    // The serving certificate: issued by the cluster's signer, trusted through the CA that
    // every pod's service-account volume carries.
    let pki = env.dir.path().join("pki").join("metaserver");
    wait_for("the MetaServer's serving certificate", WAIT, || async {
        pki.join("metaserver-current.pem").exists().then_some(())
    })
    .await;

    let script = "i=0; while true; do i=$((i+1)); \
        for what in pods configmaps secrets; do /kubectl get $what -o name 2>&1; echo \"@@ $i $what $?\"; done; \
        sleep 1; done";
    let pod = env
        .create_pod(json!({
            "metadata": {"name": "incluster"},
            "spec": {"serviceAccountName": "reader", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", script],
                    "volumeMounts": [{"name": "kubectl", "mountPath": "/kubectl", "readOnly": true}]}],
                "volumes": [{"name": "kubectl", "hostPath": {"path": kubectl.to_string_lossy(), "type": "File"}}]},
        }))
        .await;
    let uid = pod.metadata.uid.clone().expect("a uid");
    env.wait_running("incluster").await;

    // Allowed: its own namespace's pods. Refused with the apiserver's words: what no rule
    // grants.
    let log = wait_for("kubectl in the pod lists pods", WAIT, || async {
        let log = pod_log(&env, "incluster", &uid);
        let (_, rc, _) = last(&log, "pods")?;
        (rc == 0 && last(&log, "secrets").is_some()).then_some(log)
    })
    .await;
    let (_, _, pods) = last(&log, "pods").unwrap();
    assert!(pods.contains("pod/incluster"), "{log}");
    let (_, rc, secrets) = last(&log, "secrets").unwrap();
    assert_ne!(rc, 0, "{log}");
    assert!(
        secrets.contains("cannot list resource \"secrets\"")
            && secrets.contains(&format!("system:serviceaccount:{ns}:reader")),
        "{log}"
    );
    let (_, rc, _) = last(&log, "configmaps").unwrap();
    assert_ne!(rc, 0, "configmaps are not granted yet: {log}");

    // A new RoleBinding reaches the edge through the cloud's policy controller.
    apply(&env, &rbac(&ns, "cm-reader", &["configmaps"])).await;
    wait_for("configmaps become readable in the pod", WAIT, || async {
        let log = pod_log(&env, "incluster", &uid);
        let (_, rc, out) = last(&log, "configmaps")?;
        (rc == 0 && out.contains("configmap/kube-root-ca.crt")).then_some(())
    })
    .await;

    // A caller without a token this edge issued is not let in.
    let ca = std::fs::read_to_string(pki.join("ca.crt")).expect("the cluster CA is stored");
    let probe = tokio::process::Command::new(&kubectl)
        .args(["--kubeconfig", "/dev/null", "--server"])
        .arg(format!("https://{dummy}"))
        .arg("--certificate-authority")
        .arg(pki.join("ca.crt"))
        .args(["--token", "not-a-token", "get", "pods", "-n", &ns])
        .output()
        .await
        .expect("kubectl runs");
    assert!(!ca.is_empty());
    let err = String::from_utf8_lossy(&probe.stderr);
    // kubectl's words for a 401.
    assert!(
        !probe.status.success() && err.contains("provide credentials"),
        "{err}"
    );

    // Offline: the pod keeps reading, with the rules and token the edge holds.
    env.link.freeze();
    env.wait_edge_link(false).await;
    let offline_from = last(&pod_log(&env, "incluster", &uid), "pods")
        .map(|r| r.0)
        .unwrap_or(0);
    wait_for(
        "the pod lists pods while the cloud is away",
        WAIT,
        || async {
            let log = pod_log(&env, "incluster", &uid);
            let (round, rc, out) = last(&log, "pods")?;
            (round > offline_from + 2 && rc == 0 && out.contains("pod/incluster")).then_some(())
        },
    )
    .await;
    let log = pod_log(&env, "incluster", &uid);
    let (_, rc, _) = last(&log, "secrets").unwrap();
    assert_ne!(rc, 0, "secrets stay forbidden offline: {log}");
    env.link.thaw();
    env.wait_edge_link(true).await;
    // Removes the namespace and the Node this edge registered (on a real cluster nothing
    // else would).
    env.finish().await;
}

/// A KubeEdge v1.17+ edge (raw messages as its metaserver certificate manager sends them)
/// against our cloudcore: `k8s/ca.crt` answers the cluster CA as a PEM string; a CSR inserted
/// as `default/certificatesigningrequest/` (client-go's `generateName`) is created, approved
/// and issued by the cluster's signer, and read back; another node's CSR is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kubeedge_edge_gets_its_metaserver_certificate_from_our_cloud() {
    use base64::Engine;
    use e2e::channel::Pki;
    use e2e::cloud::CloudFixture;
    use e2e::sim_edge::{SimEdge, unique};
    use kubeedge_shared::{Group, Message, Operation};
    e2e::edge::init_logs();
    let cluster = e2e::cluster::connect().await.expect("test cluster");
    let pki = Pki::new().expect("test PKI");
    let cloud = CloudFixture::start(cluster.client(), &pki)
        .await
        .expect("cloudcore starts");
    let node = unique("ke-csr");
    let mut edge = SimEdge::connect(&cloud, &pki, &node, &[]).await;
    let ask = |op: Operation, resource: &str, content: serde_json::Value| {
        Message::new("metamanager", Group::Meta, op, resource, content)
    };

    let ca = edge
        .request(&ask(
            Operation::Query,
            "k8s/ca.crt",
            serde_json::Value::Null,
        ))
        .await;
    assert_eq!(ca.route.operation, Operation::Response);
    assert_eq!(
        ca.content.as_str().map(str::trim),
        Some(cluster.cluster_ca_pem().trim()),
        "the cluster CA as a PEM string"
    );

    let csr_for = |cn_node: &str| {
        let ip: std::net::IpAddr = [169, 254, 30, 10].into();
        let (pem, _) = kubeedge_shared::pki::serving_csr(cn_node, &[ip]).expect("a CSR");
        json!({"metadata": {"generateName": "csr-", "creationTimestamp": null},
               "spec": {"request": base64::engine::general_purpose::STANDARD.encode(pem),
                        "signerName": "kubernetes.io/kubelet-serving",
                        "usages": ["digital signature", "key encipherment", "server auth"]},
               "status": {}})
    };
    let refused = edge
        .request(&ask(
            Operation::Insert,
            "default/certificatesigningrequest/",
            csr_for("someone-else"),
        ))
        .await;
    assert_eq!(
        refused.content["Err"]["ErrStatus"]["code"], 403,
        "{refused:?}"
    );

    let created = edge
        .request(&ask(
            Operation::Insert,
            "default/certificatesigningrequest/",
            csr_for(&node),
        ))
        .await;
    let name = created.content["Object"]["metadata"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("a created CSR: {created:?}"))
        .to_string();
    assert!(name.starts_with("csr-"), "{name}");
    let query = format!("default/certificatesigningrequest/{name}");
    let deadline = tokio::time::Instant::now() + WAIT;
    let cert = loop {
        let got = edge
            .request(&ask(Operation::Query, &query, serde_json::Value::Null))
            .await;
        if let Some(c) = got.content["status"]["certificate"].as_str() {
            break c.to_string();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} not issued: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let pem = base64::engine::general_purpose::STANDARD
        .decode(cert)
        .expect("base64");
    assert!(String::from_utf8_lossy(&pem).contains("BEGIN CERTIFICATE"));
    let _ = cluster
        .kubectl_run(&["delete", "csr", &name, "--wait=false"], None)
        .await;
}
