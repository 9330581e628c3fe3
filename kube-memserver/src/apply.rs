//! Server-side apply (`application/apply-patch+yaml`), simplified: the applied configuration is
//! merged into the live object (strategic merge for built-in kinds, JSON merge for custom
//! resources), fields the same manager applied before and no longer applies are removed, and the
//! manager's set of fields is recorded in `metadata.managedFields` (FieldsV1). Conflicts with other
//! managers are not detected: every apply behaves as if `force=true`.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::meta::now_time;
use super::patch;
use super::resources::ResourceInfo;
use super::state::State;
use super::status::{ApiError, ApiResult, Cause};
use super::store::Obj;
use super::verbs::{WriteOptions, put_computed};

pub fn apply(
    st: &State,
    info: &ResourceInfo,
    ns: &str,
    url_name: &str,
    body: &[u8],
    opts: &WriteOptions,
) -> ApiResult<(Arc<Obj>, bool)> {
    let manager = opts
        .field_manager
        .clone()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError {
            code: 422,
            reason: "Invalid",
            message: "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch".into(),
            details: None,
        })?;
    let text =
        std::str::from_utf8(body).map_err(|_| ApiError::bad_request("apply patch is not UTF-8"))?;
    let applied: Value = serde_json::from_str(text)
        .or_else(|_| serde_saphyr::from_str::<Value>(text))
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    if !applied.is_object() {
        return Err(ApiError::bad_request("apply patch must be an object"));
    }
    for f in ["apiVersion", "kind"] {
        if applied[f].as_str().is_none_or(str::is_empty) {
            return Err(ApiError::bad_request(format!(
                "{f} must be set in an apply patch"
            )));
        }
    }
    if applied["kind"].as_str() != Some(info.kind.as_str()) {
        return Err(ApiError::bad_request(format!(
            "the kind in the apply patch ({}) does not match the endpoint ({})",
            applied["kind"], info.kind
        )));
    }
    match applied["metadata"]["name"].as_str() {
        Some(n) if n == url_name => {}
        Some(n) if !n.is_empty() => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({url_name})"
            )));
        }
        _ => {
            return Err(ApiError::invalid(
                info,
                url_name,
                vec![Cause::required("metadata.name", "")],
            ));
        }
    }
    let fields = fields_v1(&info.kind, &mut Vec::new(), &applied);
    let api_version = info.api_version();
    let sub = opts.subresource.clone();
    let compute = move |cur: Option<&Value>| -> ApiResult<Value> {
        let mut obj = match cur {
            None => json!({}),
            Some(c) => c.clone(),
        };
        if let Some(c) = cur {
            let previous = c["metadata"]["managedFields"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| {
                    e["manager"].as_str() == Some(manager.as_str()) && e["operation"] == "Apply"
                })
                .map(|e| e["fieldsV1"].clone());
            if let Some(prev) = previous {
                remove_dropped(&mut obj, &prev, &fields);
            }
        }
        let mut to_merge = applied.clone();
        if let Some(Value::Object(md)) = to_merge.get_mut("metadata") {
            md.remove("managedFields");
            md.remove("resourceVersion");
        }
        if info.custom {
            patch::merge_patch(&mut obj, &to_merge);
        } else {
            patch::strategic_merge_patch(&info.kind, &mut obj, &to_merge)?;
        }
        let mut managed: Vec<Value> = obj["metadata"]["managedFields"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| {
                !(e["manager"].as_str() == Some(manager.as_str()) && e["operation"] == "Apply")
            })
            .collect();
        let mut entry = json!({
            "manager": manager,
            "operation": "Apply",
            "apiVersion": api_version,
            "time": now_time(),
            "fieldsType": "FieldsV1",
            "fieldsV1": fields,
        });
        if let Some(s) = &sub {
            entry["subresource"] = json!(s);
        }
        managed.push(entry);
        super::meta::set_path(
            &mut obj,
            &["metadata", "managedFields"],
            Value::Array(managed),
        );
        Ok(obj)
    };
    put_computed(st, info, ns, url_name, compute, opts)
}

fn merge_key_of(kind: &str, path: &[String]) -> Option<&'static str> {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    match (kind, p.as_slice()) {
        (
            "Pod",
            [
                "spec",
                "containers"
                | "initContainers"
                | "ephemeralContainers"
                | "volumes"
                | "imagePullSecrets",
            ],
        ) => Some("name"),
        ("Pod", ["spec", "containers" | "initContainers", "env"]) => Some("name"),
        ("Pod", ["spec", "containers" | "initContainers", "ports"]) => Some("containerPort"),
        ("Pod", ["spec", "containers" | "initContainers", "volumeMounts"]) => Some("mountPath"),
        (_, ["status", "conditions"]) => Some("type"),
        (_, ["metadata", "ownerReferences"]) => Some("uid"),
        ("Service", ["spec", "ports"]) => Some("port"),
        ("Node", ["status", "addresses"]) => Some("type"),
        _ => None,
    }
}

/// The FieldsV1 set of an applied configuration (`f:<field>`, `k:{...}` for keyed list items).
fn fields_v1(kind: &str, path: &mut Vec<String>, v: &Value) -> Value {
    let mut out = Map::new();
    let Value::Object(m) = v else {
        return Value::Object(out);
    };
    for (k, child) in m {
        if path.is_empty() && (k == "apiVersion" || k == "kind") {
            continue;
        }
        if path.len() == 1
            && path[0] == "metadata"
            && !matches!(
                k.as_str(),
                "labels" | "annotations" | "finalizers" | "ownerReferences"
            )
        {
            continue;
        }
        path.push(k.clone());
        let sub = match child {
            Value::Object(_) => fields_v1(kind, path, child),
            Value::Array(items) => match merge_key_of(kind, path) {
                Some(key) => {
                    let mut lm = Map::new();
                    for item in items {
                        if let Some(kv) = item.get(key) {
                            let mut inner = match fields_v1(kind, path, item) {
                                Value::Object(x) => x,
                                _ => Map::new(),
                            };
                            inner.insert(".".into(), json!({}));
                            lm.insert(format!("k:{}", json!({ key: kv })), Value::Object(inner));
                        }
                    }
                    Value::Object(lm)
                }
                None => json!({}),
            },
            _ => json!({}),
        };
        path.pop();
        out.insert(format!("f:{k}"), sub);
    }
    Value::Object(out)
}

/// Removes from `obj` the fields in `prev` that are absent from `now`.
fn remove_dropped(obj: &mut Value, prev: &Value, now: &Value) {
    let (Value::Object(p), Some(o)) = (prev, obj.as_object_mut()) else {
        return;
    };
    for (k, pchild) in p {
        let now_child = now.get(k);
        if let Some(field) = k.strip_prefix("f:") {
            match now_child {
                None => {
                    o.remove(field);
                }
                Some(nc) => {
                    if let Some(child) = o.get_mut(field) {
                        match child {
                            Value::Array(items) => remove_dropped_items(items, pchild, nc),
                            _ => remove_dropped(child, pchild, nc),
                        }
                    }
                }
            }
        }
    }
}

fn remove_dropped_items(items: &mut Vec<Value>, prev: &Value, now: &Value) {
    let Value::Object(p) = prev else { return };
    for (k, pchild) in p {
        let Some(key_json) = k.strip_prefix("k:") else {
            continue;
        };
        let Ok(Value::Object(keymap)) = serde_json::from_str::<Value>(key_json) else {
            continue;
        };
        let matches = |item: &Value| keymap.iter().all(|(kk, kv)| item.get(kk) == Some(kv));
        match now.get(k) {
            None => items.retain(|i| !matches(i)),
            Some(nc) => {
                for item in items.iter_mut().filter(|i| matches(i)) {
                    remove_dropped(item, pchild, nc);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_v1_keys_lists_by_merge_key() {
        let f = fields_v1(
            "Pod",
            &mut Vec::new(),
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b"}},
                    "spec": {"containers": [{"name": "c", "image": "i"}]}}),
        );
        assert_eq!(f["f:metadata"]["f:labels"]["f:a"], json!({}));
        assert!(f["f:metadata"].get("f:name").is_none());
        assert_eq!(
            f["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"]["f:image"],
            json!({})
        );
    }

    #[test]
    fn fields_dropped_from_the_applied_config_are_removed() {
        let prev = json!({"f:data": {"f:a": {}, "f:b": {}}});
        let now = json!({"f:data": {"f:a": {}}});
        let mut obj = json!({"data": {"a": "1", "b": "2", "c": "3"}});
        remove_dropped(&mut obj, &prev, &now);
        assert_eq!(obj, json!({"data": {"a": "1", "c": "3"}}));
    }
}
