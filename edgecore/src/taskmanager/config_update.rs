//! ConfigUpdateJob at the edge: typed edits of `edgecore.yaml`. Each `updateFields` key is a
//! dotted path that must name a single setting of edgecore's configuration (checked against
//! the full default configuration), its value must parse as that setting's type, and the
//! result must load and validate as edgecore loads its file — or nothing changes. Nothing is
//! run as a command: KubeEdge v1.23.0 pasted these fields into a shell (CVE-2026-62182).
//!
//! Applying one: the file is copied aside and a marker written next to it, the new file put in
//! place atomically, and edgecore restarted (re-executed by its binary). The restarted edgecore
//! reports `Update` once it reaches the cloud; if it does not within the job's roll-back time,
//! it restores the copy, restarts again and reports `RollBack`.

use crate::config::EdgeCoreConfig;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Longest key and value accepted.
const MAX_KEY: usize = 256;
const MAX_VALUE: usize = 1024;

/// The new file text with `fields` set in `text` (an `edgecore.yaml`), or why not.
pub fn apply_fields(text: &str, fields: &BTreeMap<String, String>) -> Result<String, String> {
    if fields.is_empty() {
        return Err("updateFields is empty".into());
    }
    let mut file: Value = serde_saphyr::from_str(text)
        .map_err(|e| format!("the current edgecore.yaml does not parse: {e}"))?;
    if !file.is_object() {
        return Err("the current edgecore.yaml is not a mapping".into());
    }
    let schema = serde_json::to_value(EdgeCoreConfig::default_config())
        .map_err(|e| format!("default configuration: {e}"))?;
    for (key, raw) in fields {
        let path = key_path(key)?;
        let mut slot = &schema;
        for seg in &path {
            slot = slot
                .get(*seg)
                .ok_or_else(|| format!("{key}: not a setting of edgecore.yaml"))?;
        }
        let value = typed(key, slot, raw)?;
        set(&mut file, &path, value);
    }
    let out = serde_saphyr::to_string(&file).map_err(|e| format!("cannot write YAML: {e}"))?;
    let config = EdgeCoreConfig::from_yaml(&out, "edgecore.yaml").map_err(|e| e.to_string())?;
    config.validate().map_err(|e| e.to_string())?;
    Ok(out)
}

/// `a.b.c` → `["a", "b", "c"]`: ASCII letters and digits between single dots.
fn key_path(key: &str) -> Result<Vec<&str>, String> {
    let ok = !key.is_empty()
        && key.len() <= MAX_KEY
        && key
            .split('.')
            .all(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    if !ok {
        return Err(format!(
            "{key:?}: a key is a dotted path of letters and digits (e.g. modules.edged.tailoredKubeletConfig.maxPods)"
        ));
    }
    Ok(key.split('.').collect())
}

/// `raw` as the type of the default value `like`.
fn typed(key: &str, like: &Value, raw: &str) -> Result<Value, String> {
    if raw.len() > MAX_VALUE || raw.chars().any(char::is_control) {
        return Err(format!(
            "{key}: the value is too long or holds control characters"
        ));
    }
    match like {
        Value::Bool(_) => match raw {
            "true" => Ok(Value::Bool(true)),
            "false" => Ok(Value::Bool(false)),
            _ => Err(format!("{key}: expected true or false, got {raw:?}")),
        },
        Value::Number(n) => {
            if n.is_f64() {
                raw.parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number)
                    .ok_or_else(|| format!("{key}: expected a number, got {raw:?}"))
            } else {
                raw.parse::<i64>()
                    .map(Value::from)
                    .map_err(|_| format!("{key}: expected an integer, got {raw:?}"))
            }
        }
        Value::String(_) => Ok(Value::String(raw.to_string())),
        // Settings absent by default (optional values) take text.
        Value::Null => Ok(Value::String(raw.to_string())),
        Value::Array(_) | Value::Object(_) => Err(format!(
            "{key}: not a single value (lists and sections are not set by a ConfigUpdateJob)"
        )),
    }
}

fn set(root: &mut Value, path: &[&str], value: Value) {
    let mut cur = root;
    for seg in &path[..path.len() - 1] {
        if !cur.get(*seg).is_some_and(Value::is_object) {
            cur[*seg] = Value::Object(Default::default());
        }
        cur = &mut cur[*seg];
    }
    cur[path[path.len() - 1]] = value;
}

/// What is in progress, kept next to the config file across the restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    /// The task's resource (where reports go).
    pub resource: String,
    /// `updating` (the new file is in place) or `rolledBack` (the copy is back).
    pub phase: String,
    /// Unix seconds when the new file was put in place.
    pub started: u64,
    /// Seconds the new configuration has to reach the cloud.
    pub rollback_after: u64,
    /// Why it was rolled back.
    #[serde(default)]
    pub reason: String,
}

pub fn marker_path(config: &Path) -> PathBuf {
    config.with_extension("yaml.update.json")
}

pub fn backup_path(config: &Path) -> PathBuf {
    config.with_extension("yaml.bak")
}

pub fn read_marker(config: &Path) -> Option<Marker> {
    let text = std::fs::read_to_string(marker_path(config)).ok()?;
    serde_json::from_str(&text).ok()
}

pub fn write_marker(config: &Path, m: &Marker) -> std::io::Result<()> {
    write_atomic(
        &marker_path(config),
        serde_json::to_string(m).unwrap_or_default().as_bytes(),
    )
}

/// Writes `path` through a temporary file and a rename (a crash leaves old or new, whole).
pub fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp-update");
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path)
}

/// Puts the copy back and removes it.
pub fn restore(config: &Path) -> std::io::Result<()> {
    let data = std::fs::read(backup_path(config))?;
    write_atomic(config, &data)
}

/// edgecore could not start with a configuration an update put in place: the copy goes back
/// (the marker says so, for the `RollBack` report of the next start). `true` when it did.
pub fn roll_back_after_failed_start(config: &Path) -> bool {
    let Some(mut m) = read_marker(config) else {
        return false;
    };
    if m.phase != "updating" || restore(config).is_err() {
        return false;
    }
    m.phase = "rolledBack".into();
    m.reason = "edgecore could not start with the updated configuration; the previous configuration is back".into();
    write_marker(config, &m).is_ok()
}

/// Removes the marker and the copy (the update is over).
pub fn finish(config: &Path) {
    let _ = std::fs::remove_file(marker_path(config));
    let _ = std::fs::remove_file(backup_path(config));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const FILE: &str = "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\nmodules:\n  edgeHub:\n    heartbeat: 15\n";

    #[test]
    fn typed_settings_are_set_and_the_result_validates() {
        let out = apply_fields(
            FILE,
            &fields(&[
                ("modules.edged.tailoredKubeletConfig.maxPods", "50"),
                ("modules.edgeHub.heartbeat", "20"),
                ("modules.serviceBus.enable", "true"),
            ]),
        )
        .unwrap();
        let c = EdgeCoreConfig::from_yaml(&out, "t").unwrap();
        assert_eq!(c.modules.edged.tailored_kubelet_config.max_pods, 50);
        assert_eq!(c.modules.edge_hub.heartbeat, 20);
        assert!(c.modules.service_bus.enable);
    }

    #[test]
    fn unknown_keys_wrong_types_and_shell_payloads_change_nothing() {
        for (k, v, why) in [
            ("modules.edged.noSuchKey", "1", "not a setting"),
            (
                "modules.edgeHub.heartbeat",
                "20; rm -rf /",
                "expected an integer",
            ),
            ("modules.serviceBus.enable", "yes", "true or false"),
            ("modules.edged", "x", "not a single value"),
            ("modules.edgeHub.heartbeat,modules.x", "1", "dotted path"),
            ("$(id)", "1", "dotted path"),
            ("modules..edged", "1", "dotted path"),
            (
                "modules.edgeHub.websocket.server",
                "a\nb",
                "control characters",
            ),
            ("modules.edgeHub.heartbeat", "0", "must be"),
        ] {
            let e = apply_fields(FILE, &fields(&[(k, v)])).unwrap_err();
            assert!(e.contains(why), "{k}={v:?}: {e}");
        }
        assert!(apply_fields(FILE, &BTreeMap::new()).is_err());
        assert!(apply_fields("- not a mapping", &fields(&[("kind", "x")])).is_err());
    }

    #[test]
    fn markers_and_copies_live_next_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("edgecore.yaml");
        std::fs::write(&config, FILE).unwrap();
        std::fs::copy(&config, backup_path(&config)).unwrap();
        let m = Marker {
            resource: "r".into(),
            phase: "updating".into(),
            started: 1,
            rollback_after: 30,
            reason: String::new(),
        };
        write_marker(&config, &m).unwrap();
        assert_eq!(read_marker(&config), Some(m));
        write_atomic(&config, b"changed").unwrap();
        restore(&config).unwrap();
        assert_eq!(std::fs::read_to_string(&config).unwrap(), FILE);
        finish(&config);
        assert!(read_marker(&config).is_none());
        assert!(!backup_path(&config).exists());
    }
}
