//! Prometheus metrics of the servicebus (`servicebus_*`); label values come from the fixed set
//! in [`ServiceBusMetrics::call`], never from a URL or a peer.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `ok`, `bad_request`, `unreachable`, `too_large`, `busy`.
    pub outcome: &'static str,
}

#[derive(Clone, Default)]
pub struct ServiceBusMetrics {
    pub calls: Family<OutcomeLabel, Counter>,
    pub allowed_urls: Gauge,
}

impl ServiceBusMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("servicebus");
        r.register(
            "calls",
            "Calls of local HTTP servers for the cloud router, by outcome",
            self.calls.clone(),
        );
        r.register(
            "allowed_urls",
            "Cloud URLs the router allows this node's applications (target_urls)",
            self.allowed_urls.clone(),
        );
    }

    pub fn call(&self, outcome: &'static str) {
        self.calls.get_or_create(&OutcomeLabel { outcome }).inc();
    }
}
