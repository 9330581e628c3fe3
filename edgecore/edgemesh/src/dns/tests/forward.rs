//! Forwarding to upstream resolvers, against fake upstreams on 127.0.0.1.

use super::*;
use crate::dns::forward::ForwardError;
use crate::dns::metrics::QueryResult;
use crate::dns::upstreams_from_resolv_conf;

fn forwarder(upstreams: Vec<SocketAddr>, max: usize) -> Forwarder {
    Forwarder::new(
        upstreams,
        Duration::from_millis(300),
        max,
        DnsMetrics::default(),
    )
}

/// An address nothing answers on (bound, so no ICMP error either).
async fn black_hole() -> (UdpSocket, SocketAddr) {
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let a = s.local_addr().unwrap();
    (s, a)
}

#[tokio::test]
async fn udp_queries_go_out_with_a_fresh_id_and_come_back_with_the_clients() {
    let (up, mut seen) = udp_upstream(Upstream::Answer).await;
    let f = forwarder(vec![up], 8);
    let slot = f.reserve().unwrap();
    let mut ids = Vec::new();
    for _ in 0..4 {
        let reply = f
            .exchange(&slot, &query("example.com", RecordType::A), Transport::Udp)
            .await
            .unwrap();
        let m = Message::decode(&reply).unwrap();
        assert_eq!(m.header.id, QUERY_ID);
        assert_eq!(ips(&m.answers), [ip("192.0.2.1")]);
        ids.push(seen.recv().await.unwrap());
    }
    ids.dedup();
    assert!(ids.len() > 1, "the upstream saw fresh IDs: {ids:?}");
}

#[tokio::test]
async fn udp_replies_with_another_id_are_ignored() {
    let (up, _) = udp_upstream(Upstream::WrongIdFirst).await;
    let f = forwarder(vec![up], 8);
    let slot = f.reserve().unwrap();
    let reply = f
        .exchange(&slot, &query("example.com", RecordType::A), Transport::Udp)
        .await
        .unwrap();
    assert_eq!(
        ips(&Message::decode(&reply).unwrap().answers),
        [ip("192.0.2.1")]
    );
}

#[tokio::test]
async fn tcp_queries_are_forwarded_over_tcp() {
    let up = tcp_upstream(Upstream::Big(2000)).await;
    let f = forwarder(vec![up], 8);
    let slot = f.reserve().unwrap();
    let reply = f
        .exchange(&slot, &query("example.com", RecordType::A), Transport::Tcp)
        .await
        .unwrap();
    let m = Message::decode(&reply).unwrap();
    assert_eq!(m.header.id, QUERY_ID);
    assert_eq!(m.answers.len(), 2000);
}

#[tokio::test]
async fn a_silent_upstream_times_out_and_the_next_one_answers() {
    let (_hole, silent) = black_hole().await;
    let (up, _) = udp_upstream(Upstream::Answer).await;
    let f = forwarder(vec![silent, up], 8);
    let slot = f.reserve().unwrap();
    let started = Instant::now();
    let reply = f
        .exchange(&slot, &query("example.com", RecordType::A), Transport::Udp)
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(Message::decode(&reply).unwrap().header.id, QUERY_ID);

    let silent_tcp = tcp_upstream(Upstream::Silent).await;
    let tcp = tcp_upstream(Upstream::Answer).await;
    let f = forwarder(vec![silent_tcp, tcp], 8);
    let slot = f.reserve().unwrap();
    let reply = f
        .exchange(&slot, &query("example.com", RecordType::A), Transport::Tcp)
        .await
        .unwrap();
    assert_eq!(Message::decode(&reply).unwrap().header.id, QUERY_ID);
}

#[tokio::test]
async fn when_every_upstream_is_down_the_exchange_fails() {
    let (_hole, silent) = black_hole().await;
    // A closed port: refused at once (ICMP on UDP, RST on TCP).
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let f = forwarder(vec![silent, closed], 8);
    let slot = f.reserve().unwrap();
    for t in [Transport::Udp, Transport::Tcp] {
        assert_eq!(
            f.exchange(&slot, &query("example.com", RecordType::A), t)
                .await,
            Err(ForwardError::Failed)
        );
    }
}

#[test]
fn forward_slots_are_bounded_and_given_back() {
    let f = forwarder(vec!["127.0.0.1:53".parse().unwrap()], 2);
    let a = f.reserve().unwrap();
    let _b = f.reserve().unwrap();
    assert_eq!(f.reserve().err(), Some(ForwardError::Busy));
    drop(a);
    assert!(f.reserve().is_ok());
    assert_eq!(
        forwarder(vec![], 2).reserve().err(),
        Some(ForwardError::NoUpstream)
    );
}

#[tokio::test]
async fn beyond_the_forward_bound_queries_are_refused_at_once() {
    let (_hole, silent) = black_hole().await;
    let metrics = DnsMetrics::default();
    let f = Forwarder::new(vec![silent], Duration::from_secs(5), 1, metrics.clone());
    let r = Responder::new(zone(), Arc::new(f), metrics.clone());
    let snap = snapshot();
    let first = r.handle(
        &query("example.com", RecordType::A),
        Transport::Udp,
        &snap,
        Instant::now(),
    );
    assert!(matches!(first, Step::Wait(_)));
    let second = reply_now(
        &r,
        &query("example.org", RecordType::A),
        Transport::Udp,
        &snap,
    );
    let m = Message::decode(&second).unwrap();
    assert_eq!((m.rcode, m.header.id), (Rcode::REFUSED, QUERY_ID));
    assert_eq!(metrics.query_count(QueryResult::Refused, Transport::Udp), 1);
    // Cluster names are still answered.
    let local = reply_now(
        &r,
        &query("web.shop.svc.cluster.local", RecordType::A),
        Transport::Udp,
        &snap,
    );
    assert_eq!(Message::decode(&local).unwrap().answers.len(), 1);
}

#[test]
fn without_upstreams_other_names_get_servfail() {
    let (r, metrics) = responder(vec![]);
    let reply = reply_now(
        &r,
        &query("example.com", RecordType::A),
        Transport::Udp,
        &snapshot(),
    );
    let m = Message::decode(&reply).unwrap();
    assert_eq!(m.rcode, Rcode::SERVFAIL);
    assert_eq!(m.questions[0].name, name("example.com"));
    assert_eq!(
        metrics.query_count(QueryResult::ServFail, Transport::Udp),
        1
    );
    // An ExternalName still gets its CNAME.
    let reply = reply_now(
        &r,
        &query("ext.shop.svc.cluster.local", RecordType::A),
        Transport::Udp,
        &snapshot(),
    );
    let m = Message::decode(&reply).unwrap();
    assert_eq!(m.rcode, Rcode::NOERROR);
    assert_eq!(m.answers[0].data, RData::Cname(name("example.com")));
}

#[tokio::test]
async fn an_external_name_is_chased_upstream_and_answered_with_both_records() {
    let (up, _) = udp_upstream(Upstream::Answer).await;
    let (r, metrics) = responder(vec![up]);
    let Step::Wait(pending) = r.handle(
        &query("ext.shop.svc.cluster.local", RecordType::A),
        Transport::Udp,
        &snapshot(),
        Instant::now(),
    ) else {
        panic!("not forwarded");
    };
    let m = Message::decode(&pending.run().await).unwrap();
    assert_eq!(m.rcode, Rcode::NOERROR);
    assert_eq!(m.answers[0].data, RData::Cname(name("example.com")));
    assert_eq!(m.answers[1].name, name("example.com"));
    assert_eq!(ips(&m.answers), [ip("192.0.2.1")]);
    assert_eq!(
        metrics.query_count(QueryResult::Forwarded, Transport::Udp),
        1
    );
}

#[tokio::test]
async fn an_upstream_reply_too_long_for_the_client_becomes_tc() {
    let (up, _) = udp_upstream(Upstream::Big(100)).await;
    let (r, metrics) = responder(vec![up]);
    // The client advertises 1232 bytes; the fake upstream ignores that and sends ~1.6 KB.
    let packet = query_message("example.com", RecordType::A, Some(1232)).encode(512);
    let Step::Wait(pending) = r.handle(&packet, Transport::Udp, &snapshot(), Instant::now()) else {
        panic!("not forwarded");
    };
    let reply = pending.run().await;
    assert!(reply.len() <= 1232);
    let m = Message::decode(&reply).unwrap();
    assert!(m.header.truncated);
    assert_eq!(m.header.id, QUERY_ID);
    assert!(m.answers.is_empty());
    assert_eq!(metrics.truncated_count(Transport::Udp), 1);
}

#[test]
fn upstreams_come_from_resolv_conf_without_our_own_address() {
    let text = "# generated\nsearch example.com\nnameserver 10.0.0.2\n  nameserver 169.254.96.16\n\
                nameserver fd00::53 # comment\nnameserver fe80::1%eth0\nnameserver bogus\n\
                nameserver 10.0.0.2\nnameserver 0.0.0.0\noptions ndots:5\n;nameserver 1.1.1.1\n";
    let got = upstreams_from_resolv_conf(text, &[ip("169.254.96.16")]);
    assert_eq!(
        got,
        vec![
            "10.0.0.2:53".parse::<SocketAddr>().unwrap(),
            "[fd00::53]:53".parse().unwrap()
        ]
    );
    assert!(upstreams_from_resolv_conf("", &[]).is_empty());
}
