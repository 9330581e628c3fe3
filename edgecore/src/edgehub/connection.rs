//! The connect loop and one live connection: a reader task and a writer task.

use super::dial::{Ws, dial};
use super::routes::{Route, Routes};
use super::{CloudTerms, LinkEvent, Shared};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use kubeedge_shared::backoff::Backoff;
use kubeedge_shared::{FrameCodec, Message};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_util::sync::CancellationToken;

pub(super) async fn connect_loop(
    shared: Arc<Shared>,
    mut outbound: mpsc::Receiver<Message>,
    routes: Routes,
) {
    let cfg = shared.config.clone();
    let mut failures: u32 = 0;
    let mut backoff = Backoff::new(cfg.reconnect_initial, cfg.reconnect_max).jittered();
    while !shared.shutdown.is_cancelled() {
        let attempt = tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            r = tokio::time::timeout(cfg.handshake_timeout, dial(&cfg, shared.tls())) => r,
        };
        match attempt {
            Ok(Ok((ws, offered))) => {
                failures = 0;
                backoff.reset();
                let recycle = CancellationToken::new();
                *shared.recycle.lock().unwrap_or_else(|e| e.into_inner()) = recycle.clone();
                let terms = CloudTerms::agreed(&cfg.capabilities, &offered);
                shared.terms.send_replace(terms);
                // Anything queued while offline was refused to its sender already, except what
                // raced with the disconnect: send it on the new link.
                shared.connected.store(true, Ordering::Release);
                tracing::info!(server = %cfg.server, node = %cfg.node_name, ping_keepalive = terms.ping_keepalive, cloud_lease = terms.cloud_lease, "connected to cloudhub");
                let _ = shared.events.send(LinkEvent::Connected);
                let reason = run(&shared, ws, terms, &mut outbound, &routes, &recycle).await;
                shared.connected.store(false, Ordering::Release);
                shared.terms.send_replace(CloudTerms::default());
                // Waiters for replies on this link will not get them.
                shared.lock_pending().clear();
                tracing::warn!(server = %cfg.server, %reason, "disconnected from cloudhub");
                let _ = shared.events.send(LinkEvent::Disconnected { reason });
            }
            Ok(Err(e)) => {
                failures = failures.saturating_add(1);
                tracing::warn!(error = %e, attempt = failures, "cannot connect to cloudhub");
            }
            Err(_) => {
                failures = failures.saturating_add(1);
                tracing::warn!(server = %cfg.server, timeout = ?cfg.handshake_timeout, "cloudhub handshake timed out");
            }
        }
        let delay = backoff.next_delay();
        tracing::debug!(?delay, "reconnecting after delay");
        tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// Link state shared by the reader and writer of one connection.
struct Liveness {
    start: Instant,
    /// Milliseconds since `start` of the last frame received.
    last_rx_ms: AtomicU64,
    /// The reader is waiting for the edge modules to take a message: not a link problem.
    reader_busy: AtomicBool,
}

impl Liveness {
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_rx_ms.store(ms, Ordering::Release);
    }

    fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_rx_ms.load(Ordering::Acquire));
        self.start.elapsed().saturating_sub(last)
    }
}

async fn run(
    shared: &Arc<Shared>,
    ws: Ws,
    terms: CloudTerms,
    outbound: &mut mpsc::Receiver<Message>,
    routes: &Routes,
    recycle: &CancellationToken,
) -> String {
    let (sink, stream) = ws.split();
    let live = Arc::new(Liveness {
        start: Instant::now(),
        last_rx_ms: AtomicU64::new(0),
        reader_busy: AtomicBool::new(false),
    });
    let stop = recycle.child_token();
    let reader = tokio::spawn(read_loop(
        shared.clone(),
        stream,
        routes.clone(),
        live.clone(),
        stop.clone(),
    ));
    let write_end = tokio::select! {
        r = write_loop(shared, sink, terms, outbound, &live, &stop) => r,
        _ = shared.shutdown.cancelled() => "edgecore shutting down".to_string(),
    };
    stop.cancel();
    let read_end = reader.await.ok().flatten();
    read_end.unwrap_or(write_end)
}

async fn read_loop(
    shared: Arc<Shared>,
    mut stream: SplitStream<Ws>,
    routes: Routes,
    live: Arc<Liveness>,
    stop: CancellationToken,
) -> Option<String> {
    let codec = FrameCodec::new(shared.config.max_frame_bytes);
    let end = loop {
        let frame = tokio::select! {
            _ = stop.cancelled() => return None,
            f = stream.next() => f,
        };
        live.touch();
        let bytes = match frame {
            None => break "connection closed by cloud".to_string(),
            Some(Err(e)) => break format!("read error: {e}"),
            Some(Ok(WsMessage::Text(t))) => t.into(),
            Some(Ok(WsMessage::Binary(b))) => b,
            Some(Ok(WsMessage::Close(f))) => {
                break format!(
                    "closed by cloud{}",
                    f.map(|f| format!(": {}", f.reason)).unwrap_or_default()
                );
            }
            Some(Ok(_)) => continue, // pong (or ping, answered by tungstenite)
        };
        let msg = match codec.decode(&bytes) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "malformed frame from cloud dropped");
                continue;
            }
        };
        if !msg.header.parent_id.is_empty()
            && let Some(waiter) = shared.lock_pending().remove(&msg.header.parent_id)
        {
            let _ = waiter.send(msg);
            continue;
        }
        // metamanager stopping means the edge stops; another module's, that it is off.
        let (module, tx, vital) = match routes.of(&msg) {
            Route::Meta(tx) => ("metamanager", tx, true),
            Route::Module(module, tx) => (module, tx, false),
            Route::Drop(module, why) => {
                if msg.route.group == kubeedge_shared::Group::TaskManager {
                    tracing::info!(resource = %msg.route.resource, "node task for a disabled taskmanager; dropped (modules.taskManager.enable)");
                } else {
                    tracing::debug!(module, group = %msg.route.group, resource = %msg.route.resource, why, "cloud message dropped");
                }
                continue;
            }
        };
        // A full module queue pauses reading from the cloud (never drops).
        live.reader_busy.store(true, Ordering::Release);
        let delivered = tokio::select! {
            r = tx.send(msg) => r.is_ok(),
            _ = stop.cancelled() => return None,
        };
        live.reader_busy.store(false, Ordering::Release);
        live.touch();
        if !delivered {
            if vital {
                break "edge modules stopped".to_string();
            }
            tracing::debug!(module, "module stopped; cloud message dropped");
        }
    };
    stop.cancel();
    Some(end)
}

async fn write_loop(
    shared: &Shared,
    mut sink: SplitSink<Ws, WsMessage>,
    terms: CloudTerms,
    outbound: &mut mpsc::Receiver<Message>,
    live: &Liveness,
    stop: &CancellationToken,
) -> String {
    let cfg = &shared.config;
    let codec = FrameCodec::new(cfg.max_frame_bytes);
    let mut keepalive = tokio::time::interval(cfg.heartbeat);
    keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let check_every =
        (cfg.dead_link_timeout / 8).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut liveness_check = tokio::time::interval(check_every);
    let end = loop {
        let frames = tokio::select! {
            _ = stop.cancelled() => break "link closed".to_string(),
            _ = keepalive.tick() => {
                // The ping makes the cloud answer (pong) even though keepalives get no reply,
                // so a frozen or half-open link shows up as silence. A cloud that takes any
                // frame as a keepalive needs nothing else (28 bytes of TLS record, not ~220).
                let ping = WsMessage::Ping(Default::default());
                if terms.ping_keepalive {
                    vec![ping]
                } else {
                    let ka = codec.encode(&Message::keepalive()).unwrap_or_default();
                    vec![WsMessage::Text(ka.into()), ping]
                }
            }
            _ = liveness_check.tick() => {
                let silent = live.silent_for();
                if silent > cfg.dead_link_timeout && !live.reader_busy.load(Ordering::Acquire) {
                    break format!("no frame from the cloud for {silent:?}: link presumed dead");
                }
                continue;
            }
            m = outbound.recv() => {
                let Some(first) = m else { break "edgehub shut down".to_string() };
                let mut batch = Vec::with_capacity(8);
                let mut next = Some(first);
                while let Some(msg) = next.take() {
                    match codec.encode(&msg) {
                        Ok(text) => batch.push(WsMessage::Text(text.into())),
                        Err(e) => tracing::warn!(error = %e, resource = %msg.route.resource, "message not sent"),
                    }
                    if batch.len() < 256 {
                        next = outbound.try_recv().ok();
                    }
                }
                batch
            }
        };
        let write = async {
            for f in frames {
                sink.feed(f).await?;
            }
            sink.flush().await
        };
        match tokio::time::timeout(cfg.write_timeout, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => break format!("write error: {e}"),
            Err(_) => break format!("write timed out after {:?}", cfg.write_timeout),
        }
    };
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
    end
}
