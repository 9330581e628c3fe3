//! Authentication: who a request's bearer token belongs to, as the real authenticators
//! report it (`user.Info`: name, uid, groups, extra). Strategies that record the requester
//! (a CertificateSigningRequest's `spec.username`…) read it from here.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::state::State;
use super::status::{ApiError, ApiResult};

/// The authenticated requester.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

const AUTHENTICATED: &str = "system:authenticated";

impl UserInfo {
    /// The admin token's user. kubeadm's `admin.conf` user (a client certificate with
    /// `CN=kubernetes-admin, O=kubeadm:cluster-admins`) is what the same kubeconfig names on a
    /// real cluster.
    pub fn admin() -> Self {
        Self {
            name: "kubernetes-admin".into(),
            groups: vec!["kubeadm:cluster-admins".into(), AUTHENTICATED.into()],
            ..Self::default()
        }
    }

    /// A service-account token's user, as the service-account authenticator builds it.
    pub fn service_account(sub: &super::tokens::TokenSubject) -> Self {
        let mut extra = BTreeMap::new();
        if let Some(jti) = &sub.jti {
            extra.insert(
                "authentication.kubernetes.io/credential-id".into(),
                vec![format!("JTI={jti}")],
            );
        }
        if let Some((name, uid)) = &sub.pod {
            extra.insert(
                "authentication.kubernetes.io/pod-name".into(),
                vec![name.clone()],
            );
            extra.insert(
                "authentication.kubernetes.io/pod-uid".into(),
                vec![uid.clone()],
            );
        }
        Self {
            name: format!(
                "system:serviceaccount:{}:{}",
                sub.namespace, sub.service_account
            ),
            uid: sub.uid.clone(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{}", sub.namespace),
                AUTHENTICATED.into(),
            ],
            extra,
        }
    }

    /// `extra` as the JSON map of a CSR's `spec.extra` (None when empty, as Go omits it).
    pub fn extra_json(&self) -> Option<Value> {
        (!self.extra.is_empty()).then(|| json!(self.extra))
    }
}

/// The user behind the request's bearer token; 401 for anything else.
pub fn authenticate(st: &State, headers: &http::HeaderMap) -> ApiResult<UserInfo> {
    let token = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .ok_or_else(ApiError::unauthorized)?;
    if !token.is_empty() && token == st.admin_token {
        return Ok(UserInfo::admin());
    }
    let now = super::meta::now().unix_timestamp();
    if let Some(sub) = st.tokens.verify(token, now) {
        let sa = st.core("serviceaccounts");
        if let Some(obj) = st
            .table(&sa)
            .get(&(sub.namespace.clone(), sub.service_account.clone()))
            && obj.uid() == sub.uid
        {
            return Ok(UserInfo::service_account(&sub));
        }
    }
    Err(ApiError::unauthorized())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::TokenSubject;

    #[test]
    fn service_account_users_carry_their_groups_and_token_extras() {
        let u = UserInfo::service_account(&TokenSubject {
            namespace: "ns".into(),
            service_account: "sa".into(),
            uid: "u1".into(),
            jti: Some("j".into()),
            pod: Some(("p".into(), "pu".into())),
        });
        assert_eq!(u.name, "system:serviceaccount:ns:sa");
        assert_eq!(u.uid, "u1");
        assert_eq!(
            u.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:ns",
                "system:authenticated"
            ]
        );
        assert_eq!(
            u.extra["authentication.kubernetes.io/credential-id"],
            ["JTI=j"]
        );
        assert_eq!(u.extra["authentication.kubernetes.io/pod-name"], ["p"]);
        assert!(UserInfo::admin().extra_json().is_none());
    }
}
