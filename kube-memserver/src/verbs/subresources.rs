//! The `token` (TokenRequest) and `binding` subresources.

use super::*;

/// POST serviceaccounts/<name>/token: a TokenRequest answered with a signed token.
pub fn create_token(st: &State, ns: &str, sa_name: &str, mut body: Value) -> ApiResult<Value> {
    let sainfo = st.core("serviceaccounts");
    let sa = get(st, &sainfo, ns, sa_name)?;
    if !body.is_object() {
        return Err(ApiError::bad_request("TokenRequest must be a JSON object"));
    }
    let tr_info = token_request_info();
    let expiration = match &body["spec"]["expirationSeconds"] {
        Value::Null => 3600,
        v => v
            .as_i64()
            .ok_or_else(|| ApiError::bad_request("spec.expirationSeconds must be an integer"))?,
    };
    if expiration < 600 {
        return Err(ApiError::invalid(
            &tr_info,
            sa_name,
            vec![Cause::invalid(
                "spec.expirationSeconds",
                &json!(expiration),
                "may not specify a duration less than 10 minutes",
            )],
        ));
    }
    if expiration > 1 << 32 {
        return Err(ApiError::invalid(
            &tr_info,
            sa_name,
            vec![Cause::invalid(
                "spec.expirationSeconds",
                &json!(expiration),
                "may not specify a duration larger than 2^32 seconds",
            )],
        ));
    }
    let audiences: Vec<String> = match body["spec"]["audiences"].as_array() {
        Some(a) if !a.is_empty() => a
            .iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect(),
        _ => vec![ISSUER.to_string()],
    };
    let mut bound = None;
    let bref = body["spec"]["boundObjectRef"].clone();
    if bref.is_object() {
        let kind = bref["kind"].as_str().unwrap_or_default();
        let plural = match kind {
            "Pod" => "pods",
            "Secret" => "secrets",
            "Node" => "nodes",
            other => {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token for serviceaccount {sa_name:?} to object of kind {other:?}"
                )));
            }
        };
        let info = st.core(plural);
        let bname = bref["name"].as_str().unwrap_or_default();
        let obj = get(st, &info, ns, bname)?;
        if let Some(uid) = bref["uid"].as_str()
            && !uid.is_empty()
            && uid != obj.uid()
        {
            return Err(ApiError::conflict(
                &info,
                bname,
                &format!(
                    "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
                ),
            ));
        }
        bound = Some(json!({"kind": kind, "name": bname, "uid": obj.uid()}));
        body["spec"]["boundObjectRef"]["uid"] = json!(obj.uid());
    }
    let issued = now();
    let expires = issued
        .checked_add(time::Duration::seconds(expiration))
        .ok_or_else(|| ApiError::bad_request("spec.expirationSeconds is too large"))?;
    let token = st.tokens.issue(&TokenClaims {
        namespace: ns,
        service_account: sa_name,
        sa_uid: sa.uid(),
        audiences: &audiences,
        issued_at: issued.unix_timestamp(),
        expires_at: expires.unix_timestamp(),
        bound,
    });
    body["apiVersion"] = json!("authentication.k8s.io/v1");
    body["kind"] = json!("TokenRequest");
    body["metadata"] = json!({"name": sa_name, "namespace": ns, "creationTimestamp": null});
    set_path(&mut body, &["spec", "audiences"], json!(audiences));
    set_path(&mut body, &["spec", "expirationSeconds"], json!(expiration));
    if body["spec"]["boundObjectRef"].is_null() {
        set_path(&mut body, &["spec", "boundObjectRef"], Value::Null);
    }
    body["status"] = json!({"token": token, "expirationTimestamp": meta::format_time(expires)});
    Ok(body)
}

fn token_request_info() -> ResourceInfo {
    ResourceInfo {
        group: "authentication.k8s.io".into(),
        version: "v1".into(),
        plural: "tokenrequests".into(),
        singular: "tokenrequest".into(),
        kind: "TokenRequest".into(),
        namespaced: true,
        short_names: vec![],
        categories: vec![],
        subresources: vec![],
        custom: false,
        printer_columns: vec![],
        returns_deleted_object: false,
        allow_create_on_update: false,
        allow_unconditional_update: true,
        tracks_generation: false,
        name_rule: crate::resources::NameRule::Subdomain,
        selectable_fields: vec![],
        schema: None,
    }
}

/// POST pods/<name>/binding: what a scheduler does.
pub fn bind_pod(st: &State, ns: &str, pod_name: &str, body: &Value) -> ApiResult<Value> {
    let info = st.core("pods");
    let node = body["target"]["name"]
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(&info, pod_name, vec![Cause::required("target.name", "")])
        })?;
    let table = st.table(&info);
    table.mutate(&(ns.to_string(), pod_name.to_string()), |cur| {
        let Some(cur) = cur else {
            return Err(ApiError::not_found(&info, pod_name));
        };
        if let Some(existing) = cur.value()["spec"]["nodeName"]
            .as_str()
            .filter(|s| !s.is_empty())
        {
            return Err(ApiError::conflict(
                &info,
                pod_name,
                &format!("pod {pod_name} is already assigned to node {existing:?}"),
            ));
        }
        if cur.deleting() {
            return Err(ApiError::conflict(
                &info,
                pod_name,
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        let mut v = cur.value();
        set_path(&mut v, &["spec", "nodeName"], json!(node));
        // The binding storage marks the pod scheduled (`PodScheduled=True`).
        let mut conditions = v["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conditions.retain(|c| c["type"] != "PodScheduled");
        conditions.push(
            json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": now_time()}),
        );
        set_path(&mut v, &["status", "conditions"], Value::Array(conditions));
        Ok(Mutation::Put(v))
    })?;
    Ok(
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    )
}
