//! The reconnect storm (target in BENCHMARKS.md: 10,000 nodes reconnect, all converged ≤ 30 s,
//! nothing lost). Every edge drops its connection at once, keeping what it holds; the cluster
//! changes while they are away (pod labels updated, pods deleted, pods replaced under the same
//! name, new pods, a configmap every node uses updated, and released on some nodes); then all
//! edges redial at once and send their inventories. Measured: time until all are connected,
//! time until every edge holds exactly what the cluster says (nothing missing, nothing stale,
//! nothing extra), messages, cloudcore's peak RSS and CPU.

use crate::edge::{self, Counters, EdgeState, Receipts};
use crate::expected::{compare, expected};
use e2e::procfs::{cpu_ticks, rss_kb};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Everything the storm needs from the benchmark.
pub struct Storm<'a> {
    pub client: kube::Client,
    /// `p-<i>` pods created by the pods phase (on `edge-<i % n>`).
    pub pods_total: usize,
    pub pid: u32,
    pub monitor: &'a str,
    pub addr: SocketAddr,
    pub edges: &'a [Arc<EdgeState>],
    pub tls: &'a [Arc<rustls::ClientConfig>],
    pub counters: Arc<Counters>,
    pub receipts: Receipts,
    /// Stops the edges' current connections.
    pub stop: CancellationToken,
}

const CFG: &str = "storm-cfg";

fn pod(name: &str, node: &str, labels: serde_json::Value, cfg: bool) -> Pod {
    let mut c = json!({"name": "c", "image": "busybox", "command": ["sleep", "3600"]});
    if cfg {
        c["envFrom"] = json!([{"configMapRef": {"name": CFG}}]);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"nodeName": node, "containers": [c]}
    }))
    .unwrap_or_default()
}

/// Runs `f(i)` for each `i` in `items`, 64 at a time; returns how many ran.
/// Creates pod `<app>-<i>` on `edge-<i>` (label `app: <app>`) for each `i`; how many.
async fn create_pods(
    pods: &Api<Pod>,
    items: Vec<usize>,
    app: &'static str,
    cfg: bool,
) -> anyhow::Result<usize> {
    each(items, |i| {
        let pods = pods.clone();
        async move {
            let p = pod(
                &format!("{app}-{i}"),
                &format!("edge-{i}"),
                json!({"app": app}),
                cfg,
            );
            pods.create(&PostParams::default(), &p).await?;
            Ok(())
        }
    })
    .await
}

async fn each<F, Fut>(items: Vec<usize>, f: F) -> anyhow::Result<usize>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let sem = Arc::new(Semaphore::new(64));
    let mut tasks = Vec::with_capacity(items.len());
    for i in items {
        let permit = sem.clone().acquire_owned().await?;
        let fut = f(i);
        tasks.push(tokio::spawn(async move {
            let r = fut.await;
            drop(permit);
            r
        }));
    }
    let count = tasks.len();
    for t in tasks {
        t.await??;
    }
    Ok(count)
}

/// One GET of cloudcore's `/metrics`.
async fn scrape(monitor: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(monitor).await else {
        return String::new();
    };
    if s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    String::from_utf8_lossy(&buf).into_owned()
}

/// Sum of the samples of metric `name` (all label sets).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                return None;
            }
            l.rsplit(' ').next()?.parse::<f64>().ok()
        })
        .sum()
}

/// Polls until every edge holds exactly `want`, or `limit` passes; returns when the last edge
/// finished changing (exact, from the edges' own change times) and the remaining difference.
async fn converge(
    edges: &[Arc<EdgeState>],
    want: &[crate::edge::Objects],
    limit: Duration,
) -> (Option<Instant>, crate::expected::Diff) {
    let deadline = Instant::now() + limit;
    loop {
        let (d, _) = compare(edges, want, 0);
        if d.total() == 0 {
            return (edges.iter().filter_map(|e| e.last_change()).max(), d);
        }
        if Instant::now() > deadline {
            return (None, d);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Before the storm: a configmap every node uses, through one more pod (`cfg-<i>`) per node.
pub async fn prepare(client: &kube::Client, n: usize) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": CFG}, "data": {"v": "0"}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    create_pods(&pods, (0..n).collect(), "cfg", true).await?;
    Ok(())
}

/// The cluster's changes while every edge is away (`pods_total` `p-<i>` pods exist, on
/// `edge-<i % n>`); returns what was changed, in words.
pub async fn change_while_away(
    client: &kube::Client,
    n: usize,
    pods_total: usize,
) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let p = move |k: usize, i: usize| k * n + i;
    let exists = |k: usize, i: usize| p(k, i) < pods_total;
    let relabel = each((0..n).filter(|i| i % 2 == 0).collect(), |i| {
        let pods = pods.clone();
        async move {
            let patch = json!({"metadata": {"labels": {"storm": "relabelled"}}});
            pods.patch(
                &format!("p-{}", p(0, i)),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
            Ok(())
        }
    })
    .await?;
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let deleted = each(
        (0..n).filter(|i| i % 3 == 0 && exists(1, *i)).collect(),
        |i| {
            let (pods, now) = (pods.clone(), now.clone());
            async move {
                pods.delete(&format!("p-{}", p(1, i)), &now).await?;
                Ok(())
            }
        },
    )
    .await?;
    let replaced = each(
        (0..n).filter(|i| i % 5 == 0 && exists(2, *i)).collect(),
        |i| {
            let (pods, now) = (pods.clone(), now.clone());
            async move {
                let name = format!("p-{}", p(2, i));
                pods.delete(&name, &now).await?;
                let new = pod(
                    &name,
                    &format!("edge-{i}"),
                    json!({"app": "bench", "storm": "replaced"}),
                    false,
                );
                pods.create(&PostParams::default(), &new).await?;
                Ok(())
            }
        },
    )
    .await?;
    let created = create_pods(
        &pods,
        (0..n).filter(|i| i % 4 == 0).collect(),
        "storm",
        false,
    )
    .await?;
    let released = each((0..n).filter(|i| i % 7 == 0).collect(), |i| {
        let (pods, now) = (pods.clone(), now.clone());
        async move {
            pods.delete(&format!("cfg-{i}"), &now).await?;
            Ok(())
        }
    })
    .await?;
    let patch = json!({"data": {"v": "1"}});
    cms.patch(CFG, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(format!(
        "{relabel} pods relabelled, {deleted} deleted, {replaced} replaced (same name, new UID), {created} created, {released} `cfg-` pods deleted (the node must drop `{CFG}`), `{CFG}` updated"
    ))
}

impl Storm<'_> {
    pub async fn run(self) -> anyhow::Result<()> {
        let n = self.edges.len();
        println!("  reconnect storm:");

        prepare(&self.client, n).await?;
        let before = expected(&self.client, n).await?;
        let (_, d) = converge(self.edges, &before, Duration::from_secs(300)).await;
        if d.total() > 0 {
            let (_, ex) = compare(self.edges, &before, 10);
            anyhow::bail!("edges differ from the cluster before the storm: {d:?}; {ex:#?}");
        }
        let objects: usize = before.iter().map(|o| o.len()).sum();
        println!(
            "    before: every edge holds exactly the cluster's objects ({objects} in all, {:.1} per node; one configmap `{CFG}` used on every node)",
            objects as f64 / n as f64
        );

        // Everyone drops the link at once.
        let t = Instant::now();
        self.stop.cancel();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let m = scrape(self.monitor).await;
            if metric(&m, "cloudhub_connected_nodes") == 0.0 && m.contains("cloudhub_connected") {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "cloudcore still counts connected nodes 120 s after every edge closed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!(
            "    all {n} edges closed their connections; cloudcore counted 0 connected after {:.2} s",
            t.elapsed().as_secs_f64()
        );

        let t = Instant::now();
        let summary = change_while_away(&self.client, n, self.pods_total).await?;
        println!(
            "    while away ({:.1} s): {summary}",
            t.elapsed().as_secs_f64()
        );
        let want = expected(&self.client, n).await?;
        let (gap, _) = compare(self.edges, &want, 0);
        let nodes_behind = self
            .edges
            .iter()
            .zip(&want)
            .filter(|(e, w)| {
                compare(std::slice::from_ref(*e), std::slice::from_ref(*w), 0)
                    .0
                    .total()
                    > 0
            })
            .count();
        println!(
            "    difference to repair: {} objects on {nodes_behind} nodes ({} missing, {} stale, {} to remove)",
            gap.total(),
            gap.missing,
            gap.stale,
            gap.extra
        );

        // Everyone redials at once.
        let metrics0 = scrape(self.monitor).await;
        let (down0, up0) = (
            self.counters.downstream.load(Ordering::Relaxed),
            self.counters.upstream.load(Ordering::Relaxed),
        );
        let failures0 = self.counters.dial_failures.load(Ordering::Relaxed);
        if let Ok(mut k) = self.counters.by_kind.lock() {
            k.clear();
        }
        self.counters.tally.store(true, Ordering::Relaxed);
        let sampling = CancellationToken::new();
        let pid = self.pid;
        let sampler = {
            let sampling = sampling.clone();
            tokio::spawn(async move {
                let mut peak = 0u64;
                while !sampling.is_cancelled() {
                    peak = peak.max(rss_kb(pid));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                peak
            })
        };
        let rss0 = rss_kb(pid);
        let cpu0 = cpu_ticks(pid);
        let stop = CancellationToken::new();
        let t0 = Instant::now();
        let mut dials = Vec::with_capacity(n);
        for (edge, tls) in self.edges.iter().zip(self.tls) {
            let (edge, tls) = (edge.clone(), tls.clone());
            let (counters, receipts, stop) =
                (self.counters.clone(), self.receipts.clone(), stop.clone());
            let addr = self.addr;
            dials.push(tokio::spawn(async move {
                let raw = edge::dial(addr, &edge, tls.clone(), &counters, 20).await?;
                let at = Instant::now();
                tokio::spawn(edge::keep(addr, raw, edge, tls, counters, receipts, stop));
                anyhow::Ok(at)
            }));
        }
        let connected = tokio::spawn(async move {
            let mut last = None::<Instant>;
            let mut errors = Vec::new();
            for d in dials {
                match d.await {
                    Ok(Ok(at)) => last = last.max(Some(at)),
                    Ok(Err(e)) => errors.push(e.to_string()),
                    Err(e) => errors.push(e.to_string()),
                }
            }
            (last, errors)
        });
        let (done, left) = converge(self.edges, &want, Duration::from_secs(300)).await;
        let cpu = cpu_ticks(pid) - cpu0;
        let wall = t0.elapsed();
        sampling.cancel();
        let peak = sampler.await.unwrap_or(0);
        self.counters.tally.store(false, Ordering::Relaxed);
        let (down, up) = (
            self.counters.downstream.load(Ordering::Relaxed) - down0,
            self.counters.upstream.load(Ordering::Relaxed) - up0,
        );
        let metrics1 = scrape(self.monitor).await;
        let delta = |name: &str| metric(&metrics1, name) - metric(&metrics0, name);
        let (last_connect, dial_errors) = connected.await?;
        match last_connect {
            Some(at) if dial_errors.is_empty() => println!(
                "    all {n} edges reconnected {:.2} s after the first redial ({} failed dials retried with edgehub's backoff)",
                at.saturating_duration_since(t0).as_secs_f64(),
                self.counters.dial_failures.load(Ordering::Relaxed) - failures0
            ),
            _ => println!(
                "    {} edges could not reconnect, e.g. {:?}",
                dial_errors.len(),
                dial_errors.first()
            ),
        }
        match done {
            Some(at) => println!(
                "    all {n} edges converged {:.2} s after the first redial (every edge holds exactly the cluster's objects)",
                at.saturating_duration_since(t0).as_secs_f64()
            ),
            None => println!(
                "    NOT converged after {:.0} s: {left:?}",
                wall.as_secs_f64()
            ),
        }
        let kinds = self
            .counters
            .by_kind
            .lock()
            .map(|k| {
                k.iter()
                    .map(|(k, v)| format!("{v} {k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        println!(
            "    messages until converged: {down} to the edges ({kinds}; {} objects needed repair), {up} from the edges (inventories, ACKs, keepalives)",
            gap.total()
        );
        println!(
            "    cloudhub counters: {:.0} sent, {:.0} resent, {:.0} dropped, {:.0} received",
            delta("cloudhub_messages_sent_total"),
            delta("cloudhub_messages_resent_total"),
            delta("cloudhub_messages_dropped_total"),
            delta("cloudhub_messages_received_total"),
        );
        let (requests, by_verb) = e2e::bench::apiserver_requests(
            &e2e::bench::Scrape::parse(&metrics1).since(&e2e::bench::Scrape::parse(&metrics0)),
        );
        println!(
            "    cloudcore → apiserver requests during the storm: {requests:.0} ({by_verb}) for {n} reconnecting edges"
        );
        println!(
            "    cloudcore during the storm: peak RSS {peak} KB (from {rss0} KB), CPU {:.0}% of one core over {:.1} s",
            cpu as f64 / wall.as_secs_f64(),
            wall.as_secs_f64()
        );

        // Nothing lost: check again once late messages (resends, duplicates) had time to land.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let want = expected(&self.client, n).await?;
        let (d, examples) = compare(self.edges, &want, 10);
        println!(
            "    mismatches 3 s later: {} ({} missing, {} stale, {} extra)",
            d.total(),
            d.missing,
            d.stale,
            d.extra
        );
        stop.cancel();
        anyhow::ensure!(
            d.total() == 0 && dial_errors.is_empty(),
            "reconnect storm lost or left stale objects: {d:?}; e.g. {examples:#?}"
        );
        Ok(())
    }
}
