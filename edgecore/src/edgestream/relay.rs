//! edgemesh's relay over the stream tunnel (kubeedge-rs only), both ends at the edge:
//!
//! * [`TunnelDialer`] (the edge whose pod calls a Service): each relayed connection is an HTTP
//!   upgrade `GET /v1/kubeedge-rs/relay` to the cloud's tunnel port with this edge's
//!   certificate, naming the endpoint's node and address; after `101` the TLS stream carries
//!   the connection's bytes.
//! * [`serve`] (the edge running the endpoint): RELAY_CONNECT from the cloud dials the
//!   endpoint, answers with a [`RelayStatus`] as the first DATA message, then pumps bytes.
//!   Only edges that advertise `relay` in their tunnel handshake get it; the cloud checks that
//!   the address is an endpoint of this node in an EndpointSlice before sending it.

use super::EdgeStreamSettings;
use super::sender::TunnelSender;
use kubeedge_edgemesh::proxy::relay::{DialFuture, RelayDialer, RelayStream, RelayTarget};
use kubeedge_shared::stream::{self, RelayConnect, RelayStatus};
use rustls::pki_types::ServerName;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How long dialling an endpoint may take.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// A relayed connection idle this long ends (the cloud's limit is the same).
const IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// RELAY_CONNECT `id`: dials the endpoint and relays until either side ends.
pub async fn serve(
    id: u64,
    payload: Vec<u8>,
    sender: TunnelSender,
    mut input: mpsc::Receiver<Vec<u8>>,
    cancel: CancellationToken,
) {
    let status = |error: String| serde_json::to_vec(&RelayStatus { error }).unwrap_or_default();
    let target = match serde_json::from_slice::<RelayConnect>(&payload) {
        Ok(t) => t.addr,
        Err(e) => {
            sender
                .data(id, status(format!("bad relay request: {e}")), &cancel)
                .await;
            sender.finish(id, &cancel).await;
            return;
        }
    };
    let conn =
        match tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(target)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                tracing::info!(%target, error = %e, "relayed Service connection: endpoint refused");
                sender
                    .data(id, status(format!("connect {target}: {e}")), &cancel)
                    .await;
                sender.finish(id, &cancel).await;
                return;
            }
            Err(_) => {
                sender
                    .data(id, status(format!("connect {target}: timed out")), &cancel)
                    .await;
                sender.finish(id, &cancel).await;
                return;
            }
        };
    let _ = conn.set_nodelay(true);
    if !sender.data(id, status(String::new()), &cancel).await {
        return;
    }
    let moved = std::sync::atomic::AtomicU64::new(0);
    let pump = kubeedge_shared::stream::pump::duplex(
        conn,
        Vec::new(),
        &mut input,
        |chunk| {
            let (sender, cancel) = (sender.clone(), cancel.clone());
            async move { sender.data(id, chunk, &cancel).await }
        },
        IDLE_TIMEOUT,
        &moved,
    );
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = pump => {}
    }
    sender.finish(id, &cancel).await;
}

/// Opens relayed connections through the cloud's tunnel port.
pub struct TunnelDialer {
    settings: EdgeStreamSettings,
    tls: Arc<rustls::ClientConfig>,
}

impl TunnelDialer {
    pub fn new(settings: EdgeStreamSettings, tls: Arc<rustls::ClientConfig>) -> TunnelDialer {
        TunnelDialer { settings, tls }
    }
}

/// The answer head to a relay request, read byte by byte up to its end (nothing after it
/// is consumed: that is the connection's data).
async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Result<String, String> {
    let mut head = Vec::with_capacity(256);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 * 1024 {
            return Err("relay answer head too long".into());
        }
        let b = s
            .read_u8()
            .await
            .map_err(|e| format!("reading the relay answer: {e}"))?;
        head.push(b);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

async fn dial(
    settings: EdgeStreamSettings,
    tls: Arc<rustls::ClientConfig>,
    target: RelayTarget,
) -> Result<Box<dyn RelayStream>, String> {
    let host = settings
        .server
        .rsplit_once(':')
        .map_or(settings.server.as_str(), |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let tcp = tokio::net::TcpStream::connect(&settings.server)
        .await
        .map_err(|e| format!("connect {}: {e}", settings.server))?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(host).map_err(|e| e.to_string())?;
    let mut io = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS to {}: {e}", settings.server))?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: {proto}\r\n\
         {hn}: {node}\r\n{rn}: {to_node}\r\n{rt}: {addr}\r\n\r\n",
        path = stream::RELAY_PATH,
        host = settings.server,
        proto = stream::RELAY_PROTOCOL,
        hn = stream::HEADER_HOSTNAME,
        node = settings.node_name,
        rn = stream::HEADER_RELAY_NODE,
        to_node = target.node,
        rt = stream::HEADER_RELAY_TARGET,
        addr = target.addr,
    );
    io.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("sending the relay request: {e}"))?;
    let head = read_head(&mut io).await?;
    let status = head.lines().next().unwrap_or_default().to_string();
    if status.split_whitespace().nth(1) != Some("101") {
        // The cloud's reason is in the body; read a bounded bit of it.
        let mut body = vec![0u8; 512];
        let n = tokio::time::timeout(Duration::from_millis(500), io.read(&mut body))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(0);
        return Err(format!(
            "the cloud refused the relay: {} {}",
            status.trim(),
            String::from_utf8_lossy(&body[..n]).trim()
        ));
    }
    Ok(Box::new(io))
}

impl RelayDialer for TunnelDialer {
    fn dial(&self, target: RelayTarget) -> DialFuture {
        let (settings, tls) = (self.settings.clone(), self.tls.clone());
        Box::pin(dial(settings, tls, target))
    }
}
