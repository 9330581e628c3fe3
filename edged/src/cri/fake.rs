//! A fake CRI runtime for unit tests: the generated RuntimeService and ImageService servers
//! over an in-memory model of sandboxes, containers and images, served on a unix socket so
//! that edged's real client code ([`CriClient`], `cri::runtime::Runtime`) talks to it.
//!
//! It keeps the states a runtime moves through (sandbox ready → not ready → removed;
//! container created → running → exited → removed), filters lists by labels as containerd
//! does, records every call by name, and can be told to fail a pull, a sandbox or a start,
//! or to end a running container with an exit code.

use super::{CriClient, api};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use tonic::codegen::{BoxFuture, Service, http};
use tonic::{Request, Response, Status};

/// What the fake holds; tests read and change it through [`FakeCri::state`].
#[derive(Default)]
pub struct FakeState {
    pub sandboxes: HashMap<String, FakeSandbox>,
    pub containers: HashMap<String, FakeContainer>,
    /// Image references present (as the pod spec names them).
    pub images: HashSet<String>,
    /// Images whose pull fails, with the error message.
    pub pull_errors: HashMap<String, String>,
    /// When set, `RunPodSandbox` fails with this message.
    pub sandbox_error: Option<String>,
    /// Containers (by container name) whose start fails with the message.
    pub start_errors: HashMap<String, String>,
    /// Every call, by RPC name, in order.
    pub calls: Vec<&'static str>,
    next_id: u64,
    clock: i64,
}

pub struct FakeSandbox {
    pub config: api::PodSandboxConfig,
    pub ready: bool,
    pub created_at: i64,
    pub ip: String,
}

pub struct FakeContainer {
    pub sandbox_id: String,
    pub config: api::ContainerConfig,
    pub state: api::ContainerState,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
}

impl FakeState {
    fn id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}{:04}", self.next_id)
    }

    /// The wall clock in nanoseconds (as containerd reports times), strictly increasing so
    /// that creation order is unambiguous.
    fn now(&mut self) -> i64 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        self.clock = wall.max(self.clock + 1);
        self.clock
    }

    /// The containers named `name` (any attempt), newest first.
    pub fn containers_named(&self, name: &str) -> Vec<(&String, &FakeContainer)> {
        let mut v: Vec<_> = self
            .containers
            .iter()
            .filter(|(_, c)| c.config.metadata.as_ref().is_some_and(|m| m.name == name))
            .collect();
        v.sort_by_key(|(_, c)| std::cmp::Reverse(c.created_at));
        v
    }

    /// Ends the newest running container named `name` with `exit_code` (the process died).
    pub fn exit(&mut self, name: &str, exit_code: i32) -> bool {
        let now = self.now();
        let id = self
            .containers_named(name)
            .into_iter()
            .find(|(_, c)| c.state == api::ContainerState::ContainerRunning)
            .map(|(id, _)| id.clone());
        let Some(c) = id.and_then(|id| self.containers.get_mut(&id)) else {
            return false;
        };
        c.state = api::ContainerState::ContainerExited;
        c.finished_at = now;
        c.exit_code = exit_code;
        c.reason = if exit_code == 0 { "Completed" } else { "Error" }.into();
        true
    }

    pub fn count(&self, call: &str) -> usize {
        self.calls.iter().filter(|c| **c == call).count()
    }
}

fn labels_match(selector: &HashMap<String, String>, labels: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn not_found(what: &str, id: &str) -> Status {
    Status::not_found(format!("{what} \"{id}\" not found"))
}

/// A running fake runtime; dropped, it stops serving.
pub struct FakeCri {
    state: Arc<Mutex<FakeState>>,
    socket: PathBuf,
    _dir: tempfile::TempDir,
    server: tokio::task::JoinHandle<()>,
}

impl FakeCri {
    /// Serves on a unix socket in a fresh temporary directory.
    pub fn start() -> FakeCri {
        let dir = tempfile::tempdir().expect("temporary directory");
        let socket = dir.path().join("cri.sock");
        let listener = tokio::net::UnixListener::bind(&socket).expect("binding the fake socket");
        let state: Arc<Mutex<FakeState>> = Arc::default();
        let services = Services {
            runtime: api::runtime_service_server::RuntimeServiceServer::new(Fake(state.clone())),
            image: api::image_service_server::ImageServiceServer::new(Fake(state.clone())),
        };
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .serve_with_incoming(
                    services,
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                )
                .await;
        });
        FakeCri {
            state,
            socket,
            _dir: dir,
            server,
        }
    }

    pub async fn client(&self) -> CriClient {
        CriClient::connect(&format!("unix://{}", self.socket.display()))
            .await
            .expect("connecting to the fake runtime")
    }

    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for FakeCri {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// One socket, both services: requests go by their path's service name.
#[derive(Clone)]
struct Services {
    runtime: api::runtime_service_server::RuntimeServiceServer<Fake>,
    image: api::image_service_server::ImageServiceServer<Fake>,
}

impl Service<http::Request<tonic::body::Body>> for Services {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path().starts_with("/runtime.v1.ImageService/") {
            self.image.call(req)
        } else {
            self.runtime.call(req)
        }
    }
}

#[derive(Clone)]
struct Fake(Arc<Mutex<FakeState>>);

impl Fake {
    fn lock(&self, call: &'static str) -> MutexGuard<'_, FakeState> {
        let mut st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        st.calls.push(call);
        st
    }

    /// Records a call that reads nothing from the state.
    fn record(&self, call: &'static str) {
        drop(self.lock(call));
    }
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl api::runtime_service_server::RuntimeService for Fake {
    async fn version(&self, r: Request<api::VersionRequest>) -> Reply<api::VersionResponse> {
        self.record("Version");
        Ok(Response::new(api::VersionResponse {
            version: r.into_inner().version,
            runtime_name: "fake".into(),
            runtime_version: "0.0.1".into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn status(&self, _r: Request<api::StatusRequest>) -> Reply<api::StatusResponse> {
        self.record("Status");
        let cond = |t: &str| api::RuntimeCondition {
            r#type: t.into(),
            status: true,
            ..Default::default()
        };
        Ok(Response::new(api::StatusResponse {
            status: Some(api::RuntimeStatus {
                conditions: vec![cond("RuntimeReady"), cond("NetworkReady")],
            }),
            ..Default::default()
        }))
    }

    async fn run_pod_sandbox(
        &self,
        r: Request<api::RunPodSandboxRequest>,
    ) -> Reply<api::RunPodSandboxResponse> {
        let mut st = self.lock("RunPodSandbox");
        if let Some(e) = st.sandbox_error.clone() {
            return Err(Status::unknown(e));
        }
        let config = r.into_inner().config.unwrap_or_default();
        let id = st.id("sb");
        let created_at = st.now();
        let ip = format!("10.88.0.{}", st.sandboxes.len() + 2);
        st.sandboxes.insert(
            id.clone(),
            FakeSandbox {
                config,
                ready: true,
                created_at,
                ip,
            },
        );
        Ok(Response::new(api::RunPodSandboxResponse {
            pod_sandbox_id: id,
        }))
    }

    async fn stop_pod_sandbox(
        &self,
        r: Request<api::StopPodSandboxRequest>,
    ) -> Reply<api::StopPodSandboxResponse> {
        let mut st = self.lock("StopPodSandbox");
        let id = r.into_inner().pod_sandbox_id;
        let now = st.now();
        let Some(sb) = st.sandboxes.get_mut(&id) else {
            return Err(not_found("sandbox", &id));
        };
        sb.ready = false;
        for c in st.containers.values_mut() {
            if c.sandbox_id == id && c.state == api::ContainerState::ContainerRunning {
                c.state = api::ContainerState::ContainerExited;
                c.finished_at = now;
                c.exit_code = 137;
                c.reason = "Error".into();
            }
        }
        Ok(Response::new(api::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        r: Request<api::RemovePodSandboxRequest>,
    ) -> Reply<api::RemovePodSandboxResponse> {
        let mut st = self.lock("RemovePodSandbox");
        let id = r.into_inner().pod_sandbox_id;
        if st.sandboxes.remove(&id).is_none() {
            return Err(not_found("sandbox", &id));
        }
        st.containers.retain(|_, c| c.sandbox_id != id);
        Ok(Response::new(api::RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        r: Request<api::PodSandboxStatusRequest>,
    ) -> Reply<api::PodSandboxStatusResponse> {
        let st = self.lock("PodSandboxStatus");
        let id = r.into_inner().pod_sandbox_id;
        let Some(sb) = st.sandboxes.get(&id) else {
            return Err(not_found("sandbox", &id));
        };
        Ok(Response::new(api::PodSandboxStatusResponse {
            status: Some(api::PodSandboxStatus {
                id: id.clone(),
                metadata: sb.config.metadata.clone(),
                state: sandbox_state(sb) as i32,
                created_at: sb.created_at,
                network: Some(api::PodSandboxNetworkStatus {
                    ip: sb.ip.clone(),
                    additional_ips: Vec::new(),
                }),
                labels: sb.config.labels.clone(),
                annotations: sb.config.annotations.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn list_pod_sandbox(
        &self,
        r: Request<api::ListPodSandboxRequest>,
    ) -> Reply<api::ListPodSandboxResponse> {
        let st = self.lock("ListPodSandbox");
        let selector = r
            .into_inner()
            .filter
            .map(|f| f.label_selector)
            .unwrap_or_default();
        let items = st
            .sandboxes
            .iter()
            .filter(|(_, sb)| labels_match(&selector, &sb.config.labels))
            .map(|(id, sb)| api::PodSandbox {
                id: id.clone(),
                metadata: sb.config.metadata.clone(),
                state: sandbox_state(sb) as i32,
                created_at: sb.created_at,
                labels: sb.config.labels.clone(),
                annotations: sb.config.annotations.clone(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(api::ListPodSandboxResponse { items }))
    }

    async fn create_container(
        &self,
        r: Request<api::CreateContainerRequest>,
    ) -> Reply<api::CreateContainerResponse> {
        let mut st = self.lock("CreateContainer");
        let r = r.into_inner();
        if !st.sandboxes.contains_key(&r.pod_sandbox_id) {
            return Err(not_found("sandbox", &r.pod_sandbox_id));
        }
        let config = r.config.unwrap_or_default();
        let image = config.image.as_ref().map(|i| i.image.clone());
        if !image
            .is_some_and(|i| st.images.contains(&i) || st.images.iter().any(|n| image_id(n) == i))
        {
            return Err(Status::not_found("image not present"));
        }
        let id = st.id("ct");
        let created_at = st.now();
        st.containers.insert(
            id.clone(),
            FakeContainer {
                sandbox_id: r.pod_sandbox_id,
                config,
                state: api::ContainerState::ContainerCreated,
                created_at,
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
                reason: String::new(),
            },
        );
        Ok(Response::new(api::CreateContainerResponse {
            container_id: id,
        }))
    }

    async fn start_container(
        &self,
        r: Request<api::StartContainerRequest>,
    ) -> Reply<api::StartContainerResponse> {
        let mut st = self.lock("StartContainer");
        let id = r.into_inner().container_id;
        let now = st.now();
        let name = match st.containers.get(&id) {
            Some(c) => c.config.metadata.clone().unwrap_or_default().name,
            None => return Err(not_found("container", &id)),
        };
        if let Some(e) = st.start_errors.get(&name).cloned() {
            return Err(Status::unknown(e));
        }
        if let Some(c) = st.containers.get_mut(&id) {
            c.state = api::ContainerState::ContainerRunning;
            c.started_at = now;
        }
        Ok(Response::new(api::StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        r: Request<api::StopContainerRequest>,
    ) -> Reply<api::StopContainerResponse> {
        let mut st = self.lock("StopContainer");
        let id = r.into_inner().container_id;
        let now = st.now();
        let Some(c) = st.containers.get_mut(&id) else {
            return Err(not_found("container", &id));
        };
        if c.state == api::ContainerState::ContainerRunning {
            c.state = api::ContainerState::ContainerExited;
            c.finished_at = now;
            c.exit_code = 143;
            c.reason = "Error".into();
        }
        Ok(Response::new(api::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        r: Request<api::RemoveContainerRequest>,
    ) -> Reply<api::RemoveContainerResponse> {
        let mut st = self.lock("RemoveContainer");
        let id = r.into_inner().container_id;
        if st.containers.remove(&id).is_none() {
            return Err(not_found("container", &id));
        }
        Ok(Response::new(api::RemoveContainerResponse {}))
    }

    async fn list_containers(
        &self,
        r: Request<api::ListContainersRequest>,
    ) -> Reply<api::ListContainersResponse> {
        let st = self.lock("ListContainers");
        let filter = r.into_inner().filter.unwrap_or_default();
        let containers = st
            .containers
            .iter()
            .filter(|(_, c)| labels_match(&filter.label_selector, &c.config.labels))
            .filter(|(_, c)| {
                filter.pod_sandbox_id.is_empty() || filter.pod_sandbox_id == c.sandbox_id
            })
            .map(|(id, c)| api::Container {
                id: id.clone(),
                pod_sandbox_id: c.sandbox_id.clone(),
                metadata: c.config.metadata.clone(),
                image: c.config.image.clone(),
                image_ref: image_ref(&c.config),
                state: c.state as i32,
                created_at: c.created_at,
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(api::ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        r: Request<api::ContainerStatusRequest>,
    ) -> Reply<api::ContainerStatusResponse> {
        let st = self.lock("ContainerStatus");
        let id = r.into_inner().container_id;
        let Some(c) = st.containers.get(&id) else {
            return Err(not_found("container", &id));
        };
        Ok(Response::new(api::ContainerStatusResponse {
            status: Some(api::ContainerStatus {
                id: id.clone(),
                metadata: c.config.metadata.clone(),
                state: c.state as i32,
                created_at: c.created_at,
                started_at: c.started_at,
                finished_at: c.finished_at,
                exit_code: c.exit_code,
                image: c.config.image.clone(),
                image_ref: image_ref(&c.config),
                reason: c.reason.clone(),
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
                log_path: c.config.log_path.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn exec_sync(&self, r: Request<api::ExecSyncRequest>) -> Reply<api::ExecSyncResponse> {
        let st = self.lock("ExecSync");
        let id = r.into_inner().container_id;
        match st.containers.get(&id) {
            Some(c) if c.state == api::ContainerState::ContainerRunning => {
                Ok(Response::new(api::ExecSyncResponse::default()))
            }
            _ => Err(not_found("running container", &id)),
        }
    }
}

fn sandbox_state(sb: &FakeSandbox) -> api::PodSandboxState {
    if sb.ready {
        api::PodSandboxState::SandboxReady
    } else {
        api::PodSandboxState::SandboxNotready
    }
}

/// The image's ID: a digest-like name derived from its reference.
pub fn image_id(image: &str) -> String {
    let hash = image.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    format!("sha256:{hash:064x}")
}

/// What a container was created from: the image's ID when it was given by ID.
fn image_ref(config: &api::ContainerConfig) -> String {
    let image = config
        .image
        .as_ref()
        .map(|i| i.image.as_str())
        .unwrap_or("");
    if image.starts_with("sha256:") {
        image.to_string()
    } else {
        image_id(image)
    }
}

#[tonic::async_trait]
impl api::image_service_server::ImageService for Fake {
    async fn image_status(
        &self,
        r: Request<api::ImageStatusRequest>,
    ) -> Reply<api::ImageStatusResponse> {
        let st = self.lock("ImageStatus");
        let image = r.into_inner().image.unwrap_or_default().image;
        let found = st.images.contains(&image).then(|| api::Image {
            id: image_id(&image),
            repo_tags: vec![image.clone()],
            size: 1 << 20,
            ..Default::default()
        });
        Ok(Response::new(api::ImageStatusResponse {
            image: found,
            ..Default::default()
        }))
    }

    async fn pull_image(&self, r: Request<api::PullImageRequest>) -> Reply<api::PullImageResponse> {
        let mut st = self.lock("PullImage");
        let image = r.into_inner().image.unwrap_or_default().image;
        if let Some(e) = st.pull_errors.get(&image) {
            return Err(Status::unknown(e.clone()));
        }
        st.images.insert(image.clone());
        Ok(Response::new(api::PullImageResponse {
            image_ref: image_id(&image),
        }))
    }

    async fn list_images(
        &self,
        _r: Request<api::ListImagesRequest>,
    ) -> Reply<api::ListImagesResponse> {
        let st = self.lock("ListImages");
        let images = st
            .images
            .iter()
            .map(|i| api::Image {
                id: image_id(i),
                repo_tags: vec![i.clone()],
                ..Default::default()
            })
            .collect();
        Ok(Response::new(api::ListImagesResponse { images }))
    }
}
