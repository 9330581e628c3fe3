//! KubeEdge's ObjectSync / ClusterObjectSync CRDs for tests: installed from cloudcore's own
//! manifest (`manifests/crds/reliablesyncs-crds.yaml`), and read back.

use cloudcore::controller::Kind;
use kube::discovery::ApiResource;

/// ObjectSync, or ClusterObjectSync for cluster-scoped objects.
fn api_resource(cluster_scoped: bool) -> ApiResource {
    if cluster_scoped {
        Kind::ClusterObjectSync
    } else {
        Kind::ObjectSync
    }
    .api_resource()
}
use kube::api::{Api, DynamicObject, ListParams};
use std::collections::BTreeMap;

pub const CRDS_YAML: &str = include_str!("../../manifests/crds/reliablesyncs-crds.yaml");

/// Creates both CRDs (existing ones are kept) and waits until their resources are served.
pub async fn install(client: &kube::Client) -> anyhow::Result<()> {
    crate::crds::install(
        client,
        CRDS_YAML,
        &[api_resource(false), api_resource(true)],
    )
    .await
}

/// Whether the cluster serves KubeEdge's ObjectSync records (the Helm chart installs the
/// CRDs; a bare cluster has none): what cloudcore does for KubeEdge edges depends on it.
pub async fn installed(client: &kube::Client) -> bool {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    matches!(
        crds.get_opt("objectsyncs.reliablesyncs.kubeedge.io").await,
        Ok(Some(_))
    )
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
