//! Node Leases renewed by cloudcore for edges that let it (capability `cloud-lease`).
//!
//! A kubelet renews its Lease in `kube-node-lease` every 10 s so that the node lifecycle
//! controller knows it is alive. An edge's authenticated link already proves that, so for
//! edges that agree cloudcore renews the Lease itself and the edge sends nothing: cloudhub
//! reports each edge it hears from (any frame, at most every quarter of the lease's
//! duration, as often as the kubelet renews), and the Lease's `renewTime` becomes the moment
//! it was heard. An edge that falls silent stops
//! being reported at its last frame — the same moment its own last renewal would have been,
//! so a dead edge or link is noticed no later than with the kubelet's renewals (its pings
//! come every 15 s, the lifecycle controller's grace is 40 s). A Lease that does not exist is
//! created as the kubelet creates it, owned by its Node.

use super::kind::Kind;
use super::rest;
use crate::cloudhub::{CloudHub, Heard};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::Patch;
use kubeedge_shared::constants::LEASE_NAMESPACE;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Renewals under way at once.
const CONCURRENCY: usize = 32;
/// Reports waiting for a renewal; beyond it cloudhub drops reports (the edge's next frame
/// reports again).
const QUEUE: usize = 65_536;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `renewed`, `created`, `no_node` (not registered yet), `forbidden` (RBAC) or `failed`.
    pub result: &'static str,
}

#[derive(Clone, Default)]
pub struct LeaseMetrics {
    pub renewals: Family<ResultLabel, Counter>,
}

impl LeaseMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry
            .sub_registry_with_prefix("edgecontroller")
            .register(
                "node_lease_renewals",
                "Edge node Leases renewed by cloudcore (cloud-lease edges), by result",
                self.renewals.clone(),
            );
    }

    fn count(&self, result: &'static str) {
        self.renewals.get_or_create(&ResultLabel { result }).inc();
    }
}

/// Renews the Leases of the `cloud-lease` edges `hub` hears from until `shutdown`.
pub fn spawn(
    client: kube::Client,
    hub: &CloudHub,
    metrics: LeaseMetrics,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let heard = hub.subscribe_heard(QUEUE);
    tokio::spawn(run(client, heard, metrics, shutdown))
}

async fn run(
    client: kube::Client,
    mut heard: mpsc::Receiver<Heard>,
    metrics: LeaseMetrics,
    shutdown: CancellationToken,
) {
    let limit = Arc::new(Semaphore::new(CONCURRENCY));
    loop {
        let h = tokio::select! {
            _ = shutdown.cancelled() => return,
            h = heard.recv() => match h { Some(h) => h, None => return },
        };
        let Ok(permit) = limit.clone().acquire_owned().await else {
            return;
        };
        let (client, metrics) = (client.clone(), metrics.clone());
        tokio::spawn(async move {
            let result = renew(&client, &h).await;
            if result == "failed" {
                tracing::debug!(node = %h.node, "node lease not renewed; the next report tries again");
            }
            metrics.count(result);
            drop(permit);
        });
    }
}

/// `renewTime` as the apiserver writes it (RFC 3339, microseconds).
fn micro_time(at: std::time::SystemTime) -> Value {
    k8s_openapi::jiff::Timestamp::try_from(at)
        .ok()
        .and_then(|t| serde_json::to_value(MicroTime(t)).ok())
        .unwrap_or(Value::Null)
}

/// The merge patch of a renewal.
pub fn renewal(at: std::time::SystemTime) -> Value {
    json!({"spec": {"renewTime": micro_time(at)}})
}

/// The Lease the kubelet would create for `node` (owned by the Node with `uid`).
pub fn new_lease(node: &str, uid: &str, at: std::time::SystemTime, lease_secs: u32) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": LEASE_NAMESPACE,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}],
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": lease_secs,
            "renewTime": micro_time(at),
        },
    })
}

async fn renew(client: &kube::Client, h: &Heard) -> &'static str {
    let patch = renewal(h.at);
    let req = rest::patch(
        Kind::Lease,
        Some(LEASE_NAMESPACE),
        &h.node,
        None,
        &Patch::Merge(&patch),
    );
    match rest::call_retrying(client, req).await {
        Ok(_) => "renewed",
        Err(e) if rest::is_not_found(&e) => {
            let node = rest::call(
                client,
                match rest::get(Kind::Node, None, &h.node) {
                    Ok(r) => r,
                    Err(_) => return "failed",
                },
            )
            .await;
            let uid = match node {
                Ok(n) => n["metadata"]["uid"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                Err(e) if rest::is_not_found(&e) => return "no_node",
                Err(_) => return "failed",
            };
            let lease = new_lease(&h.node, &uid, h.at, h.lease_secs);
            match rest::call_retrying(
                client,
                rest::create(Kind::Lease, Some(LEASE_NAMESPACE), &lease),
            )
            .await
            {
                Ok(_) => "created",
                // Created meanwhile (the edge's own first lease): the next report renews it.
                Err(kube::Error::Api(s)) if s.code == 409 => "renewed",
                Err(_) => "failed",
            }
        }
        Err(kube::Error::Api(s)) if s.code == 403 => {
            // The edge leaves its Lease to this cloudcore: without the right, its node goes
            // NotReady. Said at error level, every time (the ClusterRole needs it).
            tracing::error!(node = %h.node, message = %s.message, "node lease renewal forbidden: cloudcore's ClusterRole needs leases patch and create (charts/cloudcore rbac_cloudcore.yaml); the edge's node will go NotReady");
            "forbidden"
        }
        Err(e) => {
            tracing::debug!(node = %h.node, error = %e, "node lease renewal failed");
            "failed"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn a_renewal_writes_the_moment_the_edge_was_heard_in_micro_time() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_micros(1_800_000_000_123_456);
        assert_eq!(
            renewal(at),
            json!({"spec": {"renewTime": "2027-01-15T08:00:00.123456Z"}})
        );
    }

    #[test]
    fn a_created_lease_is_the_kubelets_owned_by_its_node() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let l = new_lease("edge-1", "uid-1", at, 40);
        assert_eq!(l["metadata"]["namespace"], "kube-node-lease");
        assert_eq!(l["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(l["spec"]["holderIdentity"], "edge-1");
        assert_eq!(l["spec"]["leaseDurationSeconds"], 40);
        assert_eq!(l["spec"]["renewTime"], "2027-01-15T08:00:00.000000Z");
    }
}
