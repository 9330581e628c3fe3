//! Reports to edgecore's `DeviceManagerService`: twins (`ReportDeviceStatus`) and device state
//! (`ReportDeviceStates`). Failures are logged, never fatal: the next report carries fresh values.

use std::time::Duration;

use kubeedge_dmi::DeviceManagerServiceClient;
use kubeedge_dmi::v1beta1::{
    DeviceStatus, ReportDeviceStatesRequest, ReportDeviceStatusRequest, Twin,
};
use tonic::transport::Channel;

use crate::config::DeviceKey;

/// edgecore's own per-call deadline towards mappers; the same bound the other way.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Device state strings edgecore accepts (compared lower-case).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceState {
    Online,
    Offline,
    /// The device's configuration cannot be used (e.g. no `ip`).
    Unhealthy,
}

impl DeviceState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Online => "online",
            Self::Offline => "offline",
            Self::Unhealthy => "unhealthy",
        }
    }
}

#[derive(Clone)]
pub struct Reporter {
    client: DeviceManagerServiceClient<Channel>,
}

impl Reporter {
    pub fn new(channel: Channel) -> Self {
        Reporter {
            client: DeviceManagerServiceClient::new(channel),
        }
    }

    pub async fn twins(&self, device: &DeviceKey, twins: Vec<Twin>) {
        let request = ReportDeviceStatusRequest {
            device_name: device.name.clone(),
            device_namespace: device.namespace.clone(),
            reported_device: Some(DeviceStatus {
                twins,
                ..Default::default()
            }),
        };
        let mut client = self.client.clone();
        match tokio::time::timeout(CALL_TIMEOUT, client.report_device_status(request)).await {
            Ok(Ok(_)) => tracing::debug!(%device, "twins reported"),
            Ok(Err(status)) => tracing::warn!(%device, %status, "ReportDeviceStatus failed"),
            Err(_) => tracing::warn!(%device, "ReportDeviceStatus timed out"),
        }
    }

    pub async fn state(&self, device: &DeviceKey, state: DeviceState) {
        let request = ReportDeviceStatesRequest {
            device_name: device.name.clone(),
            device_namespace: device.namespace.clone(),
            state: state.as_str().to_string(),
        };
        let mut client = self.client.clone();
        match tokio::time::timeout(CALL_TIMEOUT, client.report_device_states(request)).await {
            Ok(Ok(_)) => tracing::info!(%device, state = state.as_str(), "device state reported"),
            Ok(Err(status)) => tracing::warn!(%device, %status, "ReportDeviceStates failed"),
            Err(_) => tracing::warn!(%device, "ReportDeviceStates timed out"),
        }
    }
}
