//! Policy controller benchmark (the MetaServer's RBAC, `cloudcore/src/controller/policy`) at
//! edge-fleet scale, on the controller's state machine alone (no API server, a counting
//! cloudhub). Prints numbers; asserts nothing.
//!
//!     cargo build --profile bench-fast -p e2e
//!     target/bench-fast/bench-policy
//!
//! `BENCH_NODES` (default 100000) connected edge nodes, each with three pods in one of
//! `BENCH_NAMESPACES` (default 100) namespaces: two run as `default`, one as `app`. Every
//! namespace has a Role + RoleBinding for `app`; two ClusterRoleBindings name groups
//! (`system:serviceaccounts`, `system:authenticated`). Measured:
//! - the first pass (every node gets its ServiceAccountAccess objects): time, messages;
//! - cloudcore RSS growth for the controller's state (pods, RBAC, what each node was sent);
//! - one RoleBinding changed (one namespace's `app` accounts): time of the pass over all
//!   nodes and the messages it sends (only the nodes using that account);
//! - one ClusterRole changed (every account): time and messages.

use cloudcore::cloudhub::Enqueued;
use cloudcore::cloudhub::HubSink;
use cloudcore::cloudhub::{Capabilities, SendError};
use cloudcore::controller::{PodRef, Policy, PolicyChange as Change, PolicyInput as Input};
use e2e::bench::env_usize;
use e2e::procfs::rss_kb;
use kubeedge_shared::Message;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[derive(Default)]
struct Counter {
    sent: AtomicU64,
    bytes: AtomicU64,
}

impl HubSink for Counter {
    fn send(&self, _node: &str, msg: Message) -> Result<Enqueued, SendError> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.bytes
            .fetch_add(msg.content.to_string().len() as u64, Ordering::Relaxed);
        Ok(Enqueued::Queued)
    }
    fn is_connected(&self, _node: &str) -> bool {
        true
    }
    fn connected_nodes(&self) -> Vec<String> {
        Vec::new()
    }
    fn capabilities(&self, _node: &str) -> Option<Capabilities> {
        None
    }
    fn disconnect(&self, _node: &str) -> bool {
        false
    }
}

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

fn role(ns: &str, verbs: &[&str]) -> Input {
    Input::Roles(Change::Applied(from(json!({
        "metadata": {"name": "app-reader", "namespace": ns},
        "rules": [{"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": verbs}]}))))
}

fn cluster_role(verbs: &[&str]) -> Input {
    Input::ClusterRoles(Change::Applied(from(json!({
        "metadata": {"name": "edge-discovery"},
        "rules": [{"nonResourceURLs": ["/api", "/apis", "/version"], "verbs": verbs}]}))))
}

fn main() {
    e2e::bench::env_configured_cli(include_str!("bench-policy.rs"));
    let nodes = env_usize("BENCH_NODES", 100_000);
    let namespaces = env_usize("BENCH_NAMESPACES", 100).max(1);
    let hub = Arc::new(Counter::default());
    let rss_before = rss_kb(std::process::id());
    let mut policy = Policy::new(hub.clone());
    let ns = |i: usize| format!("ns-{}", i % namespaces);

    for n in 0..namespaces {
        let ns = format!("ns-{n}");
        for sa in ["default", "app"] {
            policy.apply(Input::ServiceAccounts(Change::Applied(from(json!({
                "metadata": {"name": sa, "namespace": ns, "uid": format!("{ns}-{sa}")}})))));
        }
        policy.apply(role(&ns, &["get", "list"]));
        policy.apply(Input::RoleBindings(Change::Applied(from(json!({
            "metadata": {"name": "app-reader", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "app-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": ns}]})))));
    }
    policy.apply(cluster_role(&["get"]));
    for (i, group) in ["system:serviceaccounts", "system:authenticated"]
        .iter()
        .enumerate()
    {
        policy.apply(Input::ClusterRoleBindings(Change::Applied(from(json!({
            "metadata": {"name": format!("edge-discovery-{i}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edge-discovery"},
            "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": group}]})))));
    }
    for i in 0..nodes {
        let node = format!("edge-{i}");
        for (p, sa) in ["default", "default", "app"].iter().enumerate() {
            policy.apply(Input::Pods(Change::Applied(PodRef {
                namespace: ns(i),
                name: format!("pod-{i}-{p}"),
                node: node.clone(),
                service_account: sa.to_string(),
            })));
        }
    }
    for listed in [
        Input::Pods(Change::Listed),
        Input::ServiceAccounts(Change::Listed),
        Input::Roles(Change::Listed),
        Input::RoleBindings(Change::Listed),
        Input::ClusterRoles(Change::Listed),
        Input::ClusterRoleBindings(Change::Listed),
    ] {
        policy.apply(listed);
    }

    let rss_loaded = rss_kb(std::process::id());
    let started = Instant::now();
    policy.flush();
    let first = started.elapsed();
    let sent_first = hub.sent.swap(0, Ordering::Relaxed);
    let bytes_first = hub.bytes.swap(0, Ordering::Relaxed);
    let rss_after = rss_kb(std::process::id());

    policy.apply(role("ns-0", &["get", "list", "watch"]));
    let started = Instant::now();
    policy.flush();
    let one_binding = started.elapsed();
    let sent_binding = hub.sent.swap(0, Ordering::Relaxed);

    policy.apply(cluster_role(&["get", "list"]));
    let started = Instant::now();
    policy.flush();
    let cluster_wide = started.elapsed();
    let sent_cluster = hub.sent.swap(0, Ordering::Relaxed);

    println!("bench-policy: {nodes} edge nodes, 3 pods each, {namespaces} namespaces");
    println!(
        "first pass: {:.2} s, {sent_first} ServiceAccountAccess messages ({:.1} MB of content)",
        first.as_secs_f64(),
        bytes_first as f64 / 1e6
    );
    let per_node = |kb: u64| kb as f64 * 1024.0 / nodes.max(1) as f64;
    println!(
        "controller state: RSS +{:.1} MB ({:.0} bytes per node: {:.0} for pods and RBAC, {:.0} after the first pass)",
        rss_after.saturating_sub(rss_before) as f64 / 1024.0,
        per_node(rss_after.saturating_sub(rss_before)),
        per_node(rss_loaded.saturating_sub(rss_before)),
        per_node(rss_after.saturating_sub(rss_loaded)),
    );
    println!(
        "one Role changed: pass {:.1} ms, {sent_binding} messages",
        one_binding.as_secs_f64() * 1e3
    );
    println!(
        "one ClusterRole changed: pass {:.2} s, {sent_cluster} messages",
        cluster_wide.as_secs_f64()
    );
}
