//! One edge node end to end: the Kubernetes API (in-memory, or `E2E_KUBECONFIG`), cloudcore's
//! cloudhub and controllers in-process, and a real edgecore (edgehub, metamanager, edged) on a
//! containerd of `crate::containerd`, its cloud link through a [`FaultProxy`] the test can
//! freeze. The cloud can be stopped and started again (a new cloudcore, same address for the
//! edge), and so can edgecore (same database and directories).
//!
//! Helpers panic with a message naming what did not happen: they are for tests.

use crate::channel::{FaultProxy, Pki};
use crate::cloud::CloudFixture;
use crate::cluster::TestCluster;
use crate::containerd::Containerd;
use crate::images::PAUSE_IMAGE;
use edgecore::app::EdgeCore;
use edgecore::config::EdgeCoreConfig;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::PostParams;
use kubeedge_edged::EdgedConfig;
use kubeedge_edged::cri::{CriClient, api};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long the waits of these helpers last: generous, tests check behaviour, not speed.
pub const WAIT: Duration = Duration::from_secs(60);

/// Logs to the test output, filtered by `E2E_LOG` (e.g. `E2E_LOG=edgecore=debug`).
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("E2E_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// The containerd all tests of the process share.
pub fn shared_containerd() -> &'static Containerd {
    Containerd::shared().unwrap_or_else(|e| panic!("{e}"))
}

/// A node name no other test of this process uses.
pub fn node_name(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A change to an edge's loaded `edgecore.yaml`.
pub type Customize = Box<dyn FnOnce(&mut EdgeCoreConfig) + Send>;

/// What an [`EdgeEnv`] differs in.
pub struct EdgeOptions {
    /// Node name prefix (a unique suffix is added).
    pub prefix: String,
    /// CRI endpoint; `None`: the shared containerd's.
    pub endpoint: Option<String>,
    /// `tailoredKubeletConfig.nodeStatusUpdateFrequency` in seconds.
    pub node_status_update_frequency_secs: u32,
    /// Runs the MetaServer (on a free loopback port).
    pub metaserver: bool,
    /// With `featureGates.requireAuthorization`: the MetaServer's `dummyServer` address.
    pub metaserver_dummy: Option<std::net::SocketAddr>,
    /// Services at the edge (`modules.edgeMesh`).
    pub mesh: Option<MeshOptions>,
    /// Changes to the loaded `edgecore.yaml` (other modules, their addresses).
    pub customize: Option<Customize>,
}

/// `modules.edgeMesh` of a test edge: an address and chains of its own, so that edges of
/// parallel tests on this machine do not share them.
#[derive(Debug, Clone)]
pub struct MeshOptions {
    pub address: std::net::Ipv4Addr,
    pub chain_prefix: String,
    /// The relay's port (0: none).
    pub relay_port: u16,
    /// ClusterIP rules (off: DNS only).
    pub proxy: bool,
    /// `proxy.directCIDRs`.
    pub direct_cidrs: Vec<String>,
}

impl MeshOptions {
    /// A fresh address in 169.254.96.100–.250 and chain prefix `KT<n>` for this process.
    pub fn unique() -> MeshOptions {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed) % 150;
        // Processes of parallel runs differ by pid.
        let base = (std::process::id() as usize * 7) % 150;
        let k = (base + n) % 150;
        MeshOptions {
            address: std::net::Ipv4Addr::new(169, 254, 96, 100 + k as u8),
            chain_prefix: format!("KT{k:02}"),
            relay_port: 40001,
            proxy: true,
            direct_cidrs: Vec::new(),
        }
    }

    /// Removes the chains and address an edge with these options left (edgemesh keeps them
    /// across restarts on purpose).
    pub fn cleanup(&self) {
        let mut c = EdgeCoreConfig::default();
        c.modules.edge_mesh.listen_address = self.address.to_string();
        c.modules.edge_mesh.proxy.chain_prefix = self.chain_prefix.clone();
        if let Err(e) = edgecore::mesh::cleanup(&c) {
            eprintln!("edgemesh cleanup: {e}");
        }
    }
}

impl EdgeOptions {
    pub fn new(prefix: &str) -> Self {
        EdgeOptions {
            prefix: prefix.to_string(),
            endpoint: None,
            node_status_update_frequency_secs: 1,
            metaserver: false,
            metaserver_dummy: None,
            mesh: None,
            customize: None,
        }
    }
}

/// Writes an edge's certificate (from `pki`'s CA, for `node`) and `edgecore.yaml` into `d`, its
/// cloud at `server` (`host:port` of a cloudhub WebSocket), containers on the CRI `endpoint`;
/// returns the loaded config.
pub fn write_edge_config(
    d: &std::path::Path,
    pki: &Pki,
    node: &str,
    server: &str,
    endpoint: &str,
    options: &EdgeOptions,
) -> EdgeCoreConfig {
    let cert = pki.node_cert(node).expect("node certificate");
    std::fs::write(d.join("ca.crt"), &pki.ca.cert.cert_pem).expect("write ca.crt");
    std::fs::write(d.join("edge.crt"), &cert.cert_pem).expect("write edge.crt");
    std::fs::write(d.join("edge.key"), &cert.key_pem).expect("write edge.key");
    let secure = match options.metaserver_dummy {
        Some(_) => "featureGates:\n  requireAuthorization: true\n",
        None => "",
    };
    let yaml = format!(
        "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\n{secure}\
         database:\n  dataSource: {db}\n\
         modules:\n  edgeHub:\n    heartbeat: 1\n    messageQPS: 0\n    tlsCaFile: {ca}\n    tlsCertFile: {crt}\n    tlsPrivateKeyFile: {key}\n\
         \x20   websocket:\n      server: {server}\n\
         \x20 deviceTwin:\n    dmiSockPath: {dmi}\n\
         \x20 taskManager:\n    enable: true\n\
         \x20 metaManager:\n    metaServer:\n      enable: {metaserver}\n      server: 127.0.0.1:0\n      dummyServer: \"{dummy}\"\n\
         \x20 edged:\n    hostnameOverride: {node}\n    nodeIP: {node_ip}\n    remoteRuntimeEndpoint: {endpoint}\n\
         \x20   podSandboxImage: {pause}\n    rootDirectory: {root}\n    nodeLabels:\n      e2e.kubeedge-rs/edged: \"yes\"\n      e2e.kubeedge-rs/test: \"true\"\n\
         \x20   tailoredKubeletConfig:\n      nodeStatusUpdateFrequency: {status}s\n      nodeLeaseDurationSeconds: 4\n      syncFrequency: 10s\n      cgroupRoot: {cgroup_root}\n      staticPodPath: {manifests}\n\
         \x20     evictionHard:\n        memory.available: 50Mi\n        nodefs.available: 1%\n        imagefs.available: 1%\n        nodefs.inodesFree: 1%\n",
        manifests = d.join("manifests").display(),
        cgroup_root = cgroup_root(node),
        db = d.join("edgecore.db").display(),
        dmi = d.display(),
        ca = d.join("ca.crt").display(),
        crt = d.join("edge.crt").display(),
        key = d.join("edge.key").display(),
        // Not loopback: the apiserver refuses to proxy to loopback node addresses.
        node_ip = crate::node_address::node_ip(),
        pause = PAUSE_IMAGE,
        root = d.join("edged").display(),
        status = options.node_status_update_frequency_secs,
        metaserver = options.metaserver,
        dummy = options
            .metaserver_dummy
            .map(|a| a.to_string())
            .unwrap_or_default(),
    );
    let mesh = match &options.mesh {
        Some(m) => format!(
            "\x20 edgeMesh:\n    enable: true\n    listenAddress: {}\n    proxy:\n      enable: {}\n      chainPrefix: {}\n      relayPort: {}\n      directCIDRs: {:?}\n",
            m.address, m.proxy, m.chain_prefix, m.relay_port, m.direct_cidrs
        ),
        None => String::new(),
    };
    let yaml = yaml + &mesh;
    let path = d.join("edgecore.yaml");
    std::fs::write(&path, yaml).expect("write edgecore.yaml");
    EdgeCoreConfig::load(&path).expect("edgecore.yaml loads")
}

/// edged's settings from `config`, with test timers: quick back-offs and retries, eviction
/// checks every second; pod logs under `dir`. (Test edges' eviction thresholds, in their
/// `edgecore.yaml`, are low, so that a test machine's own disk usage does not evict test
/// pods.)
pub fn test_edged_config(config: &EdgeCoreConfig, dir: &std::path::Path) -> EdgedConfig {
    let mut e = edgecore::edged_config::edged_config(config);
    e.pod_logs_directory = dir.join("pod-logs");
    e.crash_backoff_initial = Duration::from_secs(1);
    e.crash_backoff_max = Duration::from_secs(4);
    e.image_backoff_initial = Duration::from_secs(1);
    e.image_backoff_max = Duration::from_secs(4);
    e.relist_period = Duration::from_millis(500);
    e.retry_period = Duration::from_secs(1);
    e.container_log_max_size = 16 * 1024;
    e.container_log_max_files = 3;
    e.log_rotation_period = Duration::from_millis(500);
    e.static_pod_check_period = Duration::from_millis(500);
    e.eviction_period = Duration::from_secs(1);
    // Image GC would remove the shared containerd's images whenever the test machine's
    // disk is past 80 % (tests that want it set the threshold themselves).
    e.image_gc_high_threshold_percent = 100;
    e
}

/// Cluster + cloudcore + one edge node running a real edgecore.
pub struct EdgeEnv {
    pub cluster: TestCluster,
    pub cloud: Option<CloudFixture>,
    pub pki: Pki,
    /// The edge's way to the cloud.
    pub link: FaultProxy,
    pub dir: tempfile::TempDir,
    pub node: String,
    pub ns: String,
    pub config: EdgeCoreConfig,
    pub edge: Option<EdgeCore>,
    endpoint: String,
}

impl EdgeEnv {
    /// Starts everything on the shared containerd and waits for the node to be Ready.
    pub async fn start(prefix: &str) -> EdgeEnv {
        let env = Self::start_with(EdgeOptions::new(prefix)).await;
        env.wait_node_ready().await;
        env
    }

    /// Starts everything on a containerd of its own (for tests that kill all its containers
    /// or change its images) and waits for the node to be Ready. Bound in the order returned,
    /// the containerd outlives the edge.
    pub async fn start_on_own_containerd(prefix: &str) -> (Containerd, EdgeEnv) {
        let containerd = tokio::task::spawn_blocking(Containerd::start)
            .await
            .expect("starting a containerd")
            .unwrap_or_else(|e| panic!("{e}"));
        let env = Self::start_with(EdgeOptions {
            endpoint: Some(containerd.endpoint()),
            ..EdgeOptions::new(prefix)
        })
        .await;
        env.wait_node_ready().await;
        (containerd, env)
    }

    /// Starts everything; does not wait for the node to be Ready.
    pub async fn start_with(mut options: EdgeOptions) -> EdgeEnv {
        init_logs();
        let endpoint = match options.endpoint.clone() {
            Some(e) => e,
            None => tokio::task::spawn_blocking(shared_containerd)
                .await
                .expect("starting the shared containerd")
                .endpoint(),
        };
        let cluster = crate::cluster::connect().await.expect("test cluster");
        let pki = Pki::new().expect("test PKI");
        // The MetaServer's RBAC comes from the policy controller (the cloud's
        // `featureGates.requireAuthorization`).
        let sync = cloudcore::controller::SyncOptions {
            policy: options.metaserver_dummy.is_some(),
            ..crate::cloud::test_sync_options("default")
        };
        let cloud = CloudFixture::start_with(cluster.client(), &pki, sync)
            .await
            .expect("cloudcore starts");
        let link = FaultProxy::start(cloud.hub.local_addr())
            .await
            .expect("link proxy");
        let node = node_name(&options.prefix);
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = write_edge_config(
            dir.path(),
            &pki,
            &node,
            &link.addr.to_string(),
            &endpoint,
            &options,
        );
        if let Some(customize) = options.customize.take() {
            customize(&mut config);
        }
        let ns = cluster.temp_namespace("edged").await.expect("namespace");
        let mut env = EdgeEnv {
            cluster,
            cloud: Some(cloud),
            pki,
            link,
            dir,
            node,
            ns,
            config,
            edge: None,
            endpoint,
        };
        env.start_edge().await;
        env
    }

    /// edged's settings from the config file, with test timers: quick back-offs and retries.
    pub fn edged_config(&self) -> EdgedConfig {
        test_edged_config(&self.config, self.dir.path())
    }

    pub async fn start_edge(&mut self) {
        let edged = self.edged_config();
        let edge = EdgeCore::start_with(&self.config, Some(edged))
            .await
            .expect("edgecore starts");
        self.edge = Some(edge);
    }

    /// Stops edgecore (containers keep running).
    pub async fn stop_edge(&mut self) {
        if let Some(edge) = self.edge.take() {
            edge.shutdown().await;
        }
    }

    /// Whether the running edgecore has its cloud link up.
    pub fn edge_connected(&self) -> bool {
        self.edge.as_ref().is_some_and(|e| e.hub().is_connected())
    }

    /// Waits until the running edgecore's link is `up` (or down); returns when edgehub said so
    /// (its link events, not a poll: the instant is exact).
    pub async fn wait_edge_link(&self, up: bool) -> Instant {
        let hub = self.edge.as_ref().expect("edgecore is stopped").hub();
        let mut events = hub.subscribe();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if hub.is_connected() == up {
                return Instant::now();
            }
            let what = if up { "connected" } else { "disconnected" };
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Err(_) => panic!("edgecore not {what} within {WAIT:?}"),
                Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Ok(_) => {}
            }
        }
    }

    /// The running cloudcore.
    pub fn cloud(&self) -> &CloudFixture {
        self.cloud.as_ref().expect("cloudcore is stopped")
    }

    /// Stops cloudcore (cloudhub and controllers); the API server stays.
    pub fn stop_cloud(&mut self) {
        if let Some(cloud) = self.cloud.take() {
            cloud.stop();
        }
    }

    /// Starts a new cloudcore (no memory of the old one) where the edge's link leads.
    pub async fn start_cloud(&mut self) {
        self.stop_cloud();
        let cloud = CloudFixture::start(self.cluster.client(), &self.pki)
            .await
            .expect("cloudcore starts again");
        self.link.set_upstream(cloud.hub.local_addr());
        self.cloud = Some(cloud);
    }

    /// Starts a new cloudcore and points the edge's link at it at once, before its informers
    /// have listed (the edge reconnects in the start-up window).
    pub async fn start_cloud_at_once(&mut self) {
        self.stop_cloud();
        let cloud = CloudFixture::launch(
            self.cluster.client(),
            &self.pki,
            crate::cloud::test_sync_options("default"),
        )
        .await
        .expect("cloudcore starts again");
        self.link.set_upstream(cloud.hub.local_addr());
        self.cloud = Some(cloud);
    }

    /// The CRI runtime the edge runs on.
    pub async fn cri(&self) -> CriClient {
        CriClient::connect(&self.endpoint)
            .await
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", self.endpoint))
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.cluster.client(), &self.ns)
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.cluster.client())
    }

    /// The node's Ready condition as the API server has it.
    pub async fn node_ready_condition(&self) -> Option<Value> {
        let node = self.nodes().get_opt(&self.node).await.ok()??;
        let v = serde_json::to_value(&node).ok()?;
        v["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready")
            .cloned()
    }

    /// Waits for the node's Ready condition to have `status` ("True", "False", "Unknown").
    pub async fn wait_node_condition(&self, status: &str) -> Value {
        wait_for(
            &format!("node {} Ready={status}", self.node),
            WAIT,
            || async {
                self.node_ready_condition()
                    .await
                    .filter(|c| c["status"] == status)
            },
        )
        .await
    }

    pub async fn wait_node_ready(&self) -> Node {
        self.wait_node_condition("True").await;
        self.nodes().get(&self.node).await.expect("the node")
    }

    /// Creates a pod bound to this node from a JSON spec (apiVersion/kind/nodeName added).
    pub async fn create_pod(&self, spec: Value) -> Pod {
        let mut pod = spec;
        pod["apiVersion"] = json!("v1");
        pod["kind"] = json!("Pod");
        pod["spec"]["nodeName"] = json!(self.node);
        let pod: Pod = serde_json::from_value(pod).expect("a Pod");
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .expect("pod created")
    }

    /// Polls the pod until `check` accepts it; panics with its last status after [`WAIT`].
    pub async fn wait_pod(
        &self,
        name: &str,
        what: &str,
        mut check: impl FnMut(&Value) -> bool,
    ) -> Value {
        let pods = self.pods();
        let mut last = Value::Null;
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(Some(p)) = pods.get_opt(name).await {
                let v = serde_json::to_value(&p).expect("a pod serialises");
                if check(&v) {
                    return v;
                }
                last = v;
            }
            assert!(
                Instant::now() < deadline,
                "pod {name}: {what} not seen within {WAIT:?}; last status:\n{:#}",
                last["status"]
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits for the pod to be Running with every container ready.
    pub async fn wait_running(&self, name: &str) -> Value {
        self.wait_pod(name, "Running and Ready", is_running_and_ready)
            .await
    }

    /// Stops edgecore, removes what this node left in the runtime, deletes the namespace and
    /// the Node (on a real cluster nothing else would).
    pub async fn finish(mut self) {
        self.stop_edge().await;
        self.stop_cloud();
        remove_node_sandboxes(&self.endpoint, &self.node).await;
        remove_cgroups(&self.node);
        self.cluster.delete_namespace(&self.ns).await;
        let _ = self
            .nodes()
            .delete(&self.node, &kube::api::DeleteParams::default())
            .await;
    }
}

/// The `cgroupRoot` of a test edge: pod cgroups of parallel tests on this machine do not
/// share `kubepods`.
pub fn cgroup_root(node: &str) -> String {
    format!("/kubeedge-rs-e2e/{node}")
}

/// Removes a test edge's cgroups (`cgroupRoot` and everything below it, bottom-up; only
/// empty cgroups can go, i.e. once the pods are gone).
pub fn remove_cgroups(node: &str) {
    remove_cgroup_tree(&cgroup_root(node));
    // The tests' common parent, once no test uses it.
    remove_cgroup_tree_top("/kubeedge-rs-e2e");
}

/// Removes cgroup `rel` (a path below the hierarchies' root) and all below it, in every
/// mounted hierarchy, where empty.
pub fn remove_cgroup_tree(rel: &str) {
    for top in cgroup_dirs(rel) {
        remove_tree(&top);
    }
}

fn remove_cgroup_tree_top(rel: &str) {
    for top in cgroup_dirs(rel) {
        let _ = std::fs::remove_dir(top);
    }
}

fn cgroup_dirs(rel: &str) -> Vec<std::path::PathBuf> {
    let base = std::path::Path::new("/sys/fs/cgroup");
    let mut roots: Vec<std::path::PathBuf> = std::fs::read_dir(base)
        .map(|e| e.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    roots.push(base.to_path_buf());
    roots
        .into_iter()
        .map(|controller| controller.join(rel.trim_start_matches('/')))
        .collect()
}

fn remove_tree(dir: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Turns on edgestream in `config` (edge files in `dir`), dialling the tunnel at `tunnel`.
pub fn enable_stream(config: &mut EdgeCoreConfig, dir: &std::path::Path, tunnel: SocketAddr) {
    let s = &mut config.modules.edge_stream;
    s.enable = true;
    s.server = tunnel.to_string();
    s.tls_tunnel_ca_file = dir.join("ca.crt").display().to_string();
    s.tls_tunnel_cert_file = dir.join("edge.crt").display().to_string();
    s.tls_tunnel_private_key_file = dir.join("edge.key").display().to_string();
}

/// Another edge node on an [`EdgeEnv`]'s cloud and cluster, with a link of its own.
pub struct PeerEdge {
    pub node: String,
    pub dir: tempfile::TempDir,
    pub config: EdgeCoreConfig,
    pub edge: Option<EdgeCore>,
    pub link: FaultProxy,
}

impl EdgeEnv {
    /// Starts a second edge node on this environment's cloud, containers on the CRI
    /// `endpoint`, edgestream to `tunnel` when given; waits for its node to be Ready.
    pub async fn start_peer(
        &self,
        options: EdgeOptions,
        endpoint: &str,
        tunnel: Option<SocketAddr>,
    ) -> PeerEdge {
        let link = FaultProxy::start(self.cloud().hub.local_addr())
            .await
            .expect("link proxy");
        let node = node_name(&options.prefix);
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = write_edge_config(
            dir.path(),
            &self.pki,
            &node,
            &link.addr.to_string(),
            endpoint,
            &options,
        );
        if let Some(t) = tunnel {
            enable_stream(&mut config, dir.path(), t);
        }
        let edged = test_edged_config(&config, dir.path());
        let edge = EdgeCore::start_with(&config, Some(edged))
            .await
            .expect("the peer edgecore starts");
        let peer = PeerEdge {
            node,
            dir,
            config,
            edge: Some(edge),
            link,
        };
        wait_for(&format!("node {} Ready", peer.node), WAIT, || async {
            let n = self.nodes().get_opt(&peer.node).await.ok()??;
            let v = serde_json::to_value(n).ok()?;
            v["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                .then_some(())
        })
        .await;
        peer
    }
}

impl PeerEdge {
    /// Stops its edgecore, removes its pods from the runtime at `endpoint` and its Node.
    pub async fn finish(mut self, env: &EdgeEnv, endpoint: &str) {
        if let Some(e) = self.edge.take() {
            e.shutdown().await;
        }
        remove_node_sandboxes(endpoint, &self.node).await;
        remove_cgroups(&self.node);
        let _ = env
            .nodes()
            .delete(&self.node, &kube::api::DeleteParams::default())
            .await;
    }
}

/// Stops and removes every sandbox of `node` at the CRI `endpoint`.
pub async fn remove_node_sandboxes(endpoint: &str, node: &str) {
    let Ok(cri) = CriClient::connect(endpoint).await else {
        return;
    };
    let mut runtime = cri.runtime();
    if let Ok(r) = runtime
        .list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: HashMap::from([(
                    "kubeedge-rs.io/node".to_string(),
                    node.to_string(),
                )]),
                ..Default::default()
            }),
        })
        .await
    {
        for s in r.into_inner().items {
            let _ = runtime
                .stop_pod_sandbox(api::StopPodSandboxRequest {
                    pod_sandbox_id: s.id.clone(),
                })
                .await;
            let _ = runtime
                .remove_pod_sandbox(api::RemovePodSandboxRequest {
                    pod_sandbox_id: s.id,
                })
                .await;
        }
    }
}

/// Running, every container ready, and the pod's Ready condition True (the cloud may have
/// set it False on its own: the node lifecycle controller does for an unreachable node).
pub fn is_running_and_ready(pod: &Value) -> bool {
    let status = &pod["status"];
    status["phase"] == "Running"
        && status["containerStatuses"]
            .as_array()
            .is_some_and(|cs| cs.iter().all(|c| c["ready"] == true))
        && status["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// Polls `probe` every 200 ms until it returns something; panics after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll_until(what, timeout, Duration::from_millis(200), probe).await
}

/// Polls `probe` every `every` until it returns something; panics after `timeout`. For
/// measurements that want a finer grain than [`wait_for`].
pub async fn poll_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut probe: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(every).await;
    }
}

/// The runtime's ID of container `index` of a pod (JSON), without `containerd://`.
pub fn container_id(pod: &Value, index: usize) -> String {
    let id = pod["status"]["containerStatuses"][index]["containerID"]
        .as_str()
        .unwrap_or_else(|| panic!("no containerID in {:#}", pod["status"]));
    id.strip_prefix("containerd://")
        .unwrap_or_else(|| panic!("containerID {id} is not containerd://…"))
        .to_string()
}

/// Runs `cmd` in a container (CRI ExecSync); exit code and stdout + stderr.
pub async fn exec(cri: &CriClient, id: &str, cmd: &[&str]) -> (i32, String) {
    let r = cri
        .runtime()
        .exec_sync(api::ExecSyncRequest {
            container_id: id.to_string(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 10,
        })
        .await
        .unwrap_or_else(|e| panic!("ExecSync {cmd:?}: {e}"))
        .into_inner();
    (
        r.exit_code,
        String::from_utf8_lossy(&r.stdout).into_owned() + &String::from_utf8_lossy(&r.stderr),
    )
}

/// The CRI containers and sandboxes of a pod (by the kubelet's UID label).
pub async fn runtime_objects(
    cri: &CriClient,
    uid: &str,
) -> (Vec<api::Container>, Vec<api::PodSandbox>) {
    let selector = HashMap::from([("io.kubernetes.pod.uid".to_string(), uid.to_string())]);
    let containers = cri
        .runtime()
        .list_containers(api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                label_selector: selector.clone(),
                ..Default::default()
            }),
        })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers;
    let sandboxes = cri
        .runtime()
        .list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: selector,
                ..Default::default()
            }),
        })
        .await
        .expect("ListPodSandbox")
        .into_inner()
        .items;
    (containers, sandboxes)
}

/// A pod's condition of type `ty`.
pub fn condition<'a>(pod: &'a Value, ty: &str) -> &'a Value {
    pod["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == ty))
        .unwrap_or_else(|| panic!("no {ty} condition in {:#}", pod["status"]))
}
