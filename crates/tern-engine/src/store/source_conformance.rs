//! The one suite every `Source` passes, as `conformance.rs` is for sinks. `run(make)` calls
//! `make` for a fresh, empty source per test; the `SourceHarness` changes it behind the source's
//! back, as the user or another process would while a transfer reads.

use super::{EntryType, Kind, Source, SourceFile, StoreError};

/// What a test needs besides the trait, per source.
pub(crate) trait SourceHarness {
    /// A regular file `rel` (parents created) holding `data`, modified at `mtime`.
    fn put(&self, rel: &[u8], data: &[u8], mtime: (i64, u32));
    /// Cuts file `rel` to `len` bytes in place: open handles see it shrink.
    fn truncate(&self, rel: &[u8], len: u64);
    /// A symlink `rel -> target`, unchecked.
    fn plant_symlink(&self, rel: &[u8], target: &[u8]);
    /// Whether the source is confined beneath its root (links out refused), as a daemon's is.
    fn confined(&self) -> bool;
}

const MTIME: (i64, u32) = (1_700_000_000, 5);

/// A named test of the suite.
type Case<S, H> = (&'static str, fn(&S, &H));

/// Runs every test on fresh sources from `make`.
pub(crate) fn run<S: Source, H: SourceHarness>(make: impl Fn() -> (S, H)) {
    let tests: &[Case<S, H>] = &[
        ("reads_return_the_bytes", reads_return_the_bytes),
        ("a_read_past_the_end_is_changed", a_read_past_the_end_is_changed),
        ("a_file_that_shrank_is_changed", a_file_that_shrank_is_changed),
        ("stat_reports_size_and_mtime", stat_reports_size_and_mtime),
        ("missing_is_not_found", missing_is_not_found),
        ("invalid_paths_are_refused", invalid_paths_are_refused),
        ("escaping_symlinks_are_refused", escaping_symlinks_are_refused),
        ("display_names_the_path", display_names_the_path),
    ];
    for (name, test) in tests {
        let (source, harness) = make();
        tracing::debug!("source conformance: {name}");
        test(&source, &harness);
    }
}

fn kind<T>(r: Result<T, StoreError>) -> Option<Kind> {
    r.err().map(|e| e.kind)
}

fn reads_return_the_bytes<S: Source, H: SourceHarness>(s: &S, h: &H) {
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 1) as u8).collect();
    h.put(b"d/f", &data, MTIME);
    let f = s.open(b"d/f").unwrap();
    let mut buf = vec![0u8; 4096];
    f.read_at(5000, &mut buf).unwrap();
    assert_eq!(buf, data[5000..9096]);
    f.read_at(0, &mut buf[..10]).unwrap();
    assert_eq!(buf[..10], data[..10]);
    f.read_at(10_000, &mut []).unwrap();
}

fn a_read_past_the_end_is_changed<S: Source, H: SourceHarness>(s: &S, h: &H) {
    h.put(b"f", b"0123456789", MTIME);
    let f = s.open(b"f").unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(kind(f.read_at(4, &mut buf)), Some(Kind::Changed));
}

fn a_file_that_shrank_is_changed<S: Source, H: SourceHarness>(s: &S, h: &H) {
    h.put(b"f", &[7u8; 100], MTIME);
    let f = s.open(b"f").unwrap();
    h.truncate(b"f", 50);
    let mut buf = [0u8; 20];
    f.read_at(0, &mut buf).unwrap();
    assert_eq!(kind(f.read_at(40, &mut buf)), Some(Kind::Changed));
    assert_eq!(f.stat().unwrap().size, 50, "the open handle sees the file as it is now");
}

fn stat_reports_size_and_mtime<S: Source, H: SourceHarness>(s: &S, h: &H) {
    h.put(b"a/f", b"hello", MTIME);
    let st = s.stat(b"a/f").unwrap();
    assert_eq!((st.kind, st.size, st.mtime), (EntryType::File, 5, MTIME));
    assert!(st.is_version(5, MTIME) && !st.is_version(6, MTIME) && !st.is_version(5, (MTIME.0, 6)));
    assert_eq!(s.open(b"a/f").unwrap().stat().unwrap(), st, "the handle's stat is the path's");
    assert_eq!(s.stat(b"a").unwrap().kind, EntryType::Dir);
    h.plant_symlink(b"link", b"a/f");
    assert_eq!(s.stat(b"link").unwrap().kind, EntryType::Symlink, "a final link is not followed");
}

fn missing_is_not_found<S: Source, H: SourceHarness>(s: &S, h: &H) {
    assert_eq!(kind(s.open(b"nope")), Some(Kind::NotFound));
    assert_eq!(kind(s.stat(b"nope")), Some(Kind::NotFound));
    h.put(b"d/f", b"x", MTIME);
    assert_eq!(kind(s.open(b"d/nope")), Some(Kind::NotFound));
}

fn invalid_paths_are_refused<S: Source, H: SourceHarness>(s: &S, h: &H) {
    h.put(b"f", b"x", MTIME);
    for bad in [&b""[..], b"/f", b"../f", b"a/../f", b"./f", b"a//f"] {
        assert_eq!(kind(s.open(bad)), Some(Kind::Refused), "open {}", String::from_utf8_lossy(bad));
        assert_eq!(kind(s.stat(bad)), Some(Kind::Refused), "stat {}", String::from_utf8_lossy(bad));
    }
}

/// Beneath a root, a link on the way that leaves it is refused, whatever it points at; a final
/// link is not read through. Links that stay beneath are followed on the way.
fn escaping_symlinks_are_refused<S: Source, H: SourceHarness>(s: &S, h: &H) {
    if !h.confined() {
        return;
    }
    h.put(b"in/f", b"inside", MTIME);
    h.plant_symlink(b"up", b"..");
    h.plant_symlink(b"abs", b"/");
    h.plant_symlink(b"stays", b"in");
    h.plant_symlink(b"final", b"in/f");
    for bad in [&b"up/outside/secret"[..], b"abs/etc/passwd"] {
        assert_eq!(kind(s.open(bad)), Some(Kind::Refused), "open {}", String::from_utf8_lossy(bad));
        assert_eq!(kind(s.stat(bad)), Some(Kind::Refused), "stat {}", String::from_utf8_lossy(bad));
    }
    assert_eq!(kind(s.open(b"final")), Some(Kind::Refused), "a final link is sent as a link, never read through");
    let mut buf = [0u8; 6];
    s.open(b"stays/f").unwrap().read_at(0, &mut buf).unwrap();
    assert_eq!(&buf, b"inside");
}

fn display_names_the_path<S: Source, H: SourceHarness>(s: &S, _: &H) {
    assert!(s.display(b"d/f").ends_with("/d/f"), "{}", s.display(b"d/f"));
}
