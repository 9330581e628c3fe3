//! cloudcore's controllers against a Kubernetes API (in-memory, or a real cluster with
//! `E2E_KUBECONFIG`) with simulated edges that speak the real protocol.

use e2e::channel::Pki;
use e2e::cloud::CloudFixture;
use e2e::cluster::{self, TestCluster};
use e2e::sim_edge::{SimEdge, WAIT, delete_node, edge_node, unique};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kubeedge_shared::content::{ObjectResp, patch_content};
use kubeedge_shared::{Group, Message, Operation};
use serde_json::{Value, json};
use std::time::Duration;

fn pod_spec(name: &str, node: &str, configmap: Option<&str>) -> Pod {
    let mut p = json!({
        "metadata": {"name": name, "labels": {"app": "t"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
    });
    if let Some(cm) = configmap {
        p["spec"]["volumes"] = json!([{"name": "cfg", "configMap": {"name": cm}}]);
    }
    serde_json::from_value(p).unwrap()
}

struct Setup {
    cluster: TestCluster,
    pki: Pki,
    fx: CloudFixture,
    ns: String,
}

async fn setup() -> Setup {
    let cluster = cluster::connect().await.expect("cluster");
    let ns = cluster.temp_namespace("ctl").await.expect("namespace");
    let pki = Pki::new().unwrap();
    let fx = CloudFixture::start(cluster.client(), &pki)
        .await
        .expect("cloudcore");
    Setup {
        cluster,
        pki,
        fx,
        ns,
    }
}

#[tokio::test]
async fn pod_bound_to_an_edge_node_reaches_that_node_and_no_other() {
    let s = setup().await;
    let (n1, n2) = (unique("edge-a"), unique("edge-b"));
    edge_node(&s.cluster, &n1).await;
    edge_node(&s.cluster, &n2).await;
    let mut e1 = SimEdge::connect(&s.fx, &s.pki, &n1, &[]).await;
    let mut e2 = SimEdge::connect(&s.fx, &s.pki, &n2, &[]).await;
    let pods: Api<Pod> = Api::namespaced(s.cluster.client(), &s.ns);
    let created = pods
        .create(&PostParams::default(), &pod_spec("web", &n1, None))
        .await
        .unwrap();
    let resource = format!("{}/pod/web", s.ns);
    let m = e1.expect(Operation::Insert, &resource).await;
    assert_eq!(m.content["kind"], "Pod");
    assert_eq!(m.content["apiVersion"], "v1");
    assert_eq!(m.content["metadata"]["uid"], json!(created.metadata.uid));
    assert_eq!(
        Some(m.header.resource_version.clone()),
        created.metadata.resource_version
    );
    assert!(
        e2.drain(Duration::from_millis(700))
            .await
            .iter()
            .all(|m| !m.route.resource.contains("/pod/")),
        "other node got nothing"
    );

    // A status-only change is not sent; a label change is.
    let status = json!({"status": {"phase": "Running"}});
    pods.patch_status("web", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let labels = json!({"metadata": {"labels": {"v": "2"}}});
    pods.patch("web", &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .unwrap();
    let m = e1.expect(Operation::Update, &resource).await;
    assert_eq!(m.content["metadata"]["labels"]["v"], "2");
    let extra = e1.drain(Duration::from_millis(500)).await;
    assert!(
        extra.iter().all(|m| m.route.resource != resource),
        "status-only change was not sent: {extra:?}"
    );

    // Deletion of a bound pod: first a terminating update, then (after grace 0) a delete.
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    let m = e1.expect(Operation::Update, &resource).await;
    assert!(m.content["metadata"]["deletionTimestamp"].is_string());
    pods.delete(
        "web",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    e1.expect(Operation::Delete, &resource).await;
    delete_node(&s.cluster, &n1).await;
    delete_node(&s.cluster, &n2).await;
}

/// The control plane's scheduler and Deployment controller put a Deployment's pods on the edge
/// node its affinity names (matchFields `metadata.name`), and cloudcore delivers them there.
#[tokio::test]
async fn deployment_pods_are_scheduled_onto_the_edge_node_and_reach_it() {
    let s = setup().await;
    let node = unique("edge-d");
    edge_node(&s.cluster, &node).await;
    let nodes: Api<Node> = Api::all(s.cluster.client());
    let capacity = json!({"status": {"allocatable": {"cpu": "2", "memory": "2Gi", "pods": "110"},
        "capacity": {"cpu": "2", "memory": "2Gi", "pods": "110"}}});
    nodes
        .patch_status(&node, &PatchParams::default(), &Patch::Merge(&capacity))
        .await
        .unwrap();
    let mut edge = SimEdge::connect(&s.fx, &s.pki, &node, &[]).await;
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
                "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "c", "image": "busybox"}]}}}
    });
    let api: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(s.cluster.client(), &s.ns);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(deployment).unwrap(),
    )
    .await
    .unwrap();
    let mut delivered = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while delivered.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {delivered:?} reached the edge"
        );
        let Some(m) = edge.next(Duration::from_millis(500)).await else {
            continue;
        };
        if m.route.operation == Operation::Insert
            && m.route.resource.starts_with(&format!("{}/pod/web-", s.ns))
        {
            assert_eq!(m.content["spec"]["nodeName"], json!(node));
            assert_eq!(
                m.content["metadata"]["ownerReferences"][0]["kind"],
                "ReplicaSet"
            );
            delivered.insert(m.route.resource.clone());
        }
    }
    api.delete("web", &DeleteParams::default()).await.unwrap();
    delete_node(&s.cluster, &node).await;
}

#[tokio::test]
async fn configmap_update_reaches_only_nodes_whose_pods_use_it() {
    let s = setup().await;
    let (n1, n2) = (unique("edge-a"), unique("edge-b"));
    edge_node(&s.cluster, &n1).await;
    edge_node(&s.cluster, &n2).await;
    let cms: Api<ConfigMap> = Api::namespaced(s.cluster.client(), &s.ns);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"k": "1"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let mut e1 = SimEdge::connect(&s.fx, &s.pki, &n1, &[]).await;
    let mut e2 = SimEdge::connect(&s.fx, &s.pki, &n2, &[]).await;
    let pods: Api<Pod> = Api::namespaced(s.cluster.client(), &s.ns);
    pods.create(
        &PostParams::default(),
        &pod_spec("uses-cfg", &n1, Some("cfg")),
    )
    .await
    .unwrap();
    pods.create(&PostParams::default(), &pod_spec("plain", &n2, None))
        .await
        .unwrap();
    e1.expect(Operation::Insert, &format!("{}/pod/uses-cfg", s.ns))
        .await;
    e2.expect(Operation::Insert, &format!("{}/pod/plain", s.ns))
        .await;

    let patch = json!({"data": {"k": "2"}});
    cms.patch("cfg", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let m = e1
        .expect(Operation::Update, &format!("{}/configmap/cfg", s.ns))
        .await;
    assert_eq!(m.content["data"]["k"], "2");
    assert_eq!(m.content["kind"], "ConfigMap");
    let seen = e2.drain(Duration::from_millis(700)).await;
    assert!(
        seen.iter().all(|m| !m.route.resource.contains("configmap")),
        "{seen:?}"
    );

    // Once the pod is gone, the node is told to drop its copy (nothing would keep it
    // fresh), and no longer gets the configmap.
    pods.delete(
        "uses-cfg",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    e1.expect(Operation::Delete, &format!("{}/pod/uses-cfg", s.ns))
        .await;
    let dropped = e1
        .expect(Operation::Delete, &format!("{}/configmap/cfg", s.ns))
        .await;
    let uid = cms.get("cfg").await.unwrap().metadata.uid.unwrap();
    assert_eq!(dropped.content["metadata"]["uid"], uid.as_str());
    let patch = json!({"data": {"k": "3"}});
    cms.patch("cfg", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let seen = e1.drain(Duration::from_millis(700)).await;
    assert!(
        seen.iter()
            .all(|m| !(m.route.resource.contains("configmap/cfg")
                && m.route.operation != Operation::Delete)),
        "{seen:?}"
    );
    delete_node(&s.cluster, &n1).await;
    delete_node(&s.cluster, &n2).await;
}

#[tokio::test]
async fn edge_reports_land_in_the_cluster() {
    let s = setup().await;
    let node = unique("edge");
    let mut e = SimEdge::connect(&s.fx, &s.pki, &node, &[]).await;

    // Node registration: ObjectResp with the created node; a second time AlreadyExists.
    let reg = Message::new(
        "edged",
        Group::Meta,
        Operation::Insert,
        format!("default/node/{node}"),
        json!({"metadata": {"name": node, "labels": {"node-role.kubernetes.io/edge": ""}}}),
    );
    let reply = e.request(&reg).await;
    let resp = ObjectResp::from_content(&reply.content).expect("ObjectResp");
    assert!(resp.err.is_none(), "{resp:?}");
    assert_eq!(resp.object.unwrap()["metadata"]["name"], json!(node));
    let again = e
        .request(&Message::new(
            "edged",
            Group::Meta,
            Operation::Insert,
            format!("default/node/{node}"),
            json!({"metadata": {"name": node}}),
        ))
        .await;
    assert_eq!(
        ObjectResp::from_content(&again.content)
            .unwrap()
            .err
            .unwrap()
            .reason(),
        "AlreadyExists"
    );

    // Node status patch (a JSON string, as the kubelet sends it).
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
        "lastHeartbeatTime": "2026-11-21T00:00:00Z", "lastTransitionTime": "2026-11-21T00:00:00Z"}]}});
    let reply = e
        .request(&Message::new(
            "edged",
            Group::Meta,
            Operation::Patch,
            format!("default/nodepatch/{node}"),
            patch_content(&patch),
        ))
        .await;
    assert!(
        ObjectResp::from_content(&reply.content)
            .unwrap()
            .err
            .is_none()
    );
    let n = Api::<Node>::all(s.cluster.client())
        .get(&node)
        .await
        .unwrap();
    let ready = n
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True");

    // Lease create and renew.
    let lease = json!({"metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": "2026-11-21T00:00:00.000000Z"}});
    let reply = e
        .request(&Message::new(
            "edged",
            Group::Meta,
            Operation::Insert,
            format!("kube-node-lease/lease/{node}"),
            lease,
        ))
        .await;
    let created = ObjectResp::from_content(&reply.content)
        .unwrap()
        .object
        .expect("lease created");
    let mut renewed = created.clone();
    renewed["spec"]["renewTime"] = json!("2026-11-21T00:00:10.000000Z");
    let reply = e
        .request(&Message::new(
            "edged",
            Group::Meta,
            Operation::Update,
            format!("kube-node-lease/lease/{node}"),
            renewed,
        ))
        .await;
    assert!(
        ObjectResp::from_content(&reply.content)
            .unwrap()
            .err
            .is_none(),
        "{:?}",
        reply.content
    );
    let l = Api::<Lease>::namespaced(s.cluster.client(), "kube-node-lease")
        .get(&node)
        .await
        .unwrap();
    assert_eq!(
        l.spec.unwrap().holder_identity.as_deref(),
        Some(node.as_str())
    );

    // Pod status patch from the edge lands on the pod; the reply carries the pod.
    // (Pod `p` uses configmap `q`, pod `m` the configmap `missing`: an edge may read only what
    // its pods use.)
    let pods = Api::<Pod>::namespaced(s.cluster.client(), &s.ns);
    for (name, cm) in [("p", "q"), ("m", "missing")] {
        pods.create(&PostParams::default(), &pod_spec(name, &node, Some(cm)))
            .await
            .unwrap();
    }
    e.expect_all(&[
        (Operation::Insert, format!("{}/pod/p", s.ns)),
        (Operation::Insert, format!("{}/pod/m", s.ns)),
    ])
    .await;
    let status = json!({"status": {"phase": "Running", "podIP": "10.88.0.5"}});
    let reply = e
        .request(&Message::new(
            "edged",
            Group::Meta,
            Operation::Patch,
            format!("{}/podpatch/p", s.ns),
            patch_content(&status),
        ))
        .await;
    let resp = ObjectResp::from_content(&reply.content).unwrap();
    assert_eq!(resp.object.unwrap()["status"]["phase"], "Running");
    let p = Api::<Pod>::namespaced(s.cluster.client(), &s.ns)
        .get("p")
        .await
        .unwrap();
    assert_eq!(p.status.unwrap().pod_ip.as_deref(), Some("10.88.0.5"));

    // Queries: a configmap comes back bare, with its RV, and needs an ACK; a missing one is a
    // NotFound StatusError.
    let cms: Api<ConfigMap> = Api::namespaced(s.cluster.client(), &s.ns);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "q"}, "data": {"a": "b"}})).unwrap();
    let cm = cms.create(&PostParams::default(), &cm).await.unwrap();
    let reply = e
        .request(&Message::new(
            "edged",
            Group::Meta,
            Operation::Query,
            format!("{}/configmap/q", s.ns),
            Value::Null,
        ))
        .await;
    assert_eq!(reply.content["data"]["a"], "b");
    assert_eq!(
        Some(reply.header.resource_version.clone()),
        cm.metadata.resource_version
    );
    assert!(reply.requires_ack());
    let reply = e
        .request(&Message::new(
            "edged",
            Group::Meta,
            Operation::Query,
            format!("{}/configmap/missing", s.ns),
            Value::Null,
        ))
        .await;
    assert_eq!(reply.content["ErrStatus"]["code"], 404);
    // A configmap no pod of this node uses is not this node's to read (the Node authorizer's
    // rule for kubelets; KubeEdge v1.15 would hand it out).
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "unused"}})).unwrap(),
    )
    .await
    .unwrap();
    let reply = e
        .request(&Message::new(
            "edged",
            Group::Meta,
            Operation::Query,
            format!("{}/configmap/unused", s.ns),
            Value::Null,
        ))
        .await;
    assert_eq!(
        reply.content["ErrStatus"]["code"], 403,
        "{:?}",
        reply.content
    );

    // Pod deletion by the edge, with the UID precondition.
    let uid = p.metadata.uid.clone().unwrap();
    let del = Message::new(
        "edged",
        Group::Meta,
        Operation::Delete,
        format!("{}/pod/p", s.ns),
        json!({"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}),
    );
    let reply = e.request(&del).await;
    assert_eq!(reply.content, json!("OK"));
    assert!(
        Api::<Pod>::namespaced(s.cluster.client(), &s.ns)
            .get_opt("p")
            .await
            .unwrap()
            .is_none()
    );
    delete_node(&s.cluster, &node).await;
}

#[tokio::test]
async fn changes_made_while_offline_converge_on_reconnect_without_duplicates() {
    let s = setup().await;
    let node = unique("edge");
    edge_node(&s.cluster, &node).await;
    let pods: Api<Pod> = Api::namespaced(s.cluster.client(), &s.ns);
    let caps = ["inventory-resync"];
    let mut e = SimEdge::connect(&s.fx, &s.pki, &node, &caps).await;
    // An inventory-capable edge sends its (empty) inventory first.
    let inv = Message::new(
        "metamanager",
        Group::Resource,
        Operation::Update,
        format!("default/inventory/{node}"),
        json!({"objects": []}),
    );
    e.raw.send(&inv).await.unwrap();
    let a = pods
        .create(&PostParams::default(), &pod_spec("a", &node, None))
        .await
        .unwrap();
    let b = pods
        .create(&PostParams::default(), &pod_spec("b", &node, None))
        .await
        .unwrap();
    let unchanged = pods
        .create(&PostParams::default(), &pod_spec("same", &node, None))
        .await
        .unwrap();
    for n in ["a", "b", "same"] {
        e.expect(Operation::Insert, &format!("{}/pod/{n}", s.ns))
            .await;
    }
    drop(e);
    let deadline = tokio::time::Instant::now() + WAIT;
    while s.fx.hub.is_connected(&node) {
        assert!(tokio::time::Instant::now() < deadline, "session ends");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Offline: a changes, b goes away, c appears.
    let labels = json!({"metadata": {"labels": {"changed": "yes"}}});
    pods.patch("a", &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .unwrap();
    pods.delete(
        "b",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    pods.create(&PostParams::default(), &pod_spec("c", &node, None))
        .await
        .unwrap();

    let mut e = SimEdge::connect(&s.fx, &s.pki, &node, &caps).await;
    let held = |p: &Pod| {
        json!({"type": "pod", "key": format!("{}/pod/{}", s.ns, p.metadata.name.as_deref().unwrap()),
        "uid": p.metadata.uid, "resourceVersion": p.metadata.resource_version})
    };
    let inv = Message::new(
        "metamanager",
        Group::Resource,
        Operation::Update,
        format!("default/inventory/{node}"),
        json!({"objects": [held(&a), held(&b), held(&unchanged)]}),
    );
    e.raw.send(&inv).await.unwrap();
    let got = e.drain(Duration::from_secs(2)).await;
    let summary: Vec<(String, String)> = got
        .iter()
        .map(|m| (m.route.operation.to_string(), m.route.resource.clone()))
        .collect();
    let count = |op: &str, name: &str| {
        summary
            .iter()
            .filter(|(o, r)| o == op && *r == format!("{}/pod/{name}", s.ns))
            .count()
    };
    assert_eq!(count("update", "a"), 1, "{summary:?}");
    assert_eq!(count("delete", "b"), 1, "{summary:?}");
    assert_eq!(
        count("update", "c") + count("insert", "c"),
        1,
        "{summary:?}"
    );
    assert!(
        summary.iter().all(|(_, r)| !r.ends_with("/pod/same")),
        "unchanged pod not resent: {summary:?}"
    );
    let a_msg = got
        .iter()
        .find(|m| m.route.resource.ends_with("/pod/a"))
        .unwrap();
    assert_eq!(a_msg.content["metadata"]["labels"]["changed"], "yes");
    delete_node(&s.cluster, &node).await;
}

#[tokio::test]
async fn kubeedge_edge_without_inventory_gets_everything_it_should_hold_on_connect() {
    let s = setup().await;
    let node = unique("edge");
    edge_node(&s.cluster, &node).await;
    let pods: Api<Pod> = Api::namespaced(s.cluster.client(), &s.ns);
    pods.create(&PostParams::default(), &pod_spec("early", &node, None))
        .await
        .unwrap();
    // Give the informer a moment to see the pod before the edge connects.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut e = SimEdge::connect(&s.fx, &s.pki, &node, &[]).await;
    let m = e
        .expect(Operation::Update, &format!("{}/pod/early", s.ns))
        .await;
    assert_eq!(m.content["spec"]["nodeName"], json!(node));
    delete_node(&s.cluster, &node).await;
}

#[tokio::test]
async fn deleting_the_node_ends_its_session() {
    let s = setup().await;
    let node = unique("edge");
    edge_node(&s.cluster, &node).await;
    let mut e = SimEdge::connect(&s.fx, &s.pki, &node, &[]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    delete_node(&s.cluster, &node).await;
    assert!(
        e.raw.closed_within(WAIT).await,
        "session closed after the node was deleted"
    );
}

/// What a KubeEdge v1.15 edgecore's embedded kubelet sends beyond the basics, with the reply
/// and side effects KubeEdge's `cloud/pkg/edgecontroller/controller/upstream.go` produces.
#[tokio::test]
async fn kubeedge_kubelet_reports_keep_what_the_cloud_owns() {
    let s = setup().await;
    let node = unique("edge");
    let mut e = SimEdge::connect(&s.fx, &s.pki, &node, &[]).await;

    // `registerNode` names the node after the resource, not the content.
    let reg = Message::new(
        "edged",
        Group::Meta,
        Operation::Insert,
        format!("default/node/{node}"),
        json!({"metadata": {"name": "not-this-name", "labels": {"node-role.kubernetes.io/edge": ""}},
            "status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": 10350}}}}),
    );
    let reply = e.request(&reg).await;
    let created = ObjectResp::from_content(&reply.content).expect("ObjectResp");
    assert!(created.err.is_none(), "{created:?}");
    assert_eq!(created.object.unwrap()["metadata"]["name"], json!(node));
    let nodes = Api::<Node>::all(s.cluster.client());
    assert!(nodes.get_opt("not-this-name").await.unwrap().is_none());

    // cloudstream points the kubelet port at its tunnel port ...
    let mut n = nodes.get_status(&node).await.unwrap();
    n.status
        .as_mut()
        .unwrap()
        .daemon_endpoints
        .get_or_insert_with(Default::default)
        .kubelet_endpoint
        .get_or_insert_with(Default::default)
        .port = 10351;
    nodes
        .replace_status(&node, &PostParams::default(), &n)
        .await
        .unwrap();
    // ... and the kubelet's status patch (a JSON string, its DaemonEndpoints setter resetting
    // the port to its own) must not undo that (KubeEdge issue #4310).
    let patch = r#"{"status":{"$setElementOrder/conditions":[{"type":"Ready"}],"conditions":[{"lastHeartbeatTime":"2026-11-21T00:00:10Z","lastTransitionTime":"2026-11-21T00:00:10Z","reason":"KubeletReady","status":"True","type":"Ready"}],"daemonEndpoints":{"kubeletEndpoint":{"Port":10350}}}}"#;
    let reply = e
        .request(&Message::new(
            "edged",
            Group::Meta,
            Operation::Patch,
            format!("default/nodepatch/{node}"),
            Value::String(patch.into()),
        ))
        .await;
    let patched = ObjectResp::from_content(&reply.content).unwrap();
    assert!(patched.err.is_none(), "{patched:?}");
    let status = nodes.get_status(&node).await.unwrap().status.unwrap();
    assert_eq!(
        status
            .daemon_endpoints
            .unwrap()
            .kubelet_endpoint
            .unwrap()
            .port,
        10351
    );
    assert_eq!(status.conditions.unwrap()[0].status, "True");

    // Legacy `podstatus` for a pod the cluster does not have: "OK", and the pod is deleted on
    // the edge, carrying the UID the edge holds.
    let report = Message::new(
        "edged",
        Group::Meta,
        Operation::Update,
        format!("{}/podstatus/gone", s.ns),
        json!({"UID": "uid-on-edge", "Name": "gone", "Status": {"phase": "Running"}}),
    );
    e.raw.send(&report).await.unwrap();
    let got = e
        .expect_all(&[
            (Operation::Response, format!("{}/podstatus/gone", s.ns)),
            (Operation::Delete, format!("{}/pod/gone", s.ns)),
        ])
        .await;
    assert_eq!(got[0].header.parent_id, report.header.id);
    assert_eq!(got[0].content, json!("OK"));
    assert!(got[1].header.parent_id.is_empty());
    assert_eq!(got[1].content["metadata"]["uid"], "uid-on-edge");
    assert_eq!(got[1].content["kind"], "Pod");

    // A projected token: the kubelet's TokenRequest as Go marshals it (no TypeMeta, zero
    // status), in `<ns>/serviceaccounttoken/<sa>`; the reply is the bare TokenRequest
    // (`handleServiceAccountTokenFromMetaManager`) and needs no ACK (`noAckRequired`).
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "runner"}})).unwrap();
    Api::<ServiceAccount>::namespaced(s.cluster.client(), &s.ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    // The kubelet binds it to the pod (`getServiceAccountTokenRequest`); only a pod bound to
    // this node, running as that service account, gets one.
    let mut tok = pod_spec("tok", &node, None);
    tok.spec.as_mut().unwrap().service_account_name = Some("runner".into());
    let tok = Api::<Pod>::namespaced(s.cluster.client(), &s.ns)
        .create(&PostParams::default(), &tok)
        .await
        .unwrap();
    let tr = json!({"metadata": {"creationTimestamp": null},
        "spec": {"audiences": ["https://kubernetes.default.svc.cluster.local"], "expirationSeconds": 3607,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "tok", "uid": tok.metadata.uid}},
        "status": {"token": "", "expirationTimestamp": null}});
    let reply = e
        .request(&Message::new(
            "edged",
            Group::Meta,
            Operation::Query,
            format!("{}/serviceaccounttoken/runner", s.ns),
            tr.clone(),
        ))
        .await;
    assert!(
        reply.content["status"]["token"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{}",
        reply.content
    );
    assert!(!reply.requires_ack());
    // Another service account's token, or one bound to no pod, is refused.
    for (sa, bound) in [
        ("default", tr["spec"]["boundObjectRef"].clone()),
        ("runner", Value::Null),
    ] {
        let mut other = tr.clone();
        other["spec"]["boundObjectRef"] = bound;
        let reply = e
            .request(&Message::new(
                "edged",
                Group::Meta,
                Operation::Query,
                format!("{}/serviceaccounttoken/{sa}", s.ns),
                other,
            ))
            .await;
        assert_eq!(reply.content["ErrStatus"]["code"], 403, "{}", reply.content);
    }
    delete_node(&s.cluster, &node).await;
}
