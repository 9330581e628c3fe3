//! The policy controller's state: pods indexed by node, the RBAC objects, what each connected
//! edge was sent. Inputs only mark what changed; [`Policy::flush`] (debounced by the caller)
//! computes and sends the differences.

use super::rbac::{ObjKey, Rbac};
use super::{Change, Input, Keyed, PodRef, WATCHED, messages};
use crate::cloudhub::HubSink;
use crate::controller::kind::Kind;
use kubeedge_shared::inventory::HeldObject;
use kubeedge_shared::{Operation, ResourceType};
use serde_json::Value;
use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// What a node was sent for one service account.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    hash: u64,
    uid: Arc<str>,
}

/// A node name or a service account key, shared by every map that holds it (at 100k nodes
/// with a few pods each, copies of the same strings were most of the state).
type NodeName = Arc<str>;
type SaKey = Arc<ObjKey>;
/// A service account's object, its hash and its UID.
type Computed = (Arc<Value>, u64, Arc<str>);

pub struct Policy {
    hub: Arc<dyn HubSink>,
    /// Pod `(ns, name)` → (node, service account key).
    pods: HashMap<ObjKey, (NodeName, SaKey)>,
    /// Node → service account → how many of its pods use it.
    by_node: HashMap<NodeName, HashMap<SaKey, usize>>,
    /// The one copy of each node name and service account key.
    node_names: HashSet<NodeName>,
    sa_keys: HashSet<SaKey>,
    rbac: Rbac,
    /// Computed objects (`None`: no such service account), valid until an RBAC change.
    /// Per service account, computed once per change and shared by every node (an RBAC
    /// change at 100k nodes compares hashes, it does not copy objects).
    computed: HashMap<SaKey, Option<Computed>>,
    /// Per connected node, what it holds from us.
    sent: HashMap<NodeName, HashMap<SaKey, Sent>>,
    dirty_nodes: HashSet<String>,
    all_dirty: bool,
    /// Kinds whose first list is complete; nothing is sent before all are.
    listed: HashSet<Kind>,
    /// Objects seen during a relist in progress, per kind.
    relist: HashMap<Kind, HashSet<ObjKey>>,
    last_rv: u64,
    /// Inventories that arrived before every kind was listed (judged once they are).
    early_inventories: HashMap<String, Vec<HeldObject>>,
}

fn hash_of(v: &Value) -> u64 {
    let mut h = DefaultHasher::new();
    v.to_string().hash(&mut h);
    h.finish()
}

impl Policy {
    pub fn new(hub: Arc<dyn HubSink>) -> Policy {
        Policy {
            hub,
            pods: HashMap::new(),
            by_node: HashMap::new(),
            node_names: HashSet::new(),
            sa_keys: HashSet::new(),
            rbac: Rbac::default(),
            computed: HashMap::new(),
            sent: HashMap::new(),
            dirty_nodes: HashSet::new(),
            all_dirty: false,
            listed: HashSet::new(),
            relist: HashMap::new(),
            last_rv: 0,
            early_inventories: HashMap::new(),
        }
    }

    fn node_name(&mut self, node: &str) -> NodeName {
        if let Some(n) = self.node_names.get(node) {
            return n.clone();
        }
        let n: NodeName = Arc::from(node);
        self.node_names.insert(n.clone());
        n
    }

    fn sa_key(&mut self, key: ObjKey) -> SaKey {
        if let Some(k) = self.sa_keys.get(&key) {
            return k.clone();
        }
        let k = Arc::new(key);
        self.sa_keys.insert(k.clone());
        k
    }

    fn all_listed(&self) -> bool {
        WATCHED.iter().all(|k| self.listed.contains(k))
    }

    /// True when [`Policy::flush`] has something to do.
    pub fn is_dirty(&self) -> bool {
        (self.all_dirty || !self.dirty_nodes.is_empty()) && self.all_listed()
    }

    /// Forgets what every node was sent: the next flush sends everything again.
    pub fn resync_all(&mut self) {
        self.sent.clear();
        self.all_dirty = true;
    }

    pub fn apply(&mut self, input: Input) {
        match input {
            Input::Pods(c) => self.change(Kind::Pod, c, |s, p| s.pod_applied(p), Self::pod_gone),
            Input::ServiceAccounts(c) => self.change(
                Kind::ServiceAccount,
                c,
                |s, sa| {
                    s.rbac.service_accounts.insert(sa.key(), sa);
                },
                |s, k| {
                    s.rbac.service_accounts.remove(k);
                },
            ),
            Input::Roles(c) => self.change(
                Kind::Role,
                c,
                |s, r| {
                    s.rbac.roles.insert(r.key(), r);
                },
                |s, k| {
                    s.rbac.roles.remove(k);
                },
            ),
            Input::ClusterRoles(c) => self.change(
                Kind::ClusterRole,
                c,
                |s, r| {
                    s.rbac.cluster_roles.insert(r.key().1, r);
                },
                |s, k| {
                    s.rbac.cluster_roles.remove(&k.1);
                },
            ),
            Input::RoleBindings(c) => self.change(
                Kind::RoleBinding,
                c,
                |s, rb| s.rbac.put_role_binding(rb),
                |s, k| s.rbac.delete_role_binding(k),
            ),
            Input::ClusterRoleBindings(c) => self.change(
                Kind::ClusterRoleBinding,
                c,
                |s, b| s.rbac.put_cluster_role_binding(b),
                |s, k| s.rbac.delete_cluster_role_binding(&k.1),
            ),
            Input::Connected(node) | Input::Disconnected(node) => {
                // Whatever it holds is sent again when it connects.
                self.sent.remove(node.as_str());
                self.dirty_nodes.insert(node);
            }
            Input::Inventory { node, held } => self.inventory(&node, &held),
        }
    }

    fn change<T: Keyed>(
        &mut self,
        kind: Kind,
        change: Change<T>,
        put: impl FnOnce(&mut Self, T),
        remove: fn(&mut Self, &ObjKey),
    ) {
        match change {
            Change::Applied(o) => {
                if let Some(seen) = self.relist.get_mut(&kind) {
                    seen.insert(o.key());
                }
                put(self, o);
            }
            Change::Deleted(o) => remove(self, &o.key()),
            Change::Relisting => {
                self.relist.insert(kind, HashSet::new());
                return;
            }
            Change::Listed => {
                if let Some(seen) = self.relist.remove(&kind) {
                    for k in self.keys_of(kind) {
                        if !seen.contains(&k) {
                            remove(self, &k);
                        }
                    }
                }
                self.listed.insert(kind);
                if self.all_listed() {
                    for (node, held) in std::mem::take(&mut self.early_inventories) {
                        self.inventory(&node, &held);
                    }
                }
            }
        }
        if kind != Kind::Pod {
            self.computed.clear();
            self.all_dirty = true;
        }
    }

    fn keys_of(&self, kind: Kind) -> Vec<ObjKey> {
        let cluster = |names: Vec<String>| names.into_iter().map(|n| (String::new(), n)).collect();
        match kind {
            Kind::Pod => self.pods.keys().cloned().collect(),
            Kind::ServiceAccount => self.rbac.service_accounts.keys().cloned().collect(),
            Kind::Role => self.rbac.roles.keys().cloned().collect(),
            Kind::ClusterRole => cluster(self.rbac.cluster_roles.keys().cloned().collect()),
            Kind::RoleBinding => self.rbac.role_binding_keys(),
            Kind::ClusterRoleBinding => cluster(self.rbac.cluster_role_binding_names()),
            _ => Vec::new(), // not watched here (WATCHED)
        }
    }

    fn pod_applied(&mut self, pod: PodRef) {
        let key = pod.key();
        let same = self.pods.get(&key).is_some_and(|(n, sa)| {
            **n == *pod.node && sa.0 == pod.namespace && sa.1 == pod.service_account
        });
        if same {
            return;
        }
        self.pod_gone(&key);
        if pod.node.is_empty() {
            return;
        }
        let node = self.node_name(&pod.node);
        let sa = self.sa_key((pod.namespace, pod.service_account));
        *self
            .by_node
            .entry(node.clone())
            .or_default()
            .entry(sa.clone())
            .or_default() += 1;
        self.dirty_nodes.insert(node.to_string());
        self.pods.insert(key, (node, sa));
    }

    fn pod_gone(&mut self, key: &ObjKey) {
        let Some((node, sa)) = self.pods.remove(key) else {
            return;
        };
        if let Some(sas) = self.by_node.get_mut(&node) {
            if let Some(n) = sas.get_mut(&sa) {
                *n -= 1;
                if *n == 0 {
                    sas.remove(&sa);
                }
            }
            if sas.is_empty() {
                self.by_node.remove(&node);
            }
        }
        self.dirty_nodes.insert(node.to_string());
    }

    /// The edge lists what it holds: what it should not hold is deleted (it may be left from
    /// before this cloudcore started).
    fn inventory(&mut self, node: &str, held: &[HeldObject]) {
        if !self.all_listed() {
            self.early_inventories
                .insert(node.to_string(), held.to_vec());
            return;
        }
        let wanted = self.by_node.get(node);
        let sent = self.sent.get(node);
        let stale: Vec<(ObjKey, &str)> = held
            .iter()
            .filter(|h| h.resource_type == ResourceType::ServiceAccountAccess)
            .map(|h| ((h.namespace.clone(), h.name.clone()), h.uid.as_str()))
            .filter(|(key, _)| {
                !wanted.is_some_and(|w| w.contains_key(key))
                    && !sent.is_some_and(|s| s.contains_key(key))
            })
            .collect();
        for (key, uid) in stale {
            let rv = self.next_rv();
            let msg = messages::delete(&key, uid, rv);
            if let Err(e) = self.hub.send(node, msg) {
                tracing::debug!(node, error = %e, "stale ServiceAccountAccess delete not sent");
            }
        }
    }

    /// A resourceVersion newer than any sent before, also by an earlier cloudcore (the wall
    /// clock in microseconds): the edge keeps the newest copy of an object.
    fn next_rv(&mut self) -> u64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or_default();
        self.last_rv = now.max(self.last_rv + 1);
        self.last_rv
    }

    fn computed(&mut self, sa: &SaKey) -> Option<Computed> {
        if let Some(c) = self.computed.get(sa) {
            return c.clone();
        }
        let c = self.rbac.access(&sa.0, &sa.1).map(|v| {
            let h = hash_of(&v);
            let uid: Arc<str> = Arc::from(
                v.pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            );
            (Arc::new(v), h, uid)
        });
        self.computed.insert(sa.clone(), c.clone());
        c
    }

    /// Sends every connected dirty node what changed for it. Returns false when a send
    /// failed (the node stays dirty: call again later).
    pub fn flush(&mut self) -> bool {
        if !self.all_listed() {
            return true;
        }
        let nodes: Vec<String> = if std::mem::take(&mut self.all_dirty) {
            self.dirty_nodes.clear();
            self.by_node
                .keys()
                .chain(self.sent.keys())
                .cloned()
                .collect::<HashSet<NodeName>>()
                .into_iter()
                .map(|n| n.to_string())
                .collect()
        } else {
            self.dirty_nodes.drain().collect()
        };
        let mut ok = true;
        for node in nodes {
            if !self.hub.is_connected(&node) {
                self.sent.remove(node.as_str());
                continue;
            }
            if !self.sync_node(&node) {
                self.dirty_nodes.insert(node);
                ok = false;
            }
        }
        ok
    }

    fn sync_node(&mut self, node: &str) -> bool {
        let wanted: Vec<SaKey> = self
            .by_node
            .get(node)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        let node_key = self.node_name(node);
        let mut ok = true;
        let mut keep = HashSet::new();
        for sa in wanted {
            let Some((obj, hash, uid)) = self.computed(&sa) else {
                continue;
            };
            keep.insert(sa.clone());
            let before = self.sent.get(node).and_then(|s| s.get(&sa)).cloned();
            if before.as_ref().is_some_and(|b| b.hash == hash) {
                continue;
            }
            let op = match &before {
                Some(b) if b.uid == uid => Operation::Update,
                _ => Operation::Insert,
            };
            let rv = self.next_rv();
            match self.hub.send(node, messages::object(op, &obj, rv)) {
                Ok(_) => {
                    self.sent
                        .entry(node_key.clone())
                        .or_default()
                        .insert(sa, Sent { hash, uid });
                }
                Err(e) => {
                    tracing::debug!(node, error = %e, "ServiceAccountAccess not sent; retried");
                    ok = false;
                }
            }
        }
        let gone: Vec<(SaKey, Sent)> = self
            .sent
            .get(node)
            .map(|s| {
                s.iter()
                    .filter(|(k, _)| !keep.contains(*k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        for (sa, sent) in gone {
            let rv = self.next_rv();
            match self.hub.send(node, messages::delete(&sa, &sent.uid, rv)) {
                Ok(_) => {
                    if let Some(s) = self.sent.get_mut(node) {
                        s.remove(&sa);
                    }
                }
                Err(e) => {
                    tracing::debug!(node, error = %e, "ServiceAccountAccess delete not sent; retried");
                    ok = false;
                }
            }
        }
        if self.sent.get(node).is_some_and(HashMap::is_empty) {
            self.sent.remove(node);
        }
        ok
    }
}
