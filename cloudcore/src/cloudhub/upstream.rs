//! What an edge sent, classified once where it enters (the controllers match on the class
//! instead of each testing routes and strings).

use kubeedge_shared::Message;
use kubeedge_shared::application::Application;
use kubeedge_shared::inventory::Inventory;
use kubeedge_shared::nodetask::UPDATE_NODE_ACTION_STATUS;
use kubeedge_shared::operation::source;

/// The classes of upstream messages, each with its one consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamClass {
    /// A MetaServer application (get/list/watch/… through the cloud): the dynamic controller.
    Application,
    /// A node task's action report (`UpdateNodeActionStatus`): the node task controller.
    NodeTaskReport,
    /// A device report or membership query (source `twin`): the device controller.
    Twin,
    /// The reconnect inventory of what the edge holds: the downstream, device and policy
    /// controllers.
    Inventory,
    /// A resource and an operation (pod status, node, lease, events, queries…): the upstream
    /// handler's apiserver calls.
    Resource,
}

impl UpstreamClass {
    pub fn of(msg: &Message) -> UpstreamClass {
        if Application::is_request(msg) {
            UpstreamClass::Application
        } else if msg.route.operation.to_string() == UPDATE_NODE_ACTION_STATUS {
            UpstreamClass::NodeTaskReport
        } else if msg.route.source == source::TWIN {
            UpstreamClass::Twin
        } else if Inventory::is_inventory(msg) {
            UpstreamClass::Inventory
        } else {
            UpstreamClass::Resource
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_shared::{Group, Operation};
    use serde_json::Value;

    #[test]
    fn each_message_has_one_class() {
        let m = |src: &str, op: &str, res: &str| {
            Message::new(src, Group::Resource, Operation::from(op), res, Value::Null)
        };
        assert_eq!(
            UpstreamClass::of(&m("twin", "update", "device/d/twin/edge_updated")),
            UpstreamClass::Twin
        );
        assert_eq!(
            UpstreamClass::of(&m(
                "websocket",
                "UpdateNodeActionStatus",
                "operations.kubeedge.io/v1alpha2/imageprepulljob/j/node/n"
            )),
            UpstreamClass::NodeTaskReport
        );
        assert_eq!(
            UpstreamClass::of(&m("edged", "update", "default/podstatus/p")),
            UpstreamClass::Resource
        );
    }
}
