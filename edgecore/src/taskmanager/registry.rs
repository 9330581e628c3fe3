//! A registry client (Docker registry v2 / OCI distribution) just large enough for a node
//! upgrade: resolve `<image>:<version>` for this machine's platform, check the platform
//! manifest's digest, download each layer into a file while checking its digest and size,
//! and take one file out of the layers (later layers win; whiteouts remove it).
//!
//! Anonymous pulls, with the registry's bearer-token challenge (as Docker Hub asks); HTTPS
//! verified against the system's roots, plain HTTP only for a registry on loopback. Every
//! answer is size-limited; nothing from the job reaches a command line.

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest manifest or index read.
const MAX_MANIFEST: usize = 4 << 20;
/// Largest layer downloaded.
const MAX_LAYER: u64 = 2 << 30;
/// Largest file taken out of a layer.
const MAX_FILE: u64 = 512 << 20;
/// Largest token answer.
const MAX_TOKEN: usize = 64 << 10;

const ACCEPT_MANIFESTS: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// An image reference split for the registry API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// As written (`docker.io` when none was).
    pub host: String,
    pub repository: String,
    pub tag: String,
}

impl ImageRef {
    /// `image` (a repository; a tag or digest in it is replaced by `tag`, as KubeEdge does)
    /// with `tag`.
    pub fn new(image: &str, tag: &str) -> Result<ImageRef, String> {
        let repo = image.split('@').next().unwrap_or_default();
        let repo = match repo.rsplit_once('/') {
            Some((head, last)) => match last.split_once(':') {
                Some((name, _)) => format!("{head}/{name}"),
                None => repo.to_string(),
            },
            None => repo.split(':').next().unwrap_or_default().to_string(),
        };
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.iter().any(|p| p.is_empty()) || tag.is_empty() {
            return Err(format!("{image:?} is not an image repository"));
        }
        let first = parts[0];
        let (host, path) = if parts.len() > 1
            && (first.contains('.') || first.contains(':') || first == "localhost")
        {
            (first.to_string(), parts[1..].join("/"))
        } else if parts.len() == 1 {
            ("docker.io".to_string(), format!("library/{first}"))
        } else {
            ("docker.io".to_string(), repo.clone())
        };
        Ok(ImageRef {
            host,
            repository: path,
            tag: tag.to_string(),
        })
    }

    /// Where the registry API answers (Docker Hub's is not `docker.io`).
    fn api_url(&self, path: &str) -> Result<Url, String> {
        let host = match self.host.as_str() {
            "docker.io" | "index.docker.io" => "registry-1.docker.io",
            h => h,
        };
        let scheme = if is_loopback(host) { "http" } else { "https" };
        Url::parse(&format!("{scheme}://{host}{path}"))
    }
}

impl std::fmt::Display for ImageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}:{}", self.host, self.repository, self.tag)
    }
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
fn is_loopback(host_port: &str) -> bool {
    let host = match host_port.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host_port.split(':').next().unwrap_or_default(),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// This machine's architecture as OCI names it.
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

#[derive(Debug, Clone)]
struct Url {
    https: bool,
    host: String,
    port: u16,
    /// Path and query.
    path: String,
}

impl Url {
    fn parse(s: &str) -> Result<Url, String> {
        let (https, rest) = if let Some(r) = s.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = s.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(format!("{s:?} is not an http(s) URL"));
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let default = if https { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("bad host in {s:?}"))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| format!("bad port in {s:?}"))?,
                None => default,
            };
            (h.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (
                    h.to_string(),
                    p.parse().map_err(|_| format!("bad port in {s:?}"))?,
                ),
                None => (authority.to_string(), default),
            }
        };
        if host.is_empty() {
            return Err(format!("no host in {s:?}"));
        }
        let path = if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_string()
        };
        Ok(Url {
            https,
            host,
            port,
            path,
        })
    }

    /// Plain HTTP only to loopback.
    fn check_plain_http(&self) -> Result<(), String> {
        if self.https || is_loopback(&self.host) {
            Ok(())
        } else {
            Err(format!(
                "refused plain HTTP to {}: registries off this host are reached over HTTPS",
                self.host
            ))
        }
    }

    /// Same scheme, host and port.
    fn same_origin(&self, other: &Url) -> bool {
        self.https == other.https && self.host == other.host && self.port == other.port
    }

    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// A `Location` answer relative to this URL; never from HTTPS down to plain HTTP off
    /// loopback.
    fn join(&self, location: &str) -> Result<Url, String> {
        if location.starts_with("http://") || location.starts_with("https://") {
            let next = Url::parse(location)?;
            next.check_plain_http()?;
            if self.https && !next.https && !is_loopback(&next.host) {
                return Err(format!("refused redirect from HTTPS to {location:?}"));
            }
            return Ok(next);
        }
        if !location.starts_with('/') {
            return Err(format!("unsupported redirect {location:?}"));
        }
        Ok(Url {
            path: location.to_string(),
            ..self.clone()
        })
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One image pull's connection settings and token.
pub struct Client {
    tls: Arc<rustls::ClientConfig>,
    token: Option<String>,
}

/// The system's trust roots for registries.
pub fn system_tls() -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for cert in found.certs {
        let _ = roots.add(cert);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    ))
}

/// A layer or manifest descriptor.
#[derive(Debug, Clone, Deserialize)]
pub struct Descriptor {
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    pub digest: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Debug, Clone, Deserialize)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

/// The image for this platform: its manifest's digest (and the index's, for a multi-platform
/// tag) and its layers.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub digest: String,
    pub index_digest: Option<String>,
    pub layers: Vec<Descriptor>,
}

impl Client {
    pub fn new(tls: Arc<rustls::ClientConfig>) -> Client {
        Client { tls, token: None }
    }

    async fn send(
        &self,
        url: &Url,
        accept: &str,
        auth: bool,
    ) -> Result<http::Response<Incoming>, String> {
        let addr = url.authority();
        let tcp = TcpStream::connect((url.host.as_str(), url.port))
            .await
            .map_err(|e| format!("cannot reach {addr}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let io: Box<dyn Io> = if url.https {
            let name = ServerName::try_from(url.host.clone())
                .map_err(|_| format!("{} is not a valid server name", url.host))?;
            let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS with {addr}: {e}"))?;
            Box::new(tls)
        } else {
            Box::new(tcp)
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| format!("HTTP with {addr}: {e}"))?;
        // Ends with the connection, once the body is read or dropped.
        tokio::spawn(conn);
        let mut req = Request::builder()
            .method(Method::GET)
            .uri(url.path.as_str())
            .header(header::HOST, addr.as_str())
            .header(header::USER_AGENT, "kubeedge-rs-edgecore")
            .header(header::ACCEPT, accept);
        if auth && let Some(t) = &self.token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
        sender
            .send_request(req)
            .await
            .map_err(|e| format!("GET {} from {addr}: {e}", url.path))
    }

    /// GET, following redirects (without the token off the registry's host) and answering one
    /// bearer challenge.
    async fn get(&mut self, url: Url, accept: &str) -> Result<http::Response<Incoming>, String> {
        let origin = url.clone();
        let mut url = url;
        let mut challenged = false;
        for _ in 0..8 {
            // The token goes only to the registry itself (not to a CDN it redirects to).
            let resp = self.send(&url, accept, url.same_origin(&origin)).await?;
            let status = resp.status();
            if status.is_redirection() {
                let loc = resp
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| format!("{status} without a Location"))?;
                url = url.join(loc)?;
                continue;
            }
            if status == StatusCode::UNAUTHORIZED && !challenged {
                challenged = true;
                let challenge = resp
                    .headers()
                    .get(header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                self.token = Some(self.fetch_token(&challenge).await?);
                continue;
            }
            return Ok(resp);
        }
        Err("too many redirects".into())
    }

    async fn fetch_token(&mut self, challenge: &str) -> Result<String, String> {
        let Some(params) = challenge.strip_prefix("Bearer ") else {
            return Err(format!(
                "the registry asks for credentials ({challenge:?}); node upgrades pull anonymously"
            ));
        };
        let params = parse_challenge(params);
        let realm = params
            .iter()
            .find(|(k, _)| k == "realm")
            .map(|(_, v)| v.clone())
            .ok_or("the registry's challenge names no realm")?;
        let mut url = Url::parse(&realm)?;
        url.check_plain_http()?;
        let query: Vec<String> = params
            .iter()
            .filter(|(k, _)| k == "service" || k == "scope")
            .map(|(k, v)| format!("{k}={}", percent_encode(v)))
            .collect();
        if !query.is_empty() {
            let sep = if url.path.contains('?') { '&' } else { '?' };
            url.path = format!("{}{sep}{}", url.path, query.join("&"));
        }
        let resp = self.send(&url, "application/json", false).await?;
        if !resp.status().is_success() {
            return Err(format!(
                "the registry's token service answered {}",
                resp.status()
            ));
        }
        let body = read_limited(resp, MAX_TOKEN).await?;
        let v: Value = serde_json::from_slice(&body).map_err(|e| format!("token answer: {e}"))?;
        v["token"]
            .as_str()
            .or(v["access_token"].as_str())
            .map(str::to_string)
            .ok_or_else(|| "the token answer holds no token".into())
    }

    /// The manifest at `reference` (tag or digest): its digest and JSON.
    async fn manifest(
        &mut self,
        image: &ImageRef,
        reference: &str,
    ) -> Result<(String, Value), String> {
        let url = image.api_url(&format!("/v2/{}/manifests/{reference}", image.repository))?;
        let resp = self.get(url, ACCEPT_MANIFESTS).await?;
        if !resp.status().is_success() {
            return Err(format!("manifest of {image}: HTTP {}", resp.status()));
        }
        let body = read_limited(resp, MAX_MANIFEST).await?;
        let digest = sha256_of(&body);
        if reference.starts_with("sha256:") && digest != reference {
            return Err(format!(
                "manifest {reference} of {image} arrived with digest {digest}"
            ));
        }
        let v = serde_json::from_slice(&body).map_err(|e| format!("manifest of {image}: {e}"))?;
        Ok((digest, v))
    }

    /// The manifest for `linux/<this arch>` (through an index when the tag names one).
    pub async fn resolve(&mut self, image: &ImageRef) -> Result<Resolved, String> {
        let (mut digest, mut v) = self.manifest(image, &image.tag).await?;
        let mut index_digest = None;
        if v["manifests"].is_array() {
            index_digest = Some(digest.clone());
            let list: Vec<Descriptor> = serde_json::from_value(v["manifests"].clone())
                .map_err(|e| format!("index of {image}: {e}"))?;
            let arch = oci_arch();
            let pick = list
                .iter()
                .find(|d| {
                    d.platform
                        .as_ref()
                        .is_some_and(|p| p.os == "linux" && p.architecture == arch)
                })
                .ok_or_else(|| format!("{image} has no linux/{arch} image"))?;
            let wanted = pick.digest.clone();
            (digest, v) = self.manifest(image, &wanted).await?;
        }
        if v["schemaVersion"].as_i64() != Some(2) || !v["layers"].is_array() {
            return Err(format!(
                "{image}: not an image manifest of schema 2 (Docker v2 or OCI)"
            ));
        }
        let layers = serde_json::from_value(v["layers"].clone())
            .map_err(|e| format!("layers of {image}: {e}"))?;
        Ok(Resolved {
            digest,
            index_digest,
            layers,
        })
    }

    /// Downloads blob `d` of `image` to `to`, checking its size and digest.
    pub async fn download(
        &mut self,
        image: &ImageRef,
        d: &Descriptor,
        to: &Path,
    ) -> Result<(), String> {
        if !d.digest.starts_with("sha256:") {
            return Err(format!(
                "layer digest {:?}: only sha256 is supported",
                d.digest
            ));
        }
        if d.size > MAX_LAYER {
            return Err(format!(
                "layer {} is {} bytes, over {MAX_LAYER}",
                d.digest, d.size
            ));
        }
        let url = image.api_url(&format!("/v2/{}/blobs/{}", image.repository, d.digest))?;
        let resp = self.get(url, "*/*").await?;
        if !resp.status().is_success() {
            return Err(format!(
                "layer {} of {image}: HTTP {}",
                d.digest,
                resp.status()
            ));
        }
        let mut body = resp.into_body();
        let mut file = tokio::fs::File::create(to)
            .await
            .map_err(|e| format!("{}: {e}", to.display()))?;
        let mut hash = Sha256::new();
        let mut got: u64 = 0;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("layer {}: {e}", d.digest))?;
            if let Ok(data) = frame.into_data() {
                got += data.len() as u64;
                if got > d.size {
                    return Err(format!(
                        "layer {} is longer than its {} bytes",
                        d.digest, d.size
                    ));
                }
                hash.update(&data);
                file.write_all(&data)
                    .await
                    .map_err(|e| format!("{}: {e}", to.display()))?;
            }
        }
        file.flush().await.map_err(|e| e.to_string())?;
        let digest = hex_digest(hash);
        if got != d.size || digest != d.digest {
            return Err(format!(
                "layer {} arrived as {got} bytes with digest {digest}",
                d.digest
            ));
        }
        Ok(())
    }
}

async fn read_limited(resp: http::Response<Incoming>, max: usize) -> Result<Bytes, String> {
    Limited::new(resp.into_body(), max)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| format!("reading the answer (at most {max} bytes): {e}"))
}

fn hex_digest(h: Sha256) -> String {
    let mut s = String::from("sha256:");
    for b in h.finalize() {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

pub fn sha256_of(data: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(data);
    hex_digest(h)
}

/// `realm="…",service="…"` → pairs.
fn parse_challenge(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            break;
        };
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let (value, next) = if let Some(q) = after.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (&q[..end], &q[end + 1..]),
                None => (q, ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        };
        out.push((key, value.to_string()));
        rest = next.trim_start_matches(',').trim();
    }
    out
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What a layer does to the wanted file.
#[derive(Debug, PartialEq, Eq)]
pub enum LayerEffect {
    /// Written to the output (its size).
    Found(u64),
    /// Removed by a whiteout.
    Removed,
    Absent,
}

/// Takes `wanted` (e.g. `usr/local/bin/edgecore`) out of a downloaded layer into `out`
/// (blocking: run it off the runtime's threads).
pub fn extract(
    layer: &Path,
    media_type: &str,
    wanted: &str,
    out: &Path,
) -> Result<LayerEffect, String> {
    let file = std::fs::File::open(layer).map_err(|e| format!("{}: {e}", layer.display()))?;
    let reader: Box<dyn Read> = if media_type.ends_with("+zstd") || media_type.ends_with(".zstd") {
        return Err(format!(
            "layer type {media_type} is not supported: push the image with gzip or uncompressed layers"
        ));
    } else if media_type.ends_with("gzip") {
        Box::new(flate2::read::GzDecoder::new(std::io::BufReader::new(file)))
    } else {
        Box::new(std::io::BufReader::new(file))
    };
    let (dir, name) = wanted.rsplit_once('/').unwrap_or(("", wanted));
    let whiteout = format!("{dir}/.wh.{name}");
    let opaque = format!("{dir}/.wh..wh..opq");
    let mut effect = LayerEffect::Absent;
    let mut archive = tar::Archive::new(reader);
    let entries = archive.entries().map_err(|e| format!("layer: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("layer: {e}"))?;
        let path = entry
            .path()
            .map_err(|e| format!("layer entry: {e}"))?
            .to_string_lossy()
            .trim_start_matches("./")
            .trim_start_matches('/')
            .to_string();
        if path == whiteout || path == opaque {
            effect = LayerEffect::Removed;
            continue;
        }
        if path != wanted {
            continue;
        }
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind == tar::EntryType::Continuous) {
            return Err(format!("/{wanted} in the image is not a regular file"));
        }
        if entry.size() > MAX_FILE {
            return Err(format!("/{wanted} in the image is over {MAX_FILE} bytes"));
        }
        let mut f = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
        let n = std::io::copy(&mut (&mut entry).take(MAX_FILE), &mut f)
            .map_err(|e| format!("/{wanted}: {e}"))?;
        f.sync_all().map_err(|e| e.to_string())?;
        effect = LayerEffect::Found(n);
    }
    Ok(effect)
}

/// Fetches `wanted` from `image` for this platform into `out` (layers go through
/// `work_dir`), checking the platform manifest's digest against `expected` when given.
/// The platform manifest's digest.
pub async fn fetch_file(
    tls: Arc<rustls::ClientConfig>,
    image: &ImageRef,
    expected: Option<&str>,
    wanted: &str,
    work_dir: &Path,
    out: &Path,
) -> Result<String, String> {
    let mut client = Client::new(tls);
    let resolved = client.resolve(image).await?;
    // KubeEdge compares the runtime's repo digest: the index's for a multi-platform tag.
    if let Some(want) = expected
        && want != resolved.digest
        && Some(want) != resolved.index_digest.as_deref()
    {
        return Err(format!(
            "image digest of {image} is not correct, local: {}, expected: {want}",
            resolved.digest
        ));
    }
    // Taken out into the work directory; `out` appears only once the whole image was read.
    let partial = work_dir.join("file.partial");
    let mut found = false;
    for (i, layer) in resolved.layers.iter().enumerate() {
        let path = work_dir.join(format!("layer-{i}"));
        let downloaded = client.download(image, layer, &path).await;
        let result = match downloaded {
            Ok(()) => {
                let (p, m, w, o) = (
                    path.clone(),
                    layer.media_type.clone(),
                    wanted.to_string(),
                    partial.clone(),
                );
                tokio::task::spawn_blocking(move || extract(&p, &m, &w, &o))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r)
            }
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_file(&path);
        match result? {
            LayerEffect::Found(n) => {
                tracing::info!(image = %image, layer = i + 1, of = resolved.layers.len(), bytes = n, "/{wanted} found in the image");
                found = true;
            }
            LayerEffect::Removed => found = false,
            LayerEffect::Absent => {}
        }
        tracing::info!(image = %image, layer = i + 1, of = resolved.layers.len(), "layer read");
    }
    if !found {
        let _ = std::fs::remove_file(&partial);
        return Err(format!("{image} holds no /{wanted}"));
    }
    std::fs::rename(&partial, out).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(resolved.digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_as_docker_does() {
        let r = |i: &str, t: &str| ImageRef::new(i, t).unwrap();
        assert_eq!(
            r("kubeedge/installation-package", "v1.23.1"),
            ImageRef {
                host: "docker.io".into(),
                repository: "kubeedge/installation-package".into(),
                tag: "v1.23.1".into()
            }
        );
        assert_eq!(r("busybox", "v1.0.0").repository, "library/busybox");
        let local = r("127.0.0.1:5000/kubeedge-rs/edgecore:old", "v2.0.0");
        assert_eq!(local.host, "127.0.0.1:5000");
        assert_eq!(local.repository, "kubeedge-rs/edgecore");
        assert_eq!(local.tag, "v2.0.0");
        let digest = r("registry.example/a/b@sha256:00", "v1.0.0");
        assert_eq!(
            (digest.host.as_str(), digest.repository.as_str()),
            ("registry.example", "a/b")
        );
        assert!(ImageRef::new("a//b", "v1").is_err());
        assert!(ImageRef::new("", "v1").is_err());
        assert!(
            !local.api_url("/v2/").unwrap().https,
            "loopback registries speak HTTP"
        );
        assert!(r("kubeedge/x", "v1").api_url("/v2/").unwrap().https);
        assert_eq!(
            r("kubeedge/x", "v1").api_url("/v2/").unwrap().host,
            "registry-1.docker.io"
        );
    }

    #[test]
    fn urls_and_challenges_parse() {
        let u = Url::parse("https://auth.docker.io/token?x=1").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("auth.docker.io", 443, "/token?x=1")
        );
        let u = Url::parse("http://[::1]:5000").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("::1", 5000, "/")
        );
        assert_eq!(u.authority(), "[::1]:5000");
        assert!(Url::parse("ftp://x").is_err());
        assert!(Url::parse("http://x:y/").is_err());
        assert_eq!(u.join("/v2/blobs").unwrap().path, "/v2/blobs");
        assert!(u.join("relative").is_err());
        let tls = Url::parse("https://registry.example/v2/").unwrap();
        assert!(tls.join("http://cdn.example/blob").is_err(), "no downgrade");
        assert!(tls.join("https://cdn.example/blob").is_ok());
        assert!(tls.join("http://127.0.0.1:5000/blob").is_ok(), "loopback");
        assert!(
            Url::parse("http://auth.example/token")
                .unwrap()
                .check_plain_http()
                .is_err()
        );
        let cdn = Url::parse("https://cdn.example/blob").unwrap();
        assert!(!tls.same_origin(&cdn));
        assert!(!tls.same_origin(&Url::parse("http://registry.example:443/").unwrap()));
        assert!(tls.same_origin(&Url::parse("https://registry.example/other").unwrap()));
        let c = parse_challenge(
            r#"realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull""#,
        );
        assert_eq!(
            c[0],
            ("realm".into(), "https://auth.docker.io/token".into())
        );
        assert_eq!(c[2].1, "repository:library/busybox:pull");
        assert_eq!(
            percent_encode("repository:a/b:pull"),
            "repository%3Aa%2Fb%3Apull"
        );
        assert!(parse_challenge("garbage").is_empty());
    }

    fn layer(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o755);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, path, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn the_file_is_taken_out_of_plain_and_gzip_layers_and_whiteouts_remove_it() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let plain = dir.path().join("l1");
        std::fs::write(
            &plain,
            layer(&[("usr/local/bin/edgecore", b"new binary"), ("etc/x", b"x")]),
        )
        .unwrap();
        assert_eq!(
            extract(
                &plain,
                "application/vnd.oci.image.layer.v1.tar",
                "usr/local/bin/edgecore",
                &out
            )
            .unwrap(),
            LayerEffect::Found(10)
        );
        assert_eq!(std::fs::read(&out).unwrap(), b"new binary");
        let gz = dir.path().join("l2");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut enc, &layer(&[("./usr/local/bin/edgecore", b"v2")]))
            .unwrap();
        std::fs::write(&gz, enc.finish().unwrap()).unwrap();
        assert_eq!(
            extract(
                &gz,
                "application/vnd.docker.image.rootfs.diff.tar.gzip",
                "usr/local/bin/edgecore",
                &out
            )
            .unwrap(),
            LayerEffect::Found(2)
        );
        let wh = dir.path().join("l3");
        std::fs::write(&wh, layer(&[("usr/local/bin/.wh.edgecore", b"")])).unwrap();
        assert_eq!(
            extract(
                &wh,
                "application/vnd.oci.image.layer.v1.tar",
                "usr/local/bin/edgecore",
                &out
            )
            .unwrap(),
            LayerEffect::Removed
        );
        assert!(
            extract(
                &wh,
                "application/vnd.oci.image.layer.v1.tar+zstd",
                "usr/local/bin/edgecore",
                &out
            )
            .unwrap_err()
            .contains("not supported")
        );
        let junk = dir.path().join("l4");
        std::fs::write(&junk, b"\x1f\x8bnot gzip at all").unwrap();
        assert!(
            extract(
                &junk,
                "application/vnd.oci.image.layer.v1.tar+gzip",
                "usr/local/bin/edgecore",
                &out
            )
            .is_err()
        );
    }
}
