//! bench-apiserver: load for the in-memory API server through kube-rs over HTTPS.
//!
//! The server runs in a child process (this binary re-executed with `--serve`), so its RSS is
//! measured alone. Creates N nodes and M pods (bound round-robin to the nodes) with bounded
//! concurrency, then measures list latency (whole list, paginated, by `spec.nodeName`), watch
//! fan-out latency (unfiltered watchers and per-node watchers while pods are updated), and the
//! server's RSS.
//!
//! ```text
//! cargo run --profile bench-fast -p kube-memserver --bin bench-apiserver -- --nodes 10000 --pods 100000
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube_memserver::{ApiServer, Config};
use serde_json::json;
use tokio::sync::Mutex;

#[derive(Parser, Debug)]
#[command(name = "bench-apiserver")]
struct Args {
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    #[arg(long, default_value_t = 100_000)]
    pods: usize,
    /// Requests in flight while creating.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Unfiltered pod watchers (like informers in several controllers).
    #[arg(long, default_value_t = 20)]
    watchers: usize,
    /// Watchers with `fieldSelector=spec.nodeName=<node>` (like kubelets).
    #[arg(long, default_value_t = 1000)]
    node_watchers: usize,
    /// Pod updates timed for fan-out latency.
    #[arg(long, default_value_t = 200)]
    updates: usize,
    /// Internal: run only the server, writing its kubeconfig here.
    #[arg(long, hide = true)]
    serve: Option<std::path::PathBuf>,
}

/// Child mode: serve until stdin closes.
async fn serve(kubeconfig: std::path::PathBuf) -> anyhow::Result<()> {
    let server = ApiServer::start(Config {
        kubeconfig_path: Some(kubeconfig),
        watch_capacity: 200_000,
        ..Config::default()
    })
    .await?;
    println!("READY {}", server.url());
    let _ = tokio::task::spawn_blocking(|| {
        use std::io::Read;
        let mut sink = Vec::new();
        std::io::stdin().read_to_end(&mut sink)
    })
    .await;
    server.shutdown().await;
    Ok(())
}

async fn current_rv(client: &kube::Client) -> anyhow::Result<String> {
    let api: Api<Pod> = Api::all(client.clone());
    let l = api.list(&ListParams::default().limit(1)).await?;
    Ok(l.metadata.resource_version.unwrap_or_default())
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

async fn create_all<F, Fut>(total: usize, concurrency: usize, make: F) -> anyhow::Result<Duration>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let started = Instant::now();
    futures::stream::iter(0..total)
        .map(&make)
        .buffer_unordered(concurrency)
        .try_collect::<()>()
        .await?;
    Ok(started.elapsed())
}

fn node_name(i: usize) -> String {
    format!("edge-{i:05}")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(kc) = args.serve {
        return serve(kc).await;
    }
    let dir = std::env::temp_dir().join(format!("bench-apiserver-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = dir.join("kubeconfig");
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .arg("--serve")
        .arg(&kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().unwrap_or(0);
    {
        use tokio::io::AsyncBufReadExt;
        let out = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let mut lines = tokio::io::BufReader::new(out).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await??;
        println!("kube-memserver (pid {pid}): {}", ready.unwrap_or_default());
    }
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await?;
    let client = kube::Client::try_from(cfg)?;
    let rss_start = rss_kb(pid);

    let nodes: Api<Node> = Api::all(client.clone());
    let took = create_all(args.nodes, args.concurrency, |i| {
        let nodes = nodes.clone();
        async move {
            let n: Node = serde_json::from_value(json!({
                "metadata": {"name": node_name(i), "labels": {"node-role.kubernetes.io/edge": ""}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}], "capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"}}
            }))?;
            nodes.create(&PostParams::default(), &n).await?;
            Ok(())
        }
    })
    .await?;
    println!(
        "create nodes: {} in {:.2} s = {:.0}/s",
        args.nodes,
        took.as_secs_f64(),
        args.nodes as f64 / took.as_secs_f64()
    );

    // Unfiltered watchers see every pod creation: fan-out under write load.
    let received = Arc::new(AtomicU64::new(0));
    let start_rv = current_rv(&client).await?;
    let mut watch_tasks = Vec::new();
    for _ in 0..args.watchers {
        let api: Api<Pod> = Api::all(client.clone());
        let received = received.clone();
        let rv = start_rv.clone();
        watch_tasks.push(tokio::spawn(async move {
            let wp = WatchParams::default().timeout(3600);
            let Ok(stream) = api.watch(&wp, &rv).await else {
                return;
            };
            let mut stream = stream.boxed();
            while let Ok(Some(ev)) = stream.try_next().await {
                if matches!(ev, WatchEvent::Added(_) | WatchEvent::Modified(_)) {
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes_n = args.nodes.max(1);
    let took = create_all(args.pods, args.concurrency, |i| {
        let pods = pods.clone();
        async move {
            let p: Pod = serde_json::from_value(json!({
                "metadata": {"name": format!("pod-{i:06}"), "labels": {"app": format!("app-{}", i % 100)}},
                "spec": {"nodeName": node_name(i % nodes_n), "containers": [{"name": "app", "image": "busybox:1.36"}]}
            }))?;
            pods.create(&PostParams::default(), &p).await?;
            Ok(())
        }
    })
    .await?;
    println!(
        "create pods: {} in {:.2} s = {:.0}/s ({} unfiltered watchers receiving)",
        args.pods,
        took.as_secs_f64(),
        args.pods as f64 / took.as_secs_f64(),
        args.watchers
    );
    let want = (args.pods * args.watchers) as u64;
    let drain_started = Instant::now();
    while received.load(Ordering::Relaxed) < want
        && drain_started.elapsed() < Duration::from_secs(120)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "watchers caught up {} ms after the last create ({} / {} events)",
        drain_started.elapsed().as_millis(),
        received.load(Ordering::Relaxed),
        want
    );
    for t in &watch_tasks {
        t.abort();
    }
    let rss_loaded = rss_kb(pid);

    // Lists.
    let all_pods: Api<Pod> = Api::all(client.clone());
    let t = Instant::now();
    let full = all_pods.list(&ListParams::default()).await?;
    println!(
        "list all {} pods (one response): {}",
        full.items.len(),
        ms(t.elapsed())
    );
    drop(full);
    let t = Instant::now();
    let mut count = 0;
    let mut lp = ListParams::default().limit(500);
    loop {
        let page = all_pods.list(&lp).await?;
        count += page.items.len();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    println!("list all {count} pods in pages of 500: {}", ms(t.elapsed()));
    let mut by_node = Vec::new();
    for i in 0..50 {
        let t = Instant::now();
        let l = all_pods
            .list(
                &ListParams::default()
                    .fields(&format!("spec.nodeName={}", node_name(i * 7 % nodes_n))),
            )
            .await?;
        by_node.push(t.elapsed());
        assert!(!l.items.is_empty() || args.pods < nodes_n);
    }
    by_node.sort();
    println!(
        "list pods of one node (fieldSelector spec.nodeName): p50 {} p99 {}",
        ms(pct(&by_node, 0.5)),
        ms(pct(&by_node, 0.99))
    );

    // Fan-out latency: unfiltered watchers + per-node watchers, one update at a time.
    let seen: Arc<Mutex<Vec<(usize, Instant)>>> = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let rv = current_rv(&client).await?;
    let total_watchers = args.watchers + args.node_watchers;
    for w in 0..total_watchers {
        let api: Api<Pod> = Api::all(client.clone());
        let seen = seen.clone();
        let rv = rv.clone();
        let wp = if w < args.watchers {
            WatchParams::default().timeout(3600)
        } else {
            WatchParams::default().timeout(3600).fields(&format!(
                "spec.nodeName={}",
                node_name((w - args.watchers) % nodes_n)
            ))
        };
        tasks.push(tokio::spawn(async move {
            let Ok(stream) = api.watch(&wp, &rv).await else {
                return;
            };
            let mut stream = stream.boxed();
            while let Ok(Some(ev)) = stream.try_next().await {
                if let WatchEvent::Modified(p) = ev {
                    let seq: usize = p
                        .metadata
                        .labels
                        .and_then(|l| l.get("seq").and_then(|s| s.parse().ok()))
                        .unwrap_or(usize::MAX);
                    seen.lock().await.push((seq, Instant::now()));
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let watchers_open = total_watchers;
    let mut all_lat = Vec::new();
    let mut node_lat = Vec::new();
    for u in 0..args.updates {
        // Pods on the first node_watchers nodes, so every update has a per-node watcher.
        let node_idx = u % args.node_watchers.clamp(1, nodes_n);
        let pod_idx = node_idx;
        let name = format!("pod-{pod_idx:06}");
        let p = json!({"metadata": {"labels": {"seq": u.to_string()}}});
        let t0 = Instant::now();
        pods.patch(&name, &PatchParams::default(), &Patch::Merge(&p))
            .await?;
        let expected = args.watchers + usize::from(pod_idx < args.pods && args.node_watchers > 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got: Vec<Instant> = seen
                .lock()
                .await
                .iter()
                .filter(|(s, _)| *s == u)
                .map(|(_, t)| *t)
                .collect();
            if got.len() >= expected || Instant::now() > deadline {
                if let Some(last) = got.iter().max() {
                    all_lat.push(last.duration_since(t0));
                }
                if let Some(first) = got.iter().min() {
                    node_lat.push(first.duration_since(t0));
                }
                break;
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    all_lat.sort();
    node_lat.sort();
    println!(
        "fan-out, {} watchers open ({} unfiltered + {} by spec.nodeName): write→first watcher p50 {} p99 {}; write→all watchers p50 {} p99 {}",
        watchers_open,
        args.watchers,
        args.node_watchers,
        ms(pct(&node_lat, 0.5)),
        ms(pct(&node_lat, 0.99)),
        ms(pct(&all_lat, 0.5)),
        ms(pct(&all_lat, 0.99))
    );
    for t in tasks {
        t.abort();
    }
    println!(
        "server RSS: start {} MB, after {} nodes + {} pods {} MB, now {} MB, peak {} MB",
        rss_start / 1024,
        args.nodes,
        args.pods,
        rss_loaded / 1024,
        rss_kb(pid) / 1024,
        status_kb(pid, "VmHWM:").unwrap_or(0) / 1024
    );
    drop(child.stdin.take());
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A `kB` field of `/proc/<pid>/status`.
fn status_kb(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn rss_kb(pid: u32) -> u64 {
    status_kb(pid, "VmRSS:").unwrap_or(0)
}
