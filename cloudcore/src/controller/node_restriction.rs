//! What one edge node may do upstream, as the apiserver's Node authorizer and NodeRestriction
//! admission allow a kubelet: write only its own Node and Lease, only pods bound to it (a
//! mirror pod it creates must be bound to it), read only the configmaps and secrets its pods
//! use, and ask for service-account tokens only for its pods. KubeEdge v1.15 checks none of
//! this (cloudcore writes with its own, broad credentials), so one edge's certificate reached
//! every node's objects; here it reaches its own.
//!
//! Reading nodes, leases, services and volumes stays open, as for kubelets.

use super::location::{ObjectKey, SharedLocation};
use kubeedge_shared::ResourceType as RT;
use kubeedge_shared::{Operation, ResourcePath};
use serde_json::Value;

/// The namespace of node leases.
pub use kubeedge_shared::constants::LEASE_NAMESPACE;

/// The decision for one upstream request.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny(String),
    /// Allowed when this pod, as the API has it now, is bound to the node (or is gone: the
    /// operation then finds nothing); `service_account`/`uid`, when given, must match too.
    PodOnNode {
        namespace: String,
        name: String,
        service_account: Option<String>,
        uid: Option<String>,
    },
}

/// Whether [`check`] looks at the content of this kind of request (others skip parsing it).
pub fn needs_content(resource_type: &RT, op: &Operation) -> bool {
    matches!(
        (resource_type, op),
        (RT::Node | RT::Lease | RT::Pod, Operation::Insert)
            | (RT::ServiceAccountToken, Operation::Query)
    )
}

/// Decides what it can without the API. `content` is the message content as JSON (Null when
/// it is not JSON).
pub fn check(
    node: &str,
    path: &ResourcePath,
    op: &Operation,
    content: &Value,
    location: &SharedLocation,
) -> Verdict {
    let ns = path.namespace.as_deref().unwrap_or_default();
    let name = path.name.as_deref();
    let own = |what: &str, named: Option<&str>| match named {
        Some(n) if n == node => Verdict::Allow,
        Some(n) => Verdict::Deny(format!("node {node} may not modify {what} {n}")),
        None => Verdict::Deny(format!("node {node} may not modify an unnamed {what}")),
    };
    let content_name = content["metadata"]["name"].as_str();
    match (&path.resource_type, op) {
        (RT::Node, Operation::Insert) => own("node", name.or(content_name)),
        (RT::Node, Operation::Update) | (RT::NodeStatus, Operation::Update) => own("node", name),
        (RT::NodePatch, Operation::Patch) => own("node", name),
        (RT::Lease, Operation::Insert | Operation::Update) => {
            if ns != LEASE_NAMESPACE {
                return Verdict::Deny(format!(
                    "node {node} may only write its lease in namespace {LEASE_NAMESPACE}"
                ));
            }
            own("lease", name.or(content_name))
        }
        (RT::Pod, Operation::Insert) => match content["spec"]["nodeName"].as_str() {
            Some(n) if n == node => Verdict::Allow,
            _ => Verdict::Deny(format!(
                "node {node} may only create mirror pods bound to itself"
            )),
        },
        (RT::PodPatch, Operation::Patch) | (RT::Pod, Operation::Delete) => {
            let Some(name) = name else {
                return Verdict::Allow;
            };
            let key: ObjectKey = (ns.to_string(), name.to_string());
            match location.read().pod_node(&key) {
                Some(n) if n == node => Verdict::Allow,
                Some(other) => Verdict::Deny(format!(
                    "node {node} may not modify pod {ns}/{name}: it is bound to {other}"
                )),
                None => Verdict::PodOnNode {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                    service_account: None,
                    uid: None,
                },
            }
        }
        (ty @ (RT::ConfigMap | RT::Secret), Operation::Query) => {
            let Some(name) = name else {
                return Verdict::Allow;
            };
            if !location.is_synced() {
                // Until the pods have been listed nothing can be told apart.
                return Verdict::Allow;
            }
            let key: ObjectKey = (ns.to_string(), name.to_string());
            if location.read().node_uses(node, &key, *ty == RT::Secret) {
                Verdict::Allow
            } else {
                Verdict::Deny(format!("no pod on node {node} uses {ty} {ns}/{name}"))
            }
        }
        (RT::ServiceAccountToken, Operation::Query) => {
            let bound = &content["spec"]["boundObjectRef"];
            match (bound["kind"].as_str(), bound["name"].as_str()) {
                (Some("Pod"), Some(pod)) => Verdict::PodOnNode {
                    namespace: ns.to_string(),
                    name: pod.to_string(),
                    service_account: Some(name.unwrap_or_default().to_string()),
                    uid: bound["uid"].as_str().map(str::to_string),
                },
                _ => Verdict::Deny(format!(
                    "node {node} may only request tokens bound to one of its pods"
                )),
            }
        }
        _ => Verdict::Allow,
    }
}

/// The decision on a [`Verdict::PodOnNode`] given the pod as read (None: it does not exist).
pub fn pod_verdict(node: &str, wanted: &Verdict, pod: Option<&Value>) -> Result<(), String> {
    let Verdict::PodOnNode {
        namespace,
        name,
        service_account,
        uid,
    } = wanted
    else {
        return Ok(());
    };
    let Some(pod) = pod else {
        // A token for a pod that does not exist is refused; anything else finds nothing.
        return match service_account {
            Some(_) => Err(format!("pod {namespace}/{name} does not exist")),
            None => Ok(()),
        };
    };
    let bound = pod["spec"]["nodeName"].as_str().unwrap_or_default();
    if bound != node {
        return Err(format!(
            "node {node} may not act on pod {namespace}/{name}: it is bound to {:?}",
            bound
        ));
    }
    if let Some(sa) = service_account {
        let pods_sa = pod["spec"]["serviceAccountName"]
            .as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or("default");
        if pods_sa != sa {
            return Err(format!(
                "pod {namespace}/{name} runs as service account {pods_sa}, not {sa}"
            ));
        }
    }
    if let Some(uid) = uid
        && pod["metadata"]["uid"].as_str() != Some(uid.as_str())
    {
        return Err(format!("pod {namespace}/{name} has another UID"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::refs::PodRefs;
    use serde_json::json;

    fn path(s: &str) -> ResourcePath {
        ResourcePath::parse(s).unwrap()
    }

    fn location() -> SharedLocation {
        let l = SharedLocation::default();
        let refs = PodRefs {
            configmaps: ["cfg".to_string()].into(),
            secrets: ["creds".to_string()].into(),
            service_account: None,
        };
        l.write()
            .set_pod(("ns".into(), "web".into()), "edge-1", refs);
        l.set_synced();
        l
    }

    fn verdict(res: &str, op: Operation, content: Value) -> Verdict {
        check("edge-1", &path(res), &op, &content, &location())
    }

    #[test]
    fn a_node_writes_only_its_own_node_and_lease() {
        use Operation::*;
        assert_eq!(
            verdict("default/nodepatch/edge-1", Patch, Value::Null),
            Verdict::Allow
        );
        assert!(matches!(
            verdict("default/nodepatch/edge-2", Patch, Value::Null),
            Verdict::Deny(_)
        ));
        assert!(matches!(
            verdict("default/nodestatus/edge-2", Update, Value::Null),
            Verdict::Deny(_)
        ));
        assert!(matches!(
            verdict(
                "default/node/edge-2",
                Insert,
                json!({"metadata": {"name": "edge-1"}})
            ),
            Verdict::Deny(_)
        ));
        assert_eq!(
            verdict("default/node/edge-2", Query, Value::Null),
            Verdict::Allow
        );
        assert_eq!(
            verdict(
                "kube-node-lease/lease",
                Insert,
                json!({"metadata": {"name": "edge-1"}})
            ),
            Verdict::Allow
        );
        assert!(matches!(
            verdict("kube-node-lease/lease/edge-2", Update, json!({})),
            Verdict::Deny(_)
        ));
        assert!(matches!(
            verdict("default/lease/edge-1", Update, json!({})),
            Verdict::Deny(_)
        ));
    }

    #[test]
    fn pods_must_be_bound_to_the_node() {
        use Operation::*;
        assert_eq!(
            verdict("ns/podpatch/web", Patch, Value::Null),
            Verdict::Allow
        );
        let l = location();
        l.write()
            .set_pod(("ns".into(), "other".into()), "edge-2", PodRefs::default());
        assert!(matches!(
            check("edge-1", &path("ns/pod/other"), &Delete, &Value::Null, &l),
            Verdict::Deny(_)
        ));
        // Unknown here: decided on the pod as the API has it.
        let v = verdict("ns/podpatch/new", Patch, Value::Null);
        assert!(matches!(v, Verdict::PodOnNode { .. }), "{v:?}");
        assert!(
            pod_verdict("edge-1", &v, None).is_ok(),
            "a gone pod finds nothing"
        );
        let elsewhere = json!({"spec": {"nodeName": "edge-2"}});
        assert!(pod_verdict("edge-1", &v, Some(&elsewhere)).is_err());
        let here = json!({"spec": {"nodeName": "edge-1"}});
        assert!(pod_verdict("edge-1", &v, Some(&here)).is_ok());
        assert!(matches!(
            verdict("ns/pod", Insert, json!({"spec": {"nodeName": "edge-2"}})),
            Verdict::Deny(_)
        ));
    }

    #[test]
    fn configmaps_and_secrets_only_when_a_pod_of_the_node_uses_them() {
        use Operation::*;
        assert_eq!(
            verdict("ns/configmap/cfg", Query, Value::Null),
            Verdict::Allow
        );
        assert_eq!(
            verdict("ns/secret/creds", Query, Value::Null),
            Verdict::Allow
        );
        assert!(matches!(
            verdict("ns/secret/cfg", Query, Value::Null),
            Verdict::Deny(_)
        ));
        assert!(matches!(
            verdict("kube-system/secret/creds", Query, Value::Null),
            Verdict::Deny(_)
        ));
        // Before the informers synced nothing is refused.
        let fresh = SharedLocation::default();
        assert_eq!(
            check("edge-1", &path("ns/secret/x"), &Query, &Value::Null, &fresh),
            Verdict::Allow
        );
    }

    #[test]
    fn tokens_only_for_service_accounts_of_the_nodes_pods() {
        use Operation::*;
        assert!(matches!(
            verdict("ns/serviceaccounttoken/default", Query, json!({"spec": {}})),
            Verdict::Deny(_)
        ));
        let v = verdict(
            "ns/serviceaccounttoken/builder",
            Query,
            json!({"spec": {"boundObjectRef": {"kind": "Pod", "name": "web", "uid": "u1"}}}),
        );
        let pod = |node: &str, sa: &str, uid: &str| json!({"metadata": {"uid": uid}, "spec": {"nodeName": node, "serviceAccountName": sa}});
        assert!(pod_verdict("edge-1", &v, Some(&pod("edge-1", "builder", "u1"))).is_ok());
        assert!(pod_verdict("edge-1", &v, Some(&pod("edge-1", "admin", "u1"))).is_err());
        assert!(pod_verdict("edge-1", &v, Some(&pod("edge-2", "builder", "u1"))).is_err());
        assert!(pod_verdict("edge-1", &v, Some(&pod("edge-1", "builder", "u2"))).is_err());
        assert!(pod_verdict("edge-1", &v, None).is_err());
    }
}
