//! Runs scheduled path tests (issue 15): one task, one test at a time, each a child
//! `tern test --json … -- DEST` (same binary, argv built by `TestSpec::child_args`, never a
//! shell), judged against the schedule's own baseline and stored. See docs/service.md
//! "Scheduled path tests".
//!
//! One at a time because tests measure the path: two at once would measure each other (and a
//! daemon refuses a second test anyway). A schedule due while another runs waits its turn.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::sync::Notify;

use crate::model::now;
use crate::model::pathtest::{self, KEEP_RESULTS, Schedule, TestResult};
use crate::runner::{RunnerConfig, blocking};
use crate::store::JobStore;

/// Longest report kept from a child (a report is about 2 kB).
const MAX_REPORT: u64 = 1 << 20;
/// How long a child may run past its own `--seconds` (connects, the storage steps, an ssh login).
const GRACE: Duration = Duration::from_secs(60);
/// The scheduler looks again at least this often.
const TICK: Duration = Duration::from_millis(500);

/// Called when a schedule crosses into regression (the notification channels).
pub type OnAlert = Arc<dyn Fn(Schedule, TestResult) + Send + Sync>;

pub struct Tester {
    store: Arc<dyn JobStore>,
    cfg: RunnerConfig,
    wake: Notify,
    on_alert: OnAlert,
}

impl Tester {
    pub fn new(store: Arc<dyn JobStore>, cfg: RunnerConfig, on_alert: OnAlert) -> Arc<Self> {
        Arc::new(Self { store, cfg, wake: Notify::new(), on_alert })
    }

    /// A schedule was created or deleted: look now.
    pub fn poke(&self) {
        self.wake.notify_one();
    }

    pub fn min_every_s(&self) -> u64 {
        self.cfg.test_min_every_s
    }

    pub async fn run(self: Arc<Self>) {
        loop {
            let store = self.store.clone();
            match blocking(move || store.due_schedule(now())).await {
                Ok(Some(s)) => {
                    self.run_one(s).await;
                    continue;
                }
                Ok(None) => {}
                Err(e) => tracing::error!("path tests: {e}"),
            }
            let _ = tokio::time::timeout(TICK, self.wake.notified()).await;
        }
    }

    async fn run_one(&self, s: Schedule) {
        let started = now();
        let (store, owner) = (self.store.clone(), s.owner.clone());
        let token = blocking(move || store.list_tokens()).await.ok().and_then(|all| all.into_iter().find(|t| Some(&t.id) == owner.as_ref()));
        // The owner's token and the operator's policy as they are now.
        let checked = match &token {
            None => Err("the token that created this schedule no longer exists; delete it and schedule again with a live token".to_string()),
            Some(t) if t.revoked_at.is_some() => Err(format!("token {} that created this schedule was revoked; delete it and schedule again with a live token", t.id)),
            Some(t) if t.expires_at.is_some_and(|e| e <= started) => Err(format!("token {} that created this schedule expired; delete it and schedule again with a live token", t.id)),
            Some(t) => self.cfg.policy.check_test(&s.spec, t).map_err(|r| r.message),
        };
        let mut result = match checked {
            Err(why) => pathtest::failed(started, &format!("refused: {why}")),
            Ok(account) => {
                tracing::info!(target: "tern::access", "path test {} start: token {}: {}", s.id, s.owner.as_deref().unwrap_or("-"), s.spec.dest);
                self.child(&s, account, started).await
            }
        };
        let (store, id) = (self.store.clone(), s.id);
        let history = blocking(move || store.list_results(id, None, (pathtest::BASELINE_K * 20) as u32)).await.unwrap_or_default();
        let (regressed, alert) = pathtest::judge(&mut result, &history, s.regressed, s.spec.alert_below);
        tracing::info!(
            target: "tern::access",
            "path test {} end: {}: {}",
            s.id,
            s.spec.dest,
            match (&result.error, result.many_gbps) {
                (Some(e), _) => format!("failed: {e}"),
                (None, m) => format!("{:.3} Gb/s, baseline {}{}", m.unwrap_or(0.0), result.baseline_gbps.map_or("none yet".into(), |b| format!("{b:.3} Gb/s")), if result.regressed { ", REGRESSED" } else { "" }),
            }
        );
        // From the start, so the timetable does not drift by the tests' own length.
        let next_at = (started + s.spec.every_s as i64).max(now());
        let store = self.store.clone();
        let r = result.clone();
        match blocking(move || store.record_result(id, &r, next_at, regressed, alert, KEEP_RESULTS)).await {
            Ok(Some(stored)) if alert => {
                let mut sched = s.clone();
                sched.regressed = true;
                (self.on_alert)(sched, stored);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!("path test {id}: cannot record the result: {e}");
                // Not again at once: a broken database would otherwise run tests back to back.
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }

    async fn child(&self, s: &Schedule, account: Option<crate::runas::Account>, started: i64) -> TestResult {
        // Dies with the service, so a restarted one never measures beside an old test.
        let mut cmd = crate::runner::child_command(&self.cfg.exe, s.spec.child_args(), account);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return pathtest::failed(started, &format!("cannot start {}: {e}", self.cfg.exe.display())),
        };
        let (out, err) = (child.stdout.take(), child.stderr.take());
        let read_out = async move {
            let mut buf = Vec::new();
            if let Some(o) = out {
                let _ = o.take(MAX_REPORT).read_to_end(&mut buf).await;
            }
            buf
        };
        let read_err = async move {
            let mut tail = Vec::new();
            if let Some(e) = err {
                let mut lines = BufReader::new(e).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    tail.push(l.chars().take(300).collect::<String>());
                    if tail.len() > 3 {
                        tail.remove(0);
                    }
                }
            }
            tail
        };
        let limit = Duration::from_secs(u64::from(s.spec.seconds)) + GRACE;
        let waited = tokio::time::timeout(limit, async { tokio::join!(read_out, read_err, child.wait()) }).await;
        let (out, tail, status) = match waited {
            Ok(x) => x,
            Err(_) => {
                if let Some(pid) = child.id() {
                    // SAFETY: plain syscall on the child's own process group.
                    unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
                }
                let _ = child.wait().await;
                return pathtest::failed(started, &format!("the test ran past {} s and was stopped", limit.as_secs()));
            }
        };
        let report = String::from_utf8_lossy(&out).lines().rev().find_map(|l| serde_json::from_str::<Value>(l).ok());
        match (status, report.as_ref().and_then(|v| pathtest::parse_report(v, started))) {
            (Ok(st), Some(r)) if st.success() => r,
            (st, _) => {
                let tail = tail.join(" | ");
                let why = match st.ok().and_then(|s| s.code()) {
                    _ if !tail.is_empty() => tail,
                    Some(c) => format!("tern test exited with status {c} and no report"),
                    None => "tern test was killed".into(),
                };
                pathtest::failed(started, &why)
            }
        }
    }
}
