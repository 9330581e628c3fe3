//! Randomized fault injection: no update is lost between the cluster and an edge node.
//!
//! A seeded RNG drives about a minute of configmap/secret updates, deletions and re-creations,
//! pods bound to the edge node created, relabelled, deleted gracefully or force-replaced
//! under the same name (busybox `sleep` pods mounting a configmap and a secret, with an env
//! var from a secret), interleaved with faults on the edge's link (`FaultProxy`): connections
//! cut, a half-open blackhole (only dead-link detection notices), added latency, two cloudcore
//! restarts (after one, the new cloudcore's first lists answer slowly and in random order, so
//! the edge reconnects with its inventory while the cloudcore does not yet know the node's
//! pods) and one edgecore restart. Then everything heals and, within a deadline, the edge
//! must have converged: its SQLite `meta` table holds exactly the node's pods (same UID,
//! labels and spec as the cluster) and, at the cluster's current UID, resourceVersion and
//! data, the configmaps/secrets they use, and no object the cluster deleted; every pod runs
//! with its current configmap and secret content in its mounted files; the runtime runs
//! nothing else of the node; the node is Ready.
//!
//! The churn and the fault schedule come from the shared engine (`churn.rs`); `CHAOS_SEED`
//! replays a schedule, `CHAOS_SECS` sets the chaos phase (default 60).
//! `E2E_LOG=edgecore=debug,cloudcore=debug` shows the components' logs.

use crate::churn::{self, Churn, Fault, FaultTarget, uses};
use e2e::edge::{EdgeEnv, is_running_and_ready};
use e2e::images::BUSYBOX_IMAGE;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::ListParams;
use kubeedge_edged::cri::{CriClient, api};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

/// Longest delay of a list after a `CloudRestartSlowLists`.
const SLOW_LISTS: Duration = Duration::from_millis(1500);
/// How long the edge has to converge once everything healed.
const CONVERGE: Duration = Duration::from_secs(60);

/// The faults of one run: the link's, cloudcore restarts (one into the window where the new
/// cloudcore does not yet know the node's pods) and an edgecore restart.
fn faults(rng: &mut rand::rngs::StdRng) -> Vec<Fault> {
    let ms = churn::ms;
    vec![
        Fault::Cut,
        Fault::Cut,
        Fault::Blackhole(ms(rng, 3000, 6000)),
        Fault::Blackhole(ms(rng, 3000, 6000)),
        Fault::Latency(ms(rng, 50, 400), ms(rng, 4000, 8000)),
        Fault::Latency(ms(rng, 50, 400), ms(rng, 4000, 8000)),
        Fault::CloudRestart(ms(rng, 500, 4000)),
        Fault::CloudRestartSlowLists(ms(rng, 500, 2000)),
        Fault::EdgeRestart(ms(rng, 500, 4000)),
    ]
}

impl FaultTarget for EdgeEnv {
    async fn begin(&mut self, f: Fault) {
        match f {
            Fault::Cut => self.link.cut(),
            Fault::Blackhole(_) => self.link.freeze(),
            Fault::Latency(l, _) => self.link.set_latency(l),
            Fault::CloudRestart(_) | Fault::CloudRestartSlowLists(_) => self.stop_cloud(),
            Fault::EdgeRestart(_) => self.stop_edge().await,
        }
    }

    async fn end(&mut self, f: Fault) {
        match f {
            Fault::Cut => {}
            Fault::Blackhole(_) => self.link.thaw(),
            Fault::Latency(..) => self.link.set_latency(Duration::ZERO),
            Fault::CloudRestart(_) => self.start_cloud().await,
            Fault::CloudRestartSlowLists(_) => {
                // A real apiserver's lists are slow enough by themselves.
                if let Some(server) = self.cluster.in_memory() {
                    let delay = server.list_delay();
                    delay.set(SLOW_LISTS);
                    tokio::spawn(async move {
                        tokio::time::sleep(SLOW_LISTS * 3).await;
                        delay.set(Duration::ZERO);
                    });
                }
                self.start_cloud_at_once().await;
                // A fresh edgecore dials at once (a long-failing one may be in a 30 s back-off):
                // its inventory arrives while the lists are still under way.
                self.stop_edge().await;
                self.start_edge().await;
            }
            Fault::EdgeRestart(_) => self.start_edge().await,
        }
    }
}

/// One `meta` row of an object type.
struct Row {
    uid: String,
    rv: String,
    object: Value,
}

/// The edge database's pods, configmaps and secrets, by (type, name); read-only, beside the
/// running edgecore.
fn edge_rows(db: &Path, ns: &str) -> Result<BTreeMap<(String, String), Row>, String> {
    let conn = rusqlite::Connection::open_with_flags(
        db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("opening {}: {e}", db.display()))?;
    let mut stmt = conn
        .prepare("SELECT key, type, value FROM meta WHERE type IN ('pod', 'configmap', 'secret')")
        .map_err(|e| e.to_string())?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })
        .map_err(|e| e.to_string())?;
    let mut out = BTreeMap::new();
    for row in rows {
        let (key, ty, value) = row.map_err(|e| e.to_string())?;
        let object: Value =
            serde_json::from_str(&value).map_err(|e| format!("row {key} is not JSON: {e}"))?;
        let prefix = format!("{ns}/{ty}/");
        let Some(name) = key.strip_prefix(&prefix) else {
            // kube-root-ca.crt of other namespaces would be extra too.
            out.insert((ty, key.clone()), row_of(object));
            continue;
        };
        out.insert((ty, name.to_string()), row_of(object));
    }
    Ok(out)
}

fn row_of(object: Value) -> Row {
    let s = |p: &str| {
        object
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    Row {
        uid: s("/metadata/uid"),
        rv: s("/metadata/resourceVersion"),
        object,
    }
}

/// A command's output in a container; `None` when the runtime cannot run it now.
async fn exec_out(cri: &CriClient, id: &str, cmd: &[&str]) -> Option<String> {
    let r = cri
        .runtime()
        .exec_sync(api::ExecSyncRequest {
            container_id: id.to_string(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 5,
        })
        .await
        .ok()?
        .into_inner();
    (r.exit_code == 0).then(|| String::from_utf8_lossy(&r.stdout).into_owned())
}

/// The pod UIDs the runtime has ready sandboxes or running containers for, on this node.
async fn runtime_uids(cri: &CriClient, node: &str) -> BTreeSet<String> {
    let mut uids = BTreeSet::new();
    let label = HashMap::from([("kubeedge-rs.io/node".to_string(), node.to_string())]);
    if let Ok(r) = cri
        .runtime()
        .list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: label,
                ..Default::default()
            }),
        })
        .await
    {
        for s in r.into_inner().items {
            if s.state() == api::PodSandboxState::SandboxReady {
                uids.extend(s.labels.get("io.kubernetes.pod.uid").cloned());
            }
        }
    }
    uids
}

fn data_of(object: &Value) -> Value {
    object.get("data").cloned().unwrap_or(Value::Null)
}

/// Everything that differs between the cluster and the edge; empty when converged.
async fn differences(env: &EdgeEnv, cri: &CriClient) -> Vec<String> {
    let mut diff = Vec::new();
    match env.node_ready_condition().await {
        Some(c) if c["status"] == "True" => {}
        other => diff.push(format!("node not Ready: {other:?}")),
    }
    let client = env.cluster.client();
    let (Ok(pods), Ok(cms), Ok(secrets)) = (
        env.pods().list(&ListParams::default()).await,
        Api::<ConfigMap>::namespaced(client.clone(), &env.ns)
            .list(&ListParams::default())
            .await,
        Api::<Secret>::namespaced(client, &env.ns)
            .list(&ListParams::default())
            .await,
    ) else {
        diff.push("cannot list the cluster's objects".into());
        return diff;
    };
    let mut cluster: BTreeMap<(String, String), Value> = BTreeMap::new();
    let (mut used_cms, mut used_secrets) = (BTreeSet::new(), BTreeSet::new());
    for p in &pods.items {
        let v = serde_json::to_value(p).unwrap();
        if p.metadata.deletion_timestamp.is_some() {
            diff.push(format!(
                "pod {} ({}) still terminating in the cluster",
                v["metadata"]["name"], v["metadata"]["uid"]
            ));
        }
        uses(&v, &mut used_cms, &mut used_secrets);
        let name = p.metadata.name.clone().unwrap_or_default();
        cluster.insert(("pod".into(), name), v);
    }
    for c in &cms.items {
        let name = c.metadata.name.clone().unwrap_or_default();
        cluster.insert(("configmap".into(), name), serde_json::to_value(c).unwrap());
    }
    for s in &secrets.items {
        let name = s.metadata.name.clone().unwrap_or_default();
        cluster.insert(("secret".into(), name), serde_json::to_value(s).unwrap());
    }
    let rows = match edge_rows(&env.dir.path().join("edgecore.db"), &env.ns) {
        Ok(r) => r,
        Err(e) => {
            diff.push(e);
            return diff;
        }
    };
    let str_of = |v: &Value, p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };

    // Pods: exactly the cluster's, same incarnation, labels and spec.
    for ((ty, name), v) in cluster.iter().filter(|((t, _), _)| t == "pod") {
        let Some(row) = rows.get(&(ty.clone(), name.clone())) else {
            diff.push(format!("pod {name} missing from the edge database"));
            continue;
        };
        let uid = str_of(v, "/metadata/uid");
        if row.uid != uid {
            diff.push(format!(
                "pod {name}: edge holds uid {}, cluster {uid}",
                row.uid
            ));
            continue;
        }
        if row.object["metadata"]["labels"] != v["metadata"]["labels"] {
            diff.push(format!(
                "pod {name}: edge labels {} (rv {}), cluster {} (rv {})",
                row.object["metadata"]["labels"],
                row.rv,
                v["metadata"]["labels"],
                str_of(v, "/metadata/resourceVersion")
            ));
        }
        if row.object["spec"] != v["spec"] {
            diff.push(format!("pod {name}: edge spec differs from the cluster's"));
        }
    }
    // Configmaps and secrets: the used ones at the cluster's version; nothing deleted.
    for ((ty, name), row) in &rows {
        let wanted = match ty.as_str() {
            "pod" => {
                if !cluster.contains_key(&(ty.clone(), name.clone())) {
                    diff.push(format!(
                        "pod {name} ({}) deleted but kept on the edge",
                        row.uid
                    ));
                }
                continue;
            }
            "configmap" => used_cms.contains(name),
            _ => used_secrets.contains(name),
        };
        match cluster.get(&(ty.clone(), name.clone())) {
            None => diff.push(format!(
                "{ty} {name} ({}) deleted but kept on the edge",
                row.uid
            )),
            Some(v) if str_of(v, "/metadata/uid") != row.uid => diff.push(format!(
                "{ty} {name}: edge holds deleted uid {}, cluster {}",
                row.uid,
                str_of(v, "/metadata/uid")
            )),
            Some(v)
                if str_of(v, "/metadata/resourceVersion") != row.rv
                    || data_of(v) != data_of(&row.object) =>
            {
                diff.push(format!(
                    "{ty} {name}{}: edge rv {} data {}, cluster rv {} data {}",
                    if wanted { "" } else { " (unused)" },
                    row.rv,
                    data_of(&row.object),
                    str_of(v, "/metadata/resourceVersion"),
                    data_of(v)
                ))
            }
            Some(_) => {}
        }
    }
    for (ty, used) in [("configmap", &used_cms), ("secret", &used_secrets)] {
        for name in used {
            if !rows.contains_key(&(ty.to_string(), name.clone())) {
                diff.push(format!("{ty} {name} used by a pod but missing on the edge"));
            }
        }
    }

    // Pods run with the current content in their files; the runtime runs nothing else.
    let text = |ty: &str, name: &str| {
        cluster
            .get(&(ty.to_string(), name.to_string()))
            .map(|v| match ty {
                "configmap" => str_of(v, "/data/v"),
                _ => {
                    let b64 = str_of(v, "/data/v");
                    serde_json::from_value::<ByteString>(json!(b64))
                        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                        .unwrap_or_default()
                }
            })
    };
    let mut live = BTreeSet::new();
    for ((_, name), v) in cluster.iter().filter(|((t, _), _)| t == "pod") {
        live.insert(str_of(v, "/metadata/uid"));
        if !is_running_and_ready(v) {
            diff.push(format!(
                "pod {name} not Running and Ready: phase {}",
                v["status"]["phase"]
            ));
            continue;
        }
        let id = str_of(v, "/status/containerStatuses/0/containerID");
        let id = id.strip_prefix("containerd://").unwrap_or(&id);
        for (ty, vol, file) in [
            ("configmap", "cfg", "/etc/cfg/v"),
            ("secret", "sec", "/etc/sec/v"),
        ] {
            let source = v["spec"]["volumes"]
                .as_array()
                .and_then(|vs| vs.iter().find(|x| x["name"] == vol))
                .map(|x| {
                    x["configMap"]["name"]
                        .as_str()
                        .or(x["secret"]["secretName"].as_str())
                        .unwrap_or("")
                        .to_string()
                })
                .unwrap_or_default();
            let want = text(ty, &source);
            let got = exec_out(cri, id, &["cat", file]).await;
            if got != want {
                diff.push(format!(
                    "pod {name}: {file} holds {got:?}, {ty} {source} has {want:?}"
                ));
            }
        }
    }
    let running = runtime_uids(cri, &env.node).await;
    for uid in running.difference(&live) {
        diff.push(format!("runtime still runs a sandbox of deleted pod {uid}"));
    }
    diff
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_update_is_lost_between_cluster_and_edge_under_link_faults() {
    let (seed, total) = churn::seed_and_length("chaos", 60);
    let mut env = EdgeEnv::start("chaos").await;
    let client = env.cluster.client();
    let mut churn = Churn::start("chaos", client, &env.ns, &env.node, BUSYBOX_IMAGE, seed).await;
    let faults = faults(&mut churn.rng);
    let faults = churn::schedule(&mut churn.rng, total, faults);
    churn.run(total, faults, (100, 500), &mut env).await;

    // Heal: the link is clean, both sides run, every referenced object exists.
    env.link.thaw();
    env.link.set_latency(Duration::ZERO);
    if env.cloud.is_none() {
        env.start_cloud().await;
    }
    if env.edge.is_none() {
        env.start_edge().await;
    }
    churn.heal().await;
    let cri = env.cri().await;
    let (diff, took) = churn::converge("chaos", CONVERGE, Duration::from_millis(500), || {
        differences(&env, &cri)
    })
    .await;
    if !diff.is_empty() {
        panic!(
            "CHAOS_SEED={seed}: the edge did not converge within {CONVERGE:?} after healing:\n{}",
            churn::listing(&diff)
        );
    }
    let pods = env.pods().list(&ListParams::default()).await.expect("pods");
    println!(
        "chaos: converged {took:?} after healing (seed {seed}), {} pods running",
        pods.items.len()
    );
    env.finish().await;
}
