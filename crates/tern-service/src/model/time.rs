//! Times as the API writes them: RFC 3339 or a duration from now, to unix seconds and back.

/// `2026-11-22T06:00:00Z` (or with an offset, `+02:00`, and fractional seconds), or a
/// duration from `now` (`90m`, `6h`, `2d`, `3600s`) → unix seconds.
pub fn parse_time(s: &str, now: i64) -> Result<i64, String> {
    let s = s.trim();
    if s.bytes().next().is_some_and(|b| b.is_ascii_digit()) && !s.contains('-') {
        return match crate::tokens::parse_expiry(s) {
            Ok(Some(secs)) => Ok(now + secs),
            _ => Err(format!("deadline '{s}' is neither an RFC 3339 time (2026-11-22T06:00:00Z) nor a duration (90m, 6h, 2d)")),
        };
    }
    s.parse::<jiff::Timestamp>().map(|t| t.as_second()).map_err(|_| format!("deadline '{s}' is not an RFC 3339 time like 2026-11-22T06:00:00Z (or a duration: 90m, 6h, 2d)"))
}

/// Unix seconds → `2026-11-22T06:00:00Z`.
pub fn rfc3339(t: i64) -> String {
    jiff::Timestamp::from_second(t).map_or_else(|_| format!("@{t}"), |ts| ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

pub fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_parse_as_rfc3339_or_durations() {
        assert_eq!(parse_time("1970-01-01T00:00:00Z", 0), Ok(0));
        assert_eq!(parse_time("2026-11-22T06:00:00Z", 0).map(rfc3339), Ok("2026-11-22T06:00:00Z".into()));
        assert_eq!(parse_time("2026-11-22T08:00:00.5+02:00", 0), parse_time("2026-11-22T06:00:00Z", 0));
        assert_eq!(parse_time("90m", 1000), Ok(1000 + 5400));
        assert_eq!(parse_time("2d", 0), Ok(172_800));
        assert_eq!(parse_time("2026-11-22 06:00:00Z", 0), parse_time("2026-11-22T06:00:00Z", 0));
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
        assert!(parse_time("2026-11-22T06:00:00", 0).is_err(), "a time without an offset is ambiguous");
        assert!(parse_time("tomorrow", 0).is_err() && parse_time("2026-13-01T00:00:00Z", 0).is_err());
    }
}
