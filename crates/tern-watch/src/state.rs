//! The watcher's durable state: an append-only JSON-lines log (format in docs/watch.md).
//! Every step is recorded and made durable before it is acted on, so a kill -9 at any moment
//! neither loses a unit nor repeats one.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    Ready { seq: u64, unit: String, bytes: u64, files: u64, at: f64 },
    Shipping { seq: u64, at: f64 },
    Verified { seq: u64, at: f64, bytes_sent: u64 },
    HookStart { seq: u64, attempt: u32, at: f64 },
    Hooked { seq: u64, at: f64 },
    HookFailed { seq: u64, error: String, at: f64 },
    Deleted { seq: u64, at: f64 },
    Failed { seq: u64, error: String, at: f64 },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Header {
    v: u32,
    src: String,
    dst: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum HookState {
    NotYet,
    /// Started (attempt number) with no outcome recorded.
    Started(u32),
    Done,
    Failed(String),
}

/// One unit as the log describes it.
#[derive(Debug, Clone)]
pub struct Unit {
    pub seq: u64,
    pub name: String,
    pub bytes: u64,
    pub files: u64,
    pub ready_at: f64,
    pub shipments: u32,
    pub verified_at: Option<f64>,
    pub bytes_sent: u64,
    pub hook: HookState,
    pub hook_attempts: u32,
    pub deleted: bool,
    pub failed: Option<String>,
}

pub struct StateLog {
    path: PathBuf,
    file: File,
    _lock: File,
    header: Header,
    pub units: Vec<Unit>,
    by_name: HashMap<String, u64>,
}

impl StateLog {
    /// Opens (creating) the state in `dir`, takes its lock, replays and compacts the log.
    pub fn open(dir: &Path, src: &str, dst: &str) -> Result<Self, String> {
        let show = dir.display();
        fs::create_dir_all(dir).map_err(|e| format!("state dir {show}: cannot create: {e} (choose another with --state-dir)"))?;
        let lock = OpenOptions::new().create(true).truncate(false).write(true).open(dir.join("lock")).map_err(|e| format!("state dir {show}: cannot open the lock: {e}"))?;
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(format!("state dir {show}: another tern watch is using it (stop that one, or give this one its own --state-dir)"));
        }
        let path = dir.join("units.jsonl");
        let header = Header { v: 1, src: src.to_string(), dst: dst.to_string() };
        let mut units = Vec::new();
        let mut by_name = HashMap::new();
        match fs::read(&path) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let mut lines = text.split_inclusive('\n');
                if let Some(first) = lines.next() {
                    let h: Header = serde_json::from_str(first.trim_end()).map_err(|e| format!("{}: not a tern watch state ({e}); move it away", path.display()))?;
                    if h.src != header.src || h.dst != header.dst {
                        return Err(format!("{}: belongs to the watch of {} to {}, not this one; use another --state-dir", path.display(), h.src, h.dst));
                    }
                }
                for line in lines {
                    // A torn tail (no newline or not JSON) is a write the crash cut short.
                    let Some(line) = line.strip_suffix('\n') else { break };
                    let Ok(ev) = serde_json::from_str::<Event>(line) else { break };
                    apply(&mut units, &mut by_name, &ev);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: cannot read: {e}", path.display())),
        }
        let file = compact(&path, &header, &units).map_err(|e| format!("{}: cannot write: {e} (is the state dir full or read-only?)", path.display()))?;
        Ok(Self { path, file, _lock: lock, header, units, by_name })
    }

    /// Records one step durably, then applies it.
    pub fn record(&mut self, ev: Event) -> Result<(), String> {
        let mut line = serde_json::to_string(&ev).expect("event serializes");
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|_| self.file.sync_data())
            .map_err(|e| format!("{}: cannot record the watch state: {e} (free space in the state dir, then restart: the watch resumes)", self.path.display()))?;
        apply(&mut self.units, &mut self.by_name, &ev);
        Ok(())
    }

    pub fn known(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    pub fn next_seq(&self) -> u64 {
        self.units.len() as u64
    }

    pub fn unit(&self, seq: u64) -> &Unit {
        &self.units[seq as usize]
    }

    pub fn dst(&self) -> &str {
        &self.header.dst
    }
}

fn apply(units: &mut Vec<Unit>, by_name: &mut HashMap<String, u64>, ev: &Event) {
    match ev {
        Event::Ready { seq, unit, bytes, files, at } => {
            if *seq as usize == units.len() {
                by_name.insert(unit.clone(), *seq);
                units.push(Unit {
                    seq: *seq,
                    name: unit.clone(),
                    bytes: *bytes,
                    files: *files,
                    ready_at: *at,
                    shipments: 0,
                    verified_at: None,
                    bytes_sent: 0,
                    hook: HookState::NotYet,
                    hook_attempts: 0,
                    deleted: false,
                    failed: None,
                });
            }
        }
        Event::Shipping { seq, .. } => with(units, *seq, |u| u.shipments += 1),
        Event::Verified { seq, at, bytes_sent } => with(units, *seq, |u| {
            u.verified_at = Some(*at);
            u.bytes_sent += bytes_sent;
        }),
        Event::HookStart { seq, attempt, .. } => with(units, *seq, |u| {
            u.hook = HookState::Started(*attempt);
            u.hook_attempts = *attempt;
        }),
        Event::Hooked { seq, .. } => with(units, *seq, |u| u.hook = HookState::Done),
        Event::HookFailed { seq, error, .. } => with(units, *seq, |u| u.hook = HookState::Failed(error.clone())),
        Event::Deleted { seq, .. } => with(units, *seq, |u| u.deleted = true),
        Event::Failed { seq, error, .. } => with(units, *seq, |u| u.failed = Some(error.clone())),
    }
}

fn with(units: &mut [Unit], seq: u64, f: impl FnOnce(&mut Unit)) {
    if let Some(u) = units.get_mut(seq as usize) {
        f(u);
    }
}

/// The events that rebuild `units` exactly.
fn events_of(u: &Unit) -> Vec<Event> {
    let mut out = vec![Event::Ready { seq: u.seq, unit: u.name.clone(), bytes: u.bytes, files: u.files, at: u.ready_at }];
    for _ in 0..u.shipments {
        out.push(Event::Shipping { seq: u.seq, at: u.ready_at });
    }
    if let Some(at) = u.verified_at {
        out.push(Event::Verified { seq: u.seq, at, bytes_sent: u.bytes_sent });
    }
    if u.hook_attempts > 0 {
        out.push(Event::HookStart { seq: u.seq, attempt: u.hook_attempts, at: u.ready_at });
    }
    match &u.hook {
        HookState::Done => out.push(Event::Hooked { seq: u.seq, at: u.ready_at }),
        HookState::Failed(e) => out.push(Event::HookFailed { seq: u.seq, error: e.clone(), at: u.ready_at }),
        _ => {}
    }
    if u.deleted {
        out.push(Event::Deleted { seq: u.seq, at: u.ready_at });
    }
    if let Some(e) = &u.failed {
        out.push(Event::Failed { seq: u.seq, error: e.clone(), at: u.ready_at });
    }
    out
}

/// Rewrites the log as its current state (temporary, fsync, rename, fsync of the directory)
/// and returns it open for appending.
fn compact(path: &Path, header: &Header, units: &[Unit]) -> io::Result<File> {
    let tmp = path.with_extension("jsonl.tmp");
    let mut text = serde_json::to_string(header).expect("header serializes");
    text.push('\n');
    for u in units {
        for ev in events_of(u) {
            text.push_str(&serde_json::to_string(&ev).expect("event serializes"));
            text.push('\n');
        }
    }
    let mut f = File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    OpenOptions::new().append(true).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_ignores_a_torn_tail_and_refuses_a_second_watcher() {
        let t = tempfile::tempdir().unwrap();
        {
            let mut s = StateLog::open(t.path(), "/src", "dst").unwrap();
            assert!(StateLog::open(t.path(), "/src", "dst").err().unwrap().contains("another tern watch"));
            s.record(Event::Ready { seq: 0, unit: "a".into(), bytes: 5, files: 1, at: 1.0 }).unwrap();
            s.record(Event::Shipping { seq: 0, at: 1.5 }).unwrap();
            s.record(Event::Verified { seq: 0, at: 2.0, bytes_sent: 5 }).unwrap();
            s.record(Event::HookStart { seq: 0, attempt: 1, at: 2.0 }).unwrap();
            s.record(Event::Ready { seq: 1, unit: "b".into(), bytes: 7, files: 2, at: 3.0 }).unwrap();
        }
        let p = t.path().join("units.jsonl");
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"{\"ev\":\"hooked\",\"se").unwrap();
        drop(f);
        let s = StateLog::open(t.path(), "/src", "dst").unwrap();
        assert_eq!(s.units.len(), 2);
        assert!(s.known("a") && s.known("b") && !s.known("c"));
        assert_eq!(s.unit(0).hook, HookState::Started(1));
        assert_eq!(s.unit(0).shipments, 1);
        assert_eq!(s.unit(0).verified_at, Some(2.0));
        assert_eq!(s.unit(1).verified_at, None);
        assert!(!fs::read_to_string(&p).unwrap().contains("\"se\n"), "torn tail compacted away");
        drop(s);
        assert!(StateLog::open(t.path(), "/other", "dst").err().unwrap().contains("belongs to the watch"));
    }
}
