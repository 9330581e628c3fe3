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
//! * `POST /api/v1/pods/unhold-upgrade` and `/api/v1/nodes/unhold-upgrade` (KubeEdge v1.22+)
//!   release the pod upgrades edged holds, at the edge, also offline (`unhold.rs`).
//! * With `featureGates.requireAuthorization` (KubeEdge v1.17+): HTTPS on `server` and on
//!   `dummyServer` (a dummy interface pods reach as `KUBERNETES_SERVICE_HOST`) with a
//!   certificate the cluster's CA signs (`serving.rs`), pods' service-account tokens as
//!   credentials and the RBAC rules the cloud sends (`auth.rs`, `authz.rs`).

mod auth;
mod authz;
pub(crate) mod dummy;
mod feed;
pub(crate) mod informer;
mod keys;
mod kinds;
mod remote;
pub(crate) mod request;
#[cfg(test)]
mod secure_tests;
mod serve;
mod serving;
mod table;
#[cfg(test)]
mod tests;
mod unhold;
#[cfg(test)]
mod unhold_tests;

pub use feed::Limits;

use crate::edgehub::CloudLink;
use crate::edgehub::LinkEvent;
use crate::metamanager::{MetaStore, StoreError};
use feed::Feed;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use kubeedge_shared::backoff::Backoff;
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
    /// HTTPS, authentication and authorization (`featureGates.requireAuthorization`).
    pub secure: Option<SecureConfig>,
    /// Serve HTTP (`metaServer.enable`); without it only the standing watches and
    /// [`MetaServer::informer`] are served (edgemesh with the MetaServer off).
    pub serve: bool,
    /// Kinds kept registered at the cloud for in-process readers, whatever HTTP clients
    /// watch (edgemesh: Services and EndpointSlices).
    pub standing: Vec<StandingWatch>,
    /// edged's held pods, which `unhold-upgrade` releases; `None` without edged.
    pub held_pods: Option<kubeedge_edged::hold::Releaser>,
    /// Called on `POST /api/v1/taskupgrade/confirm-upgrade` (`keadm ctl confirm`): the task
    /// manager's, when node tasks are on.
    pub confirm_upgrade: Option<ConfirmHook>,
}

/// What confirms a node upgrade waiting for it: `Err` says why there is none.
#[derive(Clone)]
pub struct ConfirmHook(pub Arc<dyn Fn() -> Result<(), String> + Send + Sync>);

impl std::fmt::Debug for ConfirmHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConfirmHook")
    }
}

/// A cluster-wide watch this edge keeps at the cloud, so that the kind's objects and their
/// changes are in the edge database (and served offline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandingWatch {
    /// Empty for the core group.
    pub group: String,
    pub version: String,
    /// The plural, e.g. `services`.
    pub resource: String,
}

impl StandingWatch {
    /// `<version>/<plural>` (core group) or `<group>/<version>/<plural>`.
    pub fn parse(s: &str) -> Result<StandingWatch, String> {
        let valid = |p: &str| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        };
        let parts: Vec<&str> = s.split('/').collect();
        let (group, version, resource) = match parts.as_slice() {
            [v, r] => ("", *v, *r),
            [g, v, r] => (*g, *v, *r),
            _ => {
                return Err(format!(
                    "{s:?} is not <version>/<plural> or <group>/<version>/<plural> (e.g. v1/endpoints)"
                ));
            }
        };
        if (!group.is_empty() && !valid(group)) || !valid(version) || !valid(resource) {
            return Err(format!(
                "{s:?}: lower-case names expected (e.g. v1/endpoints)"
            ));
        }
        Ok(StandingWatch {
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
        })
    }

    /// `/<group or core>/<version>/<plural>`: the prefix of its `meta_v2` keys.
    pub fn key_prefix(&self) -> String {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        format!("/{group}/{}/{}", self.version, self.resource)
    }
}

#[derive(Debug, Clone)]
pub struct SecureConfig {
    /// The listener on the dummy interface (`metaServer.dummyServer`); none when empty.
    pub dummy: Option<SocketAddr>,
    /// Create the dummy interface `edge-dummy0` with the dummy address (needs root).
    pub create_dummy_link: bool,
    /// Where the cluster CA and the serving certificate are kept.
    pub pki_dir: std::path::PathBuf,
    pub auth: auth::AuthConfig,
}

impl SecureConfig {
    /// The addresses the serving certificate names.
    fn cert_ips(&self, server: SocketAddr) -> Vec<std::net::IpAddr> {
        let mut ips: Vec<_> = [Some(server), self.dummy]
            .into_iter()
            .flatten()
            .map(|a| a.ip())
            .filter(|ip| !ip.is_unspecified())
            .collect();
        ips.dedup();
        if ips.is_empty() {
            ips.push(std::net::Ipv4Addr::LOCALHOST.into());
        }
        ips
    }
}

impl MetaServerConfig {
    /// The settings of `modules.metaManager.metaServer`; `None` when neither it nor
    /// edgemesh (which reads Services through it) is enabled.
    pub fn from_edgecore(c: &crate::config::EdgeCoreConfig) -> Result<Option<Self>, String> {
        let ms = &c.modules.meta_manager.meta_server;
        let mut standing = if c.modules.edge_mesh.enable {
            crate::mesh::standing_watches()
        } else {
            Vec::new()
        };
        if ms.enable {
            for (i, w) in ms.standing_watches.iter().enumerate() {
                let w = StandingWatch::parse(w).map_err(|e| {
                    format!("modules.metaManager.metaServer.standingWatches[{i}]: {e}")
                })?;
                if !standing.contains(&w) {
                    standing.push(w);
                }
            }
        }
        if !ms.enable && standing.is_empty() {
            return Ok(None);
        }
        let addr = ms.server.parse().map_err(|e| {
            format!(
                "modules.metaManager.metaServer.server {:?} is not an address: {e} (e.g. 127.0.0.1:10550)",
                ms.server
            )
        })?;
        let secure = if ms.enable && c.feature_gates.get("requireAuthorization") == Some(&true) {
            let dummy = if ms.dummy_server.trim().is_empty() {
                None
            } else {
                Some(ms.dummy_server.parse().map_err(|e| {
                    format!(
                        "modules.metaManager.metaServer.dummyServer {:?} is not an address: {e} (e.g. 169.254.30.10:10550)",
                        ms.dummy_server
                    )
                })?)
            };
            // KubeEdge keeps them in /etc/kubeedge/pki/metaserver, beside the edge's `ca`
            // directory; an edge whose CA file lies elsewhere keeps them beside that file.
            let ca_dir = std::path::Path::new(&c.modules.edge_hub.tls_ca_file)
                .parent()
                .unwrap_or(std::path::Path::new("/etc/kubeedge/ca"));
            let base = match ca_dir.file_name() {
                Some(n) if n == "ca" => ca_dir.parent().unwrap_or(ca_dir),
                _ => ca_dir,
            };
            Some(SecureConfig {
                dummy,
                create_dummy_link: true,
                pki_dir: base.join("pki").join("metaserver"),
                auth: auth::AuthConfig {
                    issuers: ms.service_account_issuers.clone(),
                    audiences: ms.api_audiences.clone(),
                    keys: Arc::new(keys::KeySet::load(&ms.service_account_key_files).map_err(
                        |e| format!("modules.metaManager.metaServer.serviceAccountKeyFiles: {e}"),
                    )?),
                },
            })
        } else {
            None
        };
        Ok(Some(MetaServerConfig {
            addr,
            node: c.node_name().to_string(),
            remote_timeout: Duration::from_secs(10),
            bookmark_interval: Duration::from_secs(60),
            // Without HTTP clients the history only bridges in-process readers (edgemesh)
            // from their list to their next read: a small one does, and a reader that falls
            // behind lists again.
            limits: if ms.enable {
                Limits::default()
            } else {
                Limits {
                    max_events: 1000,
                    max_bytes: 256 << 10,
                }
            },
            secure,
            serve: ms.enable,
            standing,
            held_pods: None,
            confirm_upgrade: None,
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
    auth: Option<auth::AuthConfig>,
}

pub struct MetaServer {
    addr: SocketAddr,
    feed: Arc<Feed>,
    store: MetaStore,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl MetaServer {
    pub async fn start<L: CloudLink>(
        config: MetaServerConfig,
        store: MetaStore,
        link: L,
    ) -> Result<MetaServer, MetaServerError> {
        let mut listeners = Vec::new();
        let mut addr = config.addr;
        if config.serve {
            let listener = bind(config.addr).await?;
            addr = listener.local_addr().unwrap_or(config.addr);
            listeners.push(listener);
        }
        let mut tls = None;
        let mut serving_cert = None;
        if let Some(sec) = config.secure.as_ref().filter(|_| config.serve) {
            if let Some(dummy) = sec.dummy {
                if sec.create_dummy_link
                    && let Err(e) = dummy::ensure(dummy.ip())
                {
                    tracing::error!(error = %e, "dummy interface for the MetaServer not created; pods cannot reach it at {dummy}");
                }
                match bind(dummy).await {
                    Ok(l) => listeners.push(l),
                    Err(e) => {
                        tracing::error!(error = %e, "MetaServer not served on the dummy address")
                    }
                }
            }
            let ips = sec.cert_ips(addr);
            let sc = serving::ServingCert::new(sec.pki_dir.clone(), &ips);
            tls = Some(tls_acceptor(sc.clone()));
            serving_cert = Some((sc, ips));
        }
        let feed = Feed::new(store.max_v2_rv().await?, config.limits);
        let sink_feed = feed.clone();
        store.set_change_sink(Arc::new(move |changes| sink_feed.publish(changes)));
        let cancel = CancellationToken::new();
        let sh_auth = config.secure.as_ref().map(|s| s.auth.clone());
        let sh = Arc::new(Shared {
            config,
            store,
            feed,
            link,
            regs: remote::Registrations::default(),
            cancel: cancel.clone(),
            auth: sh_auth,
        });
        let mut tasks = Vec::new();
        for l in listeners {
            let at = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
            match &tls {
                Some(_) => {
                    tracing::info!(addr = %at, "MetaServer listening (HTTPS, service-account tokens, RBAC)")
                }
                None => {
                    tracing::info!(addr = %at, "MetaServer listening (plain HTTP, loopback clients)")
                }
            }
            tasks.push(tokio::spawn(accept_loop(sh.clone(), l, tls.clone())));
        }
        if let Some((sc, ips)) = serving_cert {
            tasks.push(tokio::spawn(serving::run(
                sc,
                sh.link.clone(),
                sh.config.node.clone(),
                ips,
                cancel.clone(),
            )));
        }
        for w in sh.config.standing.clone() {
            serve::register_standing(&sh, &w).await;
        }
        let feed = sh.feed.clone();
        let store = sh.store.clone();
        tasks.push(tokio::spawn(resync_on_connect(sh)));
        Ok(MetaServer {
            addr,
            feed,
            store,
            cancel,
            tasks,
        })
    }

    /// An in-process reader of the stored objects of `watch` (a standing watch: the cloud
    /// keeps them current while connected) and of their changes.
    pub fn informer(&self, watch: &StandingWatch) -> informer::Informer {
        informer::Informer::new(self.feed.clone(), self.store.clone(), watch.key_prefix())
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

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, MetaServerError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| MetaServerError::Bind { addr, source })
}

/// TLS ≥ 1.2 with the serving certificate as it is at each handshake (none yet: refused).
fn tls_acceptor(sc: Arc<serving::ServingCert>) -> tokio_rustls::TlsAcceptor {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = match rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
    {
        Ok(b) => b.with_no_client_auth().with_cert_resolver(sc),
        // The ring provider supports the default versions; unreachable in practice.
        Err(e) => {
            tracing::error!(error = %e, "TLS set-up failed");
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_cert_resolver(sc)
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

async fn accept_loop<L: CloudLink>(
    sh: Arc<Shared<L>>,
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
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
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => serve_connection(sh, stream, peer).await,
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream));
                    match handshake.await {
                        Ok(Ok(s)) => serve_connection(sh, s, peer).await,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "MetaServer TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "MetaServer TLS handshake timed out"),
                    }
                }
            }
        });
    }
}

async fn serve_connection<L, S>(sh: Arc<Shared<L>>, stream: S, peer: SocketAddr)
where
    L: CloudLink,
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
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
                // Registrations the cloud could not make (it was starting, the apiserver
                // refused) are sent again with back-off while the link stays up.
                let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(60));
                while sh
                    .regs
                    .sync(&sh.link)
                    .await
                    .is_some_and(|failed| failed > 0)
                    && sh.link.is_connected()
                {
                    tokio::select! {
                        _ = sh.cancel.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
                serve::relist_watched(&sh).await;
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(_) => return,
        }
    }
}
