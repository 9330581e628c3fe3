//! Upstream: what edges ask of the cluster (protocol §4.2), answered in KubeEdge's shapes.

use super::coalesce::Coalesce;
use super::kind::Kind;
use super::location::SharedLocation;
use super::node_fields;
use super::node_restriction::{self, Verdict};
use super::rest::{self, ApiRequest, call_retrying, status_error, with_type_meta};
use super::services::ServiceCache;
use super::serving_certs;
use crate::cloudhub::{HubSink, Upstream};
use crate::metrics::{ControllerMetrics, OperationLabel};
use kube::api::Patch;
use kubeedge_shared::ResourceType as RT;
use kubeedge_shared::content::{self, ObjectResp, StatusError};
use kubeedge_shared::operation::source;
use kubeedge_shared::{Group, Message, Operation, ResourcePath};
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Handles upstream messages with bounded concurrency per class of operation.
#[derive(Clone)]
pub struct UpstreamHandler {
    client: kube::Client,
    hub: Arc<dyn HubSink>,
    status: Arc<Semaphore>,
    queries: Arc<Semaphore>,
    writes: Arc<Semaphore>,
    metrics: ControllerMetrics,
    /// Services, Endpoints and EndpointSlices, answered from memory (`services.rs`).
    services: ServiceCache,
    /// Which pods are on which edge node and what they use (`node_restriction.rs`).
    location: SharedLocation,
    /// Queries of one object asked together share one GET (`coalesce.rs`).
    reads: Arc<Coalesce<ReadKey, (Value, Option<String>)>>,
}

/// An object a query reads: kind, namespace, name.
type ReadKey = (Kind, Option<String>, String);

/// What the handler did with a message (for tests and logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    Replied,
    Dropped(String),
}

impl UpstreamHandler {
    pub fn new(
        client: kube::Client,
        hub: Arc<dyn HubSink>,
        concurrency: usize,
        metrics: ControllerMetrics,
        services: ServiceCache,
        location: SharedLocation,
    ) -> Self {
        let c = concurrency.max(1);
        UpstreamHandler {
            metrics,
            services,
            location,
            reads: Arc::default(),
            client,
            hub,
            status: Arc::new(Semaphore::new(c)),
            queries: Arc::new(Semaphore::new(c)),
            writes: Arc::new(Semaphore::new((c / 4).max(1))),
        }
    }

    fn semaphore(&self, ty: &RT) -> &Semaphore {
        match ty {
            RT::NodeStatus | RT::NodePatch | RT::PodStatus | RT::PodPatch | RT::Lease => {
                &self.status
            }
            RT::ConfigMap
            | RT::Secret
            | RT::PersistentVolume
            | RT::PersistentVolumeClaim
            | RT::VolumeAttachment
            | RT::ServiceAccountToken
            | RT::Node
            | RT::Service
            | RT::ServiceList
            | RT::Endpoints
            | RT::EndpointsList
            | RT::EndpointSlice => &self.queries,
            _ => &self.writes,
        }
    }

    /// Spawns the handling of one request from an edge.
    pub fn dispatch(&self, up: Upstream) {
        let this = self.clone();
        tokio::spawn(async move {
            let permit = this.semaphore(&up.path.resource_type).acquire().await;
            if permit.is_err() {
                return;
            }
            let started = std::time::Instant::now();
            let outcome = this.handle(&up).await;
            let label = OperationLabel {
                resource: up.path.resource_type.metric_label(),
                operation: up.message.route.operation.metric_label(),
            };
            this.metrics
                .upstream_duration
                .get_or_create(&label)
                .observe(started.elapsed().as_secs_f64());
            if matches!(outcome, Handled::Dropped(_)) {
                this.metrics.upstream_dropped.inc();
            }
            tracing::debug!(node = %up.node, resource = %up.message.route.resource, op = %up.message.route.operation, ?outcome, elapsed = ?started.elapsed(), "upstream handled");
        });
    }

    pub async fn handle(&self, up: &Upstream) -> Handled {
        let msg = &up.message;
        let path = &up.path;
        let ns = path.namespace.as_deref();
        let name = path.name.as_deref();
        let op = &msg.route.operation;
        // Namespaces and names of the types handled here become REST path segments.
        let rest_type = matches!(
            &path.resource_type,
            RT::Node
                | RT::NodeStatus
                | RT::NodePatch
                | RT::PodPatch
                | RT::PodStatus
                | RT::Pod
                | RT::ConfigMap
                | RT::Secret
                | RT::PersistentVolume
                | RT::PersistentVolumeClaim
                | RT::VolumeAttachment
                | RT::ServiceAccountToken
                | RT::Service
                | RT::Endpoints
                | RT::EndpointSlice
                | RT::ServiceList
                | RT::EndpointsList
                | RT::Lease
                | RT::Event
                | RT::CertificateSigningRequest
        );
        if let Some(why) = [ns, name]
            .into_iter()
            .flatten()
            .find_map(rest::invalid_segment)
            .filter(|_| rest_type)
        {
            tracing::warn!(node = %up.node, resource = %msg.route.resource, %why, "invalid name in upstream resource; refused");
            let e = StatusError::new(400, "BadRequest", format!("invalid resource name: {why}"));
            return self.reply(up, Reply::bare(e.to_value(), None));
        }
        if let Err(why) = self.authorize(up, path).await {
            tracing::warn!(node = %up.node, resource = %msg.route.resource, operation = %op, %why, "upstream request outside what the node may do; refused");
            let e = StatusError::new(403, "Forbidden", why);
            let object_reply = matches!(
                (&path.resource_type, op),
                (RT::Node | RT::Lease | RT::Pod, Operation::Insert)
                    | (RT::NodePatch | RT::PodPatch, Operation::Patch)
                    | (RT::Lease, Operation::Update)
            );
            let reply = if object_reply {
                Reply::object_err(e)
            } else {
                Reply::bare(e.to_value(), None)
            };
            return self.reply(up, reply);
        }
        let reply = match (&path.resource_type, op) {
            (RT::Node, Operation::Insert) => self.create(Kind::Node, None, name, msg).await,
            (RT::Node, Operation::Query) => self.query(Kind::Node, None, name).await,
            (RT::Node, Operation::Update) => self.node_update(name, msg).await,
            (RT::NodeStatus, Operation::Update) => self.node_status_update(name, msg).await,
            (RT::NodePatch, Operation::Patch) => {
                self.patch_status(Kind::Node, None, name, msg).await
            }
            (RT::PodPatch, Operation::Patch) => self.patch_status(Kind::Pod, ns, name, msg).await,
            (RT::PodStatus, Operation::Update) => self.pod_status_update(&up.node, ns, msg).await,
            (RT::Pod, Operation::Insert) => self.create(Kind::Pod, ns, None, msg).await,
            (RT::Pod, Operation::Delete) => self.pod_delete(ns, name, msg).await,
            (RT::ConfigMap, Operation::Query) => self.query(Kind::ConfigMap, ns, name).await,
            (RT::Secret, Operation::Query) => self.query(Kind::Secret, ns, name).await,
            (RT::PersistentVolume, Operation::Query) => {
                self.query(Kind::PersistentVolume, None, name).await
            }
            (RT::PersistentVolumeClaim, Operation::Query) => {
                self.query(Kind::PersistentVolumeClaim, ns, name).await
            }
            (RT::VolumeAttachment, Operation::Query) => {
                self.query(Kind::VolumeAttachment, None, name).await
            }
            (RT::ServiceAccountToken, Operation::Query) => self.token(ns, name, msg).await,
            (RT::CertificateSigningRequest, Operation::Insert) => {
                self.csr_create(&up.node, msg).await
            }
            (RT::CertificateSigningRequest, Operation::Query) => {
                self.csr_query(&up.node, name).await
            }
            (RT::KubeCa, Operation::Query) => self.kube_ca().await,
            (RT::Service, Operation::Query) => self.cached(Kind::Service, ns, name).await,
            (RT::Endpoints, Operation::Query) => self.cached(Kind::Endpoints, ns, name).await,
            (RT::EndpointSlice, Operation::Query) => {
                self.cached(Kind::EndpointSlice, ns, name).await
            }
            (RT::ServiceList, Operation::Query) => self.cached_list(Kind::Service, ns).await,
            (RT::EndpointsList, Operation::Query) => self.cached_list(Kind::Endpoints, ns).await,
            (RT::Lease, Operation::Insert) => self
                .create(Kind::Lease, ns, None, msg)
                .await
                .map(wrap_object),
            (RT::Lease, Operation::Update) => self.lease_update(ns, name, msg).await,
            (RT::Lease, Operation::Query) => {
                self.query(Kind::Lease, ns, name).await.map(wrap_object)
            }
            (RT::Event, Operation::Insert | Operation::Update | Operation::Patch) => {
                self.event(ns, name, msg).await
            }
            (ty, op) => {
                tracing::warn!(node = %up.node, resource_type = %ty, operation = %op, "unsupported upstream operation; dropped");
                return Handled::Dropped(format!("unsupported {ty}/{op}"));
            }
        };
        self.reply(up, reply)
    }

    /// Whether the edge may do this (`node_restriction.rs`); a pod the cache does not place is
    /// read from the API.
    async fn authorize(&self, up: &Upstream, path: &ResourcePath) -> Result<(), String> {
        let op = &up.message.route.operation;
        let content = if node_restriction::needs_content(&path.resource_type, op) {
            content::content_json(&up.message.content).unwrap_or(Value::Null)
        } else {
            Value::Null
        };
        let verdict = node_restriction::check(&up.node, path, op, &content, &self.location);
        match &verdict {
            Verdict::Allow => Ok(()),
            Verdict::Deny(why) => Err(why.clone()),
            Verdict::PodOnNode {
                namespace, name, ..
            } => match self.api(rest::get(Kind::Pod, Some(namespace), name)).await {
                Ok(pod) => node_restriction::pod_verdict(&up.node, &verdict, Some(&pod)),
                Err(e) if rest::is_not_found(&e) => {
                    node_restriction::pod_verdict(&up.node, &verdict, None)
                }
                Err(e) => Err(format!("pod {namespace}/{name} could not be checked: {e}")),
            },
        }
    }

    fn reply(&self, up: &Upstream, reply: Reply) -> Handled {
        let msg = &up.message;
        let Reply { content, rv } = reply;
        let mut response = Message::new(
            source::EDGE_CONTROLLER,
            Group::Resource,
            Operation::Response,
            msg.route.resource.clone(),
            content,
        )
        .with_parent(msg.header.id.clone());
        if let Some(rv) = rv {
            response.header.resource_version = rv;
        }
        match self.hub.send(&up.node, response) {
            Ok(_) => Handled::Replied,
            Err(e) => Handled::Dropped(format!("reply not sent: {e}")),
        }
    }

    /// One apiserver call (retried on transient errors), errors counted by code.
    async fn api(&self, req: Result<ApiRequest, kube::Error>) -> Result<Value, kube::Error> {
        let r = call_retrying(&self.client, req).await;
        if let Err(e) = &r {
            let code = match e {
                kube::Error::Api(s) => s.code.to_string(),
                _ => "transport".to_string(),
            };
            self.metrics
                .apiserver_errors
                .get_or_create(&crate::metrics::CodeLabel { code })
                .inc();
        }
        r
    }

    /// `name`, when given, replaces the object's name, as KubeEdge's node registration does
    /// with the resource's (`upstream.go createNode`).
    async fn create(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: Option<&str>,
        msg: &Message,
    ) -> Reply {
        let mut body = match object_content(msg, kind) {
            Ok(b) => b,
            Err(e) => return Reply::object_err(*e),
        };
        if let Some(name) = name {
            set_name(&mut body, name);
        }
        match self.api(rest::create(kind, ns, &body)).await {
            Ok(obj) => Reply::object(with_type_meta(obj, kind)),
            Err(e) => Reply::object_err(status_error(&e)),
        }
    }

    /// A bare object (or a StatusError) with its RV: KubeEdge's query reply.
    async fn query(&self, kind: Kind, ns: Option<&str>, name: Option<&str>) -> Reply {
        let Some(name) = name else {
            return Reply::bare(
                StatusError::new(400, "BadRequest", "query needs a name").to_value(),
                None,
            );
        };
        let this = self.clone();
        let (ns, name) = (ns.map(str::to_string), name.to_string());
        let key = (kind, ns.clone(), name.clone());
        let (content, rv) = self
            .reads
            .get(key, move || {
                let (this, ns, name) = (this.clone(), ns.clone(), name.clone());
                async move {
                    match this.api(rest::get(kind, ns.as_deref(), &name)).await {
                        Ok(obj) => {
                            let rv = resource_version(&obj);
                            (with_type_meta(obj, kind), rv)
                        }
                        Err(e) => (status_error(&e).to_value(), None),
                    }
                }
            })
            .await;
        Reply::bare(content, rv)
    }

    /// A Service/Endpoints/EndpointSlice query answered from the watch cache: one object as
    /// `query` answers it, or (no name) the namespace's objects as a JSON array. Until the
    /// cache has synced, single objects come from the apiserver.
    async fn cached(&self, kind: Kind, ns: Option<&str>, name: Option<&str>) -> Reply {
        let Some(name) = name else {
            return self.cached_list(kind, ns).await;
        };
        if !self.services.is_synced(kind) {
            return self.query(kind, ns, Some(name)).await;
        }
        match self.services.get(kind, ns.unwrap_or_default(), name) {
            Some((obj, rv)) => Reply::bare(obj, Some(rv.to_string())),
            None => Reply::bare(
                StatusError::not_found(&kind.qualified_resource(), name).to_value(),
                None,
            ),
        }
    }

    /// KubeEdge's list content: a JSON array of objects. The namespace tokens `null` and
    /// `namespace` (KubeEdge's placeholder in `servicelist` resources) mean every namespace.
    async fn cached_list(&self, kind: Kind, ns: Option<&str>) -> Reply {
        if !self.services.is_synced(kind) {
            return Reply::bare(
                StatusError::new(
                    503,
                    "ServiceUnavailable",
                    "the watch cache is not synced yet",
                )
                .to_value(),
                None,
            );
        }
        let listed = self.services.list(kind, ns.filter(|n| *n != "namespace"));
        let rv = (listed.resource_version > 0).then(|| listed.resource_version.to_string());
        Reply::bare(Value::Array(listed.items), rv)
    }

    async fn patch_status(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: Option<&str>,
        msg: &Message,
    ) -> Reply {
        let Some(name) = name else {
            return Reply::object_err(StatusError::new(400, "BadRequest", "patch needs a name"));
        };
        let mut patch = match content::content_json(&msg.content) {
            Ok(p) => p,
            Err(e) => {
                return Reply::object_err(StatusError::new(
                    400,
                    "BadRequest",
                    format!("patch is not JSON: {e}"),
                ));
            }
        };
        if kind == Kind::Node {
            node_fields::strip_from_patch(&mut patch);
        }
        let req = rest::patch(kind, ns, name, Some("status"), &Patch::Strategic(&patch));
        match self.api(req).await {
            Ok(obj) => {
                let rv = resource_version(&obj);
                Reply::object(with_type_meta(obj, kind)).with_rv(rv)
            }
            Err(e) => Reply::object_err(status_error(&e)),
        }
    }

    /// `node`/`update`: labels and annotations merged into the existing node.
    async fn node_update(&self, name: Option<&str>, msg: &Message) -> Reply {
        let Some(name) = name else { return Reply::ok() };
        let Ok(node) = content::content_json(&msg.content) else {
            return Reply::bare(json!("node update is not JSON"), None);
        };
        let patch = label_merge_patch(&node);
        let req = rest::patch(Kind::Node, None, name, None, &Patch::Strategic(&patch));
        match self.api(req).await {
            Ok(obj) => Reply::ok().with_rv(resource_version(&obj)),
            Err(e) => Reply::bare(status_error(&e).to_value(), None),
        }
    }

    /// Deprecated `nodestatus`/`update`: the status replaces the node's.
    async fn node_status_update(&self, name: Option<&str>, msg: &Message) -> Reply {
        let Some(name) = name else { return Reply::ok() };
        let Ok(req) = content::content_json(&msg.content) else {
            return Reply::bare(json!("nodestatus is not JSON"), None);
        };
        let mut status = req
            .get("Status")
            .or_else(|| req.get("status"))
            .cloned()
            .unwrap_or(Value::Null);
        node_fields::strip_from_status(&mut status);
        let patch = json!({"status": status});
        let req = rest::patch(
            Kind::Node,
            None,
            name,
            Some("status"),
            &Patch::Merge(&patch),
        );
        match self.api(req).await {
            Ok(obj) => Reply::ok().with_rv(resource_version(&obj)),
            Err(e) => Reply::bare(status_error(&e).to_value(), None),
        }
    }

    /// Legacy `podstatus`/`update`: one `{UID, Name, Status}` or an array of them. As in
    /// KubeEdge's `updatePodStatus`, a pod that is gone from the cluster, or was replaced by one
    /// with another UID, is answered `"OK"` and deleted on the edge (here with the edge's UID,
    /// so its metamanager, which deletes only a stored pod of that UID, drops it).
    async fn pod_status_update(&self, node: &str, ns: Option<&str>, msg: &Message) -> Reply {
        let Ok(body) = content::content_json(&msg.content) else {
            return Reply::bare(json!("podstatus is not JSON"), None);
        };
        let items = match body {
            Value::Array(a) => a,
            other => vec![other],
        };
        let ns = ns.unwrap_or("default");
        for item in items {
            let (Some(name), Some(uid)) = (item["Name"].as_str(), item["UID"].as_str()) else {
                continue;
            };
            if let Some(why) = rest::invalid_segment(name) {
                tracing::warn!(node, %why, "legacy pod status for an invalid pod name skipped");
                continue;
            }
            let current = self.api(rest::get(Kind::Pod, Some(ns), name)).await;
            let stale = match &current {
                Ok(pod) => pod["metadata"]["uid"].as_str() != Some(uid),
                Err(e) => rest::is_not_found(e),
            };
            if stale {
                tracing::info!(
                    node,
                    namespace = ns,
                    pod = name,
                    uid,
                    "status for a pod the cluster no longer has; deleting it on the edge"
                );
                self.delete_on_edge(node, ns, name, uid);
                continue;
            }
            let pod = match current {
                Ok(pod) => pod,
                Err(e) => {
                    tracing::debug!(node, pod = name, error = %e, "legacy pod status: pod not read");
                    continue;
                }
            };
            if pod["spec"]["nodeName"].as_str() != Some(node) {
                tracing::warn!(
                    node,
                    namespace = ns,
                    pod = name,
                    "legacy pod status for a pod bound to another node; refused"
                );
                continue;
            }
            let patch = json!({"metadata": {"uid": uid}, "status": item["Status"]});
            let req = rest::patch(
                Kind::Pod,
                Some(ns),
                name,
                Some("status"),
                &Patch::Merge(&patch),
            );
            if let Err(e) = self.api(req).await {
                tracing::debug!(node, pod = name, error = %e, "legacy pod status update failed");
            }
        }
        Reply::ok()
    }

    fn delete_on_edge(&self, node: &str, ns: &str, name: &str, uid: &str) {
        let msg = Message::new(
            source::EDGE_CONTROLLER,
            Group::Resource,
            Operation::Delete,
            format!("{ns}/pod/{name}"),
            pod_stub(ns, name, uid),
        );
        if let Err(e) = self.hub.send(node, msg) {
            tracing::debug!(node, error = %e, "pod delete for the edge not queued");
        }
    }

    /// `pod`/`delete`: a string content is the UID (old edges); otherwise DeleteOptions.
    async fn pod_delete(&self, ns: Option<&str>, name: Option<&str>, msg: &Message) -> Reply {
        let Some(name) = name else { return Reply::ok() };
        let options = match &msg.content {
            Value::String(uid) if !uid.trim_start().starts_with('{') => {
                json!({"gracePeriodSeconds": 0, "preconditions": {"uid": uid}})
            }
            other => {
                content::content_json(other).unwrap_or_else(|_| json!({"gracePeriodSeconds": 0}))
            }
        };
        match self.api(rest::delete(Kind::Pod, ns, name, &options)).await {
            Ok(_) => Reply::ok(),
            Err(e) if rest::is_not_found(&e) => Reply::ok(),
            // A UID precondition failing means the pod was recreated: nothing to delete.
            Err(kube::Error::Api(s)) if s.code == 409 => Reply::ok(),
            Err(e) => Reply::bare(status_error(&e).to_value(), None),
        }
    }

    async fn lease_update(&self, ns: Option<&str>, name: Option<&str>, msg: &Message) -> Reply {
        let Some(name) = name else {
            return Reply::object_err(StatusError::new(
                400,
                "BadRequest",
                "lease update needs a name",
            ));
        };
        let body = match object_content(msg, Kind::Lease) {
            Ok(b) => b,
            Err(e) => return Reply::object_err(*e),
        };
        match self.api(rest::replace(Kind::Lease, ns, name, &body)).await {
            Ok(obj) => Reply::object(with_type_meta(obj, Kind::Lease)),
            Err(e) => Reply::object_err(status_error(&e)),
        }
    }

    async fn token(&self, ns: Option<&str>, name: Option<&str>, msg: &Message) -> Reply {
        let Some(name) = name else {
            return Reply::bare(
                StatusError::new(400, "BadRequest", "token request needs a service account")
                    .to_value(),
                None,
            );
        };
        let body = content::content_json(&msg.content).unwrap_or(Value::Null);
        let body = if body.is_object() {
            body
        } else {
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}})
        };
        let req = rest::create_subresource(Kind::ServiceAccount, ns, name, "token", &body);
        match self.api(req).await {
            Ok(tr) => Reply::bare(tr, None),
            Err(e) => Reply::bare(status_error(&e).to_value(), None),
        }
    }

    /// A MetaServer serving-certificate request: created (the object's own name or
    /// `generateName`), approved when it is this node's kubelet-serving request, answered
    /// as KubeEdge's `ObjectResp`.
    async fn csr_create(&self, node: &str, msg: &Message) -> Reply {
        let body = match object_content(msg, Kind::CertificateSigningRequest) {
            Ok(b) => b,
            Err(e) => return Reply::object_err(*e),
        };
        if let Err(why) = serving_certs::check(node, &body) {
            tracing::warn!(node, %why, "certificate signing request refused");
            return Reply::object_err(StatusError::new(403, "Forbidden", why));
        }
        let created = match self
            .api(rest::create(Kind::CertificateSigningRequest, None, &body))
            .await
        {
            Ok(c) => c,
            Err(e) => return Reply::object_err(status_error(&e)),
        };
        let Some(name) = created["metadata"]["name"].as_str().map(str::to_string) else {
            return Reply::object(with_type_meta(created, Kind::CertificateSigningRequest));
        };
        if serving_certs::decided(&created) {
            return Reply::object(with_type_meta(created, Kind::CertificateSigningRequest));
        }
        let approval = serving_certs::approved(created);
        let req = rest::replace_subresource(
            Kind::CertificateSigningRequest,
            None,
            &name,
            "approval",
            &approval,
        );
        match self.api(req).await {
            Ok(obj) => {
                tracing::info!(node, csr = %name, "MetaServer serving certificate request approved");
                Reply::object(with_type_meta(obj, Kind::CertificateSigningRequest))
            }
            Err(e) => Reply::object_err(status_error(&e)),
        }
    }

    /// A CSR read back by the node that sent it (others' are refused).
    async fn csr_query(&self, node: &str, name: Option<&str>) -> Reply {
        let Some(name) = name else {
            return Reply::bare(
                StatusError::new(400, "BadRequest", "a CSR query needs a name").to_value(),
                None,
            );
        };
        match self
            .api(rest::get(Kind::CertificateSigningRequest, None, name))
            .await
        {
            Ok(csr) if serving_certs::requested_node(&csr).as_deref() == Some(node) => {
                Reply::bare(with_type_meta(csr, Kind::CertificateSigningRequest), None)
            }
            Ok(_) => Reply::bare(
                StatusError::new(
                    403,
                    "Forbidden",
                    format!("certificate signing request {name} is not node {node}'s"),
                )
                .to_value(),
                None,
            ),
            Err(e) => Reply::bare(status_error(&e).to_value(), None),
        }
    }

    /// `k8s/ca.crt`: the cluster CA as a PEM string (KubeEdge's cloudhub answers it from its
    /// kubeconfig's CA file; here from the `kube-root-ca.crt` ConfigMap, the same CA).
    async fn kube_ca(&self) -> Reply {
        let (ns, name) = serving_certs::ROOT_CA_CONFIGMAP;
        match self.api(rest::get(Kind::ConfigMap, Some(ns), name)).await {
            Ok(cm) => match serving_certs::ca_from_configmap(&cm) {
                Some(pem) => Reply::bare(Value::String(pem), None),
                None => Reply::bare(
                    StatusError::new(
                        500,
                        "InternalError",
                        format!("ConfigMap {ns}/{name} has no ca.crt"),
                    )
                    .to_value(),
                    None,
                ),
            },
            Err(e) => Reply::bare(status_error(&e).to_value(), None),
        }
    }

    /// `event` (KubeEdge's edged event sink): `insert` creates the Event (one that exists
    /// already counts as recorded); `update` replaces it; `patch` carries
    /// `{"event": <Event>, "patchData": "<strategic merge patch>"}` and patches the Event,
    /// creating it from `event` when it is gone (expired or never arrived), as the kubelet's
    /// event sink does.
    async fn event(&self, ns: Option<&str>, name: Option<&str>, msg: &Message) -> Reply {
        let bad = |m: String| Reply::bare(StatusError::new(400, "BadRequest", m).to_value(), None);
        let content = match content::content_json(&msg.content) {
            Ok(c) => c,
            Err(e) => return bad(format!("content is not JSON: {e}")),
        };
        let op = &msg.route.operation;
        let (event, patch) = match (op, content.get("patchData")) {
            (Operation::Patch, Some(data)) => {
                let patch = match data {
                    Value::String(s) => match serde_json::from_str::<Value>(s) {
                        Ok(p) => p,
                        Err(e) => return bad(format!("patchData is not JSON: {e}")),
                    },
                    other => other.clone(),
                };
                (content["event"].clone(), Some(patch))
            }
            _ => (content, None),
        };
        if !event.is_object() {
            return bad("the event must be an object".into());
        }
        let mut event = with_type_meta(event, Kind::Event);
        let ns = ns
            .or_else(|| event["metadata"]["namespace"].as_str())
            .unwrap_or("default")
            .to_string();
        let Some(name) = name
            .or_else(|| event["metadata"]["name"].as_str())
            .map(str::to_string)
        else {
            return bad("the event has no name".into());
        };
        if let Some(why) = rest::invalid_segment(&ns).or_else(|| rest::invalid_segment(&name)) {
            return bad(format!("invalid event namespace or name: {why}"));
        }
        if let Some(m) = event["metadata"].as_object_mut() {
            m.remove("resourceVersion");
        }
        let namespace = ns;
        let ns = Some(namespace.as_str());
        let written = match (op, patch) {
            (Operation::Patch, Some(patch)) => {
                let req = rest::patch(Kind::Event, ns, &name, None, &Patch::Strategic(&patch));
                match self.api(req).await {
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        self.api(rest::create(Kind::Event, ns, &event)).await
                    }
                    r => r,
                }
            }
            (Operation::Update, _) => {
                self.api(rest::replace(Kind::Event, ns, &name, &event))
                    .await
            }
            _ => match self.api(rest::create(Kind::Event, ns, &event)).await {
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Value::Null),
                r => r,
            },
        };
        match written {
            Ok(_) => Reply::ok(),
            Err(e) => {
                tracing::debug!(event = %name, %namespace, error = %e, "event not recorded");
                Reply::bare(status_error(&e).to_value(), None)
            }
        }
    }
}

/// A reply: content plus the resourceversion header to stamp.
struct Reply {
    content: Value,
    rv: Option<String>,
}

impl Reply {
    fn ok() -> Self {
        Self::bare(content::ok(), None)
    }
    fn bare(content: Value, rv: Option<String>) -> Self {
        Reply { content, rv }
    }
    fn object(obj: Value) -> Self {
        Self::bare(ObjectResp::object(obj).to_value(), None)
    }
    fn object_err(e: StatusError) -> Self {
        Self::bare(ObjectResp::error(e).to_value(), None)
    }
    fn with_rv(self, rv: Option<String>) -> Self {
        Reply {
            rv: rv.or(self.rv),
            ..self
        }
    }
    fn map(self, f: impl FnOnce(Value) -> Value) -> Self {
        Reply {
            content: f(self.content),
            ..self
        }
    }
}

/// Lease replies are always `ObjectResp`; a bare object or StatusError is wrapped.
fn wrap_object(v: Value) -> Value {
    if ObjectResp::from_content(&v).is_some() {
        return v;
    }
    match StatusError::from_content(&v) {
        Some(e) => ObjectResp::error(e).to_value(),
        None => ObjectResp::object(v).to_value(),
    }
}

fn object_content(msg: &Message, kind: Kind) -> Result<Value, Box<StatusError>> {
    let v = content::content_json(&msg.content).map_err(|e| {
        Box::new(StatusError::new(
            400,
            "BadRequest",
            format!("content is not JSON: {e}"),
        ))
    })?;
    if !v.is_object() {
        return Err(Box::new(StatusError::new(
            400,
            "BadRequest",
            "content must be an object",
        )));
    }
    Ok(with_type_meta(v, kind))
}

/// KubeEdge's `updateNode` copies the edge's labels and annotations over the node's: keys are
/// added or overwritten, never removed. A patch with `"labels": null` (a node without labels)
/// or a null value would delete them (the edge role label with them), so only string values
/// are carried.
fn label_merge_patch(node: &Value) -> Value {
    let strings = |field: &str| -> serde_json::Map<String, Value> {
        node["metadata"][field]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, v)| v.is_string())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    json!({"metadata": {"labels": strings("labels"), "annotations": strings("annotations")}})
}

/// The pod a `delete` to the edge carries when the cluster has none to show.
fn pod_stub(ns: &str, name: &str, uid: &str) -> Value {
    with_type_meta(
        json!({"metadata": {"namespace": ns, "name": name, "uid": uid}}),
        Kind::Pod,
    )
}

/// Sets `metadata.name` of an object (`metadata` is created when missing).
fn set_name(obj: &mut Value, name: &str) {
    if let Some(o) = obj.as_object_mut() {
        let meta = o.entry("metadata").or_insert_with(|| json!({}));
        if !meta.is_object() {
            *meta = json!({});
        }
        meta["name"] = json!(name);
    }
}

fn resource_version(obj: &Value) -> Option<String> {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_string)
}

#[cfg(test)]
mod contract_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// KubeEdge's `registerNode` names the node after the resource
    /// (`node/<id>/default/node/<name>`), whatever the content says.
    #[test]
    fn registration_takes_the_name_of_the_resource() {
        let mut node = json!({"metadata": {"labels": {"node-role.kubernetes.io/edge": ""}}});
        set_name(&mut node, "edge-1");
        assert_eq!(node["metadata"]["name"], "edge-1");
        assert_eq!(
            node["metadata"]["labels"]["node-role.kubernetes.io/edge"],
            ""
        );
        let mut bare = json!({"kind": "Node", "metadata": null});
        set_name(&mut bare, "edge-2");
        assert_eq!(bare["metadata"], json!({"name": "edge-2"}));
    }

    /// `Nodes().Update` from a KubeEdge kubelet (`edge/pkg/metamanager/client/node.go`
    /// `Update`: content = the Node) may carry no labels or annotations at all.
    #[test]
    fn node_update_only_adds_labels_and_annotations() {
        assert_eq!(
            label_merge_patch(&json!({"metadata": {"name": "edge-1"}})),
            json!({"metadata": {"labels": {}, "annotations": {}}})
        );
        assert_eq!(
            label_merge_patch(&json!({"metadata": {"labels": {"a": "1", "b": null},
                "annotations": {"n": "v"}}})),
            json!({"metadata": {"labels": {"a": "1"}, "annotations": {"n": "v"}}})
        );
    }

    /// What `edge/pkg/metamanager/process.go processDeletePodDB` needs to drop its row: a pod
    /// whose `metadata.uid` equals the stored one (and edged: a namespace and name).
    #[test]
    fn pod_stub_carries_the_uid_the_edge_holds() {
        let p = pod_stub("ns", "web-0", "u-1");
        assert_eq!(p["kind"], "Pod");
        assert_eq!(p["apiVersion"], "v1");
        assert_eq!(
            p["metadata"],
            json!({"namespace": "ns", "name": "web-0", "uid": "u-1"})
        );
    }
}
