//! edged's view of the CRI runtime: every call with a deadline and an error that names the
//! call, the kubelet's labels that tie sandboxes and containers to pods, and the observation
//! of one pod's sandboxes and containers that the pod worker plans from.

use crate::cri::{CriClient, api};
use std::collections::HashMap;
use std::time::Duration;

/// The labels the kubelet puts on sandboxes and containers; adoption after a restart and
/// garbage collection go by them.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Which edge node created a sandbox or container (kubeedge-rs). Lets several edged share a
/// runtime (as tests do) without collecting each other's pods.
pub const LABEL_NODE: &str = "kubeedge-rs.io/node";
/// Annotations (as the kubelet writes them).
pub const ANNOTATION_CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const ANNOTATION_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const ANNOTATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Which list a container comes from: `init` or `app` (kubeedge-rs).
pub const ANNOTATION_CONTAINER_KIND: &str = "kubeedge-rs.io/container-kind";

#[derive(Debug, Clone, thiserror::Error)]
pub enum RuntimeError {
    #[error("{op}: {message}")]
    Call {
        op: &'static str,
        code: tonic::Code,
        message: String,
    },
    #[error("{op}: no answer from the runtime within {timeout:?}")]
    Timeout { op: &'static str, timeout: Duration },
}

impl RuntimeError {
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            RuntimeError::Call {
                code: tonic::Code::NotFound,
                ..
            }
        )
    }
}

/// The CRI runtime with per-call deadlines.
#[derive(Clone)]
pub struct Runtime {
    cri: CriClient,
    timeout: Duration,
}

async fn call<T>(
    op: &'static str,
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, RuntimeError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(RuntimeError::Call {
            op,
            code: s.code(),
            message: s.message().to_string(),
        }),
        Err(_) => Err(RuntimeError::Timeout { op, timeout }),
    }
}

impl Runtime {
    pub fn new(cri: CriClient, timeout: Duration) -> Self {
        Runtime { cri, timeout }
    }

    pub async fn version(&self) -> Result<api::VersionResponse, RuntimeError> {
        let req = api::VersionRequest {
            version: crate::cri::API_VERSION.into(),
        };
        call("Version", self.timeout, self.cri.runtime().version(req)).await
    }

    /// Sandboxes carrying every label of `selector` (all when empty).
    pub async fn list_sandboxes(
        &self,
        selector: HashMap<String, String>,
    ) -> Result<Vec<api::PodSandbox>, RuntimeError> {
        let req = api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: selector,
                ..Default::default()
            }),
        };
        Ok(call(
            "ListPodSandbox",
            self.timeout,
            self.cri.runtime().list_pod_sandbox(req),
        )
        .await?
        .items)
    }

    pub async fn sandbox_status(
        &self,
        id: &str,
    ) -> Result<Option<api::PodSandboxStatus>, RuntimeError> {
        let req = api::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: false,
        };
        Ok(call(
            "PodSandboxStatus",
            self.timeout,
            self.cri.runtime().pod_sandbox_status(req),
        )
        .await?
        .status)
    }

    pub async fn run_sandbox(&self, config: api::PodSandboxConfig) -> Result<String, RuntimeError> {
        let req = api::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        };
        // Creating the network namespace and calling CNI can take a while on a slow machine.
        Ok(call(
            "RunPodSandbox",
            self.timeout.max(Duration::from_secs(240)),
            self.cri.runtime().run_pod_sandbox(req),
        )
        .await?
        .pod_sandbox_id)
    }

    pub async fn stop_sandbox(&self, id: &str) -> Result<(), RuntimeError> {
        let req = api::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        ignore_not_found(
            call(
                "StopPodSandbox",
                self.timeout,
                self.cri.runtime().stop_pod_sandbox(req),
            )
            .await
            .map(drop),
        )
    }

    pub async fn remove_sandbox(&self, id: &str) -> Result<(), RuntimeError> {
        let req = api::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        ignore_not_found(
            call(
                "RemovePodSandbox",
                self.timeout,
                self.cri.runtime().remove_pod_sandbox(req),
            )
            .await
            .map(drop),
        )
    }

    /// Containers carrying every label of `selector` (all when empty).
    pub async fn list_containers(
        &self,
        selector: HashMap<String, String>,
    ) -> Result<Vec<api::Container>, RuntimeError> {
        let req = api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                label_selector: selector,
                ..Default::default()
            }),
        };
        Ok(call(
            "ListContainers",
            self.timeout,
            self.cri.runtime().list_containers(req),
        )
        .await?
        .containers)
    }

    pub async fn container_status(
        &self,
        id: &str,
    ) -> Result<Option<api::ContainerStatus>, RuntimeError> {
        let req = api::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        Ok(call(
            "ContainerStatus",
            self.timeout,
            self.cri.runtime().container_status(req),
        )
        .await?
        .status)
    }

    pub async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String, RuntimeError> {
        let req = api::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        Ok(call(
            "CreateContainer",
            self.timeout,
            self.cri.runtime().create_container(req),
        )
        .await?
        .container_id)
    }

    pub async fn start_container(&self, id: &str) -> Result<(), RuntimeError> {
        let req = api::StartContainerRequest {
            container_id: id.into(),
        };
        call(
            "StartContainer",
            self.timeout,
            self.cri.runtime().start_container(req),
        )
        .await
        .map(drop)
    }

    /// Stops with SIGTERM, then SIGKILL after `grace`.
    pub async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        let req = api::StopContainerRequest {
            container_id: id.into(),
            timeout: grace.as_secs() as i64,
        };
        ignore_not_found(
            call(
                "StopContainer",
                self.timeout + grace,
                self.cri.runtime().stop_container(req),
            )
            .await
            .map(drop),
        )
    }

    pub async fn remove_container(&self, id: &str) -> Result<(), RuntimeError> {
        let req = api::RemoveContainerRequest {
            container_id: id.into(),
        };
        ignore_not_found(
            call(
                "RemoveContainer",
                self.timeout,
                self.cri.runtime().remove_container(req),
            )
            .await
            .map(drop),
        )
    }

    /// Runs a command in a container (probes, hooks); `timeout` bounds the command.
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<api::ExecSyncResponse, RuntimeError> {
        let req = api::ExecSyncRequest {
            container_id: id.into(),
            cmd,
            timeout: timeout.as_secs().max(1) as i64,
        };
        call(
            "ExecSync",
            timeout + Duration::from_secs(5),
            self.cri.runtime().exec_sync(req),
        )
        .await
    }

    /// Prepares a streaming exec (`kubectl exec`): the URL of the runtime's streaming server
    /// that serves it, for one upgrade request.
    pub async fn exec(&self, req: api::ExecRequest) -> Result<String, RuntimeError> {
        Ok(call("Exec", self.timeout, self.cri.runtime().exec(req))
            .await?
            .url)
    }

    /// Prepares a streaming attach (`kubectl attach`), as [`Runtime::exec`].
    pub async fn attach(&self, req: api::AttachRequest) -> Result<String, RuntimeError> {
        Ok(call("Attach", self.timeout, self.cri.runtime().attach(req))
            .await?
            .url)
    }

    /// Prepares a port forward into a sandbox's network namespace (`kubectl port-forward`):
    /// the URL of the runtime's streaming server that serves it, for one upgrade request.
    pub async fn port_forward(
        &self,
        sandbox_id: &str,
        ports: Vec<i32>,
    ) -> Result<String, RuntimeError> {
        let req = api::PortForwardRequest {
            pod_sandbox_id: sandbox_id.into(),
            port: ports,
        };
        Ok(call(
            "PortForward",
            self.timeout,
            self.cri.runtime().port_forward(req),
        )
        .await?
        .url)
    }

    /// The image if the runtime has it (`ImageStatus` answers OK with no image otherwise).
    pub async fn image_status(&self, image: &str) -> Result<Option<api::Image>, RuntimeError> {
        let req = api::ImageStatusRequest {
            image: Some(image_spec(image)),
            verbose: false,
        };
        Ok(call(
            "ImageStatus",
            self.timeout,
            self.cri.image().image_status(req),
        )
        .await?
        .image)
    }

    /// Every image the runtime has.
    pub async fn list_images(&self) -> Result<Vec<api::Image>, RuntimeError> {
        let req = api::ListImagesRequest { filter: None };
        Ok(call(
            "ListImages",
            self.timeout,
            self.cri.image().list_images(req),
        )
        .await?
        .images)
    }

    /// Removes an image (every tag of it); one already gone is not an error.
    pub async fn remove_image(&self, id: &str) -> Result<(), RuntimeError> {
        let req = api::RemoveImageRequest {
            image: Some(image_spec(id)),
        };
        ignore_not_found(
            call(
                "RemoveImage",
                self.timeout,
                self.cri.image().remove_image(req),
            )
            .await
            .map(|_| ()),
        )
    }

    /// The filesystems holding the runtime's images.
    pub async fn image_fs_info(&self) -> Result<Vec<api::FilesystemUsage>, RuntimeError> {
        let req = api::ImageFsInfoRequest {};
        Ok(call(
            "ImageFsInfo",
            self.timeout,
            self.cri.image().image_fs_info(req),
        )
        .await?
        .image_filesystems)
    }

    /// Pulls an image; returns its reference (ID) as the runtime reports it.
    pub async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        timeout: Duration,
    ) -> Result<String, RuntimeError> {
        let req = api::PullImageRequest {
            image: Some(image_spec(image)),
            auth,
            sandbox_config: None,
        };
        Ok(call("PullImage", timeout, self.cri.image().pull_image(req))
            .await?
            .image_ref)
    }

    /// Resource usage of the containers carrying every label of `selector`.
    pub async fn list_container_stats(
        &self,
        selector: HashMap<String, String>,
    ) -> Result<Vec<api::ContainerStats>, RuntimeError> {
        let req = api::ListContainerStatsRequest {
            filter: Some(api::ContainerStatsFilter {
                label_selector: selector,
                ..Default::default()
            }),
        };
        Ok(call(
            "ListContainerStats",
            self.timeout,
            self.cri.runtime().list_container_stats(req),
        )
        .await?
        .stats)
    }

    /// Resource usage of the pod sandboxes carrying every label of `selector` (runtimes
    /// before CRI 1.23 answer Unimplemented).
    pub async fn list_sandbox_stats(
        &self,
        selector: HashMap<String, String>,
    ) -> Result<Vec<api::PodSandboxStats>, RuntimeError> {
        let req = api::ListPodSandboxStatsRequest {
            filter: Some(api::PodSandboxStatsFilter {
                label_selector: selector,
                ..Default::default()
            }),
        };
        Ok(call(
            "ListPodSandboxStats",
            self.timeout,
            self.cri.runtime().list_pod_sandbox_stats(req),
        )
        .await?
        .stats)
    }
}

fn ignore_not_found(r: Result<(), RuntimeError>) -> Result<(), RuntimeError> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

pub fn image_spec(image: &str) -> api::ImageSpec {
    api::ImageSpec {
        image: image.to_string(),
        user_specified_image: image.to_string(),
        ..Default::default()
    }
}

/// A sandbox of a pod as last observed.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxInfo {
    pub id: String,
    pub attempt: u32,
    pub ready: bool,
    pub created_at: i64,
    /// From `PodSandboxStatus` (only fetched for the newest sandbox).
    pub ips: Vec<String>,
}

/// A container of a pod as last observed.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerInfo {
    pub id: String,
    pub sandbox_id: String,
    pub name: String,
    pub attempt: u32,
    pub state: api::ContainerState,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    pub image: String,
    pub image_ref: String,
    pub hash: String,
    pub init: bool,
    pub log_path: String,
}

/// Everything the runtime holds for one pod: newest sandbox first; containers newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodRuntime {
    pub sandboxes: Vec<SandboxInfo>,
    pub containers: Vec<ContainerInfo>,
}

impl PodRuntime {
    pub fn latest_sandbox(&self) -> Option<&SandboxInfo> {
        self.sandboxes.first()
    }

    /// The newest container of that name.
    pub fn latest(&self, name: &str) -> Option<&ContainerInfo> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// The containers of that name, newest first.
    pub fn all_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a ContainerInfo> {
        self.containers.iter().filter(move |c| c.name == name)
    }

    pub fn running(&self) -> impl Iterator<Item = &ContainerInfo> {
        self.containers.iter().filter(|c| {
            matches!(
                c.state,
                api::ContainerState::ContainerRunning | api::ContainerState::ContainerUnknown
            )
        })
    }

    pub fn is_empty(&self) -> bool {
        self.sandboxes.is_empty() && self.containers.is_empty()
    }
}

pub fn uid_selector(uid: &str) -> HashMap<String, String> {
    HashMap::from([(LABEL_POD_UID.to_string(), uid.to_string())])
}

/// The labels of a pod's sandboxes and containers by namespace and name (and UID, if given).
pub fn pod_selector(namespace: &str, pod: &str, uid: Option<&str>) -> HashMap<String, String> {
    let mut selector = HashMap::from([
        (LABEL_POD_NAMESPACE.to_string(), namespace.to_string()),
        (LABEL_POD_NAME.to_string(), pod.to_string()),
    ]);
    if let Some(uid) = uid {
        selector.insert(LABEL_POD_UID.to_string(), uid.to_string());
    }
    selector
}

impl Runtime {
    /// Observes one pod: its sandboxes (with the newest one's IPs) and its containers (with
    /// their exit codes and times).
    pub async fn observe(&self, uid: &str) -> Result<PodRuntime, RuntimeError> {
        let mut sandboxes: Vec<SandboxInfo> = self
            .list_sandboxes(uid_selector(uid))
            .await?
            .into_iter()
            .map(|s| SandboxInfo {
                attempt: s.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
                ready: s.state() == api::PodSandboxState::SandboxReady,
                created_at: s.created_at,
                id: s.id,
                ips: Vec::new(),
            })
            .collect();
        sandboxes.sort_by_key(|s| std::cmp::Reverse((s.created_at, s.attempt)));
        if let Some(newest) = sandboxes.first_mut() {
            match self.sandbox_status(&newest.id).await {
                Ok(Some(status)) => {
                    newest.ready = status.state() == api::PodSandboxState::SandboxReady;
                    if let Some(net) = status.network {
                        newest.ips = std::iter::once(net.ip)
                            .chain(net.additional_ips.into_iter().map(|ip| ip.ip))
                            .filter(|ip| !ip.is_empty())
                            .collect();
                    }
                }
                Ok(None) => newest.ready = false,
                Err(e) if e.is_not_found() => newest.ready = false,
                Err(e) => return Err(e),
            }
        }
        let mut containers = Vec::new();
        for c in self.list_containers(uid_selector(uid)).await? {
            let mut info = ContainerInfo {
                name: c
                    .labels
                    .get(LABEL_CONTAINER_NAME)
                    .cloned()
                    .or_else(|| c.metadata.as_ref().map(|m| m.name.clone()))
                    .unwrap_or_default(),
                attempt: c.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
                state: c.state(),
                created_at: c.created_at,
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
                reason: String::new(),
                message: String::new(),
                image: c
                    .image
                    .as_ref()
                    .map(|i| i.image.clone())
                    .unwrap_or_default(),
                image_ref: c.image_ref.clone(),
                hash: c
                    .annotations
                    .get(ANNOTATION_CONTAINER_HASH)
                    .cloned()
                    .unwrap_or_default(),
                init: c
                    .annotations
                    .get(ANNOTATION_CONTAINER_KIND)
                    .is_some_and(|k| k == "init"),
                sandbox_id: c.pod_sandbox_id.clone(),
                id: c.id.clone(),
                log_path: String::new(),
            };
            match self.container_status(&c.id).await {
                Ok(Some(s)) => {
                    info.state = s.state();
                    info.started_at = s.started_at;
                    info.finished_at = s.finished_at;
                    info.exit_code = s.exit_code;
                    info.reason = s.reason;
                    info.message = s.message;
                    info.log_path = s.log_path;
                    if !s.image_ref.is_empty() {
                        info.image_ref = s.image_ref;
                    }
                    if let Some(image) = s.image.filter(|i| !i.image.is_empty()) {
                        info.image = image.image;
                    }
                }
                // Removed between the list and the status call.
                Ok(None) => continue,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            }
            containers.push(info);
        }
        containers.sort_by_key(|c| std::cmp::Reverse((c.attempt, c.created_at)));
        Ok(PodRuntime {
            sandboxes,
            containers,
        })
    }
}

impl Runtime {
    /// `RuntimeReady` / `NetworkReady` as the runtime reports them: `(ready, why not)`.
    pub async fn conditions(&self) -> Result<Vec<(String, bool, String)>, RuntimeError> {
        let req = api::StatusRequest { verbose: false };
        let status = call("Status", self.timeout, self.cri.runtime().status(req)).await?;
        Ok(status
            .status
            .map(|s| {
                s.conditions
                    .into_iter()
                    .map(|c| {
                        let why = format!("{}: {}", c.reason, c.message);
                        (c.r#type, c.status, why)
                    })
                    .collect()
            })
            .unwrap_or_default())
    }
}

impl Runtime {
    /// Asks the runtime to reopen a container's log file (after it was rotated).
    pub async fn reopen_container_log(&self, id: &str) -> Result<(), RuntimeError> {
        let req = api::ReopenContainerLogRequest {
            container_id: id.into(),
        };
        call(
            "ReopenContainerLog",
            self.timeout,
            self.cri.runtime().reopen_container_log(req),
        )
        .await
        .map(drop)
    }
}
