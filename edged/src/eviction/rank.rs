//! Which pod goes first, as the kubelet ranks them (`pkg/kubelet/eviction/helpers.go`): under
//! memory pressure pods using more memory than they request, then lower priority, then the
//! largest use above the request; under disk pressure the same with local storage. Static pods
//! and pods of `system-node-critical`/`system-cluster-critical` priority are never evicted
//! for node pressure (the kubelet's critical pods).

use super::signals::Signal;
use std::cmp::Reverse;

/// A running pod as the eviction manager sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodUsage {
    pub uid: String,
    /// `namespace/name`.
    pub key: String,
    pub priority: i32,
    pub critical: bool,
    pub memory_used: u64,
    pub memory_requested: u64,
    /// Local storage: writable layers, logs and disk-backed emptyDirs.
    pub disk_used: u64,
    pub disk_requested: u64,
    /// The container using the most (for the message) and its use and request.
    pub top_container: Option<(String, u64, u64)>,
}

/// The kubelet's threshold for critical priorities (`SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The kubelet's critical pods: static and mirror pods, and critical priorities.
pub fn is_critical(object: &serde_json::Value, pod: &crate::spec::Pod) -> bool {
    crate::static_pods::is_static(object)
        || crate::static_pods::is_mirror(object)
        || pod.spec.priority.unwrap_or(0) >= SYSTEM_CRITICAL_PRIORITY
}

fn key(p: &PodUsage, signal: Signal) -> (bool, i32, Reverse<i128>) {
    let (used, requested) = if signal == Signal::MemoryAvailable {
        (p.memory_used, p.memory_requested)
    } else {
        (p.disk_used, p.disk_requested)
    };
    (
        // Over their request first (false sorts first).
        used <= requested,
        p.priority,
        Reverse(used as i128 - requested as i128),
    )
}

/// The pods that may be evicted for `signal`, first to go first.
pub fn rank(pods: &[PodUsage], signal: Signal) -> Vec<&PodUsage> {
    let mut v: Vec<&PodUsage> = pods.iter().filter(|p| !p.critical).collect();
    v.sort_by_key(|p| key(p, signal));
    v
}

/// The kubelet's eviction message.
pub fn message(p: &PodUsage, signal: Signal) -> String {
    let mut m = format!(
        "The node was low on resource: {}. Threshold quantity: {}. ",
        signal.resource(),
        signal.as_str()
    );
    if signal == Signal::MemoryAvailable
        && let Some((c, used, req)) = &p.top_container
    {
        m.push_str(&format!(
            "Container {c} was using {}Ki, request is {}Ki, has larger consumption of memory. ",
            used / 1024,
            req / 1024
        ));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, priority: i32, mem: (u64, u64)) -> PodUsage {
        PodUsage {
            uid: uid.into(),
            key: format!("ns/{uid}"),
            priority,
            critical: priority >= SYSTEM_CRITICAL_PRIORITY,
            memory_used: mem.0,
            memory_requested: mem.1,
            disk_used: 0,
            disk_requested: 0,
            top_container: Some(("main".into(), mem.0, mem.1)),
        }
    }

    #[test]
    fn a_memory_hog_over_its_request_goes_before_a_guaranteed_pod_within_it() {
        let pods = vec![
            pod("guaranteed", 0, (60 << 20, 64 << 20)),
            pod("hog", 0, (300 << 20, 0)),
            pod("small-besteffort", 0, (1 << 20, 0)),
            pod("critical", SYSTEM_CRITICAL_PRIORITY, (900 << 20, 0)),
        ];
        let order: Vec<&str> = rank(&pods, Signal::MemoryAvailable)
            .iter()
            .map(|p| p.uid.as_str())
            .collect();
        assert_eq!(order, ["hog", "small-besteffort", "guaranteed"]);
        let m = message(&pods[1], Signal::MemoryAvailable);
        assert!(
            m.starts_with("The node was low on resource: memory."),
            "{m}"
        );
        assert!(
            m.contains("Container main was using 307200Ki, request is 0Ki"),
            "{m}"
        );
    }

    #[test]
    fn lower_priority_goes_first_among_pods_over_their_requests() {
        let pods = vec![
            pod("important", 1000, (200 << 20, 0)),
            pod("batch", -10, (100 << 20, 0)),
        ];
        let order: Vec<&str> = rank(&pods, Signal::MemoryAvailable)
            .iter()
            .map(|p| p.uid.as_str())
            .collect();
        assert_eq!(order, ["batch", "important"]);
    }
}
