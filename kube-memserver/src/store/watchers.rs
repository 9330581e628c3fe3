//! The watch fan-out of a table: registered watchers, indexed by an exact field selector where
//! they have one, and the guard that unregisters a watcher when its stream ends.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use tokio::sync::mpsc;

use super::*;
use crate::lock::{read, write};
use crate::selectors::Filter;

/// Fields watchers can be indexed by (an exact `field=value` selector), so that an event is
/// matched only against the watchers that can want it.
pub(super) const INDEXED_FIELDS: [&str; 2] = ["metadata.name", "spec.nodeName"];

#[derive(Default)]
pub(super) struct Watchers {
    next_id: u64,
    unindexed: HashMap<u64, WatcherEntry>,
    indexed: HashMap<u64, WatcherEntry>,
    index: HashMap<(usize, String), Vec<u64>>,
}

pub(super) struct WatcherEntry {
    pub(super) ns: Option<String>,
    pub(super) filter: Arc<Filter>,
    pub(super) tx: mpsc::Sender<WatchItem>,
    pub(super) bookmarks: bool,
    pub(super) index_key: Option<(usize, String)>,
}

impl WatcherEntry {
    pub(super) fn passes(&self, o: &Obj) -> bool {
        self.ns.as_deref().is_none_or(|ns| o.namespace() == ns) && self.filter.matches(o)
    }

    pub(super) fn item_for(&self, ev: &HistEvent) -> Option<WatchItem> {
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
    /// Registers a watcher and returns its id.
    pub(super) fn insert(&mut self, entry: WatcherEntry) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        match entry.index_key.clone() {
            Some(k) => {
                self.index.entry(k).or_default().push(id);
                self.indexed.insert(id, entry);
            }
            None => {
                self.unindexed.insert(id, entry);
            }
        }
        id
    }

    pub(super) fn len(&self) -> usize {
        self.unindexed.len() + self.indexed.len()
    }

    pub(super) fn clear(&mut self) {
        self.unindexed.clear();
        self.indexed.clear();
        self.index.clear();
    }

    pub(super) fn remove(&mut self, id: u64) {
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

    pub(super) fn get(&self, id: u64) -> Option<&WatcherEntry> {
        self.unindexed.get(&id).or_else(|| self.indexed.get(&id))
    }

    pub(super) fn notify(&mut self, ev: &HistEvent) {
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

    pub(super) fn all(&self) -> impl Iterator<Item = (&u64, &WatcherEntry)> {
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
    pub(super) table: Weak<Table>,
    pub(super) id: u64,
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
