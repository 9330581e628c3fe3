//! The apiserver reads the downstream actor needs, done by other tasks so that its loop never
//! waits on the network; each answer comes back as an [`Input`].
//!
//! A reconnect storm must not become a storm of reads: what many resyncs need is read once.
//! Pods are read by the coalescing lister (`fetch_pods.rs`: a few nodes' pods by
//! `spec.nodeName`, many nodes' pods from one paginated list of all pods), configmaps and
//! secrets by the shared reader (`fetch_configs.rs`: one GET per object version, whatever the
//! number of nodes waiting for it, and a bounded cache of what was read).

use super::fetch_configs::ConfigReader;
use super::{ConfigKind, Input};
use crate::controller::location::ObjectKey;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A read the actor asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetch {
    /// Every pod bound to `node` (it just became an edge node). Retried until it succeeds;
    /// answered with [`Input::PodsListed`] (possibly in several parts, the last `complete`).
    PodsOf { node: String, generation: u64 },
    /// The current copies of these pods of `node`, for a resync; answered with
    /// [`Input::PodsFetched`] (the pods of the node among `keys` that exist; possibly in
    /// several parts, together naming every key).
    Pods { node: String, keys: Vec<ObjectKey> },
    /// The current copies of these objects, for a resync of `node`; answered with
    /// [`Input::ConfigsFetched`] (possibly in several parts, together naming every object).
    Configs { node: String, keys: Vec<ConfigWant> },
}

/// A configmap or secret a resync needs, at least as new as `rv` (what the actor's watcher
/// delivered: an older copy would not be sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWant {
    pub kind: ConfigKind,
    pub key: ObjectKey,
    pub rv: u64,
}

/// One object a [`Fetch::Configs`] asked for: `None` when it is gone or could not be read.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub kind: ConfigKind,
    pub key: ObjectKey,
    pub object: Option<Value>,
}

/// Performs fetches until `shutdown` and feeds the answers to `answers`.
pub fn spawn_fetcher(
    client: kube::Client,
    mut fetches: mpsc::UnboundedReceiver<Fetch>,
    answers: mpsc::Sender<Input>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let (pods_tx, pods_rx) = mpsc::unbounded_channel();
        let lister = tokio::spawn(super::fetch_pods::run(
            client.clone(),
            pods_rx,
            answers.clone(),
            shutdown.clone(),
        ));
        let (done_tx, mut done) = mpsc::unbounded_channel();
        let mut configs = ConfigReader::new(client, answers, done_tx);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                f = fetches.recv() => match f {
                    None => break,
                    Some(Fetch::Configs { node, keys }) => configs.request(node, keys).await,
                    Some(pods) => {
                        if pods_tx.send(pods).is_err() {
                            break;
                        }
                    }
                },
                Some(read) = done.recv() => configs.read_done(read).await,
            }
        }
        drop(pods_tx);
        let _ = lister.await;
    })
}
