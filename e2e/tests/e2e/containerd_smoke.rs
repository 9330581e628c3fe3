//! The CRI client against a real containerd: the private instance of `e2e::containerd`,
//! shared by every test of this binary. Needs root and `scripts/setup.sh`'s packages; fails
//! with a message saying so otherwise.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use e2e::containerd::Containerd;
use e2e::images::{BUSYBOX_DOCKER_HUB_IMAGE, BUSYBOX_IMAGE, LayerBuilder, OciImage, PAUSE_IMAGE};
use kubeedge_edged::cri::{CriClient, api};

fn containerd() -> &'static Containerd {
    Containerd::shared().unwrap_or_else(|e| panic!("{e}"))
}

async fn cri() -> CriClient {
    containerd()
        .cri()
        .await
        .unwrap_or_else(|e| panic!("connecting to the test containerd: {e}"))
}

/// A pod name and uid no other test of this process uses.
fn unique(prefix: &str) -> (String, String) {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!("{prefix}-{}-{n}", std::process::id());
    let uid = format!("uid-{name}");
    (name, uid)
}

fn image_spec(image: &str) -> Option<api::ImageSpec> {
    Some(api::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    })
}

async fn image_status(cri: &CriClient, image: &str) -> Option<api::Image> {
    cri.image()
        .image_status(api::ImageStatusRequest {
            image: image_spec(image),
            verbose: false,
        })
        .await
        .unwrap_or_else(|e| panic!("ImageStatus {image}: {e}"))
        .into_inner()
        .image
}

fn namespaces(network: api::NamespaceMode) -> Option<api::NamespaceOption> {
    Some(api::NamespaceOption {
        network: network as i32,
        pid: api::NamespaceMode::Container as i32,
        ipc: api::NamespaceMode::Pod as i32,
        ..Default::default()
    })
}

/// The sandbox config the kubelet would send for a pod with `hostNetwork` as given. A
/// host-network sandbox must have an empty hostname (no private UTS namespace).
fn sandbox_config(
    name: &str,
    uid: &str,
    host_network: bool,
    log_dir: &Path,
) -> api::PodSandboxConfig {
    let network = if host_network {
        api::NamespaceMode::Node
    } else {
        api::NamespaceMode::Pod
    };
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.to_string(),
            uid: uid.to_string(),
            namespace: "e2e".to_string(),
            attempt: 0,
        }),
        hostname: if host_network {
            String::new()
        } else {
            name.to_string()
        },
        log_directory: log_dir.display().to_string(),
        labels: HashMap::from([("io.kubernetes.pod.name".to_string(), name.to_string())]),
        linux: Some(api::LinuxPodSandboxConfig {
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: namespaces(network),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn run_sandbox(cri: &CriClient, config: &api::PodSandboxConfig) -> String {
    cri.runtime()
        .run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}"))
        .into_inner()
        .pod_sandbox_id
}

async fn remove_sandbox(cri: &CriClient, id: &str) {
    let mut runtime = cri.runtime();
    runtime
        .stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        })
        .await
        .unwrap_or_else(|e| panic!("StopPodSandbox: {e}"));
    runtime
        .remove_pod_sandbox(api::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        })
        .await
        .unwrap_or_else(|e| panic!("RemovePodSandbox: {e}"));
    let left = runtime
        .list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                id: id.to_string(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(left.is_empty(), "sandbox {id} still listed: {left:?}");
}

async fn exec(cri: &CriClient, container_id: &str, cmd: &[&str]) -> api::ExecSyncResponse {
    cri.runtime()
        .exec_sync(api::ExecSyncRequest {
            container_id: container_id.to_string(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 10,
        })
        .await
        .unwrap_or_else(|e| panic!("ExecSync {cmd:?}: {e}"))
        .into_inner()
}

#[tokio::test]
async fn cri_version_names_containerd_and_api_v1() {
    let version = cri().await.version().await.expect("Version");
    assert_eq!(version.runtime_name, "containerd");
    assert_eq!(version.runtime_api_version, "v1");
    assert!(!version.runtime_version.is_empty());
}

#[tokio::test]
async fn image_status_of_a_missing_image_returns_no_image() {
    let cri = cri().await;
    assert!(
        image_status(&cri, "localhost:5000/does-not-exist:1")
            .await
            .is_none()
    );
    // The locally built images were imported at start-up.
    let pause = image_status(&cri, PAUSE_IMAGE).await.expect("pause image");
    assert_eq!(pause.id, containerd().pause().id());
}

#[tokio::test]
async fn pull_image_fetches_busybox_from_the_local_registry() {
    let cri = cri().await;
    let expected_id = containerd().busybox().id().to_string();
    let manifest_digest = containerd().busybox().manifest.digest.clone();

    // The harness maps docker.io to its private registry. A tag of this test's own (other
    // tests may pull `busybox` itself) that containerd has never seen: it must be fetched.
    let tag = format!("pull-test-{}", std::process::id());
    containerd()
        .registry()
        .push(containerd().busybox(), "library/busybox", &tag)
        .expect("push to the local registry");
    let reference = format!("docker.io/library/busybox:{tag}");
    assert!(image_status(&cri, &reference).await.is_none());
    let started = Instant::now();
    let pulled = cri
        .image()
        .pull_image(api::PullImageRequest {
            image: image_spec(&reference),
            auth: None,
            sandbox_config: None,
        })
        .await
        .unwrap_or_else(|e| panic!("PullImage {reference}: {e}"))
        .into_inner();
    eprintln!("PullImage {reference}: {:?}", started.elapsed());
    assert_eq!(pulled.image_ref, expected_id);
    let image = image_status(&cri, &reference)
        .await
        .expect("pulled image listed");
    assert_eq!(image.id, expected_id);
    assert!(
        image
            .repo_digests
            .contains(&format!("docker.io/library/busybox@{manifest_digest}")),
        "{:?}",
        image.repo_digests
    );

    // `image: busybox` in a pod spec works offline.
    let pulled = cri
        .image()
        .pull_image(api::PullImageRequest {
            image: image_spec(BUSYBOX_DOCKER_HUB_IMAGE),
            auth: None,
            sandbox_config: None,
        })
        .await
        .unwrap_or_else(|e| panic!("PullImage {BUSYBOX_DOCKER_HUB_IMAGE}: {e}"))
        .into_inner();
    assert_eq!(pulled.image_ref, expected_id);

    // The test name `localhost:5000/...` resolves to the same registry.
    let pulled = cri
        .image()
        .pull_image(api::PullImageRequest {
            image: image_spec(BUSYBOX_IMAGE),
            auth: None,
            sandbox_config: None,
        })
        .await
        .unwrap_or_else(|e| panic!("PullImage {BUSYBOX_IMAGE}: {e}"))
        .into_inner();
    assert_eq!(pulled.image_ref, expected_id);

    // A tag the registry does not have is an error, not an empty success.
    let missing = cri
        .image()
        .pull_image(api::PullImageRequest {
            image: image_spec("localhost:5000/busybox:no-such-tag"),
            auth: None,
            sandbox_config: None,
        })
        .await
        .expect_err("pulling a missing tag must fail");
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");
}

#[tokio::test]
async fn host_network_pod_runs_a_container_that_logs_and_execs() {
    let cri = cri().await;
    let mut runtime = cri.runtime();
    let logs = tempfile::tempdir().unwrap();
    let (name, uid) = unique("hostnet");
    let config = sandbox_config(&name, &uid, true, logs.path());

    let started = Instant::now();
    let sandbox_id = run_sandbox(&cri, &config).await;
    let sandbox_started = started.elapsed();
    let container_id = runtime
        .create_container(api::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(api::ContainerConfig {
                metadata: Some(api::ContainerMetadata {
                    name: "main".to_string(),
                    attempt: 0,
                }),
                image: image_spec(BUSYBOX_IMAGE),
                command: vec!["sh".into(), "-c".into(), "echo hello; sleep 30".into()],
                log_path: "main/0.log".to_string(),
                linux: Some(api::LinuxContainerConfig {
                    security_context: Some(api::LinuxContainerSecurityContext {
                        namespace_options: namespaces(api::NamespaceMode::Node),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            sandbox_config: Some(config.clone()),
        })
        .await
        .unwrap_or_else(|e| panic!("CreateContainer: {e}"))
        .into_inner()
        .container_id;
    runtime
        .start_container(api::StartContainerRequest {
            container_id: container_id.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("StartContainer: {e}"));
    eprintln!(
        "host network: RunPodSandbox {sandbox_started:?}, sandbox+create+start {:?}",
        started.elapsed()
    );

    let status = runtime
        .container_status(api::ContainerStatusRequest {
            container_id: container_id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .expect("container status");
    assert_eq!(status.state(), api::ContainerState::ContainerRunning);
    // The image the name resolves to now: other tests may pull the tag again (a registry
    // copy has another ID than the imported one), so either is this container's image.
    let current = image_status(&cri, BUSYBOX_IMAGE).await.map(|i| i.id);
    assert!(
        status.image_ref == containerd().busybox().id()
            || Some(&status.image_ref) == current.as_ref(),
        "image_ref {} is neither the imported busybox nor what {BUSYBOX_IMAGE} names now ({current:?})",
        status.image_ref
    );
    let log_path = logs.path().join("main/0.log");
    assert_eq!(Path::new(&status.log_path), log_path);

    // The CRI log format: `<RFC3339Nano> stdout F hello`.
    let deadline = Instant::now() + Duration::from_secs(5);
    let line = loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.ends_with(" stdout F hello")) {
            break line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no hello in {log_path:?}: {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let timestamp = line.split(' ').next().unwrap();
    assert!(
        timestamp.len() > 20 && timestamp.contains('T') && timestamp.as_bytes()[4] == b'-',
        "{line}"
    );

    let hi = exec(&cri, &container_id, &["echo", "hi"]).await;
    assert_eq!(hi.exit_code, 0);
    assert_eq!(String::from_utf8_lossy(&hi.stdout), "hi\n");
    let failing = exec(&cri, &container_id, &["sh", "-c", "echo oops >&2; exit 3"]).await;
    assert_eq!(failing.exit_code, 3);
    assert_eq!(String::from_utf8_lossy(&failing.stderr), "oops\n");
    // Host network: the container sees the machine's hostname.
    let hostname = exec(&cri, &container_id, &["hostname"]).await;
    let machine = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(
        String::from_utf8_lossy(&hostname.stdout).trim(),
        machine.trim()
    );

    // `sh` as PID 1 ignores SIGTERM: the runtime kills it when the timeout runs out.
    let stopping = Instant::now();
    runtime
        .stop_container(api::StopContainerRequest {
            container_id: container_id.clone(),
            timeout: 1,
        })
        .await
        .unwrap_or_else(|e| panic!("StopContainer: {e}"));
    eprintln!("StopContainer (timeout 1 s): {:?}", stopping.elapsed());
    let status = runtime
        .container_status(api::ContainerStatusRequest {
            container_id: container_id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_eq!(status.state(), api::ContainerState::ContainerExited);
    assert_eq!(status.exit_code, 137, "killed by SIGKILL");

    runtime
        .remove_container(api::RemoveContainerRequest {
            container_id: container_id.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("RemoveContainer: {e}"));
    let gone = runtime
        .container_status(api::ContainerStatusRequest {
            container_id,
            verbose: false,
        })
        .await
        .expect_err("removed container has no status");
    assert_eq!(gone.code(), tonic::Code::NotFound, "{gone:?}");
    remove_sandbox(&cri, &sandbox_id).await;
}

#[tokio::test]
async fn bridge_network_pod_gets_an_ip_from_the_cni_subnet() {
    let cri = cri().await;
    let mut runtime = cri.runtime();
    let logs = tempfile::tempdir().unwrap();
    let (name, uid) = unique("bridge");
    let config = sandbox_config(&name, &uid, false, logs.path());

    let started = Instant::now();
    let sandbox_id = run_sandbox(&cri, &config).await;
    eprintln!("bridge network: RunPodSandbox {:?}", started.elapsed());

    let status = runtime
        .pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id.clone(),
            verbose: false,
        })
        .await
        .unwrap_or_else(|e| panic!("PodSandboxStatus: {e}"))
        .into_inner()
        .status
        .expect("sandbox status");
    assert_eq!(status.state(), api::PodSandboxState::SandboxReady);
    let ip: Ipv4Addr = status
        .network
        .as_ref()
        .map(|n| n.ip.as_str())
        .unwrap_or_default()
        .parse()
        .unwrap_or_else(|_| panic!("no pod IP in {:?}", status.network));
    let subnet = containerd().pod_subnet();
    let base: Ipv4Addr = subnet.trim_end_matches("/24").parse().unwrap();
    assert_eq!(
        u32::from(ip) & 0xffff_ff00,
        u32::from(base),
        "{ip} not in {subnet}"
    );

    let container_id = runtime
        .create_container(api::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(api::ContainerConfig {
                metadata: Some(api::ContainerMetadata {
                    name: "main".to_string(),
                    attempt: 0,
                }),
                image: image_spec(BUSYBOX_IMAGE),
                command: vec!["sleep".into(), "30".into()],
                log_path: "main/0.log".to_string(),
                ..Default::default()
            }),
            sandbox_config: Some(config.clone()),
        })
        .await
        .unwrap_or_else(|e| panic!("CreateContainer: {e}"))
        .into_inner()
        .container_id;
    runtime
        .start_container(api::StartContainerRequest {
            container_id: container_id.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("StartContainer: {e}"));
    eprintln!(
        "bridge network: sandbox+create+start {:?}",
        started.elapsed()
    );

    // The container is in the pod's network namespace: it has the pod IP and hostname, and
    // reaches the bridge gateway (the host side).
    let addresses = exec(&cri, &container_id, &["ip", "-4", "-o", "addr"]).await;
    let addresses = String::from_utf8_lossy(&addresses.stdout).into_owned();
    assert!(addresses.contains(&format!("inet {ip}/24")), "{addresses}");
    let hostname = exec(&cri, &container_id, &["hostname"]).await;
    assert_eq!(String::from_utf8_lossy(&hostname.stdout).trim(), name);
    let gateway = Ipv4Addr::from(u32::from(base) + 1);
    let ping = exec(
        &cri,
        &container_id,
        &["ping", "-c", "1", "-W", "2", &gateway.to_string()],
    )
    .await;
    assert_eq!(
        ping.exit_code,
        0,
        "ping {gateway}: {}{}",
        String::from_utf8_lossy(&ping.stdout),
        String::from_utf8_lossy(&ping.stderr)
    );

    runtime
        .stop_container(api::StopContainerRequest {
            container_id: container_id.clone(),
            timeout: 0,
        })
        .await
        .unwrap_or_else(|e| panic!("StopContainer: {e}"));
    runtime
        .remove_container(api::RemoveContainerRequest { container_id })
        .await
        .unwrap_or_else(|e| panic!("RemoveContainer: {e}"));
    remove_sandbox(&cri, &sandbox_id).await;
}

#[tokio::test]
async fn pull_image_fetches_layers_the_runtime_does_not_have() {
    let cri = cri().await;
    // busybox's layer plus a 1 MiB layer containerd has never seen: the pull must download
    // and unpack it.
    let mut extra = LayerBuilder::new();
    let payload: Vec<u8> = (0..1024 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    extra
        .dir("data", 0o755)
        .unwrap()
        .file("data/blob", 0o644, &payload)
        .unwrap();
    let busybox = containerd().busybox();
    let image = OciImage::from_layers(
        vec![busybox.layers[0].data.clone(), extra.finish().unwrap()],
        &[],
        &["sh"],
    );
    containerd()
        .registry()
        .push(&image, "pull-only", "v1")
        .expect("push to the local registry");
    assert!(
        containerd()
            .registry()
            .has_manifest("pull-only", "v1")
            .unwrap()
    );

    let reference = "localhost:5000/pull-only:v1";
    let started = Instant::now();
    let pulled = cri
        .image()
        .pull_image(api::PullImageRequest {
            image: image_spec(reference),
            auth: None,
            sandbox_config: None,
        })
        .await
        .unwrap_or_else(|e| panic!("PullImage {reference}: {e}"))
        .into_inner();
    eprintln!(
        "PullImage {reference} (1 MiB new layer): {:?}",
        started.elapsed()
    );
    assert_eq!(pulled.image_ref, image.id());
    let status = image_status(&cri, reference)
        .await
        .expect("pulled image listed");
    let layers_size: usize = image.layers.iter().map(|l| l.data.len()).sum();
    assert!(
        status.size >= layers_size as u64 / 2,
        "size {} for {layers_size} bytes of layers",
        status.size
    );
}

/// A private instance (the shared one keeps running) left with a running bridge pod is
/// removed without a trace on drop.
#[tokio::test]
async fn dropping_an_instance_removes_pods_processes_mounts_and_bridge() {
    let started = Instant::now();
    let instance = tokio::task::spawn_blocking(Containerd::start)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("private containerd started in {:?}", started.elapsed());
    assert_ne!(instance.pod_subnet(), containerd().pod_subnet());
    assert_ne!(instance.bridge(), containerd().bridge());

    let cri = instance.cri().await.unwrap();
    let logs = tempfile::tempdir().unwrap();
    let (name, uid) = unique("left-behind");
    let sandbox_id = run_sandbox(&cri, &sandbox_config(&name, &uid, false, logs.path())).await;
    let netns = cri
        .runtime()
        .pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id,
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner()
        .info
        .get("info")
        .and_then(|info| serde_json::from_str::<serde_json::Value>(info).ok())
        .and_then(|info| {
            info["runtimeSpec"]["linux"]["namespaces"]
                .as_array()
                .cloned()
        })
        .and_then(|namespaces| {
            namespaces
                .iter()
                .find(|ns| ns["type"] == "network")
                .and_then(|ns| ns["path"].as_str().map(str::to_string))
        })
        .expect("the sandbox's network namespace path");
    assert!(Path::new(&netns).exists());
    assert!(Path::new("/sys/class/net").join(instance.bridge()).exists());

    let dir = instance.dir().to_path_buf();
    let socket = instance.socket().display().to_string();
    let bridge = instance.bridge();
    let stopping = Instant::now();
    tokio::task::spawn_blocking(move || drop(instance))
        .await
        .unwrap();
    eprintln!("private containerd removed in {:?}", stopping.elapsed());

    assert!(!dir.exists(), "{dir:?} remains");
    assert!(!Path::new(&netns).exists(), "{netns} remains");
    assert!(
        !Path::new("/sys/class/net").join(&bridge).exists(),
        "bridge {bridge} remains"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&dir.display().to_string()),
        "mounts remain under {dir:?}"
    );
    assert!(
        e2e::process::pids_with_cmdline_containing(&socket).is_empty(),
        "processes naming {socket} remain"
    );
}
