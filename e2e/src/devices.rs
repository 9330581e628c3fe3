//! Device management for tests: KubeEdge's device CRDs installed from cloudcore's manifest
//! (`manifests/crds/devices-crds.yaml`), DeviceModel/Device objects, and the Modbus
//! pieces as real processes: `modbus-sim` (a Modbus TCP device) and `modbus-mapper`.

use crate::process::LoggedProcess;
use anyhow::Context;
use cloudcore::controller::Kind;
use kube::api::{Api, DynamicObject};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub const CRDS_YAML: &str = include_str!("../../manifests/crds/devices-crds.yaml");

/// Creates the three CRDs (existing ones are kept) and waits until they are served.
pub async fn install(client: &kube::Client) -> anyhow::Result<()> {
    crate::crds::install(
        client,
        CRDS_YAML,
        &[
            Kind::Device.api_resource(),
            Kind::DeviceModel.api_resource(),
            Kind::DeviceStatus.api_resource(),
        ],
    )
    .await
}

/// KubeEdge v1.23's DeviceStatuses in `ns`.
pub fn device_statuses(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &Kind::DeviceStatus.api_resource())
}

pub fn devices(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &Kind::Device.api_resource())
}

pub fn models(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &Kind::DeviceModel.api_resource())
}

/// A model of a thermostat: `temperature` (read-only, holding register 0) and `setpoint`
/// (read-write, holding register 1).
pub fn thermostat_model(name: &str) -> Value {
    json!({
        "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
        "metadata": {"name": name},
        "spec": {"protocol": "modbus", "properties": [
            {"name": "temperature", "type": "INT", "accessMode": "ReadOnly", "unit": "C"},
            {"name": "setpoint", "type": "INT", "accessMode": "ReadWrite", "unit": "C"}
        ]}
    })
}

/// A thermostat on the Modbus device at `plc`, bound to `node`, with setpoint `desired`.
pub fn thermostat(name: &str, model: &str, node: &str, plc: SocketAddr, desired: &str) -> Value {
    let property = |n: &str, offset: u16, desired: Option<&str>| {
        let mut p = json!({
            "name": n, "collectCycle": 200_000_000, "reportCycle": 200_000_000,
            "reportToCloud": true,
            "visitors": {"protocolName": "modbus",
                "configData": {"register": "HoldingRegister", "offset": offset, "limit": 1}}
        });
        if let Some(d) = desired {
            p["desired"] = json!({"value": d});
        }
        p
    };
    json!({
        "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
        "metadata": {"name": name, "labels": {"description": "thermostat"}},
        "spec": {
            "deviceModelRef": {"name": model},
            "nodeName": node,
            "protocol": {"protocolName": "modbus",
                "configData": {"ip": plc.ip().to_string(), "port": plc.port(), "slaveID": 1}},
            "properties": [property("temperature", 0, None), property("setpoint", 1, Some(desired))]
        }
    })
}

/// `status.twins[name].<field>.value` of a device object.
pub fn twin_value(device: &Value, name: &str, field: &str) -> Option<String> {
    device
        .pointer("/status/twins")?
        .as_array()?
        .iter()
        .find(|t| t["propertyName"] == name)?
        .pointer(&format!("/{field}/value"))?
        .as_str()
        .map(str::to_string)
}

/// A binary of this workspace: beside the running executable (`target/<profile>/<name>` for
/// binaries, one level up for test executables in `deps/`), built first when missing
/// (`cargo build -p <package>`).
pub fn workspace_binary(package: &str, name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .context("the executable has no directory")?
        .to_path_buf();
    let dir = if dir.ends_with("deps") {
        dir.parent().map(Path::to_path_buf).unwrap_or(dir)
    } else {
        dir
    };
    let path = dir.join(name);
    if !path.exists() {
        let mut build = Command::new(env!("CARGO"));
        build.args(["build", "-p", package, "--bins"]);
        // The profile the running executable was built with (`target/<profile>/`).
        match dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => {}
            Some(profile) => {
                build.args(["--profile", profile]);
            }
        }
        let status = build.status().context("running cargo build")?;
        anyhow::ensure!(status.success(), "cargo build -p {package} failed");
    }
    anyhow::ensure!(path.exists(), "{} missing after the build", path.display());
    Ok(path)
}

/// `modbus-sim` on a free loopback port, with its address, once it accepts connections.
pub fn start_modbus_sim(log_dir: &Path) -> anyhow::Result<(LoggedProcess, SocketAddr)> {
    let bin = workspace_binary("modbus-mapper", "modbus-sim")?;
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let mut cmd = Command::new(bin);
    cmd.arg("--listen").arg(addr.to_string());
    let mut proc = LoggedProcess::spawn("modbus-sim", cmd, log_dir)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        anyhow::ensure!(
            proc.is_running() && std::time::Instant::now() < deadline,
            "modbus-sim did not listen on {addr}:\n{}",
            proc.failure_report(20)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((proc, addr))
}

/// `modbus-mapper` registering at `dmi_socket`, serving on `dir/modbus.sock`.
pub fn start_modbus_mapper(dmi_socket: &Path, dir: &Path) -> anyhow::Result<LoggedProcess> {
    let bin = workspace_binary("modbus-mapper", "modbus-mapper")?;
    let mut cmd = Command::new(bin);
    cmd.arg("--dmi-socket")
        .arg(dmi_socket)
        .arg("--socket")
        .arg(dir.join("modbus.sock"))
        .env("RUST_LOG", "info");
    Ok(LoggedProcess::spawn("modbus-mapper", cmd, dir)?)
}

/// Reads holding register `addr` of the Modbus device at `plc`.
pub async fn read_register(plc: SocketAddr, addr: u16) -> anyhow::Result<u16> {
    use tokio_modbus::prelude::*;
    let mut ctx = tcp::connect(plc).await?;
    let words = ctx.read_holding_registers(addr, 1).await??;
    words.first().copied().context("no register value")
}

/// Writes holding register `addr` of the Modbus device at `plc`.
pub async fn write_register(plc: SocketAddr, addr: u16, value: u16) -> anyhow::Result<()> {
    use tokio_modbus::prelude::*;
    let mut ctx = tcp::connect(plc).await?;
    ctx.write_single_register(addr, value).await??;
    Ok(())
}
