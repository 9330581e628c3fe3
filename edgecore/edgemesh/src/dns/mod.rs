//! DNS at the edge: the nameserver edge pods use (`nameserver 169.254.96.16` in their
//! resolv.conf), answering cluster names from the catalog's [`Snapshot`] and forwarding
//! everything else upstream — also while the cloud is unreachable.
//!
//! ```text
//! UDP/TCP query ─► server ─► respond ─┬─► zone (cluster domain, from the Snapshot) ─► answer
//!                                     └─► forward (upstream resolvers)             ─► answer
//! ```
//!
//! | file         | concern                                                             |
//! |--------------|---------------------------------------------------------------------|
//! | `name.rs`    | domain names: text and wire forms, compression-pointer decoding     |
//! | `wire.rs`    | the message codec (RFC 1035, EDNS0 RFC 6891), truncation to a size  |
//! | `zone.rs`    | the cluster domain per the Kubernetes DNS specification (CoreDNS)   |
//! | `forward.rs` | upstream resolvers: UDP/TCP exchange, fail-over, in-flight bound     |
//! | `respond.rs` | one query → one reply: validation, zone or forward, size limits     |
//! | `server.rs`  | sockets: UDP loop, TCP connections, start/shutdown                  |
//! | `metrics.rs` | Prometheus counters and latency, labels from fixed sets             |
//!
//! [`Snapshot`]: crate::catalog::Snapshot

pub(crate) mod forward;
mod metrics;
mod name;
pub(crate) mod respond;
mod server;
pub mod wire;
mod zone;

#[cfg(test)]
mod tests;

pub use forward::{
    DEFAULT_FORWARD_TIMEOUT, DEFAULT_MAX_FORWARDS, ForwardError, ForwardSlot, Forwarder,
    upstreams_from_resolv_conf,
};
pub use metrics::{DnsMetrics, QueryResult, Transport};
pub use name::{Labels, MAX_LABEL_LEN, MAX_NAME_LEN, Name};
pub use server::{DEFAULT_LISTEN, DnsConfig, DnsError, DnsServer};
pub use wire::WireError;
pub use zone::{DEFAULT_CLUSTER_DOMAIN, DEFAULT_TTL, Lookup, Zone, ZoneAnswer};
