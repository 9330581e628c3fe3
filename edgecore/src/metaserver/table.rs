//! `meta.k8s.io/v1` Tables for `kubectl get`: the columns kube-apiserver prints for pods and
//! nodes, `NAME`/`AGE` for everything else.

use serde_json::{Value, json};
use std::time::{SystemTime, UNIX_EPOCH};

fn column(name: &str, ty: &str, priority: u8) -> Value {
    json!({"name": name, "type": ty, "format": if name == "Name" { "name" } else { "" }, "description": "", "priority": priority})
}

fn columns(plural: &str) -> Vec<Value> {
    match plural {
        "pods" => vec![
            column("Name", "string", 0),
            column("Ready", "string", 0),
            column("Status", "string", 0),
            column("Restarts", "string", 0),
            column("Age", "string", 0),
            column("IP", "string", 1),
            column("Node", "string", 1),
        ],
        "nodes" => vec![
            column("Name", "string", 0),
            column("Status", "string", 0),
            column("Roles", "string", 0),
            column("Age", "string", 0),
            column("Version", "string", 0),
        ],
        _ => vec![column("Name", "string", 0), column("Age", "string", 0)],
    }
}

fn cells(plural: &str, obj: &Value, now: u64) -> Vec<Value> {
    let name = obj.pointer("/metadata/name").cloned().unwrap_or(json!(""));
    let age = json!(age(obj, now));
    match plural {
        "pods" => {
            let statuses = obj
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let total = obj
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .map_or(statuses.len(), Vec::len);
            let ready = statuses
                .iter()
                .filter(|s| s["ready"].as_bool() == Some(true))
                .count();
            let restarts: u64 = statuses
                .iter()
                .filter_map(|s| s["restartCount"].as_u64())
                .sum();
            let waiting = statuses.iter().find_map(|s| {
                s.pointer("/state/waiting/reason")
                    .or_else(|| s.pointer("/state/terminated/reason"))
                    .and_then(Value::as_str)
            });
            let phase = obj
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("Pending");
            let status = if obj.pointer("/metadata/deletionTimestamp").is_some() {
                "Terminating"
            } else {
                waiting.unwrap_or(phase)
            };
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(status),
                json!(restarts.to_string()),
                age,
                obj.pointer("/status/podIP")
                    .cloned()
                    .unwrap_or(json!("<none>")),
                obj.pointer("/spec/nodeName")
                    .cloned()
                    .unwrap_or(json!("<none>")),
            ]
        }
        "nodes" => {
            let ready = obj
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .map(|c| c["status"] == "True");
            let status = match ready {
                Some(true) => "Ready",
                _ => "NotReady",
            };
            let roles: Vec<&str> = obj
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|l| {
                    l.keys()
                        .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                        .collect()
                })
                .unwrap_or_default();
            vec![
                name,
                json!(status),
                json!(if roles.is_empty() {
                    "<none>".to_string()
                } else {
                    roles.join(",")
                }),
                age,
                obj.pointer("/status/nodeInfo/kubeletVersion")
                    .cloned()
                    .unwrap_or(json!("")),
            ]
        }
        _ => vec![name, age],
    }
}

/// A Table of `objects`. `include` is the `includeObject` option: `Object` embeds each
/// object, `None` nothing, anything else (the default) its metadata.
pub fn table(
    plural: &str,
    objects: &[Value],
    resource_version: &str,
    include: Option<&str>,
) -> Value {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut row = json!({"cells": cells(plural, o, now)});
            match include {
                Some("None") => {}
                Some("Object") => row["object"] = o.clone(),
                _ => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": o.get("metadata").cloned().unwrap_or(json!({})),
                    })
                }
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns(plural),
        "rows": rows,
    })
}

fn age(obj: &Value, now: u64) -> String {
    let Some(created) = obj
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
        })
    else {
        return "<unknown>".into();
    };
    let secs = now.saturating_sub(created.unix_timestamp().max(0) as u64);
    human_duration(secs)
}

/// Kubernetes' `HumanDuration`, to the precision kubectl shows.
pub fn human_duration(secs: u64) -> String {
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86_400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        match secs % 60 {
            0 => format!("{m}m"),
            s => format!("{m}m{s}s"),
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        match m % 60 {
            0 => format!("{h}h"),
            mm => format!("{h}h{mm}m"),
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 192 {
        match h % 24 {
            0 => format!("{d}d"),
            hh => format!("{d}d{hh}h"),
        }
    } else if d < 365 * 2 {
        format!("{d}d")
    } else {
        format!("{}y", d / 365)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_get_kubectl_columns() {
        let pod = json!({"metadata": {"name": "web", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}], "nodeName": "edge-1"},
            "status": {"phase": "Running", "podIP": "10.0.0.5", "containerStatuses": [
                {"ready": true, "restartCount": 2, "state": {"running": {}}},
                {"ready": false, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
        let t = table("pods", &[pod], "42", None);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[1], "1/2");
        assert_eq!(cells[2], "CrashLoopBackOff");
        assert_eq!(cells[3], "3");
        assert_eq!(cells[6], "edge-1");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(t["metadata"]["resourceVersion"], "42");
        let t = table(
            "configmaps",
            &[json!({"metadata": {"name": "c"}})],
            "1",
            Some("Object"),
        );
        assert_eq!(t["rows"][0]["cells"], json!(["c", "<unknown>"]));
        assert_eq!(t["rows"][0]["object"]["metadata"]["name"], "c");
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(3600 * 3 + 60 * 5), "3h5m");
        assert_eq!(human_duration(86_400 * 3), "3d");
        assert_eq!(human_duration(86_400 * 800), "2y");
    }
}
