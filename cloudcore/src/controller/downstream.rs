//! Downstream: cluster changes → messages for exactly the edge nodes that need them.
//!
//! One actor owns all state (edge node set, edge pods, location cache, configmap/secret
//! versions), fed by one cluster-wide watcher per kind: the apiserver load does not grow with
//! the number of edge nodes, and nothing on the hot path takes a shared lock.

use super::location::{ObjectKey, Released, SharedLocation};
use super::objectsync::SyncRecords;
use super::refs::pod_refs;
use super::rest::{self, Kind, with_type_meta};
use crate::cloudhub::{CloudHub, NodeEvent};
use crate::http::Readiness;
use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kubeedge_shared::operation::source;
use kubeedge_shared::{Group, Message, Operation};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

pub const EDGE_NODE_LABEL: &str = "node-role.kubernetes.io/edge";

/// One object an edge reports holding (the inventory, `edgecore/INVENTORY.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldObject {
    pub resource_type: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: u64,
}

// Values are moved once through a channel; boxing would only add allocations.
#[allow(clippy::large_enum_variant)]
pub enum Input {
    Pod(Event<Pod>),
    Node(Event<Node>),
    ConfigMap(Event<ConfigMap>),
    Secret(Event<Secret>),
    WatchError(&'static str, String),
    /// An edge's inventory: send it the difference.
    Inventory {
        node: String,
        held: Vec<HeldObject>,
    },
}

struct EdgePod {
    node: String,
    uid: String,
    rv: u64,
    /// Hash of metadata (minus volatile fields) and spec: status-only changes are not sent.
    fingerprint: u64,
    /// Compact JSON (a `serde_json::Value` costs several times its text in memory).
    object: Arc<str>,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Watched {
    Pods,
    Nodes,
    ConfigMaps,
    Secrets,
}

pub struct Downstream {
    client: kube::Client,
    hub: CloudHub,
    edge_nodes: HashSet<String>,
    pods: HashMap<ObjectKey, EdgePod>,
    pods_by_node: HashMap<String, HashSet<ObjectKey>>,
    location: SharedLocation,
    configmaps: HashMap<ObjectKey, (String, u64)>,
    secrets: HashMap<ObjectKey, (String, u64)>,
    /// Keys seen since the last `Init` of each watcher (to find deletions missed meanwhile).
    relisting: HashMap<Watched, HashSet<ObjectKey>>,
    synced: HashSet<Watched>,
    /// Nodes of pods the pod watcher's first list passed while the node was not (yet) known
    /// as an edge node: the node list may arrive after the pod list. Their pods are listed
    /// again once that first pod list is complete.
    skipped_before_sync: HashSet<String>,
    /// UIDs of pods deleted lately (at most [`DELETED_KEPT`] for [`DELETED_FOR`]): a node's pod
    /// list that answers after a pod's delete event must not bring the pod back.
    deleted_pods: DeletedPods,
    ready: Readiness,
    /// Pods of nodes that just became edge nodes are listed and fed back here.
    feedback: mpsc::Sender<Input>,
    /// What KubeEdge edges hold (ObjectSync records), when that mode is on.
    records: Option<SyncRecords>,
    /// Between comparisons of connected KubeEdge edges with their records.
    records_interval: Duration,
}

type InputStream = Pin<Box<dyn Stream<Item = Input> + Send>>;

/// How many deleted pod UIDs are remembered, and for how long.
const DELETED_KEPT: usize = 20_000;
const DELETED_FOR: Duration = Duration::from_secs(300);

/// Recently deleted pod UIDs (a UID never comes back once deleted).
#[derive(Default)]
struct DeletedPods {
    order: std::collections::VecDeque<(std::time::Instant, String)>,
    uids: HashSet<String>,
}

impl DeletedPods {
    fn insert(&mut self, uid: &str) {
        let now = std::time::Instant::now();
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

fn watch<K>(
    api: Api<K>,
    cfg: watcher::Config,
    wrap: fn(Event<K>) -> Input,
    what: &'static str,
) -> InputStream
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(api, cfg)
        .default_backoff()
        .map(move |r| match r {
            Ok(ev) => wrap(ev),
            Err(e) => Input::WatchError(what, e.to_string()),
        })
        .boxed()
}

impl Downstream {
    /// The location cache this actor keeps, for readers elsewhere.
    pub fn location(&self) -> SharedLocation {
        self.location.clone()
    }

    pub fn new(
        client: kube::Client,
        hub: CloudHub,
        ready: Readiness,
        feedback: mpsc::Sender<Input>,
    ) -> Self {
        Downstream {
            client,
            hub,
            edge_nodes: HashSet::new(),
            pods: HashMap::new(),
            pods_by_node: HashMap::new(),
            location: SharedLocation::default(),
            configmaps: HashMap::new(),
            secrets: HashMap::new(),
            relisting: HashMap::new(),
            synced: HashSet::new(),
            skipped_before_sync: HashSet::new(),
            deleted_pods: DeletedPods::default(),
            ready,
            feedback,
            records: None,
            records_interval: Duration::from_secs(30),
        }
    }

    /// Serves KubeEdge edges from their ObjectSync records (`controller/objectsync`): on
    /// connect and every `interval` they get exactly what differs from their records.
    pub fn with_sync_records(mut self, records: Option<SyncRecords>, interval: Duration) -> Self {
        self.records = records;
        self.records_interval = interval.max(Duration::from_millis(100));
        self
    }

    /// What a KubeEdge edge holds according to its records; empty (everything is sent) while
    /// the records are unavailable.
    fn recorded(&self, node: &str) -> Vec<HeldObject> {
        self.records
            .as_ref()
            .and_then(|r| r.held_by(node))
            .unwrap_or_default()
    }

    /// synccontroller's periodic pass, for the KubeEdge edges connected here.
    async fn compare_recorded_edges(&mut self) {
        let Some(records) = self.records.clone() else {
            return;
        };
        if !self.ready.is_ready() || !records.is_available() {
            return;
        }
        for node in self.hub.connected_nodes() {
            if self
                .hub
                .capabilities(&node)
                .is_some_and(|c| !c.inventory_resync)
                && let Some(held) = records.held_by(&node)
            {
                self.resync(&node, &held).await;
            }
        }
    }

    /// Runs until `shutdown`: watchers, hub events and inventories in one loop.
    pub async fn run(
        mut self,
        mut hub_events: broadcast::Receiver<NodeEvent>,
        mut inputs: mpsc::Receiver<Input>,
        shutdown: CancellationToken,
    ) {
        let c = &self.client;
        let mut streams = futures_util::stream::select_all(vec![
            watch(
                Api::<Node>::all(c.clone()),
                watcher::Config::default().labels(EDGE_NODE_LABEL),
                Input::Node,
                "nodes",
            ),
            watch(
                Api::<Pod>::all(c.clone()),
                watcher::Config::default(),
                Input::Pod,
                "pods",
            ),
            watch(
                Api::<ConfigMap>::all(c.clone()),
                watcher::Config::default(),
                Input::ConfigMap,
                "configmaps",
            ),
            watch(
                Api::<Secret>::all(c.clone()),
                watcher::Config::default(),
                Input::Secret,
                "secrets",
            ),
        ]);
        let mut compare = tokio::time::interval(self.records_interval);
        compare.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        compare.reset();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(input) = streams.next() => self.apply(input).await,
                Some(input) = inputs.recv() => self.apply(input).await,
                _ = compare.tick(), if self.records.is_some() => self.compare_recorded_edges().await,
                ev = hub_events.recv() => match ev {
                    Ok(NodeEvent::Connected { node, capabilities, .. }) => {
                        if !capabilities.inventory_resync {
                            // KubeEdge edges send no inventory: what their records say they
                            // hold (nothing without records: then everything is pushed).
                            let held = self.recorded(&node);
                            self.resync(&node, &held).await;
                        }
                    }
                    Ok(NodeEvent::QueueOverflow { node }) => {
                        tracing::warn!(%node, "node queue overflowed; it will be resynchronised when it reconnects");
                        self.hub.disconnect(&node);
                    }
                    Ok(NodeEvent::Disconnected { .. }) => {}
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "hub events lagged; resyncing every connected node");
                        for node in self.hub.connected_nodes() {
                            self.resync(&node, &[]).await;
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            }
        }
    }

    pub async fn apply(&mut self, input: Input) {
        match input {
            Input::Node(ev) => self.on_node(ev),
            Input::Pod(ev) => self.on_pod(ev),
            Input::ConfigMap(ev) => self.on_config(ev, Watched::ConfigMaps),
            Input::Secret(ev) => self.on_config(ev, Watched::Secrets),
            Input::WatchError(what, e) => {
                tracing::warn!(watch = what, error = %e, "watch failed; retrying with backoff")
            }
            Input::Inventory { node, held } => self.resync(&node, &held).await,
        }
    }

    fn mark_synced(&mut self, w: Watched) {
        self.synced.insert(w);
        if self.synced.len() == 4 && !self.ready.is_ready() {
            tracing::info!("informers synced");
            self.location.set_synced();
            self.ready.set_ready();
        }
    }

    fn on_node(&mut self, ev: Event<Node>) {
        match ev {
            Event::Init => {
                self.relisting.insert(Watched::Nodes, HashSet::new());
            }
            Event::InitApply(n) | Event::Apply(n) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                if let Some(seen) = self.relisting.get_mut(&Watched::Nodes) {
                    seen.insert((String::new(), name.clone()));
                }
                if self.edge_nodes.insert(name.clone()) {
                    self.list_pods_of(name);
                }
            }
            Event::Delete(n) => {
                self.remove_edge_node(n.metadata.name.as_deref().unwrap_or_default())
            }
            Event::InitDone => {
                let seen = self.relisting.remove(&Watched::Nodes).unwrap_or_default();
                let gone: Vec<String> = self
                    .edge_nodes
                    .iter()
                    .filter(|n| !seen.contains(&(String::new(), (*n).clone())))
                    .cloned()
                    .collect();
                for n in gone {
                    self.remove_edge_node(&n);
                }
                self.mark_synced(Watched::Nodes);
            }
        }
    }

    fn remove_edge_node(&mut self, node: &str) {
        if !self.edge_nodes.remove(node) {
            return;
        }
        tracing::info!(node, "edge node deleted; ending its session");
        if let Some(records) = &self.records {
            records.node_deleted(node);
        }
        self.location.write().remove_node(node);
        for key in self.pods_by_node.remove(node).unwrap_or_default() {
            self.pods.remove(&key);
        }
        self.hub.disconnect(node);
    }

    /// A node just became an edge node: its existing pods were ignored until now.
    fn list_pods_of(&self, node: String) {
        if !self.synced.contains(&Watched::Pods) {
            // The rest of the pod watcher's first list includes them; what it passed over
            // is listed when it completes (`skipped_before_sync`).
            return;
        }
        let api: Api<Pod> = Api::all(self.client.clone());
        let tx = self.feedback.clone();
        tokio::spawn(async move {
            let lp = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
            match api.list(&lp).await {
                Ok(list) => {
                    for p in list.items {
                        let _ = tx.send(Input::Pod(Event::Apply(p))).await;
                    }
                }
                Err(e) => {
                    tracing::warn!(%node, error = %e, "listing the pods of a new edge node failed")
                }
            }
        });
    }

    fn on_pod(&mut self, ev: Event<Pod>) {
        match ev {
            Event::Init => {
                self.relisting.insert(Watched::Pods, HashSet::new());
            }
            Event::InitApply(p) | Event::Apply(p) => self.pod_applied(p),
            Event::Delete(p) => {
                if let Some(uid) = &p.metadata.uid {
                    self.deleted_pods.insert(uid);
                }
                self.pod_deleted(&p)
            }
            Event::InitDone => {
                let seen = self.relisting.remove(&Watched::Pods).unwrap_or_default();
                let gone: Vec<ObjectKey> = self
                    .pods
                    .keys()
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                for k in gone {
                    if let Some((p, released)) = self.remove_pod_entry(&k) {
                        self.deleted_pods.insert(&p.uid);
                        self.send_pod(&p.node, Operation::Delete, &expand(&p.object));
                        self.send_released(released);
                    }
                }
                self.mark_synced(Watched::Pods);
                // Pods listed before their node was known as an edge node were passed over.
                for node in std::mem::take(&mut self.skipped_before_sync) {
                    if self.edge_nodes.contains(&node) {
                        self.list_pods_of(node);
                    }
                }
            }
        }
    }

    fn pod_applied(&mut self, pod: Pod) {
        let key = object_key(&pod.metadata);
        if let Some(seen) = self.relisting.get_mut(&Watched::Pods) {
            seen.insert(key.clone());
        }
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return;
        };
        if pod
            .metadata
            .uid
            .as_deref()
            .is_some_and(|u| self.deleted_pods.contains(u))
        {
            return; // a stale copy of a deleted pod (a list that answered late)
        }
        if !self.edge_nodes.contains(&node) {
            if !self.synced.contains(&Watched::Pods) {
                self.skipped_before_sync.insert(node);
            }
            return;
        }
        let refs = pod_refs(&pod);
        let Ok(value) = serde_json::to_value(&pod) else {
            return;
        };
        let mut value = with_type_meta(value, Kind::Pod);
        // The edge has no use for field-manager bookkeeping; it is often the largest part.
        if let Some(m) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
        let fingerprint = fingerprint(&value);
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let rv = parse_rv(pod.metadata.resource_version.as_deref());
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let previous = self.pods.get(&key);
        if previous.is_some_and(|p| p.uid == uid && rv != 0 && p.rv > rv) {
            return; // an older copy (a node's pod list answered after a newer watch event)
        }
        let op = match previous {
            Some(prev) if prev.uid == uid && prev.fingerprint == fingerprint => {
                // Status-only change: the edge owns pod status.
                let object = compact(&value);
                if let Some(p) = self.pods.get_mut(&key) {
                    p.rv = rv;
                    p.object = object;
                }
                return;
            }
            Some(_) => Operation::Update,
            None if terminating => Operation::Update,
            None => Operation::Insert,
        };
        let released = self.location.write().set_pod(key.clone(), &node, refs);
        self.send_pod(&node, op, &value);
        self.send_released(released);
        let object = compact(&value);
        self.pods_by_node
            .entry(node.clone())
            .or_default()
            .insert(key.clone());
        self.pods.insert(
            key,
            EdgePod {
                node,
                uid,
                rv,
                fingerprint,
                object,
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
            .unwrap_or_else(|_| expand(&p.object));
        self.send_pod(&p.node, Operation::Delete, &object);
        self.send_released(released);
    }

    /// Tells a node to drop the configmaps and secrets none of its pods uses any more: it
    /// gets no updates for them, so a kept copy would go stale (and a secret would linger).
    fn send_released(&self, released: Released) {
        for (ty, kind, keys) in [
            ("configmap", Kind::ConfigMap, &released.configmaps),
            ("secret", Kind::Secret, &released.secrets),
        ] {
            for key in keys {
                let current = if kind == Kind::ConfigMap {
                    self.configmaps.get(key)
                } else {
                    self.secrets.get(key)
                };
                let uid = current.map(|(uid, _)| uid.as_str()).unwrap_or_default();
                let object = stub(kind, key, uid);
                self.send(
                    &released.node,
                    Operation::Delete,
                    ty,
                    &key.0,
                    &key.1,
                    object,
                );
            }
        }
    }

    fn remove_pod_entry(&mut self, key: &ObjectKey) -> Option<(EdgePod, Released)> {
        let p = self.pods.remove(key)?;
        let released = self.location.write().remove_pod(key);
        if let Some(keys) = self.pods_by_node.get_mut(&p.node) {
            keys.remove(key);
            if keys.is_empty() {
                self.pods_by_node.remove(&p.node);
            }
        }
        Some((p, released))
    }

    fn send_pod(&self, node: &str, op: Operation, pod: &Value) {
        let (ns, name) = (
            pod["metadata"]["namespace"].as_str().unwrap_or("default"),
            pod["metadata"]["name"].as_str().unwrap_or_default(),
        );
        self.send(node, op, "pod", ns, name, pod.clone());
    }

    fn send(&self, node: &str, op: Operation, ty: &str, ns: &str, name: &str, object: Value) {
        if !self.hub.is_connected(node) {
            return; // reconciled on connect
        }
        let rv = object["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let msg = Message::new(
            source::EDGE_CONTROLLER,
            Group::Resource,
            op,
            format!("node/{node}/{ns}/{ty}/{name}"),
            object,
        )
        .with_resource_version(rv);
        // What was queued, for tracing a delivery (off unless `cloudcore=trace`).
        let traced = tracing::enabled!(tracing::Level::TRACE).then(|| {
            let uid = msg.object_uid().unwrap_or_default().to_string();
            let op = msg.route.operation.clone();
            (op, uid, msg.header.resource_version.clone())
        });
        match self.hub.send(node, msg) {
            Ok(queued) => {
                if let Some((op, uid, rv)) = traced {
                    tracing::trace!(node, %op, ty, ns, name, uid, rv, ?queued, "downstream message");
                }
            }
            Err(e) => tracing::debug!(node, error = %e, "downstream message not queued"),
        }
    }

    fn on_config<K>(&mut self, ev: Event<K>, which: Watched)
    where
        K: Resource<DynamicType = ()> + serde::Serialize,
    {
        let (ty, kind) = match which {
            Watched::ConfigMaps => ("configmap", Kind::ConfigMap),
            _ => ("secret", Kind::Secret),
        };
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
                let map = if which == Watched::ConfigMaps {
                    &mut self.configmaps
                } else {
                    &mut self.secrets
                };
                if map.get(&key) == Some(&version) {
                    return;
                }
                map.insert(key.clone(), version);
                let nodes = if which == Watched::ConfigMaps {
                    self.location.read().configmap_nodes(&key)
                } else {
                    self.location.read().secret_nodes(&key)
                };
                if nodes.is_empty() {
                    return;
                }
                let Ok(v) = serde_json::to_value(&o) else {
                    return;
                };
                let v = with_type_meta(v, kind);
                for node in nodes {
                    self.send(&node, Operation::Update, ty, &key.0, &key.1, v.clone());
                }
            }
            Event::Delete(o) => {
                let key = object_key(o.meta());
                self.forget_config(which, &key, ty, kind, serde_json::to_value(&o).ok());
            }
            Event::InitDone => {
                let seen = self.relisting.remove(&which).unwrap_or_default();
                let map = if which == Watched::ConfigMaps {
                    &self.configmaps
                } else {
                    &self.secrets
                };
                let gone: Vec<ObjectKey> =
                    map.keys().filter(|k| !seen.contains(*k)).cloned().collect();
                for key in gone {
                    self.forget_config(which, &key, ty, kind, None);
                }
                self.mark_synced(which);
            }
        }
    }

    fn forget_config(
        &mut self,
        which: Watched,
        key: &ObjectKey,
        ty: &str,
        kind: Kind,
        object: Option<Value>,
    ) {
        let map = if which == Watched::ConfigMaps {
            &mut self.configmaps
        } else {
            &mut self.secrets
        };
        let Some((uid, _)) = map.remove(key) else {
            return;
        };
        let nodes = if which == Watched::ConfigMaps {
            self.location.read().configmap_nodes(key)
        } else {
            self.location.read().secret_nodes(key)
        };
        let object = object.unwrap_or_else(
            || json!({"metadata": {"namespace": key.0, "name": key.1, "uid": uid}}),
        );
        let object = with_type_meta(object, kind);
        for node in nodes {
            self.send(&node, Operation::Delete, ty, &key.0, &key.1, object.clone());
        }
    }

    /// Brings a node's copy up to date. With an inventory (`held`) only the difference is
    /// sent; with none (a KubeEdge edge), everything the node should hold is sent as updates.
    pub async fn resync(&mut self, node: &str, held: &[HeldObject]) {
        if !self.edge_nodes.contains(node) {
            tracing::debug!(
                node,
                "resync for a node that is not (yet) a known edge node"
            );
        }
        let held_by_key: HashMap<(&str, &str, &str), &HeldObject> = held
            .iter()
            .map(|h| {
                (
                    (
                        h.resource_type.as_str(),
                        h.namespace.as_str(),
                        h.name.as_str(),
                    ),
                    h,
                )
            })
            .collect();
        let mut sent = 0usize;
        let mut deleted = 0usize;
        // Pods the node should run.
        let mine: Vec<(ObjectKey, u64, String, Arc<str>)> = self
            .pods_by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|k| {
                self.pods
                    .get(k)
                    .map(|p| (k.clone(), p.rv, p.uid.clone(), p.object.clone()))
            })
            .collect();
        let mut wanted: HashSet<(String, String, String)> = HashSet::new();
        for (key, rv, uid, obj) in &mine {
            wanted.insert(("pod".into(), key.0.clone(), key.1.clone()));
            match held_by_key.get(&("pod", key.0.as_str(), key.1.as_str())) {
                Some(h) if h.uid == *uid && h.resource_version >= *rv => {}
                Some(h) if h.uid != *uid => {
                    self.send(
                        node,
                        Operation::Delete,
                        "pod",
                        &key.0,
                        &key.1,
                        stub(Kind::Pod, key, &h.uid),
                    );
                    self.send(node, Operation::Update, "pod", &key.0, &key.1, expand(obj));
                    sent += 1;
                    deleted += 1;
                }
                _ => {
                    self.send(node, Operation::Update, "pod", &key.0, &key.1, expand(obj));
                    sent += 1;
                }
            }
        }
        // Pods the node holds but should not (once the pod watcher has listed).
        for h in held
            .iter()
            .filter(|h| h.resource_type == "pod" && self.ready.is_ready())
        {
            if !wanted.contains(&("pod".into(), h.namespace.clone(), h.name.clone())) {
                let key = (h.namespace.clone(), h.name.clone());
                self.send(
                    node,
                    Operation::Delete,
                    "pod",
                    &key.0,
                    &key.1,
                    stub(Kind::Pod, &key, &h.uid),
                );
                deleted += 1;
            }
        }
        // Configmaps and secrets it holds that are gone, were replaced, or that none of its
        // pods uses any more (nothing would keep them fresh) — before any update, so a
        // replacement is not deleted after it arrives. Only once every watcher has listed: an
        // object not seen yet is not gone.
        let (cms, secrets) = self.location.read().node_objects(node);
        for h in held.iter().filter(|_| self.ready.is_ready()) {
            let (current, kind, used) = match h.resource_type.as_str() {
                "configmap" => (&self.configmaps, Kind::ConfigMap, &cms),
                "secret" => (&self.secrets, Kind::Secret, &secrets),
                _ => continue,
            };
            let key = (h.namespace.clone(), h.name.clone());
            if used.contains(&key) && current.get(&key).is_some_and(|(uid, _)| *uid == h.uid) {
                continue;
            }
            let object = stub(kind, &key, &h.uid);
            self.send(
                node,
                Operation::Delete,
                &h.resource_type,
                &key.0,
                &key.1,
                object,
            );
            deleted += 1;
        }
        // Configmaps and secrets its pods use.
        for (ty, kind, keys) in [
            ("configmap", Kind::ConfigMap, cms),
            ("secret", Kind::Secret, secrets),
        ] {
            for key in keys {
                let current = if kind == Kind::ConfigMap {
                    self.configmaps.get(&key)
                } else {
                    self.secrets.get(&key)
                };
                let Some((uid, rv)) = current.cloned() else {
                    continue;
                };
                let fresh = held_by_key
                    .get(&(ty, key.0.as_str(), key.1.as_str()))
                    .is_some_and(|h| h.uid == uid && h.resource_version >= rv);
                if fresh {
                    continue;
                }
                let path = rest::path(kind, Some(&key.0), Some(&key.1), None);
                match rest::call_retrying(
                    &self.client,
                    http::Method::GET,
                    &path,
                    "application/json",
                    None,
                )
                .await
                {
                    Ok(obj) => {
                        self.send(
                            node,
                            Operation::Update,
                            ty,
                            &key.0,
                            &key.1,
                            with_type_meta(obj, kind),
                        );
                        sent += 1;
                    }
                    Err(e) => {
                        tracing::debug!(node, ?key, error = %e, "cannot fetch object for resync")
                    }
                }
            }
        }
        if sent + deleted > 0 {
            tracing::info!(
                node,
                held = held.len(),
                sent,
                deleted,
                "resynchronised edge node"
            );
        } else {
            tracing::debug!(node, held = held.len(), "edge node up to date");
        }
    }
}

fn compact(v: &Value) -> Arc<str> {
    Arc::from(v.to_string())
}

fn expand(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or(Value::Null)
}

fn stub(kind: Kind, key: &ObjectKey, uid: &str) -> Value {
    with_type_meta(
        json!({"metadata": {"namespace": key.0, "name": key.1, "uid": uid}}),
        kind,
    )
}

fn object_key(meta: &kube::api::ObjectMeta) -> ObjectKey {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

fn parse_rv(rv: Option<&str>) -> u64 {
    rv.and_then(|r| r.parse().ok()).unwrap_or(0)
}

/// Hash of what the edge acts on: metadata without volatile fields, and spec.
fn fingerprint(pod: &Value) -> u64 {
    let mut meta = pod.get("metadata").cloned().unwrap_or(Value::Null);
    if let Some(m) = meta.as_object_mut() {
        for volatile in ["resourceVersion", "managedFields", "generation"] {
            m.remove(volatile);
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    meta.to_string().hash(&mut h);
    pod.get("spec")
        .map(Value::to_string)
        .unwrap_or_default()
        .hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_only_changes_keep_the_fingerprint() {
        let a = json!({"metadata": {"name": "p", "resourceVersion": "1"}, "spec": {"nodeName": "e"}, "status": {"phase": "Pending"}});
        let b = json!({"metadata": {"name": "p", "resourceVersion": "2"}, "spec": {"nodeName": "e"}, "status": {"phase": "Running"}});
        let c = json!({"metadata": {"name": "p", "resourceVersion": "3", "labels": {"x": "y"}}, "spec": {"nodeName": "e"}});
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&c));
    }
}
