//! What an edge's twin report does to a Device's `status.twins` (devices reference §2.5):
//! `actual` becomes `reported`, `expected` becomes `observedDesired`, each with metadata
//! `{timestamp, type}`. Unlike KubeEdge v1.15 (which drops reports for twins not already in
//! the status), a twin is created for any property the device's spec declares, as v1.23 does.

use kubeedge_shared::devices::{DeviceCondition, DeviceTwinUpdate, MsgTwin, TwinValue};
use serde_json::{Map, Value, json};

/// The twins after applying `report`, and whether any value changed. Twins named in the
/// report that the spec does not declare (and the status does not hold) are ignored.
pub fn apply_twin_report(device: &Value, report: &DeviceTwinUpdate) -> (Vec<Value>, bool) {
    let mut twins: Vec<Value> = device
        .pointer("/status/twins")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let declared: Vec<&str> = device
        .pointer("/spec/properties")
        .and_then(Value::as_array)
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p.get("name").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    let mut changed = false;
    let Some(reported) = &report.twin else {
        return (twins, false);
    };
    for (name, twin) in reported {
        let Some(twin) = twin else { continue };
        let idx = match twins
            .iter()
            .position(|t| t.get("propertyName").and_then(Value::as_str) == Some(name))
        {
            Some(i) => i,
            None if declared.contains(&name.as_str()) => {
                twins.push(json!({"propertyName": name}));
                changed = true;
                twins.len() - 1
            }
            None => continue,
        };
        let Some(entry) = twins[idx].as_object_mut() else {
            continue;
        };
        for (field, value) in [
            ("reported", &twin.actual),
            ("observedDesired", &twin.expected),
        ] {
            if let Some(v) = value
                && let Some(text) = &v.value
            {
                let before = entry
                    .get(field)
                    .and_then(|f| f.get("value"))
                    .and_then(Value::as_str);
                if before != Some(text.as_str()) {
                    changed = true;
                }
                entry.insert(field.into(), twin_property(text, v, twin));
            }
        }
    }
    (twins, changed)
}

fn twin_property(text: &str, value: &TwinValue, twin: &MsgTwin) -> Value {
    let mut metadata = Map::new();
    if let Some(ts) = value.metadata.as_ref().and_then(|m| m.timestamp) {
        metadata.insert("timestamp".into(), ts.to_string().into());
    }
    if let Some(kind) = twin.metadata.as_ref().and_then(|m| m.kind.clone()) {
        metadata.insert("type".into(), kind.into());
    }
    let mut p = json!({"value": text});
    if !metadata.is_empty() {
        p["metadata"] = Value::Object(metadata);
    }
    p
}

/// The merge patch that writes twins (the list is replaced as a whole).
pub fn twins_patch(twins: &[Value]) -> Value {
    json!({"status": {"twins": twins}})
}

/// What of a Device status patch also goes to its DeviceStatus (KubeEdge v1.23 keeps twins,
/// state and the last online time there; conditions are this project's and stay on the
/// Device), or `None` when nothing does.
pub fn device_status_patch(patch: &Value) -> Option<Value> {
    let status = patch.get("status")?.as_object()?;
    let kept: Map<String, Value> = status
        .iter()
        .filter(|(k, _)| matches!(k.as_str(), "twins" | "state" | "lastOnlineTime"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (!kept.is_empty()).then(|| json!({ "status": kept }))
}

/// The merge patch of a state report (v1.18+ shape, under `status`); `lastOnlineTime` only
/// when the device is online.
pub fn state_patch(state: &str, last_online: &str) -> Value {
    let mut status = json!({"state": state});
    if !last_online.is_empty() {
        status["lastOnlineTime"] = last_online.into();
    }
    json!({ "status": status })
}

/// The merge patch that sets one condition (others kept), or `None` when the device already
/// has it. The transition time changes only when the status does.
pub fn condition_patch(device: &Value, mut cond: DeviceCondition, now: &str) -> Option<Value> {
    let existing: Vec<DeviceCondition> = device
        .pointer("/status/conditions")
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default();
    let same_type = existing.iter().find(|c| c.kind == cond.kind);
    if let Some(old) = same_type {
        if old.status == cond.status && old.reason == cond.reason && old.message == cond.message {
            return None;
        }
        cond.last_transition_time = if old.status == cond.status {
            old.last_transition_time.clone()
        } else {
            now.to_string()
        };
    } else {
        cond.last_transition_time = now.to_string();
    }
    let mut all: Vec<DeviceCondition> = existing
        .into_iter()
        .filter(|c| c.kind != cond.kind)
        .collect();
    all.push(cond);
    Some(json!({"status": {"conditions": all}}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_shared::devices::decode_content;

    fn device() -> Value {
        json!({"metadata": {"name": "thermo-1", "namespace": "default"},
            "spec": {"properties": [{"name": "temperature"}, {"name": "setpoint"}]},
            "status": {"twins": [{"propertyName": "setpoint", "reported": {"value": "1"}}]}})
    }

    fn report(text: &str) -> DeviceTwinUpdate {
        decode_content(&Value::String(text.into())).unwrap()
    }

    #[test]
    fn reports_fill_declared_twins_and_skip_unknown_ones() {
        let r = report(
            r#"{"twin":{"temperature":{"actual":{"value":"23","metadata":{"timestamp":1700}},"expected":{"value":"20"},"metadata":{"type":"string"}},"bogus":{"actual":{"value":"1"}}}}"#,
        );
        let (twins, changed) = apply_twin_report(&device(), &r);
        assert!(changed);
        assert_eq!(twins.len(), 2, "bogus is not declared: {twins:?}");
        assert_eq!(
            twins[1],
            json!({"propertyName": "temperature",
                "reported": {"value": "23", "metadata": {"timestamp": "1700", "type": "string"}},
                "observedDesired": {"value": "20", "metadata": {"type": "string"}}})
        );
    }

    #[test]
    fn the_same_values_again_are_no_change() {
        let r =
            report(r#"{"twin":{"setpoint":{"actual":{"value":"1","metadata":{"timestamp":5}}}}}"#);
        let (twins, changed) = apply_twin_report(&device(), &r);
        assert!(!changed);
        assert_eq!(twins[0]["reported"]["metadata"]["timestamp"], "5");
        let r = report(r#"{"twin":{"setpoint":{"actual":{"value":"2"}}}}"#);
        assert!(apply_twin_report(&device(), &r).1);
    }

    #[test]
    fn conditions_change_only_when_they_differ() {
        let cond = |status: &str, reason: &str| DeviceCondition {
            kind: "MapperReady".into(),
            status: status.into(),
            reason: reason.into(),
            message: "m".into(),
            last_transition_time: String::new(),
        };
        let dev = json!({"status": {"conditions": [
            {"type": "Other", "status": "True"},
            {"type": "MapperReady", "status": "False", "reason": "NoMapper", "message": "m",
             "lastTransitionTime": "t0"}]}});
        assert_eq!(condition_patch(&dev, cond("False", "NoMapper"), "t1"), None);
        let p = condition_patch(&dev, cond("False", "MapperCallFailed"), "t1").unwrap();
        assert_eq!(p["status"]["conditions"][1]["lastTransitionTime"], "t0");
        assert_eq!(p["status"]["conditions"][0]["type"], "Other");
        let p = condition_patch(&dev, cond("True", "Registered"), "t2").unwrap();
        assert_eq!(p["status"]["conditions"][1]["lastTransitionTime"], "t2");
        assert_eq!(p["status"]["conditions"][1]["status"], "True");
        let p = condition_patch(&json!({}), cond("False", "NoMapper"), "t3").unwrap();
        assert_eq!(p["status"]["conditions"][0]["lastTransitionTime"], "t3");
    }

    #[test]
    fn device_status_patches_carry_twins_and_state_but_not_conditions() {
        assert_eq!(
            device_status_patch(&json!({"status": {"state": "online", "lastOnlineTime": "t",
                "conditions": [], "twins": []}})),
            Some(json!({"status": {"state": "online", "lastOnlineTime": "t", "twins": []}}))
        );
        assert_eq!(
            device_status_patch(&json!({"status": {"conditions": []}})),
            None
        );
        assert_eq!(device_status_patch(&json!("garbage")), None);
    }

    #[test]
    fn patches_replace_the_twin_list_and_write_state() {
        assert_eq!(
            twins_patch(&[json!({"propertyName": "a"})]),
            json!({"status": {"twins": [{"propertyName": "a"}]}})
        );
        assert_eq!(
            state_patch("online", "2026-11-26T12:00:00Z"),
            json!({"status": {"state": "online", "lastOnlineTime": "2026-11-26T12:00:00Z"}})
        );
        assert_eq!(
            state_patch("offline", ""),
            json!({"status": {"state": "offline"}})
        );
    }
}
