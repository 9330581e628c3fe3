//! Unit tests of the scheduler and the controllers against an in-process store (no HTTP): each
//! test runs the passes by hand and plays the kubelet by writing pod status. Helpers here, the
//! tests by controller in the files next to this one.

mod daemon_sets;
mod deployments;
mod jobs;
mod replica_sets;
mod robustness;
mod scheduling;
mod stateful_sets;

use serde_json::{Value, json};

use super::{apps, batch, daemonset, deployment, job, replicaset, scheduler, statefulset};
use crate::Config;
use crate::state::State;
use crate::store::Mutation;
use crate::tokens::TokenIssuer;
use crate::verbs::{self, WriteOptions};

/// A state whose Job retries are immediate (the backoff has its own test).
pub(super) fn state() -> State {
    state_with(Config {
        job_backoff_base: std::time::Duration::ZERO,
        ..Config::default()
    })
}

pub(super) fn state_with(config: Config) -> State {
    let pki = crate::tls::make_pki(&[], None).expect("pki");
    let kubelet = crate::kubelet::client_configs(
        &pki.kubelet_client_der,
        &pki.kubelet_client_key_der,
        Some(&pki.ca_der),
    )
    .expect("kubelet tls");
    let st = State::new(
        config,
        TokenIssuer::new(b"k".to_vec()),
        "t".into(),
        "ca".into(),
        kubelet,
    );
    let ns = st.core("namespaces");
    verbs::create(
        &st,
        &ns,
        "",
        json!({"metadata": {"name": "default"}}),
        &WriteOptions::default(),
    )
    .expect("namespace");
    st
}

pub(super) fn add_node(st: &State, name: &str, labels: Value, taints: Value, cpu: &str) {
    let node = json!({"metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": {"allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]}});
    verbs::create(st, &st.core("nodes"), "", node, &WriteOptions::default()).expect("node");
}

pub(super) fn create(st: &State, group: &str, plural: &str, body: Value) -> Value {
    let info = st.resources.lookup(group, "v1", plural).expect("kind");
    verbs::create(st, &info, "default", body, &WriteOptions::default())
        .expect("create")
        .value()
}

pub(super) fn get(st: &State, group: &str, plural: &str, name: &str) -> Value {
    let info = st.resources.lookup(group, "v1", plural).expect("kind");
    verbs::get(st, &info, "default", name).expect("get").value()
}

pub(super) fn pods(st: &State) -> Vec<Value> {
    st.table(&st.core("pods"))
        .in_namespace("default")
        .iter()
        .map(|p| p.value())
        .collect()
}

pub(super) fn live_pods(st: &State) -> Vec<Value> {
    pods(st)
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect()
}

/// What a kubelet reports for a pod it runs (`phase`), or removes when it is being deleted.
pub(super) fn kubelet(st: &State, phase: &str) {
    let table = st.table(&st.core("pods"));
    for p in pods(st) {
        let key = ("default".to_string(), crate::meta::name(&p).to_string());
        if !p["metadata"]["deletionTimestamp"].is_null() {
            let _ = table.mutate(&key, |_| Ok(Mutation::Remove));
            continue;
        }
        if p["spec"]["nodeName"].as_str().is_none_or(str::is_empty)
            || p["status"]["phase"] != "Pending"
        {
            continue;
        }
        let _ = table.mutate(&key, |cur| {
            let mut v = cur.expect("pod").value();
            v["status"]["phase"] = json!(phase);
            v["status"]["conditions"] = json!([{"type": "Ready", "status": if phase == "Running" { "True" } else { "False" },
                "lastTransitionTime": crate::meta::now_time()}]);
            Ok(Mutation::Put(v))
        });
    }
}

pub(super) fn settle(st: &State, phase: &str, rounds: usize) {
    for _ in 0..rounds {
        deployment::pass(st);
        replicaset::pass(st);
        daemonset::pass(st);
        statefulset::pass(st);
        job::pass(st);
        scheduler::pass(st);
        kubelet(st, phase);
    }
}

pub(super) fn template(labels: Value, extra_spec: Value) -> Value {
    let mut spec = json!({"containers": [{"name": "c", "image": "busybox:1.36"}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra_spec.as_object()) {
        s.extend(e.clone());
    }
    json!({"metadata": {"labels": labels}, "spec": spec})
}

pub(super) fn pod(name: &str, spec: Value) -> Value {
    let mut s = json!({"containers": [{"name": "c", "image": "busybox:1.36"}]});
    if let (Some(s), Some(e)) = (s.as_object_mut(), spec.as_object()) {
        s.extend(e.clone());
    }
    json!({"metadata": {"name": name}, "spec": s})
}

pub(super) fn node_of(st: &State, name: &str) -> Option<String> {
    get(st, "", "pods", name)["spec"]["nodeName"]
        .as_str()
        .map(str::to_string)
}

pub(super) fn set_taints(st: &State, node: &str, taints: Value) {
    let info = st.core("nodes");
    let mut n = verbs::get(st, &info, "", node).unwrap().value();
    n["spec"]["taints"] = taints;
    verbs::update(st, &info, "", node, n, &WriteOptions::default()).unwrap();
}
