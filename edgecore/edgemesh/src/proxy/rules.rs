//! The ClusterIP rules, planned from a [`Snapshot`]: the `iptables-restore` input for the `nat`
//! and `filter` tables, in kube-proxy's shape (a chain per Service port choosing among a chain
//! per endpoint with `statistic` probabilities, `recent` for ClientIP affinity, masquerade
//! for hairpin traffic, REJECT where a Service port has no endpoint). Pure: the text depends
//! only on the snapshot and the settings, so an unchanged view is not applied again.
//!
//! Only numbers, addresses and our own hashed chain names reach the text: no name a user or
//! a peer chose, so nothing in an object can change what iptables is told.

use crate::catalog::{Backend, ResolvedPort, ResolvedService, Snapshot};
use crate::model::{Protocol, ServiceType};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};

/// The mark that asks POSTROUTING to masquerade (kube-proxy's bit).
pub const MASQ_MARK: &str = "0x4000/0x4000";

/// How rules are planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSettings {
    /// Chain name prefix (`KE` → `KE-SERVICES`, `KE-SVC-…`); distinct per edgecore on one
    /// machine.
    pub prefix: String,
    /// Where remote TCP endpoints are reached through the relay; `None`: not relayed.
    pub relay: Option<SocketAddrV4>,
    /// Remote endpoint addresses dialled directly (routable from this node).
    pub direct: Vec<Cidr>,
}

/// An IPv4 network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub len: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (a, l) = s.split_once('/').unwrap_or((s, "32"));
        let addr: Ipv4Addr = a
            .parse()
            .map_err(|_| format!("{s:?} is not an IPv4 network (e.g. 192.168.0.0/16)"))?;
        let len: u8 = l
            .parse()
            .ok()
            .filter(|l| *l <= 32)
            .ok_or_else(|| format!("{s:?}: the prefix length must be 0–32"))?;
        Ok(Cidr { addr, len })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let IpAddr::V4(ip) = ip else { return false };
        let mask = if self.len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.len))
        };
        u32::from(ip) & mask == u32::from(self.addr) & mask
    }
}

/// Where a backend's traffic goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// DNAT to the backend itself.
    Direct,
    /// DNAT to the relay, which reaches the backend through the cloud.
    Relay,
    /// Not reachable from this node (e.g. a UDP endpoint on another edge node).
    Unreachable,
}

/// How this node reaches `b` of a port of `protocol`.
pub fn route(b: &Backend, protocol: Protocol, s: &RuleSettings) -> Route {
    if b.local || b.node.is_none() || s.direct.iter().any(|c| c.contains(b.ip)) {
        Route::Direct
    } else if protocol == Protocol::Tcp && s.relay.is_some() {
        Route::Relay
    } else {
        Route::Unreachable
    }
}

/// The planned text and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// `iptables-restore --noflush` input.
    pub text: String,
    /// Our chains in it, per table (`nat`, `filter`), to delete stale ones.
    pub nat_chains: BTreeSet<String>,
    pub filter_chains: BTreeSet<String>,
    pub rules: usize,
}

/// Top-level chain names for `prefix`.
pub struct Chains {
    pub services: String,
    pub nodeports: String,
    pub postrouting: String,
    pub mark_masq: String,
}

impl Chains {
    pub fn new(prefix: &str) -> Chains {
        Chains {
            services: format!("{prefix}-SERVICES"),
            nodeports: format!("{prefix}-NODEPORTS"),
            postrouting: format!("{prefix}-POSTROUTING"),
            mark_masq: format!("{prefix}-MARK-MASQ"),
        }
    }
}

/// kube-proxy's chain name hash: SHA-256, base32, 16 characters.
fn hashed(prefix: &str, kind: &str, parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    let digest = h.finalize();
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::with_capacity(16);
    let mut bits: u32 = 0;
    let mut nbits = 0;
    for byte in digest.iter() {
        bits = (bits << 8) | u32::from(*byte);
        nbits += 8;
        while nbits >= 5 && out.len() < 16 {
            nbits -= 5;
            out.push(ALPHABET[((bits >> nbits) & 31) as usize] as char);
        }
        if out.len() == 16 {
            break;
        }
    }
    format!("{prefix}-{kind}-{out}")
}

fn port_id(svc: &ResolvedService, p: &ResolvedPort) -> [String; 4] {
    [
        svc.service.key.namespace.to_string(),
        svc.service.key.name.to_string(),
        p.port.name.to_string(),
        p.port.protocol.lower().to_string(),
    ]
}

/// One weighted target of a Service port chain.
struct Target {
    chain: String,
    weight: usize,
    /// DNAT destination.
    to: SocketAddrV4,
    /// The backend's own address (hairpin traffic from it is masqueraded).
    hairpin: Option<Ipv4Addr>,
}

/// Plans the rules for every IPv4 Service port in `snap`.
pub fn plan(snap: &Snapshot, s: &RuleSettings) -> Plan {
    let c = Chains::new(&s.prefix);
    let mut nat = String::new();
    let mut nat_rules = String::new();
    let mut filter_rules = String::new();
    let mut plan = Plan::default();
    for name in [&c.services, &c.nodeports, &c.postrouting, &c.mark_masq] {
        plan.nat_chains.insert(name.clone());
    }
    plan.filter_chains.insert(c.services.clone());
    let mut rules = 0usize;
    let mut add = |buf: &mut String, line: std::fmt::Arguments| {
        let _ = buf.write_fmt(line);
        buf.push('\n');
        rules += 1;
    };
    add(
        &mut nat_rules,
        format_args!(
            "-A {} -m mark ! --mark {MASQ_MARK} -j RETURN",
            c.postrouting
        ),
    );
    add(
        &mut nat_rules,
        format_args!("-A {} -j MARK --xor-mark 0x4000", c.postrouting),
    );
    add(
        &mut nat_rules,
        format_args!("-A {} -j MASQUERADE", c.postrouting),
    );
    add(
        &mut nat_rules,
        format_args!("-A {} -j MARK --or-mark 0x4000", c.mark_masq),
    );
    // Stable order: by Service, then port.
    let mut services: Vec<&std::sync::Arc<ResolvedService>> = snap.services.values().collect();
    services.sort_by(|a, b| a.service.key.cmp(&b.service.key));
    let mut nodeport_rules = String::new();
    for svc in services {
        let service = &svc.service;
        if matches!(service.service_type, ServiceType::ExternalName(_)) {
            continue;
        }
        let cluster_ips: Vec<Ipv4Addr> = service
            .cluster_ips
            .iter()
            .filter_map(|ip| match ip {
                IpAddr::V4(v4) => Some(*v4),
                IpAddr::V6(_) => None,
            })
            .collect();
        let node_ports = matches!(
            service.service_type,
            ServiceType::NodePort | ServiceType::LoadBalancer
        );
        if cluster_ips.is_empty() {
            continue;
        }
        for p in &svc.ports {
            if p.port.protocol == Protocol::Sctp {
                continue;
            }
            let proto = p.port.protocol.lower();
            let id = port_id(svc, p);
            let id_refs: Vec<&str> = id.iter().map(String::as_str).collect();
            let svc_chain = hashed(&s.prefix, "SVC", &id_refs);
            let cluster_targets = targets(p, s, &id_refs, service.internal_local);
            if cluster_targets.is_empty() {
                for ip in &cluster_ips {
                    add(
                        &mut filter_rules,
                        format_args!(
                            "-A {} -d {ip}/32 -p {proto} -m {proto} --dport {} -j REJECT --reject-with icmp-port-unreachable",
                            c.services, p.port.port
                        ),
                    );
                }
            } else {
                plan.nat_chains.insert(svc_chain.clone());
                for ip in &cluster_ips {
                    add(
                        &mut nat_rules,
                        format_args!(
                            "-A {} -d {ip}/32 -p {proto} -m {proto} --dport {} -j {svc_chain}",
                            c.services, p.port.port
                        ),
                    );
                }
                write_targets(
                    &mut nat_rules,
                    &mut add,
                    &svc_chain,
                    &cluster_targets,
                    proto,
                    service.affinity_seconds,
                    &c,
                    &mut plan.nat_chains,
                );
            }
            if node_ports && let Some(np) = p.port.node_port {
                let own_chain = service.external_local != service.internal_local;
                let ext_targets = if own_chain {
                    targets(p, s, &id_refs, service.external_local)
                } else {
                    cluster_targets
                };
                let ext_chain = if own_chain {
                    let name = hashed(&s.prefix, "EXT", &id_refs);
                    write_targets(
                        &mut nat_rules,
                        &mut add,
                        &name,
                        &ext_targets,
                        proto,
                        service.affinity_seconds,
                        &c,
                        &mut plan.nat_chains,
                    );
                    plan.nat_chains.insert(name.clone());
                    name
                } else {
                    svc_chain.clone()
                };
                add(
                    &mut nodeport_rules,
                    format_args!(
                        "-A {} -p {proto} -m {proto} --dport {np} -j {ext_chain}",
                        c.nodeports
                    ),
                );
            }
        }
    }
    if !nodeport_rules.is_empty() {
        nat_rules.push_str(&nodeport_rules);
        add(
            &mut nat_rules,
            format_args!(
                "-A {} -m addrtype --dst-type LOCAL -j {}",
                c.services, c.nodeports
            ),
        );
    }
    nat.push_str("*nat\n");
    for chain in &plan.nat_chains {
        let _ = writeln!(nat, ":{chain} - [0:0]");
    }
    nat.push_str(&nat_rules);
    nat.push_str("COMMIT\n*filter\n");
    for chain in &plan.filter_chains {
        let _ = writeln!(nat, ":{chain} - [0:0]");
    }
    nat.push_str(&filter_rules);
    nat.push_str("COMMIT\n");
    plan.text = nat;
    plan.rules = rules;
    plan
}

fn targets(p: &ResolvedPort, s: &RuleSettings, id: &[&str], local_only: bool) -> Vec<Target> {
    let mut out = Vec::new();
    let mut relayed = 0usize;
    for b in p.usable() {
        if local_only && !b.local {
            continue;
        }
        let IpAddr::V4(ip) = b.ip else { continue };
        match route(b, p.port.protocol, s) {
            Route::Direct => {
                let ep = format!("{ip}:{}", b.port);
                let mut parts = id.to_vec();
                parts.push(&ep);
                out.push(Target {
                    chain: hashed(&s.prefix, "SEP", &parts),
                    weight: 1,
                    to: SocketAddrV4::new(ip, b.port),
                    hairpin: Some(ip),
                });
            }
            Route::Relay => relayed += 1,
            Route::Unreachable => {}
        }
    }
    if relayed > 0
        && let Some(relay) = s.relay
    {
        let mut parts = id.to_vec();
        parts.push("relay");
        out.push(Target {
            chain: hashed(&s.prefix, "SEP", &parts),
            weight: relayed,
            to: relay,
            hairpin: None,
        });
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn write_targets(
    out: &mut String,
    add: &mut impl FnMut(&mut String, std::fmt::Arguments),
    chain: &str,
    targets: &[Target],
    proto: &str,
    affinity: Option<u32>,
    c: &Chains,
    chains: &mut BTreeSet<String>,
) {
    if let Some(secs) = affinity {
        for t in targets {
            add(
                out,
                format_args!(
                    "-A {chain} -m recent --name {} --mask 255.255.255.255 --rsource --rcheck --seconds {secs} --reap -j {}",
                    t.chain, t.chain
                ),
            );
        }
    }
    let total: usize = targets.iter().map(|t| t.weight).sum();
    let mut remaining = total;
    for (i, t) in targets.iter().enumerate() {
        if i + 1 == targets.len() {
            add(out, format_args!("-A {chain} -j {}", t.chain));
        } else {
            let p = t.weight as f64 / remaining as f64;
            add(
                out,
                format_args!(
                    "-A {chain} -m statistic --mode random --probability {p:.10} -j {}",
                    t.chain
                ),
            );
        }
        remaining -= t.weight;
    }
    for t in targets {
        if !chains.insert(t.chain.clone()) {
            // The same endpoint chain serves the ClusterIP and a NodePort: written once.
            continue;
        }
        if let Some(ip) = t.hairpin {
            add(
                out,
                format_args!("-A {} -s {ip}/32 -j {}", t.chain, c.mark_masq),
            );
        }
        let recent = match affinity {
            Some(_) => format!(
                " -m recent --name {} --mask 255.255.255.255 --rsource --set",
                t.chain
            ),
            None => String::new(),
        };
        add(
            out,
            format_args!(
                "-A {} -p {proto} -m {proto}{recent} -j DNAT --to-destination {}",
                t.chain, t.to
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;
    use crate::model::{EndpointSlice, LocalPod, Service};
    use serde_json::json;

    fn settings() -> RuleSettings {
        RuleSettings {
            prefix: "KE".into(),
            relay: Some("169.254.96.16:40001".parse().unwrap()),
            direct: vec![Cidr::parse("192.168.0.0/16").unwrap()],
        }
    }

    fn snapshot(extra_svc: serde_json::Value) -> Snapshot {
        let mut c = Catalog::new("edge-1");
        c.set_local_pods_known();
        c.apply_service(
            Service::from_json(
                &json!({"metadata": {"name": "web", "namespace": "shop"},
                "spec": {"type": "NodePort", "clusterIP": "10.96.0.20", "selector": {"app": "web"},
                  "ports": [{"name": "http", "port": 80, "targetPort": "http", "nodePort": 30080},
                            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}})
                .to_string(),
            )
            .unwrap(),
        );
        c.apply_service(Service::from_json(&extra_svc.to_string()).unwrap());
        c.apply_slice(
            EndpointSlice::from_json(
                &json!({"metadata": {"name": "web-x", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080}, {"name": "dns", "port": 5353, "protocol": "UDP"}],
                "endpoints": [{"addresses": ["10.77.0.9"], "nodeName": "edge-2"},
                              {"addresses": ["192.168.5.5"], "nodeName": "edge-3"}]})
                .to_string(),
            )
            .unwrap(),
        );
        c.apply_pod(
            LocalPod::from_json(
                &json!({"metadata": {"name": "web-1", "namespace": "shop", "uid": "u1",
                    "labels": {"app": "web"}},
                "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8080}]}]},
                "status": {"podIP": "10.88.0.5", "conditions": [{"type": "Ready", "status": "True"}]}})
                .to_string(),
                None,
            )
            .unwrap(),
        );
        c.snapshot().unwrap()
    }

    fn empty_svc() -> serde_json::Value {
        json!({"metadata": {"name": "empty", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.30", "sessionAffinity": "ClientIP",
                     "ports": [{"port": 81}]}})
    }

    #[test]
    fn local_direct_and_relayed_endpoints_share_the_port_evenly() {
        let plan = plan(&snapshot(empty_svc()), &settings());
        let t = &plan.text;
        assert!(t.starts_with("*nat\n"), "{t}");
        assert!(t.contains(":KE-SERVICES - [0:0]"));
        assert!(t.contains("-A KE-SERVICES -d 10.96.0.20/32 -p tcp -m tcp --dport 80 -j KE-SVC-"));
        // TCP: the local pod, the routable 192.168.5.5 and the relay for 10.77.0.9.
        assert!(t.contains("DNAT --to-destination 10.88.0.5:8080"), "{t}");
        assert!(t.contains("DNAT --to-destination 192.168.5.5:8080"));
        assert!(t.contains("DNAT --to-destination 169.254.96.16:40001"));
        assert!(t.contains("--probability 0.3333333333"));
        assert!(t.contains("--probability 0.5000000000"));
        // UDP: the relay carries TCP only; 10.77.0.9 is unreachable, the others are used.
        assert!(t.contains("DNAT --to-destination 10.88.0.5:5353"));
        assert!(!t.contains("10.77.0.9"));
        // Hairpin traffic of a backend to itself is masqueraded.
        assert!(t.contains("-s 10.88.0.5/32 -j KE-MARK-MASQ"));
        // NodePort through the same chain.
        assert!(t.contains("-A KE-NODEPORTS -p tcp -m tcp --dport 30080 -j KE-SVC-"));
        assert!(t.contains("-A KE-SERVICES -m addrtype --dst-type LOCAL -j KE-NODEPORTS"));
        // A Service port without endpoints is rejected, not blackholed.
        assert!(t.contains(
            "-A KE-SERVICES -d 10.96.0.30/32 -p tcp -m tcp --dport 81 -j REJECT --reject-with icmp-port-unreachable"
        ));
        assert!(t.ends_with("COMMIT\n"));
    }

    #[test]
    fn plans_are_deterministic_and_change_only_with_the_view() {
        let a = plan(&snapshot(empty_svc()), &settings());
        let b = plan(&snapshot(empty_svc()), &settings());
        assert_eq!(a, b);
        let mut other = settings();
        other.relay = None;
        let c = plan(&snapshot(empty_svc()), &other);
        assert_ne!(a.text, c.text);
        assert!(!c.text.contains("40001"));
    }

    #[test]
    fn client_ip_affinity_uses_recent_per_endpoint() {
        let snap = snapshot(json!({"metadata": {"name": "sticky", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.31", "selector": {"app": "web"},
                     "sessionAffinity": "ClientIP",
                     "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                     "ports": [{"port": 8080}]}}));
        let t = plan(&snap, &settings()).text;
        assert!(t.contains("--rcheck --seconds 60 --reap -j KE-SEP-"), "{t}");
        assert!(t.contains("--rsource --set -j DNAT --to-destination 10.88.0.5:8080"));
    }

    #[test]
    fn internal_traffic_policy_local_keeps_only_local_endpoints() {
        let snap = snapshot(json!({"metadata": {"name": "loc", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.32", "selector": {"app": "web"},
                     "internalTrafficPolicy": "Local", "ports": [{"port": 9000, "targetPort": 8080}]}}));
        let p = plan(&snap, &settings());
        let svc_lines: Vec<&str> = p
            .text
            .lines()
            .filter(|l| l.contains("-d 10.96.0.32/32"))
            .collect();
        assert_eq!(svc_lines.len(), 1, "{}", p.text);
    }

    #[test]
    fn external_traffic_policy_local_node_ports_use_local_endpoints_only() {
        let snap = snapshot(json!({"metadata": {"name": "np", "namespace": "shop"},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.33", "selector": {"app": "web"},
                     "externalTrafficPolicy": "Local",
                     "ports": [{"port": 9000, "targetPort": 8080, "nodePort": 30090}]}}));
        let t = plan(&snap, &settings()).text;
        let ext = t
            .lines()
            .find(|l| l.starts_with("-A KE-NODEPORTS") && l.contains("--dport 30090"))
            .unwrap();
        let chain = ext.rsplit(' ').next().unwrap();
        assert!(chain.starts_with("KE-EXT-"), "{ext}");
        let targets: Vec<&str> = t
            .lines()
            .filter(|l| l.starts_with(&format!("-A {chain} ")))
            .collect();
        assert_eq!(targets.len(), 1, "only the local pod: {targets:?}");
    }

    #[test]
    fn chain_names_are_hashed_and_short() {
        let n = hashed(
            "KE",
            "SVC",
            &["ns", "a-very-long-service-name-indeed", "http", "tcp"],
        );
        assert!(n.starts_with("KE-SVC-") && n.len() == 23, "{n}");
        assert!(
            n.len() <= 28,
            "iptables chain names are at most 28 characters"
        );
        assert_ne!(
            n,
            hashed(
                "KE",
                "SVC",
                &["ns", "a-very-long-service-name-indeed", "http", "udp"]
            )
        );
    }

    #[test]
    fn cidrs_parse_and_match() {
        let c = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(c.contains("10.1.200.3".parse().unwrap()));
        assert!(!c.contains("10.2.0.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        assert!(
            Cidr::parse("0.0.0.0/0")
                .unwrap()
                .contains("8.8.8.8".parse().unwrap())
        );
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("x").is_err());
    }
}
