//! The fault switches (APISERVER.md "Faults") answer as the real kube-apiserver does when it
//! sheds load, when etcd fails, when it is not ready, when it cannot be reached and when its
//! watch cache starts over. In-memory only: nothing makes a real apiserver fail on demand.

use std::time::Duration;

use e2e::apiserver::{Config, Failure};
use e2e::cluster;
use futures::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};

/// Status, headers and body of a GET of `path`.
async fn raw_get(client: &kube::Client, path: &str) -> (u16, http::HeaderMap, String) {
    let req = http::Request::get(path)
        .body(Vec::new())
        .expect("a request");
    let resp = client.send(req.map(Into::into)).await.expect("an answer");
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.expect("a body").to_bytes();
    (
        parts.status.as_u16(),
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

#[tokio::test]
async fn failures_answer_as_the_real_apiserver_and_heal() {
    let Some(c) = cluster::connect_in_memory_only(Config::for_tests(), "the fault switches")
        .await
        .expect("cluster")
    else {
        return;
    };
    let srv = c.in_memory().expect("in-memory");
    // Without kube's default retries (429, 503 and 504 up to 15 times with exponential
    // back-off capped at 1000 s, Retry-After honoured): the test reads the answers themselves.
    let mut config = srv.kube_config().expect("a client config");
    config.default_retry = false;
    let client = kube::Client::try_from(config).expect("a client");
    let path = "/api/v1/namespaces/default/configmaps";

    // Flow control's answer: plain text, not a Status, with Retry-After.
    srv.fail_requests(Failure::TooManyRequests {
        retry_after_seconds: 3,
    });
    let (code, headers, body) = raw_get(&client, path).await;
    assert_eq!(code, 429, "{body}");
    assert_eq!(body, "Too many requests, please try again later.\n");
    assert_eq!(headers["retry-after"], "3");
    assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    // Health checks are not throttled.
    assert_eq!(raw_get(&client, "/readyz").await.0, 200);

    for (failure, code, reason) in [
        (Failure::Internal, 500, "InternalError"),
        (Failure::Unavailable, 503, "ServiceUnavailable"),
    ] {
        srv.fail_requests(failure);
        let (got, _, body) = raw_get(&client, path).await;
        assert_eq!(got, code, "{body}");
        let status: Value = serde_json::from_str(&body).expect("a Status");
        assert_eq!(status["kind"], "Status", "{status}");
        assert_eq!(status["status"], "Failure", "{status}");
        assert_eq!(status["reason"], reason, "{status}");
        assert_eq!(status["code"], code, "{status}");
    }

    srv.heal();
    assert_eq!(raw_get(&client, path).await.0, 200);
}

#[tokio::test]
async fn an_outage_refuses_connections_and_expired_watches_get_410() {
    let Some(c) = cluster::connect_in_memory_only(Config::for_tests(), "the fault switches")
        .await
        .expect("cluster")
    else {
        return;
    };
    let srv = c.in_memory().expect("in-memory");
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), "default");
    let cm = |n: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": n}})).expect("a ConfigMap")
    };
    let first = cms
        .create(&PostParams::default(), &cm("fault-a"))
        .await
        .expect("created");
    let rv = first.metadata.resource_version.expect("a resourceVersion");

    {
        let _outage = srv.outage();
        let failed = tokio::time::timeout(Duration::from_secs(10), cms.get("fault-a"))
            .await
            .expect("an unreachable server answers at once");
        assert!(
            !matches!(failed, Ok(_) | Err(kube::Error::Api(_))),
            "no HTTP answer during an outage: {failed:?}"
        );
    }
    cms.get("fault-a").await.expect("reachable again");

    // A watch from before the expiry: the history is gone, so it gets 410 Gone (an ERROR
    // event with an Expired Status, as the watch cache sends it), and a relist recovers.
    cms.create(&PostParams::default(), &cm("fault-b"))
        .await
        .expect("created");
    srv.expire_watches();
    let expired = match cms.watch(&WatchParams::default().timeout(5), &rv).await {
        Err(kube::Error::Api(s)) => s.code == 410,
        Err(e) => panic!("{e:?}"),
        Ok(events) => {
            let mut events = std::pin::pin!(events);
            let first = tokio::time::timeout(Duration::from_secs(5), events.next())
                .await
                .expect("an event at once");
            matches!(first, Some(Ok(WatchEvent::Error(e))) if e.code == 410)
        }
    };
    assert!(expired, "a watch from before the expiry gets 410 Gone");
    let names: Vec<String> = cms
        .list(&Default::default())
        .await
        .expect("relist")
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert!(names.contains(&"fault-b".to_string()), "{names:?}");
}
