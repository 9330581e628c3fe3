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
use super::lifecycle::{self, Action, Phase, PlanInput, PodState, Waiting, WaitingReason};
use super::probes::Probes;
use super::sandbox::{log_directory, sandbox_config};
use super::settings::EdgedConfig;
use super::spec::{Pod, PullPolicy, metadata_of};
use super::status::{StatusInput, pod_status, unrunnable_status};
use super::status_report::{ListForm, Outcome, status_patch};
use super::volumes::{self, HostVolume, TokenCache};
use crate::cri::runtime::{PodRuntime, Runtime};
use crate::meta::{MetaClient, MetaError};
use kubeedge_shared::clock as time;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

mod context;
mod execute;
mod images;
mod report;
mod start;
mod terminate;
#[cfg(test)]
mod tests;

use report::RefusedStatus;

/// What the dispatcher wants for a pod: its newest object, whether it was deleted, and a
/// counter bumped when a configmap or secret its volumes use changed.
#[derive(Debug, Clone)]
pub struct PodIntent {
    pub object: Arc<Value>,
    pub deleted: bool,
    pub config_version: u64,
    /// The eviction manager evicts the pod.
    pub evicted: Option<Arc<super::eviction::Eviction>>,
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
    /// Notified when the cloud's copy of the Node disagrees with what was reported (the
    /// cluster marked it Unknown): the status is sent again at once.
    pub node_status_now: tokio::sync::Notify,
    /// The cluster marked the node Unknown although the cloud of this link agreed to renew
    /// its Lease (`cloud-lease`): the cloud's renewals are not getting through (its RBAC, its
    /// apiserver), so edged renews the Lease itself until the link ends.
    pub lease_self: std::sync::atomic::AtomicBool,
    pub lease_self_now: tokio::sync::Notify,
    /// What the cloud of the current link agreed to (`cloud-lease`: it renews the Lease).
    pub terms: watch::Receiver<kubeedge_shared::link::CloudTerms>,
    /// Status patches per pod (`/metrics`).
    pub status_reports: Arc<super::status_report::StatusReports>,
    /// Told each pod's state (edgemesh).
    pub observer: Option<Arc<dyn super::PodObserver>>,
    /// Pod cgroups by QoS class.
    pub cgroups: super::cgroups::PodCgroups,
    /// The node's pressure conditions, as the eviction manager last found them.
    pub pressure: Mutex<super::eviction::Conditions>,
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
    /// Why the pod failed on this node (`DeadlineExceeded`, `Evicted`) and the message.
    failure: Option<(String, String)>,
    /// How long containers get to stop when the pod is evicted.
    grace_override: Option<Duration>,
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
            failure: None,
            grace_override: None,
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
                    // Why it failed stays reported (e.g. `Evicted`, after a restart).
                    if let Some(reason) = pod.status["reason"].as_str() {
                        let message = pod.status["message"].as_str().unwrap_or_default();
                        self.failure = Some((reason.to_string(), message.to_string()));
                    }
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
        if let Some(e) = &intent.evicted
            && self.finished.is_none()
        {
            tracing::warn!(pod = %self.key(), message = %e.message, "evicting the pod");
            self.event(None, EventType::Warning, "Evicted", e.message.clone());
            self.failure = Some(("Evicted".into(), e.message.clone()));
            self.grace_override = Some(e.grace);
            self.finished = Some(Phase::Failed);
        }
        if intent.deleted {
            if let Some(o) = &self.shared.observer {
                o.pod_gone(&self.uid);
            }
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
                WaitingReason::CreateContainerConfigError,
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
            // Out of its Services at once, as the endpoint controllers do.
            if let Some(o) = &self.shared.observer {
                o.pod_status(&self.raw, &self.previous_status());
            }
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
            if w.reason == WaitingReason::CrashLoopBackOff {
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
                        Waiting::new(WaitingReason::CreateContainerConfigError, e.clone()),
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
            reason: self.failure.as_ref().map(|f| f.0.as_str()),
            message: self.failure.as_ref().map(|f| f.1.as_str()),
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
            self.failure = Some((
                "DeadlineExceeded".into(),
                "Pod was active on the node longer than the specified deadline".into(),
            ));
            self.finished = Some(Phase::Failed);
            return None;
        }
        Some(deadline - active)
    }
}
