//! The sending side's per-file decisions: which chunks to read and send when the receiver wants
//! a file, asks for a chunk again or resets a stream; when every chunk of a file went out and its
//! whole-file hash can be sent; how a file ends (landed, skipped as identical, failed at the
//! source or at the receiver); and when the session is finished.
//!
//! Lifecycle of a regular file: `Announced` (the walker sent its entry) → `Active` (wanted: its
//! chunks are read and sent, those the receiver already holds only hashed) → gone, reported as
//! [`Action::Done`] on the receiver's `FileDone`, its `Skip`, its `FileError`, or a read that
//! failed here. A file leaves the machine (and its memory) as soon as it is finished, so memory
//! grows with the files in flight (at most `files_ahead`, which the walker is held to), not with
//! the tree. Other entries (directories, links) carry no data; the machine keeps their payload
//! only so that a receiver's `FileError` about one can name it.
//!
//! The driver's contract: poll actions until `None` after every input (inputs may be fed while
//! draining: [`Action::FileEnd`] is answered by sending `FileEnd`, or by [`Sender::read_failed`]
//! when the source changed). An input about a file the peer cannot know (an id never announced,
//! a chunk outside the file, data wanted for a directory) is refused with a [`Refused`], which
//! the driver turns into a protocol error; an input about a file this side already finished is
//! stale (the peer had not heard yet) and changes nothing.

use std::collections::{HashMap, VecDeque};

use crate::ProtoError;
use crate::Side;
use crate::chunk::{ChunkSet, chunk_count, chunk_range, file_hash, stripe_hash, validate_ranges};

/// Why reading a source file failed, as far as a decision or a report depends on it. The wording
/// for people travels beside it as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadTrouble {
    /// Its size or mtime is no longer what was announced (or it ended early): re-run to send
    /// the new version.
    Changed,
    /// It vanished since the walk.
    NotFound,
    PermissionDenied,
    /// Out of descriptors or memory even after waiting.
    ResourceLimit,
    Other,
}

/// One chunk to read from the source: to send on a data stream, or (`hash_only`) only to hash,
/// because the receiver holds it already and the whole-file hash covers every chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    pub id: u64,
    pub chunk: u64,
    pub offset: u64,
    pub len: u32,
    /// The file's only chunk: its frame completes the file (the driver checks the source did
    /// not change before sending it).
    pub whole: bool,
    pub hash_only: bool,
    /// Sent again after a stream reset or a bad record: counts as a resend.
    pub resend: bool,
}

/// How a file ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The receiver verified it, made it durable and put it under its final name (`FileDone`).
    Landed,
    /// The receiver holds it already, identical (`Skip`).
    Skipped,
    /// Failed. `trouble`: what went wrong at the source (`Other` when the receiver failed it);
    /// `tell_peer`: the driver sends `FileError` with this message (it failed here, the
    /// receiver does not know yet).
    Failed { side: Side, trouble: ReadTrouble, message: String, tell_peer: bool },
}

/// Why the session stops before it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The receiver said goodbye with files unfinished.
    PeerEnded,
}

/// What the driver does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Action<T> {
    /// Read a chunk (and send it, unless only its hash is needed); answer with
    /// [`Sender::chunk_sent`], or [`Sender::read_failed`].
    Read(Read),
    /// Every chunk of a multi-chunk file was read and sent: check the source still has the
    /// announced size and mtime and send `FileEnd` with this hash, or answer
    /// [`Sender::read_failed`] with [`ReadTrouble::Changed`].
    FileEnd { id: u64, file_hash: [u8; 32] },
    /// The file is finished and forgotten; `payload` is what the driver gave at announce.
    Done { id: u64, payload: T, outcome: Outcome },
    /// The receiver reported an error about an entry not in flight (a directory, a link, or a
    /// file already finished here): report it; [`Sender::payload`] names the entry if it is
    /// not a finished file.
    PeerError { id: u64, side: Side, message: String },
    /// Every file is finished, the walk is done and the receiver's summary arrived: say goodbye.
    Finish,
    /// End the session now.
    Stop(StopReason),
}

/// An input the machine refuses: the peer asked about something it cannot know.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// An id never announced.
    UnknownFile,
    /// Data wanted for an entry that is not a regular file.
    NotAFile,
    /// Wanted while its chunks are still being sent.
    NotWaiting,
    /// A chunk range outside the file, or empty.
    BadRanges(ProtoError),
    /// A chunk asked for again that is outside the file.
    ChunkOutOfRange,
    /// A chunk asked for again of a file never wanted.
    NotInFlight,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Announced,
    Active,
}

struct File<T> {
    size: u64,
    chunks: u64,
    /// The chunks this session moves: all (`0..chunks`), or a stripe's.
    first: u64,
    end: u64,
    payload: T,
    state: State,
    /// Chunk hashes of a multi-chunk file's chunks `first..end`, filled as chunks are read
    /// (for the `FileEnd`).
    hashes: Vec<Option<[u8; 32]>>,
    /// Hashes still missing from `hashes`.
    unhashed: u64,
    /// Reads queued and not yet answered.
    outstanding: u64,
    end_sent: bool,
}

/// The sending side's decisions for one session.
pub struct Sender<T> {
    chunk_size: u32,
    /// Regular files announced and not finished, at most this many (the walker waits).
    files_ahead: u64,
    files: HashMap<u64, File<T>>,
    /// Entries that are not regular files: nothing to send, kept to name them in errors.
    others: HashMap<u64, T>,
    next_id: u64,
    /// Regular files announced, and finished.
    announced: u64,
    finished: u64,
    /// Files in `Active`.
    active: usize,
    /// Reads queued and not answered, over every file.
    outstanding: u64,
    walk_done: bool,
    summary: bool,
    over: bool,
    actions: VecDeque<Action<T>>,
}

impl<T> Sender<T> {
    pub fn new(chunk_size: u32, files_ahead: u64) -> Self {
        assert!(chunk_size > 0 && files_ahead > 0);
        Self {
            chunk_size,
            files_ahead,
            files: HashMap::new(),
            others: HashMap::new(),
            next_id: 0,
            announced: 0,
            finished: 0,
            active: 0,
            outstanding: 0,
            walk_done: false,
            summary: false,
            over: false,
            actions: VecDeque::new(),
        }
    }

    /// Whether the walk may announce another regular file now.
    pub fn may_announce(&self) -> bool {
        self.announced - self.finished < self.files_ahead
    }

    /// The walker announced a regular file (ids are given in order, from 0).
    pub fn announce_file(&mut self, id: u64, size: u64, payload: T) {
        self.announce_stripe(id, size, None, payload);
    }

    /// The walker sent a file's entry of which only chunks `stripe = first..end` move (a
    /// stripe, `Entry::stripe`); `None`: all of them. A stripe is of a file of several chunks
    /// and leaves some out (the driver sends a whole file as a file).
    pub fn announce_stripe(&mut self, id: u64, size: u64, stripe: Option<(u64, u64)>, payload: T) {
        assert_eq!(id, self.next_id, "entries are announced in id order");
        assert!(self.may_announce(), "the walk ran more than {} files ahead", self.files_ahead);
        let chunks = chunk_count(size, self.chunk_size);
        let (first, end) = stripe.unwrap_or((0, chunks));
        assert!(first < end && end <= chunks && (stripe.is_none() || chunks > 1), "stripe {first}..{end} of a {chunks}-chunk file");
        let file = File { size, chunks, first, end, payload, state: State::Announced, hashes: Vec::new(), unhashed: 0, outstanding: 0, end_sent: false };
        self.files.insert(id, file);
        self.next_id += 1;
        self.announced += 1;
    }

    /// The walker announced a directory or a link.
    pub fn announce_other(&mut self, id: u64, payload: T) {
        assert_eq!(id, self.next_id, "entries are announced in id order");
        self.others.insert(id, payload);
        self.next_id += 1;
    }

    /// The walk announced its last entry.
    pub fn walk_done(&mut self) {
        self.walk_done = true;
    }

    /// The receiver's summary arrived (it comes once every file is settled on its side).
    pub fn summary(&mut self) {
        self.summary = true;
    }

    /// Regular files announced, and finished (the walker stays within `files_ahead` of them).
    pub fn counts(&self) -> (u64, u64) {
        (self.announced, self.finished)
    }

    /// Files announced and not finished.
    pub fn unfinished(&self) -> usize {
        self.files.len()
    }

    /// What the driver gave with the entry, while the machine holds it.
    pub fn payload(&self, id: u64) -> Option<&T> {
        self.files.get(&id).map(|f| &f.payload).or_else(|| self.others.get(&id))
    }

    /// Whether the file's chunks are being sent (a reset stream's frames of other files are
    /// dropped).
    pub fn is_active(&self, id: u64) -> bool {
        self.files.get(&id).is_some_and(|f| f.state == State::Active)
    }

    /// The receiver's `Want` for one file: these ranges are sent, the other chunks only hashed.
    /// Wanted again once all of it was sent (or its FileEnd went out), the file starts over
    /// (the receiver found a whole-file mismatch: a partial of an older version, or a chunk
    /// re-read after the source changed).
    pub fn want(&mut self, id: u64, ranges: &[(u64, u32)]) -> Result<(), Refused> {
        if !self.known(id)? {
            return Ok(());
        }
        let f = self.files.get_mut(&id).expect("known");
        // A restart follows the receiver's check of the whole file, so it comes once the file
        // was all sent, or after its FileEnd (reads asked for again since may still be queued:
        // their answers count in this round, and the FileEnd's check of the source decides).
        // Anything sooner is refused: one small message must not queue a file's reads again
        // and again.
        let restart = f.state == State::Active && (f.outstanding == 0 || f.end_sent || f.chunks == 1);
        if !(f.state == State::Announced || restart) {
            return Err(Refused::NotWaiting);
        }
        validate_ranges(ranges, f.chunks).map_err(Refused::BadRanges)?;
        if ranges.iter().any(|&(start, count)| start < f.first || start + u64::from(count) > f.end) {
            return Err(Refused::BadRanges(ProtoError::Invalid { what: "want", why: "chunks outside the stripe" }));
        }
        if f.state == State::Announced {
            self.active += 1;
        }
        f.state = State::Active;
        f.end_sent = false;
        let count = f.end - f.first;
        if f.chunks > 1 {
            f.hashes = vec![None; count as usize];
            f.unhashed = count;
        }
        let mut wanted = ChunkSet::new(f.chunks);
        for &(start, count) in ranges {
            for c in start..start + u64::from(count) {
                if wanted.insert(c) {
                    self.actions.push_back(Action::Read(read(id, f, c, self.chunk_size, false, false)));
                }
            }
        }
        for c in (f.first..f.end).filter(|&c| !wanted.contains(c)) {
            self.actions.push_back(Action::Read(read(id, f, c, self.chunk_size, true, false)));
        }
        f.outstanding += count;
        self.outstanding += count;
        Ok(())
    }

    /// The receiver's `ChunkBad`: the chunk failed verification there; send it again.
    pub fn ask_again(&mut self, id: u64, chunk: u64) -> Result<(), Refused> {
        if !self.known(id).map_err(|e| if e == Refused::NotAFile { Refused::NotInFlight } else { e })? {
            return Ok(());
        }
        let f = self.files.get_mut(&id).expect("known");
        if chunk < f.first || chunk >= f.end {
            return Err(Refused::ChunkOutOfRange);
        }
        if f.state != State::Active {
            return Err(Refused::NotInFlight);
        }
        f.outstanding += 1;
        self.outstanding += 1;
        self.actions.push_back(Action::Read(read(id, f, chunk, self.chunk_size, false, false)));
        Ok(())
    }

    /// A frame of a reset stream (or a record the receiver skipped) goes again, if its file is
    /// still being sent. `count_in`: this copy adds a read to answer (the first copy's answer
    /// came or will come); false when the first copy will never be answered. True if queued.
    pub fn resend(&mut self, id: u64, chunk: u64, count_in: bool) -> bool {
        let Some(f) = self.files.get_mut(&id).filter(|f| f.state == State::Active && (f.first..f.end).contains(&chunk)) else { return false };
        if count_in {
            f.outstanding += 1;
            self.outstanding += 1;
        }
        self.actions.push_back(Action::Read(read(id, f, chunk, self.chunk_size, false, true)));
        true
    }

    /// A read that a reset stream's worker handed back: still to send if the file is active.
    pub fn requeue(&self, id: u64) -> bool {
        self.is_active(id)
    }

    /// A queued read was answered: the chunk was read, hashed and sent (or only hashed). The
    /// last one of a multi-chunk file leads to its `FileEnd`. Returns false for a file already
    /// finished (only its bytes count).
    pub fn chunk_sent(&mut self, id: u64, chunk: u64, hash: [u8; 32]) -> bool {
        let Some(f) = self.files.get_mut(&id) else { return false };
        debug_assert_eq!(f.state, State::Active, "file {id}: a read answered that was never queued");
        debug_assert!((f.first..f.end).contains(&chunk));
        if f.state != State::Active || !(f.first..f.end).contains(&chunk) {
            return false;
        }
        if f.chunks > 1 && f.hashes[(chunk - f.first) as usize].replace(hash).is_none() {
            f.unhashed -= 1;
        }
        debug_assert!(f.outstanding > 0 && self.outstanding > 0, "file {id}: more reads answered than queued");
        f.outstanding = f.outstanding.saturating_sub(1);
        self.outstanding = self.outstanding.saturating_sub(1);
        if f.outstanding == 0 && f.chunks > 1 && !f.end_sent && f.unhashed == 0 {
            f.end_sent = true;
            let hashes: Vec<[u8; 32]> = f.hashes.iter().map(|h| h.expect("every chunk hashed")).collect();
            let hash = if f.end - f.first < f.chunks { stripe_hash(f.size, f.first, &hashes) } else { file_hash(f.size, &hashes) };
            self.actions.push_back(Action::FileEnd { id, file_hash: hash });
        }
        true
    }

    /// Reading the file failed here, or it changed at the source: it fails, and the receiver is
    /// told. A file already finished (a late read of a resend) changes nothing.
    pub fn read_failed(&mut self, id: u64, trouble: ReadTrouble, message: String) {
        if self.is_active(id) {
            self.finish(id, Outcome::Failed { side: Side::Source, trouble, message, tell_peer: true });
        }
    }

    /// The receiver's `Skip`: it holds the file already, identical.
    pub fn skip(&mut self, id: u64) -> Result<(), Refused> {
        let held = self.known(id).or_else(|e| if e == Refused::NotAFile { Ok(false) } else { Err(e) })?;
        if held && self.files[&id].state == State::Announced {
            self.finish(id, Outcome::Skipped);
        }
        Ok(())
    }

    /// The receiver's `FileDone`: verified, durable, under its final name.
    pub fn file_done(&mut self, id: u64) -> Result<(), Refused> {
        if self.known(id).or_else(|e| if e == Refused::NotAFile { Ok(false) } else { Err(e) })? {
            self.finish(id, Outcome::Landed);
        }
        Ok(())
    }

    /// The receiver's `FileError`: it could not take the entry.
    pub fn peer_failed(&mut self, id: u64, side: Side, message: String) -> Result<(), Refused> {
        if id >= self.next_id {
            return Err(Refused::UnknownFile);
        }
        if self.files.contains_key(&id) {
            self.finish(id, Outcome::Failed { side, trouble: ReadTrouble::Other, message, tell_peer: false });
        } else {
            self.actions.push_back(Action::PeerError { id, side, message });
        }
        Ok(())
    }

    /// The receiver said goodbye: the end of a finished session, or an early stop.
    pub fn peer_ended(&mut self) {
        if !self.is_finished() && !self.over {
            self.over = true;
            self.actions.push_back(Action::Stop(StopReason::PeerEnded));
        }
    }

    /// Every announced file finished, the walk done, the summary in.
    pub fn is_finished(&self) -> bool {
        self.walk_done && self.summary && self.files.is_empty()
    }

    /// The next thing to do, or `None` until the next input.
    pub fn poll_action(&mut self) -> Option<Action<T>> {
        if let Some(a) = self.actions.pop_front() {
            return Some(a);
        }
        if !self.over && self.is_finished() {
            self.over = true;
            return Some(Action::Finish);
        }
        None
    }

    /// Whether the file the peer names is held: `Err` if the peer cannot know it as a file,
    /// `Ok(false)` if it finished here already.
    fn known(&self, id: u64) -> Result<bool, Refused> {
        if id >= self.next_id {
            return Err(Refused::UnknownFile);
        }
        if self.others.contains_key(&id) {
            return Err(Refused::NotAFile);
        }
        Ok(self.files.contains_key(&id))
    }

    /// Takes the file out of the machine.
    fn finish(&mut self, id: u64, outcome: Outcome) {
        let f = self.files.remove(&id).expect("caller checked");
        if f.state == State::Active {
            assert!(self.active > 0 && self.outstanding >= f.outstanding, "file {id}: counters disagree");
            self.active -= 1;
            // Reads still queued for it are answered later and dropped (the file is gone).
            self.outstanding -= f.outstanding;
        }
        self.finished += 1;
        assert!(self.finished <= self.announced);
        self.actions.push_back(Action::Done { id, payload: f.payload, outcome });
    }

    /// Checks the bookkeeping against the files (O(files in flight): tests and the simulation
    /// call it after every step).
    pub fn check_invariants(&self) {
        assert_eq!(self.files.len() as u64, self.announced - self.finished, "files held disagree with the counts");
        assert!(self.announced - self.finished <= self.files_ahead, "more files in flight than the walk may run ahead");
        assert_eq!(self.announced + self.others.len() as u64, self.next_id, "every id is a file or another entry");
        let (mut active, mut outstanding) = (0, 0);
        for (id, f) in &self.files {
            assert!(!self.others.contains_key(id));
            match f.state {
                State::Announced => assert!(f.outstanding == 0 && f.hashes.is_empty() && !f.end_sent, "file {id} announced with reads queued"),
                State::Active => {
                    active += 1;
                    outstanding += f.outstanding;
                    if f.chunks > 1 {
                        assert_eq!(f.hashes.len() as u64, f.end - f.first);
                        assert_eq!(f.unhashed, f.hashes.iter().filter(|h| h.is_none()).count() as u64, "file {id}: unhashed count");
                    }
                    assert!(!f.end_sent || f.unhashed == 0, "file {id}: FileEnd sent with chunks unhashed");
                }
            }
        }
        assert_eq!((active, outstanding), (self.active, self.outstanding), "active files or queued reads disagree");
    }
}

fn read<T>(id: u64, f: &File<T>, chunk: u64, chunk_size: u32, hash_only: bool, resend: bool) -> Read {
    let (offset, len) = chunk_range(f.size, chunk_size, chunk);
    Read { id, chunk, offset, len, whole: f.chunks == 1, hash_only, resend }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: u32 = 64 << 10;
    const C: u64 = CHUNK as u64;

    fn h(i: u64) -> [u8; 32] {
        *blake3::hash(&i.to_le_bytes()).as_bytes()
    }

    /// A sender with `sizes` announced as files 0.., and a directory after them.
    fn machine(sizes: &[u64]) -> Sender<&'static str> {
        let mut s = Sender::new(CHUNK, 1 << 15);
        for (id, &size) in sizes.iter().enumerate() {
            s.announce_file(id as u64, size, "f");
        }
        s.announce_other(sizes.len() as u64, "dir");
        s.walk_done();
        s.check_invariants();
        s
    }

    fn drain(s: &mut Sender<&'static str>) -> Vec<Action<&'static str>> {
        let mut out = Vec::new();
        while let Some(a) = s.poll_action() {
            s.check_invariants();
            out.push(a);
        }
        out
    }

    fn reads(actions: &[Action<&'static str>]) -> Vec<Read> {
        actions.iter().filter_map(|a| if let Action::Read(r) = a { Some(*r) } else { None }).collect()
    }

    /// Answers every read with the hash of its chunk index.
    fn answer(s: &mut Sender<&'static str>, rs: &[Read]) -> Vec<Action<&'static str>> {
        let mut out = Vec::new();
        for r in rs {
            s.chunk_sent(r.id, r.chunk, h(r.chunk));
            s.check_invariants();
            out.extend(drain(s));
        }
        out
    }

    #[test]
    fn a_stripe_reads_only_its_chunks_and_ends_with_the_stripe_hash() {
        let mut s = Sender::new(CHUNK, 16);
        s.announce_stripe(0, 6 * C, Some((2, 4)), "f");
        s.walk_done();
        assert!(matches!(s.want(0, &[(1, 2)]), Err(Refused::BadRanges(_))), "a chunk of another stripe is refused");
        s.want(0, &[(3, 1)]).unwrap();
        let rs = reads(&drain(&mut s));
        let got: Vec<(u64, bool)> = rs.iter().map(|r| (r.chunk, r.hash_only)).collect();
        assert_eq!(got, vec![(3, false), (2, true)], "the stripe's held chunk only hashed, nothing outside it read");
        assert_eq!(s.ask_again(0, 5), Err(Refused::ChunkOutOfRange));
        let a = answer(&mut s, &rs);
        assert_eq!(a, vec![Action::FileEnd { id: 0, file_hash: stripe_hash(6 * C, 2, &[h(2), h(3)]) }]);
        assert_ne!(stripe_hash(6 * C, 2, &[h(2), h(3)]), file_hash(6 * C, &[h(2), h(3)]), "a stripe's hash never passes for a file's");
    }

    #[test]
    fn a_want_sends_the_wanted_chunks_hashes_the_rest_then_ends_the_file() {
        let mut s = machine(&[4 * C + 10]);
        s.want(0, &[(1, 2)]).unwrap();
        let rs = reads(&drain(&mut s));
        let sent: Vec<u64> = rs.iter().filter(|r| !r.hash_only).map(|r| r.chunk).collect();
        let hashed: Vec<u64> = rs.iter().filter(|r| r.hash_only).map(|r| r.chunk).collect();
        assert_eq!((sent, hashed), (vec![1, 2], vec![0, 3, 4]));
        assert_eq!(rs[4], Read { id: 0, chunk: 4, offset: 4 * C, len: 10, whole: false, hash_only: true, resend: false });
        let a = answer(&mut s, &rs[..4]);
        assert!(a.is_empty(), "no FileEnd before every chunk is hashed: {a:?}");
        let a = answer(&mut s, &rs[4..]);
        let want = file_hash(4 * C + 10, &(0..5).map(h).collect::<Vec<_>>());
        assert_eq!(a, vec![Action::FileEnd { id: 0, file_hash: want }]);
    }

    #[test]
    fn a_single_chunk_file_ends_with_its_frame_not_a_file_end() {
        let mut s = machine(&[100]);
        s.want(0, &[(0, 1)]).unwrap();
        let rs = reads(&drain(&mut s));
        assert_eq!(rs, vec![Read { id: 0, chunk: 0, offset: 0, len: 100, whole: true, hash_only: false, resend: false }]);
        assert!(answer(&mut s, &rs).is_empty());
    }

    #[test]
    fn file_done_lands_the_file_and_forgets_it_then_the_session_finishes() {
        let mut s = machine(&[100, 200]);
        s.want(0, &[(0, 1)]).unwrap();
        let rs = reads(&drain(&mut s));
        answer(&mut s, &rs);
        s.file_done(0).unwrap();
        assert_eq!(drain(&mut s), vec![Action::Done { id: 0, payload: "f", outcome: Outcome::Landed }]);
        assert_eq!((s.payload(0), s.unfinished(), s.counts()), (None, 1, (2, 1)), "a finished file's state is gone");
        s.skip(1).unwrap();
        assert_eq!(drain(&mut s), vec![Action::Done { id: 1, payload: "f", outcome: Outcome::Skipped }]);
        assert!(drain(&mut s).is_empty(), "no Finish before the receiver's summary");
        s.summary();
        assert_eq!(drain(&mut s), vec![Action::Finish]);
        assert!(drain(&mut s).is_empty(), "Finish comes once");
    }

    #[test]
    fn a_read_failure_fails_the_file_and_tells_the_peer_and_late_answers_are_dropped() {
        let mut s = machine(&[3 * C]);
        s.want(0, &[(0, 3)]).unwrap();
        let rs = reads(&drain(&mut s));
        s.read_failed(0, ReadTrouble::Changed, "changed".into());
        match &drain(&mut s)[..] {
            [Action::Done { id: 0, outcome: Outcome::Failed { side: Side::Source, trouble: ReadTrouble::Changed, tell_peer: true, .. }, .. }] => {}
            other => panic!("{other:?}"),
        }
        assert!(!s.chunk_sent(0, rs[1].chunk, h(1)), "a late answer for a finished file only counts bytes");
        s.read_failed(0, ReadTrouble::Other, "again".into());
        assert!(drain(&mut s).is_empty(), "a file fails once");
    }

    #[test]
    fn a_chunk_asked_for_again_is_sent_again_and_the_file_end_waits_for_it() {
        let mut s = machine(&[2 * C]);
        s.want(0, &[(0, 2)]).unwrap();
        let rs = reads(&drain(&mut s));
        answer(&mut s, &rs[..1]);
        s.ask_again(0, 0).unwrap();
        let again = reads(&drain(&mut s));
        assert_eq!(again, vec![rs[0]]);
        assert!(answer(&mut s, &rs[1..]).is_empty(), "one read still queued");
        assert!(matches!(answer(&mut s, &again)[..], [Action::FileEnd { id: 0, .. }]));
    }

    #[test]
    fn a_reset_streams_frames_go_again_counted_as_their_first_copies_were() {
        let mut s = machine(&[2 * C, 100]);
        s.want(0, &[(0, 2)]).unwrap();
        let rs = reads(&drain(&mut s));
        answer(&mut s, &rs[..1]);
        // Chunk 0's Sent came (count it in again); chunk 1's never will (the worker saw the reset).
        assert!(s.resend(0, 0, true) && s.resend(0, 1, false));
        let again = reads(&drain(&mut s));
        assert!(again.iter().all(|r| r.resend && !r.hash_only));
        assert!(matches!(answer(&mut s, &again)[..], [Action::FileEnd { id: 0, .. }]));
        assert!(!s.resend(1, 0, true), "a file never wanted has nothing in flight");
        assert!(!s.resend(0, 9, true), "a chunk outside the file");
    }

    #[test]
    fn wanted_again_after_everything_was_sent_the_file_starts_over() {
        let mut s = machine(&[2 * C]);
        s.want(0, &[(0, 2)]).unwrap();
        let rs = reads(&drain(&mut s));
        assert_eq!(s.want(0, &[(0, 1)]), Err(Refused::NotWaiting), "not while its chunks are being sent");
        assert!(matches!(answer(&mut s, &rs)[..], [Action::FileEnd { .. }]));
        s.want(0, &[(0, 2)]).unwrap();
        let rs = reads(&drain(&mut s));
        assert_eq!(rs.len(), 2);
        assert!(matches!(answer(&mut s, &rs)[..], [Action::FileEnd { .. }]), "a second FileEnd for the second round");
    }

    #[test]
    fn wanted_again_after_its_file_end_while_a_chunk_asked_again_is_queued_the_file_starts_over() {
        // Found by the simulation: a chunk asked for again was read after the source changed,
        // so the receiver's whole-file check failed and it wanted the file again while a
        // stream reset's resend was still queued here. Refusing it ended the session.
        let mut s = machine(&[2 * C]);
        s.want(0, &[(0, 2)]).unwrap();
        let rs = reads(&drain(&mut s));
        assert!(matches!(answer(&mut s, &rs)[..], [Action::FileEnd { .. }]));
        assert!(s.resend(0, 1, true));
        let late = reads(&drain(&mut s));
        s.want(0, &[(0, 2)]).unwrap();
        let again = reads(&drain(&mut s));
        assert_eq!(again.len(), 2);
        assert!(answer(&mut s, &again).is_empty(), "the late resend is still to be answered");
        assert_eq!(s.want(0, &[(0, 2)]), Err(Refused::NotWaiting), "not again before this round's FileEnd");
        assert!(matches!(answer(&mut s, &late)[..], [Action::FileEnd { .. }]), "then the second round ends");
    }

    #[test]
    fn hostile_input_is_refused_with_a_reason_never_a_panic() {
        let mut s = machine(&[2 * C]);
        let dir = 1;
        assert_eq!(s.want(7, &[(0, 1)]), Err(Refused::UnknownFile));
        assert_eq!(s.want(u64::MAX, &[(0, 1)]), Err(Refused::UnknownFile));
        assert_eq!(s.want(dir, &[(0, 1)]), Err(Refused::NotAFile));
        assert!(matches!(s.want(0, &[(1, 5)]), Err(Refused::BadRanges(_))));
        assert!(matches!(s.want(0, &[(u64::MAX, 2)]), Err(Refused::BadRanges(_))));
        assert!(matches!(s.want(0, &[(0, 0)]), Err(Refused::BadRanges(_))));
        assert_eq!(s.ask_again(0, 0), Err(Refused::NotInFlight), "never wanted");
        assert_eq!(s.ask_again(dir, 0), Err(Refused::NotInFlight));
        assert_eq!(s.ask_again(9, 0), Err(Refused::UnknownFile));
        assert_eq!(s.file_done(9), Err(Refused::UnknownFile), "done for a file never announced");
        assert_eq!(s.skip(9), Err(Refused::UnknownFile));
        assert_eq!(s.peer_failed(9, Side::Destination, "x".into()), Err(Refused::UnknownFile));
        s.want(0, &[(0, 1), (0, 2), (1, 1)]).unwrap();
        let rs = reads(&drain(&mut s));
        assert_eq!(rs.iter().filter(|r| !r.hash_only).count(), 2, "overlapping ranges send each chunk once");
        assert_eq!(s.ask_again(0, 2), Err(Refused::ChunkOutOfRange));
        assert_eq!(s.ask_again(0, u64::MAX), Err(Refused::ChunkOutOfRange));
        s.check_invariants();
        assert_eq!(s.unfinished(), 1, "a refusal changes nothing");
    }

    #[test]
    fn news_about_a_file_finished_here_is_stale_and_changes_nothing() {
        let mut s = machine(&[2 * C]);
        s.want(0, &[(0, 2)]).unwrap();
        drain(&mut s);
        s.read_failed(0, ReadTrouble::NotFound, "gone".into());
        drain(&mut s);
        // The receiver had not heard of the failure yet.
        assert_eq!(s.ask_again(0, 1), Ok(()));
        assert_eq!(s.want(0, &[(0, 2)]), Ok(()));
        assert_eq!(s.file_done(0), Ok(()));
        assert_eq!(s.skip(0), Ok(()));
        assert!(drain(&mut s).is_empty());
        s.peer_failed(0, Side::Destination, "its own trouble".into()).unwrap();
        assert_eq!(drain(&mut s), vec![Action::PeerError { id: 0, side: Side::Destination, message: "its own trouble".into() }]);
        assert_eq!(s.counts(), (1, 1));
    }

    #[test]
    fn the_receivers_error_about_a_file_fails_it_and_about_a_directory_names_it() {
        let mut s = machine(&[100]);
        s.peer_failed(0, Side::Destination, "read-only".into()).unwrap();
        assert!(matches!(&drain(&mut s)[..], [Action::Done { id: 0, outcome: Outcome::Failed { tell_peer: false, side: Side::Destination, .. }, .. }]));
        s.peer_failed(1, Side::Destination, "cannot create directory".into()).unwrap();
        assert!(matches!(&drain(&mut s)[..], [Action::PeerError { id: 1, .. }]));
        assert_eq!(s.payload(1), Some(&"dir"));
        s.file_done(1).unwrap();
        s.skip(1).unwrap();
        assert!(drain(&mut s).is_empty(), "done or skip for a directory is nothing");
    }

    #[test]
    fn the_walk_is_held_to_the_files_in_flight() {
        let mut s: Sender<()> = Sender::new(CHUNK, 2);
        s.announce_file(0, 1, ());
        s.announce_other(1, ());
        s.announce_file(2, 1, ());
        assert!(!s.may_announce());
        s.file_done(0).unwrap();
        assert!(s.may_announce());
        s.announce_file(3, 1, ());
        s.check_invariants();
    }

    #[test]
    fn a_goodbye_with_files_unfinished_stops_the_session() {
        let mut s = machine(&[100]);
        s.summary();
        s.peer_ended();
        assert_eq!(drain(&mut s), vec![Action::Stop(StopReason::PeerEnded)]);
        s.file_done(0).unwrap();
        assert!(matches!(&drain(&mut s)[..], [Action::Done { .. }]), "no Finish after a Stop");
    }
}
