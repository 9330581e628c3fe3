//! Held upgrades (KubeEdge v1.22+ "edge resource upgrade control"): a pod annotated
//! `edge.kubeedge.io/hold-upgrade: "true"` that is still `Pending` is not started; edged keeps
//! it in memory, per namespace/name, and tells the cloud with the `HeldUpgrade` condition.
//! The MetaServer's `unhold-upgrade` endpoints release it ([`Releaser`]), and edged starts it.
//!
//! * [`holds`] decides (annotation `"true"`, no `deletionTimestamp`, phase `Pending`).
//! * `HeldPods` keeps the newest copy of each held pod: a later update replaces it, a
//!   deletion forgets it, an update that no longer qualifies (annotation removed) lets it run.
//!   At most one entry per pod of this node, so bounded by the node's pods.
//! * `report` sends the condition through the pod status patch every pod status takes,
//!   again after the cloud link comes back when it could not be sent.
//!
//! Unlike KubeEdge, a pod edged already runs is not held again (its phase may still be
//! `Pending` while images pull), and a released pod's condition becomes `False`
//! (`HoldUpgradeReleased`) rather than staying `True`.

use super::pod_worker::Shared;
use super::status_report::{ListForm, Outcome, status_patch};
use crate::meta::MetaError;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const ANNOTATION: &str = "edge.kubeedge.io/hold-upgrade";
pub const CONDITION: &str = "HeldUpgrade";
pub const HELD_REASON: &str = "HoldUpgradeEnabled";
pub const HELD_MESSAGE: &str = "Upgrade is currently held due to edge-hold-upgrade annotation";
pub const RELEASED_REASON: &str = "HoldUpgradeReleased";
pub const RELEASED_MESSAGE: &str = "Upgrade was released at the edge (unhold-upgrade)";

/// Release requests waiting for edged (a few; the MetaServer waits for each answer).
const RELEASE_QUEUE: usize = 16;
/// How long a condition that could not be sent waits before the next attempt (unless the
/// cloud link comes back first).
const REPORT_RETRY: Duration = Duration::from_secs(30);

/// Whether the pod carries the hold-upgrade annotation set to `"true"`.
pub fn annotated(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations")
        .and_then(|a| a.get(ANNOTATION))
        .and_then(Value::as_str)
        == Some("true")
}

pub fn is_pending(pod: &Value) -> bool {
    pod.pointer("/status/phase").and_then(Value::as_str) == Some("Pending")
}

/// Whether edged holds this pod rather than starting it (KubeEdge's `holdUpgrade`).
pub fn holds(pod: &Value) -> bool {
    annotated(pod)
        && is_pending(pod)
        && pod
            .pointer("/metadata/deletionTimestamp")
            .is_none_or(Value::is_null)
}

/// The pod's `HeldUpgrade` condition with `status` and `reason`, if it has one.
fn condition_is(pod: &Value, status: &str, reason: &str) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == CONDITION && c["status"] == status && c["reason"] == reason)
}

/// What the `HeldUpgrade` condition should say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Condition {
    Held,
    Released,
}

impl Condition {
    /// Whether the pod as the API server has it already says so.
    pub fn shown(self, pod: &Value) -> bool {
        match self {
            Condition::Held => condition_is(pod, "True", HELD_REASON),
            Condition::Released => condition_is(pod, "False", RELEASED_REASON),
        }
    }

    /// The condition, its transition time carried over when it is already in this state.
    pub fn value(self, previous_status: &Value, now: &str) -> Value {
        let (ok, reason, message) = match self {
            Condition::Held => (true, HELD_REASON, HELD_MESSAGE),
            Condition::Released => (false, RELEASED_REASON, RELEASED_MESSAGE),
        };
        super::status::condition(
            previous_status,
            now,
            CONDITION,
            ok,
            Some(reason),
            Some(message.to_string()),
        )
    }
}

/// A task that ends with the entry it belongs to.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Held {
    uid: String,
    pod: Value,
    /// Sending the `HeldUpgrade` condition, while it has not reached the API server.
    report: Option<AbortOnDrop>,
}

/// The pods edged holds, by `namespace/name`.
#[derive(Default)]
pub(crate) struct HeldPods {
    pods: HashMap<String, Held>,
}

/// What [`HeldPods::hold`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Kept {
    /// The pod is held (first copy, or a newer one replacing the held copy).
    Held {
        /// The UID of a previous incarnation held under the same name, now forgotten.
        replaced: Option<String>,
    },
    /// An older copy than the one held: ignored.
    Stale,
}

fn resource_version(pod: &Value) -> Option<u64> {
    pod.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|v| v.parse().ok())
}

impl HeldPods {
    /// Keeps `pod` (of `key`, with `uid`) held, replacing the copy held under that name.
    pub fn hold(&mut self, key: &str, uid: &str, pod: Value) -> Kept {
        match self.pods.get_mut(key) {
            Some(h) if h.uid == uid => {
                if let (Some(new), Some(held)) = (resource_version(&pod), resource_version(&h.pod))
                    && new < held
                {
                    return Kept::Stale;
                }
                h.pod = pod;
                Kept::Held { replaced: None }
            }
            _ => {
                let old = self.pods.insert(
                    key.to_string(),
                    Held {
                        uid: uid.to_string(),
                        pod,
                        report: None,
                    },
                );
                Kept::Held {
                    replaced: old.map(|h| h.uid),
                }
            }
        }
    }

    /// Gives the held copy back to be started; `None` when nothing is held under `key`.
    pub fn release(&mut self, key: &str) -> Option<Value> {
        self.pods.remove(key).map(|h| h.pod)
    }

    /// Every held pod, in name order.
    pub fn release_all(&mut self) -> Vec<(String, Value)> {
        let mut all: Vec<_> = self.pods.drain().map(|(k, h)| (k, h.pod)).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Forgets the pod held under `key` (only the incarnation `uid`, when given); returns
    /// the UID forgotten.
    pub fn forget(&mut self, key: &str, uid: Option<&str>) -> Option<String> {
        match self.pods.get(key) {
            Some(h) if uid.is_none_or(|u| u == h.uid) => self.pods.remove(key).map(|h| h.uid),
            _ => None,
        }
    }

    pub fn is_held(&self, key: &str) -> bool {
        self.pods.contains_key(key)
    }

    /// Whether the `HeldUpgrade` condition of `key` is being sent now.
    pub fn reporting(&self, key: &str) -> bool {
        self.pods
            .get(key)
            .and_then(|h| h.report.as_ref())
            .is_some_and(|r| !r.0.is_finished())
    }

    /// Ties the task sending `key`'s condition to its entry (it ends with it).
    pub fn set_report(&mut self, key: &str, task: JoinHandle<()>) {
        match self.pods.get_mut(key) {
            Some(h) => h.report = Some(AbortOnDrop(task)),
            None => task.abort(),
        }
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// Sends the pod's `HeldUpgrade` condition to the API server (the status patch every pod
/// status takes: merged by type, other conditions untouched). A patch that could not reach
/// the API server (link down, conflict, throttled) is tried again when the cloud link comes
/// back or after [`REPORT_RETRY`], until `cancel`; other failures end it.
pub(crate) async fn report(
    shared: Arc<Shared>,
    pod: Value,
    condition: Condition,
    cancel: CancellationToken,
) {
    let (namespace, name, uid) = (
        pod.pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default(),
        pod.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default(),
        pod.pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default(),
    );
    let mut resync = shared.resync.subscribe();
    loop {
        let status = json!({"conditions": [condition.value(&pod["status"], &kubeedge_shared::clock::now())]});
        let patch = status_patch(uid, &status, &Value::Null, ListForm::AsKnown);
        let result = shared.meta.patch_pod_status(namespace, name, &patch).await;
        let outcome = match &result {
            Ok(_) => Outcome::Accepted,
            Err(MetaError::Api(_)) => Outcome::Refused,
            Err(_) => Outcome::Failed,
        };
        shared.status_reports.record(namespace, name, outcome);
        let pod_key = format!("{namespace}/{name}");
        match result {
            Ok(_) => {
                tracing::info!(pod = %pod_key, ?condition, "HeldUpgrade condition sent");
                return;
            }
            Err(MetaError::NotFound { .. }) => return,
            Err(MetaError::Api(e)) if !matches!(e.err_status.code, 409 | 429) => {
                tracing::warn!(pod = %pod_key, code = e.err_status.code, message = %e.err_status.message, "the API server refused the HeldUpgrade condition");
                return;
            }
            Err(e) if !e.is_link_failure() && !matches!(e, MetaError::Api(_)) => {
                tracing::warn!(pod = %pod_key, error = %e, "HeldUpgrade condition not sent");
                return;
            }
            Err(e) => {
                tracing::info!(pod = %pod_key, error = %e, "HeldUpgrade condition not sent; will retry");
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = resync.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(REPORT_RETRY) => {}
        }
    }
}

/// Which held pods to release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// One pod (`namespace`, `name`).
    Pod { namespace: String, name: String },
    /// Every pod this edge holds (`unhold-upgrade` of the node).
    All,
}

/// A release as edged receives it; answered with the `namespace/name` of each pod released.
pub struct ReleaseRequest {
    pub what: Release,
    pub reply: oneshot::Sender<Vec<String>>,
}

/// Where release requests wait for edged.
pub type ReleaseRequests = mpsc::Receiver<ReleaseRequest>;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReleaseError {
    #[error("edged is not running")]
    Stopped,
    #[error("edged did not answer within {0:?}; the release stays queued")]
    Timeout(Duration),
}

/// The MetaServer's handle on edged's held pods.
#[derive(Debug, Clone)]
pub struct Releaser(mpsc::Sender<ReleaseRequest>);

impl Releaser {
    /// Asks edged to release `what`; the pods released (`namespace/name`).
    pub async fn release(
        &self,
        what: Release,
        timeout: Duration,
    ) -> Result<Vec<String>, ReleaseError> {
        let (reply, answer) = oneshot::channel();
        let asked = tokio::time::timeout(timeout, self.0.send(ReleaseRequest { what, reply }));
        match asked.await {
            Err(_) => return Err(ReleaseError::Timeout(timeout)),
            Ok(Err(_)) => return Err(ReleaseError::Stopped),
            Ok(Ok(())) => {}
        }
        match tokio::time::timeout(timeout, answer).await {
            Err(_) => Err(ReleaseError::Timeout(timeout)),
            Ok(Err(_)) => Err(ReleaseError::Stopped),
            Ok(Ok(released)) => Ok(released),
        }
    }
}

/// The MetaServer's end and edged's end of the release requests.
pub fn channel() -> (Releaser, ReleaseRequests) {
    let (tx, rx) = mpsc::channel(RELEASE_QUEUE);
    (Releaser(tx), rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, rv: u64, annotation: Option<&str>, phase: &str) -> Value {
        let mut p = json!({"metadata": {"namespace": "ns", "name": "web", "uid": uid,
                                        "resourceVersion": rv.to_string()},
                           "status": {"phase": phase}});
        if let Some(a) = annotation {
            p["metadata"]["annotations"] = json!({ANNOTATION: a});
        }
        p
    }

    #[test]
    fn only_annotated_pending_pods_that_are_not_deleting_are_held() {
        assert!(holds(&pod("u", 1, Some("true"), "Pending")));
        assert!(!holds(&pod("u", 1, Some("false"), "Pending")));
        assert!(
            !holds(&pod("u", 1, Some("True"), "Pending")),
            "exactly \"true\""
        );
        assert!(!holds(&pod("u", 1, None, "Pending")));
        assert!(!holds(&pod("u", 1, Some("true"), "Running")));
        let mut deleting = pod("u", 1, Some("true"), "Pending");
        deleting["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        assert!(!holds(&deleting));
        let mut no_phase = pod("u", 1, Some("true"), "Pending");
        no_phase["status"] = json!({});
        assert!(!holds(&no_phase));
        assert!(!holds(
            &json!({"metadata": {"annotations": {ANNOTATION: 1}}})
        ));
    }

    #[test]
    fn newer_copies_replace_the_held_one_and_older_ones_are_ignored() {
        let mut held = HeldPods::default();
        let first = pod("u1", 5, Some("true"), "Pending");
        assert_eq!(
            held.hold("ns/web", "u1", first),
            Kept::Held { replaced: None }
        );
        assert_eq!(
            held.hold("ns/web", "u1", pod("u1", 4, Some("true"), "Pending")),
            Kept::Stale
        );
        assert_eq!(
            held.hold("ns/web", "u1", pod("u1", 7, Some("true"), "Pending")),
            Kept::Held { replaced: None }
        );
        // A new incarnation under the same name replaces the old one.
        assert_eq!(
            held.hold("ns/web", "u2", pod("u2", 9, Some("true"), "Pending")),
            Kept::Held {
                replaced: Some("u1".into())
            }
        );
        assert_eq!(held.len(), 1);
        let released = held.release("ns/web").expect("held");
        assert_eq!(released["metadata"]["uid"], "u2");
        assert_eq!(released["metadata"]["resourceVersion"], "9");
        assert!(held.release("ns/web").is_none(), "released once");
        assert!(held.is_empty());
    }

    #[test]
    fn deletion_forgets_only_the_deleted_incarnation() {
        let mut held = HeldPods::default();
        held.hold("ns/web", "u2", pod("u2", 1, Some("true"), "Pending"));
        assert_eq!(
            held.forget("ns/web", Some("u1")),
            None,
            "an older pod's delete"
        );
        assert!(held.is_held("ns/web"));
        assert_eq!(held.forget("ns/web", Some("u2")), Some("u2".into()));
        assert!(!held.is_held("ns/web"));
        held.hold("ns/a", "ua", pod("ua", 1, Some("true"), "Pending"));
        assert_eq!(held.forget("ns/a", None), Some("ua".into()));
        assert!(held.is_empty(), "nothing left behind");
    }

    #[test]
    fn releasing_all_empties_the_book_in_name_order() {
        let mut held = HeldPods::default();
        for (key, uid) in [("ns/c", "3"), ("ns/a", "1"), ("other/b", "2")] {
            held.hold(key, uid, pod(uid, 1, Some("true"), "Pending"));
        }
        let keys: Vec<String> = held.release_all().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["ns/a", "ns/c", "other/b"]);
        assert!(held.is_empty());
    }

    #[tokio::test]
    async fn a_report_task_ends_with_its_entry() {
        let mut held = HeldPods::default();
        held.hold("ns/web", "u", pod("u", 1, Some("true"), "Pending"));
        let (tx, rx) = oneshot::channel::<()>();
        // A task holding `tx`: when it is aborted, `rx` sees the sender dropped.
        let watched = tokio::spawn(async move {
            let _tx = tx;
            std::future::pending::<()>().await
        });
        held.set_report("ns/web", watched);
        assert!(held.reporting("ns/web"));
        assert!(held.release("ns/web").is_some());
        let ended = tokio::time::timeout(Duration::from_secs(5), rx).await;
        assert!(
            matches!(ended, Ok(Err(_))),
            "the report task was aborted with its entry"
        );
    }

    #[test]
    fn the_condition_says_held_or_released_and_keeps_its_transition_time() {
        let c = Condition::Held.value(&json!({}), "2025-01-01T00:00:00Z");
        assert_eq!(c["type"], CONDITION);
        assert_eq!(c["status"], "True");
        assert_eq!(c["reason"], HELD_REASON);
        assert_eq!(c["message"], HELD_MESSAGE);
        assert_eq!(c["lastTransitionTime"], "2025-01-01T00:00:00Z");
        let held = json!({"status": {"conditions": [c.clone()]}});
        assert!(Condition::Held.shown(&held));
        assert!(!Condition::Released.shown(&held));
        let again = Condition::Held.value(&held["status"], "2025-06-01T00:00:00Z");
        assert_eq!(again["lastTransitionTime"], "2025-01-01T00:00:00Z");
        let released = Condition::Released.value(&held["status"], "2025-06-01T00:00:00Z");
        assert_eq!(released["status"], "False");
        assert_eq!(released["reason"], RELEASED_REASON);
        assert_eq!(released["lastTransitionTime"], "2025-06-01T00:00:00Z");
    }

    #[tokio::test]
    async fn a_release_without_edged_says_so() {
        let (releaser, requests) = channel();
        drop(requests);
        assert_eq!(
            releaser.release(Release::All, Duration::from_secs(1)).await,
            Err(ReleaseError::Stopped)
        );
        let (releaser, mut requests) = channel();
        let edged = tokio::spawn(async move {
            let r = requests.recv().await.expect("a request");
            assert_eq!(
                r.what,
                Release::Pod {
                    namespace: "ns".into(),
                    name: "web".into()
                }
            );
            let _ = r.reply.send(vec!["ns/web".into()]);
        });
        let released = releaser
            .release(
                Release::Pod {
                    namespace: "ns".into(),
                    name: "web".into(),
                },
                Duration::from_secs(5),
            )
            .await;
        assert_eq!(released, Ok(vec!["ns/web".to_string()]));
        edged.await.unwrap();
    }
}
