//! The server end to end over real sockets on 127.0.0.1, and the responder's handling of
//! malformed queries and size limits.

use super::*;
use crate::dns::metrics::QueryResult;
use crate::dns::{DnsConfig, DnsError, DnsServer};
use tokio::net::TcpStream;
use tokio::sync::watch;

fn config(upstreams: Vec<SocketAddr>) -> DnsConfig {
    DnsConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        upstreams,
        forward_timeout: Duration::from_millis(300),
        ..DnsConfig::default()
    }
}

fn start(config: DnsConfig, snap: Snapshot) -> (DnsServer, watch::Sender<Arc<Snapshot>>) {
    let (tx, rx) = watch::channel(Arc::new(snap));
    (DnsServer::start(config, rx).unwrap(), tx)
}

async fn udp_ask(server: SocketAddr, packet: &[u8]) -> Option<Vec<u8>> {
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    s.send_to(packet, server).await.unwrap();
    let mut buf = vec![0u8; 65535];
    let n = tokio::time::timeout(Duration::from_secs(2), s.recv(&mut buf))
        .await
        .ok()?
        .unwrap();
    buf.truncate(n);
    Some(buf)
}

async fn tcp_ask(stream: &mut TcpStream, packet: &[u8]) -> Vec<u8> {
    let mut frame = (packet.len() as u16).to_be_bytes().to_vec();
    frame.extend_from_slice(packet);
    stream.write_all(&frame).await.unwrap();
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await.unwrap();
    let mut reply = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut reply).await.unwrap();
    reply
}

#[tokio::test]
async fn cluster_names_are_answered_over_udp_with_the_id_and_spelling_of_the_query() {
    let (server, _tx) = start(config(vec![]), snapshot());
    let reply = udp_ask(
        server.local_addr(),
        &query("Web.Shop.svc.cluster.local", RecordType::A),
    )
    .await
    .unwrap();
    let m = Message::decode(&reply).unwrap();
    assert_eq!(m.header.id, QUERY_ID);
    assert!(m.header.response && m.header.authoritative && m.header.recursion_desired);
    assert_eq!(m.rcode, Rcode::NOERROR);
    assert_eq!(
        m.questions[0].name.to_string(),
        "Web.Shop.svc.cluster.local."
    );
    assert_eq!(ips(&m.answers), [ip("10.96.0.20")]);
    assert!(m.edns.is_none(), "no OPT when the query had none");
    server.shutdown().await;
}

#[tokio::test]
async fn several_queries_share_one_tcp_connection() {
    let (server, _tx) = start(config(vec![]), snapshot());
    let mut s = TcpStream::connect(server.local_addr()).await.unwrap();
    let a = Message::decode(
        &tcp_ask(&mut s, &query("web.shop.svc.cluster.local", RecordType::A)).await,
    )
    .unwrap();
    assert_eq!(ips(&a.answers), [ip("10.96.0.20")]);
    let b = Message::decode(
        &tcp_ask(&mut s, &query("nope.shop.svc.cluster.local", RecordType::A)).await,
    )
    .unwrap();
    assert_eq!(b.rcode, Rcode::NXDOMAIN);
    assert_eq!(
        server
            .metrics()
            .query_count(QueryResult::NxDomain, Transport::Tcp),
        1
    );
    server.shutdown().await;
}

#[tokio::test]
async fn answers_follow_the_newest_snapshot() {
    let (server, tx) = start(config(vec![]), Snapshot::default());
    let q = query("web.shop.svc.cluster.local", RecordType::A);
    let ask = || udp_ask(server.local_addr(), &q);
    assert_eq!(
        Message::decode(&ask().await.unwrap()).unwrap().rcode,
        Rcode::NXDOMAIN
    );
    tx.send(Arc::new(snapshot())).unwrap();
    let m = Message::decode(&ask().await.unwrap()).unwrap();
    assert_eq!(ips(&m.answers), [ip("10.96.0.20")]);
    server.shutdown().await;
}

#[tokio::test]
async fn other_names_are_forwarded_over_udp_and_tcp() {
    let (udp_up, _) = udp_upstream(Upstream::Answer).await;
    let (server, _tx) = start(config(vec![udp_up]), snapshot());
    let m = Message::decode(
        &udp_ask(server.local_addr(), &query("example.com", RecordType::A))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (m.header.id, ips(&m.answers)),
        (QUERY_ID, vec![ip("192.0.2.1")])
    );
    server.shutdown().await;

    let tcp_up = tcp_upstream(Upstream::Answer).await;
    let (server, _tx) = start(config(vec![tcp_up]), snapshot());
    let mut s = TcpStream::connect(server.local_addr()).await.unwrap();
    let m = Message::decode(&tcp_ask(&mut s, &query("example.com", RecordType::A)).await).unwrap();
    assert_eq!(
        (m.header.id, ips(&m.answers)),
        (QUERY_ID, vec![ip("192.0.2.1")])
    );
    assert_eq!(
        server
            .metrics()
            .query_count(QueryResult::Forwarded, Transport::Tcp),
        1
    );
    server.shutdown().await;
}

#[tokio::test]
async fn when_every_upstream_is_down_clients_get_servfail() {
    let hole = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let (server, _tx) = start(config(vec![hole.local_addr().unwrap()]), snapshot());
    let m = Message::decode(
        &udp_ask(server.local_addr(), &query("example.com", RecordType::A))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!((m.rcode, m.header.id), (Rcode::SERVFAIL, QUERY_ID));
    assert_eq!(
        server
            .metrics()
            .query_count(QueryResult::ServFail, Transport::Udp),
        1
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_huge_headless_service_is_truncated_over_udp_and_fills_a_tcp_frame() {
    let (server, _tx) = start(config(vec![]), big_snapshot(10_000));
    let q = query("big.shop.svc.cluster.local", RecordType::A);
    let udp = udp_ask(server.local_addr(), &q).await.unwrap();
    assert!(udp.len() <= 512);
    let m = Message::decode(&udp).unwrap();
    assert!(m.header.truncated);
    assert!(m.answers.len() >= 25, "{}", m.answers.len());

    // With EDNS0 the client's larger size is used, up to 4096.
    let big = query_message("big.shop.svc.cluster.local", RecordType::A, Some(65000)).encode(512);
    let udp = udp_ask(server.local_addr(), &big).await.unwrap();
    assert!(udp.len() <= 4096 && udp.len() > 3000, "{}", udp.len());
    let m = Message::decode(&udp).unwrap();
    assert!(m.header.truncated && m.edns.is_some());

    let mut s = TcpStream::connect(server.local_addr()).await.unwrap();
    let tcp = tcp_ask(&mut s, &q).await;
    assert!(tcp.len() <= 65535);
    let m = Message::decode(&tcp).unwrap();
    assert!(m.answers.len() > 4000, "{}", m.answers.len());
    assert!(server.metrics().truncated_count(Transport::Udp) >= 2);
    server.shutdown().await;
}

#[tokio::test]
async fn edns0_is_echoed_and_other_versions_get_badvers() {
    let (server, _tx) = start(config(vec![]), snapshot());
    let mut q = query_message("web.shop.svc.cluster.local", RecordType::A, Some(1232));
    let m = Message::decode(&udp_ask(server.local_addr(), &q.encode(512)).await.unwrap()).unwrap();
    let edns = m.edns.unwrap();
    assert_eq!((edns.version, edns.options.len()), (0, 0));
    q.edns.as_mut().unwrap().version = 1;
    let m = Message::decode(&udp_ask(server.local_addr(), &q.encode(512)).await.unwrap()).unwrap();
    assert_eq!(m.rcode, Rcode::BADVERS);
    assert!(m.answers.is_empty());
    server.shutdown().await;
}

#[test]
fn malformed_queries_get_formerr_with_their_id_or_nothing() {
    let (r, metrics) = responder(vec![]);
    let snap = snapshot();
    let rcode_of = |packet: &[u8]| {
        let m = Message::decode(&reply_now(&r, packet, Transport::Udp, &snap)).unwrap();
        assert_eq!(m.header.id, QUERY_ID);
        assert!(m.header.response);
        m.rcode
    };
    let good = query("web.shop.svc.cluster.local", RecordType::A);
    // Cut inside the question.
    assert_eq!(rcode_of(&good[..20]), Rcode::FORMERR);
    // Two questions.
    let mut two = query_message("a.example", RecordType::A, None);
    two.questions.push(question("b.example", RecordType::A));
    assert_eq!(rcode_of(&two.encode(512)), Rcode::FORMERR);
    // No question.
    let mut none = query_message("a.example", RecordType::A, None);
    none.questions.clear();
    assert_eq!(rcode_of(&none.encode(512)), Rcode::FORMERR);
    // A label over 63 bytes (length byte 64 is a reserved label type).
    let mut long_label = good[..12].to_vec();
    long_label.push(64);
    long_label.extend_from_slice(&[b'x'; 64]);
    long_label.extend_from_slice(&[0, 0, 1, 0, 1]);
    assert_eq!(rcode_of(&long_label), Rcode::FORMERR);
    // A name over 255 bytes.
    let mut long_name = good[..12].to_vec();
    for _ in 0..5 {
        long_name.push(60);
        long_name.extend_from_slice(&[b'x'; 60]);
    }
    long_name.extend_from_slice(&[0, 0, 1, 0, 1]);
    assert_eq!(rcode_of(&long_name), Rcode::FORMERR);
    // An opcode other than QUERY.
    let mut notify = query_message("a.example", RecordType::SOA, None);
    notify.header.opcode = crate::dns::wire::Opcode(4);
    assert_eq!(rcode_of(&notify.encode(512)), Rcode::NOTIMP);
    assert_eq!(metrics.query_count(QueryResult::FormErr, Transport::Udp), 5);
    assert_eq!(metrics.query_count(QueryResult::NotImp, Transport::Udp), 1);

    // Too short for a header, or a response: no reply at all.
    for packet in [&good[..11], &[][..]] {
        assert!(matches!(
            r.handle(packet, Transport::Udp, &snap, Instant::now()),
            Step::Drop
        ));
    }
    let mut response = query_message("a.example", RecordType::A, None);
    response.header.response = true;
    assert!(matches!(
        r.handle(&response.encode(512), Transport::Udp, &snap, Instant::now()),
        Step::Drop
    ));
    assert_eq!(metrics.query_count(QueryResult::Dropped, Transport::Udp), 3);
}

#[test]
fn random_packets_never_panic_the_responder() {
    use rand::Rng;
    let (r, _) = responder(vec![]);
    let snap = snapshot();
    let mut rng = rand::rng();
    let valid =
        query_message("web.shop.svc.cluster.local", RecordType::SRV, Some(4096)).encode(512);
    for i in 0..20_000 {
        let packet: Vec<u8> = if i % 2 == 0 {
            let mut p = valid.clone();
            for _ in 0..rng.random_range(1..4) {
                let at = rng.random_range(0..p.len());
                p[at] = rng.random();
            }
            p
        } else {
            (0..rng.random_range(0..300))
                .map(|_| rng.random())
                .collect()
        };
        for t in [Transport::Udp, Transport::Tcp] {
            if let Step::Reply(bytes) = r.handle(&packet, t, &snap, Instant::now()) {
                assert!(bytes.len() <= if t == Transport::Udp { 4096 } else { 65535 });
            }
        }
    }
}

#[tokio::test]
async fn malformed_udp_packets_do_not_stop_the_server() {
    let (server, _tx) = start(config(vec![]), snapshot());
    assert!(
        udp_ask(server.local_addr(), b"\x00\x01junk")
            .await
            .is_none()
    );
    let good = query("web.shop.svc.cluster.local", RecordType::A);
    let m = Message::decode(&udp_ask(server.local_addr(), &good[..20]).await.unwrap()).unwrap();
    assert_eq!(m.rcode, Rcode::FORMERR);
    assert!(udp_ask(server.local_addr(), &good).await.is_some());
    server.shutdown().await;
}

#[tokio::test]
async fn tcp_connections_beyond_the_cap_are_closed_and_idle_ones_time_out() {
    let cfg = DnsConfig {
        max_tcp_connections: 1,
        tcp_idle_timeout: Duration::from_millis(300),
        ..config(vec![])
    };
    let (server, _tx) = start(cfg, snapshot());
    let mut first = TcpStream::connect(server.local_addr()).await.unwrap();
    let q = query("web.shop.svc.cluster.local", RecordType::A);
    tcp_ask(&mut first, &q).await;
    let mut second = TcpStream::connect(server.local_addr()).await.unwrap();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(2), second.read(&mut buf)).await;
    assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "closed at once");
    assert_eq!(server.metrics().tcp_rejected_count(), 1);
    // The first connection idles out; then a new one is served.
    let n = tokio::time::timeout(Duration::from_secs(2), first.read(&mut buf)).await;
    assert!(
        matches!(n, Ok(Ok(0)) | Ok(Err(_))),
        "idle connection closed"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut third = TcpStream::connect(server.local_addr()).await.unwrap();
    assert!(!tcp_ask(&mut third, &q).await.is_empty());
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_stops_both_transports() {
    let (server, _tx) = start(config(vec![]), snapshot());
    let addr = server.local_addr();
    let mut open = TcpStream::connect(addr).await.unwrap();
    server.shutdown().await;
    let mut buf = [0u8; 1];
    assert!(matches!(open.read(&mut buf).await, Ok(0) | Err(_)));
    assert!(TcpStream::connect(addr).await.is_err());
    assert!(
        udp_ask(addr, &query("web.shop.svc.cluster.local", RecordType::A))
            .await
            .is_none()
    );
}

#[tokio::test]
async fn a_taken_address_is_a_clear_error_naming_it() {
    let (server, _tx) = start(config(vec![]), snapshot());
    let taken = DnsConfig {
        listen: server.local_addr(),
        ..DnsConfig::default()
    };
    let (_tx2, rx) = watch::channel(Arc::new(Snapshot::default()));
    let err = DnsServer::start(taken, rx).err().unwrap();
    assert!(matches!(err, DnsError::Bind { .. }));
    let text = err.to_string();
    assert!(text.contains(&server.local_addr().to_string()), "{text}");
    assert!(text.contains("another DNS server"), "{text}");
    let (_tx3, rx) = watch::channel(Arc::new(Snapshot::default()));
    let bad = DnsConfig {
        cluster_domain: "a..b".into(),
        ..config(vec![])
    };
    assert!(matches!(
        DnsServer::start(bad, rx),
        Err(DnsError::ClusterDomain { .. })
    ));
    server.shutdown().await;
}

#[test]
fn metrics_register_under_the_edgemesh_dns_prefix() {
    let metrics = DnsMetrics::default();
    metrics.query(
        QueryResult::Local,
        Transport::Udp,
        Duration::from_micros(80),
    );
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(r#"edgemesh_dns_queries_total{result="local",transport="udp"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("edgemesh_dns_query_duration_seconds_bucket"),
        "{text}"
    );
}
