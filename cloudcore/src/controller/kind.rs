//! The cloud's one vocabulary of API-server kinds: every kind a controller reads, watches or
//! writes, with its group, version, plural and scope. The wire's resource-type tokens are
//! [`kubeedge_shared::ResourceType`]; [`Kind::of_resource_type`] maps between the two.

use kube::api::ApiResource;
use kubeedge_shared::ResourceType;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Node,
    Pod,
    ConfigMap,
    Secret,
    ServiceAccount,
    PersistentVolume,
    PersistentVolumeClaim,
    VolumeAttachment,
    Lease,
    Event,
    Service,
    Endpoints,
    EndpointSlice,
    CertificateSigningRequest,
    Role,
    RoleBinding,
    ClusterRole,
    ClusterRoleBinding,
    /// KubeEdge's `devices.kubeedge.io` Device.
    Device,
    DeviceModel,
    /// KubeEdge v1.23's DeviceStatus (a Device's reported state, owned by it).
    DeviceStatus,
    /// The router's `rules.kubeedge.io` Rule.
    Rule,
    RuleEndpoint,
    /// `reliablesyncs.kubeedge.io`: what a KubeEdge edge holds.
    ObjectSync,
    ClusterObjectSync,
    /// `operations.kubeedge.io` node jobs.
    ImagePrePullJob,
    ConfigUpdateJob,
    NodeUpgradeJob,
}

impl Kind {
    /// The resource as the apiserver names it in messages (`endpointslices.discovery.k8s.io`).
    pub fn qualified_resource(self) -> String {
        let (api_version, _) = self.type_meta();
        match api_version.rsplit_once('/') {
            Some((group, _)) => format!("{}.{group}", self.plural()),
            None => self.plural().to_string(),
        }
    }

    /// The resource as kube's dynamic API describes it.
    pub fn api_resource(self) -> ApiResource {
        let (api_version, kind) = self.type_meta();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: api_version.into(),
            kind: kind.into(),
            plural: self.plural().into(),
        }
    }

    /// The resource's plural name, as in its REST path.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Node => "nodes",
            Kind::Pod => "pods",
            Kind::ConfigMap => "configmaps",
            Kind::Secret => "secrets",
            Kind::ServiceAccount => "serviceaccounts",
            Kind::PersistentVolume => "persistentvolumes",
            Kind::PersistentVolumeClaim => "persistentvolumeclaims",
            Kind::VolumeAttachment => "volumeattachments",
            Kind::Lease => "leases",
            Kind::Event => "events",
            Kind::Service => "services",
            Kind::Endpoints => "endpoints",
            Kind::EndpointSlice => "endpointslices",
            Kind::CertificateSigningRequest => "certificatesigningrequests",
            Kind::Role => "roles",
            Kind::RoleBinding => "rolebindings",
            Kind::ClusterRole => "clusterroles",
            Kind::ClusterRoleBinding => "clusterrolebindings",
            Kind::Device => "devices",
            Kind::DeviceModel => "devicemodels",
            Kind::DeviceStatus => "devicestatuses",
            Kind::Rule => "rules",
            Kind::RuleEndpoint => "ruleendpoints",
            Kind::ObjectSync => "objectsyncs",
            Kind::ClusterObjectSync => "clusterobjectsyncs",
            Kind::ImagePrePullJob => "imageprepulljobs",
            Kind::ConfigUpdateJob => "configupdatejobs",
            Kind::NodeUpgradeJob => "nodeupgradejobs",
        }
    }

    pub fn namespaced(self) -> bool {
        !matches!(
            self,
            Kind::Node
                | Kind::PersistentVolume
                | Kind::VolumeAttachment
                | Kind::CertificateSigningRequest
                | Kind::ClusterRole
                | Kind::ClusterRoleBinding
                | Kind::ClusterObjectSync
                | Kind::ImagePrePullJob
                | Kind::ConfigUpdateJob
                | Kind::NodeUpgradeJob
        )
    }

    /// The kind of an object sent to or asked for by an edge under this resource type (the
    /// kinds an edge reaches through the upstream controller's REST calls; devices travel
    /// through the device controller instead).
    pub fn of_resource_type(t: &ResourceType) -> Option<Kind> {
        use ResourceType as RT;
        Some(match t {
            RT::Node => Kind::Node,
            RT::Pod => Kind::Pod,
            RT::ConfigMap => Kind::ConfigMap,
            RT::Secret => Kind::Secret,
            RT::PersistentVolume => Kind::PersistentVolume,
            RT::PersistentVolumeClaim => Kind::PersistentVolumeClaim,
            RT::VolumeAttachment => Kind::VolumeAttachment,
            RT::Lease => Kind::Lease,
            RT::Event => Kind::Event,
            RT::Service => Kind::Service,
            RT::Endpoints => Kind::Endpoints,
            RT::EndpointSlice => Kind::EndpointSlice,
            _ => return None,
        })
    }

    /// `apiVersion` and `kind` stamped on objects sent to the edge.
    pub fn type_meta(self) -> (&'static str, &'static str) {
        const DEVICES: &str = kubeedge_shared::devices::API_VERSION;
        const RBAC: &str = "rbac.authorization.k8s.io/v1";
        const RULES: &str = "rules.kubeedge.io/v1";
        const SYNCS: &str = "reliablesyncs.kubeedge.io/v1alpha1";
        const JOBS: &str = kubeedge_shared::nodetask::API_VERSION;
        match self {
            Kind::Node => ("v1", "Node"),
            Kind::Pod => ("v1", "Pod"),
            Kind::ConfigMap => ("v1", "ConfigMap"),
            Kind::Secret => ("v1", "Secret"),
            Kind::ServiceAccount => ("v1", "ServiceAccount"),
            Kind::PersistentVolume => ("v1", "PersistentVolume"),
            Kind::PersistentVolumeClaim => ("v1", "PersistentVolumeClaim"),
            Kind::VolumeAttachment => ("storage.k8s.io/v1", "VolumeAttachment"),
            Kind::Lease => ("coordination.k8s.io/v1", "Lease"),
            Kind::Event => ("v1", "Event"),
            Kind::Service => ("v1", "Service"),
            Kind::Endpoints => ("v1", "Endpoints"),
            Kind::EndpointSlice => ("discovery.k8s.io/v1", "EndpointSlice"),
            Kind::CertificateSigningRequest => {
                ("certificates.k8s.io/v1", "CertificateSigningRequest")
            }
            Kind::Role => (RBAC, "Role"),
            Kind::RoleBinding => (RBAC, "RoleBinding"),
            Kind::ClusterRole => (RBAC, "ClusterRole"),
            Kind::ClusterRoleBinding => (RBAC, "ClusterRoleBinding"),
            Kind::Device => (DEVICES, "Device"),
            Kind::DeviceModel => (DEVICES, "DeviceModel"),
            Kind::DeviceStatus => (DEVICES, "DeviceStatus"),
            Kind::Rule => (RULES, "Rule"),
            Kind::RuleEndpoint => (RULES, "RuleEndpoint"),
            Kind::ObjectSync => (SYNCS, "ObjectSync"),
            Kind::ClusterObjectSync => (SYNCS, "ClusterObjectSync"),
            Kind::ImagePrePullJob => (JOBS, "ImagePrePullJob"),
            Kind::ConfigUpdateJob => (JOBS, "ConfigUpdateJob"),
            Kind::NodeUpgradeJob => (JOBS, "NodeUpgradeJob"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_name_their_group_version_plural_and_scope() {
        let slice = Kind::EndpointSlice.api_resource();
        assert_eq!(
            (
                slice.group.as_str(),
                slice.version.as_str(),
                slice.plural.as_str()
            ),
            ("discovery.k8s.io", "v1", "endpointslices")
        );
        assert_eq!(Kind::Pod.api_resource().group, "");
        assert_eq!(Kind::Pod.qualified_resource(), "pods");
        assert_eq!(
            Kind::ClusterRoleBinding.qualified_resource(),
            "clusterrolebindings.rbac.authorization.k8s.io"
        );
        let status = Kind::DeviceStatus.api_resource();
        assert_eq!(status.api_version, kubeedge_shared::devices::API_VERSION);
        assert_eq!(status.plural, "devicestatuses");
        assert!(Kind::Role.namespaced() && !Kind::ClusterRole.namespaced());
        assert!(Kind::Device.namespaced() && !Kind::Node.namespaced());
        let job = Kind::NodeUpgradeJob.api_resource();
        assert_eq!(
            (job.group.as_str(), job.version.as_str(), job.kind.as_str()),
            ("operations.kubeedge.io", "v1alpha2", "NodeUpgradeJob")
        );
        assert!(!Kind::NodeUpgradeJob.namespaced() && !Kind::ClusterObjectSync.namespaced());
        assert_eq!(
            Kind::ObjectSync.qualified_resource(),
            "objectsyncs.reliablesyncs.kubeedge.io"
        );
        assert_eq!(
            Kind::Rule.api_resource().api_version,
            "rules.kubeedge.io/v1"
        );
        assert_eq!(Kind::of_resource_type(&ResourceType::Pod), Some(Kind::Pod));
        assert_eq!(Kind::of_resource_type(&ResourceType::Device), None);
    }
}
