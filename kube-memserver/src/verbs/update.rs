//! update (PUT), patch, and writes computed elsewhere (server-side apply).

use super::*;

/// Whether an update left an object that is being deleted with nothing to wait for.
fn finishes_deletion(obj: &Value) -> bool {
    !obj["metadata"]["deletionTimestamp"].is_null()
        && obj["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty())
        && obj["metadata"]["deletionGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(0)
            == 0
}

/// PUT. Returns the object and whether it was created.
pub fn update(
    st: &State,
    info: &ResourceInfo,
    ns: &str,
    url_name: &str,
    mut body: Value,
    opts: &WriteOptions,
) -> ApiResult<(Arc<Obj>, bool)> {
    strategy::check_type(info, &mut body)?;
    scope_namespace(info, ns, &mut body)?;
    let body_name = name(&body).to_string();
    if body_name.is_empty() {
        set_path(&mut body, &["metadata", "name"], json!(url_name));
    } else if body_name != url_name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({url_name})"
        )));
    }
    let body_rv = parse_rv(info, &body)?;
    let sub = opts.subresource.as_deref();
    let may_create = info.allow_create_on_update && sub.is_none();
    if may_create && st.table(info).get(&key(info, ns, url_name)).is_none() {
        check_namespace(st, info, ns, url_name)?;
    }
    let mut dry: Option<Value> = None;
    let table = st.table(info);
    let k = key(info, ns, url_name);
    let out = table.mutate(&k, |cur| {
        let Some(cur) = cur else {
            if !may_create {
                return Err(ApiError::not_found(info, url_name));
            }
            let mut obj = body;
            admit_create(st, info, &mut obj)?;
            strategy::prepare_create(info, &mut obj, &now_time());
            strategy::validate(info, &obj, None, None)?;
            if opts.dry_run {
                dry = Some(obj);
                return Ok(Mutation::Unchanged);
            }
            return Ok(Mutation::Put(obj));
        };
        match body_rv {
            None if !info.allow_unconditional_update => {
                return Err(ApiError::invalid(
                    info,
                    url_name,
                    vec![Cause::invalid(
                        "metadata.resourceVersion",
                        &json!("0x0"),
                        "must be specified for an update",
                    )],
                ));
            }
            Some(rv) if rv != cur.rv => return Err(ApiError::stale(info, url_name)),
            _ => {}
        }
        check_uid(info, url_name, &body, cur)?;
        let mut new = body;
        let old = cur.value();
        strategy::prepare_update(info, &old, &mut new, sub);
        strategy::validate(info, &new, Some(&old), sub)?;
        if opts.dry_run {
            dry = Some(new);
            return Ok(Mutation::Unchanged);
        }
        if finishes_deletion(&new) {
            return Ok(Mutation::Remove);
        }
        Ok(Mutation::Put(new))
    })?;
    if let Some(v) = dry {
        return Ok((detached(v)?, false));
    }
    finish_write(st, info, out)
}

fn check_uid(info: &ResourceInfo, name: &str, body: &Value, cur: &Obj) -> ApiResult<()> {
    match body["metadata"]["uid"].as_str() {
        Some(u) if !u.is_empty() && u != cur.uid() => Err(ApiError::conflict(
            info,
            name,
            &format!(
                "Precondition failed: UID in precondition: {u}, UID in object meta: {}",
                cur.uid()
            ),
        )),
        _ => Ok(()),
    }
}

fn finish_write(st: &State, info: &ResourceInfo, out: Outcome) -> ApiResult<(Arc<Obj>, bool)> {
    match out {
        Outcome::Created(o) => {
            after_create(st, info, &o);
            Ok((o, true))
        }
        Outcome::Updated(o) => {
            if info.kind == "CustomResourceDefinition" && !info.custom {
                establish_crd(st, &o.value());
                let latest = st.table(info).get(&o.key()).unwrap_or(o);
                return Ok((latest, false));
            }
            Ok((o, false))
        }
        Outcome::Removed(o) => {
            after_remove(st, info, &o);
            Ok((o, false))
        }
        Outcome::Unchanged(Some(o)) => Ok((o, false)),
        Outcome::Unchanged(None) => Err(ApiError::internal("write produced no object")),
    }
}

/// PATCH (json, merge, strategic). Server-side apply is handled by `apply`.
pub fn patch(
    st: &State,
    info: &ResourceInfo,
    ns: &str,
    url_name: &str,
    ptype: PatchType,
    body: &[u8],
    opts: &WriteOptions,
) -> ApiResult<(Arc<Obj>, bool)> {
    if ptype == PatchType::Apply {
        return crate::apply::apply(st, info, ns, url_name, body, opts);
    }
    if ptype == PatchType::Strategic && info.custom {
        return Err(ApiError::unsupported_patch(
            "application/strategic-merge-patch+json",
            &[
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/apply-patch+yaml",
            ],
        ));
    }
    let patch_doc: Option<Value> = match ptype {
        PatchType::Json => None,
        _ => Some(
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?,
        ),
    };
    let sub = opts.subresource.as_deref();
    let table = st.table(info);
    let k = key(info, ns, url_name);
    let mut dry: Option<Value> = None;
    let out = table.mutate(&k, |cur| {
        let Some(cur) = cur else {
            return Err(ApiError::not_found(info, url_name));
        };
        let mut v = cur.value();
        match (&patch_doc, ptype) {
            (Some(p), PatchType::Merge) => {
                if !p.is_object() {
                    return Err(ApiError::bad_request("merge patch must be a JSON object"));
                }
                patch::merge_patch(&mut v, p)
            }
            (Some(p), PatchType::Strategic) => patch::strategic_merge_patch(&info.kind, &mut v, p)?,
            _ => patch::json_patch(&mut v, body)?,
        }
        if !v.is_object() {
            return Err(ApiError::unprocessable(
                "the patched object is not a JSON object",
            ));
        }
        strategy::check_type(info, &mut v)?;
        if name(&v) != url_name || (info.namespaced && meta::namespace(&v) != ns) {
            return Err(ApiError::invalid(
                info,
                url_name,
                vec![Cause::invalid(
                    "metadata.name",
                    &json!(name(&v)),
                    "field is immutable",
                )],
            ));
        }
        match parse_rv(info, &v)? {
            Some(rv) if rv != cur.rv => return Err(ApiError::stale(info, url_name)),
            _ => {}
        }
        check_uid(info, url_name, &v, cur)?;
        let old = cur.value();
        strategy::prepare_update(info, &old, &mut v, sub);
        strategy::validate(info, &v, Some(&old), sub)?;
        if opts.dry_run {
            dry = Some(v);
            return Ok(Mutation::Unchanged);
        }
        if finishes_deletion(&v) {
            return Ok(Mutation::Remove);
        }
        Ok(Mutation::Put(v))
    })?;
    if let Some(v) = dry {
        return Ok((detached(v)?, false));
    }
    finish_write(st, info, out)
}

/// Writes an object computed elsewhere (server-side apply), with create-if-missing.
pub fn put_computed(
    st: &State,
    info: &ResourceInfo,
    ns: &str,
    url_name: &str,
    compute: impl FnOnce(Option<&Value>) -> ApiResult<Value>,
    opts: &WriteOptions,
) -> ApiResult<(Arc<Obj>, bool)> {
    let sub = opts.subresource.as_deref();
    let table = st.table(info);
    let k = key(info, ns, url_name);
    if table.get(&k).is_none() {
        if sub.is_some() {
            return Err(ApiError::not_found(info, url_name));
        }
        check_namespace(st, info, ns, url_name)?;
    }
    let mut dry: Option<Value> = None;
    let out = table.mutate(&k, |cur| {
        let cur_value = cur.map(|c| c.value());
        let mut v = compute(cur_value.as_ref())?;
        strategy::check_type(info, &mut v)?;
        scope_namespace(info, ns, &mut v)?;
        set_path(&mut v, &["metadata", "name"], json!(url_name));
        match cur {
            None => {
                admit_create(st, info, &mut v)?;
                strategy::prepare_create(info, &mut v, &now_time());
                strategy::validate(info, &v, None, None)?;
            }
            Some(cur) => {
                let old = cur.value();
                strategy::prepare_update(info, &old, &mut v, sub);
                strategy::validate(info, &v, Some(&old), sub)?;
                if finishes_deletion(&v) && !opts.dry_run {
                    return Ok(Mutation::Remove);
                }
            }
        }
        if opts.dry_run {
            dry = Some(v);
            return Ok(Mutation::Unchanged);
        }
        Ok(Mutation::Put(v))
    })?;
    if let Some(v) = dry {
        return Ok((detached(v)?, false));
    }
    finish_write(st, info, out)
}
