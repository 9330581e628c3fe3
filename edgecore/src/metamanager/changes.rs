//! The changes of `meta_v2` (KubeEdge's MetaServer table), told to whoever watches them (the
//! MetaServer) once they are durable.
//!
//! The database thread collects the changes a job makes while it runs; a job rolled back to its
//! savepoint loses its changes, and a batch's changes are handed to the sink only after its
//! `COMMIT` returned. Without a sink nothing is collected (no extra reads per write).

use std::cell::RefCell;
use std::sync::{Arc, RwLock};

/// One changed `meta_v2` row.
#[derive(Debug, Clone, PartialEq)]
pub struct V2Change {
    /// `/<group or core>/<version>/<plural>/<ns or null>/<name>`.
    pub key: String,
    /// The object JSON now stored; `None` when the row was deleted.
    pub object: Option<String>,
    /// The object JSON stored before; `None` when there was none.
    pub previous: Option<String>,
    /// For deletions: the resourceVersion of the delete as the cloud sent it (the deleted
    /// object's last version when the message carried none).
    pub deleted_rv: Option<u64>,
}

impl V2Change {
    /// `/<group or core>/<version>/<plural>`: the resource part of the key.
    pub fn resource(&self) -> &str {
        resource_of_key(&self.key)
    }
}

/// The resource part (first three segments) of a `meta_v2` key.
pub fn resource_of_key(key: &str) -> &str {
    let mut slashes = key.match_indices('/').map(|(i, _)| i);
    match slashes.nth(3) {
        Some(end) => &key[..end],
        None => key,
    }
}

/// Receives each committed batch of changes, on the database thread: it must not block.
pub type ChangeSink = Arc<dyn Fn(Vec<V2Change>) + Send + Sync>;

/// Where the store finds its sink; shared by the handle and the database thread.
pub(crate) type SinkSlot = Arc<RwLock<Option<ChangeSink>>>;

thread_local! {
    /// Changes of the batch running on this (database) thread; `None` when nobody listens.
    static PENDING: RefCell<Option<Vec<V2Change>>> = const { RefCell::new(None) };
    /// The resourceVersion of the delete being applied (see [`with_delete_rv`]).
    static DELETE_RV: RefCell<Option<u64>> = const { RefCell::new(None) };
}

/// Starts collecting for a batch when a sink is set.
pub(crate) fn begin_batch(slot: &SinkSlot) {
    let listening = slot.read().map(|s| s.is_some()).unwrap_or(false);
    PENDING.with(|p| *p.borrow_mut() = listening.then(Vec::new));
}

/// How many changes are collected so far (a job's savepoint mark).
pub(crate) fn mark() -> usize {
    PENDING.with(|p| p.borrow().as_ref().map_or(0, Vec::len))
}

/// Drops what was collected after `mark` (the job was rolled back).
pub(crate) fn rollback_to(mark: usize) {
    PENDING.with(|p| {
        if let Some(v) = p.borrow_mut().as_mut() {
            v.truncate(mark);
        }
    });
}

/// Ends the batch: hands the changes to the sink when it committed, drops them otherwise.
pub(crate) fn end_batch(slot: &SinkSlot, committed: bool) {
    let changes = PENDING.with(|p| p.borrow_mut().take());
    let Some(changes) = changes.filter(|c| committed && !c.is_empty()) else {
        return;
    };
    let sink = slot.read().ok().and_then(|s| s.clone());
    if let Some(sink) = sink {
        sink(changes);
    }
}

/// True when the running batch collects changes.
pub(crate) fn collecting() -> bool {
    PENDING.with(|p| p.borrow().is_some())
}

pub(crate) fn push(change: V2Change) {
    PENDING.with(|p| {
        if let Some(v) = p.borrow_mut().as_mut() {
            v.push(change);
        }
    });
}

/// Runs `f` (a delete) telling the change feed the delete's resourceVersion.
pub(crate) fn with_delete_rv<T>(rv: Option<u64>, f: impl FnOnce() -> T) -> T {
    DELETE_RV.with(|d| *d.borrow_mut() = rv);
    let out = f();
    DELETE_RV.with(|d| *d.borrow_mut() = None);
    out
}

pub(crate) fn delete_rv() -> Option<u64> {
    DELETE_RV.with(|d| *d.borrow())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resource_part_of_a_key_is_its_first_three_segments() {
        assert_eq!(resource_of_key("/core/v1/pods/default/a"), "/core/v1/pods");
        assert_eq!(
            resource_of_key("/apps/v1/deployments/null/x"),
            "/apps/v1/deployments"
        );
        assert_eq!(resource_of_key("/version"), "/version");
    }
}
