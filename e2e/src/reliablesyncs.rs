//! KubeEdge's ObjectSync / ClusterObjectSync CRDs for tests: installed from cloudcore's own
//! manifest (`manifests/crds/reliablesyncs-crds.yaml`), and read back.

use anyhow::Context;
use cloudcore::controller::objectsync::api_resource;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use std::collections::BTreeMap;
use std::time::Duration;

pub const CRDS_YAML: &str = include_str!("../../manifests/crds/reliablesyncs-crds.yaml");

/// The CRDs in the manifest.
pub fn crds() -> anyhow::Result<Vec<CustomResourceDefinition>> {
    CRDS_YAML
        .split("\n---\n")
        .map(str::trim)
        .filter(|doc| doc.lines().any(|l| l.starts_with("kind:")))
        .map(|doc| {
            let v: serde_json::Value = serde_saphyr::from_str(doc).context("CRD manifest")?;
            Ok(serde_json::from_value(v)?)
        })
        .collect()
}

/// Creates both CRDs (existing ones are kept) and waits until their resources are served.
pub async fn install(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds()? {
        match api.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    for cluster in [false, true] {
        let records: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource(cluster));
        while records.list(&ListParams::default().limit(1)).await.is_err() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "sync record CRDs not served"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// One record as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub namespace: Option<String>,
    pub api_version: String,
    pub kind: String,
    pub object_name: String,
    /// `status.objectResourceVersion` (empty when unset).
    pub object_rv: String,
}

/// Every ObjectSync and ClusterObjectSync, by name.
pub async fn list(client: &kube::Client) -> anyhow::Result<BTreeMap<String, StoredRecord>> {
    let mut out = BTreeMap::new();
    for cluster in [false, true] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource(cluster));
        for o in api.list(&ListParams::default()).await?.items {
            let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
            out.insert(
                o.metadata.name.clone().unwrap_or_default(),
                StoredRecord {
                    namespace: o.metadata.namespace.clone(),
                    api_version: s(&o.data["spec"]["objectAPIVersion"]),
                    kind: s(&o.data["spec"]["objectKind"]),
                    object_name: s(&o.data["spec"]["objectName"]),
                    object_rv: s(&o.data["status"]["objectResourceVersion"]),
                },
            );
        }
    }
    Ok(out)
}
