//! The rules and the relay against the real kernel: connections from this host to a
//! ClusterIP reach a backend through the planned iptables rules (OUTPUT DNAT), follow it when
//! it moves, are refused when no backend is left, and reach a backend on an "unroutable" node
//! through the relay (which finds the Service from `SO_ORIGINAL_DST`). Needs root and
//! iptables; prints why it skips otherwise. ClusterIPs are from TEST-NET-2 (198.51.100.0/24),
//! which no real network uses, and the chains have a prefix of their own.

use super::iptables::Iptables;
use super::relay::{DirectDialer, Relay, RelayMetrics};
use super::rules::{RuleSettings, plan};
use crate::catalog::{Catalog, Snapshot};
use crate::model::{EndpointSlice, Service};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

fn usable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    match std::process::Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
    {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "iptables-save failed: {}",
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Some(format!("iptables-save not runnable: {e}")),
    }
}

/// A listener answering every connection with `tag`.
async fn backend(tag: &'static str) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(tag.as_bytes()).await;
            });
        }
    });
    addr
}

async fn fetch(to: &str) -> std::io::Result<String> {
    let mut s = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(to))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    s.write_all(b"hi").await?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "read timed out"))??;
    Ok(out)
}

fn view(cluster_ip: &str, endpoints: serde_json::Value) -> Snapshot {
    let mut c = Catalog::new("edge-1");
    c.apply_service(
        Service::from_json(
            &json!({"metadata": {"name": "web", "namespace": "kernel-test"},
            "spec": {"clusterIP": cluster_ip, "ports": [{"name": "http", "port": 80}]}})
            .to_string(),
        )
        .unwrap(),
    );
    c.apply_slice(
        EndpointSlice::from_json(
            &json!({"metadata": {"name": "web-1", "namespace": "kernel-test",
            "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "ports": [endpoints["port"].clone()],
            "endpoints": endpoints["endpoints"].clone()})
            .to_string(),
        )
        .unwrap(),
    );
    c.snapshot().unwrap()
}

struct Cleanup(Iptables);
impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Err(e) = self.0.cleanup() {
            eprintln!("cleanup of test chains failed: {e}");
        }
    }
}

#[tokio::test]
async fn cluster_ip_traffic_follows_the_rules_and_the_relay_in_the_kernel() {
    if let Some(why) = usable() {
        println!("SKIPPED: {why}");
        return;
    }
    let prefix = format!("KU{:02X}", rand::random::<u8>());
    let ipt = Iptables::new(&prefix);
    let _cleanup = Cleanup(ipt.clone());
    let relay_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = match relay_listener.local_addr().unwrap() {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(_) => unreachable!(),
    };
    let settings = RuleSettings {
        prefix: prefix.clone(),
        relay: Some(relay_addr),
        direct: vec![],
    };
    let cip = format!("198.51.100.{}", 10 + rand::random::<u8>() % 200);
    let target = format!("{cip}:80");
    let a = backend("backend-a").await;
    let b = backend("backend-b").await;

    // 1. A backend without a node (dialled directly): DNAT to it.
    let snap = view(
        &cip,
        json!({"port": {"name": "http", "port": a.port()},
               "endpoints": [{"addresses": ["127.0.0.1"]}]}),
    );
    ipt.ensure_hooks().unwrap();
    ipt.ensure_hooks().unwrap(); // idempotent
    let first = plan(&snap, &settings);
    ipt.apply(&first, None).unwrap();
    assert_eq!(fetch(&target).await.unwrap(), "backend-a");

    // 2. The backend moves: the same ClusterIP reaches the new one.
    let snap = view(
        &cip,
        json!({"port": {"name": "http", "port": b.port()},
               "endpoints": [{"addresses": ["127.0.0.1"]}]}),
    );
    // The chains of the previous plan known: no need to ask the kernel.
    ipt.apply(&plan(&snap, &settings), Some(&first)).unwrap();
    assert_eq!(fetch(&target).await.unwrap(), "backend-b");

    // 3. The backend runs on another node: the rules send the connection to the relay,
    //    which finds the Service port from the original destination and dials it.
    let snap = view(
        &cip,
        json!({"port": {"name": "http", "port": a.port()},
               "endpoints": [{"addresses": ["127.0.0.1"], "nodeName": "edge-2"}]}),
    );
    let (tx, rx) = watch::channel(Arc::new(snap.clone()));
    let cancel = CancellationToken::new();
    let metrics = RelayMetrics::default();
    let (_relay, task) = Relay::spawn(
        relay_listener,
        rx,
        settings.clone(),
        Arc::new(DirectDialer),
        metrics.clone(),
        cancel.clone(),
    );
    ipt.apply(&plan(&snap, &settings), None).unwrap();
    assert_eq!(fetch(&target).await.unwrap(), "backend-a");
    let relayed = metrics
        .connections
        .get_or_create(&super::relay::OutcomeLabel {
            outcome: super::relay::Outcome::Relayed.label(),
        })
        .get();
    assert_eq!(relayed, 1);

    // 4. No backend left: refused at once (REJECT), not a time-out.
    let snap = view(
        &cip,
        json!({"port": {"name": "http", "port": a.port()}, "endpoints": []}),
    );
    tx.send_replace(Arc::new(snap.clone()));
    ipt.apply(&plan(&snap, &settings), None).unwrap();
    let err = fetch(&target).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");

    // 5. Cleanup removes every chain and jump of ours.
    cancel.cancel();
    let _ = task.await;
    ipt.cleanup().unwrap();
    assert!(ipt.existing_chains("nat").unwrap().is_empty());
    assert!(ipt.existing_chains("filter").unwrap().is_empty());
    let out = std::process::Command::new("iptables-save")
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(&prefix),
        "a jump to {prefix} chains is left"
    );
}
