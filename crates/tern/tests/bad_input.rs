//! Bad input: a clear one-line error naming file, side and remedy, and nothing lost.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

use crate::common;
use common::*;

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn as_nobody(args: &[&str]) -> Option<Run> {
    // Root reads everything, so permission tests run tern as nobody.
    let ok = Command::new("setpriv").args(["--reuid=65534", "--regid=65534", "--clear-groups", "true"]).status().is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIP: cannot drop privileges with setpriv");
        return None;
    }
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", tern_bin()]).args(args).arg("--json");
    let out = run_bounded(cmd, Duration::from_secs(60));
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    Some(Run { out, json })
}

fn open_dir(p: &Path) {
    fs::set_permissions(p, fs::Permissions::from_mode(0o777)).unwrap();
}

#[test]
fn nonexistent_source() {
    let t = scratch();
    let dst = t.path().join("dst");
    let r = tern(&["cp", "-r", t.path().join("nope").to_str().unwrap(), dst.to_str().unwrap()], &[]);
    assert!(!r.ok());
    let e = r.stderr();
    assert!(e.contains("source:") && e.contains("nope") && e.contains("No such file") && e.contains("check the source path"), "{e}");
    assert_eq!(e.lines().count(), 1, "one line: {e}");
    assert!(!dst.exists());
}

#[test]
fn directory_without_recursive() {
    let t = scratch();
    fs::create_dir(t.path().join("d")).unwrap();
    let r = tern(&["cp", t.path().join("d").to_str().unwrap(), t.path().join("x").to_str().unwrap()], &[]);
    assert!(!r.ok());
    assert!(r.stderr().contains("is a directory (use -r"), "{}", r.stderr());
}

#[test]
fn destination_file_where_directory_needed() {
    let t = scratch();
    write_file(&t.path().join("src/a"), 1, 10);
    fs::write(t.path().join("dst"), b"precious").unwrap();
    let r = tern(&["cp", "-r", t.path().join("src").to_str().unwrap(), t.path().join("dst").to_str().unwrap()], &[]);
    assert!(!r.ok());
    assert!(r.stderr().contains("destination:") && r.stderr().contains("is a file, but the source is a directory"), "{}", r.stderr());
    assert_eq!(fs::read(t.path().join("dst")).unwrap(), b"precious");
}

#[test]
fn unreadable_source_file_fails_alone() {
    let t = tempfile::tempdir().unwrap();
    open_dir(t.path());
    let src = t.path().join("src");
    write_file(&src.join("ok1"), 1, 100);
    write_file(&src.join("secret"), 2, 100);
    write_file(&src.join("ok2"), 3, 100);
    fs::set_permissions(&src, fs::Permissions::from_mode(0o755)).unwrap();
    for f in ["ok1", "ok2"] {
        fs::set_permissions(src.join(f), fs::Permissions::from_mode(0o644)).unwrap();
    }
    fs::set_permissions(src.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    let dst = t.path().join("out");
    fs::create_dir(&dst).unwrap();
    open_dir(&dst);
    let Some(r) = as_nobody(&["cp", "-r", src.to_str().unwrap(), dst.join("c").to_str().unwrap()]) else { return };
    assert!(!r.ok());
    let e = r.stderr();
    assert!(e.contains("source:") && e.contains("secret") && e.contains("Permission denied") && e.contains("read permission"), "{e}");
    assert!(dst.join("c/ok1").is_file() && dst.join("c/ok2").is_file());
    assert!(!dst.join("c/secret").exists());
    assert_eq!(r.json["errors"][0]["side"], "source");
}

#[test]
fn unwritable_destination() {
    let t = tempfile::tempdir().unwrap();
    open_dir(t.path());
    write_file(&t.path().join("src/a"), 1, 100);
    fs::set_permissions(t.path().join("src"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(t.path().join("src/a"), fs::Permissions::from_mode(0o644)).unwrap();
    let dst = t.path().join("locked");
    fs::create_dir(&dst).unwrap();
    fs::set_permissions(&dst, fs::Permissions::from_mode(0o755)).unwrap();
    let Some(r) = as_nobody(&["cp", "-r", t.path().join("src").to_str().unwrap(), dst.to_str().unwrap()]) else { return };
    assert!(!r.ok());
    let e = r.stderr();
    assert!(e.contains("destination:") && e.contains("Permission denied") && e.contains("write permission"), "{e}");
}

#[test]
fn disk_full_then_rerun_completes() {
    let t = tempfile::tempdir().unwrap();
    let mnt = t.path().join("small");
    fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=6m", "tmpfs"]).arg(&mnt).status().is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("SKIP: cannot mount a small tmpfs (needs root)");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _guard = Unmount(&mnt);
    let src = t.path().join("src");
    write_file(&src.join("small1"), 1, 1000);
    write_file(&src.join("big"), 2, 12 << 20);
    let dst = mnt.join("dst");
    let args = ["cp", "-r", src.to_str().unwrap(), dst.to_str().unwrap(), "--chunk-size", "1M"];
    let r = tern(&args, &[]);
    assert!(!r.ok());
    let e = r.stderr();
    assert!(e.contains("destination:") && e.contains("No space left on device") && e.contains("free space"), "{e}");
    assert!(!dst.join("big").exists(), "no partial file under the final name");
    let sent_before = r.u64("bytes");
    assert!(Command::new("mount").args(["-o", "remount,size=64m"]).arg(&mnt).status().unwrap().success());
    let r2 = tern(&args, &[]);
    assert!(r2.ok(), "{}", r2.stderr());
    assert!(r2.u64("bytes_skipped") > 0, "the re-run resumed from verified chunks");
    assert!(r2.u64("bytes") < (12 << 20) + 1000 || sent_before == 0);
    assert_same_tree(&src, &dst);
    assert_no_leftovers(&dst);
}

#[test]
fn source_changing_during_transfer_is_detected() {
    let t = scratch();
    let src = t.path().join("growing.log");
    write_file(&src, 1, 32 << 20);
    let dst = t.path().join("dst.log");
    let child = Command::new(tern_bin())
        .args(["cp", src.to_str().unwrap(), dst.to_str().unwrap(), "--chunk-size", "1M", "--streams", "1", "--json"])
        .env("TERN_FAULT_DELAY_MS", "20")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    fs::OpenOptions::new().append(true).open(&src).unwrap().write_all(b"more").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("source:") && e.contains("growing.log") && e.contains("changed while it was being sent"), "{e}");
    assert!(!dst.exists(), "a changed file is never renamed into place");
}

/// A directory replaced by a file after the walk listed it: its files are reported gone, one
/// line each, as the source's; the rest of the tree is copied; a re-run completes.
#[test]
fn a_directory_replaced_by_a_file_mid_copy_loses_nothing_else() {
    let t = scratch();
    let src = t.path().join("src");
    for d in 0..8 {
        for f in 0..2 {
            write_file(&src.join(format!("d{d}/f{f}")), d * 2 + f, 64 << 10);
        }
    }
    let dst = t.path().join("dst");
    let child = Command::new(tern_bin())
        .args(["cp", "-r", src.to_str().unwrap(), dst.to_str().unwrap(), "--streams", "1", "--json"])
        .env("TERN_FAULT_DELAY_MS", "150")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once the first directory is being written the walk has listed all 8 (one batch); d7's
    // files are still 12 chunks of 150 ms away.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !dst.join("d0").exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    fs::rename(src.join("d7"), t.path().join("d7-moved")).unwrap();
    fs::write(src.join("d7"), b"now a file").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(e.lines().count(), 2, "one line per lost file: {e}");
    for line in e.lines() {
        assert!(line.contains("source:") && line.contains("/d7/f") && line.contains("gone since the tree was listed") && line.contains("re-run"), "{line}");
    }
    for d in 0..7 {
        for f in 0..2 {
            assert_eq!(fs::read(dst.join(format!("d{d}/f{f}"))).unwrap(), fs::read(src.join(format!("d{d}/f{f}"))).unwrap());
        }
    }
    // Put back, the same command completes the tree (and clears the marker of the unfinished one).
    fs::remove_file(src.join("d7")).unwrap();
    fs::rename(t.path().join("d7-moved"), src.join("d7")).unwrap();
    let r = tern(&["cp", "-r", src.to_str().unwrap(), dst.to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &dst);
    assert_no_leftovers(&dst);
}

#[test]
fn wrong_token() {
    let t = scratch();
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    fs::write(t.path().join("bad"), "not-the-right-secret-at-all").unwrap();
    write_file(&t.path().join("f"), 1, 10);
    let r = tern(&["cp", t.path().join("f").to_str().unwrap(), &d.url("/f"), "--token-file", t.path().join("bad").to_str().unwrap()], &[]);
    assert!(!r.ok());
    assert!(r.stderr().contains("token") && r.stderr().contains("--token-file"), "{}", r.stderr());
    assert!(!root.join("f").exists());
}

/// An error on a daemon names the endpoint as the client wrote it (host, port, path), never
/// where the daemon's root really is, and says what to do.
#[test]
fn daemon_errors_name_the_endpoint_not_the_daemons_real_paths() {
    let t = scratch();
    let root = t.path().join("secret-root-location");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    write_file(&t.path().join("src/f"), 1, 10);
    let url = d.url("/no/such/parent");
    let r = tern(&["cp", "-r", t.path().join("src").to_str().unwrap(), &url, "--token-file", &d.token_arg()], &[]);
    assert!(!r.ok());
    let e = r.stderr();
    assert!(e.contains(&format!("destination ({url})")) && e.contains("/no/such") && e.contains("create it first"), "{e}");
    assert!(!e.contains("secret-root-location"), "the daemon's real path leaked: {e}");
    let errors = r.json["errors"].as_array().unwrap();
    assert_eq!(errors[0]["at"].as_str(), Some(url.as_str()), "{}", r.json);
    assert!(!root.join("no").exists());
}

#[test]
fn daemon_survives_garbage_and_oversized_frames() {
    let t = scratch();
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    for junk in [&b"Cthis is not TLS at all"[..], b"D\x16\x03\x01\xff\xff", b"P\x7f\xff\xff\xff\x20", b"X", b"P\x00\x00\x00\x00\x20"] {
        let mut s = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(junk);
        let mut buf = [0u8; 64];
        let _ = s.read(&mut buf); // the daemon drops us
    }
    write_file(&t.path().join("f"), 1, 1000);
    let r = tern(&["cp", t.path().join("f").to_str().unwrap(), &d.url("/f"), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "daemon still serves: {}", r.stderr());
}

#[test]
fn garbage_from_a_peer_is_a_clear_protocol_error() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let fake = t.path().join("fake-tern");
    fs::write(&fake, "#!/bin/sh\nprintf '\\177\\377\\377\\377\\001junk'\nsleep 2\n").unwrap();
    fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
    write_file(&t.path().join("f"), 1, 10);
    let r = tern(&["cp", "--ssh", &sshd.ssh_cmd(), "--remote-bin", fake.to_str().unwrap(), t.path().join("f").to_str().unwrap(), "127.0.0.1:/tmp/x"], &[]);
    assert!(!r.ok());
    assert!(r.stderr().contains("protocol error") && r.stderr().contains("exceeds the limit"), "{}", r.stderr());
}

#[test]
fn missing_remote_bin_is_explained() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    write_file(&t.path().join("f"), 1, 1000);
    let target = format!("127.0.0.1:{}", t.path().join("g").display());
    // First use without --remote-bin is tests/install.rs.
    let r = tern(&["cp", "--ssh", &sshd.ssh_cmd(), "--remote-bin", "/nonexistent/tern", t.path().join("f").to_str().unwrap(), &target], &[]);
    assert!(!r.ok());
    assert!(r.stderr().contains("--remote-bin program was not found"), "{}", r.stderr());
}

#[test]
fn daemon_refuses_paths_outside_its_root() {
    let t = scratch();
    let root = t.path().join("root");
    let outside = t.path().join("outside");
    fs::create_dir(&root).unwrap();
    fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    write_file(&t.path().join("f"), 1, 10);
    for path in ["/../outside/f", "/escape/f"] {
        let r = tern(&["cp", t.path().join("f").to_str().unwrap(), &d.url(path), "--token-file", &d.token_arg()], &[]);
        assert!(!r.ok(), "{path} accepted");
        assert!(r.stderr().contains("refused"), "{}", r.stderr());
    }
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
}

/// A pushing client sends its manifest behind `Open` without waiting for `Ready`
/// (docs/protocol.md, Flow): when the daemon refuses the request, thousands of entries are
/// already on their way. The user still reads the daemon's refusal, in one line, at once (no
/// "broken pipe", no reconnecting into the same refusal), and nothing lands anywhere.
#[test]
fn a_refused_push_reports_the_refusal_even_with_its_manifest_in_flight() {
    let t = scratch();
    let root = t.path().join("root");
    let outside = t.path().join("outside");
    fs::create_dir(&root).unwrap();
    fs::create_dir(&outside).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let src = t.path().join("src");
    for i in 0..3000u64 {
        write_file(&src.join(format!("d{}/f{i}", i % 30)), i, 100);
    }
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let r = tern(&["cp", "-r", src.to_str().unwrap(), &d.url("/../outside/x"), "--token-file", &d.token_arg()], &[]);
        assert!(!r.ok(), "accepted");
        let e = r.stderr();
        assert!(e.contains("refused") && !e.contains("pipe") && !e.contains("closed"), "{e}");
        assert_eq!(e.lines().count(), 1, "one line: {e}");
        // A network error would be retried with backoff (seconds); a refusal is final.
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}: {e}", started.elapsed());
    }
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    assert_eq!(fs::read_dir(&root).unwrap().count(), 0);
}

/// Locally, links are copied as they are (rsync -a, cp -a); `--safe-links` leaves escaping ones
/// out; a daemon refuses them (tests/names.rs).
#[test]
fn symlink_pointing_out_of_the_tree_is_copied_as_is_or_left_out_with_safe_links() {
    let t = scratch();
    let src = t.path().join("src");
    write_file(&src.join("a"), 1, 10);
    std::os::unix::fs::symlink("../../../etc/passwd", src.join("evil")).unwrap();
    std::os::unix::fs::symlink("a", src.join("fine")).unwrap();
    let dst = t.path().join("dst");
    let r = tern(&["cp", "-r", src.to_str().unwrap(), dst.to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(fs::read_link(dst.join("evil")).unwrap(), std::path::Path::new("../../../etc/passwd"));
    let safe = t.path().join("safe");
    let r = tern(&["cp", "-r", "--safe-links", src.to_str().unwrap(), safe.to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert!(r.stderr().contains("evil") && r.stderr().contains("--safe-links"), "says what it left out: {}", r.stderr());
    assert!(safe.join("a").is_file() && fs::read_link(safe.join("fine")).is_ok());
    assert!(fs::symlink_metadata(safe.join("evil")).is_err());
}

#[test]
fn fail_fast_stops_at_the_unreadable_file() {
    let t = tempfile::tempdir().unwrap();
    open_dir(t.path());
    let src = t.path().join("src");
    for i in 0..8u64 {
        write_file(&src.join(format!("f{i}")), i, 20_000);
        fs::set_permissions(src.join(format!("f{i}")), fs::Permissions::from_mode(0o644)).unwrap();
    }
    fs::set_permissions(src.join("f0"), fs::Permissions::from_mode(0o000)).unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o755)).unwrap();
    let dst = t.path().join("out");
    fs::create_dir(&dst).unwrap();
    open_dir(&dst);
    // Without the flag: the one file fails, the others land.
    let Some(r) = as_nobody(&["cp", "-r", src.to_str().unwrap(), dst.join("all").to_str().unwrap()]) else { return };
    assert!(!r.ok());
    assert!((1..8).all(|i| dst.join(format!("all/f{i}")).is_file()));
    assert_eq!(r.json["files_failed"], 1);
    // With it: non-zero, one line naming the file and saying why the copy stopped.
    let Some(r) = as_nobody(&["cp", "-r", "--fail-fast", src.to_str().unwrap(), dst.join("ff").to_str().unwrap()]) else { return };
    assert!(!r.ok());
    let e = r.stderr();
    assert!(e.contains("source:") && e.contains("f0") && e.contains("Permission denied") && e.contains("stopped at the first failure (--fail-fast)"), "{e}");
    assert_eq!(e.lines().count(), 1, "one line: {e}");
    assert_eq!(r.json["ok"], false);
    assert!(r.json["errors"][0]["message"].as_str().unwrap().contains("--fail-fast"), "{}", r.json);
    assert!(!dst.join("ff/f0").exists());
}

/// `--bwlimit 0` and `0.5` used to panic in the rate limiter and then hang: 0 is no limit (as in
/// rsync), a rate below 1 KiB/s is refused in one line before anything starts.
#[test]
fn bwlimit_zero_is_no_limit_and_a_tiny_rate_is_refused() {
    let t = scratch();
    write_file(&t.path().join("f"), 1, 3 << 20);
    let dst = t.path().join("g");
    let r = tern(&["cp", "--bwlimit", "0", t.path().join("f").to_str().unwrap(), dst.to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(fs::read(&dst).unwrap(), data(1, 3 << 20));
    let r = tern(&["cp", "--bwlimit", "0.5", t.path().join("f").to_str().unwrap(), t.path().join("h").to_str().unwrap()], &[]);
    assert_eq!(r.out.status.code(), Some(2), "{}", r.stderr());
    assert!(r.stderr().contains("below 1 KiB/s") && r.stderr().contains("0 means no limit"), "{}", r.stderr());
    assert!(!t.path().join("h").exists());
    // A plain number is KiB/s as in rsync: 1000 KiB/s moves 3 MiB in about 3 s, not 3,000 s.
    let r = tern(&["cp", "--bwlimit", "1000", t.path().join("f").to_str().unwrap(), t.path().join("k").to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
}

/// A name that does not resolve is a mistake to report once, not an outage to retry.
#[test]
fn an_unresolvable_host_fails_once_without_reconnecting() {
    let t = scratch();
    write_file(&t.path().join("f"), 1, 10);
    let token = t.path().join("token");
    fs::write(&token, "x".repeat(64)).unwrap();
    fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
    let r = tern(&["cp", t.path().join("f").to_str().unwrap(), "tern://no-such-host.invalid:4000/x", "--token-file", token.to_str().unwrap()], &[]);
    assert!(!r.ok());
    assert!(r.stderr().contains("cannot resolve") && r.stderr().contains("check the host name"), "{}", r.stderr());
    assert!(!r.stderr().contains("reconnecting"), "retried: {}", r.stderr());
    assert_eq!(r.json["reconnects"], 0, "{}", r.json);
}

/// Out of threads (`ulimit -u`): one clear line and a plain exit. A refused thread used to
/// panic, and a panic in the receiver's thread left the sender waiting for it forever (found
/// with `prlimit --nproc=12`). Every limit below what a copy needs is tried, as nobody (root is
/// exempt from the limit).
#[test]
fn running_out_of_threads_is_one_clear_line_never_a_panic_or_a_hang() {
    let ok = Command::new("setpriv").args(["--reuid=65534", "--regid=65534", "--clear-groups", "true"]).status().is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIP: cannot drop privileges with setpriv");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    open_dir(t.path());
    let src = t.path().join("src");
    for i in 0..8 {
        write_file(&src.join(format!("f{i}")), i, 3_000_000);
    }
    for e in fs::read_dir(&src).unwrap() {
        fs::set_permissions(e.unwrap().path(), fs::Permissions::from_mode(0o644)).unwrap();
    }
    fs::set_permissions(&src, fs::Permissions::from_mode(0o755)).unwrap();
    let mut refused = 0;
    for nproc in [4, 8, 12] {
        let dst = t.path().join(format!("out{nproc}"));
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "prlimit", &format!("--nproc={nproc}"), "--", tern_bin(), "cp", "-r"]).arg(&src).arg(&dst);
        let started = std::time::Instant::now();
        let out = run_bounded(cmd, Duration::from_secs(90));
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(started.elapsed() < Duration::from_secs(80), "nproc {nproc}: still running after {:?}: {e}", started.elapsed());
        if out.status.success() {
            continue; // enough threads after all (this limit counts nobody's other processes too)
        }
        assert_eq!(out.status.code(), Some(1), "nproc {nproc}: {e}");
        assert!(!e.contains("panicked"), "nproc {nproc}: {e}");
        assert_eq!(e.trim_end().lines().count(), 1, "nproc {nproc}: {e}");
        assert!(e.contains("cannot start a thread") && e.contains("ulimit -u"), "nproc {nproc}: {e}");
        refused += 1;
    }
    // A copy needs far more than 4 threads: at least that limit must have been met.
    assert!(refused > 0, "no limit was low enough to refuse a thread");
}

/// A read-only destination directory (a read-only bind mount here; `chattr +i` alike) is named
/// for what it is: the temporary cannot be created. It used to read "cannot remove stale
/// temporary", for a temporary that was never there. Needs root (skipped without).
#[test]
fn a_read_only_destination_directory_is_named_as_such() {
    let t = scratch();
    write_file(&t.path().join("src/ok"), 1, 100);
    write_file(&t.path().join("src/sub/x"), 2, 100);
    let ro = t.path().join("dst/sub");
    fs::create_dir_all(&ro).unwrap();
    let mount = |args: &[&str]| Command::new("mount").args(args).stderr(std::process::Stdio::null()).status().is_ok_and(|s| s.success());
    if !mount(&["--bind", ro.to_str().unwrap(), ro.to_str().unwrap()]) {
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(ro.clone());
    assert!(mount(&["-o", "remount,ro,bind", ro.to_str().unwrap()]));
    let r = tern(&["cp", "-r", &format!("{}/.", t.path().join("src").display()), t.path().join("dst").to_str().unwrap()], &[]);
    assert!(!r.ok());
    let err = r.stderr();
    assert!(err.contains("sub/x") && err.contains("cannot create temporary file") && err.contains("Read-only"), "{err}");
    assert!(!err.contains("stale temporary"), "{err}");
    assert_eq!(fs::read(t.path().join("dst/ok")).unwrap(), data(1, 100), "the rest is copied");
}
