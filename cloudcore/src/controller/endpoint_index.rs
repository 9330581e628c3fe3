//! Which node runs which Service endpoint, from the EndpointSlices the service cache holds:
//! what the stream tunnel's relay checks before it connects one edge to an address on
//! another (so an edge cannot use the relay to reach arbitrary addresses behind another
//! edge — only TCP endpoints of Services that the cluster placed on that node).

use super::location::ObjectKey;
use serde_json::Value;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

type Entry = (Arc<str>, SocketAddr);

#[derive(Default)]
pub struct EndpointIndex {
    by_slice: HashMap<ObjectKey, Vec<Entry>>,
    count: HashMap<Entry, u32>,
}

/// The (node, TCP address) pairs of one EndpointSlice.
fn entries(slice: &Value) -> Vec<Entry> {
    let ports: Vec<u16> = slice["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["protocol"].as_str().unwrap_or("TCP") == "TCP")
        .filter_map(|p| p["port"].as_u64().and_then(|n| u16::try_from(n).ok()))
        .collect();
    let mut out = Vec::new();
    for e in slice["endpoints"].as_array().into_iter().flatten() {
        let Some(node) = e["nodeName"].as_str().filter(|n| !n.is_empty()) else {
            continue;
        };
        let node: Arc<str> = node.into();
        for ip in e["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str()?.parse::<IpAddr>().ok())
        {
            for port in &ports {
                out.push((node.clone(), SocketAddr::new(ip, *port)));
            }
        }
    }
    out
}

impl EndpointIndex {
    /// Indexes `slice` under `key`, replacing what it held before.
    pub fn set(&mut self, key: ObjectKey, slice: &Value) {
        self.remove(&key);
        let new = entries(slice);
        for e in &new {
            *self.count.entry(e.clone()).or_default() += 1;
        }
        if !new.is_empty() {
            self.by_slice.insert(key, new);
        }
    }

    pub fn remove(&mut self, key: &ObjectKey) {
        for e in self.by_slice.remove(key).into_iter().flatten() {
            if let Some(n) = self.count.get_mut(&e) {
                *n -= 1;
                if *n == 0 {
                    self.count.remove(&e);
                }
            }
        }
    }

    /// Keeps only the slices `keep` accepts.
    pub fn retain(&mut self, keep: impl Fn(&ObjectKey) -> bool) {
        let gone: Vec<ObjectKey> = self.by_slice.keys().filter(|k| !keep(k)).cloned().collect();
        for k in gone {
            self.remove(&k);
        }
    }

    /// Whether some EndpointSlice has a TCP endpoint `addr` on `node`.
    pub fn contains(&self, node: &str, addr: SocketAddr) -> bool {
        self.count.contains_key(&(Arc::from(node), addr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(node: &str, ip: &str, port: u16) -> Value {
        json!({"ports": [{"name": "http", "port": port}, {"name": "dns", "port": 53, "protocol": "UDP"}],
               "endpoints": [{"addresses": [ip], "nodeName": node},
                             {"addresses": ["10.0.0.1"]}]})
    }

    #[test]
    fn only_tcp_endpoints_on_their_node_are_indexed_and_removed_with_their_slice() {
        let mut idx = EndpointIndex::default();
        let k = ("shop".to_string(), "web-x".to_string());
        idx.set(k.clone(), &slice("edge-2", "10.88.0.5", 8080));
        let addr: SocketAddr = "10.88.0.5:8080".parse().unwrap();
        assert!(idx.contains("edge-2", addr));
        assert!(!idx.contains("edge-3", addr), "another node");
        assert!(
            !idx.contains("edge-2", "10.88.0.5:53".parse().unwrap()),
            "UDP"
        );
        assert!(!idx.contains("edge-2", "10.88.0.5:22".parse().unwrap()));
        // Two slices naming the same endpoint: it stays until both are gone.
        let k2 = ("shop".to_string(), "web-y".to_string());
        idx.set(k2.clone(), &slice("edge-2", "10.88.0.5", 8080));
        idx.remove(&k);
        assert!(idx.contains("edge-2", addr));
        idx.retain(|key| key != &k2);
        assert!(!idx.contains("edge-2", addr));
        // An update replaces the slice's entries.
        idx.set(k.clone(), &slice("edge-2", "10.88.0.5", 8080));
        idx.set(k, &slice("edge-2", "10.88.0.6", 8080));
        assert!(!idx.contains("edge-2", addr));
        assert!(idx.contains("edge-2", "10.88.0.6:8080".parse().unwrap()));
    }
}
