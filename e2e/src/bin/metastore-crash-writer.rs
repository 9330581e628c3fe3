//! Helper of the kill -9 test (`e2e/tests/e2e/metamanager.rs`): writes pods into the edge
//! database through `MetaStore` as fast as it can, 16 writes in flight, and prints
//! `acked <slot> <rv>` once each write is durable, until it is killed.
//!
//! Write `j` (counting from `<first-rv>`) stores pod slot `j % 500` with resourceVersion `j`,
//! so after the first 500 writes every write replaces an earlier one. Each value carries a
//! padding whose length it also records, so a torn value is detectable.
//!
//! Usage: `metastore-crash-writer <db-path> <first-rv>`

use anyhow::Context;
use edgecore::metamanager::{MetaRecord, MetaStore};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;

const SLOTS: u64 = 500;
const WRITERS: usize = 16;

fn record(j: u64) -> MetaRecord {
    let slot = j % SLOTS;
    let name = format!("p{slot}");
    let len = 500 + (j * 37 % 4000) as usize;
    let value = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{slot}"),
                     "resourceVersion": j.to_string()},
        "spec": {"padding": "x".repeat(len), "paddingLength": len},
    });
    MetaRecord::new(format!("default/pod/{name}"), "pod", value.to_string())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!(
            "{}",
            e2e::bench::doc_of(include_str!("metastore-crash-writer.rs"))
        );
        return Ok(());
    }
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .context("usage: metastore-crash-writer <db-path> <first-rv>")?;
    let first: u64 = args
        .next()
        .context("usage: metastore-crash-writer <db-path> <first-rv>")?
        .parse()
        .context("<first-rv> must be a number")?;
    let store = MetaStore::open(&path).await?;
    let next = Arc::new(AtomicU64::new(first));
    let (tx, mut rx) = mpsc::channel::<(u64, u64)>(1024);
    for _ in 0..WRITERS {
        let (store, next, tx) = (store.clone(), next.clone(), tx.clone());
        tokio::spawn(async move {
            loop {
                let j = next.fetch_add(1, Ordering::Relaxed);
                if store.upsert_object(record(j)).await.is_err() {
                    return;
                }
                if tx.send((j % SLOTS, j)).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    let mut out = std::io::stdout().lock();
    while let Some((slot, rv)) = rx.recv().await {
        writeln!(out, "acked {slot} {rv}")?;
        out.flush()?;
    }
    Ok(())
}
