//! Node-pressure and local-storage eviction, decided at the edge (so also while the cloud is
//! away), as the kubelet's eviction manager does. Every `eviction_period` the node's signals
//! are read against `evictionHard` (at once) and `evictionSoft` (after their grace period);
//! under disk pressure unused images are collected first; if pressure remains, one pod is
//! evicted per check — the first of [`rank::rank`]. Pods over their own local-storage limits
//! are evicted whatever the pressure ([`storage`]). An evicted pod's containers are stopped
//! (at once for hard thresholds, within `evictionMaxPodGracePeriod` for soft ones), its status
//! says `Failed`/`Evicted` with the kubelet's message, and an `Evicted` event is recorded.

pub(super) mod check;
pub(crate) mod rank;
pub(crate) mod signals;
pub(crate) mod storage;

use signals::{Reading, Signal, Threshold};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// The readings of one check.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observation {
    pub readings: BTreeMap<Signal, Reading>,
}

/// A pressure in force: the signal and whether a hard threshold (or a soft one past its
/// grace) is met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pressure {
    pub signal: Signal,
    pub hard: bool,
}

/// Which thresholds hold, over time (soft ones must hold for their grace period).
pub struct Thresholds {
    thresholds: Vec<Threshold>,
    soft_since: HashMap<usize, Instant>,
}

impl Thresholds {
    pub fn new(thresholds: Vec<Threshold>) -> Thresholds {
        Thresholds {
            thresholds,
            soft_since: HashMap::new(),
        }
    }

    /// The signals with a threshold met now, grace periods aside (for the node's conditions).
    pub fn met(&self, obs: &Observation) -> Vec<Signal> {
        let mut out: Vec<Signal> = self
            .thresholds
            .iter()
            .filter(|t| {
                obs.readings
                    .get(&t.signal)
                    .is_some_and(|r| r.available < t.value.of(r.capacity))
            })
            .map(|t| t.signal)
            .collect();
        out.dedup();
        out
    }

    /// The signals under pressure now (hard first), one entry per signal.
    /// What is met, for a log line: each signal with its reading and the threshold it is
    /// under, e.g. `nodefs.available 9.8% (24.6GiB of 251.9GiB) < 10% (evictionHard)`.
    pub fn describe(&self, obs: &Observation) -> Vec<String> {
        self.thresholds
            .iter()
            .filter_map(|t| {
                let r = obs.readings.get(&t.signal)?;
                if r.available >= t.value.of(r.capacity) {
                    return None;
                }
                let pct = if r.capacity == 0 {
                    0.0
                } else {
                    r.available as f64 * 100.0 / r.capacity as f64
                };
                let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
                let limit = match t.value {
                    signals::Amount::Percent(p) => format!("{p}%"),
                    signals::Amount::Quantity(q) => format!("{q} bytes"),
                };
                let kind = if t.is_hard() {
                    "evictionHard"
                } else {
                    "evictionSoft"
                };
                Some(format!(
                    "{} {pct:.1}% ({:.1}GiB of {:.1}GiB) < {limit} ({kind})",
                    t.signal.as_str(),
                    gib(r.available),
                    gib(r.capacity)
                ))
            })
            .collect()
    }

    pub fn pressures(&mut self, obs: &Observation, now: Instant) -> Vec<Pressure> {
        let mut out: Vec<Pressure> = Vec::new();
        for (i, t) in self.thresholds.iter().enumerate() {
            let Some(r) = obs.readings.get(&t.signal) else {
                continue;
            };
            let met = r.available < t.value.of(r.capacity);
            if !met {
                self.soft_since.remove(&i);
                continue;
            }
            let in_force = match t.grace {
                None => true,
                Some(grace) => {
                    let since = *self.soft_since.entry(i).or_insert(now);
                    now.duration_since(since) >= grace
                }
            };
            if !in_force {
                continue;
            }
            match out.iter_mut().find(|p| p.signal == t.signal) {
                Some(p) => p.hard |= t.grace.is_none(),
                None => out.push(Pressure {
                    signal: t.signal,
                    hard: t.grace.is_none(),
                }),
            }
        }
        out.sort_by_key(|p| (!p.hard, p.signal));
        out
    }
}

/// The node's pressure conditions (`MemoryPressure`, `DiskPressure`, `PIDPressure`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Conditions {
    pub memory: bool,
    pub disk: bool,
    pub pid: bool,
}

/// Pressure conditions as the kubelet reports them: a condition holds while any threshold of
/// its kind is met (a soft one also before its grace period has passed) and for
/// `evictionPressureTransitionPeriod` after the last time one was, so that a node hovering at a
/// threshold does not flap.
#[derive(Debug)]
pub struct ConditionClock {
    period: Duration,
    /// Memory, disk, PIDs: when a threshold was last met.
    last_met: [Option<Instant>; 3],
}

impl ConditionClock {
    pub fn new(period: Duration) -> ConditionClock {
        ConditionClock {
            period,
            last_met: [None; 3],
        }
    }

    pub fn update(&mut self, met: &[Signal], now: Instant) -> Conditions {
        for s in met {
            let i = match s {
                Signal::MemoryAvailable => 0,
                Signal::PidAvailable => 2,
                _ => 1,
            };
            self.last_met[i] = Some(now);
        }
        let holds =
            |t: Option<Instant>| t.is_some_and(|t| now.duration_since(t) < self.period || t == now);
        Conditions {
            memory: holds(self.last_met[0]),
            disk: holds(self.last_met[1]),
            pid: holds(self.last_met[2]),
        }
    }
}

/// Whether a new pod may start under the node's pressure conditions (the kubelet's eviction
/// admission): critical pods always; under memory pressure alone, pods that are not
/// BestEffort or that tolerate the memory-pressure taint; under any other pressure, none.
/// `Err` is the rejection message (the pod fails as `Evicted`).
pub fn admit(
    c: Conditions,
    object: &serde_json::Value,
    pod: &crate::spec::Pod,
) -> Result<(), String> {
    use crate::cgroups::qos::{QosClass, qos_class};
    let mut held: Vec<&str> = Vec::new();
    if c.memory {
        held.push("MemoryPressure");
    }
    if c.disk {
        held.push("DiskPressure");
    }
    if c.pid {
        held.push("PIDPressure");
    }
    if held.is_empty() || rank::is_critical(object, pod) {
        return Ok(());
    }
    if held == ["MemoryPressure"]
        && (qos_class(pod) != QosClass::BestEffort
            || tolerates_no_schedule(object, "node.kubernetes.io/memory-pressure"))
    {
        return Ok(());
    }
    Err(format!("The node had condition: [{}]. ", held.join(" ")))
}

/// Whether the pod's tolerations tolerate the `NoSchedule` taint `key` (with no value).
fn tolerates_no_schedule(object: &serde_json::Value, key: &str) -> bool {
    let Some(tolerations) = object["spec"]["tolerations"].as_array() else {
        return false;
    };
    tolerations.iter().any(|t| {
        let effect = t["effect"].as_str().unwrap_or("");
        let t_key = t["key"].as_str().unwrap_or("");
        let op = t["operator"].as_str().unwrap_or("Equal");
        (effect.is_empty() || effect == "NoSchedule")
            && (t_key == key || (t_key.is_empty() && op == "Exists"))
            && (op == "Exists" || t["value"].as_str().unwrap_or("").is_empty())
    })
}

/// Reads the node's signals: memory from `/proc/meminfo` (capacity minus working set, as the
/// kubelet's `memory.available`), the node filesystem holding `root`, the runtime's image
/// filesystem (`image_fs`, the mount point it reports), and process IDs.
pub fn observe(root: &std::path::Path, image_fs: Option<&std::path::Path>) -> Observation {
    use crate::stats::host;
    let mut obs = Observation::default();
    if let Some(m) = host::read_memory() {
        obs.readings.insert(
            Signal::MemoryAvailable,
            Reading {
                available: m.capacity.saturating_sub(m.working_set),
                capacity: m.capacity,
            },
        );
    }
    if let Some(fs) = host::fs_usage(root) {
        obs.readings.insert(
            Signal::NodeFsAvailable,
            Reading {
                available: fs.available,
                capacity: fs.capacity,
            },
        );
        if fs.inodes > 0 {
            obs.readings.insert(
                Signal::NodeFsInodesFree,
                Reading {
                    available: fs.inodes_free,
                    capacity: fs.inodes,
                },
            );
        }
    }
    if let Some(fs) = image_fs
        .and_then(host::fs_usage)
        .or_else(|| host::fs_usage(root))
    {
        obs.readings.insert(
            Signal::ImageFsAvailable,
            Reading {
                available: fs.available,
                capacity: fs.capacity,
            },
        );
    }
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32768);
    let used: Option<u64> = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().nth(3)?.split('/').nth(1)?.parse().ok());
    if let Some(used) = used {
        obs.readings.insert(
            Signal::PidAvailable,
            Reading {
                available: pid_max.saturating_sub(used),
                capacity: pid_max,
            },
        );
    }
    obs
}

/// What one check found: the node's readings, what each pod uses, and pods over their own
/// local-storage limits.
#[derive(Debug, Default)]
pub struct Check {
    pub observation: Option<Observation>,
    /// Pod UID → what it uses.
    pub usage: HashMap<String, Usage>,
    /// Pod UID → why it is over its local-storage limits.
    pub storage_violations: Vec<(String, String)>,
}

/// What a pod uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Memory working set.
    pub memory: u64,
    /// The container using the most memory, and how much.
    pub top_container: Option<(String, u64)>,
    /// Local storage.
    pub disk: u64,
}

/// A pod to evict, and how fast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    pub message: String,
    /// Stop its containers within this (0 for hard thresholds and storage limits).
    pub grace: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;
    use signals::Amount;

    fn obs(available: u64) -> Observation {
        let mut o = Observation::default();
        o.readings.insert(
            Signal::MemoryAvailable,
            Reading {
                available,
                capacity: 1000,
            },
        );
        o
    }

    #[test]
    fn met_thresholds_are_described_with_reading_and_limit() {
        let t = Thresholds::new(vec![
            Threshold {
                signal: Signal::MemoryAvailable,
                value: Amount::Quantity(100),
                grace: None,
            },
            Threshold {
                signal: Signal::MemoryAvailable,
                value: Amount::Percent(30.0),
                grace: Some(Duration::from_secs(60)),
            },
        ]);
        assert!(t.describe(&obs(500)).is_empty());
        let d = t.describe(&obs(200));
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].starts_with("memory.available 20.0% ("), "{}", d[0]);
        assert!(d[0].ends_with("< 30% (evictionSoft)"), "{}", d[0]);
        assert_eq!(t.describe(&obs(50)).len(), 2);
    }

    #[test]
    fn hard_thresholds_hold_at_once_and_soft_ones_after_their_grace() {
        let mut t = Thresholds::new(vec![
            Threshold {
                signal: Signal::MemoryAvailable,
                value: Amount::Quantity(100),
                grace: None,
            },
            Threshold {
                signal: Signal::MemoryAvailable,
                value: Amount::Percent(30.0),
                grace: Some(Duration::from_secs(60)),
            },
        ]);
        let t0 = Instant::now();
        assert!(t.pressures(&obs(500), t0).is_empty());
        // Under the soft threshold only: not yet.
        assert!(t.pressures(&obs(200), t0).is_empty());
        assert_eq!(
            t.pressures(&obs(200), t0 + Duration::from_secs(61)),
            vec![Pressure {
                signal: Signal::MemoryAvailable,
                hard: false
            }]
        );
        // Recovering resets the soft clock.
        assert!(
            t.pressures(&obs(500), t0 + Duration::from_secs(62))
                .is_empty()
        );
        assert!(
            t.pressures(&obs(200), t0 + Duration::from_secs(63))
                .is_empty()
        );
        // Under the hard one: at once.
        assert_eq!(
            t.pressures(&obs(50), t0 + Duration::from_secs(64)),
            vec![Pressure {
                signal: Signal::MemoryAvailable,
                hard: true
            }]
        );
    }

    #[test]
    fn conditions_hold_from_any_met_threshold_until_the_transition_period_has_passed() {
        let t = Thresholds::new(vec![Threshold {
            signal: Signal::MemoryAvailable,
            value: Amount::Quantity(100),
            grace: Some(Duration::from_secs(60)),
        }]);
        let mut clock = ConditionClock::new(Duration::from_secs(300));
        let t0 = Instant::now();
        assert_eq!(clock.update(&t.met(&obs(500)), t0), Conditions::default());
        // A soft threshold before its grace period: the condition already holds.
        let c = clock.update(&t.met(&obs(50)), t0 + Duration::from_secs(1));
        assert!(c.memory && !c.disk && !c.pid);
        // Recovered, but within the transition period: still held.
        assert!(
            clock
                .update(&t.met(&obs(500)), t0 + Duration::from_secs(200))
                .memory
        );
        assert!(
            !clock
                .update(&t.met(&obs(500)), t0 + Duration::from_secs(302))
                .memory
        );
        // A zero period follows the readings.
        let mut clock = ConditionClock::new(Duration::ZERO);
        assert!(clock.update(&t.met(&obs(50)), t0).memory);
        assert!(
            !clock
                .update(&t.met(&obs(500)), t0 + Duration::from_millis(1))
                .memory
        );
    }

    #[test]
    fn admission_under_pressure_follows_the_kubelet() {
        use crate::spec::Pod;
        let pod = |resources: serde_json::Value, extra: serde_json::Value| {
            let mut v = serde_json::json!({
                "metadata": {"name": "p", "namespace": "d", "uid": "u"},
                "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]},
            });
            if let Some(o) = extra.as_object() {
                for (k, x) in o {
                    v["spec"][k] = x.clone();
                }
            }
            let p = Pod::from_value(&v).unwrap();
            (v, p)
        };
        let memory = Conditions {
            memory: true,
            ..Default::default()
        };
        let disk = Conditions {
            disk: true,
            ..Default::default()
        };
        let (be, be_pod) = pod(serde_json::json!({}), serde_json::json!({}));
        let (bu, bu_pod) = pod(
            serde_json::json!({"requests": {"memory": "10Mi"}}),
            serde_json::json!({}),
        );
        let (tol, tol_pod) = pod(
            serde_json::json!({}),
            serde_json::json!({"tolerations": [{"key": "node.kubernetes.io/memory-pressure",
                "operator": "Exists", "effect": "NoSchedule"}]}),
        );
        let (crit, crit_pod) = pod(
            serde_json::json!({}),
            serde_json::json!({"priority": 2_000_001_000}),
        );
        assert_eq!(admit(Conditions::default(), &be, &be_pod), Ok(()));
        assert_eq!(
            admit(memory, &be, &be_pod),
            Err("The node had condition: [MemoryPressure]. ".into())
        );
        assert_eq!(admit(memory, &bu, &bu_pod), Ok(()));
        assert_eq!(admit(memory, &tol, &tol_pod), Ok(()));
        assert_eq!(admit(memory, &crit, &crit_pod), Ok(()));
        assert_eq!(
            admit(disk, &bu, &bu_pod),
            Err("The node had condition: [DiskPressure]. ".into())
        );
        let both = Conditions {
            memory: true,
            disk: true,
            pid: false,
        };
        assert_eq!(
            admit(both, &tol, &tol_pod),
            Err("The node had condition: [MemoryPressure DiskPressure]. ".into())
        );
        assert_eq!(admit(disk, &crit, &crit_pod), Ok(()));
    }

    #[test]
    fn the_node_can_be_read() {
        let o = observe(std::path::Path::new("/"), None);
        let m = o.readings[&Signal::MemoryAvailable];
        assert!(m.capacity > 0 && m.available <= m.capacity);
        assert!(o.readings.contains_key(&Signal::NodeFsAvailable));
    }
}
