//! Local ephemeral storage, measured and enforced as the kubelet does
//! (`localStorageEviction`): a container's writable layer and logs against its
//! `ephemeral-storage` limit, a disk-backed emptyDir against its `sizeLimit`, and the pod's
//! whole use against the sum of its containers' limits. A pod over any of them is evicted at
//! once, whatever the node's pressure.

use crate::quantity;
use crate::spec::Pod;
use std::path::Path;

/// What one pod uses of local storage, with its limits.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodStorage {
    /// (container, writable layer + logs, limit).
    pub containers: Vec<(String, u64, Option<u64>)>,
    /// (volume, used, sizeLimit).
    pub empty_dirs: Vec<(String, u64, Option<u64>)>,
}

impl PodStorage {
    pub fn total(&self) -> u64 {
        self.containers.iter().map(|c| c.1).sum::<u64>()
            + self.empty_dirs.iter().map(|v| v.1).sum::<u64>()
    }

    /// The first limit exceeded, as the kubelet says it.
    pub fn violation(&self) -> Option<String> {
        for (name, used, limit) in &self.empty_dirs {
            if let Some(l) = limit
                && used > l
            {
                return Some(format!(
                    "Usage of EmptyDir volume \"{name}\" exceeds the limit \"{}\". ",
                    quantity_text(*l)
                ));
            }
        }
        for (name, used, limit) in &self.containers {
            if let Some(l) = limit
                && used > l
            {
                return Some(format!(
                    "Container {name} exceeded its local ephemeral storage limit \"{}\". ",
                    quantity_text(*l)
                ));
            }
        }
        let limits: Option<u64> = self
            .containers
            .iter()
            .map(|c| c.2)
            .try_fold(0u64, |acc, l| l.map(|l| acc.saturating_add(l)));
        if let Some(l) = limits
            && !self.containers.is_empty()
            && self.total() > l
        {
            return Some(format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                quantity_text(l)
            ));
        }
        None
    }
}

fn quantity_text(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{}Mi", bytes >> 20)
    } else if bytes.is_multiple_of(1024) {
        format!("{}Ki", bytes >> 10)
    } else {
        bytes.to_string()
    }
}

/// Bytes of the files below `dir` (symbolic links not followed; at most `MAX_ENTRIES`
/// entries looked at, so a directory of millions of files cannot stall the check).
pub fn du(dir: &Path) -> u64 {
    const MAX_ENTRIES: usize = 100_000;
    let mut total = 0u64;
    let mut seen = 0usize;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > MAX_ENTRIES {
                return total;
            }
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file() {
                total = total.saturating_add(meta.len());
            }
        }
    }
    total
}

/// The pod's local storage: `rootfs` by container (the runtime's writable-layer bytes),
/// logs under `log_dir` (`<container>/…`), emptyDirs under `pod_dir`.
pub fn measure(
    pod: &Pod,
    rootfs: &std::collections::HashMap<String, u64>,
    log_dir: &Path,
    pod_dir: &Path,
) -> PodStorage {
    let mut s = PodStorage::default();
    for c in pod.spec.containers.iter().chain(&pod.spec.init_containers) {
        let limit = c
            .resources
            .limits
            .get("ephemeral-storage")
            .and_then(quantity::from_json)
            .and_then(|q| quantity::parse_units(&q))
            .and_then(|v| u64::try_from(v).ok());
        let used = rootfs.get(&c.name).copied().unwrap_or(0) + du(&log_dir.join(&c.name));
        s.containers.push((c.name.clone(), used, limit));
    }
    for v in &pod.spec.volumes {
        let Some(ed) = &v.empty_dir else { continue };
        if ed.medium.as_deref() == Some("Memory") {
            continue;
        }
        let limit = ed
            .size_limit
            .as_ref()
            .and_then(quantity::from_json)
            .and_then(|q| quantity::parse_units(&q))
            .and_then(|v| u64::try_from(v).ok());
        let dir = pod_dir
            .join("volumes")
            .join("kubernetes.io~empty-dir")
            .join(&v.name);
        s.empty_dirs.push((v.name.clone(), du(&dir), limit));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_limit_is_checked_and_named_as_the_kubelet_names_it() {
        let over_dir = PodStorage {
            containers: vec![("main".into(), 1 << 20, None)],
            empty_dirs: vec![("scratch".into(), 20 << 20, Some(10 << 20))],
        };
        assert_eq!(
            over_dir.violation().unwrap(),
            "Usage of EmptyDir volume \"scratch\" exceeds the limit \"10Mi\". "
        );
        let over_container = PodStorage {
            containers: vec![("main".into(), 5 << 20, Some(4 << 20))],
            empty_dirs: vec![],
        };
        assert_eq!(
            over_container.violation().unwrap(),
            "Container main exceeded its local ephemeral storage limit \"4Mi\". "
        );
        let over_pod = PodStorage {
            containers: vec![("a".into(), 1 << 20, Some(2 << 20))],
            empty_dirs: vec![("scratch".into(), 2 << 20, None)],
        };
        assert_eq!(
            over_pod.violation().unwrap(),
            "Pod ephemeral local storage usage exceeds the total limit of containers 2Mi. "
        );
        let fine = PodStorage {
            containers: vec![("a".into(), 1 << 20, None)],
            empty_dirs: vec![("scratch".into(), 2 << 20, None)],
        };
        assert_eq!(fine.violation(), None);
    }

    #[test]
    fn usage_counts_logs_writable_layers_and_disk_backed_empty_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("logs");
        let pod_dir = dir.path().join("pod");
        std::fs::create_dir_all(logs.join("main")).unwrap();
        std::fs::write(logs.join("main/0.log"), vec![0u8; 3000]).unwrap();
        let ed = pod_dir.join("volumes/kubernetes.io~empty-dir/scratch/sub");
        std::fs::create_dir_all(&ed).unwrap();
        std::fs::write(ed.join("f"), vec![0u8; 5000]).unwrap();
        let pod = Pod::from_value(
            &json!({"metadata": {"name": "p", "namespace": "n", "uid": "u"},
            "spec": {"containers": [{"name": "main", "image": "x",
                "resources": {"limits": {"ephemeral-storage": "4Ki"}}}],
                "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}},
                            {"name": "ram", "emptyDir": {"medium": "Memory"}}]}}),
        )
        .unwrap();
        let rootfs = std::collections::HashMap::from([("main".to_string(), 2000u64)]);
        let s = measure(&pod, &rootfs, &logs, &pod_dir);
        assert_eq!(s.containers, vec![("main".to_string(), 5000, Some(4096))]);
        assert_eq!(
            s.empty_dirs,
            vec![("scratch".to_string(), 5000, Some(1 << 20))]
        );
        assert!(s.violation().unwrap().contains("Container main exceeded"));
    }
}
