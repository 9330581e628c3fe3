//! `bench-cloudcore fleet`: a fleet too large for one process, run as KubeEdge's own
//! 100,000-node test ran it. The in-memory API server runs as its own process
//! (`kube-memserver`), several cloudcore replicas share it, and the simulated edges are split
//! over processes (`bench-cloudcore sim`, one per replica, each dialling its replica): this
//! machine lets one process hold 20,000 open files. Every edge keeps its objects compactly
//! (UID bits, resourceVersion, a content hash) and a digest of them, so the coordinator checks
//! 100,000 edges against the cluster by comparing one number per edge.
//!
//!     cargo build --profile bench-fast -p cloudcore -p kube-memserver -p e2e
//!     target/bench-fast/bench-cloudcore fleet --edges 100000 --replicas 6 --pods-per-edge 10
//!
//! Phases: Nodes created; all edges connect; idle RSS/CPU per replica; pods created and
//! delivered; creation → edge latency; the reconnect storm of `storm.rs` (everyone drops, the
//! cluster changes, everyone redials at once) until every edge's digest equals the cluster's.
//! Exits non-zero when an edge ends up holding anything else.

use crate::edge::{Objects, digest_of};
use crate::expected::{Diff, compare_one, expected};
use crate::{CloudcoreProcess, free_port, pct, pod, start_cloudcore, wait_ready};
use anyhow::Context;
use e2e::bench::{Scrape, apiserver_requests};
use e2e::channel::Pki;
use e2e::procfs::{cpu_ticks, rss_kb};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::{Mutex, Semaphore, oneshot};

/// Open files one process may hold here, less what a process needs besides connections.
const EDGES_PER_PROCESS: usize = 19_500;

#[derive(clap::Parser)]
#[command(about = "cloudcore fleet benchmark: replicas, simulator processes (prints numbers)")]
pub struct FleetArgs {
    /// Simulated edge nodes, all connected.
    #[arg(long, default_value_t = 100_000)]
    edges: usize,
    /// cloudcore replicas; each holds edges / replicas connections.
    #[arg(long, default_value_t = 6)]
    replicas: usize,
    #[arg(long, default_value_t = 10)]
    pods_per_edge: usize,
    /// Pods created one at a time (20 in flight) to measure creation → edge latency.
    #[arg(long, default_value_t = 2000)]
    latency_pods: usize,
    /// TLS handshakes in flight while the fleet first connects (split over the simulators).
    #[arg(long, default_value_t = 128)]
    handshakes: usize,
    /// Each replica's `cloudHub.maxConcurrentHandshakes` (a quarter of it per address, and
    /// every simulated edge dials from 127.0.0.1). The default 512 suits a cloudcore with
    /// its cores to itself; here each replica gets about a twelfth of two cores.
    #[arg(long, default_value_t = 128)]
    replica_handshakes: usize,
    /// API calls in flight while creating objects.
    #[arg(long, default_value_t = 128)]
    api_concurrency: usize,
    /// Run the reconnect storm (`--storm false` to skip it).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    storm: bool,
    /// The cloudcore binary (default: next to this one).
    #[arg(long)]
    cloudcore: Option<PathBuf>,
    /// The kube-memserver binary (default: next to this one).
    #[arg(long)]
    memserver: Option<PathBuf>,
}

/// One simulator process and its command channel.
struct SimProc {
    child: Child,
    first: usize,
    count: usize,
    stdin: Mutex<ChildStdin>,
    pending: Arc<std::sync::Mutex<HashMap<u64, oneshot::Sender<String>>>>,
    next: AtomicU64,
}

impl SimProc {
    async fn start(
        first: usize,
        count: usize,
        addr: &str,
        ca_dir: &Path,
        handshakes: usize,
    ) -> anyhow::Result<SimProc> {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["sim", "--first", &first.to_string()])
            .args(["--count", &count.to_string(), "--addr", addr])
            .arg("--ca-dir")
            .arg(ca_dir)
            .args(["--handshakes", &handshakes.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // Dies with the benchmark, however it ends.
        let mut child =
            e2e::process::spawn_tied(command).context("starting a simulator process")?;
        let stdin = ChildStdin::from_std(child.stdin.take().context("simulator stdin")?)?;
        let stdout = ChildStdout::from_std(child.stdout.take().context("simulator stdout")?)?;
        let pending: Arc<std::sync::Mutex<HashMap<u64, oneshot::Sender<String>>>> = Arc::default();
        let (ready_tx, ready_rx) = oneshot::channel();
        let p = pending.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            let mut ready = Some(ready_tx);
            while let Ok(Some(line)) = lines.next_line().await {
                if line == "ready" {
                    if let Some(r) = ready.take() {
                        let _ = r.send(());
                    }
                    continue;
                }
                let Some((id, answer)) = line.split_once(' ') else {
                    continue;
                };
                let waiter = id
                    .parse::<u64>()
                    .ok()
                    .and_then(|id| p.lock().ok()?.remove(&id));
                if let Some(w) = waiter {
                    let _ = w.send(answer.to_string());
                }
            }
            // Gone: every caller still waiting gets an error (its sender is dropped).
            if let Ok(mut p) = p.lock() {
                p.clear();
            }
        });
        tokio::time::timeout(Duration::from_secs(600), ready_rx)
            .await
            .context("simulator not ready within 600 s")?
            .context("simulator exited while starting")?;
        Ok(SimProc {
            child,
            first,
            count,
            stdin: Mutex::new(stdin),
            pending,
            next: AtomicU64::new(1),
        })
    }

    /// Runs `command`; its answer after `ok`.
    async fn call(&self, command: &str) -> anyhow::Result<String> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Ok(mut p) = self.pending.lock() {
            p.insert(id, tx);
        }
        self.stdin
            .lock()
            .await
            .write_all(format!("{id} {command}\n").as_bytes())
            .await?;
        let answer = rx
            .await
            .with_context(|| format!("simulator of edge-{} exited", self.first))?;
        match answer.split_once(' ').unwrap_or((answer.as_str(), "")) {
            ("ok", rest) => Ok(rest.to_string()),
            (_, reason) => anyhow::bail!("simulator of edge-{}: {command}: {reason}", self.first),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for SimProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every simulator's answer to `command`, in order, run at once.
async fn all(sims: &[SimProc], command: &str) -> anyhow::Result<Vec<String>> {
    let answers = futures_util::future::join_all(sims.iter().map(|s| s.call(command))).await;
    answers.into_iter().collect()
}

fn numbers(answer: &str) -> Vec<f64> {
    answer
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// Sum over simulators of field `i` of `stats`.
async fn stat(sims: &[SimProc], i: usize) -> anyhow::Result<f64> {
    Ok(all(sims, "stats")
        .await?
        .iter()
        .map(|a| numbers(a).get(i).copied().unwrap_or(0.0))
        .sum())
}

fn from_unix_ns(ns: u128) -> Option<SystemTime> {
    (ns > 0).then(|| UNIX_EPOCH + Duration::from_nanos(ns as u64))
}

/// Edges whose digest differs from `want`, and when the last edge last changed.
async fn mismatches(
    sims: &[SimProc],
    want: &[u64],
) -> anyhow::Result<(Vec<usize>, Option<SystemTime>)> {
    let mut out = Vec::new();
    let mut last = None;
    for (s, answer) in sims.iter().zip(all(sims, "digests").await?) {
        let (at, digests) = answer.split_once(' ').unwrap_or((answer.as_str(), ""));
        last = last.max(at.parse::<u128>().ok().and_then(from_unix_ns));
        let got: Vec<&str> = digests.split(',').filter(|d| !d.is_empty()).collect();
        anyhow::ensure!(
            got.len() == s.count,
            "simulator of edge-{} sent {} digests for {} edges",
            s.first,
            got.len(),
            s.count
        );
        for (k, d) in got.iter().enumerate() {
            let i = s.first + k;
            if u64::from_str_radix(d, 16).ok() != want.get(i).copied() {
                out.push(i);
            }
        }
    }
    Ok((out, last))
}

/// What the mismatching edges (up to 200) hold against `want`, with up to 10 examples.
async fn explain(
    sims: &[SimProc],
    want: &[Objects],
    edges: &[usize],
) -> anyhow::Result<(Diff, Vec<String>)> {
    let mut d = Diff::default();
    let mut ex = Vec::new();
    for &i in edges.iter().take(200) {
        let Some(s) = sims
            .iter()
            .find(|s| (s.first..s.first + s.count).contains(&i))
        else {
            continue;
        };
        let held = crate::sim::parse_dump(&s.call(&format!("dump {i}")).await?)?;
        let (dd, mut e) = compare_one(&format!("edge-{i}"), &held, &want[i], 10 - ex.len());
        d.missing += dd.missing;
        d.stale += dd.stale;
        d.extra += dd.extra;
        ex.append(&mut e);
    }
    Ok((d, ex))
}

/// Polls until every edge's digest equals `want` or `limit` passes: when the last edge last
/// changed, and the edges still differing.
async fn converge(
    sims: &[SimProc],
    want: &[u64],
    limit: Duration,
) -> anyhow::Result<(Option<SystemTime>, Vec<usize>)> {
    let deadline = Instant::now() + limit;
    let mut last_report = Instant::now();
    loop {
        let (bad, last) = mismatches(sims, want).await?;
        if bad.is_empty() {
            return Ok((last, bad));
        }
        if Instant::now() > deadline {
            return Ok((None, bad));
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            println!("      … {} edges still differ", bad.len());
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The series of several scrapes added up (one per replica).
fn total(scrapes: &[Scrape]) -> Scrape {
    let mut sum: BTreeMap<String, f64> = BTreeMap::new();
    for s in scrapes {
        for (k, v) in &s.0 {
            *sum.entry(k.clone()).or_default() += v;
        }
    }
    Scrape(sum)
}

async fn scrape_all(replicas: &[CloudcoreProcess]) -> Scrape {
    let mut out = Vec::new();
    for r in replicas {
        out.push(Scrape::fetch(&r.monitor).await.unwrap_or_default());
    }
    total(&out)
}

/// Runs `f(i)` for `i` in `0..n`, `concurrency` at a time, printing progress every `every`.
async fn each<F, Fut>(
    n: usize,
    concurrency: usize,
    every: usize,
    what: &str,
    f: F,
) -> anyhow::Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let sem = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks = std::collections::VecDeque::new();
    let t = Instant::now();
    for i in 0..n {
        let permit = sem.clone().acquire_owned().await?;
        let fut = f(i);
        tasks.push_back(tokio::spawn(async move {
            let r = fut.await;
            drop(permit);
            r
        }));
        while tasks.len() > 4 * concurrency {
            if let Some(t) = tasks.pop_front() {
                t.await??;
            }
        }
        if (i + 1) % every == 0 {
            println!(
                "    … {} {what} ({:.0}/s)",
                i + 1,
                (i + 1) as f64 / t.elapsed().as_secs_f64()
            );
        }
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

struct Memserver {
    child: Child,
    kubeconfig: PathBuf,
}

impl Drop for Memserver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_memserver(bin: &Path, dir: &Path) -> anyhow::Result<(Memserver, kube::Client)> {
    let kubeconfig = dir.join("kubeconfig");
    let mut command = Command::new(bin);
    command
        .args(["--listen", &format!("127.0.0.1:{}", free_port()?)])
        .arg("--kubeconfig-out")
        .arg(&kubeconfig)
        .args(["--history", "500000", "--watch-capacity", "200000"])
        .args(["--node-monitor-grace-period", "360000"])
        .arg("--no-workload-controllers")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let child =
        e2e::process::spawn_tied(command).with_context(|| format!("starting {}", bin.display()))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(kc) = kube::config::Kubeconfig::read_from(&kubeconfig) {
            let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
            let client = kube::Client::try_from(config)?;
            if client.apiserver_version().await.is_ok() {
                return Ok((Memserver { child, kubeconfig }, client));
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "kube-memserver did not answer within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

pub async fn run(args: FleetArgs) -> anyhow::Result<()> {
    let (n, r) = (args.edges, args.replicas.max(1));
    let per = n.div_ceil(r);
    anyhow::ensure!(
        per <= EDGES_PER_PROCESS,
        "{per} edges per replica: one process may hold at most 20,000 open files here; use --replicas {} or more",
        n.div_ceil(EDGES_PER_PROCESS)
    );
    let dir = std::env::temp_dir().join(format!("bench-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let here = std::env::current_exe()?;
    let memserver_bin = args
        .memserver
        .clone()
        .unwrap_or_else(|| here.with_file_name("kube-memserver"));
    let cloudcore_bin = args
        .cloudcore
        .clone()
        .unwrap_or_else(|| here.with_file_name("cloudcore"));
    println!(
        "bench-cloudcore fleet: {n} edges × {} pods, {r} cloudcore replicas ({per} edges each), {r} simulator processes",
        args.pods_per_edge
    );
    let (memserver, client) = start_memserver(&memserver_bin, &dir).await?;
    let api_pid = memserver.child.id();

    // Edge nodes in the API.
    let nodes: Api<Node> = Api::all(client.clone());
    let t = Instant::now();
    each(n, args.api_concurrency, 20_000, "Nodes created", |i| {
        let nodes = nodes.clone();
        async move {
            let node: Node =
                serde_json::from_value(json!({"metadata": {"name": format!("edge-{i}"),
                "labels": {"node-role.kubernetes.io/edge": ""}}}))?;
            nodes.create(&PostParams::default(), &node).await?;
            Ok(())
        }
    })
    .await?;
    println!(
        "  {n} Node objects created in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // Replicas, sharing one CA.
    let pki = Pki::new()?;
    let mut replicas = Vec::with_capacity(r);
    for k in 0..r {
        let rdir = dir.join(format!("cloudcore-{k}"));
        std::fs::create_dir_all(&rdir)?;
        replicas.push(start_cloudcore(
            &cloudcore_bin,
            &rdir,
            &pki,
            &memserver.kubeconfig,
            args.replica_handshakes,
        )?);
    }
    for c in &replicas {
        wait_ready(&c.monitor).await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pids: Vec<u32> = replicas.iter().map(|c| c.child.id()).collect();
    let rss = |pids: &[u32]| pids.iter().map(|p| rss_kb(*p)).collect::<Vec<_>>();
    let rss_start = rss(&pids);

    // Simulators, one per replica.
    let t = Instant::now();
    let mut sims = Vec::with_capacity(r);
    for (k, c) in replicas.iter().enumerate() {
        let first = k * per;
        let count = per.min(n.saturating_sub(first));
        if count == 0 {
            break;
        }
        sims.push(
            SimProc::start(
                first,
                count,
                &format!("127.0.0.1:{}", c.hub_port),
                &dir.join(format!("cloudcore-{k}")),
                args.handshakes.div_ceil(r),
            )
            .await?,
        );
    }
    println!(
        "  {} simulator processes up, {n} edge certificates issued, in {:.1} s",
        sims.len(),
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let answers = all(&sims, "connect").await?;
    let connect = t.elapsed();
    let failures: f64 = answers
        .iter()
        .map(|a| numbers(a).get(1).copied().unwrap_or(0.0))
        .sum();
    println!(
        "  all {n} edges connected in {:.1} s ({:.0} edges/s; {} handshakes in flight; {failures:.0} failed dials retried)",
        connect.as_secs_f64(),
        n as f64 / connect.as_secs_f64(),
        args.handshakes
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_idle = rss(&pids);
    let c0: Vec<u64> = pids.iter().map(|p| cpu_ticks(*p)).collect();
    let m0 = scrape_all(&replicas).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle_cpu: Vec<f64> = pids
        .iter()
        .zip(&c0)
        .map(|(p, c)| (cpu_ticks(*p) - c) as f64 / 10.0)
        .collect();
    let m1 = scrape_all(&replicas).await;
    let (idle_requests, idle_by_verb) = apiserver_requests(&m1.since(&m0));
    for (k, ((s, i), cpu)) in rss_start.iter().zip(&rss_idle).zip(&idle_cpu).enumerate() {
        println!(
            "  replica {k}: RSS {:.0} MB at start, {:.0} MB with {} idle edges ({:.1} KB per edge); CPU while idle {cpu:.1}% of a core",
            mb(*s),
            mb(*i),
            sims.get(k).map_or(0, |s| s.count),
            i.saturating_sub(*s) as f64 / sims.get(k).map_or(1, |s| s.count.max(1)) as f64
        );
    }
    println!(
        "  cloudcore → apiserver requests while idle, all replicas: {:.1}/s over 10 s ({idle_by_verb})",
        idle_requests / 10.0
    );

    // Pods.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let total_pods = n * args.pods_per_edge;
    let m0 = scrape_all(&replicas).await;
    let t = Instant::now();
    each(
        total_pods,
        args.api_concurrency,
        100_000,
        "pods created",
        |i| {
            let pods = pods.clone();
            async move {
                let p = pod(&format!("p-{i}"), &format!("edge-{}", i % n));
                pods.create(&PostParams::default(), &p).await?;
                Ok(())
            }
        },
    )
    .await?;
    let created = t.elapsed();
    let deadline = Instant::now() + Duration::from_secs(1800);
    let mut received = stat(&sims, 0).await?;
    while received < total_pods as f64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        received = stat(&sims, 0).await?;
    }
    println!(
        "  {total_pods} pods created in {:.1} s; all delivered to their edges (and ACKed) after {:.1} s ({received:.0} received)",
        created.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    let m1 = scrape_all(&replicas).await;
    let (requests, by_verb) = apiserver_requests(&m1.since(&m0));
    println!(
        "  cloudcore → apiserver requests while the pods were delivered, all replicas: {requests:.0} ({by_verb})"
    );
    println!(
        "  connections the cloud ended (dialled again) so far: {:.0}",
        stat(&sims, 4).await?
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (k, kb) in rss(&pids).iter().enumerate() {
        println!(
            "  replica {k}: RSS {:.0} MB with {n} nodes and {total_pods} pods (its {} edges connected)",
            mb(*kb),
            sims.get(k).map_or(0, |s| s.count)
        );
    }
    let sims_rss: u64 = sims.iter().map(|s| rss_kb(s.pid())).sum();
    println!(
        "  kube-memserver RSS {:.0} MB; simulators {:.0} MB in all ({:.1} KB per edge)",
        mb(rss_kb(api_pid)),
        mb(sims_rss),
        sims_rss as f64 / n as f64
    );

    // Latency: creation → arrival, 20 creations in flight.
    let sem = Arc::new(Semaphore::new(20));
    let mut tasks = Vec::with_capacity(args.latency_pods);
    for i in 0..args.latency_pods {
        let pods = pods.clone();
        let permit = sem.clone().acquire_owned().await?;
        let node = format!("edge-{}", (i * 7919) % n);
        tasks.push(tokio::spawn(async move {
            let name = format!("lat-{i}");
            let start = SystemTime::now();
            let r = pods
                .create(&PostParams::default(), &pod(&name, &node))
                .await;
            drop(permit);
            r.map(|_| (format!("default/pod/{name}"), start))
        }));
    }
    let mut starts = HashMap::with_capacity(args.latency_pods);
    for t in tasks {
        let (k, s) = t.await??;
        starts.insert(k, s);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut lat = Vec::new();
    loop {
        lat.clear();
        for answer in all(&sims, "receipts").await? {
            for entry in answer.split(';') {
                let Some((k, ns)) = entry.split_once('=') else {
                    continue;
                };
                if let (Some(s), Some(at)) = (starts.get(k), ns.parse().ok().and_then(from_unix_ns))
                {
                    lat.push(at.duration_since(*s).unwrap_or_default());
                }
            }
        }
        if lat.len() >= starts.len() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "  pod creation → edge receipt ({} of {} pods, 20 creations in flight, {n} edges, {total_pods} pods): p50 {:.1} ms, p99 {:.1} ms",
        lat.len(),
        args.latency_pods,
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99)
    );

    let result = if args.storm {
        storm(&client, &sims, &replicas, &pids, n, total_pods).await
    } else {
        Ok(())
    };
    for s in &sims {
        let _ = s.stdin.lock().await.shutdown().await;
    }
    drop(sims);
    drop(replicas);
    drop(memserver);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn storm(
    client: &kube::Client,
    sims: &[SimProc],
    replicas: &[CloudcoreProcess],
    pids: &[u32],
    n: usize,
    pods_total: usize,
) -> anyhow::Result<()> {
    println!("  reconnect storm:");
    let t = Instant::now();
    crate::storm::prepare(client, n).await?;
    let want = expected(client, n).await?;
    let digests: Vec<u64> = want.iter().map(digest_of).collect();
    let (_, bad) = converge(sims, &digests, Duration::from_secs(600)).await?;
    if !bad.is_empty() {
        let (d, ex) = explain(sims, &want, &bad).await?;
        anyhow::bail!(
            "{} edges differ from the cluster before the storm: {d:?}; {ex:#?}",
            bad.len()
        );
    }
    let objects: usize = want.iter().map(|o| o.len()).sum();
    println!(
        "    before ({:.1} s to set up): every edge holds exactly the cluster's objects ({objects} in all, {:.1} per node; one configmap used on every node)",
        t.elapsed().as_secs_f64(),
        objects as f64 / n as f64
    );
    drop(want);

    // Everyone drops the link at once.
    let t = Instant::now();
    all(sims, "drop").await?;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let m = scrape_all(replicas).await;
        let series = m.0.keys().any(|k| k.starts_with("cloudhub_connected"));
        if series && m.sum("cloudhub_connected_nodes", &[]) == 0.0 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "cloudcore replicas still count connected nodes 300 s after every edge closed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "    all {n} edges closed their connections; the replicas counted 0 connected after {:.2} s",
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let summary = crate::storm::change_while_away(client, n, pods_total).await?;
    println!(
        "    while away ({:.1} s): {summary}",
        t.elapsed().as_secs_f64()
    );
    let want = expected(client, n).await?;
    let digests: Vec<u64> = want.iter().map(digest_of).collect();
    let (behind, _) = mismatches(sims, &digests).await?;
    println!(
        "    difference to repair: {} of {n} nodes hold something else than the cluster",
        behind.len()
    );

    // Everyone redials at once.
    let m0 = scrape_all(replicas).await;
    let down0 = stat(sims, 1).await?;
    let reconnects0 = stat(sims, 4).await?;
    all(sims, "tally on").await?;
    let cpu0: Vec<u64> = pids.iter().map(|p| cpu_ticks(*p)).collect();
    let rss0: Vec<u64> = pids.iter().map(|p| rss_kb(*p)).collect();
    let sampling = tokio_util::sync::CancellationToken::new();
    let sampler = {
        let (sampling, pids) = (sampling.clone(), pids.to_vec());
        tokio::spawn(async move {
            let mut peak = vec![0u64; pids.len()];
            while !sampling.is_cancelled() {
                for (p, pid) in peak.iter_mut().zip(&pids) {
                    *p = (*p).max(rss_kb(*pid));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            peak
        })
    };
    let t0 = SystemTime::now();
    let started = Instant::now();
    let (conv, dials) = tokio::join!(
        converge(sims, &digests, Duration::from_secs(900)),
        futures_util::future::join_all(sims.iter().map(|s| s.call("redial")))
    );
    let (done, left) = conv?;
    let wall = started.elapsed();
    sampling.cancel();
    let peak = sampler.await.unwrap_or_default();
    let mut last_connect = None;
    let (mut failed, mut errors, mut first_error) = (0.0, 0.0, String::new());
    for d in dials {
        let d = d?;
        let mut w = d.splitn(4, ' ');
        let at = w.next().and_then(|v| v.parse::<u128>().ok());
        last_connect = last_connect.max(at.and_then(from_unix_ns));
        failed += w.next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        let e = w.next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        errors += e;
        if e > 0.0 && first_error.is_empty() {
            first_error = w.next().unwrap_or_default().to_string();
        }
    }
    let since = |at: SystemTime| at.duration_since(t0).unwrap_or_default().as_secs_f64();
    match last_connect {
        Some(at) if errors == 0.0 => println!(
            "    all {n} edges reconnected {:.2} s after the first redial ({failed:.0} failed dials retried with edgehub's backoff)",
            since(at)
        ),
        _ => println!("    {errors:.0} edges could not reconnect, e.g. {first_error}"),
    }
    match done {
        Some(at) => println!(
            "    all {n} edges converged {:.2} s after the first redial (every edge's digest equals the cluster's)",
            since(at)
        ),
        None => println!(
            "    NOT converged after {:.0} s: {} edges differ",
            wall.as_secs_f64(),
            left.len()
        ),
    }
    all(sims, "tally off").await.ok();
    let kinds: BTreeMap<String, f64> = all(sims, "kinds")
        .await?
        .iter()
        .flat_map(|a| a.split(';').map(str::to_string).collect::<Vec<_>>())
        .filter_map(|e| {
            let (k, v) = e.split_once('=')?;
            Some((k.to_string(), v.parse::<f64>().ok()?))
        })
        .fold(BTreeMap::new(), |mut m, (k, v)| {
            *m.entry(k).or_default() += v;
            m
        });
    let kinds = kinds
        .iter()
        .map(|(k, v)| format!("{v:.0} {k}"))
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "    messages to the edges until converged: {:.0} ({kinds})",
        stat(sims, 1).await? - down0
    );
    println!(
        "    connections the cloud ended during the storm that the edges dialled again: {:.0}",
        stat(sims, 4).await? - reconnects0
    );
    let m1 = scrape_all(replicas).await;
    let delta = m1.since(&m0);
    println!(
        "    cloudhub counters, all replicas: {:.0} sent, {:.0} resent, {:.0} dropped, {:.0} received",
        delta.sum("cloudhub_messages_sent_total", &[]).max(0.0),
        delta.sum("cloudhub_messages_resent_total", &[]).max(0.0),
        delta.sum("cloudhub_messages_dropped_total", &[]).max(0.0),
        delta.sum("cloudhub_messages_received_total", &[]).max(0.0),
    );
    let (requests, by_verb) = apiserver_requests(&delta);
    println!(
        "    cloudcore → apiserver requests during the storm, all replicas: {requests:.0} ({by_verb}) for {n} reconnecting edges"
    );
    for (k, pid) in pids.iter().enumerate() {
        println!(
            "    replica {k} during the storm: peak RSS {:.0} MB (from {:.0} MB), CPU {:.0}% of a core over {:.1} s",
            mb(peak.get(k).copied().unwrap_or(0)),
            mb(rss0[k]),
            (cpu_ticks(*pid) - cpu0[k]) as f64 / wall.as_secs_f64(),
            wall.as_secs_f64()
        );
    }

    // Nothing lost: check again once late messages had time to land.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let want = expected(client, n).await?;
    let digests: Vec<u64> = want.iter().map(digest_of).collect();
    let (bad, _) = mismatches(sims, &digests).await?;
    let (d, examples) = explain(sims, &want, &bad).await?;
    println!(
        "    mismatches 3 s later: {} edges ({} missing, {} stale, {} extra objects on the first 200 of them)",
        bad.len(),
        d.missing,
        d.stale,
        d.extra
    );
    anyhow::ensure!(
        bad.is_empty() && errors == 0.0,
        "reconnect storm lost or left stale objects on {} edges: {d:?}; e.g. {examples:#?}",
        bad.len()
    );
    Ok(())
}
