//! Trees whose shape, not size, used to break a copy: long paths and deep directories overflowed
//! the control frame ("frame of 1152382 bytes exceeds the limit"), with nothing copied.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

use crate::common;
use common::*;

use std::fs;
use std::path::{Path, PathBuf};

/// 600 small files under 45 levels of 50-character directory names (~2.3 KB paths).
fn long_paths(root: &Path) -> PathBuf {
    let mut dir = root.join("src");
    for level in 0..45 {
        dir = dir.join(format!("{level:02}{}", "x".repeat(48)));
    }
    fs::create_dir_all(&dir).unwrap();
    for i in 0..600 {
        fs::write(dir.join(format!("file-{i:04}-{}", "y".repeat(100))), format!("{i}\n")).unwrap();
    }
    root.join("src")
}

#[test]
fn long_paths_copy_locally_and_through_a_daemon() {
    let t = scratch();
    let src = long_paths(t.path());
    let r = tern(&["cp", "-r", src.to_str().unwrap(), t.path().join("local").to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &t.path().join("local"));

    fs::create_dir(t.path().join("root")).unwrap();
    let d = Daemon::start(&t.path().join("root"), &t.path().join("token"));
    let r = tern(&["cp", "-r", src.to_str().unwrap(), &d.url("/copy"), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &t.path().join("root/copy"));
    let r = tern(&["cp", "-r", &d.url("/copy"), t.path().join("pulled").to_str().unwrap(), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &t.path().join("pulled"));
}

#[test]
fn a_tree_2000_directories_deep_copies() {
    let t = scratch();
    let src = t.path().join("src");
    let mut dir = src.clone();
    for _ in 0..2000 {
        dir = dir.join("d");
    }
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("leaf"), b"deep\n").unwrap();
    fs::write(src.join("top"), b"top\n").unwrap();
    let r = tern(&["cp", "-r", src.to_str().unwrap(), t.path().join("dst").to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &t.path().join("dst"));
}

/// `tern ARGS` with at most `nofile` descriptors (soft and hard), as `ulimit -n` gives.
fn tern_limited(nofile: u32, args: &[&str]) -> Run {
    let mut cmd = std::process::Command::new("prlimit");
    cmd.arg(format!("--nofile={nofile}:{nofile}")).arg("--").arg(tern_bin()).args(args).arg("--json").stdin(std::process::Stdio::null());
    let out = run_bounded(cmd, std::time::Duration::from_secs(300));
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    Run { out, json }
}

fn many_files(dir: &Path, n: usize, dirs: usize) {
    for d in 0..dirs {
        fs::create_dir_all(dir.join(format!("d{d:03}"))).unwrap();
    }
    for i in 0..n {
        let body = if i % 5 == 0 { format!("{i}\n").repeat(i % 300) } else { String::new() };
        fs::write(dir.join(format!("d{:03}/f{i:06}", i % dirs)), body).unwrap();
    }
}

/// 20,000 files (most empty) over 300 directories under `ulimit -n 256` on both sides: used to
/// fail thousands of files with "Too many open files"; every file now lands.
#[test]
fn twenty_thousand_files_under_a_256_descriptor_limit() {
    let t = scratch();
    let src = t.path().join("src");
    many_files(&src, 20_000, 300);
    let r = tern_limited(256, &["cp", "-r", src.to_str().unwrap(), t.path().join("local").to_str().unwrap()]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(r.json["files_failed"], 0, "{}", r.json);
    assert_same_tree(&src, &t.path().join("local"));

    fs::create_dir(t.path().join("root")).unwrap();
    let d = Daemon::start(&t.path().join("root"), &t.path().join("token"));
    let st = std::process::Command::new("prlimit").arg(format!("--pid={}", d.child.id())).arg("--nofile=256:256").status().unwrap();
    assert!(st.success());
    let r = tern_limited(256, &["cp", "-r", src.to_str().unwrap(), &d.url("/copy"), "--token-file", &d.token_arg()]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &t.path().join("root/copy"));
    let r = tern_limited(256, &["cp", "-r", &d.url("/copy"), t.path().join("pulled").to_str().unwrap(), "--token-file", &d.token_arg()]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &t.path().join("pulled"));
}

/// Under a low descriptor limit a one-chunk file holds no descriptor while it waits in flight
/// (opened, written and closed when its chunk arrives), so small files fill the window far past
/// what the limit allows files that hold descriptors: under `ulimit -n 128` that share is 32
/// files (`window_held`), which was the whole window before. 4,000 small files and a few of
/// several chunks, copied completely; the receiver's log says how many were in flight at once.
#[test]
fn small_files_in_flight_are_not_bounded_by_the_descriptor_limit() {
    let t = scratch();
    let src = t.path().join("src");
    for d in 0..4 {
        fs::create_dir_all(src.join(format!("d{d}"))).unwrap();
    }
    for i in 0..4000 {
        fs::write(src.join(format!("d{}/f{i:05}", i % 4)), format!("{i}\n").repeat(1 + i % 200)).unwrap();
    }
    for i in 0..6 {
        // 2.5 chunks of 1 MiB each: these hold descriptors while in flight.
        let body: Vec<u8> = (0..(5 << 19) as u32).map(|b| (b.wrapping_mul(2654435761).wrapping_add(i) >> 24) as u8).collect();
        fs::write(src.join(format!("d{}/large{i}", i % 4)), body).unwrap();
    }
    let dst = t.path().join("dst");
    let mut cmd = std::process::Command::new("prlimit");
    cmd.arg("--nofile=128:128").arg("--").arg(tern_bin()).args(["cp", "-r", src.to_str().unwrap(), dst.to_str().unwrap(), "--json"]);
    cmd.env("TERN_LOG", "warn,tern_engine::driver::receiver=debug").stdin(std::process::Stdio::null());
    let out = run_bounded(cmd, std::time::Duration::from_secs(300));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((json["files"].as_u64(), json["files_failed"].as_u64()), (Some(4006), Some(0)), "{json}");
    assert_same_tree(&src, &dst);
    assert_no_leftovers(&dst);
    // "files in flight: at most N at once, M of them holding descriptors (window W files, H holding; ...)"
    let line = stderr.lines().find(|l| l.contains("files in flight: at most")).unwrap_or_else(|| panic!("no window line in: {stderr}"));
    let said = &line[line.find("files in flight:").unwrap()..];
    let nums: Vec<usize> = said.split(|c: char| !c.is_ascii_digit()).filter(|w| !w.is_empty()).map(|w| w.parse().unwrap()).collect();
    let [peak, peak_held, _window, held, limit] = nums[..] else { panic!("{line}") };
    assert_eq!(limit, 128, "{line}");
    eprintln!("{line}");
    assert_eq!(held, 32, "the descriptor limit's share under 128: {line}");
    assert!(peak_held <= held, "{line}");
    assert!(peak > 2 * held, "small files in flight still bounded by descriptors: {line}");
}

/// A real tree nobody here wrote, under `ulimit -n 256`: this machine's Rust standard library
/// sources or documentation (whichever the toolchain has), else /usr/share/doc.
#[test]
fn a_real_tree_under_a_256_descriptor_limit() {
    let sysroot = std::process::Command::new("rustc").args(["--print", "sysroot"]).output().ok().map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let candidates = [sysroot.as_ref().map(|s| s.join("lib/rustlib/src/rust/library")), sysroot.as_ref().map(|s| s.join("share/doc")), Some(PathBuf::from("/usr/share/doc"))];
    let Some(src) = candidates.into_iter().flatten().find(|p| p.is_dir()) else {
        eprintln!("SKIP: no real tree found");
        return;
    };
    let t = scratch();
    let r = tern_limited(256, &["cp", "-r", src.to_str().unwrap(), t.path().join("copy").to_str().unwrap()]);
    eprintln!("{}: {} files, {} bytes", src.display(), r.json["files"], r.json["bytes"]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &t.path().join("copy"));

    // Into a daemon, both sides under the same limit.
    fs::create_dir(t.path().join("root")).unwrap();
    let d = Daemon::start(&t.path().join("root"), &t.path().join("token"));
    let st = std::process::Command::new("prlimit").arg(format!("--pid={}", d.child.id())).arg("--nofile=256:256").status().unwrap();
    assert!(st.success());
    let r = tern_limited(256, &["cp", "-r", src.to_str().unwrap(), &d.url("/real"), "--token-file", &d.token_arg()]);
    assert!(r.ok(), "daemon: {}", r.stderr());
    assert_same_tree(&src, &t.path().join("root/real"));

    // Back over ssh, the far side's tern under the same limit too.
    let Some(sshd) = require_sshd() else { return };
    let limited = t.path().join("tern-256");
    fs::write(&limited, format!("#!/bin/sh\nexec prlimit --nofile=256:256 -- {} \"$@\"\n", tern_bin())).unwrap();
    fs::set_permissions(&limited, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let back = t.path().join("back");
    let remote = format!("127.0.0.1:{}", t.path().join("root/real").display());
    let r = tern_limited(256, &["cp", "-r", "--ssh", &sshd.ssh_cmd(), "--remote-bin", limited.to_str().unwrap(), &remote, back.to_str().unwrap()]);
    assert!(r.ok(), "ssh: {}", r.stderr());
    assert_same_tree(&src, &back);
}

/// A local copy runs both ends in one process: under a tiny limit (`ulimit -n 32`) it used to
/// wait ~25 s for descriptors its own streams and directory cache held, then fail the file.
/// It now opens fewer streams and caches fewer directories, and copies.
#[test]
fn a_local_copy_works_under_a_tiny_descriptor_limit() {
    let t = scratch();
    let src = t.path().join("one");
    write_file(&src.join("big"), 4, 10 << 20);
    many_files(&src.join("small"), 200, 20);
    let started = std::time::Instant::now();
    let r = tern_limited(32, &["cp", "-r", src.to_str().unwrap(), t.path().join("dst").to_str().unwrap()]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &t.path().join("dst"));
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "waited for descriptors: {:?}", started.elapsed());
}
