//! The DaemonSet controller: a pod on every node the template's nodeSelector / node affinity
//! select and whose NoSchedule/NoExecute taints the pod tolerates (with the tolerations the
//! controller adds: not-ready, unreachable, disk/memory/pid pressure, unschedulable, and
//! network-unavailable for host-network pods). Each pod is pinned to its node with a required
//! node affinity on `metadata.name` (matchFields), which the scheduler honours, as upstream.
//! Pods on nodes that should not run one, failed pods and duplicates are deleted; a changed
//! template rolls out node by node within `maxUnavailable` or `maxSurge` (RollingUpdate) or
//! on deletion (OnDelete). Status counts come from the pods' own status.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::fit::{node_matches, untolerated_taint};
use super::{
    PodIndex, PodName, apps, claim_pods, controller_ref, create_pod, delete_pod, int,
    int_or_percent, pod_active, pod_available, pod_ready, record_event, revisions, write_status,
};
use crate::meta::set_path;
use crate::resources::ResourceInfo;
use crate::state::State;
use crate::store::Obj;

const COMPONENT: &str = "daemonset-controller";

pub fn pass(st: &State) {
    let Some(info) = apps(st, "daemonsets") else {
        return;
    };
    let all = st.table(&info).all();
    if all.is_empty() {
        return;
    }
    let nodes: Vec<Value> = st
        .table(&st.core("nodes"))
        .all()
        .iter()
        .map(|n| n.value())
        .collect();
    let pods = PodIndex::build(st);
    for ds in all {
        let ns_pods = pods.candidates(&ds);
        sync(st, &info, &ds.value(), &nodes, &ns_pods);
    }
}

/// The tolerations `AddOrUpdateDaemonPodTolerations` adds.
fn daemon_tolerations(spec: &Value) -> Vec<Value> {
    let mut tols = spec["tolerations"].as_array().cloned().unwrap_or_default();
    let mut add = |key: &str, effect: &str| {
        if !tols
            .iter()
            .any(|t| t["key"] == key && t["effect"] == effect)
        {
            tols.push(json!({"key": key, "operator": "Exists", "effect": effect}));
        }
    };
    add("node.kubernetes.io/not-ready", "NoExecute");
    add("node.kubernetes.io/unreachable", "NoExecute");
    add("node.kubernetes.io/disk-pressure", "NoSchedule");
    add("node.kubernetes.io/memory-pressure", "NoSchedule");
    add("node.kubernetes.io/pid-pressure", "NoSchedule");
    add("node.kubernetes.io/unschedulable", "NoSchedule");
    if spec["hostNetwork"].as_bool() == Some(true) {
        add("node.kubernetes.io/network-unavailable", "NoSchedule");
    }
    tols
}

/// Whether the DaemonSet wants a pod on `node`, and whether a pod already there may stay
/// (`NodeShouldRunDaemonPod`): a NoSchedule taint (a node going NotReady, say) keeps new pods
/// away but leaves running ones; only NoExecute taints evict.
pub fn should_run(ds: &Value, node: &Value) -> (bool, bool) {
    let spec = &ds["spec"]["template"]["spec"];
    if !node_matches(spec, node) {
        return (false, false);
    }
    let tolerations = Value::Array(daemon_tolerations(spec));
    let run = untolerated_taint(node, &tolerations).is_none();
    let keep = run || {
        let mut no_execute_only = node.clone();
        if let Some(taints) = no_execute_only["spec"]["taints"].as_array_mut() {
            taints.retain(|t| t["effect"] == "NoExecute");
        }
        untolerated_taint(&no_execute_only, &tolerations).is_none()
    };
    (run, keep)
}

/// The node a daemon pod belongs to: its binding, or the node its affinity pins it to.
fn pod_node(pod: &Value) -> Option<String> {
    if let Some(n) = pod["spec"]["nodeName"].as_str().filter(|s| !s.is_empty()) {
        return Some(n.to_string());
    }
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .as_array()?
        .iter()
        .flat_map(|t| t["matchFields"].as_array().into_iter().flatten())
        .find(|f| f["key"] == "metadata.name" && f["operator"] == "In")
        .and_then(|f| f["values"][0].as_str())
        .map(str::to_string)
}

fn pin_to_node(pod: &mut Value, node: &str) {
    set_path(
        pod,
        &[
            "spec",
            "affinity",
            "nodeAffinity",
            "requiredDuringSchedulingIgnoredDuringExecution",
        ],
        json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}),
    );
    let tolerations = daemon_tolerations(&pod["spec"]);
    set_path(pod, &["spec", "tolerations"], Value::Array(tolerations));
}

pub fn sync(st: &State, info: &ResourceInfo, ds: &Value, nodes: &[Value], pods: &[Arc<Obj>]) {
    if !ds["metadata"]["deletionTimestamp"].is_null() {
        return;
    }
    let ns = crate::meta::namespace(ds).to_string();
    let name = crate::meta::name(ds).to_string();
    let Some((_, hash, _)) = revisions::ensure(st, ds, "DaemonSet") else {
        return;
    };
    let owned = claim_pods(st, ds, &ns, pods);
    let mut by_node: HashMap<String, Vec<&Value>> = HashMap::new();
    for p in &owned {
        if let Some(n) = pod_node(p) {
            by_node.entry(n).or_default().push(p);
        }
    }
    // Unbound pods pinned to a node that no longer exists go (bound ones are the pod GC's).
    for (node, here) in &by_node {
        if nodes.iter().any(|n| crate::meta::name(n) == node) {
            continue;
        }
        for p in here.iter().filter(|p| {
            p["spec"]["nodeName"].as_str().is_none_or(str::is_empty)
                && p["metadata"]["deletionTimestamp"].is_null()
        }) {
            delete_pod(st, p);
        }
    }
    let min_ready = int(&ds["spec"]["minReadySeconds"], 0);
    let generation = int(&ds["metadata"]["generation"], 0);
    let oref = controller_ref(ds, "apps/v1", "DaemonSet");
    let on_delete = ds["spec"]["updateStrategy"]["type"] == "OnDelete";
    let mut desired = 0i64;
    let mut scheduled = 0i64;
    let mut misscheduled = 0i64;
    let mut ready = 0i64;
    let mut available = 0i64;
    let mut updated = 0i64;
    // Nodes whose pod runs an old template: (node pod, available).
    let mut outdated: Vec<(&Value, bool)> = Vec::new();
    let mut unavailable = 0i64;
    let rolling = &ds["spec"]["updateStrategy"]["rollingUpdate"];
    let surge = !on_delete && int_or_percent(&rolling["maxSurge"], 1, true) > 0;
    // Nodes surging (old and new pod), and nodes whose only pod is old: (node, available).
    let mut surging = 0i64;
    let mut surge_candidates: Vec<(&str, bool)> = Vec::new();
    let is_current =
        |p: &Value| p["metadata"]["labels"][revisions::HASH_LABEL].as_str() == Some(hash.as_str());
    let create_on = |node_name: &str| {
        let created = create_pod(
            st,
            &ns,
            &ds["spec"]["template"],
            oref.clone(),
            PodName::Generate(&name),
            |pod| {
                pin_to_node(pod, node_name);
                set_path(
                    pod,
                    &["metadata", "labels", revisions::HASH_LABEL],
                    json!(hash),
                );
                set_path(
                    pod,
                    &["metadata", "labels", "pod-template-generation"],
                    json!(generation.to_string()),
                );
            },
        );
        match created {
            Ok(p) => record_event(
                st,
                ds,
                "Normal",
                "SuccessfulCreate",
                &format!("Created pod: {}", crate::meta::name(&p)),
                COMPONENT,
            ),
            Err(e) => record_event(
                st,
                ds,
                "Warning",
                "FailedCreate",
                &format!("Error creating: {}", e.message),
                COMPONENT,
            ),
        }
    };
    for node in nodes {
        let node_name = crate::meta::name(node);
        let mut here: Vec<&Value> = by_node.get(node_name).cloned().unwrap_or_default();
        let (wanted, keep) = should_run(ds, node);
        // Failed daemon pods are replaced.
        for p in here.iter().filter(|p| {
            p["status"]["phase"] == "Failed" && p["metadata"]["deletionTimestamp"].is_null()
        }) {
            delete_pod(st, p);
        }
        // A pod still terminating holds the node (its host ports, say) until it is gone.
        let terminating = here
            .iter()
            .any(|p| !p["metadata"]["deletionTimestamp"].is_null());
        here.retain(|p| pod_active(p));
        if !wanted {
            if !here.is_empty() {
                misscheduled += 1;
                if !keep {
                    for p in &here {
                        delete_pod(st, p);
                    }
                }
            }
            continue;
        }
        desired += 1;
        if here.is_empty() {
            if !terminating {
                create_on(node_name);
            }
            unavailable += 1;
            continue;
        }
        here.sort_by(|a, b| {
            a["metadata"]["creationTimestamp"]
                .as_str()
                .cmp(&b["metadata"]["creationTimestamp"].as_str())
        });
        let pod = if surge {
            // maxSurge: a new pod starts next to the old one, which goes once the new one is
            // available.
            let (new_pods, old_pods): (Vec<&Value>, Vec<&Value>) =
                here.iter().copied().partition(|p| is_current(p));
            match new_pods.first() {
                Some(np) => {
                    for extra in new_pods.iter().skip(1) {
                        delete_pod(st, extra);
                    }
                    if !old_pods.is_empty() {
                        if pod_available(np, min_ready) {
                            old_pods.iter().for_each(|p| delete_pod(st, p));
                        } else {
                            surging += 1;
                        }
                    }
                    *np
                }
                None => {
                    for extra in old_pods.iter().skip(1) {
                        delete_pod(st, extra);
                    }
                    surge_candidates.push((node_name, pod_available(old_pods[0], min_ready)));
                    old_pods[0]
                }
            }
        } else {
            for extra in here.iter().skip(1) {
                delete_pod(st, extra);
            }
            here[0]
        };
        scheduled += 1;
        let is_available = pod_available(pod, min_ready);
        if pod_ready(pod) {
            ready += 1;
        }
        if is_available {
            available += 1;
        } else {
            unavailable += 1;
        }
        if is_current(pod) {
            updated += 1;
        } else if !surge {
            outdated.push((pod, is_available));
        }
    }
    if surge {
        let max_surge = int_or_percent(&rolling["maxSurge"], desired, true);
        let mut budget = max_surge - surging;
        for (node_name, avail) in surge_candidates {
            if !avail {
                create_on(node_name);
            } else if budget > 0 {
                create_on(node_name);
                budget -= 1;
            }
        }
    }
    if !on_delete && !outdated.is_empty() {
        let max_unavailable = int_or_percent(&rolling["maxUnavailable"], desired, true).max(1);
        // Unavailable old pods go at once; available ones within the budget.
        let mut budget = max_unavailable - unavailable;
        for (p, avail) in outdated {
            if !avail {
                delete_pod(st, p);
            } else if budget > 0 {
                delete_pod(st, p);
                budget -= 1;
            }
        }
    }
    let in_use: Vec<&str> = owned
        .iter()
        .filter_map(|p| p["metadata"]["labels"][revisions::HASH_LABEL].as_str())
        .collect();
    revisions::prune(st, ds, &in_use);
    let mut status = Map::new();
    status.insert("currentNumberScheduled".into(), json!(scheduled));
    status.insert("numberMisscheduled".into(), json!(misscheduled));
    status.insert("desiredNumberScheduled".into(), json!(desired));
    status.insert("numberReady".into(), json!(ready));
    status.insert("observedGeneration".into(), json!(generation));
    for (k, n) in [
        ("updatedNumberScheduled", updated),
        ("numberAvailable", available),
        ("numberUnavailable", (desired - available).max(0)),
    ] {
        if n != 0 {
            status.insert(k.into(), json!(n));
        }
    }
    if let Some(c) = ds["status"]["collisionCount"].as_i64() {
        status.insert("collisionCount".into(), json!(c));
    }
    write_status(st, info, ds, Value::Object(status));
}
