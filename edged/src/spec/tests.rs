use super::*;
use serde_json::json;

fn pod(spec: Value) -> Pod {
    Pod::from_value(&json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": spec,
    }))
    .unwrap()
}

#[test]
fn a_plain_pod_parses_and_validates() {
    let p = pod(json!({
        "nodeName": "edge-1",
        "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "1"],
            "env": [{"name": "A", "value": "1"}],
            "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"}],
            "ports": [{"containerPort": 80, "protocol": "TCP"}]}],
        "volumes": [{"name": "cfg", "configMap": {"name": "c"}}],
        "restartPolicy": "OnFailure",
    }));
    assert_eq!(p.spec.validate(), Ok(()));
    assert_eq!(p.spec.restart_policy(), RestartPolicy::OnFailure);
    assert_eq!(p.spec.containers[0].pull_policy(), PullPolicy::Always);
    assert_eq!(p.key(), "ns/p");
    assert_eq!(p.grace_period_seconds(), 30);
}

#[test]
fn unknown_volume_types_are_refused_by_name() {
    let p = pod(json!({
        "containers": [{"name": "main", "image": "busybox"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "x"}}],
    }));
    let err = p.spec.validate().unwrap_err();
    assert_eq!(
        err.to_string(),
        "spec.volumes[0]: volume type \"persistentVolumeClaim\" is not supported by kubeedge-rs edged"
    );
}

#[test]
fn invalid_fields_are_named() {
    let cases = [
        (json!({"containers": []}), "spec.containers"),
        (
            json!({"containers": [{"name": "a", "image": ""}]}),
            "spec.containers[0].image",
        ),
        (
            json!({"containers": [{"name": "A_b", "image": "x"}]}),
            "spec.containers[0].name",
        ),
        (
            json!({"containers": [{"name": "a", "image": "x", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}]}),
            "spec.containers[0].volumeMounts[0].name",
        ),
        (
            json!({"containers": [{"name": "a", "image": "x"}], "restartPolicy": "Sometimes"}),
            "spec.restartPolicy",
        ),
        (
            json!({"containers": [{"name": "a", "image": "x"}], "volumes": [{"name": "v", "configMap": {"name": "c", "items": [{"key": "k", "path": "../etc/passwd"}]}}]}),
            "spec.volumes[0].configMap.items[0].path",
        ),
        (
            json!({"containers": [{"name": "a", "image": "x", "ports": [{"containerPort": 70000}]}]}),
            "spec.containers[0].ports[0].containerPort",
        ),
        (
            json!({"initContainers": [{"name": "a", "image": "x"}], "containers": [{"name": "a", "image": "x"}]}),
            "spec.containers[0].name",
        ),
        (
            json!({"containers": [{"name": "a", "image": "x"}],
                   "volumes": [{"name": "../../../etc", "emptyDir": {}}]}),
            "spec.volumes[0].name",
        ),
    ];
    for (spec, field) in cases {
        let err = pod(spec.clone()).spec.validate().unwrap_err();
        assert!(
            err.to_string().starts_with(&format!("{field}: ")),
            "{spec}: {err}"
        );
    }
}

#[test]
fn only_plain_names_name_pod_directories() {
    for good in ["0b7a3c2e-9f1d-4c55-8e11-2a3b4c5d6e7f", "u1", "a.b_c"] {
        assert!(is_path_element(good), "{good}");
    }
    for bad in ["", ".", "..", "../x", "a/b", "a b", "/etc", "\u{0}"] {
        assert!(!is_path_element(bad), "{bad:?}");
    }
}

#[test]
fn a_field_of_the_wrong_type_is_named() {
    let err = Pod::from_value(&json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a", "image": "x", "command": "sleep 1"}]},
    }))
    .unwrap_err();
    assert!(
        err.to_string().starts_with("spec.containers[0].command: "),
        "{err}"
    );
    assert_eq!(
        metadata_of(&json!({"metadata": {"name": "p", "uid": "u"}, "spec": 5})).uid,
        "u"
    );
}

#[test]
fn default_pull_policy_follows_the_tag() {
    assert_eq!(default_pull_policy("busybox"), PullPolicy::Always);
    assert_eq!(default_pull_policy("busybox:latest"), PullPolicy::Always);
    assert_eq!(
        default_pull_policy("localhost:5000/busybox"),
        PullPolicy::Always
    );
    assert_eq!(
        default_pull_policy("localhost:5000/busybox:1.36"),
        PullPolicy::IfNotPresent
    );
    assert_eq!(
        default_pull_policy("busybox@sha256:abcd"),
        PullPolicy::IfNotPresent
    );
}

#[test]
fn a_volume_without_a_source_is_an_empty_dir() {
    let v: Volume = serde_json::from_value(json!({"name": "x"})).unwrap();
    assert_eq!(v.kind("f"), Ok(VolumeKind::EmptyDir));
    let v: Volume =
        serde_json::from_value(json!({"name": "x", "emptyDir": {}, "hostPath": {"path": "/x"}}))
            .unwrap();
    assert!(v.kind("f").is_err());
}
