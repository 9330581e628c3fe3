//! Where e2e tests get a Kubernetes API: a real cluster when `E2E_KUBECONFIG` names a
//! kubeconfig, otherwise the in-memory API server started in-process (one per call, so tests do
//! not share state).
//!
//! Tests talk to the cluster only through the API (kube-rs and `kubectl`), use their own
//! namespaces, and skip cleanly — with a printed reason — when they rely on in-memory-only
//! knobs (shortened node grace period, forced history compaction), or on a real cluster on
//! the cluster CA's key when `E2E_CLUSTER_CA_KEY` does not name it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};

use crate::apiserver::{ApiServer, Config};

/// The environment variable naming a real cluster's kubeconfig.
pub const KUBECONFIG_ENV: &str = "E2E_KUBECONFIG";

/// The label on every namespace and Node the tests create, so that what a failed run leaves on
/// a real cluster goes with `kubectl delete namespaces,nodes -l e2e.kubeedge-rs/test=true`.
pub const TEST_LABEL: (&str, &str) = ("e2e.kubeedge-rs/test", "true");

/// The environment variable naming a real cluster's CA key (kubeadm:
/// `/etc/kubernetes/pki/ca.key`), for tests that play the apiserver towards cloudcore's stream
/// server or give it a certificate the apiserver verifies. The in-memory server has its own.
pub const CLUSTER_CA_KEY_ENV: &str = "E2E_CLUSTER_CA_KEY";

fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

/// Whether the tests run against a real cluster (`E2E_KUBECONFIG` is set).
pub fn real_cluster_configured() -> bool {
    env_set(KUBECONFIG_ENV)
}

/// `true` (after printing why the test is skipped) on a real cluster without
/// `E2E_CLUSTER_CA_KEY`; call it before starting anything.
pub fn skip_without_cluster_ca_key(needs: &str) -> bool {
    if !real_cluster_configured() || env_set(CLUSTER_CA_KEY_ENV) {
        return false;
    }
    println!(
        "SKIPPED on a real cluster ({KUBECONFIG_ENV} is set): this test needs {needs}; set \
         {CLUSTER_CA_KEY_ENV} to the cluster CA key (kubeadm: /etc/kubernetes/pki/ca.key)"
    );
    true
}

pub struct TestCluster {
    client: Client,
    config: kube::Config,
    kubeconfig: PathBuf,
    server: Option<ApiServer>,
    kubectl_cache: PathBuf,
}

/// Output of one kubectl run.
#[derive(Debug, Clone)]
pub struct KubectlOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// A real cluster from `E2E_KUBECONFIG`, or a fresh in-memory server with test timers.
pub async fn connect() -> anyhow::Result<TestCluster> {
    connect_with(Config::for_tests()).await
}

/// Like [`connect`]; `config` applies only to the in-memory server.
pub async fn connect_with(config: Config) -> anyhow::Result<TestCluster> {
    match std::env::var_os(KUBECONFIG_ENV) {
        Some(path) if !path.is_empty() => real(PathBuf::from(path)).await,
        _ => in_memory(config).await,
    }
}

/// The in-memory server, or `None` (after printing why the test is skipped) when the tests run
/// against a real cluster. For tests that need in-memory-only knobs.
pub async fn connect_in_memory_only(
    config: Config,
    needs: &str,
) -> anyhow::Result<Option<TestCluster>> {
    if real_cluster_configured() {
        println!("SKIPPED on a real cluster ({KUBECONFIG_ENV} is set): this test needs {needs}");
        return Ok(None);
    }
    in_memory(config).await.map(Some)
}

/// Set (non-empty) on a throwaway cluster: the tests that install KubeEdge's
/// CRDs cluster-wide (ObjectSync, ClusterObjectSync; they would clash with a real KubeEdge's)
/// run there too.
pub const CLUSTER_CRDS_ENV: &str = "E2E_INSTALL_CLUSTER_CRDS";

/// The test cluster for a test that installs KubeEdge's CRDs cluster-wide: the in-memory
/// server, or the real cluster when [`CLUSTER_CRDS_ENV`] says it may be changed so; `None`
/// (after printing why the test is skipped) on a real cluster without it.
pub async fn connect_installing_crds(
    config: Config,
    what: &str,
) -> anyhow::Result<Option<TestCluster>> {
    if real_cluster_configured() && !env_set(CLUSTER_CRDS_ENV) {
        println!(
            "SKIPPED on a real cluster ({KUBECONFIG_ENV} is set): {what} installs KubeEdge's \
             CRDs cluster-wide; set {CLUSTER_CRDS_ENV}=1 to run it on a throwaway cluster"
        );
        return Ok(None);
    }
    connect_with(config).await.map(Some)
}

fn cache_dir() -> PathBuf {
    let mut n = [0u8; 6];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut n);
    let suffix: String = n.iter().map(|b| format!("{b:02x}")).collect();
    std::env::temp_dir().join(format!("e2e-kubectl-cache-{}-{suffix}", std::process::id()))
}

async fn in_memory(config: Config) -> anyhow::Result<TestCluster> {
    let server = ApiServer::start(config).await?;
    let config = server.kube_config()?;
    Ok(TestCluster {
        client: Client::try_from(config.clone())?,
        config,
        kubeconfig: server.kubeconfig_path().to_path_buf(),
        server: Some(server),
        kubectl_cache: cache_dir(),
    })
}

async fn real(path: PathBuf) -> anyhow::Result<TestCluster> {
    let kc = kube::config::Kubeconfig::read_from(&path)
        .with_context(|| format!("reading {}", path.display()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .context("kubeconfig")?;
    Ok(TestCluster {
        client: Client::try_from(cfg.clone())?,
        config: cfg,
        kubeconfig: path,
        server: None,
        kubectl_cache: cache_dir(),
    })
}

impl TestCluster {
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The client configuration (e.g. to build a client with other credentials).
    pub fn kube_config(&self) -> kube::Config {
        self.config.clone()
    }

    /// The cluster CA (the kubeconfig's `certificate-authority-data`): in kubeadm clusters, and
    /// in the in-memory server, the CA that signs the apiserver's kubelet client certificate,
    /// i.e. KubeEdge's `streamCA.crt`.
    pub fn cluster_ca(&self) -> Vec<rustls_pki_types::CertificateDer<'static>> {
        self.config
            .root_cert
            .iter()
            .flatten()
            .map(|der| rustls_pki_types::CertificateDer::from(der.clone()))
            .collect()
    }

    /// The cluster CA certificate(s), PEM.
    pub fn cluster_ca_pem(&self) -> String {
        self.cluster_ca()
            .iter()
            .map(|c| kubeedge_shared::pki::pem_encode("CERTIFICATE", c))
            .collect()
    }

    /// The cluster CA's certificate and key as files in `dir` (`cluster-ca.crt`, and
    /// `cluster-ca.key` for the in-memory server; on a real cluster the key is the file
    /// `E2E_CLUSTER_CA_KEY` names), as `cloudcore stream-certificate --ca-cert --ca-key` takes
    /// them. `None` on a real cluster without `E2E_CLUSTER_CA_KEY`.
    pub fn cluster_ca_files(&self, dir: &Path) -> anyhow::Result<Option<(PathBuf, PathBuf)>> {
        let cert = dir.join("cluster-ca.crt");
        let key = match &self.server {
            Some(server) => {
                let key = dir.join("cluster-ca.key");
                std::fs::write(&key, server.ca_key_pem())
                    .with_context(|| format!("writing {}", key.display()))?;
                key
            }
            None => match std::env::var_os(CLUSTER_CA_KEY_ENV) {
                Some(k) if !k.is_empty() => PathBuf::from(k),
                _ => return Ok(None),
            },
        };
        std::fs::write(&cert, self.cluster_ca_pem())
            .with_context(|| format!("writing {}", cert.display()))?;
        Ok(Some((cert, key)))
    }

    /// TLS for calling cloudcore's stream server as the apiserver does, trusting `server_ca`
    /// for the stream server's certificate: the in-memory apiserver's own kubelet client
    /// certificate, or on a real cluster one like kubeadm's `apiserver-kubelet-client` (CN
    /// `kube-apiserver-kubelet-client`, O `system:masters`) issued from the cluster CA key in
    /// `E2E_CLUSTER_CA_KEY`. `None` (after printing why the test is skipped) without that key;
    /// panics when the key cannot be used.
    pub fn apiserver_stream_tls(
        &self,
        server_ca: &rustls_pki_types::CertificateDer<'static>,
    ) -> Option<std::sync::Arc<rustls::ClientConfig>> {
        let needs = "the apiserver's kubelet client certificate (to call the stream server)";
        let (cert, key) = match &self.server {
            Some(server) => server.kubelet_client_identity(),
            None => {
                if skip_without_cluster_ca_key(needs) {
                    return None;
                }
                let dir = tempfile::tempdir().expect("temp dir");
                let (ca_cert, ca_key) = self
                    .cluster_ca_files(dir.path())
                    .expect("the cluster CA as files")?;
                let ca = cloudcore::cloudstream::load_ca(&ca_cert, &ca_key)
                    .unwrap_or_else(|e| panic!("{CLUSTER_CA_KEY_ENV}: {e}"));
                let c = ca
                    .issue_client("kube-apiserver-kubelet-client", Some("system:masters"), 1)
                    .expect("a kubelet client certificate");
                (c.cert_der.clone(), c.key_der())
            }
        };
        let tls =
            kubeedge_shared::tls::client_config(std::slice::from_ref(server_ca), vec![cert], key)
                .expect("apiserver client TLS");
        Some(tls)
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The in-memory server, when that is what the tests run against.
    pub fn in_memory(&self) -> Option<&ApiServer> {
        self.server.as_ref()
    }

    pub fn is_real(&self) -> bool {
        self.server.is_none()
    }

    /// `kubectl` pointed at this cluster (own discovery cache dir).
    pub fn kubectl(&self) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("kubectl");
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.kubectl_cache)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        c
    }

    /// Runs kubectl with `args` (and `stdin`), with a 60 s limit.
    pub async fn kubectl_run(
        &self,
        args: &[&str],
        stdin: Option<&str>,
    ) -> anyhow::Result<KubectlOutput> {
        use tokio::io::AsyncWriteExt;
        let mut cmd = self.kubectl();
        cmd.args(args);
        if stdin.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let mut child = cmd.spawn().context("spawning kubectl")?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes()).await?;
            drop(pipe);
        }
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .context("kubectl timed out")??;
        Ok(KubectlOutput {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Creates a namespace `<prefix>-xxxxx` and waits for its `default` ServiceAccount and its
    /// `kube-root-ca.crt` ConfigMap (which a real cluster's controllers publish a moment
    /// after the namespace exists; pods need both).
    pub async fn temp_namespace(&self, prefix: &str) -> anyhow::Result<String> {
        let api: Api<Namespace> = Api::all(self.client());
        let mut ns = Namespace::default();
        ns.metadata.generate_name = Some(format!("{prefix}-"));
        ns.metadata.labels = Some([(TEST_LABEL.0.to_string(), TEST_LABEL.1.to_string())].into());
        let created = api.create(&PostParams::default(), &ns).await?;
        let name = created.metadata.name.context("namespace without a name")?;
        let sas: Api<ServiceAccount> = Api::namespaced(self.client(), &name);
        let cms: Api<ConfigMap> = Api::namespaced(self.client(), &name);
        for _ in 0..300 {
            if sas.get_opt("default").await?.is_some()
                && cms.get_opt("kube-root-ca.crt").await?.is_some()
            {
                return Ok(name);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!(
            "namespace {name} has no default service account or kube-root-ca.crt after 30 s"
        )
    }

    /// Best-effort namespace deletion (tests call it at the end; on a real cluster it matters).
    pub async fn delete_namespace(&self, name: &str) {
        let api: Api<Namespace> = Api::all(self.client());
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.kubectl_cache);
    }
}
