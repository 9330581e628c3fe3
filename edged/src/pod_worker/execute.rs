//! Carries out the plan's actions against the runtime, in order.

use super::*;

impl PodWorker {
    /// Runs the actions in order; true if any changed the runtime.
    pub(super) async fn execute(&mut self, pod: &Pod, rt: &PodRuntime, actions: &[Action]) -> bool {
        let runtime = self.shared.runtime.clone();
        let grace = self
            .grace_override
            .unwrap_or_else(|| Duration::from_secs(pod.grace_period_seconds() as u64));
        let mut progressed = false;
        for action in actions {
            match action {
                Action::KillPod => {
                    self.kill_all(rt, grace).await;
                    // NotReady ones too: stopping tears down what the runtime still holds for
                    // them (their network). Stopping a stopped sandbox is a no-op.
                    for s in &rt.sandboxes {
                        if let Err(e) = runtime.stop_sandbox(&s.id).await {
                            tracing::warn!(pod = %pod.key(), sandbox = %s.id, error = %e, "stopping sandbox");
                        }
                    }
                    progressed = true;
                }
                Action::CreateSandbox { attempt } => {
                    if let Some(e) = self.volumes_error.clone() {
                        tracing::debug!(pod = %pod.key(), error = %e, "sandbox waits for volumes");
                        continue;
                    }
                    if *attempt > 0 {
                        self.event(
                            None,
                            EventType::Normal,
                            "SandboxChanged",
                            "Pod sandbox changed, it will be killed and re-created.",
                        );
                    }
                    let started = Instant::now();
                    let dir = self.shared.config.pod_dir(&self.uid);
                    let logs = log_directory(&self.shared.config, pod);
                    for d in [&dir, &logs] {
                        if let Err(e) = std::fs::create_dir_all(d) {
                            tracing::warn!(pod = %pod.key(), dir = %d.display(), error = %e, "creating pod directory");
                        }
                    }
                    if let Err(e) = self.shared.cgroups.ensure_pod(pod) {
                        tracing::warn!(pod = %pod.key(), error = %e, "pod cgroup not set up; the runtime creates it without the pod's limits");
                    }
                    let parent = self.shared.cgroups.pod_parent(pod);
                    let sb = sandbox_config(pod, &self.shared.config, *attempt, &parent);
                    match runtime.run_sandbox(sb).await {
                        Ok(id) => {
                            tracing::info!(pod = %pod.key(), sandbox = %id, attempt, elapsed_ms = started.elapsed().as_millis() as u64, "sandbox started");
                            for c in pod.spec.containers.iter().chain(&pod.spec.init_containers) {
                                if self
                                    .notes
                                    .get(&c.name)
                                    .is_some_and(|n| n.reason == WaitingReason::ContainerCreating)
                                {
                                    self.notes.remove(&c.name);
                                }
                            }
                            progressed = true;
                        }
                        Err(e) => {
                            tracing::warn!(pod = %pod.key(), error = %e, "RunPodSandbox failed");
                            self.event(
                                None,
                                EventType::Warning,
                                "FailedCreatePodSandBox",
                                format!("Failed to create pod sandbox: {e}"),
                            );
                            for c in pod.spec.containers.iter().chain(&pod.spec.init_containers) {
                                self.notes.insert(
                                    c.name.clone(),
                                    Waiting::new(
                                        WaitingReason::ContainerCreating,
                                        format!("failed to create pod sandbox: {e}"),
                                    ),
                                );
                            }
                        }
                    }
                }
                Action::StartContainer {
                    kind,
                    index,
                    attempt,
                    restart_after,
                } => {
                    if self
                        .start_container(pod, rt, *kind, *index, *attempt, *restart_after)
                        .await
                    {
                        progressed = true;
                    }
                }
                Action::KillContainer { id, name, why } => {
                    tracing::info!(pod = %pod.key(), container = %name, why = %why, "stopping container");
                    let message = why.event_message(name);
                    self.event(Some(name), EventType::Normal, "Killing", message);
                    if self.stop_one(rt, id, name, grace).await {
                        progressed = true;
                    }
                    self.probes.forget(id);
                }
                Action::RemoveContainer { id } => {
                    if let Err(e) = runtime.remove_container(id).await {
                        tracing::debug!(pod = %pod.key(), container = %id, error = %e, "RemoveContainer failed");
                    } else if let Some(c) = rt.containers.iter().find(|c| &c.id == id) {
                        let file = crate::containers::termination_log_file(
                            &self.shared.config.pod_dir(&self.uid),
                            &c.name,
                            c.attempt,
                        );
                        let _ = std::fs::remove_file(file);
                    }
                    self.probes.forget(id);
                }
                Action::RemoveSandbox { id } => {
                    let _ = runtime.stop_sandbox(id).await;
                    if let Err(e) = runtime.remove_sandbox(id).await {
                        tracing::debug!(pod = %pod.key(), sandbox = %id, error = %e, "RemovePodSandbox failed");
                    }
                }
            }
        }
        progressed
    }

    /// The address hooks and probes reach the pod at.
    pub(super) fn pod_host(&self, rt: &PodRuntime) -> String {
        let node_ip = self.shared.config.node_ip.clone();
        match &self.pod {
            Some(p) if !p.spec.host_network => rt
                .latest_sandbox()
                .and_then(|s| s.ips.first().cloned())
                .unwrap_or(node_ip),
            _ => node_ip,
        }
    }
}
