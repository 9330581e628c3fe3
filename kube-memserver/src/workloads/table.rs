//! `kubectl get` columns of the workload kinds, as upstream's printers define them.

use serde_json::{Value, json};

use crate::meta::{age, human_duration, now, parse_time};
use crate::table::{Column, NAME, col};

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

fn integer(name: &'static str, priority: i64) -> Column {
    Column {
        ty: "integer",
        ..col(name, priority)
    }
}

/// Containers, Images (comma-joined) and the selector string of a template-bearing object.
fn template_cells(obj: &Value) -> [Value; 3] {
    let containers = obj["spec"]["template"]["spec"]["containers"].as_array();
    let field = |f: &str| -> String {
        containers
            .into_iter()
            .flatten()
            .map(|c| c[f].as_str().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let selector = super::selector_string(&obj["spec"]["selector"]);
    [
        json!(field("name")),
        json!(field("image")),
        json!(if selector.is_empty() {
            "<none>".to_string()
        } else {
            selector
        }),
    ]
}

pub fn columns_and_cells(kind: &str, obj: &Value) -> (Vec<Column>, Vec<Value>) {
    let name = json!(obj["metadata"]["name"]);
    let s = &obj["status"];
    let [containers, images, selector] = template_cells(obj);
    match kind {
        "Deployment" => (
            vec![
                NAME,
                col("Ready", 0),
                integer("Up-to-date", 0),
                integer("Available", 0),
                col("Age", 0),
                col("Containers", 1),
                col("Images", 1),
                col("Selector", 1),
            ],
            vec![
                name,
                json!(format!(
                    "{}/{}",
                    int(&s["readyReplicas"]),
                    int(&obj["spec"]["replicas"])
                )),
                json!(int(&s["updatedReplicas"])),
                json!(int(&s["availableReplicas"])),
                json!(age(obj)),
                containers,
                images,
                selector,
            ],
        ),
        "ReplicaSet" => (
            vec![
                NAME,
                integer("Desired", 0),
                integer("Current", 0),
                integer("Ready", 0),
                col("Age", 0),
                col("Containers", 1),
                col("Images", 1),
                col("Selector", 1),
            ],
            vec![
                name,
                json!(int(&obj["spec"]["replicas"])),
                json!(int(&s["replicas"])),
                json!(int(&s["readyReplicas"])),
                json!(age(obj)),
                containers,
                images,
                selector,
            ],
        ),
        "DaemonSet" => {
            let node_selector = obj["spec"]["template"]["spec"]["nodeSelector"]
                .as_object()
                .map(|m| {
                    let mut v: Vec<String> = m
                        .iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect();
                    v.sort();
                    v.join(",")
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "<none>".into());
            (
                vec![
                    NAME,
                    integer("Desired", 0),
                    integer("Current", 0),
                    integer("Ready", 0),
                    integer("Up-to-date", 0),
                    integer("Available", 0),
                    col("Node Selector", 0),
                    col("Age", 0),
                    col("Containers", 1),
                    col("Images", 1),
                    col("Selector", 1),
                ],
                vec![
                    name,
                    json!(int(&s["desiredNumberScheduled"])),
                    json!(int(&s["currentNumberScheduled"])),
                    json!(int(&s["numberReady"])),
                    json!(int(&s["updatedNumberScheduled"])),
                    json!(int(&s["numberAvailable"])),
                    json!(node_selector),
                    json!(age(obj)),
                    containers,
                    images,
                    selector,
                ],
            )
        }
        "StatefulSet" => (
            vec![
                NAME,
                col("Ready", 0),
                col("Age", 0),
                col("Containers", 1),
                col("Images", 1),
            ],
            vec![
                name,
                json!(format!(
                    "{}/{}",
                    int(&s["readyReplicas"]),
                    int(&obj["spec"]["replicas"])
                )),
                json!(age(obj)),
                containers,
                images,
            ],
        ),
        "Job" => {
            let completions = match obj["spec"]["completions"].as_i64() {
                Some(c) => format!("{}/{c}", int(&s["succeeded"])),
                None => {
                    let p = int(&obj["spec"]["parallelism"]);
                    if p > 1 {
                        format!("{}/1 of {p}", int(&s["succeeded"]))
                    } else {
                        format!("{}/1", int(&s["succeeded"]))
                    }
                }
            };
            let start = s["startTime"].as_str().and_then(parse_time);
            let end = s["completionTime"].as_str().and_then(parse_time);
            let duration = match (start, end) {
                (Some(a), Some(b)) => human_duration((b - a).whole_seconds()),
                (Some(a), None) => human_duration((now() - a).whole_seconds()),
                _ => String::new(),
            };
            (
                vec![
                    NAME,
                    col("Status", 0),
                    col("Completions", 0),
                    col("Duration", 0),
                    col("Age", 0),
                    col("Containers", 1),
                    col("Images", 1),
                    col("Selector", 1),
                ],
                vec![
                    name,
                    json!(job_status(obj)),
                    json!(completions),
                    json!(duration),
                    json!(age(obj)),
                    containers,
                    images,
                    selector,
                ],
            )
        }
        // ControllerRevision
        _ => {
            let controller = obj["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["controller"].as_bool() == Some(true))
                .map(|r| {
                    let group = r["apiVersion"]
                        .as_str()
                        .and_then(|a| a.rsplit_once('/'))
                        .map(|(g, _)| format!(".{g}"))
                        .unwrap_or_default();
                    format!(
                        "{}{group}/{}",
                        r["kind"].as_str().unwrap_or_default().to_lowercase(),
                        r["name"].as_str().unwrap_or_default()
                    )
                })
                .unwrap_or_else(|| "<none>".into());
            (
                vec![
                    NAME,
                    col("Controller", 0),
                    integer("Revision", 0),
                    col("Age", 0),
                ],
                vec![
                    name,
                    json!(controller),
                    json!(int(&obj["revision"])),
                    json!(age(obj)),
                ],
            )
        }
    }
}

/// The Job Status column: Complete, Failed, Suspended, Running (as kubectl 1.32 prints it).
fn job_status(job: &Value) -> &'static str {
    let has = |ty: &str| {
        job["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == ty && c["status"] == "True")
    };
    if has("Complete") {
        "Complete"
    } else if has("Failed") {
        "Failed"
    } else if !job["metadata"]["deletionTimestamp"].is_null() {
        "Terminating"
    } else if has("SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else if has("FailureTarget") {
        "FailureTarget"
    } else if has("Suspended") {
        "Suspended"
    } else {
        "Running"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployment_row_shows_ready_of_desired() {
        let d = json!({"metadata": {"name": "web"}, "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}});
        let (cols, cells) = columns_and_cells("Deployment", &d);
        assert_eq!(cols.len(), cells.len());
        assert_eq!(cells[1], "2/3");
        assert_eq!(cells[7], "app=web");
    }

    #[test]
    fn malformed_objects_still_print() {
        for kind in [
            "Deployment",
            "ReplicaSet",
            "DaemonSet",
            "StatefulSet",
            "Job",
            "ControllerRevision",
        ] {
            let (cols, cells) = columns_and_cells(kind, &json!("x"));
            assert_eq!(cols.len(), cells.len(), "{kind}");
        }
    }
}
