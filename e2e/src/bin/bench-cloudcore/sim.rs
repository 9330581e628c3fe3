//! `bench-cloudcore sim`: one process of the fleet benchmark's simulated edges (`fleet.rs`).
//! It runs edges `edge-<first>` … `edge-<first + count - 1>` against one cloudcore replica and
//! answers the coordinator on stdin/stdout, one line per command and one per answer, each
//! prefixed with the command's id; commands run concurrently:
//!
//! | command | answer after `ok` |
//! |---|---|
//! | `connect` | seconds until all connected, failed dials (`--handshakes` at a time) |
//! | `drop` | — (every edge closes its connection, keeping what it holds) |
//! | `redial` | unix ns of the last connection, failed dials, errors, first error (all at once) |
//! | `stats` | pods received, downstream messages, upstream frames, failed dials, reconnects |
//! | `tally on`/`tally off`, `kinds` | downstream messages by kind: `kind=count;…` |
//! | `receipts` | first arrival of each latency pod: `key=unix ns;…` |
//! | `digests` | unix ns of the last change, then each edge's digest in hex, comma-separated |
//! | `dump <i>` | what `edge-<i>` holds: `key|uid|rv|content;…` (numbers in hex) |
//!
//! A failed command answers `err <reason>`.

use crate::edge::{self, Counters, EdgeState, Held, Receipts};
use e2e::channel::Pki;
use kubeedge_shared::pki::CertificateAuthority;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

#[derive(clap::Parser)]
#[command(about = "one process of bench-cloudcore fleet's simulated edges (internal)")]
pub struct SimArgs {
    /// Index of the first edge (`edge-<first>`).
    #[arg(long)]
    first: usize,
    /// How many edges this process runs.
    #[arg(long)]
    count: usize,
    /// The cloudhub these edges dial.
    #[arg(long)]
    addr: SocketAddr,
    /// Directory holding the cluster CA (`rootCA.crt`, `rootCA.key`) the edges' certificates
    /// come from.
    #[arg(long)]
    ca_dir: PathBuf,
    /// TLS handshakes in flight during `connect`.
    #[arg(long, default_value_t = 32)]
    handshakes: usize,
}

struct Sim {
    first: usize,
    addr: SocketAddr,
    handshakes: usize,
    edges: Vec<Arc<EdgeState>>,
    tls: Vec<Arc<rustls::ClientConfig>>,
    counters: Arc<Counters>,
    receipts: Receipts,
    /// Stops the edges' current connections.
    stop: Mutex<CancellationToken>,
    /// The edges' `Instant` epoch as wall-clock time.
    epoch: Instant,
    epoch_wall: SystemTime,
}

fn unix_ns(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos()
}

impl Sim {
    fn wall(&self, at: Instant) -> SystemTime {
        self.epoch_wall + at.saturating_duration_since(self.epoch)
    }

    fn current_stop(&self) -> CancellationToken {
        self.stop.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Dials edge `k` (up to `max_failures` failed dials) once `permit` allows, then keeps its
    /// connections until `stop`; answers when it connected.
    fn start(
        &self,
        k: usize,
        stop: &CancellationToken,
        max_failures: u32,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> tokio::task::JoinHandle<anyhow::Result<Instant>> {
        let (e, tls, c, r, stop) = (
            self.edges[k].clone(),
            self.tls[k].clone(),
            self.counters.clone(),
            self.receipts.clone(),
            stop.clone(),
        );
        let addr = self.addr;
        tokio::spawn(async move {
            let raw = edge::dial(addr, &e, tls.clone(), &c, max_failures).await;
            drop(permit);
            let at = Instant::now();
            tokio::spawn(edge::keep(addr, raw?, e, tls, c, r, stop));
            Ok(at)
        })
    }

    async fn connect(self: &Arc<Self>) -> anyhow::Result<String> {
        let t = Instant::now();
        let failures0 = self.counters.dial_failures.load(Ordering::Relaxed);
        let sem = Arc::new(Semaphore::new(self.handshakes.max(1)));
        let stop = self.current_stop();
        let mut tasks = Vec::with_capacity(self.edges.len());
        for k in 0..self.edges.len() {
            let permit = sem.clone().acquire_owned().await?;
            tasks.push(self.start(k, &stop, 10, Some(permit)));
        }
        for t in tasks {
            t.await??;
        }
        Ok(format!(
            "{:.3} {}",
            t.elapsed().as_secs_f64(),
            self.counters.dial_failures.load(Ordering::Relaxed) - failures0
        ))
    }

    fn drop_all(&self) {
        let mut stop = self.stop.lock().unwrap_or_else(|e| e.into_inner());
        stop.cancel();
        *stop = CancellationToken::new();
    }

    async fn redial(self: &Arc<Self>) -> anyhow::Result<String> {
        let failures0 = self.counters.dial_failures.load(Ordering::Relaxed);
        let stop = self.current_stop();
        let dials: Vec<_> = (0..self.edges.len())
            .map(|k| self.start(k, &stop, 20, None))
            .collect();
        let (mut last, mut errors) = (None::<Instant>, Vec::new());
        for d in dials {
            match d.await {
                Ok(Ok(at)) => last = last.max(Some(at)),
                Ok(Err(e)) => errors.push(e.to_string()),
                Err(e) => errors.push(e.to_string()),
            }
        }
        Ok(format!(
            "{} {} {} {}",
            last.map_or(0, |at| unix_ns(self.wall(at))),
            self.counters.dial_failures.load(Ordering::Relaxed) - failures0,
            errors.len(),
            errors
                .first()
                .map_or("-", |e| e.as_str())
                .replace('\n', " ")
        ))
    }

    fn digests(&self) -> String {
        let last = self
            .edges
            .iter()
            .filter_map(|e| e.last_change())
            .max()
            .map_or(0, |at| unix_ns(self.wall(at)));
        let mut out = format!("{last} ");
        for (i, e) in self.edges.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{:x}", e.db().digest);
        }
        out
    }

    fn dump(&self, i: usize) -> anyhow::Result<String> {
        let e = i
            .checked_sub(self.first)
            .and_then(|k| self.edges.get(k))
            .ok_or_else(|| anyhow::anyhow!("edge-{i} is not run by this process"))?;
        let mut out = String::new();
        for (key, h) in &e.db().objects {
            let _ = write!(out, "{key}|{:x}|{:x}|{:x};", h.uid, h.rv, h.content);
        }
        Ok(out)
    }

    async fn command(self: &Arc<Self>, line: &str) -> anyhow::Result<String> {
        let mut words = line.split_whitespace();
        let c = &self.counters;
        match (words.next().unwrap_or_default(), words.next()) {
            ("connect", _) => self.connect().await,
            ("redial", _) => self.redial().await,
            ("drop", _) => {
                self.drop_all();
                Ok(String::new())
            }
            ("stats", _) => Ok(format!(
                "{} {} {} {} {}",
                c.pods_received.load(Ordering::Relaxed),
                c.downstream.load(Ordering::Relaxed),
                c.upstream.load(Ordering::Relaxed),
                c.dial_failures.load(Ordering::Relaxed),
                c.reconnects.load(Ordering::Relaxed)
            )),
            ("tally", on) => {
                let on = on == Some("on");
                if on && let Ok(mut k) = c.by_kind.lock() {
                    k.clear();
                }
                c.tally.store(on, Ordering::Relaxed);
                Ok(String::new())
            }
            ("kinds", _) => Ok(c
                .by_kind
                .lock()
                .map(|k| k.iter().map(|(k, v)| format!("{k}={v};")).collect())
                .unwrap_or_default()),
            ("receipts", _) => Ok(self
                .receipts
                .lock()
                .map(|r| {
                    r.iter()
                        .map(|(k, at)| format!("{k}={};", unix_ns(*at)))
                        .collect()
                })
                .unwrap_or_default()),
            ("digests", _) => Ok(self.digests()),
            ("dump", Some(i)) => self.dump(i.parse()?),
            (other, _) => anyhow::bail!("unknown command {other:?}"),
        }
    }
}

/// What `dump` answered, as objects.
pub fn parse_dump(text: &str) -> anyhow::Result<edge::Objects> {
    let mut out = edge::Objects::new();
    for entry in text.split(';').filter(|e| !e.is_empty()) {
        let mut f = entry.split('|');
        let (Some(key), Some(uid), Some(rv), Some(content)) =
            (f.next(), f.next(), f.next(), f.next())
        else {
            anyhow::bail!("malformed dump entry {entry:?}");
        };
        let held = Held {
            uid: u128::from_str_radix(uid, 16)?,
            rv: u64::from_str_radix(rv, 16)?,
            content: u64::from_str_radix(content, 16)?,
        };
        out.insert(key.into(), held);
    }
    Ok(out)
}

pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    let read = |name: &str| std::fs::read_to_string(args.ca_dir.join(name));
    let ca = CertificateAuthority::from_pem(&read("rootCA.crt")?, &read("rootCA.key")?)?;
    let server = ca.issue_server(&["127.0.0.1"], 1)?;
    let pki = Pki { ca, server };
    let epoch = Instant::now();
    let epoch_wall = SystemTime::now();
    let mut edges = Vec::with_capacity(args.count);
    let mut tls = Vec::with_capacity(args.count);
    for i in args.first..args.first + args.count {
        let e = EdgeState::new(format!("edge-{i}"), epoch);
        tls.push(pki.edge_tls(&pki.node_cert(&e.node)?)?);
        edges.push(e);
    }
    let sim = Arc::new(Sim {
        first: args.first,
        addr: args.addr,
        handshakes: args.handshakes,
        edges,
        tls,
        counters: Arc::new(Counters::default()),
        receipts: Arc::new(Mutex::new(HashMap::new())),
        stop: Mutex::new(CancellationToken::new()),
        epoch,
        epoch_wall,
    });
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut out = tokio::io::stdout();
        while let Some(line) = rx.recv().await {
            if out.write_all(line.as_bytes()).await.is_err() || out.flush().await.is_err() {
                return;
            }
        }
    });
    tx.send("ready\n".to_string())?;
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let (id, cmd) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        let (id, cmd, sim, tx) = (id.to_string(), cmd.to_string(), sim.clone(), tx.clone());
        tokio::spawn(async move {
            let answer = match sim.command(&cmd).await {
                Ok(a) => format!("{id} ok {a}\n"),
                Err(e) => format!("{id} err {}\n", e.to_string().replace('\n', " ")),
            };
            let _ = tx.send(answer);
        });
    }
    // The coordinator closed stdin: it is done (or gone).
    sim.drop_all();
    drop(tx);
    tokio::time::sleep(Duration::from_millis(200)).await;
    writer.abort();
    Ok(())
}
