//! `kubectl port-forward` to a pod on an edge node through KubeEdge's stream tunnel: kubectl →
//! the API server (`pods/<name>/portforward`, proxied to the node's kubelet endpoint as
//! `/portForward/<ns>/<pod>`) → cloudcore's stream server → the WSS tunnel (PORT_FORWARD_CONNECT)
//! → edgecore's edgestream → CRI `PortForward` on the real containerd, whose streaming server
//! dials the port inside the pod's network namespace. kubectl ≥ 1.31 asks by default for SPDY
//! tunneled over WebSocket first (the API server translates it to SPDY for the kubelet); with
//! `KUBECTL_PORT_FORWARD_WEBSOCKETS=false` it speaks SPDY all the way. Both are checked.

use crate::stream::stream_env;
use e2e::edge::{EdgeEnv, WAIT, wait_for};
use e2e::images::BUSYBOX_IMAGE;
use serde_json::json;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The port the pod's greeting server listens on.
const POD_PORT: u16 = 8080;
/// The port of the pod's HTTP server (busybox httpd), which serves [`big_file`] as `/big`.
const HTTP_PORT: u16 = 8081;
/// Size of `/big`: many SPDY frames, tunnel messages and WebSocket messages.
const BIG: usize = 2 << 20;

/// What `yes 0123456789abcdef | head -c BIG` writes.
fn big_file() -> Vec<u8> {
    b"0123456789abcdef\n"
        .iter()
        .copied()
        .cycle()
        .take(BIG)
        .collect()
}

/// `GET /big` through the forwarded port: the whole body, byte for byte.
async fn fetch_big(local: u16) -> Result<(), String> {
    let mut c = TcpStream::connect(("127.0.0.1", local))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    c.write_all(b"GET /big HTTP/1.0\r\n\r\n")
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut all = Vec::new();
    tokio::time::timeout(WAIT, c.read_to_end(&mut all))
        .await
        .map_err(|_| format!("not all within {WAIT:?}: {} bytes", all.len()))?
        .map_err(|e| format!("read: {e}"))?;
    let at = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no HTTP head in {} bytes", all.len()))?;
    let head = String::from_utf8_lossy(&all[..at]).into_owned();
    if !head.starts_with("HTTP/1.") || !head.contains(" 200 ") {
        return Err(format!("answer: {head}"));
    }
    let body = &all[at + 4..];
    if body != big_file().as_slice() {
        return Err(format!("body of {} bytes differs from /big", body.len()));
    }
    Ok(())
}

/// A free port on the loopback interface (bound, read, released).
fn free_local_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("address").port()
}

/// A running `kubectl port-forward` and the local port it listens on.
struct PortForward {
    child: tokio::process::Child,
    local: u16,
    stderr: tokio::task::JoinHandle<String>,
}

impl PortForward {
    /// Starts kubectl and waits (within [`WAIT`]) for its `Forwarding from` line.
    async fn start(env: &EdgeEnv, pod: &str, remote: u16, websockets: bool) -> PortForward {
        let local = free_local_port();
        let mut cmd = env.cluster.kubectl();
        cmd.args([
            "port-forward",
            "-n",
            env.ns.as_str(),
            &format!("pod/{pod}"),
            &format!("{local}:{remote}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        // kubectl's default (WebSocket first since 1.31), or SPDY only.
        match websockets {
            true => cmd.env_remove("KUBECTL_PORT_FORWARD_WEBSOCKETS"),
            false => cmd.env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false"),
        };
        let mut child = cmd.spawn().expect("kubectl port-forward");
        let mut err = child.stderr.take().expect("stderr");
        let stderr = tokio::spawn(async move {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s).await;
            s
        });
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let want = format!("Forwarding from 127.0.0.1:{local} -> {remote}");
        let ready = tokio::time::timeout(WAIT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains(&want) {
                    return true;
                }
            }
            false
        })
        .await;
        if ready != Ok(true) {
            let _ = child.kill().await;
            let err = tokio::time::timeout(WAIT, stderr)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            panic!("kubectl port-forward did not start forwarding: {err}");
        }
        // kubectl keeps printing "Handling connection for …"; keep the pipe drained.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        PortForward {
            child,
            local,
            stderr,
        }
    }

    /// Stops kubectl as a user does (SIGINT) and waits for it to exit; its stderr.
    async fn stop(mut self) -> String {
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            e2e::process::signal(pid, libc::SIGINT);
        }
        let exited = tokio::time::timeout(WAIT, self.child.wait()).await;
        assert!(
            matches!(exited, Ok(Ok(_))),
            "kubectl port-forward exits on SIGINT: {exited:?}"
        );
        tokio::time::timeout(WAIT, self.stderr)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default()
    }
}

/// Connects to the forwarded port and has one conversation with the pod's server: its
/// greeting arrives, a line sent arrives there (echoed back). Retries while the server in
/// the pod is not listening yet; `Err` with what happened when the deadline passes.
async fn converse(local: u16, word: &str) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(10), talk(local, word)).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => last = e,
            Err(_) => last = "no answer within 10 s".into(),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Err(last)
}

async fn talk(local: u16, word: &str) -> Result<(), String> {
    let mut c = TcpStream::connect(("127.0.0.1", local))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    let greeting = b"hello-from-pod\n";
    while !got.ends_with(greeting) {
        let n = c.read(&mut buf).await.map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err(format!(
                "closed before the greeting: {:?}",
                String::from_utf8_lossy(&got)
            ));
        }
        got.extend_from_slice(&buf[..n]);
    }
    c.write_all(format!("{word}\n").as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let want = format!("got:{word}\n");
    let mut echo = Vec::new();
    while !echo.ends_with(want.as_bytes()) {
        let n = c.read(&mut buf).await.map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err(format!(
                "closed before the echo: {:?}",
                String::from_utf8_lossy(&echo)
            ));
        }
        echo.extend_from_slice(&buf[..n]);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_port_forward_reaches_a_server_in_an_edge_pod() {
    let Some((env, stream)) = stream_env("stream-pf").await else {
        return;
    };
    // busybox nc as a server: greets each connection and echoes the first line back.
    let script = "#!/bin/sh\\necho hello-from-pod\\nread l\\necho got:$l\\n";
    env.create_pod(json!({
        "metadata": {"name": "server", "namespace": env.ns},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "command": ["sh", "-c", format!(
                    "mkdir -p /tmp /www && printf '{script}' > /tmp/s && chmod +x /tmp/s && \
                     yes 0123456789abcdef | head -c {BIG} > /www/big && \
                     httpd -p {HTTP_PORT} -h /www && \
                     exec nc -ll -p {POD_PORT} -e /tmp/s"
                )],
            }],
        },
    }))
    .await;
    env.wait_running("server").await;

    for websockets in [true, false] {
        let pf = PortForward::start(&env, "server", POD_PORT, websockets).await;
        let how = if websockets { "websocket" } else { "spdy" };
        if let Err(e) = converse(pf.local, &format!("ping-{how}")).await {
            let err = pf.stop().await;
            panic!("no conversation through port-forward ({how}): {e}; kubectl: {err}");
        }
        // A second connection rides the same upgraded connection (new SPDY streams).
        converse(pf.local, &format!("again-{how}"))
            .await
            .unwrap_or_else(|e| panic!("second connection ({how}): {e}"));
        assert_eq!(
            stream.open_connections(&env.node),
            1,
            "one tunnel connection per kubectl port-forward ({how})"
        );
        let err = pf.stop().await;
        assert!(
            !err.contains("error"),
            "kubectl port-forward ({how}) reported: {err}"
        );
        wait_for("the port-forward connection to close", WAIT, || async {
            (stream.open_connections(&env.node) == 0).then_some(())
        })
        .await;

        // 2 MiB from the pod's HTTP server, intact.
        let pf = PortForward::start(&env, "server", HTTP_PORT, websockets).await;
        if let Err(e) = fetch_big(pf.local).await {
            let err = pf.stop().await;
            panic!("GET /big through port-forward ({how}): {e}; kubectl: {err}");
        }
        let err = pf.stop().await;
        assert!(
            !err.contains("error"),
            "kubectl port-forward ({how}) reported: {err}"
        );
        wait_for("the port-forward connection to close", WAIT, || async {
            (stream.open_connections(&env.node) == 0).then_some(())
        })
        .await;
    }

    // A port nothing listens on in the pod: the runtime's refusal reaches kubectl (which
    // closes the local connection and reports it), and the tunnel connection ends with it.
    let pf = PortForward::start(&env, "server", 9, true).await;
    let mut c = TcpStream::connect(("127.0.0.1", pf.local))
        .await
        .expect("kubectl accepts the local connection");
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(WAIT, c.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the local connection is closed: {closed:?} {rest:?}"
    );
    let err = pf.stop().await;
    assert!(
        err.contains("error forwarding port 9") && err.contains("connection refused"),
        "kubectl reports the refused port: {err}"
    );
    wait_for(
        "the failed port-forward connection to close",
        WAIT,
        || async { (stream.open_connections(&env.node) == 0).then_some(()) },
    )
    .await;
    assert!(stream.is_connected(&env.node), "the tunnel is still up");

    // A pod that does not exist: the API server says so.
    let out = env
        .cluster
        .kubectl_run(
            &["port-forward", "-n", env.ns.as_str(), "pod/nope", "1:1"],
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
