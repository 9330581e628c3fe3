//! Plain REST calls to the apiserver with the exact paths, verbs and patch types KubeEdge's
//! upstream controller uses, so edge-supplied objects pass through field for field.

use http::{Method, Request};
use kubeedge_shared::StatusError;
use serde_json::Value;
use std::time::Duration;

/// The REST path of a core/v1 or coordination/v1 object.
pub fn path(kind: Kind, namespace: Option<&str>, name: Option<&str>, sub: Option<&str>) -> String {
    let (prefix, plural) = kind.group_plural();
    let mut p = prefix.to_string();
    if let Some(ns) = namespace.filter(|_| kind.namespaced()) {
        p.push_str("/namespaces/");
        p.push_str(ns);
    }
    p.push('/');
    p.push_str(plural);
    if let Some(n) = name {
        p.push('/');
        p.push_str(n);
    }
    if let Some(s) = sub {
        p.push('/');
        p.push_str(s);
    }
    p
}

/// Why `s` may not be a namespace or name in a REST path: client-go's
/// `IsValidPathSegmentName` (no `.`/`..`, `/` or `%`), plus what would end or break the path
/// here (`?`, `#`, whitespace, control characters). Edge-supplied names are checked with it so
/// they cannot point a request at another path.
pub fn invalid_segment(s: &str) -> Option<String> {
    if s.is_empty() || s == "." || s == ".." {
        return Some(format!("{s:?} may not be a name"));
    }
    s.chars()
        .find(|c| matches!(c, '/' | '%' | '?' | '#') || c.is_whitespace() || c.is_control())
        .map(|c| format!("{s:?} may not contain {c:?}"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Node,
    Pod,
    ConfigMap,
    Secret,
    ServiceAccount,
    PersistentVolume,
    PersistentVolumeClaim,
    VolumeAttachment,
    Lease,
    Event,
    Service,
    Endpoints,
    EndpointSlice,
}

impl Kind {
    /// The resource as the apiserver names it in messages (`endpointslices.discovery.k8s.io`).
    pub fn qualified_resource(self) -> String {
        let (prefix, plural) = self.group_plural();
        match prefix
            .strip_prefix("/apis/")
            .and_then(|g| g.split('/').next())
        {
            Some(group) => format!("{plural}.{group}"),
            None => plural.to_string(),
        }
    }

    fn group_plural(self) -> (&'static str, &'static str) {
        match self {
            Kind::Node => ("/api/v1", "nodes"),
            Kind::Pod => ("/api/v1", "pods"),
            Kind::ConfigMap => ("/api/v1", "configmaps"),
            Kind::Secret => ("/api/v1", "secrets"),
            Kind::ServiceAccount => ("/api/v1", "serviceaccounts"),
            Kind::PersistentVolume => ("/api/v1", "persistentvolumes"),
            Kind::PersistentVolumeClaim => ("/api/v1", "persistentvolumeclaims"),
            Kind::VolumeAttachment => ("/apis/storage.k8s.io/v1", "volumeattachments"),
            Kind::Lease => ("/apis/coordination.k8s.io/v1", "leases"),
            Kind::Event => ("/api/v1", "events"),
            Kind::Service => ("/api/v1", "services"),
            Kind::Endpoints => ("/api/v1", "endpoints"),
            Kind::EndpointSlice => ("/apis/discovery.k8s.io/v1", "endpointslices"),
        }
    }

    pub fn namespaced(self) -> bool {
        !matches!(
            self,
            Kind::Node | Kind::PersistentVolume | Kind::VolumeAttachment
        )
    }

    /// `apiVersion` and `kind` stamped on objects sent to the edge.
    /// The kind of an object sent to or asked for by an edge under this resource type.
    pub fn of_resource_type(t: &kubeedge_shared::ResourceType) -> Option<Kind> {
        use kubeedge_shared::ResourceType as RT;
        Some(match t {
            RT::Node => Kind::Node,
            RT::Pod => Kind::Pod,
            RT::ConfigMap => Kind::ConfigMap,
            RT::Secret => Kind::Secret,
            RT::PersistentVolume => Kind::PersistentVolume,
            RT::PersistentVolumeClaim => Kind::PersistentVolumeClaim,
            RT::VolumeAttachment => Kind::VolumeAttachment,
            RT::Lease => Kind::Lease,
            RT::Event => Kind::Event,
            RT::Service => Kind::Service,
            RT::Endpoints => Kind::Endpoints,
            RT::EndpointSlice => Kind::EndpointSlice,
            _ => return None,
        })
    }

    pub fn type_meta(self) -> (&'static str, &'static str) {
        match self {
            Kind::Node => ("v1", "Node"),
            Kind::Pod => ("v1", "Pod"),
            Kind::ConfigMap => ("v1", "ConfigMap"),
            Kind::Secret => ("v1", "Secret"),
            Kind::ServiceAccount => ("v1", "ServiceAccount"),
            Kind::PersistentVolume => ("v1", "PersistentVolume"),
            Kind::PersistentVolumeClaim => ("v1", "PersistentVolumeClaim"),
            Kind::VolumeAttachment => ("storage.k8s.io/v1", "VolumeAttachment"),
            Kind::Lease => ("coordination.k8s.io/v1", "Lease"),
            Kind::Event => ("v1", "Event"),
            Kind::Service => ("v1", "Service"),
            Kind::Endpoints => ("v1", "Endpoints"),
            Kind::EndpointSlice => ("discovery.k8s.io/v1", "EndpointSlice"),
        }
    }
}

/// Sets `apiVersion`/`kind` (the edge's MetaServer refuses objects without them).
pub fn with_type_meta(mut obj: Value, kind: Kind) -> Value {
    let (v, k) = kind.type_meta();
    if let Some(m) = obj.as_object_mut() {
        m.entry("apiVersion")
            .or_insert_with(|| Value::String(v.into()));
        m.entry("kind").or_insert_with(|| Value::String(k.into()));
    }
    obj
}

pub const MERGE_PATCH: &str = "application/merge-patch+json";
pub const STRATEGIC_PATCH: &str = "application/strategic-merge-patch+json";

/// Sends one request; apiserver errors come back as `kube::Error::Api`.
pub async fn call(
    client: &kube::Client,
    method: Method,
    path: &str,
    content_type: &str,
    body: Option<&Value>,
) -> Result<Value, kube::Error> {
    let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::ACCEPT, "application/json")
        .body(bytes)
        .map_err(kube::Error::HttpError)?;
    client.request::<Value>(req).await
}

/// `call`, retried with backoff on errors worth retrying (429, 5xx, transport).
pub async fn call_retrying(
    client: &kube::Client,
    method: Method,
    path: &str,
    content_type: &str,
    body: Option<&Value>,
) -> Result<Value, kube::Error> {
    let mut delay = Duration::from_millis(100);
    let mut attempt = 0;
    loop {
        match call(client, method.clone(), path, content_type, body).await {
            Err(e) if attempt < 4 && retriable(&e) => {
                attempt += 1;
                tracing::debug!(%path, error = %e, attempt, "apiserver call failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            other => return other,
        }
    }
}

fn retriable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// The edge's view of an apiserver error: Go's `StatusError` JSON.
pub fn status_error(e: &kube::Error) -> StatusError {
    match e {
        kube::Error::Api(s) => {
            let mut err = StatusError::new(i32::from(s.code), &s.reason, s.message.clone());
            err.err_status.details = s
                .details
                .as_ref()
                .and_then(|d| serde_json::to_value(d).ok());
            err
        }
        other => StatusError::new(500, "InternalError", other.to_string()),
    }
}

pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_change_the_path_are_invalid() {
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "../../secrets/x",
            "a%2Fb",
            "a?dryRun=All",
            "a#b",
            "a b",
            "a\nb",
        ] {
            assert!(invalid_segment(bad).is_some(), "{bad:?}");
        }
        for good in [
            "edge-1",
            "kube-node-lease",
            "web.17a3f0c2",
            "system:node:x",
            "a..b",
        ] {
            assert_eq!(invalid_segment(good), None, "{good:?}");
        }
    }

    #[test]
    fn paths_follow_the_rest_layout() {
        assert_eq!(
            path(Kind::Pod, Some("ns"), Some("p"), Some("status")),
            "/api/v1/namespaces/ns/pods/p/status"
        );
        assert_eq!(
            path(Kind::Node, Some("default"), Some("edge-1"), None),
            "/api/v1/nodes/edge-1"
        );
        assert_eq!(
            path(Kind::Lease, Some("kube-node-lease"), Some("e"), None),
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/e"
        );
        assert_eq!(
            path(Kind::VolumeAttachment, None, Some("va"), None),
            "/apis/storage.k8s.io/v1/volumeattachments/va"
        );
        assert_eq!(
            path(
                Kind::ServiceAccount,
                Some("ns"),
                Some("default"),
                Some("token")
            ),
            "/api/v1/namespaces/ns/serviceaccounts/default/token"
        );
    }
}
