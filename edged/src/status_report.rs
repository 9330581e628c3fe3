//! How a pod status reaches the API server, and how often it did.
//!
//! The cloud applies the edge's status as a strategic merge patch (KubeEdge's `podpatch`),
//! which merges list entries by their merge keys: `podIPs` and `hostIPs` by `ip`,
//! `conditions` by `type`, new entries before the old. Sending the new status as it is
//! would keep a pod's old IP beside its new one after a new sandbox (every reboot gives
//! one), and a real apiserver refuses that (`status.podIPs: Invalid value: …: may specify no
//! more than one IP for each IP family`), again and again.
//!
//! The kubelet sends a two-way merge patch from the status it read (KubeEdge's edged reads it
//! from the edge database). edged does the same from the API server's copy it knows — the
//! pod a patch returned, stored with the pod — but states the IP lists it owns whole with
//! the `$patch: replace` element, which leaves exactly the new entries whatever the server's
//! copy holds; delete directives would only remove the entries edged knows of. A list the
//! server's copy lacks is sent plain: an apiserver before 1.28 takes a value the object lacks
//! as sent, directives included, and would refuse the `$patch` element as an entry (1.28 and
//! later drop it). Should the known copy be wrong either way, the API server refuses the
//! status and the next attempt uses the other form. `conditions` merge by type (other components own some, e.g.
//! `DisruptionTarget` or readiness gates); the atomic lists (`containerStatuses`,
//! `initContainerStatuses`) are replaced anyway; pod-level `reason` and `message` that edged
//! no longer reports are deleted with `null`.

use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// Status lists edged reports in full; merged by `ip` on the server unless replaced.
const OWNED_MERGE_LISTS: [&str; 2] = ["podIPs", "hostIPs"];
/// Pod-level fields edged sets and clears.
const CLEARED_FIELDS: [&str; 2] = ["reason", "message"];

/// How the IP lists are stated in a status patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListForm {
    /// `$patch: replace` where the server's copy has the list, plain where it lacks it.
    AsKnown,
    /// The opposite of [`ListForm::AsKnown`]: after the API server refused that form, the
    /// known copy was wrong.
    Flipped,
}

/// The strategic merge patch that sets `status` for the pod with `uid` (a UID precondition, as
/// the kubelet's), given the API server's copy of the status as last known (`server`,
/// possibly null).
pub fn status_patch(uid: &str, status: &Value, server: &Value, form: ListForm) -> Value {
    let mut s: Map<String, Value> = status.as_object().cloned().unwrap_or_default();
    for list in OWNED_MERGE_LISTS {
        let server_has = server.get(list).is_some_and(Value::is_array);
        let replace = server_has == (form == ListForm::AsKnown);
        if replace && let Some(Value::Array(items)) = s.get_mut(list) {
            items.push(json!({"$patch": "replace"}));
        }
    }
    for field in CLEARED_FIELDS {
        if !s.contains_key(field) && server.get(field).is_some_and(|v| !v.is_null()) {
            s.insert(field.into(), Value::Null);
        }
    }
    if uid.is_empty() {
        // A static pod's mirror has a UID of the API server's: no precondition.
        return json!({"status": s});
    }
    json!({"metadata": {"uid": uid}, "status": s})
}

/// What became of one status patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The API server applied it.
    Accepted,
    /// The API server refused it (e.g. 422 Invalid): retried with back-off.
    Refused,
    /// The cloud could not be reached, or answered otherwise.
    Failed,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
        }
    }
}

#[derive(Default, Clone, Copy)]
struct Counts([u64; 3]);

/// Metrics of other modules, rendered after edged's on the same `/metrics` page.
pub trait MetricsSource: Send + Sync {
    /// Appends them in the Prometheus text format.
    fn render(&self, out: &mut String);
}

/// Status patches per pod of this node, for `/metrics` (a pod's series go with it).
#[derive(Default)]
pub struct StatusReports {
    pods: Mutex<BTreeMap<(String, String), Counts>>,
    /// The other modules' metrics, rendered after these.
    modules: std::sync::OnceLock<std::sync::Arc<dyn MetricsSource>>,
}

impl StatusReports {
    /// Renders `modules` after the pod status metrics (the first call wins).
    pub fn attach(&self, modules: std::sync::Arc<dyn MetricsSource>) {
        let _ = self.modules.set(modules);
    }

    pub fn record(&self, namespace: &str, name: &str, outcome: Outcome) {
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        let counts = pods
            .entry((namespace.to_string(), name.to_string()))
            .or_default();
        counts.0[outcome as usize] += 1;
    }

    /// The pod left the node.
    pub fn forget(&self, namespace: &str, name: &str) {
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        pods.remove(&(namespace.to_string(), name.to_string()));
    }

    /// Patches sent for one pod with this outcome.
    pub fn count(&self, namespace: &str, name: &str, outcome: Outcome) -> u64 {
        let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        pods.get(&(namespace.to_string(), name.to_string()))
            .map_or(0, |c| c.0[outcome as usize])
    }

    /// `kubeedge_rs_pod_status_patches_total{namespace,pod,result}` in the text format.
    pub fn render(&self, out: &mut String) {
        let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        let name = "kubeedge_rs_pod_status_patches_total";
        let _ = writeln!(
            out,
            "# HELP {name} Pod status patches edged sent to the API server, by result (accepted, refused, failed)"
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        for ((ns, pod), counts) in pods.iter() {
            for outcome in [Outcome::Accepted, Outcome::Refused, Outcome::Failed] {
                let _ = writeln!(
                    out,
                    "{name}{{namespace=\"{}\",pod=\"{}\",result=\"{}\"}} {}",
                    escape(ns),
                    escape(pod),
                    outcome.label(),
                    counts.0[outcome as usize]
                );
            }
        }
        drop(pods);
        if let Some(m) = self.modules.get() {
            m.render(out);
        }
    }
}

/// A label value in the text format.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_ip_lists_replace_and_cleared_fields_are_deleted() {
        let status = json!({
            "phase": "Running",
            "podIP": "10.0.0.9",
            "podIPs": [{"ip": "10.0.0.9"}],
            "hostIP": "192.168.1.2",
            "hostIPs": [{"ip": "192.168.1.2"}],
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "c"}],
        });
        let server = json!({
            "reason": "DeadlineExceeded",
            "message": "x",
            "podIP": "10.0.0.5",
            "podIPs": [{"ip": "10.0.0.5"}],
            "hostIPs": [{"ip": "192.168.1.2"}],
        });
        let patch = status_patch("u-1", &status, &server, ListForm::AsKnown);
        assert_eq!(patch["metadata"], json!({"uid": "u-1"}));
        let s = &patch["status"];
        assert_eq!(
            s["podIPs"],
            json!([{"ip": "10.0.0.9"}, {"$patch": "replace"}])
        );
        assert_eq!(
            s["hostIPs"],
            json!([{"ip": "192.168.1.2"}, {"$patch": "replace"}])
        );
        assert_eq!(s["conditions"], status["conditions"], "merged by type");
        assert_eq!(s["containerStatuses"], status["containerStatuses"]);
        assert!(s.get("reason").is_some_and(Value::is_null));
        assert!(s.get("message").is_some_and(Value::is_null));
        // Lists the server's copy lacks are sent plain; nothing to clear, nothing nulled.
        let first = status_patch("u-1", &status, &Value::Null, ListForm::AsKnown);
        assert_eq!(first["status"]["podIPs"], status["podIPs"]);
        assert_eq!(first["status"]["hostIPs"], status["hostIPs"]);
        assert!(first["status"].get("reason").is_none());
        // After a refusal, the other form.
        let flipped = status_patch("u-1", &status, &Value::Null, ListForm::Flipped);
        assert_eq!(
            flipped["status"]["podIPs"],
            json!([{"ip": "10.0.0.9"}, {"$patch": "replace"}])
        );
        let flipped = status_patch("u-1", &status, &server, ListForm::Flipped);
        assert_eq!(flipped["status"]["podIPs"], status["podIPs"]);
    }

    #[test]
    fn counts_per_pod_render_and_go_with_the_pod() {
        let r = StatusReports::default();
        r.record("ns", "a", Outcome::Accepted);
        r.record("ns", "a", Outcome::Refused);
        r.record("ns", "a", Outcome::Refused);
        r.record("ns", "b\"", Outcome::Failed);
        assert_eq!(r.count("ns", "a", Outcome::Refused), 2);
        let mut out = String::new();
        r.render(&mut out);
        assert!(out.contains(
            "kubeedge_rs_pod_status_patches_total{namespace=\"ns\",pod=\"a\",result=\"refused\"} 2"
        ));
        assert!(out.contains("pod=\"b\\\"\",result=\"failed\"} 1"), "{out}");
        r.forget("ns", "a");
        assert_eq!(r.count("ns", "a", Outcome::Accepted), 0);
        let mut out = String::new();
        r.render(&mut out);
        assert!(!out.contains("pod=\"a\""));
    }
}
