//! The watch loop: detect ready units, ship each with the engine, then hook and delete it, and
//! record every step in the state log before acting on it.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Sender, select, unbounded};
use serde::Serialize;
use tern_engine::client::session::ClientSpec;
use tern_engine::endpoint::Endpoint;
use tern_engine::progress::Progress;

use crate::hook::{self, Hook, HookEnv, HookError};
use crate::rules::{Detector, ReadyRule};
use crate::state::{Event, HookState, StateLog};
use crate::stats::{self, RateWindow, WatchFields};
use crate::units;

pub struct Config {
    pub src: PathBuf,
    /// `tern cp`'s settings; the destination is DST, sources are set per unit.
    pub template: ClientSpec,
    pub rule: ReadyRule,
    pub hook: Option<Hook>,
    pub in_order: bool,
    pub delete_after_verified: bool,
    pub until: Option<String>,
    pub max_units: Option<u64>,
    /// Units shipped at once.
    pub parallel: usize,
    pub hook_retries: u32,
    pub state_dir: PathBuf,
    pub force_poll: bool,
    pub rate_window: Duration,
    /// Set (by a signal) to stop at once; the state resumes the rest.
    pub stop: Arc<AtomicBool>,
    /// Where one-line notes for the user go (the library prints nothing itself).
    pub say: Say,
}

/// Told each one-line note for the user: a retry, a hook failure, the polling fallback.
pub type Say = Arc<dyn Fn(&str) + Send + Sync>;

/// The usual transfer counters, summed over every unit shipped in this run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    pub bytes: u64,
    pub bytes_skipped: u64,
    pub bytes_total: u64,
    pub files_done: u64,
    pub files_skipped: u64,
    pub files_failed: u64,
    pub files_total: u64,
    pub streams: u64,
    pub reconnects: u64,
    pub bytes_resent: u64,
    pub chunks_resent: u64,
}

impl Totals {
    fn add(&mut self, p: &Progress) {
        self.bytes += Progress::get(&p.bytes);
        self.bytes_skipped += Progress::get(&p.bytes_skipped);
        self.bytes_total += Progress::get(&p.bytes_total);
        self.files_done += Progress::get(&p.files_done);
        self.files_skipped += Progress::get(&p.files_skipped);
        self.files_failed += Progress::get(&p.files_failed);
        self.files_total += Progress::get(&p.files_total);
        self.streams += Progress::get(&p.streams);
        self.reconnects += Progress::get(&p.reconnects);
        self.bytes_resent += Progress::get(&p.bytes_resent);
        self.chunks_resent += Progress::get(&p.chunks_resent);
    }
}

/// What a progress ticker shows; refreshed by the loop several times a second.
#[derive(Default)]
pub struct Shared {
    pub snapshot: Mutex<(Totals, WatchFields)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Why the watch ended: `until`, `max-units` or `signal`.
    pub ended: &'static str,
    pub fields: WatchFields,
    pub totals: Totals,
    pub errors: Vec<WatchError>,
    /// How file events were detected: `inotify` or `poll`.
    pub detection: &'static str,
}

/// A unit that failed, or whose hook failed, for the summary.
#[derive(Debug, Clone, Serialize)]
pub struct WatchError {
    /// The unit's name (the path of the source for a failed delete).
    pub path: String,
    /// `source`, `destination` or `network`, like a transfer's errors.
    pub side: &'static str,
    pub message: String,
}

const SHIP_ATTEMPTS: u32 = 5;

struct ShipJob {
    seq: u64,
    name: String,
    progress: Arc<Progress>,
}

struct ShipDone {
    seq: u64,
    progress: Arc<Progress>,
    result: Result<(), (&'static str, String)>,
}

struct HookDone {
    seq: u64,
    attempt: u32,
    result: Result<(), HookError>,
}

fn now_unix() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Where a unit lands: `DST/NAME`.
pub fn unit_dest(dst: &Endpoint, name: &str) -> Endpoint {
    let join = |p: &str| if p.is_empty() { name.to_string() } else { format!("{}/{name}", p.trim_end_matches('/')) };
    match dst {
        Endpoint::Local(p) => Endpoint::Local(p.join(name)),
        Endpoint::Ssh { host, port, path } => Endpoint::Ssh { host: host.clone(), port: *port, path: join(path) },
        Endpoint::Daemon { host, port, path } => Endpoint::Daemon { host: host.clone(), port: *port, path: join(path) },
    }
}

/// Ships one unit with the engine. Ok only if the engine verified every file at the destination.
fn ship(template: &ClientSpec, src: &Path, name: &str, progress: &Arc<Progress>) -> Result<(), (&'static str, String)> {
    let path = src.join(name);
    let is_dir = std::fs::symlink_metadata(&path).map_err(|e| ("source", format!("{}: cannot read: {e}", path.display())))?.is_dir();
    let mut spec = template.clone();
    // A directory's contents go into DST/NAME (created if needed), a file to DST/NAME: both
    // land in the same place on a re-run, where finished files are skipped and partial ones resume.
    spec.sources = vec![Endpoint::Local(if is_dir { path.join(".") } else { path })];
    spec.dest = unit_dest(&template.dest, name);
    spec.options.set_recursive(true);
    spec.options.set_contents(is_dir);
    let r = tern_engine::client::session::run(&spec, progress);
    let errors = progress.errors.lock().unwrap().clone();
    match r {
        Err(e) => Err((e.side.as_str(), e.to_string())),
        Ok(_) if !errors.is_empty() => Err((errors[0].side.as_str(), format!("{} (and {} more)", errors[0], errors.len() - 1))),
        Ok(_) if Progress::get(&progress.files_failed) > 0 => Err(("destination", format!("{} files failed", Progress::get(&progress.files_failed)))),
        Ok(_) => Ok(()),
    }
}

pub fn run(cfg: &Config, shared: &Shared) -> Result<Report, String> {
    let src_abs = cfg.src.canonicalize().map_err(|e| format!("{}: cannot watch: {e}", cfg.src.display()))?;
    let mut state = StateLog::open(&cfg.state_dir, &src_abs.display().to_string(), &endpoint_string(&cfg.template.dest))?;
    let (ev_tx, ev_rx) = unbounded();
    let (backend, why_poll) = crate::detect::start(&cfg.src, cfg.force_poll, ev_tx)?;
    if let Some(why) = &why_poll {
        (cfg.say)(&format!("polling {} once a second: {why}", cfg.src.display()));
    }
    let detection = if backend.sees_closes() { "inotify" } else { "poll" };
    let mut det = Detector::new(cfg.rule.clone(), &cfg.src, cfg.until.clone(), backend.sees_closes());
    // A unit the log named that has not appeared is reported after this long (once).
    det.missing_grace = cfg.rate_window.min(Duration::from_secs(30));

    let (job_tx, job_rx) = unbounded::<ShipJob>();
    let (done_tx, done_rx) = unbounded::<ShipDone>();
    for _ in 0..cfg.parallel.max(1) {
        let (job_rx, done_tx, template, src) = (job_rx.clone(), done_tx.clone(), cfg.template.clone(), cfg.src.clone());
        thread::spawn(move || {
            for job in job_rx.iter() {
                let result = ship(&template, &src, &job.name, &job.progress);
                if done_tx.send(ShipDone { seq: job.seq, progress: job.progress, result }).is_err() {
                    return;
                }
            }
        });
    }
    let (hook_tx, hook_rx) = unbounded::<(u64, HookEnv)>();
    let (hook_done_tx, hook_done_rx) = unbounded::<HookDone>();
    if let Some(h) = cfg.hook.clone() {
        thread::spawn(move || {
            for (seq, env) in hook_rx.iter() {
                let attempt = env.attempt;
                let result = hook::run(&h, &env);
                if hook_done_tx.send(HookDone { seq, attempt, result }).is_err() {
                    return;
                }
            }
        });
    }

    let mut lp = Loop {
        cfg,
        state: &mut state,
        live: HashMap::new(),
        finished: Totals::default(),
        ship_failures: HashMap::new(),
        ship_retry: Vec::new(),
        hook_busy: false,
        hook_retry: HashMap::new(),
        hook_net_since: HashMap::new(),
        errors: Vec::new(),
        job_tx,
        hook_tx,
        window: RateWindow::new(cfg.rate_window),
        marker: match &cfg.rule {
            ReadyRule::Marker { prefix, suffix, .. } => Some((prefix.clone(), suffix.clone())),
            _ => None,
        },
    };
    lp.resume()?;
    let mut last_scan = Instant::now() - Duration::from_secs(10);
    let ended = loop {
        if cfg.stop.load(Ordering::Relaxed) {
            break "signal";
        }
        let mut woke = false;
        select! {
            recv(ev_rx) -> ev => if let Ok(ev) = ev { det.on_event(&ev); woke = true; },
            recv(done_rx) -> d => if let Ok(d) = d { lp.shipped(d)?; },
            recv(hook_done_rx) -> h => if let Ok(h) = h { lp.hooked(h)?; },
            default(Duration::from_millis(200)) => {},
        }
        // Drain what else arrived, so a burst of events costs one scan.
        while let Ok(ev) = ev_rx.try_recv() {
            det.on_event(&ev);
            woke = true;
        }
        if last_scan.elapsed() >= Duration::from_secs(1) || (woke && last_scan.elapsed() >= Duration::from_millis(100)) {
            last_scan = Instant::now();
            let until_seen = cfg.until.as_ref().is_some_and(|u| cfg.src.join(u).exists());
            let room = cfg.max_units.map_or(u64::MAX, |m| m.saturating_sub(lp.state.next_seq()));
            if room > 0 {
                let state = &*lp.state;
                let ready = det.poll(&|n| state.known(n));
                for name in ready.into_iter().take(room.min(usize::MAX as u64) as usize) {
                    lp.ready(&name)?;
                }
            }
            if lp.all_finished() && lp.live.is_empty() {
                if cfg.max_units.is_some_and(|m| lp.state.next_seq() >= m) {
                    break "max-units";
                }
                if until_seen && det.pending() == 0 && lp.unready(&det).is_empty() {
                    break "until";
                }
            }
        }
        for note in det.take_notes() {
            (cfg.say)(&note);
        }
        lp.retry_due()?;
        lp.dispatch_hook()?;
        lp.publish(shared);
    };
    drop(backend);
    lp.publish(shared);
    if ended == "until" {
        let stuck = lp.unready_any(&det);
        if !stuck.is_empty() {
            let msg = format!("{} entries never became ready under --ready and were not shipped: {}", stuck.len(), stuck.join(", "));
            (cfg.say)(&msg);
            lp.errors.push(WatchError { path: cfg.src.display().to_string(), side: "source", message: msg });
        }
    }
    let (totals, fields) = shared.snapshot.lock().unwrap().clone();
    Ok(Report { ended, fields, totals, errors: lp.errors, detection })
}

fn endpoint_string(e: &Endpoint) -> String {
    match e {
        Endpoint::Local(p) => p.display().to_string(),
        Endpoint::Ssh { host, port: None, path } => format!("{host}:{path}"),
        Endpoint::Ssh { .. } => e.display(),
        Endpoint::Daemon { host, port, path } => format!("tern://{host}:{port}{path}"),
    }
}

struct Loop<'a> {
    cfg: &'a Config,
    state: &'a mut StateLog,
    live: HashMap<u64, Arc<Progress>>,
    finished: Totals,
    ship_failures: HashMap<u64, u32>,
    ship_retry: Vec<(Instant, u64)>,
    hook_busy: bool,
    hook_retry: HashMap<u64, Instant>,
    /// Since when the destination has been unreachable for this unit's hook.
    hook_net_since: HashMap<u64, Instant>,
    errors: Vec<WatchError>,
    job_tx: Sender<ShipJob>,
    hook_tx: Sender<(u64, HookEnv)>,
    window: RateWindow,
    marker: Option<(String, String)>,
}

impl Loop<'_> {
    /// After a restart: ship what was not verified, delete what was verified but not deleted.
    fn resume(&mut self) -> Result<(), String> {
        let seqs: Vec<u64> = self.state.units.iter().map(|u| u.seq).collect();
        for seq in seqs {
            let u = self.state.unit(seq);
            if u.failed.is_some() {
                continue;
            }
            if u.verified_at.is_none() {
                self.enqueue(seq)?;
            } else {
                self.delete_if_asked(seq)?;
            }
        }
        Ok(())
    }

    fn ready(&mut self, name: &str) -> Result<(), String> {
        let m = units::measure(&self.cfg.src.join(name)).unwrap_or_default();
        let seq = self.state.next_seq();
        self.state.record(Event::Ready { seq, unit: name.to_string(), bytes: m.bytes, files: m.files, at: now_unix() })?;
        tracing::info!("{name}: ready ({} files, {} bytes)", m.files, m.bytes);
        self.enqueue(seq)
    }

    fn enqueue(&mut self, seq: u64) -> Result<(), String> {
        self.state.record(Event::Shipping { seq, at: now_unix() })?;
        let progress = Arc::new(Progress::default());
        self.live.insert(seq, progress.clone());
        let name = self.state.unit(seq).name.clone();
        self.job_tx.send(ShipJob { seq, name, progress }).map_err(|_| "the ship workers stopped".to_string())
    }

    fn shipped(&mut self, d: ShipDone) -> Result<(), String> {
        self.live.remove(&d.seq);
        self.finished.add(&d.progress);
        let name = self.state.unit(d.seq).name.clone();
        match d.result {
            Ok(()) => {
                self.state.record(Event::Verified { seq: d.seq, at: now_unix(), bytes_sent: Progress::get(&d.progress.bytes) })?;
                tracing::info!("{name}: verified at the destination");
                self.delete_if_asked(d.seq)?;
            }
            Err((side, e)) => {
                let n = self.ship_failures.entry(d.seq).or_insert(0);
                *n += 1;
                if *n >= SHIP_ATTEMPTS {
                    let msg = format!("{name}: not shipped after {SHIP_ATTEMPTS} attempts: {e}");
                    (self.cfg.say)(&msg);
                    self.errors.push(WatchError { path: name.clone(), side, message: msg });
                    self.state.record(Event::Failed { seq: d.seq, error: e, at: now_unix() })?;
                } else {
                    let wait = Duration::from_secs(2u64.pow(*n).min(60));
                    (self.cfg.say)(&format!("{name}: shipping failed: {e}; retrying in {} s (attempt {} of {SHIP_ATTEMPTS})", wait.as_secs(), *n + 1));
                    self.ship_retry.push((Instant::now() + wait, d.seq));
                }
            }
        }
        Ok(())
    }

    fn delete_if_asked(&mut self, seq: u64) -> Result<(), String> {
        let u = self.state.unit(seq);
        if !self.cfg.delete_after_verified || u.deleted || u.verified_at.is_none() {
            return Ok(());
        }
        let name = u.name.clone();
        let path = self.cfg.src.join(&name);
        if let Err(e) = units::remove(&path) {
            // Not fatal: the unit is safe at the destination; the source just keeps it.
            let msg = format!("{}: verified at the destination but cannot delete it at the source: {e} (check permissions; remove it by hand)", path.display());
            (self.cfg.say)(&msg);
            self.errors.push(WatchError { path: path.display().to_string(), side: "source", message: msg });
            return Ok(());
        }
        if let Some((prefix, suffix)) = &self.marker {
            let _ = units::remove(&self.cfg.src.join(format!("{prefix}{name}{suffix}")));
        }
        self.state.record(Event::Deleted { seq, at: now_unix() })
    }

    fn retry_due(&mut self) -> Result<(), String> {
        let now = Instant::now();
        let due: Vec<u64> = self.ship_retry.iter().filter(|(t, _)| *t <= now).map(|(_, s)| *s).collect();
        self.ship_retry.retain(|(t, _)| *t > now);
        for seq in due {
            self.enqueue(seq)?;
        }
        Ok(())
    }

    /// Starts the next hook if none runs: the lowest unit whose hook is due, and with
    /// `--in-order` only if every unit produced before it is hooked.
    fn dispatch_hook(&mut self) -> Result<(), String> {
        if self.cfg.hook.is_none() || self.hook_busy {
            return Ok(());
        }
        let now = Instant::now();
        let mut pick = None;
        for u in &self.state.units {
            if u.failed.is_some() || matches!(u.hook, HookState::Done | HookState::Failed(_)) {
                continue;
            }
            let due = u.verified_at.is_some() && self.hook_retry.get(&u.seq).is_none_or(|t| *t <= now);
            if due {
                pick = Some(u.seq);
                break;
            }
            if self.cfg.in_order {
                break;
            }
        }
        let Some(seq) = pick else { return Ok(()) };
        self.hook_retry.remove(&seq);
        let u = self.state.unit(seq);
        // A network retry repeats the attempt it could not deliver; anything else is a new one.
        let attempt = if self.hook_net_since.contains_key(&seq) { u.hook_attempts.max(1) } else { u.hook_attempts + 1 };
        if attempt != u.hook_attempts {
            self.state.record(Event::HookStart { seq, attempt, at: now_unix() })?;
        }
        let u = self.state.unit(seq);
        let unit_path = match unit_dest(&self.cfg.template.dest, &u.name) {
            Endpoint::Local(p) => p.display().to_string(),
            Endpoint::Ssh { path, .. } | Endpoint::Daemon { path, .. } => path,
        };
        let env = HookEnv { unit_path, name: u.name.clone(), seq, attempt };
        self.hook_busy = true;
        self.hook_tx.send((seq, env)).map_err(|_| "the hook runner stopped".to_string())
    }

    fn hooked(&mut self, h: HookDone) -> Result<(), String> {
        self.hook_busy = false;
        let name = self.state.unit(h.seq).name.clone();
        let limit = 1 + self.cfg.hook_retries;
        match h.result {
            Ok(()) => {
                self.hook_net_since.remove(&h.seq);
                tracing::info!("{name}: hook done (attempt {})", h.attempt);
                self.state.record(Event::Hooked { seq: h.seq, at: now_unix() })
            }
            Err(e) if e.network && self.hook_net_since.entry(h.seq).or_insert_with(Instant::now).elapsed() < self.cfg.template.retry_for => {
                (self.cfg.say)(&format!("{name}: cannot reach the destination to run the hook: {}; retrying in 2 s", e.message));
                self.hook_retry.insert(h.seq, Instant::now() + Duration::from_secs(2));
                Ok(())
            }
            Err(e) => {
                self.hook_net_since.remove(&h.seq);
                if h.attempt < limit {
                    let wait = Duration::from_secs(2u64.pow(h.attempt).min(60));
                    (self.cfg.say)(&format!("{name}: hook failed (attempt {} of {limit}): {}; retrying in {} s", h.attempt, e.message, wait.as_secs()));
                    self.hook_retry.insert(h.seq, Instant::now() + wait);
                    Ok(())
                } else {
                    let msg = format!("{name}: hook failed {limit} times, giving up on it: {}", e.message);
                    (self.cfg.say)(&msg);
                    self.errors.push(WatchError { path: name.clone(), side: "destination", message: msg });
                    self.state.record(Event::HookFailed { seq: h.seq, error: e.message, at: now_unix() })
                }
            }
        }
    }

    fn all_finished(&self) -> bool {
        self.state.units.iter().all(|u| stats::finished(u, self.cfg.hook.is_some(), self.cfg.delete_after_verified))
    }

    /// Entries that may still become ready by themselves (`close`, `stable`): a watch told to
    /// end waits for them.
    fn unready(&self, det: &Detector) -> Vec<String> {
        match self.cfg.rule {
            // `close` ships files only: a directory never becomes ready by itself.
            ReadyRule::Close => self.unready_any(det).into_iter().filter(|n| self.cfg.src.join(n).is_file()).collect(),
            ReadyRule::Stable(_) => self.unready_any(det),
            _ => Vec::new(),
        }
    }

    fn unready_any(&self, det: &Detector) -> Vec<String> {
        let excluded: HashSet<String> = match &self.cfg.rule {
            ReadyRule::Marker { glob, .. } => units::top_level(&self.cfg.src).unwrap_or_default().into_iter().filter(|n| glob.is_match(n)).collect(),
            _ => HashSet::new(),
        };
        let full = self.cfg.max_units.is_some_and(|m| self.state.next_seq() >= m);
        if full {
            return Vec::new();
        }
        units::top_level(&self.cfg.src).unwrap_or_default().into_iter().filter(|n| !self.state.known(n) && !det.is_until(n) && !excluded.contains(n)).collect()
    }

    fn publish(&mut self, shared: &Shared) {
        let mut totals = self.finished.clone();
        for p in self.live.values() {
            totals.add(p);
        }
        // Streams are a live count, not a sum over finished units.
        totals.streams = self.live.values().map(|p| Progress::get(&p.streams)).sum();
        let produced: u64 = self.state.units.iter().map(|u| u.bytes).sum();
        let backlog: u64 = self.state.units.iter().filter(|u| u.verified_at.is_none() && u.failed.is_none()).map(|u| u.bytes).sum();
        let moved = totals.bytes + totals.bytes_skipped;
        let rates = self.window.sample(Instant::now(), moved, produced, backlog);
        let fields = stats::compute(&self.state.units, self.cfg.hook.is_some(), self.cfg.delete_after_verified, now_unix(), rates, self.window.span());
        *shared.snapshot.lock().unwrap() = (totals, fields);
    }
}
