//! Where received entries land: cp/scp naming rules, plus resume into the same place.
//!
//! `-r src dst` makes `dst` a copy of `src` when `dst` does not exist, `dst/src` when it is a
//! directory, and `src/.` (or `sync`) copies the contents. A directory tern created as the copy
//! carries a marker (`.tern.TAG.incomplete`, fsops::Tag) naming the source until the transfer completes, so a
//! re-run after an interruption resumes into it instead of nesting a second copy.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use tern_proto::{Entry, EntryKind};

use crate::error::{Side, TransferError};
use crate::store::fsops::{self, Beneath, Tag};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mapping {
    /// Entry paths are used as they are, under the root.
    Identity,
    /// The first component (the source's name) is replaced by `new_base` (empty: the root).
    Strip { base: Vec<u8>, new_base: Vec<u8> },
}

#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) root: PathBuf,
    pub(crate) mapping: Mapping,
    /// The marker (a name in the root) to remove when the transfer completes.
    pub(crate) marker: Option<Vec<u8>>,
    /// The root is a mirror of the source (sync): `--delete` may remove extras under it.
    pub(crate) mirror: bool,
    /// This session created the root, so nothing stood in it before.
    pub(crate) created_root: bool,
}

fn fatal(msg: String) -> TransferError {
    TransferError::fatal(Side::Destination, msg)
}

/// Whether `p` is a directory (`Some(true)`), something else, or absent; links followed, and
/// beneath a daemon's root only those that stay beneath it.
fn kind(beneath: Option<&Beneath>, p: &Path) -> std::io::Result<Option<bool>> {
    match beneath {
        Some(b) => Ok(b.stat(p)?.map(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)),
        None => match fs::metadata(p) {
            Ok(m) => Ok(Some(m.is_dir())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        },
    }
}

fn mkdir(beneath: Option<&Beneath>, p: &Path) -> std::io::Result<()> {
    match beneath {
        Some(b) => b.mkdir(p),
        None => fs::create_dir(p),
    }
}

/// The marker's name in directory `dest`, and what it holds (the source's name) if present.
fn read_marker(beneath: Option<&Beneath>, dest: &Path) -> std::io::Result<(Vec<u8>, Option<Vec<u8>>)> {
    let dir = fsops::open_dir(beneath, dest)?;
    let name = Tag::of(&dir)?.marker();
    let held = fsops::open_read(&dir, &name).ok().and_then(|mut f| {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut b).ok().map(|_| b)
    });
    Ok((name, held))
}

fn write_marker(beneath: Option<&Beneath>, dest: &Path, base: &[u8]) -> std::io::Result<Vec<u8>> {
    let dir = fsops::open_dir(beneath, dest)?;
    let name = Tag::of(&dir)?.marker();
    let mut f = fsops::open_temp(&dir, &name)?;
    std::io::Write::write_all(&mut f, base)?;
    Ok(name)
}

/// Decides the layout from the destination's state and the first manifest entry. Beneath a
/// daemon's root every look and every creation resolves beneath it at the moment it is made.
pub(crate) fn decide(beneath: Option<&Beneath>, dest: &Path, contents: bool, multi: bool, first: &Entry, dry_run: bool) -> Result<Layout, TransferError> {
    let md = kind(beneath, dest).map_err(|e| io_fatal(dest, "cannot open", &e))?;
    let show = dest.display();
    if contents || multi {
        match md {
            Some(false) => return Err(fatal(format!("{show} is a file, but a directory is needed here; choose a directory path"))),
            Some(true) => {}
            None if dry_run => {}
            None => mkdir(beneath, dest).map_err(|e| mkdir_fatal(dest, &e))?,
        }
        let created_root = md.is_none() && !dry_run;
        return Ok(Layout { root: dest.to_path_buf(), mapping: Mapping::Identity, marker: None, mirror: contents, created_root });
    }
    let base = first.path.clone();
    let is_dir = first.kind == EntryKind::Dir;
    match md {
        Some(true) => {
            let (name, held) = read_marker(beneath, dest).map_err(|e| io_fatal(dest, "cannot open", &e))?;
            if held.is_some_and(|b| b == base) {
                return Ok(Layout { root: dest.to_path_buf(), mapping: Mapping::Strip { base, new_base: Vec::new() }, marker: Some(name), mirror: false, created_root: false });
            }
            Ok(Layout { root: dest.to_path_buf(), mapping: Mapping::Identity, marker: None, mirror: false, created_root: false })
        }
        Some(false) if is_dir => Err(fatal(format!("{show} is a file, but the source is a directory; choose a directory path"))),
        // `file host:new/`: the slash says a directory was meant; make it and put the file
        // in it (as rsync does; cp refuses), never a file named `new`.
        None if dest.as_os_str().as_bytes().ends_with(b"/") => {
            if !dry_run {
                mkdir(beneath, dest).map_err(|e| mkdir_fatal(dest, &e))?;
            }
            Ok(Layout { root: dest.to_path_buf(), mapping: Mapping::Identity, marker: None, mirror: false, created_root: !dry_run })
        }
        Some(false) | None if !is_dir => {
            let parent = dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let name = dest.file_name().ok_or_else(|| fatal(format!("{show} has no file name")))?;
            if !dry_run && kind(beneath, parent).ok().flatten() != Some(true) {
                return Err(fatal(format!("{}: no such directory (create it first)", parent.display())));
            }
            Ok(Layout { root: parent.to_path_buf(), mapping: Mapping::Strip { base, new_base: name.as_bytes().to_vec() }, marker: None, mirror: false, created_root: false })
        }
        _ => {
            let mut marker = None;
            if !dry_run {
                mkdir(beneath, dest).map_err(|e| mkdir_fatal(dest, &e))?;
                marker = Some(write_marker(beneath, dest, &base).map_err(|e| io_fatal(dest, "cannot write the resume marker in", &e))?);
            }
            Ok(Layout { root: dest.to_path_buf(), mapping: Mapping::Strip { base, new_base: Vec::new() }, marker, mirror: false, created_root: !dry_run })
        }
    }
}

/// tern makes the destination directory itself, not its parents (as cp and rsync): a missing
/// parent is named, with the fix.
fn mkdir_fatal(dest: &Path, e: &std::io::Error) -> TransferError {
    match dest.parent().filter(|_| e.kind() == std::io::ErrorKind::NotFound) {
        Some(parent) => {
            fatal(format!("{}: cannot create directory: its parent {} does not exist (create it first, then re-run)", dest.display(), parent.display())).with_kind(crate::error::ErrorKind::NotFound)
        }
        None => io_fatal(dest, "cannot create directory", e),
    }
}

fn io_fatal(p: &Path, what: &str, e: &std::io::Error) -> TransferError {
    TransferError::io(Side::Destination, p.display().to_string(), what, e).into_fatal()
}

impl Layout {
    /// The path under the root for an entry, or `None` if it does not belong to the source
    /// the layout was decided for.
    pub(crate) fn map(&self, path: &[u8]) -> Option<Vec<u8>> {
        match &self.mapping {
            Mapping::Identity => Some(path.to_vec()),
            Mapping::Strip { base, new_base } => {
                let rest = if path == &base[..] {
                    &b""[..]
                } else if path.len() > base.len() && path.starts_with(base) && path[base.len()] == b'/' {
                    &path[base.len() + 1..]
                } else {
                    return None;
                };
                Some(match (new_base.is_empty(), rest.is_empty()) {
                    (true, _) => rest.to_vec(),
                    (false, true) => new_base.clone(),
                    (false, false) => [&new_base[..], b"/", rest].concat(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &[u8], kind: EntryKind) -> Entry {
        Entry { id: 0, kind, path: path.to_vec(), size: 0, mode: 0o644, mtime_s: 0, mtime_ns: 0, target: vec![], hash: None, stripe: None }
    }

    #[test]
    fn cp_naming_and_resume() {
        let t = tempfile::tempdir().unwrap();
        let dst = t.path().join("dst");
        // dst missing: dst becomes the copy of src.
        let l = decide(None, &dst, false, false, &entry(b"src", EntryKind::Dir), false).unwrap();
        assert_eq!(l.map(b"src/a/b"), Some(b"a/b".to_vec()));
        assert_eq!(l.map(b"src"), Some(vec![]));
        assert_eq!(l.map(b"other"), None);
        // Interrupted: dst exists with the marker, so a re-run resumes into it, not dst/src.
        let l2 = decide(None, &dst, false, false, &entry(b"src", EntryKind::Dir), false).unwrap();
        assert_eq!(l2.map(b"src/a"), Some(b"a".to_vec()));
        // After completion the marker is gone and dst is an ordinary directory: cp nests.
        fs::remove_file(dst.join(std::ffi::OsStr::from_bytes(&l2.marker.unwrap()))).unwrap();
        let l3 = decide(None, &dst, false, false, &entry(b"src", EntryKind::Dir), false).unwrap();
        assert_eq!(l3.map(b"src/a"), Some(b"src/a".to_vec()));
        // A single file to a new name.
        let l4 = decide(None, &t.path().join("new.txt"), false, false, &entry(b"f.txt", EntryKind::File), false).unwrap();
        assert_eq!(l4.root, t.path());
        assert_eq!(l4.map(b"f.txt"), Some(b"new.txt".to_vec()));
        // A directory onto a file is refused.
        fs::write(t.path().join("file"), b"x").unwrap();
        let e = decide(None, &t.path().join("file"), false, false, &entry(b"src", EntryKind::Dir), false).unwrap_err();
        assert!(e.to_string().contains("is a file, but the source is a directory"), "{e}");
        // A single file to `new/` (a trailing slash): the directory is made, the file goes in.
        let slashed = PathBuf::from(format!("{}/", t.path().join("new").display()));
        let l5 = decide(None, &slashed, false, false, &entry(b"f.txt", EntryKind::File), false).unwrap();
        assert!(t.path().join("new").is_dir());
        assert_eq!(l5.map(b"f.txt"), Some(b"f.txt".to_vec()));
        let e = decide(None, &PathBuf::from(format!("{}/", t.path().join("file").display())), false, false, &entry(b"f.txt", EntryKind::File), false).unwrap_err();
        assert!(e.to_string().contains("a file stands where a directory is needed"), "{e}");
    }

    #[test]
    fn beneath_a_root_a_planted_link_is_refused_when_used() {
        let outside = tempfile::tempdir().unwrap();
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        fs::create_dir(&root).unwrap();
        let b = Beneath::open(&root).unwrap();
        // Planted after the session's path check, before its first entry: what decide() sees.
        std::os::unix::fs::symlink(outside.path(), root.join("x")).unwrap();
        for dest in ["x", "x/new"] {
            for (contents, kind) in [(false, EntryKind::Dir), (true, EntryKind::Dir), (false, EntryKind::File)] {
                let r = decide(Some(&b), &root.join(dest), contents, false, &entry(b"src", kind), false);
                if let Ok(l) = r {
                    assert!(crate::store::fsops::DestRoot::open(Some(&b), &l.root).is_err(), "{dest}: its root opens outside");
                }
            }
        }
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0, "nothing created outside the root");
    }
}
