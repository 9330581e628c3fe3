//! Container lifecycle hooks: `postStart` right after a container starts (a failure kills
//! it, and it restarts per the restart policy), `preStop` before a container is stopped,
//! inside its grace period. Handlers: `exec` (through `ExecSync`), `httpGet`, `sleep`.

use super::probes::{http_get, resolve_port};
use super::spec::{Container, LifecycleHandler};
use crate::cri::runtime::Runtime;
use std::time::{Duration, Instant};

/// The kubelet never stops a container with less than this after a preStop hook.
pub const MIN_GRACE_AFTER_HOOK: Duration = Duration::from_secs(2);

/// Runs one handler within `timeout`.
pub async fn run_handler(
    h: &LifecycleHandler,
    c: &Container,
    id: &str,
    host: &str,
    timeout: Duration,
    runtime: &Runtime,
) -> Result<(), String> {
    let work = async {
        if let Some(exec) = &h.exec {
            let r = runtime
                .exec_sync(id, exec.command.clone(), timeout)
                .await
                .map_err(|e| e.to_string())?;
            if r.exit_code != 0 {
                return Err(format!(
                    "command {:?} exited with {}: {}",
                    exec.command,
                    r.exit_code,
                    String::from_utf8_lossy(&r.stderr).trim()
                ));
            }
            return Ok(());
        }
        if let Some(get) = &h.http_get {
            let port = resolve_port(&get.port, c)?;
            let host = get
                .host
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| host.to_string());
            return http_get(&host, port, get).await;
        }
        if let Some(sleep) = &h.sleep {
            tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64)).await;
            return Ok(());
        }
        // tcpSocket handlers are accepted by the API and never run (as in the kubelet).
        Ok(())
    };
    tokio::time::timeout(timeout, work)
        .await
        .unwrap_or_else(|_| Err(format!("did not finish within {timeout:?}")))
}

/// Runs the container's preStop hook (if any) within `grace`; returns the grace left for
/// the stop itself.
pub async fn pre_stop(
    c: Option<&Container>,
    id: &str,
    host: &str,
    grace: Duration,
    runtime: &Runtime,
) -> Duration {
    let Some((c, h)) = c.and_then(|c| c.lifecycle.as_ref()?.pre_stop.as_ref().map(|h| (c, h)))
    else {
        return grace;
    };
    let started = Instant::now();
    if let Err(e) = run_handler(h, c, id, host, grace, runtime).await {
        tracing::warn!(container = %c.name, error = %e, "preStop hook failed");
    }
    grace
        .saturating_sub(started.elapsed())
        .max(MIN_GRACE_AFTER_HOOK.min(grace))
}
