//! The Node: registration (labels `node-role.kubernetes.io/edge` and `/agent` that make the
//! cloud treat it as an edge node, capacity and allocatable from the machine, addresses,
//! node info, daemon endpoint), status reports with Ready / MemoryPressure / DiskPressure /
//! PIDPressure computed every `nodeStatusUpdateFrequency` (sent when changed, and at least
//! every `nodeStatusReportFrequency`), and the Lease in `kube-node-lease` renewed every
//! quarter of `nodeLeaseDurationSeconds`.
//!
//! With a cloud that agreed to `cloud-lease` ([`kubeedge_shared::link::CloudTerms`]) the cloud renews
//! the Lease while the link is up and sends this node its Node when the cluster marks it
//! Unknown: then the status is sent only when it changes (or the cloud asks), as the
//! kubelet's purpose for the periodic report — telling the cluster the node lives — is the
//! Lease's, and nothing is read back.

use super::events::{EventType, ObjectRef};
use super::pod_worker::{Allocatable, Shared};
use super::quantity;
use super::settings::EdgedConfig;
use super::stats::host;
use crate::meta::MetaError;
use kubeedge_shared::backoff::Backoff;
use kubeedge_shared::clock as time;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio_util::sync::CancellationToken;

pub use kubeedge_shared::constants::EDGE_NODE_LABEL as LABEL_EDGE_ROLE;
pub const LABEL_AGENT_ROLE: &str = "node-role.kubernetes.io/agent";
use kubeedge_shared::constants::LEASE_NAMESPACE;

/// What the machine has.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Machine {
    pub cpus: u64,
    pub memory_bytes: u64,
    pub ephemeral_bytes: u64,
}

impl Machine {
    pub fn detect(root: &Path) -> Machine {
        // SAFETY: sysconf has no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        Machine {
            cpus: if cpus > 0 { cpus as u64 } else { 1 },
            memory_bytes: host::meminfo_bytes("MemTotal").unwrap_or(0),
            ephemeral_bytes: host::fs_usage(root).map(|s| s.capacity).unwrap_or(0),
        }
    }
}

/// A threshold as bytes: an absolute quantity, or a percentage of `capacity`.
fn threshold(value: Option<&String>, capacity: u64) -> Option<u64> {
    let v = value?.trim();
    if let Some(p) = v.strip_suffix('%') {
        let pct: f64 = p.trim().parse().ok()?;
        return Some((capacity as f64 * pct / 100.0) as u64);
    }
    quantity::parse_units(v).map(|b| b.max(0) as u64)
}

fn reserved(config: &EdgedConfig, resource: &str, cpu: bool) -> i128 {
    [&config.system_reserved, &config.kube_reserved]
        .iter()
        .filter_map(|m| m.get(resource))
        .filter_map(|q| {
            if cpu {
                quantity::parse_milli(q)
            } else {
                quantity::parse_units(q)
            }
        })
        .sum()
}

/// What pods may use together (the `kubepods` cgroup's memory limit with
/// `enforceNodeAllocatable: [pods]`): capacity minus `systemReserved` and `kubeReserved`;
/// the eviction thresholds are not taken off (the kubelet's `getNodeAllocatableAbsolute`).
pub fn pods_memory(machine: &Machine, config: &EdgedConfig) -> i128 {
    (machine.memory_bytes as i128 - reserved(config, "memory", false)).max(0)
}

/// Capacity minus reservations and hard eviction thresholds (the kubelet's allocatable).
pub fn allocatable(machine: &Machine, config: &EdgedConfig) -> Allocatable {
    let memory_capacity = machine.memory_bytes as i128;
    let eviction_memory = threshold(
        config.eviction_hard.get("memory.available"),
        machine.memory_bytes,
    )
    .unwrap_or(0) as i128;
    let eviction_disk = threshold(
        config.eviction_hard.get("nodefs.available"),
        machine.ephemeral_bytes,
    )
    .unwrap_or(0) as i128;
    Allocatable {
        cpu_milli: (machine.cpus as i128 * 1000 - reserved(config, "cpu", true)).max(0),
        memory: (memory_capacity - reserved(config, "memory", false) - eviction_memory).max(0),
        ephemeral: (machine.ephemeral_bytes as i128
            - reserved(config, "ephemeral-storage", false)
            - eviction_disk)
            .max(0),
        memory_capacity,
    }
}

fn cpu_quantity(milli: i128) -> String {
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

fn kib(bytes: i128) -> String {
    quantity::kibibytes(bytes.max(0) as u64)
}

/// `amd64`, `arm64`, … as Kubernetes names architectures.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// The node's labels: the edge roles, the well-known ones, then `nodeLabels`.
pub fn node_labels(config: &EdgedConfig) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (LABEL_EDGE_ROLE.to_string(), String::new()),
        (LABEL_AGENT_ROLE.to_string(), String::new()),
        (
            "kubernetes.io/hostname".to_string(),
            config.node_name.clone(),
        ),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), go_arch().to_string()),
        ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
        ("beta.kubernetes.io/arch".to_string(), go_arch().to_string()),
    ]);
    labels.extend(config.node_labels.clone());
    labels
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn os_image() -> String {
    let text = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "Linux".into())
}

pub fn kubelet_version() -> String {
    format!("v1.29.0-kubeedge-rs-{}", env!("CARGO_PKG_VERSION"))
}

/// The health the node reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    /// `None` when ready, else why not.
    pub not_ready: Option<String>,
    pub network_message: Option<String>,
    pub memory_pressure: bool,
    pub disk_pressure: bool,
    pub pid_pressure: bool,
}

/// Everything of the node status except the conditions' times.
pub struct NodeReport {
    pub machine: Machine,
    pub allocatable: Allocatable,
    pub runtime_version: String,
    pub health: Health,
}

fn condition(ty: &str, status: bool, reason: &str, message: &str) -> Value {
    json!({"type": ty, "status": if status { "True" } else { "False" }, "reason": reason, "message": message})
}

/// `status` of the Node, conditions without times (see [`stamp_conditions`]).
pub fn node_status(config: &EdgedConfig, r: &NodeReport) -> Value {
    let capacity = json!({
        "cpu": r.machine.cpus.to_string(),
        "memory": kib(r.machine.memory_bytes as i128),
        "ephemeral-storage": kib(r.machine.ephemeral_bytes as i128),
        "pods": config.max_pods.to_string(),
        "hugepages-2Mi": "0",
        "hugepages-1Gi": "0",
    });
    let a = &r.allocatable;
    let allocatable = json!({
        "cpu": cpu_quantity(a.cpu_milli),
        "memory": kib(a.memory),
        "ephemeral-storage": kib(a.ephemeral),
        "pods": config.max_pods.to_string(),
        "hugepages-2Mi": "0",
        "hugepages-1Gi": "0",
    });
    let h = &r.health;
    let ready = match &h.not_ready {
        None => {
            let mut m = "kubelet is posting ready status".to_string();
            if let Some(n) = &h.network_message {
                m.push_str(&format!(" ({n})"));
            }
            condition("Ready", true, "KubeletReady", &m)
        }
        Some(why) => condition("Ready", false, "KubeletNotReady", why),
    };
    let conditions = vec![
        condition(
            "MemoryPressure",
            h.memory_pressure,
            if h.memory_pressure {
                "KubeletHasInsufficientMemory"
            } else {
                "KubeletHasSufficientMemory"
            },
            if h.memory_pressure {
                "kubelet has insufficient memory available"
            } else {
                "kubelet has sufficient memory available"
            },
        ),
        condition(
            "DiskPressure",
            h.disk_pressure,
            if h.disk_pressure {
                "KubeletHasDiskPressure"
            } else {
                "KubeletHasNoDiskPressure"
            },
            if h.disk_pressure {
                "kubelet has disk pressure"
            } else {
                "kubelet has no disk pressure"
            },
        ),
        condition(
            "PIDPressure",
            h.pid_pressure,
            if h.pid_pressure {
                "KubeletHasInsufficientPID"
            } else {
                "KubeletHasSufficientPID"
            },
            if h.pid_pressure {
                "kubelet has insufficient PID available"
            } else {
                "kubelet has sufficient PID available"
            },
        ),
        ready,
    ];
    let mut addresses = vec![json!({"type": "InternalIP", "address": config.node_ip})];
    if !config.hostname.is_empty() {
        addresses.push(json!({"type": "Hostname", "address": config.hostname}));
    }
    json!({
        "capacity": capacity,
        "allocatable": allocatable,
        "conditions": conditions,
        "addresses": addresses,
        "daemonEndpoints": {"kubeletEndpoint": {"Port": config.kubelet_port}},
        "nodeInfo": {
            "machineID": read_trimmed("/etc/machine-id"),
            "systemUUID": read_trimmed("/sys/class/dmi/id/product_uuid"),
            "bootID": read_trimmed("/proc/sys/kernel/random/boot_id"),
            "kernelVersion": read_trimmed("/proc/sys/kernel/osrelease"),
            "osImage": os_image(),
            "containerRuntimeVersion": r.runtime_version,
            "kubeletVersion": kubelet_version(),
            "kubeProxyVersion": kubelet_version(),
            "operatingSystem": "linux",
            "architecture": go_arch(),
        },
    })
}

/// Adds heartbeat and transition times: a condition keeps its transition time while its
/// status stays the same.
pub fn stamp_conditions(status: &mut Value, previous: &[Value], now: &str) {
    let Some(conditions) = status.get_mut("conditions").and_then(Value::as_array_mut) else {
        return;
    };
    for c in conditions {
        let since = previous
            .iter()
            .find(|p| p["type"] == c["type"] && p["status"] == c["status"])
            .and_then(|p| p["lastTransitionTime"].as_str())
            .unwrap_or(now)
            .to_string();
        c["lastHeartbeatTime"] = json!(now);
        c["lastTransitionTime"] = json!(since);
    }
}

/// The node's health: the runtime's conditions, and the pressure conditions the eviction
/// manager found.
fn health_of(
    runtime: &Result<Vec<(String, bool, String)>, String>,
    pressure: crate::eviction::Conditions,
) -> Health {
    let mut h = Health {
        not_ready: None,
        network_message: None,
        memory_pressure: false,
        disk_pressure: false,
        pid_pressure: false,
    };
    match runtime {
        Err(e) => h.not_ready = Some(format!("container runtime is down: {e}")),
        Ok(conds) => {
            for (ty, ok, why) in conds {
                if *ok {
                    continue;
                }
                match ty.as_str() {
                    "RuntimeReady" => {
                        h.not_ready = Some(format!(
                            "container runtime status check may not have completed yet: RuntimeReady=false {why}"
                        ))
                    }
                    "NetworkReady" => {
                        // Host-network pods still run: reported, not fatal (many edge nodes have no CNI).
                        h.network_message = Some(format!(
                            "container runtime network not ready: NetworkReady=false {why}"
                        ))
                    }
                    _ => {}
                }
            }
        }
    }
    h.memory_pressure = pressure.memory;
    h.disk_pressure = pressure.disk;
    h.pid_pressure = pressure.pid;
    h
}

/// The Node object to register.
pub fn node_object(config: &EdgedConfig, status: Value) -> Value {
    let mut spec = Map::new();
    if !config.register_schedulable {
        spec.insert("unschedulable".into(), json!(true));
    }
    if !config.register_with_taints.is_empty() {
        spec.insert("taints".into(), json!(config.register_with_taints));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": config.node_name,
            "labels": node_labels(config),
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": spec,
        "status": status,
    })
}

/// Every this many status ticks the Node is read back from the cloud: if the cloud side
/// changed its conditions (the node lifecycle controller marks a node whose lease was late
/// Unknown), the status is sent again although nothing changed here.
const CHECK_EVERY_TICKS: u32 = 6;

/// Runs registration, status reports and lease renewal until cancelled.
pub async fn run(shared: Arc<Shared>, machine: Machine, cancel: CancellationToken) {
    // The lease is owned by the Node: it is created once the Node's UID is known.
    let (node_uid, node_uid_rx) = tokio::sync::watch::channel(None);
    let lease = tokio::spawn(renew_lease(shared.clone(), node_uid_rx, cancel.clone()));
    report_status(shared, machine, node_uid, cancel).await;
    let _ = lease.await;
}

/// The kubelet's node event reason for a condition's status (`NodeReady`,
/// `NodeHasSufficientMemory`, …); None for conditions the kubelet records nothing about.
fn condition_reason(ty: &str, status: &str) -> Option<&'static str> {
    let ok = status == "False";
    Some(match ty {
        "Ready" if status == "True" => "NodeReady",
        "Ready" => "NodeNotReady",
        "MemoryPressure" if ok => "NodeHasSufficientMemory",
        "MemoryPressure" => "NodeHasInsufficientMemory",
        "DiskPressure" if ok => "NodeHasNoDiskPressure",
        "DiskPressure" => "NodeHasDiskPressure",
        "PIDPressure" if ok => "NodeHasSufficientPID",
        "PIDPressure" => "NodeHasInsufficientPID",
        _ => return None,
    })
}

/// The node events for conditions whose status differs from `known` (type → status, as last
/// computed here; empty at start, so the first report records each once, as the kubelet
/// does), updating `known`.
fn condition_events(known: &mut HashMap<String, String>, status: &Value) -> Vec<&'static str> {
    let mut reasons = Vec::new();
    for c in status["conditions"].as_array().into_iter().flatten() {
        let (Some(ty), Some(st)) = (c["type"].as_str(), c["status"].as_str()) else {
            continue;
        };
        if known.get(ty).map(String::as_str) == Some(st) {
            continue;
        }
        known.insert(ty.to_string(), st.to_string());
        if let Some(reason) = condition_reason(ty, st) {
            reasons.push(reason);
        }
    }
    reasons
}

/// Whether the cluster marked the Node Unknown (the node lifecycle controller does, when
/// its Lease went stale; a node never reports Unknown itself).
pub fn marked_unknown(node: &Value) -> bool {
    node["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["status"] == "Unknown"))
}

/// Whether the cloud's copy of the Node disagrees with the conditions last sent.
fn conditions_differ(node: &Value, sent: &[Value]) -> bool {
    let theirs = node["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    sent.iter().any(|c| {
        !theirs
            .iter()
            .any(|t| t["type"] == c["type"] && t["status"] == c["status"])
    })
}

async fn report_status(
    shared: Arc<Shared>,
    machine: Machine,
    node_uid: tokio::sync::watch::Sender<Option<String>>,
    cancel: CancellationToken,
) {
    let config = &shared.config;
    let meta = &shared.meta;
    let mut registered = !config.register_node;
    let mut retry = Backoff::new(Duration::from_millis(200), Duration::from_secs(7));
    let mut last: Option<(Value, Instant)> = None;
    let mut previous_conditions: Vec<Value> = Vec::new();
    let mut resync = shared.resync.subscribe();
    let mut ticks: u32 = 0;
    let node_ref = ObjectRef::node(&config.node_name);
    let mut known_conditions = HashMap::new();
    // Asks every pod worker to report its status again (as after a reconnect), without this
    // loop treating its own request as a reconnect.
    let resend_pods = |resync: &mut tokio::sync::watch::Receiver<u64>| {
        shared.resync.send_modify(|n| *n += 1);
        resync.mark_unchanged();
    };
    shared.events.record(
        &node_ref,
        EventType::Normal,
        "Starting",
        "Starting kubelet.",
    );
    if registered && let Ok(node) = meta.get_node().await {
        node_uid.send_replace(node["metadata"]["uid"].as_str().map(str::to_string));
    }
    loop {
        ticks = ticks.wrapping_add(1);
        if resync.has_changed().unwrap_or(false) {
            // Back online: the cloud may have marked the node Unknown meanwhile.
            resync.mark_unchanged();
            last = None;
        }
        // A cloud that renews the Lease says when the cluster marks the node Unknown.
        let cloud_lease = shared.terms.borrow().cloud_lease;
        if registered && !cloud_lease && last.is_some() && ticks.is_multiple_of(CHECK_EVERY_TICKS) {
            let read = meta.get_node().await;
            if let Ok(node) = &read
                && node_uid.borrow().is_none()
            {
                node_uid.send_replace(node["metadata"]["uid"].as_str().map(str::to_string));
            }
            match read {
                Ok(node) if conditions_differ(&node, &previous_conditions) => {
                    tracing::info!(node = %config.node_name, "the cloud's node conditions differ from what this node reported; reporting again, the pods too");
                    last = None;
                    resend_pods(&mut resync);
                }
                Ok(_) => {}
                Err(MetaError::NotFound { .. }) => {
                    registered = false;
                    last = None;
                }
                Err(e) => tracing::debug!(error = %e, "reading the node back failed"),
            }
        }
        let runtime = shared.runtime.conditions().await.map_err(|e| e.to_string());
        let runtime_version = match shared.runtime.version().await {
            Ok(v) => format!("{}://{}", v.runtime_name, v.runtime_version),
            Err(_) => String::new(),
        };
        let report = NodeReport {
            machine: machine.clone(),
            allocatable: shared.allocatable.clone(),
            runtime_version,
            health: health_of(
                &runtime,
                shared.pressure.lock().map(|p| *p).unwrap_or_default(),
            ),
        };
        if report.health.disk_pressure {
            shared.image_gc_now.notify_one();
        }
        let bare = node_status(config, &report);
        for reason in condition_events(&mut known_conditions, &bare) {
            let message = format!("Node {} status is now: {reason}", config.node_name);
            shared
                .events
                .record(&node_ref, EventType::Normal, reason, message);
        }
        let mut status = bare.clone();
        stamp_conditions(&mut status, &previous_conditions, &time::now());
        let mut wait = config.node_status_update_frequency;
        if !registered {
            match register(&shared, node_object(config, status.clone())).await {
                Ok(uid) => {
                    tracing::info!(node = %config.node_name, "node registered");
                    node_uid.send_replace(uid);
                    registered = true;
                    retry.reset();
                }
                Err(e) => {
                    tracing::info!(node = %config.node_name, error = %e, "node registration failed; will retry");
                    wait = retry.next_delay();
                }
            }
        }
        if registered {
            let due = match &last {
                None => true,
                Some((sent, at)) => {
                    *sent != bare
                        || (!cloud_lease && at.elapsed() >= config.node_status_report_frequency)
                }
            };
            if due {
                let mut report = status.clone();
                if config.kubelet_port_from_cloud
                    && let Some(o) = report.as_object_mut()
                {
                    o.remove("daemonEndpoints");
                }
                match meta.patch_node_status(&json!({"status": report})).await {
                    Ok(_) => {
                        tracing::debug!(node = %config.node_name, "node status sent");
                        if let Some(c) = status["conditions"].as_array() {
                            previous_conditions = c.clone();
                        }
                        last = Some((bare, Instant::now()));
                    }
                    Err(e) => {
                        tracing::debug!(node = %config.node_name, error = %e, "node status not sent");
                        // Sent again on the next tick, changed or not.
                        last = None;
                        if matches!(e, MetaError::NotFound { .. }) {
                            // Someone deleted the Node: register again.
                            registered = false;
                        }
                        wait = wait.min(Duration::from_secs(2));
                    }
                }
            }
        }
        // The link coming back does not wait for the next period: the cloud may have marked
        // the node Unknown meanwhile, and it stays NotReady until this node reports.
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            _ = shared.node_status_now.notified() => last = None,
            changed = resync.changed() => match changed {
                Ok(()) => last = None,
                Err(_) => tokio::time::sleep(wait).await,
            },
        }
    }
}

/// Creates the Node, or adopts an existing one (adding labels it lacks). Returns its UID.
async fn register(shared: &Shared, node: Value) -> Result<Option<String>, MetaError> {
    let uid = |n: &Value| n["metadata"]["uid"].as_str().map(str::to_string);
    match shared.meta.register_node(node.clone()).await {
        Ok(created) => Ok(uid(&created)),
        Err(MetaError::Api(e)) if e.reason() == "AlreadyExists" || e.code() == 409 => {
            let mut existing = shared.meta.get_node().await?;
            let boot_id = &node["status"]["nodeInfo"]["bootID"];
            let known_boot = &existing["status"]["nodeInfo"]["bootID"];
            if known_boot.as_str().is_some_and(|b| !b.is_empty()) && known_boot != boot_id {
                // As the kubelet: the machine restarted since the Node last reported.
                let message = format!(
                    "Node {} has been rebooted, boot id: {}",
                    shared.config.node_name,
                    boot_id.as_str().unwrap_or_default()
                );
                shared.events.record(
                    &ObjectRef::node(&shared.config.node_name),
                    EventType::Warning,
                    "Rebooted",
                    message,
                );
            }
            let wanted = node_labels(&shared.config);
            let labels = existing["metadata"]["labels"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            let missing = wanted
                .iter()
                .any(|(k, v)| labels.get(k).and_then(Value::as_str) != Some(v.as_str()));
            if missing {
                let mut merged = labels;
                for (k, v) in wanted {
                    merged.insert(k, json!(v));
                }
                let id = uid(&existing);
                let Some(meta) = existing.get_mut("metadata").and_then(Value::as_object_mut) else {
                    tracing::warn!(
                        "the stored Node has no metadata object; its labels are left as they are"
                    );
                    return Ok(id);
                };
                meta.insert("labels".into(), Value::Object(merged));
                shared.meta.update_node(existing).await?;
                return Ok(id);
            }
            Ok(uid(&existing))
        }
        Err(e) => Err(e),
    }
}

fn lease_object(config: &EdgedConfig, owner_uid: Option<&str>) -> Value {
    let mut lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": config.node_name, "namespace": LEASE_NAMESPACE},
        "spec": {
            "holderIdentity": config.node_name,
            "leaseDurationSeconds": config.node_lease_duration_seconds,
            "renewTime": time::rfc3339_micros(SystemTime::now()),
        },
    });
    if let Some(uid) = owner_uid {
        lease["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "v1", "kind": "Node", "name": config.node_name, "uid": uid,
        }]);
    }
    lease
}

/// Stamps a renewal into `lease.spec`; an error when the lease (from the store or the cloud)
/// has a `spec` that is not an object.
fn renew_spec(lease: &mut Value, config: &EdgedConfig) -> Result<(), String> {
    let obj = lease
        .as_object_mut()
        .ok_or("the lease is not a JSON object")?;
    let spec = obj.entry("spec").or_insert_with(|| json!({}));
    if spec.is_null() {
        *spec = json!({});
    }
    let spec = spec
        .as_object_mut()
        .ok_or("the lease's spec is not a JSON object")?;
    spec.insert(
        "renewTime".into(),
        json!(time::rfc3339_micros(SystemTime::now())),
    );
    spec.insert("holderIdentity".into(), json!(config.node_name));
    spec.insert(
        "leaseDurationSeconds".into(),
        json!(config.node_lease_duration_seconds),
    );
    Ok(())
}

/// The next change of the link's terms; never, when there is no edgehub to follow.
async fn terms_changed(
    terms: &mut tokio::sync::watch::Receiver<kubeedge_shared::link::CloudTerms>,
) {
    if terms.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn renew_lease(
    shared: Arc<Shared>,
    mut node_uid: tokio::sync::watch::Receiver<Option<String>>,
    cancel: CancellationToken,
) {
    let config = &shared.config;
    let meta = &shared.meta;
    let interval = config.lease_renew_interval();
    let mut current: Option<Value> = None;
    let mut terms = shared.terms.clone();
    // Wait for the Node (its UID owns the lease).
    tokio::select! {
        _ = cancel.cancelled() => return,
        _ = node_uid.wait_for(Option::is_some) => {}
    }
    let renew_self = || shared.lease_self.load(std::sync::atomic::Ordering::Acquire);
    let link_changed = || {
        // A new link (or none): the cloud's part is agreed anew.
        shared
            .lease_self
            .store(false, std::sync::atomic::Ordering::Release);
    };
    // A renewal failed since the last one that worked: the cloud's node lifecycle controller
    // may have marked the node Unknown and its pods not Ready meanwhile (it does when the
    // lease stops, e.g. while the apiserver fails cloudcore's requests), and only this node's
    // own reports undo that. The next renewal that works asks the node status and every pod
    // status to be sent again, as a reconnect does.
    let mut lapsed = false;
    loop {
        if terms.borrow_and_update().cloud_lease && !renew_self() {
            // The cloud renews it while this link lasts; read it afresh afterwards.
            current = None;
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = terms_changed(&mut terms) => link_changed(),
                // The cluster marked the node Unknown all the same (see `Shared::lease_self`).
                _ = shared.lease_self_now.notified() => {}
            }
            continue;
        }
        let wait = match current.take() {
            None => match meta.get_lease().await {
                Ok(l) => {
                    current = Some(l);
                    Duration::ZERO
                }
                Err(MetaError::NotFound { .. }) => {
                    let owner = node_uid.borrow().clone();
                    match meta
                        .create_lease(lease_object(config, owner.as_deref()))
                        .await
                    {
                        Ok(l) => {
                            current = Some(l);
                            interval
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "creating the node lease failed");
                            interval.min(Duration::from_secs(1))
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "reading the node lease failed");
                    interval.min(Duration::from_secs(1))
                }
            },
            Some(mut lease) => {
                if let Err(e) = renew_spec(&mut lease, config) {
                    tracing::warn!(error = %e, "malformed node lease; reading it again");
                    interval.min(Duration::from_secs(1))
                } else {
                    match meta.update_lease(lease).await {
                        Ok(l) => {
                            current = Some(l);
                            if std::mem::take(&mut lapsed) {
                                tracing::info!(node = %config.node_name, "node lease renewed again; node and pod statuses are sent again");
                                shared.resync.send_modify(|n| *n += 1);
                            }
                            interval
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "renewing the node lease failed");
                            // Conflict or gone: read it again; offline: try again soon.
                            interval.min(Duration::from_secs(1))
                        }
                    }
                }
            }
        };
        // Every failure above leaves no current lease.
        lapsed |= current.is_none();
        if wait.is_zero() {
            continue;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            // A link to a cloud that renews it: stop at once.
            _ = terms_changed(&mut terms) => link_changed(),
        }
    }
}

#[cfg(test)]
mod tests;
