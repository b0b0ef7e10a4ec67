//! What a unit is on disk: a top-level entry of the watched directory, and its measure.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Size, file count and newest modification of a unit; equal measures a few seconds apart
/// mean nobody is writing to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Measure {
    pub bytes: u64,
    pub files: u64,
    /// Newest mtime (nanoseconds since the epoch) of the unit or anything inside it.
    pub newest: i128,
    pub is_dir: bool,
}

/// Measures a file, or a directory and everything under it (symlinks are not followed).
pub fn measure(path: &Path) -> io::Result<Measure> {
    let md = fs::symlink_metadata(path)?;
    let mut m = Measure { is_dir: md.is_dir(), ..Default::default() };
    add(&mut m, &md);
    if md.is_dir() {
        let mut stack = vec![path.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for e in fs::read_dir(&dir)? {
                let e = e?;
                // A file removed between the listing and the stat is simply not there any more.
                let Ok(md) = e.metadata() else { continue };
                add(&mut m, &md);
                if md.is_dir() {
                    stack.push(e.path());
                }
            }
        }
    }
    Ok(m)
}

fn add(m: &mut Measure, md: &fs::Metadata) {
    if md.is_file() {
        m.bytes += md.len();
        m.files += 1;
    }
    let t = md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128;
    m.newest = m.newest.max(t);
}

/// The candidate unit names in `src`: non-hidden, UTF-8 names (the state log is JSON),
/// sorted so that production order among simultaneous arrivals is deterministic.
pub fn top_level(src: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for e in fs::read_dir(src)? {
        let e = e?;
        let Ok(name) = e.file_name().into_string() else {
            tracing::debug!("{}: name is not UTF-8; not watched", e.path().display());
            continue;
        };
        if !name.starts_with('.') {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// A unit name as a log line or marker gives it: one plain path component.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// Removes a shipped unit from the source; a unit already gone counts as removed.
pub fn remove(path: &Path) -> io::Result<()> {
    let r = match fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_tree_and_lists_units() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir_all(t.path().join("snap/sub")).unwrap();
        fs::write(t.path().join("snap/a"), b"12345").unwrap();
        fs::write(t.path().join("snap/sub/b"), b"678").unwrap();
        fs::write(t.path().join(".snap2.tmp"), b"x").unwrap();
        fs::write(t.path().join("file"), b"xy").unwrap();
        let m = measure(&t.path().join("snap")).unwrap();
        assert_eq!((m.bytes, m.files, m.is_dir), (8, 2, true));
        assert_eq!(top_level(t.path()).unwrap(), vec!["file".to_string(), "snap".to_string()]);
        assert!(valid_name("snap_003") && !valid_name("a/b") && !valid_name(".."));
        remove(&t.path().join("snap")).unwrap();
        remove(&t.path().join("snap")).unwrap();
        assert!(!t.path().join("snap").exists());
    }
}
