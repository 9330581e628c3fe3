//! The watch history: the last changes of `meta_v2` as watch events, in the order they became
//! durable, bounded in bytes and count. Watches read it from a cursor; a watch that fell
//! behind what is kept, or asks to start from a resourceVersion older than it, gets
//! `410 Gone` and relists (as from a real apiserver when its watch cache moved on).
//!
//! resourceVersions are the cluster's (the objects carry the apiserver's versions, so writes
//! forwarded to the cloud keep optimistic concurrency). The revision of a list is the highest
//! version seen; a deletion's version is the one the cloud's delete message carried.

use crate::metamanager::V2Change;
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, as watchers see it.
#[derive(Debug)]
pub struct Event {
    pub seq: u64,
    /// `/<group or core>/<version>/<plural>`.
    pub resource: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
    pub kind: EventType,
    pub rv: u64,
    /// The object now as JSON (the last state for deletions, with the deletion's version):
    /// kept as text, parsed only for watchers with selectors or Tables.
    pub object: String,
    /// The object before a modification (to tell watchers with selectors that it left them).
    pub previous: Option<String>,
    size: usize,
}

/// The history no longer covers what was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone {
    /// The oldest resourceVersion a watch may start from now.
    pub oldest: u64,
}

/// Limits of the history.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_events: usize,
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_events: 10_000,
            max_bytes: 2 << 20,
        }
    }
}

struct Log {
    events: VecDeque<Arc<Event>>,
    bytes: usize,
    /// The sequence number the next event gets.
    next_seq: u64,
    /// Versions at or below this may have changes that are no longer (or never were) kept.
    floor: u64,
    /// The highest version seen.
    revision: u64,
}

pub struct Feed {
    log: Mutex<Log>,
    limits: Limits,
    last_seq: watch::Sender<u64>,
}

impl Feed {
    /// A history starting now, at `revision` (the highest version in the database): changes
    /// before it are not kept, so watches from older versions get `410 Gone`.
    pub fn new(revision: u64, limits: Limits) -> Arc<Feed> {
        let (last_seq, _) = watch::channel(0);
        Arc::new(Feed {
            log: Mutex::new(Log {
                events: VecDeque::new(),
                bytes: 0,
                next_seq: 1,
                floor: revision,
                revision,
            }),
            limits,
            last_seq,
        })
    }

    /// Appends committed changes (called on the database thread; never blocks on watchers).
    pub fn publish(&self, changes: Vec<V2Change>) {
        let mut last = None;
        {
            let Ok(mut log) = self.log.lock() else { return };
            for change in changes {
                let seq = log.next_seq;
                let Some(event) = to_event(seq, change) else {
                    continue;
                };
                log.next_seq += 1;
                log.revision = log.revision.max(event.rv);
                log.bytes += event.size;
                log.events.push_back(Arc::new(event));
                last = Some(seq);
            }
            while log.events.len() > self.limits.max_events || log.bytes > self.limits.max_bytes {
                let Some(old) = log.events.pop_front() else {
                    break;
                };
                log.bytes -= old.size;
                log.floor = log.floor.max(old.rv);
            }
        }
        if let Some(seq) = last {
            self.last_seq.send_replace(seq);
        }
    }

    /// The highest version seen: a list's `resourceVersion`.
    pub fn revision(&self) -> u64 {
        self.log.lock().map(|l| l.revision).unwrap_or(0)
    }

    /// The sequence number of the last event.
    pub fn last_seq(&self) -> u64 {
        *self.last_seq.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.last_seq.subscribe()
    }

    /// For a watch of `resource` from version `rv`: the kept events of that resource newer
    /// than `rv`, and the cursor to continue from. `Gone` when changes after `rv` may be lost.
    pub fn since(&self, resource: &str, rv: u64) -> Result<(Vec<Arc<Event>>, u64), Gone> {
        let log = self.log.lock().map_err(|_| Gone { oldest: u64::MAX })?;
        if rv < log.floor {
            return Err(Gone { oldest: log.floor });
        }
        let replay = log
            .events
            .iter()
            .filter(|e| e.resource == resource && e.rv > rv)
            .cloned()
            .collect();
        Ok((replay, log.next_seq - 1))
    }

    /// The events after `cursor`. `Gone` when some of them are no longer kept.
    pub fn after(&self, cursor: u64) -> Result<Vec<Arc<Event>>, Gone> {
        let log = self.log.lock().map_err(|_| Gone { oldest: u64::MAX })?;
        if let Some(first) = log.events.front()
            && first.seq > cursor + 1
        {
            return Err(Gone { oldest: log.floor });
        }
        if log.events.is_empty() && log.next_seq > cursor + 1 {
            return Err(Gone { oldest: log.floor });
        }
        let start = log.events.partition_point(|e| e.seq <= cursor);
        Ok(log.events.range(start..).cloned().collect())
    }

    /// Bytes and events kept (for the benchmark and metrics).
    pub fn size(&self) -> (usize, usize) {
        self.log
            .lock()
            .map(|l| (l.events.len(), l.bytes))
            .unwrap_or((0, 0))
    }
}

fn to_event(seq: u64, change: V2Change) -> Option<Event> {
    let key = change.key.clone();
    let mut segs = key.split('/').skip(1);
    let (group, version, plural) = (segs.next()?, segs.next()?, segs.next()?);
    let ns = segs.next()?;
    let name = segs.next()?;
    let (kind, object, previous) = match (change.object, change.previous) {
        (Some(now), before) => {
            let kind = if before.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            };
            (kind, now, before)
        }
        (None, Some(before)) => {
            let mut obj = serde_json::from_str::<Value>(&before).ok()?;
            if let (Some(rv), Some(meta)) = (
                change.deleted_rv,
                obj.get_mut("metadata").and_then(Value::as_object_mut),
            ) {
                meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
            }
            (EventType::Deleted, obj.to_string(), None)
        }
        (None, None) => return None,
    };
    let parsed: Value = serde_json::from_str(&object).ok()?;
    let rv = parsed
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let size = object.len() + previous.as_ref().map_or(0, String::len);
    Some(Event {
        seq,
        resource: format!("/{group}/{version}/{plural}"),
        namespace: if ns == "null" {
            String::new()
        } else {
            ns.to_string()
        },
        name: name.to_string(),
        kind,
        rv,
        object,
        previous,
        size: size + 256,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(name: &str, rv: u64) -> String {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "d", "resourceVersion": rv.to_string()}})
        .to_string()
    }

    fn upsert(name: &str, rv: u64, prev: Option<u64>) -> V2Change {
        V2Change {
            key: format!("/core/v1/configmaps/d/{name}"),
            object: Some(obj(name, rv)),
            previous: prev.map(|p| obj(name, p)),
            deleted_rv: None,
        }
    }

    #[test]
    fn events_replay_from_a_version_and_continue_from_a_cursor() {
        let feed = Feed::new(10, Limits::default());
        feed.publish(vec![upsert("a", 11, None), upsert("a", 12, Some(11))]);
        feed.publish(vec![V2Change {
            key: "/core/v1/configmaps/d/a".into(),
            object: None,
            previous: Some(obj("a", 12)),
            deleted_rv: Some(13),
        }]);
        assert_eq!(feed.revision(), 13);
        let (replay, cursor) = feed.since("/core/v1/configmaps", 11).unwrap();
        let kinds: Vec<_> = replay.iter().map(|e| (e.kind, e.rv)).collect();
        assert_eq!(kinds, [(EventType::Modified, 12), (EventType::Deleted, 13)]);
        let deleted: Value = serde_json::from_str(&replay[1].object).unwrap();
        assert_eq!(deleted["metadata"]["resourceVersion"], "13");
        assert_eq!(cursor, 3);
        assert!(feed.since("/core/v1/pods", 11).unwrap().0.is_empty());
        assert_eq!(
            feed.since("/core/v1/configmaps", 9).err(),
            Some(Gone { oldest: 10 })
        );
        feed.publish(vec![upsert("b", 14, None)]);
        let next = feed.after(cursor).unwrap();
        assert_eq!(next.len(), 1);
        assert_eq!((next[0].name.as_str(), next[0].seq), ("b", 4));
        assert!(feed.after(4).unwrap().is_empty());
    }

    #[test]
    fn a_full_history_drops_the_oldest_and_old_cursors_are_gone() {
        let feed = Feed::new(
            0,
            Limits {
                max_events: 2,
                max_bytes: 1 << 20,
            },
        );
        for rv in 1..=4 {
            feed.publish(vec![upsert(&format!("o{rv}"), rv, None)]);
        }
        assert_eq!(feed.size().0, 2);
        assert_eq!(feed.after(1).err(), Some(Gone { oldest: 2 }));
        assert_eq!(feed.after(2).unwrap().len(), 2);
        assert_eq!(
            feed.since("/core/v1/configmaps", 1).err(),
            Some(Gone { oldest: 2 })
        );
        assert_eq!(feed.since("/core/v1/configmaps", 2).unwrap().0.len(), 2);
    }

    #[test]
    fn changes_that_are_not_objects_are_skipped() {
        let feed = Feed::new(0, Limits::default());
        feed.publish(vec![
            V2Change {
                key: "/version".into(),
                object: Some("{}".into()),
                previous: None,
                deleted_rv: None,
            },
            V2Change {
                key: "/core/v1/configmaps/d/x".into(),
                object: Some("not json".into()),
                previous: None,
                deleted_rv: None,
            },
        ]);
        assert_eq!(feed.last_seq(), 0);
        assert_eq!(feed.size().0, 0);
    }
}
