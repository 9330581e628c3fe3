//! One client connection of the internal broker: CONNECT, then packets in both directions
//! until DISCONNECT, an error, the keepalive running out, a takeover or shutdown.

use super::{BrokerSettings, Command};
use crate::eventbus::metrics::{EventBusMetrics, Malformed};
use crate::eventbus::topics;
use bytes::BytesMut;
use rumqttc::mqttbytes::Error as Wire;
use rumqttc::{
    ConnAck, ConnectReturnCode, Packet, PubAck, PubComp, PubRec, PubRel, Publish, QoS, SubAck,
    SubscribeReasonCode, UnsubAck,
};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A client must send CONNECT within this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A client that does not take a packet within this is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Unacknowledged QoS 2 packet IDs remembered per client (to drop resent duplicates).
const MAX_AWAITING_REL: usize = 1024;

static AUTO_ID: AtomicU64 = AtomicU64::new(1);

/// Why a connection ended.
enum End {
    /// DISCONNECT: no will.
    Clean,
    /// Anything else: the will is published.
    Abrupt,
}

pub(super) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    commands: mpsc::Sender<Command>,
    settings: BrokerSettings,
    metrics: EventBusMetrics,
    cancel: CancellationToken,
    _slot: OwnedSemaphorePermit,
) {
    let (rd, wr) = stream.into_split();
    let mut reader = PacketReader::new(rd, settings.max_packet);
    let mut writer = PacketWriter::new(wr, settings.max_packet);
    let connect = tokio::select! {
        _ = cancel.cancelled() => return,
        r = tokio::time::timeout(CONNECT_TIMEOUT, reader.next()) => r,
    };
    let connect = match connect {
        Ok(Ok(Some(Packet::Connect(c)))) => c,
        Ok(Err(Wire::InvalidProtocolLevel(level))) => {
            metrics.broker_refused_clients.inc();
            tracing::info!(%peer, level, "eventbus: internal broker: unsupported MQTT version");
            let _ = writer
                .send(Packet::ConnAck(ConnAck::new(
                    ConnectReturnCode::RefusedProtocolVersion,
                    false,
                )))
                .await;
            return;
        }
        Ok(Ok(None)) => return,
        Ok(Ok(Some(other))) => {
            metrics.broker_refused_clients.inc();
            metrics.count_malformed(Malformed::Protocol);
            tracing::info!(%peer, bytes = other.size(), "eventbus: internal broker: first packet is not CONNECT");
            return;
        }
        Ok(Err(e)) => {
            metrics.broker_refused_clients.inc();
            count_wire_error(&metrics, &e, peer);
            return;
        }
        Err(_) => {
            metrics.broker_refused_clients.inc();
            tracing::info!(%peer, "eventbus: internal broker: no CONNECT in time");
            return;
        }
    };
    let client_id = if connect.client_id.is_empty() {
        if !connect.clean_session {
            // MQTT 3.1.1 §3.1.3.1: an empty ID needs a clean session.
            let _ = writer
                .send(Packet::ConnAck(ConnAck::new(
                    ConnectReturnCode::BadClientId,
                    false,
                )))
                .await;
            return;
        }
        format!("auto-{}", AUTO_ID.fetch_add(1, Ordering::Relaxed))
    } else {
        connect.client_id.clone()
    };
    let will = connect.last_will.as_ref().and_then(|w| {
        if !topics::valid_topic(&w.topic) {
            return None;
        }
        let mut p = Publish::from_bytes(w.topic.clone(), w.qos, w.message.clone());
        p.retain = w.retain;
        Some(p)
    });
    let (outbox, mut inbox) = mpsc::channel(settings.session_queue.max(1));
    let kick = cancel.child_token();
    let (reply, session) = oneshot::channel();
    if commands
        .send(Command::Connect {
            client_id: client_id.clone(),
            outbox,
            kick: kick.clone(),
            will,
            reply,
        })
        .await
        .is_err()
    {
        return;
    }
    let Ok(session) = session.await else { return };
    if writer
        .send(Packet::ConnAck(ConnAck::new(
            ConnectReturnCode::Success,
            false,
        )))
        .await
        .is_err()
    {
        let _ = commands
            .send(Command::Disconnect {
                session,
                send_will: false,
            })
            .await;
        return;
    }
    tracing::debug!(%peer, client_id, "eventbus: internal broker: client connected");

    let keep_alive = (connect.keep_alive > 0)
        .then(|| Duration::from_millis(u64::from(connect.keep_alive) * 1500));
    let mut link = Link {
        session,
        writer,
        commands: commands.clone(),
        metrics: metrics.clone(),
        peer,
        next_pkid: 0,
        awaiting_rel: HashSet::new(),
    };
    let end = loop {
        let deadline = keep_alive.map(|k| Instant::now() + k);
        let idle = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = kick.cancelled() => break End::Abrupt,
            _ = idle => {
                tracing::info!(%peer, client_id, "eventbus: internal broker: keepalive expired");
                break End::Abrupt;
            }
            out = inbox.recv() => {
                let Some(p) = out else { break End::Abrupt };
                if link.deliver(p).await.is_err() {
                    break End::Abrupt;
                }
            }
            incoming = reader.next() => match incoming {
                Ok(Some(Packet::Disconnect)) => break End::Clean,
                Ok(Some(packet)) => {
                    if link.handle(packet).await.is_err() {
                        break End::Abrupt;
                    }
                }
                Ok(None) => break End::Abrupt,
                Err(e) => {
                    count_wire_error(&metrics, &e, peer);
                    break End::Abrupt;
                }
            },
        }
    };
    tracing::debug!(%peer, client_id, "eventbus: internal broker: client gone");
    let _ = commands
        .send(Command::Disconnect {
            session,
            send_will: matches!(end, End::Abrupt) && !cancel.is_cancelled(),
        })
        .await;
}

fn count_wire_error(metrics: &EventBusMetrics, e: &Wire, peer: SocketAddr) {
    let kind = match e {
        Wire::Io(_) => return,
        Wire::TopicNotUtf8 => Malformed::TopicNotUtf8,
        Wire::PayloadSizeLimitExceeded(_) => Malformed::PacketTooLarge,
        _ => Malformed::Protocol,
    };
    metrics.count_malformed(kind);
    tracing::warn!(%peer, error = %e, "eventbus: internal broker: malformed packet, connection closed");
}

/// A connected client, as the session loop sees it.
struct Link {
    session: u64,
    writer: PacketWriter,
    commands: mpsc::Sender<Command>,
    metrics: EventBusMetrics,
    peer: SocketAddr,
    next_pkid: u16,
    awaiting_rel: HashSet<u16>,
}

/// The connection cannot go on.
struct Closed;

impl Link {
    async fn deliver(&mut self, mut p: Publish) -> Result<(), Closed> {
        if p.qos != QoS::AtMostOnce {
            self.next_pkid = self.next_pkid.checked_add(1).unwrap_or(1);
            p.pkid = self.next_pkid;
        }
        self.writer.send(Packet::Publish(p)).await
    }

    async fn handle(&mut self, packet: Packet) -> Result<(), Closed> {
        match packet {
            Packet::Publish(p) => {
                if !topics::valid_topic(&p.topic) {
                    self.metrics.count_malformed(Malformed::Protocol);
                    tracing::warn!(peer = %self.peer, "eventbus: internal broker: PUBLISH to a wildcard or empty topic, connection closed");
                    return Err(Closed);
                }
                let pkid = p.pkid;
                match p.qos {
                    QoS::AtMostOnce => self.route(p).await?,
                    QoS::AtLeastOnce => {
                        self.route(p).await?;
                        self.writer.send(Packet::PubAck(PubAck::new(pkid))).await?;
                    }
                    QoS::ExactlyOnce => {
                        // Route once; a resent copy (same ID before PUBREL) is only acknowledged.
                        if !self.awaiting_rel.contains(&pkid) {
                            if self.awaiting_rel.len() >= MAX_AWAITING_REL {
                                self.metrics.count_malformed(Malformed::Protocol);
                                return Err(Closed);
                            }
                            self.awaiting_rel.insert(pkid);
                            self.route(p).await?;
                        }
                        self.writer.send(Packet::PubRec(PubRec::new(pkid))).await?;
                    }
                }
                Ok(())
            }
            Packet::PubRel(r) => {
                self.awaiting_rel.remove(&r.pkid);
                self.writer
                    .send(Packet::PubComp(PubComp::new(r.pkid)))
                    .await
            }
            Packet::PubRec(r) => self.writer.send(Packet::PubRel(PubRel::new(r.pkid))).await,
            Packet::PubAck(_) | Packet::PubComp(_) => Ok(()),
            Packet::Subscribe(s) => {
                let mut codes = Vec::with_capacity(s.filters.len());
                let mut accepted = Vec::new();
                for f in s.filters {
                    if topics::valid_filter(&f.path) {
                        codes.push(SubscribeReasonCode::Success(f.qos));
                        accepted.push((f.path, f.qos));
                    } else {
                        codes.push(SubscribeReasonCode::Failure);
                    }
                }
                let (reply, retained) = oneshot::channel();
                self.commands
                    .send(Command::Subscribe {
                        session: self.session,
                        filters: accepted,
                        reply,
                    })
                    .await
                    .map_err(|_| Closed)?;
                let retained = retained.await.map_err(|_| Closed)?;
                self.writer
                    .send(Packet::SubAck(SubAck::new(s.pkid, codes)))
                    .await?;
                for p in retained {
                    self.deliver(p).await?;
                }
                Ok(())
            }
            Packet::Unsubscribe(u) => {
                self.commands
                    .send(Command::Unsubscribe {
                        session: self.session,
                        filters: u.topics,
                    })
                    .await
                    .map_err(|_| Closed)?;
                self.writer
                    .send(Packet::UnsubAck(UnsubAck::new(u.pkid)))
                    .await
            }
            Packet::PingReq => self.writer.send(Packet::PingResp).await,
            Packet::Connect(_)
            | Packet::ConnAck(_)
            | Packet::SubAck(_)
            | Packet::UnsubAck(_)
            | Packet::PingResp
            | Packet::Disconnect => {
                self.metrics.count_malformed(Malformed::Protocol);
                tracing::warn!(peer = %self.peer, "eventbus: internal broker: unexpected packet from a client, connection closed");
                Err(Closed)
            }
        }
    }

    async fn route(&mut self, publish: Publish) -> Result<(), Closed> {
        self.commands
            .send(Command::Publish {
                from: Some(self.session),
                publish,
            })
            .await
            .map_err(|_| Closed)
    }
}

/// Reads whole packets; cancel-safe (a partly read packet stays in the buffer).
struct PacketReader {
    rd: OwnedReadHalf,
    buf: BytesMut,
    max_packet: usize,
}

impl PacketReader {
    fn new(rd: OwnedReadHalf, max_packet: usize) -> Self {
        PacketReader {
            rd,
            buf: BytesMut::with_capacity(4096),
            max_packet,
        }
    }

    /// The next packet; `None` at end of stream.
    async fn next(&mut self) -> Result<Option<Packet>, Wire> {
        loop {
            match Packet::read(&mut self.buf, self.max_packet) {
                Ok(p) => return Ok(Some(p)),
                Err(Wire::InsufficientBytes(_)) => {}
                Err(e) => return Err(e),
            }
            if self.rd.read_buf(&mut self.buf).await? == 0 {
                return Ok(None);
            }
        }
    }
}

struct PacketWriter {
    wr: OwnedWriteHalf,
    buf: BytesMut,
    max_packet: usize,
}

impl PacketWriter {
    fn new(wr: OwnedWriteHalf, max_packet: usize) -> Self {
        PacketWriter {
            wr,
            buf: BytesMut::with_capacity(4096),
            max_packet,
        }
    }

    async fn send(&mut self, packet: Packet) -> Result<(), Closed> {
        self.buf.clear();
        // Deliveries are bounded by what clients may send, so this only fails on a bug.
        packet
            .write(&mut self.buf, self.max_packet.saturating_mul(2))
            .map_err(|_| Closed)?;
        match tokio::time::timeout(WRITE_TIMEOUT, self.wr.write_all(&self.buf)).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(Closed),
        }
    }
}
