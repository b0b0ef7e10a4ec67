//! The one suite every `Sink` passes (after restic's `internal/backend/test/suite.go` and rclone's
//! `fstest/fstests`). `run(make)` calls `make` for a fresh, empty store per test; the `Harness`
//! beside it does what only another process or a failing disk could (plant a link, corrupt data
//! behind the journal's back) and reads what the trait does not expose.

use super::{EntryType, Kind, Meta, Part, PartSpec, Sink, StoreError};
use crate::faults::chunk_hash;

/// What a test needs besides the trait, per store.
pub(crate) trait Harness {
    /// A published regular file's bytes (`None`: absent, or not a regular file).
    fn read_file(&self, rel: &[u8]) -> Option<Vec<u8>>;
    /// Overwrites bytes of `rel`'s partial file without touching its journal (a disk that lost
    /// or garbled writes the journal still names).
    fn corrupt_part(&self, rel: &[u8], offset: u64, data: &[u8]);
    /// A symlink made behind the store's back (another session, another user), unchecked.
    fn plant_symlink(&self, rel: &[u8], target: &[u8]);
    /// The store's own marker in directory `dir` (what `layout.rs` leaves), if it keeps any.
    fn plant_marker(&self, dir: &[u8]);
    /// Nothing outside the root was created, changed or removed.
    fn outside_untouched(&self) -> bool;
}

pub(crate) fn spec(size: u64, chunk_size: u32) -> PartSpec {
    PartSpec { size, mtime: (1_700_000_000, 5), chunk_size, resume: true, stripe: None, fresh_dir: false }
}

/// A named test of the suite.
type Case<S, H> = (&'static str, fn(&S, &H));

/// Runs every test on fresh stores from `make`.
pub(crate) fn run<S: Sink, H: Harness>(make: impl Fn() -> (S, H)) {
    let tests: &[Case<S, H>] = &[
        ("writes_out_of_order_read_back", writes_out_of_order_read_back),
        ("nothing_under_the_final_name_before_publish", nothing_under_the_final_name_before_publish),
        ("list_hides_the_stores_own_names", list_hides_the_stores_own_names),
        ("resume_claims_only_what_the_data_proves", resume_claims_only_what_the_data_proves),
        ("resume_for_another_source_claims_nothing", resume_for_another_source_claims_nothing),
        ("abandon_leaves_nothing", abandon_leaves_nothing),
        ("invalid_paths_are_refused", invalid_paths_are_refused),
        ("escaping_symlinks_are_refused", escaping_symlinks_are_refused),
        ("remove_tree_never_follows_a_link", remove_tree_never_follows_a_link),
        ("publish_replaces_a_file_and_refuses_a_directory", publish_replaces_a_file_and_refuses_a_directory),
        ("holes_read_back_as_zeros", holes_read_back_as_zeros),
        ("two_writers_on_one_part", two_writers_on_one_part),
        ("directories_links_and_metadata", directories_links_and_metadata),
        ("stripes_share_one_part_and_write_disjoint_chunks", stripes_share_one_part_and_write_disjoint_chunks),
        ("seals_survive_a_reopen_and_are_reported", seals_survive_a_reopen_and_are_reported),
        ("a_seal_that_does_not_add_up_or_is_rewritten_seals_nothing", a_seal_that_does_not_add_up_or_is_rewritten_seals_nothing),
        ("a_part_in_a_fresh_directory_is_fresh_and_resumable", a_part_in_a_fresh_directory_is_fresh_and_resumable),
        ("a_part_written_whole_publishes_with_its_metadata", a_part_written_whole_publishes_with_its_metadata),
        ("a_verified_finish_refuses_what_storage_garbled", a_verified_finish_refuses_what_storage_garbled),
        ("a_hard_link_reads_the_same_bytes_and_again_is_a_no_op", a_hard_link_reads_the_same_bytes_and_again_is_a_no_op),
        ("a_hard_link_refuses_a_directory_and_a_target_not_a_file", a_hard_link_refuses_a_directory_and_a_target_not_a_file),
        ("a_hard_link_through_an_escaping_symlink_is_refused", a_hard_link_through_an_escaping_symlink_is_refused),
        ("hash_file_is_the_whole_file_hash_of_what_was_published", hash_file_is_the_whole_file_hash_of_what_was_published),
    ];
    for (name, test) in tests {
        let (sink, harness) = make();
        // A failure names the test; the panic's own message says what broke.
        tracing::debug!("conformance: {name}");
        test(&sink, &harness);
    }
}

/// Chunk `i` of a test file: distinct, never all zero.
fn chunk(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 31 + j * 7 + 1) as u8 | 1).collect()
}

fn content(sp: &PartSpec) -> Vec<u8> {
    let n = tern_proto::chunk::chunk_count(sp.size, sp.chunk_size);
    (0..n).flat_map(|i| chunk(i, tern_proto::chunk::chunk_range(sp.size, sp.chunk_size, i).1 as usize)).collect()
}

/// Writes (and records) chunks `which` of `content(sp)`.
fn write_chunks<P: Part>(p: &P, sp: &PartSpec, which: impl IntoIterator<Item = u64>) {
    let data = content(sp);
    for i in which {
        let (off, len) = tern_proto::chunk::chunk_range(sp.size, sp.chunk_size, i);
        let bytes = &data[off as usize..(off + len as u64) as usize];
        p.write_at(off, bytes).unwrap();
        p.record_chunk(i, &chunk_hash(bytes)).unwrap();
    }
}

/// A whole file published under `rel` with `data`, one chunk.
fn put<S: Sink>(s: &S, rel: &[u8], data: &[u8]) {
    let (p, _) = s.open_part(rel, &spec(data.len() as u64, data.len().max(1) as u32)).unwrap();
    p.write_at(0, data).unwrap();
    p.finish(&Meta::default()).unwrap();
    s.barrier().unwrap();
    p.publish().unwrap();
}

fn names<S: Sink>(s: &S, rel: &[u8]) -> Vec<(String, bool)> {
    s.list(rel).unwrap().into_iter().map(|(n, d)| (String::from_utf8_lossy(&n).into_owned(), d)).collect()
}

fn kind<T>(r: Result<T, StoreError>) -> Kind {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.kind,
    }
}

fn writes_out_of_order_read_back<S: Sink, H: Harness>(s: &S, h: &H) {
    s.mkdir_all(b"d").unwrap();
    let sp = spec(4 * 4096 + 100, 4096);
    let (p, resume) = s.open_part(b"d/f", &sp).unwrap();
    assert!(resume.chunks.is_empty() && resume.fresh);
    write_chunks(&p, &sp, [4, 2, 0, 3, 1]);
    let want = content(&sp);
    let mut got = vec![0u8; want.len()];
    p.read_at(0, &mut got).unwrap();
    assert_eq!(got, want);
    assert!(p.read_at(sp.size - 10, &mut [0u8; 11]).is_err(), "a read past the size is refused");
    p.finish(&Meta { mode: Some(0o640), mtime: Some((1_600_000_000, 7)) }).unwrap();
    s.barrier().unwrap();
    p.publish().unwrap();
    assert_eq!(h.read_file(b"d/f").unwrap(), want);
    let st = s.stat(b"d/f").unwrap().unwrap();
    assert_eq!((st.kind, st.size, st.mode, st.mtime), (EntryType::File, sp.size, 0o640, (1_600_000_000, 7)));
    assert!(p.write_at(0, b"x").is_err(), "a published part's handle is spent");
}

fn nothing_under_the_final_name_before_publish<S: Sink, H: Harness>(s: &S, h: &H) {
    put(s, b"old", b"before");
    let sp = spec(3 * 64, 64);
    let (p, _) = s.open_part(b"old", &sp).unwrap();
    let (q, _) = s.open_part(b"new", &sp).unwrap();
    for part in [&p, &q] {
        write_chunks(part, &sp, 0..3);
        part.finish(&Meta::default()).unwrap();
    }
    s.barrier().unwrap();
    assert_eq!(h.read_file(b"old").unwrap(), b"before");
    assert!(s.stat(b"new").unwrap().is_none() && h.read_file(b"new").is_none());
    assert_eq!(names(s, b""), [("old".to_string(), false)]);
    assert!(q.publish().is_ok() && p.publish().is_ok());
    assert_eq!(h.read_file(b"old").unwrap(), content(&sp));
    assert_eq!(h.read_file(b"new").unwrap(), content(&sp));
}

fn list_hides_the_stores_own_names<S: Sink, H: Harness>(s: &S, h: &H) {
    s.mkdir_all(b"sub/deeper").unwrap();
    put(s, b"sub/a", b"a");
    let sp = spec(4 * 64, 64);
    let (p, _) = s.open_part(b"sub/b", &sp).unwrap();
    write_chunks(&p, &sp, [1, 3]);
    let (one, _) = s.open_part(b"c", &spec(10, 64)).unwrap();
    one.write_at(0, b"0123456789").unwrap();
    h.plant_marker(b"");
    h.plant_marker(b"sub");
    assert_eq!(names(s, b""), [("sub".to_string(), true)]);
    assert_eq!(names(s, b"sub"), [("a".to_string(), false), ("deeper".to_string(), true)]);
    assert_eq!(names(s, b"sub/deeper"), []);
    assert_eq!(kind(s.list(b"sub/a")), Kind::Conflict, "not a directory");
    assert_eq!(kind(s.list(b"nope")), Kind::NotFound);
}

fn resume_claims_only_what_the_data_proves<S: Sink, H: Harness>(s: &S, h: &H) {
    let sp = spec(5 * 4096 + 1, 4096);
    {
        let (p, _) = s.open_part(b"f", &sp).unwrap();
        write_chunks(&p, &sp, [0, 1, 2, 4]);
        // A record for a chunk whose data never arrived (a journal that outlived its data).
        p.record_chunk(3, &chunk_hash(&chunk(3, 4096))).unwrap();
        // A record with the wrong hash, and one past the end.
        p.record_chunk(5, &[7; 32]).unwrap();
        p.record_chunk(99, &[7; 32]).unwrap();
    }
    // The disk garbled chunk 1 behind the journal's back.
    h.corrupt_part(b"f", 4096 + 10, b"garbage");
    if !s.features().resumable {
        return;
    }
    let (p, resume) = s.open_part(b"f", &sp).unwrap();
    let want = content(&sp);
    let proven: Vec<(u64, [u8; 32])> = [0u64, 2, 4].iter().map(|&i| (i, chunk_hash(&want[i as usize * 4096..(i as usize * 4096 + 4096).min(want.len())]))).collect();
    assert_eq!(resume.chunks, proven, "only chunks whose data is there and matches");
    assert!(!resume.fresh);
    write_chunks(&p, &sp, [1, 3, 5]);
    p.finish(&Meta::default()).unwrap();
    s.barrier().unwrap();
    p.publish().unwrap();
    assert_eq!(h.read_file(b"f").unwrap(), want);
    // Published: nothing left to resume.
    let (p, resume) = s.open_part(b"f", &sp).unwrap();
    assert!(resume.chunks.is_empty() && resume.fresh);
    p.abandon().unwrap();
}

fn resume_for_another_source_claims_nothing<S: Sink, H: Harness>(s: &S, _h: &H) {
    let sp = spec(3 * 128, 128);
    let others = [
        PartSpec { mtime: (sp.mtime.0 + 1, sp.mtime.1), ..sp },
        PartSpec { mtime: (sp.mtime.0, sp.mtime.1 + 1), ..sp },
        PartSpec { size: sp.size + 1, ..sp },
        PartSpec { chunk_size: 64, ..sp },
        PartSpec { resume: false, ..sp },
    ];
    for other in others {
        let (p, _) = s.open_part(b"f", &sp).unwrap();
        write_chunks(&p, &sp, 0..3);
        drop(p);
        let (p, resume) = s.open_part(b"f", &other).unwrap();
        assert!(resume.chunks.is_empty() && resume.fresh, "{other:?}");
        drop(p);
        // And the earlier attempt is gone, not kept for later.
        let (p, resume) = s.open_part(b"f", &sp).unwrap();
        assert!(resume.chunks.is_empty(), "{other:?}: discarded");
        p.abandon().unwrap();
    }
}

fn abandon_leaves_nothing<S: Sink, H: Harness>(s: &S, h: &H) {
    let sp = spec(2 * 64, 64);
    let (p, _) = s.open_part(b"f", &sp).unwrap();
    write_chunks(&p, &sp, 0..2);
    p.finish(&Meta::default()).unwrap();
    p.abandon().unwrap();
    assert!(p.publish().is_err(), "an abandoned part's handle is spent");
    assert!(s.stat(b"f").unwrap().is_none() && h.read_file(b"f").is_none());
    let (_, resume) = s.open_part(b"f", &sp).unwrap();
    assert!(resume.chunks.is_empty() && resume.fresh);
}

fn invalid_paths_are_refused<S: Sink, H: Harness>(s: &S, h: &H) {
    s.mkdir_all(b"a").unwrap();
    let sp = spec(1, 64);
    for bad in [&b".."[..], b"../x", b"a/../../x", b"/x", b"/tmp/x", b"a//b", b"a/./b", b"./a", b"a/", b"a/\0b"] {
        let what = String::from_utf8_lossy(bad);
        assert_eq!(kind(s.open_part(bad, &sp)), Kind::Refused, "open_part {what}");
        assert_eq!(kind(s.mkdir_all(bad)), Kind::Refused, "mkdir_all {what}");
        assert_eq!(kind(s.stat(bad)), Kind::Refused, "stat {what}");
        assert_eq!(kind(s.list(bad)), Kind::Refused, "list {what}");
        assert_eq!(kind(s.remove_tree(bad)), Kind::Refused, "remove_tree {what}");
        assert_eq!(kind(s.symlink(bad, b"t", None)), Kind::Refused, "symlink {what}");
        assert_eq!(kind(s.set_dir_meta(bad, &Meta::default())), Kind::Refused, "set_dir_meta {what}");
        assert_eq!(kind(s.hard_link(bad, b"a", false)), Kind::Refused, "hard_link {what}");
        assert_eq!(kind(s.hard_link(b"l", bad, false)), Kind::Refused, "hard_link to {what}");
        assert_eq!(kind(s.hash_file(bad, 1, 64)), Kind::Refused, "hash_file {what}");
    }
    assert_eq!(kind(s.open_part(b"", &sp)), Kind::Refused, "the root is not a file");
    assert_eq!(kind(s.remove_tree(b"")), Kind::Refused, "the root cannot be removed");
    assert!(s.stat(b"").unwrap().is_some_and(|st| st.kind == EntryType::Dir));
    assert!(h.outside_untouched());
}

fn escaping_symlinks_are_refused<S: Sink, H: Harness>(s: &S, h: &H) {
    s.mkdir_all(b"d").unwrap();
    h.plant_symlink(b"a", b"..");
    h.plant_symlink(b"d/up", b"../..");
    h.plant_symlink(b"abs", b"/");
    let sp = spec(3, 64);
    for via in [&b"a/x"[..], b"d/up/x", b"abs/tmp/x", b"a/outside/keep"] {
        let what = String::from_utf8_lossy(via);
        assert_eq!(kind(s.open_part(via, &sp)), Kind::Refused, "open_part {what}");
        assert_eq!(kind(s.mkdir_all(via)), Kind::Refused, "mkdir_all {what}");
        assert_eq!(kind(s.symlink(via, b"t", None)), Kind::Refused, "symlink {what}");
        assert_eq!(kind(s.remove_tree(via)), Kind::Refused, "remove_tree {what}");
        assert!(s.stat(via).is_err(), "stat {what}");
    }
    for link in [&b"a"[..], b"d/up", b"abs"] {
        assert_eq!(kind(s.list(link)), Kind::Refused, "list goes through no link: {}", String::from_utf8_lossy(link));
        assert_eq!(s.stat(link).unwrap().unwrap().kind, EntryType::Symlink, "a final link is the entry itself");
    }
    assert!(h.outside_untouched());
}

fn remove_tree_never_follows_a_link<S: Sink, H: Harness>(s: &S, h: &H) {
    s.mkdir_all(b"d/e").unwrap();
    put(s, b"d/e/f", b"f");
    h.plant_symlink(b"d/out", b"../..");
    h.plant_symlink(b"d/e/in", b"..");
    h.plant_symlink(b"top", b"..");
    // A partial file in the tree goes with it.
    let (_p, _) = s.open_part(b"d/e/g", &spec(2 * 64, 64)).unwrap();
    s.remove_tree(b"top").unwrap();
    assert!(s.stat(b"top").unwrap().is_none());
    assert!(h.outside_untouched());
    s.remove_tree(b"d").unwrap();
    assert!(s.stat(b"d").unwrap().is_none());
    assert_eq!(names(s, b""), []);
    assert!(h.outside_untouched());
    s.remove_tree(b"missing").unwrap();
    s.remove_tree(b"d").unwrap();
}

fn publish_replaces_a_file_and_refuses_a_directory<S: Sink, H: Harness>(s: &S, h: &H) {
    put(s, b"f", b"first version");
    put(s, b"f", b"second");
    assert_eq!(h.read_file(b"f").unwrap(), b"second");
    s.mkdir_all(b"dir/inside").unwrap();
    let (p, _) = s.open_part(b"dir", &spec(4, 64)).unwrap();
    p.write_at(0, b"data").unwrap();
    p.finish(&Meta::default()).unwrap();
    s.barrier().unwrap();
    let e = p.publish().unwrap_err();
    assert_eq!(e.kind, Kind::Conflict);
    assert!(e.message.contains("directory"), "{e}");
    assert_eq!(s.stat(b"dir").unwrap().unwrap().kind, EntryType::Dir);
    assert_eq!(names(s, b"dir"), [("inside".to_string(), true)]);
    p.abandon().unwrap();
    let (q, _) = s.open_part(b"g", &spec(1, 64)).unwrap();
    q.write_at(0, b"g").unwrap();
    assert!(q.publish().is_err(), "publish before finish is refused");
    q.abandon().unwrap();
}

fn holes_read_back_as_zeros<S: Sink, H: Harness>(s: &S, h: &H) {
    if !s.features().sparse {
        return;
    }
    const C: u64 = 128 << 10;
    let sp = spec(4 * C + 5, C as u32);
    let (p, resume) = s.open_part(b"sparse", &sp).unwrap();
    assert!(resume.fresh);
    p.write_at(0, &vec![0u8; C as usize]).unwrap();
    p.write_at(2 * C, &chunk(2, C as usize)).unwrap();
    let mut buf = vec![1u8; C as usize];
    p.read_at(C, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "never written");
    p.finish(&Meta::default()).unwrap();
    s.barrier().unwrap();
    p.publish().unwrap();
    let got = h.read_file(b"sparse").unwrap();
    assert_eq!(got.len() as u64, sp.size);
    assert!(got[..2 * C as usize].iter().all(|&b| b == 0));
    assert_eq!(&got[2 * C as usize..3 * C as usize], &chunk(2, C as usize)[..]);
    assert!(got[3 * C as usize..].iter().all(|&b| b == 0), "a hole at the end");
}

fn two_writers_on_one_part<S: Sink, H: Harness>(s: &S, h: &H) {
    let sp = spec(6 * 64, 64);
    let (a, _) = s.open_part(b"striped", &sp).unwrap();
    write_chunks(&a, &sp, [0, 2, 4]);
    let (b, resume) = s.open_part(b"striped", &sp).unwrap();
    assert_eq!(resume.chunks.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 2, 4], "the second writer sees what the first recorded");
    write_chunks(&b, &sp, [5, 3, 1]);
    a.finish(&Meta::default()).unwrap();
    s.barrier().unwrap();
    a.publish().unwrap();
    assert_eq!(h.read_file(b"striped").unwrap(), content(&sp));
}

fn directories_links_and_metadata<S: Sink, H: Harness>(s: &S, h: &H) {
    assert!(s.mkdir_all(b"x/y").unwrap());
    assert!(!s.mkdir_all(b"x/y").unwrap());
    assert!(!s.mkdir_all(b"").unwrap());
    put(s, b"x/file", b"1");
    assert_eq!(kind(s.mkdir_all(b"x/file")), Kind::Conflict);
    assert_eq!(kind(s.mkdir_all(b"x/file/z")), Kind::Conflict);
    s.set_dir_meta(b"x/y", &Meta { mode: Some(0o750), mtime: Some((1_500_000_000, 3)) }).unwrap();
    let st = s.stat(b"x/y").unwrap().unwrap();
    assert_eq!((st.kind, st.mode, st.mtime), (EntryType::Dir, 0o750, (1_500_000_000, 3)));
    s.set_dir_meta(b"", &Meta { mode: None, mtime: Some((1_400_000_000, 0)) }).unwrap();
    assert_eq!(s.stat(b"").unwrap().unwrap().mtime, (1_400_000_000, 0));
    assert_eq!(kind(s.set_dir_meta(b"x/file", &Meta::default())), Kind::Conflict);
    s.symlink(b"x/l", b"y", Some((1_300_000_000, 0))).unwrap();
    let st = s.stat(b"x/l").unwrap().unwrap();
    assert_eq!((st.kind, st.mtime), (EntryType::Symlink, (1_300_000_000, 0)));
    s.symlink(b"x/file", b"y", None).unwrap();
    assert!(h.read_file(b"x/file").is_none(), "a link replaced the file");
    assert_eq!(kind(s.symlink(b"x/y", b"t", None)), Kind::Conflict, "never over a directory");
    assert_eq!(names(s, b"x"), [("file".to_string(), false), ("l".to_string(), false), ("y".to_string(), true)]);
    assert_eq!(kind(s.open_part(b"nodir/f", &spec(1, 64))), Kind::NotFound, "the parent must exist");
}

/// The stripe hash of chunks `first..end` of `content(sp)`.
fn stripe_hash_of(sp: &PartSpec, first: u64, end: u64) -> [u8; 32] {
    let data = content(sp);
    let hashes: Vec<[u8; 32]> = (first..end)
        .map(|i| {
            let (off, len) = tern_proto::chunk::chunk_range(sp.size, sp.chunk_size, i);
            chunk_hash(&data[off as usize..(off + len as u64) as usize])
        })
        .collect();
    tern_proto::chunk::stripe_hash(sp.size, first, &hashes)
}

/// Two stripes of one file (other sessions, other nodes) share its partial file: each joins it,
/// writes and seals only its own chunks, claims only its own on a reopen, and removes nothing
/// the other wrote; a later whole-file open finds every chunk sealed and publishes the file.
fn stripes_share_one_part_and_write_disjoint_chunks<S: Sink, H: Harness>(s: &S, h: &H) {
    let sp = spec(4 * 64 + 10, 64);
    let (lo, hi) = (PartSpec { stripe: Some((0, 2)), ..sp }, PartSpec { stripe: Some((2, 5)), ..sp });
    let (a, ra) = s.open_part(b"f", &lo).unwrap();
    assert!(ra.chunks.is_empty() && !ra.fresh, "a shared part is never sparse: it is not this writer's alone");
    write_chunks(&a, &sp, [1, 0]);
    let (b, rb) = s.open_part(b"f", &hi).unwrap();
    assert!(rb.chunks.is_empty(), "the other stripe's records are not this one's to claim");
    write_chunks(&b, &sp, [4, 2, 3]);
    // A stripe that starts over (no resume) keeps the part the other stripe writes.
    let (b2, rb2) = s.open_part(b"f", &PartSpec { resume: false, ..hi }).unwrap();
    assert!(rb2.chunks.is_empty());
    drop(b2);
    if s.features().resumable {
        let (_, again) = s.open_part(b"f", &lo).unwrap();
        assert_eq!(again.chunks.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 1], "a stripe reopened claims its own chunks, nothing else");
        assert!(!again.sealed);
    }
    a.seal(0, 2, &stripe_hash_of(&sp, 0, 2)).unwrap();
    b.seal(2, 5, &stripe_hash_of(&sp, 2, 5)).unwrap();
    drop((a, b));
    let (p, whole) = s.open_part(b"f", &sp).unwrap();
    if s.features().resumable {
        assert_eq!(whole.chunks.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        assert!(whole.sealed, "every chunk under a seal");
    }
    write_chunks(&p, &sp, (0..5).filter(|i| !whole.chunks.iter().any(|c| c.0 == *i)));
    p.finish(&Meta::default()).unwrap();
    s.barrier().unwrap();
    p.publish().unwrap();
    assert_eq!(h.read_file(b"f").unwrap(), content(&sp));
}

/// A seal survives the handle: a reopen reports the file sealed and claims its chunks without
/// reading them (data garbled behind the journal's back after the seal is still claimed: the
/// seal vouches for what was durable when it was written).
fn seals_survive_a_reopen_and_are_reported<S: Sink, H: Harness>(s: &S, h: &H) {
    if !s.features().resumable {
        return;
    }
    let sp = spec(3 * 64, 64);
    {
        let (p, _) = s.open_part(b"f", &sp).unwrap();
        write_chunks(&p, &sp, 0..3);
        p.seal(0, 3, &stripe_hash_of(&sp, 0, 3)).unwrap();
    }
    h.corrupt_part(b"f", 70, b"x");
    let (p, resume) = s.open_part(b"f", &sp).unwrap();
    assert!(resume.sealed && !resume.fresh);
    assert_eq!(resume.chunks.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 1, 2], "sealed chunks are trusted, not re-read");
    // A seal of part of the file: those chunks trusted, the file not sealed throughout.
    drop(p);
    let (p, _) = s.open_part(b"g", &sp).unwrap();
    write_chunks(&p, &sp, 0..3);
    p.seal(1, 3, &stripe_hash_of(&sp, 1, 3)).unwrap();
    drop(p);
    h.corrupt_part(b"g", 0, b"x");
    let (p, resume) = s.open_part(b"g", &sp).unwrap();
    assert!(!resume.sealed);
    assert_eq!(resume.chunks.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 2], "the unsealed chunk is re-hashed");
    p.abandon().unwrap();
}

/// A seal whose hash is not what its chunks add up to seals nothing; a chunk recorded again
/// after its seal is unsealed (written again, not known durable). Both are re-hashed instead.
fn a_seal_that_does_not_add_up_or_is_rewritten_seals_nothing<S: Sink, H: Harness>(s: &S, h: &H) {
    if !s.features().resumable {
        return;
    }
    let sp = spec(3 * 64, 64);
    {
        let (p, _) = s.open_part(b"f", &sp).unwrap();
        write_chunks(&p, &sp, 0..3);
        p.seal(0, 3, &[9; 32]).unwrap();
    }
    h.corrupt_part(b"f", 0, b"x");
    let (p, resume) = s.open_part(b"f", &sp).unwrap();
    assert!(!resume.sealed);
    assert_eq!(resume.chunks.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 2]);
    drop(p);
    let (p, _) = s.open_part(b"g", &sp).unwrap();
    write_chunks(&p, &sp, 0..3);
    p.seal(0, 3, &stripe_hash_of(&sp, 0, 3)).unwrap();
    write_chunks(&p, &sp, [2]);
    drop(p);
    h.corrupt_part(b"g", 2 * 64, b"x");
    let (p, resume) = s.open_part(b"g", &sp).unwrap();
    assert!(!resume.sealed);
    assert_eq!(resume.chunks.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 1], "chunk 2 recorded after the seal is re-hashed");
    p.abandon().unwrap();
}

/// A part opened in a directory the caller just created (`fresh_dir`) is fresh, is written and
/// published as any, and what it recorded is resumed by a later ordinary open.
fn a_part_in_a_fresh_directory_is_fresh_and_resumable<S: Sink, H: Harness>(s: &S, h: &H) {
    assert!(s.mkdir_all(b"new").unwrap());
    let sp = PartSpec { fresh_dir: true, ..spec(3 * 64, 64) };
    let (p, resume) = s.open_part(b"new/f", &sp).unwrap();
    assert!(resume.fresh && resume.chunks.is_empty() && !resume.sealed);
    write_chunks(&p, &sp, [0, 2]);
    drop(p);
    let again = PartSpec { fresh_dir: false, ..sp };
    let (p, resume) = s.open_part(b"new/f", &again).unwrap();
    if s.features().resumable {
        assert_eq!(resume.chunks.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 2]);
    }
    write_chunks(&p, &sp, (0..3).filter(|i| !resume.chunks.iter().any(|c| c.0 == *i)));
    p.finish(&Meta::default()).unwrap();
    s.barrier().unwrap();
    p.publish().unwrap();
    assert_eq!(h.read_file(b"new/f").unwrap(), content(&sp));
}

/// The whole-file hash of `data` in chunks of `chunk_size`, as the sender computes it.
fn whole_hash(data: &[u8], chunk_size: u32) -> [u8; 32] {
    let size = data.len() as u64;
    let hashes: Vec<[u8; 32]> = (0..tern_proto::chunk::chunk_count(size, chunk_size))
        .map(|i| {
            let (off, len) = tern_proto::chunk::chunk_range(size, chunk_size, i);
            crate::faults::chunk_hash(&data[off as usize..(off + u64::from(len)) as usize])
        })
        .collect();
    tern_proto::chunk::file_hash(size, &hashes)
}

/// A one-chunk part written whole (`write_whole`) publishes its data, with the metadata given
/// there or, given none there, the metadata `finish` sets; zeros in it read back as written.
fn a_part_written_whole_publishes_with_its_metadata<S: Sink, H: Harness>(s: &S, h: &H) {
    let meta = Meta { mode: Some(0o640), mtime: Some((1_600_000_000, 7)) };
    let mut data = vec![0u8; 100];
    data[0] = b'x';
    let (p, r) = s.open_part(b"w", &spec(100, 128)).unwrap();
    assert!(r.chunks.is_empty());
    p.write_whole(&data, Some(&meta)).unwrap();
    let mut back = vec![1u8; 100];
    p.read_at(0, &mut back).unwrap();
    assert_eq!(back, data);
    p.finish(&meta).unwrap();
    p.publish().unwrap();
    assert_eq!(h.read_file(b"w").as_deref(), Some(&data[..]));
    let st = s.stat(b"w").unwrap().unwrap();
    assert_eq!((st.size, st.mode, st.mtime), (100, 0o640, (1_600_000_000, 7)));
    // Metadata left to finish (--verify full: set after the re-read), over an older file.
    let late = Meta { mode: Some(0o600), mtime: Some((1_500_000_000, 0)) };
    let (p, _) = s.open_part(b"w", &spec(3, 128)).unwrap();
    p.write_whole(b"abc", None).unwrap();
    assert!(s.stat(b"w").unwrap().unwrap().size == 100, "nothing visible before publish");
    p.finish_verified(&late, Some(&whole_hash(b"abc", 128))).unwrap();
    p.publish().unwrap();
    assert_eq!(h.read_file(b"w").as_deref(), Some(&b"abc"[..]));
    let st = s.stat(b"w").unwrap().unwrap();
    assert_eq!((st.mode, st.mtime), (0o600, (1_500_000_000, 0)));
    // An empty file is one (empty) chunk.
    let (p, _) = s.open_part(b"empty", &spec(0, 128)).unwrap();
    p.write_whole(b"", None).unwrap();
    p.finish(&Meta::default()).unwrap();
    p.publish().unwrap();
    assert_eq!(h.read_file(b"empty").as_deref(), Some(&b""[..]));
}

/// `finish_verified` reads the part back: what storage garbled since it was written is
/// `Corrupt` and nothing is finished (publish refused, the part abandoned); what it holds as
/// written finishes and publishes.
fn a_verified_finish_refuses_what_storage_garbled<S: Sink, H: Harness>(s: &S, h: &H) {
    let sp = spec(1000, 256);
    let data = content(&sp);
    let (p, _) = s.open_part(b"v", &sp).unwrap();
    write_chunks(&p, &sp, 0..4);
    h.corrupt_part(b"v", 300, b"garbled");
    assert_eq!(kind(p.finish_verified(&Meta::default(), Some(&whole_hash(&data, 256)))), Kind::Corrupt);
    assert!(p.publish().is_err(), "not finished");
    p.abandon().unwrap();
    assert!(h.read_file(b"v").is_none());
    let (p, _) = s.open_part(b"one", &spec(10, 256)).unwrap();
    p.write_whole(b"0123456789", None).unwrap();
    h.corrupt_part(b"one", 0, b"X");
    assert_eq!(kind(p.finish_verified(&Meta::default(), Some(&whole_hash(b"0123456789", 256)))), Kind::Corrupt);
    p.abandon().unwrap();
    let (p, _) = s.open_part(b"v", &sp).unwrap();
    write_chunks(&p, &sp, (0..4).rev());
    p.finish_verified(&Meta::default(), Some(&whole_hash(&data, 256))).unwrap();
    p.publish().unwrap();
    assert_eq!(h.read_file(b"v"), Some(data));
}

/// A hard link to a published file reads its bytes; made again it changes nothing; over another
/// file or a link it replaces them; in a subdirectory it links across directories.
fn a_hard_link_reads_the_same_bytes_and_again_is_a_no_op<S: Sink, H: Harness>(s: &S, h: &H) {
    s.mkdir_all(b"d").unwrap();
    let meta = Meta { mode: Some(0o640), mtime: Some((1_600_000_000, 7)) };
    let (p, _) = s.open_part(b"f", &spec(5, 64)).unwrap();
    p.write_at(0, b"hello").unwrap();
    p.finish(&meta).unwrap();
    s.barrier().unwrap();
    p.publish().unwrap();
    s.hard_link(b"d/g", b"f", true).unwrap();
    assert_eq!(h.read_file(b"d/g").as_deref(), Some(&b"hello"[..]));
    let st = s.stat(b"d/g").unwrap().unwrap();
    assert_eq!((st.kind, st.size, st.mode, st.mtime), (EntryType::File, 5, 0o640, (1_600_000_000, 7)));
    s.hard_link(b"d/g", b"f", true).unwrap();
    assert_eq!(s.stat(b"d/g").unwrap(), Some(st), "linked again: nothing changes");
    assert_eq!(h.read_file(b"f").as_deref(), Some(&b"hello"[..]));
    put(s, b"other", b"another file");
    s.symlink(b"ln", b"f", None).unwrap();
    for over in [&b"other"[..], b"ln"] {
        s.hard_link(over, b"f", false).unwrap();
        assert_eq!(h.read_file(over).as_deref(), Some(&b"hello"[..]), "{}", String::from_utf8_lossy(over));
    }
    assert_eq!(names(s, b""), [("d".to_string(), true), ("f".to_string(), false), ("ln".to_string(), false), ("other".to_string(), false)]);
    assert_eq!(names(s, b"d"), [("g".to_string(), false)], "no temporary left");
}

/// A directory under the link's name is `Conflict` and stays; a target that is missing is
/// `NotFound`, one that is a directory or a symlink (never followed) is refused.
fn a_hard_link_refuses_a_directory_and_a_target_not_a_file<S: Sink, H: Harness>(s: &S, h: &H) {
    put(s, b"f", b"data");
    s.mkdir_all(b"dir/inside").unwrap();
    assert_eq!(kind(s.hard_link(b"dir", b"f", false)), Kind::Conflict);
    assert_eq!(s.stat(b"dir").unwrap().unwrap().kind, EntryType::Dir);
    assert_eq!(names(s, b"dir"), [("inside".to_string(), true)]);
    assert_eq!(kind(s.hard_link(b"l", b"missing", false)), Kind::NotFound);
    assert_eq!(kind(s.hard_link(b"l", b"nodir/missing", false)), Kind::NotFound);
    s.symlink(b"ln", b"f", None).unwrap();
    for target in [&b"dir"[..], b"ln"] {
        let e = s.hard_link(b"l", target, false).unwrap_err();
        assert_eq!(e.kind, Kind::Refused, "{}", String::from_utf8_lossy(target));
        assert!(e.message.contains("not a regular file"), "{e}");
    }
    assert!(s.stat(b"l").unwrap().is_none() && h.read_file(b"l").is_none(), "nothing made");
    assert_eq!(names(s, b""), [("dir".to_string(), true), ("f".to_string(), false), ("ln".to_string(), false)]);
}

/// Neither the link's path nor its target resolves through a symlink out of the root: refused,
/// nothing outside made or changed.
fn a_hard_link_through_an_escaping_symlink_is_refused<S: Sink, H: Harness>(s: &S, h: &H) {
    put(s, b"f", b"data");
    s.mkdir_all(b"d").unwrap();
    h.plant_symlink(b"a", b"..");
    h.plant_symlink(b"d/up", b"../..");
    h.plant_symlink(b"abs", b"/");
    for via in [&b"a/outside/keep"[..], b"d/up/outside/keep", b"abs/tmp/x"] {
        let what = String::from_utf8_lossy(via);
        assert_eq!(kind(s.hard_link(b"l", via, false)), Kind::Refused, "target {what}");
        assert_eq!(kind(s.hard_link(via, b"f", false)), Kind::Refused, "path {what}");
        assert!(s.hash_file(via, 8, 64).is_err(), "hash_file {what}");
    }
    assert!(s.stat(b"l").unwrap().is_none());
    assert!(h.outside_untouched());
}

/// `hash_file` of a published file is the whole-file hash of its bytes, for any chunk size; a
/// missing file is `NotFound`, a directory or a symlink is not hashed.
fn hash_file_is_the_whole_file_hash_of_what_was_published<S: Sink, H: Harness>(s: &S, _h: &H) {
    let sp = spec(5 * 64 + 7, 64);
    let (p, _) = s.open_part(b"f", &sp).unwrap();
    write_chunks(&p, &sp, 0..6);
    p.finish(&Meta::default()).unwrap();
    s.barrier().unwrap();
    p.publish().unwrap();
    let data = content(&sp);
    for chunk_size in [64, 100, 1 << 20] {
        assert_eq!(s.hash_file(b"f", sp.size, chunk_size).unwrap(), whole_hash(&data, chunk_size), "chunks of {chunk_size}");
    }
    put(s, b"empty", b"");
    assert_eq!(s.hash_file(b"empty", 0, 64).unwrap(), whole_hash(b"", 64));
    assert!(s.hash_file(b"f", sp.size + 1, 64).is_err(), "shorter than the size asked");
    assert_eq!(kind(s.hash_file(b"missing", 1, 64)), Kind::NotFound);
    s.mkdir_all(b"d").unwrap();
    s.symlink(b"ln", b"f", None).unwrap();
    assert!(s.hash_file(b"d", 0, 64).is_err(), "a directory");
    assert!(s.hash_file(b"ln", sp.size, 64).is_err(), "a symlink is not followed");
}
