//! Resource strings (protocol §1.5): `<namespace>/<type>[/<name>]`, `null` as the namespace of
//! cluster-scoped objects. (KubeEdge's cloud glues `node/<node>/` in front between its own
//! modules; here the node travels beside the parsed path, never inside it.)

pub use crate::resource_type::ResourceType;
use std::fmt;

/// Namespace token used for cluster-scoped objects.
pub const CLUSTER_SCOPE_TOKEN: &str = "null";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    #[error("empty resource path")]
    Empty,
    #[error("resource path {0:?} has an empty segment")]
    EmptySegment(String),
    #[error("resource path {0:?} needs at least <namespace>/<type>")]
    TooShort(String),
}

/// A parsed resource path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourcePath {
    /// `None` for cluster-scoped objects (the `null` token).
    pub namespace: Option<String>,
    pub resource_type: ResourceType,
    /// `None` for a list path (`<ns>/<type>`). May contain `/` (KubeEdge joins the rest).
    pub name: Option<String>,
}

impl ResourcePath {
    pub fn new(namespace: Option<&str>, resource_type: &str, name: Option<&str>) -> Self {
        ResourcePath {
            namespace: namespace.map(str::to_string),
            resource_type: ResourceType::parse(resource_type),
            name: name.map(str::to_string),
        }
    }

    /// The path of one object (`null` namespace for cluster-scoped ones).
    pub fn object(namespace: Option<&str>, resource_type: ResourceType, name: &str) -> Self {
        ResourcePath {
            namespace: namespace.map(str::to_string),
            resource_type,
            name: Some(name.to_string()),
        }
    }

    /// Parses the wire form `<ns>/<type>[/<name>]`.
    pub fn parse(s: &str) -> Result<Self, ResourceError> {
        let tokens = split(s)?;
        Self::from_tokens(s, &tokens)
    }

    fn from_tokens(s: &str, tokens: &[&str]) -> Result<Self, ResourceError> {
        if tokens.len() < 2 {
            return Err(ResourceError::TooShort(s.to_string()));
        }
        let namespace = (tokens[0] != CLUSTER_SCOPE_TOKEN).then(|| tokens[0].to_string());
        let name = (tokens.len() > 2).then(|| tokens[2..].join("/"));
        Ok(ResourcePath {
            namespace,
            resource_type: ResourceType::parse(tokens[1]),
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
}

/// A message's resource from a path: `Message::new(…, &path, …)`.
impl From<&ResourcePath> for String {
    fn from(p: &ResourcePath) -> String {
        p.to_wire()
    }
}

impl From<ResourcePath> for String {
    fn from(p: ResourcePath) -> String {
        p.to_wire()
    }
}

impl fmt::Display for ResourcePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_wire())
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

/// The type token of a resource string.
pub fn resource_type_of(resource: &str) -> Option<&str> {
    resource.split('/').nth(1).filter(|t| !t.is_empty())
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
    fn the_type_token_is_read_and_typed() {
        assert_eq!(resource_type_of("default/configmap/c"), Some("configmap"));
        assert_eq!(resource_type_of("default"), None);
        let p = ResourcePath::parse("default/nodepatch/edge-1").unwrap();
        assert_eq!(p.resource_type, ResourceType::NodePatch);
        let odd = ResourcePath::parse("default/widget/w").unwrap();
        assert_eq!(odd.resource_type, ResourceType::Other("widget".into()));
        assert_eq!(odd.to_wire(), "default/widget/w");
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
            let _ = resource_type_of(&s);
        }

        #[test]
        fn wire_round_trip(
            ns in proptest::option::of("[a-z0-9-]{1,12}"),
            ty in "[a-z]{1,12}",
            name in proptest::option::of("[a-z0-9.-]{1,20}"),
        ) {
            prop_assume!(ns.as_deref() != Some("null"));
            let p = ResourcePath::new(ns.as_deref(), &ty, name.as_deref());
            prop_assert_eq!(ResourcePath::parse(&p.to_wire()).unwrap(), p.clone());
            prop_assert_eq!(p.resource_type.as_str(), ty.as_str());
        }
    }
}
