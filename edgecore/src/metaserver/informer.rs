//! An in-process reader of one kind in the edge database: the stored objects, then their
//! changes from the MetaServer's watch history — what an HTTP watch gets, without HTTP or a
//! second encoding. When the reader falls behind the kept history it lists again.

use super::feed::{EventType, Feed};
use crate::metamanager::{MetaStore, StoreError};
use std::sync::Arc;

/// One change of the kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InformerEvent {
    /// The object (JSON as stored) was added or modified.
    Applied(String),
    /// The object is gone (its last state, JSON).
    Deleted(String),
}

/// What [`Informer::next`] returns.
#[derive(Debug)]
pub enum Update {
    /// Every stored object now (at start and after falling behind).
    Listed(Vec<String>),
    Changes(Vec<InformerEvent>),
}

pub struct Informer {
    feed: Arc<Feed>,
    store: MetaStore,
    /// `/<group or core>/<version>/<plural>`.
    resource: String,
    /// The last history event seen; `None` before the first list.
    cursor: Option<u64>,
    changes: tokio::sync::watch::Receiver<u64>,
}

impl Informer {
    pub(super) fn new(feed: Arc<Feed>, store: MetaStore, resource: String) -> Informer {
        let changes = feed.subscribe();
        Informer {
            feed,
            store,
            resource,
            cursor: None,
            changes,
        }
    }

    /// The full list first (and again after falling behind), then batches of changes as
    /// they become durable; waits for the next change. `None` when the MetaServer stopped.
    pub async fn next(&mut self) -> Option<Result<Update, StoreError>> {
        loop {
            let Some(cursor) = self.cursor else {
                // The cursor is taken before the list: a change racing with it is seen again
                // (readers apply changes idempotently), never missed.
                let cursor = self.feed.last_seq();
                let _ = self.changes.borrow_and_update();
                return Some(match self.store.list_v2(&self.resource).await {
                    Ok((objects, _)) => {
                        self.cursor = Some(cursor);
                        Ok(Update::Listed(objects))
                    }
                    Err(e) => Err(e),
                });
            };
            match self.feed.after(cursor) {
                Err(_) => {
                    tracing::info!(resource = %self.resource, "in-process reader fell behind the watch history; listing again");
                    self.cursor = None;
                    continue;
                }
                Ok(events) => {
                    if let Some(last) = events.last() {
                        self.cursor = Some(last.seq);
                    }
                    let mine: Vec<InformerEvent> = events
                        .iter()
                        .filter(|e| e.resource == self.resource)
                        .map(|e| match e.kind {
                            EventType::Deleted => InformerEvent::Deleted(e.object.clone()),
                            _ => InformerEvent::Applied(e.object.clone()),
                        })
                        .collect();
                    if !mine.is_empty() {
                        return Some(Ok(Update::Changes(mine)));
                    }
                }
            }
            if self.changes.changed().await.is_err() {
                return None;
            }
        }
    }
}
