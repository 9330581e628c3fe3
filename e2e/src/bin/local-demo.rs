//! The local demo: everything kubeedge-rs needs on one machine, without a cluster.
//!
//! Today it starts the container runtime side — a private containerd with the locally built
//! busybox and pause images and a local registry (`e2e::containerd`) — the in-memory API server
//! (with a kubeconfig for kubectl), cloudcore (cloudhub, edge controllers and the stream tunnel)
//! and edgecore for node `edge-demo` at the test node address (`e2e::node_address`: not
//! loopback, so the API server's node proxy reaches it); runs a sample pod there, shows it
//! Running and its `kubectl logs`; runs Deployment `web` scaled to 3 on the edge node, a Modbus
//! device with its mapper, and the edge's MetaServer; a router rule that takes
//! `curl http://127.0.0.1:9443/edge-demo/default/web` to the `web` pods (rest → servicebus);
//! `kill -USR1` stops cloudcore and starts it again (offline autonomy on demand); tears it all
//! down on Ctrl-C, SIGTERM or SIGHUP (also when its output was closed).
//!
//! Run with `bash scripts/demo.sh` (installs the packages, then builds and runs it with the
//! `bench-fast` profile). Needs root. One demo runs per machine (`take_demo_lock`); the
//! terminal shows the walk-through, the components log to files (`init_logs`).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use cloudcore::cloudstream::ClientAuth;
use cloudcore::cloudstream::CloudStream;
use e2e::apiserver::{ApiServer, Config as ApiConfig};
use e2e::channel::Pki;
use e2e::cloud::CloudFixture;
use e2e::containerd::Containerd;
use e2e::images::{BUSYBOX_DOCKER_HUB_IMAGE, BUSYBOX_IMAGE, PAUSE_IMAGE};
use e2e::node_address::NodeAddress;
use e2e::stream_client::node_facing_settings;
use edgecore::app::EdgeCore;
use edgecore::config::EdgeCoreConfig;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use tokio::signal::unix::{SignalKind, signal};

/// `println!` that survives a closed stdout (`| head`, a closed terminal): the demo must still
/// reach its teardown, so output errors are ignored.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// The local demo: an in-memory control plane, cloudcore and edgecore for node `edge-demo` on
/// this machine, a private containerd and a sample pod; Ctrl-C, SIGTERM or SIGHUP stops it and removes
/// everything it started. Needs root; `bash scripts/demo.sh` installs the packages first.
#[derive(Parser)]
#[command(name = "local-demo", version)]
struct Args {}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Args::parse();
    // One demo per machine: it owns its directory, kubeconfig, ports and edgemesh's address.
    let _demo_lock = take_demo_lock()?;
    let logs = std::env::temp_dir().join("kubeedge-rs-demo-logs");
    init_logs(&logs).context("opening the demo's log files")?;

    // Signals first, so that a Ctrl-C during start-up still leads to a clean teardown.
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing SIGHUP handler")?;

    say!(
        "Logs: {dir}/{{apiserver,cloudcore,edgecore,demo}}.log   (tail -f {dir}/edgecore.log)",
        dir = logs.display()
    );
    step(1, "container runtime: private containerd + local registry");
    let started = Instant::now();
    let containerd = tokio::task::spawn_blocking(Containerd::start)
        .await
        .context("containerd start-up task")??;
    let runtime = containerd
        .cri()
        .await
        .context("connecting to containerd over CRI")?
        .version()
        .await
        .context("CRI Version")?;
    say!(
        "    {} {} (CRI {}) ready in {:.1?}",
        runtime.runtime_name,
        runtime.runtime_version,
        runtime.runtime_api_version,
        started.elapsed()
    );
    say!("    CRI endpoint   {}", containerd.endpoint());
    say!(
        "    registry       http://{}  (localhost:5000/* and docker.io/* resolve to it)",
        containerd.registry().host()
    );
    say!(
        "    pod network    {} on bridge {}",
        containerd.pod_subnet(),
        containerd.bridge()
    );
    say!("    images         {BUSYBOX_IMAGE} (= {BUSYBOX_DOCKER_HUB_IMAGE}), {PAUSE_IMAGE}");
    say!(
        "    inspect        ctr --address {} --namespace k8s.io containers ls",
        containerd.socket().display()
    );
    say!("    logs           {}", containerd.log_path().display());

    // ── Control plane ────────────────────────────────────────────────────────────────────
    step(2, "control plane: in-memory Kubernetes API server");
    let demo_dir = std::env::temp_dir().join("kubeedge-rs-demo");
    // Left by a demo that was killed: this one holds the lock, nothing else uses it.
    let _ = std::fs::remove_dir_all(&demo_dir);
    std::fs::create_dir_all(&demo_dir).context("creating the demo directory")?;
    let kubeconfig = demo_dir.join("kubeconfig");
    let api = ApiServer::start(ApiConfig {
        kubeconfig_path: Some(kubeconfig.clone()),
        ..ApiConfig::default()
    })
    .await
    .context("starting the in-memory API server")?;
    say!("    API server     {}", api.url());
    say!(
        "    kubectl        export KUBECONFIG={}",
        kubeconfig.display()
    );
    say!("                   kubectl get nodes,pods -A -o wide");

    // ── cloudcore ────────────────────────────────────────────────────────────────────────
    step(3, "cloudcore: cloudhub + edge controllers");
    // KubeEdge's ObjectSync CRDs, as the Helm chart installs them (used for KubeEdge edges).
    e2e::reliablesyncs::install(&api.client()?)
        .await
        .context("installing the reliablesyncs CRDs")?;
    // Device and DeviceModel (devices.kubeedge.io), as the Helm chart installs them.
    e2e::devices::install(&api.client()?)
        .await
        .context("installing the device CRDs")?;
    // Rule and RuleEndpoint (rules.kubeedge.io), as the Helm chart installs them.
    e2e::router::install(&api.client()?)
        .await
        .context("installing the router CRDs")?;
    let pki = Pki::new().context("creating the demo CA")?;
    std::fs::write(demo_dir.join("rootCA.crt"), &pki.ca.cert.cert_pem)?;
    let cloud = CloudFixture::start(api.client()?, &pki)
        .await
        .context("starting cloudcore")?;
    say!(
        "    cloudhub       wss://{}  (CA: {})",
        cloud.hub.local_addr(),
        demo_dir.join("rootCA.crt").display()
    );
    // The stream tunnel for `kubectl logs`: the node reports the stream server's port as its
    // kubelet port, so the API server reaches cloudcore, which asks the edge over the tunnel.
    // Only the API server (its kubelet client certificate, from the cluster CA).
    let client_auth = ClientAuth::Verify(
        api.kube_config()?
            .root_cert
            .into_iter()
            .flatten()
            .map(rustls_pki_types::CertificateDer::from)
            .collect(),
    );
    // The node's address, where the API server finds its "kubelet" (the stream server): not
    // loopback, which an API server refuses to proxy to (`kubectl get --raw
    // /api/v1/nodes/edge-demo/proxy/stats/summary` answers "address not allowed").
    let node_address = NodeAddress::ensure().map_err(anyhow::Error::msg)?;
    let stream = CloudStream::start(
        node_facing_settings(&pki, client_auth, node_address.ip, None),
        api.client()?,
    )
    .await
    .context("starting cloudstream")?;
    say!(
        "    cloudstream    https://{} (kubelet API), tunnel wss://{}",
        stream.stream_addr(),
        stream.tunnel_addr()
    );

    // The edge reaches cloudhub through a relay, so that `kill -USR1` can stop cloudcore and
    // start a new one where the edge's link leads (offline autonomy, on demand).
    let link = e2e::channel::FaultProxy::start(cloud.hub.local_addr())
        .await
        .context("starting the cloud link relay")?;
    let mut cloud = Some(cloud);

    // ── edgecore ─────────────────────────────────────────────────────────────────────────
    step(
        4,
        "edgecore: edge node `edge-demo` on the private containerd",
    );
    let node = "edge-demo";
    // The eventbus runs KubeEdge's internal MQTT broker (mqttMode 0) on a free loopback port.
    let mqtt_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let cert = pki.node_cert(node).context("edge certificate")?;
    std::fs::write(demo_dir.join("edge.crt"), &cert.cert_pem)?;
    std::fs::write(demo_dir.join("edge.key"), &cert.key_pem)?;
    // The demo's disk thresholds are absolute (1Gi) rather than the kubelet's 10%/15%: a
    // developer machine with a big, fairly full disk would otherwise be under DiskPressure and
    // every demo pod evicted. edgecore's own defaults stay the kubelet's.
    let yaml = format!(
        "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\n\
         database:\n  dataSource: {db}\n\
         modules:\n  edgeHub:\n    tlsCaFile: {ca}\n    tlsCertFile: {crt}\n    tlsPrivateKeyFile: {key}\n\
         \x20   websocket:\n      server: {server}\n\
         \x20 edgeStream:\n    enable: true\n    server: {tunnel}\n    tlsTunnelCAFile: {ca}\n\
         \x20   tlsTunnelCertFile: {crt}\n    tlsTunnelPrivateKeyFile: {key}\n\
         \x20 deviceTwin:\n    dmiSockPath: {dmi}\n\
         \x20 eventBus:\n    mqttMode: 0\n    mqttServerInternal: tcp://127.0.0.1:{mqtt_port}\n\
         \x20 metaManager:\n    metaServer:\n      enable: true\n      server: 127.0.0.1:{metaserver_port}\n\
         \x20 edgeMesh:\n    enable: true\n\
         \x20 serviceBus:\n    enable: true\n\
         \x20 edged:\n    hostnameOverride: {node}\n    nodeIP: {node_ip}\n    remoteRuntimeEndpoint: {endpoint}\n\
         \x20   podSandboxImage: {pause}\n    rootDirectory: {root}\n\
         \x20   tailoredKubeletConfig:\n      cgroupRoot: {DEMO_CGROUP_ROOT}\n      staticPodPath: {manifests}\n\
         \x20     evictionHard:\n        memory.available: 100Mi\n        nodefs.available: 1Gi\n        imagefs.available: 1Gi\n        nodefs.inodesFree: 5%\n",
        manifests = demo_dir.join("manifests").display(),
        db = demo_dir.join("edgecore.db").display(),
        dmi = demo_dir.display(),
        mqtt_port = mqtt_port,
        metaserver_port = METASERVER_PORT,
        ca = demo_dir.join("rootCA.crt").display(),
        crt = demo_dir.join("edge.crt").display(),
        key = demo_dir.join("edge.key").display(),
        server = link.addr,
        tunnel = stream.tunnel_addr(),
        node_ip = node_address.ip,
        endpoint = containerd.endpoint(),
        pause = PAUSE_IMAGE,
        root = demo_dir.join("edged").display(),
    );
    let config_path = demo_dir.join("edgecore.yaml");
    std::fs::write(&config_path, yaml)?;
    let config = EdgeCoreConfig::load(&config_path).context("demo edgecore.yaml")?;
    let mut edged = edgecore::edged_config::edged_config(&config);
    edged.kubelet_port = i32::from(stream.stream_addr().port());
    let edge = EdgeCore::start_with(&config, Some(edged))
        .await
        .context("starting edgecore")?;
    say!("    config         {}", config_path.display());
    say!(
        "    node address   {}  (stats: kubectl get --raw /api/v1/nodes/{node}/proxy/stats/summary)",
        node_address.ip
    );

    step(5, "sample pod `hello` on the edge node");
    let client = api.client()?;
    wait_until("node edge-demo Ready", Duration::from_secs(60), || async {
        let n = Api::<Node>::all(client.clone())
            .get_opt(node)
            .await
            .ok()??;
        n.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(())
    })
    .await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hello", "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "hello", "image": BUSYBOX_IMAGE,
            "command": ["sh", "-c", "echo hello from the edge; exec sleep 1000000"]}]}
    }))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod)
        .await
        .context("creating the sample pod")?;
    wait_until("pod hello Running", Duration::from_secs(120), || async {
        let p = pods.get_opt("hello").await.ok()??;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await?;
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["get", "pods", "-o", "wide"])
        .output()
        .await
        .context("running kubectl")?;
    say!("    $ kubectl get pods -o wide");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        say!("    {line}");
    }

    wait_until(
        "the edge's stream tunnel",
        Duration::from_secs(30),
        || async { stream.is_connected(node).then_some(()) },
    )
    .await?;
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["logs", "hello"])
        .output()
        .await
        .context("running kubectl logs")?;
    say!("    $ kubectl logs hello      (through cloudcore's stream tunnel)");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        say!("    {line}");
    }
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        say!("    {line}");
    }

    step(6, "a Deployment for edge nodes, scaled to 3 on `edge-demo`");
    deployment_demo(&client, &kubeconfig)
        .await
        .context("the Deployment demo")?;

    step(
        7,
        "Service `web` at the edge: pod `client` fetches http://web/ by name (edgemesh)",
    );
    let client_log = service_demo(&client, node, &kubeconfig)
        .await
        .context("the Service demo")?;

    step(
        8,
        "a device: a Modbus thermostat, served by modbus-mapper over DMI",
    );
    let devices = device_demo(&client, node, &demo_dir, &kubeconfig)
        .await
        .context("the device demo")?;
    say!(
        "    MQTT           mosquitto_sub -h 127.0.0.1 -p {mqtt_port} -t '$hw/events/device/#' -v"
    );

    say!(
        "    MetaServer     kubectl --server http://127.0.0.1:{METASERVER_PORT} get pods -A   (the edge's own API, also offline)"
    );

    step(
        9,
        "the router: a rule from the cloud's REST API to the `web` pods (rest → servicebus)",
    );
    let mut router = Some(
        router_demo(cloud.as_ref().context("cloudcore")?, &client, node)
            .await
            .context("the router demo")?,
    );

    let mut cloud_toggle =
        signal(SignalKind::user_defined1()).context("installing SIGUSR1 handler")?;
    say!(
        "\nReady. `kill -USR1 {}` stops cloudcore (the edge goes offline, its pods keep running) and, sent again, starts it. Ctrl-C stops and removes everything.",
        std::process::id()
    );
    loop {
        tokio::select! {
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            _ = hangup.recv() => break,
            _ = cloud_toggle.recv() => match cloud.take() {
                Some(running) => {
                    drop(router.take());
                    running.shutdown().await;
                    say!("cloudcore stopped: edge-demo is offline. Its pods keep running; `kubectl get pods` shows what the cluster last heard, the MetaServer answers from the edge's database. `kill -USR1 {}` starts cloudcore again.", std::process::id());
                    let log = client_log.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(3)).await;
                        if let Some(line) = last_served(&log) {
                            say!("    offline, pod `client` still reaches Service web by name: {line}   (tail -f {})", log.display());
                        }
                    });
                }
                None => match CloudFixture::start(api.client()?, &pki).await {
                    Ok(started) => {
                        link.set_upstream(started.hub.local_addr());
                        router = Some(e2e::router::start(&started, api.client()?, router_settings()).await);
                        cloud = Some(started);
                        say!("cloudcore started again: edge-demo reconnects and reports its pods.");
                    }
                    Err(e) => say!("cloudcore did not start again: {e:#}"),
                },
            },
        }
    }

    say!("\nStopping: removing pods, containerd, registry, bridge and temporary files...");
    let stopping = Instant::now();
    drop(devices);
    drop(router);
    edge.shutdown().await;
    // edgemesh's rules and address outlive edgecore on purpose; the demo removes them.
    if let Err(e) = edgecore::mesh::cleanup(&config) {
        say!("    edgemesh's rules not removed: {e}");
    }
    stream.shutdown();
    if let Some(cloud) = cloud {
        cloud.shutdown().await;
    }
    api.shutdown().await;
    node_address.remove_if_added();
    let _ = std::fs::remove_dir_all(&demo_dir);
    tokio::task::spawn_blocking(move || drop(containerd))
        .await
        .context("teardown task")?;
    // After the runtime: its containers' cgroups are gone, so the pods' can go.
    e2e::edge::remove_cgroup_tree(DEMO_CGROUP_ROOT);
    say!("Stopped in {:.1?}.", stopping.elapsed());
    Ok(())
}

/// The demo edge's `cgroupRoot` (its pods' cgroups, removed at exit).
const DEMO_CGROUP_ROOT: &str = "/kubeedge-rs-demo";

/// Where a running demo records itself; `flock`ed while it runs (released when it exits, also
/// when it is killed).
fn demo_lock_path() -> std::path::PathBuf {
    std::env::temp_dir().join("kubeedge-rs-demo.lock")
}

/// Refuses to start a second demo: it would share the first one's directory, kubeconfig,
/// MetaServer and router ports, node address and edgemesh address, and tear them down.
fn take_demo_lock() -> anyhow::Result<std::fs::File> {
    use std::io::Write as _;
    let path = demo_lock_path();
    let lock = e2e::process::try_lock_file(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let Some(mut file) = lock else {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        anyhow::bail!(
            "another local demo is running (pid {}; also the case while the e2e test \
             a_demo_with_closed_output_cleans_up_on_sighup runs): it owns {}, its kubeconfig, \
             127.0.0.1:{METASERVER_PORT}, 127.0.0.1:{ROUTER_PORT} and edgemesh's 169.254.96.16. \
             Stop it first (Ctrl-C in its terminal, or kill -INT {})",
            holder.trim(),
            std::env::temp_dir().join("kubeedge-rs-demo").display(),
            holder.trim()
        );
    };
    file.set_len(0)?;
    write!(file, "{}", std::process::id())?;
    Ok(file)
}

/// The demo's terminal shows the walk-through; the components log to files in `dir`, one per
/// component (`RUST_LOG` filters them, default `info`), kept after the demo ends.
fn init_logs(dir: &std::path::Path) -> anyhow::Result<()> {
    use tracing_subscriber::filter::filter_fn;
    use tracing_subscriber::prelude::*;
    std::fs::create_dir_all(dir)?;
    const COMPONENTS: [(&str, &[&str]); 3] = [
        ("apiserver.log", &["kube_memserver"]),
        ("cloudcore.log", &["cloudcore"]),
        (
            "edgecore.log",
            &["edgecore", "kubeedge_edgemesh", "kubeedge_dmi"],
        ),
    ];
    let of = |target: &str, prefixes: &[&str]| prefixes.iter().any(|p| target.starts_with(p));
    let mut layers = Vec::new();
    for (file, prefixes) in COMPONENTS {
        let writer = std::sync::Mutex::new(std::fs::File::create(dir.join(file))?);
        layers.push(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(writer)
                .with_filter(filter_fn(move |m| of(m.target(), prefixes)))
                .boxed(),
        );
    }
    let rest = std::sync::Mutex::new(std::fs::File::create(dir.join("demo.log"))?);
    layers.push(
        tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(rest)
            .with_filter(filter_fn(move |m| {
                !COMPONENTS.iter().any(|(_, p)| of(m.target(), p))
            }))
            .boxed(),
    );
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // kube's per-request trace layer reports every failed request at ERROR
                // without context (also those a shutdown aborts); the callers log failures.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("info,kube_client::client::builder=off")
                }),
        )
        .with(layers)
        .init();
    Ok(())
}

/// The edge's MetaServer port in the demo (KubeEdge's default).
const METASERVER_PORT: u16 = 10550;

/// Creates Deployment `web` (busybox httpd on :8080) for edge nodes (nodeSelector
/// `node-role.kubernetes.io/edge`), scales it to 3 with kubectl and shows its pods.
async fn deployment_demo(
    client: &kube::Client,
    kubeconfig: &std::path::Path,
) -> anyhow::Result<()> {
    use k8s_openapi::api::apps::v1::Deployment;
    let deploy: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"nodeSelector": {"node-role.kubernetes.io/edge": ""},
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{"name": "web", "image": BUSYBOX_IMAGE,
                        "command": ["sh", "-c", "echo \"served by $(hostname)\" > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"],
                        "ports": [{"containerPort": 8080}]}]}}}
    }))?;
    let api: Api<Deployment> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &deploy)
        .await
        .context("creating Deployment web")?;
    let kubectl = |args: &[&str]| {
        let mut c = tokio::process::Command::new("kubectl");
        c.arg("--kubeconfig").arg(kubeconfig).args(args);
        c
    };
    let ready = |want: i32| {
        let api = api.clone();
        async move {
            let d = api.get_opt("web").await.ok()??;
            (d.status?.ready_replicas.unwrap_or(0) >= want).then_some(())
        }
    };
    wait_until("Deployment web: 1 ready", Duration::from_secs(120), || {
        ready(1)
    })
    .await?;
    say!("    $ kubectl scale deployment web --replicas=3");
    let out = kubectl(&["scale", "deployment", "web", "--replicas=3"])
        .output()
        .await
        .context("running kubectl scale")?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        say!("    {line}");
    }
    wait_until("Deployment web: 3 ready", Duration::from_secs(120), || {
        ready(3)
    })
    .await?;
    for args in [
        &["get", "deployment", "web"][..],
        &["get", "pods", "-l", "app=web", "-o", "wide"][..],
    ] {
        let out = kubectl(args)
            .output()
            .await
            .context("running kubectl get")?;
        say!("    $ kubectl {}", args.join(" "));
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            say!("    {line}");
        }
    }
    say!("    try: kubectl port-forward deployment/web 8080:8080 & wget -qO- 127.0.0.1:8080");
    Ok(())
}

/// Creates Service `web` over Deployment `web` and a pod `client` that fetches
/// `http://web/` every second (DNS and ClusterIP at the edge); shows what it got. Returns
/// the client's log file on the edge (readable while the cloud is away).
async fn service_demo(
    client: &kube::Client,
    node: &str,
    kubeconfig: &std::path::Path,
) -> anyhow::Result<std::path::PathBuf> {
    use k8s_openapi::api::core::v1::Service;
    let svc: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}
    }))?;
    Api::<Service>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &svc)
        .await
        .context("creating Service web")?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "client", "namespace": "default"},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "client", "image": BUSYBOX_IMAGE,
                "command": ["sh", "-c", "while true; do echo \"$(date +%T) $(timeout 3 wget -q -O - http://web/ 2>&1)\"; sleep 1; done"]}]}
    }))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = pods
        .create(&PostParams::default(), &pod)
        .await
        .context("creating pod client")?;
    let uid = created.metadata.uid.unwrap_or_default();
    let log = std::path::PathBuf::from(format!("/var/log/pods/default_client_{uid}/client/0.log"));
    wait_until(
        "pod client reaching http://web/",
        Duration::from_secs(120),
        || async { last_served(&log).map(|_| ()) },
    )
    .await
    .with_context(|| {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(3).collect();
        format!(
            "pod client's last lines ({}): {:?}",
            log.display(),
            tail.into_iter().rev().collect::<Vec<_>>()
        )
    })?;
    say!("    $ kubectl get service web");
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["get", "service", "web"])
        .output()
        .await
        .context("running kubectl get service")?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        say!("    {line}");
    }
    if let Some(line) = last_served(&log) {
        say!("    pod client: {line}");
    }
    say!("    try: kubectl logs -f client      kubectl exec client -- nslookup web");
    Ok(log)
}

/// The last answer pod `client` logged from Service web (`served by …`).
fn last_served(log: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .rev()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .find(|l| l.contains("served by"))
        .map(str::to_string)
}

/// The router's REST port in the demo (KubeEdge's default, on loopback).
const ROUTER_PORT: u16 = 9443;
/// Where `web-gateway` listens on the edge node (host network).
const GATEWAY_PORT: u16 = 8081;

fn router_settings() -> cloudcore::router::RouterSettings {
    cloudcore::router::RouterSettings {
        listen: ([127, 0, 0, 1], ROUTER_PORT).into(),
        ..cloudcore::router::RouterSettings::default()
    }
}

/// The router on cloudcore's hub and one rule: `/web` in namespace `default` (rest) to
/// `127.0.0.1:8081/cgi-bin/web` on the node (servicebus). KubeEdge's servicebus calls only
/// servers on the node's loopback, so `web-gateway`, a host-network pod, relays to Service
/// `web` by name (edgemesh's DNS and ClusterIP, `dnsPolicy: ClusterFirstWithHostNet`).
async fn router_demo(
    cloud: &CloudFixture,
    client: &kube::Client,
    node: &str,
) -> anyhow::Result<cloudcore::router::Router> {
    use e2e::router as r;
    let router = cloudcore::router::Router::start(
        router_settings(),
        client.clone(),
        cloud.hub.clone(),
        cloudcore::router::RouterMetrics::default(),
        tokio_util::sync::CancellationToken::new(),
    )
    .await?;
    let cgi = "#!/bin/sh\n\
         echo 'Content-Type: text/plain'\necho\n\
         timeout 3 wget -qO- http://web.default.svc.cluster.local/ || echo 'Service web did not answer'\n"
        .to_string();
    let script = format!(
        "mkdir -p /www/cgi-bin && printf '%s' \"$CGI\" > /www/cgi-bin/web && chmod +x /www/cgi-bin/web \
         && exec httpd -f -p 127.0.0.1:{GATEWAY_PORT} -h /www"
    );
    let gateway: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-gateway", "namespace": "default", "labels": {"app": "web-gateway"}},
        "spec": {"nodeName": node, "hostNetwork": true, "terminationGracePeriodSeconds": 1,
            "dnsPolicy": "ClusterFirstWithHostNet",
            "containers": [{"name": "gateway", "image": BUSYBOX_IMAGE,
                "command": ["sh", "-c", script], "env": [{"name": "CGI", "value": cgi}]}]}
    }))?;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &gateway)
        .await
        .context("creating pod web-gateway")?;
    wait_until(
        "pod web-gateway Running",
        Duration::from_secs(60),
        || async {
            let p = pods.get_opt("web-gateway").await.ok()??;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())
        },
    )
    .await?;
    let port = GATEWAY_PORT.to_string();
    r::create_endpoint(client, "default", "router-rest", "rest", &[]).await;
    r::create_endpoint(
        client,
        "default",
        "web-servicebus",
        "servicebus",
        &[("service_port", &port)],
    )
    .await;
    r::create_rule(
        client,
        "default",
        "web",
        ("router-rest", &[("path", "/web")]),
        ("web-servicebus", &[("path", "/cgi-bin/web")]),
    )
    .await;
    let url = format!("http://127.0.0.1:{ROUTER_PORT}/{node}/default/web");
    let deadline = Instant::now() + Duration::from_secs(60);
    let answer = loop {
        if let Ok(a) = r::request("GET", &url, &[], "").await
            && a.status == 200
            && a.body.starts_with("served by")
        {
            break a.body;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "timed out after 60s waiting for the router to reach a web pod"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    say!("    rule           kubectl get rules,ruleendpoints   (rules.kubeedge.io)");
    say!("    $ curl {url}");
    say!("    {}", answer.trim_end());
    say!(
        "    router         http://127.0.0.1:{ROUTER_PORT}/<node>/<namespace>/<rule path>  (the edge's app answers; its status and headers too)"
    );
    Ok(router)
}

/// Starts `modbus-sim` (a Modbus TCP thermostat) and `modbus-mapper`, creates a DeviceModel
/// and a Device bound to `node`, and shows the temperature the mapper reports in the Device's
/// status. Returns the two processes (dropping them stops them).
async fn device_demo(
    client: &kube::Client,
    node: &str,
    dir: &std::path::Path,
    kubeconfig: &std::path::Path,
) -> anyhow::Result<(e2e::process::LoggedProcess, e2e::process::LoggedProcess)> {
    use e2e::devices;
    let (sim, plc) = devices::start_modbus_sim(dir)?;
    let mapper = devices::start_modbus_mapper(&dir.join("dmi.sock"), dir)?;
    say!("    Modbus device  modbus-sim on {plc} (register 0: temperature, 1: setpoint)");
    say!(
        "    mapper         modbus-mapper (log {})",
        mapper.log_path().display()
    );
    let model: kube::api::DynamicObject =
        serde_json::from_value(devices::thermostat_model("thermostat"))?;
    devices::models(client, "default")
        .create(&PostParams::default(), &model)
        .await
        .context("creating the DeviceModel")?;
    let device: kube::api::DynamicObject = serde_json::from_value(devices::thermostat(
        "thermostat",
        "thermostat",
        node,
        plc,
        "21",
    ))?;
    let api = devices::devices(client, "default");
    api.create(&PostParams::default(), &device)
        .await
        .context("creating the Device")?;
    wait_until(
        "the thermostat's reported temperature",
        Duration::from_secs(60),
        || async {
            let d = serde_json::to_value(api.get("thermostat").await.ok()?).ok()?;
            devices::twin_value(&d, "temperature", "reported").map(|_| ())
        },
    )
    .await?;
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["get", "device", "thermostat", "-o", "jsonpath={range .status.twins[*]}{.propertyName}: reported {.reported.value}, observed desired {.observedDesired.value}{\"\\n\"}{end}"])
        .output()
        .await
        .context("running kubectl get device")?;
    say!("    $ kubectl get device thermostat -o jsonpath=…   (its status.twins)");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        say!("    {line}");
    }
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        say!("    {line}");
    }
    say!("    change the setpoint (register 1) from the cluster:");
    say!(
        "      kubectl patch device thermostat --type=json -p '[{{\"op\":\"replace\",\"path\":\"/spec/properties/1/desired/value\",\"value\":\"25\"}}]'"
    );
    Ok((sim, mapper))
}

/// Polls `probe` until it yields, or fails after `limit` naming what it waited for.
async fn wait_until<F, Fut>(what: &str, limit: Duration, mut probe: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<()>>,
{
    let deadline = Instant::now() + limit;
    let mut dots = Instant::now();
    while probe().await.is_none() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        if dots.elapsed() > Duration::from_secs(5) {
            say!("    … waiting for {what}");
            dots = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

fn step(n: u32, what: &str) {
    say!("[{n}] {what}");
}
