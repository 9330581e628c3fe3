//! taskmanager: KubeEdge's node tasks at the edge (`modules.taskManager`, off by default as in
//! KubeEdge). The cloud sends a job's spec to this node (group `taskmanager`, see
//! `kubeedge_shared::nodetask`); each action is reported to the cloud as
//! `UpdateNodeActionStatus`. ImagePrePullJob runs here (`prepull.rs`, checks in `checks.rs`).
//! NodeUpgradeJob and ConfigUpdateJob are answered with a failure saying so: this edgecore is
//! upgraded and configured by its package, never by commands built from job fields.
//!
//! Nothing from a job reaches a shell or a command line: images go to CRI as typed requests.

pub mod checks;
pub mod prepull;

use crate::cri::CriClient;
use crate::cri::runtime::Runtime;
use crate::edgehub::EdgeHub;
use crate::metamanager::MetaClient;
use kubeedge_shared::nodetask::{ActionStatus, JobKind, TaskResource, UPDATE_NODE_ACTION_STATUS};
use kubeedge_shared::operation::source;
use kubeedge_shared::{Group, Message, Operation};
use std::collections::HashSet;
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
        JobKind::NodeUpgrade | JobKind::ConfigUpdate => {
            let action = msg.route.operation.to_string();
            tracing::warn!(task = %task, "node upgrade/config update jobs are not run by this edgecore");
            report(
                hub,
                task,
                ActionStatus {
                    action,
                    succ: false,
                    reason: format!(
                        "{} is not supported by kubeedge-rs edgecore: upgrade or reconfigure it with its package (no job field is ever run as a command)",
                        task.kind.resource_type()
                    ),
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
