//! What a KubeEdge v1.23 edge expects from the cloud beyond v1.15, with a raw v1.23-shaped
//! edge (its Node reports a `-kubeedge-v1.23` kubelet version) against our cloudcore: its own
//! Node pushed as `update` on `null/node/<name>` — on connect and when the Node changes —
//! since v1.23 edges read their Node from their database.

use e2e::channel::{Pki, RawEdge};
use e2e::cloud::CloudFixture;
use e2e::edge::{WAIT, init_logs, node_name};
use e2e::sim_edge::{delete_node, edge_node};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kubeedge_shared::{Group, Message, Operation};
use serde_json::json;
use std::time::Duration;

/// The next `node` message for `name`, ACKing resource messages on the way.
async fn next_node_message(edge: &mut RawEdge, name: &str) -> Message {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Node pushed to the v1.23 edge"
        );
        if let Ok(Some(m)) = edge.recv(Duration::from_millis(500)).await {
            if m.route.resource == format!("null/node/{name}") {
                return m;
            }
            if m.route.group == Group::Resource && m.route.operation != Operation::Response {
                edge.ack(&m).await.unwrap();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kubeedge_v1_23_edge_gets_its_node_on_connect_and_on_change() {
    init_logs();
    let cluster = e2e::cluster::connect().await.expect("test cluster");
    let pki = Pki::new().expect("test PKI");
    let cloud = CloudFixture::start(cluster.client(), &pki)
        .await
        .expect("cloudcore starts");
    let node = node_name("ke23-node");
    edge_node(&cluster, &node).await;
    let nodes = Api::<Node>::all(cluster.client());
    nodes
        .patch_status(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeInfo": {
                "kubeletVersion": "v1.31.12-kubeedge-v1.23.1", "machineID": "", "systemUUID": "",
                "bootID": "", "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}}})),
        )
        .await
        .expect("node status");
    // Let the cloud's node watch see the version before the edge connects.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tls = pki.edge_tls(&pki.node_cert(&node).unwrap()).unwrap();
    let mut edge = RawEdge::connect(cloud.hub.local_addr(), &node, tls)
        .await
        .expect("connects");

    let m = next_node_message(&mut edge, &node).await;
    assert_eq!(m.route.operation, Operation::Update);
    assert_eq!(m.route.source, "edgecontroller");
    assert_eq!(m.route.group, Group::Resource);
    assert_eq!(
        m.content["kind"], "Node",
        "v1.23 edges need the kind: {m:?}"
    );
    assert_eq!(m.content["apiVersion"], "v1");
    assert_eq!(m.content["metadata"]["name"], node.as_str());
    let rv = m.content["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(m.header.resource_version, rv);

    // A label added in the cluster reaches the edge's copy.
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"e2e.kubeedge-rs/zone": "b"}}})),
        )
        .await
        .expect("label the node");
    let m = next_node_message(&mut edge, &node).await;
    assert_eq!(
        m.content["metadata"]["labels"]["e2e.kubeedge-rs/zone"], "b",
        "{m:?}"
    );
    drop(edge);
    delete_node(&cluster, &node).await;
}
