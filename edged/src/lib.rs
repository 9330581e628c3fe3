//! edged: the kubelet-like pod lifecycle over CRI (protocol §5.5), as a library.
//!
//! edgecore runs it; what it needs from the rest of the edge is small and typed:
//! a [`meta::MetaService`] (metamanager: reads, status patches, node and lease writes), a
//! channel of [`ObjectChange`]s (the stored objects it acts on), optionally the cloud link's
//! state ([`EdgedLink`]) and a [`PodObserver`]. Its settings are an [`EdgedConfig`], which
//! the edgecore binary converts from `modules.edged` of `edgecore.yaml`.
//!
//! The public surface: [`Edged`] and its inputs, the CRI client ([`cri`]), node and pod
//! statistics ([`stats`]), the pod status metrics ([`status_report`]), the hold-upgrade
//! release channel ([`hold`]) and the few helpers other edge modules share (the pull
//! credentials of an image, the files of a rotated container log, path elements).
//!
//! ```text
//! metamanager ── ObjectChange ──► Edged (dispatcher) ──► PodWorker per pod ──CRI──► runtime
//!      ▲                              │ relist (PLEG), GC        │
//!      └──── MetaClient: pod status, deletions, node status, lease, configmaps/secrets ◄┘
//! ```
//!
//! * [`Edged::start`] lists the pods of this node from the metamanager (the local database,
//!   so this works offline) and starts one `pod_worker::PodWorker` per pod, which adopts
//!   the sandbox and containers the runtime already runs for it (by the kubelet's labels)
//!   without restarting them. The runtime is dialled lazily (edgecore may start first);
//!   once it answers, runtime objects of pods this node does not know are removed (`gc`),
//!   and unused images are collected when the disk fills up (`image_gc`).
//! * The dispatcher routes pod changes to workers, tells workers when a configmap or secret
//!   their volumes use changed, and lists the runtime every `relist_period` to wake the
//!   workers whose containers changed state.
//! * `node` registers the Node, reports its status and renews its Lease.
//! * Pods annotated `edge.kubeedge.io/hold-upgrade: "true"` wait, `Pending`, until the
//!   MetaServer's `unhold-upgrade` releases them ([`hold`]).
//! * On shutdown workers stop and containers keep running.

pub(crate) mod backoff;
pub mod cgroups;
pub(crate) mod containers;
pub mod cri;
pub(crate) mod env;
pub(crate) mod events;
pub(crate) mod eviction;
pub(crate) mod gc;
pub mod hold;
#[cfg(test)]
mod hold_dispatch_tests;
pub(crate) mod hooks;
pub(crate) mod image_gc;
pub(crate) mod lifecycle;
pub mod logs;
pub mod meta;
pub(crate) mod node;
pub(crate) mod objects;
pub(crate) mod pod_worker;
pub(crate) mod probes;
pub mod pull_secrets;
pub mod quantity;
pub(crate) mod sandbox;
pub(crate) mod settings;
pub mod spec;
pub(crate) mod static_pods;
pub mod stats;
pub(crate) mod status;
pub mod status_report;
pub(crate) mod volumes;

pub use meta::{ChangeAction, MetaClient, MetaError, ObjectChange};
pub use settings::{EVICTION_HARD_DEFAULTS, EdgedConfig};
pub use status_report::MetricsSource;

use crate::cri::runtime::{LABEL_NODE, LABEL_POD_UID, Runtime};
use crate::cri::{CriClient, CriError};
use kubeedge_shared::ResourceType;
use kubeedge_shared::backoff::Backoff;
use kubeedge_shared::link::{CloudTerms, LinkEvent};
use kubeedge_shared::resource_type::ConfigKind;
use pod_worker::{PodIntent, PodWorker, Shared};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{Notify, broadcast, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum EdgedError {
    #[error("modules.edged.remoteRuntimeEndpoint: {0}")]
    Runtime(#[from] CriError),
}

/// Who wants to know the state of this node's pods as edged sees it now, also while the cloud
/// is unreachable (edgemesh: the endpoints of local pods). Called on edged's tasks: must not
/// block.
pub trait PodObserver: Send + Sync {
    /// The pod object (as stored) and the status edged computed for it now.
    fn pod_status(&self, pod: &Value, status: &Value);
    /// The pod is being removed from the node.
    fn pod_gone(&self, uid: &str);
    /// Every pod of the node was reported once (from the database, at start).
    fn pods_listed(&self);
}

/// edgehub's view of the cloud link, as edged follows it.
pub struct EdgedLink {
    pub events: broadcast::Receiver<LinkEvent>,
    pub terms: watch::Receiver<CloudTerms>,
}

/// The running edged.
pub struct Edged {
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

struct WorkerHandle {
    key: String,
    intent: watch::Sender<PodIntent>,
    wake: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Edged {
    /// Starts edged; `changes` is the metamanager's channel of stored pods, configmaps and
    /// secrets.
    ///
    /// `link` (edgehub's link events and terms) lets edged send pod and node status again
    /// after the cloud link comes back, and leave the Lease to a cloud that renews it.
    /// `releases` are the MetaServer's `unhold-upgrade` requests for held pods.
    pub fn start(
        config: EdgedConfig,
        meta: MetaClient,
        changes: mpsc::Receiver<ObjectChange>,
        link: Option<EdgedLink>,
        status_reports: Arc<status_report::StatusReports>,
        observer: Option<Arc<dyn PodObserver>>,
        releases: hold::ReleaseRequests,
    ) -> Result<Edged, EdgedError> {
        let cri = CriClient::connect_lazy(&config.runtime_endpoint)?;
        let machine = node::Machine::detect(&config.root_directory);
        let (events, occurrences) = events::Recorder::new(events::QUEUE_CAPACITY);
        let cancel = CancellationToken::new();
        let resync = watch::channel(0).0;
        let (events_rx, terms) = match link {
            Some(l) => (Some(l.events), l.terms),
            // No link to watch: the terms stay "offline", edged renews as the kubelet.
            None => (None, watch::channel(CloudTerms::default()).1),
        };
        tokio::spawn(events::run(
            meta.clone(),
            config.node_name.clone(),
            occurrences,
            resync.subscribe(),
            cancel.child_token(),
        ));
        let allocatable = node::allocatable(&machine, &config);
        let cgroups = cgroups::PodCgroups::new(config.cgroups.clone());
        cgroups.setup_node(allocatable.cpu_milli, node::pods_memory(&machine, &config));
        if let Some(v) = cgroups.version() {
            tracing::info!(cgroup_version = v, driver = ?config.cgroups.driver, root = %config.cgroups.root, "pods get cgroups by QoS class");
        }
        let shared = Arc::new(Shared {
            runtime: Runtime::new(cri, config.runtime_request_timeout),
            events,
            cgroups,
            allocatable,
            config,
            objects: objects::ObjectCache::new(meta.clone(), Duration::from_secs(5)),
            meta,
            runtime_name: OnceLock::new(),
            known_pods: Mutex::new(HashSet::new()),
            pull_lock: tokio::sync::Mutex::new(()),
            resync,
            image_gc_now: Notify::new(),
            pressure: Default::default(),
            node_status_now: Notify::new(),
            lease_self: Default::default(),
            lease_self_now: Notify::new(),
            terms,
            status_reports,
            observer,
        });
        let task = tokio::spawn(run(
            shared,
            machine,
            changes,
            releases,
            events_rx,
            cancel.clone(),
        ));
        Ok(Edged { cancel, task })
    }

    /// Stops edged. Pods keep running in the runtime.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

async fn run(
    shared: Arc<Shared>,
    machine: node::Machine,
    mut changes: mpsc::Receiver<ObjectChange>,
    mut releases: hold::ReleaseRequests,
    link: Option<broadcast::Receiver<LinkEvent>>,
    cancel: CancellationToken,
) {
    let node_task = tokio::spawn(node::run(shared.clone(), machine, cancel.child_token()));
    let mut dispatcher = Dispatcher {
        shared: shared.clone(),
        workers: HashMap::new(),
        cancel: cancel.clone(),
        relisted: HashMap::new(),
        gc: None,
        statics: static_pods::StaticPods::default(),
        mirrors: None,
        eviction: Some(eviction::check::State::new(&shared)),
        held: hold::HeldPods::default(),
    };
    if let Some(mut link) = link {
        let shared = shared.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    _ = cancel.cancelled() => return,
                    e = link.recv() => e,
                };
                match event {
                    Ok(LinkEvent::Connected) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        shared.resync.send_modify(|n| *n += 1);
                    }
                    Ok(LinkEvent::Disconnected { .. }) => {}
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }
    if dispatcher.start_up(&cancel).await {
        dispatcher.serve(&mut changes, &mut releases).await;
    }
    cancel.cancel();
    let handles: Vec<_> = dispatcher.workers.drain().map(|(_, w)| w.task).collect();
    let all = futures_util::future::join_all(handles);
    if tokio::time::timeout(Duration::from_secs(10), all)
        .await
        .is_err()
    {
        tracing::warn!("pod workers did not stop within 10 s");
    }
    if let Some(gc) = dispatcher.gc.take() {
        gc.abort();
    }
    let _ = node_task.await;
    tracing::info!("edged stopped (containers keep running)");
}

struct Dispatcher {
    shared: Arc<Shared>,
    workers: HashMap<String, WorkerHandle>,
    cancel: CancellationToken,
    /// Last relist: pod UID → its containers' and sandboxes' (id, state).
    relisted: HashMap<String, Vec<(String, i32)>>,
    gc: Option<JoinHandle<()>>,
    /// Static pods from `staticPodPath`.
    statics: static_pods::StaticPods,
    /// The running mirror pod sync.
    mirrors: Option<JoinHandle<()>>,
    /// Node-pressure and local-storage eviction.
    eviction: Option<eviction::check::State>,
    /// Pods not started until the MetaServer's `unhold-upgrade` releases them.
    held: hold::HeldPods,
}

/// Whether [`Dispatcher::upsert_as`] may hold a pod back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admission {
    /// A pod from the cloud or the database: held when it asks for it.
    Check,
    /// A held pod the MetaServer released: started.
    Released,
}

impl Dispatcher {
    /// Lists this node's pods from the database and starts a worker per pod (they wait for
    /// the runtime on their own), then, once the runtime answers, collects what no pod owns.
    /// Changes are consumed from the start even while the runtime is down: a stalled edged
    /// would stall the metamanager and with it the cloud link. False when cancelled first.
    async fn start_up(&mut self, cancel: &CancellationToken) -> bool {
        let shared = self.shared.clone();
        let pods = loop {
            match shared.meta.list_pods().await {
                Ok(pods) => break pods,
                Err(e) => {
                    tracing::warn!(error = %e, "listing pods from the metamanager failed; retrying");
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return false,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        };
        let mine: Vec<Value> = pods
            .into_iter()
            .filter(|p| p["spec"]["nodeName"].as_str() == Some(shared.config.node_name.as_str()))
            .collect();
        if let Ok(mut known) = shared.known_pods.lock() {
            for p in &mine {
                if let Some(uid) = p["metadata"]["uid"].as_str() {
                    known.insert(uid.to_string());
                }
            }
        }
        tracing::info!(
            pods = mine.len(),
            "edged started; adopting the pods of this node"
        );
        if let Some(o) = &shared.observer {
            for p in &mine {
                o.pod_status(p, &p["status"]);
            }
            o.pods_listed();
        }
        for p in mine {
            self.upsert(p);
        }
        // Before the runtime is garbage-collected: static pods' containers are not orphans.
        self.scan_static();
        self.gc = Some(tokio::spawn(runtime_ready(shared, cancel.clone())));
        true
    }

    async fn serve(
        &mut self,
        changes: &mut mpsc::Receiver<ObjectChange>,
        releases: &mut hold::ReleaseRequests,
    ) {
        let config = self.shared.config.clone();
        let mut relist = tokio::time::interval(config.relist_period);
        relist.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut housekeeping = tokio::time::interval(config.sync_frequency);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        housekeeping.tick().await;
        let mut eviction_check = tokio::time::interval(config.eviction_period);
        eviction_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (check_tx, mut check_rx) = mpsc::channel::<eviction::Check>(1);
        let mut static_check = tokio::time::interval(config.static_pod_check_period);
        static_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut log_check = tokio::time::interval(config.log_rotation_period);
        log_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut rotation: Option<JoinHandle<()>> = None;
        let mut changes_open = true;
        let mut releases_open = true;
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                change = changes.recv(), if changes_open => match change {
                    Some(c) => self.apply(c),
                    None => {
                        tracing::info!("metamanager closed its channel; edged keeps its pods running");
                        changes_open = false;
                    }
                },
                request = releases.recv(), if releases_open => match request {
                    Some(r) => {
                        let released = self.release(r.what);
                        let _ = r.reply.send(released);
                    }
                    // No MetaServer: nothing releases held pods.
                    None => releases_open = false,
                },
                _ = relist.tick() => self.relist().await,
                _ = static_check.tick() => {
                    self.scan_static();
                    self.sync_mirrors();
                }
                _ = eviction_check.tick() => self.start_eviction_check(&check_tx),
                Some(check) = check_rx.recv() => self.act_on_check(check),
                _ = housekeeping.tick() => self.housekeeping(),
                _ = log_check.tick() => {
                    if rotation.as_ref().is_none_or(|r| r.is_finished()) {
                        let shared = self.shared.clone();
                        rotation = Some(tokio::spawn(async move {
                            let c = &shared.config;
                            match logs::rotate(&shared.runtime, &c.node_name, c.container_log_max_size, c.container_log_max_files).await {
                                Ok(0) => {}
                                Ok(n) => tracing::info!(containers = n, "container logs rotated"),
                                Err(e) => tracing::debug!(error = %e, "log rotation failed"),
                            }
                        }));
                    }
                }
            }
        }
    }

    fn apply(&mut self, change: ObjectChange) {
        match (&change.kind, change.action) {
            (ResourceType::Pod, ChangeAction::Upsert) => self.upsert(change.object),
            (ResourceType::Pod, ChangeAction::Delete) => {
                let key = format!("{}/{}", change.namespace, change.name);
                let deleted_uid = change.object["metadata"]["uid"].as_str();
                if let Some(uid) = self.held.forget(&key, deleted_uid) {
                    tracing::info!(pod = %key, "held pod deleted; forgotten");
                    self.unknown(&uid);
                }
                let Some(uid) = deleted_uid else {
                    return;
                };
                self.reap();
                if let Some(w) = self.workers.get(uid) {
                    let object = if change.object["spec"].is_object() {
                        Some(Arc::new(change.object.clone()))
                    } else {
                        None
                    };
                    w.intent.send_modify(|i| {
                        i.deleted = true;
                        if let Some(o) = object {
                            i.object = o;
                        }
                    });
                }
            }
            (ResourceType::Node, ChangeAction::Upsert) => {
                if change.name == self.shared.config.node_name
                    && node::marked_unknown(&change.object)
                {
                    tracing::info!(node = %change.name, "the cluster marked this node Unknown; reporting its status again");
                    self.shared.node_status_now.notify_one();
                    if self.shared.terms.borrow().cloud_lease {
                        tracing::warn!(node = %change.name, "the cloud renews this node's Lease, yet the cluster marked it Unknown: renewing it from the edge until the link ends");
                        self.shared
                            .lease_self
                            .store(true, std::sync::atomic::Ordering::Release);
                        self.shared.lease_self_now.notify_one();
                    }
                }
            }
            (ResourceType::Node, ChangeAction::Delete) => {}
            (kind, action) => {
                let Some(cache_kind) = ConfigKind::of(kind) else {
                    return;
                };
                let object = (action == ChangeAction::Upsert).then(|| change.object.clone());
                self.shared
                    .objects
                    .changed(cache_kind, &change.namespace, &change.name, object);
                for w in self.workers.values() {
                    let uses = volumes_use(
                        &w.intent.borrow().object,
                        cache_kind,
                        &change.namespace,
                        &change.name,
                    );
                    if uses {
                        w.intent.send_modify(|i| i.config_version += 1);
                    }
                }
            }
        }
    }

    fn upsert(&mut self, pod: Value) {
        self.upsert_as(pod, Admission::Check);
    }

    fn upsert_as(&mut self, pod: Value, admission: Admission) {
        let node = &self.shared.config.node_name;
        if pod["spec"]["nodeName"].as_str() != Some(node.as_str()) {
            return;
        }
        // A mirror pod reflects a static pod, which runs from its manifest.
        if static_pods::is_mirror(&pod) {
            return;
        }
        let Some(uid) = pod["metadata"]["uid"].as_str().filter(|u| !u.is_empty()) else {
            tracing::warn!(pod = %pod["metadata"]["name"], "pod without a uid; ignored");
            return;
        };
        let (ns, name) = (
            pod["metadata"]["namespace"].as_str().unwrap_or(""),
            pod["metadata"]["name"].as_str().unwrap_or(""),
        );
        if !spec::is_path_element(uid)
            || ![ns, name]
                .into_iter()
                .all(|s| s.is_empty() || spec::is_path_element(s))
        {
            tracing::warn!(
                namespace = ns,
                name,
                uid,
                "pod namespace, name or uid is not a plain name (they name directories); ignored"
            );
            return;
        }
        let uid = uid.to_string();
        let key = format!(
            "{}/{}",
            pod["metadata"]["namespace"].as_str().unwrap_or(""),
            pod["metadata"]["name"].as_str().unwrap_or("")
        );
        self.reap();
        if let Some(w) = self.workers.get(&uid) {
            // The metamanager tells of a pod from two places (a cloud message, the pod a
            // status patch returned): an older copy arriving second must not roll edged back.
            let rv = |p: &Value| {
                p.pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .and_then(|v| v.parse::<u64>().ok())
            };
            if let (Some(new), Some(current)) = (rv(&pod), rv(&w.intent.borrow().object))
                && new < current
            {
                tracing::debug!(pod = %key, rv = new, current, "older copy of a pod ignored");
                return;
            }
            let object = Arc::new(pod);
            w.intent.send_modify(|i| i.object = object);
            return;
        }
        // A new incarnation under the same name: the old one is gone.
        for w in self.workers.values().filter(|w| w.key == key) {
            w.intent.send_modify(|i| i.deleted = true);
        }
        if admission == Admission::Check && hold::holds(&pod) {
            self.hold(key, uid, pod);
            return;
        }
        if let Some(old) = self.held.forget(&key, None) {
            tracing::info!(pod = %key, "pod no longer asks to be held (annotation removed, deleting, or past Pending); starting it");
            if old != uid {
                self.unknown(&old);
            }
        }
        if let Ok(mut known) = self.shared.known_pods.lock() {
            known.insert(uid.clone());
        }
        let evicted = self.admit(&pod, &key).map(Arc::new);
        let (tx, rx) = watch::channel(PodIntent {
            object: Arc::new(pod),
            deleted: false,
            config_version: 0,
            evicted,
        });
        let wake = Arc::new(Notify::new());
        let worker = PodWorker::new(
            self.shared.clone(),
            uid.clone(),
            rx,
            wake.clone(),
            self.cancel.child_token(),
        );
        let task = tokio::spawn(worker.run());
        self.workers.insert(
            uid,
            WorkerHandle {
                key,
                intent: tx,
                wake,
                task,
            },
        );
    }

    /// Keeps a pod that asks to be held from starting, and tells the cloud it is held.
    fn hold(&mut self, key: String, uid: String, pod: Value) {
        let report = !hold::Condition::Held.shown(&pod);
        let copy = report.then(|| pod.clone());
        let first = !self.held.is_held(&key);
        match self.held.hold(&key, &uid, pod) {
            hold::Kept::Stale => return,
            hold::Kept::Held { replaced } => {
                if let Some(old) = replaced.filter(|old| *old != uid) {
                    self.unknown(&old);
                }
            }
        }
        if first {
            tracing::info!(pod = %key, held = self.held.len(), "pod upgrade held ({} annotation); waiting for unhold-upgrade", hold::ANNOTATION);
        }
        if let Some(pod) = copy
            && !self.held.reporting(&key)
        {
            let task = tokio::spawn(hold::report(
                self.shared.clone(),
                pod,
                hold::Condition::Held,
                self.cancel.child_token(),
            ));
            self.held.set_report(&key, task);
        }
    }

    /// Starts the held pods `what` names; their `namespace/name`.
    fn release(&mut self, what: hold::Release) -> Vec<String> {
        let released = match what {
            hold::Release::Pod { namespace, name } => {
                let key = format!("{namespace}/{name}");
                self.held
                    .release(&key)
                    .map(|pod| vec![(key, pod)])
                    .unwrap_or_default()
            }
            hold::Release::All => self.held.release_all(),
        };
        let mut keys = Vec::with_capacity(released.len());
        for (key, pod) in released {
            tracing::info!(pod = %key, "held pod upgrade released; starting it");
            tokio::spawn(hold::report(
                self.shared.clone(),
                pod.clone(),
                hold::Condition::Released,
                self.cancel.child_token(),
            ));
            self.upsert_as(pod, Admission::Released);
            keys.push(key);
        }
        keys
    }

    /// A pod UID no worker runs any more: what the runtime has of it is garbage.
    fn unknown(&self, uid: &str) {
        if self.workers.contains_key(uid) {
            return;
        }
        if let Ok(mut known) = self.shared.known_pods.lock() {
            known.remove(uid);
        }
    }

    /// Forgets workers that finished (their pod was removed).
    fn reap(&mut self) {
        let done: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, w)| w.task.is_finished())
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in done {
            self.workers.remove(&uid);
            self.relisted.remove(&uid);
            if let Ok(mut known) = self.shared.known_pods.lock() {
                known.remove(&uid);
            }
        }
    }

    /// One list of this node's sandboxes and containers; wakes the workers whose pods
    /// changed (the kubelet's PLEG).
    async fn relist(&mut self) {
        let runtime = &self.shared.runtime;
        let selector =
            HashMap::from([(LABEL_NODE.to_string(), self.shared.config.node_name.clone())]);
        let (containers, sandboxes) = match tokio::join!(
            runtime.list_containers(selector.clone()),
            runtime.list_sandboxes(selector)
        ) {
            (Ok(c), Ok(s)) => (c, s),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(error = %e, "relist failed");
                return;
            }
        };
        let mut now: HashMap<String, Vec<(String, i32)>> = HashMap::new();
        for c in &containers {
            if let Some(uid) = c.labels.get(LABEL_POD_UID) {
                now.entry(uid.clone())
                    .or_default()
                    .push((c.id.clone(), c.state));
            }
        }
        for s in &sandboxes {
            if let Some(uid) = s.labels.get(LABEL_POD_UID) {
                now.entry(uid.clone())
                    .or_default()
                    .push((s.id.clone(), 100 + s.state));
            }
        }
        for v in now.values_mut() {
            v.sort();
        }
        for (uid, w) in &self.workers {
            if now.get(uid) != self.relisted.get(uid) {
                w.wake.notify_one();
            }
        }
        self.relisted = now;
    }

    fn housekeeping(&mut self) {
        self.reap();
        if self.gc.as_ref().is_some_and(|g| !g.is_finished()) {
            return;
        }
        let shared = self.shared.clone();
        self.gc = Some(tokio::spawn(async move {
            match gc::collect(&shared).await {
                Ok(c) if c != gc::Collected::default() => {
                    tracing::info!(
                        containers = c.containers,
                        sandboxes = c.sandboxes,
                        directories = c.directories,
                        "removed what no pod of this node owns"
                    );
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "garbage collection failed"),
            }
        }));
    }
}

/// Waits for the runtime, then pulls the sandbox image if needed and collects what no pod
/// of this node owns.
async fn runtime_ready(shared: Arc<Shared>, cancel: CancellationToken) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        match shared.runtime.version().await {
            Ok(v) => {
                tracing::info!(runtime = %v.runtime_name, version = %v.runtime_version, endpoint = %shared.config.runtime_endpoint, "container runtime ready");
                let _ = shared.runtime_name.set(v.runtime_name);
                break;
            }
            Err(e) => {
                tracing::warn!(endpoint = %shared.config.runtime_endpoint, error = %e, "container runtime not reachable; retrying");
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
    tokio::spawn(ensure_sandbox_image(shared.clone()));
    tokio::spawn(image_gc::run(shared.clone(), cancel.clone()));
    match gc::collect(&shared).await {
        Ok(c) if c != gc::Collected::default() => {
            tracing::info!(
                containers = c.containers,
                sandboxes = c.sandboxes,
                directories = c.directories,
                cgroups = c.cgroups,
                "removed what no pod of this node owns"
            );
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "garbage collection at start failed"),
    }
}

/// Pulls the sandbox image when missing, so pods can start later while offline.
async fn ensure_sandbox_image(shared: Arc<Shared>) {
    let image = shared.config.pod_sandbox_image.clone();
    if image.is_empty() {
        return;
    }
    match shared.runtime.image_status(&image).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            let _one_at_a_time = shared.pull_lock.lock().await;
            match shared
                .runtime
                .pull_image(&image, None, shared.config.image_pull_timeout)
                .await
            {
                Ok(_) => tracing::info!(image, "sandbox image pulled"),
                Err(e) => tracing::warn!(image, error = %e, "cannot pull the sandbox image"),
            }
        }
        Err(e) => tracing::warn!(image, error = %e, "cannot check the sandbox image"),
    }
}

/// Whether a pod's volumes read the named configmap or secret.
pub fn volumes_use(pod: &Value, kind: ConfigKind, namespace: &str, name: &str) -> bool {
    if pod["metadata"]["namespace"].as_str() != Some(namespace) {
        return false;
    }
    let volumes = pod["spec"]["volumes"].as_array().into_iter().flatten();
    for v in volumes {
        let direct = match kind {
            ConfigKind::ConfigMap => v["configMap"]["name"].as_str() == Some(name),
            ConfigKind::Secret => v["secret"]["secretName"].as_str() == Some(name),
        };
        let projected = v["projected"]["sources"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| match kind {
                ConfigKind::ConfigMap => s["configMap"]["name"].as_str() == Some(name),
                ConfigKind::Secret => s["secret"]["name"].as_str() == Some(name),
            });
        if direct || projected {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn configmap_changes_reach_only_pods_whose_volumes_use_them() {
        let pod = json!({"metadata": {"namespace": "ns"}, "spec": {"volumes": [
            {"name": "a", "configMap": {"name": "cfg"}},
            {"name": "b", "projected": {"sources": [{"secret": {"name": "tok"}}]}},
        ]}});
        assert!(volumes_use(&pod, ConfigKind::ConfigMap, "ns", "cfg"));
        assert!(volumes_use(&pod, ConfigKind::Secret, "ns", "tok"));
        assert!(!volumes_use(&pod, ConfigKind::ConfigMap, "other", "cfg"));
        assert!(!volumes_use(&pod, ConfigKind::Secret, "ns", "cfg"));
    }
}
