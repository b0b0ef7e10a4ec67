//! The sending side of a session: walk, announce, serve wanted chunks over every data stream.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::thread;

use crossbeam_channel::{Receiver, Sender, unbounded};
use tern_proto::chunk::{ChunkSet, chunk_count, chunk_range, file_hash, validate_ranges};
use tern_proto::data::{ChunkHeader, FLAG_WHOLE_FILE};
use tern_proto::filter::Filter;
use tern_proto::frame::HEADER_LEN;
use tern_proto::msg::{Summary, WantFile};
use tern_proto::{Control, Entry, EntryKind, Options};

use crate::control::{CtrlReader, CtrlWriter};
use crate::datastream::DataConn;
use crate::error::{Side, TransferError, err_text};
use crate::faults::{chunk_hash, faults};
use crate::progress::Progress;
use crate::ratelimit::RateLimit;
use crate::seal::TAG_LEN;
use crate::walk::{SourceSpec, SrcFile, walk, walk_list};

/// What the sending side remembers across reconnects within one run.
#[derive(Default)]
pub struct SendMemory {
    /// Manifest paths the receiver confirmed (done or identical): not announced again.
    pub finished: HashSet<Vec<u8>>,
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
}

struct Work {
    id: u64,
    chunk: u64,
    offset: u64,
    len: u32,
    whole: bool,
    hash_only: bool,
    file: Arc<SrcInfo>,
}

struct SrcInfo {
    path: PathBuf,
    rel: Vec<u8>,
    size: u64,
    mtime_s: i64,
    mtime_ns: u32,
}

enum Event {
    Files(Vec<SrcFile>),
    WalkDone(Result<(), TransferError>),
    WalkWarning(TransferError),
    Ctrl(Control),
    CtrlFailed(TransferError),
    Sent { id: u64, chunk: u64, hash: [u8; 32], len: u32, hash_only: bool },
    ReadFailed { id: u64, error: TransferError },
    StreamFailed(TransferError),
    NewStream(DataConn),
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum State {
    Announced,
    Active,
    Finished,
}

struct FileState {
    info: Arc<SrcInfo>,
    kind: EntryKind,
    chunks: u64,
    hashes: Vec<Option<[u8; 32]>>,
    outstanding: u64,
    end_sent: bool,
    state: State,
}

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
}

impl Default for Sending {
    fn default() -> Self {
        Self::new()
    }
}

impl Sending {
    pub fn new() -> Self {
        let (events, rx) = unbounded();
        Self { events, rx }
    }
    pub fn feed(&self) -> StreamFeed {
        StreamFeed(self.events.clone())
    }

    /// Runs the sending side to the end of the session. Returns the receiver's summary.
    pub fn run(self, reader: CtrlReader, writer: Arc<CtrlWriter>, streams: Vec<DataConn>, p: SenderParams) -> Result<Summary, TransferError> {
        let Sending { events, rx } = self;
        let chunk_size = p.options.chunk_size;
        let (work_tx, work_rx) = unbounded::<Work>();
        let mut closers = Vec::new();
        let mut workers = Vec::new();
        let spawn_worker = |conn: DataConn, closers: &mut Vec<_>, workers: &mut Vec<_>| {
            closers.push(conn.closer.clone());
            let (rx, ev, rate) = (work_rx.clone(), events.clone(), p.rate.clone());
            p.progress.streams.fetch_add(1, Relaxed);
            workers.push(thread::spawn(move || send_worker(conn, rx, ev, chunk_size, rate)));
        };
        for conn in streams {
            spawn_worker(conn, &mut closers, &mut workers);
        }
        crate::control::spawn_reader(reader, events.clone(), Event::Ctrl, Event::CtrlFailed);
        {
            let (ev, w, sources, opts, memory, filter, list) = (events.clone(), writer.clone(), p.sources.clone(), p.options, p.memory.clone(), p.filter.clone(), p.list.clone());
            thread::spawn(move || walker(ev, w, sources, opts, memory, filter, list));
        }

        let result = self_loop(&rx, &writer, &work_tx, &p, &mut |conn| spawn_worker(conn, &mut closers, &mut workers));
        drop(work_tx);
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

fn self_loop(rx: &Receiver<Event>, writer: &CtrlWriter, work: &Sender<Work>, p: &SenderParams, spawn: &mut dyn FnMut(DataConn)) -> Result<Summary, TransferError> {
    let chunk_size = p.options.chunk_size;
    let mut files: Vec<FileState> = Vec::new();
    let mut walk_done = false;
    let mut unfinished = 0u64;
    let mut summary: Option<Summary> = None;
    let progress = &p.progress;
    loop {
        if walk_done
            && unfinished == 0
            && let Some(s) = summary
        {
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
            return Ok(s);
        }
        let Ok(ev) = rx.recv() else {
            return Err(TransferError::network("sender: all workers stopped"));
        };
        match ev {
            Event::Files(batch) => {
                for f in batch {
                    if f.kind == EntryKind::File {
                        unfinished += 1;
                        Progress::add(&progress.files_total, 1);
                        Progress::add(&progress.bytes_total, f.size);
                    }
                    let chunks = chunk_count(f.size, chunk_size);
                    files.push(FileState {
                        info: Arc::new(SrcInfo { path: f.path, rel: f.rel, size: f.size, mtime_s: f.mtime_s, mtime_ns: f.mtime_ns }),
                        kind: f.kind,
                        chunks,
                        hashes: Vec::new(),
                        outstanding: 0,
                        end_sent: false,
                        state: if f.kind == EntryKind::File { State::Announced } else { State::Finished },
                    });
                }
            }
            Event::WalkDone(r) => {
                r?;
                walk_done = true;
            }
            Event::WalkWarning(e) => progress.error(e),
            Event::NewStream(conn) => spawn(conn),
            Event::CtrlFailed(e) => return Err(e),
            Event::StreamFailed(e) => return Err(e),
            Event::Sent { id, chunk, hash, len, hash_only } => {
                let f = &mut files[id as usize];
                if !hash_only {
                    Progress::add(&progress.bytes, len as u64);
                    let mut mem = p.memory.lock().unwrap();
                    let seen = mem.sent.entry(f.info.rel.clone()).or_insert_with(|| ChunkSet::new(f.chunks));
                    if seen.len() == f.chunks && !seen.insert(chunk) {
                        Progress::add(&progress.chunks_resent, 1);
                        Progress::add(&progress.bytes_resent, len as u64);
                    }
                }
                if f.chunks > 1 {
                    f.hashes[chunk as usize] = Some(hash);
                }
                f.outstanding -= 1;
                if f.outstanding == 0 && f.chunks > 1 && !f.end_sent && f.state == State::Active {
                    f.end_sent = true;
                    let end = file_end(id, f);
                    writer.send(&end)?;
                    if let Control::FileError { side, message, .. } = end {
                        f.state = State::Finished;
                        unfinished -= 1;
                        Progress::add(&progress.files_failed, 1);
                        progress.error(TransferError::file(side, f.info.path.display().to_string(), message));
                    }
                }
            }
            Event::ReadFailed { id, error } => {
                let f = &mut files[id as usize];
                if f.state == State::Active {
                    writer.send(&Control::FileError { id, side: Side::Source, message: error.message.clone() })?;
                    f.state = State::Finished;
                    unfinished -= 1;
                    Progress::add(&progress.files_failed, 1);
                    progress.error(error);
                }
            }
            Event::Ctrl(msg) => match msg {
                Control::Want(list) => {
                    for WantFile { id, ranges } in list {
                        let Some(f) = files.get_mut(id as usize) else {
                            return Err(peer_bug("want for an unknown file"));
                        };
                        if f.state != State::Announced || f.kind != EntryKind::File {
                            return Err(peer_bug("want for a file not waiting for data"));
                        }
                        validate_ranges(&ranges, f.chunks).map_err(crate::control::proto_err)?;
                        f.state = State::Active;
                        if f.chunks > 1 {
                            f.hashes = vec![None; f.chunks as usize];
                        }
                        let mut wanted = ChunkSet::new(f.chunks);
                        for (start, count) in ranges {
                            for c in start..start + count as u64 {
                                if wanted.insert(c) {
                                    f.outstanding += 1;
                                    let _ = work.send(item(id, c, f, chunk_size, false));
                                }
                            }
                        }
                        // The file hash covers every chunk: hash locally the ones the receiver
                        // already holds (a resumed file), without sending them.
                        for c in 0..f.chunks {
                            if !wanted.contains(c) {
                                Progress::add(&progress.bytes_skipped, chunk_range(f.info.size, chunk_size, c).1 as u64);
                                f.outstanding += 1;
                                let _ = work.send(item(id, c, f, chunk_size, true));
                            }
                        }
                    }
                }
                Control::Skip(list) => {
                    for (id, _) in list {
                        let Some(f) = files.get_mut(id as usize) else { return Err(peer_bug("skip for an unknown file")) };
                        if f.state == State::Announced && f.kind == EntryKind::File {
                            f.state = State::Finished;
                            unfinished -= 1;
                            Progress::add(&progress.files_skipped, 1);
                            Progress::add(&progress.bytes_skipped, f.info.size);
                            p.memory.lock().unwrap().finished.insert(f.info.rel.clone());
                        }
                    }
                }
                Control::ChunkBad { id, chunk } => {
                    let Some(f) = files.get_mut(id as usize) else { return Err(peer_bug("resend for an unknown file")) };
                    if chunk >= f.chunks || f.state != State::Active {
                        return Err(peer_bug("resend for a chunk not in flight"));
                    }
                    tracing::info!("chunk {chunk} of {} failed verification at the receiver; resending", String::from_utf8_lossy(&f.info.rel));
                    f.outstanding += 1;
                    let _ = work.send(item(id, chunk, f, chunk_size, false));
                }
                Control::FileDone(ids) => {
                    for id in ids {
                        let Some(f) = files.get_mut(id as usize) else { return Err(peer_bug("done for an unknown file")) };
                        if f.state != State::Finished {
                            f.state = State::Finished;
                            unfinished -= 1;
                            Progress::add(&progress.files_done, 1);
                            p.memory.lock().unwrap().finished.insert(f.info.rel.clone());
                        }
                    }
                }
                Control::FileError { id, side, message } => {
                    let Some(f) = files.get_mut(id as usize) else { return Err(peer_bug("error for an unknown file")) };
                    let path = String::from_utf8_lossy(&f.info.rel).into_owned();
                    progress.error(TransferError::file(side, path, message));
                    if f.state != State::Finished {
                        f.state = State::Finished;
                        unfinished -= 1;
                        Progress::add(&progress.files_failed, 1);
                    }
                }
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
                    summary = Some(s);
                }
                Control::Fatal { side, message } => return Err(TransferError::fatal(side, message)),
                Control::Bye => return Err(TransferError::network("the receiver ended the session early")),
                _ => return Err(peer_bug("unexpected message for the sending side")),
            },
        }
    }
}

fn peer_bug(what: &str) -> TransferError {
    TransferError::fatal(Side::Network, format!("protocol error from the receiver: {what}"))
}

fn item(id: u64, chunk: u64, f: &FileState, chunk_size: u32, hash_only: bool) -> Work {
    let (offset, len) = chunk_range(f.info.size, chunk_size, chunk);
    Work { id, chunk, offset, len, whole: f.chunks == 1, hash_only, file: f.info.clone() }
}

/// `FileEnd`, or a source error if the file changed while it was read.
fn file_end(id: u64, f: &FileState) -> Control {
    match std::fs::symlink_metadata(&f.info.path) {
        Ok(md) if md.size() == f.info.size && md.mtime() == f.info.mtime_s && md.mtime_nsec() as u32 == f.info.mtime_ns => {
            let hashes: Vec<[u8; 32]> = f.hashes.iter().map(|h| h.expect("every chunk hashed")).collect();
            Control::FileEnd { id, file_hash: file_hash(f.info.size, &hashes), size: f.info.size, mtime_s: f.info.mtime_s, mtime_ns: f.info.mtime_ns }
        }
        Ok(_) => Control::FileError { id, side: Side::Source, message: CHANGED.into() },
        Err(e) => Control::FileError { id, side: Side::Source, message: format!("cannot stat after reading: {}", err_text(&e)) },
    }
}

const CHANGED: &str = "file changed while it was being sent (size or mtime differs); re-run to send the new version";

/// Walks the sources, registering entries with the main loop before announcing them.
fn walker(events: Sender<Event>, writer: Arc<CtrlWriter>, sources: Vec<SourceSpec>, opts: Options, memory: Arc<Mutex<SendMemory>>, filter: Filter, list: Option<Arc<Vec<Vec<u8>>>>) {
    const BATCH: usize = 512;
    let mut batch: Vec<SrcFile> = Vec::with_capacity(BATCH);
    let mut next_id = 0u64;
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut failed: Option<TransferError> = None;
    let flush = |batch: &mut Vec<SrcFile>, next_id: &mut u64| -> Result<(), TransferError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut entries = Vec::with_capacity(batch.len());
        for f in batch.iter() {
            let hash = if opts.checksum() && f.kind == EntryKind::File { File::open(&f.path).and_then(|file| crate::hashing::hash_file(&file, f.size, opts.chunk_size)).ok() } else { None };
            entries.push(Entry { id: *next_id, kind: f.kind, path: f.rel.clone(), size: f.size, mode: f.mode, mtime_s: f.mtime_s, mtime_ns: f.mtime_ns, target: f.target.clone(), hash });
            *next_id += 1;
        }
        let _ = events.send(Event::Files(std::mem::take(batch)));
        writer.send(&Control::Entries(entries))
    };
    let finished = memory.lock().unwrap().finished.clone();
    let mut warn = |e: TransferError| {
        let _ = events.send(Event::WalkWarning(e));
    };
    let mut emit = |f: SrcFile| {
        if f.kind == EntryKind::File && finished.contains(&f.rel) {
            return true;
        }
        if f.kind == EntryKind::File {
            files += 1;
            bytes += f.size;
        }
        batch.push(f);
        if batch.len() >= BATCH
            && let Err(e) = flush(&mut batch, &mut next_id)
        {
            failed = Some(e);
            return false;
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
        let _ = writer.send(&Control::Fatal { side: e.side, message: e.to_string() });
    }
    let _ = events.send(Event::WalkDone(r));
}

/// One data stream: pull wanted chunks, read, hash, send. Exits when the queue closes.
fn send_worker(mut conn: DataConn, work: Receiver<Work>, events: Sender<Event>, chunk_size: u32, rate: Option<Arc<RateLimit>>) {
    const PREFIX: usize = HEADER_LEN + ChunkHeader::LEN;
    let mut buf = vec![0u8; PREFIX + chunk_size as usize + TAG_LEN];
    let mut sealer = conn.sealer.take();
    let trailer = if sealer.is_some() { TAG_LEN } else { 0 };
    let mut out = BufWriter::with_capacity(256 << 10, &mut conn.stream);
    let mut seq = 0u64;
    let mut open: Option<(u64, File)> = None;
    let faults = faults();
    loop {
        // Flush buffered small frames before waiting: the receiver may be waiting on them.
        let w = match work.try_recv() {
            Ok(w) => w,
            Err(crossbeam_channel::TryRecvError::Empty) => {
                if let Err(e) = out.flush() {
                    let _ = events.send(Event::StreamFailed(TransferError::network(format!("data stream {}: {}", conn.index, err_text(&e)))));
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
            match File::open(&w.file.path) {
                Ok(f) => open = Some((w.id, f)),
                Err(e) => {
                    let error = TransferError::io(Side::Source, w.file.path.display().to_string(), "cannot open", &e);
                    let _ = events.send(Event::ReadFailed { id: w.id, error });
                    continue;
                }
            }
        }
        let file = &open.as_ref().unwrap().1;
        let data = &mut buf[PREFIX..PREFIX + w.len as usize];
        if let Err(e) = file.read_exact_at(data, w.offset) {
            let error = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                TransferError::file(Side::Source, w.file.path.display().to_string(), CHANGED)
            } else {
                TransferError::io(Side::Source, w.file.path.display().to_string(), "read failed", &e)
            };
            let _ = events.send(Event::ReadFailed { id: w.id, error });
            continue;
        }
        if w.whole {
            // A single-chunk file completes with this frame: check it did not change under us.
            let same = file.metadata().is_ok_and(|md| md.size() == w.file.size && md.mtime() == w.file.mtime_s && md.mtime_nsec() as u32 == w.file.mtime_ns);
            if !same {
                let error = TransferError::file(Side::Source, w.file.path.display().to_string(), CHANGED);
                let _ = events.send(Event::ReadFailed { id: w.id, error });
                continue;
            }
        }
        let hash = chunk_hash(data);
        if w.hash_only {
            let _ = events.send(Event::Sent { id: w.id, chunk: w.chunk, hash, len: w.len, hash_only: true });
            continue;
        }
        if faults.corrupt(&w.file.rel, w.chunk) && !data.is_empty() {
            data[0] ^= 0xff;
        }
        let mut header = ChunkHeader { flags: if w.whole { FLAG_WHOLE_FILE } else { 0 }, file_id: w.id, index: w.chunk, offset: w.offset, hash, tag: [0; 32] };
        if let Some(key) = &conn.tag_key {
            header.tag = header.compute_tag(key, seq);
        }
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
        if let Err(e) = sent {
            let _ = events.send(Event::StreamFailed(TransferError::network(format!("data stream {}: {}", conn.index, err_text(&e)))));
            return;
        }
        if faults.cut(w.len as u64) {
            tracing::warn!("test fault: cutting data stream {}", conn.index);
            conn.closer.close();
        }
        let _ = events.send(Event::Sent { id: w.id, chunk: w.chunk, hash, len: w.len, hash_only: false });
    }
    let _ = out.flush();
    drop(out);
    let _ = conn.stream.flush();
}
