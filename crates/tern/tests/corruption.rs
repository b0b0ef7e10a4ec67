//! Corruption in flight that TCP's checksum missed (issue 10): a relay between `tern cp` and a
//! real daemon flips payload bits on the data streams. Every damaged record must be caught and
//! repaired per chunk (the transfer ends ok, files identical, only damaged and in-flight chunks
//! sent again), and a path that corrupts everything must end with one clear error, in bounded
//! time, with nothing corrupt under a final name.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

use crate::common;
use common::*;

use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::thread;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// Bytes at the start of each direction of a connection left alone: the TLS handshake and the
/// data stream hello (a flip there fails stream setup, which is a different path).
const CLEAN_PREFIX: u64 = 4096;

/// What the relay did, for the assertions and the report.
#[derive(Default)]
struct Stats {
    /// Bits flipped.
    flips: AtomicU64,
    /// Data connections that got at least one flip.
    damaged_conns: AtomicU64,
    /// Data connections seen.
    data_conns: AtomicU64,
    /// Bytes forwarded on data connections.
    bytes: AtomicU64,
}

/// Where the relay flips bits on data connections.
#[derive(Clone, Copy)]
enum Damage {
    /// One bit anywhere, on average every `gap` bytes, past the first `CLEAN_PREFIX` bytes of
    /// each direction.
    Anywhere { gap: u64 },
    /// `--no-encrypt` streams (`P`): one bit in bytes `at..at + span` of a chunk frame, in the
    /// first frame past every `gap` bytes. The relay follows the framing to find them.
    PlainFrames { gap: u64, at: u64, span: u64 },
    /// One bit at byte `at` of the client-to-server direction of the first connection only,
    /// whatever it carries (an ssh connection: ssh's MAC then fails).
    OnceOnFirst { at: u64 },
}

/// Bytes before the first chunk frame of a plain data stream, counting the kind byte: client to
/// server `P`, `DataHello` (5 + 84) and the go-ahead byte; server to client `DataAccept` (5 + 32).
const PLAIN_FIRST_FRAME_UP: u64 = 1 + 89 + 1;
const PLAIN_FIRST_FRAME_DOWN: u64 = 37;
/// A chunk frame: u32 length, u8 type, then the chunk header (ids, offset, hash, tag: 89 bytes).
const PLAIN_HEADERS: Damage = Damage::PlainFrames { gap: 16 * MIB, at: 5, span: 89 };
const PLAIN_LENGTHS: Damage = Damage::PlainFrames { gap: 16 * MIB, at: 0, span: 4 };

/// A TCP relay on a loopback port in front of `target`. Control connections (first byte `C`)
/// pass untouched; data connections (`D`, `P`) get bits flipped at seeded random positions.
struct Relay {
    port: u16,
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
    accept: Option<thread::JoinHandle<()>>,
}

impl Relay {
    fn start(target: u16, damage: Damage, seed: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Stats::default());
        let (stop2, stats2) = (stop.clone(), stats.clone());
        let accept = thread::spawn(move || {
            let mut n = 0u64;
            let mut conns: Vec<thread::JoinHandle<()>> = Vec::new();
            while !stop2.load(Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        n += 1;
                        // Bounded: a runaway client cannot make the relay spawn without end.
                        assert!(n < 2000, "relay: too many connections");
                        client.set_nonblocking(false).unwrap();
                        let server = TcpStream::connect(("127.0.0.1", target)).unwrap();
                        let (stop, stats) = (stop2.clone(), stats2.clone());
                        let conn_seed = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(n);
                        let first = n == 1;
                        conns.push(thread::spawn(move || relay_conn(client, server, damage, first, conn_seed, stop, stats)));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
                    Err(e) => panic!("relay accept: {e}"),
                }
            }
            for c in conns {
                let _ = c.join();
            }
        });
        Relay { port, stop, stats, accept: Some(accept) }
    }
    fn url(&self, path: &str) -> String {
        format!("tern://127.0.0.1:{}/{}", self.port, path.trim_start_matches('/'))
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

/// xorshift64*: deterministic positions from the seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// A gap uniform in [1, 2 * mean].
    fn gap(&mut self, mean: u64) -> u64 {
        1 + self.next() % (2 * mean)
    }
}

fn relay_conn(client: TcpStream, server: TcpStream, damage: Damage, first: bool, seed: u64, stop: Arc<AtomicBool>, stats: Arc<Stats>) {
    // The connection kind is the client's first byte.
    let mut kind = [0u8; 1];
    if (&client).read_exact(&mut kind).is_err() || (&server).write_all(&kind).is_err() {
        return;
    }
    let data = kind[0] == b'D' || kind[0] == b'P';
    if data {
        stats.data_conns.fetch_add(1, Relaxed);
    }
    let (up_damage, down_damage) = match damage {
        Damage::OnceOnFirst { .. } if first => (Some(damage), None),
        Damage::OnceOnFirst { .. } => (None, None),
        Damage::PlainFrames { .. } if kind[0] != b'P' => (None, None),
        d if data => (Some(d), Some(d)),
        _ => (None, None),
    };
    let damaged = Arc::new(AtomicBool::new(false));
    let pump = |from: TcpStream, to: TcpStream, damage: Option<Damage>, seed: u64, already: u64, first_frame: u64| {
        let (stop, stats, damaged) = (stop.clone(), stats.clone(), damaged.clone());
        thread::spawn(move || {
            let mut rng = Rng(seed | 1);
            let mut pos = already;
            let mut flips = Flips::new(damage, &mut rng, first_frame);
            let mut buf = vec![0u8; 64 << 10];
            from.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            loop {
                let n = match (&from).read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        if stop.load(Relaxed) {
                            break;
                        }
                        continue;
                    }
                    Err(_) => break,
                };
                let flipped = flips.apply(&mut rng, &mut buf[..n], pos);
                if flipped > 0 {
                    stats.flips.fetch_add(flipped, Relaxed);
                    if !damaged.swap(true, Relaxed) {
                        stats.damaged_conns.fetch_add(1, Relaxed);
                    }
                }
                pos += n as u64;
                if data {
                    stats.bytes.fetch_add(n as u64, Relaxed);
                }
                if (&to).write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
        })
    };
    let up = pump(client.try_clone().unwrap(), server.try_clone().unwrap(), up_damage, seed, 1, PLAIN_FIRST_FRAME_UP);
    let down = pump(server, client, down_damage, seed ^ 0x5555_5555, 0, PLAIN_FIRST_FRAME_DOWN);
    let _ = up.join();
    let _ = down.join();
}

/// One direction's flip schedule.
struct Flips {
    damage: Option<Damage>,
    /// Absolute position of the next flip (`u64::MAX`: none scheduled).
    next_flip: u64,
    /// PlainFrames: where the next frame starts, its length bytes so far, and the position
    /// from which the next frame gets damaged.
    frame_at: u64,
    len_bytes: Vec<u8>,
    damage_from: u64,
}

impl Flips {
    fn new(damage: Option<Damage>, rng: &mut Rng, first_frame: u64) -> Self {
        let (next_flip, damage_from) = match damage {
            Some(Damage::Anywhere { gap }) => (CLEAN_PREFIX + rng.gap(gap), u64::MAX),
            Some(Damage::PlainFrames { gap, .. }) => (u64::MAX, first_frame + rng.gap(gap)),
            Some(Damage::OnceOnFirst { at }) => (at, u64::MAX),
            None => (u64::MAX, u64::MAX),
        };
        Flips { damage, next_flip, frame_at: first_frame, len_bytes: Vec::new(), damage_from }
    }

    /// Flips the scheduled bits in `buf` (which starts at stream position `pos`); returns how many.
    fn apply(&mut self, rng: &mut Rng, buf: &mut [u8], pos: u64) -> u64 {
        let end = pos + buf.len() as u64;
        let mut flipped = 0;
        if self.next_flip < pos {
            // A length straddling two reads: its flip fell in the part already forwarded.
            self.next_flip = u64::MAX;
        }
        loop {
            if let Some(Damage::PlainFrames { gap, at, span }) = self.damage {
                // Follow the framing on the bytes as sent (read before any flip in them).
                while self.len_bytes.len() < 4 && self.frame_at + (self.len_bytes.len() as u64) < end {
                    let at = self.frame_at + self.len_bytes.len() as u64;
                    if at >= pos {
                        self.len_bytes.push(buf[(at - pos) as usize]);
                    } else {
                        break;
                    }
                }
                if self.len_bytes.len() == 4 {
                    let len = u32::from_be_bytes(self.len_bytes[..].try_into().unwrap()) as u64;
                    if self.frame_at >= self.damage_from && self.next_flip == u64::MAX {
                        self.next_flip = self.frame_at + at + rng.next() % span;
                        self.damage_from = self.frame_at + rng.gap(gap);
                    }
                    self.frame_at += 4 + len;
                    self.len_bytes.clear();
                    continue;
                }
            }
            if self.next_flip >= pos && self.next_flip < end {
                buf[(self.next_flip - pos) as usize] ^= 1 << (rng.next() % 8);
                flipped += 1;
                self.next_flip = match self.damage {
                    Some(Damage::Anywhere { gap }) => self.next_flip + rng.gap(gap),
                    _ => u64::MAX,
                };
                continue;
            }
            return flipped;
        }
    }
}

const FILES: u64 = 6;
const FILE_MIB: u64 = 32;

fn make_source(dir: &Path) {
    for i in 0..FILES {
        write_file(&dir.join(format!("f{i}.bin")), 100 + i, (FILE_MIB * MIB) as usize);
    }
}

/// The most chunk frames one data stream can have in flight when the receiver stops reading it:
/// the sender's write buffer (256 KiB) and socket send buffer, the relay's socket buffers and
/// its 64 KiB, the receiver's socket receive buffer and read buffer (256 KiB), each at the
/// kernel's maximum (`tcp_wmem`, `tcp_rmem`), in chunks of `chunk` bytes, plus the frame being
/// written. Everything past the damaged record is lost with the stream and sent again.
fn max_in_flight(chunk: u64) -> u64 {
    let max = |f: &str| fs::read_to_string(f).ok().and_then(|s| s.split_whitespace().nth(2).and_then(|v| v.parse::<u64>().ok())).unwrap_or(4 * MIB);
    let (w, r) = (max("/proc/sys/net/ipv4/tcp_wmem"), max("/proc/sys/net/ipv4/tcp_rmem"));
    (2 * w + 2 * r + (576 << 10)).div_ceil(chunk) + 1
}

/// Returns how many streams were reset (and replaced).
fn repaired(encrypt: bool, push: bool, damage: Damage, seed: u64) -> u64 {
    let t = scratch();
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let relay = Relay::start(d.port, damage, seed);
    let mut args: Vec<String> = vec!["cp".into(), "-r".into(), "--token-file".into(), d.token_arg(), "--streams".into(), "4".into(), "--chunk-size".into(), "1M".into()];
    if !encrypt {
        args.push("--no-encrypt".into());
    }
    let (src, dst) = if push {
        let src = t.path().join("src");
        make_source(&src);
        args.push(src.display().to_string());
        args.push(relay.url("/dst"));
        (src, root.join("dst"))
    } else {
        let src = root.join("src");
        make_source(&src);
        let dst = t.path().join("dst");
        args.push(relay.url("/src"));
        args.push(dst.display().to_string());
        (src, dst)
    };
    let started = Instant::now();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = tern(&argv, &[("TERN_LOG", std::env::var("CORRUPTION_LOG").as_deref().unwrap_or("warn"))]);
    let secs = started.elapsed().as_secs_f64();
    if std::env::var("CORRUPTION_LOG").is_ok() {
        eprintln!("{}", r.stderr());
    }
    let s = &relay.stats;
    let (flips, damaged, conns, bytes) = (s.flips.load(Relaxed), s.damaged_conns.load(Relaxed), s.data_conns.load(Relaxed), s.bytes.load(Relaxed));
    assert!(r.ok(), "transfer through a corrupting path failed (flips {flips}): {}", r.stderr());
    assert_same_tree(&src, &dst);
    assert_no_leftovers(&dst);
    let resent = r.u64("chunks_resent");
    eprintln!(
        "corruption report: encrypt={encrypt} push={push}: {flips} bits flipped on {damaged} of {conns} data connections ({} MiB relayed), chunks_resent={resent} bytes_resent={} reconnects={} in {secs:.1} s",
        bytes >> 20,
        r.u64("bytes_resent"),
        r.json["reconnects"].as_u64().unwrap_or(0),
    );
    assert!(flips > 0, "the relay flipped nothing: the test tests nothing");
    assert!(resent > 0, "flipped bits were repaired without resending anything? {}", r.json);
    // Each flip damages at most one chunk (a skipped record, or `ChunkBad`); a stream whose
    // framing a flip broke is reset and replaced (every data connection past the first 4 is a
    // replacement) and loses what it had in flight.
    let chunk = MIB; // --chunk-size
    let resets = conns.saturating_sub(4);
    let bound = flips + resets * max_in_flight(chunk);
    eprintln!("corruption report: bound {bound} = {flips} flips + {resets} reset streams x {} chunks in flight at most", max_in_flight(chunk));
    assert!(resent <= bound, "resent {resent} chunks for {flips} flips and {resets} resets: more than the damaged chunks plus those in flight");
    assert_eq!(r.json["reconnects"].as_u64().unwrap_or(0), 0, "the corrupted streams were repaired in the session, not by reconnecting: {}", r.stderr());
    resets
}

#[test]
fn corruption_repaired_encrypted_push() {
    repaired(true, true, Damage::Anywhere { gap: 16 * MIB }, 1);
}

#[test]
fn corruption_repaired_encrypted_pull() {
    repaired(true, false, Damage::Anywhere { gap: 16 * MIB }, 2);
}

#[test]
fn corruption_repaired_plain_push() {
    repaired(false, true, Damage::Anywhere { gap: 16 * MIB }, 3);
}

#[test]
fn corruption_repaired_plain_pull() {
    repaired(false, false, Damage::Anywhere { gap: 16 * MIB }, 4);
}

/// `--no-encrypt`: a flipped bit in a chunk frame's header or tag fails the frame's tag; the
/// receiver skips that frame and it is sent again (payload flips above fail the chunk hash).
#[test]
fn plain_header_corruption_repaired_push() {
    repaired(false, true, PLAIN_HEADERS, 5);
}

#[test]
fn plain_header_corruption_repaired_pull() {
    repaired(false, false, PLAIN_HEADERS, 6);
}

/// A flipped length field breaks the framing of everything after it: the receiver resets the
/// stream, the sender sends what it had in flight again, the client opens a replacement.
#[test]
fn plain_length_corruption_resets_and_replaces_streams() {
    let resets = repaired(false, true, PLAIN_LENGTHS, 8);
    assert!(resets > 0, "no stream was reset: the reset path was not exercised");
    let resets = repaired(false, false, PLAIN_LENGTHS, 9);
    assert!(resets > 0, "no stream was reset: the reset path was not exercised");
}

/// Every record of every data stream corrupted (an attacker injecting, or a hopeless path): a
/// clear error after a bounded number of resets, in bounded time, nothing corrupt in place.
fn hopeless(encrypt: bool) {
    let t = scratch();
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    // A flip every ~64 KiB: every 1 MiB chunk frame is hit many times.
    let relay = Relay::start(d.port, Damage::Anywhere { gap: 64 << 10 }, 9);
    let src = t.path().join("src");
    make_source(&src);
    let mut args = vec!["cp", "-r", "--streams", "4"];
    if !encrypt {
        args.push("--no-encrypt");
    }
    let token = d.token_arg();
    let (s, u) = (src.display().to_string(), relay.url("/dst"));
    args.extend(["--token-file", &token, &s, &u]);
    let started = Instant::now();
    let r = tern(&args, &[]);
    let secs = started.elapsed().as_secs_f64();
    let e = r.stderr();
    eprintln!(
        "hopeless report: encrypt={encrypt}: exit {:?} after {secs:.1} s, {} data connections, {} flips; stderr: {e}",
        r.out.status.code(),
        relay.stats.data_conns.load(Relaxed),
        relay.stats.flips.load(Relaxed)
    );
    assert!(!r.ok(), "a path that corrupts everything cannot succeed");
    if encrypt {
        assert!(e.contains("keep failing authentication") && e.contains("refusing"), "{e}");
        assert!(e.lines().filter(|l| !l.trim().is_empty()).count() <= 3, "one clear error, not a flood: {e}");
    } else {
        // Without encryption a flipped payload bit fails the chunk hash, not the stream: each
        // file is re-requested chunk by chunk until its own bound, then fails with one line.
        assert!(e.contains("keep failing"), "{e}");
    }
    // Bounded retries: the budget's resets, each replaced by one new stream, plus the first ones.
    assert!(relay.stats.data_conns.load(Relaxed) <= 4 + 17 + 4, "{} data connections", relay.stats.data_conns.load(Relaxed));
    // Nothing corrupt under a final name: whatever landed is identical to its source.
    let dst = root.join("dst");
    for i in 0..FILES {
        let name = format!("f{i}.bin");
        if let Ok(got) = fs::read(dst.join(&name)) {
            assert!(got == fs::read(src.join(&name)).unwrap(), "{name} landed corrupt");
        }
    }
}

#[test]
fn corrupting_everything_is_refused_encrypted() {
    hopeless(true);
}

#[test]
fn corrupting_everything_is_refused_plain() {
    hopeless(false);
}

/// A peer without Hello bit 5 (an older tern) cannot answer `StreamReset`: corruption stays
/// fatal for the session, with the old message, as before this feature.
#[test]
fn older_peer_keeps_the_fatal_behaviour() {
    let t = scratch();
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    // Bits 0-4: everything this build has except stream resets.
    let d = Daemon::start_on(&root, &t.path().join("token"), 0, &[("TERN_DEBUG_FEATURES", "31")]);
    let relay = Relay::start(d.port, Damage::Anywhere { gap: 4 * MIB }, 7);
    let src = t.path().join("src");
    make_source(&src);
    let (s, u, token) = (src.display().to_string(), relay.url("/dst"), d.token_arg());
    let r = tern(&["cp", "-r", "--streams", "4", "--token-file", &token, &s, &u], &[]);
    let e = r.stderr();
    assert!(!r.ok(), "corruption with an older peer is not repaired");
    assert!(e.contains("failed decryption") && e.contains("refusing it"), "{e}");
    for i in 0..FILES {
        let name = format!("f{i}.bin");
        if let Ok(got) = fs::read(root.join("dst").join(&name)) {
            assert!(got == fs::read(src.join(&name)).unwrap(), "{name} landed corrupt");
        }
    }
}

/// Over ssh the control channel is ssh's: a flipped bit fails ssh's MAC and ssh exits. That is a
/// network error, so the client reconnects and resumes; the transfer still ends ok and intact.
#[test]
fn corrupted_ssh_control_channel_reconnects_and_resumes() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let src = t.path().join("src");
    // Many small files: a manifest long enough that the flip lands in the session, after ssh's
    // key exchange and login.
    for i in 0..3000u64 {
        write_file(&src.join(format!("d{}/s{i:05}.dat", i % 10)), i, 512 + (i as usize * 37) % 2048);
    }
    make_source(&src.join("big"));
    let dst = t.path().join("dst");
    let relay = Relay::start(sshd.port, Damage::OnceOnFirst { at: 96 << 10 }, 11);
    let ssh = format!("ssh -p {} -i {}/userkey -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ControlPath=none", relay.port, sshd.dir.path().display());
    let r = tern(&["cp", "-r", "--ssh", &ssh, src.to_str().unwrap(), &format!("127.0.0.1:{}", dst.display())], &[]);
    let flips = relay.stats.flips.load(Relaxed);
    eprintln!("ssh control report: {flips} flip(s), exit {:?}, reconnects {}, stderr: {}", r.out.status.code(), r.json["reconnects"], r.stderr());
    assert_eq!(flips, 1, "the first ssh connection carried fewer bytes than the flip's position: the test tests nothing");
    assert!(r.ok(), "{}", r.stderr());
    assert!(r.json["reconnects"].as_u64().unwrap_or(0) >= 1, "a corrupted ssh connection cannot have survived: {}", r.json);
    assert_same_tree(&src, &dst);
    assert_no_leftovers(&dst);
}
