//! The edge pods the watcher delivered lately, kept as compact JSON within a byte budget, so
//! that a resync sends an edge what changed while it was away without reading it again: after
//! a storm of reconnects, apiserver reads grow with what changed beyond the budget, not with
//! the nodes. Only a copy at exactly the resourceVersion the actor knows is used; anything
//! else is fetched (`fetch_pods.rs`). The oldest delivery goes first when the budget is full.
//!
//! The budget follows the edge pods known: a storm of reconnects comes with whatever changed
//! while the edges were away, which is a share of the cluster, not a number of pods. At
//! 1,000,000 pods a fixed 64 MB (about 40,000 pods) left the 95,000 pods a 100-second outage
//! changed to be read again from the API server in full lists of a million pods (BENCHMARKS.md,
//! the 100,000-edge storm); 192 bytes per pod known keeps about an eighth of them.

use crate::controller::location::ObjectKey;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};

/// The least budget: about 40,000 pods of 1.6 KB.
pub(super) const RECENT_BYTES: usize = 64 << 20;
/// Budget per edge pod known, beyond [`RECENT_BYTES`]: 192 MB at 1,000,000 pods.
pub(super) const RECENT_BYTES_PER_POD: usize = 192;

struct Recent {
    uid: String,
    rv: u64,
    json: Box<str>,
    seq: u64,
}

pub(super) struct RecentPods {
    limit: usize,
    /// The least `limit`, and what each pod known adds ([`Self::fit`]).
    floor: usize,
    per_pod: usize,
    bytes: usize,
    next: u64,
    map: HashMap<ObjectKey, Recent>,
    /// Deliveries oldest first; an entry whose `seq` is no longer the pod's is stale.
    order: VecDeque<(u64, ObjectKey)>,
}

impl Default for RecentPods {
    fn default() -> Self {
        RecentPods {
            per_pod: RECENT_BYTES_PER_POD,
            ..RecentPods::with_limit(RECENT_BYTES)
        }
    }
}

impl RecentPods {
    /// A fixed budget of `limit` bytes.
    pub(super) fn with_limit(limit: usize) -> Self {
        RecentPods {
            limit,
            floor: limit,
            per_pod: 0,
            bytes: 0,
            next: 0,
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Sizes the budget for `pods` edge pods known (dropping the oldest deliveries when it
    /// shrinks).
    pub(super) fn fit(&mut self, pods: usize) {
        let limit = self.floor.max(pods.saturating_mul(self.per_pod));
        if limit != self.limit {
            self.limit = limit;
            self.evict();
        }
    }

    /// The pod as delivered at `rv`.
    pub(super) fn put(&mut self, key: &ObjectKey, uid: &str, rv: u64, pod: &Value) {
        let json = pod.to_string().into_boxed_str();
        if json.len() > self.floor / 64 {
            self.remove(key);
            return;
        }
        self.next += 1;
        let seq = self.next;
        self.bytes += json.len();
        let entry = Recent {
            uid: uid.to_string(),
            rv,
            json,
            seq,
        };
        if let Some(old) = self.map.insert(key.clone(), entry) {
            self.bytes -= old.json.len();
        }
        self.order.push_back((seq, key.clone()));
        self.evict();
    }

    /// The copy of `key` at exactly `uid` and `rv`, if it is still kept.
    pub(super) fn get(&self, key: &ObjectKey, uid: &str, rv: u64) -> Option<Value> {
        let r = self.map.get(key)?;
        if r.uid != uid || r.rv != rv {
            return None;
        }
        serde_json::from_str(&r.json).ok()
    }

    pub(super) fn remove(&mut self, key: &ObjectKey) {
        if let Some(r) = self.map.remove(key) {
            self.bytes -= r.json.len();
        }
    }

    fn evict(&mut self) {
        while let Some((seq, key)) = self.order.front() {
            let live = self.map.get(key).is_some_and(|r| r.seq == *seq);
            if live && self.bytes <= self.limit {
                break;
            }
            if let Some((_, key)) = self.order.pop_front()
                && live
            {
                self.remove(&key);
            }
        }
        // Stale entries behind a live one: compact now and then.
        if self.order.len() > 4 * self.map.len() + 4096 {
            let map = &self.map;
            self.order
                .retain(|(seq, key)| map.get(key).is_some_and(|r| r.seq == *seq));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(n: &str) -> ObjectKey {
        ("ns".into(), n.into())
    }

    #[test]
    fn the_budget_follows_the_pods_known_above_its_floor() {
        let mut r = RecentPods::default();
        r.fit(1_000_000);
        assert_eq!(r.limit, 192_000_000);
        r.fit(10);
        assert_eq!(r.limit, RECENT_BYTES);
        // A fixed budget stays fixed (tests use 0 to keep nothing).
        let mut fixed = RecentPods::with_limit(0);
        fixed.fit(1_000_000);
        assert_eq!(fixed.limit, 0);
        // Shrinking drops the oldest deliveries down to the new budget.
        let pod = json!({"metadata": {"name": "x"}, "spec": {"x": "y".repeat(1000)}});
        let mut r = RecentPods {
            per_pod: 1000,
            ..RecentPods::with_limit(0)
        };
        r.floor = 64 * 2000; // entries of ~1 KB are kept
        r.fit(1000);
        for i in 0..500 {
            r.put(&key(&format!("p{i}")), "u", 1, &pod);
        }
        assert_eq!(r.map.len(), 500);
        r.fit(0);
        assert!(r.bytes <= 64 * 2000, "{}", r.bytes);
        assert!(r.get(&key("p499"), "u", 1).is_some(), "the newest went");
        assert!(r.get(&key("p0"), "u", 1).is_none(), "the oldest stayed");
    }

    #[test]
    fn only_the_exact_version_is_served_and_the_oldest_goes_first() {
        let pod = |n: &str| json!({"metadata": {"name": n}, "spec": {"x": "y".repeat(100)}});
        let size = pod("a").to_string().len();
        let mut r = RecentPods::with_limit(size * 64 * 2 + 10);
        r.put(&key("a"), "u1", 5, &pod("a"));
        assert_eq!(r.get(&key("a"), "u1", 5), Some(pod("a")));
        assert_eq!(r.get(&key("a"), "u1", 6), None);
        assert_eq!(r.get(&key("a"), "u2", 5), None);
        // A newer delivery replaces the older one.
        r.put(&key("a"), "u1", 6, &pod("a"));
        assert_eq!(r.get(&key("a"), "u1", 5), None);
        assert!(r.get(&key("a"), "u1", 6).is_some());
        // Over the budget, the oldest delivery is dropped.
        for i in 0..200 {
            r.put(&key(&format!("p{i}")), "u", 1, &pod("a"));
        }
        assert!(r.bytes <= r.limit, "{} > {}", r.bytes, r.limit);
        assert_eq!(r.get(&key("a"), "u1", 6), None);
        assert!(r.get(&key("p199"), "u", 1).is_some());
        // Repeated deliveries of one pod do not let the order grow without bound.
        for rv in 0..20_000 {
            r.put(&key("p199"), "u", rv, &pod("a"));
        }
        assert!(r.order.len() <= 4 * r.map.len() + 4097, "{}", r.order.len());
        r.remove(&key("p199"));
        assert_eq!(r.get(&key("p199"), "u", 19_999), None);
    }
}
