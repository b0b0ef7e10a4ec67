//! The asking side of a path test: connects as `tern ls` does, measures the round trip, opens the data streams and runs the steps.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::thread;
use std::time::{Duration, Instant};

use tern_proto::msg::{FEATURE_HOST_FACTS, FEATURE_PATH_TESTS, FEATURE_TEST_CPU, MAX_TEST_STEP_MS, MAX_TEST_STREAMS, TEST_NO_ENCRYPT, TEST_PULL};
use tern_proto::{Control, TestWhat};

use crate::client::session::ClientSpec;
use crate::endpoint::Endpoint;
use crate::error::{Side, TransferError, err_text};
use crate::net::control::{CtrlReader, CtrlWriter};
use crate::net::datastream::{DataConn, StreamAuth};
use crate::net::probe::{Connected, Lane, blast_all, counters, drain, window};
use crate::probe::{Outcome, Rate};
use crate::progress::Progress;

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
    /// The far side's CPU (a server with `FEATURE_TEST_CPU`; none from an older one).
    pub far_cpu: Option<FarCpu>,
    /// What this side's sockets counted during the many-stream carry: segments sent,
    /// retransmitted, reorderings seen. A push only (in a pull the far side sends).
    pub sent: Option<crate::net::transport::TcpCounters>,
}

/// What the far side's process may use and used (`TestWhat::Cpu`).
#[derive(Clone, Debug)]
pub struct FarCpu {
    /// Usable cores: its CPUs, or its cgroup's CPU quota where that is fewer.
    pub cores: f64,
    /// Where `cores` comes from, in words ("CPU quota 0.50 cores (cgroup v1 ...)", "2 CPUs").
    pub how: String,
    /// Cores its process kept busy during the many-stream carry (CPU time ÷ the window).
    pub busy: f64,
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
    _keep: Option<crate::client::session::ControlSession>,
    _server: Option<thread::JoinHandle<()>>,
}

/// Connects to `dest`'s side: ssh or a daemon as `tern ls` does, or (a local path) a server in
/// this process on loopback, so the test runs the very same code.
fn open_far(spec: &ClientSpec, dest: &Endpoint, local: Option<Connected>) -> Result<Far, TransferError> {
    match dest {
        Endpoint::Local(_) => {
            let Connected { reader, writer, key, features, server } =
                local.ok_or_else(|| TransferError::fatal(Side::Network, "a local path's self-test needs the in-process server (server::probe::loopback)"))?;
            Ok(Far { reader, writer, key, peer: "this host (loopback)".into(), features, data_at: None, data_host: "127.0.0.1".into(), _keep: None, _server: Some(server) })
        }
        Endpoint::Ssh { host, .. } | Endpoint::Daemon { host, .. } => {
            let progress = Arc::new(Progress::default());
            let mut s = crate::client::session::ControlSession::open(spec, dest, &progress)?;
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
        Outcome::Skipped(_) | Outcome::Cpu { .. } => Rate::default(),
    }
}

/// A test session that is `Ready`, with the round trips to its data port measured.
struct Started {
    session_id: [u8; 16],
    data_addr: String,
    addrs: Vec<SocketAddr>,
    /// TCP connect times to the data port, sorted, in seconds.
    rtt: Vec<f64>,
}

/// Asks `far` for a path test and measures the round trip: TCP connects to the data port (the
/// kernel answers; no ssh, no TLS).
fn start(far: &mut Far, dest: &Endpoint, flags: u8, streams: u16, chunk_size: u32) -> Result<Started, TransferError> {
    let peer = far.peer.clone();
    if far.features & FEATURE_PATH_TESTS == 0 {
        return Err(TransferError::fatal(Side::Network, format!("{peer} runs an older tern without path tests; upgrade it there (or pass --install-remote over ssh)")));
    }
    far.writer.send(&Control::TestRequest { path: dest_dir(dest), flags, streams, chunk_size })?;
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
    Ok(Started { session_id, data_addr, addrs, rtt })
}

/// The far side's tuning facts (`tern doctor DEST`) and the round trips to it.
#[derive(Clone, Debug)]
pub struct HostCheck {
    /// The far side, in words.
    pub peer: String,
    /// TCP connect times to the data port, sorted, in seconds.
    pub rtt: Vec<f64>,
    pub facts: crate::host::Facts,
}

/// Asks `dest`'s side for its host facts: a path test of one step, with no data streams.
/// `local`: as for `run`.
pub fn host_check(spec: &ClientSpec, dest: &Endpoint, local: Option<Connected>) -> Result<HostCheck, TransferError> {
    let mut far = open_far(spec, dest, local)?;
    let peer = far.peer.clone();
    if far.features & FEATURE_PATH_TESTS != 0 && far.features & FEATURE_HOST_FACTS == 0 {
        return Err(TransferError::fatal(Side::Network, format!("{peer} runs an older tern that cannot report its host; upgrade it there (or pass --install-remote over ssh)")));
    }
    let Started { rtt, .. } = start(&mut far, dest, 0, 1, 1 << 20)?;
    far.writer.send(&Control::TestStep { what: TestWhat::Host, count: 1, millis: tern_proto::msg::MIN_TEST_STEP_MS })?;
    let facts = match far.reader.recv()? {
        Control::TestResult { what: TestWhat::Host, note, .. } => crate::host::Facts::from_lines(&note, &String::from_utf8_lossy(&dest_dir(dest))),
        Control::Fatal { side, message } => return Err(TransferError::fatal(side, format!("{message} (on {peer})"))),
        _ => return Err(TransferError::fatal(Side::Network, format!("{peer} answered a host check with something else (is it a compatible tern?)"))),
    };
    let _ = far.writer.send(&Control::Bye);
    Ok(HostCheck { peer, rtt, facts })
}

/// Runs the path test against `dest`'s side. Each step's time is `plan.step`.
/// `local`: for a local `dest`, the in-process server (`server::probe::loopback`); the caller
/// joins the two, as client code imports no server code.
pub fn run(spec: &ClientSpec, dest: &Endpoint, plan: &Plan, local: Option<Connected>) -> Result<PathReport, TransferError> {
    let mut far = open_far(spec, dest, local)?;
    let peer = far.peer.clone();
    let step_ms = (plan.step.as_millis() as u32).clamp(tern_proto::msg::MIN_TEST_STEP_MS * 3, MAX_TEST_STEP_MS);
    let most = plan.streams.unwrap_or(8).clamp(1, MAX_TEST_STREAMS);
    let mut flags = if plan.encrypt { 0 } else { TEST_NO_ENCRYPT };
    if plan.pull {
        flags |= TEST_PULL;
    }
    let Started { session_id, data_addr, addrs, rtt } = start(&mut far, dest, flags, most, plan.chunk_size)?;
    let median = Duration::from_secs_f64(rtt[rtt.len() / 2]);
    let streams = plan.streams.unwrap_or_else(|| chosen_streams(median)).min(most);
    let auth = StreamAuth::new(session_id, far.key, plan.encrypt);
    let conns: Vec<DataConn> = thread::scope(|s| {
        let hs: Vec<_> = (0..streams as u32)
            .map(|i| {
                let (addrs, auth) = (&addrs, &auth);
                crate::threads::spawn_scoped(s, "tern-stream-setup", move || -> std::io::Result<DataConn> {
                    let sock = crate::net::transport::connect_any(addrs)?;
                    crate::net::datastream::connect_stream(sock, auth, i, spec.bufsize, false)
                })
            })
            .collect();
        hs.into_iter().map(|h| h?.join().unwrap_or_else(|_| Err(std::io::Error::other("panicked")))).collect::<std::io::Result<Vec<_>>>()
    })
    .map_err(|e| TransferError::network(format!("{data_addr}: data stream: {}", err_text(&e))))?;
    let arrived = Arc::new(AtomicU64::new(0));
    let mut lanes = Vec::new();
    let mut drains = Vec::new();
    for c in conns {
        if plan.pull {
            let (arrived, chunk) = (arrived.clone(), plan.chunk_size);
            drains.push(crate::threads::spawn_or_refuse(Side::Destination, "tern-test-drain", move || drain(c, chunk, arrived))?);
        } else {
            lanes.push(Lane::new(c));
        }
    }
    let carry = |k: u16, far: &mut Far, lanes: &mut [Lane]| -> Result<Rate, TransferError> {
        far.writer.send(&Control::TestStep { what: TestWhat::Carry, count: k, millis: step_ms })?;
        if plan.pull {
            let (ours, _) = window(&arrived, Instant::now(), step_ms);
            expect_result(&mut far.reader, TestWhat::Carry, &peer)?;
            return Ok(ours);
        }
        let stop = AtomicBool::new(false);
        let (stop, reader, lanes) = (&stop, &mut far.reader, &mut lanes[..k as usize]);
        thread::scope(|s| {
            let h = crate::threads::spawn_scoped(s, "tern-probe-send", move || blast_all(lanes, plan.chunk_size, stop, None));
            let r = expect_result(reader, TestWhat::Carry, &peer);
            stop.store(true, Relaxed);
            match h {
                Ok(h) => drop(h.join()),
                Err(e) => return Err(crate::threads::refused(Side::Network, "the path test's sender", &e)),
            }
            r.map(measured)
        })
    };
    let carry_one = carry(1, &mut far, &mut lanes)?;
    // Pull: no lanes here (the far side sends); its counters are its own.
    let before = lanes.get(..streams as usize).and_then(counters);
    let carry_many = carry(streams, &mut far, &mut lanes)?;
    let sent = before.and_then(|b| lanes.get(..streams as usize).and_then(counters).map(|a| a.since(b)));
    // The far side's usable cores and what the many-stream carry kept busy there; the window
    // its CPU time was taken over: the carry's own (push), the step (pull).
    let far_cpu = if far.features & FEATURE_TEST_CPU != 0 {
        far.writer.send(&Control::TestStep { what: TestWhat::Cpu, count: 1, millis: tern_proto::msg::MIN_TEST_STEP_MS })?;
        match far.reader.recv()? {
            Control::TestResult { what: TestWhat::Cpu, skipped: false, bytes, micros, note } => {
                let window = if plan.pull { step_ms as f64 / 1e3 } else { carry_many.secs };
                Some(FarCpu { cores: bytes as f64 / 1000.0, how: note, busy: if window > 0.0 { micros as f64 / 1e6 / window } else { 0.0 } })
            }
            Control::TestResult { what: TestWhat::Cpu, .. } => None,
            Control::Fatal { side, message } => return Err(TransferError::fatal(side, format!("{message} (on {peer})"))),
            _ => return Err(TransferError::fatal(Side::Network, format!("{peer} answered a path test step with something else (is it a compatible tern?)"))),
        }
    } else {
        None
    };
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
    Ok(PathReport { peer, rtt, streams, carry_one, carry_many, write_one, write_many, hash, seal, far_cpu, sent })
}
