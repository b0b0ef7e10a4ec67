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

/// `s` with control characters escaped (`\n`, `\t`, `\r`, `\x1b`, `\u{9b}`...): file names
/// come from the far side, and a name holding terminal escapes must not clear the user's screen,
/// retitle the window or overwrite an earlier line (as scp's CVE-2019-6109 fix and rsync's
/// `\#ooo` escaping do).
pub(crate) fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x80 && c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Decimal units everywhere (live display, summary, `tern status`, dashboard): sizes in kB, MB,
/// GB, TB as disks and networks are sold, rates in MB/s with Gb/s beside them where a network
/// rate is the question.
pub(crate) mod units {
    pub(crate) fn size(bytes: u64) -> String {
        let b = bytes as f64;
        match b {
            b if b >= 1e12 => format!("{:.2} TB", b / 1e12),
            b if b >= 1e9 => format!("{:.2} GB", b / 1e9),
            b if b >= 1e6 => format!("{:.1} MB", b / 1e6),
            b if b >= 1e3 => format!("{:.1} kB", b / 1e3),
            _ => format!("{bytes} B"),
        }
    }

    pub(crate) fn rate(bytes_per_s: f64) -> String {
        format!("{}/s", size(bytes_per_s.max(0.0) as u64))
    }

    pub(crate) fn bits(bytes_per_s: f64) -> String {
        format!("{:.2} Gb/s", bytes_per_s.max(0.0) * 8.0 / 1e9)
    }

    pub(crate) fn duration(secs: f64) -> String {
        let s = secs.max(0.0).round() as u64;
        match s {
            s if s >= 3600 => format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60),
            s => format!("{}:{:02}", s / 60, s % 60),
        }
    }
}

/// The rate of bytes that crossed the network (resends excluded, data already at the
/// destination excluded) over the last few seconds, so a resume or an outage does not show as
/// a burst or a stale rate.
struct RateWindow {
    samples: std::collections::VecDeque<(std::time::Instant, u64)>,
    span: Duration,
}

impl RateWindow {
    fn new(span: Duration) -> Self {
        Self { samples: Default::default(), span }
    }

    fn sample(&mut self, p: &Progress) -> f64 {
        let now = std::time::Instant::now();
        let moved = Progress::get(&p.bytes).saturating_sub(Progress::get(&p.bytes_resent));
        self.samples.push_back((now, moved));
        while self.samples.len() > 2 && now.duration_since(self.samples[0].0) > self.span {
            self.samples.pop_front();
        }
        let (t0, b0) = self.samples[0];
        let dt = now.duration_since(t0).as_secs_f64();
        if dt < 0.5 { 0.0 } else { moved.saturating_sub(b0) as f64 / dt }
    }
}

/// What a display shows at one moment, the same for the terminal and `--progress-json`.
struct Snapshot {
    done: u64,
    total: u64,
    rate: f64,
    eta: Option<f64>,
    reconnecting: bool,
}

fn snapshot(p: &Progress, window: &mut RateWindow) -> Snapshot {
    let rate = window.sample(p);
    let reconnecting = p.reconnecting.load(Ordering::Relaxed);
    let (done, total) = p.whole();
    let total = total.max(done);
    let eta = (rate > 0.0 && !reconnecting).then(|| total.saturating_sub(done) as f64 / rate);
    Snapshot { done, total, rate, eta, reconnecting }
}

pub(crate) struct Display {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
    bar: ProgressBar,
}

impl Display {
    /// A 10 Hz ticker reads the counters; the engine never touches the terminal.
    pub(crate) fn start(p: Arc<Progress>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let bar = ProgressBar::new(0);
        bar.set_style(ProgressStyle::with_template("{spinner} {prefix:>21} {wide_bar} {msg}").unwrap().progress_chars("=> "));
        let b = bar.clone();
        let thread = std::thread::spawn(move || {
            let mut window = RateWindow::new(Duration::from_secs(5));
            while !s.load(Ordering::Relaxed) {
                let now = snapshot(&p, &mut window);
                b.set_length(now.total);
                b.set_position(now.done);
                b.set_prefix(format!("{}/{}", units::size(now.done), units::size(now.total)));
                let files = Progress::get(&p.files_done) + Progress::get(&p.files_skipped);
                let state = if now.reconnecting {
                    format!("reconnecting (network failure {}), will resume", Progress::get(&p.reconnects))
                } else {
                    let eta = now.eta.map(units::duration).unwrap_or_else(|| "-".into());
                    format!("{:>10} ETA {eta:>5}  {files}/{} files, {} streams", units::rate(now.rate), Progress::get(&p.files_total), Progress::get(&p.streams))
                };
                b.set_message(state);
                std::thread::sleep(Duration::from_millis(100));
            }
            b.finish_and_clear();
        });
        Self { stop, thread, bar }
    }

    pub(crate) fn bar(&self) -> ProgressBar {
        self.bar.clone()
    }

    pub(crate) fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// One JSON line per second on stdout with the counters, for a supervising process:
/// `{"type": "progress", "progress": {...}}`; the final `--json` object has `"type": "summary"`.
pub(crate) struct JsonTicker {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl JsonTicker {
    pub(crate) fn start(p: Arc<Progress>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let mut window = RateWindow::new(Duration::from_secs(5));
            while !s.load(Ordering::Relaxed) {
                let now = snapshot(&p, &mut window);
                let line = json!({ "type": "progress", "progress": {
                    "seconds": started.elapsed().as_secs_f64(),
                    "state": if now.reconnecting { "reconnecting" } else { "running" },
                    "bytes": Progress::get(&p.bytes),
                    "bytes_skipped": Progress::get(&p.bytes_skipped),
                    "bytes_total": Progress::get(&p.bytes_total),
                    "bytes_done_overall": now.done,
                    "bytes_total_overall": now.total,
                    "rate_bytes_per_s": now.rate.round(),
                    "eta_s": now.eta.map(|e| e.round()),
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

    pub(crate) fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

fn error_json(e: &TransferError) -> serde_json::Value {
    json!({ "path": e.path, "side": e.side.as_str(), "at": e.at, "kind": e.kind.as_str(), "message": e.message })
}

/// Prints the outcome and picks the exit status: 0 only if every file landed verified.
pub(crate) fn report(p: &Progress, result: Result<Summary, TransferError>, seconds: f64, as_json: bool, dry_run: bool, quiet: bool) -> ExitCode {
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
            let _ = writeln!(err, "tern: {}", printable(&e.to_string()));
        }
        let more = errors.len().saturating_sub(20) as u64 + Progress::get(&p.errors_omitted);
        if more > 0 {
            let _ = writeln!(err, "tern: ... and {more} more errors");
        }
        if let Err(e) = &result {
            let _ = writeln!(err, "tern: {}", printable(&e.to_string()));
        }
    }
    if as_json {
        let mut all: Vec<_> = errors.iter().map(error_json).collect();
        if let Err(e) = &result {
            all.push(error_json(e));
        }
        let mut v = json!({
            "type": "summary",
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
        if let Some(nodes) = crate::spread::pairs_json() {
            v["nodes"] = nodes;
        }
        println!("{v}");
    } else {
        if dry_run {
            for line in p.plan.lock().unwrap().iter() {
                println!("{line}");
            }
        }
        if std::io::IsTerminal::is_terminal(&std::io::stderr()) && !dry_run && !(quiet && ok) {
            let rate = bytes as f64 / seconds.max(1e-9);
            let not_landed = if failed > 0 { format!(", {failed} did not (see above)") } else { String::new() };
            eprintln!(
                "{} {} files copied{not_landed} ({} skipped), {} in {:.1} s, {} ({})",
                if ok { "done:" } else { "FAILED:" },
                Progress::get(&p.files_done),
                Progress::get(&p.files_skipped),
                units::size(bytes),
                seconds,
                units::rate(rate),
                units::bits(rate)
            );
        }
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_are_shown_escaped_and_the_rest_as_is() {
        assert_eq!(printable("plain/ünïcode name.h5"), "plain/ünïcode name.h5");
        assert_eq!(printable("x\u{1b}[2J\u{1b}]0;pwned\u{7}\rfake\nline\tt\u{9b}"), "x\\x1b[2J\\x1b]0;pwned\\x07\\rfake\\nline\\tt\\u{9b}");
        assert!(!printable("a\u{7f}b").contains('\u{7f}'));
    }
}
