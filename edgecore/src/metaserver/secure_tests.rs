//! The MetaServer with `requireAuthorization`: HTTPS with a certificate obtained through a
//! fake cloud that answers `k8s/ca.crt` and the CSR messages as cloudcore does (signed by a
//! test CA), bearer tokens the edge obtained, RBAC rules from a stored ServiceAccountAccess.

use super::*;
use crate::edgehub::HubError;
use crate::metamanager::{MetaRecord, tokens};
use base64::Engine;
use kubeedge_shared::pki::CertificateAuthority;
use kubeedge_shared::{Message, Operation};
use serde_json::{Value, json};
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::broadcast;

#[derive(Clone)]
struct CloudFake {
    ca: Arc<CertificateAuthority>,
    /// The PEM CSR of the last insert.
    csr: Arc<Mutex<Option<String>>>,
    seen: Arc<Mutex<Vec<(Operation, String)>>>,
    events: broadcast::Sender<LinkEvent>,
}

impl CloudLink for CloudFake {
    fn is_connected(&self) -> bool {
        true
    }
    async fn send(&self, _msg: Message) -> Result<(), HubError> {
        Ok(())
    }
    async fn request(&self, msg: Message, _timeout: Duration) -> Result<Message, HubError> {
        let resource = msg.route.resource.clone();
        self.seen
            .lock()
            .unwrap()
            .push((msg.route.operation.clone(), resource.clone()));
        let content = match (&msg.route.operation, resource.as_str()) {
            (Operation::Query, "k8s/ca.crt") => Value::String(self.ca.cert.cert_pem.clone()),
            (Operation::Insert, _) => {
                let b64 = msg.content["spec"]["request"].as_str().unwrap_or_default();
                let pem = base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .unwrap();
                *self.csr.lock().unwrap() = Some(String::from_utf8(pem).unwrap());
                let mut obj = msg.content.clone();
                obj["metadata"] = json!({"name": "csr-abcde"});
                json!({"Object": obj, "Err": {"ErrStatus": {"metadata": {}}}})
            }
            (Operation::Query, "default/certificatesigningrequest/csr-abcde") => {
                let csr = self.csr.lock().unwrap().clone().unwrap();
                let cert = self.ca.sign_serving_csr_pem(&csr, 30).unwrap();
                json!({"metadata": {"name": "csr-abcde"},
                       "status": {"conditions": [{"type": "Approved", "status": "True"}],
                                  "certificate": base64::engine::general_purpose::STANDARD.encode(cert)}})
            }
            _ => json!({"kind": "Status", "status": "Failure", "code": 404, "message": "no"}),
        };
        Ok(Message::new(
            "edgecontroller",
            kubeedge_shared::Group::Resource,
            Operation::Response,
            resource,
            content,
        )
        .with_parent(msg.header.id.clone()))
    }
    fn subscribe(&self) -> broadcast::Receiver<LinkEvent> {
        self.events.subscribe()
    }
}

const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

fn jwt(ns: &str, sa: &str, pod: &str, uid: &str) -> String {
    let e = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let claims = json!({"iss": ISSUER, "aud": [ISSUER], "exp": now + 3600, "nbf": now - 5,
        "sub": format!("system:serviceaccount:{ns}:{sa}"),
        "kubernetes.io": {"namespace": ns, "serviceaccount": {"name": sa, "uid": "sa-uid"},
                          "pod": {"name": pod, "uid": uid}}});
    format!("{}.{}.c2ln", e(&json!({"alg": "RS256"})), e(&claims))
}

/// One HTTPS/1.1 GET trusting `ca_pem`, to `addr` by IP; the whole response as text.
async fn https(addr: SocketAddr, ca_pem: &str, path: &str, token: Option<&str>) -> String {
    https_request(addr, ca_pem, "GET", path, token, "").await
}

/// One HTTPS/1.1 request trusting `ca_pem`, to `addr` by IP; the whole response as text.
async fn https_request(
    addr: SocketAddr,
    ca_pem: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> String {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_bytes()) {
        let c: rustls_pki_types::CertificateDer<'static> = c.unwrap();
        roots.add(c).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
    let mut s = connector.connect(name, tcp).await.expect("TLS handshake");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n{auth}\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn code(resp: &str) -> u16 {
    resp.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn pods_reach_it_over_https_with_their_token_and_rbac_decides() {
    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(dir.path().join("edge.db")).await.unwrap();
    let ca = Arc::new(CertificateAuthority::generate().unwrap());
    let link = CloudFake {
        ca: ca.clone(),
        csr: Arc::default(),
        seen: Arc::default(),
        events: broadcast::channel(4).0,
    };
    let pki_dir = dir.path().join("pki");
    let config = MetaServerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        node: "edge-1".into(),
        remote_timeout: Duration::from_secs(1),
        bookmark_interval: Duration::from_secs(60),
        limits: Limits::default(),
        secure: Some(SecureConfig {
            dummy: None,
            create_dummy_link: false,
            pki_dir: pki_dir.clone(),
            auth: auth::AuthConfig {
                issuers: vec![ISSUER.into()],
                audiences: Vec::new(),
                keys: Default::default(),
            },
        }),
        serve: true,
        standing: Vec::new(),
        held_pods: None,
        confirm_upgrade: None,
    };
    let server = MetaServer::start(config.clone(), store.clone(), link.clone())
        .await
        .unwrap();
    let addr = server.local_addr();
    let ca_pem = ca.cert.cert_pem.clone();
    // The certificate arrives through the cloud; until then handshakes fail.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !pki_dir.join("metaserver-current.pem").exists() {
        assert!(tokio::time::Instant::now() < deadline, "no certificate");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let csr = link.csr.lock().unwrap().clone().unwrap();
    let asked = kubeedge_shared::pki::inspect_csr_pem(&csr).unwrap();
    assert_eq!(asked.common_name.as_deref(), Some("system:node:edge-1"));
    assert_eq!(asked.ips, vec![std::net::IpAddr::from([127, 0, 0, 1])]);
    assert!(
        link.seen
            .lock()
            .unwrap()
            .iter()
            .any(|(_, r)| r == "k8s/ca.crt")
    );
    assert_eq!(
        std::fs::read_to_string(pki_dir.join("ca.crt")).unwrap(),
        ca_pem
    );

    // Discovery is open; resources are not, for anonymous callers.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(code(&https(addr, &ca_pem, "/version", None).await), 200);
    let r = https(addr, &ca_pem, "/api/v1/namespaces/ns/pods", None).await;
    assert_eq!(code(&r), 403, "{r}");

    // A token the edge obtained for a pod it runs.
    let token = jwt("ns", "reader", "app", "pod-uid");
    let answer = json!({"spec": {"boundObjectRef": {"kind": "Pod", "name": "app", "uid": "pod-uid"}},
                        "status": {"token": token, "expirationTimestamp": "2999-01-01T00:00:00Z"}});
    tokens::remember(&store, tokens::record_of("ns", "reader", &answer).unwrap())
        .await
        .unwrap();
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "app", "namespace": "ns", "uid": "pod-uid", "resourceVersion": "3"},
        "spec": {"nodeName": "edge-1", "serviceAccountName": "reader"}});
    store
        .upsert(MetaRecord::new("ns/pod/app", "pod", pod.to_string()))
        .await
        .unwrap();
    // No rules yet: forbidden, in the apiserver's words.
    let r = https(addr, &ca_pem, "/api/v1/namespaces/ns/pods", Some(&token)).await;
    assert_eq!(code(&r), 403, "{r}");
    assert!(
        r.contains(r#"User \"system:serviceaccount:ns:reader\" cannot list resource \"pods\""#),
        "{r}"
    );
    // The cloud's ServiceAccountAccess: a Role allowing pods get/list in ns.
    let saa = json!({"apiVersion": "policy.kubeedge.io/v1alpha1", "kind": "ServiceAccountAccess",
        "metadata": {"name": "reader", "namespace": "ns"},
        "spec": {"serviceAccount": {"metadata": {"name": "reader", "namespace": "ns"}},
                 "accessRoleBinding": [{"roleBinding": {"metadata": {"name": "rb", "namespace": "ns"},
                     "roleRef": {"kind": "Role", "name": "pod-reader"},
                     "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "ns"}]},
                     "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]}]}});
    store
        .upsert(MetaRecord::new(
            "ns/serviceaccountaccess/reader",
            "serviceaccountaccess",
            saa.to_string(),
        ))
        .await
        .unwrap();
    let r = https(addr, &ca_pem, "/api/v1/namespaces/ns/pods", Some(&token)).await;
    assert_eq!(code(&r), 200, "{r}");
    assert!(r.contains("\"app\""), "{r}");
    let r = https(addr, &ca_pem, "/api/v1/namespaces/ns/secrets", Some(&token)).await;
    assert_eq!(code(&r), 403, "{r}");
    let r = https(addr, &ca_pem, "/api/v1/namespaces/other/pods", Some(&token)).await;
    assert_eq!(code(&r), 403, "{r}");
    // unhold-upgrade is a create of pods named `unhold-upgrade`: RBAC decides it too.
    let unhold = "/api/v1/namespaces/ns/pods/unhold-upgrade";
    let r = https_request(addr, &ca_pem, "POST", unhold, None, "ns/app").await;
    assert_eq!(code(&r), 403, "{r}");
    let r = https_request(addr, &ca_pem, "POST", unhold, Some(&token), "ns/app").await;
    assert_eq!(code(&r), 403, "{r}");
    assert!(
        r.contains(r#"cannot create resource \"pods\" in API group \"\" in the namespace \"ns\""#),
        "{r}"
    );
    let mut unholder = saa.clone();
    unholder["spec"]["accessRoleBinding"][0]["rules"]
        .as_array_mut()
        .unwrap()
        .push(
            json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["create"],
                     "resourceNames": ["unhold-upgrade"]}),
        );
    store
        .upsert(MetaRecord::new(
            "ns/serviceaccountaccess/reader",
            "serviceaccountaccess",
            unholder.to_string(),
        ))
        .await
        .unwrap();
    let r = https_request(addr, &ca_pem, "POST", unhold, Some(&token), "ns/app").await;
    assert_eq!(code(&r), 400, "allowed, then checked: {r}");
    assert!(
        r.contains("is not marked with the edge.kubeedge.io/hold-upgrade"),
        "{r}"
    );
    // A token this edge did not obtain.
    let stranger = jwt("ns", "reader", "app", "other-uid");
    let r = https(addr, &ca_pem, "/api/v1/namespaces/ns/pods", Some(&stranger)).await;
    assert_eq!(code(&r), 401, "{r}");
    server.shutdown().await;

    // A stored certificate that does not name the configured addresses is replaced at once;
    // one that does is renewed at 80 % of its life.
    let same = serving::ServingCert::new(pki_dir.clone(), &[[127, 0, 0, 1].into()]);
    assert!(same.renew_at() > time::OffsetDateTime::now_utc().unix_timestamp());
    let moved = serving::ServingCert::new(pki_dir.clone(), &[[169, 254, 30, 10].into()]);
    assert_eq!(moved.renew_at(), 0);

    // Restarted with the cloud unreachable: the stored certificate is served at once.
    let offline = super::tests::FakeLink::new(false);
    let server = MetaServer::start(config, store.clone(), offline)
        .await
        .unwrap();
    let r = https(
        server.local_addr(),
        &ca_pem,
        "/api/v1/namespaces/ns/pods",
        Some(&token),
    )
    .await;
    assert_eq!(code(&r), 200, "{r}");
    server.shutdown().await;
}
