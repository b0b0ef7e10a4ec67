//! A daemon under attack by clients that hold no token, or hold one and ask too much: silent
//! and half-open connections, more connections or sessions than its caps, and third-party
//! requests that would make it dial where its operator did not allow. Real `tern serve`
//! processes on loopback; the attacker is raw sockets or a hand-driven protocol client.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

use crate::common;

use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use tern_engine::net::control::{CtrlReader, CtrlWriter};
use tern_proto::Control;
use tern_proto::msg::{Options, Role};

/// Threads and open descriptors of a process, from /proc.
fn threads_and_fds(pid: u32) -> (usize, usize) {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let threads = status.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap().trim().parse().unwrap();
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    (threads, fds)
}

/// Waits (bounded) until the daemon has closed `sock`: EOF or a reset.
fn closed_by_daemon(mut sock: &TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 256];
    while Instant::now() < deadline {
        let _ = sock.set_read_timeout(Some(Duration::from_millis(200)));
        match sock.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn silent_and_half_open_connections_neither_exhaust_the_daemon_nor_stop_a_real_copy() {
    let t = scratch();
    fs::create_dir(t.path().join("root")).unwrap();
    let mut d = Daemon::start_with(&t.path().join("root"), &t.path().join("token"), 0, &[], &["--max-connections", "64", "--auth-timeout", "2"]);
    let pid = d.child.id();
    // The daemon's start-up probe connection has gone, its reaper thread has started.
    std::thread::sleep(Duration::from_millis(300));
    let (base_threads, base_fds) = threads_and_fds(pid);

    // 400 attackers: silent, a control connection's kind byte and nothing more, a data
    // stream's kind byte and half a TLS record.
    let mut attackers = Vec::new();
    let mut failed = 0;
    for i in 0..400 {
        match TcpStream::connect_timeout(&format!("127.0.0.1:{}", d.port).parse().unwrap(), Duration::from_secs(5)) {
            Ok(mut s) => {
                match i % 3 {
                    1 => drop(s.write_all(b"C")),
                    2 => drop(s.write_all(b"D\x16\x03\x01\x02")),
                    _ => {}
                }
                attackers.push(s);
            }
            Err(_) => failed += 1,
        }
    }
    // Threads of connections the gate just dropped take a moment to wind down: right after the
    // flood the count is bounded loosely (never one per attacker), and settles to the design
    // bound within a second or two.
    let (peak_threads, _) = threads_and_fds(pid);
    assert!(peak_threads <= base_threads + 100, "{peak_threads} threads right after 400 connections (idle: {base_threads})");
    let settle = Instant::now() + Duration::from_secs(3);
    let (mut flood_threads, mut flood_fds) = threads_and_fds(pid);
    while (flood_threads > base_threads + 16 + 8 + 2 || flood_fds > base_fds + 2 * (16 + 8) + 2) && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(50));
        (flood_threads, flood_fds) = threads_and_fds(pid);
    }
    eprintln!("idle daemon: {base_threads} threads, {base_fds} fds; with {} attacker connections ({failed} did not connect): {flood_threads} threads, {flood_fds} fds", attackers.len());
    assert!(attackers.len() >= 300, "the kernel took only {} of 400 connections", attackers.len());
    // 64 connections in all, 16 of them waiting to authenticate, 8 threads telling the
    // over-cap ones "busy": never one thread per attacker.
    assert!(flood_threads <= base_threads + 16 + 8 + 2, "{flood_threads} threads under the flood (idle: {base_threads})");
    assert!(flood_fds <= base_fds + 2 * (16 + 8) + 2, "{flood_fds} descriptors under the flood (idle: {base_fds})");

    // A real client meanwhile: its connections are the newest, the silent ones make room.
    write_file(&t.path().join("src/a.bin"), 1, 3 << 20);
    write_file(&t.path().join("src/b.txt"), 2, 1000);
    let sampler = {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let h = std::thread::spawn(move || {
            let mut most = (0, 0);
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                let (th, fd) = threads_and_fds(pid);
                most = (most.0.max(th), most.1.max(fd));
                std::thread::sleep(Duration::from_millis(10));
            }
            most
        });
        (stop, h)
    };
    let r = tern(&["cp", "-r", &t.path().join("src").display().to_string(), &d.url("/copy"), "--token-file", &d.token_arg()], &[]);
    sampler.0.store(true, std::sync::atomic::Ordering::Relaxed);
    let (most_threads, most_fds) = sampler.1.join().unwrap();
    assert!(r.ok(), "a real copy failed under the flood: {}", r.stderr());
    assert_same_tree(&t.path().join("src"), &t.path().join("root/copy"));
    eprintln!("during the copy: at most {most_threads} threads, {most_fds} fds");
    assert!(most_threads <= base_threads + 64 + 8 + 32, "{most_threads} threads (idle: {base_threads})");
    assert!(most_fds <= base_fds + 2 * (64 + 8) + 8, "{most_fds} descriptors (idle: {base_fds})");

    // Every attacker is closed: the oldest dropped for newcomers, the rest at the deadline.
    let started = Instant::now();
    let open = attackers.iter().filter(|s| !closed_by_daemon(s, Duration::from_secs(30))).count();
    assert_eq!(open, 0, "{open} silent connections still open");
    eprintln!("all attacker connections closed {:.1} s after the copy", started.elapsed().as_secs_f64());
    drop(attackers);
    // And the daemon is back to its idle size.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (th, fd) = threads_and_fds(pid);
        if th <= base_threads + 1 && fd <= base_fds + 1 {
            break;
        }
        assert!(Instant::now() < deadline, "daemon did not shrink back: {th} threads, {fd} fds (idle: {base_threads}, {base_fds})");
        std::thread::sleep(Duration::from_millis(50));
    }
    d.kill9();
}

/// A control session that authenticated and opened (as a receiver of `/held`), then idles.
fn held_session(d: &Daemon) -> (CtrlReader, CtrlWriter, TcpStream) {
    let (mut r, w, sock) = authenticated(d);
    let mut o = Options { chunk_size: 1 << 20, streams: 1, ..Options::default() };
    o.set_recursive(true);
    w.send(&Control::Open { server_role: Role::Receiver, options: o, sources: vec![b"/x".to_vec()], destination: b"/held".to_vec() }).unwrap();
    match r.recv().unwrap() {
        Control::Ready { .. } => {}
        other => panic!("expected Ready, got {other:?}"),
    }
    (r, w, sock)
}

/// A control connection that passed TLS, Hello and Auth with the daemon's token.
fn authenticated(d: &Daemon) -> (CtrlReader, CtrlWriter, TcpStream) {
    let (r, w, sock, _key) = authenticated_keyed(d);
    (r, w, sock)
}

/// As [`authenticated`], with the session key (data streams prove themselves with it).
fn authenticated_keyed(d: &Daemon) -> (CtrlReader, CtrlWriter, TcpStream, [u8; 32]) {
    let sock = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    (&sock).write_all(b"C").unwrap();
    let (halves, exporter) = tern_engine::net::transport::tls_control_client(sock.try_clone().unwrap()).unwrap();
    let mut r = CtrlReader::new(halves.reader);
    let w = CtrlWriter::new(halves.writer);
    let secret = fs::read(&d.token).unwrap();
    let key = tern_proto::auth::token_key(secret.trim_ascii());
    let (session_key, ..) = tern_engine::net::handshake::client(&mut r, &w, &key, &exporter, "the daemon", false, None).unwrap();
    (r, w, sock, session_key)
}

#[test]
fn over_its_caps_a_daemon_says_it_is_busy_in_one_line() {
    let t = scratch();
    fs::create_dir(t.path().join("root")).unwrap();
    write_file(&t.path().join("f.txt"), 1, 1000);
    let f = t.path().join("f.txt").display().to_string();

    // Sessions: one at a time.
    let d = Daemon::start_with(&t.path().join("root"), &t.path().join("token"), 0, &[], &["--max-sessions", "1"]);
    let held = held_session(&d);
    let r = tern(&["cp", &f, &d.url("/one.txt"), "--token-file", &d.token_arg()], &[]);
    assert!(!r.ok());
    let err = r.stderr();
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("daemon busy: 1 sessions running; try again later"), "{err}");
    // Its place is given back when it ends.
    let _ = held.2.shutdown(Shutdown::Both);
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = tern(&["cp", &f, &d.url("/one.txt"), "--token-file", &d.token_arg()], &[]);
        if r.ok() {
            break;
        }
        assert!(Instant::now() < deadline && r.stderr().contains("daemon busy"), "{}", r.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(d);

    // Connections: two in all, both taken by authenticated sessions.
    let d = Daemon::start_with(&t.path().join("root"), &t.path().join("token2"), 0, &[], &["--max-connections", "2"]);
    let _h1 = held_session(&d);
    let _h2 = held_session(&d);
    let r = tern(&["cp", &f, &d.url("/two.txt"), "--token-file", &d.token_arg(), "--streams", "1"], &[]);
    assert!(!r.ok());
    let err = r.stderr();
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("daemon busy: 2 connections open; try again later"), "{err}");
}

/// A token holder's third-party request: "send /src to ADDR". Returns the daemon's answer.
fn ask_to_dial(d: &Daemon, addr: &str) -> Result<(), String> {
    let (mut r, w, _sock) = authenticated(d);
    let mut o = Options { chunk_size: 1 << 20, streams: 4, ..Options::default() };
    o.set_recursive(true);
    o.set_third_party(true);
    w.send(&Control::Open { server_role: Role::Sender, options: o, sources: vec![b"/src".to_vec()], destination: Vec::new() }).unwrap();
    w.send(&Control::Dial { addr: addr.as_bytes().to_vec(), session_id: [7; 16], ticket: [9; 32] }).unwrap();
    loop {
        match r.recv() {
            Ok(Control::Fatal { message, .. }) => return Err(message),
            Ok(_) => continue,
            Err(e) => return Err(format!("connection: {e}")),
        }
    }
}

/// A listener that counts the connections it gets.
fn listener() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n2 = n.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            n2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // Hold it open, say nothing (a service that is not tern).
            std::thread::spawn(move || {
                let mut b = [0u8; 1024];
                while matches!((&s).read(&mut b), Ok(n) if n > 0) {}
            });
        }
    });
    (port, n)
}

#[test]
fn a_daemon_dials_only_where_its_operator_allowed() {
    let t = scratch();
    fs::create_dir_all(t.path().join("root/src")).unwrap();
    write_file(&t.path().join("root/src/f"), 1, 1000);
    let (port, seen) = listener();
    let target = format!("127.0.0.1:{port}");
    let attempts = [target.clone(), format!("[::ffff:127.0.0.1]:{port}"), format!("localhost:{port}"), format!("0.0.0.0:{port}")];

    // The default: nobody.
    let d = Daemon::start(&t.path().join("root"), &t.path().join("token"));
    for a in &attempts {
        let e = ask_to_dial(&d, a).unwrap_err();
        assert!(e.contains("dials no third-party peers") && e.contains("--dial-allow"), "{a}: {e}");
    }
    drop(d);
    // Another network allowed: still not this one, nor its spellings.
    let d = Daemon::start_with(&t.path().join("root"), &t.path().join("token"), 0, &[], &["--dial-allow", "198.18.0.0/15", "--dial-allow", "127.0.0.2"]);
    for a in &attempts {
        let e = ask_to_dial(&d, a).unwrap_err();
        assert!(e.contains("is not one of them") && e.contains("--dial-allow"), "{a}: {e}");
    }
    drop(d);
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 0, "a refused address was connected to");

    // Allowed, but not a tern daemon holding the ticket: a silent listener, a closed port and
    // one that answers garbage all get the same answer at the same time, and the silent
    // listener gets one connection, not one per stream.
    let closed = free_port();
    let garbage = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                let _ = s.write_all(b"SSH-2.0-OpenSSH_9.6\r\n");
            }
        });
        p
    };
    let d = Daemon::start_with(&t.path().join("root"), &t.path().join("token"), 0, &[], &["--dial-allow", "127.0.0.1"]);
    let answers: Vec<(String, Duration)> = std::thread::scope(|s| {
        let hs: Vec<_> = [port, closed, garbage]
            .into_iter()
            .map(|p| {
                let d = &d;
                s.spawn(move || {
                    let started = Instant::now();
                    let e = ask_to_dial(d, &format!("127.0.0.1:{p}")).unwrap_err();
                    (e.replace(&p.to_string(), "PORT"), started.elapsed())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    eprintln!("silent listener, closed port, garbage: {answers:?}");
    assert!(answers.iter().all(|a| a.0 == answers[0].0), "different answers: {answers:?}");
    assert!(answers[0].0.contains("opened no data stream to 127.0.0.1:PORT that proved this session's ticket"), "{}", answers[0].0);
    // Every failure is answered at the dial deadline (10 s), never sooner.
    assert!(answers.iter().all(|a| a.1 >= Duration::from_secs(10)), "{answers:?}");
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 1, "one probe connection, not one per stream");
}

#[test]
fn the_daemon_logs_one_plain_access_line_per_session() {
    let t = scratch();
    fs::create_dir(t.path().join("root")).unwrap();
    write_file(&t.path().join("src/a.bin"), 1, 100_000);
    let log = t.path().join("serve.log");
    let mut child = std::process::Command::new(tern_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(t.path().join("root"))
        .arg("--token-file")
        .arg(t.path().join("token"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let port = loop {
        let text = fs::read_to_string(&log).unwrap_or_default();
        if let Some(p) = text.split("listening on 127.0.0.1:").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|p| p.parse::<u16>().ok()) {
            break p;
        }
        assert!(Instant::now() < deadline, "daemon did not start: {text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let token = t.path().join("token").display().to_string();
    let url = |p: &str| format!("tern://127.0.0.1:{port}/{p}");
    let r = tern(&["cp", "-r", &t.path().join("src").display().to_string(), &url("copy"), "--token-file", &token], &[]);
    assert!(r.ok(), "{}", r.stderr());
    let r = tern(&["cp", "-r", &t.path().join("src").display().to_string(), &url("../x"), "--token-file", &token], &[]);
    assert!(!r.ok());
    // Each session's line is written when it ends.
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = fs::read_to_string(&log).unwrap();
        if text.matches("access: ").count() >= 2 {
            break text;
        }
        assert!(Instant::now() < deadline, "no access lines: {text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(!text.contains('\x1b'), "colour codes in a log file: {text:?}");
    assert!(!text.contains("WARN"), "warnings for ordinary sessions: {text}");
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("access: ")).collect();
    assert_eq!(lines.len(), 2, "{text}");
    let ok = lines.iter().find(|l| l.contains("result=ok")).unwrap_or_else(|| panic!("{text}"));
    for part in ["INFO", "peer=127.0.0.1:", "auth=token", "op=receive", "dest=\"/copy\"", "files=1", "bytes=100000", "secs="] {
        assert!(ok.contains(part), "{part} missing: {ok}");
    }
    let bad = lines.iter().find(|l| l.contains("result=failed")).unwrap_or_else(|| panic!("{text}"));
    assert!(bad.contains("dest=\"/../x\"") && bad.contains("not allowed"), "{bad}");
}

/// `tern serve --config FILE` (packaging/tern-serve.example.toml): the file's settings apply,
/// the command line overrides them (a list flag replaces the file's list), and a mistake in the
/// file is one line naming the file and the key, before anything starts.
#[test]
fn serve_reads_a_configuration_file_and_the_command_line_wins() {
    let t = scratch();
    let (root, elsewhere) = (t.path().join("root"), t.path().join("elsewhere"));
    fs::create_dir_all(&root).unwrap();
    fs::create_dir_all(&elsewhere).unwrap();
    let conf = t.path().join("serve.toml");
    fs::write(&conf, format!("listen = \"127.0.0.1:1\"\nroot = [\"{}\"]\nallow-links-out = true\nmax-sessions = 8\n", elsewhere.display())).unwrap();
    // --listen and --root on the command line (the helper passes both) replace the file's.
    let d = Daemon::start_with(&root, &t.path().join("token"), 0, &[], &["--config", conf.to_str().unwrap()]);
    let src = t.path().join("src");
    write_file(&src.join("f"), 1, 1000);
    std::os::unix::fs::symlink("/etc/hostname", src.join("abs")).unwrap();
    let r = tern(&["cp", "-r", src.to_str().unwrap(), &d.url("/src"), "--token-file", &d.token_arg()], &[]);
    // allow-links-out from the file: the absolute link is created, not refused.
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(fs::read_link(root.join("src/abs")).unwrap(), std::path::Path::new("/etc/hostname"));
    assert!(fs::read_dir(&elsewhere).unwrap().next().is_none(), "the command line's --root replaced the file's");

    for (text, want) in [("max-sesions = 3\n", "unknown key 'max-sesions'"), ("max-sessions = \"many\"\n", "many"), ("root = \n", "not valid TOML")] {
        fs::write(&conf, text).unwrap();
        let mut cmd = std::process::Command::new(tern_bin());
        cmd.args(["serve", "--config", conf.to_str().unwrap(), "--root", root.to_str().unwrap(), "--token-file", t.path().join("token").to_str().unwrap()]);
        let out = run_bounded(cmd, Duration::from_secs(20));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {err}");
        assert!(err.contains(conf.to_str().unwrap()) && err.contains(want) && err.trim().lines().count() == 1, "{text}: {err}");
    }
    // A file anyone may write could name roots and hooks: refused.
    fs::write(&conf, "max-sessions = 8\n").unwrap();
    fs::set_permissions(&conf, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let mut cmd = std::process::Command::new(tern_bin());
    cmd.args(["serve", "--config", conf.to_str().unwrap(), "--root", root.to_str().unwrap(), "--token-file", t.path().join("token").to_str().unwrap()]);
    let out = run_bounded(cmd, Duration::from_secs(20));
    assert!(out.status.code() == Some(2) && String::from_utf8_lossy(&out.stderr).contains("world-writable"), "{out:?}");
}

// Stripes (docs/protocol.md "Stripes") against a receiving daemon, from a sender that lies. The
// file is four chunks of the smallest chunk size; an honest stripe is chunks 0..2 or 2..4.

const CS: u64 = tern_proto::limits::MIN_CHUNK_SIZE as u64;
const SIZE: u64 = 4 * CS;

/// The honest content of chunk `i`: never zeros, so a hole is never mistaken for it.
fn honest(i: u64) -> Vec<u8> {
    vec![b'a' + i as u8; CS as usize]
}

fn honest_hashes() -> Vec<[u8; 32]> {
    (0..4).map(|i| *blake3::hash(&honest(i)).as_bytes()).collect()
}

/// `big.bin` (id 0), whole or the bytes `start..end` of it.
fn big(stripe: Option<(u64, u64)>) -> tern_proto::Entry {
    tern_proto::Entry { id: 0, kind: tern_proto::EntryKind::File, path: b"big.bin".to_vec(), size: SIZE, mode: 0o644, mtime_s: 1_700_000_000, mtime_ns: 0, target: Vec::new(), hash: None, stripe }
}

/// A hand-driven sender pushing into the daemon's `/copy` (contents mode: entries land under
/// it as named), with one unencrypted data stream whose chunk frames it writes itself.
struct Push {
    r: CtrlReader,
    w: CtrlWriter,
    _sock: TcpStream,
    data: tern_engine::net::datastream::DataConn,
    seq: u64,
}

impl Push {
    fn open(d: &Daemon) -> Push {
        let (mut r, w, sock, key) = authenticated_keyed(d);
        let mut o = Options { chunk_size: CS as u32, streams: 1, ..Options::default() };
        o.set_recursive(true);
        o.set_contents(true);
        // Plain frames with a tag per chunk: no AEAD to reproduce by hand.
        o.set_no_encrypt(true);
        w.send(&Control::Open { server_role: Role::Receiver, options: o, sources: vec![b"/src".to_vec()], destination: b"/copy".to_vec() }).unwrap();
        let (session_id, data_addr) = match r.recv().unwrap() {
            Control::Ready { session_id, data_addr, .. } => (session_id, String::from_utf8(data_addr).unwrap()),
            other => panic!("expected Ready, got {other:?}"),
        };
        let auth = tern_engine::net::datastream::StreamAuth::new(session_id, key, false);
        let data = tern_engine::net::datastream::connect_stream(TcpStream::connect(&data_addr).unwrap(), &auth, 0, None, false).unwrap();
        Push { r, w, _sock: sock, data, seq: 0 }
    }

    fn announce(&self, e: tern_proto::Entry) {
        let bytes = e.stripe.map_or(e.size, |(s, end)| end - s);
        self.w.send(&Control::Entries(vec![e])).unwrap();
        self.w.send(&Control::ManifestEnd { files: 1, bytes }).unwrap();
    }

    /// Chunk `index` of file 0 carrying `data`, its hash and tag right: only what it claims
    /// to be is a lie.
    fn chunk(&mut self, index: u64, data: &[u8]) {
        let mut h = tern_proto::data::ChunkHeader { flags: 0, file_id: 0, index, offset: index * CS, hash: *blake3::hash(data).as_bytes(), tag: [0; 32] };
        h.tag = h.compute_tag(self.data.tag_key.as_ref().expect("a plain stream is tagged"), self.seq);
        self.seq += 1;
        let mut frame = tern_proto::data::ChunkHeader::frame_header(data.len()).to_vec();
        frame.extend_from_slice(&h.encode());
        frame.extend_from_slice(data);
        self.data.stream.write_all(&frame).unwrap();
        self.data.stream.flush().unwrap();
    }

    /// Serves the daemon's `Want`s for file 0 with honest chunks (plus `extra` frames sent
    /// first) and ends each round with a `FileEnd` carrying `hash`, until it answers with
    /// `FileDone`, `FileError` or `Fatal` (returned) or closes (a `Fatal` of that text).
    fn serve(&mut self, hash: [u8; 32], extra: &[(u64, Vec<u8>)]) -> (Control, usize) {
        let mut rounds = 0;
        loop {
            let m = match self.r.recv() {
                Ok(m) => m,
                Err(e) => return (Control::Fatal { side: tern_proto::msg::Side::Network, message: format!("connection: {e}") }, rounds),
            };
            match m {
                Control::Want(files) => {
                    rounds += 1;
                    for (i, data) in extra {
                        self.chunk(*i, data);
                    }
                    for f in files.iter().filter(|f| f.id == 0) {
                        for &(first, n) in &f.ranges {
                            for i in first..first + u64::from(n) {
                                self.chunk(i, &honest(i));
                            }
                        }
                    }
                    self.w.send(&Control::FileEnd { id: 0, file_hash: hash, size: SIZE, mtime_s: 1_700_000_000, mtime_ns: 0 }).unwrap();
                }
                m @ (Control::FileDone(_) | Control::FileError { .. } | Control::Fatal { .. }) => return (m, rounds),
                _ => {}
            }
        }
    }
}

/// Every path under `top` outside `root`: what a session writing out of its root would add.
fn outside(top: &std::path::Path, root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![top.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.starts_with(root) {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                todo.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Regular files anywhere under `dir`.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                out.push(e.path());
            }
        }
    }
    out
}

/// The daemon still serves: a real copy to it lands.
fn still_serves(d: &Daemon, t: &std::path::Path) {
    write_file(&t.join("after.txt"), 9, 1000);
    let r = tern(&["cp", t.join("after.txt").to_str().unwrap(), &d.url("/after.txt"), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "the daemon no longer serves: {}", r.stderr());
    assert_eq!(fs::read(t.join("after.txt")).unwrap(), fs::read(d.root.join("after.txt")).unwrap());
}

#[test]
fn a_hostile_sender_s_misaligned_or_whole_file_stripe_is_refused_and_nothing_lands() {
    let t = scratch();
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let before = outside(t.path(), &root);
    let started = Instant::now();
    // Not on a chunk boundary at either end, the whole file: the receiver's check. Past the
    // file's end, empty: already the entry's decoding refuses them.
    const ALIGN: &str = "protocol error from the sender: a stripe not aligned to chunks, or the whole file";
    const DECODE: &str = "protocol error from the peer: invalid stripe: empty, or past the end of the file";
    for (range, why) in [((1, 2 * CS), ALIGN), ((CS, CS + 1), ALIGN), ((0, SIZE), ALIGN), ((2 * CS, SIZE + CS), DECODE), ((2 * CS, 2 * CS), DECODE)] {
        let mut p = Push::open(&d);
        p.announce(big(Some(range)));
        let (answer, rounds) = p.serve([0; 32], &[]);
        assert_eq!(rounds, 0, "{range:?}: the daemon asked for chunks of a stripe it must refuse");
        match answer {
            Control::Fatal { message, .. } => assert!(message.contains(why), "{range:?}: {message}"),
            other => panic!("{range:?}: expected a protocol error, got {other:?}"),
        }
        // Refused before anything was set up: no part, no journal, no file.
        let landed = files_under(&root);
        assert!(landed.is_empty(), "{range:?}: {landed:?}");
    }
    eprintln!("five refused stripes in {:.2} s", started.elapsed().as_secs_f64());
    assert_eq!(outside(t.path(), &root), before, "written outside the daemon's root");
    still_serves(&d, t.path());
}

/// An honest stripe 0..2, sealed: the shared part now holds chunks 0 and 1 that the closing
/// pass will trust without reading them again.
fn honest_first_stripe(d: &Daemon) {
    let h = honest_hashes();
    let mut p = Push::open(d);
    p.announce(big(Some((0, 2 * CS))));
    let (answer, rounds) = p.serve(tern_proto::chunk::stripe_hash(SIZE, 0, &h[0..2]), &[]);
    assert!(matches!(answer, Control::FileDone(ref ids) if ids == &[0]) && rounds == 1, "the honest stripe: {answer:?} after {rounds} rounds");
}

#[test]
fn a_hostile_sender_s_chunk_of_another_stripe_is_never_written_and_the_file_publishes_whole() {
    let t = scratch();
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let before = outside(t.path(), &root);
    let h = honest_hashes();
    honest_first_stripe(&d);

    // Stripe 2..4, whose sender also slips in chunk 0 (sealed by the stripe above) with other
    // bytes under their own valid hash and tag: it is not its to write.
    let forged = b"FORGED! ".repeat(CS as usize / 8);
    let mut p = Push::open(&d);
    p.announce(big(Some((2 * CS, SIZE))));
    let (answer, rounds) = p.serve(tern_proto::chunk::stripe_hash(SIZE, 2, &h[2..4]), &[(0, forged.clone())]);
    // A chunk outside the stripe is a protocol error: the session ends, and the chunk never
    // reaches the shared part.
    assert!(matches!(answer, Control::Fatal { ref message, .. } if message.contains("outside the stripe")), "{answer:?} after {rounds} rounds");
    assert!(!root.join("copy/big.bin").exists(), "a stripe was published under the file's name");
    for f in files_under(&root) {
        let bytes = fs::read(&f).unwrap();
        assert!(!bytes.windows(8).any(|w| w == b"FORGED! "), "another stripe's forged chunk was written to {}", f.display());
    }

    // The closing pass of the whole file publishes it (the honest stripe sealed, the other's
    // chunks asked for again): exactly the honest bytes, which it would not be had the forged
    // chunk reached the part.
    let mut p = Push::open(&d);
    p.announce(big(None));
    let (answer, rounds) = p.serve(tern_proto::chunk::file_hash(SIZE, &h), &[]);
    assert!(matches!(answer, Control::FileDone(ref ids) if ids == &[0]), "the closing pass: {answer:?}");
    eprintln!("closing pass: {rounds} rounds of wanted chunks");
    let want: Vec<u8> = (0..4).flat_map(honest).collect();
    assert!(fs::read(root.join("copy/big.bin")).unwrap() == want, "the published file is not the source's bytes");
    assert_eq!(outside(t.path(), &root), before, "written outside the daemon's root");
    still_serves(&d, t.path());
}

#[test]
fn a_hostile_sender_s_whole_file_hash_for_a_stripe_never_publishes_the_file() {
    let t = scratch();
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let before = outside(t.path(), &root);
    let h = honest_hashes();
    // With the other stripe sealed the part holds every chunk, so a receiver that took the
    // whole-file hash for this stripe's would have all it needs to publish.
    honest_first_stripe(&d);

    let mut p = Push::open(&d);
    p.announce(big(Some((2 * CS, SIZE))));
    let started = Instant::now();
    let (answer, rounds) = p.serve(tern_proto::chunk::file_hash(SIZE, &h), &[]);
    eprintln!("whole-file hash for a stripe: {rounds} rounds, answered in {:.2} s: {answer:?}", started.elapsed().as_secs_f64());
    // It does not add up: the stripe starts over once, then fails; it is never done.
    match answer {
        Control::FileError { id: 0, message, .. } => assert!(message.contains("hash does not match"), "{message}"),
        other => panic!("expected the stripe to fail, got {other:?}"),
    }
    assert_eq!(rounds, 2, "one start-over, then the failure");
    assert!(!root.join("copy/big.bin").exists(), "a stripe was published under the file's name");
    assert_eq!(outside(t.path(), &root), before, "written outside the daemon's root");
    still_serves(&d, t.path());
}
