use serde_json::json;

use super::*;
use crate::any::type_url;

fn thermo_device() -> Value {
    json!({
        "apiVersion": "devices.kubeedge.io/v1beta1",
        "kind": "Device",
        "metadata": {"name": "thermo-1", "namespace": "default", "labels": {"description": "kitchen"}},
        "spec": {
            "deviceModelRef": {"name": "thermo-model"},
            "nodeName": "edge-1",
            "protocol": {"protocolName": "modbus", "configData": {"ip": "10.0.0.5", "port": 502, "slaveID": 1, "tcp": true}},
            "properties": [{
                "name": "temperature",
                "desired": {"value": "20", "metadata": {"type": "int"}},
                "collectCycle": 10_000_000_000i64,
                "reportCycle": 5_000_000_000i64,
                "reportToCloud": true,
                "visitors": {"protocolName": "modbus", "configData": {"register": "HoldingRegister", "offset": 2, "limit": 1, "scale": 0.5}},
                "pushMethod": {
                    "http": {"hostName": "collector", "port": 8080, "requestPath": "/ingest", "timeout": 3},
                    "mqtt": {"address": "mqtt://127.0.0.1:1883", "topic": "t", "qos": 1, "retained": true},
                    "otel": {"endpointURL": "http://otel:4318/v1/metrics"},
                    "dbMethod": {
                        "influxdb2": {"influxdb2ClientConfig": {"url": "http://influx", "org": "o", "bucket": "b"},
                                      "influxdb2DataConfig": {"measurement": "m", "tag": {"k": "v"}, "fieldKey": "f"}},
                        "redis": {"redisClientConfig": {"addr": "r:6379", "db": 2, "poolsize": 10, "minIdleConns": 1}},
                        "TDEngine": {"TDEngineClientConfig": {"addr": "td:6041", "dbName": "db"}},
                        "mysql": {"mysqlClientConfig": {"addr": "my:3306", "database": "d", "userName": "u"}}
                    },
                    "anomalyDetection": {"threshold": 3}
                }
            }],
            "methods": [{"name": "setTemp", "description": "d", "propertyNames": ["temperature"]}],
            "stateReport": {"reportToCloud": true, "reportCycle": 60_000_000_000i64}
        },
        "status": {
            "twins": [{"propertyName": "temperature",
                       "reported": {"value": "19", "metadata": {"timestamp": "1550049403598", "type": "int"}},
                       "observedDesired": {"value": "20"}}],
            "reportToCloud": false,
            "reportCycle": 1
        }
    })
}

fn config_json(data: &Option<dmi::CustomizedValue>) -> Value {
    Value::Object(config_data_to_json(data.as_ref().unwrap()).unwrap())
}

#[test]
fn device_fields_map_as_edgecore_maps_them() {
    let device = device_from_crd(&thermo_device()).unwrap();
    assert_eq!(device.name, "thermo-1");
    assert_eq!(device.namespace, "default");
    let spec = device.spec.unwrap();
    assert_eq!(spec.device_model_reference, "thermo-model");

    let protocol = spec.protocol.unwrap();
    assert_eq!(protocol.protocol_name, "modbus");
    let config = protocol.config_data.as_ref().unwrap();
    assert_eq!(config.data["ip"].type_url, type_url::STRING);
    assert_eq!(config.data["port"].type_url, type_url::FLOAT);
    assert_eq!(config.data["tcp"].type_url, type_url::BOOL);
    assert_eq!(
        config_json(&protocol.config_data),
        json!({"ip": "10.0.0.5", "port": 502, "slaveID": 1, "tcp": true})
    );

    let p = &spec.properties[0];
    assert_eq!(p.name, "temperature");
    let desired = p.desired.as_ref().unwrap();
    assert_eq!(desired.value, "20");
    assert_eq!(desired.metadata["type"], "int");
    assert_eq!(
        (p.collect_cycle, p.report_cycle, p.report_to_cloud),
        (10_000_000_000, 5_000_000_000, true)
    );
    let visitors = p.visitors.as_ref().unwrap();
    assert_eq!(visitors.protocol_name, "modbus");
    assert_eq!(
        config_json(&visitors.config_data),
        json!({"register": "HoldingRegister", "offset": 2, "limit": 1, "scale": 0.5})
    );

    let push = p.push_method.as_ref().unwrap();
    assert_eq!(
        push.http,
        Some(dmi::PushMethodHttp {
            hostname: "collector".into(),
            port: 8080,
            requestpath: "/ingest".into(),
            timeout: 3
        })
    );
    assert_eq!(
        push.mqtt,
        Some(dmi::PushMethodMqtt {
            address: "mqtt://127.0.0.1:1883".into(),
            topic: "t".into(),
            qos: 1,
            retained: true
        })
    );
    assert_eq!(
        push.otel.as_ref().unwrap().endpoint_url,
        "http://otel:4318/v1/metrics"
    );
    let db = push.db_method.as_ref().unwrap();
    let influx = db.influxdb2.as_ref().unwrap();
    assert_eq!(influx.influxdb2_client_config.as_ref().unwrap().bucket, "b");
    let data_config = influx.influxdb2_data_config.as_ref().unwrap();
    assert_eq!(
        (
            data_config.measurement.as_str(),
            data_config.field_key.as_str()
        ),
        ("m", "f")
    );
    assert_eq!(data_config.tag["k"], "v");
    assert_eq!(
        db.redis.as_ref().unwrap().redis_client_config,
        Some(dmi::RedisClientConfig {
            addr: "r:6379".into(),
            db: 2,
            poolsize: 10,
            min_idle_conns: 1
        })
    );
    // Go's case-insensitive keys: TDEngine → tdengine, TDEngineClientConfig, dbName → dbname.
    assert_eq!(
        db.tdengine.as_ref().unwrap().td_engine_client_config,
        Some(dmi::TdEngineClientConfig {
            addr: "td:6041".into(),
            dbname: "db".into()
        })
    );
    assert_eq!(
        db.mysql
            .as_ref()
            .unwrap()
            .mysql_client_config
            .as_ref()
            .unwrap()
            .user_name,
        "u"
    );
    let anomaly = push.anomaly_detection.as_ref().unwrap();
    assert_eq!(json_from_any(&anomaly.data["threshold"]).unwrap(), json!(3));

    assert_eq!(
        spec.methods,
        vec![dmi::DeviceMethod {
            name: "setTemp".into(),
            description: "d".into(),
            property_names: vec!["temperature".into()]
        }]
    );

    let status = device.status.unwrap();
    // spec.stateReport wins over the old status fields.
    assert_eq!(
        (status.report_to_cloud, status.report_cycle),
        (true, 60_000_000_000)
    );
    let twin = &status.twins[0];
    assert_eq!(twin.property_name, "temperature");
    assert_eq!(twin.reported.as_ref().unwrap().value, "19");
    assert_eq!(
        twin.reported.as_ref().unwrap().metadata["timestamp"],
        "1550049403598"
    );
    assert_eq!(twin.observed_desired.as_ref().unwrap().value, "20");
}

#[test]
fn status_report_fields_come_from_status_without_state_report() {
    let mut object = thermo_device();
    object["spec"]
        .as_object_mut()
        .unwrap()
        .remove("stateReport");
    object["status"]["reportToCloud"] = json!(true);
    object["status"]["reportCycle"] = json!(7);
    let status = device_from_crd(&object).unwrap().status.unwrap();
    assert_eq!((status.report_to_cloud, status.report_cycle), (true, 7));
}

#[test]
fn a_minimal_device_has_empty_spec_parts_not_missing_ones() {
    let device = device_from_crd(
        &json!({"metadata": {"name": "d"}, "spec": {"properties": [{"name": "p"}]}}),
    )
    .unwrap();
    assert_eq!(device.namespace, "");
    let spec = device.spec.unwrap();
    assert_eq!(spec.protocol, Some(dmi::ProtocolConfig::default()));
    let p = &spec.properties[0];
    assert_eq!(p.desired, Some(dmi::TwinProperty::default()));
    assert_eq!(p.visitors, Some(dmi::VisitorConfig::default()));
    assert_eq!(p.push_method, None);
    assert_eq!(device.status, Some(dmi::DeviceStatus::default()));
}

#[test]
fn a_config_value_that_is_an_object_fails_the_device_and_names_the_key() {
    let mut object = thermo_device();
    object["spec"]["protocol"]["configData"]["nested"] = json!({"a": 1});
    let err = device_from_crd(&object).unwrap_err();
    assert_eq!(
        err,
        ConvertError::ConfigValue {
            path: "device.spec.protocol.configData.nested".into(),
            source: AnyError::Unsupported("object"),
        }
    );
}

#[test]
fn wrong_json_types_and_missing_names_are_errors() {
    let mut object = thermo_device();
    object["spec"]["properties"][0]["reportCycle"] = json!("10s");
    assert_eq!(
        device_from_crd(&object).unwrap_err(),
        ConvertError::WrongType {
            path: "device.spec.properties[0].reportCycle".into(),
            expected: "an integer"
        }
    );
    assert_eq!(
        device_from_crd(&json!({"metadata": {"namespace": "x"}})).unwrap_err(),
        ConvertError::Missing {
            path: "device.metadata.name".into()
        }
    );
    assert!(matches!(
        device_from_crd(&json!([])),
        Err(ConvertError::WrongType { .. })
    ));
}

#[test]
fn model_properties_map_field_by_field() {
    let model = model_from_crd(&json!({
        "metadata": {"name": "thermo-model", "namespace": "default"},
        "spec": {
            "protocol": "modbus",
            "protocolConfigData": {"slaveID": 1},
            "properties": [{"name": "temperature", "description": "in C", "type": "INT", "accessMode": "ReadWrite",
                            "minimum": "0", "maximum": "100", "unit": "C", "visitors": {"protocolName": "modbus"}}]
        }
    }))
    .unwrap();
    assert_eq!(
        model,
        dmi::DeviceModel {
            name: "thermo-model".into(),
            namespace: "default".into(),
            spec: Some(dmi::DeviceModelSpec {
                properties: vec![dmi::ModelProperty {
                    name: "temperature".into(),
                    description: "in C".into(),
                    r#type: "INT".into(),
                    access_mode: "ReadWrite".into(),
                    minimum: "0".into(),
                    maximum: "100".into(),
                    unit: "C".into(),
                }],
                commands: vec![],
            }),
        }
    );
}

#[test]
fn model_defaults_fill_in_under_the_devices_own_keys() {
    let model = json!({
        "metadata": {"name": "m", "namespace": "default"},
        "spec": {
            "protocolConfigData": {"port": 502, "slaveID": 1},
            "properties": [
                {"name": "temperature", "visitors": {"protocolName": "modbus", "configData": {"register": "InputRegister", "offset": 0, "scale": 0.1}}},
                {"name": "mode", "visitors": {"protocolName": "modbus"}},
                {"name": "plain"}
            ]
        }
    });
    let device = json!({
        "metadata": {"name": "d", "namespace": "default"},
        "spec": {
            "protocol": {"protocolName": "modbus", "configData": {"ip": "10.0.0.9", "slaveID": 7}},
            "properties": [
                {"name": "temperature", "visitors": {"protocolName": "modbus", "configData": {"offset": 4}}},
                {"name": "mode", "visitors": {"protocolName": "modbus", "configData": {"register": "CoilRegister"}}},
                {"name": "plain", "visitors": {"protocolName": "modbus", "configData": {"register": "HoldingRegister"}}},
                {"name": "device-only"}
            ]
        }
    });
    let merged = device_with_model_defaults(&device, &model);
    assert_eq!(
        merged["spec"]["protocol"]["configData"],
        json!({"ip": "10.0.0.9", "port": 502, "slaveID": 7})
    );
    let props = &merged["spec"]["properties"];
    assert_eq!(
        props[0]["visitors"]["configData"],
        json!({"register": "InputRegister", "offset": 4, "scale": 0.1})
    );
    assert_eq!(
        props[1]["visitors"],
        json!({"protocolName": "modbus", "configData": {"register": "CoilRegister"}})
    );
    assert_eq!(
        props[2], device["spec"]["properties"][2],
        "the model property has no visitors"
    );
    assert_eq!(props[3], json!({"name": "device-only"}));
    // The merged object converts like any other.
    assert!(device_from_crd(&merged).is_ok());
    // A model without defaults changes nothing.
    assert_eq!(
        device_with_model_defaults(&device, &json!({"spec": {}})),
        device
    );
}
