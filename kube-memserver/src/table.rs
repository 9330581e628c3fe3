//! Server-side printing (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), the columns
//! `kubectl get` shows, and `PartialObjectMetadata` conversion.

use std::borrow::Cow;

use serde_json::{Value, json};

use super::meta::age;
use super::resources::ResourceInfo;

/// The representation the client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Json,
    /// `meta.k8s.io/<version>` Table.
    Table(&'static str),
    /// `meta.k8s.io/<version>` PartialObjectMetadata(List).
    Metadata(&'static str),
}

pub fn negotiate(accept: &str) -> Output {
    for part in accept.split(',') {
        let p = part.replace(' ', "");
        let version = if p.contains("v=v1beta1") {
            "v1beta1"
        } else {
            "v1"
        };
        if p.contains("as=Table") && p.contains("g=meta.k8s.io") {
            return Output::Table(version);
        }
        if (p.contains("as=PartialObjectMetadataList") || p.contains("as=PartialObjectMetadata"))
            && p.contains("g=meta.k8s.io")
        {
            return Output::Metadata(version);
        }
        if p.starts_with("application/json") || p.starts_with("*/*") || p.is_empty() {
            return Output::Json;
        }
    }
    Output::Json
}

pub fn partial_metadata(obj: &Value, version: &str) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": obj["metadata"],
    })
}

pub(crate) struct Column {
    pub(crate) name: Cow<'static, str>,
    pub(crate) ty: &'static str,
    pub(crate) format: &'static str,
    pub(crate) priority: i64,
    pub(crate) description: &'static str,
}

pub(crate) fn col(name: &'static str, priority: i64) -> Column {
    Column {
        name: Cow::Borrowed(name),
        ty: "string",
        format: "",
        priority,
        description: "",
    }
}

pub(crate) const NAME: Column = Column {
    name: Cow::Borrowed("Name"),
    ty: "string",
    format: "name",
    priority: 0,
    description: "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
};

fn str_or<'a>(v: &'a Value, default: &'a str) -> &'a str {
    v.as_str().filter(|s| !s.is_empty()).unwrap_or(default)
}

fn pod_status(pod: &Value) -> String {
    if !pod["metadata"]["deletionTimestamp"].is_null() {
        return "Terminating".into();
    }
    let mut reason = str_or(
        &pod["status"]["reason"],
        str_or(&pod["status"]["phase"], "Unknown"),
    )
    .to_string();
    for cs in pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(r) = cs["state"]["waiting"]["reason"]
            .as_str()
            .filter(|s| !s.is_empty())
        {
            reason = r.to_string();
        } else if let Some(r) = cs["state"]["terminated"]["reason"]
            .as_str()
            .filter(|s| !s.is_empty())
        {
            reason = r.to_string();
        }
    }
    reason
}

fn pod_cells(pod: &Value) -> Vec<Value> {
    let total = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
    let statuses = pod["status"]["containerStatuses"].as_array();
    let ready = statuses.map_or(0, |s| {
        s.iter()
            .filter(|c| c["ready"].as_bool() == Some(true))
            .count()
    });
    let restarts: i64 = statuses.map_or(0, |s| {
        s.iter().filter_map(|c| c["restartCount"].as_i64()).sum()
    });
    vec![
        json!(pod["metadata"]["name"]),
        json!(format!("{ready}/{total}")),
        json!(pod_status(pod)),
        json!(restarts),
        json!(age(pod)),
        json!(str_or(&pod["status"]["podIP"], "<none>")),
        json!(str_or(&pod["spec"]["nodeName"], "<none>")),
        json!(str_or(&pod["status"]["nominatedNodeName"], "<none>")),
        json!("<none>"),
    ]
}

fn node_cells(node: &Value) -> Vec<Value> {
    let ready = node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["status"].as_str());
    let mut status = match ready {
        Some("True") => "Ready".to_string(),
        Some("False") => "NotReady".to_string(),
        _ => "Unknown".to_string(),
    };
    if node["spec"]["unschedulable"].as_bool() == Some(true) {
        status.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<String> = node["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, _)| {
            k.strip_prefix("node-role.kubernetes.io/")
                .map(str::to_string)
        })
        .filter(|r| !r.is_empty())
        .collect();
    roles.sort();
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.join(",")
    };
    let addr = |ty: &str| {
        node["status"]["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["type"] == ty)
            .and_then(|a| a["address"].as_str())
            .unwrap_or("<none>")
            .to_string()
    };
    let info = &node["status"]["nodeInfo"];
    vec![
        json!(node["metadata"]["name"]),
        json!(status),
        json!(roles),
        json!(age(node)),
        json!(str_or(&info["kubeletVersion"], "")),
        json!(addr("InternalIP")),
        json!(addr("ExternalIP")),
        json!(str_or(&info["osImage"], "<unknown>")),
        json!(str_or(&info["kernelVersion"], "<unknown>")),
        json!(str_or(&info["containerRuntimeVersion"], "<unknown>")),
    ]
}

fn count(v: &Value) -> usize {
    v.as_object().map_or(0, |m| m.len())
}

fn service_ports(svc: &Value) -> String {
    let ports: Vec<String> = svc["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let proto = str_or(&p["protocol"], "TCP");
            match p["nodePort"].as_i64() {
                Some(np) => format!("{}:{np}/{proto}", p["port"]),
                None => format!("{}/{proto}", p["port"]),
            }
        })
        .collect();
    if ports.is_empty() {
        "<none>".into()
    } else {
        ports.join(",")
    }
}

pub(crate) fn columns_and_cells(info: &ResourceInfo, obj: &Value) -> (Vec<Column>, Vec<Value>) {
    let name = json!(obj["metadata"]["name"]);
    if info.custom {
        if info.printer_columns.is_empty() {
            return (vec![NAME, col("Age", 0)], vec![name, json!(age(obj))]);
        }
        let mut cols = vec![NAME];
        let mut cells = vec![name];
        for pc in &info.printer_columns {
            cols.push(Column {
                name: Cow::Owned(pc.name.clone()),
                ty: "string",
                format: "",
                priority: pc.priority,
                description: "",
            });
            let path = pc.json_path.trim_start_matches('.');
            let mut cur = obj;
            for part in path.split('.') {
                cur = &cur[part];
            }
            let cell = if pc.type_ == "date" {
                cur.as_str()
                    .and_then(super::meta::parse_time)
                    .map(|t| super::meta::human_duration((super::meta::now() - t).whole_seconds()))
                    .map(Value::String)
                    .unwrap_or(Value::Null)
            } else {
                cur.clone()
            };
            cells.push(cell);
        }
        return (cols, cells);
    }
    match info.kind.as_str() {
        "Pod" => (
            vec![
                NAME,
                col("Ready", 0),
                col("Status", 0),
                Column {
                    ty: "integer",
                    ..col("Restarts", 0)
                },
                col("Age", 0),
                col("IP", 1),
                col("Node", 1),
                col("Nominated Node", 1),
                col("Readiness Gates", 1),
            ],
            pod_cells(obj),
        ),
        "Node" => (
            vec![
                NAME,
                col("Status", 0),
                col("Roles", 0),
                col("Age", 0),
                col("Version", 0),
                col("Internal-IP", 1),
                col("External-IP", 1),
                col("OS-Image", 1),
                col("Kernel-Version", 1),
                col("Container-Runtime", 1),
            ],
            node_cells(obj),
        ),
        "Namespace" => (
            vec![NAME, col("Status", 0), col("Age", 0)],
            vec![
                name,
                json!(str_or(&obj["status"]["phase"], "")),
                json!(age(obj)),
            ],
        ),
        "ConfigMap" => (
            vec![
                NAME,
                Column {
                    ty: "integer",
                    ..col("Data", 0)
                },
                col("Age", 0),
            ],
            vec![
                name,
                json!(count(&obj["data"]) + count(&obj["binaryData"])),
                json!(age(obj)),
            ],
        ),
        "Secret" => (
            vec![
                NAME,
                col("Type", 0),
                Column {
                    ty: "integer",
                    ..col("Data", 0)
                },
                col("Age", 0),
            ],
            vec![
                name,
                json!(str_or(&obj["type"], "")),
                json!(count(&obj["data"])),
                json!(age(obj)),
            ],
        ),
        "Service" => (
            vec![
                NAME,
                col("Type", 0),
                col("Cluster-IP", 0),
                col("External-IP", 0),
                col("Port(s)", 0),
                col("Age", 0),
            ],
            vec![
                name,
                json!(str_or(&obj["spec"]["type"], "ClusterIP")),
                json!(str_or(&obj["spec"]["clusterIP"], "<none>")),
                json!("<none>"),
                json!(service_ports(obj)),
                json!(age(obj)),
            ],
        ),
        "ServiceAccount" => (
            vec![
                NAME,
                Column {
                    ty: "integer",
                    ..col("Secrets", 0)
                },
                col("Age", 0),
            ],
            vec![
                name,
                json!(obj["secrets"].as_array().map_or(0, Vec::len)),
                json!(age(obj)),
            ],
        ),
        "Lease" => (
            vec![NAME, col("Holder", 0), col("Age", 0)],
            vec![
                name,
                json!(str_or(&obj["spec"]["holderIdentity"], "")),
                json!(age(obj)),
            ],
        ),
        "Event" => {
            let io = &obj["involvedObject"];
            (
                vec![
                    col("Last Seen", 0),
                    col("Type", 0),
                    col("Reason", 0),
                    col("Object", 0),
                    col("Message", 0),
                ],
                vec![
                    json!(
                        obj["lastTimestamp"]
                            .as_str()
                            .and_then(super::meta::parse_time)
                            .map_or("<unknown>".into(), |t| super::meta::human_duration(
                                (super::meta::now() - t).whole_seconds()
                            ))
                    ),
                    json!(str_or(&obj["type"], "")),
                    json!(str_or(&obj["reason"], "")),
                    json!(format!(
                        "{}/{}",
                        io["kind"].as_str().unwrap_or_default().to_lowercase(),
                        io["name"].as_str().unwrap_or_default()
                    )),
                    json!(str_or(&obj["message"], "")),
                ],
            )
        }
        "PersistentVolumeClaim" => (
            vec![
                NAME,
                col("Status", 0),
                col("Volume", 0),
                col("Capacity", 0),
                col("Access Modes", 0),
                col("StorageClass", 0),
                col("Age", 0),
            ],
            vec![
                name,
                json!(str_or(&obj["status"]["phase"], "")),
                json!(str_or(&obj["spec"]["volumeName"], "")),
                json!(str_or(&obj["status"]["capacity"]["storage"], "")),
                json!(""),
                json!(str_or(&obj["spec"]["storageClassName"], "<unset>")),
                json!(age(obj)),
            ],
        ),
        "Deployment" | "ReplicaSet" | "DaemonSet" | "StatefulSet" | "Job"
        | "ControllerRevision" => super::workloads::table::columns_and_cells(&info.kind, obj),
        crate::certificates::KIND => crate::certificates::columns_and_cells(obj),
        "CustomResourceDefinition" => (
            vec![
                NAME,
                Column {
                    format: "date-time",
                    ..col("Created At", 0)
                },
            ],
            vec![name, json!(obj["metadata"]["creationTimestamp"])],
        ),
        _ => (vec![NAME, col("Age", 0)], vec![name, json!(age(obj))]),
    }
}

/// A Table of `objects`. `include` is `includeObject` (None, Metadata (default), Object).
pub fn table<'a>(
    info: &ResourceInfo,
    version: &str,
    objects: impl Iterator<Item = &'a Value>,
    list_meta: Value,
    include: &str,
    headers: bool,
) -> Value {
    let mut defs: Option<Vec<Value>> = None;
    let mut rows = Vec::new();
    for obj in objects {
        let (cols, cells) = columns_and_cells(info, obj);
        if defs.is_none() {
            defs = Some(column_defs(&cols));
        }
        let object = match include {
            "None" => Value::Null,
            "Object" => obj.clone(),
            _ => partial_metadata(obj, version),
        };
        rows.push(json!({"cells": cells, "object": object}));
    }
    let defs = defs.unwrap_or_else(|| {
        let (cols, _) = columns_and_cells(info, &json!({"metadata": {}}));
        column_defs(&cols)
    });
    json!({
        "kind": "Table",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": list_meta,
        "columnDefinitions": if headers { Value::Array(defs) } else { Value::Null },
        "rows": rows,
    })
}

fn column_defs(cols: &[Column]) -> Vec<Value> {
    cols.iter()
        .map(|c| json!({"name": c.name, "type": c.ty, "format": c.format, "description": c.description, "priority": c.priority}))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_get_accept_header_selects_table() {
        let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(negotiate(accept), Output::Table("v1"));
        assert_eq!(negotiate("application/json"), Output::Json);
        assert_eq!(negotiate(""), Output::Json);
    }

    #[test]
    fn pod_rows_show_ready_and_status() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "containerStatuses": [{"ready": true, "restartCount": 2}, {"ready": false, "restartCount": 1}]}});
        let cells = pod_cells(&pod);
        assert_eq!(cells[1], "1/2");
        assert_eq!(cells[2], "Running");
        assert_eq!(cells[3], 3);
    }
}
