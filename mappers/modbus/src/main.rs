//! `modbus-mapper`: a KubeEdge DMI mapper for Modbus TCP devices.

use std::path::PathBuf;

use clap::Parser;
use modbus_mapper::{MapperOptions, run};
use tracing_subscriber::EnvFilter;

/// KubeEdge device mapper for Modbus TCP: registers with edgecore over DMI, polls the devices it
/// is given and reports their twins and state.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// edgecore's DMI socket.
    #[arg(long, env = "DMI_SOCKET", default_value = kubeedge_dmi::DEFAULT_DMI_SOCKET)]
    dmi_socket: PathBuf,
    /// This mapper's own gRPC socket (DeviceMapperService), announced to edgecore.
    #[arg(long, default_value = "/etc/kubeedge/modbus.sock")]
    socket: PathBuf,
    /// Mapper name sent at registration.
    #[arg(long, default_value = "modbus-mapper")]
    name: String,
    /// Protocol name: edgecore sends the devices whose spec.protocol.protocolName is this.
    #[arg(long, default_value = "modbus")]
    protocol: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let options = MapperOptions {
        dmi_socket: cli.dmi_socket,
        socket: cli.socket,
        name: cli.name,
        protocol: cli.protocol,
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
