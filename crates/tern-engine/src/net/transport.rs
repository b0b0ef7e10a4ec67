//! Byte streams between peers: TCP, TLS 1.3 (rustls, aws-lc-rs), Unix socket pairs and pipes.
//!
//! Certificates are self-signed and not checked by name: peers authenticate each other by proving
//! knowledge of the shared secret bound to the TLS exporter value (`tern_proto::auth`), which a
//! relay between two TLS sessions cannot forward.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, ServerConfig, ServerConnection, SignatureScheme, StreamOwned};

const EXPORTER_LABEL: &[u8] = b"EXPORTER-tern-channel-binding";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// This process's TLS server identity: its config and its certificate's pin.
struct ServerIdentity {
    config: Arc<ServerConfig>,
    pin: [u8; 32],
}

fn server_identity() -> &'static ServerIdentity {
    static IDENTITY: OnceLock<ServerIdentity> = OnceLock::new();
    IDENTITY.get_or_init(|| {
        let ck = rcgen::generate_simple_self_signed(vec!["tern".to_string()]).expect("generating a TLS key");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
        let pin = cert_pin(ck.cert.der());
        let mut cfg = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3 is supported")
            .with_no_client_auth()
            .with_single_cert(vec![ck.cert.der().clone()], key)
            .expect("self-signed certificate is valid");
        // No tickets: post-handshake writes from the read side would complicate the split.
        cfg.send_tls13_tickets = 0;
        ServerIdentity { config: Arc::new(cfg), pin }
    })
}

/// A server config with a fresh self-signed certificate (made once per process).
pub fn server_config() -> Arc<ServerConfig> {
    server_identity().config.clone()
}

/// The pin of the certificate every TLS connection this process accepts presents (its control
/// and data connections share one): what `Ready` carries to a client with `FEATURE_EARLY_GO`.
pub fn server_cert_pin() -> [u8; 32] {
    server_identity().pin
}

/// BLAKE3 of a certificate's DER encoding.
fn cert_pin(der: &[u8]) -> [u8; 32] {
    *blake3::hash(der).as_bytes()
}

pub fn client_config() -> Arc<ClientConfig> {
    static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let algs = provider().signature_verification_algorithms;
            let cfg = ClientConfig::builder_with_provider(provider())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .expect("TLS 1.3 is supported")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(SecretBoundVerifier(algs)))
                .with_no_client_auth();
            Arc::new(cfg)
        })
        .clone()
}

/// Accepts any certificate but still checks the handshake signature; identity comes from the
/// secret-bound proofs exchanged right after the handshake.
#[derive(Debug)]
struct SecretBoundVerifier(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for SecretBoundVerifier {
    fn verify_server_cert(&self, _: &CertificateDer<'_>, _: &[CertificateDer<'_>], _: &ServerName<'_>, _: &[u8], _: UnixTime) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(&self, m: &[u8], c: &CertificateDer<'_>, d: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0)
    }
    fn verify_tls13_signature(&self, m: &[u8], c: &CertificateDer<'_>, d: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

fn tls_err(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

/// A data stream: one direction of bulk data after its handshake.
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    TlsClient(Box<StreamOwned<ClientConnection, RecordReader>>),
    TlsServer(Box<StreamOwned<ServerConnection, RecordReader>>),
}

/// A socket that TLS reads one record at a time, never past the end of the record it is in.
/// A data stream leaves TLS after its hello (frames are sealed with an exported key), so the
/// bytes a peer sends right behind its last TLS record (the go-ahead byte, the first chunks)
/// must stay in the socket for the raw stream rather than vanish into the TLS buffer.
pub struct RecordReader {
    sock: TcpStream,
    head: [u8; 5],
    head_len: usize,
    body_left: usize,
}

impl RecordReader {
    fn new(sock: TcpStream) -> Self {
        RecordReader { sock, head: [0; 5], head_len: 0, body_left: 0 }
    }
}

impl Read for RecordReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.head_len < self.head.len() {
            let want = (self.head.len() - self.head_len).min(buf.len());
            let n = self.sock.read(&mut buf[..want])?;
            self.head[self.head_len..self.head_len + n].copy_from_slice(&buf[..n]);
            self.head_len += n;
            if self.head_len == self.head.len() {
                // Content type, legacy version, then the record's length.
                self.body_left = u16::from_be_bytes([self.head[3], self.head[4]]) as usize;
                if self.body_left == 0 {
                    self.head_len = 0;
                }
            }
            return Ok(n);
        }
        let want = self.body_left.min(buf.len());
        let n = self.sock.read(&mut buf[..want])?;
        self.body_left -= n;
        if self.body_left == 0 {
            self.head_len = 0;
        }
        Ok(n)
    }
}

impl Write for RecordReader {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sock.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.sock.flush()
    }
}

/// Closes a stream from another thread (to unblock a reader or writer on cancel).
#[derive(Clone)]
pub struct Closer(Arc<dyn Fn() + Send + Sync>);

impl Closer {
    pub fn close(&self) {
        (self.0)()
    }
    pub fn noop() -> Self {
        Closer(Arc::new(|| {}))
    }
}

impl Stream {
    /// TLS client handshake on a connected socket; returns the stream and its exporter value.
    /// Reads record by record (`RecordReader`), so nothing the peer sends after TLS is lost.
    pub fn tls_client(sock: TcpStream) -> io::Result<(Self, [u8; 32])> {
        let (conn, sock, exporter) = client_handshake(RecordReader::new(sock))?;
        Ok((Stream::TlsClient(Box::new(StreamOwned::new(conn, sock))), exporter))
    }

    pub fn tls_server(sock: TcpStream) -> io::Result<(Self, [u8; 32])> {
        let (conn, sock, exporter) = server_handshake(RecordReader::new(sock))?;
        Ok((Stream::TlsServer(Box::new(StreamOwned::new(conn, sock))), exporter))
    }

    /// Whether a TLS client stream's peer presented the certificate `pin` names.
    pub fn peer_has_pin(&self, pin: &[u8; 32]) -> bool {
        match self {
            Stream::TlsClient(s) => s.conn.peer_certificates().and_then(|c| c.first()).is_some_and(|c| &cert_pin(c) == pin),
            _ => false,
        }
    }

    pub fn closer(&self) -> Closer {
        let sock = match self {
            Stream::Tcp(s) => s.try_clone(),
            Stream::TlsClient(s) => s.sock.sock.try_clone(),
            Stream::TlsServer(s) => s.sock.sock.try_clone(),
            Stream::Unix(u) => {
                return match u.try_clone() {
                    Ok(u) => Closer(Arc::new(move || {
                        let _ = u.shutdown(Shutdown::Both);
                    })),
                    Err(_) => Closer::noop(),
                };
            }
        };
        match sock {
            Ok(s) => Closer(Arc::new(move || {
                let _ = s.shutdown(Shutdown::Both);
            })),
            Err(_) => Closer::noop(),
        }
    }
}

fn export<D>(conn: &rustls::ConnectionCommon<D>) -> io::Result<[u8; 32]> {
    let mut out = [0u8; 32];
    conn.export_keying_material(&mut out, EXPORTER_LABEL, None).map_err(tls_err)?;
    Ok(out)
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::TlsClient(s) => s.read(buf),
            Stream::TlsServer(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::TlsClient(s) => s.write(buf),
            Stream::TlsServer(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
            Stream::TlsClient(s) => s.flush(),
            Stream::TlsServer(s) => s.flush(),
        }
    }
}

/// Socket options for every tern TCP connection: no Nagle (control latency), keepalive and a
/// user timeout so a dead peer is noticed in about a minute even when no data is flowing.
pub fn tune_socket(sock: &TcpStream, bufsize: Option<usize>) {
    let s = socket2::SockRef::from(sock);
    let _ = s.set_tcp_nodelay(true);
    let ka = socket2::TcpKeepalive::new().with_time(Duration::from_secs(20)).with_interval(Duration::from_secs(5)).with_retries(6);
    let _ = s.set_tcp_keepalive(&ka);
    let _ = s.set_tcp_user_timeout(Some(Duration::from_secs(60)));
    if let Some(b) = bufsize {
        // Explicit sizes lock the buffers and switch off autotuning: only on request.
        let _ = s.set_send_buffer_size(b);
        let _ = s.set_recv_buffer_size(b);
    }
}

/// What a sending data stream's socket may hold unsent (`TCP_NOTSENT_LOWAT`): about what the
/// stream sends in `UNSENT_TIME`, within these bounds. A stream that slows down (a loss on a long
/// path halves its window, reno regrows it by one segment per round trip) then takes no more
/// chunks than it can send soon, and the other streams carry the rest; without a cap, autotuning
/// lets each socket queue up to `tcp_wmem`'s maximum (4 MiB untuned, 64 MiB and more on a tuned
/// DTN) and the transfer ends only when the slowest stream has drained its queue. A fast stream
/// keeps a large queue: the kernel wakes the writer when half of it has gone out, and the writer
/// must read, hash and seal its next chunk before the rest is gone, on a busy host too (a fixed
/// 256 KiB cost 16 % on loopback; 20 ms of rate cost 2.5 % at 68 ms without loss, 100 ms
/// nothing). Measured: `bench/results/s13-unsent-100ms-68ms*.md`, `s13-unsent-68ms*.md`.
const MIN_UNSENT: u64 = 256 << 10;
const MAX_UNSENT: u64 = 16 << 20;
const UNSENT_TIME: Duration = Duration::from_millis(100);
/// The stream's rate is measured over windows at least this long.
const UNSENT_WINDOW: Duration = Duration::from_millis(100);

/// Keeps a sending data stream's unsent bytes near what it sends in [`UNSENT_TIME`]; the sender
/// calls [`UnsentCap::update`] after each frame. Without a socket (an in-process pair) it does
/// nothing; a kernel without `TCP_NOTSENT_LOWAT` (before Linux 3.12) keeps its default.
pub struct UnsentCap<'a> {
    sock: Option<&'a TcpStream>,
    since: std::time::Instant,
    acked: u64,
    cap: u64,
}

impl<'a> UnsentCap<'a> {
    pub fn new(sock: Option<&'a TcpStream>) -> Self {
        let mut c = Self { sock, since: std::time::Instant::now(), acked: 0, cap: 0 };
        c.set(MAX_UNSENT);
        c
    }

    pub fn update(&mut self) {
        let Some(sock) = self.sock else { return };
        let elapsed = self.since.elapsed();
        if elapsed < UNSENT_WINDOW {
            return;
        }
        let Some(acked) = bytes_acked(sock) else { return };
        let rate = acked.saturating_sub(self.acked) as f64 / elapsed.as_secs_f64();
        (self.since, self.acked) = (std::time::Instant::now(), acked);
        let want = ((rate * UNSENT_TIME.as_secs_f64()) as u64).clamp(MIN_UNSENT, MAX_UNSENT);
        // A quarter either way before it changes: the rate of a steady stream wobbles.
        if want > self.cap + self.cap / 4 || want < self.cap - self.cap / 4 {
            self.set(want);
        }
    }

    fn set(&mut self, cap: u64) {
        use std::os::fd::AsRawFd;
        let Some(sock) = self.sock else { return };
        self.cap = cap;
        let v = cap as libc::c_int;
        // SAFETY: a valid descriptor and a c_int option value of the size passed.
        let _ = unsafe { libc::setsockopt(sock.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, (&v as *const libc::c_int).cast(), std::mem::size_of::<libc::c_int>() as libc::socklen_t) };
    }
}

fn tcp_info(sock: &TcpStream) -> Option<libc::tcp_info> {
    use std::os::fd::AsRawFd;
    // SAFETY: tcp_info is plain integers (zero is valid); getsockopt fills at most `len` bytes.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let rc = unsafe { libc::getsockopt(sock.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_INFO, (&mut info as *mut libc::tcp_info).cast(), &mut len) };
    (rc == 0).then_some(info)
}

/// Bytes the peer acknowledged on this socket.
fn bytes_acked(sock: &TcpStream) -> Option<u64> {
    tcp_info(sock).map(|i| i.tcpi_bytes_acked)
}

/// Bytes this socket has delivered (acknowledged by the peer when sending, received when
/// receiving), from the kernel's `TCP_INFO`. Unlike bytes handed to `write`, this does not jump
/// when new sockets add buffer space, so it is the honest signal for the stream ramp.
pub fn delivered_bytes(sock: &TcpStream) -> Option<u64> {
    tcp_info(sock).map(|i| i.tcpi_bytes_acked + i.tcpi_bytes_received)
}

/// A sending socket's kernel counters (`TCP_INFO`): data segments sent, segments retransmitted,
/// and reorderings the sender detected. Over a window (`since`), retransmitted / sent is the
/// path's loss as TCP met it (with spurious retransmits, which reordering causes, counted in).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpCounters {
    pub data_segs_out: u64,
    pub retrans_segs: u64,
    pub reord_seen: u64,
}

impl TcpCounters {
    /// What happened between `before` and now (counters only grow; a wrap reads as zero).
    pub fn since(self, before: TcpCounters) -> TcpCounters {
        TcpCounters {
            data_segs_out: self.data_segs_out.saturating_sub(before.data_segs_out),
            retrans_segs: self.retrans_segs.saturating_sub(before.retrans_segs),
            reord_seen: self.reord_seen.saturating_sub(before.reord_seen),
        }
    }
}

impl std::ops::Add for TcpCounters {
    type Output = TcpCounters;
    fn add(self, o: TcpCounters) -> TcpCounters {
        TcpCounters { data_segs_out: self.data_segs_out + o.data_segs_out, retrans_segs: self.retrans_segs + o.retrans_segs, reord_seen: self.reord_seen + o.reord_seen }
    }
}

/// `sock`'s `TcpCounters`; None where the kernel does not say.
pub fn tcp_counters(sock: &TcpStream) -> Option<TcpCounters> {
    tcp_info(sock).map(|i| TcpCounters { data_segs_out: i.tcpi_data_segs_out.into(), retrans_segs: i.tcpi_total_retrans.into(), reord_seen: i.tcpi_reord_seen.into() })
}

/// The two halves of a control channel, usable from two threads at once.
pub struct ControlHalves {
    pub reader: Box<dyn Read + Send>,
    pub writer: Box<dyn Write + Send>,
    pub closer: Closer,
}

impl ControlHalves {
    pub fn from_unix(s: UnixStream) -> io::Result<Self> {
        let w = s.try_clone()?;
        let c = s.try_clone()?;
        Ok(Self {
            reader: Box::new(s),
            writer: Box::new(w),
            closer: Closer(Arc::new(move || {
                let _ = c.shutdown(Shutdown::Both);
            })),
        })
    }

    /// Splits a TLS connection so one thread can read while another writes. The reader never
    /// holds the connection lock across socket I/O, and never writes (tickets are off), so a
    /// full socket buffer in one direction cannot block the other.
    pub fn from_tls(conn: rustls::Connection, sock: TcpStream) -> io::Result<Self> {
        let conn = Arc::new(Mutex::new(conn));
        let closer_sock = sock.try_clone()?;
        Ok(Self {
            reader: Box::new(TlsReadHalf { conn: conn.clone(), sock: sock.try_clone()?, buf: vec![0; 64 << 10], start: 0, end: 0 }),
            writer: Box::new(TlsWriteHalf { conn, sock, out: Vec::new() }),
            closer: Closer(Arc::new(move || {
                let _ = closer_sock.shutdown(Shutdown::Both);
            })),
        })
    }
}

struct TlsReadHalf {
    conn: Arc<Mutex<rustls::Connection>>,
    sock: TcpStream,
    /// Socket bytes read but not yet handed to rustls: it accepts more only once the plaintext
    /// it already decrypted has been read out (its received-plaintext buffer is bounded).
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Read for TlsReadHalf {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            {
                let mut conn = self.conn.lock().unwrap();
                match conn.reader().read(out) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if self.start < self.end {
                    let mut slice = &self.buf[self.start..self.end];
                    let before = slice.len();
                    conn.read_tls(&mut slice)?;
                    self.start += before - slice.len();
                    conn.process_new_packets().map_err(tls_err)?;
                    continue;
                }
            }
            let n = self.sock.read(&mut self.buf)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed the connection"));
            }
            self.start = 0;
            self.end = n;
        }
    }
}

struct TlsWriteHalf {
    conn: Arc<Mutex<rustls::Connection>>,
    sock: TcpStream,
    out: Vec<u8>,
}

impl Write for TlsWriteHalf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // rustls takes a bounded amount of plaintext at a time: encrypt what it accepts, send
        // it (without holding the lock), repeat.
        let mut done = 0;
        while done < buf.len() {
            self.out.clear();
            let accepted = {
                let mut conn = self.conn.lock().unwrap();
                let n = conn.writer().write(&buf[done..])?;
                while conn.wants_write() {
                    conn.write_tls(&mut self.out)?;
                }
                n
            };
            if accepted == 0 && self.out.is_empty() {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "TLS layer accepted no data"));
            }
            self.sock.write_all(&self.out)?;
            done += accepted;
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Completes a TLS handshake on a socket and returns the split control halves and the exporter.
pub fn tls_control_client(sock: TcpStream) -> io::Result<(ControlHalves, [u8; 32])> {
    let (conn, sock, exporter) = client_handshake(sock)?;
    Ok((ControlHalves::from_tls(rustls::Connection::Client(conn), sock)?, exporter))
}

pub fn tls_control_server(sock: TcpStream) -> io::Result<(ControlHalves, [u8; 32])> {
    let (conn, sock, exporter) = server_handshake(sock)?;
    Ok((ControlHalves::from_tls(rustls::Connection::Server(conn), sock)?, exporter))
}

/// A completed TLS 1.3 client handshake on `sock`, with the session's exporter value.
fn client_handshake<S: Read + Write>(mut sock: S) -> io::Result<(ClientConnection, S, [u8; 32])> {
    let name = ServerName::try_from("tern").unwrap();
    let mut conn = ClientConnection::new(client_config(), name).map_err(tls_err)?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock)?;
    }
    let exporter = export(&conn)?;
    Ok((conn, sock, exporter))
}

fn server_handshake<S: Read + Write>(mut sock: S) -> io::Result<(ServerConnection, S, [u8; 32])> {
    let mut conn = ServerConnection::new(server_config()).map_err(tls_err)?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock)?;
    }
    let exporter = export(&conn)?;
    Ok((conn, sock, exporter))
}

/// Fresh random bytes from the OS.
pub fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("OS random source");
    b
}

/// The first of `addrs` that accepts a connection within 10 s.
pub(crate) fn connect_any(addrs: &[std::net::SocketAddr]) -> std::io::Result<TcpStream> {
    let mut last = None;
    for a in addrs {
        match TcpStream::connect_timeout(a, Duration::from_secs(10)) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no address")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn notsent_lowat(sock: &TcpStream) -> u32 {
        use std::os::fd::AsRawFd;
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: a valid descriptor and a c_int buffer of the size passed.
        let rc = unsafe { libc::getsockopt(sock.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, (&mut v as *mut libc::c_int).cast(), &mut len) };
        assert_eq!(rc, 0);
        v as u32
    }

    #[test]
    fn a_stream_that_sends_little_may_hold_little_unsent_and_a_fast_one_much() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut sock = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        let mut cap = UnsentCap::new(Some(&sock));
        assert_eq!(notsent_lowat(&sock) as u64, MAX_UNSENT, "a new stream starts unhindered");
        // Nothing sent for a window: the stream is slow, its queue shrinks to the floor.
        std::thread::sleep(UNSENT_WINDOW);
        cap.update();
        assert_eq!(notsent_lowat(&sock) as u64, MIN_UNSENT);
        // 64 MiB acknowledged (in well under the 4 s that would be too slow to matter): a deeper queue.
        let reader = std::thread::spawn(move || std::io::copy(&mut peer, &mut std::io::sink()).unwrap());
        let chunk = vec![7u8; 1 << 20];
        for _ in 0..64 {
            (&sock).write_all(&chunk).unwrap();
        }
        std::thread::sleep(UNSENT_WINDOW);
        cap.update();
        assert!(notsent_lowat(&sock) as u64 > MIN_UNSENT, "a fast stream keeps a deeper queue: {}", notsent_lowat(&sock));
        sock.shutdown(Shutdown::Write).unwrap();
        assert_eq!(reader.join().unwrap(), 64 << 20);
        let _ = sock.flush();
    }
}
