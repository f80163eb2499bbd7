//! Unix nanoseconds as an RFC 3339 UTC date for error messages, without a
//! calendar crate. `0` is "unset" in every format and is shown as such.

/// `2026-01-01T00:00:00Z` (fractional seconds shown when nonzero), or
/// `an unset time` for 0.
pub fn format_unix_nanos(nanos: i64) -> String {
    if nanos == 0 {
        return "an unset time".to_string();
    }
    let secs = nanos.div_euclid(1_000_000_000);
    let frac = nanos.rem_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let of_day = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (of_day / 3600, (of_day % 3600) / 60, of_day % 60);
    if frac == 0 {
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
    } else {
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}.{frac:09}Z")
    }
}

/// Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's
/// algorithm); exact over the whole i64-nanosecond range.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_dates() {
        assert_eq!(
            format_unix_nanos(1_767_225_600_000_000_000),
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(format_unix_nanos(1), "1970-01-01T00:00:00.000000001Z");
        assert_eq!(format_unix_nanos(-1), "1969-12-31T23:59:59.999999999Z");
        assert_eq!(format_unix_nanos(0), "an unset time");
        assert_eq!(
            format_unix_nanos(951_782_400_000_000_000),
            "2000-02-29T00:00:00Z"
        );
        // The extremes must not overflow.
        format_unix_nanos(i64::MIN);
        format_unix_nanos(i64::MAX);
    }
}
