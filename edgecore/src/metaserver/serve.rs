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

/// Registers (once per identical watch) a watch of a kind the cloud does not push: the
/// cloud then sends its objects and their changes, which are stored and reach the watch.
/// Returns the registration's Application ID (the watch gives it back when it ends).
async fn register_watch<L: CloudLink>(
    sh: &Arc<Shared<L>>,
    r: &ResourceRequest,
    opts: &Options,
) -> String {
    let mut o = list_options(opts);
    if let Some(map) = o.as_object_mut() {
        map.remove("resourceVersion");
    }
    let app = application(sh, r, o, Vec::new(), "");
    let id = app.id.clone();
    if sh.regs.add(&app) && sh.link.is_connected() {
        let sh = sh.clone();
        tokio::spawn(async move {
            if let Err(e) = remote::call(&sh.link, &app, sh.config.remote_timeout).await {
                tracing::info!(key = %app.key, error = %e, "watch not registered at the cloud yet; registered again on the next connect");
            }
        });
    }
    id
}

/// Registers a standing watch (kept for the life of the MetaServer; see
/// [`super::StandingWatch`]).
pub async fn register_standing<L: CloudLink>(sh: &Arc<Shared<L>>, w: &super::StandingWatch) {
    let r = ResourceRequest {
        verb: Verb::Watch,
        group: w.group.clone(),
        version: w.version.clone(),
        resource: w.resource.clone(),
        namespace: None,
        name: None,
        subresource: String::new(),
    };
    register_watch(sh, &r, &Options::default()).await;
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

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

fn gone_line(g: Gone, asked: Option<u64>) -> Bytes {
    let msg = match asked {
        Some(rv) => format!("too old resource version: {rv} ({})", g.oldest),
        None => "the watch fell behind the edge's history; relist".to_string(),
    };
    event_line("ERROR", &status_value(410, "Expired", &msg))
}

/// What a watch sends for an event, if anything: selectors turn modifications into
/// additions or deletions as an object enters or leaves the selection.
fn translate(ev: &Event, filter: &Filter) -> Option<&'static str> {
    if filter.is_empty() {
        return Some(match ev.kind {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        });
    }
    let matches = |s: &str| {
        serde_json::from_str::<Value>(s)
            .map(|v| filter.matches(&v))
            .unwrap_or(false)
    };
    let now = matches(&ev.object);
    match ev.kind {
        EventType::Added => now.then_some("ADDED"),
        EventType::Deleted => now.then_some("DELETED"),
        EventType::Modified => {
            let before = ev.previous.as_deref().map_or(now, matches);
            match (before, now) {
                (true, true) => Some("MODIFIED"),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            }
        }
    }
}

/// How a watch writes its events: JSON objects, or one-row Tables for `kubectl get -w`.
struct Encoder {
    table: bool,
    plural: String,
    include: Option<String>,
}

impl Encoder {
    fn value(&self, kind: &str, obj: &Value) -> Bytes {
        if !self.table {
            return event_line(kind, obj);
        }
        let rv = obj
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        event_line(
            kind,
            &table::table(
                &self.plural,
                std::slice::from_ref(obj),
                rv,
                self.include.as_deref(),
            ),
        )
    }

    /// An event of a stored object's JSON text (parsed only for Tables).
    fn raw(&self, kind: &str, json: &str) -> Bytes {
        if self.table {
            return match serde_json::from_str::<Value>(json) {
                Ok(v) => self.value(kind, &v),
                Err(_) => Bytes::new(),
            };
        }
        let mut line = Vec::with_capacity(json.len() + 32);
        line.extend_from_slice(b"{\"type\":\"");
        line.extend_from_slice(kind.as_bytes());
        line.extend_from_slice(b"\",\"object\":");
        line.extend_from_slice(json.as_bytes());
        line.extend_from_slice(b"}\n");
        Bytes::from(line)
    }
}

struct WatchScope {
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
}

impl WatchScope {
    fn covers(&self, ev: &Event) -> bool {
        ev.resource == self.resource
            && self.namespace.as_ref().is_none_or(|ns| *ns == ev.namespace)
            && self.name.as_ref().is_none_or(|n| *n == ev.name)
    }
}

async fn watch<L: CloudLink>(
    sh: Arc<Shared<L>>,
    r: ResourceRequest,
    kind: Option<Kind>,
    opts: Options,
    filter: Filter,
    repr: Representation,
    registered: Option<String>,
) -> Response<Body> {
    let scope = WatchScope {
        resource: r.key_prefix(),
        namespace: r.namespace.clone().filter(|_| r.resource != "namespaces"),
        name: r.name.clone(),
    };
    let from = opts.resource_version_number().ok().flatten();
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let enc = Encoder {
        table: repr == Representation::Table,
        plural: r.resource.clone(),
        include: opts.include_object.clone(),
    };
    // Where the live part starts, what the client gets first, and the objects the initial
    // list already showed (changes racing with that list are not sent twice).
    let mut listed: HashMap<(String, String), u64> = HashMap::new();
    let mut initial = Vec::new();
    let (cursor, dedupe_until) = match from.filter(|_| !opts.send_initial_events) {
        Some(rv) => match sh.feed.since(&scope.resource, rv) {
            Ok((replay, cursor)) => {
                for ev in replay.iter().filter(|e| scope.covers(e)) {
                    if let Some(t) = translate(ev, &filter) {
                        initial.push(enc.raw(t, &ev.object));
                    }
                }
                (cursor, cursor)
            }
            Err(g) => {
                let _ = tx.try_send(gone_line(g, Some(rv)));
                drop(tx);
                return stream_response(rx);
            }
        },
        None => {
            let cursor = sh.feed.last_seq();
            match local_list(&sh, &r, &filter).await {
                Ok((items, _)) => {
                    for o in &items {
                        let m = serde_json::from_str::<Meta>(o).unwrap_or_default().metadata;
                        let rv = m.resource_version.parse().unwrap_or(0);
                        listed.insert((m.namespace, m.name), rv);
                        initial.push(enc.raw("ADDED", o));
                    }
                    if items.len() > TRIM_AFTER {
                        drop(items);
                        crate::memory::release_freed_memory();
                    }
                }
                Err(e) => return status(500, "InternalError", e),
            }
            (cursor, sh.feed.last_seq())
        }
    };
    if opts.send_initial_events {
        let (api_version, kind_name) = api_version_kind(&r, kind.as_ref());
        initial.push(event_line(
            "BOOKMARK",
            &json!({"kind": kind_name, "apiVersion": api_version, "metadata": {
                "resourceVersion": sh.feed.revision().max(listed.values().copied().max().unwrap_or(0)).to_string(),
                "annotations": {"k8s.io/initial-events-end": "true"}}}),
        ));
    }
    let timeout = opts
        .timeout_seconds
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT);
    let bookmarks = opts.allow_watch_bookmarks;
    let (api_version, kind_name) = api_version_kind(&r, kind.as_ref());
    let cancel = sh.cancel.clone();
    tokio::spawn(async move {
        let mut changes = sh.feed.subscribe();
        let mut cursor = cursor;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(sh.config.bookmark_interval);
        tick.tick().await;
        'outer: {
            for line in initial {
                if tx.send(line).await.is_err() {
                    break 'outer;
                }
            }
            loop {
                let events = match sh.feed.after(cursor) {
                    Ok(e) => e,
                    Err(g) => {
                        let _ = tx.send(gone_line(g, None)).await;
                        break;
                    }
                };
                for ev in events {
                    cursor = ev.seq;
                    if !scope.covers(&ev) {
                        continue;
                    }
                    if ev.seq <= dedupe_until
                        && let Some(rv) = listed.get(&(ev.namespace.clone(), ev.name.clone()))
                    {
                        let seen = match ev.kind {
                            EventType::Deleted => false,
                            _ => *rv >= ev.rv,
                        };
                        if seen {
                            continue;
                        }
                    }
                    if ev.seq <= dedupe_until
                        && ev.kind == EventType::Deleted
                        && from.is_none()
                        && !listed.contains_key(&(ev.namespace.clone(), ev.name.clone()))
                    {
                        continue;
                    }
                    if let Some(t) = translate(&ev, &filter)
                        && tx.send(enc.raw(t, &ev.object)).await.is_err()
                    {
                        break 'outer;
                    }
                }
                tokio::select! {
                    c = changes.changed() => if c.is_err() { break },
                    _ = tick.tick(), if bookmarks => {
                        let mark = json!({"kind": kind_name, "apiVersion": api_version,
                            "metadata": {"resourceVersion": sh.feed.revision().to_string()}});
                        if tx.send(event_line("BOOKMARK", &mark)).await.is_err() {
                            break;
                        }
                    }
                    _ = &mut deadline => break,
                    _ = tx.closed() => break,
                    _ = cancel.cancelled() => break,
                }
            }
        }
        if let Some(id) = registered
            && sh.regs.remove(&id)
        {
            sh.regs.sync(&sh.link).await;
        }
    });
    stream_response(rx)
}

fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut resp = Response::new(BodyExt::boxed_unsync(StreamBody::new(stream.boxed())));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::TRANSFER_ENCODING,
        header::HeaderValue::from_static("chunked"),
    );
    resp
}

const PATCH_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

/// Writes go to the cloud; offline they are refused (nothing is queued: the caller decides).
async fn write<L: CloudLink>(
    sh: Arc<Shared<L>>,
    r: ResourceRequest,
    kind: Option<Kind>,
    req: Request<Incoming>,
) -> Response<Body> {
    if !sh.link.is_connected() {
        return status(
            503,
            "ServiceUnavailable",
            format!(
                "edge node {} is disconnected from the cloud: writes need the cloud, retry once it is connected (reads are served from the edge database)",
                sh.config.node
            ),
        );
    }
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.split(';').next().unwrap_or_default().trim().to_string())
        .unwrap_or_default();
    let query_options: Value = Value::Object(
        kubeedge_shared::stream::parse_query(req.uri().query().unwrap_or(""))
            .into_iter()
            .filter(|(k, _)| {
                matches!(
                    k.as_str(),
                    "fieldManager"
                        | "dryRun"
                        | "force"
                        | "propagationPolicy"
                        | "gracePeriodSeconds"
                )
            })
            .map(|(k, v)| (k, json!(v)))
            .collect(),
    );
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes().to_vec(),
        Err(_) => {
            return status(
                413,
                "RequestEntityTooLarge",
                format!("request body larger than {MAX_BODY} bytes or unreadable"),
            );
        }
    };
    let (option, req_body) = match r.verb {
        Verb::Create | Verb::Update => {
            if !serde_json::from_slice::<Value>(&body).is_ok_and(|v| v.is_object()) {
                return status(400, "BadRequest", "the request body is not a JSON object");
            }
            (query_options, body)
        }
        Verb::Patch => {
            if !PATCH_TYPES.contains(&content_type.as_str()) {
                return status(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "the body of a patch must be one of {PATCH_TYPES:?}, not {content_type:?}"
                    ),
                );
            }
            use base64::Engine;
            let info = json!({
                "Name": r.name.clone().unwrap_or_default(),
                "PatchType": content_type,
                "Data": base64::engine::general_purpose::STANDARD.encode(&body),
                "Options": query_options,
                "Subresources": if r.subresource.is_empty() { json!([]) } else { json!([r.subresource]) },
            });
            (info, Vec::new())
        }
        Verb::Delete => {
            let options = if body.is_empty() {
                query_options
            } else {
                match serde_json::from_slice::<Value>(&body) {
                    Ok(v) if v.is_object() => v,
                    _ => {
                        return status(
                            400,
                            "BadRequest",
                            "the DeleteOptions body is not a JSON object",
                        );
                    }
                }
            };
            (options, Vec::new())
        }
        _ => return status(405, "MethodNotAllowed", "unsupported verb"),
    };
    let sub = r.subresource.clone();
    let app = application(&sh, &r, option, req_body, &sub);
    match remote::call(&sh.link, &app, sh.config.remote_timeout).await {
        Ok(Answer::Ok(v)) => {
            let held = kind.as_ref().is_some_and(|k| k.held);
            if !held && v.get("kind").and_then(Value::as_str) != Some("Status") {
                let result = if r.verb == Verb::Delete
                    && v.pointer("/metadata/deletionTimestamp").is_none()
                {
                    sh.store.uncache(v.clone()).await
                } else {
                    sh.store.cache_objects(vec![v.clone()]).await
                };
                if let Err(e) = result {
                    tracing::warn!(error = %e, "the cloud's answer to a write not cached");
                }
            }
            let code = if r.verb == Verb::Create {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            json_response(code, &v)
        }
        Ok(Answer::Refused(s)) => {
            let code = s["code"].as_u64().unwrap_or(500) as u16;
            json_response(
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                &s,
            )
        }
        Err(RemoteError::Offline) => status(
            503,
            "ServiceUnavailable",
            "the cloud is not connected; retry once it is",
        ),
        Err(RemoteError::Link(e)) => {
            status(504, "Timeout", format!("the cloud did not answer: {e}"))
        }
        Err(e) => status(500, "InternalError", e.to_string()),
    }
}

/// Lists every watched scope from the cloud again (after a reconnect): the cache gets what
/// changed and loses what was deleted while the edge was away, and watches see both.
pub async fn relist_watched<L: CloudLink>(sh: &Arc<Shared<L>>) {
    for app in sh.regs.all() {
        let Ok(key) = kubeedge_shared::application::AppKey::parse(&app.key) else {
            continue;
        };
        let opts: Value = serde_json::from_slice(&app.option).unwrap_or(Value::Null);
        let options = Options {
            label_selector: opts["labelSelector"].as_str().map(str::to_string),
            field_selector: opts["fieldSelector"].as_str().map(str::to_string),
            ..Options::default()
        };
        let Ok(filter) = Filter::parse(
            options.label_selector.as_deref(),
            options.field_selector.as_deref(),
        ) else {
            continue;
        };
        let r = ResourceRequest {
            verb: if key.name.is_some() {
                Verb::Get
            } else {
                Verb::List
            },
            group: key.group,
            version: key.version,
            resource: key.resource,
            namespace: key.namespace,
            name: key.name,
            subresource: String::new(),
        };
        match from_cloud(sh, &r, &options, &filter).await {
            Ok(_) => {
                tracing::debug!(key = %app.key, "watched scope listed again after the reconnect")
            }
            Err(e) => {
                tracing::info!(key = %app.key, error = %e, "watched scope not listed again; its cache may hold deleted objects until the next connect")
            }
        }
    }
}
