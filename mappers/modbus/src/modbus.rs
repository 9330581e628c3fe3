//! Register I/O over a tokio-modbus client context, and the text form of register values.
//!
//! Reported values (the edge accepts `^[a-zA-Z0-9-_.,:/@#]{1,512}$`):
//! - coils and discrete inputs: `true` / `false`; with `limit` > 1 comma-separated;
//! - registers: unsigned decimal. `limit` 1 is one 16-bit word, 2 a 32-bit and 4 a 64-bit
//!   value (first register = most significant word); any other limit gives each word,
//!   comma-separated. With `scale` the value is multiplied by it (`21.5`).
//!
//! Desired values are written in the same forms: `true`/`false` (also `1`/`0`, `on`/`off`) for
//! coils; a number for registers (divided by `scale`, rounded; a negative number fits one
//! register as two's complement, -32768..=-1).
//!
//! edgecore rejects twin values over 512 characters: a read giving a longer value (more than 85
//! coils, or many scaled registers) is a property error, logged and not reported.

use std::time::Duration;

use tokio_modbus::client::{Client as _, Context, Writer as _};
use tokio_modbus::{Request, Response};

/// edgecore rejects longer twin values.
pub const MAX_VALUE_LEN: usize = 512;

/// Bounds one request: a device that stops answering counts as disconnected.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterKind {
    Coil,
    DiscreteInput,
    Holding,
    Input,
}

impl std::str::FromStr for RegisterKind {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "CoilRegister" => Ok(Self::Coil),
            "DiscreteInputRegister" => Ok(Self::DiscreteInput),
            "HoldingRegister" => Ok(Self::Holding),
            "InputRegister" => Ok(Self::Input),
            _ => Err(()),
        }
    }
}

impl RegisterKind {
    pub fn is_writable(self) -> bool {
        matches!(self, Self::Coil | Self::Holding)
    }

    pub fn is_bits(self) -> bool {
        matches!(self, Self::Coil | Self::DiscreteInput)
    }

    /// The most items one Modbus read request may ask for.
    pub fn max_limit(self) -> u16 {
        if self.is_bits() { 2000 } else { 125 }
    }
}

/// Where a property lives on the device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Visitor {
    pub kind: RegisterKind,
    pub offset: u16,
    pub limit: u16,
    pub scale: Option<f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// The connection is broken or the device does not answer: reconnect.
    #[error("connection: {0}")]
    Connection(String),
    /// The device answered with a Modbus exception (e.g. illegal data address).
    #[error("device answered {0}")]
    Exception(tokio_modbus::ExceptionCode),
    /// The device's answer does not fit the request (another count of registers).
    #[error("device answered {0}")]
    Answer(String),
    #[error("{0}")]
    Value(#[from] ValueError),
}

impl IoError {
    pub fn is_connection(&self) -> bool {
        matches!(self, Self::Connection(_))
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ValueError {
    #[error("{0:?} is not a boolean (true/false, 1/0, on/off)")]
    NotBool(String),
    #[error("{0:?} is not a number")]
    NotNumber(String),
    #[error("{value} does not fit {limit} register(s)")]
    OutOfRange { value: f64, limit: u16 },
    #[error("{given} values given for {limit} items")]
    WrongCount { given: usize, limit: u16 },
    #[error("{0:?} registers cannot be written")]
    ReadOnly(RegisterKind),
    #[error("the value is {0} characters long; edgecore accepts at most 512 (lower the limit)")]
    TooLong(usize),
}

/// Reads the property's registers and returns the value in its reported form. A device that
/// answers with another number of registers or coils than asked is a property error.
pub async fn read(ctx: &mut Context, v: &Visitor) -> Result<String, IoError> {
    let (addr, cnt) = (v.offset, v.limit);
    let request = match v.kind {
        RegisterKind::Coil => Request::ReadCoils(addr, cnt),
        RegisterKind::DiscreteInput => Request::ReadDiscreteInputs(addr, cnt),
        RegisterKind::Holding => Request::ReadHoldingRegisters(addr, cnt),
        RegisterKind::Input => Request::ReadInputRegisters(addr, cnt),
    };
    // `Client::call`, not the `Reader` methods: those only debug-assert the count (a device
    // answering two registers for six panicked the mapper's debug build, found by fuzzing).
    let value = match flatten(ctx.call(request)).await? {
        Response::ReadCoils(mut bits) | Response::ReadDiscreteInputs(mut bits)
            if bits.len() >= usize::from(cnt) =>
        {
            // Coils come in whole bytes: the padding bits are not the device's.
            bits.truncate(usize::from(cnt));
            format_bits(&bits)
        }
        Response::ReadHoldingRegisters(words) | Response::ReadInputRegisters(words)
            if words.len() == usize::from(cnt) =>
        {
            format_words(&words, v.scale)
        }
        other => return Err(IoError::Answer(format!("{other:?} for {cnt} items"))),
    };
    if value.len() > MAX_VALUE_LEN {
        return Err(ValueError::TooLong(value.len()).into());
    }
    Ok(value)
}

/// Writes a desired value (in its reported form) to the property's registers.
pub async fn write(ctx: &mut Context, v: &Visitor, value: &str) -> Result<(), IoError> {
    match v.kind {
        RegisterKind::Coil => {
            let bits = parse_bits(value, v.limit)?;
            match bits.as_slice() {
                [one] => flatten(ctx.write_single_coil(v.offset, *one)).await,
                many => flatten(ctx.write_multiple_coils(v.offset, many)).await,
            }
        }
        RegisterKind::Holding => {
            let words = parse_words(value, v.limit, v.scale)?;
            match words.as_slice() {
                [one] => flatten(ctx.write_single_register(v.offset, *one)).await,
                many => flatten(ctx.write_multiple_registers(v.offset, many)).await,
            }
        }
        kind => Err(ValueError::ReadOnly(kind).into()),
    }
}

async fn flatten<T>(request: impl Future<Output = tokio_modbus::Result<T>>) -> Result<T, IoError> {
    match tokio::time::timeout(IO_TIMEOUT, request).await {
        Err(_) => Err(IoError::Connection(format!(
            "no answer within {IO_TIMEOUT:?}"
        ))),
        Ok(Err(e)) => Err(IoError::Connection(e.to_string())),
        Ok(Ok(Err(code))) => Err(IoError::Exception(code)),
        Ok(Ok(Ok(value))) => Ok(value),
    }
}

pub fn format_bits(bits: &[bool]) -> String {
    join(bits.iter().map(|b| b.to_string()))
}

pub fn format_words(words: &[u16], scale: Option<f64>) -> String {
    let combined = match words {
        [w] => Some(u64::from(*w)),
        [hi, lo] => Some(u64::from(*hi) << 16 | u64::from(*lo)),
        [a, b, c, d] => {
            Some(u64::from(*a) << 48 | u64::from(*b) << 32 | u64::from(*c) << 16 | u64::from(*d))
        }
        _ => None,
    };
    match combined {
        Some(raw) => scaled(raw, scale),
        None => join(words.iter().map(|w| scaled(u64::from(*w), scale))),
    }
}

fn scaled(raw: u64, scale: Option<f64>) -> String {
    match scale {
        None => raw.to_string(),
        Some(scale) => format_number(raw as f64 * scale),
    }
}

/// Integral values without a fraction (`20`, not `20.0`); Rust never uses exponents here.
fn format_number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 9.0e15 {
        (value as i64).to_string()
    } else {
        value.to_string()
    }
}

fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(",")
}

pub fn parse_bits(value: &str, limit: u16) -> Result<Vec<bool>, ValueError> {
    let bits = value
        .split(',')
        .map(|item| match item.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "on" => Ok(true),
            "false" | "0" | "off" => Ok(false),
            _ => Err(ValueError::NotBool(item.to_string())),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if bits.len() != usize::from(limit) {
        return Err(ValueError::WrongCount {
            given: bits.len(),
            limit,
        });
    }
    Ok(bits)
}

pub fn parse_words(value: &str, limit: u16, scale: Option<f64>) -> Result<Vec<u16>, ValueError> {
    let raw = |item: &str| -> Result<f64, ValueError> {
        let number: f64 = item
            .trim()
            .parse()
            .map_err(|_| ValueError::NotNumber(item.to_string()))?;
        if !number.is_finite() {
            return Err(ValueError::NotNumber(item.to_string()));
        }
        Ok((number / scale.unwrap_or(1.0)).round())
    };
    let out_of_range = |value| ValueError::OutOfRange { value, limit };
    match limit {
        1 => {
            let n = raw(value)?;
            if (-32768.0..=65535.0).contains(&n) {
                // Negative values as two's complement in one word.
                Ok(vec![(n as i32) as u16])
            } else {
                Err(out_of_range(n))
            }
        }
        2 | 4 => {
            let n = raw(value)?;
            let max = if limit == 2 {
                f64::from(u32::MAX)
            } else {
                u64::MAX as f64
            };
            if !(0.0..=max).contains(&n) {
                return Err(out_of_range(n));
            }
            let n = n as u64;
            Ok((0..limit).rev().map(|i| (n >> (16 * i)) as u16).collect())
        }
        _ => {
            let words = value
                .split(',')
                .map(|item| {
                    let n = raw(item)?;
                    if (0.0..=65535.0).contains(&n) {
                        Ok(n as u16)
                    } else {
                        Err(out_of_range(n))
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            if words.len() != usize::from(limit) {
                return Err(ValueError::WrongCount {
                    given: words.len(),
                    limit,
                });
            }
            Ok(words)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_combine_big_endian_and_scale() {
        assert_eq!(format_words(&[1234], None), "1234");
        assert_eq!(format_words(&[215], Some(0.1)), "21.5");
        assert_eq!(format_words(&[40], Some(0.5)), "20");
        assert_eq!(format_words(&[0x0001, 0x0002], None), "65538");
        assert_eq!(format_words(&[0, 0, 0x0001, 0], None), "65536");
        assert_eq!(format_words(&[1, 2, 3], None), "1,2,3");
        assert_eq!(format_words(&[10, 20, 30], Some(2.0)), "20,40,60");
    }

    #[test]
    fn bits_are_true_or_false() {
        assert_eq!(format_bits(&[true]), "true");
        assert_eq!(format_bits(&[true, false]), "true,false");
    }

    #[test]
    fn reported_values_satisfy_the_edge_value_pattern() {
        let allowed = |s: &str| {
            !s.is_empty()
                && s.len() <= MAX_VALUE_LEN
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.,:/@#".contains(c))
        };
        for s in [
            format_words(&[u16::MAX; 4], Some(1e-3)),
            format_words(&[u16::MAX; 60], Some(0.001)),
            format_words(&[7], Some(1e20)),
            format_bits(&[false; 85]),
        ] {
            assert!(allowed(&s), "{s}");
        }
    }

    #[test]
    fn desired_values_parse_back_to_raw_registers() {
        assert_eq!(parse_words("77", 1, None), Ok(vec![77]));
        assert_eq!(parse_words("21.5", 1, Some(0.1)), Ok(vec![215]));
        assert_eq!(parse_words("-1", 1, None), Ok(vec![0xffff]));
        assert_eq!(parse_words("65538", 2, None), Ok(vec![1, 2]));
        assert_eq!(parse_words("65536", 4, None), Ok(vec![0, 0, 1, 0]));
        assert_eq!(parse_words("1,2,3", 3, None), Ok(vec![1, 2, 3]));
        assert_eq!(
            parse_words("70000", 1, None),
            Err(ValueError::OutOfRange {
                value: 70000.0,
                limit: 1
            })
        );
        assert_eq!(
            parse_words("warm", 1, None),
            Err(ValueError::NotNumber("warm".into()))
        );
        assert_eq!(
            parse_words("1,2", 3, None),
            Err(ValueError::WrongCount { given: 2, limit: 3 })
        );
        assert_eq!(parse_bits("ON", 1), Ok(vec![true]));
        assert_eq!(parse_bits("0,true", 2), Ok(vec![false, true]));
        assert_eq!(
            parse_bits("maybe", 1),
            Err(ValueError::NotBool("maybe".into()))
        );
    }

    #[test]
    fn register_names_are_mapper_framework_names() {
        assert_eq!("CoilRegister".parse(), Ok(RegisterKind::Coil));
        assert_eq!(
            "DiscreteInputRegister".parse(),
            Ok(RegisterKind::DiscreteInput)
        );
        assert_eq!("HoldingRegister".parse(), Ok(RegisterKind::Holding));
        assert_eq!("InputRegister".parse(), Ok(RegisterKind::Input));
        assert_eq!("holdingregister".parse::<RegisterKind>(), Err(()));
    }
}
