//! Cgroup names as the kubelet gives them: a list of components (`kubepods`, `burstable`,
//! `pod<uid>`) under `cgroupRoot`, written for the cgroupfs driver as a path
//! (`/kubepods/burstable/pod<uid>`) and for the systemd driver as nested slices
//! (`/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice`).

use super::qos::QosClass;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Cgroupfs,
    Systemd,
}

/// A cgroup by its components (below the hierarchy's root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupName(pub Vec<String>);

/// The node-level cgroup of pods (`kubepods`).
pub const PODS: &str = "kubepods";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Naming {
    pub driver: Driver,
    /// `cgroupRoot`'s components (empty for `/`).
    pub root: Vec<String>,
}

impl Naming {
    pub fn new(driver: Driver, cgroup_root: &str) -> Naming {
        Naming {
            driver,
            root: cgroup_root
                .split('/')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect(),
        }
    }

    /// `kubepods`.
    pub fn pods(&self) -> CgroupName {
        let mut v = self.root.clone();
        v.push(PODS.into());
        CgroupName(v)
    }

    /// The QoS class's cgroup (Guaranteed pods live directly in `kubepods`).
    pub fn qos(&self, qos: QosClass) -> CgroupName {
        let mut n = self.pods();
        match qos {
            QosClass::Guaranteed => {}
            QosClass::Burstable => n.0.push("burstable".into()),
            QosClass::BestEffort => n.0.push("besteffort".into()),
        }
        n
    }

    /// The pod's cgroup.
    pub fn pod(&self, qos: QosClass, uid: &str) -> CgroupName {
        let mut n = self.qos(qos);
        n.0.push(format!("pod{uid}"));
        n
    }

    /// The path below a hierarchy's root (also what the runtime gets as `cgroup_parent`,
    /// with a leading `/`).
    pub fn relative(&self, name: &CgroupName) -> PathBuf {
        match self.driver {
            Driver::Cgroupfs => name.0.iter().collect(),
            Driver::Systemd => {
                // Each level is a slice named after all components so far; `-` separates
                // them, so a `-` inside one is written `_`.
                let mut path = PathBuf::new();
                let mut prefix = String::new();
                for c in &name.0 {
                    let escaped = c.replace('-', "_");
                    if !prefix.is_empty() {
                        prefix.push('-');
                    }
                    prefix.push_str(&escaped);
                    path.push(format!("{prefix}.slice"));
                }
                path
            }
        }
    }

    /// `cgroup_parent` for the CRI runtime.
    pub fn cri_parent(&self, name: &CgroupName) -> String {
        format!("/{}", self.relative(name).display())
    }
}

/// The pod UID of a pod cgroup's last path element (`pod<uid>`, or the systemd slice
/// `…-pod<uid with _>.slice`).
pub fn pod_uid_of(element: &str, driver: Driver) -> Option<String> {
    match driver {
        Driver::Cgroupfs => element.strip_prefix("pod").map(str::to_string),
        Driver::Systemd => {
            let stem = element.strip_suffix(".slice")?;
            let last = stem.rsplit('-').next()?;
            last.strip_prefix("pod").map(|u| u.replace('_', "-"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroupfs_names_are_paths_under_the_cgroup_root() {
        let n = Naming::new(Driver::Cgroupfs, "/");
        let uid = "5f3c-9a";
        assert_eq!(
            n.cri_parent(&n.pod(QosClass::Burstable, uid)),
            "/kubepods/burstable/pod5f3c-9a"
        );
        assert_eq!(
            n.cri_parent(&n.pod(QosClass::Guaranteed, uid)),
            "/kubepods/pod5f3c-9a"
        );
        assert_eq!(
            n.cri_parent(&n.qos(QosClass::BestEffort)),
            "/kubepods/besteffort"
        );
        let rooted = Naming::new(Driver::Cgroupfs, "/edge/test-1");
        assert_eq!(
            rooted.cri_parent(&rooted.pod(QosClass::BestEffort, uid)),
            "/edge/test-1/kubepods/besteffort/pod5f3c-9a"
        );
        assert_eq!(
            pod_uid_of("pod5f3c-9a", Driver::Cgroupfs).as_deref(),
            Some("5f3c-9a")
        );
        assert_eq!(pod_uid_of("burstable", Driver::Cgroupfs), None);
    }

    #[test]
    fn systemd_names_are_nested_slices_with_dashes_escaped() {
        let n = Naming::new(Driver::Systemd, "/");
        let uid = "5f3c-9a";
        assert_eq!(
            n.cri_parent(&n.pod(QosClass::Burstable, uid)),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5f3c_9a.slice"
        );
        assert_eq!(
            n.cri_parent(&n.pod(QosClass::Guaranteed, uid)),
            "/kubepods.slice/kubepods-pod5f3c_9a.slice"
        );
        assert_eq!(
            pod_uid_of("kubepods-burstable-pod5f3c_9a.slice", Driver::Systemd).as_deref(),
            Some("5f3c-9a")
        );
        assert_eq!(
            pod_uid_of("kubepods-burstable.slice", Driver::Systemd),
            None
        );
    }
}
