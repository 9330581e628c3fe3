//! Certificate bootstrap and rotation, like KubeEdge's `CertManager` (protocol §6.4).
//!
//! When `edgeHub.tlsCertFile`/`tlsPrivateKeyFile` do not load and `edgeHub.token` is set:
//! download the CA from `<httpServer>/ca.crt` (unverified), check its SHA-256 against the
//! token's first part, write it to `tlsCaFile`, create a P-256 key and a CSR for
//! `CN=system:node:<node>, O=system:nodes`, have `<httpServer>/edge.crt` sign it (verifying
//! the server against the CA, the token's JWT as bearer), write key (`EC PRIVATE KEY`, 0600)
//! and certificate, and remove the token from the config file. With `rotateCertificates`,
//! `spawn_rotation` renews the certificate at a random 70–90 % of its lifetime, presenting
//! the current one, and hands edgehub the new TLS configuration.

pub(crate) mod client;
pub(crate) mod join;

pub use client::{ClientError, get as https_get, verified_config};
pub use join::{JoinError, JoinOptions, join as join_node, join_config};

use crate::config::EdgeCoreConfig;
use crate::edgehub::EdgeHub;
use http::StatusCode;
use kubeedge_shared::backoff::Backoff;
use kubeedge_shared::{pki, tls, token};
use rustls_pki_types::CertificateDer;
use std::path::Path;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error(
        "no usable edge certificate ({0}) and modules.edgeHub.token is empty: \
         get a token with `keadm gettoken` on the cloud and run `edgecore join --cloudcore-ipport \
         <cloud-ip>:10000 --token <token>` (or set modules.edgeHub.token), or provide the files \
         named by modules.edgeHub.tlsCaFile, tlsCertFile and tlsPrivateKeyFile"
    )]
    NoToken(String),
    #[error(
        "modules.edgeHub.token is not a join token: {0}; get a fresh token with keadm gettoken"
    )]
    BadToken(token::TokenError),
    #[error(
        "token does not match the cloud's CA — get a fresh token with keadm gettoken \
         (CA from {server} hashes to {actual}, the token expects {expected})"
    )]
    CaMismatch {
        server: String,
        expected: String,
        actual: String,
    },
    #[error("{0} (is modules.edgeHub.httpServer right and cloudcore's cloudHub.https enabled?)")]
    Client(#[from] ClientError),
    #[error("the cloud refused the certificate request ({status}): {message}{hint}")]
    Refused {
        status: StatusCode,
        message: String,
        hint: &'static str,
    },
    #[error("the cloud answered {what} that is not usable: {detail}")]
    BadAnswer { what: &'static str, detail: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Pki(#[from] pki::PkiError),
}

impl CertError {
    /// Whether trying again later can help (network trouble, a cloud not up yet).
    pub fn is_transient(&self) -> bool {
        match self {
            CertError::Client(_) => true,
            CertError::Refused { status, .. } => status.is_server_error(),
            _ => false,
        }
    }
}

/// The certificate files and the cloud endpoint, from `modules.edgeHub`.
#[derive(Debug, Clone)]
pub struct CertPaths {
    pub ca_file: String,
    pub cert_file: String,
    pub key_file: String,
    pub http_server: String,
    pub node_name: String,
}

impl CertPaths {
    pub fn from_config(config: &EdgeCoreConfig) -> Self {
        let hub = &config.modules.edge_hub;
        CertPaths {
            ca_file: hub.tls_ca_file.clone(),
            cert_file: hub.tls_cert_file.clone(),
            key_file: hub.tls_private_key_file.clone(),
            http_server: hub.http_server.clone(),
            node_name: config.node_name().to_string(),
        }
    }

    fn certs_load(&self) -> Result<(), String> {
        let chain = tls::load_certs(Path::new(&self.cert_file)).map_err(|e| e.to_string())?;
        let key = tls::load_key(Path::new(&self.key_file)).map_err(|e| e.to_string())?;
        let provider = rustls::crypto::ring::default_provider();
        provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| format!("{}: {e}", self.key_file))?;
        if chain.is_empty() {
            return Err(format!("{}: no certificate", self.cert_file));
        }
        Ok(())
    }
}

/// Obtains the edge certificate with the token when the files do not load (one attempt
/// with retries of transient failures until `deadline`), then removes the token from
/// `config_path` if given.
pub async fn bootstrap_if_needed(
    config: &EdgeCoreConfig,
    config_path: Option<&Path>,
    deadline: Duration,
) -> Result<(), CertError> {
    let paths = CertPaths::from_config(config);
    let why = match paths.certs_load() {
        Ok(()) => return Ok(()),
        Err(why) => why,
    };
    let token = config.modules.edge_hub.token.trim();
    if token.is_empty() {
        return Err(CertError::NoToken(why));
    }
    tracing::info!(reason = %why, server = %paths.http_server, node = %paths.node_name,
        "no usable edge certificate; joining with the token");
    let give_up = tokio::time::Instant::now() + deadline;
    let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(32));
    loop {
        match bootstrap(&paths, token).await {
            Ok(()) => break,
            Err(e)
                if e.is_transient() && tokio::time::Instant::now() + backoff.peek() < give_up =>
            {
                let delay = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?delay, "certificate bootstrap failed; retrying");
                tokio::time::sleep(delay).await;
            }
            Err(e) => return Err(e),
        }
    }
    if let Some(path) = config_path
        && let Err(e) = remove_token(path, token)
    {
        tracing::warn!(path = %path.display(), error = %e,
            "joined, but cannot remove the token from the config file (it is not needed again)");
    }
    Ok(())
}

/// One bootstrap attempt with `token` (all four parts).
pub async fn bootstrap(paths: &CertPaths, token: &str) -> Result<(), CertError> {
    let (hash, jwt) = token::split(token).map_err(CertError::BadToken)?;
    let (status, body) = client::get(
        &paths.http_server,
        "/ca.crt",
        client::insecure_config()?,
        &[],
        Vec::new(),
        REQUEST_TIMEOUT,
    )
    .await?;
    if status != StatusCode::OK {
        return Err(CertError::Refused {
            status,
            message: String::from_utf8_lossy(&body).trim().to_string(),
            hint: "",
        });
    }
    let actual = token::ca_hash(&body);
    if !actual.eq_ignore_ascii_case(hash) {
        return Err(CertError::CaMismatch {
            server: paths.http_server.clone(),
            expected: hash.to_string(),
            actual,
        });
    }
    let ca = CertificateDer::from(body.to_vec());
    write_file(
        &paths.ca_file,
        pki::pem_encode("CERTIFICATE", &ca).as_bytes(),
        0o644,
    )?;
    tracing::info!(ca = %paths.ca_file, "downloaded the cloud's CA (hash matches the token)");
    request_certificate(
        paths,
        &ca,
        None,
        &[("Authorization", format!("Bearer {jwt}"))],
    )
    .await?;
    tracing::info!(cert = %paths.cert_file, node = %paths.node_name, "obtained the edge certificate");
    Ok(())
}

/// Renews the certificate presenting the current one (rotation).
pub async fn rotate(paths: &CertPaths) -> Result<(), CertError> {
    let ca = tls::load_certs(Path::new(&paths.ca_file))
        .map_err(|e| CertError::BadAnswer {
            what: "a CA file",
            detail: e.to_string(),
        })?
        .remove(0);
    let chain = tls::load_certs(Path::new(&paths.cert_file)).map_err(|e| CertError::BadAnswer {
        what: "a certificate file",
        detail: e.to_string(),
    })?;
    let key = tls::load_key(Path::new(&paths.key_file)).map_err(|e| CertError::BadAnswer {
        what: "a key file",
        detail: e.to_string(),
    })?;
    request_certificate(paths, &ca, Some((chain, key)), &[]).await
}

async fn request_certificate(
    paths: &CertPaths,
    ca: &CertificateDer<'static>,
    client_cert: Option<(
        Vec<CertificateDer<'static>>,
        rustls_pki_types::PrivateKeyDer<'static>,
    )>,
    extra: &[(&str, String)],
) -> Result<(), CertError> {
    let (csr, key) = pki::node_csr(&paths.node_name)?;
    let mut headers = vec![("NodeName", paths.node_name.clone())];
    headers.extend(extra.iter().cloned());
    let (status, body) = client::get(
        &paths.http_server,
        "/edge.crt",
        client::verified_config(ca, client_cert)?,
        &headers,
        csr,
        REQUEST_TIMEOUT,
    )
    .await?;
    if status != StatusCode::OK {
        let hint = match status.as_u16() {
            400 | 401 => {
                "\n  the token is wrong or expired: get a fresh one with `keadm gettoken` on the cloud"
            }
            403 => "\n  check modules.edged.hostnameOverride (the node name)",
            _ => "",
        };
        return Err(CertError::Refused {
            status,
            message: String::from_utf8_lossy(&body).trim().to_string(),
            hint,
        });
    }
    if pki::cert_validity(&body).is_none() {
        return Err(CertError::BadAnswer {
            what: "a certificate",
            detail: format!("{} bytes that are not a DER certificate", body.len()),
        });
    }
    let key_pem = pki::pem_encode("EC PRIVATE KEY", &pki::sec1_der(&key)?);
    write_file(&paths.key_file, key_pem.as_bytes(), 0o600)?;
    write_file(
        &paths.cert_file,
        pki::pem_encode("CERTIFICATE", &body).as_bytes(),
        0o644,
    )?;
    Ok(())
}

pub(crate) fn write_file(path: &str, data: &[u8], mode: u32) -> Result<(), CertError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| CertError::Write {
        path: path.to_string(),
        source,
    };
    let p = Path::new(path);
    if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    // Write beside and rename, so a crash never leaves half a file.
    let tmp = p.with_extension("tmp-kubeedge-rs");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(data).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, p).map_err(err)
}

/// Rewrites the config file with the `token:` value emptied (KubeEdge clears it after a
/// join). The value may be plain, quoted or a folded block spread over several lines.
pub(crate) fn remove_token(path: &Path, token: &str) -> std::io::Result<()> {
    let text = std::fs::read_to_string(path)?;
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    let mut changed = false;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let Some(rest) = line.trim_start().strip_prefix("token:") else {
            out.push(line.to_string());
            i += 1;
            continue;
        };
        let mut end = i + 1;
        while end < lines.len()
            && !lines[end].trim().is_empty()
            && indent(lines[end]) > indent(line)
        {
            end += 1;
        }
        let value: String = std::iter::once(rest)
            .chain(lines[i + 1..end].iter().copied())
            .collect::<String>()
            .chars()
            .filter(|c| !c.is_whitespace() && !matches!(c, '"' | '\'' | '>' | '|' | '-'))
            .collect();
        let wanted: String = token.chars().filter(|c| *c != '-').collect();
        if value == wanted {
            out.push(format!("{}token: \"\"", &line[..indent(line)]));
            changed = true;
            i = end;
        } else {
            out.push(line.to_string());
            i += 1;
        }
    }
    if !changed {
        return Ok(());
    }
    let mut new = out.join("\n");
    if text.ends_with('\n') {
        new.push('\n');
    }
    let tmp = path.with_extension("tmp-kubeedge-rs");
    std::fs::write(&tmp, new)?;
    std::fs::rename(tmp, path)?;
    tracing::info!(path = %path.display(), "removed the join token from the config file");
    Ok(())
}

/// Renews the certificate at a random 70–90 % of its lifetime (retrying with backoff) and
/// gives `hub` the new TLS configuration, until `shutdown`.
pub(crate) fn spawn_rotation(config: &EdgeCoreConfig, hub: EdgeHub, shutdown: CancellationToken) {
    let paths = CertPaths::from_config(config);
    let config = config.clone();
    tokio::spawn(async move {
        loop {
            let wait = match next_rotation(&paths) {
                Some(w) => w,
                None => {
                    tracing::warn!(cert = %paths.cert_file, "cannot read the edge certificate's validity; not rotating it");
                    return;
                }
            };
            tracing::info!(in_secs = wait.as_secs(), "next edge certificate rotation");
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.cancelled() => return,
            }
            let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(32));
            loop {
                match rotate(&paths).await {
                    Ok(()) => break,
                    Err(e) => {
                        let delay = backoff.next_delay();
                        tracing::warn!(error = %e, retry_in = ?delay, "edge certificate rotation failed");
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = shutdown.cancelled() => return,
                        }
                    }
                }
            }
            match crate::tls_files::load_tls(&config) {
                Ok(tls) => {
                    tracing::info!(cert = %paths.cert_file, "rotated the edge certificate; reconnecting with it");
                    hub.set_tls_config(tls);
                }
                Err(e) => tracing::error!(error = %e, "rotated certificate does not load"),
            }
        }
    });
}

/// Time until a random point at 70–90 % of the current certificate's lifetime.
fn next_rotation(paths: &CertPaths) -> Option<Duration> {
    let cert = tls::load_certs(Path::new(&paths.cert_file)).ok()?.remove(0);
    let (not_before, not_after) = pki::cert_validity(&cert)?;
    let lifetime = (not_after - not_before).max(0) as f64;
    let at = not_before as f64 + lifetime * rand::random_range(0.7..0.9);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    Some(Duration::from_secs_f64((at - now).max(0.0)))
}

#[cfg(test)]
mod tests {
    use super::remove_token;

    #[test]
    fn token_is_removed_from_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edgecore.yaml");
        std::fs::write(
            &path,
            "modules:\n  edgeHub:\n    token: abc.def.ghi.jkl\n    httpServer: https://x:10002\n",
        )
        .unwrap();
        remove_token(&path, "abc.def.ghi.jkl").unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "modules:\n  edgeHub:\n    token: \"\"\n    httpServer: https://x:10002\n"
        );
        // A folded block scalar, as YAML emitters write long strings.
        std::fs::write(
            &path,
            "edgeHub:\n  token: >-\n    abc.def.ghi.jkl\n  rotateCertificates: true\n",
        )
        .unwrap();
        remove_token(&path, "abc.def.ghi.jkl").unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "edgeHub:\n  token: \"\"\n  rotateCertificates: true\n"
        );
        // Another token is left alone.
        remove_token(&path, "x.y.z.w").unwrap();
    }
}
