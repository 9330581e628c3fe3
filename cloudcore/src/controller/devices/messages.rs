//! The downstream messages of device management, in KubeEdge's shapes (devices reference
//! §2.3): a membership change (NO-ACK, group `twin`), and the model and the device objects
//! (group `resource`, ACKed, `resourceversion` = the object's).

use kubeedge_shared::devices::{MemberDevice, MembershipUpdate};
use kubeedge_shared::message::{new_message_id, now_millis};
use kubeedge_shared::operation::source;
use kubeedge_shared::{Group, Message, Operation};
use serde_json::Value;

/// The device's ID at the edge: its name, as KubeEdge v1.15 uses it (membership, MQTT topics,
/// the edge's device table).
pub fn device_id(name: &str) -> String {
    name.to_string()
}

/// How an edge names devices: `<name>` (KubeEdge v1.15, and this project's edges, which take
/// either) or `<namespace>/<name>` (KubeEdge v1.16+: its cloud sends such IDs and v1.17+ edges
/// parse them in reports and MQTT topics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdForm {
    #[default]
    Name,
    Namespaced,
}

impl IdForm {
    /// From a Node's `status.nodeInfo.kubeletVersion`: KubeEdge's edged reports
    /// `<kubernetes version>-kubeedge-v<major>.<minor>.<patch>`.
    pub fn of_kubelet_version(v: &str) -> IdForm {
        let Some(rest) = v.split("-kubeedge-v").nth(1) else {
            return IdForm::Name;
        };
        let mut parts = rest.split(['.', '-']);
        let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if (major, minor) >= (1, 16) {
            IdForm::Namespaced
        } else {
            IdForm::Name
        }
    }

    pub fn id(self, object: &Value) -> String {
        let s = |p: &str| {
            object
                .pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
        };
        match self {
            IdForm::Name => device_id(s("/metadata/name")),
            IdForm::Namespaced => {
                let ns = Some(s("/metadata/namespace"))
                    .filter(|n| !n.is_empty())
                    .unwrap_or("default");
                format!("{ns}/{}", s("/metadata/name"))
            }
        }
    }
}

/// A membership message adding (or removing) one device, its ID in the edge's form.
pub fn membership(object: &Value, added: bool, form: IdForm) -> Message {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let entry = MemberDevice {
        id: form.id(object),
        name: name.to_string(),
        description: object
            .pointer("/metadata/labels/description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        ..MemberDevice::default()
    };
    let (added_devices, removed_devices) = if added {
        (Some(vec![entry]), None)
    } else {
        (None, Some(vec![entry]))
    };
    let content = MembershipUpdate {
        event_id: new_message_id(),
        timestamp: now_millis(),
        added_devices,
        removed_devices,
    };
    Message::new(
        source::DEVICE_CONTROLLER,
        Group::Twin,
        Operation::Update,
        "membership",
        serde_json::to_value(content).unwrap_or_default(),
    )
}

/// A model or device object message: resource `<ns>/<type>/<name>`, content the object with
/// `apiVersion` and `kind` set.
pub fn object(op: Operation, type_token: &str, kind: &str, object: &Value) -> Message {
    let ns = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let rv = object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mut content = object.clone();
    if let Some(o) = content.as_object_mut() {
        o.insert(
            "apiVersion".into(),
            kubeedge_shared::devices::API_VERSION.into(),
        );
        o.insert("kind".into(), kind.into());
        if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
    }
    Message::new(
        source::DEVICE_CONTROLLER,
        Group::Resource,
        op,
        format!("{ns}/{type_token}/{name}"),
        content,
    )
    .with_resource_version(rv)
}

/// The reply that ends the edge's resending of a report (`response`, content `"OK"`).
pub fn report_ok(report: &Message) -> Message {
    let mut m = Message::new(
        source::DEVICE_CONTROLLER,
        Group::Twin,
        Operation::Response,
        "twin",
        Value::String("OK".into()),
    );
    m.header.parent_id = report.header.id.clone();
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn membership_and_objects_have_kubeedges_shape() {
        let dev = json!({"metadata": {"name": "thermo-1", "namespace": "default",
            "resourceVersion": "17", "labels": {"description": "kitchen"},
            "managedFields": [{}]}, "spec": {"nodeName": "edge-1"}});
        let m = membership(&dev, true, IdForm::Name);
        assert_eq!(m.route.resource, "membership");
        assert_eq!(m.route.group, Group::Twin);
        assert!(!m.requires_ack());
        assert_eq!(
            m.content["added_devices"],
            json!([{"id": "thermo-1", "name": "thermo-1", "description": "kitchen"}])
        );
        assert_eq!(m.content["removed_devices"], Value::Null);

        let d = object(Operation::Insert, "device", "Device", &dev);
        assert_eq!(d.route.resource, "default/device/thermo-1");
        assert_eq!(d.header.resource_version, "17");
        assert_eq!(d.content["apiVersion"], "devices.kubeedge.io/v1beta1");
        assert_eq!(d.content["kind"], "Device");
        assert!(d.content["metadata"].get("managedFields").is_none());
        assert!(d.requires_ack());

        let report = Message::new("twin", Group::Resource, Operation::Update, "x", Value::Null);
        let ok = report_ok(&report);
        assert_eq!(ok.header.parent_id, report.header.id);
        assert!(!ok.requires_ack());
    }
}
