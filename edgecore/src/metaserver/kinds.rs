//! The resources the MetaServer knows: the kinds an edge holds (always served from its
//! database), the kinds it caches from the cloud on demand, and whatever else `meta_v2` holds
//! (custom resources). Discovery documents are built from this list.

use serde_json::{Value, json};

/// A served resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kind {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    /// Objects of this kind reach the edge without asking (the cloud sends them).
    pub held: bool,
}

/// (group, version, plural, kind, namespaced, short names, held).
type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static [&'static str],
    bool,
);

const BUILTIN: &[Builtin] = &[
    ("", "v1", "pods", "Pod", true, &["po"], true),
    ("", "v1", "configmaps", "ConfigMap", true, &["cm"], true),
    ("", "v1", "secrets", "Secret", true, &[], true),
    ("", "v1", "nodes", "Node", false, &["no"], true),
    ("", "v1", "services", "Service", true, &["svc"], false),
    ("", "v1", "endpoints", "Endpoints", true, &["ep"], false),
    ("", "v1", "namespaces", "Namespace", false, &["ns"], false),
    ("", "v1", "events", "Event", true, &["ev"], false),
    (
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        true,
        &["sa"],
        false,
    ),
    (
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
        true,
    ),
    (
        "",
        "v1",
        "persistentvolumes",
        "PersistentVolume",
        false,
        &["pv"],
        true,
    ),
    (
        "coordination.k8s.io",
        "v1",
        "leases",
        "Lease",
        true,
        &[],
        true,
    ),
    (
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "EndpointSlice",
        true,
        &[],
        false,
    ),
    (
        "devices.kubeedge.io",
        "v1beta1",
        "devices",
        "Device",
        true,
        &[],
        true,
    ),
    (
        "devices.kubeedge.io",
        "v1beta1",
        "devicemodels",
        "DeviceModel",
        true,
        &[],
        true,
    ),
];

/// The built-in kinds plus `extra` (kinds found in the database: `(resource prefix, kind,
/// namespaced)`), without duplicates.
pub fn all(extra: &[(String, String, bool)]) -> Vec<Kind> {
    let mut out: Vec<Kind> = BUILTIN
        .iter()
        .map(|(g, v, p, k, ns, short, held)| Kind {
            group: g.to_string(),
            version: v.to_string(),
            plural: p.to_string(),
            kind: k.to_string(),
            namespaced: *ns,
            short_names: short.iter().map(|s| s.to_string()).collect(),
            held: *held,
        })
        .collect();
    for (prefix, kind, namespaced) in extra {
        let mut segs = prefix.split('/').skip(1);
        let (Some(g), Some(v), Some(p)) = (segs.next(), segs.next(), segs.next()) else {
            continue;
        };
        let group = if g == "core" { "" } else { g };
        if out
            .iter()
            .any(|k| k.group == group && k.version == v && k.plural == p)
        {
            continue;
        }
        out.push(Kind {
            group: group.to_string(),
            version: v.to_string(),
            plural: p.to_string(),
            kind: kind.clone(),
            namespaced: *namespaced,
            short_names: Vec::new(),
            held: false,
        });
    }
    out
}

pub fn find<'a>(kinds: &'a [Kind], group: &str, version: &str, plural: &str) -> Option<&'a Kind> {
    kinds
        .iter()
        .find(|k| k.group == group && k.version == version && k.plural == plural)
}

const ALL_VERBS: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];

/// `/api` (APIVersions).
pub fn core_versions(server: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}],
    })
}

fn group_entry(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

fn groups_of(kinds: &[Kind]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for k in kinds.iter().filter(|k| !k.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == k.group) {
            Some((_, vs)) if !vs.contains(&k.version) => vs.push(k.version.clone()),
            Some(_) => {}
            None => out.push((k.group.clone(), vec![k.version.clone()])),
        }
    }
    out
}

/// `/apis` (APIGroupList).
pub fn group_list(kinds: &[Kind]) -> Value {
    let groups: Vec<Value> = groups_of(kinds)
        .iter()
        .map(|(g, vs)| group_entry(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>` (APIGroup), `None` when no kind of it is known.
pub fn group(kinds: &[Kind], name: &str) -> Option<Value> {
    let (g, vs) = groups_of(kinds).into_iter().find(|(g, _)| g == name)?;
    let mut v = group_entry(&g, &vs);
    v["kind"] = json!("APIGroup");
    v["apiVersion"] = json!("v1");
    Some(v)
}

/// `/api/v1`, `/apis/<g>/<v>` (APIResourceList), `None` when nothing is served there.
pub fn resource_list(kinds: &[Kind], group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for k in kinds
        .iter()
        .filter(|k| k.group == group && k.version == version)
    {
        let verbs = ALL_VERBS;
        let mut r = json!({
            "name": k.plural,
            "singularName": k.kind.to_ascii_lowercase(),
            "namespaced": k.namespaced,
            "kind": k.kind,
            "verbs": verbs,
        });
        if !k.short_names.is_empty() {
            r["shortNames"] = json!(k.short_names);
        }
        resources.push(r);
        if matches!(k.plural.as_str(), "pods" | "nodes" | "services")
            || k.group.ends_with("kubeedge.io")
        {
            resources.push(json!({
                "name": format!("{}/status", k.plural),
                "singularName": "",
                "namespaced": k.namespaced,
                "kind": k.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_lists_builtins_and_kinds_found_in_the_database() {
        let kinds = all(&[(
            "/example.com/v1/widgets".to_string(),
            "Widget".to_string(),
            true,
        )]);
        let core = resource_list(&kinds, "", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"pods") && names.contains(&"pods/status"));
        let widgets = resource_list(&kinds, "example.com", "v1").unwrap();
        assert_eq!(widgets["resources"][0]["kind"], "Widget");
        let groups = group_list(&kinds);
        assert!(
            groups["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["name"] == "example.com")
        );
        assert!(group(&kinds, "example.com").is_some());
        assert!(group(&kinds, "nope.io").is_none());
        assert!(resource_list(&kinds, "nope.io", "v1").is_none());
        assert!(
            find(&kinds, "coordination.k8s.io", "v1", "leases")
                .unwrap()
                .held
        );
    }
}
