//! The real metamanager and edgehub against a real cloudhub on loopback, with the edge
//! database on disk: ACKs only after durable writes, failed writes never ACKed, idempotent
//! re-delivery, UID-guarded pod deletes, offline reads, the inventory on connect, and a
//! database that survives kill -9 in the middle of writes.

use cloudcore::cloudhub::{Acked, CloudHub, Upstream};
use e2e::channel::*;
use edgecore::edgehub::EdgeHub;
use edgecore::metamanager::{
    ChangeAction, MetaClient, MetaError, MetaManager, MetaManagerConfig, MetaStore, ObjectChange,
};
use kubeedge_shared::constants::CAPABILITY_INVENTORY;
use kubeedge_shared::inventory::Inventory;
use kubeedge_shared::{Group, Message, Operation, ResourceType};
use serde_json::{Value, json};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(10);
const NODE: &str = "edge-1";

struct Edge {
    _dir: tempfile::TempDir,
    db: PathBuf,
    store: MetaStore,
    hub: EdgeHub,
    manager: MetaManager,
    client: MetaClient,
    changes: mpsc::Receiver<ObjectChange>,
}

impl Edge {
    async fn stop(self) {
        self.manager.shutdown().await;
        self.hub.shutdown();
        self.store.close().await;
    }
}

/// Opens a fresh database; `prepare` may alter it (e.g. add a failing trigger) before the
/// metamanager starts.
async fn start_edge(pki: &Pki, cloud: &CloudHub, prepare: impl FnOnce(&Path)) -> Edge {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("edgecore.db");
    let store = MetaStore::open(&db).await.unwrap();
    prepare(&db);
    let mut hub_cfg = test_edge_config(cloud.local_addr(), NODE);
    hub_cfg.capabilities = vec![CAPABILITY_INVENTORY.to_string()];
    let (hub, from_cloud) = start_edge_hub(pki, hub_cfg);
    let config = MetaManagerConfig {
        node_name: NODE.into(),
        remote_query_timeout: Duration::from_secs(5),
        ..MetaManagerConfig::default()
    };
    let (manager, client, changes) =
        MetaManager::start(config, store.clone(), hub.clone(), from_cloud);
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cloud.is_connected(NODE) || !hub.is_connected() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "edge never connected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Edge {
        _dir: dir,
        db,
        store,
        hub,
        manager,
        client,
        changes,
    }
}

fn start_edge_hub(
    pki: &Pki,
    cfg: edgecore::edgehub::EdgeHubConfig,
) -> (EdgeHub, mpsc::Receiver<Message>) {
    e2e::channel::start_edge(pki, cfg).unwrap()
}

fn object_msg(op: Operation, ty: &str, name: &str, uid: &str, rv: u64) -> Message {
    let kind = match ty {
        "pod" => "Pod",
        "configmap" => "ConfigMap",
        _ => "Secret",
    };
    Message::new(
        "edgecontroller",
        Group::Resource,
        op,
        format!("default/{ty}/{name}"),
        json!({"apiVersion": "v1", "kind": kind,
               "metadata": {"name": name, "namespace": "default", "uid": uid,
                            "resourceVersion": rv.to_string()},
               "spec": {"nodeName": NODE}}),
    )
    .with_resource_version(rv.to_string())
}

fn pod_msg(op: Operation, name: &str, uid: &str, rv: u64) -> Message {
    object_msg(op, "pod", name, uid, rv)
}

/// Reads a row with a connection of its own (what is on disk, not what the store caches).
fn row(db: &Path, key: &str) -> Option<Value> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let value: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .ok();
    value.map(|v| serde_json::from_str(&v).expect("stored value is JSON"))
}

fn count_rows(db: &Path) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("SELECT count(*) FROM meta", [], |r| r.get(0))
        .unwrap()
}

async fn next_ack(acks: &mut mpsc::Receiver<Acked>) -> Acked {
    tokio::time::timeout(WAIT, acks.recv())
        .await
        .expect("ACK in time")
        .expect("ACK channel open")
}

async fn next_change(changes: &mut mpsc::Receiver<ObjectChange>) -> ObjectChange {
    tokio::time::timeout(WAIT, changes.recv())
        .await
        .expect("change for edged in time")
        .expect("edged channel open")
}

async fn next_upstream(
    up: &mut mpsc::Receiver<Upstream>,
    what: impl Fn(&Message) -> bool,
) -> Message {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let m = tokio::time::timeout_at(deadline, up.recv())
            .await
            .expect("upstream message in time")
            .expect("upstream channel open");
        if what(&m.message) {
            return m.message;
        }
    }
}

#[tokio::test]
async fn pod_insert_is_in_sqlite_before_the_cloud_sees_its_ack() {
    let pki = Pki::new().unwrap();
    let (cloud, _up, _m) = start_hub(&pki, test_hub_config()).await.unwrap();
    let mut edge = start_edge(&pki, &cloud, |_| {}).await;
    let mut acks = cloud.subscribe_acks(256);
    let mut sent = std::collections::HashMap::new();
    for i in 0..50 {
        let msg = pod_msg(
            Operation::Insert,
            &format!("web-{i}"),
            &format!("uid-{i}"),
            100 + i,
        );
        sent.insert(msg.header.id.clone(), i);
        cloud.send(NODE, msg).unwrap();
    }
    for _ in 0..50 {
        let ack = next_ack(&mut acks).await;
        // The instant the cloud has the ACK, the row must already be on disk.
        let i = sent
            .remove(&ack.message.msg_id)
            .expect("ACK for a sent message");
        let stored = row(&edge.db, &format!("default/pod/web-{i}"))
            .unwrap_or_else(|| panic!("web-{i} ACKed but not in the database"));
        assert_eq!(stored["metadata"]["uid"], format!("uid-{i}"));
        assert_eq!(
            ack.message.uid.as_deref(),
            Some(format!("uid-{i}").as_str())
        );
    }
    assert!(sent.is_empty());
    for _ in 0..50 {
        let c = next_change(&mut edge.changes).await;
        assert_eq!(
            (&c.kind, c.action),
            (&ResourceType::Pod, ChangeAction::Upsert)
        );
    }
    assert_eq!(count_rows(&edge.db), 50);
    edge.stop().await;
}

#[tokio::test]
async fn failed_write_is_never_acked_and_a_later_version_is() {
    let pki = Pki::new().unwrap();
    let (cloud, _up, _m) = start_hub(&pki, test_hub_config()).await.unwrap();
    let edge = start_edge(&pki, &cloud, |db| {
        rusqlite::Connection::open(db)
            .unwrap()
            .execute_batch(
                "CREATE TRIGGER refuse BEFORE INSERT ON meta WHEN NEW.key = 'default/pod/bad'
                 BEGIN SELECT RAISE(ABORT, 'disk says no'); END;",
            )
            .unwrap();
    })
    .await;
    let mut acks = cloud.subscribe_acks(64);
    let bad = pod_msg(Operation::Insert, "bad", "uid-bad", 1);
    let good = pod_msg(Operation::Insert, "good", "uid-good", 1);
    cloud.send(NODE, bad.clone()).unwrap();
    cloud.send(NODE, good.clone()).unwrap();
    assert_eq!(next_ack(&mut acks).await.message.msg_id, good.header.id);
    // The cloud resends `bad` every 300 ms; every attempt fails to write, none is ACKed.
    let more = tokio::time::timeout(Duration::from_secs(2), acks.recv()).await;
    assert!(more.is_err(), "a failed write was ACKed: {more:?}");
    assert_eq!(row(&edge.db, "default/pod/bad"), None);
    assert_eq!(
        cloud.queue_len(NODE),
        Some(1),
        "bad is still awaiting its ACK"
    );

    // The disk recovers; the next version of the pod is written and ACKed.
    rusqlite::Connection::open(&edge.db)
        .unwrap()
        .execute_batch("DROP TRIGGER refuse")
        .unwrap();
    let bad2 = pod_msg(Operation::Update, "bad", "uid-bad", 2);
    cloud.send(NODE, bad2.clone()).unwrap();
    let ack = next_ack(&mut acks).await;
    assert_eq!(ack.message.msg_id, bad2.header.id);
    assert_eq!(
        row(&edge.db, "default/pod/bad").unwrap()["metadata"]["resourceVersion"],
        "2"
    );
    edge.stop().await;
}

#[tokio::test]
async fn redelivery_is_idempotent_and_never_rolls_back() {
    let pki = Pki::new().unwrap();
    let (cloud, _up, _m) = start_hub(&pki, test_hub_config()).await.unwrap();
    let mut edge = start_edge(&pki, &cloud, |_| {}).await;
    let mut acks = cloud.subscribe_acks(64);
    let v5 = pod_msg(Operation::Update, "web", "uid-1", 5);
    cloud.send(NODE, v5.clone()).unwrap();
    next_ack(&mut acks).await;
    let first = row(&edge.db, "default/pod/web").unwrap();
    // The very same message again (same msg_id), as after a lost ACK.
    cloud.send(NODE, v5.clone()).unwrap();
    assert_eq!(next_ack(&mut acks).await.message.msg_id, v5.header.id);
    assert_eq!(row(&edge.db, "default/pod/web").unwrap(), first);
    // An older version arriving late is acknowledged but does not overwrite the newer one.
    let v4 = pod_msg(Operation::Update, "web", "uid-1", 4);
    cloud.send(NODE, v4.clone()).unwrap();
    assert_eq!(next_ack(&mut acks).await.message.msg_id, v4.header.id);
    assert_eq!(
        row(&edge.db, "default/pod/web").unwrap()["metadata"]["resourceVersion"],
        "5"
    );
    assert_eq!(count_rows(&edge.db), 1);
    // edged saw the pod twice (both writes of v5), not the stale v4.
    assert_eq!(
        next_change(&mut edge.changes).await.object["metadata"]["resourceVersion"],
        "5"
    );
    assert_eq!(
        next_change(&mut edge.changes).await.object["metadata"]["resourceVersion"],
        "5"
    );
    assert!(edge.changes.try_recv().is_err());
    edge.stop().await;
}

#[tokio::test]
async fn pod_delete_with_another_uid_keeps_the_row() {
    let pki = Pki::new().unwrap();
    let (cloud, _up, _m) = start_hub(&pki, test_hub_config()).await.unwrap();
    let mut edge = start_edge(&pki, &cloud, |_| {}).await;
    let mut acks = cloud.subscribe_acks(64);
    cloud
        .send(NODE, pod_msg(Operation::Insert, "web", "uid-new", 7))
        .unwrap();
    next_ack(&mut acks).await;
    next_change(&mut edge.changes).await;

    // A delete for the previous incarnation (e.g. a late synccontroller delete).
    let old = pod_msg(Operation::Delete, "web", "uid-old", 6);
    cloud.send(NODE, old.clone()).unwrap();
    assert_eq!(next_ack(&mut acks).await.message.msg_id, old.header.id);
    assert_eq!(
        row(&edge.db, "default/pod/web").unwrap()["metadata"]["uid"],
        "uid-new"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), edge.changes.recv())
            .await
            .is_err(),
        "edged must not be told to delete the running incarnation"
    );

    let del = pod_msg(Operation::Delete, "web", "uid-new", 8);
    cloud.send(NODE, del.clone()).unwrap();
    assert_eq!(next_ack(&mut acks).await.message.msg_id, del.header.id);
    assert_eq!(row(&edge.db, "default/pod/web"), None);
    let c = next_change(&mut edge.changes).await;
    assert_eq!(
        (&c.kind, c.action),
        (&ResourceType::Pod, ChangeAction::Delete)
    );
    assert_eq!(c.object["metadata"]["uid"], "uid-new");
    edge.stop().await;
}

#[tokio::test]
async fn configmap_query_goes_to_the_cloud_and_the_reply_is_stored_and_acked() {
    let pki = Pki::new().unwrap();
    let (cloud, mut up, _m) = start_hub(&pki, test_hub_config()).await.unwrap();
    let edge = start_edge(&pki, &cloud, |_| {}).await;
    let mut acks = cloud.subscribe_acks(64);
    let client = edge.client.clone();
    let get = tokio::spawn(async move { client.get_configmap("default", "cfg").await });

    let query = next_upstream(&mut up, |m| m.route.operation == Operation::Query).await;
    assert_eq!(query.route.resource, "default/configmap/cfg");
    assert_eq!(query.route.source, "edged");
    assert_eq!(query.route.group, Group::Meta);
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cfg", "namespace": "default", "uid": "cm-1", "resourceVersion": "31"},
        "data": {"k": "v"}});
    let mut reply = Message::response_to(&query, cm.clone()).with_resource_version("31");
    reply.route.source = "edgecontroller".into();
    reply.route.group = Group::Resource;
    cloud.send(NODE, reply.clone()).unwrap();

    let got = tokio::time::timeout(WAIT, get)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(got, cm);
    // The reply carried an object: stored, then ACKed (KubeEdge's cloud waits for that ACK).
    let ack = next_ack(&mut acks).await;
    assert_eq!(ack.message.msg_id, reply.header.id);
    assert_eq!(row(&edge.db, "default/configmap/cfg").unwrap(), cm);
    edge.stop().await;
}

#[tokio::test]
async fn queries_are_answered_from_the_database_while_offline() {
    let pki = Pki::new().unwrap();
    let (cloud, _up, _m) = start_hub(&pki, test_hub_config()).await.unwrap();
    let edge = start_edge(&pki, &cloud, |_| {}).await;
    let mut acks = cloud.subscribe_acks(64);
    cloud
        .send(
            NODE,
            object_msg(Operation::Insert, "configmap", "cfg", "cm-1", 3),
        )
        .unwrap();
    cloud
        .send(NODE, pod_msg(Operation::Insert, "web", "uid-1", 4))
        .unwrap();
    next_ack(&mut acks).await;
    next_ack(&mut acks).await;

    cloud.shutdown();
    let deadline = tokio::time::Instant::now() + WAIT;
    while edge.hub.is_connected() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "edge never noticed the cloud is gone"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cm = edge.client.get_configmap("default", "cfg").await.unwrap();
    assert_eq!(cm["metadata"]["uid"], "cm-1");
    let pods = edge.client.list_pods().await.unwrap();
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0]["metadata"]["name"], "web");
    assert_eq!(
        edge.client.get_pod("default", "web").await.unwrap()["metadata"]["uid"],
        "uid-1"
    );
    assert!(matches!(
        edge.client.get_secret("default", "missing").await,
        Err(MetaError::NotFound { .. })
    ));
    let err = edge
        .client
        .update_lease(json!({"metadata": {"name": NODE, "namespace": "kube-node-lease"}}))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "failed to process remote: not connected");
    edge.stop().await;
}

#[tokio::test]
async fn inventory_lists_stored_objects_on_every_connect() {
    let pki = Pki::new().unwrap();
    let (cloud, mut up, _m) = start_hub(&pki, test_hub_config()).await.unwrap();
    let edge = start_edge(&pki, &cloud, |_| {}).await;
    let first = next_upstream(&mut up, Inventory::is_inventory).await;
    assert_eq!(first.route.resource, format!("default/inventory/{NODE}"));
    assert!(Inventory::from_message(&first).unwrap().objects.is_empty());

    let mut acks = cloud.subscribe_acks(64);
    cloud
        .send(NODE, pod_msg(Operation::Insert, "web", "uid-1", 40))
        .unwrap();
    cloud
        .send(
            NODE,
            object_msg(Operation::Insert, "secret", "s", "sec-1", 41),
        )
        .unwrap();
    next_ack(&mut acks).await;
    next_ack(&mut acks).await;

    // Reconnect: the new session gets the inventory of what the database now holds.
    assert!(cloud.disconnect(NODE));
    let second = next_upstream(&mut up, Inventory::is_inventory).await;
    let mut objects = Inventory::from_message(&second).unwrap().objects;
    objects.sort_by(|a, b| a.key.cmp(&b.key));
    let summary: Vec<_> = objects
        .iter()
        .map(|o| {
            (
                o.resource_type.as_str(),
                o.key.as_str(),
                o.uid.as_str(),
                o.resource_version.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("pod", "default/pod/web", "uid-1", "40"),
            ("secret", "default/secret/s", "sec-1", "41"),
        ]
    );
    edge.stop().await;
}

/// Runs the writer until it has reported `acks` durable writes, then SIGKILLs it. Returns the
/// highest acknowledged resourceVersion per pod slot.
fn write_then_kill(db: &Path, first_rv: u64, acks: usize) -> std::collections::HashMap<u64, u64> {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_metastore-crash-writer"))
        .arg(db)
        .arg(first_rv.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("writer starts");
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    let mut acked = std::collections::HashMap::new();
    for _ in 0..acks {
        let line = lines.next().expect("writer alive").expect("readable");
        let mut parts = line.split_whitespace().skip(1);
        let slot: u64 = parts.next().unwrap().parse().unwrap();
        let rv: u64 = parts.next().unwrap().parse().unwrap();
        let e = acked.entry(slot).or_insert(0);
        *e = (*e).max(rv);
    }
    // SIGKILL while the other writers are mid-transaction.
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "the writer was killed, not finished");
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("edgecore.db");
    let mut highest = std::collections::HashMap::<u64, u64>::new();
    let mut first_rv = 1;
    for round in 0..3 {
        let db2 = db.clone();
        let acked = tokio::task::spawn_blocking(move || write_then_kill(&db2, first_rv, 1500))
            .await
            .unwrap();
        for (slot, rv) in acked {
            let e = highest.entry(slot).or_insert(0);
            *e = (*e).max(rv);
        }
        first_rv += 1_000_000;

        // The database opens cleanly (WAL recovery) and passes its integrity check.
        let store = MetaStore::open(&db)
            .await
            .expect("database opens after kill -9");
        store.integrity_check().await.unwrap();
        let rows = store.list_type("pod").await.unwrap();
        for r in &rows {
            let v: Value = serde_json::from_str(&r.value)
                .unwrap_or_else(|e| panic!("round {round}: torn value at {}: {e}", r.key));
            let len = v["spec"]["paddingLength"].as_u64().unwrap() as usize;
            assert_eq!(
                v["spec"]["padding"].as_str().unwrap().len(),
                len,
                "{}",
                r.key
            );
            assert_eq!(
                r.key,
                format!("default/pod/{}", v["metadata"]["name"].as_str().unwrap())
            );
        }
        // Every acknowledged write is there, at least at the acknowledged version.
        for (slot, rv) in &highest {
            let key = format!("default/pod/p{slot}");
            let stored = rows
                .iter()
                .find(|r| r.key == key)
                .unwrap_or_else(|| panic!("round {round}: acknowledged {key} lost"));
            let v: Value = serde_json::from_str(&stored.value).unwrap();
            let stored_rv: u64 = v["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(
                stored_rv >= *rv,
                "round {round}: {key} rolled back from {rv} to {stored_rv}"
            );
        }
        store.close().await;
    }
    assert!(
        highest.len() >= 400,
        "writes cover the slots: {}",
        highest.len()
    );
}

/// The edgecore wiring (`edgecore::app`) from an `edgecore.yaml` with certificate files on
/// disk, against a real cloudhub.
#[tokio::test]
async fn edgecore_from_its_config_file_stores_and_acks_over_a_real_cloudhub() {
    let pki = Pki::new().unwrap();
    let (cloud, mut up, _m) = start_hub(&pki, test_hub_config()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cert = pki.node_cert("edge-app").unwrap();
    std::fs::write(d.join("ca.crt"), &pki.ca.cert.cert_pem).unwrap();
    std::fs::write(d.join("edge.crt"), &cert.cert_pem).unwrap();
    std::fs::write(d.join("edge.key"), &cert.key_pem).unwrap();
    let yaml = format!(
        "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\n\
         database:\n  dataSource: {db}\n\
         modules:\n  edgeHub:\n    heartbeat: 1\n    messageQPS: 0\n    tlsCaFile: {ca}\n    tlsCertFile: {crt}\n    tlsPrivateKeyFile: {key}\n\
         \x20   websocket:\n      server: {server}\n  edged:\n    enable: false\n    hostnameOverride: edge-app\n\
         \x20 deviceTwin:\n    dmiSockPath: {dmi}\n",
        db = d.join("var/edgecore.db").display(),
        dmi = d.display(),
        ca = d.join("ca.crt").display(),
        crt = d.join("edge.crt").display(),
        key = d.join("edge.key").display(),
        server = cloud.local_addr(),
    );
    let path = d.join("edgecore.yaml");
    std::fs::write(&path, yaml).unwrap();
    let config = edgecore::config::EdgeCoreConfig::load(&path).unwrap();
    let mut edge = edgecore::app::EdgeCore::start(&config).await.unwrap();
    let (_client, mut changes) = edge.edged_link().unwrap();

    // It connects as edge-app, advertising the inventory capability, and sends its inventory.
    let inv = next_upstream(&mut up, Inventory::is_inventory).await;
    assert_eq!(inv.route.resource, "default/inventory/edge-app");
    assert!(cloud.capabilities("edge-app").unwrap().inventory_resync);

    let mut acks = cloud.subscribe_acks(8);
    let mut pod = pod_msg(Operation::Insert, "web", "uid-app", 9);
    pod.route.resource = "default/pod/web".into();
    cloud.send("edge-app", pod.clone()).unwrap();
    assert_eq!(next_ack(&mut acks).await.message.msg_id, pod.header.id);
    assert_eq!(
        row(&d.join("var/edgecore.db"), "default/pod/web").unwrap()["metadata"]["uid"],
        "uid-app"
    );
    assert_eq!(next_change(&mut changes).await.key, "default/pod/web");
    edge.shutdown().await;
}
