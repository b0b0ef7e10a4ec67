//! Third-party transfers (`tern cp tern://A/x tern://B/y`): the client holds a control channel
//! to each daemon and relays the control messages between them, while daemon A opens its data
//! streams straight to daemon B. No file data passes through this process.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::thread;

use tern_proto::msg::{FEATURE_THIRD_PARTY, Role, Summary};
use tern_proto::{Control, EntryKind};

use crate::client::session::{ClientSpec, bracket, connect, send_filters};
use crate::driver::sender::SendMemory;
use crate::endpoint::Endpoint;
use crate::error::{Scope, Side, TransferError};
use crate::net::control::{CtrlReader, CtrlWriter};
use crate::net::transport::{Closer, tls_control_client};
use crate::progress::Progress;

/// One authenticated control channel to a daemon.
struct Channel {
    reader: CtrlReader,
    writer: CtrlWriter,
    closer: Closer,
    session_key: [u8; 32],
    /// The daemon's Hello feature bits.
    features: u64,
    /// `host:port` for messages, and the host for a wildcard data address.
    addr: String,
    host: String,
}

/// One attempt of a third-party session; `session::run` retries it on network errors.
pub(crate) fn attempt(spec: &ClientSpec, progress: &Arc<Progress>, memory: &Arc<Mutex<SendMemory>>) -> Result<Summary, TransferError> {
    let (Endpoint::Daemon { host: src_host, port: src_port, .. }, Endpoint::Daemon { host: dst_host, port: dst_port, path: dst_path }) = (&spec.sources[0], &spec.dest) else {
        return Err(TransferError::fatal(Side::Network, "both ends are remote: third-party transfers need tern:// daemons at both ends"));
    };
    let mut options = spec.options;
    options.set_third_party(true);
    // Further names of a file go as files between two daemons (the client would have to check
    // both before opening either).
    options.set_hard_links(false);
    let sources: Vec<Vec<u8>> = spec.sources.iter().map(|s| s.path_str().into_bytes()).collect();
    // The receiver first: its Ready carries what the sender needs to reach it.
    let dst_token = spec.dst_token_file.as_ref().or(spec.token_file.as_ref());
    let mut b = open_channel(dst_host, *dst_port, dst_token, "--dst-token-file")?;
    send_filters(&b.writer, b.features, spec, false, &format!("the daemon at {}", b.addr))?;
    b.writer.send(&Control::Open { server_role: Role::Receiver, options, sources: sources.clone(), destination: dst_path.as_bytes().to_vec() })?;
    let (session_id, data_addr) = expect_ready(&mut b)?;
    check_reachable(&data_addr, &format!("{}:{src_port}", bracket(src_host)))?;
    let mut a = open_channel(src_host, *src_port, spec.token_file.as_ref(), "--token-file")?;
    send_filters(&a.writer, a.features, spec, true, &format!("the daemon at {}", a.addr))?;
    a.writer.send(&Control::Open { server_role: Role::Sender, options, sources, destination: Vec::new() })?;
    let ticket = tern_proto::auth::stream_ticket(&b.session_key);
    a.writer.send(&Control::Dial { addr: data_addr.into_bytes(), session_id, ticket })?;
    expect_ready(&mut a)?;
    start_attempt(progress, options.streams);
    let r = pump_both(a, b, spec.options.chunk_size, progress, memory);
    progress.streams.store(0, Relaxed);
    r
}

/// Connects, authenticates with the token in `token_file` and checks the daemon speaks
/// third-party. `flag` names the option that sets this daemon's token, for the error.
fn open_channel(host: &str, port: u16, token_file: Option<&std::path::PathBuf>, flag: &str) -> Result<Channel, TransferError> {
    let addr = format!("{}:{port}", bracket(host));
    let Some(path) = token_file else {
        return Err(TransferError::fatal(Side::Network, format!("the daemon at {addr} needs a token: pass {flag} FILE (or --token-file, TERN_TOKEN_FILE)")));
    };
    let token = std::fs::read(path).map_err(|e| TransferError::fatal(Side::Network, format!("cannot read token file {}: {}", path.display(), crate::error::err_text(&e))))?;
    let key = tern_proto::auth::token_key(token.trim_ascii());
    let sock = connect(&addr)?;
    crate::net::transport::tune_socket(&sock, None);
    (&sock).write_all(b"C").map_err(crate::net::control::net_err)?;
    let (halves, exporter) = tls_control_client(sock).map_err(|e| TransferError::network(format!("{addr}: TLS handshake failed: {e}")))?;
    let mut reader = CtrlReader::new(halves.reader);
    let writer = CtrlWriter::new(halves.writer);
    let peer = format!("the daemon at {addr} (token from {}, set by {flag})", path.display());
    let (session_key, _, features) = crate::net::handshake::client(&mut reader, &writer, &key, &exporter, &peer, true, None)?;
    if features & FEATURE_THIRD_PARTY == 0 {
        return Err(TransferError::fatal(Side::Network, format!("the daemon at {addr} is too old for third-party transfers; upgrade it, or copy through a host that runs tern")));
    }
    Ok(Channel { reader, writer, closer: halves.closer, session_key, features, addr, host: bracket(host) })
}

/// The server's `Ready`: its session id and data address (a wildcard address means the host we
/// reached it on).
fn expect_ready(c: &mut Channel) -> Result<([u8; 16], String), TransferError> {
    let (session_id, addr) = match c.reader.recv()? {
        Control::Ready { session_id, data_addr, .. } => (session_id, String::from_utf8_lossy(&data_addr).into_owned()),
        Control::Fatal { side, message } => return Err(TransferError::fatal(side, message)),
        _ => return Err(TransferError::fatal(Side::Network, format!("expected the daemon at {} to be ready", c.addr))),
    };
    let addr = match addr.rsplit_once(':') {
        Some((ip, port)) if ip.is_empty() || ip == "0.0.0.0" || ip == "[::]" => format!("{}:{port}", c.host),
        _ => addr,
    };
    Ok((session_id, addr))
}

/// A receiving daemon reached on a loopback address reports a loopback data address, which
/// means the sending daemon itself unless that one is on loopback too: say so instead of
/// letting A dial its own port (or nothing) and fail with a puzzling authentication error.
fn check_reachable(data_addr: &str, src_addr: &str) -> Result<(), TransferError> {
    use std::net::{SocketAddr, ToSocketAddrs};
    let loopback = |a: &SocketAddr| a.ip().is_loopback();
    let dst_is_loopback = data_addr.parse::<SocketAddr>().is_ok_and(|a| loopback(&a));
    let src_is_loopback = src_addr.to_socket_addrs().is_ok_and(|mut a| a.all(|a| loopback(&a)));
    if dst_is_loopback && !src_is_loopback {
        return Err(TransferError::fatal(
            Side::Destination,
            format!("the destination daemon's data address {data_addr} is a loopback address the source daemon cannot reach; name the destination by an address the source daemon can reach"),
        ));
    }
    Ok(())
}

/// The sender announces everything again on each attempt (a daemon keeps no memory between
/// sessions): recount the manifest, keep what earlier attempts finished.
fn start_attempt(progress: &Progress, streams: u16) {
    for c in [&progress.files_total, &progress.bytes_total, &progress.files_skipped, &progress.bytes_skipped, &progress.files_failed] {
        c.store(0, Relaxed);
    }
    progress.streams.store(streams as u64, Relaxed);
    progress.start_attempt(false);
}

/// What the relay knows of each manifest entry, to turn ids into paths and sizes.
/// A file of the manifest, as the relay counts it.
struct Booked {
    path: Vec<u8>,
    /// Bytes this session moves: a stripe's, or the whole size.
    size: u64,
    /// Its bytes were counted (at `FileEnd`, or at `FileDone` if none came).
    counted: bool,
    /// This session moves a stripe of it: the file lands with a later session.
    stripe: bool,
}

#[derive(Default)]
struct Book {
    files: HashMap<u64, Booked>,
    /// Bytes the receiver asked for, per file: what crosses the network (a resumed file's
    /// chunks held already do not), counted when the file's chunks are all out.
    wanted: HashMap<u64, u64>,
    chunk_size: u32,
    summary: Option<Summary>,
}

/// One thread per direction. The session is complete when B's `Bye` has passed (it follows B's
/// `Summary` and A's `Bye`). The first failure closes both channels so the other pump ends too.
fn pump_both(a: Channel, b: Channel, chunk_size: u32, progress: &Arc<Progress>, memory: &Arc<Mutex<SendMemory>>) -> Result<Summary, TransferError> {
    let book = Arc::new(Mutex::new(Book { chunk_size, ..Book::default() }));
    let closers = [a.closer.clone(), b.closer.clone()];
    let close_all = move || closers.iter().for_each(|c| c.close());
    let (a_name, b_name) = (format!("the source daemon at {}", a.addr), format!("the destination daemon at {}", b.addr));
    let (ar, aw, br, bw) = (a.reader, a.writer, b.reader, b.writer);
    let (r_ab, r_ba) = thread::scope(|s| {
        let ab = crate::threads::spawn_scoped(s, "tern-relay", || {
            let r = pump(ar, &bw, &a_name, &b_name, |m| observe(m, &book, progress, memory));
            if r.is_err() {
                close_all();
            }
            r
        });
        let ba = crate::threads::spawn_scoped(s, "tern-relay", || {
            let r = pump(br, &aw, &b_name, &a_name, |m| observe(m, &book, progress, memory));
            if r.is_err() {
                close_all();
            }
            r
        });
        // A pump the system would not start ends the relay: both channels are closed before
        // joining, so the pump that did start is not left waiting for the one that did not.
        if ab.is_err() || ba.is_err() {
            close_all();
        }
        let joined = |h: std::io::Result<thread::ScopedJoinHandle<'_, Result<(), TransferError>>>| match h {
            Ok(h) => h.join().unwrap_or_else(|_| Err(TransferError::network("relay thread panicked"))),
            Err(e) => Err(crate::threads::refused(Side::Network, "the relay", &e)),
        };
        (joined(ab), joined(ba))
    });
    // A fatal error (a refused path, a full disk) says more than the broken pipe it causes.
    match (r_ab, r_ba) {
        (_, Ok(())) => book.lock().unwrap().summary.ok_or_else(|| TransferError::network("the destination daemon said goodbye without a summary")),
        (Err(e), _) if e.scope == Scope::Fatal => Err(e),
        (_, Err(e)) => Err(e),
    }
}

/// Relays messages from `from` to `to`, decoded and re-encoded (so the bounds are checked
/// here too), until a `Bye` has passed. A `Fatal` is passed on, then ends the session.
fn pump(mut from: CtrlReader, to: &CtrlWriter, from_name: &str, to_name: &str, observe: impl Fn(&Control)) -> Result<(), TransferError> {
    let in_context = |e: TransferError, name: &str| if e.scope == Scope::Network { TransferError::network(format!("{name}: {}", e.message)) } else { e };
    loop {
        let m = from.recv().map_err(|e| in_context(e, from_name))?;
        observe(&m);
        let sent = to.send(&m).map_err(|e| in_context(e, to_name));
        match m {
            Control::Fatal { side, message } => return Err(TransferError::fatal(side, message)),
            // The peer may close as soon as it has what it waited for; B's Bye to A is a courtesy.
            Control::Bye => return Ok(()),
            _ => sent?,
        }
    }
}

/// Progress from what passes: the manifest, per-file outcomes, the summary.
fn observe(m: &Control, book: &Mutex<Book>, progress: &Progress, memory: &Mutex<SendMemory>) {
    let mut book = book.lock().unwrap();
    match m {
        Control::Entries(entries) => {
            for e in entries.iter().filter(|e| e.kind == EntryKind::File) {
                let size = e.stripe.map_or(e.size, |(start, end)| end - start);
                Progress::add(&progress.files_total, 1);
                Progress::add(&progress.bytes_total, size);
                book.files.insert(e.id, Booked { path: e.path.clone(), size, counted: false, stripe: e.stripe.is_some() });
            }
        }
        Control::Skip(items) => {
            let memory = memory.lock().unwrap();
            for (id, _) in items {
                if let Some(Booked { path, size, .. }) = book.files.get(id) {
                    // A file an earlier attempt finished is skipped now: it stays "done".
                    if !memory.finished.contains(path) {
                        Progress::add(&progress.files_skipped, 1);
                        Progress::add(&progress.bytes_skipped, *size);
                    }
                }
            }
        }
        Control::Want(files) => {
            let cs = book.chunk_size;
            for w in files {
                // Whole chunks, at most the file's (or stripe's) bytes: a short last chunk
                // wanted with others counts a little high, never more than one chunk.
                let Some(most) = book.files.get(&w.id).map(|f| f.size) else { continue };
                let bytes = w.ranges.iter().map(|&(_, count)| u64::from(count) * u64::from(cs)).sum::<u64>().min(most);
                *book.wanted.entry(w.id).or_default() += bytes;
            }
        }
        Control::FileEnd { id, .. } => {
            // Every chunk of the file is out: count its bytes now rather than at the (batched) FileDone.
            let wanted = book.wanted.remove(id);
            if let Some(f) = book.files.get_mut(id).filter(|f| !f.counted) {
                f.counted = true;
                Progress::add(&progress.bytes, wanted.unwrap_or(0));
            }
        }
        Control::FileDone(ids) => {
            // A file never wanted moved nothing here (its sealed stripes were published as
            // they lay: docs/journal.md "Seals").
            let mut memory = memory.lock().unwrap();
            for id in ids {
                let wanted = book.wanted.remove(id);
                if let Some(f) = book.files.get_mut(id) {
                    if !f.counted {
                        f.counted = true;
                        Progress::add(&progress.bytes, wanted.unwrap_or(0));
                    }
                    if !f.stripe && memory.finished.insert(&f.path) {
                        progress.landed(&f.path, f.size);
                    }
                }
            }
        }
        Control::FileError { id, side, message } => {
            let path = book.files.get(id).map(|f| String::from_utf8_lossy(&f.path).into_owned()).unwrap_or_else(|| format!("file #{id}"));
            Progress::add(&progress.files_failed, 1);
            progress.error(TransferError::file(*side, path, message.clone()));
        }
        Control::Plan { action, path } => {
            let verb = match action {
                tern_proto::msg::PlanAction::Copy => "copy",
                tern_proto::msg::PlanAction::Skip => "skip",
                tern_proto::msg::PlanAction::Delete => "delete",
            };
            progress.plan.lock().unwrap().push(format!("{verb} {}", String::from_utf8_lossy(path)));
        }
        Control::Summary(s) => {
            progress.deleted.store(s.deleted, Relaxed);
            Progress::add(&progress.chunks_resent, s.chunks_resent);
            Progress::add(&progress.bytes_resent, s.bytes_resent);
            book.summary = Some(*s);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::check_reachable;

    #[test]
    fn a_loopback_destination_is_refused_only_for_a_non_loopback_source() {
        assert!(check_reachable("127.0.0.1:7700", "127.0.0.1:7701").is_ok());
        assert!(check_reachable("[::1]:7700", "[::1]:7701").is_ok());
        assert!(check_reachable("192.0.2.9:7700", "127.0.0.1:7701").is_ok());
        let e = check_reachable("127.0.0.1:7700", "192.0.2.1:7701").unwrap_err();
        assert!(e.message.contains("loopback"), "{e}");
    }
}
