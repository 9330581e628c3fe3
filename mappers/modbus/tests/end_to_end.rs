//! The mapper against a real Modbus TCP server on loopback and a fake edgecore
//! (`DeviceManagerService`) on a temp unix socket: registration, polling, twin and state
//! reports, desired-value writes, disconnection and shutdown.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kubeedge_dmi::v1beta1::*;
use kubeedge_dmi::{
    DeviceManagerService, DeviceManagerServiceServer, DeviceMapperServiceClient, connect_uds,
    device_from_crd, model_from_crd,
};
use modbus_mapper::{MapperOptions, run};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};
use tokio_modbus::{ExceptionCode, Request, Response};
use tonic::Status;

const DEADLINE: Duration = Duration::from_secs(20);

// ---- a Modbus TCP device ------------------------------------------------------------------

#[derive(Clone, Default)]
struct Plc {
    holding: Arc<Mutex<HashMap<u16, u16>>>,
    writes: Arc<Mutex<Vec<(u16, u16)>>>,
}

impl tokio_modbus::server::Service for Plc {
    type Request = Request<'static>;
    type Response = Response;
    type Exception = ExceptionCode;
    type Future = std::future::Ready<Result<Response, ExceptionCode>>;

    fn call(&self, request: Request<'static>) -> Self::Future {
        let mut holding = self.holding.lock().unwrap();
        std::future::ready(match request {
            Request::ReadHoldingRegisters(addr, cnt) => (addr..addr + cnt)
                .map(|a| {
                    holding
                        .get(&a)
                        .copied()
                        .ok_or(ExceptionCode::IllegalDataAddress)
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Response::ReadHoldingRegisters),
            Request::WriteSingleRegister(addr, word) if holding.contains_key(&addr) => {
                holding.insert(addr, word);
                self.writes.lock().unwrap().push((addr, word));
                Ok(Response::WriteSingleRegister(addr, word))
            }
            Request::WriteSingleRegister(..) => Err(ExceptionCode::IllegalDataAddress),
            _ => Err(ExceptionCode::IllegalFunction),
        })
    }
}

impl Plc {
    fn register(&self, addr: u16) -> Option<u16> {
        self.holding.lock().unwrap().get(&addr).copied()
    }
}

async fn start_plc(plc: Plc) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio_modbus::server::tcp::Server::new(listener);
    let task = tokio::spawn(async move {
        let on_connected = |stream, _addr| {
            let plc = plc.clone();
            async move { Ok(Some((plc, stream))) }
        };
        let _ = server.serve(&on_connected, |_err| {}).await;
    });
    (addr, task)
}

// ---- a fake edgecore ------------------------------------------------------------------------

struct Edge {
    register_answer: MapperRegisterResponse,
    registrations: mpsc::UnboundedSender<MapperRegisterRequest>,
    twins: mpsc::UnboundedSender<ReportDeviceStatusRequest>,
    states: mpsc::UnboundedSender<ReportDeviceStatesRequest>,
}

#[tonic::async_trait]
impl DeviceManagerService for Edge {
    async fn mapper_register(
        &self,
        request: tonic::Request<MapperRegisterRequest>,
    ) -> Result<tonic::Response<MapperRegisterResponse>, Status> {
        let _ = self.registrations.send(request.into_inner());
        Ok(tonic::Response::new(self.register_answer.clone()))
    }

    async fn report_device_status(
        &self,
        request: tonic::Request<ReportDeviceStatusRequest>,
    ) -> Result<tonic::Response<ReportDeviceStatusResponse>, Status> {
        let _ = self.twins.send(request.into_inner());
        Ok(tonic::Response::new(ReportDeviceStatusResponse {}))
    }

    async fn report_device_states(
        &self,
        request: tonic::Request<ReportDeviceStatesRequest>,
    ) -> Result<tonic::Response<ReportDeviceStatesResponse>, Status> {
        let _ = self.states.send(request.into_inner());
        Ok(tonic::Response::new(ReportDeviceStatesResponse {}))
    }
}

fn plc_device(plc: SocketAddr, setpoint: &str) -> Value {
    json!({
        "apiVersion": "devices.kubeedge.io/v1beta1",
        "kind": "Device",
        "metadata": {"name": "plc-1", "namespace": "factory"},
        "spec": {
            "deviceModelRef": {"name": "plc-model"},
            "nodeName": "edge-1",
            "protocol": {"protocolName": "modbus",
                         "configData": {"ip": plc.ip().to_string(), "port": plc.port(), "slaveID": 1}},
            "properties": [
                {"name": "temperature", "desired": {"value": ""},
                 "collectCycle": 100_000_000, "reportCycle": 100_000_000, "reportToCloud": true,
                 "visitors": {"protocolName": "modbus",
                              "configData": {"register": "HoldingRegister", "offset": 2, "scale": 0.5}}},
                {"name": "setpoint", "desired": {"value": setpoint},
                 "collectCycle": 100_000_000, "reportCycle": 100_000_000, "reportToCloud": true,
                 "visitors": {"protocolName": "modbus",
                              "configData": {"register": "HoldingRegister", "offset": 5, "limit": 1}}},
                {"name": "mystery", "desired": {"value": ""}, "reportToCloud": true,
                 "visitors": {"protocolName": "modbus", "configData": {"register": "MagicRegister"}}}
            ]
        }
    })
}

fn plc_model() -> Value {
    json!({
        "metadata": {"name": "plc-model", "namespace": "factory"},
        "spec": {"protocol": "modbus", "properties": [
            {"name": "temperature", "type": "FLOAT", "accessMode": "ReadOnly", "unit": "C"},
            {"name": "setpoint", "type": "INT", "accessMode": "ReadWrite"}
        ]}
    })
}

/// The next item that satisfies `accept`, or a panic naming `what` at the deadline.
async fn next_matching<T: std::fmt::Debug>(
    rx: &mut mpsc::UnboundedReceiver<T>,
    deadline: Instant,
    what: &str,
    mut accept: impl FnMut(&T) -> bool,
) -> T {
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(item)) if accept(&item) => return item,
            Ok(Some(_)) => {}
            Ok(None) => panic!("channel closed while waiting for {what}"),
            Err(_) => panic!("no {what} before the deadline"),
        }
    }
}

async fn until(deadline: Instant, what: &str, mut check: impl FnMut() -> bool) {
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not before the deadline");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn twin<'a>(report: &'a ReportDeviceStatusRequest, property: &str) -> Option<&'a Twin> {
    report
        .reported_device
        .as_ref()?
        .twins
        .iter()
        .find(|t| t.property_name == property)
}

fn values(t: &Twin) -> (&str, &str) {
    (
        t.reported.as_ref().map_or("", |p| p.value.as_str()),
        t.observed_desired.as_ref().map_or("", |p| p.value.as_str()),
    )
}

fn spawn_mapper(
    dmi_socket: &Path,
    socket: &Path,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let options = MapperOptions {
        dmi_socket: dmi_socket.to_path_buf(),
        socket: socket.to_path_buf(),
        name: "modbus-mapper".into(),
        protocol: "modbus".into(),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run(options, async {
        let _ = stopped.await;
    }));
    (stop, task)
}

async fn serve_edge(path: PathBuf, edge: Edge) {
    kubeedge_dmi::serve_uds(
        path,
        DeviceManagerServiceServer::new(edge),
        std::future::pending(),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapper_reports_registers_as_twins_and_writes_desired_values() {
    let deadline = Instant::now() + DEADLINE;
    let plc = Plc::default();
    plc.holding.lock().unwrap().extend([(2, 43), (5, 0)]);
    let (plc_addr, plc_task) = start_plc(plc.clone()).await;

    let dir = tempfile::tempdir().unwrap();
    let dmi_socket = dir.path().join("dmi.sock");
    let mapper_socket = dir.path().join("modbus.sock");

    // The mapper starts before edgecore: it must retry registration.
    let (stop_mapper, mapper) = spawn_mapper(&dmi_socket, &mapper_socket);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let broken = device_from_crd(&json!({
        "metadata": {"name": "broken", "namespace": "factory"},
        "spec": {"protocol": {"protocolName": "modbus", "configData": {"port": 502}},
                 "properties": [{"name": "x", "visitors": {"configData": {"register": "HoldingRegister"}}}]}
    }))
    .unwrap();
    let (registrations_tx, mut registrations) = mpsc::unbounded_channel();
    let (twins_tx, mut twins) = mpsc::unbounded_channel();
    let (states_tx, mut states) = mpsc::unbounded_channel();
    let edge = Edge {
        register_answer: MapperRegisterResponse {
            model_list: vec![model_from_crd(&plc_model()).unwrap(); 2],
            device_list: vec![device_from_crd(&plc_device(plc_addr, "")).unwrap(), broken],
        },
        registrations: registrations_tx,
        twins: twins_tx,
        states: states_tx,
    };
    let edge_task = tokio::spawn(serve_edge(dmi_socket.clone(), edge));

    let registration =
        next_matching(&mut registrations, deadline, "MapperRegister", |_| true).await;
    assert!(registration.with_data);
    let info = registration.mapper.unwrap();
    assert_eq!(info.name, "modbus-mapper");
    assert_eq!(info.protocol, "modbus");
    assert_eq!(info.api_version, "v1.0.0");
    assert_eq!(info.state, "OK");
    assert_eq!(info.address, mapper_socket.to_string_lossy().as_bytes());

    // Register 2 holds 43, reported × 0.5.
    let report = next_matching(&mut twins, deadline, "a temperature twin of 21.5", |r| {
        twin(r, "temperature").is_some_and(|t| values(t).0 == "21.5")
    })
    .await;
    assert_eq!(
        (
            report.device_name.as_str(),
            report.device_namespace.as_str()
        ),
        ("plc-1", "factory")
    );
    assert!(
        twin(&report, "mystery").is_none(),
        "a bad visitor is skipped"
    );
    assert_eq!(values(twin(&report, "setpoint").unwrap()), ("0", ""));

    // The two devices' states arrive in either order.
    let mut first_states: HashMap<String, String> = HashMap::new();
    while first_states.len() < 2 {
        let s = next_matching(&mut states, deadline, "a state of each device", |_| true).await;
        assert_eq!(s.device_namespace, "factory");
        first_states.entry(s.device_name).or_insert(s.state);
    }
    assert_eq!(first_states["plc-1"], "online");
    assert_eq!(first_states["broken"], "unhealthy");

    // edgecore forwards a desired value with UpdateDevice.
    let mut mapper_client =
        DeviceMapperServiceClient::new(connect_uds(&mapper_socket).await.unwrap());
    let update = UpdateDeviceRequest {
        device: Some(device_from_crd(&plc_device(plc_addr, "77")).unwrap()),
    };
    timeout(DEADLINE, mapper_client.update_device(update.clone()))
        .await
        .unwrap()
        .unwrap();
    until(deadline, "register 5 written", || {
        plc.register(5) == Some(77)
    })
    .await;
    next_matching(&mut twins, deadline, "setpoint 77 observed", |r| {
        twin(r, "setpoint").is_some_and(|t| values(t) == ("77", "77"))
    })
    .await;

    // The same desired value again is not written again, even after the device changes it.
    plc.holding.lock().unwrap().insert(5, 3);
    timeout(DEADLINE, mapper_client.update_device(update))
        .await
        .unwrap()
        .unwrap();
    next_matching(&mut twins, deadline, "setpoint read back as 3", |r| {
        twin(r, "setpoint").is_some_and(|t| values(t) == ("3", "77"))
    })
    .await;
    assert_eq!(*plc.writes.lock().unwrap(), vec![(5, 77)]);

    // GetDevice answers with the latest twins.
    let got = timeout(
        DEADLINE,
        mapper_client.get_device(GetDeviceRequest {
            device_name: "plc-1".into(),
            device_namespace: "factory".into(),
        }),
    )
    .await
    .unwrap()
    .unwrap()
    .into_inner()
    .device
    .unwrap();
    let got_twins = &got.status.unwrap().twins;
    assert!(
        got_twins.iter().any(|t| t.property_name == "temperature"),
        "{got_twins:?}"
    );

    // The device goes away: offline.
    plc_task.abort();
    next_matching(&mut states, deadline, "plc-1 offline", |s| {
        s.device_name == "plc-1" && s.state == "offline"
    })
    .await;

    // Removal stops reports.
    timeout(
        DEADLINE,
        mapper_client.remove_device(RemoveDeviceRequest {
            device_name: "plc-1".into(),
            device_namespace: "factory".into(),
        }),
    )
    .await
    .unwrap()
    .unwrap();
    let status = timeout(
        DEADLINE,
        mapper_client.get_device(GetDeviceRequest {
            device_name: "plc-1".into(),
            device_namespace: "factory".into(),
        }),
    )
    .await
    .unwrap()
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);

    stop_mapper.send(()).unwrap();
    timeout(DEADLINE, mapper).await.unwrap().unwrap().unwrap();
    assert!(!mapper_socket.exists(), "the mapper removes its socket");
    edge_task.abort();
}

#[tokio::test]
async fn a_mapper_stopped_while_edgecore_is_absent_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mapper_socket = dir.path().join("modbus.sock");
    let (stop, mapper) = spawn_mapper(&dir.path().join("absent-dmi.sock"), &mapper_socket);
    let deadline = Instant::now() + DEADLINE;
    until(deadline, "the mapper listens", || mapper_socket.exists()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.send(()).unwrap();
    timeout(DEADLINE, mapper).await.unwrap().unwrap().unwrap();
    assert!(!mapper_socket.exists());
}

#[test]
fn help_prints_usage_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_modbus-mapper"))
        .arg("--help")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in ["--dmi-socket", "--socket", "--name", "--protocol"] {
        assert!(help.contains(flag), "{help}");
    }
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
}
