//! Starting one container: its image, its config (env, mounts, security), create, start,
//! and the postStart hook.

use super::*;

impl PodWorker {
    pub(super) async fn start_container(
        &mut self,
        pod: &Pod,
        rt: &PodRuntime,
        kind: ContainerKind,
        index: usize,
        attempt: u32,
        restart_after: Option<SystemTime>,
    ) -> bool {
        let list = match kind {
            ContainerKind::Init => &pod.spec.init_containers,
            ContainerKind::App => &pod.spec.containers,
        };
        let Some(c) = list.get(index) else {
            return false;
        };
        let name = c.name.clone();
        let Some(sandbox) = rt.latest_sandbox().filter(|s| s.ready).cloned() else {
            return false;
        };
        let Some(volumes) = self.volumes.clone() else {
            return false;
        };
        if let Some(t) = restart_after {
            // The restart is charged whether or not it works.
            self.crash_backoff
                .next(&lifecycle::backoff_key(pod, &name), t, SystemTime::now());
        }
        let pulled = self
            .ensure_image(
                &name,
                c.image(),
                c.pull_policy(),
                &pod.metadata.namespace,
                &pod.spec.image_pull_secrets,
            )
            .await;
        let (image_ref, image) = match pulled {
            Ok(i) => i,
            Err(w) => {
                tracing::warn!(pod = %pod.key(), container = %name, reason = %w.reason, message = %w.message, "image not available");
                self.event(
                    Some(&name),
                    EventType::Warning,
                    "Failed",
                    format!("Error: {}", w.reason),
                );
                self.notes.insert(name, w);
                return false;
            }
        };
        let config_error = |this: &mut Self, message: String| {
            tracing::warn!(pod = %pod.key(), container = %name, error = %message, "container configuration error");
            this.event(
                Some(&name),
                EventType::Warning,
                "Failed",
                format!("Error: {message}"),
            );
            this.notes.insert(
                name.clone(),
                Waiting::new(WaitingReason::CreateContainerConfigError, message),
            );
            false
        };
        let ctx = self.context(pod, rt);
        let env = match container_env(pod, c, &ctx, &self.shared.objects).await {
            Ok(env) => env,
            Err(e) => return config_error(self, e.0),
        };
        if let Err(e) = check_non_root(pod, c, image.as_ref()) {
            return config_error(self, e.0);
        }
        let etc_hosts = if pod.spec.host_network {
            None
        } else {
            let path = self.shared.config.pod_dir(&self.uid).join("etc-hosts");
            let content = etc_hosts_content(
                pod,
                ctx.pod_ips.first().map(String::as_str).unwrap_or(""),
                &self.shared.config.cluster_domain,
            );
            if let Err(e) = std::fs::write(&path, content) {
                return config_error(self, format!("writing {}: {e}", path.display()));
            }
            Some(path)
        };
        let termination_log = crate::containers::termination_log_file(
            &self.shared.config.pod_dir(&self.uid),
            &name,
            attempt,
        );
        let created = termination_log
            .parent()
            .map(std::fs::create_dir_all)
            .unwrap_or(Ok(()))
            .and_then(|_| std::fs::write(&termination_log, b""))
            .and_then(|_| {
                use std::os::unix::fs::PermissionsExt;
                // Any user in the container may write its termination message.
                std::fs::set_permissions(&termination_log, std::fs::Permissions::from_mode(0o666))
            });
        if let Err(e) = created {
            return config_error(self, format!("creating {}: {e}", termination_log.display()));
        }
        let config = match container_config(&ContainerInput {
            pod,
            container: c,
            kind,
            attempt,
            node_name: &self.shared.config.node_name,
            image_ref: &image_ref,
            env: &env,
            volumes: &volumes,
            etc_hosts: etc_hosts.as_deref(),
            termination_log: Some(&termination_log),
            memory_capacity: self.shared.allocatable.memory_capacity,
        }) {
            Ok(c) => c,
            Err(e) => return config_error(self, e.0),
        };
        let parent = self.shared.cgroups.pod_parent(pod);
        let sandbox_cfg = sandbox_config(pod, &self.shared.config, sandbox.attempt, &parent);
        let runtime = self.shared.runtime.clone();
        let started = Instant::now();
        let id = match runtime
            .create_container(&sandbox.id, config, sandbox_cfg)
            .await
        {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!(pod = %pod.key(), container = %name, error = %e, "CreateContainer failed");
                self.event(
                    Some(&name),
                    EventType::Warning,
                    "Failed",
                    format!("Error: {e}"),
                );
                self.notes.insert(
                    name,
                    Waiting::new(WaitingReason::CreateContainerError, e.to_string()),
                );
                return false;
            }
        };
        self.event(
            Some(&name),
            EventType::Normal,
            "Created",
            format!("Created container: {name}"),
        );
        if let Err(e) = runtime.start_container(&id).await {
            tracing::warn!(pod = %pod.key(), container = %name, error = %e, "StartContainer failed");
            self.event(
                Some(&name),
                EventType::Warning,
                "Failed",
                format!("Error: {e}"),
            );
            self.notes.insert(
                name,
                Waiting::new(WaitingReason::RunContainerError, e.to_string()),
            );
            // The container exists (exited): the next sync restarts it under the back-off.
            return true;
        }
        tracing::info!(pod = %pod.key(), container = %name, id = %id, attempt, elapsed_ms = started.elapsed().as_millis() as u64, "container started");
        self.event(
            Some(&name),
            EventType::Normal,
            "Started",
            format!("Started container {name}"),
        );
        if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let host = ctx
                .pod_ips
                .first()
                .cloned()
                .unwrap_or_else(|| self.shared.config.node_ip.clone());
            let timeout = self.shared.config.runtime_request_timeout;
            if let Err(e) = crate::hooks::run_handler(hook, c, &id, &host, timeout, &runtime).await
            {
                tracing::warn!(pod = %pod.key(), container = %name, error = %e, "postStart hook failed; stopping the container");
                self.event(
                    Some(&name),
                    EventType::Warning,
                    "FailedPostStartHook",
                    format!("PostStartHook failed: {e}"),
                );
                let grace = Duration::from_secs(pod.grace_period_seconds() as u64);
                let _ = runtime.stop_container(&id, grace).await;
                self.notes.insert(
                    name,
                    Waiting::new(
                        WaitingReason::PostStartHookError,
                        format!("postStart hook failed: {e}"),
                    ),
                );
                return true;
            }
        }
        self.notes.remove(&name);
        self.probes.started_container(&id);
        true
    }
}
