//! Tunnel port negotiation (KubeEdge's `NegotiateTunnelPort` in `cloud/cmd/cloudcore/app/server.go`;
//! protocol §7.1, §3.7): every cloudcore replica owns one port from 10351 up, recorded in the
//! annotation `tunnelportrecord.kubeedge.io` of ConfigMap `kubeedge/tunnelport` as
//! `{"ipTunnelPort":{"<ip>":10351},"port":{"10351":true}}`. Nodes whose stream tunnel is on that
//! replica report the port as their kubelet port, and the iptables manager DNATs it to the
//! replica's stream port. A replica that restarts with the same IP keeps its port.
//!
//! KubeEdge reads, picks and writes without retrying (replicas sleep a random 0–9 s first);
//! here the write carries the resourceVersion read, and a conflict (another replica wrote in
//! between) starts the round again.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

pub use kubeedge_shared::constants::CLOUDCORE_NAMESPACE as NAMESPACE;
pub const CONFIGMAP: &str = "tunnelport";
pub const ANNOTATION: &str = "tunnelportrecord.kubeedge.io";
/// KubeEdge's `constants.ServerPort`; negotiated ports start one above it.
pub use kubeedge_shared::constants::DEFAULT_EDGED_PORT as SERVER_PORT;

/// The annotation's JSON (Go `TunnelPortRecord`; a Go `map[int]bool` has string keys).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelPortRecord {
    #[serde(rename = "ipTunnelPort", default)]
    pub ip_tunnel_port: BTreeMap<String, u16>,
    #[serde(default)]
    pub port: BTreeMap<String, bool>,
}

impl TunnelPortRecord {
    pub fn parse(annotation: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(annotation)
    }

    pub fn to_json(&self) -> String {
        // Maps of strings and integers always serialize.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The port recorded for `ip`, or the lowest free one above 10350, now recorded for it.
    /// Returns the port and whether the record changed.
    pub fn claim(&mut self, ip: &str) -> Option<(u16, bool)> {
        if let Some(p) = self.ip_tunnel_port.get(ip) {
            return Some((*p, false));
        }
        let taken = |p: u16| {
            self.port.contains_key(&p.to_string()) || self.ip_tunnel_port.values().any(|v| *v == p)
        };
        let port = (SERVER_PORT + 1..=u16::MAX).find(|p| !taken(*p))?;
        self.ip_tunnel_port.insert(ip.to_string(), port);
        self.port.insert(port.to_string(), true);
        Some((port, true))
    }

    /// The record in `cm`'s annotation (empty when the ConfigMap has none).
    pub fn of(cm: &ConfigMap) -> Result<Self, serde_json::Error> {
        match cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION))
        {
            Some(s) => Self::parse(s),
            None => Ok(Self::default()),
        }
    }
}

/// The IP a replica's port is recorded under: `POD_IP` (the Downward API; with hostNetwork the
/// host's address, as KubeEdge's `GetLocalIP`), else the address of the default route.
pub fn local_ip() -> String {
    std::env::var("POD_IP")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| s.parse::<std::net::IpAddr>().is_ok())
        .unwrap_or_else(|| crate::config::local_ip().to_string())
}

#[derive(Debug, thiserror::Error)]
pub enum NegotiateError {
    #[error(
        "ConfigMap {NAMESPACE}/{CONFIGMAP}: {0} (may cloudcore get, create and update configmaps in {NAMESPACE}?)"
    )]
    Api(#[source] kube::Error),
    #[error(
        "annotation {ANNOTATION} of ConfigMap {NAMESPACE}/{CONFIGMAP} is not a tunnel port record: {0}"
    )]
    BadRecord(#[source] serde_json::Error),
    #[error("no free tunnel port left above {SERVER_PORT}")]
    Exhausted,
    #[error("ConfigMap {NAMESPACE}/{CONFIGMAP} kept changing under us ({0} conflicting writes)")]
    Contended(u32),
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Negotiates this replica's tunnel port for `ip` (read-modify-write with optimistic
/// concurrency). Creates namespace `kubeedge` if needed, as KubeEdge does.
pub async fn negotiate(client: &kube::Client, ip: &str) -> Result<u16, NegotiateError> {
    ensure_namespace(client).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    const ROUNDS: u32 = 20;
    for round in 0..ROUNDS {
        if round > 0 {
            // Spread the replicas that collided.
            let jitter = (std::process::id() as u64 * 7 + round as u64 * 13) % 50;
            tokio::time::sleep(Duration::from_millis(20 + jitter)).await;
        }
        let existing = api.get_opt(CONFIGMAP).await.map_err(NegotiateError::Api)?;
        let (mut record, cm) = match existing {
            Some(cm) => (
                TunnelPortRecord::of(&cm).map_err(NegotiateError::BadRecord)?,
                Some(cm),
            ),
            None => (TunnelPortRecord::default(), None),
        };
        let (port, changed) = record.claim(ip).ok_or(NegotiateError::Exhausted)?;
        if !changed {
            tracing::info!(%ip, port, "tunnel port already recorded for this address");
            return Ok(port);
        }
        let result = match cm {
            Some(mut cm) => {
                // resourceVersion stays as read: the apiserver refuses a stale write with 409.
                cm.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(ANNOTATION.into(), record.to_json());
                api.replace(CONFIGMAP, &PostParams::default(), &cm).await
            }
            None => {
                let mut cm = ConfigMap::default();
                cm.metadata.name = Some(CONFIGMAP.into());
                cm.metadata.namespace = Some(NAMESPACE.into());
                cm.metadata.annotations = Some([(ANNOTATION.to_string(), record.to_json())].into());
                api.create(&PostParams::default(), &cm).await
            }
        };
        match result {
            Ok(_) => {
                tracing::info!(%ip, port, "tunnel port negotiated");
                return Ok(port);
            }
            Err(e) if conflict(&e) => {
                tracing::debug!(%ip, round, "tunnel port record changed meanwhile; reading it again");
            }
            Err(e) => return Err(NegotiateError::Api(e)),
        }
    }
    Err(NegotiateError::Contended(ROUNDS))
}

async fn ensure_namespace(client: &kube::Client) {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(client.clone());
    if matches!(api.get_opt(NAMESPACE).await, Ok(Some(_))) {
        return;
    }
    let mut ns = Namespace::default();
    ns.metadata.name = Some(NAMESPACE.into());
    if let Err(e) = api.create(&PostParams::default(), &ns).await
        && !conflict(&e)
    {
        tracing::debug!(error = %e, "creating namespace {NAMESPACE} failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_reads_and_writes_kubeedges_json() {
        let r =
            TunnelPortRecord::parse(r#"{"ipTunnelPort":{"10.0.0.5":10351},"port":{"10351":true}}"#)
                .unwrap();
        assert_eq!(r.ip_tunnel_port["10.0.0.5"], 10351);
        assert!(r.port["10351"]);
        assert_eq!(
            r.to_json(),
            r#"{"ipTunnelPort":{"10.0.0.5":10351},"port":{"10351":true}}"#
        );
        assert!(TunnelPortRecord::parse("{\"ipTunnelPort\":{\"x\":\"no\"}}").is_err());
        // Missing maps read as empty.
        assert_eq!(
            TunnelPortRecord::parse("{}").unwrap(),
            TunnelPortRecord::default()
        );
    }

    #[test]
    fn each_address_gets_the_lowest_free_port_and_keeps_it() {
        let mut r = TunnelPortRecord::default();
        assert_eq!(r.claim("10.0.0.1"), Some((10351, true)));
        assert_eq!(r.claim("10.0.0.2"), Some((10352, true)));
        assert_eq!(r.claim("10.0.0.1"), Some((10351, false)));
        // A port freed from ipTunnelPort (pod deleted) but still in `port` is not reused,
        // as KubeEdge's negotiatePort checks the `port` set.
        r.ip_tunnel_port.remove("10.0.0.1");
        assert_eq!(r.claim("10.0.0.3"), Some((10353, true)));
        let json = r.to_json();
        assert!(json.contains(r#""10.0.0.3":10353"#), "{json}");
        assert!(json.contains(r#""10353":true"#), "{json}");
    }
}
