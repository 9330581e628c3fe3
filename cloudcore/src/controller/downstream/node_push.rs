//! The Node object pushed to KubeEdge v1.23+ edges, which read their own Node from their
//! database (v1.23 stopped asking the cloud for it: without a copy, an edge whose Node already
//! exists cannot finish registering or report its status). v1.23's cloud sends every
//! Added/Modified Node to its edge as `update` on `null/node/<name>`, the full object with
//! `apiVersion`/`kind`. This sends the same, on connect and when the Node changes — but not
//! when only heartbeat times moved (the edge wrote those itself), so an idle edge is not sent
//! its Node back every status period. Only v1.23+ KubeEdge edges (by the kubelet version their
//! Node reports) get it: earlier ones and this project's edges do not read it.

use k8s_openapi::api::core::v1::Node;
use serde_json::Value;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// Nodes of v1.23+ KubeEdge edges: the object to push and what was last pushed.
#[derive(Default)]
pub struct NodePush {
    nodes: HashMap<String, Entry>,
}

struct Entry {
    object: Value,
    fingerprint: u64,
    /// The fingerprint last sent over the current session (`None`: not sent yet).
    sent: Option<u64>,
}

/// Whether `kubelet_version` (`v1.31.12-kubeedge-v1.23.1`) is a KubeEdge edge of v1.23 or later.
pub fn reads_node_from_its_database(kubelet_version: &str) -> bool {
    let Some(rest) = kubelet_version.split("-kubeedge-v").nth(1) else {
        return false;
    };
    let mut parts = rest.split(['.', '-']);
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= (1, 23)
}

/// A hash of what the edge needs to see again: the object without its resourceVersion,
/// managed fields and the conditions' heartbeat times.
fn fingerprint(object: &Value) -> u64 {
    let mut v = object.clone();
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    if let Some(conds) = v
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    {
        for c in conds.iter_mut().filter_map(Value::as_object_mut) {
            c.remove("lastHeartbeatTime");
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.to_string().hash(&mut h);
    h.finish()
}

impl NodePush {
    /// A Node was added or changed. Returns the object to send now when its edge should get
    /// it and has not got this content yet over its current session (`connected`).
    pub fn observe(&mut self, node: &Node, connected: bool) -> Option<(String, Value)> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let version = node
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.kubelet_version.as_str())
            .unwrap_or_default();
        if !reads_node_from_its_database(version) {
            self.nodes.remove(&name);
            return None;
        }
        let mut object = serde_json::to_value(node).ok()?;
        object["apiVersion"] = "v1".into();
        object["kind"] = "Node".into();
        let fingerprint = fingerprint(&object);
        let entry = self.nodes.entry(name.clone()).or_insert(Entry {
            object: Value::Null,
            fingerprint,
            sent: None,
        });
        entry.object = object;
        entry.fingerprint = fingerprint;
        if !connected {
            entry.sent = None;
            return None;
        }
        if entry.sent == Some(fingerprint) {
            return None;
        }
        entry.sent = Some(fingerprint);
        Some((name, entry.object.clone()))
    }

    /// The edge of `node` connected: its Node, if it reads one.
    pub fn connected(&mut self, node: &str) -> Option<Value> {
        let entry = self.nodes.get_mut(node)?;
        entry.sent = Some(entry.fingerprint);
        Some(entry.object.clone())
    }

    /// The edge's session ended: the next one gets the Node again.
    pub fn disconnected(&mut self, node: &str) {
        if let Some(e) = self.nodes.get_mut(node) {
            e.sent = None;
        }
    }

    pub fn removed(&mut self, node: &str) {
        self.nodes.remove(node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(version: &str, heartbeat: &str, label: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "edge-1", "resourceVersion": heartbeat, "labels": {"l": label}},
            "status": {"nodeInfo": {"kubeletVersion": version, "machineID": "", "systemUUID": "",
                "bootID": "", "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
                "conditions": [{"type": "Ready", "status": "True",
                    "lastHeartbeatTime": format!("2026-11-27T12:00:0{heartbeat}Z")}]}
        }))
        .unwrap()
    }

    #[test]
    fn versions_from_v1_23_read_their_node_from_the_database() {
        assert!(reads_node_from_its_database("v1.31.12-kubeedge-v1.23.1"));
        assert!(reads_node_from_its_database(
            "v1.32.0-kubeedge-v1.24.0-beta.0"
        ));
        assert!(!reads_node_from_its_database("v1.30.14-kubeedge-v1.22.2"));
        assert!(!reads_node_from_its_database("v1.27.7-kubeedge-v1.15.3"));
        assert!(!reads_node_from_its_database("v1.29.0-kubeedge-rs-0.1.0"));
        assert!(!reads_node_from_its_database(""));
    }

    #[test]
    fn a_v1_23_edge_gets_its_node_on_connect_and_on_change_but_not_for_heartbeats() {
        let mut p = NodePush::default();
        let v = "v1.31.12-kubeedge-v1.23.1";
        // Offline: kept for the connect.
        assert!(p.observe(&node(v, "1", "a"), false).is_none());
        let sent = p.connected("edge-1").expect("pushed on connect");
        assert_eq!(sent["kind"], "Node");
        assert_eq!(sent["apiVersion"], "v1");
        // A heartbeat only: nothing.
        assert!(p.observe(&node(v, "2", "a"), true).is_none());
        // A real change: pushed, with the new resourceVersion.
        let (name, obj) = p.observe(&node(v, "3", "b"), true).expect("changed");
        assert_eq!(name, "edge-1");
        assert_eq!(obj["metadata"]["resourceVersion"], "3");
        // A new session gets it again.
        p.disconnected("edge-1");
        assert!(p.observe(&node(v, "4", "b"), true).is_some());
        // Older edges and ours never get it.
        let mut q = NodePush::default();
        assert!(
            q.observe(&node("v1.27.7-kubeedge-v1.15.3", "1", "a"), true)
                .is_none()
        );
        assert!(q.connected("edge-1").is_none());
    }
}
