//! edgecore: the edge agent of kubeedge-rs. Reads KubeEdge's edgecore.yaml.

use clap::Parser;
use edgecore::app::{EdgeCore, log_changes_without_edged};
use edgecore::config::{DEFAULT_CONFIG_PATH, EdgeCoreConfig};
use std::path::PathBuf;
use std::process::ExitCode;

/// The edge part of kubeedge-rs: keeps the link to cloudcore, the local database of the
/// objects this node runs, and (soon) the pods on the local container runtime.
#[derive(Parser)]
#[command(name = "edgecore", version)]
struct Args {
    /// Config file in KubeEdge's EdgeCore layout.
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
    /// Write edgecore.yaml for a cloudcore and obtain this node's certificate with a join
    /// token (like `keadm join --token`), then exit; start edgecore afterwards.
    Join(edgecore::certmanager::join::JoinOptions),
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.defaultconfig || args.minconfig {
        let rendered = if args.defaultconfig {
            EdgeCoreConfig::default_config().to_yaml()
        } else {
            EdgeCoreConfig::minimal_config().to_minimal_yaml()
        };
        return match rendered {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("edgecore: cannot render the configuration: {e}");
                ExitCode::FAILURE
            }
        };
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    if let Some(Command::Join(opts)) = &args.command {
        return join(opts, &args.config);
    }
    let config = match EdgeCoreConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("edgecore: {e}");
            eprintln!("(print a starting point with `edgecore --defaultconfig`)");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("edgecore: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        // Obtain the edge certificate with the join token if there is none yet (keadm join
        // waits up to 300 s for it).
        edgecore::certmanager::bootstrap_if_needed(
            &config,
            Some(&args.config),
            std::time::Duration::from_secs(300),
        )
        .await?;
        let mut edge = EdgeCore::start(&config).await?;
        if let Some((_client, changes)) = edge.edged_link() {
            tokio::spawn(log_changes_without_edged(changes));
        }
        wait_for_signal().await;
        tracing::info!("shutting down");
        edge.shutdown().await;
        Ok::<_, edgecore::app::StartError>(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("edgecore: {e}");
            ExitCode::FAILURE
        }
    }
}

fn join(opts: &edgecore::certmanager::join::JoinOptions, path: &std::path::Path) -> ExitCode {
    use edgecore::certmanager::join;
    let config = match join::join_config(opts, EdgeCoreConfig::default_config()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("edgecore join: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("edgecore join: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(join::join(
        &config,
        path,
        std::time::Duration::from_secs(300),
    )) {
        Ok(()) => {
            println!(
                "node {} joined; start edgecore with --config {}",
                config.node_name(),
                path.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("edgecore join: {e}");
            ExitCode::FAILURE
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
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops edgecore");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
