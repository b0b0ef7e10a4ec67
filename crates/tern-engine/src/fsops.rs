//! Destination-side file-system operations that can never leave the destination root.
//!
//! Every directory is opened with `openat2(RESOLVE_BENEATH)` relative to the root's descriptor,
//! so `..`, absolute paths and symlinks pointing out are refused by the kernel itself; the final
//! name is then used relative to that directory descriptor with `O_NOFOLLOW`.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, ResolveFlags};

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

/// The destination directory everything is written under.
pub struct DestRoot {
    fd: OwnedFd,
    path: PathBuf,
}

impl DestRoot {
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = rfs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(Self { fd, path: path.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Absolute path of a relative one, for messages.
    pub fn display(&self, rel: &[u8]) -> String {
        if rel.is_empty() { self.path.display().to_string() } else { self.path.join(OsStr::from_bytes(rel)).display().to_string() }
    }

    /// Opens directory `rel` (empty = the root) without leaving the root.
    pub fn dir(&self, rel: &[u8]) -> io::Result<OwnedFd> {
        let rel: &[u8] = if rel.is_empty() { b"." } else { rel };
        Ok(rfs::openat2(&self.fd, rel, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty(), RESOLVE)?)
    }

    /// Creates `rel` and its missing parents (mode 0755 before umask); existing dirs are kept.
    /// True if this call created `rel` itself (so it held nothing before).
    pub fn mkdir_all(&self, rel: &[u8]) -> io::Result<bool> {
        if rel.is_empty() {
            return Ok(false);
        }
        match self.dir(rel) {
            Ok(_) => return Ok(false),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        let parent = tern_proto::path::parent(rel);
        self.mkdir_all(parent)?;
        let parent_fd = self.dir(parent)?;
        match rfs::mkdirat(&parent_fd, tern_proto::path::file_name(rel), Mode::from_raw_mode(0o755)) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::EXIST) => {
                // Raced with another creator, or a non-directory stands there.
                self.dir(rel).map(|_| false)
            }
            Err(e) => Err(e.into()),
        }
    }

    pub fn syncfs(&self) -> io::Result<()> {
        Ok(rfs::syncfs(&self.fd)?)
    }
}

/// Metadata of `name` in `dir`, not following a final symlink. `None` if absent.
pub fn stat_at(dir: &impl AsFd, name: &[u8]) -> io::Result<Option<rfs::Stat>> {
    match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Opens (creating if needed) a temporary file for writing, never following a symlink.
pub fn open_temp(dir: &impl AsFd, name: &[u8]) -> io::Result<File> {
    let fd = rfs::openat(dir, name, OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::from_raw_mode(0o600))?;
    Ok(File::from(fd))
}

/// Opens an existing regular file for reading, never following a symlink.
pub fn open_read(dir: &impl AsFd, name: &[u8]) -> io::Result<File> {
    let fd = rfs::openat(dir, name, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
    Ok(File::from(fd))
}

pub fn rename_at(dir: &impl AsFd, from: &[u8], to: &[u8]) -> io::Result<()> {
    Ok(rfs::renameat(dir, from, dir, to)?)
}

pub fn unlink_at(dir: &impl AsFd, name: &[u8]) -> io::Result<()> {
    match rfs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

pub fn rmdir_at(dir: &impl AsFd, name: &[u8]) -> io::Result<()> {
    Ok(rfs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
}

pub fn symlink_at(target: &[u8], dir: &impl AsFd, name: &[u8]) -> io::Result<()> {
    Ok(rfs::symlinkat(target, dir, name)?)
}

/// Sets mode and mtime on an open file (atime is set to the same instant).
pub fn set_meta(file: &File, mode: Option<u32>, mtime: Option<(i64, u32)>) -> io::Result<()> {
    if let Some(mode) = mode {
        rfs::fchmod(file, Mode::from_raw_mode(mode & 0o7777))?;
    }
    if let Some((s, ns)) = mtime {
        let t = rfs::Timespec { tv_sec: s, tv_nsec: ns as _ };
        rfs::futimens(file, &rfs::Timestamps { last_access: t, last_modification: t })?;
    }
    Ok(())
}

/// Sets mode and mtime of an entry by name (directories and, for mtime only, symlinks).
pub fn set_meta_at(dir: &impl AsFd, name: &[u8], mode: Option<u32>, mtime: Option<(i64, u32)>, is_link: bool) -> io::Result<()> {
    if let Some(mode) = mode.filter(|_| !is_link) {
        rfs::chmodat(dir, name, Mode::from_raw_mode(mode & 0o7777), AtFlags::empty())?;
    }
    if let Some((s, ns)) = mtime {
        let t = rfs::Timespec { tv_sec: s, tv_nsec: ns as _ };
        rfs::utimensat(dir, name, &rfs::Timestamps { last_access: t, last_modification: t }, AtFlags::SYMLINK_NOFOLLOW)?;
    }
    Ok(())
}

const NAME_MAX: usize = 255;

/// Temporary name for a file being received, and its journal's name.
pub fn temp_names(name: &[u8]) -> (Vec<u8>, Vec<u8>) {
    // The leading '.' and the ".tern-journal" suffix must fit in NAME_MAX with the name.
    let base: Vec<u8> = if 1 + name.len() + ".tern-journal".len() <= NAME_MAX { [b".", name].concat() } else { format!(".tern-{}", &blake3::hash(name).to_hex()[..32]).into_bytes() };
    ([&base[..], b".tern-part"].concat(), [&base[..], b".tern-journal"].concat())
}

/// Whether a directory entry is one of our temporaries (never deleted by `--delete` as extra,
/// never listed as data).
pub fn is_temp_name(name: &[u8]) -> bool {
    name.starts_with(b".") && (name.ends_with(b".tern-part") || name.ends_with(b".tern-journal"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_symlink_escape() {
        let outside = tempfile::tempdir().unwrap();
        let root_dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root_dir.path().join("out")).unwrap();
        std::fs::create_dir(root_dir.path().join("in")).unwrap();
        std::os::unix::fs::symlink("in", root_dir.path().join("inlink")).unwrap();
        let root = DestRoot::open(root_dir.path()).unwrap();
        assert_eq!(root.dir(b"out").unwrap_err().raw_os_error(), Some(libc::EXDEV));
        assert!(root.mkdir_all(b"out/x").is_err());
        assert!(root.dir(b"inlink").is_ok(), "symlinks inside the root are fine");
        root.mkdir_all(b"a/b/c").unwrap();
        assert!(root_dir.path().join("a/b/c").is_dir());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn temp_names_fit_name_max() {
        let (p, j) = temp_names(b"x");
        assert_eq!(p, b".x.tern-part");
        assert_eq!(j, b".x.tern-journal");
        let long = vec![b'a'; 250];
        let (p, j) = temp_names(&long);
        assert!(p.len() <= NAME_MAX && j.len() <= NAME_MAX);
        assert!(is_temp_name(&p) && is_temp_name(&j));
    }
}
