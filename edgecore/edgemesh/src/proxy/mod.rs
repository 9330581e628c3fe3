//! ClusterIP traffic: kernel rules for every backend this node can reach directly (no process
//! in the data path), and the userspace [`relay`] for backends on nodes it cannot route to.
//!
//! [`run_rule_sync`] applies a new plan whenever the view changes — at most every
//! `min_interval`, and only when the planned text differs — retrying with back-off on
//! failure. Rules stay in place when edgecore stops (traffic keeps flowing across a restart,
//! as with kube-proxy); `edgecore reset` removes them.

pub mod iptables;
pub mod relay;
pub mod rules;

#[cfg(test)]
mod kernel_tests;

use crate::catalog::Snapshot;
use iptables::Iptables;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use rules::RuleSettings;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The `result` label of a rule update.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum SyncResult {
    Applied,
    Failed,
}

impl SyncResult {
    pub fn label(self) -> &'static str {
        match self {
            SyncResult::Applied => "applied",
            SyncResult::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SyncLabel {
    pub result: &'static str,
}

#[derive(Clone)]
pub struct RuleMetrics {
    pub syncs: Family<SyncLabel, Counter>,
    pub duration: Histogram,
    pub rules: Gauge,
}

impl Default for RuleMetrics {
    fn default() -> Self {
        RuleMetrics {
            syncs: Family::default(),
            duration: Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
            rules: Gauge::default(),
        }
    }
}

impl RuleMetrics {
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "edgemesh_rule_syncs",
            "ClusterIP rule updates applied or failed",
            self.syncs.clone(),
        );
        r.register(
            "edgemesh_rule_sync_duration_seconds",
            "Time to apply one ClusterIP rule update",
            self.duration.clone(),
        );
        r.register(
            "edgemesh_rules",
            "iptables rules of Services at the edge",
            self.rules.clone(),
        );
    }
}

fn text_digest(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// Plans larger than this give their memory back to the system once applied.
const TRIM_AFTER_BYTES: usize = 256 * 1024;

/// Returns freed heap to the system (glibc keeps it otherwise, and the RSS would stay at the
/// peak of the largest plan).
pub(crate) fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// First and longest wait before a failed update is tried again.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Keeps the kernel's rules equal to the plan of the newest snapshot until `cancel`.
pub async fn run_rule_sync(
    ipt: Iptables,
    settings: RuleSettings,
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    min_interval: Duration,
    metrics: RuleMetrics,
    cancel: CancellationToken,
) {
    let ipt = Arc::new(ipt);
    // A digest of the applied text, not the text: at 10,000 endpoints it is megabytes.
    let mut applied: Option<u64> = None;
    // The chains of the last plan applied (the text is not kept).
    let mut previous: Option<Arc<rules::Plan>> = None;
    let mut hooked = false;
    let mut retry = RETRY_FIRST;
    let mut last = Instant::now() - min_interval;
    loop {
        let snap = snapshots.borrow_and_update().clone();
        let plan = Arc::new(rules::plan(&snap, &settings));
        let digest = text_digest(&plan.text);
        if applied != Some(digest) {
            let wait = min_interval.saturating_sub(last.elapsed());
            if !wait.is_zero() {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                if snapshots.has_changed().unwrap_or(false) {
                    continue;
                }
            }
            let started = Instant::now();
            last = started;
            let (i, p, need_hooks, prev) = (ipt.clone(), plan.clone(), !hooked, previous.take());
            let result = tokio::task::spawn_blocking(move || {
                if need_hooks {
                    i.ensure_hooks()?;
                }
                i.apply(&p, prev.as_deref())
            })
            .await;
            match result {
                Ok(Ok(())) => {
                    hooked = true;
                    retry = RETRY_FIRST;
                    metrics.duration.observe(started.elapsed().as_secs_f64());
                    metrics
                        .syncs
                        .get_or_create(&SyncLabel {
                            result: SyncResult::Applied.label(),
                        })
                        .inc();
                    metrics.rules.set(plan.rules as i64);
                    tracing::debug!(rules = plan.rules, took = ?started.elapsed(), generation = snap.generation, "ClusterIP rules applied");
                    applied = Some(digest);
                    let large = plan.text.len() > TRIM_AFTER_BYTES;
                    previous = Some(Arc::new(rules::Plan {
                        text: String::new(),
                        nat_chains: plan.nat_chains.clone(),
                        filter_chains: plan.filter_chains.clone(),
                        rules: plan.rules,
                    }));
                    drop(plan);
                    if large {
                        release_freed_memory();
                    }
                }
                Ok(Err(e)) => {
                    metrics
                        .syncs
                        .get_or_create(&SyncLabel {
                            result: SyncResult::Failed.label(),
                        })
                        .inc();
                    tracing::warn!(error = %e, retry_in = ?retry, "ClusterIP rules not applied; retrying");
                    hooked = false;
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(retry) => {}
                    }
                    retry = (retry * 2).min(RETRY_MAX);
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = %e, "ClusterIP rule task failed");
                    return;
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            c = snapshots.changed() => if c.is_err() { return },
        }
    }
}
