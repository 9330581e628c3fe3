//! Edge pods using the MetaServer with in-cluster configuration (KubeEdge v1.17+
//! `requireAuthorization`): a real edgecore creates the dummy interface, obtains its serving
//! certificate through cloudcore from the cluster's signer, and a pod on the bridge network
//! runs kubectl with nothing but its service-account volume and the injected
//! `KUBERNETES_SERVICE_HOST/PORT`. RBAC is the cluster's, decided at the edge from what the
//! cloud's policy controller sent — also while the cloud is away.

use e2e::edge::{EdgeEnv, EdgeOptions, WAIT, wait_for};
use e2e::images::BUSYBOX_IMAGE;
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
    let p = env
        .dir
        .path()
        .join("pod-logs")
        .join(format!("{}_{pod}_{uid}", env.ns))
        .join("main")
        .join("0.log");
    std::fs::read_to_string(p).unwrap_or_default()
}

/// The output of the rounds completed after line `from`: `(round, command, rc, output)`.
fn rounds(log: &str) -> Vec<(u64, String, i32, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in log.lines() {
        // `<time> <stream> <P|F> <content>`
        let content = line.splitn(4, ' ').nth(3).unwrap_or_default();
        if let Some(rest) = content.strip_prefix("@@ ") {
            let f: Vec<&str> = rest.split(' ').collect();
            if let [round, cmd, rc] = f[..] {
                out.push((
                    round.parse().unwrap_or(0),
                    cmd.to_string(),
                    rc.parse().unwrap_or(-1),
                    std::mem::take(&mut current),
                ));
            }
        } else {
            current.push_str(content);
            current.push('\n');
        }
    }
    out
}

fn last(log: &str, cmd: &str) -> Option<(u64, i32, String)> {
    rounds(log)
        .into_iter()
        .rev()
        .find(|r| r.1 == cmd)
        .map(|r| (r.0, r.2, r.3))
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
    tokio::time::sleep(Duration::from_millis(200)).await;
}
