//! URL query parameters (`application/x-www-form-urlencoded`), decoded without panicking on
//! malformed escapes.

use std::collections::HashMap;

use super::status::ApiError;

#[derive(Debug, Default, Clone)]
pub struct Query {
    params: HashMap<String, String>,
}

pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Decodes a path segment (no `+` → space rule in paths).
pub fn percent_decode_path(s: &str) -> String {
    percent_decode(&s.replace('+', "%2B"))
}

impl Query {
    pub fn parse(raw: Option<&str>) -> Self {
        let mut params = HashMap::new();
        for pair in raw.unwrap_or_default().split('&') {
            if pair.is_empty() {
                continue;
            }
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            params.insert(percent_decode(k), percent_decode(v));
        }
        Self { params }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.params.get(key).map(String::as_str)
    }

    /// A non-empty value.
    pub fn non_empty(&self, key: &str) -> Option<&str> {
        self.get(key).filter(|v| !v.is_empty())
    }

    pub fn bool(&self, key: &str) -> Result<bool, ApiError> {
        match self.get(key) {
            None | Some("") => Ok(false),
            Some("true") | Some("1") | Some("True") => Ok(true),
            Some("false") | Some("0") | Some("False") => Ok(false),
            Some(other) => Err(ApiError::bad_request(format!(
                "invalid boolean value for {key}: {other:?}"
            ))),
        }
    }

    pub fn int(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.non_empty(key) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                ApiError::bad_request(format!("invalid integer value for {key}: {v:?}"))
            }),
        }
    }

    /// `resourceVersion` as a number; `None` when unset or empty; "0" is kept as 0.
    pub fn resource_version(&self) -> Result<Option<u64>, ApiError> {
        match self.non_empty("resourceVersion") {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {v:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_selectors_and_tolerates_bad_escapes() {
        let q = Query::parse(Some("labelSelector=app%3Dweb%2Ctier+in+(a)&x=%zz&y=%4"));
        assert_eq!(q.get("labelSelector"), Some("app=web,tier in (a)"));
        assert_eq!(q.get("x"), Some("%zz"));
        assert_eq!(q.get("y"), Some("%4"));
    }
}
