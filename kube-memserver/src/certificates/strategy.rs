//! The CSR registry's strategies (`pkg/registry/certificates/certificates/strategy.go`) and
//! validation (`pkg/apis/certificates/validation`): the requester's identity is recorded on
//! create, the spec never changes afterwards, `status` may not touch Approved/Denied and
//! `approval` may touch nothing else.

use serde_json::{Value, json};

use super::{bytes_field, conditions, parse_request, request_der};
use crate::authn::UserInfo;
use crate::meta::{now_time, remove_path, set_path};
use crate::status::{ApiError, ApiResult, Cause};
use crate::validation::{LABEL_MSG, SUBDOMAIN_MSG, is_dns1123_label, is_dns1123_subdomain};

/// `kubectl certificate`'s and every valid usage (`allValidUsages`).
pub const USAGES: &[&str] = &[
    "any",
    "cert sign",
    "client auth",
    "code signing",
    "content commitment",
    "crl sign",
    "data encipherment",
    "decipher only",
    "digital signature",
    "email protection",
    "encipher only",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "key agreement",
    "key encipherment",
    "microsoft sgc",
    "netscape sgc",
    "ocsp signing",
    "s/mime",
    "server auth",
    "signing",
    "timestamping",
];

/// PrepareForCreate: the requester as the authenticator reported it, never as the client
/// wrote it; and no status (a CSR cannot be created approved).
pub fn prepare_create(csr: &mut Value, user: Option<&UserInfo>) {
    for f in ["username", "uid", "groups", "extra"] {
        remove_path(csr, &["spec", f]);
    }
    if let Some(u) = user {
        if !u.name.is_empty() {
            set_path(csr, &["spec", "username"], json!(u.name));
        }
        if !u.uid.is_empty() {
            set_path(csr, &["spec", "uid"], json!(u.uid));
        }
        if !u.groups.is_empty() {
            set_path(csr, &["spec", "groups"], json!(u.groups));
        }
        if let Some(extra) = u.extra_json() {
            set_path(csr, &["spec", "extra"], extra);
        }
    }
}

/// The status a new CSR starts with (Go serializes the empty struct as `{}`).
pub fn default_status(csr: &mut Value) {
    if csr.is_object() {
        csr["status"] = json!({});
    }
}

/// PrepareForUpdate of the main resource, `status` and `approval`.
pub fn prepare_update(old: &Value, new: &mut Value, subresource: Option<&str>) {
    if !new.is_object() {
        return;
    }
    new["spec"] = old["spec"].clone();
    match subresource {
        Some("status") => {
            for ty in ["Approved", "Denied"] {
                preserve_condition_instances(old, new, ty);
            }
            populate_condition_timestamps(old, new);
        }
        Some("approval") => {
            let conds = new["status"]["conditions"].clone();
            new["status"] = old["status"].clone();
            match conds {
                Value::Null => remove_path(new, &["status", "conditions"]),
                c => set_path(new, &["status", "conditions"], c),
            }
            populate_condition_timestamps(old, new);
        }
        _ => new["status"] = old["status"].clone(),
    }
    if new["spec"].is_null() {
        remove_path(new, &["spec"]);
    }
    if new["status"].is_null() {
        remove_path(new, &["status"]);
    }
}

fn condition_indices(csr: &Value, ty: &str) -> Vec<usize> {
    conditions(csr)
        .iter()
        .enumerate()
        .filter(|(_, c)| c["type"] == ty)
        .map(|(i, _)| i)
        .collect()
}

/// A status write keeps the old Approved/Denied conditions when it has as many of them.
fn preserve_condition_instances(old: &Value, new: &mut Value, ty: &str) {
    let (o, n) = (condition_indices(old, ty), condition_indices(new, ty));
    if o.len() != n.len() {
        return; // added or removed: validation refuses it
    }
    for (oi, ni) in o.into_iter().zip(n) {
        new["status"]["conditions"][ni] = conditions(old)[oi].clone();
    }
}

/// Conditions without times get `lastUpdateTime` now and `lastTransitionTime` from an old
/// condition of the same type and status, else now.
fn populate_condition_timestamps(old: &Value, new: &mut Value) {
    let now = now_time();
    let Some(conds) = new["status"]["conditions"].as_array_mut() else {
        return;
    };
    for c in conds.iter_mut().filter(|c| c.is_object()) {
        if c["lastUpdateTime"].as_str().is_none_or(str::is_empty) {
            c["lastUpdateTime"] = json!(now);
        }
        if c["lastTransitionTime"].as_str().is_none_or(str::is_empty) {
            let earlier = conditions(old)
                .iter()
                .find(|o| o["type"] == c["type"] && o["status"] == c["status"])
                .and_then(|o| o["lastTransitionTime"].as_str())
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            c["lastTransitionTime"] = json!(earlier.unwrap_or_else(|| now.clone()));
        }
    }
}

/// Go's `%#v` of a `[]byte`, as field errors show the request.
fn go_bytes(b: &[u8]) -> String {
    let hex: Vec<String> = b.iter().map(|x| format!("{x:#04x}")).collect();
    format!("[]byte{{{}}}", hex.join(", "))
}

fn decode_error(e: String) -> ApiError {
    ApiError::bad_request(format!(
        "CertificateSigningRequest in version \"v1\" cannot be handled as a CertificateSigningRequest: {e}"
    ))
}

/// Validation on create (`old` None) and on updates through `subresource`. Undecodable
/// `[]byte` fields are a 400, as decoding fails before validation on the real server.
pub fn validate(
    csr: &Value,
    old: Option<&Value>,
    subresource: Option<&str>,
) -> ApiResult<Vec<Cause>> {
    let request = bytes_field(&csr["spec"]["request"])
        .map_err(decode_error)?
        .unwrap_or_default();
    let certificate = bytes_field(&csr["status"]["certificate"])
        .map_err(decode_error)?
        .unwrap_or_default();
    let old_certificate = match old {
        Some(o) => bytes_field(&o["status"]["certificate"])
            .ok()
            .flatten()
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let mut causes = Vec::new();
    let spec = &csr["spec"];
    // Updates keep the old spec: only a create needs the request checked again.
    if old.is_none()
        && let Err(e) = request_der(&request).and_then(|der| parse_request(&der).map(|_| ()))
    {
        causes.push(Cause::invalid_shown(
            "spec.request",
            &go_bytes(&request),
            &e,
        ));
    }
    let usages = spec["usages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if usages.is_empty() {
        causes.push(Cause::required("spec.usages", ""));
    }
    let tolerate_old = |check: fn(&Value) -> bool| old.is_some_and(check);
    if !tolerate_old(has_unknown_usage) {
        for (i, u) in usages.iter().enumerate() {
            if !u.as_str().is_some_and(|u| USAGES.contains(&u)) {
                causes.push(Cause::not_supported(format!("spec.usages[{i}]"), u, USAGES));
            }
        }
    }
    if !tolerate_old(has_duplicate_usage) {
        for (i, u) in usages.iter().enumerate() {
            if usages[..i].contains(u) {
                causes.push(Cause::duplicate(format!("spec.usages[{i}]"), u));
            }
        }
    }
    let signer = spec["signerName"].as_str().unwrap_or_default();
    if signer == super::LEGACY_UNKNOWN && old.is_none_or(|o| o["spec"]["signerName"] != signer) {
        causes.push(Cause::invalid(
            "spec.signerName",
            &json!(signer),
            "the legacy signerName is not allowed via this API version",
        ));
    } else if signer != super::LEGACY_UNKNOWN {
        causes.extend(signer_name_causes("spec.signerName", signer));
    }
    if let Some(secs) = spec["expirationSeconds"].as_i64()
        && secs < 600
    {
        causes.push(Cause::invalid(
            "spec.expirationSeconds",
            &json!(secs),
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
    causes.extend(condition_causes(csr, old));
    let tolerate_certificate = old.is_some_and(|_| certificate == old_certificate)
        || (!old_certificate.is_empty() && certificate_error(&old_certificate).is_some());
    if !tolerate_certificate && let Some(e) = certificate_error(&certificate) {
        causes.push(Cause::invalid_shown(
            "status.certificate",
            "\"<certificate data>\"",
            &e,
        ));
    }
    if let Some(old) = old {
        causes.extend(update_causes(
            csr,
            old,
            subresource,
            &certificate,
            &old_certificate,
        ));
    }
    Ok(causes)
}

fn has_unknown_usage(csr: &Value) -> bool {
    csr["spec"]["usages"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|u| !u.as_str().is_some_and(|u| USAGES.contains(&u)))
}

fn has_duplicate_usage(csr: &Value) -> bool {
    let u = csr["spec"]["usages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    (0..u.len()).any(|i| u[..i].contains(&u[i]))
}

/// `ValidateSignerName`: `<domain with a dot>/<path of subdomains>`.
pub fn signer_name_causes(field: &str, name: &str) -> Vec<Cause> {
    if name.is_empty() {
        return vec![Cause::required(field, "")];
    }
    let Some((domain, path)) = name.split_once('/').filter(|(_, p)| !p.contains('/')) else {
        return vec![Cause::invalid(
            field,
            &json!(name),
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        )];
    };
    let mut causes = Vec::new();
    if domain.len() > 253 {
        causes.push(Cause {
            reason: "FieldValueTooLong",
            field: field.into(),
            message: "Too long: may not be more than 253 bytes".into(),
        });
    }
    let labels: Vec<&str> = domain.split('.').collect();
    if let Some(bad) = labels.iter().find(|l| !is_dns1123_label(l)) {
        let msg = if bad.len() > 63 {
            "must be no more than 63 characters"
        } else {
            LABEL_MSG
        };
        causes.push(Cause::invalid(
            field,
            &json!(domain),
            &format!("validating label {bad:?}: {msg}"),
        ));
    }
    if labels.len() < 2 {
        causes.push(Cause::invalid(
            field,
            &json!(domain),
            "should be a domain with at least two segments separated by dots",
        ));
    }
    if let Some(bad) = path.split('.').find(|l| !is_dns1123_subdomain(l)) {
        let msg = if bad.len() > 253 {
            "must be no more than 253 characters"
        } else {
            SUBDOMAIN_MSG
        };
        causes.push(Cause::invalid(
            field,
            &json!(path),
            &format!("validating label {bad:?}: {msg}"),
        ));
    }
    causes
}

fn condition_causes(csr: &Value, old: Option<&Value>) -> Vec<Cause> {
    let tolerate = |check: fn(&Value) -> bool| old.is_some_and(check);
    let (both_ok, dup_ok, empty_ok) = (
        tolerate(|o| super::has_condition(o, "Approved") && super::has_condition(o, "Denied")),
        tolerate(|o| {
            let c = conditions(o);
            (0..c.len()).any(|i| c[..i].iter().any(|p| p["type"] == c[i]["type"]))
        }),
        tolerate(|o| {
            conditions(o)
                .iter()
                .any(|c| c["type"].as_str().is_none_or(str::is_empty))
        }),
    );
    let mut causes = Vec::new();
    let (mut approved, mut denied) = (false, false);
    let conds = conditions(csr);
    for (i, c) in conds.iter().enumerate() {
        let path = format!("status.conditions[{i}]");
        let ty = c["type"].as_str().unwrap_or_default();
        if ty.is_empty() && !empty_ok {
            causes.push(Cause::required(format!("{path}.type"), ""));
        }
        let true_only = matches!(ty, "Approved" | "Denied" | "Failed");
        let allowed: &[&str] = if true_only {
            &["True"]
        } else {
            &["False", "True", "Unknown"]
        };
        match c["status"].as_str().unwrap_or_default() {
            "" => causes.push(Cause::required(format!("{path}.status"), "")),
            s if !allowed.contains(&s) => causes.push(Cause::not_supported(
                format!("{path}.status"),
                &c["status"],
                allowed,
            )),
            _ => {}
        }
        if !both_ok {
            approved |= ty == "Approved";
            denied |= ty == "Denied";
            if (ty == "Approved" && denied) || (ty == "Denied" && approved) {
                causes.push(Cause::invalid(
                    format!("{path}.type"),
                    &json!(ty),
                    "Approved and Denied conditions are mutually exclusive",
                ));
            }
        }
        if !dup_ok && conds[..i].iter().any(|p| p["type"] == c["type"]) {
            causes.push(Cause::duplicate(format!("{path}.type"), &c["type"]));
        }
    }
    causes
}

fn update_causes(
    csr: &Value,
    old: &Value,
    subresource: Option<&str>,
    certificate: &[u8],
    old_certificate: &[u8],
) -> Vec<Cause> {
    let mut causes = Vec::new();
    let of_type = |v: &Value, ty: &str| -> Vec<Value> {
        conditions(v)
            .iter()
            .filter(|c| c["type"] == ty)
            .cloned()
            .collect()
    };
    for ty in ["Approved", "Denied", "Failed"] {
        if of_type(csr, ty).len() < of_type(old, ty).len() {
            causes.push(Cause::forbidden(
                "status.conditions",
                &format!("updates may not remove a condition of type {ty:?}"),
            ));
        }
    }
    if subresource != Some("approval") {
        for ty in ["Approved", "Denied"] {
            let (o, n) = (of_type(old, ty), of_type(csr, ty));
            if n.len() > o.len() {
                causes.push(Cause::forbidden(
                    "status.conditions",
                    &format!("updates may not add a condition of type {ty:?}"),
                ));
            } else if n.len() == o.len() && n != o {
                causes.push(Cause::forbidden(
                    "status.conditions",
                    &format!("updates may not modify a condition of type {ty:?}"),
                ));
            }
        }
    }
    if certificate != old_certificate {
        if subresource != Some("status") {
            causes.push(Cause::forbidden(
                "status.certificate",
                "updates may not set certificate content",
            ));
        } else if !old_certificate.is_empty() {
            causes.push(Cause::forbidden(
                "status.certificate",
                "updates may not modify existing certificate content",
            ));
        }
    }
    causes
}

/// `validateCertificate`: empty, or only CERTIFICATE blocks that parse.
fn certificate_error(pem: &[u8]) -> Option<String> {
    if pem.is_empty() {
        return None;
    }
    let mut blocks = 0;
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let Ok(block) = block else {
            return Some("x509: malformed PEM data".into());
        };
        if block.label != "CERTIFICATE" {
            return Some(format!(
                "only CERTIFICATE PEM blocks are allowed, found {:?}",
                block.label
            ));
        }
        if x509_parser::parse_x509_certificate(&block.contents).is_err() {
            return Some("x509: malformed certificate".into());
        }
        blocks += 1;
    }
    (blocks == 0).then(|| "must contain at least one CERTIFICATE PEM block".into())
}

#[cfg(test)]
#[path = "strategy_tests.rs"]
mod tests;
