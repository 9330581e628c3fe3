//! HTTP requests to API calls: authentication, path routing, body decoding, content
//! negotiation and responses (objects, lists, Tables, Status errors, watch streams).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::authn::UserInfo;
use super::discovery::{self, DiscoveryFormat};
use super::patch::PatchType;
use super::query::{Query, percent_decode_path};
use super::resources::ResourceInfo;
use super::selectors::Filter;
use super::state::State;
use super::status::{ApiError, ApiResult, deleted_status};
use super::store::Obj;
use super::table::{self, Output};
use super::verbs::{self, DeleteOptions, Deleted, ListRequest, WriteOptions};
use super::watch;

pub type Body = BoxBody<Bytes, Infallible>;

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

fn respond(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    r
}

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    respond(
        status,
        "application/json",
        serde_json::to_vec(v).unwrap_or_default(),
    )
}

pub fn error_response(e: &ApiError) -> Response<Body> {
    let status = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = json_response(status, &e.to_status());
    if e.code == 401 {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"kubernetes-api\""),
        );
    }
    r
}

/// Per-request context.
struct Ctx {
    st: Arc<State>,
    method: Method,
    query: Query,
    raw_query: String,
    accept: String,
    content_type: String,
    cancel: CancellationToken,
    server_address: String,
    user: Arc<UserInfo>,
}

pub async fn handle(
    st: Arc<State>,
    req: Request<Incoming>,
    cancel: CancellationToken,
    server_address: String,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    if matches!(path.as_str(), "/healthz" | "/livez" | "/readyz")
        || path.starts_with("/healthz/")
        || path.starts_with("/livez/")
        || path.starts_with("/readyz/")
    {
        return respond(StatusCode::OK, "text/plain; charset=utf-8", "ok");
    }
    if let Some(failure) = st.faults.failure() {
        return failure.response();
    }
    let user = match super::authn::authenticate(&st, req.headers()) {
        Ok(u) => Arc::new(u),
        Err(e) => return error_response(&e),
    };
    // Upgrades keep the connection: served before the body is read.
    if let Some((ns, name, sub)) = super::remotecommand::target(&method, &path) {
        let served = if sub == "portforward" {
            super::portforward::serve(&st, req, &ns, &name).await
        } else {
            super::remotecommand::serve(&st, req, &ns, &name, sub).await
        };
        return served.unwrap_or_else(|e| error_response(&e));
    }
    if let Some((node, sub)) = super::node_proxy::target(&method, &path) {
        return super::node_proxy::serve(&st, req, &node, &sub)
            .await
            .unwrap_or_else(|e| error_response(&e));
    }
    let header_str = |h: header::HeaderName| {
        req.headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let ctx = Ctx {
        query: Query::parse(req.uri().query()),
        raw_query: req.uri().query().unwrap_or_default().to_string(),
        accept: header_str(header::ACCEPT),
        content_type: header_str(header::CONTENT_TYPE),
        st,
        method,
        cancel,
        server_address,
        user,
    };
    let limit = ctx.st.config.max_body_bytes;
    let body = match Limited::new(req.into_body(), limit).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                return error_response(&ApiError::request_entity_too_large(limit));
            }
            return error_response(&ApiError::bad_request(format!("reading request body: {e}")));
        }
    };
    let started = std::time::Instant::now();
    let resp = match route(&ctx, &path, body).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    };
    tracing::debug!(method = %ctx.method, %path, status = resp.status().as_u16(), elapsed_us = started.elapsed().as_micros() as u64, "request");
    resp
}

fn segments(path: &str) -> Vec<String> {
    path.trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode_path)
        .collect()
}

async fn route(ctx: &Ctx, path: &str, body: Bytes) -> ApiResult<Response<Body>> {
    let segs = segments(path);
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let reg = &ctx.st.resources;
    let get_only = |r: Response<Body>| -> ApiResult<Response<Body>> {
        if ctx.method == Method::GET || ctx.method == Method::HEAD {
            Ok(r)
        } else {
            Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({})",
                ctx.method
            )))
        }
    };
    match s.as_slice() {
        ["version"] => get_only(json_response(StatusCode::OK, &discovery::version())),
        ["api"] => get_only(discovery_response(ctx, true)),
        ["apis"] => get_only(discovery_response(ctx, false)),
        ["api", "v1"] => get_only(json_response(
            StatusCode::OK,
            &discovery::resource_list(reg, "", "v1").unwrap_or(Value::Null),
        )),
        ["apis", group] => match discovery::api_group(reg, group) {
            Some(g) => get_only(json_response(StatusCode::OK, &g)),
            None => Err(ApiError::path_not_found()),
        },
        ["apis", group, version] => match discovery::resource_list(reg, group, version) {
            Some(l) => get_only(json_response(StatusCode::OK, &l)),
            None => Err(ApiError::path_not_found()),
        },
        ["openapi", "v3"] => get_only(json_response(
            StatusCode::OK,
            &discovery::openapi_v3_index(reg),
        )),
        ["openapi", "v3", "api", version] => match discovery::openapi_v3_group(reg, "", version) {
            Some(d) => get_only(json_response(StatusCode::OK, &d)),
            None => Err(ApiError::path_not_found()),
        },
        ["openapi", "v3", "apis", group, version] => {
            match discovery::openapi_v3_group(reg, group, version) {
                Some(d) => get_only(json_response(StatusCode::OK, &d)),
                None => Err(ApiError::path_not_found()),
            }
        }
        ["api", "v1", rest @ ..] => resource_request(ctx, "", "v1", rest, body).await,
        ["apis", group, version, rest @ ..] => {
            resource_request(ctx, group, version, rest, body).await
        }
        _ => Err(ApiError::path_not_found()),
    }
}

fn discovery_response(ctx: &Ctx, core: bool) -> Response<Body> {
    let reg = &ctx.st.resources;
    match discovery::negotiate(&ctx.accept) {
        DiscoveryFormat::Aggregated(v) => {
            let doc = discovery::aggregated(reg, core, v);
            respond(
                StatusCode::OK,
                &discovery::aggregated_content_type(v),
                serde_json::to_vec(&doc).unwrap_or_default(),
            )
        }
        DiscoveryFormat::Legacy => {
            let doc = if core {
                discovery::api_versions(&ctx.server_address)
            } else {
                discovery::api_group_list(reg)
            };
            json_response(StatusCode::OK, &doc)
        }
    }
}

/// The parsed resource part of a path.
struct Target<'a> {
    info: Arc<ResourceInfo>,
    ns: Option<&'a str>,
    name: Option<&'a str>,
    sub: Option<&'a str>,
    watch: bool,
}

fn parse_target<'a>(
    ctx: &Ctx,
    group: &str,
    version: &str,
    rest: &'a [&'a str],
) -> ApiResult<Target<'a>> {
    let reg = &ctx.st.resources;
    let (watch, rest) = match rest {
        ["watch", r @ ..] => (true, r),
        r => (false, r),
    };
    let lookup = |plural: &str| reg.lookup(group, version, plural);
    let (info, ns, rest) = match rest {
        ["namespaces", ns, plural, r @ ..] if lookup(plural).is_some_and(|i| i.namespaced) => (
            lookup(plural).ok_or_else(ApiError::path_not_found)?,
            Some(*ns),
            r,
        ),
        [plural, r @ ..] => {
            let info = lookup(plural).ok_or_else(ApiError::path_not_found)?;
            (info, None, r)
        }
        [] => return Err(ApiError::path_not_found()),
    };
    let (name, sub) = match rest {
        [] => (None, None),
        [name] => (Some(*name), None),
        [name, sub] => (Some(*name), Some(*sub)),
        _ => return Err(ApiError::path_not_found()),
    };
    if let Some(sub) = sub
        && !info.has_subresource(sub)
    {
        return Err(ApiError::path_not_found());
    }
    // A namespaced kind addressed by name needs its namespace.
    if info.namespaced && ns.is_none() && name.is_some() {
        return Err(ApiError::path_not_found());
    }
    Ok(Target {
        info,
        ns,
        name,
        sub,
        watch,
    })
}

fn write_options(ctx: &Ctx, sub: Option<&str>) -> ApiResult<WriteOptions> {
    let dry_run = match ctx.query.non_empty("dryRun") {
        None => false,
        Some("All") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Invalid dryRun value {other:?}: supported values: \"All\""
            )));
        }
    };
    Ok(WriteOptions {
        dry_run,
        field_manager: ctx.query.non_empty("fieldManager").map(str::to_string),
        subresource: sub.map(str::to_string),
        user: Some(ctx.user.clone()),
    })
}

/// Decodes a JSON (or YAML) request body.
fn decode_body(ctx: &Ctx, body: &[u8], info: &ResourceInfo) -> ApiResult<Value> {
    let ct = ctx
        .content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    match ct {
        "" | "application/json" | "*/*" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "error decoding request body into {}: json parse error: {e}",
                info.kind
            ))
        }),
        "application/vnd.kubernetes.protobuf" => super::protobuf::decode(body).map_err(|e| {
            ApiError::bad_request(format!("error decoding protobuf request body: {e}"))
        }),
        "application/yaml" | "application/x-yaml" | "text/yaml" => {
            let text = std::str::from_utf8(body)
                .map_err(|_| ApiError::bad_request("request body is not UTF-8"))?;
            serde_saphyr::from_str::<Value>(text)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
        }
        other => Err(ApiError {
            code: 415,
            reason: "UnsupportedMediaType",
            message: format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf (got {other:?})"
            ),
            details: None,
        }),
    }
}

/// The object as the client's endpoint version sees it (custom resources share storage across
/// versions; conversion strategy None only rewrites apiVersion).
fn object_bytes(info: &ResourceInfo, obj: &Obj) -> Bytes {
    if info.custom && obj.value()["apiVersion"].as_str() != Some(&info.api_version()) {
        let mut v = obj.value();
        v["apiVersion"] = json!(info.api_version());
        return Bytes::from(serde_json::to_vec(&v).unwrap_or_default());
    }
    obj.json.clone()
}

fn object_value(info: &ResourceInfo, obj: &Obj) -> Value {
    let mut v = obj.value();
    if info.custom {
        v["apiVersion"] = json!(info.api_version());
    }
    v
}

fn object_response(
    ctx: &Ctx,
    info: &ResourceInfo,
    status: StatusCode,
    obj: &Obj,
) -> Response<Body> {
    match table::negotiate(&ctx.accept) {
        Output::Json => respond(status, "application/json", object_bytes(info, obj)),
        Output::Metadata(v) => json_response(status, &table::partial_metadata(&obj.value(), v)),
        Output::Table(v) => {
            let include = ctx
                .query
                .non_empty("includeObject")
                .unwrap_or("Metadata")
                .to_string();
            let val = object_value(info, obj);
            json_response(
                status,
                &table::table(
                    info,
                    v,
                    std::iter::once(&val),
                    json!({"resourceVersion": obj.rv.to_string()}),
                    &include,
                    true,
                ),
            )
        }
    }
}

async fn resource_request(
    ctx: &Ctx,
    group: &str,
    version: &str,
    rest: &[&str],
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let t = parse_target(ctx, group, version, rest)?;
    let info = t.info.clone();
    let ns_str = t.ns.unwrap_or_default();
    let st = &ctx.st;
    let watch_param = ctx.query.bool("watch")?;
    match (&ctx.method, t.name, t.sub) {
        (&Method::GET, None, None) | (&Method::HEAD, None, None) => {
            let filter = super::selectors::parse_filter(
                &info,
                ctx.query.get("labelSelector"),
                ctx.query.get("fieldSelector"),
            )?;
            if watch_param || t.watch {
                return start_watch(ctx, info, t.ns.map(str::to_string), filter).await;
            }
            let delay = st.list_delay_ms.load(std::sync::atomic::Ordering::Relaxed);
            if delay > 0 {
                let ms = rand::Rng::random_range(&mut rand::rng(), 0..=delay);
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            }
            list_response(ctx, &info, t.ns, &filter)
        }
        (&Method::GET, Some(name), None) if watch_param || t.watch => {
            let filter = super::selectors::parse_filter(
                &info,
                ctx.query.get("labelSelector"),
                Some(&format!("metadata.name={name}")),
            )?;
            start_watch(ctx, info, t.ns.map(str::to_string), filter).await
        }
        (&Method::GET, Some(name), Some("scale")) => Ok(json_response(
            StatusCode::OK,
            &verbs::get_scale(st, &info, ns_str, name)?,
        )),
        (&Method::PUT, Some(name), Some("scale")) => {
            let b = decode_body(ctx, &body, &info)?;
            let opts = write_options(ctx, None)?;
            let out = verbs::write_scale(st, &info, ns_str, name, Some(b), None, &opts)?;
            Ok(json_response(StatusCode::OK, &out))
        }
        (&Method::PATCH, Some(name), Some("scale")) => {
            let Some(ptype) = PatchType::from_content_type(&ctx.content_type) else {
                return Err(ApiError::unsupported_media_type(&ctx.content_type));
            };
            let opts = write_options(ctx, None)?;
            let out =
                verbs::write_scale(st, &info, ns_str, name, None, Some((ptype, &body)), &opts)?;
            Ok(json_response(StatusCode::OK, &out))
        }
        (&Method::GET, Some(name), None | Some("status" | "approval")) => {
            let obj = verbs::get(st, &info, ns_str, name)?;
            Ok(object_response(ctx, &info, StatusCode::OK, &obj))
        }
        (&Method::POST, None, None) => {
            let ns = match (info.namespaced, t.ns) {
                (true, Some(ns)) => ns,
                (true, None) => {
                    return Err(ApiError::method_not_allowed(
                        "POST requires a namespace for a namespaced resource",
                    ));
                }
                (false, _) => "",
            };
            let obj_body = decode_body(ctx, &body, &info)?;
            let opts = write_options(ctx, None)?;
            let obj = verbs::create(st, &info, ns, obj_body, &opts)?;
            Ok(object_response(ctx, &info, StatusCode::CREATED, &obj))
        }
        (&Method::PUT, Some(name), None | Some("status" | "finalize" | "approval")) => {
            let sub = t.sub;
            let obj_body = decode_body(ctx, &body, &info)?;
            let opts = write_options(ctx, sub)?;
            let (obj, created) = verbs::update(st, &info, ns_str, name, obj_body, &opts)?;
            let code = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(object_response(ctx, &info, code, &obj))
        }
        (&Method::PATCH, Some(name), None | Some("status" | "approval")) => {
            let sub = t.sub;
            let Some(ptype) = PatchType::from_content_type(&ctx.content_type) else {
                return Err(ApiError::unsupported_media_type(&ctx.content_type));
            };
            let opts = write_options(ctx, sub)?;
            let (obj, created) = verbs::patch(st, &info, ns_str, name, ptype, &body, &opts)?;
            let code = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(object_response(ctx, &info, code, &obj))
        }
        (&Method::DELETE, Some(name), None) => {
            let opts = delete_options(ctx, &body)?;
            match verbs::delete(st, &info, ns_str, name, &opts)? {
                Deleted::Pending(obj) => Ok(object_response(ctx, &info, StatusCode::OK, &obj)),
                Deleted::Removed(obj) => {
                    if info.returns_deleted_object {
                        Ok(object_response(ctx, &info, StatusCode::OK, &obj))
                    } else {
                        Ok(json_response(
                            StatusCode::OK,
                            &deleted_status(&info, obj.name(), obj.uid()),
                        ))
                    }
                }
            }
        }
        (&Method::DELETE, None, None) => {
            let filter = super::selectors::parse_filter(
                &info,
                ctx.query.get("labelSelector"),
                ctx.query.get("fieldSelector"),
            )?;
            let opts = delete_options(ctx, &body)?;
            let deleted = verbs::delete_collection(st, &info, t.ns, &filter, &opts)?;
            let items: Vec<Value> = deleted.iter().map(|o| object_value(&info, o)).collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({"kind": info.list_kind(), "apiVersion": info.api_version(), "metadata": {"resourceVersion": st.store.current_rv().to_string()}, "items": items}),
            ))
        }
        (&Method::POST, Some(name), Some("token")) => {
            let tr: Value = if body.is_empty() {
                json!({})
            } else {
                decode_body(ctx, &body, &info)?
            };
            let out = verbs::create_token(st, ns_str, name, tr)?;
            Ok(json_response(StatusCode::CREATED, &out))
        }
        (&Method::GET, Some(name), Some("log")) => {
            super::kubelet::pod_log(st, ns_str, name, &ctx.query, &ctx.raw_query).await
        }
        (&Method::POST, Some(name), Some("binding")) => {
            let b = decode_body(ctx, &body, &info)?;
            let out = verbs::bind_pod(st, ns_str, name, &b)?;
            Ok(json_response(StatusCode::CREATED, &out))
        }
        (m, _, _) => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({m})"
        ))),
    }
}

fn delete_options(ctx: &Ctx, body: &[u8]) -> ApiResult<DeleteOptions> {
    let protobuf = ctx
        .content_type
        .starts_with("application/vnd.kubernetes.protobuf");
    let v: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else if protobuf {
        super::protobuf::decode(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
    };
    let mut opts = DeleteOptions::from_body(&v);
    if let Some(g) = ctx.query.int("gracePeriodSeconds")? {
        opts.grace_period_seconds = Some(g);
    }
    if let Some(p) = ctx.query.non_empty("propagationPolicy") {
        opts.propagation_policy = Some(p.to_string());
    }
    if let Some(p) = &opts.propagation_policy
        && !["Orphan", "Background", "Foreground"].contains(&p.as_str())
    {
        return Err(ApiError::bad_request(format!(
            "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: {p:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
        )));
    }
    if ctx.query.non_empty("dryRun") == Some("All") {
        opts.dry_run = true;
    }
    Ok(opts)
}

fn list_response(
    ctx: &Ctx,
    info: &ResourceInfo,
    ns: Option<&str>,
    filter: &Filter,
) -> ApiResult<Response<Body>> {
    let limit = match ctx.query.int("limit")? {
        Some(l) if l > 0 => Some(l as usize),
        _ => None,
    };
    let exact = match ctx.query.non_empty("resourceVersionMatch") {
        None | Some("NotOlderThan") => false,
        Some("Exact") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
            )));
        }
    };
    let rv = ctx.query.resource_version()?;
    if exact && rv.is_none_or(|r| r == 0) {
        return Err(ApiError::bad_request(
            "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        ));
    }
    let res = verbs::list(
        &ctx.st,
        info,
        &ListRequest {
            ns,
            filter,
            limit,
            continue_token: ctx.query.non_empty("continue"),
            resource_version: rv,
            exact,
        },
    )?;
    let mut list_meta = json!({"resourceVersion": res.page.rv.to_string()});
    if let Some(c) = &res.continue_token {
        list_meta["continue"] = json!(c);
    }
    if let Some(r) = res.page.remaining {
        list_meta["remainingItemCount"] = json!(r);
    }
    match table::negotiate(&ctx.accept) {
        Output::Json => {
            let mut head = serde_json::to_vec(&json!({"kind": info.list_kind(), "apiVersion": info.api_version(), "metadata": list_meta}))
                .unwrap_or_default();
            // Splice the pre-serialized items into the envelope.
            head.pop();
            let mut out = Vec::with_capacity(
                head.len()
                    + res
                        .page
                        .items
                        .iter()
                        .map(|o| o.json.len() + 1)
                        .sum::<usize>()
                    + 16,
            );
            out.extend_from_slice(&head);
            out.extend_from_slice(b",\"items\":[");
            for (i, o) in res.page.items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&object_bytes(info, o));
            }
            out.extend_from_slice(b"]}");
            Ok(respond(StatusCode::OK, "application/json", out))
        }
        Output::Metadata(v) => {
            let items: Vec<Value> = res
                .page
                .items
                .iter()
                .map(|o| json!({"metadata": o.value()["metadata"]}))
                .collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({"kind": "PartialObjectMetadataList", "apiVersion": format!("meta.k8s.io/{v}"), "metadata": list_meta, "items": items}),
            ))
        }
        Output::Table(v) => {
            let include = ctx
                .query
                .non_empty("includeObject")
                .unwrap_or("Metadata")
                .to_string();
            let values: Vec<Value> = res
                .page
                .items
                .iter()
                .map(|o| object_value(info, o))
                .collect();
            Ok(json_response(
                StatusCode::OK,
                &table::table(info, v, values.iter(), list_meta, &include, true),
            ))
        }
    }
}

async fn start_watch(
    ctx: &Ctx,
    info: Arc<ResourceInfo>,
    ns: Option<String>,
    filter: Filter,
) -> ApiResult<Response<Body>> {
    let st = ctx.st.clone();
    let params = watch::params(&info, &ctx.query, &st)?;
    // Test knob: hold new watches while paused.
    let mut gate = st.watch_gate.subscribe();
    while *gate.borrow_and_update() {
        tokio::select! {
            _ = ctx.cancel.cancelled() => return Err(ApiError::service_unavailable("server is shutting down")),
            r = gate.changed() => if r.is_err() { break },
        }
    }
    let output = table::negotiate(&ctx.accept);
    let include = ctx
        .query
        .non_empty("includeObject")
        .unwrap_or("Metadata")
        .to_string();
    let enc = watch::EventEncoder::new(info.clone(), output, include);
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let req = watch::WatchRequest {
        info,
        ns,
        filter,
        params,
    };
    tokio::spawn(watch::run(st, req, enc, tx, ctx.cancel.clone()));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut r = Response::new(StreamBody::new(stream).boxed());
    let ct = match output {
        Output::Json => "application/json",
        _ => "application/json",
    };
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(r)
}
