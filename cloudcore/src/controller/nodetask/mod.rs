//! Node tasks in the cloud (`operations.kubeedge.io/v1alpha2`, KubeEdge's taskmanager plus the
//! node-task part of its controller-manager): ImagePrePullJobs and ConfigUpdateJobs. A job's
//! nodes are chosen
//! (`nodeNames` or `labelSelector`; ready edge nodes only), its spec is sent to at most
//! `concurrency` of them at a time — those connected to this replica; another replica sends to
//! its own — the edges' action reports fill each node's status, a node past `timeoutSeconds`
//! becomes `Unknown`, and the job ends `Completed` or `Failure` by `failureTolerate`.
//!
//! Off unless `modules.taskManager.enable` (KubeEdge's key; off by default there too). Status
//! writes are merge patches of `/status` carrying the resourceVersion they were computed from,
//! so replicas never overwrite each other's results (a conflict is read again and redone).

pub mod status;

use crate::controller::downstream::HubSink;
use futures_util::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kubeedge_shared::nodetask::{
    API_GROUP, ActionStatus, JobKind, TASK_MANAGER, TaskResource, UPDATE_NODE_ACTION_STATUS,
};
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

/// `operations.kubeedge.io/v1alpha2` `ImagePrePullJob` (cluster-scoped, status subresource).
pub fn image_prepull_resource() -> ApiResource {
    ApiResource {
        group: API_GROUP.into(),
        version: "v1alpha2".into(),
        api_version: kubeedge_shared::nodetask::API_VERSION.into(),
        kind: "ImagePrePullJob".into(),
        plural: "imageprepulljobs".into(),
    }
}

/// `operations.kubeedge.io/v1alpha2` `ConfigUpdateJob` (cluster-scoped, status subresource).
pub fn config_update_resource() -> ApiResource {
    ApiResource {
        kind: "ConfigUpdateJob".into(),
        plural: "configupdatejobs".into(),
        ..image_prepull_resource()
    }
}

fn resource_of(kind: JobKind) -> Option<ApiResource> {
    match kind {
        JobKind::ImagePrePull => Some(image_prepull_resource()),
        JobKind::ConfigUpdate => Some(config_update_resource()),
        JobKind::NodeUpgrade => None,
    }
}

/// The job kinds this cloud runs.
const KINDS: [JobKind; 2] = [JobKind::ImagePrePull, JobKind::ConfigUpdate];

/// Whether an upstream message is a node task report.
pub fn is_report(msg: &Message) -> bool {
    msg.route.operation.to_string() == UPDATE_NODE_ACTION_STATUS
}

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
    pub async fn report(&self, node: String, message: Message) {
        let _ = self
            .tx
            .send(Input::Report {
                node,
                message: Box::new(message),
            })
            .await;
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
                            self.known.remove(&key);
                        } else {
                            self.known.insert(key.clone(), job);
                            self.reconcile(&key).await;
                        }
                    }
                    Some(Input::Deleted(key)) => { self.known.remove(&key); }
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

    /// Reads the job, changes its status with `change` (`false`: nothing to write) and writes
    /// it with the resourceVersion read; a conflict is read and done again.
    async fn update<F>(&mut self, key: &JobKey, change: F)
    where
        F: FnMut(&Value, &mut Value) -> bool,
    {
        self.update_if(key, false, change).await
    }

    /// [`Self::update`]; with `probe`, first tried on the copy last seen, and nothing is read
    /// when it changes nothing there (a periodic look at a job costs no request).
    async fn update_if<F>(&mut self, key: &JobKey, probe: bool, mut change: F)
    where
        F: FnMut(&Value, &mut Value) -> bool,
    {
        let Some(api) = self.apis.get(&key.0).cloned() else {
            return;
        };
        if probe && let Some(cached) = self.known.get(key) {
            let mut st = cached.get("status").cloned().unwrap_or_else(|| json!({}));
            if !change(cached, &mut st) {
                return;
            }
        }
        let name = key.1.as_str();
        for _ in 0..5 {
            let job = match api.get_opt(name).await {
                Ok(Some(j)) => serde_json::to_value(j).unwrap_or_default(),
                Ok(None) => {
                    self.known.remove(key);
                    return;
                }
                Err(e) => {
                    tracing::debug!(job = name, error = %e, "cannot read the node task; later");
                    return;
                }
            };
            let mut st = job.get("status").cloned().unwrap_or_else(|| json!({}));
            if !change(&job, &mut st) {
                self.known.insert(key.clone(), job);
                return;
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
                        self.known.remove(key);
                    } else {
                        self.known.insert(key.clone(), v);
                    }
                    return;
                }
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => {
                    tracing::warn!(job = name, error = %e, "cannot write the node task's status; retried");
                    return;
                }
            }
        }
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
            self.update(key, |j, st| {
                if !j["status"]["phase"].as_str().unwrap_or_default().is_empty() {
                    return false; // another replica started it
                }
                *st = initial.clone();
                true
            })
            .await;
            return;
        }
        // Which nodes to send to now (connected here, within the concurrency).
        let t = status::template(kind, &job);
        let concurrency = t["concurrency"].as_i64().unwrap_or(1).max(1) as usize;
        let timeout = t["timeoutSeconds"].as_u64().unwrap_or(0);
        let created = job["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let hub = self.hub.clone();
        let spec = job["spec"].clone();
        let mut sent: BTreeSet<String> = BTreeSet::new();
        self.update_if(key, true, |j, st| {
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
                    if !sent.contains(&node) {
                        let resource = TaskResource {
                            kind,
                            job: j["metadata"]["name"].as_str().unwrap_or_default().into(),
                            node: node.clone(),
                        };
                        let msg = Message::new(
                            TASK_MANAGER,
                            Group::TaskManager,
                            Operation::from("Check"),
                            resource.to_string(),
                            spec.clone(),
                        );
                        if hub.send(&node, msg).is_err() {
                            continue;
                        }
                        sent.insert(node.clone());
                    }
                    n["phase"] = status::IN_PROGRESS.into();
                    n["actionFlow"] = json!([]);
                    room -= 1;
                    changed = true;
                    continue;
                }
                if timeout > 0 && !status::node_done(&phase) {
                    let last = n["actionFlow"]
                        .as_array()
                        .and_then(|f| f.last())
                        .and_then(|s| s["time"].as_str())
                        .filter(|t| !t.is_empty())
                        .unwrap_or(&created)
                        .to_string();
                    if seconds_between(&last, &now).is_some_and(|s| s > timeout as i64) {
                        n["phase"] = status::UNKNOWN.into();
                        n["reason"] = "The node task has timed out".into();
                        changed = true;
                    }
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
        if !KINDS.contains(&task.kind) {
            tracing::info!(node, resource = %msg.route.resource, "report for a node task kind this cloud does not run; dropped");
            return;
        }
        let content = match &msg.content {
            Value::String(s) => serde_json::from_str(s).unwrap_or(Value::Null),
            v => v.clone(),
        };
        let Ok(report) = serde_json::from_value::<ActionStatus>(content) else {
            tracing::warn!(node, resource = %msg.route.resource, "malformed node task report; dropped");
            return;
        };
        if report.action.is_empty() || report.action.len() > 64 || report.reason.len() > 4096 {
            tracing::warn!(
                node,
                "node task report without an action or oversized; dropped"
            );
            return;
        }
        let mut report = report;
        if report.finish_time.is_empty() {
            report.finish_time = chrono_now();
        }
        let kind = task.kind;
        self.update(&(kind, task.job.clone()), |j, st| {
            if !status::apply_report(kind, st, node, &report) {
                return false;
            }
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
