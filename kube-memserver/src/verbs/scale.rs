//! The `scale` subresource of deployments, replicasets and statefulsets: an autoscaling/v1
//! `Scale` read from the object (`spec.replicas`, `status.replicas`, the selector as a
//! string), and writes of `spec.replicas` through it (PUT or PATCH), as `kubectl scale` does.

use super::*;

/// The object seen as an autoscaling/v1 Scale.
pub fn scale_of(obj: &Value) -> Value {
    let m = &obj["metadata"];
    let mut meta = json!({"name": m["name"], "namespace": m["namespace"], "uid": m["uid"],
        "resourceVersion": m["resourceVersion"], "creationTimestamp": m["creationTimestamp"]});
    strategy::strip_nulls(&mut meta);
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": meta,
        "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(0)},
        "status": {
            "replicas": obj["status"]["replicas"].as_i64().unwrap_or(0),
            "selector": crate::workloads::selector_string(&obj["spec"]["selector"]),
        },
    })
}

pub fn get_scale(st: &State, info: &ResourceInfo, ns: &str, name: &str) -> ApiResult<Value> {
    let obj = get(st, info, ns, name)?;
    Ok(scale_of(&obj.value()))
}

/// PUT (`body` a Scale) or PATCH (`patch` given) of the scale subresource.
pub fn write_scale(
    st: &State,
    info: &ResourceInfo,
    ns: &str,
    name: &str,
    body: Option<Value>,
    patch: Option<(PatchType, &[u8])>,
    opts: &WriteOptions,
) -> ApiResult<Value> {
    let cur = get(st, info, ns, name)?;
    let mut scale = scale_of(&cur.value());
    let scale_info = ResourceInfo {
        group: "autoscaling".into(),
        version: "v1".into(),
        kind: "Scale".into(),
        ..(*info).clone()
    };
    if let Some(b) = body {
        if !b.is_object() {
            return Err(ApiError::bad_request("Scale must be a JSON object"));
        }
        scale = b;
    }
    if let Some((ptype, bytes)) = patch {
        match ptype {
            PatchType::Json => patch::json_patch(&mut scale, bytes)?,
            PatchType::Apply => {
                return Err(ApiError::unsupported_patch(
                    "application/apply-patch+yaml",
                    &[
                        "application/json-patch+json",
                        "application/merge-patch+json",
                        "application/strategic-merge-patch+json",
                    ],
                ));
            }
            _ => {
                let p: Value = serde_json::from_slice(bytes)
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                if !p.is_object() {
                    return Err(ApiError::bad_request("patch must be a JSON object"));
                }
                patch::merge_patch(&mut scale, &p);
            }
        }
    }
    if !(scale["spec"].is_object() || scale["spec"].is_null()) {
        return Err(ApiError::bad_request(
            "error decoding Scale: spec must be an object",
        ));
    }
    let replicas = match &scale["spec"]["replicas"] {
        Value::Null => 0,
        v => v.as_i64().ok_or_else(|| {
            ApiError::invalid(
                &scale_info,
                name,
                vec![Cause::invalid("spec.replicas", v, "must be an integer")],
            )
        })?,
    };
    if replicas < 0 {
        return Err(ApiError::invalid(
            &scale_info,
            name,
            vec![Cause::invalid(
                "spec.replicas",
                &json!(replicas),
                "must be greater than or equal to 0",
            )],
        ));
    }
    let precondition = scale["metadata"]["resourceVersion"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    let mut obj = cur.value();
    match precondition {
        Some(rv) => set_path(&mut obj, &["metadata", "resourceVersion"], json!(rv)),
        None => meta::remove_path(&mut obj, &["metadata", "resourceVersion"]),
    }
    set_path(&mut obj, &["spec", "replicas"], json!(replicas));
    let (written, _) = update(st, info, ns, name, obj, opts)?;
    Ok(scale_of(&written.value()))
}
