//! The workload controllers of kube-controller-manager and the default scheduler, reduced to
//! what clients observe: Deployments roll ReplicaSets, ReplicaSets keep pods, DaemonSets put a
//! pod on every eligible node, StatefulSets keep ordered pods, Jobs run pods to completion, and
//! the scheduler binds pending pods to nodes that fit them.
//!
//! Each controller is a pass over the store (`fn(&State)`), run by [`run`] whenever the store's
//! resourceVersion moved, and at least every `workload_resync_period` for the decisions that
//! depend on time (minReadySeconds, progress deadlines). Writes go through the verbs (or the
//! tables for status), so watches see everything a controller does. Pod readiness is only
//! ever read from the pods' status, written by kubelets.
//!
//! Files: one per controller, `fit.rs` (the scheduler's node filters, also used by the
//! DaemonSet controller), `revisions.rs` (ControllerRevisions), `strategy.rs` (defaults and
//! validation of the kinds), `table.rs` (their `kubectl get` columns); helpers shared by the
//! controllers (selectors, owner references, pod state, events, status writes) are here.

pub mod daemonset;
pub mod deployment;
pub mod fit;
pub mod job;
pub mod replicaset;
pub mod revisions;
pub mod scheduler;
pub mod statefulset;
pub mod strategy;
pub mod table;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::controllers::MIN_PERIOD;
use crate::meta::{now, now_time, parse_time, set_path};
use crate::resources::ResourceInfo;
use crate::state::State;
use crate::store::{Mutation, Obj};
use crate::verbs::{self, WriteOptions};

/// One controller's pass over the store.
pub type Pass = fn(&State);

/// Runs `pass` after every change to the store and at least every resync period.
pub async fn run(st: Arc<State>, cancel: CancellationToken, name: &'static str, pass: Pass) {
    let mut tick = tokio::time::interval(st.config.workload_sync_period.max(MIN_PERIOD));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen = 0u64;
    let mut last = Instant::now();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {
                let rv = st.store.current_rv();
                if rv != seen || last.elapsed() >= st.config.workload_resync_period {
                    seen = rv;
                    last = Instant::now();
                    tracing::trace!(controller = name, "sync");
                    // Where panics unwind (tests, dev builds), a bug must not stop the controller
                    // for good: log it and go on.
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pass(&st)));
                    if run.is_err() {
                        tracing::error!(controller = name, "controller pass panicked");
                    }
                }
            }
        }
    }
}

pub fn apps(st: &State, plural: &str) -> Option<Arc<ResourceInfo>> {
    st.resources.lookup("apps", "v1", plural)
}

pub fn batch(st: &State, plural: &str) -> Option<Arc<ResourceInfo>> {
    st.resources.lookup("batch", "v1", plural)
}

/// Whether a `LabelSelector` (matchLabels + matchExpressions) selects `labels`. A missing or
/// malformed selector selects nothing; an empty one everything.
pub fn selector_matches(sel: &Value, labels: &Value) -> bool {
    if !sel.is_object() {
        return false;
    }
    let label = |k: &str| labels.get(k).and_then(Value::as_str);
    if let Some(m) = sel.get("matchLabels") {
        let Some(m) = m.as_object() else {
            return m.is_null();
        };
        if !m
            .iter()
            .all(|(k, v)| v.as_str().is_some() && label(k) == v.as_str())
        {
            return false;
        }
    }
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let Some(key) = e["key"].as_str() else {
            return false;
        };
        let values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let ok = match e["operator"].as_str() {
            Some("In") => label(key).is_some_and(|v| values.contains(&v)),
            Some("NotIn") => label(key).is_none_or(|v| !values.contains(&v)),
            Some("Exists") => label(key).is_some(),
            Some("DoesNotExist") => label(key).is_none(),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// The `kubectl`-style string of a label selector (`a=b,c in (d)`), as Scale's status shows.
pub fn selector_string(sel: &Value) -> String {
    let mut parts: Vec<String> = sel["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or_default();
        let mut values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        values.sort();
        parts.push(match e["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            other => format!("{key} {other}"),
        });
    }
    parts.sort();
    parts.join(",")
}

/// The uid of the object's managing controller (`ownerReferences[].controller: true`).
pub fn controller_uid(obj: &Value) -> Option<&str> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"].as_bool() == Some(true))
        .and_then(|r| r["uid"].as_str())
}

/// An owner reference to `owner` as controllers set them.
pub fn controller_ref(owner: &Value, api_version: &str, kind: &str) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

fn condition<'a>(obj: &'a Value, ty: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)
}

/// The pod's Ready condition is True (what its kubelet reported).
pub fn pod_ready(pod: &Value) -> bool {
    condition(pod, "Ready").is_some_and(|c| c["status"] == "True")
}

/// Ready for at least `min_ready` seconds (`podutil.IsPodAvailable`).
pub fn pod_available(pod: &Value, min_ready: i64) -> bool {
    let Some(c) = condition(pod, "Ready").filter(|c| c["status"] == "True") else {
        return false;
    };
    if min_ready <= 0 {
        return true;
    }
    c["lastTransitionTime"]
        .as_str()
        .and_then(parse_time)
        .is_some_and(|t| (now() - t).whole_seconds() >= min_ready)
}

/// Not being deleted and not finished (`controller.IsPodActive`).
pub fn pod_active(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && !matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded") | Some("Failed")
        )
}

/// The pods in `ns` controlled by `owner_uid`, adopting orphans its selector matches (and the
/// owner is not being deleted), as the controllers' `ClaimPods` does.
pub fn claim_pods(st: &State, owner: &Value, ns: &str, pods: &[Arc<Obj>]) -> Vec<Value> {
    let uid = owner["metadata"]["uid"].as_str().unwrap_or_default();
    let selector = &owner["spec"]["selector"];
    let mut out = Vec::new();
    for p in pods.iter().filter(|p| p.namespace() == ns) {
        if !may_belong(p, uid, selector) {
            continue;
        }
        let v = p.value();
        match controller_uid(&v) {
            Some(u) if u == uid => {
                // A pod relabelled out of the selector is released (and replaced).
                if !p.deleting() && !selector_matches(selector, &v["metadata"]["labels"]) {
                    release(st, &v, uid);
                    continue;
                }
                out.push(v)
            }
            Some(_) => {}
            None => {
                let owner_deleting = !owner["metadata"]["deletionTimestamp"].is_null();
                if owner_deleting
                    || p.deleting()
                    || !selector_matches(selector, &v["metadata"]["labels"])
                {
                    continue;
                }
                let api_version = owner["apiVersion"].as_str().unwrap_or_default();
                let kind = owner["kind"].as_str().unwrap_or_default();
                let oref = controller_ref(owner, api_version, kind);
                if let Some(adopted) = add_owner(st, &st.core("pods"), &v, oref) {
                    out.push(adopted);
                }
            }
        }
    }
    out
}

/// Cheap pre-check on the stored fields (no JSON parsing): the object names `uid` as an owner,
/// or has no owner and carries the selector's `matchLabels`.
pub fn may_belong(o: &Obj, uid: &str, selector: &Value) -> bool {
    if o.owners().next().is_some() {
        return o.owners().any(|u| u == uid);
    }
    selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| o.label(k) == v.as_str())
}

/// Removes `owner_uid` from the pod's owner references.
fn release(st: &State, pod: &Value, owner_uid: &str) {
    let mut v = pod.clone();
    let refs: Vec<Value> = v["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["uid"].as_str() != Some(owner_uid))
        .cloned()
        .collect();
    if refs.is_empty() {
        crate::meta::remove_path(&mut v, &["metadata", "ownerReferences"]);
    } else {
        set_path(&mut v, &["metadata", "ownerReferences"], Value::Array(refs));
    }
    let ns = crate::meta::namespace(pod).to_string();
    let name = crate::meta::name(pod).to_string();
    let _ = verbs::update(
        st,
        &st.core("pods"),
        &ns,
        &name,
        v,
        &WriteOptions::default(),
    );
}

/// Adds a controller reference to an orphan (conditional on its resourceVersion).
pub fn add_owner(st: &State, info: &ResourceInfo, obj: &Value, oref: Value) -> Option<Value> {
    let mut v = obj.clone();
    let mut refs = v["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    refs.push(oref);
    set_path(&mut v, &["metadata", "ownerReferences"], Value::Array(refs));
    let ns = crate::meta::namespace(obj).to_string();
    let name = crate::meta::name(obj).to_string();
    verbs::update(st, info, &ns, &name, v, &WriteOptions::default())
        .ok()
        .map(|(o, _)| o.value())
}

/// Creates a pod from a template, owned by `owner`.
pub fn create_pod(
    st: &State,
    ns: &str,
    template: &Value,
    owner_ref: Value,
    name: PodName<'_>,
    customize: impl FnOnce(&mut Value),
) -> Result<Value, crate::status::ApiError> {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template["metadata"].clone(),
        "spec": template["spec"].clone(),
    });
    if !pod["metadata"].is_object() {
        pod["metadata"] = json!({});
    }
    for f in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        crate::meta::remove_path(&mut pod, &["metadata", f]);
    }
    match name {
        PodName::Generate(prefix) => set_path(
            &mut pod,
            &["metadata", "generateName"],
            json!(format!("{prefix}-")),
        ),
        PodName::Exact(n) => set_path(&mut pod, &["metadata", "name"], json!(n)),
    }
    set_path(
        &mut pod,
        &["metadata", "ownerReferences"],
        json!([owner_ref]),
    );
    customize(&mut pod);
    verbs::create(st, &st.core("pods"), ns, pod, &WriteOptions::default()).map(|o| o.value())
}

pub enum PodName<'a> {
    /// `generateName: <prefix>-`.
    Generate(&'a str),
    Exact(&'a str),
}

/// Deletes a pod (gracefully, as controllers do).
pub fn delete_pod(st: &State, pod: &Value) {
    let ns = crate::meta::namespace(pod);
    let name = crate::meta::name(pod);
    let opts = verbs::DeleteOptions {
        uid: pod["metadata"]["uid"].as_str().map(str::to_string),
        ..Default::default()
    };
    if let Err(e) = verbs::delete(st, &st.core("pods"), ns, name, &opts) {
        tracing::debug!(pod = name, error = %e, "deleting a pod");
    }
}

/// Writes `status` (and nothing else) when it differs from the stored one.
pub fn write_status(st: &State, info: &ResourceInfo, obj: &Value, status: Value) {
    let key = (
        crate::meta::namespace(obj).to_string(),
        crate::meta::name(obj).to_string(),
    );
    let uid = obj["metadata"]["uid"].clone();
    let _ = st.table(info).mutate(&key, |cur| {
        let Some(cur) = cur else {
            return Ok(Mutation::Unchanged);
        };
        let mut v = cur.value();
        if v["metadata"]["uid"] != uid || v["status"] == status {
            return Ok(Mutation::Unchanged);
        }
        v["status"] = status;
        Ok(Mutation::Put(v))
    });
}

/// Rewrites an object through the update verb (generation, validation), conditional on the
/// resourceVersion the controller read. A conflict is retried on the next pass.
pub fn update_object(
    st: &State,
    info: &ResourceInfo,
    obj: &Value,
    f: impl FnOnce(&mut Value),
) -> Option<Value> {
    let mut v = obj.clone();
    f(&mut v);
    if v == *obj {
        return Some(v);
    }
    let ns = crate::meta::namespace(obj).to_string();
    let name = crate::meta::name(obj).to_string();
    match verbs::update(st, info, &ns, &name, v, &WriteOptions::default()) {
        Ok((o, _)) => Some(o.value()),
        Err(e) => {
            tracing::debug!(kind = %info.kind, name, error = %e, "controller update");
            None
        }
    }
}

/// Records an Event about `obj` (`kind` and apiVersion as the involved object's).
pub fn record_event(
    st: &State,
    obj: &Value,
    ty: &str,
    reason: &str,
    message: &str,
    component: &str,
) {
    let ns = match crate::meta::namespace(obj) {
        "" => "default",
        ns => ns,
    }
    .to_string();
    let name = crate::meta::name(obj);
    let now = now_time();
    let event = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": format!("{name}.{}", crate::meta::random_suffix(16)), "namespace": ns},
        "involvedObject": {
            "apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": name,
            "namespace": obj["metadata"]["namespace"], "uid": obj["metadata"]["uid"],
            "resourceVersion": obj["metadata"]["resourceVersion"],
        },
        "reason": reason,
        "message": message,
        "type": ty,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    });
    if let Err(e) = verbs::create(st, &st.core("events"), &ns, event, &WriteOptions::default()) {
        tracing::debug!(reason, error = %e, "recording an event");
    }
}

/// A condition entry with transition bookkeeping: keeps `lastTransitionTime` when the status
/// did not change.
pub fn set_condition(conditions: &mut Vec<Value>, mut cond: Value) {
    let now = now_time();
    let ty = cond["type"].clone();
    match conditions.iter_mut().find(|c| c["type"] == ty) {
        Some(c) => {
            let same_status = c["status"] == cond["status"];
            let same =
                same_status && c["reason"] == cond["reason"] && c["message"] == cond["message"];
            if same {
                return;
            }
            cond["lastTransitionTime"] = if same_status {
                c["lastTransitionTime"].clone()
            } else {
                json!(now)
            };
            if cond.get("lastUpdateTime").is_some() {
                cond["lastUpdateTime"] = json!(now);
            }
            *c = cond;
        }
        None => {
            cond["lastTransitionTime"] = json!(now);
            if cond.get("lastUpdateTime").is_some() {
                cond["lastUpdateTime"] = json!(now);
            }
            conditions.push(cond);
        }
    }
}

/// `intstr` against a total: an integer, or a percentage rounded up or down.
pub fn int_or_percent(v: &Value, total: i64, round_up: bool) -> i64 {
    match v {
        Value::Number(_) => int(v, 0).max(0),
        Value::String(s) => match s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) {
            Some(p) => {
                let x = p.clamp(0, i64::from(i32::MAX)) * total.clamp(0, i64::from(i32::MAX));
                if round_up { (x + 99) / 100 } else { x / 100 }
            }
            None => s.parse::<i64>().unwrap_or(0).clamp(0, i64::from(i32::MAX)),
        },
        _ => 0,
    }
}

/// The FNV-1a 32-bit hash of a template (with `collision`) in the alphabet upstream's
/// `rand.SafeEncodeString` uses: the shape of `pod-template-hash` and
/// `controller-revision-hash` values.
pub fn template_hash(template: &Value, collision: Option<i64>) -> String {
    let mut h: u32 = 0x811c_9dc5;
    let mut feed = |b: &[u8]| {
        for x in b {
            h ^= u32::from(*x);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    feed(
        serde_json::to_string(template)
            .unwrap_or_default()
            .as_bytes(),
    );
    if let Some(c) = collision {
        feed(&c.to_le_bytes());
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    h.to_string()
        .bytes()
        .map(|d| ALPHABET[usize::from(d) % ALPHABET.len()] as char)
        .collect()
}

/// The template with the given label key removed (how templates are compared).
pub fn without_label(template: &Value, key: &str) -> Value {
    let mut t = template.clone();
    crate::meta::remove_path(&mut t, &["metadata", "labels", key]);
    if t["metadata"]["labels"]
        .as_object()
        .is_some_and(|m| m.is_empty())
    {
        crate::meta::remove_path(&mut t, &["metadata", "labels"]);
    }
    t
}

/// An int32 field (as the Go types hold them): out-of-range values are clamped, so that the
/// controllers' arithmetic cannot overflow on whatever is stored.
pub fn int(v: &Value, default: i64) -> i64 {
    v.as_i64()
        .unwrap_or(default)
        .clamp(i64::from(i32::MIN), i64::from(i32::MAX))
}

/// The pods, indexed once per pass by owner uid (and the ownerless ones by namespace), so that
/// a controller looks only at its own pods and the orphans it might adopt.
/// Runs a controller's `sync` for every object of `info`'s kind, with the pods that may be its
/// own (one pod index per pass; nothing is read when there is no such object).
pub fn sync_owners(
    st: &State,
    info: Option<Arc<ResourceInfo>>,
    mut sync: impl FnMut(&ResourceInfo, &Value, &[Arc<Obj>]),
) {
    let Some(info) = info else {
        return;
    };
    let all = st.table(&info).all();
    if all.is_empty() {
        return;
    }
    let pods = PodIndex::build(st);
    for owner in all {
        let candidates = pods.candidates(&owner);
        sync(&info, &owner.value(), &candidates);
    }
}

pub struct PodIndex {
    by_owner: std::collections::HashMap<String, Vec<Arc<Obj>>>,
    orphans: std::collections::HashMap<String, Vec<Arc<Obj>>>,
}

impl PodIndex {
    pub fn build(st: &State) -> Self {
        let mut index = Self {
            by_owner: Default::default(),
            orphans: Default::default(),
        };
        for p in st.table(&st.core("pods")).all() {
            if p.owners().next().is_none() {
                index
                    .orphans
                    .entry(p.namespace().to_string())
                    .or_default()
                    .push(p);
                continue;
            }
            for u in p.owners() {
                index
                    .by_owner
                    .entry(u.to_string())
                    .or_default()
                    .push(p.clone());
            }
        }
        index
    }

    /// The pods `owner` (an object's uid, in `ns`) owns, and the orphans of `ns`.
    pub fn candidates(&self, owner: &Obj) -> Vec<Arc<Obj>> {
        let mut out: Vec<Arc<Obj>> = self.by_owner.get(owner.uid()).cloned().unwrap_or_default();
        out.extend(
            self.orphans
                .get(owner.namespace())
                .into_iter()
                .flatten()
                .cloned(),
        );
        out
    }
}
