//! The local demo: everything kubeedge-rs needs on one machine, without a cluster.
//!
//! Today it starts the container runtime side — a private containerd with the locally built
//! busybox and pause images and a local registry (`e2e::containerd`) — prints how to reach it,
//! and tears it all down on Ctrl-C or SIGTERM. The control plane (in-memory API server),
//! cloudcore and edgecore are wired in at the marked places.
//!
//! Run with `bash scripts/demo.sh` (installs the packages, then
//! `cargo run --release -p e2e --bin local-demo`). Needs root.

use std::time::Instant;

use anyhow::Context as _;
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
    // The lead wires the in-memory Kubernetes API server (e2e::apiserver) in here: start it,
    // write a kubeconfig, print how to use kubectl against it.

    // ── cloudcore and edgecore ──────────────────────────────────────────────────────────
    // Later: start cloudcore against the API server, then edgecore with
    // `remote-runtime-endpoint = containerd.endpoint()`.

    println!("\nReady. Press Ctrl-C to stop and remove everything.");
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }

    println!("\nStopping: removing pods, containerd, registry, bridge and temporary files...");
    let stopping = Instant::now();
    tokio::task::spawn_blocking(move || drop(containerd))
        .await
        .context("teardown task")?;
    println!("Stopped in {:.1?}.", stopping.elapsed());
    Ok(())
}

fn step(n: u32, what: &str) {
    println!("[{n}] {what}");
}
