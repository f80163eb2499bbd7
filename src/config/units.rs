//! Sizes and durations as the configuration writes them.
//!
//! Sizes: a whole number of bytes (`1000`), or a whole number and a unit:
//! decimal `B`, `KB`/`kB`, `MB`, `GB`, `TB` (powers of 1000) or binary
//! `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024), an optional space between.
//! `10MB` is 10,000,000 bytes and `10MiB` 10,485,760: both are honoured as
//! written, never one read as the other. Fractions are refused rather than
//! rounded, so the number an operator wrote is the number enforced.
//!
//! Durations: humantime (`150ms`, `30s`, `7d`, `1h 30m`). A bare number is
//! refused: `150` could be milliseconds or seconds, and guessing is how a
//! flush interval becomes two and a half minutes. Every duration is at most
//! [`DURATION_MAX`]: the broker adds durations to clock readings, and a
//! larger one would overflow the clock (a panic) rather than mean anything.
//!
//! The resolved output writes sizes as plain byte counts and durations with
//! [`format_duration`], both of which these parsers read back unchanged.

use std::time::Duration;

/// Parse a size such as `256KiB`, `4GiB`, `10MB` or `1000`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits_end);
    if number.is_empty() {
        return Err(format!(
            "invalid size {text:?}: expected a whole number of bytes, optionally with a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        ));
    }
    let unit = unit.trim_start();
    if unit.starts_with('.') || unit.starts_with(',') {
        return Err(format!(
            "invalid size {text:?}: fractions are not accepted; write a whole number of a smaller unit (e.g. 1536MiB)"
        ));
    }
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1000,
        "mb" => 1000_u64.pow(2),
        "gb" => 1000_u64.pow(3),
        "tb" => 1000_u64.pow(4),
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "invalid size {text:?}: unknown unit {unit:?}; use B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"
            ))
        }
    };
    let value: u64 = number
        .parse()
        .map_err(|_| format!("invalid size {text:?}: the number is too large"))?;
    value
        .checked_mul(multiplier)
        .ok_or_else(|| format!("invalid size {text:?}: more than {} bytes", u64::MAX))
}

/// The longest duration any key takes: 4294967295 s (about 136 years),
/// MQTT's longest interval (a four-byte count of seconds), so the session
/// expiry keys keep their whole MQTT range and no timer the broker sets can
/// run past what its clock holds.
pub const DURATION_MAX: Duration = Duration::from_secs(u32::MAX as u64);

/// [`DURATION_MAX`] as the reference and the refusals write it.
pub const DURATION_MAX_TEXT: &str = "4294967295s (about 136 years)";

/// Parse a humantime duration such as `150ms`, `30s` or `7d`, at most
/// [`DURATION_MAX`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if !trimmed.is_empty() && trimmed.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!(
            "invalid duration {text:?}: give a unit, e.g. {trimmed}ms or {trimmed}s"
        ));
    }
    let duration = humantime::parse_duration(trimmed).map_err(|e| {
        format!("invalid duration {text:?}: {e} (examples: 150ms, 30s, 5m, 1h, 7d)")
    })?;
    if duration > DURATION_MAX {
        return Err(format!(
            "duration {text:?} is longer than {DURATION_MAX_TEXT}, the longest any key takes"
        ));
    }
    Ok(duration)
}

/// The one normalised form of a duration in the resolved output: humantime's
/// (`150ms`, `1h`, `7days`, `1m 30s`), which [`parse_duration`] reads back.
pub fn format_duration(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_honour_decimal_and_binary_units() {
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("256KiB"), Ok(262_144));
        assert_eq!(parse_size("8KiB"), Ok(8192));
        assert_eq!(parse_size("4GiB"), Ok(4 * 1024 * 1024 * 1024));
        assert_eq!(parse_size("10MB"), Ok(10_000_000));
        assert_eq!(parse_size("10MiB"), Ok(10_485_760));
        assert_eq!(parse_size("1kB"), Ok(1000));
        assert_eq!(parse_size("64 MiB"), Ok(64 << 20));
        assert_eq!(parse_size("12B"), Ok(12));
        assert_eq!(parse_size("2TiB"), Ok(2 << 40));
        assert_eq!(parse_size("3TB"), Ok(3_000_000_000_000));
    }

    #[test]
    fn sizes_refuse_what_they_cannot_read_exactly() {
        for bad in [
            "",
            "KiB",
            "1.5GiB",
            "-1",
            "12 parsecs",
            "1e9",
            "99999999999999999999",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_size("20000000TiB").unwrap_err().contains("more than"));
        assert!(parse_size("1.5GiB").unwrap_err().contains("fractions"));
    }

    #[test]
    fn durations_need_a_unit_and_round_trip() {
        assert_eq!(parse_duration("150ms"), Ok(Duration::from_millis(150)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("150").unwrap_err().contains("give a unit"));
        assert!(parse_duration("soon").is_err());
        for d in [
            Duration::from_millis(150),
            Duration::from_secs(7 * 86_400),
            Duration::from_secs(90),
            Duration::from_millis(10),
            Duration::ZERO,
        ] {
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
        assert_eq!(format_duration(Duration::from_millis(150)), "150ms");
    }

    #[test]
    fn durations_past_the_longest_mqtt_interval_are_refused() {
        assert_eq!(parse_duration("4294967295s"), Ok(DURATION_MAX));
        assert_eq!(
            parse_duration(&format_duration(DURATION_MAX)),
            Ok(DURATION_MAX)
        );
        for long in ["4294967296s", "18446744073709551615s", "1000years"] {
            let err = parse_duration(long).unwrap_err();
            assert!(err.contains("longer than 4294967295s"), "{long}: {err}");
        }
        assert_eq!(
            DURATION_MAX_TEXT,
            format!("{}s (about 136 years)", DURATION_MAX.as_secs())
        );
    }
}
