//! Pod cgroups and QoS classes as the kubelet makes them (`cgroupsPerQOS`): a node-level
//! `kubepods` cgroup limited to what pods may use (`enforceNodeAllocatable: [pods]`: capacity
//! minus `systemReserved` and `kubeReserved`), `burstable` and `besteffort` below it, and a
//! `pod<uid>` cgroup per pod with the pod's CPU shares and quota, memory limit and PID limit;
//! the runtime puts the pod's sandbox and containers inside (the sandbox's `cgroup_parent`).
//! Pod cgroups go when their pod goes, and those of pods this node no longer has are removed
//! at start-up. cgroupfs and systemd naming, cgroup v1 and v2 (`fs`).

pub(crate) mod fs;
pub(crate) mod naming;
pub use naming::Driver;
pub(crate) mod qos;

use crate::spec::Pod;
use fs::{Hierarchy, Limits};
use naming::Naming;
use qos::QosClass;
use std::collections::HashSet;
use std::path::PathBuf;

/// How edged manages cgroups (from `tailoredKubeletConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupSettings {
    /// `cgroupsPerQOS`: off leaves cgroups to the runtime (no parent, as before).
    pub per_qos: bool,
    pub driver: Driver,
    /// `cgroupRoot`.
    pub root: String,
    /// `enforceNodeAllocatable` contains `pods`.
    pub enforce_pods_allocatable: bool,
    /// `podPidsLimit` (≤ 0: none).
    pub pod_pids_limit: i64,
    /// Where the cgroup filesystem is mounted (`/sys/fs/cgroup`).
    pub mount: PathBuf,
}

impl Default for CgroupSettings {
    fn default() -> Self {
        CgroupSettings {
            per_qos: true,
            driver: Driver::Cgroupfs,
            root: "/".into(),
            enforce_pods_allocatable: true,
            pod_pids_limit: -1,
            mount: PathBuf::from("/sys/fs/cgroup"),
        }
    }
}

/// The node's pod cgroups.
pub struct PodCgroups {
    settings: CgroupSettings,
    naming: Naming,
    /// `None`: no cgroup filesystem (or `cgroupsPerQOS` off): pods get no cgroup parent.
    fs: Option<Hierarchy>,
}

const QOS_CLASSES: [QosClass; 3] = [
    QosClass::Guaranteed,
    QosClass::Burstable,
    QosClass::BestEffort,
];

impl PodCgroups {
    pub fn new(settings: CgroupSettings) -> PodCgroups {
        let fs = if settings.per_qos {
            let h = Hierarchy::detect(&settings.mount);
            if h.is_none() {
                tracing::warn!(mount = %settings.mount.display(), "no cgroup filesystem found; pods get no pod cgroups (cgroupsPerQOS)");
            }
            h
        } else {
            None
        };
        PodCgroups {
            naming: Naming::new(settings.driver, &settings.root),
            settings,
            fs,
        }
    }

    #[cfg(test)]
    pub fn enabled(&self) -> bool {
        self.fs.is_some()
    }

    /// The cgroup version in use (for logs and tests).
    pub fn version(&self) -> Option<u8> {
        self.fs.as_ref().map(Hierarchy::version)
    }

    /// The `kubepods` cgroup and the QoS cgroups, `kubepods` limited to what pods may use
    /// (`allocatable_memory`, `allocatable_cpu_milli`) when `enforceNodeAllocatable` says
    /// `pods`.
    pub fn setup_node(&self, allocatable_cpu_milli: i128, allocatable_memory: i128) {
        let Some(fs) = &self.fs else { return };
        let pods = if self.settings.enforce_pods_allocatable {
            Limits {
                cpu_shares: Some(qos::milli_cpu_to_shares(allocatable_cpu_milli)),
                memory: u64::try_from(allocatable_memory).ok().filter(|m| *m > 0),
                ..Limits::default()
            }
        } else {
            Limits::default()
        };
        let steps = [
            (self.naming.pods(), pods),
            (self.naming.qos(QosClass::Burstable), Limits::default()),
            (
                self.naming.qos(QosClass::BestEffort),
                Limits {
                    cpu_shares: Some(qos::MIN_SHARES),
                    ..Limits::default()
                },
            ),
        ];
        for (name, limits) in steps {
            if let Err(e) = fs.ensure(&self.naming.relative(&name), &limits) {
                tracing::warn!(cgroup = %self.naming.cri_parent(&name), error = %e, "QoS cgroup not set up");
            }
        }
    }

    /// The pod's cgroup (`cgroup_parent` for the runtime); empty without pod cgroups.
    pub fn pod_parent(&self, pod: &Pod) -> String {
        if self.fs.is_none() {
            return String::new();
        }
        let name = self.naming.pod(qos::qos_class(pod), &pod.metadata.uid);
        self.naming.cri_parent(&name)
    }

    /// Creates (or updates) the pod's cgroup with its limits, before its sandbox starts.
    pub fn ensure_pod(&self, pod: &Pod) -> Result<(), String> {
        let Some(fs) = &self.fs else { return Ok(()) };
        let r = qos::pod_resources(pod, self.settings.pod_pids_limit);
        let name = self.naming.pod(qos::qos_class(pod), &pod.metadata.uid);
        let limits = Limits {
            cpu_shares: Some(r.cpu_shares),
            cpu_quota_us: r.cpu_quota_us,
            memory: r.memory_limit,
            pids: r.pids_limit,
        };
        fs.ensure(&self.naming.relative(&name), &limits)
            .map_err(|e| format!("pod cgroup {}: {e}", self.naming.cri_parent(&name)))
    }

    /// Removes the pod's cgroup (once its sandbox and containers are gone); true when gone.
    pub fn remove_pod(&self, uid: &str) -> bool {
        let Some(fs) = &self.fs else { return true };
        let mut gone = true;
        for q in QOS_CLASSES {
            let rel = self.naming.relative(&self.naming.pod(q, uid));
            if fs.dirs(&rel).iter().any(|d| d.exists()) {
                gone &= fs.remove(&rel);
            }
        }
        gone
    }

    /// Removes the (empty) pod cgroups of pods not in `keep`; returns how many went.
    pub fn remove_unknown(&self, keep: &HashSet<String>) -> usize {
        let Some(fs) = &self.fs else { return 0 };
        let mut removed = 0;
        for q in QOS_CLASSES {
            let parent = self.naming.relative(&self.naming.qos(q));
            for child in fs.children(&parent) {
                let Some(uid) = naming::pod_uid_of(&child, self.settings.driver) else {
                    continue;
                };
                if keep.contains(&uid) {
                    continue;
                }
                if fs.remove(&parent.join(&child)) {
                    removed += 1;
                }
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str, limits: serde_json::Value) -> Pod {
        Pod::from_value(
            &json!({"metadata": {"name": "p", "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": "c", "image": "x",
                "resources": {"limits": limits}}]}}),
        )
        .unwrap()
    }

    fn read(p: PathBuf) -> String {
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .to_string()
    }

    #[test]
    fn pods_get_cgroups_by_qos_on_a_recorded_v1_hierarchy() {
        let dir = tempfile::tempdir().unwrap();
        fs::recorded::v1(dir.path());
        let cg = PodCgroups::new(CgroupSettings {
            mount: dir.path().into(),
            pod_pids_limit: 256,
            ..CgroupSettings::default()
        });
        assert_eq!(cg.version(), Some(1));
        cg.setup_node(1500, 2 << 30);
        let r = dir.path();
        assert_eq!(
            read(r.join("memory/kubepods/memory.limit_in_bytes")),
            "2147483648"
        );
        assert_eq!(read(r.join("cpu/kubepods/cpu.shares")), "1536");
        assert_eq!(read(r.join("cpu/kubepods/besteffort/cpu.shares")), "2");
        let g = pod("g-1", json!({"cpu": "500m", "memory": "64Mi"}));
        assert_eq!(cg.pod_parent(&g), "/kubepods/podg-1");
        cg.ensure_pod(&g).unwrap();
        assert_eq!(
            read(r.join("memory/kubepods/podg-1/memory.limit_in_bytes")),
            "67108864"
        );
        assert_eq!(
            read(r.join("cpu/kubepods/podg-1/cpu.cfs_quota_us")),
            "50000"
        );
        assert_eq!(read(r.join("cpu/kubepods/podg-1/cpu.shares")), "512");
        assert_eq!(read(r.join("pids/kubepods/podg-1/pids.max")), "256");
        let be = pod("b-1", json!({}));
        assert_eq!(cg.pod_parent(&be), "/kubepods/besteffort/podb-1");
        cg.ensure_pod(&be).unwrap();
        assert_eq!(
            read(r.join("cpu/kubepods/besteffort/podb-1/cpu.shares")),
            "2"
        );
        assert_eq!(
            read(r.join("memory/kubepods/besteffort/podb-1/memory.limit_in_bytes")),
            "-1"
        );
    }

    #[test]
    fn pods_get_cgroups_on_a_recorded_v2_hierarchy_with_systemd_names() {
        let dir = tempfile::tempdir().unwrap();
        fs::recorded::v2(dir.path());
        let cg = PodCgroups::new(CgroupSettings {
            mount: dir.path().into(),
            driver: Driver::Systemd,
            ..CgroupSettings::default()
        });
        assert_eq!(cg.version(), Some(2));
        cg.setup_node(2000, 1 << 30);
        let b = pod("a-b", json!({"memory": "128Mi"}));
        assert_eq!(
            cg.pod_parent(&b),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda_b.slice"
        );
        cg.ensure_pod(&b).unwrap();
        let at = dir
            .path()
            .join("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda_b.slice");
        assert_eq!(read(at.join("memory.max")), "134217728");
        assert_eq!(read(at.join("cpu.max")), "max 100000");
        assert_eq!(
            read(dir.path().join("kubepods.slice/memory.max")),
            "1073741824"
        );
    }

    #[test]
    fn without_pod_cgroups_the_runtime_chooses() {
        let cg = PodCgroups::new(CgroupSettings {
            per_qos: false,
            ..CgroupSettings::default()
        });
        assert!(!cg.enabled());
        let p = pod("x", json!({}));
        assert_eq!(cg.pod_parent(&p), "");
        assert!(cg.ensure_pod(&p).is_ok());
        assert!(cg.remove_pod("x"));
        let dir = tempfile::tempdir().unwrap();
        let none = PodCgroups::new(CgroupSettings {
            mount: dir.path().into(),
            ..CgroupSettings::default()
        });
        assert!(!none.enabled(), "no cgroup filesystem: no pod cgroups");
    }
}
