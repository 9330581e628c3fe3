//! The cgroup filesystem, v1 (a hierarchy per controller, `/sys/fs/cgroup/<controller>/…`) or
//! v2 (one unified hierarchy), rooted at a directory so that tests can use a recorded
//! hierarchy in a temporary directory. Only what pod cgroups need: create a cgroup with CPU,
//! memory and PID limits, remove it, list its children.

use std::io;
use std::path::{Path, PathBuf};

/// Limits of one cgroup (`None`: unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    pub cpu_shares: Option<u64>,
    /// With a period of [`super::qos::CPU_PERIOD_US`]; `None` writes "no quota".
    pub cpu_quota_us: Option<u64>,
    pub memory: Option<u64>,
    pub pids: Option<u64>,
}

/// The v2 hierarchy of a hybrid (v1) mount, which pod cgroups do not use.
const HYBRID_UNIFIED: &str = "unified";
/// v2 controllers enabled for children.
const V2_CONTROLLERS: &str = "+cpu +memory +pids";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    V1 {
        root: PathBuf,
        /// Every mounted hierarchy (as the kubelet, pod cgroups are made in all of them, so
        /// that none is left behind when the runtime made one there).
        controllers: Vec<String>,
    },
    V2 {
        root: PathBuf,
    },
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("writing {value:?} to {}: {e}", path.display()),
        )
    })
}

/// `cpu.weight` (v2, 1–10000) for `cpu.shares` (v1, 2–262144), as runc converts it.
pub fn shares_to_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    1 + (shares.clamp(2, 262_144) - 2) * 9999 / 262_142
}

impl Hierarchy {
    /// What is mounted at `root` (`/sys/fs/cgroup`): v2 when the root holds
    /// `cgroup.controllers`, else the v1 controllers found. `None` without either.
    pub fn detect(root: &Path) -> Option<Hierarchy> {
        if root.join("cgroup.controllers").is_file() {
            return Some(Hierarchy::V2 {
                root: root.to_path_buf(),
            });
        }
        let mut controllers: Vec<String> = std::fs::read_dir(root)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|c| c != HYBRID_UNIFIED && root.join(c).join("cgroup.procs").is_file())
                    .collect()
            })
            .unwrap_or_default();
        controllers.sort();
        (!controllers.is_empty()).then(|| Hierarchy::V1 {
            root: root.to_path_buf(),
            controllers,
        })
    }

    pub fn version(&self) -> u8 {
        match self {
            Hierarchy::V1 { .. } => 1,
            Hierarchy::V2 { .. } => 2,
        }
    }

    /// The directories of cgroup `rel` (one per v1 controller).
    pub fn dirs(&self, rel: &Path) -> Vec<PathBuf> {
        match self {
            Hierarchy::V1 { root, controllers } => {
                controllers.iter().map(|c| root.join(c).join(rel)).collect()
            }
            Hierarchy::V2 { root } => vec![root.join(rel)],
        }
    }

    /// Creates cgroup `rel` (and its parents) and sets `limits` (idempotent).
    pub fn ensure(&self, rel: &Path, limits: &Limits) -> io::Result<()> {
        match self {
            Hierarchy::V1 { root, controllers } => {
                for c in controllers {
                    let dir = root.join(c).join(rel);
                    if c == "cpuset" {
                        ensure_cpuset(&root.join(c), rel)?;
                    } else {
                        std::fs::create_dir_all(&dir)?;
                    }
                }
                let has = |c: &str| controllers.iter().any(|x| x == c);
                let cpu = root.join("cpu").join(rel);
                if has("cpu") {
                    if let Some(s) = limits.cpu_shares {
                        write(&cpu.join("cpu.shares"), &s.to_string())?;
                    }
                    write(
                        &cpu.join("cpu.cfs_period_us"),
                        &super::qos::CPU_PERIOD_US.to_string(),
                    )?;
                    let quota = limits
                        .cpu_quota_us
                        .map_or_else(|| "-1".to_string(), |q| q.to_string());
                    write(&cpu.join("cpu.cfs_quota_us"), &quota)?;
                }
                if has("memory") {
                    let mem = limits.memory.map_or_else(|| "-1".into(), |m| m.to_string());
                    write(
                        &root.join("memory").join(rel).join("memory.limit_in_bytes"),
                        &mem,
                    )?;
                }
                if has("pids") {
                    let pids = limits.pids.map_or_else(|| "max".into(), |p| p.to_string());
                    write(&root.join("pids").join(rel).join("pids.max"), &pids)?;
                }
                Ok(())
            }
            Hierarchy::V2 { root } => {
                // Controllers are handed down from the root, level by level.
                let mut at = root.clone();
                for component in rel.components() {
                    let _ = write(&at.join("cgroup.subtree_control"), V2_CONTROLLERS);
                    at.push(component);
                    std::fs::create_dir_all(&at)?;
                }
                if let Some(s) = limits.cpu_shares {
                    write(&at.join("cpu.weight"), &shares_to_weight(s).to_string())?;
                }
                let quota = limits
                    .cpu_quota_us
                    .map_or_else(|| "max".to_string(), |q| q.to_string());
                write(
                    &at.join("cpu.max"),
                    &format!("{quota} {}", super::qos::CPU_PERIOD_US),
                )?;
                let mem = limits
                    .memory
                    .map_or_else(|| "max".into(), |m| m.to_string());
                write(&at.join("memory.max"), &mem)?;
                let pids = limits.pids.map_or_else(|| "max".into(), |p| p.to_string());
                write(&at.join("pids.max"), &pids)?;
                Ok(())
            }
        }
    }

    /// Removes cgroup `rel` where it is empty; true when it is gone everywhere.
    pub fn remove(&self, rel: &Path) -> bool {
        let mut gone = true;
        for dir in self.dirs(rel) {
            match std::fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::debug!(cgroup = %dir.display(), error = %e, "cgroup not removed");
                    gone = false;
                }
            }
        }
        gone
    }

    /// The child cgroups of `rel` (names), as the memory (v1) or unified (v2) hierarchy has
    /// them.
    pub fn children(&self, rel: &Path) -> Vec<String> {
        let dir = match self {
            Hierarchy::V1 { root, controllers } => {
                let c = controllers
                    .iter()
                    .find(|c| *c == "memory")
                    .or(controllers.first())
                    .map_or("memory", String::as_str);
                root.join(c).join(rel)
            }
            Hierarchy::V2 { root } => root.join(rel),
        };
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A v1 cpuset cgroup is unusable until `cpuset.cpus` and `cpuset.mems` are set: each new
/// level copies its parent's, as the kubelet (libcontainer) does.
fn ensure_cpuset(base: &Path, rel: &Path) -> io::Result<()> {
    let mut at = base.to_path_buf();
    for component in rel.components() {
        let parent = at.clone();
        at.push(component);
        if !at.is_dir() {
            std::fs::create_dir_all(&at)?;
        }
        for f in ["cpuset.cpus", "cpuset.mems"] {
            let mine = std::fs::read_to_string(at.join(f)).unwrap_or_default();
            if mine.trim().is_empty() {
                let theirs = std::fs::read_to_string(parent.join(f)).unwrap_or_default();
                if !theirs.trim().is_empty() {
                    write(&at.join(f), theirs.trim())?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod recorded {
    //! Recorded hierarchies in a temporary directory: the files the kernel would show
    //! (regular files stand in for the kernel's, so writes can be read back).
    use std::path::Path;

    pub fn v1(root: &Path) {
        for c in ["cpu", "cpuacct", "cpuset", "memory", "pids"] {
            std::fs::create_dir_all(root.join(c)).unwrap();
            std::fs::write(root.join(c).join("cgroup.procs"), "").unwrap();
        }
        std::fs::write(root.join("cpuset/cpuset.cpus"), "0-3\n").unwrap();
        std::fs::write(root.join("cpuset/cpuset.mems"), "0\n").unwrap();
    }

    pub fn v2(root: &Path) {
        std::fs::create_dir_all(root).unwrap();
        std::fs::write(
            root.join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .unwrap();
        std::fs::write(root.join("cgroup.subtree_control"), "").unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(p: PathBuf) -> String {
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .to_string()
    }

    #[test]
    fn v1_limits_go_to_each_controller_and_cpusets_inherit() {
        let dir = tempfile::tempdir().unwrap();
        recorded::v1(dir.path());
        let h = Hierarchy::detect(dir.path()).unwrap();
        assert_eq!(h.version(), 1);
        let rel = Path::new("kubepods/burstable/podu1");
        h.ensure(
            rel,
            &Limits {
                cpu_shares: Some(512),
                cpu_quota_us: Some(50_000),
                memory: Some(64 << 20),
                pids: Some(100),
            },
        )
        .unwrap();
        let r = dir.path();
        assert_eq!(read(r.join("cpu").join(rel).join("cpu.shares")), "512");
        assert_eq!(
            read(r.join("cpu").join(rel).join("cpu.cfs_quota_us")),
            "50000"
        );
        assert_eq!(
            read(r.join("memory").join(rel).join("memory.limit_in_bytes")),
            "67108864"
        );
        assert_eq!(read(r.join("pids").join(rel).join("pids.max")), "100");
        assert_eq!(read(r.join("cpuset").join(rel).join("cpuset.cpus")), "0-3");
        assert_eq!(read(r.join("cpuset/kubepods/cpuset.mems")), "0");
        assert!(r.join("cpuacct").join(rel).is_dir());
        // Unlimited again.
        h.ensure(rel, &Limits::default()).unwrap();
        assert_eq!(
            read(r.join("memory").join(rel).join("memory.limit_in_bytes")),
            "-1"
        );
        assert_eq!(read(r.join("cpu").join(rel).join("cpu.cfs_quota_us")), "-1");
        assert_eq!(h.children(Path::new("kubepods/burstable")), ["podu1"]);
    }

    #[test]
    fn v2_limits_use_the_unified_files_and_enable_controllers_down_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        recorded::v2(dir.path());
        let h = Hierarchy::detect(dir.path()).unwrap();
        assert_eq!(h.version(), 2);
        let rel = Path::new("kubepods/podu2");
        h.ensure(
            rel,
            &Limits {
                cpu_shares: Some(1024),
                cpu_quota_us: Some(100_000),
                memory: Some(1 << 30),
                pids: None,
            },
        )
        .unwrap();
        let at = dir.path().join(rel);
        assert_eq!(read(at.join("cpu.weight")), "39");
        assert_eq!(read(at.join("cpu.max")), "100000 100000");
        assert_eq!(read(at.join("memory.max")), "1073741824");
        assert_eq!(read(at.join("pids.max")), "max");
        assert_eq!(
            read(dir.path().join("cgroup.subtree_control")),
            V2_CONTROLLERS
        );
        assert_eq!(
            read(dir.path().join("kubepods/cgroup.subtree_control")),
            V2_CONTROLLERS
        );
        h.ensure(rel, &Limits::default()).unwrap();
        assert_eq!(read(at.join("cpu.max")), "max 100000");
        assert_eq!(read(at.join("memory.max")), "max");
    }

    #[test]
    fn weights_follow_runcs_conversion() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
    }

    #[test]
    fn nothing_mounted_is_no_hierarchy() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Hierarchy::detect(dir.path()), None);
    }
}
