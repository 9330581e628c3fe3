//! `google.protobuf.Any` values of `CustomizedValue.data` (`configData`).
//!
//! edgecore builds them from JSON, where every number is a float64: a string becomes a
//! `StringValue`, any number a `FloatValue` (float32: integers above 2^24 lose precision), a
//! boolean a `BoolValue`; objects, arrays and null fail.

use prost::Message;
use prost_types::Any;
use serde_json::Value;

/// The `type_url`s of the wrapper types this module reads and writes.
pub mod type_url {
    pub const STRING: &str = "type.googleapis.com/google.protobuf.StringValue";
    pub const FLOAT: &str = "type.googleapis.com/google.protobuf.FloatValue";
    pub const BOOL: &str = "type.googleapis.com/google.protobuf.BoolValue";
    /// Read only: Go mappers may send them, edgecore never does.
    pub const DOUBLE: &str = "type.googleapis.com/google.protobuf.DoubleValue";
    pub const INT32: &str = "type.googleapis.com/google.protobuf.Int32Value";
    pub const INT64: &str = "type.googleapis.com/google.protobuf.Int64Value";
    pub const UINT32: &str = "type.googleapis.com/google.protobuf.UInt32Value";
    pub const UINT64: &str = "type.googleapis.com/google.protobuf.UInt64Value";
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AnyError {
    #[error("a {0} value cannot be carried in configData (only strings, numbers and booleans)")]
    Unsupported(&'static str),
    #[error("unsupported Any type {0:?}")]
    UnknownType(String),
    #[error("malformed {type_url} payload: {reason}")]
    Malformed { type_url: String, reason: String },
}

/// A configData value as edgecore encodes it.
pub fn any_from_json(value: &Value) -> Result<Any, AnyError> {
    let (type_url, value) = match value {
        Value::String(s) => (type_url::STRING, s.encode_to_vec()),
        // A JSON number is a float64 in Go; edgecore narrows it to float32.
        Value::Number(n) => match n.as_f64() {
            Some(f) => (type_url::FLOAT, (f as f32).encode_to_vec()),
            None => return Err(AnyError::Unsupported("non-finite number")),
        },
        Value::Bool(b) => (type_url::BOOL, b.encode_to_vec()),
        Value::Null => return Err(AnyError::Unsupported("null")),
        Value::Array(_) => return Err(AnyError::Unsupported("array")),
        Value::Object(_) => return Err(AnyError::Unsupported("object")),
    };
    Ok(Any {
        type_url: type_url.to_string(),
        value,
    })
}

/// The JSON value of a configData `Any`. Integral numbers come back as JSON integers (so
/// `2` round-trips to `2`, not `2.0`); other numbers as floats.
pub fn json_from_any(any: &Any) -> Result<Value, AnyError> {
    fn decode<M: Message + Default>(any: &Any) -> Result<M, AnyError> {
        M::decode(any.value.as_slice()).map_err(|e| AnyError::Malformed {
            type_url: any.type_url.clone(),
            reason: e.to_string(),
        })
    }
    Ok(match any.type_url.as_str() {
        type_url::STRING => Value::String(decode::<String>(any)?),
        type_url::BOOL => Value::Bool(decode::<bool>(any)?),
        type_url::FLOAT => number(f64::from(decode::<f32>(any)?)),
        type_url::DOUBLE => number(decode::<f64>(any)?),
        type_url::INT32 => Value::from(decode::<i32>(any)?),
        type_url::INT64 => Value::from(decode::<i64>(any)?),
        type_url::UINT32 => Value::from(decode::<u32>(any)?),
        type_url::UINT64 => Value::from(decode::<u64>(any)?),
        other => return Err(AnyError::UnknownType(other.to_string())),
    })
}

fn number(f: f64) -> Value {
    // 2^53: integers up to here are exact in f64.
    if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 {
        Value::from(f as i64)
    } else {
        serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_numbers_and_booleans_use_the_wrappers_edgecore_uses() {
        let s = any_from_json(&json!("/dev/ttyS0")).unwrap();
        assert_eq!(s.type_url, type_url::STRING);
        // field 1, length-delimited, 10 bytes
        assert_eq!(s.value, b"\x0a\x0a/dev/ttyS0");

        let n = any_from_json(&json!(9600)).unwrap();
        assert_eq!(n.type_url, type_url::FLOAT);
        // field 1, fixed32, 9600.0f32 little-endian
        let mut expected = vec![0x0d];
        expected.extend_from_slice(&9600f32.to_le_bytes());
        assert_eq!(n.value, expected);

        let b = any_from_json(&json!(true)).unwrap();
        assert_eq!(b.type_url, type_url::BOOL);
        assert_eq!(b.value, [0x08, 0x01]);
    }

    #[test]
    fn numbers_are_narrowed_to_float32() {
        let any = any_from_json(&json!(16_777_217)).unwrap();
        assert_eq!(json_from_any(&any).unwrap(), json!(16_777_216));
        let any = any_from_json(&json!(0.1)).unwrap();
        assert_eq!(json_from_any(&any).unwrap(), json!(f64::from(0.1f32)));
    }

    #[test]
    fn scalar_values_round_trip() {
        for value in [
            json!("HoldingRegister"),
            json!(""),
            json!(2),
            json!(-7),
            json!(1.5),
            json!(false),
        ] {
            let any = any_from_json(&value).unwrap();
            assert_eq!(json_from_any(&any).unwrap(), value);
        }
    }

    #[test]
    fn objects_arrays_and_null_are_rejected() {
        assert_eq!(
            any_from_json(&json!(null)),
            Err(AnyError::Unsupported("null"))
        );
        assert_eq!(
            any_from_json(&json!([1])),
            Err(AnyError::Unsupported("array"))
        );
        assert_eq!(
            any_from_json(&json!({"a": 1})),
            Err(AnyError::Unsupported("object"))
        );
    }

    #[test]
    fn other_wrapper_types_are_read() {
        let any = Any {
            type_url: type_url::INT64.into(),
            value: 5i64.encode_to_vec(),
        };
        assert_eq!(json_from_any(&any).unwrap(), json!(5));
        let any = Any {
            type_url: "type.googleapis.com/google.protobuf.Struct".into(),
            value: vec![],
        };
        assert!(matches!(json_from_any(&any), Err(AnyError::UnknownType(_))));
        let any = Any {
            type_url: type_url::STRING.into(),
            value: vec![0x0a, 0x05, b'a'],
        };
        assert!(matches!(
            json_from_any(&any),
            Err(AnyError::Malformed { .. })
        ));
    }
}
