//! What the registry strategies of apps/v1 and batch/v1 do on writes: the scheme defaults
//! (replicas, strategies, history limits, pod template defaults), a Job's generated selector,
//! and the validations clients meet most (selector required, matching the template's labels,
//! immutable on update; a Job's restart policy).

use serde_json::{Value, json};

use super::selector_matches;
use crate::meta::set_path;
use crate::status::Cause;

pub fn is_workload(kind: &str) -> bool {
    matches!(
        kind,
        "Deployment" | "ReplicaSet" | "DaemonSet" | "StatefulSet" | "Job"
    )
}

fn default_if_null(obj: &mut Value, path: &[&str], v: Value) {
    let mut cur = &*obj;
    for p in path {
        cur = &cur[*p];
    }
    if cur.is_null() {
        set_path(obj, path, v);
    }
}

/// `SetDefaults_PodSpec` on a pod template (the pod admission defaults come when pods are made).
fn default_template(obj: &mut Value) {
    if !obj["spec"]["template"]["spec"].is_object() {
        return;
    }
    let spec = &mut obj["spec"]["template"]["spec"];
    for (k, v) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("securityContext", json!({})),
        ("schedulerName", json!("default-scheduler")),
    ] {
        if spec[k].is_null() {
            spec[k] = v;
        }
    }
    for list in ["containers", "initContainers"] {
        if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
            cs.iter_mut().for_each(crate::strategy::default_container);
        }
    }
}

/// Scheme defaults for the workload kinds (create and update).
pub fn default_workload(kind: &str, obj: &mut Value, creating: bool) {
    if !obj["spec"].is_object() {
        return;
    }
    match kind {
        "Deployment" => {
            default_if_null(obj, &["spec", "replicas"], json!(1));
            default_if_null(obj, &["spec", "strategy", "type"], json!("RollingUpdate"));
            if obj["spec"]["strategy"]["type"] == "RollingUpdate" {
                default_if_null(
                    obj,
                    &["spec", "strategy", "rollingUpdate", "maxUnavailable"],
                    json!("25%"),
                );
                default_if_null(
                    obj,
                    &["spec", "strategy", "rollingUpdate", "maxSurge"],
                    json!("25%"),
                );
            }
            default_if_null(obj, &["spec", "revisionHistoryLimit"], json!(10));
            default_if_null(obj, &["spec", "progressDeadlineSeconds"], json!(600));
        }
        "ReplicaSet" => default_if_null(obj, &["spec", "replicas"], json!(1)),
        "DaemonSet" => {
            default_if_null(
                obj,
                &["spec", "updateStrategy", "type"],
                json!("RollingUpdate"),
            );
            if obj["spec"]["updateStrategy"]["type"] == "RollingUpdate" {
                default_if_null(
                    obj,
                    &["spec", "updateStrategy", "rollingUpdate", "maxUnavailable"],
                    json!(1),
                );
                default_if_null(
                    obj,
                    &["spec", "updateStrategy", "rollingUpdate", "maxSurge"],
                    json!(0),
                );
            }
            default_if_null(obj, &["spec", "revisionHistoryLimit"], json!(10));
        }
        "StatefulSet" => {
            default_if_null(obj, &["spec", "replicas"], json!(1));
            default_if_null(obj, &["spec", "podManagementPolicy"], json!("OrderedReady"));
            default_if_null(
                obj,
                &["spec", "updateStrategy", "type"],
                json!("RollingUpdate"),
            );
            if obj["spec"]["updateStrategy"]["type"] == "RollingUpdate" {
                default_if_null(
                    obj,
                    &["spec", "updateStrategy", "rollingUpdate", "partition"],
                    json!(0),
                );
            }
            default_if_null(obj, &["spec", "revisionHistoryLimit"], json!(10));
            default_if_null(
                obj,
                &["spec", "persistentVolumeClaimRetentionPolicy"],
                json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
            );
        }
        "Job" => {
            if obj["spec"]["completions"].is_null() && obj["spec"]["parallelism"].is_null() {
                set_path(obj, &["spec", "completions"], json!(1));
            }
            default_if_null(obj, &["spec", "parallelism"], json!(1));
            default_if_null(obj, &["spec", "backoffLimit"], json!(6));
            default_if_null(obj, &["spec", "completionMode"], json!("NonIndexed"));
            default_if_null(obj, &["spec", "suspend"], json!(false));
            default_if_null(
                obj,
                &["spec", "podReplacementPolicy"],
                json!("TerminatingOrFailed"),
            );
            if creating && obj["spec"]["manualSelector"].as_bool() != Some(true) {
                generate_job_selector(obj);
            }
            // `SetDefaults_Job` (on every decode, so also on reads of a Job created without
            // labels): a Job without labels takes its template's.
            let no_labels = obj["metadata"]["labels"]
                .as_object()
                .is_none_or(|m| m.is_empty());
            if no_labels
                && let Some(labels) = obj["spec"]["template"]["metadata"]["labels"]
                    .as_object()
                    .filter(|m| !m.is_empty())
                    .cloned()
            {
                set_path(obj, &["metadata", "labels"], Value::Object(labels));
            }
        }
        _ => return,
    }
    default_template(obj);
}

/// The Job strategy's `generateSelector`: labels keyed by the Job's uid on the template, and a
/// selector on that uid.
fn generate_job_selector(obj: &mut Value) {
    let uid = obj["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let name = crate::meta::name(obj).to_string();
    for (k, v) in [
        ("batch.kubernetes.io/controller-uid", &uid),
        ("batch.kubernetes.io/job-name", &name),
        ("controller-uid", &uid),
        ("job-name", &name),
    ] {
        set_path(
            obj,
            &["spec", "template", "metadata", "labels", k],
            json!(v),
        );
    }
    set_path(
        obj,
        &["spec", "selector"],
        json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}),
    );
}

/// Validation of the workload kinds (`old` on updates).
pub fn validate_workload(kind: &str, obj: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    if !is_workload(kind) {
        return causes;
    }
    let spec = &obj["spec"];
    let selector = &spec["selector"];
    let labels = &spec["template"]["metadata"]["labels"];
    let empty_selector = selector["matchLabels"]
        .as_object()
        .is_none_or(|m| m.is_empty())
        && selector["matchExpressions"]
            .as_array()
            .is_none_or(|a| a.is_empty());
    if selector.is_null() {
        causes.push(Cause::required("spec.selector", ""));
    } else if empty_selector {
        causes.push(Cause::invalid(
            "spec.selector",
            selector,
            &format!("empty selector is invalid for {}", kind.to_lowercase()),
        ));
    } else if !selector_matches(selector, labels) {
        causes.push(Cause::invalid(
            "spec.template.metadata.labels",
            labels,
            "`selector` does not match template `labels`",
        ));
    }
    for field in [
        "replicas",
        "completions",
        "parallelism",
        "backoffLimit",
        "minReadySeconds",
        "revisionHistoryLimit",
        "progressDeadlineSeconds",
    ] {
        if let Some(n) = spec[field].as_i64()
            && n < 0
        {
            causes.push(Cause::invalid(
                format!("spec.{field}"),
                &json!(n),
                "must be greater than or equal to 0",
            ));
        } else if spec[field]
            .as_i64()
            .is_some_and(|n| n > i64::from(i32::MAX))
        {
            // An int32 in the Go types.
            causes.push(Cause::invalid(
                format!("spec.{field}"),
                &spec[field],
                "must be less than or equal to 2147483647",
            ));
        } else if !spec[field].is_null() && spec[field].as_i64().is_none() {
            causes.push(Cause::invalid(
                format!("spec.{field}"),
                &spec[field],
                "must be an integer",
            ));
        }
    }
    match spec["template"]["spec"]["containers"].as_array() {
        Some(cs) if !cs.is_empty() => {
            for (i, c) in cs.iter().enumerate() {
                if c["name"].as_str().is_none_or(str::is_empty) {
                    causes.push(Cause::required(
                        format!("spec.template.spec.containers[{i}].name"),
                        "",
                    ));
                }
                if c["image"].as_str().is_none_or(str::is_empty) {
                    causes.push(Cause::required(
                        format!("spec.template.spec.containers[{i}].image"),
                        "",
                    ));
                }
            }
        }
        _ => causes.push(Cause::required("spec.template.spec.containers", "")),
    }
    let restart = &spec["template"]["spec"]["restartPolicy"];
    if kind == "Job" && spec["completionMode"] == "Indexed" && spec["completions"].is_null() {
        causes.push(Cause::required(
            "spec.completions",
            "when completion mode is Indexed",
        ));
    }
    if kind == "Job" {
        if !matches!(restart.as_str(), Some("OnFailure") | Some("Never")) {
            causes.push(Cause::not_supported(
                "spec.template.spec.restartPolicy",
                restart,
                &["OnFailure", "Never"],
            ));
        }
    } else if restart.as_str().is_some_and(|r| r != "Always") {
        causes.push(Cause::not_supported(
            "spec.template.spec.restartPolicy",
            restart,
            &["Always"],
        ));
    }
    if let Some(old) = old
        && kind != "ReplicaSet"
        && old["spec"]["selector"] != *selector
    {
        causes.push(Cause::invalid(
            "spec.selector",
            selector,
            "field is immutable",
        ));
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployment_defaults_fill_strategy_and_template() {
        let mut d = json!({"metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}});
        default_workload("Deployment", &mut d, true);
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        assert_eq!(d["spec"]["template"]["spec"]["restartPolicy"], "Always");
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
            "Always"
        );
        assert!(validate_workload("Deployment", &d, None).is_empty());
    }

    #[test]
    fn selector_must_match_template_labels_and_is_immutable() {
        let d = json!({"spec": {"selector": {"matchLabels": {"a": "x"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        let causes = validate_workload("Deployment", &d, None);
        assert_eq!(causes[0].field, "spec.template.metadata.labels");
        let ok = json!({"spec": {"selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        let mut changed = ok.clone();
        changed["spec"]["selector"]["matchLabels"]["z"] = json!("1");
        changed["spec"]["template"]["metadata"]["labels"]["z"] = json!("1");
        let causes = validate_workload("Deployment", &changed, Some(&ok));
        assert!(causes[0].message.contains("immutable"));
        assert!(validate_workload("Deployment", &json!("garbage"), None).len() >= 2);
    }

    #[test]
    fn job_gets_a_generated_selector_and_needs_a_restart_policy() {
        let mut j = json!({"metadata": {"name": "j", "uid": "u1"}, "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        default_workload("Job", &mut j, true);
        assert_eq!(
            j["spec"]["selector"]["matchLabels"]["batch.kubernetes.io/controller-uid"],
            "u1"
        );
        assert_eq!(j["spec"]["template"]["metadata"]["labels"]["job-name"], "j");
        assert_eq!(
            j["metadata"]["labels"]["job-name"], "j",
            "the Job takes its template's labels"
        );
        assert_eq!(j["spec"]["completions"], 1);
        let causes = validate_workload("Job", &j, None);
        assert_eq!(causes.len(), 1, "{causes:?}");
        j["spec"]["template"]["spec"]["restartPolicy"] = json!("Never");
        assert!(validate_workload("Job", &j, None).is_empty());
    }
}
