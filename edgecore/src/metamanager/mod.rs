//! metamanager: the edge's local source of truth (protocol §5.2, §5.3).
//!
//! * Objects from the cloud (`insert`/`update`/`delete`, and query replies that carry objects)
//!   are written to SQLite ([`MetaStore`]); only after the write is durable are they handed to
//!   edged ([`ObjectChange`] on a bounded channel) and acknowledged to the cloud. A write that
//!   fails is never acknowledged: the cloud resends, and re-delivery is idempotent.
//! * edged talks to it through [`MetaClient`] (typed calls; the messages KubeEdge's kubelet
//!   bridge would send are built inside): reads come from the cloud when it is reachable and
//!   from the database otherwise; writes that need the API server go to the cloud and fail
//!   fast while offline.
//! * On every connect it sends the cloud an inventory of the database (see
//!   `edgecore/INVENTORY.md`).

pub(crate) mod changes;
mod process;
pub(crate) mod store;
mod store_access;
pub(crate) mod tokens;

pub use changes::{ChangeSink, V2Change};
pub use kubeedge_edged::meta::{
    ChangeAction, MetaCall, MetaClient, MetaError, MetaRequest, ObjectChange, edged_acts_on,
};
pub use store::{DeleteOutcome, MetaRecord, MetaStore, StoreError, UpsertOutcome};

use crate::edgehub::{CloudLink, HubError};
use kubeedge_shared::{Message, ResourceType};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Whether edged queries this type from the cloud when connected (KubeEdge
/// `requireRemoteQuery`).
pub fn is_remote_query_type(t: &ResourceType) -> bool {
    matches!(
        t,
        ResourceType::ConfigMap
            | ResourceType::Secret
            | ResourceType::PersistentVolume
            | ResourceType::PersistentVolumeClaim
            | ResourceType::VolumeAttachment
            | ResourceType::Node
            | ResourceType::ServiceAccountToken
            | ResourceType::Lease
    )
}

#[derive(Debug, Clone)]
pub struct MetaManagerConfig {
    /// The node name (`edged.hostnameOverride`).
    pub node_name: String,
    /// Namespace token of node resources (`edged.registerNodeNamespace`, default `default`).
    pub node_namespace: String,
    /// How long a request to the cloud may wait for its reply (`remoteQueryTimeout`).
    pub remote_query_timeout: Duration,
    /// Send the inventory on every connect (the cloud advertises nothing, so this is config).
    pub inventory_resync: bool,
    /// Cloud messages being written / awaiting their ACK at once, at most. Beyond it reading
    /// from edgehub pauses (and with it reading from the cloud).
    pub max_inflight: usize,
    /// Capacity of the channel to edged; a full channel pauses processing (never drops).
    pub edged_capacity: usize,
    /// edged requests queued for the metamanager, at most.
    pub request_capacity: usize,
    /// edged requests being served at once, at most.
    pub max_concurrent_requests: usize,
}

impl MetaManagerConfig {
    /// metamanager's settings from `modules.metaManager` of a configuration.
    pub fn from_edgecore(c: &crate::config::EdgeCoreConfig) -> MetaManagerConfig {
        let mm = &c.modules.meta_manager;
        MetaManagerConfig {
            node_name: c.node_name().to_string(),
            node_namespace: c.modules.edged.register_node_namespace.clone(),
            remote_query_timeout: Duration::from_secs(mm.remote_query_timeout.max(1) as u64),
            inventory_resync: c.kubeedge_rs_settings().inventory_resync,
            ..MetaManagerConfig::default()
        }
    }
}

impl Default for MetaManagerConfig {
    fn default() -> Self {
        MetaManagerConfig {
            node_name: String::new(),
            node_namespace: "default".into(),
            remote_query_timeout: Duration::from_secs(60),
            inventory_resync: true,
            max_inflight: 256,
            edged_capacity: 1024,
            request_capacity: 256,
            max_concurrent_requests: 64,
        }
    }
}

/// A device or device model the cloud sent, after its write is durable (for devicetwin).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceObject {
    /// [`ResourceType::Device`] or [`ResourceType::DeviceModel`].
    pub resource_type: ResourceType,
    pub action: ChangeAction,
    pub namespace: String,
    pub name: String,
    /// The object (on deletes it may carry only `metadata`).
    pub object: Value,
}

/// A request from edged and where to put the answer (metamanager serves
/// [`kubeedge_edged::meta::MetaService`] over a channel of these).
pub(crate) type EdgedRequest = MetaCall;

impl From<HubError> for MetaError {
    fn from(e: HubError) -> Self {
        match e {
            HubError::NotConnected => MetaError::NotConnected,
            HubError::Disconnected | HubError::Timeout(_) => MetaError::Link(e.to_string()),
            HubError::Shutdown => MetaError::Stopped,
        }
    }
}

impl From<StoreError> for MetaError {
    fn from(e: StoreError) -> Self {
        MetaError::Store(e.to_string())
    }
}

/// The running metamanager.
pub struct MetaManager {
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl MetaManager {
    /// Starts processing `from_cloud` (edgehub's receiver) and edged's requests. Returns the
    /// client edged uses and the channel of database changes edged consumes.
    pub fn start<L: CloudLink>(
        config: MetaManagerConfig,
        store: MetaStore,
        link: L,
        from_cloud: mpsc::Receiver<Message>,
    ) -> (MetaManager, MetaClient, mpsc::Receiver<ObjectChange>) {
        Self::start_with_devices(config, store, link, from_cloud, None)
    }

    /// Like [`MetaManager::start`], handing the devices and device models it stored to
    /// devicetwin on `devices`.
    pub fn start_with_devices<L: CloudLink>(
        config: MetaManagerConfig,
        store: MetaStore,
        link: L,
        from_cloud: mpsc::Receiver<Message>,
        devices: Option<mpsc::Sender<DeviceObject>>,
    ) -> (MetaManager, MetaClient, mpsc::Receiver<ObjectChange>) {
        let (edged_tx, edged_rx) = mpsc::channel(config.edged_capacity.max(1));
        let (req_tx, req_rx) = mpsc::channel(config.request_capacity.max(1));
        let client = MetaClient::new(Arc::new(req_tx), &config.node_name, &config.node_namespace);
        let link_events = link.subscribe();
        let cancel = CancellationToken::new();
        let ctx = Arc::new(process::Context::new(
            config, store, link, edged_tx, devices,
        ));
        let task = tokio::spawn(process::run(
            ctx,
            from_cloud,
            req_rx,
            link_events,
            cancel.clone(),
        ));
        (MetaManager { cancel, task }, client, edged_rx)
    }

    /// Stops taking new work, lets writes in progress finish (and be acknowledged when the
    /// link is up), then returns.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}
