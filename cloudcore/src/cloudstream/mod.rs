//! cloudstream (protocol §8): `kubectl logs`, `exec` and `attach` for pods on edge nodes.
//! The apiserver calls the node's "kubelet" at `<InternalIP>:<daemonEndpoints.kubeletEndpoint.Port>`.
//! As KubeEdge: each replica negotiates a tunnel port (10351…, `tunnel_port`), writes it as
//! the kubelet port of the nodes whose tunnel it holds (`node_port`), and the iptables
//! manager (`iptables`, mode internal) DNATs `--dport <port>` to `<replica IP>:<streamPort>`.
//! Unlike KubeEdge, the stream server serves only clients whose certificate chains to the
//! stream CA, as a kubelet with `--client-ca-file` (`client_auth`).

pub(crate) mod certificate;
pub(crate) mod client_auth;
pub(crate) mod exec;
pub(crate) mod iptables;
pub(crate) mod mesh_relay;
pub(crate) mod metrics;
pub(crate) mod node_port;
pub(crate) mod relay;
pub(crate) mod server;
pub(crate) mod session;
pub(crate) mod tunnel;
pub(crate) mod tunnel_port;

pub use certificate::{
    ServerIdentity, StreamCertError, StreamCertRequest, issue as issue_certificate, load_ca,
    write as write_certificate,
};
pub use client_auth::{ClientAuth, SERVICE_ACCOUNT_CA};
pub use iptables::{Iptables, IptablesError, run as manage_iptables};
pub use mesh_relay::RelayTargets;
pub use tunnel_port::{
    ANNOTATION as TUNNEL_PORT_ANNOTATION, CONFIGMAP as TUNNEL_PORT_CONFIGMAP,
    NAMESPACE as TUNNEL_PORT_NAMESPACE, NegotiateError, TunnelPortRecord,
    negotiate as negotiate_tunnel_port,
};

use self::client_auth::Authenticator;
use self::session::Sessions;
use crate::metrics::StreamMetrics;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How long a client may take to send a request's headers on :10003/:10004 (slowloris).
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a TLS handshake on :10003/:10004 may take.
pub(crate) const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) type TlsConn = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// Accepts on `listener` until `shutdown`, completes each TLS handshake within
/// [`TLS_HANDSHAKE_TIMEOUT`] and hands the connection to `serve` on its own task.
pub(crate) async fn accept_loop<F, Fut>(
    what: &'static str,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
    serve: F,
) where
    F: Fn(TlsConn, SocketAddr) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "{what} accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Small frames (exec keystrokes, relayed requests) must not wait for Nagle.
        let _ = tcp.set_nodelay(true);
        let (acceptor, serve) = (acceptor.clone(), serve.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => serve(tls, peer).await,
                Ok(Err(e)) => tracing::info!(%peer, error = %e, "{what} TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "{what} TLS handshake timed out"),
            }
        });
    }
}

/// The HTTP/1 server both ports use: hyper enforces its header-read timeout only with a
/// timer, and without one a peer that never finishes its headers holds the connection forever.
pub(crate) fn http1_server(header_timeout: Duration) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout);
    b
}

/// Where and with which certificates cloudstream serves.
pub struct StreamSettings {
    pub stream_listen: SocketAddr,
    pub tunnel_listen: SocketAddr,
    /// The tunnel server's certificate (and the stream server's without `stream_cert`).
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// The stream server's own certificate (`tlsStreamCertFile`/`tlsStreamPrivateKeyFile`,
    /// from the cluster CA for an apiserver that verifies kubelets: `certificate`).
    pub stream_cert: Option<certificate::ServerIdentity>,
    /// The CA edge (tunnel client) certificates must chain to.
    pub ca: Vec<CertificateDer<'static>>,
    /// Accept the shared legacy edge CN `kubeedge.io` on the tunnel (as cloudHub's
    /// `allowLegacyCertificates`); otherwise the CN must be `system:node:<node>`.
    pub allow_legacy_cn: bool,
    /// The negotiated tunnel port, written as the kubelet port of every node whose tunnel
    /// connects here (None: nodes keep the port they report; Some(0): the stream server's own
    /// port, for an apiserver that reaches it directly).
    pub node_port: Option<u16>,
    /// Who may use the stream server: the stream CA (`client_auth::select`).
    pub client_auth: ClientAuth,
    pub metrics: StreamMetrics,
    /// What edgemesh's relay may connect edges to (none: every relay request is refused).
    pub relay_targets: Option<Arc<dyn mesh_relay::RelayTargets>>,
}

pub struct CloudStream {
    stream_addr: SocketAddr,
    tunnel_addr: SocketAddr,
    sessions: Arc<Sessions>,
    shutdown: CancellationToken,
}

/// The stream server's TLS: a client certificate is asked for, and checked after the
/// handshake by `auth` (none is asked for with [`ClientAuth::Insecure`]).
fn stream_tls(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    auth: &Authenticator,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?;
    let builder = match auth.handshake_verifier() {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_single_cert(chain, key)?;
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
        let auth = Authenticator::new(&settings.client_auth)?;
        let stream_tls = match settings.stream_cert {
            Some(id) => stream_tls(id.chain, id.key, &auth)?,
            None => stream_tls(settings.chain, settings.key, &auth)?,
        };
        let tunnel = TcpListener::bind(settings.tunnel_listen).await?;
        let stream = TcpListener::bind(settings.stream_listen).await?;
        let (tunnel_addr, stream_addr) = (tunnel.local_addr()?, stream.local_addr()?);
        let sessions = Arc::new(Sessions::default());
        let shutdown = CancellationToken::new();
        let node_port = settings.node_port.map(|port| tunnel::NodePort {
            client: client.clone(),
            port: if port == 0 { stream_addr.port() } else { port },
        });
        let relay = mesh_relay::Relay {
            sessions: sessions.clone(),
            targets: settings.relay_targets.clone(),
            metrics: settings.metrics.mesh_relay.clone(),
        };
        tokio::spawn(tunnel::serve(
            tunnel,
            tunnel_tls,
            settings.allow_legacy_cn,
            node_port,
            relay,
            shutdown.clone(),
        ));
        tokio::spawn(server::serve(
            stream,
            stream_tls,
            server::Access {
                auth,
                metrics: settings.metrics,
            },
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_client_that_never_finishes_its_headers_is_dropped() {
        let (mut client, server) = tokio::io::duplex(4096);
        let svc = hyper::service::service_fn(|_req| async {
            Ok::<_, std::convert::Infallible>(hyper::Response::new(String::new()))
        });
        let conn = http1_server(Duration::from_millis(200))
            .serve_connection(hyper_util::rt::TokioIo::new(server), svc);
        tokio::spawn(conn);
        client
            .write_all(b"GET /containerLogs/ns/p/c HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let mut rest = Vec::new();
        let ended =
            tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut rest)).await;
        assert!(
            ended.is_ok(),
            "connection still open long after the header timeout"
        );
    }
}
