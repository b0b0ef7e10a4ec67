//! Ready rules: when a unit is complete and may be shipped. A unit being written must never be
//! shipped half-done, so every rule waits for an explicit or observed "finished".

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::units::{self, Measure};

/// How long `close` waits for a file it saw no close event for (present at start, after an
/// event-queue overflow, or when polling).
pub const CLOSE_FALLBACK: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub enum ReadyRule {
    /// A top-level file closed after writing (inotify `IN_CLOSE_WRITE`).
    Close,
    /// A marker file matching the glob names the unit it completes.
    Marker { glob: globset::GlobMatcher, prefix: String, suffix: String },
    /// A line of the log matching the regex names a unit (group 1, or the whole match).
    Log { file: PathBuf, regex: regex::Regex },
    /// Size, file count and newest mtime unchanged for this long.
    Stable(Duration),
}

impl ReadyRule {
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "close" {
            return Ok(ReadyRule::Close);
        }
        if let Some(g) = s.strip_prefix("marker:") {
            let glob = globset::Glob::new(g).map_err(|e| format!("--ready {s}: bad glob: {}", e.kind()))?.compile_matcher();
            let (Some(first), Some(last)) = (g.find('*'), g.rfind('*')) else {
                return Err(format!("--ready {s}: the glob needs a '*' standing for the unit's name, e.g. marker:'*.done'"));
            };
            return Ok(ReadyRule::Marker { glob, prefix: g[..first].to_string(), suffix: g[last + 1..].to_string() });
        }
        if let Some(rest) = s.strip_prefix("log:") {
            let Some((file, re)) = rest.split_once(':') else {
                return Err(format!("--ready {s}: expected log:FILE:REGEX, e.g. log:sim.log:'^XFER (\\S+)'"));
            };
            let regex = regex::Regex::new(re).map_err(|e| format!("--ready {s}: bad regex: {}", e.to_string().lines().last().unwrap_or("")))?;
            return Ok(ReadyRule::Log { file: PathBuf::from(file), regex });
        }
        if let Some(secs) = s.strip_prefix("stable:") {
            let n: f64 = secs.parse().ok().filter(|n: &f64| *n > 0.0).ok_or_else(|| format!("--ready {s}: expected stable:SECONDS, e.g. stable:30"))?;
            return Ok(ReadyRule::Stable(Duration::from_secs_f64(n)));
        }
        Err(format!("--ready {s}: unknown rule; use close, marker:GLOB, log:FILE:REGEX or stable:SECONDS"))
    }

    /// Files of the watched directory that are never units under this rule.
    fn excludes(&self, name: &str) -> bool {
        match self {
            ReadyRule::Marker { glob, .. } => glob.is_match(name),
            _ => false,
        }
    }
}

/// Turns the rule, file events and periodic scans into "these units are ready now", in
/// production order.
pub struct Detector {
    rule: ReadyRule,
    src: PathBuf,
    canon_src: PathBuf,
    until: Option<String>,
    /// Whether close events can be trusted (inotify up and no overflow since the last scan).
    events_ok: bool,
    closed: Vec<String>,
    /// `close`: files that need the stability fallback (no event will come for them).
    unvouched: HashSet<String>,
    stable: HashMap<String, (Measure, Instant)>,
    log_offset: u64,
    log_partial: Vec<u8>,
    log_pending: VecDeque<String>,
    /// Lines read from the log, and where each pending unit was named (line number, text).
    log_lines: u64,
    named_at: HashMap<String, (u64, String)>,
    /// The unit at the head of the log's order that does not exist yet, since when.
    head_missing: Option<(String, Instant)>,
    /// Units a `tern-skip NAME` line in the log told us to pass over.
    skipped: HashSet<String>,
    /// How long a unit the log named may be missing before the watch says so (once).
    pub missing_grace: Duration,
    warned: HashSet<String>,
    /// One-line notes for the user since the last `take_notes` (the watcher passes them on).
    notes: Vec<String>,
}

/// A log line `tern-skip NAME` passes over a unit the log named that will never appear.
const SKIP_PREFIX: &str = "tern-skip ";

impl Detector {
    pub fn new(rule: ReadyRule, src: &Path, until: Option<String>, events_ok: bool) -> Self {
        let mut d = Self {
            canon_src: src.canonicalize().unwrap_or_else(|_| src.to_path_buf()),
            src: src.to_path_buf(),
            rule,
            until,
            events_ok,
            closed: Vec::new(),
            unvouched: HashSet::new(),
            stable: HashMap::new(),
            log_offset: 0,
            log_partial: Vec::new(),
            log_pending: VecDeque::new(),
            log_lines: 0,
            named_at: HashMap::new(),
            head_missing: None,
            skipped: HashSet::new(),
            missing_grace: Duration::from_secs(30),
            warned: HashSet::new(),
            notes: Vec::new(),
        };
        d.rescan();
        d
    }

    /// Files present now may have been closed while nobody watched: they fall back to stability.
    pub fn rescan(&mut self) {
        if let Ok(names) = units::top_level(&self.src) {
            self.unvouched.extend(names);
        }
    }

    /// A file event from `notify`.
    pub fn on_event(&mut self, ev: &notify::Event) {
        use notify::event::{AccessKind, AccessMode, EventKind};
        if ev.need_rescan() {
            self.rescan();
        }
        if !matches!(self.rule, ReadyRule::Close) || ev.kind != EventKind::Access(AccessKind::Close(AccessMode::Write)) {
            return;
        }
        for p in &ev.paths {
            if p.parent().is_some_and(|d| d == self.src || d == self.canon_src)
                && let Some(name) = p.file_name().and_then(|n| n.to_str())
                && !name.starts_with('.')
            {
                self.closed.push(name.to_string());
            }
        }
    }

    pub fn is_until(&self, name: &str) -> bool {
        self.until.as_deref() == Some(name)
    }

    /// Units that became ready since the last call, in production order; `known` filters out
    /// units the state already has.
    pub fn poll(&mut self, known: &dyn Fn(&str) -> bool) -> Vec<String> {
        let now = Instant::now();
        let mut out: Vec<String> = Vec::new();
        let take = |name: String, out: &mut Vec<String>| {
            if !known(&name) && !out.contains(&name) {
                out.push(name);
            }
        };
        match self.rule.clone() {
            ReadyRule::Close => {
                for name in std::mem::take(&mut self.closed) {
                    if self.is_until(&name) || !self.src.join(&name).is_file() {
                        continue;
                    }
                    self.unvouched.remove(&name);
                    take(name, &mut out);
                }
                // No events (polling) means every file needs the fallback.
                if !self.events_ok {
                    self.rescan();
                }
                let names: Vec<String> = self.unvouched.iter().filter(|n| !known(n) && !self.is_until(n)).cloned().collect();
                let mut ready = self.stable_among(&names, CLOSE_FALLBACK, now, true);
                ready.sort();
                for name in ready {
                    self.unvouched.remove(&name);
                    take(name, &mut out);
                }
                self.unvouched.retain(|n| !known(n));
            }
            ReadyRule::Stable(window) => {
                let names: Vec<String> = units::top_level(&self.src).unwrap_or_default().into_iter().filter(|n| !known(n) && !self.is_until(n)).collect();
                for name in self.stable_among(&names, window, now, false) {
                    take(name, &mut out);
                }
            }
            ReadyRule::Marker { prefix, suffix, glob } => {
                // Markers in the order they appeared, then by name.
                let mut markers: Vec<(i128, String)> =
                    units::top_level(&self.src).unwrap_or_default().into_iter().filter(|n| glob.is_match(n)).filter_map(|n| units::measure(&self.src.join(&n)).ok().map(|m| (m.newest, n))).collect();
                markers.sort();
                for (_, marker) in markers {
                    let name = marker.strip_prefix(prefix.as_str()).and_then(|r| r.strip_suffix(suffix.as_str())).unwrap_or("").to_string();
                    if known(&name) {
                        continue;
                    }
                    if !units::valid_name(&name) || !self.src.join(&name).exists() {
                        self.warn_once(&marker, &format!("marker {marker} names '{name}', which is not in {}; waiting for it", self.src.display()));
                        continue;
                    }
                    take(name, &mut out);
                }
            }
            ReadyRule::Log { file, regex } => {
                self.read_log(&file, &regex, known);
                while let Some(name) = self.log_pending.front() {
                    if known(name) || self.skipped.contains(name) {
                        let name = self.log_pending.pop_front().unwrap();
                        self.named_at.remove(&name);
                        continue;
                    }
                    // Later units wait, so production order stays the log's order.
                    if !self.src.join(name).exists() {
                        let name = name.clone();
                        self.warn_if_missing_too_long(&file, &name, now);
                        break;
                    }
                    let name = self.log_pending.pop_front().unwrap();
                    self.named_at.remove(&name);
                    take(name, &mut out);
                }
            }
        }
        out
    }

    /// Names whose measure has not changed for `window`; `files_only` skips directories.
    fn stable_among(&mut self, names: &[String], window: Duration, now: Instant, files_only: bool) -> Vec<String> {
        let mut ready = Vec::new();
        let mut seen = HashSet::new();
        for name in names {
            if self.rule.excludes(name) {
                continue;
            }
            let Ok(m) = units::measure(&self.src.join(name)) else { continue };
            if files_only && m.is_dir {
                continue;
            }
            seen.insert(name.clone());
            match self.stable.get(name) {
                Some((old, since)) if *old == m => {
                    if now.duration_since(*since) >= window {
                        ready.push(name.clone());
                    }
                }
                _ => {
                    self.stable.insert(name.clone(), (m, now));
                }
            }
        }
        self.stable.retain(|n, _| seen.contains(n));
        for n in &ready {
            self.stable.remove(n);
        }
        ready
    }

    /// Reads what was appended to the log since the last call (from the start after a
    /// truncation or rotation); complete lines that match queue their unit.
    fn read_log(&mut self, file: &Path, regex: &regex::Regex, known: &dyn Fn(&str) -> bool) {
        let Ok(mut f) = fs::File::open(file) else { return };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.log_offset {
            self.log_offset = 0;
            self.log_partial.clear();
        }
        if len == self.log_offset || f.seek(SeekFrom::Start(self.log_offset)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        let Ok(n) = f.take(len - self.log_offset).read_to_end(&mut buf) else { return };
        self.log_offset += n as u64;
        self.log_partial.extend_from_slice(&buf);
        let Some(end) = self.log_partial.iter().rposition(|&b| b == b'\n') else { return };
        let lines: Vec<u8> = self.log_partial.drain(..=end).collect();
        for line in String::from_utf8_lossy(&lines).lines() {
            self.log_lines += 1;
            if let Some(name) = line.strip_prefix(SKIP_PREFIX) {
                let name = name.trim().to_string();
                self.notes.push(format!("{}:{}: skipping unit '{name}' as the log asks", file.display(), self.log_lines));
                self.skipped.insert(name);
                continue;
            }
            let Some(c) = regex.captures(line) else { continue };
            let raw = c.get(1).or_else(|| c.get(0)).map(|m| m.as_str()).unwrap_or("").trim_end_matches('/');
            let p = Path::new(raw);
            let rel = if p.is_absolute() { p.strip_prefix(&self.src).or_else(|_| p.strip_prefix(&self.canon_src)).ok().and_then(|r| r.to_str()).unwrap_or("") } else { raw };
            if !units::valid_name(rel) || rel.starts_with('.') {
                self.warn_once(raw, &format!("log line names '{raw}', which is not a top-level entry of {}; skipped (watch the directory that holds the units)", self.src.display()));
                continue;
            }
            if !known(rel) && !self.skipped.contains(rel) && !self.log_pending.iter().any(|n| n == rel) {
                self.named_at.insert(rel.to_string(), (self.log_lines, line.to_string()));
                self.log_pending.push_back(rel.to_string());
            }
        }
    }

    /// Says once, after `missing_grace`, that the unit at the head of the log's order has not
    /// appeared, that later units wait behind it, and how to skip it.
    fn warn_if_missing_too_long(&mut self, log: &Path, name: &str, now: Instant) {
        let since = match &self.head_missing {
            Some((n, t)) if n == name => *t,
            _ => {
                self.head_missing = Some((name.to_string(), now));
                now
            }
        };
        if now.duration_since(since) < self.missing_grace {
            return;
        }
        let (line_no, line) = self.named_at.get(name).cloned().unwrap_or_default();
        let msg = format!(
            "{}:{line_no}: '{line}' names unit '{name}', which has not appeared in {} after {} s; the {} unit(s) named after it wait, since units ship in the log's order. To skip it: echo '{SKIP_PREFIX}{name}' >> {}",
            log.display(),
            self.src.display(),
            self.missing_grace.as_secs(),
            self.log_pending.len().saturating_sub(1),
            log.display()
        );
        self.warn_once(&format!("missing:{name}"), &msg);
    }

    /// Units named (by a log) but not ready yet.
    /// The notes gathered since the last call.
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    pub fn pending(&self) -> usize {
        self.log_pending.len()
    }

    fn warn_once(&mut self, key: &str, msg: &str) {
        if self.warned.insert(key.to_string()) {
            self.notes.push(msg.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rules() {
        assert!(matches!(ReadyRule::parse("close"), Ok(ReadyRule::Close)));
        match ReadyRule::parse("marker:*.done").unwrap() {
            ReadyRule::Marker { prefix, suffix, .. } => assert_eq!((prefix.as_str(), suffix.as_str()), ("", ".done")),
            _ => panic!(),
        }
        assert!(matches!(ReadyRule::parse("log:/tmp/sim.log:^XFER (\\S+)"), Ok(ReadyRule::Log { .. })));
        assert!(matches!(ReadyRule::parse("stable:2.5"), Ok(ReadyRule::Stable(d)) if d == Duration::from_millis(2500)));
        assert!(ReadyRule::parse("marker:DONE").is_err());
        assert!(ReadyRule::parse("stable:x").is_err());
        assert!(ReadyRule::parse("log:f:(").is_err());
        assert!(ReadyRule::parse("inotify").is_err());
    }

    #[test]
    fn log_rule_keeps_log_order_and_waits_for_partial_lines() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("out");
        fs::create_dir(&src).unwrap();
        let log = t.path().join("sim.log");
        fs::write(&log, format!("step 1\nXFER {}/snap_000\nXFER snap_001\nXFER snap_0", src.display())).unwrap();
        let mut d = Detector::new(ReadyRule::parse(&format!("log:{}:^XFER (\\S+)", log.display())).unwrap(), &src, None, true);
        let none = |_: &str| false;
        // snap_000 not visible yet: nothing, and snap_001 waits behind it.
        fs::create_dir(src.join("snap_001")).unwrap();
        assert!(d.poll(&none).is_empty());
        fs::create_dir(src.join("snap_000")).unwrap();
        assert_eq!(d.poll(&none), vec!["snap_000", "snap_001"]);
        // The torn line completes.
        fs::create_dir(src.join("snap_002")).unwrap();
        fs::OpenOptions::new().append(true).open(&log).unwrap().write_all_at_end(b"02\n");
        assert_eq!(d.poll(&none), vec!["snap_002"]);
    }

    #[test]
    fn a_unit_the_log_names_that_never_appears_is_reported_and_can_be_skipped() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("out");
        fs::create_dir(&src).unwrap();
        let log = t.path().join("sim.log");
        fs::write(&log, "XFER snap_000\nXFER snap_001\nXFER snap_002\n").unwrap();
        let mut d = Detector::new(ReadyRule::parse(&format!("log:{}:^XFER (\\S+)", log.display())).unwrap(), &src, None, true);
        d.missing_grace = Duration::from_millis(50);
        let none = |_: &str| false;
        fs::create_dir(src.join("snap_000")).unwrap();
        fs::create_dir(src.join("snap_002")).unwrap();
        assert_eq!(d.poll(&none), vec!["snap_000"]);
        // snap_001 never comes: snap_002 waits behind it, and after the grace the watch says so.
        assert!(d.poll(&none).is_empty() && d.warned.is_empty());
        std::thread::sleep(Duration::from_millis(80));
        assert!(d.poll(&none).is_empty());
        assert!(d.warned.contains("missing:snap_001"), "{:?}", d.warned);
        assert_eq!(d.named_at["snap_001"], (2, "XFER snap_001".to_string()));
        // The user skips it through the log; the next unit ships.
        fs::OpenOptions::new().append(true).open(&log).unwrap().write_all_at_end(b"tern-skip snap_001\n");
        assert_eq!(d.poll(&none), vec!["snap_002"]);
        assert_eq!(d.pending(), 0);
    }

    #[test]
    fn marker_and_stable_rules() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path();
        fs::create_dir(src.join("snap_000")).unwrap();
        fs::create_dir(src.join("snap_001")).unwrap();
        fs::write(src.join("snap_000.done"), b"").unwrap();
        let mut d = Detector::new(ReadyRule::parse("marker:*.done").unwrap(), src, None, true);
        assert_eq!(d.poll(&|_| false), vec!["snap_000"]);
        let mut s = Detector::new(ReadyRule::parse("stable:0.2").unwrap(), src, None, true);
        assert!(s.poll(&|_| false).is_empty());
        std::thread::sleep(Duration::from_millis(300));
        // Markers are units under the stable rule (it knows nothing of markers).
        assert_eq!(s.poll(&|n| n == "snap_000.done"), vec!["snap_000", "snap_001"]);
    }

    trait AppendAll {
        fn write_all_at_end(self, b: &[u8]);
    }
    impl AppendAll for fs::File {
        fn write_all_at_end(mut self, b: &[u8]) {
            std::io::Write::write_all(&mut self, b).unwrap();
        }
    }
}
