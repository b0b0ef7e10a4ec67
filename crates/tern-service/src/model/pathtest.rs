//! Scheduled path tests (issue 15): what a client asks for (`TestRequest`), what is stored
//! (`TestSpec`, `Schedule`, `TestResult`), the bounds checked at create, the child's argv, the
//! parsing of its `--json` report, and the baseline/regression rule. See docs/service.md
//! "Scheduled path tests".

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tern_engine::endpoint::Endpoint;

use super::types::{JobOptions, JobSpec};

/// Longest interval between two runs.
pub const MAX_EVERY_S: u64 = 30 * 86_400;
/// `tern serve --test-min-interval`'s default.
pub const DEFAULT_MIN_EVERY_S: u64 = 600;
pub const MAX_SCHEDULES: usize = 100;
pub const MAX_SCHEDULES_PER_TOKEN: usize = 10;
/// Results kept per schedule; older ones are dropped as new ones land.
pub const KEEP_RESULTS: u32 = 2_000;
pub const MAX_ERROR_CHARS: usize = 1_000;
/// The baseline's window: the previous `BASELINE_K` good results, once at least `BASELINE_MIN`.
pub const BASELINE_K: usize = 5;
pub const BASELINE_MIN: usize = 3;
const DEFAULT_SECONDS: u32 = 10;
const DEFAULT_ALERT_BELOW: f64 = 0.5;

/// `every` as sent: seconds, or a duration like `10m`, `6h`, `1d`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Every {
    Secs(u64),
    Text(String),
}

/// The body of `POST /v1/path-tests`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestRequest {
    pub dest: String,
    pub every: Every,
    #[serde(default)]
    pub streams: Option<u16>,
    #[serde(default)]
    pub seconds: Option<u32>,
    #[serde(default)]
    pub pull: bool,
    #[serde(default)]
    pub no_encrypt: bool,
    #[serde(default)]
    pub token_file: Option<String>,
    #[serde(default)]
    pub alert_below: Option<f64>,
    #[serde(default)]
    pub notify: Option<String>,
    #[serde(default)]
    pub label: Option<String>,
}

/// A schedule's stored, normalised spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestSpec {
    pub dest: String,
    pub every_s: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<u16>,
    pub seconds: u32,
    #[serde(default)]
    pub pull: bool,
    #[serde(default)]
    pub no_encrypt: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    pub alert_below: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// A schedule as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Schedule {
    pub id: i64,
    pub spec: TestSpec,
    pub owner: Option<String>,
    pub created_at: i64,
    /// When it is next due (unix s).
    pub next_at: i64,
    pub regressed: bool,
    /// A regression notification not delivered yet.
    pub alert_pending: bool,
}

/// One run's outcome (rates in Gb/s, as `tern test --json` reports them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TestResult {
    #[serde(default)]
    pub id: i64,
    pub at: i64,
    pub ok: bool,
    pub rtt_ms: Option<f64>,
    pub one_gbps: Option<f64>,
    pub many_gbps: Option<f64>,
    pub streams: Option<u16>,
    /// The verdict's limiting component: network, cpu, destination or source.
    pub verdict: Option<String>,
    pub expected_gbps: Option<f64>,
    pub error: Option<String>,
    pub baseline_gbps: Option<f64>,
    pub regressed: bool,
}

fn text(what: &str, s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() || s.len() > max || s.chars().any(char::is_control) {
        return Err(format!("{what} must be 1 to {max} bytes without control characters"));
    }
    Ok(())
}

impl TestRequest {
    /// Bounds and shapes, without touching the file system or the network (the operator's
    /// policy is `policy.rs`'s, checked after this). `min_every_s`: `--test-min-interval`.
    pub fn validate(self, min_every_s: u64) -> Result<TestSpec, String> {
        text("dest", &self.dest, 1024)?;
        if self.dest.starts_with('-') {
            return Err("dest must not start with '-'".into());
        }
        Endpoint::parse(&self.dest).map_err(|e| format!("dest: {e}"))?;
        let every_s = match &self.every {
            Every::Secs(s) => *s,
            Every::Text(t) => crate::tokens::parse_expiry(t)
                .ok()
                .flatten()
                .map(|s| s as u64)
                .ok_or_else(|| format!("every '{}' is not a duration like 90s, 10m, 6h or 1d", t.chars().take(40).collect::<String>()))?,
        };
        if every_s < min_every_s || every_s > MAX_EVERY_S {
            return Err(format!("every must be between {min_every_s} s (this service's --test-min-interval) and {MAX_EVERY_S} s (30 days); got {every_s} s"));
        }
        let seconds = self.seconds.unwrap_or(DEFAULT_SECONDS);
        if !(5..=100).contains(&seconds) {
            return Err(format!("seconds must be 5 to 100; got {seconds}"));
        }
        if u64::from(seconds) >= every_s {
            return Err(format!("seconds ({seconds}) must be less than every ({every_s} s)"));
        }
        if let Some(n) = self.streams
            && !(1..=64).contains(&n)
        {
            return Err(format!("streams must be 1 to 64; got {n}"));
        }
        let alert_below = self.alert_below.unwrap_or(DEFAULT_ALERT_BELOW);
        if !(alert_below > 0.0 && alert_below <= 1.0) {
            return Err(format!("alert_below must be a fraction above 0 and at most 1; got {alert_below}"));
        }
        if let Some(f) = &self.token_file {
            text("token_file", f, 4096)?;
        }
        if let Some(l) = &self.label {
            text("label", l, 200)?;
        }
        let spec = TestSpec {
            dest: self.dest,
            every_s,
            streams: self.streams,
            seconds,
            pull: self.pull,
            no_encrypt: self.no_encrypt,
            token_file: self.token_file,
            alert_below,
            notify: self.notify,
            label: self.label,
        };
        // dest, notify and token_file by the jobs' own rules (a job from this host to dest).
        JobSpec { src: "/".into(), ..spec.as_job() }.validate().map_err(|e| e.replacen("dst", "dest", 1))?;
        Ok(spec)
    }
}

impl TestSpec {
    /// The job a test stands for as far as the operator's policy goes: it reaches `dest` (as a
    /// job's `dst`) with `token_file`, and notifies `notify`.
    pub fn as_job(&self) -> JobSpec {
        JobSpec {
            src: self.dest.clone(),
            dst: self.dest.clone(),
            sync: false,
            label: self.label.clone(),
            notify: self.notify.clone(),
            options: JobOptions { token_file: self.token_file.clone(), ..Default::default() },
        }
    }

    pub fn is_local(&self) -> bool {
        matches!(Endpoint::parse(&self.dest), Ok(Endpoint::Local(_)))
    }

    /// The child's arguments after the binary name: a fixed shape, `dest` after `--`.
    pub fn child_args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec!["test".into(), "--json".into(), "--seconds".into(), self.seconds.to_string()];
        if let Some(n) = self.streams {
            a.extend(["--streams".into(), n.to_string()]);
        }
        for (on, flag) in [(self.pull, "--pull"), (self.no_encrypt, "--no-encrypt")] {
            if on {
                a.push(flag.into());
            }
        }
        if let Some(f) = &self.token_file {
            a.extend(["--token-file".into(), f.clone()]);
        }
        a.extend(["--".into(), self.dest.clone()]);
        a
    }
}

/// A result from the child's `--json` report (`None` if it is not one).
pub fn parse_report(v: &Value, at: i64) -> Option<TestResult> {
    if v.get("type").and_then(Value::as_str) != Some("test") {
        return None;
    }
    let f = |p: &[&str]| {
        let mut x = v;
        for k in p {
            x = x.get(k)?;
        }
        x.as_f64().filter(|n| n.is_finite() && *n >= 0.0)
    };
    // A carry that moved nothing measured no path (its streams were not up within the step: a
    // busy host); as a rate it would drag the baseline down or raise a false alert.
    if f(&["network", "many_gbps"]) == Some(0.0) {
        return Some(failed(at, "the test carried no data within its step (the hosts were busy, or the data streams did not connect in time); not counted"));
    }
    Some(TestResult {
        at,
        ok: true,
        rtt_ms: f(&["rtt_ms", "median"]),
        one_gbps: f(&["network", "one_gbps"]),
        many_gbps: f(&["network", "many_gbps"]),
        streams: v.get("streams").and_then(Value::as_u64).and_then(|n| u16::try_from(n).ok()),
        verdict: v.get("verdict").and_then(|x| x.get("limit")).and_then(Value::as_str).map(|s| s.chars().take(32).collect()),
        expected_gbps: f(&["expected_gbps"]),
        ..Default::default()
    })
}

/// A failed run's result, its error cut to `MAX_ERROR_CHARS`.
pub fn failed(at: i64, error: &str) -> TestResult {
    TestResult { at, ok: false, error: Some(error.chars().take(MAX_ERROR_CHARS).collect()), ..Default::default() }
}

/// The median N-stream rate of the last `BASELINE_K` good (ok, not regressed) results in
/// `history` (oldest first), once there are at least `BASELINE_MIN`.
pub fn baseline(history: &[TestResult]) -> Option<f64> {
    let mut good: Vec<f64> = history.iter().rev().filter(|r| r.ok && !r.regressed).filter_map(|r| r.many_gbps).take(BASELINE_K).collect();
    if good.len() < BASELINE_MIN {
        return None;
    }
    good.sort_by(f64::total_cmp);
    let n = good.len();
    Some(if n % 2 == 1 { good[n / 2] } else { (good[n / 2 - 1] + good[n / 2]) / 2.0 })
}

/// Judges `r` against `history`: sets its baseline and regressed flag. Returns the schedule's
/// new regressed state and whether it just crossed into regression (notify once). A failed run
/// keeps the state as it was.
pub fn judge(r: &mut TestResult, history: &[TestResult], was_regressed: bool, alert_below: f64) -> (bool, bool) {
    r.baseline_gbps = baseline(history);
    if !r.ok {
        return (was_regressed, false);
    }
    let below = match (r.baseline_gbps, r.many_gbps) {
        (Some(b), Some(m)) => m < alert_below * b,
        _ => false,
    };
    r.regressed = below;
    (below, below && !was_regressed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(dest: &str, every: Every) -> TestRequest {
        TestRequest { dest: dest.into(), every, streams: None, seconds: None, pull: false, no_encrypt: false, token_file: None, alert_below: None, notify: None, label: None }
    }

    #[test]
    fn a_carry_that_moved_nothing_is_a_failed_run_not_a_rate_of_zero() {
        let v = serde_json::json!({ "type": "test", "network": { "one_gbps": 0.0, "many_gbps": 0.0 } });
        let r = parse_report(&v, 7).unwrap();
        assert!(!r.ok && r.many_gbps.is_none() && r.error.as_deref().is_some_and(|e| e.contains("carried no data")), "{r:?}");
        let v = serde_json::json!({ "type": "test", "network": { "one_gbps": 0.1, "many_gbps": 0.3 } });
        assert!(parse_report(&v, 7).unwrap().ok);
    }

    #[test]
    fn bounds_hold_and_argv_has_a_fixed_shape() {
        let s = req("tern://dtn2/x", Every::Text("6h".into())).validate(600).unwrap();
        assert_eq!((s.every_s, s.seconds, s.alert_below), (21_600, 10, 0.5));
        assert_eq!(s.child_args(), ["test", "--json", "--seconds", "10", "--", "tern://dtn2/x"]);
        assert!(req("tern://dtn2/x", Every::Secs(60)).validate(600).unwrap_err().contains("--test-min-interval"));
        assert!(req("tern://dtn2/x", Every::Secs(MAX_EVERY_S + 1)).validate(1).is_err());
        assert!(req("--ssh=evil", Every::Secs(600)).validate(600).unwrap_err().contains("'-'"));
        assert!(req(&"h:/".repeat(400), Every::Secs(600)).validate(600).is_err());
        let mut r = req("tern://dtn2/x", Every::Secs(600));
        r.alert_below = Some(f64::NAN);
        assert!(r.clone().validate(600).is_err());
        r.alert_below = Some(1.5);
        assert!(r.clone().validate(600).is_err());
        r.alert_below = None;
        r.seconds = Some(3);
        assert!(r.clone().validate(600).is_err());
        r.seconds = Some(10);
        r.streams = Some(65);
        assert!(r.clone().validate(600).is_err());
        r.streams = Some(4);
        r.label = Some("a\nb".into());
        assert!(r.clone().validate(600).is_err());
        r.label = None;
        r.pull = true;
        r.token_file = Some("/etc/tern/t".into());
        let a = r.validate(600).unwrap().child_args();
        assert_eq!(a, ["test", "--json", "--seconds", "10", "--streams", "4", "--pull", "--token-file", "/etc/tern/t", "--", "tern://dtn2/x"]);
    }

    fn ok(many: f64, regressed: bool) -> TestResult {
        TestResult { ok: true, many_gbps: Some(many), regressed, ..Default::default() }
    }

    #[test]
    fn baseline_is_the_median_of_the_last_good_results_and_alerts_once() {
        assert_eq!(baseline(&[ok(1.0, false), ok(1.0, false)]), None);
        assert_eq!(baseline(&[ok(0.2, false), ok(0.3, false), ok(0.1, false)]), Some(0.2));
        let h = [ok(9.0, false), ok(0.1, true), ok(0.3, false), ok(0.3, false), ok(0.28, false), ok(0.29, false), ok(0.31, false)];
        assert_eq!(baseline(&h), Some(0.3), "the last five good ones; regressed ones are not a baseline");
        let mut r = ok(0.03, false);
        assert_eq!(judge(&mut r, &h, false, 0.5), (true, true));
        assert!(r.regressed && r.baseline_gbps == Some(0.3));
        let mut again = ok(0.03, false);
        assert_eq!(judge(&mut again, &h, true, 0.5), (true, false), "no second alert while regressed");
        let mut err = failed(0, &"x".repeat(5000));
        assert_eq!(judge(&mut err, &h, true, 0.5), (true, false));
        assert_eq!(err.error.unwrap().len(), MAX_ERROR_CHARS);
        let mut back = ok(0.29, false);
        assert_eq!(judge(&mut back, &h, true, 0.5), (false, false), "recovered");
    }
}
