//! edged end to end: a real edgecore (edgehub, metamanager, edged) against cloudcore's
//! cloudhub and controllers in-process, the Kubernetes API (in-memory, or `E2E_KUBECONFIG`)
//! and the private containerd of `e2e::containerd` (needs root and `scripts/setup.sh`).
//!
//! Pods are created through the API and checked through the API (status) and through CRI
//! (what really runs). Waits are generous: these tests check behaviour, not speed. Set
//! `E2E_LOG=edgecore=debug` to see edged's log.

use e2e::edge::{
    EdgeEnv, EdgeOptions, WAIT, condition, container_id, exec, runtime_objects, shared_containerd,
    wait_for,
};
use e2e::images::{BUSYBOX_DOCKER_HUB_IMAGE, BUSYBOX_IMAGE};
use e2e::node_address::node_ip;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kubeedge_edged::cri::api;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_registers_as_a_ready_edge_node_and_renews_its_lease() {
    let env = EdgeEnv::start("edged-node").await;
    let node = env.wait_node_ready().await;
    let v = serde_json::to_value(&node).unwrap();
    let labels = &v["metadata"]["labels"];
    assert_eq!(labels["node-role.kubernetes.io/edge"], "");
    assert_eq!(labels["node-role.kubernetes.io/agent"], "");
    assert_eq!(labels["kubernetes.io/hostname"], env.node.as_str());
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert!(labels["kubernetes.io/arch"].is_string());
    assert_eq!(labels["e2e.kubeedge-rs/edged"], "yes");
    let s = &v["status"];
    for r in ["cpu", "memory", "pods", "ephemeral-storage"] {
        assert!(s["capacity"][r].is_string(), "capacity.{r} in {s:#}");
        assert!(s["allocatable"][r].is_string(), "allocatable.{r} in {s:#}");
    }
    assert_eq!(s["capacity"]["pods"], "110");
    assert!(
        s["addresses"]
            .as_array()
            .unwrap()
            .contains(&json!({"type": "InternalIP", "address": node_ip().to_string()})),
        "{s:#}"
    );
    assert_eq!(s["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10350);
    assert!(
        s["nodeInfo"]["containerRuntimeVersion"]
            .as_str()
            .unwrap()
            .starts_with("containerd://"),
        "{s:#}"
    );
    for (ty, status) in [
        ("Ready", "True"),
        ("MemoryPressure", "False"),
        ("DiskPressure", "False"),
        ("PIDPressure", "False"),
    ] {
        let c = s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == ty)
            .unwrap_or_else(|| panic!("{ty} missing in {s:#}"));
        assert_eq!(c["status"], status, "{c}");
    }

    // The lease is renewed (every second with a 4 s duration): the node stays Ready past the
    // node monitor's grace period and the renew time moves. The edge and cloudcore agreed on
    // `cloud-lease`: cloudcore renews it each time it hears the edge, which sends no lease
    // message and no keepalive message (pings only).
    let hub = env.cloud().metrics.clone();
    let ctl = env.cloud().controller_metrics.clone();
    let up = |kind: &'static str| {
        hub.message_bytes
            .get_or_create(&cloudcore::metrics::FrameLabel {
                direction: "up",
                kind,
            })
            .get()
    };
    let received = |resource: &'static str| {
        hub.messages_received
            .get_or_create(&cloudcore::metrics::ResourceLabel { resource })
            .get()
    };
    let renewals = || {
        ctl.node_leases
            .renewals
            .get_or_create(&cloudcore::controller::LeaseResultLabel { result: "renewed" })
            .get()
    };
    let before = (up("keepalive"), received("lease"), renewals());
    let leases: Api<Lease> = Api::namespaced(env.cluster.client(), "kube-node-lease");
    let first = wait_for("the node lease", WAIT, || async {
        leases.get_opt(&env.node).await.ok()?
    })
    .await;
    let spec = first.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(env.node.as_str()));
    assert_eq!(spec.lease_duration_seconds, Some(4));
    let renewed = wait_for("a lease renewal", WAIT, || async {
        let l = leases.get_opt(&env.node).await.ok()??;
        (l.spec.as_ref()?.renew_time != spec.renew_time).then_some(l)
    })
    .await;
    assert!(renewed.spec.unwrap().renew_time > spec.renew_time);
    tokio::time::sleep(Duration::from_secs(5)).await;
    env.wait_node_ready().await;
    let after = (up("keepalive"), received("lease"), renewals());
    assert_eq!(
        (after.0, after.1),
        (before.0, before.1),
        "keepalive bytes and lease messages from the edge, before and after"
    );
    assert!(
        after.2 > before.2,
        "cloudcore renewed the lease: {before:?} → {after:?}"
    );

    // The cloud side marks the node Unknown (as the node lifecycle controller does when a
    // lease is late): cloudcore sends the edge its Node, the edge notices, and reports Ready
    // again (with a cloud that does not renew its lease, the edge reads its Node back every
    // sixth status period).
    let unknown = json!({"status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"},
    ]}});
    env.nodes()
        .patch_status(
            &env.node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(unknown),
        )
        .await
        .unwrap();
    env.wait_node_ready().await;
    // The cluster marked it Unknown although cloudcore renews its Lease (here by hand; in life
    // because the renewals did not get through): the edge renews the Lease itself from now on,
    // until the link ends.
    let before = received("lease");
    wait_for("the edge renewing its own lease", WAIT, || async {
        (received("lease") > before).then_some(())
    })
    .await;
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_runs_with_its_env_and_configmap_volume_and_deletion_removes_it() {
    let env = EdgeEnv::start("edged-run").await;
    let cms: Api<ConfigMap> = Api::namespaced(env.cluster.client(), &env.ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "settings"},
        "data": {"greeting": "hello from a configmap", "COLOR": "blue"},
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();

    let created = Instant::now();
    let pod = env
        .create_pod(json!({
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {
                "terminationGracePeriodSeconds": 3,
                "containers": [{
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    "command": ["sleep"],
                    "args": ["$(NAP)"],
                    "env": [
                        {"name": "NAP", "value": "3600"},
                        {"name": "LITERAL", "value": "plain-$(NAP)"},
                        {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}}},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    ],
                    "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CM_"}],
                    "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"}],
                    "ports": [{"containerPort": 8080}],
                }],
                "volumes": [{"name": "cfg", "configMap": {"name": "settings"}}],
            },
        }))
        .await;
    let uid = pod.metadata.uid.clone().unwrap();
    let running = env.wait_running("web").await;
    eprintln!(
        "pod create → Running (ready) seen through the API: {:?}",
        created.elapsed()
    );

    let s = &running["status"];
    let c = &s["containerStatuses"][0];
    assert_eq!(c["name"], "main");
    assert!(c["state"]["running"]["startedAt"].is_string(), "{c:#}");
    assert_eq!(c["restartCount"], 0);
    assert_eq!(c["ready"], true);
    assert_eq!(c["started"], true);
    assert_eq!(c["image"], BUSYBOX_IMAGE);
    assert!(
        c["imageID"].as_str().is_some_and(|i| !i.is_empty()),
        "{c:#}"
    );
    assert_eq!(s["hostIP"], node_ip().to_string());
    assert!(s["startTime"].is_string());
    let pod_ip: std::net::Ipv4Addr = s["podIP"].as_str().unwrap().parse().unwrap();
    let subnet = shared_containerd().pod_subnet();
    let base: std::net::Ipv4Addr = subnet.trim_end_matches("/24").parse().unwrap();
    assert_eq!(
        u32::from(pod_ip) & 0xffff_ff00,
        u32::from(base),
        "{pod_ip} not in {subnet}"
    );
    assert_eq!(s["podIPs"], json!([{"ip": pod_ip.to_string()}]));
    for ty in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
        assert_eq!(condition(&running, ty)["status"], "True", "{ty}");
    }

    // What runs is what the spec says.
    let cri = env.cri().await;
    let id = container_id(&running, 0);
    let (code, out) = exec(&cri, &id, &["cat", "/etc/cfg/greeting"]).await;
    assert_eq!((code, out.as_str()), (0, "hello from a configmap"));
    let (_, env_out) = exec(&cri, &id, &["env"]).await;
    for line in [
        "NAP=3600".to_string(),
        "LITERAL=plain-3600".to_string(),
        "GREETING=hello from a configmap".to_string(),
        "POD_NAME=web".to_string(),
        format!("POD_NAMESPACE={}", env.ns),
        format!("POD_UID={uid}"),
        format!("POD_IP={pod_ip}"),
        format!("NODE={}", env.node),
        "CM_COLOR=blue".to_string(),
        "CM_greeting=hello from a configmap".to_string(),
    ] {
        assert!(
            env_out.lines().any(|l| l == line),
            "{line} missing in:\n{env_out}"
        );
    }
    let (_, ps) = exec(&cri, &id, &["cat", "/proc/1/cmdline"]).await;
    assert_eq!(ps, "sleep\u{0}3600\u{0}", "$(NAP) expanded in args");
    let (_, hosts) = exec(&cri, &id, &["cat", "/etc/hosts"]).await;
    assert!(hosts.contains(&format!("{pod_ip}\tweb")), "{hosts}");

    // A configmap update reaches the mounted file without a restart.
    let mut updated = cms.get("settings").await.unwrap();
    updated
        .data
        .as_mut()
        .unwrap()
        .insert("greeting".into(), "updated".into());
    cms.replace("settings", &PostParams::default(), &updated)
        .await
        .unwrap();
    wait_for("the configmap update in the container", WAIT, || async {
        let (_, out) = exec(&cri, &id, &["cat", "/etc/cfg/greeting"]).await;
        (out == "updated").then_some(())
    })
    .await;
    let (containers, sandboxes) = runtime_objects(&cri, &uid).await;
    assert_eq!((containers.len(), sandboxes.len()), (1, 1));

    // Deleting the pod stops it within its grace period, removes the API object, then the
    // containers and the sandbox.
    let deleting = Instant::now();
    env.pods()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the pod object to go", WAIT, || async {
        match env.pods().get_opt("web").await {
            Ok(None) => Some(()),
            Ok(Some(p)) if p.metadata.uid.as_deref() != Some(uid.as_str()) => Some(()),
            _ => None,
        }
    })
    .await;
    eprintln!("pod delete → object gone: {:?}", deleting.elapsed());
    wait_for("the pod's containers and sandbox to go", WAIT, || async {
        let (c, s) = runtime_objects(&cri, &uid).await;
        (c.is_empty() && s.is_empty()).then_some(())
    })
    .await;
    // Removed right after the sandbox: CRI may already show nothing a moment before.
    let pod_dir = env.dir.path().join("edged/pods").join(&uid);
    wait_for("the pod directory to be removed", WAIT, || async {
        (!pod_dir.exists()).then_some(())
    })
    .await;
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_container_restarts_with_a_growing_count_and_crash_loop_back_off() {
    let env = EdgeEnv::start("edged-crash").await;
    env.create_pod(json!({
        "metadata": {"name": "crasher"},
        "spec": {"containers": [{"name": "boom", "image": BUSYBOX_IMAGE,
            "command": ["sh", "-c", "exit 1"]}]},
    }))
    .await;
    let mut saw_back_off = false;
    let pod = env
        .wait_pod(
            "crasher",
            "restartCount ≥ 3 after a CrashLoopBackOff",
            |p| {
                let c = &p["status"]["containerStatuses"][0];
                if c["state"]["waiting"]["reason"] == "CrashLoopBackOff" {
                    assert!(
                        c["state"]["waiting"]["message"]
                            .as_str()
                            .unwrap_or("")
                            .contains("restarting failed container=boom"),
                        "{c:#}"
                    );
                    assert_eq!(c["lastState"]["terminated"]["exitCode"], 1, "{c:#}");
                    assert_eq!(c["ready"], false, "{c:#}");
                    assert_eq!(condition(p, "Ready")["status"], "False");
                    // Always: a crash-looping pod is Running.
                    assert_eq!(p["status"]["phase"], "Running");
                    saw_back_off = true;
                }
                saw_back_off && c["restartCount"].as_u64().unwrap_or(0) >= 3
            },
        )
        .await;
    assert_eq!(pod["status"]["phase"], "Running");
    // Old attempts are collected: at most the running/newest one and one exited.
    let cri = env.cri().await;
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    let (containers, _) = runtime_objects(&cri, uid).await;
    assert!(
        containers.len() <= 2,
        "{} containers kept",
        containers.len()
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_first_and_a_never_pod_completes() {
    let env = EdgeEnv::start("edged-init").await;
    env.create_pod(json!({
        "metadata": {"name": "job"},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [
                {"name": "one", "image": BUSYBOX_IMAGE, "command": ["sh", "-c", "echo one >> /work/log"],
                 "volumeMounts": [{"name": "work", "mountPath": "/work"}]},
                {"name": "two", "image": BUSYBOX_IMAGE, "command": ["sh", "-c", "echo two >> /work/log"],
                 "volumeMounts": [{"name": "work", "mountPath": "/work"}]},
            ],
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE,
                "command": ["sh", "-c", "test \"$(cat /work/log)\" = \"$(printf 'one\\ntwo')\""],
                "volumeMounts": [{"name": "work", "mountPath": "/work"}]}],
            "volumes": [{"name": "work", "emptyDir": {}}],
        },
    }))
    .await;
    let done = env
        .wait_pod("job", "Succeeded", |p| p["status"]["phase"] == "Succeeded")
        .await;
    let s = &done["status"];
    for (i, name) in ["one", "two"].iter().enumerate() {
        assert_eq!(s["initContainerStatuses"][i]["name"], *name);
        assert_eq!(
            s["initContainerStatuses"][i]["state"]["terminated"]["exitCode"],
            0
        );
    }
    let t = &s["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(t["exitCode"], 0, "{s:#}");
    assert_eq!(t["reason"], "Completed");
    assert_eq!(condition(&done, "Initialized")["status"], "True");
    assert_eq!(condition(&done, "Ready")["status"], "False");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_edged_cannot_run_says_why_and_other_pods_are_unaffected() {
    let env = EdgeEnv::start("edged-bad").await;
    env.create_pod(json!({
        "metadata": {"name": "claims"},
        "spec": {"containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "nope"}}]},
    }))
    .await;
    env.create_pod(json!({
        "metadata": {"name": "needs-config"},
        "spec": {"containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"],
                "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "later", "key": "x"}}}]}]},
    }))
    .await;
    env.create_pod(json!({
        "metadata": {"name": "fine"},
        "spec": {"containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]}]},
    }))
    .await;
    let waiting = |reason: &'static str, needle: &'static str| {
        move |p: &Value| {
            let w = &p["status"]["containerStatuses"][0]["state"]["waiting"];
            w["reason"] == reason && w["message"].as_str().is_some_and(|m| m.contains(needle))
        }
    };
    let claims = env
        .wait_pod(
            "claims",
            "CreateContainerConfigError naming persistentVolumeClaim",
            waiting("CreateContainerConfigError", "persistentVolumeClaim"),
        )
        .await;
    assert_eq!(claims["status"]["phase"], "Pending");
    env.wait_pod(
        "needs-config",
        "CreateContainerConfigError naming the configmap",
        waiting(
            "CreateContainerConfigError",
            "configmap \"later\" not found",
        ),
    )
    .await;
    env.wait_running("fine").await;

    // Once the configmap exists, the pod starts.
    let cms: Api<ConfigMap> = Api::namespaced(env.cluster.client(), &env.ns);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "later"}, "data": {"x": "1"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    env.wait_running("needs-config").await;
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_edgecore_adopts_running_containers_and_removes_pods_deleted_meanwhile() {
    let mut env = EdgeEnv::start("edged-adopt").await;
    env.create_pod(json!({
        "metadata": {"name": "keeper"},
        "spec": {"containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]}]},
    }))
    .await;
    env.create_pod(json!({
        "metadata": {"name": "goner"},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]}]},
    }))
    .await;
    let before = env.wait_running("keeper").await;
    let goner = env.wait_running("goner").await;
    let id = container_id(&before, 0);
    let goner_uid = goner["metadata"]["uid"].as_str().unwrap().to_string();

    env.stop_edge().await;
    // Containers outlive edgecore.
    let cri = env.cri().await;
    let (code, _) = exec(&cri, &id, &["true"]).await;
    assert_eq!(
        code, 0,
        "the container keeps running while edgecore is down"
    );
    // Meanwhile the other pod is force-deleted at the API server.
    env.pods()
        .delete("goner", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();

    env.start_edge().await;
    env.wait_node_ready().await;
    wait_for("the deleted pod's containers to go", WAIT, || async {
        let (c, s) = runtime_objects(&cri, &goner_uid).await;
        (c.is_empty() && s.is_empty()).then_some(())
    })
    .await;
    // The adopted container: same ID, no restart, still Ready.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = env.wait_running("keeper").await;
    assert_eq!(container_id(&after, 0), id);
    assert_eq!(after["status"]["containerStatuses"][0]["restartCount"], 0);
    assert_eq!(
        after["status"]["containerStatuses"][0]["state"]["running"]["startedAt"],
        before["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    );
    let uid = after["metadata"]["uid"].as_str().unwrap();
    let (containers, sandboxes) = runtime_objects(&cri, uid).await;
    assert_eq!((containers.len(), sandboxes.len()), (1, 1));
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_drive_readiness_and_restarts() {
    let env = EdgeEnv::start("edged-probe").await;
    env.create_pod(json!({
        "metadata": {"name": "probed"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "app", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"],
                 "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 1},
                 "livenessProbe": {"exec": {"command": ["sh", "-c", "test ! -e /tmp/die"]},
                                   "periodSeconds": 1, "failureThreshold": 1}},
                {"name": "web", "image": BUSYBOX_IMAGE,
                 "command": ["sh", "-c", "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www"],
                 "ports": [{"name": "http", "containerPort": 8080}],
                 "readinessProbe": {"httpGet": {"path": "/index.html", "port": "http"}, "periodSeconds": 1},
                 "livenessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}},
            ],
        },
    }))
    .await;
    let ready = |name: &'static str, want: bool| {
        move |p: &Value| {
            p["status"]["containerStatuses"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["name"] == name))
                .is_some_and(|c| c["state"]["running"].is_object() && c["ready"] == want)
        }
    };
    // The HTTP server is ready; the app is running but not ready until its file exists.
    let pod = env
        .wait_pod("probed", "web ready over HTTP", ready("web", true))
        .await;
    assert_eq!(pod["status"]["phase"], "Running");
    let app = pod["status"]["containerStatuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "app")
        .unwrap();
    assert_eq!(app["ready"], false, "{app:#}");
    assert_eq!(condition(&pod, "Ready")["status"], "False");

    let cri = env.cri().await;
    let id = container_id(&pod, 0);
    assert_eq!(exec(&cri, &id, &["touch", "/tmp/ready"]).await.0, 0);
    let pod = env
        .wait_pod("probed", "app ready", ready("app", true))
        .await;
    assert_eq!(condition(&pod, "Ready")["status"], "True");

    // A failing liveness probe restarts the container (the new one is not ready yet).
    assert_eq!(exec(&cri, &id, &["touch", "/tmp/die"]).await.0, 0);
    let pod = env
        .wait_pod("probed", "app restarted by its liveness probe", |p| {
            let c = &p["status"]["containerStatuses"][0];
            c["restartCount"] == 1 && c["state"]["running"].is_object()
        })
        .await;
    assert_ne!(container_id(&pod, 0), id);
    assert_eq!(pod["status"]["containerStatuses"][1]["restartCount"], 0);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_network_pod_uses_the_node_network() {
    let env = EdgeEnv::start("edged-hostnet").await;
    env.create_pod(json!({
        "metadata": {"name": "hostnet"},
        "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]}]},
    }))
    .await;
    let pod = env.wait_running("hostnet").await;
    assert_eq!(pod["status"]["podIP"], node_ip().to_string());
    assert_eq!(pod["status"]["hostIP"], node_ip().to_string());
    let cri = env.cri().await;
    let (_, hostname) = exec(&cri, &container_id(&pod, 0), &["hostname"]).await;
    let machine = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(hostname.trim(), machine.trim());
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_hooks_run_around_the_container_and_host_paths_are_shared() {
    let env = EdgeEnv::start("edged-hooks").await;
    let host_dir = env.dir.path().join("shared-with-pod");
    env.create_pod(json!({
        "metadata": {"name": "hooked"},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                "lifecycle": {
                    "postStart": {"exec": {"command": ["sh", "-c", "echo started > /host/post-start"]}},
                    "preStop": {"exec": {"command": ["sh", "-c", "echo stopping > /host/pre-stop"]}},
                }}],
            "volumes": [{"name": "host", "hostPath": {"path": host_dir.display().to_string(), "type": "DirectoryOrCreate"}}],
        },
    }))
    .await;
    env.wait_running("hooked").await;
    assert_eq!(
        std::fs::read_to_string(host_dir.join("post-start")).unwrap(),
        "started\n"
    );
    assert!(!host_dir.join("pre-stop").exists());
    env.pods()
        .delete("hooked", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the pod object to go", WAIT, || async {
        env.pods()
            .get_opt("hooked")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(host_dir.join("pre-stop")).unwrap(),
        "stopping\n"
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_update_restarts_only_that_container() {
    let env = EdgeEnv::start("edged-update").await;
    env.create_pod(json!({
        "metadata": {"name": "updated"},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [
            {"name": "a", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]},
            {"name": "b", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]},
        ]},
    }))
    .await;
    let before = env.wait_running("updated").await;
    let mut pod = env.pods().get("updated").await.unwrap();
    pod.spec.as_mut().unwrap().containers[0].image = Some(BUSYBOX_DOCKER_HUB_IMAGE.into());
    env.pods()
        .replace("updated", &PostParams::default(), &pod)
        .await
        .unwrap();
    let after = env
        .wait_pod("updated", "container a restarted with the new image", |p| {
            let c = &p["status"]["containerStatuses"][0];
            c["image"] == BUSYBOX_DOCKER_HUB_IMAGE
                && c["restartCount"] == 1
                && c["state"]["running"].is_object()
        })
        .await;
    assert_ne!(container_id(&after, 0), container_id(&before, 0));
    assert_eq!(container_id(&after, 1), container_id(&before, 1));
    assert_eq!(after["status"]["containerStatuses"][1]["restartCount"], 0);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_pods_created_together_all_run() {
    let env = EdgeEnv::start("edged-ten").await;
    let created = Instant::now();
    let names: Vec<String> = (0..10).map(|i| format!("p{i}")).collect();
    futures::future::join_all(names.iter().map(|n| {
        env.create_pod(json!({
            "metadata": {"name": n},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [
                {"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                 "command": ["sleep", "3600"]}]},
        }))
    }))
    .await;
    let mut times = Vec::new();
    for n in &names {
        env.wait_running(n).await;
        times.push(created.elapsed());
    }
    eprintln!(
        "10 pods created together → all Running: {:?} (first seen {:?})",
        times[9], times[0]
    );
    let cri = env.cri().await;
    let mut ips = std::collections::HashSet::new();
    for n in &names {
        let p = serde_json::to_value(env.pods().get(n).await.unwrap()).unwrap();
        assert!(
            ips.insert(p["status"]["podIP"].as_str().unwrap().to_string()),
            "IPs are unique"
        );
        let (containers, sandboxes) =
            runtime_objects(&cri, p["metadata"]["uid"].as_str().unwrap()).await;
        assert_eq!((containers.len(), sandboxes.len()), (1, 1), "{n}");
    }
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_come_back_from_the_database_while_the_cloud_is_gone() {
    let mut env = EdgeEnv::start("edged-offline").await;
    env.create_pod(json!({
        "metadata": {"name": "survivor"},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"]}]},
    }))
    .await;
    let running = env.wait_running("survivor").await;
    let uid = running["metadata"]["uid"].as_str().unwrap().to_string();
    let first = container_id(&running, 0);

    // The cloud goes away, then edgecore restarts: it knows its pods from its database.
    env.stop_cloud();
    let hub = env.edge.as_ref().unwrap().hub().clone();
    wait_for("the edge to notice the cloud is gone", WAIT, || async {
        (!hub.is_connected()).then_some(())
    })
    .await;
    env.stop_edge().await;
    env.start_edge().await;
    // The container crashes (is killed) while offline: edged restarts it.
    let cri = env.cri().await;
    cri.runtime()
        .stop_container(api::StopContainerRequest {
            container_id: first.clone(),
            timeout: 0,
        })
        .await
        .unwrap();
    let restarted = wait_for("a new container for the pod, offline", WAIT, || async {
        let (containers, _) = runtime_objects(&cri, &uid).await;
        containers
            .into_iter()
            .find(|c| c.id != first && c.state() == api::ContainerState::ContainerRunning)
    })
    .await;
    assert_eq!(restarted.metadata.unwrap().attempt, 1);
    assert!(!env.edge.as_ref().unwrap().hub().is_connected());
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_are_sent_again_when_the_cloud_link_comes_back() {
    let env = EdgeEnv::start("edged-resync").await;
    env.create_pod(json!({
        "metadata": {"name": "steady"},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"]}]},
    }))
    .await;
    env.wait_running("steady").await;
    // While the link is down the cloud side marks the pod not ready (as the node lifecycle
    // controller does for an unreachable node); the edge cannot know.
    let patch = json!({"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "NodeUnreachable"},
        {"type": "ContainersReady", "status": "False"},
    ]}});
    env.pods()
        .patch_status(
            "steady",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(patch),
        )
        .await
        .unwrap();
    let marked = env.pods().get("steady").await.unwrap();
    let marked = serde_json::to_value(&marked).unwrap();
    assert_eq!(condition(&marked, "Ready")["status"], "False");
    assert!(env.cloud().hub.disconnect(&env.node));
    // After the reconnect the edge reports what it sees: the pod is ready.
    let back = env
        .wait_pod("steady", "Ready again after the reconnect", |p| {
            condition(p, "Ready")["status"] == "True"
        })
        .await;
    assert_eq!(back["status"]["containerStatuses"][0]["restartCount"], 0);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_past_its_active_deadline_fails() {
    let env = EdgeEnv::start("edged-deadline").await;
    env.create_pod(json!({
        "metadata": {"name": "bounded"},
        "spec": {"activeDeadlineSeconds": 3, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"]}]},
    }))
    .await;
    env.wait_running("bounded").await;
    let failed = env
        .wait_pod("bounded", "Failed with DeadlineExceeded", |p| {
            p["status"]["phase"] == "Failed" && p["status"]["reason"] == "DeadlineExceeded"
        })
        .await;
    let c = &failed["status"]["containerStatuses"][0];
    assert!(c["state"]["terminated"].is_object(), "{c:#}");
    assert_eq!(condition(&failed, "Ready")["status"], "False");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_logs_are_rotated_and_bounded() {
    let env = EdgeEnv::start("edged-logs").await;
    let pod = env
        .create_pod(json!({
            "metadata": {"name": "chatty"},
            "spec": {"terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c",
                        "i=0; while true; do i=$((i+1)); echo \"line $i 0123456789012345678901234567890123456789012345678901234567890123456789\"; sleep 0.005; done"]}]},
        }))
        .await;
    env.wait_running("chatty").await;
    let dir = env
        .dir
        .path()
        .join("pod-logs")
        .join(format!("{}_chatty_{}", env.ns, pod.metadata.uid.unwrap()))
        .join("main");
    let files = |dir: std::path::PathBuf| async move {
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    // Rotated at least twice: the oldest rotated files are gone, three files at most remain.
    wait_for("two rotations", WAIT, || async {
        let names = files(dir.clone()).await;
        (names.iter().filter(|n| n.starts_with("0.log.")).count() == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let names = files(dir.clone()).await;
    assert!(names.len() <= 3, "{names:?}");
    assert!(names.contains(&"0.log".to_string()), "{names:?}");
    // The runtime writes to the reopened file.
    let size = |p: std::path::PathBuf| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let before = size(dir.join("0.log"));
    wait_for("the current log to grow", WAIT, || async {
        let now = size(dir.join("0.log"));
        (now != before).then_some(())
    })
    .await;
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_containers_report_their_termination_message() {
    let env = EdgeEnv::start("edged-term").await;
    env.create_pod(json!({
        "metadata": {"name": "reporter"},
        "spec": {"restartPolicy": "Never", "containers": [
            {"name": "file", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
             "command": ["sh", "-c", "echo 'all done' > /dev/termination-log; exit 3"]},
            {"name": "logs", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
             "terminationMessagePolicy": "FallbackToLogsOnError",
             "command": ["sh", "-c", "echo 'it broke'; exit 2"]},
        ]},
    }))
    .await;
    let done = env
        .wait_pod("reporter", "Failed", |p| p["status"]["phase"] == "Failed")
        .await;
    let t = |i: usize| done["status"]["containerStatuses"][i]["state"]["terminated"].clone();
    assert_eq!(t(0)["exitCode"], 3);
    assert_eq!(t(0)["message"], "all done\n");
    assert_eq!(t(1)["exitCode"], 2);
    assert_eq!(t(1)["message"], "it broke");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edgecore_started_before_its_runtime_runs_pods_once_the_runtime_appears() {
    // The endpoint is a symlink that does not exist yet: the runtime is "down".
    let link_dir = tempfile::tempdir().unwrap();
    let link = link_dir.path().join("cri.sock");
    let env = EdgeEnv::start_with(EdgeOptions {
        endpoint: Some(format!("unix://{}", link.display())),
        ..EdgeOptions::new("edged-late")
    })
    .await;
    let nodes = env.nodes();
    let not_ready = wait_for("the node registered NotReady", WAIT, || async {
        let n = serde_json::to_value(nodes.get_opt(&env.node).await.ok()??).ok()?;
        let ready = n["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready")?
            .clone();
        (ready["status"] == "False").then_some(ready)
    })
    .await;
    assert!(
        not_ready["message"]
            .as_str()
            .unwrap_or("")
            .contains("container runtime is down"),
        "{not_ready}"
    );
    // Pods still reach the node (the metamanager is not held up by edged).
    env.create_pod(json!({
        "metadata": {"name": "patient"},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"]}]},
    }))
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The runtime appears.
    let containerd = tokio::task::spawn_blocking(shared_containerd)
        .await
        .unwrap();
    std::os::unix::fs::symlink(containerd.socket(), &link).unwrap();
    env.wait_node_ready().await;
    env.wait_running("patient").await;
    env.finish().await;
}
