//! `tern plan`: the history real transfers leave, the model fitted from it, the walk of a
//! source over ssh, and `--history`. No timing is asserted: the fit itself is unit-tested with
//! made-up histories (src/plan.rs); here the pieces are real.

use crate::common;
use common::*;

use std::fs;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn run(args: &[&str], history: &Path) -> Output {
    let mut cmd = Command::new(tern_bin());
    cmd.args(args).env("TERN_HISTORY", history).stdin(Stdio::null());
    run_bounded(cmd, Duration::from_secs(120))
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

fn tree(root: &Path, files: u64, size: usize) {
    for i in 0..files {
        write_file(&root.join(format!("d{}/f{i}", i % 7)), i, size);
    }
}

#[test]
fn transfers_teach_the_model_and_plan_walks_the_source() {
    let t = scratch();
    let history = t.path().join("state/history.jsonl");
    let shapes = [("many", 300u64, 2_000usize), ("few", 3, 3 << 20), ("mixed", 40, 100_000), ("one", 1, 8 << 20)];
    for (name, n, size) in shapes {
        let src = t.path().join(name);
        tree(&src, n, size);
        let o = run(&["cp", "-r", "-q", src.to_str().unwrap(), t.path().join(format!("{name}-copy")).to_str().unwrap()], &history);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let lines = fs::read_to_string(&history).unwrap();
    assert_eq!(lines.lines().count(), 4, "one record per transfer:\n{lines}");

    let plan = json(&run(&["plan", "--json", t.path().join("mixed").to_str().unwrap(), t.path().join("elsewhere").to_str().unwrap()], &history));
    assert_eq!(plan["pair"], "local -> local");
    assert_eq!(plan["files"], 40);
    assert_eq!(plan["bytes"], 40 * 100_000);
    assert_eq!(plan["directories"], 8, "the top and its 7 subdirectories");
    assert_eq!(plan["model"]["samples"], 4);
    assert!(plan["predicted_seconds"].as_f64().unwrap() > 0.0, "{plan}");

    let h = json(&run(&["plan", "--history", "--json"], &history));
    assert_eq!(h["records"].as_array().unwrap().len(), 4);
    assert_eq!(h["predicted"], 3, "every transfer after the first was predicted before it ran: {h}");
    let text = run(&["plan", "--history"], &history);
    assert!(String::from_utf8_lossy(&text.stdout).contains("3 predicted: median error"), "{}", String::from_utf8_lossy(&text.stdout));
}

#[test]
fn without_history_plan_says_how_to_get_one_and_off_records_nothing() {
    let t = scratch();
    let src = t.path().join("src");
    tree(&src, 5, 1000);
    let history = t.path().join("h.jsonl");
    let o = run(&["plan", src.to_str().unwrap(), "/tmp/x"], &history);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains("5 files") && out.contains("no past transfers from local -> local yet"), "{out}");

    let off = Path::new("off");
    let o = run(&["cp", "-r", "-q", src.to_str().unwrap(), t.path().join("dst").to_str().unwrap()], off);
    assert!(o.status.success());
    assert!(!Path::new("off").exists() && !history.exists(), "TERN_HISTORY=off writes nothing");
}

#[test]
fn a_missing_source_is_one_line_naming_it() {
    let t = scratch();
    let o = run(&["plan", t.path().join("nope").to_str().unwrap(), "/tmp/x"], &t.path().join("h"));
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.lines().count() == 1 && err.contains("nope"), "{err}");
}

#[test]
fn plan_walks_a_source_over_ssh_and_names_the_pair_by_host() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let far = t.path().join("far");
    tree(&far, 12, 5_000);
    let history = t.path().join("h.jsonl");
    let src = format!("127.0.0.1:{}", far.display());
    let o = run(&["cp", "-r", "-q", "--ssh", &sshd.ssh_cmd(), &src, t.path().join("here").to_str().unwrap()], &history);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let plan = json(&run(&["plan", "--json", "--ssh", &sshd.ssh_cmd(), &src, t.path().join("again").to_str().unwrap()], &history));
    assert_eq!(plan["pair"], "ssh:127.0.0.1 -> local");
    assert_eq!(plan["files"], 12);
    assert_eq!(plan["bytes"], 60_000);
    assert_eq!(plan["model"]["samples"], 1, "{plan}");
}

/// A path test leaves its expectation in the history; the pair's next large transfer is
/// compared with it (one line on stderr, and in `tern plan --history`), and the test line
/// teaches the model nothing.
#[test]
fn a_large_transfer_is_compared_with_the_last_path_test_of_its_pair() {
    let t = scratch();
    let history = t.path().join("state/history.jsonl");
    let root = t.path().join("root");
    fs::create_dir_all(&root).unwrap();
    let d = Daemon::start(&root, &t.path().join("token"));
    let o = run(&["test", "--seconds", "5", "--json", "--token-file", &d.token_arg(), &d.url("")], &history);
    let expected = json(&o)["expected_gbps"].as_f64().unwrap();
    assert!(expected > 0.0);
    let big = t.path().join("big.bin");
    write_file(&big, 7, 256 << 20);
    let o = run(&["cp", "--token-file", &d.token_arg(), big.to_str().unwrap(), &d.url("big.bin")], &history);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{e}");
    assert!(e.contains(&format!("the last tern test of this path expected {expected:.2} Gb/s")), "{e}");
    // A small copy is not compared (start-up would dominate it).
    let small = t.path().join("small.bin");
    write_file(&small, 8, 1000);
    let o = run(&["cp", "--token-file", &d.token_arg(), small.to_str().unwrap(), &d.url("small.bin")], &history);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("tern test"), "{}", String::from_utf8_lossy(&o.stderr));
    let h = json(&run(&["plan", "--history", "--json"], &history));
    let records = h["records"].as_array().unwrap();
    assert_eq!(records.len(), 2, "the two transfers, not the test: {h}");
    assert_eq!(records[0]["test_expected_gbps"].as_f64(), Some(expected), "{h}");
    assert!(records[1]["test_expected_gbps"].is_null());
    let text = String::from_utf8_lossy(&run(&["plan", "--history"], &history).stdout).into_owned();
    assert!(text.contains("Gb/s vs test") && text.contains(&format!(" / {expected:.2}")), "{text}");
}
