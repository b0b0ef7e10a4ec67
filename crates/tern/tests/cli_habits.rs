//! What scp, rsync and cp users type by habit: their flags, their endpoint forms, their
//! behaviour on a missing source or a copy into itself; completions and the man page.

use crate::common;
use common::*;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn small_tree(root: &Path) {
    write_file(&root.join("a.dat"), 1, 1000);
    write_file(&root.join("sub/b.dat"), 2, 70_000);
    write_file(&root.join("sub/deeper/c.dat"), 3, 5);
}

/// A stand-in for ssh that records its arguments (one invocation a line) and fails.
fn fake_ssh(dir: &Path) -> (String, std::path::PathBuf) {
    let log = dir.join("ssh-args.log");
    let script = dir.join("fake-ssh");
    fs::write(&script, format!("#!/bin/sh\necho \"$@\" >> '{}'\necho 'fake-ssh: no such host' >&2\nexit 1\n", log.display())).unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    (script.display().to_string(), log)
}

fn tern_plain(args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(tern_bin());
    cmd.args(args).stdin(std::process::Stdio::null());
    run_bounded(cmd, Duration::from_secs(60))
}

#[test]
fn rsync_and_scp_flags_are_accepted() {
    let t = scratch();
    let src = t.path().join("src");
    small_tree(&src);
    // rsync -avz: archive (recursive), verbose, compress (ignored with one note).
    let dst = t.path().join("avz");
    let r = tern(&["cp", "-avz", s(&src), s(&dst)], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &dst);
    let notes: Vec<_> = r.stderr().lines().filter(|l| l.contains("-z")).map(str::to_string).collect();
    assert_eq!(notes.len(), 1, "{}", r.stderr());
    assert!(notes[0].contains("-z ignored") && notes[0].contains("does not compress"), "{}", notes[0]);
    // scp -rp, cp -a, rsync -P / --progress / --partial / --archive / --compress.
    for (i, flags) in [&["-rp"][..], &["-a"], &["-av"], &["-rP"], &["-r", "--progress", "--partial"], &["--archive", "--compress", "-q"]].iter().enumerate() {
        let dst = t.path().join(format!("d{i}"));
        let mut args = vec!["cp"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&[s(&src), s(&dst)]);
        let r = tern(&args, &[]);
        assert!(r.ok(), "{flags:?}: {}", r.stderr());
        assert_same_tree(&src, &dst);
        if flags.contains(&"-q") {
            assert!(!r.stderr().contains("-z ignored"), "-q keeps the -z note quiet: {}", r.stderr());
        }
    }
    // rsync -avP and -rv for sync too.
    for (i, flags) in ["-avP", "-rv"].iter().enumerate() {
        let dst = t.path().join(format!("synced{i}"));
        let r = tern(&["sync", flags, &format!("{}/", s(&src)), s(&dst)], &[]);
        assert!(r.ok(), "{flags}: {}", r.stderr());
        assert_same_tree(&src, &dst);
    }
    // The compatibility no-ops stay out of --help; -a and -e are documented.
    let help = String::from_utf8(tern_plain(&["cp", "--help"]).stdout).unwrap();
    assert!(help.contains("--archive") && help.contains("--rsh") && help.contains("-e, --ssh"), "{help}");
    assert!(!help.contains("--partial") && !help.contains("--compress") && !help.contains("  --progress "), "{help}");
}

/// rsync -v lists each file it sends; so does tern (on stdout, or on stderr beside --json), and
/// -q prints nothing at all when everything landed.
#[test]
fn verbose_lists_files_and_quiet_prints_nothing() {
    let t = scratch();
    let src = t.path().join("src");
    small_tree(&src);
    let out = tern_plain(&["cp", "-av", s(&src), s(&t.path().join("d1"))]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut listed: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect();
    listed.sort();
    assert_eq!(listed, ["src/a.dat", "src/sub/b.dat", "src/sub/deeper/c.dat"]);
    // Identical files are not sent, so not listed (rsync -v the same).
    let out = tern_plain(&["sync", "-v", s(&src), s(&t.path().join("d1"))]);
    assert!(out.status.success() && out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    let out = tern_plain(&["cp", "-rv", "--json", s(&src), s(&t.path().join("d2"))]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout stays one JSON object with -v");
    assert_eq!((v["type"].as_str(), v["files"].as_u64()), (Some("summary"), Some(3)));
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.starts_with("src/")).count(), 3);
    let out = tern_plain(&["cp", "-rq", s(&src), s(&t.path().join("d3"))]);
    assert!(out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    assert_same_tree(&src, &t.path().join("d3"));
}

/// `tern doctor` judges this host for a path and names the fix of each finding (issue 15).
#[test]
fn doctor_reports_findings_with_fixes() {
    let out = tern_plain(&["doctor", "--json", "--rtt-ms", "68", "--rate-gbps", "100", "/"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let findings = v["findings"].as_array().unwrap();
    let checks: Vec<&str> = findings.iter().map(|f| f["check"].as_str().unwrap()).collect();
    for c in ["socket buffers", "congestion control", "descriptor limit", "file system"] {
        assert!(checks.contains(&c), "{c} missing: {checks:?}");
    }
    // 100 Gb/s × 68 ms needs 850 MB of buffer; no test host has that.
    let buffers = &findings[0];
    assert_eq!((buffers["level"].as_str(), buffers["needs_root"].as_bool()), (Some("warn"), Some(true)), "{buffers}");
    assert!(buffers["fix"].as_str().unwrap().starts_with("sysctl -w net.ipv4.tcp_rmem="));
    let text = tern_plain(&["doctor"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("socket buffers"));
}

#[test]
fn scp_dash_capital_p_port_is_explained_not_copied() {
    let t = scratch();
    let (ssh, log) = fake_ssh(t.path());
    let src = t.path().join("f");
    write_file(&src, 1, 10);
    let r = tern(&["cp", "-e", &ssh, "-P", "2222", s(&src), "h:/x"], &[]);
    assert_eq!(r.out.status.code(), Some(2), "{}", r.stderr());
    let e = r.stderr();
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("'2222'") && e.contains("scp://[user@]host:2222/path") && e.contains("ssh -p 2222"), "{e}");
    assert!(!log.exists(), "nothing was started");
}

#[test]
fn dash_e_and_rsh_are_the_ssh_command() {
    let t = scratch();
    let (ssh, log) = fake_ssh(t.path());
    let src = t.path().join("f");
    write_file(&src, 1, 10);
    for flag in ["-e", "--rsh"] {
        let _ = fs::remove_file(&log);
        let r = tern(&["cp", flag, &format!("{ssh} -oFoo=bar"), "--no-ssh-reuse", "--retry-for", "0", s(&src), "somehost:/x"], &[]);
        assert!(!r.ok());
        let args = fs::read_to_string(&log).unwrap_or_else(|_| panic!("{flag}: the given command was not run: {}", r.stderr()));
        assert!(args.contains("-oFoo=bar") && args.contains("somehost"), "{flag}: {args}");
    }
}

#[test]
fn completions_and_man_page() {
    let out = tern_plain(&["completions", "bash"]);
    assert!(out.status.success());
    let bash = String::from_utf8(out.stdout).unwrap();
    assert!(bash.contains("tern") && bash.contains("cp") && bash.contains("--recursive"), "{bash}");
    for shell in ["zsh", "fish"] {
        let out = tern_plain(&["completions", shell]);
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    assert!(!tern_plain(&["completions", "tcsh-ish"]).status.success());
    let out = tern_plain(&["man"]);
    assert!(out.status.success());
    let man = String::from_utf8(out.stdout).unwrap();
    assert!(man.contains(".TH") && man.contains("tern"), "{man}");
    let out = tern_plain(&["man", "cp"]);
    assert!(out.status.success());
    let man = String::from_utf8(out.stdout).unwrap();
    assert!(man.contains(".TH tern-cp") && man.contains("archive") && man.contains("recursive"), "{man}");
    let out = tern_plain(&["man", "nonesuch"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such command"));
}

#[test]
fn urls_tern_does_not_speak_are_refused_at_once() {
    let t = scratch();
    let (ssh, log) = fake_ssh(t.path());
    let src = t.path().join("f");
    write_file(&src, 1, 10);
    for (args, side, scheme) in [
        (vec![s(&src), "http://example.org/x"], "destination:", "http://"),
        (vec![s(&src), "sftp://u@h/x"], "destination:", "sftp://"),
        (vec!["s3://bucket/key", "out"], "source:", "s3://"),
        (vec![s(&src), "tern:/x"], "destination:", "tern://"),
    ] {
        let mut a = vec!["cp", "-e", &ssh, "--no-ssh-reuse"];
        a.extend(args);
        let r = tern(&a, &[]);
        assert_eq!(r.out.status.code(), Some(2), "{a:?}: {}", r.stderr());
        let e = r.stderr();
        assert_eq!(e.lines().count(), 1, "one line: {e}");
        assert!(e.starts_with(&format!("tern: {side}")) && e.contains(scheme) && e.contains("[user@]host:path") && e.contains("scp://"), "{e}");
        assert!(!log.exists(), "{a:?} was tried as an ssh host: {}", fs::read_to_string(&log).unwrap_or_default());
    }
}

#[test]
fn ssh_urls_pass_their_port_and_bracketed_ipv6_its_host() {
    let t = scratch();
    let (ssh, log) = fake_ssh(t.path());
    let src = t.path().join("f");
    write_file(&src, 1, 10);
    for (dst, want) in [
        ("scp://alice@dtn.example:2222//data/x", "-p 2222 -- alice@dtn.example"),
        ("ssh://dtn.example:2200/x", "-p 2200 -- dtn.example"),
        ("alice@[::1]:x", "-- alice@::1"),
        ("[fe80::1]:x", "-- fe80::1"),
    ] {
        let _ = fs::remove_file(&log);
        let r = tern(&["cp", "-e", &ssh, "--no-ssh-reuse", "--retry-for", "0", s(&src), dst], &[]);
        assert!(!r.ok());
        let args = fs::read_to_string(&log).unwrap_or_else(|_| panic!("{dst}: ssh not run: {}", r.stderr()));
        assert!(args.contains(want), "{dst}: ssh got {args}");
    }
}

#[test]
fn scp_url_with_a_port_copies_over_real_ssh() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let src = t.path().join("src");
    small_tree(&src);
    let dst = t.path().join("dst");
    // The port is in the URL only: the ssh command has none.
    let ssh = format!("ssh -i {}/userkey -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ControlPath=none", sshd.dir.path().display());
    let url = format!("scp://root@127.0.0.1:{}/{}", sshd.port, dst.display());
    let r = tern(&["cp", "-r", "-e", &ssh, s(&src), &url], &[]);
    assert!(r.ok(), "{url}: {}", r.stderr());
    assert_same_tree(&src, &dst);
}

#[test]
fn local_paths_with_colons_stay_local() {
    let t = scratch();
    let dir = t.path().join("w");
    write_file(&dir.join("a:b"), 7, 100);
    write_file(&dir.join("sub/c:d"), 8, 100);
    for (from, to) in [("./a:b", "./x:y"), ("sub/c:d", "sub/e:f")] {
        let mut cmd = Command::new(tern_bin());
        cmd.current_dir(&dir).args(["cp", "--no-ssh-reuse", from, to]).env("TERN_SSH", "/bin/false");
        let out = run_bounded(cmd, Duration::from_secs(60));
        assert!(out.status.success(), "{from}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(fs::read(dir.join(from)).unwrap(), fs::read(dir.join(to)).unwrap());
    }
}

/// Runs tern (with --json) in `dir`, as a user types relative paths.
fn tern_in(dir: &Path, args: &[&str]) -> Run {
    let mut cmd = Command::new(tern_bin());
    cmd.current_dir(dir).args(args).arg("--json").stdin(std::process::Stdio::null());
    let out = run_bounded(cmd, Duration::from_secs(120));
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    Run { out, json }
}

#[test]
fn a_missing_source_is_reported_and_the_rest_copied() {
    let t = scratch();
    let w = t.path();
    write_file(&w.join("a"), 1, 1000);
    write_file(&w.join("b"), 2, 2000);
    write_file(&w.join("d/inner"), 3, 30);
    fs::create_dir(w.join("dir")).unwrap();
    // Into an existing directory.
    let r = tern_in(w, &["cp", "a", "missing", "b", "dir/"]);
    assert_eq!(r.out.status.code(), Some(1), "{}", r.stderr());
    let e = r.stderr();
    assert_eq!(e.lines().count(), 1, "one line: {e}");
    assert!(e.starts_with("tern: source: missing: No such file or directory"), "{e}");
    assert_eq!(fs::read(w.join("dir/a")).unwrap(), fs::read(w.join("a")).unwrap());
    assert_eq!(fs::read(w.join("dir/b")).unwrap(), fs::read(w.join("b")).unwrap());
    assert_eq!(r.json["ok"], false);
    assert_eq!(r.json["errors"][0]["side"], "source");
    assert_eq!(r.u64("files"), 2);
    // One source left: DST is still the directory several sources make, not a renamed copy.
    let r = tern_in(w, &["cp", "a", "missing", "newdir"]);
    assert_eq!(r.out.status.code(), Some(1), "{}", r.stderr());
    assert_eq!(fs::read(w.join("newdir/a")).unwrap(), fs::read(w.join("a")).unwrap());
    // A directory without -r is skipped the same way (cp: "omitting directory").
    let r = tern_in(w, &["cp", "a", "d", "b", "flat"]);
    assert_eq!(r.out.status.code(), Some(1), "{}", r.stderr());
    assert!(r.stderr().contains("source: d: is a directory") && r.stderr().contains("-r"), "{}", r.stderr());
    assert!(w.join("flat/a").is_file() && w.join("flat/b").is_file() && !w.join("flat/d").exists());
    // Nothing usable: refused as before, nothing created.
    let r = tern_in(w, &["cp", "m1", "m2", "none"]);
    assert!(!r.ok());
    assert!(r.stderr().contains("m1") && r.stderr().contains("No such file"), "{}", r.stderr());
    assert!(!w.join("none").exists());
}

#[test]
fn a_directory_is_not_copied_into_itself() {
    let t = scratch();
    let w = t.path();
    small_tree(&w.join("src"));
    let before = snapshot(&w.join("src"));
    for (args, want) in [
        (&["cp", "-r", "src", "src"][..], "cannot copy a directory, 'src', into itself, 'src/src'"),
        (&["cp", "-r", "src", "src/sub"], "cannot copy a directory, 'src', into itself, 'src/sub/src'"),
        (&["cp", "-r", "src", "src/new"], "cannot copy a directory, 'src', into itself, 'src/new'"),
        (&["cp", "-r", "src/.", "src/sub/deeper"], "into itself, 'src/sub/deeper'"),
        (&["cp", "-a", "a.dat", "src", "src/sub"], "cannot copy a directory, 'src', into itself, 'src/sub/src'"),
        (&["sync", "src", "src/sub"], "into itself, 'src/sub'"),
        (&["cp", "-r", "src", "."], "'src' and './src' are the same directory"),
        (&["cp", "src/a.dat", "src/a.dat"], "are the same file"),
    ] {
        if args.contains(&"a.dat") {
            write_file(&w.join("a.dat"), 9, 10);
        }
        let r = tern_in(w, args);
        assert_eq!(r.out.status.code(), Some(2), "{args:?}: {}", r.stderr());
        let e = r.stderr();
        assert_eq!(e.lines().count(), 1, "{args:?}: one line: {e}");
        assert!(e.starts_with("tern: destination: ") && e.contains(want), "{args:?}: {e}");
        assert_eq!(snapshot(&w.join("src")), before, "{args:?} changed the source");
    }
    // Through a symlink to the source: still into itself.
    std::os::unix::fs::symlink("src", w.join("alias")).unwrap();
    let r = tern_in(w, &["cp", "-r", "src", "alias/sub"]);
    assert_eq!(r.out.status.code(), Some(2), "{}", r.stderr());
    assert!(r.stderr().contains("into itself, 'alias/sub/src'"), "{}", r.stderr());
    assert_eq!(snapshot(&w.join("src")), before);
    // Into a destination that is itself a link into the source.
    std::os::unix::fs::symlink("src/sub", w.join("sublink")).unwrap();
    let r = tern_in(w, &["cp", "-r", "src", "sublink"]);
    assert_eq!(r.out.status.code(), Some(2), "{}", r.stderr());
    assert!(r.stderr().contains("into itself, 'sublink/src'"), "{}", r.stderr());
    assert_eq!(snapshot(&w.join("src")), before);
    // Next to the source is fine, and so is a name that merely starts like it.
    let r = tern_in(w, &["cp", "-r", "src", "src-copy"]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&w.join("src"), &w.join("src-copy"));
}

/// `cp FILE DIR/new/`: the trailing slash names a directory, so it is made and the file goes in
/// (as rsync does), never a file named `new`.
#[test]
fn a_trailing_slash_on_a_new_destination_makes_a_directory() {
    let t = scratch();
    write_file(&t.path().join("f"), 3, 5000);
    let dst = format!("{}/new/", t.path().display());
    let r = tern(&["cp", t.path().join("f").to_str().unwrap(), &dst], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(fs::read(t.path().join("new/f")).unwrap(), data(3, 5000));
}

/// A name holding terminal escapes (from the far side, or a tree someone else made) is shown
/// escaped in the error lines: it must not clear the screen or overwrite an earlier line.
#[test]
fn control_characters_in_names_are_escaped_in_messages() {
    let t = scratch();
    let src = t.path().join("src");
    write_file(&src.join("ok"), 1, 10);
    assert!(std::process::Command::new("mkfifo").arg(src.join("x\x1b[2J\rfake")).status().unwrap().success());
    let r = tern(&["cp", "-r", src.to_str().unwrap(), t.path().join("dst").to_str().unwrap()], &[]);
    assert!(!r.ok());
    let err = r.stderr();
    assert!(!err.contains('\x1b') && !err.contains('\r'), "raw control characters reached the terminal: {err:?}");
    assert!(err.contains("x\\x1b[2J\\rfake"), "{err}");
}

/// `cp -c` (rsync's --checksum): a destination file of the same size and mtime but other
/// content is replaced; without it, it is taken as already copied (what a re-run relies on).
#[test]
fn cp_checksum_replaces_a_same_size_same_mtime_file_with_other_content() {
    let t = scratch();
    write_file(&t.path().join("f"), 1, 4096);
    write_file(&t.path().join("g"), 2, 4096);
    let mtime = fs::metadata(t.path().join("f")).unwrap().modified().unwrap();
    fs::File::options().write(true).open(t.path().join("g")).unwrap().set_modified(mtime).unwrap();
    let (f, g) = (t.path().join("f"), t.path().join("g"));
    let r = tern(&["cp", f.to_str().unwrap(), g.to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(fs::read(&g).unwrap(), data(2, 4096), "size and mtime alone: taken as copied");
    let r = tern(&["cp", "-c", f.to_str().unwrap(), g.to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(fs::read(&g).unwrap(), data(1, 4096), "--checksum compares content");
}
