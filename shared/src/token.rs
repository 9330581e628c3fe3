//! Join tokens (protocol §6.2): `hex(sha256(CA DER)) + "." + JWT`, the JWT being HS256 with
//! the raw CA-key DER (`cakeydata`) as HMAC key and claims `{"exp": <unix seconds>}`, as
//! KubeEdge's `GenerateToken` writes it with golang-jwt.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// golang-jwt's header for HS256 (a Go map: keys sorted).
pub const JWT_HEADER: &str = r#"{"alg":"HS256","typ":"JWT"}"#;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("a join token has 4 dot-separated parts (CA hash + JWT), this one has {0}")]
    Parts(usize),
    #[error("the JWT is malformed: {0}")]
    Malformed(&'static str),
    #[error("the JWT is not HS256")]
    Algorithm,
    #[error("the JWT signature is invalid (signed by another CA?)")]
    Signature,
    #[error("the JWT has no exp claim")]
    NoExpiry,
    #[error("the token expired (exp {exp}, now {now})")]
    Expired { exp: i64, now: i64 },
}

/// Lower-case hex SHA-256 of the CA certificate DER: the first part of a join token.
pub fn ca_hash(ca_der: &[u8]) -> String {
    Sha256::digest(ca_der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A JWT `{"exp": exp}` signed HS256 with `key`.
pub fn sign_jwt(key: &[u8], exp: i64) -> String {
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(JWT_HEADER),
        URL_SAFE_NO_PAD.encode(format!(r#"{{"exp":{exp}}}"#))
    );
    let sig = mac(key, signing_input.as_bytes()).finalize().into_bytes();
    format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig))
}

/// The whole join token for a CA.
pub fn generate(ca_der: &[u8], ca_key_der: &[u8], exp: i64) -> String {
    format!("{}.{}", ca_hash(ca_der), sign_jwt(ca_key_der, exp))
}

/// Splits a join token into the CA hash and the JWT.
pub fn split(token: &str) -> Result<(&str, &str), TokenError> {
    let token = token.trim();
    let parts = token.split('.').count();
    if parts != 4 {
        return Err(TokenError::Parts(parts));
    }
    token.split_once('.').ok_or(TokenError::Parts(parts))
}

/// Checks a JWT's HS256 signature with `key` and its expiry against `now` (unix seconds);
/// returns its `exp`.
pub fn verify_jwt(jwt: &str, key: &[u8], now: i64) -> Result<i64, TokenError> {
    let mut parts = jwt.trim().split('.');
    let (Some(header), Some(claims), Some(sig), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed("not three dot-separated parts"));
    };
    let header: serde_json::Value = decode_json(header)?;
    if header.get("alg").and_then(|a| a.as_str()) != Some("HS256") {
        return Err(TokenError::Algorithm);
    }
    let sig = URL_SAFE_NO_PAD
        .decode(sig)
        .map_err(|_| TokenError::Malformed("signature is not base64url"))?;
    let (signing_input, _) = jwt
        .trim()
        .rsplit_once('.')
        .ok_or(TokenError::Malformed("no signature"))?;
    mac(key, signing_input.as_bytes())
        .verify_slice(&sig)
        .map_err(|_| TokenError::Signature)?;
    let claims: serde_json::Value = decode_json(claims)?;
    let exp = match claims.get("exp") {
        None | Some(serde_json::Value::Null) => return Err(TokenError::NoExpiry),
        Some(v) => v
            .as_i64()
            .or_else(|| v.as_f64().map(|f| f as i64))
            .ok_or(TokenError::Malformed("exp is not a number"))?,
    };
    if now > exp {
        return Err(TokenError::Expired { exp, now });
    }
    Ok(exp)
}

/// The `exp` of a JWT without checking its signature (to decide when to refresh).
pub fn jwt_expiry(jwt: &str) -> Option<i64> {
    let claims: serde_json::Value = decode_json(jwt.split('.').nth(1)?).ok()?;
    claims.get("exp")?.as_i64()
}

fn decode_json(part: &str) -> Result<serde_json::Value, TokenError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .map_err(|_| TokenError::Malformed("a part is not base64url"))?;
    serde_json::from_slice(&bytes).map_err(|_| TokenError::Malformed("a part is not JSON"))
}

fn mac(key: &[u8], data: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length.
    let mut m = <HmacSha256 as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    m.update(data);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"\x30\x77\x02\x01\x01\x04\x20 some SEC1 bytes";

    #[test]
    fn golden_format() {
        let token = generate(b"ca der", KEY, 1_700_000_000);
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 4);
        assert_eq!(parts[0], ca_hash(b"ca der"));
        assert_eq!(parts[0].len(), 64);
        assert_eq!(parts[1], "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9");
        assert_eq!(
            URL_SAFE_NO_PAD.decode(parts[2]).unwrap(),
            br#"{"exp":1700000000}"#
        );
        let (hash, jwt) = split(&token).unwrap();
        assert_eq!(hash, parts[0]);
        assert_eq!(verify_jwt(jwt, KEY, 1_600_000_000), Ok(1_700_000_000));
        assert_eq!(jwt_expiry(jwt), Some(1_700_000_000));
    }

    #[test]
    fn refusals() {
        let jwt = sign_jwt(KEY, 100);
        assert_eq!(
            verify_jwt(&jwt, KEY, 101),
            Err(TokenError::Expired { exp: 100, now: 101 })
        );
        assert_eq!(
            verify_jwt(&jwt, b"other key", 50),
            Err(TokenError::Signature)
        );
        let mut forged = jwt.clone();
        forged.replace_range(40..41, "A");
        assert!(verify_jwt(&forged, KEY, 50).is_err());
        assert!(matches!(
            verify_jwt("a.b", KEY, 0),
            Err(TokenError::Malformed(_))
        ));
        assert_eq!(split("a.b.c"), Err(TokenError::Parts(3)));
        let none = format!(
            "{}.{}.x",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode("{}")
        );
        assert_eq!(verify_jwt(&none, KEY, 0), Err(TokenError::Algorithm));
    }
}
