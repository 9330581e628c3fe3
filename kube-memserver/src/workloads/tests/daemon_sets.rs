//! The DaemonSet controller.

use super::*;

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
fn an_unbound_daemon_pod_of_a_deleted_node_is_removed() {
    let st = state();
    add_node(&st, "gone", json!({}), json!([]), "1");
    create(
        &st,
        "apps",
        "daemonsets",
        json!({"metadata": {"name": "agent"}, "spec": {
        "selector": {"matchLabels": {"app": "agent"}}, "template": template(json!({"app": "agent"}), json!({}))}}),
    );
    daemonset::pass(&st);
    assert_eq!(live_pods(&st).len(), 1, "created, not yet bound");
    verbs::delete(
        &st,
        &st.core("nodes"),
        "",
        "gone",
        &verbs::DeleteOptions::default(),
    )
    .unwrap();
    daemonset::pass(&st);
    assert!(live_pods(&st).is_empty());
}

#[test]
fn a_daemon_set_with_max_surge_starts_the_new_pod_before_removing_the_old() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "4");
    add_node(&st, "n2", json!({}), json!([]), "4");
    create(
        &st,
        "apps",
        "daemonsets",
        json!({"metadata": {"name": "agent"}, "spec": {
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "selector": {"matchLabels": {"app": "agent"}}, "template": template(json!({"app": "agent"}), json!({}))}}),
    );
    settle(&st, "Running", 3);
    assert_eq!(live_pods(&st).len(), 2);
    let info = apps(&st, "daemonsets").unwrap();
    let mut v = get(&st, "apps", "daemonsets", "agent");
    v["spec"]["template"]["spec"]["containers"][0]["image"] = json!("busybox:1.37");
    verbs::update(&st, &info, "default", "agent", v, &WriteOptions::default()).unwrap();
    daemonset::pass(&st);
    assert_eq!(
        live_pods(&st).len(),
        3,
        "one surge pod, both old ones still there"
    );
    for _ in 0..8 {
        settle(&st, "Running", 1);
        let ready = live_pods(&st)
            .iter()
            .filter(|p| crate::workloads::pod_ready(p))
            .count();
        assert!(ready >= 2, "never fewer than one ready pod per node");
        assert!(live_pods(&st).len() <= 3, "never more than one surge pod");
    }
    let pods = live_pods(&st);
    assert_eq!(pods.len(), 2);
    assert!(
        pods.iter()
            .all(|p| p["spec"]["containers"][0]["image"] == "busybox:1.37")
    );
}

#[test]
fn a_replacement_daemon_pod_waits_for_the_old_one_to_terminate() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "4");
    create(
        &st,
        "apps",
        "daemonsets",
        json!({"metadata": {"name": "agent"}, "spec": {
        "selector": {"matchLabels": {"app": "agent"}}, "template": template(json!({"app": "agent"}), json!({}))}}),
    );
    settle(&st, "Running", 3);
    let info = apps(&st, "daemonsets").unwrap();
    let mut v = get(&st, "apps", "daemonsets", "agent");
    v["spec"]["template"]["spec"]["containers"][0]["image"] = json!("busybox:1.37");
    verbs::update(&st, &info, "default", "agent", v, &WriteOptions::default()).unwrap();
    for _ in 0..3 {
        daemonset::pass(&st);
    }
    assert_eq!(pods(&st).len(), 1, "only the terminating old pod");
    settle(&st, "Running", 3);
    let p = live_pods(&st);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0]["spec"]["containers"][0]["image"], "busybox:1.37");
}
