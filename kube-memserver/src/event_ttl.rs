//! Events expire (kube-apiserver `--event-ttl`, default one hour): the real apiserver stores
//! every Event write with an etcd lease of that TTL, so an Event goes that long after its last
//! write, and watchers see it deleted. Without it a long-running cluster's Events pile up
//! (a pod churning edge writes several per pod).
//!
//! Here a sweep notes when it first saw each Event at its current resourceVersion (its last
//! write, to within a sweep) and removes those older than the TTL; a removal rechecks the
//! resourceVersion, so an Event written meanwhile stays.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::controllers::MIN_PERIOD;
use super::state::State;
use super::store::{Mutation, ObjKey, Outcome};

/// The longest between sweeps; shorter TTLs (tests) sweep a twelfth of the TTL apart.
const MAX_SWEEP: Duration = Duration::from_secs(60);

pub async fn run(st: Arc<State>, cancel: CancellationToken) {
    let ttl = st.config.event_ttl;
    let mut tick = tokio::time::interval((ttl / 12).clamp(MIN_PERIOD, MAX_SWEEP));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut written: HashMap<ObjKey, (u64, Instant)> = HashMap::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {
                sweep(&st, ttl, &mut written, Instant::now());
            }
        }
    }
}

/// Removes the Events last written `ttl` or more before `now`; returns how many.
fn sweep(
    st: &State,
    ttl: Duration,
    written: &mut HashMap<ObjKey, (u64, Instant)>,
    now: Instant,
) -> usize {
    let table = st.table(&st.core("events"));
    let mut seen: HashMap<ObjKey, (u64, Instant)> = HashMap::with_capacity(written.len());
    let mut expired = Vec::new();
    for obj in table.all() {
        let key: ObjKey = (obj.namespace().to_string(), obj.name().to_string());
        let since = match written.get(&key) {
            Some(&(rv, at)) if rv == obj.rv => at,
            _ => now,
        };
        if now.duration_since(since) >= ttl {
            expired.push((key, obj.rv));
        } else {
            seen.insert(key, (obj.rv, since));
        }
    }
    *written = seen;
    let mut removed = 0;
    for (key, rv) in expired {
        let r = table.mutate(&key, |cur| match cur {
            Some(cur) if cur.rv == rv => Ok(Mutation::Remove),
            _ => Ok(Mutation::Unchanged),
        });
        if matches!(r, Ok(Outcome::Removed(_))) {
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::debug!(removed, "events expired (event TTL)");
    }
    removed
}
