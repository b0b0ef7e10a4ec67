//! Trees holding names that look like tern's own (the leftovers of an interrupted tern
//! destination), links of every kind, and a daemon's confinement of what they may reach.
//! Issue 10: `a` beside `.a.tern-part` and `.a.tern-journal` lost two files and corrupted the
//! third with exit 0; a source `.tern-incomplete` was lost.

use crate::common;

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::Path;

use common::*;

/// What a directory that once held an interrupted tern destination contains (old and new
/// formats), beside the files they were for.
fn lookalike_tree(src: &Path) {
    write_file(&src.join("a"), 1, 20 << 20);
    write_file(&src.join(".a.tern-part"), 2, 3 << 20);
    write_file(&src.join(".a.tern-journal"), 3, 100_000);
    write_file(&src.join(".tern-incomplete"), 4, 1_000);
    write_file(&src.join("sub/b"), 5, 5 << 20);
    write_file(&src.join("sub/.b.tern-part"), 6, 1 << 20);
    // Another directory's temporaries: its tag is not this destination's.
    write_file(&src.join("sub/.tern.0123abcd.0123456789abcdef0123456789abcdef.part"), 7, 70_000);
    write_file(&src.join("sub/.tern.0123abcd.incomplete"), 8, 10);
}

#[test]
fn a_tree_holding_tern_like_names_copies_intact_in_every_mode() {
    let t = scratch();
    let src = t.path().join("src");
    lookalike_tree(&src);
    let n = 8;

    let local = t.path().join("local");
    let r = tern(&["cp", "-r", src.to_str().unwrap(), local.to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(r.u64("files"), n, "{}", r.json);
    assert_same_tree(&src, &local);

    let synced = t.path().join("synced");
    let r = tern(&["sync", &format!("{}/", src.display()), synced.to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &synced);
    // A second sync finds everything identical and deletes nothing of the user's.
    let r = tern(&["sync", "--delete", &format!("{}/", src.display()), synced.to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &synced);

    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let token = t.path().join("token");
    let d = Daemon::start(&root, &token);
    let r = tern(&["cp", "-r", src.to_str().unwrap(), &d.url("pushed"), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &root.join("pushed"));

    let pulled = t.path().join("pulled");
    let r = tern(&["cp", "-r", &d.url("pushed"), pulled.to_str().unwrap(), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    // The same entries and no others: no temporary, journal or marker of tern's left beside them.
    assert_same_tree(&src, &pulled);
}

#[test]
fn a_name_in_terns_own_namespace_is_refused_and_nothing_else_is_lost() {
    let t = scratch();
    let src = t.path().join("src");
    let dst = t.path().join("dst");
    fs::create_dir_all(&dst).unwrap();
    // The one name a user file cannot have in this destination: its temporary's prefix.
    let journal = journal_path(&dst, "anything");
    let reserved = journal.file_name().unwrap().as_bytes().split(|&b| b == b'.').take(3).collect::<Vec<_>>().join(&b'.');
    let reserved = format!("{}.mine", String::from_utf8(reserved).unwrap());
    write_file(&src.join("ok"), 1, 3 << 20);
    write_file(&src.join(&reserved), 2, 1_000);
    let r = tern(&["sync", &format!("{}/", src.display()), dst.to_str().unwrap()], &[]);
    assert!(!r.ok(), "a refused file must make the run fail");
    assert!(r.stderr().contains("reserved for tern"), "{}", r.stderr());
    assert!(r.stderr().contains(&reserved), "names the file: {}", r.stderr());
    assert_eq!(fs::read(dst.join("ok")).unwrap(), data(1, 3 << 20));
    assert!(!dst.join(&reserved).exists());
}

#[test]
fn links_are_copied_as_they_are_and_safe_links_leaves_escaping_ones_out() {
    let t = scratch();
    let src = t.path().join("src");
    write_file(&src.join("sub/f"), 1, 1000);
    symlink("/proj/latest/run42", src.join("abs")).unwrap();
    symlink("../outside", src.join("up")).unwrap();
    symlink("sub/f", src.join("in")).unwrap();
    symlink("../f", src.join("sub/back")).unwrap();

    let dst = t.path().join("dst");
    let r = tern(&["cp", "-r", src.to_str().unwrap(), dst.to_str().unwrap()], &[]);
    assert!(r.ok(), "links are copied as rsync -a and cp -a do: {}", r.stderr());
    assert_same_tree(&src, &dst);

    let safe = t.path().join("safe");
    let r = tern(&["cp", "-r", "--safe-links", src.to_str().unwrap(), safe.to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert!(fs::symlink_metadata(safe.join("in")).is_ok() && fs::symlink_metadata(safe.join("sub/back")).is_ok());
    assert!(fs::symlink_metadata(safe.join("abs")).is_err() && fs::symlink_metadata(safe.join("up")).is_err());
}

#[test]
fn a_daemon_refuses_links_that_could_resolve_outside_its_root() {
    let t = scratch();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("a/b")).unwrap();
    // Judged by resolution, not text: `t` climbs through `s`, a link, so `s/../..` is not
    // what the text says.
    symlink("../..", src.join("a/b/s")).unwrap();
    symlink("a/b/s/../../..", src.join("t")).unwrap();
    symlink("/etc", src.join("abs")).unwrap();
    symlink("../../../..", src.join("a/b/far")).unwrap();
    symlink("a/b", src.join("ok")).unwrap();

    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let token = t.path().join("token");
    let d = Daemon::start(&root, &token);
    let r = tern(&["cp", "-r", src.to_str().unwrap(), &d.url("in"), "--token-file", &d.token_arg()], &[]);
    assert!(!r.ok(), "refused links fail the run");
    assert!(r.stderr().contains("could resolve outside the daemon's root"), "{}", r.stderr());
    assert_eq!(r.json["files_failed"], 3, "the refused links count as entries that did not land: {}", r.json);
    let landed = root.join("in");
    assert_eq!(fs::read_link(landed.join("a/b/s")).unwrap(), Path::new("../.."));
    assert_eq!(fs::read_link(landed.join("ok")).unwrap(), Path::new("a/b"));
    for refused in ["t", "abs", "a/b/far"] {
        assert!(fs::symlink_metadata(landed.join(refused)).is_err(), "{refused} was created");
    }
    drop(d);

    // The operator may allow them; writes still never follow them.
    let d = Daemon::start_with(&root, &token, 0, &[], &["--allow-links-out"]);
    let r = tern(&["cp", "-r", src.to_str().unwrap(), &d.url("allowed"), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(fs::read_link(root.join("allowed/abs")).unwrap(), Path::new("/etc"));
}

#[test]
fn a_link_planted_in_a_daemons_root_is_never_followed_out() {
    let t = scratch();
    let outside = t.path().join("outside");
    write_file(&outside.join("secret"), 9, 1000);
    let root = t.path().join("root");
    fs::create_dir_all(root.join("dir")).unwrap();
    write_file(&root.join("dir/plain"), 1, 1000);
    symlink(&outside, root.join("x")).unwrap();
    symlink(&outside, root.join("dir/inner")).unwrap();
    let token = t.path().join("token");
    let d = Daemon::start(&root, &token);
    let src = t.path().join("src");
    write_file(&src.join("f"), 2, 1000);

    // Writes: through the link at the destination, and below it.
    for dest in ["x", "x/deeper", "dir/inner/y"] {
        let r = tern(&["cp", "-r", src.to_str().unwrap(), &d.url(dest), "--token-file", &d.token_arg()], &[]);
        assert!(!r.ok(), "{dest}: accepted");
    }
    // Reads: the link itself, a path through it, and a tree holding it (sent as a link).
    for from in ["x", "x/secret", "dir/inner/secret"] {
        let out = t.path().join(format!("out-{}", from.replace('/', "-")));
        let r = tern(&["cp", "-r", &d.url(from), out.to_str().unwrap(), "--token-file", &d.token_arg()], &[]);
        assert!(!r.ok(), "{from}: read outside the root");
        assert!(!out.exists() || !snapshot(&out).values().any(|v| v.starts_with("file")), "{from}: data came out");
    }
    let out = t.path().join("tree");
    let r = tern(&["cp", "-r", &d.url("dir"), out.to_str().unwrap(), "--token-file", &d.token_arg()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(fs::read_link(out.join("inner")).unwrap(), outside, "sent as the link it is");
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 1, "nothing written outside the root");
}

/// Trees generated from a seed: every file name drawn from what tern uses or used for itself
/// (old and new formats, other directories' tags) and ordinary names, in nested directories,
/// some files several chunks long. Each copies byte-identical, locally and through a daemon,
/// and a second sync changes nothing.
#[test]
fn generated_trees_of_lookalike_names_copy_intact() {
    let t = scratch();
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    let token = t.path().join("token");
    let d = Daemon::start(&root, &token);
    for seed in 1..=6u64 {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let src = t.path().join(format!("src{seed}"));
        fs::create_dir_all(&src).unwrap();
        let dirs = ["", "d", "d/.tern-incomplete.d", ".a.tern-part.d"];
        for i in 0..24u64 {
            let base = ["a", "b", "data.h5"][next(3) as usize];
            let hex: String = (0..32).map(|_| char::from_digit(next(16) as u32, 16).unwrap()).collect();
            let name = match next(9) {
                0 => base.to_string(),
                1 => format!(".{base}.tern-part"),
                2 => format!(".{base}.tern-journal"),
                3 => ".tern-incomplete".to_string(),
                4 => format!(".tern.{}.{hex}.part", &hex[..8]),
                5 => format!(".tern.{}.{hex}.journal", &hex[24..]),
                6 => format!(".tern.{}.incomplete", &hex[8..16]),
                7 => format!(".{base}.tern-part.tern-part"),
                _ => format!("{base}{i}"),
            };
            let dir = dirs[next(dirs.len() as u64) as usize];
            let size = [0, 1, 4096, 3 << 20, 9 << 20][next(5) as usize];
            write_file(&src.join(dir).join(&name), seed * 100 + i, size);
        }
        let local = t.path().join(format!("local{seed}"));
        let r = tern(&["sync", "--chunk-size", "1M", &format!("{}/", src.display()), local.to_str().unwrap()], &[]);
        assert!(r.ok(), "seed {seed}: {}", r.stderr());
        assert_same_tree(&src, &local);
        let again = tern(&["sync", "--delete", &format!("{}/", src.display()), local.to_str().unwrap()], &[]);
        assert!(again.ok() && again.u64("bytes") == 0 && again.u64("deleted") == 0, "seed {seed}: {}", again.json);
        assert_same_tree(&src, &local);
        let r = tern(&["cp", "-r", "--chunk-size", "1M", src.to_str().unwrap(), &d.url(&format!("d{seed}")), "--token-file", &d.token_arg()], &[]);
        assert!(r.ok(), "seed {seed}: {}", r.stderr());
        assert_same_tree(&src, &root.join(format!("d{seed}")));
    }
}

/// The service confines its child `tern cp` with --src-beneath/--dst-beneath: a link swapped in
/// after the service's start check leads nowhere, for reads and for writes.
#[test]
fn a_confined_local_copy_never_follows_a_link_out() {
    let t = scratch();
    let outside = t.path().join("outside");
    write_file(&outside.join("secret"), 9, 1000);
    let root = t.path().join("root");
    write_file(&root.join("mine/f"), 1, 1000);
    symlink(&outside, root.join("swapped")).unwrap();
    let (r_arg, src) = (root.to_str().unwrap(), root.join("mine"));
    let ok = tern(&["cp", "-r", "--src-beneath", r_arg, "--dst-beneath", r_arg, src.to_str().unwrap(), root.join("copy").to_str().unwrap()], &[]);
    assert!(ok.ok(), "{}", ok.stderr());
    assert_same_tree(&src, &root.join("copy"));
    for dst in ["swapped", "swapped/new"] {
        let r = tern(&["cp", "-r", "--dst-beneath", r_arg, src.to_str().unwrap(), root.join(dst).to_str().unwrap()], &[]);
        assert!(!r.ok(), "{dst}: written through the link");
    }
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 1, "nothing written outside");
    let out = t.path().join("out");
    // Through the link: refused. The link itself: copied as the link it is (cp -r does the same).
    let r = tern(&["cp", "-r", "--src-beneath", r_arg, root.join("swapped/secret").to_str().unwrap(), out.to_str().unwrap()], &[]);
    assert!(!r.ok() && !out.exists(), "read through the link");
    let r = tern(&["cp", "-r", "--src-beneath", r_arg, root.join("swapped").to_str().unwrap(), out.to_str().unwrap()], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(fs::read_link(&out).unwrap(), outside);

    // A fenced watch (what a service's watch job runs) makes its destination beneath the fence
    // and ships units there; through the swapped-in link it is refused and writes nothing out.
    let units = root.join("units");
    write_file(&units.join("u1"), 3, 1000);
    let watch = |dst: &str| {
        tern(
            &[
                "watch",
                "--max-units",
                "1",
                "--ready",
                "stable:0.2",
                "--state-dir",
                t.path().join(format!("state-{}", dst.replace('/', "-"))).to_str().unwrap(),
                "--src-beneath",
                r_arg,
                "--dst-beneath",
                r_arg,
                units.to_str().unwrap(),
                root.join(dst).to_str().unwrap(),
            ],
            &[],
        )
    };
    let ok = watch("wdst/new");
    assert!(ok.ok(), "{}", ok.stderr());
    assert_eq!(fs::read(root.join("wdst/new/u1")).unwrap(), fs::read(units.join("u1")).unwrap());
    let r = watch("swapped/wnew");
    assert!(!r.ok(), "watch wrote through the link");
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 1, "nothing written outside");
}
