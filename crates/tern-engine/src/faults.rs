//! Fault hooks for tests, read once from the environment. They cost one branch when unset.
//!
//! Only builds with the `test-hooks` feature read them (`cargo test` turns it on through the
//! `tern` crate's dev-dependency; benchmarks build with `--features tern-engine/test-hooks`).
//! A release build has none of these names in it: the variables do nothing there, so no
//! environment can switch integrity off or inject faults into a shipped daemon.
//!
//! * `TERN_FAULT_CORRUPT=NAME:CHUNK` — the sender flips a byte of that chunk of the first file
//!   whose path ends with NAME, after hashing it, once per process.
//! * `TERN_FAULT_CUT_AFTER=BYTES` — the sender cuts one data stream after sending that many
//!   bytes, once per process (a network cut mid-transfer).
//! * `TERN_FAULT_DELAY_MS=MS` — the sender sleeps before each chunk (slows a test transfer so a
//!   kill lands mid-way).
//! * `TERN_DEBUG_NO_HASH=1` — skip BLAKE3 (benchmark switch to measure integrity's cost; the
//!   receiver then cannot verify, so it refuses to run unless both ends set it).
//! * `TERN_DEBUG_NO_WRITE_BEHIND=1` — the receiver does not start writeback as chunks land
//!   (benchmarks compare the final barrier with and without it).
//! * `TERN_FAULT_EXHAUST_FDS=N:MS` — when the receiver prepares its N-th file, the process
//!   takes every free descriptor and gives them back MS later (a limit met mid-run).
//! * `TERN_FAULT_NO_REREAD=1` — the sender fails every read that only hashes a chunk the
//!   receiver holds (tests that a publish of sealed stripes reads nothing again).
//! * `TERN_DEBUG_FEATURES=N` — advertise these Hello feature bits instead of ours (tests act
//!   as an older peer that lacks a feature).
//! * `TERN_DEBUG_VERSION=V` — a cluster node says it runs tern V (tests of a mixed cluster).
//! * `TERN_DEBUG_FAR_SIDE=PATH` — a first install sends that program (the test build's
//!   `tern-remote`), as a release `tern` sends the far-side build it carries.

#[cfg(feature = "test-hooks")]
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub struct Faults {
    corrupt: Option<(String, u64)>,
    corrupt_done: AtomicBool,
    cut_after: Option<u64>,
    cut_done: AtomicBool,
    sent: AtomicU64,
    pub delay_ms: u64,
    pub no_hash: bool,
    pub no_write_behind: bool,
    pub no_reread: bool,
    pub features: Option<u64>,
    pub version: Option<String>,
    /// `TERN_DEBUG_FAR_SIDE=PATH`: install this program (gzipped here) instead of this binary.
    pub far_side: Option<std::path::PathBuf>,
    exhaust: Option<(u64, u64)>,
    prepared: AtomicU64,
}

#[cfg(not(feature = "test-hooks"))]
pub fn faults() -> &'static Faults {
    static OFF: Faults = Faults {
        corrupt: None,
        corrupt_done: AtomicBool::new(false),
        cut_after: None,
        cut_done: AtomicBool::new(false),
        sent: AtomicU64::new(0),
        delay_ms: 0,
        no_hash: false,
        no_write_behind: false,
        no_reread: false,
        features: None,
        version: None,
        far_side: None,
        exhaust: None,
        prepared: AtomicU64::new(0),
    };
    &OFF
}

#[cfg(feature = "test-hooks")]
pub fn faults() -> &'static Faults {
    static F: OnceLock<Faults> = OnceLock::new();
    F.get_or_init(|| Faults {
        corrupt: std::env::var("TERN_FAULT_CORRUPT").ok().and_then(|v| {
            let (name, chunk) = v.rsplit_once(':')?;
            Some((name.to_string(), chunk.parse().ok()?))
        }),
        corrupt_done: AtomicBool::new(false),
        cut_after: std::env::var("TERN_FAULT_CUT_AFTER").ok().and_then(|v| v.parse().ok()),
        cut_done: AtomicBool::new(false),
        sent: AtomicU64::new(0),
        delay_ms: std::env::var("TERN_FAULT_DELAY_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(0),
        no_hash: std::env::var("TERN_DEBUG_NO_HASH").is_ok_and(|v| v == "1"),
        no_write_behind: std::env::var("TERN_DEBUG_NO_WRITE_BEHIND").is_ok_and(|v| v == "1"),
        no_reread: std::env::var("TERN_FAULT_NO_REREAD").is_ok_and(|v| v == "1"),
        features: std::env::var("TERN_DEBUG_FEATURES").ok().and_then(|v| v.parse().ok()),
        version: std::env::var("TERN_DEBUG_VERSION").ok(),
        far_side: std::env::var_os("TERN_DEBUG_FAR_SIDE").map(Into::into),
        exhaust: std::env::var("TERN_FAULT_EXHAUST_FDS").ok().and_then(|v| {
            let (n, ms) = v.split_once(':')?;
            Some((n.parse().ok()?, ms.parse().ok()?))
        }),
        prepared: AtomicU64::new(0),
    })
}

/// Says so on stderr when a switch that weakens a transfer is on (test and benchmark builds).
pub fn warn_if_weakened() {
    #[cfg(feature = "test-hooks")]
    if faults().no_hash {
        tracing::warn!("TERN_DEBUG_NO_HASH=1: chunk hashing is off (a benchmark switch); nothing this process moves is verified");
    }
}

impl Faults {
    /// Whether to corrupt this chunk (true at most once).
    pub fn corrupt(&self, path: &[u8], chunk: u64) -> bool {
        match &self.corrupt {
            Some((name, c)) if *c == chunk && path.ends_with(name.as_bytes()) => !self.corrupt_done.swap(true, Ordering::SeqCst),
            _ => false,
        }
    }
    /// The receiver prepares a file: at the N-th, take every free descriptor for a while.
    pub fn preparing_file(&self) {
        let Some((n, ms)) = self.exhaust else { return };
        if self.prepared.fetch_add(1, Ordering::SeqCst) + 1 != n {
            return;
        }
        let mut held = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            held.push(f);
        }
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(ms));
            drop(held);
        });
    }

    /// Counts sent bytes; true once when the cut threshold is crossed.
    pub fn cut(&self, n: u64) -> bool {
        let Some(limit) = self.cut_after else { return false };
        let total = self.sent.fetch_add(n, Ordering::Relaxed) + n;
        total >= limit && !self.cut_done.swap(true, Ordering::SeqCst)
    }
}

/// The chunk hash, or zeros under the benchmark switch.
pub fn chunk_hash(data: &[u8]) -> [u8; 32] {
    if faults().no_hash {
        return [0; 32];
    }
    *blake3::hash(data).as_bytes()
}
