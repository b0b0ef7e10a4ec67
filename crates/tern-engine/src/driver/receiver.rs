//! The receiving side of a session: decide what is needed, verify and write chunks on every data
//! stream, and rename a file into place only once it is verified and durable.

use std::collections::{HashMap, HashSet};
use std::io::{BufReader, Read};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, unbounded};
use tern_proto::chunk::{chunk_count, chunk_range};
use tern_proto::data::{ChunkHeader, FLAG_WHOLE_FILE, chunk_data_len};
use tern_proto::filter::Filter;
use tern_proto::frame::{FrameHeader, HEADER_LEN};
use tern_proto::msg::{PlanAction, SkipReason, Summary};
use tern_proto::path::{file_name, parent, symlink_stays_inside};
use tern_proto::session::Trouble;
use tern_proto::session::receiver::{self as decide, Action, FileSpec, Outcome, Refused};
use tern_proto::{Control, Entry, EntryKind, Options};

use crate::error::{ErrorKind, Side, TransferError, err_text};
use crate::faults::chunk_hash;
use crate::net::control::{CtrlReader, CtrlWriter};
use crate::net::datastream::DataConn;
use crate::net::seal::TAG_LEN;
use crate::progress::Progress;
use crate::store::fsops::{self, Beneath, DestRoot, Dir};
use crate::store::layout::{self, Layout};
use crate::store::posix::{DirCache, PosixPart, PosixSink};
use crate::store::{self, Part as _, Sink as _};

/// Flow-control window of the receiver: wanted-but-unfinished bytes and files.
pub const WINDOW_BYTES: u64 = 512 << 20;
/// Files in flight by default. Keeping a long fat path busy with small files takes many: 1 Gb/s
/// over 68 ms holds 2,000 files of 4 KiB, and each also waits for its batch to be made durable.
/// What a file in flight costs here is memory (its entry and state, a few hundred bytes), and
/// the bytes window bounds its data; a one-chunk file holds no descriptor while it waits (it is
/// opened, written and closed when its chunk arrives), so the descriptor limit does not bound
/// this number: only [`window_held`] does, for files of more than one chunk.
pub const WINDOW_FILES: usize = 16384;

/// Files of more than one chunk in flight at once. Such a file holds two descriptors at the
/// receiver while in flight (its temporary, opened when its first chunk arrives, and its
/// journal); directories come from the shared directory cache, counted apart. So this is what
/// this process's descriptor limit allows after the directory cache and a reserve for sockets,
/// the sender's open files (local copies run both sides in one process), the walk, and the
/// descriptors stream and finalizer threads hold for a moment (a one-chunk file's temporary
/// while it is written, a directory evicted from the cache while it is used): a quarter of the
/// limit, 48 to 160. Each receiver computes its own: its limit paces the sender. Under `ulimit -n
/// 256` that is 80 large files, beside up to [`WINDOW_FILES`] one-chunk ones; a limit met anyway
/// slows the window down.
pub fn window_held() -> usize {
    const PER_FILE: usize = 2;
    let limit = descriptor_limit();
    let reserve = (limit / 4).clamp(48, 160);
    (limit.saturating_sub(reserve + dir_cache_size()) / PER_FILE).clamp(4, WINDOW_FILES)
}

/// How many directory descriptors the receiver keeps open for reuse.
pub fn dir_cache_size() -> usize {
    let limit = descriptor_limit();
    // At least 16 where the limit allows it (deep trees reuse them); under a tiny limit (`ulimit
    // -n 32`) a quarter of it, so the cache alone cannot take what the copy needs.
    (limit / 8).clamp(16.min(limit / 4), 512)
}

/// Files in flight: what the client asked for (`--concurrency`), or [`WINDOW_FILES`].
pub fn window_files_for(asked: u32) -> usize {
    if asked == 0 { WINDOW_FILES } else { (asked as usize).min(WINDOW_FILES) }
}

/// Of those, files of more than one chunk: never past what descriptors allow.
pub fn window_held_for(asked: u32) -> usize {
    window_files_for(asked).min(window_held())
}

/// This process's soft descriptor limit (1024 if it cannot be read).
pub fn descriptor_limit() -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 { lim.rlim_cur.min(1 << 24) as usize } else { 1024 }
}

pub struct ReceiverParams {
    /// The destination as the user named it, already resolved (and confined, for a daemon).
    pub destination: PathBuf,
    pub multi_source: bool,
    pub options: Options,
    pub progress: Arc<Progress>,
    /// Wanted-but-unfinished bytes and files: the flow-control window.
    pub window_bytes: u64,
    pub window_files: usize,
    /// Of those, files of more than one chunk (each holds descriptors while in flight).
    pub window_held: usize,
    /// `--exclude`/`--include` rules: `--delete` leaves what they exclude alone, as rsync does.
    pub filter: Filter,
    /// Daemon mode: the root every destination path must resolve beneath at the moment of use.
    pub beneath: Option<Arc<Beneath>>,
    /// Daemon mode: `tern serve --allow-links-out` (links whose targets may resolve outside the
    /// root are created as they are instead of refused).
    pub allow_links_out: bool,
    /// `--bwlimit` on a pull: the streams are read no faster, and TCP's flow control holds the
    /// remote sender (any version) to it.
    pub rate: Option<Arc<crate::net::ratelimit::RateLimit>>,
}

/// A file being written, shared with the stream workers and the finalizer: its partial file in
/// the store, and what the driver decides about it.
struct InFlight {
    part: PosixPart,
    size: u64,
    chunks: u64,
    meta: store::Meta,
    /// `--verify full`: a one-chunk file's mode and mtime are set after the re-read, not when
    /// written (a mode without read permission would refuse the re-read's open).
    meta_late: bool,
    /// Chunks written (or resumed) in this part, one bit each: a second copy of a chunk is
    /// never written over the first, so the bytes published are the bytes verified.
    claimed: Box<[AtomicU64]>,
    /// A stripe's chunks (empty: the whole file): a chunk outside is another session's to
    /// write, and a sender that sends one breaks the protocol.
    stripe: std::ops::Range<u64>,
}

impl InFlight {
    /// `stripe`: of a stripe, the chunks it moves (empty: all of them); the others are taken
    /// from the start, so a chunk of another stripe that a peer sends is never written here.
    fn claimed_bits(chunks: u64, resumed: &[(u64, [u8; 32])], stripe: std::ops::Range<u64>) -> Box<[AtomicU64]> {
        let bits: Box<[AtomicU64]> = (0..chunks.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        let outside = (0..chunks).filter(|i| !stripe.is_empty() && !stripe.contains(i));
        for index in resumed.iter().map(|&(index, _)| index).chain(outside) {
            bits[(index / 64) as usize].fetch_or(1 << (index % 64), Relaxed);
        }
        bits
    }
    /// Takes chunk `index` for writing; false if a copy of it was written already.
    fn claim(&self, index: u64) -> bool {
        let bit = 1 << (index % 64);
        self.claimed[(index / 64) as usize].fetch_or(bit, Relaxed) & bit == 0
    }
    /// Whether the file is one chunk, so it holds no descriptor while in flight.
    fn single(&self) -> bool {
        self.chunks <= 1
    }
}

type Sinks = Arc<RwLock<HashMap<u64, Arc<InFlight>>>>;

enum Event {
    Ctrl(Control),
    CtrlFailed(TransferError),
    ChunkOk { id: u64, index: u64, hash: [u8; 32], len: u32, whole: bool },
    ChunkBad { id: u64, index: u64 },
    WriteFailed { id: u64, error: std::io::Error, what: &'static str },
    StreamFailed(TransferError),
    StreamCorrupt { index: u32, seq: u64, why: String, skipped: bool },
    Finalized { id: u64 },
    FinalizeFailed { id: u64, kind: ErrorKind, message: String },
    NewStream(DataConn),
}

/// What the driver keeps of a file the machine holds: the entry as announced and where it
/// lands (relative to the destination root).
struct FileInfo {
    entry: Entry,
    rel: Vec<u8>,
}

/// Handle to feed extra data streams into a running receiver.
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

pub struct Receiving {
    events: Sender<Event>,
    rx: Receiver<Event>,
    resets: bool,
    reopen: Option<crate::driver::sender::Reopen>,
}

/// Resetting corrupted streams: allowed while `resets`, within the budget.
struct Repair {
    resets: bool,
    reopen: Option<crate::driver::sender::Reopen>,
    events: Sender<Event>,
    next_index: u32,
    corrupted: u64,
    verified_bytes: u64,
}

/// Resets a session allows before it calls the path (or an attacker) hopeless, plus one per
/// `RESET_PER_BYTES` verified: a path that corrupts a few segments per 256 MiB keeps going, a
/// stream whose every record fails is refused after a few attempts.
const RESET_BUDGET: u64 = 16;
const RESET_PER_BYTES: u64 = 16 << 20;

impl Default for Receiving {
    fn default() -> Self {
        Self::new()
    }
}

struct Ctx<'a> {
    p: &'a ReceiverParams,
    /// The decisions: window, per-file lifecycle, retries (tern_proto::session::receiver).
    machine: decide::Receiver<FileInfo>,
    /// Errors this side produced for a file the machine is about to fail: reported with their
    /// kind and path when it says the file is done.
    stashed: HashMap<u64, TransferError>,
    writer: &'a CtrlWriter,
    layout: Option<Layout>,
    root: Option<DestRoot>,
    /// Directory descriptors, shared with the stream workers and the finalizer (with `root`).
    dirs: Option<Arc<DirCache>>,
    /// The destination as a store, over `dirs` (`posix_sink`): files are written through it.
    store: Option<Arc<PosixSink>>,
    /// Directories this session created: nothing stood in them, so no stat, no stale
    /// temporary or journal to look for (a metadata round trip each on Lustre or NFS).
    fresh_dirs: HashSet<Vec<u8>>,
    /// Directories refused (a reserved name): their whole subtree is refused with them.
    refused_dirs: HashSet<Vec<u8>>,
    sinks: Sinks,
    finalize: Sender<ToFinalize>,
    done_ids: Vec<u64>,
    symlinks: Vec<Entry>,
    /// Hard links to make once every file landed: `path` the name, `target` the first name,
    /// both already mapped to the destination.
    hard_links: Vec<Entry>,
    hard_links_possible: bool,
    /// Files of this session that failed (mapped paths): a hard link to one is not made, so it
    /// never names an older version left there.
    failed_files: HashSet<Vec<u8>>,
    dir_meta: Vec<(Vec<u8>, u32, i64, u32)>,
    /// Every path the manifest names, for `--delete` only (its one cost per entry of the tree).
    keep: HashSet<Vec<u8>>,
    /// One past the highest entry id seen: an id below it that `files` lacks is a file already
    /// done and dropped, not an unknown one.
    announced: u64,
    source_errors: bool,
    summary: Summary,
    repair: Repair,
}

impl Receiving {
    pub fn new() -> Self {
        let (events, rx) = unbounded();
        Self { events, rx, resets: false, reopen: None }
    }
    pub fn feed(&self) -> StreamFeed {
        StreamFeed(self.events.clone())
    }
    /// The peer answers `StreamReset` (Hello feature bit 5, not third-party): a stream with a
    /// corrupted record is reset and its frames in flight sent again, instead of failing the
    /// session. `reopen`: the client opens a replacement stream for each.
    pub fn with_resets(mut self, on: bool, reopen: Option<crate::driver::sender::Reopen>) -> Self {
        self.resets = on;
        self.reopen = reopen.filter(|_| on);
        self
    }

    pub fn run(self, reader: CtrlReader, writer: Arc<CtrlWriter>, streams: Vec<DataConn>, p: ReceiverParams) -> Result<Summary, TransferError> {
        let Receiving { events, rx, resets, reopen } = self;
        let sinks: Sinks = Arc::default();
        let ending = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut closers = Vec::new();
        let chunk_size = p.options.chunk_size;
        let spawn_worker = |conn: DataConn, closers: &mut Vec<crate::net::transport::Closer>| {
            closers.push(conn.closer.clone());
            let (s, ev, end, rate) = (sinks.clone(), events.clone(), ending.clone(), p.rate.clone());
            crate::threads::spawn_or_refuse(Side::Destination, "tern-recv", move || recv_worker(conn, s, ev, chunk_size, end, resets, rate))?;
            p.progress.streams.fetch_add(1, Relaxed);
            Ok::<_, TransferError>(())
        };
        let mut started = Ok(());
        for conn in streams {
            if started.is_ok() {
                started = spawn_worker(conn, &mut closers);
            }
        }
        let started = started
            .and_then(|()| crate::net::control::spawn_reader(reader, events.clone(), Event::Ctrl, Event::CtrlFailed).map_err(|e| crate::threads::refused(Side::Destination, "tern-control", &e)));
        let (fin_tx, fin_rx) = unbounded();
        let finalizer = started.and_then(|()| {
            let ev = events.clone();
            let fsync = !p.options.fsync_none();
            let verify_full = p.options.verify_full();
            crate::threads::spawn_or_refuse(Side::Destination, "tern-finalize", move || finalizer(fin_rx, ev, fsync, verify_full))
        });
        let finalizer = finalizer.map_err(|e| crate::driver::could_not_start(&writer, &closers, e))?;
        let mut ctx = Ctx {
            p: &p,
            machine: decide::Receiver::new(decide::Window { bytes: p.window_bytes, files: p.window_files, held: p.window_held.min(p.window_files) }, p.options.chunk_size),
            stashed: HashMap::new(),
            writer: &writer,
            layout: None,
            root: None,
            dirs: None,
            store: None,
            fresh_dirs: HashSet::new(),
            refused_dirs: HashSet::new(),
            sinks: sinks.clone(),
            finalize: fin_tx,
            done_ids: Vec::new(),
            symlinks: Vec::new(),
            hard_links: Vec::new(),
            hard_links_possible: p.options.hard_links(),
            failed_files: HashSet::new(),
            dir_meta: Vec::new(),
            keep: HashSet::new(),
            announced: 0,
            source_errors: false,
            summary: Summary::default(),
            repair: Repair { resets, reopen, events: events.clone(), next_index: crate::driver::sender::REPLACEMENT_INDEX, corrupted: 0, verified_bytes: 0 },
        };
        let result = main_loop(&mut ctx, &rx, &mut |conn| spawn_worker(conn, &mut closers));
        let renamed_late = std::cell::RefCell::new(Vec::new());
        let result = result.map_err(|e| {
            crate::net::control::prefer_peer_fatal(e, &rx, |ev| match ev {
                Event::Ctrl(Control::Fatal { side, message }) => crate::net::control::Said::Fatal(TransferError::fatal(side, message)),
                Event::CtrlFailed(_) => crate::net::control::Said::Gone,
                Event::Finalized { id } => {
                    renamed_late.borrow_mut().push(id);
                    crate::net::control::Said::Other
                }
                _ => crate::net::control::Said::Other,
            })
        });
        ending.store(true, Relaxed);
        if let Err(e) = &result
            && e.scope == crate::error::Scope::Fatal
        {
            let _ = writer.send(&Control::Fatal { side: e.side, message: e.message_with_path() });
        }
        for c in &closers {
            c.close();
        }
        if result.is_err() {
            // Files the finalizer renamed into place after the session failed did land
            // (verified, durable): count them, so a resumed run does not call them skipped.
            ctx.finalize = unbounded().0;
            let _ = finalizer.join();
            let mut late = renamed_late.into_inner();
            late.extend(rx.try_iter().filter_map(|ev| if let Event::Finalized { id } = ev { Some(id) } else { None }));
            for id in late {
                ctx.machine.finalized(id);
            }
            // Only the landings count now; nothing more is sent.
            while let Some(a) = ctx.machine.poll_action() {
                if let Action::Done { payload, outcome: Outcome::Landed, .. } = a {
                    landed(&mut ctx, &payload);
                }
            }
        } else {
            drop(ctx);
            let _ = finalizer.join();
        }
        result
    }
}

impl TransferError {
    /// The message including the path, for sending to the peer as one string.
    pub fn message_with_path(&self) -> String {
        match &self.path {
            Some(p) => format!("{p}: {}", self.message),
            None => self.message.clone(),
        }
    }
}

fn main_loop(ctx: &mut Ctx, rx: &Receiver<Event>, spawn: &mut dyn FnMut(DataConn) -> Result<(), TransferError>) -> Result<Summary, TransferError> {
    loop {
        let ev = match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(ev) => Some(ev),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return Err(TransferError::network("receiver: event channel closed")),
        };
        if let Some(ev) = ev {
            handle(ctx, ev, spawn)?;
            // Drain what else is queued before sending batched answers.
            while let Ok(ev) = rx.try_recv() {
                handle(ctx, ev, spawn)?;
            }
        }
        drive(ctx)?;
        if !ctx.done_ids.is_empty() {
            // A message carries at most MAX_LIST ids; a large window can finish more at once.
            for ids in std::mem::take(&mut ctx.done_ids).chunks(tern_proto::limits::MAX_LIST) {
                ctx.writer.send(&Control::FileDone(ids.to_vec()))?;
            }
        }
        if ctx.machine.is_finished() {
            let (files, held) = ctx.machine.peak();
            tracing::debug!(
                "files in flight: at most {files} at once, {held} of them holding descriptors (window {} files, {} holding; descriptor limit {})",
                ctx.p.window_files,
                ctx.p.window_held,
                descriptor_limit()
            );
            finish(ctx)?;
            ctx.writer.send(&Control::Summary(ctx.summary))?;
            return await_bye(ctx, rx);
        }
    }
}

/// The work is done and reported. The sender's `Bye` confirms it saw the summary: only then is
/// the resume marker removed, so a reconnect before that still resumes into the same place.
fn await_bye(ctx: &mut Ctx, rx: &Receiver<Event>) -> Result<Summary, TransferError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(Event::Ctrl(Control::Bye)) => {
                // Only a copy that completed drops the marker: after any error (a file that
                // failed, a special file or a link left out with an error, a directory that could
                // not be made) the same command again resumes here, never into a nested copy.
                if ctx.summary.files_failed == 0
                    && !ctx.p.progress.any_error()
                    && let Some(m) = ctx.layout.as_ref().and_then(|l| l.marker.as_ref())
                    && let Some(Ok(dir)) = ctx.root.as_ref().map(|r| r.dir(b""))
                {
                    let _ = fsops::unlink_at(&dir, m);
                }
                let _ = ctx.writer.send(&Control::Bye);
                return Ok(ctx.summary);
            }
            Ok(Event::CtrlFailed(_)) | Err(_) => break,
            Ok(_) => {} // streams closing, late duplicates: nothing left to do
        }
    }
    Ok(ctx.summary)
}

fn handle(ctx: &mut Ctx, ev: Event, spawn: &mut dyn FnMut(DataConn) -> Result<(), TransferError>) -> Result<(), TransferError> {
    match ev {
        Event::NewStream(conn) => spawn(conn)?,
        Event::CtrlFailed(e) | Event::StreamFailed(e) => return Err(e),
        Event::StreamCorrupt { index, seq, why, skipped } => stream_corrupt(ctx, index, seq, why, skipped)?,
        Event::Ctrl(msg) => match msg {
            Control::Resending { chunks, bytes, .. } if ctx.repair.resets => {
                ctx.summary.chunks_resent += chunks;
                ctx.summary.bytes_resent += bytes;
                Progress::add(&ctx.p.progress.chunks_resent, chunks);
                Progress::add(&ctx.p.progress.bytes_resent, bytes);
            }
            Control::Entries(entries) => {
                for e in entries {
                    entry(ctx, e)?;
                }
            }
            Control::ManifestEnd { .. } => ctx.machine.manifest_end(),
            Control::FileEnd { id, file_hash, size, mtime_s, mtime_ns } => {
                if ctx.machine.file_end(id, file_hash, size, (mtime_s, mtime_ns)).is_err() && id >= ctx.announced {
                    return Err(peer_bug("file end for an unknown file"));
                }
            }
            Control::FileError { id, side, message } => {
                if side == Side::Source {
                    ctx.source_errors = true;
                }
                let path = ctx.machine.payload(id).map(|f| ctx.root.as_ref().map(|r| r.display(&f.rel)).unwrap_or_default());
                ctx.p.progress.error(TransferError::new(side, crate::error::Scope::File, path, message.clone()));
                ctx.machine.peer_failed(id, side, message);
            }
            Control::Fatal { side, message } => return Err(TransferError::fatal(side, message)),
            Control::Bye => return Err(TransferError::network("the sender ended the session early")),
            _ => return Err(peer_bug("unexpected message for the receiving side")),
        },
        Event::ChunkOk { id, index, hash, len, whole } => {
            Progress::add(&ctx.p.progress.bytes, len as u64);
            ctx.repair.verified_bytes += len as u64;
            // A chunk of a file already done (a late duplicate) changes nothing.
            if ctx.machine.chunk_stored(id, index, hash, whole) == Err(Refused::ChunkOutOfRange) {
                return Err(peer_bug("chunk index out of range"));
            }
        }
        Event::ChunkBad { id, index } => ctx.machine.chunk_corrupt(id, index),
        Event::WriteFailed { id, error, what } => {
            let display = ctx.machine.payload(id).map(|f| ctx.root.as_ref().unwrap().display(&f.rel)).unwrap_or_default();
            let e = TransferError::io(Side::Destination, display, what, &error);
            let (trouble, message) = (trouble(e.kind), e.message.clone());
            ctx.stashed.insert(id, e);
            ctx.machine.write_failed(id, trouble, message);
        }
        Event::Finalized { id } => {
            ctx.sinks.write().unwrap().remove(&id);
            ctx.done_ids.push(id);
            ctx.machine.finalized(id);
        }
        Event::FinalizeFailed { id, kind, message } => {
            ctx.sinks.write().unwrap().remove(&id);
            ctx.machine.finalize_failed(id, trouble(kind), message);
        }
    }
    Ok(())
}

/// The kind of a failure, as far as the decisions go.
fn trouble(kind: ErrorKind) -> Trouble {
    match kind {
        ErrorKind::NoSpace => Trouble::NoSpace,
        ErrorKind::ResourceLimit => Trouble::ResourceLimit,
        ErrorKind::WholeFileMismatch => Trouble::WholeFileMismatch,
        _ => Trouble::Other,
    }
}

/// Frame `seq` of stream `index` failed authentication (`Event::StreamCorrupt`). `skipped`: the
/// worker skipped it and reads on; the sender sends that chunk again. Otherwise the stream lost
/// its framing and the worker closed it after `seq` frames: the sender sends again what it had
/// in flight there, and the client opens a replacement. Beyond the budget the session ends.
fn stream_corrupt(ctx: &mut Ctx, index: u32, seq: u64, why: String, skipped: bool) -> Result<(), TransferError> {
    let r = &mut ctx.repair;
    r.corrupted += 1;
    if r.corrupted > RESET_BUDGET + r.verified_bytes / RESET_PER_BYTES {
        return Err(TransferError::fatal(
            Side::Network,
            format!(
                "data streams keep failing authentication: {} corrupted records in {} MiB verified (the last: data stream {index} {why}); an attacker is injecting data or the path corrupts faster than TCP's checksum catches; refusing",
                r.corrupted,
                r.verified_bytes >> 20
            ),
        ));
    }
    if skipped {
        tracing::info!("data stream {index}: frame {seq} {why}; skipped, and asked for again");
        return ctx.writer.send(&Control::RecordBad { index, seq });
    }
    tracing::info!("data stream {index} {why}; resetting it and having its chunks in flight sent again");
    let _ = ctx.p.progress.streams.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
    ctx.writer.send(&Control::StreamReset { index, received: seq })?;
    if let Some(reopen) = r.reopen.clone() {
        let (i, events) = (r.next_index, r.events.clone());
        r.next_index += 1;
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
            tracing::warn!("data stream {i} not replaced: {}", err_text(&e));
        }
    }
    Ok(())
}

fn peer_bug(what: &str) -> TransferError {
    TransferError::fatal(Side::Network, format!("protocol error from the sender: {what}"))
}

/// Executes what the decisions ask for until they wait for the next event.
fn drive(ctx: &mut Ctx) -> Result<(), TransferError> {
    while let Some(action) = ctx.machine.poll_action() {
        match action {
            Action::Prepare { id, start_over } => match prepare(ctx, id, start_over) {
                Ok(Prepared { resumed, sealed: true }) => ctx.machine.prepared_sealed(id, resumed),
                Ok(Prepared { resumed, sealed: false }) => ctx.machine.prepared(id, resumed),
                Err(err) => {
                    let (trouble, message) = (trouble(err.kind), err.message.clone());
                    ctx.stashed.insert(id, err);
                    ctx.machine.prepare_failed(id, trouble, message);
                }
            },
            Action::Want(files) => {
                // Each setup that succeeded cleared the stash of its earlier attempts' errors.
                for f in &files {
                    ctx.stashed.remove(&f.id);
                }
                ctx.writer.send(&Control::Want(files))?;
            }
            Action::AskAgain { id, chunk } => {
                let len = ctx.machine.payload(id).map_or(0, |f| chunk_range(f.entry.size, ctx.p.options.chunk_size, chunk).1 as u64);
                Progress::add(&ctx.p.progress.chunks_resent, 1);
                Progress::add(&ctx.p.progress.bytes_resent, len);
                ctx.summary.chunks_resent += 1;
                ctx.summary.bytes_resent += len;
                ctx.writer.send(&Control::ChunkBad { id, chunk })?;
            }
            Action::Finalize { id, file_hash, more_coming } => {
                let file = ctx.sinks.read().unwrap().get(&id).cloned().expect("a receiving file has its part");
                let _ = ctx.finalize.send(ToFinalize { id, file, store: posix_sink(ctx), expected: file_hash, more_coming });
            }
            Action::StripeVerified { id, first, end, stripe_hash } => {
                // The part and journal stay, shared with the file's other stripes. Its data made
                // durable and the stripe sealed, the session that publishes the file trusts these
                // chunks without reading them back (docs/journal.md "Seals"); a seal that cannot
                // be written costs only that read.
                if let Some(sink) = ctx.sinks.write().unwrap().remove(&id) {
                    seal_stripe(&sink, first, end, &stripe_hash, !ctx.p.options.fsync_none());
                }
                ctx.done_ids.push(id);
                ctx.machine.finalized(id);
            }
            Action::Abandon { id } => {
                // Throw the partial state away before the file starts over.
                if let Some(file) = ctx.sinks.write().unwrap().remove(&id) {
                    let _ = file.part.abandon();
                }
            }
            Action::Done { id, payload, outcome } => {
                ctx.sinks.write().unwrap().remove(&id);
                let stashed = ctx.stashed.remove(&id);
                match outcome {
                    Outcome::Landed => landed(ctx, &payload),
                    Outcome::Failed { side, message, tell_peer } => {
                        if tell_peer {
                            let display = ctx.root.as_ref().unwrap().display(&payload.rel);
                            let err = stashed.unwrap_or_else(|| TransferError::new(side, crate::error::Scope::File, Some(display), message.clone()));
                            ctx.writer.send(&Control::FileError { id, side, message })?;
                            ctx.p.progress.error(err);
                        }
                        count_failed(ctx, &payload.rel);
                    }
                }
            }
            Action::Wait(pause) => thread::sleep(pause),
            Action::Throttled { files, window } => {
                tracing::warn!("out of descriptors or memory; holding fewer files open at once ({files} instead of up to {window}) and going on");
            }
            Action::Stop { side, trouble: t, message } => {
                let kind = if t == Trouble::NoSpace { ErrorKind::NoSpace } else { ErrorKind::Other };
                // The file's own error, with its path, where this side produced one.
                let id = ctx.stashed.iter().find(|(_, e)| e.kind == kind).map(|(id, _)| *id);
                let err = id.and_then(|id| ctx.stashed.remove(&id)).map(|e| e.into_fatal()).unwrap_or_else(|| TransferError::fatal(side, message).with_kind(kind));
                return Err(err);
            }
        }
    }
    Ok(())
}

/// A file verified, durable and under its final name.
fn landed(ctx: &mut Ctx, f: &FileInfo) {
    if let Some((start, end)) = f.entry.stripe {
        // Verified but not published: its bytes count, the file lands with its last session.
        Progress::add(&ctx.p.progress.bytes_of_finished, end - start);
        ctx.summary.bytes_written += end - start;
        return;
    }
    ctx.p.progress.landed(&f.entry.path, f.entry.size);
    ctx.summary.files_done += 1;
    ctx.summary.bytes_written += f.entry.size;
}

/// A file of this session that failed (its error already reported).
fn count_failed(ctx: &mut Ctx, rel: &[u8]) {
    Progress::add(&ctx.p.progress.files_failed, 1);
    ctx.summary.files_failed += 1;
    if ctx.hard_links_possible {
        // A hard link to it is not made, so it never names an older version left there.
        ctx.failed_files.insert(rel.to_vec());
    }
}

/// Directory `rel` (created if missing), from the cache: bounded by the descriptor limit, a wide
/// tree never holds one descriptor per directory.
fn dir_fd(ctx: &mut Ctx, rel: &[u8]) -> std::io::Result<Arc<Dir>> {
    let dirs = ctx.dirs.clone().expect("the destination root is open");
    match dirs.get(rel) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            if ctx.root.as_ref().unwrap().mkdir_all(rel)? {
                ctx.fresh_dirs.insert(rel.to_vec());
            }
            dirs.get(rel)
        }
        r => r,
    }
}

/// Why an entry may not land at `rel`, if it may not: its name is in tern's own namespace in
/// that directory (fsops::Tag), or its parent was refused.
fn refusal(ctx: &mut Ctx, rel: &[u8]) -> Option<String> {
    if rel.is_empty() {
        return None;
    }
    if ctx.refused_dirs.contains(parent(rel)) {
        return Some("its directory was refused; see the error above".into());
    }
    let dir = dir_fd(ctx, parent(rel)).ok()?;
    dir.tag.reserves(file_name(rel)).then(|| "this name is reserved for tern's own temporary files in this directory; rename the source file and re-run".into())
}

/// An entry's path relative to the copied tree's top (the source's own name is its first
/// component when one was named), for judging a link against the tree as rsync does.
fn e_path_in_tree(ctx: &Ctx, path: &[u8]) -> Vec<u8> {
    match &ctx.layout.as_ref().unwrap().mapping {
        layout::Mapping::Strip { base, .. } if path.starts_with(base) => path[base.len()..].strip_prefix(b"/").unwrap_or(b"").to_vec(),
        _ => path.to_vec(),
    }
}

/// Decides where entries land (from the first of them) and opens the destination root.
fn init_layout(ctx: &mut Ctx, first: &Entry) -> Result<(), TransferError> {
    let p = ctx.p;
    let beneath = p.beneath.as_deref();
    let l = layout::decide(beneath, &p.destination, p.options.contents(), p.multi_source, first, p.options.dry_run())?;
    match DestRoot::open(beneath, &l.root).and_then(|r| Ok((r.try_clone()?, r))) {
        Ok((for_dirs, r)) => {
            ctx.root = Some(r);
            // The receiver's directory descriptors, shared by the main loop, the stream workers,
            // the finalizer and the store (`posix_sink`).
            let dirs = Arc::new(DirCache::new(for_dirs, dir_cache_size()));
            let write_behind = !p.options.fsync_none() && !crate::faults::faults().no_write_behind;
            let links_beneath = p.beneath.clone().filter(|_| !p.allow_links_out);
            ctx.store = Some(Arc::new(PosixSink::sharing(dirs.clone(), links_beneath).with_write_behind(write_behind)));
            ctx.dirs = Some(dirs);
        }
        // A dry run to a destination that does not exist yet: nothing there to compare.
        Err(err) if p.options.dry_run() && err.raw_os_error() == Some(libc::ENOENT) => {}
        Err(err) => return Err(TransferError::io(Side::Destination, l.root.display().to_string(), "cannot open", &err).into_fatal()),
    }
    if l.created_root {
        ctx.fresh_dirs.insert(Vec::new());
    }
    ctx.layout = Some(l);
    Ok(())
}

fn entry(ctx: &mut Ctx, e: Entry) -> Result<(), TransferError> {
    let p = ctx.p;
    if ctx.layout.is_none() {
        init_layout(ctx, &e)?;
    }
    let Some(rel) = ctx.layout.as_ref().unwrap().map(&e.path) else {
        return Err(peer_bug("entry outside the announced source"));
    };
    if p.options.delete() {
        ctx.keep.insert(rel.clone());
    }
    ctx.announced = ctx.announced.max(e.id + 1);
    let display = match &ctx.root {
        Some(r) => r.display(&rel),
        None => ctx.layout.as_ref().unwrap().root.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&rel)).display().to_string(),
    };
    // A file an earlier attempt of this run landed is announced again by a pull's new remote
    // sender: its bytes count again (this attempt's total), the file is already counted done.
    let landed_before = e.kind == EntryKind::File && p.progress.landed_before(&e.path);
    if e.kind == EntryKind::File {
        if !landed_before {
            Progress::add(&p.progress.files_total, 1);
        }
        Progress::add(&p.progress.bytes_total, e.size);
    }
    if p.options.dry_run() {
        return plan_entry(ctx, e, rel);
    }
    if let Some(why) = refusal(ctx, &rel) {
        if e.kind == EntryKind::Dir {
            ctx.refused_dirs.insert(rel.clone());
        }
        let err = TransferError::file(Side::Destination, display, why);
        ctx.writer.send(&Control::FileError { id: e.id, side: Side::Destination, message: err.message.clone() })?;
        ctx.p.progress.error(err);
        ctx.summary.files_failed += 1;
        Progress::add(&ctx.p.progress.files_failed, 1);
        if e.kind == EntryKind::File {
            // Counted, never asked for: the sender learns it from the FileError.
        }
        return Ok(());
    }
    match e.kind {
        EntryKind::Dir => {
            let made = ctx.root.as_ref().unwrap().mkdir_all(&rel);
            if let Ok(true) = made {
                ctx.fresh_dirs.insert(rel.clone());
            }
            if let Err(err) = made {
                let err = TransferError::io(Side::Destination, display, "cannot create directory", &err);
                ctx.writer.send(&Control::FileError { id: e.id, side: Side::Destination, message: err.message.clone() })?;
                ctx.p.progress.error(err);
                ctx.source_errors = true;
            } else if p.options.preserve() {
                ctx.dir_meta.push((rel, e.mode, e.mtime_s, e.mtime_ns));
            }
        }
        EntryKind::HardLink => {
            if !p.options.hard_links() {
                return Err(peer_bug("a hard link without option bit 14"));
            }
            match ctx.layout.as_ref().unwrap().map(&e.target) {
                Some(target) if !target.is_empty() => ctx.hard_links.push(Entry { path: rel, target, ..e }),
                _ => {
                    let err = TransferError::file(Side::Destination, display, "hard link to a file outside the copied tree; refused");
                    ctx.writer.send(&Control::FileError { id: e.id, side: Side::Destination, message: err.message.clone() })?;
                    ctx.p.progress.error(err);
                }
            }
        }
        EntryKind::Symlink => {
            let target = String::from_utf8_lossy(&e.target).into_owned();
            if p.options.safe_links() && !symlink_stays_inside(&e_path_in_tree(ctx, &e.path), &e.target) {
                // rsync's --safe-links: such links are left out, said once each, not an error.
                ctx.p.progress.notice(format!("{display}: symlink to '{target}' points outside the copied tree; skipped (--safe-links)"));
            } else {
                ctx.symlinks.push(Entry { path: rel, ..e });
            }
        }
        EntryKind::File => {
            let id = e.id;
            let stripe = match e.stripe.map(|(start, end)| tern_proto::chunk::stripe_chunks(start, end, e.size, p.options.chunk_size)) {
                None => None,
                Some(Ok(Some(chunks))) => Some(chunks),
                // Anything but whole chunks of a part of the file would make this session write
                // another stripe's chunks or publish a stripe as the file.
                Some(_) => return Err(peer_bug("a stripe not aligned to chunks, or the whole file")),
            };
            let skip = match identical(ctx, &rel, &e) {
                Ok(s) => s,
                Err(err) => {
                    ctx.writer.send(&Control::FileError { id, side: Side::Destination, message: err.message.clone() })?;
                    ctx.p.progress.error(err);
                    count_failed(ctx, &rel);
                    return Ok(());
                }
            };
            let size = e.size;
            if skip {
                ctx.writer.send(&Control::Skip(vec![(id, SkipReason::Identical)]))?;
                Progress::add(&ctx.p.progress.bytes_skipped, size);
                if !landed_before {
                    Progress::add(&ctx.p.progress.files_skipped, 1);
                    Progress::add(&ctx.p.progress.bytes_of_finished, size);
                }
            } else {
                ctx.machine.announce(FileSpec { id, size, mtime: (e.mtime_s, e.mtime_ns), stripe }, FileInfo { entry: e, rel });
            }
        }
    }
    Ok(())
}

/// Whether the destination already holds this file (size and mtime, or content hash; with
/// `--ignore-existing`, any file of that name).
fn identical(ctx: &mut Ctx, rel: &[u8], e: &Entry) -> Result<bool, TransferError> {
    if ctx.fresh_dirs.contains(parent(rel)) {
        return Ok(false);
    }
    let display = ctx.root.as_ref().unwrap().display(rel);
    // Created if missing (and then known to hold nothing), as `prepare` would.
    dir_fd(ctx, parent(rel)).map_err(|err| TransferError::io(Side::Destination, display.clone(), "cannot open the directory", &err))?;
    let sink = posix_sink(ctx);
    let Some(st) = sink.stat(rel).map_err(|err| err.to_transfer(Side::Destination, display.clone(), "cannot stat"))? else {
        return Ok(false);
    };
    if st.kind == store::EntryType::Dir {
        return Err(TransferError::file(Side::Destination, display, "a directory stands where this file should go; move it away and re-run"));
    }
    if ctx.p.options.ignore_existing() {
        return Ok(true);
    }
    if st.kind != store::EntryType::File || st.size != e.size {
        return Ok(false);
    }
    if let Some(want) = e.hash.filter(|_| ctx.p.options.checksum()) {
        let have = sink.hash_file(rel, e.size, ctx.p.options.chunk_size).map_err(|err| err.to_transfer(Side::Destination, display, "cannot read"))?;
        return Ok(have == want);
    }
    Ok(st.mtime == (e.mtime_s, e.mtime_ns))
}

fn plan_entry(ctx: &mut Ctx, e: Entry, rel: Vec<u8>) -> Result<(), TransferError> {
    if e.kind != EntryKind::File {
        return Ok(());
    }
    // Only where the directory already exists: a dry run creates nothing.
    let same = ctx.root.as_ref().is_some_and(|r| r.dir(parent(&rel)).is_ok()) && identical(ctx, &rel, &e).unwrap_or(false);
    let action = if same { PlanAction::Skip } else { PlanAction::Copy };
    plan(ctx, action, rel)?;
    ctx.writer.send(&Control::Skip(vec![(e.id, SkipReason::DryRun)]))?;
    Ok(())
}

/// A dry-run line: to the sender, which shows it when it is the client, and to our own
/// progress, shown when we are (a pull; in a local copy ours is not displayed).
fn plan(ctx: &Ctx, action: PlanAction, path: Vec<u8>) -> Result<(), TransferError> {
    let verb = match action {
        PlanAction::Copy => "copy",
        PlanAction::Skip => "skip",
        PlanAction::Delete => "delete",
    };
    ctx.p.progress.plan.lock().unwrap().push(format!("{verb} {}", String::from_utf8_lossy(&path)));
    ctx.writer.send(&Control::Plan { action, path })
}

/// What the store proves it holds of a file being set up.
struct Prepared {
    /// Chunks its journal claims whose data is there (re-hashed, or sealed).
    resumed: Vec<(u64, [u8; 32])>,
    /// Every chunk of the (whole) file is sealed: verified against the source and durable.
    sealed: bool,
}

/// Makes a verified stripe's data durable and seals it in the shared journal (`durable`
/// false: `--fsync none`, nothing to seal). Write-behind started each chunk's writeback as it
/// landed, so the flush waits only for the tail. Nothing here fails the stripe: without a
/// seal, the publishing session re-reads its chunks instead of trusting them.
fn seal_stripe(file: &InFlight, first: u64, end: u64, stripe_hash: &[u8; 32], durable: bool) {
    if !durable {
        return;
    }
    if let Err(e) = file.part.seal(first, end, stripe_hash) {
        tracing::debug!("stripe {first}..{end} not sealed: {}", e.described());
    }
}

/// Sets up the part of a file (`PosixSink::open_part`) and says which chunks its journal
/// proves are already here. `start_over`: the file's earlier data did not add up to the
/// source's; discard it.
fn prepare(ctx: &mut Ctx, id: u64, start_over: bool) -> Result<Prepared, TransferError> {
    crate::faults::faults().preparing_file();
    let chunk_size = ctx.p.options.chunk_size;
    let (rel, e) = {
        let f = ctx.machine.payload(id).expect("a file being prepared is held");
        (f.rel.clone(), f.entry.clone())
    };
    let display = ctx.root.as_ref().unwrap().display(&rel);
    // Created if missing (and then known to hold nothing).
    dir_fd(ctx, parent(&rel)).map_err(|err| TransferError::io(Side::Destination, display.clone(), "cannot open the directory", &err))?;
    // A stripe's chunks (checked at `entry`); empty: the whole file.
    let stripe = e.stripe.map(|(start, end)| tern_proto::chunk::stripe_chunks(start, end, e.size, chunk_size).ok().flatten().expect("entry() admits only stripes"));
    let spec = store::PartSpec {
        size: e.size,
        mtime: (e.mtime_s, e.mtime_ns),
        chunk_size,
        resume: !start_over,
        stripe,
        // A retry's earlier attempt is in that directory, whenever it was made.
        fresh_dir: stripe.is_none() && !start_over && ctx.fresh_dirs.contains(parent(&rel)),
    };
    let (part, resume) = posix_sink(ctx).open_part(&rel, &spec).map_err(|err| err.to_transfer(Side::Destination, display, "cannot set up the partial file"))?;
    let reused: u64 = resume.chunks.iter().map(|&(index, _)| u64::from(chunk_range(e.size, chunk_size, index).1)).sum();
    if reused > 0 {
        Progress::add(&ctx.p.progress.bytes_skipped, reused);
    }
    let chunks = chunk_count(e.size, chunk_size);
    let stripe = stripe.map_or(0..0, |(first, end)| first..end);
    let preserve = ctx.p.options.preserve();
    let file = Arc::new(InFlight {
        part,
        size: e.size,
        chunks,
        meta: store::Meta { mode: preserve.then_some(e.mode), mtime: preserve.then_some((e.mtime_s, e.mtime_ns)) },
        meta_late: ctx.p.options.verify_full(),
        claimed: InFlight::claimed_bits(chunks, &resume.chunks, stripe.clone()),
        stripe,
    });
    ctx.sinks.write().unwrap().insert(id, file);
    Ok(Prepared { resumed: resume.chunks, sealed: resume.sealed })
}

/// After every file: hard links, symlinks, directory metadata, `--delete`, the resume marker.
fn finish(ctx: &mut Ctx) -> Result<(), TransferError> {
    // An empty source's contents (`sync EMPTY/ DST`): nothing named the layout, but DST is
    // still made (as rsync does) and a mirror with --delete still has something to compare.
    if ctx.layout.is_none() && ctx.p.options.contents() {
        let root_entry = Entry { id: 0, kind: EntryKind::Dir, path: Vec::new(), size: 0, mode: 0o755, mtime_s: 0, mtime_ns: 0, target: Vec::new(), hash: None, stripe: None };
        init_layout(ctx, &root_entry)?;
    }
    if ctx.p.options.dry_run() {
        if ctx.p.options.delete()
            && let Some(l) = &ctx.layout
            && l.mirror
            && ctx.root.is_some()
        {
            let sink = posix_sink(ctx);
            for rel in store::extras(&*sink, &ctx.keep, &ctx.p.filter) {
                plan(ctx, PlanAction::Delete, rel)?;
            }
        }
        return Ok(());
    }
    let Some(root) = ctx.root.as_ref() else { return Ok(()) };
    let sink = posix_sink(ctx);
    // `link.path` becomes another name of `link.target` (a regular file beneath the root), or a
    // copy of it where the file system cannot link (`Sink::hard_link`).
    for link in std::mem::take(&mut ctx.hard_links) {
        let display = sink.display(&link.path);
        let r = if ctx.failed_files.contains(&link.target) {
            let e = std::io::Error::other(format!("'{}', its first name, did not land", String::from_utf8_lossy(&link.target)));
            Err(TransferError::io(Side::Destination, display, "cannot create hard link", &e))
        } else {
            sink.hard_link(&link.path, &link.target, ctx.p.options.preserve()).map_err(|e| e.to_transfer(Side::Destination, display, "cannot create hard link"))
        };
        if let Err(err) = r {
            ctx.writer.send(&Control::FileError { id: link.id, side: Side::Destination, message: err.message.clone() })?;
            ctx.p.progress.error(err);
        }
    }
    for link in std::mem::take(&mut ctx.symlinks) {
        let mtime = ctx.p.options.preserve().then_some((link.mtime_s, link.mtime_ns));
        if let Err(e) = sink.symlink(&link.path, &link.target, mtime) {
            let err = e.to_transfer(Side::Destination, sink.display(&link.path), "cannot create symlink");
            ctx.writer.send(&Control::FileError { id: link.id, side: Side::Destination, message: err.message.clone() })?;
            ctx.p.progress.error(err);
        }
    }
    // Deepest first, so setting a child's mtime does not disturb its parent's.
    ctx.dir_meta.sort_by_key(|(rel, ..)| std::cmp::Reverse(rel.iter().filter(|&&b| b == b'/').count() + usize::from(!rel.is_empty())));
    for (rel, mode, s, ns) in std::mem::take(&mut ctx.dir_meta) {
        if let Err(e) = sink.set_dir_meta(&rel, &store::Meta { mode: Some(mode), mtime: Some((s, ns)) }) {
            ctx.p.progress.error(e.to_transfer(Side::Destination, sink.display(&rel), "cannot set directory metadata"));
        }
    }
    let l = ctx.layout.as_ref().unwrap();
    if ctx.p.options.delete() && l.mirror {
        let extra = store::extras(&*sink, &ctx.keep, &ctx.p.filter);
        if ctx.source_errors {
            ctx.p.progress.error(TransferError::fatal(Side::Source, "some source files could not be read, so --delete removed nothing (fix the errors and re-run)"));
        } else if ctx.keep.is_empty() && !extra.is_empty() && !ctx.p.options.delete_from_empty() {
            // An empty source mirrored with --delete empties the destination. That is rsync's
            // answer, and usually an unmounted file system or a typo: ask for it explicitly.
            // Fatal, so the client hears it (a receiver's own notes do not reach it).
            return Err(TransferError::fatal(
                Side::Source,
                format!(
                    "the source is empty, so --delete would remove all {} entries under {}; nothing was deleted (if that is what you want, add --delete-empty-source)",
                    extra.len(),
                    root.path().display()
                ),
            ));
        } else {
            for rel in extra {
                match sink.remove_tree(&rel) {
                    Ok(()) => {
                        ctx.summary.deleted += 1;
                        Progress::add(&ctx.p.progress.deleted, 1);
                    }
                    Err(e) => ctx.p.progress.error(e.to_transfer(Side::Destination, sink.display(&rel), "cannot delete")),
                }
            }
        }
    }
    Ok(())
}

/// The destination as a store (`store::PosixSink`), over the directory cache's handle of the
/// root and sharing the cache; links a daemon's client makes are held beneath its root unless
/// `serve --allow-links-out`; write-behind unless `--fsync none`.
fn posix_sink(ctx: &Ctx) -> Arc<PosixSink> {
    ctx.store.clone().expect("the destination root is open")
}

/// One data stream: read chunk frames, verify, write. Exits at end of stream.
/// `resets`: a record that fails authentication (or a malformed frame header) resets this stream
/// instead of failing the session.
fn recv_worker(
    mut conn: DataConn,
    sinks: Sinks,
    events: Sender<Event>,
    chunk_size: u32,
    ending: Arc<std::sync::atomic::AtomicBool>,
    resets: bool,
    rate: Option<Arc<crate::net::ratelimit::RateLimit>>,
) {
    let index = conn.index;
    let tag_key = conn.tag_key;
    let mut sealer = conn.sealer.take();
    let trailer = if sealer.is_some() { TAG_LEN } else { 0 };
    let mut r = BufReader::with_capacity(256 << 10, conn.stream);
    let mut buf = vec![0u8; ChunkHeader::LEN + chunk_size as usize + TAG_LEN];
    // Frames consumed: accepted, or skipped as bad. The sender numbers what it writes the same.
    let mut seq = 0u64;
    // The previous frame failed too: its length must have been wrong, so this one is misaligned.
    let mut last_bad = false;
    let fail = |msg: String| {
        if !ending.load(Relaxed) {
            let _ = events.send(Event::StreamFailed(TransferError::network(format!("data stream {index}: {msg}"))));
        }
    };
    // Past a malformed header or a misaligned skip nothing can be framed: stop reading, close,
    // report (the stream is reset after `seq` frames).
    let corrupt = |seq: u64, why: &str, fatal_msg: String| {
        if resets {
            conn.closer.close();
            let _ = events.send(Event::StreamCorrupt { index, seq, why: why.to_string(), skipped: false });
        } else {
            fatal(&events, fatal_msg);
        }
    };
    // A failed record whose frame looked right: skip it (nothing in it is used) and read on.
    let skip = |seq: u64, why: &str| {
        let _ = events.send(Event::StreamCorrupt { index, seq, why: why.to_string(), skipped: true });
    };
    loop {
        let mut head = [0u8; HEADER_LEN];
        match r.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                fail("the peer closed the connection".into());
                return;
            }
            Err(e) => return fail(err_text(&e)),
        }
        let frame = FrameHeader::parse(head, tern_proto::data::max_data_frame(chunk_size));
        let len = match frame.and_then(|f| chunk_data_len(f, chunk_size, trailer)) {
            Ok(n) => n,
            Err(e) => return corrupt(seq, &format!("sent a malformed frame header ({e})"), format!("protocol error on data stream {index}: {e}")),
        };
        let body = &mut buf[..ChunkHeader::LEN + len + trailer];
        if let Err(e) = r.read_exact(body) {
            return fail(err_text(&e));
        }
        if let Some(rate) = &rate {
            rate.take(len);
        }
        if let Some(s) = sealer.as_mut()
            && !s.open(&head, body)
        {
            const WHY: &str = "failed decryption (corrupted, injected or reordered data)";
            if resets && !last_bad {
                // The sealer's counter moved on with the sender's: the next record opens.
                skip(seq, WHY);
                (seq, last_bad) = (seq + 1, true);
                continue;
            }
            return corrupt(seq, WHY, format!("data stream {index} failed decryption (corrupted, injected or reordered data); refusing it"));
        }
        let h = ChunkHeader::decode(body[..ChunkHeader::LEN].try_into().unwrap());
        if let Some(key) = &tag_key
            && !tern_proto::auth::proofs_equal(&h.compute_tag(key, seq), &h.tag)
        {
            const WHY: &str = "failed authentication (corrupted, injected or reordered data)";
            if resets && !last_bad {
                skip(seq, WHY);
                (seq, last_bad) = (seq + 1, true);
                continue;
            }
            return corrupt(seq, WHY, format!("data stream {index} failed authentication (injected or reordered data); refusing it"));
        }
        seq += 1;
        last_bad = false;
        let data = &mut body[ChunkHeader::LEN..ChunkHeader::LEN + len];
        let hash = chunk_hash(data);
        if hash != h.hash {
            let _ = events.send(Event::ChunkBad { id: h.file_id, index: h.index });
            continue;
        }
        let Some(sink) = sinks.read().unwrap().get(&h.file_id).cloned() else {
            return fatal(&events, format!("data stream {index}: chunk for a file that was not requested"));
        };
        let (off, want_len) = chunk_range(sink.size, chunk_size, h.index);
        if h.index >= sink.chunks || off != h.offset || want_len as usize != len {
            return fatal(&events, format!("data stream {index}: chunk {} does not fit its file", h.index));
        }
        if !sink.stripe.is_empty() && !sink.stripe.contains(&h.index) {
            return fatal(&events, format!("protocol error from the sender: data stream {index}: chunk {} is outside the stripe it announced", h.index));
        }
        if !sink.claim(h.index) {
            continue; // a second copy (a peer resending a frame already taken): keep the first
        }
        let whole = h.flags & FLAG_WHOLE_FILE != 0;
        let written = if sink.single() {
            // Opened, written and closed now: a one-chunk file holds no descriptor in flight.
            sink.part.write_whole(data, (!sink.meta_late).then_some(&sink.meta))
        } else {
            // The temporary is opened by the file's first chunk and kept; zero blocks of a new
            // file stay holes; the finalizer sets the length.
            sink.part.write_at(off, data).and_then(|()| sink.part.record_chunk(h.index, &hash))
        };
        match written {
            Ok(()) => {
                let _ = events.send(Event::ChunkOk { id: h.file_id, index: h.index, hash, len: len as u32, whole });
            }
            Err(e) => {
                let what = e.what.unwrap_or("write failed");
                let _ = events.send(Event::WriteFailed { id: h.file_id, error: e.into(), what });
            }
        }
    }
}

fn fatal(events: &Sender<Event>, msg: String) {
    let _ = events.send(Event::StreamFailed(TransferError::fatal(Side::Network, msg)));
}

/// A file whose chunks all verified, for the finalizer.
struct ToFinalize {
    id: u64,
    file: Arc<InFlight>,
    /// The store it is written in, for the batch's barrier.
    store: Arc<PosixSink>,
    /// The whole-file hash its chunks add up to (already compared with the sender's).
    expected: [u8; 32],
    /// Other files were still arriving when this one was handed over. When none are, waiting to
    /// fill a batch only delays the last files (and on a WAN the session's end) by `MAX_WAIT`.
    more_coming: bool,
}

/// Makes verified files durable in batches, then publishes them (renames them into place).
fn finalizer(rx: Receiver<ToFinalize>, events: Sender<Event>, fsync: bool, verify_full: bool) {
    const MAX_FILES: usize = 512;
    const MAX_BYTES: u64 = 1 << 30;
    const MAX_WAIT: Duration = Duration::from_millis(50);
    const INLINE: usize = 32;
    let mut batch: Vec<(u64, Arc<InFlight>, [u8; 32])> = Vec::new();
    let mut store: Option<Arc<PosixSink>> = None;
    let mut bytes = 0u64;
    let mut first: Option<Instant> = None;
    let mut open = true;
    // Per file: a length and metadata update (a metadata round trip each on a parallel file
    // system) or, with --verify full, a whole re-read; then a rename. Side by side on up to 8
    // threads kept for the session; a batch of up to INLINE files runs on this thread.
    let mut workers = crate::threads::Pool::new("tern-finish", 8);
    while open || !batch.is_empty() {
        let timeout = first.map_or(Duration::from_secs(3600), |t| MAX_WAIT.saturating_sub(t.elapsed()));
        match rx.recv_timeout(if open { timeout } else { Duration::ZERO }) {
            Ok(ToFinalize { id, file, store: s, expected, more_coming }) => {
                bytes += file.size;
                batch.push((id, file, expected));
                store.get_or_insert(s);
                first.get_or_insert_with(Instant::now);
                let idle = !more_coming && rx.is_empty();
                if batch.len() < MAX_FILES && bytes < MAX_BYTES && first.is_some_and(|t| t.elapsed() < MAX_WAIT) && !idle {
                    continue;
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => open = false,
        }
        if batch.is_empty() {
            continue;
        }
        // The re-read comes between the length and the metadata (`finish_verified`).
        let failed = events.clone();
        let ready: Vec<(u64, Arc<InFlight>)> = workers
            .map(std::mem::take(&mut batch), INLINE, move |(id, file, expected)| match file.part.finish_verified(&file.meta, verify_full.then_some(&expected)) {
                Ok(()) => Some((id, file)),
                Err(e) => {
                    let _ = failed.send(Event::FinalizeFailed { id, kind: e.error_kind(), message: e.described() });
                    None
                }
            })
            .into_iter()
            .flatten()
            .collect();
        if fsync
            && !ready.is_empty()
            && let Some(store) = &store
        {
            // One barrier (syncfs) makes the whole batch durable before any of it is renamed
            // (closed one-chunk temporaries included: syncfs writes back the file system's dirty
            // data).
            let _ = store.barrier();
        }
        let published = events.clone();
        workers.map(ready, INLINE, move |(id, file)| match file.part.publish() {
            Ok(()) => {
                let _ = published.send(Event::Finalized { id });
            }
            Err(e) => {
                let _ = published.send(Event::FinalizeFailed { id, kind: e.error_kind(), message: e.described() });
            }
        });
        bytes = 0;
        first = None;
    }
}
