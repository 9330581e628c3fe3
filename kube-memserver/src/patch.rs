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
    let workload = matches!(
        kind,
        "Deployment" | "ReplicaSet" | "DaemonSet" | "StatefulSet" | "Job"
    );
    if workload {
        // The pod template merges as a Pod does.
        return match path {
            ["spec", "template", rest @ ..] => list_strategy("Pod", rest),
            ["status", "conditions"] => (MergeKey("type"), false),
            _ => (Replace, false),
        };
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
        ("CSINode", ["spec", "drivers"]) => (MergeKey("name"), false),
        ("Service", ["spec", "ports"]) => (MergeKey("port"), false),
        ("ServiceAccount", ["secrets"]) => (MergeKey("name"), false),
        (
            "Service" | "Namespace" | "PersistentVolumeClaim" | "PersistentVolume",
            ["status", "conditions"],
        ) => (MergeKey("type"), false),
        _ => (Replace, false),
    }
}

/// Applies a strategic merge patch to an object of a built-in `kind`, as apimachinery's
/// `strategicpatch.StrategicMergeMapPatch` does: `$patch` (`replace`, `delete`, list
/// `replace`/`delete` elements), `$retainKeys`, `$setElementOrder/…` and
/// `$deleteFromPrimitiveList/…` directives; lists merged by their `patchMergeKey` (or, for
/// primitives, unioned) and then ordered as upstream orders them — the patch's items in the
/// patch's order, the server's other items interleaved by their old positions, so an item new
/// to the list comes before the ones only the server had; any other list replaced. A value
/// the object lacks (or holds with another JSON type) is taken as sent without its nulls and
/// without any map holding a `$patch` directive (upstream since 1.28). What is left of
/// directives and nulls afterwards goes, as decoding into the Go types drops it. Errors as
/// upstream's: malformed directive values 400, the rest (a list item without its merge key,
/// an unknown `$patch`) 500 without a reason.
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
        let merged = merge_map(kind, &mut path, std::mem::take(t), p.clone())?;
        *t = merged;
    }
    drop_leftovers(target);
    Ok(())
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(msg.into())
}

fn unknown(msg: impl Into<String>) -> ApiError {
    ApiError::unknown(msg.into())
}

/// A value the object lacks, as upstream takes it (`discardNullValuesFromPatch`,
/// `removeDirectives`): no nulls, no map holding `$patch`.
fn as_sent(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null() && !holds_patch_directive(v))
                .map(|(k, v)| (k, as_sent(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.into_iter()
                .filter(|v| !holds_patch_directive(v))
                .map(as_sent)
                .collect(),
        ),
        other => other,
    }
}

fn holds_patch_directive(v: &Value) -> bool {
    v.as_object().is_some_and(|m| m.contains_key("$patch"))
}

/// What decoding into the Go types drops: keys starting with `$` and null fields.
fn drop_leftovers(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, v| !k.starts_with('$') && !v.is_null());
            m.values_mut().for_each(drop_leftovers);
        }
        Value::Array(a) => a.iter_mut().for_each(drop_leftovers),
        _ => {}
    }
}

/// `mergeMap`: `original` with `patch` merged in.
fn merge_map(
    kind: &str,
    path: &mut Vec<String>,
    mut original: Map<String, Value>,
    mut patch: Map<String, Value>,
) -> Result<Map<String, Value>, ApiError> {
    match patch.get("$patch") {
        Some(Value::String(d)) if d == "replace" => {
            patch.remove("$patch");
            return Ok(patch);
        }
        Some(Value::String(d)) if d == "delete" => return Ok(Map::new()),
        Some(other) => {
            return Err(unknown(format!(
                "unknown patch type: {other} in map: {}",
                Value::Object(patch.clone())
            )));
        }
        None => {}
    }
    // `$retainKeys`: fields the patch names stay, the others go.
    if let Some(keep) = patch.remove("$retainKeys") {
        let Value::Array(keep) = keep else {
            return Err(bad(
                "invalid patch: doesn't support retainKeys directive with a non-list value",
            ));
        };
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        for (k, v) in &patch {
            if v.is_null()
                || k.starts_with("$deleteFromPrimitiveList/")
                || k.starts_with("$setElementOrder/")
            {
                continue;
            }
            if !keep.contains(&k.as_str()) {
                return Err(bad(
                    "doesn't satisfy the retainKeys directive: all fields in the patch must be present in the retainKeys list",
                ));
            }
        }
        original.retain(|k, _| keep.contains(&k.as_str()));
    }
    // `$setElementOrder/<list>` with the list it orders (`mergePatchIntoOriginal`).
    let orders: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with("$setElementOrder/"))
        .cloned()
        .collect();
    for order_key in orders {
        let order = patch.remove(&order_key).unwrap_or_default();
        let Value::Array(order) = order else {
            return Err(bad("invalid patch: setElementOrder list must be a list"));
        };
        let field = order_key["$setElementOrder/".len()..].to_string();
        path.push(field.clone());
        let strategy = list_strategy(kind, &str_path(path)).0;
        let key = match strategy {
            ListStrategy::MergeKey(k) => Some(k),
            _ => None,
        };
        let orig_list = match original.get(&field) {
            Some(Value::Array(a)) => Some(a.clone()),
            Some(_) => {
                path.pop();
                return Err(bad(format!("{field}: expected a list in the object")));
            }
            None => None,
        };
        let patch_list = match patch.remove(&field) {
            Some(Value::Array(a)) => Some(a),
            Some(_) => {
                path.pop();
                return Err(bad(format!("{field}: expected a list in the patch")));
            }
            None => None,
        };
        let merged = match (orig_list.clone(), patch_list) {
            (Some(o), None) => o,
            (None, Some(p)) => p,
            (Some(o), Some(p)) => merge_list_field(kind, path, strategy, o, p)?,
            (None, None) => {
                path.pop();
                continue;
            }
        };
        let (in_order, server_only) = partition(merged, &order, key);
        let ordered = normalize_element_order(
            in_order,
            server_only,
            &order,
            &orig_list.unwrap_or_default(),
            key,
        );
        path.pop();
        original.insert(field, Value::Array(ordered));
    }
    for (k, pv) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let Value::Array(del) = pv else {
                return Err(bad("invalid patch: deleteFromPrimitiveList must be a list"));
            };
            if let Some(Value::Array(list)) = original.get_mut(field) {
                list.retain(|item| !del.contains(item));
            }
            continue;
        }
        if pv.is_null() {
            original.remove(&k);
            continue;
        }
        let Some(ov) = original.remove(&k) else {
            // Not in the object: taken as sent.
            original.insert(k, as_sent(pv));
            continue;
        };
        let merged = match (ov, pv) {
            (Value::Object(om), Value::Object(pm)) => {
                path.push(k.clone());
                let m = merge_map(kind, path, om, pm);
                path.pop();
                Value::Object(m?)
            }
            (Value::Array(ol), Value::Array(pl)) => {
                path.push(k.clone());
                let strategy = list_strategy(kind, &str_path(path)).0;
                let m = merge_list_field(kind, path, strategy, ol, pl);
                path.pop();
                Value::Array(m?)
            }
            (_, pv) => as_sent(pv),
        };
        original.insert(k, merged);
    }
    Ok(original)
}

fn str_path(path: &[String]) -> Vec<&str> {
    path.iter().map(String::as_str).collect()
}

/// `mergeSliceHandler`: a merge list merged and ordered, any other list replaced.
fn merge_list_field(
    kind: &str,
    path: &mut Vec<String>,
    strategy: ListStrategy,
    original: Vec<Value>,
    patch: Vec<Value>,
) -> Result<Vec<Value>, ApiError> {
    match strategy {
        ListStrategy::Replace => Ok(patch),
        ListStrategy::MergePrimitive => {
            if original.is_empty() && patch.is_empty() {
                return Ok(original);
            }
            let mut merged = original.clone();
            for item in &patch {
                if !merged.contains(item) {
                    merged.push(item.clone());
                }
            }
            let (in_patch, server_only) = partition(merged, &patch, None);
            Ok(normalize_element_order(
                in_patch,
                server_only,
                &patch,
                &original,
                None,
            ))
        }
        ListStrategy::MergeKey(key) => merge_keyed_list(kind, path, original, patch, key),
    }
}

/// `mergeSlice` for a list of maps merged by `key`.
fn merge_keyed_list(
    kind: &str,
    path: &mut Vec<String>,
    mut original: Vec<Value>,
    patch: Vec<Value>,
    key: &str,
) -> Result<Vec<Value>, ApiError> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    // Special elements first (`mergeSliceWithSpecialElements`).
    let mut plain = Vec::new();
    let mut replace = false;
    for item in patch {
        let Value::Object(m) = &item else {
            return Err(unknown(format!(
                "list element types are not identical: {item} in a list merged by {key}"
            )));
        };
        match m.get("$patch") {
            None => plain.push(item),
            Some(Value::String(d)) if d == "delete" => {
                let Some(v) = m.get(key) else {
                    return Err(unknown(format!(
                        "map: {item} does not contain declared merge key: {key}"
                    )));
                };
                original.retain(|o| o.get(key) != Some(v));
            }
            Some(Value::String(d)) if d == "replace" => replace = true,
            Some(Value::String(d)) if d == "merge" => {
                return Err(unknown(
                    "merging lists cannot yet be specified in the patch",
                ));
            }
            Some(other) => {
                return Err(unknown(format!(
                    "unknown patch type: {other} in map: {item}"
                )));
            }
        }
    }
    if replace {
        return Ok(plain);
    }
    let server_order = original.clone();
    for item in &plain {
        let Value::Object(pm) = item else { continue };
        let Some(kv) = pm.get(key) else {
            return Err(unknown(format!(
                "map: {item} does not contain declared merge key: {key}"
            )));
        };
        match original.iter().position(|o| o.get(key) == Some(kv)) {
            Some(i) => {
                let Value::Object(om) = std::mem::take(&mut original[i]) else {
                    return Err(unknown(format!("value for key {i} is not a map")));
                };
                original[i] = Value::Object(merge_map(kind, path, om, pm.clone())?);
            }
            None => original.push(item.clone()),
        }
    }
    let (in_patch, server_only) = partition(original, &plain, Some(key));
    Ok(normalize_element_order(
        in_patch,
        server_only,
        &plain,
        &server_order,
        Some(key),
    ))
}

/// The value a list item is matched by: its merge key's value, or the item itself.
fn identity<'v>(item: &'v Value, key: Option<&str>) -> Option<&'v Value> {
    match key {
        Some(k) => item.get(k),
        None => Some(item),
    }
}

fn position_in(list: &[Value], item: &Value, key: Option<&str>) -> Option<usize> {
    let id = identity(item, key)?;
    list.iter().position(|o| identity(o, key) == Some(id))
}

/// The items named in `by`, and the others (each in `list`'s order).
fn partition(list: Vec<Value>, by: &[Value], key: Option<&str>) -> (Vec<Value>, Vec<Value>) {
    list.into_iter()
        .partition(|item| position_in(by, item, key).is_some())
}

/// `normalizeElementOrder`: the patch's items in `patch_order`, the server-only items in
/// `server_order`, then merged: a server-only item goes first only when both items are in
/// `server_order` and it was before; otherwise the patch item goes first.
fn normalize_element_order(
    mut patch_items: Vec<Value>,
    mut server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    let sort = |items: &mut Vec<Value>, order: &[Value]| {
        // `$patch: delete` items keep their place at the end.
        let (mut keep, deletes): (Vec<Value>, Vec<Value>) = std::mem::take(items)
            .into_iter()
            .partition(|i| i.get("$patch").and_then(Value::as_str) != Some("delete"));
        keep.sort_by_key(|i| position_in(order, i, key).unwrap_or(usize::MAX));
        keep.extend(deletes);
        *items = keep;
    };
    sort(&mut patch_items, patch_order);
    sort(&mut server_only, server_order);
    let mut out = Vec::with_capacity(patch_items.len() + server_only.len());
    let (mut left, mut right) = (
        server_only.into_iter().peekable(),
        patch_items.into_iter().peekable(),
    );
    loop {
        match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => out.extend(left.next()),
            (None, Some(_)) => out.extend(right.next()),
            (Some(l), Some(r)) => {
                let before = match (
                    position_in(server_order, l, key),
                    position_in(server_order, r, key),
                ) {
                    (Some(li), Some(ri)) => li < ri,
                    _ => false,
                };
                if before {
                    out.extend(left.next());
                } else {
                    out.extend(right.next());
                }
            }
        }
    }
    out
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
        // The patch's order wins (upstream's normalizeElementOrder).
        assert_eq!(cs[0]["image"], "y:2");
        assert_eq!(cs[1]["image"], "x:1");
        assert_eq!(
            cs[1]["env"],
            json!([{"name": "B", "value": "2"}, {"name": "A", "value": "1"}])
        );
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
        assert_eq!(pod["metadata"]["finalizers"], json!(["c", "b"]));
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

    /// Upstream orders a merged list with the patch's new items before the server-only ones:
    /// a status patch that adds a pod's new IP keeps the old one after it.
    #[test]
    fn new_list_items_come_before_the_server_only_ones() {
        let mut pod = json!({"status": {"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}]}});
        let patch = json!({"status": {"podIP": "10.0.0.2", "podIPs": [{"ip": "10.0.0.2"}]}});
        strategic_merge_patch("Pod", &mut pod, &patch).unwrap();
        assert_eq!(
            pod["status"]["podIPs"],
            json!([{"ip": "10.0.0.2"}, {"ip": "10.0.0.1"}])
        );
        // Interleaving by the old positions: c (server only) was before both patched items.
        let mut obj =
            json!({"status": {"conditions": [{"type": "c"}, {"type": "b"}, {"type": "a"}]}});
        let patch =
            json!({"status": {"conditions": [{"type": "a", "x": 1}, {"type": "b", "x": 2}]}});
        strategic_merge_patch("Pod", &mut obj, &patch).unwrap();
        let types: Vec<&str> = obj["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["c", "a", "b"]);
    }

    #[test]
    fn a_replace_element_replaces_a_list_the_object_has() {
        let mut pod =
            json!({"status": {"podIPs": [{"ip": "10.0.0.1"}], "hostIPs": [{"ip": "1.1.1.1"}]}});
        let patch = json!({"status": {"podIPs": [{"ip": "10.0.0.2"}, {"$patch": "replace"}]}});
        strategic_merge_patch("Pod", &mut pod, &patch).unwrap();
        assert_eq!(pod["status"]["podIPs"], json!([{"ip": "10.0.0.2"}]));
        // Deleting by merge key.
        let patch = json!({"status": {"hostIPs": [{"ip": "1.1.1.1", "$patch": "delete"}, {"ip": "2.2.2.2"}]}});
        strategic_merge_patch("Pod", &mut pod, &patch).unwrap();
        assert_eq!(pod["status"]["hostIPs"], json!([{"ip": "2.2.2.2"}]));
    }

    /// A value the object lacks is taken as sent, without nulls and `$patch` maps (upstream
    /// `mergeMap` since 1.28).
    #[test]
    fn a_list_the_object_lacks_is_taken_without_directives() {
        let mut pod = json!({"status": {"phase": "Pending"}});
        let patch = json!({"status": {
            "podIPs": [{"ip": "10.0.0.2"}, {"$patch": "replace"}],
            "hostIP": null,
            "extra": {"a": null, "b": 1, "c": {"$patch": "delete"}},
        }});
        strategic_merge_patch("Pod", &mut pod, &patch).unwrap();
        assert_eq!(pod["status"]["podIPs"], json!([{"ip": "10.0.0.2"}]));
        assert!(pod["status"].get("hostIP").is_none());
        assert_eq!(pod["status"]["extra"], json!({"b": 1}));
    }

    #[test]
    fn malformed_directives_fail_with_upstream_s_codes() {
        let mut pod = json!({"spec": {"containers": [{"name": "a"}]}});
        for (patch, code) in [
            (json!({"spec": {"$patch": "explode"}}), 500),
            (
                json!({"spec": {"containers": [{"name": "a", "$patch": "merge"}]}}),
                500,
            ),
            (json!({"spec": {"containers": [{"$patch": "delete"}]}}), 500),
            (json!({"spec": {"containers": [{"image": "x"}]}}), 500),
            (json!({"spec": {"containers": ["x"]}}), 500),
            (
                json!({"spec": {"$setElementOrder/containers": "x", "containers": [{"name": "a"}]}}),
                400,
            ),
            (json!({"spec": {"$retainKeys": ["a"], "b": 1}}), 400),
        ] {
            let e = strategic_merge_patch("Pod", &mut pod.clone(), &patch).unwrap_err();
            assert_eq!(e.code, code, "{patch}");
        }
        strategic_merge_patch(
            "Pod",
            &mut pod,
            &json!({"spec": {"containers": [{"name": "a", "image": "y"}]}}),
        )
        .unwrap();
        assert_eq!(
            pod["spec"]["containers"],
            json!([{"name": "a", "image": "y"}])
        );
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
