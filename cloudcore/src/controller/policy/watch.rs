//! Cluster-wide watches (kube-runtime's watcher, with its back-off) of scheduled pods,
//! service accounts and the RBAC kinds. Pods are reduced at once to what the controller
//! keeps ([`PodRef`]).

use super::{Change, Input, PodRef};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use std::fmt::Debug;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub async fn run(client: kube::Client, tx: mpsc::Sender<Input>, shutdown: CancellationToken) {
    // Only scheduled pods: an unscheduled one appears when it is bound.
    let pods = watcher::Config::default().fields("spec.nodeName!=");
    let all = watcher::Config::default;
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = async {
            tokio::join!(
                watch(Api::<Pod>::all(client.clone()), pods, tx.clone(), |c| Input::Pods(map(c, pod_ref))),
                watch(Api::<ServiceAccount>::all(client.clone()), all(), tx.clone(), Input::ServiceAccounts),
                watch(Api::<Role>::all(client.clone()), all(), tx.clone(), Input::Roles),
                watch(Api::<RoleBinding>::all(client.clone()), all(), tx.clone(), Input::RoleBindings),
                watch(Api::<ClusterRole>::all(client.clone()), all(), tx.clone(), Input::ClusterRoles),
                watch(Api::<ClusterRoleBinding>::all(client), all(), tx, Input::ClusterRoleBindings),
            )
        } => {}
    }
}

/// What the policy controller keeps of a pod; the service account defaults as the admission
/// plugin defaults it (`serviceAccountName`, else the deprecated `serviceAccount`, else
/// `default`).
pub fn pod_ref(pod: Pod) -> PodRef {
    let spec = pod.spec.as_ref();
    let sa = spec
        .and_then(|s| s.service_account_name.as_deref())
        .filter(|s| !s.is_empty())
        .or_else(|| {
            spec.and_then(|s| s.service_account.as_deref())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or("default");
    PodRef {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        service_account: sa.to_string(),
    }
}

fn map<T, U>(c: Change<T>, f: fn(T) -> U) -> Change<U> {
    match c {
        Change::Applied(o) => Change::Applied(f(o)),
        Change::Deleted(o) => Change::Deleted(f(o)),
        Change::Relisting => Change::Relisting,
        Change::Listed => Change::Listed,
    }
}

async fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    tx: mpsc::Sender<Input>,
    wrap: impl Fn(Change<K>) -> Input,
) where
    K: Resource + Clone + serde::de::DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut warned = false;
    while let Some(event) = stream.next().await {
        let change = match event {
            Ok(Event::Apply(o) | Event::InitApply(o)) => Change::Applied(o),
            Ok(Event::Delete(o)) => Change::Deleted(o),
            Ok(Event::Init) => Change::Relisting,
            Ok(Event::InitDone) => Change::Listed,
            Err(e) => {
                if !warned {
                    tracing::warn!(kind = %K::kind(&K::DynamicType::default()), error = %e,
                        "policy controller watch failed; retrying");
                    warned = true;
                }
                continue;
            }
        };
        warned = false;
        if tx.send(wrap(change)).await.is_err() {
            return;
        }
    }
}
