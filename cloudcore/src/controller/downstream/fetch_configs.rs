//! Configmaps and secrets for resyncs, read once for every node that needs them: a storm of
//! 10,000 reconnecting edges that all use one updated configmap costs one GET, not 10,000.
//!
//! Each request names the version the actor's watcher delivered (an older copy would not be
//! sent). A copy read at least that new — cached, or a GET under way when its answer comes —
//! serves every node waiting for it; a waiter that wants a newer version than a GET brought
//! waits for the next one. The cache is bounded ([`CACHE_ENTRIES`], [`CACHE_BYTES`]; the oldest
//! read goes first): a miss only costs the GET it would have cost anyway.

use super::fetch::{ConfigWant, Fetched};
use super::{ConfigKind, ConfigKindExt, Input, parse_rv};
use crate::controller::location::ObjectKey;
use crate::controller::rest::{self, with_type_meta};
use serde_json::Value;
use std::collections::{HashMap, HashSet, VecDeque};
use tokio::sync::mpsc;

/// GETs under way at once.
const CONCURRENCY: usize = 16;
/// Objects kept, and their size as JSON.
const CACHE_ENTRIES: usize = 16_384;
const CACHE_BYTES: usize = 64 << 20;
/// GETs a waiter sits through that brought an older copy than it wants (an apiserver that
/// answers from behind its own watch) before it is answered with what there is.
const MAX_TRIES: u8 = 3;

type Key = (ConfigKind, ObjectKey);

struct Cached {
    rv: u64,
    object: Value,
    bytes: usize,
}

/// A GET's outcome: the object, `None` when it does not exist, `Err` when it could not be read.
pub(super) struct Read {
    key: Key,
    object: Result<Option<Value>, ()>,
}

/// A node waiting for an object at least as new as `rv`.
struct Waiter {
    node: String,
    rv: u64,
    tries: u8,
}

pub(super) struct ConfigReader {
    client: kube::Client,
    answers: mpsc::Sender<Input>,
    done: mpsc::UnboundedSender<Read>,
    cache: HashMap<Key, Cached>,
    /// Cached keys, oldest read first.
    order: VecDeque<Key>,
    cached_bytes: usize,
    /// Objects with nodes waiting: each is either queued or under way.
    waiting: HashMap<Key, Vec<Waiter>>,
    queued: VecDeque<Key>,
    in_flight: HashSet<Key>,
}

impl ConfigReader {
    pub(super) fn new(
        client: kube::Client,
        answers: mpsc::Sender<Input>,
        done: mpsc::UnboundedSender<Read>,
    ) -> Self {
        ConfigReader {
            client,
            answers,
            done,
            cache: HashMap::new(),
            order: VecDeque::new(),
            cached_bytes: 0,
            waiting: HashMap::new(),
            queued: VecDeque::new(),
            in_flight: HashSet::new(),
        }
    }

    /// `node` needs `wants`: what the cache holds new enough is answered at once, the rest
    /// when read.
    pub(super) async fn request(&mut self, node: String, wants: Vec<ConfigWant>) {
        let mut ready = Vec::new();
        for w in wants {
            let key = (w.kind, w.key);
            match self.cache.get(&key) {
                Some(c) if c.rv >= w.rv => ready.push(Fetched {
                    kind: key.0,
                    key: key.1,
                    object: Some(c.object.clone()),
                }),
                _ => self.wait(
                    key,
                    Waiter {
                        node: node.clone(),
                        rv: w.rv,
                        tries: 0,
                    },
                ),
            }
        }
        if !ready.is_empty() {
            self.answer(node, ready).await;
        }
        self.start();
    }

    fn wait(&mut self, key: Key, waiter: Waiter) {
        let list = self.waiting.entry(key.clone()).or_default();
        let first = list.is_empty();
        list.push(waiter);
        if first && !self.in_flight.contains(&key) {
            self.queued.push_back(key);
        }
    }

    /// Starts GETs for queued objects, up to [`CONCURRENCY`].
    fn start(&mut self) {
        while self.in_flight.len() < CONCURRENCY {
            let Some(key) = self.queued.pop_front() else {
                return;
            };
            self.in_flight.insert(key.clone());
            let (client, done) = (self.client.clone(), self.done.clone());
            tokio::spawn(async move {
                let object = get(&client, &key).await;
                let _ = done.send(Read { key, object });
            });
        }
    }

    /// A GET answered: every waiter it is new enough for is answered.
    pub(super) async fn read_done(&mut self, read: Read) {
        let Read { key, object } = read;
        self.in_flight.remove(&key);
        let waiters = self.waiting.remove(&key).unwrap_or_default();
        let gone = matches!(object, Ok(None));
        match object {
            Ok(Some(object)) => {
                let rv = parse_rv(object["metadata"]["resourceVersion"].as_str());
                let mut again = Vec::new();
                for w in waiters {
                    if rv >= w.rv || w.tries + 1 >= MAX_TRIES {
                        let fetched = Fetched {
                            kind: key.0,
                            key: key.1.clone(),
                            object: Some(object.clone()),
                        };
                        self.answer(w.node, vec![fetched]).await;
                    } else {
                        again.push(Waiter {
                            tries: w.tries + 1,
                            ..w
                        });
                    }
                }
                self.remember(key.clone(), rv, object);
                for w in again {
                    self.wait(key.clone(), w);
                }
            }
            Ok(None) | Err(()) => {
                if gone {
                    self.forget(&key);
                }
                for w in waiters {
                    let fetched = Fetched {
                        kind: key.0,
                        key: key.1.clone(),
                        object: None,
                    };
                    self.answer(w.node, vec![fetched]).await;
                }
            }
        }
        self.start();
    }

    async fn answer(&self, node: String, objects: Vec<Fetched>) {
        let _ = self
            .answers
            .send(Input::ConfigsFetched { node, objects })
            .await;
    }

    fn remember(&mut self, key: Key, rv: u64, object: Value) {
        if self.cache.get(&key).is_some_and(|c| c.rv >= rv) {
            return;
        }
        self.forget(&key);
        let bytes = object.to_string().len();
        if bytes > CACHE_BYTES / 16 {
            return; // a huge object would push out everything else
        }
        while self.cache.len() >= CACHE_ENTRIES || self.cached_bytes + bytes > CACHE_BYTES {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(c) = self.cache.remove(&old) {
                self.cached_bytes -= c.bytes;
            }
        }
        self.cached_bytes += bytes;
        self.order.push_back(key.clone());
        self.cache.insert(key, Cached { rv, object, bytes });
    }

    fn forget(&mut self, key: &Key) {
        if let Some(c) = self.cache.remove(key) {
            self.cached_bytes -= c.bytes;
            self.order.retain(|k| k != key);
        }
    }
}

async fn get(client: &kube::Client, key: &Key) -> Result<Option<Value>, ()> {
    let (kind, (ns, name)) = key;
    let req = rest::get(kind.api_kind(), Some(ns), name);
    match rest::call_retrying(client, req).await {
        Ok(obj) => Ok(Some(with_type_meta(obj, kind.api_kind()))),
        Err(e) if rest::is_not_found(&e) => Ok(None),
        Err(e) => {
            tracing::warn!(?key, error = %e, "cannot fetch object for a resync; the edge asks for it when a pod needs it");
            Err(())
        }
    }
}
