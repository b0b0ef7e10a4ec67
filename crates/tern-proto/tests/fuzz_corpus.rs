//! The fuzz targets on stable: every target's body (`fuzz/src/lib.rs`) over its committed corpus
//! (`fuzz/corpus/NAME/`), on every `cargo test`. libFuzzer itself needs nightly; `scripts/fuzz.sh`
//! runs it where nightly and cargo-fuzz exist (fuzz/README.md).
//!
//! The seeds are real encodings written by `write_seed_corpus` below:
//!   cargo test -p tern-proto --test fuzz_corpus -- --ignored write_seed_corpus

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped
// A test reading and writing the committed corpus; the library itself stays free of I/O.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

#[allow(unreachable_pub, dead_code)]
#[path = "../../../fuzz/src/lib.rs"]
mod bodies;

use std::path::{Path, PathBuf};

use tern_proto::data::{CHUNK, ChunkHeader, DataHello};
use tern_proto::filter::FilterRule;
use tern_proto::frame::FrameHeader;
use tern_proto::journal::{JournalHeader, encode_record};
use tern_proto::msg::{FS_FORCE, FS_RECURSIVE, FsEntry, FsKind, FsOp, PlanAction, Role, SkipReason, Summary, WantFile};
use tern_proto::{Control, Entry, EntryKind, Options, Side, TestWhat};

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target)
}

#[test]
fn every_target_passes_its_committed_corpus() {
    for &(target, body) in bodies::TARGETS {
        let dir = corpus_dir(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).map(|e| e.unwrap().path()).collect();
        files.sort();
        assert!(files.len() >= 10, "{}: only {} seeds", dir.display(), files.len());
        for f in files {
            let data = std::fs::read(&f).unwrap();
            // A panic names the input, so a failure here is one `cargo fuzz run NAME FILE` away.
            eprintln!("{target}: {}", f.display());
            body(&data);
        }
    }
}

/// The seeds, by target: name and bytes.
fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut add = |target: &'static str, name: &str, bytes: Vec<u8>| out.push((target, name.to_string(), bytes));

    // control_frames: one encoded message per file (the first byte, the frame length's top byte,
    // is 0: fed whole), and a few conversations split at a chosen byte.
    let mut opts = Options { flags: 0, chunk_size: 4 << 20, streams: 8, concurrency: 100 };
    opts.set_preserve(true);
    opts.set_delete(true);
    opts.set_safe_links(true);
    let file =
        Entry { id: 1, kind: EntryKind::File, path: b"run1/a.h5".to_vec(), size: 5 << 20, mode: 0o100644, mtime_s: 1_700_000_000, mtime_ns: 12, target: vec![], hash: Some([7; 32]), stripe: None };
    let msgs = vec![
        ("hello", Control::Hello { min_version: 1, max_version: 1, features: 0xff }),
        ("auth", Control::Auth { nonce: [1; 32], proof: [2; 32] }),
        ("open", Control::Open { server_role: Role::Receiver, options: opts, sources: vec![b"data/run1".to_vec(), b"\xffb".to_vec()], destination: b"/dst".to_vec() }),
        ("ready", Control::Ready { session_id: [3; 16], data_addr: b"[::1]:7700".to_vec(), nonce: [4; 32], cert_pin: None }),
        (
            "entries",
            Control::Entries(vec![
                file.clone(),
                Entry { id: 2, kind: EntryKind::Dir, path: b"run1/sub".to_vec(), size: 0, mode: 0o40755, mtime_s: 0, mtime_ns: 0, target: vec![], hash: None, stripe: None },
                Entry { id: 3, kind: EntryKind::Symlink, path: b"run1/l".to_vec(), size: 0, mode: 0o120777, mtime_s: -5, mtime_ns: 7, target: b"../run1/a.h5".to_vec(), hash: None, stripe: None },
                Entry { id: 4, kind: EntryKind::HardLink, path: b"run1/second".to_vec(), size: 5, mode: 0o100644, mtime_s: 1, mtime_ns: 0, target: b"run1/a.h5".to_vec(), hash: None, stripe: None },
            ]),
        ),
        ("entries-root-file", Control::Entries(vec![Entry { path: vec![], ..file.clone() }])),
        ("manifest-end", Control::ManifestEnd { files: 4, bytes: 5 << 20 }),
        ("want", Control::Want(vec![WantFile { id: 1, ranges: vec![(0, 3), (7, 1)] }, WantFile { id: 9, ranges: vec![] }])),
        ("skip", Control::Skip(vec![(1, SkipReason::Identical), (2, SkipReason::DryRun)])),
        ("file-end", Control::FileEnd { id: 1, file_hash: [5; 32], size: 10, mtime_s: 11, mtime_ns: 12 }),
        ("file-done", Control::FileDone(vec![1, 2, 3])),
        ("file-error", Control::FileError { id: 4, side: Side::Destination, message: "no space left on device".into() }),
        ("chunk-bad", Control::ChunkBad { id: 4, chunk: 2 }),
        ("stream-reset", Control::StreamReset { index: 3, received: 12 }),
        ("resending", Control::Resending { index: 3, chunks: 5, bytes: 5 << 22 }),
        ("record-bad", Control::RecordBad { index: 1, seq: 1 << 40 }),
        ("summary", Control::Summary(Summary { files_done: 1, files_failed: 2, bytes_written: 3, chunks_resent: 4, bytes_resent: 5, deleted: 6 })),
        ("fatal", Control::Fatal { side: Side::Network, message: "connection reset".into() }),
        ("plan", Control::Plan { action: PlanAction::Delete, path: b"old/x".to_vec() }),
        ("bye", Control::Bye),
        ("stream-count", Control::StreamCount(12)),
        ("hook", Control::Hook { name: "analyze".into(), path: b"/incoming/snap_003".to_vec() }),
        ("hook-done", Control::HookDone { status: -1, output: "killed".into() }),
        ("dial", Control::Dial { addr: b"[2001:db8::7]:7700".to_vec(), session_id: [6; 16], ticket: [7; 32] }),
        ("filters", Control::Filters(vec![FilterRule::include("*/"), FilterRule::include("*.h5"), FilterRule::exclude("/run*/**/*.tmp"), FilterRule::exclude("*")])),
        ("file-list", Control::FileList(vec![b"run1/a.h5".to_vec(), b"d/\xff name".to_vec()])),
        ("listening", Control::Listening { data_addr: b"192.0.2.7:50001".to_vec() }),
        ("fs-request", Control::FsRequest { op: FsOp::Remove, flags: FS_RECURSIVE | FS_FORCE, path: b"/data/\xffold".to_vec() }),
        ("fs-glob", Control::FsRequest { op: FsOp::Glob, flags: 0, path: b"run_??/*.h5".to_vec() }),
        (
            "fs-entries",
            Control::FsEntries(vec![
                FsEntry { kind: FsKind::Symlink, name: b"sub/l".to_vec(), size: 3, mode: 0o120777, mtime_s: -1, mtime_ns: 999_999_999, target: b"../x".to_vec() },
                FsEntry { kind: FsKind::File, name: b"a.h5".to_vec(), size: 1 << 40, mode: 0o100644, mtime_s: 1_700_000_000, mtime_ns: 0, target: vec![] },
            ]),
        ),
        ("fs-end", Control::FsEnd { count: 2 }),
        ("test-request", Control::TestRequest { path: b"/data/run".to_vec(), flags: 0, streams: 8, chunk_size: 1 << 20 }),
        ("test-step", Control::TestStep { what: TestWhat::Carry, count: 8, millis: 3000 }),
        ("test-result", Control::TestResult { what: TestWhat::Write, skipped: true, bytes: 0, micros: 0, note: "not writable".into() }),
    ];
    for (name, m) in &msgs {
        add("control_frames", name, m.encode());
    }
    // Conversations: the client's opening, the sender's manifest, the receiver's answers; the
    // first byte (after a leading pad byte) decides where the decoder's input is split.
    let convo = |names: &[&str]| -> Vec<u8> { names.iter().flat_map(|n| msgs.iter().find(|(m, _)| m == n).unwrap().1.encode()).collect() };
    for (name, parts, split) in
        [("convo-client", &["hello", "auth", "open"][..], 0u8), ("convo-manifest", &["entries", "manifest-end"][..], 37), ("convo-receiver", &["want", "skip", "file-done", "summary", "bye"][..], 200)]
    {
        let mut b = convo(parts);
        if split != 0 {
            b.insert(0, split);
        }
        add("control_frames", name, b);
    }

    // data_frames: chunk-size selector, a frame header, then a hello or a chunk header.
    let hello = DataHello { session_id: [9; 16], stream: 3, nonce: [1; 32], proof: [2; 32] };
    let chunk = ChunkHeader { flags: 1, file_id: 7, index: 2, offset: 2 << 22, hash: [3; 32], tag: [4; 32] };
    for sel in 0..4u8 {
        add("data_frames", &format!("hello-{sel}"), [&[sel][..], &hello.encode()].concat());
        for (i, data_len) in [0usize, 1, 16 << 10, 64 << 10, (64 << 10) + 1].into_iter().enumerate() {
            let head = FrameHeader::encode(CHUNK, ChunkHeader::LEN + data_len + 16 * (i % 2));
            add("data_frames", &format!("chunk-{sel}-{i}"), [&[sel][..], &head, &chunk.encode(), &[0xab; 8]].concat());
        }
    }

    // journal: real journals, complete, torn, corrupt, with repeats and out-of-range records.
    let h = JournalHeader { size: (5 << 20) + 17, mtime_s: 1_700_000_000, mtime_ns: 123, chunk_size: 1 << 20 };
    let rec = |i: u64| encode_record(i, &[i as u8 ^ 0x5a; 32]);
    let j = |records: &[u64]| -> Vec<u8> { [&h.encode()[..], &records.iter().flat_map(|&i| rec(i)).collect::<Vec<_>>()].concat() };
    add("journal", "header-only", h.encode().to_vec());
    add("journal", "complete", j(&[0, 1, 2, 3, 4, 5]));
    add("journal", "out-of-order", j(&[3, 0, 5, 1]));
    add("journal", "repeats", j(&[2, 2, 0, 2]));
    add("journal", "past-last-chunk", j(&[0, 6, 1]));
    let torn = j(&[0, 1, 2]);
    add("journal", "torn-tail", torn[..torn.len() - 20].to_vec());
    add("journal", "torn-header", h.encode()[..30].to_vec());
    let mut flipped = j(&[0, 1, 2]);
    flipped[40 + 48 + 5] ^= 4;
    add("journal", "flipped-record", flipped);
    let mut bad_head = j(&[0]);
    bad_head[12] ^= 1;
    add("journal", "flipped-header", bad_head);
    add("journal", "zero-chunk-size", JournalHeader { chunk_size: 0, ..h }.encode().to_vec());
    add("journal", "huge-size", [&JournalHeader { size: u64::MAX, chunk_size: 1, ..h }.encode()[..], &encode_record(u64::MAX - 1, &[1; 32])].concat());
    add("journal", "empty-file", [&JournalHeader { size: 0, ..h }.encode()[..], &rec(0), &rec(1)].concat());
    add("journal", "min-chunks", [&JournalHeader { chunk_size: 64 << 10, ..h }.encode()[..], &(0..12).flat_map(rec).collect::<Vec<_>>()].concat());
    // The raw-field form the target also reads (check bytes recomputed): header fields, a selector,
    // padding, then 40-byte records.
    for (name, size, chunk, sel, idx) in
        [("raw-small", 300u64, 64u32, 0u8, &[0u64, 1, 4, 5, 1][..]), ("raw-mod", 4096, 7, 1, &[0, 3, 3, 17][..]), ("raw-shift", 1 << 40, 1 << 20, 2, &[0, 1 << 19][..])]
    {
        let mut b = [&size.to_be_bytes()[..], &7i64.to_be_bytes(), &9u32.to_be_bytes(), &chunk.to_be_bytes(), &[sel, 20, 0, 0, 0, 0, 0, 0]].concat();
        for &i in idx {
            b.extend_from_slice(&i.to_be_bytes());
            b.extend_from_slice(&[i as u8; 32]);
        }
        add("journal", name, b);
    }

    // filter_rules: rule sets as users write them, an empty line, then paths (`/` = directory).
    let paths = "run1/a.h5\nrun1/\nrun1/x/y/out/\nlogs/\na/logs\ncache/tmp/\nd/e/a.tmp\n.hidden/a.tmp";
    for (name, rules) in [
        ("hdf5-only", "+ */\n+ *.h5\n- *"),
        ("tmp", "- *.tmp"),
        ("anchored", "- /logs\n- /run*/out"),
        ("double-star", "- /run*/**/out\n+ **/keep/**"),
        ("dir-only", "- scratch/\n- cache/tmp/"),
        ("classes", "- [a-c]?.log\n- [!x]*.bak\n- *.{tmp,swp}"),
        ("escapes", "- \\*literal\n- a\\?b\n- sp ace"),
        ("long-forms", "exclude *.o\ninclude src/**\nexclude /build/"),
        ("bad-rules", "*.tmp\n- /\n- a[\n- {a,b\n+"),
        ("only-includes", "+ *\n+ /x/**/y/"),
    ] {
        add("filter_rules", name, format!("{rules}\n\n{paths}").into_bytes());
    }
    add("filter_rules", "non-utf8-paths", b"- *.tmp\n- d/\xff*\n\nd/\xff\xfe.tmp\nd/\xff/x\n\xc3(/".to_vec());
    add("filter_rules", "deep-path", [&b"- **/a/**/b\n- x/y/z\n\n"[..], &b"a/".repeat(200), b"b"].concat());

    // wire_paths: a split byte, then the link's path and its target.
    for (name, link, target) in [
        ("plain", &b"a/link"[..], &b"target"[..]),
        ("up-one", b"a/link", b"../b/target"),
        ("up-two", b"a/b/link", b"../../c"),
        ("escape", b"a/link", b"../../etc"),
        ("root-link", b"link", b"../x"),
        ("absolute", b"a/link", b"/etc/passwd"),
        ("dots", b"a/link", b"./x/../y"),
        ("dot-escape", b"a/link", b"x/../../../y"),
        ("double-slash", b"a//link", b"x//y"),
        ("hidden", b".hidden/..a", b"b../.c"),
        ("non-utf8", b"with space/\xff\xfe", b"\xff/../z"),
        ("nul", b"a\0b/l", b"x\0"),
        ("trailing-slash", b"a/", b"b/"),
        ("empty-target", b"a/l", b""),
    ] {
        add("wire_paths", name, [&[link.len() as u8][..], link, target].concat());
    }
    add("wire_paths", "long", [&[0u8][..], &b"ab/".repeat(1366)].concat());
    add("wire_paths", "dotdot-only", b"\x02..".to_vec());

    // session_machines: window and walk bytes, then operations of 4 bytes (id, number, hash
    // byte, opcode), each machine's answers reading more bytes as they need them.
    let op = |id: u8, n: u8, h: u8, code: u8| [id, n, h, code];
    let ops = |list: &[[u8; 4]]| list.concat();
    let walk_and_send =
        ops(&[op(0, 3, 0, 0), op(0, 0, 0, 1), op(0, 1, 0, 0), op(0, 0, 0, 2), op(0, 2, 0, 3), op(0, 0, 1, 9), op(0, 0, 2, 9), op(0, 0, 3, 9), op(0, 0, 0, 6), op(2, 0, 0, 6), op(0, 0, 0, 11)]);
    add("session_machines", "walk-want-send-done", [&[4, 200, 3][..], &walk_and_send].concat());
    add("session_machines", "unknown-ids", [&[1, 1, 1][..], &ops(&[op(9, 1, 0, 3), op(9, 0, 0, 4), op(9, 0, 0, 5), op(9, 0, 0, 6), op(9, 0, 0, 7), op(0xff, 0, 0, 6)])].concat());
    add("session_machines", "want-a-directory", [&[2, 9, 9][..], &ops(&[op(0, 0, 0, 1), op(0, 1, 0, 3), op(0, 0, 0, 4)])].concat());
    add("session_machines", "ranges-out-of-file", [&[2, 9, 9][..], &ops(&[op(0, 2, 0, 0), op(0, 3, 0, 3), 0xffu32.to_le_bytes(), op(0, 0xff, 0, 4)])].concat());
    add(
        "session_machines",
        "resend-and-restart",
        [
            &[2, 9, 9][..],
            &ops(&[op(0, 4, 0, 0), op(0, 1, 0, 3), op(0, 4, 0, 9), op(0, 0, 0, 9), op(0, 0, 0, 9), op(0, 0, 0, 9), op(0, 0, 0, 9), op(0, 0, 0, 8), op(0, 1, 0, 3), op(0, 1, 0, 8), op(0, 0, 0, 10)]),
        ]
        .concat(),
    );
    add(
        "session_machines",
        "read-fails-then-stale-news",
        [&[2, 9, 9][..], &ops(&[op(0, 2, 0, 0), op(0, 1, 0, 3), op(0, 0, 0, 10), op(0, 0, 0, 4), op(0, 1, 0, 3), op(0, 0, 0, 6), op(0, 0, 0, 7)])].concat(),
    );
    add("session_machines", "goodbye-early", [&[2, 9, 9][..], &ops(&[op(0, 2, 0, 0), op(0, 0, 0, 11), op(0, 0, 0, 12), op(0, 0, 0, 6)])].concat());
    let receive = ops(&[op(0, 3, 0, 13), op(0, 1, 0, 13), op(0, 0, 0, 14), op(0, 0, 5, 15), op(0, 1, 5, 15), op(0, 2, 5, 15), op(0, 2, 5, 17), op(1, 0, 2, 15), op(0, 0, 0, 20), op(0, 0, 0, 20)]);
    add("session_machines", "receive-finalize", [&[1, 255, 7][..], &receive].concat());
    add(
        "session_machines",
        "receive-hostile",
        [&[1, 1, 0][..], &ops(&[op(7, 0, 0, 15), op(0, 0, 0, 13), op(0, 9, 0, 15), op(0xff, 0, 0, 17), op(0, 0, 0, 16), op(0, 0, 0, 18), op(0, 0, 0, 19)])].concat(),
    );
    add("session_machines", "receive-mismatch-and-no-space", [&[1, 255, 3][..], &ops(&[op(0, 1, 0, 13), op(0, 0, 9, 15), op(0, 0, 0, 21), op(0, 0, 9, 15), op(0, 0, 0, 21)])].concat());
    // A stripe on each side (an odd hash byte picks one): chunks wanted inside and outside it,
    // sent, stored, ended, and the stripe's verification answered.
    let stripes = ops(&[op(0, 12, 3, 0), op(0, 1, 0, 3), op(0, 0, 1, 9), op(0, 0, 2, 9), op(0, 12, 3, 13), op(2, 2, 2, 2), op(0, 0, 5, 15), op(0, 1, 5, 15), op(0, 1, 5, 17), op(0, 0, 0, 22)]);
    add("session_machines", "stripes", [&[2, 255, 7][..], &stripes].concat());
    add("session_machines", "empty", Vec::new());
    out
}

/// Rewrites the seed files (the rest of a corpus directory, such as added crash inputs, stays).
#[test]
#[ignore = "writes fuzz/corpus; run by hand after changing the seeds"]
fn write_seed_corpus() {
    for (target, name, bytes) in seeds() {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
    }
}

/// The seeds themselves pass, whether or not the files were rewritten.
#[test]
fn seeds_pass_their_targets() {
    for (target, name, bytes) in seeds() {
        let body = bodies::TARGETS.iter().find(|t| t.0 == target).unwrap().1;
        eprintln!("{target}: seed-{name}");
        body(&bytes);
    }
}
