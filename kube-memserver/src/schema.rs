//! Structural-schema handling for custom resources, as apiextensions-apiserver does it on every
//! write: pruning of unknown fields, defaulting, and validation of types, `required` and `enum`.

use serde_json::{Value, json};

use super::status::Cause;

fn preserves_unknown(s: &Value) -> bool {
    s["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true)
}

fn is_embedded(s: &Value) -> bool {
    s["x-kubernetes-embedded-resource"].as_bool() == Some(true)
}

/// Drops fields the schema does not know, keeping `apiVersion`/`kind`/`metadata` at the root
/// and in embedded resources.
pub fn prune(v: &mut Value, s: &Value) {
    prune_at(v, s, true);
}

fn prune_at(v: &mut Value, s: &Value, resource_root: bool) {
    match v {
        Value::Object(map) => {
            let props = s["properties"].as_object();
            let additional = &s["additionalProperties"];
            let any_key = preserves_unknown(s)
                || additional.is_object()
                || additional.as_bool() == Some(true);
            let keep_meta = resource_root || is_embedded(s);
            map.retain(|k, _| {
                (keep_meta && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
                    || props.is_some_and(|p| p.contains_key(k))
                    || any_key
            });
            for (k, child) in map.iter_mut() {
                if keep_meta && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                if let Some(ps) = props.and_then(|p| p.get(k)) {
                    prune_at(child, ps, false);
                } else if additional.is_object() {
                    prune_at(child, additional, false);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for item in items {
                    prune_at(item, is, false);
                }
            }
        }
        _ => {}
    }
}

/// Fills `default` values of absent fields (objects that exist only).
pub fn apply_defaults(v: &mut Value, s: &Value) {
    match v {
        Value::Object(map) => {
            if let Some(props) = s["properties"].as_object() {
                for (k, ps) in props {
                    if !map.contains_key(k)
                        && let Some(d) = ps.get("default")
                    {
                        map.insert(k.clone(), d.clone());
                    }
                    if let Some(child) = map.get_mut(k) {
                        apply_defaults(child, ps);
                    }
                }
            }
            if s["additionalProperties"].is_object() {
                for child in map.values_mut() {
                    apply_defaults(child, &s["additionalProperties"]);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for item in items {
                    apply_defaults(item, is);
                }
            }
        }
        _ => {}
    }
}

fn type_matches(v: &Value, s: &Value) -> bool {
    if v.is_null() {
        return s["nullable"].as_bool() == Some(true);
    }
    if s["x-kubernetes-int-or-string"].as_bool() == Some(true) {
        return v.is_string() || v.as_i64().is_some();
    }
    match s["type"].as_str() {
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        Some("string") => v.is_string(),
        Some("integer") => v.as_i64().is_some() || v.as_u64().is_some(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        _ => true,
    }
}

/// Type, `required` and `enum` checks; root `apiVersion`/`kind`/`metadata` are left to the
/// generic metadata validation.
pub fn validate(v: &Value, s: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    validate_at(v, s, "", true, &mut causes);
    causes
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

fn validate_at(v: &Value, s: &Value, path: &str, root: bool, causes: &mut Vec<Cause>) {
    if causes.len() > 50 {
        return;
    }
    if !root && !type_matches(v, s) {
        let ty = s["type"].as_str().unwrap_or("int-or-string");
        causes.push(Cause::invalid(
            path,
            v,
            &format!("{path} in body must be of type {ty}: {v}"),
        ));
        return;
    }
    if let Some(allowed) = s["enum"].as_array()
        && !allowed.contains(v)
    {
        let list: Vec<String> = allowed.iter().map(|a| a.to_string()).collect();
        causes.push(Cause {
            reason: "FieldValueNotSupported",
            field: path.to_string(),
            message: format!(
                "Unsupported value: {v}: supported values: {}",
                list.join(", ")
            ),
        });
    }
    match v {
        Value::Object(map) => {
            for r in s["required"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                if !map.contains_key(r) {
                    causes.push(Cause::required(join(path, r), ""));
                }
            }
            let props = s["properties"].as_object();
            for (k, child) in map {
                if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                if let Some(ps) = props.and_then(|p| p.get(k)) {
                    validate_at(child, ps, &join(path, k), false, causes);
                } else if s["additionalProperties"].is_object() {
                    validate_at(
                        child,
                        &s["additionalProperties"],
                        &join(path, k),
                        false,
                        causes,
                    );
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate_at(item, is, &format!("{path}[{i}]"), false, causes);
                }
            }
        }
        _ => {}
    }
}

/// The schema of a CRD version (`spec.versions[].schema.openAPIV3Schema`).
pub fn of_version(version: &Value) -> Option<Value> {
    let s = &version["schema"]["openAPIV3Schema"];
    s.is_object().then(|| s.clone())
}

/// A permissive schema for versions without one.
pub fn permissive() -> Value {
    json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"},
                "replicas": {"type": "integer", "default": 1},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "port": {"x-kubernetes-int-or-string": true}
            }},
            "status": {"type": "object", "properties": {"ok": {"type": "boolean"}}}
        }})
    }

    #[test]
    fn unknown_fields_are_pruned_and_defaults_filled() {
        let mut v = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"},
            "spec": {"name": "n", "junk": 1, "labels": {"k": "v"}, "free": {"any": {"thing": 1}}},
            "other": true});
        prune(&mut v, &schema());
        apply_defaults(&mut v, &schema());
        assert_eq!(
            v,
            json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"},
            "spec": {"name": "n", "replicas": 1, "labels": {"k": "v"}, "free": {"any": {"thing": 1}}}})
        );
    }

    #[test]
    fn types_required_and_enums_are_validated() {
        let v = json!({"metadata": {}, "spec": {"replicas": "three", "mode": "c", "port": "http"}, "status": {"ok": "yes"}});
        let causes = validate(&v, &schema());
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert!(fields.contains(&"spec.name"), "{causes:?}");
        assert!(fields.contains(&"spec.replicas"), "{causes:?}");
        assert!(fields.contains(&"spec.mode"), "{causes:?}");
        assert!(fields.contains(&"status.ok"), "{causes:?}");
        assert!(!fields.contains(&"spec.port"), "{causes:?}");
    }
}
