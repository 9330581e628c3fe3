//! Router benchmark. Prints numbers; asserts nothing.
//!
//!     cargo build --profile bench-fast -p e2e --bin bench-router
//!     target/bench-fast/bench-router      # BENCH_REQUESTS=20000 BENCH_CONCURRENCY=32 BENCH_MESSAGES=20000
//!
//! In this process: the in-memory API server, cloudcore's cloudhub and router, and an edgecore
//! (edged off; servicebus on; eventbus on mosquitto when installed, else its internal broker)
//! connected over real mTLS WebSocket on loopback; an HTTP server standing for the edge
//! application and one for the cloud endpoint.
//!
//! 1. rest → servicebus: `GET http://<router>/<node>/default/app/x` → servicebus → the edge
//!    app → back; requests/s and latency with `BENCH_CONCURRENCY` clients, and one at a time.
//! 2. eventbus → rest: `BENCH_MESSAGES` MQTT messages published at the edge (QoS 1, one
//!    publisher) → eventbus → cloudhub → router → POST to the cloud endpoint; messages/s until
//!    the last arrives (and how many arrived), with edgehub's `messageQPS` unlimited (`0`).

use anyhow::Context;
use bytes::Bytes;
use e2e::apiserver::{ApiServer, Config};
use e2e::bench::{env_usize, percentile};
use e2e::channel::Pki;
use e2e::cloud::CloudFixture;
use e2e::mosquitto::Mosquitto;
use e2e::router::{self as r, CloudEndpoint};
use edgecore::app::EdgeCore;
use edgecore::config::EdgeCoreConfig;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The edge application: answers every request `200 ok` with a header.
async fn edge_app() -> anyhow::Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    let mut resp = http::Response::new(Full::new(Bytes::from_static(b"ok")));
                    resp.headers_mut()
                        .insert("x-app", http::HeaderValue::from_static("bench"));
                    Ok::<_, std::convert::Infallible>(resp)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    Ok(port)
}

fn edge_config(
    dir: &std::path::Path,
    pki: &Pki,
    node: &str,
    server: std::net::SocketAddr,
    mqtt: &str,
) -> anyhow::Result<EdgeCoreConfig> {
    let cert = pki.node_cert(node)?;
    std::fs::write(dir.join("ca.crt"), &pki.ca.cert.cert_pem)?;
    std::fs::write(dir.join("edge.crt"), &cert.cert_pem)?;
    std::fs::write(dir.join("edge.key"), &cert.key_pem)?;
    let servicebus_port = r::free_port();
    let d = dir.display();
    let yaml = format!(
        "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\n\
         database:\n  dataSource: {d}/edgecore.db\n\
         modules:\n  edgeHub:\n    heartbeat: 15\n    messageQPS: 0\n    tlsCaFile: {d}/ca.crt\n\
         \x20   tlsCertFile: {d}/edge.crt\n    tlsPrivateKeyFile: {d}/edge.key\n\
         \x20   websocket:\n      server: {server}\n\
         \x20 edged:\n    enable: false\n    hostnameOverride: {node}\n\
         \x20 deviceTwin:\n    dmiSockPath: {d}\n\
         \x20 serviceBus:\n    enable: true\n    port: {servicebus_port}\n{mqtt}"
    );
    std::fs::write(dir.join("edgecore.yaml"), yaml)?;
    Ok(EdgeCoreConfig::load(&dir.join("edgecore.yaml"))?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    e2e::bench::env_configured_cli(include_str!("bench-router.rs"));
    let requests = env_usize("BENCH_REQUESTS", 20_000);
    let concurrency = env_usize("BENCH_CONCURRENCY", 32).max(1);
    let messages = env_usize("BENCH_MESSAGES", 20_000);

    let api = ApiServer::start(Config::default()).await?;
    let client = api.client()?;
    r::install(&client).await?;
    let pki = Pki::new()?;
    let cloud = CloudFixture::start(client.clone(), &pki).await?;
    let router_metrics = cloudcore::router::RouterMetrics::default();
    let router = cloudcore::router::Router::start(
        cloudcore::router::RouterSettings {
            listen: ([127, 0, 0, 1], 0).into(),
            ..cloudcore::router::RouterSettings::default()
        },
        client.clone(),
        cloud.hub.clone(),
        router_metrics.clone(),
        tokio_util::sync::CancellationToken::new(),
    )
    .await?;

    // The edge: eventbus on mosquitto when installed, else on its internal broker.
    let broker = Mosquitto::installed()
        .then(Mosquitto::start)
        .transpose()
        .context("mosquitto")?;
    let (mqtt_yaml, mqtt_addr, broker_name) = match &broker {
        Some(b) => (
            format!(
                "\x20 eventBus:\n    mqttMode: 2\n    mqttServerExternal: {}\n",
                b.url()
            ),
            b.addr(),
            "mosquitto",
        ),
        None => {
            let port = r::free_port();
            (
                format!(
                    "\x20 eventBus:\n    mqttMode: 0\n    mqttServerInternal: tcp://127.0.0.1:{port}\n"
                ),
                ([127, 0, 0, 1], port).into(),
                "the internal broker",
            )
        }
    };
    let dir = tempfile::tempdir()?;
    let node = "bench-router";
    let config = edge_config(dir.path(), &pki, node, cloud.hub.local_addr(), &mqtt_yaml)?;
    let edge = EdgeCore::start_with(&config, None).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cloud.hub.is_connected(node) {
        anyhow::ensure!(Instant::now() < deadline, "the edge did not connect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let app_port = edge_app().await?.to_string();
    let mut endpoint = CloudEndpoint::start("ok").await;
    r::create_endpoint(&client, "default", "rest", "rest", &[]).await;
    r::create_endpoint(&client, "default", "bus", "eventbus", &[]).await;
    r::create_endpoint(
        &client,
        "default",
        "sb",
        "servicebus",
        &[("service_port", &app_port)],
    )
    .await;
    r::create_rule(
        &client,
        "default",
        "app",
        ("rest", &[("path", "/app")]),
        ("sb", &[("path", "/")]),
    )
    .await;
    r::create_rule(
        &client,
        "default",
        "up",
        ("bus", &[("topic", "telemetry"), ("node_name", node)]),
        ("rest", &[("resource", &endpoint.url("/in"))]),
    )
    .await;
    let url = format!("http://{}/{node}/default/app/x", router.local_addr());
    r::request_until("GET", &url, b"", "the rule in force", |a| a.status == 200).await;

    // ── rest → servicebus ────────────────────────────────────────────────────────────────
    let http = cloudcore::router::HttpClient::new();
    let call = |http: cloudcore::router::HttpClient, url: String| async move {
        let req = http::Request::get(&url)
            .body(Full::new(Bytes::new()))
            .expect("request");
        let t = Instant::now();
        let r = http.call(req, Duration::from_secs(30), 1 << 20).await;
        (t.elapsed(), r.map(|a| a.status.as_u16()).unwrap_or(0))
    };
    let mut alone = Vec::new();
    for _ in 0..500 {
        let (d, status) = call(http.clone(), url.clone()).await;
        anyhow::ensure!(status == 200, "unloaded call answered {status}");
        alone.push(d);
    }
    alone.sort();
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (http, url, next, failed) =
                (http.clone(), url.clone(), next.clone(), failed.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < requests {
                    let (d, status) = call(http.clone(), url.clone()).await;
                    if status != 200 {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    lat.push(d);
                }
                lat
            })
        })
        .collect();
    let mut loaded = Vec::new();
    for w in workers {
        loaded.extend(w.await?);
    }
    let elapsed = started.elapsed();
    loaded.sort();
    println!(
        "rest → servicebus, one at a time: p50 {:.2?}, p99 {:.2?} (500 calls)",
        percentile(&alone, 0.5),
        percentile(&alone, 0.99)
    );
    println!(
        "rest → servicebus, {concurrency} clients: {:.0} requests/s, p50 {:.2?}, p99 {:.2?} ({requests} calls, {} not 200)",
        requests as f64 / elapsed.as_secs_f64(),
        percentile(&loaded, 0.5),
        percentile(&loaded, 0.99),
        failed.load(Ordering::Relaxed)
    );

    // ── eventbus → rest ──────────────────────────────────────────────────────────────────
    let sensor = e2e::mqtt::MqttClient::connect(mqtt_addr, "bench-sensor").await;
    let topic = "default/telemetry";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        sensor.publish(topic, "warm-up").await;
        if tokio::time::timeout(Duration::from_millis(300), endpoint.received.recv())
            .await
            .is_ok()
        {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "no upload reached the endpoint");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    while endpoint.received.try_recv().is_ok() {}
    // At most `window` messages on their way at once (the eventbus drops what its bounded
    // queues cannot take: an open-loop burst measures the drops, not the throughput).
    let window = env_usize("BENCH_WINDOW", 1000).max(1);
    let arrived = Arc::new(AtomicUsize::new(0));
    let count = arrived.clone();
    let started = Instant::now();
    let receiver = tokio::spawn(async move {
        let mut last = Instant::now();
        while count.load(Ordering::Relaxed) < messages {
            match tokio::time::timeout(Duration::from_secs(5), endpoint.received.recv()).await {
                Ok(Some(_)) => {
                    count.fetch_add(1, Ordering::Relaxed);
                    last = Instant::now();
                }
                _ => break,
            }
        }
        last
    });
    for i in 0..messages {
        let waited = Instant::now();
        while i >= arrived.load(Ordering::Relaxed) + window {
            if waited.elapsed() > Duration::from_secs(5) {
                break;
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        sensor.publish(topic, format!("{{\"t\":{i}}}")).await;
    }
    let last = receiver.await?;
    let got = arrived.load(Ordering::Relaxed);
    let took = last.duration_since(started);
    println!(
        "eventbus → rest ({broker_name}, ≤ {window} in flight): {got} of {messages} messages reached the endpoint, {:.0} messages/s ({took:.2?})",
        got as f64 / took.as_secs_f64(),
    );
    let busy = router_metrics
        .edge_messages
        .get_or_create(&cloudcore::router::EdgeLabel {
            kind: "eventbus_upload",
            outcome: "busy",
        })
        .get();
    println!("  dropped by the router (upload queue full): {busy}");
    let dropped = |reason: &'static str| {
        cloud
            .metrics
            .messages_dropped
            .get_or_create(&cloudcore::metrics::ReasonLabel { reason })
            .get()
    };
    println!(
        "  dropped at cloudhub for the router: {} (router_full), {} (no_router)",
        dropped("router_full"),
        dropped("no_router")
    );
    edge.shutdown().await;
    router.shutdown();
    cloud.shutdown().await;
    drop(broker);
    api.shutdown().await;
    Ok(())
}
