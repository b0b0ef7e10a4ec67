//! Third-party transfers: `tern cp tern://A/x tern://B/y` between two real daemons with their
//! own roots and tokens. The data must go from A to B directly, never through the client.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

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
    let a = Daemon::start_with(&t.path().join("a"), &t.path().join("token-a"), free_port(), &[], a_extra);
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

/// `rchar` of a running process: every byte it read through read(2)-like calls, sockets included.
fn rchar(pid: u32) -> Option<u64> {
    let io = fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines().find_map(|l| l.strip_prefix("rchar: ")).and_then(|v| v.trim().parse().ok())
}

#[test]
fn copies_a_tree_from_daemon_to_daemon_without_the_data_passing_the_client() {
    let p = pair(&[]);
    let big = 64 << 20;
    let total = source_tree(&p.t.path().join("a/src"), big);
    let started = Instant::now();
    let mut cmd = Command::new(tern_bin());
    cmd.args(["cp", "-r", &p.a.url("/src"), &p.b.url("/copy"), "--token-file", &p.a.token_arg(), "--dst-token-file", &p.b.token_arg(), "--json"]);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let pid = child.id();
    // Sample the client's read counter until it exits; the last sample is the most it read.
    let mut last = 0;
    while child.try_wait().unwrap().is_none() {
        if let Some(r) = rchar(pid) {
            last = r;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "third-party copy ran over 120 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    eprintln!("third-party copy of {total} bytes: {:.2} s, client read {last} bytes", started.elapsed().as_secs_f64());
    assert_same_tree(&p.t.path().join("a/src"), &p.t.path().join("b/copy"));
    assert_no_leftovers(&p.t.path().join("b"));
    assert!(last > 0, "no /proc/PID/io sample of the client");
    assert!(last < big as u64 / 4, "the client read {last} bytes for a {big}-byte file: data went through it");
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
    let p = pair(&[]);
    source_tree(&p.t.path().join("a/src"), 9 << 20);
    let dst_token = p.b.token_arg();
    let r = tern(
        &["cp", "-r", "--no-encrypt", "--chunk-size", "1M", &p.a.url("/src"), &p.b.url("/copy"), "--token-file", &p.a.token_arg()],
        &[("TERN_DST_TOKEN_FILE", &dst_token)],
    );
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&p.t.path().join("a/src"), &p.t.path().join("b/copy"));
}

#[test]
fn a_daemon_started_with_no_third_party_refuses_in_one_line() {
    let p = pair(&["--no-third-party"]);
    source_tree(&p.t.path().join("a/src"), 1000);
    let r = tern(&["cp", "-r", &p.a.url("/src"), &p.b.url("/copy"), "--token-file", &p.a.token_arg(), "--dst-token-file", &p.b.token_arg(), "--retry-for", "2"], &[]);
    assert!(!r.ok());
    let err = r.stderr();
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("refuses third-party transfers") && err.contains("--no-third-party"), "{err}");
    assert!(!p.t.path().join("b/copy").exists(), "nothing was created at the destination");
}

#[test]
fn the_wrong_destination_token_names_the_destination_daemon() {
    let p = pair(&[]);
    source_tree(&p.t.path().join("a/src"), 1000);
    // Without --dst-token-file, A's token is used for B too, and B does not know it.
    let r = tern(&["cp", "-r", &p.a.url("/src"), &p.b.url("/copy"), "--token-file", &p.a.token_arg(), "--retry-for", "2"], &[]);
    assert!(!r.ok());
    let err = r.stderr();
    assert!(err.contains(&format!("127.0.0.1:{}", p.b.port)), "{err}");
}

#[test]
fn a_service_job_from_daemon_to_daemon_runs_to_completion() {
    let p = pair(&[]);
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

#[test]
fn a_cut_data_stream_and_a_corrupt_chunk_are_survived() {
    // Daemon A cuts one of its data streams to B after 20 MiB (the whole session fails, the
    // client reconnects both daemons) and corrupts chunk 3 of big.bin once (B asks again
    // through the relay with ChunkBad).
    let t = scratch();
    for d in ["a", "b"] {
        fs::create_dir(t.path().join(d)).unwrap();
    }
    let env = [("TERN_FAULT_CUT_AFTER", "20971520"), ("TERN_FAULT_CORRUPT", "big.bin:3")];
    let a = Daemon::start_on(&t.path().join("a"), &t.path().join("token-a"), free_port(), &env);
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
