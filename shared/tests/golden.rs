//! Golden tests: the exact frames of `docs/kubeedge-protocol.md` (as Go writes them, with
//! `\u003c` escapes and gorilla's trailing newline) decode, and re-encode with KubeEdge's key
//! order and omissions. Content maps are written with sorted keys, as Go writes maps.

use kubeedge_shared::content::{self, ObjectResp, StatusError};
use kubeedge_shared::{FrameCodec, Group, Message, Operation, ResourcePath};
use serde_json::json;

fn round_trip(go_frame: &str, expected: &str) -> Message {
    let codec = FrameCodec::default();
    let msg = codec
        .decode(go_frame.as_bytes())
        .expect("golden frame decodes");
    let again = codec.encode(&msg).expect("re-encodes");
    assert_eq!(again, expected, "re-encoded frame differs");
    assert_eq!(codec.decode(again.as_bytes()).unwrap(), msg);
    msg
}

#[test]
fn pod_insert_from_edgecontroller() {
    let go = concat!(
        r#"{"header":{"msg_id":"8f0f1b5e-3a1c-4c59-9a0e-2f1e0b7c6d11","timestamp":1718000000123,"resourceversion":"48213"},"#,
        r#""route":{"source":"edgecontroller","group":"resource","operation":"insert","resource":"default/pod/nginx"},"#,
        r#""content":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"nginx","namespace":"default","uid":"0b2c","resourceVersion":"48213","annotations":{"note":"\u003cb\u003e \u0026"}},"spec":{"nodeName":"edge-1"},"status":{}}}"#,
        "\n"
    );
    let expected = concat!(
        r#"{"header":{"msg_id":"8f0f1b5e-3a1c-4c59-9a0e-2f1e0b7c6d11","timestamp":1718000000123,"resourceversion":"48213"},"#,
        r#""route":{"source":"edgecontroller","group":"resource","operation":"insert","resource":"default/pod/nginx"},"#,
        r#""content":{"apiVersion":"v1","kind":"Pod","metadata":{"annotations":{"note":"<b> &"},"name":"nginx","namespace":"default","resourceVersion":"48213","uid":"0b2c"},"spec":{"nodeName":"edge-1"},"status":{}}}"#
    );
    let msg = round_trip(go, expected);
    assert_eq!(msg.route.operation, Operation::Insert);
    assert_eq!(msg.route.group, Group::Resource);
    assert_eq!(msg.header.timestamp, 1_718_000_000_123);
    assert_eq!(msg.header.resource_version, "48213");
    assert_eq!(msg.object_uid(), Some("0b2c"));
    assert!(msg.requires_ack());
    let path = msg.resource_path().unwrap();
    assert_eq!(
        path,
        ResourcePath::new(Some("default"), "pod", Some("nginx"))
    );
}

#[test]
fn pod_update_after_binding() {
    let go = r#"{"header":{"msg_id":"C","timestamp":1718000000200,"resourceversion":"1234"},"route":{"source":"edgecontroller","group":"resource","operation":"update","resource":"default/pod/web-0"},"content":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-0","uid":"u-web"}}}"#;
    let msg = round_trip(go, go);
    assert_eq!(msg.route.operation, Operation::Update);
    assert!(msg.requires_ack());
}

#[test]
fn edge_ack() {
    let go = "{\"header\":{\"msg_id\":\"D\",\"parent_msg_id\":\"C\",\"timestamp\":1718000000456},\"route\":{\"source\":\"edgecontroller\",\"group\":\"resource\",\"operation\":\"response\",\"resource\":\"default/pod/web-0\"},\"content\":\"OK\"}\n";
    let msg = round_trip(go, go.trim_end());
    assert_eq!(msg.parent_id(), "C");
    assert!(content::is_ok(&msg.content));
    // An ACK we build for the same request has exactly this shape.
    let req = FrameCodec::default()
        .decode(br#"{"header":{"msg_id":"C","timestamp":1},"route":{"source":"edgecontroller","group":"resource","operation":"update","resource":"default/pod/web-0"},"content":{}}"#)
        .unwrap();
    let mut ours = Message::ack_for(&req);
    ours.header.id = "D".into();
    ours.header.timestamp = 1_718_000_000_456;
    assert_eq!(FrameCodec::default().encode(&ours).unwrap(), go.trim_end());
}

#[test]
fn keepalive() {
    let go = r#"{"header":{"msg_id":"k1","timestamp":1718000000000},"route":{"source":"websocket","group":"resource","operation":"keepalive","resource":"node"},"content":"ping"}"#;
    let msg = round_trip(go, go);
    assert_eq!(msg.route.operation, Operation::Keepalive);
    let mut ours = Message::keepalive();
    ours.header.id = "k1".into();
    ours.header.timestamp = 1_718_000_000_000;
    assert_eq!(FrameCodec::default().encode(&ours).unwrap(), go);
}

#[test]
fn node_registration_and_reply() {
    let req = r#"{"header":{"msg_id":"A","timestamp":1718000000000},"route":{"source":"edged","group":"meta","operation":"insert","resource":"default/node/edge-1"},"content":{"metadata":{"labels":{"node-role.kubernetes.io/edge":""},"name":"edge-1"}}}"#;
    let msg = round_trip(req, req);
    assert_eq!(msg.route.group, Group::Meta);

    let reply = r#"{"header":{"msg_id":"B","parent_msg_id":"A","timestamp":1718000000010},"route":{"source":"edgecontroller","group":"resource","operation":"response","resource":"default/node/edge-1"},"content":{"Err":null,"Object":{"kind":"Node","metadata":{"name":"edge-1"}}}}"#;
    let msg = round_trip(reply, reply);
    let resp = ObjectResp::from_content(&msg.content).unwrap();
    assert_eq!(resp.object.unwrap()["kind"], "Node");
    assert!(resp.err.is_none());
    assert!(!msg.requires_ack(), "node replies are NO-ACK");

    let exists = r#"{"header":{"msg_id":"B2","parent_msg_id":"A","timestamp":1718000000010},"route":{"source":"edgecontroller","group":"resource","operation":"response","resource":"default/node/edge-1"},"content":{"Err":{"ErrStatus":{"code":409,"details":{"kind":"nodes","name":"edge-1"},"message":"nodes \"edge-1\" already exists","metadata":{},"reason":"AlreadyExists","status":"Failure"}},"Object":null}}"#;
    let msg = round_trip(exists, exists);
    let resp = ObjectResp::from_content(&msg.content).unwrap();
    assert!(resp.object.is_none());
    assert_eq!(resp.err.as_ref().unwrap().reason(), "AlreadyExists");
    assert_eq!(
        resp.to_value(),
        ObjectResp::error(StatusError::already_exists("nodes", "edge-1")).to_value()
    );
}

#[test]
fn error_reply_and_status_error_content() {
    let go = r#"{"header":{"msg_id":"E","parent_msg_id":"Q","timestamp":1718000000010},"route":{"source":"edgecontroller","group":"resource","operation":"response","resource":"default/configmap/missing"},"content":{"ErrStatus":{"code":404,"details":{"kind":"configmaps","name":"missing"},"message":"configmaps \"missing\" not found","metadata":{},"reason":"NotFound","status":"Failure"}}}"#;
    let msg = round_trip(go, go);
    let err = StatusError::from_content(&msg.content).unwrap();
    assert_eq!(err.code(), 404);
    assert_eq!(
        err.to_value(),
        StatusError::not_found("configmaps", "missing").to_value()
    );
    assert!(!msg.requires_ack(), "error replies are NO-ACK");

    let op_error = r#"{"header":{"msg_id":"F","parent_msg_id":"Q","timestamp":1},"route":{"source":"metamanager","group":"meta","operation":"error","resource":"default/node/edge-1"},"content":"failed to process remote: not connected"}"#;
    let msg = round_trip(op_error, op_error);
    assert_eq!(msg.route.operation, Operation::Error);
}

#[test]
fn query_reply_from_edge_database_and_cloud() {
    let db = r#"{"header":{"msg_id":"R","parent_msg_id":"Q","timestamp":1},"route":{"source":"metamanager","group":"meta","operation":"response","resource":"default/configmap/cfg"},"content":["{\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"cfg\"}}"]}"#;
    let msg = round_trip(db, db);
    let objs = content::parse_query_reply(&msg.content).unwrap();
    assert_eq!(
        objs,
        vec![json!({"kind":"ConfigMap","metadata":{"name":"cfg"}})]
    );

    let cloud = r#"{"header":{"msg_id":"R2","parent_msg_id":"Q","timestamp":1,"resourceversion":"77"},"route":{"source":"edgecontroller","group":"resource","operation":"response","resource":"default/configmap/cfg"},"content":{"data":{"k":"v"},"kind":"ConfigMap","metadata":{"name":"cfg","uid":"c1"}}}"#;
    let msg = round_trip(cloud, cloud);
    assert!(
        msg.requires_ack(),
        "configmap query replies carry an object and need an ACK"
    );
    assert_eq!(
        content::parse_query_reply(&msg.content).unwrap()[0]["data"]["k"],
        "v"
    );
}

#[test]
fn pod_status_patch_carried_as_string() {
    let go = r#"{"header":{"msg_id":"P","timestamp":1},"route":{"source":"edged","group":"meta","operation":"patch","resource":"default/podpatch/web-0"},"content":"{\"status\":{\"phase\":\"Running\"}}"}"#;
    let msg = round_trip(go, go);
    let patch = content::content_json(&msg.content).unwrap();
    assert_eq!(patch["status"]["phase"], "Running");
}

#[test]
fn unknown_operation_and_extra_fields_survive() {
    let go = r#"{"header":{"msg_id":"X","timestamp":5,"sync":true,"type":"channel"},"route":{"source":"s","destination":"d","group":"mystery","operation":"frobnicate","resource":"a/b"},"content":null}"#;
    let msg = round_trip(go, go);
    assert_eq!(msg.route.operation, Operation::Other("frobnicate".into()));
    assert_eq!(msg.route.group, Group::Other("mystery".into()));
}
