//! Content shapes KubeEdge uses (protocol §1.2, §2.2, §4.2).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Success content: the JSON string `"OK"` (`MessageSuccessfulContent`).
pub const OK: &str = "OK";

pub fn ok() -> Value {
    Value::String(OK.to_string())
}

pub fn is_ok(content: &Value) -> bool {
    content.as_str() == Some(OK)
}

/// A Kubernetes `metav1.Status` as Go serialises it inside a `StatusError`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    #[serde(default)]
    pub metadata: Map<String, Value>,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    #[serde(default)]
    pub code: i32,
}

/// `*errors.StatusError` as `encoding/json` writes it: `{"ErrStatus":{…}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusError {
    /// Boxed: keeps `Result<_, StatusError>` small.
    #[serde(rename = "ErrStatus")]
    pub err_status: Box<Status>,
}

impl StatusError {
    pub fn new(code: i32, reason: &str, message: impl Into<String>) -> Self {
        StatusError {
            err_status: Box::new(Status {
                metadata: Map::new(),
                status: "Failure".into(),
                message: message.into(),
                reason: reason.into(),
                details: None,
                code,
            }),
        }
    }

    pub fn not_found(kind: &str, name: &str) -> Self {
        let mut e = Self::new(404, "NotFound", format!("{kind} \"{name}\" not found"));
        e.err_status.details = Some(serde_json::json!({"name": name, "kind": kind}));
        e
    }

    pub fn already_exists(kind: &str, name: &str) -> Self {
        let mut e = Self::new(
            409,
            "AlreadyExists",
            format!("{kind} \"{name}\" already exists"),
        );
        e.err_status.details = Some(serde_json::json!({"name": name, "kind": kind}));
        e
    }

    pub fn reason(&self) -> &str {
        &self.err_status.reason
    }

    pub fn code(&self) -> i32 {
        self.err_status.code
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// Reads a StatusError from content, if the content is one (`{"ErrStatus":…}`).
    pub fn from_content(content: &Value) -> Option<Self> {
        content.get("ErrStatus")?;
        serde_json::from_value(content.clone()).ok()
    }
}

/// `common/types.ObjectResp`: `{"Object":<object or null>,"Err":<StatusError or null>}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectResp {
    #[serde(rename = "Object", default)]
    pub object: Option<Value>,
    #[serde(rename = "Err", default, deserialize_with = "zero_err_is_none")]
    pub err: Option<StatusError>,
}

/// The Go edge decodes `Err` into a value type; an all-zero `{"ErrStatus":{…}}` means success.
///
/// `Err` is a Go `error` interface (`upstream.go`'s `ObjectResp`), so it is whatever
/// `encoding/json` makes of the error's struct: a `*StatusError` gives `{"ErrStatus":{…}}`, but
/// a transport failure of client-go (`*url.Error`) gives `{"Op":"Put","URL":"…","Err":{}}` and
/// an `errors.New` value gives `{}`. Those are failures too (the `Object` next to them is the
/// empty object client-go returns on error), reported as a 500 carrying the JSON text.
fn zero_err_is_none<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<StatusError>, D::Error> {
    let v = Value::deserialize(d)?;
    if v.is_null() {
        return Ok(None);
    }
    if v.get("ErrStatus").is_some()
        && let Ok(e) = serde_json::from_value::<StatusError>(v.clone())
    {
        return Ok(Some(e).filter(|e| e.err_status.code != 0 || !e.err_status.reason.is_empty()));
    }
    Ok(Some(StatusError::new(
        500,
        "InternalError",
        format!("the cloud reported a non-API error: {v}"),
    )))
}

impl ObjectResp {
    pub fn object(object: Value) -> Self {
        ObjectResp {
            object: Some(object),
            err: None,
        }
    }

    pub fn error(err: StatusError) -> Self {
        ObjectResp {
            object: None,
            err: Some(err),
        }
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// Reads an ObjectResp from content when it has that shape.
    pub fn from_content(content: &Value) -> Option<Self> {
        let map = content.as_object()?;
        if !map.contains_key("Object") && !map.contains_key("Err") {
            return None;
        }
        serde_json::from_value(content.clone()).ok()
    }
}

/// Patches travel as a JSON *string* holding the patch document.
pub fn patch_content(patch: &Value) -> Value {
    Value::String(patch.to_string())
}

/// `GetContentData`: a string content is its own bytes; anything else is re-marshalled JSON.
pub fn content_bytes(content: &Value) -> Vec<u8> {
    match content {
        Value::String(s) => s.as_bytes().to_vec(),
        other => other.to_string().into_bytes(),
    }
}

/// Reads content that may be either a JSON value or a JSON string holding JSON.
pub fn content_json(content: &Value) -> Result<Value, serde_json::Error> {
    match content {
        Value::String(s) => serde_json::from_str(s),
        other => Ok(other.clone()),
    }
}

/// A metamanager query reply: a JSON array of JSON strings (the stored values).
pub fn query_reply<I, S>(values: I) -> Value
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    Value::Array(
        values
            .into_iter()
            .map(|s| Value::String(s.into()))
            .collect(),
    )
}

/// Reads the objects of a query reply, whichever shape it has: an array of JSON strings (from
/// the edge database), an array of objects, or a single bare object (from the cloud).
pub fn parse_query_reply(content: &Value) -> Result<Vec<Value>, serde_json::Error> {
    match content {
        Value::Array(items) => items.iter().map(content_json).collect(),
        Value::Null => Ok(Vec::new()),
        other => Ok(vec![content_json(other)?]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn object_resp_shapes() {
        let ok = ObjectResp::object(json!({"kind": "Node"}));
        assert_eq!(
            ok.to_value(),
            json!({"Object": {"kind": "Node"}, "Err": null})
        );
        let err = ObjectResp::error(StatusError::already_exists("nodes", "edge-1"));
        let v = err.to_value();
        assert_eq!(v["Object"], Value::Null);
        assert_eq!(v["Err"]["ErrStatus"]["reason"], "AlreadyExists");
        assert_eq!(v["Err"]["ErrStatus"]["code"], 409);
        assert_eq!(ObjectResp::from_content(&v), Some(err));
    }

    #[test]
    fn zero_err_status_means_success() {
        let v = json!({"Object": {"a": 1}, "Err": {"ErrStatus": {"metadata": {}, "status": "", "code": 0}}});
        let r = ObjectResp::from_content(&v).unwrap();
        assert!(r.err.is_none());
    }

    /// `cloud/pkg/edgecontroller/controller/upstream.go` (`createOrUpdateLease`, `patchNode`)
    /// replies `FillBody(&ObjectResp{Object: resp, Err: err})`; when client-go fails below HTTP
    /// status level, `err` is a `*url.Error` and `resp` the empty object it returns on error.
    #[test]
    fn non_status_go_errors_are_failures() {
        let url_error = json!({
            "Object": {"metadata": {"creationTimestamp": null}, "spec": {}},
            "Err": {"Op": "Put", "URL": "https://10.96.0.1:443/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-1", "Err": {}}
        });
        let r = ObjectResp::from_content(&url_error).expect("still an ObjectResp");
        let e = r.err.expect("a failure");
        assert_eq!(e.code(), 500);
        assert!(e.err_status.message.contains("leases/edge-1"));
        let bare = json!({"Object": null, "Err": {}});
        assert!(ObjectResp::from_content(&bare).unwrap().err.is_some());
        let ok = json!({"Object": {"kind": "Lease"}, "Err": null});
        assert!(ObjectResp::from_content(&ok).unwrap().err.is_none());
    }

    #[test]
    fn query_replies_parse_in_every_shape() {
        let db = query_reply([r#"{"a":1}"#, r#"{"b":2}"#]);
        assert_eq!(
            parse_query_reply(&db).unwrap(),
            vec![json!({"a":1}), json!({"b":2})]
        );
        assert_eq!(
            parse_query_reply(&json!({"c":3})).unwrap(),
            vec![json!({"c":3})]
        );
        assert!(parse_query_reply(&json!(["not json"])).is_err());
    }

    #[test]
    fn patches_travel_as_strings() {
        let p = patch_content(&json!({"status": {"phase": "Running"}}));
        assert!(p.is_string());
        assert_eq!(content_json(&p).unwrap()["status"]["phase"], "Running");
        assert_eq!(
            content_bytes(&p),
            br#"{"status":{"phase":"Running"}}"#.to_vec()
        );
    }
}
