//! The local demo: everything kubeedge-rs needs on one machine, without a cluster.
//!
//! Today it starts the container runtime side — a private containerd with the locally built
//! busybox and pause images and a local registry (`e2e::containerd`) — the in-memory API server
//! (with a kubeconfig for kubectl) and cloudcore (cloudhub + edge controllers), prints how to
//! reach each, and tears it all down on Ctrl-C or SIGTERM. edgecore joins at the marked place.
//!
//! Run with `bash scripts/demo.sh` (installs the packages, then
//! `cargo run --release -p e2e --bin local-demo`). Needs root.

use std::time::Instant;

use anyhow::Context as _;
use e2e::apiserver::{ApiServer, Config as ApiConfig};
use e2e::channel::Pki;
use e2e::cloud::CloudFixture;
use e2e::containerd::Containerd;
use e2e::images::{BUSYBOX_DOCKER_HUB_IMAGE, BUSYBOX_IMAGE, PAUSE_IMAGE};
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_target(false)
        .init();

    // Signals first, so that a Ctrl-C during start-up still leads to a clean teardown.
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;

    step(1, "container runtime: private containerd + local registry");
    let started = Instant::now();
    let containerd = tokio::task::spawn_blocking(Containerd::start)
        .await
        .context("containerd start-up task")??;
    let runtime = containerd
        .cri()
        .await
        .context("connecting to containerd over CRI")?
        .version()
        .await
        .context("CRI Version")?;
    println!(
        "    {} {} (CRI {}) ready in {:.1?}",
        runtime.runtime_name,
        runtime.runtime_version,
        runtime.runtime_api_version,
        started.elapsed()
    );
    println!("    CRI endpoint   {}", containerd.endpoint());
    println!(
        "    registry       http://{}  (localhost:5000/* and docker.io/* resolve to it)",
        containerd.registry().host()
    );
    println!(
        "    pod network    {} on bridge {}",
        containerd.pod_subnet(),
        containerd.bridge()
    );
    println!("    images         {BUSYBOX_IMAGE} (= {BUSYBOX_DOCKER_HUB_IMAGE}), {PAUSE_IMAGE}");
    println!(
        "    inspect        ctr --address {} --namespace k8s.io containers ls",
        containerd.socket().display()
    );
    println!("    logs           {}", containerd.log_path().display());

    // ── Control plane ────────────────────────────────────────────────────────────────────
    step(2, "control plane: in-memory Kubernetes API server");
    let demo_dir = std::env::temp_dir().join("kubeedge-rs-demo");
    std::fs::create_dir_all(&demo_dir).context("creating the demo directory")?;
    let kubeconfig = demo_dir.join("kubeconfig");
    let api = ApiServer::start(ApiConfig {
        kubeconfig_path: Some(kubeconfig.clone()),
        ..ApiConfig::default()
    })
    .await
    .context("starting the in-memory API server")?;
    println!("    API server     {}", api.url());
    println!(
        "    kubectl        export KUBECONFIG={}",
        kubeconfig.display()
    );
    println!("                   kubectl get nodes,pods -A -o wide");

    // ── cloudcore ────────────────────────────────────────────────────────────────────────
    step(3, "cloudcore: cloudhub + edge controllers");
    let pki = Pki::new().context("creating the demo CA")?;
    std::fs::write(demo_dir.join("rootCA.crt"), &pki.ca.cert.cert_pem)?;
    let cloud = CloudFixture::start(api.client()?, &pki)
        .await
        .context("starting cloudcore")?;
    println!(
        "    cloudhub       wss://{}  (CA: {})",
        cloud.hub.local_addr(),
        demo_dir.join("rootCA.crt").display()
    );

    // ── edgecore ─────────────────────────────────────────────────────────────────────────
    // Next: start edgecore with `remote-runtime-endpoint = containerd.endpoint()` once edged
    // runs pods, and create a sample pod on the edge node.

    println!("\nReady. Press Ctrl-C to stop and remove everything.");
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }

    println!("\nStopping: removing pods, containerd, registry, bridge and temporary files...");
    let stopping = Instant::now();
    cloud.stop();
    drop(cloud);
    api.shutdown().await;
    let _ = std::fs::remove_dir_all(&demo_dir);
    tokio::task::spawn_blocking(move || drop(containerd))
        .await
        .context("teardown task")?;
    println!("Stopped in {:.1?}.", stopping.elapsed());
    Ok(())
}

fn step(n: u32, what: &str) {
    println!("[{n}] {what}");
}
