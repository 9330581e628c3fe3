//! The edge controllers: downstream (cluster → edges), upstream (edges → cluster) and the
//! inventory-based resynchronisation of reconnecting edges.

pub mod downstream;
pub mod location;
pub mod refs;
pub mod rest;
pub mod upstream;

use crate::cloudhub::{CloudHub, Upstream};
use crate::http::Readiness;
use downstream::{Downstream, HeldObject, Input};
use kubeedge_shared::content;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use upstream::UpstreamHandler;

/// Runs the controllers until `shutdown`.
pub async fn run(
    client: kube::Client,
    hub: CloudHub,
    mut upstream: mpsc::Receiver<Upstream>,
    ready: Readiness,
    metrics: crate::metrics::ControllerMetrics,
    shutdown: CancellationToken,
) {
    let (tx, rx) = mpsc::channel(1024);
    let downstream = Downstream::new(client.clone(), hub.clone(), ready, tx.clone());
    let events = hub.subscribe();
    let ds = tokio::spawn(downstream.run(events, rx, shutdown.clone()));
    let handler = UpstreamHandler::new(client, hub, 64, metrics);
    loop {
        let up = tokio::select! {
            _ = shutdown.cancelled() => break,
            m = upstream.recv() => match m { Some(m) => m, None => break },
        };
        if let Err(up) = handler.dispatch(up) {
            // The inventory of a reconnecting edge.
            match parse_inventory(&up) {
                Ok(held) => {
                    let _ = tx
                        .send(Input::Inventory {
                            node: up.node.clone(),
                            held,
                        })
                        .await;
                }
                Err(e) => {
                    tracing::warn!(node = %up.node, error = %e, "malformed inventory; dropped")
                }
            }
        }
    }
    let _ = ds.await;
}

/// Reads an inventory message: `{"objects":[{"type","key","uid","resourceVersion"}]}` where
/// `key` is the wire resource `<ns>/<type>/<name>` (see `edgecore/INVENTORY.md`).
pub fn parse_inventory(up: &Upstream) -> Result<Vec<HeldObject>, String> {
    let body = content::content_json(&up.message.content).map_err(|e| e.to_string())?;
    let objects = body
        .get("objects")
        .and_then(|o| o.as_array())
        .ok_or("inventory lacks an objects array")?;
    let mut held = Vec::with_capacity(objects.len());
    for o in objects {
        let key = o["key"].as_str().unwrap_or_default();
        let Ok(path) = kubeedge_shared::ResourcePath::parse(key) else {
            continue;
        };
        let (Some(name), Some(ns)) = (path.name, path.namespace) else {
            continue;
        };
        held.push(HeldObject {
            resource_type: o["type"]
                .as_str()
                .map(str::to_string)
                .unwrap_or(path.resource_type),
            namespace: ns,
            name,
            uid: o["uid"].as_str().unwrap_or_default().to_string(),
            resource_version: o["resourceVersion"]
                .as_str()
                .and_then(|r| r.parse().ok())
                .or_else(|| o["resourceVersion"].as_u64())
                .unwrap_or(0),
        });
    }
    Ok(held)
}
