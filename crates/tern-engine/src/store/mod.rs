//! The storage boundary (issue 13): where a transfer writes to, behind one small interface that
//! every store implements and one conformance suite (`conformance.rs`) that every store passes.
//! The contract in prose, with the reasons: `docs/store.md`.
//!
//! The source half (`Source`, `SourceFile`) is in `source.rs`, with its own suite
//! (`source_conformance.rs`). The destination half (`Sink`, `Part`): implementations `posix::PosixSink`
//! (today's descriptor-relative code over `fsops` and `journal`) and `mem::MemSink` (in memory,
//! deterministic, with a power-loss model, for simulations and tests). The interface is shaped for
//! an object store next (a chunk is a multipart part, `publish` is CompleteMultipartUpload) and for
//! a striped writer (several writers on one `Part` at disjoint chunk offsets).
//!
//! Paths are wire paths (`tern_proto::path`): relative, `/`-separated raw bytes, no empty, `.` or
//! `..` component; the empty path is the store's root. Every operation refuses anything else and
//! confines what it resolves beneath the root (a symlink out is refused, never followed).
//!
//! Used by the receiver (`driver/receiver.rs`): every partial file (`open_part`, `Part`), the
//! finalizer's `barrier` (one per batch), `--delete` and its dry-run plan, symlinks, hard links,
//! directory metadata and the skip-identical check (`stat`, `hash_file`); and by `tern rm`
//! (`fs_request.rs`).
#![cfg_attr(not(test), allow(dead_code, reason = "what only the tests and the stores to come use yet: Features, Sink::{features, mkdir_all}, Part::{read_at, finish}, Source::display"))]

use std::collections::HashSet;
use std::fmt;
use std::io;

use tern_proto::filter::Filter;

use crate::error::{ErrorKind, Side, TransferError};

#[cfg(test)]
pub(crate) mod conformance;
#[cfg(test)]
pub(crate) mod mem;
pub(crate) mod posix;
#[warn(dead_code)]
pub(crate) mod posix_source;
pub(crate) mod source;
pub(crate) use source::{Source, SourceFile};
#[cfg(test)]
pub(crate) mod mem_source;
#[cfg(test)]
pub(crate) mod source_conformance;

// Storage that predates the interface above, and the roots and file-system requests over it; the
// dead-code allowance above is not theirs.
#[warn(dead_code)]
pub(crate) mod fs_request;
#[warn(dead_code)]
pub mod fsops;
#[warn(dead_code)]
pub(crate) mod hashing;
#[warn(dead_code)]
pub(crate) mod journal;
#[warn(dead_code)]
pub(crate) mod layout;
#[warn(dead_code)]
pub mod probe;
pub mod roots;
#[warn(dead_code)]
pub mod walk;

/// What went wrong in a store, for code to decide on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    NotFound,
    /// The store is full (ENOSPC, a quota): every later write fails the same way.
    NoSpace,
    /// Out of descriptors, memory or threads: a limit of the process, not a fault of the file.
    ResourceLimit,
    PermissionDenied,
    /// The path is not a valid wire path, names the store's own namespace, or resolves outside
    /// the root (through `..` or a symlink): refused, nothing done.
    Refused,
    /// Something of the wrong type stands there (a directory where a file is published, a file
    /// where a directory is needed).
    Conflict,
    /// A source file is not the version listed: it ended early (shrank) while it was read.
    Changed,
    /// What storage returns is not what was written (`--verify full`'s re-read).
    Corrupt,
    Other,
}

impl Kind {
    /// The engine's error kind (`--json`'s `kind`): `Refused`, `Conflict` and `Changed` are
    /// `other` there.
    pub(crate) fn error_kind(self) -> ErrorKind {
        match self {
            Self::NotFound => ErrorKind::NotFound,
            Self::NoSpace => ErrorKind::NoSpace,
            Self::ResourceLimit => ErrorKind::ResourceLimit,
            Self::PermissionDenied => ErrorKind::PermissionDenied,
            Self::Corrupt => ErrorKind::WholeFileMismatch,
            Self::Refused | Self::Conflict | Self::Changed | Self::Other => ErrorKind::Other,
        }
    }

    fn of_errno(errno: i32) -> Self {
        match errno {
            libc::EXDEV | libc::ELOOP => Self::Refused,
            libc::ENOTDIR | libc::EISDIR | libc::EEXIST | libc::ENOTEMPTY => Self::Conflict,
            _ => match ErrorKind::of_io(&io::Error::from_raw_os_error(errno)) {
                ErrorKind::NotFound => Self::NotFound,
                ErrorKind::NoSpace => Self::NoSpace,
                ErrorKind::ResourceLimit => Self::ResourceLimit,
                ErrorKind::PermissionDenied => Self::PermissionDenied,
                _ => Self::Other,
            },
        }
    }
}

/// A store's error: its kind, the OS error where there was one (so the engine's hints, which go
/// by errno, still apply), words for people, and what the store was doing when it failed.
#[derive(Debug)]
pub(crate) struct StoreError {
    pub(crate) kind: Kind,
    pub(crate) errno: Option<i32>,
    pub(crate) message: String,
    /// The step that failed ("cannot create temporary file", "write failed"), where the store
    /// says; it names the failure in messages in place of the caller's words.
    pub(crate) what: Option<&'static str>,
}

impl StoreError {
    pub(crate) fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self { kind, errno: None, message: message.into(), what: None }
    }

    /// The same error, naming the step that failed (unless a deeper step named itself).
    pub(crate) fn doing(mut self, what: &'static str) -> Self {
        self.what.get_or_insert(what);
        self
    }

    /// The engine's error kind: by errno where there is one (as `TransferError::io` judges it).
    pub(crate) fn error_kind(&self) -> ErrorKind {
        match self.errno {
            Some(errno) => ErrorKind::of_io(&io::Error::from_raw_os_error(errno)),
            None => self.kind.error_kind(),
        }
    }

    /// "step: message", or the message alone where no step is named.
    pub(crate) fn described(&self) -> String {
        match self.what {
            Some(what) => format!("{what}: {}", self.message),
            None => self.message.clone(),
        }
    }

    pub(crate) fn refused(message: impl Into<String>) -> Self {
        Self::new(Kind::Refused, message)
    }

    pub(crate) fn errno(errno: i32) -> Self {
        let err = io::Error::from_raw_os_error(errno);
        Self { kind: Kind::of_errno(errno), errno: Some(errno), message: crate::error::err_text(&err), what: None }
    }

    /// A file-level `TransferError` naming `path` and what was being done (the step the store
    /// named, if it did).
    pub(crate) fn to_transfer(&self, side: Side, path: impl Into<String>, what: &str) -> TransferError {
        let what = self.what.unwrap_or(what);
        match self.errno {
            Some(errno) => TransferError::io(side, path, what, &io::Error::from_raw_os_error(errno)),
            None => TransferError::file(side, path, format!("{what}: {}", self.message)).with_kind(self.kind.error_kind()),
        }
    }
}

impl From<io::Error> for StoreError {
    fn from(err: io::Error) -> Self {
        match err.raw_os_error() {
            Some(errno) => Self::errno(errno),
            None => Self::new(Kind::Other, err.to_string()),
        }
    }
}

impl From<rustix::io::Errno> for StoreError {
    fn from(err: rustix::io::Errno) -> Self {
        Self::errno(err.raw_os_error())
    }
}

impl From<StoreError> for io::Error {
    fn from(err: StoreError) -> Self {
        match err.errno {
            Some(errno) => io::Error::from_raw_os_error(errno),
            None => io::Error::other(err.message),
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StoreError {}

pub(crate) type Result<T, E = StoreError> = std::result::Result<T, E>;

/// What a store can do; the engine adapts to it (chunk size at negotiation, sparse writes, when a
/// file becomes visible).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Features {
    /// Bytes never written read back as zeros, without being stored (holes).
    pub(crate) sparse: bool,
    /// `publish` is one atomic step: before it nothing is under the final name, after it the
    /// whole file is (a rename; CompleteMultipartUpload).
    pub(crate) atomic_publish: bool,
    /// `open_part` can resume: it returns the chunks it proves it holds.
    pub(crate) resumable: bool,
    /// Chunk sizes the store accepts (S3: parts of at least 5 MiB, 5 GiB at most).
    pub(crate) chunk_size_min: u32,
    pub(crate) chunk_size_max: u32,
    /// At most this many chunks per file (S3: 10,000 parts); `None`: no limit.
    pub(crate) max_chunks: Option<u64>,
}

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryType {
    File,
    Dir,
    Symlink,
    /// A device, fifo or socket: never written by tern, removed by `--delete` like a file.
    Other,
}

/// An entry's metadata, as `stat` sees it (a final symlink is not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    pub(crate) kind: EntryType,
    pub(crate) size: u64,
    /// Permission bits (`0o7777`).
    pub(crate) mode: u32,
    pub(crate) mtime: (i64, u32),
}

/// Mode and mtime to set; `None` leaves the store's default (no `--preserve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Meta {
    pub(crate) mode: Option<u32>,
    pub(crate) mtime: Option<(i64, u32)>,
}

/// The file a part is for: its source's identity and the chunking. A journal written for another
/// `PartSpec` (the source changed, or the chunk size) is worth nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartSpec {
    pub(crate) size: u64,
    pub(crate) mtime: (i64, u32),
    pub(crate) chunk_size: u32,
    /// Keep what an earlier attempt left and claim what it proves; `false` starts from nothing
    /// (a retry after the whole file failed to verify).
    pub(crate) resume: bool,
    /// A stripe of a shared part: this writer's chunks `first..end` of a file whose other stripes
    /// other writers (other sessions, other nodes) write into the same partial file at once.
    /// `open_part` joins that part (starting it if it is the first), claims only these chunks of
    /// what was recorded, and never removes or truncates what the others wrote; without
    /// `resume` it claims nothing but still keeps the part. `None`: the whole file, this
    /// writer's alone.
    pub(crate) stripe: Option<(u64, u64)>,
    /// The caller created the part's directory in this session (`mkdir_all` said so), so no
    /// earlier attempt can be there: a store may skip looking for one (a journal read and a
    /// stale temporary's removal: metadata round trips on a parallel file system). A hint; a
    /// store may ignore it. Not for a stripe (other writers share the directory).
    pub(crate) fresh_dir: bool,
}

/// What `open_part` found of an earlier attempt.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Resume {
    /// Chunks (index, hash) whose data the store holds and has just re-hashed to that hash;
    /// ascending, no index twice. Never a chunk it cannot prove: a journal outlives its data
    /// after a power loss.
    pub(crate) chunks: Vec<(u64, [u8; 32])>,
    /// Nothing was there before: bytes not written read back as zeros, so all-zero data may be
    /// skipped (left as holes) where the store is `sparse`.
    pub(crate) fresh: bool,
    /// Every chunk of the file is under a seal ([`Part::seal`]): verified against the source and
    /// durable, so the file may be published from the recorded hashes without reading it back.
    pub(crate) sealed: bool,
}

/// A name in a directory and whether it is a directory.
pub(crate) type Listed = (Vec<u8>, bool);

/// Where a transfer writes to. All paths are wire paths, confined beneath the store's root by the
/// implementation: a path that is not a valid wire path, or that resolves outside the root
/// (through a symlink of any origin, planted at any moment), fails with [`Kind::Refused`] and
/// touches nothing. A final symlink is never followed (it is the entry itself).
pub(crate) trait Sink: Send + Sync + 'static {
    type Part: Part;

    fn features(&self) -> Features;

    /// The entry at `rel`, not following a final symlink; `None` if there is none.
    fn stat(&self, rel: &[u8]) -> Result<Option<Stat>>;

    /// Creates directory `rel` and its missing parents; existing directories are kept. True if
    /// this call created `rel` itself (so it holds nothing). A non-directory in the way:
    /// [`Kind::Conflict`].
    fn mkdir_all(&self, rel: &[u8]) -> Result<bool>;

    /// A partial file that becomes `rel` on [`Part::publish`]. Its parent directory must exist.
    /// Until then nothing is visible under `rel` (whatever stood there stays) and nothing shows in
    /// `list`. With `spec.resume`, what an earlier attempt for the same `spec` left is kept and
    /// the chunks it can prove are returned (re-hashed against the data, never only believed);
    /// otherwise, or for another `spec`, it is discarded. A second `open_part` of the same `rel`
    /// and `spec`, with `resume`, while a handle is open is another writer on the same partial
    /// file (a striped writer on another node); it claims what the others recorded so far. One
    /// handle finishes and publishes, after every writer's data passed a barrier.
    fn open_part(&self, rel: &[u8], spec: &PartSpec) -> Result<(Self::Part, Resume)>;

    /// Makes every part's data, length and metadata so far durable. A part published after a
    /// barrier that followed its `finish` survives power loss whole; one published without it
    /// may come back with data missing. POSIX: `syncfs`; an object store: nothing to do.
    fn barrier(&self) -> Result<()>;

    /// A symlink `rel -> target`, replacing a file or link there (never a directory:
    /// [`Kind::Conflict`]); `mtime` set on the link itself. A store may refuse a target that could
    /// resolve outside the root ([`Kind::Refused`]).
    fn symlink(&self, rel: &[u8], target: &[u8], mtime: Option<(i64, u32)>) -> Result<()>;

    /// `rel` becomes another name of `target`, a regular file (a final symlink there is not one:
    /// it is never followed), through a temporary name put in place in one step: a file or link
    /// at `rel` is replaced, a name already linked to `target` is left alone, a directory at
    /// `rel` is [`Kind::Conflict`] (EISDIR) and nothing changes. `target` missing:
    /// [`Kind::NotFound`]; not a regular file: [`Kind::Refused`]. Both paths are confined beneath
    /// the root like every other operation. Where the store cannot link (POSIX: the file system
    /// refuses, EXDEV, EPERM, EMLINK, ENOTSUP; a store without links at all) it copies
    /// `target`'s bytes instead, durably, with its mode and mtime where `preserve`; the copy
    /// is then a separate file.
    fn hard_link(&self, rel: &[u8], target: &[u8], preserve: bool) -> Result<()>;

    /// The whole-file hash (`tern_proto::chunk::file_hash` of its chunks of `chunk_size`) of the
    /// first `size` bytes of regular file `rel` (the skip-identical check of `--checksum`), read
    /// from the store, never through a final symlink. Missing: [`Kind::NotFound`]; shorter than
    /// `size`: an error.
    fn hash_file(&self, rel: &[u8], size: u64, chunk_size: u32) -> Result<[u8; 32]>;

    /// Mode and mtime of directory `rel` (the empty path: the root).
    fn set_dir_meta(&self, rel: &[u8], meta: &Meta) -> Result<()>;

    /// The entries of directory `rel`, sorted by name, without the store's own (temporaries,
    /// journals, markers), each with whether it is a directory (a symlink to one is not).
    /// Resolved through no symlink at all: a link on the way is [`Kind::Refused`].
    fn list(&self, rel: &[u8]) -> Result<Vec<Listed>>;

    /// Removes `rel` and, if it is a directory, everything under it (the store's own leftovers
    /// there too). Never through a symlink: a link on the way is refused, a link inside is
    /// removed as an entry, never entered. Absent: nothing to do. The root cannot be removed.
    fn remove_tree(&self, rel: &[u8]) -> Result<()>;

    /// `rel` as a person would name it, for messages.
    fn display(&self, rel: &[u8]) -> String;
}

/// A partial file. Every call takes `&self`, so several writers (stream threads; on a cluster, node
/// drivers) write disjoint chunks at once. Dropping it without `publish` or `abandon` leaves the
/// partial file for a later `open_part` to resume.
pub(crate) trait Part: Send + Sync {
    /// Writes `data` at `offset` (a chunk's range); any order, any writer. Where `Resume::fresh`
    /// and the store is sparse, all-zero blocks may be skipped (left as holes), so a range is
    /// written once, or again only with the same bytes.
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()>;

    /// Reads back `buf.len()` bytes at `offset` (`--verify full`; bytes never written are zeros).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// Records that chunk `index`, already written, verified with `hash`, so a later `open_part`
    /// may claim it (after re-hashing). Not durable by itself.
    fn record_chunk(&self, index: u64, hash: &[u8; 32]) -> Result<()>;

    /// Seals chunks `first..end`, all written and recorded, whose hashes add up to `stripe_hash`
    /// (`tern_proto::chunk::stripe_hash`): makes their data durable first, then records the seal
    /// (docs/journal.md "Seals"). A later `open_part` claims sealed chunks without re-hashing
    /// them, and reports a file sealed throughout (`Resume::sealed`). A seal whose chunks do not
    /// add up, or a chunk recorded again after its seal, seals nothing. Not durable by itself:
    /// a lost seal costs only the re-read.
    fn seal(&self, first: u64, end: u64, stripe_hash: &[u8; 32]) -> Result<()>;

    /// A part of one chunk written all at once (`data` is the whole file, offset 0), holding
    /// nothing afterwards: as `write_at`, and the store may do at once what `finish` would
    /// (the length; the metadata, given `meta`), so a part waiting for its batch keeps no
    /// resource open (POSIX: the temporary is opened, written and closed here, and a tree of
    /// small files in flight is not bounded by the descriptor limit). `finish` is given the
    /// same `meta` (or, without it here, sets its own).
    fn write_whole(&self, data: &[u8], meta: Option<&Meta>) -> Result<()>;

    /// Every chunk is written: sets the length (the spec's size) and `meta`, and checks that the
    /// partial file is still the one written (nothing replaced it meanwhile).
    fn finish(&self, meta: &Meta) -> Result<()> {
        self.finish_verified(meta, None)
    }

    /// `finish`, and with `verify` (`--verify full`) the part read back from storage, not from
    /// a cache, after the length is set and before the metadata (a mode without read
    /// permission may refuse a read): its whole-file hash (`tern_proto::chunk::file_hash` of
    /// its chunks) must be `verify`, else [`Kind::Corrupt`] and nothing is finished.
    fn finish_verified(&self, meta: &Meta, verify: Option<&[u8; 32]>) -> Result<()>;

    /// Makes the finished part `rel`, in one step, replacing a file or link there; a directory
    /// there is [`Kind::Conflict`] and nothing changes (the part stays, to abandon). The store's
    /// bookkeeping (journal) goes. Before `finish`: refused. Afterwards the handle is spent (every
    /// call fails), on every writer sharing it.
    fn publish(&self) -> Result<()>;

    /// Removes the partial file and its bookkeeping: nothing of it stays, nothing is resumed.
    /// The handle is spent.
    fn abandon(&self) -> Result<()>;
}

/// Of a journal's claims (`records`), what a resume may claim: chunks under a seal (verified
/// against the source and made durable before their seal) unread, every other one only if
/// `read(buf, offset)` fills its chunk with data that still hashes to the record (after a power
/// loss a journal may claim more than reached the disk: docs/journal.md). Pushes what it keeps
/// onto `resumed` (sealed chunks first, not sorted) and returns the bytes kept, and whether
/// every chunk of the file was sealed. A large claim is hashed on several threads.
pub(crate) fn rehash_claimed(
    read: &(dyn Fn(&mut [u8], u64) -> bool + Sync),
    size: u64,
    chunk_size: u32,
    records: impl IntoIterator<Item = journal::Claim>,
    resumed: &mut Vec<(u64, [u8; 32])>,
) -> (u64, bool) {
    use tern_proto::chunk::{chunk_count, chunk_range};
    /// Claims of fewer chunks than this are hashed here: a thread costs more than they do.
    const PER_THREAD: usize = 8;
    const MAX_THREADS: usize = 8;
    let chunks = chunk_count(size, chunk_size);
    let mut seen = tern_proto::chunk::ChunkSet::new(chunks);
    let (mut sealed, mut trusted) = (0u64, 0u64);
    let mut claims: Vec<(u64, [u8; 32])> = Vec::new();
    for (index, hash, is_sealed) in records {
        if index >= chunks || !seen.insert(index) {
            continue;
        }
        if is_sealed {
            sealed += 1;
            trusted += u64::from(chunk_range(size, chunk_size, index).1);
            resumed.push((index, hash));
        } else {
            claims.push((index, hash));
        }
    }
    let check = |share: &[(u64, [u8; 32])]| -> Vec<(u64, [u8; 32], u64)> {
        let mut buf = vec![0u8; chunk_size as usize];
        share
            .iter()
            .filter_map(|&(index, hash)| {
                let (off, len) = chunk_range(size, chunk_size, index);
                let data = &mut buf[..len as usize];
                (read(data, off) && crate::faults::chunk_hash(data) == hash).then_some((index, hash, u64::from(len)))
            })
            .collect()
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS).min(claims.len() / PER_THREAD).max(1);
    let kept: Vec<(u64, [u8; 32], u64)> = if threads == 1 {
        check(&claims)
    } else {
        // Threads that cannot start leave their share to this one: hashing never fails for it.
        let per = claims.len().div_ceil(threads);
        std::thread::scope(|s| {
            let handles: Vec<_> = claims.chunks(per).map(|c| (c, crate::threads::spawn_scoped(s, "tern-rehash", || check(c)))).collect();
            handles.into_iter().flat_map(|(c, h)| h.ok().and_then(|h| h.join().ok()).unwrap_or_else(|| check(c))).collect()
        })
    };
    let mut reused = trusted;
    for (index, hash, len) in kept {
        resumed.push((index, hash));
        reused += len;
    }
    (reused, sealed == chunks)
}

/// Checks a wire path: `Refused` unless relative with no empty, `.` or `..` component.
pub(crate) fn check(rel: &[u8]) -> Result<()> {
    tern_proto::path::validate_relative(rel).map_err(|e| StoreError::refused(format!("'{}': {e}; refused", String::from_utf8_lossy(rel))))
}

/// `rel`, checked, and not the root (a file operation names an entry).
pub(crate) fn check_entry(rel: &[u8]) -> Result<()> {
    check(rel)?;
    if rel.is_empty() {
        return Err(StoreError::refused("the empty path names the root, not an entry; refused"));
    }
    Ok(())
}

pub(crate) fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    if rel.is_empty() { name.to_vec() } else { [rel, b"/", name].concat() }
}

/// `--delete`'s plan: entries under the root that the manifest (`keep`) does not name, top-most
/// only (a directory's contents go with it), leaving out the store's own names and what `filter`
/// excludes (never offered, so not extra). A directory that cannot be listed (a link swapped in,
/// gone meanwhile) is skipped: deleting less is the safe side.
pub(crate) fn extras<S: Sink + ?Sized>(sink: &S, keep: &HashSet<Vec<u8>>, filter: &Filter) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut stack = vec![Vec::<u8>::new()];
    while let Some(rel) = stack.pop() {
        let Ok(items) = sink.list(&rel) else { continue };
        for (name, is_dir) in items {
            let r = join(&rel, &name);
            if filter.excludes(&r, is_dir) {
                continue;
            }
            if !keep.contains(&r) {
                out.push(r);
            } else if is_dir {
                stack.push(r);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn posix_sink_conforms() {
        super::conformance::run(super::posix::tests::fixture_unconfined);
    }

    #[test]
    fn posix_sink_beneath_a_root_conforms() {
        super::conformance::run(super::posix::tests::fixture_beneath);
    }

    #[test]
    fn mem_sink_conforms() {
        super::conformance::run(super::mem::tests::fixture);
    }

    #[test]
    fn posix_source_conforms() {
        super::source_conformance::run(super::posix_source::tests::fixture_unconfined);
    }

    #[test]
    fn posix_source_beneath_a_root_conforms() {
        super::source_conformance::run(super::posix_source::tests::fixture_beneath);
    }

    #[test]
    fn mem_source_conforms() {
        super::source_conformance::run(super::mem_source::tests::fixture);
    }

    /// `--delete`'s plan: top-most extras only, kept paths walked into, excluded ones and the
    /// store's own names left alone.
    #[test]
    fn extras_are_top_most_and_skip_kept_excluded_and_own_names() {
        use super::conformance::Harness;
        use super::{Meta, Part, Sink};
        let (s, h) = super::posix::tests::fixture_unconfined();
        for d in [&b"keep/old"[..], b"gone/deep"] {
            s.mkdir_all(d).unwrap();
        }
        for f in [&b"keep/a"[..], b"keep/b", b"keep/old/x", b"gone/deep/y", b"keep/z.log", b"top"] {
            let (p, _) = s.open_part(f, &super::conformance::spec(1, 64)).unwrap();
            p.write_at(0, b"1").unwrap();
            p.finish(&Meta::default()).unwrap();
            p.publish().unwrap();
        }
        h.plant_marker(b"keep");
        let _partial = s.open_part(b"keep/c", &super::conformance::spec(1, 64)).unwrap();
        let keep = [&b"keep"[..], b"keep/a"].iter().map(|k| k.to_vec()).collect();
        let filter = tern_proto::filter::Filter::new(&[tern_proto::filter::FilterRule::exclude("*.log")]).unwrap();
        let mut extra = super::extras(&s, &keep, &filter);
        extra.sort();
        assert_eq!(extra, [b"gone".to_vec(), b"keep/b".to_vec(), b"keep/old".to_vec(), b"top".to_vec()]);
    }
}
