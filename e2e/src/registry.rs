//! A private Docker registry (Debian's `docker-registry`, distribution 2.8) on a free loopback
//! port, and a small blocking client that pushes [`OciImage`]s to it with the registry v2
//! protocol (blob upload `POST` + `PUT`, manifest `PUT`).
//!
//! The client is blocking (std `TcpStream`, one request per connection) so that it works from
//! any thread, inside or outside a tokio runtime.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::images::{Blob, OciImage};
use crate::process;

/// Debian's registry binary (package `docker-registry`).
pub const REGISTRY_BINARY: &str = "/usr/bin/docker-registry";

const IO_TIMEOUT: Duration = Duration::from_secs(30);
const READY_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{REGISTRY_BINARY} is missing: install docker-registry (run scripts/setup.sh as root)")]
    NotInstalled,
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("the registry did not become ready: {reason}; its log {log}:\n{log_tail}")]
    NotReady {
        reason: String,
        log: String,
        log_tail: String,
    },
    #[error("{method} {path}: unexpected HTTP {status}: {body}")]
    Http {
        method: &'static str,
        path: String,
        status: u16,
        body: String,
    },
}

/// A running registry; stopped on [`Registry::stop`] or drop.
pub struct Registry {
    addr: SocketAddr,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
}

impl Registry {
    /// Starts a registry storing its data, config and log under `dir` (created if missing),
    /// listening on a free port of 127.0.0.1, and waits until it answers `GET /v2/`.
    pub fn start(dir: &Path) -> Result<Self, RegistryError> {
        if !Path::new(REGISTRY_BINARY).exists() {
            return Err(RegistryError::NotInstalled);
        }
        let io_err = |context: String| move |source| RegistryError::Io { context, source };
        std::fs::create_dir_all(dir.join("storage"))
            .map_err(io_err(format!("creating {}", dir.display())))?;
        // Another process may take the free port between our probe and the registry's bind:
        // then the registry exits at once and we try another port.
        let mut last_error = None;
        for _ in 0..3 {
            let addr =
                free_loopback_port().map_err(io_err("finding a free loopback port".to_string()))?;
            let config = dir.join("config.yml");
            std::fs::write(&config, registry_config(addr, &dir.join("storage")))
                .map_err(io_err(format!("writing {}", config.display())))?;
            let log_path = dir.join("registry.log");
            let log = std::fs::File::create(&log_path)
                .map_err(io_err(format!("creating {}", log_path.display())))?;
            let log_err = log
                .try_clone()
                .map_err(io_err("duplicating the log file".to_string()))?;
            let mut command = Command::new(REGISTRY_BINARY);
            command
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err);
            let child = process::spawn_tied(command)
                .map_err(io_err(format!("starting {REGISTRY_BINARY}")))?;
            let registry = Self {
                addr,
                dir: dir.to_path_buf(),
                child: Mutex::new(Some(child)),
            };
            match registry.wait_ready() {
                Ok(()) => return Ok(registry),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.expect("at least one attempt"))
    }

    fn wait_ready(&self) -> Result<(), RegistryError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let not_ready = |reason: String| RegistryError::NotReady {
            reason,
            log: self.log_path().display().to_string(),
            log_tail: log_tail(&self.log_path()),
        };
        loop {
            if let Some(child) = self.child.lock().expect("registry lock").as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(not_ready(format!("it exited with {status}")));
            }
            match request(self.addr, "GET", "/v2/", &[], &[]) {
                Ok(response) if response.status == 200 => return Ok(()),
                Ok(response) if Instant::now() > deadline => {
                    return Err(not_ready(format!("GET /v2/ answered {}", response.status)));
                }
                Err(e) if Instant::now() > deadline => return Err(not_ready(e.to_string())),
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `127.0.0.1:<port>` as the host part of image references.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// The registry's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("registry.log")
    }

    /// Pushes `image` as `repository:tag` (e.g. `library/busybox`, `latest`): every blob the
    /// registry lacks, then the manifest.
    pub fn push(&self, image: &OciImage, repository: &str, tag: &str) -> Result<(), RegistryError> {
        push(self.addr, image, repository, tag)
    }

    /// Whether the registry serves a manifest for `repository:tag`.
    pub fn has_manifest(&self, repository: &str, tag: &str) -> Result<bool, RegistryError> {
        let path = format!("/v2/{repository}/manifests/{tag}");
        let accept = crate::images::MEDIA_TYPE_MANIFEST;
        let response =
            request(self.addr, "HEAD", &path, &[("Accept", accept)], &[]).map_err(|source| {
                RegistryError::Io {
                    context: format!("HEAD {path}"),
                    source,
                }
            })?;
        Ok(response.status == 200)
    }

    /// Stops the registry (SIGTERM, then SIGKILL). Idempotent.
    pub fn stop(&self) {
        if let Some(mut child) = self.child.lock().expect("registry lock").take() {
            process::terminate(&mut child, Duration::from_secs(5));
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Pushes `image` as `repository:tag` to the registry at `addr` over plain HTTP (no
/// authentication): every blob the registry lacks, then the manifest.
pub fn push(
    addr: SocketAddr,
    image: &OciImage,
    repository: &str,
    tag: &str,
) -> Result<(), RegistryError> {
    for blob in image.layers.iter().chain([&image.config]) {
        push_blob(addr, repository, blob)?;
    }
    let path = format!("/v2/{repository}/manifests/{tag}");
    let response = request(
        addr,
        "PUT",
        &path,
        &[("Content-Type", image.manifest.media_type)],
        &image.manifest.data,
    )
    .map_err(|source| RegistryError::Io {
        context: format!("PUT {path}"),
        source,
    })?;
    expect_status("PUT", &path, &response, 201)?;
    Ok(())
}

fn push_blob(addr: SocketAddr, repository: &str, blob: &Blob) -> Result<(), RegistryError> {
    let io_err = |context: String| move |source| RegistryError::Io { context, source };
    let blob_path = format!("/v2/{repository}/blobs/{}", blob.digest);
    let head =
        request(addr, "HEAD", &blob_path, &[], &[]).map_err(io_err(format!("HEAD {blob_path}")))?;
    if head.status == 200 {
        return Ok(());
    }
    let uploads = format!("/v2/{repository}/blobs/uploads/");
    let started =
        request(addr, "POST", &uploads, &[], &[]).map_err(io_err(format!("POST {uploads}")))?;
    expect_status("POST", &uploads, &started, 202)?;
    let location = started
        .header("location")
        .ok_or_else(|| RegistryError::Http {
            method: "POST",
            path: uploads.clone(),
            status: started.status,
            body: "no Location header".into(),
        })?;
    let location = path_of(location);
    let separator = if location.contains('?') { '&' } else { '?' };
    let digest = blob.digest.replace(':', "%3A");
    let upload = format!("{location}{separator}digest={digest}");
    let finished = request(
        addr,
        "PUT",
        &upload,
        &[("Content-Type", "application/octet-stream")],
        &blob.data,
    )
    .map_err(io_err(format!("PUT {upload}")))?;
    expect_status("PUT", &upload, &finished, 201)
}

fn registry_config(addr: SocketAddr, storage: &Path) -> String {
    // JSON strings are valid YAML scalars: quote the paths safely.
    let storage = serde_json::to_string(&storage.display().to_string()).expect("string");
    format!(
        "version: 0.1\n\
         log:\n  level: warn\n  accesslog:\n    disabled: true\n\
         storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n\
         http:\n  addr: \"{addr}\"\n"
    )
}

fn free_loopback_port() -> io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    listener.local_addr()
}

/// The last lines of a log file, for error messages.
pub(crate) fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// `http://host:port/path?q` → `/path?q`; a relative location is returned unchanged.
fn path_of(location: &str) -> &str {
    match location.strip_prefix("http://") {
        Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => location,
    }
}

fn expect_status(
    method: &'static str,
    path: &str,
    response: &Response,
    expected: u16,
) -> Result<(), RegistryError> {
    if response.status == expected {
        return Ok(());
    }
    Err(RegistryError::Http {
        method,
        path: path.to_string(),
        status: response.status,
        body: String::from_utf8_lossy(&response.body)
            .chars()
            .take(500)
            .collect(),
    })
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`), reading the response
/// until the server closes. Enough for a registry push; not a general HTTP client (chunked
/// bodies are returned undecoded, and only used in error messages).
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> io::Result<Response> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| invalid("no end of HTTP headers"))?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| invalid("non-UTF-8 headers"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| invalid("bad HTTP status line"))?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok(Response {
        status,
        headers,
        body: raw[end + 4..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_parsed() {
        let raw = b"HTTP/1.1 202 Accepted\r\nLocation: http://127.0.0.1:5000/v2/x/blobs/uploads/u?_state=s\r\nContent-Length: 0\r\n\r\n";
        let response = parse_response(raw).unwrap();
        assert_eq!(response.status, 202);
        assert_eq!(
            path_of(response.header("LOCATION").unwrap()),
            "/v2/x/blobs/uploads/u?_state=s"
        );
        assert!(response.body.is_empty());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
    }

    #[test]
    fn relative_locations_stay_as_they_are() {
        assert_eq!(path_of("/v2/x/blobs/uploads/u"), "/v2/x/blobs/uploads/u");
    }
}
