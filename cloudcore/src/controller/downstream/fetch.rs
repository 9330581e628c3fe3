//! The apiserver reads the downstream actor needs, done by another task so that its loop never
//! waits on the network; each answer comes back as an [`Input`].

use super::{ConfigKind, Input};
use crate::controller::location::ObjectKey;
use crate::controller::rest::{self, with_type_meta};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Reads under way at once.
const CONCURRENCY: usize = 16;
/// Back-off between attempts to list a node's pods.
const LIST_RETRY_FIRST: Duration = Duration::from_millis(500);
const LIST_RETRY_MAX: Duration = Duration::from_secs(30);

/// A read the actor asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetch {
    /// Every pod bound to `node` (it just became an edge node). Retried until it succeeds;
    /// answered with [`Input::PodsListed`].
    PodsOf { node: String, generation: u64 },
    /// The current copies of these pods of `node`, for a resync; answered with
    /// [`Input::PodsFetched`] (the pods of the node among `keys` that exist).
    Pods { node: String, keys: Vec<ObjectKey> },
    /// The current copies of these objects, for a resync of `node`; answered with
    /// [`Input::ConfigsFetched`].
    Configs {
        node: String,
        keys: Vec<(ConfigKind, ObjectKey)>,
    },
}

/// One object a [`Fetch::Configs`] asked for: `None` when it is gone or could not be read.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub kind: ConfigKind,
    pub key: ObjectKey,
    pub object: Option<Value>,
}

/// Performs fetches until `shutdown` (at most [`CONCURRENCY`] at once) and feeds the answers
/// to `answers`.
pub fn spawn_fetcher(
    client: kube::Client,
    mut fetches: mpsc::UnboundedReceiver<Fetch>,
    answers: mpsc::Sender<Input>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let limit = Arc::new(Semaphore::new(CONCURRENCY));
        loop {
            let fetch = tokio::select! {
                _ = shutdown.cancelled() => break,
                f = fetches.recv() => match f { Some(f) => f, None => break },
            };
            let Ok(permit) = limit.clone().acquire_owned().await else {
                break;
            };
            let (client, answers, shutdown) = (client.clone(), answers.clone(), shutdown.clone());
            tokio::spawn(async move {
                let answer = tokio::select! {
                    _ = shutdown.cancelled() => None,
                    a = perform(&client, fetch) => Some(a),
                };
                if let Some(answer) = answer {
                    let _ = answers.send(answer).await;
                }
                drop(permit);
            });
        }
    })
}

async fn perform(client: &kube::Client, fetch: Fetch) -> Input {
    match fetch {
        Fetch::PodsOf { node, generation } => Input::PodsListed {
            pods: pods_of(client, &node).await,
            node,
            generation,
        },
        Fetch::Pods { node, keys } => {
            let wanted: std::collections::HashSet<&ObjectKey> = keys.iter().collect();
            let pods = pods_of(client, &node)
                .await
                .into_iter()
                .filter(|p| {
                    let key = (
                        p.metadata.namespace.clone().unwrap_or_default(),
                        p.metadata.name.clone().unwrap_or_default(),
                    );
                    wanted.contains(&key)
                })
                .collect();
            Input::PodsFetched { node, keys, pods }
        }
        Fetch::Configs { node, keys } => {
            let mut objects = Vec::with_capacity(keys.len());
            for (kind, key) in keys {
                let req = rest::get(kind.rest_kind(), Some(&key.0), &key.1);
                let object = match rest::call_retrying(client, req).await {
                    Ok(obj) => Some(with_type_meta(obj, kind.rest_kind())),
                    Err(e) if rest::is_not_found(&e) => None,
                    Err(e) => {
                        tracing::warn!(%node, ?key, error = %e, "cannot fetch object for a resync; the edge asks for it when a pod needs it");
                        None
                    }
                };
                objects.push(Fetched { kind, key, object });
            }
            Input::ConfigsFetched { node, objects }
        }
    }
}

/// Every pod bound to `node`, retried with back-off until the apiserver answers.
async fn pods_of(client: &kube::Client, node: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::all(client.clone());
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let mut delay = LIST_RETRY_FIRST;
    loop {
        match api.list(&lp).await {
            Ok(list) => return list.items,
            Err(e) => {
                tracing::warn!(%node, error = %e, retry_in = ?delay, "listing the pods of an edge node failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(LIST_RETRY_MAX);
            }
        }
    }
}
