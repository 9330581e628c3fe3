use super::*;
use crate::cloudhub::queue::Enqueued;
use crate::cloudhub::{Capabilities, SendError};
use kubeedge_shared::Group;
use std::sync::Mutex;

#[derive(Default)]
struct Recorder {
    sent: Mutex<Vec<(String, Message)>>,
    offline: Mutex<HashSet<String>>,
}

impl HubSink for Recorder {
    fn send(&self, node: &str, msg: Message) -> Result<Enqueued, SendError> {
        if self.offline.lock().unwrap().contains(node) {
            return Err(SendError::NotConnected(node.into()));
        }
        self.sent.lock().unwrap().push((node.to_string(), msg));
        Ok(Enqueued::Queued)
    }
    fn is_connected(&self, node: &str) -> bool {
        !self.offline.lock().unwrap().contains(node)
    }
    fn connected_nodes(&self) -> Vec<String> {
        Vec::new()
    }
    fn capabilities(&self, _: &str) -> Option<Capabilities> {
        None
    }
    fn disconnect(&self, _: &str) -> bool {
        false
    }
}

impl Recorder {
    /// `node op resource` of every message sent since the last call.
    fn take(&self) -> Vec<String> {
        self.sent
            .lock()
            .unwrap()
            .drain(..)
            .map(|(n, m)| {
                let what = if m.route.resource == "membership" {
                    if m.content["added_devices"].is_array() {
                        "added".to_string()
                    } else {
                        "removed".to_string()
                    }
                } else {
                    m.route.operation.to_string()
                };
                format!("{n} {what} {}", m.route.resource)
            })
            .collect()
    }
}

fn rig() -> (Arc<Recorder>, Devices, mpsc::Receiver<StatusWrite>) {
    let hub = Arc::new(Recorder::default());
    let (tx, rx) = mpsc::channel(16);
    let mut d = Devices::new(hub.clone(), tx);
    d.apply(Input::ModelsListed);
    d.apply(Input::DevicesListed);
    (hub, d, rx)
}

fn model(name: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "default", "uid": format!("m-{name}"), "resourceVersion": "1"},
        "spec": {"protocol": "modbus", "properties": [{"name": "temperature", "type": "INT"}]}})
}

fn device(name: &str, node: &str, model: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "default", "uid": format!("d-{name}"), "resourceVersion": "2"},
        "spec": {"nodeName": node, "deviceModelRef": {"name": model},
            "properties": [{"name": "temperature"}]}})
}

#[test]
fn a_bound_device_reaches_its_node_with_its_model_once() {
    let (hub, mut d, _rx) = rig();
    d.apply(Input::ModelApplied(model("thermo")));
    assert!(hub.take().is_empty(), "models alone go nowhere");
    d.apply(Input::DeviceApplied(device("t1", "edge-1", "thermo")));
    d.apply(Input::DeviceApplied(device("t2", "edge-1", "thermo")));
    d.apply(Input::DeviceApplied(device("free", "", "thermo")));
    assert_eq!(
        hub.take(),
        [
            "edge-1 added membership",
            "edge-1 insert default/devicemodel/thermo",
            "edge-1 insert default/device/t1",
            "edge-1 added membership",
            "edge-1 insert default/device/t2",
        ]
    );
    // The model goes when its last device on the node goes.
    d.apply(Input::DeviceDeleted(device("t1", "edge-1", "thermo")));
    assert_eq!(
        hub.take(),
        [
            "edge-1 removed membership",
            "edge-1 delete default/device/t1"
        ]
    );
    d.apply(Input::DeviceDeleted(device("t2", "edge-1", "thermo")));
    assert_eq!(
        hub.take(),
        [
            "edge-1 removed membership",
            "edge-1 delete default/devicemodel/thermo",
            "edge-1 delete default/device/t2"
        ]
    );
}

#[test]
fn moving_editing_and_model_changes() {
    let (hub, mut d, _rx) = rig();
    d.apply(Input::ModelApplied(model("thermo")));
    d.apply(Input::DeviceApplied(device("t1", "edge-1", "thermo")));
    hub.take();
    // A status-only change sends nothing; a spec change an update.
    let mut with_status = device("t1", "edge-1", "thermo");
    with_status["status"] = json!({"twins": []});
    d.apply(Input::DeviceApplied(with_status));
    assert!(hub.take().is_empty());
    let mut edited = device("t1", "edge-1", "thermo");
    edited["spec"]["properties"][0]["desired"] = json!({"value": "20"});
    d.apply(Input::DeviceApplied(edited.clone()));
    assert_eq!(hub.take(), ["edge-1 update default/device/t1"]);
    // A model change reaches the node using it.
    let mut m = model("thermo");
    m["spec"]["properties"][0]["unit"] = json!("C");
    d.apply(Input::ModelApplied(m));
    assert_eq!(hub.take(), ["edge-1 update default/devicemodel/thermo"]);
    // Moving: gone from the old node, new on the other.
    edited["spec"]["nodeName"] = json!("edge-2");
    d.apply(Input::DeviceApplied(edited));
    assert_eq!(
        hub.take(),
        [
            "edge-1 removed membership",
            "edge-1 delete default/devicemodel/thermo",
            "edge-1 delete default/device/t1",
            "edge-2 added membership",
            "edge-2 insert default/devicemodel/thermo",
            "edge-2 insert default/device/t1",
        ]
    );
}

#[test]
fn a_model_created_after_its_device_follows_it() {
    let (hub, mut d, _rx) = rig();
    d.apply(Input::DeviceApplied(device("t1", "edge-1", "late")));
    assert_eq!(
        hub.take(),
        ["edge-1 added membership", "edge-1 insert default/device/t1"]
    );
    d.apply(Input::ModelApplied(model("late")));
    assert_eq!(hub.take(), ["edge-1 insert default/devicemodel/late"]);
}

#[test]
fn a_connecting_edge_gets_its_devices_and_loses_what_is_not_its_own() {
    let (hub, mut d, _rx) = rig();
    hub.offline.lock().unwrap().insert("edge-1".into());
    d.apply(Input::ModelApplied(model("thermo")));
    d.apply(Input::DeviceApplied(device("t1", "edge-1", "thermo")));
    assert!(hub.take().is_empty());
    hub.offline.lock().unwrap().clear();
    d.apply(Input::Connected("edge-1".into()));
    assert_eq!(
        hub.take(),
        [
            "edge-1 added membership",
            "edge-1 insert default/devicemodel/thermo",
            "edge-1 insert default/device/t1",
        ]
    );
    let held = |t: ResourceType, name: &str| HeldObject {
        resource_type: t,
        namespace: "default".into(),
        name: name.into(),
        uid: format!("u-{name}"),
        resource_version: 1,
    };
    d.apply(Input::Inventory {
        node: "edge-1".into(),
        held: vec![
            held(ResourceType::Device, "t1"),
            held(ResourceType::Device, "old"),
            held(ResourceType::DeviceModel, "thermo"),
            held(ResourceType::DeviceModel, "unused"),
        ],
    });
    assert_eq!(
        hub.take(),
        [
            "edge-1 removed membership",
            "edge-1 delete default/device/old",
            "edge-1 delete default/devicemodel/unused",
        ]
    );
}

#[test]
fn a_device_gone_during_a_relist_is_deleted_at_its_node() {
    let (hub, mut d, _rx) = rig();
    d.apply(Input::DeviceApplied(device("t1", "edge-1", "m")));
    d.apply(Input::DeviceApplied(device("t2", "edge-1", "m")));
    hub.take();
    d.apply(Input::DevicesRelisting);
    d.apply(Input::DeviceApplied(device("t2", "edge-1", "m")));
    d.apply(Input::DevicesListed);
    assert_eq!(
        hub.take(),
        [
            "edge-1 removed membership",
            "edge-1 delete default/device/t1"
        ]
    );
}

fn report(resource: &str, content: Value) -> Message {
    Message::new(
        "twin",
        Group::Resource,
        Operation::Update,
        resource,
        content,
    )
}

#[test]
fn twin_reports_become_status_writes_only_for_the_bound_node_and_on_change() {
    let (hub, mut d, mut rx) = rig();
    d.apply(Input::DeviceApplied(device("t1", "edge-1", "m")));
    hub.take();
    let r = report(
        "device/t1/twin/edge_updated",
        json!({"event_id": "", "timestamp": 1, "twin": {"temperature": {"actual": {"value": "23"}}}}),
    );
    d.apply(Input::Report {
        node: "edge-1".into(),
        message: Box::new(r.clone()),
    });
    let w = rx.try_recv().expect("a status write");
    assert_eq!(w.key, ("default".to_string(), "t1".to_string()));
    assert_eq!(
        w.patch,
        json!({"status": {"twins": [{"propertyName": "temperature", "reported": {"value": "23"}}]}})
    );
    assert_eq!(w.replies[0].1.header.id, r.header.id);
    // The same value again: answered at once, nothing written.
    d.apply(Input::Report {
        node: "edge-1".into(),
        message: Box::new(r.clone()),
    });
    assert!(rx.try_recv().is_err());
    let sent = hub.sent.lock().unwrap().drain(..).collect::<Vec<_>>();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].1.header.parent_id, r.header.id);
    assert_eq!(sent[0].1.content, json!("OK"));
    // After a failed write the value counts as new again.
    d.apply(Input::WriteFailed(("default".into(), "t1".into())));
    d.apply(Input::Report {
        node: "edge-1".into(),
        message: Box::new(r.clone()),
    });
    assert!(rx.try_recv().is_ok());
    // Another node may not report for it; namespaced IDs work; garbage is dropped.
    d.apply(Input::Report {
        node: "edge-2".into(),
        message: Box::new(report("device/t1/twin/edge_updated", r.content.clone())),
    });
    d.apply(Input::Report {
        node: "edge-1".into(),
        message: Box::new(report("device/t1/twin/edge_updated", json!("{not json"))),
    });
    assert!(rx.try_recv().is_err());
    assert!(hub.take().is_empty());
    let ns = report(
        "device/default/t1/twin/edge_updated",
        json!({"twin": {"temperature": {"actual": {"value": "24"}}}}),
    );
    d.apply(Input::Report {
        node: "edge-1".into(),
        message: Box::new(ns),
    });
    assert!(rx.try_recv().is_ok());
}

#[test]
fn state_reports_and_membership_detail_requests() {
    let (hub, mut d, mut rx) = rig();
    d.apply(Input::DeviceApplied(device("t1", "edge-1", "m")));
    hub.take();
    d.apply(Input::Report {
        node: "edge-1".into(),
        message: Box::new(report(
            "device/t1/state/update",
            json!(r#"{"event_id":"","timestamp":1,"device":{"name":"t1","state":"online","lastOnlineTime":"2026-11-26T12:00:00Z"}}"#),
        )),
    });
    let w = rx.try_recv().unwrap();
    assert_eq!(
        w.patch,
        json!({"status": {"state": "online", "lastOnlineTime": "2026-11-26T12:00:00Z"}})
    );
    let detail = Message::new(
        "twin",
        Group::Resource,
        Operation::Get,
        "membership/detail",
        json!("{}"),
    );
    d.apply(Input::Report {
        node: "edge-1".into(),
        message: Box::new(detail.clone()),
    });
    let sent = hub.sent.lock().unwrap().drain(..).collect::<Vec<_>>();
    assert_eq!(sent[0].1.header.parent_id, detail.header.id);
}

#[test]
fn kubeedge_edges_from_v1_16_get_namespaced_device_ids() {
    assert_eq!(
        IdForm::of_kubelet_version("v1.27.7-kubeedge-v1.17.0"),
        IdForm::Namespaced
    );
    assert_eq!(
        IdForm::of_kubelet_version("v1.26.10-kubeedge-v1.16.1-dirty"),
        IdForm::Namespaced
    );
    assert_eq!(
        IdForm::of_kubelet_version("v1.26.10-kubeedge-v1.15.3"),
        IdForm::Name
    );
    assert_eq!(
        IdForm::of_kubelet_version("v1.29.0-kubeedge-rs-0.1.0"),
        IdForm::Name
    );
    assert_eq!(IdForm::of_kubelet_version("garbage"), IdForm::Name);

    let hub = Arc::new(Recorder::default());
    let (tx, _rx) = mpsc::channel(16);
    let (ltx, mut lrx) = mpsc::unbounded_channel();
    let mut d = Devices::new(hub.clone(), tx).with_lookups(ltx);
    d.apply(Input::ModelsListed);
    d.apply(Input::DevicesListed);
    d.apply(Input::ModelApplied(model("thermostat")));
    d.apply(Input::DeviceApplied(device("t1", "edge-1", "thermostat")));
    // The node's version is asked for once; until it is known, v1.15 IDs.
    assert_eq!(lrx.try_recv().ok().as_deref(), Some("edge-1"));
    let first = hub.sent.lock().unwrap().drain(..).collect::<Vec<_>>();
    assert_eq!(first[0].1.content["added_devices"][0]["id"], "t1");
    d.apply(Input::DeviceApplied(device("t2", "edge-1", "thermostat")));
    assert!(lrx.try_recv().is_err(), "asked again");
    hub.take();

    // A KubeEdge v1.17 edge: its devices are renamed there.
    d.apply(Input::NodeIdForm {
        node: "edge-1".into(),
        form: IdForm::Namespaced,
    });
    let renamed = hub.sent.lock().unwrap().drain(..).collect::<Vec<_>>();
    let ids: Vec<(bool, String)> = renamed
        .iter()
        .map(|(_, m)| {
            let added = m.content["added_devices"].is_array();
            let list = if added {
                "added_devices"
            } else {
                "removed_devices"
            };
            (
                added,
                m.content[list][0]["id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
    for name in ["t1", "t2"] {
        assert!(ids.contains(&(false, name.to_string())), "{ids:?}");
        assert!(ids.contains(&(true, format!("default/{name}"))), "{ids:?}");
    }
    // New devices and reconnects use the namespaced form; a reconnect asks again.
    d.apply(Input::DeviceApplied(device("t3", "edge-1", "thermostat")));
    let m = hub.sent.lock().unwrap().drain(..).next().unwrap().1;
    assert_eq!(m.content["added_devices"][0]["id"], "default/t3");
    d.apply(Input::Connected("edge-1".into()));
    assert_eq!(lrx.try_recv().ok().as_deref(), Some("edge-1"));
    let pushed = hub.sent.lock().unwrap().drain(..).collect::<Vec<_>>();
    assert!(
        pushed
            .iter()
            .any(|(_, m)| m.content["added_devices"][0]["id"] == "default/t1"),
        "a known form does not wait"
    );
    // Same form again: nothing sent.
    d.apply(Input::NodeIdForm {
        node: "edge-1".into(),
        form: IdForm::Namespaced,
    });
    assert!(hub.take().is_empty());

    // A node never looked up (e.g. after a cloudcore restart) waits for its form on connect.
    d.apply(Input::DeviceApplied(device("u1", "edge-2", "thermostat")));
    assert_eq!(lrx.try_recv().ok().as_deref(), Some("edge-2"));
    d.apply(Input::NodeIdForm {
        node: "edge-2".into(),
        form: IdForm::Name,
    });
    hub.take();
    let (hub2, d2) = (hub.clone(), &mut d);
    d2.id_forms.remove("edge-2");
    d2.apply(Input::Connected("edge-2".into()));
    assert_eq!(lrx.try_recv().ok().as_deref(), Some("edge-2"));
    assert!(hub2.take().is_empty(), "nothing before the form is known");
    d2.apply(Input::NodeIdForm {
        node: "edge-2".into(),
        form: IdForm::Namespaced,
    });
    let sent = hub2.sent.lock().unwrap().drain(..).collect::<Vec<_>>();
    assert_eq!(sent[0].1.content["added_devices"][0]["id"], "default/u1");
    assert!(
        !sent
            .iter()
            .any(|(_, m)| m.content["removed_devices"].is_array()),
        "no rename for a push that waited"
    );
}

#[test]
fn with_the_device_status_crd_every_device_gets_one_and_reports_go_to_both() {
    let (hub, mut d, mut rx) = rig();
    let mut with_state = device("t0", "edge-1", "m");
    with_state["status"] = json!({"state": "online", "conditions": []});
    d.apply(Input::DeviceApplied(with_state));
    d.apply(Input::DeviceApplied(device("t1", "edge-1", "m")));
    hub.take();
    // Without the CRD listed: nothing is created, reports go to the Device only.
    assert!(rx.try_recv().is_err());
    // Listed with t1's already there: only t0's is created, with what its Device holds.
    d.apply(Input::StatusesRelisting);
    d.apply(Input::StatusApplied(
        json!({"metadata": {"namespace": "default", "name": "t1"}}),
    ));
    d.apply(Input::StatusesListed);
    let w = rx.try_recv().expect("t0's DeviceStatus");
    assert_eq!(w.key.1, "t0");
    assert!(w.patch.is_null(), "nothing written to the Device");
    assert_eq!(w.status, Some(json!({"status": {"state": "online"}})));
    assert_eq!(w.uid, "d-t0");
    assert!(rx.try_recv().is_err(), "t1 has one");
    // A new device gets one at once.
    d.apply(Input::DeviceApplied(device("t2", "edge-1", "m")));
    assert_eq!(
        rx.try_recv().expect("t2's").status,
        Some(json!({"status": {}}))
    );
    // A twin report is written to both.
    d.apply(Input::Report {
        node: "edge-1".into(),
        message: Box::new(report(
            "device/t1/twin/edge_updated",
            json!({"twin": {"temperature": {"actual": {"value": "23"}}}}),
        )),
    });
    let w = rx.try_recv().expect("a status write");
    let twins = json!({"status": {"twins": [{"propertyName": "temperature", "reported": {"value": "23"}}]}});
    assert_eq!(w.patch, twins);
    assert_eq!(w.status, Some(twins));
    assert_eq!(w.uid, "d-t1");
    // A DeviceStatus deleted by hand is not made again until the next report writes it.
    d.apply(Input::StatusDeleted(
        json!({"metadata": {"namespace": "default", "name": "t1"}}),
    ));
    assert!(rx.try_recv().is_err());
}
