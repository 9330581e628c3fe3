//! Entry points of edgecore's fuzz targets (`e2e/fuzz`; see `kubeedge_shared::fuzz_targets`):
//! MetaServer requests, MQTT packets, topics and payloads, and the configuration file.

use crate::config::EdgeCoreConfig;
use crate::devicetwin::store::{DeviceRow, TwinRow};
use crate::devicetwin::{topics as twin_topics, twin};
use crate::eventbus::topics::{Destination, Subscriptions};
use crate::metaserver::request::{self, Options, Target};
use bytes::BytesMut;
use http::Method;
use kubeedge_shared::devices::{DeviceTwinUpdate, decode_content};
use kubeedge_shared::fuzz_targets::{parts, text};
use kubeedge_shared::selectors::Filter;
use serde_json::Value;

/// One MetaServer request line: method, path, query and `Accept` header, as a client sends them.
pub fn metaserver_request(data: &[u8]) {
    let p = parts(data, 4);
    let method = match p[0].first().map(|b| b % 6) {
        Some(0) | None => Method::GET,
        Some(1) => Method::POST,
        Some(2) => Method::PUT,
        Some(3) => Method::PATCH,
        Some(4) => Method::DELETE,
        _ => Method::HEAD,
    };
    let path = p.get(1).map(|b| text(b)).unwrap_or_default();
    let query = p.get(2).map(|b| text(b));
    let accept = p.get(3).map(|b| text(b));
    let _ = request::representation(accept.as_deref());
    let Ok(opts) = Options::parse(query.as_deref()) else {
        return;
    };
    let _ = opts.resource_version_number();
    let _ = Filter::parse(
        opts.label_selector.as_deref(),
        opts.field_selector.as_deref(),
    );
    if let Ok(Target::Resource(r)) = request::resolve(&method, &path, opts.watch) {
        let _ = (r.key_prefix(), r.object_key(), r.api_version());
        let _ = r.verb.application_verb(&r.subresource);
    }
}

/// A device known to the fuzzed twin updates: one typed twin, one optional, one deleted.
fn device() -> DeviceRow {
    let twin = |attr_type: &str, optional: bool| TwinRow {
        expected: Some("1".into()),
        actual: Some("1".into()),
        expected_version: Some(r#"{"cloud":1,"edge":0}"#.into()),
        optional,
        attr_type: attr_type.into(),
        ..TwinRow::default()
    };
    DeviceRow {
        id: "default/thermostat".into(),
        name: "thermostat".into(),
        twins: [
            ("temperature".to_string(), twin("int", false)),
            ("mode".to_string(), twin("string", true)),
            ("old".to_string(), twin("deleted", true)),
        ]
        .into(),
        ..DeviceRow::default()
    }
}

/// A message a mapper or device publishes: topic, then payload, as devicetwin reads them.
pub fn mqtt_message(data: &[u8]) {
    let p = parts(data, 2);
    let topic = text(p[0]);
    let payload = p.get(1).copied().unwrap_or_default();
    let _ = Destination::of(&topic);
    let subs = Subscriptions::with([topic.clone()]);
    let _ = subs.matches(&topic);
    let _ = twin_topics::classify(&topic);
    let Ok(value) = serde_json::from_slice::<Value>(payload) else {
        return;
    };
    if let Ok(update) = decode_content::<DeviceTwinUpdate>(&value) {
        let dev = device();
        if let Ok(outcome) = twin::apply_rest(&dev, &update, 1_700_000_000_000) {
            let mut after = dev.clone();
            for (name, row) in &outcome.rows {
                after.twins.insert(name.clone(), row.clone());
                let _ = twin::msg_twin(row, true);
            }
            let _ = twin::delta(&after);
        }
    }
}

/// A mapper's `ReportDeviceStatus` body, turned into the twin update devicetwin applies.
pub fn dmi_report(data: &[u8]) {
    use prost::Message as _;
    let Ok(report) = kubeedge_dmi::v1beta1::ReportDeviceStatusRequest::decode(data) else {
        return;
    };
    let update = crate::devicetwin::dmi::twin_update_of(&report);
    let _ = twin::apply_rest(&device(), &update, 1_700_000_000_000);
}

/// The bytes an MQTT client sends to the embedded broker, read packet by packet as its
/// sessions read them.
pub fn mqtt_packets(data: &[u8]) {
    let mut buf = BytesMut::from(data);
    while let Ok(packet) = rumqttc::Packet::read(&mut buf, 64 * 1024) {
        if let rumqttc::Packet::Subscribe(s) = &packet {
            for f in &s.filters {
                let _ = crate::eventbus::topics::valid_filter(&f.path);
            }
        }
    }
}

/// `edgecore.yaml`: parsed over the defaults, validated, written back.
pub fn edge_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = EdgeCoreConfig::from_yaml(text, "fuzz.yaml") else {
        return;
    };
    let _ = config.validate();
    let _ = config.kubeedge_rs_settings();
    let _ = crate::eventbus::config::EventBusConfig::from_edgecore(&config).mode();
    if let Ok(yaml) = config.to_yaml() {
        let _ = EdgeCoreConfig::from_yaml(&yaml, "again.yaml");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_shared::fuzz_targets::replay;

    #[test]
    fn metaserver_request_corpus_replays() {
        replay("metaserver_request", metaserver_request);
    }

    #[test]
    fn mqtt_message_corpus_replays() {
        replay("mqtt_message", mqtt_message);
    }

    #[test]
    fn dmi_report_corpus_replays() {
        replay("dmi_report", dmi_report);
    }

    #[test]
    fn mqtt_packets_corpus_replays() {
        replay("mqtt_packets", mqtt_packets);
    }

    #[test]
    fn edge_config_corpus_replays() {
        replay("edge_config", edge_config);
    }
}
