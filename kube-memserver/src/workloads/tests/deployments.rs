//! The Deployment controller and the scale subresource.

use super::*;

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
            .filter(|p| crate::workloads::pod_ready(p))
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
fn a_recreate_deployment_never_runs_old_and_new_pods_together() {
    let st = state();
    add_node(&st, "n1", json!({}), json!([]), "8");
    create(
        &st,
        "apps",
        "deployments",
        json!({"metadata": {"name": "web"}, "spec": {"replicas": 2, "strategy": {"type": "Recreate"},
        "selector": {"matchLabels": {"app": "web"}}, "template": template(json!({"app": "web"}), json!({}))}}),
    );
    settle(&st, "Running", 5);
    assert_eq!(live_pods(&st).len(), 2);
    let info = apps(&st, "deployments").unwrap();
    let mut d = get(&st, "apps", "deployments", "web");
    assert!(
        d["spec"]["strategy"].get("rollingUpdate").is_none(),
        "no rollingUpdate defaults for Recreate"
    );
    d["spec"]["template"]["spec"]["containers"][0]["image"] = json!("busybox:1.37");
    verbs::update(&st, &info, "default", "web", d, &WriteOptions::default()).unwrap();
    // Old pods take a while to terminate: no new pod meanwhile.
    for _ in 0..3 {
        deployment::pass(&st);
        replicaset::pass(&st);
    }
    assert!(
        pods(&st)
            .iter()
            .all(|p| p["spec"]["containers"][0]["image"] == "busybox:1.36")
    );
    assert!(live_pods(&st).is_empty(), "the old pods are terminating");
    for _ in 0..10 {
        settle(&st, "Running", 1);
        let images: std::collections::BTreeSet<String> = pods(&st)
            .iter()
            .map(|p| {
                p["spec"]["containers"][0]["image"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        assert!(images.len() <= 1, "old and new together: {images:?}");
    }
    let pods = live_pods(&st);
    assert_eq!(pods.len(), 2);
    assert!(
        pods.iter()
            .all(|p| p["spec"]["containers"][0]["image"] == "busybox:1.37")
    );
}
