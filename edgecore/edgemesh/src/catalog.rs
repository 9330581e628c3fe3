//! The catalog: Services, their EndpointSlices and this node's pods, resolved into what the
//! DNS server, the ClusterIP rules and the relay need — for each Service port, the backends
//! traffic may go to.
//!
//! Endpoints of pods on this node come from edged (what it runs now, also while the cloud is
//! unreachable: a local pod restarted offline with a new IP stays reachable), not from the
//! EndpointSlices, whose entries for this node may be stale or missing offline. Endpoints on
//! other nodes, and every endpoint of a Service without a selector, come from the
//! EndpointSlices. Changes mark Services dirty; [`Catalog::snapshot`] resolves only those and
//! hands out an immutable [`Snapshot`] readers share.

use crate::model::{
    AddressType, EndpointSlice, Key, LocalPod, Protocol, Service, ServicePort, ServiceType,
    TargetPort,
};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

/// A place traffic for a Service port may go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub ip: IpAddr,
    pub port: u16,
    /// The node it runs on, when known.
    pub node: Option<Arc<str>>,
    /// On this node.
    pub local: bool,
    pub ready: bool,
    /// Serving while terminating (used only when no backend is ready, as kube-proxy does).
    pub serving: bool,
}

/// An address of a Service's endpoints, for DNS (headless records, `<host>.<svc>` names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsEndpoint {
    pub ip: IpAddr,
    pub hostname: Option<Arc<str>>,
    pub ready: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedPort {
    pub port: ServicePort,
    pub backends: Vec<Backend>,
}

impl ResolvedPort {
    /// The backends traffic goes to: the ready ones, or when none is ready those still
    /// serving while they terminate (kube-proxy's rule).
    pub fn usable(&self) -> impl Iterator<Item = &Backend> {
        let any_ready = self.backends.iter().any(|b| b.ready);
        self.backends
            .iter()
            .filter(move |b| if any_ready { b.ready } else { b.serving })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedService {
    pub service: Arc<Service>,
    pub ports: Vec<ResolvedPort>,
    /// Headless Services only: the addresses their DNS names resolve to.
    pub endpoints: Vec<DnsEndpoint>,
}

impl ResolvedService {
    /// The addresses a headless Service's name resolves to (ready ones; every one with
    /// `publishNotReadyAddresses`).
    pub fn dns_addresses(&self) -> impl Iterator<Item = &DnsEndpoint> {
        let all = self.service.publish_not_ready;
        self.endpoints.iter().filter(move |e| all || e.ready)
    }
}

/// An immutable view of every Service, shared by the DNS server, the rules and the relay.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub generation: u64,
    pub services: HashMap<Key, Arc<ResolvedService>>,
    /// ClusterIP → Service.
    pub by_cluster_ip: HashMap<IpAddr, Key>,
}

impl Snapshot {
    pub fn service(&self, namespace: &str, name: &str) -> Option<&Arc<ResolvedService>> {
        // Keys are compared by content; building one costs two small allocations.
        self.services.get(&Key::new(namespace, name))
    }

    /// The Service port a connection to `ip:port/protocol` is for.
    pub fn by_destination(
        &self,
        ip: IpAddr,
        port: u16,
        protocol: Protocol,
    ) -> Option<(&Arc<ResolvedService>, &ResolvedPort)> {
        let svc = self.services.get(self.by_cluster_ip.get(&ip)?)?;
        let p = svc
            .ports
            .iter()
            .find(|p| p.port.port == port && p.port.protocol == protocol)?;
        Some((svc, p))
    }

    /// Number of backends over all Services (for metrics).
    pub fn backend_count(&self) -> usize {
        self.services
            .values()
            .flat_map(|s| s.ports.iter())
            .map(|p| p.backends.len())
            .sum()
    }
}

/// The mutable state behind the snapshots; owned by one task.
pub struct Catalog {
    node: Arc<str>,
    /// True once edged reports this node's pods: their endpoints then come from it.
    local_pods_known: bool,
    services: HashMap<Key, Arc<Service>>,
    slices: HashMap<Key, Arc<EndpointSlice>>,
    /// Service → its slices.
    slices_of: HashMap<Key, BTreeSet<Key>>,
    pods: HashMap<Arc<str>, Arc<LocalPod>>,
    resolved: HashMap<Key, Arc<ResolvedService>>,
    by_cluster_ip: HashMap<IpAddr, Key>,
    dirty: HashSet<Key>,
    generation: u64,
    /// Node names, held once however many endpoints name them.
    node_names: HashSet<Arc<str>>,
}

impl Catalog {
    pub fn new(node: &str) -> Catalog {
        Catalog {
            node: node.into(),
            local_pods_known: false,
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_of: HashMap::new(),
            pods: HashMap::new(),
            resolved: HashMap::new(),
            by_cluster_ip: HashMap::new(),
            dirty: HashSet::new(),
            generation: 0,
            node_names: HashSet::new(),
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    pub fn slice_count(&self) -> usize {
        self.slices.len()
    }

    pub fn has_changes(&self) -> bool {
        !self.dirty.is_empty()
    }

    pub fn apply_service(&mut self, s: Service) {
        if self.services.get(&s.key).is_some_and(|old| **old == s) {
            return;
        }
        self.dirty.insert(s.key.clone());
        self.services.insert(s.key.clone(), Arc::new(s));
    }

    pub fn delete_service(&mut self, key: &Key) {
        if self.services.remove(key).is_some() {
            self.dirty.insert(key.clone());
        }
    }

    fn service_of_slice(s: &EndpointSlice) -> Option<Key> {
        s.service
            .as_ref()
            .map(|svc| Key::new(&s.key.namespace, svc))
    }

    pub fn apply_slice(&mut self, mut s: EndpointSlice) {
        if self.slices.get(&s.key).is_some_and(|old| **old == s) {
            return;
        }
        for e in s.endpoints.iter_mut() {
            if let Some(n) = &e.node_name {
                match self.node_names.get(n) {
                    Some(held) => e.node_name = Some(held.clone()),
                    None => {
                        self.node_names.insert(n.clone());
                    }
                }
            }
        }
        self.delete_slice(&s.key.clone());
        if let Some(svc) = Self::service_of_slice(&s) {
            self.slices_of
                .entry(svc.clone())
                .or_default()
                .insert(s.key.clone());
            self.dirty.insert(svc);
        }
        self.slices.insert(s.key.clone(), Arc::new(s));
    }

    pub fn delete_slice(&mut self, key: &Key) {
        let Some(old) = self.slices.remove(key) else {
            return;
        };
        if let Some(svc) = Self::service_of_slice(&old) {
            if let Some(set) = self.slices_of.get_mut(&svc) {
                set.remove(key);
                if set.is_empty() {
                    self.slices_of.remove(&svc);
                }
            }
            self.dirty.insert(svc);
        }
    }

    /// Replaces every Service and EndpointSlice (after a relist): what is not listed goes.
    pub fn replace_all(&mut self, services: Vec<Service>, slices: Vec<EndpointSlice>) {
        self.replace_services(services);
        self.replace_slices(slices);
    }

    /// Replaces every Service: those not listed go.
    pub fn replace_services(&mut self, services: Vec<Service>) {
        let keep: HashSet<Key> = services.iter().map(|s| s.key.clone()).collect();
        let gone: Vec<Key> = self
            .services
            .keys()
            .filter(|k| !keep.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            self.delete_service(&k);
        }
        for s in services {
            self.apply_service(s);
        }
    }

    /// Replaces every EndpointSlice: those not listed go.
    pub fn replace_slices(&mut self, slices: Vec<EndpointSlice>) {
        let keep: HashSet<Key> = slices.iter().map(|s| s.key.clone()).collect();
        let gone: Vec<Key> = self
            .slices
            .keys()
            .filter(|k| !keep.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            self.delete_slice(&k);
        }
        for s in slices {
            self.apply_slice(s);
        }
    }

    /// Marks the Services in the pod's namespace whose selector matches it.
    fn touch_selecting(&mut self, pod: &LocalPod) {
        for s in self.services.values() {
            if s.key.namespace == pod.key.namespace
                && s.selector.as_ref().is_some_and(|sel| pod.selected_by(sel))
            {
                self.dirty.insert(s.key.clone());
            }
        }
    }

    /// Edged reports its pods from now on (their endpoints no longer come from slices).
    pub fn set_local_pods_known(&mut self) {
        if !self.local_pods_known {
            self.local_pods_known = true;
            self.dirty.extend(self.services.keys().cloned());
        }
    }

    pub fn apply_pod(&mut self, p: LocalPod) {
        if self.pods.get(&p.uid).is_some_and(|old| **old == p) {
            return;
        }
        if let Some(old) = self.pods.remove(&p.uid) {
            self.touch_selecting(&old);
        }
        self.touch_selecting(&p);
        self.pods.insert(p.uid.clone(), Arc::new(p));
    }

    pub fn remove_pod(&mut self, uid: &str) {
        if let Some(old) = self.pods.remove(uid) {
            self.touch_selecting(&old);
        }
    }

    /// Resolves the Services that changed and returns the new view (`None` if nothing did).
    pub fn snapshot(&mut self) -> Option<Snapshot> {
        if self.dirty.is_empty() && self.generation > 0 {
            return None;
        }
        for key in std::mem::take(&mut self.dirty) {
            if let Some(old) = self.resolved.remove(&key) {
                for ip in &old.service.cluster_ips {
                    if self.by_cluster_ip.get(ip) == Some(&key) {
                        self.by_cluster_ip.remove(ip);
                    }
                }
            }
            let Some(svc) = self.services.get(&key).cloned() else {
                continue;
            };
            for ip in &svc.cluster_ips {
                self.by_cluster_ip.insert(*ip, key.clone());
            }
            let r = self.resolve(svc);
            self.resolved.insert(key, Arc::new(r));
        }
        self.generation += 1;
        Some(Snapshot {
            generation: self.generation,
            services: self.resolved.clone(),
            by_cluster_ip: self.by_cluster_ip.clone(),
        })
    }

    fn resolve(&self, svc: Arc<Service>) -> ResolvedService {
        if matches!(svc.service_type, ServiceType::ExternalName(_)) {
            return ResolvedService {
                ports: svc
                    .ports
                    .iter()
                    .map(|p| ResolvedPort {
                        port: p.clone(),
                        backends: Vec::new(),
                    })
                    .collect(),
                endpoints: Vec::new(),
                service: svc,
            };
        }
        let local_from_pods = self.local_pods_known && svc.selector.is_some();
        let mut ports: Vec<ResolvedPort> = svc
            .ports
            .iter()
            .map(|p| ResolvedPort {
                port: p.clone(),
                backends: Vec::new(),
            })
            .collect();
        let mut endpoints: Vec<DnsEndpoint> = Vec::new();
        let mut add_dns = |ip: IpAddr, hostname: Option<Arc<str>>, ready: bool| {
            if let Some(e) = endpoints.iter_mut().find(|e| e.ip == ip) {
                e.ready |= ready;
                if e.hostname.is_none() {
                    e.hostname = hostname;
                }
            } else {
                endpoints.push(DnsEndpoint {
                    ip,
                    hostname,
                    ready,
                });
            }
        };
        // Remote endpoints (and every endpoint of a Service without a selector) from slices.
        for slice_key in self.slices_of.get(&svc.key).into_iter().flatten() {
            let Some(slice) = self.slices.get(slice_key) else {
                continue;
            };
            if slice.address_type == AddressType::Fqdn {
                continue;
            }
            for e in slice.endpoints.iter() {
                let local = e.node_name.as_deref() == Some(&*self.node);
                if local && local_from_pods {
                    continue;
                }
                let ready = e.ready || svc.publish_not_ready;
                if svc.headless {
                    add_dns(e.address, e.hostname.clone(), ready);
                }
                for rp in ports.iter_mut() {
                    let Some(sp) = slice
                        .ports
                        .iter()
                        .find(|sp| *sp.name == *rp.port.name && sp.protocol == rp.port.protocol)
                    else {
                        continue;
                    };
                    let Some(port) = sp.port else { continue };
                    push_backend(
                        &mut rp.backends,
                        Backend {
                            ip: e.address,
                            port,
                            node: e.node_name.clone(),
                            local,
                            ready,
                            serving: e.serving || ready,
                        },
                    );
                }
            }
        }
        if local_from_pods && let Some(sel) = &svc.selector {
            let mut pods: Vec<&Arc<LocalPod>> = self
                .pods
                .values()
                .filter(|p| p.key.namespace == svc.key.namespace && p.selected_by(sel))
                .collect();
            pods.sort_by(|a, b| a.key.cmp(&b.key));
            for pod in pods {
                if pod.ips.is_empty() {
                    continue;
                }
                let ready = (pod.ready && !pod.terminating) || svc.publish_not_ready;
                let hostname = match (&pod.hostname, &pod.subdomain) {
                    (Some(h), Some(sub)) if **sub == *svc.key.name => Some(h.clone()),
                    _ => None,
                };
                if svc.headless {
                    for ip in &pod.ips {
                        add_dns(*ip, hostname.clone(), ready);
                    }
                }
                for rp in ports.iter_mut() {
                    let port = match &rp.port.target_port {
                        TargetPort::Number(n) => Some(*n),
                        TargetPort::Name(name) => pod.named_port(name, rp.port.protocol),
                    };
                    let Some(port) = port else { continue };
                    for ip in &pod.ips {
                        push_backend(
                            &mut rp.backends,
                            Backend {
                                ip: *ip,
                                port,
                                node: Some(self.node.clone()),
                                local: true,
                                ready,
                                serving: ready || (pod.ready && pod.terminating),
                            },
                        );
                    }
                }
            }
        }
        for p in ports.iter_mut() {
            p.backends.shrink_to_fit();
        }
        endpoints.shrink_to_fit();
        ResolvedService {
            service: svc,
            ports,
            endpoints,
        }
    }
}

fn push_backend(list: &mut Vec<Backend>, b: Backend) {
    if let Some(existing) = list.iter_mut().find(|x| x.ip == b.ip && x.port == b.port) {
        existing.ready |= b.ready;
        existing.serving |= b.serving;
        existing.local |= b.local;
    } else {
        list.push(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn service(v: serde_json::Value) -> Service {
        Service::from_json(&v.to_string()).unwrap()
    }

    fn slice(v: serde_json::Value) -> EndpointSlice {
        EndpointSlice::from_json(&v.to_string()).unwrap()
    }

    fn pod(uid: &str, name: &str, ip: &str, ready: bool) -> LocalPod {
        LocalPod::from_json(
            &json!({"metadata": {"name": name, "namespace": "shop", "uid": uid,
                    "labels": {"app": "web"}},
                "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8080}]}]},
                "status": {"podIP": ip, "conditions": [{"type": "Ready",
                    "status": if ready { "True" } else { "False" }}]}})
            .to_string(),
            None,
        )
        .unwrap()
    }

    fn web() -> Service {
        service(json!({"metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.20", "selector": {"app": "web"},
                     "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}))
    }

    fn web_slice(node: &str, ip: &str) -> EndpointSlice {
        slice(json!({"metadata": {"name": "web-x", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": [ip], "nodeName": node}]}))
    }

    #[test]
    fn remote_endpoints_come_from_slices_and_local_ones_from_pods() {
        let mut c = Catalog::new("edge-1");
        c.set_local_pods_known();
        c.apply_service(web());
        c.apply_slice(slice(
            json!({"metadata": {"name": "web-x", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": ["10.88.0.5"], "nodeName": "edge-1"},
                          {"addresses": ["10.77.0.9"], "nodeName": "edge-2"}]}),
        ));
        // The slice's stale entry for this node is ignored; the pod edged runs counts.
        c.apply_pod(pod("u1", "web-1", "10.88.0.7", true));
        let snap = c.snapshot().unwrap();
        let svc = snap.service("shop", "web").unwrap();
        let b = &svc.ports[0].backends;
        assert_eq!(b.len(), 2, "{b:?}");
        assert!(
            b.iter()
                .any(|b| b.ip.to_string() == "10.77.0.9" && !b.local)
        );
        assert!(
            b.iter()
                .any(|b| b.ip.to_string() == "10.88.0.7" && b.local && b.port == 8080)
        );
        assert_eq!(
            snap.by_destination("10.96.0.20".parse().unwrap(), 80, Protocol::Tcp)
                .map(|(s, _)| s.service.key.clone()),
            Some(Key::new("shop", "web"))
        );
        assert!(
            snap.by_destination("10.96.0.20".parse().unwrap(), 81, Protocol::Tcp)
                .is_none()
        );
    }

    #[test]
    fn a_local_pod_restarted_with_a_new_ip_is_followed_without_the_cloud() {
        let mut c = Catalog::new("edge-1");
        c.set_local_pods_known();
        c.apply_service(web());
        c.apply_slice(web_slice("edge-1", "10.88.0.5"));
        c.apply_pod(pod("u1", "web-1", "10.88.0.5", true));
        c.snapshot().unwrap();
        c.apply_pod(pod("u1", "web-1", "10.88.0.42", true));
        let snap = c.snapshot().unwrap();
        let ips: Vec<String> = snap.service("shop", "web").unwrap().ports[0]
            .usable()
            .map(|b| b.ip.to_string())
            .collect();
        assert_eq!(ips, ["10.88.0.42"]);
    }

    #[test]
    fn without_edged_local_slice_entries_are_used() {
        let mut c = Catalog::new("edge-1");
        c.apply_service(web());
        c.apply_slice(web_slice("edge-1", "10.88.0.5"));
        let snap = c.snapshot().unwrap();
        let b = &snap.service("shop", "web").unwrap().ports[0].backends;
        assert_eq!(b.len(), 1);
        assert!(b[0].local);
    }

    #[test]
    fn not_ready_pods_are_used_only_when_nothing_else_serves() {
        let mut c = Catalog::new("edge-1");
        c.set_local_pods_known();
        c.apply_service(web());
        c.apply_pod(pod("u1", "web-1", "10.88.0.5", false));
        let snap = c.snapshot().unwrap();
        let svc = snap.service("shop", "web").unwrap();
        assert_eq!(svc.ports[0].usable().count(), 0);
        c.apply_pod(pod("u2", "web-2", "10.88.0.6", true));
        let snap = c.snapshot().unwrap();
        let svc = snap.service("shop", "web").unwrap();
        assert_eq!(svc.ports[0].usable().count(), 1);
        assert!(
            svc.endpoints.is_empty(),
            "DNS endpoints are kept for headless Services only"
        );
        // Headless: the DNS name lists ready pods only.
        c.apply_service(service(
            json!({"metadata": {"name": "web-h", "namespace": "shop"},
            "spec": {"clusterIP": "None", "selector": {"app": "web"},
                     "ports": [{"name": "http", "port": 80}]}}),
        ));
        let snap = c.snapshot().unwrap();
        let h = snap.service("shop", "web-h").unwrap();
        let ips: Vec<String> = h.dns_addresses().map(|e| e.ip.to_string()).collect();
        assert_eq!(ips, ["10.88.0.6"]);
    }

    #[test]
    fn deletions_and_relists_remove_what_is_gone() {
        let mut c = Catalog::new("edge-1");
        c.apply_service(web());
        c.apply_slice(web_slice("edge-2", "10.77.0.9"));
        c.snapshot().unwrap();
        assert!(c.snapshot().is_none(), "nothing changed");
        c.replace_all(vec![web()], vec![]);
        let snap = c.snapshot().unwrap();
        assert!(
            snap.service("shop", "web").unwrap().ports[0]
                .backends
                .is_empty()
        );
        c.delete_service(&Key::new("shop", "web"));
        let snap = c.snapshot().unwrap();
        assert!(snap.service("shop", "web").is_none());
        assert!(snap.by_cluster_ip.is_empty());
    }

    #[test]
    fn a_slice_moving_to_another_service_updates_both() {
        let mut c = Catalog::new("edge-1");
        c.apply_service(web());
        c.apply_service(service(
            json!({"metadata": {"name": "api", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.21", "ports": [{"name": "http", "port": 80}]}}),
        ));
        c.apply_slice(web_slice("edge-2", "10.77.0.9"));
        c.snapshot().unwrap();
        let mut moved = web_slice("edge-2", "10.77.0.9");
        moved.service = Some("api".into());
        c.apply_slice(moved);
        let snap = c.snapshot().unwrap();
        assert!(
            snap.service("shop", "web").unwrap().ports[0]
                .backends
                .is_empty()
        );
        assert_eq!(
            snap.service("shop", "api").unwrap().ports[0].backends.len(),
            1
        );
    }

    #[test]
    fn headless_pod_hostnames_need_the_matching_subdomain() {
        let mut c = Catalog::new("edge-1");
        c.set_local_pods_known();
        c.apply_service(service(
            json!({"metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "None", "selector": {"app": "web"},
                     "ports": [{"name": "http", "port": 80}]}}),
        ));
        let mut p = pod("u1", "web-1", "10.88.0.5", true);
        p.hostname = Some("w1".into());
        p.subdomain = Some("web".into());
        c.apply_pod(p);
        let mut q = pod("u2", "web-2", "10.88.0.6", true);
        q.hostname = Some("w2".into());
        q.subdomain = Some("other".into());
        c.apply_pod(q);
        let snap = c.snapshot().unwrap();
        let svc = snap.service("shop", "web").unwrap();
        let names: Vec<Option<&str>> = svc
            .endpoints
            .iter()
            .map(|e| e.hostname.as_deref())
            .collect();
        assert_eq!(names, [Some("w1"), None]);
        assert!(snap.by_cluster_ip.is_empty());
    }
}
