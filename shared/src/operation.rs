//! Typed operations and module groups. Unknown values survive a round trip as `Other`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
        pub enum $name {
            $($variant,)+
            /// A value this build does not know; kept verbatim.
            Other(String),
            /// The field was absent or empty.
            #[default]
            Empty,
        }

        impl $name {
            pub fn as_str(&self) -> &str {
                match self {
                    $(Self::$variant => $text,)+
                    Self::Other(s) => s,
                    Self::Empty => "",
                }
            }

            pub fn is_empty(&self) -> bool {
                matches!(self, Self::Empty)
            }

            /// The value for a metric label: a known value, `other` or `empty` — never what
            /// a peer chose.
            pub fn metric_label(&self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                    Self::Other(_) => "other",
                    Self::Empty => "empty",
                }
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                match s {
                    $($text => Self::$variant,)+
                    "" => Self::Empty,
                    other => Self::Other(other.to_string()),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                Ok(Self::from(s.as_ref()))
            }
        }
    };
}

string_enum! {
    /// `route.operation` (protocol §1.3).
    Operation {
        Insert => "insert",
        Update => "update",
        Delete => "delete",
        Query => "query",
        Patch => "patch",
        Response => "response",
        Error => "error",
        Upload => "upload",
        Keepalive => "keepalive",
        Connected => "connected",
        Disconnected => "disconnected",
        Connect => "connect",
        Get => "get",
        List => "list",
        Subscribe => "subscribe",
        Unsubscribe => "unsubscribe",
        Publish => "publish",
        Message => "message",
        Start => "start",
        Stop => "stop",
        CreateVolume => "createvolume",
        DeleteVolume => "deletevolume",
        ControllerPublishVolume => "controllerpublishvolume",
        ControllerUnpublishVolume => "controllerunpublishvolume",
        ApplicationResponse => "applicationResponse",
        Upgrade => "upgrade",
        Null => "null",
    }
}

impl Operation {
    /// CSI volume operations travel as NO-ACK messages and are matched by the volume regex.
    pub fn is_csi_volume_op(&self) -> bool {
        matches!(
            self,
            Self::CreateVolume
                | Self::DeleteVolume
                | Self::ControllerPublishVolume
                | Self::ControllerUnpublishVolume
        )
    }
}

string_enum! {
    /// `route.group`: the module group a message is addressed to (protocol §1.6).
    Group {
        Resource => "resource",
        Twin => "twin",
        User => "user",
        Meta => "meta",
        Func => "func",
        Hub => "hub",
        Edged => "edged",
        Bus => "bus",
        DynamicController => "dynamiccontroller",
        NodeUpgradeJobController => "nodeupgradejobcontroller",
        EdgeController => "edgecontroller",
        CloudHub => "cloudhub",
        TaskManager => "taskmanager",
    }
}

/// Module names stamped in `route.source` (protocol §1.6).
pub mod source {
    pub const CLOUDHUB: &str = "cloudhub";
    pub const EDGE_CONTROLLER: &str = "edgecontroller";
    pub const DEVICE_CONTROLLER: &str = "devicecontroller";
    pub const SYNC_CONTROLLER: &str = "synccontroller";
    pub const DYNAMIC_CONTROLLER: &str = "dynamiccontroller";
    /// KubeEdge's policycontroller: the ServiceAccountAccess objects of an edge's pods.
    pub const POLICY_CONTROLLER: &str = "policycontroller";
    pub const CLOUD_STREAM: &str = "cloudStream";
    pub const NODE_UPGRADE_JOB_CONTROLLER: &str = "nodeupgradejobcontroller";
    pub const ROUTER_EVENTBUS: &str = "router_eventbus";
    pub const ROUTER_SERVICEBUS: &str = "router_servicebus";
    /// edgehub's module name: the `source` of keepalives.
    pub const EDGEHUB: &str = "websocket";
    pub const EDGEHUB_LOCAL: &str = "edgehub";
    pub const METAMANAGER: &str = "metamanager";
    pub const METASERVER: &str = "metaserver";
    pub const EDGED: &str = "edged";
    pub const TWIN: &str = "twin";
    /// The edge's servicebus: its answers to the router's calls and its `upload`s.
    pub const SERVICEBUS: &str = "servicebus";
    /// The edge's eventbus stamps its group, `bus`, on the MQTT messages it uploads.
    pub const EVENTBUS: &str = "bus";

    /// Sources that only the cloud stamps; an upstream message claiming one of them is
    /// dropped by cloudhub (KubeEdge's anti-loop `IsFromEdge`).
    pub const CLOUD_ONLY: [&str; 6] = [
        CLOUDHUB,
        CLOUD_STREAM,
        DEVICE_CONTROLLER,
        EDGE_CONTROLLER,
        POLICY_CONTROLLER,
        SYNC_CONTROLLER,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_and_unknown_operations_round_trip() {
        for text in ["insert", "applicationResponse", "frobnicate", ""] {
            let op = Operation::from(text);
            assert_eq!(op.as_str(), text);
            let json = serde_json::to_string(&op).unwrap();
            assert_eq!(serde_json::from_str::<Operation>(&json).unwrap(), op);
        }
        assert_eq!(
            Operation::from("frobnicate"),
            Operation::Other("frobnicate".into())
        );
        assert_eq!(Group::from("resource"), Group::Resource);
    }
}
