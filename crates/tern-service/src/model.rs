//! What the service talks about: job states, the job spec a client may submit (and its
//! validation), token scopes, and the rows the store returns.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tern_engine::endpoint::Endpoint;
use tern_proto::filter::{Filter, FilterRule};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Queued,
    Running,
    /// Waiting out the backoff after a transient failure; runnable again at `not_before`.
    Retrying,
    Succeeded,
    Failed,
    Canceled,
}

impl JobState {
    pub const ALL: [JobState; 6] = [Self::Queued, Self::Running, Self::Retrying, Self::Succeeded, Self::Failed, Self::Canceled];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Retrying => "retrying",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Terminal states are never left by the service on its own (only by an explicit retry).
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Canceled)
    }
}

/// Ordered: each scope includes the ones below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Read,
    Transfer,
    Admin,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Transfer => "transfer",
            Self::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Read, Self::Transfer, Self::Admin].into_iter().find(|sc| sc.as_str() == s)
    }
}

/// `tern cp`/`tern sync` flags a client may set; each maps to exactly one flag of the child.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_size: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwlimit: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_encrypt: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub verify_full: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub checksum: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub delete: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_for: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// tern:// to tern:// jobs: the destination daemon's token file when it differs from
    /// `token_file` (then the source daemon's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst_token_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_bin: Option<String>,
    /// A watch job (`tern submit --watch`): the child is `tern watch` instead of `tern cp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<WatchOptions>,
    /// A command the service will execute: admin tokens only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<String>,
    /// `--fail-fast`: the first failed file fails the whole transfer.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fail_fast: bool,
    /// Not a flag of the child: the service fails the job if it has not finished by then.
    /// Submitted as RFC 3339 (`2026-11-22T06:00:00Z`) or a duration from now (`90m`, `6h`,
    /// `2d`); stored as RFC 3339 UTC (the API turns a duration into a time at submit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// `--ignore-existing`: keep destination files that exist, whatever their content.
    #[serde(default, skip_serializing_if = "is_false")]
    pub ignore_existing: bool,
    /// Include/exclude rules in order, rsync's short form: `- *.tmp`, `+ */`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<String>,
}

/// `tern watch` flags a client may set (docs/watch.md); each maps to one flag of the child.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_arrival: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub in_order: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub delete_after_verified: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_units: Option<u64>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What a client submits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub src: String,
    pub dst: String,
    #[serde(default)]
    pub sync: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<String>,
    #[serde(default)]
    pub options: JobOptions,
}

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

    /// The deadline as unix seconds (`options.deadline`, normalised to RFC 3339 at submit).
    pub fn deadline_at(&self) -> Option<i64> {
        self.options.deadline.as_deref().and_then(|d| parse_time(d, now()).ok())
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

    /// Every path this job touches (for token path prefixes), local or remote.
    pub fn paths(&self) -> Vec<String> {
        let mut out: Vec<String> = [&self.src, &self.dst].iter().filter_map(|e| Endpoint::parse(e).ok()).map(|e| e.path_str()).collect();
        out.extend(self.options.token_file.iter().chain(&self.options.dst_token_file).cloned());
        out
    }

    /// Whether the job names a command the service's child runs on a host (an ssh command, or
    /// a watch hook anywhere but on a daemon, where hooks are names the operator registered).
    pub fn runs_command(&self) -> bool {
        let hook_is_command = self.options.watch.as_ref().is_some_and(|w| w.on_arrival.is_some()) && !self.dst.starts_with("tern://");
        self.options.ssh.is_some() || hook_is_command
    }

    /// The child's arguments after the binary name. Endpoints come after `--`, so they can
    /// never be taken for flags.
    pub fn child_args(&self) -> Vec<String> {
        let mut a: Vec<String> = match (&self.options.watch, self.sync) {
            (Some(_), _) => vec!["watch".into()],
            (None, true) => vec!["sync".into()],
            (None, false) => vec!["cp".into(), "-r".into()],
        };
        a.extend(["--json", "--progress-json", "--quiet"].map(String::from));
        if let Some(w) = &self.options.watch {
            for (flag, v) in [("--ready", &w.ready), ("--on-arrival", &w.on_arrival), ("--until", &w.until)] {
                if let Some(v) = v {
                    a.extend([flag.to_string(), v.clone()]);
                }
            }
            if let Some(n) = w.max_units {
                a.extend(["--max-units".into(), n.to_string()]);
            }
            for (on, flag) in [(w.in_order, "--in-order"), (w.delete_after_verified, "--delete-after-verified")] {
                if on {
                    a.push(flag.into());
                }
            }
        }
        let o = &self.options;
        let mut opt = |flag: &str, v: Option<String>| {
            if let Some(v) = v {
                a.push(flag.into());
                a.push(v);
            }
        };
        opt("--streams", o.streams.map(|s| s.to_string()));
        opt("--chunk-size", o.chunk_size.clone());
        opt("--bwlimit", o.bwlimit.clone());
        opt("--retry-for", o.retry_for.map(|s| s.to_string()));
        opt("--token-file", o.token_file.clone());
        opt("--dst-token-file", o.dst_token_file.clone());
        opt("--remote-bin", o.remote_bin.clone());
        opt("--ssh", o.ssh.clone());
        if o.fail_fast && o.watch.is_none() {
            a.push("--fail-fast".into());
        }
        if o.verify_full {
            a.extend(["--verify".into(), "full".into()]);
        }
        for rule in &o.filters {
            a.extend(["--filter".into(), rule.clone()]);
        }
        for (on, flag) in [(o.no_encrypt, "--no-encrypt"), (o.checksum, "--checksum"), (o.delete, "--delete"), (o.ignore_existing, "--ignore-existing")] {
            if on {
                a.push(flag.into());
            }
        }
        a.extend(["--".into(), self.src.clone(), self.dst.clone()]);
        a
    }
}

/// A job as stored, plus what the API adds (rate, ETA) when it shows one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    pub id: i64,
    pub state: JobState,
    pub spec: JobSpec,
    pub owner: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub not_before: i64,
    pub attempts: u32,
    pub retries: u32,
    /// The child's latest `{"progress": {...}}` object (inner part).
    pub progress: Option<Value>,
    /// The child's final summary object.
    pub summary: Option<Value>,
    /// Why the job failed (or the last transient failure), one line.
    pub error: Option<String>,
    pub notified: bool,
}

/// Token metadata: never the secret, never its hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenInfo {
    pub id: String,
    pub name: String,
    pub scope: Scope,
    pub path_prefix: Option<String>,
    pub created_by: Option<String>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    pub last_used_at: Option<i64>,
    /// The local account a root service runs this token's transfers as (`--run-as`).
    #[serde(default)]
    pub run_as: Option<String>,
}

/// Aggregates for `/metrics`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    pub jobs_by_state: Vec<(JobState, u64)>,
    pub bytes: u64,
    pub files: u64,
    pub files_failed: u64,
    pub retries: u64,
}

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

    fn spec(src: &str, dst: &str) -> JobSpec {
        JobSpec { src: src.into(), dst: dst.into(), sync: false, label: None, notify: None, options: JobOptions::default() }
    }

    #[test]
    fn validation_refuses_flags_relative_paths_and_two_remotes() {
        assert!(spec("/a", "/b").validate().is_ok());
        assert!(spec("-rf", "/b").validate().unwrap_err().contains("starts with '-'"));
        assert!(spec("a", "/b").validate().unwrap_err().contains("relative"));
        assert!(spec("h:/a", "tern://x/b").validate().unwrap_err().contains("both ends are remote"));
        let mut tp = spec("tern://a/x", "tern://b/y");
        assert!(tp.validate().is_ok(), "third-party between two daemons");
        tp.options.dst_token_file = Some("/etc/tern/b.token".into());
        assert!(tp.paths().contains(&"/etc/tern/b.token".to_string()));
        let args = tp.child_args();
        assert!(args.windows(2).any(|w| w == ["--dst-token-file", "/etc/tern/b.token"]), "{args:?}");
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
    fn deadlines_parse_as_rfc3339_or_durations() {
        assert_eq!(parse_time("1970-01-01T00:00:00Z", 0), Ok(0));
        assert_eq!(parse_time("2026-11-22T06:00:00Z", 0).map(rfc3339), Ok("2026-11-22T06:00:00Z".into()));
        assert_eq!(parse_time("2026-11-22T08:00:00.5+02:00", 0), parse_time("2026-11-22T06:00:00Z", 0));
        assert_eq!(parse_time("90m", 1000), Ok(1000 + 5400));
        assert_eq!(parse_time("2d", 0), Ok(172_800));
        assert!(parse_time("tomorrow", 0).is_err() && parse_time("2026-13-01T00:00:00Z", 0).is_err());
        let mut s = spec("/a", "/b");
        s.options.deadline = Some("2000-01-01T00:00:00Z".into());
        assert!(s.validate().is_ok());
        assert!(s.fix_deadline(now()).unwrap_err().contains("in the past"));
        s.options.deadline = Some("6h".into());
        s.fix_deadline(1_000_000_000).unwrap();
        assert_eq!(s.options.deadline.as_deref(), Some("2001-09-09T07:46:40Z"));
        s.options.fail_fast = true;
        s.options.filters = vec!["+ */".into(), "- *.tmp".into()];
        assert!(s.child_args().contains(&"--fail-fast".to_string()) && !s.child_args().iter().any(|a| a.contains("deadline")));
        assert!(s.child_args().windows(4).any(|w| w == ["--filter", "+ */", "--filter", "- *.tmp"]));
    }

    #[test]
    fn endpoints_come_after_double_dash() {
        let a = spec("/a", "h:/b").child_args();
        let i = a.iter().position(|x| x == "--").unwrap();
        assert_eq!(&a[i + 1..], ["/a", "h:/b"]);
        assert_eq!(&a[..2], ["cp", "-r"]);
    }

    #[test]
    fn watch_jobs_run_tern_watch() {
        let mut s = spec("/sim/out", "tern://dtn/incoming");
        s.options.watch = Some(WatchOptions { ready: Some("marker:*.done".into()), on_arrival: Some("analyze".into()), in_order: true, ..Default::default() });
        assert!(s.validate().is_ok());
        assert!(!s.runs_command(), "a daemon hook is a registered name");
        let a = s.child_args();
        assert_eq!(a[0], "watch");
        assert!(a.windows(2).any(|w| w == ["--ready", "marker:*.done"]) && a.contains(&"--in-order".to_string()));
        assert_eq!(&a[a.len() - 3..], ["--", "/sim/out", "tern://dtn/incoming"]);
        s.dst = "/local/dst".into();
        assert!(s.runs_command(), "a local hook is a shell command");
        s.options.watch.as_mut().unwrap().until = Some("--x".into());
        assert!(s.validate().is_err());
        s.options.watch.as_mut().unwrap().until = None;
        s.src = "h:/remote".into();
        assert!(s.validate().is_err());
    }
}
