//! The relay: a TCP listener the ClusterIP rules send connections to when the chosen backend
//! runs on another node this one cannot route to. It reads the address the client dialled
//! (the ClusterIP and port, `SO_ORIGINAL_DST` after the DNAT), picks one of that Service
//! port's relayed backends (keeping ClientIP affinity), and joins the client to a stream a
//! [`RelayDialer`] opens to the backend — through the cloud, edge → cloudcore → edge.

use crate::catalog::{Backend, Snapshot};
use crate::model::Protocol;
use crate::proxy::rules::{Route, RuleSettings, route};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

/// A byte stream to a backend.
pub trait RelayStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> RelayStream for T {}

/// Where a relayed connection goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayTarget {
    /// The node the backend runs on.
    pub node: Arc<str>,
    pub addr: SocketAddr,
}

pub type DialFuture =
    Pin<Box<dyn Future<Output = Result<Box<dyn RelayStream>, String>> + Send + 'static>>;

/// Opens streams to backends on other nodes (edgecore: through the cloud's stream tunnel).
pub trait RelayDialer: Send + Sync + 'static {
    fn dial(&self, target: RelayTarget) -> DialFuture;
}

/// Dials backends directly (a userspace proxy; for tests and measurements).
pub struct DirectDialer;

impl RelayDialer for DirectDialer {
    fn dial(&self, target: RelayTarget) -> DialFuture {
        Box::pin(async move {
            let s = TcpStream::connect(target.addr)
                .await
                .map_err(|e| format!("connect {}: {e}", target.addr))?;
            let _ = s.set_nodelay(true);
            Ok(Box::new(s) as Box<dyn RelayStream>)
        })
    }
}

/// Connections relayed at once at most (each holds two sockets).
pub const MAX_CONNECTIONS: usize = 4096;
/// How long one dial may take.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// Backends tried per connection.
const ATTEMPTS: usize = 3;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

/// What became of a relayed connection (the `outcome` label).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Outcome {
    Relayed,
    NoService,
    NoBackend,
    DialFailed,
    Overloaded,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Relayed => "relayed",
            Outcome::NoService => "no_service",
            Outcome::NoBackend => "no_backend",
            Outcome::DialFailed => "dial_failed",
            Outcome::Overloaded => "overloaded",
        }
    }
}

#[derive(Default, Clone)]
pub struct RelayMetrics {
    pub connections: Family<OutcomeLabel, Counter>,
    pub active: Gauge,
    pub bytes_up: Counter,
    pub bytes_down: Counter,
}

impl RelayMetrics {
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "edgemesh_relay_connections",
            "Connections the relay handled, by outcome",
            self.connections.clone(),
        );
        r.register(
            "edgemesh_relay_active_connections",
            "Connections being relayed now",
            self.active.clone(),
        );
        r.register(
            "edgemesh_relay_client_bytes",
            "Bytes from clients to relayed backends",
            self.bytes_up.clone(),
        );
        r.register(
            "edgemesh_relay_backend_bytes",
            "Bytes from relayed backends to clients",
            self.bytes_down.clone(),
        );
    }

    fn count(&self, outcome: Outcome) {
        self.connections
            .get_or_create(&OutcomeLabel {
                outcome: outcome.label(),
            })
            .inc();
    }
}

/// ClientIP affinity of relayed connections: client → backend, until it expires.
#[derive(Default)]
struct Affinity {
    entries: Mutex<HashMap<(IpAddr, SocketAddrV4), (SocketAddr, Instant)>>,
}

/// Entries kept at most (oldest dropped first when full).
const MAX_AFFINITY: usize = 65536;

impl Affinity {
    fn get(&self, client: IpAddr, service: SocketAddrV4) -> Option<SocketAddr> {
        let mut m = self.entries.lock().ok()?;
        match m.get(&(client, service)) {
            Some((b, until)) if *until > Instant::now() => Some(*b),
            Some(_) => {
                m.remove(&(client, service));
                None
            }
            None => None,
        }
    }

    fn set(&self, client: IpAddr, service: SocketAddrV4, backend: SocketAddr, secs: u32) {
        let Ok(mut m) = self.entries.lock() else {
            return;
        };
        if m.len() >= MAX_AFFINITY {
            let now = Instant::now();
            m.retain(|_, (_, until)| *until > now);
            if m.len() >= MAX_AFFINITY {
                m.clear();
            }
        }
        m.insert(
            (client, service),
            (
                backend,
                Instant::now() + Duration::from_secs(u64::from(secs)),
            ),
        );
    }
}

pub struct Relay {
    addr: SocketAddr,
}

impl Relay {
    /// Serves relayed connections on `listener` until `cancel`.
    pub fn spawn(
        listener: TcpListener,
        snapshots: watch::Receiver<Arc<Snapshot>>,
        settings: RuleSettings,
        dialer: Arc<dyn RelayDialer>,
        metrics: RelayMetrics,
        cancel: CancellationToken,
    ) -> (Relay, tokio::task::JoinHandle<()>) {
        let addr = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let shared = Arc::new(Shared {
            snapshots,
            settings,
            dialer,
            metrics,
            affinity: Affinity::default(),
            permits: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        });
        let task = tokio::spawn(accept_loop(listener, shared, cancel));
        (Relay { addr }, task)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

struct Shared {
    snapshots: watch::Receiver<Arc<Snapshot>>,
    settings: RuleSettings,
    dialer: Arc<dyn RelayDialer>,
    metrics: RelayMetrics,
    affinity: Affinity,
    permits: Arc<Semaphore>,
}

async fn accept_loop(listener: TcpListener, sh: Arc<Shared>, cancel: CancellationToken) {
    loop {
        let (client, peer) = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "relay accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = sh.permits.clone().try_acquire_owned() else {
            sh.metrics.count(Outcome::Overloaded);
            continue;
        };
        let sh = sh.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let _permit = permit;
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = serve(&sh, client, peer) => {}
            }
        });
    }
}

/// The address the client dialled before the DNAT to the relay.
pub fn original_destination(s: &TcpStream) -> std::io::Result<SocketAddrV4> {
    use std::os::fd::AsRawFd;
    const SO_ORIGINAL_DST: libc::c_int = 80;
    // SAFETY: getsockopt writes at most `len` bytes into `addr`, a plain C struct that is
    // valid when zeroed; `fd` is open for the duration of the call (borrowed from `s`).
    let (rc, addr) = unsafe {
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let rc = libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_IP,
            SO_ORIGINAL_DST,
            (&mut addr as *mut libc::sockaddr_in).cast(),
            &mut len,
        );
        (rc, addr)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(SocketAddrV4::new(
        u32::from_be(addr.sin_addr.s_addr).into(),
        u16::from_be(addr.sin_port),
    ))
}

/// The relayed backends of the Service port at `dst`, and its affinity timeout.
fn candidates(
    snap: &Snapshot,
    settings: &RuleSettings,
    dst: SocketAddrV4,
) -> Option<(Vec<Backend>, Option<u32>)> {
    let (svc, port) = snap.by_destination(IpAddr::V4(*dst.ip()), dst.port(), Protocol::Tcp)?;
    let backends: Vec<Backend> = port
        .usable()
        .filter(|b| route(b, Protocol::Tcp, settings) == Route::Relay)
        .filter(|b| !svc.service.internal_local || b.local)
        .cloned()
        .collect();
    Some((backends, svc.service.affinity_seconds))
}

async fn serve(sh: &Shared, mut client: TcpStream, peer: SocketAddr) {
    let dst = match original_destination(&client) {
        Ok(d) => d,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "relay connection without an original destination");
            sh.metrics.count(Outcome::NoService);
            return;
        }
    };
    let snap = sh.snapshots.borrow().clone();
    let Some((mut backends, affinity)) = candidates(&snap, &sh.settings, dst) else {
        tracing::debug!(%peer, %dst, "relay connection for no known Service port");
        sh.metrics.count(Outcome::NoService);
        return;
    };
    drop(snap);
    if backends.is_empty() {
        sh.metrics.count(Outcome::NoBackend);
        return;
    }
    // The sticky backend first, then the others in random order.
    {
        use rand::seq::SliceRandom;
        backends.shuffle(&mut rand::rng());
    }
    if affinity.is_some()
        && let Some(sticky) = sh.affinity.get(peer.ip(), dst)
        && let Some(i) = backends
            .iter()
            .position(|b| SocketAddr::new(b.ip, b.port) == sticky)
    {
        backends.swap(0, i);
    }
    let _ = client.set_nodelay(true);
    for b in backends.iter().take(ATTEMPTS) {
        let target = RelayTarget {
            node: b.node.clone().unwrap_or_else(|| "".into()),
            addr: SocketAddr::new(b.ip, b.port),
        };
        let dialled = tokio::time::timeout(DIAL_TIMEOUT, sh.dialer.dial(target.clone())).await;
        let mut upstream = match dialled {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::info!(%dst, node = %target.node, backend = %target.addr, error = %e, "relay dial failed; trying another backend");
                continue;
            }
            Err(_) => {
                tracing::info!(%dst, node = %target.node, backend = %target.addr, "relay dial timed out; trying another backend");
                continue;
            }
        };
        if let Some(secs) = affinity {
            sh.affinity.set(peer.ip(), dst, target.addr, secs);
        }
        sh.metrics.count(Outcome::Relayed);
        sh.metrics.active.inc();
        let copied = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        sh.metrics.active.dec();
        if let Ok((up, down)) = copied {
            sh.metrics.bytes_up.inc_by(up);
            sh.metrics.bytes_down.inc_by(down);
        }
        return;
    }
    sh.metrics.count(Outcome::DialFailed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;
    use crate::model::{EndpointSlice, Service};
    use serde_json::json;

    fn snap(affinity: bool) -> Snapshot {
        let mut c = Catalog::new("edge-1");
        let mut spec = json!({"clusterIP": "10.96.0.20", "ports": [{"name": "http", "port": 80}]});
        if affinity {
            spec["sessionAffinity"] = json!("ClientIP");
        }
        c.apply_service(
            Service::from_json(
                &json!({"metadata": {"name": "web", "namespace": "shop"}, "spec": spec})
                    .to_string(),
            )
            .unwrap(),
        );
        c.apply_slice(
            EndpointSlice::from_json(
                &json!({"metadata": {"name": "web-x", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
                "endpoints": [{"addresses": ["10.77.0.9"], "nodeName": "edge-2"},
                              {"addresses": ["10.66.0.9"], "nodeName": "edge-3"},
                              {"addresses": ["10.88.0.9"], "nodeName": "edge-1"}]})
                .to_string(),
            )
            .unwrap(),
        );
        c.snapshot().unwrap()
    }

    fn settings() -> RuleSettings {
        RuleSettings {
            prefix: "KT".into(),
            relay: Some("127.0.0.1:1".parse().unwrap()),
            direct: vec![],
        }
    }

    #[test]
    fn only_relayed_backends_of_the_dialled_port_are_candidates() {
        let s = snap(false);
        let (b, aff) = candidates(&s, &settings(), "10.96.0.20:80".parse().unwrap()).unwrap();
        let mut nodes: Vec<&str> = b.iter().map(|b| b.node.as_deref().unwrap()).collect();
        nodes.sort();
        assert_eq!(nodes, ["edge-2", "edge-3"]);
        assert_eq!(aff, None);
        assert!(candidates(&s, &settings(), "10.96.0.20:81".parse().unwrap()).is_none());
        assert!(candidates(&s, &settings(), "10.96.0.99:80".parse().unwrap()).is_none());
    }

    #[test]
    fn affinity_entries_expire_and_stay_bounded() {
        let a = Affinity::default();
        let svc: SocketAddrV4 = "10.96.0.20:80".parse().unwrap();
        let client: IpAddr = "10.88.0.2".parse().unwrap();
        a.set(client, svc, "10.77.0.9:8080".parse().unwrap(), 60);
        assert_eq!(a.get(client, svc), Some("10.77.0.9:8080".parse().unwrap()));
        a.set(client, svc, "10.77.0.9:8080".parse().unwrap(), 0);
        assert_eq!(a.get(client, svc), None);
        for i in 0..(MAX_AFFINITY as u32 + 10) {
            a.set(
                IpAddr::V4(i.into()),
                svc,
                "10.77.0.9:8080".parse().unwrap(),
                60,
            );
        }
        assert!(a.entries.lock().unwrap().len() <= MAX_AFFINITY);
    }

    #[tokio::test]
    async fn a_connection_without_a_dnat_is_closed_and_counted() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_tx, rx) = watch::channel(Arc::new(snap(false)));
        let metrics = RelayMetrics::default();
        let cancel = CancellationToken::new();
        let (_relay, task) = Relay::spawn(
            listener,
            rx,
            settings(),
            Arc::new(DirectDialer),
            metrics.clone(),
            cancel.clone(),
        );
        let mut c = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        use tokio::io::AsyncReadExt;
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .expect("the relay closes the connection")
            .unwrap_or(0);
        assert_eq!(n, 0);
        // Without a DNAT the original destination is the relay itself: no Service port.
        assert_eq!(
            metrics
                .connections
                .get_or_create(&OutcomeLabel {
                    outcome: Outcome::NoService.label()
                })
                .get(),
            1
        );
        cancel.cancel();
        let _ = task.await;
    }
}
