//! Counters shared between the engine's threads and whoever displays progress.
//! Updated per chunk with relaxed atomics; the display reads them from its own ticker.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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
}
