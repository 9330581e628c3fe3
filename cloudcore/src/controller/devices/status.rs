//! The Device status writer: merge patches (`application/merge-patch+json`, as KubeEdge
//! writes them), at most one in flight per device and [`PARALLEL`] in all; a write for a
//! device whose previous one is still pending is folded into it. Once a write succeeds the
//! reports it carries are answered; a failed write answers nothing (the edges send again)
//! and tells the actor to forget what it believed written.

use super::{Input, ObjKey};
use crate::controller::downstream::HubSink;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kubeedge_shared::Message;
use serde_json::Value;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Writes waiting for the writer, at most (beyond it reports go unanswered and are resent).
pub const QUEUE: usize = 4096;
/// Patches in flight at once.
pub const PARALLEL: usize = 16;

/// One status change of one device and the reports it answers.
#[derive(Debug)]
pub struct StatusWrite {
    pub key: ObjKey,
    pub patch: Value,
    pub replies: Vec<(String, Message)>,
}

/// `devices.kubeedge.io/v1beta1` `Device`.
pub fn device_resource() -> ApiResource {
    ApiResource {
        group: kubeedge_shared::devices::GROUP.into(),
        version: kubeedge_shared::devices::VERSION.into(),
        api_version: kubeedge_shared::devices::API_VERSION.into(),
        kind: "Device".into(),
        plural: "devices".into(),
    }
}

/// `devices.kubeedge.io/v1beta1` `DeviceModel`.
pub fn model_resource() -> ApiResource {
    ApiResource {
        kind: "DeviceModel".into(),
        plural: "devicemodels".into(),
        ..device_resource()
    }
}

/// Folds `next` into `into`: objects merge key by key, anything else is replaced.
fn merge(into: &mut Value, next: Value) {
    match (into, next) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(&k) {
                    Some(slot) if slot.is_object() && v.is_object() => merge(slot, v),
                    _ => {
                        a.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

pub async fn run(
    client: kube::Client,
    hub: Arc<dyn HubSink>,
    mut rx: mpsc::Receiver<StatusWrite>,
    actor: mpsc::Sender<Input>,
    shutdown: CancellationToken,
) {
    let ar = device_resource();
    let mut pending: HashMap<ObjKey, StatusWrite> = HashMap::new();
    let mut order: VecDeque<ObjKey> = VecDeque::new();
    let mut busy: HashSet<ObjKey> = HashSet::new();
    let mut running: JoinSet<(StatusWrite, Result<(), kube::Error>)> = JoinSet::new();
    let mut open = true;
    loop {
        // Start what may start.
        let mut deferred = VecDeque::new();
        while running.len() < PARALLEL {
            let Some(key) = order.pop_front() else { break };
            if busy.contains(&key) {
                deferred.push_back(key);
                continue;
            }
            let Some(write) = pending.remove(&key) else {
                continue;
            };
            busy.insert(key.clone());
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &key.0, &ar);
            running.spawn(async move {
                let result = api
                    .patch(&key.1, &PatchParams::default(), &Patch::Merge(&write.patch))
                    .await
                    .map(|_| ());
                (write, result)
            });
        }
        order.extend(deferred);
        if !open && running.is_empty() && pending.is_empty() {
            return;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            w = rx.recv(), if open => match w {
                Some(w) => match pending.get_mut(&w.key) {
                    Some(p) => {
                        merge(&mut p.patch, w.patch);
                        p.replies.extend(w.replies);
                    }
                    None => {
                        order.push_back(w.key.clone());
                        pending.insert(w.key.clone(), w);
                    }
                },
                None => open = false,
            },
            Some(done) = running.join_next(), if !running.is_empty() => {
                let Ok((write, result)) = done else { continue };
                busy.remove(&write.key);
                match result {
                    Ok(()) => {
                        for (node, report) in &write.replies {
                            let _ = hub.send(node, super::messages::report_ok(report));
                        }
                    }
                    Err(e) => {
                        tracing::warn!(namespace = %write.key.0, device = %write.key.1, error = %e,
                            "device status not written; the edge sends its report again");
                        let _ = actor.send(Input::WriteFailed(write.key)).await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn later_writes_fold_into_pending_ones() {
        let mut p = json!({"status": {"twins": [{"propertyName": "a"}]}});
        merge(&mut p, json!({"status": {"state": "online"}}));
        merge(
            &mut p,
            json!({"status": {"twins": [{"propertyName": "b"}]}}),
        );
        assert_eq!(
            p,
            json!({"status": {"twins": [{"propertyName": "b"}], "state": "online"}})
        );
    }
}
