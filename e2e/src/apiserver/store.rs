//! The object store: one table per group/resource, one cluster-wide resourceVersion counter,
//! a bounded event history per table (what a watch or a paginated list can go back to), and the
//! watch fan-out.
//!
//! Objects are immutable `Arc<Obj>` values serialized once when written; lists and watch events
//! share them. Every table has its own lock, and the resourceVersion is allocated while the
//! table's write lock is held, so each table's events are in resourceVersion order.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;

use super::lock::{read, write};
use super::selectors::Filter;
use super::status::{ApiError, ApiResult};

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

    /// How many objects have been removed so far (lets the garbage collector skip idle passes).
    pub fn deletions(&self) -> u64 {
        self.deletions.load(Ordering::SeqCst)
    }

    /// Restores the counter after loading a snapshot; never moves it backwards.
    pub fn advance_rv_to(&self, rv: u64) {
        self.rv.fetch_max(rv, Ordering::SeqCst);
    }
}

#[derive(Default)]
struct TableState {
    objects: BTreeMap<ObjKey, Arc<Obj>>,
    /// spec.nodeName -> keys (pods), for per-node lists.
    by_node: HashMap<Box<str>, std::collections::BTreeSet<ObjKey>>,
    history: VecDeque<Arc<HistEvent>>,
    /// Every event with a resourceVersion above this is still in `history`.
    floor_rv: u64,
    watchers: Watchers,
}

/// Fields watchers can be indexed by (an exact `field=value` selector), so that an event is
/// matched only against the watchers that can want it.
const INDEXED_FIELDS: [&str; 2] = ["metadata.name", "spec.nodeName"];

#[derive(Default)]
struct Watchers {
    next_id: u64,
    unindexed: HashMap<u64, WatcherEntry>,
    indexed: HashMap<u64, WatcherEntry>,
    index: HashMap<(usize, String), Vec<u64>>,
}

struct WatcherEntry {
    ns: Option<String>,
    filter: Arc<Filter>,
    tx: mpsc::Sender<WatchItem>,
    bookmarks: bool,
    index_key: Option<(usize, String)>,
}

impl WatcherEntry {
    fn passes(&self, o: &Obj) -> bool {
        self.ns.as_deref().is_none_or(|ns| o.namespace() == ns) && self.filter.matches(o)
    }

    fn item_for(&self, ev: &HistEvent) -> Option<WatchItem> {
        let cur = ev.ty != EventType::Deleted && self.passes(&ev.obj);
        let old = ev.prev.as_ref().is_some_and(|p| self.passes(p));
        match (ev.ty, cur, old) {
            (EventType::Deleted, _, true) => {
                Some(WatchItem::Event(EventType::Deleted, ev.obj.clone()))
            }
            (EventType::Deleted, _, false) => None,
            (_, true, true) => Some(WatchItem::Event(EventType::Modified, ev.obj.clone())),
            (_, true, false) => Some(WatchItem::Event(EventType::Added, ev.obj.clone())),
            (_, false, true) => ev
                .prev
                .as_ref()
                .map(|p| WatchItem::Departed(p.clone(), ev.rv)),
            (_, false, false) => None,
        }
    }
}

impl Watchers {
    fn remove(&mut self, id: u64) {
        self.unindexed.remove(&id);
        if let Some(e) = self.indexed.remove(&id)
            && let Some(k) = e.index_key
            && let Some(ids) = self.index.get_mut(&k)
        {
            ids.retain(|i| *i != id);
            if ids.is_empty() {
                self.index.remove(&k);
            }
        }
    }

    fn get(&self, id: u64) -> Option<&WatcherEntry> {
        self.unindexed.get(&id).or_else(|| self.indexed.get(&id))
    }

    fn notify(&mut self, ev: &HistEvent) {
        let mut dead = Vec::new();
        for (id, w) in &self.unindexed {
            if let Some(item) = w.item_for(ev)
                && w.tx.try_send(item).is_err()
            {
                dead.push(*id);
            }
        }
        if !self.indexed.is_empty() {
            let mut ids: Vec<u64> = Vec::new();
            for o in std::iter::once(&ev.obj).chain(ev.prev.iter()) {
                for (fi, field) in INDEXED_FIELDS.iter().enumerate() {
                    let v = o.field(field).into_owned();
                    if let Some(list) = self.index.get(&(fi, v)) {
                        ids.extend_from_slice(list);
                    }
                }
            }
            ids.sort_unstable();
            ids.dedup();
            for id in ids {
                if let Some(w) = self.indexed.get(&id)
                    && let Some(item) = w.item_for(ev)
                    && w.tx.try_send(item).is_err()
                {
                    dead.push(id);
                }
            }
        }
        for id in dead {
            tracing::info!(
                watcher = id,
                "closing a watcher that fell behind (buffer full) or went away"
            );
            self.remove(id);
        }
    }

    fn all(&self) -> impl Iterator<Item = (&u64, &WatcherEntry)> {
        self.unindexed.iter().chain(self.indexed.iter())
    }
}

/// A live watch registration: the backlog to send first, then live items from `rx`.
pub struct Registration {
    pub initial: Vec<WatchItem>,
    /// The resourceVersion the backlog brings the watcher to.
    pub start_rv: u64,
    pub rx: mpsc::Receiver<WatchItem>,
    pub guard: WatcherGuard,
}

/// Unregisters the watcher when dropped (the client went away or the stream ended).
pub struct WatcherGuard {
    table: Weak<Table>,
    id: u64,
}

impl WatcherGuard {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Asks for a bookmark at the current resourceVersion, delivered in order through the stream.
    pub fn request_bookmark(&self) {
        if let Some(t) = self.table.upgrade() {
            let st = read(&t.state);
            if let Some(w) = st.watchers.get(self.id) {
                let _ =
                    w.tx.try_send(WatchItem::Bookmark(t.rv.load(Ordering::SeqCst)));
            }
        }
    }
}

impl Drop for WatcherGuard {
    fn drop(&mut self) {
        if let Some(t) = self.table.upgrade() {
            write(&t.state).watchers.remove(self.id);
        }
    }
}

pub struct Table {
    key: (String, String),
    rv: Arc<AtomicU64>,
    deletions: Arc<AtomicU64>,
    cfg: StoreConfig,
    state: RwLock<TableState>,
}

impl Table {
    pub fn group_resource(&self) -> &(String, String) {
        &self.key
    }

    pub fn get(&self, key: &ObjKey) -> Option<Arc<Obj>> {
        read(&self.state).objects.get(key).cloned()
    }

    pub fn len(&self) -> usize {
        read(&self.state).objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Node names that have pods bound to them (from the `spec.nodeName` index).
    pub fn indexed_node_names(&self) -> Vec<String> {
        read(&self.state)
            .by_node
            .keys()
            .map(|k| k.to_string())
            .collect()
    }

    /// Keys of the objects bound to `node`.
    pub fn keys_on_node(&self, node: &str) -> Vec<ObjKey> {
        read(&self.state)
            .by_node
            .get(node)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Every object (controllers and snapshots).
    pub fn all(&self) -> Vec<Arc<Obj>> {
        read(&self.state).objects.values().cloned().collect()
    }

    /// Objects of one namespace.
    pub fn in_namespace(&self, ns: &str) -> Vec<Arc<Obj>> {
        let st = read(&self.state);
        let (lo, hi) = ns_range(Some(ns));
        st.objects.range((lo, hi)).map(|(_, o)| o.clone()).collect()
    }

    /// Reads the current object, lets `f` decide, and applies the decision atomically.
    pub fn mutate(
        &self,
        key: &ObjKey,
        f: impl FnOnce(Option<&Arc<Obj>>) -> ApiResult<Mutation>,
    ) -> ApiResult<Outcome> {
        let mut st = write(&self.state);
        let cur = st.objects.get(key).cloned();
        match f(cur.as_ref())? {
            Mutation::Unchanged => Ok(Outcome::Unchanged(cur)),
            Mutation::Put(mut value) => {
                if !value["metadata"].is_object() {
                    return Err(ApiError::internal("object without metadata"));
                }
                if let Some(c) = &cur {
                    value["metadata"]["resourceVersion"] = Value::String(c.rv.to_string());
                    let same = serde_json::to_vec(&value).is_ok_and(|b| b == c.json);
                    if same {
                        return Ok(Outcome::Unchanged(cur));
                    }
                }
                let rv = self.rv.fetch_add(1, Ordering::SeqCst) + 1;
                value["metadata"]["resourceVersion"] = Value::String(rv.to_string());
                let obj = Arc::new(Obj::new(&value, rv)?);
                drop(value);
                st.index_remove(cur.as_deref());
                st.index_add(&obj);
                st.objects.insert(key.clone(), obj.clone());
                let ty = if cur.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                st.record(
                    &self.cfg,
                    HistEvent {
                        rv,
                        key: key.clone(),
                        ty,
                        obj: obj.clone(),
                        prev: cur,
                    },
                );
                Ok(match ty {
                    EventType::Added => Outcome::Created(obj),
                    _ => Outcome::Updated(obj),
                })
            }
            Mutation::Remove => {
                let Some(c) = cur else {
                    return Ok(Outcome::Unchanged(None));
                };
                let rv = self.rv.fetch_add(1, Ordering::SeqCst) + 1;
                let mut value = c.value();
                value["metadata"]["resourceVersion"] = Value::String(rv.to_string());
                let tomb = Arc::new(Obj::new(&value, rv)?);
                st.index_remove(Some(&c));
                st.objects.remove(key);
                self.deletions.fetch_add(1, Ordering::SeqCst);
                st.record(
                    &self.cfg,
                    HistEvent {
                        rv,
                        key: key.clone(),
                        ty: EventType::Deleted,
                        obj: tomb.clone(),
                        prev: Some(c),
                    },
                );
                Ok(Outcome::Removed(tomb))
            }
        }
    }

    /// Loads an object from a snapshot without events.
    pub fn restore(&self, value: Value) -> ApiResult<()> {
        let rv = value["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        let obj = Arc::new(Obj::new(&value, rv)?);
        let mut st = write(&self.state);
        st.index_add(&obj);
        st.objects.insert(obj.key(), obj);
        st.floor_rv = st.floor_rv.max(self.rv.load(Ordering::SeqCst));
        Ok(())
    }

    /// One page of a list. `at` asks for the state at an older resourceVersion (continue tokens,
    /// `resourceVersionMatch=Exact`), rebuilt from the history.
    pub fn list(
        &self,
        ns: Option<&str>,
        at: Option<u64>,
        after: Option<&ObjKey>,
        limit: Option<usize>,
        filter: &Filter,
    ) -> ApiResult<ListPage> {
        let st = read(&self.state);
        let current = self.rv.load(Ordering::SeqCst);
        let (lo, hi) = ns_range(ns);
        let lo = match after {
            Some(k) if range_contains(&lo, &Bound::Unbounded, k) => Bound::Excluded(k.clone()),
            _ => lo,
        };
        if !valid_range(&lo, &hi) {
            return Ok(ListPage {
                items: Vec::new(),
                rv: at.unwrap_or(current).min(current),
                next: None,
                remaining: None,
            });
        }
        let snapshot_rv = match at {
            Some(r) if r > current => {
                return Err(ApiError {
                    code: 504,
                    reason: "Timeout",
                    message: format!("Too large resource version: {r}, current: {current}"),
                    details: None,
                });
            }
            Some(r) if r < current => Some(r),
            _ => None,
        };
        let overlay: BTreeMap<ObjKey, Option<Arc<Obj>>> = match snapshot_rv {
            Some(r) => {
                if r < st.floor_rv {
                    return Err(ApiError::continue_expired());
                }
                let mut m = BTreeMap::new();
                for ev in st.history.iter().rev().take_while(|e| e.rv > r) {
                    if range_contains(&lo, &hi, &ev.key) {
                        m.insert(ev.key.clone(), ev.prev.clone());
                    }
                }
                m
            }
            None => BTreeMap::new(),
        };
        let rv = snapshot_rv.unwrap_or(current);
        let limit = limit.filter(|l| *l > 0);
        let by_node = match (snapshot_rv, filter.exact_field("spec.nodeName")) {
            (None, Some(node)) if !node.is_empty() => Some(st.by_node.get(node)),
            _ => None,
        };
        let candidates: Box<dyn Iterator<Item = Arc<Obj>> + '_> = if let Some(set) = by_node {
            Box::new(
                set.into_iter()
                    .flat_map(move |keys| keys.range((lo.clone(), hi.clone())))
                    .filter_map(|k| st.objects.get(k).cloned()),
            )
        } else if overlay.is_empty() {
            Box::new(st.objects.range((lo, hi)).map(|(_, o)| o.clone()))
        } else {
            Box::new(MergeWithOverlay {
                cur: st.objects.range((lo, hi)).peekable(),
                ovl: overlay.into_iter().peekable(),
            })
        };
        let mut items = Vec::new();
        let mut next = None;
        let mut remaining: Option<u64> = filter.is_empty().then_some(0);
        for obj in candidates {
            if !filter.matches(obj.as_ref()) {
                continue;
            }
            if let Some(l) = limit
                && items.len() >= l
            {
                if next.is_none() {
                    next = items.last().map(|o: &Arc<Obj>| o.key());
                    if !filter.is_empty() {
                        break;
                    }
                }
                // Counting the rest costs a scan: only report it when it is cheap.
                remaining = remaining
                    .map(|r| r + 1)
                    .filter(|r| *r <= REMAINING_COUNT_LIMIT);
                if remaining.is_none() {
                    break;
                }
                continue;
            }
            items.push(obj);
        }
        Ok(ListPage {
            items,
            rv,
            remaining: remaining.filter(|_| next.is_some()),
            next,
        })
    }

    /// Registers a watcher. The backlog (history replay or initial state) and the registration
    /// happen under the table lock, so no event is missed or duplicated.
    pub fn watch(
        self: &Arc<Self>,
        ns: Option<String>,
        filter: Arc<Filter>,
        start: WatchStart,
        bookmarks: bool,
    ) -> ApiResult<Registration> {
        let mut st = write(&self.state);
        let current = self.rv.load(Ordering::SeqCst);
        let index_key = INDEXED_FIELDS
            .iter()
            .enumerate()
            .find_map(|(i, f)| filter.exact_field(f).map(|v| (i, v.to_string())));
        let (tx, rx) = mpsc::channel(self.cfg.watch_capacity.max(1));
        let entry = WatcherEntry {
            ns,
            filter,
            tx,
            bookmarks,
            index_key: index_key.clone(),
        };
        let (initial, start_rv) = match start {
            WatchStart::InitialState => {
                let (lo, hi) = ns_range(entry.ns.as_deref());
                let items = st
                    .objects
                    .range((lo, hi))
                    .filter(|(_, o)| entry.filter.matches(o.as_ref()))
                    .map(|(_, o)| WatchItem::Event(EventType::Added, o.clone()))
                    .collect();
                (items, current)
            }
            WatchStart::After(r) => {
                if r > current {
                    return Err(ApiError {
                        code: 504,
                        reason: "Timeout",
                        message: format!("Too large resource version: {r}, current: {current}"),
                        details: None,
                    });
                }
                if r < st.floor_rv {
                    return Err(ApiError::too_old(r, st.floor_rv + 1));
                }
                let items = st
                    .history
                    .iter()
                    .filter(|e| e.rv > r)
                    .filter_map(|e| entry.item_for(e))
                    .collect();
                (items, current)
            }
        };
        let id = st.watchers.next_id;
        st.watchers.next_id += 1;
        match index_key {
            Some(k) => {
                st.watchers.index.entry(k).or_default().push(id);
                st.watchers.indexed.insert(id, entry);
            }
            None => {
                st.watchers.unindexed.insert(id, entry);
            }
        }
        Ok(Registration {
            initial,
            start_rv,
            rx,
            guard: WatcherGuard {
                table: Arc::downgrade(self),
                id,
            },
        })
    }

    /// Sends a bookmark with the current resourceVersion to every watcher that asked for them.
    pub fn send_bookmarks(&self) {
        let st = read(&self.state);
        let rv = self.rv.load(Ordering::SeqCst);
        for (_, w) in st.watchers.all() {
            if w.bookmarks {
                let _ = w.tx.try_send(WatchItem::Bookmark(rv));
            }
        }
    }

    pub fn watcher_count(&self) -> usize {
        let st = read(&self.state);
        st.watchers.unindexed.len() + st.watchers.indexed.len()
    }

    /// Ends every watch on this table (their clients re-watch from their last resourceVersion).
    pub fn close_watchers(&self) {
        let mut st = write(&self.state);
        st.watchers.unindexed.clear();
        st.watchers.indexed.clear();
        st.watchers.index.clear();
    }

    /// Forgets the history, as an etcd compaction does: older resourceVersions answer 410.
    pub fn compact(&self) {
        let mut st = write(&self.state);
        st.history.clear();
        st.floor_rv = self.rv.load(Ordering::SeqCst);
    }

    /// The oldest resourceVersion a watch can start from.
    pub fn floor_rv(&self) -> u64 {
        read(&self.state).floor_rv
    }
}

impl TableState {
    fn index_add(&mut self, o: &Obj) {
        if let Some(n) = o.node_name() {
            self.by_node.entry(n.into()).or_default().insert(o.key());
        }
    }

    fn index_remove(&mut self, o: Option<&Obj>) {
        if let Some(o) = o
            && let Some(n) = o.node_name()
            && let Some(set) = self.by_node.get_mut(n)
        {
            set.remove(&o.key());
            if set.is_empty() {
                self.by_node.remove(n);
            }
        }
    }

    fn record(&mut self, cfg: &StoreConfig, ev: HistEvent) {
        self.watchers.notify(&ev);
        self.history.push_back(Arc::new(ev));
        while self.history.len() > cfg.history_limit.max(1) {
            if let Some(old) = self.history.pop_front() {
                self.floor_rv = old.rv;
            }
        }
    }
}

/// The state at an older resourceVersion: current objects, with the ones changed since then
/// replaced by their earlier state (`None`: did not exist then).
struct MergeWithOverlay<'a, C: Iterator<Item = (&'a ObjKey, &'a Arc<Obj>)>> {
    cur: std::iter::Peekable<C>,
    ovl: std::iter::Peekable<std::collections::btree_map::IntoIter<ObjKey, Option<Arc<Obj>>>>,
}

impl<'a, C: Iterator<Item = (&'a ObjKey, &'a Arc<Obj>)>> Iterator for MergeWithOverlay<'a, C> {
    type Item = Arc<Obj>;

    fn next(&mut self) -> Option<Arc<Obj>> {
        loop {
            let step: Option<Option<Arc<Obj>>> = match (self.cur.peek(), self.ovl.peek()) {
                (None, None) => return None,
                (Some((ck, _)), Some((ok, _))) => {
                    if *ck < ok {
                        self.cur.next().map(|(_, o)| Some(o.clone()))
                    } else if ok < *ck {
                        self.ovl.next().map(|(_, o)| o)
                    } else {
                        self.cur.next();
                        self.ovl.next().map(|(_, o)| o)
                    }
                }
                (Some(_), None) => self.cur.next().map(|(_, o)| Some(o.clone())),
                (None, Some(_)) => self.ovl.next().map(|(_, o)| o),
            };
            match step {
                Some(Some(o)) => return Some(o),
                Some(None) => continue,
                None => return None,
            }
        }
    }
}

fn ns_range(ns: Option<&str>) -> (Bound<ObjKey>, Bound<ObjKey>) {
    match ns {
        Some(ns) => (
            Bound::Included((ns.to_string(), String::new())),
            Bound::Excluded((format!("{ns}\u{0}"), String::new())),
        ),
        None => (Bound::Unbounded, Bound::Unbounded),
    }
}

fn range_contains(lo: &Bound<ObjKey>, hi: &Bound<ObjKey>, k: &ObjKey) -> bool {
    let above = match lo {
        Bound::Included(l) => k >= l,
        Bound::Excluded(l) => k > l,
        Bound::Unbounded => true,
    };
    let below = match hi {
        Bound::Included(h) => k <= h,
        Bound::Excluded(h) => k < h,
        Bound::Unbounded => true,
    };
    above && below
}

/// `BTreeMap::range` panics on inverted bounds; a forged continue key must not get there.
fn valid_range(lo: &Bound<ObjKey>, hi: &Bound<ObjKey>) -> bool {
    let (l, l_incl) = match lo {
        Bound::Included(l) => (l, true),
        Bound::Excluded(l) => (l, false),
        Bound::Unbounded => return true,
    };
    let (h, h_incl) = match hi {
        Bound::Included(h) => (h, true),
        Bound::Excluded(h) => (h, false),
        Bound::Unbounded => return true,
    };
    l < h || (l == h && l_incl && h_incl)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn put(t: &Table, ns: &str, name: &str, labels: Value) -> Arc<Obj> {
        let v = json!({"metadata": {"name": name, "namespace": ns, "labels": labels}});
        match t
            .mutate(&(ns.into(), name.into()), |_| Ok(Mutation::Put(v)))
            .unwrap()
        {
            Outcome::Created(o) | Outcome::Updated(o) => o,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn paginated_list_sees_the_snapshot_of_its_first_page() {
        let store = Store::new(StoreConfig::default());
        let t = store.table("", "configmaps");
        for i in 0..5 {
            put(&t, "a", &format!("cm{i}"), json!({}));
        }
        let first = t
            .list(Some("a"), None, None, Some(2), &Filter::default())
            .unwrap();
        assert_eq!(first.items.len(), 2);
        assert_eq!(first.remaining, Some(3));
        // Changes after the first page must not show up in later pages.
        t.mutate(&("a".into(), "cm3".into()), |_| Ok(Mutation::Remove))
            .unwrap();
        put(&t, "a", "cm9", json!({}));
        let mut names: Vec<String> = first.items.iter().map(|o| o.name().to_string()).collect();
        let mut after = first.next.clone();
        while let Some(k) = after {
            let page = t
                .list(
                    Some("a"),
                    Some(first.rv),
                    Some(&k),
                    Some(2),
                    &Filter::default(),
                )
                .unwrap();
            assert_eq!(page.rv, first.rv);
            names.extend(page.items.iter().map(|o| o.name().to_string()));
            after = page.next;
        }
        assert_eq!(names, vec!["cm0", "cm1", "cm2", "cm3", "cm4"]);
    }

    #[test]
    fn watch_from_an_evicted_resource_version_is_gone() {
        let store = Store::new(StoreConfig {
            history_limit: 3,
            watch_capacity: 8,
        });
        let t = store.table("", "configmaps");
        let first = put(&t, "a", "x0", json!({}));
        for i in 1..6 {
            put(&t, "a", &format!("x{i}"), json!({}));
        }
        let err = t
            .watch(
                None,
                Arc::new(Filter::default()),
                WatchStart::After(first.rv),
                false,
            )
            .err()
            .unwrap();
        assert_eq!(err.code, 410);
        let ok = t
            .watch(
                None,
                Arc::new(Filter::default()),
                WatchStart::After(store.current_rv() - 1),
                false,
            )
            .unwrap();
        assert_eq!(ok.initial.len(), 1);
    }

    #[test]
    fn an_object_leaving_a_selector_is_deleted_for_that_watcher() {
        let store = Store::new(StoreConfig::default());
        let t = store.table("", "configmaps");
        put(&t, "a", "x", json!({"app": "web"}));
        let filter = Filter {
            labels: crate::apiserver::selectors::parse_labels("app=web").unwrap(),
            fields: vec![],
        };
        let mut reg = t
            .watch(
                None,
                Arc::new(filter),
                WatchStart::After(store.current_rv()),
                false,
            )
            .unwrap();
        put(&t, "a", "x", json!({"app": "db"}));
        match reg.rx.try_recv().unwrap() {
            WatchItem::Departed(o, rv) => {
                assert_eq!(o.label("app"), Some("web"));
                assert_eq!(rv, store.current_rv());
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_slow_watcher_is_dropped_without_blocking_writers() {
        let store = Store::new(StoreConfig {
            history_limit: 100,
            watch_capacity: 2,
        });
        let t = store.table("", "configmaps");
        let mut reg = t
            .watch(
                None,
                Arc::new(Filter::default()),
                WatchStart::After(store.current_rv()),
                false,
            )
            .unwrap();
        for i in 0..5 {
            put(&t, "a", &format!("x{i}"), json!({}));
        }
        assert_eq!(t.watcher_count(), 0);
        let mut got = 0;
        while reg.rx.try_recv().is_ok() {
            got += 1;
        }
        assert_eq!(got, 2);
    }
}
