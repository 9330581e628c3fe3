//! CertificateSigningRequests: the apiserver's validation and strategies, `kubectl certificate
//! approve|deny` (the `approval` subresource) and kube-controller-manager's signer for
//! `kubernetes.io/kubelet-serving`, whose certificates chain to the CA in `kube-root-ca.crt`.
//! Works on a real cluster (kubeadm's controller-manager signs with the cluster CA); CSRs are
//! cluster-scoped, so each test names its own uniquely, labels it and deletes it.

use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
use serde_json::{Value, json};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use super::{api_error, setup, unique};

const WAIT: Duration = Duration::from_secs(30);
const SERVING: &str = "kubernetes.io/kubelet-serving";
const NODE_IP: [u8; 4] = [10, 254, 254, 1];

/// A PEM PKCS#10 request for `cn`/`orgs` with an IP and a DNS SAN (ECDSA P-256).
fn request_pem(cn: &str, orgs: &[&str]) -> String {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    for o in orgs {
        params.distinguished_name.push(DnType::OrganizationName, *o);
    }
    params.distinguished_name.push(DnType::CommonName, cn);
    params.subject_alt_names = vec![
        SanType::IpAddress(NODE_IP.into()),
        SanType::DnsName("edge-node.example".try_into().expect("dns name")),
    ];
    params
        .serialize_request(&key)
        .expect("serialize request")
        .pem()
        .expect("pem")
}

fn csr_object(name: &str, request: &[u8], signer: &str, usages: &[&str], exp: i64) -> Value {
    json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name, "labels": {"e2e.kubeedge-rs/test": "true"}},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(request),
            "signerName": signer,
            "usages": usages,
            "expirationSeconds": exp,
            // Set by the server from the requester, whatever the client sends.
            // (A group no admin is in: a real cluster's admin may well be in system:masters.)
            "username": "mallory",
            "groups": ["e2e.kubeedge-rs:forged"],
        },
    })
}

async fn create(api: &Api<CertificateSigningRequest>, v: Value) -> CertificateSigningRequest {
    let csr: CertificateSigningRequest = serde_json::from_value(v).expect("csr object");
    api.create(&PostParams::default(), &csr)
        .await
        .expect("create csr")
}

/// Polls until `done` holds; the CSR's last state when it does, or a panic at the deadline.
async fn wait_for(
    api: &Api<CertificateSigningRequest>,
    name: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let v = serde_json::to_value(api.get(name).await.expect("get csr")).expect("json");
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "CSR {name} never {what}: {v:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn condition<'a>(csr: &'a Value, ty: &str) -> Option<&'a Value> {
    csr["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)
}

fn pem_der(pem: &[u8], label: &str) -> Vec<u8> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).expect("PEM block");
    assert_eq!(block.label, label);
    block.contents
}

#[tokio::test]
async fn kubelet_serving_csr_approved_with_kubectl_is_issued_by_the_cluster_ca() {
    let (c, ns) = setup("csr-issue").await;
    let api: Api<CertificateSigningRequest> = Api::all(c.client());
    let name = unique("csr-serving");
    let node = format!("system:node:{name}");
    let pem = request_pem(&node, &["system:nodes"]);
    let usages = ["digital signature", "server auth"];
    let created = create(
        &api,
        csr_object(&name, pem.as_bytes(), SERVING, &usages, 3600),
    )
    .await;
    let spec = serde_json::to_value(&created.spec).expect("spec");
    assert_ne!(
        spec["username"], "mallory",
        "the requester comes from authentication"
    );
    assert!(
        spec["groups"]
            .as_array()
            .is_some_and(|g| g.contains(&json!("system:authenticated"))
                && !g.contains(&json!("e2e.kubeedge-rs:forged"))),
        "groups from authentication: {spec}"
    );
    assert!(created.status.and_then(|s| s.certificate).is_none());
    let out = c
        .kubectl_run(&["certificate", "approve", &name], None)
        .await
        .expect("kubectl");
    assert!(out.success, "kubectl certificate approve: {out:?}");
    assert!(out.stdout.contains("approved"), "{out:?}");

    let done = wait_for(&api, &name, "issued", |v| {
        v["status"]["certificate"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    })
    .await;
    let approved = condition(&done, "Approved").expect("Approved condition");
    assert_eq!(approved["status"], "True");
    assert_eq!(approved["reason"], "KubectlApprove");
    assert!(condition(&done, "Failed").is_none(), "{done:#}");

    let cert_pem = base64::engine::general_purpose::STANDARD
        .decode(done["status"]["certificate"].as_str().unwrap_or_default())
        .expect("base64 certificate");
    let cert_der = pem_der(&cert_pem, "CERTIFICATE");
    let (_, cert) = X509Certificate::from_der(&cert_der).expect("certificate");
    let root = Api::<ConfigMap>::namespaced(c.client(), &ns)
        .get("kube-root-ca.crt")
        .await
        .expect("kube-root-ca.crt");
    let ca_pem = root
        .data
        .and_then(|d| d.get("ca.crt").cloned())
        .expect("ca.crt");
    // The bundle may hold several CAs: one of them signed the certificate.
    let cas: Vec<Vec<u8>> = x509_parser::pem::Pem::iter_from_buffer(ca_pem.as_bytes())
        .map(|p| p.expect("CA PEM").contents)
        .collect();
    let signed_by_cluster_ca = cas.iter().any(|der| {
        let (_, ca) = X509Certificate::from_der(der).expect("CA certificate");
        ca.subject() == cert.issuer() && cert.verify_signature(Some(ca.public_key())).is_ok()
    });
    assert!(
        signed_by_cluster_ca,
        "issuer {} is not the cluster CA",
        cert.issuer()
    );

    assert_eq!(
        cert.subject()
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok()),
        Some(node.as_str())
    );
    let san = cert
        .subject_alternative_name()
        .expect("SAN extension")
        .expect("SANs")
        .value;
    assert!(
        san.general_names
            .contains(&GeneralName::IPAddress(&NODE_IP)),
        "{san:?}"
    );
    assert!(
        san.general_names
            .contains(&GeneralName::DNSName("edge-node.example")),
        "{san:?}"
    );
    let eku = cert.extended_key_usage().expect("EKU").expect("EKU").value;
    assert!(eku.server_auth && !eku.client_auth, "{eku:?}");
    let ku = cert.key_usage().expect("KU").expect("KU").value;
    assert!(ku.digital_signature(), "{ku:?}");
    assert!(
        !cert
            .basic_constraints()
            .ok()
            .flatten()
            .is_some_and(|b| b.value.ca),
        "a leaf certificate"
    );
    let lifetime = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
    // 1 h requested, NotBefore backdated by 5 min.
    assert!(
        (3600..=3600 + 301).contains(&lifetime),
        "lifetime {lifetime}s"
    );

    let out = c
        .kubectl_run(&["get", "csr", &name], None)
        .await
        .expect("kubectl");
    assert!(out.stdout.contains("Approved,Issued"), "{out:?}");
    assert!(out.stdout.contains(SERVING), "{out:?}");
    let _ = api.delete(&name, &DeleteParams::default()).await;
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_denied_csr_is_never_issued_and_cannot_be_approved_too() {
    let (c, ns) = setup("csr-deny").await;
    let api: Api<CertificateSigningRequest> = Api::all(c.client());
    let name = unique("csr-denied");
    let pem = request_pem(&format!("system:node:{name}"), &["system:nodes"]);
    let usages = ["digital signature", "server auth"];
    create(
        &api,
        csr_object(&name, pem.as_bytes(), SERVING, &usages, 3600),
    )
    .await;
    let out = c
        .kubectl_run(&["certificate", "deny", &name], None)
        .await
        .expect("kubectl");
    assert!(out.success, "kubectl certificate deny: {out:?}");
    let denied = wait_for(&api, &name, "denied", |v| condition(v, "Denied").is_some()).await;
    assert_eq!(
        condition(&denied, "Denied").expect("Denied")["reason"],
        "KubectlDeny"
    );

    // Approved and Denied are exclusive, also through the approval subresource.
    let mut both = denied.clone();
    both["status"]["conditions"]
        .as_array_mut()
        .expect("conditions")
        .push(json!({"type": "Approved", "status": "True", "reason": "Test"}));
    let err = api
        .replace_subresource("approval", &name, &PostParams::default(), &both)
        .await
        .map(|_| ())
        .expect_err("approving a denied CSR");
    let status = api_error(err);
    assert_eq!(status.code, 422, "{status:?}");
    assert!(status.message.contains("mutually exclusive"), "{status:?}");

    // The signer leaves it alone: give it the time it needs for an approved one.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = serde_json::to_value(api.get(&name).await.expect("get")).expect("json");
    assert!(after["status"]["certificate"].is_null(), "{after:#}");
    assert!(condition(&after, "Approved").is_none(), "{after:#}");
    let out = c
        .kubectl_run(&["get", "csr", &name], None)
        .await
        .expect("kubectl");
    assert!(out.stdout.contains("Denied"), "{out:?}");
    let _ = api.delete(&name, &DeleteParams::default()).await;
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn invalid_csrs_are_rejected_with_field_causes() {
    let (c, ns) = setup("csr-invalid").await;
    let api: Api<CertificateSigningRequest> = Api::all(c.client());
    let name = unique("csr-invalid");
    let mut bad = csr_object(&name, b"not a request", "nodomain", &[], 60);
    bad["spec"]["usages"] = json!([]);
    let csr: CertificateSigningRequest = serde_json::from_value(bad).expect("csr");
    let status = api_error(
        api.create(&PostParams::default(), &csr)
            .await
            .expect_err("invalid CSR"),
    );
    assert_eq!(status.code, 422, "{status:?}");
    assert_eq!(status.reason, "Invalid", "{status:?}");
    let fields: Vec<String> = status
        .details
        .as_ref()
        .map(|d| d.causes.iter().map(|c| c.field.clone()).collect())
        .unwrap_or_default();
    for f in [
        "spec.request",
        "spec.usages",
        "spec.signerName",
        "spec.expirationSeconds",
    ] {
        assert!(
            fields.iter().any(|x| x == f),
            "no cause for {f}: {status:?}"
        );
    }
    assert!(
        status
            .message
            .contains("PEM block type must be CERTIFICATE REQUEST"),
        "{status:?}"
    );
    // A request signed by another key than the one it carries.
    let pem = request_pem("alice", &[]);
    let mut der = pem_der(pem.as_bytes(), "CERTIFICATE REQUEST");
    if let Some(last) = der.last_mut() {
        *last ^= 0x01;
    }
    let tampered = format!(
        "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
        base64::engine::general_purpose::STANDARD.encode(&der)
    );
    let obj = csr_object(
        &name,
        tampered.as_bytes(),
        "kubernetes.io/kube-apiserver-client",
        &["client auth"],
        3600,
    );
    let csr: CertificateSigningRequest = serde_json::from_value(obj).expect("csr");
    let status = api_error(
        api.create(&PostParams::default(), &csr)
            .await
            .expect_err("tampered CSR"),
    );
    assert_eq!(status.code, 422, "{status:?}");
    assert!(status.message.contains("spec.request"), "{status:?}");
    assert!(api.get_opt(&name).await.expect("get").is_none());
    c.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_kubelet_serving_csr_with_a_wrong_subject_fails_signer_validation() {
    let (c, ns) = setup("csr-fail").await;
    let api: Api<CertificateSigningRequest> = Api::all(c.client());
    let name = unique("csr-wrong");
    // The organisation is right, the common name is not a node's.
    let pem = request_pem(&name, &["system:nodes"]);
    let usages = ["digital signature", "server auth"];
    create(
        &api,
        csr_object(&name, pem.as_bytes(), SERVING, &usages, 3600),
    )
    .await;
    let out = c
        .kubectl_run(&["certificate", "approve", &name], None)
        .await
        .expect("kubectl");
    assert!(out.success, "kubectl certificate approve: {out:?}");
    let failed = wait_for(&api, &name, "failed", |v| condition(v, "Failed").is_some()).await;
    let cond = condition(&failed, "Failed").expect("Failed");
    assert_eq!(cond["status"], "True");
    assert_eq!(cond["reason"], "SignerValidationFailure");
    assert_eq!(
        cond["message"],
        "subject common name does not begin with system:node:"
    );
    assert!(failed["status"]["certificate"].is_null(), "{failed:#}");

    // Approval conditions stay: a status write may not remove them.
    let mut sneaky = failed.clone();
    sneaky["metadata"]["name"] = json!(name);
    sneaky["status"]["conditions"] = json!([]);
    let sneaky: CertificateSigningRequest = serde_json::from_value(sneaky).expect("csr");
    let err = api
        .replace_status(&name, &PostParams::default(), &sneaky)
        .await
        .map(|_| ())
        .expect_err("removing conditions through status");
    assert_eq!(api_error(err).code, 422);
    let _ = api.delete(&name, &DeleteParams::default()).await;
    c.delete_namespace(&ns).await;
}
