//! Opening and accepting authenticated data streams.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use crossbeam_channel::Sender;
use tern_proto::auth::{Party, proofs_equal, stream_proof, stream_tag_key};
use tern_proto::data::{DATA_ACCEPT, DATA_HELLO, DataHello};
use tern_proto::frame::{FrameHeader, HEADER_LEN};

use crate::limits::{Admit, Gate, Limits};
use crate::net::seal::{EXPORTER_LABEL, Sealer};
use crate::net::transport::{Closer, Stream, random, tune_socket};

/// One open data stream, ready for chunk frames.
pub struct DataConn {
    pub stream: Stream,
    pub index: u32,
    /// Per-chunk tag key when the stream is not encrypted (and not an in-process socket).
    pub tag_key: Option<[u8; 32]>,
    /// AES-256-GCM sealing of every frame when encrypted (key exported from the TLS session).
    pub sealer: Option<Sealer>,
    pub closer: Closer,
    /// A duplicate of the socket for reading its kernel counters (the stream ramp).
    pub probe: Option<TcpStream>,
}

/// Sent on the raw socket after the hello exchange: from here on frames bypass TLS, so the
/// acceptor must not send before the connector's TLS layer has stopped reading.
const GO: u8 = b'G';

fn export_data_key(stream: &Stream, index: u32) -> io::Result<Option<[u8; 32]>> {
    let mut key = [0u8; 32];
    let ctx = index.to_be_bytes();
    let r = match stream {
        Stream::TlsClient(s) => s.conn.export_keying_material(&mut key, EXPORTER_LABEL, Some(&ctx)).map(|_| ()),
        Stream::TlsServer(s) => s.conn.export_keying_material(&mut key, EXPORTER_LABEL, Some(&ctx)).map(|_| ()),
        _ => return Ok(None),
    };
    r.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("TLS exporter: {e}")))?;
    Ok(Some(key))
}

/// What both ends of a session know after the control handshake.
#[derive(Clone)]
pub struct StreamAuth {
    pub session_id: [u8; 16],
    pub session_key: [u8; 32],
    pub encrypt: bool,
}

/// The connecting side: TLS (or not), then `DataHello` and the acceptor's proof.
pub fn connect_stream(sock: TcpStream, auth: &StreamAuth, index: u32, bufsize: Option<usize>) -> io::Result<DataConn> {
    preconnect(sock, auth.encrypt, bufsize)?.introduce(auth, index)
}

/// A data connection with its TCP and TLS handshakes done that has not named its session yet.
/// Made while the control channel still authenticates, so those round trips overlap.
pub struct Preconnected {
    sock: TcpStream,
    stream: Stream,
    exporter: [u8; 32],
    encrypt: bool,
}

pub fn preconnect(sock: TcpStream, encrypt: bool, bufsize: Option<usize>) -> io::Result<Preconnected> {
    tune_socket(&sock, bufsize);
    sock.set_read_timeout(Some(Duration::from_secs(30)))?;
    (&sock).write_all(&[if encrypt { b'D' } else { b'P' }])?;
    let (stream, exporter) = if encrypt { Stream::tls_client(sock.try_clone()?)? } else { (Stream::Tcp(sock.try_clone()?), [0u8; 32]) };
    Ok(Preconnected { sock, stream, exporter, encrypt })
}

impl Preconnected {
    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.sock.peer_addr()
    }

    /// Names the session (`DataHello`) and checks the acceptor's proof.
    pub fn introduce(self, auth: &StreamAuth, index: u32) -> io::Result<DataConn> {
        let Preconnected { sock, mut stream, exporter, encrypt } = self;
        if encrypt != auth.encrypt {
            return Err(bad("data stream encryption does not match the session"));
        }
        let nonce = random::<32>();
        let proof = stream_proof(&auth.session_key, Party::Client, &auth.session_id, index, &nonce, &exporter);
        stream.write_all(&DataHello { session_id: auth.session_id, stream: index, nonce, proof }.encode())?;
        stream.flush()?;
        let mut head = [0u8; HEADER_LEN];
        stream.read_exact(&mut head)?;
        let h = FrameHeader::parse(head, 64).map_err(bad)?;
        if h.frame_type != DATA_ACCEPT || h.body_len != 32 {
            return Err(bad("unexpected reply to data stream hello"));
        }
        let mut theirs = [0u8; 32];
        stream.read_exact(&mut theirs)?;
        let expect = stream_proof(&auth.session_key, Party::Server, &auth.session_id, index, &nonce, &exporter);
        if !proofs_equal(&theirs, &expect) {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "data stream peer failed authentication"));
        }
        let data_key = export_data_key(&stream, index)?;
        drop(stream);
        (&sock).write_all(&[GO])?;
        sock.set_read_timeout(None)?;
        let probe = sock.try_clone().ok();
        let stream = Stream::Tcp(sock);
        let closer = stream.closer();
        let tag_key = (!auth.encrypt).then(|| stream_tag_key(&auth.session_key, &auth.session_id, index, &nonce));
        Ok(DataConn { stream, index, tag_key, sealer: data_key.map(|k| Sealer::new(&k)), closer, probe })
    }
}

/// A data stream after the acceptor read its kind byte and (for TLS) completed the handshake,
/// and read the hello: the session it names must then verify the proof.
pub struct PendingStream {
    pub stream: Stream,
    sock: TcpStream,
    pub exporter: [u8; 32],
    pub hello: DataHello,
    pub encrypted: bool,
}

/// Acceptor side, up to reading the hello. `kind` is the first byte the connector sent.
pub fn accept_stream(sock: TcpStream, kind: u8) -> io::Result<PendingStream> {
    tune_socket(&sock, None);
    sock.set_read_timeout(Some(Duration::from_secs(30)))?;
    let encrypted = match kind {
        b'D' => true,
        b'P' => false,
        _ => return Err(bad("unknown stream kind")),
    };
    let (mut stream, exporter) = if encrypted { Stream::tls_server(sock.try_clone()?)? } else { (Stream::Tcp(sock.try_clone()?), [0u8; 32]) };
    let mut head = [0u8; HEADER_LEN];
    stream.read_exact(&mut head)?;
    let h = FrameHeader::parse(head, 256).map_err(bad)?;
    if h.frame_type != DATA_HELLO || h.body_len as usize != DataHello::BODY_LEN {
        return Err(bad("expected a data stream hello"));
    }
    let mut body = [0u8; DataHello::BODY_LEN];
    stream.read_exact(&mut body)?;
    let hello = DataHello::decode(&body).map_err(bad)?;
    Ok(PendingStream { stream, sock, exporter, hello, encrypted })
}

impl PendingStream {
    /// Verifies the connector's proof with the session's key and answers with ours.
    pub fn finish(mut self, auth: &StreamAuth) -> io::Result<DataConn> {
        if self.encrypted != auth.encrypt {
            return Err(bad("data stream encryption does not match the session"));
        }
        let h = &self.hello;
        let expect = stream_proof(&auth.session_key, Party::Client, &auth.session_id, h.stream, &h.nonce, &self.exporter);
        if !proofs_equal(&h.proof, &expect) {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "data stream failed authentication"));
        }
        let ours = stream_proof(&auth.session_key, Party::Server, &auth.session_id, h.stream, &h.nonce, &self.exporter);
        let mut reply = FrameHeader::encode(DATA_ACCEPT, 32).to_vec();
        reply.extend_from_slice(&ours);
        self.stream.write_all(&reply)?;
        self.stream.flush()?;
        let data_key = export_data_key(&self.stream, h.stream)?;
        let mut go = [0u8; 1];
        (&self.sock).read_exact(&mut go)?;
        if go[0] != GO {
            return Err(bad("data stream did not start"));
        }
        self.sock.set_read_timeout(None)?;
        let probe = self.sock.try_clone().ok();
        let stream = Stream::Tcp(self.sock);
        let closer = stream.closer();
        let tag_key = (!auth.encrypt).then(|| stream_tag_key(&auth.session_key, &auth.session_id, h.stream, &h.nonce));
        Ok(DataConn { stream, index: h.stream, tag_key, sealer: data_key.map(|k| Sealer::new(&k)), closer, probe })
    }
}

/// Finishes several pending streams at once. Each finish waits a round trip for the
/// connector's go-ahead; one after another, eight streams cost eight round trips (0.5 s on a
/// 68 ms path) before any data moves.
pub fn finish_all(pending: Vec<PendingStream>, auth: &StreamAuth) -> io::Result<Vec<DataConn>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = pending.into_iter().map(|p| s.spawn(move || p.finish(auth))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(io::Error::other("data stream setup panicked")))).collect()
    })
}

fn bad(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// ssh mode's data listener: every connection that says hello goes to the session. One that
/// closes or fails before its `DataHello` (a client's surplus early stream, a port scan) only
/// ends its own thread. Anyone can reach this port, so connections that have not said hello
/// are bounded and timed out as on a daemon.
pub(crate) fn accept_data_streams(listener: TcpListener, tx: Sender<PendingStream>) {
    let gate = Gate::new(Limits::default());
    for sock in listener.incoming().flatten() {
        let Ok(peer) = sock.peer_addr() else { continue };
        let Admit::Yes(mut conn) = gate.admit(&sock, peer) else { continue };
        let tx = tx.clone();
        // Without a thread, the connection is closed: the client opens another or goes on
        // with fewer streams.
        let _ = crate::threads::spawn("tern-hello", move || {
            let mut kind = [0u8; 1];
            if (&sock).read_exact(&mut kind).is_ok()
                && let Ok(p) = accept_stream(sock, kind[0])
                && conn.authenticated(false).is_ok()
            {
                let _ = tx.send(p);
            }
        });
    }
}

pub fn bind_range(range: Option<(u16, u16)>) -> std::io::Result<TcpListener> {
    let (lo, hi) = range.unwrap_or((0, 0));
    let mut last = None;
    for port in lo..=hi {
        for addr in [format!("[::]:{port}"), format!("0.0.0.0:{port}")] {
            match TcpListener::bind(&addr) {
                Ok(l) => return Ok(l),
                Err(e) => last = Some(e),
            }
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("empty port range")))
}
