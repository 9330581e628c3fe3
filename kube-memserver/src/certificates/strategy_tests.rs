use std::collections::BTreeMap;

use base64::Engine;

use super::*;

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn causes(csr: &Value, old: Option<&Value>, sub: Option<&str>) -> Vec<String> {
    validate(csr, old, sub)
        .unwrap()
        .into_iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect()
}

fn stored(conditions: Value) -> Value {
    json!({
        "metadata": {"name": "c"},
        "spec": {"request": b64("x"), "signerName": "example.com/s", "usages": ["client auth"],
                 "username": "alice"},
        "status": {"conditions": conditions},
    })
}

#[test]
fn create_records_the_requester_and_clears_what_the_client_claimed() {
    let mut csr = json!({"spec": {"username": "mallory", "groups": ["system:masters"],
                                  "uid": "x", "extra": {"k": ["v"]}}});
    let user = UserInfo {
        name: "alice".into(),
        groups: vec!["devs".into()],
        extra: BTreeMap::from([("k2".to_string(), vec!["v2".to_string()])]),
        ..UserInfo::default()
    };
    prepare_create(&mut csr, Some(&user));
    assert_eq!(
        csr["spec"],
        json!({"username": "alice", "groups": ["devs"], "extra": {"k2": ["v2"]}})
    );
    prepare_create(&mut csr, None);
    assert_eq!(csr["spec"], json!({}));
}

#[test]
fn status_writes_keep_the_approval_and_approval_writes_keep_everything_else() {
    let old = stored(
        json!([{"type": "Approved", "status": "True", "reason": "Admin",
                             "lastUpdateTime": "2026-01-01T00:00:00Z",
                             "lastTransitionTime": "2026-01-01T00:00:00Z"}]),
    );
    let mut new = old.clone();
    new["spec"]["username"] = json!("mallory");
    new["status"]["conditions"][0]["reason"] = json!("Changed");
    new["status"]["certificate"] = json!("Y2VydA==");
    prepare_update(&old, &mut new, Some("status"));
    assert_eq!(new["spec"], old["spec"]);
    assert_eq!(new["status"]["conditions"], old["status"]["conditions"]);
    assert_eq!(new["status"]["certificate"], "Y2VydA==");

    let mut approval = old.clone();
    approval["status"]["certificate"] = json!("Y2VydA==");
    approval["status"]["conditions"] =
        json!([{"type": "Approved", "status": "True", "reason": "Other"}]);
    prepare_update(&old, &mut approval, Some("approval"));
    assert!(approval["status"]["certificate"].is_null());
    let cond = &approval["status"]["conditions"][0];
    assert_eq!(cond["reason"], "Other");
    // Same type and status as before: the old transition time; the update time is new.
    assert_eq!(cond["lastTransitionTime"], "2026-01-01T00:00:00Z");
    assert!(
        cond["lastUpdateTime"]
            .as_str()
            .is_some_and(|t| t != "2026-01-01T00:00:00Z")
    );

    let mut main = old.clone();
    main["status"] = json!({});
    main["metadata"]["labels"] = json!({"a": "b"});
    prepare_update(&old, &mut main, None);
    assert_eq!(main["status"], old["status"]);
    assert_eq!(main["metadata"]["labels"]["a"], "b");
}

#[test]
fn only_the_approval_subresource_adds_approval_and_only_status_sets_the_certificate() {
    let old = stored(json!([]));
    let mut approve = old.clone();
    approve["status"]["conditions"] = json!([{"type": "Approved", "status": "True"}]);
    assert_eq!(
        causes(&approve, Some(&old), Some("approval")),
        Vec::<String>::new()
    );
    assert_eq!(
        causes(&approve, Some(&old), Some("status")),
        ["status.conditions: Forbidden: updates may not add a condition of type \"Approved\""]
    );
    let mut both = approve.clone();
    both["status"]["conditions"] = json!([
        {"type": "Approved", "status": "True"}, {"type": "Denied", "status": "True"}
    ]);
    assert_eq!(
        causes(&both, Some(&old), Some("approval")),
        [
            "status.conditions[1].type: Invalid value: \"Denied\": Approved and Denied conditions are mutually exclusive"
        ]
    );
    let mut removed = stored(json!([]));
    removed["status"]["conditions"] = json!([]);
    assert_eq!(
        causes(&removed, Some(&approve), Some("approval")),
        ["status.conditions: Forbidden: updates may not remove a condition of type \"Approved\""]
    );
    let mut cert = old.clone();
    cert["status"]["certificate"] = json!(b64("junk"));
    assert_eq!(
        causes(&cert, Some(&old), Some("status")),
        [
            "status.certificate: Invalid value: \"<certificate data>\": must contain at least one CERTIFICATE PEM block"
        ]
    );
    assert!(causes(&cert, Some(&old), Some("approval")).contains(
        &"status.certificate: Forbidden: updates may not set certificate content".to_string()
    ));
}

#[test]
fn create_validation_reports_each_bad_field() {
    let csr = json!({"spec": {
        "request": b64("junk"), "signerName": "kubernetes.io", "usages": ["client auth", "bogus", "client auth"],
        "expirationSeconds": 599,
    }});
    let got = causes(&csr, None, None);
    assert!(got[0].starts_with("spec.request: Invalid value: []byte{0x6a, 0x75, 0x6e, 0x6b}: PEM block type must be CERTIFICATE REQUEST"), "{got:?}");
    assert!(
        got[1].starts_with("spec.usages[1]: Unsupported value: \"bogus\""),
        "{got:?}"
    );
    assert_eq!(got[2], "spec.usages[2]: Duplicate value: \"client auth\"");
    assert_eq!(
        got[3],
        "spec.signerName: Invalid value: \"kubernetes.io\": must be a fully qualified domain and path of the form 'example.com/signer-name'"
    );
    assert_eq!(
        got[4],
        "spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 600 seconds (10 minutes)"
    );
    assert_eq!(got.len(), 5);
    assert_eq!(
        signer_name_causes("f", "example/Signer")
            .iter()
            .map(|c| c.message.clone())
            .collect::<Vec<_>>(),
        [
            "Invalid value: \"example\": should be a domain with at least two segments separated by dots".to_string(),
            format!("Invalid value: \"Signer\": validating label \"Signer\": {SUBDOMAIN_MSG}"),
        ]
    );
    assert!(signer_name_causes("f", "example.com/my-signer").is_empty());
    let legacy = json!({"spec": {"signerName": "kubernetes.io/legacy-unknown", "usages": ["any"]}});
    assert!(
        causes(&legacy, None, None)
            .iter()
            .any(|c| c.contains("legacy signerName"))
    );
    assert!(
        validate(&json!({"spec": {"request": "!!"}}), None, None).is_err_and(|e| e.code == 400)
    );
}
