//! The HTTP handlers: discovery, get/list/watch from the edge database, writes and reads of
//! kinds the cloud does not push forwarded to the cloud.

use super::feed::{Event, EventType, Gone};
use super::kinds::{self, Kind};
use super::remote::{self, Answer, RemoteError};
use super::request::{self, Options, PathError, Representation, ResourceRequest, Target, Verb};
use super::{Shared, auth, table};
use crate::edgehub::CloudLink;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use kubeedge_shared::application::Application;
use kubeedge_shared::selectors::Filter;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

mod watch;
mod write;

pub use watch::{register_standing, relist_watched};
use watch::{register_watch, watch};
use write::write;

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Largest request body accepted (KubeEdge's and kube-apiserver's limit).
const MAX_BODY: usize = 3 << 20;
/// A watch without `timeoutSeconds` ends after this long (clients re-watch).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

pub(super) fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(full(serde_json::to_vec(v).unwrap_or_default()));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

/// A `metav1.Status` failure.
pub fn status_value(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

pub(super) fn status(code: u16, reason: &str, message: impl AsRef<str>) -> Response<Body> {
    json_response(
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &status_value(code, reason, message.as_ref()),
    )
}

fn not_found_resource() -> Response<Body> {
    status(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn qualified(r: &ResourceRequest) -> String {
    if r.group.is_empty() {
        r.resource.clone()
    } else {
        format!("{}.{}", r.resource, r.group)
    }
}

pub async fn handle<L: CloudLink>(sh: Arc<Shared<L>>, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let opts = match Options::parse(req.uri().query()) {
        Ok(o) => o,
        Err(e) => return status(400, "BadRequest", e),
    };
    let user = match &sh.auth {
        None => None,
        Some(cfg) => {
            let header = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            match auth::authenticate(&sh.store, cfg, header).await {
                Ok(u) => u,
                Err(auth::Refusal::Unauthenticated(why)) => {
                    tracing::info!(%path, %why, "MetaServer request with a token that is not accepted");
                    return status(401, "Unauthorized", "Unauthorized");
                }
            }
        }
    };
    if method == http::Method::POST && path.trim_end_matches('/') == CONFIRM_UPGRADE_PATH {
        return confirm_upgrade(&sh, user.as_ref()).await;
    }
    let target = match request::resolve(&method, &path, opts.watch) {
        Ok(t) => t,
        Err(PathError::NotFound) => return not_found_resource(),
        Err(PathError::MethodNotAllowed) => {
            return status(
                405,
                "MethodNotAllowed",
                format!(
                    "the server does not allow this method on the requested resource ({method} {path})"
                ),
            );
        }
    };
    if sh.auth.is_some()
        && let Err(refused) = auth::authorize(&sh.store, user.as_ref(), &target, &path).await
    {
        return json_response(StatusCode::FORBIDDEN, &refused);
    }
    let repr = request::representation(
        req.headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    );
    if repr == Representation::Unsupported {
        return status(
            406,
            "NotAcceptable",
            "only application/json is served by the MetaServer (no protobuf)",
        );
    }
    match target {
        Target::Version => json_response(StatusCode::OK, &version()),
        Target::Health => {
            let mut r = Response::new(full("ok"));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain"),
            );
            r
        }
        Target::CoreVersions => json_response(
            StatusCode::OK,
            &kinds::core_versions(&sh.config.addr.to_string()),
        ),
        Target::Groups | Target::Group(_) | Target::GroupVersion { .. } => {
            if let Some(v) = discovery_from_cloud(&sh, &path).await {
                return json_response(StatusCode::OK, &v);
            }
            let kinds = known_kinds(&sh).await;
            let local = match &target {
                Target::Groups => Some(kinds::group_list(&kinds)),
                Target::Group(g) => kinds::group(&kinds, g),
                Target::GroupVersion { group, version } => {
                    kinds::resource_list(&kinds, group, version)
                }
                _ => None,
            };
            match local {
                Some(v) => json_response(StatusCode::OK, &v),
                None => not_found_resource(),
            }
        }
        Target::Unhold(u) => super::unhold::serve(&sh, u, req).await,
        Target::Resource(r) => {
            let kinds = known_kinds(&sh).await;
            let kind = kinds::find(&kinds, &r.group, &r.version, &r.resource).cloned();
            resource(sh, r, kind, opts, repr, req).await
        }
    }
}

/// `keadm ctl confirm`'s request (KubeEdge v1.20+): a node upgrade waiting for it goes on.
const CONFIRM_UPGRADE_PATH: &str = "/api/v1/taskupgrade/confirm-upgrade";

/// Confirms a waiting node upgrade: authorized as `create` of `taskupgrade` (the resource
/// KubeEdge's path names) when authorization is on.
async fn confirm_upgrade<L: CloudLink>(
    sh: &Shared<L>,
    user: Option<&super::authz::UserInfo>,
) -> Response<Body> {
    if sh.auth.is_some() {
        let target = Target::Resource(ResourceRequest {
            verb: Verb::Create,
            group: String::new(),
            version: "v1".into(),
            resource: "taskupgrade".into(),
            namespace: None,
            name: Some("confirm-upgrade".into()),
            subresource: String::new(),
        });
        if let Err(refused) = auth::authorize(&sh.store, user, &target, CONFIRM_UPGRADE_PATH).await
        {
            return json_response(StatusCode::FORBIDDEN, &refused);
        }
    }
    let Some(hook) = &sh.config.confirm_upgrade else {
        return status(
            400,
            "BadRequest",
            "node tasks are off on this edge (modules.taskManager.enable): there is no upgrade to confirm",
        );
    };
    match (hook.0)() {
        Ok(()) => {
            tracing::info!("node upgrade confirmed through the MetaServer");
            json_response(
                StatusCode::OK,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}),
            )
        }
        Err(why) => status(400, "BadRequest", why),
    }
}

/// The built-in kinds and those the database holds objects of (one query).
async fn known_kinds<L: CloudLink>(sh: &Shared<L>) -> Vec<Kind> {
    kinds::all(&sh.store.v2_resources().await.unwrap_or_default())
}

/// The cloud's discovery document at `path` (the whole cluster's kinds, custom resources
/// included), stored for offline use; offline, the stored one. `None`: never seen.
async fn discovery_from_cloud<L: CloudLink>(sh: &Shared<L>, path: &str) -> Option<Value> {
    let key = path.trim_end_matches('/').to_string();
    if sh.link.is_connected() {
        let app = Application::new(&sh.config.node, &key, "get", b"{}".to_vec(), Vec::new(), "");
        match remote::call(&sh.link, &app, sh.config.remote_timeout).await {
            Ok(Answer::Ok(v)) => {
                if let Err(e) = sh.store.put_v2_raw(&key, v.to_string()).await {
                    tracing::debug!(error = %e, "discovery document not stored");
                }
                return Some(v);
            }
            Ok(Answer::Refused(_)) => return None,
            Err(e) => {
                tracing::debug!(%key, error = %e, "discovery from the cloud failed; using the stored copy")
            }
        }
    }
    let stored = sh.store.get_v2(&key).await.ok().flatten()?;
    serde_json::from_str(&stored).ok()
}

fn version() -> Value {
    json!({"major": "1", "minor": "30", "gitVersion": "v1.30.0-kubeedge-rs-metaserver",
           "gitCommit": "", "gitTreeState": "clean", "buildDate": "", "goVersion": "",
           "compiler": "rustc", "platform": "linux/amd64"})
}

async fn resource<L: CloudLink>(
    sh: Arc<Shared<L>>,
    r: ResourceRequest,
    kind: Option<Kind>,
    opts: Options,
    repr: Representation,
    req: Request<Incoming>,
) -> Response<Body> {
    if kind.is_none() && !sh.link.is_connected() {
        return not_found_resource();
    }
    if !r.subresource.is_empty() && r.verb.is_read() && r.subresource != "status" {
        return status(
            404,
            "NotFound",
            format!(
                "the MetaServer does not serve {}/{}",
                r.resource, r.subresource
            ),
        );
    }
    match r.verb {
        Verb::DeleteCollection => status(
            405,
            "MethodNotAllowed",
            "deletecollection is not supported by the MetaServer; delete objects one by one",
        ),
        Verb::Get | Verb::List | Verb::Watch => read(sh, r, kind, opts, repr).await,
        _ => write(sh, r, kind, req).await,
    }
}

fn api_version_kind(r: &ResourceRequest, kind: Option<&Kind>) -> (String, String) {
    let kind_name = kind.map(|k| k.kind.clone()).unwrap_or_default();
    (r.api_version(), kind_name)
}

/// Reads of kinds the edge holds are answered from its database; other kinds are read from
/// the cloud while it is connected (and cached), from the cache when it is not.
async fn read<L: CloudLink>(
    sh: Arc<Shared<L>>,
    r: ResourceRequest,
    kind: Option<Kind>,
    opts: Options,
    repr: Representation,
) -> Response<Body> {
    let filter = match Filter::parse(
        opts.label_selector.as_deref(),
        opts.field_selector.as_deref(),
    ) {
        Ok(f) => f,
        Err(e) => return status(400, "BadRequest", e),
    };
    if let Err(e) = opts.resource_version_number() {
        return status(400, "BadRequest", e);
    }
    let held = kind.as_ref().is_some_and(|k| k.held);
    if r.verb == Verb::Watch {
        let registered = if held {
            None
        } else {
            Some(register_watch(&sh, &r, &opts).await)
        };
        return watch(sh, r, kind, opts, filter, repr, registered).await;
    }
    if !held && sh.link.is_connected() {
        match from_cloud(&sh, &r, &opts, &filter).await {
            Ok(Answer::Ok(v)) => return render(&r, v, &opts, repr),
            Ok(Answer::Refused(s)) => {
                let code = s["code"].as_u64().unwrap_or(500) as u16;
                return json_response(
                    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                    &s,
                );
            }
            Err(e) => {
                tracing::info!(resource = %r.resource, error = %e, "read from the cloud failed; answering from the edge database")
            }
        }
    }
    if kind.is_none() {
        return not_found_resource();
    }
    match r.verb {
        Verb::Get => {
            let Some(key) = r.object_key() else {
                return not_found_resource();
            };
            match sh.store.get_v2(&key).await {
                Ok(Some(v)) => match serde_json::from_str::<Value>(&v) {
                    Ok(obj) => render(&r, obj, &opts, repr),
                    Err(_) => status(500, "InternalError", "the stored object is not JSON"),
                },
                Ok(None) => status(
                    404,
                    "NotFound",
                    format!(
                        "{} \"{}\" not found",
                        qualified(&r),
                        r.name.as_deref().unwrap_or_default()
                    ),
                ),
                Err(e) => status(500, "InternalError", e.to_string()),
            }
        }
        _ => match local_list(&sh, &r, &filter).await {
            Ok((items, rv)) => list_response(&r, kind.as_ref(), items, rv, &opts, repr),
            Err(e) => status(500, "InternalError", e),
        },
    }
}

/// The list prefix of a request: the resource, narrowed to its namespace.
fn list_prefix(r: &ResourceRequest) -> String {
    match &r.namespace {
        Some(ns) if r.resource != "namespaces" => format!("{}/{ns}", r.key_prefix()),
        _ => r.key_prefix(),
    }
}

/// The metadata a watch needs of a listed object (parsing only this is cheap).
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct Meta {
    metadata: MetaFields,
}

#[derive(serde::Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct MetaFields {
    name: String,
    namespace: String,
    resource_version: String,
}

/// The stored objects a list or watch covers, as JSON text, and the list's revision. Objects
/// are parsed only when a selector or a name must be checked.
async fn local_list<L: CloudLink>(
    sh: &Shared<L>,
    r: &ResourceRequest,
    filter: &Filter,
) -> Result<(Vec<String>, u64), String> {
    let (values, db_rv) = sh
        .store
        .list_v2(&list_prefix(r))
        .await
        .map_err(|e| e.to_string())?;
    let items = if filter.is_empty() && r.name.is_none() {
        values
    } else {
        values
            .into_iter()
            .filter(|v| {
                serde_json::from_str::<Value>(v).is_ok_and(|o| {
                    filter.matches(&o)
                        && (r.name.is_none()
                            || o.pointer("/metadata/name").and_then(Value::as_str)
                                == r.name.as_deref())
                })
            })
            .collect()
    };
    Ok((items, db_rv.max(sh.feed.revision())))
}

/// Objects in a list above which the memory the answer took is handed back at once.
const TRIM_AFTER: usize = 256;

/// A list answer built from the stored JSON text (parsed only for Tables).
fn list_response(
    r: &ResourceRequest,
    kind: Option<&Kind>,
    items: Vec<String>,
    rv: u64,
    opts: &Options,
    repr: Representation,
) -> Response<Body> {
    let (api_version, kind_name) = api_version_kind(r, kind);
    let count = items.len();
    let resp = if repr == Representation::Table {
        let objects: Vec<Value> = items
            .iter()
            .filter_map(|i| serde_json::from_str(i).ok())
            .collect();
        json_response(
            StatusCode::OK,
            &table::table(
                &r.resource,
                &objects,
                &rv.to_string(),
                opts.include_object.as_deref(),
            ),
        )
    } else {
        let mut body = Vec::with_capacity(items.iter().map(String::len).sum::<usize>() + 256);
        let head = json!({"kind": format!("{kind_name}List"), "apiVersion": api_version,
                          "metadata": {"resourceVersion": rv.to_string()}})
        .to_string();
        // The head object without its closing brace, then the items.
        body.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
        body.extend_from_slice(b",\"items\":[");
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(item.as_bytes());
        }
        body.extend_from_slice(b"]}");
        drop(items);
        let mut r = Response::new(full(body));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        r
    };
    if count > TRIM_AFTER {
        crate::memory::release_freed_memory();
    }
    resp
}

/// A get or list of a kind the cloud does not push, asked of the cloud; what it returns is
/// cached (a full list also removes cached objects the cloud no longer has).
async fn from_cloud<L: CloudLink>(
    sh: &Shared<L>,
    r: &ResourceRequest,
    opts: &Options,
    filter: &Filter,
) -> Result<Answer, RemoteError> {
    let app = application(sh, r, list_options(opts), Vec::new(), "");
    let answer = remote::call(&sh.link, &app, sh.config.remote_timeout).await?;
    if let Answer::Ok(v) = &answer {
        let api_version = v
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let list_kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
        let objects: Vec<Value> = match v.get("items").and_then(Value::as_array) {
            Some(items) => {
                let item_kind = list_kind.strip_suffix("List").unwrap_or(list_kind);
                items
                    .iter()
                    .cloned()
                    .map(|mut o| {
                        if o.get("kind").is_none() {
                            o["kind"] = json!(item_kind);
                            o["apiVersion"] = json!(api_version);
                        }
                        o
                    })
                    .collect()
            }
            None => vec![v.clone()],
        };
        let listed_rv = v
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|rv| rv.parse::<u64>().ok())
            .filter(|_| r.verb == Verb::List);
        let mut keys: std::collections::HashSet<String> = objects
            .iter()
            .filter_map(|o| {
                let name = o.pointer("/metadata/name")?.as_str()?;
                let ns = o
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .unwrap_or("null");
                Some(format!("{}/{ns}/{name}", r.key_prefix()))
            })
            .collect();
        if let Err(e) = sh.store.cache_objects(objects).await {
            tracing::warn!(error = %e, "objects read from the cloud not cached");
        }
        if r.verb == Verb::List {
            // Changes the cloud sent after it made the list may have been stored before the
            // list arrived: objects written since stay (see `uncache_missing`), and those
            // deleted since, which the list brought back, go again.
            if let Some(rv) = listed_rv {
                for key in deleted_since(sh, r, rv) {
                    keys.remove(&key);
                }
            }
            let f = filter.clone();
            let matches: Box<dyn Fn(&Value) -> bool + Send> = Box::new(move |o| f.matches(o));
            if let Err(e) = sh
                .store
                .uncache_missing(list_prefix(r), keys, listed_rv, matches)
                .await
            {
                tracing::warn!(error = %e, "cached objects the cloud no longer has not removed");
            }
        }
    }
    Ok(answer)
}

/// The `meta_v2` keys in the scope of the list `r` whose deletion, newer than the list's
/// `rv`, is in the watch history (the history is published before a write returns, so it
/// holds every deletion stored before the list's objects were). Empty when the history no
/// longer reaches back to `rv`.
fn deleted_since<L>(sh: &Shared<L>, r: &ResourceRequest, rv: u64) -> Vec<String> {
    let prefix = format!("{}/", list_prefix(r));
    match sh.feed.since(&r.key_prefix(), rv) {
        Ok((events, _)) => events
            .iter()
            .filter(|e| e.kind == EventType::Deleted)
            .map(|e| {
                let ns = if e.namespace.is_empty() {
                    "null"
                } else {
                    &e.namespace
                };
                format!("{}/{ns}/{}", e.resource, e.name)
            })
            .filter(|k| k.starts_with(&prefix))
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn list_options(opts: &Options) -> Value {
    let mut o = serde_json::Map::new();
    if let Some(l) = &opts.label_selector {
        o.insert("labelSelector".into(), json!(l));
    }
    if let Some(f) = &opts.field_selector {
        o.insert("fieldSelector".into(), json!(f));
    }
    if let Some(rv) = &opts.resource_version {
        o.insert("resourceVersion".into(), json!(rv));
    }
    Value::Object(o)
}

/// The Application of a request; its key names the object, or the collection (`null`).
fn application<L: CloudLink>(
    sh: &Shared<L>,
    r: &ResourceRequest,
    option: Value,
    body: Vec<u8>,
    subresource: &str,
) -> Application {
    let key = format!(
        "{}/{}",
        match &r.namespace {
            Some(ns) if r.resource != "namespaces" => format!("{}/{ns}", r.key_prefix()),
            _ => format!("{}/null", r.key_prefix()),
        },
        r.name.as_deref().unwrap_or("null")
    );
    Application::new(
        &sh.config.node,
        &key,
        r.verb.application_verb(&r.subresource),
        serde_json::to_vec(&option).unwrap_or_default(),
        body,
        subresource,
    )
}

fn render(r: &ResourceRequest, v: Value, opts: &Options, repr: Representation) -> Response<Body> {
    if repr != Representation::Table {
        return json_response(StatusCode::OK, &v);
    }
    let rv = v
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let objects = match v.get("items").and_then(Value::as_array) {
        Some(items) => items.clone(),
        None => vec![v],
    };
    json_response(
        StatusCode::OK,
        &table::table(&r.resource, &objects, &rv, opts.include_object.as_deref()),
    )
}
