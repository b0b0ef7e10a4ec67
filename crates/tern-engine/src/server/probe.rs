//! The server's side of a path test (`TestRequest`): bounded, one at a time, refusable.

use std::path::Path;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use tern_proto::msg::{MAX_TEST_STEP_MS, MAX_TEST_STREAMS, TEST_NO_ENCRYPT, TEST_PULL};
use tern_proto::{Control, TestWhat};

use std::path::PathBuf;

use crate::error::{Side, TransferError};
use crate::net::control::{CtrlReader, CtrlWriter};
use crate::net::datastream::{PendingStream, StreamAuth};
use crate::net::probe::{Connected, Lane, blast_all, cpu_rate, drain, process_cpu, usable_cores, window};
use crate::net::transport::random;
use crate::probe::{MAX_SCRATCH, MAX_SESSION, MAX_STEPS, Outcome, Rate};
use crate::progress::Progress;
use crate::store::probe::{Scratch, write_skip, write_striped};
use crate::store::roots::Roots;

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

/// The destination write test in directory `path` (opened beneath `roots`' root at use).
fn write_test(roots: &Roots, path: &Path, writers: u16, chunk: u32, millis: u32) -> Outcome {
    let r = (|| {
        let beneath = roots.beneath(path)?;
        let dir = crate::store::fsops::open_dir(beneath.as_ref(), path)?;
        let scratch = Scratch::create(dir)?;
        write_striped(&scratch.file, writers, chunk, millis, MAX_SCRATCH)
    })();
    match r {
        Ok(rate) => Outcome::Measured(rate),
        Err(e) => Outcome::Skipped(write_skip(path, &e)),
    }
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
struct Closers(Arc<Mutex<Option<Vec<crate::net::transport::Closer>>>>);

impl Closers {
    fn add(&self, c: crate::net::transport::Closer) {
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
        crate::threads::spawn("tern-test-stale", move || {
            thread::sleep(STALE);
            closers.close_all();
        })
        .map_err(|e| crate::threads::refused(Side::Destination, "tern-test-stale", &e))?;
    }
    // Bounds the decoder already checked, checked again where they are used.
    let (n, chunk) = (req.streams.min(MAX_TEST_STREAMS), req.chunk_size);
    let dest = if req.path.is_empty() { Err("no destination directory was named".to_string()) } else { served.roots.resolve(&req.path).map_err(|e| e.message) };
    let pull = req.flags & TEST_PULL != 0;
    writer.send(&Control::Ready { session_id: served.session_id, data_addr: served.data_addr.into_bytes(), nonce: random(), cert_pin: None })?;
    let started = Instant::now();
    let auth = StreamAuth::new(served.session_id, served.key, req.flags & TEST_NO_ENCRYPT == 0);
    let arrived = Arc::new(AtomicU64::new(0));
    let lanes: Arc<Mutex<Vec<Lane>>> = Arc::default();
    {
        let (arrived, lanes, closers) = (arrived.clone(), lanes.clone(), closers.clone());
        crate::threads::spawn("tern-test-join", move || {
            let mut joined = 0u16;
            // The session's feed closes when it ends; a client bringing more than it asked for
            // gets them dropped.
            while let Ok(p) = streams.recv_timeout(MAX_SESSION) {
                if joined >= n {
                    continue;
                }
                joined += 1;
                let (auth, arrived, lanes, closers) = (auth.clone(), arrived.clone(), lanes.clone(), closers.clone());
                // Without a thread, one stream fewer in the test.
                let _ = crate::threads::spawn("tern-test-stream", move || match p.finish(&auth) {
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
        })
        .map_err(|e| crate::threads::refused(Side::Destination, "tern-test-join", &e))?;
    }
    let mut steps = 0usize;
    // The CPU time this process used in the last carry's measured window (`TestWhat::Cpu`).
    let mut carry_cpu = Duration::ZERO;
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
                let (t, c0) = (Instant::now(), process_cpu());
                let sent = blast_all(&mut all[..k], chunk, &stop, Some(t + Duration::from_millis(millis as u64)));
                carry_cpu = process_cpu().saturating_sub(c0);
                Outcome::Measured(Rate::new(sent, t.elapsed()))
            }
            TestWhat::Carry => {
                let (rate, cpu) = window(&arrived, Instant::now(), millis);
                carry_cpu = cpu;
                Outcome::Measured(rate)
            }
            TestWhat::Cpu => {
                let (cores, how) = usable_cores();
                Outcome::Cpu { millicores: (cores * 1000.0).round() as u64, carry_cpu, how }
            }
            TestWhat::Write => match &dest {
                Ok(p) => write_test(served.roots, p, count, chunk, millis),
                Err(m) => Outcome::Skipped(m.clone()),
            },
            TestWhat::Hash | TestWhat::Seal => Outcome::Measured(cpu_rate(what, millis)),
            TestWhat::Host => {
                // The destination's file system only where a transfer could write; facts are
                // advice and read-only, bounded by `to_lines`.
                // A destination that does not exist yet is judged by the directory it would be made in.
                let paths: Vec<&Path> = dest.iter().filter_map(|p| p.ancestors().find(|a| a.exists())).collect();
                writer.send(&Control::TestResult { what, skipped: false, bytes: 0, micros: 0, note: crate::host::Facts::gather(&paths).to_lines() })?;
                continue;
            }
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
    let bounded = |why: &str| {
        let mut note = why.to_string();
        while note.len() > tern_proto::limits::MAX_MESSAGE {
            note.pop();
        }
        note
    };
    match r {
        Outcome::Measured(r) => Control::TestResult { what, skipped: false, bytes: r.bytes, micros: (r.secs * 1e6) as u64, note: String::new() },
        Outcome::Cpu { millicores, carry_cpu, how } => Control::TestResult { what, skipped: false, bytes: *millicores, micros: carry_cpu.as_micros() as u64, note: bounded(how) },
        Outcome::Skipped(why) => Control::TestResult { what, skipped: true, bytes: 0, micros: 0, note: bounded(why) },
    }
}

/// A server for a local path's self-test, in this process on loopback (the same code as
/// `tern _remote`, over a socket pair): the control channel's reader and writer, the session
/// key, the server's feature bits and its thread. The caller (the CLI) hands it to
/// `client::probe::run`: client code imports no server code.
pub fn loopback() -> Result<Connected, TransferError> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(crate::net::control::net_err)?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(crate::net::control::net_err)?;
    let addr = listener.local_addr().map_err(crate::net::control::net_err)?.to_string();
    let (tx, rx) = crossbeam_channel::bounded(64);
    crate::threads::spawn_or_refuse(Side::Network, "tern-listen", move || crate::net::datastream::accept_data_streams(listener, tx))?;
    let secret = random::<32>();
    let key = tern_proto::auth::token_key(&secret);
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let server = crate::threads::spawn_or_refuse(Side::Destination, "tern-test-server", move || {
        let Ok(halves) = crate::net::transport::ControlHalves::from_unix(theirs) else { return };
        let hooks = crate::server::hook::Hooks::default();
        let roots = crate::store::roots::Roots::Home(cwd);
        let served = crate::server::session::ServedSession {
            exporter: [0; 32],
            secret_key: key,
            roots: &roots,
            session_id: random(),
            data_addr: addr,
            announce: crate::net::handshake::Announce::No,
            reverse_to: None,
            progress: Arc::new(Progress::default()),
            hooks: &hooks,
            daemon: None,
        };
        if let Err(e) = crate::server::session::serve_session(halves, rx, served) {
            tracing::debug!("loopback path test server: {e}");
        }
    })?;
    let halves = crate::net::transport::ControlHalves::from_unix(ours).map_err(crate::net::control::net_err)?;
    let mut reader = CtrlReader::new(halves.reader);
    let writer = CtrlWriter::new(halves.writer);
    let (session_key, _, features) = crate::net::handshake::client(&mut reader, &writer, &key, &[0; 32], "loopback", true, None)?;
    Ok(Connected { reader, writer, key: session_key, features, server })
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
        let dir = crate::store::fsops::open_dir(None, t.path()).unwrap();
        let s = Scratch::create(dir).unwrap();
        let tag = crate::store::fsops::Tag::of(&s.dir).unwrap();
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
