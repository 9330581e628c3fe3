//! Forwarding names outside the cluster domain to the node's upstream resolvers.
//!
//! - UDP queries go out over UDP from a fresh socket with a fresh random query ID per
//!   attempt (the socket is connected, so only the upstream's address is heard); a reply
//!   counts when its ID and question match, and gets the client's ID back.
//! - TCP queries go out over TCP, one connection per query.
//! - Upstreams are tried in order, each for at most the per-attempt timeout; when all fail
//!   the caller answers SERVFAIL.
//! - At most `max_in_flight` forwards wait at once: [`Forwarder::reserve`] hands out a
//!   [`ForwardSlot`] or refuses at once, so a flood of queries for a dead upstream cannot
//!   pile up tasks and sockets.

use super::metrics::{Attempt, DnsMetrics, Transport};
use super::wire::{self, HEADER_LEN, Question, Reader};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub const DEFAULT_FORWARD_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_MAX_FORWARDS: usize = 1024;
/// The largest UDP reply accepted from upstream: the most a client may ask for. A longer
/// datagram is cut by the receive buffer and then replaced by a TC reply.
pub(crate) const MAX_UDP_REPLY: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    #[error("no upstream resolver is configured")]
    NoUpstream,
    #[error("too many queries are waiting for upstream resolvers")]
    Busy,
    #[error("no upstream resolver answered")]
    Failed,
}

/// The upstream resolvers and the bound on forwards in flight.
#[derive(Debug)]
pub struct Forwarder {
    upstreams: Vec<SocketAddr>,
    timeout: Duration,
    slots: Arc<Semaphore>,
    metrics: DnsMetrics,
}

/// A place among the forwards in flight, given back when dropped.
#[derive(Debug)]
pub struct ForwardSlot {
    _permit: OwnedSemaphorePermit,
    metrics: DnsMetrics,
}

impl Drop for ForwardSlot {
    fn drop(&mut self) {
        self.metrics.forwards_in_flight().dec();
    }
}

impl Forwarder {
    pub fn new(
        upstreams: Vec<SocketAddr>,
        timeout: Duration,
        max_in_flight: usize,
        metrics: DnsMetrics,
    ) -> Forwarder {
        Forwarder {
            upstreams,
            timeout,
            slots: Arc::new(Semaphore::new(max_in_flight.min(Semaphore::MAX_PERMITS))),
            metrics,
        }
    }

    pub fn upstreams(&self) -> &[SocketAddr] {
        &self.upstreams
    }

    /// A slot for one forward, or why there is none.
    pub fn reserve(&self) -> Result<ForwardSlot, ForwardError> {
        if self.upstreams.is_empty() {
            return Err(ForwardError::NoUpstream);
        }
        let permit = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| ForwardError::Busy)?;
        self.metrics.forwards_in_flight().inc();
        Ok(ForwardSlot {
            _permit: permit,
            metrics: self.metrics.clone(),
        })
    }

    /// Sends `query` (a whole message with one question) to the upstreams in turn and
    /// returns the first matching reply, with the query's ID.
    pub async fn exchange(
        &self,
        _slot: &ForwardSlot,
        query: &[u8],
        transport: Transport,
    ) -> Result<Vec<u8>, ForwardError> {
        let (header, _, _) = wire::decode_header(query).map_err(|_| ForwardError::Failed)?;
        let question = Reader {
            msg: query,
            pos: HEADER_LEN,
        }
        .question()
        .map_err(|_| ForwardError::Failed)?;
        for &upstream in &self.upstreams {
            let attempt = async {
                match transport {
                    Transport::Udp => udp(upstream, query, header.id, &question).await,
                    Transport::Tcp => tcp(upstream, query, header.id, &question).await,
                }
            };
            match tokio::time::timeout(self.timeout, attempt).await {
                Ok(Ok(reply)) => {
                    self.metrics.attempt(Attempt::Answered);
                    return Ok(reply);
                }
                Ok(Err(error)) => {
                    self.metrics.attempt(Attempt::Error);
                    tracing::debug!(%upstream, %error, "upstream DNS resolver failed");
                }
                Err(_) => {
                    self.metrics.attempt(Attempt::Timeout);
                    tracing::debug!(%upstream, "upstream DNS resolver timed out");
                }
            }
        }
        Err(ForwardError::Failed)
    }
}

async fn udp(
    upstream: SocketAddr,
    query: &[u8],
    client_id: u16,
    question: &Question,
) -> io::Result<Vec<u8>> {
    let local: SocketAddr = if upstream.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(upstream).await?;
    let id: u16 = rand::random();
    let mut out = query.to_vec();
    set_id(&mut out, id);
    socket.send(&out).await?;
    let mut buf = vec![0u8; MAX_UDP_REPLY + 1];
    loop {
        let n = socket.recv(&mut buf).await?;
        let reply = buf.get(..n).unwrap_or_default();
        // Anything else (late replies to an earlier ID, forgeries) is ignored; the caller's
        // timeout bounds the wait.
        if answers(reply, id, question) {
            let mut reply = reply.to_vec();
            set_id(&mut reply, client_id);
            return Ok(reply);
        }
    }
}

async fn tcp(
    upstream: SocketAddr,
    query: &[u8],
    id: u16,
    question: &Question,
) -> io::Result<Vec<u8>> {
    let len = u16::try_from(query.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "query over 65535 bytes"))?;
    let mut stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    let mut frame = Vec::with_capacity(query.len() + 2);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(query);
    stream.write_all(&frame).await?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await?;
    let mut reply = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut reply).await?;
    if answers(&reply, id, question) {
        Ok(reply)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the reply does not answer the query",
        ))
    }
}

fn set_id(msg: &mut [u8], id: u16) {
    if let Some(head) = msg.get_mut(..2) {
        head.copy_from_slice(&id.to_be_bytes());
    }
}

/// Whether `reply` is a response to the query with this ID and question (compared ignoring
/// case, for resolvers that randomise it). Error replies may omit the question.
fn answers(reply: &[u8], id: u16, question: &Question) -> bool {
    let Ok((header, _, counts)) = wire::decode_header(reply) else {
        return false;
    };
    if !header.response || header.id != id {
        return false;
    }
    counts.questions == 0
        || Reader {
            msg: reply,
            pos: HEADER_LEN,
        }
        .question()
        .is_ok_and(|q| q == *question)
}

/// The `nameserver` addresses of a resolv.conf (port 53), without `exclude` (our own listen
/// address: forwarding to ourselves would loop), unspecified addresses and duplicates.
/// Zone-scoped IPv6 addresses (`fe80::1%eth0`) are skipped.
pub fn upstreams_from_resolv_conf(text: &str, exclude: &[IpAddr]) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("nameserver") {
            continue;
        }
        let Some(ip) = words.next().and_then(|w| w.parse::<IpAddr>().ok()) else {
            continue;
        };
        let addr = SocketAddr::new(ip, 53);
        if !exclude.contains(&ip) && !ip.is_unspecified() && !out.contains(&addr) {
            out.push(addr);
        }
    }
    out
}
