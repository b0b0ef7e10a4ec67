//! A deterministic simulation of whole transfers through both session machines.
//!
//! One seed decides everything: the tree (files of a few tiny chunks), a link whose data
//! streams delay, reorder, duplicate and corrupt chunks, a source that changes under the
//! transfer and whose reads sometimes fail, a store that loses what no barrier made durable
//! when the power goes, and sessions cut or killed at random moments and run again, as a user
//! re-runs the same command; in one seed of four the first runs each move one stripe of every
//! file (chunk ranges verified into a shared part and never published, as a spread transfer's
//! stripe units do) before runs of the whole tree publish. Both sides are the machines the engine runs: the sending machine
//! (`sender.rs`, its walk held to a random number of files ahead, its reads answered later by
//! modelled stream workers that read the source as it is then) and the receiving machine
//! (`receiver.rs`), joined by an ordered control channel. After every step the invariants of
//! ARCHITECTURE.md are checked:
//!
//! 1. nothing is published before every chunk is verified and the whole-file hash matched the
//!    source's: what lands under a final name is exactly a version of the source file; a
//!    stripe is verified only when its chunks in the store are the announced version's, and
//!    publishes nothing;
//! 2. the window is never exceeded (files in flight, and bytes beyond one file's worth);
//! 3. after a crash and resume, no chunk the store proves it holds is asked for again, nor
//!    sent again by the sender;
//! 4. a file is reported landed only when it is under its final name, durable; the sender
//!    reports a file landed only after the receiver's `FileDone`, skipped only after its `Skip`,
//!    and finishes the session only after the receiver finished;
//! 5. a `FileEnd` carries the hash of the walked version (the sender checks the source did
//!    not change first);
//! 6. neither machine refuses what the other may legitimately send (a refusal ends a real
//!    session with a protocol error), and both keep their own bookkeeping
//!    (`check_invariants`);
//! 7. in the end (faults stop after some sessions) every file landed, at its latest version.
//!
//! Beside the random runs, `scenarios` plays the cases of `crates/tern/tests/faults.rs` with
//! their faults named (a run killed after k chunks, for every k; chunks corrupted in flight; a
//! leftover partial of another version; descriptors running out) and asserts exactly which
//! chunks went out again and how often a file started over.
//!
//! `cargo test -p tern-proto sim` runs 10,000 seeds; `TERN_SIM_SEEDS=N` is not read here
//! (tern-proto reads no environment): change `SEEDS` locally to explore more.

use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

use super::Trouble;
use super::receiver::{Action, FileSpec, Outcome, Receiver, Window};
use super::sender::{Action as SendAction, Outcome as SendOutcome, Read, ReadTrouble, Sender};
use crate::chunk::{chunk_count, chunk_range, file_hash, stripe_hash};
use crate::journal::{JournalHeader, Replay, decode_record, encode_record, encode_seal};
use crate::msg::WantFile;

const SEEDS: u64 = 10_000;
const CHUNK: u32 = 8;
/// Sessions after which the link and the store stop failing, so every seed must converge.
const FAULTY_SESSIONS: u32 = 6;
const MAX_SESSIONS: u32 = 12;
const MAX_STEPS_PER_SESSION: usize = 20_000;

/// splitmix64: small, fast, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// True with probability `per_mille` / 1000.
    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// The source tree: each file's bytes at each version.
struct Source {
    sizes: Vec<u64>,
    versions: Vec<u32>,
}

impl Source {
    fn content(&self, id: usize, version: u32) -> Vec<u8> {
        (0..self.sizes[id]).map(|i| (i as u8).wrapping_mul(31) ^ (id as u8).wrapping_mul(7) ^ (version as u8).wrapping_mul(101)).collect()
    }
    fn chunk(&self, id: usize, version: u32, index: u64) -> Vec<u8> {
        let (off, len) = chunk_range(self.sizes[id], CHUNK, index);
        self.content(id, version)[off as usize..off as usize + len as usize].to_vec()
    }
    fn mtime(&self, id: usize) -> (i64, u32) {
        (1_700_000_000 + i64::from(self.versions[id]), 0)
    }
    fn file_hash(&self, id: usize, version: u32) -> [u8; 32] {
        let n = chunk_count(self.sizes[id], CHUNK);
        let hashes: Vec<[u8; 32]> = (0..n).map(|i| hash(&self.chunk(id, version, i))).collect();
        file_hash(self.sizes[id], &hashes)
    }
    /// What a `FileEnd` carries: the file's hash, or of a stripe (`first..end`) the stripe's.
    fn end_hash(&self, id: usize, version: u32, stripe: Option<(u64, u64)>) -> [u8; 32] {
        match stripe {
            None => self.file_hash(id, version),
            Some((first, end)) => {
                let hashes: Vec<[u8; 32]> = (first..end).map(|i| hash(&self.chunk(id, version, i))).collect();
                stripe_hash(self.sizes[id], first, &hashes)
            }
        }
    }
    /// Of a run that moves stripe `k` of `n` of every file (a spread transfer's stripe units,
    /// run one after another), this file's chunk range; `None`: the file moves whole (one chunk).
    fn stripe(&self, id: usize, (k, n): (u64, u64)) -> Option<(u64, u64)> {
        let chunks = chunk_count(self.sizes[id], CHUNK);
        let n = n.min(chunks);
        (n >= 2).then(|| ((k % n) * chunks / n, (k % n + 1) * chunks / n))
    }
}

/// A seal as the journal holds it (`journal::encode_seal`), in the store's record shape.
fn seal_record(first: u64, end: u64, stripe_hash: &[u8; 32]) -> (u64, [u8; 32]) {
    decode_record(&encode_seal(first, end, stripe_hash)).expect("a seal decodes")
}

fn hash(data: &[u8]) -> [u8; 32] {
    *blake3::hash(data).as_bytes()
}

/// One stored item: whether a barrier made it durable.
#[derive(Clone)]
struct Kept<T> {
    value: T,
    durable: bool,
}

/// A partial file: chunk data and journal records, each durable or not.
#[derive(Clone, Default)]
struct Part {
    /// The source version the journal's header names (size and mtime, in the real journal).
    version: u32,
    data: BTreeMap<u64, Kept<Vec<u8>>>,
    /// Chunks this attempt wrote or resumed: a second copy is never written over them (the
    /// engine's `Sink::claim`), so what was verified is what gets published.
    claimed: HashSet<u64>,
    journal: Vec<Kept<(u64, [u8; 32])>>,
}

/// The destination: partial files in tern's namespace and published files under final names.
#[derive(Default)]
struct Store {
    parts: HashMap<usize, Part>,
    finals: HashMap<usize, Kept<Vec<u8>>>,
}

impl Store {
    /// Power loss: what no barrier made durable survives or not, item by item (a journal record
    /// may outlive its data: the resume must re-hash, never trust the journal alone).
    fn power_loss(&mut self, rng: &mut Rng) {
        for part in self.parts.values_mut() {
            part.data.retain(|_, k| k.durable || rng.chance(500));
            part.journal.retain(|k| k.durable || rng.chance(500));
        }
        self.finals.retain(|_, k| k.durable);
    }
    fn barrier(&mut self) {
        for part in self.parts.values_mut() {
            part.data.values_mut().for_each(|k| k.durable = true);
            part.journal.iter_mut().for_each(|k| k.durable = true);
        }
        self.finals.values_mut().for_each(|k| k.durable = true);
    }
}

#[derive(Debug)]
enum Event {
    /// The sender's `Entries`: a walked file, at the version it had when walked.
    Entry {
        id: usize,
        version: u32,
        stripe: Option<(u64, u64)>,
    },
    /// The sender's `ManifestEnd`.
    ManifestEnd,
    /// A stream worker takes a queued read: it reads the source as it is now.
    ReadDone(Read),
    /// A chunk on a data stream reaches the receiver (`corrupt`: the chunk check fails).
    /// `whole`: a one-chunk file's only chunk, read while the file still had its announced
    /// size and mtime (the sender checks), so its hash is the file's.
    Chunk {
        id: usize,
        index: u64,
        data: Vec<u8>,
        corrupt: bool,
        whole: bool,
    },
    /// The sender's `FileEnd`, on the control channel.
    FileEnd {
        id: usize,
        hash: [u8; 32],
        size: u64,
        mtime: (i64, u32),
    },
    /// The sender's `FileError`: it could not read the file.
    SenderFailed {
        id: usize,
    },
    /// The receiver's `Want` reaches the sender.
    Want(Vec<WantFile>),
    /// The receiver's `Skip`: the file is there already, identical.
    Skip {
        id: usize,
    },
    /// A stream reset at the sender: the frames in flight on it are read again and resent,
    /// so the receiver may get a chunk twice, the second copy read later from the source.
    Reread {
        id: usize,
        index: u64,
    },
    /// The receiver's `ChunkBad` reaches the sender.
    ChunkBad {
        id: usize,
        index: u64,
    },
    /// The receiver's `FileDone` / `FileError` reach the sender.
    FileDone {
        id: usize,
    },
    ReceiverFailed {
        id: usize,
    },
    /// The receiver's `Summary`: every file is settled on its side.
    Summary,
    /// The finalizer's batch: barrier, then publish each.
    Finalize(Vec<(usize, [u8; 32])>),
}

/// Faults named instead of rolled: the scenarios of `crates/tern/tests/faults.rs`, each played
/// through the machines deterministically (the random runs cover their combinations).
#[derive(Default, Clone)]
struct Script {
    /// The run is killed once this many chunks were stored (kill -9 or a cut network: the store
    /// keeps what it wrote, everything in flight is lost).
    cut_after_stored: Option<usize>,
    /// Chunks corrupted on the link, once each: (file, chunk).
    corrupt_once: HashSet<(usize, u64)>,
    /// The next this many prepares find no free descriptor (EMFILE).
    descriptors_out: usize,
}

/// What a scripted transfer did, over all its runs.
#[derive(Default, Debug)]
struct Report {
    /// Times each (file, chunk) went out on a data stream.
    sent: HashMap<(usize, u64), u32>,
    /// Chunks stored, per run.
    stored: Vec<HashSet<(usize, u64)>>,
    /// Parts discarded to start a file over (a whole-file mismatch).
    start_overs: usize,
    /// Files either side reported failed.
    failed: Vec<usize>,
    runs: usize,
    /// Files published from sealed stripes alone (nothing asked of the sender).
    sealed_publishes: usize,
}

/// A session of one run: both machines, their in-flight events and what each side was told.
struct Session<'a> {
    script: Script,
    report: &'a mut Report,
    rng: &'a mut Rng,
    src: &'a mut Source,
    store: &'a mut Store,
    machine: Receiver<usize>,
    sender: Sender<usize>,
    window: Window,
    now: u64,
    seq: u64,
    /// Due times in order; the events themselves by sequence number.
    queue: BinaryHeap<std::cmp::Reverse<(u64, u64)>>,
    events: HashMap<u64, Event>,
    /// Control messages keep their order: each is sent no earlier than the one before.
    control_at: u64,
    /// Files walked so far (the walk is held to the sender's files ahead).
    walked: usize,
    /// The version each file had when this session's walk met it.
    walked_version: HashMap<usize, u32>,
    /// The version each file the receiver took had when announced (the receiver's view).
    announced: HashMap<usize, u32>,
    /// Chunks the store proved at Prepare, per file: never wanted, never sent, in the same attempt.
    proven: HashMap<usize, HashSet<u64>>,
    faulty: bool,
    largest: u64,
    /// Of every file, only this stripe moves in this run (`(k, n)`: the k-th of n), verified into
    /// the shared part and never published; the file lands in a later run of the whole tree.
    stripe_run: Option<(u64, u64)>,
    /// The stripe each file was walked with.
    stripes: HashMap<usize, (u64, u64)>,
    /// Files the receiver reported landed, and skipped, this session.
    landed: HashSet<usize>,
    skipped: HashSet<usize>,
    finalizing: Vec<(usize, [u8; 32])>,
    summary_sent: bool,
    /// The sender finished the session (its `Bye`).
    finished: bool,
}

impl Session<'_> {
    fn at(&mut self, delay: u64, ev: Event) {
        self.seq += 1;
        self.queue.push(std::cmp::Reverse((self.now + delay, self.seq)));
        self.events.insert(self.seq, ev);
    }
    fn control(&mut self, ev: Event) {
        let delay = 5 + self.rng.below(5);
        self.control_at = self.control_at.max(self.now + delay);
        let at = self.control_at - self.now;
        self.at(at, ev);
    }

    /// The walk: announces files while the sender lets it run ahead, then the manifest's end.
    fn walk(&mut self) {
        let files = self.src.sizes.len();
        while self.walked < files && self.sender.may_announce() {
            let id = self.walked;
            self.walked += 1;
            let version = self.src.versions[id];
            self.walked_version.insert(id, version);
            let stripe = self.stripe_run.and_then(|run| self.src.stripe(id, run));
            if let Some(st) = stripe {
                self.stripes.insert(id, st);
            }
            self.sender.announce_stripe(id as u64, self.src.sizes[id], stripe, id);
            self.control(Event::Entry { id, version, stripe });
            if self.walked == files {
                self.sender.walk_done();
                self.control(Event::ManifestEnd);
            }
        }
    }

    /// Runs both machines' actions until neither has any, checking the invariants after each.
    fn drive(&mut self) -> Result<(), &'static str> {
        loop {
            let mut idle = true;
            while let Some(action) = self.machine.poll_action() {
                idle = false;
                self.receiver_action(action)?;
                self.check();
            }
            if self.machine.is_finished() && !self.summary_sent {
                self.summary_sent = true;
                self.control(Event::Summary);
            }
            while let Some(action) = self.sender.poll_action() {
                idle = false;
                self.sender_action(action)?;
                self.check();
            }
            self.walk();
            if idle {
                break;
            }
        }
        if !self.finalizing.is_empty() {
            // Nothing more arrives before this batch: the finalizer does not wait (more_coming).
            let batch = std::mem::take(&mut self.finalizing);
            self.at(1, Event::Finalize(batch));
        }
        Ok(())
    }

    fn check(&self) {
        self.machine.check_invariants();
        self.sender.check_invariants();
        let (bytes, files) = self.machine.in_flight();
        assert!(files <= self.window.files, "invariant 2: {files} files in flight, window {}", self.window.files);
        assert!(bytes < self.window.bytes + self.largest.max(1), "invariant 2: {bytes} bytes outstanding, window {}", self.window.bytes);
        assert!(self.machine.holding() <= self.window.held, "invariant 2: {} files hold descriptors, window {}", self.machine.holding(), self.window.held);
    }

    fn receiver_action(&mut self, action: Action<usize>) -> Result<(), &'static str> {
        match action {
            Action::Prepare { id, start_over } => self.prepare(id as usize, start_over),
            Action::Want(files) => {
                for w in &files {
                    let proven = self.proven.get(&(w.id as usize)).cloned().unwrap_or_default();
                    for &(start, count) in &w.ranges {
                        for i in start..start + u64::from(count) {
                            assert!(!proven.contains(&i), "invariant 3: chunk {i} of file {} wanted although the store proved it holds it", w.id);
                        }
                    }
                }
                self.control(Event::Want(files));
            }
            Action::AskAgain { id, chunk } => self.control(Event::ChunkBad { id: id as usize, index: chunk }),
            Action::Finalize { id, file_hash: h, more_coming: _ } => {
                let id = id as usize;
                let version = self.announced[&id];
                assert_eq!(h, self.src.file_hash(id, version), "invariant 1: file {id} finalized with a hash that is not its announced version's");
                let part = self.store.parts.get(&id).expect("a finalized file has its part");
                let n = chunk_count(self.src.sizes[id], CHUNK);
                for i in 0..n {
                    let have = part.data.get(&i).map(|k| &k.value);
                    assert_eq!(have, Some(&self.src.chunk(id, version, i)), "invariant 1: file {id} finalized but chunk {i} in store is not the source's");
                }
                self.finalizing.push((id, h));
                if self.finalizing.len() >= 3 || self.rng.chance(500) {
                    let batch = std::mem::take(&mut self.finalizing);
                    let delay = 1 + self.rng.below(20);
                    self.at(delay, Event::Finalize(batch));
                }
            }
            Action::Abandon { id } => {
                self.store.parts.remove(&(id as usize));
            }
            Action::StripeVerified { id, first, end, stripe_hash } => {
                let id = id as usize;
                let version = self.announced[&id];
                assert_eq!((first, end), self.stripes[&id], "the stripe verified is the one announced");
                let part = self.store.parts.get(&id).expect("a verified stripe has its part");
                for i in first..end {
                    let have = part.data.get(&i).map(|k| &k.value);
                    assert_eq!(have, Some(&self.src.chunk(id, version, i)), "invariant 1: stripe of file {id} verified but chunk {i} in store is not the source's");
                }
                assert!(!self.store.finals.contains_key(&id) || self.store.finals[&id].value != self.src.content(id, version), "a stripe published its file");
                // The driver makes the part's data durable (fdatasync), seals the stripe in the
                // journal and closes the part: it stays for the file's other stripes.
                let part = self.store.parts.get_mut(&id).expect("checked above");
                part.data.values_mut().for_each(|k| k.durable = true);
                part.journal.push(Kept { value: seal_record(first, end, &stripe_hash), durable: false });
                self.machine.finalized(id as u64);
            }
            Action::Done { id, payload, outcome } => {
                assert_eq!(id as usize, payload);
                match outcome {
                    Outcome::Landed if self.stripes.contains_key(&payload) => {
                        // A stripe: verified into the shared part, published by a later run.
                        self.landed.insert(payload);
                        self.control(Event::FileDone { id: payload });
                    }
                    Outcome::Landed => {
                        let want = self.src.content(payload, self.announced[&payload]);
                        let have = self.store.finals.get(&payload).expect("invariant 4: landed but nothing under the final name");
                        assert!(have.durable, "invariant 4: landed before durable");
                        assert_eq!(have.value, want, "invariant 1/4: file {payload} landed with other bytes than its announced version");
                        self.landed.insert(payload);
                        self.control(Event::FileDone { id: payload });
                    }
                    Outcome::Failed { tell_peer, .. } => {
                        self.report.failed.push(payload);
                        if tell_peer {
                            self.control(Event::ReceiverFailed { id: payload });
                        }
                    }
                }
            }
            Action::Wait(pause) => self.now += pause.as_millis() as u64,
            Action::Throttled { .. } => {}
            Action::Stop { .. } => return Err("stopped"),
        }
        Ok(())
    }

    fn sender_action(&mut self, action: SendAction<usize>) -> Result<(), &'static str> {
        match action {
            SendAction::Read(r) => {
                let id = r.id as usize;
                if !r.hash_only {
                    let proven = self.proven.get(&id);
                    assert!(!proven.is_some_and(|p| p.contains(&r.chunk)), "sender: chunk {} of file {id} sent although the receiver's store proved it holds it", r.chunk);
                }
                // A stream worker takes it later.
                let delay = 1 + self.rng.below(10);
                self.at(delay, Event::ReadDone(r));
            }
            SendAction::FileEnd { id, file_hash: h } => {
                let id = id as usize;
                let version = self.walked_version[&id];
                if self.src.versions[id] != version {
                    self.sender.read_failed(id as u64, ReadTrouble::Changed, "changed".into());
                } else {
                    assert_eq!(h, self.src.end_hash(id, version, self.stripes.get(&id).copied()), "sender: FileEnd's hash is not the walked version's");
                    let (size, mtime) = (self.src.sizes[id], self.src.mtime(id));
                    self.control(Event::FileEnd { id, hash: h, size, mtime });
                }
            }
            SendAction::Done { id, payload, outcome } => {
                assert_eq!(id as usize, payload);
                match outcome {
                    SendOutcome::Landed => assert!(self.landed.contains(&payload), "sender: file {payload} reported landed before the receiver's FileDone"),
                    SendOutcome::Skipped => assert!(self.skipped.contains(&payload), "sender: file {payload} reported skipped but the receiver did not skip it"),
                    SendOutcome::Failed { tell_peer, .. } => {
                        self.report.failed.push(payload);
                        if tell_peer {
                            self.control(Event::SenderFailed { id: payload });
                        }
                    }
                }
            }
            SendAction::PeerError { .. } => {}
            SendAction::Finish => {
                assert!(self.machine.is_finished(), "sender finished before the receiver");
                self.finished = true;
            }
            SendAction::Stop(_) => return Err("stopped"),
        }
        Ok(())
    }

    /// The store's setup of a part: resume from the journal, re-hashing what it claims.
    fn prepare(&mut self, id: usize, start_over: bool) {
        let version = self.announced[&id];
        let scripted = self.script.descriptors_out > 0;
        if scripted || (self.faulty && self.rng.chance(20)) {
            self.script.descriptors_out = self.script.descriptors_out.saturating_sub(1);
            return self.machine.prepare_failed(id as u64, Trouble::ResourceLimit, "Too many open files".into());
        }
        self.report.start_overs += usize::from(start_over);
        let stripe = self.stripes.get(&id).copied();
        let part = self.store.parts.entry(id).or_default();
        // A stripe's part is shared with the file's other stripes: started over, it is only not
        // resumed; a part of another version is a leftover either way.
        if (start_over && stripe.is_none()) || part.version != version {
            *part = Part { version, ..Part::default() };
        }
        let mut proven = HashSet::new();
        let mut resumed = Vec::new();
        // A one-chunk file is never resumed (the engine keeps no journal for it): its hash
        // comes only with its frame, the sender sends no FileEnd for it.
        let journal: &[Kept<(u64, [u8; 32])>] = if chunk_count(self.src.sizes[id], CHUNK) > 1 && !(start_over && stripe.is_some()) { &part.journal } else { &[] };
        let (first, end) = stripe.unwrap_or((0, u64::MAX));
        // Replayed as the engine does, by the journal's own parser: sealed chunks are trusted
        // (verified against the source and durable), the others re-hashed from the part.
        let header = JournalHeader { size: self.src.sizes[id], mtime_s: 0, mtime_ns: 0, chunk_size: CHUNK };
        let mut replay = Replay::new(&header);
        for rec in journal {
            replay.push(&encode_record(rec.value.0, &rec.value.1));
        }
        let mut sealed = 0;
        for (index, h, is_sealed) in replay.finish_sealed() {
            if (first..end).contains(&index) && (is_sealed || part.data.get(&index).is_some_and(|d| hash(&d.value) == h)) && proven.insert(index) {
                resumed.push((index, h));
                sealed += u64::from(is_sealed);
            }
        }
        let whole_sealed = stripe.is_none() && sealed == chunk_count(self.src.sizes[id], CHUNK) && sealed > 1;
        // The engine's claim bits: other stripes' chunks are never written by this one.
        let others = (0..chunk_count(self.src.sizes[id], CHUNK)).filter(|i| stripe.is_some() && !(first..end).contains(i));
        part.claimed = proven.iter().copied().chain(others).collect();
        self.proven.insert(id, proven);
        if whole_sealed {
            self.report.sealed_publishes += 1;
            return self.machine.prepared_sealed(id as u64, resumed);
        }
        self.machine.prepared(id as u64, resumed);
    }

    /// One event; `Err` when the session ends early (stopped).
    fn step(&mut self, ev: Event) -> Result<(), &'static str> {
        match ev {
            Event::Entry { id, version, stripe } => {
                // The receiver skips a file already there at this version (size and mtime
                // match), as a re-run does.
                let there = self.store.finals.get(&id).is_some_and(|k| k.value == self.src.content(id, version));
                if there {
                    self.skipped.insert(id);
                    self.control(Event::Skip { id });
                } else {
                    self.announced.insert(id, version);
                    let mtime = (1_700_000_000 + i64::from(version), 0);
                    self.machine.announce(FileSpec { id: id as u64, size: self.src.sizes[id], mtime, stripe }, id);
                }
            }
            Event::ManifestEnd => self.machine.manifest_end(),
            Event::ReadDone(r) => self.read(r),
            Event::Chunk { id, index, data, corrupt, whole } => {
                if corrupt {
                    self.machine.chunk_corrupt(id as u64, index);
                } else if self.machine.payload(id as u64).is_some() && self.store.parts.contains_key(&id) {
                    if self.faulty && self.rng.chance(2) {
                        self.machine.write_failed(id as u64, Trouble::NoSpace, "No space left on device".into());
                        return self.drive();
                    }
                    let h = hash(&data);
                    let part = self.store.parts.get_mut(&id).expect("checked above");
                    if !part.claimed.insert(index) {
                        return self.drive(); // a duplicate: dropped unwritten
                    }
                    part.data.insert(index, Kept { value: data, durable: false });
                    part.journal.push(Kept { value: (index, h), durable: false });
                    self.machine.chunk_stored(id as u64, index, h, whole).expect("the chunk is in range");
                    let run = self.report.runs - 1;
                    self.report.stored[run].insert((id, index));
                    if self.script.cut_after_stored.is_some_and(|n| self.report.stored[run].len() >= n) {
                        return Err("cut");
                    }
                }
            }
            Event::FileEnd { id, hash, size, mtime } => {
                let _ = self.machine.file_end(id as u64, hash, size, mtime);
            }
            Event::SenderFailed { id } => self.machine.peer_failed(id as u64, crate::Side::Source, "cannot read".into()),
            Event::Want(files) => {
                for w in files {
                    self.sender.want(w.id, &w.ranges).unwrap_or_else(|e| panic!("the sender refused a Want of file {} the receiver may send: {e:?}", w.id));
                }
            }
            Event::Skip { id } => self.sender.skip(id as u64).expect("the sender refused a Skip the receiver may send"),
            Event::Reread { id, index } => {
                // The frame's `Sent` was reported: the copy counts in once more.
                self.sender.resend(id as u64, index, true);
            }
            Event::ChunkBad { id, index } => self.sender.ask_again(id as u64, index).expect("the sender refused a ChunkBad the receiver may send"),
            Event::FileDone { id } => self.sender.file_done(id as u64).expect("the sender refused a FileDone the receiver may send"),
            Event::ReceiverFailed { id } => self.sender.peer_failed(id as u64, crate::Side::Destination, "cannot write".into()).expect("the sender refused a FileError the receiver may send"),
            Event::Summary => self.sender.summary(),
            Event::Finalize(batch) => {
                if self.faulty && self.rng.chance(30) {
                    // Storage corrupted the data at rest (caught by --verify full's re-read).
                    let (id, _) = batch[0];
                    self.machine.finalize_failed(id as u64, Trouble::WholeFileMismatch, "whole-file hash of the written data does not match on re-read".into());
                    for &(id, _) in &batch[1..] {
                        self.publish(id);
                    }
                } else {
                    for &(id, _) in &batch {
                        self.publish(id);
                    }
                }
            }
        }
        self.drive()
    }

    /// A stream worker's read of the source as it is now: sent (or only hashed), or failed.
    fn read(&mut self, r: Read) {
        let id = r.id as usize;
        if !self.sender.is_active(r.id) {
            return; // its file finished meanwhile: the worker drops it
        }
        if self.faulty && self.rng.chance(3) {
            return self.sender.read_failed(r.id, ReadTrouble::NotFound, "vanished".into());
        }
        let version = self.src.versions[id];
        if r.whole && version != self.walked_version[&id] {
            // A single-chunk file completes with its frame: the worker checks it first.
            return self.sender.read_failed(r.id, ReadTrouble::Changed, "changed".into());
        }
        let data = self.src.chunk(id, version, r.chunk);
        let h = hash(&data);
        if !r.hash_only {
            *self.report.sent.entry((id, r.chunk)).or_default() += 1;
            let corrupt = self.script.corrupt_once.remove(&(id, r.chunk)) || (self.faulty && self.rng.chance(30));
            let whole = r.whole;
            let delay = 1 + self.rng.below(40);
            self.at(delay, Event::Chunk { id, index: r.chunk, data, corrupt, whole });
            if self.faulty && self.rng.chance(20) {
                let delay = 1 + self.rng.below(40);
                self.at(delay, Event::Reread { id, index: r.chunk });
            }
        }
        self.sender.chunk_sent(r.id, r.chunk, h);
    }

    fn publish(&mut self, id: usize) {
        self.store.barrier();
        let part = self.store.parts.remove(&id).expect("a finalized file has its part");
        let n = chunk_count(self.src.sizes[id], CHUNK);
        let bytes: Vec<u8> = (0..n).flat_map(|i| part.data.get(&i).unwrap_or_else(|| panic!("invariant 1: file {id} published without its chunk {i} in store")).value.clone()).collect();
        self.store.finals.insert(id, Kept { value: bytes, durable: true });
        self.machine.finalized(id as u64);
    }
}

/// One seed: a tree copied by runs of the same command until it is all there.
fn run_seed(seed: u64) -> Report {
    let mut rng = Rng(seed);
    let files = 1 + rng.below(12) as usize;
    let mut src = Source { sizes: (0..files).map(|_| rng.below(6 * u64::from(CHUNK))).collect(), versions: vec![0; files] };
    let mut store = Store::default();
    // One seed in four moves its files as stripes first: runs of stripe 0, 1, .. of 2-4, then
    // runs of the whole tree that publish (a spread transfer's units, then its closing pass).
    let stripes = if rng.chance(250) { 2 + rng.below(3) } else { 0 };
    let runs = Runs { seed, faulty_sessions: FAULTY_SESSIONS, scripts: Vec::new(), window: None, stripes };
    runs.until_all_there(&mut rng, &mut src, &mut store)
}

/// Runs of the same command, each a session, until every file is there at its latest version.
struct Runs {
    seed: u64,
    /// Runs with random faults (the link, the store, the source, cuts) before the quiet ones.
    faulty_sessions: u32,
    /// Run i follows `scripts[i]` (none after them).
    scripts: Vec<Script>,
    /// The receiver's window and the sender's files ahead; None: rolled per run.
    window: Option<(Window, u64)>,
    /// The first this many runs each move one stripe of every file (0: none).
    stripes: u64,
}

impl Runs {
    /// A random window: files holding descriptors (more than one chunk) at most as many as files.
    fn roll_window(rng: &mut Rng) -> Window {
        let files = 1 + rng.below(4) as usize;
        Window { bytes: 1 + rng.below(4 * u64::from(CHUNK)), files, held: 1 + rng.below(files as u64) as usize }
    }

    fn until_all_there(&self, rng: &mut Rng, src: &mut Source, store: &mut Store) -> Report {
        let seed = self.seed;
        let files = src.sizes.len();
        let largest = src.sizes.iter().copied().max().unwrap_or(0);
        let mut report = Report::default();
        for session in 0..MAX_SESSIONS {
            let faulty = session < self.faulty_sessions;
            let (window, files_ahead) = self.window.unwrap_or_else(|| (Self::roll_window(rng), 1 + rng.below(files as u64 + 1)));
            report.runs += 1;
            report.stored.push(HashSet::new());
            let mut s = Session {
                script: self.scripts.get(session as usize).cloned().unwrap_or_default(),
                report: &mut report,
                machine: Receiver::new(window, CHUNK),
                sender: Sender::new(CHUNK, files_ahead),
                rng: &mut *rng,
                src: &mut *src,
                store: &mut *store,
                window,
                now: 0,
                seq: 0,
                queue: BinaryHeap::new(),
                events: HashMap::new(),
                control_at: 0,
                walked: 0,
                walked_version: HashMap::new(),
                announced: HashMap::new(),
                proven: HashMap::new(),
                faulty,
                largest,
                stripe_run: (u64::from(session) < self.stripes).then_some((u64::from(session), self.stripes)),
                stripes: HashMap::new(),
                landed: HashSet::new(),
                skipped: HashSet::new(),
                finalizing: Vec::new(),
                summary_sent: false,
                finished: false,
            };
            let mut cut = s.drive().is_err();
            let mut steps = 0;
            while !cut && !s.finished {
                steps += 1;
                assert!(steps < MAX_STEPS_PER_SESSION, "seed {seed}: session {session} makes no progress");
                let Some(std::cmp::Reverse((at, seq))) = s.queue.pop() else {
                    panic!("seed {seed}: session {session} waits for nothing with {} files unfinished at the receiver, {} at the sender", s.machine.unfinished(), s.sender.unfinished());
                };
                s.now = s.now.max(at);
                let ev = s.events.remove(&seq).expect("every queued time has its event");
                if faulty && s.rng.chance(20) {
                    // The user's edit: the file changes while it is being sent.
                    let id = s.rng.below(files as u64) as usize;
                    s.src.versions[id] += 1;
                }
                if faulty && s.rng.chance(4) {
                    cut = true; // kill -9 or a network cut: everything in flight is lost
                    break;
                }
                cut = s.step(ev).is_err();
            }
            let power_loss = cut && faulty && s.rng.chance(500);
            drop(s);
            if power_loss {
                store.power_loss(rng);
            }
            let all_there = (0..files).all(|id| store.finals.get(&id).is_some_and(|k| k.value == src.content(id, src.versions[id])));
            if all_there && !faulty && session as usize >= self.scripts.len().saturating_sub(1) {
                return report;
            }
        }
        panic!("seed {seed}: not every file landed at its latest version after {MAX_SESSIONS} runs");
    }
}

#[test]
fn ten_thousand_seeded_transfers_keep_every_invariant() {
    let mut sealed_publishes = 0;
    for seed in 0..SEEDS {
        sealed_publishes += run_seed(seed).sealed_publishes;
    }
    // Striped seeds publish most of their files from sealed stripes (a power loss or a source
    // edit between the runs sends the rest the ordinary way).
    assert!(sealed_publishes > SEEDS as usize / 8, "only {sealed_publishes} files published from sealed stripes");
}

/// The scenarios of `crates/tern/tests/faults.rs` (real processes, kill -9, real files) played
/// through the machines, each with its faults named: they pin down what the process tests can
/// only observe from outside (which chunks went out again, how often a file started over).
mod scenarios {
    use super::*;

    const QUIET: Option<(Window, u64)> = Some((Window { bytes: 6 * CHUNK as u64, files: 2, held: 2 }, 3));

    /// Three files of 5, 6 and 1 chunks.
    fn tree() -> Source {
        Source { sizes: vec![5 * u64::from(CHUNK), 6 * u64::from(CHUNK) - 3, 4], versions: vec![0; 3] }
    }

    fn runs(scripts: Vec<Script>) -> Runs {
        Runs { seed: 0, faulty_sessions: 0, scripts, window: QUIET, stripes: 0 }
    }

    fn all_chunks(src: &Source) -> Vec<(usize, u64)> {
        (0..src.sizes.len()).flat_map(|id| (0..chunk_count(src.sizes[id], CHUNK)).map(move |i| (id, i))).collect()
    }

    /// faults.rs: receiver_killed_then_rerun_sends_only_unverified_chunks,
    /// sender_killed_then_rerun_resumes, cut_socket_is_retried_within_the_run.
    #[test]
    fn a_run_killed_mid_transfer_resumes_and_sends_again_only_what_was_not_stored() {
        for cut_at in 1..all_chunks(&tree()).len() {
            let (mut rng, mut src, mut store) = (Rng(cut_at as u64), tree(), Store::default());
            let report = runs(vec![Script { cut_after_stored: Some(cut_at), ..Script::default() }]).until_all_there(&mut rng, &mut src, &mut store);
            assert_eq!(report.runs, 2, "cut after {cut_at}: one re-run finishes");
            assert!(report.failed.is_empty());
            let before = &report.stored[0];
            for c in &report.stored[1] {
                assert!(!before.contains(c), "cut after {cut_at}: chunk {c:?} stored before the kill was sent again");
            }
            for c in all_chunks(&src) {
                // Once, or twice if it was in flight (sent, not stored) when the run was killed.
                let n = report.sent[&c];
                assert!(n == 1 || (n == 2 && !before.contains(&c)), "cut after {cut_at}: chunk {c:?} sent {n} times");
            }
        }
    }

    /// faults.rs: corrupted_chunk_is_detected_and_only_it_is_resent.
    #[test]
    fn a_chunk_corrupted_in_flight_is_sent_again_alone() {
        let (mut rng, mut src, mut store) = (Rng(1), tree(), Store::default());
        let bad = HashSet::from([(0, 2), (2, 0)]);
        let report = runs(vec![Script { corrupt_once: bad.clone(), ..Script::default() }]).until_all_there(&mut rng, &mut src, &mut store);
        assert_eq!(report.runs, 1, "repaired within the run");
        for c in all_chunks(&src) {
            assert_eq!(report.sent[&c], if bad.contains(&c) { 2 } else { 1 }, "chunk {c:?}");
        }
        assert_eq!(report.start_overs, 0);
    }

    /// faults.rs: a_leftover_partial_of_an_older_version_restarts_the_file_once. The partial's
    /// journal is consistent with its data, but the data are of a version with the same size
    /// and mtime (an edit that kept both): resumed, the file's hash cannot match, and the file
    /// starts over once, then lands.
    #[test]
    fn a_leftover_partial_of_another_version_starts_the_file_over_once() {
        let (mut rng, mut src, mut store) = (Rng(2), tree(), Store::default());
        let mut part = Part::default();
        for i in 0..3u64 {
            let other = src.chunk(0, 7, i);
            part.journal.push(Kept { value: (i, hash(&other)), durable: true });
            part.data.insert(i, Kept { value: other, durable: true });
        }
        store.parts.insert(0, part);
        let report = runs(Vec::new()).until_all_there(&mut rng, &mut src, &mut store);
        assert_eq!(report.runs, 1);
        assert_eq!(report.start_overs, 1, "exactly one start over");
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        for i in 0..5 {
            assert_eq!(report.sent[&(0, i)], if i < 3 { 1 } else { 2 }, "chunk {i}: the resumed ones once (after the start over), the rest before and after");
        }
    }

    /// faults.rs: running_out_of_descriptors_mid_run_fails_no_file.
    #[test]
    fn running_out_of_descriptors_slows_the_run_and_fails_no_file() {
        let (mut rng, mut src, mut store) = (Rng(3), tree(), Store::default());
        let report = runs(vec![Script { descriptors_out: 5, ..Script::default() }]).until_all_there(&mut rng, &mut src, &mut store);
        assert_eq!(report.runs, 1);
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        assert!(all_chunks(&src).iter().all(|c| report.sent[c] == 1));
    }
}
