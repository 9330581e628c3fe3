//! Randomized fault injection against a simulated KubeEdge v1.15 edge: no update is lost on the
//! ObjectSync path.
//!
//! A real KubeEdge edgecore sends no inventory; cloudcore records every acknowledged delivery
//! in ObjectSync records and resends from them on connect and every resync interval. Here a
//! [`RawEdge`] without capabilities is wrapped in a small model of KubeEdge's metamanager
//! (`edge/pkg/metamanager/process.go`, `handleMessage`): insert/update/response store the object
//! under its key unconditionally (`InsertOrUpdate`, no resourceVersion check); a pod delete
//! removes the row only when the stored value contains the delete's UID
//! (`DeleteMetaByKeyAndPodUID`); any other delete removes the key; each is ACKed `"OK"`. Like
//! edged, it asks the cloud (remote `query`) for the configmaps and secrets its pods use and
//! it lacks, and asks the cloud to delete (grace 0, UID precondition) each pod it holds with a
//! `deletionTimestamp`, again on every connect and every second (kubelet's status manager).
//!
//! A seeded RNG drives pods bound to the node (created, relabelled, deleted gracefully,
//! force-deleted and re-created under the same name) and configmap/secret updates, deletions
//! and re-creations, interleaved with faults on the edge's link (`FaultProxy`): cuts,
//! blackholes (the frozen connection is closed when the link thaws, or earlier by the edge's own
//! send timeout; the edge then redials), added latency, one cloudcore restart (whose first
//! lists answer slowly and in random order). After healing, the edge must hold exactly the
//! cluster's pods (same UID, labels and spec), the configmaps and secrets they use, every configmap/secret it holds at the cluster's UID, resourceVersion and
//! data, and the node's ObjectSync records must name exactly what it holds, at the held
//! version. The churn and the fault schedule come from the shared engine (`churn.rs`);
//! `CHAOS_SEED` replays a schedule (printed), `CHAOS_SECS` sets the chaos phase (default 40).
//!
//! Logs of cloudcore and of the edge model (`E2E_LOG`, default `cloudcore=trace,e2e=debug`:
//! every downstream message and ACK) are kept in memory for this test alone (its runtime's
//! threads, whatever subscriber other tests installed) and, on failure, the lines naming a
//! differing object are printed with connects, disconnects and resyncs.

use crate::churn::{self, Churn, Fault, FaultTarget, uses};
use e2e::apiserver::Config;
use e2e::channel::{FaultProxy, Pki, RawEdge};
use e2e::cloud::{CloudFixture, test_sync_options};
use e2e::cluster::{self, TestCluster};
use e2e::reliablesyncs;
use e2e::sim_edge::{edge_node, unique};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::Api;
use kube::api::ListParams;
use kubeedge_shared::content::content_json;
use kubeedge_shared::{Group, Message, Operation};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const CONVERGE: Duration = Duration::from_secs(15);
/// A send the link does not take within this is a dead connection (the edge's own timeout).
const SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// The simulated metamanager's table: key (`<ns>/<type>/<name>`) → stored object.
#[derive(Default)]
struct EdgeDb {
    rows: BTreeMap<String, Value>,
    connects: u32,
    /// UIDs of every pod the cloud told the edge to delete.
    deleted_pods: BTreeSet<String>,
}

type Db = Arc<Mutex<EdgeDb>>;

fn lock(db: &Db) -> std::sync::MutexGuard<'_, EdgeDb> {
    db.lock().unwrap_or_else(|e| e.into_inner())
}

fn type_of(key: &str) -> &str {
    key.split('/').nth(1).unwrap_or("")
}

/// The object a remote query's reply carries (KubeEdge stores `Object` of an `ObjectResp`,
/// else the content); `None` for errors.
fn reply_object(content: &Value) -> Option<Value> {
    let v = content_json(content).ok()?;
    let v = match v.get("Object") {
        Some(o) if v.get("Err").is_none_or(Value::is_null) => o.clone(),
        Some(_) => return None,
        None => v,
    };
    v["metadata"]["uid"].is_string().then_some(v)
}

/// One connection's worth of metamanager + edged behaviour; returns when the link is dead.
async fn session(raw: &mut RawEdge, db: &Db, ns: &str, stop: &CancellationToken) {
    let mut queries: HashMap<String, String> = HashMap::new();
    let mut last_chores = Instant::now() - Duration::from_secs(10);
    loop {
        if last_chores.elapsed() >= Duration::from_secs(1) {
            last_chores = Instant::now();
            if chores(raw, db, ns, &mut queries).await.is_err() {
                return;
            }
        }
        let m = tokio::select! {
            _ = stop.cancelled() => return,
            r = raw.recv(Duration::from_millis(200)) => match r {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(_) => return,
            },
        };
        let key = m.route.resource.clone();
        let ty = type_of(&key).to_string();
        tracing::debug!(op = %m.route.operation, resource = %key, rv = %m.header.resource_version, id = %m.header.id, "edge model received");
        let mut reply = None;
        match m.route.operation {
            Operation::Insert | Operation::Update if m.route.group == Group::Resource => {
                let Ok(obj) = content_json(&m.content) else {
                    continue;
                };
                let terminating = ty == "pod" && !obj["metadata"]["deletionTimestamp"].is_null();
                lock(db).rows.insert(key.clone(), obj.clone());
                reply = Some(Message::ack_for(&m));
                if terminating && send(raw, &pod_delete(&key, &obj)).await.is_err() {
                    return;
                }
            }
            Operation::Delete => {
                let obj = content_json(&m.content).unwrap_or(Value::Null);
                let mut d = lock(db);
                if ty == "pod" {
                    let uid = obj["metadata"]["uid"].as_str().unwrap_or("");
                    d.deleted_pods.insert(uid.to_string());
                    if d.rows
                        .get(&key)
                        .is_some_and(|v| v.to_string().contains(uid))
                    {
                        d.rows.remove(&key);
                    }
                } else {
                    d.rows.remove(&key);
                }
                reply = Some(Message::ack_for(&m));
            }
            Operation::Response => {
                if let Some(qkey) = queries.remove(&m.header.parent_id)
                    && let Some(obj) = reply_object(&m.content)
                {
                    lock(db).rows.insert(qkey, obj);
                    reply = Some(Message::ack_for(&m));
                }
            }
            _ => {
                if m.requires_ack() {
                    reply = Some(Message::ack_for(&m));
                }
            }
        }
        if let Some(r) = reply
            && send(raw, &r).await.is_err()
        {
            return;
        }
    }
}

async fn send(raw: &mut RawEdge, m: &Message) -> Result<(), ()> {
    match tokio::time::timeout(SEND_TIMEOUT, raw.send(m)).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}

/// edged's `Pods(ns).Delete` with grace 0 and a UID precondition, through metamanager.
fn pod_delete(key: &str, pod: &Value) -> Message {
    Message::new(
        "edged",
        Group::Meta,
        Operation::Delete,
        key.to_string(),
        json!({"gracePeriodSeconds": 0, "preconditions": {"uid": pod["metadata"]["uid"]}}),
    )
}

/// edged's periodic work: delete terminating pods, fetch the configmaps/secrets pods need.
async fn chores(
    raw: &mut RawEdge,
    db: &Db,
    ns: &str,
    queries: &mut HashMap<String, String>,
) -> Result<(), ()> {
    let mut out = Vec::new();
    {
        let d = lock(db);
        let (mut cms, mut secrets) = (BTreeSet::new(), BTreeSet::new());
        for (key, pod) in d.rows.iter().filter(|(k, _)| type_of(k) == "pod") {
            if pod["metadata"]["deletionTimestamp"].is_null() {
                uses(pod, &mut cms, &mut secrets);
            } else {
                out.push(pod_delete(key, pod));
            }
        }
        let wanted = cms
            .iter()
            .map(|n| format!("{ns}/configmap/{n}"))
            .chain(secrets.iter().map(|n| format!("{ns}/secret/{n}")));
        for key in wanted.filter(|k| !d.rows.contains_key(k)) {
            let q = Message::new(
                "edged",
                Group::Meta,
                Operation::Query,
                key.clone(),
                Value::Null,
            );
            queries.insert(q.header.id.clone(), key);
            out.push(q);
        }
    }
    for m in &out {
        send(raw, m).await?;
    }
    Ok(())
}

/// The edge: dials through the proxy until stopped, one session per connection.
async fn run_edge(
    addr: std::net::SocketAddr,
    node: String,
    tls: Arc<rustls::ClientConfig>,
    db: Db,
    ns: String,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let dialled = tokio::time::timeout(
            Duration::from_secs(3),
            RawEdge::connect(addr, &node, tls.clone()),
        )
        .await;
        if let Ok(Ok(mut raw)) = dialled {
            lock(&db).connects += 1;
            session(&mut raw, &db, &ns, &stop).await;
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// The faults of one run: the link's and a cloudcore restart into the window where the new
/// cloudcore does not yet know the node's pods (a KubeEdge edge is not restarted: it holds no
/// state this test models beyond its table).
fn faults(rng: &mut rand::rngs::StdRng) -> Vec<Fault> {
    let ms = churn::ms;
    vec![
        Fault::Cut,
        Fault::Cut,
        Fault::Blackhole(ms(rng, 1500, 4000)),
        Fault::Blackhole(ms(rng, 1500, 4000)),
        Fault::Latency(ms(rng, 50, 300), ms(rng, 2000, 4000)),
        Fault::CloudRestartSlowLists(ms(rng, 300, 2500)),
    ]
}

/// cloudcore behind the proxy, restartable.
struct Cloud {
    cluster: TestCluster,
    pki: Pki,
    ns: String,
    fx: Option<CloudFixture>,
    link: FaultProxy,
}

impl Cloud {
    async fn start(&mut self) {
        let fx = CloudFixture::start_with(
            self.cluster.client(),
            &self.pki,
            test_sync_options(&self.ns),
        )
        .await
        .expect("cloudcore");
        self.link.set_upstream(fx.hub.local_addr());
        self.fx = Some(fx);
    }

    /// A restart as in the field: the edge's link leads to the new cloudcore before its
    /// informers have listed.
    async fn start_at_once(&mut self) {
        let fx = CloudFixture::launch(
            self.cluster.client(),
            &self.pki,
            test_sync_options(&self.ns),
        )
        .await
        .expect("cloudcore");
        self.link.set_upstream(fx.hub.local_addr());
        self.fx = Some(fx);
    }

    async fn stop(&mut self) {
        if let Some(fx) = self.fx.take() {
            fx.shutdown().await;
        }
        self.link.cut();
    }
}

impl FaultTarget for Cloud {
    async fn begin(&mut self, f: Fault) {
        match f {
            Fault::Cut => self.link.cut(),
            Fault::Blackhole(_) => self.link.freeze(),
            Fault::Latency(l, _) => self.link.set_latency(l),
            Fault::CloudRestart(_) | Fault::CloudRestartSlowLists(_) => self.stop().await,
            Fault::EdgeRestart(_) => {}
        }
    }

    async fn end(&mut self, f: Fault) {
        match f {
            Fault::Cut | Fault::EdgeRestart(_) => {}
            Fault::Blackhole(_) => self.link.thaw(),
            Fault::Latency(..) => self.link.set_latency(Duration::ZERO),
            Fault::CloudRestart(_) => self.start().await,
            Fault::CloudRestartSlowLists(_) => {
                // The new cloudcore's first lists answer slowly and in random order: the edge
                // reconnects while it does not yet know all of the node's pods.
                if let Some(server) = self.cluster.in_memory() {
                    let delay = server.list_delay();
                    delay.set(Duration::from_millis(1500));
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(4500)).await;
                        delay.set(Duration::ZERO);
                    });
                }
                self.start_at_once().await
            }
        }
    }
}

fn str_at(v: &Value, p: &str) -> String {
    v.pointer(p)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Everything that differs between the cluster, the edge's table and the node's records.
async fn differences(c: &TestCluster, ns: &str, node: &str, db: &Db) -> Vec<String> {
    let mut diff = Vec::new();
    let client = c.client();
    let (Ok(pods), Ok(cms), Ok(secrets), Ok(records)) = (
        Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await,
        Api::<ConfigMap>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await,
        Api::<Secret>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await,
        reliablesyncs::list(&client).await,
    ) else {
        diff.push("cannot list the cluster's objects".into());
        return diff;
    };
    let mut cluster: BTreeMap<String, Value> = BTreeMap::new();
    let (mut used_cms, mut used_secrets) = (BTreeSet::new(), BTreeSet::new());
    for p in &pods.items {
        let v = serde_json::to_value(p).expect("pod JSON");
        // A pod is deleted at the edge only once it is gone from the cluster (or the edge
        // asked, for a terminating one): anything else would stop a pod that should run.
        let uid = p.metadata.uid.clone().unwrap_or_default();
        if p.metadata.deletion_timestamp.is_none() && lock(db).deleted_pods.contains(&uid) {
            diff.push(format!(
                "pod {} (uid {uid}) was deleted at the edge while it exists in the cluster",
                str_at(&v, "/metadata/name")
            ));
        }
        if p.metadata.deletion_timestamp.is_some() {
            diff.push(format!(
                "pod {} still terminating in the cluster",
                str_at(&v, "/metadata/name")
            ));
        }
        uses(&v, &mut used_cms, &mut used_secrets);
        cluster.insert(format!("{ns}/pod/{}", str_at(&v, "/metadata/name")), v);
    }
    for o in &cms.items {
        let v = serde_json::to_value(o).expect("configmap JSON");
        cluster.insert(
            format!("{ns}/configmap/{}", str_at(&v, "/metadata/name")),
            v,
        );
    }
    for o in &secrets.items {
        let v = serde_json::to_value(o).expect("secret JSON");
        cluster.insert(format!("{ns}/secret/{}", str_at(&v, "/metadata/name")), v);
    }
    let rows = lock(db).rows.clone();
    for (key, v) in cluster.iter().filter(|(k, _)| type_of(k) == "pod") {
        match rows.get(key) {
            None => diff.push(format!("{key} missing on the edge")),
            Some(r) if str_at(r, "/metadata/uid") != str_at(v, "/metadata/uid") => {
                diff.push(format!(
                    "{key}: edge holds uid {}, cluster {}",
                    str_at(r, "/metadata/uid"),
                    str_at(v, "/metadata/uid")
                ))
            }
            Some(r) => {
                if r["metadata"]["labels"] != v["metadata"]["labels"] || r["spec"] != v["spec"] {
                    diff.push(format!(
                        "{key}: edge labels {} rv {}, cluster labels {} rv {} (or specs differ)",
                        r["metadata"]["labels"],
                        str_at(r, "/metadata/resourceVersion"),
                        v["metadata"]["labels"],
                        str_at(v, "/metadata/resourceVersion")
                    ));
                }
            }
        }
    }
    for (key, r) in &rows {
        let (uid, rv) = (
            str_at(r, "/metadata/uid"),
            str_at(r, "/metadata/resourceVersion"),
        );
        match cluster.get(key) {
            None => diff.push(format!("{key} ({uid}) deleted but kept on the edge")),
            Some(v) if str_at(v, "/metadata/uid") != uid => {
                if type_of(key) != "pod" {
                    diff.push(format!(
                        "{key}: edge holds uid {uid}, cluster {}",
                        str_at(v, "/metadata/uid")
                    ));
                }
            }
            Some(v)
                if type_of(key) != "pod"
                    && (str_at(v, "/metadata/resourceVersion") != rv || v["data"] != r["data"]) =>
            {
                diff.push(format!(
                    "{key}: edge rv {rv} data {}, cluster rv {} data {}",
                    r["data"],
                    str_at(v, "/metadata/resourceVersion"),
                    v["data"]
                ));
            }
            Some(_) => {}
        }
    }
    for (ty, used) in [("configmap", &used_cms), ("secret", &used_secrets)] {
        for name in used {
            let key = format!("{ns}/{ty}/{name}");
            if !rows.contains_key(&key) {
                diff.push(format!("{key} used by a pod but missing on the edge"));
            }
        }
    }
    // Records: exactly one per held object, at the held version.
    let prefix = format!("{node}.");
    let mut recorded: BTreeMap<String, (String, String)> = BTreeMap::new();
    for (name, r) in records.iter().filter(|(n, _)| n.starts_with(&prefix)) {
        let key = format!(
            "{}/{}/{}",
            r.namespace.clone().unwrap_or_default(),
            r.kind.to_lowercase(),
            r.object_name
        );
        let uid = name[prefix.len()..].to_string();
        if let Some((other, _)) = recorded.insert(key.clone(), (uid.clone(), r.object_rv.clone())) {
            diff.push(format!("{key}: two records, uids {other} and {uid}"));
        }
    }
    for (key, r) in &rows {
        let held = (
            str_at(r, "/metadata/uid"),
            str_at(r, "/metadata/resourceVersion"),
        );
        match recorded.get(key) {
            None => diff.push(format!("{key} held (uid {}) but no record", held.0)),
            Some(rec) if *rec != held => diff.push(format!(
                "{key}: record uid {} rv {}, edge holds uid {} rv {}",
                rec.0, rec.1, held.0, held.1
            )),
            Some(_) => {}
        }
    }
    for (key, (uid, rv)) in &recorded {
        if !rows.contains_key(key) {
            diff.push(format!(
                "record for {key} (uid {uid} rv {rv}) but the edge holds none"
            ));
        }
    }
    diff
}

/// Log lines of this test's runtime, kept in memory.
#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<String>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(b);
        let mut lines = self.0.lock().unwrap_or_else(|e| e.into_inner());
        lines.extend(text.lines().map(str::to_string));
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuf {
    fn dispatch(&self) -> tracing::Dispatch {
        let filter = tracing_subscriber::EnvFilter::try_from_env("E2E_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("cloudcore=trace,e2e=debug"));
        let buf = self.clone();
        tracing::Dispatch::new(
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .with_writer(move || buf.clone())
                .finish(),
        )
    }

    /// Lines naming one of `words`, and every connect, disconnect and resync.
    fn relevant(&self, words: &[String]) -> Vec<String> {
        let lines = self.0.lock().unwrap_or_else(|e| e.into_inner());
        lines
            .iter()
            .filter(|l| {
                words.iter().any(|w| names(l, w))
                    || [
                        "edge connected",
                        "disconnected",
                        "replaced",
                        "resynchronised",
                    ]
                    .iter()
                    .any(|m| l.contains(m))
            })
            .cloned()
            .collect()
    }
}

/// Whether `line` names `name` (`pod-1` is not named by `pod-11`).
fn names(line: &str, name: &str) -> bool {
    line.match_indices(name).any(|(i, _)| {
        !line[i + name.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

/// Object names (`pod-11`, `cm-2`) in difference lines.
fn names_in(diff: &[String]) -> Vec<String> {
    let mut found: BTreeSet<String> = BTreeSet::new();
    for line in diff {
        for word in line.split(['/', ' ', ':']) {
            if ["pod-", "cm-", "sec-"].iter().any(|p| word.starts_with(p)) {
                found.insert(word.to_string());
            }
        }
    }
    found.into_iter().collect()
}

#[test]
fn kubeedge_edge_loses_no_update_under_link_faults() {
    let logs = LogBuf::default();
    let dispatch = logs.dispatch();
    let for_workers = dispatch.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || {
            // For the thread's life: the runtime's threads end with the test.
            std::mem::forget(tracing::dispatcher::set_default(&for_workers));
        })
        .build()
        .expect("runtime");
    let _main = tracing::dispatcher::set_default(&dispatch);
    rt.block_on(chaos(logs));
}

async fn chaos(logs: LogBuf) {
    let Some(c) = cluster::connect_installing_crds(Config::for_tests(), "KubeEdge chaos")
        .await
        .expect("cluster")
    else {
        return;
    };
    let (seed, total) = churn::seed_and_length("chaos-kubeedge", 40);
    let ns = c.temp_namespace("kechaos").await.expect("namespace");
    reliablesyncs::install(&c.client()).await.expect("CRDs");
    let node = unique("ke-chaos");
    edge_node(&c, &node).await;
    let pki = Pki::new().expect("pki");
    let tls = pki
        .edge_tls(&pki.node_cert(&node).expect("node certificate"))
        .expect("edge TLS");
    let link = FaultProxy::start(([127, 0, 0, 1], 9).into())
        .await
        .expect("proxy");
    let client = c.client();
    let mut cloud = Cloud {
        cluster: c,
        pki,
        ns: ns.clone(),
        fx: None,
        link,
    };
    cloud.start().await;

    let mut churn = Churn::start("chaos-kubeedge", client, &ns, &node, "busybox", seed).await;
    let faults = faults(&mut churn.rng);
    let faults = churn::schedule(&mut churn.rng, total, faults);

    let db: Db = Arc::default();
    let stop = CancellationToken::new();
    let edge = tokio::spawn(run_edge(
        cloud.link.addr,
        node.clone(),
        tls,
        db.clone(),
        ns.clone(),
        stop.clone(),
    ));

    churn.run(total, faults, (50, 300), &mut cloud).await;

    cloud.link.thaw();
    cloud.link.set_latency(Duration::ZERO);
    if cloud.fx.is_none() {
        cloud.start().await;
    }
    churn.heal().await;
    println!("chaos-kubeedge: {} connections", lock(&db).connects);
    let (diff, took) = churn::converge(
        "chaos-kubeedge",
        CONVERGE,
        Duration::from_millis(250),
        || differences(&cloud.cluster, &ns, &node, &db),
    )
    .await;
    stop.cancel();
    let _ = edge.await;
    if !diff.is_empty() {
        println!("chaos-kubeedge: logs naming the differing objects (and connects/resyncs):");
        for line in logs.relevant(&names_in(&diff)) {
            println!("  {line}");
        }
        panic!(
            "CHAOS_SEED={seed}: the KubeEdge edge did not converge within {CONVERGE:?} after healing:\n{}",
            churn::listing(&diff)
        );
    }
    let held = lock(&db).rows.len();
    println!(
        "chaos-kubeedge: converged {took:?} after healing (seed {seed}), edge holds {held} objects"
    );
    cloud.stop().await;
}
