//! The registry of served kinds: group/version/resource, scope, names, verbs, subresources.
//!
//! Built-in kinds are fixed; custom resources are added when their CRD is established and
//! removed when it is deleted.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use serde_json::Value;

use super::lock::{read, write};

/// Rules an object's name must follow (matches the real validation per kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// RFC 1123 subdomain (most kinds).
    Subdomain,
    /// RFC 1123 label (namespaces, services).
    Label,
    /// RFC 1035 label (services: must start with a letter).
    Dns1035,
    /// Anything usable as a path segment (nodes allow subdomains; events allow more).
    PathSegment,
}

/// A printer column of a CRD (`additionalPrinterColumns`).
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub json_path: String,
    pub description: String,
    pub priority: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ResourceInfo {
    pub group: String,
    /// The version this entry is served at.
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Subresources served (`status`, `token`, `binding`, `finalize`, `approval`…).
    pub subresources: Vec<&'static str>,
    /// A custom resource (served from a CRD).
    pub custom: bool,
    pub printer_columns: Vec<PrinterColumn>,
    /// DELETE answers with the object instead of a Status (`ReturnDeletedObject` in the real registry).
    pub returns_deleted_object: bool,
    /// PUT of a missing object creates it (`AllowCreateOnUpdate`).
    pub allow_create_on_update: bool,
    /// PUT without metadata.resourceVersion is allowed (`AllowUnconditionalUpdate`).
    pub allow_unconditional_update: bool,
    /// metadata.generation is maintained (bumped on spec changes).
    pub tracks_generation: bool,
    pub name_rule: NameRule,
    /// Field selectors this kind accepts besides metadata.name / metadata.namespace.
    pub selectable_fields: Vec<String>,
    /// The structural schema of a custom resource version (pruning, defaulting, validation).
    pub schema: Option<Arc<Value>>,
}

impl ResourceInfo {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    pub fn has_subresource(&self, sub: &str) -> bool {
        self.subresources.contains(&sub)
    }

    pub fn has_status(&self) -> bool {
        self.has_subresource("status")
    }

    /// Storage identity: versions of one group/resource share one table.
    pub fn storage_key(&self) -> (String, String) {
        (self.group.clone(), self.plural.clone())
    }

    pub fn verbs(&self) -> Vec<&'static str> {
        vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }

    pub fn subresource_verbs(sub: &str) -> Vec<&'static str> {
        match sub {
            "status" | "scale" | "approval" => vec!["get", "patch", "update"],
            "finalize" => vec!["update"],
            "log" => vec!["get"],
            // Connecters (GET and POST).
            "exec" | "attach" | "portforward" => vec!["create", "get"],
            _ => vec!["create"],
        }
    }

    pub fn subresource_kind(&self, sub: &str) -> (String, String, String) {
        match sub {
            "token" => (
                "authentication.k8s.io".into(),
                "v1".into(),
                "TokenRequest".into(),
            ),
            "binding" => (String::new(), "v1".into(), "Binding".into()),
            "scale" => ("autoscaling".into(), "v1".into(), "Scale".into()),
            "exec" => (String::new(), "v1".into(), "PodExecOptions".into()),
            "attach" => (String::new(), "v1".into(), "PodAttachOptions".into()),
            "portforward" => (String::new(), "v1".into(), "PodPortForwardOptions".into()),
            _ => (self.group.clone(), self.version.clone(), self.kind.clone()),
        }
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    subs: &'static [&'static str],
    returns_deleted: bool,
    create_on_update: bool,
    name_rule: NameRule,
    fields: &'static [&'static str],
    categories: &'static [&'static str],
}

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];
const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

#[rustfmt::skip]
const BUILTINS: &[Builtin] = &[
    Builtin { group: "", version: "v1", plural: "namespaces", kind: "Namespace", namespaced: false, short: &["ns"], subs: &["status", "finalize"], returns_deleted: true, create_on_update: false, name_rule: NameRule::Label, fields: &["status.phase"], categories: &[] },
    Builtin { group: "", version: "v1", plural: "pods", kind: "Pod", namespaced: true, short: &["po"], subs: &["status", "binding", "log", "exec", "attach", "portforward"], returns_deleted: true, create_on_update: false, name_rule: NameRule::Subdomain, fields: POD_FIELDS, categories: &["all"] },
    Builtin { group: "", version: "v1", plural: "nodes", kind: "Node", namespaced: false, short: &["no"], subs: &["status"], returns_deleted: false, create_on_update: false, name_rule: NameRule::Subdomain, fields: &["spec.unschedulable"], categories: &[] },
    Builtin { group: "", version: "v1", plural: "configmaps", kind: "ConfigMap", namespaced: true, short: &["cm"], subs: &[], returns_deleted: false, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &[] },
    Builtin { group: "", version: "v1", plural: "secrets", kind: "Secret", namespaced: true, short: &[], subs: &[], returns_deleted: false, create_on_update: false, name_rule: NameRule::Subdomain, fields: &["type"], categories: &[] },
    Builtin { group: "", version: "v1", plural: "services", kind: "Service", namespaced: true, short: &["svc"], subs: &["status"], returns_deleted: true, create_on_update: false, name_rule: NameRule::Dns1035, fields: &["spec.clusterIP", "spec.type"], categories: &["all"] },
    Builtin { group: "", version: "v1", plural: "endpoints", kind: "Endpoints", namespaced: true, short: &["ep"], subs: &[], returns_deleted: false, create_on_update: true, name_rule: NameRule::Subdomain, fields: &[], categories: &[] },
    Builtin { group: "", version: "v1", plural: "events", kind: "Event", namespaced: true, short: &["ev"], subs: &[], returns_deleted: false, create_on_update: true, name_rule: NameRule::PathSegment, fields: EVENT_FIELDS, categories: &[] },
    Builtin { group: "", version: "v1", plural: "serviceaccounts", kind: "ServiceAccount", namespaced: true, short: &["sa"], subs: &["token"], returns_deleted: true, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &[] },
    Builtin { group: "", version: "v1", plural: "persistentvolumes", kind: "PersistentVolume", namespaced: false, short: &["pv"], subs: &["status"], returns_deleted: true, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &[] },
    Builtin { group: "", version: "v1", plural: "persistentvolumeclaims", kind: "PersistentVolumeClaim", namespaced: true, short: &["pvc"], subs: &["status"], returns_deleted: true, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &[] },
    Builtin { group: "coordination.k8s.io", version: "v1", plural: "leases", kind: "Lease", namespaced: true, short: &[], subs: &[], returns_deleted: false, create_on_update: true, name_rule: NameRule::Subdomain, fields: &[], categories: &[] },
    Builtin { group: "discovery.k8s.io", version: "v1", plural: "endpointslices", kind: "EndpointSlice", namespaced: true, short: &[], subs: &[], returns_deleted: false, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &[] },
    Builtin { group: "storage.k8s.io", version: "v1", plural: "volumeattachments", kind: "VolumeAttachment", namespaced: false, short: &[], subs: &["status"], returns_deleted: true, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &[] },
    Builtin { group: "storage.k8s.io", version: "v1", plural: "storageclasses", kind: "StorageClass", namespaced: false, short: &["sc"], subs: &[], returns_deleted: true, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &[] },
    Builtin { group: "storage.k8s.io", version: "v1", plural: "csinodes", kind: "CSINode", namespaced: false, short: &[], subs: &[], returns_deleted: true, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &[] },
    Builtin { group: "storage.k8s.io", version: "v1", plural: "csidrivers", kind: "CSIDriver", namespaced: false, short: &[], subs: &[], returns_deleted: true, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &[] },
    Builtin { group: "rbac.authorization.k8s.io", version: "v1", plural: "clusterroles", kind: "ClusterRole", namespaced: false, short: &[], subs: &[], returns_deleted: false, create_on_update: true, name_rule: NameRule::PathSegment, fields: &[], categories: &[] },
    Builtin { group: "rbac.authorization.k8s.io", version: "v1", plural: "clusterrolebindings", kind: "ClusterRoleBinding", namespaced: false, short: &[], subs: &[], returns_deleted: false, create_on_update: true, name_rule: NameRule::PathSegment, fields: &[], categories: &[] },
    Builtin { group: "rbac.authorization.k8s.io", version: "v1", plural: "roles", kind: "Role", namespaced: true, short: &[], subs: &[], returns_deleted: false, create_on_update: true, name_rule: NameRule::PathSegment, fields: &[], categories: &[] },
    Builtin { group: "rbac.authorization.k8s.io", version: "v1", plural: "rolebindings", kind: "RoleBinding", namespaced: true, short: &[], subs: &[], returns_deleted: false, create_on_update: true, name_rule: NameRule::PathSegment, fields: &[], categories: &[] },
    Builtin { group: "apps", version: "v1", plural: "deployments", kind: "Deployment", namespaced: true, short: &["deploy"], subs: &["status", "scale"], returns_deleted: false, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &["all"] },
    Builtin { group: "apps", version: "v1", plural: "replicasets", kind: "ReplicaSet", namespaced: true, short: &["rs"], subs: &["status", "scale"], returns_deleted: false, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &["all"] },
    Builtin { group: "apps", version: "v1", plural: "daemonsets", kind: "DaemonSet", namespaced: true, short: &["ds"], subs: &["status"], returns_deleted: false, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &["all"] },
    Builtin { group: "apps", version: "v1", plural: "statefulsets", kind: "StatefulSet", namespaced: true, short: &["sts"], subs: &["status", "scale"], returns_deleted: false, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &["all"] },
    Builtin { group: "apps", version: "v1", plural: "controllerrevisions", kind: "ControllerRevision", namespaced: true, short: &[], subs: &[], returns_deleted: false, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &[] },
    Builtin { group: "batch", version: "v1", plural: "jobs", kind: "Job", namespaced: true, short: &[], subs: &["status"], returns_deleted: false, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &["all"] },
    Builtin { group: "certificates.k8s.io", version: "v1", plural: "certificatesigningrequests", kind: "CertificateSigningRequest", namespaced: false, short: &["csr"], subs: &["status", "approval"], returns_deleted: false, create_on_update: false, name_rule: NameRule::PathSegment, fields: &["spec.signerName"], categories: &[] },
    Builtin { group: "apiextensions.k8s.io", version: "v1", plural: "customresourcedefinitions", kind: "CustomResourceDefinition", namespaced: false, short: &["crd", "crds"], subs: &["status"], returns_deleted: false, create_on_update: false, name_rule: NameRule::Subdomain, fields: &[], categories: &["api-extensions"] },
];

fn builtin_info(b: &Builtin) -> ResourceInfo {
    ResourceInfo {
        group: b.group.into(),
        version: b.version.into(),
        plural: b.plural.into(),
        singular: b.kind.to_lowercase(),
        kind: b.kind.into(),
        namespaced: b.namespaced,
        short_names: b.short.iter().map(|s| s.to_string()).collect(),
        categories: b.categories.iter().map(|s| s.to_string()).collect(),
        subresources: b.subs.to_vec(),
        custom: false,
        printer_columns: Vec::new(),
        returns_deleted_object: b.returns_deleted,
        allow_create_on_update: b.create_on_update,
        allow_unconditional_update: b.kind != "CustomResourceDefinition",
        tracks_generation: matches!(
            b.kind,
            "CustomResourceDefinition"
                | "Deployment"
                | "ReplicaSet"
                | "DaemonSet"
                | "StatefulSet"
                | "Job"
        ),
        name_rule: b.name_rule,
        selectable_fields: b.fields.iter().map(|s| s.to_string()).collect(),
        schema: None,
    }
}

/// All served kinds. Cheap to clone entries (`Arc`).
pub struct Registry {
    inner: RwLock<RegistryInner>,
}

#[derive(Default)]
struct RegistryInner {
    /// In discovery order.
    all: Vec<Arc<ResourceInfo>>,
    /// (group, version, plural) -> entry
    by_gvr: HashMap<(String, String, String), Arc<ResourceInfo>>,
    /// Bumped on every change, for discovery caches.
    generation: u64,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    pub fn new() -> Self {
        let reg = Self {
            inner: RwLock::new(RegistryInner::default()),
        };
        {
            let mut inner = write(&reg.inner);
            for b in BUILTINS {
                let info = Arc::new(builtin_info(b));
                inner.by_gvr.insert(
                    (
                        info.group.clone(),
                        info.version.clone(),
                        info.plural.clone(),
                    ),
                    info.clone(),
                );
                inner.all.push(info);
            }
        }
        reg
    }

    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceInfo>> {
        read(&self.inner)
            .by_gvr
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .cloned()
    }

    /// The preferred (first registered) version of a group/resource.
    pub fn lookup_any_version(&self, group: &str, plural: &str) -> Option<Arc<ResourceInfo>> {
        read(&self.inner)
            .all
            .iter()
            .find(|i| i.group == group && i.plural == plural)
            .cloned()
    }

    pub fn all(&self) -> Vec<Arc<ResourceInfo>> {
        read(&self.inner).all.clone()
    }

    pub fn generation(&self) -> u64 {
        read(&self.inner).generation
    }

    /// Groups in discovery order with their versions in preference order.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let inner = read(&self.inner);
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for info in &inner.all {
            match out.iter_mut().find(|(g, _)| *g == info.group) {
                Some((_, versions)) => {
                    if !versions.contains(&info.version) {
                        versions.push(info.version.clone());
                    }
                }
                None => out.push((info.group.clone(), vec![info.version.clone()])),
            }
        }
        out
    }

    pub fn group_served(&self, group: &str, version: &str) -> bool {
        read(&self.inner)
            .all
            .iter()
            .any(|i| i.group == group && i.version == version)
    }

    /// Registers (or re-registers) the versions a CRD serves. Returns the previous entries.
    pub fn set_custom(&self, group: &str, plural: &str, entries: Vec<ResourceInfo>) {
        let mut inner = write(&self.inner);
        inner
            .all
            .retain(|i| !(i.custom && i.group == group && i.plural == plural));
        inner
            .by_gvr
            .retain(|(g, _, p), i| !(i.custom && g == group && p == plural));
        for e in entries {
            let e = Arc::new(e);
            inner.by_gvr.insert(
                (e.group.clone(), e.version.clone(), e.plural.clone()),
                e.clone(),
            );
            inner.all.push(e);
        }
        inner.generation += 1;
    }

    /// True when a built-in kind already owns this group/resource (a CRD may not shadow it).
    pub fn is_builtin(&self, group: &str, plural: &str) -> bool {
        read(&self.inner)
            .all
            .iter()
            .any(|i| !i.custom && i.group == group && i.plural == plural)
    }
}

/// Builds the served entries for a CRD object (one per served version).
pub fn crd_entries(crd: &Value) -> Vec<ResourceInfo> {
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default().to_string();
    let names = &spec["names"];
    let plural = names["plural"].as_str().unwrap_or_default().to_string();
    let kind = names["kind"].as_str().unwrap_or_default().to_string();
    let singular = names["singular"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let short_names = strings(&names["shortNames"]);
    let categories = strings(&names["categories"]);
    let namespaced = spec["scope"].as_str() != Some("Cluster");
    let mut out = Vec::new();
    for v in spec["versions"].as_array().into_iter().flatten() {
        if v["served"].as_bool() == Some(false) {
            continue;
        }
        let Some(version) = v["name"].as_str() else {
            continue;
        };
        let mut subresources = Vec::new();
        if v["subresources"]["status"].is_object() {
            subresources.push("status");
        }
        let printer_columns = v["additionalPrinterColumns"]
            .as_array()
            .map(|cols| {
                cols.iter()
                    .filter_map(|c| {
                        Some(PrinterColumn {
                            name: c["name"].as_str()?.to_string(),
                            type_: c["type"].as_str().unwrap_or("string").to_string(),
                            json_path: c["jsonPath"].as_str()?.to_string(),
                            description: c["description"].as_str().unwrap_or("").to_string(),
                            priority: c["priority"].as_i64().unwrap_or(0),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let selectable_fields = v["selectableFields"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|f| {
                        f["jsonPath"]
                            .as_str()
                            .map(|p| p.trim_start_matches('.').to_string())
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(ResourceInfo {
            group: group.clone(),
            version: version.to_string(),
            plural: plural.clone(),
            singular: singular.clone(),
            kind: kind.clone(),
            namespaced,
            short_names: short_names.clone(),
            categories: categories.clone(),
            subresources,
            custom: true,
            printer_columns,
            returns_deleted_object: false,
            allow_create_on_update: false,
            allow_unconditional_update: false,
            tracks_generation: true,
            name_rule: NameRule::Subdomain,
            selectable_fields,
            schema: Some(Arc::new(
                super::schema::of_version(v).unwrap_or_else(super::schema::permissive),
            )),
        });
    }
    // The storage version is served first (preferred), as the real discovery orders by priority.
    out.sort_by_key(|e| {
        let storage = spec["versions"]
            .as_array()
            .and_then(|vs| {
                vs.iter()
                    .find(|v| v["storage"].as_bool() == Some(true))
                    .and_then(|v| v["name"].as_str())
            })
            .unwrap_or_default()
            == e.version;
        !storage
    });
    out
}
