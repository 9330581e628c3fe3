//! What an edge's MetaServer may ask the dynamic controller for (node restriction). KubeEdge
//! v1.15 checks nothing; here, like the Kubernetes node authorizer:
//!
//! * reads of anything but Secrets, ConfigMaps, ServiceAccounts and RBAC objects (an edge gets
//!   the configmaps and secrets its pods use pushed; others are not its business); pods only
//!   those bound to the node (lists and watches are narrowed to `spec.nodeName=<node>`);
//! * writes of pods bound to the node, the node's own Node and Lease, Events, and custom
//!   resources (groups outside `*.k8s.io` and the built-in API groups).

/// Kinds no edge may read through the dynamic controller.
const UNREADABLE: &[(&str, &str)] = &[
    ("", "secrets"),
    ("", "configmaps"),
    ("", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "roles"),
    ("rbac.authorization.k8s.io", "rolebindings"),
    ("rbac.authorization.k8s.io", "clusterroles"),
    ("rbac.authorization.k8s.io", "clusterrolebindings"),
];

/// API groups served by Kubernetes itself (not custom resources).
const BUILTIN_GROUPS: &[&str] = &["apps", "batch", "autoscaling", "policy", "extensions"];

/// What the check needs to know about a request.
pub struct Access<'a> {
    pub node: &'a str,
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

/// What the controller must do besides forwarding the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Allow, narrowing a pod list/watch to the node's pods.
    AllowNodePods,
    /// Allow if the object (the body of a create, the current object otherwise) is a pod
    /// bound to the node.
    AllowIfPodOnNode,
    Deny(String),
}

fn custom_group(group: &str) -> bool {
    !group.is_empty() && !group.ends_with(".k8s.io") && !BUILTIN_GROUPS.contains(&group)
}

pub fn decide(a: &Access<'_>) -> Decision {
    let deny = |what: &str| {
        Decision::Deny(format!(
            "edge node {:?} may not {} {what} through the MetaServer (node restriction)",
            a.node, a.verb
        ))
    };
    let read = matches!(a.verb, "get" | "list" | "watch");
    if read {
        if UNREADABLE.contains(&(a.group, a.resource)) {
            return deny(a.resource);
        }
        return match (a.group, a.resource, a.verb) {
            ("", "pods", "get") => Decision::AllowIfPodOnNode,
            ("", "pods", _) => Decision::AllowNodePods,
            _ => Decision::Allow,
        };
    }
    match (a.group, a.resource) {
        ("", "pods") => Decision::AllowIfPodOnNode,
        ("", "nodes") if a.name == Some(a.node) => Decision::Allow,
        ("coordination.k8s.io", "leases")
            if a.namespace == Some("kube-node-lease") && a.name == Some(a.node) =>
        {
            Decision::Allow
        }
        ("", "events") | ("events.k8s.io", "events") if a.verb != "delete" => Decision::Allow,
        (g, _) if custom_group(g) => Decision::Allow,
        _ => deny(a.resource),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(
        verb: &str,
        group: &str,
        resource: &str,
        ns: Option<&str>,
        name: Option<&str>,
    ) -> Decision {
        decide(&Access {
            node: "edge-1",
            verb,
            group,
            resource,
            namespace: ns,
            name,
        })
    }

    #[test]
    fn edges_read_widely_but_write_only_their_own() {
        assert_eq!(d("list", "", "services", None, None), Decision::Allow);
        assert_eq!(
            d("watch", "example.com", "widgets", None, None),
            Decision::Allow
        );
        assert!(matches!(
            d("get", "", "secrets", Some("a"), Some("s")),
            Decision::Deny(_)
        ));
        assert!(matches!(
            d("list", "", "configmaps", None, None),
            Decision::Deny(_)
        ));
        assert_eq!(d("list", "", "pods", None, None), Decision::AllowNodePods);
        assert_eq!(
            d("get", "", "pods", Some("a"), Some("p")),
            Decision::AllowIfPodOnNode
        );
        assert_eq!(
            d("create", "", "pods", Some("a"), None),
            Decision::AllowIfPodOnNode
        );
        assert_eq!(
            d("patch", "", "nodes", None, Some("edge-1")),
            Decision::Allow
        );
        assert!(matches!(
            d("patch", "", "nodes", None, Some("edge-2")),
            Decision::Deny(_)
        ));
        assert_eq!(
            d(
                "update",
                "coordination.k8s.io",
                "leases",
                Some("kube-node-lease"),
                Some("edge-1")
            ),
            Decision::Allow
        );
        assert!(matches!(
            d("create", "", "services", Some("a"), None),
            Decision::Deny(_)
        ));
        assert!(matches!(
            d("create", "apps", "deployments", Some("a"), None),
            Decision::Deny(_)
        ));
        assert_eq!(d("create", "", "events", Some("a"), None), Decision::Allow);
        assert_eq!(
            d("patch", "example.com", "widgets", Some("a"), Some("w")),
            Decision::Allow
        );
        assert!(matches!(
            d("delete", "", "secrets", Some("a"), Some("s")),
            Decision::Deny(_)
        ));
    }
}
