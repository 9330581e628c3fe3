//! edgecore's eventbus against a real mosquitto (mqttMode 2): device publishes reach
//! devicetwin or the cloud sink, bus publishes reach devices, and a cloud subscription survives
//! a broker restart and a bus restart. Skipped where mosquitto is not installed.

use e2e::mosquitto::Mosquitto;
use edgecore::eventbus::metrics::DropReason;
use edgecore::eventbus::{BusMessage, BusSinks, EventBus, EventBusConfig};
use edgecore::metamanager::MetaStore;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, Publish, QoS};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

const WAIT: Duration = Duration::from_secs(15);
/// How often a device repeats a publish until the bus shows it got it.
const RETRY: Duration = Duration::from_millis(200);

struct Sinks {
    twin: mpsc::Receiver<BusMessage>,
    cloud: mpsc::Receiver<BusMessage>,
}

fn new_sinks() -> (BusSinks, Sinks) {
    let (twin, twin_rx) = mpsc::channel(64);
    let (cloud, cloud_rx) = mpsc::channel(64);
    (
        BusSinks { twin, cloud },
        Sinks {
            twin: twin_rx,
            cloud: cloud_rx,
        },
    )
}

fn config(broker: &Mosquitto) -> EventBusConfig {
    EventBusConfig {
        mqtt_mode: 2,
        server_external: broker.url(),
        reconnect_interval: Duration::from_millis(200),
        ..EventBusConfig::default()
    }
}

/// A device or mapper: an MQTT client of the same broker.
struct Device {
    client: AsyncClient,
    received: mpsc::Receiver<Publish>,
    subacks: mpsc::Receiver<()>,
    task: JoinHandle<()>,
}

impl Device {
    async fn connect(broker: &Mosquitto, id: &str) -> Device {
        let addr = broker.addr();
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
        timeout(WAIT, connected.recv())
            .await
            .expect("the device connects to mosquitto");
        Device {
            client,
            received,
            subacks,
            task,
        }
    }

    async fn publish(&self, topic: &str, payload: impl Into<Vec<u8>>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload)
            .await
            .unwrap();
    }

    /// Publishes every [`RETRY`] until `sink` receives a message on `topic` (the bus subscribes
    /// in the background), and returns it.
    async fn publish_until_received(
        &self,
        topic: &str,
        payload: &str,
        sink: &mut mpsc::Receiver<BusMessage>,
    ) -> BusMessage {
        let deadline = Instant::now() + WAIT;
        loop {
            assert!(
                Instant::now() < deadline,
                "nothing on {topic} reached the bus within {WAIT:?}"
            );
            self.publish(topic, payload).await;
            if let Ok(Some(m)) = timeout(RETRY, sink.recv()).await {
                assert_eq!(m.topic, topic);
                // Drop the copies of earlier tries that may still be on their way.
                tokio::time::sleep(RETRY).await;
                while sink.try_recv().is_ok() {}
                return m;
            }
        }
    }

    async fn subscribe(&mut self, filter: &str) {
        self.client
            .subscribe(filter, QoS::AtLeastOnce)
            .await
            .unwrap();
        timeout(WAIT, self.subacks.recv())
            .await
            .expect("SUBACK from mosquitto");
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn eventbus_device_twin_publish_reaches_devicetwin() {
    let Some(broker) = Mosquitto::start_or_skip("eventbus_device_twin_publish_reaches_devicetwin")
    else {
        return;
    };
    let (bus_sinks, mut sinks) = new_sinks();
    let bus = EventBus::start(config(&broker), None, bus_sinks)
        .await
        .unwrap();
    let device = Device::connect(&broker, "mapper-twin").await;
    let m = device
        .publish_until_received(
            "$hw/events/device/dev-1/twin/update",
            r#"{"event_id":"1","twin":{}}"#,
            &mut sinks.twin,
        )
        .await;
    assert_eq!(&m.payload[..], br#"{"event_id":"1","twin":{}}"#);
    // The v1.17+ form (namespace/name) is subscribed too.
    device
        .publish_until_received(
            "$hw/events/device/default/dev-1/twin/update",
            "{}",
            &mut sinks.twin,
        )
        .await;
    assert!(
        sinks.cloud.try_recv().is_err(),
        "device topics go to devicetwin only"
    );
    bus.shutdown().await;
}

#[tokio::test]
async fn eventbus_upload_topic_reaches_the_cloud_sink() {
    let Some(broker) = Mosquitto::start_or_skip("eventbus_upload_topic_reaches_the_cloud_sink")
    else {
        return;
    };
    let (bus_sinks, mut sinks) = new_sinks();
    let bus = EventBus::start(config(&broker), None, bus_sinks)
        .await
        .unwrap();
    let device = Device::connect(&broker, "mapper-upload").await;
    let m = device
        .publish_until_received("$hw/events/upload/temperature", "21.5", &mut sinks.cloud)
        .await;
    assert_eq!(&m.payload[..], b"21.5");
    device
        .publish_until_received("app/user/report", "r", &mut sinks.cloud)
        .await;
    assert!(sinks.twin.try_recv().is_err());
    bus.shutdown().await;
}

#[tokio::test]
async fn eventbus_publish_reaches_an_external_subscriber() {
    let Some(broker) = Mosquitto::start_or_skip("eventbus_publish_reaches_an_external_subscriber")
    else {
        return;
    };
    let (bus_sinks, _sinks) = new_sinks();
    let bus = EventBus::start(config(&broker), None, bus_sinks)
        .await
        .unwrap();
    let mut device = Device::connect(&broker, "mapper-result").await;
    device
        .subscribe("$hw/events/device/+/twin/update/result")
        .await;
    let topic = "$hw/events/device/dev-1/twin/update/result";
    // The bus's publisher connects in the background; until then publishes wait in its queue.
    bus.publish(topic, &br#"{"ok":true}"#[..]).unwrap();
    let p = timeout(WAIT, device.received.recv())
        .await
        .expect("the bus's publish reaches the device")
        .unwrap();
    assert_eq!(p.topic, topic);
    assert_eq!(&p.payload[..], br#"{"ok":true}"#);
    assert_eq!(p.qos, QoS::AtLeastOnce);
    assert!(!p.retain);
    bus.shutdown().await;
}

#[tokio::test]
async fn eventbus_cloud_subscription_survives_broker_and_bus_restarts() {
    let Some(mut broker) =
        Mosquitto::start_or_skip("eventbus_cloud_subscription_survives_broker_and_bus_restarts")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("edgecore.db");
    let store = MetaStore::open(&db).await.unwrap();
    let (bus_sinks, mut sinks) = new_sinks();
    let bus = EventBus::start(config(&broker), Some(store.clone()), bus_sinks)
        .await
        .unwrap();
    bus.subscribe("rule/+/temp").await.unwrap();
    let device = Device::connect(&broker, "mapper-rule").await;
    device
        .publish_until_received("rule/room-1/temp", "20", &mut sinks.cloud)
        .await;

    // The broker restarts: the bus reconnects and subscribes again.
    broker.restart().unwrap();
    let device = Device::connect(&broker, "mapper-rule-2").await;
    let m = device
        .publish_until_received("rule/room-1/temp", "21", &mut sinks.cloud)
        .await;
    assert_eq!(&m.payload[..], b"21");
    assert!(
        bus.metrics()
            .connection_losses
            .get_or_create(&edgecore::eventbus::metrics::BrokerLabel { broker: "external" })
            .get()
            >= 1
    );

    // The bus restarts: the subscription comes back from sub_topics.
    bus.shutdown().await;
    let (bus_sinks, mut sinks) = new_sinks();
    let bus = EventBus::start(config(&broker), Some(store.clone()), bus_sinks)
        .await
        .unwrap();
    assert!(bus.subscriptions().contains(&"rule/+/temp".to_string()));
    let m = device
        .publish_until_received("rule/room-2/temp", "22", &mut sinks.cloud)
        .await;
    assert_eq!(m.topic, "rule/room-2/temp");

    // Unsubscribed: the row is gone and the topic no longer arrives.
    bus.unsubscribe("rule/+/temp").await.unwrap();
    let rows: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT count(*) FROM sub_topics", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    device.publish("rule/room-3/temp", "23").await;
    device.publish("$hw/events/upload/marker", "m").await;
    // mosquitto keeps one publisher's order: had room-3 been delivered, it would come first.
    let m = timeout(WAIT, sinks.cloud.recv())
        .await
        .expect("the marker arrives")
        .unwrap();
    assert_eq!(m.topic, "$hw/events/upload/marker");
    bus.shutdown().await;
    store.close().await;
}

#[tokio::test]
async fn eventbus_oversized_payload_is_counted_not_fatal() {
    let Some(broker) = Mosquitto::start_or_skip("eventbus_oversized_payload_is_counted_not_fatal")
    else {
        return;
    };
    let (bus_sinks, mut sinks) = new_sinks();
    let bus = EventBus::start(config(&broker), None, bus_sinks)
        .await
        .unwrap();
    let device = Device::connect(&broker, "mapper-big").await;
    let topic = "$hw/events/device/dev-1/twin/update";
    device
        .publish_until_received(topic, "warm-up", &mut sinks.twin)
        .await;
    device.publish(topic, vec![b'x'; 2 * 1024 * 1024]).await;
    device.publish(topic, "after").await;
    let m = timeout(WAIT, sinks.twin.recv())
        .await
        .expect("the message after the oversized one arrives")
        .unwrap();
    assert_eq!(&m.payload[..], b"after");
    assert_eq!(bus.metrics().dropped_count(DropReason::Oversized), 1);
    bus.shutdown().await;
}
