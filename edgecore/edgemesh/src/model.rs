//! The objects edgemesh acts on, parsed once from the JSON the edge database holds into
//! compact types that keep only what Services at the edge need: Services, EndpointSlices
//! (`discovery.k8s.io/v1`) and the pods running on this node.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// A namespaced name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl Key {
    pub fn new(namespace: &str, name: &str) -> Key {
        Key {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// Kubernetes' spelling (`TCP` when absent).
    pub fn parse(s: Option<&str>) -> Option<Protocol> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// Lower case, as in SRV names and iptables arguments.
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// A Service's `targetPort`: a number, or the name of a container port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetPort {
    Number(u16),
    Name(Arc<str>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub name: Arc<str>,
    pub protocol: Protocol,
    pub port: u16,
    pub target_port: TargetPort,
    pub node_port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceType {
    ClusterIp,
    NodePort,
    LoadBalancer,
    /// A CNAME to this name.
    ExternalName(Arc<str>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub key: Key,
    pub service_type: ServiceType,
    /// Empty for headless Services (`clusterIP: None`) and ExternalName.
    pub cluster_ips: Vec<IpAddr>,
    pub headless: bool,
    pub ports: Vec<ServicePort>,
    /// `None`: no selector (endpoints come only from EndpointSlices someone else writes).
    pub selector: Option<BTreeMap<String, String>>,
    /// `sessionAffinity: ClientIP` and its timeout in seconds.
    pub affinity_seconds: Option<u32>,
    /// `internalTrafficPolicy: Local`.
    pub internal_local: bool,
    /// `externalTrafficPolicy: Local` (NodePorts).
    pub external_local: bool,
    pub publish_not_ready: bool,
}

/// The kubelet's default ClientIP affinity timeout (3 hours).
pub const DEFAULT_AFFINITY_SECONDS: u32 = 10800;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressType {
    V4,
    V6,
    Fqdn,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlicePort {
    /// Matches the Service port of the same name (empty for an unnamed port).
    pub name: Arc<str>,
    pub port: Option<u16>,
    pub protocol: Protocol,
}

/// One endpoint, compact: a catalog holds tens of thousands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceEndpoint {
    /// The first address (Kubernetes: consumers use the first; kube-proxy does).
    pub address: IpAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub hostname: Option<Arc<str>>,
    pub node_name: Option<Arc<str>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSlice {
    pub key: Key,
    /// The Service it belongs to (label `kubernetes.io/service-name`).
    pub service: Option<Arc<str>>,
    pub address_type: AddressType,
    pub ports: Box<[SlicePort]>,
    pub endpoints: Box<[SliceEndpoint]>,
}

/// A container port of a local pod (named target ports resolve against these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerPort {
    pub name: Arc<str>,
    pub port: u16,
    pub protocol: Protocol,
}

/// A pod on this node as edged knows it now (also while the cloud is unreachable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPod {
    pub uid: Arc<str>,
    pub key: Key,
    pub labels: BTreeMap<String, String>,
    pub ips: Vec<IpAddr>,
    pub ready: bool,
    pub terminating: bool,
    pub hostname: Option<Arc<str>>,
    pub subdomain: Option<Arc<str>>,
    pub ports: Vec<ContainerPort>,
}

/// Why an object could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    #[error("not valid JSON for a {kind}: {message}")]
    Json { kind: &'static str, message: String },
    #[error("{kind} without metadata.name or metadata.namespace")]
    NoName { kind: &'static str },
}

// ---- wire shapes (only the fields used) ----

#[derive(Deserialize, Default)]
#[serde(default)]
struct Meta {
    name: String,
    namespace: String,
    labels: BTreeMap<String, String>,
    #[serde(rename = "deletionTimestamp")]
    deletion_timestamp: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum IntOrString {
    Int(i64),
    Str(String),
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireServicePort {
    name: String,
    protocol: Option<String>,
    port: i64,
    target_port: Option<IntOrString>,
    node_port: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ClientIpConfig {
    timeout_seconds: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct AffinityConfig {
    #[serde(rename = "clientIP")]
    client_ip: ClientIpConfig,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireServiceSpec {
    #[serde(rename = "type")]
    service_type: Option<String>,
    #[serde(rename = "clusterIP")]
    cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs")]
    cluster_ips: Vec<String>,
    ports: Vec<WireServicePort>,
    selector: Option<BTreeMap<String, String>>,
    session_affinity: Option<String>,
    session_affinity_config: AffinityConfig,
    internal_traffic_policy: Option<String>,
    external_traffic_policy: Option<String>,
    publish_not_ready_addresses: bool,
    external_name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireService {
    metadata: Meta,
    spec: WireServiceSpec,
}

fn port_number(n: i64) -> Option<u16> {
    u16::try_from(n).ok().filter(|p| *p > 0)
}

fn json<'a, T: Deserialize<'a>>(kind: &'static str, text: &'a str) -> Result<T, ModelError> {
    serde_json::from_str(text).map_err(|e| ModelError::Json {
        kind,
        message: e.to_string(),
    })
}

fn key_of(kind: &'static str, m: &Meta) -> Result<Key, ModelError> {
    if m.name.is_empty() || m.namespace.is_empty() {
        return Err(ModelError::NoName { kind });
    }
    Ok(Key::new(&m.namespace, &m.name))
}

impl Service {
    /// Parses a Service from its JSON. Ports, addresses and names that are not valid are
    /// left out (a Service the API server accepted has none).
    pub fn from_json(text: &str) -> Result<Service, ModelError> {
        let w: WireService = json("Service", text)?;
        let key = key_of("Service", &w.metadata)?;
        let spec = w.spec;
        let service_type = match spec.service_type.as_deref() {
            Some("NodePort") => ServiceType::NodePort,
            Some("LoadBalancer") => ServiceType::LoadBalancer,
            Some("ExternalName") => {
                ServiceType::ExternalName(spec.external_name.unwrap_or_default().into())
            }
            _ => ServiceType::ClusterIp,
        };
        let headless = spec.cluster_ip.as_deref() == Some("None");
        let mut cluster_ips: Vec<IpAddr> = if spec.cluster_ips.is_empty() {
            spec.cluster_ip
                .iter()
                .filter_map(|s| s.parse().ok())
                .collect()
        } else {
            spec.cluster_ips
                .iter()
                .filter_map(|s| s.parse().ok())
                .collect()
        };
        if headless || matches!(service_type, ServiceType::ExternalName(_)) {
            cluster_ips.clear();
        }
        cluster_ips.shrink_to_fit();
        let ports: Vec<ServicePort> = spec
            .ports
            .iter()
            .filter_map(|p| {
                let port = port_number(p.port)?;
                let target_port = match &p.target_port {
                    None => TargetPort::Number(port),
                    Some(IntOrString::Int(n)) => TargetPort::Number(port_number(*n)?),
                    Some(IntOrString::Str(s)) => match s.parse::<i64>() {
                        Ok(n) => TargetPort::Number(port_number(n)?),
                        Err(_) if s.is_empty() => TargetPort::Number(port),
                        Err(_) => TargetPort::Name(s.as_str().into()),
                    },
                };
                Some(ServicePort {
                    name: p.name.as_str().into(),
                    protocol: Protocol::parse(p.protocol.as_deref())?,
                    port,
                    target_port,
                    node_port: p.node_port.and_then(port_number),
                })
            })
            .collect();
        let mut ports = ports;
        ports.shrink_to_fit();
        let affinity_seconds = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
            spec.session_affinity_config
                .client_ip
                .timeout_seconds
                .and_then(|t| u32::try_from(t).ok())
                .filter(|t| *t > 0)
                .unwrap_or(DEFAULT_AFFINITY_SECONDS)
        });
        Ok(Service {
            key,
            service_type,
            cluster_ips,
            headless,
            ports,
            selector: spec.selector.filter(|s| !s.is_empty()),
            affinity_seconds,
            internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
            external_local: spec.external_traffic_policy.as_deref() == Some("Local"),
            publish_not_ready: spec.publish_not_ready_addresses,
        })
    }
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireConditions {
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireEndpoint {
    addresses: Vec<String>,
    conditions: WireConditions,
    hostname: Option<String>,
    node_name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireSlicePort {
    name: Option<String>,
    port: Option<i64>,
    protocol: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireSlice {
    metadata: Meta,
    address_type: String,
    endpoints: Vec<WireEndpoint>,
    ports: Vec<WireSlicePort>,
}

/// Labels of an EndpointSlice naming its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";

impl EndpointSlice {
    pub fn from_json(text: &str) -> Result<EndpointSlice, ModelError> {
        let w: WireSlice = json("EndpointSlice", text)?;
        let key = key_of("EndpointSlice", &w.metadata)?;
        let address_type = match w.address_type.as_str() {
            "IPv6" => AddressType::V6,
            "FQDN" => AddressType::Fqdn,
            _ => AddressType::V4,
        };
        // Built by reference, not in place: an in-place collect would keep the (larger)
        // allocation of the wire vector.
        let ports: Box<[SlicePort]> = w
            .ports
            .iter()
            .filter_map(|p| {
                Some(SlicePort {
                    name: p.name.as_deref().unwrap_or_default().into(),
                    port: match p.port {
                        None => None,
                        Some(n) => Some(port_number(n)?),
                    },
                    protocol: Protocol::parse(p.protocol.as_deref())?,
                })
            })
            .collect();
        let endpoints: Box<[SliceEndpoint]> = w
            .endpoints
            .iter()
            .filter_map(|e| {
                let terminating = e.conditions.terminating.unwrap_or(false);
                // Kubernetes: a nil `ready` means ready, `serving` defaults to `ready`.
                let ready = e.conditions.ready.unwrap_or(true);
                Some(SliceEndpoint {
                    address: e.addresses.first()?.parse().ok()?,
                    ready,
                    serving: e.conditions.serving.unwrap_or(ready),
                    terminating,
                    hostname: e
                        .hostname
                        .as_deref()
                        .filter(|h| !h.is_empty())
                        .map(Into::into),
                    node_name: e
                        .node_name
                        .as_deref()
                        .filter(|n| !n.is_empty())
                        .map(Into::into),
                })
            })
            .collect();
        Ok(EndpointSlice {
            service: w
                .metadata
                .labels
                .get(LABEL_SERVICE_NAME)
                .filter(|s| !s.is_empty())
                .map(|s| s.as_str().into()),
            key,
            address_type,
            ports,
            endpoints,
        })
    }
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireContainerPort {
    name: String,
    container_port: i64,
    protocol: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireContainer {
    ports: Vec<WireContainerPort>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WirePodIp {
    ip: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireCondition {
    #[serde(rename = "type")]
    kind: String,
    status: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WirePodSpec {
    containers: Vec<WireContainer>,
    hostname: Option<String>,
    subdomain: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WirePodStatus {
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(rename = "podIPs")]
    pod_ips: Vec<WirePodIp>,
    conditions: Vec<WireCondition>,
    phase: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WirePod {
    metadata: Meta,
    spec: WirePodSpec,
    status: WirePodStatus,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireUid {
    uid: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireUidHolder {
    metadata: WireUid,
}

fn value<'a, T: Deserialize<'a>>(
    kind: &'static str,
    v: &'a serde_json::Value,
) -> Result<T, ModelError> {
    T::deserialize(v).map_err(|e| ModelError::Json {
        kind,
        message: e.to_string(),
    })
}

impl LocalPod {
    /// A local pod from its object as stored (`status` as edged last computed it, when
    /// `status` is given, instead of the stored one).
    pub fn from_json(pod: &str, status: Option<&str>) -> Result<LocalPod, ModelError> {
        let w: WirePod = json("Pod", pod)?;
        let uid: WireUidHolder = json("Pod", pod)?;
        let status = match status {
            Some(s) => Some(json("PodStatus", s)?),
            None => None,
        };
        Self::from_wire(w, uid, status)
    }

    /// Like [`LocalPod::from_json`], from objects edged already holds parsed.
    pub fn from_value(
        pod: &serde_json::Value,
        status: Option<&serde_json::Value>,
    ) -> Result<LocalPod, ModelError> {
        let w: WirePod = value("Pod", pod)?;
        let uid: WireUidHolder = value("Pod", pod)?;
        let status = match status {
            Some(s) => Some(value("PodStatus", s)?),
            None => None,
        };
        Self::from_wire(w, uid, status)
    }

    fn from_wire(
        mut w: WirePod,
        uid: WireUidHolder,
        status: Option<WirePodStatus>,
    ) -> Result<LocalPod, ModelError> {
        let key = key_of("Pod", &w.metadata)?;
        if let Some(s) = status {
            w.status = s;
        }
        let mut ips: Vec<IpAddr> = w
            .status
            .pod_ips
            .iter()
            .filter_map(|p| p.ip.parse().ok())
            .collect();
        if ips.is_empty()
            && let Some(ip) = w.status.pod_ip.as_deref().and_then(|s| s.parse().ok())
        {
            ips.push(ip);
        }
        let running = !matches!(w.status.phase.as_deref(), Some("Succeeded" | "Failed"));
        let ready = running
            && w.status
                .conditions
                .iter()
                .any(|c| c.kind == "Ready" && c.status == "True");
        let ports = w
            .spec
            .containers
            .iter()
            .flat_map(|c| c.ports.iter())
            .filter_map(|p| {
                Some(ContainerPort {
                    name: p.name.as_str().into(),
                    port: port_number(p.container_port)?,
                    protocol: Protocol::parse(p.protocol.as_deref())?,
                })
            })
            .collect();
        Ok(LocalPod {
            uid: uid.metadata.uid.into(),
            key,
            labels: w.metadata.labels,
            ips,
            ready,
            terminating: w.metadata.deletion_timestamp.is_some() || !running,
            hostname: w.spec.hostname.filter(|h| !h.is_empty()).map(Into::into),
            subdomain: w.spec.subdomain.filter(|h| !h.is_empty()).map(Into::into),
            ports,
        })
    }

    /// The container port `name` of `protocol`.
    pub fn named_port(&self, name: &str, protocol: Protocol) -> Option<u16> {
        self.ports
            .iter()
            .find(|p| &*p.name == name && p.protocol == protocol)
            .map(|p| p.port)
    }

    /// Whether the selector (non-empty) matches this pod's labels.
    pub fn selected_by(&self, selector: &BTreeMap<String, String>) -> bool {
        !selector.is_empty()
            && selector
                .iter()
                .all(|(k, v)| self.labels.get(k).is_some_and(|l| l == v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn service_parses_ports_affinity_and_policies() {
        let s = Service::from_json(
            &json!({"metadata": {"name": "web", "namespace": "shop"},
                "spec": {"type": "NodePort", "clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"],
                  "selector": {"app": "web"}, "sessionAffinity": "ClientIP",
                  "internalTrafficPolicy": "Local",
                  "ports": [{"name": "http", "port": 80, "targetPort": "http", "nodePort": 30080},
                            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353},
                            {"name": "bad", "port": 70000},
                            {"name": "odd", "port": 81, "protocol": "ICMP"}]}})
            .to_string(),
        )
        .unwrap();
        assert_eq!(s.key, Key::new("shop", "web"));
        assert_eq!(s.service_type, ServiceType::NodePort);
        assert_eq!(s.cluster_ips, vec!["10.96.0.20".parse::<IpAddr>().unwrap()]);
        assert_eq!(s.ports.len(), 2);
        assert_eq!(s.ports[0].target_port, TargetPort::Name("http".into()));
        assert_eq!(s.ports[0].node_port, Some(30080));
        assert_eq!(s.ports[1].protocol, Protocol::Udp);
        assert_eq!(s.ports[1].target_port, TargetPort::Number(5353));
        assert_eq!(s.affinity_seconds, Some(DEFAULT_AFFINITY_SECONDS));
        assert!(s.internal_local && !s.external_local && !s.headless);
    }

    #[test]
    fn headless_and_external_name_services_have_no_cluster_ip() {
        let h = Service::from_json(
            r#"{"metadata":{"name":"db","namespace":"a"},"spec":{"clusterIP":"None","clusterIPs":["None"],"ports":[{"port":5432}]}}"#,
        )
        .unwrap();
        assert!(h.headless && h.cluster_ips.is_empty());
        assert_eq!(h.ports[0].target_port, TargetPort::Number(5432));
        let e = Service::from_json(
            r#"{"metadata":{"name":"ext","namespace":"a"},"spec":{"type":"ExternalName","externalName":"example.com"}}"#,
        )
        .unwrap();
        assert_eq!(
            e.service_type,
            ServiceType::ExternalName("example.com".into())
        );
    }

    #[test]
    fn malformed_objects_are_errors_not_panics() {
        assert!(Service::from_json("{").is_err());
        assert!(Service::from_json("[]").is_err());
        assert_eq!(
            Service::from_json(r#"{"metadata":{"name":"x"}}"#),
            Err(ModelError::NoName { kind: "Service" })
        );
        assert!(EndpointSlice::from_json(r#"{"metadata":5}"#).is_err());
        assert!(LocalPod::from_json("null", None).is_err());
    }

    #[test]
    fn endpoint_slice_conditions_default_as_kubernetes_says() {
        let s = EndpointSlice::from_json(
            &json!({"metadata": {"name": "web-abc", "namespace": "shop",
                  "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": [
                  {"addresses": ["10.88.0.5"], "nodeName": "edge-1",
                   "targetRef": {"kind": "Pod", "name": "web-1"}},
                  {"addresses": ["10.88.0.6", "bogus"], "conditions": {"ready": false, "terminating": true},
                   "hostname": "w2"},
                  {"addresses": ["bogus"]}]})
            .to_string(),
        )
        .unwrap();
        assert_eq!(s.service.as_deref(), Some("web"));
        assert_eq!(s.ports[0].port, Some(8080));
        let (a, b) = (&s.endpoints[0], &s.endpoints[1]);
        assert!(a.ready && a.serving && !a.terminating);
        assert_eq!(a.node_name.as_deref(), Some("edge-1"));
        assert!(!b.ready && !b.serving && b.terminating);
        assert_eq!(b.address.to_string(), "10.88.0.6");
        assert_eq!(
            s.endpoints.len(),
            2,
            "an endpoint without a usable first address is left out"
        );
        assert_eq!(b.hostname.as_deref(), Some("w2"));
    }

    #[test]
    fn local_pod_readiness_ports_and_status_override() {
        let pod = json!({"metadata": {"name": "web-1", "namespace": "shop", "uid": "u1",
                "labels": {"app": "web"}},
            "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8080}]}],
                     "hostname": "w1", "subdomain": "web"},
            "status": {"podIP": "10.88.0.5",
                       "conditions": [{"type": "Ready", "status": "True"}]}})
        .to_string();
        let p = LocalPod::from_json(&pod, None).unwrap();
        assert!(p.ready && !p.terminating);
        assert_eq!(p.ips, vec!["10.88.0.5".parse::<IpAddr>().unwrap()]);
        assert_eq!(p.named_port("http", Protocol::Tcp), Some(8080));
        assert_eq!(p.named_port("http", Protocol::Udp), None);
        let mut sel = BTreeMap::new();
        sel.insert("app".to_string(), "web".to_string());
        assert!(p.selected_by(&sel));
        assert!(!p.selected_by(&BTreeMap::new()));
        let status = json!({"podIPs": [{"ip": "10.88.0.9"}], "conditions": [], "phase": "Running"})
            .to_string();
        let q = LocalPod::from_json(&pod, Some(&status)).unwrap();
        assert!(!q.ready);
        assert_eq!(q.ips, vec!["10.88.0.9".parse::<IpAddr>().unwrap()]);
    }
}
