//! The handle every stream handler (logs, exec, metrics) writes to the cloud through: tunnel
//! messages on a bounded queue the tunnel task drains into its WebSocket.

use kubeedge_shared::stream::{MessageType, TunnelMessage};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Sends tunnel messages to the cloud (clonable; bounded, so producers wait for the socket).
#[derive(Clone)]
pub struct TunnelSender(pub(super) mpsc::Sender<TunnelMessage>);

impl TunnelSender {
    pub async fn send(&self, m: TunnelMessage) -> bool {
        self.0.send(m).await.is_ok()
    }

    /// One DATA frame on connection `id`, unless the connection ends first; false once it
    /// is gone.
    pub async fn data(&self, id: u64, chunk: Vec<u8>, cancel: &CancellationToken) -> bool {
        let m = TunnelMessage::new(id, MessageType::Data, chunk);
        tokio::select! {
            _ = cancel.cancelled() => false,
            ok = self.send(m) => ok,
        }
    }

    /// Tells the cloud connection `id` has ended.
    pub async fn remove(&self, id: u64) -> bool {
        self.send(TunnelMessage::new(
            id,
            MessageType::RemoveConnect,
            Vec::new(),
        ))
        .await
    }

    /// The local side of connection `id` is done: the cloud is told unless it ended the
    /// connection itself (no REMOVE_CONNECT echo).
    pub async fn finish(&self, id: u64, cancel: &CancellationToken) {
        if !cancel.is_cancelled() {
            self.remove(id).await;
        }
        cancel.cancel();
    }
}
