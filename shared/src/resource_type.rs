//! The resource-type token of a resource path (protocol §1.4): one vocabulary for both sides.
//! A peer may send any token; the ones neither side knows are kept as [`ResourceType::Other`]
//! and are labelled `other` in metrics, so a peer cannot grow a metric family.

use std::fmt;

macro_rules! resource_types {
    ($($variant:ident => $token:literal,)*) => {
        /// A resource type token.
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum ResourceType {
            $($variant,)*
            /// A token this program does not know (kept as sent).
            Other(String),
        }

        impl ResourceType {
            /// Every known type.
            pub const KNOWN: &[ResourceType] = &[$(ResourceType::$variant,)*];

            /// The token as on the wire.
            pub fn as_str(&self) -> &str {
                match self {
                    $(ResourceType::$variant => $token,)*
                    ResourceType::Other(s) => s,
                }
            }

            /// The token, for a metric label: a known token, or `other`.
            pub fn metric_label(&self) -> &'static str {
                match self {
                    $(ResourceType::$variant => $token,)*
                    ResourceType::Other(_) => "other",
                }
            }

            /// Parses a token (never fails: unknown ones are [`ResourceType::Other`]).
            pub fn parse(token: &str) -> ResourceType {
                match token {
                    $($token => ResourceType::$variant,)*
                    other => ResourceType::Other(other.to_string()),
                }
            }
        }
    };
}

resource_types! {
    Pod => "pod",
    PodList => "podlist",
    PodStatus => "podstatus",
    PodPatch => "podpatch",
    Node => "node",
    NodeStatus => "nodestatus",
    NodePatch => "nodepatch",
    ConfigMap => "configmap",
    Secret => "secret",
    ServiceAccountToken => "serviceaccounttoken",
    ServiceAccountAccess => "serviceaccountaccess",
    PersistentVolume => "persistentvolume",
    PersistentVolumeClaim => "persistentvolumeclaim",
    VolumeAttachment => "volumeattachment",
    Lease => "lease",
    Event => "event",
    Service => "service",
    ServiceList => "servicelist",
    Endpoints => "endpoints",
    EndpointsList => "endpointslist",
    EndpointSlice => "endpointslice",
    Rule => "rule",
    RuleEndpoint => "ruleendpoint",
    Device => "device",
    DeviceModel => "devicemodel",
    Membership => "membership",
    Twin => "twin",
    Inventory => "inventory",
    CertificateSigningRequest => "certificatesigningrequest",
    // `k8s/ca.crt`: the edge asks for the cluster CA (KubeEdge v1.17 MetaServer).
    KubeCa => "ca.crt",
}

impl ResourceType {
    /// Edge-originated requests and status fragments rather than objects the cloud keeps in
    /// sync: not mirrored into `meta_v2` and not listed in an inventory.
    pub fn is_request(&self) -> bool {
        matches!(
            self,
            ResourceType::PodPatch
                | ResourceType::NodePatch
                | ResourceType::PodStatus
                | ResourceType::NodeStatus
                | ResourceType::ServiceAccountToken
                | ResourceType::CertificateSigningRequest
                | ResourceType::KubeCa
        )
    }
}

impl fmt::Display for ResourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for ResourceType {
    fn from(token: &str) -> Self {
        ResourceType::parse(token)
    }
}

impl From<String> for ResourceType {
    fn from(token: String) -> Self {
        ResourceType::parse(&token)
    }
}

impl PartialEq<str> for ResourceType {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ResourceType {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// The two kinds of object a pod references and the edge keeps: the cloud sends them only to
/// the nodes whose pods use them, edged caches and mounts them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ConfigKind {
    ConfigMap,
    Secret,
}

impl ConfigKind {
    pub const ALL: [ConfigKind; 2] = [ConfigKind::ConfigMap, ConfigKind::Secret];

    pub fn resource_type(self) -> ResourceType {
        match self {
            ConfigKind::ConfigMap => ResourceType::ConfigMap,
            ConfigKind::Secret => ResourceType::Secret,
        }
    }

    /// The resource type token on the wire.
    pub fn type_token(self) -> &'static str {
        self.resource_type().metric_label()
    }

    pub fn of(t: &ResourceType) -> Option<ConfigKind> {
        ConfigKind::ALL
            .into_iter()
            .find(|k| k.resource_type() == *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_unknown_ones_are_kept_but_labelled_other() {
        for t in ResourceType::KNOWN {
            assert_eq!(&ResourceType::parse(t.as_str()), t);
            assert_eq!(t.metric_label(), t.as_str());
        }
        let odd = ResourceType::parse("my-crd-kind");
        assert_eq!(odd, ResourceType::Other("my-crd-kind".into()));
        assert_eq!(odd.as_str(), "my-crd-kind");
        assert_eq!(odd.metric_label(), "other");
        assert_eq!(ResourceType::Pod, "pod");
        assert!(ResourceType::PodPatch.is_request() && !ResourceType::Pod.is_request());
    }
}
