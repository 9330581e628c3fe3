//! delete with preconditions, graceful deletion, finalizers and namespace termination;
//! delete on a collection.

use super::*;

/// DELETE with preconditions, graceful deletion for pods on nodes, finalizers, and namespace
/// termination.
pub fn delete(
    st: &State,
    info: &ResourceInfo,
    ns: &str,
    obj_name: &str,
    opts: &DeleteOptions,
) -> ApiResult<Deleted> {
    let table = st.table(info);
    let k = key(info, ns, obj_name);
    let mut dry: Option<Value> = None;
    let out = table.mutate(&k, |cur| {
        let Some(cur) = cur else {
            return Err(ApiError::not_found(info, obj_name));
        };
        if let Some(uid) = &opts.uid
            && uid != cur.uid()
        {
            return Err(ApiError::conflict(
                info,
                obj_name,
                &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {}", cur.uid()),
            ));
        }
        if let Some(rv) = &opts.resource_version
            && *rv != cur.rv.to_string()
        {
            return Err(ApiError::conflict(
                info,
                obj_name,
                &format!("Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}", cur.rv),
            ));
        }
        let mut v = cur.value();
        let deleting = !v["metadata"]["deletionTimestamp"].is_null();
        if info.kind == "Namespace" && !info.custom {
            if deleting {
                return Ok(Mutation::Unchanged);
            }
            set_path(&mut v, &["metadata", "deletionTimestamp"], json!(now_time()));
            set_path(&mut v, &["metadata", "deletionGracePeriodSeconds"], json!(0));
            set_path(&mut v, &["status", "phase"], json!("Terminating"));
            if opts.dry_run {
                dry = Some(v);
                return Ok(Mutation::Unchanged);
            }
            return Ok(Mutation::Put(v));
        }
        // The garbage collector's finalizers for foreground and orphan propagation.
        let gc_finalizer = match opts.propagation_policy.as_deref() {
            Some("Foreground") => Some(crate::gc::FOREGROUND),
            Some("Orphan") => Some(crate::gc::ORPHAN),
            _ => None,
        };
        if let Some(f) = gc_finalizer {
            let mut fins = v["metadata"]["finalizers"].as_array().cloned().unwrap_or_default();
            if !fins.iter().any(|x| x == f) {
                fins.push(json!(f));
                set_path(&mut v, &["metadata", "finalizers"], Value::Array(fins));
            }
        }
        let has_finalizers = v["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty());
        let grace = graceful_period(info, &v, opts.grace_period_seconds);
        if grace > 0 {
            let current = v["metadata"]["deletionGracePeriodSeconds"].as_i64();
            if deleting && current.is_some_and(|c| c <= grace) {
                return Ok(Mutation::Unchanged);
            }
            let when = now()
                .checked_add(time::Duration::seconds(grace))
                .ok_or_else(|| ApiError::bad_request("gracePeriodSeconds is too large"))?;
            set_path(&mut v, &["metadata", "deletionTimestamp"], json!(meta::format_time(when)));
            set_path(&mut v, &["metadata", "deletionGracePeriodSeconds"], json!(grace));
            if let Some(g) = v["metadata"]["generation"].as_i64().filter(|g| *g > 0 && !deleting) {
                set_path(&mut v, &["metadata", "generation"], json!(g + 1));
            }
            if opts.dry_run {
                dry = Some(v);
                return Ok(Mutation::Unchanged);
            }
            return Ok(Mutation::Put(v));
        }
        if has_finalizers {
            if !deleting || v["metadata"]["deletionGracePeriodSeconds"].as_i64() != Some(0) {
                if !deleting {
                    set_path(&mut v, &["metadata", "deletionTimestamp"], json!(now_time()));
                    // Marking an object deleting bumps its generation (`markAsDeleting`).
                    if let Some(g) = v["metadata"]["generation"].as_i64().filter(|g| *g > 0) {
                        set_path(&mut v, &["metadata", "generation"], json!(g.saturating_add(1)));
                    }
                }
                set_path(&mut v, &["metadata", "deletionGracePeriodSeconds"], json!(0));
            }
            if opts.dry_run {
                dry = Some(v);
                return Ok(Mutation::Unchanged);
            }
            return Ok(Mutation::Put(v));
        }
        if opts.dry_run {
            dry = Some(v);
            return Ok(Mutation::Unchanged);
        }
        Ok(Mutation::Remove)
    })?;
    if let Some(v) = dry {
        return Ok(Deleted::Pending(detached(v)?));
    }
    match out {
        Outcome::Removed(o) => {
            after_remove(st, info, &o);
            Ok(Deleted::Removed(o))
        }
        Outcome::Updated(o) | Outcome::Created(o) | Outcome::Unchanged(Some(o)) => {
            if o.has_finalizer(crate::gc::FOREGROUND) || o.has_finalizer(crate::gc::ORPHAN) {
                st.store.note_propagating_deletion();
            }
            Ok(Deleted::Pending(o))
        }
        Outcome::Unchanged(None) => Err(ApiError::not_found(info, obj_name)),
    }
}

/// The grace period a deletion gets: pods bound to a node wait for the kubelet.
fn graceful_period(info: &ResourceInfo, obj: &Value, requested: Option<i64>) -> i64 {
    if info.kind != "Pod" || info.custom {
        return 0;
    }
    let spec = &obj["spec"];
    if spec["nodeName"].as_str().is_none_or(str::is_empty) {
        return 0;
    }
    if matches!(
        obj["status"]["phase"].as_str(),
        Some("Succeeded") | Some("Failed")
    ) {
        return 0;
    }
    let period = requested
        .or_else(|| spec["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(30);
    if period < 0 { 1 } else { period }
}

pub(super) fn after_remove(st: &State, info: &ResourceInfo, obj: &Arc<Obj>) {
    if info.kind == "CustomResourceDefinition" && !info.custom {
        let group = obj.value()["spec"]["group"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let plural = obj.value()["spec"]["names"]["plural"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if st.resources.is_builtin(&group, &plural) {
            return;
        }
        let table = st.store.table(&group, &plural);
        for o in table.all() {
            let _ = table.mutate(&o.key(), |_| Ok(Mutation::Remove));
        }
        table.close_watchers();
        st.resources.set_custom(&group, &plural, Vec::new());
    }
}

/// DELETE on a collection: deletes every matching object; returns the deleted ones.
pub fn delete_collection(
    st: &State,
    info: &ResourceInfo,
    ns: Option<&str>,
    filter: &Filter,
    opts: &DeleteOptions,
) -> ApiResult<Vec<Arc<Obj>>> {
    let table = st.table(info);
    let page = table.list(ns, None, None, None, filter)?;
    let mut out = Vec::new();
    for o in page.items {
        match delete(st, info, o.namespace(), o.name(), opts) {
            Ok(Deleted::Removed(d)) | Ok(Deleted::Pending(d)) => out.push(d),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}
