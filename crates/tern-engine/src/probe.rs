//! Path tests: `tern test DEST` (docs/protocol.md "Path tests"). The client measures the round
//! trip to the data port, memory→memory throughput over real data streams (framed, hashed and
//! sealed as a transfer's) with one stream and with tern's count, and asks the server for its
//! destination write rate and its hash and seal rates per core; the local side's source read
//! rate and its own hash and seal rates are measured here too. Judging the numbers is the
//! CLI's (a pure function, like `tern doctor`'s findings).
//!
//! The server side treats every request as hostile: the decoder bounds streams, step lengths
//! and chunk sizes; here the session is held to 64 steps and 60 s, one test runs at a time per
//! process, a daemon may refuse all (`tern serve --no-tests`), and the write test's scratch file
//! is created `O_EXCL` in tern's own namespace of a directory opened beneath the root, at most
//! 4 GiB, and removed whatever happens.

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use tern_proto::data::{ChunkHeader, chunk_data_len, max_data_frame};
use tern_proto::frame::{FrameHeader, HEADER_LEN};
use tern_proto::msg::{FEATURE_PATH_TESTS, MAX_TEST_STEP_MS, MAX_TEST_STREAMS, TEST_NO_ENCRYPT, TEST_PULL};
use tern_proto::{Control, TestWhat};

use crate::control::{CtrlReader, CtrlWriter};
use crate::datastream::{DataConn, PendingStream, StreamAuth};
use crate::endpoint::Endpoint;
use crate::error::{Side, TransferError, err_text};
use crate::faults::chunk_hash;
use crate::progress::Progress;
use crate::seal::{Sealer, TAG_LEN};
use crate::server::Roots;
use crate::session::ClientSpec;
use crate::transport::random;

/// Most steps one test session may ask for.
pub const MAX_STEPS: usize = 64;
/// A test session's time from `Ready` to its last answer.
pub const MAX_SESSION: Duration = Duration::from_secs(60);
/// The write test's scratch file stops growing here.
pub const MAX_SCRATCH: u64 = 4 << 30;

static REFUSED: AtomicBool = AtomicBool::new(false);
/// The running test's number and start, if one runs. A holder older than `STALE` no longer
/// counts (past `MAX_SESSION` it may run no step, and its streams are closed): a client that
/// goes quiet cannot keep the daemon's tests for itself.
static BUSY: Mutex<Option<(u64, Instant)>> = Mutex::new(None);
static TESTS: AtomicU64 = AtomicU64::new(0);
/// After this the session's data streams are closed, whatever the client does.
const STALE: Duration = Duration::from_secs(70);

/// `tern serve --no-tests`: this process answers every `TestRequest` with a refusal.
pub fn refuse_tests() {
    REFUSED.store(true, SeqCst);
}

/// Bytes in a time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rate {
    pub bytes: u64,
    pub secs: f64,
}

impl Rate {
    pub fn new(bytes: u64, took: Duration) -> Self {
        Self { bytes, secs: took.as_secs_f64() }
    }
    /// Gigabits per second (0 if nothing was timed).
    pub fn gbps(&self) -> f64 {
        if self.secs > 0.0 { self.bytes as f64 * 8.0 / self.secs / 1e9 } else { 0.0 }
    }
}

/// A measurement, or why it was not made.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Measured(Rate),
    Skipped(String),
}

// ------------------------------------------------------------------------------------------
// The data plane: chunk frames of zeros, as a transfer's.

/// One data stream's sending or receiving state across steps (the seal's counter, the tag's
/// sequence number).
struct Lane {
    conn: DataConn,
    sealer: Option<Sealer>,
    seq: u64,
}

impl Lane {
    fn new(mut conn: DataConn) -> Self {
        let sealer = conn.sealer.take();
        Self { conn, sealer, seq: 0 }
    }
}

/// Sends chunk frames of zeros on `lane` until `stop`; the payload bytes sent. Each frame is
/// built, hashed and sealed (or tagged) as a transfer's sender does.
fn blast(lane: &mut Lane, chunk: u32, stop: &AtomicBool) -> std::io::Result<u64> {
    const PREFIX: usize = HEADER_LEN + ChunkHeader::LEN;
    let len = chunk as usize;
    let trailer = if lane.sealer.is_some() { TAG_LEN } else { 0 };
    let mut buf = vec![0u8; PREFIX + len + TAG_LEN];
    let mut out = BufWriter::with_capacity(256 << 10, &mut lane.conn.stream);
    let mut sent = 0u64;
    while !stop.load(Relaxed) {
        let data = &mut buf[PREFIX..PREFIX + len];
        // A sealed buffer holds ciphertext: zeros again, as a read would refill it.
        data.fill(0);
        let hash = chunk_hash(data);
        let mut header = ChunkHeader { flags: 0, file_id: 0, index: lane.seq, offset: 0, hash, tag: [0; 32] };
        if let Some(key) = &lane.conn.tag_key {
            header.tag = header.compute_tag(key, lane.seq);
        }
        lane.seq += 1;
        buf[..HEADER_LEN].copy_from_slice(&ChunkHeader::frame_header(len + trailer));
        buf[HEADER_LEN..PREFIX].copy_from_slice(&header.encode());
        let end = PREFIX + len;
        if let Some(s) = lane.sealer.as_mut() {
            let (aad, body) = buf[..end].split_at_mut(HEADER_LEN);
            let tag = s.seal(aad, body);
            buf[end..end + TAG_LEN].copy_from_slice(&tag);
        }
        out.write_all(&buf[..end + trailer])?;
        sent += len as u64;
    }
    out.flush()?;
    Ok(sent)
}

/// Reads chunk frames from `conn` until it ends, opening (or checking the tag of) and hashing
/// each as a transfer's receiver does, and counts their payload into `count`. A frame that
/// fails is the end of the stream (a test has nothing to repair).
fn drain(conn: DataConn, chunk: u32, count: Arc<AtomicU64>) {
    let mut lane = Lane::new(conn);
    let trailer = if lane.sealer.is_some() { TAG_LEN } else { 0 };
    let tag_key = lane.conn.tag_key;
    let mut r = BufReader::with_capacity(256 << 10, &mut lane.conn.stream);
    let mut buf = vec![0u8; ChunkHeader::LEN + chunk as usize + TAG_LEN];
    loop {
        let mut head = [0u8; HEADER_LEN];
        if r.read_exact(&mut head).is_err() {
            return;
        }
        let Ok(len) = FrameHeader::parse(head, max_data_frame(chunk)).and_then(|f| chunk_data_len(f, chunk, trailer)) else {
            tracing::debug!("path test: a malformed data frame; stream dropped");
            return;
        };
        let body = &mut buf[..ChunkHeader::LEN + len + trailer];
        if r.read_exact(body).is_err() {
            return;
        }
        if let Some(s) = lane.sealer.as_mut()
            && !s.open(&head, body)
        {
            tracing::debug!("path test: a data frame failed decryption; stream dropped");
            return;
        }
        let h = ChunkHeader::decode(body[..ChunkHeader::LEN].try_into().unwrap());
        if let Some(key) = &tag_key
            && !tern_proto::auth::proofs_equal(&h.compute_tag(key, lane.seq), &h.tag)
        {
            tracing::debug!("path test: a data frame failed authentication; stream dropped");
            return;
        }
        lane.seq += 1;
        if chunk_hash(&body[ChunkHeader::LEN..ChunkHeader::LEN + len]) != h.hash {
            tracing::debug!("path test: a chunk's hash did not match; stream dropped");
            return;
        }
        count.fetch_add(len as u64, Relaxed);
    }
}

/// Sends on every lane in `lanes` until `stop` (or `until`); the bytes sent in all.
fn blast_all(lanes: &mut [Lane], chunk: u32, stop: &AtomicBool, until: Option<Instant>) -> u64 {
    thread::scope(|s| {
        let hs: Vec<_> = lanes.iter_mut().map(|l| s.spawn(move || blast(l, chunk, stop).unwrap_or(0))).collect();
        if let Some(t) = until {
            thread::sleep(t.saturating_duration_since(Instant::now()));
            stop.store(true, Relaxed);
        }
        hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    })
}

/// What arrives on `count` in the window from a fifth of `millis` after `start` to its end
/// (slow start and the previous step's tail stay out of it).
fn window(count: &AtomicU64, start: Instant, millis: u32) -> Rate {
    let total = Duration::from_millis(millis as u64);
    thread::sleep((start + total / 5).saturating_duration_since(Instant::now()));
    let (b0, t0) = (count.load(Relaxed), Instant::now());
    thread::sleep((start + total).saturating_duration_since(Instant::now()));
    Rate::new(count.load(Relaxed) - b0, t0.elapsed())
}

// ------------------------------------------------------------------------------------------
// Local measurements (both sides).

/// One core's BLAKE3 (`Hash`) or AES-256-GCM seal (`Seal`) rate over 1 MiB buffers.
pub fn cpu_rate(what: TestWhat, millis: u32) -> Rate {
    let mut buf = vec![0x5au8; 1 << 20];
    let mut sealer = Sealer::new(&random());
    let start = Instant::now();
    let until = start + Duration::from_millis(millis as u64);
    let mut bytes = 0u64;
    while Instant::now() < until {
        match what {
            TestWhat::Seal => {
                std::hint::black_box(sealer.seal(b"header", &mut buf));
            }
            _ => {
                std::hint::black_box(blake3::hash(&buf));
            }
        }
        bytes += buf.len() as u64;
    }
    Rate::new(bytes, start.elapsed())
}

/// A scratch file in tern's own namespace of the directory `dir` (`.tern.TAG.test.R`), removed
/// when dropped.
struct Scratch {
    dir: OwnedFd,
    name: Vec<u8>,
    file: std::fs::File,
}

impl Scratch {
    fn create(dir: OwnedFd) -> std::io::Result<Self> {
        let tag = crate::fsops::Tag::of(&dir)?;
        let marker = tag.marker();
        let prefix = &marker[..marker.len() - b"incomplete".len()];
        let r: [u8; 8] = random();
        let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
        let name = [prefix, b"test.", hex.as_bytes()].concat();
        let fd = rfs::openat(&dir, &name[..], OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::from_raw_mode(0o600))?;
        Ok(Self { dir, name, file: std::fs::File::from(fd) })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = rfs::unlinkat(&self.dir, &self.name[..], AtFlags::empty());
    }
}

/// Bytes that do not compress: a file system that compresses zeros would flatter the writers.
fn pattern(len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    blake3::Hasher::new().update(b"tern path test").finalize_xof().fill(&mut buf);
    buf
}

/// `writers` threads write `file` in `chunk` pieces, each taking the next chunk index (a
/// transfer's striping), until `millis` or `max` bytes; then `fdatasync`. The time includes it.
fn write_striped(file: &std::fs::File, writers: u16, chunk: u32, millis: u32, max: u64) -> std::io::Result<Rate> {
    let buf = pattern(chunk as usize);
    let next = AtomicU64::new(0);
    let start = Instant::now();
    let until = start + Duration::from_millis(millis as u64);
    let written: std::io::Result<u64> = thread::scope(|s| {
        let hs: Vec<_> = (0..writers)
            .map(|_| {
                s.spawn(|| -> std::io::Result<u64> {
                    let mut n = 0u64;
                    while Instant::now() < until {
                        let off = next.fetch_add(1, Relaxed) * chunk as u64;
                        if off + chunk as u64 > max {
                            break;
                        }
                        file.write_all_at(&buf, off)?;
                        n += chunk as u64;
                    }
                    Ok(n)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("writer panicked")))).sum()
    });
    let written = written?;
    file.sync_data()?;
    Ok(Rate::new(written, start.elapsed()))
}

/// The one line a skipped write test gets.
fn write_skip(path: &Path, e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => format!("{}: no space for a scratch file ({})", path.display(), err_text(e)),
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => format!("{}: not writable ({})", path.display(), err_text(e)),
        Some(libc::EXDEV) => format!("{}: leaves the daemon's root through a symlink; refused", path.display()),
        _ => format!("{}: {}", path.display(), err_text(e)),
    }
}

/// The destination write test in directory `path` (opened beneath `roots`' root at use).
fn write_test(roots: &Roots, path: &Path, writers: u16, chunk: u32, millis: u32) -> Outcome {
    let r = (|| {
        let beneath = roots.beneath(path)?;
        let dir = crate::fsops::open_dir(beneath.as_ref(), path)?;
        let scratch = Scratch::create(dir)?;
        write_striped(&scratch.file, writers, chunk, millis, MAX_SCRATCH)
    })();
    match r {
        Ok(rate) => Outcome::Measured(rate),
        Err(e) => Outcome::Skipped(write_skip(path, &e)),
    }
}

/// Where the source read test reads, and whether its caches may be warm.
#[derive(Clone, Debug)]
pub struct ReadTest {
    pub file: PathBuf,
    /// A scratch file tern wrote just before (its pages are likely cached), or a real file
    /// smaller than what the test read (read again from cache).
    pub warm: bool,
    pub one: Rate,
    pub many: Rate,
    pub readers: u16,
    /// `file` is the directory a scratch file was written in (and removed from).
    pub scratch: bool,
}

/// The source read test: 1 and `readers` readers in `chunk` pieces striped as a transfer's
/// sender reads, each for `millis`. `source`: a file (or a directory: its largest file) to read;
/// none: a scratch file of 256 MiB written in the temporary directory first and removed after.
pub fn read_test(source: Option<&Path>, readers: u16, chunk: u32, millis: u32) -> Result<ReadTest, String> {
    let mut scratch = None;
    let (file, size, mut warm) = match source {
        Some(p) => {
            let f = largest_file(p).map_err(|e| format!("{}: {}", p.display(), err_text(&e)))?;
            let size = std::fs::metadata(&f).map_err(|e| format!("{}: {}", f.display(), err_text(&e)))?.len();
            if size == 0 {
                return Err(format!("{}: empty; name a larger file with --source", f.display()));
            }
            (f, size, false)
        }
        None => {
            let dir = std::env::temp_dir();
            let fd = crate::fsops::open_dir(None, &dir).map_err(|e| format!("{}: {}", dir.display(), err_text(&e)))?;
            let s = Scratch::create(fd).map_err(|e| format!("{}: {}", dir.display(), err_text(&e)))?;
            let size = 256u64 << 20;
            write_striped(&s.file, 1, chunk, 60_000, size).map_err(|e| format!("{}: cannot write a scratch file: {}", dir.display(), err_text(&e)))?;
            scratch = Some(s);
            (dir, size, true)
        }
    };
    let is_scratch = scratch.is_some();
    let f = match &scratch {
        Some(s) => s.file.try_clone(),
        None => std::fs::File::open(&file),
    }
    .map_err(|e| format!("{}: {}", file.display(), err_text(&e)))?;
    let run = |n: u16| -> Result<Rate, String> {
        let next = AtomicU64::new(0);
        let start = Instant::now();
        let until = start + Duration::from_millis(millis as u64);
        let chunks = size.div_ceil(chunk as u64);
        let bytes: u64 = thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|_| {
                    s.spawn(|| {
                        let mut buf = vec![0u8; chunk as usize];
                        let mut got = 0u64;
                        while Instant::now() < until {
                            let i = next.fetch_add(1, Relaxed) % chunks;
                            match f.read_at(&mut buf, i * chunk as u64) {
                                Ok(k) => got += k as u64,
                                Err(_) => break,
                            }
                        }
                        got
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        Ok(Rate::new(bytes, start.elapsed()))
    };
    let one = run(1)?;
    let many = run(readers)?;
    warm |= one.bytes > size || one.bytes + many.bytes > size;
    drop(scratch);
    Ok(ReadTest { file, warm, one, many, readers, scratch: is_scratch })
}

/// `p` itself, or the largest regular file directly in directory `p` (the first 10,000 entries).
fn largest_file(p: &Path) -> std::io::Result<PathBuf> {
    let md = std::fs::metadata(p)?;
    if !md.is_dir() {
        return Ok(p.to_path_buf());
    }
    let mut best: Option<(u64, PathBuf)> = None;
    for e in std::fs::read_dir(p)?.take(10_000).flatten() {
        if let Ok(m) = e.metadata()
            && m.is_file()
            && best.as_ref().is_none_or(|b| m.len() > b.0)
        {
            best = Some((m.len(), e.path()));
        }
    }
    best.map(|b| b.1).ok_or_else(|| std::io::Error::other("no regular file in this directory; name one with --source"))
}

// ------------------------------------------------------------------------------------------
// The server.

/// A `TestRequest` as it came.
pub(crate) struct Request {
    pub path: Vec<u8>,
    pub flags: u8,
    pub streams: u16,
    pub chunk_size: u32,
}

/// What the served session knows that a test needs.
pub(crate) struct Served<'a> {
    pub roots: &'a Roots,
    pub session_id: [u8; 16],
    pub data_addr: String,
    pub key: [u8; 32],
    /// A `tern serve` daemon (its refusals say so).
    pub daemon: bool,
}

/// This process's one running test (see `BUSY`); released when dropped.
struct Busy(u64);

impl Busy {
    fn take() -> Option<Self> {
        let mut b = BUSY.lock().unwrap();
        if b.is_some_and(|(_, since)| since.elapsed() < STALE) {
            return None;
        }
        let id = TESTS.fetch_add(1, Relaxed);
        *b = Some((id, Instant::now()));
        Some(Busy(id))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut b = BUSY.lock().unwrap();
        if b.is_some_and(|(id, _)| id == self.0) {
            *b = None;
        }
    }
}

/// Closes the session's data streams when dropped, and at `STALE` after the start in any case
/// (a client that stops reading cannot hold a pull's writers, nor one that keeps sending the
/// daemon's readers, past it).
#[derive(Clone, Default)]
struct Closers(Arc<Mutex<Option<Vec<crate::transport::Closer>>>>);

impl Closers {
    fn add(&self, c: crate::transport::Closer) {
        match self.0.lock().unwrap().as_mut() {
            Some(v) => v.push(c),
            None => c.close(),
        }
    }
    fn close_all(&self) {
        for c in self.0.lock().unwrap().take().unwrap_or_default() {
            c.close();
        }
    }
}

/// Serves one path test on an authenticated control channel; `streams` brings the data streams
/// that name this session.
pub(crate) fn serve(reader: &mut CtrlReader, writer: &CtrlWriter, streams: Receiver<PendingStream>, served: Served<'_>, req: Request) -> Result<(), TransferError> {
    let fatal = |m: String| {
        let _ = writer.send(&Control::Fatal { side: Side::Network, message: m.clone() });
        TransferError::fatal(Side::Network, m)
    };
    let who = if served.daemon { "this daemon" } else { "this host" };
    if REFUSED.load(SeqCst) {
        return Err(fatal(format!("{who} does not run path tests (tern serve --no-tests)")));
    }
    let Some(_busy) = Busy::take() else {
        return Err(fatal(format!("{who} is already running a path test; try again in a minute")));
    };
    let closers = Closers(Arc::new(Mutex::new(Some(Vec::new()))));
    let _closed = Defer(closers.clone());
    {
        let closers = closers.clone();
        thread::spawn(move || {
            thread::sleep(STALE);
            closers.close_all();
        });
    }
    // Bounds the decoder already checked, checked again where they are used.
    let (n, chunk) = (req.streams.min(MAX_TEST_STREAMS), req.chunk_size);
    let dest = if req.path.is_empty() { Err("no destination directory was named".to_string()) } else { served.roots.resolve(&req.path).map_err(|e| e.message) };
    let pull = req.flags & TEST_PULL != 0;
    writer.send(&Control::Ready { session_id: served.session_id, data_addr: served.data_addr.into_bytes(), nonce: random() })?;
    let started = Instant::now();
    let auth = StreamAuth { session_id: served.session_id, session_key: served.key, encrypt: req.flags & TEST_NO_ENCRYPT == 0 };
    let arrived = Arc::new(AtomicU64::new(0));
    let lanes: Arc<Mutex<Vec<Lane>>> = Arc::default();
    {
        let (arrived, lanes, closers) = (arrived.clone(), lanes.clone(), closers.clone());
        thread::spawn(move || {
            let mut joined = 0u16;
            // The session's feed closes when it ends; a client bringing more than it asked for
            // gets them dropped.
            while let Ok(p) = streams.recv_timeout(MAX_SESSION) {
                if joined >= n {
                    continue;
                }
                joined += 1;
                let (auth, arrived, lanes, closers) = (auth.clone(), arrived.clone(), lanes.clone(), closers.clone());
                thread::spawn(move || match p.finish(&auth) {
                    Ok(c) => {
                        closers.add(c.closer.clone());
                        if pull {
                            lanes.lock().unwrap().push(Lane::new(c));
                        } else {
                            drain(c, chunk, arrived);
                        }
                    }
                    Err(e) => tracing::debug!("path test: data stream: {e}"),
                });
            }
        });
    }
    let mut steps = 0usize;
    loop {
        let (what, count, millis) = match reader.recv()? {
            Control::TestStep { what, count, millis } => (what, count, millis.min(MAX_TEST_STEP_MS)),
            Control::Bye => return Ok(()),
            _ => return Err(fatal("expected a path test step or Bye".into())),
        };
        steps += 1;
        if steps > MAX_STEPS {
            return Err(fatal(format!("a path test may take at most {MAX_STEPS} steps")));
        }
        if started.elapsed() + Duration::from_millis(millis as u64) > MAX_SESSION {
            return Err(fatal(format!("a path test may take at most {} s", MAX_SESSION.as_secs())));
        }
        let count = count.min(n);
        let result = match what {
            TestWhat::Carry if pull => {
                // The client's last streams may still be finishing their handshake here.
                let wait = Instant::now() + Duration::from_secs(5);
                while lanes.lock().unwrap().len() < count as usize && Instant::now() < wait {
                    thread::sleep(Duration::from_millis(10));
                }
                let mut all = lanes.lock().unwrap();
                let k = (count as usize).min(all.len());
                let stop = AtomicBool::new(false);
                let t = Instant::now();
                let sent = blast_all(&mut all[..k], chunk, &stop, Some(t + Duration::from_millis(millis as u64)));
                Outcome::Measured(Rate::new(sent, t.elapsed()))
            }
            TestWhat::Carry => Outcome::Measured(window(&arrived, Instant::now(), millis)),
            TestWhat::Write => match &dest {
                Ok(p) => write_test(served.roots, p, count, chunk, millis),
                Err(m) => Outcome::Skipped(m.clone()),
            },
            TestWhat::Hash | TestWhat::Seal => Outcome::Measured(cpu_rate(what, millis)),
        };
        writer.send(&result_msg(what, &result))?;
    }
}

/// Closes the streams when the session ends.
struct Defer(Closers);

impl Drop for Defer {
    fn drop(&mut self) {
        self.0.close_all();
    }
}

fn result_msg(what: TestWhat, r: &Outcome) -> Control {
    match r {
        Outcome::Measured(r) => Control::TestResult { what, skipped: false, bytes: r.bytes, micros: (r.secs * 1e6) as u64, note: String::new() },
        Outcome::Skipped(why) => {
            let mut note = why.clone();
            while note.len() > tern_proto::limits::MAX_MESSAGE {
                note.pop();
            }
            Control::TestResult { what, skipped: true, bytes: 0, micros: 0, note }
        }
    }
}

// ------------------------------------------------------------------------------------------
// The client.

/// What the user asked for.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Each carry and write step's time; hash and seal get a third of it.
    pub step: Duration,
    pub pull: bool,
    pub encrypt: bool,
    pub chunk_size: u32,
    /// Streams with `--streams`; none: tern's choice for the measured round trip.
    pub streams: Option<u16>,
}

/// What the far side (and the path to it) measured.
#[derive(Clone, Debug)]
pub struct PathReport {
    /// The far side, in words.
    pub peer: String,
    /// TCP connect times to the data port, sorted, in seconds.
    pub rtt: Vec<f64>,
    /// The streams tern would use (and the N-stream steps used).
    pub streams: u16,
    pub carry_one: Rate,
    pub carry_many: Rate,
    pub write_one: Outcome,
    pub write_many: Outcome,
    pub hash: Rate,
    pub seal: Rate,
}

/// tern's starting stream count for a round trip, as `session::initial_streams` chooses it
/// (8, or one per core and at least 2 on a path under 2 ms, where more only cost CPU).
pub fn chosen_streams(rtt: Duration) -> u16 {
    let default = 8u16;
    if rtt < Duration::from_millis(2) {
        let cores = thread::available_parallelism().map_or(4, |n| n.get()) as u16;
        default.min(cores.max(2))
    } else {
        default
    }
}

/// The far side's control channel, key and where its data streams go.
struct Far {
    reader: CtrlReader,
    writer: CtrlWriter,
    key: [u8; 32],
    peer: String,
    features: u64,
    /// daemon: the address we reached it on; ssh: the host to put in a wildcard data address.
    data_at: Option<String>,
    data_host: String,
    _keep: Option<crate::session::ControlSession>,
    _server: Option<thread::JoinHandle<()>>,
}

/// Connects to `dest`'s side: ssh or a daemon as `tern ls` does, or (a local path) a server in
/// this process on loopback, so the test runs the very same code.
fn open_far(spec: &ClientSpec, dest: &Endpoint) -> Result<Far, TransferError> {
    match dest {
        Endpoint::Local(_) => {
            let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(crate::control::net_err)?;
            let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(crate::control::net_err)?;
            let addr = listener.local_addr().map_err(crate::control::net_err)?.to_string();
            let (tx, rx) = crossbeam_channel::bounded(64);
            thread::spawn(move || crate::server::accept_data_streams(listener, tx));
            let secret = random::<32>();
            let key = tern_proto::auth::token_key(&secret);
            let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
            let server = thread::spawn(move || {
                let Ok(halves) = crate::transport::ControlHalves::from_unix(theirs) else { return };
                let hooks = crate::hook::Hooks::default();
                let roots = Roots::Home(cwd);
                let served = crate::server::ServedSession {
                    exporter: [0; 32],
                    secret_key: key,
                    roots: &roots,
                    session_id: random(),
                    data_addr: addr,
                    announce: crate::handshake::Announce::No,
                    reverse_to: None,
                    progress: Arc::new(Progress::default()),
                    hooks: &hooks,
                    daemon: None,
                };
                if let Err(e) = crate::server::serve_session(halves, rx, served) {
                    tracing::debug!("loopback path test server: {e}");
                }
            });
            let halves = crate::transport::ControlHalves::from_unix(ours).map_err(crate::control::net_err)?;
            let mut reader = CtrlReader::new(halves.reader);
            let writer = CtrlWriter::new(halves.writer);
            let (session_key, _, features) = crate::handshake::client(&mut reader, &writer, &key, &[0; 32], "loopback", true, None)?;
            Ok(Far { reader, writer, key: session_key, peer: "this host (loopback)".into(), features, data_at: None, data_host: "127.0.0.1".into(), _keep: None, _server: Some(server) })
        }
        Endpoint::Ssh { host, .. } | Endpoint::Daemon { host, .. } => {
            let progress = Arc::new(Progress::default());
            let mut s = crate::session::ControlSession::open(spec, dest, &progress)?;
            let reader = std::mem::replace(&mut s.reader, CtrlReader::new(Box::new(std::io::empty())));
            let writer = std::mem::replace(&mut s.writer, CtrlWriter::new(Box::new(std::io::sink())));
            let (data_at, data_host) = match dest {
                Endpoint::Daemon { port, .. } => (Some(format!("{}:{port}", bracket(host))), bracket(host)),
                _ => (None, bracket(host.rsplit_once('@').map_or(host.as_str(), |(_, h)| h))),
            };
            Ok(Far { reader, writer, key: s.key, peer: s.peer.clone(), features: s.features, data_at, data_host, _keep: Some(s), _server: None })
        }
    }
}

fn bracket(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_string() }
}

/// The wire path of the destination directory: the path itself if it is a directory there, or
/// its parent (a file's directory). Local: made absolute.
fn dest_dir(dest: &Endpoint) -> Vec<u8> {
    match dest {
        Endpoint::Local(p) => std::path::absolute(p).unwrap_or_else(|_| p.clone()).as_os_str().as_bytes().to_vec(),
        Endpoint::Ssh { path, .. } | Endpoint::Daemon { path, .. } => {
            if path.is_empty() {
                b".".to_vec()
            } else {
                path.as_bytes().to_vec()
            }
        }
    }
}

fn expect_result(r: &mut CtrlReader, what: TestWhat, peer: &str) -> Result<Outcome, TransferError> {
    match r.recv()? {
        Control::TestResult { what: w, skipped, bytes, micros, note } if w == what => Ok(if skipped { Outcome::Skipped(note) } else { Outcome::Measured(Rate { bytes, secs: micros as f64 / 1e6 }) }),
        Control::Fatal { side, message } => Err(TransferError::fatal(side, format!("{message} (on {peer})"))),
        _ => Err(TransferError::fatal(Side::Network, format!("{peer} answered a path test step with something else (is it a compatible tern?)"))),
    }
}

fn measured(o: Outcome) -> Rate {
    match o {
        Outcome::Measured(r) => r,
        Outcome::Skipped(_) => Rate::default(),
    }
}

/// Runs the path test against `dest`'s side. Each step's time is `plan.step`.
pub fn run(spec: &ClientSpec, dest: &Endpoint, plan: &Plan) -> Result<PathReport, TransferError> {
    let mut far = open_far(spec, dest)?;
    let peer = far.peer.clone();
    if far.features & FEATURE_PATH_TESTS == 0 {
        return Err(TransferError::fatal(Side::Network, format!("{peer} runs an older tern without path tests; upgrade it there (or pass --install-remote over ssh)")));
    }
    let step_ms = (plan.step.as_millis() as u32).clamp(tern_proto::msg::MIN_TEST_STEP_MS * 3, MAX_TEST_STEP_MS);
    let most = plan.streams.unwrap_or(8).clamp(1, MAX_TEST_STREAMS);
    let mut flags = if plan.encrypt { 0 } else { TEST_NO_ENCRYPT };
    if plan.pull {
        flags |= TEST_PULL;
    }
    far.writer.send(&Control::TestRequest { path: dest_dir(dest), flags, streams: most, chunk_size: plan.chunk_size })?;
    let (session_id, reported) = match far.reader.recv()? {
        Control::Ready { session_id, data_addr, .. } => (session_id, String::from_utf8_lossy(&data_addr).into_owned()),
        Control::Fatal { side, message } => return Err(TransferError::fatal(side, format!("{message} (on {peer})"))),
        _ => return Err(TransferError::fatal(Side::Network, format!("{peer} answered a path test with something else (is it a compatible tern?)"))),
    };
    let data_addr = match &far.data_at {
        Some(a) => a.clone(),
        None => match reported.rsplit_once(':') {
            Some((ip, port)) if ip.is_empty() || ip == "0.0.0.0" || ip == "[::]" => format!("{}:{port}", far.data_host),
            Some(_) => reported.clone(),
            None => return Err(TransferError::fatal(Side::Network, format!("{peer} reported no data address"))),
        },
    };
    let addrs: Vec<SocketAddr> = data_addr.to_socket_addrs().map_err(|e| TransferError::network(format!("{data_addr}: {e}")))?.collect();
    // Round trips: TCP connects to the data port (the kernel answers; no ssh, no TLS).
    let mut rtt = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        match addrs.iter().find_map(|a| TcpStream::connect_timeout(a, Duration::from_secs(3)).ok()) {
            Some(s) => {
                rtt.push(t.elapsed().as_secs_f64());
                drop(s);
            }
            None => return Err(TransferError::network(format!("{data_addr}: cannot connect to the data port (a firewall between the hosts?)"))),
        }
    }
    rtt.sort_by(f64::total_cmp);
    let median = Duration::from_secs_f64(rtt[rtt.len() / 2]);
    let streams = plan.streams.unwrap_or_else(|| chosen_streams(median)).min(most);
    let auth = StreamAuth { session_id, session_key: far.key, encrypt: plan.encrypt };
    let conns: Vec<DataConn> = thread::scope(|s| {
        let hs: Vec<_> = (0..streams as u32)
            .map(|i| {
                let (addrs, auth) = (&addrs, &auth);
                s.spawn(move || -> std::io::Result<DataConn> {
                    let sock = crate::session::connect_any(addrs)?;
                    crate::datastream::connect_stream(sock, auth, i, spec.bufsize)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("panicked")))).collect::<std::io::Result<Vec<_>>>()
    })
    .map_err(|e| TransferError::network(format!("{data_addr}: data stream: {}", err_text(&e))))?;
    let arrived = Arc::new(AtomicU64::new(0));
    let mut lanes = Vec::new();
    let mut drains = Vec::new();
    for c in conns {
        if plan.pull {
            let (arrived, chunk) = (arrived.clone(), plan.chunk_size);
            drains.push(thread::spawn(move || drain(c, chunk, arrived)));
        } else {
            lanes.push(Lane::new(c));
        }
    }
    let mut carry = |k: u16, far: &mut Far| -> Result<Rate, TransferError> {
        far.writer.send(&Control::TestStep { what: TestWhat::Carry, count: k, millis: step_ms })?;
        if plan.pull {
            let ours = window(&arrived, Instant::now(), step_ms);
            expect_result(&mut far.reader, TestWhat::Carry, &peer)?;
            return Ok(ours);
        }
        let stop = AtomicBool::new(false);
        let (stop, reader, lanes) = (&stop, &mut far.reader, &mut lanes[..k as usize]);
        thread::scope(|s| {
            let h = s.spawn(move || blast_all(lanes, plan.chunk_size, stop, None));
            let r = expect_result(reader, TestWhat::Carry, &peer);
            stop.store(true, Relaxed);
            let _ = h.join();
            r.map(measured)
        })
    };
    let carry_one = carry(1, &mut far)?;
    let carry_many = carry(streams, &mut far)?;
    let mut ask = |what: TestWhat, count: u16, millis: u32| -> Result<Outcome, TransferError> {
        far.writer.send(&Control::TestStep { what, count, millis })?;
        expect_result(&mut far.reader, what, &peer)
    };
    let write_one = ask(TestWhat::Write, 1, step_ms)?;
    let write_many = ask(TestWhat::Write, streams, step_ms)?;
    let cpu_ms = (step_ms / 3).max(tern_proto::msg::MIN_TEST_STEP_MS);
    let hash = measured(ask(TestWhat::Hash, 1, cpu_ms)?);
    let seal = measured(ask(TestWhat::Seal, 1, cpu_ms)?);
    let _ = far.writer.send(&Control::Bye);
    // Our streams end: the server's readers see the end and stop.
    drop(lanes);
    drop(far);
    for d in drains {
        let _ = d.join();
    }
    Ok(PathReport { peer, rtt, streams, carry_one, carry_many, write_one, write_many, hash, seal })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scratch_file_is_tern_s_own_and_goes_away() {
        let t = tempfile::tempdir().unwrap();
        let roots = Roots::Confined(vec![("r".into(), t.path().to_path_buf())]);
        let Outcome::Measured(r) = write_test(&roots, t.path(), 2, 1 << 16, 200) else { panic!("not measured") };
        assert!(r.bytes > 0 && r.secs > 0.0);
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0, "the scratch file is removed");
        let dir = crate::fsops::open_dir(None, t.path()).unwrap();
        let s = Scratch::create(dir).unwrap();
        let tag = crate::fsops::Tag::of(&s.dir).unwrap();
        assert!(s.name.starts_with(&tag.marker()[..15]), "{:?}", String::from_utf8_lossy(&s.name));
        drop(s);
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_missing_or_escaping_directory_is_skipped_with_its_reason() {
        let t = tempfile::tempdir().unwrap();
        let roots = Roots::Confined(vec![("r".into(), t.path().join("root"))]);
        std::fs::create_dir(t.path().join("root")).unwrap();
        std::os::unix::fs::symlink(t.path(), t.path().join("root/out")).unwrap();
        match write_test(&roots, &t.path().join("root/out"), 1, 1 << 16, 100) {
            Outcome::Skipped(why) => assert!(why.contains("symlink") || why.contains("refused"), "{why}"),
            o => panic!("{o:?}"),
        }
        assert!(matches!(write_test(&roots, &t.path().join("root/none"), 1, 1 << 16, 100), Outcome::Skipped(_)));
    }
}
