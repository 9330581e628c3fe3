//! An in-memory Kubernetes API server for tests and the local demo.
//!
//! Serves HTTPS on loopback with a generated CA, bearer-token auth, discovery (legacy and
//! aggregated), core/v1 and a few other built-in kinds, CRDs and their custom resources, with
//! the real apiserver's semantics for resourceVersions, watches (bookmarks, 410 Gone), selectors,
//! pagination, patches, status subresources, graceful deletion and finalizers. See
//! `APISERVER.md` (next to this crate's manifest) for what it supports and how it differs from
//! the real one.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use kube_memserver::{ApiServer, Config};
//! let srv = ApiServer::start(Config::default()).await?;
//! let client = srv.client()?;
//! println!("kubectl --kubeconfig {}", srv.kubeconfig_path().display());
//! srv.shutdown().await;
//! # Ok(()) }
//! ```

mod apply;
mod authn;
mod certificates;
mod controllers;
mod discovery;
mod endpoints;
mod event_ttl;
mod faults;
mod gc;
mod handlers;
mod kubelet;
mod lock;
pub mod meta;
mod node_lifecycle;
mod node_proxy;
pub mod patch;
mod persist;
mod portforward;
mod protobuf;
mod query;
mod remotecommand;
pub mod resources;
#[cfg(test)]
mod robustness;
mod schema;
pub mod selectors;
mod server;
mod state;
pub mod status;
pub mod store;
mod strategy;
mod table;
mod tls;
mod tokens;
mod validation;
mod verbs;
mod watch;
mod workloads;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rand::RngCore;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use state::State;

/// Server settings. `Config::default()` suits tests; `Config::for_tests()` shortens the timers.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// The admin bearer token; random when `None` (or read from `data_dir`).
    pub token: Option<String>,
    /// Where to write the kubeconfig; default `<data_dir or a temp dir>/kubeconfig`.
    pub kubeconfig_path: Option<PathBuf>,
    /// Keeps the CA, token, signing key and a state snapshot across restarts.
    pub data_dir: Option<PathBuf>,
    /// Extra subject alternative names for the serving certificate.
    pub extra_sans: Vec<String>,
    /// Events kept per resource for watches from an older resourceVersion and for continue tokens.
    pub history_limit: usize,
    /// Events buffered per watcher before a slow watcher is dropped (it re-watches).
    pub watch_capacity: usize,
    /// Interval of BOOKMARK events for watchers that allow them.
    pub bookmark_interval: Duration,
    /// Watch duration when the client gives no `timeoutSeconds`.
    pub default_watch_timeout: Duration,
    /// kube-controller-manager `--node-monitor-grace-period`.
    pub node_monitor_grace_period: Duration,
    /// kube-controller-manager `--node-monitor-period`.
    pub node_monitor_period: Duration,
    /// How long pods may stay bound to a node that does not exist before the pod GC deletes them.
    pub pod_gc_orphan_quarantine: Duration,
    /// Delay before the endpoints controller reacts to a batch of pod/service changes.
    pub endpoints_sync_delay: Duration,
    /// How often the garbage collector looks for dependents of deleted owners (when something
    /// was deleted).
    pub gc_period: Duration,
    /// How often terminating namespaces are emptied and namespace defaults ensured.
    pub namespace_sync_period: Duration,
    /// kube-apiserver `--event-ttl`: an Event is deleted this long after its last write (etcd
    /// lets its lease expire; watchers see it deleted).
    pub event_ttl: Duration,
    /// Request body limit (the real server allows 3 MiB).
    pub max_body_bytes: usize,
    /// Snapshot interval when `data_dir` is set.
    pub snapshot_interval: Duration,
    /// Check kubelets' serving certificates against the cluster CA, as kube-apiserver with
    /// `--kubelet-certificate-authority=<cluster CA>` (hardened clusters) does; upstream's
    /// default (false) accepts any.
    pub verify_kubelet_certificates: bool,
    /// Run the scheduler and the workload controllers (Deployment, ReplicaSet, DaemonSet,
    /// StatefulSet, Job). Off, pods stay where clients put them, as before they existed.
    pub workload_controllers: bool,
    /// How often the scheduler and the workload controllers look for changes.
    pub workload_sync_period: Duration,
    /// The Job controller's retry backoff after a failed pod (doubled per failure, at most
    /// 6 min; upstream's is 10 s).
    pub job_backoff_base: Duration,
    /// The longest the workload controllers go without a pass (for time-based decisions:
    /// minReadySeconds, progress deadlines, active deadlines).
    pub workload_resync_period: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            token: None,
            kubeconfig_path: None,
            data_dir: None,
            extra_sans: Vec::new(),
            history_limit: 10_000,
            watch_capacity: 1024,
            bookmark_interval: Duration::from_secs(60),
            default_watch_timeout: Duration::from_secs(1800),
            node_monitor_grace_period: Duration::from_secs(40),
            node_monitor_period: Duration::from_secs(5),
            pod_gc_orphan_quarantine: Duration::from_secs(40),
            endpoints_sync_delay: Duration::from_millis(100),
            event_ttl: Duration::from_secs(3600),
            gc_period: Duration::from_secs(1),
            namespace_sync_period: Duration::from_millis(500),
            max_body_bytes: 3 * 1024 * 1024,
            snapshot_interval: Duration::from_secs(2),
            verify_kubelet_certificates: false,
            workload_controllers: true,
            workload_sync_period: Duration::from_millis(100),
            job_backoff_base: Duration::from_secs(10),
            workload_resync_period: Duration::from_secs(1),
        }
    }
}

impl Config {
    /// Short timers for tests: bookmarks every second, node grace 2 s checked every 200 ms;
    /// kubelets' certificates checked (what passes there passes without the check).
    pub fn for_tests() -> Self {
        Self {
            verify_kubelet_certificates: true,
            bookmark_interval: Duration::from_secs(1),
            node_monitor_grace_period: Duration::from_secs(2),
            node_monitor_period: Duration::from_millis(200),
            namespace_sync_period: Duration::from_millis(100),
            gc_period: Duration::from_millis(100),
            ..Self::default()
        }
    }
}

/// A running server. Stops when dropped or on [`ApiServer::shutdown`].
pub struct ApiServer {
    state: Arc<State>,
    addr: SocketAddr,
    url: String,
    kubeconfig_path: PathBuf,
    ca_der: Vec<u8>,
    ca_key_pem: String,
    /// The client certificate and PKCS#8 key it presents to kubelets.
    kubelet_client: (rustls_pki_types::CertificateDer<'static>, Vec<u8>),
    temp_dir: Option<PathBuf>,
    cancel: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Holds new watches back while alive (see [`ApiServer::pause_watches`]).
pub struct WatchPause {
    state: Arc<State>,
}

impl Drop for WatchPause {
    fn drop(&mut self) {
        self.state.watch_gate.send_replace(false);
    }
}

/// The server is unreachable while this lives (see [`ApiServer::outage`]).
pub struct Outage {
    state: Arc<State>,
}

impl Drop for Outage {
    fn drop(&mut self) {
        self.state.faults.set_outage(false);
    }
}

pub use faults::Failure;

/// See [`ApiServer::list_delay`].
#[derive(Clone)]
pub struct ListDelay(Arc<std::sync::atomic::AtomicU64>);

impl ListDelay {
    pub fn set(&self, max: Duration) {
        self.0
            .store(max.as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn read_or_create(path: Option<PathBuf>, make: impl FnOnce() -> String) -> anyhow::Result<String> {
    match path {
        Some(p) if p.exists() => Ok(std::fs::read_to_string(&p)?.trim().to_string()),
        Some(p) => {
            let v = make();
            tls::write_private(&p, v.as_bytes())?;
            Ok(v)
        }
        None => Ok(make()),
    }
}

impl ApiServer {
    /// Starts the server on the current Tokio runtime.
    pub async fn start(config: Config) -> anyhow::Result<Self> {
        if let Some(d) = &config.data_dir {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let pki = tls::make_pki(&config.extra_sans, config.data_dir.as_deref())?;
        let token = match &config.token {
            Some(t) => t.clone(),
            None => read_or_create(config.data_dir.as_ref().map(|d| d.join("token")), || {
                random_hex(24)
            })?,
        };
        let signing_key = read_or_create(
            config.data_dir.as_ref().map(|d| d.join("sa-signing.key")),
            || random_hex(32),
        )?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let addr = listener.local_addr()?;
        let host = match addr.ip() {
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            std::net::IpAddr::V4(ip) if ip.is_unspecified() => "127.0.0.1".to_string(),
            std::net::IpAddr::V4(ip) => ip.to_string(),
        };
        let url = format!("https://{host}:{}", addr.port());
        let (kubeconfig_path, temp_dir) = match (&config.kubeconfig_path, &config.data_dir) {
            (Some(p), _) => (p.clone(), None),
            (None, Some(d)) => (d.join("kubeconfig"), None),
            (None, None) => {
                let d = std::env::temp_dir().join(format!(
                    "kube-memserver-{}-{}",
                    std::process::id(),
                    random_hex(6)
                ));
                std::fs::create_dir_all(&d)?;
                (d.join("kubeconfig"), Some(d))
            }
        };
        if let Some(parent) = kubeconfig_path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        tls::write_private(
            &kubeconfig_path,
            tls::kubeconfig(&url, &pki.ca_pem, &token).as_bytes(),
        )
        .with_context(|| format!("writing {}", kubeconfig_path.display()))?;

        let mut st = State::new(
            config.clone(),
            tokens::TokenIssuer::new(signing_key.into_bytes()),
            token,
            pki.ca_pem.clone(),
            kubelet::client_configs(
                &pki.kubelet_client_der,
                &pki.kubelet_client_key_der,
                config
                    .verify_kubelet_certificates
                    .then_some(&pki.ca_der[..]),
            )?,
        );
        st.csr_signer = Some(certificates::ClusterSigner::new(
            &pki.ca_pem,
            &pki.ca_key_pem,
        )?);
        let st = Arc::new(st);
        let restored = match &config.data_dir {
            Some(d) => persist::load(&st, d)?,
            None => false,
        };
        bootstrap(&st);
        let cancel = CancellationToken::new();
        let acceptor = tokio_rustls::TlsAcceptor::from(tls::server_config(&pki)?);
        let mut tasks = vec![tokio::spawn(server::serve(
            listener,
            acceptor,
            st.clone(),
            cancel.clone(),
        ))];
        tasks.extend(controllers::spawn_all(&st, &cancel));
        if let Some(d) = &config.data_dir {
            tasks.push(tokio::spawn(persist::run(
                st.clone(),
                d.clone(),
                config.snapshot_interval,
                cancel.clone(),
            )));
        }
        tracing::info!(%url, kubeconfig = %kubeconfig_path.display(), restored, "kube-memserver listening");
        Ok(Self {
            state: st,
            addr,
            url,
            kubeconfig_path,
            ca_der: pki.ca_der,
            ca_key_pem: pki.ca_key_pem,
            kubelet_client: (pki.kubelet_client_der, pki.kubelet_client_key_der),
            temp_dir,
            cancel,
            tasks,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The admin bearer token.
    pub fn token(&self) -> &str {
        &self.state.admin_token
    }

    /// The cluster CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.state.ca_pem
    }

    /// The cluster CA's key (PEM; kubeadm's `/etc/kubernetes/pki/ca.key`): for tests that
    /// issue certificates from the cluster CA, e.g. a kubelet's serving certificate.
    pub fn ca_key_pem(&self) -> &str {
        &self.ca_key_pem
    }

    /// The certificate and key this server presents to kubelets (`--kubelet-client-certificate`,
    /// `CN=kube-apiserver-kubelet-client, O=system:masters`, signed by the cluster CA): for tests
    /// that call a "kubelet" as the apiserver would.
    pub fn kubelet_client_identity(
        &self,
    ) -> (
        rustls_pki_types::CertificateDer<'static>,
        rustls_pki_types::PrivateKeyDer<'static>,
    ) {
        let (cert, key) = &self.kubelet_client;
        (
            cert.clone(),
            rustls_pki_types::PrivatePkcs8KeyDer::from(key.clone()).into(),
        )
    }

    /// A kube-rs client for this server (admin token). Call within a Tokio runtime.
    pub fn client(&self) -> anyhow::Result<kube::Client> {
        Ok(kube::Client::try_from(self.kube_config()?)?)
    }

    /// The kube-rs configuration behind [`ApiServer::client`].
    pub fn kube_config(&self) -> anyhow::Result<kube::Config> {
        let mut cfg = kube::Config::new(self.url.parse().context("server URL")?);
        cfg.root_cert = Some(vec![self.ca_der.clone()]);
        cfg.auth_info = serde_json::from_value(json!({"token": self.state.admin_token}))?;
        cfg.default_namespace = "default".into();
        Ok(cfg)
    }

    /// The current cluster-wide resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.state.store.current_rv()
    }

    /// Forgets every resource's event history, as an etcd compaction would: watches and continue
    /// tokens from before now answer 410 Gone.
    pub fn compact_history(&self) {
        for t in self.state.store.tables() {
            t.compact();
        }
    }

    /// Ends every open watch and holds new watch requests until the returned guard is dropped.
    /// With [`ApiServer::compact_history`] this forces watch clients through a relist.
    pub fn pause_watches(&self) -> WatchPause {
        self.state.watch_gate.send_replace(true);
        for t in self.state.store.tables() {
            t.close_watchers();
        }
        WatchPause {
            state: self.state.clone(),
        }
    }

    /// A handle that makes every list answer after a random delay up to a maximum (zero: at
    /// once), as a loaded apiserver answers the lists of different kinds in any order.
    pub fn list_delay(&self) -> ListDelay {
        ListDelay(self.state.list_delay_ms.clone())
    }

    /// Answers every request but health checks with `failure` (as an overloaded or failing
    /// apiserver does) until [`ApiServer::heal`]. Open watches go on, as on a real server.
    pub fn fail_requests(&self, failure: Failure) {
        self.state.faults.set_failure(Some(failure));
    }

    /// Makes the server unreachable until the guard is dropped: every open connection (and
    /// watch) ends and new ones are closed at once, as when the apiserver's host is down.
    pub fn outage(&self) -> Outage {
        self.state.faults.set_outage(true);
        Outage {
            state: self.state.clone(),
        }
    }

    /// Ends every failure (an outage ends with its guard).
    pub fn heal(&self) {
        self.state.faults.set_failure(None);
    }

    /// Every open watch expires at once: they end, and the history they would resume from is
    /// gone, so every watch client gets 410 Gone and relists (as after a restart of the
    /// apiserver, whose new watch cache starts at the current resourceVersion).
    pub fn expire_watches(&self) {
        self.compact_history();
        for t in self.state.store.tables() {
            t.close_watchers();
        }
    }

    /// Open watches across all resources.
    pub fn watcher_count(&self) -> usize {
        self.state
            .store
            .tables()
            .iter()
            .map(|t| t.watcher_count())
            .sum()
    }

    /// Stops serving and waits for the server's tasks.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.cancel.cancel();
        for t in &self.tasks {
            t.abort();
        }
        if let Some(d) = &self.state.config.data_dir
            && let Err(e) = persist::save(&self.state, d)
        {
            tracing::warn!(error = %e, "saving snapshot at shutdown");
        }
        if let Some(d) = &self.temp_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// What a fresh control plane has: the system namespaces and the `kubernetes` service.
fn bootstrap(st: &State) {
    let ns = st.core("namespaces");
    for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        match verbs::create(st, &ns, "", body, &verbs::WriteOptions::default()) {
            Ok(_) => {}
            Err(e) if e.reason == "AlreadyExists" => verbs::ensure_namespace_defaults(st, name),
            Err(e) => tracing::warn!(namespace = name, error = %e, "bootstrap"),
        }
    }
    let svc = st.core("services");
    let body = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]}
    });
    if let Err(e) = verbs::create(st, &svc, "default", body, &verbs::WriteOptions::default())
        && e.reason != "AlreadyExists"
    {
        tracing::warn!(error = %e, "bootstrap kubernetes service");
    }
}
