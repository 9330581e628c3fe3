//! Kubernetes label and field selectors (`labelSelector=`, `fieldSelector=` of list and watch
//! requests): parsed once per request, matched against objects. Used by the in-memory apiserver
//! and by edgecore's MetaServer.

use std::borrow::Cow;

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct FieldReq {
    pub path: String,
    pub equal: bool,
    pub value: String,
}

/// A parsed `labelSelector` + `fieldSelector` pair.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    pub labels: Vec<LabelReq>,
    pub fields: Vec<FieldReq>,
}

impl Filter {
    /// Parses a `labelSelector` and a `fieldSelector` (either may be absent). Which fields a
    /// kind lets clients select on is the server's business: check [`Filter::fields`].
    pub fn parse(
        label_selector: Option<&str>,
        field_selector: Option<&str>,
    ) -> Result<Self, String> {
        let labels = match label_selector {
            Some(s) => parse_labels(s)?,
            None => Vec::new(),
        };
        let fields = match field_selector {
            Some(s) => parse_fields(s)?,
            None => Vec::new(),
        };
        Ok(Self { labels, fields })
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    pub fn matches<T: Selectable + ?Sized>(&self, obj: &T) -> bool {
        for req in &self.labels {
            let ok = match req {
                LabelReq::Eq(k, v) => obj.label(k) == Some(v.as_str()),
                LabelReq::NotEq(k, v) => obj.label(k) != Some(v.as_str()),
                LabelReq::In(k, vs) => obj.label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
                LabelReq::NotIn(k, vs) => !obj.label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
                LabelReq::Exists(k) => obj.label(k).is_some(),
                LabelReq::NotExists(k) => obj.label(k).is_none(),
            };
            if !ok {
                return false;
            }
        }
        for f in &self.fields {
            if (obj.field(&f.path) == f.value.as_str()) != f.equal {
                return false;
            }
        }
        true
    }

    /// An exact `field=value` requirement usable to index watchers.
    pub fn exact_field(&self, path: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|f| f.equal && f.path == path)
            .map(|f| f.value.as_str())
    }
}

/// What selectors look at: labels and selectable fields.
pub trait Selectable {
    fn label(&self, key: &str) -> Option<&str>;
    fn field(&self, path: &str) -> Cow<'_, str>;
}

impl Selectable for Value {
    fn label(&self, key: &str) -> Option<&str> {
        self["metadata"]["labels"].get(key).and_then(Value::as_str)
    }

    fn field(&self, path: &str) -> Cow<'_, str> {
        Cow::Owned(field_value(self, path))
    }
}

/// The string form of a selectable field, as the real field sets render them.
pub fn field_value(obj: &Value, path: &str) -> String {
    // Events expose `source` as the reporting component.
    let path = if path == "source" {
        "source.component"
    } else {
        path
    };
    let mut cur = obj;
    for part in path.split('.') {
        cur = match cur.get(part) {
            Some(v) => v,
            None => return String::new(),
        };
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn split_top_level(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => parts.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    parts.push(cur);
    parts
}

fn valid_label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix
        && (p.is_empty()
            || p.len() > 253
            || !p
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'))
    {
        return false;
    }
    valid_label_value(name) && !name.is_empty()
}

fn valid_label_value(v: &str) -> bool {
    if v.is_empty() {
        return true;
    }
    let bytes = v.as_bytes();
    v.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

pub fn parse_labels(s: &str) -> Result<Vec<LabelReq>, String> {
    let mut out = Vec::new();
    if s.trim().is_empty() {
        return Ok(out);
    }
    for raw in split_top_level(s) {
        let part = raw.trim();
        if part.is_empty() {
            return Err(format!(
                "unable to parse requirement: found '', expected: identifier in {s:?}"
            ));
        }
        let req = parse_label_req(part)?;
        out.push(req);
    }
    Ok(out)
}

fn parse_label_req(part: &str) -> Result<LabelReq, String> {
    let check_key = |k: &str| -> Result<String, String> {
        let k = k.trim();
        if valid_label_key(k) {
            Ok(k.to_string())
        } else {
            Err(format!(
                "unable to parse requirement: invalid label key {k:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
            ))
        }
    };
    let check_val = |v: &str| -> Result<String, String> {
        let v = v.trim();
        if valid_label_value(v) {
            Ok(v.to_string())
        } else {
            Err(format!(
                "unable to parse requirement: invalid label value: {v:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
            ))
        }
    };
    if let Some(rest) = part.strip_prefix('!') {
        return Ok(LabelReq::NotExists(check_key(rest)?));
    }
    if let Some((k, v)) = part.split_once("!=") {
        return Ok(LabelReq::NotEq(check_key(k)?, check_val(v)?));
    }
    if let Some((k, v)) = part.split_once("==") {
        return Ok(LabelReq::Eq(check_key(k)?, check_val(v)?));
    }
    if let Some((k, v)) = part.split_once('=') {
        return Ok(LabelReq::Eq(check_key(k)?, check_val(v)?));
    }
    for (word, notin) in [(" notin ", true), (" in ", false)] {
        if let Some(idx) = part.find(word) {
            let key = check_key(&part[..idx])?;
            let set = part[idx + word.len()..].trim();
            let inner = set
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| {
                    format!("unable to parse requirement: found {set:?}, expected: '('")
                })?;
            let values = inner
                .split(',')
                .map(check_val)
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(if notin {
                LabelReq::NotIn(key, values)
            } else {
                LabelReq::In(key, values)
            });
        }
    }
    Ok(LabelReq::Exists(check_key(part)?))
}

/// Splits on unescaped `sep`, keeping escapes for the next step.
fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push('\\');
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    if escaped {
        cur.push('\\');
    }
    parts.push(cur);
    parts
}

fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=' | '!')) => out.push(e),
                Some(e) => {
                    return Err(format!(
                        "invalid field selector: invalid escape sequence \\{e}"
                    ));
                }
                None => return Err("invalid field selector: trailing backslash".into()),
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

pub fn parse_fields(s: &str) -> Result<Vec<FieldReq>, String> {
    let mut out = Vec::new();
    if s.trim().is_empty() {
        return Ok(out);
    }
    for part in split_unescaped(s, ',') {
        if part.is_empty() {
            continue;
        }
        // Find the first unescaped operator.
        let bytes = part.as_bytes();
        let mut i = 0;
        let mut found = None;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' => i += 2,
                b'!' if bytes.get(i + 1) == Some(&b'=') => {
                    found = Some((i, 2, false));
                    break;
                }
                b'=' if bytes.get(i + 1) == Some(&b'=') => {
                    found = Some((i, 2, true));
                    break;
                }
                b'=' => {
                    found = Some((i, 1, true));
                    break;
                }
                _ => i += 1,
            }
        }
        let Some((idx, len, equal)) = found else {
            return Err(format!(
                "invalid selector: '{s}'; can't understand '{part}'"
            ));
        };
        out.push(FieldReq {
            path: unescape(part[..idx].trim())?,
            equal,
            value: unescape(&part[idx + len..])?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_operators_match_like_kubernetes() {
        let obj = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        let cases = [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web,db)", true),
            ("app notin (web,db)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("missing!=x", true),
            ("app=web,tier=back", false),
            ("app in (db), tier", false),
        ];
        for (sel, want) in cases {
            let f = Filter {
                labels: parse_labels(sel).unwrap(),
                fields: vec![],
            };
            assert_eq!(f.matches(&obj), want, "{sel}");
        }
    }

    #[test]
    fn malformed_label_selectors_are_rejected() {
        assert!(parse_labels("a in b").is_err());
        assert!(parse_labels("-bad-=x").is_err());
        assert!(parse_labels("a=b,,c").is_err());
    }

    #[test]
    fn field_selectors_support_escapes_and_inequality() {
        let f = parse_fields(r"spec.nodeName=a\,b,status.phase!=Failed").unwrap();
        assert_eq!(f[0].value, "a,b");
        assert!(!f[1].equal);
        let obj = json!({"spec": {"nodeName": "a,b"}, "status": {"phase": "Running"}});
        assert!(
            Filter {
                labels: vec![],
                fields: f
            }
            .matches(&obj)
        );
    }
}
