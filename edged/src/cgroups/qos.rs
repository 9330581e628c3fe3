//! A pod's QoS class and the resources of its pod-level cgroup, as the kubelet computes them
//! (`pkg/apis/core/v1/helper/qos`, `pkg/kubelet/cm/helpers_linux.go`): quantities are
//! compared as quantities (`1` and `1000m` are the same CPU), init containers count with the
//! largest of them against the sum of the app containers, pod overhead is added.

use crate::quantity;
use crate::spec::{Container, Pod};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

fn amount(v: Option<&Value>, cpu: bool) -> Option<i128> {
    let text = quantity::from_json(v?)?;
    if cpu {
        quantity::parse_milli(&text)
    } else {
        quantity::parse_units(&text)
    }
}

/// The kubelet's rule: BestEffort without any request or limit of cpu or memory;
/// Guaranteed when every container has cpu and memory limits equal to its requests (a
/// missing request defaults to the limit); Burstable otherwise.
pub fn qos_class(pod: &Pod) -> QosClass {
    let mut any = false;
    let mut guaranteed = true;
    for c in pod.spec.containers.iter().chain(&pod.spec.init_containers) {
        for r in ["cpu", "memory"] {
            let cpu = r == "cpu";
            let limit = amount(c.resources.limits.get(r), cpu).filter(|v| *v != 0);
            let request = amount(c.resources.requests.get(r), cpu).filter(|v| *v != 0);
            if limit.is_some() || request.is_some() {
                any = true;
            }
            match (request.or(limit), limit) {
                (Some(req), Some(lim)) if req == lim => {}
                _ => guaranteed = false,
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => QosClass::BestEffort,
        (true, true) => QosClass::Guaranteed,
        (true, false) => QosClass::Burstable,
    }
}

/// What the pod-level cgroup is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodResources {
    /// `cpu.shares` (v1; v2 converts to `cpu.weight`).
    pub cpu_shares: u64,
    /// `cpu.cfs_quota_us` with [`CPU_PERIOD_US`], when every container has a CPU limit.
    pub cpu_quota_us: Option<u64>,
    /// Bytes, when every container has a memory limit.
    pub memory_limit: Option<u64>,
    /// `podPidsLimit` (positive), when set.
    pub pids_limit: Option<u64>,
}

/// The CFS period the kubelet uses.
pub const CPU_PERIOD_US: u64 = 100_000;
/// The kernel's smallest `cpu.shares` (BestEffort pods and QoS class).
pub const MIN_SHARES: u64 = 2;
const MAX_SHARES: u64 = 262_144;
const MIN_QUOTA_US: u64 = 1_000;

/// `MilliCPUToShares`.
pub fn milli_cpu_to_shares(milli: i128) -> u64 {
    if milli <= 0 {
        return MIN_SHARES;
    }
    ((milli * 1024 / 1000) as u64).clamp(MIN_SHARES, MAX_SHARES)
}

/// `MilliCPUToQuota`.
pub fn milli_cpu_to_quota(milli: i128) -> u64 {
    ((milli.max(0) as u64).saturating_mul(CPU_PERIOD_US) / 1000).max(MIN_QUOTA_US)
}

/// A container's (request, limit) of `r`, the request defaulting to the limit.
fn container_amounts(c: &Container, r: &str) -> (i128, Option<i128>) {
    let cpu = r == "cpu";
    let limit = amount(c.resources.limits.get(r), cpu);
    let request = amount(c.resources.requests.get(r), cpu)
        .or(limit)
        .unwrap_or(0);
    (request, limit)
}

/// The pod's effective (request, limit) of `r`: the larger of the app containers' sum and
/// the largest init container; the limit only when every container has one.
fn pod_amounts(pod: &Pod, r: &str) -> (i128, Option<i128>) {
    let mut req_sum = 0i128;
    let mut lim_sum = Some(0i128);
    for c in &pod.spec.containers {
        let (req, lim) = container_amounts(c, r);
        req_sum = req_sum.saturating_add(req);
        lim_sum = match (lim_sum, lim) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            _ => None,
        };
    }
    for c in &pod.spec.init_containers {
        let (req, lim) = container_amounts(c, r);
        req_sum = req_sum.max(req);
        lim_sum = match (lim_sum, lim) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
    }
    let overhead = amount(pod.spec.overhead.get(r), r == "cpu").unwrap_or(0);
    (
        req_sum.saturating_add(overhead),
        lim_sum.map(|l| l.saturating_add(overhead)),
    )
}

/// `ResourceConfigForPod`.
pub fn pod_resources(pod: &Pod, pids_limit: i64) -> PodResources {
    let qos = qos_class(pod);
    let (cpu_req, cpu_lim) = pod_amounts(pod, "cpu");
    let (_, mem_lim) = pod_amounts(pod, "memory");
    let pids_limit = u64::try_from(pids_limit).ok().filter(|p| *p > 0);
    match qos {
        QosClass::BestEffort => PodResources {
            cpu_shares: MIN_SHARES,
            cpu_quota_us: None,
            memory_limit: None,
            pids_limit,
        },
        _ => PodResources {
            cpu_shares: milli_cpu_to_shares(cpu_req),
            cpu_quota_us: cpu_lim.map(milli_cpu_to_quota),
            memory_limit: mem_lim.map(|m| m.clamp(0, i64::MAX as i128) as u64),
            pids_limit,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(containers: Value, init: Value) -> Pod {
        Pod::from_value(
            &json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": containers, "initContainers": init}}),
        )
        .unwrap()
    }

    fn c(requests: Value, limits: Value) -> Value {
        json!({"name": "c", "image": "x", "resources": {"requests": requests, "limits": limits}})
    }

    #[test]
    fn qos_classes_compare_quantities_not_spellings() {
        let g = pod(
            json!([c(
                json!({"cpu": "1", "memory": "64Mi"}),
                json!({"cpu": "1000m", "memory": "67108864"})
            )]),
            json!([]),
        );
        assert_eq!(qos_class(&g), QosClass::Guaranteed);
        // Requests default to limits.
        let g2 = pod(
            json!([c(json!({}), json!({"cpu": "500m", "memory": "1Gi"}))]),
            json!([]),
        );
        assert_eq!(qos_class(&g2), QosClass::Guaranteed);
        let b = pod(json!([c(json!({"cpu": "100m"}), json!({}))]), json!([]));
        assert_eq!(qos_class(&b), QosClass::Burstable);
        let e = pod(json!([c(json!({}), json!({}))]), json!([]));
        assert_eq!(qos_class(&e), QosClass::BestEffort);
        // One container without limits makes the pod Burstable.
        let mixed = pod(
            json!([
                c(json!({}), json!({"cpu": "1", "memory": "1Gi"})),
                c(json!({}), json!({}))
            ]),
            json!([]),
        );
        assert_eq!(qos_class(&mixed), QosClass::Burstable);
    }

    #[test]
    fn pod_cgroup_resources_sum_containers_and_take_the_largest_init_container() {
        let p = pod(
            json!([
                c(
                    json!({"cpu": "250m"}),
                    json!({"cpu": "500m", "memory": "64Mi"})
                ),
                c(
                    json!({"cpu": "250m"}),
                    json!({"cpu": "500m", "memory": "64Mi"})
                )
            ]),
            json!([c(
                json!({"cpu": "2"}),
                json!({"cpu": "2", "memory": "32Mi"})
            )]),
        );
        let r = pod_resources(&p, 1024);
        // Requests: max(250m + 250m, 2) = 2 CPU → 2048 shares; limits: max(1, 2) = 2 CPU.
        assert_eq!(r.cpu_shares, 2048);
        assert_eq!(r.cpu_quota_us, Some(200_000));
        assert_eq!(r.memory_limit, Some(128 << 20));
        assert_eq!(r.pids_limit, Some(1024));
        // A container without a memory limit: no pod memory limit.
        let open = pod(
            json!([
                c(json!({"cpu": "100m"}), json!({"memory": "64Mi"})),
                c(json!({"cpu": "100m"}), json!({}))
            ]),
            json!([]),
        );
        let r = pod_resources(&open, -1);
        assert_eq!(
            (r.cpu_shares, r.cpu_quota_us, r.memory_limit, r.pids_limit),
            (204, None, None, None)
        );
        let be = pod(json!([c(json!({}), json!({}))]), json!([]));
        assert_eq!(pod_resources(&be, 0).cpu_shares, MIN_SHARES);
    }

    #[test]
    fn shares_and_quota_follow_the_kubelet_conversions() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(1_000_000_000), 262_144);
        assert_eq!(milli_cpu_to_quota(1), 1000);
        assert_eq!(milli_cpu_to_quota(1500), 150_000);
    }
}
