//! cloudstream (reference §8): `kubectl logs` for pods on edge nodes. The apiserver calls
//! the node's "kubelet" at `<InternalIP>:<daemonEndpoints.kubeletEndpoint.Port>`; on a real
//! multi-host cluster that address must reach cloudcore's stream port, which KubeEdge does
//! with an iptables DNAT on the cloud hosts (`-p tcp --dport <port> -j DNAT --to
//! <cloudcore>:10003`, see `cloud/pkg/cloudstream/iptables`); cloudcore does not install it.
//! Edges report the stream port as their kubelet port when edgeStream is enabled.

pub mod server;
pub mod session;
pub mod tunnel;

use self::session::Sessions;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Where and with which certificates cloudstream serves.
pub struct StreamSettings {
    pub stream_listen: SocketAddr,
    pub tunnel_listen: SocketAddr,
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// The CA edge (tunnel client) certificates must chain to.
    pub ca: Vec<CertificateDer<'static>>,
}

pub struct CloudStream {
    stream_addr: SocketAddr,
    tunnel_addr: SocketAddr,
    sessions: Arc<Sessions>,
    shutdown: CancellationToken,
}

/// The stream server's TLS: client certificates are not asked for (KubeEdge requests but
/// never verifies them).
fn stream_tls(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

impl CloudStream {
    pub async fn start(
        settings: StreamSettings,
        client: kube::Client,
    ) -> anyhow::Result<CloudStream> {
        let tunnel_tls = kubeedge_shared::tls::server_config(
            settings.chain.clone(),
            settings.key.clone_key(),
            &settings.ca,
            true,
        )?;
        let stream_tls = stream_tls(settings.chain, settings.key)?;
        let tunnel = TcpListener::bind(settings.tunnel_listen).await?;
        let stream = TcpListener::bind(settings.stream_listen).await?;
        let (tunnel_addr, stream_addr) = (tunnel.local_addr()?, stream.local_addr()?);
        let sessions = Arc::new(Sessions::default());
        let shutdown = CancellationToken::new();
        tokio::spawn(tunnel::serve(
            tunnel,
            tunnel_tls,
            sessions.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(server::serve(
            stream,
            stream_tls,
            sessions.clone(),
            client,
            shutdown.clone(),
        ));
        tracing::info!(%stream_addr, %tunnel_addr, "cloudstream running");
        Ok(CloudStream {
            stream_addr,
            tunnel_addr,
            sessions,
            shutdown,
        })
    }

    pub fn stream_addr(&self) -> SocketAddr {
        self.stream_addr
    }

    pub fn tunnel_addr(&self) -> SocketAddr {
        self.tunnel_addr
    }

    /// Whether `node` has a tunnel up.
    pub fn is_connected(&self, node: &str) -> bool {
        self.sessions.get(node).is_some()
    }

    /// How many apiserver connections `node`'s tunnel carries.
    pub fn open_connections(&self, node: &str) -> usize {
        self.sessions.get(node).map_or(0, |s| s.conn_count())
    }

    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }
}

impl Drop for CloudStream {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
