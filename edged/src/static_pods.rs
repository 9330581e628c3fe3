//! Static pods: pod manifests in `staticPodPath` run on this node whatever the cloud says —
//! also while it is unreachable and after an offline reboot — as the kubelet's file source
//! runs them. Each file holds one pod (YAML or JSON); it becomes a pod named
//! `<name>-<node>` whose UID is a hash of the node, the file and its content (a changed file
//! is a new pod: the old one is stopped, the new one started). While connected, each static
//! pod has a **mirror pod** in the cluster (annotation `kubernetes.io/config.mirror` = the
//! hash; created again when someone deletes it, deleted with the file) carrying its status.
//! Mirror pods the cloud sends back are never run.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const ANNOTATION_SOURCE: &str = "kubernetes.io/config.source";
pub const ANNOTATION_HASH: &str = "kubernetes.io/config.hash";
pub const ANNOTATION_MIRROR: &str = "kubernetes.io/config.mirror";
pub const ANNOTATION_SEEN: &str = "kubernetes.io/config.seen";
/// The kubelet's source name for manifests read from a directory.
pub const SOURCE_FILE: &str = "file";
/// Manifests larger than this are refused.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// The static pods this node runs now, by manifest path, and what was last said about
/// manifests that cannot run (so that a bad file is logged once per change).
#[derive(Default)]
pub(super) struct StaticPods {
    pub(super) by_path: BTreeMap<PathBuf, Value>,
    pub(super) refused: BTreeMap<PathBuf, String>,
}

impl super::Dispatcher {
    /// Reads `staticPodPath` and starts, replaces or stops static pods to match it.
    pub(super) fn scan_static(&mut self) {
        let Some(dir) = self.shared.config.static_pod_path.clone() else {
            return;
        };
        let node = self.shared.config.node_name.clone();
        let found = scan(&dir, &node);
        let mut now = BTreeMap::new();
        for (path, result) in found {
            match result {
                Ok(pod) => {
                    self.statics.refused.remove(&path);
                    now.insert(path, pod);
                }
                Err(why) => {
                    if self.statics.refused.get(&path) != Some(&why) {
                        tracing::warn!(manifest = %path.display(), error = %why, "static pod manifest not run");
                        self.statics.refused.insert(path, why);
                    }
                }
            }
        }
        self.statics.refused.retain(|p, _| p.exists());
        let old = std::mem::take(&mut self.statics.by_path);
        for (path, pod) in &old {
            let same = now
                .get(path)
                .is_some_and(|p| p["metadata"]["uid"] == pod["metadata"]["uid"]);
            if !same && let Some(uid) = pod["metadata"]["uid"].as_str() {
                tracing::info!(manifest = %path.display(), pod = %pod["metadata"]["name"], "static pod manifest changed or removed; stopping its pod");
                self.stop_static(uid);
            }
        }
        for (path, pod) in &now {
            let known = old
                .get(path)
                .is_some_and(|p| p["metadata"]["uid"] == pod["metadata"]["uid"]);
            if !known {
                tracing::info!(manifest = %path.display(), pod = %pod["metadata"]["name"], "static pod found");
                self.upsert(pod.clone());
            }
        }
        self.statics.by_path = now;
    }

    fn stop_static(&mut self, uid: &str) {
        if let Some(w) = self.workers.get(uid) {
            w.intent.send_modify(|i| i.deleted = true);
        }
    }

    /// Keeps a mirror pod in the cluster for each static pod (on its own task; failures,
    /// e.g. offline, are retried at the next check).
    pub(super) fn sync_mirrors(&mut self) {
        if self.shared.config.static_pod_path.is_none()
            || self.mirrors.as_ref().is_some_and(|m| !m.is_finished())
        {
            return;
        }
        let statics: Vec<Value> = self.statics.by_path.values().cloned().collect();
        let shared = self.shared.clone();
        self.mirrors = Some(tokio::spawn(async move {
            match sync_mirror_pods(&shared, &statics).await {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(mirror_pods = n, "mirror pods created or replaced");
                    // Their status is sent again now that there is a pod to carry it.
                    shared.resync.send_modify(|v| *v += 1);
                }
                Err(e) => tracing::debug!(error = %e, "mirror pods not synced; retrying later"),
            }
        }));
    }
}

/// Creates missing mirror pods, replaces those of another hash, deletes those of static
/// pods that are gone. Returns how many were created.
async fn sync_mirror_pods(
    shared: &super::pod_worker::Shared,
    statics: &[Value],
) -> Result<usize, crate::meta::MetaError> {
    let node = shared.config.node_name.as_str();
    let stored = shared.meta.list_pods().await?;
    let mirrors: BTreeMap<(String, String), &Value> = stored
        .iter()
        .filter(|p| p["spec"]["nodeName"].as_str() == Some(node) && is_mirror(p))
        .filter_map(|p| {
            let m = &p["metadata"];
            Some((
                (
                    m["namespace"].as_str()?.to_string(),
                    m["name"].as_str()?.to_string(),
                ),
                p,
            ))
        })
        .collect();
    let mut created = 0;
    let mut wanted = std::collections::BTreeSet::new();
    for pod in statics {
        let m = &pod["metadata"];
        let (Some(ns), Some(name)) = (m["namespace"].as_str(), m["name"].as_str()) else {
            continue;
        };
        let hash = m["annotations"][ANNOTATION_HASH]
            .as_str()
            .unwrap_or_default();
        wanted.insert((ns.to_string(), name.to_string()));
        match mirrors.get(&(ns.to_string(), name.to_string())) {
            Some(existing)
                if mirror_hash(existing) == Some(hash)
                    && existing.pointer("/metadata/deletionTimestamp").is_none() =>
            {
                continue;
            }
            // Of another hash, or being deleted (someone deleted the mirror): it goes at
            // once (nothing of it runs here) and comes back.
            Some(_) => {
                shared
                    .meta
                    .delete_pod(ns, name, json!({"gracePeriodSeconds": 0}))
                    .await?;
            }
            None => {}
        }
        match shared.meta.create_mirror_pod(mirror_of(pod)).await {
            Ok(_) => created += 1,
            // Created meanwhile (or the cloud has it and the edge not yet): next check.
            Err(crate::meta::MetaError::Api(e)) if e.err_status.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    for (ns, name) in mirrors.keys() {
        if !wanted.contains(&(ns.clone(), name.clone())) {
            shared
                .meta
                .delete_pod(ns, name, json!({"gracePeriodSeconds": 0}))
                .await?;
        }
    }
    Ok(created)
}

/// A mirror pod (the cluster's reflection of a static pod): never run by edged.
pub fn is_mirror(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations")
        .and_then(|a| a.get(ANNOTATION_MIRROR))
        .is_some()
}

/// A static pod edged read from a file.
pub fn is_static(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations")
        .and_then(|a| a.get(ANNOTATION_SOURCE))
        .and_then(Value::as_str)
        == Some(SOURCE_FILE)
}

/// The static pod a manifest describes, for `node`.
pub fn from_manifest(path: &Path, bytes: &[u8], node: &str) -> Result<Value, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_string())?;
    let mut pod: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| format!("not a pod (JSON): {e}"))?
    } else {
        serde_saphyr::from_str(text).map_err(|e| format!("not a pod (YAML): {e}"))?
    };
    if pod.get("kind").and_then(Value::as_str).unwrap_or("Pod") != "Pod" {
        return Err(format!(
            "kind {:?}: only Pod manifests run as static pods",
            pod["kind"]
        ));
    }
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or("metadata.name is missing")?
        .to_string();
    let full = format!("{name}-{node}");
    if !crate::spec::is_path_element(&full) || full.len() > 253 {
        return Err(format!("the pod name {full:?} is not a valid pod name"));
    }
    let ns = pod
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or("default")
        .to_string();
    if !crate::spec::is_path_element(&ns) {
        return Err(format!("the namespace {ns:?} is not a valid name"));
    }
    if !pod["spec"].is_object() {
        return Err("spec is missing".into());
    }
    let mut h = Sha256::new();
    for part in [node.as_bytes(), path.to_string_lossy().as_bytes(), bytes] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    let d = h.finalize();
    let hex: String = d.iter().take(16).map(|b| format!("{b:02x}")).collect();
    let uid = format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    pod["apiVersion"] = json!("v1");
    pod["kind"] = json!("Pod");
    let meta = pod["metadata"]
        .as_object_mut()
        .ok_or("metadata is not an object")?;
    meta.insert("name".into(), json!(full));
    meta.insert("namespace".into(), json!(ns));
    meta.insert("uid".into(), json!(uid));
    meta.remove("resourceVersion");
    let annotations = meta
        .entry("annotations")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or("metadata.annotations is not an object")?;
    annotations.insert(ANNOTATION_SOURCE.into(), json!(SOURCE_FILE));
    annotations.insert(ANNOTATION_HASH.into(), json!(hex));
    annotations.insert(ANNOTATION_SEEN.into(), json!(kubeedge_shared::clock::now()));
    annotations.remove(ANNOTATION_MIRROR);
    pod["spec"]["nodeName"] = json!(node);
    if let Some(o) = pod.as_object_mut() {
        o.remove("status");
    }
    Ok(pod)
}

/// The manifests in `dir` (hidden files skipped), by path; unreadable or invalid ones as
/// errors (logged by the caller, once per change).
pub fn scan(dir: &Path, node: &str) -> BTreeMap<PathBuf, Result<Value, String>> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        let hidden = e.file_name().to_string_lossy().starts_with('.');
        let is_file = e.file_type().is_ok_and(|t| t.is_file());
        if hidden || !is_file {
            continue;
        }
        let read = match e.metadata() {
            Ok(m) if m.len() > MAX_MANIFEST_BYTES => {
                Err(format!("larger than {MAX_MANIFEST_BYTES} bytes"))
            }
            Ok(_) => std::fs::read(&path).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        out.insert(
            path.clone(),
            read.and_then(|b| from_manifest(&path, &b, node)),
        );
    }
    out
}

/// The mirror pod of a static pod: the same pod, its hash as `kubernetes.io/config.mirror`,
/// no UID (the API server assigns one).
pub fn mirror_of(static_pod: &Value) -> Value {
    let mut m = static_pod.clone();
    if let Some(meta) = m["metadata"].as_object_mut() {
        meta.remove("uid");
        let hash = meta
            .get("annotations")
            .and_then(|a| a.get(ANNOTATION_HASH))
            .cloned()
            .unwrap_or(Value::Null);
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.insert(ANNOTATION_MIRROR.into(), hash);
        }
    }
    m
}

/// The hash a mirror pod names (its `kubernetes.io/config.mirror`).
pub fn mirror_hash(pod: &Value) -> Option<&str> {
    pod.pointer("/metadata/annotations")?
        .get(ANNOTATION_MIRROR)?
        .as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: {app: web}\nspec:\n  containers:\n  - name: c\n    image: busybox\n";

    #[test]
    fn a_manifest_becomes_a_pod_of_this_node_with_a_content_hash_uid() {
        let p = from_manifest(Path::new("/m/web.yaml"), YAML.as_bytes(), "edge-1").unwrap();
        assert_eq!(p["metadata"]["name"], "web-edge-1");
        assert_eq!(p["metadata"]["namespace"], "default");
        assert_eq!(p["spec"]["nodeName"], "edge-1");
        assert!(is_static(&p) && !is_mirror(&p));
        let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
        assert_eq!(uid.len(), 36);
        // Same file, same pod; changed content or another node, another pod.
        let again = from_manifest(Path::new("/m/web.yaml"), YAML.as_bytes(), "edge-1").unwrap();
        assert_eq!(again["metadata"]["uid"], uid.as_str());
        let changed = YAML.replace("busybox", "busybox:1");
        let other = from_manifest(Path::new("/m/web.yaml"), changed.as_bytes(), "edge-1").unwrap();
        assert_ne!(other["metadata"]["uid"], uid.as_str());
        let elsewhere = from_manifest(Path::new("/m/web.yaml"), YAML.as_bytes(), "edge-2").unwrap();
        assert_ne!(elsewhere["metadata"]["uid"], uid.as_str());
        // The mirror: same name, no UID, the hash as config.mirror.
        let m = mirror_of(&p);
        assert!(m["metadata"].get("uid").is_none());
        assert!(is_mirror(&m));
        assert_eq!(
            mirror_hash(&m),
            p["metadata"]["annotations"][ANNOTATION_HASH].as_str()
        );
    }

    #[test]
    fn json_manifests_and_namespaces_are_read_and_bad_ones_say_why() {
        let json = r#"{"kind":"Pod","metadata":{"name":"db","namespace":"data"},"spec":{"containers":[]}}"#;
        let p = from_manifest(Path::new("/m/db.json"), json.as_bytes(), "n").unwrap();
        assert_eq!(p["metadata"]["namespace"], "data");
        for (bad, why) in [
            (
                "kind: Deployment\nmetadata: {name: x}\nspec: {}\n",
                "only Pod",
            ),
            ("kind: Pod\nspec: {}\n", "metadata.name"),
            ("kind: Pod\nmetadata: {name: x}\n", "spec"),
            (
                "kind: Pod\nmetadata: {name: ../x}\nspec: {}\n",
                "valid pod name",
            ),
            (": : :", "not a pod"),
        ] {
            let e = from_manifest(Path::new("/m/x"), bad.as_bytes(), "n").unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!(from_manifest(Path::new("/m/x"), &[0xff, 0xfe], "n").is_err());
    }

    #[test]
    fn a_directory_scan_skips_hidden_files_and_reports_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("web.yaml"), YAML).unwrap();
        std::fs::write(dir.path().join(".web.yaml.swp"), "junk").unwrap();
        std::fs::write(dir.path().join("bad.yaml"), "kind: Pod\n").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let found = scan(dir.path(), "edge-1");
        assert_eq!(found.len(), 2);
        assert!(found[&dir.path().join("web.yaml")].is_ok());
        assert!(found[&dir.path().join("bad.yaml")].is_err());
        assert!(scan(&dir.path().join("missing"), "edge-1").is_empty());
    }
}
