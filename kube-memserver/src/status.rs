//! Kubernetes `Status` errors, shaped like the ones `k8s.io/apimachinery/pkg/api/errors` builds.

use serde_json::{Value, json};

use super::resources::ResourceInfo;

/// One field problem inside an `Invalid` (422) error.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    pub reason: &'static str,
    pub field: String,
    pub message: String,
}

impl Cause {
    pub fn required(field: impl Into<String>, detail: &str) -> Self {
        let message = if detail.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {detail}")
        };
        Self {
            reason: "FieldValueRequired",
            field: field.into(),
            message,
        }
    }

    pub fn invalid(field: impl Into<String>, value: &Value, detail: &str) -> Self {
        let shown = match value {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        Self {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: format!("Invalid value: {shown}: {detail}"),
        }
    }

    /// `invalid` with the value already formatted as the Go server prints it.
    pub fn invalid_shown(field: impl Into<String>, shown: &str, detail: &str) -> Self {
        Self {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: format!("Invalid value: {shown}: {detail}"),
        }
    }

    pub fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        Self {
            reason: "FieldValueForbidden",
            field: field.into(),
            message: format!("Forbidden: {detail}"),
        }
    }

    pub fn duplicate(field: impl Into<String>, value: &Value) -> Self {
        Self {
            reason: "FieldValueDuplicate",
            field: field.into(),
            message: format!("Duplicate value: {value}"),
        }
    }

    pub fn not_supported(field: impl Into<String>, value: &Value, allowed: &[&str]) -> Self {
        let quoted: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
        Self {
            reason: "FieldValueNotSupported",
            field: field.into(),
            message: format!(
                "Unsupported value: {value}: supported values: {}",
                quoted.join(", ")
            ),
        }
    }
}

/// An API error that renders as a `Status` object with the matching HTTP code.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

pub type ApiResult<T> = Result<T, ApiError>;

/// `pods` or `leases.coordination.k8s.io`, as the real apiserver prints a qualified resource.
fn qualified(info: &ResourceInfo) -> String {
    if info.group.is_empty() {
        info.plural.clone()
    } else {
        format!("{}.{}", info.plural, info.group)
    }
}

fn resource_details(info: &ResourceInfo, name: &str) -> Value {
    let mut d = json!({ "name": name, "kind": info.plural });
    if !info.group.is_empty() {
        d["group"] = json!(info.group);
    }
    d
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn forbidden(info: &ResourceInfo, name: &str, message: impl AsRef<str>) -> Self {
        let q = qualified(info);
        let mut e = Self::new(
            403,
            "Forbidden",
            format!("{q} {name:?} is forbidden: {}", message.as_ref()),
        );
        e.details = Some(resource_details(info, name));
        e
    }

    pub fn not_found(info: &ResourceInfo, name: &str) -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            format!("{} {name:?} not found", qualified(info)),
        );
        e.details = Some(resource_details(info, name));
        e
    }

    /// A 404 for a path no resource is served at (the real server answers plain "404 page not found"
    /// for unknown paths, and a NotFound Status for unknown resources inside a served group).
    pub fn path_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub fn namespace_not_found(ns: &str) -> Self {
        let mut e = Self::new(404, "NotFound", format!("namespaces {ns:?} not found"));
        e.details = Some(json!({ "name": ns, "kind": "namespaces" }));
        e
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    pub fn already_exists(info: &ResourceInfo, name: &str) -> Self {
        let mut e = Self::new(
            409,
            "AlreadyExists",
            format!("{} {name:?} already exists", qualified(info)),
        );
        e.details = Some(resource_details(info, name));
        e
    }

    pub fn conflict(info: &ResourceInfo, name: &str, why: &str) -> Self {
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {name:?}: {why}",
                qualified(info)
            ),
        );
        e.details = Some(resource_details(info, name));
        e
    }

    pub fn stale(info: &ResourceInfo, name: &str) -> Self {
        Self::conflict(
            info,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// Watch from a resource version older than the retained history.
    pub fn too_old(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// A list `continue` token whose snapshot is gone.
    pub fn continue_expired() -> Self {
        Self::new(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. \
             You can start a new list without the continue parameter, or use the continue token \
             in this response to retrieve the remainder of the results. Continuing with the \
             provided token results in an inconsistent list - objects that were created, \
             modified, or deleted between the time the first chunk was returned and now may show \
             up in the list.",
        )
    }

    pub fn request_entity_too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {content_type:?})"
            ),
        )
    }

    pub fn unsupported_patch(content_type: &str, accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {} (got {content_type:?})",
                accepted.join(", ")
            ),
        )
    }

    /// 422 with field causes; `kind` is the object's Kind, as the real server reports it.
    pub fn invalid(info: &ResourceInfo, name: &str, causes: Vec<Cause>) -> Self {
        let parts: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let summary = if parts.len() == 1 {
            parts[0].clone()
        } else {
            format!("[{}]", parts.join(", "))
        };
        let mut details = json!({ "name": name, "kind": info.kind });
        if !info.group.is_empty() {
            details["group"] = json!(info.group);
        }
        details["causes"] = Value::Array(
            causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect(),
        );
        Self {
            code: 422,
            reason: "Invalid",
            message: format!("{} {name:?} is invalid: {summary}", info.kind),
            details: Some(details),
        }
    }

    /// A 422 without field causes (JSON patch application failures answer this way).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// A plain error turned into a Status (`ErrorToAPIStatus`): 500 without a reason.
    pub fn unknown(message: impl Into<String>) -> Self {
        Self::new(500, "", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", Into::<String>::into(message)),
        )
    }

    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            s["reason"] = json!(self.reason);
        }
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

impl ApiError {
    /// Re-labels an Invalid error for a non-resource kind (e.g. ListOptions).
    pub fn with_kind(mut self, kind: &str, group: &str) -> Self {
        if let Some(d) = &mut self.details {
            d["kind"] = json!(kind);
            d["group"] = json!(group);
            d["name"] = json!("");
        }
        if let Some(rest) = self
            .message
            .split_once(" is invalid: ")
            .map(|(_, r)| r.to_string())
        {
            self.message = format!("{kind}.{group} \"\" is invalid: {rest}");
        }
        self
    }
}

/// The `Status` a successful DELETE answers with for kinds that do not return the deleted object.
pub fn deleted_status(info: &ResourceInfo, name: &str, uid: &str) -> Value {
    let mut details = json!({ "name": name, "kind": info.plural, "uid": uid });
    if !info.group.is_empty() {
        details["group"] = json!(info.group);
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    })
}
