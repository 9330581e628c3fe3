//! Mappers over DMI: registrations (a mapper's devices and models handed back, its
//! condition kept), and the twin values and states they report.

use super::*;

impl<L: CloudLink> State<L> {
    pub(super) async fn dmi(&mut self, r: dmi::DmiRequest) {
        match r {
            dmi::DmiRequest::Register {
                mapper,
                with_data,
                reply,
            } => {
                let answer = self.register_mapper(mapper, with_data).await;
                let large = answer
                    .as_ref()
                    .is_ok_and(|r| r.device_list.len() >= TRIM_AFTER_DEVICES);
                let _ = reply.send(answer);
                if large {
                    // Once the answer is sent (the server still holds it now).
                    tokio::spawn(async {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        release_freed_memory();
                    });
                }
            }
            dmi::DmiRequest::Status(s) => {
                if let Some(u) = self.mapper_twin_update(&s) {
                    self.twin_updates(vec![u]).await;
                }
            }
            dmi::DmiRequest::CallDone { device, result } => {
                if !self.objects.devices.contains_key(&device) {
                    return;
                }
                match result {
                    Ok(()) => {
                        let message = "the device was handed to its mapper".to_string();
                        self.set_condition(device, "True", "Registered", message)
                            .await
                    }
                    Err(e) => {
                        let message = format!("the mapper refused or did not answer: {e}");
                        self.set_condition(device, "False", "MapperCallFailed", message)
                            .await
                    }
                }
            }
            dmi::DmiRequest::States(s) => {
                let Some(id) = self.id_of(&s.device_name, &s.device_namespace) else {
                    tracing::info!(device = %s.device_name, "mapper reported the state of an unknown device; ignored");
                    return;
                };
                self.state_update(&id, &json!({ "state": s.state })).await;
            }
        }
    }

    /// The twin update a mapper's status report makes, for the device it names.
    pub(super) fn mapper_twin_update(
        &self,
        s: &kubeedge_dmi::v1beta1::ReportDeviceStatusRequest,
    ) -> Option<(String, DeviceTwinUpdate)> {
        let Some(id) = self.id_of(&s.device_name, &s.device_namespace) else {
            tracing::info!(device = %s.device_name, namespace = %s.device_namespace,
                "mapper reported a device this edge does not have; ignored");
            return None;
        };
        Some((id, dmi::twin_update_of(s)))
    }

    async fn register_mapper(
        &mut self,
        mapper: kubeedge_dmi::v1beta1::MapperInfo,
        with_data: bool,
    ) -> Result<kubeedge_dmi::v1beta1::MapperRegisterResponse, String> {
        let address = String::from_utf8_lossy(&mapper.address).into_owned();
        let info = json!({"name": mapper.name, "version": mapper.version,
            "api_version": mapper.api_version, "protocol": mapper.protocol,
            "address": address, "state": mapper.state});
        let key = format!("node/nodeID/namespace/{MAPPER_TYPE}/{}", mapper.name);
        self.store
            .upsert(crate::metamanager::MetaRecord::new(
                key,
                MAPPER_TYPE,
                info.to_string(),
            ))
            .await
            .map_err(|e| format!("cannot store the mapper: {e}"))?;
        self.mappers
            .insert(mapper.protocol.clone(), PathBuf::from(&address));
        tracing::info!(mapper = %mapper.name, protocol = %mapper.protocol, socket = %address, "mapper registered");
        let mut response = kubeedge_dmi::v1beta1::MapperRegisterResponse::default();
        if !with_data {
            return Ok(response);
        }
        let mut served = Vec::new();
        // One device at a time: only the answer is held, not every object parsed.
        let models = stored_objects(
            self.store
                .list_type(ResourceType::DeviceModel.as_str())
                .await
                .map_err(|e| format!("cannot read the device models: {e}"))?,
        );
        let mut records = self
            .store
            .list_type(ResourceType::Device.as_str())
            .await
            .map_err(|e| format!("cannot read the devices: {e}"))?;
        records.sort_by(|a, b| a.key.cmp(&b.key));
        for record in records {
            let Ok(dev) = serde_json::from_str::<Value>(&record.value) else {
                continue;
            };
            let key = match (
                dev.pointer("/metadata/namespace").and_then(Value::as_str),
                dev.pointer("/metadata/name").and_then(Value::as_str),
            ) {
                (Some(ns), Some(name)) => (ns.to_string(), name.to_string()),
                _ => continue,
            };
            if !self.objects.devices.contains_key(&key)
                || dev
                    .pointer("/spec/protocol/protocolName")
                    .and_then(Value::as_str)
                    != Some(mapper.protocol.as_str())
            {
                continue;
            }
            let model_name = dev
                .pointer("/spec/deviceModelRef/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let Some(model) = models.get(&(key.0.clone(), model_name.to_string())) else {
                tracing::info!(device = %key.1, model = model_name, "device's model not here yet; not given to the mapper");
                continue;
            };
            match (
                kubeedge_dmi::device_from_crd(&kubeedge_dmi::device_with_model_defaults(
                    &dev, model,
                )),
                kubeedge_dmi::model_from_crd(model),
            ) {
                (Ok(d), Ok(m)) => {
                    response.device_list.push(d);
                    response.model_list.push(m);
                    served.push(key);
                }
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(device = %key.1, error = %e, "device cannot be expressed in DMI; skipped")
                }
            }
        }
        for key in served {
            let message = "the device was handed to its mapper".to_string();
            self.set_condition(key, "True", "Registered", message).await;
        }
        Ok(response)
    }
}
