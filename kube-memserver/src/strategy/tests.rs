use super::*;
use crate::resources::Registry;

#[test]
fn pod_create_defaults_and_status_reset() {
    let reg = Registry::new();
    let info = reg.lookup("", "v1", "pods").unwrap();
    let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}, "status": {"phase": "Running"}});
    prepare_create(&info, &mut pod, "2024-01-01T00:00:00Z");
    assert_eq!(pod["status"]["phase"], "Pending");
    assert_eq!(pod["status"]["qosClass"], "BestEffort");
    assert_eq!(pod["spec"]["containers"][0]["imagePullPolicy"], "Always");
    assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 30);
    assert_eq!(pod["spec"]["tolerations"].as_array().unwrap().len(), 2);
}

fn pod_with_status(status: Value) -> Value {
    json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}, "status": status})
}

/// What a real apiserver answers a status whose IP lists grew a second entry of one family
/// (a strategic merge patch that kept the old IP beside the new one).
#[test]
fn pod_ip_lists_hold_at_most_one_ip_per_family() {
    let reg = Registry::new();
    let info = reg.lookup("", "v1", "pods").unwrap();
    let old = pod_with_status(json!({"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}]}));
    let mut bad = pod_with_status(json!({
        "podIP": "10.251.2.64",
        "podIPs": [{"ip": "10.251.2.64"}, {"ip": "10.251.2.36"}],
        "hostIP": "192.168.0.2",
        "hostIPs": [{"ip": "192.168.0.2"}, {"ip": "192.168.0.1"}],
    }));
    check_type(&info, &mut bad).unwrap();
    let err = validate(&info, &bad, Some(&old), None).unwrap_err();
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains(r#"status.podIPs: Invalid value: [{IP:"10.251.2.64"}, {IP:"10.251.2.36"}]: may specify no more than one IP for each IP family"#),
        "{}",
        err.message
    );
    assert!(
        err.message.contains("status.hostIPs: Invalid value"),
        "{}",
        err.message
    );
    let mut dual = pod_with_status(
        json!({"podIP": "10.0.0.2", "podIPs": [{"ip": "10.0.0.2"}, {"ip": "fd00::2"}]}),
    );
    check_type(&info, &mut dual).unwrap();
    validate(&info, &dual, Some(&old), None).unwrap();
    let mut junk = pod_with_status(
        json!({"podIP": "10.0.0.2", "podIPs": [{"ip": "10.0.0.2"}, {"$patch": "replace"}]}),
    );
    check_type(&info, &mut junk).unwrap();
    let err = validate(&info, &junk, Some(&old), None).unwrap_err();
    assert!(err.message.contains("status.podIPs[1]"), "{}", err.message);
    let mut host = pod_with_status(json!({"hostIP": "10.1.1.1", "hostIPs": [{"ip": "10.1.1.2"}]}));
    check_type(&info, &mut host).unwrap();
    let err = validate(&info, &host, Some(&old), None).unwrap_err();
    assert!(
        err.message.contains("must be equal to `hostIP`"),
        "{}",
        err.message
    );
}

/// `podIP` wins over a `podIPs[0]` that differs, as the v1 → internal conversion has it.
#[test]
fn pod_ip_is_authoritative_over_a_differing_first_pod_ip() {
    let reg = Registry::new();
    let info = reg.lookup("", "v1", "pods").unwrap();
    let mut pod = pod_with_status(
        json!({"podIP": "10.0.0.2", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}]}),
    );
    check_type(&info, &mut pod).unwrap();
    assert_eq!(pod["status"]["podIPs"], json!([{"ip": "10.0.0.2"}]));
    let mut pod = pod_with_status(json!({"podIP": "10.0.0.3", "hostIP": "1.2.3.4"}));
    check_type(&info, &mut pod).unwrap();
    assert_eq!(pod["status"]["podIPs"], json!([{"ip": "10.0.0.3"}]));
    assert_eq!(pod["status"]["hostIPs"], json!([{"ip": "1.2.3.4"}]));
    let mut pod = pod_with_status(json!({"podIPs": [{"ip": "10.0.0.4"}]}));
    check_type(&info, &mut pod).unwrap();
    assert_eq!(pod["status"]["podIP"], "10.0.0.4");
}

#[test]
fn status_update_touches_only_status() {
    let reg = Registry::new();
    let info = reg.lookup("", "v1", "pods").unwrap();
    let old = json!({"metadata": {"name": "p", "uid": "u", "ownerReferences": [{"uid": "o"}]}, "spec": {"nodeName": "n"}, "status": {"phase": "Pending"}});
    let mut new = json!({"metadata": {"name": "p", "uid": "x", "labels": {"a": "b"}}, "spec": {"nodeName": "other"}, "status": {"phase": "Running"}});
    prepare_update(&info, &old, &mut new, Some("status"));
    assert_eq!(new["spec"]["nodeName"], "n");
    assert_eq!(new["status"]["phase"], "Running");
    assert_eq!(new["metadata"]["uid"], "u");
    assert_eq!(new["metadata"]["ownerReferences"][0]["uid"], "o");
    let mut main = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n"}, "status": {"phase": "Failed"}});
    prepare_update(&info, &old, &mut main, None);
    assert_eq!(main["status"]["phase"], "Pending");
}
