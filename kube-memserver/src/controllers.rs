//! The controllers a real control plane runs next to the apiserver, reduced to what clients of
//! this server observe. Here: namespace termination, per-namespace defaults (the `default`
//! ServiceAccount, `kube-root-ca.crt`) and periodic watch bookmarks; Events expiring after
//! `--event-ttl` in `event_ttl.rs`; node lifecycle and pod GC
//! live in `node_lifecycle.rs`, endpoints in `endpoints.rs`, the CSR signers in
//! `certificates/signer.rs` (always on), the scheduler and the workload controllers in
//! `workloads/` (switched by `Config::workload_controllers`).

use std::sync::Arc;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::meta::set_path;
use super::state::State;
use super::store::Mutation;
use super::verbs::{self, DeleteOptions};

pub fn spawn_all(st: &Arc<State>, cancel: &CancellationToken) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = vec![
        tokio::spawn(bookmarks(st.clone(), cancel.clone())),
        tokio::spawn(super::node_lifecycle::run(st.clone(), cancel.clone())),
        tokio::spawn(super::endpoints::run(st.clone(), cancel.clone())),
        tokio::spawn(super::gc::run(st.clone(), cancel.clone())),
        tokio::spawn(namespaces(st.clone(), cancel.clone())),
        tokio::spawn(super::event_ttl::run(st.clone(), cancel.clone())),
        tokio::spawn(super::workloads::run(
            st.clone(),
            cancel.clone(),
            "csrsigning",
            super::certificates::signer_pass,
        )),
    ];
    if st.config.workload_controllers {
        use super::workloads::{
            self, daemonset, deployment, job, replicaset, scheduler, statefulset,
        };
        let passes: [(&'static str, workloads::Pass); 6] = [
            ("scheduler", scheduler::pass),
            ("deployment", deployment::pass),
            ("replicaset", replicaset::pass),
            ("daemonset", daemonset::pass),
            ("statefulset", statefulset::pass),
            ("job", job::pass),
        ];
        for (name, pass) in passes {
            tasks.push(tokio::spawn(workloads::run(
                st.clone(),
                cancel.clone(),
                name,
                pass,
            )));
        }
    }
    tasks
}

async fn bookmarks(st: Arc<State>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(st.config.bookmark_interval.max(MIN_PERIOD));
    tick.tick().await;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {
                for t in st.store.tables() {
                    t.send_bookmarks();
                }
            }
        }
    }
}

/// `tokio::time::interval` panics on a zero period.
pub(super) const MIN_PERIOD: std::time::Duration = std::time::Duration::from_millis(10);

async fn namespaces(st: Arc<State>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(st.config.namespace_sync_period.max(MIN_PERIOD));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => sync_namespaces(&st),
        }
    }
}

fn sync_namespaces(st: &State) {
    let ns_info = st.core("namespaces");
    for ns in st.table(&ns_info).all() {
        let name = ns.name().to_string();
        if !ns.deleting() {
            verbs::ensure_namespace_defaults(st, &name);
            continue;
        }
        let mut remaining = 0usize;
        for info in st.resources.all().iter().filter(|i| i.namespaced) {
            // Versions share a table: only visit each group/resource once.
            if st
                .resources
                .lookup_any_version(&info.group, &info.plural)
                .is_some_and(|p| p.version != info.version)
            {
                continue;
            }
            let table = st.table(info);
            for obj in table.in_namespace(&name) {
                remaining += 1;
                if !obj.deleting() {
                    let _ = verbs::delete(st, info, &name, obj.name(), &DeleteOptions::default());
                }
            }
        }
        if remaining == 0 {
            let _ = st
                .table(&ns_info)
                .mutate(&(String::new(), name.clone()), |cur| {
                    let Some(cur) = cur else {
                        return Ok(Mutation::Unchanged);
                    };
                    let finalizers = cur.value()["metadata"]["finalizers"]
                        .as_array()
                        .is_some_and(|f| !f.is_empty());
                    if finalizers {
                        let mut v = cur.value();
                        set_path(&mut v, &["spec", "finalizers"], json!([]));
                        return Ok(Mutation::Put(v));
                    }
                    Ok(Mutation::Remove)
                });
        }
    }
}
