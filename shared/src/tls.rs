//! rustls configurations for the mTLS channel, with the `ring` provider only.

use rustls::client::WebPkiServerVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: no PEM {what} found (check the file is a PEM {what})")]
    NoPem { path: String, what: &'static str },
    #[error("{path}: bad PEM: {detail}")]
    BadPem { path: String, detail: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Installs `ring` as the process-wide default provider (needed by crates that use the
/// default, e.g. reqwest built without a provider). Harmless when already installed.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadPem {
            path: path.display().to_string(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoPem {
            path: path.display().to_string(),
            what: "certificate",
        });
    }
    Ok(certs)
}

pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => TlsError::NoPem {
            path: path.display().to_string(),
            what: "private key",
        },
        other => TlsError::BadPem {
            path: path.display().to_string(),
            detail: other.to_string(),
        },
    })
}

fn roots(ca: &[CertificateDer<'static>]) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for c in ca {
        store
            .add(c.clone())
            .map_err(|e| TlsError::Config(format!("CA certificate rejected: {e}")))?;
    }
    Ok(Arc::new(store))
}

/// cloudhub: present `chain`, require a client certificate that chains to `client_ca`.
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_ca: &[CertificateDer<'static>],
    require_client_cert: bool,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let builder = WebPkiClientVerifier::builder_with_provider(roots(client_ca)?, provider.clone());
    let builder = if require_client_cert {
        builder
    } else {
        builder.allow_unauthenticated()
    };
    let verifier = builder
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let cfg = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("server certificate/key: {e}")))?;
    Ok(Arc::new(cfg))
}

/// edgehub: verify the server against `ca` (hostname/IP checked by rustls) and present the
/// client certificate.
pub fn client_config(
    ca: &[CertificateDer<'static>],
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = provider();
    let verifier = WebPkiServerVerifier::builder_with_provider(roots(ca)?, provider.clone())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_webpki_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("client certificate/key: {e}")))?;
    Ok(Arc::new(cfg))
}

/// The subject CN of a DER certificate.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string)
}

/// Accepts any server certificate but still checks the handshake signatures: what Go's
/// `InsecureSkipVerify` does (KubeEdge's edge fetching `/ca.crt`, the apiserver calling kubelets
/// without `--kubelet-certificate-authority`). Only for peers whose identity is checked otherwise.
#[derive(Debug)]
pub struct AnyServerCert(Arc<rustls::crypto::CryptoProvider>);

impl AnyServerCert {
    /// The verifier and the (ring) provider its client configuration must be built with.
    pub fn new() -> (Arc<AnyServerCert>, Arc<rustls::crypto::CryptoProvider>) {
        let p = provider();
        (Arc::new(AnyServerCert(p.clone())), p)
    }
}

impl rustls::client::danger::ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
