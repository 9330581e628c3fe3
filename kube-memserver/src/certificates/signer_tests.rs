use base64::Engine;
use rcgen::{BasicConstraints, CertificateParams, DnType, KeyPair, KeyUsagePurpose};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::*;

fn request(cn: &str, orgs: &[&str], sans: Vec<SanType>) -> String {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, cn);
    // rcgen keeps one value per type: a second O goes in under the same OID as a custom type.
    for (i, o) in orgs.iter().enumerate() {
        let ty = match i {
            0 => DnType::OrganizationName,
            _ => DnType::CustomDnType(vec![2, 5, 4, 10]),
        };
        params.distinguished_name.push(ty, *o);
    }
    params.subject_alt_names = sans;
    params.serialize_request(&key).unwrap().pem().unwrap()
}

fn ip_san(ip: &str) -> SanType {
    SanType::IpAddress(ip.parse().unwrap())
}

fn dns_san(d: &str) -> SanType {
    SanType::DnsName(d.try_into().unwrap())
}

fn facts(pem: &str) -> RequestFacts {
    let der = request_der(pem.as_bytes()).unwrap();
    RequestFacts::of(&parse_request(&der).unwrap())
}

const SERVING: &[&str] = &["digital signature", "server auth"];

#[test]
fn kubelet_serving_requires_a_node_subject_ip_or_dns_sans_and_serving_usages() {
    let good = facts(&request(
        "system:node:n1",
        &["system:nodes"],
        vec![ip_san("10.0.0.1"), dns_san("n1")],
    ));
    assert_eq!(good.organizations, ["system:nodes"]);
    assert_eq!((good.ip_addresses, good.dns_names), (1, 1));
    assert_eq!(check(KUBELET_SERVING, &good, SERVING), Some(Ok(())));
    let with_rsa = ["key encipherment", "digital signature", "server auth"];
    assert_eq!(check(KUBELET_SERVING, &good, &with_rsa), Some(Ok(())));
    let err = |f: &RequestFacts, u: &[&str]| check(KUBELET_SERVING, f, u).unwrap().unwrap_err();
    assert_eq!(
        err(&good, &["digital signature", "server auth", "client auth"]),
        "usages did not match [digital signature key encipherment server auth]"
    );
    let wrong_org = facts(&request(
        "system:node:n1",
        &["other"],
        vec![ip_san("10.0.0.1")],
    ));
    assert_eq!(
        err(&wrong_org, SERVING),
        "subject organization is not system:nodes"
    );
    let wrong_cn = facts(&request("n1", &["system:nodes"], vec![ip_san("10.0.0.1")]));
    assert_eq!(
        err(&wrong_cn, SERVING),
        "subject common name does not begin with system:node:"
    );
    let no_san = facts(&request("system:node:n1", &["system:nodes"], vec![]));
    assert_eq!(
        err(&no_san, SERVING),
        "DNS or IP subjectAltName is required"
    );
    let email = facts(&request(
        "system:node:n1",
        &["system:nodes"],
        vec![
            ip_san("10.0.0.1"),
            SanType::Rfc822Name("a@b.c".try_into().unwrap()),
        ],
    ));
    assert_eq!(
        err(&email, SERVING),
        "Email subjectAltNames are not allowed"
    );
}

#[test]
fn kubelet_client_refuses_sans_and_apiserver_client_needs_client_auth() {
    let client = ["digital signature", "client auth"];
    let node = facts(&request("system:node:n1", &["system:nodes"], vec![]));
    assert_eq!(
        check(KUBE_APISERVER_CLIENT_KUBELET, &node, &client),
        Some(Ok(()))
    );
    let with_ip = facts(&request(
        "system:node:n1",
        &["system:nodes"],
        vec![ip_san("10.0.0.1")],
    ));
    assert_eq!(
        check(KUBE_APISERVER_CLIENT_KUBELET, &with_ip, &client),
        Some(Err("IP subjectAltNames are not allowed".into()))
    );
    let anyone = facts(&request("alice", &["devs"], vec![]));
    assert_eq!(check(KUBE_APISERVER_CLIENT, &anyone, &client), Some(Ok(())));
    assert_eq!(
        check(KUBE_APISERVER_CLIENT, &anyone, &["digital signature"]),
        Some(Err(
            "missing required usage for client certificate: client auth".into()
        ))
    );
    assert_eq!(
        check(
            KUBE_APISERVER_CLIENT,
            &anyone,
            &["client auth", "server auth"]
        ),
        Some(Err(
            "invalid usage for client certificate: server auth".into()
        ))
    );
    assert_eq!(check("example.com/other", &anyone, &client), None);
}

fn test_ca(valid_for: time::Duration) -> (ClusterSigner, X509Der) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "test-ca");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = OffsetDateTime::now_utc() - Duration::hours(1);
    params.not_after = OffsetDateTime::now_utc() + valid_for;
    let cert = params.self_signed(&key).unwrap();
    let signer = ClusterSigner::new(&cert.pem(), &key.serialize_pem()).unwrap();
    (signer, X509Der(cert.der().to_vec()))
}

struct X509Der(Vec<u8>);

fn approved_csr(pem: &str, signer: &str, usages: &[&str], exp: Option<i64>) -> Value {
    let mut csr = json!({
        "metadata": {"name": "c"},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(pem),
            "signerName": signer,
            "usages": usages,
        },
        "status": {"conditions": [{"type": "Approved", "status": "True"}]},
    });
    if let Some(e) = exp {
        csr["spec"]["expirationSeconds"] = json!(e);
    }
    csr
}

fn issued(d: Decision) -> Vec<u8> {
    let Decision::Issue(pem) = d else {
        panic!("expected a certificate, got {d:?}");
    };
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    assert_eq!(block.label, "CERTIFICATE");
    block.contents
}

#[test]
fn issued_certificates_chain_to_the_ca_with_the_requested_sans_usages_and_lifetime() {
    let (signer, ca) = test_ca(Duration::days(3650));
    let (_, ca_cert) = X509Certificate::from_der(&ca.0).unwrap();
    let pem = request(
        "system:node:n1",
        &["system:nodes"],
        vec![ip_san("10.254.254.1"), dns_san("n1.example")],
    );
    let now = OffsetDateTime::now_utc();
    let csr = approved_csr(&pem, KUBELET_SERVING, SERVING, Some(3600));
    let der = issued(decide(&signer, &csr, now).unwrap());
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    cert.verify_signature(Some(ca_cert.public_key())).unwrap();
    assert_eq!(cert.issuer(), ca_cert.subject());
    assert_eq!(
        cert.subject().to_string(),
        "O=system:nodes, CN=system:node:n1"
    );
    let san = cert.subject_alternative_name().unwrap().unwrap().value;
    assert!(
        san.general_names
            .contains(&GeneralName::IPAddress(&[10, 254, 254, 1]))
    );
    assert!(
        san.general_names
            .contains(&GeneralName::DNSName("n1.example"))
    );
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && !eku.client_auth);
    let ku = cert.key_usage().unwrap().unwrap().value;
    assert!(ku.digital_signature() && !ku.key_encipherment());
    assert!(!cert.basic_constraints().unwrap().unwrap().value.ca);
    // One hour is "short": NotAfter is not backdated; NotBefore is, by 5 minutes.
    let validity = cert.validity();
    let secs = |t: x509_parser::time::ASN1Time| t.timestamp() - now.unix_timestamp();
    assert!((secs(validity.not_after) - 3600).abs() <= 1);
    assert!((secs(validity.not_before) + 300).abs() <= 1);

    // No expirationSeconds: a year, backdated by 5 minutes.
    let csr = approved_csr(&pem, KUBELET_SERVING, SERVING, None);
    let (_, cert) = X509Certificate::from_der(&issued(decide(&signer, &csr, now).unwrap()))
        .map(|(r, c)| (r, c.validity().not_after))
        .unwrap();
    assert!((secs(cert) - (365 * 86400 - 300)).abs() <= 1);
}

#[test]
fn certificates_never_outlive_the_ca() {
    let (signer, ca) = test_ca(Duration::days(1));
    let (_, ca_cert) = X509Certificate::from_der(&ca.0).unwrap();
    let pem = request("alice", &["devs", "ops"], vec![]);
    let csr = approved_csr(&pem, KUBE_APISERVER_CLIENT, &["client auth"], None);
    let der = issued(decide(&signer, &csr, OffsetDateTime::now_utc()).unwrap());
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    assert_eq!(cert.validity().not_after, ca_cert.validity().not_after);
    cert.verify_signature(Some(ca_cert.public_key())).unwrap();
    // Every group of a client certificate is kept, in Go's order (O before CN).
    assert_eq!(cert.subject().to_string(), "O=devs, O=ops, CN=alice");
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.client_auth && !eku.server_auth);
}

#[test]
fn only_approved_pending_requests_for_these_signers_are_acted_on() {
    let (signer, _) = test_ca(Duration::days(10));
    let now = OffsetDateTime::now_utc();
    let pem = request(
        "system:node:n1",
        &["system:nodes"],
        vec![ip_san("10.0.0.1")],
    );
    let base = approved_csr(&pem, KUBELET_SERVING, SERVING, None);
    let with_conditions = |c: Value| {
        let mut v = base.clone();
        v["status"]["conditions"] = c;
        v
    };
    let ignored = |csr: &Value| decide(&signer, csr, now).unwrap() == Decision::Ignore;
    assert!(!ignored(&base));
    assert!(ignored(&with_conditions(json!([]))));
    assert!(ignored(&with_conditions(
        json!([{"type": "Approved", "status": "True"}, {"type": "Denied", "status": "True"}])
    )));
    assert!(ignored(&with_conditions(
        json!([{"type": "Approved", "status": "True"}, {"type": "Failed", "status": "True"}])
    )));
    let mut done = base.clone();
    done["status"]["certificate"] = json!("Y2VydA==");
    assert!(ignored(&done));
    let mut other = base.clone();
    other["spec"]["signerName"] = json!("example.com/signer");
    assert!(ignored(&other));
    let wrong = approved_csr(
        &request("n1", &["system:nodes"], vec![ip_san("10.0.0.1")]),
        KUBELET_SERVING,
        SERVING,
        None,
    );
    assert_eq!(
        decide(&signer, &wrong, now).unwrap(),
        Decision::Fail("subject common name does not begin with system:node:".into())
    );
}

#[test]
fn usages_map_to_key_usages_and_sorted_extended_usages() {
    let (ku, eku) =
        key_usages(&["client auth", "signing", "server auth", "key encipherment"]).unwrap();
    assert_eq!(
        ku,
        [
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment
        ]
    );
    assert_eq!(
        eku,
        [
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth
        ]
    );
    assert_eq!(
        key_usages(&["bogus"]).unwrap_err(),
        "unrecognized usage values: [\"bogus\"]"
    );
    assert_eq!(lifetime(Some(1)), MIN_TTL);
    assert_eq!(lifetime(Some(i64::MAX / 1_000_000_000)), CERT_TTL);
}
