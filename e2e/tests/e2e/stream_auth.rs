//! Who may use cloudcore's stream server (`:10003`): as a kubelet with `--client-ca-file` and
//! anonymous auth off, only clients whose certificate chains to the stream CA (the cluster CA,
//! which signs the apiserver's kubelet client certificate). A client without a certificate,
//! or with one from another CA (an edge's own node certificate included), gets 401 on every
//! route and nothing reaches the edge.

use cloudcore::cloudstream::ClientAuth;
use cloudcore::cloudstream::{CloudStream, StreamSettings};
use cloudcore::metrics::{ReasonLabel, StreamMetrics};
use e2e::edge::{WAIT, wait_for};
use e2e::images::BUSYBOX_IMAGE;
use e2e::stream_client::{
    dial_tunnel, loopback_settings, next_message, read_response_head, send_raw,
};
use kubeedge_shared::pki::CertificateAuthority;
use kubeedge_shared::stream::MessageType;
use kubeedge_shared::stream::ws::WsReader;
use serde_json::json;
use std::sync::Arc;
use tokio::io::AsyncReadExt;

/// Sends `request` (raw HTTP/1.1) over a fresh TLS connection made with `tls`; the status and
/// body of the answer.
async fn call(
    stream: &CloudStream,
    tls: &Arc<rustls::ClientConfig>,
    request: &str,
) -> (u16, String) {
    // The handshake succeeds: the kubelet answers 401, it does not refuse TLS.
    let mut io = send_raw(stream, tls, request).await;
    let (head, mut body) = read_response_head(&mut io).await;
    let len: usize = head
        .header("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    while body.len() < len {
        let mut b = [0u8; 1024];
        let n = tokio::time::timeout(WAIT, io.read(&mut b))
            .await
            .expect("the body in time")
            .expect("read");
        assert!(n > 0, "body ended early: {body:?}");
        body.extend_from_slice(&b[..n]);
    }
    (head.status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_server_serves_only_clients_with_a_certificate_from_the_stream_ca() {
    e2e::edge::init_logs();
    let cluster = e2e::cluster::connect().await.expect("cluster");
    let pki = e2e::channel::Pki::new().expect("pki");
    // The apiserver's kubelet client certificate (from the cluster CA).
    let Some(apiserver) = cluster.apiserver_stream_tls(&pki.ca.cert.cert_der) else {
        return;
    };
    let metrics = StreamMetrics::default();
    let stream = CloudStream::start(
        StreamSettings {
            metrics: metrics.clone(),
            ..loopback_settings(&pki, ClientAuth::Verify(cluster.cluster_ca()))
        },
        cluster.client(),
    )
    .await
    .expect("cloudstream");
    let ns = cluster.temp_namespace("stream-auth").await.expect("ns");
    let node = e2e::edge::node_name("auth-edge");
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(cluster.client(), &ns);
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": BUSYBOX_IMAGE}]},
    }))
    .expect("pod");
    pods.create(&Default::default(), &pod).await.expect("pod");

    // The node's tunnel is up (a KubeEdge-style edge), so every route would reach it.
    let cert = pki.node_cert(&node).expect("edge cert");
    let io = dial_tunnel(&stream, &pki, &node, "10.9.8.7").await;
    let mut reader = WsReader::new(io, 2 << 20);
    wait_for("the tunnel session", WAIT, || async {
        stream.is_connected(&node).then_some(())
    })
    .await;

    // Clients the kubelet would not authenticate: no certificate; a certificate that claims
    // to be the apiserver's but comes from another CA; the edge's own node certificate (cloudhub's CA).
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca.cert.cert_der.clone()).expect("root");
    let anonymous = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    let rogue_ca = CertificateAuthority::generate().expect("rogue CA");
    let rogue = rogue_ca
        .issue_client("kube-apiserver-kubelet-client", Some("system:masters"), 1)
        .expect("rogue cert");
    let client_tls = |c: &kubeedge_shared::pki::IssuedCert| {
        kubeedge_shared::tls::client_config(
            std::slice::from_ref(&pki.ca.cert.cert_der),
            vec![c.cert_der.clone()],
            c.key_der(),
        )
        .expect("client tls")
    };
    let untrusted = [client_tls(&rogue), client_tls(&cert)];
    let requests = [
        format!(
            "GET /containerLogs/{ns}/web/main?follow=true HTTP/1.1\r\nHost: 10.9.8.7:10350\r\n\r\n"
        ),
        format!(
            "POST /exec/{ns}/web/main?command=sh&input=1&output=1 HTTP/1.1\r\nHost: 10.9.8.7:10350\r\n\
             Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\
             Content-Length: 0\r\n\r\n"
        ),
        "GET /stats/summary HTTP/1.1\r\nHost: 10.9.8.7:10350\r\n\r\n".to_string(),
    ];
    for request in &requests {
        let (status, body) = call(&stream, &anonymous, request).await;
        assert_eq!((status, body.as_str()), (401, "Unauthorized"), "{request}");
        for tls in &untrusted {
            let (status, body) = call(&stream, tls, request).await;
            assert_eq!((status, body.as_str()), (401, "Unauthorized"), "{request}");
        }
    }
    let refused = |reason| {
        metrics
            .requests_refused
            .get_or_create(&ReasonLabel { reason })
            .get()
    };
    assert_eq!(refused("no_client_certificate"), 3);
    assert_eq!(refused("untrusted_client_certificate"), 6);

    // The apiserver (its kubelet client certificate) gets through: the first thing the edge
    // hears is its request, none of the refused ones.
    let stats = "GET /stats/summary HTTP/1.1\r\nHost: 10.9.8.7:10350\r\n\r\n";
    let _client = send_raw(&stream, &apiserver, stats).await;
    let first = next_message(&mut reader).await;
    assert_eq!(first.kind, MessageType::MetricConnect);
    let v: serde_json::Value = serde_json::from_slice(&first.data).expect("JSON");
    assert_eq!(v["url"]["Path"], "/stats/summary");
    cluster.delete_namespace(&ns).await;
}
