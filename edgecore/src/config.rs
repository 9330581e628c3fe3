//! `edgecore.yaml` in KubeEdge's layout (protocol §7.2): apiVersion
//! `edgecore.config.kubeedge.io/v1alpha2`, kind `EdgeCore`, top level `database`, `modules`,
//! `featureGates`, KubeEdge's camelCase keys and defaults.
//!
//! Loading follows KubeEdge: the file is laid over the full default configuration, so a key
//! that is absent keeps its default; unknown keys are ignored (a real KubeEdge file loads), and
//! an explicit `null` counts as absent. A value of the wrong type is reported with its path
//! (`modules.edgeHub.heartbeat: invalid type: …`), and [`EdgeCoreConfig::validate`] reports
//! every invalid value with its path and the reason (`modules.edgeHub.heartbeat: must be > 0`).
//!
//! Settings only kubeedge-rs reads live under the optional top-level `kubeedgeRs` section,
//! which KubeEdge's loader ignores.

use crate::edgehub::EdgeHubConfig;
use crate::metamanager::MetaManagerConfig;
use kubeedge_shared::config::ConfigError as FileError;
use kubeedge_shared::constants;
use kubeedge_shared::names::validate_node_name;
use kubeedge_shared::net::join_host_port;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

pub const API_VERSION: &str = "edgecore.config.kubeedge.io/v1alpha2";
pub const KIND: &str = "EdgeCore";
pub const DEFAULT_CONFIG_PATH: &str = "/etc/kubeedge/config/edgecore.yaml";
pub const DEFAULT_DATA_SOURCE: &str = "/var/lib/kubeedge/edgecore.db";
pub const DEFAULT_CA_FILE: &str = "/etc/kubeedge/ca/rootCA.crt";
pub const DEFAULT_CERT_FILE: &str = "/etc/kubeedge/certs/server.crt";
pub const DEFAULT_KEY_FILE: &str = "/etc/kubeedge/certs/server.key";
pub const DEFAULT_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// The whole `edgecore.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EdgeCoreConfig {
    pub api_version: String,
    pub kind: String,
    pub database: Database,
    pub modules: Modules,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    /// kubeedge-rs only; absent from KubeEdge files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeedge_rs: Option<KubeEdgeRsSettings>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Database {
    pub driver_name: String,
    pub alias_name: String,
    pub data_source: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Modules {
    pub edged: Edged,
    pub edge_hub: EdgeHub,
    pub event_bus: EventBus,
    pub meta_manager: MetaManager,
    pub service_bus: ServiceBus,
    pub device_twin: DeviceTwin,
    #[serde(rename = "dbTest")]
    pub db_test: DbTest,
    pub edge_stream: EdgeStream,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EdgeHub {
    pub enable: bool,
    /// Seconds between keepalives.
    pub heartbeat: i32,
    #[serde(rename = "messageQPS")]
    pub message_qps: i32,
    pub message_burst: i32,
    #[serde(rename = "projectID")]
    pub project_id: String,
    pub tls_ca_file: String,
    pub tls_cert_file: String,
    pub tls_private_key_file: String,
    pub quic: EdgeHubQuic,
    pub websocket: EdgeHubWebSocket,
    /// Join token (KubeEdge always writes the key).
    pub token: String,
    /// `https://<cloud>:10002`, for certificate bootstrap and rotation.
    pub http_server: String,
    pub rotate_certificates: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EdgeHubWebSocket {
    pub enable: bool,
    /// Seconds.
    pub handshake_timeout: i32,
    /// Seconds.
    pub read_deadline: i32,
    /// `host:port` of cloudhub.
    pub server: String,
    /// Seconds.
    pub write_deadline: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EdgeHubQuic {
    pub enable: bool,
    pub handshake_timeout: i32,
    pub read_deadline: i32,
    pub server: String,
    pub write_deadline: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Edged {
    pub enable: bool,
    pub tailored_kubelet_config: TailoredKubeletConfig,
    /// The node name (`node_id` on the wire). Default: the machine's hostname, lower-cased.
    pub hostname_override: String,
    #[serde(rename = "nodeIP")]
    pub node_ip: String,
    pub custom_interface_name: String,
    pub register_node_namespace: String,
    pub container_runtime: String,
    pub pod_sandbox_image: String,
    pub remote_runtime_endpoint: String,
    pub remote_image_endpoint: String,
    pub root_directory: String,
    pub register_node: bool,
    pub register_schedulable: bool,
    pub node_labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub register_with_taints: Vec<Value>,
    pub max_per_pod_container_count: i32,
    pub max_container_count: i32,
    #[serde(rename = "minimumGCAge")]
    pub minimum_gc_age: KubeDuration,
    pub image_pull_progress_deadline: KubeDuration,
    pub cni_conf_dir: String,
    pub cni_bin_dir: String,
    pub cni_cache_dir: String,
    #[serde(rename = "networkPluginMTU")]
    pub network_plugin_mtu: i32,
}

/// The part of the kubelet's `KubeletConfiguration` KubeEdge exposes (and edged reads).
/// Other kubelet keys in the file are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TailoredKubeletConfig {
    pub address: String,
    pub read_only_port: i32,
    pub cluster_domain: String,
    #[serde(rename = "clusterDNS", skip_serializing_if = "Vec::is_empty")]
    pub cluster_dns: Vec<String>,
    pub cgroup_driver: String,
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cgroup_root: String,
    pub node_status_update_frequency: KubeDuration,
    pub node_status_report_frequency: KubeDuration,
    pub node_lease_duration_seconds: i32,
    pub sync_frequency: KubeDuration,
    pub max_pods: i32,
    pub pod_pids_limit: i64,
    pub static_pod_path: String,
    pub content_type: String,
    #[serde(rename = "resolvConf")]
    pub resolv_conf: String,
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: KubeDuration,
    /// Newer kubelets (1.29+): images unused this long go whatever the disk usage (0: off).
    #[serde(
        rename = "imageMaximumGCAge",
        skip_serializing_if = "KubeDuration::is_zero"
    )]
    pub image_maximum_gc_age: KubeDuration,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: i32,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: i32,
    pub runtime_request_timeout: KubeDuration,
    pub serialize_image_pulls: bool,
    #[serde(rename = "registryPullQPS")]
    pub registry_pull_qps: i32,
    pub registry_burst: i32,
    pub eviction_hard: BTreeMap<String, String>,
    pub eviction_pressure_transition_period: KubeDuration,
    pub fail_swap_on: bool,
    pub container_log_max_size: String,
    pub container_log_max_files: i32,
    pub config_map_and_secret_change_detection_strategy: String,
    pub enable_debugging_handlers: bool,
    pub volume_stats_agg_period: KubeDuration,
    pub enforce_node_allocatable: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub system_reserved: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub kube_reserved: BTreeMap<String, String>,
    /// Newer KubeEdge puts `registerNode` here; `modules.edged.registerNode` otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub register_node: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MetaManager {
    pub enable: bool,
    pub context_send_group: String,
    pub context_send_module: String,
    /// Seconds a request to the cloud waits for its reply.
    pub remote_query_timeout: i32,
    pub meta_server: MetaServer,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MetaServer {
    pub enable: bool,
    pub server: String,
    pub tls_ca_file: String,
    pub tls_cert_file: String,
    pub tls_private_key_file: String,
    pub service_account_issuers: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub api_audiences: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub service_account_key_files: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EventBus {
    pub enable: bool,
    #[serde(rename = "mqttQOS")]
    pub mqtt_qos: i32,
    pub mqtt_retain: bool,
    pub mqtt_session_queue_size: i32,
    pub mqtt_server_external: String,
    pub mqtt_server_internal: String,
    /// 0 internal broker, 1 both, 2 external.
    pub mqtt_mode: i32,
    #[serde(rename = "eventBusTLS")]
    pub event_bus_tls: EventBusTls,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EventBusTls {
    pub enable: bool,
    #[serde(rename = "tlsMqttCAFile")]
    pub tls_mqtt_ca_file: String,
    pub tls_mqtt_cert_file: String,
    pub tls_mqtt_private_key_file: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceBus {
    pub enable: bool,
    pub server: String,
    pub port: i32,
    pub timeout: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceTwin {
    pub enable: bool,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DbTest {
    pub enable: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EdgeStream {
    pub enable: bool,
    #[serde(rename = "tlsTunnelCAFile")]
    pub tls_tunnel_ca_file: String,
    pub tls_tunnel_cert_file: String,
    pub tls_tunnel_private_key_file: String,
    pub handshake_timeout: i32,
    pub read_deadline: i32,
    /// Tunnel server `host:port` (cloudstream, 10004).
    pub server: String,
    pub write_deadline: i32,
}

/// kubeedge-rs settings (top-level `kubeedgeRs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeEdgeRsSettings {
    /// Send the database inventory on every connect and expect only the difference
    /// (`edgecore/INVENTORY.md`). Turn off against a real KubeEdge cloudcore.
    pub inventory_resync: bool,
    /// Seconds without any frame from the cloud after which the link counts as dead;
    /// 0 means twice the heartbeat.
    pub dead_link_timeout: i32,
}

impl Default for KubeEdgeRsSettings {
    fn default() -> Self {
        KubeEdgeRsSettings {
            inventory_resync: true,
            dead_link_timeout: 0,
        }
    }
}

/// A Go `metav1.Duration`: written as Go prints durations (`10s`, `5m0s`, `1h0m0s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KubeDuration(pub Duration);

impl KubeDuration {
    pub fn secs(s: u64) -> Self {
        KubeDuration(Duration::from_secs(s))
    }

    pub fn is_zero(&self) -> bool {
        self.0.is_zero()
    }
}

impl Serialize for KubeDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_go_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for KubeDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_go_duration(&s)
            .map(KubeDuration)
            .map_err(serde::de::Error::custom)
    }
}

/// Parses Go's `time.ParseDuration` syntax (`300ms`, `1.5h`, `2h45m`), non-negative only.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?} (expected e.g. \"10s\", \"5m0s\", \"1h\")");
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() || t.starts_with('-') {
        return Err(bad());
    }
    let mut rest = t.strip_prefix('+').unwrap_or(t);
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (num, tail) = rest.split_at(num_len);
        let value: f64 = num.parse().map_err(|_| bad())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * scale;
        rest = tail;
    }
    // Go's Duration is int64 nanoseconds: larger values are "invalid duration" there too.
    if !total.is_finite() || total > i64::MAX as f64 / 1e9 {
        return Err(bad());
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// Go's `Duration.String()` for the values configs use (whole milliseconds and up).
pub fn format_go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let h = ms / 3_600_000;
    let m = (ms / 60_000) % 60;
    let s = (ms % 60_000) as f64 / 1000.0;
    let secs = if s.fract() == 0.0 {
        format!("{}s", s as u64)
    } else {
        format!("{s}s")
    };
    if h > 0 {
        format!("{h}h{m}m{secs}")
    } else if m > 0 {
        format!("{m}m{secs}")
    } else {
        secs
    }
}

/// One invalid value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path, e.g. `modules.edgeHub.heartbeat`.
    pub path: String,
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

/// Every invalid value found by [`EdgeCoreConfig::validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidConfig(pub Vec<FieldError>);

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for InvalidConfig {}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Unreadable file, broken YAML, or a value of the wrong type.
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{file}: invalid configuration:\n{errors}")]
    Invalid { file: String, errors: InvalidConfig },
}

impl Default for EdgeCoreConfig {
    fn default() -> Self {
        EdgeCoreConfig {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            database: Database::default(),
            modules: Modules::default(),
            feature_gates: BTreeMap::new(),
            kubeedge_rs: None,
        }
    }
}

impl Default for Database {
    fn default() -> Self {
        Database {
            driver_name: "sqlite3".into(),
            alias_name: "default".into(),
            data_source: DEFAULT_DATA_SOURCE.into(),
        }
    }
}

impl Default for EdgeHub {
    fn default() -> Self {
        EdgeHub {
            enable: true,
            heartbeat: constants::DEFAULT_HEARTBEAT_SECS as i32,
            message_qps: constants::DEFAULT_MESSAGE_QPS as i32,
            message_burst: constants::DEFAULT_MESSAGE_BURST as i32,
            project_id: constants::DEFAULT_PROJECT_ID.into(),
            tls_ca_file: DEFAULT_CA_FILE.into(),
            tls_cert_file: DEFAULT_CERT_FILE.into(),
            tls_private_key_file: DEFAULT_KEY_FILE.into(),
            quic: EdgeHubQuic::default(),
            websocket: EdgeHubWebSocket::default(),
            token: String::new(),
            http_server: format!(
                "https://{}",
                join_host_port(&local_ip(), constants::DEFAULT_CLOUDHUB_HTTPS_PORT)
            ),
            rotate_certificates: true,
        }
    }
}

impl Default for EdgeHubWebSocket {
    fn default() -> Self {
        EdgeHubWebSocket {
            enable: true,
            handshake_timeout: 30,
            read_deadline: 15,
            server: join_host_port(&local_ip(), constants::DEFAULT_CLOUDHUB_PORT),
            write_deadline: 15,
        }
    }
}

impl Default for EdgeHubQuic {
    fn default() -> Self {
        EdgeHubQuic {
            enable: false,
            handshake_timeout: 30,
            read_deadline: 15,
            server: join_host_port(&local_ip(), 10001),
            write_deadline: 15,
        }
    }
}

impl Default for Edged {
    fn default() -> Self {
        Edged {
            enable: true,
            tailored_kubelet_config: TailoredKubeletConfig::default(),
            hostname_override: hostname(),
            node_ip: String::new(),
            custom_interface_name: String::new(),
            register_node_namespace: "default".into(),
            container_runtime: "remote".into(),
            pod_sandbox_image: "kubeedge/pause:3.6".into(),
            remote_runtime_endpoint: DEFAULT_RUNTIME_ENDPOINT.into(),
            remote_image_endpoint: DEFAULT_RUNTIME_ENDPOINT.into(),
            root_directory: "/var/lib/edged".into(),
            register_node: true,
            register_schedulable: true,
            node_labels: BTreeMap::new(),
            register_with_taints: Vec::new(),
            max_per_pod_container_count: 1,
            max_container_count: -1,
            minimum_gc_age: KubeDuration::secs(0),
            image_pull_progress_deadline: KubeDuration::secs(60),
            cni_conf_dir: "/etc/cni/net.d".into(),
            cni_bin_dir: "/opt/cni/bin".into(),
            cni_cache_dir: "/var/lib/cni/cache".into(),
            network_plugin_mtu: 1500,
        }
    }
}

impl Default for TailoredKubeletConfig {
    fn default() -> Self {
        TailoredKubeletConfig {
            address: "127.0.0.1".into(),
            read_only_port: 10350,
            cluster_domain: "cluster.local".into(),
            cluster_dns: Vec::new(),
            cgroup_driver: "cgroupfs".into(),
            cgroups_per_qos: true,
            cgroup_root: String::new(),
            node_status_update_frequency: KubeDuration::secs(10),
            node_status_report_frequency: KubeDuration::secs(300),
            node_lease_duration_seconds: 40,
            sync_frequency: KubeDuration::secs(60),
            max_pods: 110,
            pod_pids_limit: -1,
            static_pod_path: "/etc/kubeedge/manifests".into(),
            content_type: "application/json".into(),
            resolv_conf: "/etc/resolv.conf".into(),
            image_minimum_gc_age: KubeDuration::secs(120),
            image_maximum_gc_age: KubeDuration::secs(0),
            image_gc_high_threshold_percent: 80,
            image_gc_low_threshold_percent: 40,
            runtime_request_timeout: KubeDuration::secs(120),
            serialize_image_pulls: true,
            registry_pull_qps: 5,
            registry_burst: 10,
            eviction_hard: [
                ("imagefs.available", "15%"),
                ("memory.available", "100Mi"),
                ("nodefs.available", "10%"),
                ("nodefs.inodesFree", "5%"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            eviction_pressure_transition_period: KubeDuration::secs(300),
            fail_swap_on: false,
            container_log_max_size: "10Mi".into(),
            container_log_max_files: 5,
            config_map_and_secret_change_detection_strategy: "Get".into(),
            enable_debugging_handlers: true,
            volume_stats_agg_period: KubeDuration::secs(60),
            enforce_node_allocatable: vec!["pods".into()],
            system_reserved: BTreeMap::new(),
            kube_reserved: BTreeMap::new(),
            register_node: None,
        }
    }
}

impl Default for MetaManager {
    fn default() -> Self {
        MetaManager {
            enable: true,
            context_send_group: "hub".into(),
            context_send_module: "websocket".into(),
            remote_query_timeout: 60,
            meta_server: MetaServer::default(),
        }
    }
}

impl Default for MetaServer {
    fn default() -> Self {
        MetaServer {
            enable: false,
            server: "127.0.0.1:10550".into(),
            tls_ca_file: DEFAULT_CA_FILE.into(),
            tls_cert_file: DEFAULT_CERT_FILE.into(),
            tls_private_key_file: DEFAULT_KEY_FILE.into(),
            service_account_issuers: vec!["https://kubernetes.default.svc.cluster.local".into()],
            api_audiences: Vec::new(),
            service_account_key_files: Vec::new(),
        }
    }
}

impl Default for EventBus {
    fn default() -> Self {
        EventBus {
            enable: true,
            mqtt_qos: 0,
            mqtt_retain: false,
            mqtt_session_queue_size: 100,
            mqtt_server_external: "tcp://127.0.0.1:1883".into(),
            mqtt_server_internal: "tcp://127.0.0.1:1884".into(),
            mqtt_mode: 2,
            event_bus_tls: EventBusTls::default(),
        }
    }
}

impl Default for EventBusTls {
    fn default() -> Self {
        EventBusTls {
            enable: false,
            tls_mqtt_ca_file: DEFAULT_CA_FILE.into(),
            tls_mqtt_cert_file: DEFAULT_CERT_FILE.into(),
            tls_mqtt_private_key_file: DEFAULT_KEY_FILE.into(),
        }
    }
}

impl Default for ServiceBus {
    fn default() -> Self {
        ServiceBus {
            enable: false,
            server: "127.0.0.1".into(),
            port: 9060,
            timeout: 60,
        }
    }
}

impl Default for DeviceTwin {
    fn default() -> Self {
        DeviceTwin { enable: true }
    }
}

impl Default for EdgeStream {
    fn default() -> Self {
        EdgeStream {
            enable: false,
            tls_tunnel_ca_file: DEFAULT_CA_FILE.into(),
            tls_tunnel_cert_file: DEFAULT_CERT_FILE.into(),
            tls_tunnel_private_key_file: DEFAULT_KEY_FILE.into(),
            handshake_timeout: 30,
            read_deadline: 15,
            server: "127.0.0.1:10004".into(),
            write_deadline: 15,
        }
    }
}

impl EdgeCoreConfig {
    /// The full configuration with KubeEdge's defaults (what `--defaultconfig` prints), plus
    /// the `kubeedgeRs` section with its defaults.
    pub fn default_config() -> Self {
        EdgeCoreConfig {
            kubeedge_rs: Some(KubeEdgeRsSettings::default()),
            ..EdgeCoreConfig::default()
        }
    }

    /// The configuration `--minconfig` describes. Loading [`Self::to_minimal_yaml`] gives back
    /// this value: every key the minimal file leaves out takes its default.
    pub fn minimal_config() -> Self {
        EdgeCoreConfig::default()
    }

    /// Reads, parses and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
            file: file.clone(),
            source,
        })?;
        let config = Self::from_yaml(&text, &file)?;
        config
            .validate()
            .map_err(|errors| ConfigError::Invalid { file, errors })?;
        Ok(config)
    }

    /// Parses YAML laid over the defaults (no validation). `file` names the source in errors.
    pub fn from_yaml(text: &str, file: &str) -> Result<Self, FileError> {
        let mut value: Value = serde_saphyr::from_str(text).map_err(|e| FileError::Syntax {
            file: file.to_string(),
            detail: e.to_string(),
        })?;
        strip_nulls(&mut value);
        if !value.is_object() {
            return Err(FileError::Syntax {
                file: file.to_string(),
                detail: "the top level must be a mapping (apiVersion, kind, database, modules)"
                    .into(),
            });
        }
        serde_path_to_error::deserialize(value).map_err(|e| FileError::Field {
            file: file.to_string(),
            path: e.path().to_string(),
            detail: e.inner().to_string(),
        })
    }

    pub fn to_yaml(&self) -> Result<String, String> {
        serde_saphyr::to_string(self).map_err(|e| e.to_string())
    }

    /// The keys KubeEdge's `--minconfig` prints, with this configuration's values.
    pub fn to_minimal_yaml(&self) -> Result<String, String> {
        let full = serde_json::to_value(self).map_err(|e| e.to_string())?;
        let pick = |v: &Value, keys: &[&str]| -> Value {
            let mut out = serde_json::Map::new();
            for k in keys {
                if let Some(x) = v.get(*k) {
                    out.insert((*k).to_string(), x.clone());
                }
            }
            Value::Object(out)
        };
        let modules = &full["modules"];
        let minimal = serde_json::json!({
            "apiVersion": full["apiVersion"],
            "kind": full["kind"],
            "database": pick(&full["database"], &["dataSource"]),
            "modules": {
                "edged": modules["edged"],
                "edgeHub": pick(&modules["edgeHub"], &[
                    "enable", "heartbeat", "tlsCaFile", "tlsCertFile", "tlsPrivateKeyFile",
                    "websocket", "httpServer", "token",
                ]),
                "eventBus": pick(&modules["eventBus"], &[
                    "enable", "mqttMode", "mqttQOS", "mqttRetain", "mqttServerExternal",
                    "mqttServerInternal",
                ]),
            },
        });
        serde_saphyr::to_string(&minimal).map_err(|e| e.to_string())
    }

    /// Every invalid value, with its path and the reason.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        let mut errs = Vec::new();
        let mut bad = |path: &str, reason: String| {
            errs.push(FieldError {
                path: path.to_string(),
                reason,
            })
        };
        if self.kind != KIND {
            bad("kind", format!("must be {KIND:?}, got {:?}", self.kind));
        }
        if !self.api_version.starts_with("edgecore.config.kubeedge.io/") {
            bad(
                "apiVersion",
                format!("must be {API_VERSION:?}, got {:?}", self.api_version),
            );
        } else if self.api_version != API_VERSION {
            bad(
                "apiVersion",
                format!(
                    "only {API_VERSION} is supported, got {:?} (regenerate the file with `edgecore --defaultconfig`)",
                    self.api_version
                ),
            );
        }
        if self.database.driver_name != "sqlite3" {
            bad(
                "database.driverName",
                format!("must be \"sqlite3\", got {:?}", self.database.driver_name),
            );
        }
        if self.database.data_source.is_empty() {
            bad("database.dataSource", "must not be empty".into());
        }

        let hub = &self.modules.edge_hub;
        if hub.enable {
            positive(&mut bad, "modules.edgeHub.heartbeat", hub.heartbeat);
            non_negative(&mut bad, "modules.edgeHub.messageQPS", hub.message_qps);
            non_negative(&mut bad, "modules.edgeHub.messageBurst", hub.message_burst);
            if hub.quic.enable {
                bad(
                    "modules.edgeHub.quic.enable",
                    "QUIC (KubeEdge's gQUIC) is not supported; use websocket".into(),
                );
            }
            if !hub.websocket.enable {
                bad(
                    "modules.edgeHub.websocket.enable",
                    "must be true (the WebSocket is the only supported transport)".into(),
                );
            }
            let ws = &hub.websocket;
            positive(
                &mut bad,
                "modules.edgeHub.websocket.handshakeTimeout",
                ws.handshake_timeout,
            );
            positive(
                &mut bad,
                "modules.edgeHub.websocket.writeDeadline",
                ws.write_deadline,
            );
            non_negative(
                &mut bad,
                "modules.edgeHub.websocket.readDeadline",
                ws.read_deadline,
            );
            if let Err(e) = crate::edgehub::dial::split_server(&ws.server) {
                bad("modules.edgeHub.websocket.server", e.to_string());
            }
            if hub.project_id.is_empty() {
                bad("modules.edgeHub.projectID", "must not be empty".into());
            }
            for (path, file) in [
                ("modules.edgeHub.tlsCaFile", &hub.tls_ca_file),
                ("modules.edgeHub.tlsCertFile", &hub.tls_cert_file),
                (
                    "modules.edgeHub.tlsPrivateKeyFile",
                    &hub.tls_private_key_file,
                ),
            ] {
                if file.is_empty() {
                    bad(path, "must not be empty".into());
                }
            }
            if !hub.http_server.is_empty() && !hub.http_server.starts_with("https://") {
                bad(
                    "modules.edgeHub.httpServer",
                    format!("must be an https:// URL, got {:?}", hub.http_server),
                );
            }
        }

        let edged = &self.modules.edged;
        if let Err(reason) = validate_node_name(&edged.hostname_override) {
            bad("modules.edged.hostnameOverride", reason);
        }
        if edged.register_node_namespace.is_empty() {
            bad(
                "modules.edged.registerNodeNamespace",
                "must not be empty".into(),
            );
        }
        if !edged.node_ip.is_empty() && edged.node_ip.parse::<std::net::IpAddr>().is_err() {
            bad(
                "modules.edged.nodeIP",
                format!("not an IP address: {:?}", edged.node_ip),
            );
        }
        if edged.enable {
            if edged.container_runtime != "remote" {
                bad(
                    "modules.edged.containerRuntime",
                    format!(
                        "must be \"remote\" (a CRI runtime), got {:?}",
                        edged.container_runtime
                    ),
                );
            }
            if edged.remote_runtime_endpoint.is_empty() {
                bad(
                    "modules.edged.remoteRuntimeEndpoint",
                    "must not be empty".into(),
                );
            }
            let k = &edged.tailored_kubelet_config;
            let p = "modules.edged.tailoredKubeletConfig";
            if !(0..=65535).contains(&k.read_only_port) {
                bad(
                    &format!("{p}.readOnlyPort"),
                    format!("must be between 0 and 65535, got {}", k.read_only_port),
                );
            }
            if !matches!(k.cgroup_driver.as_str(), "cgroupfs" | "systemd") {
                bad(
                    &format!("{p}.cgroupDriver"),
                    format!(
                        "must be \"cgroupfs\" or \"systemd\", got {:?}",
                        k.cgroup_driver
                    ),
                );
            }
            positive(
                &mut bad,
                &format!("{p}.nodeLeaseDurationSeconds"),
                k.node_lease_duration_seconds,
            );
            non_negative(&mut bad, &format!("{p}.maxPods"), k.max_pods);
            for (name, d) in [
                ("nodeStatusUpdateFrequency", k.node_status_update_frequency),
                ("nodeStatusReportFrequency", k.node_status_report_frequency),
                ("syncFrequency", k.sync_frequency),
            ] {
                if d.0.is_zero() {
                    bad(&format!("{p}.{name}"), "must be > 0".into());
                }
            }
            for (name, v) in [
                (
                    "imageGCHighThresholdPercent",
                    k.image_gc_high_threshold_percent,
                ),
                (
                    "imageGCLowThresholdPercent",
                    k.image_gc_low_threshold_percent,
                ),
            ] {
                if !(0..=100).contains(&v) {
                    bad(
                        &format!("{p}.{name}"),
                        format!("must be between 0 and 100, got {v}"),
                    );
                }
            }
            if k.image_gc_low_threshold_percent >= k.image_gc_high_threshold_percent {
                bad(
                    &format!("{p}.imageGCLowThresholdPercent"),
                    format!(
                        "must be less than imageGCHighThresholdPercent ({})",
                        k.image_gc_high_threshold_percent
                    ),
                );
            }
            if !k.image_maximum_gc_age.is_zero()
                && k.image_maximum_gc_age.0 <= k.image_minimum_gc_age.0
            {
                bad(
                    &format!("{p}.imageMaximumGCAge"),
                    format!(
                        "must be greater than imageMinimumGCAge ({})",
                        format_go_duration(k.image_minimum_gc_age.0)
                    ),
                );
            }
            if k.address.parse::<std::net::IpAddr>().is_err() {
                bad(
                    &format!("{p}.address"),
                    format!("not an IP address: {:?}", k.address),
                );
            }
            for (i, dns) in k.cluster_dns.iter().enumerate() {
                if dns.parse::<std::net::IpAddr>().is_err() {
                    bad(
                        &format!("{p}.clusterDNS[{i}]"),
                        format!("not an IP address: {dns:?}"),
                    );
                }
            }
        }

        let mm = &self.modules.meta_manager;
        if mm.enable {
            positive(
                &mut bad,
                "modules.metaManager.remoteQueryTimeout",
                mm.remote_query_timeout,
            );
        }
        let eb = &self.modules.event_bus;
        if eb.enable {
            if !(0..=2).contains(&eb.mqtt_mode) {
                bad(
                    "modules.eventBus.mqttMode",
                    format!("must be 0, 1 or 2, got {}", eb.mqtt_mode),
                );
            }
            if !(0..=2).contains(&eb.mqtt_qos) {
                bad(
                    "modules.eventBus.mqttQOS",
                    format!("must be 0, 1 or 2, got {}", eb.mqtt_qos),
                );
            }
        }
        if let Some(ext) = &self.kubeedge_rs {
            non_negative(
                &mut bad,
                "kubeedgeRs.deadLinkTimeout",
                ext.dead_link_timeout,
            );
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(InvalidConfig(errs))
        }
    }

    /// The node name: `modules.edged.hostnameOverride`.
    pub fn node_name(&self) -> &str {
        &self.modules.edged.hostname_override
    }

    /// The kubeedge-rs settings in effect (defaults when the section is absent).
    pub fn kubeedge_rs_settings(&self) -> KubeEdgeRsSettings {
        self.kubeedge_rs.clone().unwrap_or_default()
    }

    /// edgehub's settings. Call on a validated configuration (negative values are clamped).
    pub fn edgehub_config(&self) -> EdgeHubConfig {
        let hub = &self.modules.edge_hub;
        let ws = &hub.websocket;
        let secs = |s: i32| Duration::from_secs(s.max(0) as u64);
        let heartbeat = secs(hub.heartbeat.max(1));
        let ext = self.kubeedge_rs_settings();
        let dead_link_timeout = if ext.dead_link_timeout > 0 {
            secs(ext.dead_link_timeout)
        } else {
            heartbeat * 2
        };
        let capabilities = if ext.inventory_resync {
            vec![constants::CAPABILITY_INVENTORY.to_string()]
        } else {
            Vec::new()
        };
        EdgeHubConfig {
            server: ws.server.clone(),
            project_id: hub.project_id.clone(),
            node_name: self.node_name().to_string(),
            heartbeat,
            dead_link_timeout,
            handshake_timeout: secs(ws.handshake_timeout.max(1)),
            write_timeout: secs(ws.write_deadline.max(1)),
            message_qps: hub.message_qps.max(0) as u32,
            message_burst: hub.message_burst.max(0) as u32,
            capabilities,
            ..EdgeHubConfig::default()
        }
    }

    /// metamanager's settings.
    pub fn metamanager_config(&self) -> MetaManagerConfig {
        let mm = &self.modules.meta_manager;
        MetaManagerConfig {
            node_name: self.node_name().to_string(),
            node_namespace: self.modules.edged.register_node_namespace.clone(),
            remote_query_timeout: Duration::from_secs(mm.remote_query_timeout.max(1) as u64),
            inventory_resync: self.kubeedge_rs_settings().inventory_resync,
            ..MetaManagerConfig::default()
        }
    }
}

fn positive(bad: &mut impl FnMut(&str, String), path: &str, v: i32) {
    if v <= 0 {
        bad(path, format!("must be > 0, got {v}"));
    }
}

fn non_negative(bad: &mut impl FnMut(&str, String), path: &str, v: i32) {
    if v < 0 {
        bad(path, format!("must not be negative, got {v}"));
    }
}

/// Removes `null` map entries everywhere, so that they take their defaults (Go leaves the
/// default in place for a JSON null as well).
fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|_, x| !x.is_null());
            map.values_mut().for_each(strip_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// The machine's hostname, lower-cased (KubeEdge `util.GetHostname`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// The address this machine uses to reach other hosts, as text.
pub fn local_ip() -> String {
    kubeedge_shared::net::local_ip().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<EdgeCoreConfig, FileError> {
        EdgeCoreConfig::from_yaml(text, "edgecore.yaml")
    }

    #[test]
    fn default_config_round_trips_through_yaml_and_is_valid() {
        let c = EdgeCoreConfig::default_config();
        c.validate().unwrap();
        let yaml = c.to_yaml().unwrap();
        assert!(
            yaml.contains("apiVersion: edgecore.config.kubeedge.io/v1alpha2"),
            "{yaml}"
        );
        assert!(yaml.contains("messageQPS: 30"), "{yaml}");
        assert!(yaml.contains("nodeStatusReportFrequency: 5m0s"), "{yaml}");
        let back = parse(&yaml).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn kubeedge_defaults() {
        let c = EdgeCoreConfig::default_config();
        let hub = &c.modules.edge_hub;
        assert_eq!(
            (hub.heartbeat, hub.message_qps, hub.message_burst),
            (15, 30, 60)
        );
        assert_eq!(hub.project_id, "e632aba927ea4ac2b575ec1603d56f10");
        assert!(hub.websocket.server.ends_with(":10000"));
        assert!(hub.http_server.starts_with("https://") && hub.http_server.ends_with(":10002"));
        assert_eq!(c.database.data_source, "/var/lib/kubeedge/edgecore.db");
        let e = &c.modules.edged;
        assert_eq!(e.hostname_override, hostname());
        assert_eq!(
            e.hostname_override,
            e.hostname_override.to_ascii_lowercase()
        );
        assert_eq!(e.tailored_kubelet_config.read_only_port, 10350);
        assert_eq!(e.tailored_kubelet_config.node_lease_duration_seconds, 40);
        assert_eq!(c.modules.meta_manager.remote_query_timeout, 60);
        assert_eq!(c.modules.meta_manager.context_send_module, "websocket");
    }

    #[test]
    fn absent_and_null_keys_keep_defaults_and_unknown_keys_are_ignored() {
        let c = parse(
            "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\nmodules:\n  edgeHub:\n    heartbeat: 20\n    someFutureKey: {a: 1}\n    websocket:\n      server: 10.0.0.1:10000\n  metaManager:\n    metaServer:\n      apiAudiences: null\n  taskManager:\n    enable: true\n",
        )
        .unwrap();
        assert_eq!(c.modules.edge_hub.heartbeat, 20);
        assert_eq!(c.modules.edge_hub.message_qps, 30);
        let k = parse(
            "modules:\n  edged:\n    tailoredKubeletConfig:\n      imageGCHighThresholdPercent: 90\n      imageGCLowThresholdPercent: 70\n      imageMinimumGCAge: 5m\n      imageMaximumGCAge: 168h\n      cgroupsPerQOS: false\n      registryPullQPS: 1\n      clusterDNS: [10.96.0.10]\n",
        )
        .unwrap()
        .modules
        .edged
        .tailored_kubelet_config;
        assert_eq!(
            (
                k.image_gc_high_threshold_percent,
                k.image_gc_low_threshold_percent
            ),
            (90, 70)
        );
        assert_eq!(k.image_minimum_gc_age, KubeDuration::secs(300));
        assert_eq!(k.image_maximum_gc_age, KubeDuration::secs(168 * 3600));
        assert!(!k.cgroups_per_qos);
        assert_eq!(k.registry_pull_qps, 1);
        assert_eq!(k.cluster_dns, ["10.96.0.10"]);
        assert_eq!(c.modules.edge_hub.websocket.server, "10.0.0.1:10000");
        assert_eq!(c.modules.edge_hub.websocket.handshake_timeout, 30);
        assert!(c.modules.edge_hub.enable);
        assert!(c.modules.meta_manager.meta_server.api_audiences.is_empty());
    }

    #[test]
    fn wrong_types_name_the_field() {
        let err = parse("modules:\n  edgeHub:\n    heartbeat: often\n").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("modules.edgeHub.heartbeat"), "{text}");
        let err =
            parse("modules:\n  edged:\n    tailoredKubeletConfig:\n      syncFrequency: soon\n")
                .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("modules.edged.tailoredKubeletConfig.syncFrequency"),
            "{text}"
        );
        assert!(text.contains("invalid duration"), "{text}");
        let err = parse("modules:\n  edgeHub:\n    enable: maybe\n").unwrap_err();
        assert!(err.to_string().contains("modules.edgeHub.enable"), "{err}");
        assert!(matches!(
            parse("modules: [\n"),
            Err(FileError::Syntax { .. })
        ));
        assert!(matches!(parse("- a\n- b\n"), Err(FileError::Syntax { .. })));
    }

    #[test]
    fn invalid_values_are_all_reported_with_their_paths() {
        let mut c = EdgeCoreConfig::default_config();
        c.modules.edge_hub.heartbeat = 0;
        c.modules.edge_hub.message_qps = -1;
        c.modules.edge_hub.websocket.server = "nocolon".into();
        c.modules.edge_hub.quic.enable = true;
        c.modules.edged.hostname_override = "Edge_1".into();
        c.modules.edged.tailored_kubelet_config.cgroup_driver = "lxc".into();
        c.modules.edged.tailored_kubelet_config.cluster_dns = vec!["dns".into()];
        c.modules.edged.tailored_kubelet_config.image_maximum_gc_age = KubeDuration::secs(60);
        c.modules.meta_manager.remote_query_timeout = 0;
        c.kind = "CloudCore".into();
        let errors = c.validate().unwrap_err();
        let paths: Vec<&str> = errors.0.iter().map(|e| e.path.as_str()).collect();
        for p in [
            "kind",
            "modules.edgeHub.heartbeat",
            "modules.edgeHub.messageQPS",
            "modules.edgeHub.websocket.server",
            "modules.edgeHub.quic.enable",
            "modules.edged.hostnameOverride",
            "modules.edged.tailoredKubeletConfig.cgroupDriver",
            "modules.edged.tailoredKubeletConfig.clusterDNS[0]",
            "modules.edged.tailoredKubeletConfig.imageMaximumGCAge",
            "modules.metaManager.remoteQueryTimeout",
        ] {
            assert!(paths.contains(&p), "{p} missing in {errors}");
        }
        assert!(
            errors
                .to_string()
                .contains("modules.edgeHub.heartbeat: must be > 0"),
            "{errors}"
        );
    }

    #[test]
    fn kubeedge_v1_15_sample_loads() {
        let text = include_str!("../tests/data/edgecore-v1.15.yaml");
        let c = parse(text).unwrap();
        c.validate().unwrap();
        assert_eq!(c.node_name(), "edge-node-1");
        assert_eq!(c.modules.edge_hub.websocket.server, "192.168.1.10:10000");
        assert_eq!(c.modules.edge_hub.http_server, "https://192.168.1.10:10002");
        let k = &c.modules.edged.tailored_kubelet_config;
        assert_eq!(k.cluster_dns, vec!["169.254.96.16".to_string()]);
        assert_eq!(k.node_status_update_frequency.0, Duration::from_secs(10));
        assert_eq!(k.sync_frequency.0, Duration::from_secs(60));
        assert_eq!(k.eviction_hard["memory.available"], "100Mi");
        assert_eq!(c.modules.edged.node_labels["region"], "hz");
        let hub = c.edgehub_config();
        assert_eq!(hub.node_name, "edge-node-1");
        assert_eq!(hub.heartbeat, Duration::from_secs(15));
        assert_eq!(hub.capabilities, vec!["inventory-resync".to_string()]);
    }

    /// Every key the default config writes must be spelled as KubeEdge spells it: each
    /// path must exist in the KubeEdge-written sample.
    #[test]
    fn every_written_key_is_a_kubeedge_key() {
        fn paths(v: &Value, prefix: &str, out: &mut Vec<String>) {
            if let Value::Object(m) = v {
                for (k, x) in m {
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    // evictionHard keys are data, not schema.
                    if !p.ends_with("evictionHard") && !p.ends_with("nodeLabels") {
                        paths(x, &p, out);
                    }
                    out.push(p);
                }
            }
        }
        let sample: Value =
            serde_saphyr::from_str(include_str!("../tests/data/edgecore-v1.15.yaml")).unwrap();
        let mut ours = Vec::new();
        paths(
            &serde_json::to_value(EdgeCoreConfig::default()).unwrap(),
            "",
            &mut ours,
        );
        let mut theirs = Vec::new();
        paths(&sample, "", &mut theirs);
        let unknown: Vec<_> = ours.iter().filter(|p| !theirs.contains(p)).collect();
        assert!(
            unknown.is_empty(),
            "keys KubeEdge does not write: {unknown:?}"
        );
    }

    #[test]
    fn minimal_yaml_is_a_subset_that_loads_back_to_the_minimal_config() {
        let c = EdgeCoreConfig::minimal_config();
        let yaml = c.to_minimal_yaml().unwrap();
        assert!(yaml.contains("websocket:"), "{yaml}");
        assert!(!yaml.contains("serviceBus"), "{yaml}");
        assert!(!yaml.contains("messageQPS"), "{yaml}");
        assert_eq!(parse(&yaml).unwrap(), c);
    }

    #[test]
    fn edgehub_and_metamanager_settings_follow_the_file() {
        let mut c = EdgeCoreConfig::default_config();
        c.modules.edge_hub.heartbeat = 7;
        c.modules.edge_hub.websocket.server = "cloud:443".into();
        c.modules.edge_hub.websocket.write_deadline = 3;
        c.modules.edged.hostname_override = "n1".into();
        c.modules.meta_manager.remote_query_timeout = 9;
        c.kubeedge_rs = Some(KubeEdgeRsSettings {
            inventory_resync: false,
            dead_link_timeout: 50,
        });
        let h = c.edgehub_config();
        assert_eq!(h.server, "cloud:443");
        assert_eq!(h.heartbeat, Duration::from_secs(7));
        assert_eq!(h.write_timeout, Duration::from_secs(3));
        assert_eq!(h.dead_link_timeout, Duration::from_secs(50));
        assert!(h.capabilities.is_empty());
        let m = c.metamanager_config();
        assert_eq!(m.node_name, "n1");
        assert_eq!(m.remote_query_timeout, Duration::from_secs(9));
        assert!(!m.inventory_resync);
    }

    #[test]
    fn go_durations_parse_and_print() {
        for (text, secs) in [
            ("10s", 10.0),
            ("5m0s", 300.0),
            ("1h0m0s", 3600.0),
            ("1.5h", 5400.0),
            ("300ms", 0.3),
            ("0", 0.0),
            ("2h45m", 9900.0),
        ] {
            assert_eq!(
                parse_go_duration(text).unwrap().as_secs_f64(),
                secs,
                "{text}"
            );
        }
        for bad in ["", "10", "-1s", "1d", "s", "1..2s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(format_go_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(format_go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(format_go_duration(Duration::from_secs(3661)), "1h1m1s");
        assert_eq!(format_go_duration(Duration::from_millis(100)), "100ms");
        assert_eq!(format_go_duration(Duration::ZERO), "0s");
    }

    #[test]
    fn durations_beyond_go_int64_nanoseconds_are_errors_not_panics() {
        let huge = format!("1{}s", "0".repeat(400));
        for bad in [
            "18446744073709551616s",
            "2562048h",
            "9223372037s",
            huge.as_str(),
        ] {
            let e = parse_go_duration(bad).unwrap_err();
            assert!(e.contains("invalid duration"), "{bad}: {e}");
        }
        assert_eq!(
            parse_go_duration("2562047h").unwrap(),
            Duration::from_secs(2_562_047 * 3600)
        );
    }
}
