//! One tunnel connection: TLS (the cloud's certificate must chain to the CA; its name is not
//! checked, as KubeEdge's edge skips verification entirely), the WebSocket handshake, the
//! 5 s pings, and dispatch of tunnel messages to the local connections.

use super::EdgeStreamSettings;
pub use super::sender::TunnelSender;
use kubeedge_edged::cri::runtime::Runtime;
use kubeedge_edged::stats::StatsProvider;
use kubeedge_shared::constants::{CAPABILITY_PORT_FORWARD, CAPABILITY_RELAY, HEADER_CAPABILITIES};
use kubeedge_shared::stream::ws::{self, WsEvent, WsReader, WsWriter};
use kubeedge_shared::stream::{self, Connector, MessageType, TunnelMessage};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub const PING_INTERVAL: Duration = Duration::from_secs(5);
/// The cloud answers every ping (gorilla's default handler does too): this long without any
/// frame means a dead (possibly half-open) tunnel.
pub const DEAD_AFTER: Duration = Duration::from_secs(20);
/// Tunnel messages waiting to be written.
const OUT_BUFFER: usize = 256;
/// DATA chunks buffered per exec/attach stream before the tunnel waits for it.
const CONN_BUFFER: usize = 64;
/// How long one stream's runtime side may keep the tunnel waiting.
const STALL_LIMIT: Duration = Duration::from_secs(10);

pub type TunnelIo = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// Checks the chain but not the name.
#[derive(Debug)]
struct ChainOnly(Arc<dyn ServerCertVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The tunnel's TLS: the edge certificate as client certificate, the cloud's checked against
/// `ca` without its name.
pub fn tunnel_tls(
    ca: &[CertificateDer<'static>],
    chain: Vec<CertificateDer<'static>>,
    key: rustls::pki_types::PrivateKeyDer<'static>,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in ca {
        roots.add(c.clone())?;
    }
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()?;
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
        .with_client_auth_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Dials the tunnel server and completes the WebSocket handshake.
pub async fn connect(
    s: &EdgeStreamSettings,
    tls: Arc<rustls::ClientConfig>,
) -> anyhow::Result<TunnelIo> {
    let host = s
        .server
        .rsplit_once(':')
        .map_or(s.server.as_str(), |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let fut = async {
        let tcp = tokio::net::TcpStream::connect(&s.server).await?;
        // Small frames (exec keystrokes, relayed requests) must not wait for Nagle.
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from(host)?;
        let mut io = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await?;
        ws::client_handshake(
            &mut io,
            &s.server,
            stream::CONNECT_PATH,
            &[
                (stream::HEADER_HOSTNAME, s.node_name.as_str()),
                (stream::HEADER_INTERNAL_IP, s.node_ip.as_str()),
                (
                    HEADER_CAPABILITIES,
                    &format!("{CAPABILITY_PORT_FORWARD},{CAPABILITY_RELAY}"),
                ),
            ],
        )
        .await?;
        anyhow::Ok(io)
    };
    tokio::time::timeout(s.handshake_timeout.max(Duration::from_secs(1)), fut)
        .await
        .map_err(|_| anyhow::anyhow!("tunnel handshake timed out"))?
}

/// A local connection: its cancellation and, for exec/attach, where its input goes.
struct Conn {
    cancel: CancellationToken,
    data: Option<mpsc::Sender<Vec<u8>>>,
}

/// Registers local connection `id`, ended with the tunnel `session`.
fn open(
    conns: &mut HashMap<u64, Conn>,
    session: &CancellationToken,
    id: u64,
    data: Option<mpsc::Sender<Vec<u8>>>,
) -> CancellationToken {
    let cancel = session.child_token();
    conns.insert(
        id,
        Conn {
            cancel: cancel.clone(),
            data,
        },
    );
    cancel
}

/// The connect payload of `m`; a bad one is answered with REMOVE_CONNECT.
async fn connector_of(m: &TunnelMessage, sender: &TunnelSender) -> Option<Connector> {
    match serde_json::from_slice(&m.data) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(id = m.connect_id, kind = ?m.kind, error = %e, "bad connect payload");
            let _ = sender.remove(m.connect_id).await;
            None
        }
    }
}

/// Serves one tunnel until it breaks, the cloud closes it, or `shutdown`.
pub async fn serve(
    io: TunnelIo,
    runtime: Runtime,
    stats: Arc<StatsProvider>,
    shutdown: CancellationToken,
) {
    let (r, w) = tokio::io::split(io);
    let (tx, mut rx) = mpsc::channel::<TunnelMessage>(OUT_BUFFER);
    let (ping_tx, mut ping_rx) = mpsc::channel::<Vec<u8>>(4);
    let session = shutdown.child_token();
    let closed = session.clone();
    let writer = tokio::spawn(async move {
        let mut w = WsWriter::new(w, true);
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + PING_INTERVAL, PING_INTERVAL);
        loop {
            let res = tokio::select! {
                _ = closed.cancelled() => break,
                _ = ping.tick() => w.send(ws::OP_PING, b"ping you").await,
                p = ping_rx.recv() => match p {
                    Some(p) => w.send(ws::OP_PONG, &p).await,
                    None => break,
                },
                m = rx.recv() => match m {
                    Some(m) => w.send(ws::OP_TEXT, &m.encode()).await,
                    None => break,
                },
            };
            if let Err(e) = res {
                tracing::info!(error = %e, "writing to the stream tunnel failed");
                break;
            }
        }
        closed.cancel();
        w.shutdown().await;
    });
    let sender = TunnelSender(tx);
    let mut conns: HashMap<u64, Conn> = HashMap::new();
    let mut reader = WsReader::new(r, stream::MAX_DATA + 32);
    loop {
        let ev = tokio::select! {
            _ = session.cancelled() => break,
            ev = tokio::time::timeout(DEAD_AFTER, reader.next()) => match ev {
                Ok(ev) => ev,
                Err(_) => {
                    tracing::warn!("no pong or message from the cloud in {DEAD_AFTER:?}; reconnecting the stream tunnel");
                    break;
                }
            },
        };
        let payload = match ev {
            Ok(Some(WsEvent::Data { payload, .. })) => payload,
            Ok(Some(WsEvent::Ping(p))) => {
                let _ = ping_tx.try_send(p);
                continue;
            }
            Ok(Some(WsEvent::Pong(_))) => continue,
            Ok(None) | Ok(Some(WsEvent::Close)) => break,
            Err(e) => {
                tracing::warn!(error = %e, "stream tunnel read failed (frames over 1 MiB are rejected)");
                break;
            }
        };
        let m = match TunnelMessage::decode(&payload) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "bad tunnel message ignored");
                continue;
            }
        };
        conns.retain(|_, c| !c.cancel.is_cancelled());
        match m.kind {
            MessageType::LogsConnect => {
                let Some(connector) = connector_of(&m, &sender).await else {
                    continue;
                };
                let token = open(&mut conns, &session, m.connect_id, None);
                tokio::spawn(super::logs::serve(
                    m.connect_id,
                    connector,
                    runtime.clone(),
                    sender.clone(),
                    token,
                ));
            }
            MessageType::MetricConnect => {
                let Some(connector) = connector_of(&m, &sender).await else {
                    continue;
                };
                let token = open(&mut conns, &session, m.connect_id, None);
                tokio::spawn(super::metrics::serve(
                    m.connect_id,
                    connector,
                    stats.clone(),
                    sender.clone(),
                    token,
                ));
            }
            MessageType::ExecConnect | MessageType::AttachConnect => {
                let Some(connector) = connector_of(&m, &sender).await else {
                    continue;
                };
                let (data_tx, data_rx) = mpsc::channel(CONN_BUFFER);
                let token = open(&mut conns, &session, m.connect_id, Some(data_tx));
                tokio::spawn(super::exec::serve(
                    m.connect_id,
                    connector,
                    runtime.clone(),
                    sender.clone(),
                    data_rx,
                    token,
                ));
            }
            MessageType::PortForwardConnect => {
                let Some(connector) = connector_of(&m, &sender).await else {
                    continue;
                };
                let (data_tx, data_rx) = mpsc::channel(CONN_BUFFER);
                let token = open(&mut conns, &session, m.connect_id, Some(data_tx));
                tokio::spawn(super::portforward::serve(
                    m.connect_id,
                    connector,
                    runtime.clone(),
                    sender.clone(),
                    data_rx,
                    token,
                ));
            }
            MessageType::RelayConnect => {
                let (data_tx, data_rx) = mpsc::channel(CONN_BUFFER);
                let token = open(&mut conns, &session, m.connect_id, Some(data_tx));
                tokio::spawn(super::relay::serve(
                    m.connect_id,
                    m.data,
                    sender.clone(),
                    data_rx,
                    token,
                ));
            }
            MessageType::RemoveConnect => {
                if let Some(c) = conns.remove(&m.connect_id) {
                    c.cancel.cancel();
                }
            }
            MessageType::CloseConnect => {
                tracing::warn!(reason = %String::from_utf8_lossy(&m.data), "cloud closed the stream tunnel");
                break;
            }
            MessageType::Data => {
                let Some(tx) = conns.get(&m.connect_id).and_then(|c| c.data.clone()) else {
                    tracing::debug!(
                        id = m.connect_id,
                        "data for a connection without input ignored"
                    );
                    continue;
                };
                // A stream whose runtime side stopped reading must not hold up the tunnel.
                if let Err(mpsc::error::SendTimeoutError::Timeout(_)) =
                    tx.send_timeout(m.data, STALL_LIMIT).await
                {
                    tracing::warn!(
                        id = m.connect_id,
                        "exec/attach/port-forward stream stalled; closing it"
                    );
                    if let Some(c) = conns.remove(&m.connect_id) {
                        c.cancel.cancel();
                    }
                    let _ = sender.remove(m.connect_id).await;
                }
            }
            other => {
                tracing::warn!(kind = ?other, id = m.connect_id, "unsupported tunnel message type ignored");
                let _ = sender.remove(m.connect_id).await;
            }
        }
    }
    session.cancel();
    let _ = writer.await;
}
