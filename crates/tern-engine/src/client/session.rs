//! The client end: connect (in-process, ssh or daemon), run the local role, and on network
//! errors reconnect with backoff and resume until the retry budget is spent.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use tern_proto::filter::{Filter, FilterRule};
use tern_proto::msg::{FEATURE_FILE_LIST, FEATURE_FILTERS, FEATURE_HARD_LINKS, FEATURE_IGNORE_EXISTING, FEATURE_STREAM_RESET, Role, Summary};
use tern_proto::{Control, Options};

use crate::driver::receiver::{ReceiverParams, Receiving, WINDOW_BYTES, window_files_for, window_held_for};
use crate::driver::sender::{Reopen, SendMemory, SenderParams, Sending};
use crate::endpoint::Endpoint;
use crate::error::{Scope, Side, TransferError};
use crate::net::control::{CtrlReader, CtrlWriter, ReadyAnswer};
use crate::net::datastream::{DataConn, EarlyStart, Preconnected, StreamAuth, connect_stream};
use crate::net::ratelimit::RateLimit;
use crate::net::transport::{ControlHalves, Stream, connect_any, random, tls_control_client, tune_socket};
use crate::progress::Progress;
use crate::store::walk::{SourceSpec, source_spec};

#[derive(Clone, Debug, Default)]
pub struct SshOptions {
    /// The ssh command and its arguments (`--ssh`, `TERN_SSH`), e.g. `ssh -p 2222`.
    pub command: Vec<String>,
    /// Path of tern on the remote host; by default `tern` on PATH, then the install cache.
    pub remote_bin: Option<String>,
    /// Whether a far side without this build gets it (`docs/install.md`).
    pub install: crate::client::bootstrap::Install,
    pub port_range: Option<(u16, u16)>,
    /// The remote side connects back to us (only outbound connections allowed there).
    pub reverse: bool,
    /// Keep one ssh connection per host open for a minute and run later sessions through it
    /// (ssh's ControlMaster), unless the user's own ssh setup already multiplexes.
    pub reuse: bool,
}

#[derive(Clone, Debug)]
pub struct ClientSpec {
    pub sources: Vec<Endpoint>,
    pub dest: Endpoint,
    pub options: Options,
    /// Let the stream count grow while throughput grows (no `--streams` given).
    pub adaptive: bool,
    pub max_streams: u16,
    pub ssh: SshOptions,
    pub token_file: Option<PathBuf>,
    /// The destination daemon's token in a third-party transfer, when it differs from
    /// `token_file` (which is then the source daemon's).
    pub dst_token_file: Option<PathBuf>,
    pub bwlimit: Option<u64>,
    pub bufsize: Option<usize>,
    /// How long to keep reconnecting after network errors.
    pub retry_for: Duration,
    /// `--exclude`/`--include`/`--filter` rules in command-line order.
    pub filters: Vec<FilterRule>,
    /// `--files-from`: paths under the one source directory to copy instead of all of it.
    pub files_from: Option<Arc<Vec<Vec<u8>>>>,
    /// Of one file in `files_from`, only this byte range moves, verified but not published (a
    /// unit of a spread transfer: docs/cluster.md "Stripes").
    pub stripe: Option<crate::driver::sender::Stripe>,
    /// Local source and destination paths must resolve beneath these directories at the moment
    /// of use, as a daemon's do (fsops::Beneath): the service confines its jobs with them.
    pub fences: Fences,
}

/// Directories a local source or destination must stay beneath (`--src-beneath`,
/// `--dst-beneath`); none for a user's own copy.
#[derive(Clone, Debug, Default)]
pub struct Fences {
    pub src: Option<PathBuf>,
    pub dst: Option<PathBuf>,
}

fn fence(dir: &Option<PathBuf>, side: Side) -> Result<Option<Arc<crate::store::fsops::Beneath>>, TransferError> {
    dir.as_ref()
        .map(|d| crate::store::fsops::Beneath::open(d).map(Arc::new).map_err(|e| TransferError::io(side, d.display().to_string(), "cannot open the confining directory", &e).into_fatal()))
        .transpose()
}

/// Runs a whole transfer. Per-file failures are in `progress.errors`; `Err` is a failure of the
/// transfer as a whole.
pub fn run(spec: &ClientSpec, progress: &Arc<Progress>) -> Result<Summary, TransferError> {
    let result = run_attempts(spec, progress);
    // Errors from the far end name the host they happened on.
    let remote_at = |side: Side| -> Option<String> {
        match side {
            Side::Destination => Some(&spec.dest).filter(|e| !e.is_local()).map(Endpoint::display),
            Side::Source => spec.sources.iter().find(|e| !e.is_local()).map(Endpoint::display),
            Side::Network => None,
        }
    };
    for e in progress.errors.lock().unwrap().iter_mut() {
        e.at = e.at.take().or_else(|| remote_at(e.side));
    }
    result.map_err(|mut e| {
        e.at = e.at.take().or_else(|| remote_at(e.side));
        e
    })
}

fn run_attempts(spec: &ClientSpec, progress: &Arc<Progress>) -> Result<Summary, TransferError> {
    let memory = Arc::new(Mutex::new(SendMemory::default()));
    let rate = spec.bwlimit.map(|r| Arc::new(RateLimit::new(r)));
    let started = Instant::now();
    let mut backoff = Duration::from_millis(500);
    let mut tries = 0;
    // A push's sender remembers what landed and does not announce it again; a pull's remote
    // sender (and a relay's) announces everything on each attempt.
    let carry_finished = spec.sources.iter().all(Endpoint::is_local);
    if !carry_finished && spec.dest.is_local() {
        progress.track_landed_paths();
    }
    loop {
        progress.start_attempt(carry_finished);
        let attempt = attempt(spec, progress, &memory, &rate);
        tries += 1;
        // A peer that was never reached gets three tries, not the whole budget: a typo in the
        // host name should fail in seconds. Once data moved, keep trying for `retry_for`.
        // Progress, not a manifest: the manifest is exchanged before the data streams connect,
        // so a firewalled data port would otherwise look like a peer once reached.
        let ever_connected = Progress::get(&progress.bytes) > 0 || Progress::get(&progress.files_done) > 0 || Progress::get(&progress.files_skipped) > 0;
        // A login that is refused or a name that does not resolve before anything moved is a
        // mistake to report, not an outage to wait out; after data moved it may be one.
        let permanent = |e: &TransferError| !ever_connected && matches!(e.kind, crate::error::ErrorKind::NotFound | crate::error::ErrorKind::PermissionDenied);
        match attempt {
            Err(e) if e.scope == Scope::Network && !permanent(&e) && started.elapsed() < spec.retry_for && (ever_connected || tries < 3) => {
                tracing::warn!("{e}; reconnecting in {:.1} s and resuming", backoff.as_secs_f64());
                Progress::add(&progress.reconnects, 1);
                progress.streams.store(0, Relaxed);
                // The next attempt announces only what is not finished yet.
                progress.files_total.store(Progress::get(&progress.files_done) + Progress::get(&progress.files_skipped), Relaxed);
                progress.pause_for_reconnect();
                thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(8));
            }
            other => return other,
        }
    }
}

/// What a client transfer keeps across its attempts (reconnects): the request, its display,
/// what the sender already finished, the rate limit. Each step of an attempt takes a copy.
#[derive(Clone, Copy)]
struct ClientRun<'a> {
    spec: &'a ClientSpec,
    progress: &'a Arc<Progress>,
    memory: &'a Arc<Mutex<SendMemory>>,
    rate: &'a Option<Arc<RateLimit>>,
}

/// An authenticated control channel.
struct Channel {
    reader: CtrlReader,
    writer: Arc<CtrlWriter>,
}

/// The far side of a remote attempt once it is authenticated: the session to open there and
/// how to reach its data port.
struct RemoteSession<'a> {
    session_key: [u8; 32],
    push: bool,
    remote_path: &'a str,
    /// The host the data streams go to when the server names only a port.
    data_host: &'a str,
    /// A daemon's data address: the one we reached it on, whatever `Ready` says.
    data_at: Option<&'a str>,
    /// `--reverse`: the server connects the data streams to this listener.
    reverse: Option<&'a std::net::TcpListener>,
    preconnected: Vec<thread::JoinHandle<std::io::Result<Preconnected>>>,
    /// Both ends repair corrupted streams (Hello bit 5).
    resets: bool,
    /// The server reads TLS records one at a time (Hello bit 13): streams may start early.
    early_go: bool,
}

fn attempt(spec: &ClientSpec, progress: &Arc<Progress>, memory: &Arc<Mutex<SendMemory>>, rate: &Option<Arc<RateLimit>>) -> Result<Summary, TransferError> {
    let run = ClientRun { spec, progress, memory, rate };
    let push = spec.sources.iter().all(Endpoint::is_local);
    if !push && !spec.dest.is_local() {
        return crate::client::relay::attempt(spec, progress, memory);
    }
    let remote = if push { &spec.dest } else { &spec.sources[0] };
    let mut options = spec.options;
    let secret = random::<32>();
    let key = tern_proto::auth::token_key(hex(&secret).as_bytes());
    match remote {
        Endpoint::Local(dest) => {
            // Local to local: the same engine, the receiver on threads of this process.
            let (c1, c2) = UnixStream::pair().map_err(local_err)?;
            let n = local_streams(options.streams, crate::driver::receiver::descriptor_limit());
            options.streams = n;
            let mut mine = Vec::new();
            let mut theirs = Vec::new();
            for i in 0..n {
                let (a, b) = UnixStream::pair().map_err(local_err)?;
                let (ca, cb) = (Stream::Unix(a), Stream::Unix(b));
                mine.push(DataConn { closer: ca.closer(), stream: ca, index: i as u32, tag_key: None, sealer: None, probe: None, accept: None });
                theirs.push(DataConn { closer: cb.closer(), stream: cb, index: i as u32, tag_key: None, sealer: None, probe: None, accept: None });
            }
            let server_half = ControlHalves::from_unix(c2).map_err(local_err)?;
            let params = ReceiverParams {
                destination: dest.clone(),
                multi_source: spec.sources.len() > 1,
                options,
                progress: Arc::new(Progress::default()),
                window_bytes: WINDOW_BYTES,
                window_files: window_files_for(options.concurrency),
                window_held: window_held_for(options.concurrency),
                filter: compile_filter(spec)?,
                beneath: fence(&spec.fences.dst, Side::Destination)?,
                allow_links_out: true,
                // The local sender paces (`SenderParams::rate`).
                rate: None,
            };
            let recv = crate::threads::spawn_or_refuse(Side::Destination, "tern-receive", move || {
                Receiving::new().run(CtrlReader::new(server_half.reader), Arc::new(CtrlWriter::new(server_half.writer)), theirs, params)
            })?;
            let client_half = ControlHalves::from_unix(c1).map_err(local_err)?;
            let channel = Channel { reader: CtrlReader::new(client_half.reader), writer: Arc::new(CtrlWriter::new(client_half.writer)) };
            let r = run_sender(run, options, channel, Streams::Ready(mine), None, NO_RESETS);
            let rr = recv.join().unwrap_or_else(|_| Err(TransferError::fatal(Side::Destination, "receiver thread panicked")));
            // The receiver's own error (disk full, say) says more than the sender's view.
            match (r, rr) {
                (Ok(s), _) => Ok(s),
                (Err(_), Err(e)) if e.scope == Scope::Fatal => Err(e),
                (Err(e), _) => Err(e),
            }
        }
        Endpoint::Ssh { host, port, path } => {
            let reverse = if spec.ssh.reverse {
                let l = crate::net::datastream::bind_range(spec.ssh.port_range).map_err(|e| TransferError::fatal(Side::Network, format!("--reverse: cannot listen: {e}")))?;
                Some(l)
            } else {
                None
            };
            let reverse_port = reverse.as_ref().and_then(|l| l.local_addr().ok()).map(|a| a.port());
            let mut conn = SshConn::spawn(spec, host, *port, &secret, reverse_port, progress)?;
            let mut reader = CtrlReader::new(conn.stdout.take().unwrap());
            let writer = Arc::new(CtrlWriter::new(conn.stdin.take().unwrap()));
            let data_host = ssh_host_name(host);
            let r = (|| {
                // The stream count goes into `Open`. Without `--streams` it comes from an RTT
                // sample, and over ssh only a second exchange gives one (the first answer waits
                // for the login), so Hello and Auth stay apart then; with `--streams` they go in
                // one flight. Either way the data streams start when the server says where it
                // listens (`Listening`, with its Hello): their TCP and TLS handshakes overlap
                // Auth and Open.
                let pipelined = !spec.adaptive;
                let fixed = pipelined.then_some(options.streams);
                let (n, encrypt, bufsize) = (options.streams, !options.no_encrypt(), spec.bufsize);
                let mut early: Option<EarlyStreams> = None;
                let mut on_listening = |addr: &[u8]| match data_address(&String::from_utf8_lossy(addr), &data_host) {
                    Ok(addr) => {
                        tracing::debug!("data address announced early: {addr}; opening {n} data streams now");
                        early = Some(EarlyStreams::start(addr, n, fixed, encrypt, bufsize));
                    }
                    Err(e) => tracing::debug!("early data address ignored: {e}"),
                };
                // --reverse: we listen, and the server announces nothing.
                let listening: crate::net::handshake::OnListening = if reverse.is_some() { None } else { Some(&mut on_listening) };
                let (session_key, rtt, features) = crate::net::handshake::client(&mut reader, &writer, &key, &[0; 32], host, pipelined, listening)?;
                send_filters(&writer, features, spec, !push, &format!("the tern on {host}"))?;
                options.set_hard_links(options.hard_links() && features & FEATURE_HARD_LINKS != 0);
                // A data stream's TCP connect is a cleaner sample than a message through ssh
                // and both processes, when one has finished by now.
                let rtt = early.as_ref().and_then(EarlyStreams::fastest).map_or(rtt, |c| c.min(rtt));
                initial_streams(spec, &mut options, rtt);
                let preconnected = early.map(|e| e.admit(options.streams)).unwrap_or_default();
                let remote = RemoteSession {
                    session_key,
                    push,
                    remote_path: path,
                    data_host: &data_host,
                    data_at: None,
                    reverse: reverse.as_ref(),
                    preconnected,
                    resets: resets_with(features),
                    early_go: early_go_with(features),
                };
                run_remote(run, &mut options, Channel { reader, writer }, remote)
            })();
            r.map_err(|e| conn.explain(e))
        }
        Endpoint::Daemon { host, port, path } => {
            let token = read_token(spec)?;
            let key = tern_proto::auth::token_key(&token);
            let addr = format!("{}:{port}", bracket(host));
            let connecting = Instant::now();
            let sock = connect(&addr)?;
            // The TCP handshake is one clean round trip: enough to choose the stream count now
            // and open the data streams while the control channel still authenticates.
            initial_streams(spec, &mut options, connecting.elapsed());
            let preconnected = preconnect_streams(&sock, options.streams, !options.no_encrypt(), spec.bufsize);
            tune_socket(&sock, None);
            let (reader, writer, session_key, features) = daemon_handshake(sock, &addr, &key)?;
            let writer = Arc::new(writer);
            send_filters(&writer, features, spec, !push, &format!("the daemon at {addr}"))?;
            // An older peer: further names of a file go as files, as before.
            options.set_hard_links(options.hard_links() && features & FEATURE_HARD_LINKS != 0);
            // A daemon takes data on the port we reached it on; its own view of its address (in
            // `Ready`) is wrong behind a port forward, NAT or relay.
            let remote = RemoteSession {
                session_key,
                push,
                remote_path: path,
                data_host: &bracket(host),
                data_at: Some(addr.as_str()),
                reverse: None,
                preconnected,
                resets: resets_with(features),
                early_go: early_go_with(features),
            };
            run_remote(run, &mut options, Channel { reader, writer }, remote)
        }
    }
}

/// A daemon's control channel on a connected socket: the kind byte, TLS, `Hello` and `Auth`
/// (pipelined). The reader, writer, session key and the daemon's feature bits.
pub(crate) fn daemon_handshake(sock: TcpStream, addr: &str, key: &[u8; 32]) -> Result<(CtrlReader, CtrlWriter, [u8; 32], u64), TransferError> {
    (&sock).write_all(b"C").map_err(crate::net::control::net_err)?;
    let (halves, exporter) = tls_control_client(sock).map_err(|e| TransferError::network(format!("{addr}: TLS handshake failed: {e}")))?;
    let mut reader = CtrlReader::new(halves.reader);
    let writer = CtrlWriter::new(halves.writer);
    let (session_key, _, features) = crate::net::handshake::client(&mut reader, &writer, key, &exporter, &format!("the daemon at {addr}"), true, None)?;
    Ok((reader, writer, session_key, features))
}

/// An authenticated control channel to an ssh host's `tern _remote` or a daemon, with no data
/// streams and nothing opened yet: for requests that are not transfers (`remote_fs`). It is
/// connected exactly as a transfer's (ssh launch and install, `--token-file`).
pub struct ControlSession {
    pub reader: CtrlReader,
    pub writer: CtrlWriter,
    /// The server's Hello feature bits.
    pub features: u64,
    /// The session key (data streams' proofs: `tern test`).
    pub key: [u8; 32],
    /// The far side, for messages: `the daemon at h:7700`, `the tern on user@h`.
    pub peer: String,
    ssh: Option<SshConn>,
}

impl ControlSession {
    pub fn open(spec: &ClientSpec, remote: &Endpoint, progress: &Arc<Progress>) -> Result<Self, TransferError> {
        match remote {
            Endpoint::Local(_) => Err(TransferError::fatal(Side::Network, "a local path needs no control session")),
            Endpoint::Ssh { host, port, .. } => {
                let secret = random::<32>();
                let key = tern_proto::auth::token_key(hex(&secret).as_bytes());
                let mut conn = SshConn::spawn(spec, host, *port, &secret, None, progress)?;
                let mut reader = CtrlReader::new(conn.stdout.take().unwrap());
                let writer = CtrlWriter::new(conn.stdin.take().unwrap());
                match crate::net::handshake::client(&mut reader, &writer, &key, &[0; 32], host, true, None) {
                    Ok((key, _, features)) => Ok(Self { reader, writer, features, key, peer: format!("the tern on {host}"), ssh: Some(conn) }),
                    Err(e) => Err(conn.explain(e)),
                }
            }
            Endpoint::Daemon { host, port, .. } => {
                let token = read_token(spec)?;
                let key = tern_proto::auth::token_key(&token);
                let addr = format!("{}:{port}", bracket(host));
                let sock = connect(&addr)?;
                let (reader, writer, key, features) = daemon_handshake(sock, &addr, &key)?;
                Ok(Self { reader, writer, features, key, peer: format!("the daemon at {addr}"), ssh: None })
            }
        }
    }

    /// Turns a bare "connection closed" over ssh into what ssh or the remote shell said.
    pub fn explain(&mut self, e: TransferError) -> TransferError {
        match &mut self.ssh {
            Some(c) => c.explain(e),
            None => e,
        }
    }
}

/// A local copy's streams: both ends of every one live in this process, so under a tiny
/// descriptor limit (`ulimit -n 32`) fewer leave the files their descriptors (one per 16).
fn local_streams(asked: u16, descriptor_limit: usize) -> u16 {
    asked.min((descriptor_limit / 16).clamp(1, u16::MAX as usize) as u16)
}

/// Without `--streams`: a short path needs few streams to fill (one TCP stream carries tens of
/// Gb/s at sub-millisecond RTT) and more only cost CPU and contend for the destination file's
/// lock, so start with one per core (at least 2; measured on 2 cores: a 4 GiB file over ssh on
/// loopback took 3.7 s with 2 streams, 4.1-4.6 s with 4); a long path starts at the default and
/// ramps.
fn initial_streams(spec: &ClientSpec, options: &mut Options, rtt: Duration) {
    if !spec.adaptive {
        tracing::debug!("starting with {} data streams (--streams)", options.streams);
        return;
    }
    if rtt < Duration::from_millis(2) {
        let cores = thread::available_parallelism().map_or(4, |n| n.get()) as u16;
        options.streams = options.streams.min(cores.max(2));
    }
    tracing::debug!("round trip {rtt:?}: starting with {} data streams", options.streams);
}

/// The transfer's rules, compiled; the CLI has already checked them, so an error here is a
/// caller's (the service's, a library user's) and is reported the same way.
pub(crate) fn compile_filter(spec: &ClientSpec) -> Result<Filter, TransferError> {
    Filter::new(&spec.filters).map_err(|m| TransferError::fatal(Side::Source, m))
}

/// Sends the rules and the file list before `Open`, and checks the peer can honour
/// `--ignore-existing`. A peer that cannot is refused rather than allowed to copy, overwrite or
/// (with `--delete`) remove what the user meant to leave alone. `to_sender`: the peer walks
/// (the list matters there), else it receives (`--ignore-existing` matters there).
pub(crate) fn send_filters(writer: &CtrlWriter, features: u64, spec: &ClientSpec, to_sender: bool, peer: &str) -> Result<(), TransferError> {
    let too_old = |what: &str| TransferError::fatal(Side::Network, format!("{peer} runs an older tern that cannot apply {what}; upgrade it there (or pass --install-remote over ssh)"));
    if !spec.filters.is_empty() {
        if features & FEATURE_FILTERS == 0 {
            return Err(too_old("--exclude/--include"));
        }
        writer.send(&Control::Filters(spec.filters.clone()))?;
    }
    if spec.options.ignore_existing() && !to_sender && features & FEATURE_IGNORE_EXISTING == 0 {
        return Err(too_old("--ignore-existing"));
    }
    if let Some(list) = spec.files_from.as_ref().filter(|_| to_sender) {
        if features & FEATURE_FILE_LIST == 0 {
            return Err(too_old("--files-from"));
        }
        // Cut by count and by bytes: 4,096 paths of 4 KiB each would be 16 MiB in one frame.
        for part in crate::client::session::byte_bounded(list, tern_proto::limits::MAX_LIST, tern_proto::limits::MAX_CONTROL_FRAME as usize / 2) {
            writer.send(&Control::FileList(part.to_vec()))?;
        }
    }
    if let Some(s) = &spec.stripe {
        // Both ends must know stripes: an older receiver would publish a stripe as the file.
        if features & tern_proto::msg::FEATURE_STRIPES == 0 {
            return Err(too_old("a stripe of a spread file"));
        }
        if to_sender {
            writer.send(&Control::Stripe { path: s.path.clone(), start: s.start, end: s.end })?;
        }
    }
    Ok(())
}

fn local_err(e: std::io::Error) -> TransferError {
    TransferError::fatal(Side::Source, format!("cannot set up a local transfer: {e}"))
}

pub(crate) fn bracket(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_string() }
}

/// `user@host` → `host`, for connecting data streams when the remote did not report an address.
fn ssh_host_name(dest: &str) -> String {
    bracket(dest.rsplit_once('@').map_or(dest, |(_, h)| h))
}

/// What ssh says when retrying cannot help: authentication, host keys, unknown names,
/// configuration. (ssh reports all failures with status 255; its text is all there is.)
fn ssh_failure_is_permanent(line: &str) -> bool {
    const PERMANENT: [&str; 7] = [
        "permission denied",
        "could not resolve hostname",
        "host key verification failed",
        "no such file or directory",
        "bad configuration",
        "name or service not known",
        "too many authentication failures",
    ];
    let line = line.to_lowercase();
    PERMANENT.iter().any(|p| line.contains(p))
}

pub(crate) fn connect(addr: &str) -> Result<TcpStream, TransferError> {
    // A name that does not resolve is a typo or a missing DNS entry, not an outage: say it once.
    let addrs: Vec<_> =
        addr.to_socket_addrs().map_err(|e| TransferError::network(format!("{addr}: cannot resolve: {e} (check the host name)")).with_kind(crate::error::ErrorKind::NotFound))?.collect();
    connect_any(&addrs).map_err(|e| TransferError::network(format!("{addr}: cannot connect: {} (is the daemon running and the port open?)", crate::error::err_text(&e))))
}

pub(crate) fn read_token(spec: &ClientSpec) -> Result<Vec<u8>, TransferError> {
    let Some(path) = &spec.token_file else {
        return Err(TransferError::fatal(Side::Network, "a tern:// daemon needs a token: pass --token-file FILE or set TERN_TOKEN_FILE"));
    };
    let t = std::fs::read(path).map_err(|e| TransferError::fatal(Side::Network, format!("cannot read token file {}: {}", path.display(), crate::error::err_text(&e))))?;
    Ok(t.trim_ascii().to_vec())
}

fn run_remote(run: ClientRun<'_>, options: &mut Options, channel: Channel, remote: RemoteSession<'_>) -> Result<Summary, TransferError> {
    let spec = run.spec;
    let Channel { mut reader, writer } = channel;
    let RemoteSession { session_key, push, remote_path, data_host, data_at, reverse, preconnected, resets, early_go } = remote;
    let (role, sources, destination) = if push {
        let srcs = spec.sources.iter().map(|s| s.path_str().into_bytes()).collect();
        (Role::Receiver, srcs, remote_path.as_bytes().to_vec())
    } else {
        let srcs = spec.sources.iter().map(|s| s.path_str().into_bytes()).collect();
        (Role::Sender, srcs, Vec::new())
    };
    writer.send(&Control::Open { server_role: role, options: *options, sources, destination })?;
    if let Some(listener) = reverse {
        let (session_id, _, _) = await_ready(&mut reader)?;
        let auth = StreamAuth::new(session_id, session_key, !options.no_encrypt());
        let conns = accept_reverse(listener, &auth, options.streams)?;
        // The server dialled these and nobody can open a replacement (the server decides the
        // same): a corrupted stream stays fatal, as without bit 5.
        return run_local_role(run, *options, Channel { reader, writer }, Streams::Ready(conns), None, push, NO_RESETS);
    }
    // A pushing client sends its manifest right behind `Open`, without waiting for `Ready`: the
    // server reads in order and acts on nothing before it has checked the request, so the first
    // `Want` comes a round trip sooner (docs/protocol.md, Flow). `Ready` is taken off the
    // control channel by whoever reads first; only the data streams wait for it. A pulling
    // client has nothing to send before `Ready`.
    let ready: Box<dyn FnOnce() -> Result<ReadyAnswer, TransferError> + Send> = if push {
        let (tx, rx) = crossbeam_channel::bounded(1);
        reader.hand_ready_to(tx);
        Box::new(move || rx.recv().unwrap_or_else(|_| Err(TransferError::network("control channel: closed before the server was ready"))))
    } else {
        let answer = await_ready(&mut reader)?;
        Box::new(move || Ok(answer))
    };
    let (data_at, data_host) = (data_at.map(str::to_string), data_host.to_string());
    let bufsize = spec.bufsize;
    let encrypt = !options.no_encrypt();
    // The session's stream credentials and data address, known once `Ready` is in.
    let session: Arc<OnceLock<(StreamAuth, String)>> = Arc::new(OnceLock::new());
    // One way to open a stream, for the session's first ones and the ramp's later ones.
    let open: Arc<dyn Fn(u32) -> Result<DataConn, TransferError> + Send + Sync> = {
        let session = session.clone();
        Arc::new(move |i| {
            let (auth, data_addr) = session.get().ok_or_else(|| TransferError::network("a data stream was asked for before the server was ready"))?;
            let sock = connect(data_addr)?;
            connect_stream(sock, auth, i, bufsize, push).map_err(|e| stream_error(data_addr, &e))
        })
    };
    // In parallel: each stream costs a TCP and a TLS handshake, three round trips on a WAN. And
    // in the background: the manifest and the first wants need no data stream, so the session
    // starts now and the streams join as they come (one round trip less before data moves).
    let n = options.streams as u32;
    let connecting: Connecting = {
        let open = open.clone();
        Box::new(move || {
            let (session_id, reported, cert_pin) = ready()?;
            let mut auth = StreamAuth::new(session_id, session_key, encrypt);
            auth.early = EarlyStart { go_with_hello: early_go, cert_pin };
            let data_addr = match data_at {
                Some(a) => a,
                None => data_address(&String::from_utf8_lossy(&reported), &data_host)?,
            };
            let _ = session.set((auth.clone(), data_addr.clone()));
            // Streams opened during the handshake are used if they reached the data address (a
            // daemon takes data on its control port; an ssh-mode server announced it early);
            // the rest are opened now.
            let target: Vec<_> = data_addr.to_socket_addrs().map(|a| a.collect()).unwrap_or_default();
            let preconnected: Vec<Preconnected> = preconnected.into_iter().filter_map(|h| h.join().ok()?.ok()).filter(|p| p.peer_addr().is_ok_and(|a| target.contains(&a))).collect();
            tracing::debug!("data streams: {} preconnected, {} to open", preconnected.len().min(n as usize), (n as usize).saturating_sub(preconnected.len()));
            thread::scope(|s| {
                let (open, auth, data_addr) = (&open, &auth, &data_addr);
                let mut preconnected = preconnected.into_iter();
                let handles: Vec<_> = (0..n)
                    .map(|i| match preconnected.next() {
                        Some(p) => crate::threads::spawn_scoped(s, "tern-stream-setup", move || p.introduce(auth, i, push).map_err(|e| stream_error(data_addr, &e))),
                        None => crate::threads::spawn_scoped(s, "tern-stream-setup", move || open(i)),
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| match h {
                        Ok(h) => h.join().unwrap_or_else(|_| Err(TransferError::network("stream setup panicked"))),
                        Err(e) => Err(crate::threads::refused(if push { Side::Source } else { Side::Destination }, "a data stream", &e)),
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
        })
    };
    let reopen: Reopen = open.clone();
    let opener = move |i: u32| open(i).ok();
    run_local_role(run, *options, Channel { reader, writer }, Streams::Connecting(connecting), Some(Box::new(opener)), push, (resets, Some(reopen)))
}

/// The server's answer to `Open`: its session id and data address, or its refusal.
fn await_ready(reader: &mut CtrlReader) -> Result<ReadyAnswer, TransferError> {
    match reader.recv()? {
        Control::Ready { session_id, data_addr, cert_pin, .. } => Ok((session_id, data_addr, cert_pin)),
        Control::Fatal { side, message } => Err(TransferError::fatal(side, message)),
        _ => Err(TransferError::fatal(Side::Network, "expected the server to be ready")),
    }
}

fn stream_error(data_addr: &str, e: &std::io::Error) -> TransferError {
    TransferError::network(format!("data stream to {data_addr}: {e}"))
}

/// The data address a server reported. An unspecified or wildcard host means: the host we
/// already reached.
fn data_address(reported: &str, data_host: &str) -> Result<String, TransferError> {
    match reported.rsplit_once(':') {
        Some((ip, port)) if ip.is_empty() || ip == "0.0.0.0" || ip == "[::]" => Ok(format!("{data_host}:{port}")),
        Some(_) => Ok(reported.to_string()),
        None => Err(TransferError::fatal(Side::Network, "the server reported no data address; is the remote tern a compatible version?")),
    }
}

/// Data streams started when an ssh-mode server announced its data address (`Listening`),
/// while the control channel still authenticates and the stream count may not be known yet.
/// Each connects TCP at once (its connect time is an RTT sample), then waits at the gate: the
/// first `count` to get through go on with TLS, the surplus close before sending a byte, so a
/// short path that ends up with fewer streams pays for no TLS handshake it does not use.
struct EarlyStreams {
    gate: Arc<(Mutex<Gate>, Condvar)>,
    handles: Vec<thread::JoinHandle<std::io::Result<Preconnected>>>,
}

#[derive(Default)]
struct Gate {
    count: Option<u16>,
    admitted: u16,
    fastest: Option<Duration>,
}

impl EarlyStreams {
    /// `count`: how many may go on, if already known (`--streams`).
    fn start(addr: String, n: u16, count: Option<u16>, encrypt: bool, bufsize: Option<usize>) -> Self {
        let gate = Arc::new((Mutex::new(Gate { count, ..Gate::default() }), Condvar::new()));
        let handles = (0..n)
            .filter_map(|_| {
                let (gate, addr) = (gate.clone(), addr.clone());
                // Without a thread, one early stream fewer: the session opens what is missing.
                crate::threads::spawn("tern-early", move || {
                    let started = Instant::now();
                    let sock = connect_io(&addr)?;
                    let took = started.elapsed();
                    let (lock, opened) = &*gate;
                    let mut g = lock.lock().unwrap();
                    g.fastest = Some(g.fastest.map_or(took, |f| f.min(took)));
                    let mut g = opened.wait_while(g, |g| g.count.is_none()).unwrap();
                    if g.admitted >= g.count.unwrap_or(0) {
                        return Err(std::io::Error::other("surplus early data stream, closed"));
                    }
                    g.admitted += 1;
                    drop(g);
                    crate::net::datastream::preconnect(sock, encrypt, bufsize)
                })
                .ok()
            })
            .collect();
        Self { gate, handles }
    }

    /// The quickest TCP connect so far.
    fn fastest(&self) -> Option<Duration> {
        self.gate.0.lock().unwrap().fastest
    }

    fn open_gate(&self, count: u16) {
        let (lock, opened) = &*self.gate;
        let mut g = lock.lock().unwrap();
        g.count.get_or_insert(count);
        opened.notify_all();
    }

    /// Lets `count` streams go on (unless the count was fixed at the start) and hands them over.
    fn admit(mut self, count: u16) -> Vec<thread::JoinHandle<std::io::Result<Preconnected>>> {
        self.open_gate(count);
        std::mem::take(&mut self.handles)
    }
}

impl Drop for EarlyStreams {
    /// A session that fails before the count is known lets no stream wait.
    fn drop(&mut self) {
        self.open_gate(0);
    }
}

/// `connect` for threads that report `io::Error`s.
fn connect_io(addr: &str) -> std::io::Result<TcpStream> {
    connect_any(&addr.to_socket_addrs()?.collect::<Vec<_>>())
}

/// Starts the TCP and TLS handshakes of `n` data streams to the peer of `control` (a daemon's
/// one port) on their own threads; `run_remote` picks them up once the session exists.
fn preconnect_streams(control: &TcpStream, n: u16, encrypt: bool, bufsize: Option<usize>) -> Vec<thread::JoinHandle<std::io::Result<Preconnected>>> {
    let Ok(peer) = control.peer_addr() else { return Vec::new() };
    (0..n)
        // Without a thread, one stream fewer preconnected: the session opens what is missing.
        .filter_map(|_| {
            crate::threads::spawn("tern-preconnect", move || {
                let sock = TcpStream::connect_timeout(&peer, Duration::from_secs(10))?;
                crate::net::datastream::preconnect(sock, encrypt, bufsize)
            })
            .ok()
        })
        .collect()
}

/// `--reverse`: the remote side connects to our listener. Each stream's TLS handshake and
/// go-ahead take round trips, so streams are set up side by side, not one after another.
fn accept_reverse(listener: &std::net::TcpListener, auth: &StreamAuth, n: u16) -> Result<Vec<DataConn>, TransferError> {
    listener.set_nonblocking(true).map_err(crate::net::control::net_err)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut accepted = 0;
    let mut conns = Vec::new();
    while conns.len() < n as usize {
        if accepted < n {
            match listener.accept() {
                Ok((sock, _)) => {
                    accepted += 1;
                    let (tx, auth, refused) = (tx.clone(), auth.clone(), tx.clone());
                    let started = crate::threads::spawn("tern-accept", move || {
                        let setup = || -> std::io::Result<DataConn> {
                            sock.set_nonblocking(false)?;
                            let mut kind = [0u8; 1];
                            (&sock).read_exact(&mut kind)?;
                            crate::net::datastream::accept_stream(sock, kind[0])?.finish(&auth)
                        };
                        let _ = tx.send(setup());
                    });
                    if let Err(e) = started {
                        let _ = refused.send(Err(e));
                    }
                    continue;
                }
                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => {
                    return Err(TransferError::network(format!("--reverse: cannot accept the remote side's connection: {e}")));
                }
                Err(_) => {}
            }
        }
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok(Ok(c)) => conns.push(c),
            Ok(Err(e)) => return Err(TransferError::network(format!("--reverse data stream: {e}"))),
            Err(_) if Instant::now() < deadline => {}
            Err(_) => return Err(TransferError::network("--reverse: the remote side did not connect back within 30 s (is our port reachable from it?)")),
        }
    }
    conns.sort_by_key(|c| c.index);
    Ok(conns)
}

fn run_local_role(run: ClientRun<'_>, options: Options, channel: Channel, streams: Streams, opener: Option<Opener>, push: bool, repair: Repairing) -> Result<Summary, TransferError> {
    let options = &options;
    let ClientRun { spec, progress, rate, .. } = run;
    if push {
        run_sender(run, *options, channel, streams, opener, repair)
    } else {
        let Channel { reader, writer } = channel;
        let receiving = Receiving::new().with_resets(repair.0, repair.1);
        let (add, fail) = (receiving.feed(), receiving.feed());
        let conns = attach_streams(spec, progress, streams, opener, Arc::new(move |c| add.add(c)), Box::new(move |e| fail.fail(e)));
        let params = ReceiverParams {
            destination: match &spec.dest {
                Endpoint::Local(p) => p.clone(),
                _ => unreachable!("pull has a local destination"),
            },
            multi_source: spec.sources.len() > 1,
            options: *options,
            progress: progress.clone(),
            window_bytes: WINDOW_BYTES,
            window_files: window_files_for(options.concurrency),
            window_held: window_held_for(options.concurrency),
            filter: compile_filter(spec)?,
            beneath: fence(&spec.fences.dst, Side::Destination)?,
            allow_links_out: true,
            rate: rate.clone(),
        };
        receiving.run(reader, writer, conns, params)
    }
}

type Opener = Box<dyn Fn(u32) -> Option<DataConn> + Send>;
/// Whether corrupted streams are reset and repaired (the server has Hello feature bit 5), and
/// how to open a replacement (`docs/protocol.md`, "Repairing a corrupted data stream").
type Repairing = (bool, Option<Reopen>);
const NO_RESETS: Repairing = (false, None);

/// Whether the server reads its data streams' TLS records one at a time (`FEATURE_EARLY_GO`).
fn early_go_with(server_features: u64) -> bool {
    server_features & crate::net::handshake::our_features() & tern_proto::msg::FEATURE_EARLY_GO != 0
}

/// Whether this session repairs corrupted data streams: both ends have Hello feature bit 5.
fn resets_with(server_features: u64) -> bool {
    server_features & crate::net::handshake::our_features() & FEATURE_STREAM_RESET != 0
}
type Connecting = Box<dyn FnOnce() -> Result<Vec<DataConn>, TransferError> + Send>;

/// A session's initial data streams: set up already, or still connecting.
enum Streams {
    Ready(Vec<DataConn>),
    Connecting(Connecting),
}

/// Hands a running side its initial streams (returned, or added as they finish connecting,
/// with `fail` if they cannot) and starts the ramp on them.
fn attach_streams(
    spec: &ClientSpec,
    progress: &Arc<Progress>,
    streams: Streams,
    opener: Option<Opener>,
    add: Arc<dyn Fn(DataConn) + Send + Sync>,
    fail: Box<dyn FnOnce(TransferError) + Send>,
) -> Vec<DataConn> {
    let ramp = opener.filter(|_| spec.adaptive).map(|o| (o, progress.clone(), spec.max_streams, add.clone()));
    let start_ramp_on = move |conns: &[DataConn]| {
        if let Some((opener, progress, max, add)) = ramp {
            start_ramp(progress, conns, max, opener, Box::new(move |c| add(c)));
        }
    };
    match streams {
        Streams::Ready(conns) => {
            start_ramp_on(&conns);
            conns
        }
        Streams::Connecting(connect) => {
            // `fail` is called once: by the thread, or here if no thread could be started.
            let fail = Arc::new(Mutex::new(Some(fail)));
            let failing = fail.clone();
            let started = crate::threads::spawn("tern-connect", move || match connect() {
                Ok(conns) => {
                    start_ramp_on(&conns);
                    conns.into_iter().for_each(|c| add(c));
                }
                Err(e) => {
                    if let Some(fail) = failing.lock().unwrap().take() {
                        fail(e);
                    }
                }
            });
            if let Err(e) = started
                && let Some(fail) = fail.lock().unwrap().take()
            {
                fail(crate::threads::refused(Side::Network, "tern-connect", &e));
            }
            Vec::new()
        }
    }
}

fn run_sender(run: ClientRun<'_>, options: Options, channel: Channel, streams: Streams, opener: Option<Opener>, repair: Repairing) -> Result<Summary, TransferError> {
    let ClientRun { spec, progress, memory, rate } = run;
    let Channel { reader, writer } = channel;
    let beneath = fence(&spec.fences.src, Side::Source)?;
    let sources = spec
        .sources
        .iter()
        .map(|s| match s {
            Endpoint::Local(p) => SourceSpec { beneath: beneath.clone(), ..source_spec(p, options.contents()) },
            _ => unreachable!("push has local sources"),
        })
        .collect();
    let sending = Sending::new().with_resets(repair.0, repair.1);
    let (add, fail) = (sending.feed(), sending.feed());
    let conns = attach_streams(spec, progress, streams, opener, Arc::new(move |c| add.add(c)), Box::new(move |e| fail.fail(e)));
    let params = SenderParams {
        sources,
        options,
        progress: progress.clone(),
        memory: memory.clone(),
        rate: rate.clone(),
        filter: compile_filter(spec)?,
        list: spec.files_from.clone(),
        stripe: spec.stripe.clone(),
    };
    sending.run(reader, writer, conns, params)
}

/// Drives the stream ramp (`tern_proto::ramp`: when to add streams, decided without I/O) with
/// the clock, what the kernel says the sockets delivered (`TCP_INFO`), and the opener.
fn start_ramp(progress: Arc<Progress>, initial: &[DataConn], max: u16, opener: Opener, add: Box<dyn Fn(DataConn) + Send>) {
    let mut probes: Vec<TcpStream> = initial.iter().filter_map(|c| c.probe.as_ref().and_then(|p| p.try_clone().ok())).collect();
    if probes.is_empty() {
        return;
    }
    let start = initial.len() as u32;
    // Without a thread for it, the session keeps the streams it has.
    let _ = crate::threads::spawn("tern-ramp", move || {
        let delivered = |probes: &[TcpStream]| probes.iter().filter_map(crate::net::transport::delivered_bytes).sum::<u64>();
        let bytes_left = || {
            let moved = Progress::get(&progress.bytes) + Progress::get(&progress.bytes_skipped);
            Progress::get(&progress.bytes_total).saturating_sub(moved)
        };
        let epoch = Instant::now();
        let mut ramp = tern_proto::ramp::Ramp::new(Duration::ZERO, delivered(&probes), start, max as u32);
        while let Some(due) = ramp.poll_timeout() {
            thread::sleep(due.saturating_sub(epoch.elapsed()));
            if Progress::get(&progress.streams) == 0 {
                return; // the session is over
            }
            match ramp.sample(epoch.elapsed(), delivered(&probes), bytes_left()) {
                tern_proto::ramp::RampAction::Open(n) => {
                    let first = ramp.streams() - n;
                    let mut opened = 0;
                    for i in first..first + n {
                        let Some(c) = opener(i) else { break };
                        if let Some(p) = c.probe.as_ref().and_then(|p| p.try_clone().ok()) {
                            probes.push(p);
                        }
                        add(c);
                        opened += 1;
                    }
                    ramp.opened(n, opened);
                    tracing::debug!("ramp: {} streams", ramp.streams());
                }
                tern_proto::ramp::RampAction::WaitUntil(_) => {}
                tern_proto::ramp::RampAction::Done => return,
            }
        }
    });
}

/// The ssh child process carrying the control channel.
struct SshConn {
    /// `None` once handed to the reaper (see `Drop`).
    child: Option<Child>,
    stdin: Option<Box<dyn Write + Send>>,
    stdout: Option<Box<dyn Read + Send>>,
    stderr_tail: Arc<Mutex<Vec<String>>>,
    host: String,
    /// Started through the install script (its exit statuses mean what `bootstrap` says).
    bootstrap: bool,
}

impl SshConn {
    fn spawn(spec: &ClientSpec, host: &str, port: Option<u16>, secret: &[u8; 32], reverse_port: Option<u16>, progress: &Arc<Progress>) -> Result<Self, TransferError> {
        let mut remote_args = String::new();
        if let Some(p) = reverse_port {
            remote_args.push_str(&format!(" --reverse-port {p}"));
        } else if let Some((lo, hi)) = spec.ssh.port_range {
            remote_args.push_str(&format!(" --port-range {lo}-{hi}"));
        }
        // `--remote-bin` names the program; otherwise a script finds (or installs) this build.
        // We understand `Listening`: the far tern may speak first (one round trip less; an older
        // one ignores the variable).
        let early = crate::net::handshake::our_features() & tern_proto::msg::FEATURE_EARLY_DATA_ADDR != 0;
        let env = if early { format!("{}=1", crate::net::handshake::EARLY_HELLO_ENV) } else { String::new() };
        let remote_cmd = match &spec.ssh.remote_bin {
            Some(bin) if early => format!("env {env} {bin} _remote{remote_args}"),
            Some(bin) => format!("{bin} _remote{remote_args}"),
            None => crate::client::bootstrap::remote_command(spec.ssh.install, &env, remote_args.trim_start()),
        };
        let mut cmd = ssh_command(spec, host, port);
        cmd.arg(remote_cmd).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| TransferError::fatal(Side::Network, format!("cannot run {:?}: {e} (set --ssh or TERN_SSH)", spec.ssh.command)))?;
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let tail: Arc<Mutex<Vec<String>>> = Arc::default();
        let t = tail.clone();
        let reading = crate::threads::spawn("tern-ssh-err", move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                tracing::debug!("remote: {line}");
                let mut t = t.lock().unwrap();
                t.push(line);
                if t.len() > 20 {
                    t.remove(0);
                }
            }
        });
        if let Err(e) = reading {
            let _ = child.kill();
            let _ = child.wait();
            return Err(crate::threads::refused(Side::Network, "tern-ssh-err", &e));
        }
        let (mut stdin, stdout): (Box<dyn Write + Send>, Box<dyn Read + Send>) = if spec.ssh.remote_bin.is_some() {
            (Box::new(stdin), Box::new(stdout))
        } else {
            if spec.ssh.install != crate::client::bootstrap::Install::Never {
                crate::client::bootstrap::prepare_payload();
            }
            let p = progress.clone();
            let (w, r) = crate::client::bootstrap::wrap(stdin, stdout, host, Arc::new(move |m| p.notice(m)));
            (Box::new(w), Box::new(r))
        };
        stdin.write_all(format!("TERN-SECRET {}\n", hex(secret)).as_bytes()).map_err(crate::net::control::net_err)?;
        Ok(Self { child: Some(child), stdin: Some(stdin), stdout: Some(stdout), stderr_tail: tail, host: host.to_string(), bootstrap: spec.ssh.remote_bin.is_none() })
    }

    /// Turns a bare "connection closed" into what ssh or the remote shell said.
    fn explain(&mut self, e: TransferError) -> TransferError {
        if e.kind != crate::error::ErrorKind::ControlClosed {
            return e;
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        let status = loop {
            match self.child.as_mut().map_or(Ok(None), Child::try_wait) {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                _ => break None,
            }
        };
        thread::sleep(Duration::from_millis(50));
        let tail = self.stderr_tail.lock().unwrap().clone();
        // The most telling line: an error line if there is one, else the last one.
        let last = tail.iter().rev().find(|l| l.to_lowercase().contains("error") || l.starts_with("tern")).or_else(|| tail.iter().rev().find(|l| !l.trim().is_empty())).cloned().unwrap_or_default();
        let code = status.and_then(|s| s.code());
        if let Some(e) = code.filter(|_| self.bootstrap).and_then(|c| crate::client::bootstrap::explain_exit(c, &self.host)) {
            return e;
        }
        match code {
            Some(127) => TransferError::fatal(Side::Network, format!("{}: the --remote-bin program was not found there; check the path", self.host)),
            // ssh's own failures: a login or a name that cannot work now will not work in a
            // second either (unlike a dropped connection), so they are not retried.
            Some(255) if ssh_failure_is_permanent(&last) => TransferError::network(format!("ssh to {} failed: {last}", self.host)).with_kind(crate::error::ErrorKind::PermissionDenied),
            Some(255) => TransferError::network(format!("ssh to {} failed: {last}", self.host)),
            Some(2) => {
                TransferError::fatal(Side::Network, format!("the tern on {} did not understand us (an older version? upgrade it, or drop --remote-bin to let tern install its own): {last}", self.host))
            }
            Some(_) | None if !last.is_empty() => TransferError::new(e.side, e.scope, e.path.clone(), format!("{} (remote said: {last})", e.message)),
            _ => e,
        }
    }
}

impl Drop for SshConn {
    /// Closes our end and lets ssh finish on its own: the session's work is over (or failed and
    /// explained), and ssh's exit status would take another half round trip to arrive. A
    /// thread reaps it (a long-running watcher or service must not collect zombies) and kills
    /// it if it lingers.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let Some(child) = self.child.take() else { return };
        let child = Arc::new(Mutex::new(Some(child)));
        let reaping = child.clone();
        let started = crate::threads::spawn("tern-reap", move || {
            let Some(mut child) = reaping.lock().unwrap().take() else { return };
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        });
        // No thread to wait for it gracefully: end it now rather than leave a zombie.
        if started.is_err()
            && let Some(mut child) = child.lock().unwrap().take()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The ssh command line for `host` as the engine runs it (the user's `--ssh`, batch mode; an
/// endpoint's port as `-p`, after the user's options so that it wins).
pub fn ssh_command(spec: &ClientSpec, host: &str, port: Option<u16>) -> Command {
    let argv = if spec.ssh.command.is_empty() { vec!["ssh".to_string()] } else { spec.ssh.command.clone() };
    let mut cmd = Command::new(&argv[0]);
    // No X11 or agent forwarding, never a password prompt on our pipes; keep the user's config.
    cmd.args(&argv[1..]).args(["-x", "-a", "-oBatchMode=yes"]);
    if let Some(p) = port {
        cmd.arg("-p").arg(p.to_string());
    }
    if spec.ssh.reuse {
        cmd.args(crate::net::sshmux::options(&argv, host));
    }
    cmd.args(["--", host]);
    cmd
}

/// Consecutive slices of `items` holding at most `count` paths and about `bytes` bytes of them
/// (a single longer path still goes alone).
pub(crate) fn byte_bounded(items: &[Vec<u8>], count: usize, bytes: usize) -> Vec<&[Vec<u8>]> {
    let mut parts = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (i, item) in items.iter().enumerate() {
        let n = item.len() + 8;
        if i > start && (i - start >= count || size + n > bytes) {
            parts.push(&items[start..i]);
            (start, size) = (i, 0);
        }
        size += n;
    }
    if start < items.len() {
        parts.push(&items[start..]);
    }
    parts
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_copy_opens_fewer_streams_only_under_a_tiny_descriptor_limit() {
        assert_eq!(local_streams(4, 20_000), 4);
        assert_eq!(local_streams(4, 32), 2);
        assert_eq!(local_streams(4, 8), 1);
        // A million descriptors (a common hard limit, raised to at start): never zero streams.
        assert_eq!(local_streams(4, 1 << 20), 4);
        assert_eq!(local_streams(4, 1 << 24), 4);
    }

    fn listen() -> (String, crossbeam_channel::Receiver<crate::net::datastream::PendingStream>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, rx) = crossbeam_channel::bounded(64);
        thread::spawn(move || crate::net::datastream::accept_data_streams(listener, tx));
        (addr, rx)
    }

    fn admitted(handles: Vec<thread::JoinHandle<std::io::Result<Preconnected>>>) -> Vec<Preconnected> {
        handles.into_iter().filter_map(|h| h.join().unwrap().ok()).collect()
    }

    /// Early streams wait at the gate until the count is known; the surplus close before
    /// sending a byte, and the ssh-mode listener, which also shrugs off a scan and a broken
    /// TLS handshake, still takes the admitted ones into the session.
    #[test]
    fn surplus_early_streams_close_and_the_listener_takes_the_rest() {
        let (addr, rx) = listen();
        drop(TcpStream::connect(&addr).unwrap());
        (&TcpStream::connect(&addr).unwrap()).write_all(b"D\x16\x03\x01garbage").unwrap();
        let early = EarlyStreams::start(addr.clone(), 5, None, true, None);
        let deadline = Instant::now() + Duration::from_secs(10);
        while early.fastest().is_none() {
            assert!(Instant::now() < deadline, "no early stream connected");
            thread::sleep(Duration::from_millis(5));
        }
        let ok = admitted(early.admit(2));
        assert_eq!(ok.len(), 2, "exactly the admitted streams go on");
        let auth = StreamAuth::new([1; 16], [2; 32], true);
        let server_auth = auth.clone();
        let server = thread::spawn(move || {
            let pending: Vec<_> = (0..2).map(|_| rx.recv_timeout(Duration::from_secs(10)).expect("an admitted stream said hello")).collect();
            let conns = crate::net::datastream::finish_all(pending, &server_auth).unwrap();
            assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "a surplus stream reached the session");
            conns.len()
        });
        let auth = &auth;
        let conns: Vec<DataConn> = thread::scope(|s| {
            let handles: Vec<_> = ok.into_iter().zip(0u32..).map(|(p, i)| s.spawn(move || p.introduce(auth, i, false).unwrap())).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(conns.len(), 2);
        assert_eq!(server.join().unwrap(), 2);
    }

    /// With `--streams` the count is fixed at the start: all go on, whatever `admit` says.
    #[test]
    fn fixed_count_admits_all() {
        let (addr, _rx) = listen();
        let early = EarlyStreams::start(addr, 3, Some(3), false, None);
        assert_eq!(admitted(early.admit(1)).len(), 3);
    }

    /// A session that fails before the count is known lets no early stream wait.
    #[test]
    fn dropped_gate_releases_waiting_streams() {
        let (addr, _rx) = listen();
        let mut early = EarlyStreams::start(addr, 3, None, true, None);
        let handles = std::mem::take(&mut early.handles);
        drop(early);
        assert_eq!(admitted(handles).len(), 0);
    }

    #[test]
    fn wildcard_data_address_means_the_ssh_host() {
        assert_eq!(data_address(":5000", "h").unwrap(), "h:5000");
        assert_eq!(data_address("[::]:5000", "[::1]").unwrap(), "[::1]:5000");
        assert_eq!(data_address("192.0.2.1:5000", "h").unwrap(), "192.0.2.1:5000");
        assert!(data_address("nonsense", "h").is_err());
    }
}
