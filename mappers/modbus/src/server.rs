//! The mapper's `DeviceMapperService`: edgecore's device and model calls.

use std::sync::Arc;

use kubeedge_dmi::DeviceMapperService;
use kubeedge_dmi::v1beta1::*;
use tonic::{Request, Response, Status};

use crate::config::DeviceKey;
use crate::devices::Devices;

pub struct MapperService {
    devices: Arc<Devices>,
}

impl MapperService {
    pub fn new(devices: Arc<Devices>) -> Self {
        MapperService { devices }
    }
}

fn required(device: Option<Device>) -> Result<Device, Status> {
    match device {
        Some(d) if !d.name.is_empty() => Ok(d),
        _ => Err(Status::invalid_argument("a device with a name is required")),
    }
}

fn required_model(model: Option<DeviceModel>) -> Result<DeviceModel, Status> {
    match model {
        Some(m) if !m.name.is_empty() => Ok(m),
        _ => Err(Status::invalid_argument("a model with a name is required")),
    }
}

#[tonic::async_trait]
impl DeviceMapperService for MapperService {
    async fn register_device(
        &self,
        request: Request<RegisterDeviceRequest>,
    ) -> Result<Response<RegisterDeviceResponse>, Status> {
        let device = required(request.into_inner().device)?;
        tracing::info!(device = %DeviceKey::of(&device), "RegisterDevice");
        let response = RegisterDeviceResponse {
            device_name: device.name.clone(),
            device_namespace: device.namespace.clone(),
        };
        self.devices.upsert(device);
        Ok(Response::new(response))
    }

    async fn remove_device(
        &self,
        request: Request<RemoveDeviceRequest>,
    ) -> Result<Response<RemoveDeviceResponse>, Status> {
        let request = request.into_inner();
        let key = DeviceKey {
            namespace: request.device_namespace,
            name: request.device_name,
        };
        tracing::info!(device = %key, "RemoveDevice");
        // Removing an unknown device succeeds: edgecore retries nothing and only logs errors.
        self.devices.remove(&key);
        Ok(Response::new(RemoveDeviceResponse {}))
    }

    async fn update_device(
        &self,
        request: Request<UpdateDeviceRequest>,
    ) -> Result<Response<UpdateDeviceResponse>, Status> {
        let device = required(request.into_inner().device)?;
        tracing::info!(device = %DeviceKey::of(&device), "UpdateDevice");
        self.devices.upsert(device);
        Ok(Response::new(UpdateDeviceResponse {}))
    }

    async fn create_device_model(
        &self,
        request: Request<CreateDeviceModelRequest>,
    ) -> Result<Response<CreateDeviceModelResponse>, Status> {
        let model = required_model(request.into_inner().model)?;
        tracing::info!(model = %format!("{}/{}", model.namespace, model.name), "CreateDeviceModel");
        let response = CreateDeviceModelResponse {
            device_model_name: model.name.clone(),
            device_model_namespace: model.namespace.clone(),
        };
        self.devices.upsert_model(model);
        Ok(Response::new(response))
    }

    async fn remove_device_model(
        &self,
        request: Request<RemoveDeviceModelRequest>,
    ) -> Result<Response<RemoveDeviceModelResponse>, Status> {
        let request = request.into_inner();
        tracing::info!(model = %format!("{}/{}", request.model_namespace, request.model_name), "RemoveDeviceModel");
        self.devices
            .remove_model(&request.model_namespace, &request.model_name);
        Ok(Response::new(RemoveDeviceModelResponse {}))
    }

    async fn update_device_model(
        &self,
        request: Request<UpdateDeviceModelRequest>,
    ) -> Result<Response<UpdateDeviceModelResponse>, Status> {
        let model = required_model(request.into_inner().model)?;
        tracing::info!(model = %format!("{}/{}", model.namespace, model.name), "UpdateDeviceModel");
        self.devices.upsert_model(model);
        Ok(Response::new(UpdateDeviceModelResponse {}))
    }

    async fn get_device(
        &self,
        request: Request<GetDeviceRequest>,
    ) -> Result<Response<GetDeviceResponse>, Status> {
        let request = request.into_inner();
        let key = DeviceKey {
            namespace: request.device_namespace,
            name: request.device_name,
        };
        match self.devices.get(&key) {
            Some(device) => Ok(Response::new(GetDeviceResponse {
                device: Some(device),
            })),
            None => Err(Status::not_found(format!("device {key} not found"))),
        }
    }
}
