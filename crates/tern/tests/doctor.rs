//! `tern doctor DEST` (issue 15): the far host's tuning checked over the connection a transfer
//! would use — a daemon in a network namespace with reno and small socket buffers is flagged,
//! the same namespace tuned is not — over ssh to localhost, and the refusals.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

use crate::common;

use std::collections::BTreeSet;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::netns::Netns;
use common::*;

fn run(args: &[&str]) -> Output {
    let mut cmd = Command::new(tern_bin());
    cmd.args(args).stdin(Stdio::null());
    run_bounded(cmd, Duration::from_secs(120))
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn report(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "status {:?}: stdout {} stderr {}", o.status, String::from_utf8_lossy(&o.stdout), err(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

/// The checks host `i` of the report warns about.
fn warned(v: &serde_json::Value, i: usize) -> BTreeSet<String> {
    v["hosts"][i]["findings"].as_array().unwrap().iter().filter(|f| f["level"] == "warn").map(|f| f["check"].as_str().unwrap().to_string()).collect()
}

const NETWORK_CHECKS: [&str; 3] = ["socket buffers", "congestion control", "pacing (qdisc)"];

const TUNED: [&str; 3] = ["net.ipv4.tcp_rmem=4096 131072 67108864", "net.ipv4.tcp_wmem=4096 16384 67108864", "net.ipv4.tcp_congestion_control=bbr"];

#[test]
fn a_far_host_with_reno_and_small_buffers_is_flagged_and_nothing_false_once_tuned() {
    let Some(mut n) = Netns::up("d", "198.19.213") else { return };
    // A tuned; B as an untuned host of the field: 1 MiB buffer limits and reno.
    n.sysctl(true, &TUNED);
    n.sysctl(false, &["net.ipv4.tcp_rmem=4096 131072 1048576", "net.ipv4.tcp_wmem=4096 16384 1048576", "net.ipv4.tcp_congestion_control=reno"]);
    let t = scratch();
    std::fs::create_dir_all(t.path().join("root")).unwrap();
    let token = t.path().join("token");
    n.serve(&t.path().join("root"), &token);
    let doctor = |extra: &[&str]| {
        let mut args = vec!["doctor", "--json", "--token-file", token.to_str().unwrap()];
        args.extend_from_slice(extra);
        let url = n.url("");
        args.push(&url);
        report(&n.tern(&args))
    };
    // For the path the field meets (1 Gb/s × 68 ms: 8.5 MB in flight).
    let v = doctor(&["--rtt-ms", "68", "--rate-gbps", "1"]);
    assert_eq!(v["hosts"].as_array().unwrap().len(), 2, "{v}");
    assert!(v["hosts"][1]["host"].as_str().unwrap().contains("198.19.213.2"), "{v}");
    let far = warned(&v, 1);
    assert!(far.contains("socket buffers") && far.contains("congestion control"), "{far:?}: {v}");
    let buffers = v["hosts"][1]["findings"].as_array().unwrap().iter().find(|f| f["check"] == "socket buffers").unwrap();
    assert!(buffers["seen"].as_str().unwrap().contains("tcp_rmem (max) = 1 MiB") && buffers["fix"].as_str().unwrap().contains("sysctl -w"), "{buffers}");
    assert_eq!(v["hosts"][1]["facts"]["congestion_control"], "reno");
    assert!(warned(&v, 0).iter().all(|c| !NETWORK_CHECKS.contains(&c.as_str())), "this (tuned) host: {v}");
    // B tuned like A: nothing about the network, and nothing A (the same kernel) is not told.
    n.sysctl(false, &TUNED);
    let v = doctor(&["--rtt-ms", "68", "--rate-gbps", "1"]);
    let (far, here) = (warned(&v, 1), warned(&v, 0));
    assert!(far.iter().all(|c| !NETWORK_CHECKS.contains(&c.as_str())), "{far:?}: {v}");
    assert!(far.is_subset(&here), "far {far:?} here {here:?}");
    // Without --rtt-ms the round trip is measured to the far side (a veth: well under 10 ms).
    let v = doctor(&[]);
    assert_eq!(v["path"]["rtt_from"], "measured", "{v}");
    let rtt = v["path"]["rtt_ms"].as_f64().unwrap();
    assert!(rtt > 0.0 && rtt < 10.0, "{v}");
}

#[test]
fn a_far_host_over_ssh_is_checked_with_its_destination_file_system() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let o = run(&["doctor", "--ssh", &sshd.ssh_cmd(), &format!("127.0.0.1:{}", t.path().display())]);
    assert!(o.status.success(), "{}", err(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.lines().any(|l| l.starts_with("this host:")), "{text}");
    assert!(text.lines().any(|l| l.contains("127.0.0.1") && l.ends_with(':')), "{text}");
    assert!(text.contains("(measured)"), "{text}");
    // The far side's file system is the destination's (tmpfs or the disk), named by its path.
    assert!(text.contains(&format!("file system: {}:", t.path().display())), "{text}");
}

#[test]
fn a_daemon_that_runs_no_tests_or_an_older_one_is_refused_in_one_line() {
    let t = scratch();
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let d = Daemon::start_with(&root, &t.path().join("token"), 0, &[], &["--no-tests"]);
    let o = run(&["doctor", "--token-file", &d.token_arg(), &d.url("")]);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    let e = err(&o);
    assert_eq!(e.trim_end().lines().count(), 1, "one line: {e}");
    assert!(e.contains("does not run path tests (tern serve --no-tests)"), "{e}");
    // Path tests but no host step: the build before `tern doctor DEST`.
    let older = (1u64 | 2 | 4 | 8 | 16 | 32 | 64 | 128 | 256).to_string();
    let root2 = t.path().join("root2");
    std::fs::create_dir_all(&root2).unwrap();
    let d = Daemon::start_on(&root2, &t.path().join("token2"), 0, &[("TERN_DEBUG_FEATURES", &older)]);
    let o = run(&["doctor", "--token-file", &d.token_arg(), &d.url("")]);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    let e = err(&o);
    assert_eq!(e.trim_end().lines().count(), 1, "one line: {e}");
    assert!(e.contains("cannot report its host; upgrade it there"), "{e}");
    // Two far sides at once: a usage error.
    let o = run(&["doctor", &d.url(""), &d.url("x")]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
}
