//! Tunnel port negotiation (ConfigMap `kubeedge/tunnelport`) between cloudcore replicas, and
//! the iptables manager's DNAT rules in a fresh network namespace: a TCP connect to
//! `<any IP>:<tunnel port>` lands on the replica's stream port.

use cloudcore::cloudstream::{
    Iptables, TUNNEL_PORT_ANNOTATION as ANNOTATION, TUNNEL_PORT_CONFIGMAP as CONFIGMAP,
    TUNNEL_PORT_NAMESPACE as NAMESPACE, TunnelPortRecord, manage_iptables, negotiate_tunnel_port,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// An in-memory cluster of the test's own (`None` where the tests run against a shared one).
async fn own_cluster() -> Option<e2e::cluster::TestCluster> {
    e2e::cluster::connect_in_memory_only(
        e2e::apiserver::Config::for_tests(),
        "its own kubeedge/tunnelport ConfigMap",
    )
    .await
    .unwrap()
}

async fn record(client: &kube::Client) -> TunnelPortRecord {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let cm = api.get(CONFIGMAP).await.expect("tunnelport ConfigMap");
    TunnelPortRecord::of(&cm).expect("record")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_negotiate_distinct_tunnel_ports_and_a_restart_keeps_its_port() {
    let Some(cluster) = own_cluster().await else {
        return;
    };
    let client = cluster.client();
    // Two replicas start at once: both read "no ConfigMap" or the same version; one write
    // loses with 409 and that replica negotiates again.
    let (a, b) = tokio::join!(
        negotiate_tunnel_port(&client, "10.0.0.1"),
        negotiate_tunnel_port(&client, "10.0.0.2"),
    );
    let (a, b) = (a.expect("replica a"), b.expect("replica b"));
    let mut ports = [a, b];
    ports.sort();
    assert_eq!(ports, [10351, 10352], "a={a} b={b}");
    let r = record(&client).await;
    assert_eq!(r.ip_tunnel_port["10.0.0.1"], a);
    assert_eq!(r.ip_tunnel_port["10.0.0.2"], b);
    assert_eq!(r.port.len(), 2, "{r:?}");

    // Replica a restarts (same IP): same port, record unchanged.
    assert_eq!(negotiate_tunnel_port(&client, "10.0.0.1").await.unwrap(), a);
    assert_eq!(record(&client).await, r);
    // A third replica takes the next one.
    assert_eq!(
        negotiate_tunnel_port(&client, "10.0.0.3").await.unwrap(),
        10353
    );
    // The annotation is KubeEdge's JSON.
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let cm = api.get(CONFIGMAP).await.unwrap();
    let raw = &cm.metadata.annotations.unwrap()[ANNOTATION];
    let v: serde_json::Value = serde_json::from_str(raw).unwrap();
    assert_eq!(v["ipTunnelPort"]["10.0.0.3"], 10353, "{raw}");
    assert_eq!(v["port"]["10353"], true, "{raw}");
}

/// A named network namespace, deleted on drop.
struct NetNs(String);

impl NetNs {
    fn new(name: &str) -> NetNs {
        let _ = Command::new("ip").args(["netns", "del", name]).status();
        let ns = NetNs(name.to_string());
        ns.ip(&["netns", "add", name]);
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    fn ip(&self, args: &[&str]) {
        let out = Command::new("ip").args(args).output().expect("ip runs");
        assert!(
            out.status.success(),
            "ip {args:?}: {} (this test needs root and iproute2)",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn exec(&self, args: &[&str]) {
        let mut all = vec!["netns", "exec", self.0.as_str()];
        all.extend_from_slice(args);
        self.ip(&all);
    }

    fn iptables(&self) -> Iptables {
        Iptables {
            program: "ip".into(),
            prefix: ["netns", "exec", &self.0, "iptables"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }
    }

    fn nat_listing(&self, chain: &str) -> String {
        let out = Command::new("ip")
            .args([
                "netns", "exec", &self.0, "iptables", "-t", "nat", "-S", chain,
            ])
            .output()
            .expect("iptables");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `f` on a thread that has entered this namespace (sockets it opens live there).
    fn run_in<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/var/run/netns/{}", self.0);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).expect("netns file");
            use std::os::fd::AsRawFd;
            // SAFETY: setns on a valid namespace fd affects only this thread.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("netns thread")
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Connects to `target` from inside the namespace while a listener on `listen` waits;
/// returns the address the accepted connection was made to and the bytes echoed.
fn connect_through(
    ns: &NetNs,
    listen: &'static str,
    target: String,
) -> Result<(std::net::SocketAddr, Vec<u8>), String> {
    ns.run_in(move || {
        let l = std::net::TcpListener::bind(listen).map_err(|e| format!("bind {listen}: {e}"))?;
        let addr: std::net::SocketAddr = target.parse().map_err(|e| format!("{e}"))?;
        let mut c = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))
            .map_err(|e| format!("connect {target}: {e}"))?;
        c.write_all(b"ping").map_err(|e| e.to_string())?;
        l.set_nonblocking(false).ok();
        let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).map_err(|e| e.to_string())?;
        Ok((s.local_addr().map_err(|e| e.to_string())?, buf.to_vec()))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_iptables_manager_dnats_each_tunnel_port_to_its_replicas_stream_port() {
    let Some(cluster) = own_cluster().await else {
        return;
    };
    let version = Command::new("iptables").arg("-V").output();
    let version = version.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    println!("iptables: {version:?}");
    let ns = NetNs::new(&format!("kers-ipt-{}", std::process::id()));
    // "cloudcore" listens on 10.244.7.1:10003; 10.244.7.99 stands for an edge node's IP.
    // On lo a /24 makes the whole subnet local (no dummy/veth module needed): without the
    // DNAT, a connect to 10.244.7.99:10351 is refused.
    ns.exec(&["ip", "addr", "add", "10.244.7.1/24", "dev", "lo"]);

    let client = cluster.client();
    let port = negotiate_tunnel_port(&client, "10.244.7.1").await.unwrap();
    assert_eq!(port, 10351);
    let shutdown = CancellationToken::new();
    let manager = tokio::spawn(manage_iptables(
        client.clone(),
        ns.iptables(),
        10003,
        Duration::from_secs(10),
        shutdown.clone(),
    ));
    let want = "--dport 10351 -j DNAT --to-destination 10.244.7.1:10003";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !ns.nat_listing("TUNNEL-PORT").contains(want) {
        assert!(!manager.is_finished(), "manager stopped");
        assert!(
            tokio::time::Instant::now() < deadline,
            "no DNAT rule: {}",
            ns.nat_listing("TUNNEL-PORT")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for chain in ["OUTPUT", "PREROUTING"] {
        let l = ns.nat_listing(chain);
        assert_eq!(l.matches("-j TUNNEL-PORT").count(), 1, "{chain}: {l}");
    }
    // The apiserver's call to <node IP>:<tunnel port> lands on cloudcore's stream port.
    let (landed, data) = connect_through(&ns, "10.244.7.1:10003", "10.244.7.99:10351".into())
        .expect("connect through the DNAT");
    assert_eq!(landed.to_string(), "10.244.7.1:10003");
    assert_eq!(data, b"ping");

    // The record changes (replica 10.244.7.1 gone, another one added): rules follow.
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let new = r#"{"ipTunnelPort":{"10.244.7.2":10352},"port":{"10351":true,"10352":true}}"#;
    let patch = serde_json::json!({"metadata": {"annotations": {ANNOTATION: new}}});
    api.patch(CONFIGMAP, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let l = ns.nat_listing("TUNNEL-PORT");
        if l.contains("--dport 10352 -j DNAT --to-destination 10.244.7.2:10003")
            && !l.contains("10351")
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "rules not updated: {l}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The stale rule is gone: 10351 no longer reaches the stream port.
    let r = connect_through(&ns, "10.244.7.1:10003", "10.244.7.99:10351".into());
    assert!(r.is_err(), "still forwarded: {r:?}");
    shutdown.cancel();
    let _ = manager.await;
}
