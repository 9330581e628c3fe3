//! Services at the edge (edgemesh) benchmark. Prints numbers; asserts nothing.
//!
//!     cargo build --profile bench-fast -p edgecore -p e2e
//!     sudo target/bench-fast/bench-mesh
//!
//! 1. DNS: edgemesh's DNS server on loopback with `BENCH_SERVICES` (default 1,000) Services
//!    and 10 endpoints each; sequential UDP queries for random Service names (p50/p99), then
//!    8 clients at once (queries/s).
//! 2. The data path on the local path (root: iptables), a request/response of 64 bytes to a
//!    backend on this host: directly, through a ClusterIP (kernel DNAT, what edgemesh uses for
//!    reachable endpoints) and through a userspace proxy (edgemesh's relay dialling directly,
//!    as a userspace mesh would) — a new connection per request (HTTP/1.0-like) and round
//!    trips on one connection.
//! 3. The relay through the cloud: edge A → cloudcore's tunnel port → edge B's stream tunnel →
//!    backend, with real TLS and tunnels in this process: connection set-up, round trips and
//!    bulk throughput, against the same backend reached directly.

use e2e::bench::{env_usize, percentile};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::watch;

use kubeedge_edgemesh::catalog::{Catalog, Snapshot};
use kubeedge_edgemesh::dns::{DnsConfig, DnsServer};
use kubeedge_edgemesh::model::{EndpointSlice, Service};
use kubeedge_edgemesh::proxy::iptables::Iptables;
use kubeedge_edgemesh::proxy::relay::{
    DirectDialer, Relay, RelayDialer, RelayMetrics, RelayStream, RelayTarget,
};
use kubeedge_edgemesh::proxy::rules::{RuleSettings, plan};
use serde_json::json;

fn report(what: &str, mut lat: Vec<Duration>) -> (Duration, Duration) {
    lat.sort();
    let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
    println!(
        "  {what:<46} p50 {:>8.1?}  p99 {:>8.1?}  max {:>8.1?}  (n={})",
        p50,
        p99,
        lat.last().copied().unwrap_or_default(),
        lat.len()
    );
    (p50, p99)
}

/// `services` Services `svc-<i>` in namespace `bench` with 10 endpoints each, `cip(i)` as
/// ClusterIP, endpoints on node `far`.
fn catalog(services: usize, cip: impl Fn(usize) -> String) -> Snapshot {
    let mut c = Catalog::new("bench-node");
    for i in 0..services {
        c.apply_service(
            Service::from_json(
                &json!({"metadata": {"name": format!("svc-{i}"), "namespace": "bench"},
                        "spec": {"clusterIP": cip(i), "ports": [{"name": "http", "port": 80}]}})
                .to_string(),
            )
            .expect("a service"),
        );
        let endpoints: Vec<_> = (0..10)
            .map(|e| json!({"addresses": [format!("10.200.{}.{}", i / 25, 1 + (i % 25) * 10 + e)], "nodeName": "far"}))
            .collect();
        c.apply_slice(
            EndpointSlice::from_json(
                &json!({"metadata": {"name": format!("svc-{i}-x"), "namespace": "bench",
                        "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
                        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
                        "endpoints": endpoints})
                .to_string(),
            )
            .expect("a slice"),
        );
    }
    c.snapshot().expect("a snapshot")
}

fn query(id: u16, name: &str) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for l in name.split('.') {
        q.push(l.len() as u8);
        q.extend_from_slice(l.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

async fn dns(services: usize) -> anyhow::Result<()> {
    println!("1. DNS at the edge: {services} Services, 10 endpoints each");
    let snap = catalog(services, |i| format!("10.96.{}.{}", i / 250, 1 + i % 250));
    let (_tx, rx) = watch::channel(Arc::new(snap));
    let server = DnsServer::start(
        DnsConfig {
            listen: "127.0.0.1:0".parse()?,
            ..DnsConfig::default()
        },
        rx,
    )?;
    let addr = server.local_addr();
    let sock = UdpSocket::bind("127.0.0.1:0").await?;
    sock.connect(addr).await?;
    let mut buf = vec![0u8; 4096];
    let n = env_usize("BENCH_DNS_QUERIES", 20_000);
    let mut lat = Vec::with_capacity(n);
    for k in 0..n {
        let name = format!(
            "svc-{}.bench.svc.cluster.local",
            rand::random::<u32>() as usize % services
        );
        let q = query(k as u16, &name);
        let t = Instant::now();
        sock.send(&q).await?;
        let got = tokio::time::timeout(Duration::from_secs(2), sock.recv(&mut buf)).await??;
        lat.push(t.elapsed());
        anyhow::ensure!(got > 12 && buf[3] & 0x0f == 0, "bad answer for {name}");
    }
    report("A query, one client (UDP)", lat);
    let started = Instant::now();
    let per = n / 8;
    let mut tasks = Vec::new();
    for c in 0..8u16 {
        tasks.push(tokio::spawn(async move {
            let sock = UdpSocket::bind("127.0.0.1:0").await?;
            sock.connect(addr).await?;
            let mut buf = vec![0u8; 4096];
            for k in 0..per {
                let name = format!(
                    "svc-{}.bench.svc.cluster.local",
                    (k * 7 + c as usize) % 1000
                );
                sock.send(&query(k as u16, &name)).await?;
                tokio::time::timeout(Duration::from_secs(2), sock.recv(&mut buf)).await??;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    println!(
        "  8 clients at once: {:.0} queries/s",
        (per * 8) as f64 / started.elapsed().as_secs_f64()
    );
    server.shutdown().await;
    Ok(())
}

/// An echo server: every read is written back.
async fn echo_server() -> anyhow::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    Ok(addr)
}

/// One request/response of 64 bytes on `s`.
async fn round_trip<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
) -> anyhow::Result<()> {
    let msg = [7u8; 64];
    s.write_all(&msg).await?;
    let mut got = [0u8; 64];
    s.read_exact(&mut got).await?;
    Ok(())
}

async fn new_conn_latency(to: SocketAddr, n: usize) -> anyhow::Result<Vec<Duration>> {
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut s = TcpStream::connect(to).await?;
        s.set_nodelay(true)?;
        round_trip(&mut s).await?;
        lat.push(t.elapsed());
    }
    Ok(lat)
}

async fn rtt_latency(to: SocketAddr, n: usize) -> anyhow::Result<Vec<Duration>> {
    let mut s = TcpStream::connect(to).await?;
    s.set_nodelay(true)?;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        round_trip(&mut s).await?;
        lat.push(t.elapsed());
    }
    Ok(lat)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

async fn data_path() -> anyhow::Result<()> {
    println!("2. the local data path: direct vs ClusterIP (kernel DNAT) vs userspace proxy");
    if !is_root() {
        println!("  SKIPPED: needs root (iptables)");
        return Ok(());
    }
    let backend = echo_server().await?;
    let relay_listener = TcpListener::bind("127.0.0.1:0").await?;
    let relay_addr = match relay_listener.local_addr()? {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(_) => anyhow::bail!("IPv6 loopback"),
    };
    let prefix = format!("KB{:02X}", rand::random::<u8>());
    // Two Services: `dnat` reaches the backend directly (kernel DNAT), `proxied` through the
    // userspace relay (dialling the backend itself).
    let mut c = Catalog::new("bench-node");
    for (name, ip, node) in [
        ("dnat", "198.51.100.201", None),
        ("proxied", "198.51.100.202", Some("far")),
    ] {
        c.apply_service(Service::from_json(
            &json!({"metadata": {"name": name, "namespace": "bench"},
                    "spec": {"clusterIP": ip, "ports": [{"name": "tcp", "port": 80}]}})
            .to_string(),
        )?);
        let mut ep = json!({"addresses": ["127.0.0.1"]});
        if let Some(n) = node {
            ep["nodeName"] = json!(n);
        }
        c.apply_slice(EndpointSlice::from_json(
            &json!({"metadata": {"name": name, "namespace": "bench",
                    "labels": {"kubernetes.io/service-name": name}},
                    "addressType": "IPv4", "ports": [{"name": "tcp", "port": backend.port()}],
                    "endpoints": [ep]})
            .to_string(),
        )?);
    }
    let snap = c.snapshot().expect("a snapshot");
    let settings = RuleSettings {
        prefix: prefix.clone(),
        relay: Some(relay_addr),
        direct: vec![],
    };
    let ipt = Iptables::new(&prefix);
    ipt.ensure_hooks()?;
    ipt.apply(&plan(&snap, &settings))?;
    let cancel = tokio_util::sync::CancellationToken::new();
    let (_tx, rx) = watch::channel(Arc::new(snap));
    let (_relay, task) = Relay::spawn(
        relay_listener,
        rx,
        settings,
        Arc::new(DirectDialer),
        RelayMetrics::default(),
        cancel.clone(),
    );
    let n = env_usize("BENCH_CONNECTIONS", 2000);
    let rtts = env_usize("BENCH_ROUND_TRIPS", 20_000);
    let dnat: SocketAddr = "198.51.100.201:80".parse()?;
    let proxied: SocketAddr = "198.51.100.202:80".parse()?;
    let result = async {
        // Warm up each path.
        for to in [backend, dnat, proxied] {
            new_conn_latency(to, 50).await?;
        }
        println!("  new connection + 64-byte request/response:");
        let (_, d99) = report("direct (pod IP)", new_conn_latency(backend, n).await?);
        let (_, k99) = report("ClusterIP, kernel DNAT", new_conn_latency(dnat, n).await?);
        let (_, u99) = report(
            "ClusterIP, userspace proxy",
            new_conn_latency(proxied, n).await?,
        );
        println!(
            "  added at p99: DNAT {:+.1} %, userspace {:+.1} %",
            (k99.as_secs_f64() / d99.as_secs_f64() - 1.0) * 100.0,
            (u99.as_secs_f64() / d99.as_secs_f64() - 1.0) * 100.0
        );
        println!("  64-byte round trips on one connection:");
        let (_, d99) = report("direct (pod IP)", rtt_latency(backend, rtts).await?);
        let (_, k99) = report("ClusterIP, kernel DNAT", rtt_latency(dnat, rtts).await?);
        let (_, u99) = report(
            "ClusterIP, userspace proxy",
            rtt_latency(proxied, rtts).await?,
        );
        println!(
            "  added at p99: DNAT {:+.1} %, userspace {:+.1} %",
            (k99.as_secs_f64() / d99.as_secs_f64() - 1.0) * 100.0,
            (u99.as_secs_f64() / d99.as_secs_f64() - 1.0) * 100.0
        );
        anyhow::Ok(())
    }
    .await;
    cancel.cancel();
    let _ = task.await;
    ipt.cleanup()?;
    result
}

/// Allows every relay (the bench has no EndpointSlices in a cluster).
struct AnyTarget;
impl cloudcore::cloudstream::mesh_relay::RelayTargets for AnyTarget {
    fn endpoint_on_node(&self, _node: &str, _addr: SocketAddr) -> bool {
        true
    }
}

async fn relay_through_cloud() -> anyhow::Result<()> {
    use cloudcore::cloudstream::CloudStream;
    use cloudcore::cloudstream::client_auth::ClientAuth;
    use edgecore::edgestream::{EdgeStream, EdgeStreamSettings};
    println!("3. the relay through the cloud: edge A → cloudcore tunnel port → edge B → backend");
    let pki = e2e::channel::Pki::new()?;
    let api = e2e::apiserver::ApiServer::start(e2e::apiserver::Config::default()).await?;
    let stream = CloudStream::start(
        cloudcore::cloudstream::StreamSettings {
            node_port: None,
            relay_targets: Some(Arc::new(AnyTarget)),
            ..e2e::stream_client::loopback_settings(
                &pki,
                ClientAuth::Verify(vec![pki.ca.cert.cert_der.clone()]),
            )
        },
        api.client()?,
    )
    .await?;
    let tls_for = |node: &str| -> anyhow::Result<Arc<rustls::ClientConfig>> {
        let cert = pki.node_cert(node)?;
        let chain = vec![cert.cert_der.clone()];
        edgecore::edgestream::tunnel::tunnel_tls(
            std::slice::from_ref(&pki.ca.cert.cert_der),
            chain,
            cert.key_der(),
        )
    };
    let settings = |node: &str| EdgeStreamSettings {
        server: stream.tunnel_addr().to_string(),
        node_name: node.into(),
        node_ip: "127.0.0.1".into(),
        handshake_timeout: Duration::from_secs(5),
        root_dir: std::env::temp_dir(),
    };
    let cri = edgecore::cri::CriClient::connect_lazy("unix:///nonexistent/cri.sock")?;
    let runtime = edgecore::cri::runtime::Runtime::new(cri, Duration::from_secs(2));
    let edge_b = EdgeStream::start(
        settings("edge-b"),
        tls_for("edge-b")?,
        runtime,
        Arc::new(edgecore::edged::status_report::StatusReports::default()),
    );
    let t = Instant::now();
    while !stream.is_connected("edge-b") {
        anyhow::ensure!(t.elapsed() < Duration::from_secs(10), "edge B's tunnel");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dialer =
        edgecore::edgestream::relay::TunnelDialer::new(settings("edge-a"), tls_for("edge-a")?);
    let backend = echo_server().await?;
    let target = RelayTarget {
        node: "edge-b".into(),
        addr: backend,
    };
    let n = env_usize("BENCH_CONNECTIONS", 2000) / 4;
    let rtts = env_usize("BENCH_ROUND_TRIPS", 20_000) / 4;
    // Connection set-up + one round trip.
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut s: Box<dyn RelayStream> = dialer
            .dial(target.clone())
            .await
            .map_err(anyhow::Error::msg)?;
        round_trip(&mut s).await?;
        lat.push(t.elapsed());
    }
    report("relayed: new connection + request/response", lat);
    report(
        "direct: new connection + request/response",
        new_conn_latency(backend, n).await?,
    );
    let mut s = dialer
        .dial(target.clone())
        .await
        .map_err(anyhow::Error::msg)?;
    let mut lat = Vec::with_capacity(rtts);
    for _ in 0..rtts {
        let t = Instant::now();
        round_trip(&mut s).await?;
        lat.push(t.elapsed());
    }
    report("relayed: 64-byte round trip", lat);
    report(
        "direct: 64-byte round trip",
        rtt_latency(backend, rtts).await?,
    );
    // Bulk: send `total` bytes through the echo and read them back.
    let total = env_usize("BENCH_RELAY_MB", 64) << 20;
    for (what, mut s) in [
        (
            "relayed",
            dialer
                .dial(target.clone())
                .await
                .map_err(anyhow::Error::msg)?,
        ),
        (
            "direct",
            Box::new(TcpStream::connect(backend).await?) as Box<dyn RelayStream>,
        ),
    ] {
        let (mut r, mut w) = tokio::io::split(&mut s);
        let t = Instant::now();
        let writer = async {
            let chunk = vec![1u8; 64 * 1024];
            let mut sent = 0;
            while sent < total {
                w.write_all(&chunk).await?;
                sent += chunk.len();
            }
            anyhow::Ok(())
        };
        let reader = async {
            let mut buf = vec![0u8; 64 * 1024];
            let mut got = 0;
            while got < total {
                let k = r.read(&mut buf).await?;
                anyhow::ensure!(k > 0, "ended early");
                got += k;
            }
            anyhow::Ok(())
        };
        tokio::try_join!(writer, reader)?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "  {what:<46} {:.0} MB/s each way ({} MB echoed in {:.2} s)",
            (total >> 20) as f64 / secs,
            total >> 20,
            secs
        );
    }
    edge_b.shutdown().await;
    stream.shutdown();
    api.shutdown().await;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BENCH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let services = env_usize("BENCH_SERVICES", 1000);
    println!("bench-mesh");
    dns(services).await?;
    data_path().await?;
    relay_through_cloud().await?;
    let _ = (
        Ipv4Addr::LOCALHOST,
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0),
    );
    Ok(())
}
