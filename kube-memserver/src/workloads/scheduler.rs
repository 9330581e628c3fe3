//! The default scheduler's loop: pending pods (no `spec.nodeName`, scheduler
//! `default-scheduler`), highest priority and oldest first, are checked against every node
//! (`fit.rs`: unschedulable, taints, node selector and affinity, host ports, requests,
//! topology spread, inter-pod affinity) and bound as `pods/binding` binds, to the fitting node
//! with the fewest pods of the same owner, then the least requested. A pod that fits nowhere
//! gets `PodScheduled=False` (reason `Unschedulable`) and a `FailedScheduling` event with
//! upstream's message, and is retried whenever pods or nodes change.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

use super::fit::{Namespaces, NodeInfo, add_pod, misfit, pod_requests, quantity};
use super::{controller_uid, record_event};
use crate::meta::{now_time, set_path};
use crate::state::State;
use crate::store::Mutation;
use crate::verbs;

const SCHEDULER: &str = "default-scheduler";

/// Every node with what is bound to it.
fn node_infos(st: &State, bound: &[Value]) -> Vec<NodeInfo> {
    let mut nodes: Vec<NodeInfo> = st
        .table(&st.core("nodes"))
        .all()
        .iter()
        .map(|n| {
            let value = n.value();
            let alloc = &value["status"]["allocatable"];
            NodeInfo {
                name: n.name().to_string(),
                allocatable: [
                    quantity(&alloc["cpu"]).unwrap_or(0),
                    quantity(&alloc["memory"]).unwrap_or(0) / 1000,
                    quantity(&alloc["pods"]).unwrap_or(0),
                ],
                value,
                requested: [0; 3],
                owners: HashMap::new(),
                pods: Vec::new(),
            }
        })
        .collect();
    let index: HashMap<String, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), i))
        .collect();
    for p in bound {
        let Some(&i) = p["spec"]["nodeName"].as_str().and_then(|n| index.get(n)) else {
            continue;
        };
        add_pod(&mut nodes[i], p);
    }
    nodes
}

/// One scheduling pass over the pending pods, oldest first.
pub fn pass(st: &State) {
    let pods_info = st.core("pods");
    let table = st.table(&pods_info);
    // Every pod bound: nothing to do, without copying the pod list.
    if table.len() == table.bound_count() {
        return;
    }
    let all = table.all();
    let mut pending: Vec<Value> = all
        .iter()
        .filter(|p| p.field("spec.nodeName").is_empty() && !p.deleting())
        .filter(|p| matches!(&*p.field("spec.schedulerName"), "" | SCHEDULER))
        .filter(|p| !matches!(&*p.field("status.phase"), "Succeeded" | "Failed"))
        .map(|p| p.value())
        .filter(|p| {
            p["spec"]["schedulingGates"]
                .as_array()
                .is_none_or(Vec::is_empty)
        })
        .collect();
    if pending.is_empty() {
        return;
    }
    pending.sort_by(|a, b| {
        let prio = |p: &Value| p["spec"]["priority"].as_i64().unwrap_or(0).saturating_neg();
        prio(a).cmp(&prio(b)).then_with(|| {
            a["metadata"]["creationTimestamp"]
                .as_str()
                .cmp(&b["metadata"]["creationTimestamp"].as_str())
        })
    });
    let bound: Vec<Value> = all
        .iter()
        .filter(|p| !p.field("spec.nodeName").is_empty())
        .filter(|p| !matches!(&*p.field("status.phase"), "Succeeded" | "Failed"))
        .map(|p| p.value())
        .collect();
    let mut nodes = node_infos(st, &bound);
    let namespaces: Namespaces = st
        .table(&st.core("namespaces"))
        .all()
        .iter()
        .map(|n| {
            (
                n.name().to_string(),
                n.value()["metadata"]["labels"].clone(),
            )
        })
        .collect();
    for pod in pending {
        schedule_one(st, &pod, &mut nodes, &namespaces);
    }
}

fn schedule_one(st: &State, pod: &Value, nodes: &mut [NodeInfo], namespaces: &Namespaces) {
    let requests = pod_requests(pod);
    let owner = controller_uid(pod).map(str::to_string);
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut preemption: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut best: Option<(usize, (usize, i128, i128, String))> = None;
    for (i, n) in nodes.iter().enumerate() {
        let why = misfit(pod, &requests, n, nodes, namespaces);
        if why.is_empty() {
            let same_owner = owner
                .as_ref()
                .and_then(|u| n.owners.get(u))
                .copied()
                .unwrap_or(0);
            let load = |k: usize| {
                if n.allocatable[k] > 0 {
                    (n.requested[k] + requests[k]) * 1000 / n.allocatable[k]
                } else {
                    0
                }
            };
            let score = (
                same_owner,
                load(0) + load(1),
                n.requested[2],
                n.name.clone(),
            );
            if best.as_ref().is_none_or(|(_, b)| score < *b) {
                best = Some((i, score));
            }
            continue;
        }
        let resource = why.iter().any(|(_, r)| *r);
        *preemption
            .entry(if resource {
                "No preemption victims found for incoming pod"
            } else {
                "Preemption is not helpful for scheduling"
            })
            .or_default() += 1;
        for (r, _) in why {
            *reasons.entry(r).or_default() += 1;
        }
    }
    let ns = crate::meta::namespace(pod);
    let name = crate::meta::name(pod);
    match best {
        Some((i, _)) => {
            let node = nodes[i].name.clone();
            match verbs::bind_pod(
                st,
                ns,
                name,
                &json!({"target": {"kind": "Node", "name": node}}),
            ) {
                Ok(_) => {
                    add_pod(&mut nodes[i], pod);
                    record_event(
                        st,
                        pod,
                        "Normal",
                        "Scheduled",
                        &format!("Successfully assigned {ns}/{name} to {node}"),
                        SCHEDULER,
                    );
                }
                Err(e) => tracing::debug!(pod = name, error = %e, "binding"),
            }
        }
        None => {
            let total = nodes.len();
            let message = if total == 0 {
                "no nodes available to schedule pods".to_string()
            } else {
                let join = |m: Vec<String>| m.join(", ");
                let mut parts: Vec<String> =
                    reasons.iter().map(|(r, c)| format!("{c} {r}")).collect();
                parts.sort();
                let mut pre: Vec<String> =
                    preemption.iter().map(|(r, c)| format!("{c} {r}")).collect();
                pre.sort();
                format!(
                    "0/{total} nodes are available: {}. preemption: 0/{total} nodes are available: {}.",
                    join(parts),
                    join(pre)
                )
            };
            mark_unschedulable(st, pod, &message);
        }
    }
}

/// `PodScheduled=False` (Unschedulable) and a `FailedScheduling` event, once per distinct
/// message.
fn mark_unschedulable(st: &State, pod: &Value, message: &str) {
    let info = st.core("pods");
    let key = (
        crate::meta::namespace(pod).to_string(),
        crate::meta::name(pod).to_string(),
    );
    let mut changed = false;
    let _ = st.table(&info).mutate(&key, |cur| {
        let Some(cur) = cur else {
            return Ok(Mutation::Unchanged);
        };
        let mut v = cur.value();
        if !v["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .is_empty()
        {
            return Ok(Mutation::Unchanged);
        }
        let mut conds = v["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let current = conds.iter().find(|c| c["type"] == "PodScheduled");
        if current.is_some_and(|c| c["status"] == "False" && c["message"] == message) {
            return Ok(Mutation::Unchanged);
        }
        conds.retain(|c| c["type"] != "PodScheduled");
        conds.push(
            json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message, "lastTransitionTime": now_time()}),
        );
        set_path(&mut v, &["status", "conditions"], Value::Array(conds));
        changed = true;
        Ok(Mutation::Put(v))
    });
    if changed {
        record_event(st, pod, "Warning", "FailedScheduling", message, SCHEDULER);
    }
}
