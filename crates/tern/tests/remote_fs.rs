//! `tern ls`, `stat`, `mkdir`, `rm` on daemon and ssh endpoints, remote globs in `tern cp`, and
//! a daemon's confinement against a client that holds the token and asks for what lies outside
//! its root (issue 12). Real `tern serve` and a real sshd on loopback.

use crate::common;

use std::fs;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use tern_engine::net::control::{CtrlReader, CtrlWriter};
use tern_proto::{Control, FsOp};

/// `tern ARGS` with a time limit (no `--json` added: some of these print JSON lines).
fn run(args: &[&str]) -> Output {
    let mut cmd = Command::new(tern_bin());
    cmd.args(args).stdin(Stdio::null());
    run_bounded(cmd, Duration::from_secs(120))
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The `name` of each JSON line.
fn names(o: &Output) -> Vec<String> {
    text(o).lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["name"].as_str().unwrap().to_string()).collect()
}

/// Fails with exit 1 and one line naming `what`.
fn assert_fails(o: &Output, what: &str) {
    assert_eq!(o.status.code(), Some(1), "stdout {} stderr {}", text(o), err(o));
    let e = err(o);
    assert_eq!(e.trim_end().lines().count(), 1, "one line: {e}");
    assert!(e.contains(what), "{e} should name {what}");
}

fn sample(dir: &Path) {
    write_file(&dir.join("data/a.h5"), 1, 1000);
    write_file(&dir.join("data/b.h5"), 2, 2000);
    write_file(&dir.join("data/notes.txt"), 3, 10);
    write_file(&dir.join("data/.hidden.h5"), 4, 10);
    write_file(&dir.join("data/run_01/x"), 5, 10);
    write_file(&dir.join("data/run_02/y"), 6, 10);
    write_file(&dir.join("data/run_100/z"), 7, 10);
    symlink("a.h5", dir.join("data/link")).unwrap();
}

/// ls, stat, mkdir and rm against one endpoint prefix (`tern://h:p/` or `host:/abs/`), with
/// `extra` connection arguments; `local` is where that prefix lands on disk.
fn exercise(prefix: &str, extra: &[&str], local: &Path) {
    let at = |p: &str| format!("{prefix}{p}");
    let with = |args: &[&str]| -> Output {
        let mut v: Vec<&str> = args.to_vec();
        v.extend_from_slice(extra);
        run(&v)
    };
    let o = with(&["ls", "--json", &at("data")]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(names(&o), [".hidden.h5", "a.h5", "b.h5", "link", "notes.txt", "run_01", "run_02", "run_100"]);
    let first: serde_json::Value = serde_json::from_str(text(&o).lines().nth(1).unwrap()).unwrap();
    assert_eq!((first["type"].as_str(), first["size"].as_u64()), (Some("file"), Some(1000)));
    let o = with(&["ls", "-l", &at("data")]);
    assert!(o.status.success(), "{}", err(&o));
    let long = text(&o);
    assert!(long.lines().any(|l| l.starts_with("-rw") && l.contains(" 2000 ") && l.ends_with(" b.h5")), "{long}");
    assert!(long.lines().any(|l| l.starts_with("drwx") && l.ends_with(" run_01")), "{long}");
    assert!(long.lines().any(|l| l.starts_with("l") && l.ends_with(" link -> a.h5")), "{long}");
    let o = with(&["ls", "-R", &at("data")]);
    assert!(text(&o).lines().any(|l| l == "run_02/y"), "{}", text(&o));
    let o = with(&["stat", "--json", &at("data/link")]);
    let v: serde_json::Value = serde_json::from_str(text(&o).trim()).unwrap();
    assert_eq!((v["type"].as_str(), v["target"].as_str()), (Some("symlink"), Some("a.h5")), "the final link is not followed");
    let o = with(&["stat", &at("data/a.h5")]);
    assert!(text(&o).contains("Size: 1000"), "{}", text(&o));
    assert_fails(&with(&["stat", &at("data/nope")]), "data/nope");

    assert!(with(&["mkdir", &at("new")]).status.success());
    assert!(local.join("new").is_dir());
    assert_fails(&with(&["mkdir", &at("new")]), "new");
    assert!(with(&["mkdir", "-p", &at("new/a/b")]).status.success());
    assert!(with(&["mkdir", "-p", &at("new/a/b")]).status.success(), "-p: an existing directory is fine");
    assert!(local.join("new/a/b").is_dir());
    assert_fails(&with(&["mkdir", &at("nothere/x")]), "nothere/x");

    assert!(with(&["rm", &at("data/notes.txt")]).status.success());
    assert!(!local.join("data/notes.txt").exists());
    assert_fails(&with(&["rm", &at("data/notes.txt")]), "data/notes.txt");
    assert!(with(&["rm", "-f", &at("data/notes.txt")]).status.success());
    assert_fails(&with(&["rm", &at("new")]), "-r");
    assert!(local.join("new/a/b").is_dir());
    assert!(with(&["rm", "-r", &at("new")]).status.success());
    assert!(!local.join("new").exists());
    // Several at once, as rm does: a missing one is reported, the others still go.
    assert!(with(&["mkdir", &at("m1"), &at("m2")]).status.success());
    let o = with(&["rm", "-r", &at("m1"), &at("missing"), &at("m2")]);
    assert_fails(&o, "missing");
    assert!(!local.join("m1").exists() && !local.join("m2").exists());
    assert!(with(&["rm", &at("data/link")]).status.success());
    assert!(!local.join("data/link").exists() && local.join("data/a.h5").exists(), "the link went, not its target");
}

#[test]
fn ls_stat_mkdir_rm_on_a_daemon() {
    let t = scratch();
    let root = t.path().join("root");
    sample(&root);
    let d = Daemon::start(&root, &t.path().join("token"));
    exercise(&d.url("/"), &["--token-file", &d.token_arg()], &root);
    // Without the token: one line saying what to pass.
    let o = run(&["ls", &d.url("/data")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("--token-file"), "{}", err(&o));
    let o = run(&["ls", "tern://"]);
    assert_eq!(o.status.code(), Some(2), "a bad endpoint is a usage error");
}

#[test]
fn ls_stat_mkdir_rm_over_ssh() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let far = t.path().join("far");
    sample(&far);
    let ssh = sshd.ssh_cmd();
    exercise(&format!("127.0.0.1:{}/", far.display()), &["--ssh", &ssh], &far);
}

#[test]
fn local_paths_work_too() {
    let t = scratch();
    sample(t.path());
    exercise(&format!("{}/", t.path().display()), &[], t.path());
}

#[test]
fn remote_globs_expand_on_the_far_side() {
    let t = scratch();
    let root = t.path().join("root");
    sample(&root);
    write_file(&root.join("data/lit[1].dat"), 8, 10);
    let d = Daemon::start(&root, &t.path().join("token"));
    let tok = d.token_arg();
    let dst = t.path().join("h5");
    let o = run(&["cp", &d.url("/data/*.h5"), &format!("{}/", dst.display()), "--token-file", &tok]);
    assert!(o.status.success(), "{}", err(&o));
    let got: Vec<_> = fs::read_dir(&dst).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    assert_eq!(got, ["a.h5", "b.h5"], "hidden files and others are not matched");
    assert_eq!(fs::read(dst.join("b.h5")).unwrap(), data(2, 2000));
    let runs = t.path().join("runs");
    let o = run(&["cp", "-r", &d.url("/data/run_??"), runs.to_str().unwrap(), "--token-file", &tok]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(runs.join("run_01/x").exists() && runs.join("run_02/y").exists() && !runs.join("run_100").exists());
    // One match behaves as if it was typed: copied to the name given.
    let one = t.path().join("one.h5");
    let o = run(&["cp", &d.url("/data/a?h5"), one.to_str().unwrap(), "--token-file", &tok]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(fs::read(&one).unwrap(), data(1, 1000));
    // A name that only looks like a pattern, matching nothing as one, is taken as it is.
    let lit = t.path().join("lit");
    let o = run(&["cp", &d.url("/data/lit[1].dat"), lit.to_str().unwrap(), "--token-file", &tok]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(fs::read(&lit).unwrap(), data(8, 10));
    let o = run(&["cp", &d.url("/data/*.nc"), t.path().join("none").to_str().unwrap(), "--token-file", &tok]);
    assert_fails(&o, "/data/*.nc");
    assert!(err(&o).contains("no match"), "{}", err(&o));
    assert!(!t.path().join("none").exists());

    let Some(sshd) = require_sshd() else { return };
    let dst = t.path().join("ssh_h5");
    let o = run(&["cp", "--ssh", &sshd.ssh_cmd(), &format!("127.0.0.1:{}/data/[ab].h5", root.display()), &format!("{}/", dst.display())]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(dst.join("a.h5").exists() && dst.join("b.h5").exists() && !dst.join(".hidden.h5").exists());
    let o = run(&["cp", "--ssh", &sshd.ssh_cmd(), &format!("127.0.0.1:{}/data/*.zz", root.display()), dst.to_str().unwrap()]);
    assert_fails(&o, "*.zz");
}

/// A control connection that passed TLS, Hello and Auth with the daemon's token.
fn authenticated(d: &Daemon) -> (CtrlReader, CtrlWriter, TcpStream) {
    let sock = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    (&sock).write_all(b"C").unwrap();
    let (halves, exporter) = tern_engine::net::transport::tls_control_client(sock.try_clone().unwrap()).unwrap();
    let mut r = CtrlReader::new(halves.reader);
    let w = CtrlWriter::new(halves.writer);
    let key = tern_proto::auth::token_key(fs::read(&d.token).unwrap().trim_ascii());
    tern_engine::net::handshake::client(&mut r, &w, &key, &exporter, "the daemon", true, None).unwrap();
    (r, w, sock)
}

#[test]
fn a_client_with_the_token_cannot_reach_outside_the_daemon_root() {
    let t = scratch();
    let outside = t.path().join("outside");
    write_file(&outside.join("secret"), 9, 100);
    write_file(&outside.join("sub/deep"), 10, 100);
    let root = t.path().join("root");
    sample(&root);
    symlink(&outside, root.join("evil")).unwrap();
    symlink(&outside, root.join("data/evil2")).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let tok = d.token_arg();
    let tern = |args: &[&str]| {
        let mut v = args.to_vec();
        v.extend(["--token-file", tok.as_str()]);
        run(&v)
    };
    let before = snapshot(&outside);
    assert_fails(&tern(&["rm", "-r", &d.url("/../outside")]), "..");
    assert_fails(&tern(&["rm", "-r", &format!("tern://127.0.0.1:{}/data/../../outside", d.port)]), "..");
    assert_fails(&tern(&["rm", "-r", &d.url("/evil/sub")]), "evil/sub");
    assert_fails(&tern(&["rm", &d.url("/evil/secret")]), "evil/secret");
    assert_fails(&tern(&["mkdir", &d.url("/evil/new")]), "evil/new");
    assert_fails(&tern(&["mkdir", "-p", &d.url("/evil/a/b")]), "evil/a/b");
    for target in ["/evil", "/evil/", "/evil/sub", "/data/evil2"] {
        let o = tern(&["ls", "-R", &d.url(target)]);
        assert_fails(&o, target.trim_end_matches('/'));
        assert!(!text(&o).contains("secret") && !err(&o).contains("secret"), "{target}: {}", text(&o));
    }
    assert_fails(&tern(&["stat", &d.url("/evil/secret")]), "evil/secret");
    let o = tern(&["cp", &d.url("/evil/*"), t.path().join("stolen").to_str().unwrap()]);
    assert_fails(&o, "evil/*");
    assert!(!t.path().join("stolen").exists());
    // ls -R of the root lists the links as links and does not descend into them.
    let o = tern(&["ls", "-R", "--json", &d.url("/")]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(names(&o).iter().all(|n| !n.contains("secret") && !n.contains("deep")), "{:?}", names(&o));
    // The root itself is never removed, however it is spelled.
    for spelled in ["/", "", "/.", "//"] {
        assert_fails(&tern(&["rm", "-r", &format!("tern://127.0.0.1:{}{spelled}", d.port)]), "root");
    }
    assert!(root.join("data/a.h5").exists());
    // Removing the planted links removes the links only.
    assert!(tern(&["rm", "-r", &d.url("/evil")]).status.success());
    assert!(tern(&["rm", &d.url("/data/evil2")]).status.success());
    assert!(!root.join("evil").exists() && fs::symlink_metadata(root.join("data/evil2")).is_err());
    assert_eq!(snapshot(&outside), before, "nothing outside the root changed");

    // Oversized: refused by the client before sending, and by the daemon's decoder if sent.
    let long = format!("/{}", "a".repeat(5000));
    assert_fails(&tern(&["mkdir", &d.url(&long)]), "4096");
    let (mut r, w, _sock) = authenticated(&d);
    w.send(&Control::FsRequest { op: FsOp::Mkdir, flags: 0, path: long.into_bytes() }).unwrap();
    assert!(r.recv().is_err(), "the daemon drops a session with an oversized path");
    let (mut r, w, _sock) = authenticated(&d);
    w.send(&Control::FsRequest { op: FsOp::Glob, flags: 0, path: format!("/{}", "*/".repeat(2100)).into_bytes() }).unwrap();
    assert!(r.recv().is_err(), "and with an oversized pattern");
    assert!(fs::read_dir(&root).unwrap().all(|e| e.unwrap().file_name().len() < 100));
    // The daemon still serves.
    assert!(tern(&["ls", &d.url("/data")]).status.success());
}

#[test]
fn an_older_daemon_is_refused_with_one_line() {
    let t = scratch();
    let root = t.path().join("root");
    sample(&root);
    // Every feature bit but file-system requests: what an older build says in its Hello.
    let older = (1u64 | 2 | 4 | 8 | 16 | 32).to_string();
    let d = Daemon::start_on(&root, &t.path().join("token"), 0, &[("TERN_DEBUG_FEATURES", &older)]);
    let o = run(&["ls", &d.url("/data"), "--token-file", &d.token_arg()]);
    assert_fails(&o, "older tern");
    let o = run(&["cp", &d.url("/data/*.h5"), t.path().join("x").to_str().unwrap(), "--token-file", &d.token_arg()]);
    assert_fails(&o, "older tern");
}

/// A glob on the source daemon of a daemon-to-daemon copy is expanded there, then the matches
/// go straight from daemon to daemon as any third-party copy.
#[test]
fn a_glob_on_the_source_daemon_of_a_third_party_copy() {
    let t = scratch();
    let (a_root, b_root) = (t.path().join("a"), t.path().join("b"));
    sample(&a_root);
    fs::create_dir(&b_root).unwrap();
    let token = t.path().join("token");
    let a = Daemon::start_with(&a_root, &token, 0, &[], &["--dial-allow", "127.0.0.1"]);
    let b = Daemon::start(&b_root, &token);
    let o = run(&["cp", &a.url("/data/*.h5"), &b.url("/h5/"), "--token-file", &a.token_arg()]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(fs::read(b_root.join("h5/a.h5")).unwrap(), data(1, 1000));
    assert_eq!(fs::read(b_root.join("h5/b.h5")).unwrap(), data(2, 2000));
    assert_eq!(fs::read_dir(b_root.join("h5")).unwrap().count(), 2);
}

/// A daemon with several roots lists them as its `/`; each is a root (never removed).
#[test]
fn a_daemon_with_several_roots_lists_them() {
    let t = scratch();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    sample(&a);
    fs::create_dir(&b).unwrap();
    let spec = format!("alpha={}", a.display());
    let d = Daemon::start_with(Path::new(&spec), &t.path().join("token"), 0, &[], &["--root", &format!("beta={}", b.display())]);
    let tok = d.token_arg();
    let o = run(&["ls", "--json", &d.url("/"), "--token-file", &tok]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(names(&o), ["alpha", "beta"]);
    let o = run(&["ls", &d.url("/alpha/data"), "--token-file", &tok]);
    assert!(text(&o).lines().any(|l| l == "a.h5"), "{}", text(&o));
    assert_fails(&run(&["rm", "-r", &d.url("/beta"), "--token-file", &tok]), "root");
    assert_fails(&run(&["ls", &d.url("/gamma"), "--token-file", &tok]), "no such root");
    assert!(run(&["mkdir", &d.url("/beta/x"), "--token-file", &tok]).status.success());
    assert!(b.join("x").is_dir() && a.join("data").is_dir());
}
