//! Node join (protocol §6): the join token kept in Secret `kubeedge/tokensecret`
//! (`token_secret`) and the HTTPS certificate server on `cloudHub.https` (`server`) that
//! hands out the CA and signs edge certificates for holders of that token or of a valid
//! edge certificate.

pub(crate) mod server;
pub(crate) mod token_secret;

pub use server::{JoinServer, serve, tls_config};
pub use token_secret::{ensure as ensure_token_secret, read as read_token};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabel {
    pub reason: &'static str,
}

/// Metrics of the certificate server. Cheap to clone.
#[derive(Clone, Default)]
pub struct JoinMetrics {
    pub certificates_issued: Counter,
    pub certificates_refused: Family<RefusalLabel, Counter>,
    pub ca_downloads: Counter,
    pub tokens_written: Counter,
}

impl JoinMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("cloudhub_join");
        r.register(
            "certificates_issued",
            "Edge certificates signed on /edge.crt",
            self.certificates_issued.clone(),
        );
        r.register(
            "certificates_refused",
            "Requests to /edge.crt refused, by reason",
            self.certificates_refused.clone(),
        );
        r.register(
            "ca_downloads",
            "CA certificates served on /ca.crt",
            self.ca_downloads.clone(),
        );
        r.register(
            "tokens_written",
            "Join tokens this replica wrote to Secret kubeedge/tokensecret",
            self.tokens_written.clone(),
        );
    }
}
