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

/// Parses `30s`, `15m`, `24h`, `7d` (or a bare number of seconds).
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let text = text.trim();
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = number.parse().ok()?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        "d" => n.checked_mul(86_400)?,
        _ => return None,
    };
    Some(std::time::Duration::from_secs(secs))
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
        assert_eq!(
            parse_duration("90"),
            Some(std::time::Duration::from_secs(90))
        );
        assert_eq!(
            parse_duration("15m"),
            Some(std::time::Duration::from_secs(900))
        );
        assert_eq!(
            parse_duration("7d"),
            Some(std::time::Duration::from_secs(604_800))
        );
        assert_eq!(parse_duration("7w"), None);
        assert_eq!(parse_duration("m"), None);
    }

    #[test]
    fn times_are_utc() {
        assert_eq!(
            format_time(951_782_400_000 + 3_661_000),
            "2000-02-29 01:01:01"
        );
    }
}
