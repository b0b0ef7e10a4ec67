//! Runs jobs: a scheduler under `max_jobs` (the store's claim picks fairly between owners), and one supervisor per attempt that drives a
//! child `tern cp|sync --json --progress-json` (same binary) and records how it ended.
//!
//! A child process, not an in-process transfer: a crash or hang of a transfer cannot take the
//! service down, cancel is a kill, and resuming after a restart is running the same command.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::sync::{Notify, watch};

use crate::model::{Job, JobState, now};
use crate::store::{JobStore, StoreError};

#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// The `tern` binary children run (normally `std::env::current_exe()`).
    pub exe: PathBuf,
    pub max_jobs: usize,
    /// Attempts per run before a transiently failing job is `failed`.
    pub max_attempts: u32,
    /// First backoff after a transient failure; doubles per attempt, capped at 5 minutes.
    pub retry_base: Duration,
    /// Checked again as each attempt starts (links, tokens and files may have changed).
    pub policy: Arc<crate::policy::Policy>,
    /// `--test-min-interval`: the shortest `every` a path-test schedule may have.
    pub test_min_every_s: u64,
}

/// Longest stdout line kept (a summary with many errors is long, but not this long).
const MAX_LINE: u64 = 8 << 20;
const STDERR_LINES: usize = 20;
const PROGRESS_SAVE_EVERY: Duration = Duration::from_secs(2);
/// The scheduler re-checks at least this often (backoffs expire without any event).
const TICK: Duration = Duration::from_millis(500);

struct Running {
    pid: Option<u32>,
    cancel: bool,
    /// Stopped because this cluster node fenced itself: its outcome is not this node's to write.
    fenced: bool,
    progress: Option<Value>,
    /// `options.deadline` as unix seconds.
    deadline: Option<i64>,
}

/// How often the scheduler looks for jobs past their deadline.
const DEADLINE_EVERY: Duration = Duration::from_secs(1);

/// The job's `error` when its deadline passed, with how far it got.
pub fn deadline_reason(deadline: i64, progress: Option<&Value>) -> String {
    let t = crate::model::rfc3339(deadline);
    let f = |k: &str| progress.and_then(|p| p.get(k)).and_then(Value::as_u64).unwrap_or(0);
    match progress {
        Some(_) => format!("deadline passed ({t}) with {} of {} files done; resubmit or retry with a later --deadline", f("files_done") + f("files_skipped"), f("files_total")),
        None => format!("deadline passed ({t}) with 0 files done (it had not started); resubmit or retry with a later --deadline"),
    }
}

pub struct Runner {
    store: Arc<dyn JobStore>,
    cfg: RunnerConfig,
    wake: Notify,
    running: Mutex<HashMap<i64, Running>>,
    changes: watch::Sender<u64>,
    /// Called with each job that reached a terminal state (webhooks).
    on_done: Box<dyn Fn(Job) + Send + Sync>,
    /// A cluster node's self-fencing: while set, it claims nothing and runs nothing.
    fence: std::sync::OnceLock<Arc<crate::cluster::Fence>>,
    /// Attempts this node claimed and gave up without an outcome (fenced, or the database
    /// failed before the start): back to the queue before it claims again.
    hand_back: Mutex<Vec<i64>>,
}

/// What one attempt produced.
struct Attempt {
    exit: Option<i32>,
    summary: Option<Value>,
    stderr_tail: Vec<String>,
}

impl Runner {
    pub fn new(store: Arc<dyn JobStore>, cfg: RunnerConfig, on_done: Box<dyn Fn(Job) + Send + Sync>) -> Arc<Self> {
        Arc::new(Self {
            store,
            cfg,
            wake: Notify::new(),
            running: Mutex::new(HashMap::new()),
            changes: watch::channel(0).0,
            on_done,
            fence: std::sync::OnceLock::new(),
            hand_back: Mutex::new(Vec::new()),
        })
    }

    /// Makes this runner follow a cluster node's fence: fencing stops every transfer (SIGTERM,
    /// SIGKILL after the fence's grace) without writing outcomes; lifting wakes the scheduler.
    pub fn follow_fence(self: &Arc<Self>, fence: Arc<crate::cluster::Fence>) {
        let me = Arc::downgrade(self);
        let grace = fence.grace();
        fence.on_change(Box::new(move |fenced| match me.upgrade() {
            Some(r) if fenced => r.stop_all(grace),
            Some(r) => {
                r.poke();
                0
            }
            None => 0,
        }));
        let _ = self.fence.set(fence);
    }

    /// Why this node runs no jobs now (a fenced cluster node), if so.
    pub fn fenced(&self) -> Option<String> {
        self.fence.get().and_then(|f| f.fenced())
    }

    /// Fencing: every attempt is marked (its supervisor then writes no outcome and hands it
    /// back) and its child group gets SIGTERM, then SIGKILL after `grace` if it is still there.
    fn stop_all(self: &Arc<Self>, grace: Duration) -> usize {
        let pids: Vec<(i64, u32)> = {
            let mut map = self.lock();
            map.iter_mut()
                .filter_map(|(id, r)| {
                    r.fenced = true;
                    r.cancel = true;
                    r.pid.map(|p| (*id, p))
                })
                .collect()
        };
        for (_, pid) in &pids {
            signal_group(*pid, libc::SIGTERM);
        }
        if !pids.is_empty() {
            let me = self.clone();
            let stragglers = pids.clone();
            std::thread::spawn(move || {
                std::thread::sleep(grace);
                let map = me.lock();
                // Only a child still running under the same pid: never a group the pid now names.
                for (id, pid) in stragglers {
                    if map.get(&id).and_then(|r| r.pid) == Some(pid) {
                        kill_group(pid);
                    }
                }
            });
        }
        self.poke();
        pids.len()
    }

    /// The attempt ends here without an outcome: it goes back to the queue (by `hand_back_all`)
    /// before this node claims again. No poke: the scheduler's next tick is soon enough, and a
    /// database that fails each start cannot turn claim and hand-back into a busy loop.
    fn abandon(&self, id: i64) {
        self.lock().remove(&id);
        self.hand_back.lock().unwrap_or_else(|p| p.into_inner()).push(id);
    }

    /// Re-queues the attempts given up without an outcome; false while that fails.
    async fn hand_back_all(&self) -> bool {
        let ids: Vec<i64> = self.hand_back.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if ids.is_empty() {
            return true;
        }
        let (store, list) = (self.store.clone(), ids.clone());
        match blocking(move || store.hand_back(&list, now())).await {
            Ok(n) => {
                self.hand_back.lock().unwrap_or_else(|p| p.into_inner()).retain(|id| !ids.contains(id));
                if n > 0 {
                    tracing::warn!("re-queued {n} of this node's job attempt(s) stopped without an outcome; they resume from their journals");
                }
                true
            }
            Err(e) => {
                tracing::debug!("handing back attempts: {e}");
                false
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Running>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Something changed: wake the scheduler and every `wait`.
    pub fn poke(&self) {
        self.wake.notify_one();
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Fresher than the database's copy (which is written every 2 s).
    pub fn live_progress(&self, id: i64) -> Option<Value> {
        self.lock().get(&id).and_then(|r| r.progress.clone())
    }

    pub fn running_count(&self) -> usize {
        self.lock().len()
    }

    /// The job is already `canceled` in the database; stop its child if it has one.
    pub fn kill(&self, id: i64) {
        let mut map = self.lock();
        if let Some(r) = map.get_mut(&id) {
            r.cancel = true;
            if let Some(pid) = r.pid {
                kill_group(pid);
            }
        }
    }

    /// On a cluster, other nodes share the job table: a job canceled through another node's API
    /// is killed here, and the attempts of nodes that died or left are re-queued (they resume
    /// from their journals on the shared file system). A service alone reads nothing here: its
    /// own API kills what it cancels.
    async fn follow_other_nodes(&self) {
        if !self.store.shared_with_other_nodes() {
            return;
        }
        let ids: Vec<i64> = self.lock().iter().filter(|(_, r)| !r.cancel).map(|(id, _)| *id).collect();
        for id in ids {
            let store = self.store.clone();
            if let Ok(Some(job)) = blocking(move || store.get_job(id)).await
                && job.state == JobState::Canceled
            {
                self.kill(id);
            }
        }
        let store = self.store.clone();
        match blocking(move || store.recover_orphans(now())).await {
            Ok(n) if n > 0 => {
                tracing::warn!("re-queued {n} job(s) of cluster nodes that left or fell silent; they resume from their journals");
                self.poke();
            }
            _ => {}
        }
    }

    /// The scheduler: forever, start runnable jobs (fair by owner) while fewer than `max_jobs` run.
    pub async fn run(self: Arc<Self>) {
        let mut deadlines_checked = Instant::now().checked_sub(DEADLINE_EVERY).unwrap_or_else(Instant::now);
        loop {
            // Fenced, or transfers stopped by a fence still ending, or attempts to hand back
            // first: nothing is claimed (an attempt is never run twice at once, here or there).
            if self.fenced().is_some() || self.lock().values().any(|r| r.fenced) || !self.hand_back_all().await {
                let _ = tokio::time::timeout(TICK, self.wake.notified()).await;
                continue;
            }
            if deadlines_checked.elapsed() >= DEADLINE_EVERY {
                deadlines_checked = Instant::now();
                self.enforce_deadlines().await;
                self.follow_other_nodes().await;
            }
            while self.running_count() < self.cfg.max_jobs {
                let store = self.store.clone();
                match blocking(move || store.claim_next(now())).await {
                    Ok(Some(job)) => {
                        {
                            let mut map = self.lock();
                            // Fenced while the claim was in flight: handed back unstarted
                            // (under the lock `stop_all` takes, so neither misses the other).
                            let fenced = self.fenced().is_some();
                            map.insert(job.id, Running { pid: None, cancel: fenced, fenced, progress: None, deadline: job.spec.deadline_at() });
                        }
                        self.changes.send_modify(|v| *v = v.wrapping_add(1));
                        tokio::spawn(self.clone().supervise(job));
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!("scheduler: {e}");
                        break;
                    }
                }
            }
            let _ = tokio::time::timeout(TICK, self.wake.notified()).await;
        }
    }

    /// Fails jobs past their deadline: a waiting one is never started; a running one is
    /// `failed` in the database first, then its child is killed (as a cancel is).
    async fn enforce_deadlines(self: &Arc<Self>) {
        let t = now();
        let expired: Vec<(i64, i64, Option<Value>)> = {
            let mut map = self.lock();
            map.iter_mut()
                .filter(|(_, r)| !r.cancel && r.deadline.is_some_and(|d| d <= t))
                .map(|(id, r)| {
                    // From here on the supervisor's own outcome cannot land (the job is no
                    // longer running), and nothing else kills it twice.
                    r.cancel = true;
                    (*id, r.deadline.unwrap_or(t), r.progress.clone())
                })
                .collect()
        };
        for (id, deadline, progress) in expired {
            let reason = deadline_reason(deadline, progress.as_ref());
            let store = self.store.clone();
            let r = reason.clone();
            let committed = match persist(&format!("job {id}: recording its deadline"), move || store.fail_job(id, &[JobState::Running], &r, progress.as_ref(), now())).await {
                Ok(true) => {
                    tracing::info!("job {id}: {reason}");
                    true
                }
                // It ended (or was canceled) meanwhile: that outcome stands.
                Ok(false) => false,
                Err(e) => {
                    tracing::error!("job {id}: cannot record the deadline: {e}");
                    true
                }
            };
            // Committed: now stop the child, as a cancel does.
            if committed && let Some(pid) = self.lock().get(&id).and_then(|r| r.pid) {
                kill_group(pid);
            }
            self.poke();
        }
        let store = self.store.clone();
        let waiting = match blocking(move || store.waiting_with_deadline()).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!("deadlines: {e}");
                return;
            }
        };
        for job in waiting {
            let Some(deadline) = job.spec.deadline_at().filter(|&d| d <= t) else { continue };
            let reason = deadline_reason(deadline, job.progress.as_ref());
            let (store, id, r) = (self.store.clone(), job.id, reason.clone());
            if let Ok(true) = persist(&format!("job {id}: recording its deadline"), move || store.fail_job(id, &[JobState::Queued, JobState::Retrying], &r, None, now())).await {
                tracing::info!("job {id}: {reason}");
                self.poke();
                self.notify_if_terminal(id).await;
            }
        }
    }

    async fn supervise(self: Arc<Self>, job: Job) {
        // A cancel that landed between the claim and our entry in `running` found nothing to
        // kill: look again now that `kill` can see us (it sets `cancel` from here on).
        let (store, id) = (self.store.clone(), job.id);
        match blocking(move || store.get_job(id)).await {
            Ok(Some(j)) if j.state == JobState::Running => {}
            Ok(_) => {
                self.lock().remove(&id);
                self.poke();
                return;
            }
            // Claimed but unreadable now: not left `running` with nobody running it.
            Err(_) => return self.abandon(id),
        }
        if self.is_fenced(id) {
            return self.abandon(id);
        }
        // Claimed after its deadline (it was waiting for a slot): never started.
        if let Some(deadline) = job.spec.deadline_at().filter(|&d| d <= now()) {
            let reason = deadline_reason(deadline, None);
            let store = self.store.clone();
            let r = reason.clone();
            if let Ok(true) = persist(&format!("job {id}: recording its deadline"), move || store.fail_job(id, &[JobState::Running], &r, None, now())).await {
                tracing::info!("job {id}: {reason}");
            }
            self.release(id).await;
            return;
        }
        // The owner's token as it is now, and the policy as it holds now.
        let (store, owner) = (self.store.clone(), job.owner.clone());
        let token = match blocking(move || store.list_tokens()).await {
            Ok(all) => all.into_iter().find(|t| Some(&t.id) == owner.as_ref()),
            // The database failing is not the token missing: handed back, not failed.
            Err(_) => return self.abandon(id),
        };
        let checked = match &token {
            None => Err(format!("job {id}'s token no longer exists; resubmit it with a live token")),
            Some(t) if t.revoked_at.is_some() => Err(format!("token {} that submitted job {id} was revoked; resubmit it with a live token", t.id)),
            Some(t) => self.cfg.policy.check_job(&job.spec, t).map_err(|r| r.message),
        };
        let fences = token.as_ref().map(|t| self.cfg.policy.fences(&job.spec, t)).unwrap_or_default();
        let who = token.as_ref().map(|t| format!("token '{}' ({})", t.name, t.id)).unwrap_or_else(|| "an unknown token".into());
        let account = match checked {
            Ok(a) => a,
            Err(why) => {
                tracing::info!("job {id} refused at start: {who}: {why}");
                let store = self.store.clone();
                let w = why.clone();
                let _ = persist(&format!("job {id}: recording its refusal"), move || store.finish_attempt(id, JobState::Failed, None, Some(&w), 0, now())).await;
                self.release(id).await;
                return;
            }
        };
        if self.is_fenced(id) {
            return self.abandon(id);
        }
        let as_user = account.as_ref().map(|a| format!(" as user {}", a.name)).unwrap_or_default();
        // The operator's access log (shown by default, like the daemon's session lines).
        tracing::info!(target: "tern::access", "job {id} start: {who}{as_user}, attempt {}: {} -> {}", job.attempts, job.spec.src, job.spec.dst);
        let started = Instant::now();
        let attempt = self.attempt(&job, account, fences).await;
        if self.is_fenced(id) {
            // Its outcome is not ours to write: the other nodes re-queue it, or we do once the
            // fence lifts.
            tracing::warn!(target: "tern::access", "job {id} stopped: this cluster node is fenced; attempt {} is left to the cluster to re-queue", job.attempts);
            return self.abandon(id);
        }
        let (state, error, not_before) = self.classify(&job, &attempt);
        let f = |k: &str| attempt.summary.as_ref().and_then(|s| s.get(k)).and_then(Value::as_u64).unwrap_or(0);
        tracing::info!(
            target: "tern::access",
            "job {id} end: {who}, {} -> {}: {}, {} bytes, {} files, {} failed, {:.1} s{}",
            job.spec.src,
            job.spec.dst,
            state.as_str(),
            f("bytes"),
            f("files"),
            f("files_failed"),
            started.elapsed().as_secs_f64(),
            error.as_deref().map(|e| format!(": {e}")).unwrap_or_default()
        );
        let (id, summary) = (job.id, attempt.summary.clone());
        let err = error.clone();
        let store = self.store.clone();
        let fenced = || self.is_fenced(id);
        let result = persist_unless(&format!("job {id}: recording the outcome"), &fenced, move || store.finish_attempt(id, state, summary.as_ref(), err.as_deref(), not_before, now())).await;
        match result {
            Ok(true) => tracing::info!("job {id}: attempt {} ended {}{}", job.attempts, state.as_str(), error.map(|e| format!(": {e}")).unwrap_or_default()),
            Ok(false) => tracing::info!("job {id}: attempt ended after the job was canceled"),
            Err(_) if self.is_fenced(id) => {
                tracing::warn!("job {id}: this cluster node fenced itself before the outcome landed; the attempt is left to the cluster to re-queue");
                return self.abandon(id);
            }
            Err(e) => tracing::error!("job {id}: cannot record the outcome: {e}"),
        }
        self.release(id).await;
    }

    fn is_fenced(&self, id: i64) -> bool {
        self.lock().get(&id).is_some_and(|r| r.fenced)
    }

    /// Frees the job's run slot and notifies with whatever the database now says (a cancel may
    /// have won the race with the attempt's outcome).
    async fn release(&self, id: i64) {
        self.lock().remove(&id);
        self.poke();
        self.notify_if_terminal(id).await;
    }

    async fn notify_if_terminal(&self, id: i64) {
        let store = self.store.clone();
        if let Ok(Some(j)) = blocking(move || store.get_job(id)).await
            && j.state.is_terminal()
        {
            (self.on_done)(j);
        }
    }

    fn classify(&self, job: &Job, a: &Attempt) -> (JobState, Option<String>, i64) {
        let ok = a.summary.as_ref().and_then(|s| s.get("ok")).and_then(Value::as_bool) == Some(true);
        if a.exit == Some(0) && ok {
            return (JobState::Succeeded, None, 0);
        }
        let why = describe_failure(a);
        // Permanent: a file failed, or tern refused the command line (exit 2, no summary).
        let files_failed = a.summary.as_ref().and_then(|s| s.get("files_failed")).and_then(Value::as_u64).unwrap_or(0);
        let only_network = a.summary.as_ref().map(|s| s.get("errors").and_then(Value::as_array).is_some_and(|e| e.iter().all(|e| e.get("side").and_then(Value::as_str) == Some("network"))));
        let transient = match only_network {
            None => a.exit != Some(2),
            Some(net) => net && files_failed == 0,
        };
        if transient && job.attempts < self.cfg.max_attempts {
            let backoff = self.cfg.retry_base.saturating_mul(1 << job.attempts.saturating_sub(1).min(16)).min(Duration::from_secs(300));
            let not_before = now() + backoff.as_secs_f64().ceil() as i64;
            return (JobState::Retrying, Some(format!("attempt {} of {}: {why}", job.attempts, self.cfg.max_attempts)), not_before);
        }
        (JobState::Failed, Some(why), 0)
    }

    /// `fences`: the directories the child keeps the job's local source and destination beneath
    /// when it opens them, so a link swapped in after the start check leads nowhere.
    async fn attempt(&self, job: &Job, account: Option<crate::runas::Account>, fences: (Option<PathBuf>, Option<PathBuf>)) -> Attempt {
        let mut args = job.spec.child_args();
        // Before the final `-- SRC DST`; `tern cp`, `tern sync` and `tern watch` all take them.
        let at = args.len() - 3;
        let flags = [("--src-beneath", fences.0), ("--dst-beneath", fences.1)];
        let extra: Vec<String> = flags.into_iter().filter_map(|(f, d)| d.map(|d| [f.to_string(), d.display().to_string()])).flatten().collect();
        args.splice(at..at, extra);
        let mut cmd = child_command(&self.cfg.exe, args, account);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return Attempt { exit: None, summary: None, stderr_tail: vec![format!("cannot start {}: {e}", self.cfg.exe.display())] },
        };
        let pid = child.id();
        {
            let mut map = self.lock();
            if let Some(r) = map.get_mut(&job.id) {
                r.pid = pid;
                // Canceled between claim and spawn.
                if r.cancel
                    && let Some(pid) = pid
                {
                    kill_group(pid);
                }
            }
        }
        let stderr = child.stderr.take().map(|e| tokio::spawn(tail_lines(e)));
        let mut summary = None;
        if let Some(out) = child.stdout.take() {
            let mut reader = BufReader::new(out);
            let mut buf = Vec::new();
            let mut last_save = Instant::now().checked_sub(PROGRESS_SAVE_EVERY).unwrap_or_else(Instant::now);
            loop {
                buf.clear();
                match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let Ok(v) = serde_json::from_slice::<Value>(&buf) else { continue };
                if let Some(p) = v.get("progress") {
                    if let Some(r) = self.lock().get_mut(&job.id) {
                        r.progress = Some(p.clone());
                    }
                    if last_save.elapsed() >= PROGRESS_SAVE_EVERY {
                        last_save = Instant::now();
                        let (store, p, id) = (self.store.clone(), p.clone(), job.id);
                        let _ = blocking(move || store.save_progress(id, &p, now())).await;
                    }
                } else if v.get("ok").is_some() {
                    summary = Some(v);
                }
            }
        }
        // stdout closed: the child is exiting. Bound the wait anyway.
        let exit = match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
            Ok(Ok(st)) => st.code(),
            _ => {
                let _ = child.start_kill();
                child.wait().await.ok().and_then(|s| s.code())
            }
        };
        let stderr_tail = match stderr {
            Some(h) => tokio::time::timeout(Duration::from_secs(5), h).await.ok().and_then(Result::ok).unwrap_or_default(),
            None => Vec::new(),
        };
        Attempt { exit, summary, stderr_tail }
    }
}

/// A child `tern` (`exe`, same binary) with piped output, run as `account` when given (its own
/// environment: ssh finds its keys and config, not root's), in its own process group (a cancel
/// kills it and whatever it started, ssh included), dying with the service.
pub(crate) fn child_command(exe: &std::path::Path, args: impl IntoIterator<Item = impl AsRef<std::ffi::OsStr>>, account: Option<crate::runas::Account>) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    if let Some(a) = &account {
        cmd.env("HOME", &a.home).env("USER", &a.name).env("LOGNAME", &a.name).current_dir("/");
    }
    cmd.process_group(0);
    let parent = std::process::id();
    // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(a) = &account {
                crate::runas::drop_to(a)?;
            }
            // After the drop: changing credentials clears the parent-death signal.
            // Die with the service (even kill -9), so a restarted service never races an
            // old attempt on the same destination. Fires when the spawning *thread* exits:
            // we spawn from runtime worker threads, which live as long as the service.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    cmd
}

/// One line for the job's `error`: the first few per-file reasons, else stderr's last lines.
fn describe_failure(a: &Attempt) -> String {
    if let Some(errors) = a.summary.as_ref().and_then(|s| s.get("errors")).and_then(Value::as_array)
        && !errors.is_empty()
    {
        let mut parts: Vec<String> = errors
            .iter()
            .take(3)
            .map(|e| {
                let (side, path, msg) =
                    (e.get("side").and_then(Value::as_str).unwrap_or("?"), e.get("path").and_then(Value::as_str).unwrap_or(""), e.get("message").and_then(Value::as_str).unwrap_or(""));
                if path.is_empty() { format!("{side}: {msg}") } else { format!("{side}: {path}: {msg}") }
            })
            .collect();
        if errors.len() > 3 {
            parts.push(format!("and {} more", errors.len() - 3));
        }
        return parts.join("; ");
    }
    let tail = a.stderr_tail.iter().rev().take(3).rev().cloned().collect::<Vec<_>>().join(" | ");
    match a.exit {
        Some(c) if tail.is_empty() => format!("tern exited with status {c}"),
        Some(_) => tail,
        None if tail.is_empty() => "the transfer process was killed".into(),
        None => format!("the transfer process was killed: {tail}"),
    }
}

async fn tail_lines(r: impl AsyncRead + Unpin) -> Vec<String> {
    let mut lines = BufReader::new(r).lines();
    let mut tail = std::collections::VecDeque::with_capacity(STDERR_LINES);
    while let Ok(Some(l)) = lines.next_line().await {
        if tail.len() == STDERR_LINES {
            tail.pop_front();
        }
        tail.push_back(l.chars().take(500).collect::<String>());
    }
    tail.into()
}

fn kill_group(pid: u32) {
    signal_group(pid, libc::SIGKILL);
}

fn signal_group(pid: u32, sig: i32) {
    // SAFETY: plain syscall; a stale pid group at worst gets ESRCH.
    unsafe {
        libc::kill(-(pid as i32), sig);
    }
}

/// A store call that must not be lost (a job's outcome): retried while the database is
/// locked, full or unreachable, with backoff up to 10 s, until it lands. The job keeps its
/// running slot meanwhile, and a restart would re-queue it, so nothing is dropped either way.
async fn persist<T: Send + 'static>(what: &str, f: impl Fn() -> Result<T, StoreError> + Send + Sync + 'static) -> Result<T, StoreError> {
    persist_unless(what, &|| false, f).await
}

/// `persist`, giving up (with the last error) once `stop` holds: a fenced node's outcome must
/// not land after the cluster re-queued the attempt.
async fn persist_unless<T: Send + 'static>(what: &str, stop: &(dyn Fn() -> bool + Sync), f: impl Fn() -> Result<T, StoreError> + Send + Sync + 'static) -> Result<T, StoreError> {
    let f = Arc::new(f);
    let mut delay = Duration::from_millis(250);
    loop {
        let g = f.clone();
        match blocking(move || g()).await {
            Err(e) if e.is_transient() && !stop() => {
                tracing::warn!("{what}: {e}; trying again in {delay:?}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            r => return r,
        }
    }
}

/// Runs a store call on the blocking pool (SQLite blocks).
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, StoreError> + Send + 'static) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| Err(StoreError::Db(format!("store task failed: {e}"))))
}
