//! Pods for resyncs and for nodes that just became edge nodes, read in rounds: each round
//! takes every request waiting and answers them from either one list per node
//! (`spec.nodeName`) or, when that would take more requests, one paginated list of all pods.
//! So the reads of a reconnect storm grow with the cluster's pods and the storm's duration,
//! not with the number of reconnecting nodes, and a lone reconnect costs one small list.
//!
//! A round starts after every request it answers was made: a pod created before the request
//! is in its list (what a node that just became an edge node needs), and a copy older than
//! the actor's is refused there and asked for again. Answers go out page by page (a round over
//! a million pods never holds them all); the last part for a node says it is complete.

use super::Input;
use crate::controller::location::ObjectKey;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kubeedge_shared::backoff::Backoff;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::fetch::Fetch;

/// Per-node lists under way at once.
const CONCURRENCY: usize = 16;
/// A round of this many nodes or fewer lists per node, whatever the cluster's size.
const PER_NODE_AT_MOST: usize = 32;
/// Pods per page of the list of all pods.
const PAGE: u32 = 500;
/// Back-off between attempts to list.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The requests a round answers.
#[derive(Default)]
struct Round {
    /// node → generation: every pod of the node.
    all_of: HashMap<String, u64>,
    /// node → the pods wanted.
    keys: HashMap<String, HashSet<ObjectKey>>,
}

impl Round {
    fn add(&mut self, f: Fetch) {
        match f {
            Fetch::PodsOf { node, generation } => {
                self.all_of.insert(node, generation);
            }
            Fetch::Pods { node, keys } => self.keys.entry(node).or_default().extend(keys),
            Fetch::Configs { .. } => {}
        }
    }

    fn nodes(&self) -> usize {
        self.all_of.len()
            + self
                .keys
                .keys()
                .filter(|n| !self.all_of.contains_key(*n))
                .count()
    }
}

/// Lists until `requests` closes or `shutdown`.
pub(super) async fn run(
    client: kube::Client,
    mut requests: mpsc::UnboundedReceiver<Fetch>,
    answers: mpsc::Sender<Input>,
    shutdown: CancellationToken,
) {
    // Pages the last list of all pods took: what such a list costs.
    let mut pages_of_all = PER_NODE_AT_MOST;
    loop {
        let mut round = Round::default();
        let first = tokio::select! {
            _ = shutdown.cancelled() => return,
            f = requests.recv() => match f { Some(f) => f, None => return },
        };
        round.add(first);
        while let Ok(f) = requests.try_recv() {
            round.add(f);
        }
        let nodes = round.nodes();
        let lister = Lister {
            api: Api::all(client.clone()),
            answers: &answers,
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            pages = async {
                if nodes <= PER_NODE_AT_MOST.max(pages_of_all) {
                    lister.per_node(round).await;
                    None
                } else {
                    Some(lister.all_pods(round).await)
                }
            } => {
                if let Some(p) = pages {
                    tracing::info!(nodes, pages = p, "pods for resyncs read from one list of all pods");
                    pages_of_all = p.max(1);
                }
            }
        }
    }
}

struct Lister<'a> {
    api: Api<Pod>,
    answers: &'a mpsc::Sender<Input>,
}

fn key_of(pod: &Pod) -> ObjectKey {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

impl Lister<'_> {
    async fn send(&self, input: Input) {
        let _ = self.answers.send(input).await;
    }

    /// One list per node, [`CONCURRENCY`] at once.
    async fn per_node(&self, round: Round) {
        let Round { all_of, mut keys } = round;
        let mut nodes: Vec<(String, Option<u64>, Option<HashSet<ObjectKey>>)> = all_of
            .into_iter()
            .map(|(node, g)| {
                let k = keys.remove(&node);
                (node, Some(g), k)
            })
            .collect();
        nodes.extend(keys.into_iter().map(|(node, k)| (node, None, Some(k))));
        futures_util::stream::iter(nodes)
            .for_each_concurrent(CONCURRENCY, |(node, generation, keys)| async move {
                let pods = self.list(Some(&node)).await;
                self.answer(&node, generation, keys, pods).await;
            })
            .await;
    }

    async fn answer(
        &self,
        node: &str,
        generation: Option<u64>,
        keys: Option<HashSet<ObjectKey>>,
        pods: Vec<Pod>,
    ) {
        if let Some(keys) = keys {
            let wanted: Vec<Pod> = pods
                .iter()
                .filter(|p| keys.contains(&key_of(p)))
                .cloned()
                .collect();
            self.send(Input::PodsFetched {
                node: node.to_string(),
                keys: keys.into_iter().collect(),
                pods: wanted,
            })
            .await;
        }
        if let Some(generation) = generation {
            self.send(Input::PodsListed {
                node: node.to_string(),
                generation,
                pods,
                complete: true,
            })
            .await;
        }
    }

    /// Every pod bound to `node`, retried with back-off until the apiserver answers.
    async fn list(&self, node: Option<&str>) -> Vec<Pod> {
        let lp = match node {
            Some(n) => ListParams::default().fields(&format!("spec.nodeName={n}")),
            None => ListParams::default(),
        };
        let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
        loop {
            match self.api.list(&lp).await {
                Ok(list) => return list.items,
                Err(e) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(?node, error = %e, retry_in = ?delay, "listing the pods of an edge node failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// One paginated list of all pods answers the whole round; returns the pages it took.
    async fn all_pods(&self, round: Round) -> usize {
        let Round {
            all_of,
            keys: mut wanted,
        } = round;
        let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
        let mut token: Option<String> = None;
        let mut pages = 0usize;
        loop {
            let mut lp = ListParams::default().limit(PAGE);
            lp.continue_token = token.take();
            let list = match self.api.list(&lp).await {
                Ok(list) => list,
                Err(e) => {
                    // Start over (an expired continue token cannot be resumed); what was
                    // answered stays answered, a pod sent twice is applied once.
                    let delay = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in = ?delay, "listing all pods for resyncs failed; starting over");
                    tokio::time::sleep(delay).await;
                    pages = 0;
                    continue;
                }
            };
            pages += 1;
            let mut listed: HashMap<&str, Vec<Pod>> = HashMap::new();
            let mut found: HashMap<&str, (Vec<ObjectKey>, Vec<Pod>)> = HashMap::new();
            for pod in &list.items {
                let Some(node) = node_of(pod) else { continue };
                if let Some((n, _)) = all_of.get_key_value(node) {
                    listed.entry(n.as_str()).or_default().push(pod.clone());
                }
                if let Some((n, keys)) = wanted.get_key_value(node) {
                    let key = key_of(pod);
                    if keys.contains(&key) {
                        let e = found.entry(n.as_str()).or_default();
                        e.0.push(key);
                        e.1.push(pod.clone());
                    }
                }
            }
            for (node, pods) in listed {
                let generation = all_of.get(node).copied().unwrap_or_default();
                self.send(Input::PodsListed {
                    node: node.to_string(),
                    generation,
                    pods,
                    complete: false,
                })
                .await;
            }
            let found: Vec<(String, Vec<ObjectKey>, Vec<Pod>)> = found
                .into_iter()
                .map(|(n, (k, p))| (n.to_string(), k, p))
                .collect();
            for (node, keys, pods) in found {
                if let Some(left) = wanted.get_mut(&node) {
                    for k in &keys {
                        left.remove(k);
                    }
                }
                self.send(Input::PodsFetched { node, keys, pods }).await;
            }
            token = list.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                break;
            }
        }
        // The rest: complete lists, and wanted pods that do not exist (their deletes were
        // sent by the watcher).
        for (node, generation) in all_of {
            self.send(Input::PodsListed {
                node,
                generation,
                pods: Vec::new(),
                complete: true,
            })
            .await;
        }
        for (node, keys) in wanted {
            if !keys.is_empty() {
                self.send(Input::PodsFetched {
                    node,
                    keys: keys.into_iter().collect(),
                    pods: Vec::new(),
                })
                .await;
            }
        }
        pages
    }
}
