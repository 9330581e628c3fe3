//! One group/resource's table: its objects, event history and per-node index, and the writes,
//! lists and watch registrations against it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde_json::Value;
use tokio::sync::mpsc;

use super::watchers::{INDEXED_FIELDS, WatcherEntry};
use super::*;
use crate::lock::{read, write};
use crate::selectors::Filter;
use crate::status::{ApiError, ApiResult};

#[derive(Default)]
pub(super) struct TableState {
    objects: BTreeMap<ObjKey, Arc<Obj>>,
    /// spec.nodeName -> keys (pods), for per-node lists.
    by_node: HashMap<Box<str>, std::collections::BTreeSet<ObjKey>>,
    history: VecDeque<Arc<HistEvent>>,
    /// Every event with a resourceVersion above this is still in `history`.
    floor_rv: u64,
    pub(super) watchers: Watchers,
}

pub struct Table {
    pub(super) key: (String, String),
    pub(super) rv: Arc<AtomicU64>,
    pub(super) deletions: Arc<AtomicU64>,
    pub(super) cfg: StoreConfig,
    pub(super) state: RwLock<TableState>,
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

    /// How many objects the `spec.nodeName` index holds (pods bound to a node).
    pub fn bound_count(&self) -> usize {
        read(&self.state).by_node.values().map(|s| s.len()).sum()
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
            index_key,
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
        let id = st.watchers.insert(entry);
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
        st.watchers.len()
    }

    /// Ends every watch on this table (their clients re-watch from their last resourceVersion).
    pub fn close_watchers(&self) {
        let mut st = write(&self.state);
        st.watchers.clear();
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
