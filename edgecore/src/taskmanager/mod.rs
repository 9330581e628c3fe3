//! taskmanager: KubeEdge's node tasks at the edge (`modules.taskManager`, off by default as in
//! KubeEdge). The cloud sends a job's spec to this node (group `taskmanager`, see
//! `kubeedge_shared::nodetask`); each action is reported to the cloud as
//! `UpdateNodeActionStatus`. ImagePrePullJob runs here (`prepull.rs`, checks in `checks.rs`),
//! ConfigUpdateJob as typed edits of `edgecore.yaml` with a restart and a roll-back
//! (`config_update.rs`), and NodeUpgradeJob as a new binary taken from an image, swapped in
//! and re-executed, rolled back when it does not reach the cloud (`upgrade.rs`, `registry.rs`);
//! both need the binary's [`Supervisor`].
//!
//! Nothing from a job reaches a shell or a command line: images go to CRI as typed requests,
//! upgrade images are read from the registry by this process.

pub(crate) mod checks;
pub(crate) mod config_update;
pub(crate) mod prepull;
pub(crate) mod registry;
pub(crate) mod upgrade;

pub use config_update::marker_path as config_update_marker;
pub use upgrade::{
    on_start as count_upgrade_start, roll_back_after_failed_start as roll_back_failed_upgrade,
};

use crate::edgehub::EdgeHub;
use crate::metamanager::MetaClient;
use kubeedge_edged::cri::CriClient;
use kubeedge_edged::cri::runtime::Runtime;
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
pub(crate) struct TaskSettings {
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
    /// The running binary's path, taken at start (a node upgrade replaces the file there).
    pub exe: Option<PathBuf>,
    pub restart: tokio::sync::Notify,
    /// One configuration update at a time, up to its restart.
    pub updating: tokio::sync::Mutex<()>,
}

impl Supervisor {
    pub fn request_restart(&self) {
        self.restart.notify_one();
    }
}

/// Reports waiting for the link are tried this often, this many times.
const REPORT_RETRY: Duration = Duration::from_secs(5);
const REPORT_TRIES: u32 = 120;

/// What the MetaServer calls on `POST /api/v1/taskupgrade/confirm-upgrade`.
pub(crate) type ConfirmUpgrade = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The confirmation hook for the MetaServer and its receiving end for [`spawn`]: `Err` at once
/// when no upgrade waits (KubeEdge's 400 message).
pub(crate) fn confirmations(
    supervisor: &Supervisor,
) -> Option<(ConfirmUpgrade, mpsc::Receiver<()>)> {
    let paths = upgrade::Paths {
        exe: supervisor.exe.clone()?,
        config: supervisor.config_path.clone()?,
    };
    let (tx, rx) = mpsc::channel(1);
    let hook: ConfirmUpgrade = Arc::new(move || {
        if upgrade::read_pending(&paths).is_none() {
            return Err("there are no valid upgrade tasks to execute".into());
        }
        // One confirmation in flight is enough; a second one while it runs is the same.
        let _ = tx.try_send(());
        Ok(())
    });
    Some((hook, rx))
}

/// Runs the task manager on `rx` (messages of group `taskmanager`) until it closes; upgrade
/// confirmations arrive on `confirms`.
pub(crate) fn spawn(
    settings: TaskSettings,
    mut rx: mpsc::Receiver<Message>,
    mut confirms: Option<mpsc::Receiver<()>>,
    hub: EdgeHub,
    client: MetaClient,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let running: Arc<Mutex<HashSet<String>>> = Arc::default();
        loop {
            let confirmed = async {
                match confirms.as_mut() {
                    Some(c) => c.recv().await,
                    None => std::future::pending().await,
                }
            };
            let msg = tokio::select! {
                m = rx.recv() => match m { Some(m) => m, None => return },
                c = confirmed => {
                    if c.is_none() {
                        confirms = None;
                    } else {
                        let (settings, hub) = (settings.clone(), hub.clone());
                        tokio::spawn(async move {
                            if let Err(e) = upgrade::run_confirmed(&settings, &hub).await {
                                tracing::warn!(error = %e, "upgrade confirmation not applied");
                            }
                        });
                    }
                    continue;
                }
            };
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
        JobKind::NodeUpgrade => upgrade::run_job(settings, hub, task, &msg.content).await,
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
    let attempts = template.retry_times.clamp(0, 10) as u32 + 1;
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
    // Held up to the restart: a second update waits, then finds the first one's marker.
    let _one_at_a_time = sup.updating.lock().await;
    if let Some(why) = upgrade::busy(&path) {
        return report(hub, task, fail("Check", why)).await;
    }
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
    if !send_report(hub, task, ok("Check")).await {
        return;
    }
    if let Err(e) =
        config_update::write_atomic(&config_update::backup_path(&path), current.as_bytes())
    {
        let why = format!("cannot copy the configuration aside: {e}");
        return report(hub, task, fail("BackUp", why)).await;
    }
    if !send_report(hub, task, ok("BackUp")).await {
        config_update::finish(&path);
        return;
    }
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
        digest: config_update::digest(new.as_bytes()),
    };
    // The new file is staged first, the marker written, then the file put in place: a crash
    // before the rename leaves the old file and a marker whose update never happened, which
    // the next start recognises (the file is not the new one) and rolls back.
    let written = config_update::stage(&path, new.as_bytes()).and_then(|staged| {
        config_update::write_marker(&path, &marker)?;
        config_update::commit(&staged, &path)
    });
    if let Err(e) = written {
        let _ = config_update::restore(&path);
        config_update::finish(&path);
        let why = format!("cannot write the configuration: {e}");
        report(hub, task, fail("Update", why.clone())).await;
        let back = ActionStatus {
            action: "RollBack".into(),
            succ: true,
            reason: why,
            ..Default::default()
        };
        report(hub, task, back).await;
        return;
    }
    tracing::warn!(task = %task, fields = fields.len(), "configuration updated by a ConfigUpdateJob; restarting");
    sup.request_restart();
}

/// edgecore could not start with what a node task put in place (configuration or binary):
/// the previous one is back and the caller restarts. `true` when something was rolled back.
pub fn roll_back_after_failed_start(config: &std::path::Path) -> bool {
    config_update::roll_back_after_failed_start(config)
        || upgrade::roll_back_after_failed_start(config)
}

/// Finishes a configuration update or an upgrade a previous run started (whether or not the
/// task manager is enabled now).
pub(crate) fn resume_pending(supervisor: Option<&Arc<Supervisor>>, hub: &EdgeHub) {
    if let Some(sup) = supervisor {
        upgrade::resume(sup, hub);
    }
    if let Some(sup) = supervisor
        && let Some(path) = sup.config_path.clone()
        && let Some(marker) = config_update::read_marker(&path)
    {
        tokio::spawn(resume_config_update(sup.clone(), path, marker, hub.clone()));
    }
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
        let in_place = std::fs::read(&path)
            .map(|d| config_update::digest(&d) == marker.digest)
            .unwrap_or(false);
        if !in_place {
            // Stopped before the new file was put in place: nothing changed.
            marker.phase = "rolledBack".into();
            marker.reason =
                "edgecore stopped before the updated configuration was in place; nothing changed"
                    .into();
        }
    }
    if marker.phase == "updating" {
        // At least the whole window from this start (a power loss right after the update
        // does not count against the new configuration).
        let deadline =
            (marker.started + marker.rollback_after).max(unix_now() + marker.rollback_after);
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

/// [`send_report`], whatever comes of it.
async fn report(hub: &EdgeHub, task: &TaskResource, status: ActionStatus) {
    send_report(hub, task, status).await;
}

/// Sends an action's status (stamped now), waiting for the link for up to ten minutes;
/// `false` when it could not be sent.
async fn send_report(hub: &EdgeHub, task: &TaskResource, mut status: ActionStatus) -> bool {
    status.finish_time = kubeedge_shared::clock::rfc3339(SystemTime::now());
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
            Ok(()) => return true,
            Err(e) => {
                tracing::debug!(task = %task, error = %e, "node task report not sent; retrying");
                tokio::time::sleep(REPORT_RETRY).await;
            }
        }
    }
    tracing::warn!(task = %task, action = %status.action, "node task report dropped: the cloud stayed unreachable");
    false
}
