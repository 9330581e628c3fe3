//! Watches: registered at the cloud for kinds it does not push, served from the edge
//! database's change feed as a chunked stream of watch events, listed again after a reconnect.

use super::*;

/// Registers (once per identical watch) a watch of a kind the cloud does not push: the
/// cloud then sends its objects and their changes, which are stored and reach the watch.
/// Returns the registration's Application ID (the watch gives it back when it ends).
pub(super) async fn register_watch<L: CloudLink>(
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
/// [`crate::metaserver::StandingWatch`]).
pub async fn register_standing<L: CloudLink>(
    sh: &Arc<Shared<L>>,
    w: &crate::metaserver::StandingWatch,
) {
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

pub(super) async fn watch<L: CloudLink>(
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
