//! The Device status writer: merge patches (`application/merge-patch+json`, as KubeEdge
//! writes them), at most one in flight per device and [`PARALLEL`] in all; a write for a
//! device whose previous one is still pending is folded into it. Once a write succeeds the
//! reports it carries are answered; a failed write answers nothing (the edges send again)
//! and tells the actor to forget what it believed written.
//!
//! A write goes to the Device's `status` (KubeEdge v1.15-era tools read it there) and, when
//! the DeviceStatus CRD is installed, to the DeviceStatus of the same name (KubeEdge v1.23),
//! which is created — owned by the Device, so it goes with it — when it does not exist.

use super::{Input, ObjKey};
use crate::cloudhub::HubSink;
use crate::controller::kind::Kind;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kubeedge_shared::Message;
use serde_json::{Value, json};
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
    /// Merge patch of the Device; `Value::Null` writes nothing there.
    pub patch: Value,
    /// Merge patch of the DeviceStatus of the same name; `None` when its CRD is not installed.
    pub status: Option<Value>,
    /// The Device's UID: the owner reference of a DeviceStatus created here.
    pub uid: String,
    pub replies: Vec<(String, Message)>,
}

impl StatusWrite {
    /// Folds a later write of the same device into this one.
    fn fold(&mut self, later: StatusWrite) {
        if !later.patch.is_null() {
            merge(&mut self.patch, later.patch);
        }
        match (&mut self.status, later.status) {
            (Some(a), Some(b)) => merge(a, b),
            (slot @ None, Some(b)) => *slot = Some(b),
            _ => {}
        }
        if !later.uid.is_empty() {
            self.uid = later.uid;
        }
        self.replies.extend(later.replies);
    }
}

/// A new DeviceStatus for the device `key` (UID `uid`) holding `patch`'s status, owned by
/// the Device as KubeEdge v1.23 makes it (a controller reference, so it is collected with it).
pub fn device_status_object(key: &ObjKey, uid: &str, patch: &Value) -> Value {
    let mut owner = json!({
        "apiVersion": kubeedge_shared::devices::API_VERSION, "kind": "Device",
        "name": key.1, "controller": true, "blockOwnerDeletion": true,
    });
    if !uid.is_empty() {
        owner["uid"] = uid.into();
    }
    let mut obj = json!({
        "apiVersion": kubeedge_shared::devices::API_VERSION, "kind": "DeviceStatus",
        "metadata": {"name": key.1, "namespace": key.0},
        "spec": {},
        "status": patch.get("status").cloned().unwrap_or_else(|| json!({})),
    });
    if !uid.is_empty() {
        obj["metadata"]["ownerReferences"] = json!([owner]);
    }
    obj
}

fn is_code(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Writes one device's status: the Device, then its DeviceStatus (created when missing).
async fn write(client: kube::Client, w: &StatusWrite) -> Result<(), kube::Error> {
    let (ns, name) = (&w.key.0, &w.key.1);
    let pp = PatchParams::default();
    if !w.patch.is_null() {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), ns, &Kind::Device.api_resource());
        api.patch(name, &pp, &Patch::Merge(&w.patch)).await?;
    }
    let Some(status) = &w.status else {
        return Ok(());
    };
    // The Device holds the report now: a DeviceStatus that cannot be written (an older
    // ClusterRole, a differently shaped CRD) is logged, not retried by the edges forever.
    if let Err(e) = write_device_status(client, w, status).await {
        tracing::warn!(namespace = %ns, device = %name, error = %e,
            "DeviceStatus not written (Device.status was); check cloudcore's RBAC for devicestatuses");
    }
    Ok(())
}

async fn write_device_status(
    client: kube::Client,
    w: &StatusWrite,
    status: &Value,
) -> Result<(), kube::Error> {
    let (ns, name) = (&w.key.0, &w.key.1);
    let pp = PatchParams::default();
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, ns, &Kind::DeviceStatus.api_resource());
    match api.patch(name, &pp, &Patch::Merge(status)).await {
        Ok(_) => return Ok(()),
        Err(e) if is_code(&e, 404) => {}
        Err(e) => return Err(e),
    }
    let obj: DynamicObject = serde_json::from_value(device_status_object(&w.key, &w.uid, status))
        .map_err(kube::Error::SerdeError)?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        // Created meanwhile (by another replica): write into it.
        Err(e) if is_code(&e, 409) => api
            .patch(name, &pp, &Patch::Merge(status))
            .await
            .map(|_| ()),
        // The CRD went away: Device.status holds the report.
        Err(e) if is_code(&e, 404) => {
            tracing::debug!(namespace = %ns, device = %name, "DeviceStatus not served; written to Device.status only");
            Ok(())
        }
        Err(e) => Err(e),
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
            let client = client.clone();
            running.spawn(async move {
                let result = self::write(client, &write).await;
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
                    Some(p) => p.fold(w),
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

    fn write(patch: Value, status: Option<Value>) -> StatusWrite {
        StatusWrite {
            key: ("ns".into(), "d".into()),
            patch,
            status,
            uid: "u1".into(),
            replies: Vec::new(),
        }
    }

    #[test]
    fn writes_fold_device_and_device_status_patches_apart() {
        let mut w = write(json!({"status": {"state": "online"}}), None);
        w.fold(write(
            Value::Null,
            Some(json!({"status": {"state": "online"}})),
        ));
        w.fold(write(
            json!({"status": {"conditions": []}}),
            Some(json!({"status": {"twins": []}})),
        ));
        assert_eq!(
            w.patch,
            json!({"status": {"state": "online", "conditions": []}})
        );
        assert_eq!(
            w.status,
            Some(json!({"status": {"state": "online", "twins": []}}))
        );
        // A write with nothing for the Device leaves the Device's patch alone.
        let mut only_status = write(Value::Null, Some(json!({"status": {}})));
        only_status.fold(write(Value::Null, None));
        assert!(only_status.patch.is_null());
    }

    #[test]
    fn a_new_device_status_is_owned_by_its_device() {
        let obj = device_status_object(
            &("ns".into(), "d".into()),
            "u1",
            &json!({"status": {"state": "online"}}),
        );
        assert_eq!(obj["kind"], "DeviceStatus");
        assert_eq!(obj["apiVersion"], "devices.kubeedge.io/v1beta1");
        assert_eq!(obj["metadata"]["name"], "d");
        assert_eq!(obj["metadata"]["namespace"], "ns");
        assert_eq!(obj["status"], json!({"state": "online"}));
        let owner = &obj["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "Device");
        assert_eq!(owner["uid"], "u1");
        assert_eq!(owner["controller"], true);
        // Without a UID (not known) no owner reference is claimed.
        let bare = device_status_object(&("ns".into(), "d".into()), "", &json!({}));
        assert!(bare["metadata"].get("ownerReferences").is_none());
        assert_eq!(bare["status"], json!({}));
    }

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
