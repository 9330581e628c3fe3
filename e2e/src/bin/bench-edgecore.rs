//! edgecore benchmark: the real `edgecore` binary (its own process) on the private containerd,
//! with the in-memory API server and cloudcore in this process. Prints numbers; asserts
//! nothing. Needs root (containerd).
//!
//!     cargo build --profile bench-fast -p edgecore -p e2e
//!     target/bench-fast/bench-edgecore
//!
//! Measures edgecore's RSS idle and with 10 and 30 running pods, pod creation → Running (as the
//! API shows it) for 20 pods one by one and 20 at once, and the binary's size.

use anyhow::Context;
use e2e::apiserver::{ApiServer, Config};
use e2e::channel::Pki;
use e2e::cloud::CloudFixture;
use e2e::containerd::Containerd;
use e2e::images::{BUSYBOX_IMAGE, PAUSE_IMAGE};
use e2e::process::LoggedProcess;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn pod(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": "edge-bench", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": BUSYBOX_IMAGE, "command": ["sleep", "1000000"]}]}
    }))?)
}

async fn running(pods: &Api<Pod>, name: &str) -> bool {
    let Ok(Some(p)) = pods.get_opt(name).await else {
        return false;
    };
    p.status.and_then(|s| s.phase).as_deref() == Some("Running")
}

async fn wait_running(
    pods: &Api<Pod>,
    names: &[String],
    limit: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let start = Instant::now();
    let mut done: Vec<Option<Duration>> = vec![None; names.len()];
    while done.iter().any(Option::is_none) {
        anyhow::ensure!(start.elapsed() < limit, "pods not Running within {limit:?}");
        for (i, n) in names.iter().enumerate() {
            if done[i].is_none() && running(pods, n).await {
                done[i] = Some(start.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(done.into_iter().flatten().collect())
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
    let cloud = CloudFixture::start(client.clone(), &pki).await?;
    let dir = std::env::temp_dir().join(format!("bench-edgecore-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let cert = pki.node_cert("edge-bench")?;
    std::fs::write(dir.join("ca.crt"), &pki.ca.cert.cert_pem)?;
    std::fs::write(dir.join("edge.crt"), &cert.cert_pem)?;
    std::fs::write(dir.join("edge.key"), &cert.key_pem)?;
    let yaml = format!(
        "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\n\
         database:\n  dataSource: {d}/edgecore.db\n\
         modules:\n  edgeHub:\n    tlsCaFile: {d}/ca.crt\n    tlsCertFile: {d}/edge.crt\n    tlsPrivateKeyFile: {d}/edge.key\n\
         \x20   websocket:\n      server: {server}\n\
         \x20 edged:\n    hostnameOverride: edge-bench\n    nodeIP: 127.0.0.1\n    remoteRuntimeEndpoint: {endpoint}\n\
         \x20   podSandboxImage: {PAUSE_IMAGE}\n    rootDirectory: {d}/edged\n",
        d = dir.display(),
        server = cloud.hub.local_addr(),
        endpoint = containerd.endpoint(),
    );
    std::fs::write(dir.join("edgecore.yaml"), yaml)?;
    let bin = std::env::current_exe()?.with_file_name("edgecore");
    let mut cmd = Command::new(&bin);
    cmd.arg("--config")
        .arg(dir.join("edgecore.yaml"))
        .env("RUST_LOG", "warn");
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
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pid = edge.pid();
    println!(
        "bench-edgecore: {} ({:.1} MB on disk)",
        bin.display(),
        std::fs::metadata(&bin)?.len() as f64 / 1e6
    );
    println!(
        "  edgecore RSS idle (node registered, 0 pods): {:.1} MB",
        rss_kb(pid) as f64 / 1024.0
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // One by one: 20 pods, each created once the previous is Running.
    let mut one_by_one = Vec::new();
    for i in 0..20 {
        let name = format!("seq-{i}");
        let t = Instant::now();
        pods.create(&PostParams::default(), &pod(&name)?).await?;
        wait_running(&pods, std::slice::from_ref(&name), Duration::from_secs(60)).await?;
        one_by_one.push(t.elapsed());
        if i == 9 {
            tokio::time::sleep(Duration::from_secs(2)).await;
            println!(
                "  edgecore RSS with 10 running pods: {:.1} MB",
                rss_kb(pid) as f64 / 1024.0
            );
        }
    }
    println!(
        "  create → Running, 20 pods one by one: p50 {:.0} ms, p99 {:.0} ms",
        pct(&mut one_by_one, 0.5),
        pct(&mut one_by_one, 0.99)
    );
    // Burst: 10 more at once (30 running afterwards).
    let names: Vec<String> = (0..10).map(|i| format!("burst-{i}")).collect();
    for n in &names {
        pods.create(&PostParams::default(), &pod(n)?).await?;
    }
    let mut burst = wait_running(&pods, &names, Duration::from_secs(120)).await?;
    println!(
        "  create → Running, 10 pods at once: p50 {:.0} ms, p99 {:.0} ms",
        pct(&mut burst, 0.5),
        pct(&mut burst, 0.99)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "  edgecore RSS with 30 running pods: {:.1} MB",
        rss_kb(pid) as f64 / 1024.0
    );
    drop(edge);
    cloud.stop();
    drop(cloud);
    api.shutdown().await;
    tokio::task::spawn_blocking(move || drop(containerd)).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    kubeedge_shared::tls::install_default_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(bench())
}
