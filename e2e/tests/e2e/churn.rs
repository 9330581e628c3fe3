//! The churn engine both chaos tests share: a seeded RNG drives configmap/secret updates,
//! deletions and re-creations and pods bound to the edge node (created, relabelled, deleted
//! gracefully, force-replaced under the same name), interleaved with a shuffled schedule of
//! link and process faults that each test applies to its own edge; then everything heals and
//! the test's own comparison must come out empty within a deadline.
//!
//! `CHAOS_SEED` replays a schedule (the seed is printed; timing still varies), `CHAOS_SECS`
//! sets the length of the chaos phase.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::future::Future;
use std::time::{Duration, Instant};

/// Configmaps and secrets the pods pick from: few, so pods share them.
pub(crate) const CONFIGS: usize = 3;
/// Pods alive (terminating ones included) at most.
const MAX_PODS: usize = 6;

#[derive(Debug, Clone, Copy)]
pub(crate) enum Fault {
    /// Every open connection closed; both ends see it.
    Cut,
    /// Nothing forwarded, nothing closed, for this long.
    Blackhole(Duration),
    /// This much added in each direction, for this long.
    Latency(Duration, Duration),
    /// cloudcore down for this long, then a new one.
    CloudRestart(Duration),
    /// The same, and the new cloudcore's first lists answer slowly and in random order (on
    /// the in-memory apiserver): the edge reconnects and sends its inventory while the
    /// cloudcore does not yet know all of the node's pods.
    CloudRestartSlowLists(Duration),
    /// edgecore down for this long, then started again on the same database.
    EdgeRestart(Duration),
}

impl Fault {
    pub(crate) fn duration(self) -> Duration {
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

/// How a test's edge suffers a fault and recovers from it.
pub(crate) trait FaultTarget {
    async fn begin(&mut self, f: Fault);
    async fn end(&mut self, f: Fault);
}

pub(crate) fn ms(rng: &mut StdRng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo..=hi))
}

/// `CHAOS_SEED` (or a random seed) and `CHAOS_SECS` (or `default_secs`), printed.
pub(crate) fn seed_and_length(label: &str, default_secs: u64) -> (u64, Duration) {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let secs = std::env::var("CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_secs);
    println!("{label}: CHAOS_SEED={seed} CHAOS_SECS={secs}");
    (seed, Duration::from_secs(secs))
}

/// The faults, shuffled, one per equal slot of `total`, each at a random point of its slot.
pub(crate) fn schedule(
    rng: &mut StdRng,
    total: Duration,
    mut faults: Vec<Fault>,
) -> Vec<(Duration, Fault)> {
    for i in (1..faults.len()).rev() {
        faults.swap(i, rng.random_range(0..=i));
    }
    let slot = total / faults.len().max(1) as u32;
    faults
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let room = slot.saturating_sub(f.duration()).as_millis() as u64;
            let at = slot * i as u32 + Duration::from_millis(rng.random_range(0..=room));
            (at, f)
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

/// A busybox `sleep` pod on `node` mounting configmap `cm-<cm>` and secret `sec-<sec>`, with
/// an env var from secret `sec-<env_sec>`.
fn chaos_pod(name: &str, node: &str, image: &str, refs: [usize; 3], generation: u64) -> Pod {
    let [cm, sec, env_sec] = refs;
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"chaos": "yes", "gen": generation.to_string()}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image,
                "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"],
                "env": [{"name": "SEC", "valueFrom":
                    {"secretKeyRef": {"name": format!("sec-{env_sec}"), "key": "v"}}}],
                "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"},
                    {"name": "sec", "mountPath": "/etc/sec"}]}],
            "volumes": [{"name": "cfg", "configMap": {"name": format!("cm-{cm}")}},
                {"name": "sec", "secret": {"secretName": format!("sec-{sec}")}}]},
    }))
    .expect("a Pod")
}

/// The configmaps and secrets a pod (JSON) uses: volumes, projected sources, env, envFrom.
pub(crate) fn uses(
    pod: &serde_json::Value,
    cms: &mut BTreeSet<String>,
    secrets: &mut BTreeSet<String>,
) {
    let name = |v: &serde_json::Value| v.as_str().map(str::to_string);
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

/// The test's side: the cluster's APIs in the test namespace and a counter for fresh values
/// and names.
pub(crate) struct Churn {
    pub(crate) rng: StdRng,
    label: &'static str,
    node: String,
    image: &'static str,
    pods: Api<Pod>,
    cms: Api<ConfigMap>,
    secrets: Api<Secret>,
    step: u64,
    ops: BTreeMap<&'static str, usize>,
}

impl Churn {
    /// Creates the configmaps and secrets the pods pick from.
    pub(crate) async fn start(
        label: &'static str,
        client: Client,
        ns: &str,
        node: &str,
        image: &'static str,
        seed: u64,
    ) -> Churn {
        let churn = Churn {
            rng: StdRng::seed_from_u64(seed),
            label,
            node: node.to_string(),
            image,
            pods: Api::namespaced(client.clone(), ns),
            cms: Api::namespaced(client.clone(), ns),
            secrets: Api::namespaced(client, ns),
            step: 0,
            ops: BTreeMap::new(),
        };
        let pp = PostParams::default();
        for i in 0..CONFIGS {
            churn
                .cms
                .create(&pp, &configmap(&format!("cm-{i}"), "initial"))
                .await
                .expect("configmap created");
            churn
                .secrets
                .create(&pp, &secret(&format!("sec-{i}"), "initial"))
                .await
                .expect("secret created");
        }
        churn
    }

    fn pick(&mut self, n: usize) -> usize {
        self.rng.random_range(0..n)
    }

    fn new_pod(&mut self, name: &str) -> Pod {
        let refs = [self.pick(CONFIGS), self.pick(CONFIGS), self.pick(CONFIGS)];
        chaos_pod(name, &self.node, self.image, refs, self.step)
    }

    /// One random change in the cluster. API errors (a conflict, a name in use) are fine:
    /// the cluster is the truth the edge must converge to, whatever it became.
    async fn change(&mut self) {
        self.step += 1;
        let step = self.step.to_string();
        let pods = self
            .pods
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let names: Vec<String> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        let pp = PostParams::default();
        let roll = self.pick(100);
        let op = match roll {
            0..=24 => {
                let cm = format!("cm-{}", self.pick(CONFIGS));
                let patch = json!({"data": {"v": step}});
                let r = self
                    .cms
                    .patch(&cm, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                if r.is_err() {
                    let _ = self.cms.create(&pp, &configmap(&cm, &step)).await;
                    "configmap created"
                } else {
                    "configmap updated"
                }
            }
            25..=29 => {
                let cm = format!("cm-{}", self.pick(CONFIGS));
                let _ = self.cms.delete(&cm, &DeleteParams::default()).await;
                "configmap deleted"
            }
            30..=44 => {
                let s = format!("sec-{}", self.pick(CONFIGS));
                let new = secret(&s, &step);
                if self.secrets.replace(&s, &pp, &new).await.is_err() {
                    let _ = self.secrets.create(&pp, &new).await;
                    "secret created"
                } else {
                    "secret updated"
                }
            }
            45..=48 => {
                let s = format!("sec-{}", self.pick(CONFIGS));
                let _ = self.secrets.delete(&s, &DeleteParams::default()).await;
                "secret deleted"
            }
            49..=66 if pods.len() < MAX_PODS => {
                let pod = self.new_pod(&format!("pod-{step}"));
                let _ = self.pods.create(&pp, &pod).await;
                "pod created"
            }
            67..=79 if !names.is_empty() => {
                let name = names[self.pick(names.len())].clone();
                let patch = json!({"metadata": {"labels": {"gen": step}}});
                let _ = self
                    .pods
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                "pod relabelled"
            }
            80..=89 if !names.is_empty() => {
                let name = names[self.pick(names.len())].clone();
                let _ = self.pods.delete(&name, &DeleteParams::default()).await;
                "pod deleted"
            }
            90..=99 if !names.is_empty() => {
                // Gone from the API at once, back under the same name with a new UID and other
                // references: the edge must not confuse the two.
                let name = names[self.pick(names.len())].clone();
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                };
                let _ = self.pods.delete(&name, &dp).await;
                let pod = self.new_pod(&name);
                let _ = self.pods.create(&pp, &pod).await;
                "pod force-replaced"
            }
            _ => "nothing",
        };
        *self.ops.entry(op).or_default() += 1;
    }

    /// The chaos phase: random changes `pause` apart for `total`, with `faults` begun and
    /// ended on `target` on their schedule; returns once the last fault ended.
    pub(crate) async fn run(
        &mut self,
        total: Duration,
        faults: Vec<(Duration, Fault)>,
        pause: (u64, u64),
        target: &mut impl FaultTarget,
    ) {
        let label = self.label;
        println!("{label}: faults {faults:?}");
        let start = Instant::now();
        let mut pending = faults.into_iter().peekable();
        let mut active: Option<(Instant, Fault)> = None;
        while start.elapsed() < total || active.is_some() {
            if let Some((until, f)) = active
                && Instant::now() >= until
            {
                println!("{label}: {:?} end {f:?}", start.elapsed());
                target.end(f).await;
                active = None;
            }
            if active.is_none()
                && let Some((at, f)) = pending.peek().copied()
                && start.elapsed() >= at
            {
                pending.next();
                println!("{label}: {:?} {f:?}", start.elapsed());
                target.begin(f).await;
                active = Some((Instant::now() + f.duration(), f));
            }
            if start.elapsed() < total {
                self.change().await;
                let pause = ms(&mut self.rng, pause.0, pause.1);
                tokio::time::sleep(pause).await;
            } else {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// Makes every configmap and secret a pod may use exist again (pods wait for them), and
    /// prints what the chaos phase did.
    pub(crate) async fn heal(&mut self) {
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
        println!("{}: {} changes {:?}", self.label, self.step, self.ops);
    }
}

/// Polls `differences` every `every` until it comes out empty or `deadline` passed since
/// healing; returns the last differences (empty when converged) and the time it took.
pub(crate) async fn converge<F, Fut>(
    label: &str,
    deadline: Duration,
    every: Duration,
    mut differences: F,
) -> (Vec<String>, Duration)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Vec<String>>,
{
    let healed = Instant::now();
    let mut first = true;
    loop {
        let diff = differences().await;
        if first {
            println!(
                "{label}: at healing {} differences, e.g. {:?}",
                diff.len(),
                diff.iter().take(3).collect::<Vec<_>>()
            );
            first = false;
        }
        if diff.is_empty() || healed.elapsed() > deadline {
            return (diff, healed.elapsed());
        }
        tokio::time::sleep(every).await;
    }
}

/// The differences, one per indented line.
pub(crate) fn listing(diff: &[String]) -> String {
    let mut text = String::new();
    for line in diff {
        let _ = writeln!(text, "  {line}");
    }
    text
}
