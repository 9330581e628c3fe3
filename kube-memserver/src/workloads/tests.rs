//! Unit tests of the scheduler and the controllers against an in-process store (no HTTP): each
//! test runs the passes by hand and plays the kubelet by writing pod status.

use serde_json::{Value, json};

use super::{apps, batch, daemonset, deployment, job, replicaset, scheduler, statefulset};
use crate::Config;
use crate::state::State;
use crate::store::Mutation;
use crate::tokens::TokenIssuer;
use crate::verbs::{self, WriteOptions};

/// A state whose Job retries are immediate (the backoff has its own test).
fn state() -> State {
    state_with(Config {
        job_backoff_base: std::time::Duration::ZERO,
        ..Config::default()
    })
}

fn state_with(config: Config) -> State {
    let pki = crate::tls::make_pki(&[], None).expect("pki");
    let kubelet = crate::kubelet::client_configs(
        &pki.kubelet_client_der,
        &pki.kubelet_client_key_der,
        Some(&pki.ca_der),
    )
    .expect("kubelet tls");
    let st = State::new(
        config,
        TokenIssuer::new(b"k".to_vec()),
        "t".into(),
        "ca".into(),
        kubelet,
    );
    let ns = st.core("namespaces");
    verbs::create(
        &st,
        &ns,
        "",
        json!({"metadata": {"name": "default"}}),
        &WriteOptions::default(),
    )
    .expect("namespace");
    st
}

fn add_node(st: &State, name: &str, labels: Value, taints: Value, cpu: &str) {
    let node = json!({"metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": {"allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]}});
    verbs::create(st, &st.core("nodes"), "", node, &WriteOptions::default()).expect("node");
}

fn create(st: &State, group: &str, plural: &str, body: Value) -> Value {
    let info = st.resources.lookup(group, "v1", plural).expect("kind");
    verbs::create(st, &info, "default", body, &WriteOptions::default())
        .expect("create")
        .value()
}

fn get(st: &State, group: &str, plural: &str, name: &str) -> Value {
    let info = st.resources.lookup(group, "v1", plural).expect("kind");
    verbs::get(st, &info, "default", name).expect("get").value()
}

fn pods(st: &State) -> Vec<Value> {
    st.table(&st.core("pods"))
        .in_namespace("default")
        .iter()
        .map(|p| p.value())
        .collect()
}

fn live_pods(st: &State) -> Vec<Value> {
    pods(st)
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect()
}

/// What a kubelet reports for a pod it runs (`phase`), or removes when it is being deleted.
fn kubelet(st: &State, phase: &str) {
    let table = st.table(&st.core("pods"));
    for p in pods(st) {
        let key = ("default".to_string(), crate::meta::name(&p).to_string());
        if !p["metadata"]["deletionTimestamp"].is_null() {
            let _ = table.mutate(&key, |_| Ok(Mutation::Remove));
            continue;
        }
        if p["spec"]["nodeName"].as_str().is_none_or(str::is_empty)
            || p["status"]["phase"] != "Pending"
        {
            continue;
        }
        let _ = table.mutate(&key, |cur| {
            let mut v = cur.expect("pod").value();
            v["status"]["phase"] = json!(phase);
            v["status"]["conditions"] = json!([{"type": "Ready", "status": if phase == "Running" { "True" } else { "False" },
                "lastTransitionTime": crate::meta::now_time()}]);
            Ok(Mutation::Put(v))
        });
    }
}

fn settle(st: &State, phase: &str, rounds: usize) {
    for _ in 0..rounds {
        deployment::pass(st);
        replicaset::pass(st);
        daemonset::pass(st);
        statefulset::pass(st);
        job::pass(st);
        scheduler::pass(st);
        kubelet(st, phase);
    }
}

fn template(labels: Value, extra_spec: Value) -> Value {
    let mut spec = json!({"containers": [{"name": "c", "image": "busybox:1.36"}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra_spec.as_object()) {
        s.extend(e.clone());
    }
    json!({"metadata": {"labels": labels}, "spec": spec})
}

fn pod(name: &str, spec: Value) -> Value {
    let mut s = json!({"containers": [{"name": "c", "image": "busybox:1.36"}]});
    if let (Some(s), Some(e)) = (s.as_object_mut(), spec.as_object()) {
        s.extend(e.clone());
    }
    json!({"metadata": {"name": name}, "spec": s})
}

fn node_of(st: &State, name: &str) -> Option<String> {
    get(st, "", "pods", name)["spec"]["nodeName"]
        .as_str()
        .map(str::to_string)
}

#[test]
fn scheduler_honours_taints_selectors_affinity_and_requests() {
    let st = state();
    add_node(
        &st,
        "edge-a",
        json!({"node-role.kubernetes.io/edge": "", "zone": "1"}),
        json!([{"key": "node-role.kubernetes.io/edge", "effect": "NoSchedule"}]),
        "2",
    );
    add_node(
        &st,
        "cloud-b",
        json!({"zone": "2", "size": "8"}),
        json!([]),
        "1",
    );
    create(&st, "", "pods", pod("plain", json!({})));
    create(
        &st,
        "",
        "pods",
        pod(
            "tolerant",
            json!({"nodeSelector": {"zone": "1"},
        "tolerations": [{"key": "node-role.kubernetes.io/edge", "operator": "Exists", "effect": "NoSchedule"}]}),
        ),
    );
    create(
        &st,
        "",
        "pods",
        pod("intolerant", json!({"nodeSelector": {"zone": "1"}})),
    );
    create(
        &st,
        "",
        "pods",
        pod(
            "affine",
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "size", "operator": "Gt", "values": ["4"]}]}]}}}}),
        ),
    );
    create(
        &st,
        "",
        "pods",
        pod(
            "by-name",
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["cloud-b"]}]}]}}}}),
        ),
    );
    create(
        &st,
        "",
        "pods",
        pod(
            "greedy",
            json!({"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1500m"}}}]}),
        ),
    );
    scheduler::pass(&st);
    assert_eq!(node_of(&st, "plain").as_deref(), Some("cloud-b"));
    assert_eq!(node_of(&st, "tolerant").as_deref(), Some("edge-a"));
    assert_eq!(node_of(&st, "intolerant"), None);
    assert_eq!(node_of(&st, "affine").as_deref(), Some("cloud-b"));
    assert_eq!(node_of(&st, "by-name").as_deref(), Some("cloud-b"));
    assert_eq!(
        node_of(&st, "greedy"),
        None,
        "1.5 cpu fits neither the tainted node nor a 1-cpu node"
    );
    let p = get(&st, "", "pods", "intolerant");
    let cond = p["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "PodScheduled")
        .unwrap()
        .clone();
    assert_eq!(cond["status"], "False");
    assert_eq!(cond["reason"], "Unschedulable");
    assert_eq!(
        cond["message"],
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {node-role.kubernetes.io/edge: }. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
    );
    let greedy = get(&st, "", "pods", "greedy");
    let msg = greedy["status"]["conditions"][0]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(msg.contains("1 Insufficient cpu"), "{msg}");
    let events: Vec<Value> = st
        .table(&st.core("events"))
        .in_namespace("default")
        .iter()
        .map(|e| e.value())
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "FailedScheduling"
                && e["involvedObject"]["name"] == "intolerant")
    );
    // A second pass with nothing new writes no second event.
    let before = events.len();
    scheduler::pass(&st);
    assert_eq!(
        st.table(&st.core("events")).in_namespace("default").len(),
        before
    );
    // The bound pod is marked scheduled.
    let plain = get(&st, "", "pods", "plain");
    assert!(
        plain["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "PodScheduled" && c["status"] == "True")
    );
    // An unschedulable node takes nothing more.
    let nodes = st.core("nodes");
    let mut b = verbs::get(&st, &nodes, "", "cloud-b").unwrap().value();
    b["spec"]["unschedulable"] = json!(true);
    verbs::update(&st, &nodes, "", "cloud-b", b, &WriteOptions::default()).unwrap();
    create(&st, "", "pods", pod("late", json!({})));
    scheduler::pass(&st);
    assert_eq!(node_of(&st, "late"), None);
}

#[test]
fn quantities_parse_like_resource_quantity() {
    assert_eq!(super::fit::parse_milli("100m"), Some(100));
    assert_eq!(super::fit::parse_milli("1.5"), Some(1500));
    assert_eq!(super::fit::parse_milli("1Ki"), Some(1_024_000));
    assert_eq!(super::fit::parse_milli("2e3"), Some(2_000_000));
    assert_eq!(super::fit::parse_milli("x"), None);
    assert_eq!(super::fit::parse_milli(""), None);
}

#[test]
fn replica_set_keeps_its_replica_count_and_reports_readiness() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "4");
    create(
        &st,
        "apps",
        "replicasets",
        json!({"metadata": {"name": "rs"}, "spec": {"replicas": 3,
        "selector": {"matchLabels": {"app": "a"}}, "template": template(json!({"app": "a"}), json!({}))}}),
    );
    settle(&st, "Running", 3);
    let ps = live_pods(&st);
    assert_eq!(ps.len(), 3);
    assert!(ps.iter().all(|p| crate::meta::name(p).starts_with("rs-")
        && p["metadata"]["ownerReferences"][0]["controller"] == true));
    let rs = get(&st, "apps", "replicasets", "rs");
    assert_eq!(rs["status"]["readyReplicas"], 3);
    assert_eq!(rs["status"]["observedGeneration"], 1);
    let info = apps(&st, "replicasets").unwrap();
    let mut v = rs.clone();
    v["spec"]["replicas"] = json!(1);
    verbs::update(&st, &info, "default", "rs", v, &WriteOptions::default()).unwrap();
    settle(&st, "Running", 3);
    assert_eq!(live_pods(&st).len(), 1);
    assert_eq!(
        get(&st, "apps", "replicasets", "rs")["status"]["replicas"],
        1
    );
}

#[test]
fn deployment_rolls_a_new_template_out_and_keeps_revisions() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "8");
    create(
        &st,
        "apps",
        "deployments",
        json!({"metadata": {"name": "web", "annotations": {"kubernetes.io/change-cause": "first"}},
        "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "web"}}, "template": template(json!({"app": "web"}), json!({}))}}),
    );
    settle(&st, "Running", 6);
    let d = get(&st, "apps", "deployments", "web");
    assert_eq!(d["status"]["availableReplicas"], 4, "{d}");
    assert_eq!(d["metadata"]["annotations"][deployment::REVISION], "1");
    let rss: Vec<Value> = st
        .table(&apps(&st, "replicasets").unwrap())
        .in_namespace("default")
        .iter()
        .map(|o| o.value())
        .collect();
    assert_eq!(rss.len(), 1);
    let hash = rss[0]["metadata"]["labels"][deployment::HASH_LABEL]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(crate::meta::name(&rss[0]), format!("web-{hash}"));
    assert_eq!(
        rss[0]["metadata"]["annotations"]["kubernetes.io/change-cause"],
        "first"
    );
    assert!(
        live_pods(&st)
            .iter()
            .all(|p| p["metadata"]["labels"][deployment::HASH_LABEL] == hash.as_str())
    );
    let progressing = d["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Progressing")
        .unwrap()
        .clone();
    assert_eq!(progressing["reason"], "NewReplicaSetAvailable");

    // A new image: surge by 1 (25% of 4), never fewer than 3 available.
    let info = apps(&st, "deployments").unwrap();
    let mut v = d.clone();
    v["spec"]["template"]["spec"]["containers"][0]["image"] = json!("busybox:1.37");
    verbs::update(&st, &info, "default", "web", v, &WriteOptions::default()).unwrap();
    for _ in 0..30 {
        settle(&st, "Running", 1);
        let ready = live_pods(&st)
            .iter()
            .filter(|p| super::pod_ready(p))
            .count();
        assert!(ready >= 3, "availability dropped to {ready}");
        assert!(live_pods(&st).len() <= 5, "surged past 5 pods");
    }
    let d = get(&st, "apps", "deployments", "web");
    assert_eq!(d["metadata"]["annotations"][deployment::REVISION], "2");
    assert_eq!(d["status"]["updatedReplicas"], 4, "{}", d["status"]);
    assert_eq!(d["status"]["replicas"], 4);
    assert_eq!(d["status"]["observedGeneration"], 2);
    let pods = live_pods(&st);
    assert_eq!(pods.len(), 4);
    assert!(
        pods.iter()
            .all(|p| p["spec"]["containers"][0]["image"] == "busybox:1.37")
    );
    let rss: Vec<Value> = st
        .table(&apps(&st, "replicasets").unwrap())
        .in_namespace("default")
        .iter()
        .map(|o| o.value())
        .collect();
    assert_eq!(rss.len(), 2, "the old ReplicaSet stays as history");
    let old = rss
        .iter()
        .find(|r| r["metadata"]["labels"][deployment::HASH_LABEL] == hash.as_str())
        .unwrap();
    assert_eq!(old["spec"]["replicas"], 0);
}

#[test]
fn daemon_set_runs_on_every_matching_node_and_tolerates_node_conditions() {
    let st = state();
    add_node(
        &st,
        "edge-1",
        json!({"node-role.kubernetes.io/edge": ""}),
        json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]),
        "1",
    );
    add_node(
        &st,
        "edge-2",
        json!({"node-role.kubernetes.io/edge": ""}),
        json!([]),
        "1",
    );
    add_node(&st, "cloud", json!({}), json!([]), "1");
    create(
        &st,
        "apps",
        "daemonsets",
        json!({"metadata": {"name": "agent"}, "spec": {
        "selector": {"matchLabels": {"app": "agent"}},
        "template": template(json!({"app": "agent"}), json!({"nodeSelector": {"node-role.kubernetes.io/edge": ""}}))}}),
    );
    settle(&st, "Running", 3);
    let mut nodes: Vec<String> = live_pods(&st)
        .iter()
        .filter_map(|p| p["spec"]["nodeName"].as_str().map(str::to_string))
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["edge-1", "edge-2"]);
    let p = &live_pods(&st)[0];
    assert_eq!(
        p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchFields"][0]["key"],
        "metadata.name"
    );
    assert!(p["metadata"]["labels"]["controller-revision-hash"].is_string());
    let ds = get(&st, "apps", "daemonsets", "agent");
    assert_eq!(ds["status"]["desiredNumberScheduled"], 2);
    assert_eq!(ds["status"]["numberReady"], 2);
    assert_eq!(ds["status"]["numberMisscheduled"], 0);
    let revs = st
        .table(&apps(&st, "controllerrevisions").unwrap())
        .in_namespace("default");
    assert_eq!(revs.len(), 1);
    assert_eq!(revs[0].value()["revision"], 1);
}

#[test]
fn stateful_set_creates_pods_in_order_and_removes_from_the_top() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "4");
    create(
        &st,
        "apps",
        "statefulsets",
        json!({"metadata": {"name": "db"}, "spec": {"replicas": 3, "serviceName": "db",
        "selector": {"matchLabels": {"app": "db"}}, "template": template(json!({"app": "db"}), json!({}))}}),
    );
    statefulset::pass(&st);
    statefulset::pass(&st);
    let names: Vec<String> = live_pods(&st)
        .iter()
        .map(|p| crate::meta::name(p).to_string())
        .collect();
    assert_eq!(
        names,
        ["db-0"],
        "db-1 waits for db-0 to be Running and Ready"
    );
    settle(&st, "Running", 5);
    let mut names: Vec<String> = live_pods(&st)
        .iter()
        .map(|p| crate::meta::name(p).to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["db-0", "db-1", "db-2"]);
    let p = get(&st, "", "pods", "db-1");
    assert_eq!(p["spec"]["hostname"], "db-1");
    assert_eq!(p["spec"]["subdomain"], "db");
    assert_eq!(
        p["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"],
        "db-1"
    );
    let sts = get(&st, "apps", "statefulsets", "db");
    assert_eq!(sts["status"]["readyReplicas"], 3);
    assert_eq!(
        sts["status"]["currentRevision"],
        sts["status"]["updateRevision"]
    );
    // Scale to 1: db-2 goes first.
    let info = apps(&st, "statefulsets").unwrap();
    let mut v = sts.clone();
    v["spec"]["replicas"] = json!(1);
    verbs::update(&st, &info, "default", "db", v, &WriteOptions::default()).unwrap();
    statefulset::pass(&st);
    let terminating: Vec<String> = pods(&st)
        .iter()
        .filter(|p| !p["metadata"]["deletionTimestamp"].is_null() || p["metadata"].is_null())
        .map(|p| crate::meta::name(p).to_string())
        .collect();
    let live: Vec<String> = live_pods(&st)
        .iter()
        .map(|p| crate::meta::name(p).to_string())
        .collect();
    assert!(
        !live.contains(&"db-2".to_string()),
        "db-2 is removed first: {live:?} {terminating:?}"
    );
    assert!(
        live.contains(&"db-1".to_string()),
        "db-1 waits for db-2: {live:?}"
    );
    settle(&st, "Running", 4);
    let names: Vec<String> = live_pods(&st)
        .iter()
        .map(|p| crate::meta::name(p).to_string())
        .collect();
    assert_eq!(names, ["db-0"]);
}

#[test]
fn job_completes_after_its_completions_and_fails_past_its_backoff_limit() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "4");
    create(
        &st,
        "batch",
        "jobs",
        json!({"metadata": {"name": "ok"}, "spec": {"completions": 3, "parallelism": 2,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}),
    );
    job::pass(&st);
    assert_eq!(live_pods(&st).len(), 2, "parallelism 2");
    settle(&st, "Succeeded", 5);
    let j = get(&st, "batch", "jobs", "ok");
    assert_eq!(j["status"]["succeeded"], 3, "{}", j["status"]);
    assert!(
        j["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Complete" && c["status"] == "True")
    );
    assert!(j["status"]["completionTime"].is_string());
    assert_eq!(pods(&st).len(), 3, "no pod beyond the completions");

    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "4");
    create(
        &st,
        "batch",
        "jobs",
        json!({"metadata": {"name": "bad"}, "spec": {"backoffLimit": 1,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}),
    );
    settle(&st, "Failed", 6);
    let j = get(&st, "batch", "jobs", "bad");
    let failed = j["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Failed")
        .cloned()
        .unwrap();
    assert_eq!(failed["reason"], "BackoffLimitExceeded");
    assert_eq!(j["status"]["failed"], 2);
}

#[test]
fn controllers_survive_malformed_stored_objects() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "4");
    let shapes = [
        json!({"spec": "x", "status": 5}),
        json!({"spec": {"replicas": "many", "selector": "x", "template": 7, "strategy": {"type": 1, "rollingUpdate": {"maxSurge": "abc%"}}}}),
        json!({"spec": {"replicas": -3, "selector": {"matchLabels": {"a": 1}, "matchExpressions": [{"operator": "Gt"}]}, "template": {"metadata": "m", "spec": {"containers": "c"}}}}),
        json!({"spec": {"replicas": 2, "selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "t"}}}, "tolerations": 3, "nodeSelector": [1]}}, "completions": "x", "updateStrategy": {"rollingUpdate": {"partition": "p"}}}}),
    ];
    let shapes: Vec<Value> = shapes
        .into_iter()
        .chain([
            json!({"spec": {"replicas": i64::MAX, "revisionHistoryLimit": i64::MIN, "minReadySeconds": i64::MAX,
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "9223372036854775807%", "maxUnavailable": i64::MAX}},
                "selector": {"matchLabels": {"a": "b"}}, "completions": i64::MAX, "parallelism": i64::MAX, "backoffLimit": i64::MIN,
                "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i",
                    "resources": {"requests": {"cpu": "1e300", "memory": "-5Ei"}}}]}}},
                "status": {"replicas": i64::MAX, "availableReplicas": i64::MIN, "collisionCount": i64::MAX}}),
        ])
        .collect();
    for (group, plural) in [
        ("apps", "deployments"),
        ("apps", "replicasets"),
        ("apps", "daemonsets"),
        ("apps", "statefulsets"),
        ("batch", "jobs"),
    ] {
        let info = st.resources.lookup(group, "v1", plural).unwrap();
        for (i, s) in shapes.iter().enumerate() {
            let mut v = s.clone();
            v["metadata"] = json!({"name": format!("bad-{i}"), "namespace": "default", "uid": format!("{plural}-{i}")});
            st.table(&info)
                .mutate(&("default".into(), format!("bad-{i}")), |_| {
                    Ok(Mutation::Put(v))
                })
                .unwrap();
        }
    }
    let pods = st.core("pods");
    st.table(&pods).mutate(&("default".into(), "odd".into()), |_| Ok(Mutation::Put(json!({"metadata": {"name": "odd", "namespace": "default"},
        "spec": {"containers": [{"resources": {"requests": {"cpu": [1], "memory": "1Zi"}}}], "tolerations": "x", "affinity": 5}})))).unwrap();
    settle(&st, "Running", 3);
}

fn set_taints(st: &State, node: &str, taints: Value) {
    let info = st.core("nodes");
    let mut n = verbs::get(st, &info, "", node).unwrap().value();
    n["spec"]["taints"] = taints;
    verbs::update(st, &info, "", node, n, &WriteOptions::default()).unwrap();
}

#[test]
fn daemon_pods_stay_through_no_schedule_taints_and_leave_on_untolerated_no_execute() {
    let st = state();
    add_node(&st, "edge-1", json!({}), json!([]), "1");
    create(
        &st,
        "apps",
        "daemonsets",
        json!({"metadata": {"name": "agent"}, "spec": {
        "selector": {"matchLabels": {"app": "agent"}}, "template": template(json!({"app": "agent"}), json!({}))}}),
    );
    settle(&st, "Running", 3);
    assert_eq!(live_pods(&st).len(), 1);
    // The node goes NotReady: node lifecycle adds not-ready NoSchedule (and NoExecute, tolerated).
    set_taints(
        &st,
        "edge-1",
        json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]),
    );
    settle(&st, "Running", 3);
    assert_eq!(
        live_pods(&st).len(),
        1,
        "a NoSchedule taint does not evict a daemon pod"
    );
    let ds = get(&st, "apps", "daemonsets", "agent");
    assert_eq!(ds["status"]["desiredNumberScheduled"], 0);
    assert_eq!(ds["status"]["numberMisscheduled"], 1);
    set_taints(
        &st,
        "edge-1",
        json!([{"key": "maintenance", "effect": "NoExecute"}]),
    );
    settle(&st, "Running", 3);
    assert!(
        live_pods(&st).is_empty(),
        "an untolerated NoExecute taint evicts it"
    );
}

#[test]
fn a_pod_relabelled_out_of_its_replica_set_is_released_and_replaced() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "4");
    create(
        &st,
        "apps",
        "replicasets",
        json!({"metadata": {"name": "rs"}, "spec": {"replicas": 1,
        "selector": {"matchLabels": {"app": "a"}}, "template": template(json!({"app": "a"}), json!({}))}}),
    );
    settle(&st, "Running", 2);
    let first = live_pods(&st).remove(0);
    let name = crate::meta::name(&first).to_string();
    let mut v = first.clone();
    v["metadata"]["labels"]["app"] = json!("debug");
    verbs::update(
        &st,
        &st.core("pods"),
        "default",
        &name,
        v,
        &WriteOptions::default(),
    )
    .unwrap();
    settle(&st, "Running", 2);
    let released = get(&st, "", "pods", &name);
    assert!(
        released["metadata"]["ownerReferences"].is_null(),
        "{released}"
    );
    let owned: Vec<Value> = live_pods(&st)
        .into_iter()
        .filter(|p| super::controller_uid(p).is_some())
        .collect();
    assert_eq!(owned.len(), 1, "a replacement keeps the count");
    assert_ne!(crate::meta::name(&owned[0]), name);
}

#[test]
fn scale_subresource_reads_and_writes_replicas() {
    use crate::patch::PatchType;
    let st = state();
    create(
        &st,
        "apps",
        "deployments",
        json!({"metadata": {"name": "web"}, "spec": {"replicas": 2,
        "selector": {"matchLabels": {"app": "web"}}, "template": template(json!({"app": "web"}), json!({}))}}),
    );
    let info = apps(&st, "deployments").unwrap();
    let scale = verbs::get_scale(&st, &info, "default", "web").unwrap();
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["apiVersion"], "autoscaling/v1");
    assert_eq!(scale["spec"]["replicas"], 2);
    assert_eq!(scale["status"]["selector"], "app=web");
    let out = verbs::write_scale(
        &st,
        &info,
        "default",
        "web",
        None,
        Some((PatchType::Merge, br#"{"spec":{"replicas":5}}"#.as_slice())),
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(out["spec"]["replicas"], 5);
    let d = get(&st, "apps", "deployments", "web");
    assert_eq!(d["spec"]["replicas"], 5);
    assert_eq!(d["metadata"]["generation"], 2);
    // A stale resourceVersion conflicts; junk is refused, never a panic.
    let mut stale = scale.clone();
    stale["spec"]["replicas"] = json!(1);
    let err = verbs::write_scale(
        &st,
        &info,
        "default",
        "web",
        Some(stale),
        None,
        &WriteOptions::default(),
    )
    .unwrap_err();
    assert_eq!(err.code, 409);
    for junk in [
        json!("x"),
        json!({"spec": {"replicas": "many"}}),
        json!({"spec": {"replicas": -1}}),
        json!({"spec": 3}),
    ] {
        assert!(
            verbs::write_scale(
                &st,
                &info,
                "default",
                "web",
                Some(junk),
                None,
                &WriteOptions::default()
            )
            .is_err()
        );
    }
    for body in [
        &b"{"[..],
        b"[]",
        b"null",
        br#"[{"op":"replace","path":"/spec","value":1}]"#,
    ] {
        for pt in [
            PatchType::Merge,
            PatchType::Json,
            PatchType::Strategic,
            PatchType::Apply,
        ] {
            let _ = verbs::write_scale(
                &st,
                &info,
                "default",
                "web",
                None,
                Some((pt, body)),
                &WriteOptions::default(),
            );
        }
    }
    assert!(verbs::get_scale(&st, &info, "default", "missing").is_err());
}

#[test]
fn container_restarts_under_on_failure_count_towards_the_backoff_limit() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "4");
    create(
        &st,
        "batch",
        "jobs",
        json!({"metadata": {"name": "flaky"}, "spec": {"backoffLimit": 2,
        "template": {"spec": {"restartPolicy": "OnFailure", "containers": [{"name": "c", "image": "busybox"}]}}}}),
    );
    settle(&st, "Running", 2);
    let pod = live_pods(&st).remove(0);
    let key = ("default".to_string(), crate::meta::name(&pod).to_string());
    st.table(&st.core("pods"))
        .mutate(&key, |cur| {
            let mut v = cur.expect("pod").value();
            v["status"]["containerStatuses"] =
                json!([{"name": "c", "restartCount": 3, "ready": false}]);
            Ok(Mutation::Put(v))
        })
        .unwrap();
    job::pass(&st);
    let j = get(&st, "batch", "jobs", "flaky");
    let failed = j["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Failed")
        .cloned();
    assert_eq!(
        failed.map(|c| c["reason"].clone()),
        Some(json!("BackoffLimitExceeded")),
        "{}",
        j["status"]
    );
    assert!(live_pods(&st).is_empty(), "the active pod is deleted");
}

#[test]
fn a_rollout_without_progress_exceeds_its_deadline() {
    let st = state();
    // No node: the new pods never run.
    create(
        &st,
        "apps",
        "deployments",
        json!({"metadata": {"name": "stuck"}, "spec": {"replicas": 1, "progressDeadlineSeconds": 1,
        "selector": {"matchLabels": {"app": "s"}}, "template": template(json!({"app": "s"}), json!({}))}}),
    );
    settle(&st, "Running", 3);
    let progressing = |st: &State| {
        get(st, "apps", "deployments", "stuck")["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Progressing")
            .cloned()
            .unwrap()
    };
    assert_eq!(progressing(&st)["status"], "True");
    std::thread::sleep(std::time::Duration::from_millis(2100));
    settle(&st, "Running", 1);
    let c = progressing(&st);
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("ProgressDeadlineExceeded")),
        "{c}"
    );
}

#[test]
fn stateful_set_pods_get_their_own_claims() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "4");
    create(
        &st,
        "apps",
        "statefulsets",
        json!({"metadata": {"name": "db"}, "spec": {"replicas": 2, "serviceName": "db",
        "selector": {"matchLabels": {"app": "db"}}, "template": template(json!({"app": "db"}), json!({})),
        "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}}),
    );
    settle(&st, "Running", 4);
    let pvcs: Vec<String> = st
        .table(&st.core("persistentvolumeclaims"))
        .in_namespace("default")
        .iter()
        .map(|o| o.name().to_string())
        .collect();
    assert_eq!(pvcs, ["data-db-0", "data-db-1"]);
    let p = get(&st, "", "pods", "db-1");
    let volume = p["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "data")
        .cloned()
        .unwrap();
    assert_eq!(volume["persistentVolumeClaim"]["claimName"], "data-db-1");
}

#[test]
fn scaling_during_a_rollout_is_spread_over_the_replica_sets_in_proportion() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "8");
    create(
        &st,
        "apps",
        "deployments",
        json!({"metadata": {"name": "web"}, "spec": {"replicas": 4,
        "selector": {"matchLabels": {"app": "web"}}, "template": template(json!({"app": "web"}), json!({}))}}),
    );
    settle(&st, "Running", 6);
    let info = apps(&st, "deployments").unwrap();
    let mut d = get(&st, "apps", "deployments", "web");
    d["spec"]["template"]["spec"]["containers"][0]["image"] = json!("busybox:1.37");
    verbs::update(&st, &info, "default", "web", d, &WriteOptions::default()).unwrap();
    // The new pods never become ready: with maxSurge 1 and maxUnavailable 1 (25% of 4) the
    // rollout stalls at old 3 + new 2.
    for _ in 0..4 {
        deployment::pass(&st);
        replicaset::pass(&st);
        scheduler::pass(&st);
    }
    let sizes = |st: &State| -> Vec<(i64, String)> {
        let mut v: Vec<(i64, String)> = st
            .table(&apps(st, "replicasets").unwrap())
            .in_namespace("default")
            .iter()
            .map(|o| o.value())
            .map(|rs| {
                (
                    rs["spec"]["replicas"].as_i64().unwrap(),
                    rs["spec"]["template"]["spec"]["containers"][0]["image"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                )
            })
            .collect();
        v.sort_by(|a, b| a.1.cmp(&b.1));
        v
    };
    let before = sizes(&st);
    assert_eq!(
        before,
        [
            (3, "busybox:1.36".to_string()),
            (2, "busybox:1.37".to_string())
        ],
        "mid-rollout"
    );
    let mut d = get(&st, "apps", "deployments", "web");
    d["spec"]["replicas"] = json!(8);
    verbs::update(&st, &info, "default", "web", d, &WriteOptions::default()).unwrap();
    deployment::pass(&st);
    // allowed = 8 + 2 (25% surge) = 10; 5 to add: old 3*10/5 = 6 (+3), new 2*10/5 = 4 (+2).
    assert_eq!(
        sizes(&st),
        [
            (6, "busybox:1.36".to_string()),
            (4, "busybox:1.37".to_string())
        ]
    );
}

#[test]
fn a_paused_deployment_scales_but_does_not_roll_out_until_resumed() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "8");
    create(
        &st,
        "apps",
        "deployments",
        json!({"metadata": {"name": "web"}, "spec": {"replicas": 2,
        "selector": {"matchLabels": {"app": "web"}}, "template": template(json!({"app": "web"}), json!({}))}}),
    );
    settle(&st, "Running", 5);
    let info = apps(&st, "deployments").unwrap();
    let mut d = get(&st, "apps", "deployments", "web");
    d["spec"]["paused"] = json!(true);
    d["spec"]["replicas"] = json!(3);
    d["spec"]["template"]["spec"]["containers"][0]["image"] = json!("busybox:1.37");
    verbs::update(&st, &info, "default", "web", d, &WriteOptions::default()).unwrap();
    settle(&st, "Running", 5);
    let pods = live_pods(&st);
    assert_eq!(pods.len(), 3, "scaling works while paused");
    assert!(
        pods.iter()
            .all(|p| p["spec"]["containers"][0]["image"] == "busybox:1.36")
    );
    let progressing = get(&st, "apps", "deployments", "web")["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Progressing")
        .cloned()
        .unwrap();
    assert_eq!(progressing["reason"], "DeploymentPaused");
    let mut d = get(&st, "apps", "deployments", "web");
    d["spec"]["paused"] = json!(false);
    verbs::update(&st, &info, "default", "web", d, &WriteOptions::default()).unwrap();
    settle(&st, "Running", 20);
    let pods = live_pods(&st);
    assert_eq!(pods.len(), 3);
    assert!(
        pods.iter()
            .all(|p| p["spec"]["containers"][0]["image"] == "busybox:1.37")
    );
}

#[test]
fn scheduler_honours_host_ports_and_inter_pod_affinity() {
    let st = state();
    add_node(
        &st,
        "a",
        json!({"kubernetes.io/hostname": "a", "zone": "z1"}),
        json!([]),
        "8",
    );
    add_node(
        &st,
        "b",
        json!({"kubernetes.io/hostname": "b", "zone": "z2"}),
        json!([]),
        "8",
    );
    let port = json!({"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80, "hostPort": 8080}]}]});
    for name in ["p1", "p2", "p3"] {
        create(&st, "", "pods", pod(name, port.clone()));
    }
    scheduler::pass(&st);
    let mut placed: Vec<Option<String>> =
        ["p1", "p2", "p3"].iter().map(|n| node_of(&st, n)).collect();
    placed.sort();
    assert_eq!(
        placed,
        [None, Some("a".to_string()), Some("b".to_string())],
        "one host port 8080 per node"
    );
    let p3 = ["p1", "p2", "p3"]
        .into_iter()
        .find(|n| node_of(&st, n).is_none())
        .unwrap();
    let msg = get(&st, "", "pods", p3)["status"]["conditions"][0]["message"].clone();
    assert!(
        msg.as_str()
            .unwrap()
            .contains("2 node(s) didn't have free ports for the requested pod ports"),
        "{msg}"
    );

    // Anti-affinity by hostname: two replicas, two nodes, the third stays pending.
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}}});
    for name in ["db-0", "db-1", "db-2"] {
        let mut p = pod(name, anti.clone());
        p["metadata"]["labels"] = json!({"app": "db"});
        create(&st, "", "pods", p);
    }
    scheduler::pass(&st);
    let db: Vec<Option<String>> = ["db-0", "db-1", "db-2"]
        .iter()
        .map(|n| node_of(&st, n))
        .collect();
    assert_eq!(
        db,
        [Some("a".to_string()), Some("b".to_string()), None],
        "{db:?}"
    );
    // Affinity by zone: a cache goes where db-1 (zone z2) is.
    let near = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["db"]}]}, "topologyKey": "zone"}]},
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z1"]}]}]}}}});
    create(&st, "", "pods", pod("cache", near));
    // Affinity to nothing that exists (and not to itself): pending.
    let lonely = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "ghost"}}, "topologyKey": "zone"}]}}});
    create(&st, "", "pods", pod("lonely", lonely));
    scheduler::pass(&st);
    assert_eq!(node_of(&st, "cache").as_deref(), Some("b"));
    assert_eq!(node_of(&st, "lonely"), None);
}

#[test]
fn a_finished_job_with_a_ttl_is_deleted_with_its_pods() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "4");
    create(
        &st,
        "batch",
        "jobs",
        json!({"metadata": {"name": "once"}, "spec": {"ttlSecondsAfterFinished": 0,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}),
    );
    create(
        &st,
        "batch",
        "jobs",
        json!({"metadata": {"name": "kept"}, "spec": {
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}),
    );
    settle(&st, "Succeeded", 4);
    let info = batch(&st, "jobs").unwrap();
    assert!(
        verbs::get(&st, &info, "default", "once").is_err(),
        "deleted after its TTL"
    );
    assert!(
        verbs::get(&st, &info, "default", "kept").is_ok(),
        "no TTL, kept"
    );
}

#[test]
fn an_indexed_job_runs_one_pod_per_index() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "4");
    create(
        &st,
        "batch",
        "jobs",
        json!({"metadata": {"name": "idx"}, "spec": {"completions": 3, "parallelism": 2, "completionMode": "Indexed",
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}),
    );
    job::pass(&st);
    let mut first: Vec<String> = live_pods(&st)
        .iter()
        .map(|p| {
            p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    first.sort();
    assert_eq!(first, ["0", "1"]);
    let p = live_pods(&st)
        .into_iter()
        .find(|p| p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1")
        .unwrap();
    assert!(crate::meta::name(&p).starts_with("idx-1-"));
    assert_eq!(p["spec"]["hostname"], "idx-1");
    assert_eq!(
        p["spec"]["containers"][0]["env"][0]["name"],
        "JOB_COMPLETION_INDEX"
    );
    settle(&st, "Succeeded", 5);
    let j = get(&st, "batch", "jobs", "idx");
    assert_eq!(j["status"]["completedIndexes"], "0-2", "{}", j["status"]);
    assert_eq!(j["status"]["succeeded"], 3);
    assert!(
        j["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Complete")
    );
    assert_eq!(pods(&st).len(), 3);
    // Indexed without completions is invalid.
    let info = batch(&st, "jobs").unwrap();
    let bad = json!({"metadata": {"name": "bad"}, "spec": {"completionMode": "Indexed", "parallelism": 2,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}});
    assert_eq!(
        verbs::create(&st, &info, "default", bad, &WriteOptions::default())
            .unwrap_err()
            .code,
        422
    );
}

#[test]
fn a_failed_job_pod_is_replaced_only_after_the_backoff() {
    let st = state_with(Config {
        job_backoff_base: std::time::Duration::from_millis(1500),
        ..Config::default()
    });
    add_node(&st, "n1", json!({}), json!([]), "4");
    create(
        &st,
        "batch",
        "jobs",
        json!({"metadata": {"name": "retry"}, "spec": {"backoffLimit": 3,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}),
    );
    settle(&st, "Failed", 3);
    assert_eq!(pods(&st).len(), 1, "no retry before the backoff");
    std::thread::sleep(std::time::Duration::from_millis(1700));
    job::pass(&st);
    assert_eq!(pods(&st).len(), 2, "a retry after it");
}

#[test]
fn a_deletion_held_by_finalizers_bumps_the_generation() {
    let st = state();
    create(
        &st,
        "apps",
        "deployments",
        json!({"metadata": {"name": "web"}, "spec": {"replicas": 0,
        "selector": {"matchLabels": {"app": "web"}}, "template": template(json!({"app": "web"}), json!({}))}}),
    );
    let info = apps(&st, "deployments").unwrap();
    let opts = verbs::DeleteOptions {
        propagation_policy: Some("Foreground".into()),
        ..Default::default()
    };
    match verbs::delete(&st, &info, "default", "web", &opts).unwrap() {
        verbs::Deleted::Pending(o) => assert_eq!(o.value()["metadata"]["generation"], 2),
        other => panic!("expected a pending deletion, got {other:?}"),
    }
}

#[test]
fn claim_retention_policies_hand_claims_to_the_garbage_collector() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "4");
    create(
        &st,
        "apps",
        "statefulsets",
        json!({"metadata": {"name": "db"}, "spec": {"replicas": 2, "serviceName": "db",
        "podManagementPolicy": "Parallel",
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Delete"},
        "selector": {"matchLabels": {"app": "db"}}, "template": template(json!({"app": "db"}), json!({})),
        "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}}),
    );
    settle(&st, "Running", 3);
    let pvc = |name: &str| {
        st.table(&st.core("persistentvolumeclaims"))
            .get(&("default".to_string(), name.to_string()))
            .map(|o| o.value())
    };
    assert_eq!(
        pvc("data-db-0").unwrap()["metadata"]["ownerReferences"][0]["kind"],
        "StatefulSet"
    );
    let info = apps(&st, "statefulsets").unwrap();
    let mut v = get(&st, "apps", "statefulsets", "db");
    v["spec"]["replicas"] = json!(1);
    verbs::update(&st, &info, "default", "db", v, &WriteOptions::default()).unwrap();
    settle(&st, "Running", 3);
    let handed = pvc("data-db-1").unwrap();
    assert_eq!(
        handed["metadata"]["ownerReferences"][0]["kind"], "Pod",
        "{handed}"
    );
    assert_eq!(
        pvc("data-db-0").unwrap()["metadata"]["ownerReferences"][0]["kind"],
        "StatefulSet"
    );
}

#[test]
fn a_replica_set_whose_pods_cannot_be_created_reports_replica_failure() {
    let st = state();
    create(
        &st,
        "apps",
        "replicasets",
        json!({"metadata": {"name": "bad"}, "spec": {"replicas": 1,
        "selector": {"matchLabels": {"app": "b"}},
        "template": {"metadata": {"labels": {"app": "b"}}, "spec": {"containers": [{"name": "Not_A_Label", "image": "i"}]}}}}),
    );
    replicaset::pass(&st);
    let rs = get(&st, "apps", "replicasets", "bad");
    let c = rs["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "ReplicaFailure")
        .cloned()
        .unwrap();
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("True"), Some("FailedCreate"))
    );
}

#[test]
fn topology_spread_constraints_keep_the_skew() {
    let st = state();
    add_node(&st, "a1", json!({"zone": "a"}), json!([]), "8");
    add_node(&st, "a2", json!({"zone": "a"}), json!([]), "8");
    add_node(&st, "b1", json!({"zone": "b"}), json!([]), "8");
    add_node(&st, "nozone", json!({}), json!([]), "8");
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}}}]});
    for i in 0..4 {
        let mut p = pod(&format!("web-{i}"), spread.clone());
        p["metadata"]["labels"] = json!({"app": "web"});
        create(&st, "", "pods", p);
        scheduler::pass(&st);
    }
    let zone = |n: Option<String>| match n.as_deref() {
        Some("a1") | Some("a2") => "a",
        Some("b1") => "b",
        other => panic!("placed on {other:?}"),
    };
    let mut zones: Vec<&str> = (0..4)
        .map(|i| zone(node_of(&st, &format!("web-{i}"))))
        .collect();
    zones.sort();
    assert_eq!(
        zones,
        ["a", "a", "b", "b"],
        "never more than one apart, never on the node without a zone"
    );
}
