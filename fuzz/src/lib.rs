//! The fuzz targets' bodies, one function per target in `fuzz_targets/`.
//!
//! They live here so that the same code runs two ways: under libFuzzer (`cargo +nightly fuzz run
//! NAME`, nightly only) and, on stable, over the committed corpus in `fuzz/corpus/NAME/` on every
//! `cargo test` (`crates/tern-proto/tests/fuzz_corpus.rs` includes this file). Each body panics
//! only when a property of tern-proto is broken.

use tern_proto::data::{ChunkHeader, DataHello, chunk_data_len, max_data_frame};
use tern_proto::filter::{Filter, FilterRule, RuleKind};
use tern_proto::frame::{FrameHeader, HEADER_LEN};
use tern_proto::journal::{self, JournalHeader, RECORD_LEN, encode_record, parse_journal};
use tern_proto::path::{file_name, parent, symlink_stays_inside, validate_relative};
use tern_proto::session::{Trouble, receiver, sender};
use tern_proto::{Control, FrameDecoder, Side, limits};

/// A target's body: panics only when a property is broken.
pub type Body = fn(&[u8]);

/// Every target, by name: the corpus replay runs each over `fuzz/corpus/NAME/`.
pub const TARGETS: &[(&str, Body)] =
    &[("control_frames", control_frames), ("data_frames", data_frames), ("journal", journal), ("filter_rules", filter_rules), ("wire_paths", wire_paths), ("session_machines", session_machines)];

/// Arbitrary bytes as a control stream: every frame must decode or fail cleanly, and whatever
/// decodes must re-encode to the same message.
pub fn control_frames(data: &[u8]) {
    let mut d = FrameDecoder::new(limits::MAX_CONTROL_FRAME);
    // Feed in two pieces to exercise partial frames.
    let split = data.first().map_or(0, |&b| b as usize % (data.len() + 1));
    d.push(&data[..split]);
    let mut frames = Vec::new();
    while let Ok(Some(f)) = d.next_frame() {
        frames.push(f);
    }
    d.push(&data[split..]);
    while let Ok(Some(f)) = d.next_frame() {
        frames.push(f);
    }
    for (t, body) in frames {
        if let Ok(msg) = Control::decode(t, &body) {
            let again = msg.encode();
            let back = Control::decode(again[4], &again[5..]).expect("re-encoded message decodes");
            assert_eq!(back, msg);
        }
    }
}

/// Arbitrary bytes as a data stream: headers are bounded, chunk lengths never exceed the
/// negotiated chunk size, and hello messages decode or fail without panicking.
pub fn data_frames(data: &[u8]) {
    if data.len() < HEADER_LEN + 1 {
        return;
    }
    let chunk_size = 64 << 10 << (data[0] % 8);
    let mut head = [0u8; HEADER_LEN];
    head.copy_from_slice(&data[1..1 + HEADER_LEN]);
    let rest = &data[1 + HEADER_LEN..];
    if let Ok(h) = FrameHeader::parse(head, max_data_frame(chunk_size)) {
        for trailer in [0, 16] {
            if let Ok(n) = chunk_data_len(h, chunk_size, trailer) {
                assert!(n <= chunk_size as usize);
            }
        }
    }
    if let Ok(hello) = DataHello::decode(rest) {
        assert_eq!(DataHello::decode(&hello.encode()[HEADER_LEN..]), Ok(hello));
    }
    if rest.len() >= ChunkHeader::LEN {
        let mut bytes = [0u8; ChunkHeader::LEN];
        bytes.copy_from_slice(&rest[..ChunkHeader::LEN]);
        let hdr = ChunkHeader::decode(&bytes);
        assert_eq!(ChunkHeader::decode(&hdr.encode()), hdr);
    }
}

/// A resume journal as a crash or a local user may leave it: parsing never panics, returns at
/// most one record per chunk the header makes (each below that count, in index order), and what
/// it kept re-encodes to a journal that parses the same.
///
/// Check bytes stop mutated input at the first record, so the input is also read as raw fields
/// with the check bytes recomputed: that drives the range and repeat handling with any values.
pub fn journal(data: &[u8]) {
    check_journal(data);
    if data.len() >= 32 {
        let be = |b: &[u8]| {
            let mut a = [0u8; 8];
            a[..b.len()].copy_from_slice(b);
            u64::from_be_bytes(a) >> (8 * (8 - b.len()))
        };
        let h = JournalHeader { size: be(&data[..8]), mtime_s: be(&data[8..16]) as i64, mtime_ns: be(&data[16..20]) as u32, chunk_size: be(&data[20..24]) as u32 };
        // Small sizes and chunk sizes too, so that indexes run past the chunk count.
        let h = match data[24] % 3 {
            0 => h,
            1 => JournalHeader { size: h.size % 4096, chunk_size: h.chunk_size % 64, ..h },
            _ => JournalHeader { size: h.size >> (data[25] % 64), ..h },
        };
        let mut fixed = h.encode().to_vec();
        for raw in data[32..].chunks(40) {
            if raw.len() < 40 {
                fixed.extend_from_slice(raw);
                break;
            }
            let mut hash = [0u8; 32];
            hash.copy_from_slice(&raw[8..]);
            // The index's top byte picks a small index most of the time.
            let index = be(&raw[..8]);
            let index = if raw[0] < 0xf0 { index % 16 } else { index };
            fixed.extend_from_slice(&encode_record(index, &hash));
        }
        check_journal(&fixed);
    }
}

fn check_journal(data: &[u8]) {
    let Some((header, records)) = parse_journal(data) else {
        return;
    };
    assert_eq!(header.encode()[..], data[..journal::HEADER_LEN]);
    assert!(header.chunk_size > 0);
    let chunks = header.chunks();
    assert!(records.len() as u64 <= chunks, "{} records for {chunks} chunks", records.len());
    assert!(records.len() <= (data.len() - journal::HEADER_LEN) / RECORD_LEN);
    assert!(records.iter().all(|&(i, _)| i < chunks));
    assert!(records.windows(2).all(|w| w[0].0 < w[1].0), "records not one per chunk in order");
    let mut again = header.encode().to_vec();
    for (i, h) in &records {
        again.extend_from_slice(&encode_record(*i, h));
    }
    assert_eq!(parse_journal(&again), Some((header, records)));
}

/// Most rules and paths one input carries: bounds the work per input (matching is linear in the
/// rules and, for rules with a `/`, quadratic in a path's components).
pub const MAX_FUZZ_RULES: usize = 16;
pub const MAX_FUZZ_PATHS: usize = 8;

/// Rule text, an empty line, then paths (one a line, a trailing `/` for a directory): rules parse
/// or are refused, compile or are refused, and every path is decided without a panic. Rules print
/// back to what they parse from, and rules that only include never exclude.
pub fn filter_rules(data: &[u8]) {
    let (rule_text, paths) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (data, &b""[..]),
    };
    let text = String::from_utf8_lossy(rule_text);
    let rules: Vec<FilterRule> = text.lines().take(MAX_FUZZ_RULES).filter_map(|l| FilterRule::parse(l).ok()).collect();
    for r in &rules {
        assert_eq!(FilterRule::parse(&r.to_string()).as_ref(), Ok(r));
    }
    let Ok(filter) = Filter::new(&rules) else { return };
    assert_eq!(filter.is_empty(), rules.is_empty());
    let only_includes = rules.iter().all(|r| r.kind == RuleKind::Include);
    for line in paths.split(|&b| b == b'\n').take(MAX_FUZZ_PATHS) {
        let (path, dir) = match line.strip_suffix(b"/") {
            Some(p) => (p, true),
            None => (line, false),
        };
        if path.len() > limits::MAX_PATH {
            continue;
        }
        for is_dir in [dir, !dir] {
            let excluded = filter.excludes(path, is_dir);
            if only_includes || path.is_empty() {
                assert!(!excluded, "excluded {:?} with {rules:?}", String::from_utf8_lossy(path));
            }
        }
    }
}

/// Paths from the wire: whatever `validate_relative` accepts is relative, bounded, and has no
/// empty, `.` or `..` component and no NUL; `symlink_stays_inside` never panics and agrees with
/// a lexical resolution of the target. Input: one byte picking where the link's path ends, then
/// the link's path and the target.
pub fn wire_paths(data: &[u8]) {
    let Some((&k, rest)) = data.split_first() else { return };
    let (link, target) = rest.split_at(k as usize % (rest.len() + 1));
    for p in [rest, link, target] {
        if validate_relative(p).is_err() {
            continue;
        }
        assert!(p.len() <= limits::MAX_PATH);
        if p.is_empty() {
            continue;
        }
        assert!(p[0] != b'/' && !p.contains(&0));
        assert!(p.split(|&b| b == b'/').all(|c| !matches!(c, b"" | b"." | b"..")), "accepted {:?}", String::from_utf8_lossy(p));
        // The last component and its parent put it back together, and the parent is valid too.
        let (dir, name) = (parent(p), file_name(p));
        assert!(!name.is_empty());
        let back = if dir.is_empty() { name.to_vec() } else { [dir, b"/", name].concat() };
        assert_eq!(back, p);
        assert!(validate_relative(dir).is_ok());
    }
    let inside = symlink_stays_inside(link, target);
    if !link.is_empty() && validate_relative(link).is_ok() {
        assert_eq!(inside, resolves_inside(parent(link), target), "link {:?} -> {:?}", String::from_utf8_lossy(link), String::from_utf8_lossy(target));
    }
}

/// `target` resolved lexically from the directory `dir` (a valid relative path) stays at or
/// below the root.
fn resolves_inside(dir: &[u8], target: &[u8]) -> bool {
    if target.is_empty() || target[0] == b'/' || target.contains(&0) {
        return false;
    }
    let mut depth = dir.split(|&b| b == b'/').filter(|c| !c.is_empty()).count();
    for c in target.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." if depth == 0 => return false,
            b".." => depth -= 1,
            _ => depth += 1,
        }
    }
    true
}

/// Reads the fuzzer's bytes as numbers; past the end, zeros.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }
    /// Small numbers mostly (ids, chunk indexes), with a byte of 0xff meaning a huge one.
    fn num(&mut self) -> u64 {
        match self.u8() {
            0xff => u64::MAX - u64::from(self.u8()),
            b => u64::from(b % 16),
        }
    }
}

const FUZZ_CHUNK: u32 = 8;

/// A stripe of a `size`-byte file as the drivers pass one on (chunk-aligned, a part of a file of
/// several chunks), picked by `pick` and `n`; `None` when `pick` is even.
fn fuzz_stripe(size: u64, pick: u8, n: u64) -> Option<(u64, u64)> {
    let chunks = size.div_ceil(u64::from(FUZZ_CHUNK)).max(1);
    if pick & 1 == 0 || chunks < 2 {
        return None;
    }
    let first = u64::from(pick >> 1) % (chunks - 1);
    let mut end = first + 1 + n % (chunks - first);
    if first == 0 && end == chunks {
        end -= 1;
    }
    Some((first, end))
}

/// Both session machines, each driven as its engine driver does (every action answered as the
/// contract says) and fed arbitrary messages from a hostile peer: ids never announced or long
/// finished, chunks outside files, wants, resends, ends, errors and goodbyes in any order. A
/// refusal is fine; a panic (an assertion on a transition, an overflow) or broken bookkeeping
/// (`check_invariants` after every input) is a bug.
pub fn session_machines(data: &[u8]) {
    let mut b = Bytes(data);
    let files_ahead = 1 + u64::from(b.u8() % 8);
    let mut s: sender::Sender<u64> = sender::Sender::new(FUZZ_CHUNK, files_ahead);
    let bytes = 1 + u64::from(b.u8());
    // One byte, as before: files in flight, and of those the ones holding descriptors.
    let w = b.u8();
    let files = 1 + usize::from(w % 8);
    let mut r: receiver::Receiver<u64> = receiver::Receiver::new(receiver::Window { bytes, files, held: 1 + usize::from(w / 8) % files }, FUZZ_CHUNK);
    let (mut next_id, mut announced_r) = (0u64, 0u64);
    let mut sizes_r: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    let mut reads: Vec<sender::Read> = Vec::new();
    let mut finalizing: Vec<u64> = Vec::new();
    // Stripes verified: the driver only closes their parts and answers `finalized`.
    let mut stripes: Vec<u64> = Vec::new();
    let mut steps = 0;
    while !b.0.is_empty() && steps < 4096 {
        steps += 1;
        let (id, n) = (b.num(), b.num());
        let hash = [b.u8(); 32];
        match b.u8() % 24 {
            // The sending side: its walk, its workers' answers, the hostile receiver's messages.
            0 if s.may_announce() => {
                s.announce_stripe(next_id, (n % 64) * 5, fuzz_stripe((n % 64) * 5, hash[0], n), next_id);
                next_id += 1;
            }
            1 => {
                s.announce_other(next_id, next_id);
                next_id += 1;
            }
            2 => s.walk_done(),
            3 => {
                let ranges: Vec<(u64, u32)> = (0..n % 4).map(|_| (b.num(), b.num() as u32)).collect();
                let _ = s.want(id, &ranges);
            }
            4 => {
                let _ = s.ask_again(id, n);
            }
            5 => {
                let _ = s.skip(id);
            }
            6 => {
                let _ = s.file_done(id);
            }
            7 => {
                let _ = s.peer_failed(id, Side::Destination, String::new());
            }
            8 if !reads.is_empty() => {
                // A reset stream's frame: its first read answered or still to be (count it in
                // again), or never to be answered (the worker saw the reset).
                let rd = reads.remove(id as usize % reads.len());
                let answered_later = n % 2 == 0;
                if answered_later {
                    reads.push(rd);
                }
                let _ = s.resend(rd.id, rd.chunk, answered_later);
            }
            9 if !reads.is_empty() => {
                let rd = reads.remove(id as usize % reads.len());
                s.chunk_sent(rd.id, rd.chunk, hash);
            }
            10 if !reads.is_empty() => {
                let rd = reads.remove(id as usize % reads.len());
                s.read_failed(rd.id, sender::ReadTrouble::Changed, String::new());
            }
            11 => s.summary(),
            12 => s.peer_ended(),
            // The receiving side: the hostile sender's entries, chunks and messages.
            13 => {
                r.announce(receiver::FileSpec { id: announced_r, size: (n % 64) * 5, mtime: (0, 0), stripe: fuzz_stripe((n % 64) * 5, hash[0], n) }, announced_r);
                sizes_r.insert(announced_r, (n % 64) * 5);
                announced_r += 1;
            }
            14 => r.manifest_end(),
            15 => {
                let _ = r.chunk_stored(id, n, hash, hash[0] % 2 == 0);
            }
            16 => r.chunk_corrupt(id, n),
            17 => {
                let _ = r.file_end(id, hash, (n % 64) * 5, (0, 0));
            }
            18 => r.peer_failed(id, Side::Source, String::new()),
            19 => r.write_failed(id, if n == 0 { Trouble::NoSpace } else { Trouble::Other }, String::new()),
            20 if !finalizing.is_empty() => r.finalized(finalizing.remove(id as usize % finalizing.len())),
            21 if !finalizing.is_empty() => {
                let trouble = [Trouble::WholeFileMismatch, Trouble::NoSpace, Trouble::Other][n as usize % 3];
                r.finalize_failed(finalizing.remove(id as usize % finalizing.len()), trouble, String::new());
            }
            22 if !stripes.is_empty() => r.finalized(stripes.remove(id as usize % stripes.len())),
            _ => {}
        }
        while let Some(a) = s.poll_action() {
            match a {
                sender::Action::Read(rd) => reads.push(rd),
                sender::Action::FileEnd { .. } | sender::Action::PeerError { .. } | sender::Action::Finish | sender::Action::Stop(_) => {}
                sender::Action::Done { id, payload, .. } => assert_eq!(id, payload),
            }
            s.check_invariants();
        }
        s.check_invariants();
        let mut stopped = false;
        while let Some(a) = r.poll_action() {
            match a {
                receiver::Action::Prepare { id, .. } => match b.u8() % 5 {
                    0 => r.prepare_failed(id, Trouble::ResourceLimit, String::new()),
                    1 => r.prepare_failed(id, Trouble::Other, String::new()),
                    // The store proves sealed chunks (all of them, or all but the last few):
                    // a file published with nothing asked, or an ordinary resume.
                    2 => {
                        let chunks = tern_proto::chunk::chunk_count(sizes_r[&id], FUZZ_CHUNK);
                        let held = chunks.saturating_sub(u64::from(b.u8() % 3));
                        r.prepared_sealed(id, (0..held).filter(|_| chunks > 1).map(|i| (i, [i as u8; 32])).collect());
                    }
                    _ => r.prepared(id, []),
                },
                receiver::Action::Finalize { id, .. } => finalizing.push(id),
                receiver::Action::StripeVerified { id, .. } => stripes.push(id),
                receiver::Action::Done { id, payload, .. } => assert_eq!(id, payload),
                receiver::Action::Stop { .. } => stopped = true,
                receiver::Action::Want(_) | receiver::Action::AskAgain { .. } | receiver::Action::Abandon { .. } | receiver::Action::Wait(_) | receiver::Action::Throttled { .. } => {}
            }
            r.check_invariants();
        }
        if stopped {
            // After Stop the engine ends the session: nothing more is fed.
            break;
        }
    }
}
