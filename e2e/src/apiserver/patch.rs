//! Patch application: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge
//! patch for built-in kinds (lists merged by their `patchMergeKey`, `$patch`, `$retainKeys`,
//! `$setElementOrder/…` and `$deleteFromPrimitiveList/…` directives).

use serde_json::{Map, Value};

use super::status::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or_default().trim();
        match base {
            "application/json-patch+json" => Some(Self::Json),
            "application/merge-patch+json" => Some(Self::Merge),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// RFC 6902 JSON patch. Decoding problems are 400, application problems 422, as upstream.
pub fn json_patch(target: &mut Value, body: &[u8]) -> Result<(), ApiError> {
    let ops: json_patch::Patch = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("json: cannot unmarshal patch: {e}")))?;
    json_patch::patch(target, &ops).map_err(|e| ApiError::unprocessable(e.to_string()))
}

/// How a list field merges under strategic merge patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListStrategy {
    Replace,
    MergeKey(&'static str),
    MergePrimitive,
}

/// The `patchStrategy`/`patchMergeKey` tags of the Go types, for the kinds served here.
/// `path` holds field names from the object root (list indices skipped).
fn list_strategy(kind: &str, path: &[&str]) -> (ListStrategy, bool) {
    use ListStrategy::*;
    match path {
        ["metadata", "ownerReferences"] => return (MergeKey("uid"), false),
        ["metadata", "finalizers"] => return (MergePrimitive, false),
        _ => {}
    }
    if kind == "Pod" {
        let container_fields = |rest: &[&str]| -> (ListStrategy, bool) {
            match rest {
                ["ports"] => (MergeKey("containerPort"), false),
                ["env"] => (MergeKey("name"), false),
                ["volumeMounts"] => (MergeKey("mountPath"), false),
                ["volumeDevices"] => (MergeKey("devicePath"), false),
                _ => (Replace, false),
            }
        };
        return match path {
            ["spec", "volumes"] => (MergeKey("name"), true),
            [
                "spec",
                "containers" | "initContainers" | "ephemeralContainers",
            ] => (MergeKey("name"), false),
            [
                "spec",
                "containers" | "initContainers" | "ephemeralContainers",
                rest @ ..,
            ] => container_fields(rest),
            ["spec", "imagePullSecrets"] => (MergeKey("name"), false),
            ["spec", "hostAliases"] => (MergeKey("ip"), false),
            ["spec", "topologySpreadConstraints"] => (MergeKey("topologyKey"), false),
            ["spec", "schedulingGates"] => (MergeKey("name"), false),
            ["spec", "resourceClaims"] => (MergeKey("name"), true),
            ["status", "conditions"] => (MergeKey("type"), false),
            ["status", "podIPs" | "hostIPs"] => (MergeKey("ip"), false),
            ["status", "resourceClaimStatuses"] => (MergeKey("name"), true),
            _ => (Replace, false),
        };
    }
    match (kind, path) {
        ("Node", ["spec", "podCIDRs"]) => (MergePrimitive, false),
        ("Node", ["status", "conditions"]) => (MergeKey("type"), false),
        ("Node", ["status", "addresses"]) => (MergeKey("type"), false),
        ("Service", ["spec", "ports"]) => (MergeKey("port"), false),
        ("ServiceAccount", ["secrets"]) => (MergeKey("name"), false),
        (
            "Service" | "Namespace" | "PersistentVolumeClaim" | "PersistentVolume",
            ["status", "conditions"],
        ) => (MergeKey("type"), false),
        _ => (Replace, false),
    }
}

fn is_directive(k: &str) -> bool {
    k == "$patch"
        || k == "$retainKeys"
        || k.starts_with("$setElementOrder/")
        || k.starts_with("$deleteFromPrimitiveList/")
}

/// Removes patch directives and `null`s from a value that is being added wholesale.
fn clean(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, v)| !is_directive(k) && !v.is_null())
                .map(|(k, v)| (k.clone(), clean(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|v| {
                    !(v.is_object()
                        && v.get("$patch").is_some()
                        && v.as_object().is_some_and(|m| m.len() == 1))
                })
                .map(clean)
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Applies a strategic merge patch to an object of a built-in `kind`.
pub fn strategic_merge_patch(
    kind: &str,
    target: &mut Value,
    patch: &Value,
) -> Result<(), ApiError> {
    let Value::Object(p) = patch else {
        return Err(ApiError::bad_request(
            "strategic merge patch must be a JSON object",
        ));
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let mut path = Vec::new();
    if let Value::Object(t) = target {
        merge_map(kind, &mut path, t, p)?;
    }
    Ok(())
}

fn merge_map<'a>(
    kind: &str,
    path: &mut Vec<&'a str>,
    orig: &mut Map<String, Value>,
    patch: &'a Map<String, Value>,
) -> Result<(), ApiError> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *orig = match clean(&Value::Object(patch.clone())) {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            return Ok(());
        }
        Some("delete") => {
            orig.clear();
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown patch type: {other:?} in map"
            )));
        }
    }
    for (k, pv) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(del)) = (orig.get_mut(field), pv) {
                list.retain(|item| !del.contains(item));
            }
            continue;
        }
        if is_directive(k) {
            continue;
        }
        match pv {
            Value::Null => {
                orig.remove(k);
            }
            Value::Object(pm) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    orig.remove(k);
                    continue;
                }
                let entry = orig
                    .entry(k.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !entry.is_object() {
                    *entry = Value::Object(Map::new());
                }
                path.push(k.as_str());
                if let Value::Object(om) = entry {
                    merge_map(kind, path, om, pm)?;
                }
                path.pop();
            }
            Value::Array(pl) => {
                path.push(k.as_str());
                let (strategy, _) = list_strategy(kind, path);
                let result = match strategy {
                    ListStrategy::Replace => Ok(clean(pv)),
                    ListStrategy::MergePrimitive => {
                        let mut list = match orig.get(k) {
                            Some(Value::Array(a)) => a.clone(),
                            _ => Vec::new(),
                        };
                        for item in pl {
                            if !list.contains(item) {
                                list.push(item.clone());
                            }
                        }
                        Ok(Value::Array(list))
                    }
                    ListStrategy::MergeKey(key) => {
                        let mut list = match orig.remove(k) {
                            Some(Value::Array(a)) => a,
                            _ => Vec::new(),
                        };
                        merge_list(kind, path, &mut list, pl, key).map(|()| Value::Array(list))
                    }
                };
                path.pop();
                orig.insert(k.clone(), result?);
            }
            scalar => {
                orig.insert(k.clone(), scalar.clone());
            }
        }
    }
    // Ordering directives apply after the merge.
    for (k, order) in patch {
        if let (Some(field), Value::Array(order)) = (k.strip_prefix("$setElementOrder/"), order) {
            path.push(field);
            let (strategy, _) = list_strategy(kind, path);
            path.pop();
            if let Some(Value::Array(list)) = orig.get_mut(field) {
                reorder(list, order, strategy);
            }
        }
    }
    if let Some(Value::Array(keep)) = patch.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        orig.retain(|k, _| keep.contains(&k.as_str()));
    }
    Ok(())
}

fn merge_list<'a>(
    kind: &str,
    path: &mut Vec<&'a str>,
    orig: &mut Vec<Value>,
    patch: &'a [Value],
    key: &str,
) -> Result<(), ApiError> {
    // `{"$patch": "replace"}` as a list element replaces the whole list.
    if patch.iter().any(|i| {
        i.get("$patch").and_then(Value::as_str) == Some("replace")
            && i.as_object().is_some_and(|m| m.len() == 1)
    }) {
        *orig = patch
            .iter()
            .filter(|i| i.get("$patch").is_none())
            .map(clean)
            .collect();
        return Ok(());
    }
    for item in patch {
        let Value::Object(pm) = item else {
            if !orig.contains(item) {
                orig.push(item.clone());
            }
            continue;
        };
        let Some(kv) = pm.get(key) else {
            return Err(ApiError::bad_request(format!(
                "map: {} does not contain declared merge key: {key}",
                item
            )));
        };
        let pos = orig.iter().position(|o| o.get(key) == Some(kv));
        if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
            orig.retain(|o| o.get(key) != Some(kv));
            continue;
        }
        match pos {
            Some(i) => {
                if let Some(Value::Object(om)) = orig.get_mut(i) {
                    merge_map(kind, path, om, pm)?;
                }
            }
            None => {
                let mut fresh = Map::new();
                merge_map(kind, path, &mut fresh, pm)?;
                orig.push(Value::Object(fresh));
            }
        }
    }
    Ok(())
}

fn reorder(list: &mut Vec<Value>, order: &[Value], strategy: ListStrategy) {
    let matches = |item: &Value, o: &Value| match strategy {
        ListStrategy::MergeKey(k) => o.get(k).is_some() && item.get(k) == o.get(k),
        _ => item == o,
    };
    let mut ordered: Vec<Value> = Vec::with_capacity(list.len());
    let mut rest: Vec<Value> = Vec::new();
    let mut taken = vec![false; list.len()];
    for o in order {
        if let Some(i) = list
            .iter()
            .enumerate()
            .position(|(i, item)| !taken[i] && matches(item, o))
        {
            taken[i] = true;
            ordered.push(list[i].clone());
        }
    }
    for (i, item) in list.iter().enumerate() {
        if !taken[i] {
            rest.push(item.clone());
        }
    }
    ordered.extend(rest);
    *list = ordered;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn containers_merge_by_name_and_env_by_name() {
        let mut pod = json!({"spec": {"containers": [
            {"name": "a", "image": "x:1", "env": [{"name": "A", "value": "1"}]},
            {"name": "b", "image": "y:1"}
        ]}});
        let patch = json!({"spec": {"containers": [
            {"name": "b", "image": "y:2"},
            {"name": "a", "env": [{"name": "B", "value": "2"}]}
        ]}});
        strategic_merge_patch("Pod", &mut pod, &patch).unwrap();
        let cs = pod["spec"]["containers"].as_array().unwrap();
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[0]["image"], "x:1");
        assert_eq!(cs[0]["env"].as_array().unwrap().len(), 2);
        assert_eq!(cs[1]["image"], "y:2");
    }

    #[test]
    fn conditions_merge_by_type_and_container_statuses_replace() {
        let mut pod = json!({"status": {
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "Initialized", "status": "True"}],
            "containerStatuses": [{"name": "a"}, {"name": "b"}]
        }});
        let patch = json!({"status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "b", "ready": true}]
        }});
        strategic_merge_patch("Pod", &mut pod, &patch).unwrap();
        assert_eq!(pod["status"]["conditions"][0]["status"], "True");
        assert_eq!(pod["status"]["conditions"].as_array().unwrap().len(), 2);
        assert_eq!(
            pod["status"]["containerStatuses"],
            json!([{"name": "b", "ready": true}])
        );
    }

    #[test]
    fn directives_delete_replace_retain_and_order() {
        let mut pod = json!({"metadata": {"finalizers": ["a", "b"]}, "spec": {
            "containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "volumes": [{"name": "v", "emptyDir": {}}],
            "tolerations": [{"key": "x"}]
        }});
        let patch = json!({
            "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "finalizers": ["c"]},
            "spec": {
                "$setElementOrder/containers": [{"name": "c"}, {"name": "a"}],
                "containers": [{"name": "b", "$patch": "delete"}],
                "volumes": [{"name": "v", "hostPath": {"path": "/x"}, "$retainKeys": ["name", "hostPath"]}],
                "tolerations": [{"key": "y"}]
            }
        });
        strategic_merge_patch("Pod", &mut pod, &patch).unwrap();
        assert_eq!(pod["metadata"]["finalizers"], json!(["b", "c"]));
        assert_eq!(
            pod["spec"]["containers"],
            json!([{"name": "c"}, {"name": "a"}])
        );
        assert_eq!(
            pod["spec"]["volumes"],
            json!([{"name": "v", "hostPath": {"path": "/x"}}])
        );
        assert_eq!(pod["spec"]["tolerations"], json!([{"key": "y"}]));
        let mut obj = json!({"spec": {"a": 1, "b": 2}});
        strategic_merge_patch(
            "Pod",
            &mut obj,
            &json!({"spec": {"$patch": "replace", "c": 3}}),
        )
        .unwrap();
        assert_eq!(obj, json!({"spec": {"c": 3}}));
    }

    #[test]
    fn merge_patch_removes_nulls() {
        let mut v = json!({"a": {"b": 1, "c": 2}, "d": [1]});
        merge_patch(&mut v, &json!({"a": {"b": null}, "d": [2]}));
        assert_eq!(v, json!({"a": {"c": 2}, "d": [2]}));
    }

    #[test]
    fn json_patch_errors_are_statuses() {
        let mut v = json!({"a": 1});
        assert_eq!(json_patch(&mut v, b"{not json").unwrap_err().code, 400);
        let err = json_patch(&mut v, br#"[{"op":"test","path":"/a","value":2}]"#).unwrap_err();
        assert_eq!(err.code, 422);
        json_patch(&mut v, br#"[{"op":"replace","path":"/a","value":3}]"#).unwrap();
        assert_eq!(v["a"], 3);
    }
}
