//! The ReplicaSet controller: keeps `spec.replicas` active pods matching the selector (adopting
//! orphans), deletes the least useful extras first (unbound, pending, not ready, newest), and
//! reports replicas / fullyLabeledReplicas / readyReplicas / availableReplicas /
//! observedGeneration from the pods' own status.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::{
    PodName, apps, claim_pods, controller_ref, create_pod, delete_pod, int, pod_active,
    pod_available, pod_ready, record_event, set_condition, sync_owners, write_status,
};
use crate::resources::ResourceInfo;
use crate::state::State;
use crate::store::Obj;

const COMPONENT: &str = "replicaset-controller";
/// Upstream's `BurstReplicas`: pods created or deleted per sync.
const BURST: usize = 500;

pub fn pass(st: &State) {
    sync_owners(st, apps(st, "replicasets"), |info, v, pods| {
        sync(st, info, v, pods)
    });
}

/// Deletion preference (`ActivePods` ordering): smaller sorts first and goes first.
fn deletion_rank(p: &Value) -> (u8, u8, u8, std::cmp::Reverse<String>) {
    let unbound = p["spec"]["nodeName"].as_str().is_none_or(str::is_empty);
    let phase = match p["status"]["phase"].as_str() {
        Some("Pending") => 0,
        Some("Unknown") => 1,
        _ => 2,
    };
    (
        u8::from(!unbound),
        phase,
        u8::from(pod_ready(p)),
        std::cmp::Reverse(
            p["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ),
    )
}

pub fn sync(st: &State, info: &ResourceInfo, rs: &Value, pods: &[Arc<Obj>]) {
    if !rs["metadata"]["deletionTimestamp"].is_null() {
        return;
    }
    let ns = crate::meta::namespace(rs).to_string();
    let name = crate::meta::name(rs).to_string();
    let owned = claim_pods(st, rs, &ns, pods);
    let active: Vec<&Value> = owned.iter().filter(|p| pod_active(p)).collect();
    let want = int(&rs["spec"]["replicas"], 1).max(0) as usize;
    // Set when a pod could not be created (`ReplicaFailure`), cleared when all were.
    let mut create_error: Option<String> = None;
    if active.len() < want {
        let oref = controller_ref(rs, "apps/v1", "ReplicaSet");
        for _ in 0..(want - active.len()).min(BURST) {
            match create_pod(
                st,
                &ns,
                &rs["spec"]["template"],
                oref.clone(),
                PodName::Generate(&name),
                |_| {},
            ) {
                Ok(p) => record_event(
                    st,
                    rs,
                    "Normal",
                    "SuccessfulCreate",
                    &format!("Created pod: {}", crate::meta::name(&p)),
                    COMPONENT,
                ),
                Err(e) => {
                    record_event(
                        st,
                        rs,
                        "Warning",
                        "FailedCreate",
                        &format!("Error creating: {}", e.message),
                        COMPONENT,
                    );
                    create_error = Some(e.message);
                    break;
                }
            }
        }
    } else if active.len() > want {
        let mut victims = active.clone();
        victims.sort_by_key(|p| deletion_rank(p));
        for p in victims.into_iter().take((active.len() - want).min(BURST)) {
            delete_pod(st, p);
            record_event(
                st,
                rs,
                "Normal",
                "SuccessfulDelete",
                &format!("Deleted pod: {}", crate::meta::name(p)),
                COMPONENT,
            );
        }
    }
    let min_ready = int(&rs["spec"]["minReadySeconds"], 0);
    let template_labels = &rs["spec"]["template"]["metadata"]["labels"];
    let labelled = active
        .iter()
        .filter(|p| {
            template_labels
                .as_object()
                .into_iter()
                .flatten()
                .all(|(k, v)| p["metadata"]["labels"][k] == *v)
        })
        .count();
    let mut status = Map::new();
    let counts = [
        ("replicas", active.len()),
        ("fullyLabeledReplicas", labelled),
        (
            "readyReplicas",
            active.iter().filter(|p| pod_ready(p)).count(),
        ),
        (
            "availableReplicas",
            active
                .iter()
                .filter(|p| pod_available(p, min_ready))
                .count(),
        ),
    ];
    for (k, n) in counts {
        // `replicas` is always present; the other counts are omitted when zero.
        if n > 0 || k == "replicas" {
            status.insert(k.into(), json!(n));
        }
    }
    if let Some(g) = rs["metadata"]["generation"].as_i64() {
        status.insert("observedGeneration".into(), json!(g));
    }
    let mut conditions: Vec<Value> = rs["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    match create_error {
        Some(message) => set_condition(
            &mut conditions,
            json!({"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": message}),
        ),
        None if active.len() <= want => conditions.retain(|c| c["type"] != "ReplicaFailure"),
        None => {}
    }
    if !conditions.is_empty() {
        status.insert("conditions".into(), Value::Array(conditions));
    }
    write_status(st, info, rs, Value::Object(status));
}
