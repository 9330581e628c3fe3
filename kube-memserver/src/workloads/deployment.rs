//! The Deployment controller: one ReplicaSet per pod template (`<deployment>-<hash>`, labelled
//! and selected by `pod-template-hash`), revisions in `deployment.kubernetes.io/revision`
//! (what `kubectl rollout history/undo` read), rolling updates bounded by maxSurge and
//! maxUnavailable or Recreate, old ReplicaSets pruned beyond `revisionHistoryLimit`, and the
//! status (`observedGeneration`, replica counts, `Available` and `Progressing` conditions)
//! that `kubectl rollout status` waits on.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::{
    add_owner, apps, controller_ref, controller_uid, int, int_or_percent, record_event,
    selector_matches, template_hash, update_object, without_label, write_status,
};
use crate::meta::{now, now_time, parse_time, set_path};
use crate::resources::ResourceInfo;
use crate::state::State;
use crate::store::Obj;
use crate::verbs::{self, DeleteOptions, WriteOptions};

pub const REVISION: &str = "deployment.kubernetes.io/revision";
pub const HASH_LABEL: &str = "pod-template-hash";
const DESIRED: &str = "deployment.kubernetes.io/desired-replicas";
const MAX: &str = "deployment.kubernetes.io/max-replicas";
const COMPONENT: &str = "deployment-controller";
/// Annotations a ReplicaSet does not take over from its Deployment.
const NOT_COPIED: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    "deployment.kubernetes.io/revision-history",
    DESIRED,
    MAX,
    "deprecated.deployment.rollback.to",
];

pub fn pass(st: &State) {
    let (Some(dinfo), Some(rsinfo)) = (apps(st, "deployments"), apps(st, "replicasets")) else {
        return;
    };
    let all = st.table(&dinfo).all();
    if all.is_empty() {
        return;
    }
    let rs_table = st.table(&rsinfo);
    for d in all {
        let rss = rs_table.in_namespace(d.namespace());
        sync(st, &dinfo, &rsinfo, &d.value(), &rss);
    }
}

fn revision(rs: &Value) -> i64 {
    rs["metadata"]["annotations"][REVISION]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn replicas(rs: &Value) -> i64 {
    int(&rs["spec"]["replicas"], 0)
}

fn status_count(rs: &Value, field: &str) -> i64 {
    int(&rs["status"][field], 0)
}

/// (maxSurge, maxUnavailable) resolved against the desired replicas (`ResolveFenceposts`).
fn fenceposts(d: &Value, desired: i64) -> (i64, i64) {
    if d["spec"]["strategy"]["type"] != "RollingUpdate" {
        return (0, 0);
    }
    let ru = &d["spec"]["strategy"]["rollingUpdate"];
    let surge = int_or_percent(&ru["maxSurge"], desired, true);
    let mut unavailable = int_or_percent(&ru["maxUnavailable"], desired, false);
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    (surge, unavailable.min(desired))
}

fn scale(st: &State, rsinfo: &ResourceInfo, d: &Value, rs: &mut Value, to: i64, desired: i64) {
    let from = replicas(rs);
    let (surge, _) = fenceposts(d, desired);
    let updated = update_object(st, rsinfo, rs, |v| {
        set_path(v, &["spec", "replicas"], json!(to));
        set_path(
            v,
            &["metadata", "annotations", DESIRED],
            json!(desired.to_string()),
        );
        set_path(
            v,
            &["metadata", "annotations", MAX],
            json!((desired + surge).to_string()),
        );
    });
    if let Some(u) = updated {
        if from != to {
            let dir = if to > from { "up" } else { "down" };
            record_event(
                st,
                d,
                "Normal",
                "ScalingReplicaSet",
                &format!(
                    "Scaled {dir} replica set {} from {from} to {to}",
                    crate::meta::name(rs)
                ),
                COMPONENT,
            );
        }
        *rs = u;
    }
}

/// The ReplicaSets this Deployment controls, adopting matching orphans.
fn claim(st: &State, rsinfo: &ResourceInfo, d: &Value, rss: &[Arc<Obj>]) -> Vec<Value> {
    let uid = d["metadata"]["uid"].as_str().unwrap_or_default();
    let mut out = Vec::new();
    for rs in rss
        .iter()
        .filter(|rs| super::may_belong(rs, uid, &d["spec"]["selector"]))
    {
        let v = rs.value();
        match controller_uid(&v) {
            Some(u) if u == uid => out.push(v),
            Some(_) => {}
            None if !rs.deleting()
                && selector_matches(&d["spec"]["selector"], &v["metadata"]["labels"]) =>
            {
                let oref = controller_ref(d, "apps/v1", "Deployment");
                if let Some(a) = add_owner(st, rsinfo, &v, oref) {
                    out.push(a);
                }
            }
            None => {}
        }
    }
    out
}

fn copied_annotations(d: &Value) -> Map<String, Value> {
    d["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| !NOT_COPIED.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn new_replica_set(st: &State, rsinfo: &ResourceInfo, d: &Value, revision: i64) -> Option<Value> {
    let ns = crate::meta::namespace(d);
    let template = &d["spec"]["template"];
    let collisions = d["status"]["collisionCount"]
        .as_i64()
        .map(|c| c.clamp(0, i64::from(i32::MAX)));
    let hash = template_hash(&without_label(template, HASH_LABEL), collisions);
    let mut t = template.clone();
    set_path(&mut t, &["metadata", "labels", HASH_LABEL], json!(hash));
    let mut selector = d["spec"]["selector"].clone();
    set_path(&mut selector, &["matchLabels", HASH_LABEL], json!(hash));
    let mut annotations = copied_annotations(d);
    annotations.insert(REVISION.into(), json!(revision.to_string()));
    let name = format!("{}-{hash}", crate::meta::name(d));
    let rs = json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": t["metadata"]["labels"],
            "annotations": annotations,
            "ownerReferences": [controller_ref(d, "apps/v1", "Deployment")],
        },
        "spec": {
            "replicas": 0,
            "minReadySeconds": int(&d["spec"]["minReadySeconds"], 0),
            "selector": selector,
            "template": t,
        },
    });
    match verbs::create(st, rsinfo, ns, rs, &WriteOptions::default()) {
        Ok(o) => Some(o.value()),
        Err(e) if e.reason == "AlreadyExists" => {
            // Another template hashed to this name: count the collision, retry next pass.
            let mut status = d["status"].clone();
            set_path(
                &mut status,
                &["collisionCount"],
                json!(collisions.unwrap_or(0).saturating_add(1)),
            );
            if let Some(dinfo) = apps(st, "deployments") {
                write_status(st, &dinfo, d, status);
            }
            None
        }
        Err(e) => {
            tracing::debug!(deployment = crate::meta::name(d), error = %e, "creating a replica set");
            None
        }
    }
}

pub fn sync(st: &State, dinfo: &ResourceInfo, rsinfo: &ResourceInfo, d: &Value, rss: &[Arc<Obj>]) {
    if !d["metadata"]["deletionTimestamp"].is_null() {
        return;
    }
    let desired = int(&d["spec"]["replicas"], 1).max(0);
    let paused = d["spec"]["paused"].as_bool() == Some(true);
    let owned = claim(st, rsinfo, d, rss);
    let template = without_label(&d["spec"]["template"], HASH_LABEL);
    let mut matching: Vec<Value> = Vec::new();
    let mut old: Vec<Value> = Vec::new();
    for rs in owned {
        if without_label(&rs["spec"]["template"], HASH_LABEL) == template {
            matching.push(rs);
        } else {
            old.push(rs);
        }
    }
    matching.sort_by(|a, b| {
        a["metadata"]["creationTimestamp"]
            .as_str()
            .cmp(&b["metadata"]["creationTimestamp"].as_str())
    });
    let mut new = if matching.is_empty() {
        None
    } else {
        // Duplicates (rare) are treated as old.
        let first = matching.remove(0);
        old.extend(matching);
        Some(first)
    };
    let max_old = old.iter().map(revision).max().unwrap_or(0);
    let mut created = false;
    if new.is_none() && !paused {
        new = new_replica_set(st, rsinfo, d, max_old.saturating_add(1));
        created = new.is_some();
    }
    // Revision and annotations of the new ReplicaSet (a rollback makes an old one newest).
    if let Some(n) = new.as_mut() {
        let want_rev = if revision(n) > max_old {
            revision(n)
        } else {
            max_old.saturating_add(1)
        };
        let annotations = copied_annotations(d);
        if let Some(u) = update_object(st, rsinfo, n, |v| {
            for (k, a) in &annotations {
                set_path(v, &["metadata", "annotations", k], a.clone());
            }
            set_path(
                v,
                &["metadata", "annotations", REVISION],
                json!(want_rev.to_string()),
            );
        }) {
            *n = u;
        }
    }
    let mut d = d.clone();
    if let Some(n) = &new {
        let rev = revision(n).to_string();
        if d["metadata"]["annotations"][REVISION].as_str() != Some(rev.as_str())
            && let Some(u) = update_object(st, dinfo, &d, |v| {
                set_path(v, &["metadata", "annotations", REVISION], json!(rev));
            })
        {
            d = u;
        }
    }
    if scaling_event(&new, &old, desired) {
        // A new replica count: spread it over the active ReplicaSets, no rollout step.
        proportional_scale(st, rsinfo, &d, new.as_mut(), &mut old, desired);
    } else if !paused {
        match d["spec"]["strategy"]["type"].as_str() {
            Some("Recreate") => recreate(st, rsinfo, &d, new.as_mut(), &mut old, desired),
            _ => rolling(st, rsinfo, &d, new.as_mut(), &mut old, desired),
        }
    }
    if !paused {
        cleanup(st, rsinfo, &d, &old);
    }
    write_deployment_status(st, dinfo, &d, new.as_ref(), &old, desired, created, paused);
}

/// An active ReplicaSet (`spec.replicas` > 0) was sized for another replica count
/// (`isScalingEvent`).
fn scaling_event(new: &Option<Value>, old: &[Value], desired: i64) -> bool {
    new.iter()
        .chain(old.iter())
        .filter(|rs| replicas(rs) > 0)
        .any(|rs| {
            rs["metadata"]["annotations"][DESIRED]
                .as_str()
                .and_then(|s| s.parse::<i64>().ok())
                .is_some_and(|n| n != desired)
        })
}

/// Upstream's `scale`: a single active ReplicaSet takes the whole count; a saturated new one
/// makes the old ones go; otherwise (rolling update) the difference to replicas + maxSurge is
/// spread in proportion to each ReplicaSet's share, leftovers to the largest.
fn proportional_scale(
    st: &State,
    rsinfo: &ResourceInfo,
    d: &Value,
    mut new: Option<&mut Value>,
    old: &mut [Value],
    desired: i64,
) {
    let active_old = old.iter().filter(|rs| replicas(rs) > 0).count();
    let new_active = new.as_ref().is_some_and(|n| replicas(n) > 0);
    if active_old + usize::from(new_active) <= 1 {
        let target = if new_active || active_old == 0 {
            new
        } else {
            old.iter_mut().find(|rs| replicas(rs) > 0)
        };
        if let Some(rs) = target
            && replicas(rs) != desired
        {
            scale(st, rsinfo, d, rs, desired, desired);
        }
        return;
    }
    let saturated = new
        .as_ref()
        .is_some_and(|n| replicas(n) == desired && status_count(n, "availableReplicas") == desired);
    if saturated {
        for rs in old.iter_mut().filter(|rs| replicas(rs) > 0) {
            scale(st, rsinfo, d, rs, 0, desired);
        }
        return;
    }
    if d["spec"]["strategy"]["type"] != "RollingUpdate" {
        return;
    }
    let (surge, _) = fenceposts(d, desired);
    let mut all: Vec<&mut Value> = new
        .take()
        .into_iter()
        .chain(old.iter_mut())
        .filter(|rs| replicas(rs) > 0)
        .collect();
    let current: i64 = all.iter().map(|rs| replicas(rs)).sum();
    let allowed = if desired > 0 { desired + surge } else { 0 };
    let to_add = allowed - current;
    let created = |rs: &Value| {
        rs["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    // Larger first; ties: newer first when growing, older first when shrinking.
    all.sort_by(|a, b| {
        replicas(b).cmp(&replicas(a)).then_with(|| {
            if to_add > 0 {
                created(b).cmp(&created(a))
            } else {
                created(a).cmp(&created(b))
            }
        })
    });
    let mut added = 0;
    let mut sizes: Vec<i64> = Vec::new();
    for rs in &all {
        let r = replicas(rs);
        let mut size = r;
        if to_add != 0 && r != 0 && to_add != added {
            let fraction = if desired == 0 {
                -r
            } else {
                let annotated = rs["metadata"]["annotations"][MAX]
                    .as_str()
                    .and_then(|s| s.parse::<i64>().ok())
                    .filter(|n| *n > 0)
                    .unwrap_or_else(|| int(&d["status"]["replicas"], 0).max(1));
                ((r * allowed) as f64 / annotated as f64).round() as i64 - r
            };
            let left = to_add - added;
            let proportion = if to_add > 0 {
                fraction.min(left)
            } else {
                fraction.max(left)
            };
            size += proportion;
            added += proportion;
        }
        sizes.push(size);
    }
    if let Some(first) = sizes.first_mut() {
        *first = (*first + to_add - added).max(0);
    }
    for (rs, size) in all.into_iter().zip(sizes) {
        scale(st, rsinfo, d, rs, size, desired);
    }
}

fn recreate(
    st: &State,
    rsinfo: &ResourceInfo,
    d: &Value,
    new: Option<&mut Value>,
    old: &mut [Value],
    desired: i64,
) {
    let mut waiting = false;
    for rs in old.iter_mut() {
        if replicas(rs) > 0 {
            scale(st, rsinfo, d, rs, 0, desired);
            waiting = true;
        }
        if status_count(rs, "replicas") > 0 {
            waiting = true;
        }
    }
    // Old pods still terminating count too (`oldPodsRunning`).
    if waiting || old_pods_running(st, d, old) {
        return;
    }
    if let Some(n) = new
        && replicas(n) != desired
    {
        scale(st, rsinfo, d, n, desired, desired);
    }
}

/// Whether any pod of the old ReplicaSets has not finished (terminating ones included).
fn old_pods_running(st: &State, d: &Value, old: &[Value]) -> bool {
    let uids: Vec<&str> = old
        .iter()
        .filter_map(|rs| rs["metadata"]["uid"].as_str())
        .collect();
    st.table(&st.core("pods"))
        .in_namespace(crate::meta::namespace(d))
        .iter()
        .filter(|p| p.owners().any(|u| uids.contains(&u)))
        .any(|p| !matches!(&*p.field("status.phase"), "Succeeded" | "Failed"))
}

fn rolling(
    st: &State,
    rsinfo: &ResourceInfo,
    d: &Value,
    new: Option<&mut Value>,
    old: &mut [Value],
    desired: i64,
) {
    let (surge, max_unavailable) = fenceposts(d, desired);
    let Some(new) = new else {
        return;
    };
    // reconcileNewReplicaSet
    let current = replicas(new);
    if current > desired {
        scale(st, rsinfo, d, new, desired, desired);
    } else if current < desired {
        let total: i64 = replicas(new) + old.iter().map(replicas).sum::<i64>();
        let max_total = desired + surge;
        if total < max_total {
            let up = (max_total - total).min(desired - current);
            scale(st, rsinfo, d, new, current + up, desired);
        }
    }
    // reconcileOldReplicaSets
    let old_count: i64 = old.iter().map(replicas).sum();
    if old_count == 0 {
        return;
    }
    let all_count = old_count + replicas(new);
    let min_available = desired - max_unavailable;
    let new_unavailable = replicas(new) - status_count(new, "availableReplicas");
    let max_scale_down = all_count - min_available - new_unavailable;
    if max_scale_down <= 0 {
        return;
    }
    old.sort_by(|a, b| {
        a["metadata"]["creationTimestamp"]
            .as_str()
            .cmp(&b["metadata"]["creationTimestamp"].as_str())
    });
    // Unhealthy old replicas go first.
    let mut cleaned = 0;
    for rs in old.iter_mut() {
        if max_scale_down - cleaned <= 0 {
            break;
        }
        let r = replicas(rs);
        let unhealthy = r - status_count(rs, "availableReplicas");
        if r == 0 || unhealthy <= 0 {
            continue;
        }
        let down = unhealthy.min(max_scale_down - cleaned);
        scale(st, rsinfo, d, rs, r - down, desired);
        cleaned += down;
    }
    // Then as many as availability allows (upstream does not cap this step by the above).
    let available: i64 = old
        .iter()
        .map(|rs| status_count(rs, "availableReplicas"))
        .sum::<i64>()
        + status_count(new, "availableReplicas");
    if available <= min_available {
        return;
    }
    let mut remaining = available - min_available;
    for rs in old.iter_mut() {
        if remaining <= 0 {
            break;
        }
        let r = replicas(rs);
        if r == 0 {
            continue;
        }
        let down = r.min(remaining);
        scale(st, rsinfo, d, rs, r - down, desired);
        remaining -= down;
    }
}

/// Deletes the oldest fully scaled-down ReplicaSets beyond `revisionHistoryLimit`.
fn cleanup(st: &State, rsinfo: &ResourceInfo, d: &Value, old: &[Value]) {
    let limit = int(&d["spec"]["revisionHistoryLimit"], 10).max(0) as usize;
    let mut idle: Vec<&Value> = old
        .iter()
        .filter(|rs| {
            replicas(rs) == 0
                && status_count(rs, "replicas") == 0
                && rs["metadata"]["deletionTimestamp"].is_null()
        })
        .collect();
    if idle.len() <= limit {
        return;
    }
    idle.sort_by_key(|rs| revision(rs));
    for rs in idle.iter().take(idle.len() - limit) {
        let _ = verbs::delete(
            st,
            rsinfo,
            crate::meta::namespace(rs),
            crate::meta::name(rs),
            &DeleteOptions::default(),
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn write_deployment_status(
    st: &State,
    dinfo: &ResourceInfo,
    d: &Value,
    new: Option<&Value>,
    old: &[Value],
    desired: i64,
    created: bool,
    paused: bool,
) {
    let all: Vec<&Value> = new.into_iter().chain(old.iter()).collect();
    let sum = |f: &str| all.iter().map(|rs| status_count(rs, f)).sum::<i64>();
    let spec_total: i64 = all.iter().map(|rs| replicas(rs)).sum();
    let available = sum("availableReplicas");
    let total = sum("replicas");
    let updated = new.map_or(0, |n| status_count(n, "replicas"));
    let generation = int(&d["metadata"]["generation"], 0);
    let mut status = Map::new();
    status.insert("observedGeneration".into(), json!(generation));
    for (k, n) in [
        ("replicas", total),
        ("updatedReplicas", updated),
        ("readyReplicas", sum("readyReplicas")),
        ("availableReplicas", available),
        ("unavailableReplicas", (spec_total - available).max(0)),
    ] {
        if n != 0 {
            status.insert(k.into(), json!(n));
        }
    }
    if let Some(c) = d["status"]["collisionCount"].as_i64() {
        status.insert("collisionCount".into(), json!(c));
    }
    let mut conditions: Vec<Value> = d["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let (_, max_unavailable) = fenceposts(d, desired);
    let (s, reason, message) = if available >= desired - max_unavailable {
        (
            "True",
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.",
        )
    } else {
        (
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.",
        )
    };
    put_condition(&mut conditions, "Available", s, reason, message, false);
    let new_name = new
        .map(|n| crate::meta::name(n).to_string())
        .unwrap_or_default();
    let complete = updated == desired && total == desired && available == desired;
    let prev_updated = int(&d["status"]["updatedReplicas"], 0);
    let prev_total = int(&d["status"]["replicas"], 0);
    let prev_ready = int(&d["status"]["readyReplicas"], 0);
    let prev_available = int(&d["status"]["availableReplicas"], 0);
    let progressed = updated > prev_updated
        || total < prev_total
        || sum("readyReplicas") > prev_ready
        || available > prev_available;
    if paused {
        put_condition(
            &mut conditions,
            "Progressing",
            "Unknown",
            "DeploymentPaused",
            "Deployment is paused",
            true,
        );
    } else if created {
        put_condition(
            &mut conditions,
            "Progressing",
            "True",
            "NewReplicaSetCreated",
            &format!("Created new replica set \"{new_name}\""),
            true,
        );
    } else if new.is_some() && complete {
        put_condition(
            &mut conditions,
            "Progressing",
            "True",
            "NewReplicaSetAvailable",
            &format!("ReplicaSet \"{new_name}\" has successfully progressed."),
            true,
        );
    } else if new.is_some()
        && (progressed || !conditions.iter().any(|c| c["type"] == "Progressing"))
    {
        let reason = if conditions.iter().any(|c| c["type"] == "Progressing") {
            "ReplicaSetUpdated"
        } else {
            "FoundNewReplicaSet"
        };
        let message = if reason == "ReplicaSetUpdated" {
            format!("ReplicaSet \"{new_name}\" is progressing.")
        } else {
            format!("Found new replica set \"{new_name}\"")
        };
        put_condition(
            &mut conditions,
            "Progressing",
            "True",
            reason,
            &message,
            true,
        );
    } else if new.is_some() {
        // No progress: past the deadline the rollout is failed.
        let deadline = int(&d["spec"]["progressDeadlineSeconds"], 600);
        let last = conditions
            .iter()
            .find(|c| c["type"] == "Progressing" && c["reason"] != "NewReplicaSetAvailable")
            .and_then(|c| c["lastUpdateTime"].as_str())
            .and_then(parse_time);
        if let Some(last) = last
            && (now() - last).whole_seconds() > deadline
        {
            put_condition(
                &mut conditions,
                "Progressing",
                "False",
                "ProgressDeadlineExceeded",
                &format!("ReplicaSet \"{new_name}\" has timed out progressing."),
                true,
            );
        }
    }
    status.insert("conditions".into(), Value::Array(conditions));
    write_status(st, dinfo, d, Value::Object(status));
}

/// Deployment conditions carry `lastUpdateTime` (refreshed on every change, and for
/// Progressing on every progress) and `lastTransitionTime` (only when the status flips).
fn put_condition(
    conditions: &mut Vec<Value>,
    ty: &str,
    status: &str,
    reason: &str,
    message: &str,
    touch: bool,
) {
    let now = now_time();
    match conditions.iter_mut().find(|c| c["type"] == ty) {
        Some(c) => {
            let same = c["status"] == status && c["reason"] == reason && c["message"] == message;
            if same && !(touch && reason == "ReplicaSetUpdated") {
                return;
            }
            if c["status"] != status {
                c["lastTransitionTime"] = json!(now);
            }
            c["status"] = json!(status);
            c["reason"] = json!(reason);
            c["message"] = json!(message);
            c["lastUpdateTime"] = json!(now);
        }
        None => conditions.push(json!({
            "type": ty, "status": status, "reason": reason, "message": message,
            "lastUpdateTime": now, "lastTransitionTime": now,
        })),
    }
}
