//! The two ends tests and the demo open to cloudcore's stream tunnel: cloudstream's settings
//! (on loopback with the fixture PKI, or facing the apiserver on the test node address with a
//! certificate from the cluster CA), client connections to the stream server (`:10003`, as the
//! apiserver opens them), and a KubeEdge-style edge's tunnel connection.

use crate::channel::Pki;
use crate::cluster::TestCluster;
use crate::edge::WAIT;
use cloudcore::cloudstream::{
    ClientAuth, ServerIdentity, StreamCertRequest, issue_certificate, load_ca, write_certificate,
};
use cloudcore::cloudstream::{CloudStream, StreamSettings};
use kubeedge_shared::stream::TunnelMessage;
use kubeedge_shared::stream::http::{ResponseHead, parse_response_head};
use kubeedge_shared::stream::ws::{self, WsEvent, WsReader};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// A TLS connection to the stream server or to the tunnel server.
pub type RawClient = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// cloudstream on loopback ports with `pki`'s server certificate, the edges' CA and a node
/// port record; the stream server serves the clients `client_auth` admits.
pub fn loopback_settings(pki: &Pki, client_auth: ClientAuth) -> StreamSettings {
    let local = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    StreamSettings {
        stream_listen: local,
        tunnel_listen: local,
        chain: vec![pki.server.cert_der.clone()],
        key: pki.server.key_der(),
        stream_cert: None,
        ca: vec![pki.ca.cert.cert_der.clone()],
        allow_legacy_cn: false,
        node_port: Some(0),
        client_auth,
        metrics: Default::default(),
        relay_targets: None,
    }
}

/// cloudstream as an apiserver reaches it through an edge node: the stream server on
/// `stream_ip` (the address test edges report, [`crate::node_address`]), serving `stream_cert`
/// when given (else `pki`'s server certificate); the tunnel on loopback.
pub fn node_facing_settings(
    pki: &Pki,
    client_auth: ClientAuth,
    stream_ip: IpAddr,
    stream_cert: Option<ServerIdentity>,
) -> StreamSettings {
    StreamSettings {
        stream_listen: SocketAddr::new(stream_ip, 0),
        stream_cert,
        ..loopback_settings(pki, client_auth)
    }
}

/// The stream server's certificate for `ip`, made as `cloudcore stream-certificate --ca-cert
/// --ca-key --ip <ip> --out-dir <dir>/stream` makes it from the cluster CA and loaded as
/// cloudcore loads `tlsStreamCertFile`/`tlsStreamPrivateKeyFile`: what an apiserver with
/// `--kubelet-certificate-authority` accepts. `None` on a real cluster without
/// `E2E_CLUSTER_CA_KEY` (see [`crate::cluster::skip_without_cluster_ca_key`]).
pub fn cluster_stream_certificate(
    cluster: &TestCluster,
    dir: &Path,
    ip: IpAddr,
) -> Option<ServerIdentity> {
    let (ca_cert, ca_key) = cluster.cluster_ca_files(dir).expect("cluster CA files")?;
    let ca = load_ca(&ca_cert, &ca_key).unwrap_or_else(|e| panic!("{e}"));
    let req = StreamCertRequest {
        ips: &[ip],
        dns: &[],
        days: 1,
    };
    let cert = issue_certificate(&ca, &req).expect("a stream certificate");
    let (crt, key) = write_certificate(&dir.join("stream"), &cert).expect("writing it");
    Some(
        ServerIdentity::load(&crt, &key)
            .expect("loading it")
            .expect("both files"),
    )
}

/// A TLS connection made with `tls` to `addr`, checking the server certificate for `addr`'s
/// IP (as the apiserver checks a kubelet's when it verifies them at all).
pub async fn dial(addr: SocketAddr, tls: Arc<rustls::ClientConfig>) -> RawClient {
    let tcp = tokio::time::timeout(WAIT, tokio::net::TcpStream::connect(addr))
        .await
        .expect("connected in time")
        .expect("connect");
    let name = rustls_pki_types::ServerName::from(addr.ip());
    let handshake = tokio_rustls::TlsConnector::from(tls).connect(name, tcp);
    tokio::time::timeout(WAIT, handshake)
        .await
        .expect("TLS handshake in time")
        .unwrap_or_else(|e| panic!("TLS handshake with {addr}: {e}"))
}

/// A TLS connection made with `tls` to the stream server.
pub async fn connect(stream: &CloudStream, tls: &Arc<rustls::ClientConfig>) -> RawClient {
    dial(stream.stream_addr(), tls.clone()).await
}

/// A TLS connection to the stream server with `request` (raw HTTP/1.1) written on it.
pub async fn send_raw(
    stream: &CloudStream,
    tls: &Arc<rustls::ClientConfig>,
    request: &str,
) -> RawClient {
    let mut io = connect(stream, tls).await;
    io.write_all(request.as_bytes()).await.expect("request");
    io
}

/// Reads a response head off `io`: the head and the bytes read after it.
pub async fn read_response_head(io: &mut RawClient) -> (ResponseHead, Vec<u8>) {
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some((head, used)) = parse_response_head(&buf).expect("a response head") {
            return (head, buf.split_off(used));
        }
        let mut b = [0u8; 1024];
        let n = tokio::time::timeout_at(deadline, io.read(&mut b))
            .await
            .expect("an answer in time")
            .expect("read");
        assert!(n > 0, "connection ended before a response head: {buf:?}");
        buf.extend_from_slice(&b[..n]);
    }
}

/// Reads from `io` onto `buf` until it holds at least `len` bytes; panics if the connection
/// ends first or the bytes do not come within [`WAIT`].
pub async fn read_at_least(io: &mut RawClient, buf: &mut Vec<u8>, len: usize) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while buf.len() < len {
        let mut b = [0u8; 1024];
        let n = tokio::time::timeout_at(deadline, io.read(&mut b))
            .await
            .unwrap_or_else(|_| panic!("{len} bytes not read within {WAIT:?}: {buf:?}"))
            .expect("read");
        assert!(n > 0, "connection ended after {buf:?}");
        buf.extend_from_slice(&b[..n]);
    }
}

/// A KubeEdge edge's tunnel for `node`: TLS with the node's certificate from `pki`, then the
/// WebSocket handshake with KubeEdge's headers naming the node and its internal `ip`.
pub async fn dial_tunnel(stream: &CloudStream, pki: &Pki, node: &str, ip: &str) -> RawClient {
    let cert = pki.node_cert(node).expect("edge cert");
    let tls = edgecore::edgestream::tunnel_tls(
        std::slice::from_ref(&pki.ca.cert.cert_der),
        vec![cert.cert_der.clone()],
        cert.key_der(),
    )
    .expect("edge tls");
    let mut io = dial(stream.tunnel_addr(), tls).await;
    tokio::time::timeout(
        WAIT,
        ws::client_handshake(
            &mut io,
            &stream.tunnel_addr().to_string(),
            "/v1/kubeedge/connect",
            &[("SessionHostNameOverride", node), ("SessionInternalIP", ip)],
        ),
    )
    .await
    .expect("tunnel handshake in time")
    .expect("tunnel handshake");
    io
}

/// The next tunnel message the edge reads (pongs skipped); tunnel messages travel in TEXT
/// frames.
pub async fn next_message(reader: &mut WsReader<impl AsyncRead + Unpin>) -> TunnelMessage {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, reader.next()).await {
            Ok(Ok(Some(WsEvent::Data { opcode, payload }))) => {
                assert_eq!(opcode, ws::OP_TEXT, "tunnel messages travel in TEXT frames");
                return TunnelMessage::decode(&payload).expect("a tunnel message");
            }
            Ok(Ok(Some(WsEvent::Pong(_)))) => continue,
            other => panic!("expected a tunnel message, got {other:?}"),
        }
    }
}
