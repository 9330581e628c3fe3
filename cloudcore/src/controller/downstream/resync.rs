//! Bringing a (re)connected edge's copy up to date with the least traffic.
//!
//! A kubeedge-rs edge sends its inventory; a KubeEdge edge is compared with its ObjectSync
//! records. Either way the answer — updates for what it lacks or holds stale, deletes for what
//! it should not hold — is computed only from a view that is complete for that node: every
//! watcher has listed and none is relisting, and the node's pods are known (`pods.rs`). Until
//! then the request waits (the newest one per node). Even then an object the edge holds at a
//! resourceVersion newer than anything this cloudcore's watcher has delivered is left alone:
//! this cloudcore is behind (another replica served the edge), and its watcher brings the
//! change, or the delete, later. A delete sent in error would be worse than one sent late: the
//! node's queue treats a delete as final for that UID.

use super::configs::stub;
use super::{ConfigKind, ConfigKindExt, ConfigWant, Downstream, Fetch, Fetched, HeldObject};
use crate::controller::kind::Kind;
use crate::controller::location::ObjectKey;
use k8s_openapi::api::core::v1::Pod;
use kubeedge_shared::{Operation, ResourceType};
use std::collections::{HashMap, HashSet};

/// What a node is compared with.
pub(super) enum Held {
    /// A kubeedge-rs edge's inventory.
    Inventory(Vec<HeldObject>),
    /// A KubeEdge edge: its ObjectSync records, read when the answer is computed.
    Records,
    /// Not known (hub events were missed): everything is sent, nothing deleted.
    Unknown,
}

/// Resyncs waiting for a complete view, and the fetches resyncs have under way.
#[derive(Default)]
pub(super) struct Resyncs {
    pub(super) pending: HashMap<String, Held>,
    /// node → objects a [`Fetch::Configs`] is getting for it.
    fetching: HashMap<String, HashSet<(ConfigKind, ObjectKey)>>,
    /// node → pods a [`Fetch::Pods`] is getting for it.
    fetching_pods: HashMap<String, HashSet<ObjectKey>>,
    /// Pods fetched again because a list answered from behind the watcher, and how often.
    refetched: HashMap<(String, ObjectKey), u8>,
    /// node → when its resync was asked for, until everything it needed was sent.
    started: HashMap<String, std::time::Instant>,
}

/// Times a pod is fetched again when the apiserver's list is behind the watcher (a consistent
/// list never is): then it is left to the next resync.
const MAX_REFETCHES: u8 = 3;

impl Resyncs {
    /// A fetch answered: its objects are no longer under way.
    pub(super) fn fetched(&mut self, node: &str, objects: &[Fetched]) {
        if let Some(keys) = self.fetching.get_mut(node) {
            for f in objects {
                keys.remove(&(f.kind, f.key.clone()));
            }
            if keys.is_empty() {
                self.fetching.remove(node);
            }
        }
    }
}

/// What one resync did, for the log.
#[derive(Default)]
struct Tally {
    deleted: usize,
    /// Pods sent from what the watcher delivered lately.
    sent: usize,
    /// Held objects newer than this cloudcore's view: left alone.
    unsure: usize,
    fetching: usize,
}

impl Downstream {
    /// Brings `node` up to date as soon as the view is complete for it.
    pub(super) fn request_resync(&mut self, node: &str, held: Held) {
        let keep_inventory = matches!(held, Held::Unknown)
            && matches!(self.resyncs.pending.get(node), Some(Held::Inventory(_)));
        if !keep_inventory {
            self.resyncs.pending.insert(node.to_string(), held);
        }
        self.resyncs
            .started
            .entry(node.to_string())
            .or_insert_with(std::time::Instant::now);
        self.answer_pending_of(node);
    }

    /// A resync whose answer is complete (nothing waiting, nothing being read) is timed.
    pub(super) fn resync_settled(&mut self, node: &str) {
        let r = &mut self.resyncs;
        if r.pending.contains_key(node)
            || r.fetching.contains_key(node)
            || r.fetching_pods.contains_key(node)
        {
            return;
        }
        if let Some(t) = r.started.remove(node)
            && let Some(h) = &self.resync_duration
        {
            h.observe(t.elapsed().as_secs_f64());
        }
    }

    /// A session ended: a resync waiting for it is moot (the next session asks again).
    pub(super) fn forget_session(&mut self, node: &str) {
        if !self.hub.is_connected(node) {
            self.resyncs.pending.remove(node);
            self.resyncs.started.remove(node);
            // A new session reports its status anyway.
            self.pods.told_unknown.remove(node);
        }
    }

    /// Whether this actor knows everything `node` should hold.
    fn view_complete(&self, node: &str) -> bool {
        self.all_synced() && self.relisting.is_empty() && self.pods.known.contains(node)
    }

    pub(super) fn answer_pending_of(&mut self, node: &str) {
        if !self.resyncs.pending.contains_key(node) {
            return;
        }
        if !self.hub.is_connected(node) {
            self.resyncs.pending.remove(node);
            self.resyncs.started.remove(node);
            return;
        }
        if !self.view_complete(node) {
            tracing::debug!(
                node,
                synced = self.all_synced(),
                relisting = !self.relisting.is_empty(),
                pods_known = self.pods.known.contains(node),
                "resync of edge node deferred until its view is complete"
            );
            return;
        }
        if let Some(held) = self.resyncs.pending.remove(node) {
            self.resync(node, held);
        }
    }

    /// Answers every waiting resync whose view is now complete.
    pub(super) fn answer_pending(&mut self) {
        let nodes: Vec<String> = self.resyncs.pending.keys().cloned().collect();
        for node in nodes {
            self.answer_pending_of(&node);
        }
    }

    /// synccontroller's periodic pass, for the KubeEdge edges connected here.
    pub(super) fn compare_recorded_edges(&mut self) {
        if !self.records.as_ref().is_some_and(|r| r.is_available()) {
            return;
        }
        for node in self.hub.connected_nodes() {
            let kubeedge = self
                .hub
                .capabilities(&node)
                .is_some_and(|c| !c.inventory_resync);
            if kubeedge && self.view_complete(&node) && !self.resyncs.pending.contains_key(&node) {
                self.resync(&node, Held::Records);
            }
        }
    }

    /// Asks for the current copies of `keys` (pods on `node`) unless already under way.
    fn fetch_pods(&mut self, node: &str, keys: Vec<ObjectKey>, tally: &mut Tally) {
        let under_way = self
            .resyncs
            .fetching_pods
            .entry(node.to_string())
            .or_default();
        let keys: Vec<ObjectKey> = keys
            .into_iter()
            .filter(|k| under_way.insert(k.clone()))
            .collect();
        if under_way.is_empty() {
            self.resyncs.fetching_pods.remove(node);
        }
        if keys.is_empty() {
            return;
        }
        tally.fetching += keys.len();
        let fetch = Fetch::Pods {
            node: node.to_string(),
            keys,
        };
        if self.fetch.send(fetch).is_err() {
            tracing::debug!("fetcher gone (shutting down)");
        }
    }

    /// Sends `node` the fetched pods it asked for that are still bound to it, of the same
    /// incarnation and at least as new as what the watcher delivered.
    pub(super) fn pods_fetched(&mut self, node: &str, keys: &[ObjectKey], pods: Vec<Pod>) {
        if let Some(under_way) = self.resyncs.fetching_pods.get_mut(node) {
            for k in keys {
                under_way.remove(k);
            }
            if under_way.is_empty() {
                self.resyncs.fetching_pods.remove(node);
            }
        }
        let mut sent = 0usize;
        let mut behind = Vec::new();
        for pod in pods {
            let key = super::object_key(&pod.metadata);
            let Some(known) = self.pods.pods.get(&key) else {
                continue; // gone meanwhile: its delete was sent
            };
            if &*known.node != node || pod.metadata.uid.as_deref() != Some(known.uid.as_str()) {
                continue;
            }
            let rv = super::parse_rv(pod.metadata.resource_version.as_deref());
            let refetch_key = (node.to_string(), key.clone());
            if rv < known.rv {
                // The list answered from behind the watcher: ask again, a few times.
                let n = self.resyncs.refetched.entry(refetch_key).or_default();
                *n += 1;
                if *n <= MAX_REFETCHES {
                    behind.push(key);
                } else {
                    tracing::warn!(node, pod = ?key, "the apiserver keeps answering an older copy of a pod than it watched; left to the next resync");
                    self.resyncs.refetched.remove(&(node.to_string(), key));
                }
                continue;
            }
            self.resyncs.refetched.remove(&refetch_key);
            if let Some(value) = super::pods::pod_value(&pod) {
                self.send(
                    node,
                    Operation::Update,
                    ResourceType::Pod,
                    &key.0,
                    &key.1,
                    value,
                );
                sent += 1;
            }
        }
        if !behind.is_empty() {
            let mut tally = Tally::default();
            self.fetch_pods(node, behind, &mut tally);
        }
        if sent > 0 {
            tracing::debug!(node, sent, "sent pods fetched for a resync");
        }
        self.resync_settled(node);
    }

    /// Sends `node` the difference between what it holds and what it should hold.
    fn resync(&mut self, node: &str, held: Held) {
        let held = match held {
            Held::Inventory(h) => h,
            Held::Records => self
                .records
                .as_ref()
                .and_then(|r| r.held_by(node))
                .unwrap_or_default(),
            Held::Unknown => Vec::new(),
        };
        let held_by_key: HashMap<(&str, &str, &str), &HeldObject> = held
            .iter()
            .map(|h| {
                let key = (
                    h.resource_type.as_str(),
                    h.namespace.as_str(),
                    h.name.as_str(),
                );
                (key, h)
            })
            .collect();
        let mut tally = Tally::default();

        // Pods the node should run: those it lacks or holds stale are fetched off the loop
        // and sent when the answer comes (`pods_fetched`).
        let mine: Vec<(ObjectKey, u64, String)> = self
            .location
            .read()
            .pods_of(node)
            .into_iter()
            .filter_map(|k| {
                let p = self.pods.pods.get(&k)?;
                let (rv, uid) = (p.rv, p.uid.clone());
                Some((k, rv, uid))
            })
            .collect();
        let mut wanted: HashSet<(&str, &str)> = HashSet::new();
        let mut pods_to_send = Vec::new();
        for (key, rv, uid) in &mine {
            wanted.insert((key.0.as_str(), key.1.as_str()));
            match held_by_key.get(&("pod", key.0.as_str(), key.1.as_str())) {
                Some(h) if h.uid == *uid && h.resource_version >= *rv => {}
                Some(h) if h.uid != *uid => {
                    let old = stub(Kind::Pod, key, &h.uid);
                    self.send(
                        node,
                        Operation::Delete,
                        ResourceType::Pod,
                        &key.0,
                        &key.1,
                        old,
                    );
                    tally.deleted += 1;
                    pods_to_send.push(key.clone());
                }
                _ => pods_to_send.push(key.clone()),
            }
        }
        // What the watcher delivered lately is sent as delivered; the rest is read.
        let mut to_fetch = Vec::new();
        for key in pods_to_send {
            let kept = self
                .pods
                .pods
                .get(&key)
                .and_then(|p| self.pods.recent.get(&key, &p.uid, p.rv));
            match kept {
                Some(pod) => {
                    self.send(
                        node,
                        Operation::Update,
                        ResourceType::Pod,
                        &key.0,
                        &key.1,
                        pod,
                    );
                    tally.sent += 1;
                }
                None => to_fetch.push(key),
            }
        }
        self.fetch_pods(node, to_fetch, &mut tally);
        // Pods the node holds but should not.
        let mut pods_unsure = false;
        for h in held.iter().filter(|h| h.resource_type == ResourceType::Pod) {
            if wanted.contains(&(h.namespace.as_str(), h.name.as_str())) {
                continue;
            }
            if h.resource_version > self.pods.max_rv {
                pods_unsure = true;
                tally.unsure += 1;
                continue;
            }
            let key = (h.namespace.clone(), h.name.clone());
            let old = stub(Kind::Pod, &key, &h.uid);
            self.send(
                node,
                Operation::Delete,
                ResourceType::Pod,
                &key.0,
                &key.1,
                old,
            );
            tally.deleted += 1;
        }
        // Configmaps and secrets it holds that are gone, were replaced, or that none of its
        // pods uses any more (nothing would keep them fresh) — before any update, so a
        // replacement is not deleted after it arrives.
        let (cms, secrets) = self.location.read().node_objects(node);
        for h in &held {
            let Some(kind) = ConfigKind::of(&h.resource_type) else {
                continue;
            };
            let used = match kind {
                ConfigKind::ConfigMap => &cms,
                ConfigKind::Secret => &secrets,
            };
            let key = (h.namespace.clone(), h.name.clone());
            let current = self.configs(kind).versions.get(&key);
            if used.contains(&key) && current.is_some_and(|(uid, _)| *uid == h.uid) {
                continue;
            }
            // Unused by pods this cloudcore may not have heard of yet, or gone from a view
            // older than the edge's copy: not for this cloudcore to decide.
            let unsure = (!used.contains(&key) && pods_unsure)
                || (current.is_none() && h.resource_version > self.configs(kind).max_rv);
            if unsure {
                tally.unsure += 1;
                continue;
            }
            let old = stub(kind.api_kind(), &key, &h.uid);
            self.send_config(node, Operation::Delete, kind, &key, old);
            tally.deleted += 1;
        }
        // Configmaps and secrets its pods use that it lacks or holds stale: fetched off the
        // loop, sent when the answer comes (`configs_fetched`).
        let mut fetch = Vec::new();
        for (kind, keys) in [(ConfigKind::ConfigMap, cms), (ConfigKind::Secret, secrets)] {
            for key in keys {
                let Some((uid, rv)) = self.configs(kind).versions.get(&key) else {
                    continue;
                };
                let fresh = held_by_key
                    .get(&(kind.type_token(), key.0.as_str(), key.1.as_str()))
                    .is_some_and(|h| h.uid == *uid && h.resource_version >= *rv);
                let under_way = self
                    .resyncs
                    .fetching
                    .get(node)
                    .is_some_and(|f| f.contains(&(kind, key.clone())));
                if !fresh && !under_way {
                    fetch.push(ConfigWant { kind, key, rv: *rv });
                }
            }
        }
        if !fetch.is_empty() {
            tally.fetching = fetch.len();
            self.resyncs
                .fetching
                .entry(node.to_string())
                .or_default()
                .extend(fetch.iter().map(|w| (w.kind, w.key.clone())));
            let node = node.to_string();
            if self
                .fetch
                .send(Fetch::Configs { node, keys: fetch })
                .is_err()
            {
                tracing::debug!("fetcher gone (shutting down)");
            }
        }
        if tally.deleted + tally.sent + tally.fetching + tally.unsure > 0 {
            tracing::info!(
                node,
                held = held.len(),
                deleted = tally.deleted,
                sent = tally.sent,
                fetching = tally.fetching,
                unsure = tally.unsure,
                "resynchronised edge node"
            );
        } else {
            tracing::debug!(node, held = held.len(), "edge node up to date");
        }
        self.resync_settled(node);
    }
}
