//! The pod state machine, as pure functions of the pod spec and what the runtime holds:
//! [`plan`] decides the next runtime actions (the kubelet's `computePodActions`): sandbox
//! (re)creation, init containers one at a time, app containers per restart policy with
//! crash-loop back-off, restarts for changed specs and failed liveness probes, pruning of
//! old containers; [`phase`] derives the pod phase (the kubelet's `getPhase`). The pod worker
//! executes the actions; the state is a value that is logged on every transition.

use super::backoff::Backoff;
use super::containers::ContainerKind;
use super::spec::{Container, Pod, RestartPolicy};
use crate::cri::api::ContainerState;
use crate::cri::runtime::{ContainerInfo, PodRuntime};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::{Duration, SystemTime};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }

    pub fn parse(s: &str) -> Option<Phase> {
        Some(match s {
            "Pending" => Phase::Pending,
            "Running" => Phase::Running,
            "Succeeded" => Phase::Succeeded,
            "Failed" => Phase::Failed,
            _ => return None,
        })
    }
}

/// Where a pod is in its life on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// The spec cannot run here; the reason is in the status. Waits for a new spec.
    Unrunnable { message: String },
    /// No ready sandbox yet (or one is being created).
    CreatingSandbox,
    /// Init container `index` is running or about to.
    Initializing { index: usize },
    /// App containers are started (some may be waiting to restart).
    Running,
    /// Every container finished and none restarts.
    Finished(Phase),
    /// Deletion requested: containers are being stopped.
    Terminating,
    /// Containers stopped after a deletion; waiting for the API object to go.
    Terminated,
}

impl fmt::Display for PodState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PodState::Unrunnable { message } => write!(f, "Unrunnable({message})"),
            PodState::CreatingSandbox => f.write_str("CreatingSandbox"),
            PodState::Initializing { index } => write!(f, "Initializing({index})"),
            PodState::Running => f.write_str("Running"),
            PodState::Finished(p) => write!(f, "Finished({})", p.as_str()),
            PodState::Terminating => f.write_str("Terminating"),
            PodState::Terminated => f.write_str("Terminated"),
        }
    }
}

/// One runtime action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Stop every running container and every ready sandbox of the pod.
    KillPod,
    CreateSandbox {
        attempt: u32,
    },
    StartContainer {
        kind: ContainerKind,
        index: usize,
        attempt: u32,
        /// When restarting after a failure: when it ended (the back-off is charged).
        restart_after: Option<SystemTime>,
    },
    KillContainer {
        id: String,
        name: String,
        why: KillReason,
    },
    RemoveContainer {
        id: String,
    },
    RemoveSandbox {
        id: String,
    },
}

/// Why the plan stops a running container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// Its spec (the container's hash) changed: it is replaced.
    SpecChanged,
    /// Its liveness or startup probe failed.
    ProbeFailed,
    /// It was created but never ran: it is replaced.
    NotRunning,
}

impl KillReason {
    pub fn as_str(self) -> &'static str {
        match self {
            KillReason::SpecChanged => "its spec changed",
            KillReason::ProbeFailed => "its liveness probe failed",
            KillReason::NotRunning => "it was created but is not running",
        }
    }

    /// The message of the kubelet's `Killing` event for container `name`.
    pub fn event_message(self, name: &str) -> String {
        match self {
            KillReason::SpecChanged => {
                format!("Container {name} definition changed, will be restarted")
            }
            KillReason::ProbeFailed => {
                format!("Container {name} failed liveness probe, will be restarted")
            }
            KillReason::NotRunning => format!("Stopping container {name}"),
        }
    }
}

impl std::fmt::Display for KillReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kubelet's reasons for a waiting container (`state.waiting.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitingReason {
    ContainerCreating,
    PodInitializing,
    CrashLoopBackOff,
    CreateContainerConfigError,
    CreateContainerError,
    RunContainerError,
    PostStartHookError,
    ErrImagePull,
    ErrImageNeverPull,
    ImagePullBackOff,
}

impl WaitingReason {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitingReason::ContainerCreating => "ContainerCreating",
            WaitingReason::PodInitializing => "PodInitializing",
            WaitingReason::CrashLoopBackOff => "CrashLoopBackOff",
            WaitingReason::CreateContainerConfigError => "CreateContainerConfigError",
            WaitingReason::CreateContainerError => "CreateContainerError",
            WaitingReason::RunContainerError => "RunContainerError",
            WaitingReason::PostStartHookError => "PostStartHookError",
            WaitingReason::ErrImagePull => "ErrImagePull",
            WaitingReason::ErrImageNeverPull => "ErrImageNeverPull",
            WaitingReason::ImagePullBackOff => "ImagePullBackOff",
        }
    }
}

impl std::fmt::Display for WaitingReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a container is not running (shown as its `waiting` state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub reason: WaitingReason,
    pub message: String,
}

impl Waiting {
    pub fn new(reason: WaitingReason, message: impl Into<String>) -> Self {
        Waiting {
            reason,
            message: message.into(),
        }
    }
}

/// The outcome of planning one sync.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub state: PodState,
    pub actions: Vec<Action>,
    /// Containers held back by the crash-loop back-off.
    pub waiting: HashMap<String, Waiting>,
    /// When the earliest back-off ends.
    pub wake_after: Option<Duration>,
}

pub struct PlanInput<'a> {
    pub pod: &'a Pod,
    pub rt: &'a PodRuntime,
    pub backoff: &'a Backoff,
    pub now: SystemTime,
    /// The phase once the pod finished (kept: a finished pod never runs again).
    pub finished: Option<Phase>,
    /// Containers whose liveness (or startup) probe failed: restart them.
    pub unhealthy: &'a HashSet<String>,
    /// Exited containers kept per name.
    pub keep_exited: usize,
}

fn is_exited(c: &ContainerInfo) -> bool {
    c.state == ContainerState::ContainerExited
}

fn is_running(c: &ContainerInfo) -> bool {
    c.state == ContainerState::ContainerRunning
}

fn finished_at(c: &ContainerInfo) -> SystemTime {
    kubeedge_shared::clock::from_unix_nanos(c.finished_at)
        .or_else(|| kubeedge_shared::clock::from_unix_nanos(c.created_at))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// The back-off key of a container: its name and spec hash (a new spec starts over).
pub fn backoff_key(pod: &Pod, name: &str) -> String {
    format!("{name}_{}", pod.container_hash(name))
}

/// Containers of the newest sandbox, newest first.
pub fn current<'a>(rt: &'a PodRuntime, name: &str) -> Option<&'a ContainerInfo> {
    let sandbox = rt.latest_sandbox()?;
    rt.containers
        .iter()
        .find(|c| c.name == name && c.sandbox_id == sandbox.id)
}

fn next_attempt(rt: &PodRuntime, name: &str) -> u32 {
    rt.latest(name).map(|c| c.attempt + 1).unwrap_or(0)
}

pub fn should_restart(policy: RestartPolicy, exit_code: i32) -> bool {
    match policy {
        RestartPolicy::Always => true,
        RestartPolicy::OnFailure => exit_code != 0,
        RestartPolicy::Never => false,
    }
}

/// Whether every init container has completed (or app containers already ran, which means
/// they did).
pub fn initialized(pod: &Pod, rt: &PodRuntime) -> bool {
    let app_started = pod
        .spec
        .containers
        .iter()
        .any(|c| current(rt, &c.name).is_some());
    app_started
        || pod
            .spec
            .init_containers
            .iter()
            .all(|c| current(rt, &c.name).is_some_and(|i| is_exited(i) && i.exit_code == 0))
}

/// The pod phase from the containers of its newest sandbox (the kubelet's `getPhase`).
pub fn phase(pod: &Pod, rt: &PodRuntime) -> Phase {
    let policy = pod.spec.restart_policy();
    if !initialized(pod, rt) {
        let failed_init = pod
            .spec
            .init_containers
            .iter()
            .any(|c| current(rt, &c.name).is_some_and(|i| is_exited(i) && i.exit_code != 0));
        return if failed_init && policy == RestartPolicy::Never {
            Phase::Failed
        } else {
            Phase::Pending
        };
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for c in &pod.spec.containers {
        match current(rt, &c.name) {
            Some(info) if is_running(info) => running += 1,
            Some(info) if is_exited(info) => {
                stopped += 1;
                if info.exit_code == 0 {
                    succeeded += 1;
                }
            }
            // Created, unknown, or not there yet.
            Some(_) | None => {
                // A container that ran before in an older sandbox counts as restarting.
                if rt.all_named(&c.name).any(is_exited) {
                    stopped += 1;
                } else {
                    waiting += 1;
                }
            }
        }
    }
    if waiting > 0 {
        return Phase::Pending;
    }
    if running > 0 {
        return Phase::Running;
    }
    if stopped > 0 {
        return match policy {
            RestartPolicy::Always => Phase::Running,
            RestartPolicy::OnFailure if stopped == succeeded => Phase::Succeeded,
            RestartPolicy::OnFailure => Phase::Running,
            RestartPolicy::Never if stopped == succeeded => Phase::Succeeded,
            RestartPolicy::Never => Phase::Failed,
        };
    }
    Phase::Pending
}

/// The next actions for a pod that is not being deleted.
pub fn plan(input: &PlanInput<'_>) -> Decision {
    let pod = input.pod;
    let rt = input.rt;
    let policy = pod.spec.restart_policy();
    let mut d = Decision {
        state: PodState::Running,
        actions: Vec::new(),
        waiting: HashMap::new(),
        wake_after: None,
    };
    prune(input, &mut d.actions);

    if let Some(done) = input.finished {
        d.state = PodState::Finished(done);
        if rt.running().next().is_some() || rt.sandboxes.iter().any(|s| s.ready) {
            d.actions.push(Action::KillPod);
        }
        return d;
    }

    let sandbox_ready = rt.latest_sandbox().is_some_and(|s| s.ready);
    if !sandbox_ready {
        let ran_before = rt.latest_sandbox().is_some() && !rt.containers.is_empty();
        if policy == RestartPolicy::Never && ran_before {
            // The sandbox died under a pod that must not restart: its containers are done.
            let done = match phase(pod, rt) {
                Phase::Succeeded => Phase::Succeeded,
                _ => Phase::Failed,
            };
            d.state = PodState::Finished(done);
            d.actions.push(Action::KillPod);
            return d;
        }
        d.state = PodState::CreatingSandbox;
        // As the kubelet: every sandbox of the pod is stopped first, dead ones too. One that
        // died with the machine (a reboot) is NotReady with its network still allocated;
        // stopping it releases its IP and host ports.
        if rt.running().next().is_some() || !rt.sandboxes.is_empty() {
            d.actions.push(Action::KillPod);
        }
        let attempt = rt.latest_sandbox().map(|s| s.attempt + 1).unwrap_or(0);
        d.actions.push(Action::CreateSandbox { attempt });
        return d;
    }

    // Init containers, one at a time, in order.
    if !initialized(pod, rt) {
        for (index, c) in pod.spec.init_containers.iter().enumerate() {
            match current(rt, &c.name) {
                Some(info) if is_exited(info) && info.exit_code == 0 => continue,
                Some(info) if is_exited(info) => {
                    d.state = PodState::Initializing { index };
                    if policy == RestartPolicy::Never {
                        d.state = PodState::Finished(Phase::Failed);
                        return d;
                    }
                    restart_exited(input, c, ContainerKind::Init, index, info, &mut d);
                }
                Some(_) => d.state = PodState::Initializing { index },
                None => {
                    d.state = PodState::Initializing { index };
                    d.actions.push(Action::StartContainer {
                        kind: ContainerKind::Init,
                        index,
                        attempt: next_attempt(rt, &c.name),
                        restart_after: None,
                    });
                }
            }
            return d;
        }
    }

    for (index, c) in pod.spec.containers.iter().enumerate() {
        match current(rt, &c.name) {
            None => d.actions.push(Action::StartContainer {
                kind: ContainerKind::App,
                index,
                attempt: next_attempt(rt, &c.name),
                restart_after: None,
            }),
            Some(info) if is_running(info) => {
                let changed = !info.hash.is_empty() && info.hash != pod.container_hash(&c.name);
                if changed {
                    d.actions.push(Action::KillContainer {
                        id: info.id.clone(),
                        name: c.name.clone(),
                        why: KillReason::SpecChanged,
                    });
                    d.actions.push(Action::StartContainer {
                        kind: ContainerKind::App,
                        index,
                        attempt: info.attempt + 1,
                        restart_after: None,
                    });
                } else if input.unhealthy.contains(&info.id) {
                    d.actions.push(Action::KillContainer {
                        id: info.id.clone(),
                        name: c.name.clone(),
                        why: KillReason::ProbeFailed,
                    });
                }
            }
            Some(info) if is_exited(info) => {
                if should_restart(policy, info.exit_code) {
                    restart_exited(input, c, ContainerKind::App, index, info, &mut d);
                }
            }
            // Created but never started (or state unknown): replace it.
            Some(info) => {
                d.actions.push(Action::KillContainer {
                    id: info.id.clone(),
                    name: c.name.clone(),
                    why: KillReason::NotRunning,
                });
                d.actions.push(Action::StartContainer {
                    kind: ContainerKind::App,
                    index,
                    attempt: info.attempt + 1,
                    restart_after: None,
                });
            }
        }
    }
    let p = phase(pod, rt);
    if p.is_terminal() && d.actions.is_empty() {
        d.state = PodState::Finished(p);
        d.actions.push(Action::KillPod);
    }
    d
}

fn restart_exited(
    input: &PlanInput<'_>,
    c: &Container,
    kind: ContainerKind,
    index: usize,
    info: &ContainerInfo,
    d: &mut Decision,
) {
    let key = backoff_key(input.pod, &c.name);
    let ended = finished_at(info);
    match input.backoff.remaining(&key, ended, input.now) {
        Some(left) => {
            let delay = input.backoff.delay(&key).unwrap_or(left);
            d.waiting.insert(
                c.name.clone(),
                Waiting::new(
                    WaitingReason::CrashLoopBackOff,
                    format!(
                        "back-off {} restarting failed container={} pod={}_{}({})",
                        kubeedge_shared::duration::format_go_duration(delay),
                        c.name,
                        input.pod.metadata.name,
                        input.pod.metadata.namespace,
                        input.pod.metadata.uid
                    ),
                ),
            );
            d.wake_after = Some(d.wake_after.map_or(left, |w| w.min(left)));
        }
        None => d.actions.push(Action::StartContainer {
            kind,
            index,
            attempt: info.attempt + 1,
            restart_after: Some(ended),
        }),
    }
}

/// Old exited containers beyond `keep_exited` per name, containers no spec names any more,
/// and sandboxes left without containers (except the newest).
fn prune(input: &PlanInput<'_>, actions: &mut Vec<Action>) {
    let rt = input.rt;
    let names: HashSet<&str> = input
        .pod
        .spec
        .containers
        .iter()
        .chain(&input.pod.spec.init_containers)
        .map(|c| c.name.as_str())
        .collect();
    let mut kept: HashMap<&str, usize> = HashMap::new();
    let mut removed: HashSet<&str> = HashSet::new();
    for c in &rt.containers {
        if !is_exited(c) {
            continue;
        }
        let n = kept.entry(c.name.as_str()).or_insert(0);
        if names.contains(c.name.as_str()) && *n < input.keep_exited {
            *n += 1;
            continue;
        }
        removed.insert(c.id.as_str());
        actions.push(Action::RemoveContainer { id: c.id.clone() });
    }
    for s in rt.sandboxes.iter().skip(1) {
        let in_use = rt
            .containers
            .iter()
            .any(|c| c.sandbox_id == s.id && !removed.contains(c.id.as_str()));
        if !in_use {
            actions.push(Action::RemoveSandbox { id: s.id.clone() });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::runtime::SandboxInfo;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        Pod::from_value(&json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u-1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn sandbox(id: &str, ready: bool, created: i64) -> SandboxInfo {
        SandboxInfo {
            id: id.into(),
            attempt: 0,
            ready,
            created_at: created,
            ips: vec!["10.0.0.2".into()],
        }
    }

    fn container(
        pod: &Pod,
        name: &str,
        attempt: u32,
        state: ContainerState,
        exit: i32,
    ) -> ContainerInfo {
        ContainerInfo {
            id: format!("{name}-{attempt}"),
            sandbox_id: "s1".into(),
            name: name.into(),
            attempt,
            state,
            created_at: 1_000_000_000 + attempt as i64,
            started_at: 1_000_000_000,
            finished_at: if state == ContainerState::ContainerExited {
                2_000_000_000
            } else {
                0
            },
            exit_code: exit,
            reason: String::new(),
            message: String::new(),
            image: "busybox".into(),
            image_ref: "sha256:1".into(),
            hash: pod.container_hash(name).to_string(),
            init: false,
            log_path: String::new(),
        }
    }

    fn plan_for(pod: &Pod, rt: &PodRuntime, backoff: &Backoff, now_secs: u64) -> Decision {
        plan(&PlanInput {
            pod,
            rt,
            backoff,
            now: SystemTime::UNIX_EPOCH + Duration::from_secs(now_secs),
            finished: None,
            unhealthy: &HashSet::new(),
            keep_exited: 1,
        })
    }

    fn backoff() -> Backoff {
        Backoff::new(Duration::from_secs(10), Duration::from_secs(300))
    }

    #[test]
    fn a_new_pod_gets_a_sandbox_then_its_containers() {
        let p =
            pod(json!({"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "x"}]}));
        let d = plan_for(&p, &PodRuntime::default(), &backoff(), 10);
        assert_eq!(d.state, PodState::CreatingSandbox);
        assert_eq!(d.actions, [Action::CreateSandbox { attempt: 0 }]);
        assert_eq!(phase(&p, &PodRuntime::default()), Phase::Pending);

        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", true, 1)],
            containers: vec![],
        };
        let d = plan_for(&p, &rt, &backoff(), 10);
        assert_eq!(d.state, PodState::Running);
        assert_eq!(d.actions.len(), 2);
        assert!(matches!(
            d.actions[0],
            Action::StartContainer {
                kind: ContainerKind::App,
                index: 0,
                attempt: 0,
                restart_after: None
            }
        ));
    }

    #[test]
    fn an_adopted_running_pod_needs_nothing() {
        let p = pod(json!({"containers": [{"name": "a", "image": "x"}]}));
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", true, 1)],
            containers: vec![container(&p, "a", 4, ContainerState::ContainerRunning, 0)],
        };
        let d = plan_for(&p, &rt, &backoff(), 10);
        assert_eq!(d.actions, []);
        assert_eq!(phase(&p, &rt), Phase::Running);
    }

    #[test]
    fn crashing_containers_restart_with_back_off() {
        let p = pod(json!({"containers": [{"name": "a", "image": "x"}]}));
        let mut b = backoff();
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", true, 1)],
            containers: vec![container(&p, "a", 0, ContainerState::ContainerExited, 1)],
        };
        // First crash: restart at once.
        let d = plan_for(&p, &rt, &b, 3);
        assert!(matches!(
            d.actions[..],
            [Action::StartContainer {
                attempt: 1,
                restart_after: Some(_),
                ..
            }]
        ));
        assert_eq!(
            phase(&p, &rt),
            Phase::Running,
            "Always: a crash-looping pod is Running"
        );
        b.next(
            &backoff_key(&p, "a"),
            SystemTime::UNIX_EPOCH + Duration::from_secs(2),
            SystemTime::UNIX_EPOCH + Duration::from_secs(3),
        );
        // It crashes again at t=2: wait 10 s.
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", true, 1)],
            containers: vec![
                container(&p, "a", 1, ContainerState::ContainerExited, 1),
                container(&p, "a", 0, ContainerState::ContainerExited, 1),
            ],
        };
        let d = plan_for(&p, &rt, &b, 5);
        assert_eq!(d.actions, [Action::RemoveContainer { id: "a-0".into() }]);
        assert_eq!(d.waiting["a"].reason, WaitingReason::CrashLoopBackOff);
        assert!(
            d.waiting["a"]
                .message
                .starts_with("back-off 10s restarting failed container=a pod=web_ns(u-1)"),
            "{}",
            d.waiting["a"].message
        );
        assert_eq!(d.wake_after, Some(Duration::from_secs(7)));
        let d = plan_for(&p, &rt, &b, 13);
        assert!(matches!(
            d.actions[1],
            Action::StartContainer { attempt: 2, .. }
        ));
    }

    #[test]
    fn restart_policy_decides_what_restarts_and_the_phase() {
        for (policy, exit, restarts, expected) in [
            ("Never", 0, false, Phase::Succeeded),
            ("Never", 1, false, Phase::Failed),
            ("OnFailure", 0, false, Phase::Succeeded),
            ("OnFailure", 1, true, Phase::Running),
            ("Always", 0, true, Phase::Running),
        ] {
            let p =
                pod(json!({"restartPolicy": policy, "containers": [{"name": "a", "image": "x"}]}));
            let rt = PodRuntime {
                sandboxes: vec![sandbox("s1", true, 1)],
                containers: vec![container(&p, "a", 0, ContainerState::ContainerExited, exit)],
            };
            let d = plan_for(&p, &rt, &backoff(), 3);
            let started = d
                .actions
                .iter()
                .any(|a| matches!(a, Action::StartContainer { .. }));
            assert_eq!(started, restarts, "{policy} exit {exit}");
            assert_eq!(phase(&p, &rt), expected, "{policy} exit {exit}");
            if expected.is_terminal() {
                assert_eq!(d.state, PodState::Finished(expected));
                assert!(d.actions.contains(&Action::KillPod));
            }
        }
    }

    #[test]
    fn init_containers_run_in_order_before_app_containers() {
        let p = pod(
            json!({"initContainers": [{"name": "i1", "image": "x"}, {"name": "i2", "image": "x"}],
            "containers": [{"name": "a", "image": "x"}]}),
        );
        let mut rt = PodRuntime {
            sandboxes: vec![sandbox("s1", true, 1)],
            containers: vec![],
        };
        let d = plan_for(&p, &rt, &backoff(), 3);
        assert_eq!(d.state, PodState::Initializing { index: 0 });
        assert!(matches!(
            d.actions[..],
            [Action::StartContainer {
                kind: ContainerKind::Init,
                index: 0,
                ..
            }]
        ));
        rt.containers
            .push(container(&p, "i1", 0, ContainerState::ContainerRunning, 0));
        assert_eq!(plan_for(&p, &rt, &backoff(), 3).actions, []);
        rt.containers[0] = container(&p, "i1", 0, ContainerState::ContainerExited, 0);
        let d = plan_for(&p, &rt, &backoff(), 3);
        assert!(matches!(
            d.actions[..],
            [Action::StartContainer {
                kind: ContainerKind::Init,
                index: 1,
                ..
            }]
        ));
        assert_eq!(phase(&p, &rt), Phase::Pending);
        rt.containers.insert(
            0,
            container(&p, "i2", 0, ContainerState::ContainerExited, 0),
        );
        assert!(initialized(&p, &rt));
        let d = plan_for(&p, &rt, &backoff(), 3);
        assert!(matches!(
            d.actions[..],
            [Action::StartContainer {
                kind: ContainerKind::App,
                index: 0,
                ..
            }]
        ));

        // A failed init container fails a Never pod.
        let never = pod(
            json!({"restartPolicy": "Never", "initContainers": [{"name": "i1", "image": "x"}],
            "containers": [{"name": "a", "image": "x"}]}),
        );
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", true, 1)],
            containers: vec![container(
                &never,
                "i1",
                0,
                ContainerState::ContainerExited,
                2,
            )],
        };
        assert_eq!(phase(&never, &rt), Phase::Failed);
        assert_eq!(
            plan_for(&never, &rt, &backoff(), 3).state,
            PodState::Finished(Phase::Failed)
        );
    }

    #[test]
    fn sandboxes_dead_with_their_containers_are_stopped_before_a_new_one() {
        // After a reboot: nothing runs, the runtime still knows the old sandbox.
        let p = pod(json!({"containers": [{"name": "a", "image": "x"}]}));
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", false, 1)],
            containers: vec![container(&p, "a", 2, ContainerState::ContainerExited, 255)],
        };
        assert_eq!(
            plan_for(&p, &rt, &backoff(), 3).actions,
            [Action::KillPod, Action::CreateSandbox { attempt: 1 }]
        );
    }

    #[test]
    fn a_dead_sandbox_is_replaced_and_containers_restart_in_it() {
        let p = pod(json!({"containers": [{"name": "a", "image": "x"}]}));
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", false, 1)],
            containers: vec![container(&p, "a", 2, ContainerState::ContainerRunning, 0)],
        };
        let d = plan_for(&p, &rt, &backoff(), 3);
        assert_eq!(
            d.actions,
            [Action::KillPod, Action::CreateSandbox { attempt: 1 }]
        );
        let mut s2 = sandbox("s2", true, 5);
        s2.attempt = 1;
        let rt = PodRuntime {
            sandboxes: vec![s2, sandbox("s1", false, 1)],
            containers: vec![container(&p, "a", 2, ContainerState::ContainerExited, 137)],
        };
        let d = plan_for(&p, &rt, &backoff(), 3);
        assert!(
            matches!(
                d.actions[..],
                [Action::StartContainer {
                    attempt: 3,
                    restart_after: None,
                    ..
                }]
            ),
            "{:?}",
            d.actions
        );
    }

    #[test]
    fn changed_specs_and_failed_liveness_restart_running_containers() {
        let p = pod(json!({"containers": [{"name": "a", "image": "x"}]}));
        let mut c = container(&p, "a", 0, ContainerState::ContainerRunning, 0);
        c.hash = "old".into();
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", true, 1)],
            containers: vec![c],
        };
        let d = plan_for(&p, &rt, &backoff(), 3);
        assert!(matches!(
            &d.actions[..],
            [
                Action::KillContainer { .. },
                Action::StartContainer { attempt: 1, .. }
            ]
        ));

        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", true, 1)],
            containers: vec![container(&p, "a", 0, ContainerState::ContainerRunning, 0)],
        };
        let unhealthy = HashSet::from(["a-0".to_string()]);
        let d = plan(&PlanInput {
            pod: &p,
            rt: &rt,
            backoff: &backoff(),
            now: SystemTime::now(),
            finished: None,
            unhealthy: &unhealthy,
            keep_exited: 1,
        });
        assert!(matches!(
            &d.actions[..],
            [Action::KillContainer {
                why: KillReason::ProbeFailed,
                ..
            }]
        ));
    }

    #[test]
    fn a_finished_pod_never_runs_again() {
        let p = pod(json!({"restartPolicy": "Never", "containers": [{"name": "a", "image": "x"}]}));
        let d = plan(&PlanInput {
            pod: &p,
            rt: &PodRuntime::default(),
            backoff: &backoff(),
            now: SystemTime::now(),
            finished: Some(Phase::Succeeded),
            unhealthy: &HashSet::new(),
            keep_exited: 1,
        });
        assert_eq!(d.state, PodState::Finished(Phase::Succeeded));
        assert_eq!(d.actions, []);
    }
}
