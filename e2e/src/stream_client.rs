//! The two ends tests and the demo open to cloudcore's stream tunnel: cloudstream's settings
//! on loopback with the fixture PKI, client connections to the stream server (`:10003`, as
//! the apiserver opens them), and a KubeEdge-style edge's tunnel connection.

use crate::channel::Pki;
use crate::edge::WAIT;
use cloudcore::cloudstream::client_auth::ClientAuth;
use cloudcore::cloudstream::{CloudStream, StreamSettings};
use kubeedge_shared::stream::TunnelMessage;
use kubeedge_shared::stream::http::{ResponseHead, parse_response_head};
use kubeedge_shared::stream::ws::{self, WsEvent, WsReader};
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
    }
}

/// A TLS connection made with `tls` to `addr` (a server certificate for `127.0.0.1`).
pub async fn dial(addr: std::net::SocketAddr, tls: Arc<rustls::ClientConfig>) -> RawClient {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
    tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .expect("TLS handshake (certificate for 127.0.0.1)")
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
    loop {
        if let Some((head, used)) = parse_response_head(&buf).expect("a response head") {
            return (head, buf.split_off(used));
        }
        let mut b = [0u8; 1024];
        let n = tokio::time::timeout(WAIT, io.read(&mut b))
            .await
            .expect("an answer in time")
            .expect("read");
        assert!(n > 0, "connection ended before a response head: {buf:?}");
        buf.extend_from_slice(&b[..n]);
    }
}

/// A KubeEdge edge's tunnel for `node`: TLS with the node's certificate from `pki`, then the
/// WebSocket handshake with KubeEdge's headers naming the node and its internal `ip`.
pub async fn dial_tunnel(stream: &CloudStream, pki: &Pki, node: &str, ip: &str) -> RawClient {
    let cert = pki.node_cert(node).expect("edge cert");
    let tls = edgecore::edgestream::tunnel::tunnel_tls(
        std::slice::from_ref(&pki.ca.cert.cert_der),
        vec![cert.cert_der.clone()],
        cert.key_der(),
    )
    .expect("edge tls");
    let mut io = dial(stream.tunnel_addr(), tls).await;
    ws::client_handshake(
        &mut io,
        &stream.tunnel_addr().to_string(),
        "/v1/kubeedge/connect",
        &[("SessionHostNameOverride", node), ("SessionInternalIP", ip)],
    )
    .await
    .expect("tunnel handshake");
    io
}

/// The next tunnel message the edge reads (pongs skipped); tunnel messages travel in TEXT
/// frames.
pub async fn next_message(reader: &mut WsReader<impl AsyncRead + Unpin>) -> TunnelMessage {
    loop {
        match tokio::time::timeout(WAIT, reader.next()).await {
            Ok(Ok(Some(WsEvent::Data { opcode, payload }))) => {
                assert_eq!(opcode, ws::OP_TEXT, "tunnel messages travel in TEXT frames");
                return TunnelMessage::decode(&payload).expect("a tunnel message");
            }
            Ok(Ok(Some(WsEvent::Pong(_)))) => continue,
            other => panic!("expected a tunnel message, got {other:?}"),
        }
    }
}
