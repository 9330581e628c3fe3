//! The cluster CA and the serving certificate (rcgen, ring), the rustls server config, and the
//! kubeconfig file clients use.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

pub struct Pki {
    pub ca_pem: String,
    pub ca_der: Vec<u8>,
    pub ca_key_pem: String,
    pub cert_der: CertificateDer<'static>,
    pub key_der: Vec<u8>,
    /// The client certificate the server presents to kubelets (`pods/log`).
    pub kubelet_client_der: CertificateDer<'static>,
    pub kubelet_client_key_der: Vec<u8>,
}

/// Loads the CA from `dir` (ca.crt/ca.key) or creates it there; always issues a fresh serving
/// certificate for `sans`.
pub fn make_pki(sans: &[String], dir: Option<&Path>) -> anyhow::Result<Pki> {
    let (ca_pem, ca_key) = match dir {
        Some(d) if d.join("ca.crt").exists() && d.join("ca.key").exists() => {
            let cert = std::fs::read_to_string(d.join("ca.crt")).context("reading ca.crt")?;
            let key = std::fs::read_to_string(d.join("ca.key")).context("reading ca.key")?;
            (cert, KeyPair::from_pem(&key).context("parsing ca.key")?)
        }
        _ => {
            let key = KeyPair::generate().context("generating CA key")?;
            let mut params = CertificateParams::new(Vec::<String>::new())?;
            let mut dn = DistinguishedName::new();
            dn.push(DnType::CommonName, "kube-memserver-ca");
            params.distinguished_name = dn;
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            params.not_before = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
            params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(3650);
            let cert = params.self_signed(&key).context("self-signing CA")?;
            let pem = cert.pem();
            if let Some(d) = dir {
                std::fs::create_dir_all(d)?;
                std::fs::write(d.join("ca.crt"), &pem)?;
                write_private(&d.join("ca.key"), key.serialize_pem().as_bytes())?;
            }
            (pem, key)
        }
    };
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, &ca_key).context("loading CA as issuer")?;
    let ca_der = pem_to_der(&ca_pem).context("decoding CA PEM")?;

    let mut names: Vec<String> = [
        "127.0.0.1",
        "::1",
        "localhost",
        "10.96.0.1",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    names.extend(sans.iter().cloned());
    names.dedup();
    let key = KeyPair::generate().context("generating serving key")?;
    let mut params = CertificateParams::new(names)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "kube-apiserver");
    params.distinguished_name = dn;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(365);
    let cert = params
        .signed_by(&key, &issuer)
        .context("signing serving certificate")?;

    let client_key = KeyPair::generate().context("generating kubelet client key")?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "kube-apiserver-kubelet-client");
    dn.push(DnType::OrganizationName, "system:masters");
    params.distinguished_name = dn;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.not_before = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(365);
    let client = params
        .signed_by(&client_key, &issuer)
        .context("signing kubelet client certificate")?;
    Ok(Pki {
        ca_key_pem: ca_key.serialize_pem(),
        ca_pem,
        ca_der,
        cert_der: cert.der().clone(),
        key_der: key.serialize_der(),
        kubelet_client_der: client.der().clone(),
        kubelet_client_key_der: client_key.serialize_der(),
    })
}

fn pem_to_der(pem: &str) -> anyhow::Result<Vec<u8>> {
    let body: String = pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect::<Vec<_>>()
        .join("");
    Ok(base64::engine::general_purpose::STANDARD.decode(body.trim())?)
}

pub fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    opts.mode(0o600);
    let mut f = opts.open(path)?;
    f.write_all(data)
}

pub fn server_config(pki: &Pki) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(
            vec![pki.cert_der.clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pki.key_der.clone())),
        )
        .context("serving certificate")?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// A kubeconfig with the CA and a bearer token.
pub fn kubeconfig(server: &str, ca_pem: &str, token: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kube-memserver
  cluster:
    server: {server}
    certificate-authority-data: {ca}
contexts:
- name: kube-memserver
  context:
    cluster: kube-memserver
    user: admin
    namespace: default
current-context: kube-memserver
preferences: {{}}
users:
- name: admin
  user:
    token: {token}
"
    )
}
