use super::*;
use serde_json::json;

const SA: &str = "system:serviceaccount:apps:reader";

fn sa_user() -> UserInfo {
    UserInfo {
        name: SA.into(),
        groups: vec![
            "system:serviceaccounts".into(),
            "system:serviceaccounts:apps".into(),
            "system:authenticated".into(),
        ],
    }
}

fn req(verb: &str, group: &str, resource: &str, ns: &str, name: &str) -> Attributes {
    Attributes {
        verb: verb.into(),
        api_group: group.into(),
        resource: resource.into(),
        namespace: ns.into(),
        name: name.into(),
        resource_request: true,
        ..Attributes::default()
    }
}

fn non_resource(verb: &str, path: &str) -> Attributes {
    Attributes {
        verb: verb.into(),
        path: path.into(),
        ..Attributes::default()
    }
}

fn sa_subject() -> Value {
    json!({"kind": "ServiceAccount", "name": "reader", "namespace": "apps"})
}

fn cluster(subjects: Value, rules: Value) -> Value {
    json!({"spec": {"accessClusterRoleBinding": [{
        "clusterRoleBinding": {"metadata": {"name": "crb"}, "subjects": subjects},
        "rules": rules}]}})
}

fn namespaced(ns: &str, subjects: Value, rules: Value) -> Value {
    json!({"spec": {"accessRoleBinding": [{
        "roleBinding": {"metadata": {"name": "rb", "namespace": ns}, "subjects": subjects},
        "rules": rules}]}})
}

fn allowed(access: &Value, a: &Attributes) -> bool {
    authorize(std::slice::from_ref(access), &sa_user(), a).is_ok()
}

#[test]
fn verbs_groups_and_resources_with_wildcards() {
    let acc = cluster(
        json!([sa_subject()]),
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
               {"apiGroups": ["apps"], "resources": ["*"], "verbs": ["*"]}]),
    );
    assert!(allowed(&acc, &req("list", "", "pods", "apps", "")));
    assert!(allowed(&acc, &req("get", "", "pods", "other", "p")));
    assert!(!allowed(&acc, &req("delete", "", "pods", "apps", "p")));
    assert!(!allowed(&acc, &req("get", "", "secrets", "apps", "s")));
    assert!(!allowed(&acc, &req("get", "batch", "pods", "apps", "p")));
    assert!(allowed(
        &acc,
        &req("patch", "apps", "deployments", "x", "d")
    ));
    let all = cluster(
        json!([sa_subject()]),
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    );
    assert!(allowed(&all, &req("create", "batch", "jobs", "apps", "")));
}

#[test]
fn subresources_need_their_own_rule_or_a_star_form() {
    let acc = cluster(
        json!([sa_subject()]),
        json!([{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get"]},
               {"apiGroups": ["apps"], "resources": ["*/scale"], "verbs": ["get"]}]),
    );
    let mut log = req("get", "", "pods", "apps", "p");
    log.subresource = "log".into();
    assert!(allowed(&acc, &log));
    let mut exec = log.clone();
    exec.subresource = "exec".into();
    assert!(!allowed(&acc, &exec));
    let mut scale = req("get", "apps", "deployments", "apps", "d");
    scale.subresource = "scale".into();
    assert!(allowed(&acc, &scale));
    scale.subresource = "status".into();
    assert!(!allowed(&acc, &scale));
}

#[test]
fn resource_names_limit_requests_that_name_an_object() {
    let acc = cluster(
        json!([sa_subject()]),
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"],
                "resourceNames": ["cfg"]}]),
    );
    assert!(allowed(&acc, &req("get", "", "configmaps", "apps", "cfg")));
    assert!(!allowed(
        &acc,
        &req("get", "", "configmaps", "apps", "other")
    ));
    assert!(!allowed(&acc, &req("list", "", "configmaps", "apps", "")));
}

#[test]
fn non_resource_urls_exact_and_prefix() {
    let acc = cluster(
        json!([sa_subject()]),
        json!([{"nonResourceURLs": ["/healthz", "/apis/*"], "verbs": ["get"]},
               {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    );
    assert!(allowed(&acc, &non_resource("get", "/healthz")));
    assert!(!allowed(&acc, &non_resource("get", "/healthz/ready")));
    assert!(allowed(&acc, &non_resource("get", "/apis/apps/v1")));
    assert!(!allowed(&acc, &non_resource("post", "/apis/apps")));
    assert!(!allowed(&acc, &non_resource("get", "/version")));
    // A resource rule never grants a path, a path rule never grants a resource.
    let paths = cluster(
        json!([sa_subject()]),
        json!([{"nonResourceURLs": ["*"], "verbs": ["*"]}]),
    );
    assert!(allowed(&paths, &non_resource("get", "/anything")));
    assert!(!allowed(&paths, &req("get", "", "pods", "apps", "")));
}

#[test]
fn role_bindings_apply_only_in_their_namespace() {
    let acc = namespaced(
        "apps",
        json!([{"kind": "ServiceAccount", "name": "reader"}]),
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
               {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
    );
    // The subject's namespace defaults to the binding's.
    assert!(allowed(&acc, &req("list", "", "pods", "apps", "")));
    assert!(!allowed(&acc, &req("list", "", "pods", "other", "")));
    assert!(!allowed(&acc, &req("list", "", "pods", "", "")));
    assert!(!allowed(&acc, &non_resource("get", "/healthz")));
    // The same SA name in another namespace is another user.
    let elsewhere = namespaced(
        "other",
        json!([{"kind": "ServiceAccount", "name": "reader"}]),
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]),
    );
    assert!(!allowed(&elsewhere, &req("list", "", "pods", "other", "")));
}

#[test]
fn cluster_binding_service_account_subject_needs_a_namespace() {
    let rules = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]);
    let no_ns = cluster(
        json!([{"kind": "ServiceAccount", "name": "reader"}]),
        rules.clone(),
    );
    assert!(!allowed(&no_ns, &req("list", "", "pods", "apps", "")));
    let other_sa = cluster(
        json!([{"kind": "ServiceAccount", "name": "writer", "namespace": "apps"}]),
        rules,
    );
    assert!(!allowed(&other_sa, &req("list", "", "pods", "apps", "")));
}

#[test]
fn user_and_group_subjects() {
    let rules = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]);
    let a = req("list", "", "pods", "apps", "");
    for subject in [
        json!({"kind": "User", "name": SA}),
        json!({"kind": "Group", "name": "system:serviceaccounts"}),
        json!({"kind": "Group", "name": "system:serviceaccounts:apps"}),
        json!({"kind": "Group", "name": "system:authenticated"}),
    ] {
        assert!(allowed(&cluster(json!([subject]), rules.clone()), &a));
    }
    for subject in [
        json!({"kind": "User", "name": "reader"}),
        json!({"kind": "Group", "name": "system:serviceaccounts:other"}),
        json!({"kind": "Group", "name": SA}),
    ] {
        assert!(!allowed(&cluster(json!([subject]), rules.clone()), &a));
    }
}

#[test]
fn malformed_objects_grant_nothing() {
    let a = req("list", "", "pods", "apps", "");
    for acc in [
        json!(null),
        json!("x"),
        json!({"spec": {"accessClusterRoleBinding": "x"}}),
        json!({"spec": {"accessClusterRoleBinding": [{"clusterRoleBinding": 3, "rules": [{}]}]}}),
        cluster(json!([sa_subject()]), json!({"verbs": ["*"]})),
        cluster(
            json!([sa_subject()]),
            json!([{"verbs": "*", "resources": 1}]),
        ),
    ] {
        assert!(!allowed(&acc, &a), "{acc}");
    }
    assert!(authorize(&[], &sa_user(), &a).is_err());
}

#[test]
fn refusals_read_like_kube_apiservers() {
    let user = sa_user();
    let err = authorize(&[], &user, &req("list", "", "pods", "apps", "")).unwrap_err();
    assert_eq!(
        err,
        r#"pods is forbidden: User "system:serviceaccount:apps:reader" cannot list resource "pods" in API group "" in the namespace "apps""#
    );
    let mut scale = req("get", "apps", "deployments", "apps", "web");
    scale.subresource = "scale".into();
    let err = authorize(&[], &user, &scale).unwrap_err();
    assert_eq!(
        err,
        r#"deployments.apps "web" is forbidden: User "system:serviceaccount:apps:reader" cannot get resource "deployments/scale" in API group "apps" in the namespace "apps""#
    );
    let err = authorize(&[], &user, &req("list", "", "nodes", "", "")).unwrap_err();
    assert_eq!(
        err,
        r#"nodes is forbidden: User "system:serviceaccount:apps:reader" cannot list resource "nodes" in API group "" at the cluster scope"#
    );
    let err = authorize(&[], &user, &non_resource("get", "/healthz")).unwrap_err();
    assert_eq!(
        err,
        r#"forbidden: User "system:serviceaccount:apps:reader" cannot get path "/healthz""#
    );
    let status = forbidden_status(&scale, "m");
    assert_eq!(status["code"], 403);
    assert_eq!(status["reason"], "Forbidden");
    assert_eq!(
        status["details"],
        json!({"name": "web", "group": "apps", "kind": "deployments"})
    );
}

#[test]
fn any_of_several_accesses_may_allow() {
    let none = cluster(json!([sa_subject()]), json!([]));
    let some = namespaced(
        "apps",
        json!([sa_subject()]),
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
    );
    let a = req("get", "", "pods", "apps", "p");
    assert!(authorize(&[none.clone(), some], &sa_user(), &a).is_ok());
    assert!(authorize(&[none], &sa_user(), &a).is_err());
}
