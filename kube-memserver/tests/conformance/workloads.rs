//! Workloads through kubectl: Deployments (create, scale, set image, rollout status / history /
//! undo, delete), DaemonSets on matching nodes, the scheduler's filters, StatefulSet ordering
//! and Job completion. The nodes have no kubelets: a stand-in (`FakeKubelet`) reports the pods
//! bound to them Running and Ready (or Succeeded), and finishes their deletion, as a kubelet
//! would. In-memory only: a real cluster's own kubelets would compete with the stand-in.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::apiserver::Config;
use e2e::cluster::{self, TestCluster};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

async fn setup(prefix: &str) -> Option<(TestCluster, String)> {
    let c = cluster::connect_in_memory_only(
        Config::for_tests(),
        "nodes without kubelets whose pods the test reports Running (a real cluster's own kubelets would compete)",
    )
    .await
    .expect("connect")?;
    let ns = c.temp_namespace(prefix).await.expect("namespace");
    Some((c, ns))
}

async fn add_node(c: &TestCluster, name: &str, labels: Value, taints: Value, cpu: &str) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "capacity": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "lastHeartbeatTime": k8s_openapi::jiff::Timestamp::now().to_string()}],
        },
    }))
    .expect("node");
    Api::<Node>::all(c.client())
        .create(&PostParams::default(), &node)
        .await
        .expect("create node");
}

/// Plays the kubelet of every node for one namespace: renews the nodes' leases, bound pods
/// become `phase` (Running and Ready, or Succeeded), pods being deleted are removed. Records
/// the order pods became ready.
struct FakeKubelet {
    task: tokio::task::JoinHandle<()>,
    readied: Arc<Mutex<Vec<String>>>,
}

impl FakeKubelet {
    fn start(c: &TestCluster, ns: &str, phase: &'static str) -> Self {
        let pods: Api<Pod> = Api::namespaced(c.client(), ns);
        let leases: Api<Lease> = Api::namespaced(c.client(), "kube-node-lease");
        let nodes: Api<Node> = Api::all(c.client());
        let readied = Arc::new(Mutex::new(Vec::new()));
        let seen = readied.clone();
        let task = tokio::spawn(async move {
            loop {
                let now = k8s_openapi::jiff::Timestamp::now().to_string();
                for n in nodes
                    .list(&ListParams::default())
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default()
                {
                    let name = n.metadata.name.unwrap_or_default();
                    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": name}, "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now}});
                    let _ = leases
                        .patch(
                            &name,
                            &PatchParams::apply("fake-kubelet").force(),
                            &Patch::Apply(&lease),
                        )
                        .await;
                }
                if let Ok(list) = pods.list(&ListParams::default()).await {
                    for p in list.items {
                        let name = p.metadata.name.clone().unwrap_or_default();
                        if p.metadata.deletion_timestamp.is_some() {
                            let _ = pods
                                .delete(&name, &DeleteParams::default().grace_period(0))
                                .await;
                            continue;
                        }
                        let bound = p.spec.as_ref().and_then(|s| s.node_name.clone()).is_some();
                        let pending =
                            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending");
                        if !bound || !pending {
                            continue;
                        }
                        let now = k8s_openapi::jiff::Timestamp::now().to_string();
                        let running = phase == "Running";
                        let containers: Vec<Value> = p.spec.as_ref().map(|s| s.containers.iter().map(|c| {
                            let state = if running { json!({"running": {"startedAt": now}}) }
                                else { json!({"terminated": {"exitCode": 0, "reason": "Completed"}}) };
                            json!({"name": c.name, "image": c.image, "imageID": "", "ready": running, "restartCount": 0, "state": state})
                        }).collect()).unwrap_or_default();
                        let status = json!({"status": {
                            "phase": phase, "podIP": "10.244.0.10", "hostIP": "10.0.0.1",
                            "conditions": [
                                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                                {"type": "Ready", "status": if running { "True" } else { "False" }, "lastTransitionTime": now},
                            ],
                            "containerStatuses": containers,
                        }});
                        if pods
                            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                            .await
                            .is_ok()
                            && running
                        {
                            seen.lock().expect("lock").push(name);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self { task, readied }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn kubectl(c: &TestCluster, ns: &str, args: &[&str]) -> String {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    let out = c.kubectl_run(&all, None).await.expect("kubectl");
    if !out.success {
        let state = c
            .kubectl_run(&["-n", ns, "get", "deploy,rs,pods", "-o", "yaml"], None)
            .await
            .map(|o| o.stdout)
            .unwrap_or_default();
        panic!("kubectl {args:?}: {out:?}\nstate:\n{state}");
    }
    out.stdout
}

async fn kubectl_stdin(c: &TestCluster, ns: &str, args: &[&str], input: &str) -> String {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    let out = c.kubectl_run(&all, Some(input)).await.expect("kubectl");
    assert!(out.success, "kubectl {args:?}: {out:?}");
    out.stdout
}

/// Waits until `check` holds on the namespace's pods (not being deleted).
async fn wait_pods(
    c: &TestCluster,
    ns: &str,
    what: &str,
    check: impl Fn(&[Pod]) -> bool,
) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(c.client(), ns);
    let deadline = Instant::now() + WAIT;
    loop {
        let pods: Vec<Pod> = api
            .list(&ListParams::default())
            .await
            .expect("list pods")
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        if check(&pods) {
            return pods;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {:#?}",
            pods.iter()
                .map(|p| (
                    &p.metadata.name,
                    p.spec.as_ref().and_then(|s| s.node_name.as_ref()),
                    p.status.as_ref().and_then(|s| s.phase.as_ref())
                ))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn images(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter()
        .flat_map(|p| {
            p.spec
                .iter()
                .flat_map(|s| s.containers.iter().filter_map(|c| c.image.clone()))
        })
        .collect()
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn kubectl_deployment_scales_rolls_out_undoes_and_deletes_its_pods() {
    let Some((c, ns)) = setup("deploy").await else {
        return;
    };
    add_node(&c, "node-a", json!({}), json!([]), "4").await;
    add_node(&c, "node-b", json!({}), json!([]), "4").await;
    let _kubelet = FakeKubelet::start(&c, &ns, "Running");
    let out = kubectl(
        &c,
        &ns,
        &[
            "create",
            "deployment",
            "web",
            "--image=busybox:1.36",
            "--replicas=2",
        ],
    )
    .await;
    assert!(out.contains("deployment.apps/web created"), "{out}");
    let out = kubectl(
        &c,
        &ns,
        &["rollout", "status", "deployment/web", "--timeout=30s"],
    )
    .await;
    assert!(out.contains("successfully rolled out"), "{out}");
    let pods = wait_pods(&c, &ns, "2 ready pods", |p| {
        p.len() == 2 && p.iter().all(ready)
    })
    .await;
    let nodes: BTreeSet<_> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(
        nodes.len(),
        2,
        "two replicas spread over the two nodes: {nodes:?}"
    );
    let table = kubectl(&c, &ns, &["get", "deploy", "web"]).await;
    assert!(
        table.contains("READY") && table.contains("UP-TO-DATE") && table.contains("2/2"),
        "{table}"
    );

    let out = kubectl(&c, &ns, &["scale", "deployment", "web", "--replicas=3"]).await;
    assert!(out.contains("deployment.apps/web scaled"), "{out}");
    wait_pods(&c, &ns, "3 ready pods", |p| {
        p.len() == 3 && p.iter().all(ready)
    })
    .await;
    let rs_table = kubectl(&c, &ns, &["get", "rs"]).await;
    assert!(
        rs_table.contains("DESIRED") && rs_table.contains("web-"),
        "{rs_table}"
    );

    kubectl(
        &c,
        &ns,
        &["set", "image", "deployment/web", "busybox=busybox:1.37"],
    )
    .await;
    let out = kubectl(
        &c,
        &ns,
        &["rollout", "status", "deployment/web", "--timeout=30s"],
    )
    .await;
    assert!(out.contains("successfully rolled out"), "{out}");
    let pods = wait_pods(&c, &ns, "3 pods on 1.37", |p| {
        p.len() == 3 && images(p) == BTreeSet::from(["busybox:1.37".to_string()])
    })
    .await;
    assert!(
        pods.iter().all(ready),
        "{:#?}",
        pods.iter()
            .map(|p| (
                &p.metadata.name,
                &p.metadata.creation_timestamp,
                p.status.as_ref().map(|s| (&s.phase, &s.conditions))
            ))
            .collect::<Vec<_>>()
    );
    let history = kubectl(&c, &ns, &["rollout", "history", "deployment/web"]).await;
    let revisions: Vec<&str> = history
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.parse::<u32>().is_ok())
        .collect();
    assert_eq!(revisions, ["1", "2"], "{history}");

    let out = kubectl(&c, &ns, &["rollout", "undo", "deployment/web"]).await;
    assert!(out.contains("rolled back"), "{out}");
    kubectl(
        &c,
        &ns,
        &["rollout", "status", "deployment/web", "--timeout=30s"],
    )
    .await;
    wait_pods(&c, &ns, "3 pods back on 1.36", |p| {
        p.len() == 3 && images(p) == BTreeSet::from(["busybox:1.36".to_string()])
    })
    .await;
    let d: Deployment = Api::namespaced(c.client(), &ns).get("web").await.unwrap();
    let annotations = d.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations
            .get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("3")
    );
    let status = d.status.unwrap();
    assert_eq!(
        (
            status.replicas,
            status.updated_replicas,
            status.available_replicas
        ),
        (Some(3), Some(3), Some(3))
    );
    let history = kubectl(&c, &ns, &["rollout", "history", "deployment/web"]).await;
    let revisions: Vec<&str> = history
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.parse::<u32>().is_ok())
        .collect();
    assert_eq!(revisions, ["2", "3"], "revision 1 became 3: {history}");

    let all = kubectl(&c, &ns, &["get", "all"]).await;
    for want in ["deployment.apps/web", "replicaset.apps/web-", "pod/web-"] {
        assert!(all.contains(want), "kubectl get all lacks {want}: {all}");
    }

    kubectl(&c, &ns, &["delete", "deployment", "web"]).await;
    wait_pods(&c, &ns, "no pods left", |p| p.is_empty()).await;
    let rss: Api<ReplicaSet> = Api::namespaced(c.client(), &ns);
    let deadline = Instant::now() + WAIT;
    while !rss
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "replica sets outlived their deployment"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn orphan_and_foreground_deletion_of_a_deployment() {
    let Some((c, ns)) = setup("cascade").await else {
        return;
    };
    add_node(&c, "node-a", json!({}), json!([]), "4").await;
    let _kubelet = FakeKubelet::start(&c, &ns, "Running");
    kubectl(
        &c,
        &ns,
        &[
            "create",
            "deployment",
            "keep",
            "--image=busybox:1.36",
            "--replicas=2",
        ],
    )
    .await;
    kubectl(
        &c,
        &ns,
        &["rollout", "status", "deployment/keep", "--timeout=30s"],
    )
    .await;
    kubectl(
        &c,
        &ns,
        &["delete", "deployment", "keep", "--cascade=orphan"],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss: Api<ReplicaSet> = Api::namespaced(c.client(), &ns);
    let left = rss.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(left.len(), 1, "the replica set stays");
    assert!(
        left[0]
            .metadata
            .owner_references
            .as_ref()
            .is_none_or(|r| r.is_empty()),
        "and is orphaned"
    );
    wait_pods(&c, &ns, "the orphaned replica set keeps its pods", |p| {
        p.len() == 2
    })
    .await;
    let rs_name = left[0].metadata.name.clone().unwrap();
    kubectl(
        &c,
        &ns,
        &[
            "delete",
            "rs",
            &rs_name,
            "--cascade=foreground",
            "--wait=true",
            "--timeout=30s",
        ],
    )
    .await;
    wait_pods(&c, &ns, "no pods left", |p| p.is_empty()).await;
    assert!(
        rss.get_opt(&rs_name).await.unwrap().is_none(),
        "the replica set went after its pods"
    );

    // Foreground through the whole chain: kubectl returns once the Deployment is gone, which
    // is only after its ReplicaSet and their pods.
    kubectl(
        &c,
        &ns,
        &[
            "create",
            "deployment",
            "fg",
            "--image=busybox:1.36",
            "--replicas=2",
        ],
    )
    .await;
    kubectl(
        &c,
        &ns,
        &["rollout", "status", "deployment/fg", "--timeout=30s"],
    )
    .await;
    kubectl(
        &c,
        &ns,
        &[
            "delete",
            "deployment",
            "fg",
            "--cascade=foreground",
            "--wait=true",
            "--timeout=30s",
        ],
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(c.client(), &ns);
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "pods went first"
    );
    assert!(
        rss.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "then the replica set"
    );
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn daemon_set_and_scheduler_place_pods_by_labels_taints_affinity_and_requests() {
    let Some((c, ns)) = setup("placement").await else {
        return;
    };
    let edge_taint = json!([{"key": "node-role.kubernetes.io/edge", "effect": "NoSchedule"}]);
    add_node(
        &c,
        "edge-1",
        json!({"node-role.kubernetes.io/edge": "", "disk": "ssd"}),
        edge_taint.clone(),
        "1",
    )
    .await;
    add_node(
        &c,
        "edge-2",
        json!({"node-role.kubernetes.io/edge": ""}),
        edge_taint,
        "1",
    )
    .await;
    add_node(&c, "cloud-1", json!({"disk": "ssd"}), json!([]), "1").await;
    let _kubelet = FakeKubelet::start(&c, &ns, "Running");
    let ds = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: edge-agent}
spec:
  selector: {matchLabels: {app: edge-agent}}
  template:
    metadata: {labels: {app: edge-agent}}
    spec:
      nodeSelector: {node-role.kubernetes.io/edge: ""}
      tolerations: [{key: node-role.kubernetes.io/edge, operator: Exists, effect: NoSchedule}]
      containers: [{name: agent, image: busybox:1.36}]
"#;
    kubectl_stdin(&c, &ns, &["apply", "-f", "-"], ds).await;
    let pods = wait_pods(&c, &ns, "a daemon pod on each edge node", |p| {
        p.len() == 2 && p.iter().all(ready)
    })
    .await;
    let nodes: BTreeSet<_> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(
        nodes,
        BTreeSet::from(["edge-1".to_string(), "edge-2".to_string()])
    );
    let out = kubectl(
        &c,
        &ns,
        &["rollout", "status", "ds/edge-agent", "--timeout=30s"],
    )
    .await;
    assert!(out.contains("successfully rolled out"), "{out}");
    let table = kubectl(&c, &ns, &["get", "ds", "edge-agent"]).await;
    assert!(
        table.contains("NODE SELECTOR") && table.contains("node-role.kubernetes.io/edge="),
        "{table}"
    );

    let pod = |name: &str, spec: Value| -> String {
        let mut s = json!({"containers": [{"name": "c", "image": "busybox:1.36"}]});
        s.as_object_mut()
            .unwrap()
            .extend(spec.as_object().unwrap().clone());
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": s})
            .to_string()
    };
    // Edge-only without the toleration: nowhere to go.
    kubectl_stdin(
        &c,
        &ns,
        &["apply", "-f", "-"],
        &pod(
            "no-toleration",
            json!({"nodeSelector": {"node-role.kubernetes.io/edge": ""}}),
        ),
    )
    .await;
    // ssd nodes: the edge one is tainted, so cloud-1.
    kubectl_stdin(&c, &ns, &["apply", "-f", "-"], &pod("affine", json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]}}}}))).await;
    // More cpu than any node has.
    kubectl_stdin(&c, &ns, &["apply", "-f", "-"], &pod("too-big", json!({"containers": [{"name": "c", "image": "busybox:1.36", "resources": {"requests": {"cpu": "2"}}}]}))).await;
    let pods = wait_pods(&c, &ns, "the affine pod on cloud-1", |p| {
        p.iter().any(|p| {
            p.metadata.name.as_deref() == Some("affine")
                && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("cloud-1")
        })
    })
    .await;
    for name in ["no-toleration", "too-big"] {
        let p = pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .unwrap();
        assert!(
            p.spec.as_ref().unwrap().node_name.is_none(),
            "{name} must stay pending"
        );
    }
    let events: Api<Event> = Api::namespaced(c.client(), &ns);
    let deadline = Instant::now() + WAIT;
    let messages = loop {
        let evs = events
            .list(&ListParams::default().fields("reason=FailedScheduling"))
            .await
            .unwrap()
            .items;
        let msgs: Vec<(String, String)> = evs
            .iter()
            .map(|e| {
                (
                    e.involved_object.name.clone().unwrap_or_default(),
                    e.message.clone().unwrap_or_default(),
                )
            })
            .collect();
        if msgs.iter().any(|(n, _)| n == "no-toleration")
            && msgs.iter().any(|(n, _)| n == "too-big")
        {
            break msgs;
        }
        assert!(
            Instant::now() < deadline,
            "no FailedScheduling events: {msgs:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let msg = |n: &str| {
        messages
            .iter()
            .find(|(p, _)| p == n)
            .map(|(_, m)| m.clone())
            .unwrap()
    };
    assert!(
        msg("no-toleration")
            .contains("2 node(s) had untolerated taint {node-role.kubernetes.io/edge: }"),
        "{}",
        msg("no-toleration")
    );
    assert!(
        msg("too-big").starts_with("0/3 nodes are available:")
            && msg("too-big").contains("Insufficient cpu"),
        "{}",
        msg("too-big")
    );
    let describe = kubectl(
        &c,
        &ns,
        &[
            "get",
            "pod",
            "too-big",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].reason}",
        ],
    )
    .await;
    assert_eq!(describe, "Unschedulable");

    // A third edge node gets a daemon pod too; a cordoned one keeps it (daemons tolerate it).
    add_node(
        &c,
        "edge-3",
        json!({"node-role.kubernetes.io/edge": ""}),
        json!([]),
        "1",
    )
    .await;
    wait_pods(&c, &ns, "a daemon pod on edge-3", |p| {
        p.iter().any(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("edge-agent-"))
                && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("edge-3")
        })
    })
    .await;
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn stateful_set_pods_start_in_order_and_scale_down_from_the_top() {
    let Some((c, ns)) = setup("sts").await else {
        return;
    };
    add_node(&c, "node-a", json!({}), json!([]), "4").await;
    let kubelet = FakeKubelet::start(&c, &ns, "Running");
    let sts = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 3
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: db, image: busybox:1.36}]}
"#;
    kubectl_stdin(&c, &ns, &["apply", "-f", "-"], sts).await;
    let api: Api<Pod> = Api::namespaced(c.client(), &ns);
    let deadline = Instant::now() + WAIT;
    loop {
        let names: BTreeSet<String> = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        let readied = kubelet.readied.lock().unwrap().clone();
        for (i, n) in ["db-1", "db-2"].iter().enumerate() {
            let before = ["db-0", "db-1"][i];
            if names.contains(*n) {
                assert!(
                    readied.iter().any(|r| r == before),
                    "{n} exists before {before} was ready: {readied:?}"
                );
            }
        }
        if readied.len() >= 3 {
            assert_eq!(readied[..3], ["db-0", "db-1", "db-2"]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "statefulset did not come up: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = kubectl(&c, &ns, &["rollout", "status", "sts/db", "--timeout=30s"]).await;
    assert!(
        out.contains("roll out complete") || out.contains("rolling update complete"),
        "{out}"
    );
    let table = kubectl(&c, &ns, &["get", "sts", "db"]).await;
    assert!(table.contains("3/3"), "{table}");
    kubectl(&c, &ns, &["scale", "sts", "db", "--replicas=1"]).await;
    let pods = wait_pods(&c, &ns, "only db-0", |p| p.len() == 1).await;
    assert_eq!(pods[0].metadata.name.as_deref(), Some("db-0"));
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn job_runs_its_pods_to_completion() {
    let Some((c, ns)) = setup("job").await else {
        return;
    };
    add_node(&c, "node-a", json!({}), json!([]), "4").await;
    let _kubelet = FakeKubelet::start(&c, &ns, "Succeeded");
    let job = r#"
apiVersion: batch/v1
kind: Job
metadata: {name: batch}
spec:
  completions: 3
  parallelism: 2
  template:
    spec:
      restartPolicy: Never
      containers: [{name: work, image: busybox:1.36, command: ["true"]}]
"#;
    kubectl_stdin(&c, &ns, &["apply", "-f", "-"], job).await;
    let out = kubectl(
        &c,
        &ns,
        &[
            "wait",
            "--for=condition=complete",
            "job/batch",
            "--timeout=30s",
        ],
    )
    .await;
    assert!(out.contains("condition met"), "{out}");
    let table = kubectl(&c, &ns, &["get", "job", "batch"]).await;
    assert!(
        table.contains("Complete") && table.contains("3/3"),
        "{table}"
    );
    let api: Api<Pod> = Api::namespaced(c.client(), &ns);
    let pods = api
        .list(&ListParams::default().labels("batch.kubernetes.io/job-name=batch"))
        .await
        .unwrap()
        .items;
    assert_eq!(pods.len(), 3, "one pod per completion");
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn the_sample_edge_workloads_run_on_edge_nodes_only() {
    let Some(c) = cluster::connect_in_memory_only(
        Config::for_tests(),
        "nodes without kubelets whose pods the test reports Running (a real cluster's own kubelets would compete)",
    )
    .await
    .expect("connect") else {
        return;
    };
    let taint = json!([{"key": "node-role.kubernetes.io/edge", "effect": "NoSchedule"}]);
    add_node(
        &c,
        "edge-1",
        json!({"node-role.kubernetes.io/edge": ""}),
        taint,
        "2",
    )
    .await;
    add_node(&c, "cloud-1", json!({}), json!([]), "8").await;
    let _kubelet = FakeKubelet::start(&c, "default", "Running");
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../manifests/samples/edge-workloads.yaml"
    );
    kubectl(&c, "default", &["apply", "-f", file]).await;
    kubectl(
        &c,
        "default",
        &[
            "rollout",
            "status",
            "deployment/hello-edge",
            "--timeout=30s",
        ],
    )
    .await;
    kubectl(
        &c,
        "default",
        &[
            "rollout",
            "status",
            "daemonset/edge-node-agent",
            "--timeout=30s",
        ],
    )
    .await;
    let pods = wait_pods(&c, "default", "3 ready pods", |p| {
        p.len() == 3 && p.iter().all(ready)
    })
    .await;
    for p in &pods {
        assert_eq!(
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some("edge-1"),
            "{:?} left the edge",
            p.metadata.name
        );
    }
    kubectl(&c, "default", &["delete", "-f", file]).await;
    wait_pods(&c, "default", "no pods left", |p| p.is_empty()).await;
}

#[tokio::test]
async fn workload_kinds_are_discovered_with_short_names_categories_and_scale() {
    let c = cluster::connect().await.expect("connect");
    let out = c
        .kubectl_run(&["api-resources", "--api-group=apps", "--no-headers"], None)
        .await
        .unwrap();
    assert!(out.success, "{out:?}");
    for (name, short) in [
        ("deployments", "deploy"),
        ("replicasets", "rs"),
        ("daemonsets", "ds"),
        ("statefulsets", "sts"),
    ] {
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_default();
        assert!(
            line.split_whitespace().any(|w| w == short),
            "{name}: {line:?}"
        );
    }
    let raw = c
        .kubectl_run(&["get", "--raw", "/apis/apps/v1"], None)
        .await
        .unwrap();
    let v: Value = serde_json::from_str(&raw.stdout).expect("APIResourceList");
    let find = |n: &str| {
        v["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == n)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(find("deployments")["categories"], json!(["all"]));
    let scale = find("deployments/scale");
    assert_eq!(
        (
            scale["group"].as_str(),
            scale["version"].as_str(),
            scale["kind"].as_str()
        ),
        (Some("autoscaling"), Some("v1"), Some("Scale"))
    );
    assert!(find("statefulsets/scale").is_object() && find("replicasets/scale").is_object());
    let batch = c
        .kubectl_run(&["get", "--raw", "/apis/batch/v1"], None)
        .await
        .unwrap();
    let b: Value = serde_json::from_str(&batch.stdout).expect("APIResourceList");
    let jobs = b["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "jobs")
        .cloned()
        .unwrap();
    assert_eq!(jobs["categories"], json!(["all"]));
    assert!(
        jobs.get("shortNames").is_none(),
        "jobs have no short name: {jobs}"
    );
}
