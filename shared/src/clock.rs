//! Kubernetes timestamps: `metav1.Time` (RFC 3339, whole seconds, UTC) and `metav1.MicroTime`
//! (microseconds), from the system clock or from CRI's Unix nanoseconds.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `2024-05-01T12:00:00Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let (secs, _) = split(t);
    format_secs(secs)
}

/// `2024-05-01T12:00:00.123456Z` (a Lease's `renewTime`).
pub fn rfc3339_micros(t: SystemTime) -> String {
    let (secs, nanos) = split(t);
    let s = format_secs(secs);
    format!("{}.{:06}Z", s.trim_end_matches('Z'), nanos / 1000)
}

pub fn now() -> String {
    rfc3339(SystemTime::now())
}

/// Seconds since the Unix epoch (JWT `exp`/`nbf`, certificate validity).
pub fn unix_now() -> i64 {
    unix(SystemTime::now())
}

pub fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// CRI timestamps are Unix nanoseconds; 0 means "never".
pub fn from_unix_nanos(nanos: i64) -> Option<SystemTime> {
    (nanos > 0).then(|| UNIX_EPOCH + Duration::from_nanos(nanos as u64))
}

fn split(t: SystemTime) -> (i64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(_) => (0, 0),
    }
}

fn format_secs(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`; `None` for anything else.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || (b[10] != b'T' && b[10] != b't') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let text = &frac[..digits.min(9)];
        nanos = text.parse::<u32>().ok()? * 10u32.pow(9 - text.len() as u32);
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && (rest.starts_with('+') || rest.starts_with('-')) => {
            let oh: i64 = rest.get(1..3)?.parse().ok()?;
            let om: i64 = rest.get(4..6)?.parse().ok()?;
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            sign * (oh * 3600 + om * 60)
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo as u32, d as u32);
    let secs = days * 86_400 + h * 3600 + mi * 60 + se - offset;
    (secs >= 0).then(|| UNIX_EPOCH + Duration::new(secs as u64, nanos))
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_parses_round_trip() {
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339_micros(t), "2023-11-14T22:13:20.123456Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            parse_rfc3339("2023-11-14T22:13:20Z"),
            Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert_eq!(
            parse_rfc3339("2023-11-14T22:13:20.123456Z"),
            Some(UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_000))
        );
        assert_eq!(
            parse_rfc3339("2023-11-15T00:13:20+02:00"),
            Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        for bad in [
            "",
            "2023-11-14",
            "2023-13-14T22:13:20Z",
            "2023-11-14T22:13:20",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        assert_eq!(from_unix_nanos(0), None);
        assert_eq!(
            from_unix_nanos(1_000_000_000),
            Some(UNIX_EPOCH + Duration::from_secs(1))
        );
    }
}
