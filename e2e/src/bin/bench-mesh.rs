//! Services at the edge (edgemesh) benchmark. Prints numbers; asserts nothing.
//!
//!     cargo build --profile bench-fast -p edgecore -p e2e
//!     sudo target/bench-fast/bench-mesh        # BENCH_PHASES=12345 by default
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
//! 4. A real `edgecore` (next to this binary; edged off) with edgemesh on against cloudcore and
//!    the in-memory API server in this process, and one without: the time from an
//!    EndpointSlice change in the cluster to the edge's rule for it (20 changes), then the RSS of
//!    both with `BENCH_SERVICES` Services of 10 endpoints each (root: iptables, an address).
//! 5. Cloud messages per Service change with `BENCH_NODES` (default 1,000) simulated edges
//!    holding edgemesh's standing watches, and how long until every edge has it.

use e2e::bench::{env_usize, percentile};
use std::net::SocketAddr;
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
    ipt.apply(&plan(&snap, &settings), None)?;
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
        // Interleaved, so that load from elsewhere on the machine hits all paths alike.
        let paths = [backend, dnat, proxied];
        let mut new_conn: [Vec<Duration>; 3] = Default::default();
        for _ in 0..n {
            for (i, to) in paths.iter().enumerate() {
                new_conn[i].extend(new_conn_latency(*to, 1).await?);
            }
        }
        let mut conns = Vec::new();
        for to in paths {
            let s = TcpStream::connect(to).await?;
            s.set_nodelay(true)?;
            conns.push(s);
        }
        let mut rtt: [Vec<Duration>; 3] = Default::default();
        for _ in 0..rtts {
            for (i, c) in conns.iter_mut().enumerate() {
                let t = Instant::now();
                round_trip(c).await?;
                rtt[i].push(t.elapsed());
            }
        }
        for (title, sets) in [
            ("new connection + 64-byte request/response:", new_conn),
            ("64-byte round trips on one connection:", rtt),
        ] {
            println!("  {title}");
            let [d, k, u] = sets;
            let (d50, d99) = report("direct (pod IP)", d);
            let (k50, k99) = report("ClusterIP, kernel DNAT", k);
            let (u50, u99) = report("ClusterIP, userspace proxy", u);
            let pct = |a: Duration, b: Duration| (a.as_secs_f64() / b.as_secs_f64() - 1.0) * 100.0;
            println!(
                "  added: DNAT p50 {:+.1} %, p99 {:+.1} %; userspace p50 {:+.1} %, p99 {:+.1} %",
                pct(k50, d50),
                pct(k99, d99),
                pct(u50, d50),
                pct(u99, d99)
            );
        }
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
impl cloudcore::cloudstream::RelayTargets for AnyTarget {
    fn endpoint_on_node(&self, _node: &str, _addr: SocketAddr) -> bool {
        true
    }
}

async fn relay_through_cloud() -> anyhow::Result<()> {
    use cloudcore::cloudstream::ClientAuth;
    use cloudcore::cloudstream::CloudStream;
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
        edgecore::edgestream::tunnel_tls(
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
    let cri = kubeedge_edged::cri::CriClient::connect_lazy("unix:///nonexistent/cri.sock")?;
    let runtime = kubeedge_edged::cri::runtime::Runtime::new(cri, Duration::from_secs(2));
    let edge_b = EdgeStream::start(
        settings("edge-b"),
        tls_for("edge-b")?,
        runtime,
        Arc::new(kubeedge_edged::status_report::StatusReports::default()),
    );
    let t = Instant::now();
    while !stream.is_connected("edge-b") {
        anyhow::ensure!(t.elapsed() < Duration::from_secs(10), "edge B's tunnel");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dialer = edgecore::edgestream::TunnelDialer::new(settings("edge-a"), tls_for("edge-a")?);
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
    e2e::bench::env_configured_cli(include_str!("bench-mesh.rs"));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BENCH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let services = env_usize("BENCH_SERVICES", 1000);
    println!("bench-mesh");
    // `BENCH_PHASES=14` runs phases 1 and 4 only.
    let phases = std::env::var("BENCH_PHASES").unwrap_or_else(|_| "12345".into());
    if phases.contains('1') {
        dns(services).await?;
    }
    if phases.contains('2') {
        data_path().await?;
    }
    if phases.contains('3') {
        relay_through_cloud().await?;
    }
    if phases.contains('4') {
        edgecore_memory(services).await?;
    }
    if phases.contains('5') {
        fan_out(env_usize("BENCH_NODES", 1000)).await?;
    }
    Ok(())
}

fn start_edge(
    bin: &std::path::Path,
    root: &std::path::Path,
    node: &str,
    server: SocketAddr,
    pki: &e2e::channel::Pki,
    mesh: Option<&str>,
) -> anyhow::Result<(std::path::PathBuf, e2e::process::LoggedProcess)> {
    let dir = root.join(node);
    std::fs::create_dir_all(&dir)?;
    let cert = pki.node_cert(node)?;
    std::fs::write(dir.join("ca.crt"), &pki.ca.cert.cert_pem)?;
    std::fs::write(dir.join("edge.crt"), &cert.cert_pem)?;
    std::fs::write(dir.join("edge.key"), &cert.key_pem)?;
    let mesh = match mesh {
        Some(addr) => format!(
            "\x20 edgeMesh:\n    enable: true\n    listenAddress: {addr}\n    proxy:\n      chainPrefix: KB\n      relayPort: 0\n      directCIDRs: [10.200.0.0/16, 10.201.0.0/16]\n"
        ),
        None => String::new(),
    };
    let yaml = format!(
        "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\n\
         database:\n  dataSource: {d}/edgecore.db\n\
         modules:\n  edgeHub:\n    messageQPS: 0\n    tlsCaFile: {d}/ca.crt\n    tlsCertFile: {d}/edge.crt\n    tlsPrivateKeyFile: {d}/edge.key\n\
         \x20   websocket:\n      server: {server}\n\
         \x20 deviceTwin:\n    dmiSockPath: {d}\n\
         \x20 eventBus:\n    enable: false\n\
         \x20 edged:\n    enable: false\n    hostnameOverride: {node}\n{mesh}",
        d = dir.display(),
    );
    std::fs::write(dir.join("edgecore.yaml"), yaml)?;
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("--config")
        .arg(dir.join("edgecore.yaml"))
        .env("RUST_LOG", "warn");
    if let Ok(v) = std::env::var("BENCH_MALLOC_ARENA_MAX") {
        cmd.env("MALLOC_ARENA_MAX", v);
    }
    let p = e2e::process::LoggedProcess::spawn("edgecore", cmd, &dir)?;
    Ok((dir, p))
}

fn nat_rules() -> String {
    std::process::Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn slice_object(name: &str, service: &str, ips: &[String]) -> serde_json::Value {
    let endpoints: Vec<_> = ips
        .iter()
        .map(|ip| json!({"addresses": [ip], "nodeName": "far"}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": name, "namespace": "default",
                        "labels": {"kubernetes.io/service-name": service}},
           "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
           "endpoints": endpoints})
}

async fn edgecore_memory(services: usize) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Service as K8sService;
    use k8s_openapi::api::discovery::v1::EndpointSlice as K8sSlice;
    use kube::api::{Api, PostParams};
    println!(
        "4. edgecore with edgemesh: endpoint change → rule, and memory with {services} Services"
    );
    if !is_root() {
        println!("  SKIPPED: needs root (iptables, an address on lo)");
        return Ok(());
    }
    let bin = std::env::current_exe()?.with_file_name("edgecore");
    anyhow::ensure!(
        bin.exists(),
        "{} missing: build with `cargo build --profile bench-fast -p edgecore -p e2e`",
        bin.display()
    );
    let api = e2e::apiserver::ApiServer::start(e2e::apiserver::Config::default()).await?;
    let client = api.client()?;
    let pki = e2e::channel::Pki::new()?;
    let cloud = e2e::cloud::CloudFixture::start(client.clone(), &pki).await?;
    let root = std::env::temp_dir().join(format!("bench-mesh-{}", std::process::id()));
    let mesh_addr = "169.254.96.99";
    let (_off_dir, off) = start_edge(&bin, &root, "mesh-off", cloud.hub.local_addr(), &pki, None)?;
    let (_on_dir, on) = start_edge(
        &bin,
        &root,
        "mesh-on",
        cloud.hub.local_addr(),
        &pki,
        Some(mesh_addr),
    )?;
    let result = async {
        let t = Instant::now();
        while !cloud.hub.is_connected("mesh-off") || !cloud.hub.is_connected("mesh-on") {
            anyhow::ensure!(t.elapsed() < Duration::from_secs(30), "edges did not connect");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (off0, on0) = (e2e::procfs::rss_kb(off.pid()), e2e::procfs::rss_kb(on.pid()));
        println!("  RSS idle: edgemesh off {off0} KB, on {on0} KB");
        let svcs: Api<K8sService> = Api::namespaced(client.clone(), "default");
        let slices: Api<K8sSlice> = Api::namespaced(client.clone(), "default");
        // Endpoint change → rule.
        svcs.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "moving"},
                "spec": {"ports": [{"name": "http", "port": 80}]}}))?,
        )
        .await?;
        slices
            .create(
                &PostParams::default(),
                &serde_json::from_value(slice_object("moving-1", "moving", &["10.201.0.1".into()]))?,
            )
            .await?;
        let t = Instant::now();
        while !nat_rules().contains("10.201.0.1:8080") {
            anyhow::ensure!(t.elapsed() < Duration::from_secs(30), "the first rule never came");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut lat = Vec::new();
        for k in 2..22u32 {
            // Apart: each change is measured on its own, not behind the previous one's
            // rule update (`minSyncPeriod`, 100 ms).
            tokio::time::sleep(Duration::from_millis(300)).await;
            let ip = format!("10.201.0.{k}");
            let mut s: serde_json::Value = serde_json::to_value(slices.get("moving-1").await?)?;
            s["endpoints"][0]["addresses"] = json!([ip]);
            let t = Instant::now();
            slices
                .replace("moving-1", &PostParams::default(), &serde_json::from_value(s)?)
                .await?;
            let want = format!("{ip}:8080");
            while !nat_rules().contains(&want) {
                anyhow::ensure!(t.elapsed() < Duration::from_secs(30), "rule for {ip} never came");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            lat.push(t.elapsed());
        }
        report("EndpointSlice update → the edge's DNAT rule", lat);
        // Memory with `services` Services of 10 endpoints each.
        for i in 0..services {
            svcs.create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": format!("svc-{i}")},
                    "spec": {"ports": [{"name": "http", "port": 80}]}}))?,
            )
            .await?;
            let ips: Vec<String> = (0..10)
                .map(|e| format!("10.200.{}.{}", i / 25, 1 + (i % 25) * 10 + e))
                .collect();
            slices
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(slice_object(&format!("svc-{i}-x"), &format!("svc-{i}"), &ips))?,
                )
                .await?;
        }
        let t = Instant::now();
        loop {
            let seps = nat_rules().lines().filter(|l| l.starts_with(":KB-SEP-")).count();
            if seps >= services * 10 {
                break;
            }
            anyhow::ensure!(t.elapsed() < Duration::from_secs(300), "rules for every endpoint never came ({seps})");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        println!("  {services} Services, {} endpoints at the edge after {:.1?}", services * 10, t.elapsed());
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (off1, on1) = (e2e::procfs::rss_kb(off.pid()), e2e::procfs::rss_kb(on.pid()));
        println!(
            "  RSS with {services} Services / {} endpoints: edgemesh off {off1} KB, on {on1} KB: +{} KB over off (+{} KB over its idle)",
            services * 10,
            on1 as i64 - off1 as i64,
            on1 as i64 - on0 as i64
        );
        anyhow::Ok(())
    }
    .await;
    if result.is_err() {
        println!("{}", on.failure_report(40));
    }
    drop((off, on));
    let mut c = edgecore::config::EdgeCoreConfig::default();
    c.modules.edge_mesh.listen_address = mesh_addr.into();
    c.modules.edge_mesh.proxy.chain_prefix = "KB".into();
    let _ = edgecore::mesh::cleanup(&c);
    cloud.shutdown().await;
    api.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
    result
}

async fn fan_out(nodes: usize) -> anyhow::Result<()> {
    use e2e::sim_edge::SimEdge;
    use k8s_openapi::api::core::v1::Service as K8sService;
    use kube::api::{Api, PostParams};
    use kubeedge_shared::application::Application;
    println!(
        "5. cloud messages per Service change, {nodes} edges with edgemesh's standing watches"
    );
    let api = e2e::apiserver::ApiServer::start(e2e::apiserver::Config::default()).await?;
    let client = api.client()?;
    let pki = e2e::channel::Pki::new()?;
    let cloud = e2e::cloud::CloudFixture::start(client.clone(), &pki).await?;
    let svcs: Api<K8sService> = Api::namespaced(client.clone(), "default");
    svcs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "web"},
            "spec": {"ports": [{"name": "http", "port": 80}]}}))?,
    )
    .await?;
    let mut edges = Vec::with_capacity(nodes);
    let t = Instant::now();
    for i in 0..nodes {
        let node = format!("mesh-{i}");
        let n: k8s_openapi::api::core::v1::Node =
            serde_json::from_value(json!({"metadata": {"name": node,
            "labels": {"node-role.kubernetes.io/edge": ""}}}))?;
        Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
            .create(&PostParams::default(), &n)
            .await?;
        let mut e = SimEdge::connect(&cloud, &pki, &node, &["inventory-resync"]).await;
        for (prefix, ns_key) in [
            ("/core/v1/services", "null"),
            ("/discovery.k8s.io/v1/endpointslices", "null"),
        ] {
            let app = Application::new(
                &node,
                &format!("{prefix}/{ns_key}/null"),
                "watch",
                b"{}".to_vec(),
                Vec::new(),
                "",
            );
            e.request(&app.to_request()).await;
        }
        edges.push(e);
    }
    println!(
        "  {nodes} edges connected and registered in {:.1?}",
        t.elapsed()
    );
    // Every edge reads (and ACKs) on its own task, noting when a message about `web` came.
    let seen: Arc<std::sync::Mutex<Vec<Instant>>> = Arc::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut readers = Vec::new();
    for mut e in edges.drain(..) {
        let (seen, stop) = (seen.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    m = e.next(Duration::from_millis(500)) => {
                        if let Some(m) = m
                            && m.route.resource.ends_with("/service/web")
                            && let Ok(mut v) = seen.lock()
                        {
                            v.push(Instant::now());
                        }
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    if let Ok(mut v) = seen.lock() {
        v.clear();
    }
    let service_sent = || {
        cloud
            .metrics
            .messages_sent
            .get_or_create(&cloudcore::metrics::ResourceLabel {
                resource: "service",
            })
            .get()
    };
    let sent_before = service_sent();
    let mut s = serde_json::to_value(svcs.get("web").await?)?;
    s["metadata"]["labels"] = json!({"changed": "yes"});
    let t = Instant::now();
    svcs.replace("web", &PostParams::default(), &serde_json::from_value(s)?)
        .await?;
    while seen.lock().map(|v| v.len()).unwrap_or(0) < nodes && t.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let last = seen
        .lock()
        .ok()
        .and_then(|v| v.iter().max().copied())
        .map(|i| i.duration_since(t))
        .unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = seen.lock().map(|v| v.len()).unwrap_or(0);
    let sent = service_sent() - sent_before;
    println!(
        "  one Service change: {sent} messages sent by cloudhub, {got} received by {nodes} edges; every edge had it {last:.1?} after the change"
    );
    stop.cancel();
    for r in readers {
        let _ = r.await;
    }
    cloud.shutdown().await;
    api.shutdown().await;
    Ok(())
}
