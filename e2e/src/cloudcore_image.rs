//! The cloudcore container image, built without Docker from a cloudcore binary on this machine
//! (the CLI is `build-image`, `e2e/src/bin/build-image.rs`).
//!
//! One layer, exactly what the binary needs:
//! - `/usr/local/bin/cloudcore` (entrypoint; default arguments as the Helm chart passes them);
//! - for a dynamically linked binary, its loader (`PT_INTERP`) and every shared library it
//!   loads, found by reading the ELF files ([`crate::elf`]), at the paths the loader opens;
//! - `/etc/passwd` and `/etc/group` with root and `nonroot` (65532, the user the image runs
//!   as and the chart's `runAsUser`), `/tmp` (1777).
//!
//! No CA bundle (`/etc/ssl`): cloudcore's only TLS client is its Kubernetes client, which trusts
//! the CA of its kubeconfig or of the in-cluster service account; kube falls back to system roots
//! only for a kubeconfig without any CA. No `iptables` either: the iptables manager
//! (`modules.iptablesManager`, `cloudcore iptables-manager`) needs the Dockerfile's image.
//!
//! Every entry has mtime 0 and uid/gid 0, in path order: the same binary and libraries give the
//! same digests.

use crate::elf::{self, ElfError, RuntimeFile};
use crate::images::{ImageConfig, LayerBuilder, OciImage};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Where the binary goes, and the entrypoint.
pub const BINARY_PATH: &str = "/usr/local/bin/cloudcore";
/// The user the image runs as (distroless' `nonroot`; the Helm chart's `runAsUser`).
pub const NONROOT_UID: u32 = 65532;
/// The default arguments: the config the Helm chart mounts.
pub const DEFAULT_ARGS: &[&str] = &["--config", "/etc/kubeedge/config/cloudcore.yaml"];
/// cloudhub (WebSocket, HTTPS), cloudstream, tunnel, monitor: the chart's container ports.
pub const EXPOSED_PORTS: &[&str] = &[
    "10000/tcp",
    "10002/tcp",
    "10003/tcp",
    "10004/tcp",
    "9091/tcp",
];

const PASSWD: &str = "root:x:0:0:root:/root:/sbin/nologin\n\
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnonroot:x:65532:\n";

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Elf(#[from] ElfError),
    #[error("reading {path}: {source} (build it first: cargo build --release -p cloudcore)")]
    Binary {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("building the layer: {0}")]
    Layer(#[source] std::io::Error),
}

/// What the image is built from.
#[derive(Clone, Debug)]
pub struct CloudcoreImageSpec {
    pub binary: PathBuf,
    /// `org.opencontainers.image.version`.
    pub version: String,
    /// More labels (e.g. `org.opencontainers.image.revision`); they override the defaults.
    pub extra_labels: BTreeMap<String, String>,
    /// Where the loader and libraries are looked up (default [`elf::system_library_dirs`]).
    pub library_dirs: Vec<String>,
}

impl CloudcoreImageSpec {
    pub fn new(binary: impl Into<PathBuf>, version: impl Into<String>) -> Self {
        Self {
            binary: binary.into(),
            version: version.into(),
            extra_labels: BTreeMap::new(),
            library_dirs: elf::system_library_dirs(),
        }
    }
}

/// The image and what went into it.
pub struct CloudcoreImage {
    pub image: OciImage,
    /// The loader and libraries copied in (empty for a static binary).
    pub runtime_files: Vec<RuntimeFile>,
}

/// The labels every cloudcore image carries.
pub fn labels(version: &str) -> BTreeMap<String, String> {
    [
        ("org.opencontainers.image.title", "cloudcore"),
        (
            "org.opencontainers.image.description",
            "kubeedge-rs cloudcore: serves edge nodes over cloudhub and syncs them with Kubernetes",
        ),
        ("org.opencontainers.image.version", version),
        (
            "org.opencontainers.image.licenses",
            env!("CARGO_PKG_LICENSE"),
        ),
        ("org.opencontainers.image.vendor", "kubeedge-rs"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Builds the image (see the module docs).
pub fn build(spec: &CloudcoreImageSpec) -> Result<CloudcoreImage, BuildError> {
    let binary = std::fs::read(&spec.binary).map_err(|source| BuildError::Binary {
        path: spec.binary.display().to_string(),
        source,
    })?;
    let runtime_files = elf::runtime_files(&spec.binary, &spec.library_dirs)?;
    // Path (without the leading `/`) → content; directories come from the paths.
    let mut files: BTreeMap<String, (u32, Vec<u8>)> = BTreeMap::new();
    for f in &runtime_files {
        let data = std::fs::read(&f.host_path).map_err(|source| BuildError::Read {
            path: f.host_path.display().to_string(),
            source,
        })?;
        files.insert(relative(&f.image_path), (0o755, data));
    }
    files.insert(relative(BINARY_PATH), (0o755, binary));
    files.insert("etc/passwd".into(), (0o644, PASSWD.as_bytes().to_vec()));
    files.insert("etc/group".into(), (0o644, GROUP.as_bytes().to_vec()));
    let layer = layer(&files).map_err(BuildError::Layer)?;

    let mut labels = labels(&spec.version);
    labels.extend(spec.extra_labels.clone());
    let settings = ImageConfig {
        entrypoint: vec![BINARY_PATH.to_string()],
        cmd: DEFAULT_ARGS.iter().map(|s| s.to_string()).collect(),
        user: Some(format!("{NONROOT_UID}:{NONROOT_UID}")),
        working_dir: Some("/".into()),
        labels,
        exposed_ports: EXPOSED_PORTS.iter().map(|s| s.to_string()).collect(),
        created_by: Some("kubeedge-rs build-image cloudcore".into()),
    };
    Ok(CloudcoreImage {
        image: OciImage::from_config(vec![layer], &settings),
        runtime_files,
    })
}

fn relative(path: &str) -> String {
    path.trim_start_matches('/').to_string()
}

/// The layer tar: every parent directory (0755), `/tmp` (1777), `/home/nonroot` (the user's
/// `$HOME`; like every entry owned by root, so not writable for it), mount points, then the
/// files, all in path order.
fn layer(files: &BTreeMap<String, (u32, Vec<u8>)>) -> std::io::Result<Vec<u8>> {
    let mut dirs: BTreeMap<String, u32> = BTreeMap::new();
    for path in files.keys() {
        let mut parent = Path::new(path).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            dirs.entry(p.display().to_string()).or_insert(0o755);
            parent = p.parent();
        }
    }
    for (dir, mode) in [
        ("tmp", 0o1777),
        ("home", 0o755),
        ("home/nonroot", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
    ] {
        dirs.insert(dir.to_string(), mode);
    }
    // One sorted walk over both: a parent sorts before its children.
    let paths: BTreeSet<&String> = dirs.keys().chain(files.keys()).collect();
    let mut layer = LayerBuilder::new();
    for path in paths {
        if let Some(mode) = dirs.get(path) {
            layer.dir(path, *mode)?;
        } else if let Some((mode, data)) = files.get(path) {
            layer.file(path, *mode, data)?;
        }
    }
    layer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn entries(tar_bytes: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
        let mut archive = tar::Archive::new(tar_bytes);
        archive
            .entries()
            .unwrap()
            .map(|entry| {
                let mut entry = entry.unwrap();
                let path = entry.path().unwrap().to_string_lossy().into_owned();
                let mode = entry.header().mode().unwrap();
                assert_eq!(entry.header().mtime().unwrap(), 0, "{path}");
                assert_eq!(entry.header().uid().unwrap(), 0, "{path}");
                let mut data = Vec::new();
                entry.read_to_end(&mut data).unwrap();
                (path.trim_end_matches('/').to_string(), mode, data)
            })
            .collect()
    }

    /// A small glibc program stands in for cloudcore (coreutils' `true`).
    const STAND_IN: &str = "/bin/true";

    fn spec() -> CloudcoreImageSpec {
        CloudcoreImageSpec::new(STAND_IN, "9.9.9")
    }

    #[test]
    fn layer_holds_the_binary_its_loader_libraries_and_accounts() {
        let spec = spec();
        let built = build(&spec).unwrap();
        let entries = entries(&built.image.layers[0].data);
        let find = |p: &str| {
            entries
                .iter()
                .find(|e| e.0 == p)
                .unwrap_or_else(|| panic!("{p} not in the layer"))
        };
        let binary = find("usr/local/bin/cloudcore");
        assert_eq!(binary.1, 0o755);
        assert_eq!(binary.2, std::fs::read(&spec.binary).unwrap());
        let info = elf::read_dynamic_info(&spec.binary).unwrap();
        let loader = info.interpreter.expect("a dynamically linked test binary");
        assert_eq!(
            find(loader.trim_start_matches('/')).2,
            std::fs::read(&loader).unwrap()
        );
        assert!(
            built
                .runtime_files
                .iter()
                .any(|f| f.image_path.ends_with("/libc.so.6")),
            "{:?}",
            built.runtime_files
        );
        for f in &built.runtime_files {
            find(f.image_path.trim_start_matches('/'));
        }
        let passwd = String::from_utf8(find("etc/passwd").2.clone()).unwrap();
        assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
        assert_eq!(find("tmp").1, 0o1777);
        // Every entry's parent comes before it.
        for (i, e) in entries.iter().enumerate() {
            if let Some(parent) = Path::new(&e.0)
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
            {
                let parent = parent.display().to_string();
                let at = entries.iter().position(|x| x.0 == parent);
                assert!(
                    at.is_some_and(|at| at < i),
                    "{parent} missing before {}",
                    e.0
                );
            }
        }
        // Nothing else: the binary, what it loads, the accounts and the directories.
        let files = entries.iter().filter(|e| !e.2.is_empty()).count();
        assert_eq!(files, 1 + built.runtime_files.len() + 2);
    }

    #[test]
    fn config_runs_cloudcore_as_nonroot_with_version_labels() {
        let mut spec = spec();
        spec.extra_labels
            .insert("org.opencontainers.image.revision".into(), "abc".into());
        let built = build(&spec).unwrap();
        let config: serde_json::Value = serde_json::from_slice(&built.image.config.data).unwrap();
        let c = &config["config"];
        assert_eq!(c["Entrypoint"], serde_json::json!([BINARY_PATH]));
        assert_eq!(c["Cmd"], serde_json::json!(DEFAULT_ARGS));
        assert_eq!(c["User"], "65532:65532");
        assert_eq!(c["Labels"]["org.opencontainers.image.version"], "9.9.9");
        assert_eq!(c["Labels"]["org.opencontainers.image.title"], "cloudcore");
        assert_eq!(c["Labels"]["org.opencontainers.image.revision"], "abc");
        assert!(c["ExposedPorts"].get("10000/tcp").is_some());
    }

    #[test]
    fn same_inputs_give_the_same_digests_whatever_the_mtimes() {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("cloudcore");
        std::fs::copy(STAND_IN, &copy).unwrap();
        let first = build(&CloudcoreImageSpec::new(&copy, "1.0.0"))
            .unwrap()
            .image;
        // A rebuild touches the file: its mtime must not matter.
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&copy)
            .unwrap()
            .set_modified(later)
            .unwrap();
        let second = build(&CloudcoreImageSpec::new(&copy, "1.0.0"))
            .unwrap()
            .image;
        assert_eq!(first.manifest.digest, second.manifest.digest);
        assert_eq!(first.layers[0].digest, second.layers[0].digest);
        let other = build(&CloudcoreImageSpec::new(&copy, "1.0.1"))
            .unwrap()
            .image;
        assert_eq!(other.layers[0].digest, first.layers[0].digest);
        assert_ne!(other.config.digest, first.config.digest);
    }

    #[test]
    fn a_missing_binary_says_how_to_build_it() {
        let e = build(&CloudcoreImageSpec::new("/nonexistent/cloudcore", "1"))
            .err()
            .unwrap();
        assert!(
            e.to_string().contains("cargo build --release -p cloudcore"),
            "{e}"
        );
    }
}
