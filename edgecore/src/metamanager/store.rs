//! The edge database: KubeEdge's `meta` table (and its `meta_v2` mirror) in SQLite, and the
//! eventbus's `sub_topics` (protocol §5.3, devices reference §4.6).
//!
//! One dedicated thread owns the connection; async callers hand it jobs over a bounded channel
//! and await the result, so SQLite never blocks the async runtime. The thread runs whatever jobs
//! are queued together in one transaction (group commit: one fsync for a burst of writes), each
//! job inside its own savepoint so that one failing job does not undo the others. A job's result
//! is delivered only after `COMMIT` returned, so "Ok" means durable: the journal is WAL with
//! `synchronous=FULL`, which syncs the WAL on every commit (with `NORMAL` a commit acknowledged
//! just before a power cut could be lost, and the cloud would never resend it).

use kubeedge_shared::inventory::InventoryEntry;
use kubeedge_shared::{ResourcePath, ResourceType};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

use super::changes::{self, ChangeSink, SinkSlot, V2Change};

mod v2;
use v2::{V2Row, max_v2_rv, mirror_v2, mirror_v2_row, unmirror_v2, v2_value};

/// Jobs queued for the database thread, at most. Producers wait (backpressure) beyond it.
const JOB_QUEUE: usize = 1024;
/// Jobs run in one transaction, at most.
const MAX_BATCH: usize = 256;

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the edge database {path}: {detail}")]
    Open { path: String, detail: String },
    #[error("database error: {0}")]
    Sqlite(String),
    #[error("the edge database is closed")]
    Closed,
    #[error("the edge database failed its integrity check: {0}")]
    Corrupt(String),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Sqlite(e.to_string())
    }
}

/// One row of `meta`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRecord {
    /// The wire resource string, e.g. `default/pod/nginx`.
    pub key: String,
    /// The type (its token, e.g. `pod`, is the row's `type` column).
    pub resource_type: ResourceType,
    /// The object JSON (or, for patch rows, the patch text).
    pub value: String,
}

impl MetaRecord {
    pub fn new(
        key: impl Into<String>,
        resource_type: impl Into<ResourceType>,
        value: impl Into<String>,
    ) -> Self {
        MetaRecord {
            key: key.into(),
            resource_type: resource_type.into(),
            value: value.into(),
        }
    }
}

/// What [`MetaStore::upsert_object`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpsertOutcome {
    Written,
    /// The stored copy of the same object (same UID) has a higher resourceVersion: kept.
    KeptNewer {
        stored_rv: u64,
    },
}

/// What [`MetaStore::replace_if_same_uid`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplaceOutcome {
    Replaced,
    /// No row, or a row for another incarnation of the object: nothing written.
    NotPresent,
    /// The stored copy of the same object has a higher resourceVersion (a cloud message
    /// written while the reply was on its way): kept.
    KeptNewer {
        stored_rv: u64,
    },
}

/// What [`MetaStore::delete_pod`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    Absent,
    /// The stored pod is another incarnation (different UID): kept.
    UidMismatch {
        stored_uid: String,
    },
}

type Completion = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
/// A job: runs against the connection, or is told why it cannot run.
type Work = Box<dyn FnOnce(Result<&Connection, StoreError>) -> (bool, Completion) + Send>;

enum Job {
    Run(Work),
    Close(oneshot::Sender<()>),
}

/// Handle to the edge database; cheap to clone.
#[derive(Clone)]
pub struct MetaStore {
    jobs: mpsc::Sender<Job>,
    path: Arc<PathBuf>,
    sink: SinkSlot,
}

impl MetaStore {
    /// Opens (creating if needed) the database at `path` and its tables, on a thread of its own.
    pub async fn open(path: impl AsRef<Path>) -> Result<MetaStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let (jobs, rx) = mpsc::channel(JOB_QUEUE);
        let (opened_tx, opened_rx) = oneshot::channel();
        let thread_path = path.clone();
        let sink = SinkSlot::default();
        let thread_sink = sink.clone();
        std::thread::Builder::new()
            .name("metastore".into())
            .spawn(move || match open_connection(&thread_path) {
                Ok(conn) => {
                    let _ = opened_tx.send(Ok(()));
                    run_jobs(conn, rx, &thread_sink);
                }
                Err(e) => {
                    let _ = opened_tx.send(Err(e));
                }
            })
            .map_err(|e| StoreError::Open {
                path: path.display().to_string(),
                detail: format!("cannot start the database thread: {e}"),
            })?;
        opened_rx.await.map_err(|_| StoreError::Closed)??;
        Ok(MetaStore {
            jobs,
            path: Arc::new(path),
            sink,
        })
    }

    /// From now on, every committed change of `meta_v2` is handed to `sink` (on the database
    /// thread, after the commit). One sink per store; a second call replaces the first.
    pub fn set_change_sink(&self, sink: ChangeSink) {
        if let Ok(mut slot) = self.sink.write() {
            *slot = Some(sink);
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues `f` (waiting while the queue is full) and returns where its result will arrive,
    /// after the transaction it ran in committed. Jobs run in the order they were queued.
    pub(crate) async fn submit<T, F>(
        &self,
        f: F,
    ) -> Result<oneshot::Receiver<Result<T, StoreError>>, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let work: Work = Box::new(move |conn| {
            let result = conn.and_then(f);
            let ok = result.is_ok();
            let done: Completion = Box::new(move |commit| {
                let _ = tx.send(commit.and(result));
            });
            (ok, done)
        });
        self.jobs
            .send(Job::Run(work))
            .await
            .map_err(|_| StoreError::Closed)?;
        Ok(rx)
    }

    /// Runs `f` on the database thread and returns its result once committed.
    pub(crate) async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.submit(f)
            .await?
            .await
            .map_err(|_| StoreError::Closed)?
    }

    /// `INSERT OR REPLACE` of one row, as KubeEdge writes it.
    pub async fn upsert(&self, record: MetaRecord) -> Result<(), StoreError> {
        self.call(move |conn| {
            upsert_row(conn, &record)?;
            mirror_v2(conn, &record)
        })
        .await
    }

    /// Upserts an object received from the cloud, unless the stored copy of the same object
    /// (same UID) carries a newer resourceVersion (a late re-delivery must not roll it back).
    pub async fn upsert_object(&self, record: MetaRecord) -> Result<UpsertOutcome, StoreError> {
        self.call(move |conn| upsert_object_in(conn, &record)).await
    }

    /// Writes `record` only over a stored row for the same object (same UID) that is not newer.
    /// Used for objects the cloud returns after an edge patch: if the pod was deleted meanwhile,
    /// it stays deleted; if a newer copy was stored meanwhile, it stays.
    pub async fn replace_if_same_uid(
        &self,
        record: MetaRecord,
    ) -> Result<ReplaceOutcome, StoreError> {
        self.call(move |conn| replace_if_same_uid_in(conn, &record))
            .await
    }

    /// Deletes a row by key. True when there was one.
    pub async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let key = key.to_string();
        self.call(move |conn| delete_key_in(conn, &key)).await
    }

    /// KubeEdge's pod delete: removes `<ns>/pod/<name>` only when the stored pod has `uid`
    /// (a delete for an older incarnation must not remove the newer one), and with it the
    /// `<ns>/podpatch/<name>` row and the service-account tokens bound to the pod (the API
    /// server refuses them once the pod is gone; kept, they would pile up with every pod the
    /// node ever ran until they expire). A stored value that is not JSON is removed: a corrupt copy of
    /// an object the cloud says is gone has no use.
    pub async fn delete_pod(
        &self,
        key: &str,
        uid: Option<&str>,
    ) -> Result<DeleteOutcome, StoreError> {
        let key = key.to_string();
        let uid = uid.map(str::to_string);
        self.call(move |conn| delete_pod_in(conn, &key, uid.as_deref()))
            .await
    }

    pub async fn get(&self, key: &str) -> Result<Option<String>, StoreError> {
        let key = key.to_string();
        self.call(move |conn| stored_value(conn, &key)).await
    }

    /// Every row of one type, ordered by key.
    pub async fn list_type(&self, resource_type: &str) -> Result<Vec<MetaRecord>, StoreError> {
        let ty = resource_type.to_string();
        self.call(move |conn| {
            let mut stmt = conn
                .prepare_cached("SELECT key, type, value FROM meta WHERE type = ?1 ORDER BY key")?;
            let rows = stmt.query_map([ty], record_from_row)?;
            let mut out = Vec::new();
            for row in rows {
                if let Some(r) = skip_corrupt(row)? {
                    out.push(r);
                }
            }
            Ok(out)
        })
        .await
    }

    /// metamanager's local query (protocol §5.2): a 3-token path gives that row, a 2-token
    /// path every row of the type (all namespaces, as KubeEdge does). Returns the stored values.
    pub async fn query(&self, path: &ResourcePath) -> Result<Vec<String>, StoreError> {
        match &path.name {
            Some(_) => Ok(self.get(&path.to_wire()).await?.into_iter().collect()),
            None => Ok(self
                .list_type(path.resource_type.as_str())
                .await?
                .into_iter()
                .map(|r| r.value)
                .collect()),
        }
    }

    /// Every stored object the cloud keeps in sync (all types but requests ([`ResourceType::is_request`]),
    /// `node` and `lease`, which the edge itself writes), with its UID and resourceVersion.
    /// Rows whose value is not a JSON object with a UID are left out: the cloud then sends
    /// those objects again, which repairs them.
    pub async fn inventory(&self) -> Result<Vec<InventoryEntry>, StoreError> {
        self.call(|conn| {
            let mut stmt = conn.prepare_cached("SELECT key, type, value FROM meta ORDER BY key")?;
            let rows = stmt.query_map([], record_from_row)?;
            let mut out = Vec::new();
            for row in rows {
                let Some(r) = skip_corrupt(row)? else {
                    continue;
                };
                let ty = &r.resource_type;
                if ty.is_request()
                    || *ty == ResourceType::Node
                    || *ty == ResourceType::Lease
                    || *ty == "devicemapper"
                {
                    continue;
                }
                let Ok(v) = serde_json::from_str::<Value>(&r.value) else {
                    tracing::warn!(key = %r.key, "stored value is not JSON; left out of the inventory");
                    continue;
                };
                let Some(uid) = v.pointer("/metadata/uid").and_then(Value::as_str) else {
                    tracing::warn!(key = %r.key, "stored object has no metadata.uid; left out of the inventory");
                    continue;
                };
                out.push(InventoryEntry {
                    resource_type: r.resource_type.as_str().to_string(),
                    key: r.key,
                    uid: uid.to_string(),
                    resource_version: v
                        .pointer("/metadata/resourceVersion")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                });
            }
            Ok(out)
        })
        .await
    }

    /// The objects of `meta_v2` whose key starts with `prefix` + `/` (a resource
    /// `/<group or core>/<version>/<plural>`, optionally followed by `/<namespace>`), ordered
    /// by key, with the highest resourceVersion in the whole table (the list's revision).
    pub async fn list_v2(&self, prefix: &str) -> Result<(Vec<String>, u64), StoreError> {
        let lo = format!("{prefix}/");
        let hi = format!("{prefix}0");
        self.call(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT value FROM meta_v2 WHERE key >= ?1 AND key < ?2 ORDER BY key",
            )?;
            let values = stmt
                .query_map([lo, hi], |r| r.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok((values, max_v2_rv(conn)?))
        })
        .await
    }

    /// One object of `meta_v2` by key.
    pub async fn get_v2(&self, key: &str) -> Result<Option<String>, StoreError> {
        let key = key.to_string();
        self.call(move |conn| v2_value(conn, &key)).await
    }

    /// The highest resourceVersion in `meta_v2` (0 when empty).
    pub async fn max_v2_rv(&self) -> Result<u64, StoreError> {
        self.call(max_v2_rv).await
    }

    /// The resources `meta_v2` holds objects of: `/<group or core>/<version>/<plural>` with the
    /// `kind` of one of its objects and whether that object has a namespace.
    pub async fn v2_resources(&self) -> Result<Vec<(String, String, bool)>, StoreError> {
        self.call(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT key, value, namespace FROM meta_v2 WHERE rowid IN (SELECT min(rowid) FROM meta_v2 GROUP BY groupversionresource)",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (key, value, namespace) = row?;
                let kind = serde_json::from_str::<Value>(&value)
                    .ok()
                    .and_then(|v| v.get("kind").and_then(Value::as_str).map(str::to_string));
                if let Some(kind) = kind {
                    out.push((
                        changes::resource_of_key(&key).to_string(),
                        kind,
                        !namespace.is_empty(),
                    ));
                }
            }
            Ok(out)
        })
        .await
    }

    /// Objects the MetaServer fetched from the cloud (kinds the cloud does not push): written
    /// like the cloud's own messages (key `<ns or null>/<lower-case kind>/<name>`, newer stored
    /// copies kept) and mirrored into `meta_v2`. Objects without kind or name are skipped, and
    /// so are kinds other modules own (devices: the cloud sends this node's own, and their rows
    /// are devicetwin's).
    pub async fn cache_objects(&self, objects: Vec<Value>) -> Result<(), StoreError> {
        self.call(move |conn| {
            for obj in &objects {
                if let Some(record) = cache_record(obj) {
                    upsert_object_in(conn, &record)?;
                }
            }
            Ok(())
        })
        .await
    }

    /// Removes the cached objects whose `meta_v2` key starts with `prefix` + `/`, that
    /// `matches` and whose key is not in `keep` (the cloud's list no longer has them).
    /// Returns how many were removed.
    ///
    /// `listed_rv` is the list's resourceVersion: a stored copy newer than it was written from
    /// a change the cloud sent after it made the list (a Service created while the list was on
    /// its way), and stays. Without it, every object missing from the list is removed.
    pub async fn uncache_missing(
        &self,
        prefix: String,
        keep: std::collections::HashSet<String>,
        listed_rv: Option<u64>,
        matches: Box<dyn Fn(&Value) -> bool + Send>,
    ) -> Result<usize, StoreError> {
        self.call(move |conn| {
            let lo = format!("{prefix}/");
            let hi = format!("{prefix}0");
            let mut stmt =
                conn.prepare_cached("SELECT key, value FROM meta_v2 WHERE key >= ?1 AND key < ?2")?;
            let rows = stmt
                .query_map([lo, hi], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let mut removed = 0;
            for (key, value) in rows {
                if keep.contains(&key) {
                    continue;
                }
                let Ok(obj) = serde_json::from_str::<Value>(&value) else {
                    continue;
                };
                if !matches(&obj) {
                    continue;
                }
                if let (Some(listed), Some(stored)) = (listed_rv, rv_of(&obj))
                    && stored > listed
                {
                    continue;
                }
                if let Some(record) = cache_record(&obj)
                    && delete_key_in(conn, &record.key)?
                {
                    removed += 1;
                }
            }
            Ok(removed)
        })
        .await
    }

    /// Stores a document under a raw path key of `meta_v2` (KubeEdge keeps the cloud's
    /// discovery answers so, keyed by their path).
    pub async fn put_v2_raw(&self, key: &str, value: String) -> Result<(), StoreError> {
        let key = key.to_string();
        self.call(move |conn| {
            let mut stmt = conn.prepare_cached(
                "INSERT OR REPLACE INTO meta_v2 (key, groupversionresource, namespace, name, resourceversion, value)
                 VALUES (?1, '', '', '', 0, ?2)",
            )?;
            stmt.execute(params![key, value])?;
            Ok(())
        })
        .await
    }

    /// Removes one cached object (the cloud deleted it on the MetaServer's request).
    pub async fn uncache(&self, obj: Value) -> Result<(), StoreError> {
        self.call(move |conn| {
            if let Some(record) = cache_record(&obj) {
                delete_key_in(conn, &record.key)?;
            }
            Ok(())
        })
        .await
    }

    /// Number of rows in `meta`.
    pub async fn count(&self) -> Result<u64, StoreError> {
        self.call(|conn| {
            Ok(conn.query_row("SELECT count(*) FROM meta", [], |r| r.get::<_, i64>(0))? as u64)
        })
        .await
    }

    /// `PRAGMA integrity_check`.
    pub async fn integrity_check(&self) -> Result<(), StoreError> {
        self.call(integrity_check).await
    }

    /// Finishes the queued jobs and closes the database (checkpointing the WAL). Later calls
    /// on any clone fail with [`StoreError::Closed`].
    pub async fn close(&self) {
        let (tx, rx) = oneshot::channel();
        if self.jobs.send(Job::Close(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

fn open_connection(path: &Path) -> Result<Connection, StoreError> {
    let fail = |detail: String| StoreError::Open {
        path: path.display().to_string(),
        detail,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
    }
    if !path.exists() {
        // The database holds secrets: owner-only. SQLite gives its -wal and -shm files the
        // database file's mode.
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| fail(format!("cannot create the database file: {e}")))?;
    }
    let conn = Connection::open(path).map_err(|e| fail(e.to_string()))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(|e| fail(e.to_string()))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(|e| fail(format!("cannot switch to WAL: {e}")))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(fail(format!("journal mode is {mode}, WAL is required")));
    }
    conn.execute_batch(
        r#"PRAGMA synchronous=FULL;
           CREATE TABLE IF NOT EXISTS "meta" (
               "key" varchar(256) NOT NULL PRIMARY KEY,
               "type" varchar(32) NOT NULL DEFAULT '',
               "value" text NOT NULL DEFAULT ''
           );
           CREATE INDEX IF NOT EXISTS "meta_type" ON "meta" ("type");
           CREATE TABLE IF NOT EXISTS "meta_v2" (
               "key" varchar(256) NOT NULL PRIMARY KEY,
               "groupversionresource" varchar(256) NOT NULL DEFAULT '',
               "namespace" varchar(256) NOT NULL DEFAULT '',
               "name" varchar(256) NOT NULL DEFAULT '',
               "resourceversion" integer unsigned NOT NULL DEFAULT 0,
               "value" text NOT NULL DEFAULT ''
           );
           CREATE TABLE IF NOT EXISTS "sub_topics" (
               "topic" text NOT NULL PRIMARY KEY
           );"#,
    )
    .map_err(|e| fail(e.to_string()))?;
    integrity_check(&conn).map_err(|e| fail(e.to_string()))?;
    Ok(conn)
}

fn integrity_check(conn: &Connection) -> Result<(), StoreError> {
    let mut stmt = conn.prepare("PRAGMA quick_check")?;
    let problems = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    if problems.len() == 1 && problems[0] == "ok" {
        Ok(())
    } else {
        Err(StoreError::Corrupt(problems.join("; ")))
    }
}

fn run_jobs(conn: Connection, mut rx: mpsc::Receiver<Job>, sink: &SinkSlot) {
    while let Some(first) = rx.blocking_recv() {
        let mut work = Vec::new();
        let mut close = None;
        let mut next = Some(first);
        while let Some(job) = next.take() {
            match job {
                Job::Run(w) => work.push(w),
                Job::Close(tx) => {
                    close = Some(tx);
                    break;
                }
            }
            if work.len() < MAX_BATCH {
                next = rx.try_recv().ok();
            }
        }
        if !work.is_empty() {
            run_batch(&conn, work, sink);
        }
        if let Some(tx) = close {
            rx.close();
            // Jobs queued behind the close are dropped: their callers see `Closed`.
            while rx.try_recv().is_ok() {}
            drop(conn);
            let _ = tx.send(());
            return;
        }
    }
}

fn run_batch(conn: &Connection, work: Vec<Work>, sink: &SinkSlot) {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        tracing::error!(error = %e, "cannot begin a database transaction");
        let e = StoreError::from(e);
        for w in work {
            let (_, done) = w(Err(e.clone()));
            done(Err(e.clone()));
        }
        return;
    }
    changes::begin_batch(sink);
    let mut completions = Vec::with_capacity(work.len());
    let mut aborted = None;
    let mut work = work.into_iter();
    for w in work.by_ref() {
        if let Err(e) = conn.execute_batch("SAVEPOINT job") {
            let e = StoreError::from(e);
            completions.push(w(Err(e.clone())).1);
            aborted = Some(e);
            break;
        }
        let mark = changes::mark();
        let (ok, done) = w(Ok(conn));
        completions.push(done);
        if !ok {
            changes::rollback_to(mark);
        }
        if conn.is_autocommit() {
            // SQLite rolled the whole transaction back (I/O error, disk full): nothing of this
            // batch is durable.
            aborted = Some(StoreError::Sqlite(
                "transaction rolled back by SQLite".into(),
            ));
            break;
        }
        let end = if ok {
            conn.execute_batch("RELEASE job")
        } else {
            conn.execute_batch("ROLLBACK TO job; RELEASE job")
        };
        if let Err(e) = end {
            aborted = Some(StoreError::from(e));
            break;
        }
    }
    // Jobs not reached after an abort are not run at all.
    if let Some(e) = &aborted {
        for w in work {
            completions.push(w(Err(e.clone())).1);
        }
    }
    let outcome = match aborted {
        Some(e) => Err(e),
        None => conn.execute_batch("COMMIT").map_err(StoreError::from),
    };
    if let Err(e) = &outcome {
        tracing::error!(error = %e, "database transaction failed; its writes are not acknowledged");
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
    }
    changes::end_batch(sink, outcome.is_ok());
    for done in completions {
        done(outcome.clone());
    }
}

fn record_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<MetaRecord> {
    Ok(MetaRecord {
        key: row.get(0)?,
        resource_type: ResourceType::parse(&row.get::<_, String>(1)?),
        value: row.get(2)?,
    })
}

/// A row whose columns do not read back as text (a BLOB, invalid UTF-8, a NULL written by
/// another tool) is skipped with a warning: one corrupt row must not hide all the others.
fn skip_corrupt(row: rusqlite::Result<MetaRecord>) -> Result<Option<MetaRecord>, rusqlite::Error> {
    match row {
        Ok(r) => Ok(Some(r)),
        Err(
            e @ (rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::Utf8Error(..)),
        ) => {
            tracing::warn!(error = %e, "corrupt row in table meta skipped");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

pub(crate) fn stored_value(conn: &Connection, key: &str) -> Result<Option<String>, StoreError> {
    let mut stmt = conn.prepare_cached("SELECT value FROM meta WHERE key = ?1")?;
    Ok(stmt
        .query_row([key], |r| r.get::<_, String>(0))
        .optional()?)
}

fn upsert_row(conn: &Connection, r: &MetaRecord) -> Result<(), StoreError> {
    let mut stmt =
        conn.prepare_cached("INSERT OR REPLACE INTO meta (key, type, value) VALUES (?1, ?2, ?3)")?;
    stmt.execute(params![r.key, r.resource_type.as_str(), r.value])?;
    Ok(())
}

pub(crate) fn delete_key_in(conn: &Connection, key: &str) -> Result<bool, StoreError> {
    if let Some(old) = stored_value(conn, key)? {
        unmirror_v2(conn, &old)?;
    }
    let mut stmt = conn.prepare_cached("DELETE FROM meta WHERE key = ?1")?;
    Ok(stmt.execute([key])? > 0)
}

pub(crate) fn upsert_object_in(
    conn: &Connection,
    r: &MetaRecord,
) -> Result<UpsertOutcome, StoreError> {
    let facts = serde_json::from_str::<Value>(&r.value)
        .ok()
        .map(|v| ObjectFacts::of(&v));
    upsert_known_object_in(conn, r, facts)
}

/// [`upsert_object_in`] of an object whose [`ObjectFacts`] the caller took from the value it
/// holds (`None`: the record is not a JSON object): the new text is not parsed back here.
pub(crate) fn upsert_known_object_in(
    conn: &Connection,
    r: &MetaRecord,
    facts: Option<ObjectFacts>,
) -> Result<UpsertOutcome, StoreError> {
    if let Some(new) = &facts
        && new.uid.is_some()
        && let Some(stored) = stored_value(conn, &r.key)?
        && let Ok(old) = serde_json::from_str::<Value>(&stored)
        && uid_of(&old) == new.uid.as_deref()
        && let (Some(old_rv), Some(new_rv)) = (rv_of(&old), new.rv)
        && old_rv > new_rv
    {
        return Ok(UpsertOutcome::KeptNewer { stored_rv: old_rv });
    }
    upsert_row(conn, r)?;
    if let Some(row) = facts.and_then(|f| f.v2) {
        mirror_v2_row(conn, r, row)?;
    }
    Ok(UpsertOutcome::Written)
}

/// What the store needs to know of an object besides its text (its identity and version and
/// its `meta_v2` row), taken from a parsed value so the store thread does not parse the text.
#[derive(Debug, Clone)]
pub struct ObjectFacts {
    uid: Option<String>,
    rv: Option<u64>,
    v2: Option<V2Row>,
}

impl ObjectFacts {
    pub fn of(v: &Value) -> Self {
        ObjectFacts {
            uid: uid_of(v).map(str::to_string),
            rv: rv_of(v),
            v2: v2::v2_row(v),
        }
    }
}

/// Removes `key` unless `uid` is given and the stored object has another one (a delete of an
/// older incarnation arriving after the newer one was stored).
pub(crate) fn delete_object_in(
    conn: &Connection,
    key: &str,
    uid: Option<&str>,
) -> Result<DeleteOutcome, StoreError> {
    let Some(stored) = stored_value(conn, key)? else {
        return Ok(DeleteOutcome::Absent);
    };
    if let (Some(uid), Ok(v)) = (uid, serde_json::from_str::<Value>(&stored))
        && let Some(stored_uid) = uid_of(&v)
        && stored_uid != uid
    {
        return Ok(DeleteOutcome::UidMismatch {
            stored_uid: stored_uid.to_string(),
        });
    }
    delete_key_in(conn, key)?;
    Ok(DeleteOutcome::Deleted)
}

pub(crate) fn delete_pod_in(
    conn: &Connection,
    key: &str,
    uid: Option<&str>,
) -> Result<DeleteOutcome, StoreError> {
    let Some(stored) = stored_value(conn, key)? else {
        return Ok(DeleteOutcome::Absent);
    };
    let mut pod_uid = uid.map(str::to_string);
    if let Ok(v) = serde_json::from_str::<Value>(&stored) {
        let stored_uid = uid_of(&v).unwrap_or_default();
        if uid.unwrap_or_default() != stored_uid {
            return Ok(DeleteOutcome::UidMismatch {
                stored_uid: stored_uid.to_string(),
            });
        }
        pod_uid = Some(stored_uid.to_string());
    }
    delete_key_in(conn, key)?;
    if let Some(patch_key) = podpatch_key(key) {
        delete_key_in(conn, &patch_key)?;
    }
    if let Some(pod_uid) = pod_uid.filter(|u| !u.is_empty()) {
        super::tokens::forget_pod_in(conn, &pod_uid)?;
    }
    Ok(DeleteOutcome::Deleted)
}

pub(crate) fn replace_if_same_uid_in(
    conn: &Connection,
    r: &MetaRecord,
) -> Result<ReplaceOutcome, StoreError> {
    let Some(uid) = uid_of_json(&r.value) else {
        return Ok(ReplaceOutcome::NotPresent);
    };
    match stored_value(conn, &r.key)? {
        Some(stored) if uid_of_json(&stored).as_deref() == Some(uid.as_str()) => {
            let rv = |s: &str| {
                serde_json::from_str::<Value>(s)
                    .ok()
                    .as_ref()
                    .and_then(rv_of)
            };
            if let (Some(stored_rv), Some(new_rv)) = (rv(&stored), rv(&r.value))
                && stored_rv > new_rv
            {
                return Ok(ReplaceOutcome::KeptNewer { stored_rv });
            }
            upsert_row(conn, r)?;
            mirror_v2(conn, r)?;
            Ok(ReplaceOutcome::Replaced)
        }
        _ => Ok(ReplaceOutcome::NotPresent),
    }
}

/// `<ns>/pod/<name>` → `<ns>/podpatch/<name>`.
pub fn podpatch_key(pod_key: &str) -> Option<String> {
    let mut p = ResourcePath::parse(pod_key).ok()?;
    (p.resource_type == "pod" && p.name.is_some()).then(|| {
        p.resource_type = "podpatch".into();
        p.to_wire()
    })
}

fn uid_of(v: &Value) -> Option<&str> {
    v.pointer("/metadata/uid").and_then(Value::as_str)
}

fn uid_of_json(s: &str) -> Option<String> {
    let v: Value = serde_json::from_str(s).ok()?;
    uid_of(&v).map(str::to_string)
}

fn rv_of(v: &Value) -> Option<u64> {
    v.pointer("/metadata/resourceVersion")?
        .as_str()?
        .parse()
        .ok()
}

/// Types whose rows only their own cloud controller writes (see [`MetaStore::cache_objects`]).
const OWNED_ELSEWHERE: &[&str] = &[
    "device",
    "devicemodel",
    "pod",
    "configmap",
    "secret",
    "node",
    // The MetaServer's authorization data: only the policy controller writes it.
    "serviceaccountaccess",
];

/// The `meta` row of an object the MetaServer may cache, as the cloud's dynamic controller
/// would send it: KubeEdge's resource `<ns or null>/<lower-case kind>/<name>` and type. `None`
/// for objects without kind or name and for kinds other modules own.
fn cache_record(obj: &Value) -> Option<MetaRecord> {
    let kind = obj.get("kind")?.as_str()?.to_ascii_lowercase();
    let name = obj.pointer("/metadata/name")?.as_str()?;
    let ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or("null");
    if kind.is_empty() || name.is_empty() || OWNED_ELSEWHERE.contains(&kind.as_str()) {
        return None;
    }
    Some(MetaRecord::new(
        format!("{ns}/{kind}/{name}"),
        kind,
        obj.to_string(),
    ))
}

#[cfg(test)]
mod tests;
