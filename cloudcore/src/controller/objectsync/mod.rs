//! Delivery state for real KubeEdge edges: ObjectSync / ClusterObjectSync records kept exactly
//! as KubeEdge's cloudhub and synccontroller keep them (protocol §3.2–§3.6).
//!
//! Our own edgecore sends an inventory on connect and needs no record (zero apiserver writes per
//! delivery). A KubeEdge edgecore sends none, so for nodes without the `inventory-resync`
//! capability cloudcore records every acknowledged delivery as KubeEdge does:
//!
//! * [`writer`]: an ACK of a group-`resource` message carrying an object → get-or-create
//!   `<node>.<uid>` (`ObjectSync` in the object's namespace, `ClusterObjectSync` for
//!   cluster-scoped objects) and set `status.objectResourceVersion` through the status
//!   subresource; an ACK of a `delete` → delete the record. Asynchronous, bounded concurrency,
//!   one write per record at a time with only the newest version kept, retried with backoff;
//!   the hub is never blocked (reports beyond the channel bound are dropped and counted).
//! * [`records`]: one cluster-wide watcher per kind keeps all records in memory. Downstream asks
//!   it what a KubeEdge edge holds ([`SyncRecords::held_by`]) on connect and every
//!   `modules.syncController.resyncInterval`, and sends exactly what synccontroller would:
//!   `delete` (stub content) for recorded objects that are gone or were replaced (UID differs),
//!   `update` for objects newer than the recorded version — and nothing for objects already
//!   delivered. Without the CRDs one warning is logged, retried slowly; readiness does not wait.
//! * [`orphans`]: on start and on every edge-node deletion, records of nodes that no longer
//!   exist are deleted — by one replica only, the holder of Lease `cloudcore-synccontroller`.

pub(crate) mod orphans;
pub(crate) mod records;
pub(crate) mod writer;

use crate::cloudhub::CloudHub;
use crate::controller::kind::Kind;
use crate::leader::ElectionConfig;
use crate::metrics::SyncMetrics;
use kube::api::ApiResource;
pub use records::SyncRecords;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Lease that elects the replica doing once-only synccontroller work.
pub const LEASE_NAME: &str = "cloudcore-synccontroller";

/// Where a record lives: `ObjectSync` in `namespace`, or `ClusterObjectSync` when `None`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordKey {
    pub namespace: Option<String>,
    /// `<node>.<objectUID>`.
    pub name: String,
}

impl RecordKey {
    pub fn new(namespace: Option<&str>, node: &str, uid: &str) -> RecordKey {
        RecordKey {
            namespace: namespace.map(str::to_string),
            name: record_name(node, uid),
        }
    }

    /// Node and object UID: the name split at its last `.` (UIDs have none; node names may).
    pub fn node_and_uid(&self) -> Option<(&str, &str)> {
        self.name.rsplit_once('.')
    }
}

/// KubeEdge's `BuildObjectSyncName`.
pub fn record_name(node: &str, uid: &str) -> String {
    format!("{node}.{uid}")
}

/// `spec` of a record: which object it is about.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordSpec {
    pub api_version: String,
    pub kind: String,
    pub object_name: String,
}

/// ObjectSync, or ClusterObjectSync for cluster-scoped objects.
pub fn api_resource(cluster_scoped: bool) -> ApiResource {
    if cluster_scoped {
        Kind::ClusterObjectSync.api_resource()
    } else {
        Kind::ObjectSync.api_resource()
    }
}

/// `modules.syncController` as cloudcore runs it.
#[derive(Debug, Clone)]
pub struct SyncOptions {
    /// Off: no records, no watchers, KubeEdge edges get a full push on connect only.
    pub enable: bool,
    /// Between comparisons of connected KubeEdge edges' records with the cluster.
    pub resync_interval: Duration,
    /// Between checks for the CRDs while they are not installed.
    pub crd_retry: Duration,
    /// Record writes in flight at once.
    pub write_concurrency: usize,
    /// ACK reports buffered between cloudhub and the writer.
    pub ack_buffer: usize,
    pub election: ElectionConfig,
    /// `featureGates.requireAuthorization` (KubeEdge's gate for its policycontroller): the
    /// RBAC rules of the service accounts an edge's pods use are sent to that edge as
    /// ServiceAccountAccess objects, for its MetaServer. Off by default, as in KubeEdge.
    pub policy: bool,
    /// `modules.taskManager.enable`: node tasks (ImagePrePullJobs) run.
    pub node_tasks: bool,
}

impl SyncOptions {
    /// ObjectSync settings from `modules.syncController` (leader election from the
    /// environment).
    pub fn from_cloudcore(c: &crate::config::CloudCoreConfig) -> Self {
        let sc = &c.modules.sync_controller;
        SyncOptions {
            enable: sc.enable,
            resync_interval: std::time::Duration::from_secs(sc.resync_interval.max(1)),
            policy: c.feature_gates.get("requireAuthorization") == Some(&true),
            node_tasks: c.modules.task_manager.enable,
            ..Default::default()
        }
    }
}

impl Default for SyncOptions {
    fn default() -> Self {
        SyncOptions {
            enable: true,
            resync_interval: Duration::from_secs(DEFAULT_RESYNC_INTERVAL_SECS),
            crd_retry: Duration::from_secs(60),
            write_concurrency: 16,
            ack_buffer: 16_384,
            election: ElectionConfig::new(LEASE_NAME),
            policy: false,
            node_tasks: false,
        }
    }
}

/// KubeEdge compares every 5 s. Here a reconnecting edge is compared at once (on connect) and a
/// connected edge's queue never loses a message, so the periodic pass is only a safety net.
pub use kubeedge_shared::constants::DEFAULT_RESYNC_INTERVAL_SECS;

/// Starts the records cache, the ACK writer and the orphan cleanup (with its leader election).
/// Returns the cache downstream reads, or `None` when disabled.
pub fn start(
    client: kube::Client,
    hub: &CloudHub,
    options: &SyncOptions,
    metrics: SyncMetrics,
    shutdown: CancellationToken,
) -> Option<SyncRecords> {
    if !options.enable {
        tracing::info!("syncController disabled: no ObjectSync records for KubeEdge edges");
        return None;
    }
    let records = SyncRecords::new(metrics.clone());
    tokio::spawn(
        records
            .clone()
            .run(client.clone(), options.crd_retry, shutdown.clone()),
    );
    let acks = hub.subscribe_acks(options.ack_buffer);
    tokio::spawn(
        writer::RecordWriter::new(
            client.clone(),
            records.clone(),
            options.write_concurrency,
            metrics,
        )
        .run(acks, shutdown.clone()),
    );
    let leadership =
        crate::leader::spawn(client.clone(), options.election.clone(), shutdown.clone());
    tokio::spawn(orphans::run(client, records.clone(), leadership, shutdown));
    Some(records)
}
