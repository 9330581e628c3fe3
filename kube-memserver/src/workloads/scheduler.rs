//! The default scheduler, reduced to its filters that matter here: `spec.unschedulable`, taints
//! (NoSchedule/NoExecute against the pod's tolerations), `nodeSelector` and required node
//! affinity (matchExpressions In/NotIn/Exists/DoesNotExist/Gt/Lt, matchFields
//! `metadata.name`), host ports, resource requests (cpu, memory, pod count) against the node's
//! allocatable minus what bound pods request, DoNotSchedule topology spread constraints and
//! required inter-pod (anti-)affinity. Among the
//! nodes that fit, it prefers the one with the fewest pods of the same owner, then the least
//! requested. Pending pods (no
//! `spec.nodeName`, scheduler `default-scheduler`) are bound as `pods/binding` binds; a pod that
//! fits nowhere gets `PodScheduled=False` (reason `Unschedulable`) and a `FailedScheduling`
//! event with upstream's message, and is retried whenever pods or nodes change.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

use super::{controller_uid, record_event, selector_matches};
use crate::meta::{now_time, set_path};
use crate::state::State;
use crate::store::Mutation;
use crate::verbs;

const SCHEDULER: &str = "default-scheduler";

/// What a node offers and what is bound to it.
struct NodeInfo {
    name: String,
    value: Value,
    /// cpu (millicores), memory (bytes), pods.
    allocatable: [i128; 3],
    requested: [i128; 3],
    /// Pods per controller uid.
    owners: HashMap<String, usize>,
    /// Bound pods (for host ports and inter-pod affinity).
    pods: Vec<Value>,
}

/// Parses a resource quantity (`100m`, `1.5`, `128Mi`, `1G`, `1e3`) into units of 1/1000.
pub fn parse_milli(q: &str) -> Option<i128> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let num: f64 = num.parse().ok()?;
    let mult: f64 = match suffix {
        "" => 1.0,
        "m" => 0.001,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    let v = (num * mult * 1000.0).ceil();
    // Bounded so that sums over many pods cannot overflow.
    v.is_finite()
        .then_some((v as i128).clamp(-(1 << 90), 1 << 90))
}

fn quantity(v: &Value) -> Option<i128> {
    match v {
        Value::String(s) => parse_milli(s),
        Value::Number(n) => n
            .as_f64()
            .map(|f| ((f * 1000.0).ceil() as i128).clamp(-(1 << 90), 1 << 90)),
        _ => None,
    }
}

/// cpu (millicores), memory (bytes) a pod requests: the larger of its containers' sum and any
/// init container, plus overhead. A limit stands in for a missing request.
fn pod_requests(pod: &Value) -> [i128; 2] {
    let one = |c: &Value, r: &str| -> i128 {
        let res = &c["resources"];
        quantity(&res["requests"][r])
            .or_else(|| quantity(&res["limits"][r]))
            .unwrap_or(0)
    };
    let mut out = [0i128; 2];
    for (i, r) in ["cpu", "memory"].iter().enumerate() {
        let sum: i128 = pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| one(c, r).max(0))
            .sum();
        let init = pod["spec"]["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| one(c, r))
            .max()
            .unwrap_or(0);
        let overhead = quantity(&pod["spec"]["overhead"][r]).unwrap_or(0);
        out[i] = sum.max(init) + overhead;
    }
    // cpu in millicores; memory in bytes.
    [out[0], out[1] / 1000]
}

fn tolerates(tol: &Value, taint: &Value) -> bool {
    let effect = tol["effect"].as_str().unwrap_or_default();
    if !effect.is_empty() && Some(effect) != taint["effect"].as_str() {
        return false;
    }
    let key = tol["key"].as_str().unwrap_or_default();
    let op = tol["operator"].as_str().unwrap_or("Equal");
    if key.is_empty() {
        return op == "Exists";
    }
    if Some(key) != taint["key"].as_str() {
        return false;
    }
    match op {
        "Exists" => true,
        "Equal" | "" => {
            tol["value"].as_str().unwrap_or_default() == taint["value"].as_str().unwrap_or_default()
        }
        _ => false,
    }
}

/// The first NoSchedule/NoExecute taint none of the tolerations tolerates.
pub fn untolerated_taint<'a>(node: &'a Value, tolerations: &Value) -> Option<&'a Value> {
    node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| matches!(t["effect"].as_str(), Some("NoSchedule") | Some("NoExecute")))
        .find(|t| {
            !tolerations
                .as_array()
                .into_iter()
                .flatten()
                .any(|tol| tolerates(tol, t))
        })
}

fn requirement_matches(req: &Value, value: Option<&str>) -> bool {
    let values: Vec<&str> = req["values"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let int = |s: &str| s.parse::<i64>().ok();
    match req["operator"].as_str() {
        Some("In") => value.is_some_and(|v| values.contains(&v)),
        Some("NotIn") => value.is_none_or(|v| !values.contains(&v)),
        Some("Exists") => value.is_some(),
        Some("DoesNotExist") => value.is_none(),
        Some("Gt") => {
            matches!((value.and_then(int), values.first().and_then(|s| int(s))), (Some(a), Some(b)) if a > b)
        }
        Some("Lt") => {
            matches!((value.and_then(int), values.first().and_then(|s| int(s))), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

/// A `nodeSelectorTerm`: all its expressions and fields match (an empty term matches nothing).
fn term_matches(term: &Value, node: &Value) -> bool {
    let exprs = term["matchExpressions"].as_array();
    let fields = term["matchFields"].as_array();
    if exprs.is_none_or(Vec::is_empty) && fields.is_none_or(Vec::is_empty) {
        return false;
    }
    let labels = &node["metadata"]["labels"];
    exprs.into_iter().flatten().all(|e| {
        let key = e["key"].as_str().unwrap_or_default();
        requirement_matches(e, labels.get(key).and_then(Value::as_str))
    }) && fields.into_iter().flatten().all(|f| {
        f["key"] == "metadata.name" && requirement_matches(f, node["metadata"]["name"].as_str())
    })
}

/// `nodeSelector` and required node affinity.
pub fn node_matches(pod_spec: &Value, node: &Value) -> bool {
    let labels = &node["metadata"]["labels"];
    let selector_ok = pod_spec["nodeSelector"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k).and_then(Value::as_str) == v.as_str());
    if !selector_ok {
        return false;
    }
    let required =
        &pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    if required.is_null() {
        return true;
    }
    required["nodeSelectorTerms"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| term_matches(t, node))
}

/// Why a node does not fit: the reasons as upstream words them, and whether preempting other
/// pods could help (only resource shortages).
fn misfit(
    pod: &Value,
    requests: &[i128; 2],
    n: &NodeInfo,
    nodes: &[NodeInfo],
) -> Vec<(String, bool)> {
    let spec = &pod["spec"];
    let node = &n.value;
    let tolerations = &spec["tolerations"];
    if node["spec"]["unschedulable"].as_bool() == Some(true) {
        let t = json!({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"});
        if !tolerations
            .as_array()
            .into_iter()
            .flatten()
            .any(|tol| tolerates(tol, &t))
        {
            return vec![("node(s) were unschedulable".into(), false)];
        }
    }
    if let Some(t) = untolerated_taint(node, tolerations) {
        return vec![(
            format!(
                "node(s) had untolerated taint {{{}: {}}}",
                t["key"].as_str().unwrap_or_default(),
                t["value"].as_str().unwrap_or_default()
            ),
            false,
        )];
    }
    if !node_matches(spec, node) {
        return vec![(
            "node(s) didn't match Pod's node affinity/selector".into(),
            false,
        )];
    }
    if ports_conflict(pod, n) {
        return vec![(
            "node(s) didn't have free ports for the requested pod ports".into(),
            false,
        )];
    }
    let mut out = Vec::new();
    if n.requested[2] + 1000 > n.allocatable[2] {
        out.push(("Too many pods".to_string(), true));
    }
    for (i, r) in ["cpu", "memory"].iter().enumerate() {
        if requests[i] > 0 && n.requested[i] + requests[i] > n.allocatable[i] {
            out.push((format!("Insufficient {r}"), true));
        }
    }
    if out.is_empty()
        && let Some(why) = spread_misfit(pod, n, nodes)
    {
        out.push((why.to_string(), false));
    }
    if out.is_empty()
        && let Some(why) = inter_pod_misfit(pod, n, nodes)
    {
        out.push((why.to_string(), false));
    }
    out
}

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

fn add_pod(n: &mut NodeInfo, pod: &Value) {
    let r = pod_requests(pod);
    n.requested[0] += r[0];
    n.requested[1] += r[1];
    n.requested[2] += 1000;
    if let Some(u) = controller_uid(pod) {
        *n.owners.entry(u.to_string()).or_default() += 1;
    }
    n.pods.push(pod.clone());
}

/// (protocol, host IP, port) of every host port a pod takes; host-network pods take their
/// container ports.
fn host_ports(pod: &Value) -> Vec<(String, String, i64)> {
    let host_network = pod["spec"]["hostNetwork"].as_bool() == Some(true);
    ["containers", "initContainers"]
        .iter()
        .flat_map(|l| pod["spec"][*l].as_array().into_iter().flatten())
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .filter_map(|p| {
            let port = p["hostPort"]
                .as_i64()
                .filter(|n| *n > 0)
                .or_else(|| host_network.then(|| p["containerPort"].as_i64()).flatten())?;
            Some((
                p["protocol"].as_str().unwrap_or("TCP").to_string(),
                p["hostIP"]
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .unwrap_or("0.0.0.0")
                    .to_string(),
                port,
            ))
        })
        .collect()
}

fn ports_conflict(pod: &Value, n: &NodeInfo) -> bool {
    let wanted = host_ports(pod);
    if wanted.is_empty() {
        return false;
    }
    let taken: Vec<(String, String, i64)> = n.pods.iter().flat_map(host_ports).collect();
    wanted.iter().any(|(proto, ip, port)| {
        taken.iter().any(|(p2, ip2, port2)| {
            proto == p2 && port == port2 && (ip == ip2 || ip == "0.0.0.0" || ip2 == "0.0.0.0")
        })
    })
}

fn required_terms<'a>(pod: &'a Value, kind: &str) -> Vec<&'a Value> {
    pod["spec"]["affinity"][kind]["requiredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// Whether an affinity term of a pod in `term_ns` selects `other` (namespaces default to the
/// term owner's; an empty namespaceSelector means all namespaces).
fn term_selects(term: &Value, term_ns: &str, other: &Value) -> bool {
    let ns = crate::meta::namespace(other);
    let all_namespaces = term["namespaceSelector"].as_object().is_some_and(|m| {
        m.values().all(|v| {
            v.is_null()
                || v.as_object().is_some_and(|o| o.is_empty())
                || v.as_array().is_some_and(|a| a.is_empty())
        })
    });
    let in_namespaces = match term["namespaces"].as_array().filter(|a| !a.is_empty()) {
        Some(list) => list.iter().any(|n| n.as_str() == Some(ns)),
        None => all_namespaces || ns == term_ns,
    };
    in_namespaces && selector_matches(&term["labelSelector"], &other["metadata"]["labels"])
}

fn domain<'a>(node: &'a Value, key: &str) -> Option<&'a str> {
    node["metadata"]["labels"][key].as_str()
}

/// `topologySpreadConstraints` with `whenUnsatisfiable: DoNotSchedule`: placing the pod on `n`
/// must keep (matching pods in its domain + itself) − (fewest in any domain) ≤ maxSkew, the
/// domains being those of the nodes the pod's node selector and affinity allow.
fn spread_misfit(pod: &Value, n: &NodeInfo, nodes: &[NodeInfo]) -> Option<&'static str> {
    let ns = crate::meta::namespace(pod);
    for c in pod["spec"]["topologySpreadConstraints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["whenUnsatisfiable"] == "DoNotSchedule")
    {
        let key = c["topologyKey"].as_str().unwrap_or_default();
        let Some(here) = domain(&n.value, key) else {
            return Some(
                "node(s) didn't match pod topology spread constraints (missing required label)",
            );
        };
        let selects = |p: &Value| {
            crate::meta::namespace(p) == ns
                && p["metadata"]["deletionTimestamp"].is_null()
                && selector_matches(&c["labelSelector"], &p["metadata"]["labels"])
        };
        let mut counts: HashMap<&str, i64> = HashMap::new();
        for m in nodes
            .iter()
            .filter(|m| node_matches(&pod["spec"], &m.value))
        {
            if let Some(d) = domain(&m.value, key) {
                *counts.entry(d).or_default() +=
                    m.pods.iter().filter(|p| selects(p)).count() as i64;
            }
        }
        let min = counts.values().copied().min().unwrap_or(0);
        let own = i64::from(selects(pod));
        let skew = counts.get(here).copied().unwrap_or(0) + own - min;
        if skew > c["maxSkew"].as_i64().unwrap_or(1).max(1) {
            return Some("node(s) didn't match pod topology spread constraints");
        }
    }
    None
}

/// Inter-pod affinity and anti-affinity (required terms), both the pod's own and the
/// anti-affinity of the pods already bound.
fn inter_pod_misfit(pod: &Value, n: &NodeInfo, nodes: &[NodeInfo]) -> Option<&'static str> {
    let ns = crate::meta::namespace(pod);
    let in_domain = |key: &str| -> Vec<&Value> {
        let Some(d) = domain(&n.value, key) else {
            return Vec::new();
        };
        nodes
            .iter()
            .filter(|m| domain(&m.value, key) == Some(d))
            .flat_map(|m| m.pods.iter())
            .collect()
    };
    for term in required_terms(pod, "podAntiAffinity") {
        let key = term["topologyKey"].as_str().unwrap_or_default();
        if in_domain(key).iter().any(|o| term_selects(term, ns, o)) {
            return Some("node(s) didn't match pod anti-affinity rules");
        }
    }
    for term in required_terms(pod, "podAffinity") {
        let key = term["topologyKey"].as_str().unwrap_or_default();
        let here = in_domain(key).iter().any(|o| term_selects(term, ns, o));
        if here {
            continue;
        }
        // The first pod of a group that selects itself may go anywhere with the topology key.
        let anywhere = nodes
            .iter()
            .flat_map(|m| m.pods.iter())
            .any(|o| term_selects(term, ns, o));
        if anywhere || domain(&n.value, key).is_none() || !term_selects(term, ns, pod) {
            return Some("node(s) didn't match pod affinity rules");
        }
    }
    for m in nodes {
        for other in &m.pods {
            for term in required_terms(other, "podAntiAffinity") {
                let key = term["topologyKey"].as_str().unwrap_or_default();
                let same = domain(&m.value, key).is_some_and(|d| domain(&n.value, key) == Some(d));
                if same && term_selects(term, crate::meta::namespace(other), pod) {
                    return Some("node(s) didn't satisfy existing pods anti-affinity rules");
                }
            }
        }
    }
    None
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
    for pod in pending {
        schedule_one(st, &pod, &mut nodes);
    }
}

fn schedule_one(st: &State, pod: &Value, nodes: &mut [NodeInfo]) {
    let requests = pod_requests(pod);
    let owner = controller_uid(pod).map(str::to_string);
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut preemption: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut best: Option<(usize, (usize, i128, i128, String))> = None;
    for (i, n) in nodes.iter().enumerate() {
        let why = misfit(pod, &requests, n, nodes);
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
