//! Names and defaults both sides agree on (protocol §2.1, §7).

/// WebSocket handshake header carrying the node name (looked up case-insensitively).
pub const HEADER_NODE_ID: &str = "node_id";
pub const HEADER_PROJECT_ID: &str = "project_id";
pub const HEADER_CONNECTION_USE: &str = "ConnectionUse";
/// The only `ConnectionUse` value served on the message channel.
pub const CONNECTION_USE_MSG: &str = "msg";
/// Extension header: a peer that sends it understands the inventory resync of kubeedge-rs
/// (edge sends object UID → resourceVersion on connect; the cloud sends only the difference).
/// Real KubeEdge peers ignore unknown headers and are served in compatibility mode.
pub const HEADER_CAPABILITIES: &str = "X-KubeEdge-RS-Capabilities";
pub const CAPABILITY_INVENTORY: &str = "inventory-resync";
/// The edge proves it is alive with WebSocket pings alone (no keepalive message); the cloud
/// takes any frame as a keepalive. Both sides must advertise it (the cloud in its 101
/// answer); a KubeEdge cloudcore needs keepalive messages and advertises nothing.
pub const CAPABILITY_PING_KEEPALIVE: &str = "ping-keepalive";
/// The cloud renews the edge's node Lease each time it hears from the edge (at most every
/// quarter of the lease's duration, as the kubelet renews) while the link is up, and sends
/// the edge its Node when the cluster marks its conditions Unknown; the edge then renews
/// nothing itself and reports node status only when it changes. Both sides must advertise
/// it; the edge as `cloud-lease=<nodeLeaseDurationSeconds>`, the cloud plainly.
pub const CAPABILITY_CLOUD_LEASE: &str = "cloud-lease";

/// A capability token as `(name, value)`: `cloud-lease=40` → `("cloud-lease", Some("40"))`.
pub fn capability_parts(token: &str) -> (&str, Option<&str>) {
    match token.trim().split_once('=') {
        Some((name, value)) => (name.trim(), Some(value.trim())),
        None => (token.trim(), None),
    }
}
/// Sent by edgestream in the stream tunnel handshake (same header): the edge serves
/// PORT_FORWARD_CONNECT. Released KubeEdge edges crash on connect types they do not know,
/// so the cloud sends it to no other edge.
pub const CAPABILITY_PORT_FORWARD: &str = "port-forward";
/// Tunnel capability: the edge dials relayed Service connections (RELAY_CONNECT, edgemesh).
pub const CAPABILITY_RELAY: &str = "relay";

pub const DEFAULT_PROJECT_ID: &str = "e632aba927ea4ac2b575ec1603d56f10";
pub const DEFAULT_CLOUDHUB_PORT: u16 = 10000;
pub const DEFAULT_CLOUDHUB_HTTPS_PORT: u16 = 10002;
/// cloudcore's kubelet-compatible stream server (`cloudStream.streamPort`).
pub const DEFAULT_STREAM_PORT: u16 = 10003;
/// cloudcore's stream tunnel server (`cloudStream.tunnelPort`), which edges dial.
pub const DEFAULT_TUNNEL_PORT: u16 = 10004;
/// The kubelet port edged serves on and KubeEdge's cloud rewrites stream URLs to
/// (`commonConfig.tunnelPort` before negotiation).
pub const DEFAULT_EDGED_PORT: u16 = 10350;
/// The label that makes a node an edge node.
pub const EDGE_NODE_LABEL: &str = "node-role.kubernetes.io/edge";
/// Where node leases live.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Messages a node's queue holds at most (`cloudHub.nodeQueue.maxMessages`).
pub const DEFAULT_NODE_QUEUE_MAX_MESSAGES: usize = 10_000;
/// Bytes a node's queue holds at most (`cloudHub.nodeQueue.maxBytes`).
pub const DEFAULT_NODE_QUEUE_MAX_BYTES: usize = 64 * 1024 * 1024;
/// Messages awaiting an ACK per node at most (`cloudHub.nodeQueue.ackWindow`).
pub const DEFAULT_ACK_WINDOW: usize = 512;
/// Seconds before an unacknowledged message is sent again (`cloudHub.nodeQueue.ackRetryInterval`).
pub const DEFAULT_ACK_RETRY_SECS: u64 = 5;
/// Seconds between comparisons of KubeEdge edges with their ObjectSync records
/// (`syncController.resyncInterval`).
pub const DEFAULT_RESYNC_INTERVAL_SECS: u64 = 30;
/// cloudcore's namespace by default (its CA, token, leader lease, tunnel port records).
pub const CLOUDCORE_NAMESPACE: &str = "kubeedge";
/// Seconds without a keepalive after which the cloud drops a session.
pub const DEFAULT_KEEPALIVE_INTERVAL_SECS: u64 = 30;
/// Seconds between edge keepalives.
pub const DEFAULT_HEARTBEAT_SECS: u64 = 15;
pub const DEFAULT_NODE_LIMIT: usize = 1000;
/// Edge handshakes cloudhub works on at once (`cloudHub.maxConcurrentHandshakes`): enough for
/// about a thousand a second over links of a 500 ms round trip, few enough that each finishes
/// in well under a second on two cores.
pub const DEFAULT_MAX_HANDSHAKES: usize = 512;
pub const DEFAULT_MESSAGE_QPS: u32 = 30;
pub const DEFAULT_MESSAGE_BURST: u32 = 60;
/// Legacy shared CN of KubeEdge ≤ v1.15 edge certificates.
pub const LEGACY_EDGE_CN: &str = "kubeedge.io";
/// CN prefix of per-node edge certificates (KubeEdge ≥ v1.16).
pub const NODE_CN_PREFIX: &str = "system:node:";
pub const NODE_ORGANIZATION: &str = "system:nodes";
