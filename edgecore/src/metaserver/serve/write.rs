//! Writes (create, update, patch, delete) forwarded to the cloud; offline they are refused.

use super::*;

const PATCH_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

/// Writes go to the cloud; offline they are refused (nothing is queued: the caller decides).
pub(super) async fn write<L: CloudLink>(
    sh: Arc<Shared<L>>,
    r: ResourceRequest,
    kind: Option<Kind>,
    req: Request<Incoming>,
) -> Response<Body> {
    if !sh.link.is_connected() {
        return status(
            503,
            "ServiceUnavailable",
            format!(
                "edge node {} is disconnected from the cloud: writes need the cloud, retry once it is connected (reads are served from the edge database)",
                sh.config.node
            ),
        );
    }
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.split(';').next().unwrap_or_default().trim().to_string())
        .unwrap_or_default();
    let query_options: Value = Value::Object(
        kubeedge_shared::stream::parse_query(req.uri().query().unwrap_or(""))
            .into_iter()
            .filter(|(k, _)| {
                matches!(
                    k.as_str(),
                    "fieldManager"
                        | "dryRun"
                        | "force"
                        | "propagationPolicy"
                        | "gracePeriodSeconds"
                )
            })
            .map(|(k, v)| (k, json!(v)))
            .collect(),
    );
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes().to_vec(),
        Err(_) => {
            return status(
                413,
                "RequestEntityTooLarge",
                format!("request body larger than {MAX_BODY} bytes or unreadable"),
            );
        }
    };
    let (option, req_body) = match r.verb {
        Verb::Create | Verb::Update => {
            if !serde_json::from_slice::<Value>(&body).is_ok_and(|v| v.is_object()) {
                return status(400, "BadRequest", "the request body is not a JSON object");
            }
            (query_options, body)
        }
        Verb::Patch => {
            if !PATCH_TYPES.contains(&content_type.as_str()) {
                return status(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "the body of a patch must be one of {PATCH_TYPES:?}, not {content_type:?}"
                    ),
                );
            }
            use base64::Engine;
            let info = json!({
                "Name": r.name.clone().unwrap_or_default(),
                "PatchType": content_type,
                "Data": base64::engine::general_purpose::STANDARD.encode(&body),
                "Options": query_options,
                "Subresources": if r.subresource.is_empty() { json!([]) } else { json!([r.subresource]) },
            });
            (info, Vec::new())
        }
        Verb::Delete => {
            let options = if body.is_empty() {
                query_options
            } else {
                match serde_json::from_slice::<Value>(&body) {
                    Ok(v) if v.is_object() => v,
                    _ => {
                        return status(
                            400,
                            "BadRequest",
                            "the DeleteOptions body is not a JSON object",
                        );
                    }
                }
            };
            (options, Vec::new())
        }
        _ => return status(405, "MethodNotAllowed", "unsupported verb"),
    };
    let sub = r.subresource.clone();
    let app = application(&sh, &r, option, req_body, &sub);
    match remote::call(&sh.link, &app, sh.config.remote_timeout).await {
        Ok(Answer::Ok(v)) => {
            let held = kind.as_ref().is_some_and(|k| k.held);
            if !held && v.get("kind").and_then(Value::as_str) != Some("Status") {
                let result = if r.verb == Verb::Delete
                    && v.pointer("/metadata/deletionTimestamp").is_none()
                {
                    sh.store.uncache(v.clone()).await
                } else {
                    sh.store.cache_objects(vec![v.clone()]).await
                };
                if let Err(e) = result {
                    tracing::warn!(error = %e, "the cloud's answer to a write not cached");
                }
            }
            let code = if r.verb == Verb::Create {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            json_response(code, &v)
        }
        Ok(Answer::Refused(s)) => {
            let code = s["code"].as_u64().unwrap_or(500) as u16;
            json_response(
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                &s,
            )
        }
        Err(RemoteError::Offline) => status(
            503,
            "ServiceUnavailable",
            "the cloud is not connected; retry once it is",
        ),
        Err(RemoteError::Link(e)) => {
            status(504, "Timeout", format!("the cloud did not answer: {e}"))
        }
        Err(e) => status(500, "InternalError", e.to_string()),
    }
}
