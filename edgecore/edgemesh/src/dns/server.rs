//! The DNS server's sockets: one UDP loop and one TCP accept loop on the node-local address,
//! a task per TCP connection (bounded) and per forwarded query (bounded by the forwarder).
//!
//! Each query reads the newest [`Snapshot`] (an `Arc` clone), so answers follow the catalog
//! without locks. TCP connections carry several queries each (RFC 7766), answered in order,
//! and close after an idle timeout.

use super::forward::{DEFAULT_FORWARD_TIMEOUT, DEFAULT_MAX_FORWARDS, Forwarder};
use super::metrics::{DnsMetrics, Transport};
use super::respond::{Responder, Step};
use super::wire::{MAX_MESSAGE_LEN, WireError};
use super::zone::{DEFAULT_CLUSTER_DOMAIN, DEFAULT_TTL, Zone};
use crate::catalog::Snapshot;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// KubeEdge's EdgeMesh DNS address, which edge pods get as their nameserver (`clusterDNS`).
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(169, 254, 96, 16)), 53);

#[derive(Debug, Clone)]
pub struct DnsConfig {
    /// UDP and TCP.
    pub listen: SocketAddr,
    pub cluster_domain: String,
    /// Of every record in the cluster zone, and the SOA minimum (negative caching).
    pub ttl: u32,
    /// Resolvers for every other name, tried in order.
    pub upstreams: Vec<SocketAddr>,
    /// Per attempt at one upstream.
    pub forward_timeout: Duration,
    /// A TCP connection without a query for this long is closed.
    pub tcp_idle_timeout: Duration,
    /// Connections beyond this are closed at once.
    pub max_tcp_connections: usize,
    /// Forwards beyond this are answered REFUSED at once.
    pub max_forwards_in_flight: usize,
}

impl Default for DnsConfig {
    fn default() -> DnsConfig {
        DnsConfig {
            listen: DEFAULT_LISTEN,
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.to_string(),
            ttl: DEFAULT_TTL,
            upstreams: Vec::new(),
            forward_timeout: DEFAULT_FORWARD_TIMEOUT,
            tcp_idle_timeout: Duration::from_secs(10),
            max_tcp_connections: 256,
            max_forwards_in_flight: DEFAULT_MAX_FORWARDS,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("cannot listen on {addr} ({transport}) for the edge DNS server: {source}{hint}", hint = bind_hint(.source))]
    Bind {
        addr: SocketAddr,
        transport: &'static str,
        source: io::Error,
    },
    #[error("cluster domain {domain:?} is not a usable DNS name: {source}")]
    ClusterDomain { domain: String, source: WireError },
    #[error("the DNS server must be started inside a Tokio runtime")]
    NoRuntime,
}

fn bind_hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::AddrInUse => {
            "; is another DNS server (EdgeMesh's agent, a node-local DNS cache?) running on it?"
        }
        io::ErrorKind::AddrNotAvailable => "; the address is not assigned to an interface",
        io::ErrorKind::PermissionDenied => "; a port below 1024 needs root or CAP_NET_BIND_SERVICE",
        _ => "",
    }
}

/// The running server; [`DnsServer::shutdown`] stops it (dropping it stops it too, without
/// waiting).
pub struct DnsServer {
    local_addr: SocketAddr,
    metrics: DnsMetrics,
    token: CancellationToken,
    tasks: TaskTracker,
}

/// What every connection and query task shares.
struct Shared {
    responder: Responder,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    tcp_idle_timeout: Duration,
    token: CancellationToken,
    tasks: TaskTracker,
}

impl DnsServer {
    /// Binds UDP and TCP on `config.listen` (the same port for both when it is 0) and starts
    /// serving. Must be called inside a Tokio runtime.
    pub fn start(
        config: DnsConfig,
        snapshots: watch::Receiver<Arc<Snapshot>>,
    ) -> Result<DnsServer, DnsError> {
        tokio::runtime::Handle::try_current().map_err(|_| DnsError::NoRuntime)?;
        let zone = Zone::new(&config.cluster_domain, config.ttl).map_err(|source| {
            DnsError::ClusterDomain {
                domain: config.cluster_domain.clone(),
                source,
            }
        })?;
        let (udp, tcp) = bind(config.listen)?;
        let local_addr = udp.local_addr().map_err(|source| DnsError::Bind {
            addr: config.listen,
            transport: "udp",
            source,
        })?;
        let metrics = DnsMetrics::default();
        let forwarder = Forwarder::new(
            config.upstreams.clone(),
            config.forward_timeout,
            config.max_forwards_in_flight,
            metrics.clone(),
        );
        let token = CancellationToken::new();
        let tasks = TaskTracker::new();
        let shared = Arc::new(Shared {
            responder: Responder::new(zone, Arc::new(forwarder), metrics.clone()),
            snapshots,
            tcp_idle_timeout: config.tcp_idle_timeout,
            token: token.clone(),
            tasks: tasks.clone(),
        });
        tasks.spawn(serve_udp(Arc::new(udp), shared.clone()));
        let slots = Arc::new(Semaphore::new(
            config.max_tcp_connections.min(Semaphore::MAX_PERMITS),
        ));
        tasks.spawn(serve_tcp(tcp, slots, metrics.clone(), shared));
        tracing::info!(
            listen = %local_addr,
            domain = %config.cluster_domain,
            upstreams = ?config.upstreams,
            "edge DNS server started"
        );
        Ok(DnsServer {
            local_addr,
            metrics,
            token,
            tasks,
        })
    }

    /// The UDP and TCP address (the port chosen when `listen` had port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Register with [`DnsMetrics::register`].
    pub fn metrics(&self) -> &DnsMetrics {
        &self.metrics
    }

    /// Stops accepting, ends every connection and pending forward, and waits for them.
    pub async fn shutdown(self) {
        self.token.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

fn bind_error(transport: &'static str, addr: SocketAddr) -> impl FnOnce(io::Error) -> DnsError {
    move |source| DnsError::Bind {
        addr,
        transport,
        source,
    }
}

fn bind(listen: SocketAddr) -> Result<(UdpSocket, TcpListener), DnsError> {
    // Port 0: the kernel picks the UDP port; TCP must get the same one, which another
    // program may hold, so a few tries.
    let tries = if listen.port() == 0 { 8 } else { 1 };
    let mut last = None;
    // Ports whose TCP half was taken stay bound until the end, so that the kernel does not
    // hand out the same UDP port again on the next try.
    let mut refused = Vec::new();
    for _ in 0..tries {
        let udp = std::net::UdpSocket::bind(listen).map_err(bind_error("udp", listen))?;
        let addr = udp.local_addr().map_err(bind_error("udp", listen))?;
        match std::net::TcpListener::bind(addr) {
            Ok(tcp) => {
                udp.set_nonblocking(true).map_err(bind_error("udp", addr))?;
                tcp.set_nonblocking(true).map_err(bind_error("tcp", addr))?;
                let udp = UdpSocket::from_std(udp).map_err(bind_error("udp", addr))?;
                let tcp = TcpListener::from_std(tcp).map_err(bind_error("tcp", addr))?;
                return Ok((udp, tcp));
            }
            Err(source) => {
                last = Some(bind_error("tcp", addr)(source));
                refused.push(udp);
            }
        }
    }
    Err(last.unwrap_or_else(|| bind_error("tcp", listen)(io::ErrorKind::AddrInUse.into())))
}

async fn serve_udp(socket: Arc<UdpSocket>, shared: Arc<Shared>) {
    // The largest datagram IPv4 or IPv6 carries.
    let mut buf = vec![0u8; MAX_MESSAGE_LEN];
    loop {
        let received = tokio::select! {
            _ = shared.token.cancelled() => return,
            r = socket.recv_from(&mut buf) => r,
        };
        let (n, peer) = match received {
            Ok(r) => r,
            Err(error) => {
                // E.g. ICMP errors of earlier sends: the socket itself still works.
                tracing::debug!(%error, "DNS UDP receive failed");
                continue;
            }
        };
        let started = Instant::now();
        let snapshot = shared.snapshots.borrow().clone();
        let packet = buf.get(..n).unwrap_or_default();
        match shared
            .responder
            .handle(packet, Transport::Udp, &snapshot, started)
        {
            Step::Reply(reply) => send(&socket, &reply, peer).await,
            Step::Drop => {}
            Step::Wait(pending) => {
                let (socket, token) = (socket.clone(), shared.token.clone());
                shared.tasks.spawn(async move {
                    tokio::select! {
                        _ = token.cancelled() => {}
                        reply = pending.run() => send(&socket, &reply, peer).await,
                    }
                });
            }
        }
    }
}

async fn send(socket: &UdpSocket, reply: &[u8], peer: SocketAddr) {
    if let Err(error) = socket.send_to(reply, peer).await {
        tracing::debug!(%error, %peer, "DNS UDP send failed");
    }
}

async fn serve_tcp(
    listener: TcpListener,
    slots: Arc<Semaphore>,
    metrics: DnsMetrics,
    shared: Arc<Shared>,
) {
    loop {
        let accepted = tokio::select! {
            _ = shared.token.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, _)) => match slots.clone().try_acquire_owned() {
                Ok(permit) => {
                    let shared2 = shared.clone();
                    shared.tasks.spawn(async move {
                        serve_connection(stream, &shared2).await;
                        drop(permit);
                    });
                }
                Err(_) => {
                    metrics.tcp_rejected();
                    drop(stream);
                }
            },
            Err(error) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!(%error, "DNS TCP accept failed");
                tokio::select! {
                    _ = shared.token.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        }
    }
}

/// Answers framed queries in order until the peer closes, goes idle, sends garbage, or the
/// server stops.
async fn serve_connection(mut stream: TcpStream, shared: &Shared) {
    let idle = shared.tcp_idle_timeout;
    let _ = stream.set_nodelay(true);
    loop {
        let mut len = [0u8; 2];
        let read = tokio::select! {
            _ = shared.token.cancelled() => return,
            r = tokio::time::timeout(idle, stream.read_exact(&mut len)) => r,
        };
        if !matches!(read, Ok(Ok(_))) {
            return;
        }
        // At most 65535 bytes, whatever the peer says.
        let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
        if query.is_empty() {
            return;
        }
        let read = tokio::select! {
            _ = shared.token.cancelled() => return,
            r = tokio::time::timeout(idle, stream.read_exact(&mut query)) => r,
        };
        if !matches!(read, Ok(Ok(_))) {
            return;
        }
        let started = Instant::now();
        let snapshot = shared.snapshots.borrow().clone();
        let reply = match shared
            .responder
            .handle(&query, Transport::Tcp, &snapshot, started)
        {
            Step::Reply(reply) => reply,
            Step::Drop => return,
            Step::Wait(pending) => tokio::select! {
                _ = shared.token.cancelled() => return,
                reply = pending.run() => reply,
            },
        };
        let Ok(len) = u16::try_from(reply.len()) else {
            return;
        };
        let mut frame = Vec::with_capacity(reply.len() + 2);
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(&reply);
        let written = tokio::select! {
            _ = shared.token.cancelled() => return,
            r = tokio::time::timeout(idle, stream.write_all(&frame)) => r,
        };
        if !matches!(written, Ok(Ok(()))) {
            return;
        }
    }
}
