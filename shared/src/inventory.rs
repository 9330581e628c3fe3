//! The inventory resync (a kubeedge-rs extension, see `edgecore/INVENTORY.md`): on every
//! connect an edge that advertises [`crate::constants::CAPABILITY_INVENTORY`] tells the cloud
//! which objects its database holds, so that the cloud can send only the difference.
//!
//! Wire shape (edge → cloud, one message per connect):
//!
//! ```json
//! {"header":{"msg_id":"<uuid>","timestamp":1718000000000},
//!  "route":{"source":"metamanager","group":"resource","operation":"update",
//!           "resource":"default/inventory/<node>"},
//!  "content":{"objects":[{"type":"pod","key":"default/pod/nginx","uid":"…","resourceVersion":"42"}]}}
//! ```
//!
//! cloudhub hands it to the controllers (as every upstream message, with the session's node
//! beside the parsed resource) and they route it to the downstream resync. No reply is
//! expected: the cloud answers with ordinary downstream `insert`/`update`/`delete` messages. A
//! real KubeEdge cloudcore routes it to edgecontroller, which logs the unknown type and drops it.

use crate::message::Message;
use crate::operation::{Group, Operation, source};
use serde::{Deserialize, Serialize};

/// The resource type token of the inventory message.
pub const INVENTORY_RESOURCE_TYPE: &str = "inventory";
/// Namespace token of the inventory resource (the message is about the node, not a namespace).
pub const INVENTORY_NAMESPACE: &str = "default";

/// One object held in the edge database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryEntry {
    /// Type token, e.g. `pod`, `configmap`, `secret`.
    #[serde(rename = "type")]
    pub resource_type: String,
    /// The database key: the wire resource `<namespace>/<type>/<name>` (`null` namespace for
    /// cluster-scoped objects).
    pub key: String,
    /// `metadata.uid` of the stored object.
    pub uid: String,
    /// `metadata.resourceVersion` of the stored object (may be empty).
    #[serde(rename = "resourceVersion", default)]
    pub resource_version: String,
}

/// One object an edge holds, as the cloud compares it: from an inventory entry, or from the
/// ObjectSync records of a KubeEdge edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldObject {
    pub resource_type: crate::ResourceType,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `metadata.resourceVersion` of the held copy (0 when unknown).
    pub resource_version: u64,
}

/// Everything the edge database holds that the cloud keeps in sync.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub objects: Vec<InventoryEntry>,
}

impl Inventory {
    /// The wire resource of `node`'s inventory: `default/inventory/<node>`.
    pub fn resource(node: &str) -> String {
        format!("{INVENTORY_NAMESPACE}/{INVENTORY_RESOURCE_TYPE}/{node}")
    }

    /// The message the edge sends on connect.
    pub fn to_message(&self, node: &str) -> Message {
        Message::new(
            source::METAMANAGER,
            Group::Resource,
            Operation::Update,
            Self::resource(node),
            serde_json::to_value(self).unwrap_or_default(),
        )
    }

    /// True for an inventory message, in wire or cloud-internal resource form.
    pub fn is_inventory(msg: &Message) -> bool {
        msg.resource_type() == Some(INVENTORY_RESOURCE_TYPE)
            && msg.route.source == source::METAMANAGER
    }

    /// Reads the inventory carried by `msg` (content as an object or as a JSON string).
    pub fn from_message(msg: &Message) -> Result<Inventory, serde_json::Error> {
        serde_json::from_value(crate::content::content_json(&msg.content)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn inventory_message_round_trips_in_the_documented_shape() {
        let inv = Inventory {
            objects: vec![InventoryEntry {
                resource_type: "pod".into(),
                key: "default/pod/nginx".into(),
                uid: "u1".into(),
                resource_version: "42".into(),
            }],
        };
        let msg = inv.to_message("edge-1");
        assert_eq!(msg.route.resource, "default/inventory/edge-1");
        assert_eq!(msg.route.operation, Operation::Update);
        assert_eq!(msg.route.group, Group::Resource);
        assert_eq!(
            msg.content,
            json!({"objects": [{"type": "pod", "key": "default/pod/nginx", "uid": "u1", "resourceVersion": "42"}]})
        );
        assert!(Inventory::is_inventory(&msg));
        assert_eq!(Inventory::from_message(&msg).unwrap(), inv);
    }
}
