//! The MetaServer's serving certificate (KubeEdge v1.17, devices reference §6.2): an edge asks
//! for the cluster CA (`k8s/ca.crt`) and sends a `kubernetes.io/kubelet-serving`
//! CertificateSigningRequest (`default/certificatesigningrequest/<name>`). cloudcore creates
//! it, approves it when it asks for exactly what a serving certificate of that node may hold
//! (KubeEdge's csrapprover approves any kubelet-serving CSR; here only the sending node's),
//! and the edge reads it back until the cluster's signer has issued the certificate.

use base64::Engine;
use kubeedge_shared::constants::{NODE_CN_PREFIX, NODE_ORGANIZATION};
use kubeedge_shared::pki;
use serde_json::{Value, json};

pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// Where the cluster CA is read from: the root-CA publisher puts it in every namespace.
pub const ROOT_CA_CONFIGMAP: (&str, &str) = ("kube-system", "kube-root-ca.crt");

const ALLOWED_USAGES: [&str; 3] = ["digital signature", "key encipherment", "server auth"];

/// The PEM CSR in `spec.request` (base64 in JSON, as Go's `[]byte`).
fn request_pem(csr: &Value) -> Result<String, String> {
    let b64 = csr["spec"]["request"]
        .as_str()
        .ok_or("spec.request is missing")?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("spec.request is not base64: {e}"))?;
    String::from_utf8(bytes).map_err(|_| "spec.request is not PEM text".to_string())
}

/// The node a CSR's request names (`CN=system:node:<node>`), if any.
pub fn requested_node(csr: &Value) -> Option<String> {
    let req = pki::inspect_csr_pem(&request_pem(csr).ok()?).ok()?;
    req.common_name?
        .strip_prefix(NODE_CN_PREFIX)
        .map(str::to_string)
}

/// Why `node` may not have this CSR created and approved: it must be a kubelet-serving
/// request for this node's own name (client-go's `IsKubeletServingCSR`: `O=system:nodes`
/// only, IP or DNS names only, at least one, usages within digital signature / key
/// encipherment / server auth and including server auth).
pub fn check(node: &str, csr: &Value) -> Result<(), String> {
    let signer = csr["spec"]["signerName"].as_str().unwrap_or_default();
    if signer != KUBELET_SERVING_SIGNER {
        return Err(format!(
            "node {node} may only request {KUBELET_SERVING_SIGNER} certificates, not {signer:?}"
        ));
    }
    let req = pki::inspect_csr_pem(&request_pem(csr)?).map_err(|e| e.to_string())?;
    let want_cn = format!("{NODE_CN_PREFIX}{node}");
    if req.common_name.as_deref() != Some(want_cn.as_str()) {
        return Err(format!(
            "node {node} may only request a certificate for {want_cn:?}, not {:?}",
            req.common_name.unwrap_or_default()
        ));
    }
    if req.organizations != [NODE_ORGANIZATION] {
        return Err(format!(
            "the subject's organization must be exactly {NODE_ORGANIZATION:?}"
        ));
    }
    if req.other_sans > 0 || req.ips.len() + req.dns_names.len() == 0 {
        return Err("a serving certificate names IP addresses or DNS names only".into());
    }
    let usages: Vec<&str> = csr["spec"]["usages"]
        .as_array()
        .map(|u| u.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !usages.contains(&"server auth") || usages.iter().any(|u| !ALLOWED_USAGES.contains(u)) {
        return Err(format!(
            "usages must include \"server auth\" and be within {ALLOWED_USAGES:?}, not {usages:?}"
        ));
    }
    Ok(())
}

/// Whether the CSR is already approved or denied.
pub fn decided(csr: &Value) -> bool {
    csr["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| matches!(c["type"].as_str(), Some("Approved" | "Denied")))
}

/// `csr` with the approval condition cloudcore adds (PUT to `/approval`).
pub fn approved(mut csr: Value) -> Value {
    let cond = json!({
        "type": "Approved",
        "status": "True",
        "reason": "AutoApproved",
        "message": "Auto approving MetaServer serving certificate.",
        "lastUpdateTime": super::now_rfc3339(),
    });
    match csr["status"]["conditions"].as_array_mut() {
        Some(c) => c.push(cond),
        None => csr["status"]["conditions"] = json!([cond]),
    }
    csr
}

/// The PEM of the cluster CA from the `kube-root-ca.crt` ConfigMap.
pub fn ca_from_configmap(cm: &Value) -> Option<String> {
    cm["data"]["ca.crt"]
        .as_str()
        .filter(|s| s.contains("BEGIN CERTIFICATE"))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn csr_object(node: &str, ips: &[&str], usages: &[&str]) -> Value {
        let ips: Vec<IpAddr> = ips.iter().map(|s| s.parse().unwrap()).collect();
        let (pem, _) = pki::serving_csr(node, &ips).unwrap();
        json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
               "metadata": {"generateName": "csr-"},
               "spec": {"request": base64::engine::general_purpose::STANDARD.encode(pem),
                        "signerName": KUBELET_SERVING_SIGNER, "usages": usages}})
    }

    #[test]
    fn a_node_may_request_its_own_serving_certificate_only() {
        let usages = ["digital signature", "key encipherment", "server auth"];
        let own = csr_object("edge-1", &["127.0.0.1", "169.254.30.10"], &usages);
        assert_eq!(check("edge-1", &own), Ok(()));
        assert_eq!(requested_node(&own).as_deref(), Some("edge-1"));
        let err = check("edge-2", &own).unwrap_err();
        assert!(err.contains("system:node:edge-2"), "{err}");
        let mut other_signer = own.clone();
        other_signer["spec"]["signerName"] = json!("kubernetes.io/kube-apiserver-client");
        assert!(check("edge-1", &other_signer).is_err());
        let client = csr_object("edge-1", &["127.0.0.1"], &["client auth", "server auth"]);
        assert!(check("edge-1", &client).unwrap_err().contains("usages"));
        let no_sans = csr_object("edge-1", &[], &usages);
        assert!(check("edge-1", &no_sans).unwrap_err().contains("IP"));
        let mut garbage = own.clone();
        garbage["spec"]["request"] = json!("not base64!");
        assert!(check("edge-1", &garbage).is_err());
    }

    #[test]
    fn approval_adds_a_condition_once_decided() {
        let csr = csr_object("edge-1", &["127.0.0.1"], &["server auth"]);
        assert!(!decided(&csr));
        let a = approved(csr);
        assert!(decided(&a));
        assert_eq!(a["status"]["conditions"][0]["reason"], "AutoApproved");
    }
}
