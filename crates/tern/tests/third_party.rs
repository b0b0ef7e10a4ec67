//! Third-party transfers: `tern cp tern://A/x tern://B/y` between two real daemons with their
//! own roots and tokens. The data must go from A to B directly, never through the client.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

use crate::common;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A may dial B (on loopback): a daemon dials only the peers its operator allowed.
const ALLOW: [&str; 2] = ["--dial-allow", "127.0.0.1"];

/// Two daemons (different roots, different tokens) and a source tree under A's root.
struct Pair {
    t: tempfile::TempDir,
    a: Daemon,
    b: Daemon,
}

fn pair(a_extra: &[&str]) -> Pair {
    let t = scratch();
    for d in ["a", "b"] {
        fs::create_dir(t.path().join(d)).unwrap();
    }
    let a = Daemon::start_with(&t.path().join("a"), &t.path().join("token-a"), 0, &[], a_extra);
    let b = Daemon::start(&t.path().join("b"), &t.path().join("token-b"));
    Pair { t, a, b }
}

/// Nested directories, a 0-byte file, small files and one multi-chunk file of `big` bytes.
fn source_tree(root: &Path, big: usize) -> u64 {
    write_file(&root.join("top.txt"), 1, 1000);
    write_file(&root.join("d1/d2/d3/deep.bin"), 2, 70_000);
    write_file(&root.join("d1/empty"), 3, 0);
    fs::create_dir_all(root.join("d1/empty dir")).unwrap();
    write_file(&root.join("d4/big.bin"), 4, big);
    1000 + 70_000 + big as u64
}

/// Bytes the TCP sockets of process `pid` have sent plus received so far, from the kernel's
/// per-socket counters (`ss -tinp`: tcp_info bytes_sent/bytes_received). Not /proc/PID/io:
/// its rchar/wchar count read(2)/write(2) only, and sockets here use recv(2)/send(2).
/// `None` where `ss` is missing.
fn socket_bytes(pid: u32) -> Option<u64> {
    let out = Command::new("ss").args(["-tinpH"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let tag = format!("pid={pid},");
    let mut total = 0;
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if !l.contains(&tag) {
            continue;
        }
        let info = lines.next().unwrap_or("");
        for field in info.split_whitespace() {
            if let Some(v) = field.strip_prefix("bytes_received:").or_else(|| field.strip_prefix("bytes_sent:")) {
                total += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
    Some(total)
}

#[test]
fn copies_a_tree_from_daemon_to_daemon_without_the_data_passing_the_client() {
    if Command::new("ss").arg("-V").output().is_err() {
        eprintln!("SKIP: no ss (apt-get install iproute2) to read the client's socket counters");
        return;
    }
    // A sleeps 25 ms before each chunk, so the copy lasts long enough to sample it many times.
    let t = scratch();
    for d in ["a", "b"] {
        fs::create_dir(t.path().join(d)).unwrap();
    }
    let a = Daemon::start_with(&t.path().join("a"), &t.path().join("token-a"), 0, &[("TERN_FAULT_DELAY_MS", "25")], &ALLOW);
    let b = Daemon::start(&t.path().join("b"), &t.path().join("token-b"));
    let p = Pair { t, a, b };
    let big = 64 << 20;
    let total = source_tree(&p.t.path().join("a/src"), big);
    let started = Instant::now();
    let mut cmd = Command::new(tern_bin());
    cmd.args(["cp", "-r", "--chunk-size", "1M", "--streams", "4", &p.a.url("/src"), &p.b.url("/copy"), "--token-file", &p.a.token_arg(), "--dst-token-file", &p.b.token_arg(), "--json"]);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let pid = child.id();
    // The counters are cumulative per socket and vanish with it: keep the largest sum seen.
    let (mut most, mut samples) = (0, 0);
    while child.try_wait().unwrap().is_none() {
        if let Some(n) = socket_bytes(pid) {
            most = most.max(n);
            samples += 1;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "third-party copy ran over 120 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    eprintln!("third-party copy of {total} bytes: {:.2} s; the client's sockets carried at most {most} bytes ({samples} samples)", started.elapsed().as_secs_f64());
    assert_same_tree(&p.t.path().join("a/src"), &p.t.path().join("b/copy"));
    assert_no_leftovers(&p.t.path().join("b"));
    assert!(samples >= 3 && most > 0, "too few samples of the client's sockets: {samples}, {most} bytes");
    assert!(most < big as u64 / 4, "the client's sockets carried {most} bytes for a {big}-byte file: data went through it");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["files"].as_u64(), Some(4), "{json}");
    assert_eq!(json["bytes"].as_u64(), Some(total), "{json}");

    // A sync finds everything in place: nothing moves, every file is skipped, extras go.
    write_file(&p.t.path().join("b/copy/extra"), 5, 10);
    let r = tern(&["sync", "--delete", &p.a.url("/src"), &p.b.url("/copy"), "--token-file", &p.a.token_arg(), "--dst-token-file", &p.b.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!((r.u64("files"), r.u64("files_skipped")), (0, 4), "{}", r.json);
    assert_same_tree(&p.t.path().join("a/src"), &p.t.path().join("b/copy"));
}

#[test]
fn unencrypted_and_with_the_dst_token_from_the_environment() {
    let p = pair(&ALLOW);
    source_tree(&p.t.path().join("a/src"), 9 << 20);
    let dst_token = p.b.token_arg();
    let r = tern(&["cp", "-r", "--no-encrypt", "--chunk-size", "1M", &p.a.url("/src"), &p.b.url("/copy"), "--token-file", &p.a.token_arg()], &[("TERN_DST_TOKEN_FILE", &dst_token)]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&p.t.path().join("a/src"), &p.t.path().join("b/copy"));
}

#[test]
fn a_daemon_without_dial_allow_refuses_in_one_line() {
    // The default, and the old --no-third-party switch: the source daemon dials nobody.
    for extra in [&[][..], &["--no-third-party"][..], &["--dial-allow", "192.0.2.0/24"][..]] {
        let p = pair(extra);
        source_tree(&p.t.path().join("a/src"), 1000);
        let r = tern(&["cp", "-r", &p.a.url("/src"), &p.b.url("/copy"), "--token-file", &p.a.token_arg(), "--dst-token-file", &p.b.token_arg(), "--retry-for", "2"], &[]);
        assert!(!r.ok());
        let err = r.stderr();
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(err.contains("--dial-allow"), "{extra:?}: {err}");
        assert!(!p.t.path().join("b/copy").exists(), "nothing was created at the destination");
    }
}

#[test]
fn the_wrong_destination_token_names_the_destination_daemon() {
    let p = pair(&ALLOW);
    source_tree(&p.t.path().join("a/src"), 1000);
    // Without --dst-token-file, A's token is used for B too, and B does not know it.
    let r = tern(&["cp", "-r", &p.a.url("/src"), &p.b.url("/copy"), "--token-file", &p.a.token_arg(), "--retry-for", "2"], &[]);
    assert!(!r.ok());
    let err = r.stderr();
    assert!(err.contains(&format!("127.0.0.1:{}", p.b.port)), "{err}");
}

#[test]
fn a_service_job_from_daemon_to_daemon_runs_to_completion() {
    let p = pair(&ALLOW);
    let total = source_tree(&p.t.path().join("a/src"), 5 << 20);
    // The service's own host: a third daemon with the HTTP API, holding neither A's nor B's data.
    let svc = p.t.path().join("svc");
    fs::create_dir_all(svc.join("root")).unwrap();
    let (http, data) = (free_port(), free_port());
    let mut cmd = Command::new(tern_bin());
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{data}"), "--http-listen", &format!("127.0.0.1:{http}"), "--root"])
        .arg(svc.join("root"))
        .arg("--token-file")
        .arg(svc.join("daemon.token"))
        .arg("--state-dir")
        .arg(svc.join("state"))
        // The job's token files lie beside the service; CI runs as root.
        .arg("--job-root")
        .arg(p.t.path())
        .arg("--allow-root-transfers")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _service = Daemon { child: cmd.spawn().unwrap(), port: data, root: svc.join("root"), token: svc.join("daemon.token") };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", http)).is_err() || !svc.join("state/admin.token").exists() {
        assert!(Instant::now() < deadline, "service did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let admin = fs::read_to_string(svc.join("state/admin.token")).unwrap().trim().to_string();
    let cli = |args: &[&str]| {
        let mut cmd = Command::new(tern_bin());
        cmd.args(args).env("TERN_SERVER", format!("https://127.0.0.1:{http}")).env("TERN_TOKEN", &admin).env("TERN_CA_FILE", svc.join("state/tls/cert.pem")).stdin(Stdio::null());
        let out = run_bounded(cmd, Duration::from_secs(120));
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).trim().to_string(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, id, err) = cli(&["submit", &p.a.url("/src"), &p.b.url("/copy"), "--token-file", &p.a.token_arg(), "--dst-token-file", &p.b.token_arg()]);
    assert_eq!(code, 0, "submit: {err}");
    let (code, out, err) = cli(&["wait", &id]);
    assert_eq!(code, 0, "wait: {out} {err}");
    assert_same_tree(&p.t.path().join("a/src"), &p.t.path().join("b/copy"));
    let (_, status, _) = cli(&["status", &id, "--json"]);
    eprintln!("service third-party job of {total} bytes: {status}");
}

/// Daemons A (with fault hooks in its environment) and B.
fn pair_with_faults(env: &[(&str, &str)]) -> (tempfile::TempDir, Daemon, Daemon) {
    let t = scratch();
    for d in ["a", "b"] {
        fs::create_dir(t.path().join(d)).unwrap();
    }
    let a = Daemon::start_with(&t.path().join("a"), &t.path().join("token-a"), 0, env, &ALLOW);
    let b = Daemon::start(&t.path().join("b"), &t.path().join("token-b"));
    (t, a, b)
}

#[test]
fn a_corrupt_chunk_is_asked_for_again_through_the_relay() {
    // A flips a byte of chunk 3 of big.bin after hashing it; B's ChunkBad reaches A via the client.
    let (t, a, b) = pair_with_faults(&[("TERN_FAULT_CORRUPT", "big.bin:3")]);
    source_tree(&t.path().join("a/src"), 9 << 20);
    let r = tern(&["cp", "-r", "--chunk-size", "1M", &a.url("/src"), &b.url("/copy"), "--token-file", &a.token_arg(), "--dst-token-file", &b.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&t.path().join("a/src"), &t.path().join("b/copy"));
    assert_eq!(r.u64("chunks_resent"), 1, "{}", r.json);
}

#[test]
fn a_cut_data_stream_is_survived() {
    // Daemon A cuts one of its data streams to B after 20 MiB: the whole session fails, the
    // client reconnects both daemons, and B's journals keep what was verified.
    let t = scratch();
    for d in ["a", "b"] {
        fs::create_dir(t.path().join(d)).unwrap();
    }
    let env = [("TERN_FAULT_CUT_AFTER", "20971520")];
    let a = Daemon::start_with(&t.path().join("a"), &t.path().join("token-a"), 0, &env, &ALLOW);
    let b = Daemon::start(&t.path().join("b"), &t.path().join("token-b"));
    source_tree(&t.path().join("a/src"), 48 << 20);
    let r = tern(&["cp", "-r", "--chunk-size", "1M", "--streams", "4", &a.url("/src"), &b.url("/copy"), "--token-file", &a.token_arg(), "--dst-token-file", &b.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&t.path().join("a/src"), &t.path().join("b/copy"));
    assert_no_leftovers(&t.path().join("b"));
    eprintln!("faults: {}", r.json);
    assert!(r.u64("reconnects") >= 1, "{}", r.json);
    // Files B finished before the cut but had not reported yet are found identical and skipped.
    assert_eq!(r.u64("files") + r.u64("files_skipped"), 4, "{}", r.json);
}
