//! Real transfers through every kind of endpoint, checked byte for byte with SHA-256.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

use crate::common;
use common::*;

use std::fs;
use std::process::Command;

#[test]
fn local_tree_copies_exactly() {
    let t = scratch();
    let src = t.path().join("src");
    petascale_tree(&src);
    let dst = t.path().join("dst");
    let r = tern(&["cp", "-r", src.to_str().unwrap(), dst.to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &dst);
    assert_no_leftovers(&dst);
    // Holes stay holes: the 8 MiB sparse file uses about 2 MiB of blocks.
    let blocks = std::os::unix::fs::MetadataExt::blocks(&fs::metadata(dst.join("d2/sparse.img")).unwrap());
    assert!(blocks * 512 < 4 << 20, "sparse file was filled in: {} bytes allocated", blocks * 512);
}

#[test]
fn daemon_tree_push_and_pull() {
    let t = scratch();
    let src = t.path().join("src");
    petascale_tree(&src);
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let r = tern(&["cp", "-r", src.to_str().unwrap(), &d.url("/copy"), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &root.join("copy"));
    let back = t.path().join("back");
    let r = tern(&["cp", "-r", &d.url("/copy"), back.to_str().unwrap(), "--token-file", &d.token_arg(), "--no-encrypt"], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &back);
    assert_eq!(r.u64("files"), snapshot(&src).values().filter(|v| v.starts_with("file")).count() as u64);
}

#[test]
fn ssh_tree_push_and_pull() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let src = t.path().join("src");
    petascale_tree(&src);
    let dst = t.path().join("dst");
    let ssh = sshd.ssh_cmd();
    let r = tern(&["cp", "-r", "--ssh", &ssh, src.to_str().unwrap(), &format!("root@127.0.0.1:{}", dst.display())], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &dst);
    let back = t.path().join("back");
    let r = tern(&["cp", "-r", "--ssh", &ssh, &format!("127.0.0.1:{}", dst.display()), back.to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &back);
}

#[test]
fn one_gib_file_through_daemon() {
    let t = scratch();
    let src = t.path().join("big.bin");
    {
        // 1 GiB written in 64 MiB pieces of distinct data.
        let f = fs::File::create(&src).unwrap();
        for i in 0..16u64 {
            std::os::unix::fs::FileExt::write_all_at(&f, &data(100 + i, 64 << 20), i * (64 << 20)).unwrap();
        }
    }
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let r = tern(&["cp", src.to_str().unwrap(), &d.url("/big.bin"), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(r.u64("bytes"), 1 << 30);
    assert_eq!(snapshot(t.path()).get(&b"big.bin"[..]), snapshot(&root).get(&b"big.bin"[..]));
}

#[test]
fn ten_thousand_tiny_files_over_ssh() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let src = t.path().join("tiny");
    for i in 0..10_000u64 {
        let dir = src.join(format!("g{:02}", i % 50));
        if i < 50 {
            fs::create_dir_all(&dir).unwrap();
        }
        fs::write(dir.join(format!("f{i}")), data(i, (i % 64) as usize + 1)).unwrap();
    }
    let dst = t.path().join("dst");
    let r = tern(&["cp", "-r", "--ssh", &sshd.ssh_cmd(), src.to_str().unwrap(), &format!("127.0.0.1:{}", dst.display())], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(r.u64("files"), 10_000);
    assert_same_tree(&src, &dst);
}

#[test]
fn cp_naming_rules_and_resume_place() {
    let t = scratch();
    let src = t.path().join("src");
    write_file(&src.join("a/f"), 1, 10);
    let s = src.to_str().unwrap();
    // dst missing: dst is the copy.
    let dst = t.path().join("dst");
    assert!(tern(&["cp", "-r", s, dst.to_str().unwrap()], &[]).ok());
    assert!(dst.join("a/f").is_file());
    // dst exists: dst/src.
    assert!(tern(&["cp", "-r", s, dst.to_str().unwrap()], &[]).ok());
    assert!(dst.join("src/a/f").is_file());
    // src/. copies the contents.
    let c = t.path().join("contents");
    assert!(tern(&["cp", "-r", &format!("{s}/."), c.to_str().unwrap()], &[]).ok());
    assert!(c.join("a/f").is_file());
    // A single file onto a new name, and into a directory.
    assert!(tern(&["cp", src.join("a/f").to_str().unwrap(), t.path().join("g").to_str().unwrap()], &[]).ok());
    assert_eq!(fs::read(t.path().join("g")).unwrap(), data(1, 10));
    assert!(tern(&["cp", src.join("a/f").to_str().unwrap(), c.to_str().unwrap()], &[]).ok());
    assert!(c.join("f").is_file());
}

#[test]
fn sync_skips_identical_deletes_extras_and_dry_runs() {
    let t = scratch();
    let src = t.path().join("src");
    write_file(&src.join("keep"), 1, 1000);
    write_file(&src.join("change"), 2, 1000);
    let dst = t.path().join("dst");
    let (s, d) = (src.to_str().unwrap(), dst.to_str().unwrap());
    assert!(tern(&["sync", s, d], &[]).ok());
    assert_same_tree(&src, &dst);
    // Nothing changed: nothing sent.
    let r = tern(&["sync", s, d], &[]);
    assert_eq!((r.u64("bytes"), r.u64("files_skipped")), (0, 2));
    // One file changed, one extra at the destination.
    write_file(&src.join("change"), 3, 1000);
    write_file(&dst.join("extra/old"), 4, 10);
    let dry = tern(&["sync", "--delete", "--dry-run", s, d], &[]);
    assert!(dry.ok(), "{}", dry.stderr());
    let plan: Vec<String> = dry.json["plan"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    assert!(plan.contains(&"copy change".to_string()) && plan.contains(&"skip keep".to_string()) && plan.contains(&"delete extra".to_string()), "{plan:?}");
    assert!(dst.join("extra/old").exists(), "dry run changed nothing");
    let r = tern(&["sync", "--delete", s, d], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!((r.u64("files"), r.u64("deleted")), (1, 1));
    assert_same_tree(&src, &dst);
    // --checksum notices a change that kept size and mtime.
    let mtime = fs::metadata(dst.join("keep")).unwrap().modified().unwrap();
    let mut bytes = fs::read(dst.join("keep")).unwrap();
    bytes[0] ^= 1;
    fs::write(dst.join("keep"), bytes).unwrap();
    fs::File::options().write(true).open(dst.join("keep")).unwrap().set_modified(mtime).unwrap();
    assert_eq!(tern(&["sync", s, d], &[]).u64("files"), 0, "size+mtime cannot see it");
    let r = tern(&["sync", "--checksum", s, d], &[]);
    assert_eq!(r.u64("files"), 1);
    assert_same_tree(&src, &dst);
}

#[test]
fn reverse_mode_connects_back_both_ways() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let src = t.path().join("src");
    petascale_tree(&src);
    let dst = t.path().join("dst");
    let ssh = sshd.ssh_cmd();
    let r = tern(&["cp", "-r", "--reverse", "--ssh", &ssh, src.to_str().unwrap(), &format!("127.0.0.1:{}", dst.display())], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &dst);
    let back = t.path().join("back");
    let r = tern(&["cp", "-r", "--reverse", "--no-encrypt", "--ssh", &ssh, &format!("127.0.0.1:{}", dst.display()), back.to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &back);
}

/// ssh mode: the remote announces its data port with its Hello (`Listening`) and the data
/// streams connect while the control channel authenticates, with and without `--streams`
/// (which pipelines Hello and Auth), pushing and pulling. A peer from before `Listening`
/// (feature bit cleared on either side) falls back to connecting after `Ready`.
#[test]
fn ssh_early_data_address_and_fallback() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let src = t.path().join("src");
    write_file(&src.join("a/big"), 11, 9 << 20);
    write_file(&src.join("b"), 12, 1000);
    let ssh = sshd.ssh_cmd();
    // An older peer: every feature of this build but the early data address.
    use tern_proto::msg::{FEATURE_FILE_LIST, FEATURE_FILTERS, FEATURE_IGNORE_EXISTING, FEATURE_THIRD_PARTY};
    let older = (FEATURE_THIRD_PARTY | FEATURE_FILTERS | FEATURE_FILE_LIST | FEATURE_IGNORE_EXISTING).to_string();
    let old_remote = format!("env TERN_DEBUG_FEATURES={older} tern");
    let old_remote = old_remote.as_str();
    let old_client = [("TERN_DEBUG_FEATURES", older.as_str())];
    // (name, extra flags, client environment, whether the early address is used)
    type Case<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)], bool);
    let cases: [Case; 5] = [
        ("new", &[], &[], true),
        ("pipelined", &["--streams", "3"], &[], true),
        ("old-client", &[], &old_client, false),
        ("old-server", &["--remote-bin", old_remote], &[], false),
        ("old-server-pipelined", &["--streams", "3", "--remote-bin", old_remote], &[], false),
    ];
    for (name, extra, env, early) in cases {
        for pull in [false, true] {
            let there = t.path().join(format!("there-{name}-{pull}"));
            let back = t.path().join(format!("back-{name}"));
            let remote = format!("127.0.0.1:{}", there.display());
            let (from, to) = if pull { (remote.as_str(), back.to_str().unwrap()) } else { (src.to_str().unwrap(), remote.as_str()) };
            if pull {
                // Pull what the push of the same case wrote.
                fs::rename(t.path().join(format!("there-{name}-false")), &there).unwrap();
            }
            let mut args = vec!["cp", "-r", "-vv", "--ssh", &ssh];
            args.extend_from_slice(extra);
            args.extend([from, to]);
            let r = tern(&args, env);
            let log = r.stderr();
            assert!(r.ok(), "{name} (pull: {pull}): {log}");
            assert_eq!(log.contains("data address announced early"), early, "{name} (pull: {pull}): {log}");
            // Early streams are used, not opened again; without them all are opened after Ready.
            assert_eq!(log.contains(" 0 to open"), early, "{name} (pull: {pull}): {log}");
            assert_same_tree(&src, if pull { &back } else { &there });
        }
    }
}

#[test]
fn ipv6_daemon() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("SKIP: no IPv6 loopback here");
        return;
    }
    let t = scratch();
    let src = t.path().join("src");
    write_file(&src.join("a/b"), 7, 300_000);
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let port = free_port();
    let token = t.path().join("token");
    let mut child = std::process::Command::new(tern_bin())
        .args(["serve", "--listen", &format!("[::1]:{port}"), "--root"])
        .arg(&root)
        .arg("--token-file")
        .arg(&token)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect(("::1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let r = tern(&["cp", "-r", src.to_str().unwrap(), &format!("tern://[::1]:{port}/copy"), "--token-file", token.to_str().unwrap()], &[]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &root.join("copy"));
}

#[test]
fn big_manifest_batches_through_daemon_tls() {
    // 600 entries with long names: one Entries message is far larger than rustls' 16 KiB
    // received-plaintext buffer, which the split TLS reader must drain as it goes.
    let t = scratch();
    let src = t.path().join("src");
    let long = "x".repeat(180);
    for i in 0..600u64 {
        write_file(&src.join(format!("dir-with-a-long-name-{}/{long}-{i:04}", i % 3)), i, 16);
    }
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let r = tern(&["cp", "-r", "--retry-for", "0", src.to_str().unwrap(), &d.url("/copy"), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &root.join("copy"));
    let back = t.path().join("back");
    let r = tern(&["cp", "-r", "--retry-for", "0", &d.url("/copy"), back.to_str().unwrap(), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &back);
}

/// Client connections to `port` in state established (from `ss`).
fn established_to(port: u16) -> usize {
    let out = std::process::Command::new("ss").args(["-Htn", "state", "established", &format!("( dport = :{port} )")]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[test]
fn ssh_sessions_share_one_connection_unless_told_not_to() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let src = t.path().join("a.bin");
    write_file(&src, 1, 100_000);
    let ssh = sshd.ssh_cmd_reusable();
    let control = t.path().join("cm");
    let env = [("TERN_SSH_CONTROL_DIR", control.to_str().unwrap())];
    let mut times = Vec::new();
    for i in 0..3 {
        let started = std::time::Instant::now();
        let r = tern(&["cp", "--ssh", &ssh, src.to_str().unwrap(), &format!("127.0.0.1:{}/copy{i}", t.path().display())], &env);
        times.push(started.elapsed());
        assert!(r.ok(), "{}", r.stderr());
        assert_eq!(fs::read(&src).unwrap(), fs::read(t.path().join(format!("copy{i}"))).unwrap());
    }
    let sockets = fs::read_dir(&control).unwrap().count();
    let shared = established_to(sshd.port);
    // The master is ours (started by the first copy): end it before asserting.
    let mut exit = std::process::Command::new("ssh");
    exit.args(ssh.split_whitespace().skip(1)).arg(format!("-oControlPath={}/%C", control.display())).args(["-O", "exit", "127.0.0.1"]);
    let _ = exit.output();
    eprintln!("measured: ssh copies of 100 kB with connection reuse: {times:?}");
    assert_eq!(sockets, 1, "one control socket for the host");
    assert_eq!(shared, 1, "three copies, one ssh connection left open for the next");
    // --no-ssh-reuse: a fresh login each time, nothing left behind.
    let fresh = t.path().join("cm-fresh");
    let r = tern(&["cp", "--no-ssh-reuse", "--ssh", &ssh, src.to_str().unwrap(), &format!("127.0.0.1:{}/copy9", t.path().display())], &[("TERN_SSH_CONTROL_DIR", fresh.to_str().unwrap())]);
    assert!(r.ok(), "{}", r.stderr());
    assert!(!fresh.exists() || fs::read_dir(&fresh).unwrap().count() == 0);
    assert_eq!(established_to(sshd.port), 0);
}

/// `sync --delete` from an empty source: refused in one line with nothing deleted (usually an
/// unmounted file system or a typo), emptied with `--delete-empty-source` (rsync's answer).
#[test]
fn delete_from_an_empty_source_needs_its_own_flag() {
    let t = scratch();
    let empty = t.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let root = t.path().join("root");
    let d = Daemon::start(
        &{
            fs::create_dir(&root).unwrap();
            root.clone()
        },
        &t.path().join("token"),
    );
    for (dst, url) in [(t.path().join("local"), None), (root.join("remote"), Some(d.url("remote/")))] {
        write_file(&dst.join("a"), 1, 100);
        write_file(&dst.join("sub/b"), 2, 100);
        let target = url.clone().unwrap_or_else(|| format!("{}/", dst.display()));
        let mut args = vec!["sync", "--delete", &format!("{}/", empty.display())].into_iter().map(String::from).collect::<Vec<_>>();
        args.push(target.clone());
        args.extend(["--token-file".into(), d.token_arg()]);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = tern(&argv, &[]);
        assert!(!r.ok(), "{target}: an empty source emptied the destination silently");
        assert!(r.stderr().contains("the source is empty") && r.stderr().contains("--delete-empty-source"), "{}", r.stderr());
        assert!(dst.join("a").exists() && dst.join("sub/b").exists(), "{target}: deleted");
        let mut argv = argv.clone();
        argv.push("--delete-empty-source");
        let r = tern(&argv, &[]);
        assert!(r.ok(), "{}", r.stderr());
        assert_eq!(fs::read_dir(&dst).unwrap().count(), 0, "{target}: not emptied");
    }
}

/// `sync -n` from a daemon (the client receives): the plan is shown and nothing is created.
#[test]
fn a_dry_run_pull_prints_its_plan_and_creates_nothing() {
    let t = scratch();
    let root = t.path().join("root");
    write_file(&root.join("src/same"), 1, 1000);
    write_file(&root.join("src/new/deep/f"), 2, 1000);
    let d = Daemon::start(&root, &t.path().join("token"));
    let dst = t.path().join("dst");
    let r = tern(&["sync", &d.url("src/"), &format!("{}/", dst.display()), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    fs::remove_dir_all(dst.join("new")).unwrap();
    write_file(&dst.join("extra"), 3, 10);
    let r = tern(&["sync", "-n", "--delete", &d.url("src/"), &format!("{}/", dst.display()), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    let plan: Vec<String> = r.json["plan"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    assert!(plan.contains(&"skip same".to_string()) && plan.contains(&"copy new/deep/f".to_string()) && plan.contains(&"delete extra".to_string()), "{plan:?}");
    assert!(!dst.join("new").exists(), "a dry run created a directory");
    assert!(dst.join("extra").exists());
}

/// Pulling several sources from a daemon, one of them missing: it is reported in one line, the
/// others land, the run fails (cp, scp and rsync do the same).
#[test]
fn a_missing_remote_source_is_reported_and_the_rest_pulled() {
    let t = scratch();
    let root = t.path().join("root");
    write_file(&root.join("a/f"), 1, 1000);
    write_file(&root.join("b"), 2, 1000);
    let d = Daemon::start(&root, &t.path().join("token"));
    let dst = t.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let r = tern(&["cp", "-r", &d.url("a"), &d.url("missing"), &d.url("b"), dst.to_str().unwrap(), "--token-file", &d.token_arg()], &[]);
    assert!(!r.ok());
    assert!(r.stderr().contains("missing") && r.stderr().contains("source"), "{}", r.stderr());
    assert_eq!(fs::read(dst.join("a/f")).unwrap(), data(1, 1000));
    assert_eq!(fs::read(dst.join("b")).unwrap(), data(2, 1000));
    let r = tern(&["cp", "-r", &d.url("missing"), &d.url("gone"), dst.to_str().unwrap(), "--token-file", &d.token_arg()], &[]);
    assert!(!r.ok());
    assert!(!r.stderr().contains("source: source:"), "said twice: {}", r.stderr());
}

/// What a daemon's walk skips (a FIFO) reaches the pulling client: reported, counted, and no
/// `--delete` of what the walk could not see.
#[test]
fn a_pull_reports_what_the_remote_walk_skipped() {
    let t = scratch();
    let root = t.path().join("root");
    write_file(&root.join("src/f"), 1, 1000);
    let fifo = root.join("src/pipe");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let d = Daemon::start(&root, &t.path().join("token"));
    let dst = t.path().join("dst");
    write_file(&dst.join("pipe"), 9, 10);
    let r = tern(&["sync", "--delete", &d.url("src/"), &format!("{}/", dst.display()), "--token-file", &d.token_arg()], &[]);
    assert!(!r.ok(), "a skipped entry was not reported");
    assert!(r.stderr().contains("pipe") && r.stderr().contains("not a regular file"), "{}", r.stderr());
    assert_eq!(fs::read(dst.join("f")).unwrap(), data(1, 1000));
    assert!(dst.join("pipe").exists(), "--delete removed what the source's walk could not see");
}

/// A tree whose files have several names (hard links, as conda environments and backups hold).
fn linked_tree(src: &std::path::Path) {
    write_file(&src.join("a/big"), 7, 3_000_000);
    fs::create_dir_all(src.join("b")).unwrap();
    fs::hard_link(src.join("a/big"), src.join("b/big2")).unwrap();
    fs::hard_link(src.join("a/big"), src.join("big3")).unwrap();
    write_file(&src.join("s"), 8, 10);
    fs::hard_link(src.join("s"), src.join("a/s2")).unwrap();
    write_file(&src.join("alone"), 9, 100);
}

/// Which names share an inode, as sorted groups of relative paths.
fn link_groups(root: &std::path::Path) -> Vec<Vec<String>> {
    use std::os::unix::fs::MetadataExt;
    let mut by_inode: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
    for rel in ["a/big", "b/big2", "big3", "s", "a/s2", "alone"] {
        by_inode.entry(fs::metadata(root.join(rel)).unwrap().ino()).or_default().push(rel.to_string());
    }
    let mut groups: Vec<Vec<String>> = by_inode
        .into_values()
        .map(|mut g| {
            g.sort();
            g
        })
        .collect();
    groups.sort();
    groups
}

/// Hard links stay links (cp -a, rsync -H), locally, pushed to and pulled from a daemon; an older
/// peer or --no-hard-links gets separate files with the same contents.
#[test]
fn hard_links_stay_links() {
    let t = scratch();
    let src = t.path().join("src");
    linked_tree(&src);
    let want = link_groups(&src);
    assert_eq!(want.len(), 3);
    let local = t.path().join("local");
    let r = tern(&["cp", "-r", src.to_str().unwrap(), local.to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &local);
    assert_eq!(link_groups(&local), want, "local copy");
    assert_eq!(r.u64("bytes"), 3_000_110, "each file's data moves once");
    assert_no_leftovers(&local);
    // A re-run moves nothing and keeps the links.
    let r = tern(&["sync", &format!("{}/", src.display()), local.to_str().unwrap()], &[]);
    assert!(r.ok() && r.u64("bytes") == 0, "{} {}", r.stderr(), r.json);
    assert_eq!(link_groups(&local), want);

    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let r = tern(&["cp", "-r", src.to_str().unwrap(), &d.url("/pushed"), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &root.join("pushed"));
    assert_eq!(link_groups(&root.join("pushed")), want, "pushed to a daemon");
    let pulled = t.path().join("pulled");
    let r = tern(&["cp", "-r", &d.url("/pushed"), pulled.to_str().unwrap(), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(link_groups(&pulled), want, "pulled from a daemon");

    let separate = vec![vec!["a/big".to_string()], vec!["a/s2".to_string()], vec!["alone".to_string()], vec!["b/big2".to_string()], vec!["big3".to_string()], vec!["s".to_string()]];
    let r = tern(&["cp", "-r", "--no-hard-links", src.to_str().unwrap(), t.path().join("nolinks").to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &t.path().join("nolinks"));
    assert_eq!(link_groups(&t.path().join("nolinks")), separate);
    // A daemon without the feature (an older tern): separate files, nothing lost.
    let old_root = t.path().join("old");
    fs::create_dir(&old_root).unwrap();
    let old = Daemon::start_on(&old_root, &t.path().join("token2"), 0, &[("TERN_DEBUG_FEATURES", "63")]);
    let r = tern(&["cp", "-r", src.to_str().unwrap(), &old.url("/x"), "--token-file", &old.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &old_root.join("x"));
    assert_eq!(link_groups(&old_root.join("x")), separate);
}

/// A copy that ended with an error (a FIFO in the tree is left out with one) did not complete:
/// the same command again goes into the same place, locally and to a daemon, never into a
/// nested second copy (`dst/src`), as the README promises for any run that did not complete.
#[test]
fn a_run_that_ended_with_an_error_is_resumed_in_place_not_nested() {
    let t = scratch();
    let src = t.path().join("src");
    write_file(&src.join("a"), 1, 1000);
    write_file(&src.join("sub/b"), 2, 100_000);
    assert!(Command::new("mkfifo").arg(src.join("pipe")).status().unwrap().success());
    let local = t.path().join("local");
    let root = t.path().join("root");
    fs::create_dir_all(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let remote = root.join("dst");
    for (dst, served) in [(local.to_str().unwrap().to_string(), &local), (d.url("dst"), &remote)] {
        for run in 0..2 {
            let r = tern(&["cp", "-r", src.to_str().unwrap(), &dst, "--token-file", &d.token_arg()], &[]);
            assert!(!r.ok(), "run {run}: the FIFO left out is an error: {}", r.stderr());
            assert!(r.stderr().contains("pipe"), "{}", r.stderr());
            assert_eq!(fs::read(served.join("sub/b")).unwrap(), data(2, 100_000), "run {run} to {dst}");
            assert!(!served.join("src").exists(), "run {run} to {dst} nested a second copy");
        }
    }
}

/// `--bwlimit` holds on a pull too, from a daemon and over ssh (the client reads the streams no
/// faster; TCP's flow control holds the remote sender to it): 8 MiB at 4 MiB/s takes about 2 s.
#[test]
fn bwlimit_holds_on_a_pull_from_a_daemon_and_over_ssh() {
    let t = scratch();
    let root = t.path().join("root");
    write_file(&root.join("big"), 5, 8 << 20);
    let d = Daemon::start(&root, &t.path().join("token"));
    let mut pulls = vec![("daemon", tern_args(&["cp", "--bwlimit", "4M", "--token-file", &d.token_arg(), &d.url("big")]))];
    let sshd = require_sshd();
    if let Some(s) = &sshd {
        pulls.push(("ssh", tern_args(&["cp", "--bwlimit", "4M", "--ssh", &s.ssh_cmd(), &format!("root@127.0.0.1:{}", root.join("big").display())])));
    }
    for (how, mut args) in pulls {
        let dst = t.path().join(format!("got-{how}"));
        args.push(dst.to_str().unwrap().to_string());
        let started = std::time::Instant::now();
        let r = tern(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
        let took = started.elapsed();
        assert!(r.ok(), "{how}: {}", r.stderr());
        assert_eq!(fs::read(&dst).unwrap(), data(5, 8 << 20), "{how}");
        assert!(took >= std::time::Duration::from_millis(1500), "{how}: 8 MiB at --bwlimit 4M took {took:?}");
    }
}

fn tern_args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}
