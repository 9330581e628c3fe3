//! [`Containerd::reboot`]: what a machine restart does to the runtime, without restarting the
//! machine.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kubeedge_edged::cri::{CriClient, api};

use super::{
    CRI_NAMESPACE, Containerd, HarnessError, SOCKET_TIMEOUT, block_on_fresh_runtime, cleanup_netns,
    io_error, spawn_containerd,
};
use crate::process;

/// Where runc v2 shims keep runc's state of a namespace's containers (a tmpfs in real life).
const RUNC_ROOT: &str = "/run/containerd/runc";

/// What containerd's state directory says about one task.
struct Bundle {
    id: String,
    /// The shim's socket, `/run/containerd/s/<hash>`.
    shim_socket: Option<PathBuf>,
    /// The network namespace a pod sandbox joined (`/var/run/netns/cni-…`).
    netns: Option<PathBuf>,
}

impl Containerd {
    /// Simulates a machine reboot for the runtime: containerd, every shim and every container
    /// are killed at once (SIGKILL: nothing is stopped cleanly), then what a reboot clears goes —
    /// containerd's `state` directory (tasks, bundles, rootfs mounts), runc's state and the shim
    /// sockets of those tasks, the pods' network namespaces, every mount under the instance
    /// directory (overlays, `/dev/shm` of sandboxes) — and containerd starts again on the same
    /// root. CRI then finds its sandboxes (NotReady) and containers (Exited) in its metadata,
    /// with no process behind them, as after a real reboot. Blocking.
    pub fn reboot(&self) -> Result<(), HarnessError> {
        let started = Instant::now();
        let mut guard = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let running = guard.as_mut().ok_or_else(|| HarnessError::Io {
            context: "rebooting containerd".into(),
            source: std::io::Error::other("the instance is shut down"),
        })?;
        let state = self.dir.join("state");
        let bundles = bundles(&state);
        // Power off: everything dies at once.
        process::signal(running.containerd.id() as i32, libc::SIGKILL);
        let _ = running.containerd.wait();
        let killed = process::kill_process_trees_mentioning(&self.socket.display().to_string());
        // tmpfs contents are gone after a reboot.
        let stuck = process::unmount_all_under(&self.dir);
        if !stuck.is_empty() {
            tracing::warn!(?stuck, "mounts could not be unmounted");
        }
        for b in &bundles {
            let _ = std::fs::remove_dir_all(Path::new(RUNC_ROOT).join(CRI_NAMESPACE).join(&b.id));
            if let Some(socket) = &b.shim_socket {
                let _ = std::fs::remove_file(socket);
            }
            if let Some(netns) = &b.netns {
                cleanup_netns(netns);
            }
        }
        std::fs::remove_dir_all(&state).map_err(io_error("removing containerd's state"))?;
        let _ = std::fs::remove_file(&self.socket);
        // Power on.
        running.containerd = spawn_containerd(&self.dir)?;
        drop(guard);
        self.wait_for_socket()?;
        self.wait_for_cri()?;
        tracing::info!(
            tasks = bundles.len(),
            processes_killed = killed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "containerd rebooted"
        );
        Ok(())
    }
}

impl Containerd {
    /// CRI answers `server is not initialized yet` for a moment after the socket is up.
    fn wait_for_cri(&self) -> Result<(), HarnessError> {
        let endpoint = self.endpoint();
        block_on_fresh_runtime(async move {
            let cri = CriClient::connect(&endpoint)
                .await
                .map_err(|e| HarnessError::Cri(e.to_string()))?;
            let deadline = Instant::now() + SOCKET_TIMEOUT;
            loop {
                let listed = cri
                    .runtime()
                    .list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
                    .await;
                match listed {
                    Ok(_) => return Ok(()),
                    Err(e) if Instant::now() > deadline => {
                        return Err(HarnessError::Cri(format!(
                            "CRI not serving after the reboot: {e}"
                        )));
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        })
    }
}

/// The tasks of CRI's namespace in containerd's state directory.
fn bundles(state: &Path) -> Vec<Bundle> {
    let dir = state
        .join("io.containerd.runtime.v2.task")
        .join(CRI_NAMESPACE);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| {
            let path = e.path();
            let shim_socket = std::fs::read_to_string(path.join("address"))
                .ok()
                .and_then(|a| a.trim().strip_prefix("unix://").map(PathBuf::from));
            let netns = std::fs::read(path.join("config.json"))
                .ok()
                .and_then(|raw| serde_json::from_slice::<serde_json::Value>(&raw).ok())
                .and_then(|spec| {
                    spec["linux"]["namespaces"]
                        .as_array()?
                        .iter()
                        .find(|n| n["type"] == "network")?["path"]
                        .as_str()
                        .filter(|p| p.contains("/netns/"))
                        .map(PathBuf::from)
                });
            Bundle {
                id: e.file_name().to_string_lossy().into_owned(),
                shim_socket,
                netns,
            }
        })
        .collect()
}
