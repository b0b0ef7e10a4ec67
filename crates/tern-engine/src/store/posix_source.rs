//! `PosixSource`: a local directory read as a `Source`. Unconfined (local and ssh modes: the
//! user's own view) it opens by path, as `cp` would; beneath a daemon's root every open and stat
//! goes through `fsops::Beneath` (openat2 `RESOLVE_BENEATH`, final link not followed).

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::fsops::Beneath;
use super::posix::stat_of;
use super::{Kind, Result, Source, SourceFile, Stat, StoreError, check_entry};

/// A directory to read from; for a single-file source, the directory holding it.
#[derive(Debug)]
pub(crate) struct PosixSource {
    root: PathBuf,
    beneath: Option<Arc<Beneath>>,
}

impl PosixSource {
    /// `beneath`: the daemon's root everything read must resolve under.
    pub(crate) fn new(root: PathBuf, beneath: Option<Arc<Beneath>>) -> Self {
        Self { root, beneath }
    }

    pub(crate) fn beneath(&self) -> Option<&Arc<Beneath>> {
        self.beneath.as_ref()
    }

    /// The path beneath the root that names `path` (built by joining names onto the root), or
    /// `None` if it is not beneath it.
    pub(crate) fn rel_of<'a>(&self, path: &'a Path) -> Option<&'a [u8]> {
        path.strip_prefix(&self.root).ok().map(|r| r.as_os_str().as_bytes())
    }

    fn path(&self, rel: &[u8]) -> PathBuf {
        self.root.join(OsStr::from_bytes(rel))
    }
}

impl Source for PosixSource {
    type File = PosixSourceFile;

    fn open(&self, rel: &[u8]) -> Result<PosixSourceFile> {
        check_entry(rel)?;
        let path = self.path(rel);
        let file = match &self.beneath {
            Some(b) => b.open_file(&path)?,
            None => File::open(&path)?,
        };
        Ok(PosixSourceFile { file })
    }

    fn stat(&self, rel: &[u8]) -> Result<Stat> {
        check_entry(rel)?;
        let path = self.path(rel);
        match &self.beneath {
            Some(b) => Ok(stat_of(&b.lstat(&path)?)),
            None => Ok(stat_of(&rustix::fs::lstat(&path)?)),
        }
    }

    fn display(&self, rel: &[u8]) -> String {
        self.path(rel).display().to_string()
    }
}

/// An open local file.
pub(crate) struct PosixSourceFile {
    file: File,
}

impl SourceFile for PosixSourceFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.file.read_exact_at(buf, offset).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => StoreError::new(Kind::Changed, "changed while being read (it ended early)"),
            _ => e.into(),
        })
    }

    fn stat(&self) -> Result<Stat> {
        Ok(stat_of(&rustix::fs::fstat(&self.file)?))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::store::source_conformance::SourceHarness;

    /// A temporary directory holding the source's root `root/` and, beside it, `outside/secret`,
    /// which nothing read through the source may reach when it is confined.
    pub(crate) struct PosixSourceHarness {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        confined: bool,
    }

    fn harness(confined: bool) -> PosixSourceHarness {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().to_path_buf();
        std::fs::create_dir_all(top.join("root")).unwrap();
        std::fs::create_dir_all(top.join("outside")).unwrap();
        std::fs::write(top.join("outside/secret"), b"secret").unwrap();
        PosixSourceHarness { _tmp: tmp, root: top.join("root"), confined }
    }

    pub(crate) fn fixture_unconfined() -> (PosixSource, PosixSourceHarness) {
        let h = harness(false);
        (PosixSource::new(h.root.clone(), None), h)
    }

    /// As a daemon opens it: beneath its root.
    pub(crate) fn fixture_beneath() -> (PosixSource, PosixSourceHarness) {
        let h = harness(true);
        let b = Arc::new(Beneath::open(&h.root).unwrap());
        (PosixSource::new(h.root.clone(), Some(b)), h)
    }

    impl PosixSourceHarness {
        fn path(&self, rel: &[u8]) -> PathBuf {
            self.root.join(OsStr::from_bytes(rel))
        }
    }

    impl SourceHarness for PosixSourceHarness {
        fn put(&self, rel: &[u8], data: &[u8], mtime: (i64, u32)) {
            let path = self.path(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, data).unwrap();
            let t = std::time::UNIX_EPOCH + std::time::Duration::new(mtime.0 as u64, mtime.1);
            File::options().write(true).open(&path).unwrap().set_modified(t).unwrap();
        }

        fn truncate(&self, rel: &[u8], len: u64) {
            File::options().write(true).open(self.path(rel)).unwrap().set_len(len).unwrap();
        }

        fn plant_symlink(&self, rel: &[u8], target: &[u8]) {
            std::os::unix::fs::symlink(OsStr::from_bytes(target), self.path(rel)).unwrap();
        }

        fn confined(&self) -> bool {
            self.confined
        }
    }
}
