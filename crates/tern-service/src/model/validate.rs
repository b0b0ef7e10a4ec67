//! What a job spec may hold, checked at submit without touching the file system: endpoint
//! shapes, text fields, sizes and rates, filters, watch options, deadlines. Path prefixes and
//! operator policy are checked later, by `policy.rs`.

use tern_engine::endpoint::Endpoint;
use tern_proto::filter::{Filter, FilterRule};

use super::time::{now, parse_time, rfc3339};
use super::types::JobSpec;

const MAX_FIELD: usize = 4096;

fn check_text(what: &str, s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() {
        return Err(format!("{what} is empty"));
    }
    if s.len() > max {
        return Err(format!("{what} is longer than {max} bytes"));
    }
    if s.chars().any(|c| c.is_control()) {
        return Err(format!("{what} contains control characters"));
    }
    Ok(())
}

/// Sizes and rates as `tern cp` parses them: digits, a dot, unit letters.
fn check_unit(what: &str, s: &str) -> Result<(), String> {
    check_text(what, s, 32)?;
    if !s.starts_with(|c: char| c.is_ascii_digit()) || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '/') {
        return Err(format!("{what} '{s}' is not a size like 4M or a rate like 800Mbit"));
    }
    Ok(())
}

impl JobSpec {
    /// Checks everything that can be checked without touching the file system.
    pub fn validate(&self) -> Result<(), String> {
        for (what, e) in [("src", &self.src), ("dst", &self.dst)] {
            check_text(what, e, MAX_FIELD)?;
            if e.starts_with('-') {
                return Err(format!("{what} '{e}' starts with '-'; write ./{e} for a relative path"));
            }
            let ep = Endpoint::parse(e).map_err(|m| format!("{what}: {m}"))?;
            if let Endpoint::Local(p) = &ep
                && !p.is_absolute()
            {
                return Err(format!("{what} '{e}' is relative; the service has no working directory, give an absolute path"));
            }
        }
        let (s, d) = (Endpoint::parse(&self.src).map_err(|m| format!("src: {m}"))?, Endpoint::parse(&self.dst).map_err(|m| format!("dst: {m}"))?);
        // Two remote ends work between two daemons only: the service's child relays the
        // control messages and daemon A sends the data straight to daemon B (third-party).
        let third_party = !s.is_local() && !d.is_local();
        if third_party && !(matches!(s, Endpoint::Daemon { .. }) && matches!(d, Endpoint::Daemon { .. })) {
            return Err("both ends are remote; that works only between two tern:// daemons, otherwise one end must be a path on the service's host".into());
        }
        if third_party && self.options.bwlimit.is_some() {
            return Err("options.bwlimit does not apply to a tern:// to tern:// job (the daemons move the data)".into());
        }
        if let Some(l) = &self.label {
            check_text("label", l, 200)?;
        }
        if let Some(n) = &self.notify {
            check_text("notify", n, 2048)?;
            if let Some(addr) = n.strip_prefix("mailto:") {
                if !crate::mail::valid_address(addr) {
                    return Err(format!("notify '{n}': '{addr}' is not an email address (mailto:user@example.org)"));
                }
            } else if !(n.starts_with("https://") || n.starts_with("http://")) {
                return Err(format!("notify '{n}' must be an http:// or https:// URL or mailto:ADDRESS"));
            }
        }
        let o = &self.options;
        if let Some(s) = o.streams
            && !(1..=64).contains(&s)
        {
            return Err("options.streams must be between 1 and 64".into());
        }
        if let Some(c) = &o.chunk_size {
            check_unit("options.chunk_size", c)?;
        }
        if let Some(b) = &o.bwlimit {
            check_unit("options.bwlimit", b)?;
        }
        let rules = o.filters.iter().map(|r| FilterRule::parse(r).map_err(|m| format!("options.filters: {m}"))).collect::<Result<Vec<_>, _>>()?;
        Filter::new(&rules).map_err(|m| format!("options.filters: {m}"))?;
        if (o.checksum || o.delete) && !self.sync {
            return Err("options.checksum and options.delete need sync: true".into());
        }
        if let Some(w) = &o.watch {
            if self.sync || !Endpoint::parse(&self.src).is_ok_and(|e| e.is_local()) {
                return Err("a watch job needs a local src directory and no sync".into());
            }
            for (what, v) in [("options.watch.ready", &w.ready), ("options.watch.on_arrival", &w.on_arrival), ("options.watch.until", &w.until)] {
                if let Some(v) = v {
                    check_text(what, v, MAX_FIELD)?;
                    if v.starts_with('-') {
                        return Err(format!("{what} must not start with '-'"));
                    }
                }
            }
        }
        if let Some(d) = &o.deadline {
            check_text("options.deadline", d, 64)?;
            parse_time(d, now())?;
        }
        for (what, v) in [("options.token_file", &o.token_file), ("options.dst_token_file", &o.dst_token_file), ("options.remote_bin", &o.remote_bin), ("options.ssh", &o.ssh)] {
            if let Some(v) = v {
                check_text(what, v, MAX_FIELD)?;
                if v.starts_with('-') {
                    return Err(format!("{what} must not start with '-'"));
                }
            }
        }
        Ok(())
    }

    /// At submit: a duration becomes a time, and a deadline already past is refused.
    pub fn fix_deadline(&mut self, now: i64) -> Result<(), String> {
        if let Some(d) = self.options.deadline.clone() {
            let t = parse_time(&d, now)?;
            if t <= now {
                return Err(format!("options.deadline {} is in the past (it is now {}); give a later time or a duration such as 6h", rfc3339(t), rfc3339(now)));
            }
            self.options.deadline = Some(rfc3339(t));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::model::{now, spec};

    #[test]
    fn validation_refuses_flags_relative_paths_and_two_remotes() {
        assert!(spec("/a", "/b").validate().is_ok());
        assert!(spec("-rf", "/b").validate().unwrap_err().contains("starts with '-'"));
        assert!(spec("a", "/b").validate().unwrap_err().contains("relative"));
        assert!(spec("h:/a", "tern://x/b").validate().unwrap_err().contains("both ends are remote"));
        let mut tp = spec("tern://a/x", "tern://b/y");
        assert!(tp.validate().is_ok(), "third-party between two daemons");
        tp.options.dst_token_file = Some("-x".into());
        assert!(tp.validate().is_err());
        let mut s = spec("/a", "/b");
        s.options.bwlimit = Some("1; rm".into());
        assert!(s.validate().is_err());
        s.options.bwlimit = Some("800Mbit".into());
        assert!(s.validate().is_ok());
        s.options.delete = true;
        assert!(s.validate().unwrap_err().contains("sync"));
    }

    #[test]
    fn filter_rules_are_checked_at_submit() {
        let mut s = spec("/a", "/b");
        s.options.filters = vec!["*.tmp".into()];
        assert!(s.validate().unwrap_err().contains("'- PATTERN'"));
        s.options.filters = vec!["- a[".into()];
        assert!(s.validate().unwrap_err().starts_with("options.filters: filter pattern 'a['"));
        s.options.filters = vec!["- *.tmp".into(), "+ /keep/".into()];
        assert!(s.validate().is_ok());
    }

    #[test]
    fn deadlines_are_fixed_at_submit() {
        let mut s = spec("/a", "/b");
        s.options.deadline = Some("2000-01-01T00:00:00Z".into());
        assert!(s.validate().is_ok());
        assert!(s.fix_deadline(now()).unwrap_err().contains("in the past"));
        s.options.deadline = Some("6h".into());
        s.fix_deadline(1_000_000_000).unwrap();
        assert_eq!(s.options.deadline.as_deref(), Some("2001-09-09T07:46:40Z"));
    }
}
