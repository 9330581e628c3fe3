//! An MQTT client for tests (rumqttc): a device or mapper talking to the broker edgecore's
//! eventbus uses.

use edgecore::eventbus::BusMessage;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, Publish, QoS};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

const WAIT: Duration = Duration::from_secs(15);
/// How often a publish is repeated until the receiver shows it got it.
const RETRY: Duration = Duration::from_millis(200);

/// A device or mapper: an MQTT client of the broker.
pub struct MqttClient {
    pub client: AsyncClient,
    /// Messages on the subscribed topics.
    pub received: mpsc::Receiver<Publish>,
    subacks: mpsc::Receiver<()>,
    task: JoinHandle<()>,
}

impl MqttClient {
    /// Connects to the broker at `addr` with client ID `id` (waits for the CONNACK).
    pub async fn connect(addr: std::net::SocketAddr, id: &str) -> MqttClient {
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
        MqttClient {
            client,
            received,
            subacks,
            task,
        }
    }

    pub async fn publish(&self, topic: &str, payload: impl Into<Vec<u8>>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload)
            .await
            .unwrap();
    }

    /// Publishes every [`RETRY`] until `sink` receives a message on `topic` (the bus subscribes
    /// in the background), and returns it.
    pub async fn publish_until_received(
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

    pub async fn subscribe(&mut self, filter: &str) {
        self.client
            .subscribe(filter, QoS::AtLeastOnce)
            .await
            .unwrap();
        timeout(WAIT, self.subacks.recv())
            .await
            .expect("SUBACK from mosquitto");
    }
}

impl Drop for MqttClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MqttClient {
    /// The next message on `topic` (others are skipped) within `within`.
    pub async fn next_on(&mut self, topic: &str, within: Duration) -> Option<Publish> {
        let deadline = Instant::now() + within;
        loop {
            let p = tokio::time::timeout_at(deadline, self.received.recv())
                .await
                .ok()??;
            if p.topic == topic {
                return Some(p);
            }
        }
    }
}
