//! Registration with edgecore: `MapperRegister{withData: true}`, retried with back-off until
//! edgecore answers.

use std::path::Path;
use std::time::Duration;

use kubeedge_dmi::DeviceManagerServiceClient;
use kubeedge_dmi::v1beta1::{MapperInfo, MapperRegisterRequest, MapperRegisterResponse};

const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Registers until edgecore accepts; returns its devices and models for this protocol.
pub async fn register(dmi_socket: &Path, mapper: MapperInfo) -> MapperRegisterResponse {
    let mut backoff = MIN_BACKOFF;
    let mut attempt = 1u32;
    loop {
        match register_once(dmi_socket, mapper.clone()).await {
            Ok(response) => {
                tracing::info!(
                    socket = %dmi_socket.display(),
                    attempt,
                    devices = response.device_list.len(),
                    models = response.model_list.len(),
                    "registered with edgecore"
                );
                return response;
            }
            Err(error) => {
                tracing::warn!(socket = %dmi_socket.display(), attempt, %error, retry_in = ?backoff, "registration failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                attempt += 1;
            }
        }
    }
}

async fn register_once(
    dmi_socket: &Path,
    mapper: MapperInfo,
) -> Result<MapperRegisterResponse, String> {
    let channel = kubeedge_dmi::connect_uds(dmi_socket)
        .await
        .map_err(|e| e.to_string())?;
    let mut client = DeviceManagerServiceClient::new(channel);
    let request = MapperRegisterRequest {
        with_data: true,
        mapper: Some(mapper),
    };
    match tokio::time::timeout(CALL_TIMEOUT, client.mapper_register(request)).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(status.to_string()),
        Err(_) => Err(format!("no answer within {CALL_TIMEOUT:?}")),
    }
}
