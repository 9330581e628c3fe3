//! LocationCache: which edge nodes need which configmap and secret.
//!
//! Unlike KubeEdge's, entries go away when the pods that caused them do (or their node is
//! deleted), so a configmap change is never sent to a node that no longer uses it; instead the
//! node is told to drop its copy ([`Released`]), which would otherwise go stale there.

use super::refs::PodRefs;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `namespace/name` of a namespaced object.
pub type ObjectKey = (String, String);

#[derive(Default)]
pub struct LocationCache {
    /// pod key → (node, what it references)
    pods: HashMap<ObjectKey, (String, PodRefs)>,
    /// node → its pods (so per-node work does not scan every pod)
    by_node: HashMap<String, HashSet<ObjectKey>>,
    /// configmap key → node → number of pods on that node referencing it
    configmaps: HashMap<ObjectKey, HashMap<String, u32>>,
    secrets: HashMap<ObjectKey, HashMap<String, u32>>,
}

fn add(map: &mut HashMap<ObjectKey, HashMap<String, u32>>, key: ObjectKey, node: &str) {
    *map.entry(key)
        .or_default()
        .entry(node.to_string())
        .or_default() += 1;
}

/// Drops one reference; true when it was the node's last one.
fn remove(map: &mut HashMap<ObjectKey, HashMap<String, u32>>, key: &ObjectKey, node: &str) -> bool {
    let mut last = false;
    if let Some(nodes) = map.get_mut(key) {
        if let Some(n) = nodes.get_mut(node) {
            *n -= 1;
            if *n == 0 {
                nodes.remove(node);
                last = true;
            }
        }
        if nodes.is_empty() {
            map.remove(key);
        }
    }
    last
}

/// Configmaps and secrets no pod on `node` references any more: the node should not keep them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Released {
    pub node: String,
    pub configmaps: Vec<ObjectKey>,
    pub secrets: Vec<ObjectKey>,
}

impl LocationCache {
    /// Records (or replaces) what a pod on `node` references; returns what the node no longer
    /// uses because of the change.
    pub fn set_pod(&mut self, pod: ObjectKey, node: &str, refs: PodRefs) -> Released {
        let mut released = self.remove_pod(&pod);
        let ns = pod.0.clone();
        for cm in &refs.configmaps {
            add(&mut self.configmaps, (ns.clone(), cm.clone()), node);
        }
        for s in &refs.secrets {
            add(&mut self.secrets, (ns.clone(), s.clone()), node);
        }
        self.by_node
            .entry(node.to_string())
            .or_default()
            .insert(pod.clone());
        self.pods.insert(pod, (node.to_string(), refs));
        released
            .configmaps
            .retain(|k| !self.node_uses(&released.node, k, false));
        released
            .secrets
            .retain(|k| !self.node_uses(&released.node, k, true));
        released
    }

    /// Forgets a pod; returns what its node no longer uses.
    pub fn remove_pod(&mut self, pod: &ObjectKey) -> Released {
        let Some((node, refs)) = self.pods.remove(pod) else {
            return Released::default();
        };
        if let Some(keys) = self.by_node.get_mut(&node) {
            keys.remove(pod);
            if keys.is_empty() {
                self.by_node.remove(&node);
            }
        }
        let mut released = Released::default();
        for cm in &refs.configmaps {
            let key = (pod.0.clone(), cm.clone());
            if remove(&mut self.configmaps, &key, &node) {
                released.configmaps.push(key);
            }
        }
        for s in &refs.secrets {
            let key = (pod.0.clone(), s.clone());
            if remove(&mut self.secrets, &key, &node) {
                released.secrets.push(key);
            }
        }
        released.node = node;
        released
    }

    /// Forgets every pod of a deleted node; returns them.
    pub fn remove_node(&mut self, node: &str) -> Vec<ObjectKey> {
        let pods: Vec<ObjectKey> = self
            .by_node
            .remove(node)
            .unwrap_or_default()
            .into_iter()
            .collect();
        for p in &pods {
            self.remove_pod(p);
        }
        pods
    }

    /// The pods on an edge node.
    pub fn pods_of(&self, node: &str) -> Vec<ObjectKey> {
        self.by_node
            .get(node)
            .map(|keys| keys.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The edge node a pod is bound to, if it is on one.
    pub fn pod_node(&self, pod: &ObjectKey) -> Option<&str> {
        self.pods.get(pod).map(|(node, _)| node.as_str())
    }

    /// Whether a pod on `node` references this configmap (or secret, with `secret`).
    pub fn node_uses(&self, node: &str, key: &ObjectKey, secret: bool) -> bool {
        let map = if secret {
            &self.secrets
        } else {
            &self.configmaps
        };
        map.get(key).is_some_and(|nodes| nodes.contains_key(node))
    }

    pub fn configmap_nodes(&self, key: &ObjectKey) -> BTreeSet<String> {
        self.configmaps
            .get(key)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    pub fn secret_nodes(&self, key: &ObjectKey) -> BTreeSet<String> {
        self.secrets
            .get(key)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Configmaps and secrets `node` needs (for a resync).
    pub fn node_objects(&self, node: &str) -> (BTreeSet<ObjectKey>, BTreeSet<ObjectKey>) {
        let mut cms = BTreeSet::new();
        let mut secrets = BTreeSet::new();
        for key in self.by_node.get(node).into_iter().flatten() {
            if let Some((_, refs)) = self.pods.get(key) {
                let ns = &key.0;
                cms.extend(refs.configmaps.iter().map(|c| (ns.clone(), c.clone())));
                secrets.extend(refs.secrets.iter().map(|s| (ns.clone(), s.clone())));
            }
        }
        (cms, secrets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(cms: &[&str], secrets: &[&str]) -> PodRefs {
        PodRefs {
            configmaps: cms.iter().map(|s| s.to_string()).collect(),
            secrets: secrets.iter().map(|s| s.to_string()).collect(),
            service_account: None,
        }
    }

    fn k(ns: &str, n: &str) -> ObjectKey {
        (ns.into(), n.into())
    }

    #[test]
    fn entries_follow_pods() {
        let mut lc = LocationCache::default();
        lc.set_pod(k("ns", "p1"), "edge-1", refs(&["cfg"], &["s"]));
        lc.set_pod(k("ns", "p2"), "edge-1", refs(&["cfg"], &[]));
        lc.set_pod(k("ns", "p3"), "edge-2", refs(&["cfg"], &[]));
        assert_eq!(lc.configmap_nodes(&k("ns", "cfg")).len(), 2);
        assert!(
            lc.configmap_nodes(&k("other", "cfg")).is_empty(),
            "namespaced"
        );
        lc.remove_pod(&k("ns", "p1"));
        assert!(
            lc.configmap_nodes(&k("ns", "cfg")).contains("edge-1"),
            "p2 still uses it"
        );
        assert!(lc.secret_nodes(&k("ns", "s")).is_empty());
        lc.remove_pod(&k("ns", "p2"));
        assert_eq!(
            lc.configmap_nodes(&k("ns", "cfg"))
                .into_iter()
                .collect::<Vec<_>>(),
            ["edge-2"]
        );
        lc.remove_node("edge-2");
        assert!(lc.configmap_nodes(&k("ns", "cfg")).is_empty());
    }

    #[test]
    fn the_last_pod_of_a_node_releases_what_it_used() {
        let mut lc = LocationCache::default();
        lc.set_pod(k("ns", "p1"), "edge-1", refs(&["cfg"], &["s"]));
        lc.set_pod(k("ns", "p2"), "edge-1", refs(&["cfg"], &[]));
        lc.set_pod(k("ns", "p3"), "edge-2", refs(&["cfg"], &["s"]));
        let r = lc.remove_pod(&k("ns", "p1"));
        assert_eq!(r.node, "edge-1");
        assert!(r.configmaps.is_empty(), "p2 on edge-1 still uses cfg");
        assert_eq!(r.secrets, [k("ns", "s")], "edge-2's use does not count");
        let r = lc.remove_pod(&k("ns", "p2"));
        assert_eq!(r.configmaps, [k("ns", "cfg")]);
        assert_eq!(lc.remove_pod(&k("ns", "gone")), Released::default());
    }

    #[test]
    fn updating_a_pod_replaces_its_references() {
        let mut lc = LocationCache::default();
        lc.set_pod(k("ns", "p"), "edge-1", refs(&["old"], &[]));
        let r = lc.set_pod(k("ns", "p"), "edge-1", refs(&["new", "old2"], &[]));
        assert_eq!(r.configmaps, [k("ns", "old")]);
        let r = lc.set_pod(k("ns", "p"), "edge-1", refs(&["new"], &[]));
        assert_eq!(r.configmaps, [k("ns", "old2")], "still used ones are kept");
        assert!(lc.configmap_nodes(&k("ns", "old")).is_empty());
        assert_eq!(lc.configmap_nodes(&k("ns", "new")).len(), 1);
        let (cms, _) = lc.node_objects("edge-1");
        assert_eq!(cms.into_iter().collect::<Vec<_>>(), [k("ns", "new")]);
    }
}

/// The location cache the downstream actor keeps, readable by the upstream handler (which
/// restricts what an edge may touch to what its pods use), and whether it is complete yet
/// (the informers have synced).
#[derive(Clone, Default)]
pub struct SharedLocation {
    cache: Arc<RwLock<LocationCache>>,
    synced: Arc<AtomicBool>,
}

impl SharedLocation {
    pub fn read(&self) -> RwLockReadGuard<'_, LocationCache> {
        self.cache.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, LocationCache> {
        self.cache.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
}
