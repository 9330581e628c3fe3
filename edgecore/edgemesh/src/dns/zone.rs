//! The cluster domain, answered from a [`Snapshot`] as the Kubernetes DNS specification
//! (<https://github.com/kubernetes/dns/blob/master/docs/specification.md>) says and CoreDNS's
//! kubernetes plugin does, with `pods insecure` (kubeadm's default):
//!
//! | name (below `<domain>`)            | records                                               |
//! |------------------------------------|-------------------------------------------------------|
//! | `<svc>.<ns>.svc`                   | A/AAAA: ClusterIPs; headless: ready endpoints; ExternalName: CNAME; SRV: every port |
//! | `<host>.<svc>.<ns>.svc`            | A/AAAA of a headless endpoint (`host`: its hostname, or its dashed IP) |
//! | `_<port>._<proto>.<svc>.<ns>.svc`  | SRV for a named port (+ A/AAAA of the targets as additional records) |
//! | `<a-b-c-d>.<ns>.pod`               | A (AAAA for a dashed IPv6 address)                    |
//! | the apex                           | SOA                                                   |
//!
//! PTR queries for ClusterIPs and headless endpoint addresses are answered too; other
//! reverse names, and every name outside the domain, are [`Lookup::NotMine`]. (CoreDNS also
//! answers endpoint names and PTRs of non-headless Services; the specification does not.)
//!
//! Answers hold at most [`MAX_RECORDS`] records, in random order (CoreDNS's `loadbalance`),
//! so a Service with 10,000 endpoints costs a bounded amount per query.

use super::name::Name;
use super::wire::{Class, Question, RData, Rcode, Record, RecordType, Soa, Srv, WireError};
use crate::catalog::{DnsEndpoint, ResolvedService, Snapshot};
use crate::model::{Key, Protocol, ServiceType};
use rand::seq::SliceRandom;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";
/// CoreDNS's kubernetes plugin default.
pub const DEFAULT_TTL: u32 = 5;
/// No DNS message holds more: 65535 bytes / 16 bytes per compressed A record.
pub(crate) const MAX_RECORDS: usize = 4096;
/// ExternalName Services naming each other are followed this far.
const MAX_CNAME_CHAIN: usize = 8;

/// The cluster domain's authority.
#[derive(Debug, Clone)]
pub struct Zone {
    apex: Name,
    svc: Name,
    ttl: u32,
    mname: Name,
    rname: Name,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    Answer(ZoneAnswer),
    /// Outside the cluster domain (or an unknown reverse name): for the upstream resolvers.
    NotMine,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ZoneAnswer {
    pub rcode: Rcode,
    pub answers: Vec<Record>,
    pub authority: Vec<Record>,
    pub additional: Vec<Record>,
    /// The answers end in a CNAME to this name outside the zone (an ExternalName Service),
    /// still to be resolved upstream for the asked A/AAAA type.
    pub chase: Option<Name>,
}

/// What a name below the apex is.
enum Node<'s> {
    Missing,
    /// Exists, without records of its own (`svc.<domain>`, `<ns>.svc.<domain>`, …).
    Empty,
    Apex,
    Service(&'s ResolvedService),
    Endpoints(Vec<&'s DnsEndpoint>),
    Port(&'s ResolvedService, String, Protocol),
    Pod(IpAddr),
}

impl Zone {
    /// `cluster_domain` such as `cluster.local` (the root is not a cluster domain).
    pub fn new(cluster_domain: &str, ttl: u32) -> Result<Zone, WireError> {
        let apex = Name::parse(&cluster_domain.to_ascii_lowercase())?;
        if apex.is_root() {
            return Err(WireError::EmptyLabel);
        }
        Ok(Zone {
            svc: apex.prepend(b"svc")?,
            mname: apex.prepend(b"dns")?.prepend(b"ns")?,
            rname: apex.prepend(b"hostmaster")?,
            apex,
            ttl,
        })
    }

    pub fn apex(&self) -> &Name {
        &self.apex
    }

    pub fn lookup(&self, snap: &Snapshot, q: &Question) -> Lookup {
        let class_ok = q.qclass == Class::IN || q.qclass == Class::ANY;
        if q.qtype == RecordType::PTR
            && class_ok
            && let Some(ip) = reverse_ip(&q.name)
        {
            return self.reverse(snap, &q.name, ip);
        }
        let Some(rel) = q.name.strip_suffix(&self.apex) else {
            return Lookup::NotMine;
        };
        if !class_ok {
            return Lookup::Answer(ZoneAnswer {
                rcode: Rcode::REFUSED,
                ..ZoneAnswer::default()
            });
        }
        Lookup::Answer(self.answer(snap, &q.name, &rel, q.qtype, 0))
    }

    fn answer(
        &self,
        snap: &Snapshot,
        qname: &Name,
        rel: &[&[u8]],
        qtype: RecordType,
        depth: usize,
    ) -> ZoneAnswer {
        let mut a = ZoneAnswer::default();
        match self.find(snap, rel) {
            Node::Missing => {
                a.rcode = Rcode::NXDOMAIN;
                a.authority.push(self.soa(snap));
                return a;
            }
            Node::Empty => {}
            Node::Apex => {
                if qtype == RecordType::SOA || qtype == RecordType::ANY {
                    a.answers.push(self.soa(snap));
                }
            }
            Node::Service(s) => {
                if let ServiceType::ExternalName(target) = &s.service.service_type {
                    return self.external(snap, qname, target, qtype, depth);
                }
                if qtype == RecordType::SRV {
                    self.srv(qname, s, None, &mut a);
                } else if s.service.headless {
                    let ips = s.dns_addresses().map(|e| e.ip);
                    self.addresses(qname, qtype, ips, &mut a.answers);
                } else {
                    let ips = s.service.cluster_ips.iter().copied();
                    self.addresses(qname, qtype, ips, &mut a.answers);
                }
            }
            Node::Endpoints(eps) => {
                self.addresses(qname, qtype, eps.iter().map(|e| e.ip), &mut a.answers)
            }
            Node::Port(s, name, protocol) => {
                if qtype == RecordType::SRV || qtype == RecordType::ANY {
                    self.srv(qname, s, Some((&name, protocol)), &mut a);
                }
            }
            Node::Pod(ip) => self.addresses(qname, qtype, [ip].into_iter(), &mut a.answers),
        }
        if a.answers.is_empty() {
            a.authority.push(self.soa(snap));
        }
        a
    }

    fn find<'s>(&self, snap: &'s Snapshot, rel: &[&[u8]]) -> Node<'s> {
        let Some((kind, rest)) = rel.split_last() else {
            return Node::Apex;
        };
        if rel.len() > 5 {
            return Node::Missing;
        }
        let Some(rest) = rest
            .iter()
            .map(|l| text(l))
            .collect::<Option<Vec<String>>>()
        else {
            return Node::Missing;
        };
        if kind.eq_ignore_ascii_case(b"pod") {
            return match rest.as_slice() {
                [] | [_] => Node::Empty,
                [ip, _namespace] => undash(ip).map_or(Node::Missing, Node::Pod),
                _ => Node::Missing,
            };
        }
        if !kind.eq_ignore_ascii_case(b"svc") {
            return Node::Missing;
        }
        match rest.as_slice() {
            [] if snap.services.is_empty() => Node::Missing,
            [] => Node::Empty,
            [ns] if snap.services.keys().any(|k| *k.namespace == **ns) => Node::Empty,
            [_] => Node::Missing,
            [name, ns] => snap
                .service(ns, name)
                .map_or(Node::Missing, |s| Node::Service(s)),
            [first, name, ns] => {
                let Some(s) = snap.service(ns, name) else {
                    return Node::Missing;
                };
                if matches!(s.service.service_type, ServiceType::ExternalName(_)) {
                    return Node::Missing;
                }
                if let Some(proto) = first.strip_prefix('_') {
                    // `_tcp.<svc>…`: an empty non-terminal above the SRV names.
                    let has = s.ports.iter().any(|p| p.port.protocol.lower() == proto);
                    return if has { Node::Empty } else { Node::Missing };
                }
                if !s.service.headless {
                    return Node::Missing;
                }
                let ip = undash(first);
                let eps: Vec<&DnsEndpoint> = s
                    .dns_addresses()
                    .filter(|e| match &e.hostname {
                        Some(h) => h.eq_ignore_ascii_case(first),
                        None => Some(e.ip) == ip,
                    })
                    .collect();
                if eps.is_empty() {
                    Node::Missing
                } else {
                    Node::Endpoints(eps)
                }
            }
            [port, proto, name, ns] => {
                let (Some(port), Some(proto)) = (port.strip_prefix('_'), proto.strip_prefix('_'))
                else {
                    return Node::Missing;
                };
                let Some(s) = snap.service(ns, name) else {
                    return Node::Missing;
                };
                let found = s.ports.iter().find(|p| {
                    !port.is_empty() && *p.port.name == *port && p.port.protocol.lower() == proto
                });
                match found {
                    Some(p) if !matches!(s.service.service_type, ServiceType::ExternalName(_)) => {
                        Node::Port(s, port.to_string(), p.port.protocol)
                    }
                    _ => Node::Missing,
                }
            }
            _ => Node::Missing,
        }
    }

    /// An ExternalName Service: a CNAME, followed inside the zone, or left for the server
    /// to resolve upstream.
    fn external(
        &self,
        snap: &Snapshot,
        qname: &Name,
        target: &str,
        qtype: RecordType,
        depth: usize,
    ) -> ZoneAnswer {
        let mut a = ZoneAnswer::default();
        let target = match Name::parse(target) {
            Ok(t) if !t.is_root() => t,
            _ => {
                a.authority.push(self.soa(snap));
                return a;
            }
        };
        a.answers.push(Record::new(
            qname.clone(),
            self.ttl,
            RData::Cname(target.clone()),
        ));
        if qtype == RecordType::CNAME {
            return a;
        }
        if let Some(rel) = target.strip_suffix(&self.apex) {
            if depth < MAX_CNAME_CHAIN {
                let rest = self.answer(snap, &target, &rel, qtype, depth + 1);
                a.answers.extend(rest.answers);
                a.additional.extend(rest.additional);
                a.authority = rest.authority;
                a.rcode = rest.rcode;
                a.chase = rest.chase;
            }
        } else if qtype == RecordType::A || qtype == RecordType::AAAA {
            a.chase = Some(target);
        }
        a
    }

    /// Address records of the asked family, owned by `qname`, shuffled and bounded.
    fn addresses(
        &self,
        qname: &Name,
        qtype: RecordType,
        ips: impl Iterator<Item = IpAddr>,
        out: &mut Vec<Record>,
    ) {
        let any = qtype == RecordType::ANY;
        let (v4, v6) = (
            any || qtype == RecordType::A,
            any || qtype == RecordType::AAAA,
        );
        let ips: Vec<IpAddr> = ips
            .filter(|ip| if ip.is_ipv4() { v4 } else { v6 })
            .collect();
        for ip in sample(ips, MAX_RECORDS) {
            out.push(self.address_record(qname.clone(), ip));
        }
    }

    fn address_record(&self, owner: Name, ip: IpAddr) -> Record {
        let data = match ip {
            IpAddr::V4(v4) => RData::A(v4),
            IpAddr::V6(v6) => RData::Aaaa(v6),
        };
        Record::new(owner, self.ttl, data)
    }

    /// SRV records of the Service's ports (only `only` when given), the targets' addresses
    /// as additional records.
    fn srv(
        &self,
        qname: &Name,
        s: &ResolvedService,
        only: Option<(&str, Protocol)>,
        a: &mut ZoneAnswer,
    ) {
        let Ok(svc_name) = self.service_name(&s.service.key) else {
            return;
        };
        let ports: Vec<_> = s
            .ports
            .iter()
            .filter(|p| only.is_none_or(|(n, pr)| *p.port.name == *n && p.port.protocol == pr))
            .collect();
        let srv = |weight: u16, port: u16, target: Name| {
            let data = RData::Srv(Srv {
                priority: 0,
                weight,
                port,
                target,
            });
            Record::new(qname.clone(), self.ttl, data)
        };
        if !s.service.headless {
            let mut numbers: Vec<u16> = ports.iter().map(|p| p.port.port).collect();
            numbers.sort_unstable();
            numbers.dedup();
            let w = weight(numbers.len());
            for n in numbers {
                a.answers.push(srv(w, n, svc_name.clone()));
            }
            if !a.answers.is_empty() {
                for ip in &s.service.cluster_ips {
                    a.additional
                        .push(self.address_record(svc_name.clone(), *ip));
                }
            }
            return;
        }
        let endpoints = sample(s.dns_addresses().collect(), MAX_RECORDS);
        let targets: Vec<(Name, IpAddr)> = endpoints
            .iter()
            .filter_map(|e| Some((svc_name.prepend(endpoint_label(e).as_bytes()).ok()?, e.ip)))
            .collect();
        let w = weight(ports.len() * targets.len());
        for p in &ports {
            let backend_ports: HashMap<IpAddr, u16> =
                p.backends.iter().map(|b| (b.ip, b.port)).collect();
            for (target, ip) in &targets {
                if a.answers.len() >= MAX_RECORDS {
                    break;
                }
                let port = backend_ports.get(ip).copied().unwrap_or(p.port.port);
                a.answers.push(srv(w, port, target.clone()));
            }
        }
        if !a.answers.is_empty() {
            for (target, ip) in targets {
                a.additional.push(self.address_record(target, ip));
            }
        }
    }

    fn reverse(&self, snap: &Snapshot, qname: &Name, ip: IpAddr) -> Lookup {
        let mut targets = Vec::new();
        if let Some(key) = snap.by_cluster_ip.get(&ip)
            && let Ok(name) = self.service_name(key)
        {
            targets.push(name);
        }
        // Linear in headless endpoints: PTR queries are rare next to forward ones.
        for s in snap.services.values().filter(|s| s.service.headless) {
            for e in s.dns_addresses().filter(|e| e.ip == ip) {
                if let Ok(svc) = self.service_name(&s.service.key)
                    && let Ok(name) = svc.prepend(endpoint_label(e).as_bytes())
                {
                    targets.push(name);
                }
            }
            if targets.len() >= MAX_RECORDS {
                break;
            }
        }
        if targets.is_empty() {
            return Lookup::NotMine;
        }
        let answers = targets
            .into_iter()
            .map(|t| Record::new(qname.clone(), self.ttl, RData::Ptr(t)))
            .collect();
        Lookup::Answer(ZoneAnswer {
            answers,
            ..ZoneAnswer::default()
        })
    }

    /// `<svc>.<ns>.svc.<domain>`.
    fn service_name(&self, key: &Key) -> Result<Name, WireError> {
        self.svc
            .prepend(key.namespace.as_bytes())?
            .prepend(key.name.as_bytes())
    }

    /// CoreDNS's SOA for the zone; the serial follows the snapshot.
    fn soa(&self, snap: &Snapshot) -> Record {
        let data = RData::Soa(Soa {
            mname: self.mname.clone(),
            rname: self.rname.clone(),
            serial: snap.generation as u32,
            refresh: 7200,
            retry: 1800,
            expire: 86400,
            minimum: self.ttl,
        });
        Record::new(self.apex.clone(), self.ttl, data)
    }
}

/// At most `cap` of the items, in random order.
fn sample<T: Copy>(mut items: Vec<T>, cap: usize) -> Vec<T> {
    let mut rng = rand::rng();
    if items.len() > cap {
        let (chosen, _) = items.partial_shuffle(&mut rng, cap);
        chosen.to_vec()
    } else {
        items.shuffle(&mut rng);
        items
    }
}

/// CoreDNS's SRV weight: 100 shared evenly, rounded.
fn weight(records: usize) -> u16 {
    match records {
        0 => 0,
        n => u16::try_from((200 / n).div_ceil(2)).unwrap_or(u16::MAX),
    }
}

/// A label as lower-case text (labels that are not UTF-8 name nothing in the cluster).
fn text(label: &[u8]) -> Option<String> {
    std::str::from_utf8(label).ok().map(str::to_ascii_lowercase)
}

/// The name of an endpoint below its Service: its hostname, or its dashed IP.
fn endpoint_label(e: &DnsEndpoint) -> String {
    match &e.hostname {
        Some(h) => h.to_ascii_lowercase(),
        None => dashed(e.ip),
    }
}

/// `10-0-0-1`, `fd00--1` (CoreDNS's spelling of an address as a label).
pub(crate) fn dashed(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

/// The address a dashed label spells, if any.
pub(crate) fn undash(label: &str) -> Option<IpAddr> {
    if label.contains(['.', ':']) {
        return None;
    }
    if let Ok(v4) = label.replace('-', ".").parse::<Ipv4Addr>() {
        return Some(IpAddr::V4(v4));
    }
    label
        .replace('-', ":")
        .parse::<Ipv6Addr>()
        .ok()
        .map(IpAddr::V6)
}

/// The address of an `in-addr.arpa` / `ip6.arpa` name (whole addresses only).
pub(crate) fn reverse_ip(name: &Name) -> Option<IpAddr> {
    let labels: Vec<&[u8]> = name.labels().collect();
    let (arpa, rest) = labels.split_last()?;
    let (kind, digits) = rest.split_last()?;
    if !arpa.eq_ignore_ascii_case(b"arpa") {
        return None;
    }
    if kind.eq_ignore_ascii_case(b"in-addr") && digits.len() == 4 {
        let mut octets = [0u8; 4];
        for (o, label) in octets.iter_mut().rev().zip(digits) {
            let s = std::str::from_utf8(label).ok()?;
            if (s.len() > 1 && s.starts_with('0')) || !s.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            *o = s.parse().ok()?;
        }
        return Some(IpAddr::V4(Ipv4Addr::from(octets)));
    }
    if kind.eq_ignore_ascii_case(b"ip6") && digits.len() == 32 {
        let mut value: u128 = 0;
        for label in digits.iter().rev() {
            let [nibble] = label else { return None };
            let d = char::from(*nibble).to_digit(16)?;
            value = (value << 4) | u128::from(d);
        }
        return Some(IpAddr::V6(Ipv6Addr::from(value)));
    }
    None
}
