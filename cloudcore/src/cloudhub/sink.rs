//! The cloudhub as the controllers see it: where their downstream messages go (a recorder in
//! tests).

use super::queue::Enqueued;
use super::{Capabilities, CloudHub, SendError};
use kubeedge_shared::Message;

/// Where downstream messages go: the cloudhub, or a recorder in tests.
pub trait HubSink: Send + Sync {
    fn send(&self, node: &str, msg: Message) -> Result<Enqueued, SendError>;
    fn is_connected(&self, node: &str) -> bool;
    fn connected_nodes(&self) -> Vec<String>;
    fn capabilities(&self, node: &str) -> Option<Capabilities>;
    fn disconnect(&self, node: &str) -> bool;
}

impl HubSink for CloudHub {
    fn send(&self, node: &str, msg: Message) -> Result<Enqueued, SendError> {
        CloudHub::send(self, node, msg)
    }
    fn is_connected(&self, node: &str) -> bool {
        CloudHub::is_connected(self, node)
    }
    fn connected_nodes(&self) -> Vec<String> {
        CloudHub::connected_nodes(self)
    }
    fn capabilities(&self, node: &str) -> Option<Capabilities> {
        CloudHub::capabilities(self, node)
    }
    fn disconnect(&self, node: &str) -> bool {
        CloudHub::disconnect(self, node)
    }
}
