//! The API verbs with Kubernetes semantics (create, get, list, update, patch, delete, and the
//! subresources `token` and `binding`), shared by the HTTP handlers and the controllers.

use std::sync::Arc;

use serde_json::{Value, json};

use super::meta::{self, name, now, now_time, set_path};
use super::patch::{self, PatchType};
use super::resources::ResourceInfo;
use super::selectors::Filter;
use super::state::State;
use super::status::{ApiError, ApiResult, Cause};
use super::store::{ListPage, Mutation, Obj, ObjKey, Outcome};
use super::strategy;
use super::tokens::{ISSUER, TokenClaims};

#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_manager: Option<String>,
    pub subresource: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub propagation_policy: Option<String>,
    pub dry_run: bool,
}

impl DeleteOptions {
    /// Reads a `DeleteOptions` body (may be empty) merged with query parameters.
    pub fn from_body(body: &Value) -> Self {
        Self {
            grace_period_seconds: body["gracePeriodSeconds"].as_i64(),
            uid: body["preconditions"]["uid"].as_str().map(str::to_string),
            resource_version: body["preconditions"]["resourceVersion"]
                .as_str()
                .map(str::to_string),
            propagation_policy: body["propagationPolicy"]
                .as_str()
                .map(str::to_string)
                .or_else(|| {
                    (body["orphanDependents"].as_bool() == Some(true)).then(|| "Orphan".into())
                }),
            dry_run: body["dryRun"]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v == "All")),
        }
    }
}

/// The result of a DELETE.
#[derive(Debug)]
pub enum Deleted {
    /// Gone from the store (the object at the deletion's resourceVersion).
    Removed(Arc<Obj>),
    /// Still present: graceful deletion or finalizers pending.
    Pending(Arc<Obj>),
}

fn key(info: &ResourceInfo, ns: &str, name: &str) -> ObjKey {
    if info.namespaced {
        (ns.to_string(), name.to_string())
    } else {
        (String::new(), name.to_string())
    }
}

pub fn get(st: &State, info: &ResourceInfo, ns: &str, name: &str) -> ApiResult<Arc<Obj>> {
    st.table(info)
        .get(&key(info, ns, name))
        .ok_or_else(|| ApiError::not_found(info, name))
}

pub struct ListRequest<'a> {
    pub ns: Option<&'a str>,
    pub filter: &'a Filter,
    pub limit: Option<usize>,
    pub continue_token: Option<&'a str>,
    pub resource_version: Option<u64>,
    pub exact: bool,
}

/// A list page plus the continue token for the next one.
pub struct ListResult {
    pub page: ListPage,
    pub continue_token: Option<String>,
}

pub fn list(st: &State, info: &ResourceInfo, req: &ListRequest<'_>) -> ApiResult<ListResult> {
    let table = st.table(info);
    let (at, after) = match req.continue_token {
        Some(tok) => {
            let (rv, start) = decode_continue(tok, info.namespaced && req.ns.is_none())?;
            let after = match req.ns {
                Some(ns) if info.namespaced => (ns.to_string(), start.1),
                _ => start,
            };
            (Some(rv), Some(after))
        }
        None => {
            let at = match (req.resource_version, req.exact) {
                (Some(rv), true) => {
                    if rv < table.floor_rv() {
                        return Err(ApiError::too_old(rv, table.floor_rv() + 1));
                    }
                    Some(rv)
                }
                _ => None,
            };
            (at, None)
        }
    };
    let page = table.list(req.ns, at, after.as_ref(), req.limit, req.filter)?;
    let continue_token = page
        .next
        .as_ref()
        .map(|k| encode_continue(page.rv, k, info.namespaced && req.ns.is_none()));
    Ok(ListResult {
        page,
        continue_token,
    })
}

/// Continue tokens look like the real ones: base64 of `{"v":"meta.k8s.io/v1","rv":N,"start":"key\u0000"}`.
fn encode_continue(rv: u64, k: &ObjKey, cross_namespace: bool) -> String {
    use base64::Engine;
    let start = if cross_namespace && !k.0.is_empty() {
        format!("{}/{}\u{0}", k.0, k.1)
    } else {
        format!("{}\u{0}", k.1)
    };
    let doc = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start});
    base64::engine::general_purpose::URL_SAFE.encode(doc.to_string())
}

fn decode_continue(tok: &str, cross_namespace: bool) -> ApiResult<(u64, ObjKey)> {
    use base64::Engine;
    let bad = || ApiError::bad_request(format!("continue key is not valid: {tok:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE
        .decode(tok.trim_end_matches('='))
        .or_else(|_| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(tok.trim_end_matches('='))
        })
        .or_else(|_| base64::engine::general_purpose::STANDARD.decode(tok))
        .map_err(|_| bad())?;
    let doc: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    if doc["v"] != "meta.k8s.io/v1" {
        return Err(bad());
    }
    let rv = doc["rv"].as_u64().ok_or_else(bad)?;
    let start = doc["start"].as_str().ok_or_else(bad)?;
    let start = start.strip_suffix('\u{0}').unwrap_or(start);
    let key = if cross_namespace {
        match start.split_once('/') {
            Some((ns, name)) => (ns.to_string(), name.to_string()),
            None => (String::new(), start.to_string()),
        }
    } else {
        (String::new(), start.to_string())
    };
    Ok((rv, key))
}

/// Checks that the URL namespace and the body agree, and stamps the namespace in.
fn scope_namespace(info: &ResourceInfo, ns: &str, obj: &mut Value) -> ApiResult<()> {
    if info.namespaced {
        match obj["metadata"]["namespace"].as_str() {
            Some(n) if !n.is_empty() && n != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => set_path(obj, &["metadata", "namespace"], json!(ns)),
        }
    } else {
        meta::remove_path(obj, &["metadata", "namespace"]);
    }
    Ok(())
}

/// NamespaceLifecycle admission: the namespace must exist and not be terminating.
fn check_namespace(st: &State, info: &ResourceInfo, ns: &str, obj_name: &str) -> ApiResult<()> {
    if !info.namespaced {
        return Ok(());
    }
    let nsinfo = st.core("namespaces");
    match st.table(&nsinfo).get(&(String::new(), ns.to_string())) {
        None => Err(ApiError::namespace_not_found(ns)),
        Some(n) if n.deleting() && info.kind != "Event" => Err(ApiError::forbidden(
            info,
            obj_name,
            format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            ),
        )),
        Some(_) => Ok(()),
    }
}

/// Admission plugins that mutate on create (ServiceAccount, service IP allocation, namespace label).
fn admit_create(st: &State, info: &ResourceInfo, obj: &mut Value) -> ApiResult<()> {
    if info.custom {
        return Ok(());
    }
    match info.kind.as_str() {
        "Pod" => {
            let ns = meta::namespace(obj).to_string();
            let sa = obj["spec"]["serviceAccountName"]
                .as_str()
                .or_else(|| obj["spec"]["serviceAccount"].as_str())
                .filter(|s| !s.is_empty())
                .unwrap_or("default")
                .to_string();
            let is_mirror =
                obj["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string();
            if !is_mirror {
                let sainfo = st.core("serviceaccounts");
                let Some(sa_obj) = st.table(&sainfo).get(&(ns.clone(), sa.clone())) else {
                    return Err(ApiError::forbidden(
                        info,
                        name(obj),
                        format!(
                            "error looking up service account {ns}/{sa}: serviceaccount \"{sa}\" not found"
                        ),
                    ));
                };
                let automount =
                    sa_obj.value()["automountServiceAccountToken"].as_bool() != Some(false);
                strategy::add_service_account_volume(obj, automount);
            }
        }
        "Service" => {
            let ty = obj["spec"]["type"]
                .as_str()
                .unwrap_or("ClusterIP")
                .to_string();
            if obj["spec"].is_object() {
                let spec = &mut obj["spec"];
                if spec["type"].is_null() {
                    spec["type"] = json!("ClusterIP");
                }
                if ty != "ExternalName" {
                    if spec["clusterIP"].as_str().is_none_or(str::is_empty) {
                        spec["clusterIP"] = json!(st.allocate_cluster_ip());
                    }
                    spec["clusterIPs"] = json!([spec["clusterIP"].clone()]);
                    if spec["ipFamilies"].is_null() {
                        spec["ipFamilies"] = json!(["IPv4"]);
                    }
                    if spec["ipFamilyPolicy"].is_null() {
                        spec["ipFamilyPolicy"] = json!("SingleStack");
                    }
                    if spec["internalTrafficPolicy"].is_null() {
                        spec["internalTrafficPolicy"] = json!("Cluster");
                    }
                }
                if spec["sessionAffinity"].is_null() {
                    spec["sessionAffinity"] = json!("None");
                }
                if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
                    for p in ports.iter_mut().filter(|p| p.is_object()) {
                        if p["protocol"].is_null() {
                            p["protocol"] = json!("TCP");
                        }
                        if p["targetPort"].is_null() {
                            p["targetPort"] = p["port"].clone();
                        }
                        if (ty == "NodePort" || ty == "LoadBalancer") && p["nodePort"].is_null() {
                            p["nodePort"] = json!(st.allocate_node_port());
                        }
                    }
                }
            }
        }
        "Namespace" => {
            let n = name(obj).to_string();
            set_path(
                obj,
                &["metadata", "labels", "kubernetes.io/metadata.name"],
                json!(n),
            );
        }
        "Secret" => strategy::fold_string_data(obj),
        _ => {}
    }
    Ok(())
}

fn parse_rv(info: &ResourceInfo, obj: &Value) -> ApiResult<Option<u64>> {
    match obj["metadata"]["resourceVersion"].as_str() {
        None | Some("") => Ok(None),
        Some(s) => s.parse().map(Some).map_err(|_| {
            ApiError::invalid(
                info,
                name(obj),
                vec![Cause::invalid(
                    "metadata.resourceVersion",
                    &json!(s),
                    "must be a valid resource version",
                )],
            )
        }),
    }
}

fn detached(value: Value) -> ApiResult<Arc<Obj>> {
    Obj::detached(value).map(Arc::new)
}

pub fn create(
    st: &State,
    info: &ResourceInfo,
    ns: &str,
    mut body: Value,
    opts: &WriteOptions,
) -> ApiResult<Arc<Obj>> {
    strategy::check_type(info, &mut body)?;
    scope_namespace(info, ns, &mut body)?;
    let generate = body["metadata"]["generateName"]
        .as_str()
        .filter(|_| name(&body).is_empty())
        .map(str::to_string);
    check_namespace(st, info, ns, name(&body))?;
    // The storage layer refuses this with a plain error, which the real server reports as a 500.
    if body["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse::<u64>().ok())
        .is_some_and(|rv| rv != 0)
    {
        return Err(ApiError {
            code: 500,
            reason: "",
            message: "resourceVersion should not be set on objects to be created".into(),
            details: None,
        });
    }
    admit_create(st, info, &mut body)?;
    let table = st.table(info);
    for attempt in 0..8 {
        let mut obj = body.clone();
        if let Some(prefix) = &generate {
            let prefix: String = prefix.chars().take(58).collect();
            set_path(
                &mut obj,
                &["metadata", "name"],
                json!(format!("{prefix}{}", meta::random_suffix(5))),
            );
        }
        strategy::prepare_create(info, &mut obj, &now_time());
        strategy::validate(info, &obj, None)?;
        if opts.dry_run {
            return detached(obj);
        }
        let k = key(info, ns, name(&obj));
        let out = table.mutate(&k, |cur| {
            if cur.is_some() {
                Err(ApiError::already_exists(info, &k.1))
            } else {
                Ok(Mutation::Put(obj))
            }
        });
        match out {
            Ok(Outcome::Created(o)) => {
                after_create(st, info, &o);
                return Ok(o);
            }
            Ok(other) => {
                return other
                    .object()
                    .cloned()
                    .ok_or_else(|| ApiError::internal("create produced nothing"));
            }
            Err(e) if e.reason == "AlreadyExists" && generate.is_some() && attempt < 7 => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::internal("could not generate a unique name"))
}

/// Side effects of creations that the real control plane performs right away.
fn after_create(st: &State, info: &ResourceInfo, obj: &Arc<Obj>) {
    if info.custom {
        return;
    }
    match info.kind.as_str() {
        "Namespace" => ensure_namespace_defaults(st, obj.name()),
        "CustomResourceDefinition" => establish_crd(st, &obj.value()),
        _ => {}
    }
}

/// The `default` ServiceAccount and the `kube-root-ca.crt` ConfigMap every namespace holds.
pub fn ensure_namespace_defaults(st: &State, ns: &str) {
    let sa = st.core("serviceaccounts");
    if st
        .table(&sa)
        .get(&(ns.to_string(), "default".into()))
        .is_none()
    {
        let body =
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}});
        if let Err(e) = create(st, &sa, ns, body, &WriteOptions::default())
            && e.reason != "AlreadyExists"
        {
            tracing::debug!(ns, error = %e, "creating the default service account");
        }
    }
    let cm = st.core("configmaps");
    if st
        .table(&cm)
        .get(&(ns.to_string(), "kube-root-ca.crt".into()))
        .is_none()
    {
        let body = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kube-root-ca.crt", "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
            "data": {"ca.crt": st.ca_pem},
        });
        if let Err(e) = create(st, &cm, ns, body, &WriteOptions::default())
            && e.reason != "AlreadyExists"
        {
            tracing::debug!(ns, error = %e, "creating kube-root-ca.crt");
        }
    }
}

/// Registers the CRD's resources and reports it Established (the apiextensions controllers).
pub fn establish_crd(st: &State, crd: &Value) {
    let entries = super::resources::crd_entries(crd);
    let group = crd["spec"]["group"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let plural = crd["spec"]["names"]["plural"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if st.resources.is_builtin(&group, &plural) {
        tracing::warn!(%group, %plural, "CRD would shadow a built-in resource; not served");
        return;
    }
    st.resources.set_custom(&group, &plural, entries);
    let info = match st
        .resources
        .lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    {
        Some(i) => i,
        None => return,
    };
    let crd_name = name(crd).to_string();
    let status = strategy::established_crd_status(crd, &now_time());
    let res = st
        .table(&info)
        .mutate(&(String::new(), crd_name.clone()), |cur| {
            let Some(cur) = cur else {
                return Ok(Mutation::Unchanged);
            };
            let mut v = cur.value();
            v["status"] = status;
            Ok(Mutation::Put(v))
        });
    if let Err(e) = res {
        tracing::warn!(crd = %crd_name, error = %e, "setting CRD status");
    }
}

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
            strategy::validate(info, &obj, None)?;
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
        strategy::validate(info, &new, Some(&old))?;
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
        return super::apply::apply(st, info, ns, url_name, body, opts);
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
        strategy::validate(info, &v, Some(&old))?;
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
                strategy::validate(info, &v, None)?;
            }
            Some(cur) => {
                let old = cur.value();
                strategy::prepare_update(info, &old, &mut v, sub);
                strategy::validate(info, &v, Some(&old))?;
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
            Some("Foreground") => Some(super::gc::FOREGROUND),
            Some("Orphan") => Some(super::gc::ORPHAN),
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

fn after_remove(st: &State, info: &ResourceInfo, obj: &Arc<Obj>) {
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

/// POST serviceaccounts/<name>/token: a TokenRequest answered with a signed token.
pub fn create_token(st: &State, ns: &str, sa_name: &str, mut body: Value) -> ApiResult<Value> {
    let sainfo = st.core("serviceaccounts");
    let sa = get(st, &sainfo, ns, sa_name)?;
    if !body.is_object() {
        return Err(ApiError::bad_request("TokenRequest must be a JSON object"));
    }
    let tr_info = token_request_info();
    let expiration = match &body["spec"]["expirationSeconds"] {
        Value::Null => 3600,
        v => v
            .as_i64()
            .ok_or_else(|| ApiError::bad_request("spec.expirationSeconds must be an integer"))?,
    };
    if expiration < 600 {
        return Err(ApiError::invalid(
            &tr_info,
            sa_name,
            vec![Cause::invalid(
                "spec.expirationSeconds",
                &json!(expiration),
                "may not specify a duration less than 10 minutes",
            )],
        ));
    }
    if expiration > 1 << 32 {
        return Err(ApiError::invalid(
            &tr_info,
            sa_name,
            vec![Cause::invalid(
                "spec.expirationSeconds",
                &json!(expiration),
                "may not specify a duration larger than 2^32 seconds",
            )],
        ));
    }
    let audiences: Vec<String> = match body["spec"]["audiences"].as_array() {
        Some(a) if !a.is_empty() => a
            .iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect(),
        _ => vec![ISSUER.to_string()],
    };
    let mut bound = None;
    let bref = body["spec"]["boundObjectRef"].clone();
    if bref.is_object() {
        let kind = bref["kind"].as_str().unwrap_or_default();
        let plural = match kind {
            "Pod" => "pods",
            "Secret" => "secrets",
            "Node" => "nodes",
            other => {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token for serviceaccount {sa_name:?} to object of kind {other:?}"
                )));
            }
        };
        let info = st.core(plural);
        let bname = bref["name"].as_str().unwrap_or_default();
        let obj = get(st, &info, ns, bname)?;
        if let Some(uid) = bref["uid"].as_str()
            && !uid.is_empty()
            && uid != obj.uid()
        {
            return Err(ApiError::conflict(
                &info,
                bname,
                &format!(
                    "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
                ),
            ));
        }
        bound = Some(json!({"kind": kind, "name": bname, "uid": obj.uid()}));
        body["spec"]["boundObjectRef"]["uid"] = json!(obj.uid());
    }
    let issued = now();
    let expires = issued
        .checked_add(time::Duration::seconds(expiration))
        .ok_or_else(|| ApiError::bad_request("spec.expirationSeconds is too large"))?;
    let token = st.tokens.issue(&TokenClaims {
        namespace: ns,
        service_account: sa_name,
        sa_uid: sa.uid(),
        audiences: &audiences,
        issued_at: issued.unix_timestamp(),
        expires_at: expires.unix_timestamp(),
        bound,
    });
    body["apiVersion"] = json!("authentication.k8s.io/v1");
    body["kind"] = json!("TokenRequest");
    body["metadata"] = json!({"name": sa_name, "namespace": ns, "creationTimestamp": null});
    set_path(&mut body, &["spec", "audiences"], json!(audiences));
    set_path(&mut body, &["spec", "expirationSeconds"], json!(expiration));
    if body["spec"]["boundObjectRef"].is_null() {
        set_path(&mut body, &["spec", "boundObjectRef"], Value::Null);
    }
    body["status"] = json!({"token": token, "expirationTimestamp": meta::format_time(expires)});
    Ok(body)
}

fn token_request_info() -> ResourceInfo {
    ResourceInfo {
        group: "authentication.k8s.io".into(),
        version: "v1".into(),
        plural: "tokenrequests".into(),
        singular: "tokenrequest".into(),
        kind: "TokenRequest".into(),
        namespaced: true,
        short_names: vec![],
        categories: vec![],
        subresources: vec![],
        custom: false,
        printer_columns: vec![],
        returns_deleted_object: false,
        allow_create_on_update: false,
        allow_unconditional_update: true,
        tracks_generation: false,
        name_rule: super::resources::NameRule::Subdomain,
        selectable_fields: vec![],
        schema: None,
    }
}

/// POST pods/<name>/binding: what a scheduler does.
pub fn bind_pod(st: &State, ns: &str, pod_name: &str, body: &Value) -> ApiResult<Value> {
    let info = st.core("pods");
    let node = body["target"]["name"]
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(&info, pod_name, vec![Cause::required("target.name", "")])
        })?;
    let table = st.table(&info);
    table.mutate(&(ns.to_string(), pod_name.to_string()), |cur| {
        let Some(cur) = cur else {
            return Err(ApiError::not_found(&info, pod_name));
        };
        if let Some(existing) = cur.value()["spec"]["nodeName"]
            .as_str()
            .filter(|s| !s.is_empty())
        {
            return Err(ApiError::conflict(
                &info,
                pod_name,
                &format!("pod {pod_name} is already assigned to node {existing:?}"),
            ));
        }
        if cur.deleting() {
            return Err(ApiError::conflict(
                &info,
                pod_name,
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        let mut v = cur.value();
        set_path(&mut v, &["spec", "nodeName"], json!(node));
        Ok(Mutation::Put(v))
    })?;
    Ok(
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    )
}
