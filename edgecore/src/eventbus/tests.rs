//! The bus against its internal broker, with rumqttc clients playing devices and mappers, and
//! the start-up and publish refusals. (The external-broker tests run against a real mosquitto
//! in `e2e/tests/e2e/eventbus.rs`.)

use super::*;
use rumqttc::{Event, MqttOptions, Packet, Publish};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

const DEADLINE: Duration = Duration::from_secs(10);

struct Sinks {
    twin: mpsc::Receiver<BusMessage>,
    cloud: mpsc::Receiver<BusMessage>,
}

fn sinks(bound: usize) -> (BusSinks, Sinks) {
    let (twin, twin_rx) = mpsc::channel(bound);
    let (cloud, cloud_rx) = mpsc::channel(bound);
    (
        BusSinks { twin, cloud },
        Sinks {
            twin: twin_rx,
            cloud: cloud_rx,
        },
    )
}

fn internal_config() -> EventBusConfig {
    EventBusConfig {
        mqtt_mode: 0,
        server_internal: "tcp://127.0.0.1:0".into(),
        ..EventBusConfig::default()
    }
}

async fn internal_bus(bound: usize) -> (EventBus, Sinks, SocketAddr) {
    let (bus_sinks, rx) = sinks(bound);
    let bus = EventBus::start(internal_config(), None, bus_sinks)
        .await
        .unwrap();
    let addr = bus.internal_broker_addr().unwrap();
    (bus, rx, addr)
}

/// A device-side MQTT client: its publishes received, and a signal per SUBACK.
struct Device {
    client: AsyncClient,
    received: mpsc::Receiver<Publish>,
    subacks: mpsc::Receiver<()>,
    task: JoinHandle<()>,
}

impl Device {
    async fn connect(addr: SocketAddr, id: &str) -> Device {
        let mut o = MqttOptions::new(id, addr.ip().to_string(), addr.port());
        o.set_max_packet_size(16 << 20, 16 << 20);
        let (client, mut events) = AsyncClient::new(o, 64);
        let (pub_tx, received) = mpsc::channel(64);
        let (ack_tx, subacks) = mpsc::channel(64);
        let (conn_tx, mut connected) = mpsc::channel(1);
        let task = tokio::spawn(async move {
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let _ = conn_tx.try_send(());
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = pub_tx.send(p).await;
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = ack_tx.send(()).await;
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        timeout(DEADLINE, connected.recv())
            .await
            .expect("device connects");
        Device {
            client,
            received,
            subacks,
            task,
        }
    }

    async fn subscribe(&mut self, filter: &str) {
        self.client
            .subscribe(filter, QoS::AtLeastOnce)
            .await
            .unwrap();
        timeout(DEADLINE, self.subacks.recv())
            .await
            .expect("SUBACK in time");
    }

    async fn publish(&self, topic: &str, payload: impl Into<Vec<u8>>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload)
            .await
            .unwrap();
    }

    async fn next(&mut self) -> Publish {
        timeout(DEADLINE, self.received.recv())
            .await
            .expect("a message in time")
            .unwrap()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn next(rx: &mut mpsc::Receiver<BusMessage>) -> BusMessage {
    timeout(DEADLINE, rx.recv())
        .await
        .expect("a bus message in time")
        .unwrap()
}

#[tokio::test]
async fn internal_broker_routes_device_publishes_to_twin_and_cloud() {
    let (bus, mut sinks, addr) = internal_bus(16).await;
    let device = Device::connect(addr, "mapper-1").await;
    device.publish("not/subscribed", "ignored").await;
    device
        .publish("$hw/events/device/dev-1/twin/update", r#"{"twin":{}}"#)
        .await;
    device
        .publish("$hw/events/device/default/dev-1/state/update", "{}")
        .await;
    device.publish("$hw/events/upload/x", "up").await;

    let m = next(&mut sinks.twin).await;
    assert_eq!(m.topic, "$hw/events/device/dev-1/twin/update");
    assert_eq!(&m.payload[..], br#"{"twin":{}}"#);
    let m = next(&mut sinks.twin).await;
    assert_eq!(m.topic, "$hw/events/device/default/dev-1/state/update");
    let m = next(&mut sinks.cloud).await;
    assert_eq!(m.topic, "$hw/events/upload/x");
    assert!(sinks.cloud.try_recv().is_err(), "unsubscribed topics stay");
    bus.shutdown().await;
}

#[tokio::test]
async fn internal_broker_delivers_bus_publishes_to_devices() {
    let (bus, _sinks, addr) = internal_bus(16).await;
    let mut device = Device::connect(addr, "mapper-2").await;
    device
        .subscribe("$hw/events/device/+/twin/update/result")
        .await;
    bus.publish(
        "$hw/events/device/dev-1/twin/update/result",
        &b"{\"ok\":1}"[..],
    )
    .unwrap();
    let p = device.next().await;
    assert_eq!(p.topic, "$hw/events/device/dev-1/twin/update/result");
    assert_eq!(&p.payload[..], b"{\"ok\":1}");
    assert_eq!(
        bus.metrics()
            .published
            .get_or_create(&metrics::BrokerLabel { broker: "internal" })
            .get(),
        1
    );
    bus.shutdown().await;
}

#[tokio::test]
async fn a_cloud_subscription_reaches_the_cloud_sink_until_unsubscribed() {
    let (bus, mut sinks, addr) = internal_bus(16).await;
    let device = Device::connect(addr, "mapper-3").await;
    bus.subscribe("rule/+/temp").await.unwrap();
    assert!(bus.subscriptions().contains(&"rule/+/temp".to_string()));
    device.publish("rule/room-1/temp", "21").await;
    let m = next(&mut sinks.cloud).await;
    assert_eq!(
        (m.topic.as_str(), &m.payload[..]),
        ("rule/room-1/temp", &b"21"[..])
    );

    bus.unsubscribe("rule/+/temp").await.unwrap();
    device.publish("rule/room-1/temp", "22").await;
    device.publish("$hw/events/upload/marker", "m").await;
    assert_eq!(
        next(&mut sinks.cloud).await.topic,
        "$hw/events/upload/marker"
    );
    assert!(matches!(
        bus.subscribe("a/#/b").await,
        Err(EventBusError::InvalidFilter(_))
    ));
    bus.shutdown().await;
}

#[tokio::test]
async fn oversized_payloads_are_counted_and_the_bus_goes_on() {
    let (bus, mut sinks, addr) = internal_bus(16).await;
    let device = Device::connect(addr, "mapper-4").await;
    let big = vec![b'x'; DEFAULT_MAX_PAYLOAD_FOR_TESTS + 1];
    device
        .publish("$hw/events/device/dev-1/twin/update", big)
        .await;
    device
        .publish("$hw/events/device/dev-1/twin/update", "small")
        .await;
    let m = next(&mut sinks.twin).await;
    assert_eq!(&m.payload[..], b"small");
    assert_eq!(
        bus.metrics().dropped_count(metrics::DropReason::Oversized),
        1
    );
    assert!(matches!(
        bus.publish("t", vec![0u8; DEFAULT_MAX_PAYLOAD_FOR_TESTS + 1]),
        Err(PublishError::TooLarge { .. })
    ));
    assert!(matches!(
        bus.publish("t/+", "x"),
        Err(PublishError::InvalidTopic(_))
    ));
    assert_eq!(bus.metrics().rejected_count(Rejected::TooLarge), 1);
    assert_eq!(bus.metrics().rejected_count(Rejected::InvalidTopic), 1);
    bus.shutdown().await;
}

const DEFAULT_MAX_PAYLOAD_FOR_TESTS: usize = config::DEFAULT_MAX_PAYLOAD;

/// A PUBLISH whose topic is not UTF-8, as raw bytes after a CONNECT.
fn connect_then_bad_publish() -> Vec<u8> {
    let mut out = vec![
        0x10, 17, // CONNECT, remaining length
        0x00, 0x04, b'M', b'Q', b'T', b'T', 0x04, 0x02, 0x00, 0x3c, // MQTT 3.1.1, clean, 60 s
        0x00, 0x05, b'r', b'a', b'w', b'-', b'1', // client ID
    ];
    out.extend_from_slice(&[0x30, 6, 0x00, 0x02, 0xff, 0xfe, b'h', b'i']);
    out
}

#[tokio::test]
async fn a_non_utf8_topic_is_counted_and_only_that_client_is_dropped() {
    let (bus, mut sinks, addr) = internal_bus(16).await;
    let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
    raw.write_all(&connect_then_bad_publish()).await.unwrap();
    // CONNACK, then the broker closes the connection.
    let mut seen = Vec::new();
    timeout(DEADLINE, raw.read_to_end(&mut seen))
        .await
        .expect("the broker closes the connection")
        .unwrap();
    assert_eq!(&seen[..2], &[0x20, 0x02]);
    assert_eq!(
        bus.metrics()
            .malformed_count(metrics::Malformed::TopicNotUtf8),
        1
    );
    let device = Device::connect(addr, "mapper-5").await;
    device.publish("$hw/events/upload/after", "ok").await;
    assert_eq!(
        next(&mut sinks.cloud).await.topic,
        "$hw/events/upload/after"
    );
    bus.shutdown().await;
}

#[tokio::test]
async fn a_full_sink_drops_and_counts_while_the_broker_keeps_serving() {
    let (bus, mut sinks, addr) = internal_bus(1).await;
    let device = Device::connect(addr, "mapper-6").await;
    for i in 0..5 {
        device.publish("$hw/events/upload/n", format!("{i}")).await;
    }
    // Nobody reads the cloud sink: one message fits, the others are dropped and counted.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while bus
        .metrics()
        .dropped_count(metrics::DropReason::CloudSinkFull)
        < 4
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "drops counted in time"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(&next(&mut sinks.cloud).await.payload[..], b"0");
    device.publish("$hw/events/upload/n", "after").await;
    assert_eq!(&next(&mut sinks.cloud).await.payload[..], b"after");
    bus.shutdown().await;
}

#[tokio::test]
async fn shutdown_frees_the_internal_broker_port() {
    let (bus, _sinks, addr) = internal_bus(4).await;
    bus.shutdown().await;
    let again = EventBusConfig {
        mqtt_mode: 0,
        server_internal: format!("tcp://{addr}"),
        ..EventBusConfig::default()
    };
    let (s, _rx) = sinks(4);
    let bus = EventBus::start(again, None, s).await.unwrap();
    assert_eq!(bus.internal_broker_addr(), Some(addr));
    bus.shutdown().await;
}

#[tokio::test]
async fn start_refuses_tls_bad_urls_and_a_busy_port() {
    let (s, _rx) = sinks(1);
    let tls = EventBusConfig {
        tls_enable: true,
        ..EventBusConfig::default()
    };
    let e = EventBus::start(tls, None, s).await.err().unwrap();
    assert!(matches!(e, EventBusError::TlsUnsupported));
    assert!(e.to_string().contains("not supported yet"));

    let (s, _rx) = sinks(1);
    let bad = EventBusConfig {
        server_external: "127.0.0.1:1883".into(),
        ..EventBusConfig::default()
    };
    let e = EventBus::start(bad, None, s).await.err().unwrap();
    assert!(matches!(e, EventBusError::Config(_)), "{e}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (s, _rx) = sinks(1);
    let busy = EventBusConfig {
        mqtt_mode: 0,
        server_internal: format!("tcp://{}", taken.local_addr().unwrap()),
        ..EventBusConfig::default()
    };
    let e = EventBus::start(busy, None, s).await.err().unwrap();
    assert!(matches!(e, EventBusError::Listen { .. }), "{e}");
}

/// A loopback port nothing listens on: an external broker that is not there.
fn closed_port() -> u16 {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    closed.local_addr().unwrap().port()
}

#[tokio::test]
async fn publishing_with_a_full_queue_is_an_error_not_a_wait() {
    // An external broker that is not there: publishes queue up to the bound, then are refused.
    let port = closed_port();
    let (s, _rx) = sinks(1);
    let config = EventBusConfig {
        server_external: format!("tcp://127.0.0.1:{port}"),
        publish_queue: 2,
        reconnect_interval: Duration::from_millis(50),
        ..EventBusConfig::default()
    };
    let bus = EventBus::start(config, None, s).await.unwrap();
    let results: Vec<_> = (0..4).map(|_| bus.publish("a/b", "x")).collect();
    assert!(results.contains(&Err(PublishError::Full)), "{results:?}");
    assert!(bus.metrics().rejected_count(Rejected::QueueFull) >= 1);
    let handle = bus.clone();
    bus.shutdown().await;
    assert_eq!(handle.publish("a/b", "x"), Err(PublishError::Closed));
    assert!(matches!(
        handle.subscribe("a/b").await,
        Err(EventBusError::Closed)
    ));
}

#[tokio::test]
async fn a_broker_that_is_down_holds_at_most_the_offline_budget() {
    // Nothing listens: every publish waits in the client's queue. 1,024 publishes of 1 KB would
    // queue 1 MB; the budget lets 10 KB wait and refuses the rest.
    let port = closed_port();
    let (s, _rx) = sinks(1);
    let config = EventBusConfig {
        server_external: format!("tcp://127.0.0.1:{port}"),
        offline_queue_bytes: 10 * 1000,
        reconnect_interval: Duration::from_millis(50),
        ..EventBusConfig::default()
    };
    let bus = EventBus::start(config, None, s).await.unwrap();
    let payload = vec![b'x'; 1000];
    let results: Vec<_> = (0..20)
        .map(|_| bus.publish("a/b", payload.clone()))
        .collect();
    let queued = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(queued, 10, "{results:?}");
    assert_eq!(results[10], Err(PublishError::Full));
    assert_eq!(bus.metrics().rejected_count(Rejected::QueueFull), 10);
    bus.shutdown().await;
}

#[tokio::test]
async fn mode_1_listens_on_both_brokers_and_publishes_to_both() {
    // Bus A's internal broker plays the external broker of bus B (mode 1).
    let (a, _a_sinks, outer) = internal_bus(16).await;
    let (s, mut b_sinks) = sinks(16);
    let both = EventBusConfig {
        mqtt_mode: 1,
        server_external: format!("tcp://{outer}"),
        server_internal: "tcp://127.0.0.1:0".into(),
        reconnect_interval: Duration::from_millis(100),
        ..EventBusConfig::default()
    };
    let b = EventBus::start(both, None, s).await.unwrap();
    let inner = b.internal_broker_addr().unwrap();
    let mut on_inner = Device::connect(inner, "mapper-inner").await;
    let mut on_outer = Device::connect(outer, "mapper-outer").await;

    on_inner
        .publish("$hw/events/device/dev-1/twin/get", "{}")
        .await;
    assert_eq!(
        next(&mut b_sinks.twin).await.topic,
        "$hw/events/device/dev-1/twin/get"
    );
    // B's subscriber connects to the outer broker in the background: repeat until it hears.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let m = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "B hears the outer broker"
        );
        on_outer.publish("$hw/events/upload/outer", "o").await;
        if let Ok(Some(m)) = timeout(Duration::from_millis(200), b_sinks.cloud.recv()).await {
            break m;
        }
    };
    assert_eq!(m.topic, "$hw/events/upload/outer");

    on_inner
        .subscribe("$hw/events/node/+/membership/updated")
        .await;
    on_outer
        .subscribe("$hw/events/node/+/membership/updated")
        .await;
    b.publish("$hw/events/node/edge-1/membership/updated", "{}")
        .unwrap();
    assert_eq!(
        on_inner.next().await.qos,
        QoS::AtMostOnce,
        "mqttQOS 0 inside"
    );
    assert_eq!(on_outer.next().await.qos, QoS::AtLeastOnce, "QoS 1 outside");
    b.shutdown().await;
    a.shutdown().await;
}
