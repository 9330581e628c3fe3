//! Node status fields the cloud owns, taken out of what an edge writes.
//!
//! * `status.daemonEndpoints.kubeletEndpoint`: cloudstream points it at this cloudcore's
//!   negotiated tunnel port (`cloudstream/node_port.rs`). A KubeEdge edge's embedded kubelet
//!   sets it back to its own port in every node status patch (the kubelet's `DaemonEndpoints`
//!   status setter, diffed against the node it read from the cloud), which breaks
//!   `kubectl logs/exec` until the tunnel reconnects — KubeEdge issue #4310. KubeEdge's own
//!   deprecated `nodestatus` path keeps the existing port (`upstream.go updateNodeStatus`).
//! * `status.volumesAttached`: maintained by kube-controller-manager; KubeEdge's
//!   `updateNodeStatus` keeps the cluster's value.

use serde_json::Value;

/// Removes the kubelet endpoint from a node status patch (strategic merge, as the kubelet
/// sends it in `<ns>/nodepatch/<node>`), dropping `daemonEndpoints` if nothing else is left.
pub fn strip_from_patch(patch: &mut Value) {
    let Some(status) = patch.get_mut("status").and_then(Value::as_object_mut) else {
        return;
    };
    let emptied = match status
        .get_mut("daemonEndpoints")
        .and_then(Value::as_object_mut)
    {
        Some(endpoints) => {
            endpoints.remove("kubeletEndpoint");
            endpoints.is_empty()
        }
        None => false,
    };
    if emptied {
        status.remove("daemonEndpoints");
    }
}

/// Removes the cloud-owned fields from a full `NodeStatus` (the deprecated `nodestatus`
/// update), so a merge patch of it leaves the cluster's values alone.
pub fn strip_from_status(status: &mut Value) {
    if let Some(s) = status.as_object_mut() {
        s.remove("volumesAttached");
    }
    let mut wrapped = serde_json::json!({"status": status.take()});
    strip_from_patch(&mut wrapped);
    *status = wrapped["status"].take();
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A node status patch as KubeEdge v1.15's embedded kubelet sends it through
    /// `edge/pkg/metamanager/client/node.go` (`Patch`: content = `string(patchBytes)`, from the
    /// kubelet's `preparePatchBytesforNodeStatus` two-way strategic merge patch): its
    /// `DaemonEndpoints` setter resets the port the cloud had set to the tunnel port.
    const KUBELET_PATCH: &str = r#"{"status":{"$setElementOrder/conditions":[{"type":"Ready"}],"conditions":[{"lastHeartbeatTime":"2024-07-11T10:00:10Z","type":"Ready"}],"daemonEndpoints":{"kubeletEndpoint":{"Port":10350}}}}"#;

    #[test]
    fn kubelet_port_is_taken_out_of_a_kubelet_status_patch() {
        let mut patch: Value = serde_json::from_str(KUBELET_PATCH).unwrap();
        strip_from_patch(&mut patch);
        assert!(patch["status"].get("daemonEndpoints").is_none(), "{patch}");
        assert_eq!(patch["status"]["conditions"][0]["type"], "Ready");
        assert_eq!(
            patch["status"]["$setElementOrder/conditions"],
            json!([{"type": "Ready"}])
        );
    }

    #[test]
    fn patches_without_the_port_are_unchanged() {
        for p in [
            json!({"status": {"conditions": []}}),
            json!({"metadata": {"labels": {"a": "b"}}}),
            json!({"status": {"daemonEndpoints": {"other": {"Port": 1}}}}),
            json!("not an object"),
        ] {
            let mut q = p.clone();
            strip_from_patch(&mut q);
            assert_eq!(q, p);
        }
    }

    #[test]
    fn legacy_node_status_keeps_port_and_attached_volumes() {
        // `NodeStatusRequest.Status` (`common/types`): a Go `v1.NodeStatus` always carries
        // `daemonEndpoints` (a struct, never omitted), with Port 0 when unset.
        let mut status = json!({"conditions": [{"type": "Ready", "status": "True"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "volumesAttached": [{"name": "v", "devicePath": "/dev/x"}],
            "nodeInfo": {"kubeletVersion": "v1.26.15-kubeedge-v1.15.3"}});
        strip_from_status(&mut status);
        assert_eq!(
            status,
            json!({"conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": {"kubeletVersion": "v1.26.15-kubeedge-v1.15.3"}})
        );
    }
}
