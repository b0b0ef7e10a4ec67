//! `tern watch` end to end: a generator produces snapshot directories over time while a real
//! watcher ships them (locally, through a real daemon, over a real sshd), hooks them in order,
//! survives kill -9 of itself and of the daemon, and reports lag and backlog.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

use crate::common;
use common::*;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

const MIB: usize = 1 << 20;

/// A running `tern watch`: its progress lines are collected as they come.
struct Watch {
    child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(tern_bin());
        cmd.arg("watch").args(args).args(["--json", "--progress-json"]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let lines: Arc<Mutex<Vec<Value>>> = Arc::default();
        let l = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&line) {
                    l.lock().unwrap().push(v);
                }
            }
        });
        Self { child, lines, reader: Some(reader) }
    }

    /// Waits (bounded) for the end; returns the exit status and the summary.
    fn finish(mut self, limit: Duration) -> (bool, Value, Vec<Value>) {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("tern watch ran over {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        self.reader.take().unwrap().join().unwrap();
        let lines = self.lines.lock().unwrap().clone();
        let summary = lines.iter().rev().find(|v| v.get("ok").is_some()).cloned().unwrap_or(Value::Null);
        let progress = lines.into_iter().filter_map(|v| v.get("progress").cloned()).collect();
        (status.success(), summary, progress)
    }

    fn kill9(mut self) -> Vec<Value> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reader.take().unwrap().join().unwrap();
        self.lines.lock().unwrap().iter().filter_map(|v| v.get("progress").cloned()).collect()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if self.reader.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The watcher's state log, event by event.
fn events(state: &Path) -> Vec<Value> {
    fs::read_to_string(state.join("units.jsonl")).unwrap_or_default().lines().skip(1).filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn count(evs: &[Value], ev: &str) -> usize {
    evs.iter().filter(|e| e["ev"] == ev).count()
}

/// A snapshot directory: `files` files of `size` bytes.
fn snapshot_dir(dir: &Path, seed: u64, files: usize, size: usize) -> u64 {
    for i in 0..files {
        write_file(&dir.join(format!("part{i}.h5")), seed * 100 + i as u64, size);
    }
    (files * size) as u64
}

fn lines_of(p: &Path) -> Vec<String> {
    fs::read_to_string(p).unwrap_or_default().lines().map(str::to_string).collect()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The SC16 shape: a simulation writes snapshot directories over time and logs `XFER <dir>`
/// when each is complete. Every unit lands verified; the analysis hook runs once per unit in
/// production order although a later small unit verifies before an earlier big one; a unit
/// still being written is not shipped.
#[test]
fn sc16_pipeline_ships_every_snapshot_once_hooks_in_order() {
    let t = scratch();
    let (src, dst, state) = (t.path().join("sim/out"), t.path().join("dst"), t.path().join("state"));
    fs::create_dir_all(&src).unwrap();
    let log = t.path().join("sim/sim.log");
    let hooks = t.path().join("hooks.txt");
    fs::write(&log, "HACC start\n").unwrap();
    // The hook counts the unit's files at the destination: it must see the whole snapshot.
    let hook = format!("echo \"$TERN_UNIT_NAME $(ls \"$TERN_UNIT_PATH\" | wc -l)\" >> {}", s(&hooks));
    let ready = format!("log:{}:^XFER (\\S+)", s(&log));
    let w = Watch::start(
        &[s(&src), s(&dst), "--ready", &ready, "--on-arrival", &hook, "--in-order", "--until", "END", "--state-dir", s(&state), "--parallel", "3", "--streams", "1", "--chunk-size", "1M"],
        &[("TERN_FAULT_DELAY_MS", "100")],
    );
    let append = |line: &str| fs::OpenOptions::new().append(true).open(&log).unwrap().write_all(format!("{line}\n").as_bytes()).unwrap();
    // snap_000 is big (8 chunks at 100 ms each), snap_001 tiny: both logged at once, so
    // snap_001 verifies first and its hook must wait for snap_000's.
    snapshot_dir(&src.join("snap_000"), 0, 2, 4 * MIB);
    snapshot_dir(&src.join("snap_001"), 1, 1, 1000);
    append(&format!("XFER {}", s(&src.join("snap_000"))));
    append("XFER snap_001");
    // snap_002 is written in two halves with a pause, logged only when complete.
    snapshot_dir(&src.join("snap_002"), 2, 2, MIB);
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!dst.join("snap_002").exists(), "snap_002 shipped while it was still being written");
    assert!(events(&state).iter().all(|e| e["unit"] != "snap_002"), "snap_002 became ready before its XFER line");
    snapshot_dir(&src.join("snap_002/more"), 3, 2, MIB);
    append("step 2 done");
    append("XFER snap_002");
    for i in 3..6 {
        snapshot_dir(&src.join(format!("snap_{i:03}")), 10 + i, 3, 200_000);
        append(&format!("XFER snap_{i:03}"));
        std::thread::sleep(Duration::from_millis(300));
    }
    fs::write(src.join("END"), b"").unwrap();
    let (ok, summary, progress) = w.finish(Duration::from_secs(120));
    assert!(ok, "{summary}");
    assert_eq!(summary["ended"], "until");
    assert_eq!(summary["units"], 6);
    assert_eq!(summary["bytes_resent"], 0);
    for i in 0..6 {
        let name = format!("snap_{i:03}");
        assert_same_tree(&src.join(&name), &dst.join(&name));
    }
    assert_no_leftovers(&dst);
    assert!(!dst.join("END").exists(), "the --until file is not a unit");
    // Exactly once each, in production order, each seeing its whole snapshot.
    assert_eq!(lines_of(&hooks), vec!["snap_000 2", "snap_001 1", "snap_002 3", "snap_003 3", "snap_004 3", "snap_005 3"]);
    let evs = events(&state);
    let verified: Vec<u64> = evs.iter().filter(|e| e["ev"] == "verified").map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(verified.len(), 6);
    let pos = |seq: u64| verified.iter().position(|&s| s == seq).unwrap();
    assert!(pos(1) < pos(0), "the test needs snap_001 to verify before snap_000: {verified:?}");
    assert_eq!(count(&evs, "hooked"), 6);
    assert_eq!(count(&evs, "shipping"), 6, "a unit was shipped twice");
    let last = progress.last().unwrap();
    assert_eq!(last["watch"]["units_done"], 6);
    assert_eq!(last["watch"]["backlog_units"], 0);
    eprintln!("measured: sc16 shape, 6 units, {} bytes in {:.1} s, final lag {:.2} s", summary["bytes"], summary["seconds"].as_f64().unwrap(), summary["lag_seconds"].as_f64().unwrap());
}

/// kill -9 of the watcher mid-stream, then a restart: every unit lands, nothing verified is sent
/// again, no hook runs twice; `--delete-after-verified` frees the source as units verify.
#[test]
fn watcher_killed_mid_stream_resumes_without_loss_or_repeats() {
    let t = scratch();
    let (src, dst, state) = (t.path().join("src"), t.path().join("dst"), t.path().join("state"));
    fs::create_dir_all(&src).unwrap();
    let originals = t.path().join("orig");
    let mut total = 0;
    for i in 0..5u64 {
        total += snapshot_dir(&src.join(format!("snap_{i}")), i, 2, 3 * MIB);
        fs::write(src.join(format!("snap_{i}.done")), b"").unwrap();
    }
    copy_tree(&src, &originals);
    let hooks = t.path().join("hooks.txt");
    let hook = format!("echo \"$TERN_UNIT_NAME\" >> {}", s(&hooks));
    let args = [
        s(&src),
        s(&dst),
        "--ready",
        "marker:*.done",
        "--on-arrival",
        &hook,
        "--in-order",
        "--delete-after-verified",
        "--until",
        "END",
        "--state-dir",
        s(&state),
        "--parallel",
        "1",
        "--streams",
        "1",
        "--chunk-size",
        "1M",
    ];
    let env = [("TERN_FAULT_DELAY_MS", "60")];
    let w = Watch::start(&args, &env);
    // Kill while a unit is mid-transfer and no hook is running: two units hooked, the third
    // has verified chunks in a journal.
    wait_for("two units hooked and a third under way", Duration::from_secs(60), || {
        let evs = events(&state);
        count(&evs, "hooked") == 2 && count(&evs, "verified") == 2 && journals(&dst.join("snap_2")) > 0
    });
    let progress = w.kill9();
    let evs = events(&state);
    assert!(count(&evs, "verified") < 5, "killed too late");
    let verified_bytes: u64 = evs.iter().filter(|e| e["ev"] == "verified").map(|e| e["bytes_sent"].as_u64().unwrap()).sum();
    assert!(!src.join("snap_0").exists() && !src.join("snap_0.done").exists(), "verified units are deleted at the source");
    fs::write(src.join("END"), b"").unwrap();
    let w2 = Watch::start(&args, &env);
    let (ok, summary, _) = w2.finish(Duration::from_secs(120));
    assert!(ok, "{summary}");
    for i in 0..5 {
        assert_same_tree(&originals.join(format!("snap_{i}")), &dst.join(format!("snap_{i}")));
        assert!(!src.join(format!("snap_{i}")).exists());
    }
    assert_no_leftovers(&dst);
    assert_eq!(lines_of(&hooks), vec!["snap_0", "snap_1", "snap_2", "snap_3", "snap_4"], "each hook exactly once, in order");
    // The restart sent only what was not verified before the kill, less what the journal of the
    // unit under way already held.
    let resent = summary["bytes"].as_u64().unwrap();
    eprintln!(
        "measured: watcher killed after {} verified units ({} bytes; last progress line {} bytes); restart sent {resent} of {total} bytes, skipped {}",
        count(&evs, "verified"),
        verified_bytes,
        progress.last().map(|p| p["bytes"].clone()).unwrap_or_default(),
        summary["bytes_skipped"]
    );
    assert!(resent + verified_bytes <= total, "sent {resent} + {verified_bytes} > {total}: something was shipped twice");
    assert!(summary["bytes_skipped"].as_u64().unwrap() > 0, "the unit under way resumed from its journal");
}

/// Journals of partial files under a unit's destination.
fn journals(dir: &Path) -> usize {
    fs::read_dir(dir).map(|rd| rd.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().ends_with(".journal") && e.metadata().map(|m| m.len() > 40).unwrap_or(false)).count()).unwrap_or(0)
}

fn copy_tree(from: &Path, to: &Path) {
    let st = Command::new("cp").arg("-a").arg(from).arg(to).status().unwrap();
    assert!(st.success());
}

/// kill -9 of the receiving daemon mid-stream: the watcher reconnects and resumes when it is
/// back; every unit lands once and the daemon's registered hook runs once per unit, in order.
#[test]
fn daemon_killed_mid_stream_hooks_run_once_in_order() {
    let t = scratch();
    let (src, root, state) = (t.path().join("src"), t.path().join("root"), t.path().join("state"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(root.join("incoming")).unwrap();
    let token = t.path().join("token");
    let hooks = t.path().join("hooks.txt");
    let hook_arg = format!("analyze=echo \"$TERN_UNIT_NAME $TERN_UNIT_PATH\" >> {}", s(&hooks));
    let mut d = Daemon::start_with(&root, &token, 0, &[], &["--hook", &hook_arg]);
    let port = d.port;
    let mut total = 0;
    for i in 0..4u64 {
        total += snapshot_dir(&src.join(format!("snap_{i}")), 40 + i, 2, 4 * MIB);
        fs::write(src.join(format!("snap_{i}.done")), b"").unwrap();
    }
    fs::write(src.join("END"), b"").unwrap();
    let url = d.url("/incoming");
    let w = Watch::start(
        &[
            s(&src),
            &url,
            "--token-file",
            s(&token),
            "--ready",
            "marker:*.done",
            "--on-arrival",
            "analyze",
            "--in-order",
            "--until",
            "END",
            "--state-dir",
            s(&state),
            "--parallel",
            "2",
            "--streams",
            "2",
            "--chunk-size",
            "1M",
            "--retry-for",
            "60",
        ],
        &[("TERN_FAULT_DELAY_MS", "40")],
    );
    wait_for("a unit under way at the daemon", Duration::from_secs(60), || (0..4).any(|i| journals(&root.join(format!("incoming/snap_{i}"))) > 0));
    d.kill9();
    std::thread::sleep(Duration::from_millis(500));
    let _d2 = Daemon::start_with(&root, &token, port, &[], &["--hook", &hook_arg]);
    let (ok, summary, _) = w.finish(Duration::from_secs(120));
    assert!(ok, "{summary}");
    for i in 0..4 {
        assert_same_tree(&src.join(format!("snap_{i}")), &root.join(format!("incoming/snap_{i}")));
    }
    assert_no_leftovers(&root);
    let root_c = root.canonicalize().unwrap();
    let want: Vec<String> = (0..4).map(|i| format!("snap_{i} {}/incoming/snap_{i}", root_c.display())).collect();
    assert_eq!(lines_of(&hooks), want, "the daemon's hook ran once per unit, in order, on the path in its root");
    let evs = events(&state);
    assert_eq!(count(&evs, "shipping"), 4, "no unit shipped twice");
    let bytes = summary["bytes"].as_u64().unwrap();
    eprintln!("measured: daemon killed mid-stream; reconnects={} bytes={bytes} of {total} bytes_resent={}", summary["reconnects"], summary["bytes_resent"]);
    assert!(summary["reconnects"].as_u64().unwrap() >= 1);
    // At most the chunks in flight on 2 streams of 2 units (one being written, one queued each).
    assert!(bytes <= total + 2 * 2 * 2 * MIB as u64, "sent {bytes} for {total}");
}

/// A client can never make a daemon run a command of its choosing, nor a registered hook on a
/// path outside the daemon's root.
#[test]
fn daemon_runs_only_registered_hooks_inside_its_root() {
    use tern_engine::client::session::{ClientSpec, SshOptions};
    use tern_engine::endpoint::Endpoint;
    let t = scratch();
    let root = t.path().join("root");
    fs::create_dir_all(root.join("unit")).unwrap();
    fs::create_dir_all(t.path().join("outside")).unwrap();
    std::os::unix::fs::symlink(t.path().join("outside"), root.join("escape")).unwrap();
    let token = t.path().join("token");
    let ran = t.path().join("ran.txt");
    let d = Daemon::start_with(&root, &token, 0, &[], &["--hook", &format!("record=echo \"$TERN_UNIT_PATH\" >> {}", s(&ran))]);
    let spec = ClientSpec {
        sources: vec![],
        dest: Endpoint::parse(&d.url("/")).unwrap(),
        options: Default::default(),
        adaptive: false,
        max_streams: 1,
        ssh: SshOptions::default(),
        token_file: Some(token.clone()),
        dst_token_file: None,
        bwlimit: None,
        bufsize: None,
        retry_for: Duration::from_secs(5),
        filters: Vec::new(),
        files_from: None,
        stripe: None,
        fences: Default::default(),
    };
    let pwned = t.path().join("pwned");
    let refused = [
        (format!("touch {}", s(&pwned)), "/unit".to_string(), "no hook"),
        ("record; touch /tmp/x".to_string(), "/unit".to_string(), "no hook"),
        ("record".to_string(), "/../outside".to_string(), "'..' is not allowed"),
        ("record".to_string(), "/escape".to_string(), "leaves the daemon's root"),
        ("record".to_string(), "/missing".to_string(), "no such unit"),
    ];
    for (name, path, why) in &refused {
        let e = tern_engine::client::hook::run_on_daemon(&spec, name, path).unwrap_err();
        assert!(e.to_string().contains(why), "{name} {path}: {e}");
    }
    assert!(!pwned.exists() && !ran.exists(), "a refused request ran something");
    tern_engine::client::hook::run_on_daemon(&spec, "record", "/unit").unwrap();
    assert_eq!(lines_of(&ran), vec![root.canonicalize().unwrap().join("unit").display().to_string()]);
    // A hook name longer than the protocol's bound is refused before it is sent.
    let long = "a".repeat(100);
    assert!(tern_engine::client::hook::run_on_daemon(&spec, &long, "/unit").is_err());
}

/// Production outruns the link (--bwlimit): backlog and lag grow and are reported, the ETA
/// warning fires, and everything drains by the end.
#[test]
fn lag_backlog_and_eta_warning_are_reported() {
    let t = scratch();
    let (src, dst, state) = (t.path().join("src"), t.path().join("dst"), t.path().join("state"));
    fs::create_dir_all(&src).unwrap();
    let w = Watch::start(&[s(&src), s(&dst), "--ready", "marker:*.done", "--until", "END", "--state-dir", s(&state), "--parallel", "1", "--bwlimit", "1M", "--rate-window", "4"], &[]);
    // 6 units of 1 MiB in ~1.5 s against a 1 MiB/s link.
    for i in 0..6u64 {
        write_file(&src.join(format!("u{i}")), i, MIB);
        fs::write(src.join(format!("u{i}.done")), b"").unwrap();
        std::thread::sleep(Duration::from_millis(250));
    }
    fs::write(src.join("END"), b"").unwrap();
    let (ok, summary, progress) = w.finish(Duration::from_secs(60));
    assert!(ok, "{summary}");
    let max = |k: &str| progress.iter().map(|p| p["watch"][k].as_f64().unwrap_or(0.0)).fold(0.0, f64::max);
    eprintln!("measured: max backlog {} units / {} bytes, max lag {:.1} s, final lag {:.1} s", max("backlog_units"), max("backlog_bytes"), max("lag_seconds"), summary["lag_seconds"]);
    assert!(max("backlog_units") >= 3.0, "backlog never built up: {progress:?}");
    assert!(max("backlog_bytes") >= 3.0 * MIB as f64);
    assert!(max("lag_seconds") >= 2.0, "lag not reported");
    let warned = progress.iter().find_map(|p| p["watch"]["eta_warning"].as_str().map(str::to_string));
    assert!(warned.as_deref().is_some_and(|w| w.contains("outruns the link")), "no ETA warning: {progress:?}");
    assert!(progress.iter().any(|p| p["watch"]["eta_seconds"].as_f64().is_some_and(|e| e > 0.0)));
    let last = progress.last().unwrap();
    assert_eq!(last["watch"]["backlog_units"], 0);
    assert_eq!(last["watch"]["units_done"], 6);
    assert_eq!(summary["backlog_units"], 0);
}

/// close-after-write: a file held open is not shipped while it is written; polling with a
/// stability rule works where inotify cannot (forced with --poll).
#[test]
fn close_rule_waits_for_the_writer_and_polling_fallback_works() {
    let t = scratch();
    let (src, dst, state) = (t.path().join("src"), t.path().join("dst"), t.path().join("state"));
    fs::create_dir_all(&src).unwrap();
    let w = Watch::start(&[s(&src), s(&dst), "--max-units", "1", "--state-dir", s(&state)], &[]);
    std::thread::sleep(Duration::from_millis(700));
    let mut f = fs::File::create(src.join("field.dat")).unwrap();
    f.write_all(&data(1, MIB)).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!dst.join("field.dat").exists(), "shipped while still open for writing");
    f.write_all(&data(2, MIB)).unwrap();
    drop(f);
    let (ok, summary, _) = w.finish(Duration::from_secs(30));
    assert!(ok, "{summary}");
    assert_eq!(summary["detection"], "inotify");
    assert_eq!(fs::metadata(dst.join("field.dat")).unwrap().len(), 2 * MIB as u64);
    assert_same_tree(&src, &dst);

    let (src2, dst2) = (t.path().join("src2"), t.path().join("dst2"));
    fs::create_dir_all(&src2).unwrap();
    let w = Watch::start(&[s(&src2), s(&dst2), "--poll", "--ready", "stable:1.5", "--until", "END", "--state-dir", s(&t.path().join("state2"))], &[]);
    let mut f = fs::File::create(src2.join("growing.dat")).unwrap();
    for i in 0..4 {
        f.write_all(&data(i, 100_000)).unwrap();
        std::thread::sleep(Duration::from_millis(600));
        assert!(!dst2.join("growing.dat").exists(), "shipped while growing");
    }
    drop(f);
    fs::write(src2.join("END"), b"").unwrap();
    let (ok, summary, _) = w.finish(Duration::from_secs(30));
    assert!(ok, "{summary}");
    assert_eq!(summary["detection"], "poll");
    assert_eq!(fs::metadata(dst2.join("growing.dat")).unwrap().len(), 400_000);
}

/// ssh destination: units land over the user's ssh and the hook runs there as the user.
#[test]
fn ssh_destination_runs_the_hook_over_ssh() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let (src, dst, state) = (t.path().join("src"), t.path().join("dst"), t.path().join("state"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&dst).unwrap();
    for i in 0..3u64 {
        snapshot_dir(&src.join(format!("snap_{i}")), 70 + i, 2, 300_000);
        fs::write(src.join(format!("snap_{i}.done")), b"").unwrap();
    }
    fs::write(src.join("END"), b"").unwrap();
    let hooks = t.path().join("hooks.txt");
    let hook = format!("echo \"$TERN_UNIT_SEQ $TERN_UNIT_PATH $SSH_CONNECTION\" | cut -d' ' -f1,2,3 >> {}", s(&hooks));
    let target = format!("127.0.0.1:{}", s(&dst));
    let w = Watch::start(&[s(&src), &target, "--ssh", &sshd.ssh_cmd(), "--ready", "marker:*.done", "--on-arrival", &hook, "--in-order", "--until", "END", "--state-dir", s(&state)], &[]);
    let (ok, summary, _) = w.finish(Duration::from_secs(60));
    assert!(ok, "{summary}");
    for i in 0..3 {
        assert_same_tree(&src.join(format!("snap_{i}")), &dst.join(format!("snap_{i}")));
    }
    let want: Vec<String> = (0..3).map(|i| format!("{i} {}/snap_{i} 127.0.0.1", s(&dst))).collect();
    assert_eq!(lines_of(&hooks), want, "the hook ran over ssh (SSH_CONNECTION set), once per unit, in order");
}

/// `tern submit --watch`: the service runs `tern watch` as the job's child; the job's progress
/// carries the `watch` fields and its summary the units. A local hook is a command, so it needs
/// an admin token.
#[test]
fn service_runs_watch_jobs() {
    let t = scratch();
    let (src, dst, state) = (t.path().join("src"), t.path().join("dst"), t.path().join("svc"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(t.path().join("root")).unwrap();
    for i in 0..3u64 {
        snapshot_dir(&src.join(format!("snap_{i}")), 90 + i, 2, 200_000);
        fs::write(src.join(format!("snap_{i}.done")), b"").unwrap();
    }
    fs::write(src.join("END"), b"").unwrap();
    let (http, data) = (free_port(), free_port());
    let mut svc = Command::new(tern_bin())
        .args(["serve", "--listen", &format!("127.0.0.1:{data}"), "--http-listen", &format!("127.0.0.1:{http}"), "--root", s(&t.path().join("root"))])
        .args(["--token-file", s(&t.path().join("daemon.token")), "--state-dir", s(&state)])
        // Jobs read and write beside the daemon's root; CI runs as root.
        .args(["--job-root", s(t.path()), "--allow-root-transfers"])
        // The child's watch state lands under this HOME, not the user's.
        .env("HOME", t.path())
        .env_remove("XDG_STATE_HOME")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the service", Duration::from_secs(20), || std::net::TcpStream::connect(("127.0.0.1", http)).is_ok() && state.join("admin.token").exists());
    let admin = fs::read_to_string(state.join("admin.token")).unwrap().trim().to_string();
    let cli = |token: &str, args: &[&str]| {
        let mut cmd = Command::new(tern_bin());
        cmd.args(args).env("TERN_SERVER", format!("https://127.0.0.1:{http}")).env("TERN_TOKEN", token).env("TERN_CA_FILE", state.join("tls/cert.pem")).stdin(Stdio::null());
        let out = run_bounded(cmd, Duration::from_secs(60));
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).trim().to_string(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let hooks = t.path().join("hooks.txt");
    let hook = format!("echo \"$TERN_UNIT_NAME\" >> {}", s(&hooks));
    let args = ["submit", "--watch", s(&src), s(&dst), "--ready", "marker:*.done", "--until", "END", "--in-order", "--on-arrival", &hook];
    let (_, transfer_token, _) = cli(&admin, &["token", "create", "--scope", "transfer"]);
    let (code, _, err) = cli(&transfer_token, &args);
    assert_ne!(code, 0);
    assert!(err.contains("needs an admin token"), "{err}");
    let (code, id, err) = cli(&admin, &args);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(&admin, &["wait", &id, "--timeout", "60"]);
    assert_eq!(code, 0, "{err}");
    let (_, status, _) = cli(&admin, &["status", &id, "--json"]);
    let job: Value = serde_json::from_str(&status).unwrap();
    let _ = svc.kill();
    let _ = svc.wait();
    assert_eq!(job["summary"]["units"], 3, "{job}");
    assert!(job["progress"]["watch"]["backlog_units"].is_u64(), "watch fields reach the API: {job}");
    assert_eq!(lines_of(&hooks), vec!["snap_0", "snap_1", "snap_2"]);
    for i in 0..3 {
        assert_same_tree(&src.join(format!("snap_{i}")), &dst.join(format!("snap_{i}")));
    }
}

/// `tern watch SRC tern://host/newdir`: the destination is made once, as for a local one, and
/// every unit lands inside it (was: every unit failed 'cannot create directory').
#[test]
fn a_daemon_destination_that_does_not_exist_yet_is_made() {
    let t = scratch();
    let (src, root, state) = (t.path().join("src"), t.path().join("root"), t.path().join("state"));
    fs::create_dir_all(&root).unwrap();
    for i in 0..2u64 {
        snapshot_dir(&src.join(format!("snap_{i}")), 40 + i, 2, 10_000);
        fs::write(src.join(format!("snap_{i}.done")), b"").unwrap();
    }
    fs::write(src.join("END"), b"").unwrap();
    let token = t.path().join("token");
    let d = Daemon::start(&root, &token);
    let w = Watch::start(&[s(&src), &d.url("newdir"), "--token-file", s(&token), "--ready", "marker:*.done", "--until", "END", "--state-dir", s(&state)], &[]);
    let (ok, summary, _) = w.finish(Duration::from_secs(60));
    assert!(ok, "{summary}");
    for i in 0..2 {
        assert_same_tree(&src.join(format!("snap_{i}")), &root.join(format!("newdir/snap_{i}")));
    }
}
