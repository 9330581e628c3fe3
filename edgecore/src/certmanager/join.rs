//! `edgecore join`: what `keadm join --token` does for the configuration (protocol §6.5) —
//! writes a KubeEdge-layout `edgecore.yaml` pointing at the cloud, then obtains the edge
//! certificate with the token (which is then removed from the file).

use super::{CertError, bootstrap_if_needed};
use crate::config::EdgeCoreConfig;
use std::path::Path;
use std::time::Duration;

/// keadm join's flags that shape `edgecore.yaml`.
#[derive(Debug, Clone, clap::Args)]
pub struct JoinOptions {
    /// cloudcore's WebSocket address, `<IP>:10000` (keadm `-e`).
    #[arg(long = "cloudcore-ipport", short = 'e')]
    pub cloudcore_ipport: String,
    /// The join token: `kubectl -n kubeedge get secret tokensecret` (keadm gettoken).
    #[arg(long, short = 't')]
    pub token: String,
    /// Node name (default: the host name).
    #[arg(long = "edgenode-name", short = 'i')]
    pub edgenode_name: Option<String>,
    /// cloudcore's certificate port (cloudHub.https).
    #[arg(long, short = 's', default_value_t = 10002)]
    pub certport: u16,
    /// CRI endpoint, for the runtime and the image service as keadm join sets them (default
    /// unix:///run/containerd/containerd.sock).
    #[arg(long = "remote-runtime-endpoint", short = 'p')]
    pub remote_runtime_endpoint: Option<String>,
    /// Do not install the systemd unit edgecore.service (by default it is written, and
    /// enabled and started where systemd runs).
    #[arg(long)]
    pub no_service: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("--cloudcore-ipport {0:?} must be <IP or host>:<port>, e.g. 10.0.0.1:10000")]
    Address(String),
    #[error("--token: {0}; get one with keadm gettoken (Secret kubeedge/tokensecret)")]
    Token(kubeedge_shared::token::TokenError),
    #[error("the resulting configuration is invalid: {0}")]
    Invalid(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Cert(#[from] CertError),
}

/// `base` (normally [`EdgeCoreConfig::default_config`]) pointed at the cloud, as keadm writes
/// it: websocket server, `httpServer`, token, node name and edgeStream's tunnel address.
pub fn join_config(opts: &JoinOptions, base: EdgeCoreConfig) -> Result<EdgeCoreConfig, JoinError> {
    let (host, _port) = opts
        .cloudcore_ipport
        .trim()
        .rsplit_once(':')
        .filter(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
        .ok_or_else(|| JoinError::Address(opts.cloudcore_ipport.clone()))?;
    kubeedge_shared::token::split(&opts.token).map_err(JoinError::Token)?;
    let mut c = base;
    let hub = &mut c.modules.edge_hub;
    hub.websocket.server = opts.cloudcore_ipport.trim().to_string();
    hub.http_server = format!("https://{host}:{}", opts.certport);
    hub.token = opts.token.trim().to_string();
    c.modules.edge_stream.server =
        format!("{host}:{}", kubeedge_shared::constants::DEFAULT_TUNNEL_PORT);
    if let Some(name) = opts.edgenode_name.as_ref().filter(|n| !n.is_empty()) {
        c.modules.edged.hostname_override = name.clone();
    }
    if let Some(ep) = &opts.remote_runtime_endpoint {
        // As keadm join: the image service is the runtime's own.
        c.modules.edged.remote_runtime_endpoint = ep.clone();
        c.modules.edged.remote_image_endpoint = ep.clone();
    }
    c.validate()
        .map_err(|e| JoinError::Invalid(e.to_string()))?;
    Ok(c)
}

/// Writes `config` to `path` (mode 0640: it holds the token until the join succeeds) and
/// obtains the certificate, retrying for up to `deadline` (keadm waits 300 s).
pub async fn join(
    config: &EdgeCoreConfig,
    path: &Path,
    deadline: Duration,
) -> Result<(), JoinError> {
    let yaml = config.to_yaml().map_err(JoinError::Invalid)?;
    write_private(path, yaml.as_bytes()).map_err(|source| JoinError::Write {
        path: path.display().to_string(),
        source,
    })?;
    tracing::info!(config = %path.display(), node = %config.node_name(), "wrote the edgecore configuration");
    bootstrap_if_needed(config, Some(path), deadline).await?;
    Ok(())
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .open(path)?;
    f.write_all(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> JoinOptions {
        JoinOptions {
            cloudcore_ipport: "10.1.2.3:10000".into(),
            token: "aa.bb.cc.dd".into(),
            edgenode_name: Some("edge-9".into()),
            certport: 10002,
            remote_runtime_endpoint: None,
            no_service: true,
        }
    }

    #[test]
    fn keadm_layout() {
        let c = join_config(&opts(), EdgeCoreConfig::default_config()).unwrap();
        assert_eq!(c.modules.edge_hub.websocket.server, "10.1.2.3:10000");
        assert_eq!(c.modules.edge_hub.http_server, "https://10.1.2.3:10002");
        assert_eq!(c.modules.edge_hub.token, "aa.bb.cc.dd");
        assert_eq!(c.modules.edge_stream.server, "10.1.2.3:10004");
        assert_eq!(c.node_name(), "edge-9");
        let mut crio = opts();
        crio.remote_runtime_endpoint = Some("unix:///var/run/crio/crio.sock".into());
        let c = join_config(&crio, EdgeCoreConfig::default_config()).unwrap();
        assert_eq!(
            (
                c.modules.edged.remote_runtime_endpoint.as_str(),
                c.modules.edged.remote_image_endpoint.as_str()
            ),
            (
                "unix:///var/run/crio/crio.sock",
                "unix:///var/run/crio/crio.sock"
            )
        );
        let mut bad = opts();
        bad.cloudcore_ipport = "10.1.2.3".into();
        assert!(matches!(
            join_config(&bad, EdgeCoreConfig::default_config()),
            Err(JoinError::Address(_))
        ));
        let mut bad = opts();
        bad.token = "abc".into();
        assert!(matches!(
            join_config(&bad, EdgeCoreConfig::default_config()),
            Err(JoinError::Token(_))
        ));
    }
}
