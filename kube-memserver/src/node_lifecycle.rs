//! Node lifecycle as kube-controller-manager runs it: lease- and heartbeat-based health,
//! conditions set to Unknown after the grace period, `unreachable`/`not-ready` taints that follow
//! the Ready condition, pods marked not ready; and the pod GC that force-deletes pods bound to
//! nodes that no longer exist.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::controllers::MIN_PERIOD;
use super::meta::{now_time, set_path};
use super::state::State;
use super::store::Mutation;
use super::verbs::{self, DeleteOptions};

const NODE_CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];
const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
const NOT_READY: &str = "node.kubernetes.io/not-ready";

/// What the controller last saw of a node's heartbeats. Objects are parsed only when their
/// resourceVersion moved.
struct Health {
    probe: Instant,
    node_rv: u64,
    lease_rv: Option<u64>,
    lease_renew: Option<String>,
    ready_heartbeat: Option<String>,
    ready_status: Option<String>,
}

pub async fn run(st: Arc<State>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(st.config.node_monitor_period.max(MIN_PERIOD));
    let mut health: HashMap<String, Health> = HashMap::new();
    let mut orphans: HashMap<String, Instant> = HashMap::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {
                monitor_nodes(&st, &mut health);
                gc_orphaned_pods(&st, &mut orphans);
            }
        }
    }
}

/// PodGC: pods bound to a node that has not existed for the quarantine period are marked
/// Failed with a `DisruptionTarget` condition and deleted with grace period 0.
fn gc_orphaned_pods(st: &State, first_seen: &mut HashMap<String, Instant>) {
    let nodes = st.table(&st.core("nodes"));
    let pods_info = st.core("pods");
    let pods = st.table(&pods_info);
    let now = Instant::now();
    let bound: HashSet<String> = pods.indexed_node_names().into_iter().collect();
    first_seen.retain(|n, _| bound.contains(n));
    for node in bound {
        if nodes.get(&(String::new(), node.clone())).is_some() {
            first_seen.remove(&node);
            continue;
        }
        let since = *first_seen.entry(node.clone()).or_insert(now);
        if now.duration_since(since) < st.config.pod_gc_orphan_quarantine {
            continue;
        }
        for key in pods.keys_on_node(&node) {
            tracing::info!(pod = %format!("{}/{}", key.0, key.1), %node, "deleting a pod bound to a node that no longer exists");
            let when = now_time();
            let _ = pods.mutate(&key, |cur| {
                let Some(cur) = cur else { return Ok(Mutation::Unchanged) };
                let mut v = cur.value();
                let phase = v["status"]["phase"].as_str().unwrap_or_default().to_string();
                let mut conditions = v["status"]["conditions"].as_array().cloned().unwrap_or_default();
                conditions.retain(|c| c["type"] != "DisruptionTarget");
                conditions.push(json!({"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
                    "message": "PodGC: node no longer exists", "lastTransitionTime": when}));
                set_path(&mut v, &["status", "conditions"], Value::Array(conditions));
                if phase != "Succeeded" && phase != "Failed" {
                    set_path(&mut v, &["status", "phase"], json!("Failed"));
                }
                Ok(Mutation::Put(v))
            });
            let opts = DeleteOptions {
                grace_period_seconds: Some(0),
                ..Default::default()
            };
            let _ = verbs::delete(st, &pods_info, &key.0, &key.1, &opts);
        }
    }
}

fn ready_condition(node: &Value) -> Option<&Value> {
    node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
}

fn monitor_nodes(st: &State, health: &mut HashMap<String, Health>) {
    let nodes_info = st.core("nodes");
    let nodes = st.table(&nodes_info);
    let leases = match st.resources.lookup("coordination.k8s.io", "v1", "leases") {
        Some(i) => st.table(&i),
        None => return,
    };
    let now = Instant::now();
    let grace = st.config.node_monitor_grace_period;
    let all = nodes.all();
    let present: std::collections::HashSet<&str> = all.iter().map(|n| n.name()).collect();
    health.retain(|name, _| present.contains(name.as_str()));
    for node in &all {
        let name = node.name().to_string();
        let lease = leases.get(&("kube-node-lease".to_string(), name.clone()));
        let h = health.entry(name.clone()).or_insert_with(|| Health {
            probe: now,
            node_rv: 0,
            lease_rv: None,
            lease_renew: None,
            ready_heartbeat: None,
            ready_status: None,
        });
        let node_changed = h.node_rv != node.rv;
        if node_changed {
            let v = node.value();
            let ready = ready_condition(&v);
            let heartbeat = ready.and_then(|c| c["lastHeartbeatTime"].as_str().map(str::to_string));
            if heartbeat != h.ready_heartbeat {
                h.probe = now;
                h.ready_heartbeat = heartbeat;
            }
            h.ready_status = ready.and_then(|c| c["status"].as_str().map(str::to_string));
            h.node_rv = node.rv;
        }
        let lease_rv = lease.as_ref().map(|l| l.rv);
        if lease_rv != h.lease_rv {
            let renew = lease
                .as_ref()
                .and_then(|l| l.value()["spec"]["renewTime"].as_str().map(str::to_string));
            if renew != h.lease_renew {
                h.probe = now;
                h.lease_renew = renew;
            }
            h.lease_rv = lease_rv;
        }
        let stale = now.duration_since(h.probe) > grace;
        if stale && h.ready_status.as_deref() != Some("Unknown") {
            tracing::info!(node = %name, "node stopped posting status; marking its conditions Unknown");
            mark_unknown(st, &name);
            mark_pods_not_ready(st, &name);
            reconcile_taints(st, &name);
        } else if node_changed {
            reconcile_taints(st, &name);
        }
    }
}

fn mark_unknown(st: &State, name: &str) {
    let info = st.core("nodes");
    let now = now_time();
    let res = st
        .table(&info)
        .mutate(&(String::new(), name.to_string()), |cur| {
            let Some(cur) = cur else {
                return Ok(Mutation::Unchanged);
            };
            let mut v = cur.value();
            let created = v["metadata"]["creationTimestamp"].clone();
            let mut conditions = v["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for ty in NODE_CONDITIONS {
                match conditions.iter_mut().find(|c| c["type"] == ty) {
                    Some(c) => {
                        if c["status"] != "Unknown" {
                            c["status"] = json!("Unknown");
                            c["reason"] = json!("NodeStatusUnknown");
                            c["message"] = json!("Kubelet stopped posting node status.");
                            c["lastTransitionTime"] = json!(now);
                        }
                    }
                    None => conditions.push(json!({
                        "type": ty,
                        "status": "Unknown",
                        "reason": "NodeStatusNeverUpdated",
                        "message": "Kubelet never posted node status.",
                        "lastHeartbeatTime": created,
                        "lastTransitionTime": now,
                    })),
                }
            }
            set_path(&mut v, &["status", "conditions"], Value::Array(conditions));
            Ok(Mutation::Put(v))
        });
    if let Err(e) = res {
        tracing::warn!(node = name, error = %e, "marking node Unknown");
    }
}

/// Sets the pods' Ready condition to False (`MarkPodsNotReady`).
fn mark_pods_not_ready(st: &State, node: &str) {
    let info = st.core("pods");
    let table = st.table(&info);
    let now = now_time();
    for key in table.keys_on_node(node) {
        let _ = table.mutate(&key, |cur| {
            let Some(cur) = cur else {
                return Ok(Mutation::Unchanged);
            };
            let mut v = cur.value();
            let Some(conds) = v
                .get_mut("status")
                .and_then(|s| s.get_mut("conditions"))
                .and_then(Value::as_array_mut)
            else {
                return Ok(Mutation::Unchanged);
            };
            let mut changed = false;
            for c in conds
                .iter_mut()
                .filter(|c| c["type"] == "Ready" && c["status"] != "False")
            {
                c["status"] = json!("False");
                c["lastTransitionTime"] = json!(now);
                changed = true;
            }
            Ok(if changed {
                Mutation::Put(v)
            } else {
                Mutation::Unchanged
            })
        });
    }
}

/// `node.kubernetes.io/unreachable` for Unknown, `not-ready` for False, none when Ready.
fn reconcile_taints(st: &State, name: &str) {
    let info = st.core("nodes");
    let now = now_time();
    let _ = st
        .table(&info)
        .mutate(&(String::new(), name.to_string()), |cur| {
            let Some(cur) = cur else {
                return Ok(Mutation::Unchanged);
            };
            let current = cur.value();
            let ready = ready_condition(&current).and_then(|c| c["status"].as_str());
            let wanted = match ready {
                Some("True") => None,
                Some("False") => Some(NOT_READY),
                Some(_) => Some(UNREACHABLE),
                None => None,
            };
            let taints = current["spec"]["taints"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mut next: Vec<Value> = taints
                .iter()
                .filter(|t| {
                    let k = t["key"].as_str().unwrap_or_default();
                    (k != UNREACHABLE && k != NOT_READY) || Some(k) == wanted
                })
                .cloned()
                .collect();
            if let Some(key) = wanted {
                for effect in ["NoSchedule", "NoExecute"] {
                    if !next
                        .iter()
                        .any(|t| t["key"] == key && t["effect"] == effect)
                    {
                        let mut t = json!({"key": key, "effect": effect});
                        if effect == "NoExecute" {
                            t["timeAdded"] = json!(now);
                        }
                        next.push(t);
                    }
                }
            }
            if next == taints {
                return Ok(Mutation::Unchanged);
            }
            let mut v = cur.value();
            if next.is_empty() {
                super::meta::remove_path(&mut v, &["spec", "taints"]);
            } else {
                set_path(&mut v, &["spec", "taints"], Value::Array(next));
            }
            Ok(Mutation::Put(v))
        });
}
