//! edgecore: the edge agent of kubeedge-rs. Reads KubeEdge's edgecore.yaml.

mod own_libm;

use clap::Parser;
use edgecore::app::{EdgeCore, log_changes_without_edged};
use edgecore::config::{DEFAULT_CONFIG_PATH, EdgeCoreConfig};
use std::path::PathBuf;
use std::process::ExitCode;

/// The edge part of kubeedge-rs: keeps the link to cloudcore, the local database of the
/// objects this node runs, and the pods on the local container runtime.
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
    Join(edgecore::certmanager::JoinOptions),
    /// Undo `join` (like `keadm reset`): stop and disable edgecore.service, remove the unit,
    /// the certificates and the configuration (--config), and the edge database after
    /// confirmation (or with --yes). Pods and containers are left to the runtime.
    Reset {
        /// Remove the database without asking.
        #[arg(long)]
        yes: bool,
    },
}

fn main() -> ExitCode {
    EXE.get_or_init(|| std::env::current_exe().ok());
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
    if let Some(Command::Reset { yes }) = &args.command {
        return reset(&args.config, *yes);
    }
    // An upgrade in progress counts this start before anything a broken build could fail at.
    if edgecore::taskmanager::count_upgrade_start(&args.config) {
        eprintln!(
            "edgecore: the upgraded edgecore never reached the cloud; the previous binary is back"
        );
        return restart_self(&args.config);
    }
    let config = match EdgeCoreConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            if edgecore::taskmanager::roll_back_after_failed_start(&args.config) {
                eprintln!("edgecore: {e}; the configuration before the update is back");
                return restart_self(&args.config);
            }
            eprintln!("edgecore: {e}");
            eprintln!("(print a starting point with `edgecore --defaultconfig`)");
            return ExitCode::from(2);
        }
    };
    edgecore::memory::limit_malloc_arenas();
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
        if let Err(e) = edgecore::certmanager::bootstrap_if_needed(
            &config,
            Some(&args.config),
            std::time::Duration::from_secs(300),
        )
        .await
        {
            if edgecore::taskmanager::roll_back_after_failed_start(&args.config) {
                eprintln!("edgecore: {e}; the configuration before the update is back");
                return Ok(true);
            }
            return Err(e.into());
        }
        let (mut edge, supervisor) = match EdgeCore::start_supervised(&config, &args.config).await {
            Ok(started) => started,
            Err(e) => {
                // A configuration a node task put in place that cannot even start: the
                // previous one goes back and this process starts again with it.
                if edgecore::taskmanager::roll_back_after_failed_start(&args.config) {
                    eprintln!("edgecore: {e}; the configuration before the update is back");
                    return Ok(true);
                }
                return Err(e);
            }
        };
        if let Some((_client, changes)) = edge.edged_link() {
            tokio::spawn(log_changes_without_edged(changes));
        }
        let trim = tokio::spawn(edgecore::memory::release_freed_memory_every(
            edgecore::memory::TRIM_INTERVAL,
        ));
        let startup_code = tokio::spawn(async {
            tokio::time::sleep(edgecore::memory::STARTUP_CODE_SETTLE).await;
            let bytes = edgecore::memory::release_startup_code();
            tracing::debug!(bytes, "start-up code pages given back");
        });
        let restart = tokio::select! {
            _ = wait_for_signal() => false,
            _ = supervisor.restart.notified() => true,
        };
        tracing::info!(restart, "shutting down");
        trim.abort();
        startup_code.abort();
        edge.shutdown().await;
        Ok::<_, edgecore::app::StartError>(restart)
    });
    match result {
        Ok(true) => restart_self(&args.config),
        Ok(false) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("edgecore: {e}");
            ExitCode::FAILURE
        }
    }
}

fn join(opts: &edgecore::certmanager::JoinOptions, path: &std::path::Path) -> ExitCode {
    let config = match edgecore::certmanager::join_config(opts, EdgeCoreConfig::default_config()) {
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
    match rt.block_on(edgecore::certmanager::join_node(
        &config,
        path,
        std::time::Duration::from_secs(300),
    )) {
        Ok(()) => {
            println!("node {} joined", config.node_name());
            if opts.no_service {
                println!("start edgecore with --config {}", path.display());
                return ExitCode::SUCCESS;
            }
            install_service(path)
        }
        Err(e) => {
            eprintln!("edgecore join: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Installs edgecore.service for this binary and `config` (enabled and started where systemd
/// runs).
fn install_service(config: &std::path::Path) -> ExitCode {
    use edgecore::install::{self, Installed, SystemSystemctl};
    let binary = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .unwrap_or_else(|_| PathBuf::from("/usr/local/bin/edgecore"));
    let config = std::path::absolute(config).unwrap_or_else(|_| config.to_path_buf());
    match install::install_service(
        std::path::Path::new("/"),
        &binary,
        &config,
        &SystemSystemctl,
    ) {
        Ok(Installed::Started(unit)) => {
            println!(
                "installed {} and started it (systemctl status edgecore)",
                unit.display()
            );
            ExitCode::SUCCESS
        }
        Ok(Installed::WrittenOnly(unit)) => {
            println!(
                "wrote {}; systemd does not run here: start edgecore with --config {}",
                unit.display(),
                config.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("edgecore join: the node joined, but the service was not installed: {e}");
            eprintln!(
                "(start edgecore with --config {}, or re-run join with --no-service)",
                config.display()
            );
            ExitCode::FAILURE
        }
    }
}

/// `edgecore reset`.
fn reset(config_path: &std::path::Path, yes: bool) -> ExitCode {
    use edgecore::install::{self, SystemSystemctl};
    use std::io::IsTerminal;
    let config = match EdgeCoreConfig::load(config_path) {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("edgecore reset: {e}; removing only the service and that file");
            None
        }
    };
    let remove_database = yes
        || match &config {
            Some(c) if std::io::stdin().is_terminal() => {
                print!(
                    "remove the edge database {} (all it stored is lost)? [y/N] ",
                    c.database.data_source
                );
                let _ = std::io::Write::flush(&mut std::io::stdout());
                let mut answer = String::new();
                let _ = std::io::stdin().read_line(&mut answer);
                matches!(answer.trim(), "y" | "Y" | "yes")
            }
            _ => false,
        };
    if let Some(c) = &config {
        // edgemesh's iptables chains and address (rules outlive edgecore on purpose).
        match edgecore::mesh::cleanup(c) {
            Ok(()) => {
                if c.modules.edge_mesh.enable {
                    println!(
                        "removed edgemesh's iptables chains ({}-*) and address {}",
                        c.modules.edge_mesh.proxy.chain_prefix, c.modules.edge_mesh.listen_address
                    );
                }
            }
            Err(e) if c.modules.edge_mesh.enable => {
                eprintln!("edgecore reset: edgemesh's iptables chains not removed: {e}")
            }
            Err(_) => {}
        }
    }
    match install::reset(
        std::path::Path::new("/"),
        config_path,
        config.as_ref(),
        remove_database,
        &SystemSystemctl,
    ) {
        Ok(report) => {
            if report.stopped_service {
                println!("stopped and disabled edgecore.service");
            }
            for f in &report.removed {
                println!("removed {}", f.display());
            }
            for f in &report.kept {
                println!(
                    "kept {} (remove it with `edgecore reset --yes`)",
                    f.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("edgecore reset: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The binary's path as it was when this process started: a node upgrade renames a new file
/// over it, after which the kernel's link names a deleted file.
static EXE: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();

/// Replaces this process with a fresh run of the binary at its path (a new one after an
/// upgrade) with the same arguments (same process ID, so a service manager sees no exit).
/// Returns only when that fails.
fn restart_self(config: &std::path::Path) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let Some(exe) = EXE.get_or_init(|| std::env::current_exe().ok()).clone() else {
        eprintln!("edgecore: cannot restart: the path of this binary is unknown");
        return ExitCode::FAILURE;
    };
    let err = std::process::Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .exec();
    eprintln!("edgecore: cannot restart {}: {err}", exe.display());
    // A new binary an upgrade put there that cannot even be executed: the previous one.
    if edgecore::taskmanager::roll_back_failed_upgrade(config) {
        let err = std::process::Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .exec();
        eprintln!("edgecore: cannot restart the previous binary either: {err}");
    }
    ExitCode::FAILURE
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
