//! Tunnel sessions: one per connected edge (keyed by node name and internal IP), each with
//! the apiserver connections it carries. Connect IDs come from one counter for all sessions,
//! as in KubeEdge. Data from the edge goes to a connection through a bounded channel; a
//! connection whose reader stalls longer than [`STALL_LIMIT`] is dropped (and the edge told
//! with REMOVE_CONNECT) so that it cannot hold up the other connections of the tunnel.

use kubeedge_shared::stream::{MessageType, TunnelMessage};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Data chunks buffered per connection before the tunnel waits for its reader.
pub const CONN_BUFFER: usize = 64;
/// How long a connection's reader may keep the tunnel waiting.
pub const STALL_LIMIT: Duration = Duration::from_secs(10);
/// Frames waiting to be written to one tunnel.
pub const OUT_BUFFER: usize = 256;
/// Connections one tunnel carries at most: the stream port takes requests from anyone who
/// reaches it (as KubeEdge, client certificates are not verified there), and every
/// connection is a reader task on the edge.
pub const MAX_CONNS: usize = 256;

/// Why a connection could not be opened on a tunnel.
#[derive(Debug, PartialEq, Eq)]
pub enum OpenError {
    Closed,
    Full,
}

/// What the session writer sends.
#[derive(Debug)]
pub enum Outgoing {
    Message(TunnelMessage),
    Pong(Vec<u8>),
}

/// What the edge at the other end of a tunnel serves beyond KubeEdge's connect types, from
/// its `X-KubeEdge-RS-Capabilities` handshake header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EdgeCapabilities {
    /// PORT_FORWARD_CONNECT (released KubeEdge edges crash on it).
    pub port_forward: bool,
    /// RELAY_CONNECT (edgemesh's relay between edges).
    pub relay: bool,
}

impl EdgeCapabilities {
    /// From the handshake header's comma-separated value.
    pub fn parse(header: &str) -> Self {
        let has = |cap: &str| header.split(',').any(|c| c.trim() == cap);
        EdgeCapabilities {
            port_forward: has(kubeedge_shared::constants::CAPABILITY_PORT_FORWARD),
            relay: has(kubeedge_shared::constants::CAPABILITY_RELAY),
        }
    }
}

pub struct Session {
    pub node: String,
    pub capabilities: EdgeCapabilities,
    serial: u64,
    out: mpsc::Sender<Outgoing>,
    conns: Mutex<HashMap<u64, mpsc::Sender<Vec<u8>>>>,
    pub closed: CancellationToken,
}

impl Session {
    /// Queues a message for the edge; false when the tunnel is gone.
    pub async fn send(&self, m: TunnelMessage) -> bool {
        tokio::select! {
            r = self.out.send(Outgoing::Message(m)) => r.is_ok(),
            _ = self.closed.cancelled() => false,
        }
    }

    /// Queues a message without waiting (for clean-up paths).
    pub fn try_send(&self, m: TunnelMessage) {
        if let Err(e) = self.out.try_send(Outgoing::Message(m)) {
            tracing::debug!(node = %self.node, error = %e, "tunnel message not queued");
        }
    }

    pub async fn pong(&self, data: Vec<u8>) {
        let _ = self.out.send(Outgoing::Pong(data)).await;
    }

    /// Forgets a connection; whether it was still open.
    pub fn remove_conn(&self, id: u64) -> bool {
        self.conns
            .lock()
            .map(|mut c| c.remove(&id).is_some())
            .unwrap_or(false)
    }

    /// Connections open on this tunnel.
    pub fn conn_count(&self) -> usize {
        self.conns.lock().map(|c| c.len()).unwrap_or(0)
    }

    fn conn(&self, id: u64) -> Option<mpsc::Sender<Vec<u8>>> {
        self.conns.lock().ok()?.get(&id).cloned()
    }

    /// Hands a DATA message to its connection, waiting at most [`STALL_LIMIT`].
    pub async fn deliver(&self, id: u64, data: Vec<u8>) {
        self.deliver_within(id, data, STALL_LIMIT).await
    }

    async fn deliver_within(&self, id: u64, data: Vec<u8>, limit: Duration) {
        let Some(tx) = self.conn(id) else {
            tracing::debug!(node = %self.node, id, "data for an unknown connection dropped");
            return;
        };
        match tokio::time::timeout(limit, tx.send(data)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                self.remove_conn(id);
            }
            Err(_) => {
                tracing::warn!(node = %self.node, id, "stream client stalled; ending its connection");
                self.remove_conn(id);
                self.try_send(TunnelMessage::new(
                    id,
                    MessageType::RemoveConnect,
                    Vec::new(),
                ));
            }
        }
    }

    fn close(&self) {
        self.closed.cancel();
        if let Ok(mut c) = self.conns.lock() {
            c.clear();
        }
    }
}

#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Arc<Session>>>,
    next_id: AtomicU64,
    next_serial: AtomicU64,
}

impl Sessions {
    /// Registers a new tunnel (replacing and closing an older one of the same node; an IP
    /// key another node held now points at this one).
    pub fn add(
        &self,
        node: &str,
        ip: &str,
        capabilities: EdgeCapabilities,
        out: mpsc::Sender<Outgoing>,
    ) -> Arc<Session> {
        let session = Arc::new(Session {
            node: node.to_string(),
            capabilities,
            serial: self.next_serial.fetch_add(1, Ordering::Relaxed),
            out,
            conns: Mutex::new(HashMap::new()),
            closed: CancellationToken::new(),
        });
        let mut old = Vec::new();
        if let Ok(mut map) = self.map.lock() {
            for key in [node, ip] {
                if key.is_empty() {
                    continue;
                }
                if let Some(prev) = map.insert(key.to_string(), session.clone()) {
                    old.push(prev);
                }
            }
        }
        for prev in old {
            // Only the node's own older tunnel ends: edges in different private networks
            // may report the same internal IP, and that must not close each other's tunnels.
            if prev.serial != session.serial && prev.node == session.node {
                prev.close();
            }
        }
        session
    }

    /// Removes a session that ended (unless a newer one took its keys).
    pub fn remove(&self, session: &Session) {
        session.close();
        if let Ok(mut map) = self.map.lock() {
            map.retain(|_, s| s.serial != session.serial);
        }
    }

    pub fn get(&self, key: &str) -> Option<Arc<Session>> {
        self.map.lock().ok()?.get(key).cloned()
    }

    /// A new connection on `session`: its id and the channel its data arrives on.
    pub fn open(&self, session: &Session) -> Result<(u64, mpsc::Receiver<Vec<u8>>), OpenError> {
        self.open_within(session, MAX_CONNS)
    }

    fn open_within(
        &self,
        session: &Session,
        max: usize,
    ) -> Result<(u64, mpsc::Receiver<Vec<u8>>), OpenError> {
        if session.closed.is_cancelled() {
            return Err(OpenError::Closed);
        }
        let mut conns = session.conns.lock().map_err(|_| OpenError::Closed)?;
        if conns.len() >= max {
            return Err(OpenError::Full);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = mpsc::channel(CONN_BUFFER);
        conns.insert(id, tx);
        Ok((id, rx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_come_from_the_handshake_header() {
        assert!(EdgeCapabilities::parse("inventory-resync, port-forward").port_forward);
        assert!(EdgeCapabilities::parse("port-forward").port_forward);
        assert!(!EdgeCapabilities::parse("").port_forward, "a KubeEdge edge");
        assert!(!EdgeCapabilities::parse("port-forwarding").port_forward);
        assert!(EdgeCapabilities::parse("port-forward,relay").relay);
        assert!(!EdgeCapabilities::parse("port-forward").relay);
    }

    #[tokio::test]
    async fn reconnecting_edge_replaces_its_session() {
        let s = Sessions::default();
        let (tx, _rx) = mpsc::channel(1);
        let a = s.add("n1", "10.0.0.1", EdgeCapabilities::default(), tx.clone());
        let (id, mut data) = s.open(&a).unwrap();
        let b = s.add("n1", "10.0.0.1", EdgeCapabilities::default(), tx);
        assert!(a.closed.is_cancelled());
        assert!(data.recv().await.is_none(), "old connections end");
        assert_eq!(s.open(&a).err(), Some(OpenError::Closed));
        s.remove(&a);
        assert_eq!(s.get("n1").map(|x| x.serial), Some(b.serial));
        let (id2, _) = s.open(&b).unwrap();
        assert!(id2 > id);
        s.remove(&b);
        assert!(s.get("n1").is_none() && s.get("10.0.0.1").is_none());
    }

    #[tokio::test]
    async fn a_tunnel_carries_a_bounded_number_of_connections() {
        let s = Sessions::default();
        let (tx, _rx) = mpsc::channel(1);
        let a = s.add("n1", "", EdgeCapabilities::default(), tx);
        let first = s.open_within(&a, 2).unwrap();
        let _second = s.open_within(&a, 2).unwrap();
        assert_eq!(s.open_within(&a, 2).err(), Some(OpenError::Full));
        assert_eq!(a.conn_count(), 2);
        a.remove_conn(first.0);
        assert!(s.open_within(&a, 2).is_ok(), "room again once one ends");
    }

    #[tokio::test]
    async fn nodes_sharing_an_internal_ip_keep_their_tunnels() {
        let s = Sessions::default();
        let (tx, _rx) = mpsc::channel(1);
        let a = s.add(
            "n1",
            "192.168.1.10",
            EdgeCapabilities::default(),
            tx.clone(),
        );
        let b = s.add("n2", "192.168.1.10", EdgeCapabilities::default(), tx);
        assert!(!a.closed.is_cancelled(), "n2 must not close n1's tunnel");
        assert!(s.open(&a).is_ok());
        assert_eq!(s.get("n1").map(|x| x.serial), Some(a.serial));
        assert_eq!(s.get("n2").map(|x| x.serial), Some(b.serial));
        s.remove(&b);
        assert_eq!(s.get("n1").map(|x| x.serial), Some(a.serial));
    }

    #[tokio::test]
    async fn a_stalled_connection_is_removed_and_the_edge_told() {
        let s = Sessions::default();
        let (tx, mut out) = mpsc::channel(16);
        let a = s.add("n1", "", EdgeCapabilities::default(), tx);
        let (id, _data) = s.open(&a).unwrap();
        let limit = Duration::from_millis(50);
        for _ in 0..CONN_BUFFER {
            a.deliver_within(id, b"x".to_vec(), limit).await;
        }
        assert!(a.conn(id).is_some(), "a full buffer is not yet a stall");
        a.deliver_within(id, b"x".to_vec(), limit).await;
        match out.recv().await {
            Some(Outgoing::Message(m)) => {
                assert_eq!((m.connect_id, m.kind), (id, MessageType::RemoveConnect))
            }
            other => panic!("expected REMOVE_CONNECT, got {other:?}"),
        }
        assert!(a.conn(id).is_none());
    }
}
