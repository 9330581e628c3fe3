//! Domain names, held in their uncompressed wire form (length-prefixed labels ending with the
//! root label), so that encoding is a copy and a suffix is a sub-slice. Comparison ignores
//! ASCII case (RFC 4343); the original spelling is kept so answers echo the asker's case.

use super::wire::WireError;
use std::fmt;
use std::hash::{Hash, Hasher};

/// The longest name in wire form, root label included (RFC 1035 §2.3.4).
pub const MAX_NAME_LEN: usize = 255;
/// The longest label (RFC 1035 §2.3.4).
pub const MAX_LABEL_LEN: usize = 63;
/// No valid name needs more pointers than it has labels (at most 127).
pub(crate) const MAX_POINTER_HOPS: usize = 128;

/// A domain name; always valid (labels of 1..=63 bytes, at most 255 bytes in all).
#[derive(Clone)]
pub struct Name {
    wire: Vec<u8>,
}

impl Name {
    pub fn root() -> Name {
        Name { wire: vec![0] }
    }

    /// Parses dotted text (`web.shop.svc.cluster.local`, with or without the final dot;
    /// `.` or `` is the root). Labels are taken byte for byte: there are no escapes.
    pub fn parse(text: &str) -> Result<Name, WireError> {
        let text = text.strip_suffix('.').unwrap_or(text);
        if text.is_empty() {
            return Ok(Name::root());
        }
        Name::from_labels(text.split('.').map(str::as_bytes))
    }

    pub fn from_labels<'a>(labels: impl IntoIterator<Item = &'a [u8]>) -> Result<Name, WireError> {
        let mut wire = Vec::with_capacity(32);
        for label in labels {
            push_label(&mut wire, label)?;
        }
        wire.push(0);
        Ok(Name { wire })
    }

    /// `label.self`.
    pub fn prepend(&self, label: &[u8]) -> Result<Name, WireError> {
        let mut wire = Vec::with_capacity(self.wire.len() + label.len() + 1);
        push_label(&mut wire, label)?;
        if wire.len() + self.wire.len() > MAX_NAME_LEN {
            return Err(WireError::NameTooLong);
        }
        wire.extend_from_slice(&self.wire);
        Ok(Name { wire })
    }

    /// The labels, leftmost first, without the root.
    pub fn labels(&self) -> Labels<'_> {
        Labels {
            wire: &self.wire,
            pos: 0,
        }
    }

    pub fn label_count(&self) -> usize {
        self.labels().count()
    }

    pub fn is_root(&self) -> bool {
        self.wire.len() == 1
    }

    /// The uncompressed wire form, root label included.
    pub fn as_wire(&self) -> &[u8] {
        &self.wire
    }

    /// The labels in front of `suffix` when this name is `suffix` or below it (ignoring case).
    pub fn strip_suffix(&self, suffix: &Name) -> Option<Vec<&[u8]>> {
        let labels: Vec<&[u8]> = self.labels().collect();
        let keep = labels.len().checked_sub(suffix.label_count())?;
        let offset: usize = labels[..keep].iter().map(|l| l.len() + 1).sum();
        let tail = self.wire.get(offset..)?;
        tail.eq_ignore_ascii_case(&suffix.wire)
            .then(|| labels[..keep].to_vec())
    }

    pub fn is_below_or_at(&self, apex: &Name) -> bool {
        self.strip_suffix(apex).is_some()
    }

    /// Every suffix of the wire form that starts at a label, longest first, with its offset
    /// (what name compression can point to).
    pub(crate) fn suffixes(&self) -> impl Iterator<Item = (usize, &[u8])> {
        let mut pos = 0;
        std::iter::from_fn(move || {
            let len = usize::from(*self.wire.get(pos)?);
            if len == 0 {
                return None;
            }
            let at = pos;
            pos += len + 1;
            Some((at, self.wire.get(at..)?))
        })
    }

    /// Decodes the name at `start` of `msg`, following compression pointers. Returns it and
    /// the position after it in the original sequence.
    ///
    /// Every pointer must go strictly before the run of labels it continues, so the walk
    /// always ends; hops are also bounded, as is the length (255) of the result.
    pub(crate) fn decode(msg: &[u8], start: usize) -> Result<(Name, usize), WireError> {
        let mut wire = Vec::with_capacity(32);
        let mut pos = start;
        let mut run_start = start;
        let mut after: Option<usize> = None;
        let mut hops = 0;
        loop {
            let len = *msg.get(pos).ok_or(WireError::Truncated {
                what: "a name",
                at: pos,
            })?;
            match len >> 6 {
                0 => {
                    let len = usize::from(len);
                    // The label, its length byte and the root label still to come.
                    if len > 0 && wire.len() + len + 2 > MAX_NAME_LEN {
                        return Err(WireError::NameTooLong);
                    }
                    if len == 0 {
                        wire.push(0);
                        let next = after.unwrap_or(pos + 1);
                        return Ok((Name { wire }, next));
                    }
                    let label = msg
                        .get(pos + 1..pos + 1 + len)
                        .ok_or(WireError::Truncated {
                            what: "a label",
                            at: pos,
                        })?;
                    wire.push(len as u8);
                    wire.extend_from_slice(label);
                    pos += 1 + len;
                }
                3 => {
                    let low = *msg.get(pos + 1).ok_or(WireError::Truncated {
                        what: "a compression pointer",
                        at: pos,
                    })?;
                    let target = (usize::from(len & 0x3f) << 8) | usize::from(low);
                    if target >= run_start {
                        return Err(WireError::PointerNotBackward { at: pos, target });
                    }
                    hops += 1;
                    if hops > MAX_POINTER_HOPS {
                        return Err(WireError::TooManyPointers);
                    }
                    after.get_or_insert(pos + 2);
                    run_start = target;
                    pos = target;
                }
                _ => return Err(WireError::ReservedLabelType { at: pos, byte: len }),
            }
        }
    }
}

fn push_label(wire: &mut Vec<u8>, label: &[u8]) -> Result<(), WireError> {
    if label.is_empty() {
        return Err(WireError::EmptyLabel);
    }
    if label.len() > MAX_LABEL_LEN {
        return Err(WireError::LabelTooLong { len: label.len() });
    }
    // The label, its length byte and the root label still to come.
    if wire.len() + label.len() + 2 > MAX_NAME_LEN {
        return Err(WireError::NameTooLong);
    }
    wire.push(label.len() as u8);
    wire.extend_from_slice(label);
    Ok(())
}

/// The labels of a [`Name`], leftmost first.
pub struct Labels<'a> {
    wire: &'a [u8],
    pos: usize,
}

impl<'a> Iterator for Labels<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let len = usize::from(*self.wire.get(self.pos)?);
        if len == 0 {
            return None;
        }
        let label = self.wire.get(self.pos + 1..self.pos + 1 + len)?;
        self.pos += len + 1;
        Some(label)
    }
}

// Length bytes (0..=63) are never ASCII letters, so the whole wire form compares at once.
impl PartialEq for Name {
    fn eq(&self, other: &Name) -> bool {
        self.wire.eq_ignore_ascii_case(&other.wire)
    }
}

impl Eq for Name {}

impl Hash for Name {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for b in &self.wire {
            state.write_u8(b.to_ascii_lowercase());
        }
    }
}

/// Dotted, with the final dot; bytes other than letters, digits, `-`, `_` and `*` are
/// escaped (`\.`, `\\`, `\DDD`) as in zone files.
impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_root() {
            return f.write_str(".");
        }
        for label in self.labels() {
            for &b in label {
                match b {
                    b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'*' => {
                        write!(f, "{}", char::from(b))?
                    }
                    b'.' | b'\\' => write!(f, "\\{}", char::from(b))?,
                    _ => write!(f, "\\{b:03}")?,
                }
            }
            f.write_str(".")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Name({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips_and_case_is_ignored_in_comparison_but_kept() {
        let n = Name::parse("Web.Shop.svc.cluster.local").unwrap();
        assert_eq!(n.to_string(), "Web.Shop.svc.cluster.local.");
        assert_eq!(n, Name::parse("web.shop.SVC.cluster.local.").unwrap());
        assert_eq!(n.label_count(), 5);
        assert_eq!(Name::parse(".").unwrap(), Name::root());
        assert_eq!(Name::root().to_string(), ".");
    }

    #[test]
    fn invalid_text_names_are_errors() {
        assert_eq!(Name::parse("a..b"), Err(WireError::EmptyLabel));
        assert_eq!(
            Name::parse(&"x".repeat(64)),
            Err(WireError::LabelTooLong { len: 64 })
        );
        let long = vec!["abcdefghi"; 26].join("."); // 26 * 10 + 1 = 261 bytes
        assert_eq!(Name::parse(&long), Err(WireError::NameTooLong));
        let fits = vec!["abcdefghi"; 25].join("."); // 251 bytes
        assert!(Name::parse(&fits).is_ok());
    }

    #[test]
    fn a_name_of_exactly_255_bytes_is_accepted_and_256_is_not() {
        // 3 labels of 63 + one of 61: 3 * 64 + 62 + 1 = 255.
        let l63 = "a".repeat(63);
        let ok = format!("{l63}.{l63}.{l63}.{}", "b".repeat(61));
        assert_eq!(Name::parse(&ok).unwrap().as_wire().len(), 255);
        let too_long = format!("{l63}.{l63}.{l63}.{}", "b".repeat(62));
        assert_eq!(Name::parse(&too_long), Err(WireError::NameTooLong));
        let base = Name::parse(&format!("{l63}.{l63}.{l63}")).unwrap();
        assert!(base.prepend("b".repeat(61).as_bytes()).is_ok());
        assert_eq!(
            base.prepend("b".repeat(62).as_bytes()),
            Err(WireError::NameTooLong)
        );
    }

    #[test]
    fn strip_suffix_respects_label_boundaries_and_case() {
        let apex = Name::parse("cluster.local").unwrap();
        let n = Name::parse("web.Shop.SVC.Cluster.LOCAL").unwrap();
        let rel = n.strip_suffix(&apex).unwrap();
        assert_eq!(rel, vec![&b"web"[..], b"Shop", b"SVC"]);
        assert!(apex.strip_suffix(&apex).unwrap().is_empty());
        assert!(
            Name::parse("xcluster.local")
                .unwrap()
                .strip_suffix(&apex)
                .is_none()
        );
        assert!(Name::parse("local").unwrap().strip_suffix(&apex).is_none());
        assert!(n.is_below_or_at(&Name::root()));
    }

    #[test]
    fn odd_bytes_are_escaped_in_text() {
        let n = Name::from_labels([&b"a.b"[..], b"c\\", b"\x00\xff"]).unwrap();
        assert_eq!(n.to_string(), "a\\.b.c\\\\.\\000\\255.");
    }

    #[test]
    fn decoding_follows_backward_pointers() {
        // "shop" at 0, then "web" + pointer to 0 at 6.
        let msg = b"\x04shop\x00\x03web\xc0\x00\xff";
        let (n, next) = Name::decode(msg, 6).unwrap();
        assert_eq!(n.to_string(), "web.shop.");
        assert_eq!(next, 12);
        let (n, next) = Name::decode(msg, 0).unwrap();
        assert_eq!((n.to_string().as_str(), next), ("shop.", 6));
    }

    #[test]
    fn pointer_loops_and_forward_pointers_are_rejected() {
        assert_eq!(
            Name::decode(b"\xc0\x00", 0),
            Err(WireError::PointerNotBackward { at: 0, target: 0 })
        );
        // A label then a pointer back to it: a loop through the label.
        assert!(matches!(
            Name::decode(b"\x01a\xc0\x00", 0),
            Err(WireError::PointerNotBackward { .. })
        ));
        // Two pointers pointing at each other.
        assert!(Name::decode(b"\xc0\x02\xc0\x00", 2).is_err());
        assert!(matches!(
            Name::decode(b"\x00\xc0\x05", 1),
            Err(WireError::PointerNotBackward { .. })
        ));
    }

    #[test]
    fn long_pointer_chains_are_bounded() {
        // Each pointer at 2k points to 2k - 2; the first is a root label. 300 hops.
        let mut msg = vec![0u8, 0];
        for k in 1..300u16 {
            let target = 2 * (k - 1);
            msg.extend_from_slice(&(0xc000 | target).to_be_bytes());
        }
        let start = msg.len() - 2;
        assert_eq!(Name::decode(&msg, start), Err(WireError::TooManyPointers));
        assert!(Name::decode(&msg, 2 * 100).is_ok());
    }

    #[test]
    fn decoded_names_longer_than_255_bytes_are_rejected() {
        // Pointers make a 300-byte name out of a short message: 5 labels of 60 via chains.
        let mut msg = Vec::new();
        msg.push(0u8);
        let mut prev = 0u16;
        for _ in 0..5 {
            let at = msg.len() as u16;
            msg.push(60);
            msg.extend_from_slice(&[b'x'; 60]);
            msg.extend_from_slice(&(0xc000 | prev).to_be_bytes());
            prev = at;
        }
        assert_eq!(
            Name::decode(&msg, usize::from(prev)),
            Err(WireError::NameTooLong)
        );
    }

    #[test]
    fn reserved_label_types_and_truncation_are_errors() {
        assert!(matches!(
            Name::decode(b"\x40", 0),
            Err(WireError::ReservedLabelType { .. })
        ));
        assert!(matches!(
            Name::decode(b"\x05ab", 0),
            Err(WireError::Truncated { .. })
        ));
        assert!(matches!(
            Name::decode(b"\x01a", 0),
            Err(WireError::Truncated { .. })
        ));
        assert!(matches!(
            Name::decode(b"\xc0", 0),
            Err(WireError::Truncated { .. })
        ));
    }
}
