//! What a pod's containers are given: the pod context (its IPs, the node's allocatable
//! resources) and its volumes, prepared again when a configmap or secret they use changed.

use super::*;

impl PodWorker {
    pub(super) fn context(&self, pod: &Pod, rt: &PodRuntime) -> PodContext {
        let host_ip = self.shared.config.node_ip.clone();
        let pod_ips = if pod.spec.host_network {
            vec![host_ip.clone()]
        } else {
            rt.latest_sandbox()
                .map(|s| s.ips.clone())
                .unwrap_or_default()
        };
        let a = &self.shared.allocatable;
        PodContext {
            pod_ips,
            host_ip,
            allocatable_cpu_milli: a.cpu_milli,
            allocatable_memory: a.memory,
            allocatable_ephemeral: a.ephemeral,
            service_env: self
                .shared
                .config
                .metaserver_service
                .map(super::super::env::master_service_env)
                .unwrap_or_default(),
        }
    }

    pub(super) async fn prepare_volumes(
        &mut self,
        pod: &Pod,
        rt: &PodRuntime,
        config_version: u64,
    ) {
        let fresh = self.volumes_prepared.is_some_and(|(v, at)| {
            v == config_version && at.elapsed() < self.shared.config.sync_frequency
        });
        if fresh && self.volumes.is_some() {
            return;
        }
        let ctx = self.context(pod, rt);
        let dir = self.shared.config.pod_dir(&self.uid);
        match volumes::prepare(pod, &dir, &ctx, &self.shared.objects, &mut self.tokens).await {
            Ok(v) => {
                self.volumes = Some(v);
                self.volumes_error = None;
                self.volumes_prepared = Some((config_version, Instant::now()));
            }
            Err(e) => {
                tracing::warn!(pod = %pod.key(), error = %e, "volumes not ready");
                self.event(None, EventType::Warning, "FailedMount", e.0.clone());
                self.volumes_error = Some(e.0);
                // A volume that worked before keeps working for running containers.
                if self.volumes.is_none() {
                    self.volumes_prepared = None;
                }
            }
        }
    }
}
