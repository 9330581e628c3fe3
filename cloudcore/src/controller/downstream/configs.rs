//! Configmaps and secrets: sent only to the nodes whose pods use them (the location cache),
//! and dropped from a node once none of its pods does.

use super::{Downstream, Fetched, object_key, parse_rv};
use crate::controller::kind::Kind;
use crate::controller::location::{ObjectKey, Released};
use crate::controller::rest::with_type_meta;
use kube::Resource;
use kube::runtime::watcher::Event;
use kubeedge_shared::Operation;
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap, HashSet};

pub use kubeedge_shared::resource_type::ConfigKind;

/// What the cloud does with each [`ConfigKind`].
pub trait ConfigKindExt {
    fn api_kind(self) -> Kind;
}

impl ConfigKindExt for ConfigKind {
    fn api_kind(self) -> Kind {
        match self {
            ConfigKind::ConfigMap => Kind::ConfigMap,
            ConfigKind::Secret => Kind::Secret,
        }
    }
}

/// The versions of every object of one kind in the cluster.
#[derive(Default)]
pub(super) struct ConfigObjects {
    /// key → (uid, resourceVersion)
    pub versions: HashMap<ObjectKey, (String, u64)>,
    /// The newest resourceVersion the watcher delivered (the view is complete up to it).
    pub max_rv: u64,
}

impl Downstream {
    pub(super) fn configs(&self, kind: ConfigKind) -> &ConfigObjects {
        match kind {
            ConfigKind::ConfigMap => &self.configmaps,
            ConfigKind::Secret => &self.secrets,
        }
    }

    fn configs_mut(&mut self, kind: ConfigKind) -> &mut ConfigObjects {
        match kind {
            ConfigKind::ConfigMap => &mut self.configmaps,
            ConfigKind::Secret => &mut self.secrets,
        }
    }

    /// The nodes whose pods use the object.
    pub(super) fn nodes_using(&self, kind: ConfigKind, key: &ObjectKey) -> BTreeSet<String> {
        let location = self.location.read();
        match kind {
            ConfigKind::ConfigMap => location.configmap_nodes(key),
            ConfigKind::Secret => location.secret_nodes(key),
        }
    }

    pub(super) fn on_config<K>(&mut self, ev: Event<K>, kind: ConfigKind)
    where
        K: Resource<DynamicType = ()> + serde::Serialize,
    {
        let which = kind.api_kind();
        match ev {
            Event::Init => {
                self.relisting.insert(which, HashSet::new());
            }
            Event::InitApply(o) | Event::Apply(o) => {
                let meta = o.meta();
                let key = object_key(meta);
                if let Some(seen) = self.relisting.get_mut(&which) {
                    seen.insert(key.clone());
                }
                let version = (
                    meta.uid.clone().unwrap_or_default(),
                    parse_rv(meta.resource_version.as_deref()),
                );
                let objects = self.configs_mut(kind);
                objects.max_rv = objects.max_rv.max(version.1);
                if objects.versions.get(&key) == Some(&version) {
                    return;
                }
                objects.versions.insert(key.clone(), version);
                let nodes = self.nodes_using(kind, &key);
                if nodes.is_empty() {
                    return;
                }
                let Ok(v) = serde_json::to_value(&o) else {
                    return;
                };
                let v = with_type_meta(v, kind.api_kind());
                for node in nodes {
                    self.send_config(&node, Operation::Update, kind, &key, v.clone());
                }
            }
            Event::Delete(o) => {
                let meta = o.meta();
                let objects = self.configs_mut(kind);
                objects.max_rv = objects
                    .max_rv
                    .max(parse_rv(meta.resource_version.as_deref()));
                let key = object_key(meta);
                self.forget_config(kind, &key, serde_json::to_value(&o).ok());
            }
            Event::InitDone => {
                let seen = self.relisting.remove(&which).unwrap_or_default();
                let gone: Vec<ObjectKey> = self
                    .configs(kind)
                    .versions
                    .keys()
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                for key in gone {
                    self.forget_config(kind, &key, None);
                }
                self.mark_synced(which);
                self.answer_pending();
            }
        }
    }

    fn forget_config(&mut self, kind: ConfigKind, key: &ObjectKey, object: Option<Value>) {
        let Some((uid, _)) = self.configs_mut(kind).versions.remove(key) else {
            return;
        };
        let object = object.unwrap_or_else(
            || json!({"metadata": {"namespace": key.0, "name": key.1, "uid": uid}}),
        );
        let object = with_type_meta(object, kind.api_kind());
        for node in self.nodes_using(kind, key) {
            self.send_config(&node, Operation::Delete, kind, key, object.clone());
        }
    }

    /// Tells a node to drop the configmaps and secrets none of its pods uses any more: it
    /// gets no updates for them, so a kept copy would go stale (and a secret would linger).
    pub(super) fn send_released(&self, released: Released) {
        for (kind, keys) in [
            (ConfigKind::ConfigMap, &released.configmaps),
            (ConfigKind::Secret, &released.secrets),
        ] {
            for key in keys {
                let uid = self
                    .configs(kind)
                    .versions
                    .get(key)
                    .map(|(uid, _)| uid.as_str())
                    .unwrap_or_default();
                let object = stub(kind.api_kind(), key, uid);
                self.send_config(&released.node, Operation::Delete, kind, key, object);
            }
        }
    }

    /// Sends the objects a resync fetched that are still current and still used by `node`.
    pub(super) fn configs_fetched(&mut self, node: &str, objects: Vec<Fetched>) {
        self.resyncs.fetched(node, &objects);
        let mut sent = 0usize;
        for f in objects {
            let Some(object) = f.object else { continue };
            let uid = object["metadata"]["uid"].as_str().unwrap_or_default();
            let rv = parse_rv(object["metadata"]["resourceVersion"].as_str());
            let current = self.configs(f.kind).versions.get(&f.key);
            // An older copy than the watcher's would undo an update already sent.
            let fresh = current.is_some_and(|(u, r)| u == uid && rv >= *r);
            // One node's question (not the set of every node using it: an object every
            // node uses would make a storm of resyncs quadratic).
            let secret = f.kind == ConfigKind::Secret;
            if fresh && self.location.read().node_uses(node, &f.key, secret) {
                self.send_config(node, Operation::Update, f.kind, &f.key, object);
                sent += 1;
            }
        }
        if sent > 0 {
            tracing::debug!(node, sent, "sent objects fetched for a resync");
        }
        self.resync_settled(node);
    }

    pub(super) fn send_config(
        &self,
        node: &str,
        op: Operation,
        kind: ConfigKind,
        key: &ObjectKey,
        object: Value,
    ) {
        self.send(node, op, kind.resource_type(), &key.0, &key.1, object);
    }
}

/// A delete's content: the object's identity only.
pub(super) fn stub(kind: Kind, key: &ObjectKey, uid: &str) -> Value {
    with_type_meta(
        json!({"metadata": {"namespace": key.0, "name": key.1, "uid": uid}}),
        kind,
    )
}
