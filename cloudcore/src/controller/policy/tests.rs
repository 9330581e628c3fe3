use super::rbac::{Principal, applies_to_sa, subject_principal};
use super::*;
use crate::cloudhub::queue::Enqueued;
use crate::cloudhub::{Capabilities, SendError};
use kubeedge_shared::{Group, Message, Operation, ResourceType};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Default)]
struct Recorder {
    sent: Mutex<Vec<(String, Message)>>,
    offline: Mutex<HashSet<String>>,
    /// Connected, but every send refused (a full queue).
    refuse: AtomicBool,
}

impl HubSink for Recorder {
    fn send(&self, node: &str, msg: Message) -> Result<Enqueued, crate::cloudhub::SendError> {
        if self.offline.lock().unwrap().contains(node) {
            return Err(SendError::NotConnected(node.into()));
        }
        if self.refuse.load(Ordering::SeqCst) {
            return Err(SendError::NotConnected(node.into()));
        }
        self.sent.lock().unwrap().push((node.to_string(), msg));
        Ok(Enqueued::Queued)
    }
    fn is_connected(&self, node: &str) -> bool {
        !self.offline.lock().unwrap().contains(node)
    }
    fn connected_nodes(&self) -> Vec<String> {
        Vec::new()
    }
    fn capabilities(&self, _: &str) -> Option<Capabilities> {
        None
    }
    fn disconnect(&self, _: &str) -> bool {
        false
    }
}

impl Recorder {
    /// `node op resource` of every message sent since the last call, sorted.
    fn take(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .take_msgs()
            .into_iter()
            .map(|(n, m)| format!("{n} {} {}", m.route.operation, m.route.resource))
            .collect();
        out.sort();
        out
    }
    fn take_msgs(&self) -> Vec<(String, Message)> {
        self.sent.lock().unwrap().drain(..).collect()
    }
}

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn sa(ns: &str, name: &str) -> Input {
    Input::ServiceAccounts(Change::Applied(from(json!({
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}")}}))))
}

fn pod(ns: &str, name: &str, node: &str, sa: &str) -> PodRef {
    PodRef {
        namespace: ns.into(),
        name: name.into(),
        node: node.into(),
        service_account: sa.into(),
    }
}

fn role(ns: &str, name: &str, verbs: Value) -> Input {
    Input::Roles(Change::Applied(from(json!({
        "metadata": {"name": name, "namespace": ns},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}]}))))
}

fn cluster_role(name: &str, verbs: Value) -> Input {
    Input::ClusterRoles(Change::Applied(from(json!({
        "metadata": {"name": name},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": verbs}]}))))
}

fn role_binding(ns: &str, name: &str, kind: &str, role: &str, subjects: Value) -> Input {
    Input::RoleBindings(Change::Applied(from(json!({
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": subjects}))))
}

fn cluster_role_binding(name: &str, role: &str, subjects: Value) -> Input {
    Input::ClusterRoleBindings(Change::Applied(from(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects}))))
}

/// A controller with every kind listed (nothing in the cluster yet).
fn rig() -> (Arc<Recorder>, Policy) {
    let hub = Arc::new(Recorder::default());
    let mut p = Policy::new(hub.clone());
    p.apply(Input::Pods(Change::Listed));
    p.apply(Input::ServiceAccounts(Change::Listed));
    p.apply(Input::Roles(Change::Listed));
    p.apply(Input::RoleBindings(Change::Listed));
    p.apply(Input::ClusterRoles(Change::Listed));
    p.apply(Input::ClusterRoleBindings(Change::Listed));
    (hub, p)
}

fn last_object(hub: &Recorder, node: &str) -> Value {
    hub.take_msgs()
        .into_iter()
        .rfind(|(n, _)| n == node)
        .map(|(_, m)| m.content)
        .unwrap()
}

#[test]
fn subjects_name_a_service_account_as_kubernetes_matches_them() {
    let s = |v: Value| -> k8s_openapi::api::rbac::v1::Subject { from(v) };
    let sa_user = Principal::User("system:serviceaccount:apps:reader".into());
    assert_eq!(
        subject_principal(
            &s(json!({"kind": "ServiceAccount", "name": "reader"})),
            "apps"
        ),
        Some(sa_user.clone())
    );
    // A ClusterRoleBinding's ServiceAccount subject needs its namespace.
    assert_eq!(
        subject_principal(&s(json!({"kind": "ServiceAccount", "name": "reader"})), ""),
        None
    );
    let subjects = |v: Value| -> Vec<k8s_openapi::api::rbac::v1::Subject> { from(v) };
    for yes in [
        json!([{"kind": "ServiceAccount", "name": "reader", "namespace": "apps"}]),
        json!([{"kind": "User", "name": "system:serviceaccount:apps:reader"}]),
        json!([{"kind": "Group", "name": "system:serviceaccounts"}]),
        json!([{"kind": "Group", "name": "system:serviceaccounts:apps"}]),
        json!([{"kind": "Group", "name": "nobody"}, {"kind": "Group", "name": "system:authenticated"}]),
    ] {
        assert!(
            applies_to_sa(&subjects(yes.clone()), "", "apps", "reader"),
            "{yes}"
        );
    }
    for no in [
        json!([{"kind": "ServiceAccount", "name": "reader", "namespace": "other"}]),
        json!([{"kind": "ServiceAccount", "name": "reader"}]),
        json!([{"kind": "User", "name": "reader"}]),
        json!([{"kind": "Group", "name": "system:serviceaccounts:other"}]),
        json!([{"kind": "Group", "name": "system:serviceaccount:apps:reader"}]),
        json!([]),
    ] {
        assert!(
            !applies_to_sa(&subjects(no.clone()), "", "apps", "reader"),
            "{no}"
        );
    }
}

#[test]
fn a_node_gets_the_access_of_the_service_accounts_its_pods_use() {
    let (hub, mut p) = rig();
    p.apply(sa("apps", "reader"));
    p.apply(sa("apps", "default"));
    p.apply(sa("apps", "idle"));
    p.apply(role("apps", "pod-reader", json!(["get", "list"])));
    p.apply(cluster_role("admin", json!(["*"])));
    p.apply(role_binding(
        "apps",
        "rb-role",
        "Role",
        "pod-reader",
        json!([{"kind": "ServiceAccount", "name": "reader"}]),
    ));
    p.apply(role_binding(
        "apps",
        "rb-cluster",
        "ClusterRole",
        "admin",
        json!([{"kind": "User", "name": "system:serviceaccount:apps:reader"}]),
    ));
    p.apply(cluster_role_binding(
        "crb-all",
        "admin",
        json!([{"kind": "Group", "name": "system:serviceaccounts:apps"}]),
    ));
    p.apply(cluster_role_binding(
        "crb-other",
        "admin",
        json!([{"kind": "Group", "name": "system:serviceaccounts:other"}]),
    ));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "a", "edge-1", "reader",
    ))));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "b", "edge-2", "default",
    ))));
    assert!(p.is_dirty());
    assert!(p.flush());
    let msgs = hub.take_msgs();
    let mut seen: Vec<String> = msgs
        .iter()
        .map(|(n, m)| format!("{n} {} {}", m.route.operation, m.route.resource))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            "edge-1 insert apps/serviceaccountaccess/reader",
            "edge-2 insert apps/serviceaccountaccess/default",
        ]
    );
    let (_, m) = msgs.iter().find(|(n, _)| n == "edge-1").unwrap();
    assert_eq!(m.route.source, "policycontroller");
    assert_eq!(m.route.group, Group::Resource);
    assert!(m.requires_ack());
    assert_eq!(
        m.resource_type(),
        Some(ResourceType::ServiceAccountAccess.as_str())
    );
    let acc = &m.content;
    assert_eq!(acc["apiVersion"], "policy.kubeedge.io/v1alpha1");
    assert_eq!(acc["kind"], "ServiceAccountAccess");
    assert_eq!(acc["metadata"]["name"], "reader");
    assert_eq!(acc["metadata"]["namespace"], "apps");
    assert_eq!(acc["metadata"]["uid"], "uid-apps-reader");
    assert_eq!(
        acc["metadata"]["resourceVersion"],
        m.header.resource_version
    );
    assert_eq!(acc["spec"]["serviceAccountUid"], "uid-apps-reader");
    assert_eq!(acc["spec"]["serviceAccount"]["metadata"]["name"], "reader");
    let rbs = acc["spec"]["accessRoleBinding"].as_array().unwrap();
    assert_eq!(rbs.len(), 2);
    // Sorted by (namespace, name): the ClusterRole's rules, then the Role's.
    assert_eq!(rbs[0]["roleBinding"]["metadata"]["name"], "rb-cluster");
    assert_eq!(rbs[0]["rules"][0]["verbs"], json!(["*"]));
    assert_eq!(rbs[1]["roleBinding"]["metadata"]["name"], "rb-role");
    assert_eq!(rbs[1]["rules"][0]["verbs"], json!(["get", "list"]));
    let crbs = acc["spec"]["accessClusterRoleBinding"].as_array().unwrap();
    assert_eq!(crbs.len(), 1);
    assert_eq!(crbs[0]["clusterRoleBinding"]["metadata"]["name"], "crb-all");
    assert_eq!(crbs[0]["rules"][0]["resources"], json!(["*"]));

    // Nothing changed: nothing sent.
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "a", "edge-1", "reader",
    ))));
    assert!(p.flush());
    assert!(hub.take().is_empty());
}

#[test]
fn a_role_binding_in_another_namespace_keeps_its_namespace() {
    let (hub, mut p) = rig();
    p.apply(sa("apps", "reader"));
    p.apply(role("ops", "pod-reader", json!(["get"])));
    p.apply(role_binding(
        "ops",
        "rb",
        "Role",
        "pod-reader",
        json!([{"kind": "ServiceAccount", "name": "reader", "namespace": "apps"}]),
    ));
    // Names a Role missing from its namespace: grants nothing.
    p.apply(role_binding(
        "apps",
        "rb-missing",
        "Role",
        "pod-reader",
        json!([{"kind": "ServiceAccount", "name": "reader"}]),
    ));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "a", "edge-1", "reader",
    ))));
    p.flush();
    let acc = last_object(&hub, "edge-1");
    let rbs = acc["spec"]["accessRoleBinding"].as_array().unwrap();
    assert_eq!(rbs.len(), 1);
    assert_eq!(rbs[0]["roleBinding"]["metadata"]["namespace"], "ops");
    assert_eq!(rbs[0]["rules"][0]["verbs"], json!(["get"]));
}

#[test]
fn a_new_role_binding_updates_the_nodes_using_the_account() {
    let (hub, mut p) = rig();
    p.apply(sa("apps", "reader"));
    p.apply(role("apps", "pod-reader", json!(["list"])));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "a", "edge-1", "reader",
    ))));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "b", "edge-2", "reader",
    ))));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "c", "edge-3", "default",
    ))));
    p.apply(sa("apps", "default"));
    p.flush();
    let first = hub.take_msgs();
    assert_eq!(first.len(), 3);
    let rv_before: u64 = first[0].1.header.resource_version.parse().unwrap();

    p.apply(role_binding(
        "apps",
        "rb",
        "Role",
        "pod-reader",
        json!([{"kind": "ServiceAccount", "name": "reader"}]),
    ));
    assert!(p.flush());
    let msgs = hub.take_msgs();
    let mut seen: Vec<String> = msgs
        .iter()
        .map(|(n, m)| format!("{n} {} {}", m.route.operation, m.route.resource))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            "edge-1 update apps/serviceaccountaccess/reader",
            "edge-2 update apps/serviceaccountaccess/reader",
        ]
    );
    for (_, m) in &msgs {
        assert!(m.header.resource_version.parse::<u64>().unwrap() > rv_before);
        assert_eq!(
            m.content["spec"]["accessRoleBinding"][0]["rules"][0]["verbs"],
            json!(["list"])
        );
    }
    // The role's rules change: the same nodes are updated.
    p.apply(role("apps", "pod-reader", json!(["list", "watch"])));
    p.flush();
    assert_eq!(hub.take().len(), 2);
    // The binding goes: updated again, without it.
    p.apply(Input::RoleBindings(Change::Deleted(from(json!({
        "metadata": {"name": "rb", "namespace": "apps"},
        "roleRef": {"apiGroup": "", "kind": "Role", "name": "pod-reader"}})))));
    p.flush();
    let acc = last_object(&hub, "edge-1");
    assert_eq!(acc["spec"]["accessRoleBinding"], json!([]));
}

#[test]
fn the_last_pod_of_an_account_leaving_a_node_deletes_its_access() {
    let (hub, mut p) = rig();
    p.apply(sa("apps", "reader"));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "a", "edge-1", "reader",
    ))));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "b", "edge-1", "reader",
    ))));
    p.flush();
    assert_eq!(
        hub.take(),
        ["edge-1 insert apps/serviceaccountaccess/reader"]
    );
    p.apply(Input::Pods(Change::Deleted(pod(
        "apps", "a", "edge-1", "reader",
    ))));
    p.flush();
    assert!(hub.take().is_empty());
    // Moved to another node (a relist sees it elsewhere).
    p.apply(Input::Pods(Change::Relisting));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "b", "edge-2", "reader",
    ))));
    p.apply(Input::Pods(Change::Listed));
    p.flush();
    let msgs = hub.take_msgs();
    let del = msgs.iter().find(|(n, _)| n == "edge-1").unwrap();
    assert_eq!(del.1.route.operation, Operation::Delete);
    assert_eq!(del.1.route.resource, "apps/serviceaccountaccess/reader");
    assert_eq!(del.1.content["metadata"]["uid"], "uid-apps-reader");
    assert!(del.1.requires_ack());
    assert!(
        msgs.iter()
            .any(|(n, m)| n == "edge-2" && m.route.operation == Operation::Insert)
    );
    // The relist left nothing else behind.
    p.apply(Input::Pods(Change::Relisting));
    p.apply(Input::Pods(Change::Listed));
    p.flush();
    assert_eq!(
        hub.take(),
        ["edge-2 delete apps/serviceaccountaccess/reader"]
    );
}

#[test]
fn a_deleted_service_account_is_deleted_at_the_edge() {
    let (hub, mut p) = rig();
    p.apply(sa("apps", "reader"));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "a", "edge-1", "reader",
    ))));
    p.flush();
    hub.take();
    p.apply(Input::ServiceAccounts(Change::Deleted(from(json!({
        "metadata": {"name": "reader", "namespace": "apps"}})))));
    p.flush();
    assert_eq!(
        hub.take(),
        ["edge-1 delete apps/serviceaccountaccess/reader"]
    );
    // Created again: inserted.
    p.apply(sa("apps", "reader"));
    p.flush();
    assert_eq!(
        hub.take(),
        ["edge-1 insert apps/serviceaccountaccess/reader"]
    );
}

#[test]
fn a_reconnecting_edge_gets_everything_again() {
    let (hub, mut p) = rig();
    p.apply(sa("apps", "reader"));
    p.apply(sa("apps", "default"));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "a", "edge-1", "reader",
    ))));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "b", "edge-1", "default",
    ))));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "c", "edge-2", "default",
    ))));
    p.flush();
    assert_eq!(hub.take().len(), 3);
    p.apply(Input::Disconnected("edge-1".into()));
    hub.offline.lock().unwrap().insert("edge-1".into());
    p.flush();
    assert!(hub.take().is_empty());
    hub.offline.lock().unwrap().clear();
    p.apply(Input::Connected("edge-1".into()));
    assert!(p.is_dirty());
    p.flush();
    assert_eq!(
        hub.take(),
        [
            "edge-1 insert apps/serviceaccountaccess/default",
            "edge-1 insert apps/serviceaccountaccess/reader",
        ]
    );
}

#[test]
fn nothing_is_sent_before_every_kind_is_listed_and_failed_sends_are_retried() {
    let hub = Arc::new(Recorder::default());
    let mut p = Policy::new(hub.clone());
    p.apply(Input::Pods(Change::Listed));
    p.apply(sa("apps", "reader"));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "a", "edge-1", "reader",
    ))));
    assert!(!p.is_dirty());
    p.flush();
    assert!(hub.take().is_empty());
    for i in [
        Input::ServiceAccounts(Change::Listed),
        Input::Roles(Change::Listed),
        Input::RoleBindings(Change::Listed),
        Input::ClusterRoles(Change::Listed),
        Input::ClusterRoleBindings(Change::Listed),
    ] {
        p.apply(i);
    }
    assert!(p.is_dirty());
    // The edge is not connected: nothing recorded, sent when it connects.
    hub.offline.lock().unwrap().insert("edge-1".into());
    assert!(p.flush());
    hub.offline.lock().unwrap().clear();
    p.apply(Input::Connected("edge-1".into()));
    hub.refuse.store(true, Ordering::SeqCst);
    assert!(!p.flush());
    assert!(p.is_dirty());
    hub.refuse.store(false, Ordering::SeqCst);
    assert!(p.flush());
    assert_eq!(
        hub.take(),
        ["edge-1 insert apps/serviceaccountaccess/reader"]
    );
    assert!(!p.is_dirty());
}

#[test]
fn a_pods_service_account_defaults_as_admission_defaults_it() {
    let p = |spec: Value| -> k8s_openapi::api::core::v1::Pod {
        from(json!({"metadata": {"name": "p", "namespace": "apps"}, "spec": spec}))
    };
    let named = watch::pod_ref(p(
        json!({"nodeName": "edge-1", "serviceAccountName": "reader",
        "containers": []}),
    ));
    assert_eq!(named, pod("apps", "p", "edge-1", "reader"));
    let old = watch::pod_ref(p(json!({"nodeName": "edge-1", "serviceAccount": "legacy",
        "containers": []})));
    assert_eq!(old.service_account, "legacy");
    let none = watch::pod_ref(p(json!({"containers": []})));
    assert_eq!(none, pod("apps", "p", "", "default"));
}

#[test]
fn an_inventory_with_accesses_the_node_should_not_hold_gets_deletes() {
    let (hub, mut p) = rig();
    p.apply(sa("apps", "reader"));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "a", "edge-1", "reader",
    ))));
    p.flush();
    hub.take();
    let held = |ns: &str, name: &str| kubeedge_shared::inventory::HeldObject {
        resource_type: ResourceType::ServiceAccountAccess,
        namespace: ns.into(),
        name: name.into(),
        uid: "old".into(),
        resource_version: 1,
    };
    p.apply(Input::Inventory {
        node: "edge-1".into(),
        held: vec![held("apps", "reader"), held("apps", "gone")],
    });
    let msgs = hub.take_msgs();
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0].1.route.operation, Operation::Delete);
    assert_eq!(msgs[0].1.route.resource, "apps/serviceaccountaccess/gone");
    assert_eq!(msgs[0].1.content["metadata"]["uid"], "old");

    // Before everything is listed an inventory waits: the node's pods may not be known yet.
    let hub = Arc::new(Recorder::default());
    let mut p = Policy::new(hub.clone());
    p.apply(Input::Inventory {
        node: "edge-1".into(),
        held: vec![held("apps", "reader"), held("apps", "gone")],
    });
    assert!(hub.take().is_empty());
    p.apply(sa("apps", "reader"));
    p.apply(Input::Pods(Change::Applied(pod(
        "apps", "a", "edge-1", "reader",
    ))));
    for i in [
        Input::Pods(Change::Listed),
        Input::ServiceAccounts(Change::Listed),
        Input::Roles(Change::Listed),
        Input::RoleBindings(Change::Listed),
        Input::ClusterRoles(Change::Listed),
        Input::ClusterRoleBindings(Change::Listed),
    ] {
        p.apply(i);
    }
    assert_eq!(hub.take(), ["edge-1 delete apps/serviceaccountaccess/gone"]);
}

#[tokio::test]
async fn the_actor_coalesces_a_burst_into_one_pass() {
    let hub = Arc::new(Recorder::default());
    let (tx, rx) = mpsc::channel(64);
    let (events_tx, events) = broadcast::channel(4);
    let stop = CancellationToken::new();
    let task = tokio::spawn(run(Policy::new(hub.clone()), rx, events, stop.clone()));
    for i in [
        Input::Pods(Change::Listed),
        Input::ServiceAccounts(Change::Listed),
        Input::Roles(Change::Listed),
        Input::RoleBindings(Change::Listed),
        Input::ClusterRoles(Change::Listed),
        Input::ClusterRoleBindings(Change::Listed),
        sa("apps", "reader"),
    ] {
        tx.send(i).await.unwrap();
    }
    for n in 0..50 {
        let p = pod("apps", &format!("p{n}"), "edge-1", "reader");
        tx.send(Input::Pods(Change::Applied(p))).await.unwrap();
        tx.send(role("apps", &format!("r{n}"), json!(["get"])))
            .await
            .unwrap();
    }
    tokio::time::sleep(DEBOUNCE * 3).await;
    assert_eq!(
        hub.take(),
        ["edge-1 insert apps/serviceaccountaccess/reader"]
    );
    drop(events_tx);
    stop.cancel();
    task.await.unwrap();
}
