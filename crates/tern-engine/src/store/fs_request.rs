//! File-system requests: `tern ls`, `stat`, `mkdir`, `rm`, and the expansion of remote globs
//! (`tern cp 'host:/dir/*.h5' .`). The client asks over a control session without data streams
//! (`FsRequest`, docs/protocol.md "File-system requests"); the server, or this process for a
//! local path, does the work here.
//!
//! A daemon's client is untrusted: its paths are resolved like a transfer's (`Roots::resolve`),
//! then every directory is opened beneath its root at the moment of use (`fsops::Beneath`,
//! `openat2` `RESOLVE_BENEATH`), a final link is never followed by stat or remove, and a tree is
//! removed through no link at all (`DestRoot::dir_no_links`).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use rustix::fs::{self as rfs, Mode, OFlags};
use tern_proto::glob::{ComponentGlob, has_meta};
use tern_proto::msg::{FS_ENTRIES_BYTES, FS_FORCE, FS_PARENTS, FS_RECURSIVE, MAX_FS_BYTES, MAX_FS_ENTRIES};
use tern_proto::{FsEntry, FsKind, FsOp};

use crate::error::{ErrorKind, Side, TransferError, show};
use crate::store::Sink as _;
use crate::store::fsops::{self, Beneath, DestRoot};
use crate::store::posix::PosixSink;
use crate::store::roots::Roots;

/// Which side an operation's errors belong to: reading ones the source, changing ones the
/// destination (so the hints say "check the source path" or "check write permission").
pub(crate) fn side_of(op: FsOp) -> Side {
    match op {
        FsOp::List | FsOp::Stat | FsOp::Glob => Side::Source,
        FsOp::Mkdir | FsOp::Remove => Side::Destination,
    }
}

/// Collects the answer, in bounded batches, and stops at `MAX_FS_ENTRIES`.
pub(crate) struct Sink<'a> {
    out: &'a mut dyn FnMut(Vec<FsEntry>) -> Result<(), TransferError>,
    batch: Vec<FsEntry>,
    bytes: usize,
    pub(crate) count: u64,
    total_bytes: usize,
}

impl<'a> Sink<'a> {
    pub(crate) fn new(out: &'a mut dyn FnMut(Vec<FsEntry>) -> Result<(), TransferError>) -> Self {
        Self { out, batch: Vec::new(), bytes: 0, count: 0, total_bytes: 0 }
    }

    fn push(&mut self, e: FsEntry) -> Result<(), TransferError> {
        if self.count as usize >= MAX_FS_ENTRIES {
            return Err(too_many());
        }
        if e.name.len() > tern_proto::limits::MAX_PATH {
            return Err(TransferError::fatal(Side::Source, format!("{}...: a path longer than {} bytes cannot be listed; list a deeper directory", show(&e.name[..64]), tern_proto::limits::MAX_PATH)));
        }
        let size = entry_bytes(&e);
        if self.total_bytes + size > MAX_FS_BYTES {
            return Err(too_many());
        }
        self.count += 1;
        self.total_bytes += size;
        self.bytes += size;
        self.batch.push(e);
        if self.batch.len() >= tern_proto::limits::MAX_LIST || self.bytes >= FS_ENTRIES_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    pub(crate) fn flush(&mut self) -> Result<(), TransferError> {
        self.bytes = 0;
        if self.batch.is_empty() {
            return Ok(());
        }
        (self.out)(std::mem::take(&mut self.batch))
    }
}

pub(crate) fn entry_bytes(e: &FsEntry) -> usize {
    e.name.len() + e.target.len() + 32
}

pub(crate) fn too_many() -> TransferError {
    TransferError::fatal(Side::Source, format!("more than {MAX_FS_ENTRIES} entries or {} MiB of names; list a subdirectory (or a narrower pattern)", MAX_FS_BYTES >> 20))
}

/// A request's path once resolved: a root (never removed) or an entry in a parent directory.
enum Target {
    Root(PathBuf),
    Leaf { parent: PathBuf, name: OsString },
}

impl Target {
    fn path(&self) -> PathBuf {
        match self {
            Target::Root(p) => p.clone(),
            Target::Leaf { parent, name } => parent.join(name),
        }
    }
}

/// Resolves `wire` without following its final component: only the parent is resolved (and
/// checked to stay in a root), so a link planted as the final name is an entry, not a way out.
fn target(roots: &Roots, wire: &[u8]) -> Result<Target, TransferError> {
    match roots {
        Roots::Home(_) => {
            let full = roots.resolve(wire)?;
            if full.parent().is_none() {
                return Ok(Target::Root(full));
            }
            let (Some(parent), Some(name)) = (full.parent(), full.file_name()) else {
                return Err(TransferError::fatal(Side::Source, format!("{}: ends in '..'; name the directory itself", show(wire))));
            };
            Ok(Target::Leaf { parent: parent.to_path_buf(), name: name.to_os_string() })
        }
        Roots::Confined(list) => {
            let mut parts: Vec<&OsStr> = Vec::new();
            for c in Path::new(OsStr::from_bytes(wire)).components() {
                match c {
                    Component::Normal(n) => parts.push(n),
                    Component::RootDir | Component::CurDir => {}
                    Component::ParentDir | Component::Prefix(_) => {
                        return Err(TransferError::fatal(Side::Network, format!("{}: '..' is not allowed in daemon paths; refused", show(wire))));
                    }
                }
            }
            // The root itself: `/` with one root, `/NAME` with several.
            let at_root = if list.len() == 1 { parts.is_empty() } else { parts.len() <= 1 };
            if at_root {
                return Ok(Target::Root(roots.resolve(wire)?));
            }
            let (name, up) = parts.split_last().expect("not at a root");
            let mut parent_wire = b"/".to_vec();
            for p in up {
                parent_wire.extend_from_slice(p.as_bytes());
                parent_wire.push(b'/');
            }
            // Errors name the whole path the client asked for, not just its parent.
            let parent = roots.resolve(&parent_wire).map_err(|e| TransferError::fatal(e.side, e.message.replacen(&show(&parent_wire), &show(wire), 1)))?;
            Ok(Target::Leaf { parent, name: name.to_os_string() })
        }
    }
}

fn beneath(roots: &Roots, path: &Path, side: Side) -> Result<Option<Beneath>, TransferError> {
    roots.beneath(path).map_err(|e| TransferError::io(side, path.display().to_string(), "daemon root unavailable", &e).into_fatal())
}

fn kind_of(st: &rfs::Stat) -> FsKind {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => FsKind::File,
        libc::S_IFDIR => FsKind::Dir,
        libc::S_IFLNK => FsKind::Symlink,
        _ => FsKind::Other,
    }
}

/// The entry for `st`, named `name`; a link's target is read from `name_in_dir` in `dir`.
fn entry(name: Vec<u8>, st: &rfs::Stat, dir: &impl AsFd, name_in_dir: &[u8]) -> FsEntry {
    let kind = kind_of(st);
    let target = if kind == FsKind::Symlink { rfs::readlinkat(dir, name_in_dir, Vec::new()).map(|t| t.into_bytes()).unwrap_or_default() } else { Vec::new() };
    FsEntry { kind, name, size: st.st_size as u64, mode: st.st_mode, mtime_s: st.st_mtime, mtime_ns: (st.st_mtime_nsec as u32).min(999_999_999), target }
}

/// Does the request, as the server (or locally, with `Roots::Home` of the working directory):
/// the entries go to `sink`, an error comes back as one line naming the path.
pub(crate) fn perform(roots: &Roots, op: FsOp, flags: u8, wire: &[u8], sink: &mut Sink) -> Result<(), TransferError> {
    let side = side_of(op);
    let fail = |what: &str, shown: &[u8], e: &io::Error| -> TransferError {
        let e = refine(e);
        TransferError::io(side, show(shown), what, &e).into_fatal()
    };
    if op == FsOp::Glob {
        return glob(roots, wire, sink);
    }
    // A daemon with several roots shows them as the directories of its `/`.
    if let Roots::Confined(list) = roots
        && list.len() > 1
        && op == FsOp::List
        && !Path::new(OsStr::from_bytes(wire)).components().any(|c| matches!(c, Component::Normal(_) | Component::ParentDir))
    {
        for (name, dir) in list {
            let fd = fsops::open_dir(None, dir).map_err(|e| fail("daemon root unavailable", name.as_bytes(), &e))?;
            sink.push(entry(name.as_bytes().to_vec(), &rfs::fstat(&fd).map_err(|e| fail("daemon root unavailable", name.as_bytes(), &io::Error::from(e)))?, &fd, b"."))?;
        }
        return Ok(());
    }
    let t = target(roots, wire)?;
    let path = t.path();
    let b = beneath(
        roots,
        &match &t {
            Target::Root(p) => p.clone(),
            Target::Leaf { parent, .. } => parent.clone(),
        },
        side,
    )?;
    let b = b.as_ref();
    match op {
        FsOp::List => match fsops::open_dir(b, &path) {
            Ok(fd) => list(fd, flags & FS_RECURSIVE != 0, sink).map_err(|(rel, e)| fail("cannot list", &join(wire, &rel), &e)),
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => stat(&t, b).map_err(|e| fail("cannot list", wire, &e)).and_then(|(st, dir, name)| sink.push(entry(name.clone(), &st, &dir, &name))),
            Err(e) => Err(fail("cannot list", wire, &e)),
        },
        FsOp::Stat => {
            let (st, dir, name) = stat(&t, b).map_err(|e| fail("cannot stat", wire, &e))?;
            sink.push(entry(wire.to_vec(), &st, &dir, &name))
        }
        FsOp::Mkdir => mkdir(&t, b, flags & FS_PARENTS != 0).map_err(|e| fail("cannot create directory", wire, &e)),
        FsOp::Remove if matches!(roots, Roots::Home(start) if *start == path) => {
            Err(TransferError::fatal(side, format!("{}: is the starting directory (your home over ssh, the working directory here); refusing to remove it", show(wire))))
        }
        FsOp::Remove => remove(&t, b, flags).map_err(|e| match e {
            Refusal::Io(e) => fail("cannot remove", wire, &e),
            Refusal::Why(m) => TransferError::fatal(side, format!("{}: {m}", show(wire))),
        }),
        FsOp::Glob => unreachable!(),
    }
}

/// `EXDEV` from a descriptor opened beneath a root means a link leads out of it (without
/// openat2 the stricter component walk says `ELOOP` for any link, and is reported as such).
fn refine(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(libc::EXDEV) => io::Error::other("the path leaves the daemon's root through a symlink; refused"),
        Some(n) => io::Error::from_raw_os_error(n),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

/// `a` + `/` + `b`, either part possibly empty.
fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
    match (a.is_empty(), b.is_empty()) {
        (_, true) => a.to_vec(),
        (true, false) => b.to_vec(),
        _ if a.ends_with(b"/") => [a, b].concat(),
        _ => [a, b"/", b].concat(),
    }
}

/// The target's own metadata, not following a final link; with the directory it is in and its
/// name there (`.` of the root itself).
fn stat(t: &Target, b: Option<&Beneath>) -> io::Result<(rfs::Stat, OwnedFd, Vec<u8>)> {
    match t {
        Target::Root(p) => {
            let fd = fsops::open_dir(b, p)?;
            Ok((rfs::fstat(&fd)?, fd, b".".to_vec()))
        }
        Target::Leaf { parent, name } => {
            let dir = fsops::open_dir(b, parent)?;
            match fsops::stat_at(&dir, name.as_bytes())? {
                Some(st) => Ok((st, dir, name.as_bytes().to_vec())),
                None => Err(io::Error::from_raw_os_error(libc::ENOENT)),
            }
        }
    }
}

/// A directory's entries sorted by name, each not followed; with `recursive` then each
/// subdirectory's (opened with `O_NOFOLLOW` from its parent: never through a link). The error
/// names the directory (relative) that failed.
fn list(top: OwnedFd, recursive: bool, sink: &mut Sink) -> Result<(), (Vec<u8>, io::Error)> {
    // Directories still to list: (their parent, name there, path relative to the top).
    let mut todo: Vec<(Rc<OwnedFd>, Vec<u8>, Vec<u8>)> = Vec::new();
    let mut first = Some((Rc::new(top), Vec::new()));
    loop {
        let (fd, rel) = match first.take() {
            Some(x) => x,
            None => {
                let Some((parent, name, rel)) = todo.pop() else { return Ok(()) };
                match rfs::openat(&*parent, name.as_slice(), OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()) {
                    Ok(fd) => (Rc::new(fd), rel),
                    // Gone, or replaced by a link or a file since it was listed: nothing to descend into.
                    Err(rustix::io::Errno::NOENT | rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => continue,
                    Err(e) => return Err((rel, e.into())),
                }
            }
        };
        let err = |e: io::Error| (rel.clone(), e);
        let mut names = Vec::new();
        let mut rd = rfs::Dir::read_from(&*fd).map_err(|e| err(e.into()))?;
        while let Some(ent) = rd.read() {
            let name = ent.map_err(|e| err(e.into()))?.file_name().to_bytes().to_vec();
            if name != b"." && name != b".." {
                names.push(name);
            }
        }
        names.sort();
        let mut subdirs = Vec::new();
        for name in names {
            let Some(st) = fsops::stat_at(&*fd, &name).map_err(err)? else { continue };
            let path = join(&rel, &name);
            if recursive && kind_of(&st) == FsKind::Dir {
                subdirs.push((fd.clone(), name.clone(), path.clone()));
            }
            sink.push(entry(path, &st, &*fd, &name)).map_err(|e| (rel.clone(), io::Error::other(e.message)))?;
        }
        todo.extend(subdirs.into_iter().rev());
    }
}

fn mkdir(t: &Target, b: Option<&Beneath>, parents: bool) -> io::Result<()> {
    let path = match t {
        Target::Root(_) if parents => return Ok(()),
        Target::Root(_) => return Err(io::Error::from_raw_os_error(libc::EEXIST)),
        Target::Leaf { .. } => t.path(),
    };
    match (b, parents) {
        (Some(b), true) => {
            let rel = path.strip_prefix(b.root()).map_err(|_| io::Error::from_raw_os_error(libc::EXDEV))?;
            DestRoot::open(Some(b), b.root())?.mkdir_all(rel.as_os_str().as_bytes()).map(|_| ())
        }
        (Some(b), false) => b.mkdir(&path),
        (None, true) => std::fs::create_dir_all(&path),
        (None, false) => std::fs::create_dir(&path),
    }
}

enum Refusal {
    Io(io::Error),
    Why(String),
}

impl From<io::Error> for Refusal {
    fn from(e: io::Error) -> Self {
        Refusal::Io(e)
    }
}

fn remove(t: &Target, b: Option<&Beneath>, flags: u8) -> Result<(), Refusal> {
    let Target::Leaf { parent, name } = t else {
        return Err(Refusal::Why("is a root of this server; refusing to remove it (remove what is in it instead)".into()));
    };
    let name = name.as_bytes();
    // The parent opened beneath the root; from there on nothing is followed.
    let dir = DestRoot::open(b, parent)?;
    let st = fsops::stat_at(&dir.dir(b"")?, name)?;
    match st {
        None if flags & FS_FORCE != 0 => Ok(()),
        None => Err(Refusal::Io(io::Error::from_raw_os_error(libc::ENOENT))),
        Some(st) if kind_of(&st) == FsKind::Dir => {
            if flags & FS_RECURSIVE == 0 {
                return Err(Refusal::Why("is a directory; pass -r to remove it and everything under it".into()));
            }
            Ok(PosixSink::new(dir, None).remove_tree(name).map_err(io::Error::from)?)
        }
        Some(_) => Ok(fsops::unlink_at(&dir.dir(b"")?, name)?),
    }
}

/// Expands `pattern` component by component: literal components are taken as they are, glob
/// components are matched against a directory's names (opened beneath the root). Matches come
/// sorted, spelled with the pattern's own prefix; none is an error naming the pattern.
fn glob(roots: &Roots, pattern: &[u8], sink: &mut Sink) -> Result<(), TransferError> {
    let side = Side::Source;
    let absolute = pattern.starts_with(b"/");
    let comps: Vec<&[u8]> = pattern.split(|&c| c == b'/').filter(|c| !c.is_empty() && *c != b".").collect();
    if matches!(roots, Roots::Confined(_)) && comps.contains(&&b".."[..]) {
        return Err(TransferError::fatal(Side::Network, format!("{}: '..' is not allowed in daemon paths; refused", show(pattern))));
    }
    let first = comps.iter().position(|c| has_meta(c)).unwrap_or(comps.len());
    let mut prefix = if absolute { b"/".to_vec() } else { Vec::new() };
    for c in &comps[..first] {
        prefix = join(&prefix, c);
    }
    let base = roots.resolve(&prefix).map_err(|e| TransferError::fatal(e.side, format!("{}: {}", show(pattern), e.message)))?;
    let b = beneath(roots, &base, side)?;
    let b = b.as_ref();
    let mut found: Vec<(Vec<u8>, PathBuf)> = vec![(prefix, base)];
    let mut visited = 0usize;
    for comp in &comps[first..] {
        if !has_meta(comp) {
            for (w, p) in found.iter_mut() {
                *w = join(w, comp);
                p.push(OsStr::from_bytes(comp));
            }
            continue;
        }
        let g = ComponentGlob::new(comp).map_err(|m| TransferError::fatal(side, m))?;
        let mut next = Vec::new();
        for (w, p) in &found {
            // As a shell does: a directory that cannot be read (or a link out of the root, on
            // a daemon) contributes nothing.
            let Ok(fd) = fsops::open_dir(b, p) else { continue };
            let Ok(mut rd) = rfs::Dir::read_from(&fd) else { continue };
            let mut names = Vec::new();
            while let Some(Ok(ent)) = rd.read() {
                visited += 1;
                if visited > MAX_FS_ENTRIES {
                    return Err(too_many());
                }
                let name = ent.file_name().to_bytes();
                if g.matches(name) {
                    names.push(name.to_vec());
                }
            }
            names.sort();
            next.extend(names.into_iter().map(|n| (join(w, &n), p.join(OsStr::from_bytes(&n)))));
        }
        found = next;
    }
    let mut any = false;
    for (w, p) in found {
        let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else { continue };
        let Ok(dir) = fsops::open_dir(b, parent) else { continue };
        if let Ok(Some(st)) = fsops::stat_at(&dir, name.as_bytes()) {
            sink.push(entry(w, &st, &dir, name.as_bytes()))?;
            any = true;
        }
    }
    // As a shell without nullglob passes an unmatched pattern on: a file really named
    // `data[1].h5` is still found by its name.
    if !any && perform(roots, FsOp::Stat, 0, pattern, sink).is_ok() {
        return Ok(());
    }
    if !any {
        return Err(TransferError::fatal(side, format!("{}: no match (check the pattern; quote it so the local shell leaves it alone)", show(pattern))).with_kind(ErrorKind::NotFound));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(roots: &Roots, op: FsOp, flags: u8, wire: &str) -> Result<Vec<FsEntry>, TransferError> {
        let mut out = Vec::new();
        let mut collect = |b: Vec<FsEntry>| {
            out.extend(b);
            Ok(())
        };
        let mut sink = Sink::new(&mut collect);
        perform(roots, op, flags, wire.as_bytes(), &mut sink)?;
        sink.flush()?;
        Ok(out)
    }

    fn names(v: &[FsEntry]) -> Vec<String> {
        v.iter().map(|e| show(&e.name)).collect()
    }

    #[test]
    fn confined_ops_stay_beneath_the_root() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("d/e")).unwrap();
        std::fs::write(root.join("d/a.h5"), b"aa").unwrap();
        std::fs::write(root.join("d/b.h5"), b"b").unwrap();
        std::fs::write(root.join("d/.h.h5"), b"h").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
        let roots = Roots::Confined(vec![("r".into(), root.clone())]);
        assert_eq!(names(&run(&roots, FsOp::List, 0, "/d").unwrap()), [".h.h5", "a.h5", "b.h5", "e"]);
        assert_eq!(names(&run(&roots, FsOp::List, FS_RECURSIVE, "/").unwrap()), ["d", "out", "d/.h.h5", "d/a.h5", "d/b.h5", "d/e"]);
        assert_eq!(names(&run(&roots, FsOp::Glob, 0, "/d/*.h5").unwrap()), ["/d/a.h5", "/d/b.h5"]);
        assert_eq!(names(&run(&roots, FsOp::Glob, 0, "d/.*").unwrap()), ["d/.h.h5"]);
        assert!(run(&roots, FsOp::Glob, 0, "/d/*.nc").is_err());
        assert!(run(&roots, FsOp::Glob, 0, "/out/*").is_err(), "nothing outside is listed");
        assert!(run(&roots, FsOp::List, 0, "/out").is_err());
        assert!(run(&roots, FsOp::Mkdir, 0, "/out/x").is_err());
        assert!(run(&roots, FsOp::Mkdir, FS_PARENTS, "/out/x/y").is_err());
        assert!(run(&roots, FsOp::Remove, FS_RECURSIVE, "/../x").is_err());
        assert!(run(&roots, FsOp::Remove, FS_RECURSIVE, "/").is_err(), "the root stays");
        let st = run(&roots, FsOp::Stat, 0, "/out").unwrap();
        assert_eq!(st[0].kind, FsKind::Symlink);
        run(&roots, FsOp::Remove, 0, "/out").unwrap();
        assert!(outside.path().join("secret").exists() && !root.join("out").exists(), "only the link went");
        run(&roots, FsOp::Mkdir, FS_PARENTS, "/n/m").unwrap();
        assert!(root.join("n/m").is_dir());
        assert!(run(&roots, FsOp::Remove, 0, "/d").is_err(), "a directory needs -r");
        run(&roots, FsOp::Remove, FS_RECURSIVE, "/d").unwrap();
        assert!(!root.join("d").exists());
        assert!(run(&roots, FsOp::Remove, 0, "/nothing").is_err());
        run(&roots, FsOp::Remove, FS_FORCE, "/nothing").unwrap();
    }

    #[test]
    fn the_sink_cuts_batches_by_count_and_bytes() {
        let mut batches = Vec::new();
        let mut out = |b: Vec<FsEntry>| {
            batches.push(b.len());
            Ok(())
        };
        let mut sink = Sink::new(&mut out);
        for i in 0..5000u32 {
            sink.push(FsEntry { kind: FsKind::File, name: vec![b'x'; 200 + (i % 2) as usize], size: 0, mode: 0, mtime_s: 0, mtime_ns: 0, target: vec![] }).unwrap();
        }
        sink.flush().unwrap();
        assert_eq!(batches.iter().sum::<usize>(), 5000);
        assert!(batches.iter().all(|&n| n * 232 <= FS_ENTRIES_BYTES + 232), "{batches:?}");
    }

    #[test]
    fn the_sink_stops_at_its_caps() {
        let mut drop_all = |_: Vec<FsEntry>| Ok(());
        let e = |len: usize| FsEntry { kind: FsKind::File, name: vec![b'x'; len], size: 0, mode: 0, mtime_s: 0, mtime_ns: 0, target: vec![] };
        let mut sink = Sink::new(&mut drop_all);
        for _ in 0..MAX_FS_ENTRIES {
            sink.push(e(1)).unwrap();
        }
        assert!(sink.push(e(1)).unwrap_err().message.contains("more than"));
        let mut drop_all = |_: Vec<FsEntry>| Ok(());
        let mut sink = Sink::new(&mut drop_all);
        let fits = MAX_FS_BYTES / (4096 + 32);
        for _ in 0..fits {
            sink.push(e(4096)).unwrap();
        }
        assert!(sink.push(e(4096)).is_err(), "the byte cap");
        assert!(sink.push(e(4097)).is_err(), "a name longer than the protocol allows");
    }
}
