//! The freshness window: a request carrying a timestamp (header or JSON field) too old
//! (older than `max_age`, or than its key is kept less `skew`: [`Freshness`]), more than
//! `skew` in the future, or unreadable is refused before any store work, so a captured
//! request cannot be replayed later; so is a timestamp header sent more than once.
//! Accepts unix seconds, unix milliseconds and RFC 3339.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;

use crate::canonical::extract_fields;
use crate::config::{FreshSource, Freshness};
use crate::error::ProxyError;

/// Checks the request's timestamp against the window, relative to `now`.
pub fn check(
    rule: &Freshness,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<(), ProxyError> {
    let stale = |why: &str| Err(ProxyError::Stale(why.to_owned()));
    let millis = match &rule.source {
        FreshSource::Header(name) => {
            // One value only: of several, the upstream may read another than the one
            // checked here (a fresh stamp put ahead of a captured one it verifies).
            let mut values = headers.get_all(name).iter();
            let (first, second) = (values.next(), values.next());
            if second.is_some() {
                return stale(&format!("the {name} header is sent more than once"));
            }
            let Some(value) = first.and_then(|v| v.to_str().ok()) else {
                return stale(&format!("the {name} header is missing or unreadable"));
            };
            parse_timestamp(value.trim())
        }
        FreshSource::Field(pointer) => {
            let found = extract_fields(body, std::slice::from_ref(pointer)).ok();
            match found
                .as_ref()
                .and_then(|v| v.first())
                .and_then(|v| v.as_deref())
            {
                Some(canonical) => parse_canonical(canonical),
                None => return stale(&format!("the body has no readable timestamp at {pointer}")),
            }
        }
    };
    let Some(millis) = millis else {
        return stale("the timestamp is not unix seconds, unix milliseconds or RFC 3339");
    };
    let now_ms = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as i128;
    // Saturating: a client's timestamp may be any 128-bit value (a float saturates to the
    // ends of the range), and an overflow must not end the request without an answer.
    let age = now_ms.saturating_sub(millis);
    if rule.too_old(age) {
        return stale(&format!(
            "the request's timestamp is too old: this route accepts ages {}",
            rule.accepted_ages()
        ));
    }
    if age.saturating_neg() > rule.skew.as_millis() as i128 {
        return stale("the request's timestamp is in the future");
    }
    Ok(())
}

/// Integers above 10^11 are milliseconds (10^11 seconds is the year 5138), others seconds;
/// anything else is tried as RFC 3339.
fn parse_timestamp(text: &str) -> Option<i128> {
    if let Ok(n) = text.parse::<i128>() {
        return Some(if n.unsigned_abs() >= 100_000_000_000 {
            n
        } else {
            n * 1000
        });
    }
    if let Ok(f) = text.parse::<f64>() {
        if f.is_finite() {
            let n = if f.abs() >= 1e11 { f } else { f * 1000.0 };
            return Some(n as i128);
        }
    }
    parse_rfc3339(text)
}

/// A field's canonical JSON: a string, or a number as `digits e exponent`, which is itself
/// a float literal `parse_timestamp` reads.
fn parse_canonical(canonical: &[u8]) -> Option<i128> {
    let text = std::str::from_utf8(canonical).ok()?;
    match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(inner) => parse_timestamp(inner),
        None => parse_timestamp(text),
    }
}

/// `2026-11-21T12:00:00Z`, `2026-11-21T12:00:00.123+01:00`.
fn parse_rfc3339(text: &str) -> Option<i128> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = text.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[13] != b':'
        || b[16] != b':'
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let padded = format!("{:0<3}", &frac[..digits.min(3)]);
        millis = padded.parse().ok()?;
        rest = &frac[digits..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let r = rest.get(1..)?;
            if r.len() != 5 || r.as_bytes()[2] != b':' {
                return None;
            }
            let h: i64 = r[..2].parse().ok()?;
            let m: i64 = r[3..].parse().ok()?;
            sign * (h * 60 + m)
        }
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Some(seconds as i128 * 1000 + millis as i128)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_seconds_milliseconds_and_rfc3339_agree() {
        let at = Some(1_763_726_400_000); // 2025-11-21T12:00:00Z
        assert_eq!(parse_timestamp("1763726400"), at);
        assert_eq!(parse_timestamp("1763726400000"), at);
        assert_eq!(parse_timestamp("2025-11-21T12:00:00Z"), at);
        assert_eq!(parse_timestamp("2025-11-21T13:00:00+01:00"), at);
        assert_eq!(
            parse_timestamp("2025-11-21T12:00:00.250Z"),
            at.map(|t| t + 250)
        );
        assert_eq!(parse_canonical(b"1763726400e0"), at);
        assert_eq!(parse_canonical(b"17637264e2"), at);
        assert_eq!(parse_canonical(b"\"2025-11-21T12:00:00Z\""), at);
    }

    #[test]
    fn garbage_is_unreadable() {
        for bad in [
            "",
            "yesterday",
            "2025-13-01T00:00:00Z",
            "2025-11-21 12:00",
            "1e999999",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_epoch_is_day_zero() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }
}
