//! A DMI `Device` (plus its model, when known) as Modbus TCP settings.
//!
//! Device `protocol.configData` (names as in KubeEdge's v1alpha2 Modbus TCP protocol and the
//! mappers-go Modbus mappers):
//!
//! | key | type | default |
//! |---|---|---|
//! | `ip` | string (IP address or host name) | required |
//! | `port` | number | 502 |
//! | `slaveID` | number 0–255 | 1 |
//!
//! Property `visitors.configData` (as mapper-framework's Modbus mapper):
//!
//! | key | type | default |
//! |---|---|---|
//! | `register` | `CoilRegister`, `DiscreteInputRegister`, `HoldingRegister`, `InputRegister` | required |
//! | `offset` | number 0–65535 | 0 |
//! | `limit` | number of registers or coils | 1 |
//! | `scale` | number: reported = raw × scale, written raw = desired ÷ scale | none |
//!
//! Numbers may also be given as numeric strings. `collectCycle`/`reportCycle` are nanoseconds
//! (0 ⇒ 1 s). A property with a bad visitor is skipped (the rest of the device still runs); a
//! device without a usable `ip`/`port`/`slaveID` does not run at all.

use std::fmt;
use std::time::Duration;

use kubeedge_dmi::v1beta1::{Device, DeviceModel};
use serde_json::{Map, Value};

use crate::modbus::{RegisterKind, Visitor};

const DEFAULT_PORT: u16 = 502;
const DEFAULT_SLAVE: u8 = 1;
const DEFAULT_CYCLE: Duration = Duration::from_secs(1);

/// A device's identity at the edge: `<namespace>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceKey {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl DeviceKey {
    pub fn of(device: &Device) -> Self {
        DeviceKey {
            namespace: device.namespace.clone(),
            name: device.name.clone(),
        }
    }
}

/// Where and how to reach one Modbus TCP device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub slave: u8,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{} slave {}", self.host, self.port, self.slave)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeviceConfig {
    pub key: DeviceKey,
    pub endpoint: Endpoint,
    pub properties: Vec<PropertyConfig>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PropertyConfig {
    pub name: String,
    pub visitor: Visitor,
    pub collect_cycle: Duration,
    pub report_cycle: Duration,
    pub report_to_cloud: bool,
    /// `desired.value`, when non-empty.
    pub desired: Option<String>,
    /// The register can be written and the model does not mark the property `ReadOnly`.
    pub writable: bool,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("the device has no spec.protocol.configData")]
    NoProtocolConfig,
    #[error("{0}: required")]
    Missing(&'static str),
    #[error("{key}: expected {expected}")]
    Invalid {
        key: &'static str,
        expected: &'static str,
    },
    #[error("configData value {key}: {reason}")]
    Undecodable { key: String, reason: String },
}

/// One property that cannot be polled, and why.
#[derive(Debug, PartialEq)]
pub struct SkippedProperty {
    pub name: String,
    pub error: ConfigError,
}

/// The device's Modbus settings, and the properties skipped for bad visitors.
pub fn device_config(
    device: &Device,
    model: Option<&DeviceModel>,
) -> Result<(DeviceConfig, Vec<SkippedProperty>), ConfigError> {
    let spec = device.spec.clone().unwrap_or_default();
    let protocol = spec
        .protocol
        .and_then(|p| p.config_data)
        .ok_or(ConfigError::NoProtocolConfig)?;
    let data = decode(&protocol)?;
    let endpoint = endpoint(&data)?;

    let mut properties = Vec::new();
    let mut skipped = Vec::new();
    for p in spec.properties {
        match visitor(&p) {
            Ok(visitor) => {
                let read_only = model
                    .and_then(|m| m.spec.as_ref())
                    .and_then(|s| s.properties.iter().find(|mp| mp.name == p.name))
                    .is_some_and(|mp| mp.access_mode == "ReadOnly");
                properties.push(PropertyConfig {
                    writable: visitor.kind.is_writable() && !read_only,
                    visitor,
                    collect_cycle: cycle(p.collect_cycle),
                    report_cycle: cycle(p.report_cycle),
                    report_to_cloud: p.report_to_cloud,
                    desired: p.desired.map(|d| d.value).filter(|v| !v.is_empty()),
                    name: p.name,
                });
            }
            Err(error) => skipped.push(SkippedProperty {
                name: p.name,
                error,
            }),
        }
    }
    Ok((
        DeviceConfig {
            key: DeviceKey::of(device),
            endpoint,
            properties,
        },
        skipped,
    ))
}

fn cycle(nanos: i64) -> Duration {
    match u64::try_from(nanos) {
        Ok(n) if n > 0 => Duration::from_nanos(n),
        _ => DEFAULT_CYCLE,
    }
}

fn endpoint(data: &Map<String, Value>) -> Result<Endpoint, ConfigError> {
    let host = match data.get("ip") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
        Some(Value::String(_)) | None => return Err(ConfigError::Missing("ip")),
        Some(_) => {
            return Err(ConfigError::Invalid {
                key: "ip",
                expected: "a string",
            });
        }
    };
    Ok(Endpoint {
        host,
        port: integer(data, "port", "a port number 1-65535")?
            .map_or(Ok(DEFAULT_PORT), |n| {
                u16::try_from(n).ok().filter(|p| *p != 0).ok_or(())
            })
            .map_err(|()| ConfigError::Invalid {
                key: "port",
                expected: "a port number 1-65535",
            })?,
        slave: integer(data, "slaveID", "a slave id 0-255")?
            .map_or(Ok(DEFAULT_SLAVE), u8::try_from)
            .map_err(|_| ConfigError::Invalid {
                key: "slaveID",
                expected: "a slave id 0-255",
            })?,
    })
}

fn visitor(p: &kubeedge_dmi::v1beta1::DeviceProperty) -> Result<Visitor, ConfigError> {
    let data = match p.visitors.as_ref().and_then(|v| v.config_data.as_ref()) {
        Some(c) => decode(c)?,
        None => return Err(ConfigError::Missing("register")),
    };
    let kind = match data.get("register") {
        Some(Value::String(s)) => s
            .parse::<RegisterKind>()
            .map_err(|()| ConfigError::Invalid {
                key: "register",
                expected: "CoilRegister, DiscreteInputRegister, HoldingRegister or InputRegister",
            })?,
        Some(_) => {
            return Err(ConfigError::Invalid {
                key: "register",
                expected: "a string",
            });
        }
        None => return Err(ConfigError::Missing("register")),
    };
    let offset = integer(&data, "offset", "an address 0-65535")?
        .map_or(Ok(0), u16::try_from)
        .map_err(|_| ConfigError::Invalid {
            key: "offset",
            expected: "an address 0-65535",
        })?;
    let max = kind.max_limit();
    let limit = integer(&data, "limit", "a count")?
        .map_or(Ok(1), |n| {
            u16::try_from(n)
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or(())
        })
        .map_err(|()| ConfigError::Invalid {
            key: "limit",
            expected: if kind.is_bits() {
                "a count 1-2000"
            } else {
                "a count 1-125"
            },
        })?;
    let scale = match data.get("scale") {
        None => None,
        Some(v) => match number(v) {
            Some(s) if s.is_finite() && s != 0.0 => Some(s),
            _ => {
                return Err(ConfigError::Invalid {
                    key: "scale",
                    expected: "a non-zero number",
                });
            }
        },
    };
    Ok(Visitor {
        kind,
        offset,
        limit,
        scale,
    })
}

fn decode(
    data: &kubeedge_dmi::v1beta1::CustomizedValue,
) -> Result<Map<String, Value>, ConfigError> {
    kubeedge_dmi::config_data_to_json(data).map_err(|(key, e)| ConfigError::Undecodable {
        key,
        reason: e.to_string(),
    })
}

/// A whole number, from a JSON number or a numeric string (edgecore sends float32 numbers).
fn integer(
    data: &Map<String, Value>,
    key: &'static str,
    expected: &'static str,
) -> Result<Option<i64>, ConfigError> {
    let Some(value) = data.get(key) else {
        return Ok(None);
    };
    match number(value) {
        Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(Some(f as i64)),
        _ => Err(ConfigError::Invalid { key, expected }),
    }
}

fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_dmi::device_from_crd;
    use serde_json::json;

    fn device(protocol: Value, visitor: Value) -> Device {
        device_from_crd(&json!({
            "metadata": {"name": "plc", "namespace": "factory"},
            "spec": {
                "deviceModelRef": {"name": "plc-model"},
                "protocol": {"protocolName": "modbus", "configData": protocol},
                "properties": [{
                    "name": "speed",
                    "desired": {"value": "42"},
                    "collectCycle": 250_000_000,
                    "reportToCloud": true,
                    "visitors": {"protocolName": "modbus", "configData": visitor}
                }]
            }
        }))
        .unwrap()
    }

    #[test]
    fn tcp_settings_and_visitor_come_from_config_data() {
        let d = device(
            json!({"ip": "192.0.2.7", "port": 1502, "slaveID": 3}),
            json!({"register": "HoldingRegister", "offset": 10, "limit": 2, "scale": 0.1}),
        );
        let (config, skipped) = device_config(&d, None).unwrap();
        assert!(skipped.is_empty());
        assert_eq!(config.key.to_string(), "factory/plc");
        assert_eq!(
            config.endpoint,
            Endpoint {
                host: "192.0.2.7".into(),
                port: 1502,
                slave: 3
            }
        );
        let p = &config.properties[0];
        assert_eq!(
            p.visitor,
            Visitor {
                kind: RegisterKind::Holding,
                offset: 10,
                limit: 2,
                scale: Some(f64::from(0.1f32))
            }
        );
        assert_eq!(p.collect_cycle, Duration::from_millis(250));
        assert_eq!(p.report_cycle, Duration::from_secs(1), "0 means 1 s");
        assert!(p.report_to_cloud && p.writable);
        assert_eq!(p.desired.as_deref(), Some("42"));
    }

    #[test]
    fn defaults_apply_and_numeric_strings_are_accepted() {
        let d = device(
            json!({"ip": "plc.local"}),
            json!({"register": "InputRegister", "offset": "4"}),
        );
        let (config, _) = device_config(&d, None).unwrap();
        assert_eq!((config.endpoint.port, config.endpoint.slave), (502, 1));
        let p = &config.properties[0];
        assert_eq!(
            (p.visitor.offset, p.visitor.limit, p.visitor.scale),
            (4, 1, None)
        );
        assert!(!p.writable, "input registers are read-only");
    }

    #[test]
    fn a_model_marking_the_property_read_only_disables_writes() {
        let d = device(
            json!({"ip": "10.0.0.1"}),
            json!({"register": "CoilRegister"}),
        );
        let model = kubeedge_dmi::model_from_crd(&json!({
            "metadata": {"name": "plc-model", "namespace": "factory"},
            "spec": {"properties": [{"name": "speed", "accessMode": "ReadOnly"}]}
        }))
        .unwrap();
        let (config, _) = device_config(&d, Some(&model)).unwrap();
        assert!(!config.properties[0].writable);
    }

    #[test]
    fn a_device_without_ip_or_with_bad_numbers_does_not_run() {
        let visitor = json!({"register": "HoldingRegister"});
        assert_eq!(
            device_config(&device(json!({"port": 502}), visitor.clone()), None).unwrap_err(),
            ConfigError::Missing("ip")
        );
        assert!(matches!(
            device_config(
                &device(json!({"ip": "h", "port": 70000}), visitor.clone()),
                None
            ),
            Err(ConfigError::Invalid { key: "port", .. })
        ));
        assert!(matches!(
            device_config(
                &device(json!({"ip": "h", "slaveID": 1.5}), visitor.clone()),
                None
            ),
            Err(ConfigError::Invalid { key: "slaveID", .. })
        ));
        let no_protocol = Device {
            name: "x".into(),
            ..Default::default()
        };
        assert_eq!(
            device_config(&no_protocol, None).unwrap_err(),
            ConfigError::NoProtocolConfig
        );
    }

    #[test]
    fn bad_visitors_skip_only_their_property() {
        for (visitor, key) in [
            (json!({"register": "MagicRegister"}), "register"),
            (json!({"register": "HoldingRegister", "limit": 0}), "limit"),
            (
                json!({"register": "HoldingRegister", "limit": 126}),
                "limit",
            ),
            (
                json!({"register": "HoldingRegister", "offset": -1}),
                "offset",
            ),
            (json!({"register": "HoldingRegister", "scale": 0}), "scale"),
        ] {
            let (config, skipped) =
                device_config(&device(json!({"ip": "h"}), visitor.clone()), None).unwrap();
            assert!(config.properties.is_empty(), "{visitor}");
            assert_eq!(skipped.len(), 1);
            assert!(
                matches!(skipped[0].error, ConfigError::Invalid { key: k, .. } if k == key),
                "{visitor}: {:?}",
                skipped[0].error
            );
        }
        let (_, skipped) = device_config(&device(json!({"ip": "h"}), json!({})), None).unwrap();
        assert_eq!(skipped[0].error, ConfigError::Missing("register"));
    }
}
