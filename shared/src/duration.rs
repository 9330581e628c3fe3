//! Go durations as KubeEdge's configs write them (`metav1.Duration`): `10s`, `5m0s`, `1.5h`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::time::Duration;

/// A Go `metav1.Duration`: written as Go prints durations (`10s`, `5m0s`, `1h0m0s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KubeDuration(pub Duration);

impl KubeDuration {
    pub fn secs(s: u64) -> Self {
        KubeDuration(Duration::from_secs(s))
    }

    pub fn is_zero(&self) -> bool {
        self.0.is_zero()
    }
}

impl Serialize for KubeDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_go_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for KubeDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_go_duration(&s)
            .map(KubeDuration)
            .map_err(serde::de::Error::custom)
    }
}

/// Parses Go's `time.ParseDuration` syntax (`300ms`, `1.5h`, `2h45m`), non-negative only.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?} (expected e.g. \"10s\", \"5m0s\", \"1h\")");
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() || t.starts_with('-') {
        return Err(bad());
    }
    let mut rest = t.strip_prefix('+').unwrap_or(t);
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (num, tail) = rest.split_at(num_len);
        let value: f64 = num.parse().map_err(|_| bad())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * scale;
        rest = tail;
    }
    // Go's Duration is int64 nanoseconds: larger values are "invalid duration" there too.
    if !total.is_finite() || total > i64::MAX as f64 / 1e9 {
        return Err(bad());
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// Go's `Duration.String()` for the values configs use (whole milliseconds and up).
pub fn format_go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let h = ms / 3_600_000;
    let m = (ms / 60_000) % 60;
    let s = (ms % 60_000) as f64 / 1000.0;
    let secs = if s.fract() == 0.0 {
        format!("{}s", s as u64)
    } else {
        format!("{s}s")
    };
    if h > 0 {
        format!("{h}h{m}m{secs}")
    } else if m > 0 {
        format!("{m}m{secs}")
    } else {
        secs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_and_print() {
        for (text, secs) in [
            ("10s", 10.0),
            ("5m0s", 300.0),
            ("1h0m0s", 3600.0),
            ("1.5h", 5400.0),
            ("300ms", 0.3),
            ("0", 0.0),
            ("2h45m", 9900.0),
        ] {
            assert_eq!(
                parse_go_duration(text).unwrap().as_secs_f64(),
                secs,
                "{text}"
            );
        }
        for bad in ["", "10", "-1s", "1d", "s", "1..2s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(format_go_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(format_go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(format_go_duration(Duration::from_secs(3661)), "1h1m1s");
        assert_eq!(format_go_duration(Duration::from_millis(100)), "100ms");
        assert_eq!(format_go_duration(Duration::ZERO), "0s");
    }

    #[test]
    fn durations_beyond_go_int64_nanoseconds_are_errors_not_panics() {
        let huge = format!("1{}s", "0".repeat(400));
        for bad in [
            "18446744073709551616s",
            "2562048h",
            "9223372037s",
            huge.as_str(),
        ] {
            let e = parse_go_duration(bad).unwrap_err();
            assert!(e.contains("invalid duration"), "{bad}: {e}");
        }
        assert_eq!(
            parse_go_duration("2562047h").unwrap(),
            Duration::from_secs(2_562_047 * 3600)
        );
    }
}
