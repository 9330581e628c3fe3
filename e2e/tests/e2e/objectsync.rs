//! ObjectSync records for KubeEdge edges (RawEdge without capabilities speaks like a KubeEdge
//! edgecore), their use on reconnect, orphan cleanup by the Lease holder, several cloudcore
//! replicas on one cluster, and the Lease election itself. In-memory API server only: the tests
//! install cluster-wide CRDs and would share a real cluster's Lease.

use cloudcore::controller::OBJECTSYNC_LEASE_NAME as LEASE_NAME;
use cloudcore::leader::{self, ElectionConfig};
use e2e::apiserver::Config;
use e2e::channel::Pki;
use e2e::cloud::{CloudFixture, test_sync_options};
use e2e::cluster::{self, TestCluster};
use e2e::reliablesyncs::{self, StoredRecord};
use e2e::sim_edge::{SimEdge, WAIT, edge_node, poll, unique};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kubeedge_shared::constants::CAPABILITY_INVENTORY;
use kubeedge_shared::{Group, Message, Operation};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

async fn cluster(what: &str) -> Option<(TestCluster, String)> {
    let c = cluster::connect_installing_crds(Config::for_tests(), what)
        .await
        .expect("cluster")?;
    let ns = c.temp_namespace("osync").await.expect("namespace");
    Some((c, ns))
}

async fn create_pod(c: &TestCluster, ns: &str, name: &str, node: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(c.client(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod")
}

async fn force_delete_pod(c: &TestCluster, ns: &str, name: &str) {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    Api::<Pod>::namespaced(c.client(), ns)
        .delete(name, &dp)
        .await
        .expect("delete pod");
}

async fn relabel_pod(c: &TestCluster, ns: &str, name: &str, v: &str) -> Pod {
    let patch = json!({"metadata": {"labels": {"v": v}}});
    Api::<Pod>::namespaced(c.client(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch pod")
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

fn rv(pod: &Pod) -> String {
    pod.metadata.resource_version.clone().unwrap_or_default()
}

/// Polls the stored records until `ok` holds for them; returns them.
async fn records_until(
    c: &TestCluster,
    what: &str,
    ok: impl Fn(&BTreeMap<String, StoredRecord>) -> bool,
) -> BTreeMap<String, StoredRecord> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let r = reliablesyncs::list(&c.client())
            .await
            .expect("list records");
        if ok(&r) {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for records: {what}; have {r:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn has_rv(r: &BTreeMap<String, StoredRecord>, name: &str, rv: &str) -> bool {
    r.get(name).is_some_and(|s| s.object_rv == rv)
}

async fn start(c: &TestCluster, pki: &Pki, ns: &str) -> CloudFixture {
    CloudFixture::start_with(c.client(), pki, test_sync_options(ns))
        .await
        .expect("cloudcore")
}

#[tokio::test]
async fn acked_deliveries_to_a_kubeedge_edge_are_recorded_and_deletes_remove_the_record() {
    let Some((c, ns)) = cluster("ObjectSync records").await else {
        return;
    };
    reliablesyncs::install(&c.client()).await.unwrap();
    let pki = Pki::new().unwrap();
    let fx = start(&c, &pki, &ns).await;
    let node = unique("ke");
    edge_node(&c, &node).await;
    let mut edge = SimEdge::connect(&fx, &pki, &node, &[]).await;

    let pod = create_pod(&c, &ns, "web", &node).await;
    let resource = format!("{ns}/pod/web");
    edge.expect(Operation::Insert, &resource).await;
    let name = format!("{node}.{}", uid(&pod));
    let r = records_until(&c, "pod record", |r| has_rv(r, &name, &rv(&pod))).await;
    assert_eq!(
        r[&name],
        StoredRecord {
            namespace: Some(ns.clone()),
            api_version: "v1".into(),
            kind: "Pod".into(),
            object_name: "web".into(),
            object_rv: rv(&pod),
        }
    );

    // An update raises the recorded version.
    let pod2 = relabel_pod(&c, &ns, "web", "2").await;
    edge.expect(Operation::Update, &resource).await;
    records_until(&c, "updated version", |r| has_rv(r, &name, &rv(&pod2))).await;

    // An ACKed query response carrying an object is recorded too.
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"k": "v"}})).unwrap();
    let cm = Api::<ConfigMap>::namespaced(c.client(), &ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    // (A pod of this node uses it: an edge may only read what its pods use.)
    let user: Pod = serde_json::from_value(json!({
        "metadata": {"name": "user"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}],
            "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(c.client(), &ns)
        .create(&PostParams::default(), &user)
        .await
        .unwrap();
    edge.expect(Operation::Insert, &format!("{ns}/pod/user"))
        .await;
    let query = Message::new(
        "edged",
        Group::Meta,
        Operation::Query,
        format!("{ns}/configmap/cfg"),
        serde_json::Value::Null,
    );
    edge.raw.send(&query).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let m = edge.next(left).await.expect("query reply");
        if m.header.parent_id == query.header.id {
            assert!(m.requires_ack(), "{m:?}");
            break;
        }
    }
    let cm_name = format!("{node}.{}", cm.metadata.uid.clone().unwrap());
    let r = records_until(&c, "configmap record", |r| r.contains_key(&cm_name)).await;
    assert_eq!(r[&cm_name].kind, "ConfigMap");
    assert_eq!(
        Some(r[&cm_name].object_rv.clone()),
        cm.metadata.resource_version
    );

    // Delete: the ACK of the delete removes the record.
    force_delete_pod(&c, &ns, "web").await;
    edge.expect(Operation::Delete, &resource).await;
    records_until(&c, "pod record removed", |r| !r.contains_key(&name)).await;
}

#[tokio::test]
async fn kubeedge_edge_gets_offline_deletes_and_updates_after_reconnect_and_nothing_it_has() {
    let Some((c, ns)) = cluster("resync from records").await else {
        return;
    };
    reliablesyncs::install(&c.client()).await.unwrap();
    let pki = Pki::new().unwrap();
    let fx = start(&c, &pki, &ns).await;
    let node = unique("ke");
    edge_node(&c, &node).await;
    let mut edge = SimEdge::connect(&fx, &pki, &node, &[]).await;
    let mut pods = BTreeMap::new();
    for name in ["gone", "changed", "same"] {
        let p = create_pod(&c, &ns, name, &node).await;
        edge.expect(Operation::Insert, &format!("{ns}/pod/{name}"))
            .await;
        pods.insert(name, p);
    }
    let rec = |name: &str| format!("{node}.{}", uid(&pods[name]));
    records_until(&c, "three records", |r| {
        pods.keys().all(|p| has_rv(r, &rec(p), &rv(&pods[p])))
    })
    .await;

    // Offline: one pod deleted, one updated.
    drop(edge);
    poll(|| async { !fx.hub.is_connected(&node) }, "disconnect").await;
    force_delete_pod(&c, &ns, "gone").await;
    let changed = relabel_pod(&c, &ns, "changed", "offline").await;

    let mut edge = SimEdge::connect(&fx, &pki, &node, &[]).await;
    let got = edge
        .expect_all(&[
            (Operation::Delete, format!("{ns}/pod/gone")),
            (Operation::Update, format!("{ns}/pod/changed")),
        ])
        .await;
    let (del, upd) = (&got[0], &got[1]);
    assert_eq!(del.content["metadata"]["uid"], json!(uid(&pods["gone"])));
    assert_eq!(del.content["metadata"]["name"], "gone");
    assert_eq!(upd.content["metadata"]["labels"]["v"], "offline");
    records_until(&c, "deleted record gone, updated one raised", |r| {
        !r.contains_key(&rec("gone")) && has_rv(r, &rec("changed"), &rv(&changed))
    })
    .await;
    // The unchanged pod is not sent again, not on connect and not by the periodic comparison.
    let later = edge.drain(Duration::from_millis(1500)).await;
    assert!(
        later
            .iter()
            .all(|m| m.route.resource != format!("{ns}/pod/same")),
        "{later:?}"
    );
}

#[tokio::test]
async fn kubeedge_edge_offline_during_a_restart_of_cloudcore_gets_the_delete() {
    let Some((c, ns)) = cluster("records survive cloudcore").await else {
        return;
    };
    reliablesyncs::install(&c.client()).await.unwrap();
    let pki = Pki::new().unwrap();
    let node = unique("ke");
    edge_node(&c, &node).await;
    let fx = start(&c, &pki, &ns).await;
    let mut edge = SimEdge::connect(&fx, &pki, &node, &[]).await;
    let pod = create_pod(&c, &ns, "web", &node).await;
    edge.expect(Operation::Insert, &format!("{ns}/pod/web"))
        .await;
    let name = format!("{node}.{}", uid(&pod));
    records_until(&c, "record", |r| has_rv(r, &name, &rv(&pod))).await;
    drop(edge);
    fx.stop();
    drop(fx);
    // Deleted while no cloudcore knew the pod: only the record remembers the edge has it.
    force_delete_pod(&c, &ns, "web").await;
    let fx = start(&c, &pki, &ns).await;
    let mut edge = SimEdge::connect(&fx, &pki, &node, &[]).await;
    let del = edge
        .expect(Operation::Delete, &format!("{ns}/pod/web"))
        .await;
    assert_eq!(del.content["metadata"]["uid"], json!(uid(&pod)));
    records_until(&c, "record removed", |r| !r.contains_key(&name)).await;
}

#[tokio::test]
async fn edges_with_their_own_inventory_cause_no_records() {
    let Some((c, ns)) = cluster("no records for inventory edges").await else {
        return;
    };
    reliablesyncs::install(&c.client()).await.unwrap();
    let pki = Pki::new().unwrap();
    let fx = start(&c, &pki, &ns).await;
    let (ours, theirs) = (unique("rs"), unique("ke"));
    edge_node(&c, &ours).await;
    edge_node(&c, &theirs).await;
    let mut our_edge = SimEdge::connect(&fx, &pki, &ours, &[CAPABILITY_INVENTORY]).await;
    let mut kubeedge = SimEdge::connect(&fx, &pki, &theirs, &[]).await;
    let a = create_pod(&c, &ns, "a", &ours).await;
    our_edge
        .expect(Operation::Insert, &format!("{ns}/pod/a"))
        .await;
    relabel_pod(&c, &ns, "a", "2").await;
    our_edge
        .expect(Operation::Update, &format!("{ns}/pod/a"))
        .await;
    // ACK reports are handled in order: once the KubeEdge edge's later ACK is recorded, ours
    // have been seen.
    let b = create_pod(&c, &ns, "b", &theirs).await;
    kubeedge
        .expect(Operation::Insert, &format!("{ns}/pod/b"))
        .await;
    let r = records_until(&c, "KubeEdge edge's record", |r| {
        r.contains_key(&format!("{theirs}.{}", uid(&b)))
    })
    .await;
    assert_eq!(r.len(), 1, "{r:#?}");
    assert!(!r.contains_key(&format!("{ours}.{}", uid(&a))));
}

#[tokio::test]
async fn records_of_deleted_nodes_are_removed_by_the_leader() {
    let Some((c, ns)) = cluster("orphan cleanup").await else {
        return;
    };
    reliablesyncs::install(&c.client()).await.unwrap();
    // A record left behind by a node deleted while no cloudcore ran.
    let ghost = "ghost-node.0000-dead";
    create_record(&c, &ns, ghost).await;
    let pki = Pki::new().unwrap();
    let fx = start(&c, &pki, &ns).await;
    records_until(&c, "start-up sweep", |r| !r.contains_key(ghost)).await;

    let node = unique("ke");
    edge_node(&c, &node).await;
    let mut edge = SimEdge::connect(&fx, &pki, &node, &[]).await;
    let pod = create_pod(&c, &ns, "web", &node).await;
    edge.expect(Operation::Insert, &format!("{ns}/pod/web"))
        .await;
    let name = format!("{node}.{}", uid(&pod));
    records_until(&c, "record", |r| r.contains_key(&name)).await;
    Api::<Node>::all(c.client())
        .delete(&node, &DeleteParams::default())
        .await
        .unwrap();
    records_until(&c, "node's records removed", |r| !r.contains_key(&name)).await;
}

async fn create_record(c: &TestCluster, ns: &str, name: &str) {
    let ar = cloudcore::controller::Kind::ObjectSync.api_resource();
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(c.client(), ns, &ar);
    let obj = kube::api::DynamicObject::new(name, &ar).data(json!({
        "spec": {"objectAPIVersion": "v1", "objectKind": "Pod", "objectName": "old"}
    }));
    api.create(&PostParams::default(), &obj).await.unwrap();
}

async fn lease_holder(c: &TestCluster, ns: &str) -> Option<String> {
    Api::<Lease>::namespaced(c.client(), ns)
        .get_opt(LEASE_NAME)
        .await
        .unwrap()
        .and_then(|l| l.spec?.holder_identity)
}

#[tokio::test]
async fn two_replicas_serve_their_own_edges_once_and_one_leads() {
    let Some((c, ns)) = cluster("two cloudcore replicas").await else {
        return;
    };
    reliablesyncs::install(&c.client()).await.unwrap();
    let pki = Pki::new().unwrap();
    let (opts_a, opts_b) = (test_sync_options(&ns), test_sync_options(&ns));
    let ids = [
        opts_a.election.identity.clone(),
        opts_b.election.identity.clone(),
    ];
    let a = CloudFixture::start_with(c.client(), &pki, opts_a)
        .await
        .unwrap();
    let b = CloudFixture::start_with(c.client(), &pki, opts_b)
        .await
        .unwrap();
    let (n1, n2) = (unique("ke-a"), unique("ke-b"));
    edge_node(&c, &n1).await;
    edge_node(&c, &n2).await;
    let mut e1 = SimEdge::connect(&a, &pki, &n1, &[]).await;
    let mut e2 = SimEdge::connect(&b, &pki, &n2, &[]).await;
    assert!(!a.hub.is_connected(&n2) && !b.hub.is_connected(&n1));
    let p1 = create_pod(&c, &ns, "p1", &n1).await;
    let p2 = create_pod(&c, &ns, "p2", &n2).await;
    let (r1, r2) = (format!("{n1}.{}", uid(&p1)), format!("{n2}.{}", uid(&p2)));
    // Each pod reaches its node exactly once (also across periodic comparisons).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let (mut seen1, mut seen2) = (Vec::new(), Vec::new());
    while tokio::time::Instant::now() < deadline {
        seen1.extend(e1.drain(Duration::from_millis(200)).await);
        seen2.extend(e2.drain(Duration::from_millis(200)).await);
    }
    let count = |seen: &[Message], r: &str| {
        seen.iter()
            .filter(|m| m.route.resource == r && m.route.operation != Operation::Delete)
            .count()
    };
    assert_eq!(count(&seen1, &format!("{ns}/pod/p1")), 1, "{seen1:?}");
    assert_eq!(count(&seen2, &format!("{ns}/pod/p2")), 1, "{seen2:?}");
    assert!(seen1.iter().all(|m| !m.route.resource.ends_with("/p2")));
    assert!(seen2.iter().all(|m| !m.route.resource.ends_with("/p1")));
    records_until(&c, "both records", |r| {
        has_rv(r, &r1, &rv(&p1)) && has_rv(r, &r2, &rv(&p2))
    })
    .await;

    // Exactly one replica holds the Lease.
    let deadline = tokio::time::Instant::now() + WAIT;
    let leader = loop {
        match lease_holder(&c, &ns).await {
            Some(h) if ids.contains(&h) => break h,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "no replica leads: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (stopped, survivor, survivor_id, survivor_edge) = if leader == ids[0] {
        (a, b, ids[1].clone(), (&mut e2, &n2))
    } else {
        (b, a, ids[0].clone(), (&mut e1, &n1))
    };
    // Stopping the leader hands the Lease to the other, which then does the leader's work.
    stopped.stop();
    poll(
        || async { lease_holder(&c, &ns).await.as_deref() == Some(survivor_id.as_str()) },
        "survivor takes the lease",
    )
    .await;
    let orphan_node = if survivor_edge.1 == &n1 { &n2 } else { &n1 };
    let orphan_record = if orphan_node == &n1 { &r1 } else { &r2 };
    Api::<Node>::all(c.client())
        .delete(orphan_node, &DeleteParams::default())
        .await
        .unwrap();
    records_until(&c, "new leader removes the deleted node's records", |r| {
        !r.contains_key(orphan_record.as_str())
    })
    .await;
    // The survivor's own edge is still served.
    let p3 = create_pod(&c, &ns, "p3", survivor_edge.1).await;
    survivor_edge
        .0
        .expect(Operation::Insert, &format!("{ns}/pod/p3"))
        .await;
    assert!(survivor.hub.is_connected(survivor_edge.1));
    let _ = p3;
}

#[tokio::test]
async fn without_the_crds_cloudcore_is_ready_and_records_once_they_are_installed() {
    let Some((c, ns)) = cluster("CRDs installed late").await else {
        return;
    };
    let pki = Pki::new().unwrap();
    let fx = start(&c, &pki, &ns).await;
    assert!(fx.ready.is_ready());
    let node = unique("ke");
    edge_node(&c, &node).await;
    let mut edge = SimEdge::connect(&fx, &pki, &node, &[]).await;
    create_pod(&c, &ns, "early", &node).await;
    edge.expect(Operation::Insert, &format!("{ns}/pod/early"))
        .await;
    reliablesyncs::install(&c.client()).await.unwrap();
    // Once the records are listed, deliveries are recorded (the periodic comparison also
    // resends what has no record yet, so even the early pod ends up recorded).
    let late = create_pod(&c, &ns, "late", &node).await;
    let name = format!("{node}.{}", uid(&late));
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        edge.drain(Duration::from_millis(200)).await;
        let r = reliablesyncs::list(&c.client()).await.unwrap();
        if r.contains_key(&name) && r.values().any(|s| s.object_name == "early") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "records: {r:#?}");
    }
}

fn election(ns: &str, id: &str) -> ElectionConfig {
    ElectionConfig {
        namespace: ns.into(),
        name: "test-election".into(),
        identity: id.into(),
        // Longer than WAIT: within a test, only a release (or the ghost's own 2 s record)
        // lets another candidate in.
        lease_duration: Duration::from_secs(30),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(100),
    }
}

#[tokio::test]
async fn lease_election_one_leader_at_a_time_takeover_on_release_and_on_expiry() {
    let Some((c, ns)) = cluster("lease election").await else {
        return;
    };
    // A Lease held by a replica that vanished without releasing it.
    let leases: Api<Lease> = Api::namespaced(c.client(), &ns);
    let ghost: Lease = serde_json::from_value(json!({
        "metadata": {"name": "test-election"},
        "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": 2,
                 "renewTime": "2020-01-01T00:00:00.000000Z"}
    }))
    .unwrap();
    leases.create(&PostParams::default(), &ghost).await.unwrap();
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let t0 = tokio::time::Instant::now();
    let la = leader::spawn(c.client(), election(&ns, "a"), stop_a.clone());
    let lb = leader::spawn(c.client(), election(&ns, "b"), stop_b.clone());
    // Expiry is judged on the candidates' own clocks (from when they first saw the record),
    // not on the stale renewTime: nobody takes over before 2 s.
    poll(
        || async { la.is_leader() || lb.is_leader() },
        "a leader after expiry",
    )
    .await;
    assert!(
        t0.elapsed() >= Duration::from_secs(2),
        "took over an unexpired lease after {:?}",
        t0.elapsed()
    );
    assert!(!(la.is_leader() && lb.is_leader()), "two leaders");
    let (first, first_stop, second, second_id) = if la.is_leader() {
        (la, stop_a.clone(), lb, "b")
    } else {
        (lb, stop_b.clone(), la, "a")
    };
    let transitions = |l: &Lease| l.spec.as_ref().and_then(|s| s.lease_transitions);
    let before = leases.get("test-election").await.unwrap();
    assert_eq!(transitions(&before), Some(1), "ghost → first");
    // The leader keeps renewing (renewTime moves, acquireTime stays); the other follows.
    let renew = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
    let acquire = |l: &Lease| l.spec.as_ref().and_then(|s| s.acquire_time.clone());
    poll(
        || async {
            let now = leases.get("test-election").await.unwrap();
            renew(&now) > renew(&before) && acquire(&now) == acquire(&before)
        },
        "renewals",
    )
    .await;
    assert!(first.is_leader() && !second.is_leader());
    // Stopping releases: the other takes over well before the 30 s expiry.
    first_stop.cancel();
    poll(|| async { second.is_leader() }, "takeover after release").await;
    let after = leases.get("test-election").await.unwrap();
    assert_eq!(
        after.spec.as_ref().and_then(|s| s.holder_identity.clone()),
        Some(second_id.to_string())
    );
    assert!(!first.is_leader());
    stop_a.cancel();
    stop_b.cancel();
}

/// A restarting cloudcore whose pod list arrives before its node list passes the node's pods
/// over (the node is not known as an edge node yet). They must be listed again once the pod
/// list is complete: otherwise a pod deleted gracefully meanwhile is never sent to its edge,
/// which (holding no copy, or told by its records to drop the old one) never asks for its
/// deletion — the pod stays `Terminating` for ever.
#[tokio::test]
async fn pods_listed_before_their_edge_node_reach_the_edge_after_a_restart() {
    use cloudcore::cloudhub::Capabilities;
    use cloudcore::cloudhub::CloudHub;
    use cloudcore::controller::{Downstream, DownstreamInput as Input, spawn_fetcher};
    use cloudcore::http::Readiness;
    use cloudcore::metrics::HubMetrics;
    use e2e::channel::{RawEdge, test_hub_config};
    use k8s_openapi::api::core::v1::Secret;
    use kube::runtime::watcher::Event;

    let Some((c, ns)) = cluster("downstream start-up order").await else {
        return;
    };
    let node = unique("ke-order");
    edge_node(&c, &node).await;
    create_pod(&c, &ns, "late", &node).await;
    // Deleted gracefully while no cloudcore serves the edge: it stays terminating.
    let pods = Api::<Pod>::namespaced(c.client(), &ns);
    pods.delete("late", &DeleteParams::default())
        .await
        .expect("graceful delete");
    let pod = pods.get("late").await.expect("terminating pod");
    assert!(pod.metadata.deletion_timestamp.is_some());
    let node_obj = Api::<Node>::all(c.client()).get(&node).await.expect("node");

    let pki = Pki::new().unwrap();
    // The raw edge sends no keepalives.
    let mut hub_config = test_hub_config();
    hub_config.keepalive_interval = Duration::from_secs(120);
    let (hub, _upstream) =
        CloudHub::bind(hub_config, pki.server_tls().unwrap(), HubMetrics::default())
            .await
            .expect("hub");
    let (tx, mut feedback) = tokio::sync::mpsc::channel(16);
    let (fetch_tx, fetch_rx) = tokio::sync::mpsc::unbounded_channel();
    let stop = tokio_util::sync::CancellationToken::new();
    let _fetcher = spawn_fetcher(c.client(), fetch_rx, tx, stop.clone());
    let ready = Readiness::default();
    let mut ds = Downstream::new(std::sync::Arc::new(hub.clone()), ready.clone(), fetch_tx);
    // The watchers' first lists, pods before nodes.
    ds.apply(Input::Pod(Event::Init));
    ds.apply(Input::Pod(Event::InitApply(pod.clone())));
    ds.apply(Input::Node(Event::Init));
    ds.apply(Input::Node(Event::InitApply(node_obj)));
    ds.apply(Input::Pod(Event::InitDone));
    ds.apply(Input::Node(Event::InitDone));
    ds.apply(Input::ConfigMap(Event::<ConfigMap>::Init));
    ds.apply(Input::ConfigMap(Event::<ConfigMap>::InitDone));
    ds.apply(Input::Secret(Event::<Secret>::Init));
    ds.apply(Input::Secret(Event::<Secret>::InitDone));
    assert!(ready.is_ready());
    // What the run loop does with fed-back inputs.
    while let Ok(Some(input)) = tokio::time::timeout(Duration::from_secs(2), feedback.recv()).await
    {
        ds.apply(input);
    }

    // The KubeEdge edge connects (no records: it is sent everything it should hold).
    let tls = pki.edge_tls(&pki.node_cert(&node).unwrap()).unwrap();
    let mut edge = RawEdge::connect(hub.local_addr(), &node, tls)
        .await
        .expect("edge connects");
    poll(|| async { hub.is_connected(&node) }, "edge session").await;
    ds.apply(Input::Connected {
        node: node.clone(),
        capabilities: Capabilities::default(),
    });
    // The resync fetches the pods it sends: feed the answers back as the run loop does.
    while let Ok(Some(input)) = tokio::time::timeout(Duration::from_secs(2), feedback.recv()).await
    {
        ds.apply(input);
    }
    let resource = format!("{ns}/pod/late");
    let deadline = tokio::time::Instant::now() + WAIT;
    let first_update = loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let m = edge
            .recv(left.max(Duration::from_millis(1)))
            .await
            .expect("edge link")
            .unwrap_or_else(|| panic!("{resource} never sent to the edge"));
        if m.route.resource == resource {
            assert_eq!(m.route.operation, Operation::Update);
            assert!(
                !m.content["metadata"]["deletionTimestamp"].is_null(),
                "sent without its deletionTimestamp: {}",
                m.content
            );
            assert_eq!(m.content["metadata"]["uid"], json!(uid(&pod)));
            // Acknowledged, as an edge does; copies sent again before the ACK arrived are
            // not new messages.
            edge.ack(&m).await.expect("ack");
            break m.header.id.clone();
        }
    };

    // The pod goes; a node's pod list that answers after the delete event (a stale copy)
    // must not bring it back: the next resync sends the edge nothing about it but the delete.
    ds.apply(Input::Pod(Event::Delete(pod.clone())));
    ds.apply(Input::Pod(Event::Apply(pod.clone())));
    ds.apply(Input::Connected {
        node: node.clone(),
        capabilities: Capabilities::default(),
    });
    while let Ok(Some(input)) = tokio::time::timeout(Duration::from_secs(1), feedback.recv()).await
    {
        ds.apply(input);
    }
    let mut about = Vec::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        match edge.recv(left).await.expect("edge link") {
            Some(m) if m.route.resource == resource && m.header.id != first_update => {
                about.push(m.route.operation.clone())
            }
            Some(_) => {}
            None => break,
        }
    }
    assert!(
        about.contains(&Operation::Delete)
            && !about
                .iter()
                .any(|o| matches!(o, Operation::Insert | Operation::Update)),
        "after the delete: {about:?}"
    );
    stop.cancel();
    hub.shutdown();
}
