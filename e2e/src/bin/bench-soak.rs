//! Soak benchmark: cloudcore and two edgecores, each its own process, on a private containerd,
//! under steady churn for a long time, sampling every process's resources. Prints numbers and
//! writes them to a CSV; fails only when the run does not end converged. Needs root.
//!
//!     cargo build --profile bench-fast -p cloudcore -p edgecore -p e2e
//!     target/bench-fast/bench-soak                    # 60 minutes
//!     SOAK_MINUTES=1440 target/bench-fast/bench-soak  # 24 hours
//!
//! The in-memory API server runs in this process (with KubeEdge's device CRDs); cloudcore and
//! the edgecores are the real binaries next to this one, each edge's cloud link through a
//! proxy this process can cut. Every `SOAK_TICK_SECONDS` (default 5): on each edge one pod
//! (of `SOAK_PODS`, default 4, each mounting ConfigMap `soak`) is replaced by a new one, the
//! ConfigMap is updated, and a simulated mapper reports new twin values of the edge's
//! `SOAK_DEVICES` (default 3) devices over DMI. Every `SOAK_CUT_EVERY_SECONDS` (default 240)
//! one edge's link is frozen for `SOAK_CUT_SECONDS` (default 30), churn going on, then healed;
//! half-way cloudcore is stopped (SIGTERM) and started again. Every `SOAK_SAMPLE_SECONDS`
//! (default 30) it samples RSS (and its anonymous part: heap and stacks, what a leak grows; the
//! rest is mostly the binary's code, paged in as code paths first run), open files and threads
//! of cloudcore, each edgecore, containerd and this process (the API server), and the size of
//! each edge's SQLite database (with WAL).
//!
//! At the end the churn stops and every edge must converge within 3 minutes: its database
//! holds exactly the pods the API server binds to it, with the ConfigMap's last value, every
//! pod Running in the API, each Device's reported twin the last value the mapper sent. Growth
//! is the least-squares slope of the samples after the warm-up (`SOAK_WARMUP_MINUTES`,
//! default a sixth of the run but at least 20 minutes, a third of runs under an hour), per
//! hour, relative to the mean.

use anyhow::Context;
use e2e::apiserver::{ApiServer, Config};
use e2e::bench::env_usize;
use e2e::channel::{FaultProxy, Pki};
use e2e::containerd::Containerd;
use e2e::devices;
use e2e::edge::{EdgeOptions, write_edge_config};
use e2e::images::BUSYBOX_IMAGE;
use e2e::process::LoggedProcess;
use e2e::procfs::{rss_kb, status_kb};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kubeedge_dmi::DeviceManagerServiceClient;
use kubeedge_dmi::v1beta1 as pb;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const NS: &str = "soak";

fn secs(name: &str, default: usize) -> Duration {
    Duration::from_secs(env_usize(name, default) as u64)
}

/// Open file descriptors of a process (0 when it is gone).
fn open_files(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

/// A SQLite database with its WAL and shared-memory files, bytes.
fn db_bytes(db: &Path) -> u64 {
    ["", "-wal", "-shm"]
        .iter()
        .filter_map(|s| std::fs::metadata(format!("{}{s}", db.display())).ok())
        .map(|m| m.len())
        .sum()
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// cloudcore's configuration: the test PKI's CA and server certificate, loopback listeners,
/// no stream, router or iptables manager.
fn write_cloud_config(dir: &Path, pki: &Pki, kubeconfig: &Path) -> anyhow::Result<(PathBuf, u16)> {
    std::fs::create_dir_all(dir)?;
    let file = |n: &str| dir.join(n).display().to_string();
    std::fs::write(dir.join("rootCA.crt"), &pki.ca.cert.cert_pem)?;
    std::fs::write(dir.join("rootCA.key"), &pki.ca.cert.key_pem)?;
    std::fs::write(dir.join("server.crt"), &pki.server.cert_pem)?;
    std::fs::write(dir.join("server.key"), &pki.server.key_pem)?;
    let ws_port = free_port()?;
    let mut cfg = cloudcore::config::CloudCoreConfig::default();
    cfg.kube_api_config.kube_config = kubeconfig.display().to_string();
    cfg.common_config.monitor_server.bind_address = String::new();
    let hub = &mut cfg.modules.cloud_hub;
    hub.tls_ca_file = file("rootCA.crt");
    hub.tls_ca_key_file = file("rootCA.key");
    hub.tls_cert_file = file("server.crt");
    hub.tls_private_key_file = file("server.key");
    hub.advertise_address = vec!["127.0.0.1".into()];
    hub.websocket.address = "127.0.0.1".into();
    hub.websocket.port = ws_port;
    hub.https.address = "127.0.0.1".into();
    hub.https.port = free_port()?;
    cfg.modules.cloud_stream.enable = false;
    cfg.modules.router.enable = false;
    cfg.modules.iptables_manager.enable = false;
    let path = dir.join("cloudcore.yaml");
    std::fs::write(&path, cfg.to_yaml())?;
    Ok((path, ws_port))
}

fn start_cloud(bin: &Path, config: &Path, dir: &Path) -> anyhow::Result<LoggedProcess> {
    let mut cmd = Command::new(bin);
    cmd.arg("--config").arg(config).env(
        "RUST_LOG",
        std::env::var("SOAK_LOG").unwrap_or_else(|_| "warn".into()),
    );
    LoggedProcess::spawn("cloudcore", cmd, dir)
        .with_context(|| format!("starting {}", bin.display()))
}

struct Edge {
    node: String,
    dir: PathBuf,
    link: FaultProxy,
    process: LoggedProcess,
    /// The pods it should run, oldest first.
    pods: VecDeque<String>,
    mapper: Option<DeviceManagerServiceClient<tonic::transport::Channel>>,
}

fn start_edge(
    bin: &Path,
    dir: &Path,
    node: &str,
    link: FaultProxy,
    pki: &Pki,
    endpoint: &str,
) -> anyhow::Result<Edge> {
    std::fs::create_dir_all(dir.join("manifests"))?;
    let options = EdgeOptions {
        node_status_update_frequency_secs: 10,
        metaserver: true,
        ..EdgeOptions::new(node)
    };
    write_edge_config(dir, pki, node, &link.addr.to_string(), endpoint, &options);
    let mut cmd = Command::new(bin);
    cmd.arg("--config").arg(dir.join("edgecore.yaml")).env(
        "RUST_LOG",
        std::env::var("SOAK_LOG").unwrap_or_else(|_| "warn".into()),
    );
    let process = LoggedProcess::spawn("edgecore", cmd, dir)
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok(Edge {
        node: node.to_string(),
        dir: dir.to_path_buf(),
        link,
        process,
        pods: VecDeque::new(),
        mapper: None,
    })
}

fn pod(name: &str, node: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"soak": "yes"}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "1000000"],
                "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}],
            "volumes": [{"name": "cfg", "configMap": {"name": "soak"}}]}
    }))?)
}

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

fn report(name: &str, value: u64) -> pb::ReportDeviceStatusRequest {
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
        device_namespace: NS.into(),
        reported_device: Some(pb::DeviceStatus {
            twins: vec![twin("temperature"), twin("setpoint")],
            ..Default::default()
        }),
    }
}

/// Registers a simulated mapper with the edge (once its DMI server listens).
async fn register_mapper(
    edge: &Edge,
) -> Option<DeviceManagerServiceClient<tonic::transport::Channel>> {
    let ch = kubeedge_dmi::connect_uds(edge.dir.join("dmi.sock"))
        .await
        .ok()?;
    let mut c = DeviceManagerServiceClient::new(ch);
    let req = pb::MapperRegisterRequest {
        with_data: true,
        mapper: Some(pb::MapperInfo {
            name: "soak-mapper".into(),
            version: "v1".into(),
            api_version: "v1.0.0".into(),
            protocol: "modbus".into(),
            address: edge
                .dir
                .join("soak-mapper.sock")
                .display()
                .to_string()
                .into_bytes(),
            state: "OK".into(),
        }),
    };
    c.mapper_register(req).await.ok()?;
    Some(c)
}

/// One sample of one process.
#[derive(Clone, Copy, Default)]
struct Sample {
    rss_kb: u64,
    /// The anonymous part of the RSS (heap, stacks): what a leak grows. The rest is mostly the
    /// binary's code, paged in as code paths first run (bounded by the binary's size).
    anon_kb: u64,
    files: u64,
    threads: u64,
    db_bytes: u64,
}

fn sample(pid: u32, db: Option<&Path>) -> Sample {
    Sample {
        rss_kb: rss_kb(pid),
        anon_kb: status_kb(pid, "RssAnon:").unwrap_or(0),
        files: open_files(pid),
        threads: status_kb(pid, "Threads:").unwrap_or(0),
        db_bytes: db.map_or(0, db_bytes),
    }
}

/// Least-squares slope of `ys` over `xs` (hours), as % of the mean per hour.
fn growth_per_hour(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    if xs.len() < 2 {
        return f64::NAN;
    }
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let cov: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let var: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    if var == 0.0 || my == 0.0 {
        return 0.0;
    }
    100.0 * (cov / var) / my
}

/// The pods (namespace/name) and the ConfigMap value an edge's database holds.
fn edge_view(db: &Path) -> anyhow::Result<(BTreeSet<String>, Option<String>)> {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let mut stmt =
        c.prepare(r#"SELECT type, value FROM meta WHERE type IN ('pod', 'configmap')"#)?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
    let (mut pods, mut cm) = (BTreeSet::new(), None);
    for row in rows {
        let (kind, value) = row?;
        let v: Value = serde_json::from_str(&value).unwrap_or_default();
        if v["metadata"]["namespace"] != NS {
            continue;
        }
        let name = v["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if kind == "pod" {
            pods.insert(name);
        } else if name == "soak" {
            cm = v["data"]["v"].as_str().map(str::to_string);
        }
    }
    Ok((pods, cm))
}

struct Soak {
    client: kube::Client,
    edges: Vec<Edge>,
    next_pod: u64,
    value: u64,
    pods_per_edge: usize,
    devices_per_edge: usize,
}

impl Soak {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// One round of churn: a pod replaced per edge, the ConfigMap updated, device reports.
    async fn churn(&mut self) -> anyhow::Result<()> {
        self.value += 1;
        let value = self.value;
        let pods = self.pods();
        for e in &mut self.edges {
            if e.pods.len() >= self.pods_per_edge
                && let Some(old) = e.pods.pop_front()
            {
                let _ = pods.delete(&old, &DeleteParams::default()).await;
            }
            self.next_pod += 1;
            let name = format!("{}-p{}", e.node, self.next_pod);
            pods.create(&PostParams::default(), &pod(&name, &e.node)?)
                .await
                .with_context(|| format!("creating pod {name}"))?;
            e.pods.push_back(name);
        }
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), NS);
        cms.patch(
            "soak",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"v": value.to_string()}})),
        )
        .await?;
        for e in &mut self.edges {
            if e.mapper.is_none() {
                e.mapper = register_mapper(e).await;
            }
            if let Some(m) = &mut e.mapper {
                for d in 0..self.devices_per_edge {
                    // The edge buffers reports while its link is down; a failed call is a
                    // report lost at the mapper, as with a real one: the next round resends.
                    let _ = m
                        .report_device_status(report(&format!("{}-d{d}", e.node), value))
                        .await;
                }
            }
        }
        Ok(())
    }

    /// Whether everything has converged; `Err` says what has not.
    async fn converged(&self) -> anyhow::Result<Result<(), String>> {
        let api_pods = self.pods().list(&Default::default()).await?;
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), NS);
        let want_cm = cms
            .get("soak")
            .await?
            .data
            .and_then(|d| d.get("v").cloned());
        let mut bound: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for p in &api_pods.items {
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            let name = p.metadata.name.clone().unwrap_or_default();
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            if p.metadata.deletion_timestamp.is_some() {
                return Ok(Err(format!("pod {name} is still being deleted")));
            }
            if !running {
                return Ok(Err(format!("pod {name} is not Running")));
            }
            bound.entry(node).or_default().insert(name);
        }
        for e in &self.edges {
            let db = e.dir.join("edgecore.db");
            let (pods, cm) = tokio::task::spawn_blocking(move || edge_view(&db)).await??;
            let want = bound.get(&e.node).cloned().unwrap_or_default();
            if pods != want {
                return Ok(Err(format!(
                    "{}: the edge holds pods {pods:?}, the API server binds {want:?}",
                    e.node
                )));
            }
            if cm != want_cm {
                return Ok(Err(format!(
                    "{}: the edge holds ConfigMap value {cm:?}, the API server {want_cm:?}",
                    e.node
                )));
            }
        }
        let want = self.value.to_string();
        let devs = devices::devices(&self.client, NS)
            .list(&Default::default())
            .await?;
        for d in devs.items {
            let v = serde_json::to_value(&d)?;
            for twin in ["temperature", "setpoint"] {
                let got = devices::twin_value(&v, twin, "reported");
                if got.as_deref() != Some(&want) {
                    return Ok(Err(format!(
                        "device {}: {twin} reported {got:?}, last sent {want}",
                        d.metadata.name.unwrap_or_default()
                    )));
                }
            }
        }
        Ok(Ok(()))
    }
}

async fn soak() -> anyhow::Result<()> {
    let minutes = env_usize("SOAK_MINUTES", 60);
    let total = Duration::from_secs(minutes as u64 * 60);
    let warmup = secs("SOAK_WARMUP_MINUTES", 0).saturating_mul(60);
    // A sixth of the run, at least 20 minutes (a third of runs under an hour): the first
    // 40-minute run's edgecores rose for ~18 minutes while their bounded caches filled.
    let warmup = if warmup.is_zero() {
        (total / 6).max(Duration::from_secs(1200).min(total / 3))
    } else {
        warmup
    };
    let tick = secs("SOAK_TICK_SECONDS", 5);
    let sample_every = secs("SOAK_SAMPLE_SECONDS", 30);
    let cut_every = secs("SOAK_CUT_EVERY_SECONDS", 240);
    let cut_for = secs("SOAK_CUT_SECONDS", 30);
    let here = std::env::current_exe()?;
    let (cloud_bin, edge_bin) = (
        here.with_file_name("cloudcore"),
        here.with_file_name("edgecore"),
    );
    for b in [&cloud_bin, &edge_bin] {
        anyhow::ensure!(
            b.exists(),
            "{} missing: build with `cargo build --profile bench-fast -p cloudcore -p edgecore -p e2e`",
            b.display()
        );
    }
    let root = std::env::temp_dir().join(format!("bench-soak-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    println!(
        "bench-soak: {minutes} min (warm-up {:.0} min), churn every {tick:?}, a link frozen {cut_for:?} every {cut_every:?}, cloudcore restarted half-way; samples every {sample_every:?} in {}",
        warmup.as_secs_f64() / 60.0,
        root.join("samples.csv").display()
    );

    let containerd = tokio::task::spawn_blocking(Containerd::start).await??;
    let api = ApiServer::start(Config::default()).await?;
    let client = api.client()?;
    devices::install(&client).await?;
    for ns in ["kubeedge", NS] {
        let mut n = Namespace::default();
        n.metadata.name = Some(ns.into());
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &n)
            .await?;
    }
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "soak"}, "data": {"v": "0"}}))?,
    )
    .await?;
    let model: DynamicObject = serde_json::from_value(devices::thermostat_model("thermostat"))?;
    devices::models(&client, NS)
        .create(&PostParams::default(), &model)
        .await?;

    let pki = Pki::new()?;
    let cloud_dir = root.join("cloud");
    let (cloud_config, ws_port) = write_cloud_config(&cloud_dir, &pki, api.kubeconfig_path())?;
    let mut cloud = start_cloud(&cloud_bin, &cloud_config, &cloud_dir)?;
    let hub: std::net::SocketAddr = ([127, 0, 0, 1], ws_port).into();

    let devices_per_edge = env_usize("SOAK_DEVICES", 3);
    let mut edges = Vec::new();
    for i in 0..2 {
        let node = format!("soak-edge-{i}");
        let link = FaultProxy::start(hub).await?;
        edges.push(start_edge(
            &edge_bin,
            &root.join(&node),
            &node,
            link,
            &pki,
            &containerd.endpoint(),
        )?);
        for d in 0..devices_per_edge {
            let dev: DynamicObject =
                serde_json::from_value(device(&format!("{node}-d{d}"), &node))?;
            devices::devices(&client, NS)
                .create(&PostParams::default(), &dev)
                .await?;
        }
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let t = Instant::now();
    for e in &edges {
        loop {
            let ready = nodes
                .get_opt(&e.node)
                .await?
                .and_then(|n| n.status?.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready {
                break;
            }
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(120),
                "{} not Ready:\n{}\n{}",
                e.node,
                e.process.failure_report(30),
                cloud.failure_report(30)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    let mut s = Soak {
        client: client.clone(),
        edges,
        next_pod: 0,
        value: 0,
        pods_per_edge: env_usize("SOAK_PODS", 4),
        devices_per_edge,
    };
    let mut csv = std::fs::File::create(root.join("samples.csv"))?;
    writeln!(
        csv,
        "seconds,process,rss_kb,rss_anon_kb,open_files,threads,db_bytes"
    )?;
    // (name, time in hours, sample) after the warm-up, for the summary.
    let mut series: BTreeMap<String, Vec<(f64, Sample)>> = BTreeMap::new();
    let mut firsts: BTreeMap<String, Sample> = BTreeMap::new();
    let start = Instant::now();
    let (mut next_sample, mut next_cut) = (Duration::ZERO, cut_every);
    let mut cut: Option<(usize, Duration)> = None;
    let mut restarted = false;
    let mut cuts = 0;
    let mut churn_errors = 0u64;
    while start.elapsed() < total {
        let now = start.elapsed();
        if let Err(e) = s.churn().await {
            churn_errors += 1;
            eprintln!("churn at {:.0} s: {e:#}", now.as_secs_f64());
        }
        if let Some((i, until)) = cut
            && now >= until
        {
            s.edges[i].link.thaw();
            cut = None;
        }
        if cut.is_none() && now >= next_cut {
            let i = cuts % s.edges.len();
            s.edges[i].link.freeze();
            cut = Some((i, now + cut_for));
            cuts += 1;
            next_cut = now + cut_every;
        }
        if !restarted && now >= total / 2 {
            restarted = true;
            drop(cloud);
            cloud = start_cloud(&cloud_bin, &cloud_config, &cloud_dir)?;
            println!("  {:>6.0} s: cloudcore restarted", now.as_secs_f64());
            // The next sample once the new cloudcore is up, not while it starts.
            next_sample = next_sample.max(now + tick * 2);
        }
        for e in &mut s.edges {
            anyhow::ensure!(
                e.process.is_running(),
                "edgecore exited:\n{}",
                e.process.failure_report(40)
            );
        }
        anyhow::ensure!(
            cloud.is_running(),
            "cloudcore exited:\n{}",
            cloud.failure_report(40)
        );
        if now >= next_sample {
            next_sample = now + sample_every;
            let mut procs: Vec<(String, u32, Option<PathBuf>)> = vec![
                ("cloudcore".into(), cloud.pid(), None),
                ("apiserver+bench".into(), std::process::id(), None),
                ("containerd".into(), containerd.pid(), None),
            ];
            for e in &s.edges {
                procs.push((
                    e.node.clone(),
                    e.process.pid(),
                    Some(e.dir.join("edgecore.db")),
                ));
            }
            let mut line = format!("  {:>6.0} s:", now.as_secs_f64());
            for (name, pid, db) in procs {
                let smp = sample(pid, db.as_deref());
                writeln!(
                    csv,
                    "{:.0},{name},{},{},{},{},{}",
                    now.as_secs_f64(),
                    smp.rss_kb,
                    smp.anon_kb,
                    smp.files,
                    smp.threads,
                    smp.db_bytes
                )?;
                line += &format!(
                    " {name} {:.1} MB (anon {:.1})/{}f/{}t",
                    smp.rss_kb as f64 / 1024.0,
                    smp.anon_kb as f64 / 1024.0,
                    smp.files,
                    smp.threads
                );
                if smp.db_bytes > 0 {
                    line += &format!("/db {:.0} kB", smp.db_bytes as f64 / 1024.0);
                }
                if now >= warmup {
                    firsts.entry(name.clone()).or_insert(smp);
                    series
                        .entry(name)
                        .or_default()
                        .push((now.as_secs_f64() / 3600.0, smp));
                }
            }
            println!("{line}");
        }
        tokio::time::sleep(tick).await;
    }
    if let Some((i, _)) = cut {
        s.edges[i].link.thaw();
    }
    let churned = start.elapsed();
    println!(
        "churn done after {:.1} min: {} pods created, {} ConfigMap updates, {} device report rounds, {cuts} link cuts, 1 cloudcore restart, {churn_errors} churn rounds failed",
        churned.as_secs_f64() / 60.0,
        s.next_pod,
        s.value,
        s.value
    );

    // Convergence: everything the API server has, every edge has.
    let t = Instant::now();
    let mut why = String::new();
    while t.elapsed() < Duration::from_secs(180) {
        match s.converged().await? {
            Ok(()) => {
                why.clear();
                break;
            }
            Err(w) => why = w,
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    anyhow::ensure!(
        why.is_empty(),
        "not converged 180 s after the churn stopped: {why}"
    );
    println!(
        "converged {:.1} s after the churn stopped: every edge holds exactly its pods (all Running) and the ConfigMap's last value; every Device reports the last value",
        t.elapsed().as_secs_f64()
    );

    println!(
        "\nafter the warm-up ({:.0} min): first → last sample, growth per hour (least squares, % of the mean)",
        warmup.as_secs_f64() / 60.0
    );
    for (name, points) in &series {
        let xs: Vec<f64> = points.iter().map(|(x, _)| *x).collect();
        let first = firsts[name];
        let last = points.last().map(|(_, s)| *s).unwrap_or_default();
        let g = |f: fn(&Sample) -> u64| {
            let ys: Vec<f64> = points.iter().map(|(_, s)| f(s) as f64).collect();
            growth_per_hour(&xs, &ys)
        };
        let mut line = format!(
            "  {name:<16} RSS {:.1} → {:.1} MB ({:+.2} %/h), anonymous {:.1} → {:.1} MB ({:+.2} %/h), files {} → {} ({:+.2} %/h), threads {} → {} ({:+.2} %/h)",
            first.rss_kb as f64 / 1024.0,
            last.rss_kb as f64 / 1024.0,
            g(|s| s.rss_kb),
            first.anon_kb as f64 / 1024.0,
            last.anon_kb as f64 / 1024.0,
            g(|s| s.anon_kb),
            first.files,
            last.files,
            g(|s| s.files),
            first.threads,
            last.threads,
            g(|s| s.threads)
        );
        if last.db_bytes > 0 {
            line += &format!(
                ", SQLite {:.0} → {:.0} kB ({:+.2} %/h)",
                first.db_bytes as f64 / 1024.0,
                last.db_bytes as f64 / 1024.0,
                g(|s| s.db_bytes)
            );
        }
        println!("{line}");
    }

    // Teardown: pods first (the edges remove their containers), then the processes.
    let _ = s
        .pods()
        .delete_collection(&DeleteParams::default(), &Default::default())
        .await;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        let left = s.edges.iter().map(|e| {
            let db = e.dir.join("edgecore.db");
            edge_view(&db).map(|(p, _)| p.len()).unwrap_or(0)
        });
        if left.sum::<usize>() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let nodes_left: Vec<String> = s.edges.iter().map(|e| e.node.clone()).collect();
    drop(s);
    drop(cloud);
    for n in nodes_left {
        e2e::edge::remove_cgroups(&n);
    }
    api.shutdown().await;
    tokio::task::spawn_blocking(move || drop(containerd)).await?;
    if std::env::var_os("SOAK_KEEP").is_none() {
        let csv = std::env::temp_dir().join(format!("bench-soak-{}.csv", std::process::id()));
        let _ = std::fs::copy(root.join("samples.csv"), &csv);
        let _ = std::fs::remove_dir_all(&root);
        println!("samples: {}", csv.display());
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    e2e::bench::env_configured_cli(include_str!("bench-soak.rs"));
    kubeedge_shared::tls::install_default_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(soak())
}
