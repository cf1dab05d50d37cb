//! Durations (`500ms`, `30s`, `24h`, `1h30m`) and byte sizes (`512B`, `64KiB`, `1MiB`) as
//! they are written in `proxy.yaml`.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// A duration read from the config: one or more `<number><unit>` parts, units `ms s m h d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigDuration(pub Duration);

/// A byte size read from the config: a bare number of bytes or `<number><unit>`, units
/// `B KiB MiB GiB` (also `KB MB GB`, read as the binary units since nobody means 10^3 here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

/// Parses `30s`, `1h30m`, `250ms`. A bare `0` is allowed; other bare numbers are not, since
/// "60" could be seconds or milliseconds and a config should not make readers guess.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let bad = || format!("invalid duration {text:?} (expected e.g. 500ms, 30s, 5m, 24h, 30d)");
    let mut rest = text;
    let mut total = Duration::ZERO;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let value: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit_ms: u64 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        let part = value.checked_mul(unit_ms).ok_or_else(bad)?;
        total = total
            .checked_add(Duration::from_millis(part))
            .ok_or_else(bad)?;
    }
    Ok(total)
}

/// Parses `1MiB`, `512B`, `65536`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let bad = || format!("invalid size {text:?} (expected e.g. 512B, 64KiB, 1MiB, 2GiB)");
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(bad());
    }
    let value: u64 = text[..digits].parse().map_err(|_| bad())?;
    let unit: u64 = match text[digits..].trim_start() {
        "" | "B" => 1,
        "KiB" | "KB" | "K" => 1 << 10,
        "MiB" | "MB" | "M" => 1 << 20,
        "GiB" | "GB" | "G" => 1 << 30,
        _ => return Err(bad()),
    };
    value.checked_mul(unit).ok_or_else(bad)
}

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ConfigDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 30s, 5m or 24h")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                parse_duration(v).map(ConfigDuration).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                parse_duration(&v.to_string())
                    .map(ConfigDuration)
                    .map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                parse_duration(&v.to_string())
                    .map(ConfigDuration)
                    .map_err(E::custom)
            }
        }
        deserializer.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as 512B, 64KiB or 1MiB")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                parse_size(v).map(ByteSize).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// Formats a duration the way the config spells it, for `idemgate check`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= size && ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// Formats a byte size with the largest binary unit that divides it.
pub fn format_size(bytes: u64) -> String {
    for (unit, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= size && bytes % size == 0 {
            return format!("{}{unit}", bytes / size);
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accept_every_unit_and_compounds() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn durations_reject_unitless_and_unknown_units() {
        for bad in ["", "60", "5x", "s", "1.5s", "-1s", "10 s"] {
            assert!(parse_duration(bad).is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn sizes_use_binary_units() {
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("1TiB").is_err());
        assert!(parse_size("MiB").is_err());
    }

    #[test]
    fn formatting_round_trips_through_parsing() {
        for d in ["30s", "1d", "1m", "250ms", "30d", "90m"] {
            assert_eq!(format_duration(parse_duration(d).unwrap()), d);
        }
        assert_eq!(format_size(parse_size("256MiB").unwrap()), "256MiB");
    }
}
