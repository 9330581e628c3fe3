//! The stream server's certificate. A kube-apiserver run with `--kubelet-certificate-authority`
//! verifies every kubelet it calls against that CA (the cluster CA with kubeadm), and for edge
//! nodes the "kubelet" is cloudcore's stream server: its certificate must come from that CA and
//! name the address the apiserver dials — the node's InternalIP (with the tunnel-port DNAT,
//! the edge node's own address, not cloudcore's). KubeEdge users make it with `certgen.sh
//! stream`; [`issue`] does the same for `cloudcore stream-certificate`, and cloudcore serves
//! it from `tlsStreamCertFile`/`tlsStreamPrivateKeyFile` ([`ServerIdentity::load`]).

use kubeedge_shared::pki::{CertificateAuthority, IssuedCert};
use kubeedge_shared::tls;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// File names in the output directory, as KubeEdge's `/etc/kubeedge/certs` has them.
pub const CERT_FILE: &str = "stream.crt";
pub const KEY_FILE: &str = "stream.key";

#[derive(Debug, thiserror::Error)]
pub enum StreamCertError {
    #[error("reading {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("{what} {path}: {detail}")]
    Invalid {
        what: &'static str,
        path: String,
        detail: String,
    },
    #[error("the CA key {key} does not belong to the CA certificate {cert}")]
    KeyMismatch { cert: String, key: String },
    #[error(
        "no --ip or --dns: the apiserver checks the certificate against the address it dials \
         (each edge node's InternalIP)"
    )]
    NoNames,
    #[error("--dns {0:?} is not a DNS name")]
    BadDnsName(String),
    #[error("{0}")]
    Pki(#[from] kubeedge_shared::pki::PkiError),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{present} exists but {missing} does not: give both files or neither")]
    HalfPair { present: String, missing: String },
    #[error("{0}")]
    Tls(#[from] tls::TlsError),
}

/// What the certificate names and how long it lasts.
pub struct StreamCertRequest<'a> {
    pub ips: &'a [IpAddr],
    pub dns: &'a [String],
    pub days: u32,
}

/// The CA from its PEM certificate and key files (PKCS#8, SEC1 or PKCS#1 RSA keys), checked
/// to belong together.
pub fn load_ca(cert: &Path, key: &Path) -> Result<CertificateAuthority, StreamCertError> {
    let read = |what, path: &Path| {
        std::fs::read_to_string(path).map_err(|source| StreamCertError::Read {
            what,
            path: path.display().to_string(),
            source,
        })
    };
    let (cert_pem, key_pem) = (read("CA certificate", cert)?, read("CA key", key)?);
    if !cert_pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(StreamCertError::Invalid {
            what: "CA certificate",
            path: cert.display().to_string(),
            detail: "no PEM CERTIFICATE block".into(),
        });
    }
    let ca = CertificateAuthority::from_pem(&cert_pem, &key_pem).map_err(|e| {
        StreamCertError::Invalid {
            what: "CA certificate and key",
            path: format!("{} + {}", cert.display(), key.display()),
            detail: e.to_string(),
        }
    })?;
    if !ca.key_matches_certificate() {
        return Err(StreamCertError::KeyMismatch {
            cert: cert.display().to_string(),
            key: key.display().to_string(),
        });
    }
    Ok(ca)
}

/// A serving certificate for the stream server, signed by `ca`, with `req`'s IP and DNS SANs.
pub fn issue(
    ca: &CertificateAuthority,
    req: &StreamCertRequest<'_>,
) -> Result<IssuedCert, StreamCertError> {
    if req.ips.is_empty() && req.dns.is_empty() {
        return Err(StreamCertError::NoNames);
    }
    for d in req.dns {
        // An IP given as --dns would become an IP SAN: say so instead.
        if d.parse::<IpAddr>().is_ok() || !is_dns_name(d) {
            return Err(StreamCertError::BadDnsName(d.clone()));
        }
    }
    let ips: Vec<String> = req.ips.iter().map(IpAddr::to_string).collect();
    let sans: Vec<&str> = ips
        .iter()
        .map(String::as_str)
        .chain(req.dns.iter().map(String::as_str))
        .collect();
    Ok(ca.issue_server(&sans, i64::from(req.days))?)
}

/// RFC 1123 host names, a leading `*.` allowed.
fn is_dns_name(name: &str) -> bool {
    let name = name.strip_prefix("*.").unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Writes `stream.crt` and `stream.key` (mode 0600) into `dir`, creating it; their paths.
pub fn write(dir: &Path, cert: &IssuedCert) -> Result<(PathBuf, PathBuf), StreamCertError> {
    let failed = |path: &Path| {
        let path = path.display().to_string();
        move |source| StreamCertError::Write { path, source }
    };
    std::fs::create_dir_all(dir).map_err(failed(dir))?;
    let (cert_path, key_path) = (dir.join(CERT_FILE), dir.join(KEY_FILE));
    write_private(&key_path, cert.key_pem.as_bytes()).map_err(failed(&key_path))?;
    std::fs::write(&cert_path, &cert.cert_pem).map_err(failed(&cert_path))?;
    Ok((cert_path, key_path))
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // An existing file keeps its mode on open: make it private too.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(data)
}

/// A certificate chain and its key, as a TLS server presents them.
pub struct ServerIdentity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl ServerIdentity {
    /// The pair at `cert`/`key` when both files exist, `None` when neither does; an error when
    /// only one exists or either does not load.
    pub fn load(cert: &Path, key: &Path) -> Result<Option<ServerIdentity>, StreamCertError> {
        match (cert.exists(), key.exists()) {
            (false, false) => Ok(None),
            (true, true) => Ok(Some(ServerIdentity {
                chain: tls::load_certs(cert)?,
                key: tls::load_key(key)?,
            })),
            (c, _) => {
                let (present, missing) = if c { (cert, key) } else { (key, cert) };
                Err(StreamCertError::HalfPair {
                    present: present.display().to_string(),
                    missing: missing.display().to_string(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;
    use std::sync::Arc;

    fn ca_files(dir: &Path, ca: &CertificateAuthority) -> (PathBuf, PathBuf) {
        let (c, k) = (dir.join("ca.crt"), dir.join("ca.key"));
        std::fs::write(&c, &ca.cert.cert_pem).unwrap();
        std::fs::write(&k, &ca.cert.key_pem).unwrap();
        (c, k)
    }

    /// Whether `cert` chains to `ca` for `name`, as a Go client with that CA checks it.
    fn verifies(ca: &CertificateDer<'static>, cert: &CertificateDer<'_>, name: &str) -> bool {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let name = rustls_pki_types::ServerName::try_from(name.to_string()).unwrap();
        let now = rustls_pki_types::UnixTime::now();
        verifier
            .verify_server_cert(cert, &[], &name, &[], now)
            .is_ok()
    }

    #[test]
    fn issued_certificate_verifies_for_its_addresses_and_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::generate().unwrap();
        let (ca_cert, ca_key) = ca_files(dir.path(), &ca);
        let loaded = load_ca(&ca_cert, &ca_key).unwrap();
        let ips: Vec<IpAddr> = vec!["10.254.254.1".parse().unwrap(), "fd00::7".parse().unwrap()];
        let dns = vec!["cloudcore.kubeedge.svc".to_string()];
        let req = StreamCertRequest {
            ips: &ips,
            dns: &dns,
            days: 30,
        };
        let cert = issue(&loaded, &req).unwrap();
        for name in ["10.254.254.1", "fd00::7", "cloudcore.kubeedge.svc"] {
            assert!(verifies(&ca.cert.cert_der, &cert.cert_der, name), "{name}");
        }
        assert!(!verifies(&ca.cert.cert_der, &cert.cert_der, "10.254.254.2"));
        let (not_before, not_after) = kubeedge_shared::pki::cert_validity(&cert.cert_der).unwrap();
        assert!((not_after - not_before - 30 * 86_400).abs() < 3600);

        let out = dir.path().join("certs");
        let (c, k) = write(&out, &cert).unwrap();
        assert_eq!(
            (c.clone(), k.clone()),
            (out.join(CERT_FILE), out.join(KEY_FILE))
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&k).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let id = ServerIdentity::load(&c, &k).unwrap().expect("both files");
        assert_eq!(id.chain, vec![cert.cert_der.clone()]);
        // The pair serves TLS.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(id.chain, id.key)
            .expect("a usable certificate and key");
    }

    #[test]
    fn bad_inputs_are_errors_that_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::generate().unwrap();
        let (ca_cert, ca_key) = ca_files(dir.path(), &ca);
        let missing = dir.path().join("nope.crt");
        let e = load_ca(&missing, &ca_key).err().unwrap().to_string();
        assert!(
            e.contains("nope.crt") && e.contains("CA certificate"),
            "{e}"
        );
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not PEM at all").unwrap();
        let e = load_ca(&junk, &ca_key).err().unwrap().to_string();
        assert!(e.contains("junk.pem"), "{e}");
        let e = load_ca(&ca_cert, &junk).err().unwrap().to_string();
        assert!(e.contains("junk.pem"), "{e}");
        // A key of another CA.
        let other = CertificateAuthority::generate().unwrap();
        let other_dir = dir.path().join("other");
        std::fs::create_dir(&other_dir).unwrap();
        let (_, other_key) = ca_files(&other_dir, &other);
        let e = load_ca(&ca_cert, &other_key).err().unwrap().to_string();
        assert!(e.contains("does not belong"), "{e}");

        let ca = load_ca(&ca_cert, &ca_key).unwrap();
        let none = StreamCertRequest {
            ips: &[],
            dns: &[],
            days: 1,
        };
        assert!(matches!(issue(&ca, &none), Err(StreamCertError::NoNames)));
        for bad in ["", "a b", "10.0.0.1", "-x.example", "x..y"] {
            let dns = vec![bad.to_string()];
            let req = StreamCertRequest {
                ips: &[],
                dns: &dns,
                days: 1,
            };
            assert!(
                matches!(issue(&ca, &req), Err(StreamCertError::BadDnsName(_))),
                "{bad:?}"
            );
        }
        let ips = ["10.0.0.1".parse().unwrap()];
        let forever = StreamCertRequest {
            ips: &ips,
            dns: &[],
            days: u32::MAX,
        };
        assert!(issue(&ca, &forever).is_err());
    }

    #[test]
    fn a_half_configured_pair_is_an_error_and_none_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = (dir.path().join("s.crt"), dir.path().join("s.key"));
        assert!(ServerIdentity::load(&c, &k).unwrap().is_none());
        std::fs::write(&c, "x").unwrap();
        let e = ServerIdentity::load(&c, &k).err().unwrap().to_string();
        assert!(e.contains("s.crt exists but") && e.contains("s.key"), "{e}");
        std::fs::write(&k, "x").unwrap();
        assert!(ServerIdentity::load(&c, &k).is_err(), "unparsable files");
    }
}
