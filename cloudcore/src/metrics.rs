//! Prometheus metrics of cloudcore (OpenMetrics text on `/metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    /// A known resource type token or `other` (never what a peer chose).
    pub resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// What a frame on an edge link carried: `up` (edge → cloud) or `down`, and a resource type
/// token, `keepalive`, `ack` (a response to a cloud message), `ping` or `pong`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FrameLabel {
    pub direction: &'static str,
    pub kind: &'static str,
}

/// cloudhub's metrics. Cheap to clone (every metric is an `Arc` inside).
#[derive(Clone, Default)]
pub struct HubMetrics {
    pub connected_nodes: Gauge,
    pub sessions_refused: Family<ReasonLabel, Counter>,
    pub messages_sent: Family<ResourceLabel, Counter>,
    pub messages_acked: Family<ResourceLabel, Counter>,
    pub messages_resent: Family<ResourceLabel, Counter>,
    pub messages_dropped: Family<ReasonLabel, Counter>,
    pub messages_received: Family<ResourceLabel, Counter>,
    /// WebSocket payload bytes of frames on edge links, by direction and kind.
    pub message_bytes: Family<FrameLabel, Counter>,
    pub unmatched_acks: Counter,
    pub malformed_frames: Counter,
    pub queued_messages: Gauge,
    pub queued_bytes: Gauge,
    pub inflight_messages: Gauge,
}

impl HubMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("cloudhub");
        r.register(
            "connected_nodes",
            "Edge nodes with a live session",
            self.connected_nodes.clone(),
        );
        r.register(
            "sessions_refused",
            "Connections refused, by reason",
            self.sessions_refused.clone(),
        );
        r.register(
            "messages_sent",
            "Downstream frames written (first sends)",
            self.messages_sent.clone(),
        );
        r.register(
            "messages_acked",
            "Downstream messages acknowledged by the edge",
            self.messages_acked.clone(),
        );
        r.register(
            "messages_resent",
            "Downstream messages sent again for lack of an ACK",
            self.messages_resent.clone(),
        );
        r.register(
            "messages_dropped",
            "Downstream messages dropped, by reason",
            self.messages_dropped.clone(),
        );
        r.register(
            "messages_received",
            "Upstream messages received, by resource type",
            self.messages_received.clone(),
        );
        r.register(
            "message_bytes",
            "WebSocket payload bytes on edge links by direction (up: edge to cloud) and kind (resource type, keepalive, ack, ping, pong)",
            self.message_bytes.clone(),
        );
        r.register(
            "unmatched_acks",
            "ACKs that matched no message in flight (duplicates, late)",
            self.unmatched_acks.clone(),
        );
        r.register(
            "malformed_frames",
            "Upstream frames that could not be decoded",
            self.malformed_frames.clone(),
        );
        r.register(
            "queued_messages",
            "Messages waiting in per-node queues",
            self.queued_messages.clone(),
        );
        r.register(
            "queued_bytes",
            "Encoded bytes waiting in per-node queues",
            self.queued_bytes.clone(),
        );
        r.register(
            "inflight_messages",
            "Messages sent and awaiting an ACK",
            self.inflight_messages.clone(),
        );
        // KubeEdge's own name for the same gauge, for dashboards built for KubeEdge.
        registry.register(
            "KubeEdge_CloudHub_connected_nodes",
            "Number of connected edge nodes (KubeEdge-compatible name)",
            self.connected_nodes.clone(),
        );
    }

    /// Counts a frame of `bytes` payload bytes.
    pub(crate) fn frame(&self, direction: &'static str, kind: &'static str, bytes: usize) {
        self.message_bytes
            .get_or_create(&FrameLabel { direction, kind })
            .inc_by(bytes as u64);
    }

    pub(crate) fn resource(resource_type: &kubeedge_shared::ResourceType) -> ResourceLabel {
        ResourceLabel {
            resource: resource_type.metric_label(),
        }
    }
}

/// Labels of an upstream request: from bounded sets (`other` for what the edge made up).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    pub resource: &'static str,
    pub operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: String,
}

fn latency_histogram() -> Histogram {
    // 1 ms … ~16 s
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// The edge controllers' metrics.
#[derive(Clone)]
pub struct ControllerMetrics {
    pub upstream_duration: Family<OperationLabel, Histogram, fn() -> Histogram>,
    pub apiserver_errors: Family<CodeLabel, Counter>,
    pub upstream_dropped: Counter,
    pub sync: SyncMetrics,
    pub node_leases: crate::controller::node_lease::LeaseMetrics,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SyncWriteLabel {
    pub operation: &'static str,
    pub result: &'static str,
}

/// ObjectSync records of KubeEdge edges (`controller/objectsync`).
#[derive(Clone, Default)]
pub struct SyncMetrics {
    /// Records in the cache.
    pub records: Gauge,
    /// Records waiting for (or in) a write.
    pub pending_writes: Gauge,
    pub writes: Family<SyncWriteLabel, Counter>,
    /// Acknowledged deliveries not recorded (no CRDs, or too many writes pending).
    pub dropped: Counter,
}

impl SyncMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("synccontroller");
        r.register(
            "records",
            "ObjectSync and ClusterObjectSync records cached",
            self.records.clone(),
        );
        r.register(
            "pending_writes",
            "Records waiting for a write after an edge's ACK",
            self.pending_writes.clone(),
        );
        r.register(
            "record_writes",
            "Record writes by operation (update, delete) and result (ok, retry, failed)",
            self.writes.clone(),
        );
        r.register(
            "acks_not_recorded",
            "Acknowledged deliveries not recorded (CRDs missing or too many writes pending)",
            self.dropped.clone(),
        );
    }
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        ControllerMetrics {
            upstream_duration: Family::new_with_constructor(latency_histogram),
            apiserver_errors: Family::default(),
            upstream_dropped: Counter::default(),
            sync: SyncMetrics::default(),
            node_leases: Default::default(),
        }
    }
}

impl ControllerMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("edgecontroller");
        r.register(
            "upstream_duration_seconds",
            "Time to handle an edge request (apiserver call and reply), by resource and operation",
            self.upstream_duration.clone(),
        );
        r.register(
            "apiserver_errors",
            "Errors returned by the apiserver, by HTTP code",
            self.apiserver_errors.clone(),
        );
        r.register(
            "upstream_dropped",
            "Edge requests dropped (unsupported or malformed)",
            self.upstream_dropped.clone(),
        );
        self.sync.register(registry);
        self.node_leases.register(registry);
    }
}

/// cloudstream's metrics (the stream server on `:10003`).
#[derive(Clone, Default)]
pub struct StreamMetrics {
    /// Requests answered 401 for want of a client certificate chaining to the stream CA.
    pub requests_refused: Family<ReasonLabel, Counter>,
    /// edgemesh connections relayed between edges.
    pub mesh_relay: crate::cloudstream::mesh_relay::RelayMetrics,
}

impl StreamMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("cloudstream");
        r.register(
            "requests_refused",
            "Stream server requests refused 401, by reason (no_client_certificate, untrusted_client_certificate)",
            self.requests_refused.clone(),
        );
        self.mesh_relay.register(registry);
    }
}

/// Renders a registry as OpenMetrics text.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        out.clear();
    }
    out
}

pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_renders_every_family() {
        let mut registry = Registry::default();
        let hub = HubMetrics::default();
        hub.register(&mut registry);
        let ctl = ControllerMetrics::default();
        ctl.register(&mut registry);
        hub.connected_nodes.set(3);
        hub.messages_sent
            .get_or_create(&HubMetrics::resource(&kubeedge_shared::ResourceType::Pod))
            .inc();
        ctl.upstream_duration
            .get_or_create(&OperationLabel {
                resource: "podpatch",
                operation: "patch",
            })
            .observe(0.004);
        let text = render(&registry);
        assert!(text.contains("cloudhub_connected_nodes 3"), "{text}");
        assert!(
            text.contains("KubeEdge_CloudHub_connected_nodes 3"),
            "{text}"
        );
        assert!(
            text.contains("cloudhub_messages_sent_total{resource=\"pod\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("edgecontroller_upstream_duration_seconds_bucket"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
