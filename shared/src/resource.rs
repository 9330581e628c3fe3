//! Resource strings (reference §1.5): `<namespace>/<type>[/<name>]` on the wire,
//! `node/<node>/<namespace>/<type>[/<name>]` between cloud modules, `null` as the namespace of
//! cluster-scoped objects.

use std::fmt;

/// Namespace token used for cluster-scoped objects.
pub const CLUSTER_SCOPE_TOKEN: &str = "null";
const NODE_PREFIX: &str = "node";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    #[error("empty resource path")]
    Empty,
    #[error("resource path {0:?} has an empty segment")]
    EmptySegment(String),
    #[error("resource path {0:?} needs at least <namespace>/<type>")]
    TooShort(String),
    #[error("resource path {0:?} lacks the node/<name>/ prefix of a cloud-internal resource")]
    MissingNodePrefix(String),
}

/// A parsed resource path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourcePath {
    /// Node name of a cloud-internal path; `None` on the wire.
    pub node: Option<String>,
    /// `None` for cluster-scoped objects (the `null` token).
    pub namespace: Option<String>,
    pub resource_type: String,
    /// `None` for a list path (`<ns>/<type>`). May contain `/` (KubeEdge joins the rest).
    pub name: Option<String>,
}

impl ResourcePath {
    pub fn new(namespace: Option<&str>, resource_type: &str, name: Option<&str>) -> Self {
        ResourcePath {
            node: None,
            namespace: namespace.map(str::to_string),
            resource_type: resource_type.to_string(),
            name: name.map(str::to_string),
        }
    }

    /// Parses the wire form `<ns>/<type>[/<name>]`.
    pub fn parse(s: &str) -> Result<Self, ResourceError> {
        let tokens = split(s)?;
        Self::from_tokens(s, &tokens, None)
    }

    /// Parses the cloud-internal form `node/<node>/<ns>/<type>[/<name>]`.
    pub fn parse_internal(s: &str) -> Result<Self, ResourceError> {
        let tokens = split(s)?;
        if tokens.len() < 4 || tokens[0] != NODE_PREFIX {
            return Err(ResourceError::MissingNodePrefix(s.to_string()));
        }
        Self::from_tokens(s, &tokens[2..], Some(tokens[1]))
    }

    fn from_tokens(s: &str, tokens: &[&str], node: Option<&str>) -> Result<Self, ResourceError> {
        if tokens.len() < 2 {
            return Err(ResourceError::TooShort(s.to_string()));
        }
        let namespace = (tokens[0] != CLUSTER_SCOPE_TOKEN).then(|| tokens[0].to_string());
        let name = (tokens.len() > 2).then(|| tokens[2..].join("/"));
        Ok(ResourcePath {
            node: node.map(str::to_string),
            namespace,
            resource_type: tokens[1].to_string(),
            name,
        })
    }

    pub fn namespace_token(&self) -> &str {
        self.namespace.as_deref().unwrap_or(CLUSTER_SCOPE_TOKEN)
    }

    /// The wire form, without any node prefix.
    pub fn to_wire(&self) -> String {
        let mut s = format!("{}/{}", self.namespace_token(), self.resource_type);
        if let Some(name) = &self.name {
            s.push('/');
            s.push_str(name);
        }
        s
    }

    /// The cloud-internal form for `node`.
    pub fn to_internal(&self, node: &str) -> String {
        format!("{NODE_PREFIX}/{node}/{}", self.to_wire())
    }
}

impl fmt::Display for ResourcePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.node {
            Some(node) => f.write_str(&self.to_internal(node)),
            None => f.write_str(&self.to_wire()),
        }
    }
}

fn split(s: &str) -> Result<Vec<&str>, ResourceError> {
    if s.is_empty() {
        return Err(ResourceError::Empty);
    }
    let tokens: Vec<&str> = s.split('/').collect();
    if tokens.iter().any(|t| t.is_empty()) {
        return Err(ResourceError::EmptySegment(s.to_string()));
    }
    Ok(tokens)
}

/// cloudhub's `TrimMessage`: strip `node/<node>/` from a resource with at least three tokens.
pub fn trim_node_prefix(resource: &str) -> &str {
    if let Some(rest) = resource.strip_prefix("node/")
        && let Some((_, tail)) = rest.split_once('/')
        && !tail.is_empty()
    {
        return tail;
    }
    resource
}

/// cloudhub's `PubToController`: prepend `node/<node>/` to an upstream resource.
pub fn add_node_prefix(node: &str, resource: &str) -> String {
    format!("{NODE_PREFIX}/{node}/{resource}")
}

/// The node of a cloud-internal resource: the token after the first `node` token.
pub fn node_of(resource: &str) -> Option<&str> {
    let mut tokens = resource.split('/');
    tokens.by_ref().find(|t| *t == NODE_PREFIX)?;
    tokens.next().filter(|t| !t.is_empty())
}

/// The type token of a wire or cloud-internal resource string.
pub fn resource_type_of(resource: &str) -> Option<&str> {
    let trimmed = trim_node_prefix(resource);
    trimmed.split('/').nth(1).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wire_paths_parse() {
        let p = ResourcePath::parse("default/pod/nginx").unwrap();
        assert_eq!(p.namespace.as_deref(), Some("default"));
        assert_eq!(p.resource_type, "pod");
        assert_eq!(p.name.as_deref(), Some("nginx"));
        let list = ResourcePath::parse("default/pod").unwrap();
        assert_eq!(list.name, None);
        let pv = ResourcePath::parse("null/persistentvolume/pv1").unwrap();
        assert_eq!(pv.namespace, None);
        assert_eq!(pv.to_wire(), "null/persistentvolume/pv1");
    }

    #[test]
    fn internal_paths_parse_and_trim() {
        let p = ResourcePath::parse_internal("node/edge-1/default/nodepatch/edge-1").unwrap();
        assert_eq!(p.node.as_deref(), Some("edge-1"));
        assert_eq!(p.resource_type, "nodepatch");
        assert_eq!(
            trim_node_prefix("node/edge-1/default/pod/a"),
            "default/pod/a"
        );
        assert_eq!(trim_node_prefix("node"), "node");
        assert_eq!(trim_node_prefix("node/edge-1"), "node/edge-1");
        assert_eq!(node_of("node/edge-1/default/pod/a"), Some("edge-1"));
        assert_eq!(
            resource_type_of("node/e/default/configmap/c"),
            Some("configmap")
        );
        assert_eq!(resource_type_of("default/configmap/c"), Some("configmap"));
        assert!(matches!(
            ResourcePath::parse_internal("default/pod/a"),
            Err(ResourceError::MissingNodePrefix(_))
        ));
    }

    #[test]
    fn malformed_paths_are_errors() {
        assert_eq!(ResourcePath::parse(""), Err(ResourceError::Empty));
        assert!(matches!(
            ResourcePath::parse("pod"),
            Err(ResourceError::TooShort(_))
        ));
        assert!(matches!(
            ResourcePath::parse("default//x"),
            Err(ResourceError::EmptySegment(_))
        ));
        assert!(matches!(
            ResourcePath::parse("/pod/x"),
            Err(ResourceError::EmptySegment(_))
        ));
    }

    #[test]
    fn names_may_contain_slashes() {
        let p = ResourcePath::parse("ns/serviceaccounttoken/a/b").unwrap();
        assert_eq!(p.name.as_deref(), Some("a/b"));
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".{0,64}") {
            let _ = ResourcePath::parse(&s);
            let _ = ResourcePath::parse_internal(&s);
            let _ = trim_node_prefix(&s);
            let _ = node_of(&s);
        }

        #[test]
        fn wire_round_trip(
            ns in proptest::option::of("[a-z0-9-]{1,12}"),
            ty in "[a-z]{1,12}",
            name in proptest::option::of("[a-z0-9.-]{1,20}"),
            node in "[a-z0-9-]{1,12}",
        ) {
            prop_assume!(ns.as_deref() != Some("null"));
            let p = ResourcePath::new(ns.as_deref(), &ty, name.as_deref());
            prop_assert_eq!(ResourcePath::parse(&p.to_wire()).unwrap(), p.clone());
            let internal = p.to_internal(&node);
            let back = ResourcePath::parse_internal(&internal).unwrap();
            prop_assert_eq!(back.node.as_deref(), Some(node.as_str()));
            prop_assert_eq!(trim_node_prefix(&internal), p.to_wire());
        }
    }
}
