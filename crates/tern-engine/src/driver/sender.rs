//! The sending side of a session: walk, announce, serve wanted chunks over every data stream.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, unbounded};
use tern_proto::chunk::{ChunkSet, chunk_count};
use tern_proto::data::{ChunkHeader, FLAG_WHOLE_FILE};
use tern_proto::filter::Filter;
use tern_proto::frame::HEADER_LEN;
use tern_proto::msg::{Summary, WantFile};
use tern_proto::{Control, Entry, EntryKind, Options};

use crate::error::{ErrorKind, Side, TransferError, err_text};
use crate::faults::{chunk_hash, faults};
use crate::net::control::{CtrlReader, CtrlWriter};
use crate::net::datastream::DataConn;
use crate::net::ratelimit::RateLimit;
use crate::net::seal::TAG_LEN;
use crate::net::transport::Closer;
use crate::progress::Progress;
use crate::store::posix_source::{PosixSource, PosixSourceFile};
use crate::store::walk::{SourceSpec, SrcFile, walk, walk_list};
use crate::store::{Source, SourceFile};

/// A set of paths kept as 128-bit keyed digests: 16 bytes a path instead of the path, so what a
/// sender remembers of a tree of millions of files stays small. Two paths would have to collide
/// under a key chosen at random for this run (about 2^64 paths for an even chance).
#[derive(Clone)]
pub struct PathSet {
    key: [u8; 32],
    digests: HashSet<u128>,
}

impl Default for PathSet {
    fn default() -> Self {
        Self { key: crate::net::transport::random(), digests: HashSet::new() }
    }
}

impl PathSet {
    fn digest(&self, path: &[u8]) -> u128 {
        let h = blake3::keyed_hash(&self.key, path);
        u128::from_le_bytes(h.as_bytes()[..16].try_into().expect("16 bytes"))
    }
    /// True if the path was not in the set.
    pub fn insert(&mut self, path: &[u8]) -> bool {
        let d = self.digest(path);
        self.digests.insert(d)
    }
    pub fn contains(&self, path: &[u8]) -> bool {
        self.digests.contains(&self.digest(path))
    }
    pub fn len(&self) -> usize {
        self.digests.len()
    }
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }
}

/// What the sending side remembers across reconnects within one run.
#[derive(Default)]
pub struct SendMemory {
    /// Manifest paths the receiver confirmed (done or identical): not announced again.
    pub finished: PathSet,
    /// Chunks already sent once, per path: sending one again counts as a resend.
    pub sent: HashMap<Vec<u8>, ChunkSet>,
}

pub struct SenderParams {
    pub sources: Vec<SourceSpec>,
    pub options: Options,
    pub progress: Arc<Progress>,
    pub memory: Arc<Mutex<SendMemory>>,
    pub rate: Option<Arc<RateLimit>>,
    /// `--exclude`/`--include` rules, applied while walking.
    pub filter: Filter,
    /// `--files-from`: walk these paths under the one source instead of the whole tree.
    pub list: Option<Arc<Vec<Vec<u8>>>>,
    /// Of one listed file, only these bytes move (`Control::Stripe`, docs/cluster.md "Stripes").
    pub stripe: Option<Stripe>,
}

/// A listed file's byte range that one session moves (a unit of a spread transfer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stripe {
    /// As listed: relative to the source directory.
    pub path: Vec<u8>,
    pub start: u64,
    pub end: u64,
}

#[derive(Clone)]
struct Work {
    id: u64,
    chunk: u64,
    offset: u64,
    len: u32,
    whole: bool,
    hash_only: bool,
    /// Queued again after its data stream was reset: counts as a resend once sent.
    resend: bool,
    file: Arc<SrcInfo>,
}

struct SrcInfo {
    path: PathBuf,
    rel: Vec<u8>,
    size: u64,
    mtime_s: i64,
    mtime_ns: u32,
    /// Done or failed: the stream logs drop its frames.
    finished: AtomicBool,
    /// Where its data is read from (its path there is `path` beneath the source's root).
    source: Arc<PosixSource>,
}

impl SrcInfo {
    /// Its path beneath its source's root; empty, which the source refuses, if it is not
    /// beneath it (the walk built `path` on that root, so it is).
    fn source_rel(&self) -> &[u8] {
        self.source.rel_of(&self.path).unwrap_or_default()
    }

    fn open(&self) -> std::io::Result<PosixSourceFile> {
        Ok(self.source.open(self.source_rel())?)
    }

    /// Whether `st` is still the version that was listed (and announced).
    fn is_listed_version(&self, st: &crate::store::Stat) -> bool {
        st.is_version(self.size, (self.mtime_s, self.mtime_ns))
    }
}

enum Event {
    Files(Vec<SrcFile>),
    WalkDone(Result<(), TransferError>),
    WalkWarning(TransferError),
    /// Said to the user, not an error (a link --safe-links left out).
    WalkNotice(String),
    Ctrl(Control),
    CtrlFailed(TransferError),
    Sent {
        id: u64,
        chunk: u64,
        hash: [u8; 32],
        len: u32,
        hash_only: bool,
        resend: bool,
    },
    /// A worker whose stream was reset took this item: someone else sends it.
    Requeue(Work),
    ReadFailed {
        id: u64,
        error: TransferError,
    },
    StreamFailed(TransferError),
    NewStream(DataConn),
}

/// The chunk frames one data stream wrote, by sequence number, until their files finish: what
/// to send again if the receiver resets the stream (`docs/protocol.md`, "Repairing a corrupted
/// data stream"). Bounded by the receiver's window, since finished files' frames are dropped.
struct StreamLog {
    state: Mutex<LogState>,
    changed: Condvar,
    closer: Closer,
}

#[derive(Default)]
struct LogState {
    /// (sequence number, work, its `Sent` was reported to the main loop).
    frames: VecDeque<(u64, Work, bool)>,
    /// Frames written (the next sequence number).
    written: u64,
    /// `Some(received)` once the receiver reset the stream, having accepted `received` frames.
    reset: Option<u64>,
    /// Length after the last pruning: prune again at twice that.
    pruned_len: usize,
    /// The session is over: a worker waiting for a reset stops waiting.
    ended: bool,
    /// Frames below this sequence number were dropped from a full log (see `MAX_LOG`).
    forgotten: u64,
}

/// Most frames one stream's log keeps. A file's frames stay until it finishes, and one huge file
/// is wanted whole; past this many (64 GiB of 1 MiB chunks, far more than any path holds in
/// flight) the oldest go, and a reset reaching back to them ends the session instead (the
/// client reconnects and resumes from the journals).
const MAX_LOG: usize = 1 << 16;

type StreamLogs = Arc<Mutex<HashMap<u32, Arc<StreamLog>>>>;

/// How long a worker whose stream broke waits for the receiver's `StreamReset` (which travels on
/// the control channel and may arrive after the broken pipe) before it calls it a network error.
const RESET_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Opens a replacement data stream with the given index (the client side only).
pub type Reopen = Arc<dyn Fn(u32) -> Result<DataConn, TransferError> + Send + Sync>;

/// First index of replacement streams: above any index the ramp gives out, never reused.
pub const REPLACEMENT_INDEX: u32 = 1 << 16;

/// Handle to feed extra data streams (adaptive parallelism) into a running sender.
#[derive(Clone)]
pub struct StreamFeed(Sender<Event>);

impl StreamFeed {
    pub fn add(&self, conn: DataConn) {
        let _ = self.0.send(Event::NewStream(conn));
    }
    /// Data streams could not be set up: the session fails with this error.
    pub fn fail(&self, e: TransferError) {
        let _ = self.0.send(Event::StreamFailed(e));
    }
}

pub struct Sending {
    events: Sender<Event>,
    rx: Receiver<Event>,
    resets: bool,
    reopen: Option<Reopen>,
}

impl Default for Sending {
    fn default() -> Self {
        Self::new()
    }
}

impl Sending {
    pub fn new() -> Self {
        let (events, rx) = unbounded();
        Self { events, rx, resets: false, reopen: None }
    }
    pub fn feed(&self) -> StreamFeed {
        StreamFeed(self.events.clone())
    }
    /// The peer understands `StreamReset` (Hello feature bit 5, not third-party): a stream it
    /// resets is repaired instead of failing the session. `reopen`: the client opens a
    /// replacement stream for each (the server gets the client's replacements as new streams).
    pub fn with_resets(mut self, on: bool, reopen: Option<Reopen>) -> Self {
        self.resets = on;
        self.reopen = reopen.filter(|_| on);
        self
    }

    /// Runs the sending side to the end of the session. Returns the receiver's summary.
    pub fn run(self, reader: CtrlReader, writer: Arc<CtrlWriter>, streams: Vec<DataConn>, p: SenderParams) -> Result<Summary, TransferError> {
        let Sending { events, rx, resets, reopen } = self;
        let chunk_size = p.options.chunk_size;
        let (work_tx, work_rx) = unbounded::<Work>();
        let ahead = Arc::new(Ahead::default());
        let mut closers = Vec::new();
        let mut workers = Vec::new();
        let logs: StreamLogs = Arc::default();
        let spawn_worker = |conn: DataConn, closers: &mut Vec<_>, workers: &mut Vec<_>| {
            closers.push(conn.closer.clone());
            let log = Arc::new(StreamLog { state: Mutex::default(), changed: Condvar::new(), closer: conn.closer.clone() });
            logs.lock().unwrap().insert(conn.index, log.clone());
            let (rx, ev, rate) = (work_rx.clone(), events.clone(), p.rate.clone());
            workers.push(crate::threads::spawn_or_refuse(Side::Source, "tern-send", move || send_worker(conn, rx, ev, chunk_size, rate, log, resets))?);
            p.progress.streams.fetch_add(1, Relaxed);
            Ok::<_, TransferError>(())
        };
        let mut started = Ok(());
        for conn in streams {
            if started.is_ok() {
                started = spawn_worker(conn, &mut closers, &mut workers);
            }
        }
        let started =
            started.and_then(|()| crate::net::control::spawn_reader(reader, events.clone(), Event::Ctrl, Event::CtrlFailed).map_err(|e| crate::threads::refused(Side::Source, "tern-control", &e)));
        let started = started.and_then(|()| {
            let job = WalkJob { sources: p.sources.clone(), opts: p.options, filter: p.filter.clone(), list: p.list.clone(), stripe: p.stripe.clone(), ahead: ahead.clone() };
            let (ev, w, memory) = (events.clone(), writer.clone(), p.memory.clone());
            crate::threads::spawn_or_refuse(Side::Source, "tern-walk", move || walker(ev, w, memory, job))
        });
        if let Err(e) = started {
            return Err(crate::driver::could_not_start(&writer, &closers, e));
        }

        let repair = Repair { resets, reopen, logs: logs.clone(), events: events.clone(), next_index: REPLACEMENT_INDEX };
        let result = self_loop(&rx, &writer, &work_tx, &p, repair, &ahead, &mut |conn| spawn_worker(conn, &mut closers, &mut workers));
        ahead.stop.store(true, Relaxed);
        let result = result.map_err(|e| {
            crate::net::control::prefer_peer_fatal(e, &rx, |ev| match ev {
                Event::Ctrl(Control::Fatal { side, message }) => crate::net::control::Said::Fatal(TransferError::fatal(side, message)),
                Event::CtrlFailed(_) => crate::net::control::Said::Gone,
                _ => crate::net::control::Said::Other,
            })
        });
        drop(work_tx);
        for log in logs.lock().unwrap().values() {
            log.state.lock().unwrap().ended = true;
            log.changed.notify_all();
        }
        if result.is_err() {
            for c in &closers {
                c.close();
            }
        }
        for w in workers {
            let _ = w.join();
        }
        result
    }
}

/// What the main loop needs to repair reset streams.
struct Repair {
    resets: bool,
    reopen: Option<Reopen>,
    logs: StreamLogs,
    events: Sender<Event>,
    next_index: u32,
}

/// The machine's payload for an entry: the source file its reads open.
type Machine = tern_proto::session::sender::Sender<Arc<SrcInfo>>;

/// The main loop: feeds the sending machine what happens (walked entries, the receiver's
/// messages, the stream workers' results) and executes the actions it polls.
struct Driver<'a> {
    machine: Machine,
    writer: &'a CtrlWriter,
    work: &'a Sender<Work>,
    p: &'a SenderParams,
    repair: Repair,
    /// The id the next walked entry has (the walker numbers entries in order from 0).
    next_id: u64,
    summary: Option<Summary>,
}

fn self_loop(
    rx: &Receiver<Event>,
    writer: &CtrlWriter,
    work: &Sender<Work>,
    p: &SenderParams,
    repair: Repair,
    ahead: &Ahead,
    spawn: &mut dyn FnMut(DataConn) -> Result<(), TransferError>,
) -> Result<Summary, TransferError> {
    let machine = Machine::new(p.options.chunk_size, MAX_FILES_AHEAD);
    let mut d = Driver { machine, writer, work, p, repair, next_id: 0, summary: None };
    loop {
        ahead.finished.store(d.machine.counts().1, Relaxed);
        let Ok(ev) = rx.recv() else {
            return Err(TransferError::network("sender: all workers stopped"));
        };
        match ev {
            Event::NewStream(conn) => spawn(conn)?,
            ev => d.handle(ev)?,
        }
        if let Some(summary) = d.drive()? {
            // Everything is verified and reported. Our Bye lets the receiver remove its resume
            // marker; waiting for its Bye means that when we return, the destination is final.
            if writer.send(&Control::Bye).is_ok() {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
                    match rx.recv_timeout(left) {
                        Ok(Event::Ctrl(Control::Bye)) | Ok(Event::CtrlFailed(_)) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            }
            return Ok(summary);
        }
    }
}

impl Driver<'_> {
    /// Feeds one event to the machine (or handles it here, when no decision depends on it).
    fn handle(&mut self, ev: Event) -> Result<(), TransferError> {
        let progress = &self.p.progress;
        match ev {
            Event::Files(batch) => {
                for f in batch {
                    let id = self.next_id;
                    self.next_id += 1;
                    let (kind, size, stripe) = (f.kind, f.size, f.stripe);
                    let info = Arc::new(SrcInfo { path: f.path, rel: f.rel, size: f.size, mtime_s: f.mtime_s, mtime_ns: f.mtime_ns, finished: AtomicBool::new(false), source: f.source });
                    if kind == EntryKind::File {
                        Progress::add(&progress.files_total, 1);
                        Progress::add(&progress.bytes_total, size);
                        // The walk announced only a range that `stripe_of` found to be a stripe.
                        let chunks = stripe.and_then(|(start, end)| tern_proto::chunk::stripe_chunks(start, end, size, self.p.options.chunk_size).ok().flatten());
                        self.machine.announce_stripe(id, size, chunks, info);
                    } else {
                        self.machine.announce_other(id, info);
                    }
                }
            }
            Event::WalkDone(r) => {
                r?;
                self.machine.walk_done();
            }
            // The walker told the receiver itself (`walk_warning`), ahead of its manifest's end.
            Event::WalkWarning(e) => progress.error(e),
            Event::WalkNotice(n) => progress.notice(n),
            Event::NewStream(_) => unreachable!("self_loop spawns the workers"),
            Event::CtrlFailed(e) => return Err(e),
            Event::StreamFailed(e) => return Err(e),
            Event::Requeue(w) => {
                if self.machine.requeue(w.id) {
                    let _ = self.work.send(w);
                }
            }
            Event::Sent { id, chunk, hash, len, hash_only, resend } => {
                if !hash_only {
                    Progress::add(&progress.bytes, len as u64);
                    // A frame of a file that failed meanwhile: its state is gone; only the
                    // bytes count.
                    if let Some(f) = self.machine.payload(id).filter(|_| self.machine.is_active(id)) {
                        let chunks = chunk_count(f.size, self.p.options.chunk_size);
                        let mut mem = self.p.memory.lock().unwrap();
                        let seen = mem.sent.entry(f.rel.clone()).or_insert_with(|| ChunkSet::new(chunks));
                        if (seen.len() == chunks && !seen.insert(chunk)) || resend {
                            Progress::add(&progress.chunks_resent, 1);
                            Progress::add(&progress.bytes_resent, len as u64);
                        }
                    }
                }
                self.machine.chunk_sent(id, chunk, hash);
            }
            Event::ReadFailed { id, error } => self.machine.read_failed(id, read_trouble(error.kind, &error.message), error.message),
            Event::Ctrl(msg) => self.control(msg)?,
        }
        Ok(())
    }

    /// The receiver's control messages.
    fn control(&mut self, msg: Control) -> Result<(), TransferError> {
        let progress = &self.p.progress;
        match msg {
            Control::Want(list) => {
                for WantFile { id, ranges } in list {
                    self.machine.want(id, &ranges).map_err(|r| refused(r, "want"))?;
                }
            }
            Control::Skip(list) => {
                for (id, _) in list {
                    self.machine.skip(id).map_err(|r| refused(r, "skip"))?;
                }
            }
            Control::ChunkBad { id, chunk } => {
                self.machine.ask_again(id, chunk).map_err(|r| refused(r, "resend"))?;
                if let Some(f) = self.machine.payload(id).filter(|_| self.machine.is_active(id)) {
                    tracing::info!("chunk {chunk} of {} failed verification at the receiver; resending", String::from_utf8_lossy(&f.rel));
                }
            }
            Control::RecordBad { index, seq } if self.repair.resets => {
                let (chunks, bytes) = resend_one(&self.repair, &mut self.machine, index, seq)?;
                tracing::info!("data stream {index}: frame {seq} failed authentication at the receiver; sending it again");
                // The chunks are queued before the receiver hears they are coming.
                self.queue_reads()?;
                self.writer.send(&Control::Resending { index, chunks, bytes })?;
            }
            Control::StreamReset { index, received } if self.repair.resets => {
                let (chunks, bytes) = resend_lost(&mut self.repair, &mut self.machine, index, received)?;
                tracing::info!("data stream {index} was reset by the receiver (a corrupted record); sending its {chunks} chunks in flight again");
                let _ = progress.streams.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
                self.queue_reads()?;
                self.writer.send(&Control::Resending { index, chunks, bytes })?;
                if let Some(reopen) = self.repair.reopen.clone() {
                    let (i, events) = (self.repair.next_index, self.repair.events.clone());
                    self.repair.next_index += 1;
                    // Without a thread for it, the session goes on with one stream fewer.
                    let reopened = crate::threads::spawn("tern-reopen", move || match reopen(i) {
                        Ok(c) => {
                            let _ = events.send(Event::NewStream(c));
                        }
                        Err(e) => {
                            let _ = events.send(Event::StreamFailed(e));
                        }
                    });
                    if let Err(e) = reopened {
                        tracing::warn!("data stream {i} not replaced: {}", crate::error::err_text(&e));
                    }
                }
            }
            Control::FileDone(ids) => {
                for id in ids {
                    self.machine.file_done(id).map_err(|r| refused(r, "done"))?;
                }
            }
            Control::FileError { id, side, message } => self.machine.peer_failed(id, side, message).map_err(|r| refused(r, "error"))?,
            Control::Plan { action, path } => {
                let verb = match action {
                    tern_proto::msg::PlanAction::Copy => "copy",
                    tern_proto::msg::PlanAction::Skip => "skip",
                    tern_proto::msg::PlanAction::Delete => "delete",
                };
                progress.plan.lock().unwrap().push(format!("{verb} {}", String::from_utf8_lossy(&path)));
            }
            Control::Summary(s) => {
                progress.deleted.store(s.deleted, Relaxed);
                self.summary = Some(s);
                self.machine.summary();
            }
            Control::Fatal { side, message } => return Err(TransferError::fatal(side, message)),
            Control::Bye => self.machine.peer_ended(),
            _ => return Err(peer_bug("unexpected message for the sending side")),
        }
        Ok(())
    }

    /// Executes the machine's actions until it has none; `Some(summary)` when the session is
    /// finished.
    fn drive(&mut self) -> Result<Option<Summary>, TransferError> {
        use tern_proto::session::sender::{Action, StopReason};
        while let Some(action) = self.machine.poll_action() {
            match action {
                Action::Read(r) => self.read(r),
                Action::FileEnd { id, file_hash } => self.file_end(id, file_hash)?,
                Action::Done { id, payload, outcome } => self.done(id, &payload, outcome)?,
                Action::PeerError { id, side, message } => {
                    let path = self.machine.payload(id).map(|f| String::from_utf8_lossy(&f.rel).into_owned()).unwrap_or_default();
                    self.p.progress.error(TransferError::file(side, path, message));
                }
                Action::Finish => return Ok(Some(self.summary.take().expect("the machine finishes after the summary"))),
                Action::Stop(StopReason::PeerEnded) => return Err(TransferError::network("the receiver ended the session early")),
            }
        }
        Ok(None)
    }

    /// Executes the reads queued so far (and whatever else the machine has to say first).
    fn queue_reads(&mut self) -> Result<(), TransferError> {
        match self.drive()? {
            None => Ok(()),
            Some(_) => unreachable!("a session with chunks to resend is not finished"),
        }
    }

    fn read(&self, r: tern_proto::session::sender::Read) {
        let Some(file) = self.machine.payload(r.id).cloned() else { return };
        if r.hash_only {
            Progress::add(&self.p.progress.bytes_skipped, r.len as u64);
        }
        let _ = self.work.send(Work { id: r.id, chunk: r.chunk, offset: r.offset, len: r.len, whole: r.whole, hash_only: r.hash_only, resend: r.resend, file });
    }

    /// Every chunk went out: `FileEnd`, or a source error if the file changed while it was read.
    fn file_end(&mut self, id: u64, file_hash: [u8; 32]) -> Result<(), TransferError> {
        use tern_proto::session::sender::ReadTrouble;
        let f = self.machine.payload(id).expect("FileEnd for a file held").clone();
        match f.source.stat(f.source_rel()) {
            Ok(st) if f.is_listed_version(&st) => {
                self.writer.send(&Control::FileEnd { id, file_hash, size: f.size, mtime_s: f.mtime_s, mtime_ns: f.mtime_ns })?;
            }
            Ok(_) => self.machine.read_failed(id, ReadTrouble::Changed, CHANGED.into()),
            Err(e) => self.machine.read_failed(id, ReadTrouble::Other, format!("cannot stat after reading: {e}")),
        }
        Ok(())
    }

    /// A file finished: what the user sees of it, and what the next attempt of this run skips.
    fn done(&mut self, id: u64, f: &SrcInfo, outcome: tern_proto::session::sender::Outcome) -> Result<(), TransferError> {
        use tern_proto::session::sender::Outcome;
        let progress = &self.p.progress;
        // The stream logs drop its frames.
        f.finished.store(true, Relaxed);
        match outcome {
            Outcome::Landed => {
                progress.landed(&f.rel, f.size);
                let mut mem = self.p.memory.lock().unwrap();
                // Done for good: what was sent of it no longer tells a resend.
                mem.sent.remove(&f.rel);
                mem.finished.insert(&f.rel);
            }
            Outcome::Skipped => {
                Progress::add(&progress.bytes_skipped, f.size);
                let mut mem = self.p.memory.lock().unwrap();
                // Every chunk went out in an earlier attempt and the receiver now has it
                // whole: it landed from this run (its FileDone lost in the outage).
                if mem.sent.remove(&f.rel).is_some_and(|s| s.is_full()) {
                    progress.landed(&f.rel, f.size);
                } else {
                    Progress::add(&progress.files_skipped, 1);
                    Progress::add(&progress.bytes_of_finished, f.size);
                }
                mem.finished.insert(&f.rel);
            }
            Outcome::Failed { side, trouble, message, tell_peer: true } => {
                self.writer.send(&Control::FileError { id, side, message: message.clone() })?;
                progress.error(TransferError::file(side, f.path.display().to_string(), message).with_kind(error_kind(trouble)));
                Progress::add(&progress.files_failed, 1);
            }
            Outcome::Failed { side, message, tell_peer: false, .. } => {
                progress.error(TransferError::file(side, String::from_utf8_lossy(&f.rel).into_owned(), message));
                Progress::add(&progress.files_failed, 1);
            }
        }
        Ok(())
    }
}

/// A read failure's kind, for the machine (and back, for the report).
fn read_trouble(kind: ErrorKind, message: &str) -> tern_proto::session::sender::ReadTrouble {
    use tern_proto::session::sender::ReadTrouble;
    match kind {
        _ if message == CHANGED => ReadTrouble::Changed,
        ErrorKind::NotFound => ReadTrouble::NotFound,
        ErrorKind::PermissionDenied => ReadTrouble::PermissionDenied,
        ErrorKind::ResourceLimit => ReadTrouble::ResourceLimit,
        _ => ReadTrouble::Other,
    }
}

fn error_kind(trouble: tern_proto::session::sender::ReadTrouble) -> ErrorKind {
    use tern_proto::session::sender::ReadTrouble;
    match trouble {
        ReadTrouble::NotFound => ErrorKind::NotFound,
        ReadTrouble::PermissionDenied => ErrorKind::PermissionDenied,
        ReadTrouble::ResourceLimit => ErrorKind::ResourceLimit,
        ReadTrouble::Changed | ReadTrouble::Other => ErrorKind::Other,
    }
}

fn peer_bug(what: &str) -> TransferError {
    TransferError::fatal(Side::Network, format!("protocol error from the receiver: {what}"))
}

/// The machine refused the receiver's `what` (want, skip, resend, done, error) as impossible.
fn refused(r: tern_proto::session::sender::Refused, what: &str) -> TransferError {
    use tern_proto::session::sender::Refused;
    match r {
        Refused::BadRanges(e) => crate::net::control::proto_err(e),
        Refused::UnknownFile => peer_bug(&format!("{what} for an unknown file")),
        Refused::NotAFile | Refused::NotWaiting => peer_bug(&format!("{what} for a file not waiting for data")),
        Refused::ChunkOutOfRange | Refused::NotInFlight => peer_bug(&format!("{what} for a chunk not in flight")),
    }
}

/// The receiver skipped frame `seq` of stream `index` (it failed authentication): queue its chunk
/// again. Its `Sent` was or will be reported (the receiver read the whole frame, and a later
/// reset of the stream starts past it), so, as for `ChunkBad`, it is counted in once more.
fn resend_one(repair: &Repair, machine: &mut Machine, index: u32, seq: u64) -> Result<(u64, u64), TransferError> {
    let Some(log) = repair.logs.lock().unwrap().get(&index).cloned() else { return Err(peer_bug("bad record on a data stream that does not exist")) };
    let w = {
        let st = log.state.lock().unwrap();
        if seq >= st.written {
            return Err(peer_bug("bad record that was not sent"));
        }
        if seq < st.forgotten {
            return Err(TransferError::network(format!("data stream {index}: a bad record further back than this side keeps a record of; reconnecting")));
        }
        // Not in the log: its file finished (and was pruned), nothing to send.
        match st.frames.binary_search_by_key(&seq, |e| e.0) {
            Ok(i) => st.frames[i].1.clone(),
            Err(_) => return Ok((0, 0)),
        }
    };
    if !machine.resend(w.id, w.chunk, true) {
        return Ok((0, 0));
    }
    Ok((1, w.len as u64))
}

/// The receiver reset stream `index` after accepting `received` of its frames: close it and
/// queue again what it wrote after those, for files not finished. Returns (chunks, bytes).
/// They count as resends when sent (`Sent { resend }`).
fn resend_lost(repair: &mut Repair, machine: &mut Machine, index: u32, received: u64) -> Result<(u64, u64), TransferError> {
    let Some(log) = repair.logs.lock().unwrap().remove(&index) else { return Err(peer_bug("reset of a data stream that does not exist")) };
    let lost: Vec<(u64, Work, bool)> = {
        let mut st = log.state.lock().unwrap();
        if received > st.written {
            return Err(peer_bug("reset claims more frames than were sent"));
        }
        if received < st.forgotten {
            return Err(TransferError::network(format!("data stream {index} was reset further back than this side keeps a record of; reconnecting")));
        }
        st.reset = Some(received);
        log.changed.notify_all();
        let keep = st.frames.iter().take_while(|e| e.0 < received).count();
        st.frames.drain(keep..).collect()
    };
    log.closer.close();
    let (mut chunks, mut bytes) = (0, 0);
    for (_, w, reported) in lost {
        // Its `Sent` already counted it out; one not reported never will be (the worker saw the
        // reset), so it is still counted in.
        if machine.resend(w.id, w.chunk, reported) {
            chunks += 1;
            bytes += w.len as u64;
        }
    }
    Ok((chunks, bytes))
}

/// An upper bound on an entry's encoded size in an `Entries` message (path, link target and
/// the fixed fields with their length prefixes).
fn entry_wire_bytes(f: &SrcFile) -> usize {
    f.rel.len() + f.target.len() + 128
}

const CHANGED: &str = "file changed while it was being sent (size or mtime differs); re-run to send the new version";

/// Walks the sources, registering entries with the main loop before announcing them.
/// How far the walk may run ahead of the transfer: files announced but not finished. Both sides
/// hold state per such file (the receiver queues them until its window takes them), so this,
/// not the tree, bounds their memory; a million-file tree streams through.
pub const MAX_FILES_AHEAD: u64 = 32_768;

/// Files the main loop has seen finish this session; the walker waits on it.
#[derive(Default)]
struct Ahead {
    finished: AtomicU64,
    /// The session is over: stop waiting.
    stop: AtomicBool,
}

struct WalkJob {
    sources: Vec<SourceSpec>,
    opts: Options,
    filter: Filter,
    stripe: Option<Stripe>,
    list: Option<Arc<Vec<Vec<u8>>>>,
    ahead: Arc<Ahead>,
}

/// The byte range of `s` to announce for a file of `size` bytes now: `None` when it is the whole
/// file (it moves and lands as any file), an error when the file no longer has it.
fn stripe_of(s: &Stripe, size: u64, chunk_size: u32) -> Result<Option<(u64, u64)>, &'static str> {
    match tern_proto::chunk::stripe_chunks(s.start, s.end, size, chunk_size) {
        Ok(chunks) => Ok(chunks.map(|_| (s.start, s.end))),
        Err(tern_proto::chunk::NotAStripe) => Err("changed since it was listed for spreading (its stripe no longer fits it); the transfer's closing pass sends it whole"),
    }
}

/// Multi-link files whose first name the walk remembers, to announce their other names as links.
const MAX_HARD_LINKED_FILES: usize = 1_000_000;

/// What the walk skipped goes to the receiver from the walker's own thread, so it is on the wire
/// before the `ManifestEnd` the walker sends later: in a pull the receiver tells the user, and it
/// must not `--delete` what the walk could not see. Sent from the main loop instead, it could
/// arrive after `ManifestEnd` on a busy machine, and a `sync --delete` removed the file (found by
/// `tests/transfers.rs::a_pull_reports_what_the_remote_walk_skipped` under the full suite).
fn walk_warning(writer: &CtrlWriter, events: &Sender<Event>, e: TransferError) {
    let _ = writer.send(&Control::FileError { id: tern_proto::msg::UNANNOUNCED, side: e.side, message: e.message_with_path() });
    let _ = events.send(Event::WalkWarning(e));
}

fn walker(events: Sender<Event>, writer: Arc<CtrlWriter>, memory: Arc<Mutex<SendMemory>>, job: WalkJob) {
    let WalkJob { sources, opts, filter, list, stripe, ahead } = job;
    let striped = stripe.as_ref().map(|s| sources.first().map(|src| src.path.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&s.path))));
    const BATCH: usize = 512;
    // A batch is also cut by bytes: 512 entries of 4 KiB paths and link targets would be 4 MiB,
    // four times a control frame. Half a frame leaves room for the largest single entry.
    const BATCH_BYTES: usize = (tern_proto::limits::MAX_CONTROL_FRAME as usize) / 2;
    let mut batch: Vec<SrcFile> = Vec::with_capacity(BATCH);
    let mut batch_bytes = 0usize;
    let mut next_id = 0u64;
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut failed: Option<TransferError> = None;
    let flush = |batch: &mut Vec<SrcFile>, next_id: &mut u64| -> Result<(), TransferError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut entries = Vec::with_capacity(batch.len());
        for f in batch.iter() {
            let hash = if opts.checksum() && f.kind == EntryKind::File { f.open().and_then(|file| crate::store::hashing::hash_source_file(&file, f.size, opts.chunk_size)).ok() } else { None };
            entries.push(Entry {
                id: *next_id,
                kind: f.kind,
                path: f.rel.clone(),
                size: f.size,
                mode: f.mode,
                mtime_s: f.mtime_s,
                mtime_ns: f.mtime_ns,
                target: f.target.clone(),
                hash,
                stripe: f.stripe,
            });
            *next_id += 1;
        }
        let _ = events.send(Event::Files(std::mem::take(batch)));
        writer.send(&Control::Entries(entries))
    };
    let finished = memory.lock().unwrap().finished.clone();
    let mut warn = |e: TransferError| walk_warning(&writer, &events, e);
    let bases: Vec<Vec<u8>> = sources.iter().filter_map(|s| s.base.clone()).collect();
    // First name of each multi-link file met so far (bounded; beyond, names go as files).
    let mut first_names: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    let mut emit = |mut f: SrcFile| {
        if let Some(inode) = f.inode.filter(|_| opts.hard_links() && f.kind == EntryKind::File) {
            match first_names.get(&inode) {
                Some(first) => {
                    f.kind = EntryKind::HardLink;
                    f.target = first.clone();
                }
                None if first_names.len() < MAX_HARD_LINKED_FILES => {
                    first_names.insert(inode, f.rel.clone());
                }
                None => {}
            }
        }
        if f.kind == EntryKind::File && finished.contains(&f.rel) {
            return true;
        }
        if let (Some(Some(path)), Some(s)) = (&striped, &stripe)
            && f.kind == EntryKind::File
            && &f.path == path
        {
            match stripe_of(s, f.size, opts.chunk_size) {
                Ok(range) => f.stripe = range,
                Err(why) => {
                    // Sending it whole would publish it under the other stripes' feet.
                    walk_warning(&writer, &events, TransferError::file(Side::Source, f.path.display().to_string(), why));
                    return true;
                }
            }
        }
        if f.kind == EntryKind::Symlink && opts.safe_links() {
            // Judged against the copied tree, as rsync's --safe-links: the source's own name
            // is not part of it.
            let in_tree = bases.iter().find_map(|b| f.rel.strip_prefix(&b[..]).and_then(|r| r.strip_prefix(b"/"))).unwrap_or(&f.rel);
            if !tern_proto::path::symlink_stays_inside(in_tree, &f.target) {
                let _ = events.send(Event::WalkNotice(format!("{}: symlink to '{}' points outside the copied tree; left out (--safe-links)", f.path.display(), String::from_utf8_lossy(&f.target))));
                return true;
            }
        }
        if f.kind == EntryKind::File {
            if files - ahead.finished.load(Relaxed) >= MAX_FILES_AHEAD {
                // Announce what is batched, then wait for the transfer to catch up.
                batch_bytes = 0;
                if let Err(e) = flush(&mut batch, &mut next_id) {
                    failed = Some(e);
                    return false;
                }
                while files - ahead.finished.load(Relaxed) >= MAX_FILES_AHEAD {
                    if ahead.stop.load(Relaxed) {
                        return false;
                    }
                    thread::sleep(Duration::from_millis(2));
                }
            }
            files += 1;
            bytes += f.size;
        }
        batch_bytes += entry_wire_bytes(&f);
        batch.push(f);
        if batch.len() >= BATCH || batch_bytes >= BATCH_BYTES {
            batch_bytes = 0;
            if let Err(e) = flush(&mut batch, &mut next_id) {
                failed = Some(e);
                return false;
            }
        }
        true
    };
    let r = match &list {
        Some(list) if sources.len() == 1 => walk_list(&sources[0], list, opts.recursive(), &filter, &mut emit, &mut warn),
        Some(_) => Err(TransferError::fatal(Side::Source, "--files-from takes one source directory")),
        None => walk(&sources, opts.recursive(), &filter, &mut emit, &mut warn),
    };
    let r = r.and_then(|_| match failed.take() {
        Some(e) => Err(e),
        None => flush(&mut batch, &mut next_id),
    });
    let r = r.and_then(|_| writer.send(&Control::ManifestEnd { files, bytes }));
    if let Err(e) = &r
        && e.scope == crate::error::Scope::Fatal
    {
        let _ = writer.send(&Control::Fatal { side: e.side, message: e.message_with_path() });
    }
    let _ = events.send(Event::WalkDone(r));
}

/// One data stream: pull wanted chunks, read, hash, send. Exits when the queue closes, or
/// when the receiver reset this stream (its frames in flight are then the main loop's).
/// `resets`: the receiver may reset it, so a broken stream waits for that before it fails.
fn send_worker(mut conn: DataConn, work: Receiver<Work>, events: Sender<Event>, chunk_size: u32, rate: Option<Arc<RateLimit>>, log: Arc<StreamLog>, resets: bool) {
    const PREFIX: usize = HEADER_LEN + ChunkHeader::LEN;
    let mut buf = vec![0u8; PREFIX + chunk_size as usize + TAG_LEN];
    let mut sealer = conn.sealer.take();
    let trailer = if sealer.is_some() { TAG_LEN } else { 0 };
    let mut unsent = crate::net::transport::UnsentCap::new(conn.probe.as_ref());
    let mut out = BufWriter::with_capacity(256 << 10, &mut conn.stream);
    let mut seq = 0u64;
    let mut open: Option<(u64, PosixSourceFile)> = None;
    let faults = faults();
    loop {
        // Flush buffered small frames before waiting: the receiver may be waiting on them.
        let w = match work.try_recv() {
            Ok(w) => w,
            Err(crossbeam_channel::TryRecvError::Empty) => {
                if let Err(e) = out.flush() {
                    broken(&log, &events, resets, conn.index, &e, None);
                    return;
                }
                match work.recv() {
                    Ok(w) => w,
                    Err(_) => break,
                }
            }
            Err(crossbeam_channel::TryRecvError::Disconnected) => break,
        };
        if open.as_ref().is_none_or(|(id, _)| *id != w.id) {
            // A stream holds one source file at a time; the previous one goes back first.
            open = None;
            match crate::store::fsops::waiting_for_descriptors(|| w.file.open()) {
                Ok(f) => open = Some((w.id, f)),
                Err(e) => {
                    let error = TransferError::io(Side::Source, w.file.path.display().to_string(), "cannot open", &e);
                    let _ = events.send(Event::ReadFailed { id: w.id, error });
                    continue;
                }
            }
        }
        let Some((_, file)) = &open else { continue };
        let data = &mut buf[PREFIX..PREFIX + w.len as usize];
        if let Err(e) = file.read_at(w.offset, data) {
            let error = if e.kind == crate::store::Kind::Changed {
                TransferError::file(Side::Source, w.file.path.display().to_string(), CHANGED)
            } else {
                e.to_transfer(Side::Source, w.file.path.display().to_string(), "read failed")
            };
            let _ = events.send(Event::ReadFailed { id: w.id, error });
            continue;
        }
        if w.whole {
            // A single-chunk file completes with this frame: check it did not change under us.
            let same = file.stat().is_ok_and(|st| w.file.is_listed_version(&st));
            if !same {
                let error = TransferError::file(Side::Source, w.file.path.display().to_string(), CHANGED);
                let _ = events.send(Event::ReadFailed { id: w.id, error });
                continue;
            }
        }
        let hash = chunk_hash(data);
        if w.hash_only {
            if faults.no_reread {
                let error = TransferError::file(Side::Source, w.file.path.display().to_string(), "read again only to hash it (TERN_FAULT_NO_REREAD)");
                let _ = events.send(Event::ReadFailed { id: w.id, error });
                continue;
            }
            let _ = events.send(Event::Sent { id: w.id, chunk: w.chunk, hash, len: w.len, hash_only: true, resend: false });
            continue;
        }
        if faults.corrupt(&w.file.rel, w.chunk) && !data.is_empty() {
            data[0] ^= 0xff;
        }
        let mut header = ChunkHeader { flags: if w.whole { FLAG_WHOLE_FILE } else { 0 }, file_id: w.id, index: w.chunk, offset: w.offset, hash, tag: [0; 32] };
        if let Some(key) = &conn.tag_key {
            header.tag = header.compute_tag(key, seq);
        }
        {
            let mut st = log.state.lock().unwrap();
            if st.reset.is_some() {
                let _ = events.send(Event::Requeue(w));
                return;
            }
            st.frames.push_back((seq, w.clone(), false));
            st.written = seq + 1;
            if st.frames.len() >= 2 * st.pruned_len.max(64) {
                st.frames.retain(|e| !e.1.file.finished.load(Relaxed));
                st.pruned_len = st.frames.len();
            }
            if st.frames.len() > MAX_LOG
                && let Some((old, ..)) = st.frames.pop_front()
            {
                st.forgotten = old + 1;
            }
        }
        let this = seq;
        seq += 1;
        buf[..HEADER_LEN].copy_from_slice(&ChunkHeader::frame_header(w.len as usize + trailer));
        buf[HEADER_LEN..PREFIX].copy_from_slice(&header.encode());
        let end = PREFIX + w.len as usize;
        if let Some(s) = sealer.as_mut() {
            let (aad, body) = buf[..end].split_at_mut(HEADER_LEN);
            let tag = s.seal(aad, body);
            buf[end..end + TAG_LEN].copy_from_slice(&tag);
        }
        if let Some(r) = &rate {
            r.take(w.len as usize);
        }
        if faults.delay_ms > 0 {
            thread::sleep(std::time::Duration::from_millis(faults.delay_ms));
        }
        let frame = &buf[..end + trailer];
        let sent = out.write_all(frame);
        let sent_event = Event::Sent { id: w.id, chunk: w.chunk, hash, len: w.len, hash_only: false, resend: w.resend };
        unsent.update();
        if let Err(e) = sent {
            broken(&log, &events, resets, conn.index, &e, Some((this, sent_event)));
            return;
        }
        if faults.cut(w.len as u64) {
            tracing::warn!("test fault: cutting data stream {}", conn.index);
            conn.closer.close();
        }
        // Reported under the log's lock, so the main loop's reset sees either "reported" or
        // "never will be" for every frame it takes back.
        let mut st = log.state.lock().unwrap();
        match st.reset {
            None => {
                if let Some(e) = st.frames.iter_mut().rev().find(|e| e.0 == this) {
                    e.2 = true;
                }
                let _ = events.send(sent_event);
            }
            Some(received) => {
                if this < received {
                    let _ = events.send(sent_event);
                }
                return;
            }
        }
    }
    let _ = out.flush();
    drop(out);
    let _ = conn.stream.flush();
    // Before the stream closes: a socket closed with the acceptor's proof unread is reset.
    if let Err(e) = conn.confirm_accept() {
        broken(&log, &events, resets, conn.index, &e, None);
    }
}

/// This worker's stream failed with `e` (while writing frame `frame`, if any). If the receiver
/// may reset streams, the pipe probably broke because it did: wait for its `StreamReset` (the
/// main loop then owns the frames in flight) before calling it a network error.
fn broken(log: &StreamLog, events: &Sender<Event>, resets: bool, index: u32, e: &std::io::Error, frame: Option<(u64, Event)>) {
    if resets {
        let st = log.state.lock().unwrap();
        let (st, _) = log.changed.wait_timeout_while(st, RESET_WAIT, |st| st.reset.is_none() && !st.ended).unwrap();
        if st.ended && st.reset.is_none() {
            return;
        }
        if let Some(received) = st.reset {
            // A frame the receiver accepted still needs its `Sent` (it cannot be one whose write
            // failed, but a buffered write may fail for frames written before it).
            if let Some((this, sent)) = frame
                && this < received
            {
                let _ = events.send(sent);
            }
            return;
        }
    }
    let _ = events.send(Event::StreamFailed(TransferError::network(format!("data stream {index}: {}", err_text(e)))));
}

#[cfg(test)]
mod reset_tests {
    //! `StreamReset` against a real sender, with the test as the receiver: it sends again exactly
    //! what the reset stream had past the frames accepted, on the replacement stream, and refuses
    //! a reset that names no stream or claims more frames than were sent.
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    use tern_proto::frame::FrameHeader;

    use super::*;
    use crate::net::transport::{ControlHalves, Stream};

    const CHUNK: u32 = 64 << 10;

    fn conn(s: UnixStream, index: u32) -> DataConn {
        let s = Stream::Unix(s);
        DataConn { closer: s.closer(), stream: s, index, tag_key: None, sealer: None, probe: None, accept: None }
    }

    /// Reads one chunk frame: its chunk index.
    fn frame(s: &mut UnixStream) -> u64 {
        let mut head = [0u8; HEADER_LEN];
        s.read_exact(&mut head).unwrap();
        let h = FrameHeader::parse(head, 1 << 30).unwrap();
        let mut body = vec![0u8; h.body_len as usize];
        s.read_exact(&mut body).unwrap();
        ChunkHeader::decode(body[..ChunkHeader::LEN].try_into().unwrap()).index
    }

    struct Peer {
        r: CtrlReader,
        w: CtrlWriter,
        data: UnixStream,
        feed: StreamFeed,
        sender: thread::JoinHandle<Result<Summary, TransferError>>,
        _dir: tempfile::TempDir,
    }

    /// A sender of one 3-chunk file on one stream (index 0), after the test wanted all of it.
    fn start(resets: bool) -> Peer {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, (0..3 * CHUNK).map(|i| (i % 251) as u8).collect::<Vec<_>>()).unwrap();
        let (c1, c2) = UnixStream::pair().unwrap();
        let (d1, d2) = UnixStream::pair().unwrap();
        let options = tern_proto::Options { flags: 0, chunk_size: CHUNK, streams: 1, concurrency: 0 };
        let params = SenderParams {
            sources: vec![crate::store::walk::source_spec(&file, false)],
            options,
            progress: Arc::default(),
            memory: Arc::default(),
            rate: None,
            filter: Filter::default(),
            list: None,
            stripe: None,
        };
        let sending = Sending::new().with_resets(resets, None);
        let feed = sending.feed();
        let h = ControlHalves::from_unix(c1).unwrap();
        let sender = thread::spawn(move || sending.run(CtrlReader::new(h.reader), Arc::new(CtrlWriter::new(h.writer)), vec![conn(d1, 0)], params));
        let h = ControlHalves::from_unix(c2).unwrap();
        let (mut r, w) = (CtrlReader::new(h.reader), CtrlWriter::new(h.writer));
        while !matches!(r.recv().unwrap(), Control::ManifestEnd { .. }) {}
        w.send(&Control::Want(vec![WantFile { id: 0, ranges: vec![(0, 3)] }])).unwrap();
        Peer { r, w, data: d2, feed, sender, _dir: dir }
    }

    fn refused(p: Peer, reset: Control, want: &str) {
        let mut p = p;
        frame(&mut p.data);
        p.w.send(&reset).unwrap();
        let e = p.sender.join().unwrap().unwrap_err();
        assert!(e.message.contains(want), "{e}");
        assert!(e.message.contains("protocol error"), "{e}");
    }

    #[test]
    fn resends_exactly_what_the_reset_stream_had_past_the_accepted_frames() {
        let mut p = start(true);
        let sent: Vec<u64> = (0..3).map(|_| frame(&mut p.data)).collect();
        // The sender's FileEnd follows the three frames; the "receiver" accepted only the first.
        while !matches!(p.r.recv().unwrap(), Control::FileEnd { .. }) {}
        p.w.send(&Control::StreamReset { index: 0, received: 1 }).unwrap();
        match p.r.recv().unwrap() {
            Control::Resending { index: 0, chunks: 2, bytes } => assert_eq!(bytes, 2 * CHUNK as u64),
            other => panic!("expected Resending, got {other:?}"),
        }
        // The old stream is closed; the replacement carries the two lost chunks, nothing more.
        let mut rest = Vec::new();
        assert_eq!(p.data.read_to_end(&mut rest).unwrap_or(0), 0, "nothing more on the reset stream");
        let (mine, theirs) = UnixStream::pair().unwrap();
        p.feed.add(conn(theirs, REPLACEMENT_INDEX));
        let mut mine = mine;
        // In any order: the reset stream's idle worker may take one and hand it back first.
        let mut again: Vec<u64> = (0..2).map(|_| frame(&mut mine)).collect();
        again.sort();
        assert_eq!(again, sent[1..].to_vec());
        p.w.send(&Control::FileDone(vec![0])).unwrap();
        p.w.send(&Control::Summary(Summary::default())).unwrap();
        while !matches!(p.r.recv().unwrap(), Control::Bye) {}
        p.w.send(&Control::Bye).unwrap();
        p.sender.join().unwrap().unwrap();
    }

    #[test]
    fn a_skipped_record_is_sent_again_alone_on_the_same_stream() {
        let mut p = start(true);
        let sent: Vec<u64> = (0..3).map(|_| frame(&mut p.data)).collect();
        // FileEnd went out once the three frames did; the resend does not repeat it.
        while !matches!(p.r.recv().unwrap(), Control::FileEnd { .. }) {}
        p.w.send(&Control::RecordBad { index: 0, seq: 1 }).unwrap();
        match p.r.recv().unwrap() {
            Control::Resending { index: 0, chunks: 1, bytes } => assert_eq!(bytes, CHUNK as u64),
            other => panic!("expected Resending, got {other:?}"),
        }
        assert_eq!(frame(&mut p.data), sent[1], "the chunk of frame 1, on the stream that goes on");
        p.w.send(&Control::FileDone(vec![0])).unwrap();
        p.w.send(&Control::Summary(Summary::default())).unwrap();
        while !matches!(p.r.recv().unwrap(), Control::Bye) {}
        p.w.send(&Control::Bye).unwrap();
        p.sender.join().unwrap().unwrap();
    }

    #[test]
    fn refuses_a_bad_record_that_was_not_sent() {
        refused(start(true), Control::RecordBad { index: 0, seq: 1_000 }, "not sent");
    }

    #[test]
    fn refuses_a_reset_of_a_stream_that_does_not_exist() {
        refused(start(true), Control::StreamReset { index: 7, received: 0 }, "does not exist");
    }

    #[test]
    fn refuses_a_reset_claiming_more_frames_than_were_sent() {
        refused(start(true), Control::StreamReset { index: 0, received: 1_000_000 }, "more frames than were sent");
    }

    #[test]
    fn without_the_feature_a_reset_is_a_protocol_error() {
        refused(start(false), Control::StreamReset { index: 0, received: 0 }, "unexpected message");
    }
}

#[cfg(test)]
mod path_set_tests {
    use super::PathSet;

    #[test]
    fn remembers_paths_by_digest() {
        let mut s = PathSet::default();
        assert!(s.is_empty());
        assert!(s.insert(b"run/a"));
        assert!(!s.insert(b"run/a"), "a second insert is no news");
        assert!(s.contains(b"run/a") && !s.contains(b"run/b") && !s.contains(b"run/a/"));
        for i in 0..10_000u32 {
            s.insert(format!("d/{i}").as_bytes());
        }
        assert_eq!(s.len(), 10_001, "no two of 10,000 paths share a digest");
    }
}
