//! The twin merge of an edge-side update (KubeEdge's "Rest" mode, devices reference §3.5):
//! MQTT `…/twin/update` and mapper reports. Validation covers the whole request before any
//! twin changes; each supplied value bumps the `edge` version; `null` deletes an optional
//! twin. The outcome says what to store, publish and report upstream.

use super::store::{DeviceRow, TwinRow};
use kubeedge_shared::devices::{
    DeviceTwinUpdate, MsgTwin, TwinValue, TwinVersion, TypeMetadata, ValueMetadata,
    valid_twin_name, valid_twin_value,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Why an update is refused: the MQTT `Result` code and reason.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub code: i64,
    pub reason: String,
}

fn bad(reason: impl Into<String>) -> Refused {
    Refused {
        code: 400,
        reason: reason.into(),
    }
}

/// What an accepted update changed.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Rows to write (name → row).
    pub rows: Vec<(String, TwinRow)>,
    /// The changed twins without versions (`…/twin/update/result`); `None` = deleted.
    pub result: BTreeMap<String, Option<MsgTwin>>,
    /// `{last, current}` per changed twin (`…/twin/update/document`).
    pub document: BTreeMap<String, Value>,
    /// The changed twins with versions, for the cloud (`edge_updated`).
    pub sync: BTreeMap<String, Option<MsgTwin>>,
}

fn type_ok(kind: &str, value: &str) -> bool {
    match kind {
        "" | "string" | "deleted" => true,
        "int" | "integer" => value.parse::<i64>().is_ok(),
        "float" => value.parse::<f64>().is_ok(),
        "boolean" => value == "true" || value == "false",
        _ => false,
    }
}

fn version(text: &Option<String>) -> TwinVersion {
    text.as_deref()
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default()
}

fn meta_timestamp(text: &Option<String>) -> Option<i64> {
    text.as_deref()
        .and_then(|t| serde_json::from_str::<Value>(t).ok())
        .and_then(|v| v.get("timestamp").and_then(Value::as_i64))
}

/// The message form of a stored twin; `with_versions` for the cloud.
pub fn msg_twin(row: &TwinRow, with_versions: bool) -> MsgTwin {
    let value = |v: &Option<String>, meta: &Option<String>| {
        v.as_ref().map(|v| TwinValue {
            value: Some(v.clone()),
            metadata: meta_timestamp(meta).map(|ts| ValueMetadata {
                timestamp: Some(ts),
            }),
        })
    };
    MsgTwin {
        expected: value(&row.expected, &row.expected_meta),
        actual: value(&row.actual, &row.actual_meta),
        optional: Some(row.optional),
        metadata: Some(TypeMetadata {
            kind: Some(if row.attr_type.is_empty() {
                "string".into()
            } else {
                row.attr_type.clone()
            }),
        }),
        expected_version: (with_versions && row.expected_version.is_some())
            .then(|| version(&row.expected_version)),
        actual_version: (with_versions && row.actual_version.is_some())
            .then(|| version(&row.actual_version)),
    }
}

/// Validates `update` against `device` and returns the changes; `device` is not modified
/// (the caller applies [`Outcome::rows`] once they are stored).
pub fn apply_rest(
    device: &DeviceRow,
    update: &DeviceTwinUpdate,
    now_ms: i64,
) -> Result<Outcome, Refused> {
    let Some(twins) = &update.twin else {
        return Err(bad("Update twin error, key:twin does not exist"));
    };
    for (name, twin) in twins {
        if !valid_twin_name(name) {
            return Err(bad(format!("the twin name {name:?} is not allowed")));
        }
        let Some(t) = twin else { continue };
        let local_type = device
            .twins
            .get(name)
            .map(|r| r.attr_type.as_str())
            .filter(|t| *t != "deleted");
        let kind = local_type
            .map(str::to_string)
            .or_else(|| t.metadata.as_ref().and_then(|m| m.kind.clone()))
            .unwrap_or_else(|| "string".into());
        for v in [&t.expected, &t.actual].into_iter().flatten() {
            let Some(text) = &v.value else {
                return Err(bad(format!("twin {name}: a value object without value")));
            };
            if !text.is_empty() && !valid_twin_value(text) {
                return Err(bad(format!(
                    "twin {name}: the value {text:?} is not allowed"
                )));
            }
            if !type_ok(&kind, text) {
                return Err(bad(format!("twin {name}: {text:?} is not of type {kind}")));
            }
        }
    }
    let mut out = Outcome::default();
    let stamp = json!({ "timestamp": now_ms }).to_string();
    for (name, twin) in twins {
        let local = device.twins.get(name);
        match (twin, local) {
            (None, Some(row)) if row.optional && row.attr_type != "deleted" => {
                let mut new = row.clone();
                for (v, present) in [
                    (&mut new.expected_version, row.expected_version.is_some()),
                    (&mut new.actual_version, row.actual_version.is_some()),
                ] {
                    if present {
                        let mut ver = version(v);
                        ver.edge += 1;
                        *v = Some(serde_json::to_string(&ver).unwrap_or_default());
                    }
                }
                new.expected = None;
                new.actual = None;
                new.expected_meta = None;
                new.actual_meta = None;
                new.attr_type = "deleted".into();
                out.document.insert(
                    name.clone(),
                    json!({"last": msg_twin(row, false), "current": null}),
                );
                out.result.insert(name.clone(), None);
                let mut deleted = msg_twin(&new, true);
                deleted.metadata = Some(TypeMetadata {
                    kind: Some("deleted".into()),
                });
                out.sync.insert(name.clone(), Some(deleted));
                out.rows.push((name.clone(), new));
            }
            (None, _) => {}
            (Some(t), local) => {
                let mut new = local.cloned().unwrap_or_else(|| TwinRow {
                    optional: t.optional.unwrap_or(true),
                    attr_type: t
                        .metadata
                        .as_ref()
                        .and_then(|m| m.kind.clone())
                        .unwrap_or_else(|| "string".into()),
                    ..TwinRow::default()
                });
                if new.attr_type == "deleted" {
                    new.attr_type = t
                        .metadata
                        .as_ref()
                        .and_then(|m| m.kind.clone())
                        .unwrap_or_else(|| "string".into());
                }
                if t.optional == Some(false) {
                    new.optional = false;
                }
                let mut changed = false;
                for (given, value, meta, ver) in [
                    (
                        &t.expected,
                        &mut new.expected,
                        &mut new.expected_meta,
                        &mut new.expected_version,
                    ),
                    (
                        &t.actual,
                        &mut new.actual,
                        &mut new.actual_meta,
                        &mut new.actual_version,
                    ),
                ] {
                    let Some(text) = given.as_ref().and_then(|g| g.value.clone()) else {
                        continue;
                    };
                    let mut v = if local.is_some() {
                        version(ver)
                    } else {
                        TwinVersion { cloud: 0, edge: 0 }
                    };
                    v.edge += 1;
                    *ver = Some(serde_json::to_string(&v).unwrap_or_default());
                    *value = Some(text);
                    *meta = Some(stamp.clone());
                    changed = true;
                }
                if !changed && local.is_some() {
                    continue;
                }
                let last = local.map(|r| msg_twin(r, false));
                out.document.insert(
                    name.clone(),
                    json!({"last": last, "current": msg_twin(&new, false)}),
                );
                out.result.insert(name.clone(), Some(msg_twin(&new, false)));
                out.sync.insert(name.clone(), Some(msg_twin(&new, true)));
                out.rows.push((name.clone(), new));
            }
        }
    }
    Ok(out)
}

/// Twins whose expected value differs from the actual one (`…/twin/update/delta`), and the
/// expected values by name.
pub fn delta(device: &DeviceRow) -> Option<(BTreeMap<String, MsgTwin>, BTreeMap<String, String>)> {
    let mut twins = BTreeMap::new();
    let mut delta = BTreeMap::new();
    for (name, row) in &device.twins {
        if row.attr_type == "deleted" {
            continue;
        }
        let Some(expected) = row.expected.as_deref().filter(|e| !e.is_empty()) else {
            continue;
        };
        if row.actual.as_deref() != Some(expected) {
            twins.insert(name.clone(), msg_twin(row, false));
            delta.insert(name.clone(), expected.to_string());
        }
    }
    (!delta.is_empty()).then_some((twins, delta))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_shared::devices::decode_content;

    fn update(text: &str) -> DeviceTwinUpdate {
        decode_content(&Value::String(text.into())).unwrap()
    }

    #[test]
    fn new_twins_start_at_edge_version_one_and_updates_bump_it() {
        let mut d = DeviceRow::default();
        let o = apply_rest(
            &d,
            &update(
                r#"{"twin":{"temperature":{"actual":{"value":"23"},"metadata":{"type":"int"}}}}"#,
            ),
            1000,
        )
        .unwrap();
        let (name, row) = &o.rows[0];
        assert_eq!(name, "temperature");
        assert_eq!(row.actual.as_deref(), Some("23"));
        assert_eq!(
            row.actual_version.as_deref(),
            Some(r#"{"cloud":0,"edge":1}"#)
        );
        assert_eq!(row.actual_meta.as_deref(), Some(r#"{"timestamp":1000}"#));
        assert_eq!(row.attr_type, "int");
        assert!(row.optional);
        let sync = o.sync["temperature"].as_ref().unwrap();
        assert_eq!(sync.actual_version, Some(TwinVersion { cloud: 0, edge: 1 }));
        assert!(
            o.result["temperature"]
                .as_ref()
                .unwrap()
                .actual_version
                .is_none()
        );
        d.twins.insert(name.clone(), row.clone());

        let o = apply_rest(
            &d,
            &update(r#"{"twin":{"temperature":{"actual":{"value":"24"}}}}"#),
            2000,
        )
        .unwrap();
        assert_eq!(
            o.rows[0].1.actual_version.as_deref(),
            Some(r#"{"cloud":0,"edge":2}"#)
        );
        assert_eq!(o.document["temperature"]["last"]["actual"]["value"], "23");
        assert_eq!(
            o.document["temperature"]["current"]["actual"]["value"],
            "24"
        );
    }

    #[test]
    fn bad_requests_change_nothing() {
        let mut d = DeviceRow::default();
        d.twins.insert(
            "count".into(),
            TwinRow {
                attr_type: "int".into(),
                optional: true,
                ..TwinRow::default()
            },
        );
        for (text, why) in [
            (r#"{"event_id":"x"}"#, "twin does not exist"),
            (
                r#"{"twin":{"count":{"actual":{"value":"abc"}}}}"#,
                "not of type int",
            ),
            (
                r#"{"twin":{"ok":{"actual":{"value":"1"}},"count":{"actual":{"value":"x y"}}}}"#,
                "not allowed",
            ),
            (
                r#"{"twin":{"bad name":{"actual":{"value":"1"}}}}"#,
                "not allowed",
            ),
            (r#"{"twin":{"count":{"actual":{}}}}"#, "without value"),
            (
                r#"{"twin":{"t":{"actual":{"value":"1"},"metadata":{"type":"double"}}}}"#,
                "not of type double",
            ),
        ] {
            let e = apply_rest(&d, &update(text), 1).unwrap_err();
            assert_eq!(e.code, 400);
            assert!(e.reason.contains(why), "{text}: {}", e.reason);
        }
    }

    #[test]
    fn null_deletes_optional_twins_and_delta_lists_unmet_expectations() {
        let mut d = DeviceRow::default();
        let o = apply_rest(
            &d,
            &update(r#"{"twin":{"setpoint":{"expected":{"value":"20"},"actual":{"value":"18"}},"mode":{"expected":{"value":"auto"},"actual":{"value":"auto"}}}}"#),
            1,
        )
        .unwrap();
        for (n, r) in o.rows {
            d.twins.insert(n, r);
        }
        let (twins, delta) = delta(&d).unwrap();
        assert_eq!(
            delta,
            BTreeMap::from([("setpoint".to_string(), "20".to_string())])
        );
        assert!(twins.contains_key("setpoint") && !twins.contains_key("mode"));

        let o = apply_rest(&d, &update(r#"{"twin":{"mode":null}}"#), 2).unwrap();
        let row = &o.rows[0].1;
        assert_eq!(row.attr_type, "deleted");
        assert_eq!(row.actual, None);
        assert_eq!(
            row.actual_version.as_deref(),
            Some(r#"{"cloud":0,"edge":2}"#)
        );
        assert_eq!(o.result["mode"], None);
        assert_eq!(o.document["mode"]["current"], Value::Null);
    }
}
