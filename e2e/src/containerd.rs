//! A private containerd for tests and the local demo: its own root, state, socket, CNI bridge
//! and registry under one temporary directory, torn down completely afterwards.
//!
//! [`Containerd::start`] (blocking, ~1–2 s):
//! 1. checks it runs as root and that the packages of `scripts/setup.sh` are installed;
//! 2. reaps what crashed earlier runs left behind (see [`reap_stale_instances`]);
//! 3. builds the busybox and pause images ([`crate::images`]) and starts a private
//!    `docker-registry` on a free loopback port with both images pushed to it;
//! 4. writes a bridge CNI conflist on a /24 of its own, the registry host mappings
//!    (`localhost:5000` and `docker.io` → the private registry, plain HTTP) and a
//!    `config.toml` (version 2) with the settings this machine requires (e2e/RUNTIME.md);
//! 5. starts containerd, waits for its socket, imports both images with
//!    `ctr images import` and waits until CRI lists them.
//!
//! [`Containerd::shutdown`] (also on drop, and at process exit for [`Containerd::shared`])
//! stops and removes every pod sandbox through CRI (so CNI releases IPs, iptables rules and
//! network namespaces), stops containerd and the registry, kills leftover shims, deletes the
//! bridge, unmounts what is still mounted under the directory and removes it.
//!
//! Children are started with a parent-death signal ([`crate::process::spawn_tied`]); a
//! killed test process still leaves containers and mounts behind (containerd's shims are not
//! our children), which the next start reaps: every instance directory holds a `lock` file
//! `flock`ed for the instance's lifetime, so a directory whose lock can be taken is stale.

use std::future::Future;
use std::io;
use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use kubeedge_edged::cri::{CriClient, CriError, api};
use serde_json::json;

use crate::images::{
    self, BUSYBOX_DOCKER_HUB_IMAGE, BUSYBOX_IMAGE, ImageError, OciImage, PAUSE_IMAGE,
};
use crate::process;
use crate::registry::{self, Registry, RegistryError};

mod reboot;

pub const CONTAINERD_BINARY: &str = "/usr/bin/containerd";
pub const CTR_BINARY: &str = "/usr/bin/ctr";
/// CNI plugins of Debian's `containernetworking-plugins`.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// The containerd namespace CRI uses.
pub const CRI_NAMESPACE: &str = "k8s.io";

/// Instance directories are `<temp dir>/kubeedge-e2e-containerd-<pid>-<n>`.
const INSTANCE_PREFIX: &str = "kubeedge-e2e-containerd-";
/// Per-machine CNI subnet slots: `<temp dir>/kubeedge-e2e-cni-slots/<slot>.lock`.
const SLOT_DIR: &str = "kubeedge-e2e-cni-slots";
/// Slot `n` uses 10.240.0.0/24 + n·256 (10.240.0.0 – 10.243.255.0) and bridge `kee2e<n>`.
const SLOTS: u32 = 1024;

const SOCKET_TIMEOUT: Duration = Duration::from_secs(30);
const CRI_IMAGES_TIMEOUT: Duration = Duration::from_secs(20);
const CRI_CLEANUP_TIMEOUT: Duration = Duration::from_secs(60);
const PATH_ENV: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The tools `scripts/setup.sh` installs, with the package that provides each.
const REQUIRED_TOOLS: &[(&str, &str)] = &[
    (CONTAINERD_BINARY, "containerd"),
    (CTR_BINARY, "containerd"),
    ("/usr/bin/containerd-shim-runc-v2", "containerd"),
    ("/usr/sbin/runc", "runc"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/usr/lib/cni/host-local", "containernetworking-plugins"),
    ("/usr/lib/cni/portmap", "containernetworking-plugins"),
    ("/usr/sbin/iptables", "iptables"),
    ("/usr/sbin/ip", "iproute2"),
    (images::BUSYBOX_BINARY, "busybox-static"),
    (registry::REGISTRY_BINARY, "docker-registry"),
    ("/usr/bin/gcc", "gcc"),
];

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error(
        "the containerd test environment needs root (it runs containerd, mounts overlays and \
         creates network namespaces): run the tests as root after `sudo bash scripts/setup.sh`, \
         e.g. `sudo bash scripts/test.sh`"
    )]
    NotRoot,
    #[error("{path} is missing: install package {package} with `sudo bash scripts/setup.sh`")]
    MissingTool {
        path: &'static str,
        package: &'static str,
    },
    #[error("building test images: {0}")]
    Image(#[from] ImageError),
    #[error("local registry: {0}")]
    Registry(#[from] RegistryError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("no free CNI subnet slot in 10.240.0.0/14 ({SLOTS} slots are held or in use)")]
    NoSubnet,
    #[error("{what}; containerd log {log}:\n{log_tail}")]
    Containerd {
        what: String,
        log: String,
        log_tail: String,
    },
    #[error("`ctr {args}` failed ({status}): {output}")]
    Ctr {
        args: String,
        status: String,
        output: String,
    },
    #[error("CRI: {0}")]
    Cri(String),
    #[error("the shared containerd failed to start: {0}")]
    Shared(String),
}

fn io_error(context: impl Into<String>) -> impl FnOnce(io::Error) -> HarnessError {
    let context = context.into();
    move |source| HarnessError::Io { context, source }
}

/// A running private containerd; see the module documentation.
pub struct Containerd {
    dir: PathBuf,
    socket: PathBuf,
    slot: u32,
    registry: Registry,
    busybox: OciImage,
    pause: OciImage,
    running: Mutex<Option<Running>>,
}

/// What [`Containerd::shutdown`] releases.
struct Running {
    containerd: Child,
    /// Held for the instance's lifetime: marks `dir` as live.
    _dir_lock: std::fs::File,
    /// Held for the instance's lifetime: owns the CNI subnet and bridge name.
    _slot_lock: std::fs::File,
}

impl Containerd {
    /// Starts a private containerd (and registry). Blocking; fine to call inside a tokio
    /// runtime. Fails with a message naming what is missing when not root or when the packages
    /// of `scripts/setup.sh` are not installed.
    pub fn start() -> Result<Self, HarnessError> {
        preflight()?;
        reap_stale_instances();
        let started = Instant::now();

        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "{INSTANCE_PREFIX}{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        if dir.exists() {
            // Left by an earlier process with our pid: nothing of it can be running now that
            // its lock is not held (reap_stale_instances just ran).
            cleanup_dir(&dir);
        }
        std::fs::create_dir_all(&dir).map_err(io_error(format!("creating {}", dir.display())))?;
        let dir_lock = process::try_lock_file(&dir.join("lock"))
            .map_err(io_error("locking the instance directory"))?
            .ok_or_else(|| HarnessError::Io {
                context: format!("locking {}", dir.display()),
                source: io::Error::other("held by another process"),
            })?;
        let (slot, slot_lock) = acquire_subnet_slot()?;
        std::fs::write(dir.join("bridge"), bridge_name(slot))
            .map_err(io_error("recording the bridge name"))?;

        let instance = Self::start_in(dir.clone(), slot, dir_lock, slot_lock);
        match instance {
            Ok(instance) => {
                tracing::info!(
                    dir = %instance.dir.display(),
                    registry = %instance.registry.host(),
                    subnet = %instance.pod_subnet(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "containerd test environment ready"
                );
                Ok(instance)
            }
            Err(e) => {
                // start_in stopped what it had started on its way out (errors carry the tail
                // of the relevant log); the directory and a bridge may remain.
                delete_bridge(&bridge_name(slot));
                cleanup_dir(&dir);
                Err(e)
            }
        }
    }

    fn start_in(
        dir: PathBuf,
        slot: u32,
        dir_lock: std::fs::File,
        slot_lock: std::fs::File,
    ) -> Result<Self, HarnessError> {
        let t = Instant::now();
        let busybox = images::busybox()?;
        let pause = images::pause(&dir.join("build"))?;
        let images_dir = dir.join("images");
        std::fs::create_dir_all(&images_dir).map_err(io_error("creating images dir"))?;
        let busybox_tar = images_dir.join("busybox.tar");
        let pause_tar = images_dir.join("pause.tar");
        busybox.write_archive_file(&busybox_tar, &[BUSYBOX_IMAGE])?;
        pause.write_archive_file(&pause_tar, &[PAUSE_IMAGE])?;
        tracing::debug!(elapsed_ms = t.elapsed().as_millis() as u64, "images built");

        let t = Instant::now();
        let registry = Registry::start(&dir.join("registry"))?;
        for (image, reference) in [
            (&busybox, BUSYBOX_IMAGE),
            (&busybox, BUSYBOX_DOCKER_HUB_IMAGE),
            (&pause, PAUSE_IMAGE),
        ] {
            let (repository, tag) = images::repository_and_tag(reference);
            registry.push(image, repository, tag)?;
        }
        tracing::debug!(
            elapsed_ms = t.elapsed().as_millis() as u64,
            registry = %registry.host(),
            "registry started, images pushed"
        );

        let socket = dir.join("containerd.sock");
        write_cni_config(&dir, slot)?;
        write_registry_hosts(&dir, &registry.host())?;
        let config = dir.join("config.toml");
        std::fs::write(&config, containerd_config(&dir, &socket))
            .map_err(io_error("writing config.toml"))?;

        let t = Instant::now();
        let containerd = spawn_containerd(&dir)?;

        let instance = Self {
            dir,
            socket,
            slot,
            registry,
            busybox,
            pause,
            running: Mutex::new(Some(Running {
                containerd,
                _dir_lock: dir_lock,
                _slot_lock: slot_lock,
            })),
        };
        // From here on a failure drops `instance`, which shuts everything down.
        instance.wait_for_socket()?;
        tracing::debug!(
            elapsed_ms = t.elapsed().as_millis() as u64,
            "containerd socket up"
        );

        let t = Instant::now();
        for archive in [&pause_tar, &busybox_tar] {
            instance.ctr(&["images".as_ref(), "import".as_ref(), archive.as_os_str()])?;
        }
        instance.wait_for_cri_images()?;
        tracing::debug!(
            elapsed_ms = t.elapsed().as_millis() as u64,
            "images imported"
        );
        Ok(instance)
    }

    /// One containerd per test process, started on first use and shut down when the process
    /// exits (an `atexit` handler: Rust never drops statics). Tests that share it must not
    /// disturb each other: use unique pod names/uids and do not remove the shared images
    /// (CRI `RemoveImage` removes every tag of an image).
    pub fn shared() -> Result<&'static Self, HarnessError> {
        static SHARED: OnceLock<Result<Containerd, String>> = OnceLock::new();
        extern "C" fn shutdown_shared_at_exit() {
            let _ = std::panic::catch_unwind(|| {
                if let Some(Ok(containerd)) = SHARED.get() {
                    containerd.shutdown();
                }
            });
        }
        let shared = SHARED.get_or_init(|| {
            let started = Self::start().map_err(|e| e.to_string());
            if started.is_ok() {
                // SAFETY: registering a plain extern "C" fn with no arguments.
                unsafe {
                    libc::atexit(shutdown_shared_at_exit);
                }
            }
            started
        });
        shared
            .as_ref()
            .map_err(|message| HarnessError::Shared(message.clone()))
    }

    /// The instance directory (config, logs, root, state, registry storage).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// containerd's gRPC socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The CRI endpoint, `unix:///…/containerd.sock`, as edgecore's config takes it.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// A CRI client connected to this containerd.
    pub async fn cri(&self) -> Result<CriClient, CriError> {
        CriClient::connect(&self.endpoint()).await
    }

    /// The private registry (`localhost:5000/…` and `docker.io/…` resolve to it).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The busybox image as built and imported ([`BUSYBOX_IMAGE`]).
    pub fn busybox(&self) -> &OciImage {
        &self.busybox
    }

    /// The sandbox image as built and imported ([`PAUSE_IMAGE`]).
    pub fn pause(&self) -> &OciImage {
        &self.pause
    }

    /// The pod subnet of the bridge network, e.g. `10.240.7.0/24`.
    pub fn pod_subnet(&self) -> String {
        format!("{}/24", subnet_base(self.slot))
    }

    /// The bridge interface pods attach to (also the CNI network name's suffix).
    pub fn bridge(&self) -> String {
        bridge_name(self.slot)
    }

    /// The pod IPs host-local IPAM holds leases for (its files named by IP): a sandbox's IP
    /// is leased from its RunPodSandbox until its network is torn down (StopPodSandbox).
    pub fn ip_leases(&self) -> Vec<Ipv4Addr> {
        let dir = self.dir.join("cni-ipam").join(network_name(self.slot));
        let mut ips: Vec<Ipv4Addr> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        ips.sort();
        ips
    }

    /// containerd's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }

    /// Whether containerd is still running.
    pub fn is_running(&self) -> bool {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running
            .as_mut()
            .is_some_and(|r| matches!(r.containerd.try_wait(), Ok(None)))
    }

    /// containerd's process id (0 once it is shut down): for benchmarks sampling it.
    pub fn pid(&self) -> u32 {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running.as_ref().map_or(0, |r| r.containerd.id())
    }

    fn containerd_failure(&self, what: impl Into<String>) -> HarnessError {
        HarnessError::Containerd {
            what: what.into(),
            log: self.log_path().display().to_string(),
            log_tail: registry::log_tail(&self.log_path()),
        }
    }

    fn wait_for_socket(&self) -> Result<(), HarnessError> {
        let deadline = Instant::now() + SOCKET_TIMEOUT;
        loop {
            if UnixStream::connect(&self.socket).is_ok() {
                return Ok(());
            }
            if !self.is_running() {
                return Err(self.containerd_failure("containerd exited during start-up"));
            }
            if Instant::now() > deadline {
                return Err(self.containerd_failure(format!(
                    "containerd's socket {} did not appear within {SOCKET_TIMEOUT:?}",
                    self.socket.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `ctr -a <socket> -n k8s.io <args>` and returns its stdout.
    pub fn ctr(&self, args: &[&std::ffi::OsStr]) -> Result<String, HarnessError> {
        let output = Command::new(CTR_BINARY)
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", CRI_NAMESPACE])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(io_error("running ctr"))?;
        if !output.status.success() {
            return Err(HarnessError::Ctr {
                args: args
                    .iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" "),
                status: output.status.to_string(),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// CRI learns about images `ctr` imported from containerd's events, asynchronously.
    fn wait_for_cri_images(&self) -> Result<(), HarnessError> {
        let endpoint = self.endpoint();
        block_on_fresh_runtime(async move {
            let cri = CriClient::connect(&endpoint)
                .await
                .map_err(|e| HarnessError::Cri(e.to_string()))?;
            let deadline = Instant::now() + CRI_IMAGES_TIMEOUT;
            for image in [PAUSE_IMAGE, BUSYBOX_IMAGE] {
                loop {
                    let status = cri
                        .image()
                        .image_status(api::ImageStatusRequest {
                            image: Some(api::ImageSpec {
                                image: image.to_string(),
                                ..Default::default()
                            }),
                            verbose: false,
                        })
                        .await
                        .map_err(|e| HarnessError::Cri(format!("ImageStatus {image}: {e}")))?;
                    if status.into_inner().image.is_some() {
                        break;
                    }
                    if Instant::now() > deadline {
                        return Err(HarnessError::Cri(format!(
                            "{image} was imported but CRI does not list it"
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Ok(())
        })
    }

    /// Stops and removes every pod sandbox through CRI, stops containerd and the registry,
    /// kills leftover shims, deletes the bridge, unmounts and removes the directory.
    /// Idempotent; called on drop.
    pub fn shutdown(&self) {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(mut running) = running else {
            return;
        };
        let started = Instant::now();
        if matches!(running.containerd.try_wait(), Ok(None)) {
            let endpoint = self.endpoint();
            let removed = block_on_fresh_runtime(async move {
                tokio::time::timeout(CRI_CLEANUP_TIMEOUT, remove_all_sandboxes(&endpoint)).await
            });
            match removed {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => tracing::debug!(sandboxes = n, "removed leftover pod sandboxes"),
                Ok(Err(e)) => tracing::warn!(error = %e, "removing pod sandboxes"),
                Err(_) => tracing::warn!("removing pod sandboxes timed out"),
            }
        }
        process::terminate(&mut running.containerd, Duration::from_secs(10));
        // Shims of containers CRI could not remove; they name our socket on their command line.
        let killed = process::kill_process_trees_mentioning(&self.socket.display().to_string());
        if killed > 0 {
            tracing::warn!(processes = killed, "killed leftover containerd shims");
        }
        self.registry.stop();
        delete_bridge(&self.bridge());
        cleanup_dir(&self.dir);
        drop(running);
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "containerd test environment removed"
        );
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts containerd on the instance's `config.toml`, its output appended to `containerd.log`.
fn spawn_containerd(dir: &Path) -> Result<Child, HarnessError> {
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(dir.join("containerd.log"))
        .map_err(io_error("opening containerd.log"))?;
    let log_err = log
        .try_clone()
        .map_err(io_error("duplicating containerd.log"))?;
    let mut command = Command::new(CONTAINERD_BINARY);
    command
        .arg("--config")
        .arg(dir.join("config.toml"))
        .env("PATH", PATH_ENV)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    process::spawn_tied(command).map_err(io_error("starting containerd"))
}

/// Stops and removes every pod sandbox (and with them their containers). Returns how many.
async fn remove_all_sandboxes(endpoint: &str) -> Result<usize, String> {
    let cri = CriClient::connect(endpoint)
        .await
        .map_err(|e| e.to_string())?;
    let mut runtime = cri.runtime();
    let sandboxes = runtime
        .list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
        .await
        .map_err(|e| format!("ListPodSandbox: {e}"))?
        .into_inner()
        .items;
    for sandbox in &sandboxes {
        let id = sandbox.id.clone();
        runtime
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .map_err(|e| format!("StopPodSandbox {id}: {e}"))?;
        runtime
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .map_err(|e| format!("RemovePodSandbox {id}: {e}"))?;
    }
    Ok(sandboxes.len())
}

/// Runs `future` to completion on a new current-thread runtime in a scoped thread, so it can
/// be called from synchronous code that may itself run inside a tokio runtime.
fn block_on_fresh_runtime<F>(future: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("building a tokio runtime")
                    .block_on(future)
            })
            .join()
            .expect("harness runtime thread panicked")
    })
}

fn preflight() -> Result<(), HarnessError> {
    if !process::is_root() {
        return Err(HarnessError::NotRoot);
    }
    for (path, package) in REQUIRED_TOOLS {
        if !Path::new(path).exists() {
            return Err(HarnessError::MissingTool { path, package });
        }
    }
    Ok(())
}

fn bridge_name(slot: u32) -> String {
    format!("kee2e{slot}")
}

/// The CNI network name of a slot (also host-local's lease directory name).
fn network_name(slot: u32) -> String {
    format!("kubeedge-e2e-{slot}")
}

fn subnet_base(slot: u32) -> Ipv4Addr {
    let base = u32::from(Ipv4Addr::new(10, 240, 0, 0)) + (slot << 8);
    Ipv4Addr::from(base)
}

/// Takes the first free subnet slot (an `flock`ed file per slot, released when the holder
/// exits or dies) whose /24 no route of this machine overlaps.
fn acquire_subnet_slot() -> Result<(u32, std::fs::File), HarnessError> {
    let slot_dir = std::env::temp_dir().join(SLOT_DIR);
    std::fs::create_dir_all(&slot_dir)
        .map_err(io_error(format!("creating {}", slot_dir.display())))?;
    let routes = ipv4_routes();
    let first = std::process::id() % SLOTS;
    for i in 0..SLOTS {
        let slot = (first + i) % SLOTS;
        let base = u32::from(subnet_base(slot));
        if routes
            .iter()
            .any(|(dest, mask)| (base & mask) == (dest & mask) || (dest & 0xffff_ff00) == base)
        {
            continue;
        }
        let lock = process::try_lock_file(&slot_dir.join(format!("{slot}.lock")))
            .map_err(io_error("locking a CNI subnet slot"))?;
        if let Some(lock) = lock {
            // A bridge for this slot without a live owner was leaked by a killed run.
            delete_bridge(&bridge_name(slot));
            return Ok((slot, lock));
        }
    }
    Err(HarnessError::NoSubnet)
}

/// (destination, mask) of every IPv4 route, host byte order, from `/proc/net/route`, except
/// the default route.
fn ipv4_routes() -> Vec<(u32, u32)> {
    let Ok(table) = std::fs::read_to_string("/proc/net/route") else {
        return Vec::new();
    };
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let dest = u32::from_str_radix(fields.get(1)?, 16).ok()?;
            let mask = u32::from_str_radix(fields.get(7)?, 16).ok()?;
            // The kernel prints the network-order bytes as a native-endian u32.
            Some((
                u32::from_be_bytes(dest.to_ne_bytes()),
                u32::from_be_bytes(mask.to_ne_bytes()),
            ))
        })
        .filter(|(_, mask)| *mask != 0)
        .collect()
}

fn delete_bridge(bridge: &str) {
    if Path::new("/sys/class/net").join(bridge).exists() {
        let _ = Command::new("/usr/sbin/ip")
            .args(["link", "delete", bridge])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Unmounts a network namespace's bind mount (`/var/run/netns/…`) and removes the file.
fn cleanup_netns(path: &Path) {
    if let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) {
        // SAFETY: c_path is a valid NUL-terminated string for the duration of the call.
        unsafe {
            libc::umount2(c_path.as_ptr(), libc::MNT_DETACH);
        }
    }
    let _ = std::fs::remove_file(path);
}

/// Unmounts everything under `dir` and removes it; reports what it could not remove.
fn cleanup_dir(dir: &Path) {
    let stuck = process::unmount_all_under(dir);
    if !stuck.is_empty() {
        tracing::warn!(?stuck, "mounts could not be unmounted");
    }
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), error = %e, "could not remove the instance directory");
    }
}

/// Cleans up instance directories whose owner died without shutting down (SIGKILL, Ctrl-C
/// during `cargo test`): kills containerd, registry, shims and their containers that name the
/// directory, deletes the bridge, unmounts and removes the directory. Network namespaces and
/// iptables rules of sandboxes that were never stopped stay behind (CNI DEL needs the dead
/// containerd's state); they do not disturb later runs.
pub fn reap_stale_instances() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(INSTANCE_PREFIX) {
            continue;
        }
        let dir = entry.path();
        let lock_path = dir.join("lock");
        if !lock_path.exists() {
            // Being created right now by another process (the lock comes next), or not ours.
            continue;
        }
        let Ok(Some(_lock)) = process::try_lock_file(&lock_path) else {
            continue; // live
        };
        tracing::warn!(dir = %dir.display(), "reaping a containerd test environment left by a dead process");
        // With the trailing slash `…-1/` does not match a live `…-10/`.
        process::kill_process_trees_mentioning(&format!("{}/", dir.display()));
        if let Ok(bridge) = std::fs::read_to_string(dir.join("bridge")) {
            delete_bridge(bridge.trim());
        }
        cleanup_dir(&dir);
    }
}

fn write_cni_config(dir: &Path, slot: u32) -> Result<(), HarnessError> {
    let cni_dir = dir.join("cni");
    std::fs::create_dir_all(&cni_dir).map_err(io_error("creating the CNI config dir"))?;
    let base = subnet_base(slot);
    let conflist = json!({
        "cniVersion": "1.0.0",
        "name": network_name(slot),
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge_name(slot),
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": format!("{base}/24") }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                    "dataDir": dir.join("cni-ipam"),
                }
            },
            { "type": "portmap", "capabilities": { "portMappings": true } }
        ]
    });
    let path = cni_dir.join("10-kubeedge-e2e.conflist");
    let text = serde_json::to_string_pretty(&conflist).expect("JSON value serialises");
    std::fs::write(&path, text).map_err(io_error(format!("writing {}", path.display())))
}

/// `certs.d/<host>/hosts.toml` for `localhost:5000` and `docker.io`, both served by the
/// private registry over plain HTTP.
fn write_registry_hosts(dir: &Path, registry_host: &str) -> Result<(), HarnessError> {
    for host in ["localhost:5000", "docker.io"] {
        let host_dir = dir.join("certs.d").join(host);
        std::fs::create_dir_all(&host_dir).map_err(io_error("creating certs.d"))?;
        let text = format!(
            "server = \"http://{registry_host}\"\n\n\
             [host.\"http://{registry_host}\"]\n  capabilities = [\"pull\", \"resolve\", \"push\"]\n"
        );
        std::fs::write(host_dir.join("hosts.toml"), text)
            .map_err(io_error("writing hosts.toml"))?;
    }
    Ok(())
}

fn containerd_config(dir: &Path, socket: &Path) -> String {
    // TOML basic strings and JSON strings escape the same way for paths.
    let q = |p: &Path| serde_json::to_string(&p.display().to_string()).expect("string");
    let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
    format!(
        r#"version = 2
root = {root}
state = {state}
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # This machine withholds CAP_SYS_RESOURCE: without this every RunPodSandbox fails.
  restrict_oom_score_adj = true
  # A random port (the default, made explicit): concurrent instances must not collide.
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = {cni}
  max_conf_num = 1

[{cri}.registry]
  config_path = {certs}
"#,
        root = q(&dir.join("root")),
        state = q(&dir.join("state")),
        socket = q(socket),
        ttrpc = q(&dir.join("containerd.sock.ttrpc")),
        opt = q(&dir.join("opt")),
        cni = q(&dir.join("cni")),
        certs = q(&dir.join("certs.d")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_map_to_distinct_subnets_in_10_240_slash_14() {
        assert_eq!(subnet_base(0), Ipv4Addr::new(10, 240, 0, 0));
        assert_eq!(subnet_base(1), Ipv4Addr::new(10, 240, 1, 0));
        assert_eq!(subnet_base(256), Ipv4Addr::new(10, 241, 0, 0));
        assert_eq!(subnet_base(SLOTS - 1), Ipv4Addr::new(10, 243, 255, 0));
        assert!(bridge_name(SLOTS - 1).len() <= 15, "IFNAMSIZ");
    }

    #[test]
    fn config_names_the_private_paths_and_required_settings() {
        let dir = Path::new("/tmp/x");
        let config = containerd_config(dir, &dir.join("containerd.sock"));
        for needle in [
            "root = \"/tmp/x/root\"",
            "address = \"/tmp/x/containerd.sock\"",
            "restrict_oom_score_adj = true",
            "SystemdCgroup = false",
            "snapshotter = \"overlayfs\"",
            "bin_dir = \"/usr/lib/cni\"",
            "conf_dir = \"/tmp/x/cni\"",
            "sandbox_image = \"localhost:5000/pause:3.9\"",
            "config_path = \"/tmp/x/certs.d\"",
        ] {
            assert!(config.contains(needle), "{needle} missing in\n{config}");
        }
    }

    #[test]
    fn routes_parse_from_proc_net_route() {
        // Whatever this machine has, loopback-free tables still parse to valid masks.
        for (dest, mask) in ipv4_routes() {
            assert_ne!(mask, 0);
            assert_eq!(dest & !mask, 0, "{dest:x}/{mask:x}");
        }
    }
}
