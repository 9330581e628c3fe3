//! KubeEdge's node tasks (`operations.kubeedge.io/v1alpha2`, v1.16+) on the wire, as v1.23
//! sends them: the cloud's taskmanager sends a job's `spec` to each node (source and group
//! `taskmanager`, operation = the first action, resource
//! `operations.kubeedge.io/v1alpha2/<type>/<job>/node/<node>`, no ACK); the edge answers after
//! every action with operation `UpdateNodeActionStatus` (source `websocket`, group `hub`) on
//! the same resource, content [`ActionStatus`].

use serde::{Deserialize, Serialize};

pub const API_GROUP: &str = "operations.kubeedge.io";
pub const API_VERSION: &str = "operations.kubeedge.io/v1alpha2";
/// `route.source` and `route.group` of the cloud's task messages.
pub const TASK_MANAGER: &str = "taskmanager";
/// The edge's report of one action.
pub const UPDATE_NODE_ACTION_STATUS: &str = "UpdateNodeActionStatus";

/// The job kinds (their `resourceType` in the resource string).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobKind {
    ImagePrePull,
    NodeUpgrade,
    ConfigUpdate,
}

impl JobKind {
    pub fn resource_type(self) -> &'static str {
        match self {
            JobKind::ImagePrePull => "imageprepulljob",
            JobKind::NodeUpgrade => "nodeupgradejob",
            JobKind::ConfigUpdate => "configupdatejob",
        }
    }

    pub fn parse(s: &str) -> Option<JobKind> {
        [
            JobKind::ImagePrePull,
            JobKind::NodeUpgrade,
            JobKind::ConfigUpdate,
        ]
        .into_iter()
        .find(|k| k.resource_type() == s)
    }

    /// The actions in order, when each succeeds (failure branches are not followed here).
    pub fn actions(self) -> &'static [&'static str] {
        match self {
            JobKind::ImagePrePull => &["Check", "Pull"],
            JobKind::NodeUpgrade => &["Check", "WaitingConfirmation", "BackUp", "Upgrade"],
            JobKind::ConfigUpdate => &["Check", "BackUp", "Update"],
        }
    }

    /// Whether a report of `action` (`succ`) ends the node's task.
    pub fn is_final(self, action: &str, succ: bool) -> bool {
        let actions = self.actions();
        if !succ {
            // Only Upgrade/Update fail over to RollBack; everything else ends here.
            return !matches!(
                (self, action),
                (JobKind::NodeUpgrade, "Upgrade") | (JobKind::ConfigUpdate, "Update")
            );
        }
        action == "RollBack" || actions.last() == Some(&action)
    }
}

/// `operations.kubeedge.io/v1alpha2/<type>/<job>/node/<node>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskResource {
    pub kind: JobKind,
    pub job: String,
    pub node: String,
}

impl TaskResource {
    pub fn parse(resource: &str) -> Option<TaskResource> {
        let rest = resource.strip_prefix(API_VERSION)?.strip_prefix('/')?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [ty, job, "node", node] if !job.is_empty() && !node.is_empty() => Some(TaskResource {
                kind: JobKind::parse(ty)?,
                job: job.to_string(),
                node: node.to_string(),
            }),
            _ => None,
        }
    }
}

impl std::fmt::Display for TaskResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{API_VERSION}/{}/{}/node/{}",
            self.kind.resource_type(),
            self.job,
            self.node
        )
    }
}

/// The edge's report of one action (KubeEdge's `UpstreamMessage`; every field always sent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ActionStatus {
    #[serde(default)]
    pub action: String,
    #[serde(default)]
    pub succ: bool,
    /// RFC 3339.
    #[serde(rename = "finishTime", default)]
    pub finish_time: String,
    #[serde(default)]
    pub reason: String,
    /// For `Pull`: a JSON string of [`ImageStatus`]es; for upgrades `"<from>,<to>"`.
    #[serde(default)]
    pub extend: String,
}

/// One image's result in an ImagePrePullJob's node status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ImageStatus {
    pub image: String,
    /// `"True"` or `"False"`.
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_parse_and_print_back() {
        let r = "operations.kubeedge.io/v1alpha2/imageprepulljob/job1/node/edge-1";
        let t = TaskResource::parse(r).unwrap();
        assert_eq!(t.kind, JobKind::ImagePrePull);
        assert_eq!((t.job.as_str(), t.node.as_str()), ("job1", "edge-1"));
        assert_eq!(t.to_string(), r);
        for bad in [
            "operations.kubeedge.io/v1alpha1/imageprepulljob/job1/node/edge-1",
            "operations.kubeedge.io/v1alpha2/podjob/job1/node/edge-1",
            "operations.kubeedge.io/v1alpha2/imageprepulljob/job1/node/",
            "operations.kubeedge.io/v1alpha2/imageprepulljob/job1/x/edge-1",
            "operations.kubeedge.io/v1alpha2/imageprepulljob/job1/node/edge-1/more",
            "",
        ] {
            assert!(TaskResource::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn final_actions_follow_kubeedges_flows() {
        let k = JobKind::ImagePrePull;
        assert!(!k.is_final("Check", true));
        assert!(k.is_final("Check", false));
        assert!(k.is_final("Pull", true));
        assert!(k.is_final("Pull", false));
        let u = JobKind::NodeUpgrade;
        assert!(!u.is_final("Upgrade", false), "rolls back");
        assert!(u.is_final("RollBack", true));
        assert!(u.is_final("Upgrade", true));
    }

    #[test]
    fn reports_carry_kubeedges_field_names() {
        let s = ActionStatus {
            action: "Pull".into(),
            succ: true,
            finish_time: "2026-11-27T12:00:00Z".into(),
            reason: String::new(),
            extend: "[]".into(),
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"action": "Pull", "succ": true,
                "finishTime": "2026-11-27T12:00:00Z", "reason": "", "extend": "[]"})
        );
        let back: ActionStatus =
            serde_json::from_value(serde_json::json!({"action": "Check"})).unwrap();
        assert!(!back.succ);
    }
}
