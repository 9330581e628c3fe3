//! Service-account tokens this edge obtained for its pods (KubeEdge's `serviceaccounttoken`
//! store, devices reference §6.2): the MetaServer accepts a bearer token only when it is one
//! of these — the edge holds no key to verify a signature with, and a token that reached it
//! from the cloud for one of its pods is authentic. Only a SHA-256 of the token is kept.

use super::store::{MetaRecord, MetaStore, StoreError};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub const TOKEN_TYPE: &str = "serviceaccounttoken";

/// What the edge knows of a token it obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedToken {
    pub namespace: String,
    pub service_account: String,
    /// The pod the token is bound to (`boundObjectRef`), name and UID.
    pub pod: Option<(String, String)>,
    /// Unix seconds; 0 when the answer had none.
    pub expires: i64,
}

pub fn digest(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn key(namespace: &str, token: &str) -> String {
    format!("{namespace}/{TOKEN_TYPE}/{}", digest(token))
}

use kubeedge_shared::clock::{parse_rfc3339, unix, unix_now as now};

/// The record for a `TokenRequest` answer (`status.token` set), if it is one.
pub fn record_of(namespace: &str, service_account: &str, answer: &Value) -> Option<MetaRecord> {
    let token = answer["status"]["token"]
        .as_str()
        .filter(|t| !t.is_empty())?;
    let expires = answer["status"]["expirationTimestamp"]
        .as_str()
        .and_then(parse_rfc3339)
        .map(unix)
        .unwrap_or(0);
    let bound = &answer["spec"]["boundObjectRef"];
    let pod = (bound["kind"] == "Pod").then(|| json!({"name": bound["name"], "uid": bound["uid"]}));
    let value = json!({
        "namespace": namespace,
        "serviceAccount": service_account,
        "pod": pod,
        "expires": expires,
    });
    Some(MetaRecord::new(
        key(namespace, token),
        TOKEN_TYPE,
        value.to_string(),
    ))
}

/// Stores `record` and forgets tokens that expired.
pub async fn remember(store: &MetaStore, record: MetaRecord) -> Result<(), StoreError> {
    store.upsert(record).await?;
    let now = now();
    for r in store.list_type(TOKEN_TYPE).await? {
        let expires = serde_json::from_str::<Value>(&r.value)
            .ok()
            .and_then(|v| v["expires"].as_i64())
            .unwrap_or(0);
        if expires > 0 && expires < now {
            store.delete(&r.key).await?;
        }
    }
    Ok(())
}

/// Forgets the tokens bound to the pod with `uid` (it was deleted: the API server refuses
/// them now). Runs inside the pod delete's transaction. Returns how many were removed.
pub(crate) fn forget_pod_in(conn: &rusqlite::Connection, uid: &str) -> Result<usize, StoreError> {
    // `CASE` first checks the value is JSON: `json_extract` fails the statement on one that
    // is not, and one corrupt row must not keep a pod's delete from committing.
    let mut stmt = conn.prepare_cached(
        "DELETE FROM meta WHERE type = ?1 AND \
         CASE WHEN json_valid(value) THEN json_extract(value, '$.pod.uid') END = ?2",
    )?;
    Ok(stmt.execute(rusqlite::params![TOKEN_TYPE, uid])?)
}

/// The token's record when this edge obtained it for namespace `namespace`.
pub async fn lookup(
    store: &MetaStore,
    namespace: &str,
    token: &str,
) -> Result<Option<IssuedToken>, StoreError> {
    let Some(raw) = store.get(&key(namespace, token)).await? else {
        return Ok(None);
    };
    let Ok(v) = serde_json::from_str::<Value>(&raw) else {
        return Ok(None);
    };
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
    Ok(Some(IssuedToken {
        namespace: s("/namespace").unwrap_or_default(),
        service_account: s("/serviceAccount").unwrap_or_default(),
        pod: s("/pod/name").map(|n| (n, s("/pod/uid").unwrap_or_default())),
        expires: v["expires"].as_i64().unwrap_or(0),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tokens_are_kept_as_digests_and_expired_ones_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetaStore::open(dir.path().join("edge.db")).await.unwrap();
        let answer = |token: &str, exp: &str| {
            json!({"spec": {"boundObjectRef": {"kind": "Pod", "name": "p", "uid": "u1"}},
                   "status": {"token": token, "expirationTimestamp": exp}})
        };
        let live = record_of("ns", "sa", &answer("tok-live", "2999-01-01T00:00:00Z")).unwrap();
        assert!(!live.value.contains("tok-live"));
        remember(&store, live).await.unwrap();
        let got = lookup(&store, "ns", "tok-live").await.unwrap().unwrap();
        assert_eq!(got.service_account, "sa");
        assert_eq!(got.pod, Some(("p".into(), "u1".into())));
        assert!(got.expires > now());
        assert!(lookup(&store, "other", "tok-live").await.unwrap().is_none());
        assert!(lookup(&store, "ns", "tok-other").await.unwrap().is_none());
        let old = record_of("ns", "sa", &answer("tok-old", "2000-01-01T00:00:00Z")).unwrap();
        store.upsert(old).await.unwrap();
        let newer = record_of("ns", "sa", &answer("tok-new", "2999-01-01T00:00:00Z")).unwrap();
        remember(&store, newer).await.unwrap();
        assert!(lookup(&store, "ns", "tok-old").await.unwrap().is_none());
        assert!(lookup(&store, "ns", "tok-live").await.unwrap().is_some());
        assert!(record_of("ns", "sa", &json!({"status": {}})).is_none());
    }
}
