//! Label and field selectors, parsed once per request and matched against stored objects (the
//! parsing and matching live in `kubeedge_shared::selectors`; here: which fields a kind accepts).

use std::borrow::Cow;

pub use kubeedge_shared::selectors::{
    FieldReq, Filter, LabelReq, Selectable, field_value, parse_fields, parse_labels,
};

use super::resources::ResourceInfo;
use super::status::ApiError;

/// Parses the selectors of a request for `info`'s kind, refusing fields it cannot select on.
pub fn parse_filter(
    info: &ResourceInfo,
    label_selector: Option<&str>,
    field_selector: Option<&str>,
) -> Result<Filter, ApiError> {
    let filter = Filter::parse(label_selector, field_selector).map_err(ApiError::bad_request)?;
    for f in &filter.fields {
        let supported = f.path == "metadata.name"
            || f.path == "metadata.namespace"
            || info.selectable_fields.contains(&f.path);
        if !supported {
            return Err(ApiError::bad_request(format!(
                "field label not supported: {}",
                f.path
            )));
        }
    }
    Ok(filter)
}

impl Selectable for super::store::Obj {
    fn label(&self, key: &str) -> Option<&str> {
        super::store::Obj::label(self, key)
    }

    fn field(&self, path: &str) -> Cow<'_, str> {
        super::store::Obj::field(self, path)
    }
}
