//! Tests of the DNS server, by concern; this file holds the shared fixtures: a catalog
//! snapshot with every kind of Service, queries, and fake upstream resolvers.

mod codec;
mod forward;
mod server;
mod zone;

use super::metrics::{DnsMetrics, Transport};
use super::name::Name;
use super::respond::{Responder, Step};
use super::wire::{Class, Edns, Header, Message, Question, RData, Rcode, Record, RecordType};
use super::zone::Zone;
use super::{Forwarder, forward::DEFAULT_MAX_FORWARDS};
use crate::catalog::{Catalog, Snapshot};
use crate::model::{EndpointSlice, LocalPod, Service};
use serde_json::json;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

pub(super) fn service(v: serde_json::Value) -> Service {
    Service::from_json(&v.to_string()).unwrap()
}

pub(super) fn slice(v: serde_json::Value) -> EndpointSlice {
    EndpointSlice::from_json(&v.to_string()).unwrap()
}

/// Every kind of Service in namespace `shop`:
/// - `web`: ClusterIP 10.96.0.20 + fd00::20, ports `http` 80/TCP, `dns` 53/UDP, unnamed 81;
///   a remote endpoint (slice) and a local pod (edged).
/// - `db`: headless, port `pg` 5432 (endpoints listen on 15432): `db-0` 10.88.1.1,
///   10.88.1.2 without hostname, 10.88.1.3 not ready, fd00::1:4 without hostname.
/// - `ext`: ExternalName `example.com`; `alias`: ExternalName `web.shop.svc.cluster.local`.
pub(super) fn catalog() -> Catalog {
    let mut c = Catalog::new("edge-1");
    c.set_local_pods_known();
    c.apply_service(service(
        json!({"metadata": {"name": "web", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20", "fd00::20"],
                 "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080},
                           {"name": "dns", "port": 53, "protocol": "UDP"},
                           {"port": 81}]}}),
    ));
    c.apply_slice(slice(
        json!({"metadata": {"name": "web-x", "namespace": "shop",
            "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
        "endpoints": [{"addresses": ["10.77.0.9"], "nodeName": "edge-2"}]}),
    ));
    c.apply_pod(
        LocalPod::from_json(
            &json!({"metadata": {"name": "web-1", "namespace": "shop", "uid": "u1",
                    "labels": {"app": "web"}},
                "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8080}]}]},
                "status": {"podIP": "10.88.0.7",
                           "conditions": [{"type": "Ready", "status": "True"}]}})
            .to_string(),
            None,
        )
        .unwrap(),
    );
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
                      {"addresses": ["10.88.1.3"], "conditions": {"ready": false},
                       "nodeName": "edge-2"}]}),
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
    c
}

pub(super) fn snapshot() -> Snapshot {
    catalog().snapshot().unwrap()
}

/// A headless Service `shop/big` with `n` ready endpoints 10.(i/65536).(i/256).(i%256).
pub(super) fn big_snapshot(n: u32) -> Snapshot {
    let mut c = Catalog::new("edge-1");
    c.apply_service(service(
        json!({"metadata": {"name": "big", "namespace": "shop"},
        "spec": {"clusterIP": "None"}}),
    ));
    let endpoints: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let ip = Ipv4Addr::from(0x0a00_0000 + i);
            json!({"addresses": [ip.to_string()], "nodeName": "edge-2"})
        })
        .collect();
    c.apply_slice(slice(
        json!({"metadata": {"name": "big-a", "namespace": "shop",
            "labels": {"kubernetes.io/service-name": "big"}},
        "addressType": "IPv4", "endpoints": endpoints}),
    ));
    c.snapshot().unwrap()
}

pub(super) fn name(text: &str) -> Name {
    Name::parse(text).unwrap()
}

pub(super) fn question(qname: &str, qtype: RecordType) -> Question {
    Question {
        name: name(qname),
        qtype,
        qclass: Class::IN,
    }
}

pub(super) const QUERY_ID: u16 = 0x4a4b;

pub(super) fn query_message(qname: &str, qtype: RecordType, edns: Option<u16>) -> Message {
    Message {
        header: Header {
            id: QUERY_ID,
            recursion_desired: true,
            ..Header::default()
        },
        questions: vec![question(qname, qtype)],
        edns: edns.map(|udp_payload| Edns {
            udp_payload,
            version: 0,
            dnssec_ok: false,
            options: Vec::new(),
        }),
        ..Message::default()
    }
}

pub(super) fn query(qname: &str, qtype: RecordType) -> Vec<u8> {
    query_message(qname, qtype, None).encode(512)
}

pub(super) fn zone() -> Zone {
    Zone::new("cluster.local", 5).unwrap()
}

pub(super) fn responder(upstreams: Vec<SocketAddr>) -> (Responder, DnsMetrics) {
    let metrics = DnsMetrics::default();
    let forwarder = Forwarder::new(
        upstreams,
        Duration::from_millis(300),
        DEFAULT_MAX_FORWARDS,
        metrics.clone(),
    );
    let r = Responder::new(zone(), Arc::new(forwarder), metrics.clone());
    (r, metrics)
}

/// The reply the responder gives at once (panics if it would wait or drop).
pub(super) fn reply_now(r: &Responder, packet: &[u8], t: Transport, snap: &Snapshot) -> Vec<u8> {
    match r.handle(packet, t, snap, Instant::now()) {
        Step::Reply(bytes) => bytes,
        Step::Drop => panic!("dropped"),
        Step::Wait(_) => panic!("waits for an upstream"),
    }
}

pub(super) fn ips(records: &[Record]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = records
        .iter()
        .filter_map(|r| match r.data {
            RData::A(ip) => Some(IpAddr::V4(ip)),
            RData::Aaaa(ip) => Some(IpAddr::V6(ip)),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// How a fake upstream behaves.
#[derive(Clone, Copy, Debug)]
pub(super) enum Upstream {
    /// A 192.0.2.1 for every name (and a TXT record so the reply is not one of ours).
    Answer,
    /// Never answers.
    Silent,
    /// First a reply with the wrong ID, then the right one.
    WrongIdFirst,
    /// An answer with this many A records.
    Big(u16),
}

/// The reply a fake upstream gives to `query`.
pub(super) fn upstream_reply(query: &[u8], how: Upstream) -> Message {
    let q = Message::decode(query).unwrap();
    let mut reply = q.clone();
    reply.header.response = true;
    reply.header.recursion_available = true;
    reply.rcode = Rcode::NOERROR;
    let owner = q.questions[0].name.clone();
    let count = match how {
        Upstream::Big(n) => n,
        _ => 1,
    };
    for i in 0..count {
        reply.answers.push(Record::new(
            owner.clone(),
            300,
            RData::A(Ipv4Addr::from(0xc000_0201 + u32::from(i))),
        ));
    }
    reply
}

/// A fake upstream on UDP 127.0.0.1; also returns the query IDs it saw.
pub(super) async fn udp_upstream(
    how: Upstream,
) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<u16>) {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let (seen, ids) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65535];
        loop {
            let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                return;
            };
            let q = &buf[..n];
            let _ = seen.send(u16::from_be_bytes([q[0], q[1]]));
            let reply = upstream_reply(q, how);
            match how {
                Upstream::Silent => continue,
                Upstream::WrongIdFirst => {
                    let mut wrong = reply.clone();
                    wrong.header.id = reply.header.id.wrapping_add(1);
                    wrong.answers[0].data = RData::A(Ipv4Addr::new(6, 6, 6, 6));
                    sock.send_to(&wrong.encode(512), peer).await.unwrap();
                }
                _ => {}
            }
            sock.send_to(&reply.encode(65535), peer).await.unwrap();
        }
    });
    (addr, ids)
}

/// A fake upstream on TCP 127.0.0.1, one query per connection.
pub(super) async fn tcp_upstream(how: Upstream) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut len = [0u8; 2];
                s.read_exact(&mut len).await.unwrap();
                let mut q = vec![0u8; usize::from(u16::from_be_bytes(len))];
                s.read_exact(&mut q).await.unwrap();
                if matches!(how, Upstream::Silent) {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    return;
                }
                let reply = upstream_reply(&q, how).encode(65535);
                let mut frame = (reply.len() as u16).to_be_bytes().to_vec();
                frame.extend_from_slice(&reply);
                s.write_all(&frame).await.unwrap();
            });
        }
    });
    addr
}
