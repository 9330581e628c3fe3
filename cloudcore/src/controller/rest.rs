//! The apiserver calls of the upstream controller and the resyncs, with the verbs and patch
//! types KubeEdge's upstream controller uses. Requests are built by kube's dynamic API (an
//! `ApiResource` per [`Kind`], `kube::core::Request`, [`Patch`]) and answered as plain JSON,
//! so edge-supplied objects pass through field for field.

use kube::api::{DeleteParams, DynamicObject, GetParams, Patch, PatchParams};
use kube::api::{PostParams, Resource};
use kubeedge_shared::StatusError;
use kubeedge_shared::backoff::Backoff;

use super::kind::Kind;
use serde_json::Value;
use std::time::Duration;

/// A built request: method, path with query, headers and body.
pub type ApiRequest = http::Request<Vec<u8>>;

/// Requests for objects of `kind` in `namespace` (ignored for cluster-scoped kinds).
pub fn requests(kind: Kind, namespace: Option<&str>) -> kube::core::Request {
    let ns = namespace.filter(|_| kind.namespaced());
    kube::core::Request::new(DynamicObject::url_path(&kind.api_resource(), ns))
}

fn built(r: Result<ApiRequest, kube::core::request::Error>) -> Result<ApiRequest, kube::Error> {
    r.map_err(kube::Error::BuildRequest)
}

fn json_bytes(body: &Value) -> Vec<u8> {
    body.to_string().into_bytes()
}

/// `GET` one object.
pub fn get(kind: Kind, ns: Option<&str>, name: &str) -> Result<ApiRequest, kube::Error> {
    built(requests(kind, ns).get(name, &GetParams::default()))
}

/// `POST` an object to its collection.
pub fn create(kind: Kind, ns: Option<&str>, body: &Value) -> Result<ApiRequest, kube::Error> {
    built(requests(kind, ns).create(&PostParams::default(), json_bytes(body)))
}

/// `PUT` an object.
pub fn replace(
    kind: Kind,
    ns: Option<&str>,
    name: &str,
    body: &Value,
) -> Result<ApiRequest, kube::Error> {
    built(requests(kind, ns).replace(name, &PostParams::default(), json_bytes(body)))
}

/// `PATCH` an object, or its subresource `sub`.
pub fn patch(
    kind: Kind,
    ns: Option<&str>,
    name: &str,
    sub: Option<&str>,
    patch: &Patch<&Value>,
) -> Result<ApiRequest, kube::Error> {
    let pp = PatchParams::default();
    let r = requests(kind, ns);
    built(match sub {
        Some(sub) => r.patch_subresource(sub, name, &pp, patch),
        None => r.patch(name, &pp, patch),
    })
}

/// `PUT` subresource `sub` of an object (e.g. a CSR's `approval`).
pub fn replace_subresource(
    kind: Kind,
    ns: Option<&str>,
    name: &str,
    sub: &str,
    body: &Value,
) -> Result<ApiRequest, kube::Error> {
    let r = requests(kind, ns);
    built(r.replace_subresource(sub, name, &PostParams::default(), json_bytes(body)))
}

/// `POST` to subresource `sub` of an object (e.g. a service account's `token`).
pub fn create_subresource(
    kind: Kind,
    ns: Option<&str>,
    name: &str,
    sub: &str,
    body: &Value,
) -> Result<ApiRequest, kube::Error> {
    let r = requests(kind, ns);
    built(r.create_subresource(sub, name, &PostParams::default(), json_bytes(body)))
}

/// `DELETE` an object with the edge's `DeleteOptions` as the body, as sent.
pub fn delete(
    kind: Kind,
    ns: Option<&str>,
    name: &str,
    options: &Value,
) -> Result<ApiRequest, kube::Error> {
    let req = built(requests(kind, ns).delete(name, &DeleteParams::default()))?;
    let (parts, _) = req.into_parts();
    Ok(http::Request::from_parts(parts, json_bytes(options)))
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

/// A copy of `req` to send again.
fn copy(req: &ApiRequest) -> ApiRequest {
    let mut out = http::Request::new(req.body().clone());
    *out.method_mut() = req.method().clone();
    *out.uri_mut() = req.uri().clone();
    *out.headers_mut() = req.headers().clone();
    out
}

/// Sends one request; apiserver errors come back as `kube::Error::Api`.
pub async fn call(client: &kube::Client, mut req: ApiRequest) -> Result<Value, kube::Error> {
    req.headers_mut()
        .entry(http::header::ACCEPT)
        .or_insert(http::HeaderValue::from_static("application/json"));
    client.request::<Value>(req).await
}

/// `call`, retried with backoff on errors worth retrying (429, 5xx, transport).
pub async fn call_retrying(
    client: &kube::Client,
    req: Result<ApiRequest, kube::Error>,
) -> Result<Value, kube::Error> {
    let req = req?;
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(800));
    let mut attempt = 0;
    loop {
        match call(client, copy(&req)).await {
            Err(e) if attempt < 4 && retriable(&e) => {
                attempt += 1;
                let path = req.uri().path();
                tracing::debug!(%path, error = %e, attempt, "apiserver call failed; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
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
    use serde_json::json;

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

    fn target(r: Result<ApiRequest, kube::Error>) -> String {
        let r = r.unwrap();
        format!("{} {}", r.method(), r.uri())
    }

    #[test]
    fn requests_follow_the_rest_layout() {
        let p = json!({"status": {}});
        assert_eq!(
            target(patch(
                Kind::Pod,
                Some("ns"),
                "p",
                Some("status"),
                &Patch::Strategic(&p)
            )),
            "PATCH /api/v1/namespaces/ns/pods/p/status?"
        );
        assert_eq!(
            target(get(Kind::Node, Some("default"), "edge-1")),
            "GET /api/v1/nodes/edge-1"
        );
        assert_eq!(
            target(replace(Kind::Lease, Some("kube-node-lease"), "e", &p)),
            "PUT /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/e?"
        );
        assert_eq!(
            target(get(Kind::VolumeAttachment, None, "va")),
            "GET /apis/storage.k8s.io/v1/volumeattachments/va"
        );
        assert_eq!(
            target(create_subresource(
                Kind::ServiceAccount,
                Some("ns"),
                "default",
                "token",
                &p
            )),
            "POST /api/v1/namespaces/ns/serviceaccounts/default/token?"
        );
        assert_eq!(
            target(create(Kind::EndpointSlice, Some("ns"), &p)),
            "POST /apis/discovery.k8s.io/v1/namespaces/ns/endpointslices?"
        );
    }

    #[test]
    fn patches_carry_their_content_type_and_deletes_the_edge_options() {
        let p = json!({"status": {}});
        let r = patch(Kind::Node, None, "n", None, &Patch::Merge(&p)).unwrap();
        assert_eq!(
            r.headers()[http::header::CONTENT_TYPE],
            "application/merge-patch+json"
        );
        let r = patch(Kind::Node, None, "n", None, &Patch::Strategic(&p)).unwrap();
        assert_eq!(
            r.headers()[http::header::CONTENT_TYPE],
            "application/strategic-merge-patch+json"
        );
        let options = json!({"gracePeriodSeconds": 0, "preconditions": {"uid": "u-1"}});
        let r = delete(Kind::Pod, Some("ns"), "p", &options).unwrap();
        assert_eq!(r.method(), http::Method::DELETE);
        assert_eq!(serde_json::from_slice::<Value>(r.body()).unwrap(), options);
    }

    #[test]
    fn an_empty_name_is_refused_before_any_request() {
        assert!(get(Kind::Pod, Some("ns"), "").is_err());
    }
}
