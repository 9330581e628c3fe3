//! KubeEdge's stream tunnel (cloudstream ⇄ edgestream, protocol §8): the tunnel message
//! `uvarint(connectID) ‖ uvarint(messageType) ‖ data`, carried in WebSocket TEXT frames whose
//! payload is binary (so never decoded as UTF-8), and the JSON connect payloads.

pub mod http;
pub mod pump;
pub mod ws;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Tunnel path on the cloud's tunnel port (10004).
pub const CONNECT_PATH: &str = "/v1/kubeedge/connect";
/// Edge request header naming the node.
pub const HEADER_HOSTNAME: &str = "SessionHostNameOverride";
/// Edge request header carrying the node's internal IP.
pub const HEADER_INTERNAL_IP: &str = "SessionInternalIP";
/// Most data one tunnel message may carry (KubeEdge reads up to 1 MiB).
pub const MAX_DATA: usize = 1 << 20;
/// Where the cloud says the edge's kubelet-like server is (rewritten into connect URLs).
pub const EDGED_SERVER_HOST: &str = "127.0.0.1:10350";

/// `pkg/stream.MessageType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    LogsConnect,
    ExecConnect,
    MetricConnect,
    Data,
    RemoveConnect,
    CloseConnect,
    AttachConnect,
    /// `7`: not in any released KubeEdge (v1.15–v1.23 edges panic on a connect type they do
    /// not know); the number and connect payload of KubeEdge's pending port-forward change
    /// (kubeedge/kubeedge#7019). Sent only to edges that advertise
    /// [`crate::constants::CAPABILITY_PORT_FORWARD`].
    PortForwardConnect,
    /// `8`, kubeedge-rs only: connect to a Service endpoint on this node for another edge's
    /// edgemesh (payload [`RelayConnect`]). Sent only to edges that advertise
    /// [`crate::constants::CAPABILITY_RELAY`].
    RelayConnect,
    Unknown(u64),
}

impl MessageType {
    pub fn code(self) -> u64 {
        match self {
            MessageType::LogsConnect => 0,
            MessageType::ExecConnect => 1,
            MessageType::MetricConnect => 2,
            MessageType::Data => 3,
            MessageType::RemoveConnect => 4,
            MessageType::CloseConnect => 5,
            MessageType::AttachConnect => 6,
            MessageType::PortForwardConnect => 7,
            MessageType::RelayConnect => 8,
            MessageType::Unknown(c) => c,
        }
    }

    pub fn from_code(c: u64) -> Self {
        match c {
            0 => MessageType::LogsConnect,
            1 => MessageType::ExecConnect,
            2 => MessageType::MetricConnect,
            3 => MessageType::Data,
            4 => MessageType::RemoveConnect,
            5 => MessageType::CloseConnect,
            6 => MessageType::AttachConnect,
            7 => MessageType::PortForwardConnect,
            8 => MessageType::RelayConnect,
            other => MessageType::Unknown(other),
        }
    }
}

/// One tunnel message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelMessage {
    pub connect_id: u64,
    pub kind: MessageType,
    pub data: Vec<u8>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TunnelError {
    #[error("truncated uvarint in tunnel message")]
    Truncated,
    #[error("uvarint overflows 64 bits in tunnel message")]
    Overflow,
    #[error("tunnel message data of {0} bytes exceeds the 1 MiB limit")]
    TooLarge(usize),
}

/// `encoding/binary.PutUvarint`.
pub fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// `encoding/binary.ReadUvarint`: the value and the bytes it took.
pub fn read_uvarint(buf: &[u8]) -> Result<(u64, usize), TunnelError> {
    let mut v: u64 = 0;
    for (i, b) in buf.iter().enumerate() {
        if i == 10 || (i == 9 && *b > 1) {
            return Err(TunnelError::Overflow);
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok((v, i + 1));
        }
    }
    Err(TunnelError::Truncated)
}

impl TunnelMessage {
    pub fn new(connect_id: u64, kind: MessageType, data: Vec<u8>) -> Self {
        TunnelMessage {
            connect_id,
            kind,
            data,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.data.len() + 20);
        put_uvarint(&mut out, self.connect_id);
        put_uvarint(&mut out, self.kind.code());
        out.extend_from_slice(&self.data);
        out
    }

    pub fn decode(buf: &[u8]) -> Result<Self, TunnelError> {
        let (connect_id, a) = read_uvarint(buf)?;
        let (kind, b) = read_uvarint(&buf[a..])?;
        let data = &buf[a + b..];
        if data.len() > MAX_DATA {
            return Err(TunnelError::TooLarge(data.len()));
        }
        Ok(TunnelMessage {
            connect_id,
            kind: MessageType::from_code(kind),
            data: data.to_vec(),
        })
    }
}

/// Where an edge asks the cloud to relay a connection (edgemesh, kubeedge-rs only): an HTTP
/// upgrade on the tunnel port, authenticated with the edge's certificate.
pub const RELAY_PATH: &str = "/v1/kubeedge-rs/relay";
/// The upgrade protocol of a relay request (raw bytes after the 101).
pub const RELAY_PROTOCOL: &str = "kubeedge-rs-relay";
/// Relay request header: the node the endpoint runs on.
pub const HEADER_RELAY_NODE: &str = "X-KubeEdge-RS-Relay-Node";
/// Relay request header: the endpoint, `ip:port` (TCP).
pub const HEADER_RELAY_TARGET: &str = "X-KubeEdge-RS-Relay-Target";

/// The payload of RELAY_CONNECT: the endpoint the edge dials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayConnect {
    pub addr: std::net::SocketAddr,
}

/// The first DATA message of a relay connection, from the edge: whether the dial worked.
/// Everything after it is the connection's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RelayStatus {
    /// Empty when connected.
    pub error: String,
}

/// Go's `net/url.URL` as `encoding/json` writes it (exported field names).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GoUrl {
    #[serde(rename = "Scheme")]
    pub scheme: String,
    #[serde(rename = "Opaque")]
    pub opaque: String,
    #[serde(rename = "User")]
    pub user: Option<serde_json::Value>,
    #[serde(rename = "Host")]
    pub host: String,
    #[serde(rename = "Path")]
    pub path: String,
    #[serde(rename = "RawPath")]
    pub raw_path: String,
    #[serde(rename = "OmitHost")]
    pub omit_host: bool,
    #[serde(rename = "ForceQuery")]
    pub force_query: bool,
    #[serde(rename = "RawQuery")]
    pub raw_query: String,
    #[serde(rename = "Fragment")]
    pub fragment: String,
    #[serde(rename = "RawFragment")]
    pub raw_fragment: String,
}

/// `stream.EdgedLogsConnection` (and, with `method`, the exec/attach connectors). Go
/// decodes JSON keys case-insensitively and newer KubeEdge writes `messID`: both are read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Connector {
    #[serde(rename = "MessID", alias = "messID")]
    pub mess_id: u64,
    pub url: GoUrl,
    /// Go `http.Header`; `null` in Go when absent.
    pub header: Option<BTreeMap<String, Vec<String>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// Percent-decodes a URL query component (`+` is a space).
pub fn query_unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `k=v&k2=v2` into decoded pairs.
pub fn parse_query(raw: &str) -> Vec<(String, String)> {
    raw.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (query_unescape(k), query_unescape(v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uvarint_matches_go_encoding() {
        for (v, bytes) in [
            (0u64, vec![0u8]),
            (1, vec![1]),
            (127, vec![0x7f]),
            (128, vec![0x80, 0x01]),
            (300, vec![0xac, 0x02]),
            (
                u64::MAX,
                vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            ),
        ] {
            let mut out = Vec::new();
            put_uvarint(&mut out, v);
            assert_eq!(out, bytes, "{v}");
            assert_eq!(read_uvarint(&bytes), Ok((v, bytes.len())));
        }
        assert_eq!(read_uvarint(&[0x80]), Err(TunnelError::Truncated));
        assert_eq!(read_uvarint(&[]), Err(TunnelError::Truncated));
        assert_eq!(read_uvarint(&[0xff; 11]), Err(TunnelError::Overflow));
        assert_eq!(
            read_uvarint(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]),
            Err(TunnelError::Overflow)
        );
    }

    #[test]
    fn messages_round_trip_with_binary_data() {
        let m = TunnelMessage::new(300, MessageType::Data, vec![0xff, 0xfe, 0, 0xc3]);
        let wire = m.encode();
        assert_eq!(&wire[..3], &[0xac, 0x02, 3]);
        assert!(std::str::from_utf8(&wire).is_err());
        assert_eq!(TunnelMessage::decode(&wire), Ok(m));
        let remove = TunnelMessage::decode(&[7, 4]).unwrap();
        assert_eq!(remove.kind, MessageType::RemoveConnect);
        assert!(remove.data.is_empty());
        assert_eq!(
            TunnelMessage::decode(&[7, 42, 1]).unwrap().kind,
            MessageType::Unknown(42)
        );
        for c in 0..9 {
            assert_eq!(MessageType::from_code(c).code(), c);
        }
        assert_eq!(MessageType::from_code(7), MessageType::PortForwardConnect);
        assert_eq!(TunnelMessage::decode(&[7]), Err(TunnelError::Truncated));
        let mut big = vec![1, 3];
        big.resize(2 + MAX_DATA + 1, b'x');
        assert_eq!(
            TunnelMessage::decode(&big),
            Err(TunnelError::TooLarge(MAX_DATA + 1))
        );
    }

    #[test]
    fn connector_json_uses_go_field_names() {
        let go = r#"{"MessID":5,"url":{"Scheme":"http","Opaque":"","User":null,"Host":"127.0.0.1:10350","Path":"/containerLogs/default/web/c","RawPath":"","OmitHost":false,"ForceQuery":false,"RawQuery":"follow=true\u0026tailLines=2","Fragment":"","RawFragment":""},"header":{"Accept":["*/*"]}}"#;
        let c: Connector = serde_json::from_str(go).unwrap();
        assert_eq!(c.mess_id, 5);
        assert_eq!(c.url.path, "/containerLogs/default/web/c");
        assert_eq!(c.url.raw_query, "follow=true&tailLines=2");
        let back: serde_json::Value = serde_json::to_value(&c).unwrap();
        let orig: serde_json::Value = serde_json::from_str(go).unwrap();
        assert_eq!(back, orig);
        // Older Go (no OmitHost) and null headers still parse.
        let old: Connector =
            serde_json::from_str(r#"{"MessID":1,"url":{"Path":"/x"},"header":null}"#).unwrap();
        assert_eq!(old.url.path, "/x");
    }

    #[test]
    fn exec_and_attach_connectors_carry_the_method() {
        let c = Connector {
            mess_id: 9,
            url: GoUrl {
                scheme: "http".into(),
                host: EDGED_SERVER_HOST.into(),
                path: "/exec/default/web/main".into(),
                raw_query: "command=sh&input=1".into(),
                ..GoUrl::default()
            },
            header: Some(BTreeMap::from([(
                "X-Stream-Protocol-Version".to_string(),
                vec![
                    "v4.channel.k8s.io".to_string(),
                    "v3.channel.k8s.io".to_string(),
                ],
            )])),
            method: Some("POST".into()),
        };
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["method"], "POST");
        assert_eq!(v["MessID"], 9);
        assert_eq!(
            v["header"]["X-Stream-Protocol-Version"][1],
            "v3.channel.k8s.io"
        );
        // Logs connectors have no method key, as Go's EdgedLogsConnection.
        let logs = Connector {
            method: None,
            ..c.clone()
        };
        assert!(serde_json::to_value(&logs).unwrap().get("method").is_none());
        // Newer KubeEdge (BaseEdgedConnection) writes `messID`.
        let newer: Connector = serde_json::from_str(
            r#"{"messID":12,"method":"GET","header":{"Upgrade":["SPDY/3.1"]},"url":{"Path":"/attach/ns/p/c"}}"#,
        )
        .unwrap();
        assert_eq!((newer.mess_id, newer.method.as_deref()), (12, Some("GET")));
    }

    #[test]
    fn queries_are_decoded() {
        assert_eq!(
            parse_query("a=1&b=x%20y+z&c&d=%zz"),
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "x y z".into()),
                ("c".into(), "".into()),
                ("d".into(), "%zz".into())
            ]
        );
        assert_eq!(query_unescape("%4"), "%4");
    }
}
