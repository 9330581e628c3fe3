//! Watch streams: newline-delimited JSON events over a chunked (HTTP/1.1) or streamed (HTTP/2)
//! body, one flush per event. Handles the start resourceVersion, `sendInitialEvents` with the
//! `k8s.io/initial-events-end` bookmark, periodic bookmarks, `timeoutSeconds`, and the 410 ERROR
//! event for a resourceVersion older than the retained history.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::query::Query;
use super::resources::ResourceInfo;
use super::selectors::Filter;
use super::state::State;
use super::status::{ApiError, ApiResult, Cause};
use super::store::{EventType, Obj, WatchItem, WatchStart};
use super::table::{self, Output};

/// Parsed watch parameters.
pub struct WatchParams {
    pub start: WatchStart,
    pub initial_events_end: bool,
    pub bookmarks: bool,
    pub timeout: Duration,
}

pub fn params(info: &ResourceInfo, q: &Query, st: &State) -> ApiResult<WatchParams> {
    let bookmarks = q.bool("allowWatchBookmarks")?;
    let send_initial = match q.get("sendInitialEvents") {
        None | Some("") => None,
        Some(_) => Some(q.bool("sendInitialEvents")?),
    };
    let rv_match = q.non_empty("resourceVersionMatch");
    let rv = q.resource_version()?;
    if let Some(send) = send_initial {
        let mut causes = Vec::new();
        if rv_match != Some("NotOlderThan") {
            causes.push(Cause::forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if send && !bookmarks {
            causes.push(Cause::forbidden(
                "allowWatchBookmarks",
                "allowWatchBookmarks must be set to true when sendInitialEvents is true",
            ));
        }
        if !causes.is_empty() {
            return Err(ApiError::invalid(info, "", causes).with_kind("ListOptions", "meta.k8s.io"));
        }
    } else if rv_match.is_some() {
        return Err(ApiError::invalid(
            info,
            "",
            vec![Cause::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            )],
        )
        .with_kind("ListOptions", "meta.k8s.io"));
    }
    let start = match (send_initial, rv) {
        (Some(true), _) => WatchStart::InitialState,
        (Some(false), Some(r)) => WatchStart::After(r),
        (Some(false), None) => WatchStart::After(st.store.current_rv()),
        (None, None) | (None, Some(0)) => WatchStart::InitialState,
        (None, Some(r)) => WatchStart::After(r),
    };
    let timeout = match q.int("timeoutSeconds")? {
        Some(s) if s > 0 => Duration::from_secs(s as u64),
        _ => st.config.default_watch_timeout,
    };
    Ok(WatchParams {
        start,
        initial_events_end: send_initial == Some(true),
        bookmarks,
        timeout,
    })
}

/// Encodes watch events for one stream.
pub struct EventEncoder {
    pub info: Arc<ResourceInfo>,
    pub output: Output,
    pub include_object: String,
    headers_sent: bool,
}

impl EventEncoder {
    pub fn new(info: Arc<ResourceInfo>, output: Output, include_object: String) -> Self {
        Self {
            info,
            output,
            include_object,
            headers_sent: false,
        }
    }

    fn line(ty: &str, object: &[u8]) -> Bytes {
        let mut b = BytesMut::with_capacity(object.len() + 32);
        b.put_slice(b"{\"type\":\"");
        b.put_slice(ty.as_bytes());
        b.put_slice(b"\",\"object\":");
        b.put_slice(object);
        b.put_slice(b"}\n");
        b.freeze()
    }

    fn object_line(&mut self, ty: &str, obj: &Obj, rv_override: Option<u64>) -> Bytes {
        let needs_rewrite = rv_override.is_some()
            || (self.info.custom
                && obj.value()["apiVersion"].as_str() != Some(&self.info.api_version()));
        match self.output {
            Output::Json if !needs_rewrite => Self::line(ty, &obj.json),
            _ => {
                let mut v = obj.value();
                if let Some(rv) = rv_override {
                    v["metadata"]["resourceVersion"] = json!(rv.to_string());
                }
                if self.info.custom {
                    v["apiVersion"] = json!(self.info.api_version());
                }
                let out = match self.output {
                    Output::Json => v,
                    Output::Metadata(ver) => table::partial_metadata(&v, ver),
                    Output::Table(ver) => {
                        let t = table::table(
                            &self.info,
                            ver,
                            std::iter::once(&v),
                            json!({"resourceVersion": v["metadata"]["resourceVersion"]}),
                            &self.include_object,
                            !self.headers_sent,
                        );
                        self.headers_sent = true;
                        t
                    }
                };
                Self::line(ty, &serde_json::to_vec(&out).unwrap_or_default())
            }
        }
    }

    pub fn bookmark(&self, rv: u64, initial_events_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = match self.output {
            Output::Metadata(ver) => {
                json!({"kind": "PartialObjectMetadata", "apiVersion": format!("meta.k8s.io/{ver}"), "metadata": metadata})
            }
            _ => {
                json!({"kind": self.info.kind, "apiVersion": self.info.api_version(), "metadata": metadata})
            }
        };
        Self::line("BOOKMARK", &serde_json::to_vec(&obj).unwrap_or_default())
    }

    pub fn error(err: &ApiError) -> Bytes {
        Self::line(
            "ERROR",
            &serde_json::to_vec(&err.to_status()).unwrap_or_default(),
        )
    }

    pub fn item(&mut self, item: &WatchItem) -> Bytes {
        match item {
            WatchItem::Event(ty, obj) => self.object_line(ty.as_str(), obj, None),
            WatchItem::Departed(obj, rv) => {
                self.object_line(EventType::Deleted.as_str(), obj, Some(*rv))
            }
            WatchItem::Bookmark(rv) => self.bookmark(*rv, false),
        }
    }
}

/// What to watch.
pub struct WatchRequest {
    pub info: Arc<ResourceInfo>,
    pub ns: Option<String>,
    pub filter: Filter,
    pub params: WatchParams,
}

/// How long before a watch's timeout its last BOOKMARK is sent (upstream's `cacheWatcher`).
const PRE_TIMEOUT_BOOKMARK: Duration = Duration::from_secs(2);

/// Runs one watch: registers it, then pumps events into `out` until the client goes away, the
/// timeout passes, the server stops, or the watcher is dropped for falling behind.
pub async fn run(
    st: Arc<State>,
    req: WatchRequest,
    mut enc: EventEncoder,
    out: mpsc::Sender<Bytes>,
    cancel: CancellationToken,
) {
    let table = st.table(&req.info);
    let p = req.params;
    let reg = match table.watch(req.ns, Arc::new(req.filter), p.start, p.bookmarks) {
        Ok(r) => r,
        Err(e) => {
            let _ = out.send(EventEncoder::error(&e)).await;
            return;
        }
    };
    let mut rx = reg.rx;
    let guard = reg.guard;
    for item in &reg.initial {
        if out.send(enc.item(item)).await.is_err() {
            return;
        }
    }
    if p.initial_events_end && out.send(enc.bookmark(reg.start_rv, true)).await.is_err() {
        return;
    }
    // As the watch cache (`nextBookmarkTime`): a watch that allows bookmarks gets one 2 s
    // before its timeout (none when the timeout is shorter), so the client resumes exactly
    // where this stream ends; then the stream ends at the timeout.
    let deadline = tokio::time::Instant::now() + p.timeout;
    let pre_timeout =
        (p.bookmarks && p.timeout > PRE_TIMEOUT_BOOKMARK).then(|| deadline - PRE_TIMEOUT_BOOKMARK);
    let mut bookmark_due = pre_timeout.is_some();
    let bookmark_at = tokio::time::sleep_until(pre_timeout.unwrap_or(deadline));
    let timed_out = tokio::time::sleep_until(deadline);
    tokio::pin!(bookmark_at, timed_out);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = out.closed() => return,
            _ = &mut timed_out => break,
            _ = &mut bookmark_at, if bookmark_due => {
                bookmark_due = false;
                guard.request_bookmark();
            }
            item = rx.recv() => match item {
                Some(item) => {
                    if out.send(enc.item(&item)).await.is_err() {
                        return;
                    }
                }
                // Dropped for falling behind: end the stream; the client re-watches.
                None => return,
            }
        }
    }
    drop(guard);
}
