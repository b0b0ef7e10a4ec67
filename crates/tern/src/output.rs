//! What the user sees: a live progress line on a terminal, the final report, `--json`.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use tern_engine::error::TransferError;
use tern_engine::progress::Progress;
use tern_proto::msg::Summary;

pub struct Display {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Display {
    /// A 10 Hz ticker reads the counters; the engine never touches the terminal.
    pub fn start(p: Arc<Progress>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let bar = ProgressBar::new(0);
            bar.set_style(ProgressStyle::with_template("{spinner} {bytes:>10}/{total_bytes:<10} {wide_bar} {binary_bytes_per_sec:>12} ETA {eta:>4} {msg}").unwrap().progress_chars("=> "));
            while !s.load(Ordering::Relaxed) {
                let total = Progress::get(&p.bytes_total);
                let done = (Progress::get(&p.bytes) - Progress::get(&p.bytes_resent)).min(total) + Progress::get(&p.bytes_skipped);
                bar.set_length(total.max(done));
                bar.set_position(done);
                let files = Progress::get(&p.files_done) + Progress::get(&p.files_skipped);
                bar.set_message(format!("{files}/{} files, {} streams", Progress::get(&p.files_total), Progress::get(&p.streams)));
                std::thread::sleep(Duration::from_millis(100));
            }
            bar.finish_and_clear();
        });
        Self { stop, thread }
    }

    pub fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// One JSON line per second on stdout with the counters, for a supervising process.
pub struct JsonTicker {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl JsonTicker {
    pub fn start(p: Arc<Progress>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let started = std::time::Instant::now();
            while !s.load(Ordering::Relaxed) {
                let line = json!({ "progress": {
                    "seconds": started.elapsed().as_secs_f64(),
                    "bytes": Progress::get(&p.bytes),
                    "bytes_skipped": Progress::get(&p.bytes_skipped),
                    "bytes_total": Progress::get(&p.bytes_total),
                    "files_done": Progress::get(&p.files_done),
                    "files_skipped": Progress::get(&p.files_skipped),
                    "files_failed": Progress::get(&p.files_failed),
                    "files_total": Progress::get(&p.files_total),
                    "streams": Progress::get(&p.streams),
                    "reconnects": Progress::get(&p.reconnects),
                }});
                println!("{line}");
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

    pub fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

fn error_json(e: &TransferError) -> serde_json::Value {
    json!({ "path": e.path, "side": e.side.as_str(), "kind": e.kind.as_str(), "message": e.message })
}

/// Prints the outcome and picks the exit status: 0 only if every file landed verified.
pub fn report(p: &Progress, result: Result<Summary, TransferError>, seconds: f64, as_json: bool, dry_run: bool) -> ExitCode {
    let errors = p.errors.lock().unwrap().clone();
    let ok = result.is_ok() && errors.is_empty() && Progress::get(&p.files_failed) == 0;
    let bytes = Progress::get(&p.bytes);
    // Entries that did not land, counted the same way everywhere: failed files, and entries the
    // engine reported with a path (a refused link, a FIFO it skipped), whichever says more.
    let failed = Progress::get(&p.files_failed).max(errors.iter().filter(|e| e.path.is_some()).count() as u64 + Progress::get(&p.errors_omitted));
    // Errors always go to stderr, one line each, so scripts' logs show them even with --json.
    {
        let stderr = std::io::stderr();
        let mut err = stderr.lock();
        for e in errors.iter().take(20) {
            let _ = writeln!(err, "tern: {e}");
        }
        let more = errors.len().saturating_sub(20) as u64 + Progress::get(&p.errors_omitted);
        if more > 0 {
            let _ = writeln!(err, "tern: ... and {more} more errors");
        }
        if let Err(e) = &result {
            let _ = writeln!(err, "tern: {e}");
        }
    }
    if as_json {
        let mut all: Vec<_> = errors.iter().map(error_json).collect();
        if let Err(e) = &result {
            all.push(error_json(e));
        }
        let v = json!({
            "ok": ok,
            "files": Progress::get(&p.files_done),
            "files_skipped": Progress::get(&p.files_skipped),
            "files_failed": failed,
            "bytes": bytes,
            "bytes_skipped": Progress::get(&p.bytes_skipped),
            "seconds": seconds,
            "bytes_resent": Progress::get(&p.bytes_resent),
            "chunks_resent": Progress::get(&p.chunks_resent),
            "reconnects": Progress::get(&p.reconnects),
            "deleted": Progress::get(&p.deleted),
            "errors": all,
            "errors_omitted": Progress::get(&p.errors_omitted),
            "plan": *p.plan.lock().unwrap(),
        });
        println!("{v}");
    } else {
        if dry_run {
            for line in p.plan.lock().unwrap().iter() {
                println!("{line}");
            }
        }
        if std::io::IsTerminal::is_terminal(&std::io::stderr()) && !dry_run {
            let rate = bytes as f64 / seconds.max(1e-9);
            let not_landed = if failed > 0 { format!(", {failed} did not (see above)") } else { String::new() };
            eprintln!(
                "{} {} files copied{not_landed} ({} skipped), {:.2} GB in {:.1} s, {:.2} Gb/s",
                if ok { "done:" } else { "FAILED:" },
                Progress::get(&p.files_done),
                Progress::get(&p.files_skipped),
                bytes as f64 / 1e9,
                seconds,
                rate * 8.0 / 1e9
            );
        }
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
}
