//! The HTTPS client of the certificate bootstrap: `GET /ca.crt` without verifying the server
//! (the CA is checked against the token's hash instead) and `GET /edge.crt` — a GET with a
//! DER CSR body — verifying the server against the downloaded CA.

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use kubeedge_shared::tls::AnyServerCert;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("edgeHub.httpServer {0:?} is not an https://host:port URL")]
    Url(String),
    #[error("cannot reach {addr}: {detail}")]
    Connect { addr: String, detail: String },
    #[error("TLS with {addr} failed: {detail}")]
    Tls { addr: String, detail: String },
    #[error("HTTP exchange with {addr} failed: {detail}")]
    Http { addr: String, detail: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// `https://host:port` → (host, `host:port`).
pub fn parse_server(url: &str) -> Result<(String, String), ClientError> {
    let rest = url
        .trim()
        .strip_prefix("https://")
        .ok_or_else(|| ClientError::Url(url.to_string()))?;
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() {
        return Err(ClientError::Url(url.to_string()));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => match p.parse::<u16>() {
            Ok(_) => (h, authority.to_string()),
            Err(_) => (authority, format!("{authority}:443")),
        },
        _ => (authority, format!("{authority}:443")),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok((host.to_string(), port))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// No server verification, no client certificate.
pub fn insecure_config() -> Result<Arc<rustls::ClientConfig>, ClientError> {
    // KubeEdge's `InsecureSkipVerify` for `/ca.crt` (the CA is checked against the token).
    let (any_cert, p) = AnyServerCert::new();
    Ok(Arc::new(
        rustls::ClientConfig::builder_with_provider(p)
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientError::Config(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(any_cert)
            .with_no_client_auth(),
    ))
}

/// Verifies the server against `ca`; presents `client` (certificate chain, key) if given.
pub fn verified_config(
    ca: &CertificateDer<'static>,
    client: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<Arc<rustls::ClientConfig>, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(ca.clone())
        .map_err(|e| ClientError::Config(format!("the cloud's CA is unusable: {e}")))?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Config(e.to_string()))?
        .with_root_certificates(roots);
    Ok(Arc::new(match client {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| ClientError::Config(format!("client certificate/key: {e}")))?,
        None => builder.with_no_client_auth(),
    }))
}

/// One `GET` on a fresh connection: (status, body).
pub async fn get(
    server_url: &str,
    path: &str,
    tls: Arc<rustls::ClientConfig>,
    headers: &[(&str, String)],
    body: Vec<u8>,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), ClientError> {
    let (host, addr) = parse_server(server_url)?;
    tokio::time::timeout(timeout, get_inner(&host, &addr, path, tls, headers, body))
        .await
        .map_err(|_| ClientError::Http {
            addr: addr.clone(),
            detail: format!("no answer within {timeout:?}"),
        })?
}

async fn get_inner(
    host: &str,
    addr: &str,
    path: &str,
    tls: Arc<rustls::ClientConfig>,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> Result<(StatusCode, Bytes), ClientError> {
    let name = ServerName::try_from(host.to_string()).map_err(|_| ClientError::Url(host.into()))?;
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| ClientError::Connect {
            addr: addr.into(),
            detail: e.to_string(),
        })?;
    let stream = TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| ClientError::Tls {
            addr: addr.into(),
            detail: e.to_string(),
        })?;
    let http_err = |e: &dyn std::fmt::Display| ClientError::Http {
        addr: addr.into(),
        detail: e.to_string(),
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| http_err(&e))?;
    let driver = tokio::spawn(conn);
    let mut req = Request::builder()
        .method(Method::GET)
        .uri(path)
        .header(header::HOST, addr);
    for (k, v) in headers {
        req = req.header(*k, v.as_str());
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| http_err(&e))?;
    let resp = sender.send_request(req).await.map_err(|e| http_err(&e))?;
    let status = resp.status();
    let body = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|e| http_err(&e))?
        .to_bytes();
    driver.abort();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::parse_server;

    #[test]
    fn server_urls() {
        assert_eq!(
            parse_server("https://10.0.0.1:10002").unwrap(),
            ("10.0.0.1".into(), "10.0.0.1:10002".into())
        );
        assert_eq!(
            parse_server("https://cloud.example/").unwrap(),
            ("cloud.example".into(), "cloud.example:443".into())
        );
        assert_eq!(
            parse_server("https://[::1]:10002").unwrap(),
            ("::1".into(), "[::1]:10002".into())
        );
        assert!(parse_server("http://x:1").is_err());
    }
}
