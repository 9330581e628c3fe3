//! Fixtures for the cloud–edge channel: a throw-away PKI, a cloudhub on loopback, edgehubs,
//! a raw WebSocket edge whose every frame the test controls, and a TCP proxy that can freeze.

use cloudcore::cloudhub::{CloudHub, HubConfig, Upstream};
use cloudcore::metrics::HubMetrics;
use edgecore::edgehub::{EdgeHub, EdgeHubConfig};
use futures_util::{SinkExt, StreamExt};
use kubeedge_shared::constants::{CONNECTION_USE_MSG, HEADER_CONNECTION_USE, HEADER_NODE_ID};
use kubeedge_shared::pki::{CertificateAuthority, IssuedCert};
use kubeedge_shared::{FrameCodec, Message, tls};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

/// A CA with a cloudhub server certificate for 127.0.0.1 / localhost.
pub struct Pki {
    pub ca: CertificateAuthority,
    pub server: IssuedCert,
}

impl Pki {
    pub fn new() -> anyhow::Result<Self> {
        let ca = CertificateAuthority::generate()?;
        let server = ca.issue_server(&["127.0.0.1", "localhost"], 365)?;
        Ok(Pki { ca, server })
    }

    /// An edge certificate with KubeEdge ≥ v1.16's identity (`system:node:<node>`).
    pub fn node_cert(&self, node: &str) -> anyhow::Result<IssuedCert> {
        Ok(self
            .ca
            .issue_client(&format!("system:node:{node}"), Some("system:nodes"), 365)?)
    }

    pub fn cert_with_cn(&self, cn: &str) -> anyhow::Result<IssuedCert> {
        Ok(self.ca.issue_client(cn, None, 365)?)
    }

    pub fn server_tls(&self) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        Ok(tls::server_config(
            vec![self.server.cert_der.clone()],
            self.server.key_der(),
            std::slice::from_ref(&self.ca.cert.cert_der),
            true,
        )?)
    }

    pub fn edge_tls(&self, cert: &IssuedCert) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        Ok(tls::client_config(
            std::slice::from_ref(&self.ca.cert.cert_der),
            vec![cert.cert_der.clone()],
            cert.key_der(),
        )?)
    }
}

/// cloudhub settings for tests: loopback, any port, short timers.
pub fn test_hub_config() -> HubConfig {
    let mut c = HubConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        keepalive_interval: Duration::from_secs(2),
        handshake_timeout: Duration::from_secs(5),
        write_timeout: Duration::from_secs(2),
        ..HubConfig::default()
    };
    c.queue.retry_interval = Duration::from_millis(300);
    c
}

pub async fn start_hub(
    pki: &Pki,
    config: HubConfig,
) -> anyhow::Result<(CloudHub, mpsc::Receiver<Upstream>, HubMetrics)> {
    let metrics = HubMetrics::default();
    let (hub, up) = CloudHub::bind(config, pki.server_tls()?, metrics.clone()).await?;
    Ok((hub, up, metrics))
}

/// edgehub settings for tests: short heartbeat, quick reconnects, no rate limit.
pub fn test_edge_config(server: SocketAddr, node: &str) -> EdgeHubConfig {
    EdgeHubConfig {
        server: server.to_string(),
        node_name: node.to_string(),
        heartbeat: Duration::from_millis(500),
        dead_link_timeout: Duration::from_millis(1500),
        handshake_timeout: Duration::from_secs(3),
        write_timeout: Duration::from_secs(2),
        reconnect_initial: Duration::from_millis(100),
        reconnect_max: Duration::from_millis(500),
        message_qps: 0,
        ..EdgeHubConfig::default()
    }
}

pub fn start_edge(
    pki: &Pki,
    config: EdgeHubConfig,
) -> anyhow::Result<(EdgeHub, mpsc::Receiver<Message>)> {
    let cert = pki.node_cert(&config.node_name)?;
    Ok(EdgeHub::start(config, pki.edge_tls(&cert)?))
}

/// A WebSocket edge that does exactly what the test says: no automatic keepalive or ACK.
pub struct RawEdge {
    ws: WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>,
    codec: FrameCodec,
}

impl RawEdge {
    /// Connects as `node` presenting `tls`'s client certificate. The error text carries the
    /// cloud's refusal (e.g. `403 Forbidden`) when there is one.
    pub async fn connect(
        addr: SocketAddr,
        node: &str,
        tls: Arc<rustls::ClientConfig>,
    ) -> Result<RawEdge, String> {
        Self::connect_with(addr, node, tls, &[]).await
    }

    /// Like `connect`, advertising kubeedge-rs capabilities (e.g. `inventory-resync`).
    pub async fn connect_with(
        addr: SocketAddr,
        node: &str,
        tls: Arc<rustls::ClientConfig>,
        capabilities: &[&str],
    ) -> Result<RawEdge, String> {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let name =
            rustls::pki_types::ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
        let stream = TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("tls: {e}"))?;
        let mut req = format!("wss://{addr}/e632aba927ea4ac2b575ec1603d56f10/{node}/events")
            .into_client_request()
            .map_err(|e| e.to_string())?;
        // Go canonicalises header names: send them the way a real KubeEdge edge does.
        req.headers_mut().insert(
            "Node_id",
            HeaderValue::from_str(node).map_err(|e| e.to_string())?,
        );
        req.headers_mut().insert(
            "Connectionuse",
            HeaderValue::from_static(CONNECTION_USE_MSG),
        );
        let _ = (HEADER_NODE_ID, HEADER_CONNECTION_USE);
        if !capabilities.is_empty() {
            req.headers_mut().insert(
                kubeedge_shared::constants::HEADER_CAPABILITIES,
                HeaderValue::from_str(&capabilities.join(",")).map_err(|e| e.to_string())?,
            );
        }
        // A small read buffer (it grows when needed): benchmarks hold 100,000 of these.
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .read_buffer_size(4096);
        let (ws, _) = tokio_tungstenite::client_async_with_config(req, stream, Some(config))
            .await
            .map_err(|e| match e {
                tokio_tungstenite::tungstenite::Error::Http(resp) => format!(
                    "refused {}: {}",
                    resp.status(),
                    resp.body()
                        .as_ref()
                        .map(|b| String::from_utf8_lossy(b).into_owned())
                        .unwrap_or_default()
                ),
                other => format!("websocket: {other}"),
            })?;
        Ok(RawEdge {
            ws,
            codec: FrameCodec::default(),
        })
    }

    pub async fn send(&mut self, msg: &Message) -> anyhow::Result<()> {
        let text = self.codec.encode(msg)?;
        self.ws.send(WsMessage::Text(text.into())).await?;
        Ok(())
    }

    pub async fn send_frame(&mut self, frame: WsMessage) -> anyhow::Result<()> {
        self.ws.send(frame).await?;
        Ok(())
    }

    pub async fn keepalive(&mut self) -> anyhow::Result<()> {
        self.send(&Message::keepalive()).await
    }

    pub async fn ack(&mut self, msg: &Message) -> anyhow::Result<()> {
        self.send(&Message::ack_for(msg)).await
    }

    /// The next message within `timeout`; `Ok(None)` on timeout; `Err` once the connection
    /// is closed.
    pub async fn recv(&mut self, timeout: Duration) -> anyhow::Result<Option<Message>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let frame = match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Err(_) => return Ok(None),
                Ok(None) => anyhow::bail!("connection closed"),
                Ok(Some(f)) => f?,
            };
            match frame {
                WsMessage::Text(t) => return Ok(Some(self.codec.decode(t.as_bytes())?)),
                WsMessage::Binary(b) => return Ok(Some(self.codec.decode(&b)?)),
                WsMessage::Close(_) => anyhow::bail!("connection closed by cloud"),
                _ => continue,
            }
        }
    }

    /// True when the cloud closes the connection within `timeout`.
    pub async fn closed_within(&mut self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Err(_) => return false,
                Ok(None) | Ok(Some(Err(_))) | Ok(Some(Ok(WsMessage::Close(_)))) => return true,
                Ok(Some(Ok(_))) => continue,
            }
        }
    }
}

/// A loopback TCP proxy that can freeze every connection (forward nothing, close nothing:
/// a half-open link as a frozen peer or a dead NAT produces it) in both directions or in one
/// ([`FaultProxy::freeze_one_way`]), thaw again, cut every open
/// connection (both ends see it closed), delay what it forwards (added latency), and move to
/// another upstream (a restarted cloudcore) while edges keep dialling the same address.
pub struct FaultProxy {
    pub addr: SocketAddr,
    state: Arc<ProxyState>,
    stop: tokio_util::sync::CancellationToken,
}

/// One direction through a [`FaultProxy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// From the dialling client (the edge) to the upstream (the cloud).
    ToUpstream,
    /// From the upstream back to the client.
    ToClient,
}

struct ProxyState {
    /// Frozen flows: `[ToUpstream, ToClient]`.
    frozen: [std::sync::atomic::AtomicBool; 2],
    upstream: std::sync::Mutex<SocketAddr>,
    /// Cancelled by `thaw`: ends the connections the freeze held. Taken under this lock
    /// together with a look at `frozen`, so a thaw never leaves a connection stuck.
    released: std::sync::Mutex<tokio_util::sync::CancellationToken>,
    /// Cancelled by `cut`: closes the connections open at that moment.
    cut: std::sync::Mutex<tokio_util::sync::CancellationToken>,
    /// Added to every chunk's delivery, in microseconds.
    latency_us: std::sync::atomic::AtomicU64,
}

impl ProxyState {
    /// The token that releases this flow of a connection when it is frozen now; `None` when
    /// not.
    fn frozen_until(&self, flow: Flow) -> Option<tokio_util::sync::CancellationToken> {
        let released = self.released.lock().unwrap_or_else(|e| e.into_inner());
        self.frozen[flow as usize]
            .load(std::sync::atomic::Ordering::SeqCst)
            .then(|| released.clone())
    }
}

impl FaultProxy {
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<FaultProxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(ProxyState {
            frozen: Default::default(),
            upstream: std::sync::Mutex::new(upstream),
            released: std::sync::Mutex::new(tokio_util::sync::CancellationToken::new()),
            cut: std::sync::Mutex::new(tokio_util::sync::CancellationToken::new()),
            latency_us: std::sync::atomic::AtomicU64::new(0),
        });
        let stop = tokio_util::sync::CancellationToken::new();
        let (st, s) = (state.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let (client, _) = tokio::select! {
                    _ = s.cancelled() => break,
                    r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
                };
                let upstream = *st.upstream.lock().unwrap_or_else(|e| e.into_inner());
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let cut = st.cut.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let up = pump(cr, sw, Flow::ToUpstream, st.clone(), s.clone(), cut.clone());
                tokio::spawn(up);
                tokio::spawn(pump(sr, cw, Flow::ToClient, st.clone(), s.clone(), cut));
            }
        });
        Ok(FaultProxy { addr, state, stop })
    }

    /// Every connection, open or new, stops forwarding; nothing is closed.
    pub fn freeze(&self) {
        self.freeze_one_way(Flow::ToUpstream);
        self.freeze_one_way(Flow::ToClient);
    }

    /// Every connection stops forwarding in one direction (the other keeps flowing); nothing
    /// is closed. `thaw` undoes it.
    pub fn freeze_one_way(&self, flow: Flow) {
        self.state.frozen[flow as usize].store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Forwards again. Connections the freeze held are closed (their peers gave up on them or
    /// will, as after a NAT or link failure); new ones flow.
    pub fn thaw(&self) {
        let mut released = self
            .state
            .released
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for f in &self.state.frozen {
            f.store(false, std::sync::atomic::Ordering::SeqCst);
        }
        std::mem::take(&mut *released).cancel();
    }

    /// Closes every open connection at once (both ends see it: a cloudcore or edge crash,
    /// a reset by a middlebox); new connections flow.
    pub fn cut(&self) {
        std::mem::take(&mut *self.state.cut.lock().unwrap_or_else(|e| e.into_inner())).cancel();
    }

    /// Delays every chunk by `latency` in each direction (zero: none), open connections too.
    pub fn set_latency(&self, latency: Duration) {
        self.state.latency_us.store(
            u64::try_from(latency.as_micros()).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// New connections go to `upstream` (open ones stay where they are).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self
            .state
            .upstream
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = upstream;
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Forwards `from` to `to` through a delay line (the latency at read time), until EOF, a
/// write error, `stop` or `cut`; dropping the halves closes the sockets.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    flow: Flow,
    state: Arc<ProxyState>,
    stop: tokio_util::sync::CancellationToken,
    cut: tokio_util::sync::CancellationToken,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut rx) = mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if let Some(released) = state.frozen_until(flow) {
                // Swallow everything and keep both sockets open until thawed or dropped.
                released.cancelled().await;
                return;
            }
            let latency =
                Duration::from_micros(state.latency_us.load(std::sync::atomic::Ordering::SeqCst));
            if tx
                .send((tokio::time::Instant::now() + latency, buf[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
    };
    let write = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = cut.cancelled() => {}
        // A frozen reader ends only when released; the writer then ends with the line.
        _ = async { tokio::join!(read, write) } => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-way freeze holds one direction and lets the other flow; the thaw closes the held
    /// direction without delivering what it swallowed.
    #[tokio::test]
    async fn one_way_freeze_holds_one_direction_only() {
        for flow in [Flow::ToUpstream, Flow::ToClient] {
            let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let proxy = FaultProxy::start(upstream.local_addr().unwrap())
                .await
                .unwrap();
            let client = TcpStream::connect(proxy.addr).await.unwrap();
            let (server, _) = upstream.accept().await.unwrap();
            let (mut from, mut to) = match flow {
                Flow::ToUpstream => (client, server),
                Flow::ToClient => (server, client),
            };
            proxy.freeze_one_way(flow);
            from.write_all(b"held").await.unwrap();
            to.write_all(b"flows").await.unwrap();
            let mut got = [0u8; 5];
            tokio::time::timeout(Duration::from_secs(5), from.read_exact(&mut got))
                .await
                .expect("the other direction keeps flowing")
                .unwrap();
            assert_eq!(&got, b"flows", "{flow:?}");
            let mut one = [0u8; 1];
            let held = tokio::time::timeout(Duration::from_millis(300), to.read(&mut one)).await;
            assert!(held.is_err(), "{flow:?}: frozen bytes were forwarded");
            proxy.thaw();
            let mut rest = Vec::new();
            tokio::time::timeout(Duration::from_secs(5), to.read_to_end(&mut rest))
                .await
                .expect("the thaw closes the held direction")
                .unwrap();
            assert!(rest.is_empty(), "{flow:?}: {rest:?}");
        }
    }
}
