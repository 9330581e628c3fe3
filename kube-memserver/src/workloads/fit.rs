//! Whether a pod fits a node, as the default scheduler's filter plugins decide it
//! (NodeUnschedulable, TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit,
//! PodTopologySpread, InterPodAffinity), with upstream's reasons; the scheduling loop is in
//! `scheduler.rs`, the DaemonSet controller reuses the node checks.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::{controller_uid, selector_matches};

/// What a node offers and what is bound to it.
/// Namespace name → its labels (for namespaceSelectors in affinity terms).
pub type Namespaces = HashMap<String, Value>;

pub struct NodeInfo {
    pub name: String,
    pub value: Value,
    /// cpu (millicores), memory (bytes), pods.
    pub allocatable: [i128; 3],
    pub requested: [i128; 3],
    /// Pods per controller uid.
    pub owners: HashMap<String, usize>,
    /// Bound pods (for host ports and inter-pod affinity).
    pub pods: Vec<Value>,
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

pub fn quantity(v: &Value) -> Option<i128> {
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
pub fn pod_requests(pod: &Value) -> [i128; 2] {
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
pub fn misfit(
    pod: &Value,
    requests: &[i128; 2],
    n: &NodeInfo,
    nodes: &[NodeInfo],
    namespaces: &Namespaces,
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
        && let Some(why) = inter_pod_misfit(pod, n, nodes, namespaces)
    {
        out.push((why.to_string(), false));
    }
    out
}

pub fn add_pod(n: &mut NodeInfo, pod: &Value) {
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
fn term_selects(term: &Value, term_ns: &str, other: &Value, namespaces: &Namespaces) -> bool {
    let ns = crate::meta::namespace(other);
    let listed = term["namespaces"].as_array().filter(|a| !a.is_empty());
    let selector = term["namespaceSelector"].as_object();
    // The listed namespaces and those the selector selects; neither: the pod's own.
    let in_namespaces = match (listed, selector) {
        (None, None) => ns == term_ns,
        _ => {
            listed.is_some_and(|l| l.iter().any(|n| n.as_str() == Some(ns)))
                || selector.is_some_and(|_| {
                    let labels = namespaces.get(ns).unwrap_or(&Value::Null);
                    selector_matches(&term["namespaceSelector"], labels)
                })
        }
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
fn inter_pod_misfit(
    pod: &Value,
    n: &NodeInfo,
    nodes: &[NodeInfo],
    namespaces: &Namespaces,
) -> Option<&'static str> {
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
        if in_domain(key)
            .iter()
            .any(|o| term_selects(term, ns, o, namespaces))
        {
            return Some("node(s) didn't match pod anti-affinity rules");
        }
    }
    for term in required_terms(pod, "podAffinity") {
        let key = term["topologyKey"].as_str().unwrap_or_default();
        let here = in_domain(key)
            .iter()
            .any(|o| term_selects(term, ns, o, namespaces));
        if here {
            continue;
        }
        // The first pod of a group that selects itself may go anywhere with the topology key.
        let anywhere = nodes
            .iter()
            .flat_map(|m| m.pods.iter())
            .any(|o| term_selects(term, ns, o, namespaces));
        if anywhere || domain(&n.value, key).is_none() || !term_selects(term, ns, pod, namespaces) {
            return Some("node(s) didn't match pod affinity rules");
        }
    }
    for m in nodes {
        for other in &m.pods {
            for term in required_terms(other, "podAntiAffinity") {
                let key = term["topologyKey"].as_str().unwrap_or_default();
                let same = domain(&m.value, key).is_some_and(|d| domain(&n.value, key) == Some(d));
                if same && term_selects(term, crate::meta::namespace(other), pod, namespaces) {
                    return Some("node(s) didn't satisfy existing pods anti-affinity rules");
                }
            }
        }
    }
    None
}
