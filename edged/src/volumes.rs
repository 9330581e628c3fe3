//! Pod volumes on the node, under `<root>/pods/<uid>/volumes/<plugin>/<name>` as the kubelet
//! lays them out: emptyDir (a directory, or tmpfs for `medium: Memory`), hostPath (checked or
//! created per its type), and configMap / secret / downwardAPI / projected (files written
//! atomically through a `..data` symlink, so a container sees an update all at once).

use super::env::{ConfigError, ObjectSource, PodContext, field_value, format_map, resource_value};
use super::spec::{DownwardApiVolumeSource, KeyToPath, Pod, VolumeKind};
use kubeedge_shared::clock as time;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

const DEFAULT_MODE: u32 = 0o644;

/// A volume ready to be mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostVolume {
    pub path: PathBuf,
    /// configMap, secret, downwardAPI and projected volumes are always mounted read-only.
    pub read_only: bool,
}

/// Files of a volume: relative path → (content, mode).
pub type Payload = BTreeMap<String, (Vec<u8>, u32)>;

/// Service-account tokens of one pod, refreshed at 80 % of their lifetime.
#[derive(Debug, Default)]
pub struct TokenCache {
    tokens: HashMap<String, CachedToken>,
}

#[derive(Debug, Clone)]
struct CachedToken {
    token: String,
    refresh_at: SystemTime,
    expires_at: SystemTime,
}

fn plugin_dir(kind: VolumeKind) -> &'static str {
    match kind {
        VolumeKind::EmptyDir => "kubernetes.io~empty-dir",
        VolumeKind::HostPath => "kubernetes.io~host-path",
        VolumeKind::ConfigMap => "kubernetes.io~configmap",
        VolumeKind::Secret => "kubernetes.io~secret",
        VolumeKind::DownwardApi => "kubernetes.io~downward-api",
        VolumeKind::Projected => "kubernetes.io~projected",
    }
}

fn io_err(what: impl std::fmt::Display) -> impl FnOnce(io::Error) -> ConfigError {
    move |e| ConfigError(format!("{what}: {e}"))
}

/// Sets up every volume of `pod` (idempotent: unchanged files are not rewritten). Returns the
/// host path of each volume by name.
pub async fn prepare<S: ObjectSource>(
    pod: &Pod,
    pod_dir: &Path,
    ctx: &PodContext,
    source: &S,
    tokens: &mut TokenCache,
) -> Result<HashMap<String, HostVolume>, ConfigError> {
    let mut out = HashMap::new();
    for (i, v) in pod.spec.volumes.iter().enumerate() {
        let field = format!("spec.volumes[{i}]");
        let kind = v.kind(&field).map_err(|e| ConfigError(e.to_string()))?;
        let dir = pod_dir.join("volumes").join(plugin_dir(kind)).join(&v.name);
        let ctx_err = |e: ConfigError| ConfigError(format!("volume {:?}: {}", v.name, e.0));
        let volume = match kind {
            VolumeKind::EmptyDir => {
                let medium = v
                    .empty_dir
                    .as_ref()
                    .and_then(|e| e.medium.as_deref())
                    .unwrap_or("");
                empty_dir(
                    &dir,
                    medium,
                    v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref()),
                )
                .map_err(ctx_err)?;
                HostVolume {
                    path: dir,
                    read_only: false,
                }
            }
            VolumeKind::HostPath => {
                let hp = v.host_path.clone().unwrap_or_default();
                host_path(Path::new(&hp.path), hp.type_.as_deref().unwrap_or(""))
                    .map_err(ctx_err)?;
                HostVolume {
                    path: PathBuf::from(hp.path),
                    read_only: false,
                }
            }
            VolumeKind::ConfigMap => {
                let cm = v.config_map.clone().unwrap_or_default();
                let fetched = source.configmap(&pod.metadata.namespace, &cm.name).await;
                let object = ObjectVolume {
                    kind: "ConfigMap",
                    secret: false,
                    name: &cm.name,
                    items: &cm.items,
                    default_mode: cm.default_mode,
                    optional: cm.optional.unwrap_or(false),
                };
                let payload = object.payload(fetched).map_err(ctx_err)?;
                write_atomic(&dir, &payload).map_err(io_err(format!("volume {:?}", v.name)))?;
                HostVolume {
                    path: dir,
                    read_only: true,
                }
            }
            VolumeKind::Secret => {
                let s = v.secret.clone().unwrap_or_default();
                let fetched = source.secret(&pod.metadata.namespace, &s.secret_name).await;
                let object = ObjectVolume {
                    kind: "Secret",
                    secret: true,
                    name: &s.secret_name,
                    items: &s.items,
                    default_mode: s.default_mode,
                    optional: s.optional.unwrap_or(false),
                };
                let payload = object.payload(fetched).map_err(ctx_err)?;
                write_atomic(&dir, &payload).map_err(io_err(format!("volume {:?}", v.name)))?;
                HostVolume {
                    path: dir,
                    read_only: true,
                }
            }
            VolumeKind::DownwardApi => {
                let d = v.downward_api.clone().unwrap_or_default();
                let mode = d.default_mode.map(|m| m as u32).unwrap_or(DEFAULT_MODE);
                let payload = downward_payload(pod, ctx, &d, mode).map_err(ctx_err)?;
                write_atomic(&dir, &payload).map_err(io_err(format!("volume {:?}", v.name)))?;
                HostVolume {
                    path: dir,
                    read_only: true,
                }
            }
            VolumeKind::Projected => {
                let p = v.projected.clone().unwrap_or_default();
                let mode = p.default_mode.map(|m| m as u32).unwrap_or(DEFAULT_MODE);
                let mut payload = Payload::new();
                for src in &p.sources {
                    if let Some(cm) = &src.config_map {
                        let optional = cm.optional.unwrap_or(false);
                        match source
                            .configmap(&pod.metadata.namespace, &cm.name)
                            .await
                            .map_err(|e| {
                                ConfigError(format!(
                                    "volume {:?}: cannot get configmap \"{}\": {e}",
                                    v.name, cm.name
                                ))
                            })? {
                            Some(obj) => payload.extend(
                                object_payload(
                                    &obj,
                                    false,
                                    &cm.items,
                                    mode,
                                    optional,
                                    "ConfigMap",
                                    &cm.name,
                                )
                                .map_err(ctx_err)?,
                            ),
                            None if optional => {}
                            None => {
                                return Err(ConfigError(format!(
                                    "volume {:?}: configmap \"{}\" not found",
                                    v.name, cm.name
                                )));
                            }
                        }
                    }
                    if let Some(s) = &src.secret {
                        let optional = s.optional.unwrap_or(false);
                        match source
                            .secret(&pod.metadata.namespace, &s.name)
                            .await
                            .map_err(|e| {
                                ConfigError(format!(
                                    "volume {:?}: cannot get secret \"{}\": {e}",
                                    v.name, s.name
                                ))
                            })? {
                            Some(obj) => payload.extend(
                                object_payload(
                                    &obj, true, &s.items, mode, optional, "Secret", &s.name,
                                )
                                .map_err(ctx_err)?,
                            ),
                            None if optional => {}
                            None => {
                                return Err(ConfigError(format!(
                                    "volume {:?}: secret \"{}\" not found",
                                    v.name, s.name
                                )));
                            }
                        }
                    }
                    if let Some(d) = &src.downward_api {
                        payload.extend(downward_payload(pod, ctx, d, mode).map_err(ctx_err)?);
                    }
                    if let Some(t) = &src.service_account_token {
                        let token = service_account_token(pod, source, tokens, t, &dir)
                            .await
                            .map_err(ctx_err)?;
                        payload.insert(t.path.clone(), (token.into_bytes(), mode));
                    }
                }
                write_atomic(&dir, &payload).map_err(io_err(format!("volume {:?}", v.name)))?;
                HostVolume {
                    path: dir,
                    read_only: true,
                }
            }
        };
        out.insert(v.name.clone(), volume);
    }
    Ok(out)
}

/// A configMap or secret volume: the same files from either kind of object.
struct ObjectVolume<'a> {
    kind: &'static str,
    secret: bool,
    name: &'a str,
    items: &'a [KeyToPath],
    default_mode: Option<i32>,
    optional: bool,
}

impl ObjectVolume<'_> {
    /// The files of the volume from the fetched object (a missing optional object is empty).
    fn payload(&self, fetched: Result<Option<Value>, String>) -> Result<Payload, ConfigError> {
        let what = self.kind.to_ascii_lowercase();
        let mode = self.default_mode.map(|m| m as u32).unwrap_or(DEFAULT_MODE);
        match fetched
            .map_err(|e| ConfigError(format!("cannot get {what} \"{}\": {e}", self.name)))?
        {
            Some(obj) => object_payload(
                &obj,
                self.secret,
                self.items,
                mode,
                self.optional,
                self.kind,
                self.name,
            ),
            None if self.optional => Ok(Payload::new()),
            None => Err(ConfigError(format!("{what} \"{}\" not found", self.name))),
        }
    }
}

fn object_payload(
    obj: &Value,
    secret: bool,
    items: &[KeyToPath],
    default_mode: u32,
    optional: bool,
    kind: &str,
    name: &str,
) -> Result<Payload, ConfigError> {
    let data = super::env::string_data(obj, secret)
        .map_err(|e| ConfigError(format!("{kind} \"{name}\": {e}")))?;
    let mut payload = Payload::new();
    if items.is_empty() {
        for (k, v) in data {
            payload.insert(k, (v, default_mode));
        }
        return Ok(payload);
    }
    for item in items {
        match data.get(&item.key) {
            Some(v) => {
                let mode = item.mode.map(|m| m as u32).unwrap_or(default_mode);
                payload.insert(item.path.clone(), (v.clone(), mode));
            }
            None if optional => {}
            None => {
                return Err(ConfigError(format!(
                    "configured to use key {} of {kind} \"{name}\", which does not exist",
                    item.key
                )));
            }
        }
    }
    Ok(payload)
}

fn downward_payload(
    pod: &Pod,
    ctx: &PodContext,
    d: &DownwardApiVolumeSource,
    default_mode: u32,
) -> Result<Payload, ConfigError> {
    let mut payload = Payload::new();
    for item in &d.items {
        let mode = item.mode.map(|m| m as u32).unwrap_or(default_mode);
        let text = if let Some(f) = &item.field_ref {
            match f.field_path.as_str() {
                "metadata.labels" => format_map(&pod.metadata.labels),
                "metadata.annotations" => format_map(&pod.metadata.annotations),
                path => field_value(pod, ctx, path)?,
            }
        } else if let Some(r) = &item.resource_field_ref {
            let name = r.container_name.as_deref().unwrap_or("");
            let container = pod
                .spec
                .containers
                .iter()
                .chain(&pod.spec.init_containers)
                .find(|c| c.name == name)
                .ok_or_else(|| {
                    ConfigError(format!(
                        "downwardAPI item {:?}: resourceFieldRef needs the name of a container",
                        item.path
                    ))
                })?;
            resource_value(pod, container, ctx, r)?
        } else {
            return Err(ConfigError(format!(
                "downwardAPI item {:?} names no field",
                item.path
            )));
        };
        payload.insert(item.path.clone(), (text.into_bytes(), mode));
    }
    Ok(payload)
}

async fn service_account_token<S: ObjectSource>(
    pod: &Pod,
    source: &S,
    cache: &mut TokenCache,
    t: &super::spec::ServiceAccountTokenProjection,
    dir: &Path,
) -> Result<String, ConfigError> {
    let sa = pod
        .spec
        .service_account_name
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into());
    // The API's bounds (10 minutes to 2^32 seconds): the spec may come from anywhere, and
    // `now + expiration` must stay representable.
    let expiration = t.expiration_seconds.unwrap_or(3600).clamp(600, 1 << 32);
    let audience = t.audience.clone().unwrap_or_default();
    let key = format!("{sa}/{audience}/{expiration}");
    let now = SystemTime::now();
    if let Some(c) = cache.tokens.get(&key)
        && now < c.refresh_at
    {
        return Ok(c.token.clone());
    }
    let mut spec = json!({
        "expirationSeconds": expiration,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
            "name": pod.metadata.name, "uid": pod.metadata.uid},
    });
    if !audience.is_empty() {
        spec["audiences"] = json!([audience]);
    }
    let request = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "metadata": {"name": sa, "namespace": pod.metadata.namespace},
        "spec": spec,
    });
    match source
        .service_account_token(&pod.metadata.namespace, &sa, request)
        .await
    {
        Ok(reply) => {
            let token = reply["status"]["token"]
                .as_str()
                .filter(|t| !t.is_empty())
                .ok_or_else(|| ConfigError(format!("the token request for service account \"{sa}\" was answered without a token")))?
                .to_string();
            let expires_at = reply["status"]["expirationTimestamp"]
                .as_str()
                .and_then(time::parse_rfc3339)
                .unwrap_or(now + Duration::from_secs(expiration.unsigned_abs()));
            let ttl = expires_at.duration_since(now).unwrap_or(Duration::ZERO);
            // Refresh at 80 % of the lifetime, and at least daily (the kubelet's rule).
            let refresh = (ttl * 4 / 5).min(Duration::from_secs(24 * 3600));
            cache.tokens.insert(
                key,
                CachedToken {
                    token: token.clone(),
                    refresh_at: now + refresh,
                    expires_at,
                },
            );
            Ok(token)
        }
        Err(e) => {
            // Offline: keep what we have while it is valid, or what a previous run wrote.
            if let Some(c) = cache.tokens.get(&key)
                && now < c.expires_at
            {
                return Ok(c.token.clone());
            }
            if let Ok(existing) = std::fs::read_to_string(dir.join(&t.path))
                && !existing.is_empty()
            {
                tracing::warn!(pod = %pod.key(), error = %e, "cannot refresh the service account token; keeping the one on disk");
                return Ok(existing);
            }
            Err(ConfigError(format!(
                "cannot get a token for service account \"{sa}\": {e}"
            )))
        }
    }
}

fn empty_dir(dir: &Path, medium: &str, size_limit: Option<&Value>) -> Result<(), ConfigError> {
    std::fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
    match medium {
        "" => {}
        "Memory" => {
            if !is_mount_point(dir) {
                let size = size_limit
                    .and_then(super::quantity::from_json)
                    .and_then(|q| super::quantity::parse_units(&q))
                    .filter(|s| *s > 0);
                mount_tmpfs(dir, size)?;
            }
        }
        other => {
            return Err(ConfigError(format!(
                "emptyDir medium {other:?} is not supported (use \"\" or \"Memory\")"
            )));
        }
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
        .map_err(io_err(format!("chmod {}", dir.display())))
}

fn host_path(path: &Path, ty: &str) -> Result<(), ConfigError> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path);
    let shown = path.display();
    let want = |ok: bool, what: &str| {
        if ok {
            Ok(())
        } else {
            Err(ConfigError(format!(
                "hostPath type check failed: {shown} is not a {what}"
            )))
        }
    };
    match ty {
        "" => Ok(()),
        "DirectoryOrCreate" => match meta {
            Ok(m) => want(m.is_dir(), "directory"),
            Err(_) => {
                std::fs::create_dir_all(path).map_err(io_err(format!("creating {shown}")))?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
                    .map_err(io_err(format!("chmod {shown}")))
            }
        },
        "FileOrCreate" => match meta {
            Ok(m) => want(m.is_file(), "file"),
            Err(_) => {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(io_err(format!("creating {}", parent.display())))?;
                }
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(io_err(format!("creating {shown}")))?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
                    .map_err(io_err(format!("chmod {shown}")))
            }
        },
        _ => {
            let m = meta.map_err(|_| {
                ConfigError(format!(
                    "hostPath type check failed: {shown} does not exist"
                ))
            })?;
            let ft = m.file_type();
            match ty {
                "Directory" => want(ft.is_dir(), "directory"),
                "File" => want(ft.is_file(), "file"),
                "Socket" => want(ft.is_socket(), "socket"),
                "CharDevice" => want(ft.is_char_device(), "character device"),
                "BlockDevice" => want(ft.is_block_device(), "block device"),
                other => Err(ConfigError(format!("unknown hostPath type {other:?}"))),
            }
        }
    }
}

fn is_mount_point(dir: &Path) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let target = dir.display().to_string();
    mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mp| unescape_mount(mp) == target)
}

fn unescape_mount(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn mount_tmpfs(dir: &Path, size: Option<i128>) -> Result<(), ConfigError> {
    use std::ffi::CString;
    let c = |s: &str| CString::new(s).map_err(|_| ConfigError(format!("path {s:?} contains NUL")));
    let target = c(&dir.display().to_string())?;
    let fstype = c("tmpfs")?;
    let opts = c(&match size {
        Some(s) => format!("mode=0777,size={s}"),
        None => "mode=0777".into(),
    })?;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            opts.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(ConfigError(format!(
            "mounting tmpfs on {}: {}",
            dir.display(),
            io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Removes a pod's directory, unmounting memory-backed emptyDirs first. Refuses paths that
/// are not `<root>/pods/<uid>`.
pub fn remove_pod_dir(root: &Path, uid: &str) -> io::Result<()> {
    if uid.is_empty() || uid.contains('/') || uid == "." || uid == ".." {
        return Err(io::Error::other(format!(
            "refusing to remove pod dir for uid {uid:?}"
        )));
    }
    let dir = root.join("pods").join(uid);
    if !dir.exists() {
        return Ok(());
    }
    let empty = dir.join("volumes").join(plugin_dir(VolumeKind::EmptyDir));
    if let Ok(entries) = std::fs::read_dir(&empty) {
        for e in entries.flatten() {
            let p = e.path();
            if is_mount_point(&p) {
                unmount(&p)?;
            }
        }
    }
    std::fs::remove_dir_all(&dir)
}

fn unmount(p: &Path) -> io::Result<()> {
    let target = std::ffi::CString::new(p.display().to_string())
        .map_err(|_| io::Error::other("path contains NUL"))?;
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes `files` into `dir` the way the kubelet's AtomicWriter does: into a fresh hidden
/// directory, then switches the `..data` symlink to it in one rename; each top-level name is
/// a symlink through `..data`. Returns whether anything changed.
pub fn write_atomic(dir: &Path, files: &Payload) -> io::Result<bool> {
    // The kubelet's validatePayload: every path stays inside the volume (keys of a malformed
    // ConfigMap or Secret included).
    if let Some(bad) = files.keys().find(|k| !payload_path_ok(k)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid file name {bad:?} in the volume's payload"),
        ));
    }
    std::fs::create_dir_all(dir)?;
    let data_link = dir.join("..data");
    let old = std::fs::read_link(&data_link).ok();
    if let Some(old) = &old
        && same_contents(&dir.join(old), files)?
    {
        return Ok(false);
    }
    let stamp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let name = format!("..{}_{:09}", stamp.as_secs(), stamp.subsec_nanos());
    let fresh = dir.join(&name);
    std::fs::create_dir(&fresh)?;
    std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o755))?;
    for (rel, (bytes, mode)) in files {
        let path = fresh.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, bytes)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777))?;
    }
    let tmp_link = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp_link);
    symlink(&name, &tmp_link)?;
    std::fs::rename(&tmp_link, &data_link)?;
    let tops: BTreeSet<&str> = files.keys().filter_map(|k| k.split('/').next()).collect();
    for top in &tops {
        let link = dir.join(top);
        let target = format!("..data/{top}");
        match std::fs::read_link(&link) {
            Ok(t) if t == Path::new(&target) => {}
            _ => {
                let _ = std::fs::remove_file(&link);
                symlink(&target, &link)?;
            }
        }
    }
    for entry in std::fs::read_dir(dir)?.flatten() {
        let fname = entry.file_name().to_string_lossy().into_owned();
        if fname.starts_with("..") || tops.contains(fname.as_str()) {
            continue;
        }
        if entry.file_type().is_ok_and(|t| t.is_symlink()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    if let Some(old) = old {
        let old_dir = dir.join(&old);
        if old_dir.starts_with(dir) && old != Path::new(&name) {
            let _ = std::fs::remove_dir_all(old_dir);
        }
    }
    Ok(true)
}

/// Relative, no `..` element, not starting with `..` (the writer's own names), no NUL.
fn payload_path_ok(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.starts_with("..")
        && !path.contains('\0')
        && path.split('/').all(|p| p != "..")
}

fn same_contents(dir: &Path, files: &Payload) -> io::Result<bool> {
    let mut found = 0usize;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(_) => return Ok(false),
        };
        for e in entries.flatten() {
            let path = e.path();
            let ft = e.file_type()?;
            if ft.is_dir() {
                stack.push(path);
                continue;
            }
            let Ok(rel) = path.strip_prefix(dir) else {
                return Ok(false);
            };
            let rel = rel.display().to_string();
            let Some((bytes, mode)) = files.get(&rel) else {
                return Ok(false);
            };
            let meta = e.metadata()?;
            if meta.permissions().mode() & 0o7777 != mode & 0o7777
                || std::fs::read(&path)? != *bytes
            {
                return Ok(false);
            }
            found += 1;
        }
    }
    Ok(found == files.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(items: &[(&str, &str)]) -> Payload {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), (v.as_bytes().to_vec(), 0o644)))
            .collect()
    }

    /// Answers every TokenRequest with a token but no `expirationTimestamp`, and records the
    /// `expirationSeconds` asked for.
    struct TokenIssuer(std::sync::Mutex<Vec<Value>>);

    impl ObjectSource for TokenIssuer {
        async fn configmap(&self, _: &str, _: &str) -> Result<Option<Value>, String> {
            Ok(None)
        }
        async fn secret(&self, _: &str, _: &str) -> Result<Option<Value>, String> {
            Ok(None)
        }
        async fn service_account_token(&self, _: &str, _: &str, r: Value) -> Result<Value, String> {
            if let Ok(mut seen) = self.0.lock() {
                seen.push(r["spec"]["expirationSeconds"].clone());
            }
            Ok(json!({"status": {"token": "tok"}}))
        }
    }

    #[tokio::test]
    async fn out_of_range_token_expirations_are_clamped_to_the_api_bounds() {
        let tmp = tempfile::tempdir().unwrap();
        let pod = Pod::from_value(&json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {}}))
        .unwrap();
        let issuer = TokenIssuer(std::sync::Mutex::new(Vec::new()));
        let mut cache = TokenCache::default();
        for secs in [i64::MAX, i64::MIN, 1] {
            let t = super::super::spec::ServiceAccountTokenProjection {
                expiration_seconds: Some(secs),
                path: "token".into(),
                ..Default::default()
            };
            let token = service_account_token(&pod, &issuer, &mut cache, &t, tmp.path())
                .await
                .unwrap();
            assert_eq!(token, "tok");
        }
        assert_eq!(
            *issuer.0.lock().unwrap(),
            // The third is the second's cached token.
            vec![json!(1u64 << 32), json!(600)]
        );
    }

    #[test]
    fn payload_paths_outside_the_volume_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("v");
        for bad in ["../escape", "/etc/x", "a/../../b", "..data", ""] {
            let e = write_atomic(&dir, &payload(&[("ok", "1"), (bad, "x")])).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
            assert!(e.to_string().contains("invalid file name"), "{e}");
        }
        assert!(!tmp.path().join("escape").exists());
        assert!(
            write_atomic(
                &dir,
                &payload(&[("ok", "1"), (".hidden", "2"), ("a/b", "3")])
            )
            .unwrap()
        );
    }

    #[test]
    fn atomic_writes_switch_all_files_at_once_and_skip_unchanged_content() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cfg");
        assert!(write_atomic(&dir, &payload(&[("a", "1"), ("sub/b", "2")])).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "1");
        assert_eq!(std::fs::read_to_string(dir.join("sub/b")).unwrap(), "2");
        assert!(
            std::fs::symlink_metadata(dir.join("a"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let first = std::fs::read_link(dir.join("..data")).unwrap();
        assert!(!write_atomic(&dir, &payload(&[("a", "1"), ("sub/b", "2")])).unwrap());
        assert_eq!(std::fs::read_link(dir.join("..data")).unwrap(), first);

        assert!(write_atomic(&dir, &payload(&[("a", "3")])).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "3");
        assert!(!dir.join("sub").exists(), "removed keys disappear");
        assert!(!dir.join(&first).exists(), "the old generation is removed");
        let hidden: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("..") && n != "..data")
            .collect();
        assert_eq!(hidden.len(), 1, "{hidden:?}");
    }

    #[test]
    fn host_path_types_are_checked_and_created() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("made/dir");
        host_path(&d, "DirectoryOrCreate").unwrap();
        assert!(d.is_dir());
        let f = tmp.path().join("made/file");
        host_path(&f, "FileOrCreate").unwrap();
        assert!(f.is_file());
        assert!(host_path(&f, "Directory").is_err());
        assert!(host_path(&d, "File").is_err());
        let err = host_path(&tmp.path().join("nope"), "Directory").unwrap_err();
        assert!(err.0.contains("does not exist"), "{err}");
        host_path(&tmp.path().join("nope"), "").unwrap();
    }

    #[test]
    fn pod_dirs_are_only_removed_below_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(remove_pod_dir(tmp.path(), "").is_err());
        assert!(remove_pod_dir(tmp.path(), "../x").is_err());
        let dir = tmp.path().join("pods/u1/volumes/x");
        std::fs::create_dir_all(&dir).unwrap();
        remove_pod_dir(tmp.path(), "u1").unwrap();
        assert!(!tmp.path().join("pods/u1").exists());
        remove_pod_dir(tmp.path(), "u1").unwrap();
    }
}
