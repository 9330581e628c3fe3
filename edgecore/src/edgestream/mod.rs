//! edgestream (protocol §8): the edge end of KubeEdge's stream tunnel. Dials
//! `wss://<edgeStream.server>/v1/kubeedge/connect` with the edge certificate and the headers
//! `SessionHostNameOverride`/`SessionInternalIP`, retries every 2 s, pings every 5 s, and
//! serves LOGS_CONNECT from the container log files the runtime writes (in-process, where
//! KubeEdge's edge forwards to edged's `127.0.0.1:10350`), streaming DATA frames back until
//! the log ends or the cloud sends REMOVE_CONNECT, and EXEC_CONNECT/ATTACH_CONNECT by
//! relaying the upgrade request to the runtime's streaming server (see `exec`),
//! PORT_FORWARD_CONNECT the same way after the CRI `PortForward` call (see `portforward`;
//! the edge says it serves it with an `X-KubeEdge-RS-Capabilities: port-forward` handshake
//! header), and
//! METRIC_CONNECT with the kubelet's `/stats/summary`, `/metrics/resource` and `/metrics`
//! (see `metrics`).

pub(crate) mod crilog;
pub(crate) mod exec;
pub(crate) mod logs;
pub(crate) mod metrics;
pub(crate) mod portforward;
pub(crate) mod relay;
pub(crate) mod sender;
pub(crate) mod tunnel;

pub use relay::TunnelDialer;
pub use tunnel::tunnel_tls;

use crate::config::EdgeCoreConfig;
use crate::tls_files::{TlsFileError, load_err};
use kubeedge_edged::EdgedConfig;
use kubeedge_edged::cri::runtime::Runtime;
use kubeedge_shared::tls::{self, TlsError};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Why edgestream cannot start.
#[derive(Debug, thiserror::Error)]
pub enum EdgeStreamError {
    #[error(transparent)]
    Tls(#[from] TlsFileError),
    #[error("edgestream cannot use the container runtime: {0}")]
    Runtime(kubeedge_edged::cri::CriError),
}

/// Between tunnel attempts (KubeEdge's ticker).
pub(crate) const RETRY: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct EdgeStreamSettings {
    /// `host:port` of the cloud's tunnel server.
    pub server: String,
    pub node_name: String,
    pub node_ip: String,
    pub handshake_timeout: Duration,
    /// edged's root directory (the node filesystem `/stats/summary` reports).
    pub root_dir: std::path::PathBuf,
}

pub struct EdgeStream {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl EdgeStream {
    pub fn start(
        settings: EdgeStreamSettings,
        tls: Arc<rustls::ClientConfig>,
        runtime: Runtime,
        status_reports: Arc<kubeedge_edged::status_report::StatusReports>,
    ) -> EdgeStream {
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let stats = Arc::new(kubeedge_edged::stats::StatsProvider::new(
            runtime.clone(),
            settings.node_name.clone(),
            settings.root_dir.clone(),
            status_reports,
        ));
        let task = tokio::spawn(async move {
            loop {
                match tunnel::connect(&settings, tls.clone()).await {
                    Ok(io) => {
                        tracing::info!(server = %settings.server, "stream tunnel connected");
                        tunnel::serve(io, runtime.clone(), stats.clone(), token.clone()).await;
                        tracing::info!("stream tunnel closed");
                    }
                    Err(e) => {
                        tracing::warn!(server = %settings.server, error = %e, "stream tunnel connect failed")
                    }
                }
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(RETRY) => {}
                }
            }
        });
        EdgeStream { shutdown, task }
    }

    /// edgestream with the certificate files `modules.edgeStream` names.
    pub fn from_config(
        config: &EdgeCoreConfig,
        edged: &EdgedConfig,
        status_reports: Arc<kubeedge_edged::status_report::StatusReports>,
    ) -> Result<EdgeStream, EdgeStreamError> {
        let (settings, tls) = settings_and_tls(config, edged)?;
        let cri = kubeedge_edged::cri::CriClient::connect_lazy(&edged.runtime_endpoint)
            .map_err(EdgeStreamError::Runtime)?;
        let runtime =
            kubeedge_edged::cri::runtime::Runtime::new(cri, edged.runtime_request_timeout);
        Ok(EdgeStream::start(settings, tls, runtime, status_reports))
    }

    /// edgemesh's way to endpoints on other nodes: relayed by the cloud's tunnel port.
    pub fn relay_dialer(
        config: &EdgeCoreConfig,
        edged: &EdgedConfig,
    ) -> Result<relay::TunnelDialer, EdgeStreamError> {
        let (settings, tls) = settings_and_tls(config, edged)?;
        Ok(relay::TunnelDialer::new(settings, tls))
    }

    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

/// The tunnel settings and TLS of `modules.edgeStream`.
fn settings_and_tls(
    config: &EdgeCoreConfig,
    edged: &EdgedConfig,
) -> Result<(EdgeStreamSettings, Arc<rustls::ClientConfig>), EdgeStreamError> {
    {
        let s = &config.modules.edge_stream;
        let ca = tls::load_certs(Path::new(&s.tls_tunnel_ca_file)).map_err(load_err(
            "modules.edgeStream.tlsTunnelCAFile",
            &s.tls_tunnel_ca_file,
        ))?;
        let chain = tls::load_certs(Path::new(&s.tls_tunnel_cert_file)).map_err(load_err(
            "modules.edgeStream.tlsTunnelCertFile",
            &s.tls_tunnel_cert_file,
        ))?;
        let key = tls::load_key(Path::new(&s.tls_tunnel_private_key_file)).map_err(load_err(
            "modules.edgeStream.tlsTunnelPrivateKeyFile",
            &s.tls_tunnel_private_key_file,
        ))?;
        let tls = tunnel::tunnel_tls(&ca, chain, key).map_err(|e| TlsFileError::Pair {
            cert: s.tls_tunnel_cert_file.clone(),
            key: s.tls_tunnel_private_key_file.clone(),
            source: TlsError::Config(e.to_string()),
        })?;
        let settings = EdgeStreamSettings {
            server: s.server.clone(),
            node_name: edged.node_name.clone(),
            node_ip: edged.node_ip.clone(),
            handshake_timeout: std::time::Duration::from_secs(s.handshake_timeout.max(1) as u64),
            root_dir: edged.root_directory.clone(),
        };
        Ok((settings, tls))
    }
}
