//! Trees whose shape, not size, used to break a copy: long paths and deep directories overflowed
//! the control frame ("frame of 1152382 bytes exceeds the limit"), with nothing copied.

mod common;
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
