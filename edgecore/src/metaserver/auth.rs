//! Who is asking, and may they (KubeEdge v1.17+ `requireAuthorization`, devices reference
//! §6.2): a bearer token is a service-account token this edge obtained for one of its pods
//! (`metamanager::tokens`; its claims checked: issuer, audience, validity, subject, and the
//! pod it is bound to still being here) — anything else is 401. Requests without a token
//! are anonymous and, as in KubeEdge v1.23, may read only discovery, version and health.
//! Resource requests are decided by the RBAC rules the cloud sent for the service account
//! (`ServiceAccountAccess`, `authz.rs`), so decisions hold offline too.

use super::authz::{self, Attributes, UserInfo};
use super::request::{ResourceRequest, Target, Unhold};
use crate::metamanager::MetaStore;
use crate::metamanager::tokens;
use base64::Engine;
use serde_json::Value;

/// Clock skew allowed on `exp`/`nbf`, as the apiserver's JWT validation allows.
const LEEWAY: i64 = 60;

#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// Accepted `iss` values (`metaServer.serviceAccountIssuers`).
    pub issuers: Vec<String>,
    /// Accepted `aud` values (`metaServer.apiAudiences`; empty: the issuers, as KubeEdge).
    pub audiences: Vec<String>,
    /// `metaServer.serviceAccountKeyFiles`: tokens signed with one of these are accepted
    /// even when this edge did not obtain them.
    pub keys: std::sync::Arc<super::keys::KeySet>,
}

/// Why a token is refused (401; the reason is logged, not sent).
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    Unauthenticated(String),
}

use kubeedge_shared::clock::unix_now as now;

/// The claims part of a JWT.
fn claims(token: &str) -> Result<Value, String> {
    let mut parts = token.split('.');
    let (Some(_), Some(payload), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("not a JWT".into());
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|e| format!("claims are not base64url: {e}"))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("claims are not JSON: {e}"))
}

/// The `alg` of a JWT's header.
fn header_alg(token: &str) -> String {
    token
        .split('.')
        .next()
        .and_then(|h| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(h)
                .ok()
        })
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|h| h["alg"].as_str().map(str::to_string))
        .unwrap_or_default()
}

fn audiences(v: &Value) -> Vec<&str> {
    match v {
        Value::String(s) => vec![s.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// The user behind `Authorization`, or `None` (anonymous) when there is no bearer token.
pub async fn authenticate(
    store: &MetaStore,
    cfg: &AuthConfig,
    authorization: Option<&str>,
) -> Result<Option<UserInfo>, Refusal> {
    let Some(header) = authorization else {
        return Ok(None);
    };
    let bad = |why: String| Refusal::Unauthenticated(why);
    let token = header
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| bad("only bearer tokens are accepted".into()))?;
    let c = claims(token).map_err(bad)?;
    let iss = c["iss"].as_str().unwrap_or_default();
    if !cfg.issuers.iter().any(|i| i == iss) {
        return Err(bad(format!("issuer {iss:?} is not accepted")));
    }
    let accepted = if cfg.audiences.is_empty() {
        &cfg.issuers
    } else {
        &cfg.audiences
    };
    if !audiences(&c["aud"])
        .iter()
        .any(|a| accepted.iter().any(|x| x == a))
    {
        return Err(bad("no accepted audience".into()));
    }
    let now = now();
    match c["exp"].as_i64() {
        Some(exp) if exp + LEEWAY > now => {}
        _ => return Err(bad("the token has expired".into())),
    }
    if c["nbf"].as_i64().is_some_and(|nbf| nbf - LEEWAY > now) {
        return Err(bad("the token is not valid yet".into()));
    }
    let k8s = &c["kubernetes.io"];
    let ns = k8s["namespace"].as_str().unwrap_or_default();
    let sa = k8s["serviceaccount"]["name"].as_str().unwrap_or_default();
    let user = format!("system:serviceaccount:{ns}:{sa}");
    if ns.is_empty() || sa.is_empty() || c["sub"].as_str() != Some(user.as_str()) {
        return Err(bad("not a service-account token".into()));
    }
    let issued = tokens::lookup(store, ns, token)
        .await
        .map_err(|e| bad(format!("token store: {e}")))?;
    match issued {
        Some(t) if t.service_account != sa => {
            return Err(bad(
                "the token's service account differs from the one it was issued for".into(),
            ));
        }
        Some(_) => {}
        None if cfg.keys.verify(token, &header_alg(token)) => {}
        None => {
            return Err(bad(
                "the token was not issued to a pod of this node and no serviceAccountKeyFiles key signed it".into(),
            ));
        }
    }
    if let Some(pod) = k8s["pod"]["name"].as_str() {
        let uid = k8s["pod"]["uid"].as_str().unwrap_or_default();
        let stored = store
            .get(&format!("{ns}/pod/{pod}"))
            .await
            .map_err(|e| bad(format!("pod lookup: {e}")))?
            .and_then(|s| serde_json::from_str::<Value>(&s).ok());
        let same = stored
            .as_ref()
            .and_then(|p| p["metadata"]["uid"].as_str())
            .is_some_and(|u| u == uid);
        if !same {
            return Err(bad(format!(
                "the pod {ns}/{pod} the token is bound to is gone"
            )));
        }
    }
    Ok(Some(UserInfo {
        name: user,
        groups: vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{ns}"),
            "system:authenticated".into(),
        ],
    }))
}

fn attributes(r: &ResourceRequest, path: &str) -> Attributes {
    Attributes {
        verb: r.verb.application_verb("").to_string(),
        api_group: r.group.clone(),
        resource: r.resource.clone(),
        subresource: r.subresource.clone(),
        namespace: r.namespace.clone().unwrap_or_default(),
        name: r.name.clone().unwrap_or_default(),
        path: path.to_string(),
        resource_request: true,
    }
}

/// The service account of `user` (`system:serviceaccount:<ns>:<name>`).
fn service_account(user: &UserInfo) -> Option<(&str, &str)> {
    user.name
        .strip_prefix("system:serviceaccount:")?
        .split_once(':')
}

/// Decides a resolved request: discovery, version and health are open to everyone
/// (KubeEdge v1.23); resources need a user whose RBAC rules allow the request. A refusal is
/// the apiserver's 403 Status.
pub async fn authorize(
    store: &MetaStore,
    user: Option<&UserInfo>,
    target: &Target,
    path: &str,
) -> Result<(), Value> {
    let r = match target {
        Target::Resource(r) | Target::Unhold(Unhold { request: r, .. }) => r,
        _ => return Ok(()),
    };
    let attrs = attributes(r, path);
    let anonymous = UserInfo {
        name: "system:anonymous".into(),
        groups: vec!["system:unauthenticated".into()],
    };
    let user = user.unwrap_or(&anonymous);
    let accesses = match service_account(user) {
        None => Vec::new(),
        Some((ns, sa)) => match store.service_account_accesses(ns, sa).await {
            Ok(a) => a,
            Err(e) => {
                let why = format!("the RBAC rules could not be read: {e}");
                return Err(authz::forbidden_status(&attrs, &why));
            }
        },
    };
    authz::authorize(&accesses, user, &attrs).map_err(|why| authz::forbidden_status(&attrs, &why))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn jwt(claims: &Value) -> String {
        let e = |v: &Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string().as_bytes())
        };
        format!("{}.{}.c2ln", e(&json!({"alg": "RS256"})), e(claims))
    }

    fn sa_claims(exp: i64) -> Value {
        json!({"iss": "https://kubernetes.default.svc.cluster.local",
               "aud": ["https://kubernetes.default.svc.cluster.local"],
               "exp": exp, "nbf": now() - 10, "sub": "system:serviceaccount:ns:reader",
               "kubernetes.io": {"namespace": "ns", "serviceaccount": {"name": "reader", "uid": "sa1"},
                                 "pod": {"name": "app", "uid": "pod-uid"}}})
    }

    fn cfg() -> AuthConfig {
        AuthConfig {
            issuers: vec!["https://kubernetes.default.svc.cluster.local".into()],
            audiences: Vec::new(),
            keys: Default::default(),
        }
    }

    async fn store_with(token: &str) -> (tempfile::TempDir, MetaStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = MetaStore::open(dir.path().join("edge.db")).await.unwrap();
        let answer = json!({"spec": {"boundObjectRef": {"kind": "Pod", "name": "app", "uid": "pod-uid"}},
                            "status": {"token": token, "expirationTimestamp": "2999-01-01T00:00:00Z"}});
        let rec = tokens::record_of("ns", "reader", &answer).unwrap();
        tokens::remember(&store, rec).await.unwrap();
        let pod = json!({"metadata": {"name": "app", "namespace": "ns", "uid": "pod-uid"}});
        store
            .upsert(crate::metamanager::MetaRecord::new(
                "ns/pod/app",
                "pod",
                pod.to_string(),
            ))
            .await
            .unwrap();
        (dir, store)
    }

    #[tokio::test]
    async fn only_tokens_issued_here_for_present_pods_authenticate() {
        let good = jwt(&sa_claims(now() + 3600));
        let (_d, store) = store_with(&good).await;
        let header = format!("Bearer {good}");
        let user = authenticate(&store, &cfg(), Some(&header))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(user.name, "system:serviceaccount:ns:reader");
        assert!(
            user.groups
                .contains(&"system:serviceaccounts:ns".to_string())
        );
        assert_eq!(authenticate(&store, &cfg(), None).await, Ok(None));

        // Same claims, but a token the edge never obtained.
        let forged = jwt(&sa_claims(now() + 3601));
        let r = authenticate(&store, &cfg(), Some(&format!("Bearer {forged}"))).await;
        assert!(
            matches!(r, Err(Refusal::Unauthenticated(ref w)) if w.contains("not issued")),
            "{r:?}"
        );
        // Expired, wrong issuer, garbage, basic auth.
        let expired = jwt(&sa_claims(now() - 3600));
        let (_d2, store2) = store_with(&expired).await;
        let r = authenticate(&store2, &cfg(), Some(&format!("Bearer {expired}"))).await;
        assert!(
            matches!(r, Err(Refusal::Unauthenticated(ref w)) if w.contains("expired")),
            "{r:?}"
        );
        let mut c = sa_claims(now() + 3600);
        c["iss"] = json!("https://elsewhere");
        let r = authenticate(&store, &cfg(), Some(&format!("Bearer {}", jwt(&c)))).await;
        assert!(
            matches!(r, Err(Refusal::Unauthenticated(ref w)) if w.contains("issuer")),
            "{r:?}"
        );
        for h in ["Bearer x.y", "Bearer ", "Basic YTpi"] {
            assert!(authenticate(&store, &cfg(), Some(h)).await.is_err(), "{h}");
        }
        // With the cluster's public key configured, a token the edge never obtained but the
        // cluster signed is accepted; one signed with another key is not.
        let (_, key) = kubeedge_shared::pki::serving_csr("n", &[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let pub_file = dir.path().join("sa.pub");
        std::fs::write(&pub_file, key.public_key_pem()).unwrap();
        let mut with_keys = cfg();
        with_keys.keys = std::sync::Arc::new(
            super::super::keys::KeySet::load(&[pub_file.to_string_lossy().into_owned()]).unwrap(),
        );
        let signed =
            super::super::keys::tests::es256_token(key.serialize_der(), &sa_claims(now() + 60));
        let user = authenticate(&store, &with_keys, Some(&format!("Bearer {signed}"))).await;
        assert!(matches!(user, Ok(Some(_))), "{user:?}");
        let (_, other) = kubeedge_shared::pki::serving_csr("n", &[]).unwrap();
        let foreign =
            super::super::keys::tests::es256_token(other.serialize_der(), &sa_claims(now() + 60));
        let r = authenticate(&store, &with_keys, Some(&format!("Bearer {foreign}"))).await;
        assert!(r.is_err(), "{r:?}");

        // The pod the token is bound to was replaced.
        let pod = json!({"metadata": {"name": "app", "namespace": "ns", "uid": "new-uid"}});
        store
            .upsert(crate::metamanager::MetaRecord::new(
                "ns/pod/app",
                "pod",
                pod.to_string(),
            ))
            .await
            .unwrap();
        let r = authenticate(&store, &cfg(), Some(&header)).await;
        assert!(
            matches!(r, Err(Refusal::Unauthenticated(ref w)) if w.contains("gone")),
            "{r:?}"
        );
    }
}
