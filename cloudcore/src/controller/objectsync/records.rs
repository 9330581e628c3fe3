//! All ObjectSync and ClusterObjectSync records in memory: one cluster-wide watcher per kind
//! (never one per node), plus what edges acknowledged and is not written yet, so a comparison
//! never resends what an edge already confirmed.

use super::{RecordKey, RecordSpec, api_resource};
use crate::metrics::SyncMetrics;
use futures_util::StreamExt;
use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kubeedge_shared::inventory::HeldObject;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

/// One record as last seen, with local knowledge layered on top.
#[derive(Debug, Clone, Default)]
pub struct Record {
    pub spec: RecordSpec,
    /// `status.objectResourceVersion` as stored (0 when unset).
    pub status_rv: u64,
    /// `metadata.resourceVersion`; `None` until the apiserver has shown us the record.
    pub meta_rv: Option<String>,
    /// Newest version the edge acknowledged (possibly not written yet).
    acked_rv: u64,
    /// The edge acknowledged the object's deletion; the record's removal is pending.
    acked_delete: bool,
}

impl Record {
    /// What the edge holds, as far as we know.
    fn held_rv(&self) -> u64 {
        self.status_rv.max(self.acked_rv)
    }
}

#[derive(Default)]
struct State {
    records: HashMap<RecordKey, Record>,
    by_node: HashMap<String, HashSet<RecordKey>>,
    /// Keys seen since a watcher's last `Init`, per scope (namespaced, cluster).
    relisting: [Option<HashSet<RecordKey>>; 2],
    synced: [bool; 2],
}

impl State {
    fn insert(&mut self, key: RecordKey, record: Record) {
        if let Some((node, _)) = key.node_and_uid() {
            self.by_node
                .entry(node.to_string())
                .or_default()
                .insert(key.clone());
        }
        self.records.insert(key, record);
    }

    fn remove(&mut self, key: &RecordKey) -> Option<Record> {
        let r = self.records.remove(key)?;
        if let Some((node, _)) = key.node_and_uid()
            && let Some(keys) = self.by_node.get_mut(node)
        {
            keys.remove(key);
            if keys.is_empty() {
                self.by_node.remove(node);
            }
        }
        Some(r)
    }
}

/// Shared handle to the records; cheap to clone.
#[derive(Clone)]
pub struct SyncRecords {
    inner: Arc<Inner>,
}

struct Inner {
    state: RwLock<State>,
    /// True while both kinds are served and listed.
    available: watch::Sender<bool>,
    /// Edge nodes deleted since the orphan cleanup last looked.
    deleted_nodes: Mutex<HashSet<String>>,
    node_deleted: Notify,
    metrics: SyncMetrics,
}

fn scope(cluster: bool) -> usize {
    usize::from(cluster)
}

/// Reads a record object; `None` for names that are not `<node>.<uid>`.
fn parse(obj: &DynamicObject, cluster: bool) -> Option<(RecordKey, Record)> {
    let key = RecordKey {
        namespace: if cluster {
            None
        } else {
            Some(obj.metadata.namespace.clone()?)
        },
        name: obj.metadata.name.clone()?,
    };
    key.node_and_uid()?;
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let spec = &obj.data["spec"];
    Some((
        key,
        Record {
            spec: RecordSpec {
                api_version: text(&spec["objectAPIVersion"]),
                kind: text(&spec["objectKind"]),
                object_name: text(&spec["objectName"]),
            },
            status_rv: obj.data["status"]["objectResourceVersion"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            meta_rv: obj.metadata.resource_version.clone(),
            ..Record::default()
        },
    ))
}

impl SyncRecords {
    pub fn new(metrics: SyncMetrics) -> Self {
        SyncRecords {
            inner: Arc::new(Inner {
                state: RwLock::new(State::default()),
                available: watch::channel(false).0,
                deleted_nodes: Mutex::new(HashSet::new()),
                node_deleted: Notify::new(),
                metrics,
            }),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.inner.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.inner.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Both kinds are served and have been listed.
    pub fn is_available(&self) -> bool {
        *self.inner.available.borrow()
    }

    /// Waits until the records are available; false on `shutdown`.
    pub async fn wait_available(&self, shutdown: &CancellationToken) -> bool {
        let mut rx = self.inner.available.subscribe();
        tokio::select! {
            _ = shutdown.cancelled() => false,
            r = rx.wait_for(|a| *a) => r.is_ok(),
        }
    }

    /// What `node` holds according to its records (objects of any kind; the resource type is
    /// the lower-cased kind). `None` while the records are not available.
    pub fn held_by(&self, node: &str) -> Option<Vec<HeldObject>> {
        if !self.is_available() {
            return None;
        }
        let st = self.read();
        let keys = st.by_node.get(node);
        Some(
            keys.into_iter()
                .flatten()
                .filter_map(|k| {
                    let r = st.records.get(k)?;
                    if r.acked_delete {
                        return None;
                    }
                    let (_, uid) = k.node_and_uid()?;
                    Some(HeldObject {
                        resource_type: kubeedge_shared::ResourceType::parse(
                            &r.spec.kind.to_lowercase(),
                        ),
                        namespace: k.namespace.clone().unwrap_or_default(),
                        name: r.spec.object_name.clone(),
                        uid: uid.to_string(),
                        resource_version: r.held_rv(),
                    })
                })
                .collect(),
        )
    }

    /// The record as last seen by the watcher or written by us.
    pub fn get(&self, key: &RecordKey) -> Option<Record> {
        self.read().records.get(key).cloned()
    }

    /// Every record of `node`.
    pub fn keys_of(&self, node: &str) -> Vec<RecordKey> {
        self.read()
            .by_node
            .get(node)
            .map(|k| k.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Nodes that have records.
    pub fn nodes(&self) -> Vec<String> {
        self.read().by_node.keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.read().records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The edge acknowledged `rv` of the object behind `key`.
    pub(super) fn note_acked(&self, key: &RecordKey, spec: &RecordSpec, rv: u64) {
        let mut st = self.write();
        match st.records.get_mut(key) {
            Some(r) => {
                r.acked_rv = r.acked_rv.max(rv);
                r.acked_delete = false;
            }
            None => {
                let record = Record {
                    spec: spec.clone(),
                    acked_rv: rv,
                    ..Record::default()
                };
                st.insert(key.clone(), record);
            }
        }
    }

    /// The edge acknowledged the deletion of the object behind `key`.
    pub(super) fn note_acked_delete(&self, key: &RecordKey) {
        if let Some(r) = self.write().records.get_mut(key) {
            r.acked_delete = true;
        }
    }

    /// A write could not be made: forget what was layered on top of the stored record.
    pub(super) fn forget_local(&self, key: &RecordKey) {
        let mut st = self.write();
        let placeholder = match st.records.get_mut(key) {
            Some(r) => {
                r.acked_rv = 0;
                r.acked_delete = false;
                r.meta_rv.is_none()
            }
            None => false,
        };
        if placeholder {
            st.remove(key);
        }
    }

    /// A record as the apiserver returned it after our write.
    pub(super) fn stored(&self, obj: &DynamicObject, cluster: bool) {
        if let Some((key, record)) = parse(obj, cluster) {
            self.apply_stored(key, record);
        }
    }

    /// A record deleted by us.
    pub(super) fn removed(&self, key: &RecordKey) {
        let mut st = self.write();
        st.remove(key);
        self.inner.metrics.records.set(st.records.len() as i64);
    }

    fn apply_stored(&self, key: RecordKey, mut record: Record) {
        let mut st = self.write();
        if let Some(old) = st.records.get(&key) {
            // Keep local knowledge; never go back to an older stored state (a watch event may
            // trail our own write's response).
            record.acked_rv = old.acked_rv;
            record.acked_delete = old.acked_delete;
            if old.meta_rv.is_some() && old.status_rv > record.status_rv {
                return;
            }
        }
        st.insert(key, record);
        self.inner.metrics.records.set(st.records.len() as i64);
    }

    /// An edge node was deleted: its records may now be orphans.
    pub fn node_deleted(&self, node: &str) {
        self.inner
            .deleted_nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node.to_string());
        self.inner.node_deleted.notify_one();
    }

    /// Waits for edge-node deletions and returns them.
    pub(super) async fn next_deleted_nodes(&self) -> Vec<String> {
        loop {
            let nodes: Vec<String> = self
                .inner
                .deleted_nodes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .drain()
                .collect();
            if !nodes.is_empty() {
                return nodes;
            }
            self.inner.node_deleted.notified().await;
        }
    }

    fn set_synced(&self, cluster: bool, synced: bool) {
        let both = {
            let mut st = self.write();
            st.synced[scope(cluster)] = synced;
            st.synced[0] && st.synced[1]
        };
        self.inner.available.send_if_modified(|a| {
            let changed = *a != both;
            *a = both;
            changed
        });
    }

    fn on_event(&self, cluster: bool, ev: Event<DynamicObject>) {
        let s = scope(cluster);
        match ev {
            Event::Init => self.write().relisting[s] = Some(HashSet::new()),
            Event::InitApply(o) | Event::Apply(o) => {
                if let Some((key, record)) = parse(&o, cluster) {
                    if let Some(seen) = self.write().relisting[s].as_mut() {
                        seen.insert(key.clone());
                    }
                    self.apply_stored(key, record);
                }
            }
            Event::Delete(o) => {
                if let Some((key, _)) = parse(&o, cluster) {
                    self.removed(&key);
                }
            }
            Event::InitDone => {
                {
                    let mut st = self.write();
                    let seen = st.relisting[s].take().unwrap_or_default();
                    let gone: Vec<RecordKey> = st
                        .records
                        .iter()
                        .filter(|(k, r)| {
                            k.namespace.is_none() == cluster
                                && r.meta_rv.is_some()
                                && !seen.contains(*k)
                        })
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in gone {
                        st.remove(&k);
                    }
                    self.inner.metrics.records.set(st.records.len() as i64);
                }
                self.set_synced(cluster, true);
            }
        }
    }

    /// Watches both kinds until `shutdown`. Without the CRDs: one warning, then a check every
    /// `crd_retry`.
    pub async fn run(self, client: kube::Client, crd_retry: Duration, shutdown: CancellationToken) {
        let namespaced = tokio::spawn(self.clone().watch_kind(
            client.clone(),
            false,
            crd_retry,
            shutdown.clone(),
        ));
        self.watch_kind(client, true, crd_retry, shutdown).await;
        let _ = namespaced.await;
    }

    async fn watch_kind(
        self,
        client: kube::Client,
        cluster: bool,
        crd_retry: Duration,
        shutdown: CancellationToken,
    ) {
        let ar = api_resource(cluster);
        let api: Api<DynamicObject> = Api::all_with(client, &ar);
        let mut missing_reported = false;
        let probe_params = ListParams::default().limit(1);
        loop {
            let probe = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = api.list(&probe_params) => r,
            };
            let wait = match probe {
                Ok(_) => None,
                Err(e) if is_not_found(&e) => {
                    if !missing_reported {
                        tracing::warn!(
                            crd = %format!("{}.{}", ar.plural, ar.group),
                            retry = ?crd_retry,
                            "ObjectSync CRDs are not installed: KubeEdge edges get everything they should hold on connect, but deletions made while they were offline are not delivered; apply the reliablesyncs.kubeedge.io CRDs (see README)"
                        );
                        missing_reported = true;
                    }
                    Some(crd_retry)
                }
                Err(e) => {
                    tracing::debug!(kind = %ar.kind, error = %e, "cannot list sync records; retrying");
                    Some(crd_retry.min(Duration::from_secs(10)))
                }
            };
            if let Some(wait) = wait {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(wait) => continue,
                }
            }
            if missing_reported {
                tracing::info!(kind = %ar.kind, "ObjectSync CRD found; recording deliveries to KubeEdge edges");
                missing_reported = false;
            }
            let mut events = watcher::watcher(api.clone(), watcher::Config::default())
                .default_backoff()
                .boxed();
            loop {
                let ev = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    ev = events.next() => ev,
                };
                match ev {
                    Some(Ok(ev)) => self.on_event(cluster, ev),
                    Some(Err(e)) if watch_not_found(&e) => {
                        tracing::warn!(kind = %ar.kind, "sync record kind no longer served");
                        self.set_synced(cluster, false);
                        break;
                    }
                    Some(Err(e)) => {
                        tracing::debug!(kind = %ar.kind, error = %e, "sync record watch failed; retrying with backoff")
                    }
                    None => break,
                }
            }
        }
    }
}

pub(super) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

fn watch_not_found(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => is_not_found(e),
        watcher::Error::WatchError(s) => s.code == 404,
        watcher::Error::NoResourceVersion => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(ns: Option<&str>, name: &str, kind: &str, object: &str, rv: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "resourceVersion": "100"},
            "spec": {"objectAPIVersion": "v1", "objectKind": kind, "objectName": object},
            "status": {"objectResourceVersion": rv},
        }))
        .unwrap()
    }

    fn available() -> SyncRecords {
        let r = SyncRecords::new(SyncMetrics::default());
        r.set_synced(false, true);
        r.set_synced(true, true);
        r
    }

    #[test]
    fn held_objects_come_from_records_of_that_node_only() {
        let r = available();
        r.on_event(
            false,
            Event::Apply(record(Some("ns"), "edge.a.uid-1", "Pod", "web", "7")),
        );
        r.on_event(
            false,
            Event::Apply(record(Some("ns"), "other.uid-2", "Pod", "db", "3")),
        );
        let held = r.held_by("edge.a").unwrap();
        assert_eq!(
            held,
            vec![HeldObject {
                resource_type: "pod".into(),
                namespace: "ns".into(),
                name: "web".into(),
                uid: "uid-1".into(),
                resource_version: 7,
            }]
        );
        assert!(r.held_by("nobody").unwrap().is_empty());
    }

    #[test]
    fn nothing_is_held_before_both_kinds_are_listed() {
        let r = SyncRecords::new(SyncMetrics::default());
        r.set_synced(false, true);
        assert_eq!(r.held_by("edge"), None);
        r.set_synced(true, true);
        assert_eq!(r.held_by("edge"), Some(vec![]));
    }

    #[test]
    fn acknowledged_state_counts_before_it_is_written() {
        let r = available();
        let key = RecordKey::new(Some("ns"), "edge", "u1");
        let spec = RecordSpec {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            object_name: "cfg".into(),
        };
        r.note_acked(&key, &spec, 9);
        assert_eq!(r.held_by("edge").unwrap()[0].resource_version, 9);
        // The stored record (older) arrives: the acknowledged version still counts.
        r.on_event(
            false,
            Event::Apply(record(Some("ns"), "edge.u1", "ConfigMap", "cfg", "4")),
        );
        assert_eq!(r.held_by("edge").unwrap()[0].resource_version, 9);
        r.note_acked_delete(&key);
        assert!(r.held_by("edge").unwrap().is_empty());
        r.on_event(
            false,
            Event::Delete(record(Some("ns"), "edge.u1", "ConfigMap", "cfg", "9")),
        );
        assert!(r.is_empty());
    }

    #[test]
    fn relist_drops_records_deleted_meanwhile_of_that_kind_only() {
        let r = available();
        r.on_event(
            false,
            Event::Apply(record(Some("ns"), "edge.u1", "Pod", "a", "1")),
        );
        r.on_event(
            true,
            Event::Apply(record(None, "edge.u2", "PersistentVolume", "pv", "1")),
        );
        r.on_event(false, Event::Init);
        r.on_event(false, Event::InitDone);
        let held = r.held_by("edge").unwrap();
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].resource_type, "persistentvolume");
    }
}
