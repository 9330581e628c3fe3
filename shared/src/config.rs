//! Loading KubeEdge-layout YAML config files with errors that name the field.

use serde::Serialize;
use serde::de::DeserializeOwned;
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
    #[error("invalid configuration: {path}: {reason}")]
    Invalid { path: String, reason: String },
}

impl ConfigError {
    pub fn invalid(path: &str, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            path: path.to_string(),
            reason: reason.into(),
        }
    }
}

/// Parses YAML into `T`. Unknown fields are ignored (as KubeEdge's loader does); a field of
/// the wrong type is reported with its dotted path, e.g. `modules.cloudHub.nodeLimit`.
pub fn from_yaml_str<T: DeserializeOwned>(text: &str, file: &str) -> Result<T, ConfigError> {
    let value: serde_json::Value =
        serde_saphyr::from_str(text).map_err(|e| ConfigError::Syntax {
            file: file.to_string(),
            detail: e.to_string(),
        })?;
    let value = match value {
        serde_json::Value::Null => serde_json::Value::Object(Default::default()),
        v => v,
    };
    serde_path_to_error::deserialize(value).map_err(|e| ConfigError::Field {
        file: file.to_string(),
        path: e.path().to_string(),
        detail: e.inner().to_string(),
    })
}

pub fn load_yaml<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.display().to_string(),
        source,
    })?;
    from_yaml_str(&text, &path.display().to_string())
}

pub fn to_yaml<T: Serialize>(value: &T) -> String {
    serde_saphyr::to_string(value).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
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
    fn broken_yaml_is_a_syntax_error() {
        assert!(matches!(
            from_yaml_str::<Outer>("cloudHub: [\n", "c"),
            Err(ConfigError::Syntax { .. })
        ));
    }
}
