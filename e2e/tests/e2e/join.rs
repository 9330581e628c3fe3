//! Node join (protocol §6): the join token in Secret `tokensecret`, the certificate server
//! (`/ca.crt`, `/edge.crt`) over real TLS on loopback, and edgecore's certificate bootstrap
//! with only a token, then a real cloudhub session with the certificate it obtained.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use cloudcore::join::JoinMetrics;
use cloudcore::join::{self as server, JoinServer};
use e2e::channel::*;
use edgecore::certmanager::{self, CertError, CertPaths};
use hmac::Mac;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kubeedge_shared::pki::CertificateAuthority;
use kubeedge_shared::{pki, tls, token};
use sha2::Digest;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const REFRESH: Duration = Duration::from_secs(12 * 3600);

struct Join {
    pki: Pki,
    url: String,
    metrics: JoinMetrics,
    shutdown: CancellationToken,
    dir: tempfile::TempDir,
}

impl Drop for Join {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Join {
    async fn start() -> Join {
        let pki = Pki::new().unwrap();
        let ca = CertificateAuthority::from_der(&pki.ca.cert.cert_der, &pki.ca.key_der).unwrap();
        let tls = server::tls_config(&ca, vec![pki.server.cert_der.clone()], pki.server.key_der())
            .unwrap();
        let metrics = JoinMetrics::default();
        let shutdown = CancellationToken::new();
        let join = Arc::new(JoinServer {
            ca: Arc::new(ca),
            signing_days: 365,
            allow_legacy_certificates: false,
            metrics: metrics.clone(),
        });
        let addr = server::serve(([127, 0, 0, 1], 0).into(), tls, join, shutdown.clone())
            .await
            .unwrap();
        Join {
            pki,
            url: format!("https://127.0.0.1:{}", addr.port()),
            metrics,
            shutdown,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn paths(&self, node: &str) -> CertPaths {
        let d = self.dir.path().join(node);
        CertPaths {
            ca_file: d.join("ca/rootCA.crt").display().to_string(),
            cert_file: d.join("certs/server.crt").display().to_string(),
            key_file: d.join("certs/server.key").display().to_string(),
            http_server: self.url.clone(),
            node_name: node.to_string(),
        }
    }

    fn token(&self, exp_in: i64) -> String {
        token::generate(
            &self.pki.ca.cert.cert_der,
            &self.pki.ca.key_der,
            now() + exp_in,
        )
    }

    fn refused(&self, reason: &'static str) -> u64 {
        self.metrics
            .certificates_refused
            .get_or_create(&cloudcore::join::RefusalLabel { reason })
            .get()
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// KubeEdge's algorithm written out independently of `kubeedge_shared::token`:
/// hex(sha256(CA DER)) + "." + base64url(header) + "." + base64url(claims) + "." + HS256.
fn go_token(ca_der: &[u8], key_der: &[u8], exp: i64) -> String {
    let hash: String = sha2::Sha256::digest(ca_der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(format!(r#"{{"exp":{exp}}}"#))
    );
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key_der).unwrap();
    mac.update(input.as_bytes());
    let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{hash}.{input}.{sig}")
}

fn refused_status(r: Result<(), CertError>) -> u16 {
    match r {
        Err(CertError::Refused { status, .. }) => status.as_u16(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn edge_with_only_a_token_joins_and_connects_to_cloudhub() {
    e2e::edge::init_logs();
    let j = Join::start().await;
    let node = "join-edge-1";
    let (hub, _up, hub_metrics) = start_hub(&j.pki, test_hub_config()).await.unwrap();

    // An edgecore.yaml with a token and no certificates, as keadm join writes it.
    let paths = j.paths(node);
    let mut config = edgecore::config::EdgeCoreConfig::default_config();
    config.modules.edged.hostname_override = node.into();
    let hub_cfg = &mut config.modules.edge_hub;
    hub_cfg.tls_ca_file = paths.ca_file.clone();
    hub_cfg.tls_cert_file = paths.cert_file.clone();
    hub_cfg.tls_private_key_file = paths.key_file.clone();
    hub_cfg.http_server = j.url.clone();
    // Built by the Go algorithm, not by our token module.
    hub_cfg.token = go_token(&j.pki.ca.cert.cert_der, &j.pki.ca.key_der, now() + 3600);
    let config_path = j.dir.path().join("edgecore.yaml");
    std::fs::write(&config_path, config.to_yaml().unwrap()).unwrap();
    assert!(
        std::fs::read_to_string(&config_path)
            .unwrap()
            .contains(&config.modules.edge_hub.token)
    );

    certmanager::bootstrap_if_needed(&config, Some(&config_path), Duration::from_secs(20))
        .await
        .unwrap();

    let cert = tls::load_certs(Path::new(&paths.cert_file)).unwrap();
    assert_eq!(
        tls::common_name(&cert[0]).as_deref(),
        Some("system:node:join-edge-1")
    );
    let ca = tls::load_certs(Path::new(&paths.ca_file)).unwrap();
    assert_eq!(ca[0], j.pki.ca.cert.cert_der);
    let key_text = std::fs::read_to_string(&paths.key_file).unwrap();
    assert!(key_text.starts_with("-----BEGIN EC PRIVATE KEY-----"));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&paths.key_file)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let (nb, na) = pki::cert_validity(&cert[0]).unwrap();
    assert!((na - nb) / 86_400 >= 365);
    assert_eq!(j.metrics.certificates_issued.get(), 1);

    // The token is gone from the file, and a restart does not need it.
    let reloaded = edgecore::config::EdgeCoreConfig::load(&config_path).unwrap();
    assert_eq!(reloaded.modules.edge_hub.token, "");
    certmanager::bootstrap_if_needed(&reloaded, None, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(j.metrics.certificates_issued.get(), 1);

    // The certificate opens a cloudhub session.
    let tls = edgecore::app::load_tls(&reloaded).unwrap();
    let (edge, _rx) =
        edgecore::edgehub::EdgeHub::start(test_edge_config(hub.local_addr(), node), tls);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !(edge.is_connected() && hub_metrics.connected_nodes.get() == 1) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "edge did not connect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Rotation: the current certificate as client certificate, no token.
    certmanager::rotate(&paths).await.unwrap();
    let rotated = tls::load_certs(Path::new(&paths.cert_file)).unwrap();
    assert_ne!(rotated[0], cert[0]);
    assert_eq!(
        tls::common_name(&rotated[0]).as_deref(),
        Some("system:node:join-edge-1")
    );
    assert_eq!(j.metrics.certificates_issued.get(), 2);
    edge.set_tls_config(edgecore::app::load_tls(&reloaded).unwrap());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !edge.is_connected() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reconnect with the rotated cert"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    edge.shutdown();
    hub.shutdown();
}

#[tokio::test]
async fn bad_tokens_are_refused_with_clear_errors() {
    e2e::edge::init_logs();
    let j = Join::start().await;
    let paths = j.paths("join-bad");
    let hash = token::ca_hash(&j.pki.ca.cert.cert_der);

    // Signed by another CA's key (right hash): 400.
    let other = CertificateAuthority::generate().unwrap();
    let wrong = format!("{hash}.{}", token::sign_jwt(&other.key_der, now() + 3600));
    let err = certmanager::bootstrap(&paths, &wrong).await;
    let msg = format!("{}", err.as_ref().unwrap_err());
    assert!(msg.contains("keadm gettoken"), "{msg}");
    assert_eq!(refused_status(err), 400);
    // Expired: 400.
    assert_eq!(
        refused_status(certmanager::bootstrap(&paths, &j.token(-10)).await),
        400
    );
    // Tampered claims (a later exp with the old signature): 400.
    let good = j.token(3600);
    let parts: Vec<&str> = good.split('.').collect();
    let forged_claims = URL_SAFE_NO_PAD.encode(format!(r#"{{"exp":{}}}"#, now() + 999_999));
    let forged = format!("{}.{}.{}.{}", parts[0], parts[1], forged_claims, parts[3]);
    assert_eq!(
        refused_status(certmanager::bootstrap(&paths, &forged).await),
        400
    );
    assert_eq!(j.refused("token_signature"), 2);
    assert_eq!(j.refused("token_expired"), 1);
    assert!(!Path::new(&paths.cert_file).exists());

    // Raw requests: no Authorization → 401; unparseable CSR → 400 with a message.
    let ca = j.pki.ca.cert.cert_der.clone();
    let cfg = certmanager::verified_config(&ca, None).unwrap();
    let node = ("NodeName", "join-bad".to_string());
    let (status, _) = certmanager::https_get(
        &j.url,
        "/edge.crt",
        cfg.clone(),
        std::slice::from_ref(&node),
        vec![1, 2],
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(status.as_u16(), 401);
    let (_, jwt) = token::split(&good).unwrap();
    let bearer = ("Authorization", format!("Bearer {jwt}"));
    let (status, body) = certmanager::https_get(
        &j.url,
        "/edge.crt",
        cfg.clone(),
        &[node.clone(), bearer.clone()],
        b"not a csr".to_vec(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(status.as_u16(), 400);
    assert!(String::from_utf8_lossy(&body).contains("PKCS#10"));
    // A CSR naming another node: the certificate names the NodeName the token let in.
    let (csr, _) = pki::node_csr("someone-else").unwrap();
    let (status, body) = certmanager::https_get(
        &j.url,
        "/edge.crt",
        cfg.clone(),
        &[node, bearer.clone()],
        csr.clone(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(status.as_u16(), 200);
    let cert = rustls_pki_types::CertificateDer::from(body.to_vec());
    assert_eq!(
        tls::common_name(&cert).as_deref(),
        Some("system:node:join-bad")
    );
    // A NodeName that cannot be a node's name → 400.
    let (status, body) = certmanager::https_get(
        &j.url,
        "/edge.crt",
        cfg.clone(),
        &[("NodeName", "Not/A_Node".to_string()), bearer],
        csr,
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(status.as_u16(), 400);
    assert!(String::from_utf8_lossy(&body).contains("not a valid node name"));
    assert_eq!(j.metrics.certificates_issued.get(), 1);
}

/// A KubeEdge ≤ v1.15 edge puts `O=kubeEdge, CN=kubeedge.io` in every CSR; with default
/// settings it must still get a certificate cloudhub accepts (its own node's identity).
#[tokio::test]
async fn kubeedge_v1_15_csr_gets_the_node_identity_and_cloudhub_accepts_it() {
    e2e::edge::init_logs();
    let j = Join::start().await;
    let node = "kubeedge-115";
    let ca = j.pki.ca.cert.cert_der.clone();
    let cfg = certmanager::verified_config(&ca, None).unwrap();
    let token = j.token(3600);
    let (_, jwt) = token::split(&token).unwrap();
    let (csr, key) = pki::legacy_kubeedge_csr().unwrap();
    assert_eq!(
        pki::csr_subject(&csr).unwrap().common_name.as_deref(),
        Some("kubeedge.io")
    );
    // As KubeEdge's certmanager sends it: a GET with the DER CSR as body, the token's JWT
    // as bearer, NodeName, and no ExtKeyUsages header.
    let (status, body) = certmanager::https_get(
        &j.url,
        "/edge.crt",
        cfg,
        &[
            ("NodeName", node.to_string()),
            ("Authorization", format!("Bearer {jwt}")),
        ],
        csr,
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(status.as_u16(), 200, "{}", String::from_utf8_lossy(&body));
    let cert = rustls_pki_types::CertificateDer::from(body.to_vec());
    assert_eq!(
        tls::common_name(&cert).as_deref(),
        Some("system:node:kubeedge-115")
    );

    // Default cloudhub settings (no allowLegacyCertificates): the session opens.
    let (hub, _up, hub_metrics) = start_hub(&j.pki, test_hub_config()).await.unwrap();
    assert!(!test_hub_config().allow_legacy_cn);
    let key = rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
    let edge_tls = tls::client_config(std::slice::from_ref(&ca), vec![cert], key).unwrap();
    let mut edge = RawEdge::connect(hub.local_addr(), node, edge_tls.clone())
        .await
        .expect("cloudhub accepts the certificate issued for a KubeEdge CSR");
    edge.keepalive().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while hub_metrics.connected_nodes.get() != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the KubeEdge edge's session did not open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(hub.is_connected(node));
    // The same certificate cannot speak for another node.
    let refused = RawEdge::connect(hub.local_addr(), "another-node", edge_tls)
        .await
        .err()
        .expect("a certificate of one node does not open another node's session");
    assert!(refused.contains("403"), "{refused}");
    hub.shutdown();
}

#[tokio::test]
async fn token_for_another_ca_is_refused_before_the_csr_is_sent() {
    e2e::edge::init_logs();
    let j = Join::start().await;
    let paths = j.paths("join-other-ca");
    let other = CertificateAuthority::generate().unwrap();
    let t = token::generate(&other.cert.cert_der, &other.key_der, now() + 3600);
    let err = certmanager::bootstrap(&paths, &t).await.unwrap_err();
    assert!(matches!(err, CertError::CaMismatch { .. }), "{err:?}");
    assert!(
        err.to_string().contains(
            "token does not match the cloud's CA — get a fresh token with keadm gettoken"
        )
    );
    assert_eq!(j.metrics.ca_downloads.get(), 1);
    assert_eq!(j.metrics.certificates_issued.get(), 0);
    assert_eq!(j.refused("token_signature") + j.refused("no_token"), 0);
    assert!(!Path::new(&paths.ca_file).exists());
}

#[tokio::test]
async fn a_node_certificate_cannot_obtain_another_nodes_certificate() {
    e2e::edge::init_logs();
    let j = Join::start().await;
    let a = j.paths("node-a");
    certmanager::bootstrap(&a, &j.token(3600)).await.unwrap();
    // Node B's paths with node A's files.
    let mut b = a.clone();
    b.node_name = "node-b".into();
    assert_eq!(refused_status(certmanager::rotate(&b).await), 401);
    assert_eq!(j.refused("client_cert_node"), 1);
    // A certificate from another CA does not get past TLS.
    let other = Pki::new().unwrap();
    let foreign = other.node_cert("node-a").unwrap();
    let cfg = certmanager::verified_config(
        &j.pki.ca.cert.cert_der,
        Some((vec![foreign.cert_der.clone()], foreign.key_der())),
    )
    .unwrap();
    let (csr, _) = pki::node_csr("node-a").unwrap();
    let r = certmanager::https_get(
        &j.url,
        "/edge.crt",
        cfg,
        &[("NodeName", "node-a".into())],
        csr,
        Duration::from_secs(5),
    )
    .await;
    assert!(r.is_err() || r.unwrap().0.as_u16() == 401);
    assert_eq!(j.metrics.certificates_issued.get(), 1);
}

#[tokio::test]
async fn token_secret_is_written_once_by_racing_replicas_and_verifies() {
    e2e::edge::init_logs();
    let cluster = e2e::cluster::connect().await.unwrap();
    let ns = cluster.temp_namespace("join").await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(cluster.client(), &ns);
    let pki = Pki::new().unwrap();
    let (m1, m2) = (JoinMetrics::default(), JoinMetrics::default());
    let (r1, r2) = tokio::join!(
        cloudcore::join::ensure_token_secret(&secrets, &pki.ca, REFRESH, &m1),
        cloudcore::join::ensure_token_secret(&secrets, &pki.ca, REFRESH, &m2),
    );
    let ((t1, due1), (t2, _)) = (r1.unwrap(), r2.unwrap());
    assert_eq!(t1, t2, "both replicas use the one token");
    assert_eq!(m1.tokens_written.get() + m2.tokens_written.get(), 1);
    assert!(due1 <= REFRESH && due1 > REFRESH - Duration::from_secs(60));
    let rv = secrets
        .get("tokensecret")
        .await
        .unwrap()
        .metadata
        .resource_version;
    // Later checks within the period leave it alone.
    let (t3, _) = cloudcore::join::ensure_token_secret(&secrets, &pki.ca, REFRESH, &m1)
        .await
        .unwrap();
    assert_eq!(t3, t1);
    assert_eq!(
        secrets
            .get("tokensecret")
            .await
            .unwrap()
            .metadata
            .resource_version,
        rv
    );

    // Golden format: 4 parts, golang-jwt's header, an exp claim of now + 2 × refresh.
    let parts: Vec<&str> = t1.split('.').collect();
    assert_eq!(parts.len(), 4);
    assert_eq!(parts[0], token::ca_hash(&pki.ca.cert.cert_der));
    assert_eq!(
        URL_SAFE_NO_PAD.decode(parts[1]).unwrap(),
        br#"{"alg":"HS256","typ":"JWT"}"#
    );
    let claims: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[2]).unwrap()).unwrap();
    let exp = claims["exp"].as_i64().unwrap();
    assert!((exp - now() - 2 * REFRESH.as_secs() as i64).abs() < 60);
    // Byte for byte what KubeEdge computes with the SEC1 key.
    assert_eq!(t1, go_token(&pki.ca.cert.cert_der, &pki.ca.key_der, exp));

    // A token of another CA (or one nearly due) is replaced, once.
    let other = Pki::new().unwrap();
    let (t4, _) = cloudcore::join::ensure_token_secret(&secrets, &other.ca, REFRESH, &m2)
        .await
        .unwrap();
    assert_ne!(t4, t1);
    assert_eq!(m2.tokens_written.get() + m1.tokens_written.get(), 2);
    cluster.delete_namespace(&ns).await;
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// cloudcore as its binary runs it (`app::run`: CA in Secret casecret, token in tokensecret,
/// cloudhub and the certificate server) and edgecore as its binary starts (bootstrap with
/// only the token, then `EdgeCore::start`).
#[tokio::test]
async fn edgecore_joins_a_running_cloudcore_with_the_token_from_tokensecret() {
    e2e::edge::init_logs();
    let Some(cluster) = e2e::cluster::connect_in_memory_only(
        e2e::apiserver::Config::for_tests(),
        "its own kubeedge namespace",
    )
    .await
    .unwrap() else {
        return;
    };
    let client = cluster.client();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let mut ns = k8s_openapi::api::core::v1::Namespace::default();
    ns.metadata.name = Some("kubeedge".into());
    let _ = namespaces.create(&Default::default(), &ns).await;

    let dir = tempfile::tempdir().unwrap();
    let (ws_port, https_port) = (free_port(), free_port());
    let mut cfg = cloudcore::config::CloudCoreConfig::default();
    cfg.kube_api_config.kube_config = cluster.kubeconfig().display().to_string();
    cfg.common_config.monitor_server.bind_address = String::new();
    let hub = &mut cfg.modules.cloud_hub;
    for (f, name) in [
        (&mut hub.tls_ca_file, "rootCA.crt"),
        (&mut hub.tls_ca_key_file, "rootCA.key"),
        (&mut hub.tls_cert_file, "server.crt"),
        (&mut hub.tls_private_key_file, "server.key"),
    ] {
        *f = dir.path().join("cloud").join(name).display().to_string();
    }
    hub.advertise_address = vec!["127.0.0.1".into()];
    hub.websocket.address = "127.0.0.1".into();
    hub.websocket.port = ws_port;
    hub.https.address = "127.0.0.1".into();
    hub.https.port = https_port;
    let shutdown = CancellationToken::new();
    let cloud = tokio::spawn(cloudcore::app::run(cfg, shutdown.clone()));

    // keadm gettoken: the Secret's tokendata.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kubeedge");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let token = loop {
        if let Some(s) = secrets.get_opt("tokensecret").await.unwrap()
            && let Some(t) = s.data.and_then(|d| d.get("tokendata").cloned())
        {
            break String::from_utf8(t.0).unwrap();
        }
        assert!(!cloud.is_finished(), "cloudcore stopped: {:?}", cloud.await);
        assert!(tokio::time::Instant::now() < deadline, "no token");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The CA key is stored as SEC1 and the token is KubeEdge's for it.
    let ca = secrets.get("casecret").await.unwrap().data.unwrap();
    let (ca_der, key_der) = (&ca["cadata"].0, &ca["cakeydata"].0);
    assert_eq!(&key_der[..7], &[0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20]);
    let exp = token::jwt_expiry(token::split(&token).unwrap().1).unwrap();
    assert_eq!(token, go_token(ca_der, key_der, exp));

    let node = "join-app-edge";
    let edge_dir = dir.path().join("edge");
    let mut config = edgecore::config::EdgeCoreConfig::default_config();
    config.modules.edged.enable = false;
    config.modules.edged.hostname_override = node.into();
    config.database.data_source = edge_dir.join("edgecore.db").display().to_string();
    config.modules.device_twin.dmi_sock_path = edge_dir.display().to_string();
    let eh = &mut config.modules.edge_hub;
    eh.tls_ca_file = edge_dir.join("ca/rootCA.crt").display().to_string();
    eh.tls_cert_file = edge_dir.join("certs/server.crt").display().to_string();
    eh.tls_private_key_file = edge_dir.join("certs/server.key").display().to_string();
    eh.http_server = format!("https://127.0.0.1:{https_port}");
    eh.websocket.server = format!("127.0.0.1:{ws_port}");
    eh.token = token;
    certmanager::bootstrap_if_needed(&config, None, Duration::from_secs(20))
        .await
        .unwrap();
    let cert = tls::load_certs(Path::new(&config.modules.edge_hub.tls_cert_file)).unwrap();
    assert_eq!(
        tls::common_name(&cert[0]).as_deref(),
        Some("system:node:join-app-edge")
    );
    let edge = edgecore::app::EdgeCore::start_with(&config, None)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !edge.hub().is_connected() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "edgecore did not connect to cloudcore"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    edge.shutdown().await;
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), cloud).await;
}

/// `edgecore join`: writes a keadm-layout edgecore.yaml, joins, and leaves no token behind.
#[tokio::test]
async fn edgecore_join_writes_the_config_and_obtains_the_certificate() {
    e2e::edge::init_logs();
    let j = Join::start().await;
    let paths = j.paths("join-cmd");
    let mut base = edgecore::config::EdgeCoreConfig::default_config();
    base.modules.edge_hub.tls_ca_file = paths.ca_file.clone();
    base.modules.edge_hub.tls_cert_file = paths.cert_file.clone();
    base.modules.edge_hub.tls_private_key_file = paths.key_file.clone();
    let port = j.url.rsplit(':').next().unwrap().parse().unwrap();
    let opts = certmanager::JoinOptions {
        cloudcore_ipport: "127.0.0.1:10000".into(),
        token: j.token(3600),
        edgenode_name: Some("join-cmd".into()),
        certport: port,
        remote_runtime_endpoint: None,
        no_service: true,
    };
    let config = certmanager::join_config(&opts, base).unwrap();
    let path = j.dir.path().join("config/edgecore.yaml");
    certmanager::join_node(&config, &path, Duration::from_secs(20))
        .await
        .unwrap();
    let written = edgecore::config::EdgeCoreConfig::load(&path).unwrap();
    assert_eq!(written.modules.edge_hub.token, "");
    assert_eq!(written.modules.edge_hub.websocket.server, "127.0.0.1:10000");
    assert_eq!(written.modules.edge_hub.http_server, j.url);
    assert_eq!(written.node_name(), "join-cmd");
    let cert = tls::load_certs(Path::new(&paths.cert_file)).unwrap();
    assert_eq!(
        tls::common_name(&cert[0]).as_deref(),
        Some("system:node:join-cmd")
    );
    assert!(edgecore::app::load_tls(&written).is_ok());
}

/// `cloudcore gettoken` (keadm gettoken) prints the token cloudcore keeps in
/// `kubeedge/tokensecret`, and says what to do when there is none. Its own in-memory API server,
/// so the same on a real cluster.
#[tokio::test]
async fn cloudcore_gettoken_prints_the_join_token() {
    use e2e::apiserver::{ApiServer, Config};
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::PostParams;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let api = ApiServer::start(Config {
        kubeconfig_path: Some(kubeconfig.clone()),
        ..Config::default()
    })
    .await
    .unwrap();
    let bin = e2e::devices::workspace_binary("cloudcore", "cloudcore").unwrap();
    let absent = dir.path().join("absent.yaml");
    let kc = kubeconfig.clone();
    let run = move || {
        let out = std::process::Command::new(&bin)
            .arg("gettoken")
            .arg("--kube-config")
            .arg(&kc)
            .arg("--config")
            .arg(&absent)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, _, err) = tokio::task::spawn_blocking(run.clone()).await.unwrap();
    assert!(!ok);
    assert!(err.contains("tokensecret does not exist"), "{err}");

    let client = api.client().unwrap();
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "kubeedge"}})).unwrap();
    let _ = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "tokensecret", "namespace": "kubeedge"},
        "stringData": {"tokendata": "abc.def.ghi\n"}
    }))
    .unwrap();
    Api::<Secret>::namespaced(client, "kubeedge")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let (ok, out, err) = tokio::task::spawn_blocking(run).await.unwrap();
    assert!(ok, "{err}");
    assert_eq!(out, "abc.def.ghi\n");
    api.shutdown().await;
}
