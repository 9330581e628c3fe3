//! get and list (with continue tokens).

use super::*;

pub fn get(st: &State, info: &ResourceInfo, ns: &str, name: &str) -> ApiResult<Arc<Obj>> {
    st.table(info)
        .get(&key(info, ns, name))
        .ok_or_else(|| ApiError::not_found(info, name))
}

pub struct ListRequest<'a> {
    pub ns: Option<&'a str>,
    pub filter: &'a Filter,
    pub limit: Option<usize>,
    pub continue_token: Option<&'a str>,
    pub resource_version: Option<u64>,
    pub exact: bool,
}

/// A list page plus the continue token for the next one.
pub struct ListResult {
    pub page: ListPage,
    pub continue_token: Option<String>,
}

pub fn list(st: &State, info: &ResourceInfo, req: &ListRequest<'_>) -> ApiResult<ListResult> {
    let table = st.table(info);
    let (at, after) = match req.continue_token {
        Some(tok) => {
            let (rv, start) = decode_continue(tok, info.namespaced && req.ns.is_none())?;
            let after = match req.ns {
                Some(ns) if info.namespaced => (ns.to_string(), start.1),
                _ => start,
            };
            (Some(rv), Some(after))
        }
        None => {
            let at = match (req.resource_version, req.exact) {
                (Some(rv), true) => {
                    if rv < table.floor_rv() {
                        return Err(ApiError::too_old(rv, table.floor_rv() + 1));
                    }
                    Some(rv)
                }
                _ => None,
            };
            (at, None)
        }
    };
    let page = table.list(req.ns, at, after.as_ref(), req.limit, req.filter)?;
    let continue_token = page
        .next
        .as_ref()
        .map(|k| encode_continue(page.rv, k, info.namespaced && req.ns.is_none()));
    Ok(ListResult {
        page,
        continue_token,
    })
}

/// Continue tokens look like the real ones: base64 of `{"v":"meta.k8s.io/v1","rv":N,"start":"key\u0000"}`.
fn encode_continue(rv: u64, k: &ObjKey, cross_namespace: bool) -> String {
    use base64::Engine;
    let start = if cross_namespace && !k.0.is_empty() {
        format!("{}/{}\u{0}", k.0, k.1)
    } else {
        format!("{}\u{0}", k.1)
    };
    let doc = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start});
    base64::engine::general_purpose::URL_SAFE.encode(doc.to_string())
}

fn decode_continue(tok: &str, cross_namespace: bool) -> ApiResult<(u64, ObjKey)> {
    use base64::Engine;
    let bad = || ApiError::bad_request(format!("continue key is not valid: {tok:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE
        .decode(tok.trim_end_matches('='))
        .or_else(|_| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(tok.trim_end_matches('='))
        })
        .or_else(|_| base64::engine::general_purpose::STANDARD.decode(tok))
        .map_err(|_| bad())?;
    let doc: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    if doc["v"] != "meta.k8s.io/v1" {
        return Err(bad());
    }
    let rv = doc["rv"].as_u64().ok_or_else(bad)?;
    let start = doc["start"].as_str().ok_or_else(bad)?;
    let start = start.strip_suffix('\u{0}').unwrap_or(start);
    let key = if cross_namespace {
        match start.split_once('/') {
            Some((ns, name)) => (ns.to_string(), name.to_string()),
            None => (String::new(), start.to_string()),
        }
    } else {
        (String::new(), start.to_string())
    };
    Ok((rv, key))
}
