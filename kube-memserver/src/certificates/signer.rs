//! kube-controller-manager's `csrsigning` controllers (`pkg/controller/certificates/signer`)
//! for `kubernetes.io/kubelet-serving`, `kubernetes.io/kube-apiserver-client-kubelet` and
//! `kubernetes.io/kube-apiserver-client`, signing with the cluster CA
//! (`--cluster-signing-cert-file`/`--cluster-signing-key-file` are kubeadm's `ca.crt`/`ca.key`).
//! An approved, not failed, not yet issued request for one of them is checked against its
//! signer's rules: a request that breaks them gets `Failed=True` (`SignerValidationFailure`),
//! the others get `status.certificate`. Requests for other signers stay pending.

use std::collections::BTreeSet;
use std::net::IpAddr;

use anyhow::Context;
use rand::RngCore;
use rcgen::string::Ia5String;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber, SubjectPublicKeyInfo,
};
use serde_json::{Value, json};
use time::{Duration, OffsetDateTime};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};

use super::{
    KUBE_APISERVER_CLIENT, KUBE_APISERVER_CLIENT_KUBELET, KUBELET_SERVING, bytes_field,
    parse_request, request_der,
};
use crate::meta::now_time;
use crate::state::State;
use crate::verbs::{self, WriteOptions};

/// `--cluster-signing-duration` (default 8760h).
const CERT_TTL: Duration = Duration::days(365);
/// The signer backdates NotBefore (and long-lived NotAfter) by this much.
const BACKDATE: Duration = Duration::minutes(5);
/// Below this lifetime NotAfter is not backdated.
const SHORT: Duration = Duration::hours(8);
/// The shortest lifetime the signer issues.
const MIN_TTL: Duration = Duration::minutes(10);

/// The cluster CA as the signing controllers use it.
pub struct ClusterSigner {
    issuer: Issuer<'static, KeyPair>,
    /// The issuer's key again, to sign the certificate once its subject is swapped.
    key: KeyPair,
    not_after: OffsetDateTime,
}

impl ClusterSigner {
    pub fn new(ca_pem: &str, ca_key_pem: &str) -> anyhow::Result<Self> {
        let key = || KeyPair::from_pem(ca_key_pem).context("parsing the CA key");
        let issuer = Issuer::from_ca_cert_pem(ca_pem, key()?).context("loading the CA")?;
        let (_, pem) = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes())
            .map_err(|e| anyhow::anyhow!("decoding the CA PEM: {e}"))?;
        let ca = pem
            .parse_x509()
            .map_err(|e| anyhow::anyhow!("parsing the CA: {e}"))?;
        Ok(Self {
            issuer,
            key: key()?,
            not_after: ca.validity().not_after.to_datetime(),
        })
    }

    /// Signs `csr` for `usages` (as PermissiveSigningPolicy does: the request's subject and
    /// DNS/IP/email/URI SANs, the requested usages, no other extension, CA:FALSE). PEM out.
    pub fn sign(
        &self,
        csr: &X509CertificationRequest<'_>,
        usages: &[&str],
        expiration_seconds: Option<i64>,
        now: OffsetDateTime,
    ) -> Result<String, String> {
        let ttl = lifetime(expiration_seconds);
        let not_before = now - BACKDATE;
        let mut not_after = if ttl < SHORT {
            now + ttl
        } else {
            now + ttl - BACKDATE
        };
        if not_after >= self.not_after {
            not_after = self.not_after;
        }
        if not_before >= self.not_after {
            return Err(format!(
                "the signer has expired: NotAfter={}",
                self.not_after
            ));
        }
        if now >= self.not_after {
            return Err(format!(
                "refusing to sign a certificate that expired in the past: NotAfter={}",
                self.not_after
            ));
        }
        let (key_usages, extended_key_usages) = key_usages(usages)?;
        let info = &csr.certification_request_info;
        let subject = super::der::go_name(&info.subject)?;
        let mut params = CertificateParams::default();
        // Replaced below; only whether it is empty matters to rcgen (SAN criticality).
        params.distinguished_name = DistinguishedName::new();
        if !super::der::is_empty_name(&subject) {
            params
                .distinguished_name
                .push(DnType::CommonName, "subject");
        }
        params.subject_alt_names = sans(csr)?;
        params.key_usages = key_usages;
        params.extended_key_usages = extended_key_usages;
        params.is_ca = IsCa::ExplicitNoCa;
        params.not_before = not_before;
        params.not_after = not_after;
        params.use_authority_key_identifier_extension = true;
        let mut serial = [0u8; 16];
        rand::rng().fill_bytes(&mut serial);
        serial[0] &= 0x7f;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        let key = SubjectPublicKeyInfo::from_der(info.subject_pki.raw)
            .map_err(|e| format!("unsupported public key: {e}"))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| format!("signing: {e}"))?;
        let der = super::der::replace_subject(cert.der(), &subject, &self.key)?;
        Ok(pem_certificate(&der))
    }
}

fn pem_certificate(der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// The certificate's lifetime for a requested `expirationSeconds`, within [10 min, TTL].
fn lifetime(expiration_seconds: Option<i64>) -> Duration {
    match expiration_seconds {
        None => CERT_TTL,
        Some(s) => Duration::seconds(s).clamp(MIN_TTL, CERT_TTL),
    }
}

fn key_usages(
    usages: &[&str],
) -> Result<(Vec<KeyUsagePurpose>, Vec<ExtendedKeyUsagePurpose>), String> {
    use ExtendedKeyUsagePurpose as E;
    use KeyUsagePurpose as K;
    let mut ku = Vec::new();
    // (Go's ExtKeyUsage order, purpose): Go sorts the extended usages by that order.
    let mut eku: Vec<(u8, E)> = Vec::new();
    let mut unknown = Vec::new();
    for u in usages {
        let k = match *u {
            "signing" | "digital signature" => Some(K::DigitalSignature),
            "content commitment" => Some(K::ContentCommitment),
            "key encipherment" => Some(K::KeyEncipherment),
            "key agreement" => Some(K::KeyAgreement),
            "data encipherment" => Some(K::DataEncipherment),
            "cert sign" => Some(K::KeyCertSign),
            "crl sign" => Some(K::CrlSign),
            "encipher only" => Some(K::EncipherOnly),
            "decipher only" => Some(K::DecipherOnly),
            _ => None,
        };
        if let Some(k) = k {
            if !ku.contains(&k) {
                ku.push(k);
            }
            continue;
        }
        let e = match *u {
            "any" => (0, E::Any),
            "server auth" => (1, E::ServerAuth),
            "client auth" => (2, E::ClientAuth),
            "code signing" => (3, E::CodeSigning),
            "email protection" | "s/mime" => (4, E::EmailProtection),
            "ipsec end system" => (5, E::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 5])),
            "ipsec tunnel" => (6, E::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 6])),
            "ipsec user" => (7, E::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 7])),
            "timestamping" => (8, E::TimeStamping),
            "ocsp signing" => (9, E::OcspSigning),
            "microsoft sgc" => (10, E::Other(vec![1, 3, 6, 1, 4, 1, 311, 10, 3, 3])),
            "netscape sgc" => (11, E::Other(vec![2, 16, 840, 1, 113730, 4, 1])),
            other => {
                unknown.push(format!("{other:?}"));
                continue;
            }
        };
        if !eku.iter().any(|(i, _)| *i == e.0) {
            eku.push(e);
        }
    }
    if !unknown.is_empty() {
        return Err(format!(
            "unrecognized usage values: [{}]",
            unknown.join(" ")
        ));
    }
    eku.sort_by_key(|(i, _)| *i);
    Ok((ku, eku.into_iter().map(|(_, e)| e).collect()))
}

fn general_names<'a>(csr: &'a X509CertificationRequest<'a>) -> Vec<&'a GeneralName<'a>> {
    let mut out = Vec::new();
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            out.extend(san.general_names.iter());
        }
    }
    out
}

/// The DNS, email, IP and URI SANs (what Go's x509 parser keeps).
fn sans(csr: &X509CertificationRequest<'_>) -> Result<Vec<SanType>, String> {
    let ia5 = |s: &str| Ia5String::try_from(s).map_err(|_| format!("SAN {s:?} is not IA5"));
    // Go writes them grouped: DNS names, emails, IPs, URIs.
    let mut out: [Vec<SanType>; 4] = Default::default();
    for name in general_names(csr) {
        match name {
            GeneralName::DNSName(d) => out[0].push(SanType::DnsName(ia5(d)?)),
            GeneralName::RFC822Name(e) => out[1].push(SanType::Rfc822Name(ia5(e)?)),
            GeneralName::IPAddress(b) => out[2].push(SanType::IpAddress(ip(b)?)),
            GeneralName::URI(u) => out[3].push(SanType::URI(ia5(u)?)),
            _ => {}
        }
    }
    Ok(out.into_iter().flatten().collect())
}

fn ip(b: &[u8]) -> Result<IpAddr, String> {
    match b.len() {
        4 => Ok(IpAddr::from(<[u8; 4]>::try_from(b).map_err(|_| "IP SAN")?)),
        16 => Ok(IpAddr::from(<[u8; 16]>::try_from(b).map_err(|_| "IP SAN")?)),
        n => Err(format!("x509: cannot parse IP address of length {n}")),
    }
}

/// What the signers' rules look at in a request.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RequestFacts {
    pub organizations: Vec<String>,
    pub common_name: String,
    pub dns_names: usize,
    pub ip_addresses: usize,
    pub emails: usize,
    pub uris: usize,
}

impl RequestFacts {
    pub fn of(csr: &X509CertificationRequest<'_>) -> Self {
        let subject = &csr.certification_request_info.subject;
        let mut facts = Self {
            organizations: subject
                .iter_organization()
                .filter_map(|a| a.as_str().ok().map(str::to_string))
                .collect(),
            common_name: subject
                .iter_common_name()
                .find_map(|a| a.as_str().ok())
                .unwrap_or_default()
                .to_string(),
            ..Self::default()
        };
        for name in general_names(csr) {
            match name {
                GeneralName::DNSName(_) => facts.dns_names += 1,
                GeneralName::RFC822Name(_) => facts.emails += 1,
                GeneralName::URI(_) => facts.uris += 1,
                GeneralName::IPAddress(_) => facts.ip_addresses += 1,
                _ => {}
            }
        }
        facts
    }
}

/// The signer's rules for a request: `None` when `signer` is not one of the three signed here,
/// else whether the request may be signed (the message becomes the Failed condition's).
pub fn check(signer: &str, req: &RequestFacts, usages: &[&str]) -> Option<Result<(), String>> {
    let set: BTreeSet<&str> = usages.iter().copied().collect();
    fn set_of<'a>(u: &[&'a str]) -> BTreeSet<&'a str> {
        u.iter().copied().collect()
    }
    let nodes = req.organizations == ["system:nodes"];
    const NOT_NODES: &str = "subject organization is not system:nodes";
    const NOT_NODE_CN: &str = "subject common name does not begin with system:node:";
    let node_cn = req.common_name.starts_with("system:node:");
    let res = match signer {
        KUBELET_SERVING => {
            if !nodes {
                Err(NOT_NODES.to_string())
            } else if req.dns_names == 0 && req.ip_addresses == 0 {
                Err("DNS or IP subjectAltName is required".into())
            } else if req.emails > 0 {
                Err("Email subjectAltNames are not allowed".into())
            } else if req.uris > 0 {
                Err("URI subjectAltNames are not allowed".into())
            } else if set != set_of(&["digital signature", "key encipherment", "server auth"])
                && set != set_of(&["digital signature", "server auth"])
            {
                Err("usages did not match [digital signature key encipherment server auth]".into())
            } else if !node_cn {
                Err(NOT_NODE_CN.into())
            } else {
                Ok(())
            }
        }
        KUBE_APISERVER_CLIENT_KUBELET => {
            if !nodes {
                Err(NOT_NODES.to_string())
            } else if req.dns_names > 0 {
                Err("DNS subjectAltNames are not allowed".into())
            } else if req.emails > 0 {
                Err("Email subjectAltNames are not allowed".into())
            } else if req.ip_addresses > 0 {
                Err("IP subjectAltNames are not allowed".into())
            } else if req.uris > 0 {
                Err("URI subjectAltNames are not allowed".into())
            } else if !node_cn {
                Err(NOT_NODE_CN.into())
            } else if set != set_of(&["digital signature", "key encipherment", "client auth"])
                && set != set_of(&["digital signature", "client auth"])
            {
                Err("usages did not match [client auth digital signature key encipherment]".into())
            } else {
                Ok(())
            }
        }
        KUBE_APISERVER_CLIENT => apiserver_client_usages(usages),
        _ => return None,
    };
    Some(res)
}

fn apiserver_client_usages(usages: &[&str]) -> Result<(), String> {
    let mut client_auth = false;
    for u in usages {
        match *u {
            "digital signature" | "key encipherment" => {}
            "client auth" => client_auth = true,
            other => return Err(format!("invalid usage for client certificate: {other}")),
        }
    }
    if client_auth {
        Ok(())
    } else {
        Err("missing required usage for client certificate: client auth".into())
    }
}

/// What the controller does with one CSR.
#[derive(Debug, PartialEq)]
enum Decision {
    /// Not for these signers, not approved, failed or already issued.
    Ignore,
    Fail(String),
    Issue(String),
}

fn decide(signer: &ClusterSigner, csr: &Value, now: OffsetDateTime) -> Result<Decision, String> {
    let name = csr["spec"]["signerName"].as_str().unwrap_or_default();
    if !super::is_approved(csr)
        || super::is_failed(csr)
        || super::is_issued(csr)
        || ![
            KUBELET_SERVING,
            KUBE_APISERVER_CLIENT_KUBELET,
            KUBE_APISERVER_CLIENT,
        ]
        .contains(&name)
    {
        return Ok(Decision::Ignore);
    }
    let pem = bytes_field(&csr["spec"]["request"])?.unwrap_or_default();
    let der = request_der(&pem)?;
    let req = parse_request(&der)?;
    let usages: Vec<&str> = csr["spec"]["usages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    match check(name, &RequestFacts::of(&req), &usages) {
        None => Ok(Decision::Ignore),
        Some(Err(msg)) => Ok(Decision::Fail(msg)),
        Some(Ok(())) => {
            let exp = csr["spec"]["expirationSeconds"].as_i64();
            signer.sign(&req, &usages, exp, now).map(Decision::Issue)
        }
    }
}

/// One pass of the signing controllers over every CSR; writes go through `status`.
pub fn pass(st: &State) {
    let Some(signer) = &st.csr_signer else {
        return;
    };
    let Some(info) = st
        .resources
        .lookup("certificates.k8s.io", "v1", "certificatesigningrequests")
    else {
        return;
    };
    for obj in st.table(&info).all() {
        let mut csr = obj.value();
        let decision = match decide(signer, &csr, OffsetDateTime::now_utc()) {
            Ok(d) => d,
            Err(e) => {
                // Retried on every pass, as the controller requeues: debug, not to flood the log.
                tracing::debug!(csr = obj.name(), error = %e, "signing certificate request");
                continue;
            }
        };
        match decision {
            Decision::Ignore => continue,
            Decision::Fail(msg) => {
                let cond = json!({
                    "type": "Failed", "status": "True", "reason": "SignerValidationFailure",
                    "message": msg, "lastUpdateTime": now_time(),
                });
                match csr["status"]["conditions"].as_array_mut() {
                    Some(c) => c.push(cond),
                    None => {
                        crate::meta::set_path(&mut csr, &["status", "conditions"], json!([cond]))
                    }
                }
            }
            Decision::Issue(pem) => {
                use base64::Engine;
                let b64 = base64::engine::general_purpose::STANDARD.encode(pem.as_bytes());
                crate::meta::set_path(&mut csr, &["status", "certificate"], json!(b64));
            }
        }
        let opts = WriteOptions {
            subresource: Some("status".into()),
            ..WriteOptions::default()
        };
        // A conflict (the CSR changed meanwhile) is retried on the next pass.
        if let Err(e) = verbs::update(st, &info, "", obj.name(), csr, &opts) {
            tracing::debug!(csr = obj.name(), error = %e, "writing certificate request status");
        }
    }
}

#[cfg(test)]
#[path = "signer_tests.rs"]
mod tests;
