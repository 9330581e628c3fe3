//! The scheduler: filters, unschedulable reporting, placement.

use super::*;

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
    assert_eq!(crate::workloads::fit::parse_milli("100m"), Some(100));
    assert_eq!(crate::workloads::fit::parse_milli("1.5"), Some(1500));
    assert_eq!(crate::workloads::fit::parse_milli("1Ki"), Some(1_024_000));
    assert_eq!(crate::workloads::fit::parse_milli("2e3"), Some(2_000_000));
    assert_eq!(crate::workloads::fit::parse_milli("x"), None);
    assert_eq!(crate::workloads::fit::parse_milli(""), None);
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

#[test]
fn affinity_terms_reach_the_namespaces_their_selector_selects() {
    let st = state();
    add_node(
        &st,
        "a",
        json!({"kubernetes.io/hostname": "a"}),
        json!([]),
        "8",
    );
    add_node(
        &st,
        "b",
        json!({"kubernetes.io/hostname": "b"}),
        json!([]),
        "8",
    );
    verbs::create(
        &st,
        &st.core("namespaces"),
        "",
        json!({"metadata": {"name": "other", "labels": {"team": "x"}}}),
        &WriteOptions::default(),
    )
    .unwrap();
    let mut db = json!({"metadata": {"name": "db", "labels": {"app": "db"}},
        "spec": {"nodeName": "a", "containers": [{"name": "c", "image": "i"}]}});
    db["metadata"]["namespace"] = json!("other");
    verbs::create(&st, &st.core("pods"), "other", db, &WriteOptions::default()).unwrap();
    // Node b is busier, so without the namespace selector's effect everything would go to a.
    for name in ["filler-1", "filler-2"] {
        create(&st, "", "pods", pod(name, json!({"nodeName": "b"})));
    }
    let away = |selector: Value| {
        json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname", "namespaceSelector": selector}]}}})
    };
    create(
        &st,
        "",
        "pods",
        pod("by-label", away(json!({"matchLabels": {"team": "x"}}))),
    );
    scheduler::pass(&st);
    assert_eq!(
        node_of(&st, "by-label").as_deref(),
        Some("b"),
        "the db in a selected namespace repels it"
    );
    create(
        &st,
        "",
        "pods",
        pod("elsewhere", away(json!({"matchLabels": {"team": "y"}}))),
    );
    scheduler::pass(&st);
    assert_eq!(
        node_of(&st, "elsewhere").as_deref(),
        Some("a"),
        "team=y selects no namespace"
    );
}
