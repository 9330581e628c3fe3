//! Message handling (protocol §5.2): objects from the cloud are written, then handed to
//! edged, then acknowledged; edged's requests are answered from the cloud or the database.

use super::client::MetaError;
use super::store::{MetaRecord, MetaStore, ReplaceOutcome, StoreError, UpsertOutcome};
use super::{
    ChangeAction, DeleteOutcome, DeviceObject, EdgedRequest, MetaManagerConfig, ObjectChange,
    Routes, ToTwin, edged_acts_on, is_remote_query_type,
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
    routes: Routes,
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
        routes: Routes,
    ) -> Self {
        Context {
            config,
            store,
            link,
            edged,
            routes,
        }
    }

    /// Hands devicetwin its message; without devicetwin it is dropped.
    async fn to_twin(&self, input: ToTwin) {
        match &self.routes.twin {
            Some(tx) => {
                if tx.send(input).await.is_err() {
                    tracing::debug!("devicetwin stopped; device message dropped");
                }
            }
            None => tracing::debug!("devicetwin is disabled; device message dropped"),
        }
    }

    /// Validates a cloud message and queues its write. `None` when there is nothing to write.
    async fn begin(&self, msg: Message) -> Option<BoxFuture<'static, Applied>> {
        if msg.route.group == Group::Twin {
            self.to_twin(ToTwin::Cloud(msg)).await;
            return None;
        }
        if msg.route.group == Group::User {
            // As KubeEdge's edgehub: `router_servicebus` to the servicebus, the rest to the bus.
            let (module, route) = if msg.route.source == source::ROUTER_SERVICEBUS {
                ("servicebus", &self.routes.servicebus)
            } else {
                ("eventbus", &self.routes.bus)
            };
            match route {
                Some(tx) => {
                    if tx.send(msg).await.is_err() {
                        tracing::debug!(module, "module stopped; router message dropped");
                    }
                }
                None => {
                    tracing::debug!(module, resource = %msg.route.resource, "module is disabled; router message dropped")
                }
            }
            return None;
        }
        if msg.route.group == Group::TaskManager {
            match &self.routes.tasks {
                Some(tx) => {
                    if tx.send(msg).await.is_err() {
                        tracing::debug!("taskmanager stopped; node task dropped");
                    }
                }
                None => tracing::info!(resource = %msg.route.resource,
                    "node task for a disabled taskmanager; dropped (modules.taskManager.enable)"),
            }
            return None;
        }
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
            let record = MetaRecord::new(key, ty.as_str(), object.to_string());
            store.submit(move |c| upsert_job(c, &record)).await
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
            self.to_twin(ToTwin::Object(change)).await;
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
    async fn serve(&self, msg: Message) -> Result<Message, MetaError> {
        let path = msg
            .resource_path()
            .map_err(|e| MetaError::BadRequest(e.to_string()))?;
        let ty = &path.resource_type;
        if *ty == ResourceType::Event {
            return self.forward_event(msg).await;
        }
        match msg.route.operation {
            Operation::Query => {
                // The cloud sends every change of the configmaps and secrets this node's pods
                // use (KubeEdge's cloudcore and ours): a stored copy is current, and asking
                // again (edged rereads volumes every minute) only costs the link.
                if matches!(ty, ResourceType::ConfigMap | ResourceType::Secret)
                    && path.name.is_some()
                {
                    let values = self.store.query(&path).await?;
                    if !values.is_empty() {
                        return Ok(self.local_reply(&msg, content::query_reply(values)));
                    }
                }
                if is_remote_query_type(ty) && self.link.is_connected() {
                    match self.remote(&msg, &path).await {
                        Ok(reply) => return Ok(reply),
                        Err(e) if e.is_link_failure() => {
                            tracing::info!(resource = %msg.route.resource, error = %e, "remote query failed; answering from the database");
                        }
                        Err(e) => return Err(e),
                    }
                }
                let values = self.store.query(&path).await?;
                Ok(self.local_reply(&msg, content::query_reply(values)))
            }
            Operation::Insert | Operation::Delete => self.remote(&msg, &path).await,
            Operation::Update if ty == "lease" => self.remote(&msg, &path).await,
            Operation::Update => {
                let value = content::content_json(&msg.content)
                    .map(|v| v.to_string())
                    .map_err(|e| MetaError::BadRequest(format!("content is not JSON: {e}")))?;
                self.store
                    .upsert(MetaRecord::new(
                        msg.route.resource.clone(),
                        ty.as_str(),
                        value,
                    ))
                    .await?;
                if let Err(e) = self.link.send(msg.clone()).await {
                    tracing::debug!(resource = %msg.route.resource, error = %e, "update kept locally; not sent to the cloud");
                }
                Ok(self.local_reply(&msg, content::ok()))
            }
            Operation::Patch => {
                if !self.link.is_connected() {
                    return Err(MetaError::NotConnected);
                }
                let patch =
                    String::from_utf8_lossy(&content::content_bytes(&msg.content)).into_owned();
                self.store
                    .upsert(MetaRecord::new(
                        msg.route.resource.clone(),
                        ty.as_str(),
                        patch,
                    ))
                    .await?;
                self.remote(&msg, &path).await
            }
            ref other => Err(MetaError::BadRequest(format!(
                "operation {other:?} is not supported by metamanager"
            ))),
        }
    }

    /// Events (`insert`/`update`/`patch` `<ns>/event/<name>`) go to the cloud as they are,
    /// unstored and unanswered (KubeEdge's `sendToCloud`), behind other traffic; offline they
    /// fail at once (edged drops them).
    async fn forward_event(&self, msg: Message) -> Result<Message, MetaError> {
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
        let reply = self.local_reply(&msg, content::ok());
        self.link.send_background(msg).await?;
        Ok(reply)
    }

    fn local_reply(&self, req: &Message, content: Value) -> Message {
        let mut reply = Message::response_to(req, content);
        reply.route.source = source::METAMANAGER.to_string();
        reply
    }

    /// Forwards an edged request to the cloud and waits for the reply; stores the object the
    /// reply carries, and acknowledges the reply when the cloud waits for that.
    async fn remote(&self, msg: &Message, path: &ResourcePath) -> Result<Message, MetaError> {
        if !self.link.is_connected() {
            return Err(MetaError::NotConnected);
        }
        let reply = self
            .link
            .request(msg.clone(), self.config.remote_query_timeout)
            .await?;
        if path.resource_type == ResourceType::ServiceAccountToken {
            self.remember_token(path, &reply).await;
        }
        let durable = match store_plan(&msg.route.operation, path, &reply.content) {
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
            target.resource_type.as_str(),
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
            let EdgedRequest { msg, reply } = req;
            let result = tokio::select! {
                r = ctx.serve(msg) => r,
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
mod tests {
    use super::*;
    use crate::edgehub::HubError;
    use crate::metamanager::{MetaClient, MetaManager};
    use serde_json::json;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A cloud link whose state and replies the test sets.
    #[derive(Clone)]
    struct FakeLink {
        connected: Arc<AtomicBool>,
        sent: Arc<Mutex<Vec<Message>>>,
        requests: Arc<Mutex<Vec<Message>>>,
        reply: Arc<Mutex<Option<Value>>>,
        events: broadcast::Sender<LinkEvent>,
    }

    impl FakeLink {
        fn new(connected: bool) -> Self {
            FakeLink {
                connected: Arc::new(AtomicBool::new(connected)),
                sent: Default::default(),
                requests: Default::default(),
                reply: Default::default(),
                events: broadcast::channel(16).0,
            }
        }

        fn sent(&self) -> Vec<Message> {
            self.sent.lock().unwrap().clone()
        }
    }

    impl CloudLink for FakeLink {
        fn is_connected(&self) -> bool {
            self.connected.load(Ordering::SeqCst)
        }

        async fn send(&self, msg: Message) -> Result<(), HubError> {
            if !self.is_connected() {
                return Err(HubError::NotConnected);
            }
            self.sent.lock().unwrap().push(msg);
            Ok(())
        }

        async fn request(&self, msg: Message, _timeout: Duration) -> Result<Message, HubError> {
            if !self.is_connected() {
                return Err(HubError::NotConnected);
            }
            self.requests.lock().unwrap().push(msg.clone());
            let content = self.reply.lock().unwrap().clone();
            match content {
                Some(c) => {
                    let mut r = Message::response_to(&msg, c);
                    r.route.source = "edgecontroller".into();
                    r.route.group = Group::Resource;
                    Ok(r)
                }
                None => Err(HubError::Timeout(Duration::from_millis(1))),
            }
        }

        fn subscribe(&self) -> broadcast::Receiver<LinkEvent> {
            self.events.subscribe()
        }
    }

    struct Rig {
        _dir: tempfile::TempDir,
        store: MetaStore,
        link: FakeLink,
        cloud: mpsc::Sender<Message>,
        client: MetaClient,
        edged: mpsc::Receiver<ObjectChange>,
        manager: MetaManager,
    }

    async fn rig(connected: bool) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let store = MetaStore::open(dir.path().join("edgecore.db"))
            .await
            .unwrap();
        let link = FakeLink::new(connected);
        let (cloud, from_cloud) = mpsc::channel(16);
        let config = MetaManagerConfig {
            node_name: "edge-1".into(),
            remote_query_timeout: Duration::from_secs(1),
            ..MetaManagerConfig::default()
        };
        let (manager, client, edged) =
            MetaManager::start(config, store.clone(), link.clone(), from_cloud);
        Rig {
            _dir: dir,
            store,
            link,
            cloud,
            client,
            edged,
            manager,
        }
    }

    fn pod_msg(op: Operation, name: &str, uid: &str, rv: &str) -> Message {
        Message::new(
            source::EDGE_CONTROLLER,
            Group::Resource,
            op,
            format!("default/pod/{name}"),
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": "default", "uid": uid, "resourceVersion": rv},
                   "spec": {"nodeName": "edge-1"}}),
        )
        .with_resource_version(rv)
    }

    async fn next_change(rx: &mut mpsc::Receiver<ObjectChange>) -> ObjectChange {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap()
    }

    async fn wait_for_acks(link: &FakeLink, n: usize) -> Vec<Message> {
        for _ in 0..500 {
            let acks: Vec<_> = link
                .sent()
                .into_iter()
                .filter(|m| m.route.operation == Operation::Response)
                .collect();
            if acks.len() >= n {
                return acks;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("expected {n} ACKs, got {:?}", link.sent());
    }

    #[tokio::test]
    async fn cloud_update_of_unknown_pod_is_stored_forwarded_and_acked() {
        let mut r = rig(true).await;
        let msg = pod_msg(Operation::Update, "web-0", "u1", "5");
        r.cloud.send(msg.clone()).await.unwrap();
        let change = next_change(&mut r.edged).await;
        assert_eq!(change.kind, ResourceType::Pod);
        assert_eq!(change.action, ChangeAction::Upsert);
        assert_eq!(change.key, "default/pod/web-0");
        assert_eq!(change.object["metadata"]["uid"], "u1");
        let acks = wait_for_acks(&r.link, 1).await;
        assert_eq!(acks[0].parent_id(), msg.id());
        assert_eq!(acks[0].content, json!("OK"));
        assert!(r.store.get("default/pod/web-0").await.unwrap().is_some());
        r.manager.shutdown().await;
    }

    #[tokio::test]
    async fn service_account_access_is_stored_updated_deleted_and_acked() {
        let r = rig(true).await;
        let acc = |rv: &str, verbs: Value| {
            json!({"apiVersion": "policy.kubeedge.io/v1alpha1", "kind": "ServiceAccountAccess",
                "metadata": {"name": "sa", "namespace": "ns", "uid": "u1", "resourceVersion": rv},
                "spec": {"accessClusterRoleBinding": [{"rules": [{"verbs": verbs}]}]}})
        };
        let msg = |op: Operation, rv: &str, content: Value| {
            Message::new(
                source::POLICY_CONTROLLER,
                Group::Resource,
                op,
                "ns/serviceaccountaccess/sa",
                content,
            )
            .with_resource_version(rv)
        };
        // An object of that type from anyone else (an application's watch) is not stored.
        let mut foreign = msg(Operation::Insert, "9", acc("9", json!(["*"])));
        foreign.route.source = source::DYNAMIC_CONTROLLER.into();
        r.cloud.send(foreign).await.unwrap();
        wait_for_acks(&r.link, 1).await;
        assert!(
            r.store
                .service_account_accesses("ns", "sa")
                .await
                .unwrap()
                .is_empty()
        );
        let stored = || async {
            r.store
                .service_account_accesses("ns", "sa")
                .await
                .unwrap()
                .first()
                .cloned()
        };
        let insert = msg(Operation::Insert, "10", acc("10", json!(["get"])));
        r.cloud.send(insert.clone()).await.unwrap();
        assert_eq!(wait_for_acks(&r.link, 2).await[1].parent_id(), insert.id());
        assert_eq!(stored().await, Some(acc("10", json!(["get"]))));
        let row = r.store.list_type("serviceaccountaccess").await.unwrap();
        assert_eq!(row.len(), 1);
        assert_eq!(row[0].key, "ns/serviceaccountaccess/sa");

        r.cloud
            .send(msg(Operation::Update, "12", acc("12", json!(["list"]))))
            .await
            .unwrap();
        wait_for_acks(&r.link, 3).await;
        // An older version arriving late (a resend) does not win.
        r.cloud
            .send(msg(Operation::Update, "11", acc("11", json!(["*"]))))
            .await
            .unwrap();
        wait_for_acks(&r.link, 4).await;
        assert_eq!(stored().await, Some(acc("12", json!(["list"]))));

        let gone = json!({"metadata": {"name": "sa", "namespace": "ns", "uid": "u1", "resourceVersion": "13"}});
        r.cloud
            .send(msg(Operation::Delete, "13", gone))
            .await
            .unwrap();
        wait_for_acks(&r.link, 5).await;
        assert_eq!(stored().await, None);
        r.manager.shutdown().await;
    }

    #[tokio::test]
    async fn malformed_cloud_messages_are_rejected_not_acked() {
        let r = rig(true).await;
        let mut bad = pod_msg(Operation::Insert, "x", "u", "1");
        bad.content = json!("not json at all");
        r.cloud.send(bad.clone()).await.unwrap();
        let mut short = pod_msg(Operation::Insert, "y", "u", "1");
        short.route.resource = "default/pod".into();
        r.cloud.send(short).await.unwrap();
        let good = pod_msg(Operation::Insert, "z", "u", "1");
        r.cloud.send(good.clone()).await.unwrap();
        let acks = wait_for_acks(&r.link, 1).await;
        assert_eq!(acks.len(), 1);
        assert_eq!(acks[0].parent_id(), good.id());
        let errors: Vec<_> = r
            .link
            .sent()
            .into_iter()
            .filter(|m| m.route.operation == Operation::Error)
            .collect();
        assert_eq!(errors.len(), 2);
        assert_eq!(r.store.count().await.unwrap(), 1);
    }

    #[tokio::test]
    async fn offline_queries_come_from_the_database_and_remote_writes_fail_fast() {
        let mut r = rig(true).await;
        let cm = Message::new(
            source::EDGE_CONTROLLER,
            Group::Resource,
            Operation::Insert,
            "default/configmap/cfg",
            json!({"metadata": {"name": "cfg", "namespace": "default", "uid": "c1", "resourceVersion": "3"}, "data": {"k": "v"}}),
        );
        r.cloud.send(cm).await.unwrap();
        r.cloud
            .send(pod_msg(Operation::Insert, "a", "u1", "1"))
            .await
            .unwrap();
        next_change(&mut r.edged).await;
        next_change(&mut r.edged).await;
        r.link.connected.store(false, Ordering::SeqCst);

        let got = r.client.get_configmap("default", "cfg").await.unwrap();
        assert_eq!(got["data"]["k"], "v");
        assert_eq!(r.client.list_pods().await.unwrap().len(), 1);
        assert!(matches!(
            r.client.get_secret("default", "nope").await,
            Err(MetaError::NotFound { .. })
        ));
        let err = r
            .client
            .register_node(json!({"metadata": {"name": "edge-1"}}))
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "failed to process remote: not connected");
        assert!(matches!(
            r.client
                .patch_pod_status("default", "a", &json!({"status": {}}))
                .await,
            Err(MetaError::NotConnected)
        ));
        assert!(r.link.requests.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn events_go_to_the_cloud_unstored_and_fail_fast_offline() {
        let r = rig(true).await;
        let event = json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "web.17a", "namespace": "ns"}, "reason": "Started", "count": 1});
        r.client.create_event(&event).await.unwrap();
        r.client
            .patch_event(&event, &json!({"count": 2}))
            .await
            .unwrap();
        let events = |link: &FakeLink| -> Vec<Message> {
            link.sent()
                .into_iter()
                .filter(|m| m.route.resource.contains("/event/"))
                .collect()
        };
        let sent = events(&r.link);
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0].route.resource, "ns/event/web.17a");
        assert_eq!(sent[0].route.operation, Operation::Insert);
        assert_eq!(sent[0].content["reason"], "Started");
        assert_eq!(sent[1].route.operation, Operation::Patch);
        assert_eq!(sent[1].content["event"]["metadata"]["name"], "web.17a");
        assert_eq!(sent[1].content["patchData"], r#"{"count":2}"#);
        assert!(
            r.link.requests.lock().unwrap().is_empty(),
            "no reply awaited"
        );
        assert_eq!(r.store.count().await.unwrap(), 0, "events are not stored");

        r.link.connected.store(false, Ordering::SeqCst);
        assert!(matches!(
            r.client.create_event(&event).await,
            Err(MetaError::NotConnected)
        ));
        assert_eq!(events(&r.link).len(), 2);
    }

    #[tokio::test]
    async fn remote_query_stores_the_object_and_acks_the_reply() {
        let r = rig(true).await;
        *r.link.reply.lock().unwrap() = Some(
            json!({"metadata": {"name": "s", "namespace": "ns", "uid": "s1", "resourceVersion": "9"}, "data": {}}),
        );
        let got = r.client.get_secret("ns", "s").await.unwrap();
        assert_eq!(got["metadata"]["uid"], "s1");
        let reqs = r.link.requests.lock().unwrap().clone();
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].route.source, "edged");
        assert_eq!(reqs[0].route.group, Group::Meta);
        assert_eq!(reqs[0].route.operation, Operation::Query);
        assert_eq!(reqs[0].route.resource, "ns/secret/s");
        assert!(r.store.get("ns/secret/s").await.unwrap().is_some());
        // The reply carries an object, so the cloud waits for an ACK of it.
        let acks = wait_for_acks(&r.link, 1).await;
        assert_eq!(acks[0].route.resource, "ns/secret/s");

        // A timeout falls back to the stored copy.
        *r.link.reply.lock().unwrap() = None;
        let again = r.client.get_secret("ns", "s").await.unwrap();
        assert_eq!(again["metadata"]["uid"], "s1");
    }

    #[tokio::test]
    async fn status_patch_reply_updates_only_the_same_pod() {
        let mut r = rig(true).await;
        r.cloud
            .send(pod_msg(Operation::Insert, "a", "u1", "1"))
            .await
            .unwrap();
        next_change(&mut r.edged).await;
        *r.link.reply.lock().unwrap() = Some(
            ObjectResp::object(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "a", "namespace": "default", "uid": "u1", "resourceVersion": "2"},
                "spec": {"nodeName": "edge-1"}, "status": {"phase": "Running"}}))
            .to_value(),
        );
        let pod = r
            .client
            .patch_pod_status("default", "a", &json!({"status": {"phase": "Running"}}))
            .await
            .unwrap();
        assert_eq!(pod["status"]["phase"], "Running");
        let stored: Value =
            serde_json::from_str(&r.store.get("default/pod/a").await.unwrap().unwrap()).unwrap();
        assert_eq!(stored["status"]["phase"], "Running");
        let req = r.link.requests.lock().unwrap()[0].clone();
        assert_eq!(req.route.resource, "default/podpatch/a");
        assert!(req.content.is_string(), "patches travel as JSON strings");
        assert!(r.store.get("default/podpatch/a").await.unwrap().is_some());

        // The pod was deleted meanwhile: the patch reply must not bring it back.
        r.cloud
            .send(pod_msg(Operation::Delete, "a", "u1", "3"))
            .await
            .unwrap();
        assert_eq!(next_change(&mut r.edged).await.action, ChangeAction::Delete);
        r.client
            .patch_pod_status("default", "a", &json!({"status": {}}))
            .await
            .unwrap();
        assert_eq!(r.store.get("default/pod/a").await.unwrap(), None);
    }

    /// A status patch's reply showing the pod being deleted (its `deletionTimestamp` newer than
    /// anything the cloud sent) reaches edged; the cloud's older copy that follows is kept out.
    #[tokio::test]
    async fn a_patch_reply_with_a_deletion_reaches_edged() {
        let mut r = rig(true).await;
        r.cloud
            .send(pod_msg(Operation::Insert, "a", "u1", "1"))
            .await
            .unwrap();
        next_change(&mut r.edged).await;
        *r.link.reply.lock().unwrap() = Some(
            ObjectResp::object(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "a", "namespace": "default", "uid": "u1", "resourceVersion": "9",
                    "deletionTimestamp": "2026-11-26T12:00:00Z", "deletionGracePeriodSeconds": 30},
                "spec": {"nodeName": "edge-1"}, "status": {"phase": "Running"}}))
            .to_value(),
        );
        r.client
            .patch_pod_status("default", "a", &json!({"status": {"phase": "Running"}}))
            .await
            .unwrap();
        let change = next_change(&mut r.edged).await;
        assert_eq!(change.action, ChangeAction::Upsert);
        assert_eq!(
            change.object["metadata"]["deletionTimestamp"],
            "2026-11-26T12:00:00Z"
        );
        // A status-only reply tells edged nothing.
        *r.link.reply.lock().unwrap() = Some(
            ObjectResp::object(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "a", "namespace": "default", "uid": "u1", "resourceVersion": "10",
                    "deletionTimestamp": "2026-11-26T12:00:00Z", "deletionGracePeriodSeconds": 30},
                "spec": {"nodeName": "edge-1"}, "status": {"phase": "Succeeded"}}))
            .to_value(),
        );
        r.client
            .patch_pod_status("default", "a", &json!({"status": {"phase": "Succeeded"}}))
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(200), r.edged.recv())
                .await
                .is_err(),
            "status-only replies are edged's own news"
        );
    }

    #[tokio::test]
    async fn node_registration_returns_the_object_or_the_api_error() {
        let r = rig(true).await;
        *r.link.reply.lock().unwrap() = Some(
            ObjectResp::object(json!({"metadata": {"name": "edge-1", "uid": "n1"}})).to_value(),
        );
        let node = r
            .client
            .register_node(json!({"metadata": {"name": "edge-1"}}))
            .await
            .unwrap();
        assert_eq!(node["metadata"]["uid"], "n1");
        assert!(r.store.get("default/node/edge-1").await.unwrap().is_some());
        *r.link.reply.lock().unwrap() =
            Some(ObjectResp::error(StatusError::already_exists("nodes", "edge-1")).to_value());
        match r
            .client
            .register_node(json!({"metadata": {"name": "edge-1"}}))
            .await
        {
            Err(MetaError::Api(e)) => assert_eq!(e.reason(), "AlreadyExists"),
            other => panic!("unexpected {other:?}"),
        }
        // No ACK is owed for these replies.
        assert!(
            r.link
                .sent()
                .iter()
                .all(|m| m.route.operation != Operation::Response)
        );
    }

    /// Router traffic (group `user`) goes where KubeEdge's edgehub sends it: `router_servicebus`
    /// to the servicebus, everything else to the eventbus.
    #[tokio::test]
    async fn router_messages_go_to_the_servicebus_or_the_eventbus_by_source() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetaStore::open(dir.path().join("edgecore.db"))
            .await
            .unwrap();
        let (bus, mut bus_rx) = mpsc::channel(4);
        let (servicebus, mut sb_rx) = mpsc::channel(4);
        let (edged, _edged_rx) = mpsc::channel(4);
        let routes = Routes {
            bus: Some(bus),
            servicebus: Some(servicebus),
            ..Routes::default()
        };
        let ctx = Context::new(
            MetaManagerConfig::default(),
            store,
            FakeLink::new(true),
            edged,
            routes,
        );
        let user = |src: &str, op: Operation, resource: &str| {
            Message::new(src, Group::User, op, resource, Value::Null)
        };
        let start = user(source::ROUTER_SERVICEBUS, Operation::Start, "http://c/api");
        let call = user(source::ROUTER_SERVICEBUS, Operation::from("GET"), "80:/");
        let subscribe = user(source::ROUTER_EVENTBUS, Operation::Subscribe, "default/t");
        for m in [start, call, subscribe] {
            assert!(ctx.begin(m).await.is_none(), "nothing to store");
        }
        assert_eq!(sb_rx.try_recv().unwrap().route.operation, Operation::Start);
        assert_eq!(sb_rx.try_recv().unwrap().route.resource, "80:/");
        assert_eq!(
            bus_rx.try_recv().unwrap().route.operation,
            Operation::Subscribe
        );
        assert!(sb_rx.try_recv().is_err() && bus_rx.try_recv().is_err());
    }

    /// Frames exactly as a KubeEdge v1.15 cloudhub writes them (gorilla `WriteJSON`: Go key
    /// order, `\u003c` escapes, trailing newline). Device-twin, router and upgrade traffic
    /// (`cloud/pkg/devicecontroller/controller/downstream.go` membership updates with group
    /// `twin`, its `twin` ACKs, router `user` messages, `nodeupgradejobcontroller` jobs) is for
    /// modules this edgecore does not run: dropped with a log, never ACKed or answered with an
    /// `error`, and the pod behind it is still stored and ACKed the way
    /// `cloud/pkg/cloudhub/dispatcher/message_dispatcher.go` (`ReceiveMessageAck` on
    /// `parent_msg_id`) expects.
    #[tokio::test]
    async fn kubeedge_twin_router_and_upgrade_traffic_is_ignored_and_pods_still_acked() {
        let mut r = rig(true).await;
        let frames = [
            r#"{"header":{"msg_id":"0b6c6c1e-6f0a-4bd4-9d7a-6a2f4ad0a001","timestamp":1718000000001},"route":{"source":"devicecontroller","group":"twin","operation":"update","resource":"membership"},"content":{"event_id":"","timestamp":1718000000001,"added_devices":[{"id":"dev-1","name":"dev-1","description":"","state":"","last_online":""}],"removed_devices":null}}
"#,
            r#"{"header":{"msg_id":"0b6c6c1e-6f0a-4bd4-9d7a-6a2f4ad0a002","parent_msg_id":"5f1b2d0e-0000-4000-8000-000000000001","timestamp":1718000000002},"route":{"source":"devicecontroller","group":"twin","operation":"response","resource":"twin"},"content":"OK"}
"#,
            r#"{"header":{"msg_id":"0b6c6c1e-6f0a-4bd4-9d7a-6a2f4ad0a003","timestamp":1718000000003},"route":{"source":"router_eventbus","group":"user","operation":"publish","resource":"default/topic/a"},"content":"aGVsbG8="}
"#,
            r#"{"header":{"msg_id":"0b6c6c1e-6f0a-4bd4-9d7a-6a2f4ad0a004","timestamp":1718000000004},"route":{"source":"nodeupgradejobcontroller","group":"nodeupgradejobcontroller","operation":"upgrade","resource":"nodeupgradejob/job-1/node/edge-1"},"content":{"UpgradeID":"job-1","HistoryID":"h","Version":"v1.15.3","UpgradeTool":"keadm","Image":"kubeedge/installation-package"}}
"#,
            r#"{"header":{"msg_id":"0b6c6c1e-6f0a-4bd4-9d7a-6a2f4ad0a005","timestamp":1718000000005,"resourceversion":"48213"},"route":{"source":"edgecontroller","group":"resource","operation":"insert","resource":"default/pod/nginx"},"content":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"nginx","namespace":"default","uid":"7d1c","resourceVersion":"48213","annotations":{"note":"<b> &"}},"spec":{"nodeName":"edge-1"},"status":{}}}
"#,
        ];
        let codec = kubeedge_shared::FrameCodec::default();
        for f in frames {
            r.cloud
                .send(codec.decode(f.as_bytes()).unwrap())
                .await
                .unwrap();
        }
        let change = next_change(&mut r.edged).await;
        assert_eq!(change.key, "default/pod/nginx");
        assert_eq!(change.object["metadata"]["annotations"]["note"], "<b> &");
        let acks = wait_for_acks(&r.link, 1).await;
        let ack: Value = serde_json::from_str(&codec.encode(&acks[0]).unwrap()).unwrap();
        assert_eq!(
            ack["header"]["parent_msg_id"],
            "0b6c6c1e-6f0a-4bd4-9d7a-6a2f4ad0a005"
        );
        assert_eq!(
            ack["route"],
            json!({"source": "edgecontroller", "group": "resource", "operation": "response", "resource": "default/pod/nginx"})
        );
        assert_eq!(ack["content"], "OK");
        assert!(ack["header"]["timestamp"].is_i64());
        // Cloud messages are handled in arrival order, so the ignored ones, before the pod,
        // are done with; shutdown drains anything still in flight.
        r.manager.shutdown().await;
        let sent: Vec<_> = r
            .link
            .sent()
            .into_iter()
            .filter(|m| !Inventory::is_inventory(m))
            .collect();
        assert_eq!(sent.len(), 1, "only the pod's ACK: {sent:?}");
        assert_eq!(r.store.count().await.unwrap(), 1);
    }

    #[tokio::test]
    async fn inventory_is_sent_when_the_link_comes_up() {
        let r = rig(false).await;
        r.store
            .upsert(MetaRecord::new(
                "default/pod/a",
                "pod",
                json!({"metadata": {"uid": "u1", "resourceVersion": "4"}}).to_string(),
            ))
            .await
            .unwrap();
        r.link.connected.store(true, Ordering::SeqCst);
        r.link.events.send(LinkEvent::Connected).unwrap();
        let mut inv = None;
        for _ in 0..500 {
            inv = r.link.sent().into_iter().find(Inventory::is_inventory);
            if inv.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let inv = inv.expect("inventory sent");
        assert_eq!(inv.route.resource, "default/inventory/edge-1");
        let parsed = Inventory::from_message(&inv).unwrap();
        assert_eq!(parsed.objects.len(), 1);
        assert_eq!(parsed.objects[0].uid, "u1");
        assert_eq!(parsed.objects[0].resource_version, "4");
    }

    #[test]
    fn reply_objects_are_recognised_in_every_shape() {
        let path = ResourcePath::parse("default/podpatch/a").unwrap();
        let pod = json!({"metadata": {"name": "a", "uid": "u"}});
        let plan = store_plan(
            &Operation::Patch,
            &path,
            &ObjectResp::object(pod.clone()).to_value(),
        )
        .unwrap();
        assert_eq!(plan.record.key, "default/pod/a");
        assert!(plan.same_uid_only);
        assert!(store_plan(&Operation::Patch, &path, &json!("OK")).is_none());
        let err = ObjectResp::error(StatusError::not_found("pods", "a")).to_value();
        assert!(store_plan(&Operation::Patch, &path, &err).is_none());
        assert!(
            store_plan(
                &Operation::Query,
                &path,
                &StatusError::not_found("pods", "a").to_value()
            )
            .is_none()
        );
        let node = ResourcePath::parse("default/nodepatch/edge-1").unwrap();
        let plan = store_plan(
            &Operation::Patch,
            &node,
            &ObjectResp::object(pod).to_value(),
        )
        .unwrap();
        assert_eq!(plan.record.key, "default/node/edge-1");
        assert!(!plan.same_uid_only);
        let cm = ResourcePath::parse("default/configmap/c").unwrap();
        let as_string = json!(r#"{"metadata":{"name":"c"}}"#);
        assert_eq!(
            store_plan(&Operation::Query, &cm, &as_string)
                .unwrap()
                .record
                .key,
            "default/configmap/c"
        );
        assert!(store_plan(&Operation::Delete, &cm, &as_string).is_none());
    }
}
