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

/// A node's bytes: `node` is a node name for the first [`NodeSeries::limit`] nodes seen and
/// `other` for the rest, so the series stay bounded however large the fleet.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeBytesLabel {
    pub node: String,
    pub direction: &'static str,
}

/// Nodes given series of their own in `cloudhub_node_message_bytes_total` (at most `limit`,
/// first come; names come from authenticated node certificates). 1,000 nodes × 2 directions
/// is a modest load for Prometheus; a larger fleet sees its first 1,000 nodes by name and the
/// rest summed as `other` (the per-kind totals in `cloudhub_message_bytes_total` stay exact).
#[derive(Clone)]
pub struct NodeSeries {
    pub limit: usize,
    named: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl Default for NodeSeries {
    fn default() -> Self {
        NodeSeries {
            limit: 1000,
            named: Default::default(),
        }
    }
}

impl NodeSeries {
    /// The label value for `node`.
    fn label(&self, node: &str) -> String {
        let mut named = self.named.lock().unwrap_or_else(|e| e.into_inner());
        if named.contains(node) || (named.len() < self.limit && named.insert(node.to_string())) {
            node.to_string()
        } else {
            "other".to_string()
        }
    }
}

/// Seconds from a message's first send to its ACK (1 ms … ~33 s).
#[derive(Clone)]
pub struct AckLatency(pub Histogram);

impl Default for AckLatency {
    fn default() -> Self {
        AckLatency(Histogram::new(exponential_buckets(0.001, 2.0, 16)))
    }
}

/// A node's queue length (waiting and in flight) each time a message joins it (1 … 65,536).
#[derive(Clone)]
pub struct QueueDepth(pub Histogram);

impl Default for QueueDepth {
    fn default() -> Self {
        QueueDepth(Histogram::new(exponential_buckets(1.0, 4.0, 9)))
    }
}

/// Seconds from an edge's resync request (its inventory, or its connect) to the last object
/// sent for it (waiting for a complete view and the apiserver reads included).
#[derive(Clone)]
pub struct ResyncDuration(pub Histogram);

impl Default for ResyncDuration {
    fn default() -> Self {
        ResyncDuration(Histogram::new(exponential_buckets(0.001, 2.0, 18)))
    }
}

/// cloudhub's metrics. Cheap to clone (every metric is an `Arc` inside).
#[derive(Clone, Default)]
pub struct HubMetrics {
    pub connected_nodes: Gauge,
    /// Edge connections waiting for a handshake slot, and those holding one.
    pub handshakes_waiting: Gauge,
    pub handshakes_in_progress: Gauge,
    pub sessions_refused: Family<ReasonLabel, Counter>,
    pub messages_sent: Family<ResourceLabel, Counter>,
    pub messages_acked: Family<ResourceLabel, Counter>,
    pub messages_resent: Family<ResourceLabel, Counter>,
    pub messages_dropped: Family<ReasonLabel, Counter>,
    pub messages_received: Family<ResourceLabel, Counter>,
    /// WebSocket payload bytes of frames on edge links, by direction and kind.
    pub message_bytes: Family<FrameLabel, Counter>,
    /// WebSocket payload bytes per node (bounded: [`NodeSeries`]).
    pub node_bytes: Family<NodeBytesLabel, Counter>,
    pub node_series: NodeSeries,
    pub ack_latency: AckLatency,
    pub node_queue_depth: QueueDepth,
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
            "handshakes_waiting",
            "Edge connections waiting for their first bytes or a handshake slot (modules.cloudHub.maxConcurrentHandshakes)",
            self.handshakes_waiting.clone(),
        );
        r.register(
            "handshakes_in_progress",
            "Edge handshakes holding a slot (TLS, certificate checks, WebSocket upgrade)",
            self.handshakes_in_progress.clone(),
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
            "node_message_bytes",
            "WebSocket payload bytes on edge links by node (the first 1,000 nodes by name, the rest as other) and direction",
            self.node_bytes.clone(),
        );
        r.register(
            "ack_latency_seconds",
            "Seconds from a message's first send to the edge's ACK (resends included)",
            self.ack_latency.0.clone(),
        );
        r.register(
            "node_queue_depth",
            "A node's queue length (waiting and in flight) each time a message joins it",
            self.node_queue_depth.0.clone(),
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

    /// The byte counter of `node` in `direction` (`up` or `down`), to keep for a session.
    pub(crate) fn node_counter(&self, node: &str, direction: &'static str) -> Counter {
        self.node_bytes
            .get_or_create(&NodeBytesLabel {
                node: self.node_series.label(node),
                direction,
            })
            .clone()
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

/// The metrics cloudcore exports by the names their samples carry: counters with `_total`,
/// histograms as `_bucket`, `_sum` and `_count`. What a dashboard may query
/// (`charts/cloudcore/dashboards`, checked by `tests/helm_chart.rs`). A labelled family shows
/// only once it has a series, so each of the families here gets one; a family missing from
/// this list only makes the dashboard check stricter.
pub fn exported_names() -> std::collections::BTreeSet<String> {
    let mut registry = Registry::default();
    let api = crate::apiserver_requests::ApiRequestMetrics::default();
    let verb = crate::apiserver_requests::VerbLabels {
        verb: "get",
        resource: "pods",
    };
    api.requests
        .get_or_create(&crate::apiserver_requests::RequestLabels {
            verb: "get",
            resource: "pods",
            code: "2xx",
        })
        .inc();
    api.request_bytes.get_or_create(&verb).inc();
    api.response_bytes.get_or_create(&verb).inc();
    api.register(&mut registry);
    let hub = HubMetrics::default();
    let resource = ResourceLabel { resource: "pod" };
    let reason = ReasonLabel { reason: "other" };
    hub.sessions_refused.get_or_create(&reason).inc();
    hub.messages_dropped.get_or_create(&reason).inc();
    for family in [
        &hub.messages_sent,
        &hub.messages_acked,
        &hub.messages_resent,
        &hub.messages_received,
    ] {
        family.get_or_create(&resource).inc();
    }
    hub.frame("up", "pod", 1);
    hub.node_counter("node", "up").inc();
    hub.register(&mut registry);
    let ctl = ControllerMetrics::default();
    ctl.upstream_duration
        .get_or_create(&OperationLabel {
            resource: "pod",
            operation: "update",
        })
        .observe(0.1);
    ctl.apiserver_errors
        .get_or_create(&CodeLabel { code: "500".into() })
        .inc();
    ctl.sync
        .writes
        .get_or_create(&SyncWriteLabel {
            operation: "update",
            result: "ok",
        })
        .inc();
    ctl.node_leases
        .renewals
        .get_or_create(&crate::controller::node_lease::ResultLabel { result: "renewed" })
        .inc();
    ctl.register(&mut registry);
    crate::join::JoinMetrics::default().register(&mut registry);
    let stream = StreamMetrics::default();
    stream.requests_refused.get_or_create(&reason).inc();
    stream.register(&mut registry);
    crate::router::RouterMetrics::default().register(&mut registry);
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &registry).is_err() {
        return Default::default();
    }
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        for s in suffixes {
            names.insert(format!("{name}{s}"));
        }
    }
    names
}

/// The edge controllers' metrics.
#[derive(Clone)]
pub struct ControllerMetrics {
    pub upstream_duration: Family<OperationLabel, Histogram, fn() -> Histogram>,
    pub apiserver_errors: Family<CodeLabel, Counter>,
    pub upstream_dropped: Counter,
    pub sync: SyncMetrics,
    pub node_leases: crate::controller::node_lease::LeaseMetrics,
    pub resync_duration: ResyncDuration,
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
            resync_duration: Default::default(),
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
        registry
            .sub_registry_with_prefix("edgecontroller")
            .register(
                "resync_duration_seconds",
                "Seconds from an edge's resync request to the last object sent for it (waits for a complete view and apiserver reads included)",
                self.resync_duration.0.clone(),
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

pub(crate) const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_node_byte_series_are_bounded() {
        let mut hub = HubMetrics::default();
        hub.node_series.limit = 2;
        hub.node_counter("a", "up").inc_by(10);
        hub.node_counter("b", "down").inc_by(20);
        hub.node_counter("c", "up").inc_by(30);
        hub.node_counter("d", "up").inc_by(40);
        // A node seen before keeps its series.
        hub.node_counter("a", "down").inc_by(5);
        let get = |node: &str, direction: &'static str| {
            hub.node_bytes
                .get_or_create(&NodeBytesLabel {
                    node: node.into(),
                    direction,
                })
                .get()
        };
        assert_eq!(get("a", "up"), 10);
        assert_eq!(get("a", "down"), 5);
        assert_eq!(get("b", "down"), 20);
        assert_eq!(get("other", "up"), 70);
        let mut registry = Registry::default();
        hub.register(&mut registry);
        let text = render(&registry);
        assert!(!text.contains("node=\"c\""), "{text}");
        assert!(
            text.contains("cloudhub_node_message_bytes_total{node=\"other\",direction=\"up\"} 70"),
            "{text}"
        );
    }

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
