//! `unhold-upgrade` over real HTTP on loopback, with a real edge database, the cloud away and
//! a fake edged that records the releases it is asked for.

use super::tests::{FakeLink, body_json, http};
use super::*;
use crate::metamanager::MetaRecord;
use kubeedge_edged::hold::{self, Release};
use serde_json::{Value, json};
use std::sync::Mutex;

struct Rig {
    _dir: tempfile::TempDir,
    store: MetaStore,
    server: MetaServer,
    /// What edged was asked to release, in order.
    asked: Arc<Mutex<Vec<Release>>>,
}

/// A MetaServer (cloud disconnected) whose edged holds `held` (`namespace/name`), or no edged.
async fn rig(held: Option<Vec<&str>>) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(dir.path().join("edge.db")).await.unwrap();
    let asked: Arc<Mutex<Vec<Release>>> = Arc::default();
    let held_pods = held.map(|held| {
        let mut held: Vec<String> = held.into_iter().map(String::from).collect();
        let (releaser, mut requests) = hold::channel();
        let seen = asked.clone();
        tokio::spawn(async move {
            while let Some(r) = requests.recv().await {
                seen.lock().unwrap().push(r.what.clone());
                let released: Vec<String> = match &r.what {
                    Release::All => std::mem::take(&mut held),
                    Release::Pod { namespace, name } => {
                        let key = format!("{namespace}/{name}");
                        let before = held.len();
                        held.retain(|k| *k != key);
                        if held.len() < before {
                            vec![key]
                        } else {
                            vec![]
                        }
                    }
                };
                let _ = r.reply.send(released);
            }
        });
        releaser
    });
    let config = MetaServerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        node: "edge-1".into(),
        remote_timeout: Duration::from_secs(5),
        bookmark_interval: Duration::from_secs(60),
        limits: Limits::default(),
        secure: None,
        serve: true,
        standing: Vec::new(),
        held_pods,
        confirm_upgrade: None,
    };
    let server = MetaServer::start(config, store.clone(), FakeLink::new(false))
        .await
        .unwrap();
    Rig {
        _dir: dir,
        store,
        server,
        asked,
    }
}

async fn store_pod(store: &MetaStore, name: &str, hold: Option<&str>, phase: &str) {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}"),
                     "resourceVersion": "3"},
        "spec": {"nodeName": "edge-1"}, "status": {"phase": phase}});
    if let Some(h) = hold {
        pod["metadata"]["annotations"] = json!({hold::ANNOTATION: h});
    }
    store
        .upsert(MetaRecord::new(
            format!("default/pod/{name}"),
            "pod",
            pod.to_string(),
        ))
        .await
        .unwrap();
}

fn code(resp: &str) -> u16 {
    resp.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// The status code and the `Status` message of a POST.
async fn post(r: &Rig, path: &str, body: &str) -> (u16, String) {
    let resp = http(
        r.server.local_addr(),
        "POST",
        path,
        "Content-Type: text/plain\r\n",
        body,
    )
    .await;
    let v: Value = body_json(&resp);
    (
        code(&resp),
        v["message"].as_str().unwrap_or_default().into(),
    )
}

#[tokio::test]
async fn unholding_a_held_pod_reaches_edged_while_the_cloud_is_away() {
    let r = rig(Some(vec!["default/web"])).await;
    store_pod(&r.store, "web", Some("true"), "Pending").await;
    let (c, m) = post(&r, "/api/v1/pods/unhold-upgrade", "default/web\n").await;
    assert_eq!(c, 200, "{m}");
    assert!(
        m.contains("released the held upgrade of pod default/web"),
        "{m}"
    );
    assert_eq!(
        *r.asked.lock().unwrap(),
        [Release::Pod {
            namespace: "default".into(),
            name: "web".into()
        }]
    );
    // Again: edged no longer holds it, and says so.
    let (c, m) = post(
        &r,
        "/api/v1/namespaces/default/pods/unhold-upgrade",
        "default/web",
    )
    .await;
    assert_eq!(c, 200, "{m}");
    assert!(m.contains("is not held at this edge"), "{m}");
    assert_eq!(r.asked.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn unholding_a_pod_checks_it_and_its_body_first() {
    let r = rig(Some(vec![])).await;
    store_pod(&r.store, "plain", None, "Pending").await;
    store_pod(&r.store, "off", Some("false"), "Pending").await;
    store_pod(&r.store, "running", Some("true"), "Running").await;
    let cases: [(&str, &str, u16, &str); 9] = [
        (
            "/api/v1/pods/unhold-upgrade",
            "default/gone",
            404,
            "pods \"gone\" not found in namespace \"default\"",
        ),
        (
            "/api/v1/pods/unhold-upgrade",
            "default/plain",
            400,
            "is not marked with the edge.kubeedge.io/hold-upgrade: \"true\" annotation",
        ),
        (
            "/api/v1/pods/unhold-upgrade",
            "default/off",
            400,
            "is not marked",
        ),
        (
            "/api/v1/pods/unhold-upgrade",
            "default/running",
            400,
            "is not Pending (phase Running)",
        ),
        (
            "/api/v1/pods/unhold-upgrade",
            "web",
            400,
            "expected <namespace>/<name>",
        ),
        (
            "/api/v1/pods/unhold-upgrade",
            "",
            400,
            "expected <namespace>/<name>",
        ),
        (
            "/api/v1/pods/unhold-upgrade",
            "default/../x",
            400,
            "expected <namespace>/<name>",
        ),
        (
            "/api/v1/namespaces/other/pods/unhold-upgrade",
            "default/running",
            400,
            "the path namespace \"other\"",
        ),
        (
            "/api/v1/configmaps/unhold-upgrade",
            "default/x",
            400,
            "unsupported resource for unhold-upgrade: v1/configmaps",
        ),
    ];
    for (path, body, want, message) in cases {
        let (c, m) = post(&r, path, body).await;
        assert_eq!(c, want, "{path} {body:?}: {m}");
        assert!(m.contains(message), "{path} {body:?}: {m}");
    }
    let big = "a".repeat(unhold::MAX_BODY + 1);
    let (c, m) = post(&r, "/api/v1/pods/unhold-upgrade", &big).await;
    assert_eq!(c, 413, "{m}");
    let resp = http(
        r.server.local_addr(),
        "POST",
        "/api/v1/pods/unhold-upgrade",
        "",
        "default/\u{fffd}",
    )
    .await;
    assert_eq!(code(&resp), 400, "{resp}");
    assert!(r.asked.lock().unwrap().is_empty(), "nothing reached edged");
}

#[tokio::test]
async fn unholding_the_node_releases_every_held_pod_of_this_edge_only() {
    let r = rig(Some(vec!["default/a", "ns2/b"])).await;
    let (c, m) = post(&r, "/api/v1/nodes/unhold-upgrade", "other-node").await;
    assert_eq!(c, 404, "{m}");
    assert!(m.contains("this edge is node \"edge-1\""), "{m}");
    let (c, m) = post(&r, "/api/v1/nodes/unhold-upgrade", "  ").await;
    assert_eq!(c, 400, "{m}");
    assert!(m.contains("node name required"), "{m}");
    assert!(r.asked.lock().unwrap().is_empty());
    let (c, m) = post(&r, "/api/v1/nodes/unhold-upgrade", "edge-1\n").await;
    assert_eq!(c, 200, "{m}");
    assert!(
        m.contains("2 pod(s) on node edge-1: default/a, ns2/b"),
        "{m}"
    );
    assert_eq!(*r.asked.lock().unwrap(), [Release::All]);
    let (c, m) = post(&r, "/api/v1/nodes/unhold-upgrade", "edge-1").await;
    assert_eq!(c, 200, "{m}");
    assert!(m.contains("no pod upgrades are held on node edge-1"), "{m}");
}

#[tokio::test]
async fn without_edged_unhold_says_nothing_is_held_here() {
    let r = rig(None).await;
    store_pod(&r.store, "web", Some("true"), "Pending").await;
    let (c, m) = post(&r, "/api/v1/pods/unhold-upgrade", "default/web").await;
    assert_eq!(c, 503, "{m}");
    assert!(m.contains("edged does not run in this edgecore"), "{m}");
    let (c, _) = post(&r, "/api/v1/nodes/unhold-upgrade", "edge-1").await;
    assert_eq!(c, 503);
}
