//! The Job controller (NonIndexed and Indexed completion modes): keeps up to `parallelism`
//! pods running until `completions` pods succeeded (Indexed: one per index 0..completions,
//! each pod with its `batch.kubernetes.io/job-completion-index`; without completions, one
//! succeeded and none is active), fails the Job when more pods failed than `backoffLimit` or it ran past
//! `activeDeadlineSeconds` (deleting its active pods), suspends and resumes, and reports
//! active / ready / succeeded / failed, startTime, completionTime and the
//! `SuccessCriteriaMet`+`Complete` or `FailureTarget`+`Failed` conditions; a finished Job with
//! `ttlSecondsAfterFinished` is deleted once that has passed (the TTL controller's part).

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::{
    PodName, batch, claim_pods, controller_ref, create_pod, delete_pod, int, pod_active, pod_ready,
    record_event, set_condition, sync_owners, write_status,
};
use crate::meta::{now, now_time, parse_time, set_path};
use crate::resources::ResourceInfo;
use crate::state::State;
use crate::store::Obj;

const COMPONENT: &str = "job-controller";
/// Pods created per pass at most (upstream's `MaxPodCreateDeletePerSync`).
const BURST: usize = 500;

pub fn pass(st: &State) {
    sync_owners(st, batch(st, "jobs"), |info, v, pods| {
        sync(st, info, v, pods)
    });
}

fn finished(job: &Value) -> bool {
    job["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True")
}

const INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// When a pod finished: its containers' latest `finishedAt`, else its Ready condition's last
/// transition, else its creation.
fn finished_at(pod: &Value) -> Option<time::OffsetDateTime> {
    let s = &pod["status"];
    s["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["state"]["terminated"]["finishedAt"].as_str())
        .filter_map(parse_time)
        .max()
        .or_else(|| {
            s["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Ready")
                .and_then(|c| c["lastTransitionTime"].as_str())
                .and_then(parse_time)
        })
        .or_else(|| {
            pod["metadata"]["creationTimestamp"]
                .as_str()
                .and_then(parse_time)
        })
}

/// Milliseconds before a failed pod may be replaced: upstream's backoff, `base` doubled per
/// failure since the last success (10 s, 20 s, 40 s … at most 6 min) from the latest failure.
fn retry_delay_left(pods: &[Value], base: std::time::Duration) -> i64 {
    let last_success = pods
        .iter()
        .filter(|p| p["status"]["phase"] == "Succeeded")
        .filter_map(finished_at)
        .max();
    let failures: Vec<time::OffsetDateTime> = pods
        .iter()
        .filter(|p| p["status"]["phase"] == "Failed")
        .filter_map(finished_at)
        .filter(|t| last_success.is_none_or(|s| *t > s))
        .collect();
    let Some(last) = failures.iter().max() else {
        return 0;
    };
    let base_ms = base.as_millis().min(i64::MAX as u128) as i64;
    let doublings = (failures.len() as u32).saturating_sub(1).min(16);
    let delay = base_ms.saturating_mul(1 << doublings).min(360_000);
    let elapsed = (now() - *last).whole_milliseconds().min(i64::MAX as i128) as i64;
    (delay - elapsed).max(0)
}

fn completion_index(pod: &Value) -> Option<i64> {
    pod["metadata"]["annotations"][INDEX]
        .as_str()
        .and_then(|s| s.parse().ok())
        .filter(|i: &i64| *i >= 0)
}

/// What an Indexed Job's pod carries: the index as annotation, label and
/// `JOB_COMPLETION_INDEX`, and the hostname `<job>-<index>`.
fn index_pod(pod: &mut Value, job: &str, index: i64) {
    set_path(
        pod,
        &["metadata", "annotations", INDEX],
        json!(index.to_string()),
    );
    set_path(
        pod,
        &["metadata", "labels", INDEX],
        json!(index.to_string()),
    );
    if pod["spec"]["hostname"].as_str().is_none_or(str::is_empty) {
        set_path(pod, &["spec", "hostname"], json!(format!("{job}-{index}")));
    }
    for list in ["containers", "initContainers"] {
        if let Some(cs) = pod["spec"].get_mut(list).and_then(Value::as_array_mut) {
            for c in cs.iter_mut().filter(|c| c.is_object()) {
                let mut env = c["env"].as_array().cloned().unwrap_or_default();
                env.retain(|e| e["name"] != "JOB_COMPLETION_INDEX");
                env.push(
                    json!({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
                    "apiVersion": "v1", "fieldPath": format!("metadata.annotations['{INDEX}']")}}}),
                );
                c["env"] = Value::Array(env);
            }
        }
    }
}

/// `0-2,4` as `status.completedIndexes` writes index sets.
fn ranges(set: &BTreeSet<i64>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut iter = set.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while end < i64::MAX && iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    out.join(",")
}

/// `ttlSecondsAfterFinished` has passed since the Job finished.
fn ttl_expired(job: &Value) -> bool {
    let Some(ttl) = job["spec"]["ttlSecondsAfterFinished"].as_i64() else {
        return false;
    };
    let finished_at = job["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True")
        .filter_map(|c| c["lastTransitionTime"].as_str().and_then(parse_time))
        .max();
    finished_at.is_some_and(|t| (now() - t).whole_seconds() >= ttl)
}

fn cond(ty: &str, reason: &str, message: &str) -> Value {
    json!({"type": ty, "status": "True", "reason": reason, "message": message, "lastProbeTime": now_time()})
}

pub fn sync(st: &State, info: &ResourceInfo, job: &Value, pods: &[Arc<Obj>]) {
    if !job["metadata"]["deletionTimestamp"].is_null() {
        return;
    }
    let ns = crate::meta::namespace(job).to_string();
    let name = crate::meta::name(job).to_string();
    let owned = claim_pods(st, job, &ns, pods);
    let active: Vec<&Value> = owned.iter().filter(|p| pod_active(p)).collect();
    let succeeded = owned
        .iter()
        .filter(|p| p["status"]["phase"] == "Succeeded")
        .count() as i64;
    let completions = job["spec"]["completions"]
        .as_i64()
        .map(|c| c.clamp(0, i64::from(i32::MAX)));
    // Indexed mode: each index 0..completions needs one succeeded pod.
    let indexed = job["spec"]["completionMode"] == "Indexed";
    let completed_indexes: BTreeSet<i64> = owned
        .iter()
        .filter(|p| indexed && p["status"]["phase"] == "Succeeded")
        .filter_map(completion_index)
        .filter(|i| completions.is_some_and(|c| *i < c))
        .collect();
    let succeeded = if indexed {
        completed_indexes.len() as i64
    } else {
        succeeded
    };
    let failed_pods = owned
        .iter()
        .filter(|p| p["status"]["phase"] == "Failed")
        .count() as i64;
    // Under restartPolicy OnFailure the kubelet restarts containers in place: those restarts
    // count as failures towards backoffLimit, as upstream counts them.
    let restarts: i64 = if job["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure" {
        active
            .iter()
            .flat_map(|p| {
                p["status"]["containerStatuses"]
                    .as_array()
                    .into_iter()
                    .flatten()
            })
            .map(|c| super::int(&c["restartCount"], 0).max(0))
            .fold(0i64, i64::saturating_add)
    } else {
        0
    };
    let mut status: Map<String, Value> = job["status"].as_object().cloned().unwrap_or_default();
    let mut conditions: Vec<Value> = status
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let suspended = job["spec"]["suspend"].as_bool() == Some(true);
    if finished(job) {
        for p in &active {
            delete_pod(st, p);
        }
        if ttl_expired(job) {
            // The TTL-after-finished controller: the Job goes, its pods with it.
            let opts = crate::verbs::DeleteOptions {
                propagation_policy: Some("Background".into()),
                uid: job["metadata"]["uid"].as_str().map(str::to_string),
                ..Default::default()
            };
            let _ = crate::verbs::delete(st, info, &ns, &name, &opts);
            return;
        }
    } else if suspended {
        for p in &active {
            delete_pod(st, p);
        }
        set_condition(
            &mut conditions,
            json!({"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended", "lastProbeTime": now_time()}),
        );
        status.remove("startTime");
    } else {
        if conditions
            .iter()
            .any(|c| c["type"] == "Suspended" && c["status"] == "True")
        {
            set_condition(
                &mut conditions,
                json!({"type": "Suspended", "status": "False", "reason": "JobResumed", "message": "Job resumed", "lastProbeTime": now_time()}),
            );
        }
        if !status.contains_key("startTime") {
            status.insert("startTime".into(), json!(now_time()));
        }
        let backoff = int(&job["spec"]["backoffLimit"], 6);
        let deadline_passed = job["spec"]["activeDeadlineSeconds"]
            .as_i64()
            .is_some_and(|d| {
                status
                    .get("startTime")
                    .and_then(Value::as_str)
                    .and_then(parse_time)
                    .is_some_and(|t| (now() - t).whole_seconds() >= d)
            });
        let parallelism = int(&job["spec"]["parallelism"], 1).max(0);
        let failure = if failed_pods.saturating_add(restarts) > backoff {
            Some((
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            ))
        } else if deadline_passed {
            Some((
                "DeadlineExceeded",
                "Job was active longer than specified deadline",
            ))
        } else {
            None
        };
        let complete = match completions {
            Some(c) => succeeded >= c,
            None => succeeded >= 1 && active.is_empty(),
        };
        if let Some((reason, message)) = failure {
            for p in &active {
                delete_pod(st, p);
            }
            set_condition(&mut conditions, cond("FailureTarget", reason, message));
            set_condition(&mut conditions, cond("Failed", reason, message));
            record_event(st, job, "Warning", reason, message, COMPONENT);
        } else if complete {
            set_condition(
                &mut conditions,
                cond(
                    "SuccessCriteriaMet",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ),
            );
            set_condition(
                &mut conditions,
                cond(
                    "Complete",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ),
            );
            status.insert("completionTime".into(), json!(now_time()));
            record_event(st, job, "Normal", "Completed", "Job completed", COMPONENT);
        } else {
            let want = match completions {
                Some(c) => parallelism.min(c - succeeded).max(0),
                None if succeeded > 0 => 0,
                None => parallelism,
            } as usize;
            let backing_off = retry_delay_left(&owned, st.config.job_backoff_base) > 0;
            if active.len() < want && !backing_off {
                let oref = controller_ref(job, "batch/v1", "Job");
                // Indexed: the lowest indexes neither done nor running; otherwise no index.
                let running: BTreeSet<i64> =
                    active.iter().filter_map(|p| completion_index(p)).collect();
                let indexes: Vec<Option<i64>> = if indexed {
                    (0..completions.unwrap_or(0))
                        .filter(|i| !completed_indexes.contains(i) && !running.contains(i))
                        .take((want - active.len()).min(BURST))
                        .map(Some)
                        .collect()
                } else {
                    vec![None; (want - active.len()).min(BURST)]
                };
                for index in indexes {
                    let prefix = match index {
                        Some(i) => format!("{name}-{i}"),
                        None => name.clone(),
                    };
                    match create_pod(
                        st,
                        &ns,
                        &job["spec"]["template"],
                        oref.clone(),
                        PodName::Generate(&prefix),
                        |pod| {
                            if let Some(i) = index {
                                index_pod(pod, &name, i);
                            }
                        },
                    ) {
                        Ok(p) => record_event(
                            st,
                            job,
                            "Normal",
                            "SuccessfulCreate",
                            &format!("Created pod: {}", crate::meta::name(&p)),
                            COMPONENT,
                        ),
                        Err(e) => {
                            record_event(
                                st,
                                job,
                                "Warning",
                                "FailedCreate",
                                &format!("Error creating: {}", e.message),
                                COMPONENT,
                            );
                            break;
                        }
                    }
                }
            } else if active.len() > want {
                let mut extra = active.clone();
                extra.sort_by_key(|p| pod_ready(p));
                for p in extra.iter().take(active.len() - want) {
                    delete_pod(st, p);
                }
            }
        }
    }
    let active_now = owned.iter().filter(|p| pod_active(p)).count() as i64;
    for (k, n) in [
        ("active", active_now),
        ("succeeded", succeeded),
        ("failed", failed_pods),
    ] {
        if n != 0 {
            status.insert(k.into(), json!(n));
        } else {
            status.remove(k);
        }
    }
    status.insert(
        "ready".into(),
        json!(active.iter().filter(|p| pod_ready(p)).count()),
    );
    status.insert(
        "terminating".into(),
        json!(
            owned
                .iter()
                .filter(|p| !p["metadata"]["deletionTimestamp"].is_null())
                .count()
        ),
    );
    status.insert("uncountedTerminatedPods".into(), json!({}));
    if indexed && !completed_indexes.is_empty() {
        status.insert("completedIndexes".into(), json!(ranges(&completed_indexes)));
    }
    if conditions.is_empty() {
        status.remove("conditions");
    } else {
        status.insert("conditions".into(), Value::Array(conditions));
    }
    write_status(st, info, job, Value::Object(status));
}
