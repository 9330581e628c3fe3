//! [`EdgedConfig`]: what edged reads from `modules.edged` of `edgecore.yaml`, plus timers
//! KubeEdge does not expose (kubelet constants), which tests shorten.

use crate::config::EdgeCoreConfig;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct EdgedConfig {
    /// The node name (`hostnameOverride`).
    pub node_name: String,
    /// The node's InternalIP (`nodeIP`, else the address of the default route).
    pub node_ip: String,
    /// The machine's hostname (the `Hostname` address).
    pub hostname: String,
    pub runtime_endpoint: String,
    /// Pulled at start when missing, so that pods can start while offline later.
    pub pod_sandbox_image: String,
    /// Pod directories (volumes) live under `<root>/pods/<uid>`.
    pub root_directory: PathBuf,
    /// Container logs: `<dir>/<namespace>_<name>_<uid>/<container>/<attempt>.log`.
    pub pod_logs_directory: PathBuf,
    pub register_node: bool,
    pub register_schedulable: bool,
    pub node_labels: BTreeMap<String, String>,
    pub register_with_taints: Vec<Value>,
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    pub resolv_conf: String,
    pub max_pods: i64,
    pub system_reserved: BTreeMap<String, String>,
    pub kube_reserved: BTreeMap<String, String>,
    pub eviction_hard: BTreeMap<String, String>,
    pub eviction_soft: BTreeMap<String, String>,
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    /// `evictionMaxPodGracePeriod` (0: the pod's own).
    pub eviction_max_pod_grace_period: Duration,
    /// Between eviction checks (the kubelet's housekeeping, 10 s).
    pub eviction_period: Duration,
    /// `evictionPressureTransitionPeriod`: a pressure condition stays this long after its
    /// last threshold stopped being met.
    pub eviction_pressure_transition_period: Duration,
    pub node_status_update_frequency: Duration,
    pub node_status_report_frequency: Duration,
    pub node_lease_duration_seconds: i32,
    pub sync_frequency: Duration,
    pub runtime_request_timeout: Duration,
    pub image_pull_timeout: Duration,
    /// Exited containers kept per container name (the newest ones; for `lastState` and logs).
    pub max_per_pod_container_count: usize,
    /// A container's log is rotated past this many bytes (`containerLogMaxSize`; 0: never).
    pub container_log_max_size: u64,
    /// Log files kept per container, the current one included (`containerLogMaxFiles`).
    pub container_log_max_files: usize,
    /// How often log sizes are checked.
    pub log_rotation_period: std::time::Duration,
    /// The kubelet port reported in `daemonEndpoints` (edgecore's read-only port).
    pub kubelet_port: i32,
    /// The cloud owns the kubelet port (with edgeStream: cloudstream writes its negotiated
    /// tunnel port when the tunnel connects), so status reports leave `daemonEndpoints` out;
    /// only the registration carries `kubelet_port`.
    pub kubelet_port_from_cloud: bool,
    /// Crash-loop back-off: first delay, doubled per crash up to the maximum.
    pub crash_backoff_initial: Duration,
    pub crash_backoff_max: Duration,
    /// Image pull back-off.
    pub image_backoff_initial: Duration,
    pub image_backoff_max: Duration,
    /// How often the runtime is listed to notice containers that exited (the kubelet's PLEG
    /// relist period).
    pub relist_period: Duration,
    /// Retry interval for status patches and deletions that failed (e.g. while offline).
    pub retry_period: Duration,
    /// Image garbage collection (`imageGCHighThresholdPercent`, 100: off;
    /// `imageGCLowThresholdPercent`; `imageMinimumGCAge`; `imageMaximumGCAge`, 0: off).
    pub image_gc_high_threshold_percent: i32,
    pub image_gc_low_threshold_percent: i32,
    pub image_minimum_gc_age: Duration,
    pub image_maximum_gc_age: Duration,
    /// How often images are collected (the kubelet's `ImageGCPeriod`).
    pub image_gc_period: Duration,
    /// With the MetaServer's `requireAuthorization`: its dummy address, given to containers
    /// as `KUBERNETES_SERVICE_HOST`/`PORT` so in-cluster clients reach it (KubeEdge v1.17).
    pub metaserver_service: Option<std::net::SocketAddr>,
    /// `staticPodPath` (none when empty).
    pub static_pod_path: Option<PathBuf>,
    /// How often it is read (the kubelet's `fileCheckFrequency`).
    pub static_pod_check_period: Duration,
    /// Pod cgroups and QoS (`cgroupsPerQOS`, `cgroupDriver`, `cgroupRoot`,
    /// `enforceNodeAllocatable`, `podPidsLimit`).
    pub cgroups: super::cgroups::CgroupSettings,
}

/// The MetaServer's dummy address when it serves pods (enabled, `requireAuthorization`).
fn metaserver_service(config: &EdgeCoreConfig) -> Option<std::net::SocketAddr> {
    let ms = &config.modules.meta_manager.meta_server;
    let gate = config.feature_gates.get("requireAuthorization") == Some(&true);
    (ms.enable && gate)
        .then(|| ms.dummy_server.parse().ok())
        .flatten()
}

/// cloudstream's default stream port, reported as the kubelet port with edgeStream enabled.
pub const CLOUD_STREAM_PORT: i32 = 10003;

impl EdgedConfig {
    /// From a validated configuration.
    pub fn from_edgecore(config: &EdgeCoreConfig) -> Self {
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
                k.eviction_max_pod_grace_period.max(0) as u64,
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
            container_log_max_size: super::quantity::parse_units(&k.container_log_max_size)
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
            static_pod_path: (!k.static_pod_path.is_empty())
                .then(|| PathBuf::from(&k.static_pod_path)),
            cgroups: super::cgroups::CgroupSettings {
                per_qos: k.cgroups_per_qos,
                driver: match k.cgroup_driver {
                    crate::config::CgroupDriver::Cgroupfs => {
                        super::cgroups::naming::Driver::Cgroupfs
                    }
                    crate::config::CgroupDriver::Systemd => super::cgroups::naming::Driver::Systemd,
                },
                root: if k.cgroup_root.is_empty() {
                    "/".into()
                } else {
                    k.cgroup_root.clone()
                },
                enforce_pods_allocatable: k.enforce_node_allocatable.iter().any(|e| e == "pods"),
                pod_pids_limit: k.pod_pids_limit,
                ..super::cgroups::CgroupSettings::default()
            },
            ..Self::defaults()
        }
    }

    fn defaults() -> Self {
        EdgedConfig {
            node_name: String::new(),
            node_ip: "127.0.0.1".into(),
            hostname: String::new(),
            runtime_endpoint: crate::config::DEFAULT_RUNTIME_ENDPOINT.into(),
            pod_sandbox_image: String::new(),
            root_directory: PathBuf::from("/var/lib/edged"),
            pod_logs_directory: PathBuf::from("/var/log/pods"),
            register_node: true,
            register_schedulable: true,
            node_labels: BTreeMap::new(),
            register_with_taints: Vec::new(),
            cluster_dns: Vec::new(),
            cluster_domain: "cluster.local".into(),
            resolv_conf: "/etc/resolv.conf".into(),
            max_pods: 110,
            system_reserved: BTreeMap::new(),
            kube_reserved: BTreeMap::new(),
            eviction_hard: BTreeMap::new(),
            eviction_soft: BTreeMap::new(),
            eviction_soft_grace_period: BTreeMap::new(),
            eviction_max_pod_grace_period: Duration::ZERO,
            eviction_pressure_transition_period: Duration::from_secs(300),
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(300),
            node_lease_duration_seconds: 40,
            sync_frequency: Duration::from_secs(60),
            runtime_request_timeout: Duration::from_secs(120),
            image_pull_timeout: Duration::from_secs(600),
            max_per_pod_container_count: 1,
            container_log_max_size: 10 << 20,
            container_log_max_files: 5,
            log_rotation_period: Duration::from_secs(10),
            kubelet_port: 10350,
            kubelet_port_from_cloud: false,
            crash_backoff_initial: Duration::from_secs(10),
            crash_backoff_max: Duration::from_secs(300),
            image_backoff_initial: Duration::from_secs(10),
            image_backoff_max: Duration::from_secs(300),
            relist_period: Duration::from_secs(1),
            retry_period: Duration::from_secs(5),
            image_gc_high_threshold_percent: 80,
            image_gc_low_threshold_percent: 40,
            image_minimum_gc_age: Duration::from_secs(120),
            image_maximum_gc_age: Duration::ZERO,
            image_gc_period: Duration::from_secs(300),
            metaserver_service: None,
            static_pod_path: None,
            static_pod_check_period: Duration::from_secs(20),
            eviction_period: Duration::from_secs(10),
            cgroups: super::cgroups::CgroupSettings::default(),
        }
    }

    /// How often the node lease is renewed: a quarter of its duration (the kubelet's
    /// `NodeLeaseRenewIntervalFraction`), 10 s by default.
    pub fn lease_renew_interval(&self) -> Duration {
        Duration::from_millis(self.node_lease_duration_seconds.max(1) as u64 * 250)
    }

    /// `<root>/pods/<uid>`.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.root_directory.join("pods").join(uid)
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
        let e = EdgedConfig::from_edgecore(&config);
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
