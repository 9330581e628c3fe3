//! API conformance: behaviours clients rely on, exercised only through kube-rs and kubectl.
//!
//! Runs against the in-memory API server by default, or a real cluster when `E2E_KUBECONFIG` is
//! set. Tests that need in-memory-only knobs (short node grace period, forced compaction) say so
//! and skip on a real cluster. Comparisons look only at the test's own objects (a real cluster
//! adds `kube-root-ca.crt` ConfigMaps, `default` ServiceAccounts and events of its own), waits
//! have deadlines, and nothing relies on a bookmark the real server sends only once a minute.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::apiserver::Config;
use e2e::cluster::{self, TestCluster};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams, Preconditions, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

#[path = "conformance/certificates.rs"]
mod certificates;
#[path = "conformance/event_ttl.rs"]
mod event_ttl;
#[path = "conformance/faults.rs"]
mod faults;
#[path = "conformance/workloads.rs"]
mod workloads;

async fn setup(prefix: &str) -> (TestCluster, String) {
    let c = cluster::connect()
        .await
        .expect("connect to the test cluster");
    let ns = c.temp_namespace(prefix).await.expect("test namespace");
    (c, ns)
}

fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>()},
        "data": {"k": "v"},
    }))
    .expect("configmap")
}

/// The scheduler of pods that must stay unbound (none runs under this name).
const UNSCHEDULED: &str = "e2e-kubeedge-rs-unscheduled";

fn pod(name: &str, node: Option<&str>) -> Pod {
    let mut spec = json!({"containers": [
        {"name": "app", "image": "busybox:1.36", "env": [{"name": "A", "value": "1"}]},
        {"name": "side", "image": "busybox:1.36"}
    ]});
    match node {
        Some(n) => spec["nodeName"] = json!(n),
        // No scheduler has this name: the pod stays unbound and Pending on any cluster, also
        // one whose nodes could run it.
        None => spec["schedulerName"] = json!(UNSCHEDULED),
    }
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"app": name}}, "spec": spec}),
    )
    .expect("pod")
}

fn api_error(e: kube::Error) -> Box<kube::core::Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error Status, got {other:?}"),
    }
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        uuid::Uuid::new_v4()
            .simple()
            .to_string()
            .get(..8)
            .unwrap_or("x")
    )
}

async fn names(api: &Api<ConfigMap>, lp: &ListParams) -> Vec<String> {
    let mut v: Vec<String> = api
        .list(lp)
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|n| n != "kube-root-ca.crt")
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn create_sets_server_fields_and_duplicate_create_conflicts() {
    let (c, ns) = setup("create").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    let created = api
        .create(&PostParams::default(), &cm("a", &[]))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert!(
        meta.uid.as_deref().is_some_and(|u| u.len() == 36),
        "uid: {meta:?}"
    );
    assert!(meta.creation_timestamp.is_some());
    let rv: u64 = meta
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .expect("numeric resourceVersion");
    assert!(rv > 0);
    let got = api.get("a").await.unwrap();
    assert_eq!(got.metadata.uid, meta.uid);
    let err = api_error(
        api.create(&PostParams::default(), &cm("a", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));
    let err = api_error(api.get("missing").await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));
    // Re-creating a fetched object without clearing its resourceVersion fails like upstream.
    let mut refetched = got.clone();
    refetched.metadata.name = Some("copy".into());
    let err = api_error(
        api.create(&PostParams::default(), &refetched)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 500);
    assert!(
        err.message.contains("resourceVersion should not be set"),
        "{}",
        err.message
    );
    let mut gen_cm = cm("", &[]);
    gen_cm.metadata.name = None;
    gen_cm.metadata.generate_name = Some("gen-".into());
    let g1 = api.create(&PostParams::default(), &gen_cm).await.unwrap();
    let g2 = api.create(&PostParams::default(), &gen_cm).await.unwrap();
    let (n1, n2) = (g1.metadata.name.unwrap(), g2.metadata.name.unwrap());
    assert!(
        n1.starts_with("gen-") && n1.len() == 9 && n1 != n2,
        "{n1} {n2}"
    );
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn resource_versions_increase_across_kinds() {
    let (c, ns) = setup("rv").await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    let sas: Api<ServiceAccount> = Api::namespaced(c.client(), &ns);
    let a = cms
        .create(&PostParams::default(), &cm("a", &[]))
        .await
        .unwrap();
    let mut sa = ServiceAccount::default();
    sa.metadata.name = Some("s".into());
    let b = sas.create(&PostParams::default(), &sa).await.unwrap();
    let c2 = cms
        .create(&PostParams::default(), &cm("c", &[]))
        .await
        .unwrap();
    let rv = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| -> u64 {
        m.resource_version.as_deref().unwrap().parse().unwrap()
    };
    assert!(rv(&a.metadata) < rv(&b.metadata) && rv(&b.metadata) < rv(&c2.metadata));
    let list = cms.list(&ListParams::default()).await.unwrap();
    let list_rv: u64 = list.metadata.resource_version.unwrap().parse().unwrap();
    assert!(list_rv >= rv(&c2.metadata));
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn creating_in_a_missing_namespace_is_not_found() {
    let c = cluster::connect().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &unique("nope"));
    let err = api_error(
        api.create(&PostParams::default(), &cm("a", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));
    assert_eq!(
        err.details.as_ref().map(|d| d.kind.as_str()),
        Some("namespaces")
    );
}

#[tokio::test]
async fn label_selectors_support_every_operator() {
    let (c, ns) = setup("labels").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    for (name, labels) in [
        ("web", vec![("app", "web"), ("tier", "front")]),
        ("db", vec![("app", "db"), ("tier", "back")]),
        ("plain", vec![]),
    ] {
        api.create(&PostParams::default(), &cm(name, &labels))
            .await
            .unwrap();
    }
    let cases: &[(&str, &[&str])] = &[
        ("app=web", &["web"]),
        ("app==db", &["db"]),
        ("app!=web", &["db", "plain"]),
        ("app in (web,db)", &["db", "web"]),
        ("app notin (web)", &["db", "plain"]),
        ("tier", &["db", "web"]),
        ("!tier", &["plain"]),
        ("app=web,tier=back", &[]),
    ];
    for (sel, want) in cases {
        let got = names(&api, &ListParams::default().labels(sel)).await;
        assert_eq!(got, *want, "selector {sel}");
    }
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn field_selectors_filter_pods_and_reject_unknown_fields() {
    let (c, ns) = setup("fields").await;
    let api: Api<Pod> = Api::namespaced(c.client(), &ns);
    let node = unique("e2e-node");
    api.create(&PostParams::default(), &pod("on-node", Some(&node)))
        .await
        .unwrap();
    api.create(&PostParams::default(), &pod("unbound", None))
        .await
        .unwrap();
    let list = |sel: String| {
        let api = api.clone();
        async move {
            let mut v: Vec<String> = api
                .list(&ListParams::default().fields(&sel))
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect();
            v.sort();
            v
        }
    };
    assert_eq!(list(format!("spec.nodeName={node}")).await, vec!["on-node"]);
    assert_eq!(list("spec.nodeName=".into()).await, vec!["unbound"]);
    assert_eq!(list("metadata.name=unbound".into()).await, vec!["unbound"]);
    assert_eq!(
        list("status.phase=Pending,metadata.name!=unbound".into()).await,
        vec!["on-node"]
    );
    assert_eq!(list(format!("metadata.namespace={ns}")).await.len(), 2);
    let err = api_error(
        api.list(&ListParams::default().fields("spec.bogus=x"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn paginated_lists_use_the_first_page_snapshot() {
    let (c, ns) = setup("pages").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    for i in 0..7 {
        api.create(
            &PostParams::default(),
            &cm(&format!("cm{i}"), &[("page", "yes")]),
        )
        .await
        .unwrap();
    }
    let lp = ListParams::default().labels("page=yes").limit(3);
    let first = api.list(&lp).await.unwrap();
    assert_eq!(first.items.len(), 3);
    let token = first.metadata.continue_.clone().expect("continue token");
    let first_rv = first.metadata.resource_version.clone();
    // Changes after the first page must not leak into the next pages.
    api.delete("cm5", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &cm("cm9", &[("page", "yes")]))
        .await
        .unwrap();
    let mut all: Vec<String> = first
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    let mut next = Some(token);
    while let Some(tok) = next {
        let page = api.list(&lp.clone().continue_token(&tok)).await.unwrap();
        assert_eq!(
            page.metadata.resource_version, first_rv,
            "every page reports the snapshot RV"
        );
        all.extend(page.items.into_iter().filter_map(|c| c.metadata.name));
        next = page.metadata.continue_.filter(|t| !t.is_empty());
    }
    assert_eq!(all, (0..7).map(|i| format!("cm{i}")).collect::<Vec<_>>());
    let fresh = names(&api, &ListParams::default().labels("page=yes")).await;
    assert!(fresh.contains(&"cm9".to_string()) && !fresh.contains(&"cm5".to_string()));
    let err = api_error(
        api.list(&ListParams::default().continue_token("not-a-token"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn expired_continue_token_is_gone() {
    let Some(c) = cluster::connect_in_memory_only(
        Config {
            history_limit: 4,
            ..Config::for_tests()
        },
        "a tiny event history",
    )
    .await
    .unwrap() else {
        return;
    };
    let ns = c.temp_namespace("expired").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    for i in 0..4 {
        api.create(&PostParams::default(), &cm(&format!("cm{i}"), &[]))
            .await
            .unwrap();
    }
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    let token = first.metadata.continue_.unwrap();
    for i in 0..6 {
        api.create(&PostParams::default(), &cm(&format!("more{i}"), &[]))
            .await
            .unwrap();
    }
    let err = api_error(
        api.list(&ListParams::default().limit(2).continue_token(&token))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn cluster_wide_list_spans_namespaces() {
    let (c, ns1) = setup("wide-a").await;
    let ns2 = c.temp_namespace("wide-b").await.unwrap();
    for ns in [&ns1, &ns2] {
        let api: Api<ConfigMap> = Api::namespaced(c.client(), ns);
        api.create(&PostParams::default(), &cm("x", &[("wide", "yes")]))
            .await
            .unwrap();
    }
    let all: Api<ConfigMap> = Api::all(c.client());
    let mut found: Vec<String> = all
        .list(&ListParams::default().labels("wide=yes"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.namespace)
        .filter(|n| *n == ns1 || *n == ns2)
        .collect();
    found.sort();
    let mut want = vec![ns1.clone(), ns2.clone()];
    want.sort();
    assert_eq!(found, want);
    c.delete_namespace(&ns1).await;
    c.delete_namespace(&ns2).await;
}

#[tokio::test]
async fn update_with_a_stale_resource_version_conflicts() {
    let (c, ns) = setup("conflict").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    let v1 = api
        .create(&PostParams::default(), &cm("a", &[]))
        .await
        .unwrap();
    let mut first = v1.clone();
    first.data = Some(BTreeMap::from([("k".to_string(), "first".to_string())]));
    let v2 = api
        .replace("a", &PostParams::default(), &first)
        .await
        .unwrap();
    assert_ne!(v2.metadata.resource_version, v1.metadata.resource_version);
    let mut stale = v1.clone();
    stale.data = Some(BTreeMap::from([("k".to_string(), "stale".to_string())]));
    let err = api_error(
        api.replace("a", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    // Without a resourceVersion the update is unconditional for ConfigMaps.
    stale.metadata.resource_version = None;
    let v3 = api
        .replace("a", &PostParams::default(), &stale)
        .await
        .unwrap();
    assert_eq!(v3.data.unwrap()["k"], "stale");
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn merge_patch_sets_and_removes_fields() {
    let (c, ns) = setup("merge").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    api.create(&PostParams::default(), &cm("a", &[("x", "1")]))
        .await
        .unwrap();
    let p = json!({"metadata": {"labels": {"x": null, "y": "2"}}, "data": {"n": "new"}});
    let out = api
        .patch("a", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
    let labels = out.metadata.labels.unwrap();
    assert_eq!(labels.get("y").map(String::as_str), Some("2"));
    assert!(!labels.contains_key("x"));
    assert_eq!(out.data.unwrap().len(), 2);
    let err = api_error(
        api.patch("missing", &PatchParams::default(), &Patch::Merge(&p))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 404);
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn json_patch_applies_operations_and_a_failed_test_is_invalid() {
    let (c, ns) = setup("jsonpatch").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    api.create(&PostParams::default(), &cm("a", &[]))
        .await
        .unwrap();
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/data/added", "value": "yes"},
        {"op": "replace", "path": "/data/k", "value": "replaced"}
    ]))
    .unwrap();
    let out = api
        .patch("a", &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    let data = out.data.unwrap();
    assert_eq!(
        (data["added"].as_str(), data["k"].as_str()),
        ("yes", "replaced")
    );
    let failing: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/data/k", "value": "nope"}]))
            .unwrap();
    let err = api_error(
        api.patch("a", &PatchParams::default(), &Patch::<()>::Json(failing))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn strategic_merge_patch_merges_containers_by_name() {
    let (c, ns) = setup("smp").await;
    let api: Api<Pod> = Api::namespaced(c.client(), &ns);
    api.create(&PostParams::default(), &pod("p", None))
        .await
        .unwrap();
    let p = json!({"spec": {"containers": [{"name": "side", "image": "busybox:1.37"}]}});
    let out = api
        .patch("p", &PatchParams::default(), &Patch::Strategic(&p))
        .await
        .unwrap();
    let cs = out.spec.unwrap().containers;
    assert_eq!(cs.len(), 2, "merged by name, not replaced");
    assert_eq!(cs[0].image.as_deref(), Some("busybox:1.36"));
    assert_eq!(cs[0].env.as_ref().map(Vec::len), Some(1));
    assert_eq!(cs[1].image.as_deref(), Some("busybox:1.37"));
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn strategic_merge_patch_merges_status_conditions_by_type() {
    let (c, ns) = setup("conds").await;
    let api: Api<Pod> = Api::namespaced(c.client(), &ns);
    api.create(&PostParams::default(), &pod("p", Some(&unique("e2e-node"))))
        .await
        .unwrap();
    let first = json!({"status": {"phase": "Running", "conditions": [
        {"type": "Initialized", "status": "True"},
        {"type": "Ready", "status": "False"}
    ]}});
    api.patch_status("p", &PatchParams::default(), &Patch::Strategic(&first))
        .await
        .unwrap();
    let second = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    let out = api
        .patch_status("p", &PatchParams::default(), &Patch::Strategic(&second))
        .await
        .unwrap();
    let status = out.status.unwrap();
    let conds = status.conditions.unwrap();
    let get = |t: &str| {
        conds
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| c.status.clone())
    };
    assert_eq!(get("Ready").as_deref(), Some("True"));
    assert_eq!(
        get("Initialized").as_deref(),
        Some("True"),
        "other conditions survive"
    );
    assert_eq!(status.phase.as_deref(), Some("Running"));
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn status_subresource_isolates_spec_from_status() {
    let (c, ns) = setup("status").await;
    let api: Api<Pod> = Api::namespaced(c.client(), &ns);
    let created = api
        .create(&PostParams::default(), &pod("p", None))
        .await
        .unwrap();
    assert_eq!(
        created.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    // A main-resource update cannot change status.
    let mut main = created.clone();
    main.status.as_mut().unwrap().phase = Some("Running".into());
    main.metadata
        .labels
        .get_or_insert_default()
        .insert("touched".into(), "yes".into());
    let after_main = api
        .replace("p", &PostParams::default(), &main)
        .await
        .unwrap();
    assert_eq!(
        after_main.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    assert!(after_main.metadata.labels.unwrap().contains_key("touched"));
    // A status update cannot change spec.
    let mut st = api.get("p").await.unwrap();
    st.status.as_mut().unwrap().phase = Some("Running".into());
    st.spec.as_mut().unwrap().active_deadline_seconds = Some(99);
    let after_status = api
        .replace_status("p", &PostParams::default(), &st)
        .await
        .unwrap();
    assert_eq!(
        after_status
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref()),
        Some("Running")
    );
    assert_eq!(after_status.spec.unwrap().active_deadline_seconds, None);
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn deleting_a_bound_pod_is_graceful_until_grace_period_zero() {
    let (c, ns) = setup("grace").await;
    let api: Api<Pod> = Api::namespaced(c.client(), &ns);
    api.create(
        &PostParams::default(),
        &pod("bound", Some(&unique("e2e-node"))),
    )
    .await
    .unwrap();
    let res = api.delete("bound", &DeleteParams::default()).await.unwrap();
    let terminating = res.left().expect("a graceful delete returns the pod");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(30));
    let still = api.get("bound").await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_some());
    // What the node agent does once the containers are gone.
    api.delete("bound", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(api.get_opt("bound").await.unwrap().is_none());
    // An unbound pod goes at once.
    api.create(&PostParams::default(), &pod("unbound", None))
        .await
        .unwrap();
    api.delete("unbound", &DeleteParams::default())
        .await
        .unwrap();
    assert!(api.get_opt("unbound").await.unwrap().is_none());
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn delete_preconditions_that_do_not_match_conflict() {
    let (c, ns) = setup("precond").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    let created = api
        .create(&PostParams::default(), &cm("a", &[]))
        .await
        .unwrap();
    let wrong_uid = DeleteParams::default().preconditions(Preconditions {
        uid: Some("00000000-0000-0000-0000-000000000000".into()),
        resource_version: None,
    });
    let err = api_error(api.delete("a", &wrong_uid).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    let wrong_rv = DeleteParams::default().preconditions(Preconditions {
        uid: None,
        resource_version: Some("1".into()),
    });
    assert_eq!(
        api_error(api.delete("a", &wrong_rv).await.unwrap_err()).code,
        409
    );
    let right = DeleteParams::default().preconditions(Preconditions {
        uid: created.metadata.uid.clone(),
        resource_version: created.metadata.resource_version.clone(),
    });
    let status = api
        .delete("a", &right)
        .await
        .unwrap()
        .right()
        .expect("ConfigMap deletion answers a Status");
    assert_eq!(status.details.map(|d| d.name), Some("a".to_string()));
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn finalizers_keep_an_object_until_they_are_removed() {
    let (c, ns) = setup("finalizers").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    let mut obj = cm("held", &[]);
    obj.metadata.finalizers = Some(vec!["e2e.kubeedge-rs/hold".into()]);
    api.create(&PostParams::default(), &obj).await.unwrap();
    let res = api.delete("held", &DeleteParams::default()).await.unwrap();
    assert!(
        res.left()
            .expect("object still present")
            .metadata
            .deletion_timestamp
            .is_some()
    );
    assert!(api.get_opt("held").await.unwrap().is_some());
    let p = json!({"metadata": {"finalizers": null}});
    api.patch("held", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
    assert!(api.get_opt("held").await.unwrap().is_none());
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn watch_from_a_resource_version_sees_later_events_in_order() {
    let (c, ns) = setup("watchrv").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    let before = api
        .create(&PostParams::default(), &cm("before", &[]))
        .await
        .unwrap();
    let rv = before.metadata.resource_version.clone().unwrap();
    api.create(&PostParams::default(), &cm("after", &[]))
        .await
        .unwrap();
    let p = json!({"data": {"k": "changed"}});
    api.patch("after", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
    api.delete("after", &DeleteParams::default()).await.unwrap();
    let wp = WatchParams::default().timeout(10);
    let mut stream = api.watch(&wp, &rv).await.unwrap().boxed();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen.len() < 3 {
        let ev = tokio::time::timeout_at(deadline, stream.try_next())
            .await
            .unwrap_or_else(|_| panic!("three events within {WAIT:?}, saw {seen:?}"))
            .unwrap()
            .expect("stream open");
        let (what, o) = match ev {
            WatchEvent::Added(o) => ("ADDED", o),
            WatchEvent::Modified(o) => ("MODIFIED", o),
            WatchEvent::Deleted(o) => ("DELETED", o),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("watch error {e:?}"),
        };
        // A real cluster's own (kube-root-ca.crt) may come in between.
        let name = o.metadata.name.unwrap_or_default();
        if ["before", "after"].contains(&name.as_str()) {
            seen.push(format!("{what} {name}"));
        }
    }
    assert_eq!(seen, vec!["ADDED after", "MODIFIED after", "DELETED after"]);
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn watch_with_bookmarks_reports_the_current_resource_version() {
    let (c, ns) = setup("bookmark").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    let last = api
        .create(&PostParams::default(), &cm("a", &[]))
        .await
        .unwrap();
    let last_rv: u64 = last.metadata.resource_version.unwrap().parse().unwrap();
    // Periodic bookmarks come about once a minute, but the watch cache also sends one 2 s
    // before a watch's timeout (`cacheWatcher.nextBookmarkTime`), so the client resumes where
    // the stream ended: with a 5 s timeout, about 3 s in, on any server.
    let wp = WatchParams::default().timeout(5);
    let mut stream = api.watch(&wp, &last_rv.to_string()).await.unwrap().boxed();
    let mut bookmark = None;
    let deadline = tokio::time::Instant::now() + WAIT;
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, stream.try_next())
        .await
        .expect("the stream ends in time")
    {
        if let WatchEvent::Bookmark(b) = ev {
            bookmark = Some(b.metadata.resource_version.parse::<u64>().unwrap());
            break;
        }
    }
    let rv = bookmark.expect("a BOOKMARK event");
    assert!(rv >= last_rv, "bookmark {rv} < {last_rv}");
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn watch_list_streams_initial_state_then_an_initial_events_end_bookmark() {
    let (c, ns) = setup("watchlist").await;
    if let Some(why) = streaming_lists_unsupported(&c, &ns).await {
        println!("SKIPPED: this server does not serve streaming lists: {why}");
        c.delete_namespace(&ns).await;
        return;
    }
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    for n in ["a", "b"] {
        api.create(&PostParams::default(), &cm(n, &[("wl", "1")]))
            .await
            .unwrap();
    }
    let wp = WatchParams::streaming_lists().labels("wl=1").timeout(10);
    let mut stream = api.watch(&wp, "").await.unwrap().boxed();
    let mut added = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, stream.try_next())
            .await
            .unwrap_or_else(|_| panic!("no initial-events-end bookmark within {WAIT:?}"))
            .unwrap()
            .expect("open")
        {
            WatchEvent::Added(o) => added.push(o.metadata.name.unwrap()),
            WatchEvent::Bookmark(b) => {
                assert_eq!(
                    b.metadata
                        .annotations
                        .get("k8s.io/initial-events-end")
                        .map(String::as_str),
                    Some("true")
                );
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    added.sort();
    assert_eq!(added, vec!["a", "b"]);
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn an_object_leaving_a_watched_selector_is_deleted_for_that_watch() {
    let (c, ns) = setup("leave").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    let created = api
        .create(&PostParams::default(), &cm("a", &[("sel", "in")]))
        .await
        .unwrap();
    let rv = created.metadata.resource_version.unwrap();
    let mut stream = api
        .watch(&WatchParams::default().labels("sel=in").timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    let p = json!({"metadata": {"labels": {"sel": "out"}}});
    let patched = api
        .patch("a", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, stream.try_next())
            .await
            .unwrap_or_else(|_| panic!("no DELETED within {WAIT:?}"))
            .unwrap()
            .expect("open")
        {
            WatchEvent::Deleted(o) => {
                assert_eq!(
                    o.metadata.resource_version,
                    patched.metadata.resource_version
                );
                break;
            }
            WatchEvent::Bookmark(_) => continue,
            other => panic!("expected DELETED, got {other:?}"),
        }
    }
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_gets_a_410_error_event() {
    let (c, ns) = {
        let c = cluster::connect_with(Config {
            history_limit: 5,
            ..Config::for_tests()
        })
        .await
        .unwrap();
        let ns = c.temp_namespace("gone").await.unwrap();
        (c, ns)
    };
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    for i in 0..10 {
        api.create(&PostParams::default(), &cm(&format!("cm{i}"), &[]))
            .await
            .unwrap();
    }
    // Resource version 1 is older than any retained history (here and on a real cluster).
    let mut stream = api
        .watch(&WatchParams::default().timeout(10), "1")
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(WAIT, stream.try_next())
        .await
        .expect("event in time")
        .unwrap()
    {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            assert!(
                status.message.contains("too old resource version"),
                "{}",
                status.message
            );
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    c.delete_namespace(&ns).await;
}

async fn wait_init_done<S>(stream: &mut S) -> Vec<String>
where
    S: futures::Stream<Item = Result<watcher::Event<ConfigMap>, watcher::Error>> + Unpin,
{
    let mut names = Vec::new();
    let mut errors = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        // A watcher retries failures at once: the deadline bounds the whole wait.
        let ev = tokio::time::timeout_at(deadline, stream.next())
            .await
            .unwrap_or_else(|_| panic!("watcher not listed within {WAIT:?}; errors: {errors:?}"))
            .expect("watcher open");
        match ev {
            Ok(watcher::Event::Init) => names.clear(),
            Ok(watcher::Event::InitApply(o)) => names.extend(o.metadata.name),
            Ok(watcher::Event::InitDone) => return names,
            Ok(_) => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
}

/// Why this server cannot serve streaming lists, if it cannot: a raw watch with
/// `sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true` must
/// deliver the `k8s.io/initial-events-end` bookmark within [`WAIT`]. Servers without the
/// feature refuse the request, answer with an ERROR event (an apiserver on etcd 3.4:
/// "RequestWatchProgress is disabled"), or never send that bookmark.
async fn streaming_lists_unsupported(c: &TestCluster, ns: &str) -> Option<String> {
    let req = http::Request::get(format!(
        "/api/v1/namespaces/{ns}/configmaps?watch=1&sendInitialEvents=true\
         &resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=30"
    ))
    .body(Vec::new())
    .expect("request");
    let client = c.client();
    let probe = async {
        let events = match client.request_events::<ConfigMap>(req).await {
            Ok(s) => s,
            Err(e) => return Some(format!("it refused the request: {e}")),
        };
        let mut events = std::pin::pin!(events);
        loop {
            match events.try_next().await {
                Ok(Some(WatchEvent::Bookmark(b)))
                    if b.metadata
                        .annotations
                        .get("k8s.io/initial-events-end")
                        .is_some_and(|v| v == "true") =>
                {
                    return None;
                }
                Ok(Some(WatchEvent::Error(e))) => {
                    return Some(format!(
                        "it sent an ERROR event: {} ({})",
                        e.message, e.code
                    ));
                }
                Ok(Some(_)) => {}
                Ok(None) => return Some("the watch ended without initial-events-end".into()),
                Err(e) => return Some(format!("the watch failed: {e}")),
            }
        }
    };
    tokio::time::timeout(WAIT, probe)
        .await
        .unwrap_or_else(|_| Some(format!("no initial-events-end bookmark within {WAIT:?}")))
}

#[tokio::test]
async fn kube_watcher_relists_after_410_without_losing_objects() {
    let Some(c) = cluster::connect_in_memory_only(
        Config::for_tests(),
        "pausing watches and compacting history",
    )
    .await
    .unwrap() else {
        return;
    };
    let srv = c.in_memory().expect("in-memory server");
    let ns = c.temp_namespace("relist").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    api.create(&PostParams::default(), &cm("first", &[]))
        .await
        .unwrap();
    let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
    let initial = wait_init_done(&mut stream).await;
    assert!(initial.contains(&"first".to_string()));
    let pause = srv.pause_watches();
    // Created while the watcher cannot see it, then the history that would replay it is gone.
    api.create(&PostParams::default(), &cm("meanwhile", &[]))
        .await
        .unwrap();
    srv.compact_history();
    drop(pause);
    let relisted = wait_init_done(&mut stream).await;
    assert!(
        relisted.contains(&"meanwhile".to_string()),
        "relist after 410 must include the missed object: {relisted:?}"
    );
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn kube_watcher_with_streaming_lists_sees_existing_and_new_objects() {
    let (c, ns) = setup("streamlist").await;
    // Without the feature kube's watcher would retry forever: probe first.
    if let Some(why) = streaming_lists_unsupported(&c, &ns).await {
        println!("SKIPPED: this server does not serve streaming lists: {why}");
        c.delete_namespace(&ns).await;
        return;
    }
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    api.create(&PostParams::default(), &cm("old", &[]))
        .await
        .unwrap();
    let mut stream = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let initial = wait_init_done(&mut stream).await;
    assert!(initial.contains(&"old".to_string()), "{initial:?}");
    api.create(&PostParams::default(), &cm("new", &[]))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, stream.next())
            .await
            .unwrap_or_else(|_| panic!("\"new\" not seen within {WAIT:?}"))
            .expect("open")
        {
            Ok(watcher::Event::Apply(o)) if o.metadata.name.as_deref() == Some("new") => break,
            _ => {}
        }
    }
    c.delete_namespace(&ns).await;
}

fn objectsync_crd(scope: &str, plural: &str, kind: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.reliablesyncs.kubeedge.io")},
        "spec": {
            "group": "reliablesyncs.kubeedge.io",
            "names": {"kind": kind, "listKind": format!("{kind}List"), "plural": plural, "singular": kind.to_lowercase()},
            "scope": scope,
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .expect("crd")
}

async fn wait_established(api: &Api<CustomResourceDefinition>, name: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let crd = api.get(name).await.unwrap();
        let ok = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if ok {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "CRD {name} not established"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn custom_resources_are_served_after_their_crd_with_a_status_subresource() {
    let Some(c) = cluster::connect_installing_crds(
        Config::for_tests(),
        "serving custom resources after their CRD",
    )
    .await
    .unwrap() else {
        return;
    };
    let ns = c.temp_namespace("crd").await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(c.client());
    for (scope, plural, kind) in [
        ("Namespaced", "objectsyncs", "ObjectSync"),
        ("Cluster", "clusterobjectsyncs", "ClusterObjectSync"),
    ] {
        crds.create(&PostParams::default(), &objectsync_crd(scope, plural, kind))
            .await
            .unwrap();
        wait_established(&crds, &format!("{plural}.reliablesyncs.kubeedge.io")).await;
    }
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("reliablesyncs.kubeedge.io", "v1alpha1", "ObjectSync"),
        "objectsyncs",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(c.client(), &ns, &ar);
    let mut obj = DynamicObject::new("node-a.cm", &ar);
    obj.data = json!({"spec": {"objectAPIVersion": "v1", "objectKind": "ConfigMap", "objectName": "cm"}, "status": {"objectResourceVersion": "ignored"}});
    let created = api.create(&PostParams::default(), &obj).await.unwrap();
    assert!(
        created.data.get("status").is_none(),
        "status is dropped on create with a status subresource"
    );
    assert_eq!(created.metadata.generation, Some(1));
    // Status through the subresource only.
    let sp = json!({"status": {"objectResourceVersion": "42"}, "spec": {"objectName": "sneaky"}});
    let st = api
        .patch_status("node-a.cm", &PatchParams::default(), &Patch::Merge(&sp))
        .await
        .unwrap();
    assert_eq!(st.data["status"]["objectResourceVersion"], "42");
    assert_eq!(st.data["spec"]["objectName"], "cm");
    assert_eq!(
        st.metadata.generation,
        Some(1),
        "status writes do not bump generation"
    );
    // Spec changes bump generation; main-resource writes keep status.
    let mp = json!({"spec": {"objectName": "cm2"}, "status": {"objectResourceVersion": "0"}});
    let main = api
        .patch("node-a.cm", &PatchParams::default(), &Patch::Merge(&mp))
        .await
        .unwrap();
    assert_eq!(main.metadata.generation, Some(2));
    assert_eq!(main.data["status"]["objectResourceVersion"], "42");
    let err = api_error(
        api.patch("node-a.cm", &PatchParams::default(), &Patch::Strategic(&mp))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 415);
    // PUT without resourceVersion is refused for custom resources.
    let mut unconditional = main.clone();
    unconditional.metadata.resource_version = None;
    let err = api_error(
        api.replace("node-a.cm", &PostParams::default(), &unconditional)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    // Cluster-scoped kind.
    let car = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("reliablesyncs.kubeedge.io", "v1alpha1", "ClusterObjectSync"),
        "clusterobjectsyncs",
    );
    let capi: Api<DynamicObject> = Api::all_with(c.client(), &car);
    capi.create(
        &PostParams::default(),
        &DynamicObject::new("node-a.ns", &car),
    )
    .await
    .unwrap();
    assert_eq!(
        capi.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    api.delete("node-a.cm", &DeleteParams::default())
        .await
        .unwrap();
    assert!(api.get_opt("node-a.cm").await.unwrap().is_none());
    // Deleting the CRD removes its objects and stops serving the resource.
    crds.delete(
        "clusterobjectsyncs.reliablesyncs.kubeedge.io",
        &DeleteParams::default(),
    )
    .await
    .unwrap();
    let err = api_error(capi.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(err.code, 404);
}

#[tokio::test]
async fn token_request_returns_a_token_that_authenticates() {
    let (c, ns) = setup("token").await;
    let sas: Api<ServiceAccount> = Api::namespaced(c.client(), &ns);
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let tr = sas
        .create_token_request("default", &PostParams::default(), &req)
        .await
        .unwrap();
    let status = tr.status.expect("status");
    let token = status.token.expect("token");
    assert_eq!(token.split('.').count(), 3, "a JWT");
    let exp = status.expiration_timestamp.expect("expirationTimestamp").0;
    let now = k8s_openapi::jiff::Timestamp::now();
    let secs = exp.duration_since(now).as_secs();
    assert!((3500..=3700).contains(&secs), "expires in {secs}s");
    let short = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(60),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        api_error(
            sas.create_token_request("default", &PostParams::default(), &short)
                .await
                .unwrap_err()
        )
        .code,
        422
    );
    assert_eq!(
        api_error(
            sas.create_token_request("nobody", &PostParams::default(), &req)
                .await
                .unwrap_err()
        )
        .code,
        404
    );
    // The token authenticates (the real cluster may then deny authorization, never 401).
    let mut cfg = c.kube_config();
    cfg.auth_info = serde_json::from_value(json!({"token": token})).unwrap();
    let as_sa = Client::try_from(cfg).unwrap();
    let v = as_sa.apiserver_version().await.unwrap();
    assert_eq!(v.major, "1");
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn wrong_or_missing_token_is_unauthorized() {
    let c = cluster::connect().await.unwrap();
    let mut cfg = c.kube_config();
    cfg.auth_info = serde_json::from_value(json!({"token": "not-a-valid-token"})).unwrap();
    let bad = Client::try_from(cfg).unwrap();
    let api: Api<Namespace> = Api::all(bad);
    let err = api_error(api.list(&ListParams::default()).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (401, "Unauthorized"));
    if c.in_memory().is_some() {
        let mut cfg = c.kube_config();
        cfg.auth_info = Default::default();
        let anon: Api<Namespace> = Api::all(Client::try_from(cfg).unwrap());
        assert_eq!(
            api_error(anon.list(&ListParams::default()).await.unwrap_err()).code,
            401
        );
    }
}

#[tokio::test]
async fn malformed_and_invalid_bodies_get_status_errors() {
    let (c, ns) = setup("badbody").await;
    let client = c.client();
    let url = format!("/api/v1/namespaces/{ns}/configmaps");
    let req = http::Request::post(&url)
        .header("content-type", "application/json")
        .body(b"{\"metadata\": ".to_vec())
        .unwrap();
    let err = api_error(client.request::<Value>(req).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (400, "BadRequest"));
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let err = api_error(
        api.create(&PostParams::default(), &cm("Bad_Name", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    let causes = err.details.expect("details").causes;
    assert_eq!(
        causes.first().map(|c| c.field.as_str()),
        Some("metadata.name")
    );
    let mut nameless = cm("x", &[]);
    nameless.metadata.name = None;
    assert_eq!(
        api_error(
            api.create(&PostParams::default(), &nameless)
                .await
                .unwrap_err()
        )
        .code,
        422
    );
    let mut elsewhere = cm("x", &[]);
    elsewhere.metadata.namespace = Some("some-other-namespace".into());
    let err = api_error(
        api.create(&PostParams::default(), &elsewhere)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        err.code, 400,
        "namespace mismatch is a BadRequest on the real apiserver"
    );
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let empty: Pod =
        serde_json::from_value(json!({"metadata": {"name": "empty"}, "spec": {"containers": []}}))
            .unwrap();
    assert_eq!(
        api_error(
            pods.create(&PostParams::default(), &empty)
                .await
                .unwrap_err()
        )
        .code,
        422
    );
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn deleting_a_namespace_removes_its_contents() {
    let (c, ns) = setup("nsdel").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    api.create(&PostParams::default(), &cm("a", &[]))
        .await
        .unwrap();
    let nss: Api<Namespace> = Api::all(c.client());
    let res = nss.delete(&ns, &DeleteParams::default()).await.unwrap();
    let terminating = res.left().expect("namespace returned while terminating");
    assert_eq!(
        terminating.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating")
    );
    let err = api_error(
        api.create(&PostParams::default(), &cm("late", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 403, "no new content in a terminating namespace");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while nss.get_opt(&ns).await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "namespace not removed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(api.get_opt("a").await.unwrap().is_none());
}

#[tokio::test]
async fn node_lifecycle_marks_ready_unknown_after_the_lease_expires() {
    let Some(c) =
        cluster::connect_in_memory_only(Config::for_tests(), "a 2 s node-monitor grace period")
            .await
            .unwrap()
    else {
        return;
    };
    let nodes: Api<Node> = Api::all(c.client());
    let leases: Api<Lease> = Api::namespaced(c.client(), "kube-node-lease");
    let name = unique("edge");
    let now = || k8s_openapi::jiff::Timestamp::now().to_string();
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"node-role.kubernetes.io/edge": ""}},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now(), "lastTransitionTime": now()}]}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now()}})).unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let ready = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready").cloned())
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    let unknown = loop {
        let n = nodes.get(&name).await.unwrap();
        if let Some(r) = ready(&n).filter(|r| r.status == "Unknown") {
            break (r, n);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node never marked Unknown"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(unknown.0.reason.as_deref(), Some("NodeStatusUnknown"));
    let taints = unknown.1.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        taints
            .iter()
            .any(|t| t.key == "node.kubernetes.io/unreachable" && t.effect == "NoExecute"),
        "{taints:?}"
    );
    // The kubelet comes back: renews its lease and reports Ready; that must stick.
    let p = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now(), "lastTransitionTime": now()}]}});
    nodes
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&p))
        .await
        .unwrap();
    for _ in 0..15 {
        let lp = json!({"spec": {"renewTime": now()}});
        leases
            .patch(&name, &PatchParams::default(), &Patch::Merge(&lp))
            .await
            .unwrap();
        let n = nodes.get(&name).await.unwrap();
        assert_eq!(
            ready(&n).map(|r| r.status).as_deref(),
            Some("True"),
            "kubelet-reported Ready must stay"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let n = nodes.get(&name).await.unwrap();
    let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        !taints
            .iter()
            .any(|t| t.key == "node.kubernetes.io/unreachable"),
        "unreachable taint removed: {taints:?}"
    );
}

// kubectl

async fn kubectl_ok(c: &TestCluster, ns: &str, args: &[&str]) -> e2e::cluster::KubectlOutput {
    let mut full = vec!["-n", ns];
    full.extend_from_slice(args);
    let out = c.kubectl_run(&full, None).await.unwrap();
    assert!(out.success, "kubectl {full:?}: {out:?}");
    out
}

fn kubectl_yaml(ns: &str) -> String {
    format!(
        "apiVersion: v1
kind: ConfigMap
metadata:
  name: app-config
  namespace: {ns}
data:
  mode: one
---
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: {ns}
  labels: {{app: web}}
spec:
  schedulerName: {UNSCHEDULED}
  containers:
  - name: main
    image: busybox:1.36
    command: [sleep, '3600']
"
    )
}

#[tokio::test]
async fn kubectl_apply_get_describe_and_delete() {
    let (c, ns) = setup("kubectl").await;
    let out = c
        .kubectl_run(&["apply", "-f", "-"], Some(&kubectl_yaml(&ns)))
        .await
        .unwrap();
    assert!(out.success, "{out:?}");
    assert!(
        out.stdout.contains("configmap/app-config created")
            && out.stdout.contains("pod/web created"),
        "{}",
        out.stdout
    );
    let again = c
        .kubectl_run(&["apply", "-f", "-"], Some(&kubectl_yaml(&ns)))
        .await
        .unwrap();
    assert!(
        again.stdout.contains("configmap/app-config unchanged"),
        "{again:?}"
    );
    let changed = kubectl_yaml(&ns).replace("mode: one", "mode: two");
    let out = c
        .kubectl_run(&["apply", "-f", "-"], Some(&changed))
        .await
        .unwrap();
    assert!(
        out.stdout.contains("configmap/app-config configured"),
        "{out:?}"
    );
    let out = c
        .kubectl_run(
            &["-n", &ns, "get", "configmap", "app-config", "-o", "json"],
            None,
        )
        .await
        .unwrap();
    let v: Value = serde_json::from_str(&out.stdout).expect("kubectl -o json");
    assert_eq!(v["data"]["mode"], "two");
    let out = c
        .kubectl_run(&["-n", &ns, "get", "pods"], None)
        .await
        .unwrap();
    assert!(
        out.success
            && out.stdout.contains("NAME")
            && out.stdout.contains("STATUS")
            && out.stdout.contains("web"),
        "{out:?}"
    );
    assert!(
        out.stdout.contains("Pending"),
        "server-side table shows the phase: {}",
        out.stdout
    );
    let out = c
        .kubectl_run(&["-n", &ns, "get", "po,cm", "-o", "name"], None)
        .await
        .unwrap();
    assert!(
        out.stdout.contains("pod/web") && out.stdout.contains("configmap/app-config"),
        "{out:?}"
    );
    let out = c
        .kubectl_run(&["-n", &ns, "describe", "pod", "web"], None)
        .await
        .unwrap();
    assert!(
        out.success && out.stdout.contains("Image:") && out.stdout.contains("busybox:1.36"),
        "{out:?}"
    );
    let out = c
        .kubectl_run(&["-n", &ns, "delete", "configmap", "app-config"], None)
        .await
        .unwrap();
    assert!(out.success, "{out:?}");
    let out = c
        .kubectl_run(&["-n", &ns, "get", "configmap", "app-config"], None)
        .await
        .unwrap();
    assert!(!out.success && out.stderr.contains("NotFound"), "{out:?}");
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn kubectl_patch_supports_merge_strategic_and_json() {
    let (c, ns) = setup("kpatch").await;
    let out = c
        .kubectl_run(&["apply", "-f", "-"], Some(&kubectl_yaml(&ns)))
        .await
        .unwrap();
    assert!(out.success, "{out:?}");
    kubectl_ok(
        &c,
        &ns,
        &[
            "patch",
            "configmap",
            "app-config",
            "--type",
            "merge",
            "-p",
            r#"{"data":{"extra":"x"}}"#,
        ],
    )
    .await;
    kubectl_ok(
        &c,
        &ns,
        &[
            "patch",
            "configmap",
            "app-config",
            "--type",
            "json",
            "-p",
            r#"[{"op":"remove","path":"/data/mode"}]"#,
        ],
    )
    .await;
    kubectl_ok(
        &c,
        &ns,
        &[
            "patch",
            "pod",
            "web",
            "--type",
            "strategic",
            "-p",
            r#"{"spec":{"containers":[{"name":"main","image":"busybox:1.37"}]}}"#,
        ],
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    let data = cms.get("app-config").await.unwrap().data.unwrap();
    assert_eq!(data.len(), 1);
    assert_eq!(data["extra"], "x");
    let pods: Api<Pod> = Api::namespaced(c.client(), &ns);
    let spec = pods.get("web").await.unwrap().spec.unwrap();
    assert_eq!(spec.containers.len(), 1);
    assert_eq!(spec.containers[0].image.as_deref(), Some("busybox:1.37"));
    assert_eq!(
        spec.containers[0].command.as_ref().map(Vec::len),
        Some(2),
        "strategic merge kept the command"
    );
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn kubectl_label_annotate_and_create_configmap() {
    let (c, ns) = setup("klabel").await;
    let out = c
        .kubectl_run(
            &[
                "-n",
                &ns,
                "create",
                "configmap",
                "made",
                "--from-literal=a=b",
            ],
            None,
        )
        .await
        .unwrap();
    assert!(out.success, "{out:?}");
    for args in [
        ["label", "configmap", "made", "team=edge"],
        ["annotate", "configmap", "made", "note=hello"],
    ] {
        let mut full = vec!["-n", ns.as_str()];
        full.extend(args);
        let out = c.kubectl_run(&full, None).await.unwrap();
        assert!(out.success, "{out:?}");
    }
    let out = c
        .kubectl_run(
            &[
                "-n",
                &ns,
                "get",
                "configmaps",
                "-l",
                "team=edge",
                "-o",
                "name",
            ],
            None,
        )
        .await
        .unwrap();
    assert_eq!(out.stdout.trim(), "configmap/made");
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    let got = cms.get("made").await.unwrap();
    assert_eq!(got.data.unwrap()["a"], "b");
    assert_eq!(got.metadata.annotations.unwrap()["note"], "hello");
    let out = c
        .kubectl_run(
            &["-n", &ns, "create", "token", "default", "--duration=1h"],
            None,
        )
        .await
        .unwrap();
    assert!(
        out.success && out.stdout.trim().split('.').count() == 3,
        "{out:?}"
    );
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn kubectl_get_watch_streams_changes() {
    let (c, ns) = setup("kwatch").await;
    use tokio::io::AsyncBufReadExt;
    let mut child = c
        .kubectl()
        .args([
            "-n",
            &ns,
            "get",
            "configmaps",
            "--watch",
            "--output-watch-events",
            "-l",
            "w=1",
        ])
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    // Give kubectl time to establish its watch; events after that are streamed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    api.create(&PostParams::default(), &cm("watched", &[("w", "1")]))
        .await
        .unwrap();
    let p = json!({"data": {"k": "v2"}});
    api.patch("watched", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
    api.delete("watched", &DeleteParams::default())
        .await
        .unwrap();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !seen.iter().any(|l: &String| l.starts_with("DELETED")) {
        let line = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("no DELETED line within {WAIT:?}: {seen:?}"))
            .unwrap()
            .expect("kubectl still running");
        if line.contains("watched") {
            seen.push(line);
        }
    }
    let _ = child.kill().await;
    let kinds: Vec<&str> = seen
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(kinds, vec!["ADDED", "MODIFIED", "DELETED"], "{seen:?}");
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn kubectl_wait_for_condition_and_for_delete() {
    let (c, ns) = setup("kwait").await;
    let pods: Api<Pod> = Api::namespaced(c.client(), &ns);
    pods.create(&PostParams::default(), &pod("w", Some(&unique("e2e-node"))))
        .await
        .unwrap();
    let waiter = {
        let mut cmd = c.kubectl();
        cmd.args([
            "-n",
            &ns,
            "wait",
            "--for=condition=Ready",
            "pod/w",
            "--timeout=30s",
        ]);
        cmd.spawn().unwrap()
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let p = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status("w", &PatchParams::default(), &Patch::Strategic(&p))
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(40), waiter.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("condition met"));
    let out = c
        .kubectl_run(&["-n", &ns, "delete", "pod", "w", "--wait=false"], None)
        .await
        .unwrap();
    assert!(out.success, "{out:?}");
    let waiter = {
        let mut cmd = c.kubectl();
        cmd.args(["-n", &ns, "wait", "--for=delete", "pod/w", "--timeout=30s"]);
        cmd.spawn().unwrap()
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    pods.delete("w", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(40), waiter.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn kubectl_server_side_apply_creates_then_updates() {
    let (c, ns) = setup("ssa").await;
    let yaml = |mode: &str, extra: bool| {
        let extra = if extra { "\n  extra: here" } else { "" };
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  namespace: {ns}\ndata:\n  mode: {mode}{extra}\n"
        )
    };
    let out = c
        .kubectl_run(
            &["apply", "--server-side", "-f", "-"],
            Some(&yaml("one", true)),
        )
        .await
        .unwrap();
    assert!(
        out.success && out.stdout.contains("serverside-applied"),
        "{out:?}"
    );
    let out = c
        .kubectl_run(
            &["apply", "--server-side", "-f", "-"],
            Some(&yaml("two", false)),
        )
        .await
        .unwrap();
    assert!(out.success, "{out:?}");
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    let data = cms.get("ssa").await.unwrap().data.unwrap();
    assert_eq!(data.get("mode").map(String::as_str), Some("two"));
    assert!(
        !data.contains_key("extra"),
        "a field the manager stopped applying is removed: {data:?}"
    );
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn kubectl_discovers_short_names_and_versions() {
    let c = cluster::connect().await.unwrap();
    let out = c.kubectl_run(&["api-resources"], None).await.unwrap();
    assert!(out.success, "{out:?}");
    for (res, short) in [
        ("pods", "po"),
        ("configmaps", "cm"),
        ("nodes", "no"),
        ("services", "svc"),
        ("namespaces", "ns"),
    ] {
        let line = out
            .stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(res))
            .unwrap_or_default();
        assert!(
            line.split_whitespace()
                .any(|w| w.split(',').any(|s| s == short)),
            "{res} lacks {short}: {line:?}"
        );
    }
    assert!(out.stdout.contains("coordination.k8s.io/v1"));
    let out = c
        .kubectl_run(&["get", "--raw", "/version"], None)
        .await
        .unwrap();
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["major"], "1");
}

#[tokio::test]
async fn service_endpoints_follow_ready_pods() {
    use k8s_openapi::api::core::v1::{Endpoints, Service};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let (c, ns) = setup("endpoints").await;
    let svcs: Api<Service> = Api::namespaced(c.client(), &ns);
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    }))
    .unwrap();
    svcs.create(&PostParams::default(), &svc).await.unwrap();
    // The EndpointSlice controller leaves out pods whose node does not exist.
    let node_name = unique("e2e-node");
    let nodes: Api<Node> = Api::all(c.client());
    let node: Node = serde_json::from_value(
        json!({"metadata": {"name": node_name, "labels": {"e2e.kubeedge-rs/test": "true"}}}),
    )
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(c.client(), &ns);
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web-1", "labels": {"app": "web"}},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "busybox:1.36", "ports": [{"name": "http", "containerPort": 8080}]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    let status = json!({"status": {"phase": "Running", "podIP": "10.88.0.7", "podIPs": [{"ip": "10.88.0.7"}],
        "conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status("web-1", &PatchParams::default(), &Patch::Strategic(&status))
        .await
        .unwrap();
    let eps: Api<Endpoints> = Api::namespaced(c.client(), &ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let subset = loop {
        if let Some(s) = eps
            .get_opt("web")
            .await
            .unwrap()
            .and_then(|e| e.subsets)
            .and_then(|s| s.into_iter().next())
            && s.addresses.as_ref().is_some_and(|a| !a.is_empty())
        {
            break s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "endpoints never listed the ready pod"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let addr = &subset.addresses.unwrap()[0];
    assert_eq!(addr.ip, "10.88.0.7");
    assert_eq!(
        addr.target_ref.as_ref().and_then(|t| t.name.as_deref()),
        Some("web-1")
    );
    assert_eq!(
        subset.ports.unwrap()[0].port,
        8080,
        "named targetPort resolved"
    );
    let slices: Api<EndpointSlice> = Api::namespaced(c.client(), &ns);
    let lp = ListParams::default().labels("kubernetes.io/service-name=web");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let items = slices.list(&lp).await.unwrap().items;
        let ready = items
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .any(|e| {
                e.addresses.contains(&"10.88.0.7".to_string())
                    && e.conditions.as_ref().and_then(|c| c.ready) == Some(true)
            });
        if ready {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ready endpoint in the slices: {items:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.delete_namespace(&ns).await;
    nodes
        .delete(&node_name, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn pods_bound_to_a_missing_node_are_garbage_collected() {
    let config = Config {
        pod_gc_orphan_quarantine: Duration::from_secs(1),
        ..Config::for_tests()
    };
    let Some(c) =
        cluster::connect_in_memory_only(config, "a 1 s pod-GC quarantine (40 s upstream)")
            .await
            .unwrap()
    else {
        return;
    };
    let ns = c.temp_namespace("podgc").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(c.client(), &ns);
    pods.create(
        &PostParams::default(),
        &pod("orphan", Some(&unique("gone-node"))),
    )
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while pods.get_opt("orphan").await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "orphaned pod was not collected"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn custom_resources_are_pruned_defaulted_and_validated_by_their_schema() {
    let (c, ns) = setup("crdschema").await;
    let group = format!("{}.e2e.kubeedge-rs.io", unique("g"));
    let crds: Api<CustomResourceDefinition> = Api::all(c.client());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {"type": "object", "required": ["size"], "properties": {
                    "size": {"type": "integer"},
                    "color": {"type": "string", "default": "blue", "enum": ["blue", "red"]}
                }}}
            }}}]
        }
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let crd_name = format!("widgets.{group}");
    wait_established(&crds, &crd_name).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&group, "v1", "Widget"),
        "widgets",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(c.client(), &ns, &ar);
    let mut w = DynamicObject::new("w", &ar);
    w.data = json!({"spec": {"size": 3, "unknown": "dropped"}, "extra": 1});
    let created = api.create(&PostParams::default(), &w).await.unwrap();
    assert_eq!(
        created.data["spec"],
        json!({"size": 3, "color": "blue"}),
        "pruned and defaulted"
    );
    assert!(created.data.get("extra").is_none());
    let mut bad = DynamicObject::new("bad", &ar);
    bad.data = json!({"spec": {"size": "three", "color": "green"}});
    let err = api_error(api.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!(err.code, 422);
    let fields: Vec<String> = err
        .details
        .map(|d| d.causes.into_iter().map(|c| c.field).collect())
        .unwrap_or_default();
    assert!(
        fields.contains(&"spec.size".to_string()) && fields.contains(&"spec.color".to_string()),
        "{fields:?}"
    );
    let mut missing = DynamicObject::new("missing", &ar);
    missing.data = json!({"spec": {}});
    assert_eq!(
        api_error(
            api.create(&PostParams::default(), &missing)
                .await
                .unwrap_err()
        )
        .code,
        422
    );
    crds.delete(&crd_name, &DeleteParams::default())
        .await
        .unwrap();
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn data_dir_keeps_objects_and_resource_versions_across_restarts() {
    if cluster::real_cluster_configured() {
        println!(
            "SKIPPED on a real cluster ({} is set): this test restarts the in-memory server",
            cluster::KUBECONFIG_ENV
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = || Config {
        data_dir: Some(dir.path().to_path_buf()),
        ..Config::for_tests()
    };
    let srv = e2e::apiserver::ApiServer::start(config()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(srv.client().unwrap(), "default");
    let created = api
        .create(&PostParams::default(), &cm("kept", &[]))
        .await
        .unwrap();
    let token = srv.token().to_string();
    srv.shutdown().await;
    let srv = e2e::apiserver::ApiServer::start(config()).await.unwrap();
    assert_eq!(srv.token(), token, "the admin token survives");
    let api: Api<ConfigMap> = Api::namespaced(srv.client().unwrap(), "default");
    let got = api.get("kept").await.unwrap();
    assert_eq!(got.metadata.uid, created.metadata.uid);
    let next = api
        .create(&PostParams::default(), &cm("after", &[]))
        .await
        .unwrap();
    let rv = |c: &ConfigMap| {
        c.metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert!(
        rv(&next) > rv(&created),
        "resourceVersions keep increasing after a restart"
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn owner_references_cascade_with_each_propagation_policy() {
    let (c, ns) = setup("gc").await;
    let api: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    let mut owners = Vec::new();
    for (owner, dependent) in [("bg", "bg-dep"), ("orph", "orph-dep"), ("fg", "fg-dep")] {
        let o = api
            .create(&PostParams::default(), &cm(owner, &[]))
            .await
            .unwrap();
        let mut d = cm(dependent, &[]);
        d.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: owner.into(),
                uid: o.metadata.uid.clone().unwrap(),
                block_owner_deletion: Some(true),
                ..Default::default()
            },
        ]);
        api.create(&PostParams::default(), &d).await.unwrap();
        owners.push(o);
    }
    api.delete("bg", &DeleteParams::background()).await.unwrap();
    api.delete("orph", &DeleteParams::orphan()).await.unwrap();
    let fg = api.delete("fg", &DeleteParams::foreground()).await.unwrap();
    if let Some(obj) = fg.left() {
        assert!(
            obj.metadata
                .finalizers
                .unwrap_or_default()
                .contains(&"foregroundDeletion".to_string())
        );
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let remaining = names(&api, &ListParams::default()).await;
        if remaining == vec!["orph-dep"] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "left: {remaining:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let orphan = api.get("orph-dep").await.unwrap();
    assert!(
        orphan
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty(),
        "orphaned dependents lose the reference"
    );
    c.delete_namespace(&ns).await;
}

/// A kubelet stand-in on `ip`: HTTPS with a serving certificate for `ip` from the cluster CA
/// (`ca_files`: its certificate and key, as `cloudcore stream-certificate` takes them),
/// requires a client certificate from the cluster CA, answers `/containerLogs/...` with two
/// lines and records the request path.
async fn fake_kubelet(
    ca_files: (std::path::PathBuf, std::path::PathBuf),
    ip: std::net::IpAddr,
) -> (
    u16,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    tokio::task::JoinHandle<()>,
) {
    let ca = cloudcore::cloudstream::load_ca(&ca_files.0, &ca_files.1).unwrap();
    let client_ca = ca.cert.cert_der.clone();
    fake_kubelet_with(&ca, client_ca, ip).await
}

/// [`fake_kubelet`] with its serving certificate from `serving_ca` and client certificates
/// checked against `client_ca`.
async fn fake_kubelet_with(
    serving_ca: &kubeedge_shared::pki::CertificateAuthority,
    client_ca: rustls_pki_types::CertificateDer<'static>,
    ip: std::net::IpAddr,
) -> (
    u16,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    tokio::task::JoinHandle<()>,
) {
    use std::sync::{Arc, Mutex};
    let cert = serving_ca.issue_server(&[&ip.to_string()], 1).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(client_ca).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![cert.cert_der.clone()], cert.key_der())
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen2 = seen.clone();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let Ok(tls) = acceptor.accept(tcp).await else {
                continue;
            };
            let seen = seen2.clone();
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    seen.lock().unwrap().push(req.uri().to_string());
                    async move {
                        Ok::<_, std::convert::Infallible>(http::Response::new(
                            http_body_util::Full::new(bytes::Bytes::from_static(
                                b"line one\nline two\n",
                            )),
                        ))
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                .await;
        }
    });
    (port, seen, task)
}

/// A Node (without a kubelet) whose InternalIP is `ip` and kubelet port `port`.
async fn node_at(c: &TestCluster, ip: &str, port: u16) -> String {
    let name = unique("e2e-node");
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"e2e.kubeedge-rs/test": "true"}},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}], "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}
    }))
    .unwrap();
    Api::<Node>::all(c.client())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    name
}

#[tokio::test]
async fn kubectl_logs_reach_the_node_kubelet_endpoint() {
    if cluster::skip_without_cluster_ca_key(
        "a kubelet stand-in with a serving certificate from the cluster CA",
    ) {
        return;
    }
    let c = cluster::connect().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_files = c.cluster_ca_files(dir.path()).unwrap().expect("checked");
    // On the test node address: not loopback, as for the edges.
    let ip = e2e::node_address::node_ip();
    let (port, seen, kubelet) = fake_kubelet(ca_files, ip).await;
    let ns = c.temp_namespace("logs").await.unwrap();
    let node_name = node_at(&c, &ip.to_string(), port).await;
    let pods: Api<Pod> = Api::namespaced(c.client(), &ns);
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": "talker"}, "spec": {"nodeName": node_name, "containers": [{"name": "main", "image": "busybox:1.36"}]}})).unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    let out = c
        .kubectl_run(&["-n", &ns, "logs", "talker", "--tail=5"], None)
        .await
        .unwrap();
    assert!(out.success, "{out:?}");
    assert_eq!(out.stdout, "line one\nline two\n");
    let paths = seen.lock().unwrap().clone();
    assert!(
        paths.iter().any(
            |p| p.starts_with(&format!("/containerLogs/{ns}/talker/main"))
                && p.contains("tailLines=5")
        ),
        "{paths:?}"
    );
    let logs = pods.logs("talker", &Default::default()).await.unwrap();
    assert!(logs.contains("line two"));
    kubelet.abort();
    c.delete_namespace(&ns).await;
    let _ = Api::<Node>::all(c.client())
        .delete(&node_name, &DeleteParams::default())
        .await;
}

#[tokio::test]
async fn a_kubelet_certificate_from_another_ca_is_refused_unless_the_client_skips_the_check() {
    let Some(c) = cluster::connect_in_memory_only(
        Config::for_tests(),
        "an apiserver known to verify kubelets (--kubelet-certificate-authority)",
    )
    .await
    .unwrap() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rogue = kubeedge_shared::pki::CertificateAuthority::generate().unwrap();
    let (rogue_crt, rogue_key) = (dir.path().join("rogue.crt"), dir.path().join("rogue.key"));
    std::fs::write(&rogue_crt, &rogue.cert.cert_pem).unwrap();
    std::fs::write(&rogue_key, &rogue.cert.key_pem).unwrap();
    let ip = e2e::node_address::node_ip();
    // Serving certificate from the rogue CA; client certificates still from the cluster CA.
    let (port, seen, kubelet) =
        fake_kubelet_with(&rogue, c.cluster_ca().first().unwrap().clone(), ip).await;
    let ns = c.temp_namespace("roguekubelet").await.unwrap();
    let node_name = node_at(&c, &ip.to_string(), port).await;
    let pods: Api<Pod> = Api::namespaced(c.client(), &ns);
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": "talker"}, "spec": {"nodeName": node_name, "containers": [{"name": "main", "image": "busybox:1.36"}]}})).unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    let out = c
        .kubectl_run(&["-n", &ns, "logs", "talker"], None)
        .await
        .unwrap();
    assert!(
        !out.success && out.stderr.contains("certificate"),
        "{out:?}"
    );
    assert!(seen.lock().unwrap().is_empty(), "no request got through");
    let out = c
        .kubectl_run(
            &[
                "-n",
                &ns,
                "logs",
                "talker",
                "--insecure-skip-tls-verify-backend",
            ],
            None,
        )
        .await
        .unwrap();
    assert!(
        out.success && out.stdout == "line one\nline two\n",
        "{out:?}"
    );
    kubelet.abort();
}

#[tokio::test]
async fn node_proxy_refuses_loopback_and_link_local_node_addresses() {
    let (c, ns) = setup("proxyaddr").await;
    // A port nothing listens on: no request may get that far anyway.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut made = Vec::new();
    for ip in ["127.0.0.1", "169.254.10.1", "::1"] {
        let node = node_at(&c, ip, port).await;
        made.push(node.clone());
        for path in [
            format!("/api/v1/nodes/{node}/proxy/stats/summary"),
            format!("/api/v1/nodes/{node}:{port}/proxy/metrics"),
        ] {
            let req = http::Request::get(&path).body(Vec::new()).unwrap();
            let err = api_error(c.client().request_text(req).await.unwrap_err());
            assert_eq!(
                (err.code, err.reason.as_str(), err.message.as_str()),
                (400, "BadRequest", "address not allowed"),
                "{ip}: {path}"
            );
        }
        // pods/log is not checked (upstream's LogLocation does not): the apiserver tries the
        // node and fails to connect instead.
        let pods: Api<Pod> = Api::namespaced(c.client(), &ns);
        let name = format!("on-{}", made.len());
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox:1.36"}]}})).unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
        let err = pods.logs(&name, &Default::default()).await.unwrap_err();
        assert!(
            !err.to_string().contains("address not allowed"),
            "{ip}: {err}"
        );
    }
    c.delete_namespace(&ns).await;
    for node in made {
        let _ = Api::<Node>::all(c.client())
            .delete(&node, &DeleteParams::default())
            .await;
    }
}
