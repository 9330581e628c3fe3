//! The cloud link as the other modules see it (metamanager, MetaServer, devicetwin,
//! servicebus): [`EdgeHub`] is the real one, tests bring their own.

use super::{EdgeHub, HubError, LinkEvent};
use kubeedge_shared::Message;
use std::future::Future;
use std::time::Duration;
use tokio::sync::broadcast;

/// What the edge's modules need from the cloud link; [`EdgeHub`] is the real one.
pub trait CloudLink: Clone + Send + Sync + 'static {
    fn is_connected(&self) -> bool;
    fn send(&self, msg: Message) -> impl Future<Output = Result<(), HubError>> + Send;
    /// Sends a message that may wait behind everything else (events).
    fn send_background(&self, msg: Message) -> impl Future<Output = Result<(), HubError>> + Send {
        self.send(msg)
    }
    fn request(
        &self,
        msg: Message,
        timeout: Duration,
    ) -> impl Future<Output = Result<Message, HubError>> + Send;
    fn subscribe(&self) -> broadcast::Receiver<LinkEvent>;
}

impl CloudLink for EdgeHub {
    fn is_connected(&self) -> bool {
        EdgeHub::is_connected(self)
    }

    fn send(&self, msg: Message) -> impl Future<Output = Result<(), HubError>> + Send {
        EdgeHub::send(self, msg)
    }

    fn send_background(&self, msg: Message) -> impl Future<Output = Result<(), HubError>> + Send {
        EdgeHub::send_background(self, msg)
    }

    fn request(
        &self,
        msg: Message,
        timeout: Duration,
    ) -> impl Future<Output = Result<Message, HubError>> + Send {
        EdgeHub::request(self, msg, timeout)
    }

    fn subscribe(&self) -> broadcast::Receiver<LinkEvent> {
        EdgeHub::subscribe(self)
    }
}
