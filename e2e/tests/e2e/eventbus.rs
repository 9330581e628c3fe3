//! edgecore's eventbus against a real mosquitto (mqttMode 2): device publishes reach
//! devicetwin or the cloud sink, bus publishes reach devices, and a cloud subscription survives
//! a broker restart and a bus restart. Skipped where mosquitto is not installed.

use e2e::mosquitto::Mosquitto;
use e2e::mqtt::MqttClient as Device;
use edgecore::eventbus::DropReason;
use edgecore::eventbus::{BusMessage, BusSinks, EventBus, EventBusConfig};
use edgecore::metamanager::MetaStore;
use rumqttc::QoS;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(15);

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
    let device = Device::connect(broker.addr(), "mapper-twin").await;
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
    let device = Device::connect(broker.addr(), "mapper-upload").await;
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
    let mut device = Device::connect(broker.addr(), "mapper-result").await;
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
    let device = Device::connect(broker.addr(), "mapper-rule").await;
    device
        .publish_until_received("rule/room-1/temp", "20", &mut sinks.cloud)
        .await;

    // The broker restarts: the bus reconnects and subscribes again.
    broker.restart().unwrap();
    let device = Device::connect(broker.addr(), "mapper-rule-2").await;
    let m = device
        .publish_until_received("rule/room-1/temp", "21", &mut sinks.cloud)
        .await;
    assert_eq!(&m.payload[..], b"21");
    assert!(
        bus.metrics()
            .connection_losses
            .get_or_create(&edgecore::eventbus::BrokerLabel { broker: "external" })
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
    let device = Device::connect(broker.addr(), "mapper-big").await;
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
