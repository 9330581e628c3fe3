//! The MetaServer of a real edgecore (cloudcore, edgecore and containerd in the test): kubectl
//! and kube-rs at the edge, online, across a cloud disconnect and after an offline restart;
//! kinds the cloud does not push (Services, a custom resource) through the dynamic controller;
//! Kubernetes-style errors for bad requests.

use e2e::edge::{EdgeEnv, EdgeOptions, WAIT, wait_for};
use e2e::images::BUSYBOX_IMAGE;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

fn sleeper(name: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"app": "ms"}},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"]}]},
    })
}

fn service(name: &str) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": {"app": "ms"}},
        "spec": {"ports": [{"port": 80}], "selector": {"app": "ms"}},
    }))
    .expect("a Service")
}

const WIDGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.metaserver.e2e.kubeedge-rs.io
spec:
  group: metaserver.e2e.kubeedge-rs.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
"#;

fn widgets_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("metaserver.e2e.kubeedge-rs.io", "v1", "Widget"),
        "widgets",
    )
}

fn widget(name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "metaserver.e2e.kubeedge-rs.io/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": {"size": 3}
    }))
    .expect("a Widget")
}

fn metaserver(env: &EdgeEnv) -> SocketAddr {
    env.edge
        .as_ref()
        .and_then(|e| e.metaserver_addr())
        .expect("the MetaServer runs")
}

fn client(addr: SocketAddr) -> kube::Client {
    let config = kube::Config::new(format!("http://{addr}").parse().expect("a URL"));
    kube::Client::try_from(config).expect("a client")
}

/// kubectl against the MetaServer only (an empty kubeconfig, its own discovery cache).
async fn kubectl(env: &EdgeEnv, addr: SocketAddr, args: &[&str]) -> (bool, String, String) {
    let d = env.dir.path();
    let empty = d.join("empty-kubeconfig");
    std::fs::write(&empty, "apiVersion: v1\nkind: Config\n").expect("write kubeconfig");
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&empty)
            .arg("--cache-dir")
            .arg(d.join(format!("kubectl-cache-{}", addr.port())))
            .arg("--server")
            .arg(format!("http://{addr}"))
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("kubectl finished within 30 s")
    .expect("kubectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn wait_kubectl_lists(env: &EdgeEnv, addr: SocketAddr, args: &[&str], names: &[&str]) {
    wait_for(
        &format!("kubectl {args:?} lists {names:?}"),
        WAIT,
        || async {
            let (ok, out, _) = kubectl(env, addr, args).await;
            (ok && names.iter().all(|n| out.contains(n))).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metaserver_serves_the_edge_online_offline_and_after_an_offline_restart() {
    let mut env = EdgeEnv::start_with(EdgeOptions {
        metaserver: true,
        ..EdgeOptions::new("ms")
    })
    .await;
    env.wait_node_ready().await;
    let ns = env.ns.clone();
    let addr = metaserver(&env);
    env.create_pod(sleeper("ms-a")).await;

    // kubectl (Tables) and kube-rs at the edge.
    wait_kubectl_lists(&env, addr, &["get", "pods", "-n", &ns], &["ms-a"]).await;
    let (ok, out, err) =
        kubectl(&env, addr, &["get", "pod", "ms-a", "-n", &ns, "-o", "json"]).await;
    assert!(ok, "kubectl get -o json: {err}");
    let pod: Value = serde_json::from_str(&out).expect("a pod as JSON");
    assert_eq!(pod["spec"]["nodeName"], env.node);

    let edge_pods: Api<Pod> = Api::namespaced(client(addr), &ns);
    let (store, writer) = reflector::store();
    let reflector_task = tokio::spawn(
        reflector(
            writer,
            watcher(edge_pods.clone(), watcher::Config::default()),
        )
        .applied_objects()
        .for_each(|_| async {}),
    );
    wait_for(
        "the kube-rs reflector at the edge has ms-a",
        WAIT,
        || async {
            store
                .state()
                .iter()
                .any(|p| p.metadata.name.as_deref() == Some("ms-a"))
                .then_some(())
        },
    )
    .await;

    // A watch from the list's version, kept open across a disconnect.
    let listed = edge_pods
        .list(&Default::default())
        .await
        .expect("list at the edge");
    let rv = listed
        .metadata
        .resource_version
        .clone()
        .expect("a list version");
    let mut stream = edge_pods
        .watch(&WatchParams::default().timeout(290), &rv)
        .await
        .expect("watch at the edge")
        .boxed();
    let (events_tx, mut events) =
        tokio::sync::mpsc::unbounded_channel::<(String, String, String)>();
    let watch_task = tokio::spawn(async move {
        while let Some(ev) = stream.next().await {
            let item = match ev {
                Ok(WatchEvent::Added(p)) => ("ADDED", p),
                Ok(WatchEvent::Modified(p)) => ("MODIFIED", p),
                Ok(WatchEvent::Deleted(p)) => ("DELETED", p),
                Ok(WatchEvent::Error(e)) => panic!("watch error at the edge: {e:?}"),
                _ => continue,
            };
            let _ = events_tx.send((
                item.0.to_string(),
                item.1.metadata.name.unwrap_or_default(),
                item.1.metadata.resource_version.unwrap_or_default(),
            ));
        }
    });

    env.link.freeze();
    env.wait_edge_link(false).await;
    env.create_pod(sleeper("ms-b")).await;
    let (ok, out, _) = kubectl(&env, addr, &["get", "pods", "-n", &ns]).await;
    assert!(
        ok && out.contains("ms-a"),
        "offline reads answer from the edge database: {out}"
    );
    let (ok, _, err) = kubectl(&env, addr, &["label", "pod", "ms-a", "-n", &ns, "x=y"]).await;
    assert!(
        !ok && err.contains("disconnected"),
        "offline writes are refused clearly: {err}"
    );
    env.link.thaw();
    env.wait_edge_link(true).await;

    let mut seen: Vec<(String, String, String)> = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !seen.iter().any(|(t, n, _)| t == "ADDED" && n == "ms-b") {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(e)) => seen.push(e),
            _ => panic!("the watch never saw ms-b after the reconnect; saw {seen:?}"),
        }
    }
    // Let the reconnect's resync settle, then check the whole history.
    tokio::time::sleep(Duration::from_secs(2)).await;
    while let Ok(e) = events.try_recv() {
        seen.push(e);
    }
    let unique: HashSet<_> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no event twice: {seen:?}");
    assert!(
        !seen.iter().any(|(t, n, _)| t == "ADDED" && n == "ms-a"),
        "ms-a was listed, not added again: {seen:?}"
    );
    assert_eq!(
        seen.iter()
            .filter(|(t, n, _)| t == "ADDED" && n == "ms-b")
            .count(),
        1
    );
    wait_for("the reflector has ms-b", WAIT, || async {
        store
            .state()
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some("ms-b"))
            .then_some(())
    })
    .await;
    watch_task.abort();

    // Online, a write through the MetaServer reaches the cluster (the node's own pod).
    let (ok, _, err) = kubectl(
        &env,
        addr,
        &["label", "pod", "ms-a", "-n", &ns, "via=metaserver"],
    )
    .await;
    assert!(ok, "an online write through the MetaServer: {err}");
    let labelled = env.pods().get("ms-a").await.expect("ms-a in the cluster");
    assert_eq!(
        labelled
            .metadata
            .labels
            .unwrap_or_default()
            .get("via")
            .map(String::as_str),
        Some("metaserver")
    );
    reflector_task.abort();

    // A kind the cloud does not push: read through the dynamic controller, then watched.
    let services: Api<Service> = Api::namespaced(env.cluster.client(), &ns);
    services
        .create(&PostParams::default(), &service("ms-svc"))
        .await
        .expect("service");
    wait_kubectl_lists(&env, addr, &["get", "services", "-n", &ns], &["ms-svc"]).await;
    let edge_services: Api<Service> = Api::namespaced(client(addr), &ns);
    let (svc_store, svc_writer) = reflector::store();
    let svc_task = tokio::spawn(
        reflector(
            svc_writer,
            watcher(edge_services, watcher::Config::default()),
        )
        .applied_objects()
        .for_each(|_| async {}),
    );
    services
        .create(&PostParams::default(), &service("ms-svc2"))
        .await
        .expect("service");
    wait_for("the edge's Service watch sees ms-svc2", WAIT, || async {
        svc_store
            .state()
            .iter()
            .any(|s| s.metadata.name.as_deref() == Some("ms-svc2"))
            .then_some(())
    })
    .await;
    svc_task.abort();

    // A custom resource through the same path: listed with kubectl, watched with kube-rs.
    e2e::crds::install(&env.cluster.client(), WIDGET_CRD, &[widgets_resource()])
        .await
        .expect("the Widget CRD");
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(env.cluster.client(), &ns, &widgets_resource());
    widgets
        .create(&PostParams::default(), &widget("w1"))
        .await
        .expect("widget created");
    wait_kubectl_lists(&env, addr, &["get", "widgets", "-n", &ns], &["w1"]).await;
    let edge_widgets: Api<DynamicObject> =
        Api::namespaced_with(client(addr), &ns, &widgets_resource());
    let w_writer = reflector::store::Writer::new(widgets_resource());
    let w_store = w_writer.as_reader();
    let w_task = tokio::spawn(
        reflector(w_writer, watcher(edge_widgets, watcher::Config::default()))
            .applied_objects()
            .for_each(|_| async {}),
    );
    widgets
        .create(&PostParams::default(), &widget("w2"))
        .await
        .expect("widget created");
    wait_for("the edge's Widget watch sees w1 and w2", WAIT, || async {
        let names: HashSet<String> = w_store
            .state()
            .iter()
            .filter_map(|w| w.metadata.name.clone())
            .collect();
        (names.contains("w1") && names.contains("w2")).then_some(())
    })
    .await;
    w_task.abort();

    // Offline restart: everything read before is served from the database.
    env.link.freeze();
    env.stop_edge().await;
    env.start_edge().await;
    let addr = metaserver(&env);
    let (ok, out, err) = kubectl(&env, addr, &["get", "pods", "-n", &ns]).await;
    assert!(
        ok && out.contains("ms-a") && out.contains("ms-b"),
        "pods after an offline restart: {out} {err}"
    );
    let (ok, out, err) = kubectl(&env, addr, &["get", "services", "-n", &ns]).await;
    assert!(
        ok && out.contains("ms-svc") && out.contains("ms-svc2"),
        "cached services after an offline restart: {out} {err}"
    );

    // Bad requests get Kubernetes errors.
    let (ok, _, err) = kubectl(&env, addr, &["get", "pods", "-n", &ns, "-l", "a in b"]).await;
    assert!(
        !ok && (err.contains("BadRequest") || err.contains("unable to parse")),
        "bad selector: {err}"
    );
    let (_, out, _) = kubectl(
        &env,
        addr,
        &[
            "get",
            "--raw",
            &format!("/api/v1/namespaces/{ns}/pods?watch=1&resourceVersion=1"),
        ],
    )
    .await;
    assert!(
        out.contains("\"code\":410") && out.contains("Expired"),
        "a too old version is 410 Gone: {out}"
    );
    let (ok, _, err) = kubectl(
        &env,
        addr,
        &["get", "--raw", "/apis/nope.example/v1/things"],
    )
    .await;
    assert!(
        !ok && err.contains("NotFound"),
        "unknown resources are 404 offline: {err}"
    );

    env.link.thaw();
    env.finish().await;
}

/// A KubeEdge edge's MetaServer (a raw WebSocket peer sending Applications as KubeEdge's
/// `metaserver` does, JSON text written by hand in Go's field names) against our cloudcore's
/// dynamic controller: a list is answered (`applicationResponse`, parent = the request), a
/// watch registration brings the objects and then their changes, a Secret read is refused
/// with a Kubernetes 403 in `Error.ErrStatus`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kubeedge_metaserver_is_answered_by_the_dynamic_controller() {
    use e2e::channel::{Pki, RawEdge};
    use e2e::cloud::CloudFixture;
    use kubeedge_shared::application::Application;
    use kubeedge_shared::{Message, Operation};
    e2e::edge::init_logs();
    let cluster = e2e::cluster::connect().await.expect("test cluster");
    let pki = Pki::new().expect("test PKI");
    let cloud = CloudFixture::start(cluster.client(), &pki)
        .await
        .expect("cloudcore starts");
    let node = e2e::edge::node_name("ke-ms");
    let tls = pki.edge_tls(&pki.node_cert(&node).unwrap()).unwrap();
    let mut edge = RawEdge::connect(cloud.hub.local_addr(), &node, tls)
        .await
        .expect("connects");
    let ns = cluster.temp_namespace("ke-ms").await.expect("ns");
    let services: Api<Service> = Api::namespaced(cluster.client(), &ns);
    services
        .create(&PostParams::default(), &service("ke-svc"))
        .await
        .expect("service");

    // KubeEdge's request, byte for byte as its metaserver builds it (Option = base64 of "{}").
    let request = |id: &str, key: &str, verb: &str| -> Message {
        let text = format!(
            r#"{{"header":{{"msg_id":"{id}","parent_msg_id":"","timestamp":1,"sync":false}},"route":{{"source":"metaserver","group":"dynamiccontroller","operation":"null","resource":"null"}},"content":{{"ID":"{id}","Key":"{key}","Verb":"{verb}","Nodename":"{node}","Option":"e30=","ReqBody":null,"Subresource":"","RespBody":null,"Status":"InApplying","Reason":"","Error":{{"ErrStatus":{{"metadata":{{}}}}}},"Timestamp":"0001-01-01T00:00:00Z"}}}}"#
        );
        serde_json::from_str(&text).expect("a KubeEdge message")
    };
    async fn answer(edge: &mut RawEdge, parent: &str) -> Application {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no answer to {parent}"
            );
            if let Ok(Some(m)) = edge.recv(Duration::from_millis(500)).await
                && m.header.parent_id == parent
            {
                assert_eq!(m.route.operation, Operation::ApplicationResponse);
                assert_eq!(m.route.resource, "ignore/Application/ignore");
                return Application::from_message(&m).expect("an Application");
            }
        }
    }

    edge.send(&request(
        "ke-list-1",
        &format!("/core/v1/services/{ns}/null"),
        "list",
    ))
    .await
    .unwrap();
    let listed = answer(&mut edge, "ke-list-1").await;
    assert_eq!(listed.status, "Approved", "{listed:?}");
    let body: Value = serde_json::from_slice(&listed.resp_body).unwrap();
    assert_eq!(body["items"][0]["metadata"]["name"], "ke-svc");
    assert_eq!(body["items"][0]["kind"], "Service");

    edge.send(&request(
        "ke-secret-1",
        &format!("/core/v1/secrets/{ns}/null"),
        "list",
    ))
    .await
    .unwrap();
    let refused = answer(&mut edge, "ke-secret-1").await;
    assert_eq!(refused.status, "Rejected");
    assert_eq!(refused.error["ErrStatus"]["code"], 403);

    edge.send(&request(
        "ke-watch-1",
        &format!("/core/v1/services/{ns}/null"),
        "watch",
    ))
    .await
    .unwrap();
    // The registration sends the existing objects as inserts; a new one arrives as well.
    let mut seen = std::collections::HashSet::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut created = false;
    while !(seen.contains("ke-svc") && seen.contains("ke-svc2")) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "dynamiccontroller objects: saw {seen:?}"
        );
        if let Ok(Some(m)) = edge.recv(Duration::from_millis(300)).await
            && m.route.source == "dynamiccontroller"
            && m.route.resource.starts_with(&format!("{ns}/service/"))
        {
            assert!(
                !m.header.resource_version.is_empty(),
                "ACKed with its version"
            );
            edge.ack(&m).await.unwrap();
            seen.insert(m.route.resource.rsplit('/').next().unwrap().to_string());
        }
        if seen.contains("ke-svc") && !created {
            services
                .create(&PostParams::default(), &service("ke-svc2"))
                .await
                .expect("service");
            created = true;
        }
    }
    cloud.shutdown().await;
}
