//! The source half of the storage boundary: where a transfer reads from. `Source` opens and stats
//! entries by path beneath its root; a `SourceFile` is one open file, read by position. The
//! sender's stream workers and its "did the file change" checks go through it, so an object
//! store or another cluster node can be a source later. Implementations: `posix_source::
//! PosixSource` (today's `File::open` / openat2 beneath a daemon's root) and, in tests,
//! `mem_source::MemSource`; both pass `source_conformance::run`.
//!
//! The walk (`walk.rs`) still lists the local file system directly and hands out `SrcFile`s that
//! carry their `PosixSource`; listing through the interface comes with the first non-POSIX source.

use super::{Result, Stat};

/// Where a transfer reads from. Paths are wire paths (`tern_proto::path`) beneath the root: one
/// that is not valid fails with [`super::Kind::Refused`]. A confined source (a daemon's root)
/// refuses anything that resolves outside it, through `..` or a symlink, with `Refused`.
pub(crate) trait Source: Send + Sync + 'static {
    type File: SourceFile;

    /// Opens file `rel` for reading. A final symlink is not read through where the source is
    /// confined (links are sent as links); a missing file is [`super::Kind::NotFound`].
    fn open(&self, rel: &[u8]) -> Result<Self::File>;

    /// The entry at `rel`, not following a final symlink; a missing one is `NotFound`.
    fn stat(&self, rel: &[u8]) -> Result<Stat>;

    /// `rel` as a person would name it, for messages.
    fn display(&self, rel: &[u8]) -> String;
}

/// One open source file. `&self` everywhere: a handle may be shared by readers of disjoint
/// ranges. It stays on the file it opened: a file renamed over it afterwards is not seen.
pub(crate) trait SourceFile: Send + Sync {
    /// Fills `buf` from `offset`: one positional read, no copy beyond it. The file ending before
    /// `buf` is full (it shrank since it was listed) is [`super::Kind::Changed`].
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// The open file's metadata now, to check it did not change while it was read.
    fn stat(&self) -> Result<Stat>;
}

impl Stat {
    /// Whether this is still the version listed as `size` bytes modified at `mtime`.
    pub(crate) fn is_version(&self, size: u64, mtime: (i64, u32)) -> bool {
        self.size == size && self.mtime == mtime
    }
}
