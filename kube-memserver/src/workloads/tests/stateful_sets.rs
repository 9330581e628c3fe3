//! The StatefulSet controller.

use super::*;

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
fn ordinals_start_where_the_stateful_set_says() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "4");
    create(
        &st,
        "apps",
        "statefulsets",
        json!({"metadata": {"name": "db"}, "spec": {"replicas": 2, "serviceName": "db",
        "ordinals": {"start": 5},
        "selector": {"matchLabels": {"app": "db"}}, "template": template(json!({"app": "db"}), json!({}))}}),
    );
    settle(&st, "Running", 5);
    let mut names: Vec<String> = live_pods(&st)
        .iter()
        .map(|p| crate::meta::name(p).to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["db-5", "db-6"]);
    assert_eq!(
        get(&st, "", "pods", "db-6")["metadata"]["labels"]["apps.kubernetes.io/pod-index"],
        "6"
    );
    assert_eq!(
        get(&st, "apps", "statefulsets", "db")["status"]["readyReplicas"],
        2
    );
}
