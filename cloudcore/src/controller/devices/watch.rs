//! One cluster-wide watch of Devices, one of DeviceModels and one of DeviceStatuses
//! (kube-runtime's watcher, with its back-off). Without the CRDs the watches retry quietly
//! after one warning: device management starts when the CRDs are installed, DeviceStatuses are
//! written when theirs is (KubeEdge v1.23).

use super::Input;
use crate::controller::kind::Kind;
use futures_util::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub async fn run(client: kube::Client, tx: mpsc::Sender<Input>, shutdown: CancellationToken) {
    let devices = watch(client.clone(), Kind::Device, tx.clone());
    let models = watch(client.clone(), Kind::DeviceModel, tx.clone());
    let statuses = watch(client, Kind::DeviceStatus, tx);
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = async { tokio::join!(devices, models, statuses) } => {}
    }
}

fn to_value(obj: DynamicObject) -> Value {
    serde_json::to_value(obj).unwrap_or_default()
}

async fn watch(client: kube::Client, kind: Kind, tx: mpsc::Sender<Input>) {
    let ar = kind.api_resource();
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut warned = false;
    while let Some(event) = stream.next().await {
        let input = match (event, kind) {
            (Ok(Event::Apply(o) | Event::InitApply(o)), Kind::Device) => {
                Input::DeviceApplied(to_value(o))
            }
            (Ok(Event::Delete(o)), Kind::Device) => Input::DeviceDeleted(to_value(o)),
            (Ok(Event::Init), Kind::Device) => Input::DevicesRelisting,
            (Ok(Event::InitDone), Kind::Device) => Input::DevicesListed,
            (Ok(Event::Apply(o) | Event::InitApply(o)), Kind::DeviceModel) => {
                Input::ModelApplied(to_value(o))
            }
            (Ok(Event::Delete(o)), Kind::DeviceModel) => Input::ModelDeleted(to_value(o)),
            (Ok(Event::InitDone), Kind::DeviceModel) => Input::ModelsListed,
            (Ok(Event::Init), Kind::DeviceModel) => continue,
            (Ok(Event::Apply(o) | Event::InitApply(o)), Kind::DeviceStatus) => {
                Input::StatusApplied(to_value(o))
            }
            (Ok(Event::Delete(o)), Kind::DeviceStatus) => Input::StatusDeleted(to_value(o)),
            (Ok(Event::Init), Kind::DeviceStatus) => Input::StatusesRelisting,
            (Ok(Event::InitDone), Kind::DeviceStatus) => Input::StatusesListed,
            (Err(e), Kind::DeviceStatus) => {
                if !warned {
                    tracing::info!(error = %e,
                        "DeviceStatus (KubeEdge v1.23) not served: device reports go to Device.status only until its CRD is installed (manifests/crds/devices-crds.yaml)");
                    warned = true;
                }
                continue;
            }
            (Err(e), _) => {
                if !warned {
                    tracing::warn!(resource = %ar.plural, error = %e,
                        "cannot watch devices.kubeedge.io; device management waits for the CRDs (manifests/crds/devices-crds.yaml)");
                    warned = true;
                } else {
                    tracing::debug!(resource = %ar.plural, error = %e, "device watch failed; retrying");
                }
                continue;
            }
            // run() watches the three device kinds only.
            (Ok(_), _) => continue,
        };
        warned = false;
        if tx.send(input).await.is_err() {
            return;
        }
    }
}

/// Answers the actor's questions about nodes: the ID form of each node's edge, from its
/// Node's `status.nodeInfo.kubeletVersion`. A node not registered yet (a new KubeEdge edge
/// registers after connecting) is asked again, for up to a minute, then taken as v1.15.
pub async fn node_versions(
    client: kube::Client,
    mut asks: mpsc::UnboundedReceiver<String>,
    tx: mpsc::Sender<Input>,
    shutdown: CancellationToken,
) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
    loop {
        let node = tokio::select! {
            _ = shutdown.cancelled() => return,
            n = asks.recv() => match n { Some(n) => n, None => return },
        };
        let (nodes, tx, stop) = (nodes.clone(), tx.clone(), shutdown.clone());
        tokio::spawn(async move {
            for _ in 0..12 {
                match nodes.get_opt(&node).await {
                    Ok(Some(n)) => {
                        let version = n
                            .status
                            .and_then(|s| s.node_info)
                            .map(|i| i.kubelet_version)
                            .unwrap_or_default();
                        let form = super::IdForm::of_kubelet_version(&version);
                        let _ = tx.send(Input::NodeIdForm { node, form }).await;
                        return;
                    }
                    Ok(None) => {}
                    Err(e) => tracing::debug!(%node, error = %e, "node lookup failed; retried"),
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
                }
            }
            // Never registered: KubeEdge v1.15's IDs (what this project's edges take too).
            let form = super::IdForm::default();
            let _ = tx.send(Input::NodeIdForm { node, form }).await;
        });
    }
}
