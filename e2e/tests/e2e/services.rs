//! Services at the edge (edgemesh) on real containerd with bridge networking: pods resolve
//! Services by name through the edge's DNS server and reach them by name and ClusterIP through
//! the rules edgecore programs — also while the cloud is away, following a backend that
//! restarted with a new IP; headless and UDP Services; a Service whose backends run on
//! another edge node, relayed through cloudcore; bad DNS input.
//!
//! Each test edge has its own DNS address (169.254.96.x) and chain prefix, removed at the end.
//! Needs root (iptables, addresses on `lo`); prints SKIPPED otherwise.

use e2e::edge::{EdgeEnv, EdgeOptions, MeshOptions, WAIT, wait_for};
use e2e::images::BUSYBOX_IMAGE;
use e2e::pod_probe;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use std::time::Duration;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED: edgemesh needs root (iptables, an address on lo)");
        return false;
    }
    true
}

/// Removes the mesh's chains and address when the test ends, however it ends.
struct MeshCleanup(MeshOptions);
impl Drop for MeshCleanup {
    fn drop(&mut self) {
        self.0.cleanup();
    }
}

async fn mesh_env(prefix: &str, mesh: &MeshOptions) -> EdgeEnv {
    let env = EdgeEnv::start_with(EdgeOptions {
        mesh: Some(mesh.clone()),
        ..EdgeOptions::new(prefix)
    })
    .await;
    env.wait_node_ready().await;
    env
}

/// A busybox httpd answering `/` with its pod name, labelled `app=<app>`, port `http` 8080.
fn web_pod(name: &str, app: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", format!("mkdir -p /www && echo {name} > /www/index.html && exec httpd -f -p 8080 -h /www")],
                "ports": [{"name": "http", "containerPort": 8080}]}]},
    })
}

/// A pod running `script` (rounds of probes, see [`pod_probe`]) with `env` variables.
fn probe_pod(name: &str, script: &str, env: &[(&str, &str)]) -> Value {
    let env: Vec<Value> = env
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    json!({
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script], "env": env}]},
    })
}

async fn create_service(env: &EdgeEnv, spec: Value) -> Service {
    let mut svc = spec;
    svc["apiVersion"] = json!("v1");
    svc["kind"] = json!("Service");
    let svc: Service = serde_json::from_value(svc).expect("a Service");
    Api::<Service>::namespaced(env.cluster.client(), &env.ns)
        .create(&PostParams::default(), &svc)
        .await
        .expect("service created")
}

fn cluster_ip(svc: &Service) -> String {
    svc.spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .expect("a ClusterIP")
}

fn log_of(env: &EdgeEnv, pod: &str, uid: &str) -> String {
    pod_probe::container_log(&env.dir.path().join("pod-logs"), &env.ns, pod, uid, "main")
}

/// Waits for a round of `name` after round `after` that succeeded with output containing
/// `want`; returns its round.
async fn wait_round(
    env: &EdgeEnv,
    pod: &str,
    uid: &str,
    name: &str,
    after: u64,
    want: &str,
) -> u64 {
    wait_for(
        &format!("{pod}: a successful {name:?} round after {after} printing {want:?}"),
        WAIT,
        || async {
            pod_probe::since(&log_of(env, pod, uid), name, after)
                .into_iter()
                .find(|r| r.rc == 0 && r.output.contains(want))
                .map(|r| r.round)
        },
    )
    .await
}

fn last_round(env: &EdgeEnv, pod: &str, uid: &str) -> u64 {
    pod_probe::rounds(&log_of(env, pod, uid))
        .last()
        .map(|r| r.round)
        .unwrap_or(0)
}

/// The pod's sandbox IDs on the node, to kill them (a "reboot" of one pod).
async fn stop_sandboxes(env: &EdgeEnv, uid: &str) {
    use kubeedge_edged::cri::api;
    let cri = env.cri().await;
    let mut rt = cri.runtime();
    let list = rt
        .list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: std::collections::HashMap::from([(
                    "io.kubernetes.pod.uid".to_string(),
                    uid.to_string(),
                )]),
                ..Default::default()
            }),
        })
        .await
        .expect("ListPodSandbox")
        .into_inner();
    for s in list.items {
        rt.stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: s.id,
        })
        .await
        .expect("StopPodSandbox");
    }
}

const CLIENT_SCRIPT: &str = "i=0; while true; do i=$((i+1)); \
    nslookup web.$NS.svc.cluster.local 2>&1; echo \"@@ $i dns $?\"; \
    timeout 3 wget -q -O - http://web/ 2>&1; echo \"@@ $i name $?\"; \
    timeout 3 wget -q -O - http://$CIP/ 2>&1; echo \"@@ $i ip $?\"; \
    sleep 0.3; done";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_reaches_a_service_by_name_and_cluster_ip_online_and_offline() {
    if !root() {
        return;
    }
    let mesh = MeshOptions::unique();
    let _cleanup = MeshCleanup(mesh.clone());
    let mut env = mesh_env("svc", &mesh).await;
    let ns = env.ns.clone();

    let web1 = env.create_pod(web_pod("web-1", "web")).await;
    env.wait_running("web-1").await;
    let svc = create_service(
        &env,
        json!({"metadata": {"name": "web"},
               "spec": {"selector": {"app": "web"},
                        "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
    )
    .await;
    let cip = cluster_ip(&svc);
    let client = env
        .create_pod(probe_pod(
            "client",
            CLIENT_SCRIPT,
            &[("NS", ns.as_str()), ("CIP", cip.as_str())],
        ))
        .await;
    let uid = client.metadata.uid.clone().expect("a uid");
    env.wait_running("client").await;

    // The name resolves through the edge's DNS (search path and ndots:5 from edged), and
    // the Service answers by name and by ClusterIP.
    wait_round(&env, "client", &uid, "dns", 0, &cip).await;
    wait_round(&env, "client", &uid, "name", 0, "web-1").await;
    wait_round(&env, "client", &uid, "ip", 0, "web-1").await;

    // A second backend: traffic reaches it too.
    env.create_pod(web_pod("web-2", "web")).await;
    env.wait_running("web-2").await;
    let now = last_round(&env, "client", &uid);
    wait_round(&env, "client", &uid, "name", now, "web-2").await;

    // Offline: both backends restart with new sandboxes (new IPs); the Service follows
    // them from what edged reports, without the cloud.
    env.link.freeze();
    env.wait_edge_link(false).await;
    let web2 = env
        .pods()
        .get("web-2")
        .await
        .expect("web-2")
        .metadata
        .uid
        .expect("a uid");
    let web1_uid = web1.metadata.uid.clone().expect("a uid");
    stop_sandboxes(&env, &web1_uid).await;
    stop_sandboxes(&env, &web2).await;
    let after = last_round(&env, "client", &uid) + 1;
    for (round, want) in [("name", "web-1"), ("name", "web-2"), ("ip", "web-1")] {
        wait_round(&env, "client", &uid, round, after, want).await;
    }
    let r = wait_round(&env, "client", &uid, "dns", after, &cip).await;
    assert!(r > after);
    env.link.thaw();
    env.wait_edge_link(true).await;

    // An edgecore restart leaves exactly one jump into the Service chains, and the
    // Service keeps answering.
    env.stop_edge().await;
    env.start_edge().await;
    let now = last_round(&env, "client", &uid);
    wait_round(&env, "client", &uid, "name", now, "web-").await;
    let out = tokio::process::Command::new("iptables")
        .args(["-t", "nat", "-S", "PREROUTING"])
        .output()
        .await
        .expect("iptables runs");
    let jumps = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.ends_with(&format!("-j {}-SERVICES", mesh.chain_prefix)))
        .count();
    assert_eq!(jumps, 1, "one PREROUTING jump after a restart");

    // The restarted edge's metrics count its rule update (the rules of the previous run
    // served traffic meanwhile).
    wait_for("the restarted edgemesh applies its rules", WAIT, || async {
        mesh_metrics_text(&env)
            .contains("edgemesh_rule_syncs_total{result=\"applied\"}")
            .then_some(())
    })
    .await;
    // What `edgecore reset` runs: the chains and the address go.
    env.stop_edge().await;
    edgecore::mesh::cleanup(&env.config).expect("cleanup");
    let saved = std::process::Command::new("iptables-save")
        .output()
        .expect("iptables-save runs");
    assert!(
        !String::from_utf8_lossy(&saved.stdout).contains(&format!("{}-", mesh.chain_prefix)),
        "chains left after cleanup"
    );
    let addrs = std::process::Command::new("ip")
        .args(["addr", "show", "dev", "lo"])
        .output()
        .expect("ip runs");
    assert!(!String::from_utf8_lossy(&addrs.stdout).contains(&format!("{}/32", mesh.address)));
    env.finish().await;
}

/// A DNS query for `name` (type A, id 0x4242, recursion desired).
fn dns_query(name: &str) -> Vec<u8> {
    let mut q = vec![0x42, 0x42, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// Answers every DNS query on a UDP socket with one A record, 192.0.2.123 (a UDP
/// backend outside the cluster); returns its port.
async fn udp_dns_backend() -> u16 {
    let sock = tokio::net::UdpSocket::bind("0.0.0.0:0")
        .await
        .expect("bind a UDP backend");
    let port = sock.local_addr().expect("its address").port();
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = sock.recv_from(&mut buf).await {
            if n < 12 {
                continue;
            }
            let mut r = buf[..n].to_vec();
            r[2] |= 0x80; // QR
            r[3] = 0x80; // RA, NOERROR
            r[6] = 0;
            r[7] = 1; // ANCOUNT
            r[8..12].fill(0);
            // Drop any additional (EDNS) record after the question: the counts say none.
            let mut end = 12;
            while end < r.len() && r[end] != 0 {
                end += 1 + r[end] as usize;
            }
            r.truncate((end + 5).min(r.len()));
            r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 192, 0, 2, 123]);
            let _ = sock.send_to(&r, from).await;
        }
    });
    port
}

/// The rcode and answer count of a DNS reply, and whether it was truncated.
fn reply_summary(r: &[u8]) -> (u8, u16, bool) {
    assert!(r.len() >= 12, "short reply {r:?}");
    (
        r[3] & 0x0f,
        u16::from_be_bytes([r[6], r[7]]),
        r[2] & 0x02 != 0,
    )
}

async fn udp_ask(server: std::net::SocketAddr, q: &[u8]) -> Option<Vec<u8>> {
    let s = tokio::net::UdpSocket::bind("0.0.0.0:0").await.ok()?;
    s.send_to(q, server).await.ok()?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(3), s.recv(&mut buf))
        .await
        .ok()?
        .ok()?;
    buf.truncate(n);
    Some(buf)
}

async fn tcp_ask(server: std::net::SocketAddr, q: &[u8]) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(server)
        .await
        .expect("DNS over TCP");
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(q);
    s.write_all(&framed).await.expect("send");
    let len = tokio::time::timeout(Duration::from_secs(5), s.read_u16())
        .await
        .expect("a TCP answer in time")
        .expect("a length");
    let mut buf = vec![0u8; len as usize];
    s.read_exact(&mut buf).await.expect("the answer");
    buf
}

const HEADLESS_SCRIPT: &str = "i=0; while true; do i=$((i+1)); \
    nslookup web-h.$NS.svc.cluster.local 2>&1; echo \"@@ $i headless $?\"; \
    nslookup -type=srv _http._tcp.web.$NS.svc.cluster.local 2>&1; echo \"@@ $i srv $?\"; \
    nslookup probe.example $UDP_IP 2>&1; echo \"@@ $i udp $?\"; \
    sleep 0.3; done";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn headless_udp_and_huge_services_and_bad_dns_input_at_the_edge() {
    if !root() {
        return;
    }
    let mut mesh = MeshOptions::unique();
    // The 10,000 endpoints below are "routable": one rule chain each.
    mesh.direct_cidrs = vec!["10.123.0.0/16".into()];
    let _cleanup = MeshCleanup(mesh.clone());
    let env = mesh_env("svc-udp", &mesh).await;
    let ns = env.ns.clone();
    let dns = std::net::SocketAddr::from((mesh.address, 53));

    for name in ["web-1", "web-2"] {
        env.create_pod(web_pod(name, "web")).await;
    }
    create_service(
        &env,
        json!({"metadata": {"name": "web"},
               "spec": {"selector": {"app": "web"},
                        "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
    )
    .await;
    create_service(
        &env,
        json!({"metadata": {"name": "web-h"},
               "spec": {"clusterIP": "None", "selector": {"app": "web"},
                        "ports": [{"name": "http", "port": 8080}]}}),
    )
    .await;
    // A UDP Service without a selector: its endpoint is a server on this host, reached at
    // the pod network's gateway.
    let gateway = {
        let subnet = e2e::edge::shared_containerd().pod_subnet();
        let base: std::net::Ipv4Addr = subnet
            .split('/')
            .next()
            .and_then(|a| a.parse().ok())
            .expect("the pod subnet");
        std::net::Ipv4Addr::from(u32::from(base) + 1)
    };
    let udp_port = udp_dns_backend().await;
    let udp = create_service(
        &env,
        json!({"metadata": {"name": "udp-dns"},
               "spec": {"ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": udp_port}]}}),
    )
    .await;
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(env.cluster.client(), &ns);
    let slice = |name: &str,
                 service: &str,
                 port: Value,
                 endpoints: Value|
     -> k8s_openapi::api::discovery::v1::EndpointSlice {
        serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "ports": [port], "endpoints": endpoints}))
        .expect("an EndpointSlice")
    };
    slices
        .create(
            &PostParams::default(),
            &slice(
                "udp-dns-1",
                "udp-dns",
                json!({"name": "dns", "port": udp_port, "protocol": "UDP"}),
                json!([{"addresses": [gateway.to_string()]}]),
            ),
        )
        .await
        .expect("slice created");
    let uip = cluster_ip(&udp);

    for name in ["web-1", "web-2"] {
        env.wait_running(name).await;
    }
    let ips: Vec<String> = {
        let mut v = Vec::new();
        for name in ["web-1", "web-2"] {
            let p = env.pods().get(name).await.expect("the pod");
            v.push(p.status.and_then(|s| s.pod_ip).expect("a pod IP"));
        }
        v
    };
    let client = env
        .create_pod(probe_pod(
            "client",
            HEADLESS_SCRIPT,
            &[("NS", ns.as_str()), ("UDP_IP", uip.as_str())],
        ))
        .await;
    let uid = client.metadata.uid.clone().expect("a uid");
    env.wait_running("client").await;
    // Headless: the ready pods' addresses; SRV for the named port; UDP through the ClusterIP.
    wait_for("the headless name resolves to both pods", WAIT, || async {
        let log = log_of(&env, "client", &uid);
        pod_probe::since(&log, "headless", 0)
            .into_iter()
            .find(|r| r.rc == 0 && ips.iter().all(|ip| r.output.contains(ip.as_str())))
    })
    .await;
    wait_round(
        &env,
        "client",
        &uid,
        "srv",
        0,
        &format!("web.{ns}.svc.cluster.local"),
    )
    .await;
    wait_round(&env, "client", &uid, "udp", 0, "192.0.2.123").await;

    // Bad input: garbage and a 300-byte name get a clean answer (or none), and the server
    // keeps answering.
    let garbage: Vec<u8> = (0..200u32).map(|i| (i * 37 % 251) as u8).collect();
    let _ = udp_ask(dns, &garbage).await;
    let long = format!("{}.example", vec!["a".repeat(60); 5].join("."));
    assert!(long.len() > 300);
    let mut q = dns_query("x.example");
    // Splice the 300-byte name in by hand (the helper would too, but say it plainly).
    q.truncate(12);
    for label in long.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    let r = udp_ask(dns, &q)
        .await
        .expect("an answer to a too-long name");
    assert_eq!(reply_summary(&r).0, 1, "FORMERR for a name over 255 bytes");
    let r = udp_ask(dns, &dns_query(&format!("web.{ns}.svc.cluster.local")))
        .await
        .expect("still answering");
    assert_eq!(reply_summary(&r), (0, 1, false));

    // A headless Service with 10,000 endpoints (10 slices of 1,000): UDP gets a truncated
    // answer, TCP a full frame, and the rules are applied.
    create_service(
        &env,
        json!({"metadata": {"name": "big"},
               "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80}]}}),
    )
    .await;
    let big_cip = create_service(
        &env,
        json!({"metadata": {"name": "big-cip"},
               "spec": {"ports": [{"name": "http", "port": 80}]}}),
    )
    .await;
    for (svc, prefix) in [("big", 10u32), ("big-cip", 20u32)] {
        for s in 0..10u32 {
            let endpoints: Vec<Value> = (0..1000u32)
                .map(|i| {
                    let n = s * 1000 + i;
                    json!({"addresses": [format!("10.123.{}.{}", prefix + n / 250, 1 + n % 250)],
                           "nodeName": "far-away-node"})
                })
                .collect();
            slices
                .create(
                    &PostParams::default(),
                    &slice(
                        &format!("{svc}-{s}"),
                        svc,
                        json!({"name": "http", "port": 8080}),
                        Value::Array(endpoints),
                    ),
                )
                .await
                .expect("a big slice");
        }
    }
    let big = format!("big.{ns}.svc.cluster.local");
    let full = wait_for("10,000 endpoints known at the edge", WAIT, || async {
        let r = tcp_ask(dns, &dns_query(&big)).await;
        let (rcode, answers, _) = reply_summary(&r);
        (rcode == 0 && answers >= 1000).then_some(r)
    })
    .await;
    assert!(full.len() <= 65535);
    let r = udp_ask(dns, &dns_query(&big)).await.expect("a UDP answer");
    let (rcode, _, truncated) = reply_summary(&r);
    assert_eq!(rcode, 0);
    assert!(
        truncated,
        "a UDP answer too large for 512 bytes is truncated"
    );
    // The ClusterIP of 10,000 routable endpoints is programmed (a rule chain each).
    let big_ip = cluster_ip(&big_cip);
    wait_for("rules for 10,000 endpoints", WAIT, || async {
        let out = tokio::process::Command::new("iptables-save")
            .args(["-t", "nat"])
            .output()
            .await
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let seps = text
            .lines()
            .filter(|l| l.starts_with(&format!(":{}-SEP-", mesh.chain_prefix)))
            .count();
        (text.contains(&format!("-d {big_ip}/32")) && seps >= 10_000).then_some(())
    })
    .await;
    let r = udp_ask(dns, &dns_query(&format!("web.{ns}.svc.cluster.local")))
        .await
        .expect("still answering after the big Services");
    assert_eq!(reply_summary(&r).0, 0);
    env.finish().await;
}

/// Creates a pod bound to `node` from a JSON spec.
async fn create_pod_on(env: &EdgeEnv, node: &str, spec: Value) -> k8s_openapi::api::core::v1::Pod {
    let mut pod = spec;
    pod["apiVersion"] = json!("v1");
    pod["kind"] = json!("Pod");
    pod["spec"]["nodeName"] = json!(node);
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod).expect("a Pod");
    env.pods()
        .create(&PostParams::default(), &pod)
        .await
        .expect("pod created")
}

const TWO_NODE_SCRIPT: &str = "i=0; while true; do i=$((i+1)); \
    timeout 5 wget -q -O - http://far/ 2>&1; echo \"@@ $i far $?\"; \
    timeout 5 wget -q -O - http://both/ 2>&1; echo \"@@ $i both $?\"; \
    sleep 0.2; done";

/// Edge A runs the client and edgemesh; edge B (its own containerd and pod network, which A
/// does not route to) runs backends. Connections to B's endpoints go A → cloudcore → B over
/// the stream tunnels; a Service with a backend on each node answers from both; the relay
/// connects only to endpoints the cluster placed on the named node; with B gone, calls fail
/// at once instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_with_backends_on_another_edge_is_relayed_through_cloudcore() {
    use cloudcore::cloudstream::ClientAuth;
    use cloudcore::cloudstream::CloudStream;
    use e2e::stream_client::loopback_settings;
    if !root() {
        return;
    }
    let mesh = MeshOptions::unique();
    let _cleanup = MeshCleanup(mesh.clone());
    let mut env = EdgeEnv::start_with(EdgeOptions {
        mesh: Some(mesh.clone()),
        ..EdgeOptions::new("svc-near")
    })
    .await;
    env.stop_edge().await;
    let stream = CloudStream::start(
        cloudcore::cloudstream::StreamSettings {
            relay_targets: Some(std::sync::Arc::new(env.cloud().services.clone())),
            ..loopback_settings(&env.pki, ClientAuth::Verify(env.cluster.cluster_ca()))
        },
        env.cluster.client(),
    )
    .await
    .expect("cloudstream starts");
    let dir = env.dir.path().to_path_buf();
    e2e::edge::enable_stream(&mut env.config, &dir, stream.tunnel_addr());
    env.start_edge().await;
    env.wait_node_ready().await;
    let far_runtime = tokio::task::spawn_blocking(e2e::containerd::Containerd::start)
        .await
        .expect("starting a second containerd")
        .unwrap_or_else(|e| panic!("{e}"));
    let peer = env
        .start_peer(
            EdgeOptions::new("svc-far"),
            &far_runtime.endpoint(),
            Some(stream.tunnel_addr()),
        )
        .await;
    for node in [&env.node, &peer.node] {
        wait_for(&format!("{node}'s stream tunnel"), WAIT, || async {
            stream.is_connected(node).then_some(())
        })
        .await;
    }

    let far1 = create_pod_on(&env, &peer.node, web_pod("far-1", "far")).await;
    let mut far2 = web_pod("far-2", "both");
    far2["metadata"]["labels"]["tier"] = json!("far");
    create_pod_on(&env, &peer.node, far2).await;
    env.create_pod(web_pod("near-1", "both")).await;
    for (name, selector) in [("far", "far"), ("both", "both")] {
        create_service(
            &env,
            json!({"metadata": {"name": name},
                   "spec": {"selector": {"app": selector},
                            "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
        )
        .await;
    }
    for name in ["far-1", "far-2", "near-1"] {
        env.wait_running(name).await;
    }
    let client = env
        .create_pod(probe_pod("client", TWO_NODE_SCRIPT, &[]))
        .await;
    let uid = client.metadata.uid.clone().expect("a uid");
    env.wait_running("client").await;
    wait_round(&env, "client", &uid, "far", 0, "far-1").await;
    wait_round(&env, "client", &uid, "both", 0, "far-2").await;
    wait_round(&env, "client", &uid, "both", 0, "near-1").await;

    // The relay connects only to endpoints the cluster placed on the node named.
    let edged = env.edged_config();
    let dialer = edgecore::edgestream::EdgeStream::relay_dialer(&env.config, &edged)
        .expect("a relay dialer");
    let far1_ip: std::net::IpAddr = env
        .pods()
        .get("far-1")
        .await
        .expect("far-1")
        .status
        .and_then(|s| s.pod_ip)
        .and_then(|ip| ip.parse().ok())
        .expect("far-1's IP");
    use kubeedge_edgemesh::proxy::relay::{RelayDialer, RelayTarget};
    for (node, port, why) in [
        (peer.node.as_str(), 22, "a port no Service names"),
        (env.node.as_str(), 8080, "the endpoint is on another node"),
    ] {
        let target = RelayTarget {
            node: node.into(),
            addr: std::net::SocketAddr::new(far1_ip, port),
        };
        let err = match dialer.dial(target).await {
            Ok(_) => panic!("relay to {far1_ip}:{port} on {node} allowed ({why})"),
            Err(e) => e,
        };
        assert!(err.contains("403"), "{why}: {err}");
    }
    let relayed = mesh_metrics_text(&env);
    assert!(
        relayed.contains("edgemesh_relay_connections_total{outcome=\"relayed\"}"),
        "{relayed}"
    );

    // B goes away: calls to its only Service fail at once (the cloud says its tunnel is
    // gone), they do not hang.
    let far1_uid = far1.metadata.uid.clone().expect("a uid");
    peer.finish(&env, &far_runtime.endpoint()).await;
    let after = last_round(&env, "client", &uid);
    let failed = wait_for(
        "a failing call to a Service on the vanished edge",
        WAIT,
        || async {
            pod_probe::since(&log_of(&env, "client", &uid), "far", after)
                .into_iter()
                .find(|r| r.rc != 0)
        },
    )
    .await;
    assert!(!failed.output.contains("far-1"), "{failed:?}");
    let _ = far1_uid;
    stream.shutdown();
    env.finish().await;
    far_runtime.shutdown();
}

/// edgemesh's metrics of the test edge, as text.
fn mesh_metrics_text(env: &EdgeEnv) -> String {
    let mesh = env
        .edge
        .as_ref()
        .and_then(|e| e.mesh())
        .expect("edgemesh runs");
    let mut r = prometheus_client::registry::Registry::default();
    mesh.register_metrics(&mut r);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &r).expect("metrics encode");
    out
}
