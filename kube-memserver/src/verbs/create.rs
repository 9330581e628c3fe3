//! create, with the admission the real server applies, and what the control plane does right
//! after a creation (namespace defaults, CRDs established).

use super::*;

/// Checks that the URL namespace and the body agree, and stamps the namespace in.
pub(super) fn scope_namespace(info: &ResourceInfo, ns: &str, obj: &mut Value) -> ApiResult<()> {
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
pub(super) fn check_namespace(
    st: &State,
    info: &ResourceInfo,
    ns: &str,
    obj_name: &str,
) -> ApiResult<()> {
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
pub(super) fn admit_create(st: &State, info: &ResourceInfo, obj: &mut Value) -> ApiResult<()> {
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

pub(super) fn parse_rv(info: &ResourceInfo, obj: &Value) -> ApiResult<Option<u64>> {
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

pub(super) fn detached(value: Value) -> ApiResult<Arc<Obj>> {
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
    if info.kind == crate::certificates::KIND && !info.custom {
        crate::certificates::prepare_create(&mut body, opts.user.as_deref());
    }
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
        strategy::validate(info, &obj, None, None)?;
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
pub(super) fn after_create(st: &State, info: &ResourceInfo, obj: &Arc<Obj>) {
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
    let entries = crate::resources::crd_entries(crd);
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
