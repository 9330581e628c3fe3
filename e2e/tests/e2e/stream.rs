//! `kubectl logs` for pods on an edge node through KubeEdge's stream tunnel: kubectl → the
//! API server (`pods/<name>/log`, which calls the node's kubelet endpoint) → cloudcore's
//! stream server → the WSS tunnel → edgecore's edgestream → the container's CRI log file on
//! the real containerd. The node reports the stream server's port as its kubelet port (on a
//! real multi-host cluster an iptables DNAT makes `<node IP>:<port>` reach cloudcore).

use cloudcore::cloudstream::{CloudStream, StreamSettings};
use e2e::edge::{EdgeEnv, EdgeOptions, WAIT, wait_for};
use e2e::images::BUSYBOX_IMAGE;
use edgecore::app::EdgeCore;
use serde_json::json;
use std::process::Stdio;
use std::time::Instant;
use tokio::io::{AsyncBufReadExt, BufReader};

/// An edge node whose edgecore runs edgestream against an in-process cloudstream.
async fn stream_env(prefix: &str) -> (EdgeEnv, CloudStream) {
    let mut env = EdgeEnv::start_with(EdgeOptions::new(prefix)).await;
    env.stop_edge().await;
    let local = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let stream = CloudStream::start(
        StreamSettings {
            stream_listen: local,
            tunnel_listen: local,
            chain: vec![env.pki.server.cert_der.clone()],
            key: env.pki.server.key_der(),
            ca: vec![env.pki.ca.cert.cert_der.clone()],
        },
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
    (env, stream)
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
    let (env, stream) = stream_env("stream-logs").await;
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
    let mut child = env
        .cluster
        .kubectl()
        .args(["logs", "-f", "--tail=1", "-n", &env.ns, "talker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl logs -f");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    let followed = tokio::time::timeout(WAIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.push(line);
            if seen.len() >= 3 {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(followed, Ok(true), "kubectl logs -f streamed {seen:?}");
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
    let (env, _stream) = stream_env("stream-missing").await;
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
