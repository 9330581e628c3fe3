//! One reading of the node's, pods' and containers' usage, from which both `/stats/summary`
//! and `/metrics/resource` are written.

use super::host::FsUsage;
use super::summary;
use kubeedge_shared::clock::rfc3339;
use std::time::SystemTime;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cpu {
    pub time: SystemTime,
    pub usage_core_nanos: Option<u64>,
    pub usage_nano_cores: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Memory {
    pub time: SystemTime,
    pub working_set: Option<u64>,
    pub usage: Option<u64>,
    pub available: Option<u64>,
    pub rss: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NodeSample {
    pub name: String,
    pub boot: SystemTime,
    pub cpu: Option<Cpu>,
    pub memory: Option<Memory>,
    pub fs: Option<(SystemTime, FsUsage)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ContainerSample {
    pub name: String,
    pub start: SystemTime,
    pub cpu: Option<Cpu>,
    pub memory: Option<Memory>,
    /// Writable layer: when, bytes and inodes used.
    pub rootfs: Option<(SystemTime, u64, Option<u64>)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PodSample {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub start: SystemTime,
    pub containers: Vec<ContainerSample>,
    pub cpu: Option<Cpu>,
    pub memory: Option<Memory>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub node: NodeSample,
    pub pods: Vec<PodSample>,
    /// The runtime could not be asked (the kubelet's `scrape_error`).
    pub scrape_error: bool,
}

fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (x, None) | (None, x) => x,
    }
}

impl PodSample {
    /// Pod usage as the sum of its containers' (the kubelet's fallback without sandbox
    /// stats); the latest container sample time is the pod's.
    pub fn sum_containers(&mut self) {
        let mut cpu: Option<Cpu> = None;
        let mut mem: Option<Memory> = None;
        for c in &self.containers {
            if let Some(x) = c.cpu {
                cpu = Some(match cpu {
                    None => x,
                    Some(p) => Cpu {
                        time: p.time.max(x.time),
                        usage_core_nanos: add(p.usage_core_nanos, x.usage_core_nanos),
                        usage_nano_cores: add(p.usage_nano_cores, x.usage_nano_cores),
                    },
                });
            }
            if let Some(x) = c.memory {
                mem = Some(match mem {
                    None => x,
                    Some(p) => Memory {
                        time: p.time.max(x.time),
                        working_set: add(p.working_set, x.working_set),
                        usage: add(p.usage, x.usage),
                        available: add(p.available, x.available),
                        rss: add(p.rss, x.rss),
                        page_faults: add(p.page_faults, x.page_faults),
                        major_page_faults: add(p.major_page_faults, x.major_page_faults),
                    },
                });
            }
        }
        self.cpu = cpu;
        self.memory = mem;
    }
}

fn cpu_stats(c: &Cpu) -> summary::CpuStats {
    summary::CpuStats {
        time: rfc3339(c.time),
        usage_nano_cores: c.usage_nano_cores,
        usage_core_nano_seconds: c.usage_core_nanos,
    }
}

fn memory_stats(m: &Memory) -> summary::MemoryStats {
    summary::MemoryStats {
        time: rfc3339(m.time),
        available_bytes: m.available,
        usage_bytes: m.usage,
        working_set_bytes: m.working_set,
        rss_bytes: m.rss,
        page_faults: m.page_faults,
        major_page_faults: m.major_page_faults,
    }
}

impl Snapshot {
    /// The Summary API object; `only_cpu_and_memory` (the kubelet's query parameter) leaves
    /// out filesystems.
    pub fn to_summary(&self, only_cpu_and_memory: bool) -> summary::Summary {
        let n = &self.node;
        let fs =
            n.fs.as_ref()
                .filter(|_| !only_cpu_and_memory)
                .map(|(t, f)| summary::FsStats {
                    time: rfc3339(*t),
                    available_bytes: Some(f.available),
                    capacity_bytes: Some(f.capacity),
                    used_bytes: Some(f.used),
                    inodes_free: Some(f.inodes_free),
                    inodes: Some(f.inodes),
                    inodes_used: Some(f.inodes.saturating_sub(f.inodes_free)),
                });
        summary::Summary {
            node: summary::NodeStats {
                node_name: n.name.clone(),
                start_time: rfc3339(n.boot),
                cpu: n.cpu.as_ref().map(cpu_stats),
                memory: n.memory.as_ref().map(memory_stats),
                fs,
            },
            pods: self
                .pods
                .iter()
                .map(|p| summary::PodStats {
                    pod_ref: summary::PodReference {
                        name: p.name.clone(),
                        namespace: p.namespace.clone(),
                        uid: p.uid.clone(),
                    },
                    start_time: rfc3339(p.start),
                    containers: p
                        .containers
                        .iter()
                        .map(|c| summary::ContainerStats {
                            name: c.name.clone(),
                            start_time: rfc3339(c.start),
                            cpu: c.cpu.as_ref().map(cpu_stats),
                            memory: c.memory.as_ref().map(memory_stats),
                            rootfs: c.rootfs.filter(|_| !only_cpu_and_memory).map(
                                |(t, used, inodes)| summary::FsStats {
                                    time: rfc3339(t),
                                    used_bytes: Some(used),
                                    inodes_used: inodes,
                                    ..Default::default()
                                },
                            ),
                        })
                        .collect(),
                    cpu: p.cpu.as_ref().map(cpu_stats),
                    memory: p.memory.as_ref().map(memory_stats),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    pub fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    pub fn container(name: &str, cpu_ns: u64, ws: u64) -> ContainerSample {
        ContainerSample {
            name: name.into(),
            start: at(1_700_000_100),
            cpu: Some(Cpu {
                time: at(1_700_000_200),
                usage_core_nanos: Some(cpu_ns),
                usage_nano_cores: None,
            }),
            memory: Some(Memory {
                time: at(1_700_000_201),
                working_set: Some(ws),
                usage: Some(ws * 2),
                available: None,
                rss: None,
                page_faults: None,
                major_page_faults: None,
            }),
            rootfs: Some((at(1_700_000_202), 4096, Some(3))),
        }
    }

    #[test]
    fn pods_without_sandbox_stats_sum_their_containers() {
        let mut p = PodSample {
            name: "web".into(),
            namespace: "ns".into(),
            uid: "u".into(),
            start: at(1_700_000_000),
            containers: vec![container("a", 1_000, 10), container("b", 2_000, 20)],
            cpu: None,
            memory: None,
        };
        p.sum_containers();
        let cpu = p.cpu.unwrap();
        assert_eq!(
            (cpu.usage_core_nanos, cpu.usage_nano_cores),
            (Some(3_000), None)
        );
        let mem = p.memory.unwrap();
        assert_eq!((mem.working_set, mem.usage), (Some(30), Some(60)));
        assert_eq!(mem.time, at(1_700_000_201));
        let snap = Snapshot {
            node: NodeSample {
                name: "n".into(),
                boot: at(1_600_000_000),
                cpu: None,
                memory: None,
                fs: None,
            },
            pods: vec![p],
            scrape_error: false,
        };
        let full = serde_json::to_value(snap.to_summary(false)).unwrap();
        assert_eq!(
            full["pods"][0]["containers"][1]["rootfs"]["usedBytes"],
            4096
        );
        assert_eq!(full["pods"][0]["cpu"]["usageCoreNanoSeconds"], 3000);
        assert_eq!(full["node"]["startTime"], "2020-09-13T12:26:40Z");
        let lean = serde_json::to_value(snap.to_summary(true)).unwrap();
        assert!(lean["pods"][0]["containers"][1].get("rootfs").is_none());
    }
}
