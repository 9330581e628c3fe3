//! KubeEdge's MetaServer ⇄ dynamiccontroller "Application" (devices reference §6.4): a Kubernetes
//! API request of an edge application carried to the cloud, and its answer.
//!
//! Request: `source metaserver`, group `dynamiccontroller`, operation and resource `null`,
//! content = the Application. Answer: `source dynamiccontroller`, group `resource`, operation
//! `applicationResponse`, resource `ignore/Application/ignore`, parent = the request's id.
//! Watch registrations are synchronised with resource `watchapp/sync` (content: a map of
//! Application ID → Application).

use crate::operation::{Group, Operation, source};
use crate::{Message, StatusError};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub const RESPONSE_RESOURCE: &str = "ignore/Application/ignore";
pub const WATCH_SYNC_RESOURCE: &str = "watchapp/sync";

/// Application status values.
pub mod status {
    pub const IN_APPLYING: &str = "InApplying";
    pub const APPROVED: &str = "Approved";
    pub const REJECTED: &str = "Rejected";
    pub const FAILED: &str = "Failed";
}

/// The Application, with KubeEdge's JSON names (Go field names; byte slices as base64).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Application {
    #[serde(rename = "ID", default)]
    pub id: String,
    #[serde(rename = "Key", default)]
    pub key: String,
    #[serde(rename = "Verb", default)]
    pub verb: String,
    #[serde(rename = "Nodename", default)]
    pub nodename: String,
    /// base64 of the options JSON.
    #[serde(rename = "Option", default, with = "b64")]
    pub option: Vec<u8>,
    /// base64 of the request body JSON, or null.
    #[serde(rename = "ReqBody", default, with = "b64")]
    pub req_body: Vec<u8>,
    #[serde(rename = "Subresource", default)]
    pub subresource: String,
    /// base64 of the answer JSON, or null.
    #[serde(rename = "RespBody", default, with = "b64")]
    pub resp_body: Vec<u8>,
    #[serde(rename = "Status", default)]
    pub status: String,
    #[serde(rename = "Reason", default)]
    pub reason: String,
    #[serde(rename = "Error", default = "empty_error")]
    pub error: Value,
    #[serde(rename = "Timestamp", default = "zero_time")]
    pub timestamp: String,
}

fn empty_error() -> Value {
    json!({"ErrStatus": {"metadata": {}}})
}

fn zero_time() -> String {
    "0001-01-01T00:00:00Z".into()
}

mod b64 {
    use super::STANDARD;
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        if v.is_empty() {
            s.serialize_none()
        } else {
            s.serialize_str(&STANDARD.encode(v))
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(Vec::new()),
            Some(s) => STANDARD.decode(s).map_err(serde::de::Error::custom),
        }
    }
}

impl Application {
    /// A new Application; its ID is KubeEdge's: hex SHA-256 of node + key + verb + option +
    /// body + subresource.
    pub fn new(
        node: &str,
        key: &str,
        verb: &str,
        option: Vec<u8>,
        req_body: Vec<u8>,
        subresource: &str,
    ) -> Application {
        let mut h = Sha256::new();
        for part in [
            node.as_bytes(),
            key.as_bytes(),
            verb.as_bytes(),
            &option,
            &req_body,
            subresource.as_bytes(),
        ] {
            h.update(part);
        }
        let id = h
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>();
        Application {
            id,
            key: key.to_string(),
            verb: verb.to_string(),
            nodename: node.to_string(),
            option,
            req_body,
            subresource: subresource.to_string(),
            resp_body: Vec::new(),
            status: status::IN_APPLYING.into(),
            reason: String::new(),
            error: empty_error(),
            timestamp: zero_time(),
        }
    }

    /// The edge's request message.
    pub fn to_request(&self) -> Message {
        Message::new(
            source::METASERVER,
            Group::DynamicController,
            Operation::Null,
            "null",
            serde_json::to_value(self).unwrap_or(Value::Null),
        )
    }

    /// True for messages an edge sends the dynamic controller (requests and watch syncs).
    pub fn is_request(msg: &Message) -> bool {
        msg.route.source == source::METASERVER && msg.route.group == Group::DynamicController
    }

    /// Reads the Application a message carries (the content may be the object or JSON text).
    pub fn from_message(msg: &Message) -> Result<Application, String> {
        let v = crate::content::content_json(&msg.content).map_err(|e| e.to_string())?;
        serde_json::from_value(v).map_err(|e| format!("not an Application: {e}"))
    }

    /// The cloud's answer to `req` carrying this Application.
    pub fn to_response(&self, req: &Message) -> Message {
        Message::new(
            source::DYNAMIC_CONTROLLER,
            Group::Resource,
            Operation::ApplicationResponse,
            RESPONSE_RESOURCE,
            serde_json::to_value(self).unwrap_or(Value::Null),
        )
        .with_parent(req.header.id.clone())
    }

    /// Approved with `body` as the answer.
    pub fn approve(&mut self, body: &Value) {
        self.status = status::APPROVED.into();
        self.resp_body = serde_json::to_vec(body).unwrap_or_default();
    }

    /// Rejected with a Kubernetes Status (kept as `Error.ErrStatus`).
    pub fn reject(&mut self, e: &StatusError) {
        self.status = status::REJECTED.into();
        self.reason = e.err_status.message.clone();
        self.error = e.to_value();
    }

    /// The Kubernetes Status of a rejected Application, when it carries one.
    pub fn status_error(&self) -> Option<Value> {
        let s = self.error.get("ErrStatus")?;
        s.get("code").and_then(Value::as_u64).filter(|c| *c > 0)?;
        Some(s.clone())
    }
}

/// The parts of a `meta_v2`/Application key: `/<group or core>/<version>/<plural>/<ns or
/// null>/<name or null>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppKey {
    /// Empty for the core group.
    pub group: String,
    pub version: String,
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl AppKey {
    pub fn parse(key: &str) -> Result<AppKey, String> {
        let segs: Vec<&str> = key.split('/').skip(1).collect();
        let [g, v, r, ns, name] = segs.as_slice() else {
            return Err(format!(
                "key {key:?} is not /<group>/<version>/<resource>/<namespace>/<name>"
            ));
        };
        if [g, v, r, ns, name].iter().any(|s| s.is_empty()) {
            return Err(format!("key {key:?} has an empty segment"));
        }
        let opt = |s: &str| (s != "null").then(|| s.to_string());
        Ok(AppKey {
            group: if *g == "core" {
                String::new()
            } else {
                g.to_string()
            },
            version: v.to_string(),
            resource: r.to_string(),
            namespace: opt(ns),
            name: opt(name),
        })
    }

    pub fn to_key(&self) -> String {
        format!(
            "/{}/{}/{}/{}/{}",
            if self.group.is_empty() {
                "core"
            } else {
                &self.group
            },
            self.version,
            self.resource,
            self.namespace.as_deref().unwrap_or("null"),
            self.name.as_deref().unwrap_or("null")
        )
    }
}

/// Decodes a watch sync's content (Application ID → Application).
pub fn watch_sync_apps(msg: &Message) -> Result<Vec<Application>, String> {
    let v = crate::content::content_json(&msg.content).map_err(|e| e.to_string())?;
    let map: std::collections::BTreeMap<String, Application> =
        serde_json::from_value(v).map_err(|e| format!("not a watch sync: {e}"))?;
    Ok(map.into_values().collect())
}

/// The watch sync message of an edge (every watch it keeps).
pub fn watch_sync_request(apps: &[Application]) -> Message {
    let map: serde_json::Map<String, Value> = apps
        .iter()
        .map(|a| (a.id.clone(), serde_json::to_value(a).unwrap_or(Value::Null)))
        .collect();
    Message::new(
        source::METASERVER,
        Group::DynamicController,
        Operation::Null,
        WATCH_SYNC_RESOURCE,
        Value::Object(map),
    )
}

/// Decodes base64 (the `Data` of a PatchInfo).
pub fn decode_base64(s: &str) -> Result<Vec<u8>, String> {
    STANDARD.decode(s).map_err(|e| e.to_string())
}

/// base64 of `v`'s JSON (Application options).
pub fn encode_json(v: &Value) -> String {
    STANDARD.encode(serde_json::to_vec(v).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applications_round_trip_in_kubeedge_field_names() {
        let app = Application::new(
            "edge-1",
            "/core/v1/pods/default/null",
            "list",
            br#"{"labelSelector":"app=x"}"#.to_vec(),
            Vec::new(),
            "",
        );
        let v = serde_json::to_value(&app).unwrap();
        assert_eq!(v["Option"], "eyJsYWJlbFNlbGVjdG9yIjoiYXBwPXgifQ==");
        assert_eq!(v["ReqBody"], Value::Null);
        assert_eq!(v["Status"], "InApplying");
        assert_eq!(v["Error"], json!({"ErrStatus": {"metadata": {}}}));
        assert_eq!(app.id.len(), 64);
        let msg = app.to_request();
        assert!(Application::is_request(&msg));
        assert_eq!(msg.route.resource, "null");
        let back = Application::from_message(&msg).unwrap();
        assert_eq!(back, app);
        let mut answer = back.clone();
        answer.reject(&StatusError::new(403, "Forbidden", "no"));
        let reply = answer.to_response(&msg);
        assert_eq!(reply.header.parent_id, msg.header.id);
        assert_eq!(reply.route.operation.as_str(), "applicationResponse");
        let got = Application::from_message(&reply).unwrap();
        assert_eq!(got.status_error().unwrap()["code"], 403);
    }

    #[test]
    fn keys_parse_into_their_parts() {
        let k = AppKey::parse("/core/v1/pods/default/null").unwrap();
        assert_eq!(
            (
                k.group.as_str(),
                k.resource.as_str(),
                k.namespace.as_deref(),
                k.name.as_deref()
            ),
            ("", "pods", Some("default"), None)
        );
        assert_eq!(k.to_key(), "/core/v1/pods/default/null");
        assert!(AppKey::parse("/version").is_err());
        assert!(AppKey::parse("/a//c/d/e").is_err());
    }
}
