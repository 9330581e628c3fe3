//! The cloud–edge channel over real sockets and real TLS on loopback.

use cloudcore::cloudhub::Enqueued;
use cloudcore::cloudhub::{CloudHub, NodeEvent};
use e2e::channel::*;
use edgecore::edgehub::LinkEvent;
use kubeedge_shared::content::ObjectResp;
use kubeedge_shared::{Group, Message, Operation};
use serde_json::json;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_tungstenite::tungstenite::Message as WsMessage;

const WAIT: Duration = Duration::from_secs(10);

fn pod(name: &str, uid: &str, rv: u64, op: Operation) -> Message {
    Message::new(
        "edgecontroller",
        Group::Resource,
        op,
        format!("default/pod/{name}"),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default", "uid": uid, "resourceVersion": rv.to_string()}}),
    )
    .with_resource_version(rv.to_string())
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn next_event(rx: &mut broadcast::Receiver<NodeEvent>) -> NodeEvent {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("hub event in time")
        .expect("event channel open")
}

async fn next_link(rx: &mut broadcast::Receiver<LinkEvent>) -> LinkEvent {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("link event in time")
        .expect("event channel open")
}

async fn connected_raw(pki: &Pki, hub: &CloudHub, node: &str) -> RawEdge {
    let tls = pki.edge_tls(&pki.node_cert(node).unwrap()).unwrap();
    let edge = RawEdge::connect(hub.local_addr(), node, tls)
        .await
        .expect("connects");
    let hub2 = hub.clone();
    let node = node.to_string();
    wait_until("session registered", move || hub2.is_connected(&node)).await;
    edge
}

#[tokio::test]
async fn edge_and_cloud_exchange_messages_and_acks() {
    let pki = Pki::new().unwrap();
    let (hub, mut upstream, metrics) = start_hub(&pki, test_hub_config()).await.unwrap();
    let mut hub_events = hub.subscribe();
    let (edge, mut inbound) =
        start_edge(&pki, test_edge_config(hub.local_addr(), "edge-1")).unwrap();
    match next_event(&mut hub_events).await {
        NodeEvent::Connected { node, .. } => assert_eq!(node, "edge-1"),
        other => panic!("unexpected {other:?}"),
    }

    // Downstream: the node prefix is stripped on the wire, the edge ACKs, the queue empties.
    let mut acks = hub.subscribe_acks(16);
    let msg = pod("web-0", "u1", 10, Operation::Insert);
    assert_eq!(hub.send("edge-1", msg.clone()).unwrap(), Enqueued::Queued);
    let got = tokio::time::timeout(WAIT, inbound.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.header.id, msg.header.id);
    assert_eq!(got.route.resource, "default/pod/web-0");
    assert_eq!(got.header.resource_version, "10");
    assert_eq!(got.content["metadata"]["uid"], "u1");
    edge.send(Message::ack_for(&got)).await.unwrap();
    let acked = tokio::time::timeout(WAIT, acks.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(acked.node, "edge-1");
    assert_eq!(acked.message.msg_id, msg.header.id);
    assert_eq!(acked.message.uid.as_deref(), Some("u1"));
    assert_eq!(acked.message.resource_version, 10);
    let h = hub.clone();
    wait_until("ACK processed", move || h.queue_len("edge-1") == Some(0)).await;
    assert_eq!(metrics.unmatched_acks.get(), 0);

    // Upstream: the node prefix is added; a reply reaches the waiting request.
    let register = Message::new(
        "edged",
        Group::Meta,
        Operation::Insert,
        "default/node/edge-1",
        json!({"metadata": {"name": "edge-1"}}),
    );
    let edge2 = edge.clone();
    let request = tokio::spawn(async move { edge2.request(register, WAIT).await });
    let up = tokio::time::timeout(WAIT, upstream.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(up.node, "edge-1");
    // The node is the session's, never glued into the path: the resource arrives as sent,
    // parsed once.
    assert_eq!(up.message.route.resource, "default/node/edge-1");
    assert_eq!(up.path.resource_type, kubeedge_shared::ResourceType::Node);
    assert_eq!(up.path.name.as_deref(), Some("edge-1"));
    let reply = Message::new(
        "edgecontroller",
        Group::Resource,
        Operation::Response,
        "default/node/edge-1",
        ObjectResp::object(json!({"kind": "Node"})).to_value(),
    )
    .with_parent(up.message.header.id.clone());
    hub.send("edge-1", reply).unwrap();
    let answered = request
        .await
        .unwrap()
        .expect("reply delivered to the request");
    assert_eq!(answered.content["Object"]["kind"], "Node");
    assert_eq!(answered.route.resource, "default/node/edge-1");
    edge.shutdown();
    hub.shutdown();
}

#[tokio::test]
async fn certificate_from_another_ca_is_refused() {
    let pki = Pki::new().unwrap();
    let other = Pki::new().unwrap();
    let (hub, _up, metrics) = start_hub(&pki, test_hub_config()).await.unwrap();
    // The edge trusts our CA but presents a certificate signed by another one.
    let foreign = other.node_cert("edge-1").unwrap();
    let tls = kubeedge_shared::tls::client_config(
        std::slice::from_ref(&pki.ca.cert.cert_der),
        vec![foreign.cert_der.clone()],
        foreign.key_der(),
    )
    .unwrap();
    let result = match RawEdge::connect(hub.local_addr(), "edge-1", tls).await {
        Err(e) => Err(e),
        Ok(mut edge) => edge
            .recv(Duration::from_secs(2))
            .await
            .map_err(|e| e.to_string()),
    };
    assert!(
        result.is_err(),
        "connection with a foreign certificate must fail"
    );
    assert!(!hub.is_connected("edge-1"));
    let m = metrics.clone();
    wait_until("refusal counted", move || {
        m.sessions_refused
            .get_or_create(&cloudcore::metrics::ReasonLabel { reason: "tls" })
            .get()
            >= 1
    })
    .await;

    // And an edge that does not trust the cloud's CA refuses the server.
    let cert = pki.node_cert("edge-1").unwrap();
    let wrong_trust = kubeedge_shared::tls::client_config(
        std::slice::from_ref(&other.ca.cert.cert_der),
        vec![cert.cert_der.clone()],
        cert.key_der(),
    )
    .unwrap();
    let err = RawEdge::connect(hub.local_addr(), "edge-1", wrong_trust)
        .await
        .err()
        .expect("refused");
    assert!(err.contains("tls"), "{err}");
}

#[tokio::test]
async fn certificate_for_another_node_is_refused() {
    let pki = Pki::new().unwrap();
    let (hub, _up, _m) = start_hub(&pki, test_hub_config()).await.unwrap();
    let tls = pki.edge_tls(&pki.node_cert("edge-2").unwrap()).unwrap();
    let err = RawEdge::connect(hub.local_addr(), "edge-1", tls)
        .await
        .err()
        .expect("refused");
    assert!(err.contains("403"), "{err}");
    assert!(err.contains("does not belong to node"), "{err}");
    assert!(!hub.is_connected("edge-1"));
}

#[tokio::test]
async fn legacy_shared_cn_is_refused_unless_allowed() {
    let pki = Pki::new().unwrap();
    let legacy = pki.cert_with_cn("kubeedge.io").unwrap();
    let (hub, _up, _m) = start_hub(&pki, test_hub_config()).await.unwrap();
    let err = RawEdge::connect(hub.local_addr(), "edge-1", pki.edge_tls(&legacy).unwrap())
        .await
        .err()
        .expect("refused by default");
    assert!(err.contains("403"), "{err}");

    let mut cfg = test_hub_config();
    cfg.allow_legacy_cn = true;
    let (hub, _up, _m) = start_hub(&pki, cfg).await.unwrap();
    RawEdge::connect(hub.local_addr(), "edge-1", pki.edge_tls(&legacy).unwrap())
        .await
        .expect("accepted when legacy edges are allowed");
    let h = hub.clone();
    wait_until("legacy session", move || h.is_connected("edge-1")).await;
}

#[tokio::test]
async fn missing_keepalive_ends_the_session() {
    let pki = Pki::new().unwrap();
    let mut cfg = test_hub_config();
    cfg.keepalive_interval = Duration::from_millis(600);
    let (hub, _up, _m) = start_hub(&pki, cfg).await.unwrap();
    let mut events = hub.subscribe();
    let mut edge = connected_raw(&pki, &hub, "edge-1").await;
    assert!(matches!(
        next_event(&mut events).await,
        NodeEvent::Connected { .. }
    ));
    // Keepalives hold the session...
    for _ in 0..4 {
        edge.keepalive().await.unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(hub.is_connected("edge-1"), "keepalives keep the session");
    // ...and their absence ends it.
    match next_event(&mut events).await {
        NodeEvent::Disconnected { node, reason, .. } => {
            assert_eq!(node, "edge-1");
            assert!(reason.contains("keepalive"), "{reason}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(edge.closed_within(WAIT).await);
    assert!(!hub.is_connected("edge-1"));
}

#[tokio::test]
async fn newer_connection_replaces_the_older_and_inherits_unacked_messages() {
    let pki = Pki::new().unwrap();
    let (hub, _up, _m) = start_hub(&pki, test_hub_config()).await.unwrap();
    let mut first = connected_raw(&pki, &hub, "edge-1").await;
    let msg = pod("a", "ua", 1, Operation::Insert);
    hub.send("edge-1", msg.clone()).unwrap();
    let got = first
        .recv(WAIT)
        .await
        .unwrap()
        .expect("first session gets the message");
    assert_eq!(got.header.id, msg.header.id);

    // Not ACKed: the replacing session receives it again, with the same msg_id.
    let tls = pki.edge_tls(&pki.node_cert("edge-1").unwrap()).unwrap();
    let mut second = RawEdge::connect(hub.local_addr(), "edge-1", tls)
        .await
        .unwrap();
    assert!(first.closed_within(WAIT).await, "older session is closed");
    let again = second
        .recv(WAIT)
        .await
        .unwrap()
        .expect("re-sent on the new session");
    assert_eq!(again.header.id, msg.header.id);
    second.keepalive().await.unwrap();
    assert!(hub.is_connected("edge-1"));
    assert_eq!(hub.connected_count(), 1);
}

#[tokio::test]
async fn withheld_ack_gets_the_same_message_again_until_acked() {
    let pki = Pki::new().unwrap();
    let (hub, _up, metrics) = start_hub(&pki, test_hub_config()).await.unwrap();
    let mut edge = connected_raw(&pki, &hub, "edge-1").await;
    let msg = pod("a", "ua", 1, Operation::Update);
    hub.send("edge-1", msg.clone()).unwrap();
    let first = edge.recv(WAIT).await.unwrap().unwrap();
    edge.keepalive().await.unwrap();
    let second = edge
        .recv(WAIT)
        .await
        .unwrap()
        .expect("resent without an ACK");
    assert_eq!(first.header.id, second.header.id);
    assert_eq!(first, second);
    edge.ack(&second).await.unwrap();
    edge.keepalive().await.unwrap();
    // Duplicate ACKs are harmless.
    edge.ack(&second).await.unwrap();
    edge.ack(&first).await.unwrap();
    let m = metrics.clone();
    wait_until("duplicate ACKs counted", move || {
        m.unmatched_acks.get() >= 2
    })
    .await;
    assert_eq!(hub.queue_len("edge-1"), Some(0));
    assert!(
        edge.recv(Duration::from_millis(900))
            .await
            .unwrap()
            .is_none(),
        "no resend after the ACK"
    );
    // The session still works.
    let next = pod("b", "ub", 1, Operation::Insert);
    hub.send("edge-1", next.clone()).unwrap();
    assert_eq!(
        edge.recv(WAIT).await.unwrap().unwrap().header.id,
        next.header.id
    );
}

#[tokio::test]
async fn pending_updates_of_one_object_collapse_to_the_newest() {
    let pki = Pki::new().unwrap();
    let mut cfg = test_hub_config();
    cfg.queue.window = 1;
    let (hub, _up, _m) = start_hub(&pki, cfg).await.unwrap();
    let mut edge = connected_raw(&pki, &hub, "edge-1").await;
    let blocker = pod("a", "ua", 1, Operation::Insert);
    hub.send("edge-1", blocker.clone()).unwrap();
    let got = edge.recv(WAIT).await.unwrap().unwrap();
    assert_eq!(got.header.id, blocker.header.id);
    // With the window full these wait in the queue, where they collapse.
    assert_eq!(
        hub.send("edge-1", pod("b", "ub", 5, Operation::Update))
            .unwrap(),
        Enqueued::Queued
    );
    assert_eq!(
        hub.send("edge-1", pod("b", "ub", 7, Operation::Update))
            .unwrap(),
        Enqueued::Collapsed
    );
    assert_eq!(
        hub.send("edge-1", pod("b", "ub", 6, Operation::Update))
            .unwrap(),
        Enqueued::Stale
    );
    edge.ack(&got).await.unwrap();
    let b = edge.recv(WAIT).await.unwrap().unwrap();
    assert_eq!(b.route.resource, "default/pod/b");
    assert_eq!(b.header.resource_version, "7");
    edge.ack(&b).await.unwrap();
    edge.keepalive().await.unwrap();
    assert!(
        edge.recv(Duration::from_millis(500))
            .await
            .unwrap()
            .is_none(),
        "older versions never sent"
    );
}

#[tokio::test]
async fn edge_reconnects_after_cloudhub_restarts() {
    let pki = Pki::new().unwrap();
    let (hub, _up, _m) = start_hub(&pki, test_hub_config()).await.unwrap();
    let addr = hub.local_addr();
    let (edge, mut inbound) = start_edge(&pki, test_edge_config(addr, "edge-1")).unwrap();
    let mut link = edge.subscribe();
    let h = hub.clone();
    wait_until("first connection", move || h.is_connected("edge-1")).await;
    hub.shutdown();
    loop {
        if let LinkEvent::Disconnected { .. } = next_link(&mut link).await {
            break;
        }
    }
    assert!(!edge.is_connected());
    let mut cfg = test_hub_config();
    cfg.listen = addr;
    let (hub2, _up2, _m2) = start_hub(&pki, cfg).await.expect("rebind the same port");
    assert_eq!(next_link(&mut link).await, LinkEvent::Connected);
    let h = hub2.clone();
    wait_until("reconnected", move || h.is_connected("edge-1")).await;
    let msg = pod("a", "ua", 3, Operation::Insert);
    hub2.send("edge-1", msg.clone()).unwrap();
    let got = tokio::time::timeout(WAIT, inbound.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.header.id, msg.header.id);
    edge.shutdown();
}

#[tokio::test]
async fn half_open_link_is_detected_by_both_sides() {
    let pki = Pki::new().unwrap();
    let mut cfg = test_hub_config();
    cfg.keepalive_interval = Duration::from_millis(1500);
    let (hub, _up, _m) = start_hub(&pki, cfg).await.unwrap();
    let mut hub_events = hub.subscribe();
    let proxy = FaultProxy::start(hub.local_addr()).await.unwrap();
    let mut edge_cfg = test_edge_config(proxy.addr, "edge-1");
    edge_cfg.server = format!("127.0.0.1:{}", proxy.addr.port());
    let (edge, _inbound) = start_edge(&pki, edge_cfg).unwrap();
    let mut link = edge.subscribe();
    assert_eq!(next_link(&mut link).await, LinkEvent::Connected);
    assert!(matches!(
        next_event(&mut hub_events).await,
        NodeEvent::Connected { .. }
    ));
    // Several heartbeats pass: the link is healthy.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(edge.is_connected() && hub.is_connected("edge-1"));

    proxy.freeze();
    let started = tokio::time::Instant::now();
    match next_link(&mut link).await {
        LinkEvent::Disconnected { reason } => {
            assert!(
                reason.contains("presumed dead") || reason.contains("timed out"),
                "{reason}"
            )
        }
        other => panic!("unexpected {other:?}"),
    }
    match next_event(&mut hub_events).await {
        NodeEvent::Disconnected { reason, .. } => assert!(reason.contains("keepalive"), "{reason}"),
        other => panic!("unexpected {other:?}"),
    }
    // Both configured well under the 45 s target (1.5 s here); allow scheduling slack.
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    edge.shutdown();
}

#[tokio::test]
async fn oversized_and_malformed_frames_affect_only_their_own_connection() {
    let pki = Pki::new().unwrap();
    let mut cfg = test_hub_config();
    cfg.max_frame_bytes = 64 * 1024;
    let (hub, mut upstream, metrics) = start_hub(&pki, cfg).await.unwrap();
    let mut good = connected_raw(&pki, &hub, "good").await;
    let mut bad = connected_raw(&pki, &hub, "bad").await;

    // Malformed frames are dropped and counted; the session stays up.
    for junk in ["{", "[]", "{}", "\"OK\"", "{\"header\":5}"] {
        bad.send_frame(WsMessage::Text(junk.into())).await.unwrap();
    }
    bad.send_frame(WsMessage::Binary(vec![0xff, 0xfe, 0x00].into()))
        .await
        .unwrap();
    let m = metrics.clone();
    wait_until("malformed frames counted", move || {
        m.malformed_frames.get() >= 6
    })
    .await;
    assert!(hub.is_connected("bad"));
    // Unknown operations pass upstream for the controllers to reject, with the node prefix.
    let odd = Message::new(
        "edged",
        Group::Meta,
        Operation::from("frobnicate"),
        "default/pod/x",
        json!(null),
    );
    bad.send(&odd).await.unwrap();
    let up = tokio::time::timeout(WAIT, upstream.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        up.message.route.operation,
        Operation::Other("frobnicate".into())
    );
    // A source claiming to be a cloud module is dropped (anti-loop).
    let spoof = Message::new(
        "edgecontroller",
        Group::Resource,
        Operation::Insert,
        "default/pod/x",
        json!(null),
    );
    bad.send(&spoof).await.unwrap();

    // An oversized frame ends that session only.
    let huge = "x".repeat(100 * 1024);
    let _ = bad.send_frame(WsMessage::Text(huge.into())).await;
    assert!(
        bad.closed_within(WAIT).await,
        "oversized frame closes the offending connection"
    );
    let h = hub.clone();
    wait_until("bad session gone", move || !h.is_connected("bad")).await;

    good.keepalive().await.unwrap();
    let msg = pod("a", "ua", 1, Operation::Insert);
    hub.send("good", msg.clone()).unwrap();
    assert_eq!(
        good.recv(WAIT).await.unwrap().unwrap().header.id,
        msg.header.id
    );
    assert!(hub.is_connected("good"));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), upstream.recv())
            .await
            .is_err(),
        "spoofed message was not forwarded"
    );
}

#[tokio::test]
async fn connections_beyond_the_node_limit_are_refused() {
    let pki = Pki::new().unwrap();
    let mut cfg = test_hub_config();
    cfg.node_limit = 1;
    let (hub, _up, _m) = start_hub(&pki, cfg).await.unwrap();
    let _first = connected_raw(&pki, &hub, "edge-1").await;
    let tls = pki.edge_tls(&pki.node_cert("edge-2").unwrap()).unwrap();
    let err = RawEdge::connect(hub.local_addr(), "edge-2", tls)
        .await
        .err()
        .expect("refused");
    assert!(err.contains("503"), "{err}");
    // The same node may still replace its own session at the limit.
    let tls = pki.edge_tls(&pki.node_cert("edge-1").unwrap()).unwrap();
    RawEdge::connect(hub.local_addr(), "edge-1", tls)
        .await
        .expect("replacement allowed");
}

#[tokio::test]
async fn silent_and_stalled_connections_do_not_keep_edges_out() {
    let pki = Pki::new().unwrap();
    let mut cfg = test_hub_config();
    // One handshake at a time; an admitted one must finish within 3 s.
    cfg.max_handshakes = 1;
    cfg.admitted_handshake_timeout = Duration::from_secs(3);
    // Long enough that the silent connections are still there at the end.
    cfg.handshake_timeout = Duration::from_secs(30);
    let (hub, _up, metrics) = start_hub(&pki, cfg).await.unwrap();
    let addr = hub.local_addr();
    // Two connections that never speak, and one that starts a ClientHello and stalls.
    let _silent = [
        tokio::net::TcpStream::connect(addr).await.unwrap(),
        tokio::net::TcpStream::connect(addr).await.unwrap(),
    ];
    let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stalled, &[0x16, 0x03, 0x01])
        .await
        .unwrap();
    let m = metrics.clone();
    wait_until("the stalled handshake holds the slot", move || {
        m.handshakes_in_progress.get() == 1
    })
    .await;
    // The edge waits for the stalled one's deadline, not for the silent ones.
    let _edge = connected_raw(&pki, &hub, "edge-1").await;
    let refused = metrics
        .sessions_refused
        .get_or_create(&cloudcore::metrics::ReasonLabel {
            reason: "admitted_handshake_timeout",
        })
        .get();
    assert_eq!(refused, 1, "the stalled handshake was not ended");
    assert_eq!(metrics.handshakes_in_progress.get(), 0);
    assert_eq!(
        metrics.handshakes_waiting.get(),
        2,
        "the silent connections should still wait for their first bytes"
    );
}

#[tokio::test]
async fn edges_dialling_at_once_beyond_the_handshake_slots_all_get_in() {
    let pki = Pki::new().unwrap();
    let mut cfg = test_hub_config();
    // Two at a time (a quarter of the slots per address, and every edge dials from loopback),
    // and time enough for the first of 24 to dial, served last, on a loaded machine.
    cfg.max_handshakes = 8;
    cfg.handshake_timeout = Duration::from_secs(60);
    let (hub, _up, _m) = start_hub(&pki, cfg).await.unwrap();
    let dials: Vec<_> = (0..24)
        .map(|i| {
            let node = format!("edge-{i}");
            let tls = pki.edge_tls(&pki.node_cert(&node).unwrap()).unwrap();
            let addr = hub.local_addr();
            tokio::spawn(async move { RawEdge::connect(addr, &node, tls).await })
        })
        .collect();
    let mut edges = Vec::new();
    for d in dials {
        edges.push(d.await.unwrap().expect("every edge connects"));
    }
    let hub2 = hub.clone();
    wait_until("24 sessions", move || hub2.connected_nodes().len() == 24).await;
}

#[tokio::test]
async fn sending_to_an_unknown_node_is_an_error() {
    let pki = Pki::new().unwrap();
    let (hub, _up, _m) = start_hub(&pki, test_hub_config()).await.unwrap();
    let err = hub
        .send("nobody", pod("a", "u", 1, Operation::Insert))
        .unwrap_err();
    assert!(err.to_string().contains("not connected"));
}

#[tokio::test]
async fn edge_requests_fail_fast_when_offline() {
    let pki = Pki::new().unwrap();
    // Nothing listens on this port.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (edge, _in) = start_edge(&pki, test_edge_config(addr, "edge-1")).unwrap();
    let q = Message::new(
        "edged",
        Group::Meta,
        Operation::Query,
        "default/configmap/c",
        json!(null),
    );
    let err = edge.request(q, Duration::from_secs(1)).await.unwrap_err();
    assert!(err.to_string().contains("not connected"), "{err}");
    edge.shutdown();
}
