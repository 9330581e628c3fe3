//! DeviceController (devices reference §2): Devices and DeviceModels → the edge node each
//! device is bound to (`spec.nodeName`), and what edges report → `Device.status`.
//!
//! One watch per kind, cluster-wide (`watch.rs`); DeviceStatuses (KubeEdge v1.23) are watched
//! only to know which exist: each Device gets one, created as v1.23 creates it, and reports are
//! written there as well as to `Device.status` while that CRD is installed. One actor owns the caches; its loop moves
//! only memory and messages ([`HubSink`]), so [`Devices`] is tested without a cluster
//! (`tests.rs`). Status writes leave through a coalescing writer (`status.rs`): one patch in
//! flight per device, later reports folded into the pending one, and the edge's reports
//! answered (`response`/`"OK"`) once their values are written — unanswered ones the edge
//! sends again.
//!
//! Beyond KubeEdge v1.15, as a user would expect: models are looked up in the device's
//! namespace; a model change reaches the nodes whose devices use it; an edge that connects
//! gets every device bound to it again; an edge's inventory listing devices no longer bound
//! to it gets deletes; a twin is created for any property the spec declares.

mod messages;
mod reports;
mod status;
#[cfg(test)]
mod tests;
mod watch;

pub use messages::IdForm;
pub use status::StatusWrite;

use crate::cloudhub::HubSink;
use crate::cloudhub::NodeEvent;
use crate::controller::now_rfc3339;
use kubeedge_shared::devices::{DeviceReport, TwinUpstream};
use kubeedge_shared::inventory::HeldObject;
use kubeedge_shared::{Message, Operation, ResourceType};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

/// `(namespace, name)`.
pub type ObjKey = (String, String);

/// What the actor is told.
#[derive(Debug)]
pub enum Input {
    DeviceApplied(Value),
    DeviceDeleted(Value),
    /// A relist of devices began / ended (objects not seen again are gone).
    DevicesRelisting,
    DevicesListed,
    ModelApplied(Value),
    ModelDeleted(Value),
    ModelsListed,
    /// A DeviceStatus exists / is gone; a relist of them began / ended.
    StatusApplied(Value),
    StatusDeleted(Value),
    StatusesRelisting,
    StatusesListed,
    Connected(String),
    /// The device objects an edge holds (from its inventory).
    Inventory {
        node: String,
        held: Vec<HeldObject>,
    },
    /// A message from an edge with `source: twin`.
    Report {
        node: String,
        message: Box<Message>,
    },
    /// A status write failed: forget what was written for this device.
    WriteFailed(ObjKey),
    /// How a node's edge names devices (from its Node's kubelet version).
    NodeIdForm {
        node: String,
        form: IdForm,
    },
}

/// The actor's state.
pub struct Devices {
    hub: Arc<dyn HubSink>,
    writes: mpsc::Sender<StatusWrite>,
    devices: HashMap<ObjKey, Value>,
    models: HashMap<ObjKey, Value>,
    /// Twins as last written (or being written) by this controller, per device: reports
    /// apply on top of these, not on a possibly older watched copy.
    written: HashMap<ObjKey, Vec<Value>>,
    /// Models sent to a node (node, model).
    models_sent: HashSet<(String, ObjKey)>,
    /// Devices seen during the relist in progress.
    relist: Option<HashSet<ObjKey>>,
    devices_listed: bool,
    models_listed: bool,
    /// DeviceStatuses that exist (or are being created), once they are listed; `None` while
    /// their CRD is not served (reports then go to `Device.status` only).
    statuses: Option<HashSet<ObjKey>>,
    statuses_relist: Option<HashSet<ObjKey>>,
    /// Nodes whose edges take `<namespace>/<name>` device IDs (KubeEdge ≥ v1.16).
    id_forms: HashMap<String, IdForm>,
    /// Nodes whose Node object is being asked for.
    asked: HashSet<String>,
    /// Connected nodes whose devices wait for their ID form.
    waiting: HashSet<String>,
    /// Asks for a node's kubelet version (answered as `Input::NodeIdForm`).
    lookups: Option<mpsc::UnboundedSender<String>>,
}

fn key_of(obj: &Value) -> ObjKey {
    let s = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (s("/metadata/namespace"), s("/metadata/name"))
}

fn uid_of(obj: &Value) -> String {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn node_of(dev: &Value) -> Option<&str> {
    dev.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
}

fn model_of(dev: &Value) -> ObjKey {
    let name = dev
        .pointer("/spec/deviceModelRef/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    (key_of(dev).0, name.to_string())
}

impl Devices {
    pub fn new(hub: Arc<dyn HubSink>, writes: mpsc::Sender<StatusWrite>) -> Devices {
        Devices {
            hub,
            writes,
            devices: HashMap::new(),
            models: HashMap::new(),
            written: HashMap::new(),
            models_sent: HashSet::new(),
            relist: None,
            devices_listed: false,
            models_listed: false,
            statuses: None,
            statuses_relist: None,
            id_forms: HashMap::new(),
            asked: HashSet::new(),
            waiting: HashSet::new(),
            lookups: None,
        }
    }

    /// Node versions are looked up through `lookups` (without it every edge gets v1.15 IDs).
    pub fn with_lookups(mut self, lookups: mpsc::UnboundedSender<String>) -> Devices {
        self.lookups = Some(lookups);
        self
    }

    fn ask(&mut self, node: &str) {
        if !self.asked.contains(node)
            && let Some(l) = &self.lookups
            && l.send(node.to_string()).is_ok()
        {
            self.asked.insert(node.to_string());
        }
    }

    /// The node's ID form; asked for when not known yet (v1.15's meanwhile).
    fn form(&mut self, node: &str) -> IdForm {
        match self.id_forms.get(node) {
            Some(f) => *f,
            None => {
                self.ask(node);
                IdForm::default()
            }
        }
    }

    /// A node's ID form is known: a connect push that waited for it goes out; devices sent
    /// under another form are renamed there (membership removal, then addition).
    fn node_id_form(&mut self, node: &str, form: IdForm) {
        self.asked.remove(node);
        let old = self.id_forms.insert(node.to_string(), form);
        if self.waiting.remove(node) {
            self.push_all(node);
            return;
        }
        let old = old.unwrap_or_default();
        if old == form {
            return;
        }
        tracing::info!(
            node,
            ?form,
            "device IDs for this edge follow its KubeEdge version"
        );
        for dev in self.devices_of(node) {
            self.send(node, messages::membership(&dev, false, old));
            self.send(node, messages::membership(&dev, true, form));
        }
    }

    fn devices_of(&self, node: &str) -> Vec<Value> {
        self.devices
            .values()
            .filter(|d| node_of(d) == Some(node))
            .cloned()
            .collect()
    }

    pub fn apply(&mut self, input: Input) {
        match input {
            Input::DeviceApplied(d) => {
                if let Some(seen) = &mut self.relist {
                    seen.insert(key_of(&d));
                }
                self.device_applied(d)
            }
            Input::DeviceDeleted(d) => self.device_deleted(&key_of(&d)),
            Input::DevicesRelisting => self.relist = Some(HashSet::new()),
            Input::DevicesListed => {
                if let Some(seen) = self.relist.take() {
                    let gone: Vec<ObjKey> = self
                        .devices
                        .keys()
                        .filter(|k| !seen.contains(*k))
                        .cloned()
                        .collect();
                    for k in gone {
                        self.device_deleted(&k);
                    }
                }
                self.devices_listed = true;
                self.ensure_statuses();
            }
            Input::ModelApplied(m) => self.model_applied(m),
            Input::ModelDeleted(m) => {
                self.models.remove(&key_of(&m));
            }
            Input::ModelsListed => self.models_listed = true,
            Input::StatusApplied(o) => {
                let key = key_of(&o);
                if let Some(seen) = &mut self.statuses_relist {
                    seen.insert(key.clone());
                }
                if let Some(s) = &mut self.statuses {
                    s.insert(key);
                }
            }
            Input::StatusDeleted(o) => {
                // Made again by the device's next report (as KubeEdge v1.23 does).
                if let Some(s) = &mut self.statuses {
                    s.remove(&key_of(&o));
                }
            }
            Input::StatusesRelisting => self.statuses_relist = Some(HashSet::new()),
            Input::StatusesListed => {
                self.statuses = Some(self.statuses_relist.take().unwrap_or_default());
                self.ensure_statuses();
            }
            Input::Connected(node) => self.connected(&node),
            Input::Inventory { node, held } => self.inventory(&node, &held),
            Input::Report { node, message } => self.report(&node, *message),
            Input::WriteFailed(key) => {
                self.written.remove(&key);
                if let Some(s) = &mut self.statuses {
                    s.remove(&key);
                }
            }
            Input::NodeIdForm { node, form } => self.node_id_form(&node, form),
        }
    }

    fn send(&self, node: &str, msg: Message) {
        if let Err(e) = self.hub.send(node, msg) {
            tracing::debug!(node, error = %e, "device message not queued; sent again when the edge connects");
        }
    }

    fn send_model(&mut self, node: &str, model: &ObjKey, op: Operation) {
        let Some(obj) = self.models.get(model) else {
            tracing::info!(node, namespace = %model.0, model = %model.1,
                "device model not found; the device is sent without it, the model follows when it is created");
            return;
        };
        let msg = messages::object(op, "devicemodel", "DeviceModel", obj);
        self.send(node, msg);
        self.models_sent.insert((node.to_string(), model.clone()));
    }

    /// A device bound to `node` arrives there: membership, its model (once per node), itself.
    fn added_flow(&mut self, node: &str, dev: &Value, op: Operation) {
        let form = self.form(node);
        self.send(node, messages::membership(dev, true, form));
        let model = model_of(dev);
        if !self
            .models_sent
            .contains(&(node.to_string(), model.clone()))
        {
            self.send_model(node, &model, Operation::Insert);
        }
        self.send(node, messages::object(op, "device", "Device", dev));
    }

    /// A device leaves `node`: membership, its model when no other device there uses it,
    /// itself.
    fn deleted_flow(&mut self, node: &str, dev: &Value) {
        let form = self.form(node);
        self.send(node, messages::membership(dev, false, form));
        let model = model_of(dev);
        let key = key_of(dev);
        let still_used = self
            .devices
            .iter()
            .any(|(k, d)| *k != key && node_of(d) == Some(node) && model_of(d) == model);
        if !still_used && self.models_sent.remove(&(node.to_string(), model.clone())) {
            let obj = self
                .models
                .get(&model)
                .cloned()
                .unwrap_or_else(|| stub(&model));
            self.send(
                node,
                messages::object(Operation::Delete, "devicemodel", "DeviceModel", &obj),
            );
        }
        self.send(
            node,
            messages::object(Operation::Delete, "device", "Device", dev),
        );
    }

    /// Every Device without a DeviceStatus gets one (once both lists are complete).
    fn ensure_statuses(&mut self) {
        if !self.devices_listed {
            return;
        }
        let keys: Vec<ObjKey> = self.devices.keys().cloned().collect();
        for key in keys {
            self.ensure_status(&key);
        }
    }

    /// Creates the device's DeviceStatus, as KubeEdge v1.23 does when it sees a Device, with
    /// what the Device's status already holds.
    fn ensure_status(&mut self, key: &ObjKey) {
        let Some(statuses) = &mut self.statuses else {
            return;
        };
        let Some(dev) = self.devices.get(key) else {
            return;
        };
        if statuses.contains(key) {
            return;
        }
        let status = reports::device_status_patch(dev).unwrap_or_else(|| json!({"status": {}}));
        let write = StatusWrite {
            key: key.clone(),
            patch: Value::Null,
            status: Some(status),
            uid: uid_of(dev),
            replies: Vec::new(),
        };
        if self.writes.try_send(write).is_ok() {
            statuses.insert(key.clone());
        } else {
            tracing::debug!(namespace = %key.0, device = %key.1,
                "status writer busy; the DeviceStatus is created with the next report");
        }
    }

    fn device_applied(&mut self, dev: Value) {
        let key = key_of(&dev);
        let old = self.devices.insert(key.clone(), dev.clone());
        if old.is_none() && self.devices_listed {
            self.ensure_status(&key);
        }
        let new_node = node_of(&dev).map(str::to_string);
        match old {
            None => {
                if let Some(node) = new_node {
                    self.added_flow(&node, &dev, Operation::Insert);
                }
            }
            Some(old) => {
                let old_node = node_of(&old).map(str::to_string);
                if old_node != new_node {
                    if let Some(n) = old_node {
                        // The device is already replaced in the cache: the old node's
                        // model is judged without it.
                        self.deleted_flow(&n, &old);
                    }
                    if let Some(n) = new_node {
                        self.added_flow(&n, &dev, Operation::Insert);
                    }
                } else if old.get("spec") != dev.get("spec")
                    && let Some(node) = new_node
                {
                    let model = model_of(&dev);
                    if model != model_of(&old)
                        || !self.models_sent.contains(&(node.clone(), model.clone()))
                    {
                        self.send_model(&node, &model, Operation::Insert);
                    }
                    self.send(
                        &node,
                        messages::object(Operation::Update, "device", "Device", &dev),
                    );
                }
            }
        }
    }

    fn device_deleted(&mut self, key: &ObjKey) {
        self.written.remove(key);
        if let Some(dev) = self.devices.remove(key)
            && let Some(node) = node_of(&dev).map(str::to_string)
        {
            self.deleted_flow(&node, &dev);
        }
    }

    fn model_applied(&mut self, model: Value) {
        let key = key_of(&model);
        let changed = self
            .models
            .insert(key.clone(), model)
            .is_none_or(|old| Some(&old) != self.models.get(&key));
        if !changed {
            return;
        }
        let nodes: HashSet<String> = self
            .devices
            .values()
            .filter(|d| model_of(d) == key)
            .filter_map(|d| node_of(d).map(str::to_string))
            .collect();
        for node in nodes {
            let op = if self.models_sent.contains(&(node.clone(), key.clone())) {
                Operation::Update
            } else {
                Operation::Insert
            };
            self.send_model(&node, &key, op);
        }
    }

    /// An edge (re)connected: it gets all its devices again (idempotent at the edge), once
    /// its ID form is known (a first contact asks for it; later ones ask again, the edge may
    /// have been upgraded, and rename if it changed).
    fn connected(&mut self, node: &str) {
        self.models_sent.retain(|(n, _)| n != node);
        if !self.devices.values().any(|d| node_of(d) == Some(node)) {
            return;
        }
        let known = self.id_forms.contains_key(node);
        self.asked.remove(node);
        self.ask(node);
        if !known && self.asked.contains(node) {
            self.waiting.insert(node.to_string());
            return;
        }
        self.push_all(node);
    }

    fn push_all(&mut self, node: &str) {
        let mine = self.devices_of(node);
        for dev in &mine {
            self.added_flow(node, dev, Operation::Insert);
        }
        if !mine.is_empty() {
            tracing::debug!(
                node,
                devices = mine.len(),
                "devices sent to a connected edge"
            );
        }
    }

    /// Devices and models an edge holds that are no longer for it are deleted there, once
    /// both lists are complete.
    fn inventory(&mut self, node: &str, held: &[HeldObject]) {
        if !(self.devices_listed && self.models_listed) {
            return;
        }
        for h in held {
            let key = (h.namespace.clone(), h.name.clone());
            match h.resource_type {
                ResourceType::Device => {
                    let bound = self
                        .devices
                        .get(&key)
                        .is_some_and(|d| node_of(d) == Some(node));
                    if !bound {
                        let obj = stub_with_uid(&key, &h.uid);
                        let form = self.form(node);
                        self.send(node, messages::membership(&obj, false, form));
                        self.send(
                            node,
                            messages::object(Operation::Delete, "device", "Device", &obj),
                        );
                    }
                }
                ResourceType::DeviceModel => {
                    let used = self
                        .devices
                        .values()
                        .any(|d| node_of(d) == Some(node) && model_of(d) == key);
                    if !used {
                        let obj = stub_with_uid(&key, &h.uid);
                        self.send(
                            node,
                            messages::object(Operation::Delete, "devicemodel", "DeviceModel", &obj),
                        );
                    }
                }
                _ => {}
            }
        }
    }

    /// The device a report from `node` names: `<name>` among the devices bound to the node,
    /// or `<namespace>/<name>`. Devices bound elsewhere are not found (node restriction).
    fn find_device(&self, node: &str, id: &[&str]) -> Option<ObjKey> {
        let found = match id {
            [ns, name] => {
                let k = (ns.to_string(), name.to_string());
                self.devices.contains_key(&k).then_some(k)
            }
            [name] => {
                let mut it = self
                    .devices
                    .iter()
                    .filter(|(k, d)| k.1 == *name && node_of(d) == Some(node));
                let first = it.next().map(|(k, _)| k.clone());
                if it.next().is_some() {
                    tracing::warn!(
                        node,
                        device = name,
                        "device name is bound to this node in several namespaces; report dropped"
                    );
                    return None;
                }
                first
            }
            _ => None,
        }?;
        let bound = self.devices.get(&found).and_then(node_of) == Some(node);
        bound.then_some(found)
    }

    fn report(&mut self, node: &str, msg: Message) {
        let resource = msg.route.resource.clone();
        let (id, report) = match TwinUpstream::classify(&resource, &msg.content) {
            Ok(TwinUpstream::MembershipDetail) => {
                // KubeEdge's cloud ignores it and its edge resends it forever; an answer stops
                // that. The edge already has its devices (`connected`).
                self.send(node, messages::report_ok(&msg));
                return;
            }
            Ok(TwinUpstream::Unknown) => {
                tracing::debug!(node, %resource, "twin message the device controller does not handle; dropped");
                return;
            }
            Ok(TwinUpstream::Report { device, report }) => (device, report),
            Err(e) => {
                tracing::warn!(node, %resource, error = %e, "malformed device report; dropped");
                return;
            }
        };
        let Some(key) = self.find_device(node, &id) else {
            tracing::warn!(node, %resource, "report for a device not bound to this node; dropped");
            return;
        };
        let patch = match report {
            DeviceReport::Twin(update) => {
                let mut base = self.devices[&key].clone();
                if let Some(t) = self.written.get(&key) {
                    base["status"]["twins"] = Value::Array(t.clone());
                }
                let (twins, changed) = reports::apply_twin_report(&base, &update);
                self.written.insert(key.clone(), twins.clone());
                changed.then(|| reports::twins_patch(&twins))
            }
            DeviceReport::Condition(cond) => {
                if cond.kind.is_empty() || !matches!(cond.status.as_str(), "True" | "False") {
                    tracing::warn!(node, %resource, "device condition without type or True/False status; dropped");
                    return;
                }
                reports::condition_patch(&self.devices[&key], cond, &now_rfc3339())
            }
            DeviceReport::State(state) => {
                let dev = &self.devices[&key];
                let same = dev.pointer("/status/state").and_then(Value::as_str)
                    == Some(state.device.state.as_str());
                (!same).then(|| {
                    reports::state_patch(&state.device.state, &state.device.last_online_time)
                })
            }
        };
        match patch {
            None => self.send(node, messages::report_ok(&msg)),
            Some(patch) => {
                let status = self
                    .statuses
                    .is_some()
                    .then(|| reports::device_status_patch(&patch))
                    .flatten();
                let write = StatusWrite {
                    uid: uid_of(&self.devices[&key]),
                    key,
                    patch,
                    status,
                    replies: vec![(node.to_string(), msg)],
                };
                if let Err(e) = self.writes.try_send(write) {
                    let key = match e {
                        mpsc::error::TrySendError::Full(w)
                        | mpsc::error::TrySendError::Closed(w) => w.key,
                    };
                    tracing::warn!(node, %resource, "status writer busy; report not answered, the edge sends it again");
                    self.written.remove(&key);
                }
            }
        }
    }
}

fn stub(key: &ObjKey) -> Value {
    json!({"metadata": {"namespace": key.0, "name": key.1}})
}

fn stub_with_uid(key: &ObjKey, uid: &str) -> Value {
    json!({"metadata": {"namespace": key.0, "name": key.1, "uid": uid}})
}

/// The running controller: where upstream twin messages and inventories go.
#[derive(Clone)]
pub struct DeviceControllerHandle {
    tx: mpsc::Sender<Input>,
}

impl DeviceControllerHandle {
    pub async fn report(&self, node: String, message: Message) {
        let _ = self
            .tx
            .send(Input::Report {
                node,
                message: Box::new(message),
            })
            .await;
    }

    /// The device and model entries of an edge's inventory.
    pub async fn inventory(&self, node: String, held: &[HeldObject]) {
        let held: Vec<HeldObject> = held
            .iter()
            .filter(|h| {
                matches!(
                    h.resource_type,
                    ResourceType::Device | ResourceType::DeviceModel
                )
            })
            .cloned()
            .collect();
        let _ = self.tx.send(Input::Inventory { node, held }).await;
    }
}

/// Starts the watches, the status writer and the actor.
pub fn spawn(
    client: kube::Client,
    hub: Arc<dyn HubSink>,
    mut events: broadcast::Receiver<NodeEvent>,
    shutdown: CancellationToken,
) -> (DeviceControllerHandle, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<Input>(1024);
    let (wtx, wrx) = mpsc::channel(status::QUEUE);
    tokio::spawn(watch::run(client.clone(), tx.clone(), shutdown.clone()));
    let (ltx, lrx) = mpsc::unbounded_channel();
    tokio::spawn(watch::node_versions(
        client.clone(),
        lrx,
        tx.clone(),
        shutdown.clone(),
    ));
    tokio::spawn(status::run(
        client,
        hub.clone(),
        wrx,
        tx.clone(),
        shutdown.clone(),
    ));
    let task = tokio::spawn(async move {
        let mut devices = Devices::new(hub, wtx).with_lookups(ltx);
        loop {
            let input = tokio::select! {
                _ = shutdown.cancelled() => break,
                i = rx.recv() => match i { Some(i) => i, None => break },
                e = events.recv() => match e {
                    Ok(NodeEvent::Connected { node, .. }) => Input::Connected(node),
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "device controller missed node events");
                        continue;
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            };
            devices.apply(input);
        }
    });
    (DeviceControllerHandle { tx }, task)
}
