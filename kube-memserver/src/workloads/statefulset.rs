//! The StatefulSet controller: pods `<name>-0 … <name>-(N-1)` with stable names, hostnames
//! (`subdomain: serviceName`), `statefulset.kubernetes.io/pod-name`,
//! `apps.kubernetes.io/pod-index` and `controller-revision-hash` labels, and one
//! PersistentVolumeClaim per volumeClaimTemplate and ordinal. OrderedReady creates each pod
//! only once every lower ordinal is Running and Ready, and removes from the highest ordinal
//! down, one at a time; Parallel does both at once. RollingUpdate replaces pods of an old
//! revision from the highest ordinal down to `partition`, one at a time.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::{
    PodName, apps, claim_pods, controller_ref, create_pod, delete_pod, int, pod_available,
    pod_ready, record_event, revisions, sync_owners, write_status,
};
use crate::meta::set_path;
use crate::resources::ResourceInfo;
use crate::state::State;
use crate::store::Obj;
use crate::verbs::{self, WriteOptions};

const COMPONENT: &str = "statefulset-controller";
/// Pods created per pass at most (Parallel policy), as upstream's burst bounds a sync.
const BURST: usize = 500;

pub fn pass(st: &State) {
    sync_owners(st, apps(st, "statefulsets"), |info, v, pods| {
        sync(st, info, v, pods)
    });
}

fn ordinal(sts_name: &str, pod: &Value) -> Option<i64> {
    crate::meta::name(pod)
        .strip_prefix(sts_name)?
        .strip_prefix('-')?
        .parse()
        .ok()
        .filter(|n: &i64| *n >= 0)
}

/// Running and Ready for `minReadySeconds` (what ordered creation waits for).
fn running_and_available(p: &Value, min_ready: i64) -> bool {
    p["status"]["phase"] == "Running" && pod_available(p, min_ready)
}

fn terminating(p: &Value) -> bool {
    !p["metadata"]["deletionTimestamp"].is_null()
}

/// `persistentVolumeClaimRetentionPolicy.<when>` is `Delete`.
fn retention(sts: &Value, when: &str) -> bool {
    sts["spec"]["persistentVolumeClaimRetentionPolicy"][when] == "Delete"
}

/// Under `whenScaled: Delete`, a condemned member's claims are handed to the pod, so that the
/// garbage collector removes them once the pod is gone.
fn release_claims_to_pod(st: &State, sts: &Value, pod: &Value) {
    if !retention(sts, "whenScaled") {
        return;
    }
    let Some(ord) = ordinal(crate::meta::name(sts), pod) else {
        return;
    };
    let ns = crate::meta::namespace(pod);
    let pvc_info = st.core("persistentvolumeclaims");
    for t in sts["spec"]["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let Some(tname) = t["metadata"]["name"].as_str() else {
            continue;
        };
        let claim = format!("{tname}-{}-{ord}", crate::meta::name(sts));
        let Some(pvc) = st.table(&pvc_info).get(&(ns.to_string(), claim)) else {
            continue;
        };
        super::update_object(st, &pvc_info, &pvc.value(), |v| {
            v["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Pod",
                "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"], "blockOwnerDeletion": true}]);
        });
    }
}

fn ensure_claims(st: &State, sts: &Value, ns: &str, ord: i64) -> Vec<Value> {
    let name = crate::meta::name(sts);
    let pvc_info = st.core("persistentvolumeclaims");
    let mut volumes = Vec::new();
    for t in sts["spec"]["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let Some(tname) = t["metadata"]["name"].as_str() else {
            continue;
        };
        let claim = format!("{tname}-{name}-{ord}");
        if st
            .table(&pvc_info)
            .get(&(ns.to_string(), claim.clone()))
            .is_none()
        {
            let mut pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": ns, "labels": sts["spec"]["selector"]["matchLabels"]},
                "spec": t["spec"]});
            if !pvc["metadata"]["labels"].is_object() {
                crate::meta::remove_path(&mut pvc, &["metadata", "labels"]);
            }
            if retention(sts, "whenDeleted") {
                pvc["metadata"]["ownerReferences"] =
                    json!([controller_ref(sts, "apps/v1", "StatefulSet")]);
            }
            if let Err(e) = verbs::create(st, &pvc_info, ns, pvc, &WriteOptions::default())
                && e.reason != "AlreadyExists"
            {
                record_event(
                    st,
                    sts,
                    "Warning",
                    "FailedCreate",
                    &format!(
                        "create Claim {claim} for Pod {name}-{ord} in StatefulSet {name} failed error: {}",
                        e.message
                    ),
                    COMPONENT,
                );
            }
        }
        volumes.push(json!({"name": tname, "persistentVolumeClaim": {"claimName": claim}}));
    }
    volumes
}

fn create_member(st: &State, sts: &Value, ns: &str, ord: i64, revision: &str) {
    let name = crate::meta::name(sts);
    let pod_name = format!("{name}-{ord}");
    let claims = ensure_claims(st, sts, ns, ord);
    let service = sts["spec"]["serviceName"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let created = create_pod(
        st,
        ns,
        &sts["spec"]["template"],
        controller_ref(sts, "apps/v1", "StatefulSet"),
        PodName::Exact(&pod_name),
        |pod| {
            for (k, v) in [
                (revisions::HASH_LABEL, revision.to_string()),
                ("statefulset.kubernetes.io/pod-name", pod_name.clone()),
                ("apps.kubernetes.io/pod-index", ord.to_string()),
            ] {
                set_path(pod, &["metadata", "labels", k], json!(v));
            }
            set_path(pod, &["spec", "hostname"], json!(pod_name));
            if !service.is_empty() {
                set_path(pod, &["spec", "subdomain"], json!(service));
            }
            if !claims.is_empty() {
                let mut volumes = pod["spec"]["volumes"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                for c in &claims {
                    volumes.retain(|v| v["name"] != c["name"]);
                    volumes.push(c.clone());
                }
                set_path(pod, &["spec", "volumes"], Value::Array(volumes));
            }
        },
    );
    match created {
        Ok(_) => record_event(
            st,
            sts,
            "Normal",
            "SuccessfulCreate",
            &format!("create Pod {pod_name} in StatefulSet {name} successful"),
            COMPONENT,
        ),
        Err(e) if e.reason == "AlreadyExists" => {}
        Err(e) => record_event(
            st,
            sts,
            "Warning",
            "FailedCreate",
            &format!(
                "create Pod {pod_name} in StatefulSet {name} failed error: {}",
                e.message
            ),
            COMPONENT,
        ),
    }
}

fn delete_member(st: &State, sts: &Value, pod: &Value) {
    delete_pod(st, pod);
    record_event(
        st,
        sts,
        "Normal",
        "SuccessfulDelete",
        &format!(
            "delete Pod {} in StatefulSet {} successful",
            crate::meta::name(pod),
            crate::meta::name(sts)
        ),
        COMPONENT,
    );
}

pub fn sync(st: &State, info: &ResourceInfo, sts: &Value, pods: &[Arc<Obj>]) {
    if !sts["metadata"]["deletionTimestamp"].is_null() {
        return;
    }
    let ns = crate::meta::namespace(sts).to_string();
    let name = crate::meta::name(sts).to_string();
    let Some((update_revision, _, _)) = revisions::ensure(st, sts, "StatefulSet") else {
        return;
    };
    let replicas = int(&sts["spec"]["replicas"], 1).max(0);
    // `ordinals.start`: members are start..start+replicas.
    let start = int(&sts["spec"]["ordinals"]["start"], 0).max(0);
    let end = start + replicas;
    let parallel = sts["spec"]["podManagementPolicy"] == "Parallel";
    let owned = claim_pods(st, sts, &ns, pods);
    let mut members: BTreeMap<i64, &Value> = BTreeMap::new();
    for p in &owned {
        if let Some(o) = ordinal(&name, p) {
            members.insert(o, p);
        }
    }
    let min_ready = int(&sts["spec"]["minReadySeconds"], 0);
    let current_revision = sts["status"]["currentRevision"]
        .as_str()
        .filter(|s| !s.is_empty())
        .unwrap_or(&update_revision)
        .to_string();
    let partition = int(
        &sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"],
        0,
    );
    let mut blocked = false;
    // Failed members are replaced.
    for (_, p) in members
        .iter()
        .filter(|(_, p)| p["status"]["phase"] == "Failed" && !terminating(p))
    {
        delete_member(st, sts, p);
        blocked = !parallel;
    }
    let mut created = 0;
    for ord in start..end {
        if blocked || created >= BURST {
            break;
        }
        match members.get(&ord) {
            None => {
                let rev = if ord < start + partition {
                    &current_revision
                } else {
                    &update_revision
                };
                create_member(st, sts, &ns, ord, rev);
                created += 1;
                if !parallel {
                    blocked = true;
                }
            }
            Some(p) => {
                if !parallel && (terminating(p) || !running_and_available(p, min_ready)) {
                    blocked = true;
                }
            }
        }
    }
    // Condemned members (outside start..start+replicas), highest first.
    let condemned: Vec<&Value> = members
        .iter()
        .rev()
        .filter(|(o, _)| **o < start || **o >= end)
        .map(|(_, p)| *p)
        .collect();
    if !blocked {
        for p in &condemned {
            if terminating(p) {
                if !parallel {
                    blocked = true;
                    break;
                }
                continue;
            }
            release_claims_to_pod(st, sts, p);
            delete_member(st, sts, p);
            if !parallel {
                blocked = true;
                break;
            }
        }
    }
    // Rolling update: replace the highest-ordinal outdated member once all are healthy.
    let rolling = sts["spec"]["updateStrategy"]["type"] != "OnDelete";
    let all_healthy = (start..end).all(|o| {
        members
            .get(&o)
            .is_some_and(|p| !terminating(p) && running_and_available(p, min_ready))
    });
    if rolling && !blocked && condemned.is_empty() && all_healthy {
        let outdated = members
            .range((start + partition.max(0))..end)
            .rev()
            .find(|(_, p)| {
                p["metadata"]["labels"][revisions::HASH_LABEL].as_str()
                    != Some(update_revision.as_str())
            });
        if let Some((_, p)) = outdated {
            delete_member(st, sts, p);
        }
    }
    let in_use: Vec<&str> = owned
        .iter()
        .filter_map(|p| p["metadata"]["labels"][revisions::HASH_LABEL].as_str())
        .collect();
    revisions::prune(st, sts, &in_use);
    // Status.
    let live: Vec<&Value> = members
        .values()
        .copied()
        .filter(|p| !terminating(p))
        .collect();
    let with_rev = |r: &str| {
        live.iter()
            .filter(|p| p["metadata"]["labels"][revisions::HASH_LABEL].as_str() == Some(r))
            .count() as i64
    };
    let updated = with_rev(&update_revision);
    let current_count = with_rev(&current_revision);
    let done = updated == replicas && live.len() as i64 == replicas;
    let mut status = Map::new();
    status.insert(
        "observedGeneration".into(),
        json!(int(&sts["metadata"]["generation"], 0)),
    );
    status.insert("replicas".into(), json!(live.len()));
    for (k, n) in [
        (
            "readyReplicas",
            live.iter().filter(|p| pod_ready(p)).count() as i64,
        ),
        (
            "currentReplicas",
            if done { updated } else { current_count },
        ),
        ("updatedReplicas", updated),
    ] {
        if n != 0 {
            status.insert(k.into(), json!(n));
        }
    }
    status.insert(
        "availableReplicas".into(),
        json!(live.iter().filter(|p| pod_available(p, min_ready)).count()),
    );
    status.insert(
        "currentRevision".into(),
        json!(if done {
            &update_revision
        } else {
            &current_revision
        }),
    );
    status.insert("updateRevision".into(), json!(update_revision));
    status.insert(
        "collisionCount".into(),
        json!(int(&sts["status"]["collisionCount"], 0)),
    );
    write_status(st, info, sts, Value::Object(status));
}
