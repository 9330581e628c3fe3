//! The Job controller.

use super::*;

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
