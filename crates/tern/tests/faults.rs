//! Fault injection: kill -9 of either side, a corrupted chunk, a cut socket. After each, the
//! data must arrive intact and only what was in flight may be sent twice.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

use crate::common;
use common::*;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn big_source(dir: &Path, mib: u64) -> std::path::PathBuf {
    let p = dir.join("big.bin");
    let f = fs::File::create(&p).unwrap();
    for i in 0..mib / 16 {
        std::os::unix::fs::FileExt::write_all_at(&f, &data(i, (16 * MIB) as usize), i * 16 * MIB).unwrap();
    }
    p
}

/// Verified chunks recorded in a journal (records are 48 bytes after a 40-byte header).
fn journal_records(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len().saturating_sub(40) / 48).unwrap_or(0)
}

fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn_tern(args: &[&str], env: &[(&str, &str)]) -> std::process::Child {
    let mut cmd = Command::new(tern_bin());
    cmd.args(args).arg("--json").stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

fn finish(child: std::process::Child) -> Run {
    let out = child.wait_with_output().unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    Run { out, json }
}

// Two streams of 1 MiB chunks: at most a chunk being written plus one queued per stream.
const IN_FLIGHT: u64 = 2 * 2 * MIB;

#[test]
fn receiver_killed_mid_transfer_resumes_within_the_run() {
    let t = scratch();
    let src = big_source(t.path(), 128);
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let token = t.path().join("token");
    let mut d = Daemon::start_on(&root, &token, 0, &[]);
    let port = d.port;
    let url = d.url("/big.bin");
    let client =
        spawn_tern(&["cp", src.to_str().unwrap(), &url, "--token-file", token.to_str().unwrap(), "--chunk-size", "1M", "--streams", "2", "--retry-for", "60"], &[("TERN_FAULT_DELAY_MS", "15")]);
    let journal = journal_path(&root, "big.bin");
    wait_for("some verified chunks", Duration::from_secs(30), || journal_records(&journal) >= 20);
    d.kill9();
    let verified = journal_records(&journal);
    assert!(verified < 128, "killed too late");
    std::thread::sleep(Duration::from_millis(300));
    let _d2 = Daemon::start_on(&root, &token, port, &[]);
    let r = finish(client);
    assert!(r.ok(), "{}", r.stderr());
    eprintln!("measured: receiver killed at {verified}/128 verified chunks; resumed in-run, bytes_resent={} reconnects={}", r.u64("bytes_resent"), r.u64("reconnects"));
    assert!(r.u64("reconnects") >= 1);
    assert!(r.u64("bytes_resent") <= IN_FLIGHT, "resent {} bytes, more than was in flight", r.u64("bytes_resent"));
    assert!(r.u64("bytes") <= 128 * MIB + IN_FLIGHT);
    assert_eq!(fs::read(&src).unwrap(), fs::read(root.join("big.bin")).unwrap());
    assert_no_leftovers(&root);
}

#[test]
fn receiver_killed_then_rerun_sends_only_unverified_chunks() {
    let t = scratch();
    let src = big_source(t.path(), 64);
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let token = t.path().join("token");
    let mut d = Daemon::start_on(&root, &token, 0, &[]);
    let port = d.port;
    let url = d.url("/big.bin");
    let args = ["cp", src.to_str().unwrap(), &url, "--token-file", token.to_str().unwrap(), "--chunk-size", "1M", "--streams", "2", "--retry-for", "0"];
    let client = spawn_tern(&args, &[("TERN_FAULT_DELAY_MS", "15")]);
    let journal = journal_path(&root, "big.bin");
    wait_for("some verified chunks", Duration::from_secs(30), || journal_records(&journal) >= 10);
    d.kill9();
    let first = finish(client);
    assert!(!first.ok(), "the first run cannot succeed without its receiver");
    assert!(!root.join("big.bin").exists(), "no partial file under the final name");
    let _d2 = Daemon::start_on(&root, &token, port, &[]);
    let second = tern(&args, &[]);
    assert!(second.ok(), "{}", second.stderr());
    let resent = (first.u64("bytes") + second.u64("bytes")).saturating_sub(64 * MIB);
    eprintln!("measured: receiver killed, re-run: first sent {}, second sent {}, sent twice {resent} bytes", first.u64("bytes"), second.u64("bytes"));
    assert!(resent <= IN_FLIGHT, "{resent} bytes sent twice");
    assert!(second.u64("bytes_skipped") > 0, "the re-run reused verified chunks");
    assert_eq!(fs::read(&src).unwrap(), fs::read(root.join("big.bin")).unwrap());
}

#[test]
fn sender_killed_then_rerun_resumes() {
    let t = scratch();
    let src = big_source(t.path(), 64);
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let url = d.url("/big.bin");
    let args = ["cp", src.to_str().unwrap(), &url, "--token-file", &d.token_arg(), "--chunk-size", "1M", "--streams", "2"];
    let mut client = spawn_tern(&args, &[("TERN_FAULT_DELAY_MS", "15")]);
    let journal = journal_path(&root, "big.bin");
    wait_for("some verified chunks", Duration::from_secs(30), || journal_records(&journal) >= 10);
    client.kill().unwrap();
    let _ = client.wait();
    std::thread::sleep(Duration::from_millis(200));
    let verified = journal_records(&journal);
    let second = tern(&args, &[]);
    assert!(second.ok(), "{}", second.stderr());
    eprintln!("measured: sender killed with {verified}/64 chunks verified; re-run sent {} bytes ({} unverified)", second.u64("bytes"), (64 - verified) * MIB);
    assert!(second.u64("bytes") <= (64 - verified) * MIB + IN_FLIGHT, "sent {} with {verified} chunks verified", second.u64("bytes"));
    assert_eq!(fs::read(&src).unwrap(), fs::read(root.join("big.bin")).unwrap());
}

#[test]
fn corrupted_chunk_is_detected_and_only_it_is_resent() {
    let t = scratch();
    let src = big_source(t.path(), 32);
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let r = tern(&["cp", src.to_str().unwrap(), &d.url("/big.bin"), "--token-file", &d.token_arg(), "--chunk-size", "1M"], &[("TERN_FAULT_CORRUPT", "big.bin:3")]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(r.u64("chunks_resent"), 1);
    assert_eq!(r.u64("bytes_resent"), MIB);
    assert_eq!(r.u64("bytes"), 33 * MIB);
    assert_eq!(fs::read(&src).unwrap(), fs::read(root.join("big.bin")).unwrap());
}

#[test]
fn cut_socket_is_retried_within_the_run() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let src = big_source(t.path(), 128);
    let dst = t.path().join("dst.bin");
    let r = tern(
        &["cp", "--ssh", &sshd.ssh_cmd(), src.to_str().unwrap(), &format!("127.0.0.1:{}", dst.display()), "--chunk-size", "1M", "--streams", "2", "--tcp-buffer", "1M"],
        &[("TERN_FAULT_CUT_AFTER", "40000000")],
    );
    assert!(r.ok(), "{}", r.stderr());
    eprintln!("measured: socket cut at 40 MB: reconnects={} bytes_resent={}", r.u64("reconnects"), r.u64("bytes_resent"));
    assert!(r.u64("reconnects") >= 1, "the cut was not noticed: {}", r.json);
    // Per stream: a chunk, the 256 KiB write buffer and both (doubled) 1 MiB socket buffers.
    assert!(r.u64("bytes_resent") <= 2 * 6 * MIB, "resent {}", r.u64("bytes_resent"));
    assert_eq!(fs::read(&src).unwrap(), fs::read(&dst).unwrap());
}

/// Relative paths of the files under `root` with their final names (not temporaries or
/// journals). Tolerates entries vanishing while it looks: the far side may still be renaming.
fn final_names(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![std::path::PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(rd) = fs::read_dir(root.join(&rel)) else { continue };
        for e in rd.flatten() {
            let name = e.file_name();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(rel.join(&name)),
                Ok(t) if t.is_file() && !is_tern_name(&name.to_string_lossy()) => out.push(rel.join(&name)),
                _ => {}
            }
        }
    }
    out
}

/// The tree the crash tests copy: 100 small files, then (walked last, in `zz/`) three of 24 MiB,
/// so crashes land in both. Returns the bytes in it.
fn crash_tree(src: &Path) -> u64 {
    for i in 0..3u64 {
        write_file(&src.join(format!("zz/big{i}.bin")), 500 + i, 24 << 20);
    }
    for i in 0..100u64 {
        write_file(&src.join(format!("d{}/s{i}", i % 7)), i, (i as usize * 7919) % 65536 + 1);
    }
    3 * (24 << 20) + (0..100u64).map(|i| (i * 7919) % 65536 + 1).sum::<u64>()
}

/// TigerBeetle's habit: crash at many points, not one. Each of eight rounds starts `tern cp -r
/// src/. DEST` (`dest()` gives DEST and its flags) and kills one side at a pseudo-random moment:
/// the client (sender) or, through `kill_far`, the far end (receiver). After every crash each
/// file under its final name must be complete and identical to its source. Then a clean run
/// must finish the tree sending only what was neither renamed into place nor journaled as
/// verified. The seed is printed; `TERN_CRASH_SEED=N` replays or explores.
/// `setup`: how long a run takes to start moving data (an ssh login), added to every kill time.
fn crash_rounds(src: &Path, total_bytes: u64, dst: &Path, setup: Duration, dest: &mut dyn FnMut() -> (Vec<String>, String), kill_far: &mut dyn FnMut()) {
    let seed: u64 = std::env::var("TERN_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(2);
    let mut rng = seed;
    let mut next = move |n: u64| {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 33) % n
    };
    let total = final_names(src).len();
    let contents = format!("{}/.", src.display());
    // Flags first: the sources and the destination must stay together on the command line.
    let cp = |(flags, url): (Vec<String>, String), extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = ["cp", "-r"].map(String::from).to_vec();
        a.extend(flags);
        a.extend(extra.iter().map(|s| s.to_string()));
        a.extend([contents.clone(), url]);
        a
    };
    for round in 0..8 {
        let args = cp(dest(), &["--streams", "2", "--retry-for", "0"]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // 172 chunks at 15 ms on 2 streams: about 1.3 s of sending, cut into rounds of 0.1-0.4 s.
        let mut client = spawn_tern(&args, &[("TERN_FAULT_DELAY_MS", "15")]);
        let after = setup + Duration::from_millis(100 + next(300));
        std::thread::sleep(after);
        let far = next(2) == 0;
        if far {
            kill_far();
        } else {
            let _ = client.kill();
        }
        let out = finish(client);
        let landed = final_names(dst);
        for rel in &landed {
            let Ok(got) = fs::read(dst.join(rel)) else { continue };
            assert!(got == fs::read(src.join(rel)).unwrap(), "seed {seed} round {round}: {} is under its final name but not complete", rel.display());
        }
        eprintln!(
            "seed {seed} round {round}: killed the {} after {after:?}: {} of {total} files in place{}",
            if far { "far end (receiver)" } else { "client (sender)" },
            landed.len(),
            if out.ok() { " (the run had already finished)" } else { "" }
        );
    }
    // What the crashes left verified: files in place, plus journaled chunks of the big files.
    std::thread::sleep(Duration::from_millis(300));
    let landed = final_names(dst);
    let in_place: u64 = landed.iter().map(|rel| fs::metadata(dst.join(rel)).unwrap().len()).sum();
    let journaled: u64 = (0..3).filter(|i| !landed.contains(&format!("zz/big{i}.bin").into())).map(|i| journal_records(&journal_path(&dst.join("zz"), &format!("big{i}.bin"))) * MIB).sum();
    let args = cp(dest(), &[]);
    let r = tern(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    assert!(r.ok(), "{}", r.stderr());
    eprintln!("measured: after 8 crashes {in_place} bytes in place + {journaled} journaled of {total_bytes}; the final run sent {}", r.u64("bytes"));
    assert!(r.u64("bytes") <= total_bytes - in_place - journaled, "seed {seed}: the final run re-sent verified data");
    assert_same_tree(src, dst);
    assert_no_leftovers(dst);
}

#[test]
fn crashes_at_random_points_through_a_daemon_never_expose_a_partial_file_or_lose_verified_work() {
    let t = scratch();
    let src = t.path().join("src");
    let total_bytes = crash_tree(&src);
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let token = t.path().join("token");
    let daemon = std::cell::RefCell::new(Daemon::start(&root, &token));
    let tok = token.to_str().unwrap().to_string();
    crash_rounds(&src, total_bytes, &root.join("copy"), Duration::ZERO, &mut || (vec!["--token-file".into(), tok.clone()], daemon.borrow().url("/copy")), &mut || {
        let mut d = daemon.borrow_mut();
        d.kill9();
        *d = Daemon::start(&root, &token);
    });
}

/// The same over ssh (the default mode): the far end is the `tern _remote` that sshd started.
#[test]
fn crashes_at_random_points_over_ssh_never_expose_a_partial_file_or_lose_verified_work() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let src = t.path().join("src");
    let total_bytes = crash_tree(&src);
    let dst = t.path().join("copy");
    let ssh = sshd.ssh_cmd();
    crash_rounds(&src, total_bytes, &dst, Duration::from_millis(350), &mut || (vec!["--ssh".into(), ssh.clone()], format!("127.0.0.1:{}", dst.display())), &mut || {
        for pid in descendants(sshd.pid()) {
            if fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.windows(7).any(|w| w == b"_remote")) {
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    });
}

/// A leftover partial whose journal still matches the source's size and mtime but whose data is
/// of an older version (the source was rewritten in place and its mtime put back): every chunk
/// the journal names re-hashes fine against the partial, so only the whole-file hash can tell.
/// The file starts over once and lands right (was: "protocol error from the receiver: want for
/// a file not waiting for data").
#[test]
fn a_leftover_partial_of_an_older_version_restarts_the_file_once() {
    let t = scratch();
    let src = big_source(t.path(), 32);
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let url = d.url("/big.bin");
    let args = ["cp", src.to_str().unwrap(), &url, "--token-file", &d.token_arg(), "--chunk-size", "1M", "--streams", "2"];
    let mut client = spawn_tern(&args, &[("TERN_FAULT_DELAY_MS", "15")]);
    let journal = journal_path(&root, "big.bin");
    wait_for("some verified chunks", Duration::from_secs(30), || journal_records(&journal) >= 8);
    let _ = client.kill();
    let _ = client.wait();
    // Rewrite the source's tail (chunks the partial may not hold yet) and the head (chunks it
    // does), keeping size and mtime.
    let mtime = fs::metadata(&src).unwrap().modified().unwrap();
    let f = fs::OpenOptions::new().write(true).open(&src).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &data(777, MIB as usize), 0).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    let r = tern(&args, &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(fs::read(&src).unwrap(), fs::read(root.join("big.bin")).unwrap());
    assert_no_leftovers(&root);
}

/// During an outage the progress a supervisor (or the live display) sees keeps the transfer's
/// totals and says "reconnecting", and the rate after the resume counts only what crossed the
/// network (issue 12).
#[test]
fn progress_during_an_outage_keeps_the_totals_and_says_reconnecting() {
    let t = scratch();
    let src = big_source(t.path(), 64);
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let token = t.path().join("token");
    let mut d = Daemon::start_on(&root, &token, 0, &[]);
    let port = d.port;
    let url = d.url("/big.bin");
    let client = spawn_tern(
        &["cp", src.to_str().unwrap(), &url, "--token-file", token.to_str().unwrap(), "--chunk-size", "1M", "--streams", "2", "--retry-for", "60", "--progress-json"],
        &[("TERN_FAULT_DELAY_MS", "15")],
    );
    let journal = journal_path(&root, "big.bin");
    wait_for("some verified chunks", Duration::from_secs(30), || journal_records(&journal) >= 10);
    d.kill9();
    std::thread::sleep(Duration::from_millis(3500));
    let _d2 = Daemon::start_on(&root, &token, port, &[]);
    let out = client.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let (progress, summary): (Vec<_>, Vec<_>) = lines.iter().partition(|v| v["type"] == "progress");
    assert_eq!(summary.len(), 1, "one summary object");
    assert_eq!(summary[0]["type"], "summary");
    let total = 64 * MIB;
    let outage: Vec<_> = progress.iter().filter(|v| v["progress"]["state"] == "reconnecting").collect();
    assert!(!outage.is_empty(), "no progress line said reconnecting during a 3.5 s outage");
    for v in &outage {
        let p = &v["progress"];
        assert_eq!(p["bytes_total_overall"].as_u64(), Some(total), "totals kept during the outage: {p}");
        assert!(p["bytes_done_overall"].as_u64().unwrap() >= 10 * MIB, "done kept during the outage: {p}");
        assert!(p["eta_s"].is_null(), "no ETA while reconnecting: {p}");
    }
    // Every line has a rate; no line after the resume claims the resumed (skipped) bytes as rate.
    for v in &progress {
        let rate = v["progress"]["rate_bytes_per_s"].as_f64().expect("rate");
        assert!(rate < 2.0e9, "rate {rate} counts bytes that never crossed the network");
        assert!(v["progress"]["bytes_done_overall"].as_u64().unwrap() <= total);
    }
    assert_eq!(fs::read(&src).unwrap(), fs::read(root.join("big.bin")).unwrap());
}

/// A pull that reconnects counts each file once: the new remote sender announces everything
/// again, and what landed before the outage is neither "skipped" nor counted twice.
#[test]
fn a_pull_through_an_outage_counts_each_file_once() {
    let t = scratch();
    let root = t.path().join("root");
    for i in 0..16 {
        write_file(&root.join(format!("run/f{i:02}")), i, 2 * MIB as usize);
    }
    let token = t.path().join("token");
    let mut d = Daemon::start_on(&root, &token, 0, &[("TERN_FAULT_DELAY_MS", "20")]);
    let port = d.port;
    let dst = t.path().join("dst");
    let client = spawn_tern(&["cp", "-r", &d.url("/run"), dst.to_str().unwrap(), "--token-file", token.to_str().unwrap(), "--chunk-size", "1M", "--streams", "2", "--retry-for", "60"], &[]);
    let landed = || fs::read_dir(&dst).map(|r| r.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with('f')).count()).unwrap_or(0);
    wait_for("some files landed", Duration::from_secs(30), || landed() >= 3);
    d.kill9();
    let before = landed();
    assert!(before < 16, "killed too late");
    std::thread::sleep(Duration::from_millis(500));
    let _d2 = Daemon::start_on(&root, &token, port, &[]);
    let r = finish(client);
    assert!(r.ok(), "{}", r.stderr());
    assert!(r.u64("reconnects") >= 1);
    assert_eq!((r.u64("files"), r.u64("files_skipped")), (16, 0), "each file counted once: {}", r.json);
    assert_same_tree(&root.join("run"), &dst);
}

/// The same for a push: a file the killed receiver renamed into place before its FileDone went
/// out is counted as copied after the resume, not as skipped.
#[test]
fn a_push_through_an_outage_counts_each_file_once() {
    let t = scratch();
    let src = t.path().join("run");
    for i in 0..16 {
        write_file(&src.join(format!("f{i:02}")), i, 2 * MIB as usize);
    }
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let token = t.path().join("token");
    let mut d = Daemon::start_on(&root, &token, 0, &[]);
    let port = d.port;
    let client = spawn_tern(
        &["cp", "-r", src.to_str().unwrap(), &d.url("/run"), "--token-file", token.to_str().unwrap(), "--chunk-size", "1M", "--streams", "2", "--retry-for", "60"],
        &[("TERN_FAULT_DELAY_MS", "20")],
    );
    let dst = root.join("run");
    let landed = || fs::read_dir(&dst).map(|r| r.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with('f')).count()).unwrap_or(0);
    wait_for("some files landed", Duration::from_secs(30), || landed() >= 3);
    d.kill9();
    assert!(landed() < 16, "killed too late");
    std::thread::sleep(Duration::from_millis(500));
    let _d2 = Daemon::start_on(&root, &token, port, &[]);
    let r = finish(client);
    assert!(r.ok(), "{}", r.stderr());
    assert!(r.u64("reconnects") >= 1);
    assert_eq!((r.u64("files"), r.u64("files_skipped")), (16, 0), "each file counted once: {}", r.json);
    assert_same_tree(&src, &dst);
}

/// A descriptor limit met mid-run (the process out of descriptors for a while: another session,
/// another tool) slows the transfer down and is waited out; no file fails (issue 11).
#[test]
fn running_out_of_descriptors_mid_run_fails_no_file() {
    let t = scratch();
    let src = t.path().join("many");
    for i in 0..300 {
        write_file(&src.join(format!("d{}/f{i:03}", i % 7)), i, 8 << 10);
    }
    // Multi-chunk files: their journals are made when they are asked for (the control loop).
    for i in 0..12 {
        write_file(&src.join(format!("big{i}")), 1000 + i, 3_000_000);
    }
    // Locally (sender and receiver share the process and its limit), with files in flight and
    // with none, and into a daemon.
    for (n, label) in [(40, "local, files in flight"), (1, "local, the first file")] {
        let dst = t.path().join(format!("dst-{n}"));
        let r = tern(&["cp", "-r", "--chunk-size", "1M", src.to_str().unwrap(), dst.to_str().unwrap()], &[("TERN_FAULT_EXHAUST_FDS", &format!("{n}:1500"))]);
        assert!(r.ok() && r.u64("files") == 312, "{label}: {} {}", r.stderr(), r.json);
        assert_same_tree(&src, &dst);
    }
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start_on(&root, &t.path().join("token"), 0, &[("TERN_FAULT_EXHAUST_FDS", "40:1500")]);
    let r = tern(&["cp", "-r", "--chunk-size", "1M", src.to_str().unwrap(), &d.url("/many"), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok() && r.u64("files") == 312, "daemon: {} {}", r.stderr(), r.json);
    assert_same_tree(&src, &root.join("many"));
}
