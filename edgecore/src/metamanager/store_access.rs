//! The ServiceAccountAccess objects the cloud's policy controller sends (KubeEdge's meta type
//! `serviceaccountaccess`, key `<ns>/serviceaccountaccess/<name>`, named like the service
//! account): what the MetaServer's authorizer (`metaserver/authz.rs`) evaluates.

use super::store::{MetaStore, StoreError};
use kubeedge_shared::ResourceType;
use serde_json::Value;

/// The database key of the ServiceAccountAccess of service account `namespace/name`.
pub fn service_account_access_key(namespace: &str, name: &str) -> String {
    format!(
        "{namespace}/{}/{name}",
        ResourceType::ServiceAccountAccess.as_str()
    )
}

impl MetaStore {
    /// The stored ServiceAccountAccess objects of service account `namespace/name` (none or
    /// one). A stored value that is not a JSON object is skipped (it grants nothing).
    pub async fn service_account_accesses(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<Value>, StoreError> {
        let Some(raw) = self
            .get(&service_account_access_key(namespace, name))
            .await?
        else {
            return Ok(Vec::new());
        };
        match serde_json::from_str::<Value>(&raw) {
            Ok(v) if v.is_object() => Ok(vec![v]),
            _ => {
                tracing::warn!(
                    namespace,
                    name,
                    "stored ServiceAccountAccess is not a JSON object; ignored"
                );
                Ok(Vec::new())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metamanager::store::MetaRecord;
    use serde_json::json;

    #[tokio::test]
    async fn reads_the_access_of_one_service_account_and_never_mirrors_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetaStore::open(dir.path().join("edgecore.db"))
            .await
            .unwrap();
        let acc = json!({"apiVersion": "policy.kubeedge.io/v1alpha1",
            "kind": "ServiceAccountAccess",
            "metadata": {"name": "sa", "namespace": "ns", "uid": "u", "resourceVersion": "1700000000000000"},
            "spec": {"accessClusterRoleBinding": []}});
        let key = service_account_access_key("ns", "sa");
        assert_eq!(key, "ns/serviceaccountaccess/sa");
        store
            .upsert_object(MetaRecord::new(
                &key,
                "serviceaccountaccess",
                acc.to_string(),
            ))
            .await
            .unwrap();
        store
            .upsert(MetaRecord::new(
                service_account_access_key("ns", "broken"),
                "serviceaccountaccess",
                "not json",
            ))
            .await
            .unwrap();
        assert_eq!(
            store.service_account_accesses("ns", "sa").await.unwrap(),
            vec![acc]
        );
        assert!(
            store
                .service_account_accesses("ns", "other")
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            store
                .service_account_accesses("ns", "broken")
                .await
                .unwrap()
                .is_empty()
        );
        // Not an object applications can list through the MetaServer.
        assert_eq!(store.max_v2_rv().await.unwrap(), 0);
        assert!(store.v2_resources().await.unwrap().is_empty());
    }
}
