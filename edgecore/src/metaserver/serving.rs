//! The MetaServer's HTTPS serving certificate (KubeEdge v1.17 with `requireAuthorization`,
//! devices reference §6.2): the cluster CA is asked of the cloud (`k8s/ca.crt`) and a
//! `kubernetes.io/kubelet-serving` CertificateSigningRequest for `system:node:<node>` with
//! the listeners' IPs is sent through the cloud (`default/certificatesigningrequest/…`),
//! which approves it; the cluster's signer issues it. Pods trust it through the CA in their
//! service-account volume, as they trust the apiserver.
//!
//! Key and certificate live in `<pki>/metaserver-current.pem` (as client-go's certificate
//! store keeps them) and are loaded at start, so an edge that restarts offline serves at
//! once; a new certificate is requested when 80 % of the lifetime has passed.

use crate::edgehub::CloudLink;
use crate::edgehub::LinkEvent;
use base64::Engine;
use kubeedge_shared::backoff::Backoff;
use kubeedge_shared::operation::source;
use kubeedge_shared::{Group, Message, Operation, content, pki};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use serde_json::{Value, json};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub const SIGNER: &str = "kubernetes.io/kubelet-serving";
const PAIR_FILE: &str = "metaserver-current.pem";
const CA_FILE: &str = "ca.crt";
/// How long one CSR is waited for (KubeEdge: 4 minutes).
const ISSUE_DEADLINE: Duration = Duration::from_secs(240);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The certificate the listeners present; empty until one is loaded or issued.
#[derive(Debug)]
pub struct ServingCert {
    dir: PathBuf,
    current: RwLock<Option<(Arc<CertifiedKey>, i64, i64)>>,
    /// The stored certificate does not name every listener address (the config changed):
    /// it is served until a new one is issued, which is asked for at once.
    stale: std::sync::atomic::AtomicBool,
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.read().map(|(k, _, _)| k)
    }
}

use kubeedge_shared::clock::unix_now as now;

impl ServingCert {
    /// Loads `<dir>/metaserver-current.pem` when it holds a usable, unexpired pair; one that
    /// does not name every address in `ips` is replaced as soon as the cloud answers.
    pub fn new(dir: PathBuf, ips: &[IpAddr]) -> Arc<Self> {
        let sc = Arc::new(ServingCert {
            dir,
            current: RwLock::new(None),
            stale: Default::default(),
        });
        match load_pair(&sc.dir.join(PAIR_FILE)) {
            Ok(Some(pair)) if pair.2 > now() => {
                let named = pair
                    .0
                    .cert
                    .first()
                    .map(|c| pki::cert_ip_sans(c))
                    .unwrap_or_default();
                tracing::info!(path = %sc.dir.join(PAIR_FILE).display(), "MetaServer serving certificate loaded");
                sc.set(pair);
                if ips.iter().any(|ip| !named.contains(ip)) {
                    tracing::info!(?named, wanted = ?ips, "the stored MetaServer certificate names other addresses; a new one is requested");
                    sc.stale.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "stored MetaServer serving certificate unusable; a new one is requested")
            }
        }
        sc
    }

    fn read(&self) -> Option<(Arc<CertifiedKey>, i64, i64)> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set(&self, pair: (Arc<CertifiedKey>, i64, i64)) {
        self.stale
            .store(false, std::sync::atomic::Ordering::Relaxed);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(pair);
    }

    /// When a new certificate is due: at 80 % of the current one's lifetime, or now.
    pub(super) fn renew_at(&self) -> i64 {
        if self.stale.load(std::sync::atomic::Ordering::Relaxed) {
            return 0;
        }
        match self.read() {
            Some((_, from, to)) => from + (to - from) * 4 / 5,
            None => 0,
        }
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir.join(CA_FILE)
    }
}

type Pair = (Arc<CertifiedKey>, i64, i64);

fn load_pair(path: &Path) -> Result<Option<Pair>, String> {
    if !path.exists() {
        return Ok(None);
    }
    let chain = kubeedge_shared::tls::load_certs(path).map_err(|e| e.to_string())?;
    let key = kubeedge_shared::tls::load_key(path).map_err(|e| e.to_string())?;
    let first = chain.first().ok_or("no certificate in the file")?;
    let (from, to) = pki::cert_validity(first).ok_or("the certificate does not parse")?;
    let signing = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("the key is not usable: {e}"))?;
    Ok(Some((
        Arc::new(CertifiedKey::new(chain, signing)),
        from,
        to,
    )))
}

/// Written beside and renamed, mode 0600 (the certificate manager's writer).
fn write_private(path: &Path, data: &[u8]) -> Result<(), String> {
    crate::certmanager::write_file(&path.to_string_lossy(), data, 0o600).map_err(|e| e.to_string())
}

/// Keeps a valid certificate in `sc`: requests one when there is none or it is due,
/// retrying (with back-off up to 5 minutes) while the cloud is away or refuses.
pub async fn run<L: CloudLink>(
    sc: Arc<ServingCert>,
    link: L,
    node: String,
    ips: Vec<IpAddr>,
    cancel: CancellationToken,
) {
    let mut backoff = Backoff::new(Duration::from_secs(5), Duration::from_secs(300));
    loop {
        let wait = (sc.renew_at() - now()).max(0) as u64;
        if wait > 0 {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(wait)) => {}
            }
        }
        let attempt = async {
            wait_connected(&link).await;
            obtain(&sc, &link, &node, &ips).await
        };
        let result = tokio::select! {
            _ = cancel.cancelled() => return,
            r = attempt => r,
        };
        match result {
            Ok(()) => backoff.reset(),
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?delay,
                    "no MetaServer serving certificate yet; HTTPS clients are refused until one is issued");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

async fn wait_connected<L: CloudLink>(link: &L) {
    let mut events = link.subscribe();
    while !link.is_connected() {
        match events.recv().await {
            Ok(LinkEvent::Connected) => return,
            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

async fn ask<L: CloudLink>(
    link: &L,
    op: Operation,
    resource: &str,
    body: Value,
) -> Result<Value, String> {
    let msg = Message::new(source::METAMANAGER, Group::Meta, op, resource, body);
    let reply = link
        .request(msg, REQUEST_TIMEOUT)
        .await
        .map_err(|e| format!("{resource}: {e}"))?;
    match &reply.content {
        // The CA comes as a PEM string (KubeEdge fills the body with a Go string).
        Value::String(s) if s.contains("-----BEGIN") => Ok(reply.content.clone()),
        c => content::content_json(c).map_err(|e| format!("{resource}: answer is not JSON: {e}")),
    }
}

/// An error Status (`{"ErrStatus": …}` or a bare Status) in an answer.
fn failure(v: &Value) -> Option<String> {
    let st = if v["ErrStatus"].is_object() {
        &v["ErrStatus"]
    } else {
        v
    };
    (st["kind"] == "Status" && st["status"] == "Failure" || st["code"].as_i64().unwrap_or(0) >= 400)
        .then(|| st["message"].as_str().unwrap_or("refused").to_string())
}

async fn obtain<L: CloudLink>(
    sc: &ServingCert,
    link: &L,
    node: &str,
    ips: &[IpAddr],
) -> Result<(), String> {
    let ca = ask(link, Operation::Query, "k8s/ca.crt", Value::Null).await?;
    match ca.as_str() {
        Some(pem) if pem.contains("BEGIN CERTIFICATE") => {
            write_private(&sc.ca_path(), pem.as_bytes())?;
        }
        _ => {
            return Err(format!(
                "the cloud did not send the cluster CA: {}",
                failure(&ca).unwrap_or_else(|| ca.to_string())
            ));
        }
    }
    let (csr_pem, key) = pki::serving_csr(node, ips).map_err(|e| e.to_string())?;
    let csr = json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "csr-"},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(csr_pem),
            "signerName": SIGNER,
            "usages": ["digital signature", "key encipherment", "server auth"],
        },
    });
    let resource = format!("default/certificatesigningrequest/metaserver-csr-{node}");
    let created = ask(link, Operation::Insert, &resource, csr).await?;
    if let Some(why) = failure(&created["Err"]).filter(|_| !created["Object"].is_object()) {
        return Err(format!("certificate signing request refused: {why}"));
    }
    let name = created["Object"]["metadata"]["name"]
        .as_str()
        .ok_or("the cloud's answer names no CertificateSigningRequest")?
        .to_string();
    tracing::info!(csr = %name, "MetaServer serving certificate requested");
    let deadline = tokio::time::Instant::now() + ISSUE_DEADLINE;
    let query = format!("default/certificatesigningrequest/{name}");
    let cert_pem = loop {
        let got = ask(link, Operation::Query, &query, Value::Null).await?;
        let got = match got {
            Value::Array(mut items) if !items.is_empty() => items.swap_remove(0),
            other => other,
        };
        if let Some(why) = failure(&got) {
            return Err(format!("reading {name}: {why}"));
        }
        if let Some(c) = got["status"]["conditions"].as_array().and_then(|cs| {
            cs.iter()
                .find(|c| matches!(c["type"].as_str(), Some("Denied" | "Failed")))
        }) {
            return Err(format!(
                "{name} was {}: {}",
                c["type"].as_str().unwrap_or_default().to_lowercase(),
                c["message"].as_str().unwrap_or_default()
            ));
        }
        if let Some(b64) = got["status"]["certificate"]
            .as_str()
            .filter(|s| !s.is_empty())
        {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| format!("{name}: certificate is not base64: {e}"))?;
            break String::from_utf8(bytes)
                .map_err(|_| format!("{name}: certificate is not PEM"))?;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "{name} was not issued within {ISSUE_DEADLINE:?} (is a signer for {SIGNER} running?)"
            ));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let mut file = key.serialize_pem();
    file.push_str(&cert_pem);
    let path = sc.dir.join(PAIR_FILE);
    write_private(&path, file.as_bytes())?;
    let pair = load_pair(&path)?.ok_or("the issued certificate was not stored")?;
    tracing::info!(csr = %name, not_after = pair.2, "MetaServer serving certificate issued");
    sc.set(pair);
    Ok(())
}
