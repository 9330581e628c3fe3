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
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_util::sync::CancellationToken;

/// One object as an edge holds it (or as the cluster says it should be held).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub uid: String,
    pub rv: String,
    /// What the benchmark changes: a pod's labels, a configmap's data (canonical JSON).
    pub content: String,
}

/// Held objects by database key `<namespace>/<type>/<name>`.
pub type Objects = HashMap<String, Held>;

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
    /// Downstream messages by `"<type> <operation>"`, counted while `tally` is set.
    pub by_kind: Mutex<BTreeMap<String, usize>>,
    pub tally: std::sync::atomic::AtomicBool,
}

/// First arrival of each pod resource (`default/pod/<name>`), for the latency phase.
pub type Receipts = Arc<Mutex<HashMap<String, Instant>>>;

/// One simulated edge node: its name and its "database".
pub struct EdgeState {
    pub node: String,
    objects: Mutex<Objects>,
    /// Nanoseconds after `epoch` of the last change to `objects` (0: never).
    last_change: AtomicU64,
    epoch: Instant,
}

impl EdgeState {
    pub fn new(node: String, epoch: Instant) -> Arc<EdgeState> {
        Arc::new(EdgeState {
            node,
            objects: Mutex::new(HashMap::new()),
            last_change: AtomicU64::new(0),
            epoch,
        })
    }

    pub fn objects(&self) -> MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When `objects` last changed (`None`: never).
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
            .objects()
            .iter()
            .map(|(key, h)| InventoryEntry {
                resource_type: key.split('/').nth(1).unwrap_or_default().to_string(),
                key: key.clone(),
                uid: h.uid.clone(),
                resource_version: h.rv.clone(),
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
        let uid = object["metadata"]["uid"].as_str();
        let mut objects = self.objects();
        let changed = match op {
            Operation::Delete => {
                let remove = match (objects.get(key), uid) {
                    (None, _) => false,
                    // A pod row goes only when the UID matches (no UID matches nothing).
                    (Some(h), uid) if ty == "pod" => h.uid == uid.unwrap_or_default(),
                    (Some(h), Some(uid)) => h.uid == uid,
                    (Some(_), None) => true,
                };
                remove && objects.remove(key).is_some()
            }
            Operation::Insert | Operation::Update | Operation::Patch | Operation::Response
                if object.is_object() =>
            {
                let rv = object["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let new = Held {
                    uid: uid.unwrap_or_default().to_string(),
                    content: content_of(ty, object),
                    rv,
                };
                let num = |s: &str| s.parse::<u64>().ok();
                match objects.get(key) {
                    Some(old)
                        if old.uid == new.uid
                            && matches!((num(&old.rv), num(&new.rv)), (Some(o), Some(n)) if o > n) =>
                    {
                        false // the stored copy is newer
                    }
                    Some(old) if *old == new => false,
                    _ => {
                        objects.insert(key.to_string(), new);
                        true
                    }
                }
            }
            _ => false,
        };
        drop(objects);
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
        let objects = self.objects();
        cms.iter()
            .map(|n| format!("{ns}/configmap/{n}"))
            .chain(secrets.iter().map(|n| format!("{ns}/secret/{n}")))
            .filter(|k| !objects.contains_key(k))
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
            next = raw.recv(Duration::from_secs(1)) => next,
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
                        if let Ok(mut r) = receipts.lock() {
                            r.entry(m.route.resource.clone())
                                .or_insert_with(Instant::now);
                        }
                    }
                }
            }
            Ok(None) => {}
            Err(_) => return,
        }
        if last_keepalive.elapsed() > Duration::from_secs(10) {
            if raw.keepalive().await.is_err() {
                return;
            }
            counters.upstream.fetch_add(1, Ordering::Relaxed);
            last_keepalive = Instant::now();
        }
    }
}
