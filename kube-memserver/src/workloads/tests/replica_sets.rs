//! The ReplicaSet controller.

use super::*;

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
        .filter(|p| crate::workloads::controller_uid(p).is_some())
        .collect();
    assert_eq!(owned.len(), 1, "a replacement keeps the count");
    assert_ne!(crate::meta::name(&owned[0]), name);
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
