//! The certificate's subject as Go's x509 writes it, which rcgen cannot: Go re-encodes the
//! request's `pkix.Name` — C, ST, L, STREET, POSTALCODE, O, OU (every value, one RDN each), CN,
//! SERIALNUMBER (the last value), other attribute types dropped — and rcgen holds one value per
//! attribute type (a client certificate's several `O` groups). rcgen makes the certificate, the
//! subject is swapped in here and the TBS signed again.

use rcgen::{KeyPair, SigningKey};
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::x509::X509Name;

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;

fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
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

fn oid(arcs: &[u64]) -> Result<Vec<u8>, String> {
    let [first, second, rest @ ..] = arcs else {
        return Err("OID with fewer than two arcs".into());
    };
    if *first > 2 || (*first < 2 && *second >= 40) {
        return Err("malformed OID".into());
    }
    let mut body = Vec::new();
    let head = first
        .checked_mul(40)
        .and_then(|h| h.checked_add(*second))
        .ok_or("malformed OID")?;
    for arc in std::iter::once(head).chain(rest.iter().copied()) {
        let mut groups = vec![(arc & 0x7f) as u8];
        let mut v = arc >> 7;
        while v > 0 {
            groups.push(0x80 | (v & 0x7f) as u8);
            v >>= 7;
        }
        body.extend(groups.into_iter().rev());
    }
    Ok(tlv(0x06, &body))
}

/// Go's `isPrintable` (no `*`, no `&`): such values are PrintableStrings, others UTF8Strings.
fn printable(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b" '()+,-./:=?".contains(&b))
}

/// The request subject re-encoded as Go's `pkix.Name.ToRDNSequence` does.
pub fn go_name(subject: &X509Name<'_>) -> Result<Vec<u8>, String> {
    // (type OID, multi-valued) in Go's order.
    const ORDER: &[(&[u64], bool)] = &[
        (&[2, 5, 4, 6], true),
        (&[2, 5, 4, 8], true),
        (&[2, 5, 4, 7], true),
        (&[2, 5, 4, 9], true),
        (&[2, 5, 4, 17], true),
        (&[2, 5, 4, 10], true),
        (&[2, 5, 4, 11], true),
        (&[2, 5, 4, 3], false),
        (&[2, 5, 4, 5], false),
    ];
    let mut values: Vec<Vec<String>> = vec![Vec::new(); ORDER.len()];
    for attr in subject.iter_attributes() {
        let Some(arcs) = attr.attr_type().iter().map(|i| i.collect::<Vec<u64>>()) else {
            continue;
        };
        let Some(i) = ORDER.iter().position(|(o, _)| *o == arcs.as_slice()) else {
            continue;
        };
        let value = attr
            .as_str()
            .map_err(|_| "subject attribute that is not a string".to_string())?;
        if !ORDER[i].1 {
            values[i].clear();
        }
        values[i].push(value.to_string());
    }
    let mut rdns = Vec::new();
    for ((arcs, multi), vals) in ORDER.iter().zip(values) {
        for v in vals.into_iter().filter(|v| *multi || !v.is_empty()) {
            let tag = if printable(&v) { 0x13 } else { 0x0c };
            let atv = [oid(arcs)?, tlv(tag, v.as_bytes())].concat();
            rdns.extend(tlv(SET, &tlv(SEQUENCE, &atv)));
        }
    }
    Ok(tlv(SEQUENCE, &rdns))
}

/// Whether a DER Name has no RDN (Go then marks the SAN extension critical).
pub fn is_empty_name(name: &[u8]) -> bool {
    name == [SEQUENCE, 0]
}

/// Header and total length of the DER TLV at the start of `buf`.
fn tlv_bounds(buf: &[u8]) -> Option<(usize, usize)> {
    let first = *buf.get(1)?;
    let (header, len) = if first < 0x80 {
        (2, usize::from(first))
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let len = buf
            .get(2..2 + n)?
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (2 + n, len)
    };
    let total = header.checked_add(len)?;
    (total <= buf.len()).then_some((header, total))
}

/// `cert` with its subject replaced by `subject` and signed again with `key` (the issuer's).
pub fn replace_subject(cert: &[u8], subject: &[u8], key: &KeyPair) -> Result<Vec<u8>, String> {
    let malformed = || "re-encoding the certificate".to_string();
    let (_, parsed) = X509Certificate::from_der(cert).map_err(|_| malformed())?;
    let tbs: &[u8] = parsed.tbs_certificate.as_ref();
    let old = parsed.tbs_certificate.subject.as_raw();
    let start = (old.as_ptr() as usize)
        .checked_sub(tbs.as_ptr() as usize)
        .ok_or_else(malformed)?;
    let end = start + old.len();
    let (header, total) = tlv_bounds(tbs).ok_or_else(malformed)?;
    if total != tbs.len() || start < header || end > tbs.len() {
        return Err(malformed());
    }
    let content = [&tbs[header..start], subject, &tbs[end..]].concat();
    let new_tbs = tlv(SEQUENCE, &content);
    // The certificate: SEQUENCE { tbs, signatureAlgorithm, signature }.
    let (outer_header, _) = tlv_bounds(cert).ok_or_else(malformed)?;
    let after_tbs = outer_header + tbs.len();
    let (_, alg_len) =
        tlv_bounds(cert.get(after_tbs..).ok_or_else(malformed)?).ok_or_else(malformed)?;
    let alg = &cert[after_tbs..after_tbs + alg_len];
    let signature = key.sign(&new_tbs).map_err(|e| format!("signing: {e}"))?;
    let bits = [&[0u8][..], &signature].concat();
    Ok(tlv(
        SEQUENCE,
        &[new_tbs, alg.to_vec(), tlv(0x03, &bits)].concat(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oids_and_lengths_encode_as_der() {
        assert_eq!(oid(&[2, 5, 4, 3]).unwrap(), [0x06, 0x03, 0x55, 0x04, 0x03]);
        assert_eq!(
            oid(&[1, 2, 840, 113549]).unwrap(),
            [0x06, 0x06, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d]
        );
        assert!(oid(&[1]).is_err());
        let long = tlv(SEQUENCE, &[0; 300]);
        assert_eq!(&long[..4], &[0x30, 0x82, 0x01, 0x2c]);
        assert_eq!(tlv_bounds(&long), Some((4, 304)));
        assert_eq!(tlv_bounds(&long[..100]), None);
        assert!(printable("system:node:n-1") && !printable("a*b") && !printable("é"));
    }
}
