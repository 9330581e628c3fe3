//! One node session: a reader (keepalive, ACKs, upstream dispatch) and a writer (the queue).

use super::handshake::Accepted;
use super::queue::NodeQueue;
use super::{Inner, NodeEvent, SessionHandle, Upstream};
use crate::metrics::HubMetrics;
use dashmap::mapref::entry::Entry;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use kubeedge_shared::operation::source::CLOUD_ONLY;
use kubeedge_shared::{Group, Message, Operation, ResourcePath};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

/// An edge's connection: WebSocket over TLS over TCP.
pub(super) type Ws =
    tokio_tungstenite::WebSocketStream<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>;

pub(super) async fn run(inner: Arc<Inner>, ws: Ws, accepted: Accepted, peer: SocketAddr) {
    let node = accepted.node.clone();
    let id = inner.next_session_id();
    let cancel = inner.shutdown.child_token();
    let queue = register(&inner, &accepted, id, cancel.clone());
    tracing::info!(%node, session = id, %peer, project = ?accepted.project_id, inventory = accepted.capabilities.inventory_resync, "edge connected");
    let _ = inner.events.send(NodeEvent::Connected {
        node: node.clone(),
        session: id,
        capabilities: accepted.capabilities.clone(),
    });

    let (sink, stream) = ws.split();
    let writer = tokio::spawn(write_loop(
        inner.clone(),
        node.clone(),
        sink,
        queue.clone(),
        cancel.clone(),
    ));
    let read_end = read_loop(
        &inner,
        stream,
        &node,
        accepted.capabilities.cloud_lease,
        &queue,
        &cancel,
    )
    .await;
    cancel.cancel();
    let write_end = writer.await.ok().flatten();
    let reason = match (read_end, write_end) {
        (ReadEnd::Cancelled, Some(w)) => w,
        (r, _) => r.to_string(),
    };

    let removed = inner.sessions.remove_if(&node, |_, h| h.id == id).is_some();
    if removed {
        inner.metrics.connected_nodes.dec();
        tracing::info!(%node, session = id, %reason, "edge disconnected");
        let _ = inner.events.send(NodeEvent::Disconnected {
            node,
            session: id,
            reason,
        });
    } else {
        tracing::info!(%node, session = id, %reason, "session replaced by a newer connection");
    }
}

/// Installs the session; a newer connection for the same node replaces the older one and
/// inherits its queue, with everything in flight sent again.
fn register(
    inner: &Inner,
    accepted: &Accepted,
    id: u64,
    cancel: CancellationToken,
) -> Arc<NodeQueue> {
    let capabilities = accepted.capabilities.clone();
    // KubeEdge edges (no inventory) get their deliveries recorded as ObjectSyncs.
    let record_deliveries = !capabilities.inventory_resync;
    match inner.sessions.entry(accepted.node.clone()) {
        Entry::Occupied(mut e) => {
            let old = e.get();
            old.cancel.cancel();
            let queue = old.queue.clone();
            queue.set_record_deliveries(record_deliveries);
            queue.requeue_inflight();
            tracing::info!(node = %accepted.node, old = old.id, new = id, "replacing existing session");
            e.insert(SessionHandle {
                id,
                queue: queue.clone(),
                cancel,
                capabilities,
            });
            queue
        }
        Entry::Vacant(e) => {
            let queue = Arc::new(NodeQueue::new(
                inner.config.queue.clone(),
                inner.metrics.clone(),
            ));
            queue.set_record_deliveries(record_deliveries);
            e.insert(SessionHandle {
                id,
                queue: queue.clone(),
                cancel,
                capabilities,
            });
            inner.metrics.connected_nodes.inc();
            queue
        }
    }
}

enum ReadEnd {
    Cancelled,
    KeepaliveTimeout,
    Closed,
    Error(String),
}

impl std::fmt::Display for ReadEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadEnd::Cancelled => f.write_str("session ended by cloudcore"),
            ReadEnd::KeepaliveTimeout => f.write_str("no keepalive within keepaliveInterval"),
            ReadEnd::Closed => f.write_str("connection closed by edge"),
            ReadEnd::Error(e) => write!(f, "read error: {e}"),
        }
    }
}

async fn read_loop(
    inner: &Inner,
    mut stream: SplitStream<Ws>,
    node: &str,
    cloud_lease: Option<u32>,
    queue: &NodeQueue,
    cancel: &CancellationToken,
) -> ReadEnd {
    let interval = inner.config.keepalive_interval;
    let mut deadline = Instant::now() + interval;
    // Reported at least as often as the kubelet renews (a quarter of the lease's duration):
    // at most every fifth, so that a frame arriving a little early is not skipped. The
    // handshake itself is the first sign of life.
    let report_every = std::time::Duration::from_millis(u64::from(cloud_lease.unwrap_or(40)) * 200);
    let mut next_report = Instant::now();
    let mut heard = |now: Instant| {
        let Some(lease_secs) = cloud_lease else {
            return;
        };
        if now >= next_report && inner.notify_heard(node, std::time::SystemTime::now(), lease_secs)
        {
            next_report = now + report_every;
        }
    };
    heard(Instant::now());
    let node_bytes = inner.metrics.node_counter(node, "up");
    loop {
        let frame = tokio::select! {
            biased;
            _ = cancel.cancelled() => return ReadEnd::Cancelled,
            _ = sleep_until(deadline) => return ReadEnd::KeepaliveTimeout,
            f = stream.next() => f,
        };
        if let Some(Ok(m)) = &frame {
            node_bytes.inc_by(m.len() as u64);
            // Any frame shows the edge alive: a keepalive message (KubeEdge's edges), or
            // the ping of an edge with `ping-keepalive`.
            let now = Instant::now();
            deadline = now + interval;
            heard(now);
        }
        let bytes = match frame {
            None => return ReadEnd::Closed,
            Some(Err(e)) => return ReadEnd::Error(e.to_string()),
            Some(Ok(WsMessage::Text(t))) => t.into(),
            Some(Ok(WsMessage::Binary(b))) => b,
            Some(Ok(WsMessage::Close(_))) => return ReadEnd::Closed,
            Some(Ok(WsMessage::Ping(p))) => {
                // Answered by tungstenite.
                inner.metrics.frame("up", "ping", p.len());
                continue;
            }
            Some(Ok(other)) => {
                inner.metrics.frame("up", "pong", other.len());
                continue;
            }
        };
        let msg = match inner.codec.decode(&bytes) {
            Ok(m) => m,
            Err(e) => {
                inner.metrics.malformed_frames.inc();
                tracing::warn!(node, error = %e, "malformed frame from edge dropped");
                continue;
            }
        };
        let kind = match msg.route.operation {
            Operation::Keepalive => "keepalive",
            Operation::Response => "ack",
            _ => msg
                .resource_type()
                .map(|t| kubeedge_shared::ResourceType::parse(t).metric_label())
                .unwrap_or("other"),
        };
        inner.metrics.frame("up", kind, bytes.len());
        match msg.route.operation {
            Operation::Keepalive => {}
            Operation::Response => match queue.ack(&msg.header.parent_id) {
                Some(acked) => {
                    tracing::trace!(node, msg_id = %acked.msg_id, resource = %msg.route.resource, uid = ?acked.uid, rv = acked.resource_version, "edge acknowledged");
                    inner
                        .metrics
                        .messages_acked
                        .get_or_create(&HubMetrics::resource(&acked.resource_type))
                        .inc();
                    inner.notify_acked(node, acked);
                }
                None => {
                    inner.metrics.unmatched_acks.inc();
                }
            },
            Operation::Error => {
                tracing::warn!(node, resource = %msg.route.resource, parent = %msg.header.parent_id, content = %msg.content, "edge reported an error");
            }
            _ => {
                if CLOUD_ONLY.contains(&msg.route.source.as_str()) {
                    tracing::warn!(node, source = %msg.route.source, "upstream message claims a cloud module as source; dropped");
                    continue;
                }
                if !dispatch_upstream(inner, node, msg, bytes.len(), cancel).await {
                    return ReadEnd::Cancelled;
                }
            }
        }
    }
}

async fn dispatch_upstream(
    inner: &Inner,
    node: &str,
    msg: Message,
    frame_bytes: usize,
    cancel: &CancellationToken,
) -> bool {
    // The router's traffic (group `user`, as KubeEdge's dispatcher sends `upload`s to its
    // router module) carries topics, URLs or nothing as its resource: not a resource path.
    if msg.route.group == Group::User {
        inner.dispatch_router(node, msg, frame_bytes);
        return true;
    }
    // The resource is parsed here, once; the controllers get it typed. A MetaServer request's
    // resource is `null` (or `watchapp/sync`): it carries its key inside.
    let parsed = if kubeedge_shared::application::Application::is_request(&msg) {
        Ok(ResourcePath {
            namespace: None,
            resource_type: kubeedge_shared::ResourceType::Other("application".into()),
            name: None,
        })
    } else {
        // KubeEdge's edge names a CSR it creates with `generateName` as
        // `default/certificatesigningrequest/` (an empty name).
        let r = msg.route.resource.as_str();
        ResourcePath::parse(r.strip_suffix('/').unwrap_or(r))
    };
    let path = match parsed {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(node, resource = %msg.route.resource, error = %e, "malformed resource path from edge; dropped");
            inner.metrics.malformed_frames.inc();
            return true;
        }
    };
    inner
        .metrics
        .messages_received
        .get_or_create(&HubMetrics::resource(&path.resource_type))
        .inc();
    let up = Upstream {
        node: node.to_string(),
        path,
        message: msg,
    };
    tokio::select! {
        r = inner.upstream.send(up) => {
            if r.is_err() {
                tracing::debug!(node, "no upstream consumer; message dropped");
            }
            true
        }
        _ = cancel.cancelled() => false,
    }
}

/// Writes what the queue releases. Returns why it stopped when that was a write failure.
async fn write_loop(
    inner: Arc<Inner>,
    node: String,
    mut sink: SplitSink<Ws, WsMessage>,
    queue: Arc<NodeQueue>,
    cancel: CancellationToken,
) -> Option<String> {
    let timeout = inner.config.write_timeout;
    let node_bytes = inner.metrics.node_counter(&node, "down");
    let mut failure = None;
    'outer: while !cancel.is_cancelled() {
        let (batch, next) = queue.take_ready(Instant::now());
        if batch.is_empty() {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = queue.changed() => {}
                _ = sleep_opt(next) => {}
            }
            continue;
        }
        for out in batch {
            let label = HubMetrics::resource(&out.resource_type);
            if out.resend {
                inner.metrics.messages_resent.get_or_create(&label).inc();
            } else {
                inner.metrics.messages_sent.get_or_create(&label).inc();
            }
            inner.metrics.frame("down", label.resource, out.frame.len());
            node_bytes.inc_by(out.frame.len() as u64);
            match tokio::time::timeout(timeout, sink.feed(WsMessage::Text(out.frame))).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    failure = Some(format!("write error: {e}"));
                    break 'outer;
                }
                Err(_) => {
                    failure = Some(format!("write timed out after {timeout:?}"));
                    break 'outer;
                }
            }
        }
        match tokio::time::timeout(timeout, sink.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                failure = Some(format!("write error: {e}"));
                break;
            }
            Err(_) => {
                failure = Some(format!("write timed out after {timeout:?}"));
                break;
            }
        }
    }
    cancel.cancel();
    if failure.is_none() {
        let close = CloseFrame {
            code: CloseCode::Away,
            reason: "session ended".into(),
        };
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            sink.send(WsMessage::Close(Some(close))),
        )
        .await;
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), sink.close()).await;
    failure
}

async fn sleep_opt(at: Option<Instant>) {
    match at {
        Some(t) => sleep_until(t).await,
        None => std::future::pending().await,
    }
}
