//! Counters shared between the engine's threads and whoever displays progress.
//! Updated per chunk with relaxed atomics; the display reads them from its own ticker.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use crate::error::TransferError;

/// Per-file errors kept with their text.
pub const MAX_ERRORS: usize = 10_000;

#[derive(Default)]
pub struct Progress {
    /// Payload bytes moved over the network in this run (resends included).
    pub bytes: AtomicU64,
    /// Bytes of files the receiver already had (identical, or verified before a resume).
    pub bytes_skipped: AtomicU64,
    pub bytes_total: AtomicU64,
    pub files_total: AtomicU64,
    pub files_done: AtomicU64,
    pub files_skipped: AtomicU64,
    pub files_failed: AtomicU64,
    pub chunks_resent: AtomicU64,
    pub bytes_resent: AtomicU64,
    pub streams: AtomicU64,
    pub reconnects: AtomicU64,
    pub deleted: AtomicU64,
    /// The first `MAX_ERRORS` per-file errors; the rest are only counted (`errors_omitted`), so
    /// a tree of a million unreadable files cannot exhaust memory.
    pub errors: Mutex<Vec<TransferError>>,
    pub errors_omitted: AtomicU64,
    /// One-line notes for the user that are not errors (e.g. "installed tern on HOST at PATH").
    pub notices: Mutex<Vec<String>>,
    /// Dry-run plan lines, in the order the receiver decided them.
    pub plan: Mutex<Vec<String>>,
    /// Set while the session waits out a network failure before it resumes.
    pub reconnecting: AtomicBool,
    /// Sizes of the files that landed or were found identical, over all attempts.
    pub bytes_of_finished: AtomicU64,
    /// The counters as they stood when the current attempt started (see `whole`).
    pub attempt_base: Mutex<AttemptBase>,
    /// Called with each file's path, as the sender names it, once it landed verified (`-v`).
    pub on_landed: OnceLock<OnLanded>,
    /// Pulls: the paths that landed in this run, so a later attempt (whose remote sender
    /// announces everything again) does not count them a second time as found identical.
    pub landed_paths: Mutex<Option<std::collections::HashSet<Vec<u8>>>>,
}

/// Told each landed file's path.
pub type OnLanded = Box<dyn Fn(&[u8]) + Send + Sync>;

/// Where the current attempt started from, so progress reads as one transfer across reconnects.
#[derive(Clone, Copy, Default, Debug)]
pub struct AttemptBase {
    pub bytes: u64,
    pub bytes_resent: u64,
    pub bytes_skipped: u64,
    /// Bytes finished before this attempt that it does not announce again (pushes: the sender
    /// remembers them; a pull's remote sender announces everything again, so 0 there).
    pub carried: u64,
    /// Between attempts: the whole transfer's (done, total) as the failed attempt left them.
    pub paused: Option<(u64, u64)>,
    /// What the last failed attempt left, shown until this attempt has a manifest of its own
    /// (an attempt that cannot connect changes nothing).
    pub before: (u64, u64),
}

impl Progress {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Relaxed)
    }
    pub fn notice(&self, message: String) {
        tracing::info!("{message}");
        self.notices.lock().unwrap().push(message);
    }
    /// A file landed verified (or, on the sending side, the receiver said so).
    pub fn landed(&self, rel: &[u8], size: u64) {
        if let Some(set) = self.landed_paths.lock().unwrap().as_mut()
            && !set.insert(rel.to_vec())
        {
            return; // landed again in a later attempt (changed at the source meanwhile)
        }
        Self::add(&self.files_done, 1);
        Self::add(&self.bytes_of_finished, size);
        if let Some(f) = self.on_landed.get() {
            f(rel);
        }
    }

    /// Remember which paths land (see `landed_paths`).
    pub fn track_landed_paths(&self) {
        self.landed_paths.lock().unwrap().get_or_insert_with(Default::default);
    }

    /// Whether `rel` landed in an earlier attempt of this run (only when tracked).
    pub fn landed_before(&self, rel: &[u8]) -> bool {
        self.landed_paths.lock().unwrap().as_ref().is_some_and(|s| s.contains(rel))
    }

    /// A new attempt starts: what it will count comes on top of `base`.
    pub fn start_attempt(&self, carry_finished: bool) {
        let before = self.attempt_base.lock().unwrap().paused.unwrap_or_default();
        let base = AttemptBase {
            bytes: Self::get(&self.bytes),
            bytes_resent: Self::get(&self.bytes_resent),
            bytes_skipped: Self::get(&self.bytes_skipped),
            carried: if carry_finished { Self::get(&self.bytes_of_finished) } else { 0 },
            paused: None,
            before,
        };
        *self.attempt_base.lock().unwrap() = base;
        self.reconnecting.store(false, Relaxed);
    }

    /// The attempt failed and the session will reconnect: keep the whole transfer's totals
    /// for displays until the next attempt starts, then clear this attempt's manifest.
    pub fn pause_for_reconnect(&self) {
        let whole = self.whole();
        self.attempt_base.lock().unwrap().paused = Some(whole);
        self.reconnecting.store(true, Relaxed);
        self.bytes_total.store(0, Relaxed);
    }

    /// (done, total) bytes of the whole transfer, across reconnects: what earlier attempts
    /// finished plus this attempt's manifest; data already at the destination counts as done.
    pub fn whole(&self) -> (u64, u64) {
        let base = *self.attempt_base.lock().unwrap();
        if let Some(paused) = base.paused {
            return paused;
        }
        let total = Self::get(&self.bytes_total);
        if total == 0 {
            return base.before;
        }
        let moved = Self::get(&self.bytes).saturating_sub(base.bytes).saturating_sub(Self::get(&self.bytes_resent).saturating_sub(base.bytes_resent));
        let skipped = Self::get(&self.bytes_skipped).saturating_sub(base.bytes_skipped);
        (base.carried + (moved + skipped).min(total), base.carried + total)
    }

    /// Whether any error was reported (kept or counted beyond the cap).
    pub fn any_error(&self) -> bool {
        !self.errors.lock().unwrap().is_empty() || Self::get(&self.errors_omitted) > 0
    }

    pub fn error(&self, e: TransferError) {
        tracing::debug!("{e}");
        let mut errors = self.errors.lock().unwrap();
        if errors.len() < MAX_ERRORS {
            errors.push(e);
        } else {
            self.errors_omitted.fetch_add(1, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_kept_up_to_the_cap_and_counted_beyond() {
        let p = Progress::default();
        for i in 0..MAX_ERRORS + 5 {
            p.error(TransferError::file(crate::error::Side::Source, format!("f{i}"), "unreadable"));
        }
        assert_eq!(p.errors.lock().unwrap().len(), MAX_ERRORS);
        assert_eq!(Progress::get(&p.errors_omitted), 5);
    }

    #[test]
    fn whole_transfer_totals_survive_a_reconnect() {
        let p = Progress::default();
        p.start_attempt(true);
        // Attempt 1: two files of 100, one landed, 30 of the other sent.
        Progress::add(&p.bytes_total, 200);
        Progress::add(&p.bytes, 130);
        p.landed(b"a", 100);
        assert_eq!(p.whole(), (130, 200));
        // Reconnect: the push announces only the unfinished file; its 30 verified bytes are skipped.
        p.pause_for_reconnect();
        assert_eq!(p.whole(), (130, 200), "while reconnecting: as the attempt left it");
        p.start_attempt(true);
        assert_eq!(p.whole(), (130, 200), "a new attempt without a manifest yet");
        // That attempt cannot connect: still as the first one left it.
        p.pause_for_reconnect();
        p.start_attempt(true);
        assert_eq!(p.whole(), (130, 200));
        Progress::add(&p.bytes_total, 100);
        assert_eq!(p.whole(), (100, 200), "the new manifest: what landed, of what is known");
        Progress::add(&p.bytes_skipped, 30);
        Progress::add(&p.bytes, 20);
        assert_eq!(p.whole(), (150, 200));
        // A pull announces everything again: nothing carried, the landed file is skipped.
        let q = Progress::default();
        q.start_attempt(false);
        Progress::add(&q.bytes_total, 200);
        Progress::add(&q.bytes, 130);
        q.landed(b"a", 100);
        q.pause_for_reconnect();
        q.start_attempt(false);
        Progress::add(&q.bytes_total, 200);
        Progress::add(&q.bytes_skipped, 130);
        assert_eq!(q.whole(), (130, 200));
    }
}
