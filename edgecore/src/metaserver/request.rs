//! What a request asks for: the Kubernetes API path layout (`/api/v1/…`, `/apis/<g>/<v>/…`,
//! the legacy `/watch/` prefix) and the query options of get, list and watch.

use http::Method;
use kubeedge_shared::stream::parse_query;

/// The verb, as the apiserver's request-info resolver names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    /// KubeEdge's Application verb (`updatestatus` for updates of the status subresource).
    pub fn application_verb(self, subresource: &str) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update if subresource == "status" => "updatestatus",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }

    pub fn is_read(self) -> bool {
        matches!(self, Verb::Get | Verb::List | Verb::Watch)
    }
}

/// A request for a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRequest {
    pub verb: Verb,
    /// Empty for the core group.
    pub group: String,
    pub version: String,
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: String,
}

impl ResourceRequest {
    /// `/<group or core>/<version>/<plural>`: how `meta_v2` keys start.
    pub fn key_prefix(&self) -> String {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        format!("/{group}/{}/{}", self.version, self.resource)
    }

    /// The `meta_v2` key of the named object (KubeEdge's layout: `null` for no namespace).
    pub fn object_key(&self) -> Option<String> {
        let name = self.name.as_deref()?;
        let ns = match (&self.namespace, self.resource.as_str()) {
            (_, "namespaces") | (None, _) => "null",
            (Some(ns), _) => ns,
        };
        Some(format!("{}/{ns}/{name}", self.key_prefix()))
    }

    /// `group/version` as in `apiVersion`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// The name KubeEdge's `unhold-upgrade` endpoints take in a create request's path.
pub const UNHOLD_UPGRADE: &str = "unhold-upgrade";

/// `POST /api/v1/pods/unhold-upgrade` or `/api/v1/nodes/unhold-upgrade` (KubeEdge v1.22+):
/// release pod upgrades edged holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhold {
    pub of: UnholdOf,
    /// The request as RBAC sees it: create `<resource>` named `unhold-upgrade`.
    pub request: ResourceRequest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnholdOf {
    /// One pod, named `<namespace>/<name>` by the body.
    Pod,
    /// Every held pod of the node the body names.
    Node,
    /// Another resource: refused.
    Unsupported,
}

impl Unhold {
    /// A create of `<resource>/unhold-upgrade` (no subresource) is an unhold; other
    /// requests are what they name.
    fn target(r: ResourceRequest) -> Target {
        if r.verb != Verb::Create
            || r.name.as_deref() != Some(UNHOLD_UPGRADE)
            || !r.subresource.is_empty()
        {
            return Target::Resource(r);
        }
        let of = match (r.group.as_str(), r.version.as_str(), r.resource.as_str()) {
            ("", "v1", "pods") => UnholdOf::Pod,
            ("", "v1", "nodes") if r.namespace.is_none() => UnholdOf::Node,
            _ => UnholdOf::Unsupported,
        };
        Target::Unhold(Unhold { of, request: r })
    }
}

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Resource(ResourceRequest),
    Unhold(Unhold),
    /// `/api`.
    CoreVersions,
    /// `/apis`.
    Groups,
    /// `/api/v1`, `/apis/<g>/<v>`.
    GroupVersion {
        group: String,
        version: String,
    },
    /// `/apis/<g>`.
    Group(String),
    Version,
    Health,
}

/// Why a path is not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathError {
    NotFound,
    MethodNotAllowed,
}

/// Resolves `method` + `path` (without the query) + the `watch` query flag.
pub fn resolve(method: &Method, path: &str, watch_param: bool) -> Result<Target, PathError> {
    let trimmed = path.trim_end_matches('/');
    let segs: Vec<&str> = trimmed.split('/').skip(1).collect();
    if segs.iter().any(|s| s.is_empty()) && !trimmed.is_empty() {
        return Err(PathError::NotFound);
    }
    let read_only = |t: Target| {
        if method == Method::GET {
            Ok(t)
        } else {
            Err(PathError::MethodNotAllowed)
        }
    };
    match segs.as_slice() {
        ["version"] => read_only(Target::Version),
        ["healthz" | "livez" | "readyz"] => read_only(Target::Health),
        ["api"] => read_only(Target::CoreVersions),
        ["apis"] => read_only(Target::Groups),
        ["api", v] => read_only(Target::GroupVersion {
            group: String::new(),
            version: v.to_string(),
        }),
        ["apis", g] => read_only(Target::Group(g.to_string())),
        ["apis", g, v] => read_only(Target::GroupVersion {
            group: g.to_string(),
            version: v.to_string(),
        }),
        ["api", v, rest @ ..] => resource(method, "", v, rest, watch_param),
        ["apis", g, v, rest @ ..] => resource(method, g, v, rest, watch_param),
        _ => Err(PathError::NotFound),
    }
}

fn resource(
    method: &Method,
    group: &str,
    version: &str,
    rest: &[&str],
    watch_param: bool,
) -> Result<Target, PathError> {
    let (legacy_watch, rest) = match rest {
        ["watch", tail @ ..] => (true, tail),
        _ => (false, rest),
    };
    let (namespace, rest) = match rest {
        // `namespaces/<ns>/<resource>…`; `namespaces/<name>[/<sub>]` is the namespace itself.
        ["namespaces", ns, resource, tail @ ..] if !matches!(*resource, "status" | "finalize") => {
            (Some(ns.to_string()), [&[*resource][..], tail].concat())
        }
        _ => (None, rest.to_vec()),
    };
    let (resource, name, subresource) = match rest.as_slice() {
        [r] => (r.to_string(), None, String::new()),
        [r, n] => (r.to_string(), Some(n.to_string()), String::new()),
        [r, n, s] => (r.to_string(), Some(n.to_string()), s.to_string()),
        _ => return Err(PathError::NotFound),
    };
    let watch = legacy_watch || watch_param;
    let verb = match (method.clone(), name.is_some()) {
        (Method::GET, _) if watch => Verb::Watch,
        (Method::GET, true) => Verb::Get,
        (Method::GET, false) => Verb::List,
        (Method::POST, _) => Verb::Create,
        (Method::PUT, true) => Verb::Update,
        (Method::PATCH, true) => Verb::Patch,
        (Method::DELETE, true) => Verb::Delete,
        (Method::DELETE, false) => Verb::DeleteCollection,
        _ => return Err(PathError::MethodNotAllowed),
    };
    if legacy_watch && method != Method::GET {
        return Err(PathError::MethodNotAllowed);
    }
    let r = ResourceRequest {
        verb,
        group: group.to_string(),
        version: version.to_string(),
        resource,
        namespace,
        name,
        subresource,
    };
    Ok(Unhold::target(r))
}

/// The query options of get, list and watch that the MetaServer honours.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    pub watch: bool,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub resource_version: Option<String>,
    pub timeout_seconds: Option<u64>,
    pub allow_watch_bookmarks: bool,
    pub send_initial_events: bool,
    pub include_object: Option<String>,
}

impl Options {
    pub fn parse(query: Option<&str>) -> Result<Options, String> {
        let mut o = Options::default();
        for (k, v) in parse_query(query.unwrap_or("")) {
            let flag = || matches!(v.as_str(), "true" | "1");
            match k.as_str() {
                "watch" => o.watch = flag(),
                "labelSelector" => o.label_selector = Some(v),
                "fieldSelector" => o.field_selector = Some(v),
                "resourceVersion" => o.resource_version = Some(v),
                "timeoutSeconds" => {
                    o.timeout_seconds = Some(v.parse().map_err(|_| {
                        format!(
                            "timeoutSeconds: invalid value {v:?}: must be a non-negative integer"
                        )
                    })?)
                }
                "allowWatchBookmarks" => o.allow_watch_bookmarks = flag(),
                "sendInitialEvents" => o.send_initial_events = flag(),
                "includeObject" => o.include_object = Some(v),
                _ => {}
            }
        }
        Ok(o)
    }

    /// The requested resourceVersion as a number; `None` for absent, empty and `0` ("any").
    pub fn resource_version_number(&self) -> Result<Option<u64>, String> {
        match self.resource_version.as_deref() {
            None | Some("") | Some("0") => Ok(None),
            Some(rv) => rv
                .parse::<u64>()
                .map(Some)
                .map_err(|_| format!("resourceVersion: invalid value {rv:?}")),
        }
    }
}

/// Which representation the client accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Representation {
    Json,
    /// `application/json;as=Table;g=meta.k8s.io;v=v1` (kubectl get).
    Table,
    /// Only non-JSON types were offered (protobuf, CBOR).
    Unsupported,
}

pub fn representation(accept: Option<&str>) -> Representation {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Representation::Json;
    };
    let mut json = false;
    for part in accept.split(',') {
        let mut params = part.split(';').map(str::trim);
        let media = params.next().unwrap_or_default().to_ascii_lowercase();
        let params: Vec<&str> = params.collect();
        if !matches!(media.as_str(), "application/json" | "*/*" | "application/*") {
            continue;
        }
        let is_table = params.iter().any(|p| p.eq_ignore_ascii_case("as=Table"));
        let meta_v1 = params.iter().any(|p| *p == "v=v1" || *p == "v=v1beta1");
        if is_table && meta_v1 {
            return Representation::Table;
        }
        if !params.iter().any(|p| p.starts_with("as=")) {
            json = true;
        }
    }
    if json {
        Representation::Json
    } else {
        Representation::Unsupported
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(method: Method, path: &str) -> ResourceRequest {
        match resolve(&method, path, false).unwrap() {
            Target::Resource(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn paths_resolve_like_the_apiserver_request_info() {
        let r = res(Method::GET, "/api/v1/namespaces/default/pods/web");
        assert_eq!(
            (r.verb, r.namespace.as_deref(), r.name.as_deref()),
            (Verb::Get, Some("default"), Some("web"))
        );
        assert_eq!(r.object_key().as_deref(), Some("/core/v1/pods/default/web"));
        let r = res(Method::GET, "/api/v1/pods");
        assert_eq!((r.verb, r.namespace), (Verb::List, None));
        let r = res(Method::GET, "/api/v1/namespaces/kube-system");
        assert_eq!(
            (r.resource.as_str(), r.name.as_deref()),
            ("namespaces", Some("kube-system"))
        );
        assert_eq!(
            r.object_key().as_deref(),
            Some("/core/v1/namespaces/null/kube-system")
        );
        let r = res(Method::PUT, "/api/v1/namespaces/default/pods/web/status");
        assert_eq!(r.verb.application_verb(&r.subresource), "updatestatus");
        let r = res(Method::GET, "/apis/apps/v1/watch/namespaces/x/deployments");
        assert_eq!(
            (r.verb, r.group.as_str(), r.key_prefix()),
            (Verb::Watch, "apps", "/apps/v1/deployments".to_string())
        );
        let r = res(Method::DELETE, "/api/v1/namespaces/default/configmaps");
        assert_eq!(r.verb, Verb::DeleteCollection);
        assert_eq!(
            resolve(&Method::GET, "/api/v1/namespaces/a/pods/b/c/d", false),
            Err(PathError::NotFound)
        );
        assert_eq!(
            resolve(&Method::POST, "/version", false),
            Err(PathError::MethodNotAllowed)
        );
        assert_eq!(
            resolve(&Method::GET, "/nope", false),
            Err(PathError::NotFound)
        );
        assert_eq!(
            resolve(&Method::GET, "/api//v1", false),
            Err(PathError::NotFound)
        );
    }

    #[test]
    fn unhold_upgrade_paths_resolve_to_their_own_target() {
        let unhold = |path: &str| match resolve(&Method::POST, path, false) {
            Ok(Target::Unhold(u)) => Some(u.of),
            _ => None,
        };
        assert_eq!(unhold("/api/v1/pods/unhold-upgrade"), Some(UnholdOf::Pod));
        assert_eq!(
            unhold("/api/v1/namespaces/ns/pods/unhold-upgrade"),
            Some(UnholdOf::Pod)
        );
        assert_eq!(unhold("/api/v1/nodes/unhold-upgrade"), Some(UnholdOf::Node));
        assert_eq!(
            unhold("/api/v1/configmaps/unhold-upgrade"),
            Some(UnholdOf::Unsupported)
        );
        assert_eq!(
            unhold("/apis/apps/v1/deployments/unhold-upgrade"),
            Some(UnholdOf::Unsupported)
        );
        // RBAC sees a create of pods named unhold-upgrade.
        match resolve(&Method::POST, "/api/v1/pods/unhold-upgrade", false) {
            Ok(Target::Unhold(u)) => {
                assert_eq!(u.request.verb, Verb::Create);
                assert_eq!(u.request.resource, "pods");
                assert_eq!(u.request.name.as_deref(), Some(UNHOLD_UPGRADE));
            }
            other => panic!("{other:?}"),
        }
        // Not the endpoint: other verbs, a subresource of a pod of that name, other names.
        assert_eq!(
            res(Method::GET, "/api/v1/namespaces/ns/pods/unhold-upgrade").verb,
            Verb::Get
        );
        assert_eq!(
            unhold("/api/v1/namespaces/ns/pods/unhold-upgrade/eviction"),
            None
        );
        assert_eq!(unhold("/api/v1/pods/web"), None);
    }

    #[test]
    fn options_are_decoded_and_checked() {
        let o = Options::parse(Some(
            "labelSelector=app%3Dweb%2Ctier+in+(a)&watch=1&resourceVersion=12&timeoutSeconds=5&allowWatchBookmarks=true",
        ))
        .unwrap();
        assert_eq!(o.label_selector.as_deref(), Some("app=web,tier in (a)"));
        assert!(o.watch && o.allow_watch_bookmarks);
        assert_eq!(o.resource_version_number().unwrap(), Some(12));
        assert_eq!(o.timeout_seconds, Some(5));
        assert!(Options::parse(Some("timeoutSeconds=x")).is_err());
        let o = Options::parse(Some("resourceVersion=abc")).unwrap();
        assert!(o.resource_version_number().is_err());
        assert_eq!(kubeedge_shared::stream::query_unescape("%zz%4"), "%zz%4");
    }

    #[test]
    fn kubectl_asks_for_tables_and_protobuf_alone_is_refused() {
        assert_eq!(
            representation(Some(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            )),
            Representation::Table
        );
        assert_eq!(representation(None), Representation::Json);
        assert_eq!(
            representation(Some("application/json, */*")),
            Representation::Json
        );
        assert_eq!(
            representation(Some("application/vnd.kubernetes.protobuf")),
            Representation::Unsupported
        );
    }
}
