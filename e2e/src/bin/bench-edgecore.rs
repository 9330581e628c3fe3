//! edgecore benchmark: the real `edgecore` binary (its own process) on the private containerd,
//! with the in-memory API server and cloudcore in this process. Prints numbers; asserts
//! nothing. Needs root (containerd).
//!
//!     cargo build --profile bench-fast -p edgecore -p e2e
//!     target/bench-fast/bench-edgecore
//!
//! Measures first the runtime's own floor (20 pods straight through CRI, one by one and all at
//! once, with how busy the machine was), then edgecore's RSS idle and with 10 and 30 running
//! pods, pod creation → Running (as the API shows it) for 20 pods one by one and 20 at once
//! (with edgecore's CPU time during the burst), and the binary's size.
//!
//! `BENCH_EDGECORE_LOG=<filter>` sets edgecore's `RUST_LOG` (default `warn`);
//! `BENCH_KEEP_LOG=<file>` copies edgecore's log there before cleaning up;
//! `BENCH_EDGECORE_OFF=eventBus,deviceTwin,…` switches those edgecore modules off (`enable:
//! false`), to see what each costs; `BENCH_IDLE_SECONDS` (default 3) is how long the edge idles
//! after its node is Ready before its idle RSS is read.

use anyhow::Context;
use e2e::apiserver::{ApiServer, Config};
use e2e::channel::Pki;
use e2e::cloud::CloudFixture;
use e2e::containerd::Containerd;
use e2e::images::{BUSYBOX_IMAGE, PAUSE_IMAGE};
use e2e::process::LoggedProcess;
use e2e::procfs::{cpu_ticks, rss_kb, status_kb};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use kubeedge_edged::cri::{CriClient, api};
use serde_json::json;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn pod(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": "edge-bench", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "1000000"]}]}
    }))?)
}

/// Waits until every named pod shows Running; returns for each the time from its `created`
/// instant. Polls with one list call every 10 ms.
async fn wait_running(
    pods: &Api<Pod>,
    names: &[String],
    created: &[Instant],
    limit: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let start = Instant::now();
    let mut done: Vec<Option<Duration>> = vec![None; names.len()];
    while done.iter().any(Option::is_none) {
        anyhow::ensure!(start.elapsed() < limit, "pods not Running within {limit:?}");
        let list = pods.list(&Default::default()).await?;
        let now = Instant::now();
        for p in list.items {
            let running = p.status.and_then(|s| s.phase).as_deref() == Some("Running");
            let Some(i) = names
                .iter()
                .position(|n| Some(n) == p.metadata.name.as_ref())
            else {
                continue;
            };
            if running && done[i].is_none() {
                done[i] = Some(now - created[i]);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(done.into_iter().flatten().collect())
}

/// Creates one pod and waits until the API shows it Running.
async fn create_and_wait(pods: &Api<Pod>, name: &str) -> anyhow::Result<Duration> {
    let t = Instant::now();
    pods.create(&PostParams::default(), &pod(name)?).await?;
    let d = wait_running(pods, &[name.to_string()], &[t], Duration::from_secs(60)).await?;
    Ok(d[0])
}

/// One pod straight through CRI, as edged would run it: RunPodSandbox (pod network),
/// CreateContainer, StartContainer. Returns when the container is started.
async fn cri_pod(cri: &CriClient, name: String, logs: PathBuf) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let sandbox = api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.clone(),
            uid: format!("uid-{name}"),
            namespace: "cri-floor".into(),
            attempt: 0,
        }),
        hostname: name.clone(),
        log_directory: logs.display().to_string(),
        labels: HashMap::from([("bench".to_string(), "cri-floor".to_string())]),
        linux: Some(api::LinuxPodSandboxConfig {
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: api::NamespaceMode::Pod as i32,
                    pid: api::NamespaceMode::Container as i32,
                    ipc: api::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut rt = cri.runtime();
    let id = rt
        .run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        })
        .await?
        .into_inner()
        .pod_sandbox_id;
    let container = rt
        .create_container(api::CreateContainerRequest {
            pod_sandbox_id: id,
            config: Some(api::ContainerConfig {
                metadata: Some(api::ContainerMetadata {
                    name: "c".into(),
                    attempt: 0,
                }),
                image: Some(api::ImageSpec {
                    image: BUSYBOX_IMAGE.into(),
                    ..Default::default()
                }),
                command: vec!["sleep".into(), "1000000".into()],
                log_path: "c/0.log".into(),
                ..Default::default()
            }),
            sandbox_config: Some(sandbox),
        })
        .await?
        .into_inner()
        .container_id;
    rt.start_container(api::StartContainerRequest {
        container_id: container,
    })
    .await?;
    Ok(t.elapsed())
}

/// The runtime's own floor: 20 pods through CRI one after the other, then 20 at once; then
/// removes them. Prints the numbers.
async fn cri_floor(containerd: &Containerd, dir: &Path) -> anyhow::Result<()> {
    let cri = containerd.cri().await?;
    let logs = dir.join("cri-floor-logs");
    std::fs::create_dir_all(&logs)?;
    let mut one = Vec::new();
    for i in 0..20 {
        one.push(cri_pod(&cri, format!("floor-seq-{i}"), logs.clone()).await?);
    }
    let cpu = CpuSample::now(None);
    let burst = (0..20).map(|i| cri_pod(&cri, format!("floor-burst-{i}"), logs.clone()));
    let mut burst: Vec<Duration> = futures::future::try_join_all(burst).await?;
    let used = cpu.elapsed();
    println!(
        "  CRI alone (no edgecore), sandbox+create+start, 20 one by one: p50 {:.0} ms, p99 {:.0} ms; 20 at once: p50 {:.0} ms, p99 {:.0} ms ({used})",
        pct(&mut one, 0.5),
        pct(&mut one, 0.99),
        pct(&mut burst, 0.5),
        pct(&mut burst, 0.99),
    );
    let mut rt = cri.runtime();
    let sandboxes = rt
        .list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: HashMap::from([("bench".to_string(), "cri-floor".to_string())]),
                ..Default::default()
            }),
        })
        .await?
        .into_inner()
        .items;
    for s in sandboxes {
        rt.stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: s.id.clone(),
        })
        .await?;
        rt.remove_pod_sandbox(api::RemovePodSandboxRequest {
            pod_sandbox_id: s.id,
        })
        .await?;
    }
    Ok(())
}

/// Machine CPU time (and one process's) between two instants, from `/proc`.
struct CpuSample {
    at: Instant,
    busy: u64,
    pid: Option<(u32, u64)>,
    this: u64,
}

fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().next() else {
        return 0;
    };
    // user nice system idle iowait irq softirq steal: busy = all but idle and iowait.
    cpu.split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse::<u64>().ok())
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| v)
        .take(8)
        .sum()
}

impl CpuSample {
    fn now(pid: Option<u32>) -> Self {
        CpuSample {
            at: Instant::now(),
            busy: machine_busy_ticks(),
            pid: pid.map(|p| (p, cpu_ticks(p))),
            this: cpu_ticks(std::process::id()),
        }
    }

    /// "machine N % busy of C cores over T s[, edgecore M s CPU]".
    fn elapsed(&self) -> String {
        let secs = self.at.elapsed().as_secs_f64();
        let hz = 100.0;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let busy = (machine_busy_ticks() - self.busy) as f64 / hz;
        let mut s = format!(
            "machine {:.0} % busy of {cores} cores over {secs:.2} s",
            100.0 * busy / (secs * cores)
        );
        if let Some((pid, ticks)) = self.pid {
            s += &format!(
                ", edgecore {:.2} s CPU, API server + cloudcore {:.2} s CPU",
                (cpu_ticks(pid) - ticks) as f64 / hz,
                (cpu_ticks(std::process::id()) - self.this) as f64 / hz
            );
        }
        s
    }
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1)))
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(f64::NAN)
}

async fn bench() -> anyhow::Result<()> {
    let containerd = tokio::task::spawn_blocking(Containerd::start).await??;
    let api = ApiServer::start(Config::default()).await?;
    let client = api.client()?;
    let pki = Pki::new()?;
    let dir = std::env::temp_dir().join(format!("bench-edgecore-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    cri_floor(&containerd, &dir).await?;
    let cloud = CloudFixture::start(client.clone(), &pki).await?;
    let cert = pki.node_cert("edge-bench")?;
    std::fs::write(dir.join("ca.crt"), &pki.ca.cert.cert_pem)?;
    std::fs::write(dir.join("edge.crt"), &cert.cert_pem)?;
    std::fs::write(dir.join("edge.key"), &cert.key_pem)?;
    let off: Vec<String> = std::env::var("BENCH_EDGECORE_OFF")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .collect();
    if let Some(bad) = off
        .iter()
        .find(|m| !m.chars().all(|c| c.is_ascii_alphanumeric()))
    {
        anyhow::bail!("BENCH_EDGECORE_OFF: {bad:?} is not a module name (e.g. eventBus)");
    }
    // Default settings (pod cgroups and QoS, eviction checks) except absolute disk thresholds:
    // the kubelet's 10%/15% would put a big, fairly full build disk under DiskPressure.
    let yaml = format!(
        "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\n\
         database:\n  dataSource: {d}/edgecore.db\n\
         modules:\n  edgeHub:\n    tlsCaFile: {d}/ca.crt\n    tlsCertFile: {d}/edge.crt\n    tlsPrivateKeyFile: {d}/edge.key\n\
         \x20   websocket:\n      server: {server}\n\
         \x20 deviceTwin:\n    dmiSockPath: {d}\n{twin_off}{off}\
         \x20 edged:\n    hostnameOverride: edge-bench\n    nodeIP: 127.0.0.1\n    remoteRuntimeEndpoint: {endpoint}\n\
         \x20   podSandboxImage: {PAUSE_IMAGE}\n    rootDirectory: {d}/edged\n\
         \x20   tailoredKubeletConfig:\n      evictionHard:\n        memory.available: 100Mi\n\
         \x20       nodefs.available: 1Gi\n        imagefs.available: 1Gi\n        nodefs.inodesFree: 5%\n",
        d = dir.display(),
        server = cloud.hub.local_addr(),
        endpoint = containerd.endpoint(),
        twin_off = if off.iter().any(|m| m == "deviceTwin") {
            "    enable: false\n"
        } else {
            ""
        },
        off = off
            .iter()
            .filter(|m| *m != "deviceTwin")
            .map(|m| format!("  {m}:\n    enable: false\n"))
            .collect::<String>(),
    );
    std::fs::write(dir.join("edgecore.yaml"), yaml)?;
    let bin = std::env::current_exe()?.with_file_name("edgecore");
    let mut cmd = Command::new(&bin);
    cmd.arg("--config").arg(dir.join("edgecore.yaml")).env(
        "RUST_LOG",
        std::env::var("BENCH_EDGECORE_LOG").unwrap_or_else(|_| "warn".into()),
    );
    let edge = LoggedProcess::spawn("edgecore", cmd, &dir)
        .with_context(|| format!("starting {}", bin.display()))?;
    let nodes: Api<Node> = Api::all(client.clone());
    let t = Instant::now();
    loop {
        let ready = nodes
            .get_opt("edge-bench")
            .await
            .ok()
            .flatten()
            .and_then(|n| n.status?.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if ready {
            break;
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(60),
            "edge node not Ready:\n{}",
            edge.failure_report(30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let idle = std::env::var("BENCH_IDLE_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    tokio::time::sleep(Duration::from_secs(idle)).await;
    let pid = edge.pid();
    println!(
        "bench-edgecore: {} ({:.1} MB on disk)",
        bin.display(),
        std::fs::metadata(&bin)?.len() as f64 / 1e6
    );
    let kb = |field| status_kb(pid, field).unwrap_or(0) as f64 / 1024.0;
    println!(
        "  edgecore RSS idle (node registered, 0 pods, {idle} s after Ready): {:.1} MB (anonymous {:.1}, file {:.1}), {} threads{}",
        kb("VmRSS:"),
        kb("RssAnon:"),
        kb("RssFile:"),
        status_kb(pid, "Threads:").unwrap_or(0),
        if off.is_empty() {
            String::new()
        } else {
            format!(", modules off: {}", off.join(","))
        }
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // One by one: 20 pods, each created once the previous is Running (10 before the burst,
    // 10 after it).
    let mut one_by_one = Vec::new();
    for i in 0..10 {
        one_by_one.push(create_and_wait(&pods, &format!("seq-{i}")).await?);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "  edgecore RSS with 10 running pods: {:.1} MB",
        rss_kb(pid) as f64 / 1024.0
    );
    // Burst: 20 at once (30 running afterwards).
    let names: Vec<String> = (0..20).map(|i| format!("burst-{i}")).collect();
    let cpu = CpuSample::now(Some(pid));
    let mut created = Vec::new();
    for n in &names {
        created.push(Instant::now());
        pods.create(&PostParams::default(), &pod(n)?).await?;
    }
    let posting = created[0].elapsed();
    let mut burst = wait_running(&pods, &names, &created, Duration::from_secs(120)).await?;
    println!(
        "  create → Running, 20 pods at once: p50 {:.0} ms, p99 {:.0} ms (creating them took {:.0} ms; {})",
        pct(&mut burst, 0.5),
        pct(&mut burst, 0.99),
        posting.as_secs_f64() * 1e3,
        cpu.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "  edgecore RSS with 30 running pods: {:.1} MB",
        rss_kb(pid) as f64 / 1024.0
    );
    for i in 10..20 {
        one_by_one.push(create_and_wait(&pods, &format!("seq-{i}")).await?);
    }
    println!(
        "  create → Running, 20 pods one by one (10 before the burst, 10 after): p50 {:.0} ms, p99 {:.0} ms",
        pct(&mut one_by_one, 0.5),
        pct(&mut one_by_one, 0.99)
    );
    if let Ok(keep) = std::env::var("BENCH_KEEP_LOG") {
        std::fs::copy(edge.log_path(), &keep)?;
        println!("  edgecore log copied to {keep}");
    }
    drop(edge);
    cloud.stop();
    drop(cloud);
    api.shutdown().await;
    tokio::task::spawn_blocking(move || drop(containerd)).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    e2e::bench::env_configured_cli(include_str!("bench-edgecore.rs"));
    kubeedge_shared::tls::install_default_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(bench())
}
