//! The beehive message exactly as it crosses the WebSocket (protocol §1.1).

use crate::content;
use crate::operation::{Group, Operation, source};
use crate::resource::ResourcePath;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use std::time::{SystemTime, UNIX_EPOCH};

/// One KubeEdge message: `{"header":…,"route":…,"content":…}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub header: Header,
    #[serde(rename = "route", default)]
    pub route: Route,
    /// Any JSON; `null` when absent, as Go writes a nil interface.
    #[serde(default)]
    pub content: Value,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Header {
    #[serde(rename = "msg_id", default)]
    pub id: String,
    #[serde(
        rename = "parent_msg_id",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub parent_id: String,
    /// Milliseconds since the Unix epoch; always written as a JSON integer.
    #[serde(default, deserialize_with = "lenient_millis")]
    pub timestamp: i64,
    #[serde(
        rename = "resourceversion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub resource_version: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sync: bool,
    #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
    pub message_type: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Route {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub destination: String,
    #[serde(default, skip_serializing_if = "Group::is_empty")]
    pub group: Group,
    #[serde(default, skip_serializing_if = "Operation::is_empty")]
    pub operation: Operation,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource: String,
}

/// Go writes int64 milliseconds; accept a float too (some encoders emit `1.7e12`).
fn lenient_millis<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(0),
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
            .ok_or_else(|| serde::de::Error::custom("timestamp out of range")),
        other => Err(serde::de::Error::custom(format!(
            "timestamp must be an integer, got {other}"
        ))),
    }
}

pub fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

pub fn new_message_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

impl Message {
    /// A fresh message (`NewMessage("")` + `BuildRouter`).
    pub fn new(
        source: &str,
        group: Group,
        operation: Operation,
        resource: impl Into<String>,
        content: Value,
    ) -> Self {
        Message {
            header: Header {
                id: new_message_id(),
                timestamp: now_millis(),
                ..Header::default()
            },
            route: Route {
                source: source.to_string(),
                group,
                operation,
                resource: resource.into(),
                ..Route::default()
            },
            content,
        }
    }

    /// `NewRespByMessage`: the response/ACK shape. Source, group, resource and type are copied
    /// from the request (not swapped), parent = request id, operation `response`.
    pub fn response_to(req: &Message, content: Value) -> Self {
        Message {
            header: Header {
                id: new_message_id(),
                parent_id: req.header.id.clone(),
                timestamp: now_millis(),
                message_type: req.header.message_type.clone(),
                ..Header::default()
            },
            route: Route {
                source: req.route.source.clone(),
                group: req.route.group.clone(),
                operation: Operation::Response,
                resource: req.route.resource.clone(),
                ..Route::default()
            },
            content,
        }
    }

    /// The edge's ACK for a delivered message: a response with content `"OK"`.
    pub fn ack_for(req: &Message) -> Self {
        Self::response_to(req, content::ok())
    }

    /// `NewErrorMessage` with KubeEdge HEAD's (fixed) parent: the request's own id.
    pub fn error_to(req: &Message, text: impl Into<String>) -> Self {
        let mut m = Self::response_to(req, Value::String(text.into()));
        m.route.operation = Operation::Error;
        m
    }

    /// The edge's application keepalive (protocol §2.3).
    pub fn keepalive() -> Self {
        Self::new(
            source::EDGEHUB,
            Group::Resource,
            Operation::Keepalive,
            "node",
            Value::String("ping".into()),
        )
    }

    pub fn with_parent(mut self, parent_id: impl Into<String>) -> Self {
        self.header.parent_id = parent_id.into();
        self
    }

    pub fn with_resource_version(mut self, rv: impl Into<String>) -> Self {
        self.header.resource_version = rv.into();
        self
    }

    pub fn id(&self) -> &str {
        &self.header.id
    }

    pub fn parent_id(&self) -> &str {
        &self.header.parent_id
    }

    pub fn operation(&self) -> &Operation {
        &self.route.operation
    }

    pub fn group(&self) -> &Group {
        &self.route.group
    }

    pub fn resource(&self) -> &str {
        &self.route.resource
    }

    /// The resource path of this message as seen on the wire (`<ns>/<type>[/<name>]`).
    pub fn resource_path(&self) -> Result<ResourcePath, crate::ResourceError> {
        ResourcePath::parse(&self.route.resource)
    }

    /// The resource type token, from either wire or cloud-internal form, if present.
    pub fn resource_type(&self) -> Option<&str> {
        crate::resource::resource_type_of(&self.route.resource)
    }

    /// `metadata.uid` of the object carried in `content`, if any.
    pub fn object_uid(&self) -> Option<&str> {
        self.content.get("metadata")?.get("uid")?.as_str()
    }

    /// True for deletes: operation `delete` or an object carrying `metadata.deletionTimestamp`.
    pub fn is_delete(&self) -> bool {
        self.route.operation == Operation::Delete
            || self
                .content
                .get("metadata")
                .and_then(|m| m.get("deletionTimestamp"))
                .is_some_and(|t| !t.is_null())
    }

    /// KubeEdge's `noAckRequired` (protocol §3.1), inverted: does the cloud wait for the
    /// edge's ACK (and resend until it comes) for this downstream message?
    pub fn requires_ack(&self) -> bool {
        let resource = self.route.resource.as_str();
        let op = &self.route.operation;
        if [
            "podlist",
            "membership",
            "twin/cloud_updated",
            "serviceaccounttoken",
            "k8s/ca.crt",
        ]
        .iter()
        .any(|s| resource.contains(s))
        {
            return false;
        }
        if op.is_csi_volume_op() || *op == Operation::ApplicationResponse {
            return false;
        }
        if self.route.group == Group::User
            || self.route.source == source::NODE_UPGRADE_JOB_CONTROLLER
            || self.route.source == crate::nodetask::TASK_MANAGER
        {
            return false;
        }
        if *op == Operation::Response {
            let ok_or_error = content::is_ok(&self.content)
                || self.content.get("ErrStatus").is_some()
                || self.content.get("Err").is_some_and(|e| !e.is_null());
            if ok_or_error {
                return false;
            }
        }
        if self.route.source == source::EDGE_CONTROLLER {
            match self.resource_type() {
                Some(
                    "node"
                    | "lease"
                    | "nodepatch"
                    | "podpatch"
                    | "podstatus"
                    | "certificatesigningrequest",
                ) => return false,
                Some("pod") if *op == Operation::Response => return false,
                _ => {}
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod_update() -> Message {
        Message::new(
            source::EDGE_CONTROLLER,
            Group::Resource,
            Operation::Update,
            "default/pod/web-0",
            json!({"metadata": {"uid": "u1", "name": "web-0"}}),
        )
        .with_resource_version("12")
    }

    #[test]
    fn ack_copies_route_and_sets_parent() {
        let req = pod_update();
        let ack = Message::ack_for(&req);
        assert_eq!(ack.parent_id(), req.id());
        assert_ne!(ack.id(), req.id());
        assert_eq!(ack.route.source, "edgecontroller");
        assert_eq!(ack.route.group, Group::Resource);
        assert_eq!(ack.route.operation, Operation::Response);
        assert_eq!(ack.route.resource, "default/pod/web-0");
        assert_eq!(ack.content, json!("OK"));
    }

    #[test]
    fn ack_classification_follows_kubeedge() {
        assert!(pod_update().requires_ack());
        let mut m = pod_update();
        m.route.resource = "default/podlist/x".into();
        assert!(!m.requires_ack());
        let mut m = pod_update();
        m.route.resource = "kube-node-lease/lease/edge-1".into();
        assert!(!m.requires_ack());
        let query_reply = Message::response_to(&pod_update(), json!({"metadata": {"uid": "c"}}));
        let mut cm_reply = query_reply.clone();
        cm_reply.route.resource = "default/configmap/cfg".into();
        assert!(
            cm_reply.requires_ack(),
            "configmap query replies carry objects"
        );
        let ok = Message::response_to(&pod_update(), json!("OK"));
        assert!(!ok.requires_ack());
    }

    #[test]
    fn deletes_are_recognised_by_operation_or_deletion_timestamp() {
        let mut m = pod_update();
        assert!(!m.is_delete());
        m.content["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        assert!(m.is_delete());
    }

    #[test]
    fn float_timestamp_is_accepted() {
        let m: Message = serde_json::from_str(
            r#"{"header":{"msg_id":"a","timestamp":1.718e12},"route":{},"content":null}"#,
        )
        .unwrap();
        assert_eq!(m.header.timestamp, 1_718_000_000_000);
    }
}
