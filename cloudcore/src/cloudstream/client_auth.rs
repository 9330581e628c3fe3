//! Who may use the stream server (`:10003`): like a kubelet started with `--client-ca-file`
//! and `--anonymous-auth=false`, a request is served only when the connection presented a
//! client certificate (EKU clientAuth) chaining to the stream CA — the cluster CA that signs
//! the kube-apiserver's `--kubelet-client-certificate` (KubeEdge's certgen.sh copies
//! `/etc/kubernetes/pki/ca.crt` to `streamCA.crt`). As the kubelet, the TLS handshake asks
//! for a certificate without requiring or checking it, and every request on a connection
//! without a trusted one is answered 401 Unauthorized. KubeEdge asks for client certificates
//! but never checks them; `insecureSkipClientVerify` restores that.

use rustls::DistinguishedName;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls_pki_types::{CertificateDer, UnixTime};
use std::path::Path;
use std::sync::Arc;

/// The cluster CA a pod's service-account volume holds (kube-root-ca.crt).
pub const SERVICE_ACCOUNT_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// How the stream server authenticates its clients.
#[derive(Clone, Debug)]
pub enum ClientAuth {
    /// Client certificates must chain to one of these CAs.
    Verify(Vec<CertificateDer<'static>>),
    /// Anyone who reaches the port is served (KubeEdge's behaviour).
    Insecure,
}

/// The stream CA, in order: `stream_ca_file` (`tlsStreamCAFile`) if it exists, else the
/// service-account CA (cloudcore in a pod). With `insecure` (`insecureSkipClientVerify`)
/// nothing is verified; with neither file it is an error saying what to provide.
pub fn select(
    stream_ca_file: &Path,
    service_account_ca: &Path,
    insecure: bool,
) -> anyhow::Result<ClientAuth> {
    if insecure {
        tracing::warn!(
            "modules.cloudStream.insecureSkipClientVerify: the stream server does not verify \
             client certificates; anyone who reaches it can read logs and exec into edge pods"
        );
        return Ok(ClientAuth::Insecure);
    }
    for (path, what) in [
        (stream_ca_file, "modules.cloudStream.tlsStreamCAFile"),
        (service_account_ca, "the service-account CA"),
    ] {
        if path.exists() {
            let ca = kubeedge_shared::tls::load_certs(path)?;
            tracing::info!(path = %path.display(), source = what, certificates = ca.len(),
                "stream server verifies client certificates against this CA");
            return Ok(ClientAuth::Verify(ca));
        }
    }
    anyhow::bail!(
        "cloudstream needs the CA of the kube-apiserver's kubelet client certificate \
         (--kubelet-client-certificate; the cluster CA, /etc/kubernetes/pki/ca.crt with kubeadm): \
         neither modules.cloudStream.tlsStreamCAFile ({}) nor {} exists. Put the CA there, run \
         cloudcore in a pod with its service-account token mounted, or set \
         modules.cloudStream.insecureSkipClientVerify: true to serve logs/exec/attach to anyone \
         who reaches the stream port",
        stream_ca_file.display(),
        service_account_ca.display()
    )
}

/// Why a connection's requests are refused (the `reason` label of the refusal metric).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    NoCertificate,
    Untrusted(String),
}

impl Refusal {
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NoCertificate => "no_client_certificate",
            Refusal::Untrusted(_) => "untrusted_client_certificate",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // Go clients (the kube-apiserver) send none when theirs is not from a CA the
            // server names as acceptable: the stream CA.
            Refusal::NoCertificate => f.write_str(
                "no client certificate (or none issued by the stream CA, which Go clients then withhold)",
            ),
            Refusal::Untrusted(e) => write!(f, "client certificate not trusted: {e}"),
        }
    }
}

/// Checks a connection's client certificate after the handshake.
#[derive(Clone, Debug)]
pub struct Authenticator {
    /// None: [`ClientAuth::Insecure`].
    verifier: Option<Arc<dyn ClientCertVerifier>>,
}

impl Authenticator {
    pub fn new(auth: &ClientAuth) -> anyhow::Result<Authenticator> {
        let verifier = match auth {
            ClientAuth::Insecure => None,
            ClientAuth::Verify(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in ca {
                    roots
                        .add(c.clone())
                        .map_err(|e| anyhow::anyhow!("stream CA certificate rejected: {e}"))?;
                }
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                Some(
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .allow_unauthenticated()
                        .build()?,
                )
            }
        };
        Ok(Authenticator { verifier })
    }

    /// The handshake's verifier: asks for a certificate (naming the CA as acceptable, as Go
    /// does with `ClientCAs`), checks the handshake signature, leaves the chain to [`check`].
    ///
    /// [`check`]: Authenticator::check
    pub fn handshake_verifier(&self) -> Option<Arc<dyn ClientCertVerifier>> {
        self.verifier
            .clone()
            .map(|v| Arc::new(Deferred(v)) as Arc<dyn ClientCertVerifier>)
    }

    /// The client's subject CN when its certificate chains to the stream CA (or anything
    /// with [`ClientAuth::Insecure`]).
    pub fn check(&self, peer: Option<&[CertificateDer<'static>]>) -> Result<String, Refusal> {
        let Some(verifier) = &self.verifier else {
            return Ok(String::new());
        };
        let Some((leaf, intermediates)) = peer.and_then(|c| c.split_first()) else {
            return Err(Refusal::NoCertificate);
        };
        verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map_err(|e| Refusal::Untrusted(e.to_string()))?;
        Ok(kubeedge_shared::tls::common_name(leaf).unwrap_or_default())
    }
}

/// Requests a client certificate and verifies the handshake signature made with it, but
/// accepts any chain: the kubelet answers 401 rather than failing the handshake.
#[derive(Debug)]
struct Deferred(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for Deferred {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_shared::pki::CertificateAuthority;
    use std::path::PathBuf;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let d = std::env::temp_dir().join(format!(
                "cloudstream-client-auth-{}-{name}-{}",
                std::process::id(),
                uuid_like()
            ));
            std::fs::create_dir_all(&d).expect("temp dir");
            TempDir(d)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn uuid_like() -> u128 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    }

    fn write_ca(dir: &Path, name: &str) -> (PathBuf, CertificateAuthority) {
        let ca = CertificateAuthority::generate().expect("CA");
        let path = dir.join(name);
        std::fs::write(&path, &ca.cert.cert_pem).expect("write CA");
        (path, ca)
    }

    fn verified(auth: ClientAuth) -> Vec<CertificateDer<'static>> {
        match auth {
            ClientAuth::Verify(ca) => ca,
            ClientAuth::Insecure => panic!("expected verification"),
        }
    }

    #[test]
    fn the_stream_ca_file_comes_first() {
        let d = TempDir::new("file");
        let (file, ca) = write_ca(&d.0, "streamCA.crt");
        let (sa, _) = write_ca(&d.0, "sa-ca.crt");
        let got = verified(select(&file, &sa, false).expect("selected"));
        assert_eq!(got, vec![ca.cert.cert_der.clone()]);
    }

    #[test]
    fn without_the_file_the_service_account_ca_is_used() {
        let d = TempDir::new("sa");
        let (sa, ca) = write_ca(&d.0, "sa-ca.crt");
        let got = verified(select(&d.0.join("missing.crt"), &sa, false).expect("selected"));
        assert_eq!(got, vec![ca.cert.cert_der.clone()]);
    }

    #[test]
    fn without_any_ca_cloudstream_refuses_to_start_unless_opted_out() {
        let d = TempDir::new("none");
        let (a, b) = (d.0.join("a.crt"), d.0.join("b.crt"));
        let err = select(&a, &b, false).expect_err("no CA").to_string();
        assert!(
            err.contains("tlsStreamCAFile") && err.contains("insecureSkipClientVerify"),
            "{err}"
        );
        assert!(matches!(select(&a, &b, true), Ok(ClientAuth::Insecure)));
    }

    #[test]
    fn the_opt_out_skips_verification_even_with_a_ca() {
        let d = TempDir::new("optout");
        let (file, _) = write_ca(&d.0, "streamCA.crt");
        assert!(matches!(
            select(&file, &d.0.join("sa.crt"), true),
            Ok(ClientAuth::Insecure)
        ));
    }

    #[test]
    fn a_file_that_is_not_a_certificate_is_an_error() {
        let d = TempDir::new("bad");
        let file = d.0.join("streamCA.crt");
        std::fs::write(&file, "not a certificate").expect("write");
        assert!(select(&file, &d.0.join("sa.crt"), false).is_err());
    }

    #[test]
    fn only_certificates_from_the_stream_ca_are_trusted() {
        let ca = CertificateAuthority::generate().expect("CA");
        let other = CertificateAuthority::generate().expect("other CA");
        let auth = Authenticator::new(&ClientAuth::Verify(vec![ca.cert.cert_der.clone()]))
            .expect("authenticator");
        let good = ca
            .issue_client("kube-apiserver-kubelet-client", Some("system:masters"), 1)
            .expect("client cert");
        assert_eq!(
            auth.check(Some(std::slice::from_ref(&good.cert_der))),
            Ok("kube-apiserver-kubelet-client".to_string())
        );
        let bad = other
            .issue_client("kube-apiserver-kubelet-client", Some("system:masters"), 1)
            .expect("client cert");
        assert!(matches!(
            auth.check(Some(std::slice::from_ref(&bad.cert_der))),
            Err(Refusal::Untrusted(_))
        ));
        let server = ca.issue_server(&["127.0.0.1"], 1).expect("server cert");
        assert!(
            matches!(
                auth.check(Some(std::slice::from_ref(&server.cert_der))),
                Err(Refusal::Untrusted(_))
            ),
            "a certificate without EKU clientAuth is not a client certificate"
        );
        assert_eq!(auth.check(None), Err(Refusal::NoCertificate));
        assert_eq!(auth.check(Some(&[])), Err(Refusal::NoCertificate));
        let open = Authenticator::new(&ClientAuth::Insecure).expect("authenticator");
        assert!(open.check(None).is_ok() && open.handshake_verifier().is_none());
    }
}
