//! Downstream: cluster changes → messages for exactly the edge nodes that need them.
//!
//! One actor owns all state (edge node set, edge pods, location cache, configmap/secret
//! versions), fed by one cluster-wide watcher per kind: the apiserver load does not grow with
//! the number of edge nodes, and nothing on the hot path takes a shared lock. Its loop only
//! moves in-memory state: what needs the apiserver (the pods of a node that just became an
//! edge node, the objects a resync sends) is a [`Fetch`] another task performs and answers
//! with an [`Input`]; messages leave through a [`HubSink`]. So [`Downstream::apply`] is a plain
//! function of its inputs, tested without a cluster (`tests.rs`).
//!
//! - `pods.rs`: edge nodes and their pods, and which nodes' pods are completely known;
//! - `recent_pods.rs`: the pods delivered lately, so that a resync sends what an edge missed
//!   without reading it again;
//! - `configs.rs`: configmaps and secrets, sent to the nodes whose pods use them;
//! - `resync.rs`: answering an edge's inventory (or a KubeEdge edge's records) with the
//!   difference — only from a view complete for that node;
//! - `fetch.rs`: the apiserver reads, off the actor's loop, coalesced so that a storm of
//!   resyncs does not become a storm of reads (`fetch_pods.rs`, `fetch_configs.rs`);
//! - `node_push.rs`: the Node object for KubeEdge v1.23+ edges, which read it locally.

mod configs;
mod fetch;
mod fetch_configs;
mod fetch_pods;
mod node_push;
mod pods;
mod recent_pods;
mod resync;
#[cfg(test)]
mod tests;
mod watch;

pub use configs::{ConfigKind, ConfigKindExt};
pub use fetch::{ConfigWant, Fetch, Fetched, spawn_fetcher};
pub use kubeedge_shared::inventory::HeldObject;

use super::kind::Kind;
use super::location::{ObjectKey, SharedLocation};
use super::objectsync::SyncRecords;
use crate::cloudhub::HubSink;
use crate::cloudhub::{Capabilities, NodeEvent};
use crate::http::Readiness;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::Api;
use kube::runtime::watcher::Event;
use kubeedge_shared::operation::source;
use kubeedge_shared::{Group, Message, Operation, ResourcePath, ResourceType};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

pub use kubeedge_shared::constants::EDGE_NODE_LABEL;

// Values are moved once through a channel; boxing would only add allocations.
#[allow(clippy::large_enum_variant)]
pub enum Input {
    Pod(Event<Pod>),
    Node(Event<Node>),
    ConfigMap(Event<ConfigMap>),
    Secret(Event<Secret>),
    WatchError(&'static str, String),
    /// A watcher has delivered every change up to this resourceVersion (a completed list or
    /// a bookmark).
    Progress {
        watched: Kind,
        resource_version: u64,
    },
    /// An edge's inventory: send it the difference.
    Inventory {
        node: String,
        held: Vec<HeldObject>,
    },
    /// An edge connected (a KubeEdge edge, which sends no inventory, is compared with its
    /// ObjectSync records).
    Connected {
        node: String,
        capabilities: Capabilities,
    },
    Disconnected {
        node: String,
    },
    /// Hub events were missed: every connected node may have changed.
    HubLagged,
    /// synccontroller's periodic comparison of connected KubeEdge edges with their records.
    CompareRecorded,
    /// The answer to [`Fetch::PodsOf`], possibly in parts: the node's pods are known once
    /// the `complete` part is applied.
    PodsListed {
        node: String,
        generation: u64,
        pods: Vec<Pod>,
        complete: bool,
    },
    /// The answer to [`Fetch::Pods`].
    PodsFetched {
        node: String,
        keys: Vec<ObjectKey>,
        pods: Vec<Pod>,
    },
    /// The answer to [`Fetch::Configs`].
    ConfigsFetched {
        node: String,
        objects: Vec<Fetched>,
    },
}

/// The kinds the actor watches.
const WATCHED: [Kind; 4] = [Kind::Node, Kind::Pod, Kind::ConfigMap, Kind::Secret];

pub struct Downstream {
    hub: Arc<dyn HubSink>,
    fetch: mpsc::UnboundedSender<Fetch>,
    ready: Readiness,
    location: SharedLocation,
    /// What KubeEdge edges hold (ObjectSync records), when that mode is on.
    records: Option<SyncRecords>,
    /// Between comparisons of connected KubeEdge edges with their records.
    records_interval: Duration,
    /// Keys seen since the last `Init` of each watcher (to find deletions missed meanwhile).
    relisting: HashMap<Kind, HashSet<ObjectKey>>,
    synced: HashSet<Kind>,
    pods: pods::EdgePods,
    configmaps: configs::ConfigObjects,
    secrets: configs::ConfigObjects,
    resyncs: resync::Resyncs,
    /// `edgecontroller_resync_duration_seconds`, when metrics are kept.
    resync_duration: Option<prometheus_client::metrics::histogram::Histogram>,
    node_push: node_push::NodePush,
}

impl Downstream {
    /// A downstream actor sending through `hub` and asking for apiserver reads on `fetch`
    /// (performed by [`spawn_fetcher`], whose answers must be fed back to [`Self::apply`]).
    pub fn new(
        hub: Arc<dyn HubSink>,
        ready: Readiness,
        fetch: mpsc::UnboundedSender<Fetch>,
    ) -> Self {
        Downstream {
            hub,
            fetch,
            ready,
            location: SharedLocation::default(),
            records: None,
            records_interval: Duration::from_secs(30),
            relisting: HashMap::new(),
            synced: HashSet::new(),
            pods: pods::EdgePods::default(),
            configmaps: configs::ConfigObjects::default(),
            secrets: configs::ConfigObjects::default(),
            resyncs: resync::Resyncs::default(),
            resync_duration: None,
            node_push: node_push::NodePush::default(),
        }
    }

    /// Times every resync into `histogram`.
    pub fn with_resync_metric(
        mut self,
        histogram: prometheus_client::metrics::histogram::Histogram,
    ) -> Self {
        self.resync_duration = Some(histogram);
        self
    }

    /// The location cache this actor keeps, for readers elsewhere.
    pub fn location(&self) -> SharedLocation {
        self.location.clone()
    }

    /// Serves KubeEdge edges from their ObjectSync records (`controller/objectsync`): on
    /// connect and every `interval` they get exactly what differs from their records.
    pub fn with_sync_records(mut self, records: Option<SyncRecords>, interval: Duration) -> Self {
        self.records = records;
        self.records_interval = interval.max(Duration::from_millis(100));
        self
    }

    /// Runs until `shutdown`: watchers, hub events, inventories and fetch answers in one loop.
    pub async fn run(
        mut self,
        client: kube::Client,
        mut hub_events: broadcast::Receiver<NodeEvent>,
        mut inputs: mpsc::Receiver<Input>,
        shutdown: CancellationToken,
    ) {
        let (watch_tx, mut watched) = mpsc::channel(1024);
        let watchers = [
            tokio::spawn(
                watch::Watch {
                    api: Api::<Node>::all(client.clone()),
                    labels: Some(EDGE_NODE_LABEL),
                    wrap: Input::Node,
                    watched: Kind::Node,
                }
                .run(watch_tx.clone(), shutdown.clone()),
            ),
            tokio::spawn(
                watch::Watch {
                    api: Api::<Pod>::all(client.clone()),
                    labels: None,
                    wrap: Input::Pod,
                    watched: Kind::Pod,
                }
                .run(watch_tx.clone(), shutdown.clone()),
            ),
            tokio::spawn(
                watch::Watch {
                    api: Api::<ConfigMap>::all(client.clone()),
                    labels: None,
                    wrap: Input::ConfigMap,
                    watched: Kind::ConfigMap,
                }
                .run(watch_tx.clone(), shutdown.clone()),
            ),
            tokio::spawn(
                watch::Watch {
                    api: Api::<Secret>::all(client.clone()),
                    labels: None,
                    wrap: Input::Secret,
                    watched: Kind::Secret,
                }
                .run(watch_tx, shutdown.clone()),
            ),
        ];
        let mut compare = tokio::time::interval(self.records_interval);
        compare.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        compare.reset();
        loop {
            let input = tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(input) = watched.recv() => input,
                Some(input) = inputs.recv() => input,
                _ = compare.tick(), if self.records.is_some() => Input::CompareRecorded,
                ev = hub_events.recv() => match ev {
                    Ok(NodeEvent::Connected { node, capabilities, .. }) => {
                        Input::Connected { node, capabilities }
                    }
                    Ok(NodeEvent::Disconnected { node, .. }) => Input::Disconnected { node },
                    Ok(NodeEvent::QueueOverflow { node }) => {
                        tracing::warn!(%node, "node queue overflowed; it will be resynchronised when it reconnects");
                        self.hub.disconnect(&node);
                        continue;
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "hub events lagged; resyncing every connected node");
                        Input::HubLagged
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            };
            self.apply(input);
        }
        for w in watchers {
            w.abort();
        }
    }

    /// Applies one input: updates the state and sends what follows from it.
    pub fn apply(&mut self, input: Input) {
        match input {
            Input::Node(ev) => self.on_node(ev),
            Input::Pod(ev) => self.on_pod(ev),
            Input::ConfigMap(ev) => self.on_config(ev, ConfigKind::ConfigMap),
            Input::Secret(ev) => self.on_config(ev, ConfigKind::Secret),
            Input::WatchError(what, e) => {
                tracing::warn!(watch = what, error = %e, "watch failed; retrying with backoff")
            }
            Input::Progress {
                watched,
                resource_version,
            } => self.progressed(watched, resource_version),
            Input::Inventory { node, held } => {
                self.request_resync(&node, resync::Held::Inventory(held))
            }
            Input::Connected { node, capabilities } => {
                if let Some(object) = self.node_push.connected(&node) {
                    self.send_node(&node, object);
                }
                if !capabilities.inventory_resync {
                    // KubeEdge edges send no inventory: what their records say they hold
                    // (nothing without records: then everything is pushed).
                    self.request_resync(&node, resync::Held::Records);
                }
            }
            Input::Disconnected { node } => {
                self.node_push.disconnected(&node);
                self.forget_session(&node)
            }
            Input::HubLagged => {
                for node in self.hub.connected_nodes() {
                    self.request_resync(&node, resync::Held::Unknown);
                }
            }
            Input::CompareRecorded => self.compare_recorded_edges(),
            Input::PodsListed {
                node,
                generation,
                pods,
                complete,
            } => self.pods_listed(&node, generation, pods, complete),
            Input::PodsFetched { node, keys, pods } => self.pods_fetched(&node, &keys, pods),
            Input::ConfigsFetched { node, objects } => self.configs_fetched(&node, objects),
        }
    }

    fn mark_synced(&mut self, w: Kind) {
        self.synced.insert(w);
        if self.all_synced() && !self.ready.is_ready() {
            tracing::info!("informers synced");
            self.location.set_synced();
            self.ready.set_ready();
        }
    }

    fn progressed(&mut self, watched: Kind, rv: u64) {
        let max = match watched {
            Kind::Pod => &mut self.pods.max_rv,
            Kind::ConfigMap => &mut self.configmaps.max_rv,
            Kind::Secret => &mut self.secrets.max_rv,
            _ => return,
        };
        *max = (*max).max(rv);
    }

    /// Every watcher has listed once.
    fn all_synced(&self) -> bool {
        WATCHED.iter().all(|k| self.synced.contains(k))
    }

    /// The edge's own Node, as KubeEdge v1.23's cloud sends it (`update` on `null/node/<name>`).
    fn send_node(&self, node: &str, object: Value) {
        let path = ResourcePath::object(None, ResourceType::Node, node);
        self.send_to(node, Operation::Update, path, object);
    }

    /// Sends object `ns`/`name` of type `ty` to `node`.
    fn send(
        &self,
        node: &str,
        op: Operation,
        ty: ResourceType,
        ns: &str,
        name: &str,
        object: Value,
    ) {
        self.send_to(node, op, ResourcePath::object(Some(ns), ty, name), object);
    }

    fn send_to(&self, node: &str, op: Operation, path: ResourcePath, object: Value) {
        if !self.hub.is_connected(node) {
            return; // reconciled on connect
        }
        let rv = object["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let msg = Message::new(source::EDGE_CONTROLLER, Group::Resource, op, &path, object)
            .with_resource_version(rv);
        // What was queued, for tracing a delivery (off unless `cloudcore=trace`).
        let traced = tracing::enabled!(tracing::Level::TRACE).then(|| {
            let uid = msg.object_uid().unwrap_or_default().to_string();
            let op = msg.route.operation.clone();
            (op, uid, msg.header.resource_version.clone())
        });
        match self.hub.send(node, msg) {
            Ok(queued) => {
                if let Some((op, uid, rv)) = traced {
                    tracing::trace!(node, %op, %path, uid, rv, ?queued, "downstream message");
                }
            }
            Err(e) => tracing::debug!(node, error = %e, "downstream message not queued"),
        }
    }
}

fn object_key(meta: &kube::api::ObjectMeta) -> ObjectKey {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

fn parse_rv(rv: Option<&str>) -> u64 {
    rv.and_then(|r| r.parse().ok()).unwrap_or(0)
}
