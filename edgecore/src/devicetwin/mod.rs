//! devicetwin (devices reference §3): the edge's device state — membership from the cloud,
//! twins (desired/reported values with KubeEdge's versioning), device state — in KubeEdge's
//! SQLite tables, served to MQTT clients and mappers and reported to the cloud.
//!
//! * Inputs ([`TwinInputs`]): cloud messages of group `twin` (edgehub routes them here),
//!   stored Device/DeviceModel objects from metamanager ([`DeviceObject`]), MQTT messages
//!   from eventbus ([`BusMessage`]), link events.
//! * Every change is durable before it is published or reported. A device whose twin
//!   changes the cloud has not confirmed is marked in `device_twin_unreported`; its current
//!   twins are sent when the link is up, again after [`DeviceTwinConfig::resend_interval`]
//!   until the cloud answers, and after a restart (KubeEdge drops reports made offline).
//! * Bad MQTT payloads get KubeEdge's error `Result` on the result topic and a log line.

mod bus;
pub(crate) mod dmi;
mod mappers;
pub(crate) mod metrics;
pub(crate) mod store;
#[cfg(test)]
mod tests;
pub(crate) mod topics;
pub(crate) mod twin;

use crate::edgehub::CloudLink;
use crate::edgehub::LinkEvent;
use crate::metamanager::{ChangeAction, DeviceObject, MetaStore, StoreError};
use kubeedge_shared::devices::{
    DeviceCondition, DeviceReport, DeviceState, DeviceStateMsg, DeviceTwinUpdate, ErrorResult,
    MAPPER_READY, MemberDevice, MembershipUpdate, MsgTwin, decode_content,
};
use kubeedge_shared::message::{new_message_id, now_millis};
use kubeedge_shared::{Message, ResourceType};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;
use store::DeviceRow;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use topics::Request;

pub use crate::eventbus::BusMessage;

#[derive(Debug, Clone)]
pub struct DeviceTwinConfig {
    pub node_name: String,
    /// How long an unanswered report waits before it is sent again (KubeEdge: 60 s).
    pub resend_interval: Duration,
    /// Where the DMI server listens (`None`: no DMI).
    pub dmi_socket: Option<PathBuf>,
}

impl DeviceTwinConfig {
    pub fn from_edgecore(c: &crate::config::EdgeCoreConfig) -> Self {
        DeviceTwinConfig {
            node_name: c.node_name().to_string(),
            resend_interval: Duration::from_secs(60),
            dmi_socket: Some(dmi::socket_path(&c.modules.device_twin.dmi_sock_path)),
        }
    }
}

/// Stored objects by `(namespace, name)`.
fn stored_objects(
    records: Vec<crate::metamanager::MetaRecord>,
) -> HashMap<(String, String), Value> {
    records
        .into_iter()
        .filter_map(|r| {
            let v: Value = serde_json::from_str(&r.value).ok()?;
            let ns = v.pointer("/metadata/namespace")?.as_str()?.to_string();
            let name = v.pointer("/metadata/name")?.as_str()?.to_string();
            Some(((ns, name), v))
        })
        .collect()
}

/// A registration answer listing this many devices is followed by [`release_freed_memory`].
const TRIM_AFTER_DEVICES: usize = 500;

use crate::memory::release_freed_memory;

/// Mapper reports stored in one transaction, at most.
const MAX_BATCH: usize = 256;

/// `meta` type of registered mappers (KubeEdge's).
const MAPPER_TYPE: &str = "devicemapper";

/// What devicetwin remembers of a device or model object the cloud sent: enough to route it
/// to a mapper and to tell a change of its spec. The objects themselves are in metamanager's
/// table, read when a mapper registers.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectSummary {
    /// The protocol (device: `spec.protocol.protocolName`, model: `spec.protocol`).
    pub protocol: Box<str>,
    /// A hash of `spec`.
    pub spec_hash: u64,
}

impl ObjectSummary {
    fn of(object: &Value, is_device: bool) -> ObjectSummary {
        use std::hash::{Hash, Hasher};
        let pointer = if is_device {
            "/spec/protocol/protocolName"
        } else {
            "/spec/protocol"
        };
        let protocol = object
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        object.get("spec").map(Value::to_string).hash(&mut h);
        ObjectSummary {
            protocol: protocol.into(),
            spec_hash: h.finish(),
        }
    }
}

/// The device and model objects the cloud sent, by `(namespace, name)`.
#[derive(Debug, Default)]
pub struct Objects {
    pub devices: HashMap<(String, String), ObjectSummary>,
    pub models: HashMap<(String, String), ObjectSummary>,
}

struct State<L> {
    config: DeviceTwinConfig,
    store: MetaStore,
    link: L,
    publish: mpsc::Sender<BusMessage>,
    devices: HashMap<String, DeviceRow>,
    objects: Objects,
    unreported: HashSet<String>,
    /// Change count per device; a confirmation counts only for the count it reported.
    generation: HashMap<String, u64>,
    /// Reports sent and not answered: msg_id → (device, generation).
    awaiting: HashMap<String, (String, u64)>,
    /// Mapper sockets by protocol.
    mappers: HashMap<String, PathBuf>,
    /// Where mapper calls report back.
    dmi_tx: mpsc::Sender<dmi::DmiRequest>,
    /// `MapperReady` of each device object, as last determined.
    conditions: HashMap<(String, String), DeviceCondition>,
    metrics: metrics::DeviceTwinMetrics,
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceTwinError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "cannot listen on the DMI socket {path}: {detail}\n  Set modules.deviceTwin.dmiSockPath \
         to a writable directory, or stop the other edgecore using it."
    )]
    Dmi { path: String, detail: String },
}

/// The running devicetwin.
pub struct DeviceTwin {
    cancel: CancellationToken,
    task: JoinHandle<()>,
    metrics: metrics::DeviceTwinMetrics,
}

/// Where devicetwin's inputs go.
pub struct TwinInputs {
    /// Cloud messages of group `twin` (edgehub's route).
    pub cloud: mpsc::Sender<Message>,
    /// Devices and device models metamanager stored.
    pub objects: mpsc::Sender<DeviceObject>,
    pub bus: mpsc::Sender<BusMessage>,
}

impl DeviceTwin {
    /// Creates the tables, loads the devices and starts. Publishes go to `publish`.
    pub async fn start<L: CloudLink>(
        config: DeviceTwinConfig,
        store: MetaStore,
        link: L,
        publish: mpsc::Sender<BusMessage>,
    ) -> Result<(DeviceTwin, TwinInputs), DeviceTwinError> {
        store::create_tables(&store).await?;
        let (rows, unreported) = store::load(&store).await?;
        let mut mappers = HashMap::new();
        for r in store.list_type(MAPPER_TYPE).await? {
            let info: Value = serde_json::from_str(&r.value).unwrap_or_default();
            let protocol = info["protocol"].as_str().unwrap_or_default();
            let address = info["address"].as_str().unwrap_or_default();
            if !protocol.is_empty() && !address.is_empty() {
                mappers.insert(protocol.to_string(), PathBuf::from(address));
            }
        }
        // The objects the cloud sent before, also while offline since.
        let mut objects = Objects::default();
        for (ty, map, is_device) in [
            (ResourceType::Device, &mut objects.devices, true),
            (ResourceType::DeviceModel, &mut objects.models, false),
        ] {
            for (key, v) in stored_objects(store.list_type(ty.as_str()).await?) {
                map.insert(key, ObjectSummary::of(&v, is_device));
            }
        }
        let (dmi_tx, dmi_rx) = mpsc::channel(1024);
        let cancel = CancellationToken::new();
        if let Some(path) = &config.dmi_socket {
            match kubeedge_dmi::bind_uds(path) {
                Ok(listener) => {
                    let server = kubeedge_dmi::DeviceManagerServiceServer::new(dmi::Server {
                        tx: dmi_tx.clone(),
                    });
                    let stop = cancel.clone();
                    let shown = path.display().to_string();
                    tokio::spawn(async move {
                        let served =
                            kubeedge_dmi::serve_listener(listener, server, stop.cancelled_owned());
                        if let Err(e) = served.await {
                            tracing::warn!(socket = %shown, error = %e, "DMI server stopped");
                        }
                    });
                    tracing::info!(socket = %path.display(), mappers = mappers.len(), "DMI server listening");
                }
                // Devices still work over MQTT; mappers cannot register.
                Err(e) => tracing::error!(
                    "{}",
                    DeviceTwinError::Dmi {
                        path: path.display().to_string(),
                        detail: e.to_string(),
                    }
                ),
            }
        }
        tracing::info!(
            devices = rows.len(),
            unreported = unreported.len(),
            "devicetwin loaded"
        );
        let (cloud_tx, cloud_rx) = mpsc::channel(1024);
        let (objects_tx, objects_rx) = mpsc::channel(1024);
        let (bus_tx, bus_rx) = mpsc::channel(1024);
        let events = link.subscribe();
        let state = State {
            config,
            store,
            link,
            publish,
            devices: rows.into_iter().map(|d| (d.id.clone(), d)).collect(),
            objects,
            unreported: unreported.into_iter().collect(),
            generation: HashMap::new(),
            awaiting: HashMap::new(),
            mappers,
            dmi_tx,
            conditions: HashMap::new(),
            metrics: metrics::DeviceTwinMetrics::default(),
        };
        let metrics = state.metrics.clone();
        metrics.devices.set(state.devices.len() as i64);
        metrics.unreported.set(state.unreported.len() as i64);
        let task = tokio::spawn(run(
            state,
            Inputs {
                cloud: cloud_rx,
                objects: objects_rx,
                bus: bus_rx,
                dmi: dmi_rx,
                events,
            },
            cancel.clone(),
        ));
        Ok((
            DeviceTwin {
                cancel,
                task,
                metrics,
            },
            TwinInputs {
                cloud: cloud_tx,
                objects: objects_tx,
                bus: bus_tx,
            },
        ))
    }

    pub fn metrics(&self) -> &metrics::DeviceTwinMetrics {
        &self.metrics
    }

    pub async fn shutdown(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

/// The receiving ends of devicetwin's inputs.
struct Inputs {
    cloud: mpsc::Receiver<Message>,
    objects: mpsc::Receiver<DeviceObject>,
    bus: mpsc::Receiver<BusMessage>,
    dmi: mpsc::Receiver<dmi::DmiRequest>,
    events: broadcast::Receiver<LinkEvent>,
}

async fn run<L: CloudLink>(mut st: State<L>, inputs: Inputs, cancel: CancellationToken) {
    let Inputs {
        mut cloud,
        mut objects,
        mut bus,
        mut dmi,
        mut events,
    } = inputs;
    let mut resend = tokio::time::interval(st.config.resend_interval);
    resend.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    resend.tick().await;
    if st.link.is_connected() {
        st.report_unreported().await;
    }
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            Some(msg) = cloud.recv() => {
                // Devices metamanager handed over before this message are known first (a
                // membership naming them finds them).
                while let Ok(o) = objects.try_recv() {
                    st.object(o).await;
                }
                st.cloud(msg).await
            }
            // metamanager stopped: so does the edge.
            o = objects.recv() => match o {
                Some(o) => st.object(o).await,
                None => return,
            },
            Some(b) = bus.recv() => st.bus(b).await,
            Some(r) = dmi.recv() => {
                // Mapper reports queued behind this one are stored in the same transaction.
                let mut batch = Vec::new();
                let mut next = Some(r);
                while let Some(r) = next.take() {
                    match r {
                        dmi::DmiRequest::Status(s) => {
                            if let Some(u) = st.mapper_twin_update(&s) {
                                batch.push(u);
                            }
                            if batch.len() < MAX_BATCH {
                                next = dmi.try_recv().ok();
                            }
                        }
                        other => {
                            if !batch.is_empty() {
                                st.twin_updates(std::mem::take(&mut batch)).await;
                            }
                            st.dmi(other).await;
                        }
                    }
                }
                if !batch.is_empty() {
                    st.twin_updates(batch).await;
                }
            }
            ev = events.recv() => match ev {
                Ok(LinkEvent::Connected) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    st.awaiting.clear();
                    if st.link.is_connected() {
                        st.report_unreported().await;
                        st.send_conditions().await;
                    }
                }
                Ok(LinkEvent::Disconnected { .. }) => st.awaiting.clear(),
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = resend.tick() => {
                if st.link.is_connected() && !st.awaiting.is_empty() {
                    st.awaiting.clear();
                    st.report_unreported().await;
                }
            }
        }
    }
}

impl<L: CloudLink> State<L> {
    fn publish(&self, topic: String, payload: &impl serde::Serialize) {
        let payload = serde_json::to_vec(payload).unwrap_or_default();
        let msg = BusMessage {
            topic,
            payload: payload.into(),
        };
        if let Err(e) = self.publish.try_send(msg) {
            tracing::warn!(error = %e, "MQTT publish queue full or closed; message dropped");
        }
    }

    fn publish_error(&self, topic: String, event_id: &str, code: i64, reason: &str) {
        tracing::info!(%topic, code, reason, "device request refused");
        self.metrics.refused(metrics::Refusal::of_code(code));
        let r = ErrorResult {
            event_id: event_id.to_string(),
            timestamp: now_millis(),
            code,
            reason: reason.to_string(),
        };
        self.publish(topic, &r);
    }

    // ----- from the cloud -----

    async fn cloud(&mut self, msg: Message) {
        if !msg.header.parent_id.is_empty() {
            let Some((id, generation)) = self.awaiting.remove(&msg.header.parent_id) else {
                return;
            };
            self.metrics.reports_confirmed.inc();
            let current = self.generation.get(&id).copied().unwrap_or(0) == generation;
            if current && self.unreported.remove(&id) {
                self.metrics.unreported.set(self.unreported.len() as i64);
                if let Err(e) = store::mark_reported(&self.store, id.clone()).await {
                    tracing::warn!(device = %id, error = %e, "cannot record the cloud's confirmation");
                }
            }
            return;
        }
        let resource = msg.route.resource.as_str();
        if resource.contains("membership") && !resource.contains("membership/detail") {
            match decode_content::<MembershipUpdate>(&msg.content) {
                Ok(m) => self.membership(m).await,
                Err(e) => {
                    tracing::warn!(error = %e, "malformed membership update from the cloud; dropped")
                }
            }
        } else {
            tracing::debug!(resource, operation = %msg.route.operation, "twin message not handled; dropped");
        }
    }

    async fn membership(&mut self, m: MembershipUpdate) {
        for d in m.added_devices.unwrap_or_default() {
            if d.id.is_empty() {
                continue;
            }
            let known = self.devices.get(&d.id);
            if known.is_some_and(|k| k.name == d.name && k.description == d.description) {
                continue;
            }
            let mut row = known.cloned().unwrap_or_default();
            row.id = d.id.clone();
            row.name = d.name.clone();
            row.description = d.description.clone();
            let is_new = known.is_none();
            if let Err(e) = store::insert_device(&self.store, row.clone()).await {
                tracing::warn!(device = %d.id, error = %e, "device not stored; the cloud sends it again when the edge reconnects");
                continue;
            }
            self.devices.insert(d.id.clone(), row);
            self.metrics.devices.set(self.devices.len() as i64);
            if is_new {
                tracing::info!(device = %d.id, "device added");
                self.publish_membership(
                    Some(vec![MemberDevice {
                        id: d.id.clone(),
                        name: d.name.clone(),
                        description: d.description.clone(),
                        ..MemberDevice::default()
                    }]),
                    None,
                );
            }
        }
        for d in m.removed_devices.unwrap_or_default() {
            if !self.devices.contains_key(&d.id) {
                continue;
            }
            if let Err(e) = store::delete_device(&self.store, d.id.clone()).await {
                tracing::warn!(device = %d.id, error = %e, "device rows not removed");
                continue;
            }
            self.devices.remove(&d.id);
            self.unreported.remove(&d.id);
            self.metrics.devices.set(self.devices.len() as i64);
            self.metrics.unreported.set(self.unreported.len() as i64);
            self.generation.remove(&d.id);
            tracing::info!(device = %d.id, "device removed");
            self.publish_membership(
                None,
                Some(vec![MemberDevice {
                    id: d.id.clone(),
                    ..MemberDevice::default()
                }]),
            );
        }
    }

    fn publish_membership(
        &self,
        added: Option<Vec<MemberDevice>>,
        removed: Option<Vec<MemberDevice>>,
    ) {
        let m = MembershipUpdate {
            event_id: new_message_id(),
            timestamp: now_millis(),
            added_devices: added,
            removed_devices: removed,
        };
        self.publish(
            topics::node(&self.config.node_name, "membership/updated"),
            &m,
        );
    }

    /// A device or model object stored: kept for the mappers, and passed to the mapper of
    /// its protocol.
    async fn object(&mut self, o: DeviceObject) {
        let key = (o.namespace.clone(), o.name.clone());
        let is_device = match o.resource_type {
            ResourceType::Device => true,
            ResourceType::DeviceModel => false,
            _ => return,
        };
        let map = if is_device {
            &mut self.objects.devices
        } else {
            &mut self.objects.models
        };
        let summary = ObjectSummary::of(&o.object, is_device);
        let old = match o.action {
            ChangeAction::Upsert => map.insert(key.clone(), summary.clone()),
            ChangeAction::Delete => map.remove(&key),
        };
        let protocol = match (o.action, &old) {
            (ChangeAction::Upsert, _) => summary.protocol.to_string(),
            (ChangeAction::Delete, Some(old)) => old.protocol.to_string(),
            (ChangeAction::Delete, None) => return,
        };
        let protocol = protocol.as_str();
        let current = &o.object;
        if is_device && o.action == ChangeAction::Delete {
            self.conditions.remove(&key);
        }
        let Some(socket) = self.mappers.get(protocol).cloned() else {
            tracing::info!(namespace = %key.0, name = %key.1, protocol,
                "no mapper registered for the protocol; it gets the object when it registers");
            if is_device && o.action == ChangeAction::Upsert {
                let message = format!(
                    "no mapper for protocol {protocol:?} is registered on node {}",
                    self.config.node_name
                );
                self.set_condition(key, "False", "NoMapper", message).await;
            }
            return;
        };
        let (name, namespace) = (key.1.clone(), key.0.clone());
        let call = match (o.action, is_device) {
            (ChangeAction::Delete, true) => dmi::MapperCall::RemoveDevice { name, namespace },
            (ChangeAction::Delete, false) => dmi::MapperCall::RemoveModel { name, namespace },
            (ChangeAction::Upsert, true) => {
                if old
                    .as_ref()
                    .is_some_and(|o| o.spec_hash == summary.spec_hash)
                {
                    return;
                }
                let merged = self.with_model_defaults(current).await;
                match kubeedge_dmi::device_from_crd(&merged) {
                    Ok(d) if old.is_none() => dmi::MapperCall::RegisterDevice(d),
                    Ok(d) => dmi::MapperCall::UpdateDevice(d),
                    Err(e) => {
                        tracing::warn!(namespace = %key.0, device = %key.1, error = %e,
                            "device cannot be expressed in DMI; not sent to its mapper");
                        let message = format!("the device spec cannot be sent to a mapper: {e}");
                        self.set_condition(key, "False", "InvalidSpec", message)
                            .await;
                        return;
                    }
                }
            }
            (ChangeAction::Upsert, false) => match kubeedge_dmi::model_from_crd(current) {
                Ok(m) if old.is_none() => dmi::MapperCall::CreateModel(m),
                Ok(m) => dmi::MapperCall::UpdateModel(m),
                Err(e) => {
                    tracing::warn!(namespace = %key.0, model = %key.1, error = %e,
                        "device model cannot be expressed in DMI; not sent to its mapper");
                    return;
                }
            },
        };
        let done = matches!(
            call,
            dmi::MapperCall::RegisterDevice(_) | dmi::MapperCall::UpdateDevice(_)
        )
        .then(|| (self.dmi_tx.clone(), key));
        dmi::spawn_call(socket, call, done);
    }

    /// The device as KubeEdge v1.23's edge hands it to a mapper: its model's
    /// `protocolConfigData` and property `visitors` (v1.22 fields) under the device's own keys.
    /// Unchanged when the model is not stored here (yet).
    async fn with_model_defaults(&self, device: &Value) -> Value {
        let (Some(ns), Some(model)) = (
            device
                .pointer("/metadata/namespace")
                .and_then(Value::as_str),
            device
                .pointer("/spec/deviceModelRef/name")
                .and_then(Value::as_str),
        ) else {
            return device.clone();
        };
        let key = format!("{ns}/{}/{model}", ResourceType::DeviceModel.as_str());
        match self.store.get(&key).await {
            Ok(Some(text)) => match serde_json::from_str::<Value>(&text) {
                Ok(m) => kubeedge_dmi::device_with_model_defaults(device, &m),
                Err(_) => device.clone(),
            },
            _ => device.clone(),
        }
    }

    /// Records the device's `MapperReady` condition and sends it when it changed.
    async fn set_condition(
        &mut self,
        key: (String, String),
        status: &str,
        reason: &str,
        message: String,
    ) {
        let cond = DeviceCondition {
            kind: MAPPER_READY.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            last_transition_time: String::new(),
        };
        if self.conditions.get(&key) == Some(&cond) {
            return;
        }
        self.conditions.insert(key.clone(), cond);
        self.send_condition(&key).await;
    }

    /// Sends the condition of `key` to the cloud when connected.
    async fn send_condition(&self, key: &(String, String)) {
        let Some(cond) = self.conditions.get(key) else {
            return;
        };
        if !self.link.is_connected() {
            return;
        }
        let id = self.id_of(&key.1, &key.0).unwrap_or_else(|| key.1.clone());
        let msg = DeviceReport::Condition(cond.clone()).to_message(&id);
        if let Err(e) = self.link.send(msg).await {
            tracing::debug!(device = %id, error = %e, "device condition not sent; sent when the link is up");
        }
    }

    async fn send_conditions(&self) {
        let keys: Vec<(String, String)> = self.conditions.keys().cloned().collect();
        for k in keys {
            self.send_condition(&k).await;
        }
    }

    // ----- from mappers -----

    /// The device ID of a mapper's `(name, namespace)`: `name` (KubeEdge v1.15 IDs) or
    /// `namespace/name`.
    fn id_of(&self, name: &str, namespace: &str) -> Option<String> {
        if self.devices.contains_key(name) {
            return Some(name.to_string());
        }
        let namespaced = format!("{namespace}/{name}");
        self.devices.contains_key(&namespaced).then_some(namespaced)
    }

    /// Reloads the devices and their twins from the database (after a failed write).
    async fn reload(&mut self) {
        match store::load(&self.store).await {
            Ok((rows, _)) => self.devices = rows.into_iter().map(|d| (d.id.clone(), d)).collect(),
            Err(e) => tracing::warn!(error = %e, "devices not reloaded from the database"),
        }
    }

    // ----- to the cloud -----

    /// Sends the device's current twins (`device/<id>/twin/edge_updated`).
    async fn report(&mut self, id: &str) {
        let Some(d) = self.devices.get(id) else {
            return;
        };
        let twins = d
            .twins
            .iter()
            .map(|(n, r)| (n.clone(), Some(twin::msg_twin(r, true))))
            .collect();
        let msg = DeviceReport::Twin(DeviceTwinUpdate {
            event_id: new_message_id(),
            timestamp: now_millis(),
            twin: Some(twins),
        })
        .to_message(id);
        self.metrics.reports_sent.inc();
        self.metrics.unreported.set(self.unreported.len() as i64);
        let generation = self.generation.get(id).copied().unwrap_or(0);
        self.awaiting
            .insert(msg.header.id.clone(), (id.to_string(), generation));
        if let Err(e) = self.link.send(msg).await {
            tracing::debug!(device = id, error = %e, "twin report not sent; sent when the link is up");
        }
    }

    async fn report_unreported(&mut self) {
        let ids: Vec<String> = self.unreported.iter().cloned().collect();
        if !ids.is_empty() {
            tracing::info!(
                devices = ids.len(),
                "sending twin changes the cloud has not confirmed"
            );
        }
        for id in ids {
            if self.devices.contains_key(&id) {
                self.report(&id).await;
            } else {
                self.unreported.remove(&id);
            }
        }
    }
}
