//! Scale benchmark of cloudcore: the real `cloudcore` binary against the in-memory API server,
//! with many simulated edge nodes in this process speaking the real protocol (mTLS WebSocket,
//! keepalives, ACKs). Prints numbers; asserts nothing.
//!
//!     cargo build --profile bench-fast -p cloudcore -p e2e
//!     target/bench-fast/bench-cloudcore --nodes 1000 --pods-per-node 10
//!
//! Measures cloudcore's RSS (idle per node, and with pods delivered), CPU while idle, the time
//! for all nodes to connect, and p50/p99 from pod creation (API call) to the edge receiving it;
//! then a reconnect storm (`storm.rs`): every edge drops and redials at once after the cluster
//! changed, until every edge holds exactly what the cluster says. Exits non-zero when an edge
//! ends up with a missing, stale or extra object.
//!
//! `bench-cloudcore fleet` runs a fleet too large for one process: cloudcore replicas and
//! simulator processes sharing one `kube-memserver` (`fleet.rs`, `sim.rs`).

mod edge;
mod expected;
mod fleet;
mod sim;
mod storm;

use anyhow::Context;
use clap::Parser;
use e2e::apiserver::{ApiServer, Config};
use e2e::bench::{Scrape, apiserver_requests};
use e2e::channel::Pki;
use e2e::procfs::{cpu_ticks, rss_kb};
use edge::{Counters, EdgeState, Receipts};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

#[derive(Parser)]
#[command(about = "cloudcore scale benchmark with simulated edge nodes (prints numbers)")]
struct Args {
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    #[arg(long, default_value_t = 10)]
    pods_per_node: usize,
    /// Pods created one at a time (20 in flight) to measure creation → edge latency.
    #[arg(long, default_value_t = 1000)]
    latency_pods: usize,
    /// The cloudcore binary (default: next to this one).
    #[arg(long)]
    cloudcore: Option<PathBuf>,
    /// Run the reconnect storm after the other phases (`--storm false` to skip it).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    storm: bool,
    /// More edge nodes, with `--pods-per-node` pods each, that never connect: cloudcore holds
    /// their pods all the same (for the memory of a million pods where one process cannot hold
    /// that many connections: this machine allows 20,000 open files per process).
    #[arg(long, default_value_t = 0)]
    offline_nodes: usize,
}

pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(crate) struct CloudcoreProcess {
    pub(crate) child: Child,
    pub(crate) hub_port: u16,
    pub(crate) monitor: String,
}

impl Drop for CloudcoreProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn start_cloudcore(
    bin: &Path,
    dir: &Path,
    pki: &Pki,
    kubeconfig: &Path,
    max_handshakes: usize,
) -> anyhow::Result<CloudcoreProcess> {
    std::fs::write(dir.join("rootCA.crt"), &pki.ca.cert.cert_pem)?;
    std::fs::write(dir.join("rootCA.key"), &pki.ca.cert.key_pem)?;
    let hub_port = free_port()?;
    let https_port = free_port()?;
    let monitor = format!("127.0.0.1:{}", free_port()?);
    let config = format!(
        r#"apiVersion: cloudcore.config.kubeedge.io/v1alpha2
kind: CloudCore
commonConfig:
  monitorServer:
    bindAddress: "{monitor}"
kubeAPIConfig:
  kubeConfig: "{kc}"
modules:
  cloudHub:
    advertiseAddress: ["127.0.0.1"]
    nodeLimit: 100000
    maxConcurrentHandshakes: {max_handshakes}
    tlsCAFile: "{dir}/rootCA.crt"
    tlsCAKeyFile: "{dir}/rootCA.key"
    tlsCertFile: "{dir}/none.crt"
    tlsPrivateKeyFile: "{dir}/none.key"
    websocket:
      enable: true
      address: 127.0.0.1
      port: {hub_port}
    https:
      enable: true
      address: 127.0.0.1
      port: {https_port}
    unixsocket:
      enable: false
"#,
        kc = kubeconfig.display(),
        dir = dir.display(),
    );
    let path = dir.join("cloudcore.yaml");
    std::fs::write(&path, config)?;
    let mut command = Command::new(bin);
    command
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    // Dies with the benchmark, however it ends.
    let child =
        e2e::process::spawn_tied(command).with_context(|| format!("starting {}", bin.display()))?;
    Ok(CloudcoreProcess {
        child,
        hub_port,
        monitor,
    })
}

pub(crate) async fn wait_ready(monitor: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(monitor).await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            s.write_all(b"GET /readyz HTTP/1.0\r\n\r\n").await?;
            let mut buf = Vec::new();
            let _ = s.read_to_end(&mut buf).await;
            if buf.starts_with(b"HTTP/1.0 200") || buf.starts_with(b"HTTP/1.1 200") {
                return Ok(());
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "cloudcore did not become ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "bench"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}]}
    }))
    .unwrap_or_default()
}

pub(crate) fn pct(v: &mut [Duration], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort();
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)].as_secs_f64() * 1e3
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("bench-cloudcore-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let api = ApiServer::start(Config {
        history_limit: 500_000,
        watch_capacity: 200_000,
        node_monitor_grace_period: Duration::from_secs(3600),
        pod_gc_orphan_quarantine: Duration::from_secs(3600),
        ..Config::default()
    })
    .await?;
    let client = api.client()?;
    let pki = Pki::new()?;
    let bin = match args.cloudcore.clone() {
        Some(b) => b,
        None => std::env::current_exe()?.with_file_name("cloudcore"),
    };
    let cc = start_cloudcore(
        &bin,
        &dir,
        &pki,
        api.kubeconfig_path(),
        kubeedge_shared::constants::DEFAULT_MAX_HANDSHAKES,
    )?;
    let pid = cc.child.id();
    wait_ready(&cc.monitor).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_start = rss_kb(pid);
    let n = args.nodes;
    println!(
        "bench-cloudcore: {n} nodes × {} pods, cloudcore pid {pid}",
        args.pods_per_node
    );

    // Edge nodes in the API.
    let nodes: Api<Node> = Api::all(client.clone());
    let sem = Arc::new(Semaphore::new(64));
    let t = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let nodes = nodes.clone();
        let permit = sem.clone().acquire_owned().await?;
        tasks.push(tokio::spawn(async move {
            let node: Node =
                serde_json::from_value(json!({"metadata": {"name": format!("edge-{i}"),
                "labels": {"node-role.kubernetes.io/edge": ""}}}))
                .unwrap_or_default();
            let r = nodes.create(&PostParams::default(), &node).await;
            drop(permit);
            r.map(|_| ())
        }));
    }
    for t in tasks {
        t.await??;
    }
    println!(
        "  {n} Node objects created in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Connect every edge.
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", cc.hub_port).parse()?;
    let receipts: Receipts = Arc::new(Mutex::new(HashMap::new()));
    let counters = Arc::new(Counters::default());
    let epoch = Instant::now();
    let edges: Vec<Arc<EdgeState>> = (0..n)
        .map(|i| EdgeState::new(format!("edge-{i}"), epoch))
        .collect();
    let mut tls = Vec::with_capacity(n);
    let stop = tokio_util::sync::CancellationToken::new();
    let t = Instant::now();
    let sem = Arc::new(Semaphore::new(128));
    let mut tasks = Vec::with_capacity(n);
    for e in &edges {
        let config = pki.edge_tls(&pki.node_cert(&e.node)?)?;
        tls.push(config.clone());
        let permit = sem.clone().acquire_owned().await?;
        let (e, tls, r, c, stop) = (
            e.clone(),
            config,
            receipts.clone(),
            counters.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let raw = edge::dial(addr, &e, tls.clone(), &c, 1).await;
            drop(permit);
            tokio::spawn(edge::keep(addr, raw?, e, tls, c, r, stop));
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let connect = t.elapsed();
    println!(
        "  all {n} nodes connected in {:.2} s ({:.0} nodes/s, 128 concurrent handshakes)",
        connect.as_secs_f64(),
        n as f64 / connect.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_idle = rss_kb(pid);
    let c0 = cpu_ticks(pid);
    let m0 = Scrape::fetch(&cc.monitor).await.unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle_cpu = (cpu_ticks(pid) - c0) as f64 / 10.0; // ticks/s = % of one core
    let m1 = Scrape::fetch(&cc.monitor).await.unwrap_or_default();
    let (idle_requests, idle_by_verb) = apiserver_requests(&m1.since(&m0));
    println!(
        "  cloudcore RSS: {rss_start} KB at start, {rss_idle} KB with {n} idle nodes → {:.1} KB per idle node",
        (rss_idle.saturating_sub(rss_start)) as f64 / n as f64
    );
    println!("  cloudcore CPU while idle (keepalives only): {idle_cpu:.1}% of one core");
    println!(
        "  cloudcore → apiserver requests while idle: {:.1}/s over 10 s ({idle_by_verb})",
        idle_requests / 10.0
    );

    // Pods: pods_per_node per node, as fast as the API takes them.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let total = n * args.pods_per_node;
    let m0 = Scrape::fetch(&cc.monitor).await.unwrap_or_default();
    let t = Instant::now();
    let sem = Arc::new(Semaphore::new(64));
    let mut tasks = Vec::with_capacity(total);
    for i in 0..total {
        let pods = pods.clone();
        let permit = sem.clone().acquire_owned().await?;
        tasks.push(tokio::spawn(async move {
            let p = pod(&format!("p-{i}"), &format!("edge-{}", i % n));
            let r = pods.create(&PostParams::default(), &p).await;
            drop(permit);
            r.map(|_| ())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let created = t.elapsed();
    let deadline = Instant::now() + Duration::from_secs(300);
    while counters.pods_received.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let delivered = t.elapsed();
    println!(
        "  {total} pods created in {:.1} s; all delivered to their edges (and ACKed) after {:.1} s ({} received)",
        created.as_secs_f64(),
        delivered.as_secs_f64(),
        counters.pods_received.load(Ordering::Relaxed)
    );
    let m1 = Scrape::fetch(&cc.monitor).await.unwrap_or_default();
    let (requests, by_verb) = apiserver_requests(&m1.since(&m0));
    println!(
        "  cloudcore → apiserver requests while the pods were delivered: {requests:.0} ({by_verb})"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_pods = rss_kb(pid);
    println!(
        "  cloudcore RSS with {total} pods delivered: {rss_pods} KB ({:.1} KB per node)",
        (rss_pods.saturating_sub(rss_start)) as f64 / n as f64
    );

    if args.offline_nodes > 0 {
        offline_phase(&client, args.offline_nodes, args.pods_per_node, pid).await?;
    }

    // Latency: creation → arrival, 20 creations in flight.
    let mut lat = Vec::with_capacity(args.latency_pods);
    let sem = Arc::new(Semaphore::new(20));
    let mut tasks = Vec::with_capacity(args.latency_pods);
    for i in 0..args.latency_pods {
        let pods = pods.clone();
        let permit = sem.clone().acquire_owned().await?;
        tasks.push(tokio::spawn(async move {
            let name = format!("lat-{i}");
            let start = std::time::SystemTime::now();
            let r = pods
                .create(
                    &PostParams::default(),
                    &pod(&name, &format!("edge-{}", i % n)),
                )
                .await;
            drop(permit);
            r.map(|_| (format!("default/pod/{name}"), start))
        }));
    }
    let mut starts = Vec::with_capacity(args.latency_pods);
    for t in tasks {
        starts.push(t.await??);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = receipts
            .lock()
            .map(|r| starts.iter().all(|(k, _)| r.contains_key(k)))
            .unwrap_or(false);
        if done || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Ok(r) = receipts.lock() {
        for (k, s) in &starts {
            if let Some(at) = r.get(k) {
                lat.push(at.duration_since(*s).unwrap_or_default());
            }
        }
    }
    println!(
        "  pod creation → edge receipt ({} of {} pods, 20 creations in flight): p50 {:.1} ms, p99 {:.1} ms",
        lat.len(),
        args.latency_pods,
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99)
    );
    let result = if args.storm {
        storm::Storm {
            client: client.clone(),
            pods_total: total,
            pid,
            monitor: &cc.monitor,
            addr,
            edges: &edges,
            tls: &tls,
            counters: counters.clone(),
            receipts: receipts.clone(),
            stop,
        }
        .run()
        .await
    } else {
        Ok(())
    };
    drop(cc);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Edge nodes that never connect, with their pods: what cloudcore's memory is with them all.
async fn offline_phase(
    client: &kube::Client,
    nodes: usize,
    pods_per_node: usize,
    pid: u32,
) -> anyhow::Result<()> {
    let rss_before = rss_kb(pid);
    let node_api: Api<Node> = Api::all(client.clone());
    let sem = Arc::new(Semaphore::new(64));
    let t = Instant::now();
    let mut tasks = Vec::with_capacity(nodes);
    for i in 0..nodes {
        let api = node_api.clone();
        let permit = sem.clone().acquire_owned().await?;
        tasks.push(tokio::spawn(async move {
            let node: Node =
                serde_json::from_value(json!({"metadata": {"name": format!("off-{i}"),
                "labels": {"node-role.kubernetes.io/edge": ""}}}))
                .unwrap_or_default();
            let r = api.create(&PostParams::default(), &node).await;
            drop(permit);
            r.map(|_| ())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let total = nodes * pods_per_node;
    let mut tasks = Vec::with_capacity(4096);
    for i in 0..total {
        let pods = pods.clone();
        let permit = sem.clone().acquire_owned().await?;
        tasks.push(tokio::spawn(async move {
            let p = pod(&format!("q-{i}"), &format!("off-{}", i % nodes));
            let r = pods.create(&PostParams::default(), &p).await;
            drop(permit);
            r.map(|_| ())
        }));
        if tasks.len() == 4096 {
            for t in tasks.drain(..) {
                t.await??;
            }
            if (i + 1) % 100_000 < 4096 {
                println!("  … {} offline pods created", i + 1);
            }
        }
    }
    for t in tasks {
        t.await??;
    }
    println!(
        "  {nodes} offline edge nodes and their {total} pods created in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // cloudcore's watcher catches up: wait until its RSS settles.
    let mut last = rss_kb(pid);
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = rss_kb(pid);
        if now.abs_diff(last) * 100 < last {
            last = now;
            break;
        }
        last = now;
    }
    println!(
        "  cloudcore RSS with the offline nodes' pods as well: {last} KB ({:.2} GB; {:.2} KB per offline pod)",
        last as f64 / 1e6,
        (last.saturating_sub(rss_before)) as f64 / total as f64
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    kubeedge_shared::tls::install_default_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // `fleet`: several cloudcore replicas and simulator processes (fleet.rs); `sim`: one of
    // those simulator processes; otherwise the one-process benchmark.
    let mut argv = std::env::args();
    let program = argv.next().unwrap_or_default();
    match std::env::args().nth(1).as_deref() {
        Some("fleet") => {
            let args = fleet::FleetArgs::parse_from(std::iter::once(program).chain(argv.skip(1)));
            rt.block_on(fleet::run(args))
        }
        Some("sim") => {
            let args = sim::SimArgs::parse_from(std::iter::once(program).chain(argv.skip(1)));
            rt.block_on(sim::run(args))
        }
        _ => rt.block_on(bench(Args::parse())),
    }
}
