//! Acknowledged deliveries → record writes (KubeEdge's `saveSuccessPoint`), off the hub's path.
//!
//! One actor owns the pending work: per record only the newest wanted state is kept, a record
//! has at most one write in flight, at most `concurrency` writes run at once, and failed writes
//! are retried with exponential backoff. Writes use optimistic concurrency (the
//! `resourceVersion` last seen) and never lower a recorded version.

use super::records::{SyncRecords, is_not_found};
use super::{RecordKey, RecordSpec, api_resource};
use crate::cloudhub::Acked;
use crate::cloudhub::queue::Delivered;
use crate::controller::kind::Kind;
use crate::metrics::{SyncMetrics, SyncWriteLabel};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kubeedge_shared::ResourceType;
use kubeedge_shared::backoff::Backoff;
use serde_json::json;
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The state a record should reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    Version { spec: RecordSpec, rv: u64 },
    Deleted,
}

impl Wanted {
    /// Merges a newer report into what is pending: a deletion wins, and only the newest
    /// version matters.
    fn merge(self, newer: Wanted) -> Wanted {
        match (self, newer) {
            (Wanted::Version { rv: old, spec }, Wanted::Version { rv, .. }) if old >= rv => {
                Wanted::Version { spec, rv: old }
            }
            (_, newer) => newer,
        }
    }
}

/// Most records waiting for a write; reports beyond are dropped (a later comparison resends
/// the object and its ACK brings the record back).
const MAX_PENDING: usize = 100_000;
const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(60);
/// Attempts before a write is given up (about 4 minutes of retries).
const MAX_ATTEMPTS: u32 = 10;

/// The record an ACK asks for, or `None` when it records nothing (no object, no version, or
/// an edge that keeps its own inventory).
pub fn wanted_for(acked: &Acked) -> Option<(RecordKey, Wanted)> {
    let d: &Delivered = acked.message.delivered.as_deref()?;
    let key = RecordKey::new(d.namespace.as_deref(), &acked.node, &d.uid);
    if d.delete {
        return Some((key, Wanted::Deleted));
    }
    let rv = acked.message.resource_version;
    if rv == 0 {
        return None; // KubeEdge drops non-delete messages without a resourceVersion
    }
    let (api_version, kind) = if d.kind.is_empty() {
        default_type_meta(&d.resource_type)?
    } else {
        (d.api_version.clone(), d.kind.clone())
    };
    Some((
        key,
        Wanted::Version {
            spec: RecordSpec {
                api_version,
                kind,
                object_name: d.name.clone(),
            },
            rv,
        },
    ))
}

/// `apiVersion`/`kind` of the resource types edges are sent, for objects that carried none.
fn default_type_meta(resource_type: &ResourceType) -> Option<(String, String)> {
    let kind = Kind::of_resource_type(resource_type)
        .filter(|k| !matches!(k, Kind::Node | Kind::Lease | Kind::Event))?;
    let (v, k) = kind.type_meta();
    Some((v.to_string(), k.to_string()))
}

#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error("{0}")]
    Retry(kube::Error),
    #[error("{0}")]
    GiveUp(kube::Error),
    #[error("record changed concurrently too often")]
    Contended,
}

fn classify(e: kube::Error) -> WriteError {
    let retry = match &e {
        kube::Error::Api(s) => s.code == 429 || s.code == 409 || s.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    };
    if retry {
        WriteError::Retry(e)
    } else {
        WriteError::GiveUp(e)
    }
}

type Done = Pin<Box<dyn Future<Output = (RecordKey, Wanted, Result<(), WriteError>)> + Send>>;
type Timer = Pin<Box<dyn Future<Output = RecordKey> + Send>>;

pub struct RecordWriter {
    client: kube::Client,
    records: SyncRecords,
    concurrency: usize,
    metrics: SyncMetrics,
    wanted: HashMap<RecordKey, Wanted>,
    ready: VecDeque<RecordKey>,
    queued: HashSet<RecordKey>,
    running: HashSet<RecordKey>,
    waiting: HashSet<RecordKey>,
    attempts: HashMap<RecordKey, u32>,
}

impl RecordWriter {
    pub fn new(
        client: kube::Client,
        records: SyncRecords,
        concurrency: usize,
        metrics: SyncMetrics,
    ) -> Self {
        RecordWriter {
            client,
            records,
            concurrency: concurrency.max(1),
            metrics,
            wanted: HashMap::new(),
            ready: VecDeque::new(),
            queued: HashSet::new(),
            running: HashSet::new(),
            waiting: HashSet::new(),
            attempts: HashMap::new(),
        }
    }

    pub async fn run(mut self, mut acks: mpsc::Receiver<Acked>, shutdown: CancellationToken) {
        let mut writes: FuturesUnordered<Done> = FuturesUnordered::new();
        let mut timers: FuturesUnordered<Timer> = FuturesUnordered::new();
        loop {
            while self.running.len() < self.concurrency {
                let Some(key) = self.ready.pop_front() else {
                    break;
                };
                self.queued.remove(&key);
                let Some(wanted) = self.wanted.get(&key).cloned() else {
                    continue;
                };
                self.running.insert(key.clone());
                let (client, records) = (self.client.clone(), self.records.clone());
                writes.push(Box::pin(async move {
                    let r = write(&client, &records, &key, &wanted).await;
                    (key, wanted, r)
                }));
            }
            self.metrics.pending_writes.set(self.wanted.len() as i64);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                a = acks.recv() => match a {
                    Some(a) => self.accept(&a),
                    None => return,
                },
                Some((key, attempted, result)) = writes.next() => {
                    if let Some(delay) = self.finished(key.clone(), attempted, result) {
                        self.waiting.insert(key.clone());
                        timers.push(Box::pin(async move {
                            tokio::time::sleep(delay).await;
                            key
                        }));
                    }
                }
                Some(key) = timers.next() => {
                    self.waiting.remove(&key);
                    self.schedule(key);
                }
            }
        }
    }

    fn accept(&mut self, acked: &Acked) {
        let Some((key, wanted)) = wanted_for(acked) else {
            return;
        };
        if !self.records.is_available() {
            // No CRDs (already reported by the records watcher): nothing to write to.
            self.metrics.dropped.inc();
            return;
        }
        match &wanted {
            Wanted::Version { spec, rv } => self.records.note_acked(&key, spec, *rv),
            Wanted::Deleted => self.records.note_acked_delete(&key),
        }
        let merged = match self.wanted.remove(&key) {
            Some(old) => old.merge(wanted),
            None if self.wanted.len() >= MAX_PENDING => {
                self.metrics.dropped.inc();
                self.records.forget_local(&key);
                tracing::warn!(record = %key.name, "too many record writes pending; dropped");
                return;
            }
            None => wanted,
        };
        self.wanted.insert(key.clone(), merged);
        self.attempts.remove(&key);
        self.schedule(key);
    }

    fn schedule(&mut self, key: RecordKey) {
        if self.running.contains(&key)
            || self.waiting.contains(&key)
            || !self.queued.insert(key.clone())
        {
            return;
        }
        self.ready.push_back(key);
    }

    /// Returns the delay before a retry, if one is due.
    fn finished(
        &mut self,
        key: RecordKey,
        attempted: Wanted,
        result: Result<(), WriteError>,
    ) -> Option<Duration> {
        self.running.remove(&key);
        let op = match attempted {
            Wanted::Version { .. } => "update",
            Wanted::Deleted => "delete",
        };
        let label = |result: &'static str| SyncWriteLabel {
            operation: op,
            result,
        };
        let superseded = self.wanted.get(&key) != Some(&attempted);
        match result {
            Ok(()) => {
                self.metrics.writes.get_or_create(&label("ok")).inc();
                self.attempts.remove(&key);
                if superseded {
                    self.schedule(key);
                } else {
                    self.wanted.remove(&key);
                }
                None
            }
            Err(e) => {
                let attempts = self.attempts.entry(key.clone()).or_insert(0);
                *attempts += 1;
                let n = *attempts;
                let give_up = matches!(e, WriteError::GiveUp(_)) || n >= MAX_ATTEMPTS;
                if give_up && !superseded {
                    self.metrics.writes.get_or_create(&label("failed")).inc();
                    tracing::warn!(record = %key.name, namespace = ?key.namespace, error = %e, attempts = n, "cannot record delivery; a later comparison resends the object");
                    self.wanted.remove(&key);
                    self.attempts.remove(&key);
                    self.records.forget_local(&key);
                    return None;
                }
                self.metrics.writes.get_or_create(&label("retry")).inc();
                tracing::debug!(record = %key.name, error = %e, attempts = n, "record write failed; retrying");
                if superseded {
                    self.attempts.remove(&key);
                    self.schedule(key);
                    return None;
                }
                Some(Backoff::new(FIRST_RETRY, MAX_RETRY).delay_after(n))
            }
        }
    }
}

fn api_for(client: &kube::Client, key: &RecordKey) -> Api<DynamicObject> {
    match &key.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &api_resource(false)),
        None => Api::all_with(client.clone(), &api_resource(true)),
    }
}

async fn write(
    client: &kube::Client,
    records: &SyncRecords,
    key: &RecordKey,
    wanted: &Wanted,
) -> Result<(), WriteError> {
    let api = api_for(client, key);
    match wanted {
        Wanted::Deleted => match api.delete(&key.name, &DeleteParams::default()).await {
            Ok(_) => {
                records.removed(key);
                Ok(())
            }
            Err(e) if is_not_found(&e) => {
                records.removed(key);
                Ok(())
            }
            Err(e) => Err(classify(e)),
        },
        Wanted::Version { spec, rv } => set_version(&api, records, key, spec, *rv).await,
    }
}

/// Get-or-create the record, then raise `status.objectResourceVersion` to `rv`.
async fn set_version(
    api: &Api<DynamicObject>,
    records: &SyncRecords,
    key: &RecordKey,
    spec: &RecordSpec,
    rv: u64,
) -> Result<(), WriteError> {
    let cluster = key.namespace.is_none();
    let ar = api_resource(cluster);
    // The cached record when the watcher has shown it; otherwise ask.
    let mut current = records
        .get(key)
        .and_then(|r| r.meta_rv.clone().map(|m| (m, r.status_rv)));
    for _ in 0..5 {
        let (meta_rv, status_rv) = match current.take() {
            Some(c) => c,
            None => match api.get_opt(&key.name).await.map_err(classify)? {
                Some(obj) => {
                    records.stored(&obj, cluster);
                    version_of(&obj)
                }
                None => {
                    let obj = DynamicObject::new(&key.name, &ar).data(json!({
                        "spec": {
                            "objectAPIVersion": spec.api_version,
                            "objectKind": spec.kind,
                            "objectName": spec.object_name,
                        }
                    }));
                    let mut obj = obj;
                    obj.metadata.namespace = key.namespace.clone();
                    match api.create(&PostParams::default(), &obj).await {
                        Ok(created) => {
                            records.stored(&created, cluster);
                            version_of(&created)
                        }
                        // Created concurrently (another replica's write for a handed-over
                        // session): read it.
                        Err(kube::Error::Api(s)) if s.code == 409 => continue,
                        Err(e) => return Err(classify(e)),
                    }
                }
            },
        };
        if status_rv >= rv {
            return Ok(());
        }
        let mut body = DynamicObject::new(&key.name, &ar).data(json!({
            "spec": {
                "objectAPIVersion": spec.api_version,
                "objectKind": spec.kind,
                "objectName": spec.object_name,
            },
            "status": {"objectResourceVersion": rv.to_string()},
        }));
        body.metadata.namespace = key.namespace.clone();
        body.metadata.resource_version = Some(meta_rv);
        match api
            .replace_status(&key.name, &PostParams::default(), &body)
            .await
        {
            Ok(written) => {
                records.stored(&written, cluster);
                return Ok(());
            }
            // Stale cache or a concurrent writer (409), or deleted meanwhile (404): re-read.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => continue,
            Err(e) => return Err(classify(e)),
        }
    }
    Err(WriteError::Contended)
}

fn version_of(obj: &DynamicObject) -> (String, u64) {
    (
        obj.metadata.resource_version.clone().unwrap_or_default(),
        obj.data["status"]["objectResourceVersion"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudhub::queue::AckedMessage;

    fn acked(node: &str, delivered: Option<Delivered>, rv: u64) -> Acked {
        Acked {
            node: node.into(),
            message: AckedMessage {
                msg_id: "m".into(),
                uid: None,
                resource_version: rv,
                resource_type: "pod".into(),
                is_delete: false,
                delivered: delivered.map(Box::new),
            },
        }
    }

    fn pod(delete: bool, kind: &str) -> Delivered {
        Delivered {
            namespace: Some("ns".into()),
            resource_type: "pod".into(),
            name: "web".into(),
            uid: "u1".into(),
            api_version: if kind.is_empty() { "" } else { "v1" }.into(),
            kind: kind.into(),
            delete,
        }
    }

    #[test]
    fn acks_map_to_records_named_node_dot_uid() {
        let (key, wanted) = wanted_for(&acked("edge-1", Some(pod(false, "Pod")), 12)).unwrap();
        assert_eq!(key, RecordKey::new(Some("ns"), "edge-1", "u1"));
        assert_eq!(key.name, "edge-1.u1");
        assert_eq!(
            wanted,
            Wanted::Version {
                spec: RecordSpec {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    object_name: "web".into()
                },
                rv: 12
            }
        );
        let (_, wanted) = wanted_for(&acked("edge-1", Some(pod(true, "")), 0)).unwrap();
        assert_eq!(wanted, Wanted::Deleted);
        // A delete stub without apiVersion/kind is still recorded as a deletion; an update
        // without a version or from an inventory edge (nothing delivered) records nothing.
        assert!(wanted_for(&acked("edge-1", Some(pod(false, "Pod")), 0)).is_none());
        assert!(wanted_for(&acked("edge-1", None, 5)).is_none());
        let (_, w) = wanted_for(&acked("e", Some(pod(false, "")), 3)).unwrap();
        assert!(matches!(w, Wanted::Version { spec, .. } if spec.kind == "Pod"));
    }

    #[test]
    fn only_the_newest_pending_state_is_kept() {
        let spec = RecordSpec::default();
        let v = |rv| Wanted::Version {
            spec: spec.clone(),
            rv,
        };
        assert_eq!(v(5).merge(v(3)), v(5));
        assert_eq!(v(5).merge(v(8)), v(8));
        assert_eq!(v(5).merge(Wanted::Deleted), Wanted::Deleted);
    }
}
