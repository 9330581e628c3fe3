//! certificates.k8s.io/v1 CertificateSigningRequests: the registry's strategy and validation
//! (`strategy.rs`), `kubectl get` columns (`table.rs`) and kube-controller-manager's
//! `csrsigning` controllers for the `kubernetes.io/*` signers, signing with the cluster CA
//! (`signer.rs`). The parsing of a request and the conditions both sides read live here.

mod der;
mod signer;
mod strategy;
mod table;

pub use signer::{ClusterSigner, pass as signer_pass};
pub use strategy::{default_status, prepare_create, prepare_update, validate};
pub use table::columns_and_cells;

use base64::Engine;
use serde_json::Value;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

pub const KIND: &str = "CertificateSigningRequest";

pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
pub const KUBE_APISERVER_CLIENT_KUBELET: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const KUBE_APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";
/// v1beta1's default signer; not allowed in v1 requests.
pub const LEGACY_UNKNOWN: &str = "kubernetes.io/legacy-unknown";

/// A Go `[]byte` field's content: the JSON holds base64. `Ok(None)` when absent.
pub fn bytes_field(v: &Value) -> Result<Option<Vec<u8>>, String> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => base64::engine::general_purpose::STANDARD
            .decode(s.as_bytes())
            .map(Some)
            .map_err(|e| {
                use base64::DecodeError as D;
                let at = match e {
                    D::InvalidByte(at, _) | D::InvalidLastSymbol(at, _) => at,
                    D::InvalidLength(len) => len,
                    D::InvalidPadding => s.len(),
                };
                format!("illegal base64 data at input byte {at}")
            }),
        other => Err(format!(
            "json: cannot unmarshal {} into Go value of type []uint8",
            json_type(other)
        )),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
        _ => "string",
    }
}

/// The DER of the first PEM block of `pem`, which must be a `CERTIFICATE REQUEST`
/// (certificates.ParseCSR).
pub fn request_der(pem: &[u8]) -> Result<Vec<u8>, String> {
    const NOT_A_REQUEST: &str = "PEM block type must be CERTIFICATE REQUEST";
    match x509_parser::pem::parse_x509_pem(pem) {
        Ok((_, block)) if block.label == "CERTIFICATE REQUEST" => Ok(block.contents),
        _ => Err(NOT_A_REQUEST.into()),
    }
}

/// Parses a PKCS#10 request and checks its self-signature, as validation does on create.
pub fn parse_request(der: &[u8]) -> Result<X509CertificationRequest<'_>, String> {
    let (rest, csr) = X509CertificationRequest::from_der(der)
        .map_err(|_| "x509: malformed certificate request".to_string())?;
    if !rest.is_empty() {
        return Err("x509: trailing data after certificate request".into());
    }
    csr.verify_signature()
        .map_err(|e| format!("x509: certificate request signature is invalid: {e}"))?;
    Ok(csr)
}

/// The conditions of a CSR's status.
pub fn conditions(csr: &Value) -> &[Value] {
    csr["status"]["conditions"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// Whether the CSR has a condition of this type (any status: the API allows only True for
/// Approved, Denied and Failed).
pub fn has_condition(csr: &Value, ty: &str) -> bool {
    conditions(csr).iter().any(|c| c["type"] == ty)
}

/// Approved and not denied (`IsCertificateRequestApproved`).
pub fn is_approved(csr: &Value) -> bool {
    let is_true = |ty: &str| {
        conditions(csr)
            .iter()
            .any(|c| c["type"] == ty && c["status"] == "True")
    };
    is_true("Approved") && !is_true("Denied")
}

pub fn is_failed(csr: &Value) -> bool {
    conditions(csr)
        .iter()
        .any(|c| c["type"] == "Failed" && c["status"] == "True")
}

pub fn is_issued(csr: &Value) -> bool {
    csr["status"]["certificate"]
        .as_str()
        .is_some_and(|s| !s.is_empty())
}
