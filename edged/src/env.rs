//! A container's environment as the kubelet builds it: `envFrom` (configmaps, secrets, with
//! prefixes), then `env` (literal values with `$(VAR)` expansion, configmap/secret keys, pod
//! fields, resource fields); and `$(VAR)` expansion of command and args.

use super::quantity;
use super::spec::{Container, KeySelector, Pod, ResourceFieldSelector};
use crate::meta::{MetaClient, MetaError};
use base64::Engine;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;

/// Why a container cannot be configured (shown as `CreateContainerConfigError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Where configmaps and secrets come from: the metamanager, or a map in tests.
pub trait ObjectSource: Send + Sync {
    /// `Ok(None)` when the object does not exist.
    fn configmap(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Value>, String>> + Send;
    fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Value>, String>> + Send;
    /// A `TokenRequest` answered with its `status` (needs the cloud).
    fn service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: Value,
    ) -> impl Future<Output = Result<Value, String>> + Send;
}

fn found(r: Result<Value, MetaError>) -> Result<Option<Value>, String> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(MetaError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

impl ObjectSource for MetaClient {
    async fn configmap(&self, namespace: &str, name: &str) -> Result<Option<Value>, String> {
        found(self.get_configmap(namespace, name).await)
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Value>, String> {
        found(self.get_secret(namespace, name).await)
    }

    async fn service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: Value,
    ) -> Result<Value, String> {
        self.request_service_account_token(namespace, service_account, request)
            .await
            .map_err(|e| e.to_string())
    }
}

/// What `fieldRef` and `resourceFieldRef` read besides the pod.
#[derive(Debug, Clone, Default)]
pub struct PodContext {
    pub pod_ips: Vec<String>,
    pub host_ip: String,
    /// Node allocatable CPU (millicores) and memory / ephemeral storage (bytes): the value of
    /// a limit the container does not set.
    pub allocatable_cpu_milli: i128,
    pub allocatable_memory: i128,
    pub allocatable_ephemeral: i128,
    /// Variables every container gets first (the `kubernetes` service's), overridable.
    pub service_env: Vec<(String, String)>,
}

/// The variables the kubelet derives from the `default/kubernetes` service, pointing at
/// `addr` (the MetaServer's dummy address): what in-cluster clients read.
pub fn master_service_env(addr: std::net::SocketAddr) -> Vec<(String, String)> {
    let (host, port) = (addr.ip().to_string(), addr.port().to_string());
    let url_host = if addr.is_ipv6() {
        format!("[{host}]")
    } else {
        host.clone()
    };
    let tcp = format!("tcp://{url_host}:{port}");
    let p = format!("KUBERNETES_PORT_{port}_TCP");
    vec![
        ("KUBERNETES_SERVICE_HOST".into(), host.clone()),
        ("KUBERNETES_SERVICE_PORT".into(), port.clone()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.clone()),
        ("KUBERNETES_PORT".into(), tcp.clone()),
        (p.clone(), tcp),
        (format!("{p}_PROTO"), "tcp".into()),
        (format!("{p}_PORT"), port),
        (format!("{p}_ADDR"), host),
    ]
}

/// The string values of a configmap (`data`) or a secret (`data`, base64-decoded).
pub fn string_data(object: &Value, secret: bool) -> Result<HashMap<String, Vec<u8>>, String> {
    let mut out = HashMap::new();
    if let Some(data) = object.get("data").and_then(Value::as_object) {
        for (k, v) in data {
            let text = v.as_str().unwrap_or_default();
            let bytes = if secret {
                base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|e| format!("key {k:?} is not valid base64: {e}"))?
            } else {
                text.as_bytes().to_vec()
            };
            out.insert(k.clone(), bytes);
        }
    }
    if !secret && let Some(data) = object.get("binaryData").and_then(Value::as_object) {
        for (k, v) in data {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap_or_default())
                .map_err(|e| format!("binaryData key {k:?} is not valid base64: {e}"))?;
            out.insert(k.clone(), bytes);
        }
    }
    Ok(out)
}

/// Fetches configmaps and secrets once per container.
struct Lookup<'a, S> {
    source: &'a S,
    namespace: &'a str,
    configmaps: HashMap<String, Option<HashMap<String, Vec<u8>>>>,
    secrets: HashMap<String, Option<HashMap<String, Vec<u8>>>>,
}

impl<S: ObjectSource> Lookup<'_, S> {
    async fn get(
        &mut self,
        secret: bool,
        name: &str,
    ) -> Result<Option<&HashMap<String, Vec<u8>>>, ConfigError> {
        let kind = if secret { "secret" } else { "configmap" };
        let cache = if secret {
            &mut self.secrets
        } else {
            &mut self.configmaps
        };
        if !cache.contains_key(name) {
            let fetched = if secret {
                self.source.secret(self.namespace, name).await
            } else {
                self.source.configmap(self.namespace, name).await
            }
            .map_err(|e| ConfigError(format!("cannot get {kind} \"{name}\": {e}")))?;
            let data = match fetched {
                Some(obj) => Some(
                    string_data(&obj, secret)
                        .map_err(|e| ConfigError(format!("{kind} \"{name}\": {e}")))?,
                ),
                None => None,
            };
            cache.insert(name.to_string(), data);
        }
        Ok(cache.get(name).and_then(Option::as_ref))
    }

    async fn key(
        &mut self,
        secret: bool,
        sel: &KeySelector,
    ) -> Result<Option<String>, ConfigError> {
        let kind = if secret { "secret" } else { "configmap" };
        let optional = sel.optional.unwrap_or(false);
        match self.get(secret, &sel.name).await? {
            None if optional => Ok(None),
            None => Err(ConfigError(format!("{kind} \"{}\" not found", sel.name))),
            Some(data) => match data.get(&sel.key) {
                Some(v) => Ok(Some(String::from_utf8_lossy(v).into_owned())),
                None if optional => Ok(None),
                None => Err(ConfigError(format!(
                    "couldn't find key {} in {} {}/{}",
                    sel.key,
                    if secret { "Secret" } else { "ConfigMap" },
                    self.namespace,
                    sel.name
                ))),
            },
        }
    }
}

/// Env names the kubelet accepts from `envFrom` (a C identifier-ish: no `=`, not empty).
fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('=')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// The environment of `container`, in definition order (later definitions replace earlier).
pub async fn container_env<S: ObjectSource>(
    pod: &Pod,
    container: &Container,
    ctx: &PodContext,
    source: &S,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut lookup = Lookup {
        source,
        namespace: &pod.metadata.namespace,
        configmaps: HashMap::new(),
        secrets: HashMap::new(),
    };
    let mut env = OrderedEnv::default();
    for (k, v) in &ctx.service_env {
        env.set(k.clone(), v.clone());
    }
    for from in &container.env_from {
        let prefix = from.prefix.as_deref().unwrap_or("");
        let (secret, reference) = match (&from.config_map_ref, &from.secret_ref) {
            (Some(r), None) => (false, r),
            (None, Some(r)) => (true, r),
            _ => {
                return Err(ConfigError(
                    "envFrom entries must name exactly one of configMapRef and secretRef".into(),
                ));
            }
        };
        let kind = if secret { "secret" } else { "configmap" };
        match lookup.get(secret, &reference.name).await? {
            None if reference.optional.unwrap_or(false) => {}
            None => {
                return Err(ConfigError(format!(
                    "{kind} \"{}\" not found",
                    reference.name
                )));
            }
            Some(data) => {
                let mut keys: Vec<_> = data.keys().collect();
                keys.sort();
                for k in keys {
                    let name = format!("{prefix}{k}");
                    if !valid_env_name(&name) {
                        tracing::warn!(pod = %pod.key(), container = %container.name, key = %name, "envFrom key is not a valid environment variable name; skipped");
                        continue;
                    }
                    let value = String::from_utf8_lossy(&data[k]).into_owned();
                    env.set(name, value);
                }
            }
        }
    }
    for var in &container.env {
        let value = match &var.value_from {
            None => {
                let literal = var.value.as_deref().unwrap_or("");
                expand(literal, |name| env.get(name).map(str::to_string))
            }
            Some(src) => {
                if let Some(sel) = &src.config_map_key_ref {
                    match lookup.key(false, sel).await? {
                        Some(v) => v,
                        None => continue,
                    }
                } else if let Some(sel) = &src.secret_key_ref {
                    match lookup.key(true, sel).await? {
                        Some(v) => v,
                        None => continue,
                    }
                } else if let Some(f) = &src.field_ref {
                    field_value(pod, ctx, &f.field_path)?
                } else if let Some(r) = &src.resource_field_ref {
                    resource_value(pod, container, ctx, r)?
                } else {
                    String::new()
                }
            }
        };
        env.set(var.name.clone(), value);
    }
    Ok(env.into_vec())
}

#[derive(Default)]
struct OrderedEnv {
    order: Vec<String>,
    values: HashMap<String, String>,
}

impl OrderedEnv {
    fn set(&mut self, name: String, value: String) {
        if self.values.insert(name.clone(), value).is_none() {
            self.order.push(name);
        }
    }
    fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }
    fn into_vec(mut self) -> Vec<(String, String)> {
        self.order
            .into_iter()
            .map(|n| {
                let v = self.values.remove(&n).unwrap_or_default();
                (n, v)
            })
            .collect()
    }
}

/// `metadata.labels['app']` → `Some("app")` for the given prefix.
fn bracket_key<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = path
        .strip_prefix(prefix)?
        .strip_prefix('[')?
        .strip_suffix(']')?;
    rest.strip_prefix('\'')
        .and_then(|r| r.strip_suffix('\''))
        .or_else(|| rest.strip_prefix('"').and_then(|r| r.strip_suffix('"')))
}

/// A `fieldRef` path of the downward API.
pub fn field_value(pod: &Pod, ctx: &PodContext, path: &str) -> Result<String, ConfigError> {
    let m = &pod.metadata;
    Ok(match path {
        "metadata.name" => m.name.clone(),
        "metadata.namespace" => m.namespace.clone(),
        "metadata.uid" => m.uid.clone(),
        "spec.nodeName" => pod.spec.node_name.clone(),
        "spec.serviceAccountName" => pod.spec.service_account_name.clone().unwrap_or_default(),
        "status.hostIP" => ctx.host_ip.clone(),
        "status.hostIPs" => ctx.host_ip.clone(),
        "status.podIP" => ctx.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => ctx.pod_ips.join(","),
        "metadata.labels" => format_map(&m.labels),
        "metadata.annotations" => format_map(&m.annotations),
        other => {
            if let Some(k) = bracket_key(other, "metadata.labels") {
                m.labels.get(k).cloned().unwrap_or_default()
            } else if let Some(k) = bracket_key(other, "metadata.annotations") {
                m.annotations.get(k).cloned().unwrap_or_default()
            } else {
                return Err(ConfigError(format!(
                    "unsupported fieldRef fieldPath {other:?}"
                )));
            }
        }
    })
}

/// `key="value"` lines, sorted by key (the downward API's format for labels/annotations).
pub fn format_map(map: &std::collections::BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={}", serde_json::Value::String(v.clone())))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A `resourceFieldRef`: the container's limit or request, divided by the divisor, rounded
/// up; a limit the container does not set is the node's allocatable amount.
pub fn resource_value(
    pod: &Pod,
    container: &Container,
    ctx: &PodContext,
    r: &ResourceFieldSelector,
) -> Result<String, ConfigError> {
    let target = match r.container_name.as_deref().filter(|n| !n.is_empty()) {
        Some(n) => pod
            .spec
            .containers
            .iter()
            .chain(&pod.spec.init_containers)
            .find(|c| c.name == n)
            .ok_or_else(|| {
                ConfigError(format!("resourceFieldRef names unknown container {n:?}"))
            })?,
        None => container,
    };
    let (kind, resource) = r
        .resource
        .split_once('.')
        .ok_or_else(|| ConfigError(format!("unsupported resource {:?}", r.resource)))?;
    let map = match kind {
        "limits" => &target.resources.limits,
        "requests" => &target.resources.requests,
        _ => {
            return Err(ConfigError(format!(
                "unsupported resource {:?}",
                r.resource
            )));
        }
    };
    let cpu = resource == "cpu";
    let set = map.get(resource).and_then(quantity::from_json);
    let set_value = match &set {
        Some(q) => Some(
            if cpu {
                quantity::parse_milli(q)
            } else {
                quantity::parse_units(q)
            }
            .ok_or_else(|| ConfigError(format!("invalid quantity {q:?} for {}", r.resource)))?,
        ),
        None => None,
    };
    let value = match (set_value, kind, resource) {
        (Some(v), _, _) => v,
        (None, _, "cpu") => {
            if kind == "limits" {
                ctx.allocatable_cpu_milli
            } else {
                0
            }
        }
        (None, "limits", "memory") => ctx.allocatable_memory,
        (None, "limits", "ephemeral-storage") => ctx.allocatable_ephemeral,
        (None, _, "memory" | "ephemeral-storage") => 0,
        _ => {
            return Err(ConfigError(format!(
                "unsupported resource {:?}",
                r.resource
            )));
        }
    };
    let divisor = r
        .divisor
        .as_ref()
        .and_then(quantity::from_json)
        .unwrap_or_else(|| "1".into());
    let d = if cpu {
        quantity::parse_milli(&divisor)
    } else {
        quantity::parse_units(&divisor)
    }
    .filter(|d| *d > 0)
    .ok_or_else(|| ConfigError(format!("invalid divisor {divisor:?}")))?;
    let result = (value + d - 1) / d;
    // Requests of 0 CPU report 1 (the kubelet rounds up to at least one unit for CPU).
    Ok(if cpu && result == 0 && kind == "requests" {
        "1".into()
    } else {
        result.to_string()
    })
}

/// Kubernetes `$(VAR)` expansion: `$(NAME)` becomes the value when defined and stays as is
/// otherwise; `$$` is an escaped `$`.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match lookup(name) {
                        Some(v) => out.push_str(&v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Objects(HashMap<String, Value>);

    impl ObjectSource for Objects {
        async fn configmap(&self, ns: &str, name: &str) -> Result<Option<Value>, String> {
            Ok(self.0.get(&format!("cm/{ns}/{name}")).cloned())
        }
        async fn secret(&self, ns: &str, name: &str) -> Result<Option<Value>, String> {
            Ok(self.0.get(&format!("secret/{ns}/{name}")).cloned())
        }
        async fn service_account_token(&self, _: &str, _: &str, _: Value) -> Result<Value, String> {
            Err("offline".into())
        }
    }

    fn objects() -> Objects {
        Objects(HashMap::from([
            (
                "cm/ns/cfg".to_string(),
                json!({"data": {"color": "blue", "size": "L", "bad key": "x"}}),
            ),
            (
                "secret/ns/creds".to_string(),
                json!({"data": {"password": "c2VjcmV0"}}),
            ),
        ]))
    }

    fn pod(container: Value) -> Pod {
        Pod::from_value(&json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u-1", "labels": {"app": "w"}},
            "spec": {"nodeName": "edge-1", "containers": [container]},
        }))
        .unwrap()
    }

    fn ctx() -> PodContext {
        PodContext {
            pod_ips: vec!["10.0.0.5".into()],
            host_ip: "192.168.1.2".into(),
            allocatable_cpu_milli: 2000,
            allocatable_memory: 1 << 30,
            allocatable_ephemeral: 1 << 34,
            service_env: Vec::new(),
        }
    }

    #[tokio::test]
    async fn the_metaserver_is_the_kubernetes_service_unless_the_pod_says_otherwise() {
        let p = pod(json!({"name": "c", "image": "x",
            "env": [{"name": "KUBERNETES_SERVICE_PORT", "value": "443"},
                    {"name": "URL", "value": "https://$(KUBERNETES_SERVICE_HOST)"}]}));
        let mut c = ctx();
        c.service_env = master_service_env("169.254.30.10:10550".parse().unwrap());
        let env = container_env(&p, &p.spec.containers[0], &c, &objects())
            .await
            .unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("169.254.30.10"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT"), Some("tcp://169.254.30.10:10550"));
        assert_eq!(get("KUBERNETES_PORT_10550_TCP_ADDR"), Some("169.254.30.10"));
        assert_eq!(get("URL"), Some("https://169.254.30.10"));
        let plain = container_env(&p, &p.spec.containers[0], &ctx(), &objects())
            .await
            .unwrap();
        assert!(!plain.iter().any(|(n, _)| n == "KUBERNETES_SERVICE_HOST"));
    }

    #[tokio::test]
    async fn env_resolves_every_source_in_order() {
        let p = pod(json!({"name": "c", "image": "x",
        "resources": {"limits": {"memory": "64Mi"}},
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
        "env": [
            {"name": "A", "value": "1"},
            {"name": "B", "value": "$(A)-$(CFG_color)-$(NOPE)-$$(A)"},
            {"name": "COLOR", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "color"}}},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "missing", "key": "k", "optional": true}}},
            {"name": "A", "value": "2"},
        ]}));
        let env = container_env(&p, &p.spec.containers[0], &ctx(), &objects())
            .await
            .unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("CFG_color"), Some("blue"));
        assert_eq!(get("CFG_bad key"), None, "invalid names are skipped");
        assert_eq!(get("A"), Some("2"));
        assert_eq!(get("B"), Some("1-blue-$(NOPE)-$(A)"));
        assert_eq!(get("COLOR"), Some("blue"));
        assert_eq!(get("PW"), Some("secret"));
        assert_eq!(get("POD"), Some("web"));
        assert_eq!(get("NS"), Some("ns"));
        assert_eq!(get("UID"), Some("u-1"));
        assert_eq!(get("IP"), Some("10.0.0.5"));
        assert_eq!(get("NODE"), Some("edge-1"));
        assert_eq!(get("APP"), Some("w"));
        assert_eq!(get("MEM"), Some("64"));
        assert_eq!(get("CPU"), Some("2"));
        assert_eq!(get("OPT"), None);
        // Definition order, a redefinition keeps its first place.
        assert_eq!(env[0].0, "CFG_color");
        assert_eq!(env[2].0, "A");
    }

    #[tokio::test]
    async fn missing_references_are_config_errors() {
        for (var, expected) in [
            (
                json!({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k"}}}),
                "configmap \"gone\" not found",
            ),
            (
                json!({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}}),
                "couldn't find key k in ConfigMap ns/cfg",
            ),
            (
                json!({"name": "X", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k"}}}),
                "secret \"gone\" not found",
            ),
            (
                json!({"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.nope"}}}),
                "unsupported fieldRef fieldPath \"spec.nope\"",
            ),
        ] {
            let p = pod(json!({"name": "c", "image": "x", "env": [var]}));
            let err = container_env(&p, &p.spec.containers[0], &ctx(), &objects())
                .await
                .unwrap_err();
            assert_eq!(err.0, expected);
        }
    }

    #[test]
    fn expansion_follows_kubernetes() {
        let lookup = |n: &str| (n == "X").then(|| "x".to_string());
        assert_eq!(expand("$(X)", lookup), "x");
        assert_eq!(expand("a$(X)b$(Y)c", lookup), "ax b$(Y)c".replace(' ', ""));
        assert_eq!(expand("$$(X)", lookup), "$(X)");
        assert_eq!(expand("$X $", lookup), "$X $");
        assert_eq!(expand("$(X", lookup), "$(X");
        assert_eq!(expand("€$(X)€", lookup), "€x€");
    }
}
