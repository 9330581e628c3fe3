//! `modules.eventBus` as the eventbus uses it (reference §4.1), and the parsing of its URLs and
//! numbers, done once when the bus starts.

use super::EventBusError;
use rumqttc::QoS;
use std::time::Duration;

/// Payloads larger than this are dropped (counted) rather than handed to devicetwin or the cloud.
pub const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;
/// Publishes queued towards one broker, at most.
pub const DEFAULT_PUBLISH_QUEUE: usize = 1024;
/// Payload bytes queued for an external broker while it is not connected, at most: a broker
/// that is down (or was never installed) holds at most this much of the edge's memory, not
/// `DEFAULT_PUBLISH_QUEUE` × `DEFAULT_MAX_PAYLOAD`.
pub const DEFAULT_OFFLINE_QUEUE_BYTES: usize = 4 * 1024 * 1024;
/// KubeEdge retries a lost broker connection every 5 s.
pub const DEFAULT_RECONNECT_INTERVAL: Duration = Duration::from_secs(5);

/// Which brokers the bus talks to (`mqttMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MqttMode {
    /// 0: the embedded broker only.
    Internal,
    /// 1: both.
    Both,
    /// 2: an external broker (mosquitto) only.
    External,
}

impl MqttMode {
    pub fn from_number(n: i32) -> Option<MqttMode> {
        match n {
            0 => Some(MqttMode::Internal),
            1 => Some(MqttMode::Both),
            2 => Some(MqttMode::External),
            _ => None,
        }
    }

    pub fn uses_internal(self) -> bool {
        matches!(self, MqttMode::Internal | MqttMode::Both)
    }

    pub fn uses_external(self) -> bool {
        matches!(self, MqttMode::External | MqttMode::Both)
    }
}

/// The eventbus settings. Built from `modules.eventBus` by [`EventBusConfig::from_edgecore`];
/// the last four fields are kubeedge-rs bounds with KubeEdge-like defaults (tests shorten them).
#[derive(Debug, Clone, PartialEq)]
pub struct EventBusConfig {
    /// `mqttMode` as written: checked by [`EventBusConfig::mode`] when the bus starts.
    pub mqtt_mode: i32,
    /// `mqttServerExternal`, e.g. `tcp://127.0.0.1:1883`.
    pub server_external: String,
    /// `mqttServerInternal`: where the embedded broker listens.
    pub server_internal: String,
    /// `mqttQOS` of publishes injected into the embedded broker.
    pub qos: i32,
    /// `mqttRetain` of publishes injected into the embedded broker.
    pub retain: bool,
    /// `mqttSessionQueueSize`: messages queued per client of the embedded broker.
    pub session_queue_size: usize,
    pub sub_client_id: String,
    pub pub_client_id: String,
    pub username: String,
    pub password: String,
    /// `eventBusTLS.enable`: not supported yet, refused at start.
    pub tls_enable: bool,
    pub max_payload: usize,
    pub publish_queue: usize,
    /// See `DEFAULT_OFFLINE_QUEUE_BYTES`.
    pub offline_queue_bytes: usize,
    pub reconnect_interval: Duration,
}

impl Default for EventBusConfig {
    fn default() -> Self {
        EventBusConfig::from_section(&crate::config::EventBus::default())
    }
}

impl EventBusConfig {
    pub fn from_edgecore(c: &crate::config::EdgeCoreConfig) -> Self {
        EventBusConfig::from_section(&c.modules.event_bus)
    }

    fn from_section(eb: &crate::config::EventBus) -> Self {
        EventBusConfig {
            mqtt_mode: eb.mqtt_mode,
            server_external: eb.mqtt_server_external.clone(),
            server_internal: eb.mqtt_server_internal.clone(),
            qos: eb.mqtt_qos,
            retain: eb.mqtt_retain,
            session_queue_size: usize::try_from(eb.mqtt_session_queue_size)
                .ok()
                .filter(|n| *n > 0)
                .unwrap_or(100),
            sub_client_id: eb.mqtt_sub_client_id.clone(),
            pub_client_id: eb.mqtt_pub_client_id.clone(),
            username: eb.mqtt_username.clone(),
            password: eb.mqtt_password.clone(),
            tls_enable: eb.event_bus_tls.enable,
            max_payload: DEFAULT_MAX_PAYLOAD,
            publish_queue: DEFAULT_PUBLISH_QUEUE,
            offline_queue_bytes: DEFAULT_OFFLINE_QUEUE_BYTES,
            reconnect_interval: DEFAULT_RECONNECT_INTERVAL,
        }
    }

    pub fn mode(&self) -> Result<MqttMode, EventBusError> {
        MqttMode::from_number(self.mqtt_mode).ok_or_else(|| {
            EventBusError::Config(format!(
                "modules.eventBus.mqttMode must be 0, 1 or 2, got {}",
                self.mqtt_mode
            ))
        })
    }

    pub fn internal_qos(&self) -> Result<QoS, EventBusError> {
        match self.qos {
            0 => Ok(QoS::AtMostOnce),
            1 => Ok(QoS::AtLeastOnce),
            2 => Ok(QoS::ExactlyOnce),
            n => Err(EventBusError::Config(format!(
                "modules.eventBus.mqttQOS must be 0, 1 or 2, got {n}"
            ))),
        }
    }

    /// The subscriber's client ID (KubeEdge: `hub-client-sub-<10 digits>` when unset).
    pub fn sub_client_id(&self) -> String {
        client_id_or_default(&self.sub_client_id, "hub-client-sub-")
    }

    /// The publisher's client ID (KubeEdge: `hub-client-pub-<10 digits>` when unset).
    pub fn pub_client_id(&self) -> String {
        client_id_or_default(&self.pub_client_id, "hub-client-pub-")
    }
}

fn client_id_or_default(configured: &str, prefix: &str) -> String {
    if !configured.is_empty() {
        return configured.to_string();
    }
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
        .to_string();
    format!("{prefix}{}", &ms[..ms.len().min(10)])
}

/// A broker address from `tcp://host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddress {
    pub host: String,
    pub port: u16,
}

impl BrokerAddress {
    /// `tcp://host:port` (IPv6 hosts in brackets). TLS schemes are refused as unsupported.
    pub fn parse(key: &str, url: &str) -> Result<BrokerAddress, EventBusError> {
        let bad = |why: &str| EventBusError::Config(format!("{key} {url:?}: {why}"));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected tcp://host:port"))?;
        match scheme {
            "tcp" | "mqtt" => {}
            "tls" | "ssl" | "mqtts" => return Err(EventBusError::TlsUnsupported),
            _ => return Err(bad("the scheme must be tcp")),
        }
        let rest = rest.trim_end_matches('/');
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| bad("the port is missing"))?;
        // Port 0 makes sense only for the internal broker (any free port; tests use it).
        let port: u16 = port
            .parse()
            .map_err(|_| bad("the port is not a number from 0 to 65535"))?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() || host.contains(['/', '@', '?', '#']) {
            return Err(bad("the host is missing or not a host name"));
        }
        Ok(BrokerAddress {
            host: host.to_string(),
            port,
        })
    }

    /// `host:port` for binding or connecting (brackets around IPv6 literals).
    pub fn socket_text(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_kubeedge_defaults() {
        let c = EventBusConfig::default();
        assert_eq!(c.mode().unwrap(), MqttMode::External);
        assert_eq!(c.server_external, "tcp://127.0.0.1:1883");
        assert_eq!(c.server_internal, "tcp://127.0.0.1:1884");
        assert_eq!(c.internal_qos().unwrap(), QoS::AtMostOnce);
        assert_eq!(c.session_queue_size, 100);
        assert_eq!(c.reconnect_interval, Duration::from_secs(5));
        assert!(!c.tls_enable);
    }

    #[test]
    fn empty_client_ids_get_kubeedge_generated_ones() {
        let c = EventBusConfig::default();
        let sub = c.sub_client_id();
        let digits = sub.strip_prefix("hub-client-sub-").unwrap();
        assert_eq!(digits.len(), 10);
        assert!(digits.bytes().all(|b| b.is_ascii_digit()));
        assert!(c.pub_client_id().starts_with("hub-client-pub-"));
        let named = EventBusConfig {
            sub_client_id: "mine".into(),
            ..EventBusConfig::default()
        };
        assert_eq!(named.sub_client_id(), "mine");
    }

    #[test]
    fn broker_urls_parse_or_say_why_not() {
        let a = BrokerAddress::parse("k", "tcp://127.0.0.1:1883").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("127.0.0.1", 1883));
        assert_eq!(a.socket_text(), "127.0.0.1:1883");
        let v6 = BrokerAddress::parse("k", "tcp://[::1]:1884").unwrap();
        assert_eq!(v6.host, "::1");
        assert_eq!(v6.socket_text(), "[::1]:1884");
        assert!(matches!(
            BrokerAddress::parse("k", "ssl://h:8883"),
            Err(EventBusError::TlsUnsupported)
        ));
        for bad in [
            "",
            "127.0.0.1:1883",
            "tcp://h",
            "tcp://h:x",
            "tcp://:1",
            "http://h:1",
        ] {
            let e = BrokerAddress::parse("modules.eventBus.mqttServerExternal", bad).unwrap_err();
            assert!(e.to_string().contains("mqttServerExternal"), "{bad}: {e}");
        }
        let bad_mode = EventBusConfig {
            mqtt_mode: 3,
            ..EventBusConfig::default()
        };
        assert!(bad_mode.mode().is_err());
    }
}
