use super::*;
use crate::edgehub::HubError;
use kubeedge_shared::operation::source;
use kubeedge_shared::{Group, Operation};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Clone)]
struct FakeLink {
    connected: Arc<AtomicBool>,
    sent: Arc<Mutex<Vec<Message>>>,
    events: broadcast::Sender<LinkEvent>,
}

impl FakeLink {
    fn new(connected: bool) -> Self {
        FakeLink {
            connected: Arc::new(AtomicBool::new(connected)),
            sent: Default::default(),
            events: broadcast::channel(16).0,
        }
    }
    fn set(&self, up: bool) {
        self.connected.store(up, Ordering::SeqCst);
        let _ = self.events.send(if up {
            LinkEvent::Connected
        } else {
            LinkEvent::Disconnected {
                reason: "test".into(),
            }
        });
    }
    fn take(&self) -> Vec<Message> {
        self.sent.lock().unwrap().drain(..).collect()
    }
}

impl CloudLink for FakeLink {
    fn is_connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }
    async fn send(&self, msg: Message) -> Result<(), HubError> {
        if !self.is_connected() {
            return Err(HubError::NotConnected);
        }
        self.sent.lock().unwrap().push(msg);
        Ok(())
    }
    async fn request(&self, _: Message, _: Duration) -> Result<Message, HubError> {
        Err(HubError::NotConnected)
    }
    fn subscribe(&self) -> broadcast::Receiver<LinkEvent> {
        self.events.subscribe()
    }
}

struct Rig {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    store: MetaStore,
    link: FakeLink,
    twin: DeviceTwin,
    inputs: TwinInputs,
    published: mpsc::Receiver<BusMessage>,
}

async fn rig(connected: bool) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edgecore.db");
    let store = MetaStore::open(&path).await.unwrap();
    let link = FakeLink::new(connected);
    start(dir, path, store, link).await
}

async fn start(
    dir: tempfile::TempDir,
    path: std::path::PathBuf,
    store: MetaStore,
    link: FakeLink,
) -> Rig {
    let (ptx, published) = mpsc::channel(256);
    let config = DeviceTwinConfig {
        node_name: "edge-1".into(),
        resend_interval: Duration::from_millis(300),
        dmi_socket: Some(dir.path().join("dmi.sock")),
    };
    let (twin, inputs) = DeviceTwin::start(config, store.clone(), link.clone(), ptx)
        .await
        .unwrap();
    Rig {
        _dir: dir,
        path,
        store,
        link,
        twin,
        inputs,
        published,
    }
}

impl Rig {
    async fn membership(&self, added: &[&str], removed: &[&str]) {
        let list = |ids: &[&str]| {
            (!ids.is_empty()).then(|| {
                ids.iter()
                    .map(|i| json!({"id": i, "name": i}))
                    .collect::<Vec<_>>()
            })
        };
        let m = Message::new(
            source::DEVICE_CONTROLLER,
            Group::Twin,
            Operation::Update,
            "membership",
            json!({"event_id": "e", "timestamp": 1, "added_devices": list(added), "removed_devices": list(removed)}),
        );
        self.inputs.cloud.send(m).await.unwrap();
    }

    async fn mqtt(&self, topic: &str, payload: &str) {
        self.inputs
            .bus
            .send(BusMessage {
                topic: topic.into(),
                payload: payload.as_bytes().to_vec().into(),
            })
            .await
            .unwrap();
    }

    /// The next publish on `topic` (others are skipped), within 5 s.
    async fn published_on(&mut self, topic: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let m = tokio::time::timeout_at(deadline, self.published.recv())
                .await
                .unwrap_or_else(|_| panic!("nothing published on {topic} within 5s"))
                .expect("publisher open");
            if m.topic == topic {
                return serde_json::from_slice(&m.payload).unwrap();
            }
        }
    }

    async fn sent_within(&self, what: &str) -> Vec<Message> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let sent = self.link.take();
            if !sent.is_empty() {
                return sent;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: nothing sent within 5s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn twin_rows(&self) -> Vec<(String, String, Option<String>)> {
        self.store
            .call(|c| {
                let mut s = c.prepare(
                    r#"SELECT "deviceid","name","actual" FROM "device_twin" ORDER BY 1,2"#,
                )?;
                let rows = s
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
            .unwrap()
    }
}

#[tokio::test]
async fn membership_creates_and_removes_devices_and_tells_mqtt() {
    let mut r = rig(true).await;
    r.membership(&["thermo-1"], &[]).await;
    let m = r
        .published_on("$hw/events/node/edge-1/membership/updated")
        .await;
    assert_eq!(m["added_devices"][0]["id"], "thermo-1");
    assert_eq!(m["removed_devices"], Value::Null);
    r.mqtt(
        "$hw/events/device/thermo-1/twin/update",
        r#"{"event_id":"u1","twin":{"temperature":{"actual":{"value":"23"}}}}"#,
    )
    .await;
    r.published_on("$hw/events/device/thermo-1/twin/update/result")
        .await;
    assert_eq!(r.twin_rows().await.len(), 1);
    r.mqtt(
        "$hw/events/node/edge-1/membership/get",
        r#"{"event_id":"g"}"#,
    )
    .await;
    let g = r
        .published_on("$hw/events/node/edge-1/membership/get/result")
        .await;
    assert_eq!(g["event_id"], "g");
    assert_eq!(g["devices"][0]["id"], "thermo-1");

    r.membership(&[], &["thermo-1"]).await;
    let m = r
        .published_on("$hw/events/node/edge-1/membership/updated")
        .await;
    assert_eq!(m["removed_devices"][0]["id"], "thermo-1");
    assert!(
        r.twin_rows().await.is_empty(),
        "twin rows go with the device"
    );
    r.twin.shutdown().await;
}

#[tokio::test]
async fn a_twin_update_is_stored_published_and_reported_until_confirmed() {
    let mut r = rig(true).await;
    r.membership(&["thermo-1"], &[]).await;
    r.published_on("$hw/events/node/edge-1/membership/updated")
        .await;
    r.mqtt(
        "$hw/events/device/thermo-1/twin/update",
        r#"{"event_id":"u1","timestamp":1,"twin":{"setpoint":{"expected":{"value":"20"},"actual":{"value":"18"}}}}"#,
    )
    .await;
    let res = r
        .published_on("$hw/events/device/thermo-1/twin/update/result")
        .await;
    assert_eq!(res["event_id"], "u1");
    assert_eq!(res["twin"]["setpoint"]["actual"]["value"], "18");
    assert!(res["twin"]["setpoint"].get("actual_version").is_none());
    let doc = r
        .published_on("$hw/events/device/thermo-1/twin/update/document")
        .await;
    assert_eq!(doc["twin"]["setpoint"]["last"], Value::Null);
    let delta = r
        .published_on("$hw/events/device/thermo-1/twin/update/delta")
        .await;
    assert_eq!(delta["delta"]["setpoint"], "20");

    let sent = r.sent_within("twin report").await;
    assert_eq!(sent[0].route.resource, "device/thermo-1/twin/edge_updated");
    assert_eq!(sent[0].route.source, "twin");
    assert_eq!(
        sent[0].content["twin"]["setpoint"]["actual_version"],
        json!({"cloud": 0, "edge": 1})
    );
    // Unanswered: sent again.
    let again = r.sent_within("resend").await;
    assert_eq!(again[0].route.resource, "device/thermo-1/twin/edge_updated");
    // Answered: no more.
    let ok = {
        let mut m = Message::new(
            source::DEVICE_CONTROLLER,
            Group::Twin,
            Operation::Response,
            "twin",
            json!("OK"),
        );
        m.header.parent_id = again[0].header.id.clone();
        m
    };
    r.inputs.cloud.send(ok).await.unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    r.link.take();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(r.link.take().is_empty(), "confirmed reports are not resent");
    let unreported: i64 = r
        .store
        .call(|c| {
            Ok(c.query_row(
                r#"SELECT count(*) FROM "device_twin_unreported""#,
                [],
                |x| x.get(0),
            )?)
        })
        .await
        .unwrap();
    assert_eq!(unreported, 0);
    r.twin.shutdown().await;
}

#[tokio::test]
async fn changes_made_offline_survive_a_restart_and_reach_the_cloud() {
    let mut r = rig(false).await;
    r.membership(&["thermo-1"], &[]).await;
    // MQTT and the cloud are separate inputs: the device must exist before its update.
    r.published_on("$hw/events/node/edge-1/membership/updated")
        .await;
    r.mqtt(
        "$hw/events/device/thermo-1/twin/update",
        r#"{"twin":{"temperature":{"actual":{"value":"31"}}}}"#,
    )
    .await;
    // Wait until stored.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while r.twin_rows().await.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "twin not stored");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let Rig {
        _dir,
        path,
        store,
        link,
        twin,
        ..
    } = r;
    twin.shutdown().await;
    store.close().await;
    assert!(link.take().is_empty(), "nothing sent while offline");

    let store = MetaStore::open(&path).await.unwrap();
    let r = start(_dir, path, store, link).await;
    r.link.set(true);
    let sent = r.sent_within("report after reconnect").await;
    assert_eq!(sent[0].route.resource, "device/thermo-1/twin/edge_updated");
    assert_eq!(
        sent[0].content["twin"]["temperature"]["actual"]["value"],
        "31"
    );
    r.twin.shutdown().await;
}

#[tokio::test]
async fn bad_mqtt_input_gets_kubeedges_error_results() {
    let mut r = rig(true).await;
    r.membership(&["thermo-1"], &[]).await;
    r.published_on("$hw/events/node/edge-1/membership/updated")
        .await;
    r.mqtt("$hw/events/device/thermo-1/twin/update", "{not json")
        .await;
    let e = r
        .published_on("$hw/events/device/thermo-1/twin/update/result")
        .await;
    assert_eq!(e["code"], 400);
    assert_eq!(
        r.twin.metrics().refused_count(metrics::Refusal::Malformed),
        1
    );
    r.mqtt(
        "$hw/events/device/nope/twin/update",
        r#"{"event_id":"x","twin":{}}"#,
    )
    .await;
    let e = r
        .published_on("$hw/events/device/nope/twin/update/result")
        .await;
    assert_eq!(e["code"], 404);
    assert_eq!(
        r.twin
            .metrics()
            .refused_count(metrics::Refusal::UnknownDevice),
        1
    );
    assert_eq!(e["event_id"], "x");
    r.mqtt(
        "$hw/events/device/thermo-1/twin/update",
        r#"{"event_id":"y","twin":{"t":{"actual":{"value":"a b"}}}}"#,
    )
    .await;
    let e = r
        .published_on("$hw/events/device/thermo-1/twin/update/result")
        .await;
    assert_eq!(e["code"], 400);
    r.mqtt("$hw/events/device/thermo-1/twin/get", r#"{"event_id":"g"}"#)
        .await;
    let g = r
        .published_on("$hw/events/device/thermo-1/twin/get/result")
        .await;
    assert_eq!(g["twin"], json!({}));
    // State: stored, published and sent upstream as a JSON string.
    r.mqtt(
        "$hw/events/device/thermo-1/state/update",
        r#"{"event_id":"s","state":"online"}"#,
    )
    .await;
    let s = r
        .published_on("$hw/events/device/thermo-1/state/update/result")
        .await;
    assert_eq!(s["device"]["state"], "online");
    let sent = r.sent_within("state").await;
    assert_eq!(sent[0].route.resource, "device/thermo-1/state/update");
    assert!(sent[0].content.is_string());
    r.twin.shutdown().await;
}

async fn register(dir: &std::path::Path) -> kubeedge_dmi::v1beta1::MapperRegisterResponse {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(ch) = kubeedge_dmi::connect_uds(dir.join("dmi.sock")).await {
            let mut c = kubeedge_dmi::DeviceManagerServiceClient::new(ch);
            let req = kubeedge_dmi::v1beta1::MapperRegisterRequest {
                with_data: true,
                mapper: Some(kubeedge_dmi::v1beta1::MapperInfo {
                    name: "m".into(),
                    protocol: "modbus".into(),
                    address: dir.join("m.sock").display().to_string().into_bytes(),
                    ..Default::default()
                }),
            };
            if let Ok(r) = c.mapper_register(req).await {
                return r.into_inner();
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "DMI server not answering"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_mapper_gets_its_devices_also_after_an_offline_restart() {
    let r = rig(false).await;
    let device = json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
        "metadata": {"name": "t1", "namespace": "default", "uid": "u1"},
        "spec": {"deviceModelRef": {"name": "thermo"}, "nodeName": "edge-1",
            "protocol": {"protocolName": "modbus", "configData": {"ip": "127.0.0.1"}},
            "properties": [{"name": "temperature"}]}});
    // With KubeEdge v1.22's model-level defaults, which v1.23's edge merges into the device.
    let model = json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
        "metadata": {"name": "thermo", "namespace": "default", "uid": "m1"},
        "spec": {"protocol": "modbus", "protocolConfigData": {"port": 502},
            "properties": [{"name": "temperature", "type": "INT",
                "visitors": {"protocolName": "modbus", "configData": {"register": "InputRegister"}}}]}});
    // As metamanager does: stored first, then handed over.
    for (key, ty, v) in [
        (
            "default/devicemodel/thermo",
            ResourceType::DeviceModel,
            &model,
        ),
        ("default/device/t1", ResourceType::Device, &device),
    ] {
        r.store
            .upsert(crate::metamanager::MetaRecord::new(
                key,
                ty.as_str(),
                v.to_string(),
            ))
            .await
            .unwrap();
        r.inputs
            .objects
            .send(DeviceObject {
                resource_type: ty,
                action: ChangeAction::Upsert,
                namespace: "default".into(),
                name: v["metadata"]["name"].as_str().unwrap().into(),
                object: v.clone(),
            })
            .await
            .unwrap();
    }
    r.membership(&["t1"], &[]).await;
    // The objects came before the membership: once it is published, they are known (a cloud
    // message is handled after the objects handed over before it).
    let mut r = r;
    r.published_on("$hw/events/node/edge-1/membership/updated")
        .await;
    let got = register(r._dir.path()).await;
    assert_eq!(got.device_list.len(), 1);
    assert_eq!(got.device_list[0].name, "t1");
    assert_eq!(got.model_list[0].name, "thermo");
    let spec = got.device_list[0].spec.as_ref().unwrap();
    let config = |c: Option<&kubeedge_dmi::v1beta1::CustomizedValue>| {
        Value::Object(kubeedge_dmi::config_data_to_json(c.unwrap()).unwrap())
    };
    assert_eq!(
        config(spec.protocol.as_ref().unwrap().config_data.as_ref()),
        json!({"ip": "127.0.0.1", "port": 502}),
        "the model's protocolConfigData under the device's own"
    );
    assert_eq!(
        config(
            spec.properties[0]
                .visitors
                .as_ref()
                .unwrap()
                .config_data
                .as_ref()
        ),
        json!({"register": "InputRegister"}),
        "the model's visitors"
    );

    let Rig {
        _dir,
        path,
        store,
        link,
        twin,
        ..
    } = r;
    twin.shutdown().await;
    store.close().await;
    let store = MetaStore::open(&path).await.unwrap();
    let r = start(_dir, path, store, link).await;
    let got = register(r._dir.path()).await;
    assert_eq!(
        got.device_list.len(),
        1,
        "the restarted edge still knows the device"
    );
    r.twin.shutdown().await;
}
