//! Name, label and metadata validation with the real apiserver's messages.

use serde_json::Value;

use super::resources::{NameRule, ResourceInfo};
use super::status::Cause;

pub(crate) const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
pub(crate) const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && !s.is_empty() && s.split('.').all(is_dns1123_label)
}

pub fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

pub fn is_path_segment_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('%')
}

/// Problems with a name under a naming rule, as field causes.
pub fn name_causes(rule: NameRule, field: &str, name: &str) -> Vec<Cause> {
    let v = Value::String(name.to_string());
    match rule {
        NameRule::Subdomain if !is_dns1123_subdomain(name) => {
            let mut c = vec![Cause::invalid(field, &v, SUBDOMAIN_MSG)];
            if name.len() > 253 {
                c = vec![Cause::invalid(
                    field,
                    &v,
                    "must be no more than 253 characters",
                )];
            }
            c
        }
        NameRule::Label if !is_dns1123_label(name) => {
            if name.len() > 63 {
                vec![Cause::invalid(
                    field,
                    &v,
                    "must be no more than 63 characters",
                )]
            } else {
                vec![Cause::invalid(field, &v, LABEL_MSG)]
            }
        }
        NameRule::Dns1035 if !is_dns1035_label(name) => {
            vec![Cause::invalid(field, &v, DNS1035_MSG)]
        }
        NameRule::PathSegment if !is_path_segment_name(name) => vec![Cause::invalid(
            field,
            &v,
            "may not contain '/' or '%' and may not be '.' or '..'",
        )],
        _ => Vec::new(),
    }
}

fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_' || *c == b'.')
}

/// A label or annotation key: `[prefix/]name`.
pub fn is_qualified_name(k: &str) -> bool {
    match k.split_once('/') {
        Some((prefix, name)) => is_dns1123_subdomain(prefix) && is_qualified_name_part(name),
        None => is_qualified_name_part(k),
    }
}

pub fn is_label_value(v: &str) -> bool {
    v.is_empty() || is_qualified_name_part(v)
}

/// Generic ObjectMeta checks: name, labels, annotations, finalizers.
pub fn validate_meta(info: &ResourceInfo, obj: &Value) -> Vec<Cause> {
    let meta = &obj["metadata"];
    let mut causes = Vec::new();
    match meta["name"].as_str() {
        Some(n) if !n.is_empty() => causes.extend(name_causes(info.name_rule, "metadata.name", n)),
        _ => causes.push(Cause::required(
            "metadata.name",
            "name or generateName is required",
        )),
    }
    if let Some(labels) = meta["labels"].as_object() {
        for (k, v) in labels {
            if !is_qualified_name(k) {
                causes.push(Cause::invalid(
                    "metadata.labels",
                    &Value::String(k.clone()),
                    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                ));
            }
            match v.as_str() {
                Some(s) if is_label_value(s) => {}
                _ => causes.push(Cause::invalid(
                    "metadata.labels",
                    v,
                    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                )),
            }
        }
    } else if !meta["labels"].is_null() {
        causes.push(Cause::invalid(
            "metadata.labels",
            &meta["labels"],
            "must be a map of strings",
        ));
    }
    if let Some(ann) = meta["annotations"].as_object() {
        let mut total = 0usize;
        for (k, v) in ann {
            if !is_qualified_name(&k.to_lowercase()) {
                causes.push(Cause::invalid(
                    "metadata.annotations",
                    &Value::String(k.clone()),
                    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                ));
            }
            match v.as_str() {
                Some(s) => total += k.len() + s.len(),
                None => causes.push(Cause::invalid(
                    format!("metadata.annotations.{k}"),
                    v,
                    "must be a string",
                )),
            }
        }
        if total > 256 * 1024 {
            causes.push(Cause {
                reason: "FieldValueTooLong",
                field: "metadata.annotations".into(),
                message: "Too long: must have at most 262144 bytes".into(),
            });
        }
    } else if !meta["annotations"].is_null() {
        causes.push(Cause::invalid(
            "metadata.annotations",
            &meta["annotations"],
            "must be a map of strings",
        ));
    }
    if let Some(fins) = meta["finalizers"].as_array() {
        for (i, f) in fins.iter().enumerate() {
            match f.as_str() {
                Some(s) if is_qualified_name(s) => {}
                _ => causes.push(Cause::invalid(
                    format!("metadata.finalizers[{i}]"),
                    f,
                    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                )),
            }
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names_follow_rfc1123() {
        assert!(is_dns1123_subdomain("a.b-c.d"));
        assert!(!is_dns1123_subdomain("Bad_Name"));
        assert!(!is_dns1123_subdomain("-a"));
        assert!(is_dns1123_label("abc-1"));
        assert!(!is_dns1123_label("a.b"));
        assert!(!is_dns1035_label("1abc"));
        assert!(is_qualified_name("node-role.kubernetes.io/edge"));
        assert!(!is_qualified_name("a/b/c"));
    }
}
