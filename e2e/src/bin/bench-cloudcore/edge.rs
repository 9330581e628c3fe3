//! The simulated edges of bench-cloudcore. Each keeps what it was sent the way edgecore's
//! metamanager keeps it in SQLite (an older resourceVersion of the same UID never overwrites a
//! newer one; a pod delete removes the row only when the UID matches), ACKs after applying,
//! sends keepalives, and on every connect advertises the inventory resync and sends the
//! inventory of what it holds. The held state outlives the connection, as the database does.

use crate::expected::references;
use e2e::channel::RawEdge;
use kubeedge_shared::constants::CAPABILITY_INVENTORY;
use kubeedge_shared::content::content_json;
use kubeedge_shared::inventory::{Inventory, InventoryEntry};
use kubeedge_shared::{Group, Message, Operation};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_util::sync::CancellationToken;

/// One object as an edge holds it (or as the cluster says it should be held), compact so a
/// million of them fit beside the API server: the UID as its 128 bits, the resourceVersion as a
/// number, and a hash of what the benchmark changes (a pod's labels, a configmap's data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub uid: u128,
    pub rv: u64,
    pub content: u64,
}

impl Held {
    /// What an edge holds of `object` (a `resource_type` object as sent or listed).
    pub fn of(resource_type: &str, object: &Value) -> Held {
        let meta = &object["metadata"];
        Held {
            uid: uid_bits(meta["uid"].as_str().unwrap_or_default()),
            rv: meta["resourceVersion"]
                .as_str()
                .and_then(|r| r.parse().ok())
                .unwrap_or(0),
            content: stable_hash(&content_of(resource_type, object)),
        }
    }

    /// The UID in its text form (empty for none).
    pub fn uid_text(&self) -> String {
        if self.uid == 0 {
            String::new()
        } else {
            uuid::Uuid::from_u128(self.uid).to_string()
        }
    }

    /// This object's share of its edge's digest (see [`Db::digest`]).
    pub fn digest(&self, key: &str) -> u64 {
        stable_hash(&(key, self.uid, self.rv, self.content))
    }
}

/// A UID's 128 bits (API servers give UUIDs; anything else counts as none).
fn uid_bits(uid: &str) -> u128 {
    uuid::Uuid::parse_str(uid).map_or(0, |u| u.as_u128())
}

/// The same hash in every process of one benchmark binary (SipHash with fixed keys).
pub fn stable_hash<T: std::hash::Hash + ?Sized>(v: &T) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(v)
}

/// Held objects by database key `<namespace>/<type>/<name>`.
pub type Objects = HashMap<Box<str>, Held>;

/// One edge's "database": its objects and their digest.
#[derive(Default)]
pub struct Db {
    pub objects: Objects,
    /// Wrapping sum of every object's [`Held::digest`]: equal digests mean equal contents, so
    /// processes compare edges by one number each.
    pub digest: u64,
}

impl Db {
    fn put(&mut self, key: &str, held: Held) {
        if let Some(old) = self.objects.insert(key.into(), held) {
            self.digest = self.digest.wrapping_sub(old.digest(key));
        }
        self.digest = self.digest.wrapping_add(held.digest(key));
    }

    fn remove(&mut self, key: &str) -> bool {
        match self.objects.remove(key) {
            Some(old) => {
                self.digest = self.digest.wrapping_sub(old.digest(key));
                true
            }
            None => false,
        }
    }
}

/// The digest a [`Db`] holding exactly `objects` has.
pub fn digest_of(objects: &Objects) -> u64 {
    objects
        .iter()
        .fold(0u64, |d, (k, h)| d.wrapping_add(h.digest(k)))
}

/// The types the cloud keeps in sync that this simulator tracks.
const TRACKED: [&str; 3] = ["pod", "configmap", "secret"];

/// Canonical JSON of the part of an object the benchmark compares.
pub fn content_of(resource_type: &str, object: &Value) -> String {
    let field = if resource_type == "pod" {
        &object["metadata"]["labels"]
    } else {
        &object["data"]
    };
    let map: BTreeMap<String, String> = serde_json::from_value(field.clone()).unwrap_or_default();
    serde_json::to_string(&map).unwrap_or_default()
}

/// Counters shared by every simulated edge.
#[derive(Default)]
pub struct Counters {
    /// Pod messages received (any operation).
    pub pods_received: AtomicUsize,
    /// Every downstream message received.
    pub downstream: AtomicUsize,
    /// Every upstream frame sent (ACKs, keepalives, inventories).
    pub upstream: AtomicUsize,
    /// Failed dials (refused, timed out, TLS or WebSocket errors).
    pub dial_failures: AtomicUsize,
    /// Connections the cloud ended that the edge then dialled again.
    pub reconnects: AtomicUsize,
    /// Downstream messages by `"<type> <operation>"`, counted while `tally` is set.
    pub by_kind: Mutex<BTreeMap<String, usize>>,
    pub tally: std::sync::atomic::AtomicBool,
}

/// First arrival (wall clock, comparable across processes) of each latency-phase pod
/// (`default/pod/lat-<i>`).
pub type Receipts = Arc<Mutex<HashMap<String, SystemTime>>>;

/// One simulated edge node: its name and its "database".
pub struct EdgeState {
    pub node: String,
    db: Mutex<Db>,
    /// Nanoseconds after `epoch` of the last change to the database (0: never).
    last_change: AtomicU64,
    epoch: Instant,
}

impl EdgeState {
    pub fn new(node: String, epoch: Instant) -> Arc<EdgeState> {
        Arc::new(EdgeState {
            node,
            db: Mutex::new(Db::default()),
            last_change: AtomicU64::new(0),
            epoch,
        })
    }

    pub fn db(&self) -> MutexGuard<'_, Db> {
        self.db.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When the database last changed (`None`: never).
    pub fn last_change(&self) -> Option<Instant> {
        match self.last_change.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(self.epoch + Duration::from_nanos(ns)),
        }
    }

    fn changed(&self) {
        let ns = self.epoch.elapsed().as_nanos().max(1) as u64;
        self.last_change.fetch_max(ns, Ordering::Relaxed);
    }

    /// What the database holds, in the wire shape sent on connect.
    pub fn inventory(&self) -> Inventory {
        let objects = self
            .db()
            .objects
            .iter()
            .map(|(key, h)| InventoryEntry {
                resource_type: key.split('/').nth(1).unwrap_or_default().to_string(),
                key: key.to_string(),
                uid: h.uid_text(),
                resource_version: h.rv.to_string(),
            })
            .collect();
        Inventory { objects }
    }

    /// Applies one downstream message as metamanager would; `"<type> <operation>"` when it
    /// was about a tracked object.
    fn apply(&self, m: &Message) -> Option<String> {
        let ty = m.route.resource.split('/').nth(1)?;
        if !TRACKED.contains(&ty) {
            return None;
        }
        let object = content_json(&m.content).unwrap_or(Value::Null);
        self.store(&m.route.resource, &m.route.operation, &object);
        Some(format!("{ty} {}", m.route.operation))
    }

    /// Writes `object` under `key` the way metamanager does.
    fn store(&self, key: &str, op: &Operation, object: &Value) {
        let ty = key.split('/').nth(1).unwrap_or_default();
        let uid = object["metadata"]["uid"].as_str().map(uid_bits);
        let mut db = self.db();
        let changed = match op {
            Operation::Delete => {
                let remove = match (db.objects.get(key), uid) {
                    (None, _) => false,
                    // A pod row goes only when the UID matches (no UID matches nothing).
                    (Some(h), uid) if ty == "pod" => h.uid == uid.unwrap_or_default(),
                    (Some(h), Some(uid)) => h.uid == uid,
                    (Some(_), None) => true,
                };
                remove && db.remove(key)
            }
            Operation::Insert | Operation::Update | Operation::Patch | Operation::Response
                if object.is_object() =>
            {
                let new = Held::of(ty, object);
                match db.objects.get(key) {
                    // The stored copy is newer.
                    Some(old) if old.uid == new.uid && old.rv > new.rv && new.rv > 0 => false,
                    Some(old) if *old == new => false,
                    _ => {
                        db.put(key, new);
                        true
                    }
                }
            }
            _ => false,
        };
        drop(db);
        if changed {
            self.changed();
        }
    }

    /// Queries for the configmaps and secrets a pod just received references and the edge does
    /// not hold (edged asks metamanager, which asks the cloud, when it starts the pod).
    fn queries_for(&self, m: &Message) -> Vec<(String, Message)> {
        if m.route.resource.split('/').nth(1) != Some("pod")
            || !matches!(m.route.operation, Operation::Insert | Operation::Update)
        {
            return Vec::new();
        }
        let Ok(pod) = content_json(&m.content) else {
            return Vec::new();
        };
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        let (cms, secrets) = references(&pod);
        let db = self.db();
        cms.iter()
            .map(|n| format!("{ns}/configmap/{n}"))
            .chain(secrets.iter().map(|n| format!("{ns}/secret/{n}")))
            .filter(|k| !db.objects.contains_key(k.as_str()))
            .map(|k| {
                let q = Message::new(
                    "edged",
                    Group::Meta,
                    Operation::Query,
                    k.clone(),
                    Value::Null,
                );
                (k, q)
            })
            .collect()
    }
}

/// Dials cloudhub as `edge` advertising the inventory resync, retrying with edgehub's backoff
/// (full jitter in [base/2, base], base = 1 s · 2^failures, at most 30 s; 30 s handshake
/// timeout), then sends the inventory. Gives up after `max_failures` failed dials.
pub async fn dial(
    addr: SocketAddr,
    edge: &EdgeState,
    tls: Arc<rustls::ClientConfig>,
    counters: &Counters,
    max_failures: u32,
) -> anyhow::Result<RawEdge> {
    let mut failures = 0u32;
    loop {
        let attempt = tokio::time::timeout(
            Duration::from_secs(30),
            RawEdge::connect_with(addr, &edge.node, tls.clone(), &[CAPABILITY_INVENTORY]),
        )
        .await;
        match attempt {
            Ok(Ok(mut raw)) => {
                raw.send(&edge.inventory().to_message(&edge.node)).await?;
                counters.upstream.fetch_add(1, Ordering::Relaxed);
                return Ok(raw);
            }
            Ok(Err(e)) if failures + 1 >= max_failures => {
                anyhow::bail!("{}: {e}", edge.node)
            }
            Err(_) if failures + 1 >= max_failures => {
                anyhow::bail!("{}: handshake timed out", edge.node)
            }
            _ => {}
        }
        counters.dial_failures.fetch_add(1, Ordering::Relaxed);
        failures += 1;
        let base = Duration::from_secs(1)
            .saturating_mul(1u32 << failures.min(16))
            .min(Duration::from_secs(30));
        let jitter = rand::random_range(0..=(base / 2).as_millis() as u64);
        tokio::time::sleep(base / 2 + Duration::from_millis(jitter)).await;
    }
}

/// Runs `edge`'s connections, starting with `raw`, until `stop` fires: when the cloud ends
/// one (e.g. a keepalive or write time-out on an overloaded machine), the edge dials again with
/// edgehub's back-off, as edgehub does.
pub async fn keep(
    addr: SocketAddr,
    mut raw: RawEdge,
    edge: Arc<EdgeState>,
    tls: Arc<rustls::ClientConfig>,
    counters: Arc<Counters>,
    receipts: Receipts,
    stop: CancellationToken,
) {
    loop {
        run(
            raw,
            edge.clone(),
            counters.clone(),
            receipts.clone(),
            stop.clone(),
        )
        .await;
        if stop.is_cancelled() {
            return;
        }
        counters.reconnects.fetch_add(1, Ordering::Relaxed);
        raw = tokio::select! {
            _ = stop.cancelled() => return,
            r = dial(addr, &edge, tls.clone(), &counters, u32::MAX) => match r {
                Ok(raw) => raw,
                Err(_) => return,
            },
        };
    }
}

/// Between the keepalives an edge sends.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// Runs one connection of `edge` until the cloud closes it or `stop` fires (then the edge
/// closes its socket, as an edge losing its link or restarting does).
pub async fn run(
    mut raw: RawEdge,
    edge: Arc<EdgeState>,
    counters: Arc<Counters>,
    receipts: Receipts,
    stop: CancellationToken,
) {
    let mut last_keepalive = Instant::now();
    // Queries in flight: message id → key.
    let mut queries: HashMap<String, String> = HashMap::new();
    loop {
        let next = tokio::select! {
            _ = stop.cancelled() => {
                let _ = tokio::time::timeout(
                    Duration::from_secs(1),
                    raw.send_frame(WsMessage::Close(None)),
                )
                .await;
                return;
            }
            // Woken by a message or when the next keepalive is due, not by a poll: 100,000
            // edges polling every second would spend the simulator's CPU on timers.
            next = raw.recv(KEEPALIVE.saturating_sub(last_keepalive.elapsed())) => next,
        };
        match next {
            Ok(Some(m)) => {
                counters.downstream.fetch_add(1, Ordering::Relaxed);
                let kind = match queries.remove(m.parent_id()) {
                    Some(key) => {
                        let object = content_json(&m.content).unwrap_or(Value::Null);
                        // A StatusError (e.g. 404) stores nothing.
                        if object["metadata"]["uid"].is_string() {
                            edge.store(&key, &Operation::Response, &object);
                        }
                        None
                    }
                    None => edge.apply(&m),
                };
                for (key, q) in edge.queries_for(&m) {
                    if queries.values().any(|k| *k == key) {
                        continue;
                    }
                    if raw.send(&q).await.is_err() {
                        return;
                    }
                    counters.upstream.fetch_add(1, Ordering::Relaxed);
                    queries.insert(q.header.id.clone(), key);
                }
                if m.requires_ack() {
                    if raw.ack(&m).await.is_err() {
                        return;
                    }
                    counters.upstream.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(kind) = kind {
                    if counters.tally.load(Ordering::Relaxed)
                        && let Ok(mut k) = counters.by_kind.lock()
                    {
                        *k.entry(kind).or_default() += 1;
                    }
                    if m.route.resource.contains("/pod/") {
                        counters.pods_received.fetch_add(1, Ordering::Relaxed);
                        if m.route.resource.contains("/pod/lat-")
                            && let Ok(mut r) = receipts.lock()
                        {
                            r.entry(m.route.resource.clone())
                                .or_insert_with(SystemTime::now);
                        }
                    }
                }
            }
            Ok(None) => {}
            Err(_) => return,
        }
        if last_keepalive.elapsed() >= KEEPALIVE {
            if raw.keepalive().await.is_err() {
                return;
            }
            counters.upstream.fetch_add(1, Ordering::Relaxed);
            last_keepalive = Instant::now();
        }
    }
}
