//! Kubernetes name rules both binaries check.

/// Why `name` cannot be a Node name (a DNS-1123 subdomain: lower-case letters, digits, `-` and
/// `.`, at most 253 characters, every dot-separated label starting and ending with a letter or
/// digit), or `Ok`. A name that is not one could not be a Node and would corrupt resource
/// paths and certificate subjects.
pub fn validate_node_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty (it is the node name)".into());
    }
    if name.len() > 253 {
        return Err(format!(
            "must be at most 253 characters, got {}",
            name.len()
        ));
    }
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    let ok_labels = name.split('.').all(|label| {
        label.starts_with(|c: char| c.is_ascii_alphanumeric())
            && label.ends_with(|c: char| c.is_ascii_alphanumeric())
    });
    if !ok_chars || !ok_labels {
        return Err(format!(
            "{name:?} is not a valid node name (lower-case letters, digits, '-' and '.', each dot-separated part starting and ending with a letter or digit)"
        ));
    }
    Ok(())
}

/// Whether `name` is a valid Node name ([`validate_node_name`]).
pub fn valid_node_name(name: &str) -> bool {
    validate_node_name(name).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_follow_dns_subdomain_rules() {
        for ok in ["a", "edge-1", "edge.example.com", "0node9"] {
            assert!(valid_node_name(ok), "{ok}");
        }
        let long = "a".repeat(254);
        for bad in [
            "", "Edge", "-a", "a-", "a..b", ".a", "a.", "a_b", "a/b", "a b", &long,
        ] {
            assert!(!valid_node_name(bad), "{bad:?}");
        }
        assert!(validate_node_name("").unwrap_err().contains("empty"));
        assert!(validate_node_name(&long).unwrap_err().contains("253"));
    }
}
