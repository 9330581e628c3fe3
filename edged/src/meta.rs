//! What edged needs from metamanager, and what they exchange.
//!
//! * [`MetaService`] is the seam: one typed [`MetaRequest`] in, the reply's content (or a
//!   [`MetaError`]) out. edgecore's metamanager serves it (from its database, or by asking
//!   the cloud); tests serve it with a few lines over a channel ([`MetaCall`]).
//! * [`MetaClient`] is what edged calls instead of a Kubernetes client: typed calls built on
//!   the service (what KubeEdge's kubelet bridge sends to metamanager as a `source: edged`,
//!   `group: meta` message, protocol §5.5), their replies read back into typed results.
//! * [`ObjectChange`]s go the other way: the stored pods, configmaps, secrets and the node
//!   edged acts on, sent by metamanager once their writes are durable.

use futures_util::future::BoxFuture;
use kubeedge_shared::content::{self, ObjectResp, StatusError};
use kubeedge_shared::operation::source;
use kubeedge_shared::resource_type::ConfigKind;
use kubeedge_shared::{Group, Message, Operation, ResourcePath, ResourceType};
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Namespace of node leases.
pub use kubeedge_shared::constants::LEASE_NAMESPACE;

#[derive(Debug, Clone, thiserror::Error)]
pub enum MetaError {
    /// The request needs the API server and the cloud is unreachable.
    #[error("failed to process remote: not connected")]
    NotConnected,
    /// The link failed while waiting (disconnect, timeout).
    #[error("failed to process remote: {0}")]
    Link(String),
    #[error("{resource} not found")]
    NotFound { resource: String },
    /// The API server refused (as relayed by the cloud), e.g. `AlreadyExists`, `Conflict`.
    #[error("{}: {} ({})", .0.err_status.reason, .0.err_status.message, .0.err_status.code)]
    Api(StatusError),
    /// The cloud answered with an error text.
    #[error("the cloud reported an error: {0}")]
    Remote(String),
    #[error("unexpected reply for {resource}: {detail}")]
    Malformed { resource: String, detail: String },
    #[error("invalid request: {0}")]
    BadRequest(String),
    /// The local database failed (its error, as text).
    #[error("{0}")]
    Store(String),
    #[error("metamanager is not running")]
    Stopped,
}

impl MetaError {
    /// The cloud could not be asked (as opposed to: it answered no).
    pub fn is_link_failure(&self) -> bool {
        matches!(self, MetaError::NotConnected | MetaError::Link(_))
    }
}

/// A request to metamanager, typed: what KubeEdge's kubelet bridge sends as a `source:
/// edged`, `group: meta` message (protocol §5.5). The wire message is built only when the
/// request goes on to the cloud; local answers never make one.
#[derive(Debug, Clone, PartialEq)]
pub struct MetaRequest {
    pub operation: Operation,
    pub path: ResourcePath,
    pub content: Value,
}

impl MetaRequest {
    pub fn new(operation: Operation, path: ResourcePath, content: Value) -> Self {
        MetaRequest {
            operation,
            path,
            content,
        }
    }

    /// The message for the cloud.
    pub fn to_message(&self) -> Message {
        self.clone().into_message()
    }

    /// The message for the cloud, the content moved into it.
    pub fn into_message(self) -> Message {
        Message::new(
            source::EDGED,
            Group::Meta,
            self.operation,
            &self.path,
            self.content,
        )
    }

    /// Why the path could not travel as a resource string (what parsing one refuses: empty
    /// segments, a `/` in the namespace or type), if it could not.
    pub fn path_error(&self) -> Option<String> {
        let p = &self.path;
        let bad_ns = p
            .namespace
            .as_deref()
            .is_some_and(|n| n.is_empty() || n.contains('/'));
        let ty = p.resource_type.as_str();
        let bad_ty = ty.is_empty() || ty.contains('/');
        let bad_name = p
            .name
            .as_deref()
            .is_some_and(|n| n.split('/').any(str::is_empty));
        (bad_ns || bad_ty || bad_name)
            .then(|| format!("resource path {p} has an empty or invalid segment"))
    }
}

/// What edged needs from metamanager: a request answered with the reply's content (an
/// `Error` reply from the cloud is [`MetaError::Remote`]).
pub trait MetaService: Send + Sync + 'static {
    fn call(&self, req: MetaRequest) -> BoxFuture<'static, Result<Value, MetaError>>;
}

/// A request and where to put its answer: how a [`MetaService`] served over a channel
/// receives its requests (metamanager's, and the fakes of tests).
pub struct MetaCall {
    pub req: MetaRequest,
    pub reply: oneshot::Sender<Result<Value, MetaError>>,
}

impl MetaService for mpsc::Sender<MetaCall> {
    fn call(&self, req: MetaRequest) -> BoxFuture<'static, Result<Value, MetaError>> {
        let requests = self.clone();
        Box::pin(async move {
            let (reply, rx) = oneshot::channel();
            requests
                .send(MetaCall { req, reply })
                .await
                .map_err(|_| MetaError::Stopped)?;
            rx.await.map_err(|_| MetaError::Stopped)?
        })
    }
}

/// Whether edged acts on objects of this type (it is told about their changes): pods, the
/// configmaps and secrets they mount, and its own Node (cloudcore sends it when the cluster
/// marked it Unknown).
pub fn edged_acts_on(t: &ResourceType) -> bool {
    matches!(t, ResourceType::Pod | ResourceType::Node) || ConfigKind::of(t).is_some()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeAction {
    /// Created or changed (KubeEdge `insert`/`update`; edged treats both as "apply").
    Upsert,
    /// Removed from the database. The object may carry only `metadata` (name, namespace, uid),
    /// as synccontroller's deletes do.
    Delete,
}

/// A change of the database that edged acts on. Sent only after the change is durable.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectChange {
    /// One of the types [`edged_acts_on`].
    pub kind: ResourceType,
    pub action: ChangeAction,
    /// `<namespace>/<type>/<name>`, the database key.
    pub key: String,
    pub namespace: String,
    pub name: String,
    pub object: Value,
}

/// edged's handle to the metamanager; cheap to clone. Objects are Kubernetes JSON.
#[derive(Clone)]
pub struct MetaClient {
    service: Arc<dyn MetaService>,
    node_name: Arc<str>,
    node_namespace: Arc<str>,
}

impl MetaClient {
    /// A client of `service` for node `node_name`, whose Node lives in namespace token
    /// `node_namespace` (`edged.registerNodeNamespace`; `null` is cluster scope).
    pub fn new(service: Arc<dyn MetaService>, node_name: &str, node_namespace: &str) -> Self {
        MetaClient {
            service,
            node_name: node_name.into(),
            node_namespace: node_namespace.into(),
        }
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Sends one request and waits for its reply's content.
    async fn call(
        &self,
        op: Operation,
        path: ResourcePath,
        content: Value,
    ) -> Result<Value, MetaError> {
        self.service.call(MetaRequest::new(op, path, content)).await
    }

    /// The node's namespace as a path segment (`null`, the cluster-scope token, is none).
    fn node_ns(&self) -> Option<&str> {
        (&*self.node_namespace != kubeedge_shared::resource::CLUSTER_SCOPE_TOKEN)
            .then_some(&*self.node_namespace)
    }

    fn node_path(&self, resource_type: ResourceType) -> ResourcePath {
        ResourcePath::object(self.node_ns(), resource_type, &self.node_name)
    }

    /// One object: from the cloud when connected for the types KubeEdge queries remotely
    /// (configmap, secret, pv, pvc, volumeattachment, node, lease), else from the database.
    pub async fn get(&self, path: &ResourcePath) -> Result<Value, MetaError> {
        let content = self
            .call(Operation::Query, path.clone(), Value::Null)
            .await?;
        first_object(&content, path)
    }

    /// Every stored object of a type (all namespaces), from the database. Stored values that
    /// are not JSON are skipped (and logged).
    pub async fn list(&self, resource_type: &str) -> Result<Vec<Value>, MetaError> {
        let path = ResourcePath::new(self.node_ns(), resource_type, None);
        let content = self
            .call(Operation::Query, path.clone(), Value::Null)
            .await?;
        objects_of(&content, &path)
    }

    pub async fn get_pod(&self, namespace: &str, name: &str) -> Result<Value, MetaError> {
        self.get(&ResourcePath::object(
            Some(namespace),
            ResourceType::Pod,
            name,
        ))
        .await
    }

    /// The pods in the database (what edged runs at start, also while offline).
    pub async fn list_pods(&self) -> Result<Vec<Value>, MetaError> {
        self.list("pod").await
    }

    pub async fn get_configmap(&self, namespace: &str, name: &str) -> Result<Value, MetaError> {
        self.get(&ResourcePath::object(
            Some(namespace),
            ResourceType::ConfigMap,
            name,
        ))
        .await
    }

    pub async fn get_secret(&self, namespace: &str, name: &str) -> Result<Value, MetaError> {
        self.get(&ResourcePath::object(
            Some(namespace),
            ResourceType::Secret,
            name,
        ))
        .await
    }

    pub async fn get_persistent_volume(&self, name: &str) -> Result<Value, MetaError> {
        self.get(&ResourcePath::object(
            None,
            ResourceType::PersistentVolume,
            name,
        ))
        .await
    }

    pub async fn get_persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Value, MetaError> {
        self.get(&ResourcePath::object(
            Some(namespace),
            ResourceType::PersistentVolumeClaim,
            name,
        ))
        .await
    }

    pub async fn get_volume_attachment(&self, name: &str) -> Result<Value, MetaError> {
        self.get(&ResourcePath::object(
            None,
            ResourceType::VolumeAttachment,
            name,
        ))
        .await
    }

    /// This node's Node object.
    pub async fn get_node(&self) -> Result<Value, MetaError> {
        self.get(&self.node_path(ResourceType::Node)).await
    }

    /// This node's Lease.
    pub async fn get_lease(&self) -> Result<Value, MetaError> {
        self.get(&ResourcePath::object(
            Some(LEASE_NAMESPACE),
            ResourceType::Lease,
            &self.node_name,
        ))
        .await
    }

    /// Creates the Node object (`insert` `<ns>/node/<node>`). An existing node gives
    /// `Err(MetaError::Api(e))` with `e.reason() == "AlreadyExists"`; then use [`Self::get_node`].
    pub async fn register_node(&self, node: Value) -> Result<Value, MetaError> {
        let path = self.node_path(ResourceType::Node);
        let content = self.call(Operation::Insert, path.clone(), node).await?;
        object_of(&content, &path)
    }

    /// Replaces labels/annotations of the Node (`update`; kept locally, sent to the cloud
    /// without waiting).
    pub async fn update_node(&self, node: Value) -> Result<(), MetaError> {
        let path = self.node_path(ResourceType::Node);
        let content = self.call(Operation::Update, path.clone(), node).await?;
        ok_of(&content, &path)
    }

    /// Strategic-merge patch of the Node status (`patch` `<ns>/nodepatch/<node>`). Returns the
    /// patched Node.
    pub async fn patch_node_status(&self, patch: &Value) -> Result<Value, MetaError> {
        let path = self.node_path(ResourceType::NodePatch);
        let content = self
            .call(
                Operation::Patch,
                path.clone(),
                content::patch_content(patch),
            )
            .await?;
        object_of(&content, &path)
    }

    /// Strategic-merge patch of a pod's status (`patch` `<ns>/podpatch/<name>`). Returns the
    /// patched Pod (also stored, if the pod is still in the database).
    pub async fn patch_pod_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Value, MetaError> {
        let path = ResourcePath::object(Some(namespace), ResourceType::PodPatch, name);
        let content = self
            .call(
                Operation::Patch,
                path.clone(),
                content::patch_content(patch),
            )
            .await?;
        object_of(&content, &path)
    }

    /// Deletes a pod at the API server (`delete` `<ns>/pod/<name>` with `DeleteOptions`, e.g.
    /// grace period 0 and a UID precondition). The database row goes when the cloud confirms
    /// the deletion with its own `delete` message.
    pub async fn delete_pod(
        &self,
        namespace: &str,
        name: &str,
        options: Value,
    ) -> Result<(), MetaError> {
        let path = ResourcePath::object(Some(namespace), ResourceType::Pod, name);
        let content = self.call(Operation::Delete, path.clone(), options).await?;
        ok_of(&content, &path)
    }

    /// Creates a mirror pod for a static pod (`insert` `<ns>/pod/<name>`).
    pub async fn create_mirror_pod(&self, pod: Value) -> Result<Value, MetaError> {
        let (ns, name) = namespaced_name(&pod)?;
        let path = ResourcePath::object(Some(&ns), ResourceType::Pod, &name);
        let content = self.call(Operation::Insert, path.clone(), pod).await?;
        object_of(&content, &path)
    }

    pub async fn create_lease(&self, lease: Value) -> Result<Value, MetaError> {
        self.write_lease(Operation::Insert, lease).await
    }

    /// Renews the node lease (`update` `kube-node-lease/lease/<node>`, answered by the cloud).
    pub async fn update_lease(&self, lease: Value) -> Result<Value, MetaError> {
        self.write_lease(Operation::Update, lease).await
    }

    async fn write_lease(&self, op: Operation, lease: Value) -> Result<Value, MetaError> {
        let name = lease
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or(&self.node_name);
        let path = ResourcePath::object(Some(LEASE_NAMESPACE), ResourceType::Lease, name);
        let content = self.call(op, path.clone(), lease).await?;
        object_of(&content, &path)
    }

    /// Sends a new Event (`insert` `<ns>/event/<name>`) to the cloud without waiting for the
    /// API server. Fails at once while offline.
    pub async fn create_event(&self, event: &Value) -> Result<(), MetaError> {
        let path = event_path(event)?;
        let content = self
            .call(Operation::Insert, path.clone(), event.clone())
            .await?;
        ok_of(&content, &path)
    }

    /// Updates a recorded Event (`patch` `<ns>/event/<name>`, content KubeEdge's
    /// `{"event": <Event>, "patchData": "<strategic merge patch>"}`; the cloud creates the
    /// Event from `event` when it no longer exists).
    pub async fn patch_event(&self, event: &Value, patch: &Value) -> Result<(), MetaError> {
        let path = event_path(event)?;
        let body = serde_json::json!({"event": event, "patchData": patch.to_string()});
        let content = self.call(Operation::Patch, path.clone(), body).await?;
        ok_of(&content, &path)
    }

    /// A service-account token (`query` `<ns>/serviceaccounttoken/<sa>` with a `TokenRequest`);
    /// needs the cloud. Returns the `TokenRequest` with its status filled.
    pub async fn request_service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
        token_request: Value,
    ) -> Result<Value, MetaError> {
        let path = ResourcePath::object(
            Some(namespace),
            ResourceType::ServiceAccountToken,
            service_account,
        );
        let content = self
            .call(Operation::Query, path.clone(), token_request)
            .await?;
        first_object(&content, &path)
    }
}

/// The first object of a query reply (none: not found).
fn first_object(content: &Value, path: &ResourcePath) -> Result<Value, MetaError> {
    objects_of(content, path)?
        .into_iter()
        .next()
        .ok_or_else(|| MetaError::NotFound {
            resource: path.to_wire(),
        })
}

fn namespaced_name(obj: &Value) -> Result<(String, String), MetaError> {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .ok_or_else(|| MetaError::BadRequest("object has no metadata.name".into()))?;
    let ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    Ok((ns.to_string(), name.to_string()))
}

fn event_path(event: &Value) -> Result<ResourcePath, MetaError> {
    let (ns, name) = namespaced_name(event)?;
    Ok(ResourcePath::object(Some(&ns), ResourceType::Event, &name))
}

/// A reply's content as text (a JSON string's own text).
pub fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A `StatusError` in a reply becomes `NotFound` (404) or `Api`.
fn api_error(e: StatusError, resource: &ResourcePath) -> MetaError {
    if e.code() == 404 {
        MetaError::NotFound {
            resource: resource.to_wire(),
        }
    } else {
        MetaError::Api(e)
    }
}

/// The objects of a query reply: a JSON array of JSON strings (database), a bare object
/// (cloud), an `ObjectResp` (lease queries) or a `StatusError`.
fn objects_of(content: &Value, resource: &ResourcePath) -> Result<Vec<Value>, MetaError> {
    if let Some(e) = StatusError::from_content(content) {
        return Err(api_error(e, resource));
    }
    if let Some(resp) = ObjectResp::from_content(content) {
        return match (resp.err, resp.object) {
            (Some(e), _) => Err(api_error(e, resource)),
            (None, Some(o)) if o.is_object() => Ok(vec![o]),
            (None, _) => Ok(Vec::new()),
        };
    }
    match content {
        Value::Array(items) => Ok(items
            .iter()
            .filter_map(|item| match content::content_json(item) {
                Ok(v) if v.is_object() => Some(v),
                _ => {
                    tracing::warn!(%resource, "stored value is not a JSON object; skipped");
                    None
                }
            })
            .collect()),
        Value::Null => Ok(Vec::new()),
        Value::Object(_) => Ok(vec![content.clone()]),
        other => Err(MetaError::Malformed {
            resource: resource.to_wire(),
            detail: format!("expected objects, got {}", text_of(other)),
        }),
    }
}

/// The object of a create/patch/lease reply (`ObjectResp`), or a bare object.
fn object_of(content: &Value, resource: &ResourcePath) -> Result<Value, MetaError> {
    objects_of(content, resource)?
        .into_iter()
        .next()
        .ok_or_else(|| MetaError::Malformed {
            resource: resource.to_wire(),
            detail: "reply carries no object".into(),
        })
}

/// A reply that must be `"OK"` (or a `StatusError`).
fn ok_of(content: &Value, resource: &ResourcePath) -> Result<(), MetaError> {
    if content::is_ok(content) {
        return Ok(());
    }
    if let Some(e) = StatusError::from_content(content) {
        return Err(api_error(e, resource));
    }
    if let Some(ObjectResp { err: Some(e), .. }) = ObjectResp::from_content(content) {
        return Err(api_error(e, resource));
    }
    Err(MetaError::Remote(text_of(content)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn replies_map_to_results() {
        let r = &ResourcePath::parse("default/configmap/c").unwrap();
        assert_eq!(
            objects_of(&json!([r#"{"a":1}"#, "garbage", r#"{"b":2}"#]), r).unwrap(),
            vec![json!({"a":1}), json!({"b":2})]
        );
        assert_eq!(
            objects_of(&json!({"a":1}), r).unwrap(),
            vec![json!({"a":1})]
        );
        assert!(matches!(
            objects_of(&StatusError::not_found("configmaps", "c").to_value(), r),
            Err(MetaError::NotFound { .. })
        ));
        let conflict = StatusError::new(409, "Conflict", "try again");
        assert!(matches!(
            object_of(&ObjectResp::error(conflict.clone()).to_value(), r),
            Err(MetaError::Api(e)) if e == conflict
        ));
        assert!(ok_of(&json!("OK"), r).is_ok());
        assert!(matches!(ok_of(&json!("boom"), r), Err(MetaError::Remote(t)) if t == "boom"));
        assert!(matches!(
            object_of(&json!("OK"), r),
            Err(MetaError::Malformed { .. })
        ));
    }

    /// `upstream.go` `createOrUpdateLease`: `FillBody(&ObjectResp{Object: resp, Err: err})`
    /// with client-go's empty Lease and a `*url.Error` when the API server is unreachable. That
    /// is a failed renewal, not a lease to renew next time.
    #[test]
    fn a_transport_error_in_an_object_resp_is_a_failure() {
        let r = &ResourcePath::parse("kube-node-lease/lease/edge-1").unwrap();
        let reply = json!({"Object": {"metadata": {"creationTimestamp": null}, "spec": {}},
            "Err": {"Op": "Put", "URL": "https://10.96.0.1:443/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-1",
                    "Err": {"Op": "dial", "Net": "tcp", "Source": null, "Addr": {"IP": "10.96.0.1", "Port": 443, "Zone": ""}, "Err": {}}}});
        match object_of(&reply, r) {
            Err(MetaError::Api(e)) => assert_eq!(e.code(), 500),
            other => panic!("unexpected {other:?}"),
        }
    }

    /// What a resource string could not carry is refused before anything is stored or sent.
    #[test]
    fn typed_paths_that_no_resource_string_could_carry_are_refused() {
        let req = |ns: Option<&str>, name: &str| {
            MetaRequest::new(
                Operation::Query,
                ResourcePath::object(ns, ResourceType::Pod, name),
                Value::Null,
            )
        };
        assert_eq!(req(Some("ns"), "web-0").path_error(), None);
        assert_eq!(req(None, "node-a").path_error(), None);
        assert_eq!(
            req(Some("ns"), "a/b").path_error(),
            None,
            "KubeEdge joins the rest"
        );
        for (ns, name) in [
            (Some(""), "x"),
            (Some("a/b"), "x"),
            (Some("ns"), ""),
            (Some("ns"), "a//b"),
        ] {
            assert!(req(ns, name).path_error().is_some(), "{ns:?} {name:?}");
        }
        let list = MetaRequest::new(
            Operation::Query,
            ResourcePath::new(Some("ns"), "pod", None),
            Value::Null,
        );
        assert_eq!(list.path_error(), None);
        assert_eq!(list.to_message().route.resource, "ns/pod");
    }
}
