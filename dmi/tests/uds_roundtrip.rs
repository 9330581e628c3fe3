//! Both DMI services served and called over real unix sockets in a temp directory.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use kubeedge_dmi::v1beta1::*;
use kubeedge_dmi::{
    DeviceManagerService, DeviceManagerServiceClient, DeviceManagerServiceServer,
    DeviceMapperService, DeviceMapperServiceClient, DeviceMapperServiceServer, connect_uds,
    connect_uds_lazy, device_from_crd, serve_uds,
};
use serde_json::json;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

struct Edge {
    reports: mpsc::UnboundedSender<ReportDeviceStatusRequest>,
}

#[tonic::async_trait]
impl DeviceManagerService for Edge {
    async fn mapper_register(
        &self,
        request: Request<MapperRegisterRequest>,
    ) -> Result<Response<MapperRegisterResponse>, Status> {
        let mapper = request.into_inner().mapper.unwrap_or_default();
        if mapper.protocol.is_empty() {
            return Err(Status::invalid_argument("protocol is required"));
        }
        let device = device_from_crd(&json!({
            "metadata": {"name": "d1", "namespace": "ns"},
            "spec": {"protocol": {"protocolName": mapper.protocol, "configData": {"port": 502}}}
        }))
        .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(MapperRegisterResponse {
            model_list: vec![DeviceModel::default()],
            device_list: vec![device],
        }))
    }

    async fn report_device_status(
        &self,
        request: Request<ReportDeviceStatusRequest>,
    ) -> Result<Response<ReportDeviceStatusResponse>, Status> {
        let _ = self.reports.send(request.into_inner());
        Ok(Response::new(ReportDeviceStatusResponse {}))
    }
}

struct Mapper;

#[tonic::async_trait]
impl DeviceMapperService for Mapper {
    async fn register_device(
        &self,
        request: Request<RegisterDeviceRequest>,
    ) -> Result<Response<RegisterDeviceResponse>, Status> {
        let device = request.into_inner().device.unwrap_or_default();
        Ok(Response::new(RegisterDeviceResponse {
            device_name: device.name,
            device_namespace: device.namespace,
        }))
    }
}

#[tokio::test]
async fn both_services_answer_over_unix_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let dmi_sock = dir.path().join("kubeedge/dmi.sock");
    let mapper_sock = dir.path().join("modbus.sock");
    // A stale file from an earlier run is replaced.
    std::fs::write(&mapper_sock, b"stale").unwrap();

    let (reports_tx, mut reports) = mpsc::unbounded_channel();
    let (stop_tx, stop) = tokio::sync::oneshot::channel::<()>();
    let edge = tokio::spawn(serve_uds(
        dmi_sock.clone(),
        DeviceManagerServiceServer::new(Edge {
            reports: reports_tx,
        }),
        async {
            let _ = stop.await;
        },
    ));
    let mapper = tokio::spawn(serve_uds(
        mapper_sock.clone(),
        DeviceMapperServiceServer::new(Mapper),
        std::future::pending(),
    ));

    // The servers bind inside their tasks: the lazy channel waits for nobody, so retry.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut edge_client = loop {
        match connect_uds(&dmi_sock).await {
            Ok(channel) => break DeviceManagerServiceClient::new(channel),
            Err(e) if tokio::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("edge never listened: {e}"),
        }
    };
    let mode = std::fs::metadata(&dmi_sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    let registered = edge_client
        .mapper_register(MapperRegisterRequest {
            with_data: true,
            mapper: Some(MapperInfo {
                name: "m".into(),
                protocol: "modbus".into(),
                address: mapper_sock.to_string_lossy().as_bytes().to_vec(),
                state: "OK".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(registered.device_list.len(), 1);
    let device = &registered.device_list[0];
    assert_eq!(
        (device.name.as_str(), device.namespace.as_str()),
        ("d1", "ns")
    );
    let protocol = device.spec.as_ref().unwrap().protocol.as_ref().unwrap();
    assert_eq!(protocol.protocol_name, "modbus");
    let config = kubeedge_dmi::config_data_to_json(protocol.config_data.as_ref().unwrap()).unwrap();
    assert_eq!(config["port"], json!(502));

    let status = edge_client
        .mapper_register(MapperRegisterRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);

    edge_client
        .report_device_status(ReportDeviceStatusRequest {
            device_name: "d1".into(),
            device_namespace: "ns".into(),
            reported_device: Some(DeviceStatus {
                twins: vec![Twin {
                    property_name: "temperature".into(),
                    reported: Some(TwinProperty {
                        value: "21".into(),
                        ..Default::default()
                    }),
                    observed_desired: None,
                }],
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let report = tokio::time::timeout(Duration::from_secs(5), reports.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        report.reported_device.unwrap().twins[0]
            .reported
            .as_ref()
            .unwrap()
            .value,
        "21"
    );

    // Default stubs: an RPC the fake does not implement answers UNIMPLEMENTED.
    let status = edge_client
        .report_device_states(ReportDeviceStatesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented);

    // The other direction, with a lazily connecting channel.
    let mut mapper_client = DeviceMapperServiceClient::new(connect_uds_lazy(&mapper_sock));
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        mapper_client.register_device(RegisterDeviceRequest {
            device: Some(Device {
                name: "d2".into(),
                namespace: "ns".into(),
                ..Default::default()
            }),
        }),
    )
    .await
    .unwrap()
    .unwrap()
    .into_inner();
    assert_eq!(
        (
            answer.device_name.as_str(),
            answer.device_namespace.as_str()
        ),
        ("d2", "ns")
    );

    // Graceful shutdown ends the edge server.
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), edge)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    mapper.abort();
}

#[tokio::test]
async fn connecting_to_a_missing_socket_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let err = connect_uds(dir.path().join("none.sock")).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("none.sock"), "{text}");
    // The cause, not only tonic's bare "transport error".
    assert!(text.contains("No such file"), "{text}");
}
