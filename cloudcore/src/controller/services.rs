//! Services, Endpoints and EndpointSlices: one cluster-wide watcher per kind, shared by every
//! consumer (never one per node), kept in memory to answer the edges' `query` messages without
//! an apiserver call.
//!
//! What KubeEdge does, and why nothing is pushed here: up to the EdgeMesh-in-edgecore era
//! edgecontroller watched Services and Endpoints and sent every change (and, when a node became
//! Ready, the whole `servicelist`/`endpointslist`) to *every* edge node, and answered
//! `service`/`endpoints` queries from its listers (bare object, `resourceversion` header set,
//! like configmap queries). KubeEdge v1.15 no longer watches them at all (protocol §4.1): its
//! edge metamanager answers `service`/`endpoints` queries from its own database and EdgeMesh
//! reads them through the MetaServer (dynamiccontroller list/watch). Pushing every Service to
//! every node costs services × nodes messages per change, so this controller does not push;
//! it answers the queries the older protocol defined, from this cache:
//!
//! * `<ns>/service/<name>`, `<ns>/endpoints/<name>`, `<ns>/endpointslice/<name>` → the object
//!   (with `apiVersion`/`kind`, `resourceversion` header = its RV), or a NotFound StatusError;
//! * `<ns>/service`, `<ns>/endpoints`, `<ns>/endpointslice` → a JSON array of the namespace's
//!   objects (`null` namespace: all namespaces);
//! * `<ns>/servicelist[/…]`, `<ns>/endpointslist[/…]` → the same array, KubeEdge's list content
//!   shape. In every list form the namespace token `null`, or `namespace` (what KubeEdge put
//!   there), means all namespaces.
//!
//! Memory: each object is kept once, as compact JSON without `managedFields`.

use super::endpoint_index::EndpointIndex;
use super::kind::Kind;
use super::location::ObjectKey;
use super::rest::with_type_meta;
use crate::http::Readiness;
use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tokio_util::sync::CancellationToken;

/// The cached kinds, shared between the watcher task and the upstream handlers.
#[derive(Clone, Default)]
pub struct ServiceCache {
    services: Arc<Store>,
    endpoints: Arc<Store>,
    slices: Arc<Store>,
}

#[derive(Default)]
struct Store {
    objects: RwLock<BTreeMap<ObjectKey, Cached>>,
    synced: AtomicBool,
    /// Node → TCP endpoint, for EndpointSlices only (the relay's check).
    endpoints: Mutex<EndpointIndex>,
}

struct Cached {
    rv: u64,
    json: Arc<str>,
}

/// A list answer: the objects and the highest resourceVersion among them.
pub struct Listed {
    pub items: Vec<Value>,
    pub resource_version: u64,
}

impl ServiceCache {
    /// The cache behind `kind`, for the kinds it holds.
    fn store(&self, kind: Kind) -> Option<&Store> {
        match kind {
            Kind::Service => Some(&self.services),
            Kind::Endpoints => Some(&self.endpoints),
            Kind::EndpointSlice => Some(&self.slices),
            _ => None,
        }
    }

    /// True once `kind`'s watcher has listed everything (until then answers may be incomplete).
    pub fn is_synced(&self, kind: Kind) -> bool {
        self.store(kind)
            .is_some_and(|s| s.synced.load(Ordering::Acquire))
    }

    /// One object (with `apiVersion`/`kind`) and its resourceVersion.
    pub fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<(Value, u64)> {
        let store = self.store(kind)?;
        let (json, rv) = {
            let objects = store.objects.read().unwrap_or_else(|e| e.into_inner());
            let c = objects.get(&(namespace.to_string(), name.to_string()))?;
            (c.json.clone(), c.rv)
        };
        Some((serde_json::from_str(&json).ok()?, rv))
    }

    /// Every object of `kind` in `namespace` (all namespaces for `None`), ordered by key.
    pub fn list(&self, kind: Kind, namespace: Option<&str>) -> Listed {
        let Some(store) = self.store(kind) else {
            return Listed {
                items: Vec::new(),
                resource_version: 0,
            };
        };
        let picked: Vec<(Arc<str>, u64)> = {
            let objects = store.objects.read().unwrap_or_else(|e| e.into_inner());
            match namespace {
                Some(ns) => objects
                    .range((ns.to_string(), String::new())..)
                    .take_while(|(k, _)| k.0 == ns)
                    .map(|(_, c)| (c.json.clone(), c.rv))
                    .collect(),
                None => objects.values().map(|c| (c.json.clone(), c.rv)).collect(),
            }
        };
        let resource_version = picked.iter().map(|(_, rv)| *rv).max().unwrap_or(0);
        let items = picked
            .iter()
            .filter_map(|(j, _)| serde_json::from_str(j).ok())
            .collect();
        Listed {
            items,
            resource_version,
        }
    }

    /// Whether an EndpointSlice places a TCP endpoint `addr` on `node` (what the stream
    /// tunnel's relay may connect to).
    pub fn endpoint_on_node(&self, node: &str, addr: std::net::SocketAddr) -> bool {
        self.slices
            .endpoints
            .lock()
            .map(|i| i.contains(node, addr))
            .unwrap_or(false)
    }

    /// Objects held per kind (services, endpoints, endpointslices).
    pub fn len(&self) -> (usize, usize, usize) {
        let n = |s: &Store| s.objects.read().unwrap_or_else(|e| e.into_inner()).len();
        (n(&self.services), n(&self.endpoints), n(&self.slices))
    }

    /// Runs the three watchers until `shutdown`; `ready` is set once all three have synced.
    pub async fn run(self, client: kube::Client, ready: Readiness, shutdown: CancellationToken) {
        let mut feeds = [
            Feed::new(self.services.clone(), Kind::Service),
            Feed::new(self.endpoints.clone(), Kind::Endpoints),
            Feed::new(self.slices.clone(), Kind::EndpointSlice),
        ];
        let mut streams = futures_util::stream::select_all(vec![
            watch::<Service>(Api::all(client.clone()), 0),
            watch::<Endpoints>(Api::all(client.clone()), 1),
            watch::<EndpointSlice>(Api::all(client), 2),
        ]);
        loop {
            let (i, ev) = tokio::select! {
                _ = shutdown.cancelled() => break,
                item = streams.next() => match item { Some(x) => x, None => break },
            };
            match ev {
                Ok(ev) => feeds[i].apply(ev),
                Err(e) => tracing::warn!(
                    watch = feeds[i].kind.qualified_resource(),
                    error = %e,
                    "watch failed; retrying with backoff"
                ),
            }
            if !ready.is_ready() && feeds.iter().all(|f| f.store.synced.load(Ordering::Acquire)) {
                let (s, e, sl) = self.len();
                tracing::info!(
                    services = s,
                    endpoints = e,
                    endpointslices = sl,
                    "service informers synced"
                );
                ready.set_ready();
            }
        }
    }
}

type Watched = (usize, Result<Event<Value>, String>);

/// A watcher whose events are turned into JSON (the only form the cache keeps).
fn watch<K>(api: Api<K>, index: usize) -> Pin<Box<dyn Stream<Item = Watched> + Send>>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    K: Send + 'static,
{
    let to_json = |k: K| serde_json::to_value(k).unwrap_or(Value::Null);
    watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .map(move |r| {
            let ev = r.map_err(|e| e.to_string()).map(|ev| match ev {
                Event::Init => Event::Init,
                Event::InitDone => Event::InitDone,
                Event::InitApply(k) => Event::InitApply(to_json(k)),
                Event::Apply(k) => Event::Apply(to_json(k)),
                Event::Delete(k) => Event::Delete(to_json(k)),
            });
            (index, ev)
        })
        .boxed()
}

/// The watcher-side state of one store: the keys seen since the last relist began, so that
/// objects deleted while the watch was down (a 410 Gone relist) are dropped at `InitDone`.
struct Feed {
    store: Arc<Store>,
    kind: Kind,
    relisting: Option<HashSet<ObjectKey>>,
}

impl Feed {
    fn new(store: Arc<Store>, kind: Kind) -> Self {
        Feed {
            store,
            kind,
            relisting: None,
        }
    }

    fn apply(&mut self, ev: Event<Value>) {
        match ev {
            Event::Init => self.relisting = Some(HashSet::new()),
            Event::InitApply(v) | Event::Apply(v) => {
                let Some(key) = key_of(&v) else { return };
                if let Some(seen) = self.relisting.as_mut() {
                    seen.insert(key.clone());
                }
                if self.kind == Kind::EndpointSlice {
                    self.index().set(key.clone(), &v);
                }
                let cached = self.compact(v);
                self.write().insert(key, cached);
            }
            Event::Delete(v) => {
                if let Some(key) = key_of(&v) {
                    self.index().remove(&key);
                    self.write().remove(&key);
                }
            }
            Event::InitDone => {
                // Objects not in the new list were deleted meanwhile; until now the previous
                // copies kept answering (stale beats empty during a relist).
                if let Some(seen) = self.relisting.take() {
                    self.index().retain(|k| seen.contains(k));
                    self.write().retain(|k, _| seen.contains(k));
                }
                self.store.synced.store(true, Ordering::Release);
            }
        }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, EndpointIndex> {
        self.store
            .endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<ObjectKey, Cached>> {
        self.store
            .objects
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn compact(&self, mut v: Value) -> Cached {
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
        let rv = v["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let v = with_type_meta(v, self.kind);
        Cached {
            rv,
            json: Arc::from(v.to_string()),
        }
    }
}

fn key_of(v: &Value) -> Option<ObjectKey> {
    let m = &v["metadata"];
    Some((
        m["namespace"].as_str().unwrap_or_default().to_string(),
        m["name"].as_str()?.to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(ns: &str, name: &str, rv: u64) -> Value {
        json!({"metadata": {"namespace": ns, "name": name, "resourceVersion": rv.to_string(),
            "managedFields": [{"manager": "kubectl"}]}, "spec": {"ports": [{"port": 80}]}})
    }

    #[test]
    fn a_relist_drops_what_was_deleted_meanwhile_and_keeps_serving_until_done() {
        let cache = ServiceCache::default();
        let mut feed = Feed::new(cache.services.clone(), Kind::Service);
        feed.apply(Event::Init);
        feed.apply(Event::InitApply(svc("a", "x", 1)));
        feed.apply(Event::InitApply(svc("a", "y", 2)));
        feed.apply(Event::InitApply(svc("b", "z", 3)));
        assert!(!cache.is_synced(Kind::Service));
        feed.apply(Event::InitDone);
        assert!(cache.is_synced(Kind::Service));

        let (obj, rv) = cache.get(Kind::Service, "a", "x").unwrap();
        assert_eq!(
            (obj["kind"].as_str(), obj["apiVersion"].as_str()),
            (Some("Service"), Some("v1"))
        );
        assert!(obj["metadata"].get("managedFields").is_none());
        assert_eq!(rv, 1);
        let listed = cache.list(Kind::Service, Some("a"));
        assert_eq!(listed.items.len(), 2);
        assert_eq!(listed.resource_version, 2);
        assert_eq!(cache.list(Kind::Service, None).items.len(), 3);

        // 410 Gone: relist without y; x changed. y stays served until the relist is complete.
        feed.apply(Event::Init);
        feed.apply(Event::InitApply(svc("a", "x", 7)));
        assert!(cache.get(Kind::Service, "a", "y").is_some());
        feed.apply(Event::InitApply(svc("b", "z", 3)));
        feed.apply(Event::InitDone);
        assert!(cache.get(Kind::Service, "a", "y").is_none());
        assert_eq!(cache.get(Kind::Service, "a", "x").unwrap().1, 7);
        feed.apply(Event::Delete(svc("b", "z", 8)));
        assert!(cache.list(Kind::Service, Some("b")).items.is_empty());
        assert_eq!(cache.len(), (1, 0, 0));
    }

    #[test]
    fn namespace_lists_do_not_leak_into_neighbours() {
        let cache = ServiceCache::default();
        let mut feed = Feed::new(cache.endpoints.clone(), Kind::Endpoints);
        for (ns, n) in [("a", "1"), ("ab", "2"), ("a-", "3"), ("b", "4")] {
            feed.apply(Event::Apply(svc(ns, n, 1)));
        }
        let names: Vec<String> = cache
            .list(Kind::Endpoints, Some("a"))
            .items
            .iter()
            .map(|v| v["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names, ["1"]);
        assert_eq!(
            cache.list(Kind::Endpoints, Some("a")).items[0]["kind"],
            "Endpoints"
        );
    }
}
