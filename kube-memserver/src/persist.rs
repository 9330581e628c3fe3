//! Optional persistence for the standalone server (`--data-dir`): a JSON snapshot of every
//! object plus the resourceVersion counter, written atomically, loaded at start.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::state::State;

const SNAPSHOT: &str = "state.json";

pub fn save(st: &State, dir: &Path) -> anyhow::Result<()> {
    let mut tables = Map::new();
    for t in st.store.tables() {
        let (g, r) = t.group_resource();
        let items: Vec<Value> = t.all().iter().map(|o| o.value()).collect();
        if !items.is_empty() {
            tables.insert(format!("{g}/{r}"), Value::Array(items));
        }
    }
    let doc = json!({"resourceVersion": st.store.current_rv(), "tables": tables});
    let tmp = dir.join(format!("{SNAPSHOT}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec(&doc)?).context("writing snapshot")?;
    std::fs::rename(&tmp, dir.join(SNAPSHOT)).context("replacing snapshot")?;
    Ok(())
}

/// Loads a snapshot if present. CRDs are re-established so their resources are served.
pub fn load(st: &State, dir: &Path) -> anyhow::Result<bool> {
    let path = dir.join(SNAPSHOT);
    if !path.exists() {
        return Ok(false);
    }
    let doc: Value = serde_json::from_slice(&std::fs::read(&path)?).context("parsing snapshot")?;
    let rv = doc["resourceVersion"].as_u64().unwrap_or(1);
    st.store.advance_rv_to(rv);
    for (key, items) in doc["tables"].as_object().into_iter().flatten() {
        let (group, resource) = key.split_once('/').unwrap_or(("", key));
        let table = st.store.table(group, resource);
        for item in items.as_array().into_iter().flatten() {
            table
                .restore(item.clone())
                .map_err(|e| anyhow::anyhow!("restoring {key}: {e}"))?;
        }
    }
    let crds = st
        .store
        .table("apiextensions.k8s.io", "customresourcedefinitions");
    for crd in crds.all() {
        super::verbs::establish_crd(st, &crd.value());
    }
    Ok(true)
}

/// Saves whenever the resourceVersion moved, every `period`, and once more at shutdown.
pub async fn run(
    st: Arc<State>,
    dir: std::path::PathBuf,
    period: Duration,
    cancel: CancellationToken,
) {
    let mut saved = st.store.current_rv();
    let mut tick = tokio::time::interval(period.max(Duration::from_millis(10)));
    loop {
        let stop = tokio::select! {
            _ = cancel.cancelled() => true,
            _ = tick.tick() => false,
        };
        let rv = st.store.current_rv();
        if rv != saved || stop {
            match save(&st, &dir) {
                Ok(()) => saved = rv,
                Err(e) => tracing::warn!(error = %e, "saving snapshot"),
            }
        }
        if stop {
            return;
        }
    }
}
