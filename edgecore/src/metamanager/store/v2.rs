//! The `meta_v2` mirror: every object row of `meta` also kept in KubeEdge's MetaServer
//! layout (`/<group or core>/<version>/<plural>/<ns or null>/<name>`), with the changes the
//! MetaServer's watches are fed from.

use super::*;

/// The `meta_v2` row of an object (KubeEdge's MetaServer layout): key
/// `/<group or core>/<version>/<plural>/<ns or null>/<name>`, GVR as Go prints it.
#[derive(Debug, Clone)]
pub(super) struct V2Row {
    key: String,
    gvr: String,
    namespace: String,
    name: String,
    resource_version: u64,
}

pub(super) fn v2_row(v: &Value) -> Option<V2Row> {
    let api_version = v.get("apiVersion")?.as_str()?;
    let kind = v.get("kind")?.as_str()?;
    let name = v.pointer("/metadata/name")?.as_str()?;
    let namespace = v
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let plural = kind_to_resource(kind);
    let ns_token = if namespace.is_empty() {
        "null"
    } else {
        namespace
    };
    Some(V2Row {
        key: format!(
            "/{}/{version}/{plural}/{ns_token}/{name}",
            if group.is_empty() { "core" } else { group }
        ),
        gvr: format!("{group}/{version}, Resource={plural}"),
        namespace: namespace.to_string(),
        name: name.to_string(),
        resource_version: rv_of(v).unwrap_or(0),
    })
}

/// KubeEdge's `UnsafeKindToResource`: naive pluralisation of the lower-cased kind.
fn kind_to_resource(kind: &str) -> String {
    let k = kind.to_ascii_lowercase();
    if k == "endpoints" {
        k
    } else if k.ends_with('s') {
        format!("{k}es")
    } else if let Some(stem) = k.strip_suffix('y') {
        format!("{stem}ies")
    } else {
        format!("{k}s")
    }
}

pub(super) fn mirror_v2(conn: &Connection, r: &MetaRecord) -> Result<(), StoreError> {
    match serde_json::from_str::<Value>(&r.value) {
        Ok(v) => match v2_row(&v) {
            Some(row) => mirror_v2_row(conn, r, row),
            None => Ok(()),
        },
        Err(_) => Ok(()),
    }
}

/// [`mirror_v2`] of a record whose `meta_v2` row is known (`row`).
pub(super) fn mirror_v2_row(
    conn: &Connection,
    r: &MetaRecord,
    row: V2Row,
) -> Result<(), StoreError> {
    let ty = &r.resource_type;
    // ServiceAccountAccess objects are the MetaServer's authorization data, not served to
    // applications (their versions are the policy controller's, not the cluster's).
    if ty.is_request() || *ty == ResourceType::ServiceAccountAccess {
        return Ok(());
    }
    let previous = if changes::collecting() {
        v2_value(conn, &row.key)?
    } else {
        None
    };
    let mut stmt = conn.prepare_cached(
        "INSERT OR REPLACE INTO meta_v2 (key, groupversionresource, namespace, name, resourceversion, value)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    stmt.execute(params![
        row.key,
        row.gvr,
        row.namespace,
        row.name,
        row.resource_version as i64,
        r.value
    ])?;
    if changes::collecting() && previous.as_deref() != Some(r.value.as_str()) {
        changes::push(V2Change {
            key: row.key,
            object: Some(r.value.clone()),
            previous,
            deleted_rv: None,
        });
    }
    Ok(())
}

pub(super) fn unmirror_v2(conn: &Connection, stored: &str) -> Result<(), StoreError> {
    let Ok(v) = serde_json::from_str::<Value>(stored) else {
        return Ok(());
    };
    if let Some(row) = v2_row(&v) {
        let previous = if changes::collecting() {
            v2_value(conn, &row.key)?
        } else {
            None
        };
        let mut stmt = conn.prepare_cached("DELETE FROM meta_v2 WHERE key = ?1")?;
        stmt.execute([&row.key])?;
        if let Some(previous) = previous {
            let deleted_rv = changes::delete_rv()
                .filter(|rv| *rv > row.resource_version)
                .unwrap_or(row.resource_version);
            changes::push(V2Change {
                key: row.key,
                object: None,
                previous: Some(previous),
                deleted_rv: Some(deleted_rv),
            });
        }
    }
    Ok(())
}

pub(super) fn max_v2_rv(conn: &Connection) -> Result<u64, StoreError> {
    let rv: Option<i64> =
        conn.query_row("SELECT max(resourceversion) FROM meta_v2", [], |r| r.get(0))?;
    Ok(rv.unwrap_or(0).max(0) as u64)
}

pub(super) fn v2_value(conn: &Connection, key: &str) -> Result<Option<String>, StoreError> {
    let mut stmt = conn.prepare_cached("SELECT value FROM meta_v2 WHERE key = ?1")?;
    Ok(stmt.query_row([key], |r| r.get(0)).optional()?)
}

#[cfg(test)]
mod tests {
    use super::kind_to_resource;

    #[test]
    fn kinds_pluralise_like_kubeedge() {
        assert_eq!(kind_to_resource("Pod"), "pods");
        assert_eq!(kind_to_resource("Endpoints"), "endpoints");
        assert_eq!(kind_to_resource("Ingress"), "ingresses");
        assert_eq!(kind_to_resource("NetworkPolicy"), "networkpolicies");
    }
}
