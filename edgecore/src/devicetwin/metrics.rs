//! devicetwin's metrics (`devicetwin_*` on the edge's `/metrics`); labels from fixed sets.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Why a device request was refused.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Refusal {
    /// Not JSON, or not the expected shape.
    Malformed,
    /// Names, values or types KubeEdge's rules refuse.
    Invalid,
    /// A device this edge does not have.
    UnknownDevice,
    /// The database write failed.
    StoreFailed,
}

impl Refusal {
    fn label(self) -> &'static str {
        match self {
            Refusal::Malformed => "malformed",
            Refusal::Invalid => "invalid",
            Refusal::UnknownDevice => "unknown_device",
            Refusal::StoreFailed => "store_failed",
        }
    }

    /// From an MQTT result code.
    pub fn of_code(code: i64) -> Refusal {
        match code {
            404 => Refusal::UnknownDevice,
            500 => Refusal::StoreFailed,
            _ => Refusal::Invalid,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Default)]
pub struct DeviceTwinMetrics {
    refused: Family<ReasonLabel, Counter>,
    pub twin_updates: Counter,
    pub reports_sent: Counter,
    pub reports_confirmed: Counter,
    pub devices: Gauge,
    pub unreported: Gauge,
}

impl DeviceTwinMetrics {
    pub fn refused(&self, r: Refusal) {
        self.refused
            .get_or_create(&ReasonLabel { reason: r.label() })
            .inc();
    }

    #[cfg(test)]
    pub fn refused_count(&self, r: Refusal) -> u64 {
        self.refused
            .get_or_create(&ReasonLabel { reason: r.label() })
            .get()
    }

    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("devicetwin");
        r.register(
            "refused",
            "Device requests (MQTT, mappers) refused, by reason",
            self.refused.clone(),
        );
        r.register(
            "twin_updates",
            "Twin updates stored (from MQTT and mappers)",
            self.twin_updates.clone(),
        );
        r.register(
            "reports_sent",
            "Twin reports sent to the cloud (resends included)",
            self.reports_sent.clone(),
        );
        r.register(
            "reports_confirmed",
            "Twin reports the cloud confirmed",
            self.reports_confirmed.clone(),
        );
        r.register("devices", "Devices of this node", self.devices.clone());
        r.register(
            "unreported_devices",
            "Devices with twin changes the cloud has not confirmed",
            self.unreported.clone(),
        );
    }
}
