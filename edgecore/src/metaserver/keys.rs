//! `metaServer.serviceAccountKeyFiles` (KubeEdge's key): the cluster's service-account public
//! keys (the apiserver's `--service-account-key-file`, PEM `PUBLIC KEY`, `RSA PUBLIC KEY` or a
//! certificate). With them, a token's signature is checked (RS256, ES256, ES384), so tokens
//! the edge did not obtain itself — a `kubernetes.io/service-account-token` Secret mounted by
//! a pod, a token made with `kubectl create token` — are accepted too.

use rustls::pki_types::{AlgorithmIdentifier, SignatureVerificationAlgorithm, alg_id};
use x509_parser::prelude::FromDer;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Rsa,
    P256,
    P384,
}

#[derive(Debug, Clone)]
struct PublicKey {
    kind: KeyKind,
    /// The `subjectPublicKey` bits of the SubjectPublicKeyInfo.
    key: Vec<u8>,
}

/// The keys tokens may be signed with; empty: signatures are not checked here.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    keys: Vec<PublicKey>,
}

const RSA_OID: &str = "1.2.840.113549.1.1.1";
const EC_OID: &str = "1.2.840.10045.2.1";
const P256_OID: &str = "1.2.840.10045.3.1.7";
const P384_OID: &str = "1.3.132.0.34";

fn from_spki(der: &[u8]) -> Result<PublicKey, String> {
    let (_, spki) = x509_parser::x509::SubjectPublicKeyInfo::from_der(der)
        .map_err(|e| format!("not a SubjectPublicKeyInfo: {e}"))?;
    let alg = spki.algorithm.algorithm.to_id_string();
    let kind = match alg.as_str() {
        RSA_OID => KeyKind::Rsa,
        EC_OID => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|o| o.to_id_string())
                .unwrap_or_default();
            match curve.as_str() {
                P256_OID => KeyKind::P256,
                P384_OID => KeyKind::P384,
                other => return Err(format!("unsupported EC curve {other}")),
            }
        }
        other => return Err(format!("unsupported key algorithm {other}")),
    };
    Ok(PublicKey {
        kind,
        key: spki.subject_public_key.data.to_vec(),
    })
}

/// `RSA PUBLIC KEY` (PKCS#1): the RSAPublicKey is exactly the SPKI's key bits.
fn from_pkcs1(der: &[u8]) -> PublicKey {
    PublicKey {
        kind: KeyKind::Rsa,
        key: der.to_vec(),
    }
}

impl KeySet {
    /// Reads every PEM block of every file.
    pub fn load(files: &[String]) -> Result<KeySet, String> {
        let mut keys = Vec::new();
        for f in files {
            let text = std::fs::read(f).map_err(|e| format!("{f}: {e}"))?;
            let mut found = 0;
            for block in x509_parser::pem::Pem::iter_from_buffer(&text) {
                let block = block.map_err(|e| format!("{f}: not PEM: {e}"))?;
                let key = match block.label.as_str() {
                    "PUBLIC KEY" => from_spki(&block.contents),
                    "RSA PUBLIC KEY" => Ok(from_pkcs1(&block.contents)),
                    "CERTIFICATE" => x509_parser::parse_x509_certificate(&block.contents)
                        .map_err(|e| format!("not a certificate: {e}"))
                        .and_then(|(_, c)| from_spki(c.public_key().raw)),
                    _ => continue,
                };
                keys.push(key.map_err(|e| format!("{f}: {e}"))?);
                found += 1;
            }
            if found == 0 {
                return Err(format!(
                    "{f}: no PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE block"
                ));
            }
        }
        Ok(KeySet { keys })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether one of the keys signed `token` (a compact JWS).
    pub fn verify(&self, token: &str, alg: &str) -> bool {
        let Some((signed, sig_b64)) = token.rsplit_once('.') else {
            return false;
        };
        use base64::Engine;
        let Ok(sig) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(sig_b64) else {
            return false;
        };
        let (kind, sig_alg, sig) = match alg {
            "RS256" => (KeyKind::Rsa, alg_id::RSA_PKCS1_SHA256, sig),
            "ES256" => (KeyKind::P256, alg_id::ECDSA_SHA256, der_signature(&sig, 32)),
            "ES384" => (KeyKind::P384, alg_id::ECDSA_SHA384, der_signature(&sig, 48)),
            _ => return false,
        };
        if sig.is_empty() {
            return false;
        }
        let key_alg = match kind {
            KeyKind::Rsa => alg_id::RSA_ENCRYPTION,
            KeyKind::P256 => alg_id::ECDSA_P256,
            KeyKind::P384 => alg_id::ECDSA_P384,
        };
        let Some(verifier) = algorithm(key_alg, sig_alg) else {
            return false;
        };
        self.keys.iter().filter(|k| k.kind == kind).any(|k| {
            verifier
                .verify_signature(&k.key, signed.as_bytes(), &sig)
                .is_ok()
        })
    }
}

fn algorithm(
    key: AlgorithmIdentifier,
    sig: AlgorithmIdentifier,
) -> Option<&'static dyn SignatureVerificationAlgorithm> {
    rustls::crypto::ring::default_provider()
        .signature_verification_algorithms
        .all
        .iter()
        .copied()
        .find(|a| a.public_key_alg_id() == key && a.signature_alg_id() == sig)
}

/// A JWS ECDSA signature (`r‖s`, `n` bytes each) as the DER `ECDSA-Sig-Value` verifiers
/// take; empty when the length is wrong.
fn der_signature(raw: &[u8], n: usize) -> Vec<u8> {
    if raw.len() != 2 * n {
        return Vec::new();
    }
    let int = |b: &[u8]| {
        let b = &b[b.iter().position(|&x| x != 0).unwrap_or(b.len() - 1)..];
        let mut v = vec![0x02];
        let pad = b[0] & 0x80 != 0;
        v.push((b.len() + usize::from(pad)) as u8);
        if pad {
            v.push(0);
        }
        v.extend_from_slice(b);
        v
    };
    let (r, s) = (int(&raw[..n]), int(&raw[n..]));
    let body_len = r.len() + s.len();
    let mut out = vec![0x30];
    if body_len >= 0x80 {
        out.push(0x81);
    }
    out.push(body_len as u8);
    out.extend(r);
    out.extend(s);
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use base64::Engine;
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

    fn b64(b: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    }

    /// DER `ECDSA-Sig-Value` → JWS `r‖s` (32 bytes each).
    fn raw_signature(der: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut i = 2;
        for _ in 0..2 {
            let len = der[i + 1] as usize;
            let int = &der[i + 2..i + 2 + len];
            let int = &int[int.len().saturating_sub(32)..];
            out.extend(std::iter::repeat_n(0, 32 - int.len()));
            out.extend_from_slice(int);
            i += 2 + len;
        }
        out
    }

    /// A compact ES256 JWS of `claims` signed with the P-256 PKCS#8 key `pkcs8`.
    pub(crate) fn es256_token(pkcs8: Vec<u8>, claims: &serde_json::Value) -> String {
        let signing_input = format!(
            "{}.{}",
            b64(br#"{"alg":"ES256","kid":"k"}"#),
            b64(claims.to_string().as_bytes())
        );
        let signer = rustls::crypto::ring::default_provider()
            .key_provider
            .load_private_key(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8)))
            .unwrap()
            .choose_scheme(&[rustls::SignatureScheme::ECDSA_NISTP256_SHA256])
            .unwrap();
        let sig = raw_signature(&signer.sign(signing_input.as_bytes()).unwrap());
        format!("{signing_input}.{}", b64(&sig))
    }

    #[test]
    fn es256_tokens_verify_with_the_public_key_only() {
        let (_, key) = kubeedge_shared::pki::serving_csr("n", &[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sa.pub");
        let files = [path.to_string_lossy().into_owned()];
        std::fs::write(&path, key.public_key_pem()).unwrap();
        let keys = KeySet::load(&files).unwrap();
        assert!(!keys.is_empty());

        let signing_input = format!("{}.{}", b64(br#"{"alg":"ES256"}"#), b64(br#"{"sub":"x"}"#));
        let signer = rustls::crypto::ring::default_provider()
            .key_provider
            .load_private_key(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
                key.serialize_der(),
            )))
            .unwrap()
            .choose_scheme(&[rustls::SignatureScheme::ECDSA_NISTP256_SHA256])
            .unwrap();
        let sig = raw_signature(&signer.sign(signing_input.as_bytes()).unwrap());
        let token = format!("{signing_input}.{}", b64(&sig));
        assert!(keys.verify(&token, "ES256"));
        assert!(!keys.verify(&token, "RS256"));
        let tampered = format!("{}.{}", b64(br#"{"alg":"ES256"}"#), b64(br#"{"sub":"y"}"#));
        assert!(!keys.verify(&format!("{tampered}.{}", b64(&sig)), "ES256"));
        let (_, other) = kubeedge_shared::pki::serving_csr("n", &[]).unwrap();
        std::fs::write(&path, other.public_key_pem()).unwrap();
        assert!(!KeySet::load(&files).unwrap().verify(&token, "ES256"));
        std::fs::write(&path, "not pem").unwrap();
        assert!(KeySet::load(&files).is_err());
    }
}
