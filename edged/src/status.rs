//! The pod status edged reports (the kubelet's `generateAPIPodStatus`): phase, conditions
//! with transition times carried over while unchanged, container statuses (state, last
//! state, restart count, image, image ID, `containerd://` IDs, ready/started), IPs and start
//! time. Built as JSON; patched only when it differs from what was last sent.

use super::lifecycle::{Phase, Waiting, WaitingReason, current, initialized};
use super::spec::{Container, Pod};
use crate::cri::api::ContainerState;
use crate::cri::runtime::{ContainerInfo, PodRuntime};
use kubeedge_shared::clock as time;
use serde_json::{Map, Value, json};
use std::collections::{HashMap, HashSet};

pub struct StatusInput<'a> {
    pub pod: &'a Pod,
    pub rt: &'a PodRuntime,
    pub phase: Phase,
    /// Why containers wait (back-off, pull or config errors), by container name.
    pub waiting: &'a HashMap<String, Waiting>,
    /// Readiness probe results by container ID (a container without a probe is ready).
    pub ready: &'a HashMap<String, bool>,
    /// Containers whose startup probe succeeded.
    pub started: &'a HashSet<String>,
    pub host_ip: &'a str,
    /// `containerd` (from the runtime's Version).
    pub runtime_name: &'a str,
    /// The status last sent (or stored): start time and transition times are kept.
    pub previous: &'a Value,
    pub now: &'a str,
    /// A pod-level reason and message (e.g. `DeadlineExceeded`).
    pub reason: Option<&'a str>,
    pub message: Option<&'a str>,
}

fn terminated(info: &ContainerInfo, runtime: &str) -> Value {
    let reason = if !info.reason.is_empty() {
        info.reason.clone()
    } else if info.exit_code == 0 {
        "Completed".into()
    } else {
        "Error".into()
    };
    let mut t = json!({
        "exitCode": info.exit_code,
        "reason": reason,
        "startedAt": time::from_unix_nanos(info.started_at).map(time::rfc3339),
        "finishedAt": time::from_unix_nanos(info.finished_at).map(time::rfc3339),
        "containerID": format!("{runtime}://{}", info.id),
    });
    if !info.message.is_empty() {
        t["message"] = json!(info.message);
    }
    json!({"terminated": t})
}

fn waiting(w: &Waiting) -> Value {
    let mut v = json!({"reason": w.reason.as_str()});
    if !w.message.is_empty() {
        v["message"] = json!(w.message);
    }
    json!({"waiting": v})
}

fn container_status(
    input: &StatusInput<'_>,
    c: &Container,
    default_waiting: WaitingReason,
    is_init: bool,
) -> (Value, bool) {
    let rt = input.rt;
    let runtime = input.runtime_name;
    let cur = current(rt, &c.name);
    let latest = rt.latest(&c.name);
    let note = input.waiting.get(&c.name);
    // The newest exited container other than `except`: the last termination.
    let last_exit = |except: Option<&str>| {
        rt.all_named(&c.name)
            .find(|i| i.state == ContainerState::ContainerExited && Some(i.id.as_str()) != except)
            .map(|i| terminated(i, runtime))
            .unwrap_or_else(|| json!({}))
    };
    let (state, last_state, running_id) = match cur {
        Some(i) if i.state == ContainerState::ContainerRunning => (
            json!({"running": {"startedAt": time::from_unix_nanos(i.started_at).map(time::rfc3339)}}),
            last_exit(Some(&i.id)),
            Some(i.id.as_str()),
        ),
        Some(i) if i.state == ContainerState::ContainerExited => match note {
            Some(w) => (waiting(w), terminated(i, runtime), None),
            None => (terminated(i, runtime), last_exit(Some(&i.id)), None),
        },
        Some(i) => (
            waiting(note.unwrap_or(&Waiting::new(WaitingReason::ContainerCreating, ""))),
            last_exit(Some(&i.id)),
            None,
        ),
        None => (
            waiting(note.unwrap_or(&Waiting::new(default_waiting, ""))),
            last_exit(None),
            None,
        ),
    };
    let ready = running_id.is_some_and(|id| {
        if is_init {
            false
        } else if c.readiness_probe.is_some() {
            input.ready.get(id).copied().unwrap_or(false)
        } else {
            true
        }
    });
    let started =
        running_id.is_some_and(|id| c.startup_probe.is_none() || input.started.contains(id));
    let mut s = json!({
        "name": c.name,
        "state": state,
        "lastState": last_state,
        "ready": ready,
        "restartCount": latest.map(|i| i.attempt).unwrap_or(0),
        "image": c.image(),
        "imageID": latest.map(|i| i.image_ref.clone()).unwrap_or_default(),
    });
    if let Some(i) = cur.or(latest) {
        s["containerID"] = json!(format!("{runtime}://{}", i.id));
    }
    if !is_init {
        s["started"] = json!(started);
    }
    (s, ready)
}

pub(super) fn condition(
    previous: &Value,
    now: &str,
    ty: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
) -> Value {
    let status = if ok { "True" } else { "False" };
    let since = previous["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == ty && c["status"] == status)
        .and_then(|c| c["lastTransitionTime"].as_str())
        .unwrap_or(now);
    let mut c = json!({
        "type": ty,
        "status": status,
        "lastProbeTime": null,
        "lastTransitionTime": since,
    });
    if let Some(r) = reason {
        c["reason"] = json!(r);
    }
    if let Some(m) = message {
        c["message"] = json!(m);
    }
    c
}

pub fn pod_status(input: &StatusInput<'_>) -> Value {
    let pod = input.pod;
    let inits_done = initialized(pod, input.rt);
    let mut init_statuses = Vec::new();
    let mut incomplete = Vec::new();
    for c in &pod.spec.init_containers {
        let (s, _) = container_status(input, c, WaitingReason::PodInitializing, true);
        let done = inits_done || s["state"]["terminated"]["exitCode"] == json!(0);
        if !done {
            incomplete.push(c.name.clone());
        }
        init_statuses.push(s);
    }
    let mut statuses = Vec::new();
    let mut unready = Vec::new();
    let app_default = if inits_done {
        WaitingReason::ContainerCreating
    } else {
        WaitingReason::PodInitializing
    };
    for c in &pod.spec.containers {
        let (s, ready) = container_status(input, c, app_default, false);
        if !ready {
            unready.push(c.name.clone());
        }
        statuses.push(s);
    }
    let prev = input.previous;
    let now = input.now;
    let sandbox = input.rt.latest_sandbox();
    let sandbox_ready = sandbox.is_some_and(|s| s.ready);
    let terminal = input.phase.is_terminal();
    let containers_ready = unready.is_empty();
    let list = |names: &[String]| format!("[{}]", names.join(" "));
    let (ready_reason, ready_message) = if terminal {
        (Some("PodCompleted"), None)
    } else if containers_ready {
        (None, None)
    } else {
        (
            Some("ContainersNotReady"),
            Some(format!(
                "containers with unready status: {}",
                list(&unready)
            )),
        )
    };
    let conditions = vec![
        condition(
            prev,
            now,
            "PodReadyToStartContainers",
            sandbox_ready,
            None,
            None,
        ),
        if incomplete.is_empty() {
            condition(
                prev,
                now,
                "Initialized",
                true,
                terminal
                    .then_some("PodCompleted")
                    .filter(|_| !pod.spec.init_containers.is_empty()),
                None,
            )
        } else {
            condition(
                prev,
                now,
                "Initialized",
                false,
                Some("ContainersNotInitialized"),
                Some(format!(
                    "containers with incomplete status: {}",
                    list(&incomplete)
                )),
            )
        },
        condition(
            prev,
            now,
            "Ready",
            containers_ready && !terminal,
            ready_reason,
            ready_message.clone(),
        ),
        condition(
            prev,
            now,
            "ContainersReady",
            containers_ready && !terminal,
            ready_reason,
            ready_message,
        ),
        condition(prev, now, "PodScheduled", true, None, None),
    ];
    let pod_ips: Vec<String> = if pod.spec.host_network {
        vec![input.host_ip.to_string()]
    } else {
        sandbox.map(|s| s.ips.clone()).unwrap_or_default()
    };
    let mut status = Map::new();
    status.insert("phase".into(), json!(input.phase.as_str()));
    status.insert("conditions".into(), json!(conditions));
    if !input.host_ip.is_empty() {
        status.insert("hostIP".into(), json!(input.host_ip));
        status.insert("hostIPs".into(), json!([{"ip": input.host_ip}]));
    }
    if let Some(ip) = pod_ips.first() {
        status.insert("podIP".into(), json!(ip));
        status.insert(
            "podIPs".into(),
            Value::Array(pod_ips.iter().map(|ip| json!({"ip": ip})).collect()),
        );
    }
    let start = prev["startTime"].as_str().unwrap_or(now);
    status.insert("startTime".into(), json!(start));
    if !init_statuses.is_empty() {
        status.insert("initContainerStatuses".into(), json!(init_statuses));
    }
    status.insert("containerStatuses".into(), json!(statuses));
    // qosClass is the API server's (set at creation, immutable): not sent.
    if let Some(r) = input.reason {
        status.insert("reason".into(), json!(r));
    }
    if let Some(m) = input.message {
        status.insert("message".into(), json!(m));
    }
    Value::Object(status)
}

/// The fields of a pod status edged reports (server-owned ones such as `qosClass` left out).
pub fn reported_fields(status: &Value) -> Value {
    const FIELDS: [&str; 11] = [
        "phase",
        "conditions",
        "hostIP",
        "hostIPs",
        "podIP",
        "podIPs",
        "startTime",
        "initContainerStatuses",
        "containerStatuses",
        "reason",
        "message",
    ];
    let Some(map) = status.as_object() else {
        return Value::Null;
    };
    Value::Object(
        map.iter()
            .filter(|(k, _)| FIELDS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    )
}

/// The status of a pod whose spec cannot run: Pending, every container waiting with `reason`.
pub fn unrunnable_status(
    raw: &Value,
    reason: WaitingReason,
    message: &str,
    host_ip: &str,
    previous: &Value,
    now: &str,
) -> Value {
    let names = |list: &str| -> Vec<Value> {
        raw["spec"][list]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                json!({
                    "name": c["name"].as_str().unwrap_or_default(),
                    "state": {"waiting": {"reason": reason.as_str(), "message": message}},
                    "lastState": {},
                    "ready": false,
                    "restartCount": 0,
                    "image": c["image"].as_str().unwrap_or_default(),
                    "imageID": "",
                })
            })
            .collect()
    };
    let init = names("initContainers");
    let mut status = json!({
        "phase": "Pending",
        "message": message,
        "conditions": [
            condition(previous, now, "PodReadyToStartContainers", false, None, None),
            condition(previous, now, "Initialized", init.is_empty(), None, None),
            condition(previous, now, "Ready", false, Some(reason.as_str()), Some(message.to_string())),
            condition(previous, now, "ContainersReady", false, Some(reason.as_str()), Some(message.to_string())),
            condition(previous, now, "PodScheduled", true, None, None),
        ],
        "containerStatuses": names("containers"),
        "startTime": previous["startTime"].as_str().unwrap_or(now),
    });
    if !init.is_empty() {
        status["initContainerStatuses"] = json!(init);
    }
    if !host_ip.is_empty() {
        status["hostIP"] = json!(host_ip);
        status["hostIPs"] = json!([{"ip": host_ip}]);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::runtime::SandboxInfo;

    fn pod(spec: Value) -> Pod {
        Pod::from_value(&json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u-1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn info(name: &str, attempt: u32, state: ContainerState, exit: i32) -> ContainerInfo {
        ContainerInfo {
            id: format!("{name}{attempt}"),
            sandbox_id: "s1".into(),
            name: name.into(),
            attempt,
            state,
            created_at: 1_700_000_000_000_000_000 + attempt as i64,
            started_at: 1_700_000_000_000_000_000,
            finished_at: if state == ContainerState::ContainerExited {
                1_700_000_001_000_000_000
            } else {
                0
            },
            exit_code: exit,
            reason: String::new(),
            message: String::new(),
            image: "x".into(),
            image_ref: "sha256:abc".into(),
            hash: String::new(),
            init: false,
            log_path: String::new(),
        }
    }

    fn runtime(containers: Vec<ContainerInfo>) -> PodRuntime {
        PodRuntime {
            sandboxes: vec![SandboxInfo {
                id: "s1".into(),
                attempt: 0,
                ready: true,
                created_at: 1,
                ips: vec!["10.88.0.5".into()],
            }],
            containers,
        }
    }

    fn status(
        p: &Pod,
        rt: &PodRuntime,
        phase: Phase,
        waiting: &HashMap<String, Waiting>,
        prev: &Value,
    ) -> Value {
        pod_status(&StatusInput {
            pod: p,
            rt,
            phase,
            waiting,
            ready: &HashMap::new(),
            started: &HashSet::new(),
            host_ip: "192.168.0.9",
            runtime_name: "containerd",
            previous: prev,
            now: "2024-01-01T00:00:00Z",
            reason: None,
            message: None,
        })
    }

    #[test]
    fn a_running_pod_reports_everything_the_kubelet_does() {
        let p = pod(json!({"containers": [{"name": "a", "image": "busybox"}]}));
        let rt = runtime(vec![info("a", 0, ContainerState::ContainerRunning, 0)]);
        let s = status(&p, &rt, Phase::Running, &HashMap::new(), &Value::Null);
        assert_eq!(s["phase"], "Running");
        assert_eq!(s["podIP"], "10.88.0.5");
        assert_eq!(s["podIPs"], json!([{"ip": "10.88.0.5"}]));
        assert_eq!(s["hostIP"], "192.168.0.9");
        assert_eq!(s["startTime"], "2024-01-01T00:00:00Z");
        let c = &s["containerStatuses"][0];
        assert_eq!(c["state"]["running"]["startedAt"], "2023-11-14T22:13:20Z");
        assert_eq!(c["restartCount"], 0);
        assert_eq!(c["ready"], true);
        assert_eq!(c["started"], true);
        assert_eq!(c["containerID"], "containerd://a0");
        assert_eq!(c["imageID"], "sha256:abc");
        assert_eq!(c["image"], "busybox");
        let cond = |t: &str| {
            s["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == t)
                .unwrap()
                .clone()
        };
        assert_eq!(cond("Ready")["status"], "True");
        assert_eq!(cond("ContainersReady")["status"], "True");
        assert_eq!(cond("Initialized")["status"], "True");
        assert_eq!(cond("PodScheduled")["status"], "True");
        assert!(s.get("qosClass").is_none());
        let mut stored = s.clone();
        stored["qosClass"] = json!("BestEffort");
        assert_eq!(reported_fields(&stored), s);

        // Unchanged conditions keep their transition times; the start time stays.
        let later = pod_status(&StatusInput {
            pod: &p,
            rt: &rt,
            phase: Phase::Running,
            waiting: &HashMap::new(),
            ready: &HashMap::new(),
            started: &HashSet::new(),
            host_ip: "192.168.0.9",
            runtime_name: "containerd",
            previous: &s,
            now: "2024-01-01T00:05:00Z",
            reason: None,
            message: None,
        });
        assert_eq!(later, s);
    }

    #[test]
    fn a_crash_looping_container_waits_with_its_last_termination() {
        let p = pod(json!({"containers": [{"name": "a", "image": "busybox"}]}));
        let rt = runtime(vec![
            info("a", 3, ContainerState::ContainerExited, 1),
            info("a", 2, ContainerState::ContainerExited, 1),
        ]);
        let waiting = HashMap::from([(
            "a".to_string(),
            Waiting::new(WaitingReason::CrashLoopBackOff, "back-off 40s"),
        )]);
        let s = status(&p, &rt, Phase::Running, &waiting, &Value::Null);
        let c = &s["containerStatuses"][0];
        assert_eq!(c["state"]["waiting"]["reason"], "CrashLoopBackOff");
        assert_eq!(c["lastState"]["terminated"]["exitCode"], 1);
        assert_eq!(c["lastState"]["terminated"]["reason"], "Error");
        assert_eq!(c["restartCount"], 3);
        assert_eq!(c["ready"], false);
        let ready = s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(ready["status"], "False");
        assert_eq!(ready["message"], "containers with unready status: [a]");
    }

    #[test]
    fn unrunnable_pods_say_why() {
        let raw = json!({"spec": {"containers": [{"name": "a", "image": "busybox"}]}});
        let s = unrunnable_status(
            &raw,
            WaitingReason::CreateContainerConfigError,
            "no",
            "1.2.3.4",
            &Value::Null,
            "t",
        );
        assert_eq!(s["phase"], "Pending");
        assert_eq!(
            s["containerStatuses"][0]["state"]["waiting"]["reason"],
            "CreateContainerConfigError"
        );
        assert_eq!(
            s["containerStatuses"][0]["state"]["waiting"]["message"],
            "no"
        );
    }
}
