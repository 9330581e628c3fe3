//! One task per pod: observes the pod's sandboxes and containers, plans with
//! [`lifecycle::plan`], executes the actions against the runtime, and reports the status to
//! the cloud when it changed. It also runs the pod's graceful deletion and its removal.
//!
//! A worker wakes when its pod changes, when the runtime shows one of its containers changed
//! (the dispatcher's relist), when a back-off or retry is due, and at least every
//! `syncFrequency`. When edgecore stops, workers stop and leave their containers running: a
//! restarted edgecore adopts them.

use super::backoff::Backoff;
use super::containers::{
    ContainerInput, ContainerKind, check_non_root, container_config, etc_hosts_content,
};
use super::env::{ObjectSource, PodContext, container_env};
use super::events::{EventType, ObjectRef};
use super::lifecycle::{self, Action, Phase, PlanInput, PodState, Waiting};
use super::probes::Probes;
use super::runtime::{PodRuntime, Runtime};
use super::sandbox::{log_directory, sandbox_config};
use super::settings::EdgedConfig;
use super::spec::{Pod, PullPolicy, metadata_of};
use super::status::{StatusInput, pod_status, unrunnable_status};
use super::status_report::{ListForm, Outcome, status_patch};
use super::time;
use super::volumes::{self, HostVolume, TokenCache};
use crate::metamanager::{MetaClient, MetaError};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

/// First and longest wait before a status the API server refused is sent again.
const STATUS_REFUSED_FIRST: Duration = Duration::from_secs(1);
const STATUS_REFUSED_MAX: Duration = Duration::from_secs(300);

/// A refusal worth backing off from: the request itself was wrong (4xx), not a conflict or
/// a throttle the next attempt may not meet.
fn refused(code: i32) -> bool {
    (400..500).contains(&code) && code != 409 && code != 429
}

/// The last status the API server refused, and when to try it again.
struct RefusedStatus {
    status: Value,
    reason: String,
    delay: Duration,
    retry_at: Instant,
    /// How the refused patch stated the IP lists.
    form: ListForm,
}

/// What the dispatcher wants for a pod: its newest object, whether it was deleted, and a
/// counter bumped when a configmap or secret its volumes use changed.
#[derive(Debug, Clone)]
pub struct PodIntent {
    pub object: Arc<Value>,
    pub deleted: bool,
    pub config_version: u64,
}

/// What the machine offers pods (for `resourceFieldRef` defaults and OOM scores).
#[derive(Debug, Clone, Default)]
pub struct Allocatable {
    pub cpu_milli: i128,
    pub memory: i128,
    pub ephemeral: i128,
    pub memory_capacity: i128,
}

/// State every worker shares.
pub struct Shared {
    pub config: EdgedConfig,
    pub runtime: Runtime,
    pub meta: MetaClient,
    /// Kubernetes Events about pods (never blocks).
    pub events: super::events::Recorder,
    /// Configmaps and secrets, fetched once for concurrent readers.
    pub objects: super::objects::ObjectCache,
    pub runtime_name: OnceLock<String>,
    pub allocatable: Allocatable,
    /// Pods with a worker (their sandboxes and containers are not garbage).
    pub known_pods: Mutex<HashSet<String>>,
    /// Image pulls one at a time (the kubelet's `serializeImagePulls`).
    pub pull_lock: tokio::sync::Mutex<()>,
    /// Bumped when the cloud link comes back: statuses are sent again even if unchanged
    /// here (the cloud side may have marked the node's pods not ready meanwhile).
    pub resync: watch::Sender<u64>,
    /// Notified when the node has DiskPressure: unused images are removed at once.
    pub image_gc_now: tokio::sync::Notify,
    /// Status patches per pod (`/metrics`).
    pub status_reports: Arc<super::status_report::StatusReports>,
}

impl Shared {
    pub fn runtime_name(&self) -> &str {
        self.runtime_name
            .get()
            .map(String::as_str)
            .unwrap_or("containerd")
    }
}

pub struct PodWorker {
    shared: Arc<Shared>,
    uid: String,
    intent: watch::Receiver<PodIntent>,
    wake: Arc<Notify>,
    cancel: CancellationToken,
    state: Option<PodState>,
    raw: Arc<Value>,
    pod: Option<Pod>,
    spec_error: Option<String>,
    crash_backoff: Backoff,
    image_backoff: Backoff,
    image_failures: HashMap<String, SystemTime>,
    /// Why containers could not be started, by name; cleared when they start.
    notes: HashMap<String, Waiting>,
    finished: Option<Phase>,
    last_sent: Option<Value>,
    status_pending: bool,
    refused: Option<RefusedStatus>,
    /// The API server's copy of the status, as last known: the pod a status patch returned,
    /// or the stored pod.
    server_status: Value,
    tokens: TokenCache,
    volumes: Option<HashMap<String, HostVolume>>,
    volumes_error: Option<String>,
    volumes_prepared: Option<(u64, Instant)>,
    deleted_at_api: bool,
    probes: Probes,
    resync: watch::Receiver<u64>,
    force_report: bool,
    first_seen: SystemTime,
    deadline_exceeded: bool,
}

/// What a sync asks of the loop.
enum Next {
    After(Duration),
    Done,
}

impl PodWorker {
    pub fn new(
        shared: Arc<Shared>,
        uid: String,
        intent: watch::Receiver<PodIntent>,
        wake: Arc<Notify>,
        cancel: CancellationToken,
    ) -> Self {
        let c = &shared.config;
        let crash_backoff = Backoff::new(c.crash_backoff_initial, c.crash_backoff_max);
        let image_backoff = Backoff::new(c.image_backoff_initial, c.image_backoff_max);
        let resync = shared.resync.subscribe();
        PodWorker {
            shared,
            uid,
            intent,
            wake,
            cancel,
            state: None,
            raw: Arc::new(Value::Null),
            pod: None,
            spec_error: None,
            crash_backoff,
            image_backoff,
            image_failures: HashMap::new(),
            notes: HashMap::new(),
            finished: None,
            last_sent: None,
            status_pending: false,
            refused: None,
            server_status: Value::Null,
            tokens: TokenCache::default(),
            volumes: None,
            volumes_error: None,
            volumes_prepared: None,
            deleted_at_api: false,
            probes: Probes::default(),
            resync,
            force_report: false,
            first_seen: SystemTime::now(),
            deadline_exceeded: false,
        }
    }

    pub async fn run(mut self) {
        loop {
            // A sync may wait long (a stop with a grace period, a query to the cloud): it is
            // abandoned when edgecore stops; the next edged picks up from what the runtime has.
            let cancel = self.cancel.clone();
            let next = tokio::select! {
                _ = cancel.cancelled() => return,
                next = self.sync() => next,
            };
            let wait = match next {
                Next::Done => return,
                Next::After(d) => d,
            };
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                changed = self.intent.changed() => if changed.is_err() { return },
                _ = self.wake.notified() => {}
                changed = self.resync.changed() => {
                    if changed.is_ok() {
                        self.force_report = true;
                    }
                }
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    fn key(&self) -> String {
        let m = metadata_of(&self.raw);
        format!("{}/{}", m.namespace, m.name)
    }

    /// Records a Kubernetes Event about the pod, or about one of its containers.
    fn event(
        &self,
        container: Option<&str>,
        kind: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        let pod = ObjectRef::pod(&metadata_of(&self.raw));
        let object = match container {
            Some(name) => {
                let init = self
                    .pod
                    .as_ref()
                    .is_some_and(|p| p.spec.init_containers.iter().any(|c| c.name == name));
                pod.container(name, init)
            }
            None => pod,
        };
        self.shared.events.record(&object, kind, reason, message);
    }

    fn set_state(&mut self, state: PodState) {
        if self.state.as_ref() != Some(&state) {
            tracing::info!(pod = %self.key(), uid = %self.uid,
                from = %self.state.as_ref().map(ToString::to_string).unwrap_or_else(|| "New".into()),
                to = %state, "pod state");
            self.state = Some(state);
        }
    }

    /// Parses a new object; keeps the previous parse when the object is the same.
    fn refresh_spec(&mut self, object: &Arc<Value>) {
        if Arc::ptr_eq(object, &self.raw) {
            return;
        }
        self.raw = object.clone();
        self.server_status = object.get("status").cloned().unwrap_or(Value::Null);
        match Pod::from_value(object).and_then(|p| p.spec.validate().map(|_| p)) {
            Ok(pod) => {
                if self.last_sent.is_none() && pod.status.is_object() {
                    // What the cloud holds (of the fields edged reports): an unchanged status
                    // is not sent again, e.g. after a restart.
                    self.last_sent = Some(super::status::reported_fields(&pod.status));
                }
                if self.finished.is_none()
                    && let Some(phase) = pod.status["phase"].as_str().and_then(Phase::parse)
                    && phase.is_terminal()
                {
                    self.finished = Some(phase);
                }
                self.pod = Some(pod);
                self.spec_error = None;
            }
            Err(e) => {
                tracing::warn!(pod = %self.key(), error = %e, "pod spec cannot run on this node");
                self.pod = None;
                self.spec_error = Some(e.to_string());
            }
        }
    }

    async fn sync(&mut self) -> Next {
        let intent = self.intent.borrow_and_update().clone();
        self.refresh_spec(&intent.object);
        if intent.deleted {
            return self.remove().await;
        }
        let retry = self.shared.config.retry_period;
        if let Some(message) = self.spec_error.clone() {
            self.event(
                None,
                EventType::Warning,
                "Failed",
                format!("Error: {message}"),
            );
            self.set_state(PodState::Unrunnable {
                message: message.clone(),
            });
            let previous = self.previous_status();
            let status = unrunnable_status(
                &self.raw,
                "CreateContainerConfigError",
                &message,
                &self.shared.config.node_ip,
                &previous,
                &time::now(),
            );
            self.report(status).await;
            return Next::After(if self.status_pending {
                retry
            } else {
                self.shared.config.sync_frequency
            });
        }
        let Some(pod) = self.pod.clone() else {
            return Next::After(retry);
        };
        if pod.is_terminating() {
            return self.terminate(&pod).await;
        }
        self.sync_running(&pod, intent.config_version).await
    }

    fn previous_status(&self) -> Value {
        self.last_sent
            .clone()
            .or_else(|| self.pod.as_ref().map(|p| p.status.clone()))
            .unwrap_or(Value::Null)
    }

    async fn observe(&self) -> Option<PodRuntime> {
        match self.shared.runtime.observe(&self.uid).await {
            Ok(mut rt) => {
                self.fill_termination_messages(&mut rt);
                Some(rt)
            }
            Err(e) => {
                tracing::warn!(pod = %self.key(), error = %e, "cannot observe the pod in the runtime");
                None
            }
        }
    }

    /// Ended containers' messages from their termination logs (or their log's tail).
    fn fill_termination_messages(&self, rt: &mut PodRuntime) {
        let Some(pod) = &self.pod else {
            return;
        };
        let dir = self.shared.config.pod_dir(&self.uid);
        for info in rt.containers.iter_mut() {
            if info.state != crate::cri::api::ContainerState::ContainerExited
                || !info.message.is_empty()
            {
                continue;
            }
            let Some(c) = pod
                .spec
                .containers
                .iter()
                .chain(&pod.spec.init_containers)
                .find(|c| c.name == info.name)
            else {
                continue;
            };
            let file = super::containers::termination_log_file(&dir, &info.name, info.attempt);
            info.message = super::containers::termination_message(
                c,
                &file,
                std::path::Path::new(&info.log_path),
                info.exit_code,
            );
        }
    }

    fn context(&self, pod: &Pod, rt: &PodRuntime) -> PodContext {
        let host_ip = self.shared.config.node_ip.clone();
        let pod_ips = if pod.spec.host_network {
            vec![host_ip.clone()]
        } else {
            rt.latest_sandbox()
                .map(|s| s.ips.clone())
                .unwrap_or_default()
        };
        let a = &self.shared.allocatable;
        PodContext {
            pod_ips,
            host_ip,
            allocatable_cpu_milli: a.cpu_milli,
            allocatable_memory: a.memory,
            allocatable_ephemeral: a.ephemeral,
        }
    }

    async fn prepare_volumes(&mut self, pod: &Pod, rt: &PodRuntime, config_version: u64) {
        let fresh = self.volumes_prepared.is_some_and(|(v, at)| {
            v == config_version && at.elapsed() < self.shared.config.sync_frequency
        });
        if fresh && self.volumes.is_some() {
            return;
        }
        let ctx = self.context(pod, rt);
        let dir = self.shared.config.pod_dir(&self.uid);
        match volumes::prepare(pod, &dir, &ctx, &self.shared.objects, &mut self.tokens).await {
            Ok(v) => {
                self.volumes = Some(v);
                self.volumes_error = None;
                self.volumes_prepared = Some((config_version, Instant::now()));
            }
            Err(e) => {
                tracing::warn!(pod = %pod.key(), error = %e, "volumes not ready");
                self.event(None, EventType::Warning, "FailedMount", e.0.clone());
                self.volumes_error = Some(e.0);
                // A volume that worked before keeps working for running containers.
                if self.volumes.is_none() {
                    self.volumes_prepared = None;
                }
            }
        }
    }

    async fn sync_running(&mut self, pod: &Pod, config_version: u64) -> Next {
        let config = self.shared.config.clone();
        let mut rt = match self.observe().await {
            Some(rt) => rt,
            None => return Next::After(config.retry_period),
        };
        let deadline_left = self.check_deadline(pod);
        if self.finished.is_none() {
            self.prepare_volumes(pod, &rt, config_version).await;
        }
        let mut decision;
        let mut rounds = 0;
        loop {
            rounds += 1;
            decision = lifecycle::plan(&PlanInput {
                pod,
                rt: &rt,
                backoff: &self.crash_backoff,
                now: SystemTime::now(),
                finished: self.finished,
                unhealthy: &self.probes.unhealthy(),
                keep_exited: config.max_per_pod_container_count,
            });
            self.set_state(decision.state.clone());
            if let PodState::Finished(p) = decision.state {
                self.finished = Some(p);
            }
            if decision.actions.is_empty() || rounds > 3 {
                break;
            }
            let progressed = self.execute(pod, &rt, &decision.actions).await;
            match self.observe().await {
                Some(next) => rt = next,
                None => break,
            }
            if !progressed {
                decision = lifecycle::plan(&PlanInput {
                    pod,
                    rt: &rt,
                    backoff: &self.crash_backoff,
                    now: SystemTime::now(),
                    finished: self.finished,
                    unhealthy: &self.probes.unhealthy(),
                    keep_exited: config.max_per_pod_container_count,
                });
                break;
            }
        }
        for (name, w) in &decision.waiting {
            if w.reason == "CrashLoopBackOff" {
                let m = &pod.metadata;
                self.event(
                    Some(name),
                    EventType::Warning,
                    "BackOff",
                    format!(
                        "Back-off restarting failed container {name} in pod {}_{}({})",
                        m.name, m.namespace, m.uid
                    ),
                );
            }
        }
        let probe_wake = self
            .probes
            .run(pod, &rt, &self.shared.runtime, &config.node_ip)
            .await;
        for f in self.probes.take_failures() {
            self.event(
                Some(&f.container),
                EventType::Warning,
                "Unhealthy",
                format!("{} probe failed: {}", f.kind, f.output),
            );
        }
        if self.probes.take_changed() {
            // A readiness change shows at once; a liveness failure restarts at once.
            if !self.probes.unhealthy().is_empty() {
                self.wake.notify_one();
            }
        }
        let mut waiting = self.notes.clone();
        // An exited container that will not restart shows how it ended, not why it waits.
        let policy = pod.spec.restart_policy();
        waiting.retain(|name, _| match lifecycle::current(&rt, name) {
            Some(c) if c.state == crate::cri::api::ContainerState::ContainerExited => {
                self.finished.is_none() && lifecycle::should_restart(policy, c.exit_code)
            }
            _ => true,
        });
        waiting.extend(decision.waiting.clone());
        if let Some(e) = &self.volumes_error {
            for c in pod.spec.containers.iter().chain(&pod.spec.init_containers) {
                if lifecycle::current(&rt, &c.name).is_none() {
                    waiting.insert(
                        c.name.clone(),
                        Waiting::new("CreateContainerConfigError", e.clone()),
                    );
                }
            }
        }
        let phase = self.finished.unwrap_or_else(|| lifecycle::phase(pod, &rt));
        let previous = self.previous_status();
        let now = time::now();
        let status = pod_status(&StatusInput {
            pod,
            rt: &rt,
            phase,
            waiting: &waiting,
            ready: &self.probes.readiness(),
            started: &self.probes.started(),
            host_ip: &config.node_ip,
            runtime_name: self.shared.runtime_name(),
            previous: &previous,
            now: &now,
            reason: self.deadline_exceeded.then_some("DeadlineExceeded"),
            message: self
                .deadline_exceeded
                .then_some("Pod was active on the node longer than the specified deadline"),
        });
        self.report(status).await;
        let mut wait = config.sync_frequency;
        if let Some(left) = deadline_left {
            wait = wait.min(left + Duration::from_millis(50));
        }
        if let Some(w) = decision.wake_after {
            wait = wait.min(w + Duration::from_millis(50));
        }
        if let Some(w) = probe_wake {
            wait = wait.min(w);
        }
        if !self.notes.is_empty() || self.volumes_error.is_some() || self.status_pending {
            wait = wait.min(config.retry_period);
        }
        if let Some(w) = self.next_image_retry() {
            wait = wait.min(w);
        }
        Next::After(wait)
    }

    /// `activeDeadlineSeconds`: past it the pod fails (its containers are stopped). Returns
    /// the time left.
    fn check_deadline(&mut self, pod: &Pod) -> Option<Duration> {
        let deadline = Duration::from_secs(pod.spec.active_deadline_seconds?.max(0) as u64);
        if self.finished.is_some() {
            return None;
        }
        let start = self
            .previous_status()
            .get("startTime")
            .and_then(Value::as_str)
            .and_then(time::parse_rfc3339)
            .unwrap_or(self.first_seen);
        let active = SystemTime::now().duration_since(start).unwrap_or_default();
        if active >= deadline {
            tracing::info!(pod = %pod.key(), deadline_s = deadline.as_secs(), "active deadline exceeded; stopping the pod");
            self.event(
                None,
                EventType::Normal,
                "DeadlineExceeded",
                "Pod was active on the node longer than the specified deadline",
            );
            self.deadline_exceeded = true;
            self.finished = Some(Phase::Failed);
            return None;
        }
        Some(deadline - active)
    }

    fn next_image_retry(&self) -> Option<Duration> {
        let now = SystemTime::now();
        self.image_failures
            .iter()
            .filter_map(|(image, at)| self.image_backoff.remaining(image, *at, now))
            .min()
            .map(|d| d + Duration::from_millis(50))
    }

    /// Runs the actions in order; true if any changed the runtime.
    async fn execute(&mut self, pod: &Pod, rt: &PodRuntime, actions: &[Action]) -> bool {
        let runtime = self.shared.runtime.clone();
        let grace = Duration::from_secs(pod.grace_period_seconds() as u64);
        let mut progressed = false;
        for action in actions {
            match action {
                Action::KillPod => {
                    self.kill_all(rt, grace).await;
                    // NotReady ones too: stopping tears down what the runtime still holds for
                    // them (their network). Stopping a stopped sandbox is a no-op.
                    for s in &rt.sandboxes {
                        if let Err(e) = runtime.stop_sandbox(&s.id).await {
                            tracing::warn!(pod = %pod.key(), sandbox = %s.id, error = %e, "stopping sandbox");
                        }
                    }
                    progressed = true;
                }
                Action::CreateSandbox { attempt } => {
                    if let Some(e) = self.volumes_error.clone() {
                        tracing::debug!(pod = %pod.key(), error = %e, "sandbox waits for volumes");
                        continue;
                    }
                    if *attempt > 0 {
                        self.event(
                            None,
                            EventType::Normal,
                            "SandboxChanged",
                            "Pod sandbox changed, it will be killed and re-created.",
                        );
                    }
                    let started = Instant::now();
                    let dir = self.shared.config.pod_dir(&self.uid);
                    let logs = log_directory(&self.shared.config, pod);
                    for d in [&dir, &logs] {
                        if let Err(e) = std::fs::create_dir_all(d) {
                            tracing::warn!(pod = %pod.key(), dir = %d.display(), error = %e, "creating pod directory");
                        }
                    }
                    let sb = sandbox_config(pod, &self.shared.config, *attempt);
                    match runtime.run_sandbox(sb).await {
                        Ok(id) => {
                            tracing::info!(pod = %pod.key(), sandbox = %id, attempt, elapsed_ms = started.elapsed().as_millis() as u64, "sandbox started");
                            for c in pod.spec.containers.iter().chain(&pod.spec.init_containers) {
                                if self
                                    .notes
                                    .get(&c.name)
                                    .is_some_and(|n| n.reason == "ContainerCreating")
                                {
                                    self.notes.remove(&c.name);
                                }
                            }
                            progressed = true;
                        }
                        Err(e) => {
                            tracing::warn!(pod = %pod.key(), error = %e, "RunPodSandbox failed");
                            self.event(
                                None,
                                EventType::Warning,
                                "FailedCreatePodSandBox",
                                format!("Failed to create pod sandbox: {e}"),
                            );
                            for c in pod.spec.containers.iter().chain(&pod.spec.init_containers) {
                                self.notes.insert(
                                    c.name.clone(),
                                    Waiting::new(
                                        "ContainerCreating",
                                        format!("failed to create pod sandbox: {e}"),
                                    ),
                                );
                            }
                        }
                    }
                }
                Action::StartContainer {
                    kind,
                    index,
                    attempt,
                    restart_after,
                } => {
                    if self
                        .start_container(pod, rt, *kind, *index, *attempt, *restart_after)
                        .await
                    {
                        progressed = true;
                    }
                }
                Action::KillContainer { id, name, why } => {
                    tracing::info!(pod = %pod.key(), container = %name, why = %why, "stopping container");
                    let message = if why.contains("liveness") {
                        format!("Container {name} failed liveness probe, will be restarted")
                    } else if why.contains("spec changed") {
                        format!("Container {name} definition changed, will be restarted")
                    } else {
                        format!("Stopping container {name}")
                    };
                    self.event(Some(name), EventType::Normal, "Killing", message);
                    if self.stop_one(rt, id, name, grace).await {
                        progressed = true;
                    }
                    self.probes.forget(id);
                }
                Action::RemoveContainer { id } => {
                    if let Err(e) = runtime.remove_container(id).await {
                        tracing::debug!(pod = %pod.key(), container = %id, error = %e, "RemoveContainer failed");
                    } else if let Some(c) = rt.containers.iter().find(|c| &c.id == id) {
                        let file = super::containers::termination_log_file(
                            &self.shared.config.pod_dir(&self.uid),
                            &c.name,
                            c.attempt,
                        );
                        let _ = std::fs::remove_file(file);
                    }
                    self.probes.forget(id);
                }
                Action::RemoveSandbox { id } => {
                    let _ = runtime.stop_sandbox(id).await;
                    if let Err(e) = runtime.remove_sandbox(id).await {
                        tracing::debug!(pod = %pod.key(), sandbox = %id, error = %e, "RemovePodSandbox failed");
                    }
                }
            }
        }
        progressed
    }

    /// The address hooks and probes reach the pod at.
    fn pod_host(&self, rt: &PodRuntime) -> String {
        let node_ip = self.shared.config.node_ip.clone();
        match &self.pod {
            Some(p) if !p.spec.host_network => rt
                .latest_sandbox()
                .and_then(|s| s.ips.first().cloned())
                .unwrap_or(node_ip),
            _ => node_ip,
        }
    }

    /// Stops one container: its preStop hook, then SIGTERM and SIGKILL after what is left
    /// of `grace`.
    async fn stop_one(&self, rt: &PodRuntime, id: &str, name: &str, grace: Duration) -> bool {
        let spec = self.pod.as_ref().and_then(|p| {
            p.spec
                .containers
                .iter()
                .chain(&p.spec.init_containers)
                .find(|c| c.name == name)
        });
        let host = self.pod_host(rt);
        let runtime = &self.shared.runtime;
        let left = super::hooks::pre_stop(spec, id, &host, grace, runtime).await;
        match runtime.stop_container(id, left).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(container = %name, id, error = %e, "StopContainer failed");
                false
            }
        }
    }

    /// Stops every running container at once, each with `grace`.
    async fn kill_all(&mut self, rt: &PodRuntime, grace: Duration) {
        for c in rt.running() {
            let message = format!("Stopping container {}", c.name);
            self.event(Some(&c.name), EventType::Normal, "Killing", message);
        }
        let this = &*self;
        let stops = rt.running().map(|c| async move {
            this.stop_one(rt, &c.id, &c.name, grace).await;
            c.id.clone()
        });
        let stopped = futures_util::future::join_all(stops).await;
        for id in stopped {
            self.probes.forget(&id);
        }
    }

    /// The image of `container`, pulled per its policy (with the kubelet's events).
    async fn ensure_image(
        &mut self,
        container: &str,
        image: &str,
        policy: PullPolicy,
        namespace: &str,
        secrets: &[super::spec::LocalObjectReference],
    ) -> Result<(String, Option<crate::cri::api::Image>), Waiting> {
        let runtime = &self.shared.runtime;
        let present = match runtime.image_status(image).await {
            Ok(p) => p,
            Err(e) => {
                let message = format!("Failed to inspect image \"{image}\": {e}");
                self.event(Some(container), EventType::Warning, "Failed", &message);
                return Err(Waiting::new("ErrImagePull", message));
            }
        };
        match (policy, present) {
            (PullPolicy::Never, Some(i)) | (PullPolicy::IfNotPresent, Some(i)) => {
                let message = format!("Container image \"{image}\" already present on machine");
                self.event(Some(container), EventType::Normal, "Pulled", message);
                return Ok((i.id.clone(), Some(i)));
            }
            (PullPolicy::Never, None) => {
                let message =
                    format!("Container image \"{image}\" is not present with pull policy of Never");
                self.event(
                    Some(container),
                    EventType::Warning,
                    "ErrImageNeverPull",
                    &message,
                );
                return Err(Waiting::new("ErrImageNeverPull", message));
            }
            _ => {}
        }
        let now = SystemTime::now();
        if let Some(failed) = self.image_failures.get(image)
            && self.image_backoff.remaining(image, *failed, now).is_some()
        {
            let message = format!("Back-off pulling image \"{image}\"");
            self.event(Some(container), EventType::Normal, "BackOff", &message);
            return Err(Waiting::new("ImagePullBackOff", message));
        }
        self.event(
            Some(container),
            EventType::Normal,
            "Pulling",
            format!("Pulling image \"{image}\""),
        );
        let started = Instant::now();
        // Each matching credential in turn; anonymously when none applies.
        let mut auths: Vec<Option<crate::cri::api::AuthConfig>> = Vec::new();
        for s in secrets {
            match self.shared.objects.secret(namespace, &s.name).await {
                Ok(Some(secret)) => auths.extend(
                    super::pull_secrets::credentials_for(&secret, image)
                        .into_iter()
                        .map(Some),
                ),
                Ok(None) => tracing::warn!(image, secret = %s.name, "image pull secret not found"),
                Err(e) => {
                    tracing::warn!(image, secret = %s.name, error = %e, "cannot read an image pull secret")
                }
            }
        }
        if auths.is_empty() {
            auths.push(None);
        }
        let (pulling, pulled) = {
            let _one_at_a_time = self.shared.pull_lock.lock().await;
            let pulling = Instant::now();
            let mut result = Err(None);
            for auth in auths {
                match runtime
                    .pull_image(image, auth, self.shared.config.image_pull_timeout)
                    .await
                {
                    Ok(r) => {
                        result = Ok(r);
                        break;
                    }
                    Err(e) => result = Err(Some(e)),
                }
            }
            (pulling, result)
        };
        match pulled {
            Ok(image_ref) => {
                tracing::debug!(
                    image,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "image pulled"
                );
                self.image_failures.remove(image);
                self.image_backoff.forget(image);
                let status = runtime.image_status(&image_ref).await.ok().flatten();
                let go = |d: Duration| crate::config::format_go_duration(d);
                self.event(
                    Some(container),
                    EventType::Normal,
                    "Pulled",
                    format!(
                        "Successfully pulled image \"{image}\" in {} ({} including waiting). Image size: {} bytes.",
                        go(pulling.elapsed()),
                        go(started.elapsed()),
                        status.as_ref().map_or(0, |i| i.size)
                    ),
                );
                Ok((image_ref, status))
            }
            Err(e) => {
                let now = SystemTime::now();
                self.image_backoff.next(image, now, now);
                self.image_failures.insert(image.to_string(), now);
                let why = e.map(|e| e.to_string()).unwrap_or_default();
                self.event(
                    Some(container),
                    EventType::Warning,
                    "Failed",
                    format!("Failed to pull image \"{image}\": {why}"),
                );
                Err(Waiting::new(
                    "ErrImagePull",
                    format!("failed to pull image \"{image}\": {why}"),
                ))
            }
        }
    }

    async fn start_container(
        &mut self,
        pod: &Pod,
        rt: &PodRuntime,
        kind: ContainerKind,
        index: usize,
        attempt: u32,
        restart_after: Option<SystemTime>,
    ) -> bool {
        let list = match kind {
            ContainerKind::Init => &pod.spec.init_containers,
            ContainerKind::App => &pod.spec.containers,
        };
        let Some(c) = list.get(index) else {
            return false;
        };
        let name = c.name.clone();
        let Some(sandbox) = rt.latest_sandbox().filter(|s| s.ready).cloned() else {
            return false;
        };
        let Some(volumes) = self.volumes.clone() else {
            return false;
        };
        if let Some(t) = restart_after {
            // The restart is charged whether or not it works.
            self.crash_backoff
                .next(&lifecycle::backoff_key(pod, &name), t, SystemTime::now());
        }
        let pulled = self
            .ensure_image(
                &name,
                c.image(),
                c.pull_policy(),
                &pod.metadata.namespace,
                &pod.spec.image_pull_secrets,
            )
            .await;
        let (image_ref, image) = match pulled {
            Ok(i) => i,
            Err(w) => {
                tracing::warn!(pod = %pod.key(), container = %name, reason = %w.reason, message = %w.message, "image not available");
                self.event(
                    Some(&name),
                    EventType::Warning,
                    "Failed",
                    format!("Error: {}", w.reason),
                );
                self.notes.insert(name, w);
                return false;
            }
        };
        let config_error = |this: &mut Self, message: String| {
            tracing::warn!(pod = %pod.key(), container = %name, error = %message, "container configuration error");
            this.event(
                Some(&name),
                EventType::Warning,
                "Failed",
                format!("Error: {message}"),
            );
            this.notes.insert(
                name.clone(),
                Waiting::new("CreateContainerConfigError", message),
            );
            false
        };
        let ctx = self.context(pod, rt);
        let env = match container_env(pod, c, &ctx, &self.shared.objects).await {
            Ok(env) => env,
            Err(e) => return config_error(self, e.0),
        };
        if let Err(e) = check_non_root(pod, c, image.as_ref()) {
            return config_error(self, e.0);
        }
        let etc_hosts = if pod.spec.host_network {
            None
        } else {
            let path = self.shared.config.pod_dir(&self.uid).join("etc-hosts");
            let content = etc_hosts_content(
                pod,
                ctx.pod_ips.first().map(String::as_str).unwrap_or(""),
                &self.shared.config.cluster_domain,
            );
            if let Err(e) = std::fs::write(&path, content) {
                return config_error(self, format!("writing {}: {e}", path.display()));
            }
            Some(path)
        };
        let termination_log = super::containers::termination_log_file(
            &self.shared.config.pod_dir(&self.uid),
            &name,
            attempt,
        );
        let created = termination_log
            .parent()
            .map(std::fs::create_dir_all)
            .unwrap_or(Ok(()))
            .and_then(|_| std::fs::write(&termination_log, b""))
            .and_then(|_| {
                use std::os::unix::fs::PermissionsExt;
                // Any user in the container may write its termination message.
                std::fs::set_permissions(&termination_log, std::fs::Permissions::from_mode(0o666))
            });
        if let Err(e) = created {
            return config_error(self, format!("creating {}: {e}", termination_log.display()));
        }
        let config = match container_config(&ContainerInput {
            pod,
            container: c,
            kind,
            attempt,
            node_name: &self.shared.config.node_name,
            image_ref: &image_ref,
            env: &env,
            volumes: &volumes,
            etc_hosts: etc_hosts.as_deref(),
            termination_log: Some(&termination_log),
            memory_capacity: self.shared.allocatable.memory_capacity,
        }) {
            Ok(c) => c,
            Err(e) => return config_error(self, e.0),
        };
        let sandbox_cfg = sandbox_config(pod, &self.shared.config, sandbox.attempt);
        let runtime = self.shared.runtime.clone();
        let started = Instant::now();
        let id = match runtime
            .create_container(&sandbox.id, config, sandbox_cfg)
            .await
        {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!(pod = %pod.key(), container = %name, error = %e, "CreateContainer failed");
                self.event(
                    Some(&name),
                    EventType::Warning,
                    "Failed",
                    format!("Error: {e}"),
                );
                self.notes
                    .insert(name, Waiting::new("CreateContainerError", e.to_string()));
                return false;
            }
        };
        self.event(
            Some(&name),
            EventType::Normal,
            "Created",
            format!("Created container: {name}"),
        );
        if let Err(e) = runtime.start_container(&id).await {
            tracing::warn!(pod = %pod.key(), container = %name, error = %e, "StartContainer failed");
            self.event(
                Some(&name),
                EventType::Warning,
                "Failed",
                format!("Error: {e}"),
            );
            self.notes
                .insert(name, Waiting::new("RunContainerError", e.to_string()));
            // The container exists (exited): the next sync restarts it under the back-off.
            return true;
        }
        tracing::info!(pod = %pod.key(), container = %name, id = %id, attempt, elapsed_ms = started.elapsed().as_millis() as u64, "container started");
        self.event(
            Some(&name),
            EventType::Normal,
            "Started",
            format!("Started container {name}"),
        );
        if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let host = ctx
                .pod_ips
                .first()
                .cloned()
                .unwrap_or_else(|| self.shared.config.node_ip.clone());
            let timeout = self.shared.config.runtime_request_timeout;
            if let Err(e) = super::hooks::run_handler(hook, c, &id, &host, timeout, &runtime).await
            {
                tracing::warn!(pod = %pod.key(), container = %name, error = %e, "postStart hook failed; stopping the container");
                self.event(
                    Some(&name),
                    EventType::Warning,
                    "FailedPostStartHook",
                    format!("PostStartHook failed: {e}"),
                );
                let grace = Duration::from_secs(pod.grace_period_seconds() as u64);
                let _ = runtime.stop_container(&id, grace).await;
                self.notes.insert(
                    name,
                    Waiting::new("PostStartHookError", format!("postStart hook failed: {e}")),
                );
                return true;
            }
        }
        self.notes.remove(&name);
        self.probes.started_container(&id);
        true
    }

    /// Graceful deletion: stop every container within the grace period, stop the sandbox,
    /// report the final status, then delete the pod at the API server (grace 0, with the UID
    /// as precondition). The runtime objects go when the deletion comes back.
    async fn terminate(&mut self, pod: &Pod) -> Next {
        let retry = self.shared.config.retry_period;
        if self.deleted_at_api {
            // Done here; the runtime objects go when the deletion reaches the node.
            return Next::After(self.shared.config.sync_frequency);
        }
        self.set_state(PodState::Terminating);
        let Some(rt) = self.observe().await else {
            return Next::After(retry);
        };
        let grace = Duration::from_secs(pod.grace_period_seconds() as u64);
        if rt.running().next().is_some() {
            let started = Instant::now();
            self.kill_all(&rt, grace).await;
            tracing::info!(pod = %pod.key(), grace_s = grace.as_secs(), elapsed_ms = started.elapsed().as_millis() as u64, "containers stopped for deletion");
        }
        let rt = match self.observe().await {
            Some(rt) => rt,
            None => return Next::After(retry),
        };
        for s in rt.sandboxes.iter().filter(|s| s.ready) {
            if let Err(e) = self.shared.runtime.stop_sandbox(&s.id).await {
                tracing::warn!(pod = %pod.key(), error = %e, "stopping sandbox");
            }
        }
        self.set_state(PodState::Terminated);
        let rt = self.observe().await.unwrap_or(rt);
        let phase = match lifecycle::phase(pod, &rt) {
            Phase::Succeeded => Phase::Succeeded,
            _ if rt.containers.is_empty() => self.finished.unwrap_or(Phase::Failed),
            _ => Phase::Failed,
        };
        let previous = self.previous_status();
        let now = time::now();
        let status = pod_status(&StatusInput {
            pod,
            rt: &rt,
            phase,
            waiting: &HashMap::new(),
            ready: &HashMap::new(),
            started: &HashSet::new(),
            host_ip: &self.shared.config.node_ip,
            runtime_name: self.shared.runtime_name(),
            previous: &previous,
            now: &now,
            reason: None,
            message: None,
        });
        self.report(status).await;
        if self.deleted_at_api {
            return Next::After(self.shared.config.sync_frequency);
        }
        let options = json!({
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": self.uid},
        });
        let m = &pod.metadata;
        match self
            .shared
            .meta
            .delete_pod(&m.namespace, &m.name, options)
            .await
        {
            Ok(()) | Err(MetaError::NotFound { .. }) => {
                tracing::info!(pod = %pod.key(), "pod deleted at the API server");
                self.deleted_at_api = true;
                Next::After(self.shared.config.sync_frequency)
            }
            Err(e) => {
                tracing::info!(pod = %pod.key(), error = %e, "deleting the pod at the API server failed; will retry");
                Next::After(retry)
            }
        }
    }

    /// The pod is gone from the node's database: stop and remove its containers and
    /// sandboxes and its directory.
    async fn remove(&mut self) -> Next {
        let retry = self.shared.config.retry_period;
        let key = self.key();
        let Some(rt) = self.observe().await else {
            return Next::After(retry);
        };
        let grace = metadata_of(&self.raw)
            .deletion_grace_period_seconds
            .or_else(|| self.pod.as_ref().map(Pod::grace_period_seconds))
            .unwrap_or(30)
            .max(0) as u64;
        self.kill_all(&rt, Duration::from_secs(grace)).await;
        let runtime = self.shared.runtime.clone();
        let mut failed = false;
        for c in &rt.containers {
            if let Err(e) = runtime.remove_container(&c.id).await {
                tracing::warn!(pod = %key, container = %c.id, error = %e, "RemoveContainer failed");
                failed = true;
            }
        }
        for s in &rt.sandboxes {
            let _ = runtime.stop_sandbox(&s.id).await;
            if let Err(e) = runtime.remove_sandbox(&s.id).await {
                tracing::warn!(pod = %key, sandbox = %s.id, error = %e, "RemovePodSandbox failed");
                failed = true;
            }
        }
        if failed {
            return Next::After(retry);
        }
        if let Err(e) = volumes::remove_pod_dir(&self.shared.config.root_directory, &self.uid) {
            tracing::warn!(pod = %key, error = %e, "removing the pod directory");
        }
        if let Some(pod) = &self.pod {
            let _ = std::fs::remove_dir_all(log_directory(&self.shared.config, pod));
        }
        tracing::info!(pod = %key, uid = %self.uid, "pod removed from the node");
        let m = metadata_of(&self.raw);
        self.shared.status_reports.forget(&m.namespace, &m.name);
        Next::Done
    }

    /// Sends the status when it differs from what the cloud last accepted. A status the API
    /// server refused is sent again only after a back-off (doubling up to
    /// [`STATUS_REFUSED_MAX`]) or once it changes; the refusal is logged once per reason.
    async fn report(&mut self, status: Value) {
        if !self.force_report && self.last_sent.as_ref() == Some(&status) {
            self.status_pending = false;
            return;
        }
        if let Some(r) = &self.refused
            && r.status == status
            && Instant::now() < r.retry_at
        {
            self.status_pending = true;
            return;
        }
        let m = metadata_of(&self.raw);
        let (namespace, name) = (m.namespace.clone(), m.name.clone());
        // After a refusal, the other way of stating the IP lists (the known copy was wrong).
        let form = match &self.refused {
            Some(r) if r.form == ListForm::AsKnown => ListForm::Flipped,
            _ => ListForm::AsKnown,
        };
        let patch = status_patch(&self.uid, &status, &self.server_status, form);
        let result = self
            .shared
            .meta
            .patch_pod_status(&namespace, &name, &patch)
            .await;
        let outcome = match &result {
            Ok(_) => Outcome::Accepted,
            Err(MetaError::Api(e)) if refused(e.err_status.code) => Outcome::Refused,
            Err(_) => Outcome::Failed,
        };
        self.shared
            .status_reports
            .record(&namespace, &name, outcome);
        match result {
            Ok(pod) => {
                if let Some(s) = pod.get("status") {
                    self.server_status = s.clone();
                }
                tracing::debug!(pod = %self.key(), phase = %status["phase"], "pod status sent");
                if self.refused.take().is_some() {
                    tracing::info!(pod = %self.key(), "pod status accepted again");
                }
                self.last_sent = Some(status);
                self.status_pending = false;
                self.force_report = false;
            }
            Err(MetaError::NotFound { .. }) => {
                // The pod is gone at the API server: nothing to report any more.
                self.refused = None;
                self.last_sent = Some(status);
                self.status_pending = false;
                self.force_report = false;
            }
            Err(MetaError::Api(e)) if refused(e.err_status.code) => {
                let reason = format!("{} {}", e.err_status.code, e.err_status.message);
                let delay = self.refused.as_ref().map_or(STATUS_REFUSED_FIRST, |r| {
                    (r.delay * 2).min(STATUS_REFUSED_MAX)
                });
                if self.refused.as_ref().is_none_or(|r| r.reason != reason) {
                    tracing::warn!(
                        pod = %self.key(),
                        code = e.err_status.code,
                        reason = %e.err_status.reason,
                        message = %e.err_status.message,
                        retry_in = ?delay,
                        "the API server refused the pod status; sending it again with back-off"
                    );
                }
                self.refused = Some(RefusedStatus {
                    status,
                    reason,
                    delay,
                    retry_at: Instant::now() + delay,
                    form,
                });
                self.status_pending = true;
            }
            Err(e) => {
                if !self.status_pending {
                    tracing::info!(pod = %self.key(), error = %e, "pod status not sent; will retry");
                }
                self.status_pending = true;
            }
        }
    }
}
