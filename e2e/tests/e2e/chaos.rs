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
//! `CHAOS_SEED` replays a schedule (the seed is printed; timing still varies), `CHAOS_SECS`
//! sets the length of the chaos phase (default 60). `E2E_LOG=edgecore=debug,cloudcore=debug`
//! shows the components' logs.

use e2e::edge::{EdgeEnv, is_running_and_ready};
use e2e::images::BUSYBOX_IMAGE;
use edgecore::cri::{CriClient, api};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

/// Configmaps and secrets the pods pick from: few, so pods share them.
pub(crate) const CONFIGS: usize = 3;
/// Pods alive (terminating ones included) at most.
const MAX_PODS: usize = 6;
/// Longest delay of a list after a `CloudRestartSlowLists`.
const SLOW_LISTS: Duration = Duration::from_millis(1500);
/// How long the edge has to converge once everything healed.
const CONVERGE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Every open connection closed; both ends see it.
    Cut,
    /// Nothing forwarded, nothing closed, for this long.
    Blackhole(Duration),
    /// This much added in each direction, for this long.
    Latency(Duration, Duration),
    /// cloudcore down for this long, then a new one.
    CloudRestart(Duration),
    /// The same, and the new cloudcore's first lists answer slowly and in random order (on
    /// the in-memory apiserver), and edgecore restarts with it: the edge reconnects and sends
    /// its inventory while the cloudcore does not yet know all of the node's pods.
    CloudRestartSlowLists(Duration),
    /// edgecore down for this long, then started again on the same database.
    EdgeRestart(Duration),
}

impl Fault {
    fn duration(self) -> Duration {
        match self {
            Fault::Cut => Duration::ZERO,
            Fault::Blackhole(d)
            | Fault::Latency(_, d)
            | Fault::CloudRestart(d)
            | Fault::CloudRestartSlowLists(d)
            | Fault::EdgeRestart(d) => d,
        }
    }
}

fn ms(rng: &mut StdRng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo..=hi))
}

/// The faults, shuffled, one per equal slot of `total`, each at a random point of its slot.
fn schedule(rng: &mut StdRng, total: Duration) -> Vec<(Duration, Fault)> {
    let mut faults = vec![
        Fault::Cut,
        Fault::Cut,
        Fault::Blackhole(ms(rng, 3000, 6000)),
        Fault::Blackhole(ms(rng, 3000, 6000)),
        Fault::Latency(ms(rng, 50, 400), ms(rng, 4000, 8000)),
        Fault::Latency(ms(rng, 50, 400), ms(rng, 4000, 8000)),
        Fault::CloudRestart(ms(rng, 500, 4000)),
        Fault::CloudRestartSlowLists(ms(rng, 500, 2000)),
        Fault::EdgeRestart(ms(rng, 500, 4000)),
    ];
    for i in (1..faults.len()).rev() {
        faults.swap(i, rng.random_range(0..=i));
    }
    let slot = total / faults.len() as u32;
    faults
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let room = slot.saturating_sub(f.duration()).as_millis() as u64;
            (
                slot * i as u32 + Duration::from_millis(rng.random_range(0..=room)),
                f,
            )
        })
        .collect()
}

pub(crate) fn configmap(name: &str, v: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": v}})).unwrap()
}

pub(crate) fn secret(name: &str, v: &str) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "v".to_string(),
            ByteString(v.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

/// The configmap/secret part of one random change (rolls 0–48 of 100): update or create, or
/// delete, one of `CONFIGS` configmaps or secrets; None for other rolls. Shared by both chaos
/// tests so that they churn the same way.
pub(crate) async fn change_config(
    roll: usize,
    rng: &mut StdRng,
    cms: &Api<ConfigMap>,
    secrets: &Api<Secret>,
    step: &str,
) -> Option<&'static str> {
    let pp = PostParams::default();
    let mut pick = || rng.random_range(0..CONFIGS);
    Some(match roll {
        0..=24 => {
            let cm = format!("cm-{}", pick());
            let patch = json!({"data": {"v": step}});
            let r = cms
                .patch(&cm, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            if r.is_err() {
                let _ = cms.create(&pp, &configmap(&cm, step)).await;
                "configmap created"
            } else {
                "configmap updated"
            }
        }
        25..=29 => {
            let cm = format!("cm-{}", pick());
            let _ = cms.delete(&cm, &DeleteParams::default()).await;
            "configmap deleted"
        }
        30..=44 => {
            let s = format!("sec-{}", pick());
            if secrets.replace(&s, &pp, &secret(&s, step)).await.is_err() {
                let _ = secrets.create(&pp, &secret(&s, step)).await;
                "secret created"
            } else {
                "secret updated"
            }
        }
        45..=48 => {
            let s = format!("sec-{}", pick());
            let _ = secrets.delete(&s, &DeleteParams::default()).await;
            "secret deleted"
        }
        _ => return None,
    })
}

fn chaos_pod(name: &str, cm: usize, sec: usize, env_sec: usize, generation: u64) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"chaos": "yes", "gen": generation.to_string()}},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"],
                "env": [{"name": "SEC", "valueFrom":
                    {"secretKeyRef": {"name": format!("sec-{env_sec}"), "key": "v"}}}],
                "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"},
                    {"name": "sec", "mountPath": "/etc/sec"}]}],
            "volumes": [{"name": "cfg", "configMap": {"name": format!("cm-{cm}")}},
                {"name": "sec", "secret": {"secretName": format!("sec-{sec}")}}]},
    })
}

/// The configmaps and secrets a pod (JSON) uses: volumes, projected sources, env, envFrom.
pub(crate) fn uses(pod: &Value, cms: &mut BTreeSet<String>, secrets: &mut BTreeSet<String>) {
    let name = |v: &Value| v.as_str().map(str::to_string);
    let spec = &pod["spec"];
    for v in spec["volumes"].as_array().into_iter().flatten() {
        cms.extend(name(&v["configMap"]["name"]));
        secrets.extend(name(&v["secret"]["secretName"]));
        for s in v["projected"]["sources"].as_array().into_iter().flatten() {
            cms.extend(name(&s["configMap"]["name"]));
            secrets.extend(name(&s["secret"]["name"]));
        }
    }
    let containers = spec["containers"].as_array().into_iter().flatten();
    let init = spec["initContainers"].as_array().into_iter().flatten();
    for c in containers.chain(init) {
        for e in c["env"].as_array().into_iter().flatten() {
            cms.extend(name(&e["valueFrom"]["configMapKeyRef"]["name"]));
            secrets.extend(name(&e["valueFrom"]["secretKeyRef"]["name"]));
        }
        for e in c["envFrom"].as_array().into_iter().flatten() {
            cms.extend(name(&e["configMapRef"]["name"]));
            secrets.extend(name(&e["secretRef"]["name"]));
        }
    }
}

/// The test's side: the cluster's APIs and a counter for fresh values and names.
struct Driver {
    rng: StdRng,
    cms: Api<ConfigMap>,
    secrets: Api<Secret>,
    step: u64,
    ops: BTreeMap<&'static str, usize>,
}

impl Driver {
    fn pick(&mut self, n: usize) -> usize {
        self.rng.random_range(0..n)
    }

    async fn live_pods(env: &EdgeEnv) -> Vec<Pod> {
        env.pods()
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    /// One random change in the cluster. API errors (a conflict, a name in use) are fine:
    /// the cluster is the truth the edge must converge to, whatever it became.
    async fn change(&mut self, env: &EdgeEnv) {
        self.step += 1;
        let step = self.step.to_string();
        let pods = Self::live_pods(env).await;
        let names: Vec<String> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        let roll = self.pick(100);
        let pp = PostParams::default();
        let config = change_config(roll, &mut self.rng, &self.cms, &self.secrets, &step).await;
        let op = match config {
            Some(op) => op,
            None => match roll {
                49..=66 if pods.len() < MAX_PODS => {
                    let (cm, sec, env_sec) =
                        (self.pick(CONFIGS), self.pick(CONFIGS), self.pick(CONFIGS));
                    let spec = chaos_pod(&format!("pod-{step}"), cm, sec, env_sec, self.step);
                    env.create_pod(spec).await;
                    "pod created"
                }
                67..=79 if !names.is_empty() => {
                    let name = names[self.pick(names.len())].clone();
                    let patch = json!({"metadata": {"labels": {"gen": step}}});
                    let _ = env
                        .pods()
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                    "pod relabelled"
                }
                80..=89 if !names.is_empty() => {
                    let name = names[self.pick(names.len())].clone();
                    let _ = env.pods().delete(&name, &DeleteParams::default()).await;
                    "pod deleted"
                }
                90..=99 if !names.is_empty() => {
                    // Gone from the API at once, back under the same name with a new UID and
                    // other references: the edge must not confuse the two.
                    let name = names[self.pick(names.len())].clone();
                    let _ = env
                        .pods()
                        .delete(
                            &name,
                            &DeleteParams {
                                grace_period_seconds: Some(0),
                                ..Default::default()
                            },
                        )
                        .await;
                    let (cm, sec, env_sec) =
                        (self.pick(CONFIGS), self.pick(CONFIGS), self.pick(CONFIGS));
                    let mut spec = chaos_pod(&name, cm, sec, env_sec, self.step);
                    spec["apiVersion"] = json!("v1");
                    spec["kind"] = json!("Pod");
                    spec["spec"]["nodeName"] = json!(env.node);
                    let pod: Pod = serde_json::from_value(spec).expect("a Pod");
                    let _ = env.pods().create(&pp, &pod).await;
                    "pod force-replaced"
                }
                _ => "nothing",
            },
        };
        *self.ops.entry(op).or_default() += 1;
    }

    /// Makes every configmap and secret a pod may use exist again (pods wait for them).
    async fn recreate_missing(&mut self) {
        let pp = PostParams::default();
        for i in 0..CONFIGS {
            let (cm, s) = (format!("cm-{i}"), format!("sec-{i}"));
            if self.cms.get_opt(&cm).await.ok().flatten().is_none() {
                let _ = self.cms.create(&pp, &configmap(&cm, "healed")).await;
            }
            if self.secrets.get_opt(&s).await.ok().flatten().is_none() {
                let _ = self.secrets.create(&pp, &secret(&s, "healed")).await;
            }
        }
    }
}

async fn apply_fault(env: &mut EdgeEnv, f: Fault) {
    match f {
        Fault::Cut => env.link.cut(),
        Fault::Blackhole(_) => env.link.freeze(),
        Fault::Latency(l, _) => env.link.set_latency(l),
        Fault::CloudRestart(_) | Fault::CloudRestartSlowLists(_) => env.stop_cloud(),
        Fault::EdgeRestart(_) => env.stop_edge().await,
    }
}

async fn end_fault(env: &mut EdgeEnv, f: Fault) {
    match f {
        Fault::Cut => {}
        Fault::Blackhole(_) => env.link.thaw(),
        Fault::Latency(..) => env.link.set_latency(Duration::ZERO),
        Fault::CloudRestart(_) => env.start_cloud().await,
        Fault::CloudRestartSlowLists(_) => {
            // A real apiserver's lists are slow enough by themselves.
            if let Some(server) = env.cluster.in_memory() {
                let delay = server.list_delay();
                delay.set(SLOW_LISTS);
                tokio::spawn(async move {
                    tokio::time::sleep(SLOW_LISTS * 3).await;
                    delay.set(Duration::ZERO);
                });
            }
            env.start_cloud_at_once().await;
            // A fresh edgecore dials at once (a long-failing one may be in a 30 s back-off):
            // its inventory arrives while the lists are still under way.
            env.stop_edge().await;
            env.start_edge().await;
        }
        Fault::EdgeRestart(_) => env.start_edge().await,
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
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let secs = std::env::var("CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60u64);
    println!("chaos: CHAOS_SEED={seed} CHAOS_SECS={secs}");
    let mut env = EdgeEnv::start("chaos").await;
    let client = env.cluster.client();
    let mut rng = StdRng::seed_from_u64(seed);
    let total = Duration::from_secs(secs);
    let faults = schedule(&mut rng, total);
    println!("chaos: faults {faults:?}");

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &env.ns);
    let secrets: Api<Secret> = Api::namespaced(client, &env.ns);
    let pp = PostParams::default();
    for i in 0..CONFIGS {
        cms.create(&pp, &configmap(&format!("cm-{i}"), "initial"))
            .await
            .expect("configmap created");
        secrets
            .create(&pp, &secret(&format!("sec-{i}"), "initial"))
            .await
            .expect("secret created");
    }
    let mut d = Driver {
        rng,
        cms: cms.clone(),
        secrets,
        step: 0,
        ops: BTreeMap::new(),
    };
    let start = Instant::now();
    let mut pending = faults.into_iter().peekable();
    let mut active: Option<(Instant, Fault)> = None;
    while start.elapsed() < total || active.is_some() {
        if let Some((until, f)) = active
            && Instant::now() >= until
        {
            println!("chaos: {:?} end {f:?}", start.elapsed());
            end_fault(&mut env, f).await;
            active = None;
        }
        if active.is_none()
            && let Some((at, f)) = pending.peek().copied()
            && start.elapsed() >= at
        {
            pending.next();
            println!("chaos: {:?} {f:?}", start.elapsed());
            apply_fault(&mut env, f).await;
            active = Some((Instant::now() + f.duration(), f));
        }
        if start.elapsed() < total {
            d.change(&env).await;
            let pause = ms(&mut d.rng, 100, 500);
            tokio::time::sleep(pause).await;
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Heal: the link is clean, both sides run, every referenced object exists.
    env.link.thaw();
    env.link.set_latency(Duration::ZERO);
    if env.cloud.is_none() {
        env.start_cloud().await;
    }
    if env.edge.is_none() {
        env.start_edge().await;
    }
    d.recreate_missing().await;
    let ops = std::mem::take(&mut d.ops);
    println!("chaos: {} changes {ops:?}", d.step);
    let healed = Instant::now();
    let cri = env.cri().await;
    let mut diff;
    let mut first = true;
    loop {
        diff = differences(&env, &cri).await;
        if first {
            println!(
                "chaos: at healing {} differences, e.g. {:?}",
                diff.len(),
                diff.iter().take(3).collect::<Vec<_>>()
            );
            first = false;
        }
        if diff.is_empty() || healed.elapsed() > CONVERGE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if !diff.is_empty() {
        let mut text = String::new();
        for line in &diff {
            let _ = writeln!(text, "  {line}");
        }
        panic!(
            "CHAOS_SEED={seed}: the edge did not converge within {CONVERGE:?} after healing:\n{text}"
        );
    }
    let pods = env.pods().list(&ListParams::default()).await.expect("pods");
    println!(
        "chaos: converged {:?} after healing (seed {seed}), {} pods running",
        healed.elapsed(),
        pods.items.len()
    );
    env.finish().await;
}
