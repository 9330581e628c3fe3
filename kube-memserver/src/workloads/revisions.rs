//! ControllerRevisions for DaemonSets and StatefulSets: one per distinct pod template, named
//! `<owner>-<hash>`, holding the template as the strategic patch upstream stores
//! (`{"spec":{"template":{…,"$patch":"replace"}}}`), numbered in `revision` — what
//! `kubectl rollout history/undo daemonset|statefulset` read.

use serde_json::{Value, json};

use super::{apps, controller_ref, controller_uid, template_hash};
use crate::state::State;
use crate::verbs::{self, DeleteOptions, WriteOptions};

pub const HASH_LABEL: &str = "controller-revision-hash";

/// The revision data of an owner's current template.
fn data_of(owner: &Value) -> Value {
    let mut t = owner["spec"]["template"].clone();
    if t.is_object() {
        t["$patch"] = json!("replace");
    }
    json!({"spec": {"template": t}})
}

/// The current revision of `owner` (created, or renumbered to the newest when an older one is
/// reused): (revision name, hash, revision number).
pub fn ensure(st: &State, owner: &Value, kind: &str) -> Option<(String, String, i64)> {
    let info = apps(st, "controllerrevisions")?;
    let ns = crate::meta::namespace(owner);
    let name = crate::meta::name(owner);
    let uid = owner["metadata"]["uid"].as_str().unwrap_or_default();
    let data = data_of(owner);
    let table = st.table(&info);
    let owned: Vec<Value> = table
        .in_namespace(ns)
        .iter()
        .filter(|o| o.owners().any(|u| u == uid))
        .map(|o| o.value())
        .filter(|r| controller_uid(r) == Some(uid))
        .collect();
    let max = owned
        .iter()
        .filter_map(|r| r["revision"].as_i64())
        .max()
        .unwrap_or(0);
    if let Some(existing) = owned.iter().find(|r| r["data"] == data) {
        let rname = crate::meta::name(existing).to_string();
        let hash = existing["metadata"]["labels"][HASH_LABEL]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let rev = existing["revision"].as_i64().unwrap_or(0);
        if rev < max {
            let mut v = existing.clone();
            v["revision"] = json!(max.saturating_add(1));
            let _ = verbs::update(st, &info, ns, &rname, v, &WriteOptions::default());
            return Some((rname, hash, max.saturating_add(1)));
        }
        return Some((rname, hash, rev));
    }
    let collisions = owner["status"]["collisionCount"].as_i64();
    let hash = template_hash(&data, collisions);
    let rname = format!("{name}-{hash}");
    let mut labels = owner["spec"]["template"]["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels[HASH_LABEL] = json!(hash);
    let rev = json!({
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {"name": rname, "namespace": ns, "labels": labels,
            "ownerReferences": [controller_ref(owner, "apps/v1", kind)]},
        "data": data,
        "revision": max.saturating_add(1),
    });
    match verbs::create(st, &info, ns, rev, &WriteOptions::default()) {
        Ok(_) => Some((rname, hash, max.saturating_add(1))),
        Err(e) => {
            tracing::debug!(owner = name, error = %e, "creating a controller revision");
            None
        }
    }
}

/// Deletes the oldest revisions beyond the owner's `revisionHistoryLimit` that no pod uses.
pub fn prune(st: &State, owner: &Value, in_use: &[&str]) {
    let Some(info) = apps(st, "controllerrevisions") else {
        return;
    };
    let ns = crate::meta::namespace(owner);
    let uid = owner["metadata"]["uid"].as_str().unwrap_or_default();
    let limit = owner["spec"]["revisionHistoryLimit"]
        .as_i64()
        .unwrap_or(10)
        .max(0) as usize;
    let mut owned: Vec<Value> = st
        .table(&info)
        .in_namespace(ns)
        .iter()
        .filter(|o| o.owners().any(|u| u == uid))
        .map(|o| o.value())
        .filter(|r| controller_uid(r) == Some(uid))
        .collect();
    owned.sort_by_key(|r| r["revision"].as_i64().unwrap_or(0));
    let Some(_current) = owned.pop() else {
        return;
    };
    let unused: Vec<&Value> = owned
        .iter()
        .filter(|r| {
            let name = crate::meta::name(r);
            let hash = r["metadata"]["labels"][HASH_LABEL]
                .as_str()
                .unwrap_or_default();
            !in_use.contains(&name) && !in_use.contains(&hash)
        })
        .collect();
    if unused.len() <= limit {
        return;
    }
    for r in unused.iter().take(unused.len() - limit) {
        let _ = verbs::delete(
            st,
            &info,
            ns,
            crate::meta::name(r),
            &DeleteOptions::default(),
        );
    }
}
