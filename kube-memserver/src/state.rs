//! Everything a request handler or a controller needs: the store, the kind registry, token
//! issuing, the cluster CA and the server's knobs.

use std::sync::atomic::{AtomicU32, Ordering};

use tokio::sync::watch;

use super::Config;
use super::resources::{Registry, ResourceInfo};
use super::store::{Store, StoreConfig, Table};
use super::tokens::TokenIssuer;

pub struct State {
    pub store: Store,
    pub resources: Registry,
    pub tokens: TokenIssuer,
    pub admin_token: String,
    pub ca_pem: String,
    pub config: Config,
    /// TLS towards kubelets (client certificate signed by the cluster CA).
    pub kubelet_tls: super::kubelet::KubeletTls,
    /// The cluster CA as kube-controller-manager's CSR signers use it (None: nothing is signed).
    pub csr_signer: Option<super::certificates::ClusterSigner>,
    /// `true` while new watches are held back (a test knob to force relists).
    pub watch_gate: watch::Sender<bool>,
    /// Lists answer after a random delay up to this many milliseconds (a test knob: a loaded
    /// apiserver answers the lists of different kinds in any order).
    pub list_delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Failures and outages on demand (a test knob, `faults.rs`).
    pub faults: super::faults::Faults,
    next_cluster_ip: AtomicU32,
    next_node_port: AtomicU32,
}

impl State {
    pub fn new(
        config: Config,
        tokens: TokenIssuer,
        admin_token: String,
        ca_pem: String,
        kubelet_tls: super::kubelet::KubeletTls,
    ) -> Self {
        let store = Store::new(StoreConfig {
            history_limit: config.history_limit,
            watch_capacity: config.watch_capacity,
        });
        Self {
            store,
            resources: Registry::new(),
            tokens,
            admin_token,
            ca_pem,
            kubelet_tls,
            csr_signer: None,
            config,
            watch_gate: watch::channel(false).0,
            list_delay_ms: Default::default(),
            faults: Default::default(),
            next_cluster_ip: AtomicU32::new(10),
            next_node_port: AtomicU32::new(30000),
        }
    }

    pub fn table(&self, info: &ResourceInfo) -> std::sync::Arc<Table> {
        self.store.table(&info.group, &info.plural)
    }

    pub fn core(&self, plural: &str) -> std::sync::Arc<ResourceInfo> {
        match self.resources.lookup("", "v1", plural) {
            Some(i) => i,
            // Built-ins are always registered; fall back to a harmless placeholder.
            None => std::sync::Arc::new(ResourceInfo {
                group: String::new(),
                version: "v1".into(),
                plural: plural.into(),
                singular: plural.into(),
                kind: plural.into(),
                namespaced: true,
                short_names: vec![],
                categories: vec![],
                subresources: vec![],
                custom: false,
                printer_columns: vec![],
                returns_deleted_object: false,
                allow_create_on_update: false,
                allow_unconditional_update: true,
                tracks_generation: false,
                name_rule: super::resources::NameRule::Subdomain,
                selectable_fields: vec![],
                schema: None,
            }),
        }
    }

    /// Next ClusterIP from 10.96.0.0/12 (10.96.0.1 is the `kubernetes` service).
    pub fn allocate_cluster_ip(&self) -> String {
        let n = self.next_cluster_ip.fetch_add(1, Ordering::SeqCst) % (1 << 20);
        format!("10.{}.{}.{}", 96 + (n >> 16), (n >> 8) & 0xff, n & 0xff)
    }

    pub fn allocate_node_port(&self) -> u32 {
        let n = self.next_node_port.fetch_add(1, Ordering::SeqCst);
        30000 + n.wrapping_sub(30000) % 2768
    }
}
