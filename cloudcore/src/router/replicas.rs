//! Several cloudcore replicas: which one holds a node's connection. As KubeEdge (v1.18+), the
//! replica an edge connects to writes its address into the Node's annotation `cloudcore`, and
//! the replica that receives a REST call for a node it does not hold forwards the request to
//! that address (same port) and relays the answer. Here the annotation is read from one watch
//! of edge nodes' metadata (KubeEdge reads the Node on every call), written only when it names
//! another replica, and a forwarded request is never forwarded again.
//!
//! The value is the replica's IP (KubeEdge's form), or `IP:port` when its router listens on
//! another port than 9443 (several replicas on one host, as in the tests).

use dashmap::DashMap;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kubeedge_shared::constants::EDGE_NODE_LABEL;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// KubeEdge's `EdgeMappingCloudKey`.
pub const HOLDER_ANNOTATION: &str = "cloudcore";
/// The router port KubeEdge's replicas assume for each other.
pub const DEFAULT_PORT: u16 = 9443;
/// Header on a forwarded request: the receiving replica serves it itself.
pub const FORWARDED_HEADER: &str = "X-KubeEdge-RS-Forwarded";

/// This replica's annotation value for its router at `addr`.
pub fn announced(addr: SocketAddr) -> String {
    if addr.port() == DEFAULT_PORT {
        addr.ip().to_string()
    } else {
        addr.to_string()
    }
}

/// The router address an annotation value names (`IP`, with `port`, or `IP:port`).
pub fn parse_holder(value: &str, port: u16) -> Option<SocketAddr> {
    let v = value.trim();
    v.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, port))
        .or_else(|_| v.parse::<SocketAddr>())
        .ok()
}

pub struct Replicas {
    client: kube::Client,
    me: SocketAddr,
    holders: DashMap<String, SocketAddr>,
}

impl Replicas {
    pub fn new(client: kube::Client, me: SocketAddr) -> Arc<Self> {
        Arc::new(Replicas {
            client,
            me,
            holders: DashMap::new(),
        })
    }

    /// The replica holding `node`'s connection, when it is another one.
    pub fn holder(&self, node: &str) -> Option<SocketAddr> {
        self.holders.get(node).map(|h| *h).filter(|h| *h != self.me)
    }

    /// Keeps the holders of edge nodes from one metadata watch until `shutdown`.
    pub async fn watch(self: Arc<Self>, shutdown: CancellationToken) {
        let api: Api<PartialObjectMeta<Node>> = Api::all(self.client.clone());
        let config = watcher::Config::default().labels(EDGE_NODE_LABEL);
        let mut stream = watcher::watcher(api, config).default_backoff().boxed();
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return,
                e = stream.next() => match e { Some(e) => e, None => return },
            };
            match event {
                Ok(Event::Apply(m) | Event::InitApply(m)) => {
                    let Some(name) = m.metadata.name else {
                        continue;
                    };
                    let holder = m
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(HOLDER_ANNOTATION))
                        .and_then(|v| parse_holder(v, DEFAULT_PORT));
                    match holder {
                        Some(h) => {
                            self.holders.insert(name, h);
                        }
                        None => {
                            self.holders.remove(&name);
                        }
                    }
                }
                Ok(Event::Delete(m)) => {
                    if let Some(name) = m.metadata.name {
                        self.holders.remove(&name);
                    }
                }
                Ok(Event::Init | Event::InitDone) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "edge node watch (router holders) failed; retrying")
                }
            }
        }
    }

    /// `node` connected here: record this replica as its holder unless the watch says so
    /// already. A node that registers after connecting (a new KubeEdge edge) is waited for.
    pub fn announce(self: &Arc<Self>, node: String, shutdown: CancellationToken) {
        if self.holders.get(&node).is_some_and(|h| *h == self.me) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let api: Api<Node> = Api::all(this.client.clone());
            let patch = serde_json::json!({"metadata": {"annotations": {
                HOLDER_ANNOTATION: announced(this.me)}}});
            for _ in 0..24 {
                match api
                    .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {
                        this.holders.insert(node, this.me);
                        return;
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => {
                        tracing::warn!(%node, error = %e, "cannot record this replica as the node's cloudcore; REST calls reaching other replicas for it fail");
                        return;
                    }
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_values_follow_kubeedge_with_a_port_when_it_differs() {
        let a: SocketAddr = "10.0.0.5:9443".parse().unwrap();
        assert_eq!(announced(a), "10.0.0.5");
        assert_eq!(parse_holder("10.0.0.5", 9443), Some(a));
        let b: SocketAddr = "127.0.0.1:19443".parse().unwrap();
        assert_eq!(announced(b), "127.0.0.1:19443");
        assert_eq!(parse_holder("127.0.0.1:19443", 9443), Some(b));
        assert_eq!(
            parse_holder("fd00::1", 9443),
            Some("[fd00::1]:9443".parse().unwrap())
        );
        assert_eq!(parse_holder("not an address", 9443), None);
    }
}
