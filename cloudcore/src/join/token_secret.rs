//! The join token in Secret `kubeedge/tokensecret` (`tokendata`), as KubeEdge keeps it
//! (protocol §6.2): `hex(sha256(CA DER)).<HS256 JWT {"exp": now + 2 × tokenRefreshDuration}>`,
//! renewed every `tokenRefreshDuration`.
//!
//! Every replica runs [`run`]; they agree without a leader: a replica rewrites the Secret only
//! when the token in it is missing, not for this CA, or older than `tokenRefreshDuration`, and
//! every write carries the `resourceVersion` it read (create: 409 when another replica was
//! first). The loser of a race re-reads and finds a fresh token, so a token is written once
//! per period however many replicas run.

use super::JoinMetrics;
use crate::certs::NAMESPACE;
use anyhow::Context;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kubeedge_shared::pki::CertificateAuthority;
use kubeedge_shared::token;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub const TOKEN_SECRET: &str = "tokensecret";
pub const TOKEN_KEY: &str = "tokendata";

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The token stored in `secret`, when it is for this CA, valid, and was issued less than
/// `refresh` ago: how long until it is due for renewal.
fn fresh_for(secret: &Secret, ca: &CertificateAuthority, refresh: Duration) -> Option<Duration> {
    let raw = secret.data.as_ref()?.get(TOKEN_KEY)?;
    let text = std::str::from_utf8(&raw.0).ok()?;
    let (hash, jwt) = token::split(text).ok()?;
    if hash != token::ca_hash(&ca.cert.cert_der) {
        return None;
    }
    let now = now_unix();
    let exp = token::verify_jwt(jwt, &ca.key_der, now).ok()?;
    // exp = issued + 2 × refresh: due once exp - now <= refresh.
    let left = exp - now - refresh.as_secs() as i64;
    (left > 0).then(|| Duration::from_secs(left as u64))
}

/// The join token in Secret `kubeedge/tokensecret` (`keadm gettoken`); an error says what to do
/// when there is none.
pub async fn read(client: kube::Client) -> anyhow::Result<String> {
    let secrets: Api<Secret> = Api::namespaced(client, NAMESPACE);
    let secret = secrets
        .get_opt(TOKEN_SECRET)
        .await
        .with_context(|| format!("reading Secret {NAMESPACE}/{TOKEN_SECRET}"))?
        .with_context(|| {
            format!(
                "Secret {NAMESPACE}/{TOKEN_SECRET} does not exist: cloudcore creates it when it \
                 starts; is cloudcore running in this cluster?"
            )
        })?;
    let token = secret
        .data
        .as_ref()
        .and_then(|d| d.get(TOKEN_KEY))
        .map(|b| String::from_utf8_lossy(&b.0).trim().to_string())
        .filter(|t| !t.is_empty())
        .with_context(|| {
            format!("Secret {NAMESPACE}/{TOKEN_SECRET} has no {TOKEN_KEY}: restart cloudcore to write one")
        })?;
    Ok(token)
}

/// Makes sure Secret `kubeedge/tokensecret` holds a fresh token for `ca`; returns the token
/// and how long until it is due for renewal.
pub async fn ensure(
    secrets: &Api<Secret>,
    ca: &CertificateAuthority,
    refresh: Duration,
    metrics: &JoinMetrics,
) -> anyhow::Result<(String, Duration)> {
    for _ in 0..5 {
        let existing = secrets
            .get_opt(TOKEN_SECRET)
            .await
            .context("reading Secret kubeedge/tokensecret")?;
        if let Some(s) = &existing
            && let Some(due) = fresh_for(s, ca, refresh)
        {
            let text = s
                .data
                .as_ref()
                .and_then(|d| d.get(TOKEN_KEY))
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .unwrap_or_default();
            return Ok((text, due));
        }
        let exp = now_unix() + 2 * refresh.as_secs() as i64;
        let tok = token::generate(&ca.cert.cert_der, &ca.key_der, exp);
        let data = [(TOKEN_KEY.to_string(), ByteString(tok.clone().into_bytes()))].into();
        let result = match existing {
            Some(mut s) => {
                // resourceVersion from the read: a concurrent writer makes this a 409.
                s.data = Some(data);
                secrets
                    .replace(TOKEN_SECRET, &PostParams::default(), &s)
                    .await
            }
            None => {
                let s = Secret {
                    metadata: ObjectMeta {
                        // The namespace comes from `secrets` (kubeedge in cloudcore).
                        name: Some(TOKEN_SECRET.into()),
                        ..Default::default()
                    },
                    data: Some(data),
                    type_: Some("Opaque".into()),
                    ..Default::default()
                };
                secrets.create(&PostParams::default(), &s).await
            }
        };
        match result {
            Ok(_) => {
                metrics.tokens_written.inc();
                tracing::info!(exp, "wrote a new join token to Secret kubeedge/tokensecret");
                return Ok((tok, refresh));
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!("another replica wrote the join token first; re-reading");
            }
            Err(e) => {
                return Err(e).context(
                    "writing Secret kubeedge/tokensecret (may cloudcore write secrets in namespace kubeedge?)",
                );
            }
        }
    }
    anyhow::bail!("Secret kubeedge/tokensecret keeps changing under us; will retry")
}

/// Keeps the token fresh until `shutdown`.
pub async fn run(
    client: kube::Client,
    ca: std::sync::Arc<CertificateAuthority>,
    refresh: Duration,
    metrics: JoinMetrics,
    shutdown: CancellationToken,
) {
    let secrets: Api<Secret> = Api::namespaced(client, NAMESPACE);
    loop {
        let wait = match ensure(&secrets, &ca, refresh, &metrics).await {
            Ok((_, due)) => due.clamp(Duration::from_secs(1), refresh),
            Err(e) => {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "cannot refresh the join token; retrying in 10 s"
                );
                Duration::from_secs(10)
            }
        };
        // A little jitter so replicas do not wake in lockstep.
        let wait = wait + Duration::from_millis(rand_ms());
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Up to a second, from the standard library's per-process random hasher keys.
fn rand_ms() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i64(now_unix());
    h.finish() % 1000
}
