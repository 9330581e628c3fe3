//! Entry points of the edge DNS server's fuzz targets (`e2e/fuzz`; see
//! `kubeedge_shared::fuzz_targets` for the layout): the message codec, and a whole query
//! through validation and the cluster zone as the server answers it.

use crate::catalog::{Catalog, Snapshot};
use crate::dns::forward::MAX_UDP_REPLY;
use crate::dns::wire::{MAX_MESSAGE_LEN, MIN_UDP_LIMIT, Message};
use crate::dns::{DnsMetrics, Forwarder, Transport, Zone};
use crate::model::{EndpointSlice, LocalPod, Service};
use serde_json::json;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A DNS message as a client or an upstream sends it: what decodes encodes to a message that
/// decodes to the same value.
pub fn dns_message(data: &[u8]) {
    let Ok(msg) = Message::decode(data) else {
        return;
    };
    let encoded = msg.encode(MAX_MESSAGE_LEN);
    let again = Message::decode(&encoded).expect("an encoded message decodes");
    if !again.header.truncated {
        assert_eq!(again, msg);
    }
}

/// Services of every kind in namespace `shop` (ClusterIP, headless, ExternalName in and out of
/// the zone, a local pod).
fn snapshot() -> &'static Snapshot {
    static SNAP: OnceLock<Snapshot> = OnceLock::new();
    SNAP.get_or_init(|| {
        let service = |v: serde_json::Value| Service::from_json(&v.to_string()).expect("service");
        let slice = |v: serde_json::Value| EndpointSlice::from_json(&v.to_string()).expect("slice");
        let mut c = Catalog::new("edge-1");
        c.set_local_pods_known();
        c.apply_service(service(
            json!({"metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20", "fd00::20"],
                     "selector": {"app": "web"},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080},
                               {"name": "dns", "port": 53, "protocol": "UDP"}, {"port": 81}]}}),
        ));
        c.apply_slice(slice(
            json!({"metadata": {"name": "web-x", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": ["10.77.0.9"], "nodeName": "edge-2"}]}),
        ));
        let pod = json!({"metadata": {"name": "web-1", "namespace": "shop", "uid": "u1",
                "labels": {"app": "web"}},
            "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"podIP": "10.88.0.7", "conditions": [{"type": "Ready", "status": "True"}]}});
        c.apply_pod(LocalPod::from_json(&pod.to_string(), None).expect("pod"));
        c.apply_service(service(
            json!({"metadata": {"name": "db", "namespace": "shop"},
            "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}}),
        ));
        c.apply_slice(slice(
            json!({"metadata": {"name": "db-a", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "db"}},
            "addressType": "IPv4", "ports": [{"name": "pg", "port": 15432}],
            "endpoints": [{"addresses": ["10.88.1.1"], "hostname": "db-0", "nodeName": "edge-2"},
                          {"addresses": ["10.88.1.2"], "nodeName": "edge-2"},
                          {"addresses": ["10.88.1.3"], "conditions": {"ready": false}}]}),
        ));
        c.apply_slice(slice(
            json!({"metadata": {"name": "db-b", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "db"}},
            "addressType": "IPv6", "ports": [{"name": "pg", "port": 15432}],
            "endpoints": [{"addresses": ["fd00::1:4"], "nodeName": "edge-2"}]}),
        ));
        c.apply_service(service(
            json!({"metadata": {"name": "ext", "namespace": "shop"},
            "spec": {"type": "ExternalName", "externalName": "example.com"}}),
        ));
        c.apply_service(service(
            json!({"metadata": {"name": "alias", "namespace": "shop"},
            "spec": {"type": "ExternalName", "externalName": "web.shop.svc.cluster.local"}}),
        ));
        c.snapshot().expect("a snapshot")
    })
}

/// A query packet (the first byte picks UDP or TCP) answered as the server answers it, with no
/// upstream to forward to: whatever the reply, it decodes and fits the transport's limit.
pub fn dns_query(data: &[u8]) {
    let Some((&transport, packet)) = data.split_first() else {
        return;
    };
    let transport = if transport & 1 == 0 {
        Transport::Udp
    } else {
        Transport::Tcp
    };
    let metrics = DnsMetrics::default();
    let forwarder = Arc::new(Forwarder::new(
        Vec::new(),
        Duration::from_secs(1),
        1,
        metrics.clone(),
    ));
    let zone = Zone::new("cluster.local", 5).expect("the zone");
    let responder = crate::dns::respond::Responder::new(zone, forwarder, metrics);
    if let crate::dns::respond::Step::Reply(reply) =
        responder.handle(packet, transport, snapshot(), Instant::now())
    {
        let limit = match transport {
            Transport::Udp => Message::decode(packet)
                .ok()
                .and_then(|q| q.edns)
                .map_or(MIN_UDP_LIMIT, |e| {
                    usize::from(e.udp_payload).clamp(MIN_UDP_LIMIT, MAX_UDP_REPLY)
                }),
            Transport::Tcp => MAX_MESSAGE_LEN,
        };
        assert!(reply.len() <= limit, "a reply of {} bytes", reply.len());
        let reply = Message::decode(&reply).expect("a reply decodes");
        assert!(reply.header.response);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_shared::fuzz_targets::replay;

    #[test]
    fn dns_message_corpus_replays() {
        replay("dns_message", dns_message);
    }

    #[test]
    fn dns_query_corpus_replays() {
        replay("dns_query", dns_query);
    }
}
