//! The running edgemesh: one task owns the [`Catalog`] and publishes a [`Snapshot`] after
//! each batch of inputs; the DNS server, the rule sync and the relay read the newest one.

use crate::catalog::{Catalog, Snapshot};
use crate::model::{EndpointSlice, Key, LocalPod, Service};
use crate::proxy::iptables::Iptables;
use crate::proxy::relay::{Relay, RelayDialer, RelayMetrics};
use crate::proxy::rules::{Cidr, RuleSettings};
use crate::proxy::{RuleMetrics, run_rule_sync};
use prometheus_client::metrics::gauge::Gauge;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What edgecore tells edgemesh.
#[derive(Debug, Clone)]
pub enum MeshInput {
    /// Every Service (at start, from the edge database, and after a relist): what is not
    /// listed is gone. Rules are applied only once both kinds were listed.
    ServicesListed(Vec<Service>),
    /// Every EndpointSlice, likewise.
    SlicesListed(Vec<EndpointSlice>),
    Service(Service),
    ServiceGone(Key),
    Slice(EndpointSlice),
    SliceGone(Key),
    /// Edged reports this node's pods from now on.
    LocalPodsKnown,
    Pod(LocalPod),
    /// The pod with this UID is gone from the node.
    PodGone(Arc<str>),
}

#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Chain name prefix (`KE`).
    pub prefix: String,
    /// Relay listener; `None`: endpoints on unroutable nodes are not reached.
    pub relay: Option<SocketAddrV4>,
    /// Remote endpoint addresses dialled directly.
    pub direct: Vec<Cidr>,
    /// Rules are updated at most this often.
    pub min_sync_interval: Duration,
    pub iptables: Iptables,
}

#[derive(Debug, Clone)]
pub struct MeshConfig {
    pub node: String,
    pub dns: Option<crate::dns::DnsConfig>,
    pub proxy: Option<ProxyConfig>,
}

#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    #[error(transparent)]
    Dns(#[from] crate::dns::DnsError),
    #[error(
        "cannot listen on {addr} for the relay (modules.edgeMesh.relayPort): {source}; is another edgecore or EdgeMesh agent running?"
    )]
    RelayBind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Inputs waiting for the catalog at most; edgecore's senders wait beyond.
pub const INPUT_QUEUE: usize = 1024;

#[derive(Default, Clone)]
pub struct CatalogMetrics {
    pub services: Gauge,
    pub slices: Gauge,
    pub backends: Gauge,
}

pub struct EdgeMesh {
    inputs: mpsc::Sender<MeshInput>,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    dns: Option<crate::dns::DnsServer>,
    relay_addr: Option<SocketAddr>,
    catalog_metrics: CatalogMetrics,
    rule_metrics: RuleMetrics,
    relay_metrics: RelayMetrics,
}

impl EdgeMesh {
    /// Starts the catalog, the DNS server, the rule sync and the relay (`dialer` reaches
    /// backends on other nodes).
    pub async fn start(
        config: MeshConfig,
        dialer: Option<Arc<dyn RelayDialer>>,
    ) -> Result<EdgeMesh, MeshError> {
        let (inputs, rx) = mpsc::channel(INPUT_QUEUE);
        let (snap_tx, snapshots) = watch::channel(Arc::new(Snapshot::default()));
        let cancel = CancellationToken::new();
        let catalog_metrics = CatalogMetrics::default();
        let rule_metrics = RuleMetrics::default();
        let relay_metrics = RelayMetrics::default();
        let mut tasks = Vec::new();
        let dns = match config.dns.clone() {
            Some(d) => Some(crate::dns::DnsServer::start(d, snapshots.clone())?),
            None => None,
        };
        let (loaded_tx, loaded_rx) = watch::channel(false);
        tasks.push(tokio::spawn(run_catalog(
            Catalog::new(&config.node),
            rx,
            snap_tx,
            loaded_tx,
            catalog_metrics.clone(),
            cancel.clone(),
        )));
        let mut relay_addr = None;
        if let Some(p) = config.proxy {
            let settings = RuleSettings {
                prefix: p.prefix.clone(),
                relay: p.relay.filter(|_| dialer.is_some()),
                direct: p.direct.clone(),
            };
            if let (Some(addr), Some(dialer)) = (settings.relay, dialer) {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| MeshError::RelayBind {
                        addr: addr.into(),
                        source,
                    })?;
                let (relay, task) = Relay::spawn(
                    listener,
                    snapshots.clone(),
                    settings.clone(),
                    dialer,
                    relay_metrics.clone(),
                    cancel.clone(),
                );
                relay_addr = Some(relay.local_addr());
                tasks.push(task);
            }
            let snaps = snapshots.clone();
            let metrics = rule_metrics.clone();
            let cancel2 = cancel.clone();
            tasks.push(tokio::spawn(async move {
                // No rules before the stored Services are loaded: an empty view would remove
                // the rules traffic uses across an edgecore restart.
                let mut loaded = loaded_rx;
                while !*loaded.borrow_and_update() {
                    tokio::select! {
                        _ = cancel2.cancelled() => return,
                        c = loaded.changed() => if c.is_err() { return },
                    }
                }
                run_rule_sync(
                    p.iptables,
                    settings,
                    snaps,
                    p.min_sync_interval,
                    metrics,
                    cancel2,
                )
                .await
            }));
        }
        tracing::info!(
            dns = ?dns.as_ref().map(|d| d.local_addr()),
            relay = ?relay_addr,
            "edgemesh started (Services at the edge)"
        );
        Ok(EdgeMesh {
            inputs,
            snapshots,
            cancel,
            tasks,
            dns,
            relay_addr,
            catalog_metrics,
            rule_metrics,
            relay_metrics,
        })
    }

    /// Where edgecore sends Services, EndpointSlices and local pods.
    pub fn inputs(&self) -> mpsc::Sender<MeshInput> {
        self.inputs.clone()
    }

    pub fn snapshots(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.snapshots.clone()
    }

    pub fn dns_addr(&self) -> Option<SocketAddr> {
        self.dns.as_ref().map(|d| d.local_addr())
    }

    pub fn relay_addr(&self) -> Option<SocketAddr> {
        self.relay_addr
    }

    pub fn register_metrics(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "edgemesh_services",
            "Services known at the edge",
            self.catalog_metrics.services.clone(),
        );
        r.register(
            "edgemesh_endpointslices",
            "EndpointSlices known at the edge",
            self.catalog_metrics.slices.clone(),
        );
        r.register(
            "edgemesh_backends",
            "Backends of all Service ports",
            self.catalog_metrics.backends.clone(),
        );
        self.rule_metrics.register(r);
        self.relay_metrics.register(r);
        if let Some(d) = &self.dns {
            d.metrics().register(r);
        }
    }

    /// Stops serving; the rules stay (see [`crate::proxy`]).
    pub async fn shutdown(self) {
        self.cancel.cancel();
        if let Some(d) = self.dns {
            d.shutdown().await;
        }
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Inputs applied per snapshot at most (a burst of changes makes one snapshot, not many).
const BATCH: usize = 512;

async fn run_catalog(
    mut catalog: Catalog,
    mut rx: mpsc::Receiver<MeshInput>,
    snapshots: watch::Sender<Arc<Snapshot>>,
    loaded: watch::Sender<bool>,
    metrics: CatalogMetrics,
    cancel: CancellationToken,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let (mut services_listed, mut slices_listed) = (false, false);
    loop {
        batch.clear();
        let n = tokio::select! {
            _ = cancel.cancelled() => return,
            n = rx.recv_many(&mut batch, BATCH) => n,
        };
        if n == 0 {
            return;
        }
        for input in batch.drain(..) {
            match input {
                MeshInput::ServicesListed(services) => {
                    catalog.replace_services(services);
                    services_listed = true;
                }
                MeshInput::SlicesListed(slices) => {
                    catalog.replace_slices(slices);
                    slices_listed = true;
                }
                MeshInput::Service(s) => catalog.apply_service(s),
                MeshInput::ServiceGone(k) => catalog.delete_service(&k),
                MeshInput::Slice(s) => catalog.apply_slice(s),
                MeshInput::SliceGone(k) => catalog.delete_slice(&k),
                MeshInput::LocalPodsKnown => catalog.set_local_pods_known(),
                MeshInput::Pod(p) => catalog.apply_pod(p),
                MeshInput::PodGone(uid) => catalog.remove_pod(&uid),
            }
        }
        let snapshot = catalog.snapshot();
        // Once both kinds were listed, whether or not this batch changed anything.
        if services_listed && slices_listed && !*loaded.borrow() {
            loaded.send_replace(true);
        }
        if let Some(snap) = snapshot {
            metrics.services.set(catalog.service_count() as i64);
            metrics.slices.set(catalog.slice_count() as i64);
            metrics.backends.set(snap.backend_count() as i64);
            snapshots.send_replace(Arc::new(snap));
        }
    }
}
