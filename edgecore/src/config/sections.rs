//! The sections of `edgecore.yaml` with KubeEdge's keys and defaults.

use super::{
    API_VERSION, DEFAULT_CA_FILE, DEFAULT_CERT_FILE, DEFAULT_DATA_SOURCE, DEFAULT_KEY_FILE,
    DEFAULT_RUNTIME_ENDPOINT, KIND,
};
use super::{hostname, local_ip};
use kubeedge_shared::constants;
use kubeedge_shared::duration::KubeDuration;
use kubeedge_shared::net::join_host_port;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

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
    /// Node tasks (`operations.kubeedge.io/v1alpha2` jobs): off by default as in KubeEdge.
    pub task_manager: TaskManager,
    #[serde(rename = "dbTest")]
    pub db_test: DbTest,
    pub edge_stream: EdgeStream,
    /// Services at the edge (kubeedge-rs; KubeEdge moved this to its separate EdgeMesh
    /// agent, which binds the same address: enable one of them).
    pub edge_mesh: EdgeMesh,
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
    pub cgroup_driver: CgroupDriver,
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
    /// Soft thresholds, each with a grace period (kubelet keys; KubeEdge's sample has none).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_soft: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    /// Seconds a pod evicted for a soft threshold may take to stop (0: its own grace period).
    #[serde(skip_serializing_if = "is_zero_i64")]
    pub eviction_max_pod_grace_period: i64,
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
    /// The second HTTPS listener, on a dummy interface, that pods reach as
    /// `KUBERNETES_SERVICE_HOST:PORT` (KubeEdge v1.17; with `requireAuthorization`).
    pub dummy_server: String,
    /// kubeedge-rs only: kinds kept watched at the cloud (and so stored at the edge) whoever
    /// reads them, as `<version>/<plural>` or `<group>/<version>/<plural>` — e.g. `v1/endpoints`
    /// and `v1/namespaces` for KubeEdge's EdgeMesh agent, which then finds them even when it
    /// first starts while the edge is offline.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub standing_watches: Vec<String>,
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
    /// Empty: `hub-client-sub-<10 digits of the ms clock>`.
    #[serde(rename = "mqttSubClientID")]
    pub mqtt_sub_client_id: String,
    /// Empty: `hub-client-pub-<10 digits of the ms clock>`.
    #[serde(rename = "mqttPubClientID")]
    pub mqtt_pub_client_id: String,
    pub mqtt_username: String,
    pub mqtt_password: String,
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
pub struct TaskManager {
    pub enable: bool,
    /// KubeEdge's queue length (kept for its files; tasks here are bounded by their jobs).
    pub buffer: i32,
}

impl Default for TaskManager {
    fn default() -> Self {
        TaskManager {
            enable: false,
            buffer: 10,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceTwin {
    pub enable: bool,
    /// Directory of edgecore's DMI socket `dmi.sock` (KubeEdge v1.23's key; earlier
    /// versions always use `/etc/kubeedge/dmi.sock`, the default here).
    pub dmi_sock_path: String,
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

/// `modules.edgeMesh`: DNS for Services on a node-local address, ClusterIP rules, the relay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EdgeMesh {
    pub enable: bool,
    /// The node-local address pods use as their nameserver (EdgeMesh's 169.254.96.16),
    /// put on the dummy interface `edgemesh0` (or `lo` where the kernel has no dummy
    /// driver). With `edged.tailoredKubeletConfig.clusterDNS` empty, pods get it.
    pub listen_address: String,
    pub dns: EdgeMeshDns,
    pub proxy: EdgeMeshProxy,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EdgeMeshDns {
    pub enable: bool,
    pub port: u16,
    /// Where other names are forwarded (`host:port` or an IP); empty: the nameservers of
    /// `edged.tailoredKubeletConfig.resolvConf`.
    pub upstream_servers: Vec<String>,
    /// Seconds answers about Services may be cached.
    pub ttl: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EdgeMeshProxy {
    pub enable: bool,
    /// Prefix of the iptables chains (`KE-SERVICES`, `KE-SVC-…`).
    pub chain_prefix: String,
    /// Port of the relay on `listenAddress`, for endpoints on other nodes; 0: no relay.
    pub relay_port: u16,
    /// Endpoint addresses on other nodes that this node routes to directly (e.g. a flat
    /// pod network); the others go through the relay (TCP) or are not reached (UDP).
    #[serde(rename = "directCIDRs")]
    pub direct_cidrs: Vec<String>,
    /// Rules are updated at most this often (a Go duration).
    pub min_sync_period: KubeDuration,
}

impl Default for EdgeMesh {
    fn default() -> Self {
        EdgeMesh {
            enable: false,
            listen_address: "169.254.96.16".into(),
            dns: EdgeMeshDns::default(),
            proxy: EdgeMeshProxy::default(),
        }
    }
}

impl Default for EdgeMeshDns {
    fn default() -> Self {
        EdgeMeshDns {
            enable: true,
            port: 53,
            upstream_servers: Vec::new(),
            ttl: 5,
        }
    }
}

impl Default for EdgeMeshProxy {
    fn default() -> Self {
        EdgeMeshProxy {
            enable: true,
            chain_prefix: "KE".into(),
            relay_port: 40001,
            direct_cidrs: Vec::new(),
            min_sync_period: KubeDuration(std::time::Duration::from_millis(100)),
        }
    }
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
    /// Offer `ping-keepalive`: with a cloud that accepts it, the heartbeat is a WebSocket
    /// ping alone (no keepalive message).
    pub ping_keepalive: bool,
    /// Offer `cloud-lease`: with a cloud that accepts it, the cloud renews the node Lease
    /// while the link is up and node status is sent only when it changes. Offered only when
    /// the heartbeat is at most half of `nodeLeaseDurationSeconds`.
    pub cloud_lease: bool,
}

impl Default for KubeEdgeRsSettings {
    fn default() -> Self {
        KubeEdgeRsSettings {
            inventory_resync: true,
            dead_link_timeout: 0,
            ping_keepalive: true,
            cloud_lease: true,
        }
    }
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
            cgroup_driver: CgroupDriver::Cgroupfs,
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
            eviction_hard: kubeedge_edged::EVICTION_HARD_DEFAULTS
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            eviction_soft: BTreeMap::new(),
            eviction_soft_grace_period: BTreeMap::new(),
            eviction_max_pod_grace_period: 0,
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
            dummy_server: "169.254.30.10:10550".into(),
            standing_watches: Vec::new(),
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
            mqtt_sub_client_id: String::new(),
            mqtt_pub_client_id: String::new(),
            mqtt_username: String::new(),
            mqtt_password: String::new(),
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
        DeviceTwin {
            enable: true,
            dmi_sock_path: "/etc/kubeedge/".into(),
        }
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

fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

/// `tailoredKubeletConfig.cgroupDriver`: how cgroups are managed on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    #[default]
    Cgroupfs,
    Systemd,
}
