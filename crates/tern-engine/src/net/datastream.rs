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
    /// The acceptor's `DataAccept`, not read yet: a pushing client that pinned the acceptor's
    /// certificate sends before it arrives, and reads it before closing (`confirm_accept`).
    pub accept: Option<PendingAccept>,
}

impl DataConn {
    /// Reads and checks the acceptor's `DataAccept` if it is still unread. A writer must call
    /// this before closing: a socket closed with unread input is reset, and a reset drops what
    /// the kernel had not sent yet.
    pub fn confirm_accept(&mut self) -> io::Result<()> {
        match self.accept.take() {
            Some(a) => a.confirm(),
            None => Ok(()),
        }
    }
}

/// The acceptor's proof a connector still has to read: its TLS session (or the raw socket)
/// and the proof it must carry.
pub struct PendingAccept {
    stream: Stream,
    expect: [u8; 32],
}

impl PendingAccept {
    fn confirm(mut self) -> io::Result<()> {
        let mut head = [0u8; HEADER_LEN];
        self.stream.read_exact(&mut head)?;
        let h = FrameHeader::parse(head, 64).map_err(bad)?;
        if h.frame_type != DATA_ACCEPT || h.body_len != 32 {
            return Err(bad("unexpected reply to data stream hello"));
        }
        let mut theirs = [0u8; 32];
        self.stream.read_exact(&mut theirs)?;
        if !proofs_equal(&theirs, &self.expect) {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "data stream peer failed authentication"));
        }
        Ok(())
    }
}

/// Sent by the connector on the raw socket: from here on frames bypass TLS. The acceptor sends
/// nothing raw before it has this byte, so a connector whose TLS layer might read ahead sends it
/// only after `DataAccept`; to an acceptor that reads record by record (`FEATURE_EARLY_GO`,
/// `RecordReader`) it goes right behind `DataHello`.
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
    /// How a connector may start (`FEATURE_EARLY_GO`); the acceptor ignores it.
    pub early: EarlyStart,
}

impl StreamAuth {
    /// Credentials for a stream that starts as every peer understands.
    pub fn new(session_id: [u8; 16], session_key: [u8; 32], encrypt: bool) -> Self {
        StreamAuth { session_id, session_key, encrypt, early: EarlyStart::default() }
    }
}

/// What the acceptor told the connector through the authenticated control channel.
#[derive(Clone, Copy, Default)]
pub struct EarlyStart {
    /// It reads TLS records one at a time (its `Hello` has `FEATURE_EARLY_GO`): the go-ahead
    /// byte may follow `DataHello` at once.
    pub go_with_hello: bool,
    /// Its certificate's pin (from `Ready`): a stream whose TLS peer presents it is the
    /// acceptor's, so a writer may send before `DataAccept` has come back.
    pub cert_pin: Option<[u8; 32]>,
}

/// The connecting side: TLS (or not), then `DataHello` and the acceptor's proof. `writes_only`:
/// this side only sends on the stream (a pushing client), so with `auth.early` it need not
/// wait for the proof before sending (see `Preconnected::introduce`).
pub fn connect_stream(sock: TcpStream, auth: &StreamAuth, index: u32, bufsize: Option<usize>, writes_only: bool) -> io::Result<DataConn> {
    preconnect(sock, auth.encrypt, bufsize)?.introduce(auth, index, writes_only)
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

    /// Names the session (`DataHello`) and checks the acceptor's proof. To an acceptor that
    /// reads record by record the go-ahead byte goes with the hello, so it can send at once; and
    /// a writer whose TLS peer presented the pinned certificate (or that sends unencrypted,
    /// where nothing is secret from the path anyway) starts sending right away and reads the
    /// proof later (`DataConn::confirm_accept`): one round trip less before data moves.
    pub fn introduce(self, auth: &StreamAuth, index: u32, writes_only: bool) -> io::Result<DataConn> {
        let Preconnected { sock, mut stream, exporter, encrypt } = self;
        if encrypt != auth.encrypt {
            return Err(bad("data stream encryption does not match the session"));
        }
        // Checked before anything is sent: a stream to another certificate gets no hello.
        let trusted = match auth.early.cert_pin {
            Some(pin) if encrypt => {
                if !stream.peer_has_pin(&pin) {
                    return Err(io::Error::new(io::ErrorKind::PermissionDenied, "data stream peer presented a certificate other than the server's"));
                }
                true
            }
            _ => !encrypt,
        };
        let nonce = random::<32>();
        let proof = stream_proof(&auth.session_key, Party::Client, &auth.session_id, index, &nonce, &exporter);
        stream.write_all(&DataHello { session_id: auth.session_id, stream: index, nonce, proof }.encode())?;
        stream.flush()?;
        let early = auth.early.go_with_hello;
        if early {
            (&sock).write_all(&[GO])?;
        }
        let data_key = export_data_key(&stream, index)?;
        let expect = stream_proof(&auth.session_key, Party::Server, &auth.session_id, index, &nonce, &exporter);
        let pending = PendingAccept { stream, expect };
        let accept = if early && writes_only && trusted {
            Some(pending)
        } else {
            pending.confirm()?;
            if !early {
                (&sock).write_all(&[GO])?;
            }
            sock.set_read_timeout(None)?;
            None
        };
        let probe = sock.try_clone().ok();
        let stream = Stream::Tcp(sock);
        let closer = stream.closer();
        let tag_key = (!auth.encrypt).then(|| stream_tag_key(&auth.session_key, &auth.session_id, index, &nonce));
        Ok(DataConn { stream, index, tag_key, sealer: data_key.map(|k| Sealer::new(&k)), closer, probe, accept })
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
        Ok(DataConn { stream, index: h.stream, tag_key, sealer: data_key.map(|k| Sealer::new(&k)), closer, probe, accept: None })
    }
}

/// Finishes several pending streams at once. Each finish waits a round trip for the
/// connector's go-ahead; one after another, eight streams cost eight round trips (0.5 s on a
/// 68 ms path) before any data moves.
pub fn finish_all(pending: Vec<PendingStream>, auth: &StreamAuth) -> io::Result<Vec<DataConn>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = pending.into_iter().map(|p| crate::threads::spawn_scoped(s, "tern-stream-setup", move || p.finish(auth))).collect();
        handles.into_iter().map(|h| h?.join().unwrap_or_else(|_| Err(io::Error::other("data stream setup panicked")))).collect()
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

/// `LO-HI` or one `PORT`, as `--port-range` takes it (the client's option and `tern _remote`'s).
pub fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let lo: u16 = a.parse().map_err(|_| format!("bad port range '{s}'"))?;
    let hi: u16 = b.parse().map_err(|_| format!("bad port range '{s}'"))?;
    if lo > hi {
        return Err(format!("bad port range '{s}'"));
    }
    Ok((lo, hi))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::thread;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (c, l.accept().unwrap().0)
    }

    fn early(cert_pin: Option<[u8; 32]>) -> StreamAuth {
        let mut auth = StreamAuth::new([1; 16], [2; 32], true);
        auth.early = EarlyStart { go_with_hello: true, cert_pin };
        auth
    }

    fn payload() -> Vec<u8> {
        (0..20_000u32).map(|i| (i % 251) as u8).collect()
    }

    /// Accepts one encrypted stream: kind byte, TLS, hello.
    fn accept(sock: TcpStream) -> PendingStream {
        let mut kind = [0u8; 1];
        (&sock).read_exact(&mut kind).unwrap();
        accept_stream(sock, kind[0]).unwrap()
    }

    /// A pushing connector that pinned the acceptor's certificate sends before `DataAccept`
    /// exists (the acceptor answers only once the connector has written), and what it sent
    /// right behind its TLS hello reaches the raw stream intact.
    #[test]
    fn a_pinned_writer_sends_before_the_accept_and_nothing_is_lost() {
        let (c, a) = pair();
        let (sent_tx, sent_rx) = mpsc::channel::<()>();
        let acceptor = thread::spawn(move || {
            let pending = accept(a);
            sent_rx.recv_timeout(Duration::from_secs(10)).expect("the connector waited for DataAccept");
            let mut conn = pending.finish(&StreamAuth::new([1; 16], [2; 32], true)).unwrap();
            let mut got = vec![0u8; payload().len()];
            conn.stream.read_exact(&mut got).unwrap();
            got
        });
        let mut conn = connect_stream(c, &early(Some(crate::net::transport::server_cert_pin())), 0, None, true).unwrap();
        assert!(conn.accept.is_some(), "the proof is read later");
        conn.stream.write_all(&payload()).unwrap();
        sent_tx.send(()).unwrap();
        conn.confirm_accept().unwrap();
        assert!(acceptor.join().unwrap() == payload(), "the bytes behind the hello arrived intact");
    }

    /// A stream whose TLS peer presents a certificate other than the pinned one sends nothing.
    #[test]
    fn a_writer_refuses_a_peer_without_the_pinned_certificate() {
        let (c, a) = pair();
        let acceptor = thread::spawn(move || {
            let mut kind = [0u8; 1];
            (&a).read_exact(&mut kind).unwrap();
            accept_stream(a, kind[0]).is_err()
        });
        let err = connect_stream(c, &early(Some([9; 32])), 0, None, true).err().expect("a foreign certificate is refused");
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert!(acceptor.join().unwrap(), "the refused stream sent no hello");
    }

    /// A reading connector with the early go-ahead waits for `DataAccept`, and what the
    /// acceptor sends right behind it (no round trip for the go-ahead byte) stays raw.
    #[test]
    fn a_reader_takes_the_accept_and_the_data_behind_it() {
        let (c, a) = pair();
        let acceptor = thread::spawn(move || {
            let mut conn = accept(a).finish(&StreamAuth::new([1; 16], [2; 32], true)).unwrap();
            conn.stream.write_all(&payload()).unwrap();
        });
        let mut conn = connect_stream(c, &early(None), 0, None, false).unwrap();
        assert!(conn.accept.is_none(), "a reader has checked the proof");
        let mut got = vec![0u8; payload().len()];
        conn.stream.read_exact(&mut got).unwrap();
        assert!(got == payload(), "the bytes behind DataAccept arrived intact");
        acceptor.join().unwrap();
    }
}
