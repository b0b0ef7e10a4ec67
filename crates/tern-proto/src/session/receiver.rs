//! The receiving side's per-file decisions: which files to set up and ask for under the
//! flow-control window, when a file is verified and goes to be made durable and published, what
//! a corrupt chunk, a failed write or a whole-file mismatch leads to, and when the session's
//! files are all finished.
//!
//! Lifecycle of a file: `Pending` (announced, waiting for room in the window) → `Receiving`
//! (its part set up, its missing chunks wanted) → `Finalizing` (every chunk verified and the
//! whole-file hash matched; the driver makes it durable and publishes it) → gone, reported as
//! [`Action::Done`]. A file leaves the machine (and its memory) as soon as it is done, so memory
//! grows with the files in flight, not with the tree.
//!
//! The driver's contract: poll actions until `None` after every input; answer each
//! [`Action::Prepare`] with [`Receiver::prepared`] or [`Receiver::prepare_failed`] before
//! polling again; answer each [`Action::Finalize`] (later, from any thread's result) with
//! [`Receiver::finalized`] or [`Receiver::finalize_failed`]. After [`Action::Stop`] the session
//! is over.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use super::Trouble;
use crate::Side;
use crate::chunk::{Assembly, chunk_range, file_hash, stripe_hash};
use crate::msg::WantFile;

/// Corrupt deliveries of one file's chunks before the file is given up (the path or a host's
/// memory corrupts data faster than retries can help).
pub const MAX_BAD_CHUNKS: u32 = 8;
/// Whole-file mismatches before a file fails: the first starts it over from nothing.
pub const MAX_FILE_RETRIES: u32 = 1;
/// Files in one `Want` message: filling the window in messages of this size keeps each
/// message well under the control frame limit and the first chunks flowing early.
pub const MAX_WANT_BATCH: usize = 1024;
/// Waits in a row for a descriptor while nothing of this session is in flight to free one
/// (about 25 s in all, see [`Receiver::prepare_failed`]) before the file fails.
pub const MAX_LIMIT_WAITS: u32 = 50;

/// Limits of the flow-control window.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Wanted-but-not-arrived bytes: new files are asked for while fewer are outstanding.
    pub bytes: u64,
    /// Files wanted or being finalized at once (memory on the driver's side).
    pub files: usize,
    /// Of those, files of more than one chunk: each holds descriptors on the driver's side
    /// (its part and journal stay open while it is in flight). A one-chunk file is opened,
    /// written and closed when its data arrives, so it holds none while it waits: only this
    /// count, not `files`, follows the descriptor limit.
    pub held: usize,
}

/// What the sender announced about a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSpec {
    pub id: u64,
    pub size: u64,
    pub mtime: (i64, u32),
    /// Only these chunks (`first..end`) move in this session: a stripe of a file spread over
    /// several node pairs. It ends verified but unpublished ([`Action::StripeVerified`]).
    pub stripe: Option<(u64, u64)>,
}

/// How a file ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Verified, durable and under its final name.
    Landed,
    /// Failed; `tell_peer`: the driver sends `FileError` with this message (the peer does not
    /// know yet) and reports it.
    Failed { side: Side, message: String, tell_peer: bool },
}

/// What the driver does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Action<T> {
    /// Set up the file's part (temporary, journal) and say which chunks the store proves it
    /// holds; `start_over`: discard any partial data and journal first.
    Prepare { id: u64, start_over: bool },
    /// Ask the sender for these chunk ranges (one `Want` message).
    Want(Vec<WantFile>),
    /// A chunk failed verification: ask the sender for it again (`ChunkBad`).
    AskAgain { id: u64, chunk: u64 },
    /// Every chunk verified and their hashes add up to the sender's whole-file hash: set the
    /// length and metadata, make it durable (the barrier), then publish it under its final
    /// name. `more_coming`: other files are still arriving, so batching the barrier pays.
    Finalize { id: u64, file_hash: [u8; 32], more_coming: bool },
    /// The chunks add up to a different file than the sender's: throw away the part and its
    /// journal (the file starts over or fails; a `Done` or `Prepare` follows).
    Abandon { id: u64 },
    /// Every chunk of a stripe (`first..end`) is verified and they add up to the sender's
    /// stripe hash (`stripe_hash`): make its data durable and seal it in the journal, close
    /// the part, publish nothing (the part and its journal stay for the file's other stripes
    /// and the session that publishes it). Answered with [`Receiver::finalized`].
    StripeVerified { id: u64, first: u64, end: u64, stripe_hash: [u8; 32] },
    /// The file is finished and forgotten; `payload` is what the driver gave at `announce`.
    Done { id: u64, payload: T, outcome: Outcome },
    /// The process ran out of descriptors (or memory) with nothing of this session in flight
    /// to give one back: wait this long, then poll again.
    Wait(Duration),
    /// The window was lowered to the files in flight because the process hit a limit.
    Throttled { files: usize, window: usize },
    /// End the session: every other file would fail the same way.
    Stop { side: Side, trouble: Trouble, message: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Pending,
    /// The driver is setting the part up (between `Prepare` and its answer).
    Preparing,
    Receiving,
    Finalizing,
}

struct File<T> {
    spec: FileSpec,
    payload: T,
    state: State,
    assembly: Option<Assembly>,
    /// Bytes wanted and not yet arrived verified.
    outstanding: u64,
    bad_chunks: u32,
    retries: u32,
}

/// An input the machine refuses: about a file it does not hold (one already done, or never
/// announced: the driver tells which from the ids it saw), or a chunk the file does not have.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    UnknownFile,
    ChunkOutOfRange,
}

/// The receiving side's decisions for one session.
pub struct Receiver<T> {
    window: Window,
    chunk_size: u32,
    /// Files in flight allowed now: the window, lowered when the process ran out of
    /// descriptors and raised again by one per file that lands.
    files_allowed: usize,
    limit_waits: u32,
    files: HashMap<u64, File<T>>,
    pending: VecDeque<u64>,
    /// Files set up and not yet sent in a `Want`.
    batch: Vec<WantFile>,
    preparing: Option<u64>,
    outstanding_bytes: u64,
    /// Files in `Receiving`.
    receiving: usize,
    /// Files in `Finalizing`: they count against the files window (not against the bytes
    /// window: their data is here).
    finalizing: usize,
    /// Files of more than one chunk in `Receiving` or `Finalizing` (against `window.held`).
    holding: usize,
    /// The most files in flight at once, and the most holding descriptors (for the driver's
    /// log and tests).
    peak: (usize, usize),
    manifest_end: bool,
    stopped: bool,
    actions: VecDeque<Action<T>>,
}

impl<T> Receiver<T> {
    pub fn new(window: Window, chunk_size: u32) -> Self {
        assert!(window.bytes > 0 && window.files > 0 && window.held > 0, "an empty window moves nothing");
        Self {
            window,
            chunk_size,
            files_allowed: window.files,
            limit_waits: 0,
            files: HashMap::new(),
            pending: VecDeque::new(),
            batch: Vec::new(),
            preparing: None,
            outstanding_bytes: 0,
            receiving: 0,
            finalizing: 0,
            holding: 0,
            peak: (0, 0),
            manifest_end: false,
            stopped: false,
            actions: VecDeque::new(),
        }
    }

    /// A file to fetch (the driver already decided it is not identical at the destination).
    pub fn announce(&mut self, spec: FileSpec, payload: T) {
        let file = File { spec, payload, state: State::Pending, assembly: None, outstanding: 0, bad_chunks: 0, retries: 0 };
        assert!(self.files.insert(spec.id, file).is_none(), "file {} announced twice", spec.id);
        self.pending.push_back(spec.id);
    }

    /// The sender announced its last entry.
    pub fn manifest_end(&mut self) {
        self.manifest_end = true;
    }

    /// Every announced file is done and the manifest ended: the driver finishes the session.
    pub fn is_finished(&self) -> bool {
        self.manifest_end && self.files.is_empty()
    }

    /// Files announced and not yet done.
    pub fn unfinished(&self) -> usize {
        self.files.len()
    }

    /// What the driver gave with the file, while the machine holds it.
    pub fn payload(&self, id: u64) -> Option<&T> {
        self.files.get(&id).map(|f| &f.payload)
    }

    /// The part is set up; `resumed`: chunks the store proved it holds (journal records whose
    /// data re-hashed right), which are not asked for again.
    pub fn prepared(&mut self, id: u64, resumed: impl IntoIterator<Item = (u64, [u8; 32])>) {
        assert_eq!(self.preparing.take(), Some(id), "prepared() answers the last Prepare");
        self.limit_waits = 0;
        let chunk_size = self.chunk_size;
        let f = self.files.get_mut(&id).expect("a file being prepared is held");
        debug_assert_eq!(f.state, State::Preparing);
        let mut assembly = match f.spec.stripe {
            Some((first, end)) => Assembly::stripe(f.spec.size, chunk_size, first..end),
            None => Assembly::new(f.spec.size, chunk_size),
        };
        let wanted = assembly.wanted();
        // Another stripe's chunks are that session's business, whatever the store holds.
        let mut resumed = resumed.into_iter().filter(|(index, _)| wanted.contains(index)).peekable();
        // Its hash comes only with its frame (the sender sends no FileEnd for a one-chunk
        // file): resumed, it would wait for ever.
        debug_assert!(assembly.chunks() > 1 || resumed.peek().is_none(), "file {id}: a one-chunk file resumed");
        for (index, hash) in resumed {
            assert!(index < assembly.chunks(), "the store resumed chunk {index} of a {}-chunk file", assembly.chunks());
            let _ = assembly.record(index, hash);
        }
        let ranges = assembly.missing_ranges(u32::MAX);
        let missing: u64 = ranges.iter().flat_map(|&(s, c)| s..s + u64::from(c)).map(|i| u64::from(chunk_range(f.spec.size, chunk_size, i).1)).sum();
        f.state = State::Receiving;
        f.outstanding = missing;
        let holds = assembly.chunks() > 1;
        f.assembly = Some(assembly);
        self.outstanding_bytes += missing;
        self.receiving += 1;
        self.holding += usize::from(holds);
        self.peak = (self.peak.0.max(self.receiving + self.finalizing), self.peak.1.max(self.holding));
        self.batch.push(WantFile { id, ranges });
        // A file the store already holds whole (or an empty one) waits only for the hash.
    }

    /// The part is set up and the store proves it holds every chunk of the file verified
    /// against the source and durable (`hashes`: the sealed stripes of a file spread over
    /// several node pairs, docs/journal.md "Seals"): nothing is asked for or read again, and
    /// the file goes to be published with the hash its chunks add up to. The sender hears of
    /// it by the `FileDone` alone (its size and mtime, announced this session, matched the
    /// journal's). If the hashes leave a chunk out, this is [`Receiver::prepared`].
    pub fn prepared_sealed(&mut self, id: u64, hashes: Vec<(u64, [u8; 32])>) {
        self.prepared(id, hashes);
        let f = self.files.get_mut(&id).expect("just prepared");
        let a = f.assembly.as_mut().expect("just prepared");
        if a.is_stripe() || a.chunks() < 2 || !a.verified().is_full() {
            return;
        }
        let hash = file_hash(a.size, (0..a.chunks()).map(|i| a.hash_of(i).expect("every chunk held")));
        a.set_expected(hash);
        let last = self.batch.pop().expect("prepared() queued its want");
        debug_assert!(last.id == id && last.ranges.is_empty(), "a sealed file wants nothing");
        self.try_complete(id);
    }

    /// Setting the part up failed. A process limit (descriptors, memory) is waited out with
    /// fewer files in flight; anything else fails this file.
    pub fn prepare_failed(&mut self, id: u64, trouble: Trouble, message: String) {
        assert_eq!(self.preparing.take(), Some(id), "prepare_failed() answers the last Prepare");
        let f = self.files.get_mut(&id).expect("a file being prepared is held");
        f.state = State::Pending;
        if trouble == Trouble::ResourceLimit && self.limit_waits < MAX_LIMIT_WAITS {
            self.pending.push_front(id);
            let in_flight = self.receiving + self.finalizing;
            if self.files_allowed == self.window.files {
                self.actions.push_back(Action::Throttled { files: in_flight.max(1), window: self.window.files });
            }
            self.files_allowed = in_flight.max(1);
            if in_flight == 0 {
                // Nothing of ours to wait for: another session or process holds them.
                self.limit_waits += 1;
                self.actions.push_back(Action::Wait(Duration::from_millis(20 * u64::from(self.limit_waits))));
            }
            return;
        }
        if trouble == Trouble::NoSpace {
            return self.stop(Side::Destination, trouble, message);
        }
        self.finish(id, Outcome::Failed { side: Side::Destination, message, tell_peer: true });
    }

    /// A chunk arrived, its hash matched the sender's, and it was written (and journaled).
    /// `whole`: the sender marked it as the file's only chunk, so its hash gives the file's.
    pub fn chunk_stored(&mut self, id: u64, index: u64, hash: [u8; 32], whole: bool) -> Result<(), Refused> {
        let f = self.files.get_mut(&id).ok_or(Refused::UnknownFile)?;
        let Some(a) = f.assembly.as_mut() else { return Ok(()) };
        // Of a stripe, only its own chunks may come: the others are other sessions' to write.
        if !a.wanted().contains(&index) {
            return Err(Refused::ChunkOutOfRange);
        }
        if a.record(index, hash).expect("index checked above") && f.state == State::Receiving {
            let len = u64::from(chunk_range(f.spec.size, self.chunk_size, index).1);
            assert!(f.outstanding >= len && self.outstanding_bytes >= len, "chunk {index} of file {id} arrived but was not outstanding");
            f.outstanding -= len;
            self.outstanding_bytes -= len;
        }
        if whole {
            a.set_expected(file_hash(a.size, [&hash]));
        }
        self.try_complete(id);
        Ok(())
    }

    /// A chunk's data did not match its hash (a corrupted record caught by the chunk check).
    pub fn chunk_corrupt(&mut self, id: u64, index: u64) {
        // A file that already failed (or finished) needs nothing more; saying so again for
        // each of its chunks still in flight would flood the errors.
        let Some(f) = self.files.get_mut(&id).filter(|f| f.state == State::Receiving) else { return };
        f.bad_chunks += 1;
        if f.bad_chunks > MAX_BAD_CHUNKS {
            let message = "chunks keep failing verification (corruption on the path or in memory); check the network and hosts".to_string();
            return self.fail(id, Side::Network, message);
        }
        self.actions.push_back(Action::AskAgain { id, chunk: index });
    }

    /// Writing a chunk failed.
    pub fn write_failed(&mut self, id: u64, trouble: Trouble, message: String) {
        if trouble == Trouble::NoSpace {
            // Every other file would fail the same way: stop, keeping what is verified.
            return self.stop(Side::Destination, trouble, message);
        }
        if self.files.contains_key(&id) {
            self.fail(id, Side::Destination, message);
        }
    }

    /// The sender's `FileEnd`: the file's hash, and its size and mtime now (a file changed
    /// while it was sent fails, keeping its verified part for the next run).
    pub fn file_end(&mut self, id: u64, hash: [u8; 32], size: u64, mtime: (i64, u32)) -> Result<(), Refused> {
        let f = self.files.get_mut(&id).ok_or(Refused::UnknownFile)?;
        if f.state != State::Receiving {
            return Ok(());
        }
        if size != f.spec.size || mtime != f.spec.mtime {
            self.fail(id, Side::Source, "file changed while it was being sent; re-run to send the new version".into());
            return Ok(());
        }
        f.assembly.as_mut().expect("a receiving file has its assembly").set_expected(hash);
        self.try_complete(id);
        Ok(())
    }

    /// The sender could not send the file (it said why in `FileError`).
    pub fn peer_failed(&mut self, id: u64, side: Side, message: String) {
        if self.files.get(&id).is_some_and(|f| f.state != State::Finalizing) {
            self.finish(id, Outcome::Failed { side, message, tell_peer: false });
        }
    }

    /// The file is durable and under its final name.
    pub fn finalized(&mut self, id: u64) {
        let f = self.files.get(&id).expect("finalized() answers a Finalize");
        assert_eq!(f.state, State::Finalizing, "file {id} finalized twice");
        self.finish(id, Outcome::Landed);
    }

    /// Making the file durable or publishing it failed. A whole-file mismatch (found on a
    /// `--verify full` re-read) starts the file over once.
    pub fn finalize_failed(&mut self, id: u64, trouble: Trouble, message: String) {
        let f = self.files.get_mut(&id).expect("finalize_failed() answers a Finalize");
        assert_eq!(f.state, State::Finalizing, "file {id} was not being finalized");
        if trouble == Trouble::WholeFileMismatch && f.retries < MAX_FILE_RETRIES {
            self.finalizing -= 1;
            let size = f.spec.size;
            self.holding -= usize::from(self.holds(size));
            self.start_over(id);
            return;
        }
        if trouble == Trouble::NoSpace {
            return self.stop(Side::Destination, trouble, message);
        }
        self.finish(id, Outcome::Failed { side: Side::Destination, message, tell_peer: true });
    }

    /// The next thing to do, or `None` until the next input.
    pub fn poll_action(&mut self) -> Option<Action<T>> {
        if let Some(a) = self.actions.pop_front() {
            return Some(a);
        }
        if self.stopped {
            return None;
        }
        assert!(self.preparing.is_none(), "poll_action() before the last Prepare was answered");
        // Fill the whole window now, in messages of at most MAX_WANT_BATCH files: waiting for
        // the next input between messages would let a path with many small files run dry.
        if self.batch.len() < MAX_WANT_BATCH
            && let Some(&next) = self.pending.front()
            && self.has_room(next)
        {
            let id = self.pending.pop_front().expect("peeked");
            let f = self.files.get_mut(&id).expect("a pending file is held");
            debug_assert_eq!(f.state, State::Pending);
            f.state = State::Preparing;
            self.preparing = Some(id);
            return Some(Action::Prepare { id, start_over: f.retries > 0 });
        }
        if !self.batch.is_empty() {
            return Some(Action::Want(std::mem::take(&mut self.batch)));
        }
        None
    }

    /// Whether file `id` may be set up now. A file of more than one chunk also needs a place
    /// among those holding descriptors; the queue stays in order (no file overtakes one
    /// waiting for that place), so the sender's walk order is kept.
    fn has_room(&self, id: u64) -> bool {
        let holds = self.files.get(&id).is_some_and(|f| self.holds(f.spec.size));
        self.receiving + self.finalizing < self.files_allowed && self.outstanding_bytes < self.window.bytes && (!holds || self.holding < self.window.held)
    }

    /// Whether a file of this size holds descriptors while in flight (more than one chunk).
    fn holds(&self, size: u64) -> bool {
        crate::chunk::chunk_count(size, self.chunk_size) > 1
    }

    /// A verified file goes to be finalized; a file whose chunks add up to another file
    /// starts over (once).
    fn try_complete(&mut self, id: u64) {
        let f = self.files.get_mut(&id).expect("caller checked");
        let Some(a) = f.assembly.as_ref().filter(|a| a.is_ready()) else { return };
        if f.state != State::Receiving {
            return;
        }
        assert_eq!(f.outstanding, 0, "file {id} complete with bytes outstanding");
        self.receiving -= 1;
        if a.verify().is_err() {
            self.holding -= usize::from(a.chunks() > 1);
            // A journal from an older version of the source, say: start this file over once.
            // A stripe's part is shared with the file's other stripes: it is only not resumed.
            if !a.is_stripe() {
                self.actions.push_back(Action::Abandon { id });
            }
            f.state = State::Pending;
            f.assembly = None;
            if f.retries < MAX_FILE_RETRIES {
                self.start_over(id);
            } else {
                self.finish(
                    id,
                    Outcome::Failed {
                        side: Side::Network,
                        message: "whole-file hash does not match the source's after starting the file over; re-run, and check the hosts' memory and the path if it happens again".into(),
                        tell_peer: true,
                    },
                );
            }
            return;
        }
        let every = |range: std::ops::Range<u64>| range.map(|i| a.hash_of(i).expect("every chunk verified"));
        let wanted = a.wanted();
        let stripe = a.is_stripe().then(|| (wanted.start, wanted.end, stripe_hash(a.size, wanted.start, every(wanted.clone()))));
        let hash = stripe.is_none().then(|| file_hash(a.size, every(0..a.chunks())));
        f.state = State::Finalizing;
        f.assembly = None;
        self.finalizing += 1;
        let Some(hash) = hash else {
            let (first, end, stripe_hash) = stripe.expect("a stripe when not a file");
            self.actions.push_back(Action::StripeVerified { id, first, end, stripe_hash });
            return;
        };
        // With the window full, nothing more can arrive before this batch is done: do not wait.
        let more_coming = self.receiving > 0 && self.receiving + self.finalizing < self.files_allowed;
        self.actions.push_back(Action::Finalize { id, file_hash: hash, more_coming });
    }

    fn start_over(&mut self, id: u64) {
        let f = self.files.get_mut(&id).expect("caller checked");
        f.retries += 1;
        f.state = State::Pending;
        f.assembly = None;
        f.bad_chunks = 0;
        self.pending.push_front(id);
    }

    /// Fails a file the driver learned something bad about (its data stays for the next run).
    fn fail(&mut self, id: u64, side: Side, message: String) {
        if self.files.get(&id).is_some_and(|f| f.state != State::Finalizing) {
            self.finish(id, Outcome::Failed { side, message, tell_peer: true });
        }
    }

    /// Takes the file out of the window and the machine.
    fn finish(&mut self, id: u64, outcome: Outcome) {
        let f = self.files.remove(&id).expect("caller checked");
        if matches!(f.state, State::Receiving | State::Finalizing) && self.holds(f.spec.size) {
            self.holding -= 1;
        }
        match f.state {
            State::Receiving => {
                assert!(self.outstanding_bytes >= f.outstanding);
                self.outstanding_bytes -= f.outstanding;
                self.receiving -= 1;
            }
            State::Finalizing => self.finalizing -= 1,
            State::Pending => self.pending.retain(|&p| p != id),
            State::Preparing => unreachable!("a file being prepared is answered first"),
        }
        if outcome == Outcome::Landed {
            self.files_allowed = (self.files_allowed + 1).min(self.window.files);
        }
        self.actions.push_back(Action::Done { id, payload: f.payload, outcome });
    }

    fn stop(&mut self, side: Side, trouble: Trouble, message: String) {
        self.stopped = true;
        self.actions.push_back(Action::Stop { side, trouble, message });
    }

    /// Checks the window's bookkeeping against the files (O(files in flight): tests and the
    /// simulation call it after every step).
    pub fn check_invariants(&self) {
        let mut bytes = 0;
        let (mut receiving, mut finalizing) = (0, 0);
        for (id, f) in &self.files {
            match f.state {
                State::Receiving => {
                    receiving += 1;
                    bytes += f.outstanding;
                    assert!(f.assembly.is_some(), "receiving file {id} has no assembly");
                }
                State::Finalizing => finalizing += 1,
                State::Pending | State::Preparing => assert_eq!(f.outstanding, 0),
            }
        }
        assert_eq!(bytes, self.outstanding_bytes, "outstanding bytes disagree with the files");
        assert_eq!((receiving, finalizing), (self.receiving, self.finalizing), "file counts disagree");
        let holding = self.files.values().filter(|f| matches!(f.state, State::Receiving | State::Finalizing) && self.holds(f.spec.size)).count();
        assert_eq!(holding, self.holding, "files holding descriptors disagree with the files");
        assert!(self.holding <= self.window.held, "{} files hold descriptors, window {}", self.holding, self.window.held);
        assert!(self.files_allowed >= 1 && self.files_allowed <= self.window.files);
        assert!(self.pending.len() <= self.files.len());
    }

    /// Bytes wanted and not yet arrived, and files receiving or finalizing (for the driver's
    /// progress and the simulation's window checks).
    pub fn in_flight(&self) -> (u64, usize) {
        (self.outstanding_bytes, self.receiving + self.finalizing)
    }

    /// Files of more than one chunk in flight (each holds descriptors on the driver's side).
    pub fn holding(&self) -> usize {
        self.holding
    }

    /// The most files in flight at once in this session, and the most of them holding
    /// descriptors.
    pub fn peak(&self) -> (usize, usize) {
        self.peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: u32 = 64 << 10;

    fn machine(bytes: u64, files: usize) -> Receiver<&'static str> {
        Receiver::new(Window { bytes, files, held: files }, CHUNK)
    }

    fn spec(id: u64, size: u64) -> FileSpec {
        FileSpec { id, size, mtime: (1, 2), stripe: None }
    }

    fn h(i: u64) -> [u8; 32] {
        *blake3::hash(&i.to_le_bytes()).as_bytes()
    }

    fn drain(r: &mut Receiver<&'static str>) -> Vec<Action<&'static str>> {
        let mut out = Vec::new();
        while let Some(a) = r.poll_action() {
            if let Action::Prepare { id, .. } = a {
                r.prepared(id, []);
            }
            out.push(a);
            r.check_invariants();
        }
        out
    }

    fn complete(r: &mut Receiver<&'static str>, id: u64, size: u64) {
        let n = crate::chunk::chunk_count(size, CHUNK);
        for i in 0..n {
            r.chunk_stored(id, i, h(i), false).unwrap();
        }
        let hashes: Vec<_> = (0..n).map(h).collect();
        r.file_end(id, file_hash(size, &hashes), size, (1, 2)).unwrap();
    }

    #[test]
    fn a_stripe_wants_only_its_chunks_and_is_verified_without_publishing() {
        let size = 6 * u64::from(CHUNK);
        let mut r = machine(1 << 30, 4);
        r.announce(FileSpec { stripe: Some((2, 4)), ..spec(0, size) }, "f");
        assert!(matches!(r.poll_action(), Some(Action::Prepare { id: 0, start_over: false })));
        // The store holds chunk 0 (another stripe's) and chunk 2 (this one's): only 3 is wanted.
        r.prepared(0, [(0, h(0)), (2, h(2))]);
        let a = drain(&mut r);
        assert!(matches!(&a[..], [Action::Want(w)] if w[0].ranges == vec![(3, 1)]), "{a:?}");
        assert_eq!(r.chunk_stored(0, 4, h(4), false), Err(Refused::ChunkOutOfRange), "another stripe's chunk");
        r.chunk_stored(0, 3, h(3), false).unwrap();
        r.file_end(0, crate::chunk::stripe_hash(size, 2, &[h(2), h(3)]), size, (1, 2)).unwrap();
        assert!(matches!(drain(&mut r)[..], [Action::StripeVerified { id: 0, first: 2, end: 4, .. }]), "verified, never finalized under its name");
        r.finalized(0);
        assert!(matches!(drain(&mut r)[..], [Action::Done { id: 0, outcome: Outcome::Landed, .. }]));

        // A stripe that does not add up starts over without throwing the shared part away.
        r.announce(FileSpec { stripe: Some((0, 2)), ..spec(1, size) }, "f");
        drain(&mut r);
        r.chunk_stored(1, 0, h(0), false).unwrap();
        r.chunk_stored(1, 1, h(1), false).unwrap();
        r.file_end(1, file_hash(size, &[h(0), h(1)]), size, (1, 2)).unwrap();
        let a = drain(&mut r);
        assert!(a.iter().all(|a| !matches!(a, Action::Abandon { .. })), "the part is the other stripes' too: {a:?}");
        assert!(a.iter().any(|a| matches!(a, Action::Prepare { id: 1, start_over: true })), "{a:?}");
    }

    #[test]
    fn a_file_of_sealed_stripes_is_published_without_asking_the_sender() {
        let size = 6 * u64::from(CHUNK);
        let mut r = machine(1 << 30, 4);
        r.announce(spec(0, size), "f");
        assert!(matches!(r.poll_action(), Some(Action::Prepare { id: 0, start_over: false })));
        r.prepared_sealed(0, (0..6).map(|i| (i, h(i))).collect());
        let want = file_hash(size, &(0..6).map(h).collect::<Vec<_>>());
        assert_eq!(drain(&mut r), vec![Action::Finalize { id: 0, file_hash: want, more_coming: false }], "no Want: the sender reads nothing");
        r.finalized(0);
        assert!(matches!(drain(&mut r)[..], [Action::Done { id: 0, outcome: Outcome::Landed, .. }]));

        // Seals that leave a chunk out are an ordinary resume: the rest is asked for.
        r.announce(spec(1, size), "f");
        assert!(matches!(r.poll_action(), Some(Action::Prepare { id: 1, .. })));
        r.prepared_sealed(1, (0..5).map(|i| (i, h(i))).collect());
        assert!(matches!(&drain(&mut r)[..], [Action::Want(w)] if w[0].ranges == vec![(5, 1)]));
    }

    #[test]
    fn the_window_holds_files_until_earlier_ones_land() {
        let mut r = machine(1 << 30, 2);
        for id in 0..3 {
            r.announce(spec(id, 100), "f");
        }
        let a = drain(&mut r);
        let wanted: Vec<u64> = a.iter().filter_map(|a| if let Action::Want(w) = a { Some(w.iter().map(|w| w.id).collect::<Vec<_>>()) } else { None }).flatten().collect();
        assert_eq!(wanted, vec![0, 1], "two files fit the window");
        complete(&mut r, 0, 100);
        assert!(matches!(drain(&mut r)[..], [Action::Finalize { id: 0, .. }]), "finalizing still holds its place");
        r.finalized(0);
        let a = drain(&mut r);
        assert!(matches!(&a[0], Action::Done { id: 0, outcome: Outcome::Landed, .. }));
        assert!(a.iter().any(|a| matches!(a, Action::Want(w) if w[0].id == 2)), "the landed file's place goes to the next");
    }

    #[test]
    fn one_chunk_files_fill_the_window_past_the_files_holding_descriptors() {
        // Two files may hold descriptors (the descriptor limit's share), 64 may be in flight.
        let mut r = Receiver::new(Window { bytes: 1 << 30, files: 64, held: 2 }, CHUNK);
        for id in 0..40 {
            r.announce(spec(id, 100), "small");
        }
        let big = 3 * u64::from(CHUNK);
        for id in 40..44 {
            r.announce(spec(id, big), "big");
        }
        r.announce(spec(44, 100), "small after the big ones");
        let wanted: Vec<u64> = drain(&mut r).iter().filter_map(|a| if let Action::Want(w) = a { Some(w.iter().map(|w| w.id).collect::<Vec<_>>()) } else { None }).flatten().collect();
        assert_eq!(wanted, (0..42).collect::<Vec<_>>(), "every one-chunk file and two of the larger ones; the queue keeps its order");
        assert_eq!((r.in_flight().1, r.holding()), (42, 2));
        // A one-chunk file landing frees no descriptor: the third large file still waits.
        complete(&mut r, 0, 100);
        drain(&mut r);
        r.finalized(0);
        assert!(!drain(&mut r).iter().any(|a| matches!(a, Action::Want(_))));
        // A large one landing lets the next in.
        complete(&mut r, 40, big);
        drain(&mut r);
        r.finalized(40);
        let a = drain(&mut r);
        assert!(a.iter().any(|a| matches!(a, Action::Want(w) if w[0].id == 42)), "{a:?}");
        assert_eq!(r.peak(), (42, 2));
    }

    #[test]
    fn resumed_chunks_are_not_asked_for_again() {
        let mut r = machine(1 << 30, 8);
        r.announce(spec(7, 5 * u64::from(CHUNK)), "f");
        assert_eq!(r.poll_action(), Some(Action::Prepare { id: 7, start_over: false }));
        r.prepared(7, [(0, h(0)), (1, h(1)), (3, h(3))]);
        assert_eq!(r.poll_action(), Some(Action::Want(vec![WantFile { id: 7, ranges: vec![(2, 1), (4, 1)] }])));
        assert_eq!(r.in_flight(), (2 * u64::from(CHUNK), 1));
    }

    #[test]
    fn a_whole_file_mismatch_starts_over_once_then_fails() {
        let mut r = machine(1 << 30, 8);
        let size = 3 * u64::from(CHUNK);
        r.announce(spec(1, size), "f");
        drain(&mut r);
        for i in 0..3 {
            r.chunk_stored(1, i, h(i), false).unwrap();
        }
        r.file_end(1, [9; 32], size, (1, 2)).unwrap();
        let a = drain(&mut r);
        assert_eq!(a[0], Action::Abandon { id: 1 });
        assert_eq!(a[1], Action::Prepare { id: 1, start_over: true });
        for i in 0..3 {
            r.chunk_stored(1, i, h(i), false).unwrap();
        }
        r.file_end(1, [9; 32], size, (1, 2)).unwrap();
        let a = drain(&mut r);
        assert!(matches!(&a[1], Action::Done { id: 1, outcome: Outcome::Failed { tell_peer: true, .. }, .. }), "{a:?}");
        assert!(r.is_finished() || !r.manifest_end);
    }

    #[test]
    fn corrupt_chunks_are_asked_for_again_up_to_a_bound() {
        let mut r = machine(1 << 30, 8);
        r.announce(spec(1, 100), "f");
        drain(&mut r);
        for _ in 0..MAX_BAD_CHUNKS {
            r.chunk_corrupt(1, 0);
            assert_eq!(r.poll_action(), Some(Action::AskAgain { id: 1, chunk: 0 }));
        }
        r.chunk_corrupt(1, 0);
        assert!(matches!(r.poll_action(), Some(Action::Done { outcome: Outcome::Failed { side: Side::Network, .. }, .. })));
        r.chunk_corrupt(1, 0);
        assert_eq!(r.poll_action(), None, "a failed file's late chunks say nothing more");
        r.check_invariants();
    }

    #[test]
    fn out_of_descriptors_lowers_the_window_and_waits_when_nothing_is_in_flight() {
        let mut r = machine(1 << 30, 16);
        r.announce(spec(1, 100), "a");
        r.announce(spec(2, 100), "b");
        assert_eq!(r.poll_action(), Some(Action::Prepare { id: 1, start_over: false }));
        r.prepare_failed(1, Trouble::ResourceLimit, "EMFILE".into());
        assert_eq!(r.poll_action(), Some(Action::Throttled { files: 1, window: 16 }));
        assert_eq!(r.poll_action(), Some(Action::Wait(Duration::from_millis(20))));
        assert_eq!(r.poll_action(), Some(Action::Prepare { id: 1, start_over: false }));
        r.prepared(1, []);
        assert!(matches!(r.poll_action(), Some(Action::Want(w)) if w.len() == 1), "one file at a time now");
        complete(&mut r, 1, 100);
        drain(&mut r);
        r.finalized(1);
        let a = drain(&mut r);
        assert!(a.iter().any(|a| matches!(a, Action::Want(w) if w[0].id == 2)));
    }

    #[test]
    fn no_space_stops_the_session() {
        let mut r = machine(1 << 30, 8);
        r.announce(spec(1, 100), "f");
        drain(&mut r);
        r.write_failed(1, Trouble::NoSpace, "No space left on device".into());
        assert!(matches!(r.poll_action(), Some(Action::Stop { trouble: Trouble::NoSpace, .. })));
        r.announce(spec(2, 100), "g");
        assert_eq!(r.poll_action(), None);
    }

    #[test]
    fn a_file_changed_at_the_source_fails_and_its_peers_go_on() {
        let mut r = machine(1 << 30, 8);
        r.announce(spec(1, 100), "f");
        r.announce(spec(2, 100), "g");
        r.manifest_end();
        drain(&mut r);
        r.chunk_stored(1, 0, h(0), false).unwrap();
        r.file_end(1, file_hash(100, [&h(0)]), 200, (1, 2)).unwrap();
        assert!(matches!(r.poll_action(), Some(Action::Done { id: 1, outcome: Outcome::Failed { side: Side::Source, .. }, .. })));
        r.chunk_stored(2, 0, h(5), true).unwrap();
        assert!(matches!(r.poll_action(), Some(Action::Finalize { id: 2, .. })));
        r.finalized(2);
        drain(&mut r);
        assert!(r.is_finished());
    }

    #[test]
    fn unknown_files_and_chunks_out_of_range_are_refused() {
        let mut r = machine(1 << 30, 8);
        assert_eq!(r.chunk_stored(3, 0, h(0), false), Err(Refused::UnknownFile));
        r.announce(spec(1, 100), "f");
        drain(&mut r);
        assert_eq!(r.chunk_stored(1, 5, h(0), false), Err(Refused::ChunkOutOfRange));
        assert_eq!(r.file_end(4, [0; 32], 1, (1, 2)), Err(Refused::UnknownFile));
    }
}
