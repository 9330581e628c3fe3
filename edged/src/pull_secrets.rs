//! Registry credentials from `imagePullSecrets` (`kubernetes.io/dockerconfigjson` and the
//! older `kubernetes.io/dockercfg`), matched to an image's registry as the kubelet's
//! credential keyring does (host, then host with path prefix; Docker Hub under its aliases).

use crate::cri::api::AuthConfig;
use base64::Engine;
use serde_json::Value;

/// The registry host of an image reference (`docker.io` when it names none).
pub fn registry_of(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first,
        _ => "docker.io",
    }
}

fn normalize(key: &str) -> String {
    let k = key
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let k = k
        .strip_suffix("/v1")
        .or_else(|| k.strip_suffix("/v2"))
        .unwrap_or(k);
    match k {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".to_string()
        }
        other => other.to_string(),
    }
}

/// Whether a keyring entry applies to `image` (same host, and the entry's path, if any, is a
/// prefix of the image's repository).
fn matches(key: &str, image: &str) -> bool {
    let key = normalize(key);
    let host = registry_of(image);
    let repo = if image.starts_with(&format!("{host}/")) {
        image.to_string()
    } else {
        format!("{host}/{image}")
    };
    let (key_host, key_path) = key.split_once('/').unwrap_or((key.as_str(), ""));
    key_host == host && (key_path.is_empty() || repo[host.len() + 1..].starts_with(key_path))
}

/// The credentials in one pull secret that apply to `image`.
pub fn credentials_for(secret: &Value, image: &str) -> Vec<AuthConfig> {
    let decode = |key: &str| -> Option<Value> {
        let b64 = secret["data"][key].as_str()?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        serde_json::from_slice(&bytes).ok()
    };
    let auths = match decode(".dockerconfigjson") {
        Some(cfg) => cfg["auths"].clone(),
        None => decode(".dockercfg").unwrap_or(Value::Null),
    };
    let Some(auths) = auths.as_object() else {
        return Vec::new();
    };
    let mut found: Vec<(usize, AuthConfig)> = auths
        .iter()
        .filter(|(k, _)| matches(k, image))
        .map(|(k, v)| {
            let mut a = AuthConfig {
                username: v["username"].as_str().unwrap_or_default().to_string(),
                password: v["password"].as_str().unwrap_or_default().to_string(),
                auth: v["auth"].as_str().unwrap_or_default().to_string(),
                server_address: normalize(k),
                identity_token: v["identitytoken"].as_str().unwrap_or_default().to_string(),
                registry_token: v["registrytoken"].as_str().unwrap_or_default().to_string(),
            };
            if a.username.is_empty()
                && !a.auth.is_empty()
                && let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(&a.auth)
                && let Some((u, p)) = String::from_utf8_lossy(&raw).split_once(':')
            {
                a.username = u.to_string();
                a.password = p.to_string();
            }
            (normalize(k).len(), a)
        })
        .collect();
    // The most specific entry first.
    found.sort_by_key(|(len, _)| std::cmp::Reverse(*len));
    found.into_iter().map(|(_, a)| a).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn secret(config: Value) -> Value {
        let b64 = base64::engine::general_purpose::STANDARD.encode(config.to_string());
        json!({"type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": b64}})
    }

    #[test]
    fn registries_are_read_from_image_references() {
        assert_eq!(registry_of("busybox"), "docker.io");
        assert_eq!(registry_of("library/busybox:1"), "docker.io");
        assert_eq!(registry_of("localhost:5000/busybox"), "localhost:5000");
        assert_eq!(registry_of("ghcr.io/org/app@sha256:ab"), "ghcr.io");
        assert_eq!(registry_of("localhost/app"), "localhost");
    }

    #[test]
    fn credentials_match_host_and_path_most_specific_first() {
        let s = secret(json!({"auths": {
            "https://index.docker.io/v1/": {"auth": base64::engine::general_purpose::STANDARD.encode("hub:pw")},
            "registry.example.com": {"username": "u", "password": "p"},
            "registry.example.com/team": {"username": "team", "password": "tp"},
        }}));
        let hub = credentials_for(&s, "busybox:1");
        assert_eq!(hub.len(), 1);
        assert_eq!(
            (hub[0].username.as_str(), hub[0].password.as_str()),
            ("hub", "pw")
        );
        assert_eq!(hub[0].server_address, "docker.io");
        let team = credentials_for(&s, "registry.example.com/team/app:1");
        assert_eq!(
            team.iter().map(|a| a.username.as_str()).collect::<Vec<_>>(),
            ["team", "u"]
        );
        let other = credentials_for(&s, "registry.example.com/other/app");
        assert_eq!(other.len(), 1);
        assert!(credentials_for(&s, "quay.io/x/y").is_empty());
        assert!(credentials_for(&json!({"data": {}}), "busybox").is_empty());
    }

    #[test]
    fn legacy_dockercfg_secrets_work() {
        let b64 = base64::engine::general_purpose::STANDARD
            .encode(json!({"localhost:5000": {"username": "a", "password": "b"}}).to_string());
        let s = json!({"type": "kubernetes.io/dockercfg", "data": {".dockercfg": b64}});
        let c = credentials_for(&s, "localhost:5000/busybox");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].username, "a");
    }
}
