//! Wall-clock helpers: Unix milliseconds, UTC dates, and durations as people write them.

use std::time::{SystemTime, UNIX_EPOCH};

/// `2026-11-30 08:59:01` (UTC) for a Unix time in milliseconds.
pub fn format_time(at_ms: u64) -> String {
    let (year, month, day) = civil(at_ms);
    let secs = (at_ms / 1000) % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// The UTC calendar date of a Unix time in milliseconds (Howard Hinnant's algorithm).
pub fn civil(at_ms: u64) -> (i64, i64, i64) {
    let days = (at_ms / 86_400_000) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let day = doy - (153 * mp + 2) / 5 + 1;
    (year, month, day)
}

/// Parses a duration as people write one, in `humantime`'s syntax (`30s`, `15m`, `24h`, `7d`,
/// `2w`, `1h30m`), or a bare number of seconds, which every flag that takes a duration has
/// accepted from the start.
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().ok().map(std::time::Duration::from_secs);
    }
    humantime::parse_duration(text).ok()
}

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_people_write_them() {
        for (written, seconds) in [
            ("90", 90),
            ("15m", 900),
            ("7d", 604_800),
            ("1h30m", 5400),
            (" 2w ", 1_209_600),
        ] {
            let expected = Some(std::time::Duration::from_secs(seconds));
            assert_eq!(parse_duration(written), expected, "{written:?}");
        }
        assert_eq!(parse_duration("m"), None);
        assert_eq!(parse_duration("7x"), None);
        assert_eq!(parse_duration("-5s"), None);
        assert_eq!(parse_duration(""), None);
        assert_eq!(parse_duration("99999999999999999999"), None);
    }

    #[test]
    fn times_are_utc() {
        assert_eq!(
            format_time(951_782_400_000 + 3_661_000),
            "2000-02-29 01:01:01"
        );
    }
}
