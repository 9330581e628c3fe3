//! The eviction manager inside edged's dispatcher: a check (readings, pod usage) runs on a task
//! of its own every `eviction_period`; the dispatcher, which owns the pods, acts on the result.

use super::rank::{self, PodUsage};
use super::signals::{self, Signal};
use super::storage;
use super::{Check, ConditionClock, Eviction, Thresholds};
use crate::cgroups::qos::QosClass;
use crate::quantity;
use crate::spec::Pod;
use crate::stats::StatsProvider;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub(crate) struct State {
    thresholds: Thresholds,
    conditions: ConditionClock,
    stats: Arc<StatsProvider>,
    running: Option<JoinHandle<()>>,
    /// Unused images were collected for disk pressure at the last check.
    disk_reclaimed: bool,
    /// Pods evicted (their workers stop them; not chosen again).
    evicted: HashSet<String>,
    /// The signals under a threshold at the last check (logged when this changes).
    last_met: Vec<Signal>,
}

impl State {
    pub(crate) fn new(shared: &crate::pod_worker::Shared) -> State {
        let c = &shared.config;
        let (t, errors) = signals::thresholds(
            &c.eviction_hard,
            &c.eviction_soft,
            &c.eviction_soft_grace_period,
        );
        for e in errors {
            tracing::warn!(error = %e, "eviction threshold ignored");
        }
        State {
            thresholds: Thresholds::new(t),
            conditions: ConditionClock::new(c.eviction_pressure_transition_period),
            stats: Arc::new(StatsProvider::new(
                shared.runtime.clone(),
                c.node_name.clone(),
                c.root_directory.clone(),
                shared.status_reports.clone(),
            )),
            running: None,
            disk_reclaimed: false,
            evicted: HashSet::new(),
            last_met: Vec::new(),
        }
    }
}

fn amount(pod: &Pod, kind: &str, resource: &str) -> u64 {
    pod.spec
        .containers
        .iter()
        .filter_map(|c| {
            let map = if kind == "requests" {
                &c.resources.requests
            } else {
                &c.resources.limits
            };
            let q = quantity::from_json(map.get(resource)?)?;
            u64::try_from(quantity::parse_units(&q)?).ok()
        })
        .sum()
}

/// Runs one check: the node's signals, every pod's memory and local storage.
async fn run_check(
    stats: Arc<StatsProvider>,
    shared: Arc<crate::pod_worker::Shared>,
    pods: Vec<(String, Arc<Value>)>,
    tx: mpsc::Sender<Check>,
) {
    let root = shared.config.root_directory.clone();
    let image_fs = shared
        .runtime
        .image_fs_info()
        .await
        .ok()
        .and_then(|fs| fs.into_iter().next())
        .and_then(|f| f.fs_id)
        .map(|id| std::path::PathBuf::from(id.mountpoint))
        .filter(|p| !p.as_os_str().is_empty());
    let obs = tokio::task::spawn_blocking(move || super::observe(&root, image_fs.as_deref()))
        .await
        .unwrap_or_default();
    let snap = stats.snapshot().await;
    let mut check = Check::default();
    let specs: HashMap<&str, &Arc<Value>> = pods.iter().map(|(u, p)| (u.as_str(), p)).collect();
    for p in &snap.pods {
        let rootfs: HashMap<String, u64> = p
            .containers
            .iter()
            .filter_map(|c| Some((c.name.clone(), c.rootfs?.1)))
            .collect();
        let top = p
            .containers
            .iter()
            .filter_map(|c| Some((c.name.clone(), c.memory?.working_set?)))
            .max_by_key(|(_, b)| *b);
        let memory = p.memory.and_then(|m| m.working_set).unwrap_or(0);
        let mut disk = rootfs.values().sum::<u64>();
        if let Some(spec) = specs
            .get(p.uid.as_str())
            .and_then(|v| Pod::from_value(v).ok())
        {
            let log_dir = crate::sandbox::log_directory(&shared.config, &spec);
            let pod_dir = shared.config.pod_dir(&p.uid);
            let s = tokio::task::spawn_blocking(move || {
                storage::measure(&spec, &rootfs, &log_dir, &pod_dir)
            })
            .await
            .unwrap_or_default();
            disk = s.total();
            if let Some(why) = s.violation() {
                check.storage_violations.push((p.uid.clone(), why));
            }
        }
        check.usage.insert(
            p.uid.clone(),
            super::Usage {
                memory,
                top_container: top,
                disk,
            },
        );
    }
    // Pressures are computed by the dispatcher (it keeps the soft thresholds' clocks).
    check.observation = Some(obs);
    let _ = tx.send(check).await;
}

impl crate::Dispatcher {
    /// The kubelet's eviction admission for a pod new to this node: `Some` rejects it (it
    /// fails as `Evicted` without starting). Pods this node already started (they have a
    /// `startTime`, e.g. after a restart) are not judged again.
    pub(crate) fn admit(&self, object: &Value, key: &str) -> Option<Eviction> {
        if self.eviction.is_none() || object["status"]["startTime"].is_string() {
            return None;
        }
        let conditions = self.shared.pressure.lock().map(|c| *c).unwrap_or_default();
        let pod = Pod::from_value(object).ok()?;
        let message = super::admit(conditions, object, &pod).err()?;
        tracing::warn!(pod = %key, %message, "pod rejected under node pressure");
        Some(Eviction {
            message,
            grace: Duration::ZERO,
        })
    }

    /// Starts a check unless one runs.
    pub(crate) fn start_eviction_check(&mut self, tx: &mpsc::Sender<Check>) {
        let Some(state) = self.eviction.as_mut() else {
            return;
        };
        if state.running.as_ref().is_some_and(|r| !r.is_finished()) {
            return;
        }
        let pods: Vec<(String, Arc<Value>)> = self
            .workers
            .iter()
            .map(|(uid, w)| (uid.clone(), w.intent.borrow().object.clone()))
            .collect();
        state.running = Some(tokio::spawn(run_check(
            state.stats.clone(),
            self.shared.clone(),
            pods,
            tx.clone(),
        )));
    }

    /// Evicts what the check calls for: pods over their own storage limits, then for the
    /// strongest pressure (after collecting unused images, for disk) the first ranked pod.
    pub(crate) fn act_on_check(&mut self, mut check: Check) {
        let Some(state) = self.eviction.as_mut() else {
            return;
        };
        state.evicted.retain(|uid| self.workers.contains_key(uid));
        let mut to_evict: Vec<(String, Eviction)> = Vec::new();
        for (uid, why) in std::mem::take(&mut check.storage_violations) {
            if !state.evicted.contains(&uid) {
                to_evict.push((
                    uid,
                    Eviction {
                        message: why,
                        grace: Duration::ZERO,
                    },
                ));
            }
        }
        let obs = check.observation.take().unwrap_or_default();
        let now = Instant::now();
        let pressures = state.thresholds.pressures(&obs, now);
        let met = state.thresholds.met(&obs);
        if met != state.last_met {
            if met.is_empty() {
                tracing::info!("no eviction threshold is met any more");
            } else {
                tracing::warn!(
                    met = %state.thresholds.describe(&obs).join("; "),
                    "eviction threshold met: pods may be evicted and new pods rejected; free \
                     the resource, or set edged.tailoredKubeletConfig.evictionHard/evictionSoft"
                );
            }
            state.last_met = met.clone();
        }
        let conditions = state.conditions.update(&met, now);
        if let Ok(mut c) = self.shared.pressure.lock() {
            *c = conditions;
        }
        if to_evict.is_empty()
            && let Some(p) = pressures.first()
        {
            if p.signal.is_disk() && !state.disk_reclaimed {
                tracing::info!(
                    signal = p.signal.as_str(),
                    "disk pressure: collecting unused images before evicting pods"
                );
                self.shared.image_gc_now.notify_one();
                state.disk_reclaimed = true;
            } else {
                let candidates: Vec<PodUsage> = self
                    .workers
                    .iter()
                    .filter(|(uid, _)| !state.evicted.contains(*uid))
                    .filter_map(|(uid, w)| {
                        let object = w.intent.borrow().object.clone();
                        let pod = Pod::from_value(&object).ok()?;
                        let super::Usage {
                            memory: memory_used,
                            top_container: top,
                            disk: disk_used,
                        } = check.usage.get(uid).cloned().unwrap_or_default();
                        let priority = pod.spec.priority.unwrap_or(0);
                        let critical = rank::is_critical(&object, &pod);
                        let memory_requested = amount(&pod, "requests", "memory").max(
                            if crate::cgroups::qos::qos_class(&pod) == QosClass::Guaranteed {
                                amount(&pod, "limits", "memory")
                            } else {
                                0
                            },
                        );
                        Some(PodUsage {
                            uid: uid.clone(),
                            key: w.key.clone(),
                            priority,
                            critical,
                            memory_used,
                            memory_requested,
                            disk_used,
                            disk_requested: amount(&pod, "requests", "ephemeral-storage"),
                            top_container: top.map(|(n, b)| {
                                let req = pod
                                    .spec
                                    .containers
                                    .iter()
                                    .find(|c| c.name == n)
                                    .and_then(|c| {
                                        quantity::from_json(c.resources.requests.get("memory")?)
                                    })
                                    .and_then(|q| quantity::parse_units(&q))
                                    .and_then(|v| u64::try_from(v).ok())
                                    .unwrap_or(0);
                                (n, b, req)
                            }),
                        })
                    })
                    .collect();
                if let Some(victim) = rank::rank(&candidates, p.signal).first() {
                    let grace = if p.hard {
                        Duration::ZERO
                    } else {
                        let max = self.shared.config.eviction_max_pod_grace_period;
                        let own = self
                            .workers
                            .get(&victim.uid)
                            .and_then(|w| Pod::from_value(&w.intent.borrow().object).ok())
                            .map(|p| Duration::from_secs(p.grace_period_seconds() as u64))
                            .unwrap_or_default();
                        if max.is_zero() { own } else { own.min(max) }
                    };
                    to_evict.push((
                        victim.uid.clone(),
                        Eviction {
                            message: rank::message(victim, p.signal),
                            grace,
                        },
                    ));
                }
            }
        }
        if pressures.iter().all(|p| !p.signal.is_disk()) {
            state.disk_reclaimed = false;
        }
        for (uid, eviction) in to_evict {
            if let Some(w) = self.workers.get(&uid) {
                tracing::warn!(pod = %w.key, message = %eviction.message, "evicting pod");
                let e = Arc::new(eviction);
                w.intent.send_modify(|i| i.evicted = Some(e));
                w.wake.notify_one();
                state.evicted.insert(uid);
            }
        }
    }
}
