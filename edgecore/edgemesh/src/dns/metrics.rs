//! Prometheus metrics of the DNS server. Every label value comes from the enums below,
//! never from a query name or anything else a client chose.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::Duration;

/// How a query was dealt with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueryResult {
    /// Answered from the cluster zone (records, or none of the asked type).
    Local,
    /// A cluster name that does not exist.
    NxDomain,
    /// Answered by an upstream resolver.
    Forwarded,
    /// No upstream answered (or none is configured).
    ServFail,
    /// Malformed query.
    FormErr,
    /// Refused: too many forwards in flight, or a class other than IN in the zone.
    Refused,
    /// An opcode other than QUERY.
    NotImp,
    /// Not answered at all: too short for a header, or a response.
    Dropped,
}

impl QueryResult {
    pub fn label(self) -> &'static str {
        match self {
            QueryResult::Local => "local",
            QueryResult::NxDomain => "nxdomain",
            QueryResult::Forwarded => "forwarded",
            QueryResult::ServFail => "servfail",
            QueryResult::FormErr => "formerr",
            QueryResult::Refused => "refused",
            QueryResult::NotImp => "notimp",
            QueryResult::Dropped => "dropped",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    Udp,
    Tcp,
}

impl Transport {
    pub fn label(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }
}

/// What one attempt at an upstream resolver came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Attempt {
    Answered,
    Timeout,
    Error,
}

impl Attempt {
    fn label(self) -> &'static str {
        match self {
            Attempt::Answered => "answered",
            Attempt::Timeout => "timeout",
            Attempt::Error => "error",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueryLabels {
    pub result: &'static str,
    pub transport: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransportLabel {
    pub transport: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

fn latency_histogram() -> Histogram {
    // 50 µs (a local answer) … ~6.5 s (every upstream timing out).
    Histogram::new(exponential_buckets(0.00005, 2.0, 18))
}

/// The DNS server's metrics. Cheap to clone (every metric is an `Arc` inside).
#[derive(Clone, Debug)]
pub struct DnsMetrics {
    queries: Family<QueryLabels, Counter>,
    duration: Family<QueryLabels, Histogram, fn() -> Histogram>,
    upstream_attempts: Family<OutcomeLabel, Counter>,
    truncated: Family<TransportLabel, Counter>,
    tcp_connections_rejected: Counter,
    forwards_in_flight: Gauge,
}

impl Default for DnsMetrics {
    fn default() -> DnsMetrics {
        DnsMetrics {
            queries: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
            upstream_attempts: Family::default(),
            truncated: Family::default(),
            tcp_connections_rejected: Counter::default(),
            forwards_in_flight: Gauge::default(),
        }
    }
}

impl DnsMetrics {
    /// Registers as `edgemesh_dns_*`, beside the other edgemesh metrics.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("edgemesh_dns");
        r.register(
            "queries",
            "DNS queries, by result and transport",
            self.queries.clone(),
        );
        r.register(
            "query_duration_seconds",
            "Time from receiving a query to having its reply, by result and transport",
            self.duration.clone(),
        );
        r.register(
            "upstream_attempts",
            "Exchanges with upstream resolvers, by outcome",
            self.upstream_attempts.clone(),
        );
        r.register(
            "truncated",
            "Replies cut to the client's size limit (TC set), by transport",
            self.truncated.clone(),
        );
        r.register(
            "tcp_connections_rejected",
            "TCP connections closed at once because too many were open",
            self.tcp_connections_rejected.clone(),
        );
        r.register(
            "forwards_in_flight",
            "Queries waiting for an upstream resolver",
            self.forwards_in_flight.clone(),
        );
    }

    pub(crate) fn query(&self, result: QueryResult, transport: Transport, took: Duration) {
        let labels = QueryLabels {
            result: result.label(),
            transport: transport.label(),
        };
        self.queries.get_or_create(&labels).inc();
        self.duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    pub(crate) fn attempt(&self, outcome: Attempt) {
        self.upstream_attempts
            .get_or_create(&OutcomeLabel {
                outcome: outcome.label(),
            })
            .inc();
    }

    pub(crate) fn truncated(&self, transport: Transport) {
        self.truncated
            .get_or_create(&TransportLabel {
                transport: transport.label(),
            })
            .inc();
    }

    pub(crate) fn tcp_rejected(&self) {
        self.tcp_connections_rejected.inc();
    }

    pub(crate) fn forwards_in_flight(&self) -> &Gauge {
        &self.forwards_in_flight
    }

    /// Queries counted with this result and transport so far.
    pub fn query_count(&self, result: QueryResult, transport: Transport) -> u64 {
        self.queries
            .get_or_create(&QueryLabels {
                result: result.label(),
                transport: transport.label(),
            })
            .get()
    }

    pub fn truncated_count(&self, transport: Transport) -> u64 {
        self.truncated
            .get_or_create(&TransportLabel {
                transport: transport.label(),
            })
            .get()
    }

    pub fn tcp_rejected_count(&self) -> u64 {
        self.tcp_connections_rejected.get()
    }
}
