//! The serving end of a session: a `tern serve` daemon connection, or `tern` started over ssh.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use tern_proto::Control;
use tern_proto::filter::Filter;
use tern_proto::msg::{MAX_FILE_LIST, MAX_FILE_LIST_BYTES, Role, Summary};

use crate::driver::receiver::{ReceiverParams, Receiving};
use crate::driver::sender::{SendMemory, SenderParams, Sending, Stripe};
use crate::error::{Side, TransferError};
use crate::limits::{Admit, Conn, Gate, Limits};
use crate::net::control::{CtrlReader, CtrlWriter};
use crate::net::datastream::{DataConn, PendingStream, StreamAuth, accept_data_streams, accept_stream, bind_range};
use crate::net::dial::DialPolicy;
use crate::net::handshake::{Announce, EARLY_HELLO_ENV};
use crate::net::transport::{ControlHalves, random, tls_control_server, tune_socket};
use crate::progress::Progress;
use crate::server::hook::Hooks;
use crate::store::roots::Roots;
use crate::store::walk::{SourceSpec, source_spec};

/// Everything a served session is besides its control channel and its incoming data streams:
/// who it authenticates, where it may reach, how the client finds its data port.
pub struct ServedSession<'a> {
    /// The control channel's TLS exporter value (zeros over ssh, which authenticated the user).
    pub exporter: [u8; 32],
    pub secret_key: [u8; 32],
    pub roots: &'a Roots,
    pub session_id: [u8; 16],
    /// Where the client connects its data streams.
    pub data_addr: String,
    /// Whether and when the client hears `data_addr` before `Ready` (`Listening`, ssh mode).
    pub announce: Announce,
    /// `--reverse`: this side connects the data streams, to this address.
    pub reverse_to: Option<String>,
    pub progress: Arc<Progress>,
    pub hooks: &'a Hooks,
    /// A `tern serve` connection's admission, dial policy and access record (ssh mode: none).
    pub daemon: Option<&'a DaemonConn>,
}

/// Serves one session on an established control channel. `streams` delivers the data streams
/// that name `session_id`. `announce`: send `data_addr` early (`Listening`, ssh mode) to a
/// client that understands it. `daemon`: a `tern serve` connection's admission, dial policy
/// and access record (ssh mode: none, and no third-party dialling).
pub fn serve_session(halves: ControlHalves, streams: Receiver<PendingStream>, served: ServedSession<'_>) -> Result<Summary, TransferError> {
    let ServedSession { exporter, secret_key, roots, session_id, data_addr, announce, reverse_to, progress, hooks, daemon } = served;
    // However the session ends, the control channel closes with it: the engine's control
    // reader thread may still hold the socket, and a relaying client (third-party) has no data
    // stream of its own that would tell it the session is over.
    let closer = halves.closer.clone();
    let _close = Defer(move || closer.close());
    let mut reader = CtrlReader::new(halves.reader);
    let writer = Arc::new(CtrlWriter::new(halves.writer).with_public_names(roots.public_names()));
    let (key, client_features) = crate::net::handshake::server(&mut reader, &writer, &secret_key, &exporter, announce, data_addr.as_bytes())?;
    let refuse = |m: String| {
        let _ = writer.send(&Control::Fatal { side: Side::Network, message: m.clone() });
        TransferError::fatal(Side::Network, m)
    };
    if let Some(d) = daemon {
        d.record("auth=token op=none".into());
        d.conn.lock().unwrap().authenticated(true).map_err(refuse)?;
    }
    // Before Open: the transfer's rules and its file list, if it has them.
    let mut filter = Filter::default();
    let mut list: Option<Vec<Vec<u8>>> = None;
    let mut list_bytes = 0usize;
    let mut stripe: Option<Stripe> = None;
    let request = loop {
        match reader.recv()? {
            Control::Filters(rules) => filter = Filter::new(&rules).map_err(refuse)?,
            Control::FileList(paths) => {
                let l = list.get_or_insert_with(Vec::new);
                list_bytes += paths.iter().map(Vec::len).sum::<usize>();
                if l.len() + paths.len() > MAX_FILE_LIST || list_bytes > MAX_FILE_LIST_BYTES {
                    return Err(refuse(format!("--files-from lists more than {MAX_FILE_LIST} paths or {} MiB of names; split the list into several transfers", MAX_FILE_LIST_BYTES >> 20)));
                }
                l.extend(paths);
            }
            Control::Stripe { path, start, end } => {
                if stripe.is_some() || !list.as_ref().is_some_and(|l| l.contains(&path)) {
                    return Err(refuse("a stripe names a file the session's list does not hold, or comes twice".to_string()));
                }
                stripe = Some(Stripe { path, start, end });
            }
            other => break other,
        }
    };
    let (role, options, sources, destination) = match request {
        Control::Open { server_role, options, sources, destination } => (server_role, options, sources, destination),
        Control::Hook { name, path } => {
            if let Some(d) = daemon {
                d.record(format!("auth=token op=hook name={:?} path={:?}", String::from_utf8_lossy(name.as_bytes()), String::from_utf8_lossy(&path)));
            }
            return crate::server::hook::serve(hooks, roots, &name, &path, &writer).map(|_| Summary::default());
        }
        Control::FsRequest { op, flags, path } => {
            if let Some(d) = daemon {
                d.record(format!("auth=token op={} flags={flags} path={:?}", op.as_str(), String::from_utf8_lossy(&path)));
            }
            return crate::server::remote_fs::serve(roots, op, flags, &path, &writer).map(|_| Summary::default());
        }
        Control::ClusterRequest => {
            if let Some(d) = daemon {
                d.record("auth=token op=cluster".into());
            }
            return crate::server::cluster::serve(&writer).map(|_| Summary::default());
        }
        Control::TestRequest { path, flags, streams: n, chunk_size } => {
            if let Some(d) = daemon {
                d.record(format!("auth=token op=test dest={:?} streams={n}", String::from_utf8_lossy(&path)));
            }
            let served = crate::server::probe::Served { roots, session_id, data_addr, key, daemon: daemon.is_some() };
            return crate::server::probe::serve(&mut reader, &writer, streams, served, crate::server::probe::Request { path, flags, streams: n, chunk_size }).map(|_| Summary::default());
        }
        _ => return Err(TransferError::fatal(Side::Network, "expected an open request")),
    };
    let prepared = (|| -> Result<_, TransferError> {
        Ok(match role {
            Role::Sender => {
                let specs = sources
                    .iter()
                    .map(|s| {
                        let p = roots.resolve(s)?;
                        let beneath = roots.beneath(&p).map_err(|e| TransferError::io(Side::Source, p.display().to_string(), "daemon root unavailable", &e).into_fatal())?.map(Arc::new);
                        Ok(SourceSpec { beneath, ..source_spec(&p, options.contents()) })
                    })
                    .collect::<Result<Vec<_>, TransferError>>()?;
                if list.is_none() {
                    crate::store::walk::check_sources(&specs, options.recursive())?;
                }
                (specs, PathBuf::new())
            }
            Role::Receiver => (Vec::new(), roots.resolve(&destination)?),
        })
    })();
    if let Some(d) = daemon {
        d.record(access_request(role, options, &sources, &destination));
    }
    let prepared = prepared.and_then(|p| Ok((p, third_party_dial(&mut reader, role, options, daemon.map(|d| &*d.policy))?)));
    let ((specs, dest), dial) = match prepared {
        Ok(x) => x,
        Err(e) => {
            let _ = writer.send(&Control::Fatal { side: e.side, message: e.message_with_path() });
            return Err(e);
        }
    };
    // The pin lets a client with the bit push before `DataAccept` (docs/protocol.md).
    let cert_pin = (client_features & tern_proto::msg::FEATURE_EARLY_GO != 0).then(crate::net::transport::server_cert_pin);
    writer.send(&Control::Ready { session_id, data_addr: data_addr.into_bytes(), nonce: random(), cert_pin })?;
    let encrypt = !options.no_encrypt();
    // A third-party receiver's streams come from the sending daemon, which holds only the
    // ticket the client derived from our session key, never the key itself.
    let stream_key = if options.third_party() && role == Role::Receiver { tern_proto::auth::stream_ticket(&key) } else { key };
    let auth = StreamAuth::new(session_id, stream_key, encrypt);
    let mut conns = Vec::new();
    if let Some(addr) = &reverse_to {
        // --reverse: only outbound connections are allowed here, so we connect to the client.
        let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(addr.as_str()).map_err(|e| TransferError::network(format!("--reverse: the client at {addr}: {e}")))?.collect();
        conns = dial_streams(&addrs, &auth, 0..options.streams as u32, "--reverse: the client")?;
    } else if let Some(d) = &dial {
        let theirs = StreamAuth::new(d.session_id, d.ticket, encrypt);
        conns = match dial_peer(&d.addrs, &d.addr, &theirs, options.streams) {
            Ok(c) => c,
            Err(e) => {
                let _ = writer.send(&Control::Fatal { side: e.side, message: e.message.clone() });
                return Err(e);
            }
        };
    }
    // Streams the client opens join the session as they arrive; the control exchange (the
    // manifest, the first wants) goes on meanwhile instead of waiting a round trip for them.
    let expect_client_streams = conns.is_empty();
    // Corrupted data streams are reset and repaired if the client can (Hello bit 5). The client
    // opens the replacements; they join like any late stream. Not in a third-party session,
    // whose relaying client does not pass the messages on, nor with --reverse, where nobody
    // could open a replacement and the last reset would leave the session without streams.
    let resets = client_features & tern_proto::msg::FEATURE_STREAM_RESET != 0 && !options.third_party() && reverse_to.is_none();
    let forward = move |feed: Box<dyn Fn(DataConn) + Send + Sync>, fail: Box<dyn Fn(TransferError) + Send + Sync>| {
        let feed: Arc<dyn Fn(DataConn) + Send + Sync> = Arc::from(feed);
        let fail: Arc<dyn Fn(TransferError) + Send + Sync> = Arc::from(fail);
        let failing = fail.clone();
        let started = crate::threads::spawn("tern-streams", move || {
            let joined = Arc::new(std::sync::atomic::AtomicBool::new(!expect_client_streams));
            let started = std::time::Instant::now();
            loop {
                let pending = match streams.recv_timeout(Duration::from_millis(500)) {
                    Ok(p) => p,
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                        if !joined.load(Relaxed) && started.elapsed() > STREAM_WAIT {
                            fail(TransferError::network("the client did not open its data streams within 30 s (a firewall between the hosts? try --reverse)"));
                            return;
                        }
                        continue;
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
                };
                // Each finish waits a round trip for the connector's go-ahead: not in line.
                let (auth, feed, fail, joined, refused) = (auth.clone(), feed.clone(), fail.clone(), joined.clone(), fail.clone());
                let started = crate::threads::spawn("tern-stream", move || match pending.finish(&auth) {
                    Ok(c) => {
                        joined.store(true, Relaxed);
                        feed(c);
                    }
                    // It named this session, so it is the client's (or someone in the middle).
                    Err(e) => fail(TransferError::network(format!("data stream: {e}"))),
                });
                if let Err(e) = started {
                    refused(crate::threads::refused(Side::Destination, "tern-stream", &e));
                }
            }
        });
        if let Err(e) = started {
            failing(crate::threads::refused(Side::Destination, "tern-streams", &e));
        }
    };
    match role {
        Role::Sender => {
            let sending = Sending::new().with_resets(resets, None);
            let (feed, failed) = (sending.feed(), sending.feed());
            forward(Box::new(move |c| feed.add(c)), Box::new(move |e| failed.fail(e)));
            let params = SenderParams { sources: specs, options, progress, memory: Arc::new(Mutex::new(SendMemory::default())), rate: None, filter, list: list.map(Arc::new), stripe };
            sending.run(reader, writer, conns, params)
        }
        Role::Receiver => {
            let receiving = Receiving::new().with_resets(resets, None);
            let (feed, failed) = (receiving.feed(), receiving.feed());
            forward(Box::new(move |c| feed.add(c)), Box::new(move |e| failed.fail(e)));
            let beneath = roots.beneath(&dest).map_err(|e| TransferError::io(Side::Destination, dest.display().to_string(), "daemon root unavailable", &e).into_fatal())?.map(Arc::new);
            let params = ReceiverParams {
                destination: dest,
                multi_source: sources.len() > 1,
                options,
                progress,
                window_bytes: crate::driver::receiver::WINDOW_BYTES,
                window_files: crate::driver::receiver::window_files_for(options.concurrency),
                window_held: crate::driver::receiver::window_held_for(options.concurrency),
                filter,
                beneath,
                allow_links_out: daemon.is_some_and(|d| d.allow_links_out),
                // A pushing client paces what it sends.
                rate: None,
            };
            receiving.run(reader, writer, conns, params)
        }
    }
}

/// The access log's account of a request: direction as the daemon sees it, and the paths.
fn access_request(role: Role, options: tern_proto::Options, sources: &[Vec<u8>], destination: &[u8]) -> String {
    let tp = if options.third_party() { " third-party=yes" } else { "" };
    match role {
        Role::Sender => {
            let srcs: Vec<_> = sources.iter().map(|p| String::from_utf8_lossy(p).into_owned()).collect();
            format!("auth=token op=send src={:?}{tp}", srcs.join(","))
        }
        Role::Receiver => format!("auth=token op=receive dest={:?}{tp}", String::from_utf8_lossy(destination)),
    }
}

/// How long a session waits for the client's first data stream.
const STREAM_WAIT: Duration = Duration::from_secs(30);

/// Runs a closure when dropped.
struct Defer<F: FnMut()>(F);

impl<F: FnMut()> Drop for Defer<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// Where a third-party sender opens its data streams, and the credentials for them there.
struct Dial {
    /// As the client wrote it (for messages).
    addr: String,
    /// What the operator's policy let it resolve to.
    addrs: Vec<SocketAddr>,
    session_id: [u8; 16],
    ticket: [u8; 32],
}

/// After a third-party `Open` the sender side expects `Dial`: an address a token holder names,
/// so it is judged by the operator's `--dial-allow` list before anything is connected (none
/// in ssh mode, and by default: such a daemon refuses the whole session).
fn third_party_dial(reader: &mut CtrlReader, role: Role, options: tern_proto::Options, policy: Option<&DialPolicy>) -> Result<Option<Dial>, TransferError> {
    if !options.third_party() || role == Role::Receiver {
        return Ok(None);
    }
    let none = DialPolicy::default();
    let policy = policy.unwrap_or(&none);
    if policy.allow.is_empty() {
        // Before reading Dial: nothing the client says changes the answer.
        return Err(TransferError::fatal(Side::Source, policy.resolve("").unwrap_err()));
    }
    match reader.recv()? {
        Control::Dial { addr, session_id, ticket } => {
            let addr = String::from_utf8(addr).map_err(|_| TransferError::fatal(Side::Network, "third-party: the dial address is not UTF-8"))?;
            let addrs = policy.resolve(&addr).map_err(|m| TransferError::fatal(Side::Source, format!("third-party: {m}")))?;
            Ok(Some(Dial { addr, addrs, session_id, ticket }))
        }
        _ => Err(TransferError::fatal(Side::Network, "third-party: expected the receiving daemon's address (Dial) after Open")),
    }
}

/// How long a third-party sender gives its first data stream to prove the ticket; every
/// failure is reported at this time.
const DIAL_DEADLINE: Duration = Duration::from_secs(10);

/// Opens a third-party session's `n` streams to the receiving daemon. One stream first: only
/// once the far end has proved it holds the ticket are the others opened (a wrong address
/// gets one connection, not `n`). A failure of that first stream is reported to the client in
/// the same words and after the same time whatever happened (refused, filtered, timed out,
/// not tern, wrong ticket), so the feature tells a client nothing about ports on the daemon's
/// networks; the operator's log has the real reason.
fn dial_peer(addrs: &[SocketAddr], shown: &str, auth: &StreamAuth, n: u16) -> Result<Vec<DataConn>, TransferError> {
    let started = Instant::now();
    let (first, peer) = match first_stream(addrs, auth, started + DIAL_DEADLINE) {
        Ok(x) => x,
        Err(why) => {
            tracing::warn!("third-party: no data stream to {shown}: {why}");
            if let Some(rest) = (started + DIAL_DEADLINE).checked_duration_since(Instant::now()) {
                thread::sleep(rest);
            }
            return Err(TransferError::fatal(
                Side::Network,
                format!(
                    "third-party: the source daemon opened no data stream to {shown} that proved this session's ticket within {} s (a closed or filtered port, or not the receiving tern daemon); check that the destination daemon's port is reachable from the source host",
                    DIAL_DEADLINE.as_secs()
                ),
            ));
        }
    };
    let mut conns = vec![first];
    conns.extend(dial_streams(&[peer], auth, 1..n as u32, "third-party: the receiving daemon")?);
    Ok(conns)
}

/// Stream 0 to the first of `addrs` that answers, by `deadline`.
fn first_stream(addrs: &[SocketAddr], auth: &StreamAuth, deadline: Instant) -> Result<(DataConn, SocketAddr), String> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let held: Arc<Mutex<Option<TcpStream>>> = Arc::default();
    let (addrs, auth2, held2, refused) = (addrs.iter().take(4).copied().collect::<Vec<_>>(), auth.clone(), held.clone(), tx.clone());
    let started = crate::threads::spawn("tern-dial", move || {
        let r = (|| {
            let sock = crate::net::transport::connect_any(&addrs)?;
            let peer = sock.peer_addr()?;
            *held2.lock().unwrap() = sock.try_clone().ok();
            Ok((crate::net::datastream::connect_stream(sock, &auth2, 0, None, false)?, peer))
        })();
        let _ = tx.send(r.map_err(|e: std::io::Error| e.to_string()));
    });
    if let Err(e) = started {
        let _ = refused.send(Err(crate::threads::refused(Side::Network, "tern-dial", &e).message));
    }
    let wait = deadline.saturating_duration_since(Instant::now());
    match rx.recv_timeout(wait) {
        Ok(r) => r,
        Err(_) => {
            if let Some(s) = held.lock().unwrap().take() {
                let _ = s.shutdown(Shutdown::Both);
            }
            Err(format!("no answer within {} s", DIAL_DEADLINE.as_secs()))
        }
    }
}

/// Opens the streams `indexes` to `addrs` side by side (each costs a TCP and a TLS handshake).
/// `whom` names the far end in errors.
fn dial_streams(addrs: &[SocketAddr], auth: &StreamAuth, indexes: std::ops::Range<u32>, whom: &str) -> Result<Vec<DataConn>, TransferError> {
    let shown = addrs.first().map(|a| a.to_string()).unwrap_or_default();
    thread::scope(|s| {
        let handles: Vec<_> = indexes
            .map(|i| {
                let shown = &shown;
                crate::threads::spawn_scoped(s, "tern-stream-setup", move || {
                    let sock =
                        crate::net::transport::connect_any(addrs).map_err(|e| TransferError::network(format!("{whom} at {shown}: cannot connect: {e} (is its port reachable from this host?)")))?;
                    crate::net::datastream::connect_stream(sock, auth, i, None, false).map_err(|e| TransferError::network(format!("{whom} at {shown}: data stream: {e}")))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| Err(TransferError::network("stream setup panicked"))),
                Err(e) => Err(crate::threads::refused(Side::Network, "a data stream", &e)),
            })
            .collect::<Result<Vec<_>, _>>()
    })
}

/// A live session's stream feed, and the places its data streams hold in the gate (given back
/// when the session ends).
struct Live {
    streams: Sender<PendingStream>,
    held: Arc<Mutex<Vec<Conn>>>,
}

type Registry = Arc<Mutex<HashMap<[u8; 16], Live>>>;

/// Data streams one session may bring in its lifetime (the protocol allows 256 at once; the
/// rest covers replaced streams). Beyond it the session's streams are refused.
const MAX_SESSION_STREAMS: usize = 2 * tern_proto::limits::MAX_STREAMS as usize;

/// What `tern serve` was told (besides its roots, secret and hooks).
#[derive(Clone, Debug, Default)]
pub struct DaemonConfig {
    pub limits: Limits,
    /// Peers a third-party sender may dial (`--dial-allow`); empty: none.
    pub dial: DialPolicy,
    /// `--allow-links-out`: clients may create links whose targets resolve outside the root.
    pub allow_links_out: bool,
}

/// A daemon control connection as its session sees it.
pub struct DaemonConn {
    conn: Mutex<Conn>,
    policy: Arc<DialPolicy>,
    allow_links_out: bool,
    /// What the client asked for, for the access log.
    access: Mutex<String>,
}

impl DaemonConn {
    fn record(&self, what: String) {
        *self.access.lock().unwrap() = what;
    }
}

/// `tern serve`: accepts control and data connections on one port until the process ends.
/// `hooks` are the commands the operator registered (`--hook NAME=CMD`), the only ones a client
/// can ask for. Every connection is admitted by the gate (`limits`): at most so many, and each
/// must authenticate within the deadline.
pub fn serve_daemon(listener: TcpListener, roots: Roots, secret: Vec<u8>, hooks: Hooks, config: DaemonConfig) -> std::io::Result<()> {
    let gate = Gate::new(config.limits);
    let daemon = Arc::new(Daemon { registry: Arc::default(), roots, key: tern_proto::auth::token_key(&secret), hooks, policy: Arc::new(config.dial), allow_links_out: config.allow_links_out });
    for conn in listener.incoming() {
        let sock = match conn {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors or memory: wait instead of spinning on the same error.
                tracing::warn!("accepting a connection: {e}");
                thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let peer = match sock.peer_addr() {
            Ok(p) => p,
            Err(_) => continue,
        };
        let conn = match gate.admit(&sock, peer) {
            Admit::Yes(c) => c,
            Admit::Busy(why) => {
                if let Some(slot) = gate.refusal_slot() {
                    // Without a thread, the connection is just closed.
                    let _ = crate::threads::spawn("tern-refuse", move || {
                        refuse_busy(sock, &why);
                        drop(slot);
                    });
                }
                continue;
            }
        };
        let daemon = daemon.clone();
        let spawned = crate::threads::spawn("tern-conn", move || {
            if let Err(e) = daemon_connection(sock, peer, conn, &daemon) {
                tracing::debug!("{peer}: {e}");
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("cannot start a thread for a connection from {peer}: {e}");
        }
    }
    Ok(())
}

/// Tells a client over the cap why, in a line it can print (a `Fatal` where it expects the
/// server's `Hello`), within a short bound; data streams are just closed.
fn refuse_busy(sock: TcpStream, why: &str) {
    let _ = sock.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = sock.set_write_timeout(Some(Duration::from_secs(2)));
    let mut kind = [0u8; 1];
    if (&sock).read_exact(&mut kind).is_err() || kind[0] != b'C' {
        return;
    }
    let Ok(raw) = sock.try_clone() else { return };
    if let Ok((halves, _)) = tls_control_server(sock) {
        let _ = CtrlWriter::new(halves.writer).send(&Control::Fatal { side: Side::Network, message: why.to_string() });
        // Read what the client already sent until it closes, so closing does not reset the
        // connection before it has read the reason.
        let _ = raw.shutdown(Shutdown::Write);
        let mut sink = [0u8; 4096];
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until && matches!((&raw).read(&mut sink), Ok(n) if n > 0) {}
    }
}

/// What every connection of a daemon shares: its sessions, roots, key, hooks and policy.
struct Daemon {
    registry: Registry,
    roots: Roots,
    key: [u8; 32],
    hooks: Hooks,
    policy: Arc<DialPolicy>,
    allow_links_out: bool,
}

fn daemon_connection(sock: TcpStream, peer: SocketAddr, mut conn: Conn, daemon: &Daemon) -> Result<(), TransferError> {
    let Daemon { registry, roots, key, hooks, policy, allow_links_out } = daemon;
    let (policy, allow_links_out) = (policy.clone(), *allow_links_out);
    let mut kind = [0u8; 1];
    (&sock).read_exact(&mut kind).map_err(crate::net::control::net_err)?;
    match kind[0] {
        b'C' => {
            tune_socket(&sock, None);
            let local = sock.local_addr().map_err(crate::net::control::net_err)?;
            let (halves, exporter) = tls_control_server(sock.try_clone().map_err(crate::net::control::net_err)?).map_err(crate::net::control::net_err)?;
            let session_id = random::<16>();
            let (tx, rx) = unbounded();
            let held = Arc::new(Mutex::new(Vec::new()));
            registry.lock().unwrap().insert(session_id, Live { streams: tx, held: held.clone() });
            let progress = Arc::new(Progress::default());
            let started = Instant::now();
            let d = DaemonConn { conn: Mutex::new(conn), policy, allow_links_out, access: Mutex::new("auth=none op=none".into()) };
            let r = serve_session(
                halves,
                rx,
                ServedSession { exporter, secret_key: *key, roots, session_id, data_addr: local.to_string(), announce: Announce::No, reverse_to: None, progress, hooks, daemon: Some(&d) },
            );
            registry.lock().unwrap().remove(&session_id);
            // The session's data streams have ended with it: their places go back.
            held.lock().unwrap().clear();
            let what = d.access.lock().unwrap().clone();
            let secs = started.elapsed().as_secs_f64();
            match &r {
                Ok(s) => tracing::info!(target: "tern::access", "access: peer={peer} {what} files={} bytes={} secs={secs:.2} result=ok", s.files_done, s.bytes_written),
                Err(e) => tracing::info!(target: "tern::access", "access: peer={peer} {what} secs={secs:.2} result=failed error={:?}", e.to_string()),
            }
            r.map(|_| ())
        }
        b'D' | b'P' => {
            let pending = accept_stream(sock, kind[0]).map_err(|e| TransferError::network(format!("data stream: {e}")))?;
            let live = registry.lock().unwrap().get(&pending.hello.session_id).map(|l| (l.streams.clone(), l.held.clone()));
            let Some((tx, held)) = live else {
                return Err(TransferError::network("data stream for an unknown session; dropped"));
            };
            let mut held = held.lock().unwrap();
            if held.len() >= MAX_SESSION_STREAMS {
                return Err(TransferError::network(format!("data stream beyond the session's {MAX_SESSION_STREAMS}; dropped")));
            }
            // A live session's id (sent only inside its TLS control channel) is the proof
            // here; the session checks the stream's own proof next.
            conn.authenticated(false).map_err(TransferError::network)?;
            held.push(conn);
            let _ = tx.send(pending);
            Ok(())
        }
        other => Err(TransferError::fatal(Side::Network, format!("unknown connection kind byte {other}; not a tern client"))),
    }
}

/// `tern _remote`: the far end of an ssh-mode session. The control channel is stdin/stdout;
/// the first line on stdin is the session secret; data streams arrive on a fresh port, bound
/// first thing so that it can be announced with our `Hello` (`Listening`).
pub fn serve_remote(port_range: Option<(u16, u16)>, reverse_port: Option<u16>) -> Result<(), TransferError> {
    let ssh_field = |n: usize| std::env::var("SSH_CONNECTION").ok().and_then(|v| v.split_whitespace().nth(n).map(str::to_string)).unwrap_or_default();
    let bracket = |ip: String, port: u16| if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") };
    let (tx, rx) = bounded(64);
    // `--reverse`: the client listens, where our ssh connection came from; otherwise the client
    // connects to the address ssh reached us on, told early (`Listening`).
    let (data_addr, reverse_to) = match reverse_port {
        Some(port) => {
            drop(tx);
            let client_ip = match ssh_field(0) {
                ip if ip.is_empty() => "127.0.0.1".to_string(),
                ip => ip,
            };
            (None, Some(bracket(client_ip, port)))
        }
        None => {
            let listener = bind_range(port_range).map_err(|e| TransferError::fatal(Side::Network, format!("cannot listen for data streams: {e} (choose another --port-range)")))?;
            let port = listener.local_addr().map_err(crate::net::control::net_err)?.port();
            crate::threads::spawn_or_refuse(Side::Network, "tern-listen", move || accept_data_streams(listener, tx))?;
            (Some(bracket(ssh_field(2), port)), None)
        }
    };
    // A client that set this understands `Listening`: speak before its bytes arrive.
    let early = std::env::var_os(EARLY_HELLO_ENV).is_some_and(|v| v == "1") && crate::net::handshake::our_features() & tern_proto::msg::FEATURE_EARLY_DATA_ADDR != 0;
    if early {
        crate::net::handshake::early_hello(&CtrlWriter::new(Box::new(std::io::stdout())), data_addr.as_deref().map(str::as_bytes))?;
    }
    let announce = match (&data_addr, early) {
        (_, true) => Announce::Said,
        (Some(_), false) => Announce::AfterHello,
        (None, false) => Announce::No,
    };
    let mut stdin = BufReader::new(std::io::stdin());
    let mut line = String::new();
    stdin.read_line(&mut line).map_err(crate::net::control::net_err)?;
    let secret = line.trim().strip_prefix("TERN-SECRET ").ok_or_else(|| TransferError::fatal(Side::Network, "expected the session secret on stdin"))?.to_string();
    let data_addr = data_addr.unwrap_or_default();
    let halves = ControlHalves { reader: Box::new(stdin), writer: Box::new(std::io::stdout()), closer: crate::net::transport::Closer::noop() };
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"));
    let served = ServedSession {
        exporter: [0; 32],
        secret_key: tern_proto::auth::token_key(secret.as_bytes()),
        roots: &Roots::Home(home),
        session_id: random(),
        data_addr,
        announce,
        reverse_to,
        progress: Arc::new(Progress::default()),
        hooks: &Hooks::default(),
        daemon: None,
    };
    serve_session(halves, rx, served).map(|_| ())
}
