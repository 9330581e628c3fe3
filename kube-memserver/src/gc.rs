//! The garbage collector: deletes objects whose owners (`metadata.ownerReferences`) are all
//! gone (background propagation), deletes the dependents of owners deleted with foreground
//! propagation before letting them go (`foregroundDeletion` finalizer), and strips owner
//! references from the dependents of owners deleted with orphan propagation (`orphan`).
//! A pass runs only after a removal or a deletion that starts propagation, or while such
//! finalizers are pending.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::controllers::MIN_PERIOD;
use super::meta::set_path;
use super::resources::ResourceInfo;
use super::state::State;
use super::store::{Mutation, Obj, Table};
use super::verbs::{self, DeleteOptions};

pub const FOREGROUND: &str = "foregroundDeletion";
pub const ORPHAN: &str = "orphan";

pub async fn run(st: Arc<State>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(st.config.gc_period.max(MIN_PERIOD));
    let mut seen = u64::MAX;
    let mut pending = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {
                // A removal may leave dependents without owners; a deletion with foreground or
                // orphan propagation counts too (it removes nothing at first).
                let deletions = st.store.deletions();
                if deletions != seen || pending {
                    seen = deletions;
                    pending = collect(&st);
                }
            }
        }
    }
}

/// One pass. Returns whether foreground/orphan finalizers are still pending.
fn collect(st: &State) -> bool {
    let tables: Vec<(Arc<ResourceInfo>, Arc<Table>)> = st
        .store
        .tables()
        .into_iter()
        .filter_map(|t| {
            let (g, r) = t.group_resource().clone();
            st.resources.lookup_any_version(&g, &r).map(|i| (i, t))
        })
        .collect();
    let all: Vec<(Arc<ResourceInfo>, Arc<Obj>)> = tables
        .iter()
        .flat_map(|(i, t)| t.all().into_iter().map(move |o| (i.clone(), o)))
        .collect();
    // Nothing owned and nothing waiting on propagation: nothing to do.
    let relevant = all.iter().any(|(_, o)| {
        o.owners().next().is_some()
            || (o.deleting() && (o.has_finalizer(FOREGROUND) || o.has_finalizer(ORPHAN)))
    });
    if !relevant {
        return false;
    }
    let alive: HashSet<&str> = all.iter().map(|(_, o)| o.uid()).collect();
    let foreground: HashSet<&str> = all
        .iter()
        .filter(|(_, o)| o.deleting() && o.has_finalizer(FOREGROUND))
        .map(|(_, o)| o.uid())
        .collect();
    let orphaning: HashSet<&str> = all
        .iter()
        .filter(|(_, o)| o.deleting() && o.has_finalizer(ORPHAN))
        .map(|(_, o)| o.uid())
        .collect();
    let mut dependents: HashMap<&str, usize> = HashMap::new();
    for (info, o) in &all {
        let owners: Vec<&str> = o.owners().collect();
        if owners.is_empty() {
            continue;
        }
        for u in &owners {
            *dependents.entry(*u).or_default() += 1;
        }
        let orphan_of: Vec<&str> = owners
            .iter()
            .copied()
            .filter(|u| orphaning.contains(u))
            .collect();
        if !orphan_of.is_empty() {
            strip_owners(info, o, &orphan_of, st);
            continue;
        }
        let all_gone = owners.iter().all(|u| !alive.contains(u));
        let owner_in_foreground = owners.iter().any(|u| foreground.contains(u));
        if (all_gone || owner_in_foreground) && !o.deleting() {
            let opts = DeleteOptions {
                propagation_policy: owner_in_foreground.then(|| "Foreground".to_string()),
                ..Default::default()
            };
            tracing::debug!(kind = %info.kind, name = o.name(), "garbage-collecting a dependent");
            let _ = verbs::delete(st, info, o.namespace(), o.name(), &opts);
        }
    }
    let mut pending = false;
    for (info, o) in &all {
        let done_foreground = foreground.contains(o.uid()) && !dependents.contains_key(o.uid());
        let done_orphan = orphaning.contains(o.uid());
        if done_foreground || done_orphan {
            remove_finalizers(info, o, st, done_foreground, done_orphan);
        }
        if foreground.contains(o.uid()) || orphaning.contains(o.uid()) {
            pending = true;
        }
    }
    pending
}

fn strip_owners(info: &ResourceInfo, o: &Obj, owners: &[&str], st: &State) {
    let _ = st.table(info).mutate(&o.key(), |cur| {
        let Some(cur) = cur else {
            return Ok(Mutation::Unchanged);
        };
        let mut v = cur.value();
        let refs: Vec<Value> = v["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| !r["uid"].as_str().is_some_and(|u| owners.contains(&u)))
            .cloned()
            .collect();
        if refs.is_empty() {
            super::meta::remove_path(&mut v, &["metadata", "ownerReferences"]);
        } else {
            set_path(&mut v, &["metadata", "ownerReferences"], Value::Array(refs));
        }
        Ok(Mutation::Put(v))
    });
}

fn remove_finalizers(info: &ResourceInfo, o: &Obj, st: &State, foreground: bool, orphan: bool) {
    let _ = st.table(info).mutate(&o.key(), |cur| {
        let Some(cur) = cur else {
            return Ok(Mutation::Unchanged);
        };
        let mut v = cur.value();
        let fins: Vec<Value> = v["metadata"]["finalizers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| !((foreground && *f == FOREGROUND) || (orphan && *f == ORPHAN)))
            .cloned()
            .collect();
        let done = fins.is_empty()
            && v["metadata"]["deletionGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(0)
                == 0;
        if fins.is_empty() {
            super::meta::remove_path(&mut v, &["metadata", "finalizers"]);
        } else {
            set_path(&mut v, &["metadata", "finalizers"], Value::Array(fins));
        }
        Ok(if done {
            Mutation::Remove
        } else {
            Mutation::Put(v)
        })
    });
}
