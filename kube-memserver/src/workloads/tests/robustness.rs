//! Malformed and extreme stored objects never make a controller panic.

use super::*;

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
