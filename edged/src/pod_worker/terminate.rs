//! Stopping containers (preStop hook, SIGTERM, SIGKILL after the grace period), the pod's
//! graceful deletion, and its removal from the node.

use super::*;

impl PodWorker {
    /// Stops one container: its preStop hook, then SIGTERM and SIGKILL after what is left
    /// of `grace`.
    pub(super) async fn stop_one(
        &self,
        rt: &PodRuntime,
        id: &str,
        name: &str,
        grace: Duration,
    ) -> bool {
        let spec = self.pod.as_ref().and_then(|p| {
            p.spec
                .containers
                .iter()
                .chain(&p.spec.init_containers)
                .find(|c| c.name == name)
        });
        let host = self.pod_host(rt);
        let runtime = &self.shared.runtime;
        let left = crate::hooks::pre_stop(spec, id, &host, grace, runtime).await;
        match runtime.stop_container(id, left).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(container = %name, id, error = %e, "StopContainer failed");
                false
            }
        }
    }

    /// Stops every running container at once, each with `grace`.
    pub(super) async fn kill_all(&mut self, rt: &PodRuntime, grace: Duration) {
        for c in rt.running() {
            let message = format!("Stopping container {}", c.name);
            self.event(Some(&c.name), EventType::Normal, "Killing", message);
        }
        let this = &*self;
        let stops = rt.running().map(|c| async move {
            this.stop_one(rt, &c.id, &c.name, grace).await;
            c.id.clone()
        });
        let stopped = futures_util::future::join_all(stops).await;
        for id in stopped {
            self.probes.forget(&id);
        }
    }

    /// Graceful deletion: stop every container within the grace period, stop the sandbox,
    /// report the final status, then delete the pod at the API server (grace 0, with the UID
    /// as precondition). The runtime objects go when the deletion comes back.
    pub(super) async fn terminate(&mut self, pod: &Pod) -> Next {
        let retry = self.shared.config.retry_period;
        if self.deleted_at_api {
            // Done here; the runtime objects go when the deletion reaches the node.
            return Next::After(self.shared.config.sync_frequency);
        }
        self.set_state(PodState::Terminating);
        let Some(rt) = self.observe().await else {
            return Next::After(retry);
        };
        let grace = Duration::from_secs(pod.grace_period_seconds() as u64);
        if rt.running().next().is_some() {
            let started = Instant::now();
            self.kill_all(&rt, grace).await;
            tracing::info!(pod = %pod.key(), grace_s = grace.as_secs(), elapsed_ms = started.elapsed().as_millis() as u64, "containers stopped for deletion");
        }
        let rt = match self.observe().await {
            Some(rt) => rt,
            None => return Next::After(retry),
        };
        for s in rt.sandboxes.iter().filter(|s| s.ready) {
            if let Err(e) = self.shared.runtime.stop_sandbox(&s.id).await {
                tracing::warn!(pod = %pod.key(), error = %e, "stopping sandbox");
            }
        }
        self.set_state(PodState::Terminated);
        let rt = self.observe().await.unwrap_or(rt);
        let phase = match lifecycle::phase(pod, &rt) {
            Phase::Succeeded => Phase::Succeeded,
            _ if rt.containers.is_empty() => self.finished.unwrap_or(Phase::Failed),
            _ => Phase::Failed,
        };
        let previous = self.previous_status();
        let now = time::now();
        let status = pod_status(&StatusInput {
            pod,
            rt: &rt,
            phase,
            waiting: &HashMap::new(),
            ready: &HashMap::new(),
            started: &HashSet::new(),
            host_ip: &self.shared.config.node_ip,
            runtime_name: self.shared.runtime_name(),
            previous: &previous,
            now: &now,
            reason: None,
            message: None,
        });
        self.report(status).await;
        if self.deleted_at_api {
            return Next::After(self.shared.config.sync_frequency);
        }
        let options = json!({
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": self.uid},
        });
        let m = &pod.metadata;
        match self
            .shared
            .meta
            .delete_pod(&m.namespace, &m.name, options)
            .await
        {
            Ok(()) | Err(MetaError::NotFound { .. }) => {
                tracing::info!(pod = %pod.key(), "pod deleted at the API server");
                self.deleted_at_api = true;
                Next::After(self.shared.config.sync_frequency)
            }
            Err(e) => {
                tracing::info!(pod = %pod.key(), error = %e, "deleting the pod at the API server failed; will retry");
                Next::After(retry)
            }
        }
    }

    /// The pod is gone from the node's database: stop and remove its containers and
    /// sandboxes and its directory.
    pub(super) async fn remove(&mut self) -> Next {
        let retry = self.shared.config.retry_period;
        let key = self.key();
        let Some(rt) = self.observe().await else {
            return Next::After(retry);
        };
        let grace = metadata_of(&self.raw)
            .deletion_grace_period_seconds
            .or_else(|| self.pod.as_ref().map(Pod::grace_period_seconds))
            .unwrap_or(30)
            .max(0) as u64;
        self.kill_all(&rt, Duration::from_secs(grace)).await;
        let runtime = self.shared.runtime.clone();
        let mut failed = false;
        for c in &rt.containers {
            if let Err(e) = runtime.remove_container(&c.id).await {
                tracing::warn!(pod = %key, container = %c.id, error = %e, "RemoveContainer failed");
                failed = true;
            }
        }
        for s in &rt.sandboxes {
            let _ = runtime.stop_sandbox(&s.id).await;
            if let Err(e) = runtime.remove_sandbox(&s.id).await {
                tracing::warn!(pod = %key, sandbox = %s.id, error = %e, "RemovePodSandbox failed");
                failed = true;
            }
        }
        if failed {
            return Next::After(retry);
        }
        if !self.shared.cgroups.remove_pod(&self.uid) {
            tracing::info!(pod = %key, "pod cgroup not removed yet (still in use); removed at the next start");
        }
        if let Err(e) = volumes::remove_pod_dir(&self.shared.config.root_directory, &self.uid) {
            tracing::warn!(pod = %key, error = %e, "removing the pod directory");
        }
        if let Some(pod) = &self.pod {
            let _ = std::fs::remove_dir_all(log_directory(&self.shared.config, pod));
        }
        tracing::info!(pod = %key, uid = %self.uid, "pod removed from the node");
        let m = metadata_of(&self.raw);
        self.shared.status_reports.forget(&m.namespace, &m.name);
        Next::Done
    }
}
