//! cloudcore's configuration file, in KubeEdge's `CloudCore` layout (protocol §7.1).
//!
//! A KubeEdge `cloudcore.yaml` (apiVersion `cloudcore.config.kubeedge.io/v1alpha1` or
//! `v1alpha2`) loads unchanged; settings of kubeedge-rs's own have distinct names and are
//! ignored by KubeEdge.

use kubeedge_shared::config::{
    ConfigError, InvalidConfig, Problems, from_yaml_str, load_validated, to_yaml,
};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

pub const DEFAULT_CONFIG_PATH: &str = "/etc/kubeedge/config/cloudcore.yaml";
pub const API_VERSION: &str = "cloudcore.config.kubeedge.io/v1alpha2";
const ACCEPTED_API_VERSIONS: [&str; 2] = [
    "cloudcore.config.kubeedge.io/v1alpha1",
    "cloudcore.config.kubeedge.io/v1alpha2",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CloudCoreConfig {
    pub api_version: String,
    pub kind: String,
    pub common_config: CommonConfig,
    #[serde(rename = "kubeAPIConfig")]
    pub kube_api_config: KubeApiConfig,
    pub modules: Modules,
    pub feature_gates: std::collections::BTreeMap<String, bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CommonConfig {
    pub tunnel_port: u16,
    pub monitor_server: MonitorServer,
    /// kubeedge-rs: `/healthz` and `/readyz` (also served on the monitor address).
    pub health_bind_address: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MonitorServer {
    pub bind_address: String,
    pub enable_profiling: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeApiConfig {
    pub master: String,
    pub kube_config: String,
    pub content_type: String,
    pub qps: f32,
    pub burst: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Modules {
    pub cloud_hub: CloudHubConfig,
    pub edge_controller: EdgeControllerConfig,
    pub device_controller: Enable,
    pub sync_controller: SyncControllerConfig,
    pub dynamic_controller: Enable,
    pub cloud_stream: CloudStreamConfig,
    pub router: RouterConfig,
    pub node_upgrade_job_controller: Enable,
    /// Node tasks (ImagePrePullJobs): off by default, as in KubeEdge.
    pub task_manager: Enable,
    pub iptables_manager: IptablesManagerConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Enable {
    pub enable: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SyncControllerConfig {
    /// ObjectSync records for KubeEdge edges (edges without kubeedge-rs's inventory).
    pub enable: bool,
    /// kubeedge-rs: seconds between comparisons of a connected KubeEdge edge's ObjectSync
    /// records with the cluster (KubeEdge: 5). Reconnecting edges are compared at once.
    pub resync_interval: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CloudHubConfig {
    pub enable: bool,
    /// Seconds without a keepalive before a session is dropped.
    pub keepalive_interval: u64,
    pub node_limit: usize,
    #[serde(rename = "tlsCAFile")]
    pub tls_ca_file: String,
    #[serde(rename = "tlsCAKeyFile")]
    pub tls_ca_key_file: String,
    pub tls_cert_file: String,
    pub tls_private_key_file: String,
    pub write_timeout: u64,
    pub advertise_address: Vec<String>,
    pub dns_names: Vec<String>,
    pub edge_cert_signing_duration: u64,
    pub token_refresh_duration: u64,
    pub websocket: Listener,
    pub quic: QuicConfig,
    pub https: Listener,
    pub unixsocket: UnixSocket,
    /// kubeedge-rs: accept KubeEdge ≤ v1.15 edge certificates with the shared CN
    /// `kubeedge.io` (their identity then rests on the `node_id` header alone).
    pub allow_legacy_certificates: bool,
    /// kubeedge-rs: largest message frame accepted or sent, bytes.
    pub max_message_bytes: usize,
    /// kubeedge-rs: per-node queue bounds and ACK window.
    pub node_queue: NodeQueueConfig,
    /// kubeedge-rs: edge handshakes (TLS, certificate checks, WebSocket upgrade) worked on at
    /// once; the rest wait their turn, so a reconnecting fleet does not time out together.
    pub max_concurrent_handshakes: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeQueueConfig {
    pub max_messages: usize,
    pub max_bytes: usize,
    pub ack_window: usize,
    /// Seconds between resends of an unacknowledged message (KubeEdge: 5).
    pub ack_retry_interval: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Listener {
    pub enable: bool,
    pub address: String,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct QuicConfig {
    pub enable: bool,
    pub address: String,
    pub port: u16,
    pub max_incoming_streams: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct UnixSocket {
    pub enable: bool,
    pub address: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EdgeControllerConfig {
    pub enable: bool,
    pub node_update_frequency: u64,
    pub buffer: serde_json::Value,
    pub load: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CloudStreamConfig {
    pub enable: bool,
    pub stream_port: u16,
    pub tunnel_port: u16,
    #[serde(rename = "tlsTunnelCAFile")]
    pub tls_tunnel_ca_file: String,
    pub tls_tunnel_cert_file: String,
    pub tls_tunnel_private_key_file: String,
    #[serde(rename = "tlsStreamCAFile")]
    pub tls_stream_ca_file: String,
    pub tls_stream_cert_file: String,
    pub tls_stream_private_key_file: String,
    /// kubeedge-rs (not a KubeEdge key): serve the stream server to clients without a
    /// certificate from the stream CA, as KubeEdge does. Default false: the CA is
    /// `tlsStreamCAFile`, else the pod's service-account CA, else cloudstream does not start.
    pub insecure_skip_client_verify: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RouterConfig {
    pub enable: bool,
    pub address: String,
    pub port: u16,
    pub rest_timeout: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IptablesManagerConfig {
    pub enable: bool,
    pub mode: IptablesMode,
}

/// `iptablesManager.mode`: where the tunnel-port DNAT rules are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IptablesMode {
    /// Inside cloudcore (its own node only; needs hostNetwork and NET_ADMIN).
    #[default]
    Internal,
    /// By a separate `cloudcore iptables-manager` (or KubeEdge's) on every cloud node.
    External,
}

impl std::fmt::Display for IptablesMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IptablesMode::Internal => "internal",
            IptablesMode::External => "external",
        })
    }
}

impl Default for CloudCoreConfig {
    fn default() -> Self {
        CloudCoreConfig {
            api_version: API_VERSION.to_string(),
            kind: "CloudCore".to_string(),
            common_config: CommonConfig::default(),
            kube_api_config: KubeApiConfig::default(),
            modules: Modules::default(),
            feature_gates: Default::default(),
        }
    }
}

impl Default for CommonConfig {
    fn default() -> Self {
        CommonConfig {
            tunnel_port: 10350,
            monitor_server: MonitorServer::default(),
            health_bind_address: String::new(),
        }
    }
}

impl Default for MonitorServer {
    fn default() -> Self {
        MonitorServer {
            bind_address: "127.0.0.1:9091".into(),
            enable_profiling: false,
        }
    }
}

impl Default for KubeApiConfig {
    fn default() -> Self {
        KubeApiConfig {
            master: String::new(),
            kube_config: String::new(),
            content_type: "application/vnd.kubernetes.protobuf".into(),
            qps: 5000.0,
            burst: 10000,
        }
    }
}

impl Default for Modules {
    fn default() -> Self {
        let on = Enable { enable: true };
        let off = Enable { enable: false };
        Modules {
            cloud_hub: CloudHubConfig::default(),
            edge_controller: EdgeControllerConfig::default(),
            device_controller: on,
            sync_controller: SyncControllerConfig::default(),
            dynamic_controller: off.clone(),
            cloud_stream: CloudStreamConfig::default(),
            router: RouterConfig::default(),
            node_upgrade_job_controller: off.clone(),
            task_manager: off,
            iptables_manager: IptablesManagerConfig::default(),
        }
    }
}

impl Default for Enable {
    fn default() -> Self {
        Enable { enable: true }
    }
}

impl Default for SyncControllerConfig {
    fn default() -> Self {
        SyncControllerConfig {
            enable: true,
            resync_interval: kubeedge_shared::constants::DEFAULT_RESYNC_INTERVAL_SECS,
        }
    }
}

impl Default for CloudHubConfig {
    fn default() -> Self {
        use kubeedge_shared::constants::*;
        CloudHubConfig {
            enable: true,
            keepalive_interval: DEFAULT_KEEPALIVE_INTERVAL_SECS,
            node_limit: DEFAULT_NODE_LIMIT,
            tls_ca_file: "/etc/kubeedge/ca/rootCA.crt".into(),
            tls_ca_key_file: "/etc/kubeedge/ca/rootCA.key".into(),
            tls_cert_file: "/etc/kubeedge/certs/server.crt".into(),
            tls_private_key_file: "/etc/kubeedge/certs/server.key".into(),
            write_timeout: 30,
            advertise_address: Vec::new(),
            dns_names: Vec::new(),
            edge_cert_signing_duration: 365,
            token_refresh_duration: 12,
            websocket: Listener {
                enable: true,
                address: "0.0.0.0".into(),
                port: DEFAULT_CLOUDHUB_PORT,
            },
            quic: QuicConfig::default(),
            https: Listener {
                enable: true,
                address: "0.0.0.0".into(),
                port: DEFAULT_CLOUDHUB_HTTPS_PORT,
            },
            unixsocket: UnixSocket::default(),
            allow_legacy_certificates: false,
            max_message_bytes: kubeedge_shared::codec::DEFAULT_MAX_FRAME_BYTES,
            node_queue: NodeQueueConfig {
                max_messages: DEFAULT_NODE_QUEUE_MAX_MESSAGES,
                max_bytes: DEFAULT_NODE_QUEUE_MAX_BYTES,
                ack_window: DEFAULT_ACK_WINDOW,
                ack_retry_interval: DEFAULT_ACK_RETRY_SECS,
            },
            max_concurrent_handshakes: DEFAULT_MAX_HANDSHAKES,
        }
    }
}

impl Default for NodeQueueConfig {
    fn default() -> Self {
        CloudHubConfig::default().node_queue
    }
}

impl Default for Listener {
    fn default() -> Self {
        Listener {
            enable: false,
            address: "0.0.0.0".into(),
            port: 0,
        }
    }
}

impl Default for QuicConfig {
    fn default() -> Self {
        QuicConfig {
            enable: false,
            address: "0.0.0.0".into(),
            port: 10001,
            max_incoming_streams: 10000,
        }
    }
}

impl Default for UnixSocket {
    fn default() -> Self {
        UnixSocket {
            enable: true,
            address: "unix:///var/lib/kubeedge/kubeedge.sock".into(),
        }
    }
}

impl Default for EdgeControllerConfig {
    fn default() -> Self {
        EdgeControllerConfig {
            enable: true,
            node_update_frequency: 10,
            buffer: serde_json::Value::Object(Default::default()),
            load: serde_json::Value::Object(Default::default()),
        }
    }
}

impl Default for CloudStreamConfig {
    fn default() -> Self {
        CloudStreamConfig {
            enable: false,
            stream_port: 10003,
            tunnel_port: 10004,
            tls_tunnel_ca_file: "/etc/kubeedge/ca/rootCA.crt".into(),
            tls_tunnel_cert_file: "/etc/kubeedge/certs/server.crt".into(),
            tls_tunnel_private_key_file: "/etc/kubeedge/certs/server.key".into(),
            tls_stream_ca_file: "/etc/kubeedge/ca/streamCA.crt".into(),
            tls_stream_cert_file: "/etc/kubeedge/certs/stream.crt".into(),
            tls_stream_private_key_file: "/etc/kubeedge/certs/stream.key".into(),
            insecure_skip_client_verify: false,
        }
    }
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            enable: false,
            address: "0.0.0.0".into(),
            port: 9443,
            rest_timeout: 60,
        }
    }
}

impl Default for IptablesManagerConfig {
    fn default() -> Self {
        IptablesManagerConfig {
            enable: true,
            mode: IptablesMode::Internal,
        }
    }
}

impl CloudCoreConfig {
    /// The full default configuration, with this host's address advertised.
    pub fn default_config() -> Self {
        let mut c = CloudCoreConfig::default();
        c.modules.cloud_hub.advertise_address = vec![local_ip().to_string()];
        c
    }

    /// The `--minconfig` subset: what an operator usually sets.
    pub fn minimal_yaml() -> String {
        let c = CloudCoreConfig::default_config();
        let min = serde_json::json!({
            "apiVersion": c.api_version,
            "kind": c.kind,
            "kubeAPIConfig": {"kubeConfig": c.kube_api_config.kube_config, "master": ""},
            "modules": {"cloudHub": {
                "advertiseAddress": c.modules.cloud_hub.advertise_address,
                "nodeLimit": c.modules.cloud_hub.node_limit,
                "websocket": {"enable": true, "address": "0.0.0.0", "port": c.modules.cloud_hub.websocket.port},
                "https": {"enable": true, "address": "0.0.0.0", "port": c.modules.cloud_hub.https.port},
            }},
        });
        to_yaml(&min)
    }

    /// Reads, parses and validates `path` (every invalid value reported at once).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        load_validated(path, Self::validate)
    }

    /// Parses and validates YAML text.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let c: CloudCoreConfig = from_yaml_str(text, "<inline>")?;
        c.validate().map_err(|errors| ConfigError::Invalid {
            file: "<inline>".into(),
            errors,
        })?;
        Ok(c)
    }

    pub fn to_yaml(&self) -> String {
        to_yaml(self)
    }

    /// Every invalid value, with its path and the reason.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        let mut p = Problems::default();
        if !ACCEPTED_API_VERSIONS.contains(&self.api_version.as_str()) {
            p.bad(
                "apiVersion",
                format!(
                    "must be one of {ACCEPTED_API_VERSIONS:?}, got {:?}",
                    self.api_version
                ),
            );
        }
        if self.kind != "CloudCore" {
            p.bad("kind", format!("must be CloudCore, got {:?}", self.kind));
        }
        let hub = &self.modules.cloud_hub;
        if hub.enable {
            if hub.advertise_address.is_empty() {
                p.bad(
                    "modules.cloudHub.advertiseAddress",
                    "required: the IP addresses edges dial (they go into the server certificate)",
                );
            }
            for (i, a) in hub.advertise_address.iter().enumerate() {
                if a.parse::<IpAddr>().is_err() {
                    p.bad(
                        &format!("modules.cloudHub.advertiseAddress[{i}]"),
                        format!("{a:?} is not an IP address"),
                    );
                }
            }
            if hub.keepalive_interval == 0 {
                p.bad("modules.cloudHub.keepaliveInterval", "must be > 0 seconds");
            }
            p.at_most(
                "modules.cloudHub.keepaliveInterval",
                hub.keepalive_interval,
                MAX_INTERVAL_SECS,
            );
            p.at_most(
                "modules.cloudHub.nodeQueue.ackRetryInterval",
                hub.node_queue.ack_retry_interval,
                MAX_INTERVAL_SECS,
            );
            p.at_most(
                "modules.cloudHub.edgeCertSigningDuration",
                hub.edge_cert_signing_duration,
                MAX_SIGNING_DAYS,
            );
            p.at_most(
                "modules.cloudHub.tokenRefreshDuration",
                hub.token_refresh_duration,
                MAX_TOKEN_REFRESH_HOURS,
            );
            if hub.node_limit == 0 {
                p.bad("modules.cloudHub.nodeLimit", "must be > 0");
            }
            if hub.max_concurrent_handshakes == 0 {
                p.bad("modules.cloudHub.maxConcurrentHandshakes", "must be > 0");
            }
            if hub.websocket.enable
                && let Err((path, reason)) =
                    listen_addr(&hub.websocket, "modules.cloudHub.websocket")
            {
                p.bad(&path, reason);
            }
            if hub.max_message_bytes < 64 * 1024 {
                p.bad("modules.cloudHub.maxMessageBytes", "must be at least 65536");
            }
            if hub.node_queue.ack_window == 0 || hub.node_queue.max_messages == 0 {
                p.bad(
                    "modules.cloudHub.nodeQueue",
                    "ackWindow and maxMessages must be > 0",
                );
            }
            if hub.quic.enable {
                p.bad(
                    "modules.cloudHub.quic.enable",
                    "QUIC is not supported (KubeEdge's gQUIC is not interoperable); use websocket",
                );
            }
        }
        if self.modules.sync_controller.resync_interval == 0 {
            p.bad(
                "modules.syncController.resyncInterval",
                "must be > 0 seconds",
            );
        }
        p.at_most(
            "modules.syncController.resyncInterval",
            self.modules.sync_controller.resync_interval,
            MAX_INTERVAL_SECS,
        );
        let router = &self.modules.router;
        if router.enable && router.address.parse::<IpAddr>().is_err() {
            p.bad(
                "modules.router.address",
                format!("{:?} is not an IP address", router.address),
            );
        }
        p.at_most(
            "modules.router.restTimeout",
            router.rest_timeout,
            MAX_INTERVAL_SECS,
        );
        if !self.common_config.monitor_server.bind_address.is_empty()
            && self
                .common_config
                .monitor_server
                .bind_address
                .parse::<SocketAddr>()
                .is_err()
        {
            p.bad(
                "commonConfig.monitorServer.bindAddress",
                "must be host:port, e.g. 127.0.0.1:9091",
            );
        }
        p.into_result()
    }
}

/// Longest interval accepted in seconds (one year): deadlines computed from it stay
/// representable.
const MAX_INTERVAL_SECS: u64 = 365 * 24 * 3600;
/// Longest edge certificate life accepted, days (100 years, the CA's own).
const MAX_SIGNING_DAYS: u64 = 365 * 100;
/// Longest join-token refresh period accepted, hours (ten years).
const MAX_TOKEN_REFRESH_HOURS: u64 = 24 * 365 * 10;

/// The socket address of a listener section (`path` names it in the error).
pub(crate) fn listen_addr(l: &Listener, path: &str) -> Result<SocketAddr, (String, String)> {
    let ip: IpAddr = l.address.parse().map_err(|_| {
        (
            format!("{path}.address"),
            format!("{:?} is not an IP address", l.address),
        )
    })?;
    Ok(SocketAddr::new(ip, l.port))
}

pub use kubeedge_shared::net::local_ip;

#[cfg(test)]
mod tests {
    use super::*;

    const KUBEEDGE_HELM_CONFIG: &str = r#"
apiVersion: cloudcore.config.kubeedge.io/v1alpha2
kind: CloudCore
kubeAPIConfig:
  kubeConfig: ""
  master: ""
modules:
  cloudHub:
    advertiseAddress:
    - 10.0.0.5
    dnsNames:
    - cloudcore.kubeedge.svc
    nodeLimit: 1000
    tlsCAFile: /etc/kubeedge/ca/rootCA.crt
    tlsCertFile: /etc/kubeedge/certs/edge.crt
    tlsPrivateKeyFile: /etc/kubeedge/certs/edge.key
    unixsocket:
      address: unix:///var/lib/kubeedge/kubeedge.sock
      enable: true
    websocket:
      address: 0.0.0.0
      enable: true
      port: 10000
    quic:
      address: 0.0.0.0
      enable: false
      maxIncomingStreams: 10000
      port: 10001
    https:
      address: 0.0.0.0
      enable: true
      port: 10002
  cloudStream:
    enable: true
    streamPort: 10003
    tunnelPort: 10004
  dynamicController:
    enable: false
  router:
    enable: false
  iptablesManager:
    enable: true
    mode: external
"#;

    #[test]
    fn kubeedge_helm_config_loads() {
        let c = CloudCoreConfig::from_yaml(KUBEEDGE_HELM_CONFIG).unwrap();
        assert_eq!(c.modules.cloud_hub.advertise_address, vec!["10.0.0.5"]);
        assert_eq!(c.modules.cloud_hub.node_limit, 1000);
        assert!(c.modules.cloud_stream.enable);
        assert_eq!(c.modules.cloud_hub.keepalive_interval, 30, "default kept");
        assert!(c.modules.sync_controller.enable);
        assert_eq!(c.modules.sync_controller.resync_interval, 30);
        let hub = crate::cloudhub::HubConfig::from_cloudcore(&c).unwrap();
        assert_eq!(hub.listen.port(), 10000);
    }

    #[test]
    fn default_config_round_trips() {
        let c = CloudCoreConfig::default_config();
        let back = CloudCoreConfig::from_yaml(&c.to_yaml()).unwrap();
        assert_eq!(back, c);
        let min = CloudCoreConfig::from_yaml(&CloudCoreConfig::minimal_yaml()).unwrap();
        assert_eq!(
            min.modules.cloud_hub.advertise_address,
            c.modules.cloud_hub.advertise_address
        );
    }

    #[test]
    fn errors_name_the_field() {
        let e = CloudCoreConfig::from_yaml("kind: CloudCore\napiVersion: cloudcore.config.kubeedge.io/v1alpha1\nmodules:\n  cloudHub:\n    nodeLimit: many\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("modules.cloudHub.nodeLimit"), "{e}");
        let e = CloudCoreConfig::from_yaml(
            "kind: CloudCore\napiVersion: cloudcore.config.kubeedge.io/v1alpha1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("advertiseAddress"), "{e}");
        let e = CloudCoreConfig::from_yaml(
            "kind: EdgeCore\napiVersion: cloudcore.config.kubeedge.io/v1alpha1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("kind"), "{e}");
        let e = CloudCoreConfig::from_yaml("kind: CloudCore\napiVersion: cloudcore.config.kubeedge.io/v1alpha1\nmodules:\n  cloudHub:\n    advertiseAddress: [not-an-ip]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("advertiseAddress[0]"), "{e}");
    }

    #[test]
    fn every_invalid_value_is_reported_at_once_and_nulls_keep_defaults() {
        let e = CloudCoreConfig::from_yaml(
            "kind: EdgeCore\napiVersion: cloudcore.config.kubeedge.io/v1alpha1\nmodules:\n  cloudHub:\n    nodeLimit: 0\n    advertiseAddress: [nope]\n    keepaliveInterval: null\n",
        )
        .unwrap_err()
        .to_string();
        for field in [
            "kind",
            "modules.cloudHub.nodeLimit",
            "modules.cloudHub.advertiseAddress[0]",
        ] {
            assert!(e.contains(field), "{field} missing in {e}");
        }
        assert!(!e.contains("keepaliveInterval"), "{e}");
        let e = CloudCoreConfig::from_yaml(
            "kind: CloudCore\napiVersion: cloudcore.config.kubeedge.io/v1alpha1\nmodules:\n  iptablesManager:\n    mode: sideways\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("modules.iptablesManager.mode"), "{e}");
    }

    #[test]
    fn absurd_intervals_and_lifetimes_are_refused_by_name() {
        let base = "kind: CloudCore\napiVersion: cloudcore.config.kubeedge.io/v1alpha1\nmodules:\n";
        for (yaml, field) in [
            (
                "  cloudHub:\n    advertiseAddress: [10.0.0.1]\n    keepaliveInterval: 18446744073709551615\n",
                "keepaliveInterval",
            ),
            (
                "  cloudHub:\n    advertiseAddress: [10.0.0.1]\n    nodeQueue:\n      ackRetryInterval: 18446744073709551615\n",
                "ackRetryInterval",
            ),
            (
                "  cloudHub:\n    advertiseAddress: [10.0.0.1]\n    edgeCertSigningDuration: 9223372036854775808\n",
                "edgeCertSigningDuration",
            ),
            (
                "  cloudHub:\n    advertiseAddress: [10.0.0.1]\n    tokenRefreshDuration: 18446744073709551615\n",
                "tokenRefreshDuration",
            ),
            (
                "  cloudHub:\n    advertiseAddress: [10.0.0.1]\n  syncController:\n    resyncInterval: 99999999999\n",
                "resyncInterval",
            ),
        ] {
            let e = CloudCoreConfig::from_yaml(&format!("{base}{yaml}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(field) && e.contains("at most"), "{e}");
        }
    }
}
