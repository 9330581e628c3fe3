//! Records of nodes that no longer exist are deleted (synccontroller's start-up and node-delete
//! cleanup), by the one replica that holds the Lease.

use super::api_resource;
use super::records::{SyncRecords, is_not_found};
use crate::leader::Leadership;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, DynamicObject};
use tokio_util::sync::CancellationToken;

/// Runs until `shutdown`: a full sweep whenever this replica becomes leader (and the records
/// are listed), then a sweep of each deleted edge node's records.
pub async fn run(
    client: kube::Client,
    records: SyncRecords,
    mut leadership: Leadership,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            led = leadership.wait_for(true) => if !led { return },
        }
        if !records.wait_available(&shutdown).await {
            return;
        }
        let removed = sweep(&client, &records, &leadership, records.nodes()).await;
        tracing::info!(removed, "orphaned sync records removed (leader sweep)");
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = leadership.changed() => {
                    if !changed { return }
                    if !leadership.is_leader() { break }
                }
                nodes = records.next_deleted_nodes() => {
                    if leadership.is_leader() {
                        let removed = sweep(&client, &records, &leadership, nodes).await;
                        if removed > 0 {
                            tracing::info!(removed, "sync records of deleted nodes removed");
                        }
                    }
                }
            }
        }
    }
}

/// Deletes the records of those of `nodes` that do not exist; returns how many.
pub async fn sweep(
    client: &kube::Client,
    records: &SyncRecords,
    leadership: &Leadership,
    nodes: Vec<String>,
) -> usize {
    let node_api: Api<Node> = Api::all(client.clone());
    let mut removed = 0;
    for node in nodes {
        match node_api.get_opt(&node).await {
            Ok(Some(_)) => continue,
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(%node, error = %e, "cannot check node; its records stay for now");
                continue;
            }
        }
        for key in records.keys_of(&node) {
            if !leadership.is_leader() {
                return removed;
            }
            let api: Api<DynamicObject> = match &key.namespace {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &api_resource(false)),
                None => Api::all_with(client.clone(), &api_resource(true)),
            };
            match api.delete(&key.name, &DeleteParams::default()).await {
                Ok(_) => {
                    records.removed(&key);
                    removed += 1;
                }
                Err(e) if is_not_found(&e) => records.removed(&key),
                Err(e) => {
                    tracing::debug!(record = %key.name, error = %e, "cannot delete orphaned record")
                }
            }
        }
    }
    removed
}
