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

/// `openat2(dir, rel, flags, resolve)`, or on a kernel without it (before Linux 5.6: RHEL 7 and
/// 8) an equivalent that is never looser: `strict` walks `rel` one component at a time through
/// no symlink at all (stricter than `RESOLVE_BENEATH`, which follows links that stay beneath);
/// otherwise (the user's own tree, local and ssh modes) a plain `openat`.
pub fn open_beneath(dir: &impl AsFd, rel: &[u8], flags: OFlags, resolve: ResolveFlags, strict: bool) -> io::Result<OwnedFd> {
    match rfs::openat2(dir, rel, flags | OFlags::CLOEXEC, Mode::empty(), resolve) {
        Err(rustix::io::Errno::NOSYS) if strict => open_components(dir, rel, flags),
        Err(rustix::io::Errno::NOSYS) => Ok(rfs::openat(dir, rel, flags | OFlags::CLOEXEC, Mode::empty())?),
        r => Ok(r?),
    }
}

/// `rel` opened one component at a time, each with `O_NOFOLLOW`: `..`, an absolute path or a
/// symlink anywhere is refused (`EXDEV`, `ELOOP` or `ENOTDIR`).
fn open_components(dir: &impl AsFd, rel: &[u8], flags: OFlags) -> io::Result<OwnedFd> {
    if rel.starts_with(b"/") {
        return Err(io::Error::from_raw_os_error(libc::EXDEV));
    }
    let parts: Vec<&[u8]> = rel.split(|&b| b == b'/').filter(|p| !p.is_empty() && *p != b".").collect();
    if parts.contains(&&b".."[..]) {
        return Err(io::Error::from_raw_os_error(libc::EXDEV));
    }
    let Some((last, dirs)) = parts.split_last() else {
        return Ok(rfs::openat(dir, ".", flags | OFlags::CLOEXEC, Mode::empty())?);
    };
    let mut cur: Option<OwnedFd> = None;
    for part in dirs {
        let next = match &cur {
            Some(c) => rfs::openat(c, *part, OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?,
            None => rfs::openat(dir, *part, OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?,
        };
        cur = Some(next);
    }
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(match &cur {
        Some(c) => rfs::openat(c, *last, flags, Mode::empty())?,
        None => rfs::openat(dir, *last, flags, Mode::empty())?,
    })
}

/// The destination directory everything is written under.
pub struct DestRoot {
    fd: OwnedFd,
    path: PathBuf,
    /// Beneath a daemon's root: never looser than `RESOLVE_BENEATH`, even without openat2.
    confined: bool,
}

impl DestRoot {
    /// `beneath`: the daemon's root the destination must resolve under, now (fsops::Beneath).
    pub fn open(beneath: Option<&Beneath>, path: &Path) -> io::Result<Self> {
        let fd = open_dir(beneath, path)?;
        Ok(Self { fd, path: path.to_path_buf(), confined: beneath.is_some() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Another handle on the same root (a `dup` of its descriptor).
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self { fd: self.fd.try_clone()?, path: self.path.clone(), confined: self.confined })
    }

    /// Absolute path of a relative one, for messages.
    pub fn display(&self, rel: &[u8]) -> String {
        if rel.is_empty() { self.path.display().to_string() } else { self.path.join(OsStr::from_bytes(rel)).display().to_string() }
    }

    /// Opens directory `rel` (empty = the root) without leaving the root.
    pub fn dir(&self, rel: &[u8]) -> io::Result<OwnedFd> {
        let rel: &[u8] = if rel.is_empty() { b"." } else { rel };
        open_beneath(&self.fd, rel, OFlags::RDONLY | OFlags::DIRECTORY, RESOLVE, self.confined)
    }

    /// Opens directory `rel` (empty = the root) through no symlink at all, for walking what
    /// `--delete` removes: a link there is an entry to remove, never a way in.
    pub fn dir_no_links(&self, rel: &[u8]) -> io::Result<OwnedFd> {
        let rel: &[u8] = if rel.is_empty() { b"." } else { rel };
        open_beneath(&self.fd, rel, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW, RESOLVE.union(ResolveFlags::NO_SYMLINKS), true)
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

/// Removes `name` if it is there. A read-only mount or an immutable directory refuses even to
/// remove what is not there (EROFS, EPERM): that is no error, so what the caller does next
/// (create a file) reports the real trouble.
pub fn unlink_at(dir: &impl AsFd, name: &[u8]) -> io::Result<()> {
    match rfs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(_) if matches!(stat_at(dir, name), Ok(None)) => Ok(()),
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

/// A directory tern writes in, with the tag that makes its temporary names its own.
pub struct Dir {
    pub fd: OwnedFd,
    pub tag: Tag,
}

impl Dir {
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        let tag = Tag::of(&fd)?;
        Ok(Self { fd, tag })
    }
}

impl AsFd for Dir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Eight hex digits derived from a directory's device and inode (docs/journal.md, "Names").
/// Every temporary, journal and marker tern keeps in that directory starts with `.tern.TAG.`;
/// a user's file of such a name in it is refused, never overwritten or hidden. A tree copied
/// from an interrupted destination carries another directory's tag, so its leftovers are
/// ordinary files here.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Tag([u8; 8]);

impl Tag {
    pub fn of(dir: &impl AsFd) -> io::Result<Self> {
        let st = rfs::fstat(dir)?;
        let mut h = blake3::Hasher::new();
        h.update(b"tern dir tag v1");
        h.update(&(st.st_dev as u64).to_le_bytes());
        h.update(&(st.st_ino as u64).to_le_bytes());
        let hex = h.finalize().to_hex();
        let mut tag = [0u8; 8];
        tag.copy_from_slice(&hex.as_bytes()[..8]);
        Ok(Self(tag))
    }

    fn prefix(&self) -> Vec<u8> {
        [&b".tern."[..], &self.0, b"."].concat()
    }

    /// Temporary name for a file `name` being received in this directory, and its journal's.
    /// Fixed length (a hash of the name), so any name up to NAME_MAX has them.
    pub fn temp_names(&self, name: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let hash = blake3::hash(name).to_hex();
        let base = [&self.prefix()[..], &hash.as_bytes()[..32]].concat();
        ([&base[..], b".part"].concat(), [&base[..], b".journal"].concat())
    }

    /// The resume marker of a copy tern created as this directory (layout.rs).
    pub fn marker(&self) -> Vec<u8> {
        [&self.prefix()[..], b"incomplete"].concat()
    }

    /// Whether `name` is in the namespace tern keeps for itself in this directory.
    pub fn reserves(&self, name: &[u8]) -> bool {
        name.starts_with(&self.prefix())
    }
}

/// Destination confinement: a root every path must resolve beneath (daemon mode), judged by the
/// kernel on the descriptor at the moment of use (`openat2` with `RESOLVE_BENEATH`), so a link
/// planted or swapped in by another session is refused, not followed. Links inside the root are
/// followed as usual.
#[derive(Debug)]
pub struct Beneath {
    fd: OwnedFd,
    root: PathBuf,
    /// Canonical path of the root, to place a descriptor within it (`depth`).
    real: PathBuf,
}

impl Beneath {
    /// The operator's root, trusted as named (its own links included).
    pub fn open(root: &Path) -> io::Result<Self> {
        let fd = rfs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        let real = std::fs::canonicalize(root)?;
        Ok(Self { fd, root: root.to_path_buf(), real })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn rel<'a>(&self, path: &'a Path) -> io::Result<&'a Path> {
        path.strip_prefix(&self.root).map_err(|_| io::Error::from_raw_os_error(libc::EXDEV))
    }

    fn at(&self, path: &Path, flags: OFlags) -> io::Result<OwnedFd> {
        let rel = self.rel(path)?;
        let rel: &Path = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
        open_beneath(&self.fd, rel.as_os_str().as_bytes(), flags, RESOLVE, true)
    }

    pub fn open_dir(&self, path: &Path) -> io::Result<OwnedFd> {
        self.at(path, OFlags::RDONLY | OFlags::DIRECTORY)
    }

    /// A file to read, never through a final link (links are sent as links).
    pub fn open_file(&self, path: &Path) -> io::Result<File> {
        Ok(File::from(self.at(path, OFlags::RDONLY | OFlags::NOFOLLOW)?))
    }

    /// `stat`, following links that stay beneath. `None` if absent.
    pub fn stat(&self, path: &Path) -> io::Result<Option<rfs::Stat>> {
        match self.at(path, OFlags::PATH) {
            Ok(fd) => Ok(Some(rfs::fstat(&fd)?)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `lstat` beneath the root: links on the way followed while they stay beneath, a final one
    /// not (it is the entry itself).
    pub fn lstat(&self, path: &Path) -> io::Result<rfs::Stat> {
        Ok(rfs::fstat(&self.at(path, OFlags::PATH | OFlags::NOFOLLOW)?)?)
    }

    pub fn mkdir(&self, path: &Path) -> io::Result<()> {
        let parent = path.parent().ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let name = path.file_name().ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let dir = self.open_dir(parent)?;
        Ok(rfs::mkdirat(&dir, name, Mode::from_raw_mode(0o755))?)
    }

    /// How many directories below the root `dir` really is (after every link), or `None` if the
    /// kernel places it elsewhere.
    pub fn depth(&self, dir: &impl AsFd) -> Option<usize> {
        let real = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&dir.as_fd()))).ok()?;
        real.strip_prefix(&self.real).ok().map(|r| r.components().count())
    }
}

/// Opens a directory: beneath a confinement root, or (local and ssh modes: the user's own view)
/// by its path.
pub fn open_dir(beneath: Option<&Beneath>, path: &Path) -> io::Result<OwnedFd> {
    match beneath {
        Some(b) => b.open_dir(path),
        None => Ok(rfs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?),
    }
}

/// Whether a link at `link_dir_depth` levels below a daemon's root, with this target, can only
/// resolve beneath the root whatever the tree holds: relative, `..` only at its start, and no
/// more of them than the directory is deep. Every link tern creates there meets it, so by
/// induction a chain of them stays inside too; the depth is where the kernel puts the link's
/// directory, not what its path says (`a/b/up -> ../..` makes `a/b/up/t` a child of the root).
pub fn link_stays_beneath(link_dir_depth: usize, target: &[u8]) -> bool {
    if target.is_empty() || target.starts_with(b"/") {
        return false;
    }
    let mut ups = 0usize;
    let mut seen_name = false;
    for part in target.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." if seen_name => return false,
            b".." => ups += 1,
            _ => seen_name = true,
        }
    }
    ups <= link_dir_depth
}

/// Runs `op`; while the process is out of descriptors or memory (a limit shared with the rest of
/// the process, not a fault of the file), waits for some to come free and tries again, for about
/// 25 s in all, before the error stands.
pub fn waiting_for_descriptors<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut waits = 0u64;
    loop {
        match op() {
            Err(e) if crate::error::ErrorKind::of_io(&e) == crate::error::ErrorKind::ResourceLimit && waits < 50 => {
                waits += 1;
                std::thread::sleep(std::time::Duration::from_millis(20 * waits));
            }
            r => return r,
        }
    }
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
        let root = DestRoot::open(None, root_dir.path()).unwrap();
        assert_eq!(root.dir(b"out").unwrap_err().raw_os_error(), Some(libc::EXDEV));
        assert!(root.mkdir_all(b"out/x").is_err());
        assert!(root.dir(b"inlink").is_ok(), "symlinks inside the root are fine");
        root.mkdir_all(b"a/b/c").unwrap();
        assert!(root_dir.path().join("a/b/c").is_dir());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn names_are_per_directory_and_reserved() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let ta = Tag::of(&rfs::open(a.path(), OFlags::RDONLY, Mode::empty()).unwrap()).unwrap();
        let tb = Tag::of(&rfs::open(b.path(), OFlags::RDONLY, Mode::empty()).unwrap()).unwrap();
        assert_ne!(ta, tb);
        let (p, j) = ta.temp_names(b"a");
        assert!(ta.reserves(&p) && ta.reserves(&j) && ta.reserves(&ta.marker()));
        assert!(!tb.reserves(&p), "another directory's leftovers are ordinary files there");
        for user in [&b"a"[..], b".a.tern-part", b".a.tern-journal", b".tern-incomplete", b".tern.", b".tern.x"] {
            assert!(!ta.reserves(user), "{}", String::from_utf8_lossy(user));
        }
        let long = vec![b'a'; 255];
        let (p, j) = ta.temp_names(&long);
        assert!(p.len() < 64 && j.len() < 64);
        assert_ne!(ta.temp_names(b"x").0, ta.temp_names(b"y").0);
    }

    #[test]
    fn links_beneath_by_depth() {
        assert!(link_stays_beneath(0, b"x/y"));
        assert!(link_stays_beneath(2, b"../../c"));
        assert!(!link_stays_beneath(1, b"../../c"));
        assert!(!link_stays_beneath(5, b"a/b/s/../.."), "'..' after a name may climb through a link");
        assert!(!link_stays_beneath(5, b"/etc"));
        assert!(!link_stays_beneath(5, b""));
        assert!(link_stays_beneath(0, b"./x"));
    }

    #[test]
    fn beneath_refuses_planted_links_and_places_descriptors_by_resolution() {
        let outside = tempfile::tempdir().unwrap();
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("x")).unwrap();
        std::os::unix::fs::symlink("../..", root.join("a/b/up")).unwrap();
        let b = Beneath::open(root).unwrap();
        assert_eq!(b.open_dir(&root.join("x")).unwrap_err().raw_os_error(), Some(libc::EXDEV));
        assert!(b.mkdir(&root.join("x/new")).is_err());
        assert!(DestRoot::open(Some(&b), &root.join("x")).is_err());
        assert!(b.open_file(&root.join("x/anything")).is_err());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        // `a/b/up` says depth 3; the kernel puts it at the root.
        let up = b.open_dir(&root.join("a/b/up")).unwrap();
        assert_eq!(b.depth(&up), Some(0));
        assert_eq!(b.depth(&b.open_dir(&root.join("a/b")).unwrap()), Some(2));
        assert!(!link_stays_beneath(b.depth(&up).unwrap(), b"../.."));
    }

    #[test]
    fn without_openat2_the_component_walk_follows_no_link() {
        let outside = tempfile::tempdir().unwrap();
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("x")).unwrap();
        std::os::unix::fs::symlink("a", root.join("in")).unwrap();
        let fd = rfs::open(root, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let dir = OFlags::RDONLY | OFlags::DIRECTORY;
        assert!(open_components(&fd, b"a/b", dir).is_ok());
        assert!(open_components(&fd, b"", dir).is_ok());
        for bad in [&b"x"[..], b"x/y", b"in/b", b"a/../a", b"/etc", b"a/b/../../x"] {
            assert!(open_components(&fd, bad, dir).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
