//! DMI (devices reference §5): edgecore's `DeviceManagerService` on its unix socket (mode
//! 0600) and the calls to mappers' `DeviceMapperService`.
//!
//! * `MapperRegister` records the mapper's protocol and socket (in `meta`, type
//!   `devicemapper`, so a restarted edgecore still reaches it) and, `withData`, returns the
//!   devices of that protocol with their models.
//! * `ReportDeviceStatus` becomes an edge-side twin update (`actual` = reported,
//!   `expected` = observedDesired when given); `ReportDeviceStates` a state update.
//! * Device and model objects from the cloud become Register/Update/Remove calls to the
//!   mapper of their protocol, off the actor's loop, one connection per call, 10 s each.
//!   A device whose protocol has no mapper waits for the mapper's registration.

use kubeedge_dmi::v1beta1 as pb;
use kubeedge_dmi::{DeviceManagerService, DeviceMapperServiceClient};
use kubeedge_shared::devices::{DeviceTwinUpdate, MsgTwin, TwinValue};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

/// How long one call to a mapper may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What the DMI server asks of devicetwin.
#[derive(Debug)]
pub enum DmiRequest {
    Register {
        mapper: pb::MapperInfo,
        with_data: bool,
        reply: oneshot::Sender<Result<pb::MapperRegisterResponse, String>>,
    },
    Status(pb::ReportDeviceStatusRequest),
    States(pb::ReportDeviceStatesRequest),
    /// A Register/UpdateDevice call for `(namespace, name)` finished.
    CallDone {
        device: (String, String),
        result: Result<(), String>,
    },
}

/// The `DeviceManagerService` edgecore serves.
#[derive(Clone)]
pub struct Server {
    pub tx: mpsc::Sender<DmiRequest>,
}

fn busy() -> Status {
    Status::unavailable("devicetwin is not running")
}

#[tonic::async_trait]
impl DeviceManagerService for Server {
    async fn mapper_register(
        &self,
        request: Request<pb::MapperRegisterRequest>,
    ) -> Result<Response<pb::MapperRegisterResponse>, Status> {
        let req = request.into_inner();
        let Some(mapper) = req.mapper else {
            return Err(Status::invalid_argument("mapper is required"));
        };
        if mapper.protocol.is_empty() {
            return Err(Status::invalid_argument("mapper.protocol is required"));
        }
        if std::str::from_utf8(&mapper.address).is_err() || mapper.address.is_empty() {
            return Err(Status::invalid_argument(
                "mapper.address must be the UTF-8 path of the mapper's socket",
            ));
        }
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(DmiRequest::Register {
                mapper,
                with_data: req.with_data,
                reply,
            })
            .await
            .map_err(|_| busy())?;
        match rx.await.map_err(|_| busy())? {
            Ok(r) => Ok(Response::new(r)),
            Err(e) => Err(Status::internal(e)),
        }
    }

    async fn report_device_status(
        &self,
        request: Request<pb::ReportDeviceStatusRequest>,
    ) -> Result<Response<pb::ReportDeviceStatusResponse>, Status> {
        let req = request.into_inner();
        if req.device_name.is_empty() {
            return Err(Status::invalid_argument("deviceName is required"));
        }
        self.tx
            .send(DmiRequest::Status(req))
            .await
            .map_err(|_| busy())?;
        Ok(Response::new(pb::ReportDeviceStatusResponse {}))
    }

    async fn report_device_states(
        &self,
        request: Request<pb::ReportDeviceStatesRequest>,
    ) -> Result<Response<pb::ReportDeviceStatesResponse>, Status> {
        let req = request.into_inner();
        if req.device_name.is_empty() || req.state.is_empty() {
            return Err(Status::invalid_argument(
                "deviceName and state are required",
            ));
        }
        self.tx
            .send(DmiRequest::States(req))
            .await
            .map_err(|_| busy())?;
        Ok(Response::new(pb::ReportDeviceStatesResponse {}))
    }
}

/// The socket file: `<dmiSockPath>/dmi.sock` (a value ending in `.sock` names the file).
pub fn socket_path(configured: &str) -> PathBuf {
    let p = Path::new(if configured.is_empty() {
        "/etc/kubeedge/"
    } else {
        configured
    });
    if p.extension().is_some_and(|e| e == "sock") {
        p.to_path_buf()
    } else {
        p.join("dmi.sock")
    }
}

/// The twin update a mapper's status report makes (as KubeEdge's edge builds it), straight
/// from the proto.
pub fn twin_update_of(report: &pb::ReportDeviceStatusRequest) -> DeviceTwinUpdate {
    let value = |v: &str| TwinValue {
        value: Some(v.to_string()),
        metadata: None,
    };
    let twins = report
        .reported_device
        .as_ref()
        .map(|d| d.twins.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|t| !t.property_name.is_empty())
        .map(|t| {
            let twin = MsgTwin {
                expected: t.observed_desired.as_ref().map(|d| value(&d.value)),
                actual: t.reported.as_ref().map(|r| value(&r.value)),
                ..Default::default()
            };
            (t.property_name.clone(), Some(twin))
        })
        .collect();
    DeviceTwinUpdate {
        event_id: String::new(),
        timestamp: kubeedge_shared::message::now_millis(),
        twin: Some(twins),
    }
}

/// One call to a mapper.
#[derive(Debug, Clone)]
pub enum MapperCall {
    RegisterDevice(pb::Device),
    UpdateDevice(pb::Device),
    RemoveDevice { name: String, namespace: String },
    CreateModel(pb::DeviceModel),
    UpdateModel(pb::DeviceModel),
    RemoveModel { name: String, namespace: String },
}

/// Makes `call` on the mapper listening at `socket`, in the background; failures are logged.
/// With `done`, the outcome is reported as [`DmiRequest::CallDone`] for that device.
pub fn spawn_call(
    socket: PathBuf,
    call: MapperCall,
    done: Option<(mpsc::Sender<DmiRequest>, (String, String))>,
) {
    tokio::spawn(async move {
        let what = format!("{call:?}").chars().take(60).collect::<String>();
        let result = match tokio::time::timeout(CALL_TIMEOUT, make_call(&socket, call)).await {
            Ok(r) => r,
            Err(_) => Err("timed out after 10s".to_string()),
        };
        match &result {
            Ok(()) => tracing::debug!(socket = %socket.display(), call = %what, "mapper call done"),
            Err(e) => {
                tracing::warn!(socket = %socket.display(), call = %what, error = %e, "mapper call failed")
            }
        }
        if let Some((tx, device)) = done {
            let _ = tx.send(DmiRequest::CallDone { device, result }).await;
        }
    });
}

async fn make_call(socket: &Path, call: MapperCall) -> Result<(), String> {
    let channel = kubeedge_dmi::connect_uds(socket)
        .await
        .map_err(|e| e.to_string())?;
    let mut c = DeviceMapperServiceClient::new(channel);
    let r = match call {
        MapperCall::RegisterDevice(d) => c
            .register_device(pb::RegisterDeviceRequest { device: Some(d) })
            .await
            .map(|_| ()),
        MapperCall::UpdateDevice(d) => c
            .update_device(pb::UpdateDeviceRequest { device: Some(d) })
            .await
            .map(|_| ()),
        MapperCall::RemoveDevice { name, namespace } => c
            .remove_device(pb::RemoveDeviceRequest {
                device_name: name,
                device_namespace: namespace,
            })
            .await
            .map(|_| ()),
        MapperCall::CreateModel(m) => c
            .create_device_model(pb::CreateDeviceModelRequest { model: Some(m) })
            .await
            .map(|_| ()),
        MapperCall::UpdateModel(m) => c
            .update_device_model(pb::UpdateDeviceModelRequest { model: Some(m) })
            .await
            .map(|_| ()),
        MapperCall::RemoveModel { name, namespace } => c
            .remove_device_model(pb::RemoveDeviceModelRequest {
                model_name: name,
                model_namespace: namespace,
            })
            .await
            .map(|_| ()),
    };
    r.map_err(|s| format!("{}: {}", s.code(), s.message()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths_and_status_reports() {
        assert_eq!(socket_path(""), PathBuf::from("/etc/kubeedge/dmi.sock"));
        assert_eq!(socket_path("/run/ke/"), PathBuf::from("/run/ke/dmi.sock"));
        assert_eq!(socket_path("/run/x.sock"), PathBuf::from("/run/x.sock"));
        let r = pb::ReportDeviceStatusRequest {
            device_name: "t1".into(),
            device_namespace: "default".into(),
            reported_device: Some(pb::DeviceStatus {
                twins: vec![
                    pb::Twin {
                        property_name: "temperature".into(),
                        reported: Some(pb::TwinProperty {
                            value: "23".into(),
                            metadata: Default::default(),
                        }),
                        observed_desired: None,
                    },
                    pb::Twin::default(),
                ],
                ..Default::default()
            }),
        };
        let v = serde_json::to_value(twin_update_of(&r)).unwrap();
        assert_eq!(
            v["twin"],
            serde_json::json!({"temperature": {"actual": {"value": "23"}}})
        );
    }
}
