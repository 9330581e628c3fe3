//! `kubectl get csr` columns, as upstream's printer (`printCertificateSigningRequest`) makes
//! them.

use serde_json::{Value, json};

use crate::meta::{age, human_duration};
use crate::table::{Column, NAME, col};

pub fn columns_and_cells(csr: &Value) -> (Vec<Column>, Vec<Value>) {
    let or_none = |v: &Value| {
        v.as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or("<none>")
            .to_string()
    };
    let requested = csr["spec"]["expirationSeconds"]
        .as_i64()
        .map_or("<none>".to_string(), human_duration);
    (
        vec![
            NAME,
            col("Age", 0),
            col("SignerName", 0),
            col("Requestor", 0),
            col("RequestedDuration", 0),
            col("Condition", 0),
        ],
        vec![
            csr["metadata"]["name"].clone(),
            json!(age(csr)),
            json!(or_none(&csr["spec"]["signerName"])),
            json!(csr["spec"]["username"].as_str().unwrap_or_default()),
            json!(requested),
            json!(condition(csr)),
        ],
    )
}

/// `Approved,Issued`, `Denied`, `Pending,Failed`…: denial wins over approval.
pub fn condition(csr: &Value) -> String {
    let has = |ty: &str| super::has_condition(csr, ty);
    let mut s = if has("Denied") {
        "Denied".to_string()
    } else if has("Approved") {
        "Approved".to_string()
    } else {
        "Pending".to_string()
    };
    if has("Failed") {
        s.push_str(",Failed");
    }
    if super::is_issued(csr) {
        s.push_str(",Issued");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn condition_column_orders_denial_failure_and_issuance() {
        let csr = |conds: Value, cert: Option<&str>| json!({"metadata": {"name": "c"}, "status": {"conditions": conds, "certificate": cert}});
        assert_eq!(condition(&csr(json!([]), None)), "Pending");
        assert_eq!(
            condition(&csr(
                json!([{"type": "Approved", "status": "True"}]),
                Some("Y2VydA==")
            )),
            "Approved,Issued"
        );
        assert_eq!(
            condition(&csr(
                json!([{"type": "Approved", "status": "True"}, {"type": "Failed", "status": "True"}]),
                None
            )),
            "Approved,Failed"
        );
        assert_eq!(
            condition(&csr(json!([{"type": "Denied", "status": "True"}]), None)),
            "Denied"
        );
        let (cols, cells) = columns_and_cells(&json!({
            "metadata": {"name": "c"},
            "spec": {"signerName": "example.com/x", "username": "alice", "expirationSeconds": 3600},
        }));
        let names: Vec<_> = cols.iter().map(|c| c.name.to_string()).collect();
        assert_eq!(
            names,
            [
                "Name",
                "Age",
                "SignerName",
                "Requestor",
                "RequestedDuration",
                "Condition"
            ]
        );
        assert_eq!(cells[2], "example.com/x");
        assert_eq!(cells[3], "alice");
        assert_eq!(cells[4], "60m");
        assert_eq!(cells[5], "Pending");
    }
}
