//! Message handling (protocol §5.2): objects from the cloud are written, then handed to
//! edged, then acknowledged; edged's requests are answered from the cloud or the database.

use super::MetaError;
use super::store::{MetaRecord, MetaStore, ObjectFacts, ReplaceOutcome, StoreError, UpsertOutcome};
use super::{
    ChangeAction, DeleteOutcome, DeviceObject, EdgedRequest, MetaManagerConfig, MetaRequest,
    ObjectChange, edged_acts_on, is_remote_query_type,
};
use crate::edgehub::{CloudLink, LinkEvent};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesOrdered;
use kubeedge_shared::content::{self, ObjectResp, StatusError};
use kubeedge_shared::inventory::Inventory;
use kubeedge_shared::operation::source;
use kubeedge_shared::{Group, Message, Operation, ResourcePath, ResourceType};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, broadcast, mpsc};
use tokio_util::sync::CancellationToken;

/// How long shutdown waits for writes in progress to finish and be acknowledged.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) struct Context<L> {
    config: MetaManagerConfig,
    store: MetaStore,
    link: L,
    edged: mpsc::Sender<ObjectChange>,
    /// devicetwin's input of stored devices and device models (none: it does not run).
    devices: Option<mpsc::Sender<DeviceObject>>,
}

/// Where an object carried by a reply is written.
#[derive(Debug, Clone, PartialEq)]
struct StorePlan {
    record: MetaRecord,
    /// Only over a stored copy of the same object (pods returned by a status patch).
    same_uid_only: bool,
}

/// The outcome of one database write for a cloud message.
enum Written {
    Upserted(UpsertOutcome),
    Replaced(ReplaceOutcome),
    Deleted(DeleteOutcome),
}

/// A cloud message whose write has been queued.
struct Applied {
    msg: Message,
    path: ResourcePath,
    /// The object the message carried (for edged).
    object: Value,
    ack: bool,
    result: Result<Written, StoreError>,
}

impl<L: CloudLink> Context<L> {
    pub(crate) fn new(
        config: MetaManagerConfig,
        store: MetaStore,
        link: L,
        edged: mpsc::Sender<ObjectChange>,
        devices: Option<mpsc::Sender<DeviceObject>>,
    ) -> Self {
        Context {
            config,
            store,
            link,
            edged,
            devices,
        }
    }

    /// Hands devicetwin a stored device object; without devicetwin it is dropped.
    async fn to_twin(&self, change: DeviceObject) {
        match &self.devices {
            Some(tx) => {
                if tx.send(change).await.is_err() {
                    tracing::debug!("devicetwin stopped; device object not handed on");
                }
            }
            None => tracing::debug!("devicetwin is disabled; device object not handed on"),
        }
    }

    /// Validates a cloud message and queues its write. `None` when there is nothing to write.
    async fn begin(&self, msg: Message) -> Option<BoxFuture<'static, Applied>> {
        // edgehub routes the other groups to their modules.
        if !matches!(msg.route.group, Group::Resource | Group::Func) {
            tracing::debug!(group = %msg.route.group, resource = %msg.route.resource, "message for a module this edgecore does not run; dropped");
            return None;
        }
        let op = msg.route.operation.clone();
        if !matches!(
            op,
            Operation::Insert | Operation::Update | Operation::Delete | Operation::Response
        ) {
            tracing::debug!(operation = %op, resource = %msg.route.resource, "operation not handled by metamanager; dropped");
            return None;
        }
        let path = match msg.resource_path() {
            Ok(p) if p.name.is_some() => p,
            _ => {
                self.reject(&msg, "resource must be <namespace>/<type>/<name>")
                    .await;
                return None;
            }
        };
        let ty = path.resource_type.clone();
        let key = msg.route.resource.clone();
        if ty == ResourceType::ServiceAccountAccess && msg.route.source != source::POLICY_CONTROLLER
        {
            // What the MetaServer authorizes comes from the policy controller only, never
            // from objects an application watches (a `policy.kubeedge.io` CRD's).
            tracing::warn!(resource = %key, source = %msg.route.source,
                "ServiceAccountAccess not from the policy controller; ignored");
            if msg.requires_ack() {
                self.ack(&msg).await;
            }
            return None;
        }

        if op == Operation::Response {
            let plan = store_plan(&Operation::Response, &path, &msg.content)?;
            let object = serde_json::from_str(&plan.record.value).unwrap_or(Value::Null);
            let ack = msg.requires_ack();
            return self.queue(msg, path, object, ack, plan).await;
        }

        let object = match &msg.content {
            Value::Null if op == Operation::Delete => Value::Null,
            c => match content::content_json(c) {
                Ok(v) if v.is_object() => v,
                _ if op == Operation::Delete => Value::Null,
                _ => {
                    self.reject(&msg, "content is not a JSON object").await;
                    return None;
                }
            },
        };
        let store = self.store.clone();
        let rx = if op == Operation::Delete {
            let rv = object
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<u64>().ok());
            if ty == ResourceType::Pod {
                let uid = object
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                store
                    .submit(move |c| {
                        super::changes::with_delete_rv(rv, || {
                            delete_pod_job(c, &key, uid.as_deref())
                        })
                    })
                    .await
            } else {
                // A delete naming a UID leaves a newer incarnation (another UID) alone; one
                // without (KubeEdge's older cloud) removes the key.
                let uid = object
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                store
                    .submit(move |c| {
                        super::changes::with_delete_rv(rv, || delete_job(c, &key, uid.as_deref()))
                    })
                    .await
            }
        } else {
            // Serialised once for its row; what the store checks is taken from the value here.
            let record = MetaRecord::new(key, ty.clone(), object.to_string());
            let facts = ObjectFacts::of(&object);
            store
                .submit(move |c| {
                    super::store::upsert_known_object_in(c, &record, Some(facts))
                        .map(Written::Upserted)
                })
                .await
        };
        Some(pending(msg, path, object, true, rx))
    }

    async fn queue(
        &self,
        msg: Message,
        path: ResourcePath,
        object: Value,
        ack: bool,
        plan: StorePlan,
    ) -> Option<BoxFuture<'static, Applied>> {
        let rx = self.store.submit(move |c| plan_job(c, &plan)).await;
        Some(pending(msg, path, object, ack, rx))
    }

    /// After the write: tell edged, then acknowledge. A failed write is only logged: without
    /// an ACK the cloud resends it.
    async fn finish(&self, applied: Applied) {
        let Applied {
            msg,
            path,
            object,
            ack,
            result,
        } = applied;
        let written = match result {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(resource = %msg.route.resource, msg_id = %msg.header.id, error = %e,
                    "write failed; not acknowledged, the cloud will resend");
                return;
            }
        };
        let action = match written {
            Written::Upserted(UpsertOutcome::Written)
            | Written::Replaced(ReplaceOutcome::Replaced) => Some(ChangeAction::Upsert),
            Written::Upserted(UpsertOutcome::KeptNewer { stored_rv }) => {
                tracing::info!(resource = %msg.route.resource, stored_rv, incoming_rv = %msg.header.resource_version,
                    "stored copy is newer; kept");
                None
            }
            Written::Replaced(ReplaceOutcome::NotPresent | ReplaceOutcome::KeptNewer { .. }) => {
                None
            }
            Written::Deleted(DeleteOutcome::Deleted | DeleteOutcome::Absent) => {
                Some(ChangeAction::Delete)
            }
            Written::Deleted(DeleteOutcome::UidMismatch { stored_uid }) => {
                tracing::info!(resource = %msg.route.resource, %stored_uid,
                    "delete for another incarnation of the object; stored one kept");
                None
            }
        };
        if let Some(action) = action
            && matches!(
                path.resource_type,
                ResourceType::Device | ResourceType::DeviceModel
            )
        {
            let change = DeviceObject {
                resource_type: path.resource_type.clone(),
                action,
                namespace: path.namespace_token().to_string(),
                name: path.name.clone().unwrap_or_default(),
                object: object.clone(),
            };
            self.to_twin(change).await;
        }
        if let Some(action) = action.filter(|_| edged_acts_on(&path.resource_type)) {
            let change = ObjectChange {
                kind: path.resource_type.clone(),
                action,
                key: path.to_wire(),
                namespace: path.namespace_token().to_string(),
                name: path.name.clone().unwrap_or_default(),
                object,
            };
            if self.edged.send(change).await.is_err() {
                tracing::debug!(resource = %msg.route.resource, "edged is not listening; it reads the database when it starts");
            }
        }
        if ack {
            self.ack(&msg).await;
        }
    }

    async fn ack(&self, msg: &Message) {
        if let Err(e) = self.link.send(Message::ack_for(msg)).await {
            tracing::debug!(resource = %msg.route.resource, error = %e,
                "ACK not sent; the cloud resends and the redelivery is idempotent");
        }
    }

    /// Tells the cloud a message cannot be processed (it logs `error` messages). No ACK.
    async fn reject(&self, msg: &Message, reason: &str) {
        tracing::warn!(resource = %msg.route.resource, operation = %msg.route.operation, msg_id = %msg.header.id, reason, "message from the cloud rejected");
        let _ = self.link.send(Message::error_to(msg, reason)).await;
    }

    /// Serves one request from edged.
    async fn serve(&self, req: MetaRequest) -> Result<Value, MetaError> {
        if let Some(why) = req.path_error() {
            return Err(MetaError::BadRequest(why));
        }
        if req.path.resource_type == ResourceType::Event {
            return self.forward_event(req.into_message()).await;
        }
        let path = &req.path;
        let ty = &path.resource_type;
        match req.operation {
            Operation::Query => {
                // The cloud sends every change of the configmaps and secrets this node's pods
                // use (KubeEdge's cloudcore and ours): a stored copy is current, and asking
                // again (edged rereads volumes every minute) only costs the link.
                if matches!(ty, ResourceType::ConfigMap | ResourceType::Secret)
                    && path.name.is_some()
                {
                    let values = self.store.query(path).await?;
                    if !values.is_empty() {
                        return Ok(content::query_reply(values));
                    }
                }
                if is_remote_query_type(ty) && self.link.is_connected() {
                    match self.remote(req.to_message(), path).await {
                        Ok(reply) => return reply_content(reply),
                        Err(e) if e.is_link_failure() => {
                            tracing::info!(resource = %path, error = %e, "remote query failed; answering from the database");
                        }
                        Err(e) => return Err(e),
                    }
                }
                let values = self.store.query(path).await?;
                Ok(content::query_reply(values))
            }
            Operation::Insert | Operation::Delete => self.remote_reply(req).await,
            Operation::Update if ty == "lease" => self.remote_reply(req).await,
            Operation::Update => {
                let value = content::content_json(&req.content)
                    .map(|v| v.to_string())
                    .map_err(|e| MetaError::BadRequest(format!("content is not JSON: {e}")))?;
                let key = path.to_wire();
                self.store
                    .upsert(MetaRecord::new(key.clone(), ty.clone(), value))
                    .await?;
                if let Err(e) = self.link.send(req.into_message()).await {
                    tracing::debug!(resource = %key, error = %e, "update kept locally; not sent to the cloud");
                }
                Ok(content::ok())
            }
            Operation::Patch => {
                if !self.link.is_connected() {
                    return Err(MetaError::NotConnected);
                }
                let patch =
                    String::from_utf8_lossy(&content::content_bytes(&req.content)).into_owned();
                self.store
                    .upsert(MetaRecord::new(path.to_wire(), ty.clone(), patch))
                    .await?;
                self.remote_reply(req).await
            }
            ref other => Err(MetaError::BadRequest(format!(
                "operation {other:?} is not supported by metamanager"
            ))),
        }
    }

    /// Events (`insert`/`update`/`patch` `<ns>/event/<name>`) go to the cloud as they are,
    /// unstored and unanswered (KubeEdge's `sendToCloud`), behind other traffic; offline they
    /// fail at once (edged drops them).
    async fn forward_event(&self, msg: Message) -> Result<Value, MetaError> {
        if !matches!(
            msg.route.operation,
            Operation::Insert | Operation::Update | Operation::Patch
        ) {
            return Err(MetaError::BadRequest(format!(
                "operation {} is not supported for events",
                msg.route.operation
            )));
        }
        if !self.link.is_connected() {
            return Err(MetaError::NotConnected);
        }
        self.link.send_background(msg).await?;
        Ok(content::ok())
    }

    /// Forwards an edged request to the cloud and waits for the reply; stores the object the
    /// reply carries, and acknowledges the reply when the cloud waits for that.
    /// Sends the request to the cloud (its content moved into the message) and answers with
    /// the reply's content.
    async fn remote_reply(&self, req: MetaRequest) -> Result<Value, MetaError> {
        let path = req.path.clone();
        reply_content(self.remote(req.into_message(), &path).await?)
    }

    async fn remote(&self, msg: Message, path: &ResourcePath) -> Result<Message, MetaError> {
        if !self.link.is_connected() {
            return Err(MetaError::NotConnected);
        }
        let operation = msg.route.operation.clone();
        let reply = self
            .link
            .request(msg, self.config.remote_query_timeout)
            .await?;
        if path.resource_type == ResourceType::ServiceAccountToken {
            self.remember_token(path, &reply).await;
        }
        let durable = match store_plan(&operation, path, &reply.content) {
            None => true,
            Some(plan) => {
                let key = plan.record.key.clone();
                match self.store.call(move |c| reply_job(c, &plan)).await {
                    Ok(changed) => {
                        if let Some(change) = changed {
                            tracing::debug!(resource = %key, rv = %change.object["metadata"]["resourceVersion"],
                                "a reply brought a newer pod; edged told");
                            if self.edged.send(change).await.is_err() {
                                tracing::debug!(resource = %key, "edged is not listening; it reads the database when it starts");
                            }
                        }
                        true
                    }
                    Err(e) => {
                        tracing::warn!(resource = %key, error = %e, "object from the cloud not stored; reply not acknowledged");
                        false
                    }
                }
            }
        };
        if durable && reply.requires_ack() {
            self.ack(&reply).await;
        }
        Ok(reply)
    }

    /// Keeps a digest of a token the cloud issued for one of this node's pods: the
    /// MetaServer accepts it as a bearer token (`tokens.rs`).
    async fn remember_token(&self, path: &ResourcePath, reply: &Message) {
        let Ok(answer) = kubeedge_shared::content::content_json(&reply.content) else {
            return;
        };
        let ns = path.namespace.as_deref().unwrap_or("default");
        let sa = path.name.as_deref().unwrap_or("default");
        if let Some(record) = super::tokens::record_of(ns, sa, &answer)
            && let Err(e) = super::tokens::remember(&self.store, record).await
        {
            tracing::warn!(namespace = ns, service_account = sa, error = %e,
                "service-account token not recorded; the MetaServer will not accept it");
        }
    }

    async fn send_inventory(&self) {
        let objects = match self.store.inventory().await {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the inventory from the database");
                return;
            }
        };
        let count = objects.len();
        let msg = Inventory { objects }.to_message(&self.config.node_name);
        match self.link.send(msg).await {
            Ok(()) => tracing::info!(objects = count, "inventory sent to the cloud"),
            Err(e) => tracing::warn!(error = %e, "inventory not sent"),
        }
    }
}

fn pending(
    msg: Message,
    path: ResourcePath,
    object: Value,
    ack: bool,
    rx: Result<tokio::sync::oneshot::Receiver<Result<Written, StoreError>>, StoreError>,
) -> BoxFuture<'static, Applied> {
    Box::pin(async move {
        let result = match rx {
            Ok(rx) => rx.await.unwrap_or(Err(StoreError::Closed)),
            Err(e) => Err(e),
        };
        Applied {
            msg,
            path,
            object,
            ack,
            result,
        }
    })
}

fn upsert_job(c: &rusqlite::Connection, r: &MetaRecord) -> Result<Written, StoreError> {
    super::store::upsert_object_in(c, r).map(Written::Upserted)
}

fn delete_job(
    c: &rusqlite::Connection,
    key: &str,
    uid: Option<&str>,
) -> Result<Written, StoreError> {
    super::store::delete_object_in(c, key, uid).map(Written::Deleted)
}

fn delete_pod_job(
    c: &rusqlite::Connection,
    key: &str,
    uid: Option<&str>,
) -> Result<Written, StoreError> {
    super::store::delete_pod_in(c, key, uid).map(Written::Deleted)
}

fn plan_job(c: &rusqlite::Connection, plan: &StorePlan) -> Result<Written, StoreError> {
    if plan.same_uid_only {
        super::store::replace_if_same_uid_in(c, &plan.record).map(Written::Replaced)
    } else {
        upsert_job(c, &plan.record)
    }
}

/// Writes the object a reply carries. Returns the change edged must be told of when the
/// reply brought a pod edged runs in a newer form than its stored copy beyond the status:
/// a status patch's reply is the pod as the API server has it now, e.g. with a
/// `deletionTimestamp` the cloud's own message carries at an older resourceVersion. Once
/// this copy is stored, that message is kept out as older (and an inventory sent now reports
/// the pod current), so edged would never hear of the deletion.
fn reply_job(
    c: &rusqlite::Connection,
    plan: &StorePlan,
) -> Result<Option<ObjectChange>, StoreError> {
    let path = ResourcePath::parse(&plan.record.key).ok();
    let pod = path
        .as_ref()
        .filter(|p| p.resource_type == ResourceType::Pod && p.name.is_some());
    let Some(path) = pod else {
        plan_job(c, plan)?;
        return Ok(None);
    };
    let before = super::store::stored_value(c, &plan.record.key)?
        .and_then(|s| serde_json::from_str::<Value>(&s).ok());
    let written = plan_job(c, plan)?;
    if !matches!(
        written,
        Written::Upserted(UpsertOutcome::Written) | Written::Replaced(ReplaceOutcome::Replaced)
    ) {
        return Ok(None);
    }
    let Ok(after) = serde_json::from_str::<Value>(&plan.record.value) else {
        return Ok(None);
    };
    // Only a pod edged already has (same UID): a new one reaches edged with the cloud's
    // own message for it.
    let Some(before) = before.filter(|b| {
        b.pointer("/metadata/uid").is_some()
            && b.pointer("/metadata/uid") == after.pointer("/metadata/uid")
    }) else {
        return Ok(None);
    };
    if acted_on(&before) == acted_on(&after) {
        return Ok(None);
    }
    Ok(Some(ObjectChange {
        kind: ResourceType::Pod,
        action: ChangeAction::Upsert,
        key: path.to_wire(),
        namespace: path.namespace_token().to_string(),
        name: path.name.clone().unwrap_or_default(),
        object: after,
    }))
}

/// What edged acts on in a pod: everything but its status (edged's own report) and the
/// server's bookkeeping.
fn acted_on(pod: &Value) -> Value {
    let mut v = pod.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("status");
    }
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for volatile in ["resourceVersion", "managedFields"] {
            m.remove(volatile);
        }
    }
    v
}

/// The object a reply from the cloud carries, if it carries one: the `Object` of a successful
/// `ObjectResp`, or a bare Kubernetes object. `"OK"`, error texts and `StatusError`s carry none.
fn reply_object(content: &Value) -> Option<Value> {
    if let Some(resp) = ObjectResp::from_content(content) {
        return if resp.err.is_none() {
            resp.object.filter(Value::is_object)
        } else {
            None
        };
    }
    if StatusError::from_content(content).is_some() {
        return None;
    }
    let v = match content {
        Value::String(s) => serde_json::from_str::<Value>(s).ok()?,
        other => other.clone(),
    };
    v.get("metadata").is_some().then_some(v)
}

/// Where the object of a reply to `op` on `path` is stored (KubeEdge `handleMessageFromRemote`):
/// under the request's key, except that a status patch stores the returned pod/node under the
/// object's own key. Pod deletes and service-account tokens are not stored.
fn store_plan(op: &Operation, path: &ResourcePath, reply_content: &Value) -> Option<StorePlan> {
    if *op == Operation::Delete {
        return None;
    }
    let object = reply_object(reply_content)?;
    let mut target = path.clone();
    let mut same_uid_only = false;
    match path.resource_type {
        ResourceType::ServiceAccountToken | ResourceType::PodStatus | ResourceType::NodeStatus => {
            return None;
        }
        ResourceType::PodPatch => {
            target.resource_type = ResourceType::Pod;
            same_uid_only = true;
        }
        ResourceType::NodePatch => target.resource_type = ResourceType::Node,
        _ => {}
    }
    target.name.as_ref()?;
    Some(StorePlan {
        record: MetaRecord::new(
            target.to_wire(),
            target.resource_type.clone(),
            object.to_string(),
        ),
        same_uid_only,
    })
}

/// The metamanager: a loop over cloud messages (writes in arrival order, completions in the
/// same order), a dispatcher for edged's requests and a watcher of link events.
pub(crate) async fn run<L: CloudLink>(
    ctx: Arc<Context<L>>,
    mut from_cloud: mpsc::Receiver<Message>,
    requests: mpsc::Receiver<EdgedRequest>,
    link_events: broadcast::Receiver<LinkEvent>,
    cancel: CancellationToken,
) {
    let dispatcher = tokio::spawn(dispatch_requests(ctx.clone(), requests, cancel.clone()));
    let watcher = tokio::spawn(watch_link(ctx.clone(), link_events, cancel.clone()));

    let mut pending: FuturesOrdered<BoxFuture<'static, Applied>> = FuturesOrdered::new();
    let mut cloud_open = true;
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            Some(applied) = pending.next(), if !pending.is_empty() => ctx.finish(applied).await,
            m = from_cloud.recv(), if cloud_open && pending.len() < ctx.config.max_inflight.max(1) => match m {
                Some(msg) => {
                    if let Some(p) = ctx.begin(msg).await {
                        pending.push_back(p);
                    }
                }
                None => {
                    tracing::debug!("edgehub stopped delivering messages");
                    cloud_open = false;
                }
            },
        }
    }
    let drain = async {
        while let Some(applied) = pending.next().await {
            ctx.finish(applied).await;
        }
    };
    if tokio::time::timeout(DRAIN_TIMEOUT, drain).await.is_err() {
        tracing::warn!(
            "writes still in progress at shutdown; the cloud resends what was not acknowledged"
        );
    }
    let _ = dispatcher.await;
    let _ = watcher.await;
}

/// The content of the cloud's reply to an edged request; an `Error` reply is a failure.
fn reply_content(reply: Message) -> Result<Value, MetaError> {
    if reply.route.operation == Operation::Error {
        return Err(MetaError::Remote(kubeedge_edged::meta::text_of(
            &reply.content,
        )));
    }
    Ok(reply.content)
}

async fn dispatch_requests<L: CloudLink>(
    ctx: Arc<Context<L>>,
    mut requests: mpsc::Receiver<EdgedRequest>,
    cancel: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(ctx.config.max_concurrent_requests.max(1)));
    loop {
        let permit = tokio::select! {
            _ = cancel.cancelled() => return,
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
        };
        let req = tokio::select! {
            _ = cancel.cancelled() => return,
            r = requests.recv() => match r { Some(r) => r, None => return },
        };
        let ctx = ctx.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let EdgedRequest { req, reply } = req;
            let result = tokio::select! {
                r = ctx.serve(req) => r,
                _ = cancel.cancelled() => Err(MetaError::Stopped),
            };
            let _ = reply.send(result);
        });
    }
}

async fn watch_link<L: CloudLink>(
    ctx: Arc<Context<L>>,
    mut events: broadcast::Receiver<LinkEvent>,
    cancel: CancellationToken,
) {
    if !ctx.config.inventory_resync {
        return;
    }
    // The link may have come up before we subscribed.
    if ctx.link.is_connected() {
        ctx.send_inventory().await;
    }
    loop {
        let ev = tokio::select! {
            _ = cancel.cancelled() => return,
            ev = events.recv() => ev,
        };
        match ev {
            Ok(LinkEvent::Connected) => ctx.send_inventory().await,
            Ok(LinkEvent::Disconnected { .. }) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => {
                if ctx.link.is_connected() {
                    ctx.send_inventory().await;
                }
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests;
