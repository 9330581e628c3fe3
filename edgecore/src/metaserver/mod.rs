//! MetaServer: the edge's own Kubernetes API (devices reference §6), for edge applications that
//! list and watch Kubernetes objects, also while the cloud is unreachable.
//!
//! * Served on `modules.metaManager.metaServer.server` (KubeEdge's `127.0.0.1:10550`), plain
//!   HTTP like KubeEdge with `requireAuthorization` off; off by default, as in KubeEdge.
//! * Kinds the cloud pushes to the edge (pods, configmaps, secrets, the node, leases, devices)
//!   are answered from the edge database (`meta_v2`) with Kubernetes' semantics:
//!   resourceVersions, watches from a version with `410 Gone` when it is older than the kept
//!   history (`feed.rs`), bookmarks, `sendInitialEvents`, label and field selectors, Tables.
//! * Other kinds (services, endpointslices, custom resources…) are read from the cloud's
//!   dynamic controller while connected (KubeEdge's Application messages), cached in the
//!   database, and served from it offline. A watch registers at the cloud, which then sends the
//!   objects and their changes to this edge only; registrations are sent again on every
//!   connect, with a relist that removes what was deleted meanwhile.
//! * Writes go to the cloud (node restriction decides there) and are refused while offline.

mod authz;
mod feed;
mod kinds;
mod remote;
mod request;
mod serve;
mod table;
#[cfg(test)]
mod tests;

pub use feed::Limits;

use crate::edgehub::LinkEvent;
use crate::metamanager::{CloudLink, MetaStore, StoreError};
use feed::Feed;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub struct MetaServerConfig {
    pub addr: SocketAddr,
    pub node: String,
    /// How long a request to the cloud waits (KubeEdge: 10 s).
    pub remote_timeout: Duration,
    /// How often watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
    pub limits: Limits,
}

impl MetaServerConfig {
    /// The settings of `modules.metaManager.metaServer`; `None` when it is disabled.
    pub fn from_edgecore(c: &crate::config::EdgeCoreConfig) -> Result<Option<Self>, String> {
        let ms = &c.modules.meta_manager.meta_server;
        if !ms.enable {
            return Ok(None);
        }
        let addr = ms.server.parse().map_err(|e| {
            format!(
                "modules.metaManager.metaServer.server {:?} is not an address: {e} (e.g. 127.0.0.1:10550)",
                ms.server
            )
        })?;
        Ok(Some(MetaServerConfig {
            addr,
            node: c.node_name().to_string(),
            remote_timeout: Duration::from_secs(10),
            bookmark_interval: Duration::from_secs(60),
            limits: Limits::default(),
        }))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MetaServerError {
    #[error(
        "cannot listen on {addr} (modules.metaManager.metaServer.server): {source}; is another edgecore or a KubeEdge edgecore running?"
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot read the edge database: {0}")]
    Store(#[from] StoreError),
}

pub(crate) struct Shared<L> {
    config: MetaServerConfig,
    store: MetaStore,
    feed: Arc<Feed>,
    link: L,
    regs: remote::Registrations,
    cancel: CancellationToken,
}

pub struct MetaServer {
    addr: SocketAddr,
    feed: Arc<Feed>,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl MetaServer {
    pub async fn start<L: CloudLink>(
        config: MetaServerConfig,
        store: MetaStore,
        link: L,
    ) -> Result<MetaServer, MetaServerError> {
        let listener = tokio::net::TcpListener::bind(config.addr)
            .await
            .map_err(|source| MetaServerError::Bind {
                addr: config.addr,
                source,
            })?;
        let addr = listener.local_addr().unwrap_or(config.addr);
        let feed = Feed::new(store.max_v2_rv().await?, config.limits);
        let sink_feed = feed.clone();
        store.set_change_sink(Arc::new(move |changes| sink_feed.publish(changes)));
        let cancel = CancellationToken::new();
        let sh = Arc::new(Shared {
            config,
            store,
            feed,
            link,
            regs: remote::Registrations::default(),
            cancel: cancel.clone(),
        });
        tracing::info!(%addr, "MetaServer listening (plain HTTP, loopback clients)");
        let accept = tokio::spawn(accept_loop(sh.clone(), listener));
        let feed = sh.feed.clone();
        let resync = tokio::spawn(resync_on_connect(sh));
        Ok(MetaServer {
            addr,
            feed,
            cancel,
            tasks: vec![accept, resync],
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Events and bytes in the watch history.
    pub fn history_size(&self) -> (usize, usize) {
        self.feed.size()
    }

    pub async fn shutdown(self) {
        self.cancel.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

async fn accept_loop<L: CloudLink>(sh: Arc<Shared<L>>, listener: tokio::net::TcpListener) {
    loop {
        let (stream, peer) = tokio::select! {
            _ = sh.cancel.cancelled() => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "MetaServer accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let sh = sh.clone();
        tokio::spawn(async move {
            let cancel = sh.cancel.clone();
            let svc = service_fn(move |req| {
                let sh = sh.clone();
                async move { Ok::<_, std::convert::Infallible>(serve::handle(sh, req).await) }
            });
            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "MetaServer connection ended with an error");
                },
                _ = cancel.cancelled() => conn.as_mut().graceful_shutdown(),
            }
        });
    }
}

/// On every connect: the cloud is told every watch this edge keeps (after a cloudcore restart
/// it has none), and each watched scope is listed again so that objects deleted while the
/// edge was away leave the cache (and the watches see them go).
async fn resync_on_connect<L: CloudLink>(sh: Arc<Shared<L>>) {
    let mut events = sh.link.subscribe();
    loop {
        let ev = tokio::select! {
            _ = sh.cancel.cancelled() => return,
            e = events.recv() => e,
        };
        match ev {
            Ok(LinkEvent::Connected) => {
                sh.regs.sync(&sh.link).await;
                serve::relist_watched(&sh).await;
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(_) => return,
        }
    }
}
