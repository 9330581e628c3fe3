//! The router's metrics (`router_*`). Every label comes from a fixed set defined here: a
//! rule kind, an outcome, a message kind — never a rule name, node, path or topic.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// What became of a REST request or of a message from an edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Ok,
    NoRule,
    NodeNotAllowed,
    TooLarge,
    NotConnected,
    Timeout,
    BadReply,
    Forwarded,
    ForwardFailed,
    Busy,
    TargetError,
    ClientGone,
    UnknownCall,
    WrongNode,
    Malformed,
    MethodNotAllowed,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::NoRule => "no_rule",
            Outcome::NodeNotAllowed => "node_not_allowed",
            Outcome::TooLarge => "too_large",
            Outcome::NotConnected => "not_connected",
            Outcome::Timeout => "timeout",
            Outcome::BadReply => "bad_reply",
            Outcome::Forwarded => "forwarded",
            Outcome::ForwardFailed => "forward_failed",
            Outcome::Busy => "busy",
            Outcome::TargetError => "target_error",
            Outcome::ClientGone => "client_gone",
            Outcome::UnknownCall => "unknown_call",
            Outcome::WrongNode => "wrong_node",
            Outcome::Malformed => "malformed",
            Outcome::MethodNotAllowed => "method_not_allowed",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabel {
    /// A rule kind (`rest_servicebus`, …) or `none` when no rule matched.
    pub route: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EdgeLabel {
    /// `reply`, `eventbus_upload`, `servicebus_upload`, `other`.
    pub kind: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    /// `subscribe`, `unsubscribe`, `start`, `stop`.
    pub operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub route: &'static str,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms … ~16 s
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Cheap to clone (every metric is an `Arc` inside).
#[derive(Clone)]
pub struct RouterMetrics {
    pub requests: Family<RequestLabel, Counter>,
    pub request_duration: Family<RouteLabel, Histogram, fn() -> Histogram>,
    pub calls_in_flight: Gauge,
    pub edge_messages: Family<EdgeLabel, Counter>,
    pub target_calls: Family<RequestLabel, Counter>,
    pub registrations_sent: Family<OperationLabel, Counter>,
    pub rules: Gauge,
    pub rules_rejected: Gauge,
    pub status_writes: Family<ResultLabel, Counter>,
}

impl Default for RouterMetrics {
    fn default() -> Self {
        RouterMetrics {
            requests: Family::default(),
            request_duration: Family::new_with_constructor(latency_histogram),
            calls_in_flight: Gauge::default(),
            edge_messages: Family::default(),
            target_calls: Family::default(),
            registrations_sent: Family::default(),
            rules: Gauge::default(),
            rules_rejected: Gauge::default(),
            status_writes: Family::default(),
        }
    }
}

impl RouterMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("router");
        r.register(
            "requests",
            "REST requests to the router, by rule kind and outcome",
            self.requests.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time to answer a REST request that matched a rule, by rule kind",
            self.request_duration.clone(),
        );
        r.register(
            "calls_in_flight",
            "Calls sent to edge applications and awaiting their answer",
            self.calls_in_flight.clone(),
        );
        r.register(
            "edge_messages",
            "Router messages from edges, by kind and outcome",
            self.edge_messages.clone(),
        );
        r.register(
            "target_calls",
            "Calls of rest targets (cloud endpoints), by rule kind and outcome",
            self.target_calls.clone(),
        );
        r.register(
            "registrations_sent",
            "Subscriptions and servicebus target URLs sent to edges, by operation",
            self.registrations_sent.clone(),
        );
        r.register("rules", "Rules in force", self.rules.clone());
        r.register(
            "rules_rejected",
            "Rules not in force (invalid, missing endpoints, clashing)",
            self.rules_rejected.clone(),
        );
        r.register(
            "status_writes",
            "Rule status writes, by result (ok, conflict, gone, error)",
            self.status_writes.clone(),
        );
    }

    pub fn request(&self, route: &'static str, outcome: Outcome) {
        self.requests
            .get_or_create(&RequestLabel {
                route,
                outcome: outcome.label(),
            })
            .inc();
    }

    pub fn edge(&self, kind: &'static str, outcome: Outcome) {
        self.edge_messages
            .get_or_create(&EdgeLabel {
                kind,
                outcome: outcome.label(),
            })
            .inc();
    }

    pub fn target(&self, route: &'static str, outcome: Outcome) {
        self.target_calls
            .get_or_create(&RequestLabel {
                route,
                outcome: outcome.label(),
            })
            .inc();
    }
}
