//! `modules.serviceBus` as the servicebus runs it.

use kubeedge_shared::servicebus::max_body_for_frame;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// KubeEdge's servicebus reads at most 5 MB of an answer or an application's request.
pub const KUBEEDGE_MAX_BODY: usize = 5_000_000;

#[derive(Debug, Clone)]
pub struct ServiceBusConfig {
    /// The local server for edge applications (`server`:`port`, 127.0.0.1:9060).
    pub listen: SocketAddr,
    /// How long an application's request waits for the cloud (`timeout`, 60 s).
    pub upload_timeout: Duration,
    /// How long a call of a local HTTP server may take (KubeEdge's client: 10 s).
    pub call_timeout: Duration,
    /// Largest answer body relayed to the cloud and largest application request (5 MB, or
    /// less when a cloudhub frame cannot carry it base64-encoded).
    pub max_body: usize,
    /// Calls of local servers at once; beyond, a call is answered `503` at once.
    pub max_calls: usize,
}

impl ServiceBusConfig {
    pub fn from_edgecore(c: &crate::config::EdgeCoreConfig) -> Result<Self, String> {
        let s = &c.modules.service_bus;
        let ip: IpAddr = s.server.parse().map_err(|_| {
            format!(
                "modules.serviceBus.server {:?} is not an IP address",
                s.server
            )
        })?;
        let port = u16::try_from(s.port)
            .map_err(|_| format!("modules.serviceBus.port {} is not a port", s.port))?;
        let timeout = if s.timeout > 0 { s.timeout as u64 } else { 60 };
        Ok(ServiceBusConfig {
            listen: SocketAddr::new(ip, port),
            upload_timeout: Duration::from_secs(timeout),
            ..ServiceBusConfig::default()
        })
    }
}

impl Default for ServiceBusConfig {
    fn default() -> Self {
        ServiceBusConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9060)),
            upload_timeout: Duration::from_secs(60),
            call_timeout: Duration::from_secs(10),
            max_body: KUBEEDGE_MAX_BODY.min(max_body_for_frame(
                kubeedge_shared::codec::DEFAULT_MAX_FRAME_BYTES,
            )),
            max_calls: 128,
        }
    }
}
