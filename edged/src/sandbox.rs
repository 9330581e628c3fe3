//! The pod sandbox (`RunPodSandbox`) configuration the kubelet would send for a pod: host or
//! pod network (a host-network sandbox has an empty hostname: it has no UTS namespace of its
//! own), DNS, host ports, the kubelet's labels, the log directory, security context and
//! sysctls.

use super::settings::EdgedConfig;
use super::spec::{Pod, SeccompProfile};
use crate::cri::api;
use crate::cri::runtime::{LABEL_NODE, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID};
use std::collections::HashMap;
use std::path::PathBuf;

/// `<pod logs dir>/<namespace>_<name>_<uid>`: where the runtime writes container logs.
pub fn log_directory(config: &EdgedConfig, pod: &Pod) -> PathBuf {
    config.pod_logs_directory.join(format!(
        "{}_{}_{}",
        pod.metadata.namespace, pod.metadata.name, pod.metadata.uid
    ))
}

/// The hostname a pod's sandbox gets: empty with host network, else `spec.hostname` or the
/// pod name (cut to 63 characters, as the kubelet does).
pub fn hostname(pod: &Pod) -> String {
    if pod.spec.host_network {
        return String::new();
    }
    let name = pod
        .spec
        .hostname
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| pod.metadata.name.clone());
    let mut cut: String = name.chars().take(63).collect();
    while cut.ends_with(['-', '.']) {
        cut.pop();
    }
    cut
}

/// The namespaces of a pod's containers.
pub fn namespace_options(pod: &Pod) -> api::NamespaceOption {
    let mode = |host: bool, shared: bool| {
        if host {
            api::NamespaceMode::Node
        } else if shared {
            api::NamespaceMode::Pod
        } else {
            api::NamespaceMode::Container
        }
    };
    api::NamespaceOption {
        network: mode(pod.spec.host_network, true) as i32,
        pid: mode(
            pod.spec.host_pid,
            pod.spec.share_process_namespace.unwrap_or(false),
        ) as i32,
        ipc: mode(pod.spec.host_ipc, true) as i32,
        ..Default::default()
    }
}

pub fn seccomp(profile: Option<&SeccompProfile>) -> Option<api::SecurityProfile> {
    let p = profile?;
    let profile_type = match p.type_.as_str() {
        "RuntimeDefault" => api::security_profile::ProfileType::RuntimeDefault,
        "Localhost" => api::security_profile::ProfileType::Localhost,
        _ => api::security_profile::ProfileType::Unconfined,
    };
    Some(api::SecurityProfile {
        profile_type: profile_type as i32,
        localhost_ref: p.localhost_profile.clone().unwrap_or_default(),
    })
}

/// The kubelet's labels of a pod's sandbox and containers.
pub fn pod_labels(pod: &Pod, node: &str) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_POD_NAME.to_string(), pod.metadata.name.clone()),
        (
            LABEL_POD_NAMESPACE.to_string(),
            pod.metadata.namespace.clone(),
        ),
        (LABEL_POD_UID.to_string(), pod.metadata.uid.clone()),
        (LABEL_NODE.to_string(), node.to_string()),
    ])
}

/// The sandbox configuration for `pod` (also passed along with every `CreateContainer`).
/// `cgroup_parent`: the pod's cgroup ([`super::cgroups::PodCgroups::pod_parent`]; empty: the
/// runtime's default).
pub fn sandbox_config(
    pod: &Pod,
    config: &EdgedConfig,
    attempt: u32,
    cgroup_parent: &str,
) -> api::PodSandboxConfig {
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.extend(pod_labels(pod, &config.node_name));
    let annotations = pod
        .metadata
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let port_mappings = if pod.spec.host_network {
        Vec::new()
    } else {
        pod.spec
            .containers
            .iter()
            .flat_map(|c| &c.ports)
            .filter(|p| p.host_port.unwrap_or(0) > 0)
            .map(|p| api::PortMapping {
                protocol: match p.protocol.as_deref() {
                    Some("UDP") => api::Protocol::Udp,
                    Some("SCTP") => api::Protocol::Sctp,
                    _ => api::Protocol::Tcp,
                } as i32,
                container_port: p.container_port,
                host_port: p.host_port.unwrap_or(0),
                host_ip: p.host_ip.clone().unwrap_or_default(),
            })
            .collect()
    };
    let psc = pod.spec.security_context.clone().unwrap_or_default();
    let privileged = pod
        .spec
        .containers
        .iter()
        .chain(&pod.spec.init_containers)
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        });
    let mut supplemental_groups = psc.supplemental_groups.clone();
    if let Some(g) = psc.fs_group {
        supplemental_groups.push(g);
    }
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            namespace: pod.metadata.namespace.clone(),
            attempt,
        }),
        hostname: hostname(pod),
        log_directory: log_directory(config, pod).display().to_string(),
        dns_config: dns_config(pod, config),
        port_mappings,
        labels,
        annotations,
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.to_string(),
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(pod)),
                run_as_user: psc.run_as_user.map(|value| api::Int64Value { value }),
                run_as_group: psc.run_as_group.map(|value| api::Int64Value { value }),
                supplemental_groups,
                privileged,
                seccomp: seccomp(psc.seccomp_profile.as_ref()),
                ..Default::default()
            }),
            sysctls: psc
                .sysctls
                .iter()
                .map(|s| (s.name.clone(), s.value.clone()))
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// DNS per `dnsPolicy`: `ClusterFirst` uses `clusterDNS` (falling back to the node's
/// resolv.conf when none is configured, as the kubelet does), host-network pods use the
/// node's unless `ClusterFirstWithHostNet`, `None` only `dnsConfig`; `dnsConfig` is merged in.
pub fn dns_config(pod: &Pod, config: &EdgedConfig) -> Option<api::DnsConfig> {
    let policy = pod.spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let cluster = match policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !pod.spec.host_network,
        _ => false,
    };
    let mut dns = if policy == "None" {
        api::DnsConfig::default()
    } else if cluster && !config.cluster_dns.is_empty() {
        let ns = &pod.metadata.namespace;
        let domain = &config.cluster_domain;
        let mut searches = vec![
            format!("{ns}.svc.{domain}"),
            format!("svc.{domain}"),
            domain.clone(),
        ];
        searches.extend(host_resolv_conf(config).searches);
        api::DnsConfig {
            servers: config.cluster_dns.clone(),
            searches,
            options: vec!["ndots:5".into()],
        }
    } else if pod.spec.host_network && pod.spec.dns_config.is_none() {
        // The runtime gives a host-network sandbox the node's resolv.conf.
        return None;
    } else {
        host_resolv_conf(config)
    };
    if let Some(extra) = &pod.spec.dns_config {
        for s in &extra.nameservers {
            if !dns.servers.contains(s) {
                dns.servers.push(s.clone());
            }
        }
        for s in &extra.searches {
            if !dns.searches.contains(s) {
                dns.searches.push(s.clone());
            }
        }
        for o in &extra.options {
            let text = match &o.value {
                Some(v) => format!("{}:{v}", o.name),
                None => o.name.clone(),
            };
            dns.options
                .retain(|existing| existing.split(':').next() != Some(o.name.as_str()));
            dns.options.push(text);
        }
    }
    // The kubelet's limits (validation.MaxDNSNameservers, MaxDNSSearchPaths): resolvers
    // read at most three nameservers, so the rest would be silently unused.
    if dns.servers.len() > MAX_DNS_NAMESERVERS {
        tracing::warn!(pod = %pod.key(), nameservers = ?dns.servers, "more than {MAX_DNS_NAMESERVERS} nameservers; the first {MAX_DNS_NAMESERVERS} are used");
        dns.servers.truncate(MAX_DNS_NAMESERVERS);
    }
    dns.searches.truncate(32);
    Some(dns)
}

/// Nameservers a pod's resolv.conf holds at most (the kubelet's limit).
pub const MAX_DNS_NAMESERVERS: usize = 3;

/// The node's resolver configuration (`resolvConf`, `/etc/resolv.conf` by default).
fn host_resolv_conf(config: &EdgedConfig) -> api::DnsConfig {
    let text = std::fs::read_to_string(&config.resolv_conf).unwrap_or_default();
    parse_resolv_conf(&text)
}

pub fn parse_resolv_conf(text: &str) -> api::DnsConfig {
    let mut dns = api::DnsConfig::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut fields = line.split_whitespace();
        match fields.next() {
            Some("nameserver") => dns.servers.extend(fields.take(1).map(str::to_string)),
            Some("search") | Some("domain") => {
                dns.searches = fields.map(str::to_string).collect();
            }
            Some("options") => dns.options.extend(fields.map(str::to_string)),
            _ => {}
        }
    }
    dns
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        Pod::from_value(&json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u-1", "labels": {"app": "w"}},
            "spec": spec,
        }))
        .unwrap()
    }

    fn config() -> EdgedConfig {
        EdgedConfig {
            node_name: "edge-1".into(),
            pod_logs_directory: "/logs".into(),
            resolv_conf: "/nonexistent/resolv.conf".into(),
            ..EdgedConfig::default()
        }
    }

    #[test]
    fn host_network_sandboxes_have_no_hostname_and_node_namespaces() {
        let p = pod(
            json!({"hostNetwork": true, "containers": [{"name": "c", "image": "x",
            "ports": [{"containerPort": 80, "hostPort": 80}]}]}),
        );
        let s = sandbox_config(&p, &config(), 2, "");
        assert_eq!(s.hostname, "");
        assert!(s.port_mappings.is_empty());
        assert_eq!(s.metadata.as_ref().unwrap().attempt, 2);
        let ns = s
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap();
        assert_eq!(ns.network(), api::NamespaceMode::Node);
        assert_eq!(ns.pid(), api::NamespaceMode::Container);
        assert_eq!(ns.ipc(), api::NamespaceMode::Pod);
        assert_eq!(s.dns_config, None);
    }

    #[test]
    fn pod_network_sandboxes_carry_labels_ports_and_cluster_dns() {
        let p = pod(json!({"containers": [{"name": "c", "image": "x",
            "ports": [{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}]}]}));
        let mut c = config();
        c.cluster_dns = vec!["10.96.0.10".into()];
        let s = sandbox_config(&p, &c, 0, "/kubepods/besteffort/podu-1");
        assert_eq!(s.hostname, "web");
        assert_eq!(s.log_directory, "/logs/ns_web_u-1");
        assert_eq!(
            s.linux.as_ref().unwrap().cgroup_parent,
            "/kubepods/besteffort/podu-1"
        );
        assert_eq!(s.labels[LABEL_POD_UID], "u-1");
        assert_eq!(s.labels[LABEL_POD_NAME], "web");
        assert_eq!(s.labels[LABEL_POD_NAMESPACE], "ns");
        assert_eq!(s.labels[LABEL_NODE], "edge-1");
        assert_eq!(s.labels["app"], "w");
        assert_eq!(s.port_mappings.len(), 1);
        assert_eq!(s.port_mappings[0].host_port, 8080);
        assert_eq!(s.port_mappings[0].protocol(), api::Protocol::Udp);
        let dns = s.dns_config.unwrap();
        assert_eq!(dns.servers, ["10.96.0.10"]);
        assert_eq!(
            dns.searches[..3],
            ["ns.svc.cluster.local", "svc.cluster.local", "cluster.local"]
        );
        assert_eq!(dns.options, ["ndots:5"]);
    }

    #[test]
    fn cluster_dns_with_extra_nameservers_keeps_the_first_three() {
        let p = pod(json!({"containers": [{"name": "c", "image": "x"}],
            "dnsConfig": {"nameservers": ["1.1.1.1", "8.8.8.8", "9.9.9.9"],
                          "searches": ["corp.example"], "options": [{"name": "ndots", "value": "2"}]}}));
        let mut c = config();
        c.cluster_dns = vec!["169.254.96.16".into()];
        let dns = dns_config(&p, &c).unwrap();
        assert_eq!(dns.servers, ["169.254.96.16", "1.1.1.1", "8.8.8.8"]);
        assert_eq!(
            dns.searches.last().map(String::as_str),
            Some("corp.example")
        );
        assert_eq!(dns.options, ["ndots:2"]);
    }

    #[test]
    fn resolv_conf_parses() {
        let d = parse_resolv_conf(
            "# c\nnameserver 1.1.1.1\nnameserver 8.8.8.8 # x\nsearch a b\noptions ndots:2 edns0\n",
        );
        assert_eq!(d.servers, ["1.1.1.1", "8.8.8.8"]);
        assert_eq!(d.searches, ["a", "b"]);
        assert_eq!(d.options, ["ndots:2", "edns0"]);
    }
}
