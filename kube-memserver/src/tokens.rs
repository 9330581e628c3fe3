//! Service-account tokens: JWTs (HS256 with a per-server key) in the shape the real token
//! issuer produces, accepted back as bearer tokens while the service account exists.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

pub struct TokenIssuer {
    key: Vec<u8>,
}

/// Who a valid token belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenSubject {
    pub namespace: String,
    pub service_account: String,
    pub uid: String,
    /// The token's `jti` claim (the authenticator's `credential-id` extra).
    pub jti: Option<String>,
    /// The pod a bound token names: (name, uid).
    pub pod: Option<(String, String)>,
}

pub struct TokenClaims<'a> {
    pub namespace: &'a str,
    pub service_account: &'a str,
    pub sa_uid: &'a str,
    pub audiences: &'a [String],
    pub issued_at: i64,
    pub expires_at: i64,
    pub bound: Option<Value>,
}

impl TokenIssuer {
    pub fn new(key: Vec<u8>) -> Self {
        Self { key }
    }

    fn sign(&self, data: &[u8]) -> Vec<u8> {
        // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
        match Hmac::<Sha256>::new_from_slice(&self.key) {
            Ok(mut mac) => {
                mac.update(data);
                mac.finalize().into_bytes().to_vec()
            }
            Err(_) => Vec::new(),
        }
    }

    pub fn issue(&self, c: &TokenClaims<'_>) -> String {
        let header = json!({"alg": "HS256", "kid": "kube-memserver"});
        let mut k8s = json!({
            "namespace": c.namespace,
            "serviceaccount": {"name": c.service_account, "uid": c.sa_uid},
        });
        if let Some(b) = &c.bound
            && let Some(kind) = b["kind"].as_str()
        {
            k8s[kind.to_lowercase()] = json!({"name": b["name"], "uid": b["uid"]});
        }
        let claims = json!({
            "aud": c.audiences,
            "exp": c.expires_at,
            "iat": c.issued_at,
            "nbf": c.issued_at,
            "iss": ISSUER,
            "jti": uuid::Uuid::new_v4().to_string(),
            "kubernetes.io": k8s,
            "sub": format!("system:serviceaccount:{}:{}", c.namespace, c.service_account),
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let sig = self.sign(signing_input.as_bytes());
        format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig))
    }

    /// Checks signature and expiry; the caller checks that the service account still exists.
    pub fn verify(&self, token: &str, now: i64) -> Option<TokenSubject> {
        let mut parts = token.split('.');
        let (h, c, s) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let sig = URL_SAFE_NO_PAD.decode(s).ok()?;
        let expected = self.sign(format!("{h}.{c}").as_bytes());
        if !constant_time_eq(&sig, &expected) {
            return None;
        }
        let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(c).ok()?).ok()?;
        if claims["exp"].as_i64()? <= now {
            return None;
        }
        let k8s = &claims["kubernetes.io"];
        Some(TokenSubject {
            namespace: k8s["namespace"].as_str()?.to_string(),
            service_account: k8s["serviceaccount"]["name"].as_str()?.to_string(),
            uid: k8s["serviceaccount"]["uid"].as_str()?.to_string(),
            jti: claims["jti"].as_str().map(str::to_string),
            pod: k8s["pod"]["name"]
                .as_str()
                .zip(k8s["pod"]["uid"].as_str())
                .map(|(n, u)| (n.to_string(), u.to_string())),
        })
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_tokens_verify_until_they_expire() {
        let issuer = TokenIssuer::new(b"k".to_vec());
        let aud = vec![ISSUER.to_string()];
        let t = issuer.issue(&TokenClaims {
            namespace: "ns",
            service_account: "default",
            sa_uid: "u",
            audiences: &aud,
            issued_at: 100,
            expires_at: 200,
            bound: None,
        });
        let sub = issuer.verify(&t, 150).unwrap();
        assert_eq!(sub.service_account, "default");
        assert!(issuer.verify(&t, 200).is_none());
        assert!(
            TokenIssuer::new(b"other".to_vec())
                .verify(&t, 150)
                .is_none()
        );
        assert!(issuer.verify("a.b", 150).is_none());
    }
}
