//! Devices end to end: the device CRDs in the cluster, cloudcore's DeviceController, a real
//! edgecore (devicetwin, eventbus on a real mosquitto, DMI server), the real `modbus-mapper`
//! process and a Modbus TCP device (`modbus-sim`) on loopback.
//!
//! A DeviceModel and a Device bound to the edge node → the mapper gets the device → register
//! values appear as reported twins in the Device's status; a desired value edited in the
//! cluster reaches the register; MQTT clients see the twin topics; reports made while the
//! cloud link is cut arrive after it heals; a deleted device leaves the edge and the mapper.
//! Skipped (with the reason printed) where mosquitto is not installed.

use e2e::channel::{FaultProxy, Pki};
use e2e::cloud::CloudFixture;
use e2e::cluster::TestCluster;
use e2e::devices::{self, read_register, twin_value, write_register};
use e2e::edge::{WAIT, init_logs, node_name};
use e2e::mosquitto::Mosquitto;
use e2e::mqtt::MqttClient;
use e2e::process::LoggedProcess;
use edgecore::app::EdgeCore;
use edgecore::config::EdgeCoreConfig;
use kube::api::{DeleteParams, DynamicObject, PostParams};
use serde_json::{Value, json};
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

struct DeviceEnv {
    cluster: TestCluster,
    cloud: CloudFixture,
    link: FaultProxy,
    dir: tempfile::TempDir,
    node: String,
    ns: String,
    edge: Option<EdgeCore>,
    broker: Mosquitto,
    plc: SocketAddr,
    _sim: LoggedProcess,
    mapper: Option<LoggedProcess>,
}

impl DeviceEnv {
    async fn start(test: &str) -> Option<DeviceEnv> {
        init_logs();
        let broker = Mosquitto::start_or_skip(test)?;
        let cluster = e2e::cluster::connect().await.expect("test cluster");
        devices::install(&cluster.client())
            .await
            .expect("device CRDs");
        let pki = Pki::new().expect("test PKI");
        let cloud = CloudFixture::start(cluster.client(), &pki)
            .await
            .expect("cloudcore starts");
        let link = FaultProxy::start(cloud.hub.local_addr())
            .await
            .expect("link proxy");
        let node = node_name("devices");
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let cert = pki.node_cert(&node).expect("node certificate");
        std::fs::write(d.join("ca.crt"), &pki.ca.cert.cert_pem).unwrap();
        std::fs::write(d.join("edge.crt"), &cert.cert_pem).unwrap();
        std::fs::write(d.join("edge.key"), &cert.key_pem).unwrap();
        let yaml = format!(
            "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\n\
             database:\n  dataSource: {d}/edgecore.db\n\
             modules:\n  edgeHub:\n    heartbeat: 1\n    messageQPS: 0\n    tlsCaFile: {d}/ca.crt\n\
             \x20   tlsCertFile: {d}/edge.crt\n    tlsPrivateKeyFile: {d}/edge.key\n\
             \x20   websocket:\n      server: {server}\n\
             \x20 edged:\n    enable: false\n    hostnameOverride: {node}\n\
             \x20 deviceTwin:\n    dmiSockPath: {d}\n\
             \x20 eventBus:\n    mqttMode: 2\n    mqttServerExternal: {mqtt}\n",
            d = d.display(),
            server = link.addr,
            mqtt = broker.url(),
        );
        std::fs::write(d.join("edgecore.yaml"), yaml).unwrap();
        let config = EdgeCoreConfig::load(&d.join("edgecore.yaml")).expect("edgecore.yaml");
        let edge = EdgeCore::start_with(&config, None)
            .await
            .expect("edgecore starts");
        let (sim, plc) = devices::start_modbus_sim(d).expect("modbus-sim");
        let mapper = devices::start_modbus_mapper(&d.join("dmi.sock"), d).expect("modbus-mapper");
        let ns = cluster.temp_namespace("devices").await.expect("namespace");
        Some(DeviceEnv {
            cluster,
            cloud,
            link,
            dir,
            node,
            ns,
            edge: Some(edge),
            broker,
            plc,
            _sim: sim,
            mapper: Some(mapper),
        })
    }

    fn devices(&self) -> kube::Api<DynamicObject> {
        devices::devices(&self.cluster.client(), &self.ns)
    }

    /// `kubectl apply` of a DeviceModel and a Device bound to the edge node.
    async fn create(&self, model: &str, device: &str, desired: &str) {
        let objects = [
            devices::thermostat_model(model),
            devices::thermostat(device, model, &self.node, self.plc, desired),
        ];
        for o in objects {
            let out = self
                .cluster
                .kubectl_run(&["-n", &self.ns, "apply", "-f", "-"], Some(&o.to_string()))
                .await
                .expect("kubectl runs");
            assert!(out.success, "kubectl apply: {}", out.stderr);
        }
    }

    /// Waits until the Device's status satisfies `ok`; returns it.
    async fn status_until(&self, name: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut last = Value::Null;
        loop {
            if let Ok(d) = self.devices().get(name).await {
                last = serde_json::to_value(d).unwrap();
                if ok(&last) {
                    return last;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not within {WAIT:?}; last status: {}\n{}",
                last["status"],
                self.mapper
                    .as_ref()
                    .map(|m| m.failure_report(30))
                    .unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn edge_rows(&self, sql: &'static str) -> i64 {
        let db = self.dir.path().join("edgecore.db");
        tokio::task::spawn_blocking(move || {
            let c = rusqlite::Connection::open(db).unwrap();
            c.query_row(sql, [], |r| r.get(0)).unwrap()
        })
        .await
        .unwrap()
    }

    async fn cleanup(mut self) {
        drop(self.mapper.take());
        if let Some(edge) = self.edge.take() {
            edge.shutdown().await;
        }
        self.cluster.delete_namespace(&self.ns).await;
    }
}

async fn until<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn reported_in(range: std::ops::RangeInclusive<u16>) -> impl Fn(&Value) -> bool {
    move |d| {
        twin_value(d, "temperature", "reported")
            .and_then(|v| v.parse::<u16>().ok())
            .is_some_and(|v| range.contains(&v))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_modbus_register_becomes_a_reported_twin_and_a_desired_value_reaches_the_register() {
    let Some(env) = DeviceEnv::start("devices: register → twin, desired → register").await
    else {
        return;
    };
    let mut watcher = MqttClient::connect(env.broker.addr(), "e2e-watcher").await;
    watcher
        .subscribe("$hw/events/device/+/twin/update/document")
        .await;
    env.create("thermostat", "thermo-1", "42").await;

    // The simulated thermometer (20..29) appears as the reported twin.
    env.status_until("thermo-1", "temperature reported", reported_in(20..=29))
        .await;
    // The desired setpoint reached the register, and the mapper says so.
    until("setpoint register = 42", || async {
        read_register(env.plc, 1).await.ok() == Some(42)
    })
    .await;
    env.status_until("thermo-1", "setpoint observed", |d| {
        twin_value(d, "setpoint", "observedDesired").as_deref() == Some("42")
            && twin_value(d, "setpoint", "reported").as_deref() == Some("42")
    })
    .await;
    // MQTT clients see the twin changes on KubeEdge's topics.
    let doc = watcher
        .next_on("$hw/events/device/thermo-1/twin/update/document", WAIT)
        .await
        .expect("a twin document on MQTT");
    let doc: Value = serde_json::from_slice(&doc.payload).unwrap();
    assert!(doc["twin"].is_object(), "{doc}");

    // A desired value edited with kubectl reaches the register.
    let out = env
        .cluster
        .kubectl_run(
            &[
                "-n",
                &env.ns,
                "patch",
                "device",
                "thermo-1",
                "--type=json",
                "-p",
                r#"[{"op":"replace","path":"/spec/properties/1/desired/value","value":"55"}]"#,
            ],
            None,
        )
        .await
        .expect("kubectl runs");
    assert!(out.success, "kubectl patch: {}", out.stderr);
    until("setpoint register = 55", || async {
        read_register(env.plc, 1).await.ok() == Some(55)
    })
    .await;
    env.status_until("thermo-1", "setpoint 55 observed", |d| {
        twin_value(d, "setpoint", "observedDesired").as_deref() == Some("55")
    })
    .await;
    let out = env
        .cluster
        .kubectl_run(
            &["-n", &env.ns, "get", "device", "thermo-1", "-o", "yaml"],
            None,
        )
        .await
        .expect("kubectl runs");
    assert!(out.success, "kubectl get device: {}", out.stderr);
    assert!(
        out.stdout.contains("propertyName: setpoint") && out.stdout.contains("value: \"55\""),
        "kubectl get device -o yaml:\n{}",
        out.stdout
    );

    // The edge keeps KubeEdge's tables.
    assert_eq!(
        env.edge_rows(r#"SELECT count(*) FROM "device" WHERE "id"='thermo-1'"#)
            .await,
        1
    );
    assert!(
        env.edge_rows(r#"SELECT count(*) FROM "device_twin" WHERE "deviceid"='thermo-1'"#)
            .await
            >= 2
    );

    // Deleted: gone from the edge's tables (and the mapper stops polling it).
    env.devices()
        .delete("thermo-1", &DeleteParams::default())
        .await
        .expect("delete device");
    until("device rows removed at the edge", || async {
        env.edge_rows(r#"SELECT count(*) FROM "device" WHERE "id"='thermo-1'"#)
            .await
            == 0
    })
    .await;
    assert_eq!(
        env.edge_rows(r#"SELECT count(*) FROM "device_twin" WHERE "deviceid"='thermo-1'"#)
            .await,
        0
    );
    let log_path = env.mapper.as_ref().unwrap().log_path().to_path_buf();
    until("the mapper was told", || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        async move { log.contains("thermo-1") && log.to_lowercase().contains("remov") }
    })
    .await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reports_made_while_the_cloud_link_is_cut_arrive_after_it_heals() {
    let Some(env) = DeviceEnv::start("devices: reports across a cut link").await else {
        return;
    };
    env.create("thermostat", "thermo-2", "10").await;
    env.status_until("thermo-2", "first report", reported_in(20..=29))
        .await;
    env.link.freeze();
    env.link.cut();
    // The device changes while the edge cannot reach the cloud: writing register 0 stops the
    // simulated drift at this value.
    write_register(env.plc, 0, 77)
        .await
        .expect("write register 0");
    // The edge stores it (reported locally) before the link returns.
    until("the edge stored the offline value", || async {
        env.edge_rows(
            r#"SELECT count(*) FROM "device_twin" WHERE "deviceid"='thermo-2' AND "name"='temperature' AND "actual"='77'"#,
        )
        .await
            == 1
    })
    .await;
    let status = serde_json::to_value(env.devices().get("thermo-2").await.unwrap()).unwrap();
    assert_ne!(
        twin_value(&status, "temperature", "reported").as_deref(),
        Some("77"),
        "the cloud cannot have it while the link is cut"
    );
    env.link.thaw();
    env.status_until("thermo-2", "the offline value after the heal", |d| {
        twin_value(d, "temperature", "reported").as_deref() == Some("77")
    })
    .await;
    env.cleanup().await;
}

fn mapper_ready(d: &Value) -> Option<(String, String)> {
    let c = d
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "MapperReady")?;
    Some((
        c["status"].as_str()?.to_string(),
        c["reason"].as_str()?.to_string(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_device_no_mapper_can_serve_gets_a_condition_and_the_others_run_on() {
    let Some(env) = DeviceEnv::start("devices: unserved device condition").await else {
        return;
    };
    env.create("thermostat", "thermo-3", "5").await;
    // A device of a protocol no mapper on the node speaks.
    let mut odd = devices::thermostat("odd-1", "thermostat", &env.node, env.plc, "1");
    odd["spec"]["protocol"]["protocolName"] = json!("bacnet");
    let odd: DynamicObject = serde_json::from_value(odd).unwrap();
    env.devices()
        .create(&PostParams::default(), &odd)
        .await
        .expect("create the bacnet device");
    env.status_until("odd-1", "MapperReady False/NoMapper", |d| {
        mapper_ready(d) == Some(("False".into(), "NoMapper".into()))
    })
    .await;
    // The Modbus device is served and keeps reporting.
    env.status_until("thermo-3", "MapperReady True and a report", |d| {
        mapper_ready(d) == Some(("True".into(), "Registered".into())) && reported_in(20..=29)(d)
    })
    .await;
    env.cleanup().await;
}

/// A KubeEdge v1.15 edge (a raw WebSocket peer speaking as KubeEdge's edgecore does) gets the
/// device messages in KubeEdge's shapes from our cloudcore, and its twin report in KubeEdge's
/// shape lands in the Device's status and is answered as KubeEdge's cloud answers it.
/// The cloud side for raw (KubeEdge-shaped) edges: the device CRDs and cloudcore.
async fn raw_edge_cloud() -> (TestCluster, Pki, CloudFixture) {
    init_logs();
    let cluster = e2e::cluster::connect().await.expect("test cluster");
    devices::install(&cluster.client())
        .await
        .expect("device CRDs");
    let pki = Pki::new().expect("test PKI");
    let cloud = CloudFixture::start(cluster.client(), &pki)
        .await
        .expect("cloudcore starts");
    (cluster, pki, cloud)
}

/// The thermostat model and a thermostat `name` bound to `node` (its PLC at `plc`) in `ns`.
async fn create_thermostat(
    client: &kube::Client,
    ns: &str,
    name: &str,
    node: &str,
    plc: SocketAddr,
) {
    let m: DynamicObject = serde_json::from_value(devices::thermostat_model("thermostat")).unwrap();
    devices::models(client, ns)
        .create(&PostParams::default(), &m)
        .await
        .unwrap();
    let d: DynamicObject =
        serde_json::from_value(devices::thermostat(name, "thermostat", node, plc, "7")).unwrap();
    devices::devices(client, ns)
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kubeedge_edge_gets_kubeedge_shapes_and_its_reports_are_written() {
    use e2e::channel::RawEdge;
    use kubeedge_shared::{Group, Message, Operation};
    let (cluster, pki, cloud) = raw_edge_cloud().await;
    let node = node_name("ke-devices");
    let tls = pki.edge_tls(&pki.node_cert(&node).unwrap()).unwrap();
    let mut edge = RawEdge::connect(cloud.hub.local_addr(), &node, tls)
        .await
        .expect("connects");
    let ns = cluster.temp_namespace("ke-devices").await.expect("ns");
    let client = cluster.client();
    let plc: SocketAddr = "127.0.0.1:5020".parse().unwrap();
    create_thermostat(&client, &ns, "thermo-ke", &node, plc).await;

    // membership (group twin, NO-ACK), then the model, then the device (group resource).
    let mut got: Vec<Message> = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while got.len() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "device messages: got {got:?}"
        );
        if let Ok(Some(m)) = edge.recv(Duration::from_millis(500)).await {
            if m.route.operation == Operation::Keepalive {
                continue;
            }
            if m.route.group == Group::Resource {
                edge.ack(&m).await.unwrap();
            }
            got.push(m);
        }
    }
    assert_eq!(got[0].route.resource, "membership");
    assert_eq!(got[0].route.source, "devicecontroller");
    assert_eq!(got[0].route.group, Group::Twin);
    assert_eq!(got[0].route.operation, Operation::Update);
    assert_eq!(
        got[0].content["added_devices"],
        json!([{"id": "thermo-ke", "name": "thermo-ke", "description": "thermostat"}])
    );
    assert!(got[0].content["removed_devices"].is_null());
    assert!(got[0].content["event_id"].is_string() && got[0].content["timestamp"].is_i64());
    // The model and the device: the model first when the cloud's model watch delivered it
    // before the device's (two watches: the model may also follow the device, as in KubeEdge).
    let by_resource = |r: String| {
        got[1..]
            .iter()
            .find(|m| m.route.resource == r)
            .unwrap_or_else(|| panic!("no {r} in {got:?}"))
    };
    let model = by_resource(format!("{ns}/devicemodel/thermostat"));
    assert_eq!(model.route.operation, Operation::Insert);
    assert_eq!(model.content["kind"], "DeviceModel");
    assert_eq!(model.content["apiVersion"], "devices.kubeedge.io/v1beta1");
    let device = by_resource(format!("{ns}/device/thermo-ke"));
    assert_eq!(device.content["spec"]["nodeName"], node.as_str());
    assert!(!device.header.resource_version.is_empty());

    // KubeEdge v1.15's twin report: device/<name>/twin/edge_updated, versions and all.
    let report = Message::new(
        "twin",
        Group::Resource,
        Operation::Update,
        "device/thermo-ke/twin/edge_updated",
        json!({"event_id": "e1", "timestamp": 1_718_000_000_000i64, "twin": {"temperature": {
            "actual": {"value": "23", "metadata": {"timestamp": 1_718_000_000_456i64}},
            "optional": true, "metadata": {"type": "string"},
            "actual_version": {"cloud": 0, "edge": 1}}}}),
    );
    edge.send(&report).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no answer to the report"
        );
        if let Ok(Some(m)) = edge.recv(Duration::from_millis(500)).await
            && m.header.parent_id == report.header.id
        {
            assert_eq!(m.route.operation, Operation::Response);
            assert_eq!(m.route.source, "devicecontroller");
            assert_eq!(m.content, json!("OK"));
            break;
        }
    }
    let dev = serde_json::to_value(
        devices::devices(&client, &ns)
            .get("thermo-ke")
            .await
            .unwrap(),
    )
    .unwrap();
    let twin = dev["status"]["twins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["propertyName"] == "temperature")
        .cloned()
        .unwrap();
    assert_eq!(
        twin["reported"],
        json!({"value": "23", "metadata": {"timestamp": "1718000000456", "type": "string"}})
    );
    // KubeEdge v1.23's DeviceStatus holds the same, owned by the Device.
    let status = device_status_until(&client, &ns, "thermo-ke", |s| {
        s["status"]["twins"][0]["reported"]["value"] == "23"
    })
    .await;
    let owner = &status["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Device");
    assert_eq!(owner["uid"], dev["metadata"]["uid"]);
    assert_eq!(owner["controller"], true);
    cluster.delete_namespace(&ns).await;
}

/// The DeviceStatus `name` once `ok` holds for it (KubeEdge v1.23's record of a device's reports).
async fn device_status_until(
    client: &kube::Client,
    ns: &str,
    name: &str,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let api = devices::device_statuses(client, ns);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let got = api
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .map(|o| serde_json::to_value(o).unwrap_or_default());
        if let Some(v) = &got
            && ok(v)
        {
            return v.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "DeviceStatus {ns}/{name}: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The cloud router's eventbus operations reach MQTT through the real edge: `publish` appears
/// on the broker, `subscribe` is kept in `sub_topics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn router_publish_and_subscribe_reach_the_edges_mqtt() {
    use kubeedge_shared::operation::source;
    use kubeedge_shared::{Group, Message, Operation};
    let Some(env) = DeviceEnv::start("devices: router operations").await else {
        return;
    };
    let mut client = MqttClient::connect(env.broker.addr(), "e2e-router").await;
    client.subscribe("rule/out/#").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let got = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "router publish not seen on MQTT"
        );
        let msg = Message::new(
            source::ROUTER_EVENTBUS,
            Group::User,
            Operation::Publish,
            "rule/out/temperature",
            json!("21.5"),
        );
        // The edge may still be connecting.
        let _ = env.cloud.hub.send(&env.node, msg);
        if let Some(p) = client
            .next_on("rule/out/temperature", Duration::from_millis(500))
            .await
        {
            break p;
        }
    };
    assert_eq!(&got.payload[..], b"21.5");

    let sub = Message::new(
        source::ROUTER_EVENTBUS,
        Group::User,
        Operation::Subscribe,
        "default/rule-in",
        Value::Null,
    );
    env.cloud.hub.send(&env.node, sub).expect("queued");
    until("the subscription stored at the edge", || async {
        env.edge_rows(r#"SELECT count(*) FROM "sub_topics" WHERE "topic"='default/rule-in'"#)
            .await
            == 1
    })
    .await;
    env.cleanup().await;
}

/// A KubeEdge v1.17 edge (its Node reports `…-kubeedge-v1.17.0`): membership names the device
/// `<namespace>/<name>` and its v1.17-shaped report (`device/<ns>/<name>/twin/edge_updated`)
/// is written to the Device's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kubeedge_v1_17_edge_gets_namespaced_device_ids() {
    namespaced_edge("ke17", "v1.27.7-kubeedge-v1.17.0", 5021).await;
}

/// KubeEdge v1.23's edge: namespaced IDs as from v1.16, and its twin and state reports read
/// back from the DeviceStatus v1.23's tools look at (as well as from `Device.status`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kubeedge_v1_23_edge_reports_into_device_status() {
    namespaced_edge("ke23", "v1.31.12-kubeedge-v1.23.1", 5022).await;
}

/// A raw KubeEdge edge of `kubelet_version` (≥ v1.16): membership with `<ns>/<name>` IDs, a
/// twin report and a state report written to the Device and its DeviceStatus.
async fn namespaced_edge(tag: &str, kubelet_version: &str, plc_port: u16) {
    use e2e::channel::RawEdge;
    use e2e::sim_edge::{delete_node, edge_node};
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, Patch, PatchParams};
    use kubeedge_shared::{Group, Message, Operation};
    let (cluster, pki, cloud) = raw_edge_cloud().await;
    let node = node_name(&format!("{tag}-devices"));
    edge_node(&cluster, &node).await;
    Api::<Node>::all(cluster.client())
        .patch_status(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeInfo": {
                "kubeletVersion": kubelet_version, "machineID": "", "systemUUID": "",
                "bootID": "", "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}}})),
        )
        .await
        .expect("node status");
    let ns = cluster
        .temp_namespace(&format!("{tag}-devices"))
        .await
        .expect("ns");
    let client = cluster.client();
    let plc = SocketAddr::from(([127, 0, 0, 1], plc_port));
    create_thermostat(&client, &ns, "thermo-17", &node, plc).await;
    // Connecting after the device exists: the push waits for the node's version.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tls = pki.edge_tls(&pki.node_cert(&node).unwrap()).unwrap();
    let mut edge = RawEdge::connect(cloud.hub.local_addr(), &node, tls)
        .await
        .expect("connects");
    let deadline = tokio::time::Instant::now() + WAIT;
    let membership = loop {
        assert!(tokio::time::Instant::now() < deadline, "no membership");
        if let Ok(Some(m)) = edge.recv(Duration::from_millis(500)).await {
            if m.route.group == Group::Resource {
                edge.ack(&m).await.unwrap();
            }
            if m.route.resource == "membership" {
                break m;
            }
        }
    };
    assert_eq!(
        membership.content["added_devices"][0]["id"],
        format!("{ns}/thermo-17"),
        "{membership:?}"
    );
    assert_eq!(membership.content["added_devices"][0]["name"], "thermo-17");

    let twin_report = Message::new(
        "twin",
        Group::Resource,
        Operation::Update,
        format!("device/{ns}/thermo-17/twin/edge_updated"),
        json!({"event_id": "e17", "timestamp": 1_718_000_000_000i64, "twin": {"temperature": {
            "actual": {"value": "19", "metadata": {"timestamp": 1_718_000_000_789i64}},
            "optional": true, "metadata": {"type": "string"},
            "actual_version": {"cloud": 0, "edge": 1}}}}),
    );
    let state_report = Message::new(
        "twin",
        Group::Resource,
        Operation::Update,
        format!("device/{ns}/thermo-17/state/update"),
        json!({"event_id": "s17", "timestamp": 1_718_000_000_000i64,
            "device": {"name": "thermo-17", "state": "online", "lastOnlineTime": "2026-11-27T12:00:00Z"}}),
    );
    for report in [&twin_report, &state_report] {
        edge.send(report).await.unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "report not answered: {report:?}"
            );
            if let Ok(Some(m)) = edge.recv(Duration::from_millis(500)).await {
                if m.route.group == Group::Resource && m.route.operation != Operation::Response {
                    edge.ack(&m).await.unwrap();
                }
                if m.header.parent_id == report.header.id {
                    assert_eq!(m.content, json!("OK"));
                    break;
                }
            }
        }
    }
    let dev = serde_json::to_value(
        devices::devices(&client, &ns)
            .get("thermo-17")
            .await
            .unwrap(),
    )
    .unwrap();
    let reported = dev["status"]["twins"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["propertyName"] == "temperature")
        .map(|t| t["reported"]["value"].clone());
    assert_eq!(reported, Some(json!("19")), "{dev}");
    assert_eq!(dev["status"]["state"], "online", "{dev}");
    let status = device_status_until(&client, &ns, "thermo-17", |s| {
        s["status"]["state"] == "online"
    })
    .await;
    assert_eq!(
        status["status"]["lastOnlineTime"], "2026-11-27T12:00:00Z",
        "{status}"
    );
    assert_eq!(
        status["status"]["twins"][0]["reported"]["value"], "19",
        "{status}"
    );
    assert_eq!(
        status["metadata"]["ownerReferences"][0]["name"],
        "thermo-17"
    );
    cluster.delete_namespace(&ns).await;
    delete_node(&cluster, &node).await;
}
