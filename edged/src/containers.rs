//! The container configuration (`CreateContainer`) the kubelet would send: command and args
//! with `$(VAR)` expansion, working directory, environment, mounts (with subPath kept inside
//! its volume), resources, security context, and the labels and annotations edged adopts
//! containers by after a restart.

use super::env::{ConfigError, expand};
use super::quantity;
use super::sandbox::{namespace_options, pod_labels, seccomp};
use super::spec::{Container, Pod};
use super::volumes::HostVolume;
use crate::cri::api;
use crate::cri::runtime::{
    ANNOTATION_CONTAINER_HASH, ANNOTATION_CONTAINER_KIND, ANNOTATION_GRACE_PERIOD,
    ANNOTATION_RESTART_COUNT, LABEL_CONTAINER_NAME, image_spec,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Paths the kubelet masks or makes read-only in unprivileged containers.
const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    Init,
    App,
}

impl ContainerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerKind::Init => "init",
            ContainerKind::App => "app",
        }
    }
}

/// Everything a container configuration is built from.
pub struct ContainerInput<'a> {
    pub pod: &'a Pod,
    pub container: &'a Container,
    pub kind: ContainerKind,
    pub attempt: u32,
    pub node_name: &'a str,
    /// The image as pulled (its ID), so a re-tag cannot change what runs.
    pub image_ref: &'a str,
    pub env: &'a [(String, String)],
    pub volumes: &'a HashMap<String, HostVolume>,
    /// The kubelet-managed `/etc/hosts` for pod-network pods.
    pub etc_hosts: Option<&'a Path>,
    /// The file mounted at `terminationMessagePath`.
    pub termination_log: Option<&'a Path>,
    /// The node's memory, to place Burstable containers' OOM score.
    pub memory_capacity: i128,
}

pub fn container_config(input: &ContainerInput<'_>) -> Result<api::ContainerConfig, ConfigError> {
    let pod = input.pod;
    let c = input.container;
    let env_map: HashMap<&str, &str> = input
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let lookup = |name: &str| env_map.get(name).map(|v| v.to_string());
    let mut labels = pod_labels(pod, input.node_name);
    labels.insert(LABEL_CONTAINER_NAME.to_string(), c.name.clone());
    let annotations = HashMap::from([
        (
            ANNOTATION_CONTAINER_HASH.to_string(),
            pod.container_hash(&c.name).to_string(),
        ),
        (
            ANNOTATION_RESTART_COUNT.to_string(),
            input.attempt.to_string(),
        ),
        (
            ANNOTATION_GRACE_PERIOD.to_string(),
            pod.spec
                .termination_grace_period_seconds
                .unwrap_or(30)
                .to_string(),
        ),
        (
            ANNOTATION_CONTAINER_KIND.to_string(),
            input.kind.as_str().to_string(),
        ),
    ]);
    Ok(api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: c.name.clone(),
            attempt: input.attempt,
        }),
        image: Some(image_spec(if input.image_ref.is_empty() {
            c.image()
        } else {
            input.image_ref
        })),
        command: c.command.iter().map(|s| expand(s, lookup)).collect(),
        args: c.args.iter().map(|s| expand(s, lookup)).collect(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: input
            .env
            .iter()
            .map(|(key, value)| api::KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        mounts: mounts(input)?,
        labels,
        annotations,
        log_path: format!("{}/{}.log", c.name, input.attempt),
        stdin: c.stdin,
        stdin_once: c.stdin_once,
        tty: c.tty,
        linux: Some(api::LinuxContainerConfig {
            resources: Some(resources(pod, c, input.memory_capacity)?),
            security_context: Some(security_context(pod, c)),
        }),
        ..Default::default()
    })
}

fn mounts(input: &ContainerInput<'_>) -> Result<Vec<api::Mount>, ConfigError> {
    let c = input.container;
    let mut out = Vec::new();
    for m in &c.volume_mounts {
        let volume = input
            .volumes
            .get(&m.name)
            .ok_or_else(|| ConfigError(format!("volume {:?} is not prepared", m.name)))?;
        let host_path = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => sub_path(&volume.path, sub, &m.name)?,
            None => volume.path.clone(),
        };
        let propagation = match m.mount_propagation.as_deref() {
            Some("HostToContainer") => api::MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") => api::MountPropagation::PropagationBidirectional,
            _ => api::MountPropagation::PropagationPrivate,
        };
        out.push(api::Mount {
            container_path: m.mount_path.clone(),
            host_path: host_path.display().to_string(),
            readonly: m.read_only || volume.read_only,
            propagation: propagation as i32,
            ..Default::default()
        });
    }
    let mounts_hosts = c.volume_mounts.iter().any(|m| m.mount_path == "/etc/hosts");
    if let Some(hosts) = input.etc_hosts
        && !mounts_hosts
    {
        out.push(api::Mount {
            container_path: "/etc/hosts".into(),
            host_path: hosts.display().to_string(),
            ..Default::default()
        });
    }
    if let Some(log) = input.termination_log {
        let path = termination_message_path(c);
        if !c.volume_mounts.iter().any(|m| m.mount_path == path) {
            out.push(api::Mount {
                container_path: path.to_string(),
                host_path: log.display().to_string(),
                ..Default::default()
            });
        }
    }
    Ok(out)
}

/// Where the container writes why it ended (`/dev/termination-log` by default).
pub fn termination_message_path(c: &Container) -> &str {
    c.termination_message_path
        .as_deref()
        .filter(|p| p.starts_with('/'))
        .unwrap_or("/dev/termination-log")
}

/// The host file behind a container attempt's termination message.
pub fn termination_log_file(pod_dir: &Path, name: &str, attempt: u32) -> PathBuf {
    pod_dir
        .join("containers")
        .join(name)
        .join(format!("{attempt}.termination-log"))
}

/// The message of an ended container: what it wrote to its termination log (at most 4 KiB),
/// or with `FallbackToLogsOnError` and a failure, the tail of its log (80 lines, 2 KiB).
pub fn termination_message(c: &Container, file: &Path, log: &Path, exit_code: i32) -> String {
    let mut text = std::fs::read(file).unwrap_or_default();
    text.truncate(4096);
    let message = String::from_utf8_lossy(&text).into_owned();
    if !message.is_empty()
        || exit_code == 0
        || c.termination_message_policy.as_deref() != Some("FallbackToLogsOnError")
    {
        return message;
    }
    let log_text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = log_text
        .lines()
        // CRI log lines: `<time> <stream> <P|F> <text>`.
        .map(|l| l.splitn(4, ' ').nth(3).unwrap_or(""))
        .collect();
    let tail = lines[lines.len().saturating_sub(80)..].join("\n");
    let start = tail.len().saturating_sub(2048);
    let start = (start..tail.len())
        .find(|i| tail.is_char_boundary(*i))
        .unwrap_or(tail.len());
    tail[start..].to_string()
}

/// `volume/sub`, created as a directory when missing, and refused when it resolves outside
/// the volume (through `..` or a symlink).
fn sub_path(volume: &Path, sub: &str, name: &str) -> Result<PathBuf, ConfigError> {
    let path = volume.join(sub);
    if std::fs::symlink_metadata(&path).is_err() {
        std::fs::create_dir_all(&path)
            .map_err(|e| ConfigError(format!("volume {name:?}: creating subPath {sub:?}: {e}")))?;
    }
    let base = volume
        .canonicalize()
        .map_err(|e| ConfigError(format!("volume {name:?}: {e}")))?;
    let real = path
        .canonicalize()
        .map_err(|e| ConfigError(format!("volume {name:?}: subPath {sub:?}: {e}")))?;
    if !real.starts_with(&base) {
        return Err(ConfigError(format!(
            "volume {name:?}: subPath {sub:?} resolves outside the volume"
        )));
    }
    Ok(path)
}

fn resource(c: &Container, kind: &str, name: &str, cpu: bool) -> Result<Option<i128>, ConfigError> {
    let map = if kind == "limits" {
        &c.resources.limits
    } else {
        &c.resources.requests
    };
    let Some(v) = map.get(name) else {
        return Ok(None);
    };
    let text = quantity::from_json(v)
        .ok_or_else(|| ConfigError(format!("resources.{kind}.{name}: not a quantity")))?;
    let parsed = if cpu {
        quantity::parse_milli(&text)
    } else {
        quantity::parse_units(&text)
    };
    parsed.filter(|v| *v >= 0).map(Some).ok_or_else(|| {
        ConfigError(format!(
            "resources.{kind}.{name}: invalid quantity {text:?}"
        ))
    })
}

/// The pod's QoS class as the API server computes it.
pub fn qos_class(pod: &Pod) -> &'static str {
    super::cgroups::qos::qos_class(pod).as_str()
}

fn resources(
    pod: &Pod,
    c: &Container,
    memory_capacity: i128,
) -> Result<api::LinuxContainerResources, ConfigError> {
    let cpu_request = resource(c, "requests", "cpu", true)?;
    let cpu_limit = resource(c, "limits", "cpu", true)?;
    let memory_limit = resource(c, "limits", "memory", false)?;
    let memory_request = resource(c, "requests", "memory", false)?.or(memory_limit);
    let shares_milli = cpu_request.or(cpu_limit).unwrap_or(0);
    let mut r = api::LinuxContainerResources {
        // milliCPUToShares: between 2 and 262144 (the kernel's range).
        cpu_shares: ((shares_milli * 1024) / 1000).clamp(2, 262_144) as i64,
        ..Default::default()
    };
    if let Some(limit) = cpu_limit {
        r.cpu_period = 100_000;
        r.cpu_quota = ((limit * 100_000) / 1000).clamp(1000, i64::MAX as i128) as i64;
    }
    if let Some(limit) = memory_limit {
        r.memory_limit_in_bytes = limit.min(i64::MAX as i128) as i64;
    }
    // The kubelet's OOM score by QoS, never below 0: this agent must not lower a score
    // (environments without CAP_SYS_RESOURCE refuse it).
    r.oom_score_adj = match qos_class(pod) {
        "BestEffort" => 1000,
        "Guaranteed" => 0,
        _ => {
            let request = memory_request.unwrap_or(0);
            if memory_capacity > 0 {
                (1000 - (1000 * request) / memory_capacity).clamp(2, 999) as i64
            } else {
                999
            }
        }
    };
    Ok(r)
}

fn security_context(pod: &Pod, c: &Container) -> api::LinuxContainerSecurityContext {
    let psc = pod.spec.security_context.clone().unwrap_or_default();
    let sc = c.security_context.clone().unwrap_or_default();
    let privileged = sc.privileged.unwrap_or(false);
    let unmasked = sc.proc_mount.as_deref() == Some("Unmasked");
    let mut supplemental_groups = psc.supplemental_groups.clone();
    if let Some(g) = psc.fs_group {
        supplemental_groups.push(g);
    }
    let caps = sc.capabilities.clone().unwrap_or_default();
    api::LinuxContainerSecurityContext {
        capabilities: Some(api::Capability {
            add_capabilities: caps.add,
            drop_capabilities: caps.drop,
            ..Default::default()
        }),
        privileged,
        namespace_options: Some(namespace_options(pod)),
        run_as_user: sc
            .run_as_user
            .or(psc.run_as_user)
            .map(|value| api::Int64Value { value }),
        run_as_group: sc
            .run_as_group
            .or(psc.run_as_group)
            .map(|value| api::Int64Value { value }),
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups,
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        masked_paths: if privileged || unmasked {
            Vec::new()
        } else {
            MASKED_PATHS.iter().map(|s| s.to_string()).collect()
        },
        readonly_paths: if privileged || unmasked {
            Vec::new()
        } else {
            READONLY_PATHS.iter().map(|s| s.to_string()).collect()
        },
        seccomp: seccomp(sc.seccomp_profile.as_ref().or(psc.seccomp_profile.as_ref())),
        ..Default::default()
    }
}

/// `runAsNonRoot`: refuses a container that would run as root (by its own, the pod's, or
/// the image's user).
pub fn check_non_root(
    pod: &Pod,
    c: &Container,
    image: Option<&api::Image>,
) -> Result<(), ConfigError> {
    let psc = pod.spec.security_context.clone().unwrap_or_default();
    let sc = c.security_context.clone().unwrap_or_default();
    if !sc.run_as_non_root.or(psc.run_as_non_root).unwrap_or(false) {
        return Ok(());
    }
    let uid = sc.run_as_user.or(psc.run_as_user).or_else(|| {
        image.and_then(|i| {
            i.uid.as_ref().map(|u| u.value).or_else(|| {
                let name = i.username.as_str();
                if name == "root" {
                    Some(0)
                } else {
                    name.parse().ok()
                }
            })
        })
    });
    match uid {
        Some(0) => Err(ConfigError(
            "container's runAsUser breaks non-root policy".into(),
        )),
        Some(_) => Ok(()),
        None => Err(ConfigError(
            "container has runAsNonRoot and image has non-numeric user, cannot verify user is non-root".into(),
        )),
    }
}

/// The kubelet-managed `/etc/hosts` of a pod-network pod.
pub fn etc_hosts_content(pod: &Pod, pod_ip: &str, cluster_domain: &str) -> String {
    let mut s = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
    );
    let host = super::sandbox::hostname(pod);
    if !pod_ip.is_empty() {
        match pod.spec.subdomain.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => s.push_str(&format!(
                "{pod_ip}\t{host}.{sub}.{}.svc.{cluster_domain}\t{host}\n",
                pod.metadata.namespace
            )),
            None => s.push_str(&format!("{pod_ip}\t{host}\n")),
        }
    }
    if !pod.spec.host_aliases.is_empty() {
        s.push_str("\n# Entries added by HostAliases.\n");
        for a in &pod.spec.host_aliases {
            s.push_str(&format!("{}\t{}\n", a.ip, a.hostnames.join("\t")));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        Pod::from_value(&json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u-1"},
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn config_carries_command_env_mounts_labels_and_limits() {
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().join("cfg");
        std::fs::create_dir_all(&vol).unwrap();
        let p = pod(json!({"containers": [{"name": "main", "image": "busybox:1",
            "command": ["sh", "-c"], "args": ["echo $(GREETING) $(MISSING)"],
            "workingDir": "/work",
            "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}},
            "securityContext": {"runAsUser": 1000, "allowPrivilegeEscalation": false},
            "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"},
                             {"name": "cfg", "mountPath": "/data", "subPath": "sub"}]}],
            "volumes": [{"name": "cfg", "emptyDir": {}}]}));
        let volumes = HashMap::from([(
            "cfg".to_string(),
            HostVolume {
                path: vol.clone(),
                read_only: true,
            },
        )]);
        let env = vec![("GREETING".to_string(), "hi".to_string())];
        let cfg = container_config(&ContainerInput {
            pod: &p,
            container: &p.spec.containers[0],
            kind: ContainerKind::App,
            attempt: 3,
            node_name: "edge-1",
            image_ref: "sha256:abc",
            env: &env,
            volumes: &volumes,
            etc_hosts: Some(Path::new("/pods/u-1/etc-hosts")),
            termination_log: Some(Path::new("/pods/u-1/containers/main/3.termination-log")),
            memory_capacity: 1 << 30,
        })
        .unwrap();
        assert_eq!(cfg.command, ["sh", "-c"]);
        assert_eq!(cfg.args, ["echo hi $(MISSING)"]);
        assert_eq!(cfg.working_dir, "/work");
        assert_eq!(cfg.image.unwrap().image, "sha256:abc");
        assert_eq!(cfg.log_path, "main/3.log");
        assert_eq!(cfg.metadata.unwrap().attempt, 3);
        assert_eq!(cfg.labels[LABEL_CONTAINER_NAME], "main");
        assert_eq!(cfg.labels[crate::cri::runtime::LABEL_POD_UID], "u-1");
        assert_eq!(cfg.annotations[ANNOTATION_RESTART_COUNT], "3");
        assert_eq!(
            cfg.annotations[ANNOTATION_CONTAINER_HASH],
            p.container_hash("main")
        );
        assert_eq!(cfg.envs[0].key, "GREETING");
        assert_eq!(cfg.mounts.len(), 4);
        assert_eq!(cfg.mounts[3].container_path, "/dev/termination-log");
        assert_eq!(cfg.mounts[0].host_path, vol.display().to_string());
        assert!(cfg.mounts[0].readonly);
        assert_eq!(
            cfg.mounts[1].host_path,
            vol.join("sub").display().to_string()
        );
        assert!(vol.join("sub").is_dir());
        assert_eq!(cfg.mounts[2].container_path, "/etc/hosts");
        let linux = cfg.linux.unwrap();
        let r = linux.resources.unwrap();
        assert_eq!(
            (r.cpu_quota, r.cpu_period, r.cpu_shares),
            (50_000, 100_000, 512)
        );
        assert_eq!(r.memory_limit_in_bytes, 64 << 20);
        assert_eq!(r.oom_score_adj, 0, "Guaranteed: never below 0");
        let sc = linux.security_context.unwrap();
        assert_eq!(sc.run_as_user.unwrap().value, 1000);
        assert!(sc.no_new_privs);
        assert!(sc.masked_paths.contains(&"/proc/kcore".to_string()));
    }

    #[test]
    fn extreme_quantities_are_clamped_or_rejected_never_overflowed() {
        let with = |limits: serde_json::Value| {
            let p = pod(json!({"containers": [{"name": "main", "image": "busybox:1",
                "resources": {"limits": limits}}]}));
            resources(&p, &p.spec.containers[0], 1 << 30)
        };
        // The largest CPU an int64 holds in millicores: shares at the kernel's maximum,
        // the quota saturated instead of wrapping negative.
        let r = with(json!({"cpu": "9223372036854775"})).unwrap();
        assert_eq!(r.cpu_shares, 262_144);
        assert_eq!(r.cpu_quota, i64::MAX);
        for bad in [
            json!({"cpu": "999999999999999999999999999999M"}),
            json!({"memory": "10E"}),
            json!({"cpu": "1e18"}),
        ] {
            let e = with(bad.clone()).unwrap_err();
            assert!(e.0.contains("invalid quantity"), "{bad}: {e}");
        }
    }

    #[test]
    fn sub_paths_cannot_escape_their_volume() {
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().join("v");
        std::fs::create_dir_all(&vol).unwrap();
        std::os::unix::fs::symlink("/etc", vol.join("evil")).unwrap();
        let err = sub_path(&vol, "evil", "v").unwrap_err();
        assert!(err.0.contains("outside the volume"), "{err}");
        assert!(sub_path(&vol, "fine/dir", "v").is_ok());
    }

    #[test]
    fn qos_and_non_root_checks() {
        let best = pod(json!({"containers": [{"name": "a", "image": "x"}]}));
        assert_eq!(qos_class(&best), "BestEffort");
        let burst = pod(json!({"containers": [{"name": "a", "image": "x",
            "resources": {"requests": {"memory": "1Mi"}}}]}));
        assert_eq!(qos_class(&burst), "Burstable");
        let root = pod(json!({"securityContext": {"runAsNonRoot": true},
            "containers": [{"name": "a", "image": "x", "securityContext": {"runAsUser": 0}}]}));
        assert!(check_non_root(&root, &root.spec.containers[0], None).is_err());
        let image_root = api::Image {
            uid: Some(api::Int64Value { value: 0 }),
            ..Default::default()
        };
        let nonroot = pod(json!({"securityContext": {"runAsNonRoot": true},
            "containers": [{"name": "a", "image": "x"}]}));
        assert!(check_non_root(&nonroot, &nonroot.spec.containers[0], Some(&image_root)).is_err());
        assert!(check_non_root(&best, &best.spec.containers[0], Some(&image_root)).is_ok());
    }

    #[test]
    fn termination_messages_come_from_the_file_or_the_log_tail() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("t");
        let log = tmp.path().join("0.log");
        std::fs::write(
            &log,
            "2024-01-01T00:00:00Z stdout F first\n2024-01-01T00:00:01Z stderr F boom happened\n",
        )
        .unwrap();
        let p = pod(json!({"containers": [{"name": "a", "image": "x",
            "terminationMessagePolicy": "FallbackToLogsOnError"}]}));
        let c = &p.spec.containers[0];
        assert_eq!(termination_message(c, &file, &log, 0), "");
        assert_eq!(
            termination_message(c, &file, &log, 1),
            "first\nboom happened"
        );
        std::fs::write(&file, "written by the app").unwrap();
        assert_eq!(termination_message(c, &file, &log, 1), "written by the app");
        assert_eq!(termination_message_path(c), "/dev/termination-log");
    }

    #[test]
    fn etc_hosts_names_the_pod() {
        let p = pod(json!({"containers": [{"name": "a", "image": "x"}],
            "hostAliases": [{"ip": "10.1.1.1", "hostnames": ["db", "db.local"]}]}));
        let text = etc_hosts_content(&p, "10.0.0.7", "cluster.local");
        assert!(text.contains("10.0.0.7\tweb\n"), "{text}");
        assert!(text.contains("10.1.1.1\tdb\tdb.local\n"), "{text}");
    }
}
