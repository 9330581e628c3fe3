//! Idle-traffic benchmark: bytes on the wire per idle edge, both directions, TLS and TCP/IP
//! headers included, between the real `edgecore` and the real `cloudcore` (each its own
//! process) and between that cloudcore and the API server — with 0, 10 and 100 running pods
//! on the edge. Prints numbers; asserts nothing. Needs root (the edge's private containerd).
//!
//!     cargo build --profile bench-fast -p cloudcore -p edgecore -p e2e
//!     sudo target/bench-fast/bench-idle --window 600 --pods 0,10,100
//!
//! The edge dials cloudhub, and cloudcore the in-memory API server, through a
//! [`CountingProxy`], which reads `TCP_INFO` of the sockets facing the dialling side: payload
//! bytes (TLS records) and segments, pure ACKs included, each segment costing 52 bytes of
//! IPv4 + TCP headers with timestamps. For each pod count the pods are created and Running,
//! the link settles (`--settle`), then the window is measured. What the bytes are: cloudcore's
//! own counters over the same window (messages and their bytes by kind, apiserver requests by
//! verb and resource).

use anyhow::Context;
use clap::Parser;
use e2e::apiserver::{ApiServer, Config};
use e2e::bench::Scrape;
use e2e::channel::Pki;
use e2e::containerd::Containerd;
use e2e::images::{BUSYBOX_IMAGE, PAUSE_IMAGE};
use e2e::process::LoggedProcess;
use e2e::wire_proxy::{CountingProxy, WireTotals};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Parser)]
#[command(about = "bytes on the wire per idle edge (edge ↔ cloudcore, cloudcore ↔ apiserver)")]
struct Args {
    /// Seconds measured per pod count.
    #[arg(long, default_value_t = 600)]
    window: u64,
    /// Seconds between the pods running and the window (start-up traffic dies down).
    #[arg(long, default_value_t = 90)]
    settle: u64,
    /// Pod counts, in order (each phase adds pods to reach the count).
    #[arg(long, value_delimiter = ',', default_value = "0,10,100")]
    pods: Vec<usize>,
    /// Binaries (default: next to this one).
    #[arg(long)]
    cloudcore: Option<PathBuf>,
    #[arg(long)]
    edgecore: Option<PathBuf>,
    /// The edge offers neither `ping-keepalive` nor `cloud-lease` (as against a KubeEdge
    /// cloudcore: keepalive messages, the edge renews its Lease, node status every minute).
    #[arg(long)]
    plain: bool,
}

const NODE: &str = "edge-idle";

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The kubeconfig of `api` with its server address replaced by `via` (the counting proxy).
fn kubeconfig_via(
    api: &ApiServer,
    via: std::net::SocketAddr,
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(api.kubeconfig_path())?;
    let text = text.replace(
        &format!("127.0.0.1:{}", api.addr().port()),
        &format!("127.0.0.1:{}", via.port()),
    );
    let path = dir.join("kubeconfig-via-proxy");
    std::fs::write(&path, text)?;
    Ok(path)
}

fn start_cloudcore(
    bin: &Path,
    dir: &Path,
    pki: &Pki,
    kubeconfig: &Path,
) -> anyhow::Result<(LoggedProcess, u16, String)> {
    std::fs::write(dir.join("rootCA.crt"), &pki.ca.cert.cert_pem)?;
    std::fs::write(dir.join("rootCA.key"), &pki.ca.cert.key_pem)?;
    let hub_port = free_port()?;
    let monitor = format!("127.0.0.1:{}", free_port()?);
    let https_port = free_port()?;
    let config = format!(
        "apiVersion: cloudcore.config.kubeedge.io/v1alpha2\nkind: CloudCore\n\
         commonConfig:\n  monitorServer:\n    bindAddress: \"{monitor}\"\n\
         kubeAPIConfig:\n  kubeConfig: \"{kc}\"\n\
         modules:\n  cloudHub:\n    advertiseAddress: [\"127.0.0.1\"]\n\
         \x20   tlsCAFile: \"{d}/rootCA.crt\"\n    tlsCAKeyFile: \"{d}/rootCA.key\"\n\
         \x20   tlsCertFile: \"{d}/none.crt\"\n    tlsPrivateKeyFile: \"{d}/none.key\"\n\
         \x20   websocket:\n      enable: true\n      address: 127.0.0.1\n      port: {hub_port}\n\
         \x20   https:\n      enable: true\n      address: 127.0.0.1\n      port: {https_port}\n",
        kc = kubeconfig.display(),
        d = dir.display(),
    );
    let path = dir.join("cloudcore.yaml");
    std::fs::write(&path, config)?;
    let mut cmd = Command::new(bin);
    cmd.arg("--config").arg(&path).env(
        "RUST_LOG",
        std::env::var("BENCH_CLOUDCORE_LOG").unwrap_or_else(|_| "warn".into()),
    );
    let p = LoggedProcess::spawn("cloudcore", cmd, dir)
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok((p, hub_port, monitor))
}

fn start_edgecore(
    bin: &Path,
    dir: &Path,
    pki: &Pki,
    server: std::net::SocketAddr,
    runtime: &Containerd,
    plain: bool,
) -> anyhow::Result<LoggedProcess> {
    let cert = pki.node_cert(NODE)?;
    std::fs::write(dir.join("ca.crt"), &pki.ca.cert.cert_pem)?;
    std::fs::write(dir.join("edge.crt"), &cert.cert_pem)?;
    std::fs::write(dir.join("edge.key"), &cert.key_pem)?;
    let endpoint = runtime.endpoint();
    let yaml = format!(
        "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\n\
         database:\n  dataSource: {d}/edgecore.db\n\
         modules:\n  edgeHub:\n    tlsCaFile: {d}/ca.crt\n    tlsCertFile: {d}/edge.crt\n    tlsPrivateKeyFile: {d}/edge.key\n\
         \x20   websocket:\n      server: {server}\n\
         \x20 deviceTwin:\n    dmiSockPath: {d}\n\
         \x20 edged:\n    hostnameOverride: {NODE}\n    nodeIP: 127.0.0.1\n    remoteRuntimeEndpoint: {endpoint}\n\
         \x20   podSandboxImage: {PAUSE_IMAGE}\n    rootDirectory: {d}/edged\n\
         \x20   tailoredKubeletConfig:\n      cgroupRoot: {cgroup_root}\n\
         \x20     evictionHard:\n        memory.available: 50Mi\n        nodefs.available: 1%\n        imagefs.available: 1%\n        nodefs.inodesFree: 1%\n",
        d = dir.display(),
        cgroup_root = e2e::edge::cgroup_root(NODE),
    );
    let yaml = if plain {
        format!("{yaml}kubeedgeRs:\n  pingKeepalive: false\n  cloudLease: false\n")
    } else {
        yaml
    };
    std::fs::write(dir.join("edgecore.yaml"), yaml)?;
    let mut cmd = Command::new(bin);
    cmd.arg("--config").arg(dir.join("edgecore.yaml")).env(
        "RUST_LOG",
        std::env::var("BENCH_EDGECORE_LOG").unwrap_or_else(|_| "warn".into()),
    );
    LoggedProcess::spawn("edgecore", cmd, dir)
        .with_context(|| format!("starting {}", bin.display()))
}

fn pod(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "1000000"]}]}
    }))?)
}

async fn wait_until<F, Fut>(what: &str, within: Duration, mut probe: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t = Instant::now();
    while !probe().await {
        anyhow::ensure!(t.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// What one window measured.
struct Window {
    secs: f64,
    edge: WireTotals,
    api: WireTotals,
    metrics: Scrape,
}

fn rate(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs
}

fn print_window(pods: usize, w: &Window) {
    let (up, down) = (
        rate(w.edge.to_upstream, w.secs),
        rate(w.edge.to_client, w.secs),
    );
    let (api_out, api_in) = (
        rate(w.api.to_upstream, w.secs),
        rate(w.api.to_client, w.secs),
    );
    println!(
        "  {pods:>3} pods: edge → cloud {up:6.1} B/s, cloud → edge {down:6.1} B/s, total {:6.1} B/s \
         ({:.0} KB/h; payload {} + {} B, {} + {} segments); cloudcore → apiserver {api_out:6.1} B/s, \
         apiserver → cloudcore {api_in:6.1} B/s, total {:6.1} B/s ({:.0} KB/h, {} new connections)",
        up + down,
        (up + down) * 3.6,
        w.edge.to_upstream_flow.payload,
        w.edge.to_client_flow.payload,
        w.edge.to_upstream_flow.segments,
        w.edge.to_client_flow.segments,
        api_out + api_in,
        (api_out + api_in) * 3.6,
        w.api.connections,
    );
    let m = &w.metrics;
    let per_hour = |n: f64| n * 3600.0 / w.secs;
    let show = |title: &str,
                counts: std::collections::BTreeMap<String, f64>,
                bytes: std::collections::BTreeMap<String, f64>| {
        let mut parts: Vec<String> = counts
            .iter()
            .filter(|(_, n)| **n > 0.0)
            .map(|(k, n)| match bytes.get(k) {
                Some(b) if *b > 0.0 => {
                    format!("{k} {:.0}/h ({:.0} B/h)", per_hour(*n), per_hour(*b))
                }
                _ => format!("{k} {:.0}/h", per_hour(*n)),
            })
            .collect();
        for (k, b) in &bytes {
            if !counts.contains_key(k) && *b > 0.0 {
                parts.push(format!("{k} ({:.0} B/h)", per_hour(*b)));
            }
        }
        if parts.is_empty() {
            parts.push("nothing".into());
        }
        println!("        {title}: {}", parts.join(", "));
    };
    show(
        "edge → cloud messages",
        m.by("cloudhub_messages_received_total", "resource", &[]),
        m.by(
            "cloudhub_message_bytes_total",
            "kind",
            &[("direction", "up")],
        ),
    );
    show(
        "cloud → edge messages",
        m.by("cloudhub_messages_sent_total", "resource", &[]),
        m.by(
            "cloudhub_message_bytes_total",
            "kind",
            &[("direction", "down")],
        ),
    );
    let mut requests = std::collections::BTreeMap::new();
    for (series, n) in &m.0 {
        if !series.starts_with("cloudcore_apiserver_requests_total{") || *n <= 0.0 {
            continue;
        }
        let labels = series.trim_start_matches("cloudcore_apiserver_requests_total");
        let get = |k: &str| {
            labels
                .split(&format!("{k}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("?")
                .to_string()
        };
        *requests
            .entry(format!("{} {}", get("verb"), get("resource")))
            .or_insert(0.0) += n;
    }
    let bytes_by = |name: &str| {
        let mut out = std::collections::BTreeMap::new();
        for (series, n) in &m.0 {
            if !series.starts_with(&format!("{name}{{")) {
                continue;
            }
            let get = |k: &str| {
                series
                    .split(&format!("{k}=\""))
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .unwrap_or("?")
                    .to_string()
            };
            *out.entry(format!("{} {}", get("verb"), get("resource")))
                .or_insert(0.0) += n;
        }
        out
    };
    let mut resp = bytes_by("cloudcore_apiserver_response_bytes_total");
    for (k, v) in bytes_by("cloudcore_apiserver_request_bytes_total") {
        *resp.entry(k).or_insert(0.0) += v;
    }
    show(
        "cloudcore → apiserver requests (body bytes both ways)",
        requests,
        resp,
    );
}

/// Kubernetes Events by "reason (object kind)" → their total count (a repeat grows `count`).
async fn event_counts(client: &kube::Client) -> std::collections::BTreeMap<String, i64> {
    let api: Api<k8s_openapi::api::core::v1::Event> = Api::all(client.clone());
    let mut out = std::collections::BTreeMap::new();
    if let Ok(list) = api.list(&ListParams::default()).await {
        for e in list.items {
            let key = format!(
                "{} ({} {})",
                e.reason.unwrap_or_default(),
                e.involved_object.kind.unwrap_or_default(),
                e.message
                    .unwrap_or_default()
                    .chars()
                    .take(60)
                    .collect::<String>()
            );
            *out.entry(key).or_insert(0) += i64::from(e.count.unwrap_or(1).max(1));
        }
    }
    out
}

async fn measure(
    edge: &CountingProxy,
    api: &CountingProxy,
    monitor: &str,
    window: Duration,
) -> anyhow::Result<Window> {
    let (e0, a0) = (edge.totals(), api.totals());
    let m0 = Scrape::fetch(monitor).await.unwrap_or_default();
    let t = Instant::now();
    tokio::time::sleep(window).await;
    let (e1, a1) = (edge.totals(), api.totals());
    let m1 = Scrape::fetch(monitor).await.unwrap_or_default();
    Ok(Window {
        secs: t.elapsed().as_secs_f64(),
        edge: e1.since(&e0),
        api: a1.since(&a0),
        metrics: m1.since(&m0),
    })
}

async fn bench(args: Args) -> anyhow::Result<()> {
    // A node without a container runtime is NotReady and reports it: not idle.
    anyhow::ensure!(
        e2e::process::is_root(),
        "bench-idle needs root: the edge runs a private containerd"
    );
    let dir = std::env::temp_dir().join(format!("bench-idle-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let containerd = tokio::task::spawn_blocking(Containerd::start).await??;
    let api = ApiServer::start(Config::default()).await?;
    let client = api.client()?;
    // As in a cluster cloudcore is installed in: its namespace and every CRD it watches
    // (missing ones would show up as retries).
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "kubeedge"}}))?,
        )
        .await?;
    e2e::reliablesyncs::install(&client).await?;
    e2e::devices::install(&client).await?;
    e2e::router::install(&client).await?;
    let api_proxy = CountingProxy::start(api.addr()).await?;
    let kubeconfig = kubeconfig_via(&api, api_proxy.addr, &dir)?;
    let pki = Pki::new()?;
    let beside = |name: &str| std::env::current_exe().map(|p| p.with_file_name(name));
    let cc_bin = args
        .cloudcore
        .clone()
        .map_or_else(|| beside("cloudcore"), Ok)?;
    let ec_bin = args
        .edgecore
        .clone()
        .map_or_else(|| beside("edgecore"), Ok)?;
    let (mut cloudcore, hub_port, monitor) = start_cloudcore(&cc_bin, &dir, &pki, &kubeconfig)?;
    let edge_proxy = CountingProxy::start(([127, 0, 0, 1], hub_port).into()).await?;
    let mut edgecore = start_edgecore(
        &ec_bin,
        &dir,
        &pki,
        edge_proxy.addr,
        &containerd,
        args.plain,
    )?;
    let nodes: Api<Node> = Api::all(client.clone());
    let ready = || async {
        nodes
            .get_opt(NODE)
            .await
            .ok()
            .flatten()
            .and_then(|n| n.status?.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    if let Err(e) = wait_until("edge node Ready", Duration::from_secs(120), ready).await {
        anyhow::bail!(
            "{e}\n{}\n{}",
            cloudcore.failure_report(20),
            edgecore.failure_report(30)
        );
    }
    println!(
        "bench-idle: {} and {}; node {NODE} Ready; window {} s per phase after {} s settling; {}",
        cc_bin.display(),
        ec_bin.display(),
        args.window,
        args.settle,
        if args.plain {
            "edge without ping-keepalive and cloud-lease (--plain)"
        } else {
            "edge and cloud agree on ping-keepalive and cloud-lease"
        }
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut created = 0usize;
    for &want in &args.pods {
        while created < want {
            pods.create(&PostParams::default(), &pod(&format!("idle-{created}"))?)
                .await?;
            created += 1;
        }
        let running = || async {
            pods.list(&ListParams::default())
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .filter(|p| {
                            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                        })
                        .count()
                        >= want
                })
                .unwrap_or(false)
        };
        if let Err(e) = wait_until(
            &format!("{want} pods Running"),
            Duration::from_secs(60 + want as u64 * 3),
            running,
        )
        .await
        {
            anyhow::bail!("{e}\n{}", edgecore.failure_report(40));
        }
        tokio::time::sleep(Duration::from_secs(args.settle)).await;
        anyhow::ensure!(
            cloudcore.is_running() && edgecore.is_running(),
            "a process exited\n{}\n{}",
            cloudcore.failure_report(20),
            edgecore.failure_report(20)
        );
        let events = event_counts(&client).await;
        let w = measure(
            &edge_proxy,
            &api_proxy,
            &monitor,
            Duration::from_secs(args.window),
        )
        .await?;
        print_window(want, &w);
        let mut during = Vec::new();
        for (key, n) in event_counts(&client).await {
            let before = events.get(&key).copied().unwrap_or(0);
            if n > before {
                during.push(format!("{key} ×{}", n - before));
            }
        }
        if !during.is_empty() {
            println!(
                "        events recorded in the window: {}",
                during.join(", ")
            );
        }
    }
    if let Ok(keep) = std::env::var("BENCH_KEEP_LOG") {
        std::fs::copy(edgecore.log_path(), format!("{keep}.edgecore"))?;
        std::fs::copy(cloudcore.log_path(), format!("{keep}.cloudcore"))?;
    }
    drop(edgecore);
    drop(cloudcore);
    e2e::edge::remove_cgroups(NODE);
    api.shutdown().await;
    tokio::task::spawn_blocking(move || drop(containerd)).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    kubeedge_shared::tls::install_default_provider();
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(bench(args))
}
