//! The policy controller (KubeEdge's `policycontroller`, devices reference §6.2): the RBAC
//! rules of the service accounts an edge's pods use, sent to that edge so that its MetaServer
//! authorizes requests offline (`edgecore/src/metaserver/authz.rs`).
//!
//! For every edge node and every service account its pods use (`spec.serviceAccountName`,
//! default `default`), a `policy.kubeedge.io/v1alpha1` `ServiceAccountAccess` named like the
//! service account, in its namespace: `spec.serviceAccount` (the object),
//! `serviceAccountUid`, `accessRoleBinding[]` and `accessClusterRoleBinding[]` (the bindings
//! naming the service account, with the rules of the role each references). Unlike KubeEdge
//! no such object is created in the cluster (no CRD needed): it is computed and sent.
//!
//! One actor owns the state (`state.rs`); the watches (`watch.rs`) only feed it. Changes only
//! mark nodes (pod moves) or everything (RBAC changes) dirty; within [`DEBOUNCE`] they are
//! coalesced into one pass that sends each connected node only what differs from what it was
//! sent (insert / update / delete when its last pod of a service account left). A node
//! that (re)connects gets everything again; one whose inventory lists objects it should not
//! hold gets deletes.

mod messages;
mod rbac;
mod state;
#[cfg(test)]
mod tests;
mod watch;

pub use state::Policy;

use crate::cloudhub::HubSink;
use crate::cloudhub::NodeEvent;
use crate::controller::kind::Kind;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kubeedge_shared::inventory::HeldObject;
use rbac::ObjKey;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

pub const API_VERSION: &str = "policy.kubeedge.io/v1alpha1";
pub const KIND: &str = "ServiceAccountAccess";
/// Changes arriving within this time are handled in one pass.
pub const DEBOUNCE: Duration = Duration::from_millis(200);
/// After a failed send (a full queue), the next try.
const RETRY: Duration = Duration::from_secs(5);

/// What the policy controller keeps of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    /// `""` while unscheduled.
    pub node: String,
    pub service_account: String,
}

/// One watched kind's news.
#[derive(Debug)]
pub enum Change<T> {
    Applied(T),
    Deleted(T),
    /// A relist began / ended: objects not seen again are gone.
    Relisting,
    Listed,
}

/// The kinds the policy actor watches; it sends nothing before each has listed once.
pub const WATCHED: [Kind; 6] = [
    Kind::Pod,
    Kind::ServiceAccount,
    Kind::Role,
    Kind::RoleBinding,
    Kind::ClusterRole,
    Kind::ClusterRoleBinding,
];

/// What the actor is told.
#[derive(Debug)]
pub enum Input {
    Pods(Change<PodRef>),
    ServiceAccounts(Change<ServiceAccount>),
    Roles(Change<Role>),
    RoleBindings(Change<RoleBinding>),
    ClusterRoles(Change<ClusterRole>),
    ClusterRoleBindings(Change<ClusterRoleBinding>),
    Connected(String),
    Disconnected(String),
    /// What an edge holds (from its inventory).
    Inventory {
        node: String,
        held: Vec<HeldObject>,
    },
}

/// `(namespace, name)` of a watched object.
pub trait Keyed {
    fn key(&self) -> ObjKey;
}

impl Keyed for PodRef {
    fn key(&self) -> ObjKey {
        (self.namespace.clone(), self.name.clone())
    }
}

macro_rules! keyed {
    ($($t:ty),*) => {$(
        impl Keyed for $t {
            fn key(&self) -> ObjKey {
                (
                    self.metadata.namespace.clone().unwrap_or_default(),
                    self.metadata.name.clone().unwrap_or_default(),
                )
            }
        }
    )*};
}
keyed!(
    ServiceAccount,
    Role,
    RoleBinding,
    ClusterRole,
    ClusterRoleBinding
);

/// Hands the policy controller what other parts learn (edge inventories).
#[derive(Clone)]
pub struct PolicyControllerHandle {
    tx: mpsc::Sender<Input>,
}

impl PolicyControllerHandle {
    pub async fn inventory(&self, node: String, held: &[HeldObject]) {
        let held: Vec<HeldObject> = held
            .iter()
            .filter(|h| h.resource_type == kubeedge_shared::ResourceType::ServiceAccountAccess)
            .cloned()
            .collect();
        let _ = self.tx.send(Input::Inventory { node, held }).await;
    }
}

/// Starts the watches and the actor.
pub fn spawn(
    client: kube::Client,
    hub: Arc<dyn HubSink>,
    events: broadcast::Receiver<NodeEvent>,
    shutdown: CancellationToken,
) -> (PolicyControllerHandle, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<Input>(1024);
    tokio::spawn(watch::run(client, tx.clone(), shutdown.clone()));
    let task = tokio::spawn(run(Policy::new(hub), rx, events, shutdown));
    (PolicyControllerHandle { tx }, task)
}

/// The actor: applies inputs, and at most [`DEBOUNCE`] after the first of a burst, flushes.
pub async fn run(
    mut policy: Policy,
    mut rx: mpsc::Receiver<Input>,
    mut events: broadcast::Receiver<NodeEvent>,
    shutdown: CancellationToken,
) {
    let mut due: Option<tokio::time::Instant> = None;
    loop {
        let input = tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = async { tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)).await }, if due.is_some() => {
                due = None;
                if !policy.flush() {
                    due = Some(tokio::time::Instant::now() + RETRY);
                }
                continue;
            }
            i = rx.recv() => match i { Some(i) => i, None => break },
            e = events.recv() => match e {
                Ok(NodeEvent::Connected { node, .. }) => Input::Connected(node),
                Ok(NodeEvent::Disconnected { node, .. }) => Input::Disconnected(node),
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "policy controller missed node events; resending everything");
                    policy.resync_all();
                    due.get_or_insert_with(|| tokio::time::Instant::now() + DEBOUNCE);
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
        };
        policy.apply(input);
        if due.is_none() && policy.is_dirty() {
            due = Some(tokio::time::Instant::now() + DEBOUNCE);
        }
    }
}
