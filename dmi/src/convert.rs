//! v1beta1 Device / DeviceModel objects (as the apiserver serves them, JSON) to the DMI messages
//! edgecore sends to mappers (reference §5.4).
//!
//! edgecore converts by a JSON round trip into the generated Go structs, so keys match
//! case-insensitively (`hostName` → `hostname`, `TDEngine` → `tdengine`), `null` is the zero
//! value, unknown keys are ignored, and a value of the wrong JSON type fails the whole object.
//! Not converted (not in DMI): the model's `protocol`, `protocolConfigData` and property
//! `visitors`, the device's `nodeName`.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::any::{AnyError, any_from_json, json_from_any};
use crate::v1beta1 as dmi;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConvertError {
    #[error("{path}: missing")]
    Missing { path: String },
    #[error("{path}: expected {expected}")]
    WrongType {
        path: String,
        expected: &'static str,
    },
    #[error("{path}: {source}")]
    ConfigValue {
        path: String,
        #[source]
        source: AnyError,
    },
}

/// The DMI `Device` edgecore sends for a v1beta1 Device object.
pub fn device_from_crd(object: &Value) -> Result<dmi::Device, ConvertError> {
    let root = Obj::root(object, "device")?;
    let (name, namespace) = root.name_and_namespace()?;
    let spec = root.obj("spec")?;
    let status = root.obj("status")?;
    Ok(dmi::Device {
        name,
        namespace,
        spec: Some(match &spec {
            Some(spec) => device_spec(spec)?,
            None => dmi::DeviceSpec {
                protocol: Some(dmi::ProtocolConfig::default()),
                ..Default::default()
            },
        }),
        status: Some(device_status(spec.as_ref(), status.as_ref())?),
    })
}

/// The DMI `DeviceModel` edgecore sends for a v1beta1 DeviceModel object.
pub fn model_from_crd(object: &Value) -> Result<dmi::DeviceModel, ConvertError> {
    let root = Obj::root(object, "deviceModel")?;
    let (name, namespace) = root.name_and_namespace()?;
    let mut properties = Vec::new();
    if let Some(spec) = root.obj("spec")? {
        for p in spec.objects("properties")? {
            properties.push(dmi::ModelProperty {
                name: p.str("name")?,
                description: p.str("description")?,
                r#type: p.str("type")?,
                access_mode: p.str("accessMode")?,
                minimum: p.str("minimum")?,
                maximum: p.str("maximum")?,
                unit: p.str("unit")?,
            });
        }
    }
    Ok(dmi::DeviceModel {
        name,
        namespace,
        spec: Some(dmi::DeviceModelSpec {
            properties,
            commands: Vec::new(),
        }),
    })
}

/// KubeEdge v1.23's model defaults (edgecore's `dmicache`), applied to a Device object before
/// [`device_from_crd`]:
/// - `spec.protocol.configData` = the model's `spec.protocolConfigData` overlaid key by key by
///   the device's own `configData`;
/// - each device property whose same-named model property has `visitors` gets the model's
///   visitor, with the device's own `visitors.configData` keys on top.
///
/// v1.15–v1.22 edgecore sends devices unmerged: skip this to behave like them.
pub fn device_with_model_defaults(device: &Value, model: &Value) -> Value {
    let mut device = device.clone();
    let model_spec = &model["spec"];
    let Some(spec) = device.get_mut("spec").and_then(Value::as_object_mut) else {
        return device;
    };

    if let Some(defaults) = model_spec
        .get("protocolConfigData")
        .and_then(Value::as_object)
    {
        let protocol = spec
            .entry("protocol")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(protocol) = protocol.as_object_mut() {
            let own = protocol
                .get("configData")
                .and_then(Value::as_object)
                .cloned();
            protocol.insert(
                "configData".into(),
                Value::Object(overlay(defaults, own.as_ref())),
            );
        }
    }

    let model_visitors: HashMap<&str, &Value> = model_spec
        .get("properties")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some((
                p.get("name")?.as_str()?,
                p.get("visitors").filter(|v| !v.is_null())?,
            ))
        })
        .collect();
    if let Some(properties) = spec.get_mut("properties").and_then(Value::as_array_mut) {
        for property in properties.iter_mut().filter_map(Value::as_object_mut) {
            let Some(name) = property.get("name").and_then(Value::as_str) else {
                continue;
            };
            let Some(model_visitor) = model_visitors.get(name) else {
                continue;
            };
            let own = property
                .get("visitors")
                .and_then(|v| v.get("configData"))
                .and_then(Value::as_object)
                .cloned();
            let mut visitor = (*model_visitor).clone();
            if let Some(visitor) = visitor.as_object_mut() {
                let merged = match visitor.get("configData").and_then(Value::as_object) {
                    Some(defaults) => Some(overlay(defaults, own.as_ref())),
                    None => own,
                };
                if let Some(merged) = merged {
                    visitor.insert("configData".into(), Value::Object(merged));
                }
            }
            property.insert("visitors".into(), visitor);
        }
    }
    device
}

fn overlay(defaults: &Map<String, Value>, own: Option<&Map<String, Value>>) -> Map<String, Value> {
    let mut merged = defaults.clone();
    if let Some(own) = own {
        merged.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    merged
}

/// A `configData` object as a `CustomizedValue` (every value through [`any_from_json`]).
pub fn config_data_from_json(
    data: &Map<String, Value>,
) -> Result<dmi::CustomizedValue, (String, AnyError)> {
    let mut out = HashMap::with_capacity(data.len());
    for (key, value) in data {
        let any = any_from_json(value).map_err(|e| (key.clone(), e))?;
        out.insert(key.clone(), any);
    }
    Ok(dmi::CustomizedValue { data: out })
}

/// A `CustomizedValue` back as a JSON object (every value through [`json_from_any`]).
pub fn config_data_to_json(
    data: &dmi::CustomizedValue,
) -> Result<Map<String, Value>, (String, AnyError)> {
    data.data
        .iter()
        .map(|(key, any)| {
            Ok((
                key.clone(),
                json_from_any(any).map_err(|e| (key.clone(), e))?,
            ))
        })
        .collect()
}

fn device_spec(spec: &Obj<'_>) -> Result<dmi::DeviceSpec, ConvertError> {
    let device_model_reference = match spec.obj("deviceModelRef")? {
        Some(r) => r.str("name")?,
        None => String::new(),
    };
    let protocol = match spec.obj("protocol")? {
        Some(p) => dmi::ProtocolConfig {
            protocol_name: p.str("protocolName")?,
            config_data: p.config_data("configData")?,
        },
        None => dmi::ProtocolConfig::default(),
    };
    let mut properties = Vec::new();
    for p in spec.objects("properties")? {
        properties.push(device_property(&p)?);
    }
    let mut methods = Vec::new();
    for m in spec.objects("methods")? {
        methods.push(dmi::DeviceMethod {
            name: m.str("name")?,
            description: m.str("description")?,
            property_names: m.strings("propertyNames")?,
        });
    }
    Ok(dmi::DeviceSpec {
        device_model_reference,
        protocol: Some(protocol),
        properties,
        methods,
    })
}

fn device_property(p: &Obj<'_>) -> Result<dmi::DeviceProperty, ConvertError> {
    let visitors = match p.obj("visitors")? {
        Some(v) => dmi::VisitorConfig {
            protocol_name: v.str("protocolName")?,
            config_data: v.config_data("configData")?,
        },
        None => dmi::VisitorConfig::default(),
    };
    Ok(dmi::DeviceProperty {
        name: p.str("name")?,
        desired: Some(p.twin_property("desired")?),
        visitors: Some(visitors),
        report_cycle: p.i64("reportCycle")?,
        collect_cycle: p.i64("collectCycle")?,
        report_to_cloud: p.bool("reportToCloud")?,
        push_method: p.obj("pushMethod")?.map(|m| push_method(&m)).transpose()?,
    })
}

fn push_method(m: &Obj<'_>) -> Result<dmi::PushMethod, ConvertError> {
    let http = m
        .obj("http")?
        .map(|h| {
            Ok(dmi::PushMethodHttp {
                hostname: h.str("hostName")?,
                port: h.i64("port")?,
                requestpath: h.str("requestPath")?,
                timeout: h.i64("timeout")?,
            })
        })
        .transpose()?;
    let mqtt = m
        .obj("mqtt")?
        .map(|q| {
            Ok(dmi::PushMethodMqtt {
                address: q.str("address")?,
                topic: q.str("topic")?,
                qos: q.i32("qos")?,
                retained: q.bool("retained")?,
            })
        })
        .transpose()?;
    let otel = m
        .obj("otel")?
        .map(|o| {
            Ok(dmi::PushMethodOtel {
                endpoint_url: o.str("endpointURL")?,
            })
        })
        .transpose()?;
    let db_method = m.obj("dbMethod")?.map(|d| db_method(&d)).transpose()?;
    let anomaly_detection = match m.field("anomalyDetection") {
        None => None,
        Some(_) => Some(dmi::AnomalyDetection {
            data: m
                .config_data("anomalyDetection")?
                .map(|c| c.data)
                .unwrap_or_default(),
        }),
    };
    Ok(dmi::PushMethod {
        http,
        mqtt,
        db_method,
        otel,
        anomaly_detection,
    })
}

fn db_method(d: &Obj<'_>) -> Result<dmi::DbMethod, ConvertError> {
    let influxdb2 = d
        .obj("influxdb2")?
        .map(|i| {
            Ok(dmi::DbMethodInfluxdb2 {
                influxdb2_client_config: i
                    .obj("influxdb2ClientConfig")?
                    .map(|c| {
                        Ok(dmi::Influxdb2ClientConfig {
                            url: c.str("url")?,
                            org: c.str("org")?,
                            bucket: c.str("bucket")?,
                        })
                    })
                    .transpose()?,
                influxdb2_data_config: i
                    .obj("influxdb2DataConfig")?
                    .map(|c| {
                        Ok(dmi::Influxdb2DataConfig {
                            measurement: c.str("measurement")?,
                            tag: c.string_map("tag")?,
                            field_key: c.str("fieldKey")?,
                        })
                    })
                    .transpose()?,
            })
        })
        .transpose()?;
    let redis = d
        .obj("redis")?
        .map(|r| {
            Ok(dmi::DbMethodRedis {
                redis_client_config: r
                    .obj("redisClientConfig")?
                    .map(|c| {
                        Ok(dmi::RedisClientConfig {
                            addr: c.str("addr")?,
                            db: c.i32("db")?,
                            poolsize: c.i32("poolsize")?,
                            min_idle_conns: c.i32("minIdleConns")?,
                        })
                    })
                    .transpose()?,
            })
        })
        .transpose()?;
    let tdengine = d
        .obj("tdengine")?
        .map(|t| {
            Ok(dmi::DbMethodTdEngine {
                td_engine_client_config: t
                    .obj("tdEngineClientConfig")?
                    .map(|c| {
                        Ok(dmi::TdEngineClientConfig {
                            addr: c.str("addr")?,
                            dbname: c.str("dbName")?,
                        })
                    })
                    .transpose()?,
            })
        })
        .transpose()?;
    let mysql = d
        .obj("mysql")?
        .map(|m| {
            Ok(dmi::DbMethodMySql {
                mysql_client_config: m
                    .obj("mysqlClientConfig")?
                    .map(|c| {
                        Ok(dmi::MySqlClientConfig {
                            addr: c.str("addr")?,
                            database: c.str("database")?,
                            user_name: c.str("userName")?,
                        })
                    })
                    .transpose()?,
            })
        })
        .transpose()?;
    Ok(dmi::DbMethod {
        influxdb2,
        redis,
        tdengine,
        mysql,
    })
}

/// `status.twins`, and `reportToCloud`/`reportCycle` from `spec.stateReport` (v1.23) or else
/// from `status` (v1.19–v1.22).
fn device_status(
    spec: Option<&Obj<'_>>,
    status: Option<&Obj<'_>>,
) -> Result<dmi::DeviceStatus, ConvertError> {
    let mut out = dmi::DeviceStatus::default();
    if let Some(status) = status {
        for t in status.objects("twins")? {
            out.twins.push(dmi::Twin {
                property_name: t.str("propertyName")?,
                observed_desired: Some(t.twin_property("observedDesired")?),
                reported: Some(t.twin_property("reported")?),
            });
        }
        out.report_to_cloud = status.bool("reportToCloud")?;
        out.report_cycle = status.i64("reportCycle")?;
    }
    if let Some(report) = spec.map(|s| s.obj("stateReport")).transpose()?.flatten() {
        out.report_to_cloud = report.bool("reportToCloud")?;
        out.report_cycle = report.i64("reportCycle")?;
    }
    Ok(out)
}

/// A JSON object with the path that led to it, for error messages.
struct Obj<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Obj<'a> {
    fn root(value: &'a Value, path: &str) -> Result<Self, ConvertError> {
        match value {
            Value::Object(map) => Ok(Obj {
                map,
                path: path.to_string(),
            }),
            _ => Err(ConvertError::WrongType {
                path: path.to_string(),
                expected: "an object",
            }),
        }
    }

    fn path(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    fn wrong(&self, key: &str, expected: &'static str) -> ConvertError {
        ConvertError::WrongType {
            path: self.path(key),
            expected,
        }
    }

    /// Exact key first, then Go's case-insensitive match; `null` is absent.
    fn field(&self, key: &str) -> Option<&'a Value> {
        let value = self.map.get(key).or_else(|| {
            self.map
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v)
        })?;
        (!value.is_null()).then_some(value)
    }

    fn name_and_namespace(&self) -> Result<(String, String), ConvertError> {
        let metadata = self.obj("metadata")?.ok_or_else(|| ConvertError::Missing {
            path: self.path("metadata"),
        })?;
        let name = metadata.str("name")?;
        if name.is_empty() {
            return Err(ConvertError::Missing {
                path: metadata.path("name"),
            });
        }
        Ok((name, metadata.str("namespace")?))
    }

    fn obj(&self, key: &str) -> Result<Option<Obj<'a>>, ConvertError> {
        match self.field(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Obj {
                map,
                path: self.path(key),
            })),
            Some(_) => Err(self.wrong(key, "an object")),
        }
    }

    fn objects(&self, key: &str) -> Result<Vec<Obj<'a>>, ConvertError> {
        let Some(value) = self.field(key) else {
            return Ok(Vec::new());
        };
        let Value::Array(items) = value else {
            return Err(self.wrong(key, "an array"));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::Object(map) => Ok(Obj {
                    map,
                    path: format!("{}[{i}]", self.path(key)),
                }),
                _ => Err(ConvertError::WrongType {
                    path: format!("{}[{i}]", self.path(key)),
                    expected: "an object",
                }),
            })
            .collect()
    }

    fn str(&self, key: &str) -> Result<String, ConvertError> {
        match self.field(key) {
            None => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(self.wrong(key, "a string")),
        }
    }

    fn strings(&self, key: &str) -> Result<Vec<String>, ConvertError> {
        match self.field(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| self.wrong(key, "an array of strings")),
            Some(_) => Err(self.wrong(key, "an array of strings")),
        }
    }

    fn string_map(&self, key: &str) -> Result<HashMap<String, String>, ConvertError> {
        match self.field(key) {
            None => Ok(HashMap::new()),
            Some(Value::Object(map)) => map
                .iter()
                .map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect::<Option<HashMap<_, _>>>()
                .ok_or_else(|| self.wrong(key, "a map of strings")),
            Some(_) => Err(self.wrong(key, "a map of strings")),
        }
    }

    fn i64(&self, key: &str) -> Result<i64, ConvertError> {
        match self.field(key) {
            None => Ok(0),
            Some(Value::Number(n)) => n.as_i64().ok_or_else(|| self.wrong(key, "an integer")),
            Some(_) => Err(self.wrong(key, "an integer")),
        }
    }

    fn i32(&self, key: &str) -> Result<i32, ConvertError> {
        i32::try_from(self.i64(key)?).map_err(|_| self.wrong(key, "a 32-bit integer"))
    }

    fn bool(&self, key: &str) -> Result<bool, ConvertError> {
        match self.field(key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(self.wrong(key, "a boolean")),
        }
    }

    fn twin_property(&self, key: &str) -> Result<dmi::TwinProperty, ConvertError> {
        Ok(match self.obj(key)? {
            Some(t) => dmi::TwinProperty {
                value: t.str("value")?,
                metadata: t.string_map("metadata")?,
            },
            None => dmi::TwinProperty::default(),
        })
    }

    fn config_data(&self, key: &str) -> Result<Option<dmi::CustomizedValue>, ConvertError> {
        let Some(data) = self.obj(key)? else {
            return Ok(None);
        };
        config_data_from_json(data.map)
            .map(Some)
            .map_err(|(k, source)| ConvertError::ConfigValue {
                path: data.path(&k),
                source,
            })
    }
}

#[cfg(test)]
mod tests;
