//! A KubeEdge DMI mapper for Modbus TCP devices.
//!
//! [`run`] serves `DeviceMapperService` on its own unix socket, registers with edgecore's
//! `DeviceManagerService`, then polls every device it is given (see [`config`] for the
//! `configData` keys and [`modbus`] for the value formats) and reports twins and device state.

pub mod config;
pub mod devices;
#[doc(hidden)]
pub mod fuzz_targets;
pub mod modbus;
mod poll;
mod register;
pub mod report;
pub mod server;

use std::future::Future;
use std::path::PathBuf;

use anyhow::Context as _;
use kubeedge_dmi::DeviceMapperServiceServer;
use kubeedge_dmi::v1beta1::MapperInfo;

use crate::devices::Devices;
use crate::report::Reporter;
use crate::server::MapperService;

/// The DMI API version this mapper speaks (mapper-framework sends the same).
pub const API_VERSION: &str = "v1.0.0";

#[derive(Debug, Clone)]
pub struct MapperOptions {
    /// edgecore's DMI socket.
    pub dmi_socket: PathBuf,
    /// This mapper's own `DeviceMapperService` socket, announced at registration.
    pub socket: PathBuf,
    pub name: String,
    /// edgecore sends this mapper the devices whose `protocolName` is this.
    pub protocol: String,
}

/// Runs the mapper until `shutdown` completes.
pub async fn run(options: MapperOptions, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let devices = Devices::new(Reporter::new(kubeedge_dmi::connect_uds_lazy(
        &options.dmi_socket,
    )));

    // Listen before registering: edgecore may call RegisterDevice right after MapperRegister.
    let listener = kubeedge_dmi::bind_uds(&options.socket)
        .with_context(|| format!("listen on {}", options.socket.display()))?;
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(kubeedge_dmi::serve_listener(
        listener,
        DeviceMapperServiceServer::new(MapperService::new(devices.clone())),
        async {
            let _ = server_stopped.await;
        },
    ));
    tracing::info!(socket = %options.socket.display(), "DeviceMapperService listening");

    let mapper = MapperInfo {
        name: options.name.clone(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        api_version: API_VERSION.to_string(),
        protocol: options.protocol.clone(),
        address: options.socket.to_string_lossy().into_owned().into_bytes(),
        state: "OK".to_string(),
    };
    let registration = async {
        let response = register::register(&options.dmi_socket, mapper).await;
        for model in response.model_list {
            devices.upsert_model(model);
        }
        for device in response.device_list {
            devices.upsert(device);
        }
    };

    tokio::pin!(shutdown);
    let stopped_early = tokio::select! {
        () = registration => false,
        () = &mut shutdown => true,
    };
    let result = if stopped_early {
        Ok(())
    } else {
        tokio::select! {
            () = &mut shutdown => Ok(()),
            served = server => match served {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(anyhow::Error::new(e).context("DeviceMapperService stopped")),
                Err(e) => Err(anyhow::Error::new(e).context("DeviceMapperService task")),
            },
        }
    };
    let _ = stop_server.send(());
    devices.clear();
    let _ = std::fs::remove_file(&options.socket);
    tracing::info!("mapper stopped");
    result
}
