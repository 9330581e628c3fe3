//! The kubelet's resource usage endpoints of edge nodes through the stream tunnel:
//! `kubectl get --raw /api/v1/nodes/<node>/proxy/stats/summary` and `/metrics/resource`
//! (the apiserver's node proxy → cloudstream → METRIC_CONNECT → edgestream → containerd's
//! stats), and cloudstream relaying METRIC_CONNECT to a hand-written KubeEdge-style edge.

use super::stream::stream_env;
use e2e::edge::{WAIT, wait_for};
use e2e::images::BUSYBOX_IMAGE;
use e2e::stream_client::{self, dial_tunnel, next_message};
use http_body_util::BodyExt;
use kubeedge_shared::stream::ws::{self, WsReader};
use kubeedge_shared::stream::{MessageType, TunnelMessage};
use serde_json::{Value, json};
use std::collections::HashMap;
use tokio::io::AsyncWriteExt;

async fn raw_get(env: &e2e::edge::EdgeEnv, path: &str) -> String {
    let out = env
        .cluster
        .kubectl_run(&["get", "--raw", path], None)
        .await
        .expect("kubectl");
    assert!(
        out.success,
        "kubectl get --raw {path} failed: {}{}",
        out.stdout, out.stderr
    );
    out.stdout
}

/// Prometheus text samples: `name{labels}` → (value, timestamp), every line checked.
fn parse_prometheus(text: &str) -> HashMap<String, (f64, Option<i64>)> {
    let mut out = HashMap::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(c) = line.strip_prefix("# ") {
            assert!(
                c.starts_with("HELP ") || c.starts_with("TYPE "),
                "comment {line:?}"
            );
            continue;
        }
        let split = line
            .rfind('}')
            .map_or_else(|| line.find(' ').unwrap_or(0), |i| i + 1);
        let (series, rest) = line.split_at(split);
        let mut f = rest.split_whitespace();
        let value: f64 = f
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        let ts = f.next().map(|t| t.parse::<i64>().expect("timestamp"));
        assert!(f.next().is_none(), "extra fields in {line:?}");
        out.insert(series.to_string(), (value, ts));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reads_edge_node_stats_and_resource_metrics() {
    let Some((env, _stream)) = stream_env("stream-metrics").await else {
        return;
    };
    env.create_pod(json!({
        "metadata": {"name": "busy", "namespace": env.ns},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "command": ["sh", "-c", "x=$(head -c 2000000 /dev/zero | tr '\\0' a); while true; do sleep 1; done"],
            }],
        },
    }))
    .await;
    env.wait_running("busy").await;

    let path = format!("/api/v1/nodes/{}/proxy/stats/summary", env.node);
    let started = std::time::Instant::now();
    let summary: Value = serde_json::from_str(&raw_get(&env, &path).await).expect("summary JSON");
    println!("stats/summary through the tunnel: {:?}", started.elapsed());
    let node = &summary["node"];
    assert_eq!(node["nodeName"], env.node.as_str());
    assert!(
        node["startTime"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{node}"
    );
    assert!(
        node["cpu"]["usageCoreNanoSeconds"].as_u64() > Some(0),
        "{node}"
    );
    assert!(node["cpu"]["usageNanoCores"].is_u64(), "{node}");
    assert!(
        node["memory"]["workingSetBytes"].as_u64() > Some(0),
        "{node}"
    );
    assert!(node["fs"]["capacityBytes"].as_u64() > Some(0), "{node}");
    let pods = summary["pods"].as_array().expect("pods");
    assert!(
        pods.iter()
            .all(|p| p["podRef"]["namespace"] == env.ns.as_str()),
        "only this node's pods: {pods:?}"
    );
    let pod = pods
        .iter()
        .find(|p| p["podRef"]["name"] == "busy")
        .unwrap_or_else(|| panic!("pod busy in {pods:?}"));
    let main = &pod["containers"][0];
    assert_eq!(main["name"], "main", "{pod}");
    assert!(
        main["memory"]["workingSetBytes"].as_u64() > Some(0),
        "{pod}"
    );
    assert!(main["cpu"]["usageCoreNanoSeconds"].is_u64(), "{pod}");
    assert!(pod["memory"]["workingSetBytes"].as_u64() > Some(0), "{pod}");
    assert!(pod["podRef"]["uid"].as_str().is_some_and(|u| !u.is_empty()));

    // A later reading has the container's CPU rate (from the previous sample).
    wait_for("a container usageNanoCores", WAIT, || async {
        let s: Value = serde_json::from_str(&raw_get(&env, &path).await).ok()?;
        let pods = s["pods"].as_array()?.clone();
        let p = pods.iter().find(|p| p["podRef"]["name"] == "busy")?;
        p["containers"][0]["cpu"]["usageNanoCores"]
            .as_u64()
            .map(drop)
    })
    .await;
    let lean: Value =
        serde_json::from_str(&raw_get(&env, &format!("{path}?only_cpu_and_memory=true")).await)
            .expect("JSON");
    assert!(lean["node"].get("fs").is_none(), "{}", lean["node"]);

    // metrics-server's endpoint.
    let text = raw_get(
        &env,
        &format!("/api/v1/nodes/{}/proxy/metrics/resource", env.node),
    )
    .await;
    let samples = parse_prometheus(&text);
    let labels = format!(
        "{{container=\"main\",namespace=\"{}\",pod=\"busy\"}}",
        env.ns
    );
    let (ws, ts) = samples
        .get(&format!("container_memory_working_set_bytes{labels}"))
        .unwrap_or_else(|| panic!("no working set for main in {text}"));
    assert!(
        *ws > 0.0 && ts.is_some_and(|t| t > 1_600_000_000_000),
        "{text}"
    );
    assert!(samples.contains_key(&format!("container_cpu_usage_seconds_total{labels}")));
    assert!(samples[&format!("container_start_time_seconds{labels}")].0 > 1.6e9);
    assert!(samples["node_cpu_usage_seconds_total"].0 > 0.0);
    assert!(samples["node_memory_working_set_bytes"].0 > 0.0);
    let pod_labels = format!("{{namespace=\"{}\",pod=\"busy\"}}", env.ns);
    assert!(samples[&format!("pod_memory_working_set_bytes{pod_labels}")].0 > 0.0);
    assert_eq!(samples["scrape_error"].0, 0.0);

    let kubelet = parse_prometheus(
        &raw_get(&env, &format!("/api/v1/nodes/{}/proxy/metrics", env.node)).await,
    );
    assert_eq!(kubelet["kubelet_running_pods"].0, 1.0);

    // Unknown paths get the kubelet's 404 text; unknown nodes the apiserver's 404.
    let out = env
        .cluster
        .kubectl_run(
            &[
                "get",
                "--raw",
                "/api/v1/nodes/no-such-node/proxy/stats/summary",
            ],
            None,
        )
        .await
        .expect("kubectl");
    assert!(
        !out.success && out.stderr.contains("not found"),
        "{}",
        out.stderr
    );
    env.finish().await;
}

/// A client of the stream server (as the apiserver, or metrics-server calling the
/// "kubelet" directly), with its own Host and headers, on its own task.
fn stream_request(
    stream: &cloudcore::cloudstream::CloudStream,
    tls: &std::sync::Arc<rustls::ClientConfig>,
    path: &str,
    headers: &[(&str, &str)],
) -> tokio::task::JoinHandle<(http::StatusCode, http::HeaderMap, Vec<u8>)> {
    let tls = tls.clone();
    let addr = stream.stream_addr();
    let mut req = http::Request::get(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    tokio::spawn(async move {
        let io = stream_client::dial(addr, tls).await;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
                .await
                .expect("http");
        tokio::spawn(conn);
        let resp = tokio::time::timeout(WAIT, send.send_request(req))
            .await
            .expect("an answer in time")
            .expect("response");
        let (status, headers) = (resp.status(), resp.headers().clone());
        let body = tokio::time::timeout(WAIT, resp.into_body().collect())
            .await
            .expect("the body ends")
            .expect("body")
            .to_bytes()
            .to_vec();
        (status, headers, body)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudstream_relays_metric_connect_to_a_kubeedge_edge() {
    let Some((env, stream)) = stream_env("stream-metrics-go").await else {
        return;
    };
    // The stream server faces the apiserver with a certificate from the cluster CA.
    let cluster_ca = env.cluster.cluster_ca();
    let Some(apiserver) = env.cluster.apiserver_stream_tls(&cluster_ca[0]) else {
        return;
    };
    let node = e2e::edge::node_name("go-metrics");
    let ip = "10.77.0.9";
    // A KubeEdge edge: its tunnel with the node's certificate and KubeEdge's headers.
    let io = dial_tunnel(&stream, &env.pki, &node, ip).await;
    let (r, mut w) = tokio::io::split(io);
    let mut reader = WsReader::new(r, 2 << 20);
    wait_for("the tunnel session", WAIT, || async {
        stream.is_connected(&node).then_some(())
    })
    .await;
    // The edge's answer to connection `id`: each line in a DATA frame, then REMOVE_CONNECT.
    let mut answer = async |id: u64, lines: &[&str]| {
        let data = lines
            .iter()
            .map(|l| TunnelMessage::new(id, MessageType::Data, l.as_bytes().to_vec()));
        let remove = TunnelMessage::new(id, MessageType::RemoveConnect, Vec::new());
        for m in data.chain([remove]) {
            w.write_all(&ws::encode_frame(
                ws::OP_TEXT,
                &m.encode(),
                Some([3, 1, 4, 1]),
            ))
            .await
            .expect("write");
        }
    };

    // A client calling the node's "kubelet" by its IP: METRIC_CONNECT with Go's url.URL; the
    // edge's answer is the body only, each line ending in \n, then REMOVE_CONNECT.
    let host = format!("{ip}:10350");
    let response = stream_request(
        &stream,
        &apiserver,
        "/stats/summary?only_cpu_and_memory=true",
        &[("host", host.as_str()), ("accept-encoding", "gzip")],
    );
    let connect = next_message(&mut reader).await;
    assert_eq!(connect.kind, MessageType::MetricConnect);
    let v: Value = serde_json::from_slice(&connect.data).expect("JSON");
    assert_eq!(v["MessID"], connect.connect_id);
    assert!(v.get("method").is_none(), "{v}");
    assert_eq!(v["url"]["Scheme"], "http");
    assert_eq!(v["url"]["Host"], "127.0.0.1:10350");
    assert_eq!(v["url"]["Path"], "/stats/summary");
    assert_eq!(v["url"]["RawQuery"], "only_cpu_and_memory=true");
    assert_eq!(v["header"]["Accept-Encoding"], json!(["gzip"]));
    let id = connect.connect_id;
    let body = "{\"node\":{\"nodeName\":\"go\"},\n\"pods\":[]}\n";
    let lines: Vec<&str> = body.split_inclusive('\n').collect();
    answer(id, &lines).await;
    let (status, headers, got) = response.await.expect("client task");
    assert_eq!(status, http::StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(String::from_utf8_lossy(&got), body);

    // Through the apiserver's node proxy: the Host is whatever address the node reports, the
    // node is the one X-Forwarded-Uri names.
    let forwarded = format!("/api/v1/nodes/{node}/proxy/metrics/resource");
    let response = stream_request(
        &stream,
        &apiserver,
        "/metrics/resource",
        &[
            ("host", "192.0.2.1:10350"),
            ("x-forwarded-uri", forwarded.as_str()),
        ],
    );
    let connect = next_message(&mut reader).await;
    assert_eq!(connect.kind, MessageType::MetricConnect);
    let v: Value = serde_json::from_slice(&connect.data).expect("JSON");
    assert_eq!(v["url"]["Path"], "/metrics/resource");
    assert_eq!(v["header"]["X-Forwarded-Uri"], json!([forwarded]));
    let id = connect.connect_id;
    answer(id, &["scrape_error 0\n"]).await;
    let (status, headers, got) = response.await.expect("client task");
    assert_eq!(status, http::StatusCode::OK);
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    assert_eq!(got, b"scrape_error 0\n");

    // An edge that ends the request without a word: 502, not an empty 200.
    let response = stream_request(&stream, &apiserver, "/metrics", &[("host", host.as_str())]);
    let connect = next_message(&mut reader).await;
    answer(connect.connect_id, &[]).await;
    let (status, _, got) = response.await.expect("client task");
    assert_eq!(
        status,
        http::StatusCode::BAD_GATEWAY,
        "{}",
        String::from_utf8_lossy(&got)
    );

    // No tunnel for the host or the forwarded node: KubeEdge's 500.
    let response = stream_request(
        &stream,
        &apiserver,
        "/stats/summary",
        &[("host", "192.0.2.1:10350")],
    );
    let (status, _, got) = response.await.expect("client task");
    assert_eq!(status, http::StatusCode::INTERNAL_SERVER_ERROR);
    assert!(String::from_utf8_lossy(&got).contains("192.0.2.1"));
    assert_eq!(stream.open_connections(&node), 0);
    drop(stream);
    env.finish().await;
}
