//! A node task's status (ImagePrePullJob, NodeUpgradeJob, ConfigUpdateJob) as KubeEdge v1.23 keeps it (its controller-manager and its
//! cloudcore's taskmanager together): the nodes chosen, each node's phase and action flow, the
//! images' results, and the job's phase from the failure tolerance. Pure functions of the job
//! object; the actor (`mod.rs`) reads and writes.

use kubeedge_shared::nodetask::{ActionStatus, ImageStatus, JobKind};
use serde_json::{Value, json};

pub const INIT: &str = "Init";
pub const IN_PROGRESS: &str = "InProgress";
pub const COMPLETED: &str = "Completed";
pub const FAILURE: &str = "Failure";
pub const PENDING: &str = "Pending";
pub const SUCCESSFUL: &str = "Successful";
pub const UNKNOWN: &str = "Unknown";

/// Whether a node's phase is final.
pub fn node_done(phase: &str) -> bool {
    matches!(phase, SUCCESSFUL | FAILURE | UNKNOWN)
}

/// Where a job's settings are: ImagePrePullJob's `spec.imagePrePullTemplate`, the others' `spec`.
pub fn template(kind: JobKind, job: &Value) -> &Value {
    match kind {
        JobKind::ImagePrePull => &job["spec"]["imagePrePullTemplate"],
        _ => &job["spec"],
    }
}

/// How the job picks its nodes: the names, or a label selector as a selector string.
#[derive(Debug, PartialEq)]
pub enum Selection {
    Names(Vec<String>),
    Selector(String),
}

/// The job's node selection, or why it has none (KubeEdge's reasons).
pub fn selection(kind: JobKind, job: &Value) -> Result<Selection, String> {
    let t = template(kind, job);
    let names: Vec<String> = t["nodeNames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect();
    let selector = label_selector(&t["labelSelector"])?;
    match (names.is_empty(), selector) {
        (false, Some(_)) => {
            Err("nodeNames and nodeSelector cannot be specified at the same time".into())
        }
        (true, None) => Err("nodeNames and nodeSelector cannot both be empty".into()),
        (false, None) => Ok(Selection::Names(names)),
        (true, Some(s)) => Ok(Selection::Selector(s)),
    }
}

/// A `metav1.LabelSelector` as a selector string (`None` when it selects nothing in
/// particular: absent or empty).
pub fn label_selector(sel: &Value) -> Result<Option<String>, String> {
    // Label keys and values: letters, digits and `-_./` (a comma or parenthesis would change
    // the selector, so anything else refuses the job rather than widening it).
    let plain = |s: &str| {
        s.len() <= 317
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
    };
    let bad = |what: &str| Err(format!("invalid labelSelector: {what}"));
    let mut parts = Vec::new();
    if let Some(m) = sel["matchLabels"].as_object() {
        for (k, v) in m {
            let Some(v) = v.as_str() else {
                return bad(&format!("the value of {k} is not a string"));
            };
            if k.is_empty() || !plain(k) || !plain(v) {
                return bad(&format!("{k}={v}"));
            }
            parts.push(format!("{k}={v}"));
        }
    }
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or_default();
        if key.is_empty() || !plain(key) {
            return bad(&format!("key {key:?}"));
        }
        let mut values = Vec::new();
        for v in e["values"].as_array().into_iter().flatten() {
            match v.as_str() {
                Some(v) if plain(v) => values.push(v),
                _ => return bad(&format!("a value of {key}")),
            }
        }
        parts.push(match e["operator"].as_str().unwrap_or_default() {
            "In" if !values.is_empty() => format!("{key} in ({})", values.join(",")),
            "NotIn" if !values.is_empty() => format!("{key} notin ({})", values.join(",")),
            "Exists" if values.is_empty() => key.to_string(),
            "DoesNotExist" if values.is_empty() => format!("!{key}"),
            op => return bad(&format!("operator {op:?} for {key}")),
        });
    }
    Ok((!parts.is_empty()).then(|| parts.join(",")))
}

/// A node's first status: `Pending`, or `Failure` with why it cannot take the task.
pub fn node_entry(name: &str, refusal: Option<String>) -> Value {
    match refusal {
        None => json!({"nodeName": name, "phase": PENDING}),
        Some(r) => json!({"nodeName": name, "phase": FAILURE, "reason": r}),
    }
}

/// Why a Node cannot take a task (KubeEdge's checks), or `None`.
pub fn refusal(node: &Value) -> Option<String> {
    let labels = &node["metadata"]["labels"];
    if labels
        .get(kubeedge_shared::constants::EDGE_NODE_LABEL)
        .is_none()
    {
        return Some("the node is not an edge node".into());
    }
    let ready = node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    (!ready).then(|| "the node is not ready".to_string())
}

/// Applies an edge's report of one action to node `node`'s status. `false`: no such node.
pub fn apply_report(kind: JobKind, status: &mut Value, node: &str, report: &ActionStatus) -> bool {
    let Some(entry) = status["nodeStatus"]
        .as_array_mut()
        .and_then(|a| a.iter_mut().find(|n| n["nodeName"] == node))
    else {
        return false;
    };
    let mut step = json!({
        "action": report.action,
        "status": if report.succ { "True" } else { "False" },
        "time": report.finish_time,
    });
    if !report.succ && !report.reason.is_empty() {
        step["reason"] = report.reason.clone().into();
    }
    match entry["actionFlow"].as_array_mut() {
        Some(flow) => flow.push(step),
        None => entry["actionFlow"] = json!([step]),
    }
    let done = kind.is_final(&report.action, report.succ);
    // A roll-back that worked still means the task failed (KubeEdge calls it Successful).
    let rolled_back = report.action == "RollBack";
    entry["phase"] = match (done, report.succ && !rolled_back) {
        (false, _) => IN_PROGRESS,
        (true, true) => SUCCESSFUL,
        (true, false) => FAILURE,
    }
    .into();
    if (!report.succ || rolled_back) && !report.reason.is_empty() {
        entry["reason"] = report.reason.clone().into();
    }
    if report.action == "Pull"
        && let Ok(images) = serde_json::from_str::<Vec<ImageStatus>>(&report.extend)
    {
        entry["imageStatus"] = serde_json::to_value(images).unwrap_or_default();
    }
    // Upgrades: `<from>,<to>` (KubeEdge's extend) → historicVersion, currentVersion.
    if kind == JobKind::NodeUpgrade
        && let Some((from, to)) = report.extend.split_once(',')
        && !to.contains(',')
        && from.len() <= 128
        && to.len() <= 128
    {
        entry["historicVersion"] = from.into();
        entry["currentVersion"] = to.into();
    }
    true
}

/// Keeps the last `max` steps of `node`'s action flow.
pub fn cap_flow(status: &mut Value, node: &str, max: usize) {
    if let Some(flow) = status["nodeStatus"]
        .as_array_mut()
        .and_then(|a| a.iter_mut().find(|n| n["nodeName"] == node))
        .and_then(|n| n["actionFlow"].as_array_mut())
        && flow.len() > max
    {
        let extra = flow.len() - max;
        flow.drain(..extra);
    }
}

/// The job's phase from its nodes (`failureTolerate`: the share of failed nodes allowed).
pub fn job_phase(status: &Value, failure_tolerate: &str) -> (&'static str, Option<String>) {
    let nodes: Vec<&Value> = status["nodeStatus"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    if nodes
        .iter()
        .any(|n| !node_done(n["phase"].as_str().unwrap_or_default()))
    {
        return (IN_PROGRESS, None);
    }
    let failed = nodes
        .iter()
        .filter(|n| matches!(n["phase"].as_str(), Some(FAILURE | UNKNOWN)))
        .count();
    let total = nodes.len().max(1);
    let tolerate: f64 = failure_tolerate.trim().parse().unwrap_or(0.0);
    let share = (failed as f64 / total as f64 * 100.0).round() / 100.0;
    if share > tolerate {
        let reason = format!(
            "the number of failed nodes is {failed}/{total}, which exceeds the failure tolerance threshold"
        );
        (FAILURE, Some(reason))
    } else {
        (COMPLETED, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_follow_kubeedges_rules() {
        let job = |t: Value| json!({"spec": {"imagePrePullTemplate": t}});
        assert_eq!(
            selection(
                JobKind::ImagePrePull,
                &job(json!({"nodeNames": ["a", "b"]}))
            ),
            Ok(Selection::Names(vec!["a".into(), "b".into()]))
        );
        assert_eq!(
            selection(
                JobKind::ImagePrePull,
                &job(json!({"labelSelector": {"matchLabels": {"zone": "x"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]},
                    {"key": "gpu", "operator": "DoesNotExist"}]}}))
            ),
            Ok(Selection::Selector("zone=x,tier in (a,b),!gpu".into()))
        );
        assert!(
            selection(JobKind::ImagePrePull, &job(json!({})))
                .unwrap_err()
                .contains("cannot both be empty")
        );
        assert!(
            selection(
                JobKind::ImagePrePull,
                &job(json!({"nodeNames": ["a"], "labelSelector": {"matchLabels": {"z": "x"}}}))
            )
            .unwrap_err()
            .contains("at the same time")
        );
    }

    #[test]
    fn a_selector_that_does_not_parse_refuses_the_job_instead_of_widening_it() {
        let job = |sel: Value| json!({"spec": {"imagePrePullTemplate": {"labelSelector": sel}}});
        for sel in [
            json!({"matchLabels": {"zone": "a,b"}}),
            json!({"matchLabels": {"zone": 1}}),
            json!({"matchExpressions": [{"key": "tier", "operator": "Gt", "values": ["1"]}]}),
            json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": []}]}),
            json!({"matchExpressions": [{"key": "t(x)", "operator": "Exists"}]}),
        ] {
            let e = selection(JobKind::ImagePrePull, &job(sel.clone())).unwrap_err();
            assert!(e.starts_with("invalid labelSelector"), "{sel}: {e}");
        }
    }

    #[test]
    fn action_flows_keep_their_last_steps() {
        let mut st = json!({"nodeStatus": [{"nodeName": "a", "actionFlow": [1, 2, 3, 4]}]});
        cap_flow(&mut st, "a", 2);
        assert_eq!(st["nodeStatus"][0]["actionFlow"], json!([3, 4]));
    }

    #[test]
    fn nodes_must_be_ready_edge_nodes() {
        let node = |labels: Value, ready: &str| {
            json!({"metadata": {"labels": labels},
                "status": {"conditions": [{"type": "Ready", "status": ready}]}})
        };
        let edge = json!({"node-role.kubernetes.io/edge": ""});
        assert_eq!(refusal(&node(edge.clone(), "True")), None);
        assert_eq!(
            refusal(&node(edge, "False")).unwrap(),
            "the node is not ready"
        );
        assert_eq!(
            refusal(&node(json!({}), "True")).unwrap(),
            "the node is not an edge node"
        );
    }

    #[test]
    fn reports_build_the_action_flow_and_the_job_phase_follows_the_tolerance() {
        let mut status =
            json!({"phase": INIT, "nodeStatus": [node_entry("a", None), node_entry("b", None)]});
        let check = ActionStatus {
            action: "Check".into(),
            succ: true,
            finish_time: "2026-11-27T12:00:00Z".into(),
            ..Default::default()
        };
        assert!(apply_report(
            JobKind::ImagePrePull,
            &mut status,
            "a",
            &check
        ));
        assert!(!apply_report(
            JobKind::ImagePrePull,
            &mut status,
            "zz",
            &check
        ));
        assert_eq!(status["nodeStatus"][0]["phase"], IN_PROGRESS);
        assert_eq!(job_phase(&status, "0").0, IN_PROGRESS);
        let pull = ActionStatus {
            action: "Pull".into(),
            succ: true,
            finish_time: "2026-11-27T12:00:05Z".into(),
            extend: r#"[{"image":"busybox","status":"True"}]"#.into(),
            ..Default::default()
        };
        apply_report(JobKind::ImagePrePull, &mut status, "a", &pull);
        assert_eq!(status["nodeStatus"][0]["phase"], SUCCESSFUL);
        assert_eq!(
            status["nodeStatus"][0]["imageStatus"],
            json!([{"image": "busybox", "status": "True"}])
        );
        assert_eq!(status["nodeStatus"][0]["actionFlow"][1]["action"], "Pull");
        let failed = ActionStatus {
            action: "Check".into(),
            succ: false,
            reason: "current disk usage is 91.00, which exceeds the maximum allowed usage 80.00"
                .into(),
            ..Default::default()
        };
        apply_report(JobKind::ImagePrePull, &mut status, "b", &failed);
        assert_eq!(status["nodeStatus"][1]["phase"], FAILURE);
        assert!(
            status["nodeStatus"][1]["reason"]
                .as_str()
                .unwrap()
                .contains("disk")
        );
        // 1 of 2 failed: over a 0.1 tolerance, within 0.5.
        let (phase, reason) = job_phase(&status, "0.1");
        assert_eq!(phase, FAILURE);
        assert!(reason.unwrap().contains("1/2"));
        assert_eq!(job_phase(&status, "0.5").0, COMPLETED);
    }

    #[test]
    fn a_config_update_rolled_back_is_a_failure_with_its_reason() {
        let mut status = json!({"phase": INIT, "nodeStatus": [node_entry("a", None)]});
        let step = |action: &str, succ: bool, reason: &str| ActionStatus {
            action: action.into(),
            succ,
            reason: reason.into(),
            ..Default::default()
        };
        let k = JobKind::ConfigUpdate;
        apply_report(k, &mut status, "a", &step("Check", true, ""));
        apply_report(k, &mut status, "a", &step("BackUp", true, ""));
        assert_eq!(status["nodeStatus"][0]["phase"], IN_PROGRESS);
        apply_report(
            k,
            &mut status,
            "a",
            &step("RollBack", true, "did not reach the cloud"),
        );
        assert_eq!(status["nodeStatus"][0]["phase"], FAILURE);
        assert_eq!(status["nodeStatus"][0]["reason"], "did not reach the cloud");
        let mut ok = json!({"phase": INIT, "nodeStatus": [node_entry("a", None)]});
        apply_report(k, &mut ok, "a", &step("Update", true, ""));
        assert_eq!(ok["nodeStatus"][0]["phase"], SUCCESSFUL);
        assert_eq!(
            template(k, &json!({"spec": {"concurrency": 2}}))["concurrency"],
            2
        );
    }
}

#[cfg(test)]
mod upgrade_tests {
    use super::*;

    fn step(action: &str, succ: bool, extend: &str) -> ActionStatus {
        ActionStatus {
            action: action.into(),
            succ,
            extend: extend.into(),
            ..Default::default()
        }
    }

    #[test]
    fn upgrades_record_versions_and_wait_for_confirmation_in_progress() {
        let mut status = json!({"phase": INIT, "nodeStatus": [node_entry("a", None)]});
        let k = JobKind::NodeUpgrade;
        apply_report(k, &mut status, "a", &step("Check", true, ""));
        apply_report(k, &mut status, "a", &step("WaitingConfirmation", true, ""));
        assert_eq!(status["nodeStatus"][0]["phase"], IN_PROGRESS, "waits");
        apply_report(k, &mut status, "a", &step("BackUp", true, "v1.0.0,v1.1.0"));
        assert_eq!(status["nodeStatus"][0]["historicVersion"], "v1.0.0");
        assert_eq!(status["nodeStatus"][0]["currentVersion"], "v1.1.0");
        apply_report(k, &mut status, "a", &step("Upgrade", false, ""));
        assert_eq!(status["nodeStatus"][0]["phase"], IN_PROGRESS, "rolls back");
        apply_report(
            k,
            &mut status,
            "a",
            &step("RollBack", true, "v1.1.0,v1.0.0"),
        );
        assert_eq!(status["nodeStatus"][0]["phase"], FAILURE);
        assert_eq!(status["nodeStatus"][0]["currentVersion"], "v1.0.0");
        // An extend that is not `<from>,<to>` changes no version.
        apply_report(k, &mut status, "a", &step("Upgrade", true, "a,b,c"));
        assert_eq!(status["nodeStatus"][0]["currentVersion"], "v1.0.0");
    }
}
