//! The part of a Kubernetes Pod edged acts on, parsed from the JSON metamanager hands over,
//! and checked once ([`PodSpec::validate`]) before any runtime call: a pod edged cannot run
//! gets a clear reason in its status instead of a half-created sandbox.
//!
//! Fields edged does not read are ignored (as the API server's clients do); fields it reads
//! but cannot honour are refused by name.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Pod {
    pub metadata: ObjectMeta,
    pub spec: PodSpec,
    /// The status as last stored (what the cloud accepted), to carry times across restarts.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub status: Value,
    /// A hash of each container's spec as received (name → hash): a container whose spec
    /// changed is restarted (the kubelet's `io.kubernetes.container.hash`).
    #[serde(skip)]
    pub hashes: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectMeta {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub resource_version: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub deletion_timestamp: Option<String>,
    pub deletion_grace_period_seconds: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodSpec {
    pub node_name: String,
    pub containers: Vec<Container>,
    pub init_containers: Vec<Container>,
    pub volumes: Vec<Volume>,
    pub restart_policy: Option<String>,
    pub termination_grace_period_seconds: Option<i64>,
    pub active_deadline_seconds: Option<i64>,
    pub dns_policy: Option<String>,
    pub dns_config: Option<PodDnsConfig>,
    pub host_network: bool,
    #[serde(rename = "hostPID")]
    pub host_pid: bool,
    #[serde(rename = "hostIPC")]
    pub host_ipc: bool,
    pub share_process_namespace: Option<bool>,
    pub hostname: Option<String>,
    pub subdomain: Option<String>,
    pub host_aliases: Vec<HostAlias>,
    pub service_account_name: Option<String>,
    pub security_context: Option<PodSecurityContext>,
    pub image_pull_secrets: Vec<LocalObjectReference>,
    pub runtime_class_name: Option<String>,
    pub ephemeral_containers: Vec<Value>,
    /// Resources the pod's sandbox takes beyond its containers (RuntimeClass overhead).
    pub overhead: BTreeMap<String, Value>,
    /// Pod priority (the priority admission controller fills it in).
    pub priority: Option<i32>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Container {
    pub name: String,
    pub image: Option<String>,
    pub image_pull_policy: Option<String>,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub working_dir: Option<String>,
    pub env: Vec<EnvVar>,
    pub env_from: Vec<EnvFromSource>,
    pub ports: Vec<ContainerPort>,
    pub volume_mounts: Vec<VolumeMount>,
    pub volume_devices: Vec<Value>,
    pub resources: ResourceRequirements,
    pub security_context: Option<SecurityContext>,
    pub liveness_probe: Option<Probe>,
    pub readiness_probe: Option<Probe>,
    pub startup_probe: Option<Probe>,
    pub lifecycle: Option<Lifecycle>,
    pub termination_message_path: Option<String>,
    pub termination_message_policy: Option<String>,
    pub stdin: bool,
    pub stdin_once: bool,
    pub tty: bool,
    /// Only init containers have one (`Always` makes a sidecar).
    pub restart_policy: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EnvVar {
    pub name: String,
    pub value: Option<String>,
    pub value_from: Option<EnvVarSource>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EnvVarSource {
    pub field_ref: Option<ObjectFieldSelector>,
    pub resource_field_ref: Option<ResourceFieldSelector>,
    pub config_map_key_ref: Option<KeySelector>,
    pub secret_key_ref: Option<KeySelector>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectFieldSelector {
    pub field_path: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceFieldSelector {
    pub container_name: Option<String>,
    pub resource: String,
    pub divisor: Option<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KeySelector {
    pub name: String,
    pub key: String,
    pub optional: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EnvFromSource {
    pub prefix: Option<String>,
    pub config_map_ref: Option<OptionalReference>,
    pub secret_ref: Option<OptionalReference>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OptionalReference {
    pub name: String,
    pub optional: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LocalObjectReference {
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerPort {
    pub name: Option<String>,
    pub container_port: i32,
    pub host_port: Option<i32>,
    pub protocol: Option<String>,
    #[serde(rename = "hostIP")]
    pub host_ip: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VolumeMount {
    pub name: String,
    pub mount_path: String,
    pub read_only: bool,
    pub sub_path: Option<String>,
    pub sub_path_expr: Option<String>,
    pub mount_propagation: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceRequirements {
    pub limits: BTreeMap<String, Value>,
    pub requests: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SecurityContext {
    pub capabilities: Option<Capabilities>,
    pub privileged: Option<bool>,
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub run_as_non_root: Option<bool>,
    pub read_only_root_filesystem: Option<bool>,
    pub allow_privilege_escalation: Option<bool>,
    pub proc_mount: Option<String>,
    pub seccomp_profile: Option<SeccompProfile>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Capabilities {
    pub add: Vec<String>,
    pub drop: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SeccompProfile {
    #[serde(rename = "type")]
    pub type_: String,
    pub localhost_profile: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodSecurityContext {
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub run_as_non_root: Option<bool>,
    pub supplemental_groups: Vec<i64>,
    pub fs_group: Option<i64>,
    pub sysctls: Vec<Sysctl>,
    pub seccomp_profile: Option<SeccompProfile>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Sysctl {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodDnsConfig {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<PodDnsConfigOption>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodDnsConfigOption {
    pub name: String,
    pub value: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HostAlias {
    pub ip: String,
    pub hostnames: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Probe {
    pub exec: Option<ExecAction>,
    pub http_get: Option<HttpGetAction>,
    pub tcp_socket: Option<TcpSocketAction>,
    pub grpc: Option<Value>,
    pub initial_delay_seconds: i32,
    pub timeout_seconds: Option<i32>,
    pub period_seconds: Option<i32>,
    pub success_threshold: Option<i32>,
    pub failure_threshold: Option<i32>,
    pub termination_grace_period_seconds: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ExecAction {
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpGetAction {
    pub path: Option<String>,
    /// A number or the name of a container port.
    pub port: Value,
    pub host: Option<String>,
    pub scheme: Option<String>,
    pub http_headers: Vec<HttpHeader>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpHeader {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TcpSocketAction {
    pub port: Value,
    pub host: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Lifecycle {
    pub post_start: Option<LifecycleHandler>,
    pub pre_stop: Option<LifecycleHandler>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LifecycleHandler {
    pub exec: Option<ExecAction>,
    pub http_get: Option<HttpGetAction>,
    pub tcp_socket: Option<TcpSocketAction>,
    pub sleep: Option<SleepAction>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SleepAction {
    pub seconds: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Volume {
    pub name: String,
    pub empty_dir: Option<EmptyDirVolumeSource>,
    pub host_path: Option<HostPathVolumeSource>,
    pub config_map: Option<ConfigMapVolumeSource>,
    pub secret: Option<SecretVolumeSource>,
    #[serde(rename = "downwardAPI")]
    pub downward_api: Option<DownwardApiVolumeSource>,
    pub projected: Option<ProjectedVolumeSource>,
    /// Any other volume source (persistentVolumeClaim, nfs, csi, …): not supported here.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EmptyDirVolumeSource {
    pub medium: Option<String>,
    pub size_limit: Option<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HostPathVolumeSource {
    pub path: String,
    #[serde(rename = "type")]
    pub type_: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KeyToPath {
    pub key: String,
    pub path: String,
    pub mode: Option<i32>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConfigMapVolumeSource {
    pub name: String,
    pub items: Vec<KeyToPath>,
    pub default_mode: Option<i32>,
    pub optional: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SecretVolumeSource {
    pub secret_name: String,
    pub items: Vec<KeyToPath>,
    pub default_mode: Option<i32>,
    pub optional: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DownwardApiVolumeSource {
    pub items: Vec<DownwardApiVolumeFile>,
    pub default_mode: Option<i32>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DownwardApiVolumeFile {
    pub path: String,
    pub field_ref: Option<ObjectFieldSelector>,
    pub resource_field_ref: Option<ResourceFieldSelector>,
    pub mode: Option<i32>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProjectedVolumeSource {
    pub sources: Vec<VolumeProjection>,
    pub default_mode: Option<i32>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VolumeProjection {
    pub config_map: Option<ProjectedConfigMap>,
    pub secret: Option<ProjectedSecret>,
    #[serde(rename = "downwardAPI")]
    pub downward_api: Option<DownwardApiVolumeSource>,
    pub service_account_token: Option<ServiceAccountTokenProjection>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProjectedConfigMap {
    pub name: String,
    pub items: Vec<KeyToPath>,
    pub optional: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProjectedSecret {
    pub name: String,
    pub items: Vec<KeyToPath>,
    pub optional: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceAccountTokenProjection {
    pub audience: Option<String>,
    pub expiration_seconds: Option<i64>,
    pub path: String,
}

/// `spec.restartPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

/// `imagePullPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

/// Why a pod spec cannot run here. Shown in the pod status (container `waiting` message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("{field}: {what} is not supported by kubeedge-rs edged")]
    Unsupported { field: String, what: String },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> SpecError {
    SpecError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

fn unsupported(field: impl Into<String>, what: impl Into<String>) -> SpecError {
    SpecError::Unsupported {
        field: field.into(),
        what: what.into(),
    }
}

/// The kinds of volume sources edged can provide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeKind {
    EmptyDir,
    HostPath,
    ConfigMap,
    Secret,
    DownwardApi,
    Projected,
}

impl Volume {
    /// The one source this volume uses, or why it cannot be used.
    pub fn kind(&self, field: &str) -> Result<VolumeKind, SpecError> {
        if let Some(other) = self.other.keys().next() {
            return Err(unsupported(field, format!("volume type {other:?}")));
        }
        let kinds: Vec<VolumeKind> = [
            self.empty_dir.as_ref().map(|_| VolumeKind::EmptyDir),
            self.host_path.as_ref().map(|_| VolumeKind::HostPath),
            self.config_map.as_ref().map(|_| VolumeKind::ConfigMap),
            self.secret.as_ref().map(|_| VolumeKind::Secret),
            self.downward_api.as_ref().map(|_| VolumeKind::DownwardApi),
            self.projected.as_ref().map(|_| VolumeKind::Projected),
        ]
        .into_iter()
        .flatten()
        .collect();
        match kinds.as_slice() {
            // The API server defaults a volume without a source to an emptyDir.
            [] => Ok(VolumeKind::EmptyDir),
            [one] => Ok(*one),
            _ => Err(invalid(field, "more than one volume source")),
        }
    }
}

impl Pod {
    /// Parses a pod from JSON; errors name the offending field.
    pub fn from_value(value: &Value) -> Result<Pod, SpecError> {
        let mut pod: Pod = serde_path_to_error::deserialize(value).map_err(|e| {
            invalid(
                e.path().to_string(),
                format!("cannot be read: {}", e.inner()),
            )
        })?;
        for list in ["initContainers", "containers"] {
            for c in value["spec"][list].as_array().into_iter().flatten() {
                if let Some(name) = c["name"].as_str() {
                    pod.hashes
                        .insert(name.to_string(), fnv1a_hex(c.to_string().as_bytes()));
                }
            }
        }
        Ok(pod)
    }

    /// The hash of a container's spec (empty if unknown).
    pub fn container_hash(&self, name: &str) -> &str {
        self.hashes.get(name).map(String::as_str).unwrap_or("")
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }

    pub fn is_terminating(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// The grace period to stop containers with: the deletion's, else the spec's (30 s).
    pub fn grace_period_seconds(&self) -> i64 {
        self.metadata
            .deletion_grace_period_seconds
            .or(self.spec.termination_grace_period_seconds)
            .unwrap_or(30)
            .max(0)
    }
}

/// Reads `metadata` only: enough to name a pod whose spec does not parse.
pub fn metadata_of(value: &Value) -> ObjectMeta {
    value
        .get("metadata")
        .and_then(|m| serde_json::from_value(m.clone()).ok())
        .unwrap_or_default()
}

impl PodSpec {
    pub fn restart_policy(&self) -> RestartPolicy {
        match self.restart_policy.as_deref() {
            Some("OnFailure") => RestartPolicy::OnFailure,
            Some("Never") => RestartPolicy::Never,
            _ => RestartPolicy::Always,
        }
    }

    /// Every check that needs no runtime and no other object.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.containers.is_empty() {
            return Err(invalid(
                "spec.containers",
                "a pod needs at least one container",
            ));
        }
        if let Some(p) = &self.restart_policy
            && !matches!(p.as_str(), "Always" | "OnFailure" | "Never")
        {
            return Err(invalid(
                "spec.restartPolicy",
                format!("must be Always, OnFailure or Never, got {p:?}"),
            ));
        }
        if let Some(rc) = self.runtime_class_name.as_deref().filter(|s| !s.is_empty()) {
            return Err(unsupported(
                "spec.runtimeClassName",
                format!("runtime class {rc:?}"),
            ));
        }
        if !self.ephemeral_containers.is_empty() {
            return Err(unsupported(
                "spec.ephemeralContainers",
                "ephemeral containers",
            ));
        }
        if let Some(g) = self.termination_grace_period_seconds
            && g < 0
        {
            return Err(invalid(
                "spec.terminationGracePeriodSeconds",
                "must not be negative",
            ));
        }
        let mut volumes = HashSet::new();
        for (i, v) in self.volumes.iter().enumerate() {
            let field = format!("spec.volumes[{i}]");
            if v.name.is_empty() {
                return Err(invalid(format!("{field}.name"), "must not be empty"));
            }
            // The name is a directory under the pod's: it must be one plain path element.
            if !is_dns_label(&v.name) {
                return Err(invalid(
                    format!("{field}.name"),
                    format!("{:?} is not a valid volume name (a DNS label)", v.name),
                ));
            }
            if !volumes.insert(v.name.as_str()) {
                return Err(invalid(
                    format!("{field}.name"),
                    format!("duplicate volume {:?}", v.name),
                ));
            }
            validate_volume(v, &field)?;
        }
        let mut names = HashSet::new();
        for (list, containers) in [
            ("spec.initContainers", &self.init_containers),
            ("spec.containers", &self.containers),
        ] {
            for (i, c) in containers.iter().enumerate() {
                let field = format!("{list}[{i}]");
                if !names.insert(c.name.as_str()) {
                    return Err(invalid(
                        format!("{field}.name"),
                        format!("duplicate container name {:?}", c.name),
                    ));
                }
                validate_container(c, &field, &volumes, self.host_network)?;
                if list == "spec.initContainers" {
                    if c.restart_policy.is_some() {
                        return Err(unsupported(
                            format!("{field}.restartPolicy"),
                            "sidecar init containers",
                        ));
                    }
                    for (probe, p) in [
                        ("livenessProbe", &c.liveness_probe),
                        ("readinessProbe", &c.readiness_probe),
                        ("startupProbe", &c.startup_probe),
                    ] {
                        if p.is_some() {
                            return Err(invalid(
                                format!("{field}.{probe}"),
                                "init containers cannot have probes",
                            ));
                        }
                    }
                } else if c.restart_policy.is_some() {
                    return Err(invalid(
                        format!("{field}.restartPolicy"),
                        "only init containers may set a restart policy",
                    ));
                }
            }
        }
        Ok(())
    }
}

fn validate_volume(v: &Volume, field: &str) -> Result<(), SpecError> {
    let kind = v.kind(field)?;
    let check_items = |items: &[KeyToPath], f: &str| -> Result<(), SpecError> {
        for (i, item) in items.iter().enumerate() {
            if item.key.is_empty() {
                return Err(invalid(format!("{f}.items[{i}].key"), "must not be empty"));
            }
            check_relative_path(&item.path, &format!("{f}.items[{i}].path"))?;
        }
        Ok(())
    };
    match kind {
        VolumeKind::EmptyDir | VolumeKind::DownwardApi => {}
        VolumeKind::HostPath => {
            let hp = v.host_path.as_ref().map(|h| h.path.as_str()).unwrap_or("");
            if !hp.starts_with('/') {
                return Err(invalid(
                    format!("{field}.hostPath.path"),
                    format!("must be an absolute path, got {hp:?}"),
                ));
            }
            let ty = v
                .host_path
                .as_ref()
                .and_then(|h| h.type_.as_deref())
                .unwrap_or("");
            if !matches!(
                ty,
                "" | "DirectoryOrCreate"
                    | "Directory"
                    | "FileOrCreate"
                    | "File"
                    | "Socket"
                    | "CharDevice"
                    | "BlockDevice"
            ) {
                return Err(invalid(
                    format!("{field}.hostPath.type"),
                    format!("unknown type {ty:?}"),
                ));
            }
        }
        VolumeKind::ConfigMap => {
            let cm = v.config_map.clone().unwrap_or_default();
            if cm.name.is_empty() {
                return Err(invalid(
                    format!("{field}.configMap.name"),
                    "must not be empty",
                ));
            }
            check_items(&cm.items, &format!("{field}.configMap"))?;
        }
        VolumeKind::Secret => {
            let s = v.secret.clone().unwrap_or_default();
            if s.secret_name.is_empty() {
                return Err(invalid(
                    format!("{field}.secret.secretName"),
                    "must not be empty",
                ));
            }
            check_items(&s.items, &format!("{field}.secret"))?;
        }
        VolumeKind::Projected => {
            let p = v.projected.clone().unwrap_or_default();
            for (i, src) in p.sources.iter().enumerate() {
                let f = format!("{field}.projected.sources[{i}]");
                if let Some(other) = src.other.keys().next() {
                    return Err(unsupported(f, format!("projection {other:?}")));
                }
                if let Some(cm) = &src.config_map {
                    check_items(&cm.items, &format!("{f}.configMap"))?;
                }
                if let Some(s) = &src.secret {
                    check_items(&s.items, &format!("{f}.secret"))?;
                }
                if let Some(t) = &src.service_account_token {
                    check_relative_path(&t.path, &format!("{f}.serviceAccountToken.path"))?;
                }
            }
        }
    }
    if let Some(d) = &v.downward_api {
        for (i, item) in d.items.iter().enumerate() {
            check_relative_path(&item.path, &format!("{field}.downwardAPI.items[{i}].path"))?;
        }
    }
    Ok(())
}

/// A path inside a volume: relative, without `..` elements.
pub fn check_relative_path(path: &str, field: &str) -> Result<(), SpecError> {
    if path.is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if path.starts_with('/') {
        return Err(invalid(field, format!("must be relative, got {path:?}")));
    }
    if path.split('/').any(|p| p == "..") {
        return Err(invalid(
            field,
            format!("must not contain '..', got {path:?}"),
        ));
    }
    Ok(())
}

fn validate_container(
    c: &Container,
    field: &str,
    volumes: &HashSet<&str>,
    host_network: bool,
) -> Result<(), SpecError> {
    if !is_dns_label(&c.name) {
        return Err(invalid(
            format!("{field}.name"),
            format!("{:?} is not a valid container name (a DNS label)", c.name),
        ));
    }
    if c.image.as_deref().unwrap_or("").trim().is_empty() {
        return Err(invalid(format!("{field}.image"), "must not be empty"));
    }
    if let Some(p) = &c.image_pull_policy
        && !matches!(p.as_str(), "Always" | "IfNotPresent" | "Never")
    {
        return Err(invalid(
            format!("{field}.imagePullPolicy"),
            format!("must be Always, IfNotPresent or Never, got {p:?}"),
        ));
    }
    if !c.volume_devices.is_empty() {
        return Err(unsupported(
            format!("{field}.volumeDevices"),
            "block volumes",
        ));
    }
    for (i, e) in c.env.iter().enumerate() {
        if e.name.is_empty() {
            return Err(invalid(
                format!("{field}.env[{i}].name"),
                "must not be empty",
            ));
        }
        if let Some(src) = &e.value_from {
            let set = [
                src.field_ref.is_some(),
                src.resource_field_ref.is_some(),
                src.config_map_key_ref.is_some(),
                src.secret_key_ref.is_some(),
            ]
            .iter()
            .filter(|b| **b)
            .count();
            if set != 1 {
                return Err(invalid(
                    format!("{field}.env[{i}].valueFrom"),
                    "must name exactly one source",
                ));
            }
        }
    }
    for (i, p) in c.ports.iter().enumerate() {
        let f = format!("{field}.ports[{i}]");
        if !(1..=65535).contains(&p.container_port) {
            return Err(invalid(
                format!("{f}.containerPort"),
                format!("must be between 1 and 65535, got {}", p.container_port),
            ));
        }
        if let Some(hp) = p.host_port.filter(|hp| *hp != 0) {
            if !(1..=65535).contains(&hp) {
                return Err(invalid(
                    format!("{f}.hostPort"),
                    format!("must be between 1 and 65535, got {hp}"),
                ));
            }
            if host_network && hp != p.container_port {
                return Err(invalid(
                    format!("{f}.hostPort"),
                    "must equal containerPort with hostNetwork",
                ));
            }
        }
        if let Some(proto) = &p.protocol
            && !matches!(proto.as_str(), "TCP" | "UDP" | "SCTP")
        {
            return Err(invalid(
                format!("{f}.protocol"),
                format!("must be TCP, UDP or SCTP, got {proto:?}"),
            ));
        }
    }
    let mut paths = HashSet::new();
    for (i, m) in c.volume_mounts.iter().enumerate() {
        let f = format!("{field}.volumeMounts[{i}]");
        if !volumes.contains(m.name.as_str()) {
            return Err(invalid(
                format!("{f}.name"),
                format!("no volume named {:?} in spec.volumes", m.name),
            ));
        }
        if !m.mount_path.starts_with('/') {
            return Err(invalid(
                format!("{f}.mountPath"),
                format!("must be an absolute path, got {:?}", m.mount_path),
            ));
        }
        if !paths.insert(m.mount_path.trim_end_matches('/')) {
            return Err(invalid(
                format!("{f}.mountPath"),
                format!("{:?} is mounted twice", m.mount_path),
            ));
        }
        if let Some(sp) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            check_relative_path(sp, &format!("{f}.subPath"))?;
        }
        if m.sub_path_expr.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(unsupported(format!("{f}.subPathExpr"), "subPathExpr"));
        }
        if let Some(p) = &m.mount_propagation
            && !matches!(p.as_str(), "None" | "HostToContainer" | "Bidirectional")
        {
            return Err(invalid(
                format!("{f}.mountPropagation"),
                format!("unknown propagation {p:?}"),
            ));
        }
    }
    for (probe, p) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ] {
        if let Some(p) = p {
            let f = format!("{field}.{probe}");
            let handlers = [
                p.exec.is_some(),
                p.http_get.is_some(),
                p.tcp_socket.is_some(),
                p.grpc.is_some(),
            ]
            .iter()
            .filter(|b| **b)
            .count();
            if handlers != 1 {
                return Err(invalid(f, "must name exactly one handler"));
            }
            if p.grpc.is_some() {
                return Err(unsupported(format!("{f}.grpc"), "gRPC probes"));
            }
        }
    }
    Ok(())
}

/// FNV-1a (64 bit) in hex: stable across builds and platforms, unlike `std`'s hasher.
pub fn fnv1a_hex(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// One plain path element: pod UIDs (UUIDs from the apiserver), namespaces and names name
/// directories (`pods/<uid>`, `<ns>_<name>_<uid>` logs).
pub fn is_path_element(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// RFC 1123 label: what container names must be.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl Container {
    pub fn image(&self) -> &str {
        self.image.as_deref().unwrap_or("").trim()
    }

    /// `imagePullPolicy`, or the API server's default for the image: `Always` for `:latest`
    /// or no tag, else `IfNotPresent`.
    pub fn pull_policy(&self) -> PullPolicy {
        match self.image_pull_policy.as_deref() {
            Some("Always") => PullPolicy::Always,
            Some("Never") => PullPolicy::Never,
            Some("IfNotPresent") => PullPolicy::IfNotPresent,
            _ => default_pull_policy(self.image()),
        }
    }
}

/// The API server's defaulting of `imagePullPolicy`.
pub fn default_pull_policy(image: &str) -> PullPolicy {
    if image.contains('@') {
        return PullPolicy::IfNotPresent;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, "latest")) | None => PullPolicy::Always,
        Some(_) => PullPolicy::IfNotPresent,
    }
}

#[cfg(test)]
mod tests;
