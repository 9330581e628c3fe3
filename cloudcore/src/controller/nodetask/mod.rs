//! Node tasks in the cloud (`operations.kubeedge.io/v1alpha2`, KubeEdge's taskmanager plus the
//! node-task part of its controller-manager): ImagePrePullJobs, NodeUpgradeJobs and
//! ConfigUpdateJobs. A job's
//! nodes are chosen
//! (`nodeNames` or `labelSelector`; ready edge nodes only), its spec is sent to at most
//! `concurrency` of them at a time — those connected to this replica; another replica sends to
//! its own — the edges' action reports fill each node's status, a node past `timeoutSeconds`
//! becomes `Unknown`, and the job ends `Completed` or `Failure` by `failureTolerate`.
//!
//! Off unless `modules.taskManager.enable` (KubeEdge's key; off by default there too). Status
//! writes are merge patches of `/status` carrying the resourceVersion they were computed from,
//! so replicas never overwrite each other's results (a conflict is read again and redone).

pub(crate) mod status;

use crate::cloudhub::HubSink;
use crate::controller::kind::Kind;
use futures_util::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kubeedge_shared::nodetask::{ActionStatus, JobKind, TASK_MANAGER, TaskResource};
use kubeedge_shared::{Group, Message, Operation};
use serde_json::{Value, json};
use status::Selection;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How often running jobs are looked at (sends, time-outs).
const TICK: Duration = Duration::from_secs(2);

fn resource_of(kind: JobKind) -> Option<ApiResource> {
    match kind {
        JobKind::ImagePrePull => Some(Kind::ImagePrePullJob.api_resource()),
        JobKind::ConfigUpdate => Some(Kind::ConfigUpdateJob.api_resource()),
        JobKind::NodeUpgrade => Some(Kind::NodeUpgradeJob.api_resource()),
    }
}

/// The job kinds this cloud runs.
const KINDS: [JobKind; 3] = [
    JobKind::ImagePrePull,
    JobKind::NodeUpgrade,
    JobKind::ConfigUpdate,
];

type JobKey = (JobKind, String);

enum Input {
    Applied(JobKind, Value),
    Deleted(JobKey),
    Report { node: String, message: Box<Message> },
}

/// Where the edges' task reports go.
#[derive(Clone)]
pub struct NodeTaskHandle {
    tx: mpsc::Sender<Input>,
}

impl NodeTaskHandle {
    /// Hands over an edge's report; dropped (with a warning) when the controller is behind,
    /// so that no edge's upstream traffic waits on node tasks.
    pub async fn report(&self, node: String, message: Message) {
        let report = Input::Report {
            node,
            message: Box::new(message),
        };
        if self.tx.try_send(report).is_err() {
            tracing::warn!("node task controller busy; a node task report was dropped");
        }
    }
}

pub fn spawn(
    client: kube::Client,
    hub: Arc<dyn HubSink>,
    shutdown: CancellationToken,
) -> (NodeTaskHandle, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(256);
    let mut apis = HashMap::new();
    for kind in KINDS {
        if let Some(ar) = resource_of(kind) {
            let w = watch(
                client.clone(),
                kind,
                ar.clone(),
                tx.clone(),
                shutdown.clone(),
            );
            tokio::spawn(w);
            apis.insert(kind, Api::all_with(client.clone(), &ar));
        }
    }
    let actor = Actor {
        apis,
        nodes: Api::all(client),
        hub,
        known: HashMap::new(),
        heard: HashMap::new(),
    };
    let task = tokio::spawn(actor.run(rx, shutdown));
    (NodeTaskHandle { tx }, task)
}

async fn watch(
    client: kube::Client,
    kind: JobKind,
    ar: ApiResource,
    tx: mpsc::Sender<Input>,
    shutdown: CancellationToken,
) {
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut warned = false;
    loop {
        let ev = tokio::select! {
            _ = shutdown.cancelled() => return,
            ev = stream.next() => match ev { Some(ev) => ev, None => return },
        };
        let input = match ev {
            Ok(Event::Apply(o) | Event::InitApply(o)) => {
                Input::Applied(kind, serde_json::to_value(o).unwrap_or_default())
            }
            Ok(Event::Delete(o)) => Input::Deleted((kind, o.metadata.name.unwrap_or_default())),
            Ok(_) => continue,
            Err(e) => {
                if !warned {
                    tracing::warn!(resource = %ar.plural, error = %e, "cannot watch node tasks; they wait for the CRD (manifests/crds/operations-crds.yaml)");
                    warned = true;
                }
                continue;
            }
        };
        warned = false;
        if tx.send(input).await.is_err() {
            return;
        }
    }
}

struct Actor {
    apis: HashMap<JobKind, Api<DynamicObject>>,
    nodes: Api<k8s_openapi::api::core::v1::Node>,
    hub: Arc<dyn HubSink>,
    /// Jobs not finished (the latest object seen).
    known: HashMap<JobKey, Value>,
    /// When this replica last heard of a node's task (sent, or a report), by its own clock.
    heard: HashMap<(JobKey, String), std::time::Instant>,
}

/// A node without news for this long is `Unknown` when the job sets no `timeoutSeconds`.
const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// Most steps kept in a node's `actionFlow` (a misbehaving edge cannot grow the job).
const MAX_FLOW: usize = 16;
/// Largest `extend` accepted (image results).
const MAX_EXTEND: usize = 64 * 1024;

fn rv_of(job: &Value) -> u64 {
    job["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

impl Actor {
    async fn run(mut self, mut rx: mpsc::Receiver<Input>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                i = rx.recv() => match i {
                    None => return,
                    Some(Input::Applied(kind, job)) => {
                        let key = (kind, job["metadata"]["name"].as_str().unwrap_or_default().to_string());
                        let phase = job["status"]["phase"].as_str().unwrap_or_default();
                        if matches!(phase, status::COMPLETED | status::FAILURE) {
                            self.forget(&key);
                        } else if self.known.get(&key).is_none_or(|old| rv_of(old) <= rv_of(&job)) {
                            // (An event older than our own last write does not replace it.)
                            self.known.insert(key.clone(), job);
                            self.reconcile(&key).await;
                        }
                    }
                    Some(Input::Deleted(key)) => self.forget(&key),
                    Some(Input::Report { node, message }) => self.report(&node, &message).await,
                },
                _ = tick.tick() => {
                    let keys: Vec<JobKey> = self.known.keys().cloned().collect();
                    for key in keys {
                        self.reconcile(&key).await;
                    }
                }
            }
        }
    }

    fn forget(&mut self, key: &JobKey) {
        self.known.remove(key);
        self.heard.retain(|(k, _), _| k != key);
    }

    /// Reads the job, changes its status with `change` (`false`: nothing to write) and writes
    /// it with the resourceVersion read; a conflict is read and done again. With `probe`,
    /// `change` is first tried on the copy last seen and nothing is read when it changes
    /// nothing there (a periodic look costs no request). The job as written, if it was.
    async fn update<F>(&mut self, key: &JobKey, probe: bool, mut change: F) -> Option<Value>
    where
        F: FnMut(&Value, &mut Value) -> bool,
    {
        let api = self.apis.get(&key.0).cloned()?;
        if probe && let Some(cached) = self.known.get(key) {
            let mut st = cached.get("status").cloned().unwrap_or_else(|| json!({}));
            if !change(cached, &mut st) {
                return None;
            }
        }
        let name = key.1.as_str();
        for _ in 0..5 {
            let job = match api.get_opt(name).await {
                Ok(Some(j)) => serde_json::to_value(j).unwrap_or_default(),
                Ok(None) => {
                    self.forget(key);
                    return None;
                }
                Err(e) => {
                    tracing::debug!(job = name, error = %e, "cannot read the node task; later");
                    return None;
                }
            };
            let mut st = job.get("status").cloned().unwrap_or_else(|| json!({}));
            if !change(&job, &mut st) {
                self.known.insert(key.clone(), job);
                return None;
            }
            let rv = job["metadata"]["resourceVersion"].clone();
            let patch = json!({"metadata": {"resourceVersion": rv}, "status": st});
            match api
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(o) => {
                    let v = serde_json::to_value(o).unwrap_or_default();
                    let phase = v["status"]["phase"].as_str().unwrap_or_default();
                    if matches!(phase, status::COMPLETED | status::FAILURE) {
                        tracing::info!(
                            job = name,
                            kind = key.0.resource_type(),
                            phase,
                            "node task finished"
                        );
                        self.forget(key);
                    } else {
                        self.known.insert(key.clone(), v.clone());
                    }
                    return Some(v);
                }
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => {
                    tracing::warn!(job = name, error = %e, "cannot write the node task's status; retried");
                    return None;
                }
            }
        }
        None
    }

    async fn reconcile(&mut self, key: &JobKey) {
        let Some(job) = self.known.get(key).cloned() else {
            return;
        };
        let kind = key.0;
        if job["status"]["phase"]
            .as_str()
            .unwrap_or_default()
            .is_empty()
        {
            let initial = self.initial_status(kind, &job).await;
            self.update(key, false, |j, st| {
                if !j["status"]["phase"].as_str().unwrap_or_default().is_empty() {
                    return false; // another replica started it
                }
                *st = initial.clone();
                true
            })
            .await;
            return;
        }
        let t = status::template(kind, &job);
        let concurrency = t["concurrency"].as_i64().unwrap_or(1).max(1) as usize;
        let timeout = match t["timeoutSeconds"].as_u64() {
            Some(t) if t > 0 => t,
            _ => DEFAULT_TIMEOUT_SECS,
        };
        let created = job["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let hub = self.hub.clone();
        let heard: HashMap<String, u64> = self
            .heard
            .iter()
            .filter(|((k, _), _)| k == key)
            .map(|((_, n), at)| (n.clone(), at.elapsed().as_secs()))
            .collect();
        // Nodes to send to once their InProgress is written (never before: a failed write
        // would leave them Pending and they would be sent the task again).
        let mut to_send: BTreeSet<String> = BTreeSet::new();
        let written = self
            .update(key, true, |j, st| {
                to_send.clear();
                let tolerate = status::template(kind, j)["failureTolerate"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let mut changed = false;
                let now = chrono_now();
                let in_flight = st["nodeStatus"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|n| n["phase"] == status::IN_PROGRESS)
                    .count();
                let mut room = concurrency.saturating_sub(in_flight);
                for n in st["nodeStatus"].as_array_mut().into_iter().flatten() {
                    let node = n["nodeName"].as_str().unwrap_or_default().to_string();
                    let phase = n["phase"].as_str().unwrap_or_default().to_string();
                    if phase == status::PENDING && room > 0 && hub.is_connected(&node) {
                        n["phase"] = status::IN_PROGRESS.into();
                        n["actionFlow"] = json!([]);
                        to_send.insert(node);
                        room -= 1;
                        changed = true;
                        continue;
                    }
                    // Silence: for nodes in progress since this replica last heard of them
                    // (or, not heard of here, since their last step or the job's creation).
                    let silent = match (phase.as_str(), heard.get(&node)) {
                        (status::IN_PROGRESS, Some(secs)) => Some(*secs as i64),
                        (p, _) if !status::node_done(p) => {
                            let last = n["actionFlow"]
                                .as_array()
                                .and_then(|f| f.last())
                                .and_then(|s| s["time"].as_str())
                                .filter(|t| !t.is_empty())
                                .unwrap_or(&created)
                                .to_string();
                            seconds_between(&last, &now)
                        }
                        _ => None,
                    };
                    if silent.is_some_and(|s| s > timeout as i64) {
                        n["phase"] = status::UNKNOWN.into();
                        n["reason"] = "The node task has timed out".into();
                        changed = true;
                    }
                }
                let (phase, reason) = status::job_phase(st, &tolerate);
                if st["phase"] != phase {
                    st["phase"] = phase.into();
                    changed = true;
                }
                if let Some(r) = reason
                    && st["reason"] != r.as_str()
                {
                    st["reason"] = r.into();
                    changed = true;
                }
                changed
            })
            .await;
        let Some(written) = written else {
            return;
        };
        let mut spec = written["spec"].clone();
        if kind == JobKind::NodeUpgrade
            && let Some(getter) = spec
                .get_mut("imageDigestGatter")
                .and_then(Value::as_object_mut)
        {
            // The registry token is the cloud's (to look digests up); no edge needs it.
            getter.remove("registryAPI");
        }
        for node in to_send {
            let resource = TaskResource {
                kind,
                job: key.1.clone(),
                node: node.clone(),
            };
            let msg = Message::new(
                TASK_MANAGER,
                Group::TaskManager,
                Operation::from("Check"),
                resource.to_string(),
                spec.clone(),
            );
            match self.hub.send(&node, msg) {
                Ok(_) => {
                    self.heard
                        .insert((key.clone(), node), std::time::Instant::now());
                }
                Err(e) => {
                    // Not sent: it times out as a node that never answered.
                    tracing::warn!(job = %key.1, node, error = %e, "node task not sent");
                }
            }
        }
    }

    /// The job's nodes and the first phase of each (`Init`), or `Failure` with why.
    async fn initial_status(&self, kind: JobKind, job: &Value) -> Value {
        let nodes: Vec<Value> = match status::selection(kind, job) {
            Err(reason) => return json!({"phase": status::FAILURE, "reason": reason}),
            Ok(Selection::Names(names)) => {
                let mut out = Vec::new();
                for n in names {
                    out.push(match self.nodes.get_opt(&n).await {
                        Ok(Some(node)) => {
                            let v = serde_json::to_value(node).unwrap_or_default();
                            status::node_entry(&n, status::refusal(&v))
                        }
                        Ok(None) => status::node_entry(
                            &n,
                            Some("failed to get node, err: not found".into()),
                        ),
                        Err(e) => {
                            status::node_entry(&n, Some(format!("failed to get node, err: {e}")))
                        }
                    });
                }
                out
            }
            Ok(Selection::Selector(sel)) => {
                match self.nodes.list(&ListParams::default().labels(&sel)).await {
                    Ok(list) if list.items.is_empty() => {
                        return json!({"phase": status::FAILURE, "reason": "no nodes were matched with selector"});
                    }
                    Ok(list) => list
                        .items
                        .into_iter()
                        .map(|node| {
                            let v = serde_json::to_value(&node).unwrap_or_default();
                            let name = node.metadata.name.unwrap_or_default();
                            status::node_entry(&name, status::refusal(&v))
                        })
                        .collect(),
                    Err(e) => {
                        return json!({"phase": status::FAILURE, "reason": format!("cannot list nodes: {e}")});
                    }
                }
            }
        };
        json!({"phase": status::INIT, "nodeStatus": nodes})
    }

    async fn report(&mut self, node: &str, msg: &Message) {
        let Some(task) = TaskResource::parse(&msg.route.resource) else {
            tracing::warn!(node, resource = %msg.route.resource, "node task report for no task; dropped");
            return;
        };
        if task.node != node {
            tracing::warn!(node, resource = %msg.route.resource, "node task report for another node; dropped");
            return;
        }
        let key = (task.kind, task.job.clone());
        if !KINDS.contains(&task.kind) || !self.known.contains_key(&key) {
            tracing::info!(node, resource = %msg.route.resource, "report for a node task not running here; dropped");
            return;
        }
        let content = match &msg.content {
            Value::String(s) => serde_json::from_str(s).unwrap_or(Value::Null),
            v => v.clone(),
        };
        let Ok(mut report) = serde_json::from_value::<ActionStatus>(content) else {
            tracing::warn!(node, resource = %msg.route.resource, "malformed node task report; dropped");
            return;
        };
        if report.action.is_empty()
            || report.action.len() > 64
            || report.reason.len() > 4096
            || report.extend.len() > MAX_EXTEND
        {
            tracing::warn!(
                node,
                "node task report without an action or oversized; dropped"
            );
            return;
        }
        // The edge's clock is not trusted for time-outs; a time that does not parse is now.
        if report
            .finish_time
            .parse::<k8s_openapi::jiff::Timestamp>()
            .is_err()
        {
            report.finish_time = chrono_now();
        }
        self.heard
            .insert((key.clone(), node.to_string()), std::time::Instant::now());
        let kind = task.kind;
        self.update(&key, false, |j, st| {
            // Only nodes still at it take reports (a late one cannot reopen a result).
            let open = st["nodeStatus"]
                .as_array()
                .and_then(|a| a.iter().find(|n| n["nodeName"] == node))
                .is_some_and(|n| {
                    matches!(
                        n["phase"].as_str(),
                        Some(status::PENDING | status::IN_PROGRESS)
                    )
                });
            if !open || !status::apply_report(kind, st, node, &report) {
                return false;
            }
            status::cap_flow(st, node, MAX_FLOW);
            let tolerate = status::template(kind, j)["failureTolerate"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let (phase, reason) = status::job_phase(st, &tolerate);
            st["phase"] = phase.into();
            if let Some(r) = reason {
                st["reason"] = r.into();
            }
            true
        })
        .await;
    }
}

/// Now, RFC 3339 UTC (seconds).
fn chrono_now() -> String {
    crate::controller::now_rfc3339()
}

/// Seconds from RFC 3339 time `a` to `b`.
fn seconds_between(a: &str, b: &str) -> Option<i64> {
    let a: k8s_openapi::jiff::Timestamp = a.parse().ok()?;
    let b: k8s_openapi::jiff::Timestamp = b.parse().ok()?;
    Some(b.as_second() - a.as_second())
}
