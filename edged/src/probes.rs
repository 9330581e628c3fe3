//! Liveness, readiness and startup probes (exec through `ExecSync`, HTTP GET, TCP connect),
//! with the kubelet's initial delay, period, timeout and success/failure thresholds. A failed
//! liveness or startup probe marks the container unhealthy (the pod worker restarts it);
//! readiness feeds the container's `ready` and the pod's Ready condition.

use super::spec::{Container, HttpGetAction, Pod, Probe};
use crate::cri::api::ContainerState;
use crate::cri::runtime::{PodRuntime, Runtime};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Liveness,
    Readiness,
    Startup,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
            Kind::Startup => "Startup",
        }
    }
}

#[derive(Debug, Default)]
struct Tracker {
    next_at: Option<Instant>,
    successes: i32,
    failures: i32,
    /// The thresholded result.
    ok: Option<bool>,
    /// Why the last run failed, until reported.
    failed: Option<String>,
}

/// One failed probe run (the kubelet's `Unhealthy` event).
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeFailure {
    pub container: String,
    /// `Liveness`, `Readiness` or `Startup`.
    pub kind: &'static str,
    pub output: String,
}

#[derive(Debug, Default)]
struct ContainerProbes {
    liveness: Tracker,
    readiness: Tracker,
    startup: Tracker,
    unhealthy: bool,
}

/// Probe state of one pod's containers, by container ID.
#[derive(Debug, Default)]
pub struct Probes {
    containers: HashMap<String, ContainerProbes>,
    changed: bool,
    failures: Vec<ProbeFailure>,
}

impl Probes {
    /// Containers to restart.
    pub fn unhealthy(&self) -> HashSet<String> {
        self.containers
            .iter()
            .filter(|(_, p)| p.unhealthy)
            .map(|(id, _)| id.clone())
            .collect()
    }

    pub fn readiness(&self) -> HashMap<String, bool> {
        self.containers
            .iter()
            .map(|(id, p)| (id.clone(), p.readiness.ok.unwrap_or(false)))
            .collect()
    }

    pub fn started(&self) -> HashSet<String> {
        self.containers
            .iter()
            .filter(|(_, p)| p.startup.ok == Some(true))
            .map(|(id, _)| id.clone())
            .collect()
    }

    pub fn forget(&mut self, id: &str) {
        self.containers.remove(id);
    }

    pub fn started_container(&mut self, id: &str) {
        self.containers
            .insert(id.to_string(), ContainerProbes::default());
    }

    /// Probe runs that failed since the last call.
    pub fn take_failures(&mut self) -> Vec<ProbeFailure> {
        std::mem::take(&mut self.failures)
    }

    /// Whether a result changed since the last call.
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// Runs the probes that are due; returns when the next one is.
    pub async fn run(
        &mut self,
        pod: &Pod,
        rt: &PodRuntime,
        runtime: &Runtime,
        node_ip: &str,
    ) -> Option<Duration> {
        let mut running = HashSet::new();
        let mut next: Option<Instant> = None;
        for c in &pod.spec.containers {
            if c.liveness_probe.is_none()
                && c.readiness_probe.is_none()
                && c.startup_probe.is_none()
            {
                continue;
            }
            let Some(info) = super::lifecycle::current(rt, &c.name)
                .filter(|i| i.state == ContainerState::ContainerRunning)
            else {
                continue;
            };
            running.insert(info.id.clone());
            let since_start = kubeedge_shared::clock::from_unix_nanos(info.started_at)
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .unwrap_or_default();
            let host = if pod.spec.host_network {
                node_ip.to_string()
            } else {
                rt.latest_sandbox()
                    .and_then(|s| s.ips.first().cloned())
                    .unwrap_or_else(|| node_ip.to_string())
            };
            let state = self.containers.entry(info.id.clone()).or_default();
            let mut changed = false;
            let startup_done = match &c.startup_probe {
                None => true,
                Some(p) => {
                    if state.startup.ok != Some(true) {
                        let r = step(
                            &mut state.startup,
                            p,
                            Kind::Startup,
                            c,
                            &info.id,
                            &host,
                            since_start,
                            runtime,
                        )
                        .await;
                        changed |= r;
                        if state.startup.ok == Some(false) && !state.unhealthy {
                            tracing::info!(pod = %pod.key(), container = %c.name, "startup probe failed; restarting");
                            state.unhealthy = true;
                        }
                        next = earliest(next, state.startup.next_at);
                    }
                    state.startup.ok == Some(true)
                }
            };
            if startup_done {
                if let Some(p) = &c.liveness_probe {
                    changed |= step(
                        &mut state.liveness,
                        p,
                        Kind::Liveness,
                        c,
                        &info.id,
                        &host,
                        since_start,
                        runtime,
                    )
                    .await;
                    if state.liveness.ok == Some(false) && !state.unhealthy {
                        tracing::info!(pod = %pod.key(), container = %c.name, "liveness probe failed; restarting");
                        state.unhealthy = true;
                    }
                    next = earliest(next, state.liveness.next_at);
                }
                match &c.readiness_probe {
                    Some(p) => {
                        changed |= step(
                            &mut state.readiness,
                            p,
                            Kind::Readiness,
                            c,
                            &info.id,
                            &host,
                            since_start,
                            runtime,
                        )
                        .await;
                        next = earliest(next, state.readiness.next_at);
                    }
                    None => state.readiness.ok = Some(true),
                }
            }
            self.changed |= changed;
            for (t, kind) in [
                (&mut state.startup, Kind::Startup),
                (&mut state.liveness, Kind::Liveness),
                (&mut state.readiness, Kind::Readiness),
            ] {
                if let Some(output) = t.failed.take() {
                    self.failures.push(ProbeFailure {
                        container: c.name.clone(),
                        kind: kind.name(),
                        output,
                    });
                }
            }
        }
        self.containers.retain(|id, _| running.contains(id));
        next.map(|t| t.saturating_duration_since(Instant::now()))
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Runs one probe if due; true if its thresholded result changed.
#[allow(clippy::too_many_arguments)]
async fn step(
    t: &mut Tracker,
    p: &Probe,
    kind: Kind,
    c: &Container,
    id: &str,
    host: &str,
    since_start: Duration,
    runtime: &Runtime,
) -> bool {
    let now = Instant::now();
    let initial = Duration::from_secs(p.initial_delay_seconds.max(0) as u64);
    if since_start < initial {
        t.next_at = Some(now + (initial - since_start));
        return false;
    }
    if t.next_at.is_some_and(|at| now < at) {
        return false;
    }
    let period = Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64);
    let timeout = Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1) as u64);
    let success = match probe_once(p, c, id, host, timeout, runtime).await {
        Ok(()) => true,
        Err(why) => {
            tracing::debug!(container = %c.name, ?kind, %why, "probe failed");
            t.failed = Some(why);
            false
        }
    };
    t.next_at = Some(Instant::now() + period);
    let before = t.ok;
    let success_threshold = match kind {
        Kind::Readiness => p.success_threshold.unwrap_or(1).max(1),
        _ => 1,
    };
    let failure_threshold = p.failure_threshold.unwrap_or(3).max(1);
    if success {
        t.failures = 0;
        t.successes += 1;
        if t.successes >= success_threshold {
            t.ok = Some(true);
        }
    } else {
        t.successes = 0;
        t.failures += 1;
        if t.failures >= failure_threshold {
            t.ok = Some(false);
        }
    }
    before != t.ok
}

async fn probe_once(
    p: &Probe,
    c: &Container,
    id: &str,
    host: &str,
    timeout: Duration,
    runtime: &Runtime,
) -> Result<(), String> {
    if let Some(exec) = &p.exec {
        let r = runtime
            .exec_sync(id, exec.command.clone(), timeout)
            .await
            .map_err(|e| e.to_string())?;
        return if r.exit_code == 0 {
            Ok(())
        } else {
            Err(format!("exit code {}", r.exit_code))
        };
    }
    if let Some(h) = &p.http_get {
        let port = resolve_port(&h.port, c)?;
        let host = h
            .host
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| host.to_string());
        return tokio::time::timeout(timeout, http_get(&host, port, h))
            .await
            .map_err(|_| format!("timed out after {timeout:?}"))?;
    }
    if let Some(t) = &p.tcp_socket {
        let port = resolve_port(&t.port, c)?;
        let host = t
            .host
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| host.to_string());
        return match tokio::time::timeout(
            timeout,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("timed out after {timeout:?}")),
        };
    }
    Err("no handler".into())
}

/// A port number, or the name of one of the container's ports.
pub(crate) fn resolve_port(port: &Value, c: &Container) -> Result<u16, String> {
    match port {
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("invalid port {n}")),
        Value::String(s) => match s.parse::<u16>() {
            Ok(n) if n > 0 => Ok(n),
            _ => c
                .ports
                .iter()
                .find(|p| p.name.as_deref() == Some(s.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("no container port named {s:?}")),
        },
        other => Err(format!("invalid port {other}")),
    }
}

/// A plain HTTP/1.1 GET; 200–399 is success. HTTPS endpoints are checked by connecting only.
pub(crate) async fn http_get(host: &str, port: u16, h: &HttpGetAction) -> Result<(), String> {
    let mut stream = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| e.to_string())?;
    if h.scheme
        .as_deref()
        .is_some_and(|s| s.eq_ignore_ascii_case("https"))
    {
        return Ok(());
    }
    let path = h
        .path
        .as_deref()
        .filter(|p| p.starts_with('/'))
        .unwrap_or("/");
    let host_header = h
        .http_headers
        .iter()
        .find(|x| x.name.eq_ignore_ascii_case("host"))
        .map(|x| x.value.clone())
        .unwrap_or_else(|| {
            if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            }
        });
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: kube-probe/1.29\r\nAccept: */*\r\nConnection: close\r\n"
    );
    for x in h
        .http_headers
        .iter()
        .filter(|x| !x.name.eq_ignore_ascii_case("host"))
    {
        if x.name.contains(['\r', '\n', ':']) || x.value.contains(['\r', '\n']) {
            return Err(format!("invalid header {:?}", x.name));
        }
        req.push_str(&format!("{}: {}\r\n", x.name, x.value));
    }
    req.push_str("\r\n");
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    while !buf.contains(&b'\n') && buf.len() < 4096 {
        let n = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&buf);
    let code: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            format!(
                "not an HTTP response: {:?}",
                line.lines().next().unwrap_or("")
            )
        })?;
    if (200..400).contains(&code) {
        Ok(())
    } else {
        Err(format!("HTTP probe failed with statuscode: {code}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ports_resolve_by_number_or_name() {
        let c: Container = serde_json::from_value(json!({"name": "a", "image": "x",
            "ports": [{"name": "http", "containerPort": 8080}]}))
        .unwrap();
        assert_eq!(resolve_port(&json!(80), &c), Ok(80));
        assert_eq!(resolve_port(&json!("8081"), &c), Ok(8081));
        assert_eq!(resolve_port(&json!("http"), &c), Ok(8080));
        assert!(resolve_port(&json!("nope"), &c).is_err());
        assert!(resolve_port(&json!(0), &c).is_err());
    }

    #[tokio::test]
    async fn http_probes_read_the_status_code() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for code in [200, 500] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        let h = HttpGetAction {
            path: Some("/healthz".into()),
            ..Default::default()
        };
        assert_eq!(http_get("127.0.0.1", port, &h).await, Ok(()));
        assert!(
            http_get("127.0.0.1", port, &h)
                .await
                .unwrap_err()
                .contains("500")
        );
    }
}
