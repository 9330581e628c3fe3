//! Events expire `--event-ttl` after their last write, as the real apiserver's etcd leases
//! make them: watchers see them deleted; an Event written again lives on. In-memory only (a
//! real cluster's TTL is an hour).

use std::time::Duration;

use e2e::apiserver::Config;
use e2e::cluster;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::{PostParams, WatchEvent, WatchParams};
use serde_json::json;

fn event(name: &str, count: i32) -> Event {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reason": "Testing", "message": "ttl", "type": "Normal", "count": count,
    }))
    .expect("an Event")
}

#[tokio::test]
async fn events_expire_after_their_last_write() {
    const TTL: Duration = Duration::from_secs(2);
    let Some(c) = cluster::connect_in_memory_only(
        Config {
            event_ttl: TTL,
            ..Config::for_tests()
        },
        "an event TTL of seconds",
    )
    .await
    .expect("cluster") else {
        return;
    };
    let ns = c.temp_namespace("event-ttl").await.unwrap();
    let api: Api<Event> = Api::namespaced(c.client(), &ns);
    let pp = PostParams::default();
    let quiet = api.create(&pp, &event("quiet", 1)).await.unwrap();
    let rv = quiet.metadata.resource_version.clone().unwrap();
    let mut watch = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let mut busy = api.create(&pp, &event("busy", 1)).await.unwrap();
    // "busy" is written every 250 ms for twice the TTL; "quiet" never again.
    let start = tokio::time::Instant::now();
    let mut n = 1;
    while start.elapsed() < TTL * 2 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        n += 1;
        busy.count = Some(n);
        busy = api.replace("busy", &pp, &busy).await.unwrap();
    }
    let mut deleted = Vec::new();
    // What the watch saw while "busy" was being written: "quiet" deleted, "busy" not.
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(200), watch.next()).await {
        if let Ok(WatchEvent::Deleted(ev)) = e {
            deleted.push(ev.metadata.name.unwrap_or_default());
        }
    }
    assert_eq!(deleted, ["quiet"], "deleted while busy was written");
    assert!(api.get_opt("quiet").await.unwrap().is_none());
    assert!(api.get_opt("busy").await.unwrap().is_some());
    // Left alone, "busy" goes too.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, watch.next()).await {
            Ok(Some(Ok(WatchEvent::Deleted(ev)))) => {
                assert_eq!(ev.metadata.name.as_deref(), Some("busy"));
                break;
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => panic!("busy was not deleted within 20 s of its last write"),
        }
    }
    c.delete_namespace(&ns).await;
}
