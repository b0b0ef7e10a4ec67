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
    let err = || format!("deadline '{s}' is not an RFC 3339 time like 2026-11-22T06:00:00Z (or a duration: 90m, 6h, 2d)");
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' || b[16] != b':' {
        return Err(err());
    }
    let num = |r: std::ops::Range<usize>| s.get(r).filter(|x| x.bytes().all(|c| c.is_ascii_digit())).and_then(|x| x.parse::<i64>().ok()).ok_or_else(err);
    let (y, mo, d, h, mi, sec) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return Err(err());
    }
    let mut rest = &s[19..];
    if let Some(r) = rest.strip_prefix('.') {
        rest = r.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    let offset = match rest {
        "Z" | "z" => 0,
        r if r.len() == 6 && (r.starts_with('+') || r.starts_with('-')) && &r[3..4] == ":" => {
            let (oh, om) = (num(s.len() - 5..s.len() - 3)?, num(s.len() - 2..s.len())?);
            let o = oh * 3600 + om * 60;
            if r.starts_with('-') { -o } else { o }
        }
        _ => return Err(err()),
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let yy = if mo <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let doy = (153 * (if mo > 2 { mo - 3 } else { mo + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Ok(days * 86_400 + h * 3600 + mi * 60 + sec - offset)
}

/// Unix seconds → `2026-11-22T06:00:00Z`.
pub fn rfc3339(t: i64) -> String {
    let (days, secs) = (t.div_euclid(86_400), t.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs % 3600 / 60, secs % 60)
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
        assert!(parse_time("tomorrow", 0).is_err() && parse_time("2026-13-01T00:00:00Z", 0).is_err());
    }
}
