//! The downstream actor without a cluster: watcher events, inventories and fetch answers are
//! fed in every order a cloudcore start-up can see them, and what reaches a model edge is
//! checked. The model edge applies messages in order, and like a node's queue it treats a
//! delete as final for its UID: a pod deleted in error and sent again later is lost.

use super::*;
use crate::cloudhub::queue::Enqueued;
use crate::cloudhub::{Capabilities, SendError};
use kube::api::ObjectMeta;
use kubeedge_shared::ResourcePath;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

const NODE: &str = "edge-a";

/// `(type, namespace, name)` → uid of what the edge holds.
type EdgeDb = BTreeMap<(String, String, String), String>;

#[derive(Default)]
struct FakeHub {
    connected: Mutex<HashMap<String, Capabilities>>,
    sent: Mutex<Vec<(String, Message)>>,
}

impl HubSink for FakeHub {
    fn send(&self, node: &str, msg: Message) -> Result<Enqueued, SendError> {
        if !self.is_connected(node) {
            return Err(SendError::NotConnected(node.into()));
        }
        self.sent.lock().unwrap().push((node.to_string(), msg));
        Ok(Enqueued::Queued)
    }
    fn is_connected(&self, node: &str) -> bool {
        self.connected.lock().unwrap().contains_key(node)
    }
    fn connected_nodes(&self) -> Vec<String> {
        self.connected.lock().unwrap().keys().cloned().collect()
    }
    fn capabilities(&self, node: &str) -> Option<Capabilities> {
        self.connected.lock().unwrap().get(node).cloned()
    }
    fn disconnect(&self, node: &str) -> bool {
        self.connected.lock().unwrap().remove(node).is_some()
    }
}

impl FakeHub {
    fn connect(&self, node: &str, inventory_resync: bool) {
        self.connected.lock().unwrap().insert(
            node.into(),
            Capabilities {
                inventory_resync,
                ..Capabilities::default()
            },
        );
    }

    fn take(&self, node: &str) -> Vec<Message> {
        let mut sent = self.sent.lock().unwrap();
        let (mine, rest): (Vec<_>, Vec<_>) = sent.drain(..).partition(|(n, _)| n == node);
        *sent = rest;
        mine.into_iter().map(|(_, m)| m).collect()
    }
}

fn meta(ns: &str, name: &str, uid: &str, rv: u64) -> ObjectMeta {
    ObjectMeta {
        namespace: (!ns.is_empty()).then(|| ns.to_string()),
        name: Some(name.into()),
        uid: Some(uid.into()),
        resource_version: Some(rv.to_string()),
        ..Default::default()
    }
}

fn node(name: &str) -> Node {
    let mut m = meta("", name, &format!("uid-{name}"), 5);
    m.labels = Some([(EDGE_NODE_LABEL.to_string(), String::new())].into());
    Node {
        metadata: m,
        ..Default::default()
    }
}

fn pod(name: &str, node: &str, rv: u64, configmap: Option<&str>, secret: Option<&str>) -> Pod {
    let mut volumes = Vec::new();
    if let Some(cm) = configmap {
        volumes.push(json!({"name": "c", "configMap": {"name": cm}}));
    }
    if let Some(s) = secret {
        volumes.push(json!({"name": "s", "secret": {"secretName": s}}));
    }
    serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": name, "uid": format!("uid-{name}"), "resourceVersion": rv.to_string()},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}], "volumes": volumes},
    }))
    .unwrap()
}

fn configmap(name: &str, rv: u64) -> ConfigMap {
    ConfigMap {
        metadata: meta("ns", name, &format!("uid-{name}"), rv),
        ..Default::default()
    }
}

fn secret(name: &str, rv: u64) -> Secret {
    Secret {
        metadata: meta("ns", name, &format!("uid-{name}"), rv),
        ..Default::default()
    }
}

fn held(ty: &str, name: &str, rv: u64) -> HeldObject {
    HeldObject {
        resource_type: ty.into(),
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        resource_version: rv,
    }
}

/// A small cluster: edge-a runs a1 (configmap x) and a2 (secret s); edge-b runs b1; configmap
/// y is used by nobody.
struct Cluster {
    nodes: Vec<Node>,
    pods: Vec<Pod>,
    configmaps: Vec<ConfigMap>,
    secrets: Vec<Secret>,
}

impl Cluster {
    fn new() -> Self {
        Cluster {
            nodes: vec![node(NODE), node("edge-b")],
            pods: vec![
                pod("a1", NODE, 20, Some("x"), None),
                pod("a2", NODE, 21, None, Some("s")),
                pod("b1", "edge-b", 22, None, None),
            ],
            configmaps: vec![configmap("x", 10), configmap("y", 11)],
            secrets: vec![secret("s", 12)],
        }
    }

    fn pod(&self, name: &str) -> Pod {
        self.pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .cloned()
            .unwrap()
    }

    /// What edge-a should hold.
    fn wanted(&self) -> EdgeDb {
        [
            ("pod", "a1"),
            ("pod", "a2"),
            ("configmap", "x"),
            ("secret", "s"),
        ]
        .into_iter()
        .map(|(t, n)| ((t.into(), "ns".into(), n.into()), format!("uid-{n}")))
        .collect()
    }

    fn answer(&self, fetch: Fetch) -> Input {
        match fetch {
            Fetch::PodsOf { node, generation } => Input::PodsListed {
                complete: true,
                pods: self
                    .pods
                    .iter()
                    .filter(|p| p.spec.as_ref().unwrap().node_name.as_deref() == Some(&node))
                    .cloned()
                    .collect(),
                node,
                generation,
            },
            Fetch::Pods { node, keys } => Input::PodsFetched {
                pods: self
                    .pods
                    .iter()
                    .filter(|p| {
                        let k = (
                            p.metadata.namespace.clone().unwrap_or_default(),
                            p.metadata.name.clone().unwrap_or_default(),
                        );
                        p.spec.as_ref().unwrap().node_name.as_deref() == Some(&node)
                            && keys.contains(&k)
                    })
                    .cloned()
                    .collect(),
                node,
                keys,
            },
            Fetch::Configs { node, keys } => Input::ConfigsFetched {
                objects: keys
                    .into_iter()
                    .map(|ConfigWant { kind, key, .. }| {
                        let object = match kind {
                            ConfigKind::ConfigMap => self
                                .configmaps
                                .iter()
                                .find(|c| c.metadata.name.as_deref() == Some(&key.1))
                                .map(|c| serde_json::to_value(c).unwrap()),
                            ConfigKind::Secret => self
                                .secrets
                                .iter()
                                .find(|c| c.metadata.name.as_deref() == Some(&key.1))
                                .map(|c| serde_json::to_value(c).unwrap()),
                        };
                        Fetched { kind, key, object }
                    })
                    .collect(),
                node,
            },
        }
    }
}

/// The actor with a fake hub, and the model of edge-a's database.
struct Rig {
    ds: Downstream,
    hub: Arc<FakeHub>,
    fetches: mpsc::UnboundedReceiver<Fetch>,
    edge: EdgeDb,
    /// UIDs the edge was told to delete: final, as in a node's queue.
    deleted: BTreeSet<String>,
    log: Vec<String>,
}

impl Rig {
    fn new(inventory_resync: bool, edge: EdgeDb) -> Rig {
        let hub = Arc::new(FakeHub::default());
        hub.connect(NODE, inventory_resync);
        let (tx, fetches) = mpsc::unbounded_channel();
        let mut ds = Downstream::new(hub.clone(), Readiness::default(), tx);
        // Every pod a resync sends is read (`keep_recent` turns the cache of deliveries on).
        ds.pods.recent = super::recent_pods::RecentPods::with_limit(0);
        Rig {
            ds,
            hub,
            fetches,
            edge,
            deleted: BTreeSet::new(),
            log: Vec::new(),
        }
    }

    fn apply(&mut self, input: Input) {
        self.ds.apply(input);
        self.deliver();
    }

    /// Resyncs send what the watcher delivered lately without reading it.
    fn keep_recent(mut self) -> Self {
        self.ds.pods.recent = super::recent_pods::RecentPods::default();
        self
    }

    /// Applies what was sent to edge-a to the model edge.
    fn deliver(&mut self) {
        for m in self.hub.take(NODE) {
            let path = ResourcePath::parse(&m.route.resource).unwrap();
            let key = (
                path.resource_type.to_string(),
                path.namespace.clone().unwrap_or_default(),
                path.name.clone().unwrap_or_default(),
            );
            let uid = m.object_uid().unwrap_or_default().to_string();
            self.log
                .push(format!("{} {}/{} {uid}", m.route.operation, key.0, key.2));
            if m.route.operation == Operation::Delete {
                self.deleted.insert(uid.clone());
                if self.edge.get(&key) == Some(&uid) {
                    self.edge.remove(&key);
                }
            } else if !self.deleted.contains(&uid) {
                self.edge.insert(key, uid);
            }
        }
    }

    /// Answers every fetch asked for so far (and those the answers ask for).
    fn answer_fetches(&mut self, cluster: &Cluster) {
        while let Ok(f) = self.fetches.try_recv() {
            self.log.push(format!("answer {f:?}"));
            let input = cluster.answer(f);
            self.apply(input);
        }
    }
}

fn edge_holding_everything() -> EdgeDb {
    Cluster::new().wanted()
}

/// One start-up step: the watchers' first lists cut into pieces, and the edge's request.
#[derive(Clone, Copy, Debug)]
enum Step {
    NodesListed,
    NodesDone,
    PodsFirst,
    PodsRestAndDone,
    ConfigMapsListed,
    ConfigMapsDone,
    Secrets,
    Edge,
}

fn inputs(step: Step, c: &Cluster, inventory_resync: bool) -> Vec<Input> {
    match step {
        Step::NodesListed => {
            let mut v = vec![Input::Node(Event::Init)];
            v.extend(
                c.nodes
                    .iter()
                    .cloned()
                    .map(|n| Input::Node(Event::InitApply(n))),
            );
            v
        }
        Step::NodesDone => vec![Input::Node(Event::InitDone), listed(Kind::Node)],
        // a1 and b1 come before the node list may have named their nodes, a2 after.
        Step::PodsFirst => vec![
            Input::Pod(Event::Init),
            Input::Pod(Event::InitApply(c.pod("a1"))),
            Input::Pod(Event::InitApply(c.pod("b1"))),
        ],
        Step::PodsRestAndDone => vec![
            Input::Pod(Event::InitApply(c.pod("a2"))),
            Input::Pod(Event::InitDone),
            listed(Kind::Pod),
        ],
        Step::ConfigMapsListed => {
            let mut v = vec![Input::ConfigMap(Event::Init)];
            v.extend(
                c.configmaps
                    .iter()
                    .cloned()
                    .map(|o| Input::ConfigMap(Event::InitApply(o))),
            );
            v
        }
        Step::ConfigMapsDone => vec![Input::ConfigMap(Event::InitDone), listed(Kind::ConfigMap)],
        Step::Secrets => {
            let mut v = vec![Input::Secret(Event::Init)];
            v.extend(
                c.secrets
                    .iter()
                    .cloned()
                    .map(|o| Input::Secret(Event::InitApply(o))),
            );
            v.push(Input::Secret(Event::InitDone));
            v.push(listed(Kind::Secret));
            v
        }
        Step::Edge if inventory_resync => vec![Input::Inventory {
            node: NODE.into(),
            held: vec![
                held("pod", "a1", 20),
                held("pod", "a2", 21),
                held("configmap", "x", 10),
                held("secret", "s", 12),
            ],
        }],
        Step::Edge => vec![Input::Connected {
            node: NODE.into(),
            capabilities: Capabilities::default(),
        }],
    }
}

/// The resourceVersion of the watchers' first lists.
const LISTED_AT: u64 = 30;

/// What a watcher reports after a list.
fn listed(watched: Kind) -> Input {
    Input::Progress {
        watched,
        resource_version: LISTED_AT,
    }
}

/// Every interleaving of the given chains (each chain keeps its own order).
fn interleavings(chains: &[Vec<Step>]) -> Vec<Vec<Step>> {
    fn go(
        chains: &[Vec<Step>],
        pos: &mut Vec<usize>,
        cur: &mut Vec<Step>,
        out: &mut Vec<Vec<Step>>,
    ) {
        let mut any = false;
        for i in 0..chains.len() {
            if pos[i] < chains[i].len() {
                any = true;
                cur.push(chains[i][pos[i]]);
                pos[i] += 1;
                go(chains, pos, cur, out);
                pos[i] -= 1;
                cur.pop();
            }
        }
        if !any {
            out.push(cur.clone());
        }
    }
    let mut out = Vec::new();
    go(
        chains,
        &mut vec![0; chains.len()],
        &mut Vec::new(),
        &mut out,
    );
    out
}

#[derive(Clone, Copy, Debug)]
enum FetchAnswers {
    /// As soon as asked.
    AtOnce,
    /// After the next start-up step.
    AfterNextStep,
    /// Only after every start-up step.
    AtTheEnd,
}

fn run_start_up(order: &[Step], answers: FetchAnswers, inventory_resync: bool) -> Rig {
    let cluster = Cluster::new();
    let mut rig = Rig::new(inventory_resync, edge_holding_everything());
    for (i, step) in order.iter().enumerate() {
        rig.log.push(format!("{step:?}"));
        for input in inputs(*step, &cluster, inventory_resync) {
            rig.apply(input);
        }
        match answers {
            FetchAnswers::AtOnce => rig.answer_fetches(&cluster),
            FetchAnswers::AfterNextStep if i > 0 => rig.answer_fetches(&cluster),
            _ => {}
        }
    }
    rig.answer_fetches(&cluster);
    rig
}

fn start_up_chains() -> Vec<Vec<Step>> {
    vec![
        vec![Step::NodesListed, Step::NodesDone],
        vec![Step::PodsFirst, Step::PodsRestAndDone],
        vec![Step::ConfigMapsListed, Step::ConfigMapsDone],
        vec![Step::Secrets],
        vec![Step::Edge],
    ]
}

/// The field report: a restarted cloudcore answered a reconnecting edge's inventory before
/// it knew the node's pods and deleted all of them. In no order of node list, pod list,
/// configmap and secret lists, inventory and pod-list answers may an edge that holds exactly
/// what it should be told to delete anything — and it must end up holding all of it.
#[test]
fn no_start_up_order_deletes_what_an_inventory_edge_should_keep() {
    let orders = interleavings(&start_up_chains());
    assert_eq!(orders.len(), 5040);
    for answers in [
        FetchAnswers::AtOnce,
        FetchAnswers::AfterNextStep,
        FetchAnswers::AtTheEnd,
    ] {
        for order in &orders {
            let rig = run_start_up(order, answers, true);
            assert!(
                rig.deleted.is_empty() && rig.edge == Cluster::new().wanted(),
                "order {order:?}, fetches answered {answers:?}: deleted {:?}, edge holds {:?}\n{}",
                rig.deleted,
                rig.edge,
                rig.log.join("\n")
            );
        }
    }
}

/// The same for a KubeEdge edge (no inventory, no ObjectSync records): it is sent everything
/// it should hold, and told to delete nothing.
#[test]
fn no_start_up_order_deletes_from_a_kubeedge_edge() {
    for order in interleavings(&start_up_chains()) {
        let rig = run_start_up(&order, FetchAnswers::AfterNextStep, false);
        assert!(
            rig.deleted.is_empty() && rig.edge == Cluster::new().wanted(),
            "order {order:?}: deleted {:?}, edge holds {:?}\n{}",
            rig.deleted,
            rig.edge,
            rig.log.join("\n")
        );
    }
}

/// An edge that lacks everything gets all of it, in every order, with pods read or sent as
/// the watcher delivered them.
#[test]
fn every_start_up_order_brings_an_empty_edge_everything() {
    for (order, recent) in interleavings(&start_up_chains())
        .into_iter()
        .flat_map(|o| [(o.clone(), false), (o, true)])
    {
        let cluster = Cluster::new();
        let mut rig = Rig::new(true, EdgeDb::new());
        if recent {
            rig = rig.keep_recent();
        }
        for step in &order {
            let inputs = match step {
                Step::Edge => vec![Input::Inventory {
                    node: NODE.into(),
                    held: Vec::new(),
                }],
                other => inputs(*other, &cluster, true),
            };
            for input in inputs {
                rig.apply(input);
            }
            rig.answer_fetches(&cluster);
        }
        assert_eq!(
            rig.edge,
            cluster.wanted(),
            "order {order:?}, recent deliveries kept: {recent}\n{}",
            rig.log.join("\n")
        );
    }
}

/// A reconnect storm's reads: pods the watcher delivered lately are sent as delivered, so
/// an edge that missed them while away costs no pod read; a pod changed since (its kept copy
/// replaced by the newer delivery) is sent at its new version.
#[test]
fn recently_delivered_pods_are_sent_without_a_read() {
    let cluster = Cluster::new();
    let mut rig = Rig::new(true, EdgeDb::new()).keep_recent();
    for step in [
        Step::NodesListed,
        Step::NodesDone,
        Step::PodsFirst,
        Step::PodsRestAndDone,
        Step::ConfigMapsListed,
        Step::ConfigMapsDone,
        Step::Secrets,
    ] {
        for input in inputs(step, &cluster, true) {
            rig.apply(input);
        }
    }
    let mut a1 = cluster.pod("a1");
    a1.metadata.labels = Some([("v".to_string(), "2".to_string())].into());
    a1.metadata.resource_version = Some("60".into());
    rig.apply(Input::Pod(Event::Apply(a1)));
    while rig.fetches.try_recv().is_ok() {}
    let mark = rig.log.len();
    rig.apply(Input::Inventory {
        node: NODE.into(),
        held: vec![held("pod", "a1", 20)],
    });
    let mut pod_reads = Vec::new();
    while let Ok(f) = rig.fetches.try_recv() {
        if matches!(f, Fetch::Pods { .. } | Fetch::PodsOf { .. }) {
            pod_reads.push(format!("{f:?}"));
        }
        let input = cluster.answer(f);
        rig.apply(input);
    }
    assert!(pod_reads.is_empty(), "{pod_reads:?}");
    // Both pods were sent again: a2, which the inventory lacks, and a1, held at rv 20.
    let resent = &rig.log[mark..];
    for pod in ["pod/a1 uid-a1", "pod/a2 uid-a2"] {
        assert!(
            resent.iter().any(|l| l.ends_with(pod)),
            "{pod} not sent: {resent:?}"
        );
    }
    assert_eq!(rig.edge, cluster.wanted(), "{}", rig.log.join("\n"));
}

fn synced_rig(inventory_resync: bool, edge: EdgeDb) -> (Rig, Cluster) {
    let cluster = Cluster::new();
    let mut rig = Rig::new(inventory_resync, edge);
    for step in [
        Step::NodesListed,
        Step::NodesDone,
        Step::PodsFirst,
        Step::PodsRestAndDone,
        Step::ConfigMapsListed,
        Step::ConfigMapsDone,
        Step::Secrets,
    ] {
        for input in inputs(step, &cluster, inventory_resync) {
            rig.apply(input);
        }
    }
    rig.answer_fetches(&cluster);
    (rig, cluster)
}

/// What an edge holds that the cluster no longer has is deleted — but not what it holds at a
/// resourceVersion newer than anything this cloudcore has seen (another replica served it:
/// this one is behind, and its watcher will bring the pod or its delete).
#[test]
fn held_objects_newer_than_the_view_are_left_alone() {
    let mut edge = Cluster::new().wanted();
    edge.insert(
        ("pod".into(), "ns".into(), "gone".into()),
        "uid-gone".into(),
    );
    edge.insert(
        ("pod".into(), "ns".into(), "newer".into()),
        "uid-newer".into(),
    );
    edge.insert(
        ("configmap".into(), "ns".into(), "oldcm".into()),
        "uid-oldcm".into(),
    );
    let (mut rig, cluster) = synced_rig(true, edge);
    let mut held_list: Vec<HeldObject> = vec![
        held("pod", "a1", 20),
        held("pod", "a2", 21),
        held("configmap", "x", 10),
        held("secret", "s", 12),
    ];
    held_list.push(held("pod", "gone", 15));
    held_list.push(held("pod", "newer", 900));
    held_list.push(held("configmap", "oldcm", 3));
    rig.apply(Input::Inventory {
        node: NODE.into(),
        held: held_list,
    });
    rig.answer_fetches(&cluster);
    assert!(rig.deleted.contains("uid-gone"), "{}", rig.log.join("\n"));
    assert!(!rig.deleted.contains("uid-newer"), "{}", rig.log.join("\n"));
    // Unused by pods this cloudcore may not know yet (the newer pod): left alone too.
    assert!(!rig.deleted.contains("uid-oldcm"), "{}", rig.log.join("\n"));

    // Once the watcher has gone past the newer pod's version without it (a bookmark), it is
    // gone.
    rig.apply(Input::Progress {
        watched: Kind::Pod,
        resource_version: 1000,
    });
    rig.apply(Input::Inventory {
        node: NODE.into(),
        held: vec![
            held("pod", "a1", 20),
            held("pod", "a2", 21),
            held("configmap", "x", 10),
            held("secret", "s", 12),
            held("pod", "newer", 900),
            held("configmap", "oldcm", 3),
        ],
    });
    assert!(rig.deleted.contains("uid-newer"), "{}", rig.log.join("\n"));
    assert!(rig.deleted.contains("uid-oldcm"), "{}", rig.log.join("\n"));
    assert_eq!(rig.edge, cluster.wanted());
}

/// Pods bound to a node after its inventory was answered reach it.
#[test]
fn pods_that_arrive_after_the_resync_are_delivered() {
    let (mut rig, cluster) = synced_rig(true, EdgeDb::new());
    rig.apply(Input::Inventory {
        node: NODE.into(),
        held: Vec::new(),
    });
    rig.answer_fetches(&cluster);
    assert_eq!(rig.edge, cluster.wanted());
    rig.apply(Input::Pod(Event::Apply(pod("a3", NODE, 30, None, None))));
    assert_eq!(
        rig.edge.get(&("pod".into(), "ns".into(), "a3".into())),
        Some(&"uid-a3".to_string())
    );
}

/// A node that becomes an edge node after start-up is not answered until its pod list is
/// in; a relisting watcher defers answers too.
#[test]
fn a_new_edge_node_and_a_relisting_watcher_defer_the_answer() {
    let (mut rig, cluster) = synced_rig(true, edge_holding_everything());
    // edge-c: known only now, with a pod.
    let c = node("edge-c");
    rig.hub.connect("edge-c", true);
    rig.apply(Input::Node(Event::Apply(c)));
    rig.apply(Input::Inventory {
        node: "edge-c".into(),
        held: vec![held("pod", "c1", 40)],
    });
    assert!(
        rig.hub.take("edge-c").is_empty(),
        "answered before its pods were listed"
    );
    let f = rig.fetches.try_recv().expect("a pod list for edge-c");
    let Fetch::PodsOf { node, generation } = f else {
        panic!("{f:?}")
    };
    // The list answers in parts (a list of all pods, page by page): a part that is not the
    // last leaves the node's pods unknown.
    rig.apply(Input::PodsListed {
        node: node.clone(),
        generation,
        pods: vec![pod("c1", "edge-c", 40, None, None)],
        complete: false,
    });
    assert!(
        rig.hub
            .take("edge-c")
            .iter()
            .all(|m| m.route.operation != Operation::Delete),
        "answered before its pod list was complete"
    );
    assert!(rig.ds.resyncs.pending.contains_key("edge-c"));
    rig.apply(Input::PodsListed {
        node,
        generation,
        pods: Vec::new(),
        complete: true,
    });
    assert!(!rig.ds.resyncs.pending.contains_key("edge-c"));
    let sent = rig.hub.take("edge-c");
    assert!(
        sent.iter().all(|m| m.route.operation != Operation::Delete),
        "{sent:?}"
    );

    // The pod watcher relists (after a 410): inventories wait for the end of the list.
    rig.apply(Input::Pod(Event::Init));
    rig.apply(Input::Inventory {
        node: NODE.into(),
        held: vec![held("pod", "a1", 20), held("pod", "zombie", 1)],
    });
    assert!(rig.deleted.is_empty(), "{}", rig.log.join("\n"));
    for p in cluster.pods.iter().cloned() {
        rig.apply(Input::Pod(Event::InitApply(p)));
    }
    rig.apply(Input::Pod(Event::InitDone));
    rig.answer_fetches(&cluster);
    assert_eq!(rig.deleted, BTreeSet::from(["uid-zombie".to_string()]));
    assert_eq!(rig.edge, cluster.wanted());
}

/// A deferred resync of a node that disconnected is dropped; the next session asks anew.
#[test]
fn a_deferred_resync_ends_with_its_session() {
    let cluster = Cluster::new();
    let mut rig = Rig::new(true, EdgeDb::new());
    rig.apply(Input::Inventory {
        node: NODE.into(),
        held: vec![held("pod", "zombie", 1)],
    });
    rig.hub.disconnect(NODE);
    rig.apply(Input::Disconnected { node: NODE.into() });
    rig.hub.connect(NODE, true);
    for step in [
        Step::NodesListed,
        Step::NodesDone,
        Step::PodsFirst,
        Step::PodsRestAndDone,
        Step::ConfigMapsListed,
        Step::ConfigMapsDone,
        Step::Secrets,
    ] {
        for input in inputs(step, &cluster, true) {
            rig.apply(input);
        }
    }
    rig.answer_fetches(&cluster);
    assert!(rig.deleted.is_empty(), "{}", rig.log.join("\n"));
    // The new session's inventory is answered.
    rig.apply(Input::Inventory {
        node: NODE.into(),
        held: vec![held("pod", "zombie", 1)],
    });
    assert_eq!(rig.deleted, BTreeSet::from(["uid-zombie".to_string()]));
}

/// A fetched copy older than what the watcher delivered is not sent (it would undo an
/// update): a configmap is left to the watch event that was sent, a pod is fetched again.
#[test]
fn fetched_copies_older_than_the_watch_are_not_sent() {
    let (mut rig, cluster) = synced_rig(true, EdgeDb::new());
    rig.apply(Input::Inventory {
        node: NODE.into(),
        held: Vec::new(),
    });
    let mut pods_fetch = None;
    let mut configs_fetch = None;
    while let Ok(f) = rig.fetches.try_recv() {
        match f {
            Fetch::Pods { .. } => pods_fetch = Some(f),
            Fetch::Configs { .. } => configs_fetch = Some(f),
            other => panic!("{other:?}"),
        }
    }
    // Meanwhile x changes, and so does pod a1 (a label).
    rig.apply(Input::ConfigMap(Event::Apply(configmap("x", 50))));
    let mut a1 = cluster.pod("a1");
    a1.metadata.labels = Some([("v".to_string(), "2".to_string())].into());
    a1.metadata.resource_version = Some("60".into());
    rig.apply(Input::Pod(Event::Apply(a1)));
    let Input::ConfigsFetched { node, objects } = cluster.answer(configs_fetch.expect("configs"))
    else {
        panic!()
    };
    let mark = rig.log.len();
    rig.apply(Input::ConfigsFetched { node, objects });
    let about_x: Vec<_> = rig.log[mark..]
        .iter()
        .filter(|l| l.contains("configmap/x"))
        .collect();
    assert!(about_x.is_empty(), "{about_x:?}");
    // The secret, unchanged meanwhile, was sent.
    assert!(
        rig.log[mark..].iter().any(|l| l.contains("secret/s")),
        "{}",
        rig.log.join("\n")
    );
    // The pod list answers with a1 as it was (rv 20 < 60): not sent, asked for again.
    let mark = rig.log.len();
    let answer = cluster.answer(pods_fetch.expect("pods"));
    rig.apply(answer);
    assert!(
        !rig.log[mark..].iter().any(|l| l.contains("pod/a1")),
        "{}",
        rig.log.join("\n")
    );
    assert!(
        rig.log[mark..].iter().any(|l| l.contains("pod/a2")),
        "{}",
        rig.log.join("\n")
    );
    let again = rig.fetches.try_recv().expect("a1 fetched again");
    assert!(
        matches!(&again, Fetch::Pods { keys, .. } if keys == &vec![("ns".to_string(), "a1".to_string())]),
        "{again:?}"
    );
}
