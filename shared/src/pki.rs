//! Certificates: the KubeEdge CA, server certificates and edge certificates (protocol §6).

/// The key usages [`go_ext_key_usage`] maps Go's numbers to.
pub use rcgen::ExtendedKeyUsagePurpose;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::net::IpAddr;
use time::{Duration, OffsetDateTime};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("invalid certificate: {0}")]
    Invalid(String),
}

/// A certificate with its private key, PEM and DER forms at hand.
pub struct IssuedCert {
    pub cert_der: CertificateDer<'static>,
    pub cert_pem: String,
    pub key_pem: String,
    pub key_pkcs8_der: Vec<u8>,
}

impl IssuedCert {
    pub fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_pkcs8_der.clone()))
    }
}

/// The KubeEdge CA: ECDSA P-256, `CN=KubeEdge`, 100 years.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    pub cert: IssuedCert,
    /// The key DER as KubeEdge keeps it in Secret `kubeedge/casecret` (`cakeydata`): SEC1 for
    /// a CA generated or loaded from PEM here, else exactly the bytes loaded. It is also the
    /// HMAC key of join tokens (protocol §6.2), so tokens match KubeEdge's for one secret.
    pub key_der: Vec<u8>,
}

fn serial() -> SerialNumber {
    let mut bytes: [u8; 16] = *uuid::Uuid::new_v4().as_bytes();
    bytes[0] &= 0x7f; // positive
    SerialNumber::from_slice(&bytes)
}

/// Valid from five minutes ago for `days`; an error for a lifetime past year 9999 (or a
/// negative one) rather than the panic `time`'s operators would give.
fn validity(params: &mut CertificateParams, days: i64) -> Result<(), PkiError> {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::minutes(5);
    params.not_after = days
        .checked_mul(86_400)
        .filter(|s| *s >= 0)
        .and_then(|s| now.checked_add(Duration::seconds(s)))
        .ok_or_else(|| PkiError::Invalid(format!("a validity of {days} days is out of range")))?;
    Ok(())
}

fn issued(cert: rcgen::Certificate, key: &KeyPair) -> IssuedCert {
    IssuedCert {
        cert_der: cert.der().clone(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        key_pkcs8_der: key.serialize_der(),
    }
}

fn new_key() -> Result<KeyPair, PkiError> {
    Ok(KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?)
}

impl CertificateAuthority {
    pub fn generate() -> Result<Self, PkiError> {
        let key = new_key()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "KubeEdge");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.serial_number = Some(SerialNumber::from(1024u64));
        validity(&mut params, 365 * 100)?;
        let cert = params.self_signed(&key)?;
        let issued = issued(cert, &key);
        let key_der = sec1_der(&key)?;
        let issuer = Issuer::new(params, key);
        Ok(CertificateAuthority {
            issuer,
            cert: issued,
            key_der,
        })
    }

    /// Loads a CA from its PEM certificate and PEM (PKCS#8 or SEC1) key. Like KubeEdge, the
    /// key's DER inside the PEM is kept as it is (`key_der`: the token HMAC key).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        use rustls_pki_types::pem::PemObject;
        let cert_der =
            pem_body(cert_pem).ok_or_else(|| PkiError::Invalid("no PEM certificate".into()))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| PkiError::Invalid(format!("CA key PEM: {e}")))?;
        let mut ca = Self::from_der(&cert_der, key.secret_der())?;
        ca.cert.cert_pem = cert_pem.to_string();
        Ok(ca)
    }

    /// Loads a CA from DER forms (KubeEdge's `casecret`: `cadata` = certificate DER,
    /// `cakeydata` = key DER; PKCS#8 and SEC1 keys are accepted).
    pub fn from_der(cert_der: &[u8], key_der: &[u8]) -> Result<Self, PkiError> {
        let key = key_from_der(key_der)?;
        let cert_der = CertificateDer::from(cert_der.to_vec());
        let issuer = Issuer::from_ca_cert_der(&cert_der, key_from_der(key_der)?)?;
        Ok(CertificateAuthority {
            issuer,
            key_der: key_der.to_vec(),
            cert: IssuedCert {
                cert_pem: pem_encode("CERTIFICATE", &cert_der),
                cert_der,
                key_pem: key.serialize_pem(),
                key_pkcs8_der: key.serialize_der(),
            },
        })
    }

    /// Whether the key this CA signs with belongs to its certificate (a CA certificate and
    /// key given as two files may not).
    pub fn key_matches_certificate(&self) -> bool {
        x509_parser::parse_x509_certificate(&self.cert.cert_der).is_ok_and(|(_, c)| {
            *c.public_key().subject_public_key.data == *self.issuer.key().public_key_raw()
        })
    }

    /// A server certificate for cloudhub: SANs are IPs or DNS names (empty entries skipped).
    pub fn issue_server(&self, sans: &[&str], days: i64) -> Result<IssuedCert, PkiError> {
        let key = new_key()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "KubeEdge");
        dn.push(DnType::OrganizationName, "KubeEdge");
        params.distinguished_name = dn;
        params.subject_alt_names = sans
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| match s.parse::<IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => Ok(SanType::DnsName((*s).try_into()?)),
            })
            .collect::<Result<_, rcgen::Error>>()?;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.serial_number = Some(serial());
        validity(&mut params, days)?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(issued(cert, &key))
    }

    /// A client certificate with the given CN and O, EKU clientAuth (as `/edge.crt` signs).
    pub fn issue_client(
        &self,
        cn: &str,
        org: Option<&str>,
        days: i64,
    ) -> Result<IssuedCert, PkiError> {
        let key = new_key()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        if let Some(o) = org {
            dn.push(DnType::OrganizationName, o);
        }
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.serial_number = Some(serial());
        validity(&mut params, days)?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(issued(cert, &key))
    }

    /// Signs a DER PKCS#10 CSR: subject CN and O only, EKU clientAuth, `days` validity.
    pub fn sign_csr(&self, csr_der: &[u8], days: i64) -> Result<CertificateDer<'static>, PkiError> {
        self.sign_csr_with(csr_der, days, &[ExtendedKeyUsagePurpose::ClientAuth])
    }

    /// Signs a DER PKCS#10 CSR (signature verified): subject CN and O only, KeyUsage
    /// DigitalSignature|KeyEncipherment, the given EKUs, `days` validity, random serial.
    pub fn sign_csr_with(
        &self,
        csr_der: &[u8],
        days: i64,
        ekus: &[ExtendedKeyUsagePurpose],
    ) -> Result<CertificateDer<'static>, PkiError> {
        let csr = CertificateSigningRequestParams::from_der(&csr_der.to_vec().into())?;
        let mut dn = DistinguishedName::new();
        for (ty, value) in csr.params.distinguished_name.iter() {
            if matches!(ty, DnType::CommonName | DnType::OrganizationName) {
                dn.push(ty.clone(), value.clone());
            }
        }
        self.sign_csr_params(csr, dn, days, ekus)
    }

    /// Signs a DER PKCS#10 CSR (signature verified) for edge node `node`: whatever subject
    /// the CSR carries (KubeEdge ≤ v1.15 edges put `O=kubeEdge, CN=kubeedge.io` in every
    /// CSR), the certificate names the node, `CN=system:node:<node>, O=system:nodes`, as the
    /// kubelet's client certificates do. Otherwise as [`Self::sign_csr_with`].
    pub fn sign_node_csr(
        &self,
        csr_der: &[u8],
        node: &str,
        days: i64,
        ekus: &[ExtendedKeyUsagePurpose],
    ) -> Result<CertificateDer<'static>, PkiError> {
        let csr = CertificateSigningRequestParams::from_der(&csr_der.to_vec().into())?;
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::OrganizationName,
            crate::constants::NODE_ORGANIZATION,
        );
        dn.push(
            DnType::CommonName,
            format!("{}{node}", crate::constants::NODE_CN_PREFIX),
        );
        self.sign_csr_params(csr, dn, days, ekus)
    }

    /// Signs a PEM CSR as a cluster's `kubernetes.io/kubelet-serving` signer does: the
    /// CSR's subject and IP/DNS names kept, EKU serverAuth, `days` validity. PEM out.
    pub fn sign_serving_csr_pem(&self, csr_pem: &str, days: i64) -> Result<String, PkiError> {
        let mut csr = CertificateSigningRequestParams::from_pem(csr_pem)?;
        csr.params.is_ca = IsCa::NoCa;
        csr.params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        csr.params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        csr.params.serial_number = Some(serial());
        validity(&mut csr.params, days)?;
        Ok(csr.signed_by(&self.issuer)?.pem())
    }

    fn sign_csr_params(
        &self,
        mut csr: CertificateSigningRequestParams,
        dn: DistinguishedName,
        days: i64,
        ekus: &[ExtendedKeyUsagePurpose],
    ) -> Result<CertificateDer<'static>, PkiError> {
        csr.params.distinguished_name = dn;
        csr.params.subject_alt_names.clear();
        csr.params.is_ca = IsCa::NoCa;
        csr.params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        csr.params.extended_key_usages = ekus.to_vec();
        csr.params.serial_number = Some(serial());
        validity(&mut csr.params, days)?;
        Ok(csr.signed_by(&self.issuer)?.der().clone())
    }
}

/// Creates an edge key and a DER CSR with `CN=system:node:<node>, O=system:nodes`.
pub fn node_csr(node: &str) -> Result<(Vec<u8>, KeyPair), PkiError> {
    csr_with_subject(
        crate::constants::NODE_ORGANIZATION,
        &format!("{}{node}", crate::constants::NODE_CN_PREFIX),
    )
}

/// The key and DER CSR a KubeEdge ≤ v1.15 edge sends for every node: ECDSA P-256,
/// `C=CN, ST=Zhejiang, L=Hangzhou, O=kubeEdge, CN=kubeedge.io`.
pub fn legacy_kubeedge_csr() -> Result<(Vec<u8>, KeyPair), PkiError> {
    csr_with_subject("kubeEdge", crate::constants::LEGACY_EDGE_CN)
}

fn csr_with_subject(org: &str, cn: &str) -> Result<(Vec<u8>, KeyPair), PkiError> {
    let key = new_key()?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CountryName, "CN");
    dn.push(DnType::StateOrProvinceName, "Zhejiang");
    dn.push(DnType::LocalityName, "Hangzhou");
    dn.push(DnType::OrganizationName, org);
    dn.push(DnType::CommonName, cn);
    params.distinguished_name = dn;
    let csr = params.serialize_request(&key)?;
    Ok((csr.der().to_vec(), key))
}

/// `(notBefore, notAfter)` of a DER certificate, unix seconds.
pub fn cert_validity(cert_der: &[u8]) -> Option<(i64, i64)> {
    let (_, c) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    let v = c.validity();
    Some((v.not_before.timestamp(), v.not_after.timestamp()))
}

/// The IP addresses among a DER certificate's subject alternative names.
pub fn cert_ip_sans(cert_der: &[u8]) -> Vec<IpAddr> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, c)) = x509_parser::parse_x509_certificate(cert_der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = c.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::IPAddress(b) => match b.len() {
                4 => <[u8; 4]>::try_from(*b).ok().map(IpAddr::from),
                16 => <[u8; 16]>::try_from(*b).ok().map(IpAddr::from),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// Go's `x509.ExtKeyUsage` numbers (the `ExtKeyUsages` header of `/edge.crt`).
pub fn go_ext_key_usage(n: i64) -> Option<ExtendedKeyUsagePurpose> {
    Some(match n {
        0 => ExtendedKeyUsagePurpose::Any,
        1 => ExtendedKeyUsagePurpose::ServerAuth,
        2 => ExtendedKeyUsagePurpose::ClientAuth,
        3 => ExtendedKeyUsagePurpose::CodeSigning,
        4 => ExtendedKeyUsagePurpose::EmailProtection,
        8 => ExtendedKeyUsagePurpose::TimeStamping,
        9 => ExtendedKeyUsagePurpose::OcspSigning,
        _ => return None,
    })
}

/// Subject CN and O values of a DER PKCS#10 CSR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrSubject {
    pub common_name: Option<String>,
    pub organizations: Vec<String>,
}

pub fn csr_subject(csr_der: &[u8]) -> Result<CsrSubject, PkiError> {
    use x509_parser::prelude::FromDer;
    let (_, csr) = x509_parser::certification_request::X509CertificationRequest::from_der(csr_der)
        .map_err(|e| PkiError::Invalid(format!("not a DER PKCS#10 CSR: {e}")))?;
    let subject = &csr.certification_request_info.subject;
    Ok(CsrSubject {
        common_name: subject
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .map(str::to_string),
        organizations: subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok())
            .map(str::to_string)
            .collect(),
    })
}

/// A P-256 key as SEC1 `ECPrivateKey` DER with the curve and the public key, byte for byte
/// what Go's `x509.MarshalECPrivateKey` writes (PEM label `EC PRIVATE KEY`).
pub fn sec1_der(key: &KeyPair) -> Result<Vec<u8>, PkiError> {
    let bad = || PkiError::Invalid("not a P-256 PKCS#8 key".into());
    let pkcs8 = key.serialize_der();
    // PrivateKeyInfo ::= SEQUENCE { version, AlgorithmIdentifier, OCTET STRING { ECPrivateKey } }
    let (_, info) = der_item(&pkcs8, 0x30).ok_or_else(bad)?;
    let (rest, _version) = der_item(info, 0x02).ok_or_else(bad)?;
    let (rest, _alg) = der_item(rest, 0x30).ok_or_else(bad)?;
    let (_, inner) = der_item(rest, 0x04).ok_or_else(bad)?;
    let (_, ec) = der_item(inner, 0x30).ok_or_else(bad)?;
    let (rest, _version) = der_item(ec, 0x02).ok_or_else(bad)?;
    let (_, scalar) = der_item(rest, 0x04).ok_or_else(bad)?;
    let public = key.public_key_raw();
    if scalar.len() != 32 || public.len() != 65 {
        return Err(bad());
    }
    const P256_OID: [u8; 10] = [0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
    let mut out = vec![0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20];
    out.extend_from_slice(scalar);
    out.extend_from_slice(&[0xa0, 0x0a]);
    out.extend_from_slice(&P256_OID);
    out.extend_from_slice(&[0xa1, 0x44, 0x03, 0x42, 0x00]);
    out.extend_from_slice(public);
    Ok(out)
}

/// Wraps a P-256 SEC1 `ECPrivateKey` into PKCS#8 (`ring` reads only PKCS#8).
fn sec1_to_pkcs8(sec1: &[u8]) -> Vec<u8> {
    const ALG: [u8; 21] = [
        0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86,
        0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
    ];
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend_from_slice(&ALG);
    body.extend(der_tlv(0x04, sec1));
    der_tlv(0x30, &body)
}

fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// One DER TLV with the expected tag: (what follows it, its contents).
fn der_item(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&t, rest) = input.split_first()?;
    if t != tag {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((&rest[len..], &rest[..len]))
}

/// A key in any of the DER forms CA keys come in: PKCS#8, SEC1 (P-256, Go's
/// `MarshalECPrivateKey`) or PKCS#1 RSA (kubeadm's `ca.key`, `RSA PRIVATE KEY`).
fn key_from_der(der: &[u8]) -> Result<KeyPair, PkiError> {
    use rustls_pki_types::PrivateSec1KeyDer;
    KeyPair::try_from(der)
        .or_else(|_| {
            let sec1 = PrivateKeyDer::Sec1(PrivateSec1KeyDer::from(der.to_vec()));
            KeyPair::try_from(&sec1)
        })
        .or_else(|_| KeyPair::try_from(sec1_to_pkcs8(der).as_slice()))
        .or_else(|_| KeyPair::try_from(pkcs1_to_pkcs8(der).as_slice()))
        .map_err(|e| PkiError::Invalid(format!("CA key: {e}")))
}

/// Wraps a PKCS#1 `RSAPrivateKey` into PKCS#8 (`ring` reads RSA keys only as PKCS#8).
fn pkcs1_to_pkcs8(pkcs1: &[u8]) -> Vec<u8> {
    // AlgorithmIdentifier { rsaEncryption (1.2.840.113549.1.1.1), NULL }
    const ALG: [u8; 15] = [
        0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
    ];
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend_from_slice(&ALG);
    body.extend(der_tlv(0x04, pkcs1));
    der_tlv(0x30, &body)
}

/// PEM armour for a DER body.
pub fn pem_encode(label: &str, der: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::with_capacity(der.len().div_ceil(3) * 4);
    for chunk in der.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                b64.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                b64.push('=');
            }
        }
    }
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn pem_body(pem: &str) -> Option<Vec<u8>> {
    use rustls_pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()?
        .ok()
        .map(|c| c.to_vec())
}

/// A key and a PEM CSR for the node's MetaServer serving certificate, as KubeEdge v1.17 asks
/// for it (`CN=system:node:<node>, O=system:nodes`, the listeners' IPs as SANs), for signer
/// `kubernetes.io/kubelet-serving`.
pub fn serving_csr(node: &str, ips: &[IpAddr]) -> Result<(String, KeyPair), PkiError> {
    let key = new_key()?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::OrganizationName,
        crate::constants::NODE_ORGANIZATION,
    );
    dn.push(
        DnType::CommonName,
        format!("{}{node}", crate::constants::NODE_CN_PREFIX),
    );
    params.distinguished_name = dn;
    params.subject_alt_names = ips.iter().map(|ip| SanType::IpAddress(*ip)).collect();
    let csr = params.serialize_request(&key)?;
    Ok((csr.pem()?, key))
}

/// What a PEM CSR asks for (its signature verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrRequest {
    pub common_name: Option<String>,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
    /// SANs that are neither DNS names nor IPs (e-mail, URI, other).
    pub other_sans: usize,
}

pub fn inspect_csr_pem(pem: &str) -> Result<CsrRequest, PkiError> {
    let csr = CertificateSigningRequestParams::from_pem(pem)
        .map_err(|e| PkiError::Invalid(format!("not a PEM PKCS#10 CSR: {e}")))?;
    let mut out = CsrRequest {
        common_name: None,
        organizations: Vec::new(),
        dns_names: Vec::new(),
        ips: Vec::new(),
        other_sans: 0,
    };
    let text = |v: &rcgen::DnValue| match v {
        rcgen::DnValue::PrintableString(s) => s.to_string(),
        rcgen::DnValue::Utf8String(s) => s.clone(),
        other => format!("{other:?}"),
    };
    for (ty, value) in csr.params.distinguished_name.iter() {
        match ty {
            DnType::CommonName => out.common_name = Some(text(value)),
            DnType::OrganizationName => out.organizations.push(text(value)),
            _ => {}
        }
    }
    for san in &csr.params.subject_alt_names {
        match san {
            SanType::DnsName(d) => out.dns_names.push(d.to_string()),
            SanType::IpAddress(ip) => out.ips.push(*ip),
            _ => out.other_sans += 1,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csr_is_signed_with_its_subject() {
        let ca = CertificateAuthority::generate().unwrap();
        let (csr, _key) = node_csr("edge-1").unwrap();
        let cert = ca.sign_csr(&csr, 365).unwrap();
        assert_eq!(
            crate::tls::common_name(&cert).as_deref(),
            Some("system:node:edge-1")
        );
    }

    #[test]
    fn validity_out_of_range_is_an_error_not_a_panic() {
        let ca = CertificateAuthority::generate().unwrap();
        let (csr, _key) = node_csr("edge-1").unwrap();
        for days in [i64::MAX, i64::MAX / 86_400, 10_000 * 366, -1, i64::MIN] {
            let e = ca.sign_csr(&csr, days).unwrap_err().to_string();
            assert!(e.contains("out of range"), "{days}: {e}");
            assert!(ca.issue_client("x", None, days).is_err(), "{days}");
        }
        assert!(ca.sign_csr(&csr, 36_500).is_ok());
    }

    #[test]
    fn sec1_der_is_go_layout_and_loads_back() {
        let ca = CertificateAuthority::generate().unwrap();
        assert_eq!(ca.key_der.len(), 121);
        assert_eq!(
            &ca.key_der[..7],
            &[0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20]
        );
        let again = CertificateAuthority::from_der(&ca.cert.cert_der, &ca.key_der).unwrap();
        assert_eq!(
            again.key_der, ca.key_der,
            "stored bytes are kept as they are"
        );
        assert!(again.issue_client("x", None, 1).is_ok());
        // An older PKCS#8 secret still loads, and its bytes stay the HMAC key.
        let old =
            CertificateAuthority::from_der(&ca.cert.cert_der, &ca.cert.key_pkcs8_der).unwrap();
        assert_eq!(old.key_der, ca.cert.key_pkcs8_der);
        // PEM files: the DER inside is the HMAC key, SEC1 (`EC PRIVATE KEY`) or PKCS#8.
        let sec1_pem = pem_encode("EC PRIVATE KEY", &ca.key_der);
        let pem = CertificateAuthority::from_pem(&ca.cert.cert_pem, &sec1_pem).unwrap();
        assert_eq!(pem.key_der, ca.key_der);
        assert!(pem.issue_client("y", None, 1).is_ok());
        let pem = CertificateAuthority::from_pem(&ca.cert.cert_pem, &ca.cert.key_pem).unwrap();
        assert_eq!(pem.key_der, ca.cert.key_pkcs8_der);
    }

    #[test]
    fn csr_subject_and_ekus() {
        let ca = CertificateAuthority::generate().unwrap();
        let (csr, _key) = node_csr("edge-2").unwrap();
        let subject = csr_subject(&csr).unwrap();
        assert_eq!(subject.common_name.as_deref(), Some("system:node:edge-2"));
        assert_eq!(subject.organizations, vec!["system:nodes".to_string()]);
        let ekus = [go_ext_key_usage(1).unwrap(), go_ext_key_usage(2).unwrap()];
        let cert = ca.sign_csr_with(&csr, 1, &ekus).unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(&cert).unwrap();
        let eku = parsed.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth);
        assert!(go_ext_key_usage(42).is_none());
        assert!(csr_subject(b"junk").is_err());
    }

    #[test]
    fn node_csr_signing_names_the_node_whatever_the_csr_subject() {
        let ca = CertificateAuthority::generate().unwrap();
        let (csr, _key) = legacy_kubeedge_csr().unwrap();
        let subject = csr_subject(&csr).unwrap();
        assert_eq!(subject.common_name.as_deref(), Some("kubeedge.io"));
        assert_eq!(subject.organizations, vec!["kubeEdge".to_string()]);
        let ekus = [ExtendedKeyUsagePurpose::ClientAuth];
        let cert = ca.sign_node_csr(&csr, "edge-3", 1, &ekus).unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(&cert).unwrap();
        let cns: Vec<_> = parsed
            .subject()
            .iter_common_name()
            .map(|c| c.as_str().unwrap())
            .collect();
        let orgs: Vec<_> = parsed
            .subject()
            .iter_organization()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(cns, ["system:node:edge-3"]);
        assert_eq!(orgs, ["system:nodes"]);
        assert!(parsed.subject().iter_country().next().is_none());
        assert!(ca.sign_node_csr(b"junk", "edge-3", 1, &ekus).is_err());
    }

    #[test]
    fn garbage_csr_is_an_error() {
        let ca = CertificateAuthority::generate().unwrap();
        assert!(ca.sign_csr(b"not a csr", 365).is_err());
    }

    #[test]
    fn ca_round_trips_through_der_and_pem_encoding_matches() {
        let ca = CertificateAuthority::generate().unwrap();
        assert_eq!(
            pem_encode("CERTIFICATE", &ca.cert.cert_der),
            ca.cert.cert_pem.replace("\r\n", "\n")
        );
        let again =
            CertificateAuthority::from_der(&ca.cert.cert_der, &ca.cert.key_pkcs8_der).unwrap();
        assert_eq!(again.cert.cert_der, ca.cert.cert_der);
        assert!(CertificateAuthority::from_der(&ca.cert.cert_der, b"junk").is_err());
    }

    #[test]
    fn a_kubeadm_rsa_ca_signs_and_a_foreign_key_is_noticed() {
        use rustls::client::danger::ServerCertVerifier;
        // kubeadm's /etc/kubernetes/pki/ca.{crt,key}: RSA 2048, the key as PKCS#1.
        let cert = include_str!("../testdata/kubeadm-ca.crt");
        let key = include_str!("../testdata/kubeadm-ca.key");
        assert!(key.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
        let ca = CertificateAuthority::from_pem(cert, key).unwrap();
        assert!(ca.key_matches_certificate());
        let leaf = ca.issue_server(&["10.254.254.1"], 1).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert.cert_der.clone()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            std::sync::Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let ip = rustls_pki_types::ServerName::try_from("10.254.254.1").unwrap();
        let now = rustls_pki_types::UnixTime::now();
        verifier
            .verify_server_cert(&leaf.cert_der, &[], &ip, &[], now)
            .expect("the leaf chains to the RSA CA for its IP");
        // The same certificate with another CA's key: loads, but does not match.
        let other = CertificateAuthority::generate().unwrap();
        let mixed = CertificateAuthority::from_pem(cert, &other.cert.key_pem).unwrap();
        assert!(!mixed.key_matches_certificate());
        assert!(other.key_matches_certificate());
    }

    #[test]
    fn ca_round_trips_through_pem() {
        let ca = CertificateAuthority::generate().unwrap();
        let again = CertificateAuthority::from_pem(&ca.cert.cert_pem, &ca.cert.key_pem).unwrap();
        let leaf = again.issue_client("x", None, 1).unwrap();
        assert_eq!(
            crate::tls::common_name(&leaf.cert_der).as_deref(),
            Some("x")
        );
    }
}
