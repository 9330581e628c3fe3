//! Services at the edge (`modules.edgeMesh`): edgecore's side of the `kubeedge-edgemesh`
//! crate. It converts the configuration, keeps Services and EndpointSlices in the edge
//! database through two standing MetaServer watches (the cloud's dynamic controller sends
//! their changes while connected; the database serves them offline), reads them with
//! in-process informers, and tells edgemesh the state of this node's pods as edged sees it.

use crate::config::EdgeCoreConfig;
use crate::metaserver::informer::{Informer, InformerEvent, Update};
use crate::metaserver::{MetaServer, StandingWatch};
use kubeedge_edgemesh::dns::{DnsConfig, upstreams_from_resolv_conf};
use kubeedge_edgemesh::mesh::{EdgeMesh, MeshConfig, MeshError, MeshInput, ProxyConfig};
use kubeedge_edgemesh::model::ModelError;
use kubeedge_edgemesh::proxy::iptables::Iptables;
use kubeedge_edgemesh::proxy::relay::RelayDialer;
use kubeedge_edgemesh::proxy::rules::Cidr;
use kubeedge_edgemesh::{EndpointSlice, LocalPod, Service};
use serde_json::Value;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The dummy interface carrying `listenAddress` (EdgeMesh's name).
pub(crate) const LINK: &str = "edgemesh0";

/// The kinds edgemesh reads: Services and EndpointSlices, cluster-wide.
pub(crate) fn standing_watches() -> Vec<StandingWatch> {
    vec![
        StandingWatch {
            group: String::new(),
            version: "v1".into(),
            resource: "services".into(),
        },
        StandingWatch {
            group: "discovery.k8s.io".into(),
            version: "v1".into(),
            resource: "endpointslices".into(),
        },
    ]
}

/// An upstream resolver: `IP` (port 53) or `IP:port`.
pub(crate) fn parse_upstream(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    s.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| format!("{s:?} is not an IP address or IP:port"))
}

/// The DNS address pods get with `dnsPolicy: ClusterFirst` when `clusterDNS` is empty.
pub(crate) fn cluster_dns(c: &EdgeCoreConfig) -> Option<String> {
    let m = &c.modules.edge_mesh;
    (m.enable && m.dns.enable && m.dns.port == 53).then(|| m.listen_address.clone())
}

/// The edgemesh settings of a validated configuration; `None` when it is disabled.
pub(crate) fn mesh_config(c: &EdgeCoreConfig) -> Result<Option<MeshConfig>, String> {
    let m = &c.modules.edge_mesh;
    if !m.enable {
        return Ok(None);
    }
    let ip: Ipv4Addr = m.listen_address.parse().map_err(|_| {
        format!(
            "modules.edgeMesh.listenAddress {:?} is not an IPv4 address",
            m.listen_address
        )
    })?;
    let kubelet = &c.modules.edged.tailored_kubelet_config;
    let dns = if m.dns.enable {
        let upstreams = if m.dns.upstream_servers.is_empty() {
            let text = std::fs::read_to_string(&kubelet.resolv_conf).unwrap_or_default();
            upstreams_from_resolv_conf(&text, &[IpAddr::V4(ip)])
        } else {
            m.dns
                .upstream_servers
                .iter()
                .map(|u| parse_upstream(u))
                .collect::<Result<Vec<_>, _>>()?
        };
        if upstreams.is_empty() {
            tracing::warn!(resolv_conf = %kubelet.resolv_conf, "no upstream DNS server: names outside the cluster will not resolve at the edge (set modules.edgeMesh.dns.upstreamServers)");
        }
        Some(DnsConfig {
            listen: SocketAddr::new(IpAddr::V4(ip), m.dns.port),
            cluster_domain: kubelet.cluster_domain.clone(),
            ttl: m.dns.ttl,
            upstreams,
            forward_timeout: Duration::from_secs(2),
            ..DnsConfig::default()
        })
    } else {
        None
    };
    let proxy = if m.proxy.enable {
        let direct = m
            .proxy
            .direct_cidrs
            .iter()
            .map(|s| Cidr::parse(s))
            .collect::<Result<Vec<_>, _>>()?;
        Some(ProxyConfig {
            prefix: m.proxy.chain_prefix.clone(),
            relay: (m.proxy.relay_port != 0).then(|| SocketAddrV4::new(ip, m.proxy.relay_port)),
            direct,
            min_sync_interval: m.proxy.min_sync_period.0,
            iptables: Iptables::new(&m.proxy.chain_prefix),
        })
    } else {
        None
    };
    Ok(Some(MeshConfig {
        node: c.node_name().to_string(),
        dns,
        proxy,
    }))
}

/// Removes what edgemesh left on the machine (`edgecore reset`): its iptables chains and the
/// listen address.
pub fn cleanup(c: &EdgeCoreConfig) -> Result<(), String> {
    let m = &c.modules.edge_mesh;
    if let Ok(ip) = m.listen_address.parse::<IpAddr>() {
        crate::metaserver::dummy::remove(LINK, ip);
    }
    Iptables::new(&m.proxy.chain_prefix)
        .cleanup()
        .map_err(|e| e.to_string())
}

/// The running edgemesh with its feeders.
pub(crate) struct Mesh {
    mesh: EdgeMesh,
    pods: Arc<PodFeed>,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Mesh {
    /// Puts the listen address on `edgemesh0` (or `lo`), starts edgemesh and feeds it from
    /// the MetaServer's informers.
    pub async fn start(
        config: MeshConfig,
        metaserver: &MetaServer,
        dialer: Option<Arc<dyn RelayDialer>>,
        create_link: bool,
    ) -> Result<Mesh, MeshError> {
        let listen = config.dns.as_ref().map(|d| d.listen.ip()).or_else(|| {
            config
                .proxy
                .as_ref()
                .and_then(|p| p.relay.map(|r| IpAddr::V4(*r.ip())))
        });
        if create_link
            && let Some(ip) = listen
            && let Err(e) = crate::metaserver::dummy::ensure_on(LINK, ip)
        {
            tracing::error!(error = %e, "edgemesh's address not set up; pods cannot reach its DNS at {ip}");
        }
        let mesh = EdgeMesh::start(config, dialer).await?;
        let cancel = CancellationToken::new();
        let inputs = mesh.inputs();
        let mut tasks = Vec::new();
        let [services, slices] = {
            let w = standing_watches();
            [metaserver.informer(&w[0]), metaserver.informer(&w[1])]
        };
        tasks.push(tokio::spawn(feed_kind::<Service>(
            services,
            inputs.clone(),
            cancel.clone(),
        )));
        tasks.push(tokio::spawn(feed_kind::<EndpointSlice>(
            slices,
            inputs.clone(),
            cancel.clone(),
        )));
        let pods = Arc::new(PodFeed::default());
        tasks.push(tokio::spawn(feed_pods(
            pods.clone(),
            inputs,
            cancel.clone(),
        )));
        Ok(Mesh {
            mesh,
            pods,
            cancel,
            tasks,
        })
    }

    /// What edged tells about this node's pods.
    pub fn pod_observer(&self) -> Arc<dyn kubeedge_edged::PodObserver> {
        self.pods.clone()
    }

    pub fn edgemesh(&self) -> &EdgeMesh {
        &self.mesh
    }

    pub async fn shutdown(self) {
        self.cancel.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        self.mesh.shutdown().await;
    }
}

/// An object kind edgemesh is fed from the edge database.
trait Fed: Sized {
    /// For logs.
    const NAME: &'static str;
    fn from_json(json: &str) -> Result<Self, ModelError>;
    fn applied(self) -> MeshInput;
    fn deleted(self) -> MeshInput;
    fn listed(all: Vec<Self>) -> MeshInput;
}

impl Fed for Service {
    const NAME: &'static str = "Service";
    fn from_json(json: &str) -> Result<Self, ModelError> {
        Service::from_json(json)
    }
    fn applied(self) -> MeshInput {
        MeshInput::Service(self)
    }
    fn deleted(self) -> MeshInput {
        MeshInput::ServiceGone(self.key)
    }
    fn listed(all: Vec<Self>) -> MeshInput {
        MeshInput::ServicesListed(all)
    }
}

impl Fed for EndpointSlice {
    const NAME: &'static str = "EndpointSlice";
    fn from_json(json: &str) -> Result<Self, ModelError> {
        EndpointSlice::from_json(json)
    }
    fn applied(self) -> MeshInput {
        MeshInput::Slice(self)
    }
    fn deleted(self) -> MeshInput {
        MeshInput::SliceGone(self.key)
    }
    fn listed(all: Vec<Self>) -> MeshInput {
        MeshInput::SlicesListed(all)
    }
}

/// One stored object as a mesh input (objects that do not parse are logged and skipped:
/// the API server validated them, so only a broken database row could be one).
fn to_input<K: Fed>(json: &str, deleted: bool) -> Option<MeshInput> {
    match K::from_json(json) {
        Ok(o) if deleted => Some(o.deleted()),
        Ok(o) => Some(o.applied()),
        Err(e) => {
            tracing::warn!(kind = K::NAME, error = %e, "stored object not usable by edgemesh; skipped");
            None
        }
    }
}

async fn feed_kind<K: Fed>(
    mut informer: Informer,
    inputs: mpsc::Sender<MeshInput>,
    cancel: CancellationToken,
) {
    loop {
        let update = tokio::select! {
            _ = cancel.cancelled() => return,
            u = informer.next() => u,
        };
        let batch: Vec<MeshInput> = match update {
            None => return,
            Some(Err(e)) => {
                tracing::warn!(kind = K::NAME, error = %e, "reading the edge database for edgemesh failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Some(Ok(Update::Listed(objects))) => vec![K::listed(
                objects
                    .iter()
                    .filter_map(|o| K::from_json(o).ok())
                    .collect(),
            )],
            Some(Ok(Update::Changes(events))) => events
                .iter()
                .filter_map(|e| match e {
                    InformerEvent::Applied(j) => to_input::<K>(j, false),
                    InformerEvent::Deleted(j) => to_input::<K>(j, true),
                })
                .collect(),
        };
        for input in batch {
            if inputs.send(input).await.is_err() {
                return;
            }
        }
    }
}

/// The latest state of each local pod, coalesced (bounded by the number of pods), for the
/// feeder task: edged never waits on edgemesh.
#[derive(Default)]
struct PodFeed {
    pending: Mutex<HashMap<Arc<str>, Option<LocalPod>>>,
    /// What was last sent, to skip reports that change nothing edgemesh uses.
    sent: Mutex<HashMap<Arc<str>, LocalPod>>,
    listed: AtomicBool,
    wake: Notify,
}

impl kubeedge_edged::PodObserver for PodFeed {
    fn pod_status(&self, pod: &Value, status: &Value) {
        let status = status.is_object().then_some(status);
        let p = match LocalPod::from_value(pod, status) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "pod not usable by edgemesh");
                return;
            }
        };
        if self
            .sent
            .lock()
            .map(|s| s.get(&p.uid) == Some(&p))
            .unwrap_or(false)
        {
            return;
        }
        if let Ok(mut m) = self.pending.lock() {
            m.insert(p.uid.clone(), Some(p));
        }
        self.wake.notify_one();
    }

    fn pod_gone(&self, uid: &str) {
        if let Ok(mut m) = self.pending.lock() {
            m.insert(uid.into(), None);
        }
        self.wake.notify_one();
    }

    fn pods_listed(&self) {
        self.listed.store(true, Ordering::Release);
        self.wake.notify_one();
    }
}

async fn feed_pods(feed: Arc<PodFeed>, inputs: mpsc::Sender<MeshInput>, cancel: CancellationToken) {
    let mut told_listed = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = feed.wake.notified() => {}
        }
        // Read before draining: every pod reported before the list was complete is drained.
        let listed = feed.listed.load(Ordering::Acquire);
        let pending: Vec<(Arc<str>, Option<LocalPod>)> = match feed.pending.lock() {
            Ok(mut m) => m.drain().collect(),
            Err(_) => return,
        };
        for (uid, state) in pending {
            let input = match state {
                Some(p) => {
                    if let Ok(mut s) = feed.sent.lock() {
                        s.insert(uid, p.clone());
                    }
                    MeshInput::Pod(p)
                }
                None => {
                    if let Ok(mut s) = feed.sent.lock() {
                        s.remove(&uid);
                    }
                    MeshInput::PodGone(uid)
                }
            };
            if inputs.send(input).await.is_err() {
                return;
            }
        }
        // After the pods the database listed: their endpoints are known before the slices'
        // entries for this node stop counting.
        if !told_listed && listed {
            told_listed = true;
            if inputs.send(MeshInput::LocalPodsKnown).await.is_err() {
                return;
            }
        }
    }
}
