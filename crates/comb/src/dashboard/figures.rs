//! How numbers read on the pages: counts with thousands separators, ages in the largest
//! two units, rates per second.

/// `1234567` → `1,234,567`.
pub(crate) fn count(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Seconds as an age: `42s`, `3m 12s`, `5h 02m`, `2d 04h`; `—` when there is none.
pub(crate) fn age(seconds: Option<f64>) -> String {
    let Some(s) = seconds.filter(|s| s.is_finite() && *s >= 0.0) else {
        return "—".to_string();
    };
    let s = s.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// A rate with one decimal under 10, none above.
pub(crate) fn rate(per_second: f64) -> String {
    let per_second = per_second.max(0.0);
    if per_second < 10.0 {
        format!("{per_second:.1}/s")
    } else {
        format!("{}/s", count(per_second.round() as i64))
    }
}

/// A time as the API writes it (UTC, milliseconds, `Z`), so a page shows what the listing
/// answered.
pub(crate) fn iso(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_ages_read_well() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(-1234567), "-1,234,567");
        assert_eq!(age(None), "—");
        assert_eq!(age(Some(42.4)), "42s");
        assert_eq!(age(Some(192.0)), "3m 12s");
        assert_eq!(age(Some(18_120.0)), "5h 02m");
        assert_eq!(age(Some(187_200.0)), "2d 04h");
        assert_eq!(rate(2.25), "2.2/s");
        assert_eq!(rate(12_345.0), "12,345/s");
    }
}
