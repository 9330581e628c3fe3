//! The object store: one table per group/resource, one cluster-wide resourceVersion counter,
//! a bounded event history per table (what a watch or a paginated list can go back to), and the
//! watch fan-out.
//!
//! Objects are immutable `Arc<Obj>` values serialized once when written; lists and watch events
//! share them. Every table has its own lock, and the resourceVersion is allocated while the
//! table's write lock is held, so each table's events are in resourceVersion order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use serde_json::Value;

use crate::lock::{read, write};
use crate::status::{ApiError, ApiResult};

mod table;
#[cfg(test)]
mod tests;
mod watchers;

pub use table::Table;
use table::TableState;
use watchers::Watchers;
pub use watchers::{Registration, WatcherGuard};

/// (namespace or "" for cluster-scoped, name)
pub type ObjKey = (String, String);

/// Fields extracted at write time so that selectors never parse the stored JSON: the union of
/// the built-in kinds' selectable fields.
pub const SELECTABLE: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
    "spec.unschedulable",
    "spec.clusterIP",
    "spec.type",
    "type",
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
];

const NODE_NAME: u8 = 0;

/// `remainingItemCount` is reported only up to this many remaining items.
const REMAINING_COUNT_LIMIT: u64 = 10_000;

/// A stored object revision: its serialized JSON plus the few fields the server looks at
/// without parsing (identity, labels, selectable fields). `value()` parses on demand.
#[derive(Debug)]
pub struct Obj {
    pub json: Bytes,
    pub rv: u64,
    namespace: Box<str>,
    name: Box<str>,
    uid: Box<str>,
    deleting: bool,
    labels: Box<[(Box<str>, Box<str>)]>,
    /// uids from `metadata.ownerReferences`.
    owners: Box<[Box<str>]>,
    /// `metadata.finalizers`.
    finalizers: Box<[Box<str>]>,
    /// (index into `SELECTABLE`, value) for non-empty values.
    fields: Box<[(u8, Box<str>)]>,
}

impl Obj {
    fn new(value: &Value, rv: u64) -> ApiResult<Self> {
        let json = serde_json::to_vec(value)
            .map_err(|e| ApiError::internal(format!("encoding object: {e}")))?;
        Ok(Self::with_json(value, Bytes::from(json), rv))
    }

    fn with_json(value: &Value, json: Bytes, rv: u64) -> Self {
        let meta = &value["metadata"];
        let s = |v: &Value| -> Box<str> { v.as_str().unwrap_or_default().into() };
        let labels = meta["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.as_str().into(), v.into())))
                    .collect()
            })
            .unwrap_or_default();
        let fields = SELECTABLE
            .iter()
            .enumerate()
            .filter_map(|(i, path)| {
                let v = super::selectors::field_value(value, path);
                (!v.is_empty()).then(|| (i as u8, v.into_boxed_str()))
            })
            .collect();
        Self {
            json,
            rv,
            namespace: s(&meta["namespace"]),
            name: s(&meta["name"]),
            uid: s(&meta["uid"]),
            deleting: !meta["deletionTimestamp"].is_null(),
            labels,
            owners: meta["ownerReferences"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|o| o["uid"].as_str().map(Into::into))
                        .collect()
                })
                .unwrap_or_default(),
            finalizers: meta["finalizers"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|f| f.as_str().map(Into::into))
                        .collect()
                })
                .unwrap_or_default(),
            fields,
        }
    }

    /// An object that is not stored (dry-run results).
    pub fn detached(value: Value) -> ApiResult<Self> {
        let rv = value["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        Self::new(&value, rv)
    }

    /// The object as JSON (parsed from the stored bytes).
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn key(&self) -> ObjKey {
        (self.namespace.to_string(), self.name.to_string())
    }

    pub fn uid(&self) -> &str {
        &self.uid
    }

    /// `metadata.deletionTimestamp` is set.
    pub fn deleting(&self) -> bool {
        self.deleting
    }

    /// uids of the owners in `metadata.ownerReferences`.
    pub fn owners(&self) -> impl Iterator<Item = &str> {
        self.owners.iter().map(|o| &**o)
    }

    pub fn has_finalizer(&self, f: &str) -> bool {
        self.finalizers.iter().any(|x| &**x == f)
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| &**k == key)
            .map(|(_, v)| &**v)
    }

    /// A selectable field's string form; parses the JSON only for fields not extracted.
    pub fn field(&self, path: &str) -> std::borrow::Cow<'_, str> {
        use std::borrow::Cow;
        match path {
            "metadata.name" => Cow::Borrowed(&self.name),
            "metadata.namespace" => Cow::Borrowed(&self.namespace),
            _ => match SELECTABLE.iter().position(|p| *p == path) {
                Some(i) => Cow::Borrowed(
                    self.fields
                        .iter()
                        .find(|(j, _)| usize::from(*j) == i)
                        .map(|(_, v)| &**v)
                        .unwrap_or_default(),
                ),
                None => Cow::Owned(super::selectors::field_value(&self.value(), path)),
            },
        }
    }

    fn node_name(&self) -> Option<&str> {
        self.fields
            .iter()
            .find(|(j, _)| *j == NODE_NAME)
            .map(|(_, v)| &**v)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

#[derive(Debug)]
struct HistEvent {
    rv: u64,
    key: ObjKey,
    ty: EventType,
    /// The new revision, or for deletions the last state carrying the deletion's resourceVersion.
    obj: Arc<Obj>,
    /// The state before this event.
    prev: Option<Arc<Obj>>,
}

/// What a watcher receives.
#[derive(Debug, Clone)]
pub enum WatchItem {
    Event(EventType, Arc<Obj>),
    /// The object stopped matching the watcher's selectors: a DELETED event carrying its previous
    /// content at the event's resourceVersion (what the real watch cache sends).
    Departed(Arc<Obj>, u64),
    Bookmark(u64),
}

impl WatchItem {
    pub fn rv(&self) -> u64 {
        match self {
            WatchItem::Event(_, o) => o.rv,
            WatchItem::Departed(_, rv) | WatchItem::Bookmark(rv) => *rv,
        }
    }
}

/// What a write decided to do with the current object.
pub enum Mutation {
    Unchanged,
    Put(Value),
    Remove,
}

#[derive(Debug)]
pub enum Outcome {
    Unchanged(Option<Arc<Obj>>),
    Created(Arc<Obj>),
    Updated(Arc<Obj>),
    /// The deleted object, with the deletion's resourceVersion.
    Removed(Arc<Obj>),
}

impl Outcome {
    pub fn object(&self) -> Option<&Arc<Obj>> {
        match self {
            Outcome::Unchanged(o) => o.as_ref(),
            Outcome::Created(o) | Outcome::Updated(o) | Outcome::Removed(o) => Some(o),
        }
    }
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Events kept per table for watches from an older resourceVersion and paginated lists.
    pub history_limit: usize,
    /// Events buffered per watcher before it is dropped as too slow.
    pub watch_capacity: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            history_limit: 10_000,
            watch_capacity: 1024,
        }
    }
}

/// How a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// Events after this resourceVersion.
    After(u64),
    /// Synthetic ADDED events for the current state, then live events.
    InitialState,
}

/// One list page.
#[derive(Debug)]
pub struct ListPage {
    pub items: Vec<Arc<Obj>>,
    pub rv: u64,
    /// Key of the last item returned when more items follow.
    pub next: Option<ObjKey>,
    pub remaining: Option<u64>,
}

pub struct Store {
    rv: Arc<AtomicU64>,
    deletions: Arc<AtomicU64>,
    tables: RwLock<HashMap<(String, String), Arc<Table>>>,
    cfg: StoreConfig,
}

impl Store {
    pub fn new(cfg: StoreConfig) -> Self {
        Self {
            rv: Arc::new(AtomicU64::new(1)),
            deletions: Arc::new(AtomicU64::new(0)),
            tables: RwLock::new(HashMap::new()),
            cfg,
        }
    }

    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    pub fn current_rv(&self) -> u64 {
        self.rv.load(Ordering::SeqCst)
    }

    /// The table of a group/resource, created on first use.
    pub fn table(&self, group: &str, resource: &str) -> Arc<Table> {
        let key = (group.to_string(), resource.to_string());
        if let Some(t) = read(&self.tables).get(&key) {
            return t.clone();
        }
        write(&self.tables)
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(Table {
                    key,
                    rv: self.rv.clone(),
                    deletions: self.deletions.clone(),
                    cfg: self.cfg.clone(),
                    state: RwLock::new(TableState::default()),
                })
            })
            .clone()
    }

    pub fn tables(&self) -> Vec<Arc<Table>> {
        read(&self.tables).values().cloned().collect()
    }

    /// How many objects have been removed so far, plus deletions that started foreground or
    /// orphan propagation (lets the garbage collector skip idle passes).
    pub fn deletions(&self) -> u64 {
        self.deletions.load(Ordering::SeqCst)
    }

    /// A deletion started propagating (foreground or orphan): the garbage collector has work.
    pub fn note_propagating_deletion(&self) {
        self.deletions.fetch_add(1, Ordering::SeqCst);
    }

    /// Restores the counter after loading a snapshot; never moves it backwards.
    pub fn advance_rv_to(&self, rv: u64) {
        self.rv.fetch_max(rv, Ordering::SeqCst);
    }
}
