//! The cluster registry (issue 14, docs/cluster.md "Node registry") on a real PostgreSQL server:
//! nodes join, show in `tern cluster status`, drain, leave on a clean stop and show unreachable
//! after kill -9; a node that does not match the cluster — another root, secret, version or
//! file system, a name in use, no PostgreSQL — is refused in one line and serves nothing.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

use crate::common;
use crate::pg;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn tern(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(tern_bin());
    cmd.args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_bounded(cmd, Duration::from_secs(60))
}

fn node_args<'a>(url: &'a str, name: &'a str) -> Vec<&'a str> {
    vec!["--db", url, "--cluster", "site-a", "--node-name", name, "--cluster-heartbeat-ms", "300"]
}

/// The nodes `tern cluster status --json` lists, by name: state.
fn states(url: &str) -> Vec<(String, String)> {
    let o = tern(&["cluster", "status", "--json", "--db", url, "--cluster", "site-a"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    v["nodes"].as_array().unwrap().iter().map(|n| (n["node"].as_str().unwrap().to_string(), n["state"].as_str().unwrap().to_string())).collect()
}

fn wait_for(url: &str, want: &[(&str, &str)]) {
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let got = states(url);
        if got.iter().map(|(a, b)| (a.as_str(), b.as_str())).eq(want.iter().copied()) {
            return;
        }
        assert!(Instant::now() < until, "states {got:?}, want {want:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A node that must be refused: `tern serve` exits non-zero, its last stderr line names the
/// reason, and it never listened.
fn refused(root: &Path, token: &Path, extra: &[&str], env: &[(&str, &str)], reason: &str) {
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--root", root.to_str().unwrap(), "--token-file", token.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = tern(&args, env);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "joined though it should not: {e}");
    assert_eq!(e.trim_end().lines().count(), 1, "one line: {e}");
    assert!(e.contains(reason), "want '{reason}' in: {e}");
    assert!(!e.contains("listening on"), "{e}");
}

#[test]
fn nodes_join_drain_leave_and_go_silent() {
    let Some(pg) = pg::Postgres::start() else { return };
    let url = pg.create_db("lifecycle");
    let t = scratch();
    let (root, token) = (t.path().join("root"), t.path().join("token"));
    std::fs::create_dir_all(&root).unwrap();
    let mut n1 = Daemon::start_with(&root, &token, 0, &[], &node_args(&url, "dtn01"));
    let mut n2 = Daemon::start_with(&root, &token, 0, &[], &node_args(&url, "dtn02"));
    wait_for(&url, &[("dtn01", "active"), ("dtn02", "active")]);
    // The file-system probe the second node wrote is gone; the root holds nothing of the cluster.
    assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
    let o = tern(&["cluster", "drain", "dtn02", "--cluster", "site-a", "--db", &url], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_for(&url, &[("dtn01", "active"), ("dtn02", "draining")]);
    let o = tern(&["cluster", "drain", "dtn09", "--cluster", "site-a", "--db", &url], &[]);
    assert_eq!(o.status.code(), Some(1), "no such node");
    let o = tern(&["cluster", "drain", "--undo", "dtn02", "--cluster", "site-a", "--db", &url], &[]);
    assert!(o.status.success());
    wait_for(&url, &[("dtn01", "active"), ("dtn02", "active")]);
    // A clean stop leaves; kill -9 falls silent and shows unreachable after 3 heartbeats.
    // SAFETY: kill(2) on our own child's PID.
    assert_eq!(unsafe { libc::kill(n1.child.id() as i32, libc::SIGTERM) }, 0);
    let _ = n1.child.wait();
    n2.kill9();
    wait_for(&url, &[("dtn01", "left"), ("dtn02", "unreachable")]);
    // The text form names every node.
    let o = tern(&["cluster", "status", "--db", &url], &[]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.lines().count() == 2 && text.contains("unreachable") && text.contains("left"), "{text}");
    // The name of a node that went silent can be taken again.
    let _n2b = Daemon::start_with(&root, &token, 0, &[], &node_args(&url, "dtn02"));
    wait_for(&url, &[("dtn01", "left"), ("dtn02", "active")]);
}

#[test]
fn a_node_that_does_not_match_the_cluster_is_refused_in_one_line() {
    let Some(pg) = pg::Postgres::start() else { return };
    let url = pg.create_db("mismatch");
    let t = scratch();
    let (root, token) = (t.path().join("root"), t.path().join("token"));
    std::fs::create_dir_all(&root).unwrap();
    let _n1 = Daemon::start_with(&root, &token, 0, &[], &node_args(&url, "dtn01"));
    wait_for(&url, &[("dtn01", "active")]);
    let other_root = t.path().join("other");
    std::fs::create_dir_all(&other_root).unwrap();
    refused(&other_root, &token, &node_args(&url, "dtn02"), &[], "--root directories differ from node dtn01's");
    std::fs::write(t.path().join("token2"), "another secret, long enough").unwrap();
    refused(&root, &t.path().join("token2"), &node_args(&url, "dtn02"), &[], "holds another secret than node dtn01's");
    refused(&root, &token, &node_args(&url, "dtn02"), &[("TERN_DEBUG_VERSION", "0.0.1")], "runs tern 0.0.1");
    refused(&root, &token, &node_args(&url, "dtn01"), &[], "node dtn01 of cluster site-a is already live");
    refused(&root, &token, &["--cluster", "site-a", "--db", "/tmp/jobs.db"], &[], "share one PostgreSQL database");
    refused(&root, &token, &node_args(&url, "../x"), &[], "--node-name '../x'");
    // No server there: one line naming where, never the password.
    let o = tern(
        &["serve", "--listen", "127.0.0.1:0", "--root", root.to_str().unwrap(), "--token-file", token.to_str().unwrap(), "--db", "postgres://tern:sekrit@127.0.0.1:1/x", "--cluster", "site-a"],
        &[],
    );
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.trim_end().lines().count() == 1 && e.contains("cluster database unreachable") && !e.contains("sekrit"), "{e}");
    // Nothing of the refused nodes stays registered as live.
    wait_for(&url, &[("dtn01", "active")]);
}

/// A node whose root is another file system at the same path (a tmpfs mounted over it in a
/// private mount namespace) cannot read the live node's view of the probe: refused.
#[test]
fn a_node_that_does_not_see_the_cluster_s_file_system_is_refused() {
    let ok = Command::new("unshare").args(["-m", "true"]).status().is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIP: cannot make a mount namespace (needs root and util-linux's unshare)");
        return;
    }
    let Some(pg) = pg::Postgres::start() else { return };
    let url = pg.create_db("fs");
    let t = scratch();
    let (root, token) = (t.path().join("root"), t.path().join("token"));
    std::fs::create_dir_all(&root).unwrap();
    let _n1 = Daemon::start_with(&root, &token, 0, &[], &node_args(&url, "dtn01"));
    wait_for(&url, &[("dtn01", "active")]);
    let script = format!(
        "mount -t tmpfs tmpfs '{root}' && exec '{bin}' serve --listen 127.0.0.1:0 --root '{root}' --token-file '{token}' --db '{url}' --cluster site-a --node-name dtn02 --cluster-heartbeat-ms 300",
        root = root.display(),
        bin = tern_bin(),
        token = token.display(),
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c", &script]).stdin(Stdio::null());
    let o = run_bounded(cmd, Duration::from_secs(60));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "one line: {e}");
    assert!(e.contains("does not share node dtn01's file system") && e.contains("is missing there"), "{e}");
    wait_for(&url, &[("dtn01", "active"), ("dtn02", "left")]);
}
