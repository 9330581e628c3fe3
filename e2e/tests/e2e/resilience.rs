//! cloudcore under disruption: a restart while the cluster changes, watches expiring with
//! 410 Gone, and the service cache that answers edge queries. Simulated edges keep a model of
//! what their database would hold (the way edgecore's metamanager applies messages) and send
//! it as their inventory, like edgecore does (`edgecore/INVENTORY.md`).
//!
//! Runs against the in-memory apiserver or a real cluster (`E2E_KUBECONFIG`); only the test
//! that forces 410s needs the in-memory server and skips otherwise.

use e2e::apiserver::Config;
use e2e::channel::{Pki, RawEdge};
use e2e::cloud::CloudFixture;
use e2e::cluster;
use e2e::sim_edge::{WAIT, delete_node, dial, edge_node, unique};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kubeedge_shared::constants::CAPABILITY_INVENTORY;
use kubeedge_shared::inventory::{Inventory, InventoryEntry};
use kubeedge_shared::{Group, Message, Operation};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How long an edge listens after converging, to catch duplicates or late extras.
const QUIET: Duration = Duration::from_millis(1000);

fn pod(name: &str, node: &str, configmap: Option<&str>) -> Pod {
    let mut p = json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox",
            "ports": [{"containerPort": 8080, "name": "http"}]}]}
    });
    if let Some(cm) = configmap {
        p["spec"]["volumes"] = json!([{"name": "cfg", "configMap": {"name": cm}}]);
    }
    serde_json::from_value(p).unwrap()
}

fn configmap(name: &str, v: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": v}})).unwrap()
}

fn now_gone() -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    }
}

async fn label(api: &Api<Pod>, name: &str, value: &str) -> Pod {
    let patch = json!({"metadata": {"labels": {"changed": value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("label pod")
}

/// One object the simulated edge database holds.
#[derive(Debug, Clone)]
struct Held {
    ty: String,
    uid: String,
    rv: String,
    object: Value,
}

/// A simulated edge: applies downstream messages to its database model like metamanager does,
/// ACKs them, and logs every downstream operation it received since its last (re)connect.
struct ModelEdge {
    raw: RawEdge,
    node: String,
    inventory: bool,
    held: BTreeMap<String, Held>,
    /// Distinct downstream messages since the last (re)connect: a resend of an unACKed
    /// message carries the same id and is not counted twice.
    log: Vec<(Operation, String)>,
    seen_ids: BTreeSet<String>,
}

impl ModelEdge {
    /// Connects to `fx`; an inventory edge then reports what it holds.
    async fn connect(fx: &CloudFixture, pki: &Pki, node: &str, inventory: bool) -> ModelEdge {
        let mut e = ModelEdge {
            raw: dial(fx, pki, node, caps(inventory)).await,
            node: node.to_string(),
            inventory,
            held: BTreeMap::new(),
            log: Vec::new(),
            seen_ids: BTreeSet::new(),
        };
        e.send_inventory().await;
        e
    }

    /// The same edge (same database) connecting to another cloudcore.
    async fn reconnect(&mut self, fx: &CloudFixture, pki: &Pki) {
        self.raw = dial(fx, pki, &self.node, caps(self.inventory)).await;
        self.log.clear();
        self.seen_ids.clear();
        self.send_inventory().await;
    }

    async fn send_inventory(&mut self) {
        if !self.inventory {
            return;
        }
        let inv = Inventory {
            objects: self
                .held
                .iter()
                .map(|(key, h)| InventoryEntry {
                    resource_type: h.ty.clone(),
                    key: key.clone(),
                    uid: h.uid.clone(),
                    resource_version: h.rv.clone(),
                })
                .collect(),
        };
        self.raw
            .send(&inv.to_message(&self.node))
            .await
            .expect("inventory sent");
    }

    /// Applies one downstream message as metamanager would.
    fn apply(&mut self, m: &Message) {
        let key = m.route.resource.clone();
        let ty = m.resource_type().unwrap_or_default().to_string();
        let uid = m.content["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let first_time = self.seen_ids.insert(m.header.id.clone());
        match m.route.operation {
            Operation::Insert | Operation::Update => {
                if first_time {
                    self.log.push((m.route.operation.clone(), key.clone()));
                }
                let rv = m.content["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                self.held.insert(
                    key,
                    Held {
                        ty,
                        uid,
                        rv,
                        object: m.content.clone(),
                    },
                );
            }
            Operation::Delete => {
                if first_time {
                    self.log.push((Operation::Delete, key.clone()));
                }
                // A pod row goes only when the delete names its UID.
                if self
                    .held
                    .get(&key)
                    .is_some_and(|h| uid.is_empty() || h.uid == uid)
                {
                    self.held.remove(&key);
                }
            }
            _ => {}
        }
    }

    /// Receives (and ACKs and applies) for up to `d`.
    async fn pump(&mut self, d: Duration) {
        let deadline = tokio::time::Instant::now() + d;
        self.raw.keepalive().await.expect("connection open");
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return;
            }
            let Some(m) = self.raw.recv(left).await.expect("connection open") else {
                return;
            };
            if m.requires_ack() {
                self.raw.ack(&m).await.expect("ack sent");
            }
            self.apply(&m);
        }
    }

    /// Pumps until `done` holds; panics with `what` and the model after `WAIT`.
    async fn until(&mut self, what: &str, done: impl Fn(&ModelEdge) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !done(self) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: {what} did not happen; holds {:#?}; received {:?}",
                self.node,
                self.held.keys().collect::<Vec<_>>(),
                self.log
            );
            self.pump(Duration::from_millis(100)).await;
        }
    }

    /// An edged-style `query`; a reply carrying an object is stored like metamanager does.
    async fn query(&mut self, resource: &str) -> Message {
        let q = Message::new(
            "edged",
            Group::Meta,
            Operation::Query,
            resource,
            Value::Null,
        );
        self.raw.send(&q).await.expect("query sent");
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let m = self
                .raw
                .recv(left)
                .await
                .expect("connection open")
                .unwrap_or_else(|| panic!("no reply to the query for {resource}"));
            if m.requires_ack() {
                self.raw.ack(&m).await.expect("ack sent");
            }
            if m.header.parent_id != q.header.id {
                self.apply(&m);
                continue;
            }
            if m.content["metadata"]["uid"].is_string() {
                let h = Held {
                    ty: m.resource_type().unwrap_or_default().to_string(),
                    uid: m.content["metadata"]["uid"].as_str().unwrap().to_string(),
                    rv: m.header.resource_version.clone(),
                    object: m.content.clone(),
                };
                self.held.insert(resource.to_string(), h);
            }
            return m;
        }
    }

    fn pods(&self) -> BTreeSet<String> {
        self.held
            .iter()
            .filter(|(_, h)| h.ty == "pod")
            .map(|(_, h)| {
                h.object["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    }

    fn object(&self, key: &str) -> Option<&Value> {
        self.held.get(key).map(|h| &h.object)
    }

    /// How many `op`s for `key` arrived since the last (re)connect.
    fn count(&self, op: Operation, key: &str) -> usize {
        self.log
            .iter()
            .filter(|(o, k)| *o == op && k == key)
            .count()
    }
}

fn caps(inventory: bool) -> &'static [&'static str] {
    if inventory {
        &[CAPABILITY_INVENTORY]
    } else {
        &[]
    }
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

#[tokio::test]
async fn cloudcore_restart_converges_edges_to_the_changes_made_while_it_was_down() {
    let cluster = cluster::connect().await.expect("cluster");
    let ns = cluster.temp_namespace("restart").await.unwrap();
    let pki = Pki::new().unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client(), &ns);
    let (rs_node, ke_node) = (unique("edge-rs"), unique("edge-ke"));
    edge_node(&cluster, &rs_node).await;
    edge_node(&cluster, &ke_node).await;
    cms.create(&PostParams::default(), &configmap("cfg", "1"))
        .await
        .unwrap();

    let fx = CloudFixture::start(cluster.client(), &pki).await.unwrap();
    // A kubeedge-rs edge (inventory) and a KubeEdge edge (none), three pods each.
    let mut rs = ModelEdge::connect(&fx, &pki, &rs_node, true).await;
    let mut ke = ModelEdge::connect(&fx, &pki, &ke_node, false).await;
    for (node, suffix) in [(&rs_node, ""), (&ke_node, "-ke")] {
        for n in ["a", "b"] {
            pods.create(
                &PostParams::default(),
                &pod(&format!("{n}{suffix}"), node, None),
            )
            .await
            .unwrap();
        }
        let same = format!("same{suffix}");
        pods.create(&PostParams::default(), &pod(&same, node, Some("cfg")))
            .await
            .unwrap();
    }
    rs.until("initial pods", |e| e.pods() == names(&["a", "b", "same"]))
        .await;
    ke.until("initial pods", |e| {
        e.pods() == names(&["a-ke", "b-ke", "same-ke"])
    })
    .await;
    // Their kubelets fetch the configmaps the pods use (the query reply is stored, as
    // metamanager does): `cfg` and the service-account volume's `kube-root-ca.crt`.
    let cfg_key = format!("{ns}/configmap/cfg");
    for e in [&mut rs, &mut ke] {
        let reply = e.query(&cfg_key).await;
        assert_eq!(reply.content["data"]["k"], "1");
        let reply = e.query(&format!("{ns}/configmap/kube-root-ca.crt")).await;
        assert!(
            reply.content["data"]["ca.crt"].is_string(),
            "{}",
            reply.content
        );
    }

    fx.stop();
    drop(fx);
    for e in [&mut rs, &mut ke] {
        assert!(e.raw.closed_within(WAIT).await, "cloudcore went away");
    }

    // While no cloudcore runs: an update, a deletion and a creation per node; cfg changes.
    let mut want: BTreeMap<String, String> = BTreeMap::new(); // pod name → uid
    for (node, suffix) in [(&rs_node, ""), (&ke_node, "-ke")] {
        let a = label(&pods, &format!("a{suffix}"), "offline").await;
        pods.delete(&format!("b{suffix}"), &now_gone())
            .await
            .unwrap();
        let c = pods
            .create(
                &PostParams::default(),
                &pod(&format!("c{suffix}"), node, None),
            )
            .await
            .unwrap();
        let same = pods.get(&format!("same{suffix}")).await.unwrap();
        for p in [a, c, same] {
            want.insert(p.metadata.name.clone().unwrap(), uid(&p));
        }
    }
    let patch = json!({"data": {"k": "2"}});
    cms.patch("cfg", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();

    let fx = CloudFixture::start(cluster.client(), &pki).await.unwrap();
    rs.reconnect(&fx, &pki).await;
    ke.reconnect(&fx, &pki).await;
    let converged = |e: &ModelEdge, suffix: &str| {
        let key = |n: &str| format!("{ns}/pod/{n}{suffix}");
        ["a", "c", "same"].iter().all(|n| {
            e.held
                .get(&key(n))
                .is_some_and(|h| want.get(&format!("{n}{suffix}")) == Some(&h.uid))
        }) && e
            .object(&key("a"))
            .is_some_and(|a| a["metadata"]["labels"]["changed"] == "offline")
            && e.object(&cfg_key).is_some_and(|c| c["data"]["k"] == "2")
    };

    // The inventory edge gets exactly the difference: one message per change, nothing else.
    rs.until("convergence after the restart", |e| {
        converged(e, "") && e.pods() == names(&["a", "c", "same"])
    })
    .await;
    rs.pump(QUIET).await;
    let pod_key = |n: &str| format!("{ns}/pod/{n}");
    assert_eq!(
        rs.count(Operation::Update, &pod_key("a")),
        1,
        "{:?}",
        rs.log
    );
    assert_eq!(
        rs.count(Operation::Delete, &pod_key("b")),
        1,
        "{:?}",
        rs.log
    );
    assert_eq!(
        rs.count(Operation::Insert, &pod_key("c")) + rs.count(Operation::Update, &pod_key("c")),
        1,
        "{:?}",
        rs.log
    );
    assert_eq!(rs.count(Operation::Update, &cfg_key), 1, "{:?}", rs.log);
    assert_eq!(rs.log.len(), 4, "nothing else was sent: {:?}", rs.log);
    assert_eq!(rs.pods(), names(&["a", "c", "same"]));

    // The KubeEdge edge reports nothing. Without ObjectSync records (KubeEdge's CRDs, which
    // this test does not install; a cluster with the Helm chart has them) it is sent
    // everything it should hold, and deletions cannot reach it; with them, what changed and
    // what was deleted, as KubeEdge's synccontroller does.
    let records = e2e::reliablesyncs::installed(&cluster.client()).await;
    ke.until("convergence after the restart", |e| {
        converged(e, "-ke") && (!records || e.object(&pod_key("b-ke")).is_none())
    })
    .await;
    ke.pump(QUIET).await;
    let sent = |e: &ModelEdge, n: &str| {
        e.count(Operation::Update, &pod_key(n)) + e.count(Operation::Insert, &pod_key(n))
    };
    for n in ["a-ke", "c-ke"] {
        assert_eq!(sent(&ke, n), 1, "{n}: {:?}", ke.log);
    }
    assert_eq!(
        sent(&ke, "same-ke"),
        if records { 0 } else { 1 },
        "same-ke (ObjectSync records: {records}): {:?}",
        ke.log
    );
    assert_eq!(
        ke.count(Operation::Delete, &pod_key("b-ke")),
        if records { 1 } else { 0 },
        "b-ke (ObjectSync records: {records}): {:?}",
        ke.log
    );
    assert_eq!(ke.count(Operation::Update, &cfg_key), 1, "{:?}", ke.log);
    delete_node(&cluster, &rs_node).await;
    delete_node(&cluster, &ke_node).await;
    cluster.delete_namespace(&ns).await;
}

#[tokio::test]
async fn watches_expiring_with_410_lose_no_change() {
    let Some(cluster) = cluster::connect_in_memory_only(
        Config::for_tests(),
        "forced watch expiry (pause_watches + compact_history)",
    )
    .await
    .expect("cluster") else {
        return;
    };
    let srv = cluster.in_memory().expect("in-memory server");
    let ns = cluster.temp_namespace("gone").await.unwrap();
    let pki = Pki::new().unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client(), &ns);
    let svcs: Api<Service> = Api::namespaced(cluster.client(), &ns);
    let node = unique("edge");
    edge_node(&cluster, &node).await;
    for (name, v) in [("cfg", "1"), ("doomed", "1")] {
        cms.create(&PostParams::default(), &configmap(name, v))
            .await
            .unwrap();
    }
    for name in ["kept", "gone"] {
        svcs.create(&PostParams::default(), &service(name, name))
            .await
            .unwrap();
    }
    let fx = CloudFixture::start(cluster.client(), &pki).await.unwrap();
    let mut e = ModelEdge::connect(&fx, &pki, &node, true).await;
    let keep = pods
        .create(&PostParams::default(), &pod("keep", &node, Some("cfg")))
        .await
        .unwrap();
    // `keep` also uses `doomed` (envFrom), so the node must learn of its deletion.
    let mut upd = pod("upd", &node, None);
    upd.spec.as_mut().unwrap().containers[0].env_from = Some(vec![
        serde_json::from_value(json!({"configMapRef": {"name": "doomed"}})).unwrap(),
    ]);
    pods.create(&PostParams::default(), &upd).await.unwrap();
    pods.create(&PostParams::default(), &pod("del", &node, None))
        .await
        .unwrap();
    e.until("pods delivered", |e| {
        e.pods() == names(&["keep", "upd", "del"])
    })
    .await;
    let (cfg_key, doomed_key) = (
        format!("{ns}/configmap/cfg"),
        format!("{ns}/configmap/doomed"),
    );
    e.query(&cfg_key).await;
    e.query(&doomed_key).await;
    let svc_key = |n: &str| format!("{ns}/service/{n}");
    assert_eq!(e.query(&svc_key("gone")).await.content["kind"], "Service");
    e.log.clear();

    // Every watch ends and cannot resume until the history they would resume from is gone.
    let pause = srv.pause_watches();
    label(&pods, "upd", "during-gap").await;
    pods.delete("del", &now_gone()).await.unwrap();
    pods.create(&PostParams::default(), &pod("new", &node, None))
        .await
        .unwrap();
    cms.patch(
        "cfg",
        &PatchParams::default(),
        &Patch::Merge(&json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    cms.delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    svcs.delete("gone", &DeleteParams::default()).await.unwrap();
    svcs.patch(
        "kept",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"labels": {"tier": "gap"}}})),
    )
    .await
    .unwrap();
    srv.compact_history();
    drop(pause);

    let pod_key = |n: &str| format!("{ns}/pod/{n}");
    e.until("every change made during the gap", |e| {
        e.pods() == names(&["keep", "upd", "new"])
            && e.object(&pod_key("upd"))
                .is_some_and(|p| p["metadata"]["labels"]["changed"] == "during-gap")
            && e.object(&cfg_key).is_some_and(|c| c["data"]["k"] == "2")
            && e.object(&doomed_key).is_none()
    })
    .await;
    e.pump(QUIET).await;
    assert_eq!(
        e.count(Operation::Update, &pod_key("upd")),
        1,
        "{:?}",
        e.log
    );
    assert_eq!(
        e.count(Operation::Delete, &pod_key("del")),
        1,
        "{:?}",
        e.log
    );
    assert_eq!(
        e.count(Operation::Insert, &pod_key("new")),
        1,
        "{:?}",
        e.log
    );
    assert_eq!(e.count(Operation::Update, &cfg_key), 1, "{:?}", e.log);
    assert_eq!(e.count(Operation::Delete, &doomed_key), 1, "{:?}", e.log);
    assert_eq!(
        e.log.len(),
        5,
        "the relist re-sent nothing unchanged: {:?}",
        e.log
    );
    assert_eq!(
        e.object(&pod_key("keep")).unwrap()["metadata"]["uid"],
        json!(keep.metadata.uid)
    );

    // The service cache relisted too: the deletion and the change made in the gap show.
    poll_query(&mut e, &svc_key("gone"), |r| {
        r.content["ErrStatus"]["code"] == 404
    })
    .await;
    poll_query(&mut e, &svc_key("kept"), |r| {
        r.content["metadata"]["labels"]["tier"] == "gap"
    })
    .await;

    // And the watches are live again.
    label(&pods, "upd", "after").await;
    e.until("a change after the relist", |e| {
        e.object(&pod_key("upd"))
            .is_some_and(|p| p["metadata"]["labels"]["changed"] == "after")
    })
    .await;
    delete_node(&cluster, &node).await;
}

fn service(name: &str, app: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"selector": {"app": app}, "ports": [{"port": 80, "targetPort": "http"}]}
    }))
    .unwrap()
}

/// Queries `resource` until `ok` holds for the reply (the cache follows the apiserver's watch).
async fn poll_query(e: &mut ModelEdge, resource: &str, ok: impl Fn(&Message) -> bool) -> Message {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let r = e.query(resource).await;
        if ok(&r) {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "query {resource}: last reply {}",
            r.content
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn endpoint_ips(endpoints: &Value) -> Vec<String> {
    let mut ips = Vec::new();
    for subset in endpoints["subsets"].as_array().into_iter().flatten() {
        for field in ["addresses", "notReadyAddresses"] {
            for a in subset[field].as_array().into_iter().flatten() {
                ips.extend(a["ip"].as_str().map(str::to_string));
            }
        }
    }
    ips
}

#[tokio::test]
async fn service_and_endpoints_queries_are_answered_from_the_cloud_cache() {
    let cluster = cluster::connect().await.expect("cluster");
    let ns = cluster.temp_namespace("svc").await.unwrap();
    let pki = Pki::new().unwrap();
    let node = unique("edge");
    edge_node(&cluster, &node).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns);
    let svcs: Api<Service> = Api::namespaced(cluster.client(), &ns);
    let fx = CloudFixture::start(cluster.client(), &pki).await.unwrap();
    let mut e = ModelEdge::connect(&fx, &pki, &node, false).await;

    pods.create(&PostParams::default(), &pod("web", &node, None))
        .await
        .unwrap();
    // What the edge's kubelet would report: an IP and readiness.
    let status = json!({"status": {"phase": "Running", "podIP": "10.88.0.7",
        "podIPs": [{"ip": "10.88.0.7"}],
        "conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status("web", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let created = svcs
        .create(&PostParams::default(), &service("web", "web"))
        .await
        .unwrap();

    // One service: the object with apiVersion/kind, its RV in the header, ACKed like a
    // configmap query reply.
    let r = poll_query(&mut e, &format!("{ns}/service/web"), |r| {
        r.content["kind"] == "Service"
    })
    .await;
    assert_eq!(r.content["apiVersion"], "v1");
    assert_eq!(r.content["metadata"]["uid"], json!(created.metadata.uid));
    assert_eq!(r.content["spec"]["ports"][0]["port"], 80);
    assert_eq!(
        r.header.resource_version,
        r.content["metadata"]["resourceVersion"].as_str().unwrap()
    );
    assert!(r.requires_ack());

    // Its endpoints, once the endpoints controller has listed the pod.
    let r = poll_query(&mut e, &format!("{ns}/endpoints/web"), |r| {
        endpoint_ips(&r.content) == ["10.88.0.7"]
    })
    .await;
    assert_eq!(r.content["kind"], "Endpoints");
    // The EndpointSlices of the namespace (a list query: a JSON array).
    let r = poll_query(&mut e, &format!("{ns}/endpointslice"), |r| {
        r.content.as_array().is_some_and(|a| {
            a.iter().any(|s| {
                s["metadata"]["labels"]["kubernetes.io/service-name"] == "web"
                    && s["endpoints"][0]["addresses"][0] == "10.88.0.7"
            })
        })
    })
    .await;
    assert!(
        r.content
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["kind"] == "EndpointSlice"),
        "{}",
        r.content
    );
    // KubeEdge's list forms: only this namespace's objects.
    let r = e.query(&format!("{ns}/servicelist/service")).await;
    let listed: Vec<&str> = r
        .content
        .as_array()
        .expect("an array")
        .iter()
        .map(|s| s["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["web"]);
    let r = e.query(&format!("{ns}/endpointslist/endpoints")).await;
    assert_eq!(r.content.as_array().map(Vec::len), Some(1), "{}", r.content);

    // A service that does not exist: NotFound, as the apiserver says it.
    let r = e.query(&format!("{ns}/service/missing")).await;
    assert_eq!(r.content["ErrStatus"]["code"], 404);
    assert_eq!(r.content["ErrStatus"]["reason"], "NotFound");

    // A change shows on a later query; so does the deletion.
    let change = json!({"metadata": {"labels": {"tier": "front"}},
        "spec": {"ports": [{"port": 81, "targetPort": "http"}]}});
    svcs.patch("web", &PatchParams::default(), &Patch::Merge(&change))
        .await
        .unwrap();
    let r = poll_query(&mut e, &format!("{ns}/service/web"), |r| {
        r.content["metadata"]["labels"]["tier"] == "front"
    })
    .await;
    assert_eq!(r.content["spec"]["ports"][0]["port"], 81);
    svcs.delete("web", &DeleteParams::default()).await.unwrap();
    poll_query(&mut e, &format!("{ns}/service/web"), |r| {
        r.content["ErrStatus"]["code"] == 404
    })
    .await;
    poll_query(&mut e, &format!("{ns}/endpoints/web"), |r| {
        r.content["ErrStatus"]["code"] == 404
    })
    .await;
    delete_node(&cluster, &node).await;
    cluster.delete_namespace(&ns).await;
}

#[tokio::test]
async fn reconnect_drops_held_configmaps_no_pod_of_the_node_uses() {
    let cluster = cluster::connect().await.expect("cluster");
    let ns = cluster.temp_namespace("unused").await.unwrap();
    let pki = Pki::new().unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client(), &ns);
    let node = unique("edge-rs");
    edge_node(&cluster, &node).await;
    let used = cms
        .create(&PostParams::default(), &configmap("used", "1"))
        .await
        .unwrap();
    let unused = cms
        .create(&PostParams::default(), &configmap("unused", "1"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("p", &node, Some("used")))
        .await
        .unwrap();
    let fx = CloudFixture::start(cluster.client(), &pki).await.unwrap();
    let mut e = ModelEdge::connect(&fx, &pki, &node, true).await;
    e.until("the pod", |e| e.pods() == names(&["p"])).await;

    // The edge holds both configmaps at their current versions (say a pod that used `unused`
    // went while the edge was away); it reconnects and reports them.
    for cm in [&used, &unused] {
        let name = cm.metadata.name.clone().unwrap();
        let object = serde_json::to_value(cm).unwrap();
        e.held.insert(
            format!("{ns}/configmap/{name}"),
            Held {
                ty: "configmap".into(),
                uid: uid_of(&object),
                rv: cm.metadata.resource_version.clone().unwrap(),
                object,
            },
        );
    }
    e.reconnect(&fx, &pki).await;
    let unused_key = format!("{ns}/configmap/unused");
    e.until("the unused configmap dropped", |e| {
        !e.held.contains_key(&unused_key)
    })
    .await;
    e.pump(QUIET).await;
    assert!(e.held.contains_key(&format!("{ns}/configmap/used")));
    assert_eq!(e.count(Operation::Delete, &unused_key), 1, "{:?}", e.log);
    fx.stop();
    delete_node(&cluster, &node).await;
    cluster.delete_namespace(&ns).await;
}

fn uid_of(v: &Value) -> String {
    v["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}
