//! The certificate server on `cloudHub.https` (default `:10002`; protocol §6.3).
//!
//! * `GET /ca.crt` → the CA certificate, DER.
//! * `GET /edge.crt` (a GET with a body: the DER PKCS#10 CSR) → the signed certificate, DER.
//!   Authorised by `Authorization: Bearer <jwt>` (first join) or by a client certificate of
//!   this CA (rotation) whose subject is `CN=system:node:<NodeName>, O=system:nodes` (or the
//!   legacy `CN=kubeedge.io` when `allowLegacyCertificates` is on). Header `NodeName` names the
//!   node; optional `ExtKeyUsages` is a JSON array of Go `x509.ExtKeyUsage` numbers (default
//!   `[2]`, clientAuth). The certificate is the node's own identity,
//!   `CN=system:node:<NodeName>, O=system:nodes`, whatever subject the CSR carries (KubeEdge
//!   ≤ v1.15 edges put `CN=kubeedge.io` in every CSR), for `edgeCertSigningDuration` days.
//!
//! Status codes follow KubeEdge: 401 for a missing or unsplittable `Authorization` and for a
//! client certificate of the wrong node; 400 for JWT failures. Deviations (hardening): a CSR
//! that cannot be parsed is a 400 with a message (KubeEdge answers an empty 200); a `NodeName`
//! that is not a valid node name is a 400; bodies are capped at 64 KiB (413); a client
//! certificate that does not chain to the CA fails the TLS handshake.

use super::{JoinMetrics, RefusalLabel};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kubeedge_shared::constants::{LEGACY_EDGE_CN, NODE_CN_PREFIX, NODE_ORGANIZATION};
use kubeedge_shared::names::validate_node_name;
use kubeedge_shared::pki::{self, CertificateAuthority};
use kubeedge_shared::{tls, token};
use rustls_pki_types::CertificateDer;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// Largest `/edge.crt` body accepted (a P-256 CSR is about 400 bytes).
pub const MAX_CSR_BYTES: usize = 64 * 1024;

/// Longest life of one connection (also bounds slow uploads).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);

pub struct JoinServer {
    pub ca: Arc<CertificateAuthority>,
    /// `edgeCertSigningDuration`, days.
    pub signing_days: i64,
    /// `allowLegacyCertificates`: a client certificate with the shared legacy CN may renew
    /// (for any node: that CN names none).
    pub allow_legacy_certificates: bool,
    pub metrics: JoinMetrics,
}

/// The TLS configuration: the server certificate; a client certificate is optional and, when
/// sent, must chain to the CA.
pub fn tls_config(
    ca: &CertificateAuthority,
    chain: Vec<CertificateDer<'static>>,
    key: rustls_pki_types::PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, tls::TlsError> {
    tls::server_config(chain, key, std::slice::from_ref(&ca.cert.cert_der), false)
}

/// Listens on `addr` and serves until `shutdown`; returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    server: Arc<JoinServer>,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!("cannot listen on {addr} for the certificate server (cloudHub.https): {e}")
    })?;
    let local = listener.local_addr()?;
    tracing::info!(%local, "serving /ca.crt and /edge.crt for edge joins");
    let acceptor = TlsAcceptor::from(tls);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "certificate server: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = shutdown.cancelled() => break,
            };
            let (acceptor, server) = (acceptor.clone(), server.clone());
            tokio::spawn(async move {
                let accepted = tokio::time::timeout(Duration::from_secs(30), acceptor.accept(tcp));
                let stream = match accepted.await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        refuse(&server.metrics, "tls");
                        tracing::warn!(%peer, error = %e, "certificate server: TLS handshake failed (a client certificate not signed by this CA?)");
                        return;
                    }
                    Err(_) => return,
                };
                let client_cert = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| c.clone().into_owned());
                let service = hyper::service::service_fn(move |req| {
                    let (server, client_cert) = (server.clone(), client_cert.clone());
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            handle(&server, req, client_cert.as_ref(), peer).await,
                        )
                    }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let conn = builder.serve_connection(TokioIo::new(stream), service);
                // A join takes two small requests: a connection idling longer is dropped.
                match tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "certificate server connection ended")
                    }
                    Err(_) => tracing::debug!(%peer, "certificate server connection timed out"),
                    Ok(Ok(())) => {}
                }
            });
        }
        tracing::info!("certificate server stopped");
    });
    Ok(local)
}

fn refuse(metrics: &JoinMetrics, reason: &'static str) {
    metrics
        .certificates_refused
        .get_or_create(&RefusalLabel { reason })
        .inc();
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

fn der(body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = reply(StatusCode::OK, body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    r
}

async fn handle(
    server: &JoinServer,
    req: Request<Incoming>,
    client_cert: Option<&CertificateDer<'static>>,
    peer: SocketAddr,
) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/ca.crt") => {
            server.metrics.ca_downloads.inc();
            tracing::debug!(%peer, "served the CA certificate");
            der(server.ca.cert.cert_der.to_vec())
        }
        (&Method::GET, "/edge.crt") => match edge_cert(server, req, client_cert).await {
            Ok((node, cert)) => {
                server.metrics.certificates_issued.inc();
                tracing::info!(%peer, %node, days = server.signing_days, rotation = client_cert.is_some(), "signed an edge certificate");
                der(cert)
            }
            Err(r) => {
                refuse(&server.metrics, r.reason);
                tracing::warn!(%peer, status = %r.status, reason = r.reason, message = %r.message, "edge certificate refused");
                reply(r.status, r.message)
            }
        },
        _ => reply(StatusCode::NOT_FOUND, "not found\n"),
    }
}

pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    reason: &'static str,
    message: String,
}

fn refusal(status: StatusCode, reason: &'static str, message: impl Into<String>) -> Refusal {
    Refusal {
        status,
        reason,
        message: message.into(),
    }
}

fn node_subject_ok(cn: Option<&str>, orgs: &[String], node: &str, allow_legacy: bool) -> bool {
    match cn {
        Some(cn) if cn == LEGACY_EDGE_CN => allow_legacy,
        Some(cn) => {
            cn.strip_prefix(NODE_CN_PREFIX) == Some(node)
                && orgs.iter().any(|o| o == NODE_ORGANIZATION)
        }
        None => false,
    }
}

async fn edge_cert(
    server: &JoinServer,
    req: Request<Incoming>,
    client_cert: Option<&CertificateDer<'static>>,
) -> Result<(String, Vec<u8>), Refusal> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (node, ekus) = authorize(server, req.headers(), client_cert, now)?;
    let body = Limited::new(req.into_body(), MAX_CSR_BYTES)
        .collect()
        .await
        .map_err(|e| {
            refusal(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body",
                format!("cannot read the CSR (at most {MAX_CSR_BYTES} bytes): {e}\n"),
            )
        })?
        .to_bytes();
    let cert = sign(server, &node, &ekus, &body)?;
    Ok((node, cert))
}

/// Who asks for a certificate, and for which key usages: the request's headers checked
/// against the token or the client certificate (`now` in unix seconds).
pub(crate) fn authorize(
    server: &JoinServer,
    headers: &http::HeaderMap,
    client_cert: Option<&CertificateDer<'static>>,
    now: i64,
) -> Result<(String, Vec<pki::ExtendedKeyUsagePurpose>), Refusal> {
    let node = headers
        .get("NodeName")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .trim()
        .to_string();
    if node.is_empty() {
        return Err(refusal(
            StatusCode::BAD_REQUEST,
            "no_node_name",
            "header NodeName is required\n",
        ));
    }
    if let Err(e) = validate_node_name(&node) {
        return Err(refusal(
            StatusCode::BAD_REQUEST,
            "bad_node_name",
            format!("header NodeName: {e}\n"),
        ));
    }
    if let Some(cert) = client_cert {
        // The TLS layer verified the chain to the CA and EKU clientAuth.
        let (cn, orgs) = cert_subject(cert);
        if !node_subject_ok(
            cn.as_deref(),
            &orgs,
            &node,
            server.allow_legacy_certificates,
        ) {
            return Err(refusal(
                StatusCode::UNAUTHORIZED,
                "client_cert_node",
                format!(
                    "client certificate CN {cn:?} may not request a certificate for node {node:?}\n"
                ),
            ));
        }
    } else {
        let auth = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let Some(jwt) = auth
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim())
            .filter(|t| !t.is_empty())
        else {
            return Err(refusal(
                StatusCode::UNAUTHORIZED,
                "no_token",
                "missing Authorization: Bearer <token> (or a client certificate)\n",
            ));
        };
        if let Err(e) = token::verify_jwt(jwt, &server.ca.key_der, now) {
            let reason = match e {
                token::TokenError::Expired { .. } => "token_expired",
                token::TokenError::Signature => "token_signature",
                _ => "token_malformed",
            };
            return Err(refusal(
                StatusCode::BAD_REQUEST,
                reason,
                format!("invalid join token: {e}; get a fresh one with keadm gettoken\n"),
            ));
        }
    }
    let ekus = match headers.get("ExtKeyUsages").and_then(|v| v.to_str().ok()) {
        None | Some("") => vec![pki::go_ext_key_usage(2).ok_or_else(|| {
            refusal(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "no clientAuth",
            )
        })?],
        Some(json) => {
            let numbers: Vec<i64> = serde_json::from_str(json).map_err(|e| {
                refusal(
                    StatusCode::BAD_REQUEST,
                    "bad_ext_key_usages",
                    format!("header ExtKeyUsages is not a JSON array of integers: {e}\n"),
                )
            })?;
            numbers
                .into_iter()
                .map(|n| {
                    pki::go_ext_key_usage(n).ok_or_else(|| {
                        refusal(
                            StatusCode::BAD_REQUEST,
                            "bad_ext_key_usages",
                            format!("unsupported x509.ExtKeyUsage {n}\n"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?
        }
    };
    Ok((node, ekus))
}

/// The node's certificate for the DER CSR in `body`.
pub(crate) fn sign(
    server: &JoinServer,
    node: &str,
    ekus: &[pki::ExtendedKeyUsagePurpose],
    body: &[u8],
) -> Result<Vec<u8>, Refusal> {
    let subject = pki::csr_subject(body).map_err(|e| {
        refusal(
            StatusCode::BAD_REQUEST,
            "bad_csr",
            format!("the body must be a DER PKCS#10 certificate request: {e}\n"),
        )
    })?;
    let cert = server
        .ca
        .sign_node_csr(body, node, server.signing_days, ekus)
        .map_err(|e| {
            refusal(
                StatusCode::BAD_REQUEST,
                "bad_csr",
                format!("cannot sign the CSR: {e}\n"),
            )
        })?;
    if subject.common_name.as_deref() != Some(&format!("{NODE_CN_PREFIX}{node}")) {
        tracing::debug!(
            %node,
            csr_cn = ?subject.common_name,
            csr_o = ?subject.organizations,
            "CSR subject replaced by the node's identity"
        );
    }
    Ok(cert.to_vec())
}

fn cert_subject(cert: &CertificateDer<'_>) -> (Option<String>, Vec<String>) {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return (None, Vec::new());
    };
    let subject = parsed.subject();
    (
        subject
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .map(str::to_string),
        subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok())
            .map(str::to_string)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::node_subject_ok;

    #[test]
    fn node_subjects() {
        let nodes = vec!["system:nodes".to_string()];
        assert!(node_subject_ok(Some("system:node:a"), &nodes, "a", false));
        assert!(!node_subject_ok(Some("system:node:a"), &nodes, "b", false));
        assert!(!node_subject_ok(Some("system:node:a"), &[], "a", false));
        assert!(!node_subject_ok(Some("kubeedge.io"), &[], "a", false));
        assert!(node_subject_ok(Some("kubeedge.io"), &[], "a", true));
        assert!(!node_subject_ok(None, &nodes, "a", true));
    }
}
