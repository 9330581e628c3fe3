//! Dead-link benchmark: how long the real `cloudcore` and the real `edgecore` (each its own
//! process, default keepalive settings) take to notice that the link between them died without
//! a FIN or RST, and how long they take to link up again once it heals. Prints numbers;
//! asserts nothing.
//!
//!     cargo build --profile bench-fast -p cloudcore -p edgecore -p e2e
//!     target/bench-fast/bench-deadlink --repeats 3
//!
//! The edge dials cloudhub through a [`FaultProxy`]. Scenarios:
//! 1. blackhole: nothing is forwarded either way, nothing is closed (the half-open link);
//! 2. edge vanishes: only edge → cloud stops;
//! 3. cloud vanishes: only cloud → edge stops.
//!
//! Each trial waits until both sides are linked, then a random 1–16 s (so the fault lands
//! anywhere in the 15 s keepalive cycle), applies the fault and polls every 100 ms: cloudcore's
//! `cloudhub_connected_nodes` gauge on `/metrics` dropping to 0, and edgecore's log line
//! "disconnected from cloudhub". Then the proxy heals and the trial waits for both sides to be
//! linked again (gauge 1 and edgecore's "connected to cloudhub").
//!
//! edged runs with no container runtime behind it (it starts anyway and retries the runtime
//! every 5 s), so no containerd is needed: only the link matters here.

use anyhow::Context;
use clap::Parser;
use e2e::apiserver::{ApiServer, Config};
use e2e::channel::{FaultProxy, Flow, Pki};
use e2e::process::LoggedProcess;
use kubeedge_shared::constants::{DEFAULT_HEARTBEAT_SECS, DEFAULT_KEEPALIVE_INTERVAL_SECS};
use rand::Rng;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Parser)]
#[command(about = "dead-link detection by cloudcore and edgecore through a fault proxy")]
struct Args {
    /// Trials per scenario.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Give up waiting for a detection after this many seconds.
    #[arg(long, default_value_t = 600)]
    max_wait: u64,
    /// Binaries (default: next to this one).
    #[arg(long)]
    cloudcore: Option<PathBuf>,
    #[arg(long)]
    edgecore: Option<PathBuf>,
}

const NODE: &str = "edge-deadlink";

#[derive(Clone, Copy)]
enum Scenario {
    Blackhole,
    EdgeVanishes,
    CloudVanishes,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Blackhole => "blackhole (both ways, no FIN/RST)",
            Scenario::EdgeVanishes => "edge vanishes (edge → cloud dropped)",
            Scenario::CloudVanishes => "cloud vanishes (cloud → edge dropped)",
        }
    }

    fn apply(self, proxy: &FaultProxy) {
        match self {
            Scenario::Blackhole => proxy.freeze(),
            Scenario::EdgeVanishes => proxy.freeze_one_way(Flow::ToUpstream),
            Scenario::CloudVanishes => proxy.freeze_one_way(Flow::ToClient),
        }
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Follows a log file: new complete lines since the last call.
struct LogTail {
    path: PathBuf,
    offset: usize,
}

impl LogTail {
    fn new(path: &Path) -> Self {
        LogTail {
            path: path.to_path_buf(),
            offset: 0,
        }
    }

    fn new_lines(&mut self) -> Vec<String> {
        let Ok(bytes) = std::fs::read(&self.path) else {
            return Vec::new();
        };
        let Some(rest) = bytes.get(self.offset..) else {
            return Vec::new();
        };
        let Some(end) = rest.iter().rposition(|b| *b == b'\n') else {
            return Vec::new();
        };
        self.offset += end + 1;
        String::from_utf8_lossy(&rest[..end])
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// What edgecore's log says about the link.
#[derive(Default)]
struct EdgeLink {
    connected: bool,
    /// The last "disconnected from cloudhub" line.
    last_down: Option<String>,
}

impl EdgeLink {
    fn update(&mut self, tail: &mut LogTail) -> (bool, bool) {
        let (mut went_down, mut came_up) = (false, false);
        for line in tail.new_lines() {
            if line.contains("disconnected from cloudhub") {
                self.connected = false;
                self.last_down = Some(strip_ansi(&line));
                went_down = true;
            } else if line.contains("connected to cloudhub") {
                self.connected = true;
                came_up = true;
            }
        }
        (went_down, came_up)
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// cloudcore's `cloudhub_connected_nodes` gauge (`None` when /metrics does not answer).
async fn connected_nodes(monitor: &str) -> Option<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(monitor).await.ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf);
        text.lines()
            .find_map(|l| l.strip_prefix("cloudhub_connected_nodes "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
    };
    tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .ok()
        .flatten()
}

struct Rig {
    proxy: FaultProxy,
    monitor: String,
    edge_log: LogTail,
    edge: EdgeLink,
    cloud_log: LogTail,
    cloudcore: LoggedProcess,
    edgecore: LoggedProcess,
}

impl Rig {
    /// Polls until the cloud counts the node connected and edgecore says it is connected.
    async fn wait_linked(&mut self, within: Duration) -> anyhow::Result<Duration> {
        let t = Instant::now();
        loop {
            self.edge.update(&mut self.edge_log);
            if self.edge.connected && connected_nodes(&self.monitor).await == Some(1) {
                return Ok(t.elapsed());
            }
            anyhow::ensure!(
                self.cloudcore.is_running() && self.edgecore.is_running(),
                "a process exited\n{}\n{}",
                self.cloudcore.failure_report(10),
                self.edgecore.failure_report(10)
            );
            anyhow::ensure!(
                t.elapsed() < within,
                "not linked within {within:?}\n{}\n{}",
                self.cloudcore.failure_report(10),
                self.edgecore.failure_report(20)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last "edge disconnected" reason in cloudcore's log.
    fn cloud_reason(&mut self) -> Option<String> {
        self.cloud_log
            .new_lines()
            .into_iter()
            .rev()
            .find(|l| l.contains("edge disconnected"))
            .map(|l| strip_ansi(&l))
            .and_then(|l| {
                let r = l.split("reason=").nth(1)?;
                Some(
                    r.split(" edge disconnected")
                        .next()
                        .unwrap_or(r)
                        .to_string(),
                )
            })
    }
}

struct Trial {
    cloud: Option<Duration>,
    edge: Option<Duration>,
    relink: Duration,
}

async fn trial(rig: &mut Rig, s: Scenario, max_wait: Duration) -> anyhow::Result<Trial> {
    rig.wait_linked(Duration::from_secs(120)).await?;
    // Land the fault anywhere in the keepalive cycle.
    let phase = Duration::from_millis(rand::rng().random_range(1_000..16_000));
    tokio::time::sleep(phase).await;
    rig.edge.update(&mut rig.edge_log);
    rig.cloud_log.new_lines();
    anyhow::ensure!(rig.edge.connected, "link dropped before the fault");
    let t0 = Instant::now();
    s.apply(&rig.proxy);
    let (mut cloud, mut edge) = (None, None);
    while (cloud.is_none() || edge.is_none()) && t0.elapsed() < max_wait {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if edge.is_none() && rig.edge.update(&mut rig.edge_log).0 {
            edge = Some(t0.elapsed());
        }
        if cloud.is_none() && connected_nodes(&rig.monitor).await == Some(0) {
            cloud = Some(t0.elapsed());
        }
    }
    let show = |d: Option<Duration>| {
        d.map(|d| format!("{:.1} s", d.as_secs_f64()))
            .unwrap_or_else(|| format!("not within {} s", max_wait.as_secs()))
    };
    println!(
        "    fault {:.1} s into the link: cloud {}, edge {}",
        phase.as_secs_f64(),
        show(cloud),
        show(edge)
    );
    if let Some(r) = rig.cloud_reason() {
        println!("      cloudcore: {r}");
    }
    if let Some(r) = rig.edge.last_down.take() {
        let r = r.split("reason=").nth(1).unwrap_or(&r).to_string();
        println!("      edgecore:  {r}");
    }
    rig.proxy.thaw();
    let relink = rig.wait_linked(max_wait).await?;
    println!(
        "      linked again {:.1} s after healing",
        relink.as_secs_f64()
    );
    Ok(Trial {
        cloud,
        edge,
        relink,
    })
}

fn summary(what: &str, v: &[Option<Duration>]) {
    let mut got: Vec<f64> = v.iter().flatten().map(Duration::as_secs_f64).collect();
    got.sort_by(f64::total_cmp);
    let missed = v.len() - got.len();
    let Some((min, max)) = got.first().zip(got.last()) else {
        println!("    {what:<28} never detected ({missed} trials)");
        return;
    };
    let median = got[got.len() / 2];
    let miss = if missed > 0 {
        format!(" ({missed} trials: not detected)")
    } else {
        String::new()
    };
    println!("    {what:<28} min {min:5.1} s, median {median:5.1} s, max {max:5.1} s{miss}");
}

/// The Linux retransmission timeout after which an unacknowledged write errors: RTO from
/// TCP_RTO_MIN (200 ms, loopback/LAN) doubling up to TCP_RTO_MAX (120 s), `tcp_retries2` times.
fn tcp_give_up_secs(retries2: u32) -> f64 {
    (0..=retries2)
        .map(|i| (0.2 * 2f64.powi(i as i32)).min(120.0))
        .sum()
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
    // keepaliveInterval, the edge's heartbeat and deadLinkTimeout are left at their defaults.
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
    cmd.arg("--config")
        .arg(&path)
        .env("RUST_LOG", "warn,cloudcore::cloudhub=info");
    let p = LoggedProcess::spawn("cloudcore", cmd, dir)
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok((p, hub_port, monitor))
}

fn start_edgecore(
    bin: &Path,
    dir: &Path,
    pki: &Pki,
    server: std::net::SocketAddr,
) -> anyhow::Result<LoggedProcess> {
    let cert = pki.node_cert(NODE)?;
    std::fs::write(dir.join("ca.crt"), &pki.ca.cert.cert_pem)?;
    std::fs::write(dir.join("edge.crt"), &cert.cert_pem)?;
    std::fs::write(dir.join("edge.key"), &cert.key_pem)?;
    let yaml = format!(
        "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\n\
         database:\n  dataSource: {d}/edgecore.db\n\
         modules:\n  edgeHub:\n    tlsCaFile: {d}/ca.crt\n    tlsCertFile: {d}/edge.crt\n    tlsPrivateKeyFile: {d}/edge.key\n\
         \x20   websocket:\n      server: {server}\n\
         \x20 deviceTwin:\n    dmiSockPath: {d}\n\
         \x20 edged:\n    hostnameOverride: {NODE}\n    nodeIP: 127.0.0.1\n\
         \x20   remoteRuntimeEndpoint: unix://{d}/no-runtime.sock\n    rootDirectory: {d}/edged\n",
        d = dir.display(),
    );
    std::fs::write(dir.join("edgecore.yaml"), yaml)?;
    let mut cmd = Command::new(bin);
    cmd.arg("--config")
        .arg(dir.join("edgecore.yaml"))
        .env("RUST_LOG", "warn,edgecore::edgehub=info");
    LoggedProcess::spawn("edgecore", cmd, dir)
        .with_context(|| format!("starting {}", bin.display()))
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("bench-deadlink-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let api = ApiServer::start(Config::default()).await?;
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
    let (cloudcore, hub_port, monitor) =
        start_cloudcore(&cc_bin, &dir, &pki, api.kubeconfig_path())?;
    let proxy = FaultProxy::start(([127, 0, 0, 1], hub_port).into()).await?;
    let edgecore = start_edgecore(&ec_bin, &dir, &pki, proxy.addr)?;
    let mut rig = Rig {
        proxy,
        monitor,
        edge_log: LogTail::new(edgecore.log_path()),
        edge: EdgeLink::default(),
        cloud_log: LogTail::new(cloudcore.log_path()),
        cloudcore,
        edgecore,
    };
    let first = rig.wait_linked(Duration::from_secs(60)).await?;
    println!(
        "bench-deadlink: {} and {} through a fault proxy; linked after {:.1} s",
        cc_bin.display(),
        ec_bin.display(),
        first.as_secs_f64()
    );
    println!(
        "  defaults: edgeHub.heartbeat {DEFAULT_HEARTBEAT_SECS} s (a WebSocket ping; with a KubeEdge cloud also a keepalive message), \
         kubeedgeRs.deadLinkTimeout 2 × heartbeat = {} s (checked every 1 s), \
         cloudHub.keepaliveInterval {DEFAULT_KEEPALIVE_INTERVAL_SECS} s",
        2 * DEFAULT_HEARTBEAT_SECS
    );
    let max_wait = Duration::from_secs(args.max_wait);
    let mut rows = Vec::new();
    for s in [
        Scenario::Blackhole,
        Scenario::EdgeVanishes,
        Scenario::CloudVanishes,
    ] {
        println!("  {}:", s.name());
        let mut trials = Vec::new();
        for _ in 0..args.repeats {
            trials.push(trial(&mut rig, s, max_wait).await?);
        }
        rows.push((s, trials));
    }
    println!("results ({} trials each):", args.repeats);
    for (s, trials) in &rows {
        println!("  {}:", s.name());
        summary(
            "cloudcore drops the session",
            &trials.iter().map(|t| t.cloud).collect::<Vec<_>>(),
        );
        summary(
            "edgecore sees the link down",
            &trials.iter().map(|t| t.edge).collect::<Vec<_>>(),
        );
        summary(
            "linked again after healing",
            &trials.iter().map(|t| Some(t.relink)).collect::<Vec<_>>(),
        );
    }
    let retries2 = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_retries2")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    let hb = DEFAULT_HEARTBEAT_SECS;
    let ka = DEFAULT_KEEPALIVE_INTERVAL_SECS;
    println!("derived bounds with the default settings (not measured):");
    println!(
        "  kubeedge-rs: cloud {}–{ka} s (keepaliveInterval after the last keepalive, sent every {hb} s); \
         edge {}–{} s (deadLinkTimeout {} s after the last frame, pongs every {hb} s, +1 s check)",
        ka - hb,
        2 * hb - hb,
        2 * hb + 1,
        2 * hb
    );
    match retries2 {
        Some(r) => {
            let give_up = tcp_give_up_secs(r);
            println!(
                "  KubeEdge (same cloud side; the edge has no read deadline: it notices a failed \
                 read or write, then sleeps 2 × heartbeat = {} s before redialling):",
                2 * hb
            );
            println!(
                "    blackhole: cloud {}–{ka} s; edge when the kernel gives up retransmitting its \
                 keepalives: tcp_retries2 = {r} → {give_up:.1} s (RTO from 200 ms, capped at 120 s)",
                ka - hb
            );
            println!(
                "    edge vanishes: cloud {}–{ka} s; edge the same (the cloud's close reaches it)",
                ka - hb
            );
            println!(
                "    cloud vanishes: edge {give_up:.1} s (its keepalives are never acknowledged); \
                 the cloud keeps receiving keepalives until then, plus up to {ka} s"
            );
        }
        None => println!("  KubeEdge: cannot read /proc/sys/net/ipv4/tcp_retries2"),
    }
    drop(rig);
    api.shutdown().await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_give_up_matches_the_kernel_documentation() {
        // Documentation/networking/ip-sysctl.rst: 15 yields a hypothetical 924.6 s.
        assert!((tcp_give_up_secs(15) - 924.6).abs() < 0.01);
        assert!((tcp_give_up_secs(8) - 102.2).abs() < 0.01);
    }

    #[test]
    fn strips_colours() {
        assert_eq!(strip_ansi("\x1b[2mreason\x1b[0m=x"), "reason=x");
    }
}
