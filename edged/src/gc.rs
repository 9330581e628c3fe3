//! Garbage collection of what no known pod owns: sandboxes and containers carrying the
//! kubelet's pod labels whose pod is not on this node any more (e.g. deleted while edgecore
//! was down), and pod directories of such pods. Runtime objects without the kubelet's labels
//! are never touched, nor those another edge node created (see [`LABEL_NODE`]).

use super::pod_worker::Shared;
use crate::cri::runtime::{ANNOTATION_GRACE_PERIOD, LABEL_NODE, LABEL_POD_UID, RuntimeError};
use std::collections::HashMap;
use std::time::Duration;

/// What a collection removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Collected {
    pub containers: usize,
    pub sandboxes: usize,
    pub directories: usize,
    pub cgroups: usize,
}

/// The pod UID of a runtime object this node may collect: it carries the kubelet's UID
/// label, and either this node's label or none (created by a kubelet).
fn orphan_uid<'a>(
    labels: &'a HashMap<String, String>,
    node: &str,
    shared: &Shared,
) -> Option<&'a str> {
    let uid = labels.get(LABEL_POD_UID)?;
    if labels.get(LABEL_NODE).is_some_and(|n| n != node) {
        return None;
    }
    let known = shared
        .known_pods
        .lock()
        .map(|k| k.contains(uid.as_str()))
        .unwrap_or(true);
    (!known).then_some(uid.as_str())
}

pub async fn collect(shared: &Shared) -> Result<Collected, RuntimeError> {
    let node = &shared.config.node_name;
    let runtime = &shared.runtime;
    let mut done = Collected::default();
    for c in runtime.list_containers(HashMap::new()).await? {
        let Some(uid) = orphan_uid(&c.labels, node, shared) else {
            continue;
        };
        let grace = c
            .annotations
            .get(ANNOTATION_GRACE_PERIOD)
            .and_then(|g| g.parse::<u64>().ok())
            .unwrap_or(30)
            .min(30);
        tracing::info!(container = %c.id, pod_uid = uid, "removing a container no pod on this node owns");
        runtime
            .stop_container(&c.id, Duration::from_secs(grace))
            .await?;
        runtime.remove_container(&c.id).await?;
        done.containers += 1;
    }
    for s in runtime.list_sandboxes(HashMap::new()).await? {
        let Some(uid) = orphan_uid(&s.labels, node, shared) else {
            continue;
        };
        tracing::info!(sandbox = %s.id, pod_uid = uid, "removing a sandbox no pod on this node owns");
        runtime.stop_sandbox(&s.id).await?;
        runtime.remove_sandbox(&s.id).await?;
        done.sandboxes += 1;
    }
    // Pod cgroups of pods this node no longer has (empty ones: their containers are gone).
    let keep = shared.known_pods.lock().map(|k| k.clone());
    if let Ok(keep) = keep {
        done.cgroups = shared.cgroups.remove_unknown(&keep);
    }
    let pods_dir = shared.config.root_directory.join("pods");
    if let Ok(entries) = std::fs::read_dir(&pods_dir) {
        for e in entries.flatten() {
            let uid = e.file_name().to_string_lossy().into_owned();
            let known = shared
                .known_pods
                .lock()
                .map(|k| k.contains(&uid))
                .unwrap_or(true);
            if known {
                continue;
            }
            match super::volumes::remove_pod_dir(&shared.config.root_directory, &uid) {
                Ok(()) => done.directories += 1,
                Err(err) => {
                    tracing::warn!(pod_uid = %uid, error = %err, "removing an orphaned pod directory")
                }
            }
        }
    }
    Ok(done)
}
