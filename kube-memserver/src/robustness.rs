//! Odd and hostile request bodies against every kind and verb: errors are fine, panics are not.

use serde_json::{Value, json};

use super::Config;
use super::patch::PatchType;
use super::state::State;
use super::tokens::TokenIssuer;
use super::verbs::{self, DeleteOptions, WriteOptions};

fn state() -> State {
    let pki = super::tls::make_pki(&[], None).expect("pki");
    let kubelet = super::kubelet::client_configs(
        &pki.kubelet_client_der,
        &pki.kubelet_client_key_der,
        Some(&pki.ca_der),
    )
    .expect("kubelet tls");
    let st = State::new(
        Config::default(),
        TokenIssuer::new(b"k".to_vec()),
        "t".into(),
        "ca".into(),
        kubelet,
    );
    let ns = st.core("namespaces");
    verbs::create(
        &st,
        &ns,
        "",
        json!({"metadata": {"name": "default"}}),
        &WriteOptions::default(),
    )
    .expect("namespace");
    st
}

fn shapes() -> Vec<Value> {
    let mut deep = json!("leaf");
    for _ in 0..100 {
        deep = json!({"a": [deep]});
    }
    vec![
        json!(null),
        json!([]),
        json!("x"),
        json!(5),
        json!({}),
        json!({"metadata": "x"}),
        json!({"metadata": {"name": 5}}),
        json!({"metadata": {"name": "ok", "labels": "x", "annotations": [1], "finalizers": "f"}}),
        json!({"metadata": {"name": "ok", "labels": {"a": 1}, "generateName": 7}}),
        json!({"metadata": {"name": "ok"}, "spec": "x", "status": [], "data": 5, "type": {}}),
        json!({"metadata": {"name": "ok"}, "spec": {"containers": "x", "nodeName": 3, "ports": {}}}),
        json!({"metadata": {"name": "ok"}, "spec": {"containers": [1, "x", {"name": 4, "ports": "p", "env": [null]}], "volumes": {}}}),
        json!({"metadata": {"name": "ok"}, "spec": {"names": "x", "versions": [{"name": 1}], "group": []}}),
        json!({"metadata": {"name": "ok"}, "spec": {"ports": [{"port": "80"}, null], "type": 1, "clusterIP": []}}),
        json!({"metadata": {"name": "ok"}, "stringData": {"a": 1}, "data": {"b": "!!notbase64"}}),
        json!({"kind": 1, "apiVersion": []}),
        json!({"kind": "Other", "apiVersion": "v9"}),
        json!({"metadata": {"name": "ok", "resourceVersion": "abc", "uid": 5}}),
        json!({"metadata": {"name": "ok"}, "deep": deep}),
    ]
}

#[test]
fn no_body_shape_panics_any_verb_of_any_kind() {
    let st = state();
    for info in st.resources.all() {
        let ns = if info.namespaced { "default" } else { "" };
        for body in shapes() {
            let _ = verbs::create(&st, &info, ns, body.clone(), &WriteOptions::default());
            let _ = verbs::update(&st, &info, ns, "ok", body.clone(), &WriteOptions::default());
            let status = WriteOptions {
                subresource: Some("status".into()),
                ..Default::default()
            };
            let _ = verbs::update(&st, &info, ns, "ok", body.clone(), &status);
            let approval = WriteOptions {
                subresource: Some("approval".into()),
                ..Default::default()
            };
            let _ = verbs::update(&st, &info, ns, "ok", body.clone(), &approval);
            let raw = serde_json::to_vec(&body).unwrap_or_default();
            for pt in [
                PatchType::Merge,
                PatchType::Strategic,
                PatchType::Json,
                PatchType::Apply,
            ] {
                let opts = WriteOptions {
                    field_manager: Some("m".into()),
                    ..Default::default()
                };
                let _ = verbs::patch(&st, &info, ns, "ok", pt, &raw, &opts);
                let _ = verbs::patch(&st, &info, ns, "ok", pt, b"\xff\x00{", &opts);
            }
        }
        let opts = DeleteOptions {
            grace_period_seconds: Some(i64::MAX),
            ..Default::default()
        };
        let _ = verbs::delete(&st, &info, ns, "ok", &opts);
        let _ = verbs::delete(&st, &info, ns, "ok", &DeleteOptions::default());
    }
    for body in shapes() {
        let _ = verbs::create_token(&st, "default", "default", body.clone());
        let _ = verbs::bind_pod(&st, "default", "ok", &body);
    }
    let _ = super::protobuf::decode(b"k8s\x00\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01");
}

#[test]
fn forged_continue_tokens_are_rejected_not_fatal() {
    use base64::Engine;
    let st = state();
    let info = st.core("configmaps");
    let filter = super::selectors::Filter::default();
    for raw in [
        r#"{"v":"meta.k8s.io/v1","rv":1,"start":"zzz\u0000"}"#,
        r#"{"v":"meta.k8s.io/v1","rv":99999999,"start":"a"}"#,
        r#"{"v":"meta.k8s.io/v1","rv":-1,"start":"a"}"#,
        r#"{"v":"x"}"#,
        "garbage",
    ] {
        let tok = base64::engine::general_purpose::URL_SAFE.encode(raw);
        for ns in [Some("default"), None, Some("")] {
            let req = verbs::ListRequest {
                ns,
                filter: &filter,
                limit: Some(1),
                continue_token: Some(&tok),
                resource_version: None,
                exact: false,
            };
            let _ = verbs::list(&st, &info, &req);
        }
    }
}
