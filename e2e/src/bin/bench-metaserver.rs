//! MetaServer benchmark. Prints numbers; asserts nothing.
//!
//!     cargo build --profile bench-fast -p edgecore -p e2e
//!     target/bench-fast/bench-metaserver
//!
//! 1. In this process: an edge database and a MetaServer (cloud link down) with `BENCH_OBJECTS`
//!    (default 1,000) pods. List latency (`GET /api/v1/pods`, all of them, JSON), and watch
//!    latency: the time from a metamanager write (`MetaStore::upsert` returned, i.e. durable)
//!    to the event on an open watch, over 200 writes.
//! 2. Memory: two real `edgecore` processes (edged off) against cloudcore and the in-memory
//!    API server in this process, one with the MetaServer on; `BENCH_OBJECTS` pods bound to
//!    each node; the RSS of both once every pod is stored, and of the MetaServer one after a
//!    list and with a watch open.

use anyhow::Context;
use e2e::apiserver::{ApiServer, Config};
use e2e::bench::{env_usize, percentile};
use e2e::channel::Pki;
use e2e::cloud::CloudFixture;
use e2e::process::LoggedProcess;
use e2e::procfs::rss_kb;
use edgecore::edgehub::CloudLink;
use edgecore::edgehub::{HubError, LinkEvent};
use edgecore::metamanager::{MetaRecord, MetaStore};
use edgecore::metaserver::{Limits, MetaServer, MetaServerConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kubeedge_shared::Message;
use serde_json::json;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

#[derive(Clone)]
struct Offline(tokio::sync::broadcast::Sender<LinkEvent>);

impl CloudLink for Offline {
    fn is_connected(&self) -> bool {
        false
    }
    async fn send(&self, _msg: Message) -> Result<(), HubError> {
        Err(HubError::NotConnected)
    }
    async fn request(&self, _msg: Message, _t: Duration) -> Result<Message, HubError> {
        Err(HubError::NotConnected)
    }
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<LinkEvent> {
        self.0.subscribe()
    }
}

fn pod_json(name: &str, node: &str, rv: u64) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "resourceVersion": rv.to_string(), "labels": {"app": "bench", "tier": "edge"},
                     "creationTimestamp": "2026-11-26T00:00:00Z"},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox",
                 "command": ["sleep", "3600"], "resources": {"requests": {"cpu": "10m"}}}]},
        "status": {"phase": "Running", "podIP": "10.88.0.5"}})
}

async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<usize> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await?;
    anyhow::ensure!(
        out.starts_with(b"HTTP/1.1 200"),
        "{path}: {}",
        String::from_utf8_lossy(&out[..out.len().min(200)])
    );
    Ok(out.len())
}

async fn in_process(objects: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = MetaStore::open(dir.path().join("edge.db")).await?;
    for i in 0..objects {
        let name = format!("p{i}");
        store
            .upsert(MetaRecord::new(
                format!("default/pod/{name}"),
                "pod",
                pod_json(&name, "edge-b", 1 + i as u64).to_string(),
            ))
            .await?;
    }
    let server = MetaServer::start(
        MetaServerConfig {
            addr: "127.0.0.1:0".parse()?,
            node: "edge-b".into(),
            remote_timeout: Duration::from_secs(10),
            bookmark_interval: Duration::from_secs(60),
            limits: Limits::default(),
            secure: None,
            serve: true,
            standing: Vec::new(),
            held_pods: None,
            confirm_upgrade: None,
        },
        store.clone(),
        Offline(tokio::sync::broadcast::channel(4).0),
    )
    .await?;
    let addr = server.local_addr();
    let mut lists = Vec::new();
    let mut bytes = 0;
    for _ in 0..50 {
        let t = Instant::now();
        bytes = get(addr, "/api/v1/pods").await?;
        lists.push(t.elapsed());
    }
    lists.sort();
    println!(
        "list of {objects} pods at the edge ({} KB JSON): p50 {:.1?}, p99 {:.1?}",
        bytes / 1024,
        percentile(&lists, 0.5),
        percentile(&lists, 0.99)
    );

    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let rv = objects as u64;
    s.write_all(
        format!("GET /api/v1/pods?watch=1&resourceVersion={rv}&timeoutSeconds=600 HTTP/1.1\r\nHost: x\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).await?;
        if line == "\r\n" {
            break;
        }
    }
    let mut lat = Vec::new();
    for i in 0..200u64 {
        let name = format!("p{}", i as usize % objects.max(1));
        let rec = MetaRecord::new(
            format!("default/pod/{name}"),
            "pod",
            pod_json(&name, "edge-b", rv + 1 + i).to_string(),
        );
        store.upsert(rec).await?;
        let written = Instant::now();
        loop {
            line.clear();
            tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line))
                .await
                .context("no watch event within 5 s")??;
            if line.contains("\"MODIFIED\"") {
                break;
            }
        }
        lat.push(written.elapsed());
    }
    lat.sort();
    println!(
        "watch event after the metamanager's durable write (200 writes): p50 {:.2?}, p99 {:.2?}, max {:.2?}",
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or_default()
    );
    let (events, hist) = server.history_size();
    println!("watch history: {events} events, {} KB", hist / 1024);
    server.shutdown().await;
    store.close().await;
    Ok(())
}

fn start_edge(
    bin: &Path,
    root: &Path,
    node: &str,
    server: SocketAddr,
    pki: &Pki,
    metaserver: Option<SocketAddr>,
) -> anyhow::Result<(PathBuf, LoggedProcess)> {
    let dir = root.join(node);
    std::fs::create_dir_all(&dir)?;
    let cert = pki.node_cert(node)?;
    std::fs::write(dir.join("ca.crt"), &pki.ca.cert.cert_pem)?;
    std::fs::write(dir.join("edge.crt"), &cert.cert_pem)?;
    std::fs::write(dir.join("edge.key"), &cert.key_pem)?;
    let yaml = format!(
        "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\n\
         database:\n  dataSource: {d}/edgecore.db\n\
         modules:\n  edgeHub:\n    messageQPS: 0\n    tlsCaFile: {d}/ca.crt\n    tlsCertFile: {d}/edge.crt\n    tlsPrivateKeyFile: {d}/edge.key\n\
         \x20   websocket:\n      server: {server}\n\
         \x20 deviceTwin:\n    dmiSockPath: {d}\n\
         \x20 eventBus:\n    enable: false\n\
         \x20 metaManager:\n    metaServer:\n      enable: {enable}\n      server: {addr}\n\
         \x20 edged:\n    enable: false\n    hostnameOverride: {node}\n",
        d = dir.display(),
        enable = metaserver.is_some(),
        addr = metaserver
            .map(|a| a.to_string())
            .unwrap_or_else(|| "127.0.0.1:10550".into()),
    );
    std::fs::write(dir.join("edgecore.yaml"), yaml)?;
    let mut cmd = Command::new(bin);
    cmd.arg("--config")
        .arg(dir.join("edgecore.yaml"))
        .env("RUST_LOG", "warn");
    let p = LoggedProcess::spawn("edgecore", cmd, &dir)
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok((dir, p))
}

fn stored_pods(dir: &Path) -> i64 {
    rusqlite::Connection::open_with_flags(
        dir.join("edgecore.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .and_then(|c| {
        c.query_row("SELECT count(*) FROM meta WHERE type='pod'", [], |r| {
            r.get(0)
        })
    })
    .unwrap_or(0)
}

async fn memory(objects: usize) -> anyhow::Result<()> {
    let bin = std::env::current_exe()?.with_file_name("edgecore");
    anyhow::ensure!(
        bin.exists(),
        "{} missing: build with `cargo build --profile bench-fast -p edgecore -p e2e`",
        bin.display()
    );
    let api = ApiServer::start(Config::default()).await?;
    let client = api.client()?;
    let pki = Pki::new()?;
    let cloud = CloudFixture::start(client.clone(), &pki).await?;
    let root = std::env::temp_dir().join(format!("bench-metaserver-{}", std::process::id()));
    let ms_addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let (off_dir, off) = start_edge(&bin, &root, "ms-off", cloud.hub.local_addr(), &pki, None)?;
    let (on_dir, on) = start_edge(
        &bin,
        &root,
        "ms-on",
        cloud.hub.local_addr(),
        &pki,
        Some(ms_addr),
    )?;
    let t = Instant::now();
    while !cloud.hub.is_connected("ms-off") || !cloud.hub.is_connected("ms-on") {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(30),
            "edges did not connect"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "edgecore RSS idle: MetaServer off {} KB, on {} KB",
        rss_kb(off.pid()),
        rss_kb(on.pid())
    );
    // edged is off: the nodes are registered here (cloudcore routes pods by node).
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for node in ["ms-off", "ms-on"] {
        let n = serde_json::from_value(json!({"metadata": {"name": node,
            "labels": {kubeedge_shared::constants::EDGE_NODE_LABEL: ""}}}))?;
        nodes.create(&PostParams::default(), &n).await?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for node in ["ms-off", "ms-on"] {
        for i in 0..objects {
            let mut p = pod_json(&format!("{node}-{i}"), node, 0);
            p["metadata"].as_object_mut().map(|m| {
                m.remove("uid");
                m.remove("resourceVersion");
                m.remove("creationTimestamp")
            });
            p.as_object_mut().map(|m| m.remove("status"));
            pods.create(&PostParams::default(), &serde_json::from_value(p)?)
                .await?;
        }
    }
    println!(
        "{} pods created; waiting for the edges to store them",
        2 * objects
    );
    let t = Instant::now();
    while stored_pods(&off_dir) < objects as i64 || stored_pods(&on_dir) < objects as i64 {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(300),
            "pods did not reach the edges"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (a, b) = (rss_kb(off.pid()), rss_kb(on.pid()));
    println!(
        "edgecore RSS with {objects} pods stored: MetaServer off {a} KB, on {b} KB: +{} KB",
        b as i64 - a as i64
    );
    {
        let addr = ms_addr;
        get(addr, "/api/v1/pods").await?;
        let mut watch = tokio::net::TcpStream::connect(addr).await?;
        watch
            .write_all(b"GET /api/v1/pods?watch=1&timeoutSeconds=60 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await?;
        let mut buf = vec![0u8; 1 << 20];
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Ok(0)) =
                tokio::time::timeout(Duration::from_millis(200), watch.read(&mut buf)).await
            {
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let c = rss_kb(on.pid());
        println!(
            "edgecore RSS with the MetaServer after a list of {objects} pods and with a watch open: {c} KB: +{} KB over MetaServer off",
            c as i64 - a as i64
        );
    }
    drop((off, on));
    cloud.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    e2e::bench::env_configured_cli(include_str!("bench-metaserver.rs"));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BENCH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let objects = env_usize("BENCH_OBJECTS", 1000);
    println!("bench-metaserver: {objects} objects");
    in_process(objects).await?;
    memory(objects).await?;
    Ok(())
}
