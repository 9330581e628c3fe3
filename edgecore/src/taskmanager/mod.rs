//! taskmanager: KubeEdge's node tasks at the edge (`modules.taskManager`, off by default as in
//! KubeEdge). The cloud sends a job's spec to this node (group `taskmanager`, see
//! `kubeedge_shared::nodetask`); each action is reported to the cloud as
//! `UpdateNodeActionStatus`. ImagePrePullJob runs here (`prepull.rs`, checks in `checks.rs`),
//! ConfigUpdateJob as typed edits of `edgecore.yaml` with a restart and a roll-back
//! (`config_update.rs`; needs the binary's [`Supervisor`]). NodeUpgradeJob is answered with a
//! failure saying so: this edgecore is upgraded by its package.
//!
//! Nothing from a job reaches a shell or a command line: images go to CRI as typed requests.

pub mod checks;
pub mod config_update;
pub mod prepull;

use crate::cri::CriClient;
use crate::cri::runtime::Runtime;
use crate::edgehub::EdgeHub;
use crate::metamanager::MetaClient;
use kubeedge_shared::nodetask::{ActionStatus, JobKind, TaskResource, UPDATE_NODE_ACTION_STATUS};
use kubeedge_shared::operation::source;
use kubeedge_shared::{Group, Message, Operation};
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// What the task manager needs from edgecore's settings.
#[derive(Debug, Clone)]
pub struct TaskSettings {
    pub node_name: String,
    /// CRI endpoint (edged's `remoteRuntimeEndpoint`); empty: no runtime (pulls fail).
    pub runtime_endpoint: String,
    pub runtime_request_timeout: Duration,
    pub image_pull_timeout: Duration,
    /// Set when edgecore runs as its binary, which can restart it (config updates).
    pub supervisor: Option<Arc<Supervisor>>,
}

/// What the edgecore binary offers the task manager: the file it was started from, and a
/// restart (the binary re-executes itself, same process ID, so systemd sees no exit).
#[derive(Debug, Default)]
pub struct Supervisor {
    pub config_path: Option<PathBuf>,
    pub restart: tokio::sync::Notify,
}

impl Supervisor {
    pub fn request_restart(&self) {
        self.restart.notify_one();
    }
}

/// Reports waiting for the link are tried this often, this many times.
const REPORT_RETRY: Duration = Duration::from_secs(5);
const REPORT_TRIES: u32 = 120;

/// Runs the task manager on `rx` (messages of group `taskmanager`) until it closes.
pub fn spawn(
    settings: TaskSettings,
    mut rx: mpsc::Receiver<Message>,
    hub: EdgeHub,
    client: MetaClient,
) -> JoinHandle<()> {
    if let Some(sup) = settings.supervisor.clone()
        && let Some(path) = sup.config_path.clone()
        && let Some(marker) = config_update::read_marker(&path)
    {
        tokio::spawn(resume_config_update(sup, path, marker, hub.clone()));
    }
    tokio::spawn(async move {
        let running: Arc<Mutex<HashSet<String>>> = Arc::default();
        while let Some(msg) = rx.recv().await {
            let Some(task) = TaskResource::parse(&msg.route.resource) else {
                tracing::warn!(resource = %msg.route.resource, "node task with a resource this edge cannot read; dropped");
                continue;
            };
            if task.node != settings.node_name {
                tracing::warn!(resource = %msg.route.resource, "node task for another node; dropped");
                continue;
            }
            let key = task.to_string();
            if !running
                .lock()
                .map(|mut r| r.insert(key.clone()))
                .unwrap_or(false)
            {
                tracing::info!(task = %key, "node task already running; the repeat is ignored");
                continue;
            }
            let (settings, hub, client, running) = (
                settings.clone(),
                hub.clone(),
                client.clone(),
                running.clone(),
            );
            tokio::spawn(async move {
                run(&settings, &hub, &client, &task, &msg).await;
                if let Ok(mut r) = running.lock() {
                    r.remove(&key);
                }
            });
        }
    })
}

async fn run(
    settings: &TaskSettings,
    hub: &EdgeHub,
    client: &MetaClient,
    task: &TaskResource,
    msg: &Message,
) {
    match task.kind {
        JobKind::ImagePrePull => prepull_job(settings, hub, client, task, msg).await,
        JobKind::ConfigUpdate => config_update_job(settings, hub, task, msg).await,
        JobKind::NodeUpgrade => {
            let action = msg.route.operation.to_string();
            tracing::warn!(task = %task, "node upgrade/config update jobs are not run by this edgecore");
            report(
                hub,
                task,
                ActionStatus {
                    action,
                    succ: false,
                    reason: "nodeupgradejob is not supported by kubeedge-rs edgecore: upgrade it with its package (no job field is ever run as a command)".into(),
                    ..Default::default()
                },
            )
            .await;
        }
    }
}

async fn prepull_job(
    settings: &TaskSettings,
    hub: &EdgeHub,
    client: &MetaClient,
    task: &TaskResource,
    msg: &Message,
) {
    let fail = |action: &str, reason: String| ActionStatus {
        action: action.into(),
        succ: false,
        reason,
        ..Default::default()
    };
    let template = match prepull::template(&msg.content) {
        Ok(t) => t,
        Err(e) => return report(hub, task, fail("Check", e)).await,
    };
    // Check.
    if msg.route.operation.to_string() == "Check" {
        let checked = checks::run(&template.check_items).await;
        let ok = checked.is_ok();
        report(
            hub,
            task,
            ActionStatus {
                action: "Check".into(),
                succ: ok,
                reason: checked.err().unwrap_or_default(),
                ..Default::default()
            },
        )
        .await;
        if !ok {
            return;
        }
    }
    // Pull.
    let secret = if template.image_secrets.is_empty() {
        None
    } else {
        let Some((ns, name)) = template
            .image_secrets
            .split_once('/')
            .filter(|(n, s)| !n.is_empty() && !s.is_empty() && !s.contains('/'))
        else {
            return report(
                hub,
                task,
                fail("Pull", "pull secret format is not correct".into()),
            )
            .await;
        };
        match client.get_secret(ns, name).await {
            Ok(s) => Some(s),
            Err(e) => {
                return report(
                    hub,
                    task,
                    fail(
                        "Pull",
                        format!("cannot get the pull secret {ns}/{name}: {e}"),
                    ),
                )
                .await;
            }
        }
    };
    let runtime = match CriClient::connect_lazy(&settings.runtime_endpoint) {
        Ok(c) => Runtime::new(c, settings.runtime_request_timeout),
        Err(e) => return report(hub, task, fail("Pull", e.to_string())).await,
    };
    let attempts = template.retry_times.max(0) as u32 + 1;
    let mut statuses = Vec::new();
    for attempt in 0..attempts {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        statuses = prepull::pull_all(
            &runtime,
            &template.images,
            secret.as_ref(),
            settings.image_pull_timeout,
        )
        .await;
        if statuses.iter().all(|s| s.status == "True") {
            break;
        }
    }
    let ok = statuses.iter().all(|s| s.status == "True");
    tracing::info!(task = %task, ok, images = statuses.len(), "images pre-pulled");
    report(
        hub,
        task,
        ActionStatus {
            action: "Pull".into(),
            succ: ok,
            reason: if ok {
                String::new()
            } else {
                "there were some failures when pulling images".into()
            },
            extend: serde_json::to_string(&statuses).unwrap_or_default(),
            ..Default::default()
        },
    )
    .await;
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A ConfigUpdateJob: `Check` (the typed edit applies and validates), `BackUp` (the file
/// copied aside), `Update` (the new file in place, then a restart; reported by the restarted
/// edgecore, see [`resume_config_update`]).
async fn config_update_job(
    settings: &TaskSettings,
    hub: &EdgeHub,
    task: &TaskResource,
    msg: &Message,
) {
    let fail = |action: &str, reason: String| ActionStatus {
        action: action.into(),
        succ: false,
        reason,
        ..Default::default()
    };
    let ok = |action: &str| ActionStatus {
        action: action.into(),
        succ: true,
        ..Default::default()
    };
    let Some((sup, path)) = settings
        .supervisor
        .clone()
        .and_then(|s| s.config_path.clone().map(|p| (s, p)))
    else {
        let why = "this edgecore does not run from its configuration file under its binary: it cannot apply a configuration update".to_string();
        return report(hub, task, fail("Check", why)).await;
    };
    let spec: serde_json::Value = match &msg.content {
        serde_json::Value::String(s) => serde_json::from_str(s).unwrap_or_default(),
        v => v.clone(),
    };
    let fields: BTreeMap<String, String> =
        match serde_json::from_value(spec["updateFields"].clone()) {
            Ok(f) => f,
            Err(e) => {
                return report(hub, task, fail("Check", format!("bad updateFields: {e}"))).await;
            }
        };
    let current = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            let why = format!("cannot read {}: {e}", path.display());
            return report(hub, task, fail("Check", why)).await;
        }
    };
    let new = match config_update::apply_fields(&current, &fields) {
        Ok(n) => n,
        Err(e) => return report(hub, task, fail("Check", e)).await,
    };
    report(hub, task, ok("Check")).await;
    if let Err(e) = std::fs::write(config_update::backup_path(&path), &current) {
        let why = format!("cannot copy the configuration aside: {e}");
        return report(hub, task, fail("BackUp", why)).await;
    }
    report(hub, task, ok("BackUp")).await;
    // The new configuration has half the job's time-out to reach the cloud (10 s – 5 min).
    let rollback_after = spec["timeoutSeconds"]
        .as_u64()
        .map(|t| (t / 2).clamp(10, 300))
        .unwrap_or(60);
    let marker = config_update::Marker {
        resource: task.to_string(),
        phase: "updating".into(),
        started: unix_now(),
        rollback_after,
        reason: String::new(),
    };
    let written = config_update::write_marker(&path, &marker)
        .and_then(|()| config_update::write_atomic(&path, new.as_bytes()));
    if let Err(e) = written {
        let _ = config_update::restore(&path);
        config_update::finish(&path);
        let why = format!("cannot write the configuration: {e}");
        return report(hub, task, fail("Update", why)).await;
    }
    tracing::warn!(task = %task, fields = fields.len(), "configuration updated by a ConfigUpdateJob; restarting");
    sup.request_restart();
}

/// After a restart with a ConfigUpdateJob in progress: the new configuration reached the
/// cloud (`Update` succeeded) or, past its time, the copy goes back and edgecore restarts
/// again; once that one is connected it reports `RollBack`.
async fn resume_config_update(
    sup: Arc<Supervisor>,
    path: PathBuf,
    mut marker: config_update::Marker,
    hub: EdgeHub,
) {
    let Some(task) = TaskResource::parse(&marker.resource) else {
        config_update::finish(&path);
        return;
    };
    if marker.phase == "updating" {
        let deadline = marker.started + marker.rollback_after;
        while !hub.is_connected() && unix_now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if hub.is_connected() {
            config_update::finish(&path);
            tracing::info!(task = %task, "updated configuration reached the cloud");
            let status = ActionStatus {
                action: "Update".into(),
                succ: true,
                ..Default::default()
            };
            return report(&hub, &task, status).await;
        }
        marker.phase = "rolledBack".into();
        marker.reason = format!(
            "the updated configuration did not reach the cloud within {} s; the previous configuration is back",
            marker.rollback_after
        );
        tracing::warn!(task = %task, "{}", marker.reason);
        if let Err(e) =
            config_update::restore(&path).and_then(|()| config_update::write_marker(&path, &marker))
        {
            tracing::error!(task = %task, error = %e, "cannot put the previous configuration back");
            return;
        }
        sup.request_restart();
        return;
    }
    config_update::finish(&path);
    let status = ActionStatus {
        action: "RollBack".into(),
        succ: true,
        reason: marker.reason.clone(),
        ..Default::default()
    };
    report(&hub, &task, status).await;
}

/// Sends an action's status (stamped now), waiting for the link for up to ten minutes.
async fn report(hub: &EdgeHub, task: &TaskResource, mut status: ActionStatus) {
    status.finish_time = crate::edged::time::rfc3339(SystemTime::now());
    let content = serde_json::to_value(&status).unwrap_or_default();
    for _ in 0..REPORT_TRIES {
        let msg = Message::new(
            source::EDGEHUB,
            Group::Hub,
            Operation::from(UPDATE_NODE_ACTION_STATUS),
            task.to_string(),
            content.clone(),
        );
        match hub.send(msg).await {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(task = %task, error = %e, "node task report not sent; retrying");
                tokio::time::sleep(REPORT_RETRY).await;
            }
        }
    }
    tracing::warn!(task = %task, action = %status.action, "node task report dropped: the cloud stayed unreachable");
}
