//! What a pod references: configmaps, secrets and service accounts, from every place a pod
//! spec can name them (volumes, projected volumes, env `valueFrom`, `envFrom`,
//! `imagePullSecrets`, init and ephemeral containers too).

use k8s_openapi::api::core::v1::{Container, EnvFromSource, EnvVar, Pod, Volume};
use std::collections::BTreeSet;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PodRefs {
    pub configmaps: BTreeSet<String>,
    pub secrets: BTreeSet<String>,
    pub service_account: Option<String>,
}

pub fn pod_refs(pod: &Pod) -> PodRefs {
    let mut r = PodRefs::default();
    let Some(spec) = &pod.spec else { return r };
    for v in spec.volumes.iter().flatten() {
        volume_refs(v, &mut r);
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        container_refs(c, &mut r);
    }
    for ec in spec.ephemeral_containers.iter().flatten() {
        env_refs(
            ec.env.iter().flatten(),
            ec.env_from.iter().flatten(),
            &mut r,
        );
    }
    for s in spec.image_pull_secrets.iter().flatten() {
        if !s.name.is_empty() {
            r.secrets.insert(s.name.clone());
        }
    }
    r.service_account = spec.service_account_name.clone().filter(|s| !s.is_empty());
    r
}

fn volume_refs(v: &Volume, r: &mut PodRefs) {
    if let Some(cm) = &v.config_map
        && !cm.name.is_empty()
    {
        r.configmaps.insert(cm.name.clone());
    }
    if let Some(name) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
        r.secrets.insert(name);
    }
    for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
        if let Some(cm) = &src.config_map
            && !cm.name.is_empty()
        {
            r.configmaps.insert(cm.name.clone());
        }
        if let Some(s) = &src.secret
            && !s.name.is_empty()
        {
            r.secrets.insert(s.name.clone());
        }
    }
}

fn container_refs(c: &Container, r: &mut PodRefs) {
    env_refs(c.env.iter().flatten(), c.env_from.iter().flatten(), r);
}

fn env_refs<'a>(
    env: impl Iterator<Item = &'a EnvVar>,
    env_from: impl Iterator<Item = &'a EnvFromSource>,
    r: &mut PodRefs,
) {
    for e in env {
        let Some(from) = &e.value_from else { continue };
        if let Some(k) = &from.config_map_key_ref
            && !k.name.is_empty()
        {
            r.configmaps.insert(k.name.clone());
        }
        if let Some(k) = &from.secret_key_ref
            && !k.name.is_empty()
        {
            r.secrets.insert(k.name.clone());
        }
    }
    for f in env_from {
        if let Some(cm) = &f.config_map_ref
            && !cm.name.is_empty()
        {
            r.configmaps.insert(cm.name.clone());
        }
        if let Some(s) = &f.secret_ref
            && !s.name.is_empty()
        {
            r.secrets.insert(s.name.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_reference_kind_is_found() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "serviceAccountName": "sa",
                "imagePullSecrets": [{"name": "pull"}],
                "volumes": [
                    {"name": "a", "configMap": {"name": "cm-vol"}},
                    {"name": "b", "secret": {"secretName": "sec-vol"}},
                    {"name": "c", "projected": {"sources": [
                        {"configMap": {"name": "cm-proj"}}, {"secret": {"name": "sec-proj"}},
                        {"serviceAccountToken": {"path": "token"}}]}},
                    {"name": "d", "emptyDir": {}}
                ],
                "initContainers": [{"name": "i", "envFrom": [{"configMapRef": {"name": "cm-init"}}]}],
                "containers": [{"name": "c",
                    "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm-env", "key": "k"}}},
                            {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "sec-env", "key": "k"}}},
                            {"name": "Z", "value": "plain"}],
                    "envFrom": [{"secretRef": {"name": "sec-from"}}]}]
            }
        }))
        .unwrap();
        let r = pod_refs(&pod);
        let cms: Vec<_> = r.configmaps.iter().map(String::as_str).collect();
        assert_eq!(cms, ["cm-env", "cm-init", "cm-proj", "cm-vol"]);
        let secrets: Vec<_> = r.secrets.iter().map(String::as_str).collect();
        assert_eq!(
            secrets,
            ["pull", "sec-env", "sec-from", "sec-proj", "sec-vol"]
        );
        assert_eq!(r.service_account.as_deref(), Some("sa"));
    }

    #[test]
    fn pod_without_spec_references_nothing() {
        assert_eq!(pod_refs(&Pod::default()), PodRefs::default());
    }
}
