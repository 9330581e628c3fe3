//! The node's kubelet port (KubeEdge's `updateNodeKubletEndpoint` in `tunnelserver.go`): when
//! an edge's stream tunnel connects, the replica holding it writes its negotiated tunnel port
//! into the Node's `status.daemonEndpoints.kubeletEndpoint.Port` (GET, then PUT `nodes/<n>/status`
//! carrying the resourceVersion read), so the apiserver's kubelet calls for that node go to
//! `<node IP>:<port>`, which the iptables manager DNATs to this replica's stream server. If
//! that fails for [`GIVE_UP_AFTER`] the tunnel is ended with CLOSE_CONNECT, as KubeEdge does;
//! the edge dials again.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use std::time::Duration;

/// KubeEdge polls for 2 minutes (every 20 s); the node may not be registered yet.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(120);

/// Sets `node`'s kubelet port to `port`, retrying until `deadline` passes.
pub async fn update(
    client: &kube::Client,
    node: &str,
    port: u16,
    retry: Duration,
    give_up_after: Duration,
) -> Result<(), String> {
    let api: Api<Node> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + give_up_after;
    loop {
        let err = match api.get_status(node).await {
            Ok(mut n) => {
                let status = n.status.get_or_insert_with(Default::default);
                let endpoints = status.daemon_endpoints.get_or_insert_with(Default::default);
                let kubelet = endpoints
                    .kubelet_endpoint
                    .get_or_insert_with(Default::default);
                if kubelet.port == i32::from(port) {
                    return Ok(());
                }
                kubelet.port = i32::from(port);
                match api.replace_status(node, &PostParams::default(), &n).await {
                    Ok(_) => {
                        tracing::info!(%node, port, "node kubelet port set to this cloudcore's tunnel port");
                        return Ok(());
                    }
                    Err(e) => e.to_string(),
                }
            }
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() + retry > deadline {
            return Err(format!(
                "failed to update node {node}'s kubelet port to {port}: {err}"
            ));
        }
        tracing::debug!(%node, port, error = %err, "updating the node's kubelet port failed; retrying");
        tokio::time::sleep(retry).await;
    }
}
