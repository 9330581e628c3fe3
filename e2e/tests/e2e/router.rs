//! The cloud router with a real edge: cloudcore's router and cloudhub in-process, a real
//! edgecore (edged on containerd, servicebus, eventbus on a real mosquitto), Rules and
//! RuleEndpoints created in the cluster as a user would. Every rule type end to end:
//!
//! - rest → servicebus: an HTTP call to the router reaches busybox `httpd` in a host-network
//!   pod on the edge node; its status, headers and body come back (also its 404, and the
//!   edge's 500 for an answer over the body limit);
//! - rest → eventbus: the body is published on the edge's MQTT topic;
//! - eventbus → rest: a message on the edge's topic reaches a cloud HTTP endpoint;
//! - servicebus → rest: an application on the node reaches a cloud endpoint through its
//!   servicebus, and a URL no rule allows is refused (KubeEdge's check).
//!
//! Rule status counts what happened. Tests needing mosquitto skip (saying why) without it.

use e2e::edge::{EdgeEnv, EdgeOptions};
use e2e::images::BUSYBOX_IMAGE;
use e2e::mosquitto::Mosquitto;
use e2e::mqtt::MqttClient;
use e2e::router::{self as r, CloudEndpoint};
use kubeedge_shared::servicebus::UploadResponse;
use serde_json::json;
use std::time::Duration;

struct RouterEnv {
    env: EdgeEnv,
    router: cloudcore::router::Router,
    /// The edge's servicebus port for applications.
    servicebus_port: u16,
    broker: Option<Mosquitto>,
}

impl RouterEnv {
    /// An edge with the servicebus on (and its eventbus on `broker`), a router on its cloud.
    async fn start(prefix: &str, broker: Option<Mosquitto>) -> RouterEnv {
        let servicebus_port = r::free_port();
        let mqtt = broker.as_ref().map(|b| b.url());
        let env = EdgeEnv::start_with(EdgeOptions {
            customize: Some(Box::new(move |c| {
                c.modules.service_bus.enable = true;
                c.modules.service_bus.port = i32::from(servicebus_port);
                if let Some(url) = mqtt {
                    c.modules.event_bus.mqtt_server_external = url;
                }
            })),
            ..EdgeOptions::new(prefix)
        })
        .await;
        env.wait_node_ready().await;
        r::install(&env.cluster.client())
            .await
            .expect("router CRDs");
        let router = r::start(env.cloud(), env.cluster.client(), r::test_settings()).await;
        RouterEnv {
            env,
            router,
            servicebus_port,
            broker,
        }
    }

    fn client(&self) -> kube::Client {
        self.env.cluster.client()
    }

    fn url(&self, path: &str) -> String {
        format!(
            "http://{}/{}/{}{path}",
            self.router.local_addr(),
            self.env.node,
            self.env.ns
        )
    }

    async fn finish(self) {
        self.router.shutdown();
        drop(self.broker);
        self.env.finish().await;
    }
}

/// busybox httpd in a host-network pod on 127.0.0.1:`port`: `/index.html`, a CGI echoing
/// method, query, a header and the body with status 201, and a CGI answering 4 MB.
async fn start_web_pod(env: &EdgeEnv, port: u16) {
    let script = format!(
        "mkdir -p /www/cgi-bin && echo hello-from-edge > /www/index.html && \
         printf '#!/bin/sh\\necho \"Status: 201 Created\"\\necho \"Content-Type: text/plain\"\\n\
echo \"X-Edge-App: yes\"\\necho\\necho \"method=$REQUEST_METHOD query=$QUERY_STRING trace=$HTTP_X_TRACE\"\\ncat\\n' \
         > /www/cgi-bin/echo && \
         printf '#!/bin/sh\\necho \"Content-Type: application/octet-stream\"\\necho\\n\
dd if=/dev/zero bs=1000 count=4000 2>/dev/null\\n' > /www/cgi-bin/big && \
         chmod +x /www/cgi-bin/echo /www/cgi-bin/big && exec httpd -f -p 127.0.0.1:{port} -h /www"
    );
    env.create_pod(json!({
        "metadata": {"name": "web"},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "httpd", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script]
            }]
        }
    }))
    .await;
    env.wait_running("web").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn router_rest_call_reaches_an_http_server_in_an_edge_pod() {
    let t = RouterEnv::start("router-web", None).await;
    let (client, ns) = (t.client(), t.env.ns.clone());
    let app_port = r::free_port();
    start_web_pod(&t.env, app_port).await;
    let port = app_port.to_string();
    r::create_endpoint(&client, &ns, "my-rest", "rest", &[]).await;
    r::create_endpoint(
        &client,
        &ns,
        "web-sb",
        "servicebus",
        &[("service_port", &port)],
    )
    .await;
    r::create_rule(
        &client,
        &ns,
        "web",
        ("my-rest", &[("path", "/web")]),
        ("web-sb", &[("path", "/")]),
    )
    .await;

    // The app's own status, headers and body come back; the path after the rule's and the
    // query reach the app.
    r::request_until(
        "GET",
        &t.url("/web/index.html"),
        b"",
        "GET through the router",
        |a| a.status == 200,
    )
    .await;
    let a = r::request(
        "POST",
        &t.url("/web/cgi-bin/echo?room=1"),
        &[("X-Trace", "t-42")],
        "the body",
    )
    .await
    .unwrap();
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(a.headers["x-edge-app"], "yes");
    assert_eq!(a.headers["content-type"], "text/plain");
    assert_eq!(a.body, "method=POST query=room=1 trace=t-42\nthe body");
    let a = r::request("GET", &t.url("/web/index.html"), &[], "")
        .await
        .unwrap();
    assert_eq!((a.status, a.body.as_str()), (200, "hello-from-edge\n"));
    assert_eq!(a.headers["content-type"], "text/html");
    let a = r::request("GET", &t.url("/web/missing"), &[], "")
        .await
        .unwrap();
    assert_eq!(a.status, 404, "the app's own 404");
    assert!(a.body.contains("Not Found"), "{}", a.body);
    // An answer over the edge's limit: the servicebus's 500, not a truncated body.
    let a = r::request("GET", &t.url("/web/cgi-bin/big"), &[], "")
        .await
        .unwrap();
    assert_eq!(a.status, 500, "{}", a.body);
    assert_eq!(a.headers["server"], "kubeedge-edgecore");
    assert!(a.body.contains("response body too large"), "{}", a.body);

    let s = r::rule_status_until(&client, &ns, "web", "calls counted", |s| {
        s["successMessages"].as_i64() >= Some(4) && s["failMessages"].as_i64() >= Some(1)
    })
    .await;
    assert!(
        s["errors"][0]
            .as_str()
            .unwrap_or_default()
            .contains("too large"),
        "{s}"
    );
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn router_rest_call_publishes_on_an_edge_mqtt_topic() {
    let Some(broker) = Mosquitto::start_or_skip("router: rest → eventbus") else {
        return;
    };
    let t = RouterEnv::start("router-pub", Some(broker)).await;
    let (client, ns) = (t.client(), t.env.ns.clone());
    let broker = t.broker.as_ref().expect("broker");
    let mut device = MqttClient::connect(broker.addr(), "router-alarm").await;
    device.subscribe("alarms/#").await;
    r::create_endpoint(&client, &ns, "my-rest", "rest", &[]).await;
    r::create_endpoint(&client, &ns, "my-bus", "eventbus", &[]).await;
    r::create_rule(
        &client,
        &ns,
        "alarm",
        ("my-rest", &[("path", "/alarm")]),
        ("my-bus", &[("topic", "alarms")]),
    )
    .await;
    let a = r::request_until(
        "POST",
        &t.url("/alarm/room-7"),
        b"smoke",
        "publish through the router",
        |a| a.status == 200,
    )
    .await;
    assert_eq!(a.body, "message delivered");
    let p = device
        .next_on("alarms/room-7", r::WAIT)
        .await
        .expect("the body published at the edge");
    assert_eq!(&p.payload[..], b"smoke");
    r::rule_status_until(&client, &ns, "alarm", "publish counted", |s| {
        s["successMessages"].as_i64() >= Some(1)
    })
    .await;
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn router_edge_topic_reaches_a_cloud_endpoint() {
    let Some(broker) = Mosquitto::start_or_skip("router: eventbus → rest") else {
        return;
    };
    let t = RouterEnv::start("router-up", Some(broker)).await;
    let (client, ns, node) = (t.client(), t.env.ns.clone(), t.env.node.clone());
    let mut cloud = CloudEndpoint::start("ok").await;
    r::create_endpoint(&client, &ns, "my-bus", "eventbus", &[]).await;
    r::create_endpoint(&client, &ns, "my-rest", "rest", &[]).await;
    r::create_rule(
        &client,
        &ns,
        "telemetry",
        ("my-bus", &[("topic", "telemetry/+"), ("node_name", &node)]),
        ("my-rest", &[("resource", &cloud.url("/ingest"))]),
    )
    .await;
    // The edge subscribes once the router tells it to: publish until something arrives.
    let broker = t.broker.as_ref().expect("broker");
    let sensor = MqttClient::connect(broker.addr(), "router-sensor").await;
    let topic = format!("{ns}/telemetry/room-1");
    let deadline = tokio::time::Instant::now() + r::WAIT;
    let got = loop {
        sensor.publish(&topic, "21.5").await;
        if let Ok(Some(m)) =
            tokio::time::timeout(Duration::from_millis(300), cloud.received.recv()).await
        {
            break m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing on {topic} reached the cloud endpoint"
        );
    };
    assert_eq!(
        (got.method.as_str(), got.path.as_str(), got.node.as_str()),
        ("POST", "/ingest", node.as_str())
    );
    assert_eq!(&got.body[..], b"21.5");
    r::rule_status_until(&client, &ns, "telemetry", "upload counted", |s| {
        s["successMessages"].as_i64() >= Some(1)
    })
    .await;
    t.finish().await;
}

async fn post_app(port: u16, body: String) -> Option<UploadResponse> {
    let a = r::request(
        "POST",
        &format!("http://127.0.0.1:{port}/"),
        &[("Content-Type", "application/json")],
        body,
    )
    .await
    .ok()?;
    serde_json::from_str(&a.body).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn router_edge_application_reaches_a_cloud_endpoint_and_other_urls_are_refused() {
    let t = RouterEnv::start("router-app", None).await;
    let (client, ns, node) = (t.client(), t.env.ns.clone(), t.env.node.clone());
    let mut cloud = CloudEndpoint::start("pong from the cloud").await;
    let url = cloud.url("/api/report");
    r::create_endpoint(
        &client,
        &ns,
        "my-sb",
        "servicebus",
        &[("service_port", "9060")],
    )
    .await;
    r::create_endpoint(&client, &ns, "my-rest", "rest", &[]).await;
    r::create_rule(
        &client,
        &ns,
        "report",
        ("my-sb", &[("target_url", &url), ("node_name", &node)]),
        ("my-rest", &[("resource", &url)]),
    )
    .await;
    let request = json!({"method": "POST", "targetURL": url, "payload": {"t": 21}}).to_string();
    let deadline = tokio::time::Instant::now() + r::WAIT;
    let answer = loop {
        // The servicebus listens once the router has allowed the URL.
        if let Some(a) = post_app(t.servicebus_port, request.clone()).await {
            break a;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the servicebus never served applications"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (answer.code, answer.msg.as_str(), answer.body.as_str()),
        (
            200,
            "receive response from cloud successfully",
            "pong from the cloud"
        )
    );
    let got = cloud.next("the application's request").await;
    assert_eq!(
        (got.path.as_str(), got.node.as_str()),
        ("/api/report", node.as_str())
    );
    assert_eq!(got.body, request.as_bytes());

    // KubeEdge's URL check: only what a rule allows this node.
    let other = json!({"method": "POST", "targetURL": cloud.url("/admin"), "payload": {}});
    let refused = post_app(t.servicebus_port, other.to_string())
        .await
        .expect("an answer");
    assert_eq!(refused.code, 400);
    assert_eq!(
        refused.msg,
        format!(
            "url {} is not allowed and please make a rule for this url in the cloud",
            cloud.url("/admin")
        )
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(500), cloud.received.recv())
            .await
            .is_err(),
        "nothing reached the cloud for the refused URL"
    );
    // The rule goes: the URL is no longer allowed (and the server stops with the last one).
    r::delete_rule(&client, &ns, "report").await;
    let deadline = tokio::time::Instant::now() + r::WAIT;
    while let Some(a) = post_app(t.servicebus_port, request.clone()).await {
        if a.code == 400 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the URL stayed allowed after the rule was deleted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    t.finish().await;
}
