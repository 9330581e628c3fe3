//! The kubelet's resource usage endpoints for this node (`/stats/summary`,
//! `/metrics/resource`), computed like its CRI stats provider: the node from `/proc` and
//! `statvfs` of edged's root directory, pods and containers from the runtime's
//! `ListContainerStats` / `ListPodSandboxStats` (summed over the containers when the
//! runtime has no sandbox stats), start times from the sandboxes' and containers' creation.
//! CPU rates (`usageNanoCores`) come from the previous sample of the same node, container
//! or sandbox, as the kubelet caches them when the runtime does not report them.

pub mod host;
pub mod resource;
pub(crate) mod sample;
pub(crate) mod summary;

use self::sample::{ContainerSample, Cpu, Memory, NodeSample, PodSample, Snapshot};
use super::status_report::StatusReports;
use crate::cri::api;
use crate::cri::runtime::{
    LABEL_CONTAINER_NAME, LABEL_NODE, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID, Runtime,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// A previous CPU sample older than this is not used for a rate.
const MAX_RATE_WINDOW: Duration = Duration::from_secs(120);
/// Without a usable previous node sample, two are taken this far apart.
const NODE_RATE_WINDOW: Duration = Duration::from_millis(250);

/// Cumulative CPU time at a moment (Unix nanoseconds, core-nanoseconds).
type CpuPoint = (i64, u64);

pub struct StatsProvider {
    runtime: Runtime,
    node_name: String,
    root_dir: PathBuf,
    last_node_cpu: Mutex<Option<CpuPoint>>,
    /// Per container or sandbox id.
    last_cpu: Mutex<HashMap<String, CpuPoint>>,
    status_reports: Arc<StatusReports>,
}

fn unix_nanos(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Core-nanoseconds per second between two samples, when they are usable.
pub fn nano_cores(prev: CpuPoint, now: CpuPoint) -> Option<u64> {
    let dt = now.0.checked_sub(prev.0)?;
    if dt <= 0 || dt as u128 > MAX_RATE_WINDOW.as_nanos() || now.1 < prev.1 {
        return None;
    }
    Some(((now.1 - prev.1) as u128 * 1_000_000_000 / dt as u128) as u64)
}

fn value(v: &Option<api::UInt64Value>) -> Option<u64> {
    v.as_ref().map(|v| v.value)
}

impl StatsProvider {
    pub fn new(
        runtime: Runtime,
        node_name: String,
        root_dir: PathBuf,
        status_reports: Arc<StatusReports>,
    ) -> Self {
        StatsProvider {
            runtime,
            node_name,
            root_dir,
            status_reports,
            last_node_cpu: Mutex::new(None),
            last_cpu: Mutex::new(HashMap::new()),
        }
    }

    /// Status patches per pod, for the kubelet-like `/metrics`.
    pub fn status_reports(&self) -> &StatusReports {
        &self.status_reports
    }

    fn node_selector(&self) -> HashMap<String, String> {
        HashMap::from([(LABEL_NODE.to_string(), self.node_name.clone())])
    }

    async fn node_cpu(&self) -> Option<Cpu> {
        let (t, usage) = host::read_cpu()?;
        let mut now = (unix_nanos(t), usage);
        let prev = self.last_node_cpu.lock().ok().and_then(|g| *g);
        let mut rate = prev.and_then(|p| {
            let age = now.0 - p.0;
            (age >= NODE_RATE_WINDOW.as_nanos() as i64)
                .then(|| nano_cores(p, now))
                .flatten()
        });
        if rate.is_none() {
            tokio::time::sleep(NODE_RATE_WINDOW).await;
            if let Some((t2, usage2)) = host::read_cpu() {
                let later = (unix_nanos(t2), usage2);
                rate = nano_cores(now, later);
                now = later;
            }
        }
        let mut t = SystemTime::UNIX_EPOCH + Duration::from_nanos(now.0.max(0) as u64);
        if now.0 <= 0 {
            t = SystemTime::now();
        }
        if let Ok(mut g) = self.last_node_cpu.lock() {
            *g = Some(now);
        }
        Some(Cpu {
            time: t,
            usage_core_nanos: Some(now.1),
            usage_nano_cores: rate,
        })
    }

    fn node(&self, cpu: Option<Cpu>) -> NodeSample {
        let now = SystemTime::now();
        NodeSample {
            name: self.node_name.clone(),
            boot: host::boot_time().unwrap_or(SystemTime::UNIX_EPOCH),
            cpu,
            memory: host::read_memory().map(|m| Memory {
                time: now,
                working_set: Some(m.working_set),
                usage: Some(m.usage),
                available: Some(m.capacity.saturating_sub(m.working_set)),
                rss: Some(m.rss),
                page_faults: Some(m.page_faults),
                major_page_faults: Some(m.major_page_faults),
            }),
            fs: host::fs_usage(&self.root_dir).map(|f| (now, f)),
        }
    }

    /// A CPU sample from the runtime, with the rate filled in from the previous one.
    fn cpu(&self, id: &str, c: &Option<api::CpuUsage>, seen: &mut Vec<String>) -> Option<Cpu> {
        let c = c.as_ref()?;
        let usage = value(&c.usage_core_nano_seconds);
        let mut rate = value(&c.usage_nano_cores);
        if let Some(usage) = usage {
            let point = (c.timestamp, usage);
            if let Ok(mut cache) = self.last_cpu.lock() {
                if rate.is_none() {
                    rate = cache.get(id).and_then(|prev| nano_cores(*prev, point));
                }
                let newer = cache.get(id).is_none_or(|prev| prev.0 < point.0);
                if newer {
                    cache.insert(id.to_string(), point);
                }
            }
            seen.push(id.to_string());
        }
        Some(Cpu {
            time: kubeedge_shared::clock::from_unix_nanos(c.timestamp)
                .unwrap_or_else(SystemTime::now),
            usage_core_nanos: usage,
            usage_nano_cores: rate,
        })
    }

    /// The node, and its running pods with their running containers.
    pub async fn snapshot(&self) -> Snapshot {
        let node_cpu = self.node_cpu().await;
        let node = self.node(node_cpu);
        let mut snap = Snapshot {
            node,
            pods: Vec::new(),
            scrape_error: false,
        };
        let sel = self.node_selector();
        let (sandboxes, containers, stats) = tokio::join!(
            self.runtime.list_sandboxes(sel.clone()),
            self.runtime.list_containers(sel.clone()),
            self.runtime.list_container_stats(sel.clone()),
        );
        let (sandboxes, containers, stats) = match (sandboxes, containers, stats) {
            (Ok(a), Ok(b), Ok(c)) => (a, b, c),
            (a, b, c) => {
                let e = [a.err(), b.err(), c.err()].into_iter().flatten().next();
                tracing::warn!(error = ?e, "listing pod stats from the runtime failed");
                snap.scrape_error = true;
                return snap;
            }
        };
        let sandbox_stats: HashMap<String, api::PodSandboxStats> = match self
            .runtime
            .list_sandbox_stats(sel)
            .await
        {
            Ok(list) => list
                .into_iter()
                .filter_map(|s| Some((s.attributes.as_ref()?.id.clone(), s)))
                .collect(),
            Err(e) => {
                tracing::debug!(error = %e, "no sandbox stats from the runtime; summing container stats");
                HashMap::new()
            }
        };
        let by_id: HashMap<&str, &api::ContainerStats> = stats
            .iter()
            .filter_map(|s| Some((s.attributes.as_ref()?.id.as_str(), s)))
            .collect();
        let mut seen = Vec::new();
        for sb in sandboxes
            .iter()
            .filter(|s| s.state == api::PodSandboxState::SandboxReady as i32)
        {
            let label = |k: &str| sb.labels.get(k).cloned().unwrap_or_default();
            let meta = sb.metadata.clone().unwrap_or_default();
            let mut pod = PodSample {
                name: if meta.name.is_empty() {
                    label(LABEL_POD_NAME)
                } else {
                    meta.name
                },
                namespace: if meta.namespace.is_empty() {
                    label(LABEL_POD_NAMESPACE)
                } else {
                    meta.namespace
                },
                uid: if meta.uid.is_empty() {
                    label(LABEL_POD_UID)
                } else {
                    meta.uid
                },
                start: kubeedge_shared::clock::from_unix_nanos(sb.created_at)
                    .unwrap_or(SystemTime::UNIX_EPOCH),
                containers: Vec::new(),
                cpu: None,
                memory: None,
            };
            let mut running: Vec<&api::Container> = containers
                .iter()
                .filter(|c| {
                    c.pod_sandbox_id == sb.id
                        && c.state == api::ContainerState::ContainerRunning as i32
                })
                .collect();
            running.sort_by_key(|c| container_name(c));
            for c in running {
                let s = by_id.get(c.id.as_str());
                pod.containers.push(ContainerSample {
                    name: container_name(c),
                    start: kubeedge_shared::clock::from_unix_nanos(c.created_at)
                        .unwrap_or(SystemTime::UNIX_EPOCH),
                    cpu: s.and_then(|s| self.cpu(&c.id, &s.cpu, &mut seen)),
                    memory: s.and_then(|s| memory(&s.memory)),
                    rootfs: s.and_then(|s| {
                        let w = s.writable_layer.as_ref()?;
                        Some((
                            kubeedge_shared::clock::from_unix_nanos(w.timestamp)
                                .unwrap_or_else(SystemTime::now),
                            value(&w.used_bytes)?,
                            value(&w.inodes_used),
                        ))
                    }),
                });
            }
            match sandbox_stats.get(&sb.id).and_then(|s| s.linux.as_ref()) {
                Some(l) if l.cpu.is_some() || l.memory.is_some() => {
                    pod.cpu = self.cpu(&sb.id, &l.cpu, &mut seen);
                    pod.memory = memory(&l.memory);
                }
                _ => pod.sum_containers(),
            }
            snap.pods.push(pod);
        }
        snap.pods
            .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        if let Ok(mut cache) = self.last_cpu.lock() {
            cache.retain(|id, _| seen.contains(id));
        }
        snap
    }
}

fn container_name(c: &api::Container) -> String {
    match c.metadata.as_ref() {
        Some(m) if !m.name.is_empty() => m.name.clone(),
        _ => c
            .labels
            .get(LABEL_CONTAINER_NAME)
            .cloned()
            .unwrap_or_default(),
    }
}

fn memory(m: &Option<api::MemoryUsage>) -> Option<Memory> {
    let m = m.as_ref()?;
    Some(Memory {
        time: kubeedge_shared::clock::from_unix_nanos(m.timestamp).unwrap_or_else(SystemTime::now),
        working_set: value(&m.working_set_bytes),
        usage: value(&m.usage_bytes),
        available: value(&m.available_bytes),
        rss: value(&m.rss_bytes),
        page_faults: value(&m.page_faults),
        major_page_faults: value(&m.major_page_faults),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_rates_need_a_recent_earlier_sample() {
        let s = 1_000_000_000i64;
        assert_eq!(nano_cores((0, 0), (s, 500_000_000)), Some(500_000_000));
        assert_eq!(
            nano_cores((s, 10), (2 * s, 2_000_000_010)),
            Some(2_000_000_000)
        );
        assert_eq!(nano_cores((s, 0), (s, 10)), None, "no time passed");
        assert_eq!(nano_cores((0, 10), (s, 5)), None, "counter went back");
        assert_eq!(nano_cores((0, 0), (200 * s, 5)), None, "too old");
    }
}
