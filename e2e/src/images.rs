//! Container images built locally, deterministically, from files on this machine: no image is
//! ever pulled from the internet.
//!
//! - [`busybox`]: one layer with Debian's static `/bin/busybox` (package `busybox-static`), a
//!   symlink per applet in `/bin`, `/etc/passwd` and `/etc/group`.
//! - [`pause`]: one layer with a static pause binary compiled from `e2e/images/pause.c`
//!   (`gcc -static`): the pod sandbox image.
//! - the cloudcore image: [`crate::cloudcore_image`] (with [`ImageConfig`]: user, labels, ports).
//!
//! An [`OciImage`] is written as an OCI image archive ([`OciImage::write_archive`]: `oci-layout`,
//! `index.json`, sha256-named blobs) for `ctr images import`, or pushed blob by blob to a
//! registry ([`crate::registry`]). The same inputs give the same digests every time.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use sha2::{Digest, Sha256};

/// The busybox image as tests and pod specs name it (served by the harness' local registry,
/// also present in containerd before any pull).
pub const BUSYBOX_IMAGE: &str = "localhost:5000/busybox:latest";
/// The same busybox image under its Docker Hub name; the harness' containerd resolves
/// `docker.io` to the local registry, so `image: busybox` in a pod spec works offline.
pub const BUSYBOX_DOCKER_HUB_IMAGE: &str = "docker.io/library/busybox:latest";
/// The pod sandbox ("pause") image: containerd's `sandbox_image` in the harness.
pub const PAUSE_IMAGE: &str = "localhost:5000/pause:3.9";

/// Where Debian's `busybox-static` puts the static binary packed into [`busybox`].
pub const BUSYBOX_BINARY: &str = "/bin/busybox";

/// Applets the tests rely on; [`busybox`] fails if the binary lacks one.
pub const REQUIRED_APPLETS: &[&str] = &[
    "sh", "sleep", "cat", "echo", "ls", "env", "nc", "wget", "id", "hostname", "true", "false",
    "test", "ps", "mkdir", "touch", "httpd", "grep", "date", "kill", "wc", "head", "tail", "rm",
    "ip", "ping",
];

const PAUSE_SOURCE: &str = include_str!("../images/pause.c");

pub const MEDIA_TYPE_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_TYPE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_TYPE_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{path} is missing: install the {package} package (run scripts/setup.sh as root)")]
    MissingInput { path: String, package: &'static str },
    #[error("{BUSYBOX_BINARY} has no applet {0:?}")]
    MissingApplet(String),
    #[error("compiling the pause binary with gcc failed: {0}")]
    Compile(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

fn io_error(context: impl Into<String>) -> impl FnOnce(io::Error) -> ImageError {
    let context = context.into();
    move |source| ImageError::Io { context, source }
}

/// A content-addressed blob: a layer, a config or a manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blob {
    pub media_type: &'static str,
    /// `sha256:<hex>`
    pub digest: String,
    pub data: Vec<u8>,
}

impl Blob {
    pub fn new(media_type: &'static str, data: Vec<u8>) -> Self {
        Self {
            media_type,
            digest: sha256_digest(&data),
            data,
        }
    }

    /// The OCI descriptor (`mediaType`, `digest`, `size`) pointing at this blob.
    pub fn descriptor(&self) -> serde_json::Value {
        json!({
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.data.len(),
        })
    }
}

/// `sha256:<lowercase hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    let hash = Sha256::digest(data);
    let mut digest = String::with_capacity(7 + 64);
    digest.push_str("sha256:");
    for byte in hash {
        let _ = write!(digest, "{byte:02x}");
    }
    digest
}

/// A single-platform OCI image: layers, config and manifest.
#[derive(Clone, Debug)]
pub struct OciImage {
    pub layers: Vec<Blob>,
    pub config: Blob,
    pub manifest: Blob,
}

impl OciImage {
    /// Assembles config and manifest around uncompressed layer tars.
    pub fn from_layers(layers: Vec<Vec<u8>>, entrypoint: &[&str], cmd: &[&str]) -> Self {
        Self::from_config(
            layers,
            &ImageConfig {
                entrypoint: entrypoint.iter().map(|s| s.to_string()).collect(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                ..ImageConfig::default()
            },
        )
    }

    /// Assembles config and manifest around uncompressed layer tars, with `settings` as the
    /// runtime configuration.
    pub fn from_config(layers: Vec<Vec<u8>>, settings: &ImageConfig) -> Self {
        let layers: Vec<Blob> = layers
            .into_iter()
            .map(|tar| Blob::new(MEDIA_TYPE_LAYER, tar))
            .collect();
        // Uncompressed layers: the diff ID is the layer digest.
        let diff_ids: Vec<&str> = layers.iter().map(|l| l.digest.as_str()).collect();
        let created_by = settings
            .created_by
            .as_deref()
            .unwrap_or("kubeedge-rs e2e::images");
        let mut config = json!({
            "created": "1970-01-01T00:00:00Z",
            "architecture": oci_architecture(),
            "os": "linux",
            "config": { "Env": [PATH_ENV] },
            "rootfs": { "type": "layers", "diff_ids": diff_ids },
            "history": [{ "created": "1970-01-01T00:00:00Z", "created_by": created_by }],
        });
        let runtime = &mut config["config"];
        if !settings.entrypoint.is_empty() {
            runtime["Entrypoint"] = json!(settings.entrypoint);
        }
        if !settings.cmd.is_empty() {
            runtime["Cmd"] = json!(settings.cmd);
        }
        if let Some(user) = &settings.user {
            runtime["User"] = json!(user);
        }
        if let Some(dir) = &settings.working_dir {
            runtime["WorkingDir"] = json!(dir);
        }
        if !settings.labels.is_empty() {
            runtime["Labels"] = json!(settings.labels);
        }
        if !settings.exposed_ports.is_empty() {
            let ports: serde_json::Map<String, serde_json::Value> = settings
                .exposed_ports
                .iter()
                .map(|p| (p.clone(), json!({})))
                .collect();
            runtime["ExposedPorts"] = serde_json::Value::Object(ports);
        }
        let config = Blob::new(MEDIA_TYPE_CONFIG, to_json(&config));
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_TYPE_MANIFEST,
            "config": config.descriptor(),
            "layers": layers.iter().map(Blob::descriptor).collect::<Vec<_>>(),
        });
        let manifest = Blob::new(MEDIA_TYPE_MANIFEST, to_json(&manifest));
        Self {
            layers,
            config,
            manifest,
        }
    }

    /// The image ID containerd and CRI report (`sha256:` of the config).
    pub fn id(&self) -> &str {
        &self.config.digest
    }

    /// Layers, then config, then manifest: the order a registry push needs.
    pub fn blobs(&self) -> impl Iterator<Item = &Blob> {
        self.layers.iter().chain([&self.config, &self.manifest])
    }

    /// Writes an OCI image archive naming this image `names` (full references such as
    /// `localhost:5000/busybox:latest`), as `ctr images import` reads it.
    pub fn write_archive(&self, out: impl Write, names: &[&str]) -> io::Result<()> {
        let mut tar = tar::Builder::new(out);
        append_dir(&mut tar, "blobs/", 0o755)?;
        append_dir(&mut tar, "blobs/sha256/", 0o755)?;
        let mut seen = BTreeSet::new();
        for blob in self.blobs() {
            if seen.insert(&blob.digest) {
                let hex = blob.digest.trim_start_matches("sha256:");
                append_file(&mut tar, &format!("blobs/sha256/{hex}"), 0o644, &blob.data)?;
            }
        }
        append_file(
            &mut tar,
            "oci-layout",
            0o644,
            &to_json(&json!({ "imageLayoutVersion": "1.0.0" })),
        )?;
        let manifests: Vec<serde_json::Value> = names
            .iter()
            .map(|name| {
                let mut descriptor = self.manifest.descriptor();
                descriptor["platform"] =
                    json!({ "architecture": oci_architecture(), "os": "linux" });
                descriptor["annotations"] = json!({
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": tag_of(name),
                });
                descriptor
            })
            .collect();
        let index = json!({ "schemaVersion": 2, "manifests": manifests });
        append_file(&mut tar, "index.json", 0o644, &to_json(&index))?;
        tar.into_inner()?.flush()
    }

    /// [`OciImage::write_archive`] into a new file at `path`.
    pub fn write_archive_file(&self, path: &Path, names: &[&str]) -> Result<(), ImageError> {
        let context = || format!("writing image archive {}", path.display());
        let file = std::fs::File::create(path).map_err(io_error(context()))?;
        self.write_archive(io::BufWriter::new(file), names)
            .map_err(io_error(context()))
    }
}

/// The runtime part of an image config (`config` in the OCI image config JSON).
#[derive(Clone, Debug, Default)]
pub struct ImageConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `uid[:gid]` or a name from the image's `/etc/passwd`.
    pub user: Option<String>,
    pub working_dir: Option<String>,
    /// e.g. `org.opencontainers.image.version`; sorted, so the JSON is the same every time.
    pub labels: std::collections::BTreeMap<String, String>,
    /// `10000/tcp` …
    pub exposed_ports: Vec<String>,
    /// The history entry's `created_by`.
    pub created_by: Option<String>,
}

/// Splits a reference `host[:port]/repo/path:tag` into (`repo/path`, `tag`); the tag
/// defaults to `latest`. Digest references are not supported.
pub fn repository_and_tag(reference: &str) -> (&str, &str) {
    let without_host = match reference.split_once('/') {
        Some((host, rest)) if host.contains('.') || host.contains(':') || host == "localhost" => {
            rest
        }
        _ => reference,
    };
    match without_host.rsplit_once(':') {
        Some((repo, tag)) => (repo, tag),
        None => (without_host, "latest"),
    }
}

/// The registry host of a reference (`localhost:5000/a:1` → `localhost:5000`), if it names
/// one: a first component with a `.` or `:`, or `localhost`, as Docker decides.
pub fn registry_host(reference: &str) -> Option<&str> {
    match reference.split_once('/') {
        Some((host, _)) if host.contains('.') || host.contains(':') || host == "localhost" => {
            Some(host)
        }
        _ => None,
    }
}

/// A reference as containerd stores it: `kubeedge-rs/cloudcore:1` →
/// `docker.io/kubeedge-rs/cloudcore:1`, `cloudcore` → `docker.io/library/cloudcore:latest`;
/// a reference with a registry host only gets a default tag.
pub fn normalized_reference(reference: &str) -> String {
    let (repository, tag) = repository_and_tag(reference);
    match registry_host(reference) {
        Some(host) => format!("{host}/{repository}:{tag}"),
        None if repository.contains('/') => format!("docker.io/{repository}:{tag}"),
        None => format!("docker.io/library/{repository}:{tag}"),
    }
}

fn tag_of(reference: &str) -> &str {
    repository_and_tag(reference).1
}

fn to_json(value: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("a serde_json::Value always serialises")
}

/// The OCI name of this machine's architecture.
pub fn oci_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// Builds a layer tar. Entries are written in the order given, with uid/gid 0 and mtime 0, so
/// the same entries give the same bytes.
pub struct LayerBuilder {
    tar: tar::Builder<Vec<u8>>,
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl LayerBuilder {
    pub fn new() -> Self {
        Self {
            tar: tar::Builder::new(Vec::new()),
        }
    }

    pub fn dir(&mut self, path: &str, mode: u32) -> io::Result<&mut Self> {
        append_dir(
            &mut self.tar,
            &format!("{}/", path.trim_end_matches('/')),
            mode,
        )?;
        Ok(self)
    }

    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> io::Result<&mut Self> {
        append_file(&mut self.tar, path, mode, data)?;
        Ok(self)
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> io::Result<&mut Self> {
        let mut header = header(tar::EntryType::Symlink, 0o777, 0);
        self.tar.append_link(&mut header, path, target)?;
        Ok(self)
    }

    /// The layer tar's bytes.
    pub fn finish(self) -> io::Result<Vec<u8>> {
        self.tar.into_inner()
    }
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header
}

fn append_dir<W: Write>(tar: &mut tar::Builder<W>, path: &str, mode: u32) -> io::Result<()> {
    let mut header = header(tar::EntryType::Directory, mode, 0);
    tar.append_data(&mut header, path, io::empty())
}

fn append_file<W: Write>(
    tar: &mut tar::Builder<W>,
    path: &str,
    mode: u32,
    data: &[u8],
) -> io::Result<()> {
    let mut header = header(tar::EntryType::Regular, mode, data.len() as u64);
    tar.append_data(&mut header, path, data)
}

/// The busybox image: Debian's static busybox with every applet it has linked into `/bin`,
/// `/usr/bin/env` for `#!/usr/bin/env` scripts, and the usual root, daemon and nobody
/// accounts. Default command `sh`.
pub fn busybox() -> Result<OciImage, ImageError> {
    let binary = std::fs::read(BUSYBOX_BINARY).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => ImageError::MissingInput {
            path: BUSYBOX_BINARY.into(),
            package: "busybox-static",
        },
        _ => ImageError::Io {
            context: format!("reading {BUSYBOX_BINARY}"),
            source: e,
        },
    })?;
    let applets = busybox_applets()?;
    if let Some(missing) = REQUIRED_APPLETS
        .iter()
        .find(|a| !applets.iter().any(|have| have == *a))
    {
        return Err(ImageError::MissingApplet((*missing).to_string()));
    }

    let layer = (|| -> io::Result<Vec<u8>> {
        let mut layer = LayerBuilder::new();
        layer
            .dir("bin", 0o755)?
            .file("bin/busybox", 0o755, &binary)?;
        for applet in &applets {
            if applet != "busybox" {
                layer.symlink(&format!("bin/{applet}"), "busybox")?;
            }
        }
        layer
            .dir("dev", 0o755)?
            .dir("etc", 0o755)?
            .file("etc/passwd", 0o644, PASSWD.as_bytes())?
            .file("etc/group", 0o644, GROUP.as_bytes())?
            .dir("home", 0o755)?
            .dir("proc", 0o555)?
            .dir("root", 0o700)?
            .dir("sys", 0o555)?
            .dir("tmp", 0o1777)?
            .dir("usr", 0o755)?
            .dir("usr/bin", 0o755)?
            .symlink("usr/bin/env", "../../bin/busybox")?
            .dir("var", 0o755)?
            .dir("var/www", 0o755)?;
        layer.finish()
    })()
    .map_err(io_error("building the busybox layer"))?;
    Ok(OciImage::from_layers(vec![layer], &[], &["sh"]))
}

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
daemon:x:1:1:daemon:/usr/sbin:/bin/false\n\
www-data:x:33:33:www-data:/var/www:/bin/false\n\
nobody:x:65534:65534:nobody:/home:/bin/false\n";

const GROUP: &str = "root:x:0:\n\
daemon:x:1:\n\
www-data:x:33:\n\
nogroup:x:65534:\n";

/// The applet names `/bin/busybox --list` prints, sorted.
fn busybox_applets() -> Result<Vec<String>, ImageError> {
    let output = Command::new(BUSYBOX_BINARY)
        .arg("--list")
        .output()
        .map_err(io_error(format!("running {BUSYBOX_BINARY} --list")))?;
    if !output.status.success() {
        return Err(ImageError::Io {
            context: format!("{BUSYBOX_BINARY} --list"),
            source: io::Error::other(output.status.to_string()),
        });
    }
    let mut applets: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::trim)
        // Applet names are plain file names; skip anything that is not.
        .filter(|a| !a.is_empty() && !a.contains('/') && *a != "." && *a != "..")
        .map(str::to_string)
        .collect();
    applets.sort();
    applets.dedup();
    Ok(applets)
}

/// Compiles `e2e/images/pause.c` statically into `scratch` and returns the binary's path.
pub fn compile_pause(scratch: &Path) -> Result<PathBuf, ImageError> {
    std::fs::create_dir_all(scratch)
        .map_err(io_error(format!("creating {}", scratch.display())))?;
    let source = scratch.join("pause.c");
    let binary = scratch.join("pause");
    std::fs::write(&source, PAUSE_SOURCE)
        .map_err(io_error(format!("writing {}", source.display())))?;
    let output = Command::new("gcc")
        .args(["-static", "-Os", "-s", "-Wall", "-o"])
        .arg(&binary)
        .arg(&source)
        .output()
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ImageError::MissingInput {
                path: "gcc".into(),
                package: "gcc",
            },
            _ => ImageError::Io {
                context: "running gcc".into(),
                source: e,
            },
        })?;
    if !output.status.success() {
        return Err(ImageError::Compile(format!(
            "{}: {} (is libc6-dev installed? run scripts/setup.sh)",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(binary)
}

/// The pause image: the static binary from [`compile_pause`] as `/pause`, entrypoint
/// `/pause`. `scratch` is a directory for the compiler's input and output.
pub fn pause(scratch: &Path) -> Result<OciImage, ImageError> {
    let binary_path = compile_pause(scratch)?;
    let binary = std::fs::read(&binary_path)
        .map_err(io_error(format!("reading {}", binary_path.display())))?;
    let layer = (|| -> io::Result<Vec<u8>> {
        let mut layer = LayerBuilder::new();
        layer
            .file("pause", 0o755, &binary)?
            .dir("dev", 0o755)?
            .dir("etc", 0o755)?
            .dir("proc", 0o555)?
            .dir("sys", 0o555)?;
        layer.finish()
    })()
    .map_err(io_error("building the pause layer"))?;
    Ok(OciImage::from_layers(vec![layer], &["/pause"], &[]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(tar_bytes: &[u8]) -> Vec<(String, tar::EntryType, Option<String>, Vec<u8>)> {
        let mut archive = tar::Archive::new(tar_bytes);
        archive
            .entries()
            .unwrap()
            .map(|entry| {
                let mut entry = entry.unwrap();
                let path = entry.path().unwrap().to_string_lossy().into_owned();
                let kind = entry.header().entry_type();
                let link = entry
                    .link_name()
                    .unwrap()
                    .map(|l| l.to_string_lossy().into_owned());
                let mut data = Vec::new();
                io::Read::read_to_end(&mut entry, &mut data).unwrap();
                (path, kind, link, data)
            })
            .collect()
    }

    #[test]
    fn digest_is_sha256_of_the_bytes() {
        assert_eq!(
            sha256_digest(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn same_layers_give_the_same_digests() {
        let build = || {
            let mut layer = LayerBuilder::new();
            layer
                .dir("etc", 0o755)
                .unwrap()
                .file("etc/motd", 0o644, b"hi\n")
                .unwrap()
                .symlink("etc/link", "motd")
                .unwrap();
            OciImage::from_layers(vec![layer.finish().unwrap()], &[], &["sh"])
        };
        let (a, b) = (build(), build());
        assert_eq!(a.manifest.digest, b.manifest.digest);
        assert_eq!(a.config.digest, b.config.digest);
    }

    #[test]
    fn manifest_and_config_reference_the_layer() {
        let mut layer = LayerBuilder::new();
        layer.file("x", 0o644, b"x").unwrap();
        let image = OciImage::from_layers(vec![layer.finish().unwrap()], &["/x"], &[]);
        let manifest: serde_json::Value = serde_json::from_slice(&image.manifest.data).unwrap();
        assert_eq!(manifest["config"]["digest"], image.config.digest);
        assert_eq!(manifest["layers"][0]["digest"], image.layers[0].digest);
        assert_eq!(manifest["layers"][0]["size"], image.layers[0].data.len());
        let config: serde_json::Value = serde_json::from_slice(&image.config.data).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], image.layers[0].digest);
        assert_eq!(config["config"]["Entrypoint"][0], "/x");
        assert!(config["config"].get("Cmd").is_none());
    }

    #[test]
    fn archive_holds_layout_index_and_every_blob() {
        let mut layer = LayerBuilder::new();
        layer.file("x", 0o644, b"x").unwrap();
        let image = OciImage::from_layers(vec![layer.finish().unwrap()], &[], &["sh"]);
        let mut archive = Vec::new();
        image
            .write_archive(
                &mut archive,
                &["localhost:5000/x:1", "docker.io/library/x:1"],
            )
            .unwrap();
        let entries = entries(&archive);
        let find = |path: &str| {
            entries
                .iter()
                .find(|e| e.0 == path)
                .unwrap_or_else(|| panic!("{path} missing"))
        };
        for blob in image.blobs() {
            let path = format!("blobs/sha256/{}", blob.digest.trim_start_matches("sha256:"));
            assert_eq!(find(&path).3, blob.data);
        }
        let layout: serde_json::Value = serde_json::from_slice(&find("oci-layout").3).unwrap();
        assert_eq!(layout["imageLayoutVersion"], "1.0.0");
        let index: serde_json::Value = serde_json::from_slice(&find("index.json").3).unwrap();
        let names: Vec<&str> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                assert_eq!(m["digest"], image.manifest.digest);
                m["annotations"]["io.containerd.image.name"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(names, ["localhost:5000/x:1", "docker.io/library/x:1"]);
    }

    #[test]
    fn references_split_into_repository_and_tag() {
        assert_eq!(
            repository_and_tag("localhost:5000/busybox:latest"),
            ("busybox", "latest")
        );
        assert_eq!(
            repository_and_tag("docker.io/library/busybox:1.36"),
            ("library/busybox", "1.36")
        );
        assert_eq!(repository_and_tag("127.0.0.1:5000/a/b"), ("a/b", "latest"));
        assert_eq!(repository_and_tag("busybox:1"), ("busybox", "1"));
        assert_eq!(
            repository_and_tag("library/busybox"),
            ("library/busybox", "latest")
        );
    }

    #[test]
    fn references_are_normalized_as_containerd_stores_them() {
        assert_eq!(
            normalized_reference("kubeedge-rs/cloudcore:0.1.0"),
            "docker.io/kubeedge-rs/cloudcore:0.1.0"
        );
        assert_eq!(
            normalized_reference("cloudcore"),
            "docker.io/library/cloudcore:latest"
        );
        assert_eq!(
            normalized_reference("localhost:5000/kubeedge-rs/cloudcore"),
            "localhost:5000/kubeedge-rs/cloudcore:latest"
        );
        assert_eq!(
            registry_host("registry.example:443/a/b:1"),
            Some("registry.example:443")
        );
        assert_eq!(registry_host("a/b:1"), None);
    }

    #[test]
    fn config_carries_user_labels_and_ports() {
        let settings = ImageConfig {
            entrypoint: vec!["/usr/local/bin/x".into()],
            user: Some("65532:65532".into()),
            labels: [(
                "org.opencontainers.image.version".to_string(),
                "1".to_string(),
            )]
            .into(),
            exposed_ports: vec!["10000/tcp".into()],
            ..ImageConfig::default()
        };
        let image = OciImage::from_config(vec![LayerBuilder::new().finish().unwrap()], &settings);
        let config: serde_json::Value = serde_json::from_slice(&image.config.data).unwrap();
        assert_eq!(config["config"]["User"], "65532:65532");
        assert_eq!(
            config["config"]["Labels"]["org.opencontainers.image.version"],
            "1"
        );
        assert_eq!(config["config"]["ExposedPorts"]["10000/tcp"], json!({}));
        assert!(config["config"].get("WorkingDir").is_none());
    }

    #[test]
    fn busybox_image_has_the_binary_applets_and_accounts() {
        let image = busybox().expect("busybox-static installed (scripts/setup.sh)");
        assert_eq!(image.layers.len(), 1);
        let entries = entries(&image.layers[0].data);
        let binary = entries.iter().find(|e| e.0 == "bin/busybox").unwrap();
        assert_eq!(binary.3, std::fs::read(BUSYBOX_BINARY).unwrap());
        for applet in REQUIRED_APPLETS {
            let entry = entries
                .iter()
                .find(|e| e.0 == format!("bin/{applet}"))
                .unwrap_or_else(|| panic!("applet {applet} missing"));
            assert_eq!(entry.1, tar::EntryType::Symlink);
            assert_eq!(entry.2.as_deref(), Some("busybox"));
        }
        let passwd = entries.iter().find(|e| e.0 == "etc/passwd").unwrap();
        assert!(String::from_utf8_lossy(&passwd.3).starts_with("root:x:0:0:"));
        assert!(entries.iter().any(|e| e.0 == "etc/group"));
        assert_eq!(busybox().unwrap().manifest.digest, image.manifest.digest);
    }

    #[test]
    fn pause_image_is_deterministic_and_runs_until_sigterm() {
        let scratch = std::env::temp_dir().join(format!("e2e-pause-test-{}", std::process::id()));
        let first = pause(&scratch).expect("gcc and libc6-dev installed (scripts/setup.sh)");
        let second = pause(&scratch).unwrap();
        assert_eq!(first.manifest.digest, second.manifest.digest);

        let mut child = Command::new(scratch.join("pause")).spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(child.try_wait().unwrap().is_none(), "pause exited early");
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{status}");
        std::fs::remove_dir_all(&scratch).unwrap();
    }
}
