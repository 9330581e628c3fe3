//! The edgecore binary's side of edged's settings: [`edged_config`] converts `modules.edged`
//! of `edgecore.yaml` (and the modules that shape it: the MetaServer, edgeStream, edgemesh's
//! DNS) into the [`EdgedConfig`] the edged library takes.

use crate::config::EdgeCoreConfig;
use kubeedge_edged::EdgedConfig;
use std::path::PathBuf;
use std::time::Duration;

/// cloudstream's default stream port, reported as the kubelet port with edgeStream enabled.
pub const CLOUD_STREAM_PORT: i32 = 10003;

/// The MetaServer's dummy address when it serves pods (enabled, `requireAuthorization`).
fn metaserver_service(config: &EdgeCoreConfig) -> Option<std::net::SocketAddr> {
    let ms = &config.modules.meta_manager.meta_server;
    let gate = config.feature_gates.get("requireAuthorization") == Some(&true);
    (ms.enable && gate)
        .then(|| ms.dummy_server.parse().ok())
        .flatten()
}

/// edged's settings from a validated configuration.
pub fn edged_config(config: &EdgeCoreConfig) -> EdgedConfig {
    let e = &config.modules.edged;
    let k = &e.tailored_kubelet_config;
    let node_ip = if e.node_ip.is_empty() {
        crate::config::local_ip()
    } else {
        e.node_ip.clone()
    };
    let register_node = k.register_node.unwrap_or(e.register_node);
    EdgedConfig {
        node_name: config.node_name().to_string(),
        node_ip,
        hostname: crate::config::hostname(),
        runtime_endpoint: e.remote_runtime_endpoint.clone(),
        pod_sandbox_image: e.pod_sandbox_image.clone(),
        root_directory: PathBuf::from(&e.root_directory),
        pod_logs_directory: PathBuf::from("/var/log/pods"),
        register_node,
        register_schedulable: e.register_schedulable,
        node_labels: e.node_labels.clone(),
        register_with_taints: e.register_with_taints.clone(),
        // edgemesh's DNS when no other is configured (KubeEdge users set clusterDNS to
        // EdgeMesh's 169.254.96.16 by hand).
        cluster_dns: if k.cluster_dns.is_empty() {
            crate::mesh::cluster_dns(config).into_iter().collect()
        } else {
            k.cluster_dns.clone()
        },
        cluster_domain: k.cluster_domain.clone(),
        resolv_conf: k.resolv_conf.clone(),
        max_pods: k.max_pods.max(0) as i64,
        system_reserved: k.system_reserved.clone(),
        kube_reserved: k.kube_reserved.clone(),
        eviction_hard: k.eviction_hard.clone(),
        eviction_soft: k.eviction_soft.clone(),
        eviction_soft_grace_period: k.eviction_soft_grace_period.clone(),
        eviction_max_pod_grace_period: Duration::from_secs(
            k.eviction_max_pod_grace_period.max(0) as u64
        ),
        eviction_pressure_transition_period: k.eviction_pressure_transition_period.0,
        node_status_update_frequency: k.node_status_update_frequency.0,
        node_status_report_frequency: k.node_status_report_frequency.0,
        node_lease_duration_seconds: k.node_lease_duration_seconds.max(1),
        sync_frequency: k.sync_frequency.0,
        runtime_request_timeout: nonzero(k.runtime_request_timeout.0, 120),
        image_pull_timeout: nonzero(e.image_pull_progress_deadline.0, 60)
            .max(Duration::from_secs(600)),
        max_per_pod_container_count: e.max_per_pod_container_count.max(1) as usize,
        container_log_max_size: kubeedge_edged::quantity::parse_units(&k.container_log_max_size)
            .map(|b| b.max(0) as u64)
            .unwrap_or(10 << 20),
        container_log_max_files: k.container_log_max_files.max(2) as usize,
        // With edgeStream, the apiserver must reach cloudcore's stream server: the
        // node reports its port (10003; a real cluster DNATs it to cloudcore).
        kubelet_port: if config.modules.edge_stream.enable {
            CLOUD_STREAM_PORT
        } else {
            k.read_only_port
        },
        kubelet_port_from_cloud: config.modules.edge_stream.enable,
        image_gc_high_threshold_percent: k.image_gc_high_threshold_percent,
        image_gc_low_threshold_percent: k.image_gc_low_threshold_percent,
        image_minimum_gc_age: k.image_minimum_gc_age.0,
        image_maximum_gc_age: k.image_maximum_gc_age.0,
        metaserver_service: metaserver_service(config),
        static_pod_path: (!k.static_pod_path.is_empty()).then(|| PathBuf::from(&k.static_pod_path)),
        cgroups: kubeedge_edged::cgroups::CgroupSettings {
            per_qos: k.cgroups_per_qos,
            driver: match k.cgroup_driver {
                crate::config::CgroupDriver::Cgroupfs => kubeedge_edged::cgroups::Driver::Cgroupfs,
                crate::config::CgroupDriver::Systemd => kubeedge_edged::cgroups::Driver::Systemd,
            },
            root: if k.cgroup_root.is_empty() {
                "/".into()
            } else {
                k.cgroup_root.clone()
            },
            enforce_pods_allocatable: k.enforce_node_allocatable.iter().any(|e| e == "pods"),
            pod_pids_limit: k.pod_pids_limit,
            ..kubeedge_edged::cgroups::CgroupSettings::default()
        },
        ..EdgedConfig::default()
    }
}

fn nonzero(d: Duration, default_secs: u64) -> Duration {
    if d.is_zero() {
        Duration::from_secs(default_secs)
    } else {
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_kubelet() {
        let mut config = EdgeCoreConfig::default();
        config.modules.edged.hostname_override = "edge-9".into();
        config.modules.edged.node_ip = "10.1.2.3".into();
        let e = edged_config(&config);
        assert_eq!(e.node_name, "edge-9");
        assert_eq!(e.node_ip, "10.1.2.3");
        assert_eq!(e.node_status_update_frequency, Duration::from_secs(10));
        assert_eq!(e.lease_renew_interval(), Duration::from_secs(10));
        assert_eq!(e.max_pods, 110);
        assert_eq!(e.kubelet_port, 10350);
        assert_eq!(e.container_log_max_size, 10 << 20);
        assert_eq!(e.container_log_max_files, 5);
        assert_eq!(e.crash_backoff_initial, Duration::from_secs(10));
        assert_eq!(e.crash_backoff_max, Duration::from_secs(300));
        assert_eq!(
            (
                e.image_gc_high_threshold_percent,
                e.image_gc_low_threshold_percent
            ),
            (80, 40)
        );
        assert_eq!(e.image_minimum_gc_age, Duration::from_secs(120));
        assert_eq!(e.image_maximum_gc_age, Duration::ZERO);
        assert_eq!(e.image_gc_period, Duration::from_secs(300));
        assert_eq!(e.pod_dir("u1"), PathBuf::from("/var/lib/edged/pods/u1"));
    }
}

#[cfg(test)]
mod default_tests {
    use super::*;

    /// The library's defaults and a default `edgecore.yaml`'s agree where neither depends on
    /// the machine (tests of the library build on `EdgedConfig::default()`).
    #[test]
    fn the_default_configuration_converts_to_the_library_defaults() {
        let from_yaml = edged_config(&EdgeCoreConfig::default());
        let lib = EdgedConfig::default();
        assert_eq!(from_yaml.eviction_hard, lib.eviction_hard);
        assert_eq!(from_yaml.max_pods, lib.max_pods);
        assert_eq!(from_yaml.root_directory, lib.root_directory);
        assert_eq!(
            from_yaml.node_lease_duration_seconds,
            lib.node_lease_duration_seconds
        );
        assert_eq!(
            (from_yaml.sync_frequency, from_yaml.runtime_request_timeout),
            (lib.sync_frequency, lib.runtime_request_timeout)
        );
        assert_eq!(from_yaml.image_gc_period, lib.image_gc_period);
        assert_eq!(from_yaml.cgroups, lib.cgroups);
        assert_eq!(from_yaml.runtime_endpoint, lib.runtime_endpoint);
    }
}
