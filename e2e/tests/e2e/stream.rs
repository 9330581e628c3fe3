//! `kubectl logs` for pods on an edge node through KubeEdge's stream tunnel: kubectl → the
//! API server (`pods/<name>/log`, which calls the node's kubelet endpoint) → cloudcore's
//! stream server → the WSS tunnel → edgecore's edgestream → the container's CRI log file on
//! the real containerd. The node reports the stream server's port as its kubelet port and the
//! test node address (not loopback, which the apiserver refuses) as its IP, where the stream
//! server listens with a certificate from the cluster CA, as an apiserver with
//! `--kubelet-certificate-authority` requires (on a real multi-host cluster an iptables DNAT
//! makes `<node IP>:<port>` reach cloudcore).

use cloudcore::cloudstream::ClientAuth;
use cloudcore::cloudstream::CloudStream;
use e2e::edge::{EdgeEnv, EdgeOptions, WAIT, wait_for};
use e2e::images::BUSYBOX_IMAGE;
use e2e::stream_client::{
    self, dial_tunnel, loopback_settings, next_message, node_facing_settings, read_at_least,
    read_response_head, send_raw,
};
use edgecore::app::EdgeCore;
use kubeedge_shared::stream::ws::{self, WsEvent, WsReader};
use kubeedge_shared::stream::{MessageType, TunnelMessage};
use serde_json::json;
use std::process::Stdio;
use std::time::Instant;
use tokio::io::{AsyncBufReadExt, BufReader};

/// An edge node whose edgecore runs edgestream against an in-process cloudstream that the
/// apiserver reaches at the node's address; `None` (after printing why) on a real cluster
/// without the cluster CA key.
pub(crate) async fn stream_env(prefix: &str) -> Option<(EdgeEnv, CloudStream)> {
    if e2e::cluster::skip_without_cluster_ca_key(
        "a stream server certificate from the cluster CA (an apiserver with \
         --kubelet-certificate-authority checks it)",
    ) {
        return None;
    }
    let mut env = EdgeEnv::start_with(EdgeOptions::new(prefix)).await;
    env.stop_edge().await;
    let node_ip = e2e::node_address::node_ip();
    let cert = stream_client::cluster_stream_certificate(&env.cluster, env.dir.path(), node_ip)?;
    // The apiserver's kubelet client certificate is signed by the cluster CA.
    let client_auth = ClientAuth::Verify(env.cluster.cluster_ca());
    let stream = CloudStream::start(
        node_facing_settings(&env.pki, client_auth, node_ip, Some(cert)),
        env.cluster.client(),
    )
    .await
    .expect("cloudstream starts");
    let d = env.dir.path().to_path_buf();
    let s = &mut env.config.modules.edge_stream;
    s.enable = true;
    s.server = stream.tunnel_addr().to_string();
    s.tls_tunnel_ca_file = d.join("ca.crt").display().to_string();
    s.tls_tunnel_cert_file = d.join("edge.crt").display().to_string();
    s.tls_tunnel_private_key_file = d.join("edge.key").display().to_string();
    let mut edged = env.edged_config();
    assert_eq!(
        edged.kubelet_port, 10003,
        "with edgeStream the node reports cloudstream's port"
    );
    edged.kubelet_port = i32::from(stream.stream_addr().port());
    env.edge = Some(
        EdgeCore::start_with(&env.config, Some(edged))
            .await
            .expect("edgecore starts"),
    );
    env.wait_node_ready().await;
    let port = i64::from(stream.stream_addr().port());
    wait_for("the node to report the stream port", WAIT, || async {
        let n = env.nodes().get(&env.node).await.ok()?;
        let v = serde_json::to_value(n).ok()?;
        (v["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == port).then_some(())
    })
    .await;
    wait_for("the edge's stream tunnel", WAIT, || async {
        stream.is_connected(&env.node).then_some(())
    })
    .await;
    Some((env, stream))
}

async fn logs(env: &EdgeEnv, args: &[&str]) -> String {
    let mut all = vec!["logs", "-n", env.ns.as_str()];
    all.extend_from_slice(args);
    let out = env.cluster.kubectl_run(&all, None).await.expect("kubectl");
    assert!(
        out.success,
        "kubectl {all:?} failed: {}{}",
        out.stdout, out.stderr
    );
    out.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_reach_edge_containers_through_the_tunnel() {
    let Some((env, stream)) = stream_env("stream-logs").await else {
        return;
    };
    env.create_pod(json!({
        "metadata": {"name": "talker", "namespace": env.ns},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "command": ["sh", "-c", "echo first; echo second >&2; echo third; i=0; \
                    while true; do i=$((i+1)); echo tick-$i; sleep 1; done"],
            }],
        },
    }))
    .await;
    env.wait_running("talker").await;

    // Everything so far, stdout and stderr interleaved as written.
    let deadline = Instant::now() + WAIT;
    let all = loop {
        let out = logs(&env, &["talker"]).await;
        if out.contains("tick-3") {
            break out;
        }
        assert!(Instant::now() < deadline, "no tick-3 in the logs: {out:?}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    };
    // stdout in order; stderr's line too (the runtime reads the two pipes separately, so
    // where it lands between them is not fixed).
    let stdout: Vec<&str> = all.lines().filter(|l| *l != "second").collect();
    assert_eq!(
        &stdout[..4],
        ["first", "third", "tick-1", "tick-2"],
        "{all:?}"
    );
    assert!(
        all.lines().any(|l| l == "second"),
        "stderr line missing: {all:?}"
    );

    // --tail: the last lines only.
    let tail = logs(&env, &["talker", "--tail=2"]).await;
    let lines: Vec<&str> = tail.lines().collect();
    assert_eq!(lines.len(), 2, "--tail=2: {tail:?}");
    assert!(lines.iter().all(|l| l.starts_with("tick-")), "{tail:?}");

    // --timestamps: the CRI timestamp before each line.
    let ts = logs(&env, &["talker", "--tail=1", "--timestamps"]).await;
    let (stamp, text) = ts.trim_end().split_once(' ').expect("timestamp and text");
    assert!(
        stamp.len() > 20 && stamp.as_bytes()[10] == b'T' && text.starts_with("tick-"),
        "{ts:?}"
    );

    // --limit-bytes: the file's first bytes (the file only grows).
    let limited = logs(&env, &["talker", "--limit-bytes=4"]).await;
    assert!(
        limited.len() == 4 && all.starts_with(&limited),
        "{limited:?}"
    );

    // -f: new lines arrive while the request stays open.
    let (mut child, seen) = kubectl_lines(
        &env,
        &["logs", "-f", "--tail=1", "-n", &env.ns, "talker"],
        3,
    )
    .await;
    let n: Vec<u64> = seen
        .iter()
        .filter_map(|l| l.strip_prefix("tick-")?.parse().ok())
        .collect();
    assert_eq!(n.len(), 3, "{seen:?}");
    assert!(n[0] < n[1] && n[1] < n[2], "new lines in order: {seen:?}");
    assert_eq!(stream.open_connections(&env.node), 1);
    // kubectl goes away: the connection ends on the cloud (and REMOVE_CONNECT ends the
    // edge's reader).
    let _ = child.kill().await;
    wait_for("the followed connection to close", WAIT, || async {
        (stream.open_connections(&env.node) == 0).then_some(())
    })
    .await;

    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_of_a_container_not_started_yet_say_so() {
    let Some((env, _stream)) = stream_env("stream-missing").await else {
        return;
    };
    env.create_pod(json!({
        "metadata": {"name": "blocked", "namespace": env.ns},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "initContainers": [{
                "name": "wait",
                "image": BUSYBOX_IMAGE,
                "command": ["sleep", "3600"],
            }],
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "command": ["sleep", "3600"],
            }],
        },
    }))
    .await;
    env.wait_pod("blocked", "the init container running", |p| {
        p["status"]["initContainerStatuses"][0]["state"]["running"].is_object()
    })
    .await;
    let out = env
        .cluster
        .kubectl_run(&["logs", "-n", &env.ns, "blocked", "-c", "main"], None)
        .await
        .expect("kubectl");
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(
        text.contains("container \"main\" in pod \"blocked\" is waiting to start"),
        "{text:?}"
    );
    // The running init container's logs are there (empty) without error.
    let out = env
        .cluster
        .kubectl_run(&["logs", "-n", &env.ns, "blocked", "-c", "wait"], None)
        .await
        .expect("kubectl");
    assert!(out.success && out.stdout.is_empty(), "{out:?}");
    env.finish().await;
}

/// A KubeEdge edge as gorilla/websocket writes it: tunnel messages in masked TEXT frames,
/// split into fragments, with binary (non-UTF-8) data.
fn gorilla_text_fragments(m: &TunnelMessage) -> Vec<u8> {
    let payload = m.encode();
    let (a, b) = payload.split_at(payload.len() / 2);
    let key = [1, 2, 3, 4];
    let mut first = ws::encode_frame(ws::OP_TEXT, a, Some(key));
    first[0] &= 0x7f; // not FIN: a continuation follows
    first.extend(ws::encode_frame(ws::OP_CONTINUATION, b, Some(key)));
    first
}

async fn stream_get(
    stream: &CloudStream,
    tls: &std::sync::Arc<rustls::ClientConfig>,
    path: &str,
) -> (http::StatusCode, hyper::body::Incoming) {
    let io = stream_client::connect(stream, tls).await;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
        .await
        .expect("http");
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", stream.stream_addr().to_string())
        .header("user-agent", "kube-apiserver-test")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let resp = tokio::time::timeout(WAIT, send.send_request(req))
        .await
        .expect("a response in time")
        .expect("response");
    (resp.status(), resp.into_body())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudstream_speaks_kubeedge_tunnel_protocol_to_a_go_edge() {
    e2e::edge::init_logs();
    let cluster = e2e::cluster::connect().await.expect("cluster");
    let pki = e2e::channel::Pki::new().expect("pki");
    // The apiserver calls the stream server with its kubelet client certificate.
    let Some(apiserver) = cluster.apiserver_stream_tls(&pki.ca.cert.cert_der) else {
        return;
    };
    let stream = CloudStream::start(
        loopback_settings(&pki, ClientAuth::Verify(cluster.cluster_ca())),
        cluster.client(),
    )
    .await
    .expect("cloudstream");
    let ns = cluster.temp_namespace("stream-wire").await.expect("ns");
    let node = e2e::edge::node_name("go-edge");
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(cluster.client(), &ns);
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": BUSYBOX_IMAGE}]},
    }))
    .expect("pod");
    pods.create(&Default::default(), &pod)
        .await
        .expect("pod created");

    // The edge dials with its certificate and KubeEdge's headers.
    let io = dial_tunnel(&stream, &pki, &node, "10.9.8.7").await;
    let (r, mut w) = tokio::io::split(io);
    let mut reader = WsReader::new(r, 2 << 20);
    wait_for("the tunnel session", WAIT, || async {
        stream.is_connected(&node).then_some(())
    })
    .await;
    assert!(
        stream.is_connected("10.9.8.7"),
        "sessions are also keyed by the node IP"
    );

    // Pings are answered; unknown message types are ignored.
    use tokio::io::AsyncWriteExt;
    w.write_all(&ws::encode_frame(
        ws::OP_PING,
        b"ping you",
        Some([9, 9, 9, 9]),
    ))
    .await
    .unwrap();
    match tokio::time::timeout(WAIT, reader.next()).await {
        Ok(Ok(Some(WsEvent::Pong(p)))) => assert_eq!(p, b"ping you"),
        other => panic!("expected a pong, got {other:?}"),
    }
    let unknown = TunnelMessage::new(77, MessageType::Unknown(42), b"?".to_vec());
    w.write_all(&gorilla_text_fragments(&unknown))
        .await
        .unwrap();

    // The apiserver asks for logs: the edge gets LOGS_CONNECT with Go's url.URL JSON.
    let path = format!("/containerLogs/{ns}/web/main?tailLines=5&follow=true");
    let (status, body) = {
        // Like KubeEdge, 200 comes once the tunnel is found; the body follows the edge.
        let (connect, response) = tokio::join!(
            next_message(&mut reader),
            stream_get(&stream, &apiserver, &path)
        );
        assert_eq!(connect.kind, MessageType::LogsConnect);
        let v: serde_json::Value = serde_json::from_slice(&connect.data).expect("JSON");
        assert_eq!(v["MessID"], connect.connect_id);
        let url = &v["url"];
        assert_eq!(url["Scheme"], "http");
        assert_eq!(url["Host"], "127.0.0.1:10350");
        assert_eq!(url["Path"], format!("/containerLogs/{ns}/web/main"));
        assert_eq!(url["RawQuery"], "tailLines=5&follow=true");
        for k in ["Opaque", "RawPath", "Fragment", "RawFragment"] {
            assert_eq!(url[k], "", "{k} in {url}");
        }
        assert_eq!(v["header"]["User-Agent"], json!(["kube-apiserver-test"]));
        // DATA with bytes that are not UTF-8, then REMOVE_CONNECT ends the response.
        let id = connect.connect_id;
        let data = TunnelMessage::new(id, MessageType::Data, b"hello \xff\xfe world\n".to_vec());
        w.write_all(&gorilla_text_fragments(&data)).await.unwrap();
        let done = TunnelMessage::new(id, MessageType::RemoveConnect, Vec::new());
        w.write_all(&ws::encode_frame(
            ws::OP_TEXT,
            &done.encode(),
            Some([5, 6, 7, 8]),
        ))
        .await
        .unwrap();
        response
    };
    assert_eq!(status, http::StatusCode::OK);
    use http_body_util::BodyExt;
    let got = tokio::time::timeout(WAIT, body.collect())
        .await
        .expect("the body ends with REMOVE_CONNECT")
        .expect("body")
        .to_bytes();
    assert_eq!(&got[..], b"hello \xff\xfe world\n");

    // A client that goes away: the edge is told with REMOVE_CONNECT for that connection.
    let (status, body) = {
        // Like KubeEdge, 200 comes once the tunnel is found; the body follows the edge.
        let (connect, response) = tokio::join!(
            next_message(&mut reader),
            stream_get(&stream, &apiserver, &path)
        );
        let data = TunnelMessage::new(connect.connect_id, MessageType::Data, b"x".to_vec());
        w.write_all(&ws::encode_frame(
            ws::OP_TEXT,
            &data.encode(),
            Some([1, 1, 1, 1]),
        ))
        .await
        .unwrap();
        let (s, b) = response;
        (s, (b, connect.connect_id))
    };
    assert_eq!(status, http::StatusCode::OK);
    let (body, id) = body;
    drop(body);
    let removed = next_message(&mut reader).await;
    assert_eq!(
        (removed.connect_id, removed.kind),
        (id, MessageType::RemoveConnect)
    );

    // exec: EXEC_CONNECT with the method and the upgrade headers; the edge's raw HTTP answer
    // (a 101 head split across DATA frames, then SPDY bytes) reaches the client as is.
    let request = format!(
        "POST /exec/{ns}/web/main?command=sh&command=-c&command=echo+hi&input=1&output=1 HTTP/1.1\r\n\
         Host: 10.9.8.7:10350\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: v4.channel.k8s.io\r\nX-Stream-Protocol-Version: v3.channel.k8s.io\r\n\
         Content-Length: 0\r\n\r\n"
    );
    let (connect, mut client) = tokio::join!(
        next_message(&mut reader),
        send_raw(&stream, &apiserver, &request)
    );
    assert_eq!(connect.kind, MessageType::ExecConnect);
    let v: serde_json::Value = serde_json::from_slice(&connect.data).expect("JSON");
    assert_eq!(v["MessID"], connect.connect_id);
    assert_eq!(v["method"], "POST");
    assert_eq!(v["url"]["Host"], "127.0.0.1:10350");
    assert_eq!(v["url"]["Path"], format!("/exec/{ns}/web/main"));
    assert_eq!(
        v["url"]["RawQuery"],
        "command=sh&command=-c&command=echo+hi&input=1&output=1"
    );
    assert_eq!(v["header"]["Upgrade"], json!(["SPDY/3.1"]));
    assert_eq!(
        v["header"]["X-Stream-Protocol-Version"],
        json!(["v4.channel.k8s.io", "v3.channel.k8s.io"])
    );
    let id = connect.connect_id;
    for part in [
        &b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpg"[..],
        &b"rade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n\x80\x03\x00\x04spdy"[..],
    ] {
        let m = TunnelMessage::new(id, MessageType::Data, part.to_vec());
        w.write_all(&gorilla_text_fragments(&m)).await.unwrap();
    }
    let (head, mut after) = read_response_head(&mut client).await;
    assert_eq!(head.status, 101);
    assert_eq!(head.header("upgrade"), Some("SPDY/3.1"));
    assert_eq!(
        head.header("x-stream-protocol-version"),
        Some("v4.channel.k8s.io")
    );
    use tokio::io::AsyncReadExt;
    read_at_least(&mut client, &mut after, 8).await;
    assert_eq!(after, b"\x80\x03\x00\x04spdy");
    // Client bytes go to the edge as DATA; REMOVE_CONNECT from the edge ends the client's.
    client.write_all(b"\x00\xffclient-bytes").await.unwrap();
    let mut got = Vec::new();
    while got.len() < 14 {
        let m = next_message(&mut reader).await;
        assert_eq!((m.connect_id, m.kind), (id, MessageType::Data));
        got.extend(m.data);
    }
    assert_eq!(got, b"\x00\xffclient-bytes");
    let done = TunnelMessage::new(id, MessageType::RemoveConnect, Vec::new());
    w.write_all(&gorilla_text_fragments(&done)).await.unwrap();
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(WAIT, client.read_to_end(&mut rest)).await;
    assert!(matches!(ended, Ok(Ok(0))), "{ended:?} {rest:?}");
    wait_for("the exec connection to close", WAIT, || async {
        (stream.open_connections(&node) == 0).then_some(())
    })
    .await;

    // attach refused by the edge: its status and body reach the client, and the edge is told
    // the connection is over.
    let request = format!(
        "GET /attach/{ns}/web/main?output=1 HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n\
         Upgrade: SPDY/3.1\r\n\r\n"
    );
    let (connect, mut client) = tokio::join!(
        next_message(&mut reader),
        send_raw(&stream, &apiserver, &request)
    );
    assert_eq!(connect.kind, MessageType::AttachConnect);
    let v: serde_json::Value = serde_json::from_slice(&connect.data).expect("JSON");
    assert_eq!(v["method"], "GET");
    let refusal = TunnelMessage::new(
        connect.connect_id,
        MessageType::Data,
        b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 18\r\n\r\npod does not exist".to_vec(),
    );
    w.write_all(&gorilla_text_fragments(&refusal))
        .await
        .unwrap();
    let (head, mut body) = read_response_head(&mut client).await;
    assert_eq!(head.status, 404);
    read_at_least(&mut client, &mut body, 18).await;
    assert_eq!(body, b"pod does not exist");
    let removed = next_message(&mut reader).await;
    assert_eq!(
        (removed.connect_id, removed.kind),
        (connect.connect_id, MessageType::RemoveConnect)
    );

    // port-forward: this edge (as every released KubeEdge edge) did not advertise it in its
    // handshake, and such edges crash on a connect type they do not know, so the cloud
    // answers 501 itself and sends the edge nothing; a ping still gets its pong after.
    let mut client = send_raw(
        &stream,
        &apiserver,
        &format!(
            "POST /portForward/{ns}/web HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n\
             Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: portforward.k8s.io\r\n\r\n"
        ),
    )
    .await;
    let (head, mut body) = read_response_head(&mut client).await;
    assert_eq!(head.status, 501);
    let len: usize = head
        .header("content-length")
        .and_then(|l| l.parse().ok())
        .expect("a length");
    read_at_least(&mut client, &mut body, len).await;
    assert!(
        String::from_utf8_lossy(&body).contains("does not serve port-forward"),
        "{body:?}"
    );
    // A pod that does not exist: 404 before any tunnel is involved.
    let mut client = send_raw(
        &stream,
        &apiserver,
        &format!(
            "POST /portForward/{ns}/nope HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n\
             Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: portforward.k8s.io\r\n\r\n"
        ),
    )
    .await;
    let (head, mut body) = read_response_head(&mut client).await;
    assert_eq!(head.status, 404);
    let len: usize = head
        .header("content-length")
        .and_then(|l| l.parse().ok())
        .expect("a length");
    read_at_least(&mut client, &mut body, len).await;
    assert_eq!(
        String::from_utf8_lossy(&body),
        format!("pod {ns}/nope not found")
    );
    w.write_all(&ws::encode_frame(ws::OP_PING, b"after", Some([5, 5, 5, 5])))
        .await
        .unwrap();
    match tokio::time::timeout(WAIT, reader.next()).await {
        Ok(Ok(Some(WsEvent::Pong(p)))) => assert_eq!(p, b"after", "nothing before the pong"),
        other => panic!("expected only a pong, got {other:?}"),
    }

    // A pod on a node without a tunnel: a clear error.
    let other: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "elsewhere"},
        "spec": {"nodeName": "no-tunnel-node", "containers": [{"name": "main", "image": BUSYBOX_IMAGE}]},
    }))
    .expect("pod");
    pods.create(&Default::default(), &other)
        .await
        .expect("pod created");
    let (status, body) = stream_get(
        &stream,
        &apiserver,
        &format!("/containerLogs/{ns}/elsewhere/main"),
    )
    .await;
    assert_eq!(status, http::StatusCode::INTERNAL_SERVER_ERROR);
    let text = tokio::time::timeout(WAIT, body.collect())
        .await
        .expect("the body in time")
        .expect("body")
        .to_bytes();
    assert!(
        String::from_utf8_lossy(&text).contains("no stream tunnel from edge node no-tunnel-node"),
        "{text:?}"
    );
    let mut client = send_raw(
        &stream,
        &apiserver,
        &format!(
            "POST /exec/{ns}/elsewhere/main?command=true&output=1 HTTP/1.1\r\nHost: x\r\n\
             Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n"
        ),
    )
    .await;
    let (head, mut body) = read_response_head(&mut client).await;
    assert_eq!(head.status, 500);
    let len: usize = head
        .header("content-length")
        .and_then(|l| l.parse().ok())
        .expect("a length");
    read_at_least(&mut client, &mut body, len).await;
    assert!(
        String::from_utf8_lossy(&body).contains("no stream tunnel from edge node no-tunnel-node"),
        "{body:?}"
    );
    cluster.delete_namespace(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_shows_the_instance_before_the_restart() {
    let Some((env, _stream)) = stream_env("stream-previous").await else {
        return;
    };
    env.create_pod(json!({
        "metadata": {"name": "restarter", "namespace": env.ns},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "command": ["sh", "-c", "n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); \
                    echo $n > /data/n; echo run-$n; sleep 2; exit 1"],
            }],
        },
    }))
    .await;
    // Runs restart; poll until the current and the previous instance are consecutive runs.
    let deadline = Instant::now() + WAIT;
    loop {
        let cur = logs(&env, &["restarter"]).await;
        let prev = env
            .cluster
            .kubectl_run(&["logs", "-n", &env.ns, "restarter", "--previous"], None)
            .await
            .expect("kubectl");
        let run = |s: &str| s.trim().strip_prefix("run-")?.parse::<u32>().ok();
        if let (Some(c), Some(p)) = (run(&cur), run(&prev.stdout))
            && c >= 2
            && p + 1 == c
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "current {cur:?}, previous {prev:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_continues_across_log_rotation() {
    // The test edge rotates container logs above 16 KiB every 0.5 s.
    let Some((env, _stream)) = stream_env("stream-rotate").await else {
        return;
    };
    env.create_pod(json!({
        "metadata": {"name": "chatty", "namespace": env.ns},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "command": ["sh", "-c", "i=0; while true; do i=$((i+1)); \
                    echo \"n=$i ................................................................................................\"; \
                    sleep 0.005; done"],
            }],
        },
    }))
    .await;
    env.wait_running("chatty").await;
    let mut child = env
        .cluster
        .kubectl()
        .args(["logs", "-f", "-n", &env.ns, "chatty"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl logs -f");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    // 1500 lines of ~110 bytes: 160 KiB, many rotations of 16 KiB files.
    let mut expected = 1u64;
    let read = tokio::time::timeout(WAIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            let n: u64 = line
                .strip_prefix("n=")
                .and_then(|r| r.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("unexpected line {line:?}"));
            assert_eq!(n, expected, "lines are contiguous across rotations");
            expected += 1;
            if expected > 1500 {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(read, Ok(true), "followed up to line {expected}");
    let _ = child.kill().await;
    // The log really was rotated under the reader: rotated files exist and the current file
    // holds only a part of what was read.
    let mut rotated = 0;
    let mut current = u64::MAX;
    let top = env.dir.path().join("pod-logs");
    let mut dirs: Vec<std::path::PathBuf> = std::fs::read_dir(&top)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("_chatty_"))
        .map(|e| e.path())
        .collect();
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if e.path().is_dir() {
                dirs.push(e.path());
            } else if name.contains(".log.") {
                rotated += 1;
            } else if name.ends_with(".log") {
                current = e.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
            }
        }
    }
    assert!(rotated >= 1, "no rotated log file");
    assert!(current < 100 * 1024, "current log file is {current} bytes");
    env.finish().await;
}

/// Starts kubectl with `args` and reads `n` lines of its output as they come (within
/// [`WAIT`]); returns the still running kubectl and the lines.
async fn kubectl_lines(
    env: &EdgeEnv,
    args: &[&str],
    n: usize,
) -> (tokio::process::Child, Vec<String>) {
    let mut child = env
        .cluster
        .kubectl()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    let streamed = tokio::time::timeout(WAIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.push(line);
            if seen.len() >= n {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(streamed, Ok(true), "kubectl {args:?} streamed {seen:?}");
    (child, seen)
}

/// Runs kubectl with `stdin`; stdout, stderr and the exit code.
async fn kubectl_exit(env: &EdgeEnv, args: &[&str], stdin: Option<&[u8]>) -> (String, String, i32) {
    use tokio::io::AsyncWriteExt;
    let mut cmd = env.cluster.kubectl();
    cmd.args(args);
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().expect("kubectl");
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        let input = input.to_vec();
        tokio::spawn(async move {
            let _ = pipe.write_all(&input).await;
        });
    }
    let out = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .expect("kubectl finishes")
        .expect("kubectl output");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code().unwrap_or(-1),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_exec_and_attach_reach_edge_containers_through_the_tunnel() {
    let Some((env, stream)) = stream_env("stream-exec").await else {
        return;
    };
    env.create_pod(json!({
        "metadata": {"name": "shell", "namespace": env.ns},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "command": ["sh", "-c", "i=0; while true; do i=$((i+1)); echo attach-tick-$i; sleep 1; done"],
            }],
        },
    }))
    .await;
    env.wait_running("shell").await;
    let ns = env.ns.as_str();

    // stdout, stderr and the exit code of the command, each where it belongs.
    let (out, err, code) = kubectl_exit(
        &env,
        &[
            "exec",
            "-n",
            ns,
            "shell",
            "--",
            "sh",
            "-c",
            "echo $HOSTNAME; echo err >&2; exit 3",
        ],
        None,
    )
    .await;
    assert_eq!(out, "shell\n", "stderr: {err}");
    assert!(err.contains("err\n"), "{err:?}");
    assert_eq!(code, 3, "the command's exit code: {err}");

    // stdin: 300 kB through `cat` and back, and counted by `wc -c`.
    let input: String = (0..30_000).map(|i| format!("{i:09}\n")).collect();
    let (out, err, code) = kubectl_exit(
        &env,
        &["exec", "-i", "-n", ns, "shell", "--", "cat"],
        Some(input.as_bytes()),
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out == input,
        "cat returned {} of {} bytes",
        out.len(),
        input.len()
    );
    let (out, err, _) = kubectl_exit(
        &env,
        &["exec", "-i", "-n", ns, "shell", "--", "wc", "-c"],
        Some(input.as_bytes()),
    )
    .await;
    assert_eq!(out.trim(), "300000", "{err}");

    // A terminal (-t): kubectl wants one of its own, so it runs under script(1)'s pty. The
    // container's shell sees a tty, and the exit code still comes back.
    let kubectl = env.cluster.kubectl();
    let mut line = vec!["kubectl".to_string()];
    line.extend(
        kubectl
            .as_std()
            .get_args()
            .map(|a| format!("'{}'", a.to_string_lossy())),
    );
    line.push(format!("exec -it -n {ns} shell -- sh -c 'tty; exit 4'"));
    let out = tokio::time::timeout(
        WAIT,
        tokio::process::Command::new("script")
            .args(["-qec", &line.join(" "), "/dev/null"])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("kubectl -t finishes")
    .expect("script runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("/dev/pts/"), "a terminal inside: {text:?}");
    assert_eq!(out.status.code(), Some(4), "{text:?}");

    // attach: the container's output as it comes.
    let (mut child, seen) = kubectl_lines(&env, &["attach", "-n", ns, "shell"], 2).await;
    let n: Vec<u64> = seen
        .iter()
        .filter_map(|l| l.strip_prefix("attach-tick-")?.parse().ok())
        .collect();
    assert!(n.len() == 2 && n[0] < n[1], "{seen:?}");
    assert_eq!(stream.open_connections(&env.node), 1);
    let _ = child.kill().await;
    wait_for("the attach connection to close", WAIT, || async {
        (stream.open_connections(&env.node) == 0).then_some(())
    })
    .await;

    // A container the pod does not have: the apiserver says so.
    let (_, err, code) = kubectl_exit(
        &env,
        &["exec", "-n", ns, "shell", "-c", "nope", "--", "true"],
        None,
    )
    .await;
    assert!(
        code != 0 && err.contains("container nope is not valid for pod shell"),
        "{err:?}"
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_into_a_container_not_running_says_so() {
    let Some((env, stream)) = stream_env("stream-exec-missing").await else {
        return;
    };
    env.create_pod(json!({
        "metadata": {"name": "blocked", "namespace": env.ns},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "initContainers": [{"name": "wait", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]}],
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]}],
        },
    }))
    .await;
    env.wait_pod("blocked", "the init container running", |p| {
        p["status"]["initContainerStatuses"][0]["state"]["running"].is_object()
    })
    .await;
    // The edge's answer (kubelet-like 500) reaches kubectl through the tunnel.
    let (_, err, code) = kubectl_exit(
        &env,
        &["exec", "-n", &env.ns, "blocked", "-c", "main", "--", "true"],
        None,
    )
    .await;
    assert!(code != 0, "{err}");
    assert!(err.contains("container not found (\"main\")"), "{err:?}");
    // The running init container can be exec'd into.
    let (out, err, code) = kubectl_exit(
        &env,
        &[
            "exec", "-n", &env.ns, "blocked", "-c", "wait", "--", "echo", "in-init",
        ],
        None,
    )
    .await;
    assert_eq!((out.as_str(), code), ("in-init\n", 0), "{err}");
    wait_for("every stream closed", WAIT, || async {
        (stream.open_connections(&env.node) == 0).then_some(())
    })
    .await;
    env.finish().await;
}

/// A KubeEdge cloudcore's tunnel end, written by hand: accepts the edge's WSS connection and
/// sends connect messages as Go's `BaseEdgedConnection` marshals them (`messID`).
struct GoCloud {
    reader: WsReader<tokio::io::ReadHalf<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>>,
    writer:
        ws::WsWriter<tokio::io::WriteHalf<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>>,
}

impl GoCloud {
    async fn accept(listener: tokio::net::TcpListener, pki: &e2e::channel::Pki) -> GoCloud {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tls = kubeedge_shared::tls::server_config(
            vec![pki.server.cert_der.clone()],
            pki.server.key_der(),
            std::slice::from_ref(&pki.ca.cert.cert_der),
            true,
        )
        .expect("tls");
        let (tcp, _) = tokio::time::timeout(WAIT, listener.accept())
            .await
            .expect("the edge dials the tunnel")
            .expect("accept");
        let (mut io, head) = tokio::time::timeout(WAIT, async {
            let mut io = tokio_rustls::TlsAcceptor::from(tls)
                .accept(tcp)
                .await
                .expect("TLS");
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                head.push(io.read_u8().await.expect("handshake"));
            }
            (io, head)
        })
        .await
        .expect("the edge's TLS and WebSocket handshake in time");
        let text = String::from_utf8_lossy(&head).into_owned();
        let key = text
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.eq_ignore_ascii_case("sec-websocket-key"))
            .map(|(_, v)| v.trim().to_string())
            .expect("a WebSocket key");
        assert!(text.contains("SessionHostNameOverride: "), "{text}");
        assert!(
            text.contains("X-KubeEdge-RS-Capabilities: port-forward"),
            "{text}"
        );
        let answer = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n\r\n",
            ws::accept_key(key.as_bytes())
        );
        io.write_all(answer.as_bytes()).await.expect("101");
        let (r, w) = tokio::io::split(io);
        GoCloud {
            reader: WsReader::new(r, 2 << 20),
            writer: ws::WsWriter::new(w, false),
        }
    }

    async fn send(&mut self, m: TunnelMessage) {
        self.writer
            .send(ws::OP_TEXT, &m.encode())
            .await
            .expect("send");
    }

    /// The edge's next tunnel message (within [`WAIT`]), pings answered.
    async fn next(&mut self) -> TunnelMessage {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, self.reader.next()).await {
                Ok(Ok(Some(WsEvent::Data { payload, .. }))) => {
                    return TunnelMessage::decode(&payload).expect("a tunnel message");
                }
                Ok(Ok(Some(WsEvent::Ping(p)))) => {
                    self.writer.send(ws::OP_PONG, &p).await.expect("pong")
                }
                Ok(Ok(Some(WsEvent::Pong(_)))) => {}
                other => panic!("expected a tunnel message, got {other:?}"),
            }
        }
    }

    /// DATA of connection `id` up to a whole HTTP response head: the head and what followed.
    async fn response_head(
        &mut self,
        id: u64,
    ) -> (kubeedge_shared::stream::http::ResponseHead, Vec<u8>) {
        let mut buf = Vec::new();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no response head within {WAIT:?}: {buf:?}"
            );
            let m = self.next().await;
            assert_eq!((m.connect_id, m.kind), (id, MessageType::Data), "{buf:?}");
            buf.extend(m.data);
            if let Some((head, used)) =
                kubeedge_shared::stream::http::parse_response_head(&buf).expect("HTTP")
            {
                return (head, buf.split_off(used));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edgestream_serves_exec_for_a_kubeedge_cloud() {
    let mut env = EdgeEnv::start_with(EdgeOptions::new("stream-go-cloud")).await;
    env.stop_edge().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let d = env.dir.path().to_path_buf();
    let s = &mut env.config.modules.edge_stream;
    s.enable = true;
    s.server = listener.local_addr().expect("addr").to_string();
    s.tls_tunnel_ca_file = d.join("ca.crt").display().to_string();
    s.tls_tunnel_cert_file = d.join("edge.crt").display().to_string();
    s.tls_tunnel_private_key_file = d.join("edge.key").display().to_string();
    env.edge = Some(
        EdgeCore::start_with(&env.config, Some(env.edged_config()))
            .await
            .expect("edgecore starts"),
    );
    let mut cloud = GoCloud::accept(listener, &env.pki).await;
    env.wait_node_ready().await;
    env.create_pod(json!({
        "metadata": {"name": "target", "namespace": env.ns},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]}],
        },
    }))
    .await;
    env.wait_running("target").await;

    // EXEC_CONNECT as a Go cloudcore sends it: the edge relays containerd's own answer.
    let connect = |id: u64, method: &str, path: String, query: &str| {
        let v = json!({
            "messID": id,
            "method": method,
            "header": {
                "Connection": ["Upgrade"],
                "Upgrade": ["SPDY/3.1"],
                "X-Stream-Protocol-Version": ["v4.channel.k8s.io", "v3.channel.k8s.io"],
            },
            "url": {"Scheme": "http", "Opaque": "", "User": null, "Host": "127.0.0.1:10350",
                    "Path": path, "RawPath": "", "ForceQuery": false, "RawQuery": query,
                    "Fragment": "", "RawFragment": ""},
        });
        serde_json::to_vec(&v).expect("json")
    };
    let path = format!("/exec/{}/target/main", env.ns);
    cloud
        .send(TunnelMessage::new(
            7,
            MessageType::ExecConnect,
            connect(7, "POST", path, "command=sleep&command=30&output=1"),
        ))
        .await;
    let (head, _) = cloud.response_head(7).await;
    assert_eq!(head.status, 101, "{head:?}");
    assert_eq!(head.header("upgrade"), Some("SPDY/3.1"));
    assert_eq!(
        head.header("x-stream-protocol-version"),
        Some("v4.channel.k8s.io")
    );
    cloud
        .send(TunnelMessage::new(
            7,
            MessageType::RemoveConnect,
            Vec::new(),
        ))
        .await;

    // ATTACH_CONNECT for a container the pod does not run: the kubelet's error, then
    // REMOVE_CONNECT from the edge.
    let path = format!("/attach/{}/target/other", env.ns);
    cloud
        .send(TunnelMessage::new(
            8,
            MessageType::AttachConnect,
            connect(8, "GET", path, "output=1"),
        ))
        .await;
    // Leftover DATA of the ended exec stream may still arrive first: skipped, for [`WAIT`].
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut next_of_8 = async || loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "connection 8 not answered within {WAIT:?}"
        );
        let m = cloud.next().await;
        if m.connect_id != 7 {
            return m;
        }
    };
    let m = next_of_8().await;
    assert_eq!((m.connect_id, m.kind), (8, MessageType::Data));
    let (head, used) = kubeedge_shared::stream::http::parse_response_head(&m.data)
        .expect("HTTP")
        .expect("one frame holds the error");
    let mut body = m.data[used..].to_vec();
    assert_eq!(head.status, 500);
    loop {
        let m = next_of_8().await;
        assert_eq!(m.connect_id, 8);
        if m.kind == MessageType::RemoveConnect {
            break;
        }
        body.extend(m.data);
    }
    assert_eq!(
        String::from_utf8_lossy(&body),
        "container not found (\"other\")\n"
    );

    // PORT_FORWARD_CONNECT (7) as KubeEdge's port-forward change (PR #7019) sends it: the
    // exec payload for the kubelet's /portForward path; containerd's streaming server
    // upgrades. A bad port is the kubelet's 400, then REMOVE_CONNECT.
    let forward = |id: u64, query: &str| {
        let v = json!({
            "MessID": id,
            "method": "POST",
            "header": {
                "Connection": ["Upgrade"],
                "Upgrade": ["SPDY/3.1"],
                "X-Stream-Protocol-Version": ["portforward.k8s.io"],
            },
            "url": {"Scheme": "http", "Host": "127.0.0.1:10350",
                    "Path": format!("/portForward/{}/target", env.ns), "RawQuery": query},
        });
        serde_json::to_vec(&v).expect("json")
    };
    cloud
        .send(TunnelMessage::new(
            9,
            MessageType::PortForwardConnect,
            forward(9, ""),
        ))
        .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut buf = Vec::new();
    let head = loop {
        assert!(tokio::time::Instant::now() < deadline, "no answer: {buf:?}");
        let m = cloud.next().await;
        if m.connect_id != 9 {
            continue; // leftovers of the connections above
        }
        assert_eq!(m.kind, MessageType::Data);
        buf.extend(m.data);
        if let Some((head, _)) =
            kubeedge_shared::stream::http::parse_response_head(&buf).expect("HTTP")
        {
            break head;
        }
    };
    assert_eq!(head.status, 101, "{head:?}");
    assert_eq!(
        head.header("x-stream-protocol-version"),
        Some("portforward.k8s.io")
    );
    cloud
        .send(TunnelMessage::new(
            9,
            MessageType::RemoveConnect,
            Vec::new(),
        ))
        .await;
    cloud
        .send(TunnelMessage::new(
            10,
            MessageType::PortForwardConnect,
            forward(10, "port=0"),
        ))
        .await;
    let mut body = Vec::new();
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no answer: {body:?}"
        );
        let m = cloud.next().await;
        if m.connect_id != 10 {
            continue;
        }
        if m.kind == MessageType::RemoveConnect {
            break;
        }
        body.extend(m.data);
    }
    let (head, used) = kubeedge_shared::stream::http::parse_response_head(&body)
        .expect("HTTP")
        .expect("a head");
    assert_eq!(head.status, 400);
    assert_eq!(
        String::from_utf8_lossy(&body[used..]),
        "port \"0\" must be > 0\n"
    );
    env.finish().await;
}
