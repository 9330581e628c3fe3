//! An ImagePrePullJob on this node, as KubeEdge v1.23's edge runs it: `Check` (the
//! `checkItems`), then `Pull` — every image through CRI (`ImageStatus` first, `PullImage` when
//! missing), the whole pass tried `retryTimes + 1` times — each action reported.
//!
//! Beyond KubeEdge: `imageSecrets` is read as the kubelet reads pull secrets (KubeEdge v1.23
//! decodes the `.dockerconfigjson` straight into a CRI `AuthConfig`, so `{"auths": …}` secrets
//! pull anonymously); image references are checked before they reach the runtime.

use kubeedge_edged::cri::api::AuthConfig;
use kubeedge_edged::cri::runtime::Runtime;
use kubeedge_shared::nodetask::ImageStatus;
use serde::Deserialize;
use serde_json::Value;
use std::time::Duration;

/// `spec.imagePrePullTemplate` (the fields the edge uses).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Template {
    pub images: Vec<String>,
    pub check_items: Vec<String>,
    /// `<namespace>/<name>` of a registry secret.
    pub image_secrets: String,
    pub retry_times: i32,
}

/// The job's `spec` as the cloud sends it (an object, or its JSON text).
pub fn template(content: &Value) -> Result<Template, String> {
    let spec: Value = match content {
        Value::String(s) => {
            serde_json::from_str(s).map_err(|e| format!("spec is not JSON: {e}"))?
        }
        v => v.clone(),
    };
    let t = spec
        .get("imagePrePullTemplate")
        .ok_or("spec has no imagePrePullTemplate")?;
    serde_json::from_value(t.clone()).map_err(|e| format!("bad imagePrePullTemplate: {e}"))
}

/// Whether `image` is a plausible image reference (letters, digits and `._-/:@`; no spaces,
/// no leading `-`), at most 512 bytes.
pub fn valid_reference(image: &str) -> bool {
    !image.is_empty()
        && image.len() <= 512
        && !image.starts_with('-')
        && image
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:@".contains(&b))
}

/// Pulls `images` once each where missing: each image's result.
pub async fn pull_all(
    runtime: &Runtime,
    images: &[String],
    secret: Option<&Value>,
    timeout: Duration,
) -> Vec<ImageStatus> {
    let mut out = Vec::with_capacity(images.len());
    for image in images {
        let status = |ok: bool, reason: String| ImageStatus {
            image: image.clone(),
            status: if ok { "True" } else { "False" }.into(),
            reason,
        };
        if !valid_reference(image) {
            out.push(status(false, "invalid image reference".into()));
            continue;
        }
        match runtime.image_status(image).await {
            Ok(Some(_)) => {
                out.push(status(true, String::new()));
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                out.push(status(false, e.to_string()));
                continue;
            }
        }
        let auths: Vec<AuthConfig> = secret
            .map(|s| kubeedge_edged::pull_secrets::credentials_for(s, image))
            .unwrap_or_default();
        let mut result = Err(String::from("no attempt"));
        // Each matching credential in turn, then anonymously when there is none.
        let tries: Vec<Option<AuthConfig>> = if auths.is_empty() {
            vec![None]
        } else {
            auths.into_iter().map(Some).collect()
        };
        for auth in tries {
            result = runtime
                .pull_image(image, auth, timeout)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string());
            if result.is_ok() {
                break;
            }
        }
        match result {
            Ok(()) => out.push(status(true, String::new())),
            Err(e) => out.push(status(false, e)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn templates_come_as_objects_or_text() {
        let spec = json!({"imagePrePullTemplate": {"images": ["busybox:1.36"], "checkItems": ["disk"],
            "imageSecrets": "default/regcred", "retryTimes": 2, "concurrency": 1, "nodeNames": ["n"]}});
        let t = template(&spec).unwrap();
        assert_eq!(t.images, ["busybox:1.36"]);
        assert_eq!(t.check_items, ["disk"]);
        assert_eq!(t.image_secrets, "default/regcred");
        assert_eq!(t.retry_times, 2);
        assert_eq!(
            template(&Value::String(spec.to_string()))
                .unwrap()
                .images
                .len(),
            1
        );
        assert!(template(&json!({})).is_err());
        assert!(template(&json!("{not json")).is_err());
        assert!(template(&json!({"imagePrePullTemplate": {"images": "x"}})).is_err());
    }

    #[test]
    fn image_references_are_checked_before_the_runtime_sees_them() {
        for ok in [
            "busybox",
            "localhost:5000/busybox:latest",
            "docker.io/library/nginx@sha256:0123abcd",
        ] {
            assert!(valid_reference(ok), "{ok}");
        }
        for bad in [
            "",
            "-x",
            "busybox; rm -rf /",
            "a b",
            "$(id)",
            "x\ny",
            &"a".repeat(513),
        ] {
            assert!(!valid_reference(bad), "{bad:?}");
        }
    }
}
