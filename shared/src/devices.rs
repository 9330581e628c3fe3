//! The JSON that device management carries between cloud, edge and MQTT clients (devices
//! reference §2.3, §3.3): membership updates, twin updates and results, device state. Keys
//! are KubeEdge's exactly; absent optional keys are omitted as Go's `omitempty` does.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// `devices.kubeedge.io`, the API group of Device and DeviceModel.
pub const GROUP: &str = "devices.kubeedge.io";
/// The version cloudcore watches and edges receive.
pub const VERSION: &str = "v1beta1";
/// `apiVersion` of both kinds.
pub const API_VERSION: &str = "devices.kubeedge.io/v1beta1";

/// A twin name must match this (KubeEdge's `^[a-zA-Z0-9-_.,:/@#]{1,128}$`).
pub fn valid_twin_name(s: &str) -> bool {
    (1..=128).contains(&s.len()) && s.bytes().all(allowed_byte)
}

/// A non-empty twin value must match this (`^[a-zA-Z0-9-_.,:/@#]{1,512}$`).
pub fn valid_twin_value(s: &str) -> bool {
    (1..=512).contains(&s.len()) && s.bytes().all(allowed_byte)
}

fn allowed_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-_.,:/@#".contains(&b)
}

/// `BaseMessage` plus the two lists of a membership change; the unused list is `null`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MembershipUpdate {
    #[serde(default)]
    pub event_id: String,
    #[serde(default)]
    pub timestamp: i64,
    #[serde(default)]
    pub added_devices: Option<Vec<MemberDevice>>,
    #[serde(default)]
    pub removed_devices: Option<Vec<MemberDevice>>,
}

/// A device as membership messages and MQTT results list it (`dttype.Device`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemberDevice {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_online: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<BTreeMap<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub twin: Option<BTreeMap<String, Option<MsgTwin>>>,
}

/// One twin in a twin message (`MsgTwin`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MsgTwin {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<TwinValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual: Option<TwinValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TypeMetadata>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_version: Option<TwinVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual_version: Option<TwinVersion>,
}

/// `{"type": …}` of a twin.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TypeMetadata {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// An expected or actual value, with the edge time it was stored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TwinValue {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ValueMetadata>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ValueMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
}

/// `{"cloud": n, "edge": n}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TwinVersion {
    #[serde(default)]
    pub cloud: i64,
    #[serde(default)]
    pub edge: i64,
}

/// `DeviceTwinUpdate` / `DeviceTwinResult`: twins by name; `null` deletes (or was deleted).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceTwinUpdate {
    #[serde(default)]
    pub event_id: String,
    #[serde(default)]
    pub timestamp: i64,
    #[serde(default)]
    pub twin: Option<BTreeMap<String, Option<MsgTwin>>>,
}

/// The error result published on MQTT (`Result`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorResult {
    #[serde(default)]
    pub event_id: String,
    #[serde(default)]
    pub timestamp: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub code: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// `DeviceMsg`: a device's state as the edge reports it upstream and on MQTT. v1.18+ names
/// the time `lastOnlineTime`; v1.15 `last_online` is accepted too.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceStateMsg {
    #[serde(default)]
    pub event_id: String,
    #[serde(default)]
    pub timestamp: i64,
    #[serde(default, alias = "Device")]
    pub device: DeviceState,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceState {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state: String,
    #[serde(
        rename = "lastOnlineTime",
        alias = "last_online",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub last_online_time: String,
}

/// A condition of a Device (kubeedge-rs; KubeEdge has none): whether the edge could hand the
/// device to a mapper. Sent by the edge as `device/<id>/condition/update`, kept by the cloud in
/// `status.conditions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCondition {
    #[serde(rename = "type", default)]
    pub kind: String,
    /// `True` or `False`.
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(
        rename = "lastTransitionTime",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub last_transition_time: String,
}

/// The condition type the edge reports: a mapper serves the device.
pub const MAPPER_READY: &str = "MapperReady";

/// Content that may be a JSON object or a JSON string holding one (KubeEdge sends both).
pub fn decode_content<T: serde::de::DeserializeOwned>(content: &Value) -> Result<T, String> {
    match content {
        Value::String(s) => serde_json::from_str(s).map_err(|e| e.to_string()),
        other => T::deserialize(other).map_err(|e| e.to_string()),
    }
}

/// What an edge reports about one of its devices (an upstream `twin` message), read once.
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceReport {
    /// `device/<id>/twin/edge_updated`: twin values.
    Twin(DeviceTwinUpdate),
    /// `device/<id>/state/update`: online/offline.
    State(DeviceStateMsg),
    /// `device/<id>/condition/update`: a condition from the mapper (kubeedge-rs).
    Condition(DeviceCondition),
}

/// The kinds of [`DeviceReport`], by the resource suffix that names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportKind {
    Twin,
    State,
    Condition,
}

impl ReportKind {
    pub const ALL: [ReportKind; 3] = [ReportKind::Twin, ReportKind::State, ReportKind::Condition];

    /// `twin/edge_updated`, `state/update`, `condition/update`.
    pub fn suffix(self) -> &'static str {
        match self {
            ReportKind::Twin => "twin/edge_updated",
            ReportKind::State => "state/update",
            ReportKind::Condition => "condition/update",
        }
    }
}

impl DeviceReport {
    pub fn kind(&self) -> ReportKind {
        match self {
            DeviceReport::Twin(_) => ReportKind::Twin,
            DeviceReport::State(_) => ReportKind::State,
            DeviceReport::Condition(_) => ReportKind::Condition,
        }
    }

    /// The resource of this report about device `id` (`<name>` or `<namespace>/<name>`).
    pub fn resource(&self, id: &str) -> String {
        format!("device/{id}/{}", self.kind().suffix())
    }

    /// The message content (serialised once, here).
    pub fn content(&self) -> Value {
        let v = match self {
            DeviceReport::Twin(u) => serde_json::to_value(u),
            DeviceReport::State(s) => serde_json::to_value(s),
            DeviceReport::Condition(c) => serde_json::to_value(c),
        };
        v.unwrap_or(Value::Null)
    }

    /// The upstream message carrying this report about device `id`: source `twin`, group
    /// `resource`, operation `update`; a state report's content is its JSON text (as KubeEdge's
    /// edge sends it), the others' an object.
    pub fn to_message(&self, id: &str) -> crate::Message {
        let content = match self {
            DeviceReport::State(s) => Value::String(serde_json::to_string(s).unwrap_or_default()),
            _ => self.content(),
        };
        crate::Message::new(
            crate::operation::source::TWIN,
            crate::Group::Resource,
            crate::Operation::Update,
            self.resource(id),
            content,
        )
    }

    /// Decodes the content of a report of `kind` (an object, or its JSON text).
    pub fn decode(kind: ReportKind, content: &Value) -> Result<DeviceReport, String> {
        Ok(match kind {
            ReportKind::Twin => DeviceReport::Twin(decode_content(content)?),
            ReportKind::State => DeviceReport::State(decode_content(content)?),
            ReportKind::Condition => DeviceReport::Condition(decode_content(content)?),
        })
    }
}

/// An upstream `twin` message, classified once by the cloud.
#[derive(Debug, Clone, PartialEq)]
pub enum TwinUpstream<'a> {
    /// `…membership/detail`: the edge asks for its device list.
    MembershipDetail,
    /// A report about device `device` (ID tokens: `[name]` or `[namespace, name]`).
    Report {
        device: Vec<&'a str>,
        report: DeviceReport,
    },
    /// A resource no device controller handles.
    Unknown,
}

impl<'a> TwinUpstream<'a> {
    /// Classifies `resource` and decodes `content`; `Err` for a known report that does not
    /// decode.
    pub fn classify(resource: &'a str, content: &Value) -> Result<TwinUpstream<'a>, String> {
        if resource.contains("membership/detail") {
            return Ok(TwinUpstream::MembershipDetail);
        }
        let Some((device, kind)) = split_device_resource(resource) else {
            return Ok(TwinUpstream::Unknown);
        };
        Ok(TwinUpstream::Report {
            device,
            report: DeviceReport::decode(kind, content)?,
        })
    }
}

/// The device ID a cloud resource names, upstream: `device/<id>/<rest…>` where `<id>` is
/// `<name>` (v1.15 edges) or `<namespace>/<name>` (v1.17+). Returns the ID tokens and the
/// report's kind.
pub fn split_device_resource(resource: &str) -> Option<(Vec<&str>, ReportKind)> {
    let rest = resource.strip_prefix("device/")?;
    for kind in ReportKind::ALL {
        if let Some(id) = rest
            .strip_suffix(kind.suffix())
            .and_then(|r| r.strip_suffix('/'))
        {
            let tokens: Vec<&str> = id.split('/').collect();
            if tokens.is_empty() || tokens.len() > 2 || tokens.iter().any(|t| t.is_empty()) {
                return None;
            }
            return Some((tokens, kind));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn membership_update_writes_null_for_the_unused_list() {
        let m = MembershipUpdate {
            event_id: "e".into(),
            timestamp: 5,
            added_devices: Some(vec![MemberDevice {
                id: "thermo-1".into(),
                name: "thermo-1".into(),
                description: "kitchen".into(),
                ..Default::default()
            }]),
            removed_devices: None,
        };
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"event_id":"e","timestamp":5,
                   "added_devices":[{"id":"thermo-1","name":"thermo-1","description":"kitchen"}],
                   "removed_devices":null})
        );
    }

    #[test]
    fn twin_updates_parse_from_object_or_string() {
        let text = r#"{"event_id":"","timestamp":1,"twin":{"temperature":{"expected":{"value":"20"},"actual":{"value":"23","metadata":{"timestamp":9}},"metadata":{"type":"string"},"actual_version":{"cloud":0,"edge":3}},"gone":null}}"#;
        let a: DeviceTwinUpdate = decode_content(&Value::String(text.into())).unwrap();
        let b: DeviceTwinUpdate =
            decode_content(&serde_json::from_str::<Value>(text).unwrap()).unwrap();
        assert_eq!(a, b);
        let twins = a.twin.unwrap();
        let t = twins["temperature"].as_ref().unwrap();
        assert_eq!(t.actual.as_ref().unwrap().value.as_deref(), Some("23"));
        assert_eq!(t.actual_version, Some(TwinVersion { cloud: 0, edge: 3 }));
        assert!(twins["gone"].is_none());
        assert!(decode_content::<DeviceTwinUpdate>(&json!("not json")).is_err());
    }

    #[test]
    fn state_messages_accept_both_time_keys() {
        let old: DeviceStateMsg =
            decode_content(&json!({"device":{"name":"d","state":"online","last_online":"t"}}))
                .unwrap();
        assert_eq!(old.device.last_online_time, "t");
        let v = serde_json::to_value(&old).unwrap();
        assert_eq!(v["device"]["lastOnlineTime"], "t");
    }

    #[test]
    fn device_resources_name_the_device_in_either_form() {
        assert_eq!(
            split_device_resource("device/thermo-1/twin/edge_updated"),
            Some((vec!["thermo-1"], ReportKind::Twin))
        );
        assert_eq!(
            split_device_resource("device/default/thermo-1/state/update"),
            Some((vec!["default", "thermo-1"], ReportKind::State))
        );
        assert_eq!(
            split_device_resource("device/d/condition/update"),
            Some((vec!["d"], ReportKind::Condition))
        );
        for bad in [
            "device//twin/edge_updated",
            "device/a/b/c/twin/edge_updated",
            "membership/detail",
            "device/x/twin/other",
            "device/xtwin/edge_updated",
        ] {
            assert_eq!(split_device_resource(bad), None, "{bad}");
        }
    }

    #[test]
    fn upstream_twin_messages_are_classified_once_and_reports_round_trip() {
        let update = DeviceTwinUpdate {
            event_id: "e".into(),
            timestamp: 7,
            twin: Some(BTreeMap::from([(
                "temperature".to_string(),
                Some(MsgTwin {
                    actual: Some(TwinValue {
                        value: Some("23".into()),
                        metadata: None,
                    }),
                    ..Default::default()
                }),
            )])),
        };
        let report = DeviceReport::Twin(update);
        let resource = report.resource("default/thermo-1");
        assert_eq!(resource, "device/default/thermo-1/twin/edge_updated");
        assert_eq!(
            report.content(),
            json!({"event_id": "e", "timestamp": 7, "twin": {"temperature": {"actual": {"value": "23"}}}})
        );
        match TwinUpstream::classify(&resource, &report.content()).unwrap() {
            TwinUpstream::Report {
                device,
                report: back,
            } => {
                assert_eq!(device, ["default", "thermo-1"]);
                assert_eq!(back, report);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            TwinUpstream::classify("node/n/membership/detail", &Value::Null).unwrap(),
            TwinUpstream::MembershipDetail
        );
        assert_eq!(
            TwinUpstream::classify("device/d/twin/cloud_updated", &Value::Null).unwrap(),
            TwinUpstream::Unknown
        );
        assert!(TwinUpstream::classify("device/d/state/update", &json!("not json")).is_err());
    }

    #[test]
    fn twin_names_and_values_follow_kubeedges_patterns() {
        assert!(valid_twin_name("temperature"));
        assert!(valid_twin_value("23.5"));
        assert!(!valid_twin_value("has space"));
        assert!(!valid_twin_name(""));
        assert!(!valid_twin_value(&"x".repeat(513)));
    }
}
