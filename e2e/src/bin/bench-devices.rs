//! Device benchmark: twin reports per second from mappers to Device status through one
//! cloudcore, and edgecore memory per device. Prints numbers; asserts nothing.
//!
//!     cargo build --profile bench-fast -p edgecore -p e2e
//!     target/bench-fast/bench-devices
//!
//! The in-memory API server (with the device CRDs) and cloudcore run in this process;
//! `BENCH_EDGES` (default 4) real `edgecore` processes (edged and eventbus off) each get
//! `BENCH_DEVICES` (default 500) Devices with two properties. A simulated mapper per edge
//! registers over DMI, then reports both twins of every device `BENCH_ROUNDS` (default 10)
//! times with increasing values (64 calls in flight per edge). Measured:
//! - reports/s: all reports sent ÷ the time until every Device's status shows the last value;
//! - the Device status writes cloudcore made for them (later reports fold into pending ones);
//! - edgecore RSS before the devices, with them, and after the reports, per device.
//!
//! `BENCH_HOLD=<seconds>` keeps everything running at the end (the edgecore PIDs are printed).

use anyhow::Context;
use e2e::apiserver::{ApiServer, Config};
use e2e::bench::env_usize;
use e2e::channel::Pki;
use e2e::cloud::CloudFixture;
use e2e::devices;
use e2e::process::LoggedProcess;
use e2e::procfs::rss_kb;
use futures_util::StreamExt;
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::runtime::watcher;
use kubeedge_dmi::DeviceManagerServiceClient;
use kubeedge_dmi::v1beta1 as pb;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn device(name: &str, node: &str) -> Value {
    let prop = |n: &str, offset: u16| {
        json!({"name": n, "reportToCloud": true,
            "visitors": {"protocolName": "modbus",
                "configData": {"register": "HoldingRegister", "offset": offset}}})
    };
    json!({
        "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
        "metadata": {"name": name},
        "spec": {"deviceModelRef": {"name": "thermostat"}, "nodeName": node,
            "protocol": {"protocolName": "modbus",
                "configData": {"ip": "127.0.0.1", "port": 5020}},
            "properties": [prop("temperature", 0), prop("setpoint", 1)]}
    })
}

struct Edge {
    node: String,
    dir: PathBuf,
    process: LoggedProcess,
}

fn start_edge(
    bin: &Path,
    root: &Path,
    i: usize,
    server: std::net::SocketAddr,
    pki: &Pki,
) -> anyhow::Result<Edge> {
    let node = format!("edge-dev-{i}");
    let dir = root.join(&node);
    std::fs::create_dir_all(&dir)?;
    let cert = pki.node_cert(&node)?;
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
         \x20 edged:\n    enable: false\n    hostnameOverride: {node}\n",
        d = dir.display(),
    );
    std::fs::write(dir.join("edgecore.yaml"), yaml)?;
    let mut cmd = Command::new(bin);
    cmd.arg("--config").arg(dir.join("edgecore.yaml")).env(
        "RUST_LOG",
        std::env::var("BENCH_EDGECORE_LOG").unwrap_or_else(|_| "warn".into()),
    );
    let process = LoggedProcess::spawn("edgecore", cmd, &dir)
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok(Edge { node, dir, process })
}

/// Waits until the edge's database holds `want` devices (membership rows and device objects).
async fn wait_rows(edge: &Edge, want: usize, limit: Duration) -> anyhow::Result<()> {
    let db = edge.dir.join("edgecore.db");
    let start = Instant::now();
    loop {
        let db = db.clone();
        let counts = tokio::task::spawn_blocking(move || -> rusqlite::Result<(i64, i64)> {
            let c = rusqlite::Connection::open_with_flags(
                db,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )?;
            let rows = c.query_row(r#"SELECT count(*) FROM "device""#, [], |r| r.get(0))?;
            let objects = c.query_row(
                r#"SELECT count(*) FROM meta WHERE type='device'"#,
                [],
                |r| r.get(0),
            )?;
            Ok((rows, objects))
        })
        .await?;
        if let Ok((rows, objects)) = counts
            && rows as usize >= want
            && objects as usize >= want
        {
            return Ok(());
        }
        anyhow::ensure!(
            start.elapsed() < limit,
            "{}: {counts:?} of {want} devices at the edge within {limit:?}",
            edge.node
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Registers a simulated mapper until edgecore lists `want` devices; returns the client.
async fn register_until(
    edge: &Edge,
    want: usize,
    limit: Duration,
) -> anyhow::Result<DeviceManagerServiceClient<tonic::transport::Channel>> {
    let start = Instant::now();
    let mut last = 0;
    loop {
        anyhow::ensure!(
            start.elapsed() < limit,
            "{}: only {last} of {want} devices reached the edge within {limit:?}",
            edge.node
        );
        if let Ok(ch) = kubeedge_dmi::connect_uds(edge.dir.join("dmi.sock")).await {
            let mut c = DeviceManagerServiceClient::new(ch);
            let req = pb::MapperRegisterRequest {
                with_data: true,
                mapper: Some(pb::MapperInfo {
                    name: "bench-mapper".into(),
                    version: "v1".into(),
                    api_version: "v1.0.0".into(),
                    protocol: "modbus".into(),
                    address: edge
                        .dir
                        .join("bench-mapper.sock")
                        .display()
                        .to_string()
                        .into_bytes(),
                    state: "OK".into(),
                }),
            };
            if let Ok(r) = c.mapper_register(req).await {
                last = r.into_inner().device_list.len();
                if last >= want {
                    return Ok(c);
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn report(name: &str, value: usize) -> pb::ReportDeviceStatusRequest {
    let twin = |p: &str| pb::Twin {
        property_name: p.into(),
        reported: Some(pb::TwinProperty {
            value: value.to_string(),
            metadata: Default::default(),
        }),
        observed_desired: None,
    };
    pb::ReportDeviceStatusRequest {
        device_name: name.into(),
        device_namespace: "default".into(),
        reported_device: Some(pb::DeviceStatus {
            twins: vec![twin("temperature"), twin("setpoint")],
            ..Default::default()
        }),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    e2e::bench::env_configured_cli(include_str!("bench-devices.rs"));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BENCH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let edges_n = env_usize("BENCH_EDGES", 4);
    let per_edge = env_usize("BENCH_DEVICES", 500);
    let rounds = env_usize("BENCH_ROUNDS", 10);
    let bin = std::env::current_exe()?.with_file_name("edgecore");
    anyhow::ensure!(
        bin.exists(),
        "{} missing: build with `cargo build --profile bench-fast -p edgecore -p e2e`",
        bin.display()
    );
    println!(
        "bench-devices: {edges_n} edges × {per_edge} devices, {rounds} rounds of reports (2 twins each)"
    );

    let api = ApiServer::start(Config::default()).await?;
    let client = api.client()?;
    devices::install(&client).await?;
    let pki = Pki::new()?;
    let cloud = CloudFixture::start(client.clone(), &pki).await?;
    let root = std::env::temp_dir().join(format!("bench-devices-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    let mut edges = Vec::new();
    for i in 0..edges_n {
        edges.push(start_edge(&bin, &root, i, cloud.hub.local_addr(), &pki)?);
    }
    let t = Instant::now();
    while edges.iter().any(|e| !cloud.hub.is_connected(&e.node)) {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(30),
            "edges did not connect"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_idle: Vec<u64> = edges.iter().map(|e| rss_kb(e.process.pid())).collect();

    // Devices, in two halves: the RSS growth of the second half is the cost per device (the
    // first half also pays one-time costs: the DMI server's first calls, table pages…).
    let model: DynamicObject = serde_json::from_value(devices::thermostat_model("thermostat"))?;
    devices::models(&client, "default")
        .create(&PostParams::default(), &model)
        .await?;
    let api_devices = devices::devices(&client, "default");
    let half = per_edge / 2;
    let t = Instant::now();
    let mut mappers = Vec::new();
    let mut rss_half = Vec::new();
    for (from, to) in [(0, half), (half, per_edge)] {
        for e in &edges {
            for j in from..to {
                let d: DynamicObject =
                    serde_json::from_value(device(&format!("{}-d{j}", e.node), &e.node))?;
                api_devices.create(&PostParams::default(), &d).await?;
            }
        }
        for e in &edges {
            wait_rows(e, to, Duration::from_secs(300)).await?;
        }
        if from == 0 {
            tokio::time::sleep(Duration::from_secs(2)).await;
            rss_half = edges.iter().map(|e| rss_kb(e.process.pid())).collect();
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_devices: Vec<u64> = edges.iter().map(|e| rss_kb(e.process.pid())).collect();
    for e in &edges {
        mappers.push(register_until(e, per_edge, Duration::from_secs(300)).await?);
    }
    let delivered = t.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_registered: Vec<u64> = edges.iter().map(|e| rss_kb(e.process.pid())).collect();
    println!(
        "devices: {} created, stored at their edges and listed to a registering mapper in {delivered:.1?}",
        edges_n * per_edge
    );

    // Count the Device status writes while reporting.
    let writes = Arc::new(AtomicU64::new(0));
    let counter = writes.clone();
    let watch_api = api_devices.clone();
    let watch = tokio::spawn(async move {
        let mut s = watcher::watcher(watch_api, watcher::Config::default()).boxed();
        while let Some(ev) = s.next().await {
            if let Ok(watcher::Event::Apply(_)) = ev {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    writes.store(0, Ordering::Relaxed);

    let total = edges_n * per_edge * rounds;
    let start = Instant::now();
    let mut senders = Vec::new();
    for (e, mapper) in edges.iter().zip(mappers) {
        let names: Vec<String> = (0..per_edge).map(|j| format!("{}-d{j}", e.node)).collect();
        senders.push(tokio::spawn(async move {
            for r in 1..=rounds {
                futures_util::stream::iter(names.iter())
                    .for_each_concurrent(64, |n| {
                        let mut m = mapper.clone();
                        async move {
                            let _ = m.report_device_status(report(n, r)).await;
                        }
                    })
                    .await;
            }
        }));
    }
    for s in senders {
        s.await?;
    }
    let sent = start.elapsed();
    let want = rounds.to_string();
    loop {
        let list = api_devices.list(&ListParams::default()).await?;
        let done = list
            .items
            .iter()
            .filter(|d| {
                let v = serde_json::to_value(d).unwrap_or_default();
                devices::twin_value(&v, "temperature", "reported").as_deref() == Some(&want)
                    && devices::twin_value(&v, "setpoint", "reported").as_deref() == Some(&want)
            })
            .count();
        if done == edges_n * per_edge {
            break;
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(600),
            "only {done} devices converged within 600 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let converged = start.elapsed();
    let status_writes = writes.load(Ordering::Relaxed);
    watch.abort();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_after: Vec<u64> = edges.iter().map(|e| rss_kb(e.process.pid())).collect();

    println!(
        "reports: {total} (each with 2 twins) sent in {sent:.2?}, every Device status at the last value after {converged:.2?}"
    );
    println!(
        "  → {:.0} reports/s end to end (mapper → edgecore → cloudcore → Device status); {status_writes} status writes ({:.2} reports per write)",
        total as f64 / converged.as_secs_f64(),
        total as f64 / status_writes.max(1) as f64
    );
    for (i, e) in edges.iter().enumerate() {
        let second = (per_edge - half).max(1) as f64;
        let per_device = (rss_devices[i] as f64 - rss_half[i] as f64) * 1024.0 / second;
        let per_device_after =
            (rss_after[i] as f64 - rss_idle[i] as f64) * 1024.0 / per_edge.max(1) as f64;
        println!(
            "edgecore {}: RSS {} KB idle, {} KB with {half} devices, {} KB with {per_edge} ({per_device:.0} B per device), {} KB after a mapper registered (withData: every device listed), {} KB after the reports (all growth since idle ÷ devices: {per_device_after:.0} B, one-time costs and twins included)",
            e.node, rss_idle[i], rss_half[i], rss_devices[i], rss_registered[i], rss_after[i]
        );
    }
    if let Some(secs) = std::env::var("BENCH_HOLD")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        let pids: Vec<u32> = edges.iter().map(|e| e.process.pid()).collect();
        println!("holding {secs} s for inspection; edgecore pids {pids:?}");
        tokio::time::sleep(Duration::from_secs(secs)).await;
    }
    drop(edges);
    cloud.shutdown().await;
    api.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}
