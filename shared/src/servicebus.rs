//! What the cloud router and the edge's servicebus exchange (devices reference §7; KubeEdge
//! `common/types/http.go`): an HTTP call for an application on the edge node and its answer,
//! the call's `<port>:<path>` resource, and the `upload` an edge application sends through the
//! servicebus's local server.
//!
//! Go encodes `http.Header` as `{"Name": ["value", …]}` and `[]byte` as standard base64 (or
//! `null` for a nil slice); both are accepted in either form and written the Go way.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;

/// Go's `http.Header`: canonical names (`Content-Type`) to their values.
pub type HeaderMap = BTreeMap<String, Vec<String>>;

/// The server the edge's servicebus reports in its own error answers (KubeEdge's).
pub const EDGE_SERVER_HEADER: &str = "kubeedge-edgecore";

/// The largest body a message can carry base64-encoded in a frame of `max_frame` bytes,
/// leaving room for the envelope (headers, route).
pub fn max_body_for_frame(max_frame: usize) -> usize {
    max_frame.saturating_sub(64 * 1024) / 4 * 3
}

/// KubeEdge's `HTTPRequest`: the content of a call from the router to an edge application.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpRequest {
    #[serde(default, deserialize_with = "null_as_default")]
    pub header: HeaderMap,
    #[serde(default, with = "go_bytes")]
    pub body: Vec<u8>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub method: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub url: String,
}

/// KubeEdge's `HTTPResponse`: the edge application's answer (or the servicebus's error).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpResponse {
    #[serde(default, deserialize_with = "null_as_default")]
    pub header: HeaderMap,
    #[serde(rename = "status_code", default)]
    pub status_code: u16,
    #[serde(default, with = "go_bytes")]
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The servicebus's own error answer: `Server: kubeedge-edgecore`, the text as body.
    pub fn edge_error(status_code: u16, text: impl Into<String>) -> Self {
        HttpResponse {
            header: BTreeMap::from([("Server".to_string(), vec![EDGE_SERVER_HEADER.to_string()])]),
            status_code,
            body: text.into().into_bytes(),
        }
    }
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Go's `[]byte` in JSON: base64 text, `null` for nil.
pub mod go_bytes {
    use super::*;

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(Vec::new()),
            Some(s) => STANDARD.decode(s).map_err(serde::de::Error::custom),
        }
    }
}

/// Decodes a `[]byte` carried as message content (a base64 string); `None` when it is not one.
pub fn decode_bytes_content(content: &serde_json::Value) -> Option<Vec<u8>> {
    STANDARD.decode(content.as_str()?).ok()
}

/// `[]byte` as message content, the way Go writes it.
pub fn bytes_content(bytes: &[u8]) -> serde_json::Value {
    serde_json::Value::String(STANDARD.encode(bytes))
}

/// Go's `textproto.CanonicalMIMEHeaderKey`: `content-type` → `Content-Type`. Names with
/// characters outside a token are returned unchanged, as Go does.
pub fn canonical_header_name(name: &str) -> String {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return name.to_string();
    }
    let mut out = String::with_capacity(name.len());
    let mut upper = true;
    for c in name.chars() {
        out.push(if upper {
            c.to_ascii_uppercase()
        } else {
            c.to_ascii_lowercase()
        });
        upper = c == '-';
    }
    out
}

/// Headers that describe one connection, not the message: never relayed (RFC 9110 §7.6.1),
/// plus the lengths and hosts the relaying side sets itself.
pub fn is_hop_by_hop(name: &str) -> bool {
    const NAMES: [&str; 10] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    ];
    NAMES.iter().any(|n| n.eq_ignore_ascii_case(name)) || name.eq_ignore_ascii_case("host")
}

/// Where a call goes on the edge node: `http://127.0.0.1:<port><path>`. On the wire the
/// resource `<port>:<path>` (KubeEdge splits it at the `:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceCall {
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceCallError {
    #[error("the format of resource {0} is incorrect")]
    Format(String),
    #[error("resource {0}: {1} is not a port")]
    Port(String, String),
    #[error("resource {0}: the path must start with / and hold only URL characters")]
    Path(String),
}

impl ServiceCall {
    /// Parses `<port>:<path>`. Only a loopback URL with a numeric port and a path can result,
    /// so no resource can point the call at another host (`80:@evil/` is refused).
    pub fn parse(resource: &str) -> Result<Self, ServiceCallError> {
        let (port, path) = resource
            .split_once(':')
            .ok_or_else(|| ServiceCallError::Format(resource.to_string()))?;
        let port_num = (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
            .then(|| port.parse::<u16>().ok())
            .flatten()
            .filter(|p| *p != 0)
            .ok_or_else(|| ServiceCallError::Port(resource.to_string(), port.to_string()))?;
        let path = if path.is_empty() { "/" } else { path };
        let valid = path.starts_with('/')
            && !path.starts_with("//")
            && path.bytes().all(|b| b.is_ascii_graphic() && b != b'#');
        if !valid {
            return Err(ServiceCallError::Path(resource.to_string()));
        }
        Ok(ServiceCall {
            port: port_num,
            path: path.to_string(),
        })
    }

    /// The wire resource.
    pub fn resource(&self) -> String {
        format!("{}:{}", self.port, self.path)
    }

    /// The URL the edge calls.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}{}", self.port, self.path)
    }
}

/// KubeEdge's servicebus server request (`POST http://127.0.0.1:9060/`): what an edge
/// application sends to reach a cloud endpoint a rule allows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UploadRequest {
    #[serde(default)]
    pub method: String,
    #[serde(rename = "targetURL", default)]
    pub target_url: String,
    #[serde(default)]
    pub payload: serde_json::Value,
}

/// KubeEdge's servicebus server answer (always HTTP 200).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadResponse {
    pub code: u16,
    pub msg: String,
    pub body: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn http_request_reads_go_json_and_writes_it_back() {
        let go = json!({"header": {"Accept": ["*/*"], "X-A": ["1", "2"]}, "body": "aGVsbG8=",
            "method": "POST", "url": ""});
        let r: HttpRequest = serde_json::from_value(go.clone()).unwrap();
        assert_eq!(r.body, b"hello");
        assert_eq!(r.header["X-A"], vec!["1", "2"]);
        assert_eq!(serde_json::to_value(&r).unwrap(), go);
        let nil: HttpRequest =
            serde_json::from_value(json!({"header": null, "body": null, "method": "GET"})).unwrap();
        assert!(nil.body.is_empty() && nil.header.is_empty());
        assert!(serde_json::from_value::<HttpRequest>(json!({"body": "not base64!"})).is_err());
    }

    #[test]
    fn http_response_uses_status_code() {
        let r = HttpResponse::edge_error(404, "error to call service");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["status_code"], 404);
        assert_eq!(v["header"]["Server"], json!(["kubeedge-edgecore"]));
        assert_eq!(v["body"], json!("ZXJyb3IgdG8gY2FsbCBzZXJ2aWNl"));
    }

    #[test]
    fn header_names_are_canonicalised_as_go_does() {
        assert_eq!(canonical_header_name("content-type"), "Content-Type");
        assert_eq!(canonical_header_name("X-FOO-bar"), "X-Foo-Bar");
        assert_eq!(canonical_header_name("weird name"), "weird name");
        assert!(is_hop_by_hop("Transfer-Encoding") && is_hop_by_hop("host"));
        assert!(!is_hop_by_hop("Content-Type"));
    }

    #[test]
    fn service_calls_only_reach_a_local_port() {
        let c = ServiceCall::parse("8080:/hello?x=1").unwrap();
        assert_eq!(c.url(), "http://127.0.0.1:8080/hello?x=1");
        assert_eq!(c.resource(), "8080:/hello?x=1");
        assert_eq!(ServiceCall::parse("80:").unwrap().path, "/");
        for bad in [
            "8080",
            ":/x",
            "0:/x",
            "99999:/x",
            "80x:/x",
            "80:@evil.example/",
            "80:evil/x",
            "80://evil.example/x",
            "80:/a b",
            "80:/a#frag",
        ] {
            assert!(ServiceCall::parse(bad).is_err(), "{bad} accepted");
        }
        // A colon later in the path is part of the path.
        assert_eq!(ServiceCall::parse("80:/a:b").unwrap().path, "/a:b");
    }
}
