//! Include/exclude rules through every kind of endpoint: the sender applies them while walking
//! (locally, on a daemon, on the far side of ssh), the receiver when `--delete` looks for extras.

use crate::common;
use common::*;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The rsync idiom plus an anchored and a directory-only rule:
/// skip any `cache/` directory and the top-level `scratch`, keep every other directory and the
/// HDF5 files, drop everything else.
const RULES: &[&str] = &["--exclude", "cache/", "--filter", "- /scratch", "--include", "*/", "--include", "*.h5", "--exclude", "*"];

fn tree(src: &Path) {
    for (rel, seed) in [
        ("run1/a.h5", 1),
        ("run1/a.log", 2),
        ("run1/cache/c.h5", 3),
        ("top.tmp", 4),
        ("scratch/big.h5", 5),
        ("deep/x/scratch/keep.h5", 6),
        ("deep/x/notes.txt", 7),
        ("cache", 8), // a file named cache: `cache/` matches directories only, but `*` drops it
    ] {
        let p = src.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        write_file(&p, seed, 1000 + seed as usize);
    }
    write_file(&src.join(std::ffi::OsStr::from_bytes(b"run1/\xff name.h5")), 9, 333);
}

/// What the rules let through, computed from the source snapshot by hand.
fn expected(src: &Path) -> BTreeMap<Vec<u8>, String> {
    let keep: &[&[u8]] = &[b"run1", b"run1/a.h5", b"run1/\xff name.h5", b"deep", b"deep/x", b"deep/x/scratch", b"deep/x/scratch/keep.h5"];
    snapshot(src).into_iter().filter(|(k, _)| keep.contains(&k.as_slice())).collect()
}

fn assert_filtered(src: &Path, dst: &Path) {
    let (want, got) = (expected(src), snapshot(dst));
    assert_eq!(want.len(), 7, "the expected set itself is wrong");
    for (k, v) in &want {
        assert_eq!(got.get(k), Some(v), "{} missing or different", String::from_utf8_lossy(k));
    }
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).map(|k| String::from_utf8_lossy(k).into_owned()).collect();
    assert!(extra.is_empty(), "excluded entries were copied: {extra:?}");
}

fn with_rules<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = args.to_vec();
    v.extend_from_slice(RULES);
    v
}

#[test]
fn rules_apply_locally_through_a_daemon_and_over_ssh() {
    let t = scratch();
    let src = t.path().join("src");
    tree(&src);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let contents = format!("{}/.", s(&src));

    let local = t.path().join("local");
    let r = tern(&with_rules(&["cp", "-r", &contents, &s(&local)]), &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_filtered(&src, &local);
    assert_eq!(r.u64("files"), 3);

    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let r = tern(&with_rules(&["cp", "-r", &contents, &d.url("/pushed"), "--token-file", &d.token_arg()]), &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_filtered(&src, &root.join("pushed"));
    // Pull: the daemon walks its tree with our rules. Its copy of everything is the source.
    let everything = root.join("all");
    let r = tern(&["cp", "-r", &contents, &s(&everything)], &[]);
    assert!(r.ok(), "{}", r.stderr());
    let pulled = t.path().join("pulled");
    let r = tern(&with_rules(&["cp", "-r", &d.url("/all/."), &s(&pulled), "--token-file", &d.token_arg()]), &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_filtered(&src, &pulled);

    let Some(sshd) = require_sshd() else { return };
    let ssh = sshd.ssh_cmd();
    let over_ssh = t.path().join("ssh");
    let r = tern(&with_rules(&["cp", "-r", "--ssh", &ssh, &contents, &format!("127.0.0.1:{}", s(&over_ssh))]), &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_filtered(&src, &over_ssh);
    let back = t.path().join("ssh-back");
    let r = tern(&with_rules(&["cp", "-r", "--ssh", &ssh, &format!("127.0.0.1:{}/.", s(&src)), &s(&back)]), &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_filtered(&src, &back);
}

#[test]
fn sync_delete_keeps_what_the_rules_exclude_at_a_remote_destination() {
    let t = scratch();
    let src = t.path().join("src");
    write_file(&src.join("data/a.h5"), 1, 5000);
    let root = t.path().join("root");
    let mirror = root.join("mirror");
    write_file(&mirror.join("stale.h5"), 2, 100);
    write_file(&mirror.join("data/old.h5"), 3, 100);
    write_file(&mirror.join("local.tmp"), 4, 100);
    write_file(&mirror.join("scratch/work.h5"), 5, 100);
    let d = Daemon::start(&root, &t.path().join("token"));
    let args = ["sync", "--delete", "--exclude", "*.tmp", "--exclude", "/scratch", src.to_str().unwrap(), &d.url("/mirror"), "--token-file", &d.token_arg()];
    let r = tern(&[&args[..], &["--dry-run"]].concat(), &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert!(mirror.join("stale.h5").exists(), "dry run deleted");
    let r = tern(&args, &[]);
    assert!(r.ok(), "{}", r.stderr());
    let names: Vec<_> = snapshot(&mirror).into_keys().map(|k| String::from_utf8(k).unwrap()).collect();
    assert_eq!(names, ["data", "data/a.h5", "local.tmp", "scratch", "scratch/work.h5"]);
}

#[test]
fn a_peer_that_cannot_filter_is_refused_before_anything_moves() {
    let t = scratch();
    let src = t.path().join("src");
    write_file(&src.join("a.h5"), 1, 100);
    write_file(&src.join("b.tmp"), 2, 100);
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    // An older daemon: knows third-party (bit 0) but not filters.
    let d = Daemon::start_on(&root, &t.path().join("token"), 0, &[("TERN_DEBUG_FEATURES", "1")]);
    let r = tern(&["cp", "-r", "--exclude", "*.tmp", src.to_str().unwrap(), &d.url("/x"), "--token-file", &d.token_arg()], &[]);
    assert!(!r.ok());
    let err = r.stderr();
    assert!(err.contains("cannot apply --exclude/--include") && err.contains("upgrade"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!root.join("x").exists(), "something was copied");
    // Without rules the same daemon copies as before.
    let r = tern(&["cp", "-r", src.to_str().unwrap(), &d.url("/x"), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &root.join("x"));
}

#[test]
fn bad_rules_fail_before_connecting_with_the_rule_named() {
    let t = scratch();
    let dst = t.path().join("dst");
    for (args, want) in [
        (vec!["--exclude", "run[1"], "filter pattern 'run[1'"),
        (vec!["--filter", "*.tmp"], "filter rule '*.tmp'"),
        (vec!["--exclude-from", "/nonexistent/rules"], "cannot read filter file /nonexistent/rules"),
    ] {
        let mut a = vec!["cp", "-r", "/etc/hostname", dst.to_str().unwrap()];
        a.extend(args);
        let r = tern(&a, &[]);
        assert_eq!(r.out.status.code(), Some(2));
        assert!(r.stderr().contains(want), "{}", r.stderr());
        assert!(!dst.exists());
    }
}

/// `--files-from`: only the listed paths, each in its relative place with its parents; a listed
/// directory brings its subtree with -r. Locally, from a daemon (it walks the list) and over ssh.
#[test]
fn files_from_copies_only_the_listed_paths_wherever_the_walk_happens() {
    let t = scratch();
    let src = t.path().join("src");
    tree(&src);
    let list = t.path().join("list");
    fs::write(&list, b"# what the analysis needs\nrun1/a.h5\n/top.tmp\n./deep/x/\n\nrun1/a.h5\ndeep/x/notes.txt\n").unwrap();
    let want: Vec<&str> = vec!["deep", "deep/x", "deep/x/notes.txt", "deep/x/scratch", "deep/x/scratch/keep.h5", "run1", "run1/a.h5", "top.tmp"];
    let check = |dst: &Path| {
        let got = snapshot(dst);
        let names: Vec<String> = got.keys().map(|k| String::from_utf8_lossy(k).into_owned()).collect();
        assert_eq!(names, want, "in {}", dst.display());
        let all = snapshot(&src);
        for (k, v) in &got {
            if v.starts_with("file") {
                assert_eq!(all.get(k), Some(v), "{} differs", String::from_utf8_lossy(k));
            }
        }
    };
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let l = s(&list);

    let local = t.path().join("local");
    let r = tern(&["cp", "-r", "--files-from", &l, &s(&src), &s(&local)], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(r.u64("files"), 4, "each listed file once");
    check(&local);

    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let r = tern(&["cp", "-r", &format!("{}/.", s(&src)), &s(&root.join("all"))], &[]);
    assert!(r.ok(), "{}", r.stderr());
    let d = Daemon::start(&root, &t.path().join("token"));
    let pulled = t.path().join("pulled");
    let r = tern(&["cp", "-r", "--files-from", &l, "--token-file", &d.token_arg(), &d.url("/all"), &s(&pulled)], &[]);
    assert!(r.ok(), "{}", r.stderr());
    check(&pulled);

    let Some(sshd) = require_sshd() else { return };
    let over_ssh = t.path().join("ssh");
    let r = tern(&["cp", "-r", "--files-from", &l, "--ssh", &sshd.ssh_cmd(), &format!("127.0.0.1:{}", s(&src)), &s(&over_ssh)], &[]);
    assert!(r.ok(), "{}", r.stderr());
    check(&over_ssh);
}

#[test]
fn files_from_reports_missing_paths_refuses_escapes_and_old_peers() {
    let t = scratch();
    let src = t.path().join("src");
    write_file(&src.join("a.dat"), 1, 100);
    let (list, dst) = (t.path().join("list"), t.path().join("dst"));
    let s = |p: &Path| p.to_str().unwrap().to_string();
    // A listed path that is not there: a per-file source error, the rest is copied.
    fs::write(&list, "a.dat\nnot-there.dat\n").unwrap();
    let r = tern(&["cp", "--files-from", &s(&list), &s(&src), &s(&dst)], &[]);
    assert!(!r.ok());
    assert!(r.stderr().contains("not-there.dat") && r.stderr().contains("listed in --files-from"), "{}", r.stderr());
    assert_eq!(fs::read(dst.join("a.dat")).unwrap(), fs::read(src.join("a.dat")).unwrap());
    // A path out of SRC is refused before anything moves, naming the line.
    fs::write(&list, "a.dat\n../etc/passwd\n").unwrap();
    let r = tern(&["cp", "--files-from", &s(&list), &s(&src), &s(&t.path().join("dst2"))], &[]);
    assert_eq!(r.out.status.code(), Some(2));
    assert!(r.stderr().contains("line 2") && r.stderr().contains("../etc/passwd"), "{}", r.stderr());
    assert!(!t.path().join("dst2").exists());
    // --delete with a list would delete everything not listed: refused.
    let r = tern(&["sync", "--delete", "--files-from", &s(&list), &s(&src), &s(&dst)], &[]);
    assert_eq!(r.out.status.code(), Some(2));
    // A daemon from before file lists (feature bit 3 unset) is refused with one line.
    fs::write(&list, "a.dat\n").unwrap();
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    write_file(&root.join("a.dat"), 1, 100);
    let d = Daemon::start_on(&root, &t.path().join("token"), 0, &[("TERN_DEBUG_FEATURES", "7")]);
    let r = tern(&["cp", "--files-from", &s(&list), "--token-file", &d.token_arg(), &d.url("/"), &s(&t.path().join("dst3"))], &[]);
    assert!(!r.ok());
    assert!(r.stderr().contains("cannot apply --files-from") && r.stderr().trim().lines().count() == 1, "{}", r.stderr());
}

/// `--ignore-existing` tops up: an existing destination file is kept whatever its content, the
/// missing ones are copied; a receiver that cannot honour it is refused before anything moves.
#[test]
fn ignore_existing_keeps_what_is_there_and_copies_the_rest() {
    let t = scratch();
    let src = t.path().join("src");
    write_file(&src.join("a.dat"), 1, 5000);
    write_file(&src.join("d/b.dat"), 2, 5000);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let root = t.path().join("root");
    write_file(&root.join("top/a.dat"), 9, 10); // different size and content: kept anyway
    let d = Daemon::start(&root, &t.path().join("token"));
    let r = tern(&["cp", "-r", "--ignore-existing", "--token-file", &d.token_arg(), &format!("{}/.", s(&src)), &d.url("/top")], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!((r.u64("files"), r.u64("files_skipped")), (1, 1), "{}", r.json);
    assert_eq!(fs::read(root.join("top/a.dat")).unwrap(), data(9, 10), "the existing file was overwritten");
    assert_eq!(fs::read(root.join("top/d/b.dat")).unwrap(), fs::read(src.join("d/b.dat")).unwrap());
    // Without it, the same copy replaces the stale file.
    let r = tern(&["cp", "-r", "--token-file", &d.token_arg(), &format!("{}/.", s(&src)), &d.url("/top")], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(fs::read(root.join("top/a.dat")).unwrap(), fs::read(src.join("a.dat")).unwrap());
    // An older receiving daemon (feature bit 4 unset) is refused with one line.
    let old_root = t.path().join("old");
    write_file(&old_root.join("a.dat"), 9, 10);
    let old = Daemon::start_on(&old_root, &t.path().join("token2"), 0, &[("TERN_DEBUG_FEATURES", "15")]);
    let r = tern(&["cp", "-r", "--ignore-existing", "--token-file", &old.token_arg(), &format!("{}/.", s(&src)), &old.url("/")], &[]);
    assert!(!r.ok());
    assert!(r.stderr().contains("cannot apply --ignore-existing") && r.stderr().trim().lines().count() == 1, "{}", r.stderr());
    assert_eq!(fs::read(old_root.join("a.dat")).unwrap(), data(9, 10));
    assert!(!old_root.join("d").exists(), "something moved");
}
