//! What every simulated edge should hold according to the cluster, and how far the edges are
//! from it: the pods bound to the node and the configmaps and secrets those pods reference
//! (read from the pod specs here, independently of cloudcore's location cache).

use crate::edge::{EdgeState, Held, Objects};
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Every object of `resource` (`pods`, `configmaps`, `secrets`) in namespace `default`, read in
/// pages of 5,000 as JSON (a million pods never sit in memory as one response or as typed
/// objects); `each` sees every item.
pub async fn list_each(
    client: &kube::Client,
    resource: &str,
    mut each: impl FnMut(&Value),
) -> anyhow::Result<()> {
    let request = kube::core::Request::new(format!("/api/v1/namespaces/default/{resource}"));
    let mut params = kube::api::ListParams::default().limit(5000);
    loop {
        let page: Value = client.request(request.list(&params)?).await?;
        for item in page["items"].as_array().into_iter().flatten() {
            each(item);
        }
        match page["metadata"]["continue"]
            .as_str()
            .filter(|c| !c.is_empty())
        {
            Some(token) => params = params.continue_token(token),
            None => return Ok(()),
        }
    }
}

/// Expected objects per node, indexed like the edges (`edge-<i>` at `i`).
pub async fn expected(client: &kube::Client, n: usize) -> anyhow::Result<Vec<Objects>> {
    let ns = "default";
    let mut by_name: HashMap<(&str, String), Held> = HashMap::new();
    for (ty, resource) in [("configmap", "configmaps"), ("secret", "secrets")] {
        list_each(client, resource, |v| {
            let name = v["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            by_name.insert((ty, name), Held::of(ty, v));
        })
        .await?;
    }
    let mut out = vec![Objects::new(); n];
    list_each(client, "pods", |v| {
        let Some(i) = v["spec"]["nodeName"]
            .as_str()
            .and_then(|node| node.strip_prefix("edge-"))
            .and_then(|i| i.parse::<usize>().ok())
            .filter(|i| *i < n)
        else {
            return;
        };
        let name = v["metadata"]["name"].as_str().unwrap_or_default();
        out[i].insert(format!("{ns}/pod/{name}").into(), Held::of("pod", v));
        let (cm_refs, secret_refs) = references(v);
        for (ty, names) in [("configmap", cm_refs), ("secret", secret_refs)] {
            for name in names {
                if let Some(h) = by_name.get(&(ty, name.clone())) {
                    out[i].insert(format!("{ns}/{ty}/{name}").into(), *h);
                }
            }
        }
    })
    .await?;
    Ok(out)
}

/// Configmap and secret names a pod spec references: volumes (also projected), env, envFrom
/// (also of init and ephemeral containers) and image pull secrets.
pub fn references(pod: &Value) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut cms, mut secrets) = (BTreeSet::new(), BTreeSet::new());
    let add = |set: &mut BTreeSet<String>, v: &Value| {
        if let Some(s) = v.as_str().filter(|s| !s.is_empty()) {
            set.insert(s.to_string());
        }
    };
    let spec = &pod["spec"];
    for vol in spec["volumes"].as_array().into_iter().flatten() {
        add(&mut cms, &vol["configMap"]["name"]);
        add(&mut secrets, &vol["secret"]["secretName"]);
        for src in vol["projected"]["sources"].as_array().into_iter().flatten() {
            add(&mut cms, &src["configMap"]["name"]);
            add(&mut secrets, &src["secret"]["name"]);
        }
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            for e in c["env"].as_array().into_iter().flatten() {
                add(&mut cms, &e["valueFrom"]["configMapKeyRef"]["name"]);
                add(&mut secrets, &e["valueFrom"]["secretKeyRef"]["name"]);
            }
            for e in c["envFrom"].as_array().into_iter().flatten() {
                add(&mut cms, &e["configMapRef"]["name"]);
                add(&mut secrets, &e["secretRef"]["name"]);
            }
        }
    }
    for s in spec["imagePullSecrets"].as_array().into_iter().flatten() {
        add(&mut secrets, &s["name"]);
    }
    (cms, secrets)
}

/// How far the edges are from what they should hold.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Diff {
    /// Expected and not held.
    pub missing: usize,
    /// Held with another UID, resourceVersion or content.
    pub stale: usize,
    /// Held and not expected.
    pub extra: usize,
}

impl Diff {
    pub fn total(&self) -> usize {
        self.missing + self.stale + self.extra
    }
}

/// Compares every edge with `expected`; up to `examples` descriptions of mismatches.
pub fn compare(
    edges: &[Arc<EdgeState>],
    expected: &[Objects],
    examples: usize,
) -> (Diff, Vec<String>) {
    let mut d = Diff::default();
    let mut ex = Vec::new();
    for (edge, want) in edges.iter().zip(expected) {
        let db = edge.db();
        let (dd, mut e) = compare_one(
            &edge.node,
            &db.objects,
            want,
            examples.saturating_sub(ex.len()),
        );
        d.missing += dd.missing;
        d.stale += dd.stale;
        d.extra += dd.extra;
        ex.append(&mut e);
    }
    (d, ex)
}

/// Compares what one edge holds with what it should; up to `examples` descriptions.
pub fn compare_one(
    node: &str,
    held: &Objects,
    want: &Objects,
    examples: usize,
) -> (Diff, Vec<String>) {
    let mut d = Diff::default();
    let mut ex = Vec::new();
    {
        let mut note = |what: String| {
            if ex.len() < examples {
                ex.push(format!("{node}: {what}"));
            }
        };
        for (key, w) in want {
            match held.get(key) {
                None => {
                    d.missing += 1;
                    note(format!("missing {key} (uid {} rv {})", w.uid_text(), w.rv));
                }
                Some(h) if h != w => {
                    d.stale += 1;
                    note(format!("stale {key}: holds {h:?}, cluster has {w:?}"));
                }
                Some(_) => {}
            }
        }
        for (key, h) in held.iter() {
            if !want.contains_key(key) {
                d.extra += 1;
                note(format!("extra {key} (uid {} rv {})", h.uid_text(), h.rv));
            }
        }
    }
    (d, ex)
}
