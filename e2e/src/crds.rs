//! CRD manifests for tests: parsed from the project's `manifests/crds/` files, created in the
//! cluster (existing ones kept) and waited for until their resources are served.

use anyhow::Context;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use std::time::Duration;

/// The CRDs in a multi-document manifest.
pub fn parse(yaml: &str) -> anyhow::Result<Vec<CustomResourceDefinition>> {
    yaml.split("\n---\n")
        .map(str::trim)
        .filter(|doc| doc.lines().any(|l| l.starts_with("kind:")))
        .map(|doc| {
            let v: serde_json::Value = serde_saphyr::from_str(doc).context("CRD manifest")?;
            Ok(serde_json::from_value(v)?)
        })
        .collect()
}

/// Creates the manifest's CRDs (existing ones are kept) and waits until each of `served` can
/// be listed.
pub async fn install(
    client: &kube::Client,
    yaml: &str,
    served: &[ApiResource],
) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in parse(yaml)? {
        match api.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    for ar in served {
        let objects: Api<DynamicObject> = Api::all_with(client.clone(), ar);
        while objects.list(&ListParams::default().limit(1)).await.is_err() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "{} not served within 20 s",
                ar.plural
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}
