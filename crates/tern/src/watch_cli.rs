//! `tern watch`: arguments → a `tern_watch::Config`, progress lines, the final report.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Args;
use serde_json::json;
use tern_engine::endpoint::Endpoint;
use tern_watch::hook::Hook;
use tern_watch::{ReadyRule, Shared};

use crate::args::Common;

#[derive(Args)]
pub(crate) struct WatchArgs {
    /// The directory the producer writes into; each top-level file or directory is a unit.
    src_dir: PathBuf,
    /// Where units land, as DST/NAME: a path, [user@]host:path or tern://host[:port]/path.
    dst: String,
    /// When a unit is complete: close (file closed after writing), marker:GLOB (e.g.
    /// marker:'*.done'), log:FILE:REGEX (e.g. log:sim.log:'^XFER (\S+)'), stable:SECONDS.
    #[arg(long, default_value = "close")]
    ready: String,
    /// Run at the destination once a unit verified, with TERN_UNIT_PATH set: a shell command
    /// (local or ssh destination) or the name of a hook the daemon registered (tern://).
    #[arg(long, value_name = "HOOK")]
    on_arrival: Option<String>,
    /// Hand units to the hook strictly in production order.
    #[arg(long)]
    in_order: bool,
    /// Delete a unit at the source once the destination verified it (move semantics).
    #[arg(long)]
    delete_after_verified: bool,
    /// End once SRC_DIR/FILE exists and every unit is done (the producer writes it last).
    #[arg(long, value_name = "FILE")]
    until: Option<String>,
    /// End after N units are done.
    #[arg(long, value_name = "N")]
    max_units: Option<u64>,
    /// Units shipped at once.
    #[arg(long, default_value = "2")]
    parallel: usize,
    /// Retries of a failing hook before it is reported failed.
    #[arg(long, default_value = "3")]
    hook_retries: u32,
    /// Where the watch keeps its durable state (default: ~/.local/state/tern/watch/<hash>).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Poll the directory instead of using inotify (automatic on NFS, Lustre, GPFS, ...).
    #[arg(long)]
    poll: bool,
    /// Seconds over which rates and the ETA warning are judged.
    #[arg(long, default_value = "60")]
    rate_window: u64,
    #[command(flatten)]
    pub(crate) common: Common,
}

pub(crate) fn run(a: WatchArgs) -> Result<ExitCode> {
    let c = &a.common;
    if c.files_from.is_some() {
        anyhow::bail!("--files-from does not apply to tern watch (it ships whole units as they appear)");
    }
    if c.dry_run {
        bail!("tern watch has no --dry-run");
    }
    if c.fail_fast {
        bail!("tern watch has no --fail-fast (it applies to tern cp and tern sync)");
    }
    let src_str = a.src_dir.display().to_string();
    if !a.src_dir.is_dir() {
        bail!("{src_str}: not a directory (tern watch runs where the output is written and watches a local directory)");
    }
    let rule = ReadyRule::parse(&a.ready).map_err(anyhow::Error::msg)?;
    if let Some(u) = &a.until
        && (u.contains('/') || u.starts_with('.') || u.is_empty())
    {
        bail!("--until {u}: give a plain file name in {src_str} (not hidden)");
    }
    let mut dst = a.dst.clone();
    if let Endpoint::Local(p) = Endpoint::parse(&dst).map_err(anyhow::Error::msg)? {
        let made = match &c.dst_beneath {
            // A service's watch job: made beneath the job's fence, through no link that leaves it.
            Some(fence) => tern_engine::store::fsops::Beneath::open(fence)
                .and_then(|b| tern_engine::store::fsops::DestRoot::open(Some(&b), fence))
                .and_then(|root| root.mkdir_all(p.strip_prefix(fence).map_err(|_| std::io::Error::from_raw_os_error(libc::EXDEV))?.as_os_str().as_encoded_bytes()))
                .map(|_| ()),
            None => std::fs::create_dir_all(&p).and_then(|()| p.canonicalize()).map(|real| dst = real.display().to_string()),
        };
        made.map_err(|e| anyhow::anyhow!("destination: {}: cannot create the destination directory: {e}", p.display()))?;
    }
    let template = crate::transfer::client_spec(std::slice::from_ref(&src_str), &dst, true, false, false, crate::transfer::Delete::default(), c)?;
    if !template.dest.is_local() {
        // A remote DST that does not exist yet is made once, as a local one is above (each
        // unit then lands inside it): an empty directory's contents copied to it.
        let empty = tempfile::tempdir()?;
        let mut make = template.clone();
        make.sources = vec![Endpoint::Local(empty.path().join("."))];
        make.options.set_contents(true);
        make.files_from = None;
        // The empty source is ours, not beneath the job's source fence.
        make.fences.src = None;
        tern_engine::client::session::run(&make, &Arc::new(tern_engine::progress::Progress::default())).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let hook = a.on_arrival.as_deref().map(|h| Hook::for_destination(&template, h));
    let state_dir = match &a.state_dir {
        Some(d) => d.clone(),
        None => default_state_dir(&a.src_dir, &dst)?,
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let cfg = tern_watch::Config {
        src: a.src_dir.clone(),
        template,
        rule,
        hook,
        in_order: a.in_order,
        delete_after_verified: a.delete_after_verified,
        until: a.until.clone(),
        max_units: a.max_units,
        parallel: a.parallel.clamp(1, 64),
        hook_retries: a.hook_retries.min(100),
        state_dir,
        force_poll: a.poll,
        rate_window: Duration::from_secs(a.rate_window.max(2)),
        stop,
        say: Arc::new(|note: &str| eprintln!("tern watch: {note}")),
    };
    let shared = Arc::new(Shared::default());
    let started = Instant::now();
    let ticker = c.progress_json.then(|| Ticker::start(shared.clone(), started));
    let result = tern_watch::run(&cfg, &shared);
    if let Some(t) = ticker {
        t.finish();
    }
    let seconds = started.elapsed().as_secs_f64();
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tern watch: {e}");
            if c.json {
                println!("{}", json!({ "ok": false, "seconds": seconds, "files_failed": 0, "errors": [{ "path": src_str, "side": "source", "message": e }] }));
            }
            return Ok(ExitCode::from(1));
        }
    };
    let ok = report.errors.is_empty() && report.ended != "signal";
    let (t, f) = (&report.totals, &report.fields);
    if c.json {
        println!(
            "{}",
            json!({
                "ok": ok,
                "ended": report.ended,
                "detection": report.detection,
                "units": f.units_done,
                "units_seen": f.units_seen,
                "units_failed": f.units_failed,
                "hooks_failed": f.hooks_failed,
                "backlog_units": f.backlog_units,
                "lag_seconds": f.lag_seconds,
                "files": t.files_done,
                "files_skipped": t.files_skipped,
                "files_failed": t.files_failed,
                "bytes": t.bytes,
                "bytes_skipped": t.bytes_skipped,
                "bytes_resent": t.bytes_resent,
                "chunks_resent": t.chunks_resent,
                "reconnects": t.reconnects,
                "seconds": seconds,
                "errors": report.errors,
            })
        );
    } else if !c.quiet {
        eprintln!(
            "{} {} units ({} failed, {} hooks failed), {} in {:.1} s, lag {:.1} s, ended by {}",
            if ok { "done:" } else { "FAILED:" },
            f.units_done,
            f.units_failed,
            f.hooks_failed,
            crate::output::units::size(t.bytes),
            seconds,
            f.lag_seconds,
            report.ended
        );
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `$XDG_STATE_HOME/tern/watch/<hash>` or `~/.local/state/...`: the same SRC_DIR and DST find
/// their state again after a restart.
fn default_state_dir(src: &std::path::Path, dst: &str) -> Result<PathBuf> {
    let base = match (std::env::var_os("XDG_STATE_HOME"), std::env::var_os("HOME")) {
        (Some(x), _) if !x.is_empty() => PathBuf::from(x),
        (_, Some(h)) => PathBuf::from(h).join(".local/state"),
        _ => bail!("no HOME to keep the watch state in; pass --state-dir DIR"),
    };
    let key = format!("{}\n{dst}", src.canonicalize()?.display());
    let hash = blake3::hash(key.as_bytes()).to_hex();
    Ok(base.join("tern/watch").join(&hash.as_str()[..16]))
}

/// One JSON progress line per second on stdout: the usual counters plus `watch`.
struct Ticker {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Ticker {
    fn start(shared: Arc<Shared>, started: Instant) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let print = move || {
            let (t, f) = shared.snapshot.lock().unwrap().clone();
            let mut p = serde_json::to_value(&t).unwrap_or_default();
            p["seconds"] = json!(started.elapsed().as_secs_f64());
            p["watch"] = serde_json::to_value(&f).unwrap_or_default();
            println!("{}", json!({ "progress": p }));
        };
        let thread = std::thread::spawn(move || {
            loop {
                print();
                if s.load(Ordering::Relaxed) {
                    // One last line with the final state, so a supervisor's last view is the end.
                    break;
                }
                for _ in 0..10 {
                    if s.load(Ordering::Relaxed) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        });
        Self { stop, thread }
    }

    fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}
