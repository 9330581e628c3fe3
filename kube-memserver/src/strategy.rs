//! Per-kind rules, like the real registry strategies: what create fills in (defaults, status
//! reset), what an update may change (status isolation, immutable fields), validation.

use serde_json::{Value, json};

use super::meta::{name, remove_path, set_path};
use super::resources::ResourceInfo;
use super::status::{ApiError, ApiResult, Cause};
use super::validation::{is_dns1123_label, validate_meta};

/// Metadata fields the server owns: an update keeps the stored values.
const SYSTEM_META: &[&str] = &[
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "selfLink",
];

/// Checks `apiVersion`/`kind` of a request body against the endpoint and fills them if absent.
pub fn check_type(info: &ResourceInfo, obj: &mut Value) -> ApiResult<()> {
    let Value::Object(map) = obj else {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): expected a JSON object",
            info.kind
        )));
    };
    let expected_av = info.api_version();
    match map.get("kind") {
        None | Some(Value::Null) => {
            map.insert("kind".into(), Value::String(info.kind.clone()));
        }
        Some(Value::String(k)) if *k == info.kind => {}
        Some(Value::String(k)) if k.is_empty() => {
            map.insert("kind".into(), Value::String(info.kind.clone()));
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {}): kind {other} does not match",
                info.kind
            )));
        }
    }
    match map.get("apiVersion") {
        None | Some(Value::Null) => {
            map.insert("apiVersion".into(), Value::String(expected_av));
        }
        Some(Value::String(av)) if av.is_empty() => {
            map.insert("apiVersion".into(), Value::String(expected_av));
        }
        Some(Value::String(av)) => {
            let group_of = |s: &str| {
                s.rsplit_once('/')
                    .map(|(g, _)| g.to_string())
                    .unwrap_or_default()
            };
            if group_of(av) != info.group {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({expected_av})"
                )));
            }
            // Versions of one group share storage (conversion strategy None).
            map.insert("apiVersion".into(), Value::String(expected_av));
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "apiVersion must be a string, got {other}"
            )));
        }
    }
    match map.get("metadata") {
        None | Some(Value::Null) => {
            map.insert("metadata".into(), json!({}));
        }
        Some(Value::Object(_)) => {}
        Some(_) => {
            return Err(ApiError::bad_request(
                "json: cannot unmarshal metadata: must be an object",
            ));
        }
    }
    if info.kind == "Pod" && !info.custom {
        convert_pod_ips(obj);
    }
    Ok(())
}

/// What decoding a v1 Pod into the server's internal form and back does to the IP fields:
/// `podIP` wins over a `podIPs` whose first entry differs (or fills an empty `podIPs`), and
/// `podIP` is `podIPs[0]` afterwards; an empty `hostIPs` is filled from `hostIP`.
fn convert_pod_ips(pod: &mut Value) {
    let Some(status) = pod.get_mut("status").and_then(Value::as_object_mut) else {
        return;
    };
    let first = |list: Option<&Value>| {
        list.and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(|e| e.get("ip"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let empty = |list: Option<&Value>| list.and_then(Value::as_array).is_none_or(Vec::is_empty);
    if let Some(ip) = status
        .get("podIP")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        let ip = ip.to_string();
        if empty(status.get("podIPs")) || first(status.get("podIPs")).as_deref() != Some(&ip) {
            status.insert("podIPs".into(), json!([{"ip": ip}]));
        }
    }
    match first(status.get("podIPs")) {
        Some(ip) => {
            status.insert("podIP".into(), json!(ip));
        }
        None => {
            status.remove("podIP");
        }
    }
    if let Some(ip) = status
        .get("hostIP")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        && empty(status.get("hostIPs"))
    {
        let ip = ip.to_string();
        status.insert("hostIPs".into(), json!([{"ip": ip}]));
    }
}

/// Fills what the server sets on create. `ns` is the request namespace (namespaced kinds).
pub fn prepare_create(info: &ResourceInfo, obj: &mut Value, now: &str) {
    set_path(obj, &["metadata", "uid"], json!(super::meta::new_uid()));
    set_path(obj, &["metadata", "creationTimestamp"], json!(now));
    for f in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
        "selfLink",
    ] {
        remove_path(obj, &["metadata", f]);
    }
    if info.tracks_generation {
        set_path(obj, &["metadata", "generation"], json!(1));
    } else {
        remove_path(obj, &["metadata", "generation"]);
    }
    if info.has_status() && info.kind != "Node" {
        remove_path(obj, &["status"]);
    }
    default_kind(info, obj);
    if !info.custom {
        strip_nulls(obj);
    }
    apply_schema(info, obj);
}

/// Custom resources: prune unknown fields and fill defaults from the CRD's schema.
fn apply_schema(info: &ResourceInfo, obj: &mut Value) {
    if let Some(schema) = &info.schema {
        super::schema::prune(obj, schema);
        super::schema::apply_defaults(obj, schema);
    }
}

/// Typed (built-in) objects cannot hold JSON nulls: decoding into Go structs drops them.
pub fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// Kind-specific defaults (the scheme defaulters).
fn default_kind(info: &ResourceInfo, obj: &mut Value) {
    if info.custom {
        return;
    }
    match info.kind.as_str() {
        "Pod" => default_pod(obj),
        k if crate::workloads::strategy::is_workload(k) => {
            crate::workloads::strategy::default_workload(k, obj, true)
        }
        "Namespace" => {
            if obj["spec"]["finalizers"].is_null() {
                set_path(obj, &["spec", "finalizers"], json!(["kubernetes"]));
            }
            set_path(obj, &["status", "phase"], json!("Active"));
        }
        crate::certificates::KIND => crate::certificates::default_status(obj),
        "Secret" if obj["type"].as_str().is_none_or(str::is_empty) => {
            obj["type"] = json!("Opaque");
        }
        "PersistentVolume" => {
            if obj["spec"]["persistentVolumeReclaimPolicy"].is_null() {
                set_path(
                    obj,
                    &["spec", "persistentVolumeReclaimPolicy"],
                    json!("Retain"),
                );
            }
            if obj["spec"]["volumeMode"].is_null() {
                set_path(obj, &["spec", "volumeMode"], json!("Filesystem"));
            }
            set_path(obj, &["status", "phase"], json!("Pending"));
        }
        "PersistentVolumeClaim" => {
            if obj["spec"]["volumeMode"].is_null() {
                set_path(obj, &["spec", "volumeMode"], json!("Filesystem"));
            }
            set_path(obj, &["status", "phase"], json!("Pending"));
        }
        "Service" if !obj["status"].is_object() => {
            set_path(obj, &["status", "loadBalancer"], json!({}));
        }
        "CustomResourceDefinition" => {
            if obj["spec"]["conversion"].is_null() {
                set_path(obj, &["spec", "conversion"], json!({"strategy": "None"}));
            }
            let kind = obj["spec"]["names"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if obj["spec"]["names"]["singular"]
                .as_str()
                .is_none_or(str::is_empty)
            {
                set_path(
                    obj,
                    &["spec", "names", "singular"],
                    json!(kind.to_lowercase()),
                );
            }
            if obj["spec"]["names"]["listKind"]
                .as_str()
                .is_none_or(str::is_empty)
            {
                set_path(
                    obj,
                    &["spec", "names", "listKind"],
                    json!(format!("{kind}List")),
                );
            }
        }
        _ => {}
    }
}

pub(crate) fn default_container(c: &mut Value) {
    if !c.is_object() {
        return;
    }
    if c["terminationMessagePath"].is_null() {
        c["terminationMessagePath"] = json!("/dev/termination-log");
    }
    if c["terminationMessagePolicy"].is_null() {
        c["terminationMessagePolicy"] = json!("File");
    }
    if c["imagePullPolicy"].is_null() {
        let image = c["image"].as_str().unwrap_or_default();
        let last = image.rsplit('/').next().unwrap_or_default();
        let tag = if image.contains('@') {
            Some("digest")
        } else {
            last.split_once(':').map(|(_, t)| t)
        };
        let policy = match tag {
            None | Some("latest") => "Always",
            Some(_) => "IfNotPresent",
        };
        c["imagePullPolicy"] = json!(policy);
    }
    if c["resources"].is_null() {
        c["resources"] = json!({});
    }
    if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            if p.is_object() && p["protocol"].is_null() {
                p["protocol"] = json!("TCP");
            }
        }
    }
}

fn default_pod(pod: &mut Value) {
    if !pod["spec"].is_object() {
        return;
    }
    let spec = &mut pod["spec"];
    let defaults = [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("securityContext", json!({})),
        ("schedulerName", json!("default-scheduler")),
        ("enableServiceLinks", json!(true)),
        ("preemptionPolicy", json!("PreemptLowerPriority")),
        ("priority", json!(0)),
    ];
    for (k, v) in defaults {
        if spec[k].is_null() {
            spec[k] = v;
        }
    }
    if spec["serviceAccountName"]
        .as_str()
        .is_none_or(str::is_empty)
    {
        let sa = spec["serviceAccount"]
            .as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or("default")
            .to_string();
        spec["serviceAccountName"] = json!(sa);
    }
    spec["serviceAccount"] = spec["serviceAccountName"].clone();
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
            cs.iter_mut().for_each(default_container);
        }
    }
    // DefaultTolerationSeconds admission.
    let mut tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let has = tolerations.iter().any(|t| {
            t["key"].as_str() == Some(key)
                && t["effect"]
                    .as_str()
                    .is_none_or(|e| e.is_empty() || e == "NoExecute")
        });
        if !has {
            tolerations.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
        }
    }
    spec["tolerations"] = Value::Array(tolerations);
    let qos = pod_qos(&pod["spec"]);
    set_path(
        pod,
        &["status"],
        json!({"phase": "Pending", "qosClass": qos}),
    );
}

/// QoS class from requests/limits (BestEffort, Burstable, Guaranteed).
fn pod_qos(spec: &Value) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    for list in ["containers", "initContainers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            let req = c["resources"]["requests"].as_object();
            let lim = c["resources"]["limits"].as_object();
            if req.is_some_and(|m| !m.is_empty()) || lim.is_some_and(|m| !m.is_empty()) {
                any = true;
            }
            for res in ["cpu", "memory"] {
                let l = lim.and_then(|m| m.get(res));
                let r = req.and_then(|m| m.get(res)).or(l);
                if l.is_none() || r != l {
                    guaranteed = false;
                }
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// Adds the projected service-account token volume (ServiceAccount admission).
pub fn add_service_account_volume(pod: &mut Value, automount: bool) {
    const MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
    if !pod["spec"].is_object() {
        return;
    }
    if pod["spec"]["automountServiceAccountToken"].as_bool() == Some(false)
        || (!automount && pod["spec"]["automountServiceAccountToken"].as_bool() != Some(true))
    {
        return;
    }
    let mounted = ["containers", "initContainers"].iter().any(|l| {
        pod["spec"][*l].as_array().into_iter().flatten().any(|c| {
            c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["mountPath"].as_str() == Some(MOUNT))
        })
    });
    if mounted {
        return;
    }
    let vol_name = format!("kube-api-access-{}", super::meta::random_suffix(5));
    let volume = json!({
        "name": vol_name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]
        }
    });
    let mut volumes = pod["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    volumes.push(volume);
    pod["spec"]["volumes"] = Value::Array(volumes);
    for list in ["containers", "initContainers"] {
        if let Some(cs) = pod
            .get_mut("spec")
            .and_then(|s| s.get_mut(list))
            .and_then(Value::as_array_mut)
        {
            for c in cs.iter_mut().filter(|c| c.is_object()) {
                let mut mounts = c["volumeMounts"].as_array().cloned().unwrap_or_default();
                mounts.push(json!({"name": vol_name, "readOnly": true, "mountPath": MOUNT}));
                c["volumeMounts"] = Value::Array(mounts);
            }
        }
    }
}

/// Carries server-owned state from `old` into an update, isolating status and spec as the
/// real strategies do. `subresource` is `Some("status")` for status writes.
pub fn prepare_update(
    info: &ResourceInfo,
    old: &Value,
    new: &mut Value,
    subresource: Option<&str>,
) {
    if info.kind == crate::certificates::KIND && !info.custom {
        crate::certificates::prepare_update(old, new, subresource);
    } else if subresource == Some("status") {
        let status = new.get("status").cloned();
        let new_meta = new["metadata"].clone();
        let mut merged = old.clone();
        match status {
            Some(s) => merged["status"] = s,
            None => remove_path(&mut merged, &["status"]),
        }
        merged["metadata"] = new_meta;
        let reset: &[&str] = if info.custom || info.kind == "CustomResourceDefinition" {
            &["labels", "annotations", "finalizers", "ownerReferences"]
        } else if info.kind == "Pod" {
            &["ownerReferences"]
        } else {
            &[]
        };
        for f in reset {
            copy_meta_field(old, &mut merged, f);
        }
        *new = merged;
    } else if info.has_status() {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => remove_path(new, &["status"]),
        }
        if info.kind == "Namespace" {
            set_path(
                new,
                &["spec", "finalizers"],
                old["spec"]["finalizers"].clone(),
            );
        }
    }
    if subresource == Some("finalize") {
        let finalizers = new["spec"]["finalizers"].clone();
        let mut merged = old.clone();
        set_path(&mut merged, &["spec", "finalizers"], finalizers);
        *new = merged;
    }
    for f in SYSTEM_META {
        copy_meta_field(old, new, f);
    }
    if info.kind == "Service" && subresource.is_none() {
        // Allocated values survive an update that omits them.
        for f in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            if new["spec"][f].is_null() && !old["spec"][f].is_null() && new["spec"].is_object() {
                new["spec"][f] = old["spec"][f].clone();
            }
        }
    }
    if info.kind == "Namespace" {
        set_path(
            new,
            &["metadata", "labels", "kubernetes.io/metadata.name"],
            json!(name(old)),
        );
    }
    if info.kind == "Secret" {
        fold_string_data(new);
    }
    if !info.custom {
        strip_nulls(new);
        if subresource.is_none() && crate::workloads::strategy::is_workload(&info.kind) {
            crate::workloads::strategy::default_workload(&info.kind, new, false);
        }
    }
    apply_schema(info, new);
    if info.tracks_generation && subresource.is_none() {
        let strip = |v: &Value| {
            let mut v = v.clone();
            if let Value::Object(m) = &mut v {
                m.remove("metadata");
                if info.has_status() {
                    m.remove("status");
                }
            }
            v
        };
        if strip(old) != strip(new) {
            let g = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
            set_path(new, &["metadata", "generation"], json!(g));
        }
    }
}

fn copy_meta_field(from: &Value, to: &mut Value, field: &str) {
    match from["metadata"].get(field) {
        Some(v) => set_path(to, &["metadata", field], v.clone()),
        None => remove_path(to, &["metadata", field]),
    }
}

/// `stringData` is write-only: folded into `data` (base64) on every write.
pub fn fold_string_data(secret: &mut Value) {
    use base64::Engine;
    let Some(Value::Object(sd)) = secret.as_object_mut().and_then(|m| m.remove("stringData"))
    else {
        return;
    };
    for (k, v) in sd {
        if let Some(s) = v.as_str() {
            let enc = base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
            set_path(secret, &["data", &k], json!(enc));
        }
    }
}

/// Validation on create and update (`old` set for updates).
/// `subresource` is the write's (`status`, `approval`…), None on create and main updates.
pub fn validate(
    info: &ResourceInfo,
    obj: &Value,
    old: Option<&Value>,
    subresource: Option<&str>,
) -> ApiResult<()> {
    let mut causes = validate_meta(info, obj);
    if info.custom
        && let Some(schema) = &info.schema
    {
        causes.extend(super::schema::validate(obj, schema));
    }
    if !info.custom {
        match info.kind.as_str() {
            "Pod" => causes.extend(validate_pod(obj, old)),
            "ConfigMap" => causes.extend(validate_config_map(obj, old)),
            "Secret" => {
                validate_secret_data(obj)?;
                causes.extend(immutable_data(obj, old));
            }
            "Service" => causes.extend(validate_service(obj, old)),
            "CustomResourceDefinition" => causes.extend(validate_crd(obj, old)),
            crate::certificates::KIND => {
                causes.extend(crate::certificates::validate(obj, old, subresource)?)
            }
            k if crate::workloads::strategy::is_workload(k) => {
                causes.extend(crate::workloads::strategy::validate_workload(k, obj, old))
            }
            "Lease" => {
                if let Some(d) = obj["spec"]["leaseDurationSeconds"].as_i64()
                    && d <= 0
                {
                    causes.push(Cause::invalid(
                        "spec.leaseDurationSeconds",
                        &json!(d),
                        "must be greater than 0",
                    ));
                }
            }
            _ => {}
        }
    }
    if let Some(old) = old {
        // No new finalizers once deletion has started.
        if !old["metadata"]["deletionTimestamp"].is_null() {
            let old_f: Vec<&Value> = old["metadata"]["finalizers"]
                .as_array()
                .map(|a| a.iter().collect())
                .unwrap_or_default();
            for f in obj["metadata"]["finalizers"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if !old_f.contains(&f) {
                    causes.push(Cause::forbidden(
                        "metadata.finalizers",
                        &format!("no new finalizers can be added if the object is being deleted, found new finalizers {f}"),
                    ));
                }
            }
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(info, name(obj), causes))
    }
}

fn validate_pod(pod: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let spec = &pod["spec"];
    match spec["containers"].as_array() {
        Some(cs) if !cs.is_empty() => {
            let mut seen = Vec::new();
            for (i, c) in cs.iter().enumerate() {
                let field = format!("spec.containers[{i}]");
                match c["name"].as_str() {
                    Some(n) if is_dns1123_label(n) => {
                        if seen.contains(&n) {
                            causes.push(Cause::duplicate(format!("{field}.name"), &c["name"]));
                        }
                        seen.push(n);
                    }
                    Some(n) if !n.is_empty() => causes.push(Cause::invalid(
                        format!("{field}.name"),
                        &c["name"],
                        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
                    )),
                    _ => causes.push(Cause::required(format!("{field}.name"), "")),
                }
                if c["image"].as_str().is_none_or(str::is_empty) && old.is_none() {
                    causes.push(Cause::required(format!("{field}.image"), ""));
                }
            }
        }
        _ => causes.push(Cause::required("spec.containers", "")),
    }
    if let Some(p) = spec["restartPolicy"].as_str()
        && !["Always", "OnFailure", "Never"].contains(&p)
    {
        causes.push(Cause::not_supported(
            "spec.restartPolicy",
            &spec["restartPolicy"],
            &["Always", "OnFailure", "Never"],
        ));
    }
    if let Some(old) = old {
        causes.extend(validate_pod_ips(&pod["status"], &old["status"], "podIPs"));
        causes.extend(validate_pod_ips(&pod["status"], &old["status"], "hostIPs"));
        let normalize = |s: &Value| {
            let mut s = s.clone();
            for list in ["containers", "initContainers"] {
                if let Some(cs) = s.get_mut(list).and_then(Value::as_array_mut) {
                    for c in cs.iter_mut().filter(|c| c.is_object()) {
                        c["image"] = Value::Null;
                    }
                }
            }
            if let Value::Object(m) = &mut s {
                for f in [
                    "activeDeadlineSeconds",
                    "tolerations",
                    "terminationGracePeriodSeconds",
                    "schedulingGates",
                ] {
                    m.remove(f);
                }
            }
            s
        };
        if normalize(&old["spec"]) != normalize(spec) {
            causes.push(Cause::forbidden(
                "spec",
                "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
            ));
        }
    }
    causes
}

/// `validatePodIPs` / `validateHostIPs`: every new entry a valid IP, at most one per IP
/// family (two at most), no duplicates; `hostIPs[0]` is `hostIP`.
fn validate_pod_ips(status: &Value, old_status: &Value, list: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let Some(items) = status[list].as_array().filter(|a| !a.is_empty()) else {
        return causes;
    };
    let field = format!("status.{list}");
    let ips: Vec<String> = items
        .iter()
        .map(|e| e["ip"].as_str().unwrap_or_default().to_string())
        .collect();
    if list == "hostIPs" && status["hostIP"].as_str().unwrap_or_default() != ips[0] {
        causes.push(Cause::invalid(
            format!("{field}[0].ip"),
            &json!(ips[0]),
            "must be equal to `hostIP`",
        ));
    }
    let existing: Vec<&str> = old_status[list]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["ip"].as_str())
        .collect();
    let parsed: Vec<Option<std::net::IpAddr>> = ips.iter().map(|ip| ip.parse().ok()).collect();
    for (i, (ip, p)) in ips.iter().zip(&parsed).enumerate() {
        if p.is_none() && !existing.contains(&ip.as_str()) {
            causes.push(Cause::invalid(
                format!("{field}[{i}]"),
                &json!(ip),
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            ));
        }
    }
    if ips.len() > 1 {
        let v6 = parsed.iter().flatten().filter(|p| p.is_ipv6()).count();
        let v4 = parsed.iter().flatten().filter(|p| p.is_ipv4()).count();
        if ips.len() > 2 || v4 != 1 || v6 != 1 {
            let shown: Vec<String> = ips.iter().map(|ip| format!("{{IP:{ip:?}}}")).collect();
            causes.push(Cause::invalid_shown(
                &field,
                &format!("[{}]", shown.join(", ")),
                "may specify no more than one IP for each IP family",
            ));
        }
        for (i, ip) in ips.iter().enumerate() {
            if ips[..i].contains(ip) {
                causes.push(Cause::duplicate(
                    format!("{field}[{i}]"),
                    &json!({"ip": ip}),
                ));
            }
        }
    }
    causes
}

fn is_config_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 253
        && k != "."
        && k != ".."
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

fn immutable_data(obj: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    if let Some(old) = old
        && old["immutable"].as_bool() == Some(true)
    {
        for f in ["data", "binaryData"] {
            if old[f] != obj[f] {
                causes.push(Cause::forbidden(
                    f,
                    "field is immutable when `immutable` is set",
                ));
            }
        }
        if obj["immutable"].as_bool() != Some(true) {
            causes.push(Cause::forbidden(
                "immutable",
                "field is immutable when `immutable` is set",
            ));
        }
    }
    causes
}

fn validate_config_map(cm: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    for f in ["data", "binaryData"] {
        match &cm[f] {
            Value::Null => {}
            Value::Object(m) => {
                for (k, v) in m {
                    if !is_config_key(k) {
                        causes.push(Cause::invalid(
                            f.to_string(),
                            &json!(k),
                            "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
                        ));
                    }
                    if !v.is_string() {
                        causes.push(Cause::invalid(format!("{f}[{k}]"), v, "must be a string"));
                    }
                }
            }
            other => causes.push(Cause::invalid(f, other, "must be a map of strings")),
        }
    }
    causes.extend(immutable_data(cm, old));
    causes
}

fn validate_secret_data(secret: &Value) -> ApiResult<()> {
    use base64::Engine;
    match &secret["data"] {
        Value::Null => Ok(()),
        Value::Object(m) => {
            for (k, v) in m {
                let ok = v
                    .as_str()
                    .is_some_and(|s| base64::engine::general_purpose::STANDARD.decode(s).is_ok());
                if !ok {
                    return Err(ApiError::bad_request(format!(
                        "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data in data[{k}]"
                    )));
                }
            }
            Ok(())
        }
        _ => Err(ApiError::bad_request(
            "Secret in version \"v1\" cannot be handled as a Secret: data must be a map",
        )),
    }
}

fn validate_service(svc: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let spec = &svc["spec"];
    let ty = spec["type"].as_str().unwrap_or("ClusterIP");
    if !["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"].contains(&ty) {
        causes.push(Cause::not_supported(
            "spec.type",
            &spec["type"],
            &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
        ));
    }
    let headless = spec["clusterIP"].as_str() == Some("None");
    let ports = spec["ports"].as_array();
    if ty != "ExternalName" && !headless && ports.is_none_or(|p| p.is_empty()) {
        causes.push(Cause::required("spec.ports", ""));
    }
    for (i, p) in ports.into_iter().flatten().enumerate() {
        match p["port"].as_i64() {
            Some(n) if (1..=65535).contains(&n) => {}
            _ => causes.push(Cause::invalid(
                format!("spec.ports[{i}].port"),
                &p["port"],
                "must be between 1 and 65535, inclusive",
            )),
        }
    }
    if let Some(old) = old {
        let (o, n) = (&old["spec"]["clusterIP"], &spec["clusterIP"]);
        if !o.is_null()
            && o != n
            && old["spec"]["type"].as_str() != Some("ExternalName")
            && ty != "ExternalName"
        {
            causes.push(Cause::invalid(
                "spec.clusterIPs[0]",
                n,
                "may not change once set",
            ));
        }
    }
    causes
}

fn validate_crd(crd: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    let plural = spec["names"]["plural"].as_str().unwrap_or_default();
    if group.is_empty() {
        causes.push(Cause::required("spec.group", ""));
    } else if !group.contains('.') {
        causes.push(Cause::invalid(
            "spec.group",
            &spec["group"],
            "should be a domain with at least one dot",
        ));
    }
    if plural.is_empty() {
        causes.push(Cause::required("spec.names.plural", ""));
    }
    if spec["names"]["kind"].as_str().is_none_or(str::is_empty) {
        causes.push(Cause::required("spec.names.kind", ""));
    }
    if !group.is_empty() && !plural.is_empty() && name(crd) != format!("{plural}.{group}") {
        causes.push(Cause::invalid(
            "metadata.name",
            &json!(name(crd)),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    match spec["scope"].as_str() {
        Some("Namespaced") | Some("Cluster") => {}
        _ => causes.push(Cause::not_supported(
            "spec.scope",
            &spec["scope"],
            &["Cluster", "Namespaced"],
        )),
    }
    let versions = spec["versions"].as_array();
    match versions {
        Some(vs) if !vs.is_empty() => {
            let storage = vs
                .iter()
                .filter(|v| v["storage"].as_bool() == Some(true))
                .count();
            if storage != 1 {
                causes.push(Cause::invalid(
                    "spec.versions",
                    &json!(vs.iter().map(|v| v["name"].clone()).collect::<Vec<_>>()),
                    "must have exactly one version marked as storage version",
                ));
            }
        }
        _ => causes.push(Cause::invalid(
            "spec.versions",
            &spec["versions"],
            "must have exactly one version marked as storage version",
        )),
    }
    if let Some(old) = old {
        for f in ["group", "scope"] {
            if old["spec"][f] != spec[f] {
                causes.push(Cause::invalid(
                    format!("spec.{f}"),
                    &spec[f],
                    "field is immutable",
                ));
            }
        }
        if old["spec"]["names"]["plural"] != spec["names"]["plural"] {
            causes.push(Cause::invalid(
                "spec.names.plural",
                &spec["names"]["plural"],
                "field is immutable",
            ));
        }
    }
    causes
}

/// The status the CRD controller reports once the names are accepted.
pub fn established_crd_status(crd: &Value, now: &str) -> Value {
    let storage: Vec<Value> = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["storage"].as_bool() == Some(true))
        .map(|v| v["name"].clone())
        .collect();
    let mut stored = crd["status"]["storedVersions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for s in storage {
        if !stored.contains(&s) {
            stored.push(s);
        }
    }
    let cond = |ty: &str, reason: &str, msg: &str| {
        let previous = crd["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"].as_str() == Some(ty) && c["status"].as_str() == Some("True"))
            .and_then(|c| c["lastTransitionTime"].as_str())
            .unwrap_or(now)
            .to_string();
        json!({"type": ty, "status": "True", "lastTransitionTime": previous, "reason": reason, "message": msg})
    };
    json!({
        "conditions": [
            cond("NamesAccepted", "NoConflicts", "no conflicts found"),
            cond("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "acceptedNames": crd["spec"]["names"].clone(),
        "storedVersions": stored,
    })
}

#[cfg(test)]
mod tests;
