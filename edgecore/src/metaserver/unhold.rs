//! `unhold-upgrade` (KubeEdge v1.22+, `keadm ctl unhold-upgrade`): releases the pod upgrades
//! edged holds (`edge.kubeedge.io/hold-upgrade: "true"`, see `edged::hold`).
//!
//! * `POST /api/v1/pods/unhold-upgrade` with `<namespace>/<name>` as the body: the pod must be
//!   in the edge database, annotated and `Pending` (400 otherwise, 404 when unknown).
//! * `POST /api/v1/nodes/unhold-upgrade` with this edge's node name: every held pod.
//!
//! Answered at the edge, also while the cloud is away; authorized as a create of `pods` or
//! `nodes` named `unhold-upgrade` when `requireAuthorization` is on. Successes are a `Status`
//! saying what was released.

use super::Shared;
use super::request::{ResourceRequest, Unhold, UnholdOf, Verb};
use super::serve::{Body, json_response, status};
use crate::edgehub::CloudLink;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use kubeedge_edged::hold::{self, Release, ReleaseError};
use kubeedge_edged::spec::is_path_element;
use serde_json::{Value, json};

/// Largest body accepted: a namespace and a pod name fit many times over.
pub const MAX_BODY: usize = 1024;

fn success(kind: &str, name: &str, message: String) -> Response<Body> {
    json_response(
        StatusCode::OK,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "message": message, "details": {"name": name, "kind": kind}, "code": 200}),
    )
}

pub async fn serve<L: CloudLink>(
    sh: &Shared<L>,
    unhold: Unhold,
    req: Request<Incoming>,
) -> Response<Body> {
    match unhold.of {
        UnholdOf::Unsupported => unsupported(&unhold.request),
        UnholdOf::Pod => match text_body(req).await {
            Ok(body) => pod(sh, unhold.request.namespace.as_deref(), &body).await,
            Err(refused) => refused,
        },
        UnholdOf::Node => match text_body(req).await {
            Ok(body) => node(sh, &body).await,
            Err(refused) => refused,
        },
    }
}

fn unsupported(r: &ResourceRequest) -> Response<Body> {
    let resource = if r.group.is_empty() {
        format!("{}/{}", r.version, r.resource)
    } else {
        format!("{}/{}/{}", r.group, r.version, r.resource)
    };
    let scope = match &r.namespace {
        Some(ns) => format!(" in namespace {ns:?}"),
        None => String::new(),
    };
    status(
        400,
        "BadRequest",
        format!(
            "unsupported resource for unhold-upgrade: {resource}{scope} (served for v1 pods, and v1 nodes without a namespace)"
        ),
    )
}

/// The body as trimmed text, at most [`MAX_BODY`] bytes.
async fn text_body(req: Request<Incoming>) -> Result<String, Response<Body>> {
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Err(status(
                413,
                "RequestEntityTooLarge",
                format!("the body of unhold-upgrade is larger than {MAX_BODY} bytes or unreadable"),
            ));
        }
    };
    match std::str::from_utf8(&body) {
        Ok(text) => Ok(text.trim().to_string()),
        Err(_) => Err(status(
            400,
            "BadRequest",
            "the body of unhold-upgrade is not UTF-8 text",
        )),
    }
}

/// Asks edged to release; the answer as a response.
async fn release<L: CloudLink>(
    sh: &Shared<L>,
    what: Release,
) -> Result<Vec<String>, Response<Body>> {
    let Some(releaser) = &sh.config.held_pods else {
        return Err(status(
            503,
            "ServiceUnavailable",
            "edged does not run in this edgecore: it holds no pod upgrades",
        ));
    };
    releaser
        .release(what, sh.config.remote_timeout)
        .await
        .map_err(|e| match e {
            ReleaseError::Stopped => status(503, "ServiceUnavailable", e.to_string()),
            ReleaseError::Timeout(_) => status(504, "Timeout", e.to_string()),
        })
}

async fn pod<L: CloudLink>(
    sh: &Shared<L>,
    path_namespace: Option<&str>,
    body: &str,
) -> Response<Body> {
    let parsed = body
        .split_once('/')
        .filter(|(ns, name)| is_path_element(ns) && is_path_element(name));
    let Some((namespace, name)) = parsed else {
        return status(
            400,
            "BadRequest",
            format!(
                "invalid body {:?}: expected <namespace>/<name> of a pod",
                body.chars().take(100).collect::<String>()
            ),
        );
    };
    if let Some(ns) = path_namespace.filter(|ns| *ns != namespace) {
        return status(
            400,
            "BadRequest",
            format!("the body names a pod in namespace {namespace:?}, the path namespace {ns:?}"),
        );
    }
    let key = ResourceRequest {
        verb: Verb::Get,
        group: String::new(),
        version: "v1".into(),
        resource: "pods".into(),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        subresource: String::new(),
    }
    .object_key()
    .unwrap_or_default();
    let stored = match sh.store.get_v2(&key).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            return status(
                404,
                "NotFound",
                format!("pods \"{name}\" not found in namespace \"{namespace}\" at this edge"),
            );
        }
        Err(e) => return status(500, "InternalError", e.to_string()),
    };
    let Ok(pod) = serde_json::from_str::<Value>(&stored) else {
        return status(500, "InternalError", "the stored pod is not JSON");
    };
    if !hold::annotated(&pod) {
        return status(
            400,
            "BadRequest",
            format!(
                "pod {namespace}/{name} is not marked with the {}: \"true\" annotation",
                hold::ANNOTATION
            ),
        );
    }
    if !hold::is_pending(&pod) {
        let phase = pod
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("none");
        return status(
            400,
            "BadRequest",
            format!(
                "pod {namespace}/{name} is not Pending (phase {phase}): only pods not started yet are held"
            ),
        );
    }
    let what = Release::Pod {
        namespace: namespace.into(),
        name: name.into(),
    };
    match release(sh, what).await {
        Err(r) => r,
        Ok(released) if released.is_empty() => success(
            "pods",
            name,
            format!(
                "pod {namespace}/{name} is not held at this edge (edged already runs it, or has not received it yet): nothing to release"
            ),
        ),
        Ok(_) => success(
            "pods",
            name,
            format!("released the held upgrade of pod {namespace}/{name}; edged starts it"),
        ),
    }
}

async fn node<L: CloudLink>(sh: &Shared<L>, body: &str) -> Response<Body> {
    if body.is_empty() {
        return status(400, "BadRequest", "node name required in the body");
    }
    if !is_path_element(body) {
        return status(
            400,
            "BadRequest",
            format!(
                "invalid body {:?}: expected a node name",
                body.chars().take(100).collect::<String>()
            ),
        );
    }
    let own = &sh.config.node;
    if body != own {
        return status(
            404,
            "NotFound",
            format!("nodes \"{body}\" not found: this edge is node \"{own}\""),
        );
    }
    match release(sh, Release::All).await {
        Err(r) => r,
        Ok(released) if released.is_empty() => success(
            "nodes",
            own,
            format!("no pod upgrades are held on node {own}: nothing to release"),
        ),
        Ok(released) => success(
            "nodes",
            own,
            format!(
                "released the held upgrades of {} pod(s) on node {own}: {}",
                released.len(),
                released.join(", ")
            ),
        ),
    }
}
