//! kube-memserver: the in-memory Kubernetes API server as a standalone process.
//!
//! ```text
//! kube-memserver --listen 127.0.0.1:6443 --kubeconfig-out /tmp/kubeconfig --data-dir /tmp/kms
//! kubectl --kubeconfig /tmp/kubeconfig get ns
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kube_memserver::{ApiServer, Config};

/// In-memory Kubernetes API server (HTTPS, bearer token) for tests and the local demo.
#[derive(Parser, Debug)]
#[command(name = "kube-memserver", version)]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Write the kubeconfig here (default: <data-dir>/kubeconfig or a temp dir).
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// Keep the CA, token and a snapshot of all objects here across restarts.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Admin bearer token (default: random, or the one stored in --data-dir).
    #[arg(long, env = "KUBE_MEMSERVER_TOKEN")]
    token: Option<String>,
    /// Extra subject alternative names (IPs or DNS names) for the serving certificate.
    #[arg(long = "san")]
    sans: Vec<String>,
    /// Seconds without lease renewal before a node is marked Unknown.
    #[arg(long, default_value_t = 40)]
    node_monitor_grace_period: u64,
    /// Events kept per resource for watches and continue tokens.
    #[arg(long, default_value_t = 10_000)]
    history: usize,
    /// Events buffered per watcher before it is dropped as too slow (it then resumes from
    /// its last resourceVersion, as from a real API server).
    #[arg(long, default_value_t = 1024)]
    watch_capacity: usize,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 60)]
    bookmark_interval: u64,
    /// Check kubelets' serving certificates against the cluster CA (kube-apiserver's
    /// --kubelet-certificate-authority); by default any is accepted, as upstream.
    #[arg(long)]
    verify_kubelet_certificates: bool,
    /// Run neither the scheduler nor the workload controllers (Deployments, ReplicaSets,
    /// DaemonSets, StatefulSets, Jobs): pods stay where clients put them.
    #[arg(long)]
    no_workload_controllers: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let config = Config {
        listen: args.listen,
        token: args.token,
        kubeconfig_path: args.kubeconfig_out,
        data_dir: args.data_dir,
        extra_sans: args.sans,
        history_limit: args.history.max(1),
        watch_capacity: args.watch_capacity.max(1),
        bookmark_interval: Duration::from_secs(args.bookmark_interval.max(1)),
        node_monitor_grace_period: Duration::from_secs(args.node_monitor_grace_period.max(1)),
        verify_kubelet_certificates: args.verify_kubelet_certificates,
        workload_controllers: !args.no_workload_controllers,
        ..Config::default()
    };
    let server = ApiServer::start(config).await?;
    println!("kube-memserver serving {}", server.url());
    println!("kubeconfig: {}", server.kubeconfig_path().display());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    server.shutdown().await;
    Ok(())
}
