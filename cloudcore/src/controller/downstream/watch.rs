//! The cluster-wide list-then-watch of one kind, as kube-runtime's `watcher` does it, but
//! telling the actor how far its view reaches: the resourceVersion of each completed list and
//! of every bookmark ([`Input::Progress`]). An edge's copy newer than that is not for this
//! cloudcore to judge (`resync.rs`); kube-runtime keeps those versions to itself.

use super::Input;
use crate::controller::kind::Kind;
use futures_util::StreamExt;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::runtime::watcher::Event;
use kube::{Resource, ResourceExt};
use kubeedge_shared::backoff::Backoff;
use std::fmt::Debug;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Objects per list page.
const PAGE: u32 = 500;
const BACKOFF_FIRST: Duration = Duration::from_millis(800);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// What to watch and how to hand it to the actor.
pub(super) struct Watch<K> {
    pub api: Api<K>,
    pub labels: Option<&'static str>,
    pub wrap: fn(Event<K>) -> Input,
    pub watched: Kind,
}

enum Outcome {
    /// The resourceVersion is too old (410 Gone): list again.
    Relist,
    /// A failure: wait, then watch again from the last resourceVersion.
    Retry(String),
    /// The server ended the watch: watch again at once.
    Ended,
}

impl<K> Watch<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + Debug + Send + 'static,
{
    /// Lists and watches until `shutdown` or until the actor is gone.
    pub async fn run(self, tx: mpsc::Sender<Input>, shutdown: CancellationToken) {
        let what = self.watched.plural();
        let mut backoff = Backoff::new(BACKOFF_FIRST, BACKOFF_MAX);
        let mut rv: Option<String> = None;
        loop {
            let outcome = match &rv {
                None => match self.list(&tx).await {
                    Ok(Some(listed)) => {
                        rv = Some(listed);
                        backoff.reset();
                        continue;
                    }
                    Ok(None) => return,
                    Err(outcome) => outcome,
                },
                Some(from) => {
                    let mut from = from.clone();
                    let outcome = self.watch(&mut from, &tx, &mut backoff).await;
                    rv = Some(from);
                    match outcome {
                        Some(o) => o,
                        None => return,
                    }
                }
            };
            match outcome {
                Outcome::Relist => rv = None,
                Outcome::Ended => {}
                Outcome::Retry(e) => {
                    if tx.send(Input::WatchError(what, e)).await.is_err() {
                        return;
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        }
    }

    /// One complete (paginated) list: `Init`, `InitApply`…, `InitDone`, then its version.
    /// `Ok(None)` when the actor is gone.
    async fn list(&self, tx: &mpsc::Sender<Input>) -> Result<Option<String>, Outcome> {
        let gone = || Ok(None);
        if tx.send((self.wrap)(Event::Init)).await.is_err() {
            return gone();
        }
        let mut token: Option<String> = None;
        loop {
            let mut lp = ListParams::default().limit(PAGE);
            if let Some(l) = self.labels {
                lp = lp.labels(l);
            }
            if let Some(t) = &token {
                lp = lp.continue_token(t);
            }
            let page = self.api.list(&lp).await.map_err(|e| match &e {
                // The continue token expired: the list starts over.
                kube::Error::Api(s) if s.code == 410 => Outcome::Relist,
                _ => Outcome::Retry(e.to_string()),
            })?;
            for item in page.items {
                if tx.send((self.wrap)(Event::InitApply(item))).await.is_err() {
                    return gone();
                }
            }
            match page.metadata.continue_.filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t),
                None => {
                    let rv = page.metadata.resource_version.unwrap_or_default();
                    if tx.send((self.wrap)(Event::InitDone)).await.is_err() {
                        return gone();
                    }
                    self.progress(tx, &rv).await;
                    return Ok(Some(rv));
                }
            }
        }
    }

    /// Watches from `rv` (advanced as events arrive) until the stream ends or fails; `None`
    /// when the actor is gone.
    async fn watch(
        &self,
        rv: &mut String,
        tx: &mpsc::Sender<Input>,
        backoff: &mut Backoff,
    ) -> Option<Outcome> {
        let mut wp = WatchParams::default();
        if let Some(l) = self.labels {
            wp = wp.labels(l);
        }
        let stream = match self.api.watch(&wp, rv).await {
            Ok(s) => s,
            Err(kube::Error::Api(s)) if s.code == 410 => return Some(Outcome::Relist),
            Err(e) => return Some(Outcome::Retry(e.to_string())),
        };
        let mut stream = std::pin::pin!(stream);
        let started = std::time::Instant::now();
        let mut events = 0usize;
        while let Some(ev) = stream.next().await {
            events += 1;
            let input = match ev {
                Ok(WatchEvent::Added(o)) | Ok(WatchEvent::Modified(o)) => {
                    *rv = o.resource_version().unwrap_or_else(|| rv.clone());
                    (self.wrap)(Event::Apply(o))
                }
                Ok(WatchEvent::Deleted(o)) => {
                    *rv = o.resource_version().unwrap_or_else(|| rv.clone());
                    (self.wrap)(Event::Delete(o))
                }
                Ok(WatchEvent::Bookmark(b)) => {
                    *rv = b.metadata.resource_version;
                    self.progress(tx, rv).await;
                    continue;
                }
                Ok(WatchEvent::Error(s)) if s.code == 410 => return Some(Outcome::Relist),
                Ok(WatchEvent::Error(s)) => return Some(Outcome::Retry(s.message.clone())),
                Err(e) => return Some(Outcome::Retry(e.to_string())),
            };
            backoff.reset();
            if tx.send(input).await.is_err() {
                return None;
            }
        }
        if events == 0 && started.elapsed() < Duration::from_secs(1) {
            return Some(Outcome::Retry("watch ended at once".into()));
        }
        // The server ended the watch (its timeout): watch again from here at once.
        Some(Outcome::Ended)
    }

    async fn progress(&self, tx: &mpsc::Sender<Input>, rv: &str) {
        if let Ok(rv) = rv.parse() {
            let _ = tx
                .send(Input::Progress {
                    watched: self.watched,
                    resource_version: rv,
                })
                .await;
        }
    }
}
