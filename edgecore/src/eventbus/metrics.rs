//! Prometheus metrics of the eventbus. Every label value is one of the `&'static str` sets
//! below, never a topic or anything else a device chose.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// `twin` or `cloud`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DestinationLabel {
    pub destination: &'static str,
}

/// `external` or `internal`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BrokerLabel {
    pub broker: &'static str,
}

/// One of the `DropReason::label` / `Malformed::label` / `Rejected::label` values.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// Why a received message was not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    TwinSinkFull,
    CloudSinkFull,
    SinkClosed,
    Oversized,
}

impl DropReason {
    pub fn label(self) -> &'static str {
        match self {
            DropReason::TwinSinkFull => "twin_sink_full",
            DropReason::CloudSinkFull => "cloud_sink_full",
            DropReason::SinkClosed => "sink_closed",
            DropReason::Oversized => "oversized",
        }
    }
}

/// Input that is not valid MQTT or not usable by the bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    TopicNotUtf8,
    PacketTooLarge,
    Protocol,
}

impl Malformed {
    pub fn label(self) -> &'static str {
        match self {
            Malformed::TopicNotUtf8 => "topic_not_utf8",
            Malformed::PacketTooLarge => "packet_too_large",
            Malformed::Protocol => "protocol",
        }
    }
}

/// Why [`super::EventBus::publish`] refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    QueueFull,
    InvalidTopic,
    TooLarge,
    Closed,
}

impl Rejected {
    pub fn label(self) -> &'static str {
        match self {
            Rejected::QueueFull => "queue_full",
            Rejected::InvalidTopic => "invalid_topic",
            Rejected::TooLarge => "too_large",
            Rejected::Closed => "closed",
        }
    }
}

/// The eventbus's metrics. Cheap to clone (every metric is an `Arc` inside).
#[derive(Clone, Debug, Default)]
pub struct EventBusMetrics {
    pub received: Family<DestinationLabel, Counter>,
    pub dropped: Family<ReasonLabel, Counter>,
    pub malformed: Family<ReasonLabel, Counter>,
    pub published: Family<BrokerLabel, Counter>,
    pub publish_rejected: Family<ReasonLabel, Counter>,
    pub connection_losses: Family<BrokerLabel, Counter>,
    pub broker_clients: Gauge,
    pub broker_refused_clients: Counter,
    pub broker_deliveries_dropped: Counter,
}

impl EventBusMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("eventbus");
        r.register(
            "received",
            "MQTT messages handed to devicetwin or the cloud, by destination",
            self.received.clone(),
        );
        r.register(
            "dropped",
            "Received MQTT messages dropped, by reason",
            self.dropped.clone(),
        );
        r.register(
            "malformed",
            "Malformed MQTT input (bad topic, oversized packet, protocol error), by reason",
            self.malformed.clone(),
        );
        r.register(
            "published",
            "Messages queued for a broker, by broker",
            self.published.clone(),
        );
        r.register(
            "publish_rejected",
            "Publishes refused, by reason",
            self.publish_rejected.clone(),
        );
        r.register(
            "connection_losses",
            "Lost or failed connections to a broker, by broker",
            self.connection_losses.clone(),
        );
        r.register(
            "broker_clients",
            "Clients connected to the internal broker",
            self.broker_clients.clone(),
        );
        r.register(
            "broker_refused_clients",
            "Connections the internal broker refused (client limit, bad CONNECT)",
            self.broker_refused_clients.clone(),
        );
        r.register(
            "broker_deliveries_dropped",
            "Internal-broker deliveries dropped because a client's queue was full",
            self.broker_deliveries_dropped.clone(),
        );
    }

    pub fn count_drop(&self, why: DropReason) {
        self.dropped
            .get_or_create(&ReasonLabel {
                reason: why.label(),
            })
            .inc();
    }

    pub fn count_malformed(&self, why: Malformed) {
        self.malformed
            .get_or_create(&ReasonLabel {
                reason: why.label(),
            })
            .inc();
    }

    pub fn count_rejected(&self, why: Rejected) {
        self.publish_rejected
            .get_or_create(&ReasonLabel {
                reason: why.label(),
            })
            .inc();
    }

    pub fn dropped_count(&self, why: DropReason) -> u64 {
        self.dropped
            .get_or_create(&ReasonLabel {
                reason: why.label(),
            })
            .get()
    }

    pub fn malformed_count(&self, why: Malformed) -> u64 {
        self.malformed
            .get_or_create(&ReasonLabel {
                reason: why.label(),
            })
            .get()
    }

    pub fn rejected_count(&self, why: Rejected) -> u64 {
        self.publish_rejected
            .get_or_create(&ReasonLabel {
                reason: why.label(),
            })
            .get()
    }
}
