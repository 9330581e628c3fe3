//! [`EdgedConfig`]: edged's settings — what edgecore converts from `modules.edged` of
//! `edgecore.yaml`, plus timers KubeEdge does not expose (kubelet constants), which tests
//! shorten.

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

/// The kubelet's `evictionHard` default (also `edgecore.yaml`'s).
pub const EVICTION_HARD_DEFAULTS: [(&str, &str); 4] = [
    ("imagefs.available", "15%"),
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
];

impl Default for EdgedConfig {
    /// The kubelet's defaults (and KubeEdge's for `modules.edged`), node name and hostname
    /// empty.
    fn default() -> Self {
        EdgedConfig {
            node_name: String::new(),
            node_ip: "127.0.0.1".into(),
            hostname: String::new(),
            runtime_endpoint: crate::cri::DEFAULT_ENDPOINT.into(),
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
            eviction_hard: EVICTION_HARD_DEFAULTS
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
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
}

impl EdgedConfig {
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
