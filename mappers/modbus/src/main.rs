//! `modbus-mapper`: a KubeEdge DMI mapper for Modbus TCP devices.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use modbus_mapper::{MapperOptions, run};
use serde::{Deserialize, Serialize};
use tracing_subscriber::EnvFilter;

/// KubeEdge device mapper for Modbus TCP: registers with edgecore over DMI, polls the devices it
/// is given and reports their twins and state. Settings come from the flags, else from
/// `--config`, else the defaults (`--default-config` prints them).
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// A YAML file with the settings (keys as `--default-config` prints them).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the default configuration (YAML) and exit.
    #[arg(long)]
    default_config: bool,
    /// edgecore's DMI socket.
    #[arg(long, env = "DMI_SOCKET")]
    dmi_socket: Option<PathBuf>,
    /// This mapper's own gRPC socket (DeviceMapperService), announced to edgecore.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Mapper name sent at registration.
    #[arg(long)]
    name: Option<String>,
    /// Protocol name: edgecore sends the devices whose spec.protocol.protocolName is this.
    #[arg(long)]
    protocol: Option<String>,
}

/// The configuration file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
struct FileConfig {
    dmi_socket: PathBuf,
    socket: PathBuf,
    name: String,
    protocol: String,
}

impl Default for FileConfig {
    fn default() -> Self {
        FileConfig {
            dmi_socket: PathBuf::from(kubeedge_dmi::DEFAULT_DMI_SOCKET),
            socket: PathBuf::from("/etc/kubeedge/modbus.sock"),
            name: "modbus-mapper".into(),
            protocol: "modbus".into(),
        }
    }
}

fn load(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the configuration file {}", path.display()))?;
    serde_saphyr::from_str(&text).with_context(|| {
        format!(
            "{}: not a valid modbus-mapper configuration (see `modbus-mapper --default-config`)",
            path.display()
        )
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.default_config {
        print!("{}", serde_saphyr::to_string(&FileConfig::default())?);
        return Ok(());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let file = match &cli.config {
        Some(p) => load(p)?,
        None => FileConfig::default(),
    };
    let options = MapperOptions {
        dmi_socket: cli.dmi_socket.unwrap_or(file.dmi_socket),
        socket: cli.socket.unwrap_or(file.socket),
        name: cli.name.unwrap_or(file.name),
        protocol: cli.protocol.unwrap_or(file.protocol),
    };
    run(options, shutdown_signal()).await
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(error) => {
            tracing::warn!(%error, "cannot watch SIGTERM; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}
