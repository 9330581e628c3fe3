//! Loading KubeEdge-layout YAML config files, for both binaries: the file is laid over the
//! defaults (an absent key, or an explicit `null`, keeps its default, as Go's loader leaves it),
//! unknown keys are ignored (a real KubeEdge file loads), a value of the wrong type is reported
//! with its dotted path, and validation reports every invalid value at once.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: not valid YAML: {detail}")]
    Syntax { file: String, detail: String },
    #[error("{file}: {path}: {detail}")]
    Field {
        file: String,
        path: String,
        detail: String,
    },
    #[error("{file}: invalid configuration:\n{errors}")]
    Invalid { file: String, errors: InvalidConfig },
}

impl ConfigError {
    /// One invalid value, found outside a file (e.g. in a value built in code).
    pub fn invalid(path: &str, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            file: "configuration".into(),
            errors: InvalidConfig(vec![FieldError {
                path: path.to_string(),
                reason: reason.into(),
            }]),
        }
    }
}

/// One invalid value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path, e.g. `modules.edgeHub.heartbeat`.
    pub path: String,
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

/// Every invalid value a validation found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InvalidConfig(pub Vec<FieldError>);

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for InvalidConfig {}

/// Collects invalid values during a validation.
#[derive(Debug, Default)]
pub struct Problems(Vec<FieldError>);

impl Problems {
    pub fn bad(&mut self, path: &str, reason: impl Into<String>) {
        self.0.push(FieldError {
            path: path.to_string(),
            reason: reason.into(),
        });
    }

    /// `value` must be > 0.
    pub fn positive(&mut self, path: &str, value: impl Into<i64>) {
        let value = value.into();
        if value <= 0 {
            self.bad(path, format!("must be > 0, got {value}"));
        }
    }

    /// `value` must not be negative.
    pub fn non_negative(&mut self, path: &str, value: impl Into<i64>) {
        let value = value.into();
        if value < 0 {
            self.bad(path, format!("must not be negative, got {value}"));
        }
    }

    /// `value` must be at most `max`.
    pub fn at_most(&mut self, path: &str, value: u64, max: u64) {
        if value > max {
            self.bad(path, format!("must be at most {max}, got {value}"));
        }
    }

    pub fn into_result(self) -> Result<(), InvalidConfig> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(InvalidConfig(self.0))
        }
    }
}

/// Parses YAML into `T` laid over `T`'s defaults (`#[serde(default)]`): `null`s are dropped
/// first, so they keep their defaults; the top level must be a mapping (an empty file gives
/// the defaults); a field of the wrong type is reported with its dotted path, e.g.
/// `modules.cloudHub.nodeLimit`.
pub fn from_yaml_str<T: DeserializeOwned>(text: &str, file: &str) -> Result<T, ConfigError> {
    let mut value: serde_json::Value =
        serde_saphyr::from_str(text).map_err(|e| ConfigError::Syntax {
            file: file.to_string(),
            detail: e.to_string(),
        })?;
    if value.is_null() {
        value = serde_json::Value::Object(Default::default());
    }
    strip_nulls(&mut value);
    if !value.is_object() {
        return Err(ConfigError::Syntax {
            file: file.to_string(),
            detail: "the top level must be a mapping (apiVersion, kind, modules, …)".into(),
        });
    }
    serde_path_to_error::deserialize(value).map_err(|e| ConfigError::Field {
        file: file.to_string(),
        path: e.path().to_string(),
        detail: e.inner().to_string(),
    })
}

/// Reads and parses `path` ([`from_yaml_str`]).
pub fn load_yaml<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.display().to_string(),
        source,
    })?;
    from_yaml_str(&text, &path.display().to_string())
}

/// [`load_yaml`], then `validate` (every invalid value at once).
pub fn load_validated<T: DeserializeOwned>(
    path: &Path,
    validate: impl FnOnce(&T) -> Result<(), InvalidConfig>,
) -> Result<T, ConfigError> {
    let config = load_yaml(path)?;
    validate(&config).map_err(|errors| ConfigError::Invalid {
        file: path.display().to_string(),
        errors,
    })?;
    Ok(config)
}

pub fn to_yaml<T: Serialize>(value: &T) -> String {
    serde_saphyr::to_string(value).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
}

/// Removes `null` map entries everywhere, so that they take their defaults.
fn strip_nulls(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            map.retain(|_, x| !x.is_null());
            map.values_mut().for_each(strip_nulls);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, Serialize, Default, PartialEq)]
    #[serde(rename_all = "camelCase", default)]
    struct Inner {
        node_limit: u32,
    }

    #[derive(Debug, Deserialize, Serialize, Default, PartialEq)]
    #[serde(rename_all = "camelCase", default)]
    struct Outer {
        cloud_hub: Inner,
    }

    #[test]
    fn wrong_type_names_the_field() {
        let err = from_yaml_str::<Outer>("cloudHub:\n  nodeLimit: lots\n", "c.yaml").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("cloudHub.nodeLimit"), "{text}");
    }

    #[test]
    fn empty_file_gives_defaults_and_unknown_fields_are_ignored() {
        assert_eq!(from_yaml_str::<Outer>("", "c").unwrap(), Outer::default());
        let o: Outer =
            from_yaml_str("cloudHub:\n  nodeLimit: 3\n  extra: 1\nother: x\n", "c").unwrap();
        assert_eq!(o.cloud_hub.node_limit, 3);
        let back: Outer = from_yaml_str(&to_yaml(&o), "c").unwrap();
        assert_eq!(back, o);
    }

    #[test]
    fn nulls_keep_defaults_and_problems_are_all_reported() {
        #[derive(Debug, Deserialize, Serialize, PartialEq)]
        #[serde(rename_all = "camelCase", default)]
        struct WithDefault {
            node_limit: u32,
        }
        impl Default for WithDefault {
            fn default() -> Self {
                WithDefault { node_limit: 1000 }
            }
        }
        let o: WithDefault = from_yaml_str("nodeLimit: null\n", "c").unwrap();
        assert_eq!(o.node_limit, 1000);
        assert!(matches!(
            from_yaml_str::<WithDefault>("- a\n", "c"),
            Err(ConfigError::Syntax { .. })
        ));
        let mut p = Problems::default();
        p.positive("a", 0);
        p.non_negative("b", -1);
        p.at_most("c", 5, 4);
        p.non_negative("d", 0);
        let e = p.into_result().unwrap_err();
        assert_eq!(e.0.len(), 3);
        assert_eq!(
            e.to_string(),
            "a: must be > 0, got 0\nb: must not be negative, got -1\nc: must be at most 4, got 5"
        );
    }

    #[test]
    fn broken_yaml_is_a_syntax_error() {
        assert!(matches!(
            from_yaml_str::<Outer>("cloudHub: [\n", "c"),
            Err(ConfigError::Syntax { .. })
        ));
    }
}
