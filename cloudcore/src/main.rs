//! cloudcore: the cloud side of kubeedge-rs.

use clap::Parser;
use cloudcore::config::{CloudCoreConfig, DEFAULT_CONFIG_PATH};
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

/// The cloud part of kubeedge-rs: serves edge nodes over cloudhub (WSS :10000) and syncs
/// them with the Kubernetes API. Reads KubeEdge's cloudcore.yaml.
#[derive(Parser)]
#[command(name = "cloudcore", version)]
struct Args {
    /// Config file in KubeEdge's CloudCore layout.
    #[arg(long, default_value = DEFAULT_CONFIG_PATH, global = true)]
    config: PathBuf,
    /// Print the full default configuration and exit.
    #[arg(long)]
    defaultconfig: bool,
    /// Print a minimal configuration and exit.
    #[arg(long)]
    minconfig: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Run only the iptables manager (KubeEdge's iptables-manager, for
    /// `modules.iptablesManager.mode: external`): keeps nat chain TUNNEL-PORT on this host,
    /// one DNAT per entry of ConfigMap kubeedge/tunnelport to `<replica IP>:<streamPort>`
    /// (`modules.cloudStream.streamPort` of --config). Needs hostNetwork, NET_ADMIN and the
    /// `iptables` binary.
    IptablesManager,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if args.defaultconfig {
        print!("{}", CloudCoreConfig::default_config().to_yaml());
        return std::process::ExitCode::SUCCESS;
    }
    if args.minconfig {
        print!("{}", CloudCoreConfig::minimal_yaml());
        return std::process::ExitCode::SUCCESS;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // kube's per-request trace layer reports every failed request at ERROR
                // without context (also those a shutdown aborts); the callers log failures.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("info,kube_client::client::builder=off")
                }),
        )
        .init();
    kubeedge_shared::tls::install_default_provider();
    raise_fd_limit();
    let cfg = match CloudCoreConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cloudcore: {e}");
            eprintln!("(print a starting point with `cloudcore --defaultconfig`)");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cloudcore: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        let shutdown = CancellationToken::new();
        let s = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutting down");
            s.cancel();
        });
        match args.command {
            Some(Command::IptablesManager) => {
                cloudcore::app::run_iptables_manager(cfg, shutdown).await
            }
            None => cloudcore::app::run(cfg, shutdown).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("cloudcore: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// One socket per edge node: raise the open-file soft limit to the hard limit, as the Go
/// runtime does for KubeEdge's cloudcore.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed in.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            let wanted = lim.rlim_max;
            lim.rlim_cur = wanted;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                tracing::debug!(limit = wanted, "raised the open-file limit");
            }
        }
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_manager_is_a_subcommand_taking_the_same_config() {
        let a = Args::try_parse_from(["cloudcore", "iptables-manager", "--config", "/c.yaml"])
            .expect("parses");
        assert!(matches!(a.command, Some(Command::IptablesManager)));
        assert_eq!(a.config, PathBuf::from("/c.yaml"));
        let a = Args::try_parse_from(["cloudcore"]).expect("parses");
        assert!(a.command.is_none());
        assert_eq!(a.config, PathBuf::from(DEFAULT_CONFIG_PATH));
        let help = Args::try_parse_from(["cloudcore", "iptables-manager", "--help"])
            .err()
            .expect("--help exits");
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        let text = help.to_string();
        assert!(
            text.contains("TUNNEL-PORT") && text.contains("--config"),
            "{text}"
        );
    }
}
