//! Discovery: `/version`, `/api`, `/apis`, group and resource lists (legacy and aggregated v2),
//! and a minimal OpenAPI v3 index that tells kubectl the server validates fields itself.

use serde_json::{Value, json};

use super::resources::{Registry, ResourceInfo};

pub const SERVER_VERSION_MINOR: &str = "32";

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": SERVER_VERSION_MINOR,
        "emulationMajor": "1",
        "emulationMinor": SERVER_VERSION_MINOR,
        "gitVersion": format!("v1.{SERVER_VERSION_MINOR}.0-kube-memserver"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2024-12-11T00:00:00Z",
        "goVersion": "n/a (kube-memserver, Rust)",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, go_arch()),
    })
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Which discovery document shape the client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryFormat {
    Legacy,
    Aggregated(&'static str),
}

pub fn negotiate(accept: &str) -> DiscoveryFormat {
    for part in accept.split(',') {
        let p = part.replace(' ', "");
        if p.contains("as=APIGroupDiscoveryList") && p.contains("g=apidiscovery.k8s.io") {
            if p.contains("v=v2beta1") {
                return DiscoveryFormat::Aggregated("v2beta1");
            }
            if p.contains("v=v2") {
                return DiscoveryFormat::Aggregated("v2");
            }
        }
        if p.starts_with("application/json") || p.starts_with("*/*") {
            return DiscoveryFormat::Legacy;
        }
    }
    DiscoveryFormat::Legacy
}

pub fn aggregated_content_type(version: &str) -> String {
    format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList")
}

pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_json(name: &str, versions: &[String]) -> Value {
    let gv = |v: &String| json!({"groupVersion": format!("{name}/{v}"), "version": v});
    json!({
        "name": name,
        "versions": versions.iter().map(gv).collect::<Vec<_>>(),
        "preferredVersion": versions.first().map(gv).unwrap_or(Value::Null),
    })
}

pub fn api_group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> = reg
        .groups()
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_json(&g, &vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn api_group(reg: &Registry, group: &str) -> Option<Value> {
    reg.groups()
        .into_iter()
        .find(|(g, _)| g == group)
        .map(|(g, vs)| {
            let mut v = group_json(&g, &vs);
            v["kind"] = json!("APIGroup");
            v["apiVersion"] = json!("v1");
            v
        })
}

pub fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    if !reg.group_served(group, version) {
        return None;
    }
    let mut resources = Vec::new();
    for info in reg
        .all()
        .iter()
        .filter(|i| i.group == group && i.version == version)
    {
        let mut r = json!({
            "name": info.plural,
            "singularName": info.singular,
            "namespaced": info.namespaced,
            "kind": info.kind,
            "verbs": info.verbs(),
        });
        if !info.short_names.is_empty() {
            r["shortNames"] = json!(info.short_names);
        }
        if !info.categories.is_empty() {
            r["categories"] = json!(info.categories);
        }
        resources.push(r);
        for sub in &info.subresources {
            let (g, v, k) = info.subresource_kind(sub);
            let mut s = json!({
                "name": format!("{}/{sub}", info.plural),
                "singularName": "",
                "namespaced": info.namespaced,
                "kind": k,
                "verbs": ResourceInfo::subresource_verbs(sub),
            });
            if g != info.group || v != info.version {
                s["group"] = json!(g);
                s["version"] = json!(v);
            }
            resources.push(s);
        }
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

fn resource_discovery(info: &ResourceInfo) -> Value {
    let mut r = json!({
        "resource": info.plural,
        "responseKind": {"group": info.group, "version": info.version, "kind": info.kind},
        "scope": if info.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": info.singular,
        "verbs": info.verbs(),
    });
    if !info.short_names.is_empty() {
        r["shortNames"] = json!(info.short_names);
    }
    if !info.categories.is_empty() {
        r["categories"] = json!(info.categories);
    }
    if !info.subresources.is_empty() {
        r["subresources"] = Value::Array(
            info.subresources
                .iter()
                .map(|sub| {
                    let (g, v, k) = info.subresource_kind(sub);
                    json!({
                        "subresource": sub,
                        "responseKind": {"group": g, "version": v, "kind": k},
                        "verbs": ResourceInfo::subresource_verbs(sub),
                    })
                })
                .collect(),
        );
    }
    r
}

/// `APIGroupDiscoveryList` for `/api` (core only) or `/apis` (every other group).
pub fn aggregated(reg: &Registry, core: bool, version: &str) -> Value {
    let all = reg.all();
    let items: Vec<Value> = reg
        .groups()
        .into_iter()
        .filter(|(g, _)| g.is_empty() == core)
        .map(|(g, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| {
                    let resources: Vec<Value> = all
                        .iter()
                        .filter(|i| i.group == g && i.version == *v)
                        .map(|i| resource_discovery(i))
                        .collect();
                    json!({"version": v, "resources": resources, "freshness": "Current"})
                })
                .collect();
            json!({"metadata": {"name": g, "creationTimestamp": null}, "versions": versions})
        })
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": items,
    })
}

/// `/openapi/v3`: one entry per group version.
pub fn openapi_v3_index(reg: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    for (g, versions) in reg.groups() {
        for v in versions {
            let key = if g.is_empty() {
                format!("api/{v}")
            } else {
                format!("apis/{g}/{v}")
            };
            let url = format!("/openapi/v3/{key}?hash={:016X}", reg.generation());
            paths.insert(key, json!({"serverRelativeURL": url}));
        }
    }
    json!({"paths": paths})
}

/// A minimal OpenAPI v3 document for one group version: the PATCH operations with their
/// `fieldValidation` parameter, which is what kubectl looks for to leave validation to the server.
pub fn openapi_v3_group(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    if !reg.group_served(group, version) {
        return None;
    }
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let mut paths = serde_json::Map::new();
    for info in reg
        .all()
        .iter()
        .filter(|i| i.group == group && i.version == version)
    {
        let path = if info.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", info.plural)
        } else {
            format!("{prefix}/{}/{{name}}", info.plural)
        };
        let op = json!({
            "description": format!("partially update the specified {}", info.kind),
            "operationId": format!("patch{}", info.kind),
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": info.group, "version": info.version, "kind": info.kind},
            "parameters": [
                {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}}
            ],
            "responses": {"200": {"description": "OK"}}
        });
        paths.insert(path, json!({"patch": op}));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v1.{SERVER_VERSION_MINOR}.0")},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_accept_header_selects_aggregated_v2() {
        let accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(negotiate(accept), DiscoveryFormat::Aggregated("v2"));
        assert_eq!(negotiate("application/json"), DiscoveryFormat::Legacy);
    }

    #[test]
    fn core_resource_list_has_short_names_and_subresources() {
        let reg = Registry::new();
        let list = resource_list(&reg, "", "v1").unwrap();
        let res = list["resources"].as_array().unwrap();
        let pods = res.iter().find(|r| r["name"] == "pods").unwrap();
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert!(res.iter().any(|r| r["name"] == "pods/status"));
        let token = res
            .iter()
            .find(|r| r["name"] == "serviceaccounts/token")
            .unwrap();
        assert_eq!(token["group"], "authentication.k8s.io");
        // As upstream: `{"name":"pods/portforward","kind":"PodPortForwardOptions",
        // "verbs":["create","get"]}`, like exec and attach.
        let pf = res
            .iter()
            .find(|r| r["name"] == "pods/portforward")
            .unwrap();
        assert_eq!(pf["kind"], "PodPortForwardOptions");
        assert_eq!(pf["verbs"], json!(["create", "get"]));
    }
}
