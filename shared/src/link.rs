//! The state of an edge's link to the cloud, as edgehub reports it to the modules that follow
//! it (edged, metamanager, the MetaServer): connect/disconnect events and the terms the
//! cloud of the current link agreed to.

/// What the cloud of the current link agreed to (the capabilities both sides advertised);
/// all false while offline and with a cloud that advertises nothing (KubeEdge's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CloudTerms {
    pub connected: bool,
    /// Heartbeats are WebSocket pings alone.
    pub ping_keepalive: bool,
    /// The cloud renews this node's Lease and says when the cluster marks the node Unknown.
    pub cloud_lease: bool,
}

impl CloudTerms {
    /// The terms of a link to a cloud that advertised `offered`, given what this edge asked.
    pub fn agreed(asked: &[String], offered: &[String]) -> CloudTerms {
        use crate::constants::{
            CAPABILITY_CLOUD_LEASE, CAPABILITY_PING_KEEPALIVE, capability_parts,
        };
        let named = |list: &[String], c: &str| list.iter().any(|t| capability_parts(t).0 == c);
        let both = |c: &str| named(asked, c) && named(offered, c);
        CloudTerms {
            connected: true,
            ping_keepalive: both(CAPABILITY_PING_KEEPALIVE),
            cloud_lease: both(CAPABILITY_CLOUD_LEASE),
        }
    }
}

/// The link came up or went down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    Connected,
    Disconnected { reason: String },
}
