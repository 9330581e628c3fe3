//! Benchmarks of the cloud–edge channel. Prints numbers; asserts nothing.
//!
//!     cargo run --release -p e2e --bin bench-channel [-- --messages 200000 --sessions 1000]
//!
//! 1. codec: encode + decode of a typical pod message;
//! 2. one connection, cloud → edge → ACK: ACKed messages per second and p50/p99 latency from
//!    `CloudHub::send` to the cloud seeing the ACK (edgehub ACKs every message it receives);
//! 3. memory per idle session: RSS of a separate cloudhub process before and after N sessions.

use clap::Parser;
use cloudcore::cloudhub::{CloudHub, HubConfig};
use cloudcore::metrics::HubMetrics;
use e2e::channel::{Pki, RawEdge, start_edge, test_edge_config};
use kubeedge_shared::{FrameCodec, Group, Message, Operation, tls};
use serde_json::json;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(about = "Benchmarks of the cloudhub ⇄ edgehub channel (prints numbers)")]
struct Args {
    /// Messages for the throughput run.
    #[arg(long, default_value_t = 200_000)]
    messages: usize,
    /// Idle sessions for the memory run.
    #[arg(long, default_value_t = 1000)]
    sessions: usize,
    /// Internal: serve a cloudhub from the PEM files in this directory.
    #[arg(long, hide = true)]
    serve: Option<PathBuf>,
}

fn typical_pod(i: usize) -> Message {
    let name = format!("web-{i}");
    Message::new(
        "edgecontroller",
        Group::Resource,
        Operation::Update,
        format!("default/pod/{name}"),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": format!("6b1f0a52-0000-4000-8000-{i:012}"),
                "resourceVersion": (1000 + i).to_string(), "creationTimestamp": "2026-11-21T10:00:00Z",
                "labels": {"app": "web", "tier": "frontend"}, "annotations": {"kubernetes.io/config.seen": "2026-11-21T10:00:00Z"}},
            "spec": {"nodeName": "edge-1", "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
                "dnsPolicy": "ClusterFirst", "serviceAccountName": "default", "schedulerName": "default-scheduler",
                "containers": [{"name": "web", "image": "localhost:5000/busybox:latest", "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", "httpd -f -p 8080"], "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "env": [{"name": "MODE", "value": "prod"}, {"name": "CONFIG", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}}],
                    "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}, "requests": {"cpu": "50m", "memory": "32Mi"}},
                    "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"}, {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
                    "livenessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 10}}],
                "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}},
                    {"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}, {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}],
                "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]},
            "status": {"phase": "Pending", "qosClass": "Burstable"}
        }),
    )
    .with_resource_version((1000 + i).to_string())
}

fn codec_bench() {
    let codec = FrameCodec::default();
    let msg = typical_pod(1);
    let frame = codec.encode(&msg).unwrap_or_default();
    let n = 50_000;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(codec.encode(std::hint::black_box(&msg)).ok());
    }
    let enc = t.elapsed();
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(codec.decode(std::hint::black_box(frame.as_bytes())).ok());
    }
    let dec = t.elapsed();
    println!("codec: typical pod message {} bytes", frame.len());
    println!(
        "  encode: {:>10.0} msg/s  ({:.2} µs/msg)",
        n as f64 / enc.as_secs_f64(),
        enc.as_secs_f64() * 1e6 / n as f64
    );
    println!(
        "  decode: {:>10.0} msg/s  ({:.2} µs/msg)",
        n as f64 / dec.as_secs_f64(),
        dec.as_secs_f64() * 1e6 / n as f64
    );
}

async fn throughput_bench(messages: usize) -> anyhow::Result<()> {
    let pki = Pki::new()?;
    let mut cfg = e2e::channel::test_hub_config();
    cfg.keepalive_interval = Duration::from_secs(60);
    cfg.queue.max_messages = messages + 10;
    cfg.queue.max_bytes = usize::MAX / 2;
    cfg.queue.window = 1024;
    cfg.queue.retry_interval = Duration::from_secs(30);
    let (hub, _up) = CloudHub::bind(cfg, pki.server_tls()?, HubMetrics::default()).await?;
    let mut acks = hub.subscribe_acks(messages + 10);
    let mut edge_cfg = test_edge_config(hub.local_addr(), "edge-1");
    edge_cfg.heartbeat = Duration::from_secs(10);
    edge_cfg.dead_link_timeout = Duration::from_secs(60);
    let (edge, mut inbound) = start_edge(&pki, edge_cfg)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !hub.is_connected("edge-1") {
        anyhow::ensure!(Instant::now() < deadline, "edge did not connect");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The edge ACKs everything it receives, as metamanager does after its write.
    let acker = edge.clone();
    tokio::spawn(async move {
        while let Some(m) = inbound.recv().await {
            if acker.send(Message::ack_for(&m)).await.is_err() {
                break;
            }
        }
    });
    // Pre-encode nothing: the benchmark includes the cloud's encoding in send().
    let msgs: Vec<Message> = (0..messages).map(typical_pod).collect();
    let mut sent_at: HashMap<String, Instant> = HashMap::with_capacity(messages);
    let start = Instant::now();
    let mut latencies = Vec::with_capacity(messages);
    let mut sent = 0usize;
    let mut iter = msgs.into_iter();
    // Keep at most ~4k messages outstanding so the queue never becomes the bottleneck.
    while latencies.len() < messages {
        while sent - latencies.len() < 4096 {
            let Some(m) = iter.next() else { break };
            sent_at.insert(m.header.id.clone(), Instant::now());
            hub.send("edge-1", m)?;
            sent += 1;
        }
        let Some(a) = tokio::time::timeout(Duration::from_secs(30), acks.recv()).await? else {
            anyhow::bail!("ack stream ended")
        };
        if let Some(t) = sent_at.remove(&a.message.msg_id) {
            latencies.push(t.elapsed());
        }
        while let Ok(a) = acks.try_recv() {
            if let Some(t) = sent_at.remove(&a.message.msg_id) {
                latencies.push(t.elapsed());
            }
        }
    }
    let total = start.elapsed();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    println!("one connection, cloud → edge → ACK ({messages} pod messages, ≤4096 outstanding):");
    println!(
        "  throughput: {:>10.0} ACKed msg/s",
        messages as f64 / total.as_secs_f64()
    );
    println!(
        "  latency:    p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        pct(1.0).as_secs_f64() * 1e3
    );

    // Unloaded latency: one message at a time.
    let mut single = Vec::new();
    for i in 0..500 {
        let m = typical_pod(messages + i);
        let t = Instant::now();
        hub.send("edge-1", m)?;
        tokio::time::timeout(Duration::from_secs(10), acks.recv()).await?;
        single.push(t.elapsed());
    }
    single.sort();
    println!(
        "  unloaded (one at a time, 500): p50 {:.3} ms, p99 {:.3} ms",
        single[250].as_secs_f64() * 1e3,
        single[495].as_secs_f64() * 1e3
    );
    edge.shutdown();
    hub.shutdown();
    Ok(())
}

fn rss_kb(pid: u32) -> anyhow::Result<u64> {
    e2e::procfs::status_kb(pid, "VmRSS:").ok_or_else(|| anyhow::anyhow!("no VmRSS for {pid}"))
}

fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit only read and write the struct passed in.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

async fn serve(dir: PathBuf) -> anyhow::Result<()> {
    raise_fd_limit();
    let ca = tls::load_certs(&dir.join("ca.crt"))?;
    let chain = tls::load_certs(&dir.join("server.crt"))?;
    let key = tls::load_key(&dir.join("server.key"))?;
    let cfg = HubConfig {
        listen: "127.0.0.1:0".parse()?,
        keepalive_interval: Duration::from_secs(600),
        node_limit: 1_000_000,
        ..HubConfig::default()
    };
    let (hub, _up) = CloudHub::bind(
        cfg,
        tls::server_config(chain, key, &ca, true)?,
        HubMetrics::default(),
    )
    .await?;
    println!("{}", hub.local_addr());
    std::io::stdout().flush()?;
    // Serve until stdin closes (the parent exits or drops the pipe).
    tokio::task::spawn_blocking(|| {
        let mut s = String::new();
        while std::io::stdin()
            .read_line(&mut s)
            .map(|n| n > 0)
            .unwrap_or(false)
        {}
    })
    .await?;
    Ok(())
}

async fn memory_bench(sessions: usize) -> anyhow::Result<()> {
    raise_fd_limit();
    let pki = Pki::new()?;
    let dir = tempfile_dir()?;
    std::fs::write(dir.join("ca.crt"), &pki.ca.cert.cert_pem)?;
    std::fs::write(dir.join("server.crt"), &pki.server.cert_pem)?;
    std::fs::write(dir.join("server.key"), &pki.server.key_pem)?;
    let mut child = Command::new(std::env::current_exe()?)
        .arg("--serve")
        .arg(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(
        child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?,
    )
    .read_line(&mut line)?;
    let addr: std::net::SocketAddr = line.trim().parse()?;
    // Warm up: one session so lazily built state (TLS tables, task runtime) is counted once.
    let mut edges = Vec::with_capacity(sessions + 1);
    let warm = pki.edge_tls(&pki.node_cert("warm")?)?;
    edges.push(
        RawEdge::connect(addr, "warm", warm)
            .await
            .map_err(anyhow::Error::msg)?,
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kb(child.id())?;
    let start = Instant::now();
    for i in 0..sessions {
        let node = format!("edge-{i}");
        let tls = pki.edge_tls(&pki.node_cert(&node)?)?;
        edges.push(
            RawEdge::connect(addr, &node, tls)
                .await
                .map_err(anyhow::Error::msg)?,
        );
    }
    let connect_time = start.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kb(child.id())?;
    println!("idle sessions ({sessions}) held by a separate cloudhub process:");
    println!(
        "  connect (sequential, TLS + upgrade): {:.1} s, {:.0} sessions/s",
        connect_time.as_secs_f64(),
        sessions as f64 / connect_time.as_secs_f64()
    );
    println!(
        "  cloudhub RSS: {before} KB → {after} KB; per idle session: {:.1} KB",
        (after.saturating_sub(before)) as f64 / sessions as f64
    );
    drop(edges);
    drop(child.stdin.take());
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("bench-channel-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if let Some(dir) = args.serve {
        return rt.block_on(serve(dir));
    }
    println!(
        "bench-channel: {} cores",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    codec_bench();
    rt.block_on(throughput_bench(args.messages))?;
    rt.block_on(memory_bench(args.sessions))?;
    Ok(())
}
