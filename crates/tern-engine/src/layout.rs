//! Where received entries land: cp/scp naming rules, plus resume into the same place.
//!
//! `-r src dst` makes `dst` a copy of `src` when `dst` does not exist, `dst/src` when it is a
//! directory, and `src/.` (or `sync`) copies the contents. A directory tern created as the copy
//! carries a `.tern-incomplete` marker naming the source until the transfer completes, so a
//! re-run after an interruption resumes into it instead of nesting a second copy.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use tern_proto::{Entry, EntryKind};

use crate::error::{Side, TransferError};

pub const MARKER: &str = ".tern-incomplete";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapping {
    /// Entry paths are used as they are, under the root.
    Identity,
    /// The first component (the source's name) is replaced by `new_base` (empty: the root).
    Strip { base: Vec<u8>, new_base: Vec<u8> },
}

#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
    pub mapping: Mapping,
    /// The marker to remove when the transfer completes.
    pub marker: Option<PathBuf>,
    /// The root is a mirror of the source (sync): `--delete` may remove extras under it.
    pub mirror: bool,
    /// This session created the root, so nothing stood in it before.
    pub created_root: bool,
}

fn fatal(msg: String) -> TransferError {
    TransferError::fatal(Side::Destination, msg)
}

/// Decides the layout from the destination's state and the first manifest entry.
pub fn decide(dest: &Path, contents: bool, multi: bool, first: &Entry, dry_run: bool) -> Result<Layout, TransferError> {
    let md = fs::metadata(dest).ok();
    let show = dest.display();
    if contents || multi {
        match &md {
            Some(m) if !m.is_dir() => return Err(fatal(format!("{show} is a file, but a directory is needed here; choose a directory path"))),
            Some(_) => {}
            None if dry_run => {}
            None => fs::create_dir(dest).map_err(|e| io_fatal(dest, "cannot create directory", &e))?,
        }
        let created_root = md.is_none() && !dry_run;
        return Ok(Layout { root: dest.to_path_buf(), mapping: Mapping::Identity, marker: None, mirror: contents, created_root });
    }
    let base = first.path.clone();
    let is_dir = first.kind == EntryKind::Dir;
    match md {
        Some(m) if m.is_dir() => {
            let marker = dest.join(MARKER);
            if fs::read(&marker).is_ok_and(|b| b == base) {
                return Ok(Layout { root: dest.to_path_buf(), mapping: Mapping::Strip { base, new_base: Vec::new() }, marker: Some(marker), mirror: false, created_root: false });
            }
            Ok(Layout { root: dest.to_path_buf(), mapping: Mapping::Identity, marker: None, mirror: false, created_root: false })
        }
        Some(_) if is_dir => Err(fatal(format!("{show} is a file, but the source is a directory; choose a directory path"))),
        Some(_) | None if !is_dir => {
            let parent = dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let name = dest.file_name().ok_or_else(|| fatal(format!("{show} has no file name")))?;
            if !dry_run && !parent.is_dir() {
                return Err(fatal(format!("{}: no such directory (create it first)", parent.display())));
            }
            Ok(Layout { root: parent.to_path_buf(), mapping: Mapping::Strip { base, new_base: name.as_bytes().to_vec() }, marker: None, mirror: false, created_root: false })
        }
        _ => {
            let marker = dest.join(MARKER);
            if !dry_run {
                fs::create_dir(dest).map_err(|e| io_fatal(dest, "cannot create directory", &e))?;
                fs::write(&marker, &base).map_err(|e| io_fatal(&marker, "cannot write", &e))?;
            }
            Ok(Layout { root: dest.to_path_buf(), mapping: Mapping::Strip { base, new_base: Vec::new() }, marker: Some(marker), mirror: false, created_root: !dry_run })
        }
    }
}

fn io_fatal(p: &Path, what: &str, e: &std::io::Error) -> TransferError {
    TransferError::io(Side::Destination, p.display().to_string(), what, e).into_fatal()
}

impl Layout {
    /// The path under the root for an entry, or `None` if it does not belong to the source
    /// the layout was decided for.
    pub fn map(&self, path: &[u8]) -> Option<Vec<u8>> {
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
        Entry { id: 0, kind, path: path.to_vec(), size: 0, mode: 0o644, mtime_s: 0, mtime_ns: 0, target: vec![], hash: None }
    }

    #[test]
    fn cp_naming_and_resume() {
        let t = tempfile::tempdir().unwrap();
        let dst = t.path().join("dst");
        // dst missing: dst becomes the copy of src.
        let l = decide(&dst, false, false, &entry(b"src", EntryKind::Dir), false).unwrap();
        assert_eq!(l.map(b"src/a/b"), Some(b"a/b".to_vec()));
        assert_eq!(l.map(b"src"), Some(vec![]));
        assert_eq!(l.map(b"other"), None);
        // Interrupted: dst exists with the marker, so a re-run resumes into it, not dst/src.
        let l2 = decide(&dst, false, false, &entry(b"src", EntryKind::Dir), false).unwrap();
        assert_eq!(l2.map(b"src/a"), Some(b"a".to_vec()));
        // After completion the marker is gone and dst is an ordinary directory: cp nests.
        fs::remove_file(l2.marker.unwrap()).unwrap();
        let l3 = decide(&dst, false, false, &entry(b"src", EntryKind::Dir), false).unwrap();
        assert_eq!(l3.map(b"src/a"), Some(b"src/a".to_vec()));
        // A single file to a new name.
        let l4 = decide(&t.path().join("new.txt"), false, false, &entry(b"f.txt", EntryKind::File), false).unwrap();
        assert_eq!(l4.root, t.path());
        assert_eq!(l4.map(b"f.txt"), Some(b"new.txt".to_vec()));
        // A directory onto a file is refused.
        fs::write(t.path().join("file"), b"x").unwrap();
        let e = decide(&t.path().join("file"), false, false, &entry(b"src", EntryKind::Dir), false).unwrap_err();
        assert!(e.to_string().contains("is a file, but the source is a directory"), "{e}");
    }
}
