//! Container log rotation (the kubelet's container log manager): a running container's log
//! file above `containerLogMaxSize` is renamed with a timestamp and the runtime is asked to
//! reopen it (`ReopenContainerLog`); at most `containerLogMaxFiles` files are kept per
//! container. An edge disk must not fill up with one chatty container's output.

use crate::cri::api;
use crate::cri::runtime::{LABEL_NODE, Runtime, RuntimeError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Rotates the logs of this node's running containers that grew past `max_size` bytes.
/// Returns how many were rotated.
pub async fn rotate(
    runtime: &Runtime,
    node: &str,
    max_size: u64,
    max_files: usize,
) -> Result<usize, RuntimeError> {
    if max_size == 0 {
        return Ok(0);
    }
    let selector = HashMap::from([(LABEL_NODE.to_string(), node.to_string())]);
    let mut rotated = 0;
    for c in runtime.list_containers(selector).await? {
        if c.state() != api::ContainerState::ContainerRunning {
            continue;
        }
        let Some(status) = runtime.container_status(&c.id).await? else {
            continue;
        };
        if status.log_path.is_empty() {
            continue;
        }
        let log = PathBuf::from(&status.log_path);
        let size = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        if size <= max_size {
            continue;
        }
        remove_excess(&log, max_files.max(2) - 2);
        let rotated_path = PathBuf::from(format!("{}.{}", log.display(), stamp()));
        if let Err(e) = std::fs::rename(&log, &rotated_path) {
            tracing::warn!(log = %log.display(), error = %e, "cannot rotate a container log");
            continue;
        }
        if let Err(e) = runtime.reopen_container_log(&c.id).await {
            // The runtime keeps writing to the renamed file: put it back — unless the call
            // did reopen after all (a timeout) and a new file is at the path already, which
            // a plain rename would replace, losing what the runtime writes there.
            match rename_no_replace(&rotated_path, &log) {
                Ok(()) => {
                    tracing::warn!(container = %c.id, error = %e, "ReopenContainerLog failed; log not rotated");
                    continue;
                }
                Err(re) if re.kind() == std::io::ErrorKind::AlreadyExists => {
                    tracing::info!(container = %c.id, error = %e, "ReopenContainerLog reported an error but the runtime reopened the log");
                }
                Err(re) => {
                    tracing::warn!(container = %c.id, error = %e, rename_error = %re, "ReopenContainerLog failed and the log could not be put back");
                    continue;
                }
            }
        }
        rotated += 1;
    }
    Ok(rotated)
}

/// `rename(from, to)` that fails with `AlreadyExists` instead of replacing `to`
/// (`renameat2(RENAME_NOREPLACE)`; where the filesystem lacks it, a check then a rename).
fn rename_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let cstr = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    };
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: two NUL-terminated paths that outlive the call; plain integer flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOSYS) => {
            if to.exists() {
                Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists))
            } else {
                std::fs::rename(from, to)
            }
        }
        _ => Err(err),
    }
}

/// The rotated files of `log` (`<log>.<stamp>`), oldest first.
pub fn rotated_files(log: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (log.parent(), log.file_name()) else {
        return Vec::new();
    };
    let prefix = format!("{}.", name.to_string_lossy());
    let mut old: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    // Stamps sort in time order.
    old.sort();
    old
}

/// Keeps the newest `keep` rotated files of `log`.
fn remove_excess(log: &Path, keep: usize) {
    let old = rotated_files(log);
    let excess = old.len().saturating_sub(keep);
    for p in old.into_iter().take(excess) {
        let _ = std::fs::remove_file(p);
    }
}

/// `20240501-120000.123456789`: sortable, unique enough for one container.
fn stamp() -> String {
    let now = SystemTime::now();
    let text = kubeedge_shared::clock::rfc3339(now);
    let nanos = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}.{nanos:09}",
        text.trim_end_matches('Z')
            .replace(['-', ':'], "")
            .replace('T', "-")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn putting_a_log_back_never_replaces_a_new_one() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("0.log");
        let rotated = tmp.path().join("0.log.20240101-000000.1");
        std::fs::write(&rotated, "old").unwrap();
        rename_no_replace(&rotated, &log).unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "old");
        std::fs::write(&rotated, "older").unwrap();
        let err = rename_no_replace(&rotated, &log).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "old", "untouched");
        assert!(rotated.exists());
    }

    #[test]
    fn only_the_newest_rotated_files_are_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("0.log");
        std::fs::write(&log, "current").unwrap();
        for s in [
            "20240101-000000.1",
            "20240101-000000.2",
            "20240102-000000.0",
        ] {
            std::fs::write(tmp.path().join(format!("0.log.{s}")), s).unwrap();
        }
        std::fs::write(tmp.path().join("1.log.20230101-000000.0"), "other").unwrap();
        remove_excess(&log, 2);
        let mut left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "0.log",
                "0.log.20240101-000000.2",
                "0.log.20240102-000000.0",
                "1.log.20230101-000000.0"
            ]
        );
        let s = stamp();
        assert_eq!(s.len(), "20240101-000000.000000000".len(), "{s}");
    }
}
