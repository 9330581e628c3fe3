//! Watch registrations of edges' MetaServers: one apiserver watch per resource (shared by all
//! edges), each change sent to the edges whose registration it matches — only to them.

use super::{Served, normalise};
use crate::cloudhub::HubSink;
use futures_util::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use kubeedge_shared::operation::source;
use kubeedge_shared::selectors::Filter;
use kubeedge_shared::{Group, Message, Operation, StatusError};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// One edge watch.
#[derive(Debug, Clone)]
pub struct Listener {
    pub id: String,
    pub node: String,
    pub served: Served,
    pub namespace: Option<String>,
    pub label_selector: String,
    pub field_selector: String,
}

type ResourceKey = (String, String, String);
/// Registrations of one resource, by (node, Application ID).
type ByNode = HashMap<(String, String), Registered>;
type Registry = Arc<Mutex<HashMap<ResourceKey, ByNode>>>;

struct Registered {
    listener: Listener,
    filter: Filter,
    /// While the registration's own list is being sent: the changes that arrived meanwhile,
    /// sent after it (so that none falls in the gap between the list and the watch).
    pending: Option<Vec<(Operation, Value)>>,
}

/// Changes held for one registration while its list is sent, at most.
const MAX_PENDING: usize = 10_000;

pub struct Listeners {
    client: kube::Client,
    hub: Arc<dyn HubSink>,
    cancel: CancellationToken,
    by_resource: Registry,
    /// The running apiserver watches, stopped when their last registration goes.
    watching: Mutex<HashMap<ResourceKey, CancellationToken>>,
}

fn resource_key(s: &Served) -> ResourceKey {
    (s.group.clone(), s.version.clone(), s.plural.clone())
}

impl Listeners {
    pub fn new(client: kube::Client, hub: Arc<dyn HubSink>, cancel: CancellationToken) -> Self {
        Listeners {
            client,
            hub,
            cancel,
            by_resource: Arc::default(),
            watching: Mutex::default(),
        }
    }

    /// Registers `l` (again): its objects are sent now, their changes from now on.
    pub async fn add(&self, l: Listener) -> Result<(), StatusError> {
        let filter = Filter::parse(
            Some(l.label_selector.as_str()).filter(|s| !s.is_empty()),
            Some(l.field_selector.as_str()).filter(|s| !s.is_empty()),
        )
        .map_err(|e| StatusError::new(400, "BadRequest", e))?;
        let key = resource_key(&l.served);
        let ar = api_resource(&l.served);
        let api: Api<DynamicObject> = match &l.namespace {
            Some(ns) if l.served.namespaced => Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => Api::all_with(self.client.clone(), &ar),
        };
        let mut lp = kube::api::ListParams::default();
        if !l.label_selector.is_empty() {
            lp = lp.labels(&l.label_selector);
        }
        if !l.field_selector.is_empty() {
            lp = lp.fields(&l.field_selector);
        }
        let (node, id) = (l.node.clone(), l.id.clone());
        // Registered before the list: changes during it are held and sent after it.
        if let Ok(mut m) = self.by_resource.lock() {
            m.entry(key.clone()).or_default().insert(
                (node.clone(), id.clone()),
                Registered {
                    listener: l.clone(),
                    filter,
                    pending: Some(Vec::new()),
                },
            );
        }
        self.ensure_watch(key.clone(), l.served.clone());
        let listed = match api.list(&lp).await {
            Ok(listed) => listed,
            Err(e) => {
                if let Ok(mut m) = self.by_resource.lock()
                    && let Some(regs) = m.get_mut(&key)
                {
                    regs.remove(&(node.clone(), id.clone()));
                }
                self.stop_idle();
                return Err(crate::controller::rest::status_error(&e));
            }
        };
        for obj in listed.items {
            let value = object_value(&obj, &l.served);
            send(&*self.hub, &node, Operation::Insert, &l.served, value);
        }
        let held = self
            .by_resource
            .lock()
            .ok()
            .and_then(|mut m| {
                m.get_mut(&key)?
                    .get_mut(&(node.clone(), id.clone()))?
                    .pending
                    .take()
            })
            .unwrap_or_default();
        for (op, value) in held {
            send(&*self.hub, &node, op, &l.served, value);
        }
        tracing::info!(%node, resource = %ar.plural, "edge watch registered");
        Ok(())
    }

    /// Keeps only the listed registrations of `node`.
    pub fn retain(&self, node: &str, ids: &[String]) {
        if let Ok(mut m) = self.by_resource.lock() {
            for regs in m.values_mut() {
                regs.retain(|(n, id), _| n != node || ids.contains(id));
            }
        }
        self.stop_idle();
    }

    /// Drops every registration of `node` (it disconnected; its edge registers again, with a
    /// watch sync, when it connects).
    pub fn forget(&self, node: &str) {
        if let Ok(mut m) = self.by_resource.lock() {
            for regs in m.values_mut() {
                regs.retain(|(n, _), _| n != node);
            }
        }
        self.stop_idle();
    }

    /// Registrations in total.
    #[cfg(test)]
    fn count(&self) -> usize {
        self.by_resource
            .lock()
            .map(|m| m.values().map(HashMap::len).sum())
            .unwrap_or(0)
    }

    /// Stops the apiserver watches no registration uses any more.
    fn stop_idle(&self) {
        let Ok(mut m) = self.by_resource.lock() else {
            return;
        };
        m.retain(|_, regs| !regs.is_empty());
        if let Ok(mut watching) = self.watching.lock() {
            watching.retain(|key, token| {
                let used = m.contains_key(key);
                if !used {
                    token.cancel();
                    tracing::debug!(resource = %key.2, "no edge watches this resource any more; its watch stopped");
                }
                used
            });
        }
    }

    fn ensure_watch(&self, key: ResourceKey, served: Served) {
        let Ok(mut watching) = self.watching.lock() else {
            return;
        };
        if watching.contains_key(&key) {
            return;
        }
        let cancel = self.cancel.child_token();
        watching.insert(key.clone(), cancel.clone());
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &api_resource(&served));
        let regs = self.by_resource.clone();
        let hub = self.hub.clone();
        tokio::spawn(async move {
            let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
            loop {
                let ev = tokio::select! {
                    _ = cancel.cancelled() => return,
                    ev = stream.next() => match ev { Some(e) => e, None => return },
                };
                let (op, obj) = match ev {
                    Ok(Event::Apply(o)) => (Operation::Update, o),
                    Ok(Event::InitApply(o)) => (Operation::Insert, o),
                    Ok(Event::Delete(o)) => (Operation::Delete, o),
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::debug!(resource = %served.plural, error = %e, "watch for edge listeners failed; retrying");
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                        continue;
                    }
                };
                let value = object_value(&obj, &served);
                let ns = value
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let targets: Vec<String> = match regs.lock() {
                    Ok(mut m) => {
                        let mut nodes = HashSet::new();
                        for reg in m.get_mut(&key).into_iter().flat_map(|r| r.values_mut()) {
                            let wanted = reg.listener.namespace.as_ref().is_none_or(|n| *n == ns)
                                && reg.filter.matches(&value);
                            if !wanted {
                                continue;
                            }
                            match &mut reg.pending {
                                Some(held) if held.len() < MAX_PENDING => {
                                    held.push((op.clone(), value.clone()))
                                }
                                _ => {
                                    nodes.insert(reg.listener.node.clone());
                                }
                            }
                        }
                        nodes.into_iter().collect()
                    }
                    Err(_) => Vec::new(),
                };
                for node in targets {
                    send(&*hub, &node, op.clone(), &served, value.clone());
                }
            }
        });
    }
}

fn api_resource(s: &Served) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&s.group, &s.version, &s.kind),
        &s.plural,
    )
}

fn object_value(obj: &DynamicObject, served: &Served) -> Value {
    let mut v = serde_json::to_value(obj).unwrap_or(Value::Null);
    normalise(&mut v, served);
    v
}

/// Sends an object as KubeEdge's dynamiccontroller does: `<ns or null>/<kind>/<name>`,
/// resourceversion header = the object's.
fn send(hub: &dyn HubSink, node: &str, op: Operation, served: &Served, value: Value) {
    let Some(name) = value.pointer("/metadata/name").and_then(Value::as_str) else {
        return;
    };
    let ns = value
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or("null");
    let rv = value
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let resource = format!("{ns}/{}/{name}", served.kind.to_ascii_lowercase());
    let msg = Message::new(
        source::DYNAMIC_CONTROLLER,
        Group::Resource,
        op,
        resource,
        value,
    )
    .with_resource_version(rv);
    if let Err(e) = hub.send(node, msg) {
        tracing::debug!(%node, error = %e, "object for an edge watch not sent; sent again when the edge re-registers");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudhub::queue::Enqueued;
    use crate::cloudhub::{Capabilities, SendError};

    struct NoHub;

    impl HubSink for NoHub {
        fn send(&self, node: &str, _msg: Message) -> Result<Enqueued, SendError> {
            Err(SendError::NotConnected(node.to_string()))
        }
        fn is_connected(&self, _node: &str) -> bool {
            false
        }
        fn connected_nodes(&self) -> Vec<String> {
            Vec::new()
        }
        fn capabilities(&self, _node: &str) -> Option<Capabilities> {
            None
        }
        fn disconnect(&self, _node: &str) -> bool {
            false
        }
    }

    fn served() -> Served {
        Served {
            group: String::new(),
            version: "v1".into(),
            plural: "services".into(),
            kind: "Service".into(),
            namespaced: true,
        }
    }

    fn register(l: &Listeners, node: &str, id: &str) {
        let listener = Listener {
            id: id.into(),
            node: node.into(),
            served: served(),
            namespace: None,
            label_selector: String::new(),
            field_selector: String::new(),
        };
        l.by_resource
            .lock()
            .unwrap()
            .entry(resource_key(&served()))
            .or_default()
            .insert(
                (node.into(), id.into()),
                Registered {
                    listener,
                    filter: Filter::default(),
                    pending: None,
                },
            );
    }

    #[tokio::test]
    async fn registrations_of_gone_edges_are_dropped_and_idle_watches_stopped() {
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                .unwrap();
        let l = Listeners::new(client, Arc::new(NoHub), CancellationToken::new());
        register(&l, "a", "w1");
        register(&l, "a", "w2");
        register(&l, "b", "w3");
        let token = CancellationToken::new();
        l.watching
            .lock()
            .unwrap()
            .insert(resource_key(&served()), token.clone());
        l.retain("a", &["w1".to_string()]);
        assert_eq!(l.count(), 2, "a's w2 is gone, w1 and b's w3 stay");
        l.forget("a");
        assert_eq!(l.count(), 1);
        assert!(!token.is_cancelled(), "b still watches services");
        l.forget("b");
        assert_eq!(l.count(), 0);
        assert!(token.is_cancelled(), "the idle apiserver watch is stopped");
        assert!(l.watching.lock().unwrap().is_empty());
    }
}
