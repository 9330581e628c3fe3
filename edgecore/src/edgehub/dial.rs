//! Dialing the cloud: TCP, TLS (server verified against the CA and the dialed host, client
//! certificate presented), WebSocket upgrade with KubeEdge's identity headers.

use super::EdgeHubConfig;
use kubeedge_shared::constants::{
    CONNECTION_USE_MSG, HEADER_CAPABILITIES, HEADER_CONNECTION_USE, HEADER_NODE_ID,
    HEADER_PROJECT_ID,
};
use rustls::pki_types::ServerName;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

pub(super) type Ws = WebSocketStream<TlsStream<TcpStream>>;

#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("invalid cloudhub server address {0:?}: expected host:port")]
    BadAddress(String),
    #[error("cannot reach {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error(
        "TLS with {addr} failed: {source} (check edgeHub.tlsCaFile is the cloud's CA and the server certificate names this address)"
    )]
    Tls {
        addr: String,
        source: std::io::Error,
    },
    #[error("WebSocket upgrade with {addr} failed: {detail}")]
    Upgrade { addr: String, detail: String },
    #[error("invalid header value for {0}")]
    Header(&'static str),
}

/// `host:port` of edgeHub's server (`wss://`, `[v6]:port` accepted).
pub fn split_server(server: &str) -> Result<(String, u16), DialError> {
    kubeedge_shared::net::split_server(server)
        .ok_or_else(|| DialError::BadAddress(server.to_string()))
}

/// A connected link and the capabilities the cloud advertised in its answer.
pub(super) async fn dial(
    cfg: &EdgeHubConfig,
    tls: Arc<rustls::ClientConfig>,
) -> Result<(Ws, Vec<String>), DialError> {
    let (host, port) = split_server(&cfg.server)?;
    let addr = format!("{host}:{port}");
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|source| DialError::Connect {
            addr: addr.clone(),
            source,
        })?;
    let _ = tcp.set_nodelay(true);
    let server_name = ServerName::try_from(host.clone())
        .map_err(|_| DialError::BadAddress(cfg.server.clone()))?;
    let tls = TlsConnector::from(tls)
        .connect(server_name, tcp)
        .await
        .map_err(|source| DialError::Tls {
            addr: addr.clone(),
            source,
        })?;
    let url_host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    let url = format!(
        "wss://{url_host}:{port}/{}/{}/events",
        cfg.project_id, cfg.node_name
    );
    let mut req = url.into_client_request().map_err(|e| DialError::Upgrade {
        addr: addr.clone(),
        detail: e.to_string(),
    })?;
    let headers = req.headers_mut();
    let value =
        |v: &str, name: &'static str| HeaderValue::from_str(v).map_err(|_| DialError::Header(name));
    headers.insert(HEADER_NODE_ID, value(&cfg.node_name, HEADER_NODE_ID)?);
    headers.insert(
        HEADER_PROJECT_ID,
        value(&cfg.project_id, HEADER_PROJECT_ID)?,
    );
    headers.insert(
        HEADER_CONNECTION_USE,
        HeaderValue::from_static(CONNECTION_USE_MSG),
    );
    if !cfg.capabilities.is_empty() {
        headers.insert(
            HEADER_CAPABILITIES,
            value(&cfg.capabilities.join(","), HEADER_CAPABILITIES)?,
        );
    }
    let ws_config = WebSocketConfig::default()
        .read_buffer_size(16 * 1024)
        .max_message_size(Some(cfg.max_frame_bytes))
        .max_frame_size(Some(cfg.max_frame_bytes));
    let (ws, resp) = tokio_tungstenite::client_async_with_config(req, tls, Some(ws_config))
        .await
        .map_err(|e| DialError::Upgrade {
            addr,
            detail: describe_upgrade_error(e),
        })?;
    let offered = resp
        .headers()
        .get_all(HEADER_CAPABILITIES)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
        .collect();
    Ok((ws, offered))
}

fn describe_upgrade_error(e: tokio_tungstenite::tungstenite::Error) -> String {
    use tokio_tungstenite::tungstenite::Error;
    match e {
        Error::Http(resp) => {
            let body = resp
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            format!("cloud answered {}: {body}", resp.status())
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_addresses_parse() {
        assert_eq!(
            split_server("10.0.0.1:10000").unwrap(),
            ("10.0.0.1".into(), 10000)
        );
        assert_eq!(
            split_server("wss://cloud.example:443/").unwrap(),
            ("cloud.example".into(), 443)
        );
        assert_eq!(split_server("[::1]:10000").unwrap(), ("::1".into(), 10000));
        assert!(split_server("nocolon").is_err());
        assert!(split_server(":10000").is_err());
        assert!(split_server("h:notaport").is_err());
    }
}
