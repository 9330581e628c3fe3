//! Rule status as KubeEdge keeps it — `status.successMessages`, `status.failMessages` and
//! `status.errors` — written in batches: calls are tallied in memory and every `interval` each
//! rule with news gets one merge patch (KubeEdge writes one per message). The patch carries the
//! `resourceVersion` it was computed from, so replicas adding their tallies to the same rule
//! never lose one another's counts: a conflict keeps the tally for the next round.
//!
//! KubeEdge keeps only the latest error; here the latest [`MAX_ERRORS`], newest first, each
//! with its time. (KubeEdge's patch puts the fields at the top level of the object, where a
//! structural CRD prunes them; these go under `status`.) Reasons a rule is not in force
//! (missing endpoint, invalid, clashing) are reported the same way.

use super::metrics::{ResultLabel, RouterMetrics};
use super::rules::{ObjKey, Route};
use crate::controller::kind::Kind;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Errors kept in a rule's status.
pub const MAX_ERRORS: usize = 5;
/// Rounds a tally survives failing writes (other than conflicts) before it is dropped.
const MAX_ATTEMPTS: u32 = 5;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Tally {
    uid: String,
    success: i64,
    fail: i64,
    /// Newest first.
    errors: Vec<String>,
    attempts: u32,
}

impl Tally {
    fn push_error(&mut self, e: String) {
        self.errors.insert(0, e);
        self.errors.truncate(MAX_ERRORS);
    }

    /// Folds an older tally (one that failed to be written) into this newer one.
    fn absorb_older(&mut self, older: Tally) {
        self.success += older.success;
        self.fail += older.fail;
        self.errors.extend(older.errors);
        self.errors.truncate(MAX_ERRORS);
        self.attempts = self.attempts.max(older.attempts);
    }
}

/// What happened to each rule since the last write. Cheap to clone.
#[derive(Clone, Default)]
pub struct StatusTally {
    inner: Arc<Mutex<HashMap<ObjKey, Tally>>>,
}

fn stamp(e: &str) -> String {
    format!("{}: {e}", crate::controller::now_rfc3339())
}

impl StatusTally {
    fn with(&self, key: ObjKey, uid: &str, f: impl FnOnce(&mut Tally)) {
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let t = map.entry(key).or_default();
        if t.uid != uid {
            *t = Tally {
                uid: uid.to_string(),
                ..Tally::default()
            };
        }
        f(t);
    }

    pub fn success(&self, route: &Route) {
        self.with(route.key(), &route.uid, |t| t.success += 1);
    }

    pub fn failure(&self, route: &Route, error: &str) {
        self.with(route.key(), &route.uid, |t| {
            t.fail += 1;
            t.push_error(stamp(error));
        });
    }

    /// Why a rule is not in force (not a failed message).
    pub fn problem(&self, key: ObjKey, uid: &str, error: &str) {
        self.with(key, uid, |t| {
            t.push_error(stamp(&format!("rule not in force: {error}")))
        });
    }

    fn take(&self) -> HashMap<ObjKey, Tally> {
        std::mem::take(&mut *self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn restore(&self, key: ObjKey, older: Tally) {
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match map.get_mut(&key) {
            Some(newer) if newer.uid == older.uid => newer.absorb_older(older),
            Some(_) => {}
            None => {
                map.insert(key, older);
            }
        }
    }

    /// The errors waiting to be written for `key`, newest first.
    #[cfg(test)]
    pub(crate) fn errors_of(&self, key: &ObjKey) -> Vec<String> {
        self.peek(key).map(|t| t.errors).unwrap_or_default()
    }

    #[cfg(test)]
    fn peek(&self, key: &ObjKey) -> Option<Tally> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }
}

/// The new status: the old one plus the tally.
fn merged_status(old: &Value, t: &Tally) -> Value {
    let count = |k: &str| old.get(k).and_then(Value::as_i64).unwrap_or(0);
    let mut errors = t.errors.clone();
    if let Some(old_errors) = old.get("errors").and_then(Value::as_array) {
        errors.extend(
            old_errors
                .iter()
                .filter_map(|e| e.as_str().map(String::from)),
        );
    }
    errors.truncate(MAX_ERRORS);
    json!({
        "successMessages": count("successMessages") + t.success,
        "failMessages": count("failMessages") + t.fail,
        "errors": errors,
    })
}

enum Written {
    Ok,
    /// The rule is gone or is another rule of the same name now.
    Gone,
    Conflict,
    Failed(kube::Error),
}

async fn write(api: &Api<DynamicObject>, name: &str, t: &Tally) -> Written {
    let current = match api.get_opt(name).await {
        Ok(Some(o)) => o,
        Ok(None) => return Written::Gone,
        Err(e) => return Written::Failed(e),
    };
    if current.metadata.uid.as_deref().unwrap_or_default() != t.uid {
        return Written::Gone;
    }
    let old = current.data.get("status").cloned().unwrap_or(Value::Null);
    let patch = json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "status": merged_status(&old, t),
    });
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Written::Ok,
        Err(kube::Error::Api(s)) if s.code == 409 => Written::Conflict,
        Err(kube::Error::Api(s)) if s.code == 404 => Written::Gone,
        Err(e) => Written::Failed(e),
    }
}

/// Writes the tallies every `interval` until `shutdown` (then once more).
pub async fn run(
    client: kube::Client,
    tally: StatusTally,
    interval: Duration,
    metrics: RouterMetrics,
    shutdown: CancellationToken,
) {
    let ar = Kind::Rule.api_resource();
    loop {
        let stopping = tokio::select! {
            _ = shutdown.cancelled() => true,
            _ = tokio::time::sleep(interval) => false,
        };
        for (key, mut t) in tally.take() {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &key.0, &ar);
            let result = match write(&api, &key.1, &t).await {
                Written::Ok => "ok",
                Written::Gone => "gone",
                Written::Conflict => {
                    tally.restore(key, t);
                    "conflict"
                }
                Written::Failed(e) => {
                    t.attempts += 1;
                    tracing::debug!(namespace = %key.0, rule = %key.1, error = %e, attempts = t.attempts, "rule status not written");
                    if t.attempts < MAX_ATTEMPTS {
                        tally.restore(key, t);
                    }
                    "error"
                }
            };
            metrics
                .status_writes
                .get_or_create(&ResultLabel { result })
                .inc();
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_adds_the_tally_and_keeps_the_newest_errors() {
        let t = Tally {
            uid: "u".into(),
            success: 3,
            fail: 2,
            errors: vec!["new-2".into(), "new-1".into()],
            attempts: 0,
        };
        let old = json!({"successMessages": 10, "failMessages": 1,
            "errors": ["old-1", "old-2", "old-3", "old-4"]});
        assert_eq!(
            merged_status(&old, &t),
            json!({"successMessages": 13, "failMessages": 3,
                "errors": ["new-2", "new-1", "old-1", "old-2", "old-3"]})
        );
        assert_eq!(
            merged_status(&Value::Null, &Tally::default()),
            json!({"successMessages": 0, "failMessages": 0, "errors": []})
        );
    }

    #[test]
    fn a_tally_that_could_not_be_written_joins_the_next_one() {
        let tally = StatusTally::default();
        let key: ObjKey = ("default".into(), "r".into());
        tally.with(key.clone(), "u", |t| t.success += 2);
        let taken = tally.take();
        tally.with(key.clone(), "u", |t| {
            t.fail += 1;
            t.push_error("later".into())
        });
        for (k, t) in taken {
            tally.restore(k, t);
        }
        let t = tally.peek(&key).unwrap();
        assert_eq!((t.success, t.fail, t.errors.len()), (2, 1, 1));
        // A rule recreated under the same name starts over.
        tally.with(key.clone(), "other-uid", |t| t.success += 1);
        assert_eq!(tally.peek(&key).unwrap().success, 1);
    }
}
