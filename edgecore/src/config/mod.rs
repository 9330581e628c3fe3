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

mod sections;
#[cfg(test)]
mod tests;
mod validate;

pub use kubeedge_shared::config::{ConfigError, FieldError, InvalidConfig};
pub use kubeedge_shared::duration::{KubeDuration, format_go_duration, parse_go_duration};
pub use sections::*;

use serde_json::Value;
use std::path::Path;

pub const API_VERSION: &str = "edgecore.config.kubeedge.io/v1alpha2";
pub const KIND: &str = "EdgeCore";
pub const DEFAULT_CONFIG_PATH: &str = "/etc/kubeedge/config/edgecore.yaml";
pub const DEFAULT_DATA_SOURCE: &str = "/var/lib/kubeedge/edgecore.db";
pub const DEFAULT_CA_FILE: &str = "/etc/kubeedge/ca/rootCA.crt";
pub const DEFAULT_CERT_FILE: &str = "/etc/kubeedge/certs/server.crt";
pub const DEFAULT_KEY_FILE: &str = "/etc/kubeedge/certs/server.key";
pub const DEFAULT_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

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

    /// Reads, parses and validates `path` (every invalid value reported at once).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        kubeedge_shared::config::load_validated(path, Self::validate)
    }

    /// Parses YAML laid over the defaults (no validation). `file` names the source in errors.
    pub fn from_yaml(text: &str, file: &str) -> Result<Self, ConfigError> {
        kubeedge_shared::config::from_yaml_str(text, file)
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

    /// The node name: `modules.edged.hostnameOverride`.
    pub fn node_name(&self) -> &str {
        &self.modules.edged.hostname_override
    }

    /// The kubeedge-rs settings in effect (defaults when the section is absent).
    pub fn kubeedge_rs_settings(&self) -> KubeEdgeRsSettings {
        self.kubeedge_rs.clone().unwrap_or_default()
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
