//! Entry points of the DMI fuzz targets (`e2e/fuzz`; see `kubeedge_shared::fuzz_targets`):
//! the protobuf messages edgecore and mappers send each other over the DMI sockets, with the
//! `configData` values they carry, and the Device/DeviceModel objects converted to them.

use crate::v1beta1 as pb;
use crate::{config_data_to_json, device_from_crd, device_with_model_defaults, model_from_crd};
use prost::Message as _;

fn device(d: &pb::Device) {
    let Some(spec) = &d.spec else { return };
    if let Some(c) = spec.protocol.as_ref().and_then(|p| p.config_data.as_ref()) {
        let _ = config_data_to_json(c);
    }
    for p in &spec.properties {
        if let Some(c) = p.visitors.as_ref().and_then(|v| v.config_data.as_ref()) {
            let _ = config_data_to_json(c);
        }
    }
}

/// A DMI request or response body (the first byte picks the message type), or a Device /
/// DeviceModel object as JSON (what the cloud sends) converted to DMI.
pub fn dmi_message(data: &[u8]) {
    let Some((&kind, bytes)) = data.split_first() else {
        return;
    };
    match kind % 7 {
        0 => {
            if let Ok(r) = pb::MapperRegisterRequest::decode(bytes) {
                let _ = r.mapper.map(|m| (m.name, m.protocol, m.address));
            }
        }
        1 => {
            if let Ok(r) = pb::MapperRegisterResponse::decode(bytes) {
                r.device_list.iter().for_each(device);
            }
        }
        2 => {
            if let Ok(r) = pb::ReportDeviceStatusRequest::decode(bytes) {
                let _ = r.reported_device.map(|d| d.twins.len());
            }
        }
        3 => {
            let _ = pb::ReportDeviceStatesRequest::decode(bytes);
        }
        4 => {
            if let Ok(r) = pb::RegisterDeviceRequest::decode(bytes) {
                r.device.iter().for_each(device);
            }
        }
        5 => {
            let _ = pb::CreateDeviceModelRequest::decode(bytes);
        }
        _ => {
            let Ok(object) = serde_json::from_slice::<serde_json::Value>(bytes) else {
                return;
            };
            let _ = model_from_crd(&object);
            let merged = device_with_model_defaults(&object, &object);
            if let Ok(d) = device_from_crd(&merged) {
                device(&d);
                let again = pb::Device::decode(d.encode_to_vec().as_slice()).expect("decodes");
                assert_eq!(again, d);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_shared::fuzz_targets::replay;

    #[test]
    fn dmi_message_corpus_replays() {
        replay("dmi_message", dmi_message);
    }
}
