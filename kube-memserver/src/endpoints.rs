//! The endpoints and endpointslice controllers: for every Service with a selector, an
//! `Endpoints` object of the same name and one `EndpointSlice` listing the matching pods that
//! have an IP (ready ones as addresses, the others as not ready), with target ports resolved
//! against the pods' named container ports. Driven by internal watches on pods and services.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::selectors::Filter;
use super::state::State;
use super::store::{EventType, Obj, ObjKey, WatchItem, WatchStart};
use super::verbs::{self, DeleteOptions, WriteOptions};

const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
const CONTROLLER: &str = "endpointslice-controller.k8s.io";
const SERVICE_NAME: &str = "kubernetes.io/service-name";

pub async fn run(st: Arc<State>, cancel: CancellationToken) {
    loop {
        let pods = st.table(&st.core("pods"));
        let services = st.table(&st.core("services"));
        let everything = Arc::new(Filter::default());
        let rv = st.store.current_rv();
        let (mut preg, mut sreg) = match (
            pods.watch(None, everything.clone(), WatchStart::After(rv), false),
            services.watch(None, everything, WatchStart::After(rv), false),
        ) {
            (Ok(p), Ok(s)) => (p, s),
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Start (and restart after falling behind) from a full resync.
        let mut dirty: HashSet<String> = services
            .all()
            .iter()
            .map(|s| s.namespace().to_string())
            .collect();
        let mut gone: HashSet<ObjKey> = HashSet::new();
        loop {
            if !dirty.is_empty() {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(st.config.endpoints_sync_delay) => {}
                }
                while let Ok(item) = preg.rx.try_recv() {
                    note(&item, false, &mut dirty, &mut gone);
                }
                while let Ok(item) = sreg.rx.try_recv() {
                    note(&item, true, &mut dirty, &mut gone);
                }
                for ns in dirty.drain() {
                    sync_namespace(&st, &ns, &mut gone);
                }
            }
            let alive = tokio::select! {
                _ = cancel.cancelled() => return,
                item = preg.rx.recv() => item.map(|i| note(&i, false, &mut dirty, &mut gone)).is_some(),
                item = sreg.rx.recv() => item.map(|i| note(&i, true, &mut dirty, &mut gone)).is_some(),
            };
            if !alive {
                break;
            }
        }
    }
}

fn note(
    item: &WatchItem,
    is_service: bool,
    dirty: &mut HashSet<String>,
    gone: &mut HashSet<ObjKey>,
) {
    let obj = match item {
        WatchItem::Event(ty, o) => {
            if is_service && *ty == EventType::Deleted {
                gone.insert(o.key());
            }
            o
        }
        WatchItem::Departed(o, _) => o,
        WatchItem::Bookmark(_) => return,
    };
    dirty.insert(obj.namespace().to_string());
}

/// A pod as an endpoint: its IP, readiness, node, and the service ports it resolves.
struct Member {
    ip: String,
    ready: bool,
    terminating: bool,
    node: Option<String>,
    target: Value,
    ports: Vec<Value>,
}

fn resolve_ports(svc: &Value, pod: &Value) -> Option<Vec<Value>> {
    let mut out = Vec::new();
    for p in svc["spec"]["ports"].as_array().into_iter().flatten() {
        let port = match &p["targetPort"] {
            Value::Number(n) => n.as_i64()?,
            Value::String(name) => match name.parse::<i64>() {
                Ok(n) => n,
                Err(_) => pod["spec"]["containers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|c| c["ports"].as_array().into_iter().flatten())
                    .find(|cp| cp["name"].as_str() == Some(name.as_str()))
                    .and_then(|cp| cp["containerPort"].as_i64())?,
            },
            _ => p["port"].as_i64()?,
        };
        let mut ep = json!({"port": port, "protocol": p["protocol"].as_str().unwrap_or("TCP")});
        if let Some(n) = p["name"].as_str().filter(|n| !n.is_empty()) {
            ep["name"] = json!(n);
        }
        out.push(ep);
    }
    Some(out)
}

fn members(svc: &Value, pods: &[Arc<Obj>]) -> Vec<Member> {
    let Some(selector) = svc["spec"]["selector"]
        .as_object()
        .filter(|s| !s.is_empty())
    else {
        return Vec::new();
    };
    let publish_not_ready = svc["spec"]["publishNotReadyAddresses"].as_bool() == Some(true);
    let mut out = Vec::new();
    for p in pods {
        if !selector.iter().all(|(k, v)| p.label(k) == v.as_str()) {
            continue;
        }
        let pod = p.value();
        let Some(ip) = pod["status"]["podIP"].as_str().filter(|s| !s.is_empty()) else {
            continue;
        };
        if matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded") | Some("Failed")
        ) {
            continue;
        }
        let Some(ports) = resolve_ports(svc, &pod) else {
            continue;
        };
        let ready_condition = pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        out.push(Member {
            ip: ip.to_string(),
            ready: ready_condition || publish_not_ready,
            terminating: p.deleting(),
            node: pod["spec"]["nodeName"].as_str().filter(|s| !s.is_empty()).map(str::to_string),
            target: json!({"kind": "Pod", "namespace": p.namespace(), "name": p.name(), "uid": p.uid()}),
            ports,
        });
    }
    out.sort_by(|a, b| {
        a.ip.cmp(&b.ip)
            .then_with(|| a.target["name"].as_str().cmp(&b.target["name"].as_str()))
    });
    out
}

fn address(m: &Member) -> Value {
    let mut a = json!({"ip": m.ip, "targetRef": m.target});
    if let Some(n) = &m.node {
        a["nodeName"] = json!(n);
    }
    a
}

/// Ready addresses, not-ready addresses, ports.
type Subset = (Vec<Value>, Vec<Value>, Vec<Value>);

fn endpoints_object(svc: &Value, members: &[Member]) -> Value {
    // One subset per distinct port set, as the real controller packs them.
    let mut subsets: BTreeMap<String, Subset> = BTreeMap::new();
    for m in members
        .iter()
        .filter(|m| !m.terminating || svc["spec"]["publishNotReadyAddresses"] == true)
    {
        let key = serde_json::to_string(&m.ports).unwrap_or_default();
        let entry = subsets
            .entry(key)
            .or_insert_with(|| (Vec::new(), Vec::new(), m.ports.clone()));
        if m.ready {
            entry.0.push(address(m));
        } else {
            entry.1.push(address(m));
        }
    }
    let subsets: Vec<Value> = subsets
        .into_values()
        .map(|(ready, not_ready, ports)| {
            let mut s = Map::new();
            if !ready.is_empty() {
                s.insert("addresses".into(), Value::Array(ready));
            }
            if !not_ready.is_empty() {
                s.insert("notReadyAddresses".into(), Value::Array(not_ready));
            }
            s.insert("ports".into(), Value::Array(ports));
            Value::Object(s)
        })
        .collect();
    let mut ep = json!({
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": svc["metadata"]["name"], "namespace": svc["metadata"]["namespace"]},
    });
    if let Some(labels) = svc["metadata"]["labels"].as_object() {
        ep["metadata"]["labels"] = Value::Object(labels.clone());
    }
    if !subsets.is_empty() {
        ep["subsets"] = Value::Array(subsets);
    }
    ep
}

fn slice_object(svc: &Value, members: &[Member]) -> Value {
    let name = svc["metadata"]["name"].as_str().unwrap_or_default();
    let mut labels = svc["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    labels.insert(SERVICE_NAME.into(), json!(name));
    labels.insert(MANAGED_BY.into(), json!(CONTROLLER));
    let endpoints: Vec<Value> = members
        .iter()
        .map(|m| {
            let mut e = json!({
                "addresses": [m.ip],
                "conditions": {"ready": m.ready && !m.terminating, "serving": m.ready, "terminating": m.terminating},
                "targetRef": m.target,
            });
            if let Some(n) = &m.node {
                e["nodeName"] = json!(n);
            }
            e
        })
        .collect();
    let mut slice = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "generateName": format!("{name}-"),
            "namespace": svc["metadata"]["namespace"],
            "labels": labels,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name, "uid": svc["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}],
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
    });
    if let Some(first) = members.first() {
        slice["ports"] = Value::Array(first.ports.clone());
    }
    slice
}

fn managed_slices(st: &State, ns: &str, service: &str) -> Vec<Arc<Obj>> {
    let Some(info) = st
        .resources
        .lookup("discovery.k8s.io", "v1", "endpointslices")
    else {
        return Vec::new();
    };
    st.table(&info)
        .in_namespace(ns)
        .into_iter()
        .filter(|s| {
            s.label(SERVICE_NAME) == Some(service) && s.label(MANAGED_BY) == Some(CONTROLLER)
        })
        .collect()
}

fn sync_namespace(st: &State, ns: &str, gone: &mut HashSet<ObjKey>) {
    let svc_info = st.core("services");
    let ep_info = st.core("endpoints");
    let Some(slice_info) = st
        .resources
        .lookup("discovery.k8s.io", "v1", "endpointslices")
    else {
        return;
    };
    let services = st.table(&svc_info).in_namespace(ns);
    let mut pods: Option<Vec<Arc<Obj>>> = None;
    let opts = WriteOptions::default();
    for svc in &services {
        let v = svc.value();
        let has_selector = v["spec"]["selector"]
            .as_object()
            .is_some_and(|s| !s.is_empty());
        if !has_selector || v["spec"]["type"] == "ExternalName" {
            continue;
        }
        let pods = pods.get_or_insert_with(|| st.table(&st.core("pods")).in_namespace(ns));
        let ms = members(&v, pods);
        if let Err(e) = verbs::update(
            st,
            &ep_info,
            ns,
            svc.name(),
            endpoints_object(&v, &ms),
            &opts,
        ) && e.code != 403
        {
            tracing::debug!(service = svc.name(), error = %e, "writing endpoints");
        }
        let desired = slice_object(&v, &ms);
        let existing = managed_slices(st, ns, svc.name());
        let result = match existing.first() {
            Some(cur) => {
                let mut body = desired;
                body["metadata"]["name"] = json!(cur.name());
                verbs::update(st, &slice_info, ns, cur.name(), body, &opts).map(|_| ())
            }
            None => verbs::create(st, &slice_info, ns, desired, &opts).map(|_| ()),
        };
        if let Err(e) = result
            && e.code != 403
        {
            tracing::debug!(service = svc.name(), error = %e, "writing endpointslice");
        }
    }
    let removed: Vec<ObjKey> = gone.iter().filter(|k| k.0 == ns).cloned().collect();
    for key in removed {
        gone.remove(&key);
        if services.iter().any(|s| s.name() == key.1) {
            continue;
        }
        let _ = verbs::delete(st, &ep_info, ns, &key.1, &DeleteOptions::default());
        for s in managed_slices(st, ns, &key.1) {
            let _ = verbs::delete(st, &slice_info, ns, s.name(), &DeleteOptions::default());
        }
    }
}
