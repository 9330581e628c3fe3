//! Edge nodes and the pods bound to them.
//!
//! A node's pods are *known* once a pod list that ran while the node was known as an edge node
//! has been applied: the pod watcher's first list (unless it passed pods of the node over
//! before the node list named it), or a list of that node's pods asked for when it became an
//! edge node. Only a known node's inventory is answered (`resync.rs`): before that, the
//! actor cannot tell a pod the node should drop from one it has not heard of yet.

use super::{Downstream, Fetch, object_key, parse_rv};
use crate::controller::kind::Kind;
use crate::controller::location::{ObjectKey, Released};
use crate::controller::refs::pod_refs;
use crate::controller::rest::with_type_meta;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher::Event;
use kubeedge_shared::{Operation, ResourceType};
use serde_json::Value;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many deleted pod UIDs are remembered, and for how long.
const DELETED_KEPT: usize = 20_000;
const DELETED_FOR: Duration = Duration::from_secs(300);

/// What the actor keeps of a pod on an edge node: not the object (a million pods would cost
/// gigabytes), only what tells whether an edge's copy is current. A resync that must send
/// pods fetches them (`resync.rs`); deletes carry the pod's identity only.
pub(super) struct EdgePod {
    /// Shared with every pod of the node (`EdgePods::edge_nodes`).
    pub node: Arc<str>,
    pub uid: String,
    pub rv: u64,
    /// Hash of metadata (minus volatile fields) and spec: status-only changes are not sent.
    fingerprint: u64,
}

/// What the actor knows about edge nodes and their pods.
#[derive(Default)]
pub(super) struct EdgePods {
    pub edge_nodes: HashSet<Arc<str>>,
    pub pods: HashMap<ObjectKey, EdgePod>,
    /// Edge nodes whose pods are all known (see the module doc).
    pub known: HashSet<String>,
    /// Edge nodes whose pod list was asked for: the generation of the list that will make
    /// them known (a node deleted and added again asks anew).
    listing: HashMap<String, u64>,
    next_generation: u64,
    /// Nodes of pods the pod watcher's first list passed while the node was not (yet) known
    /// as an edge node: the node list may arrive after the pod list.
    skipped_before_sync: HashSet<String>,
    /// UIDs of pods deleted lately: a node's pod list that answers after a pod's delete event
    /// must not bring the pod back.
    deleted: DeletedPods,
    /// Pods delivered lately, as delivered (a resync sends them without a read).
    pub recent: super::recent_pods::RecentPods,
    /// `cloud-lease` edges sent their Node since it was last marked Unknown.
    pub told_unknown: HashSet<String>,
    /// The newest resourceVersion the pod watcher delivered: the cluster-wide pod view is
    /// complete up to it (watch events come in resourceVersion order, a list is a snapshot).
    pub max_rv: u64,
}

/// Recently deleted pod UIDs (a UID never comes back once deleted); at most [`DELETED_KEPT`]
/// for [`DELETED_FOR`].
#[derive(Default)]
struct DeletedPods {
    order: VecDeque<(Instant, String)>,
    uids: HashSet<String>,
}

impl DeletedPods {
    fn insert(&mut self, uid: &str) {
        let now = Instant::now();
        while self.order.front().is_some_and(|(t, _)| {
            now.duration_since(*t) > DELETED_FOR || self.uids.len() >= DELETED_KEPT
        }) {
            if let Some((_, old)) = self.order.pop_front() {
                self.uids.remove(&old);
            }
        }
        if self.uids.insert(uid.to_string()) {
            self.order.push_back((now, uid.to_string()));
        }
    }

    fn contains(&self, uid: &str) -> bool {
        self.uids.contains(uid)
    }
}

impl Downstream {
    pub(super) fn on_node(&mut self, ev: Event<Node>) {
        match ev {
            Event::Init => {
                self.relisting.insert(Kind::Node, HashSet::new());
            }
            Event::InitApply(n) | Event::Apply(n) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                if let Some(seen) = self.relisting.get_mut(&Kind::Node) {
                    seen.insert((String::new(), name.clone()));
                }
                self.tell_if_marked_unknown(&name, &n);
                let connected = self.hub.is_connected(&name);
                if let Some((node, object)) = self.node_push.observe(&n, connected) {
                    self.send_node(&node, object);
                }
                if self.pods.edge_nodes.insert(Arc::from(name.as_str())) {
                    self.edge_node_added(name);
                }
            }
            Event::Delete(n) => {
                self.remove_edge_node(n.metadata.name.as_deref().unwrap_or_default())
            }
            Event::InitDone => {
                let seen = self.relisting.remove(&Kind::Node).unwrap_or_default();
                let gone: Vec<String> = self
                    .pods
                    .edge_nodes
                    .iter()
                    .filter(|n| !seen.contains(&(String::new(), n.to_string())))
                    .map(|n| n.to_string())
                    .collect();
                for n in gone {
                    self.remove_edge_node(&n);
                }
                self.mark_synced(Kind::Node);
                self.answer_pending();
            }
        }
    }

    /// An edge whose Lease this cloudcore renews (`cloud-lease`) reports its status only when
    /// it changes: when the cluster marks it Unknown (its Lease went stale, e.g. while the
    /// apiserver was unreachable) it is sent its Node, once per such episode, and reports
    /// again.
    fn tell_if_marked_unknown(&mut self, name: &str, node: &Node) {
        let unknown = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.status == "Unknown"));
        if !unknown {
            self.pods.told_unknown.remove(name);
            return;
        }
        let cloud_lease = self
            .hub
            .capabilities(name)
            .is_some_and(|c| c.cloud_lease.is_some());
        if !cloud_lease || !self.pods.told_unknown.insert(name.to_string()) {
            return;
        }
        let Ok(value) = serde_json::to_value(node) else {
            return;
        };
        let mut value = with_type_meta(value, Kind::Node);
        if let Some(m) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
        tracing::info!(
            node = name,
            "edge node marked Unknown while connected; asking it to report"
        );
        self.send(
            name,
            Operation::Update,
            ResourceType::Node,
            "default",
            name,
            value,
        );
    }

    /// A node just became an edge node: its existing pods were passed over until now.
    fn edge_node_added(&mut self, node: String) {
        if self.synced.contains(&Kind::Pod) {
            self.list_pods_of(node);
        }
        // Otherwise the pod watcher's first list is still running: it includes them, and
        // what it passed over is listed when it completes.
    }

    fn remove_edge_node(&mut self, node: &str) {
        self.node_push.removed(node);
        if !self.pods.edge_nodes.remove(node) {
            return;
        }
        tracing::info!(node, "edge node deleted; ending its session");
        if let Some(records) = &self.records {
            records.node_deleted(node);
        }
        let keys = self.location.write().remove_node(node);
        for key in keys {
            self.pods.pods.remove(&key);
            self.pods.recent.remove(&key);
        }
        self.pods.known.remove(node);
        self.pods.listing.remove(node);
        self.forget_session(node);
        self.hub.disconnect(node);
    }

    /// Asks for every pod bound to `node`; [`Self::pods_listed`] takes the answer.
    fn list_pods_of(&mut self, node: String) {
        let generation = self.pods.next_generation;
        self.pods.next_generation += 1;
        self.pods.listing.insert(node.clone(), generation);
        if self.fetch.send(Fetch::PodsOf { node, generation }).is_err() {
            tracing::debug!("fetcher gone (shutting down)");
        }
    }

    pub(super) fn pods_listed(
        &mut self,
        node: &str,
        generation: u64,
        pods: Vec<Pod>,
        complete: bool,
    ) {
        for pod in pods {
            self.pod_applied(pod);
        }
        if complete
            && self.pods.edge_nodes.contains(node)
            && self.pods.listing.get(node) == Some(&generation)
        {
            self.pods.listing.remove(node);
            self.pods.known.insert(node.to_string());
            self.answer_pending_of(node);
        }
    }

    pub(super) fn on_pod(&mut self, ev: Event<Pod>) {
        match ev {
            Event::Init => {
                self.relisting.insert(Kind::Pod, HashSet::new());
            }
            Event::InitApply(p) | Event::Apply(p) => {
                self.saw_pod_version(&p);
                self.pod_applied(p)
            }
            Event::Delete(p) => {
                self.saw_pod_version(&p);
                if let Some(uid) = &p.metadata.uid {
                    self.pods.deleted.insert(uid);
                }
                self.pod_deleted(&p)
            }
            Event::InitDone => {
                let seen = self.relisting.remove(&Kind::Pod).unwrap_or_default();
                let gone: Vec<ObjectKey> = self
                    .pods
                    .pods
                    .keys()
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                for k in gone {
                    if let Some((p, released)) = self.remove_pod_entry(&k) {
                        self.pods.deleted.insert(&p.uid);
                        self.send_pod(&p.node, Operation::Delete, &k, pod_stub(&k, &p.uid));
                        self.send_released(released);
                    }
                }
                let first = !self.synced.contains(&Kind::Pod);
                self.mark_synced(Kind::Pod);
                if first {
                    // Every edge node known now had its pods in this list, except those whose
                    // pods were passed over before the node list named the node.
                    let skipped = std::mem::take(&mut self.pods.skipped_before_sync);
                    let nodes: Vec<String> =
                        self.pods.edge_nodes.iter().map(|n| n.to_string()).collect();
                    for node in nodes {
                        if skipped.contains(&node) {
                            self.list_pods_of(node);
                        } else if !self.pods.listing.contains_key(&node) {
                            self.pods.known.insert(node);
                        }
                    }
                }
                self.answer_pending();
            }
        }
    }

    fn saw_pod_version(&mut self, pod: &Pod) {
        let rv = parse_rv(pod.metadata.resource_version.as_deref());
        self.pods.max_rv = self.pods.max_rv.max(rv);
    }

    fn pod_applied(&mut self, pod: Pod) {
        let key = object_key(&pod.metadata);
        if let Some(seen) = self.relisting.get_mut(&Kind::Pod) {
            seen.insert(key.clone());
        }
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return;
        };
        if pod
            .metadata
            .uid
            .as_deref()
            .is_some_and(|u| self.pods.deleted.contains(u))
        {
            return; // a stale copy of a deleted pod (a list that answered late)
        }
        let Some(node) = self.pods.edge_nodes.get(node.as_str()).cloned() else {
            if !self.synced.contains(&Kind::Pod) {
                self.pods.skipped_before_sync.insert(node);
            }
            return;
        };
        let refs = pod_refs(&pod);
        let Some(value) = pod_value(&pod) else {
            return;
        };
        let fingerprint = fingerprint(&value);
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let rv = parse_rv(pod.metadata.resource_version.as_deref());
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let previous = self.pods.pods.get(&key);
        if previous.is_some_and(|p| p.uid == uid && rv != 0 && p.rv > rv) {
            return; // an older copy (a node's pod list answered after a newer watch event)
        }
        self.pods.recent.fit(self.pods.pods.len());
        self.pods.recent.put(&key, &uid, rv, &value);
        let op = match previous {
            Some(prev) if prev.uid == uid && prev.fingerprint == fingerprint => {
                // Status-only change: the edge owns pod status.
                if let Some(p) = self.pods.pods.get_mut(&key) {
                    p.rv = rv;
                }
                return;
            }
            Some(_) => Operation::Update,
            None if terminating => Operation::Update,
            None => Operation::Insert,
        };
        if previous.is_some_and(|p| p.node != node)
            && let Some((old, released)) = self.remove_pod_entry(&key)
        {
            // nodeName never changes, but a pod recreated under the same name (its delete
            // missed while the watcher relisted) can land on another node.
            self.pods.deleted.insert(&old.uid);
            self.send_pod(&old.node, Operation::Delete, &key, pod_stub(&key, &old.uid));
            self.send_released(released);
        }
        let released = self.location.write().set_pod(key.clone(), &node, refs);
        self.send_pod(&node, op, &key, value);
        self.send_released(released);
        self.pods.pods.insert(
            key,
            EdgePod {
                node,
                uid,
                rv,
                fingerprint,
            },
        );
    }

    fn pod_deleted(&mut self, pod: &Pod) {
        let key = object_key(&pod.metadata);
        let Some((p, released)) = self.remove_pod_entry(&key) else {
            return;
        };
        let object = serde_json::to_value(pod)
            .map(|v| with_type_meta(v, Kind::Pod))
            .unwrap_or_else(|_| pod_stub(&key, &p.uid));
        self.send_pod(&p.node, Operation::Delete, &key, object);
        self.send_released(released);
    }

    fn remove_pod_entry(&mut self, key: &ObjectKey) -> Option<(EdgePod, Released)> {
        self.pods.recent.remove(key);
        let p = self.pods.pods.remove(key)?;
        let released = self.location.write().remove_pod(key);
        Some((p, released))
    }

    fn send_pod(&self, node: &str, op: Operation, key: &ObjectKey, pod: Value) {
        let ns = if key.0.is_empty() { "default" } else { &key.0 };
        self.send(node, op, ResourceType::Pod, ns, &key.1, pod);
    }
}

/// A pod as sent to an edge: with its type, without field-manager bookkeeping (the edge has
/// no use for it; it is often the largest part).
pub(super) fn pod_value(pod: &Pod) -> Option<Value> {
    let value = serde_json::to_value(pod).ok()?;
    let mut value = with_type_meta(value, Kind::Pod);
    if let Some(m) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    Some(value)
}

/// A pod delete's content: its identity only.
pub(super) fn pod_stub(key: &ObjectKey, uid: &str) -> Value {
    super::configs::stub(Kind::Pod, key, uid)
}

/// Hash of what the edge acts on: metadata without volatile fields, and spec. Hashed from
/// the value as it is (no copy, no serialisation: this runs on every pod event, status-only
/// ones included).
fn fingerprint(pod: &Value) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    match pod.get("metadata") {
        Some(Value::Object(meta)) => {
            for (k, v) in meta {
                if !matches!(
                    k.as_str(),
                    "resourceVersion" | "managedFields" | "generation"
                ) {
                    k.hash(&mut h);
                    hash_value(v, &mut h);
                }
            }
        }
        other => hash_value(other.unwrap_or(&Value::Null), &mut h),
    }
    0xffu8.hash(&mut h); // metadata ends here
    hash_value(pod.get("spec").unwrap_or(&Value::Null), &mut h);
    h.finish()
}

/// Feeds a JSON value to a hasher, its structure included (a string "1" and a number 1, or
/// `[["a"]]` and `["a"]`, hash differently).
fn hash_value<H: Hasher>(v: &Value, h: &mut H) {
    match v {
        Value::Null => 0u8.hash(h),
        Value::Bool(b) => {
            1u8.hash(h);
            b.hash(h);
        }
        Value::Number(n) => {
            2u8.hash(h);
            n.hash(h);
        }
        Value::String(s) => {
            3u8.hash(h);
            s.hash(h);
        }
        Value::Array(items) => {
            4u8.hash(h);
            items.len().hash(h);
            for item in items {
                hash_value(item, h);
            }
        }
        Value::Object(map) => {
            5u8.hash(h);
            map.len().hash(h);
            for (k, v) in map {
                k.hash(h);
                hash_value(v, h);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn status_only_changes_keep_the_fingerprint() {
        let a = json!({"metadata": {"name": "p", "resourceVersion": "1"}, "spec": {"nodeName": "e"}, "status": {"phase": "Pending"}});
        let b = json!({"metadata": {"name": "p", "resourceVersion": "2"}, "spec": {"nodeName": "e"}, "status": {"phase": "Running"}});
        let c = json!({"metadata": {"name": "p", "resourceVersion": "3", "labels": {"x": "y"}}, "spec": {"nodeName": "e"}});
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&c));
    }

    #[test]
    fn the_fingerprint_sees_structure_not_just_text() {
        let pod = |spec: Value| json!({"metadata": {"name": "p"}, "spec": spec});
        let distinct = [
            pod(json!({"a": "1"})),
            pod(json!({"a": 1})),
            pod(json!({"a": ["1"]})),
            pod(json!({"a": [["1"]]})),
            pod(json!({"a": null})),
            pod(json!({"a": {}})),
            pod(json!({"b": "1"})),
            pod(json!({"a": "1", "b": "1"})),
            json!({"metadata": {"name": "q"}, "spec": {"a": "1"}}),
            json!({"metadata": {"name": "p", "generation": 2}, "spec": {"a": "1", "x": 0}}),
        ];
        let hashes: std::collections::HashSet<u64> = distinct.iter().map(fingerprint).collect();
        assert_eq!(hashes.len(), distinct.len());
        let volatile = json!({"metadata": {"name": "p", "generation": 7, "managedFields": []},
                              "spec": {"a": "1"}});
        assert_eq!(fingerprint(&volatile), fingerprint(&pod(json!({"a": "1"}))));
    }
}
