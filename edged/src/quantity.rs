//! Kubernetes resource quantities (`100m`, `1.5`, `128Mi`, `1G`, `1e3`) as exact integers.

/// A quantity in thousandths of its unit (`100m` → 100, `2` → 2000), rounded up; `None`
/// beyond ±`i64::MAX` (the kubelet's int64 `MilliValue`), so callers' arithmetic cannot
/// overflow.
pub fn parse_milli(q: &str) -> Option<i128> {
    let (num, den) = parse_rational(q)?;
    within_i64(ceil_div(num.checked_mul(1000)?, den))
}

/// A quantity in whole units (`128Mi` → 134217728, `100m` → 1), rounded up; `None` beyond
/// ±`i64::MAX`.
pub fn parse_units(q: &str) -> Option<i128> {
    let (num, den) = parse_rational(q)?;
    within_i64(ceil_div(num, den))
}

fn within_i64(v: i128) -> Option<i128> {
    (v.unsigned_abs() <= i64::MAX as u128).then_some(v)
}

/// A quantity from JSON (a string, or a bare number some clients send).
pub fn from_json(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn ceil_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b != 0 && ((a < 0) == (b < 0)) {
        q + 1
    } else {
        q
    }
}

/// `numerator / denominator`, both exact.
fn parse_rational(q: &str) -> Option<(i128, i128)> {
    let q = q.trim();
    let (sign, q) = match q.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, q.strip_prefix('+').unwrap_or(q)),
    };
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return None;
    }
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.len() + frac.len() > 30 {
        return None;
    }
    let digits: i128 = format!("{int}{frac}").parse().ok()?;
    let mut num = digits;
    let mut den: i128 = 10i128.checked_pow(frac.len() as u32)?;
    let (mul, div): (i128, i128) = match suffix {
        "" => (1, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1000),
        "k" => (1000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().ok()?;
            if exp.unsigned_abs() > 18 {
                return None;
            }
            let p = 10i128.pow(exp.unsigned_abs());
            if exp >= 0 { (p, 1) } else { (1, p) }
        }
        _ => return None,
    };
    num = num.checked_mul(mul)?;
    den = den.checked_mul(div)?;
    Some((sign * num, den))
}

/// Kibibytes as Kubernetes writes a memory quantity: `123456Ki`.
pub fn kibibytes(bytes: u64) -> String {
    format!("{}Ki", bytes / 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_kubernetes_writes() {
        assert_eq!(parse_milli("100m"), Some(100));
        assert_eq!(parse_milli("2"), Some(2000));
        assert_eq!(parse_milli("0.5"), Some(500));
        assert_eq!(parse_milli("1.5"), Some(1500));
        assert_eq!(parse_units("128Mi"), Some(128 << 20));
        assert_eq!(parse_units("1G"), Some(1_000_000_000));
        assert_eq!(parse_units("1e3"), Some(1000));
        assert_eq!(parse_units("100m"), Some(1));
        assert_eq!(parse_units("1.5Gi"), Some(3 << 29));
        assert_eq!(parse_units("10%"), None);
        assert_eq!(parse_units(""), None);
        assert_eq!(parse_units("Mi"), None);
        assert_eq!(parse_units("1..2"), None);
        assert_eq!(kibibytes(4096), "4Ki");
        assert_eq!(from_json(&serde_json::json!(2)), Some("2".into()));
    }

    #[test]
    fn quantities_beyond_int64_are_rejected_not_overflowed() {
        // 1e30 × 1e6 fits i128, but × 1000 for milli would not.
        assert_eq!(parse_milli("999999999999999999999999999999M"), None);
        assert_eq!(parse_units("999999999999999999999999999999M"), None);
        assert_eq!(parse_units("10E"), None);
        assert_eq!(parse_units("-10E"), None);
        assert_eq!(parse_units("8Ei"), None);
        assert_eq!(parse_units("7Ei"), Some(7 << 60));
        assert_eq!(
            parse_milli("9223372036854775"),
            Some(9_223_372_036_854_775_000)
        );
        assert_eq!(parse_milli("9223372036854776"), None);
        assert_eq!(parse_units("1e18"), Some(1_000_000_000_000_000_000));
    }
}
