//! Walking the source: builds manifest entries in parent-before-child order, never following
//! symlinks (they are sent as links).

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use tern_proto::EntryKind;
use tern_proto::filter::Filter;

use crate::error::{Side, TransferError};
use crate::store::fsops::Beneath;
use crate::store::posix_source::{PosixSource, PosixSourceFile};
use crate::store::{Result as StoreResult, Source};

/// One source argument: where it is, and the name it gets at the destination (`None` copies its
/// contents, as `src/.` does).
#[derive(Debug, Clone)]
pub struct SourceSpec {
    pub path: PathBuf,
    pub base: Option<Vec<u8>>,
    /// Daemon mode: the root everything read must resolve beneath (fsops::Beneath).
    pub beneath: Option<Arc<Beneath>>,
}

/// A manifest entry on the sending side, with the local path to read.
#[derive(Debug, Clone)]
pub struct SrcFile {
    pub kind: EntryKind,
    pub rel: Vec<u8>,
    pub path: PathBuf,
    pub size: u64,
    pub mode: u32,
    pub mtime_s: i64,
    pub mtime_ns: u32,
    pub target: Vec<u8>,
    /// Where its data is read from: the source argument it was found under (beneath a daemon's
    /// root in daemon mode, never through a link that leaves it).
    pub(crate) source: Arc<PosixSource>,
    /// (device, inode) of a regular file with more than one name, to send later names as links.
    pub inode: Option<(u64, u64)>,
    /// Only these bytes of the file move (`Entry::stripe`).
    pub stripe: Option<(u64, u64)>,
}

impl SrcFile {
    /// Its path beneath its source's root (empty, which every open refuses, if it is not
    /// beneath it: the walk builds every path by joining names onto that root, so it is).
    pub(crate) fn source_rel(&self) -> &[u8] {
        self.source.rel_of(&self.path).unwrap_or_default()
    }

    /// Opens the file to read its data.
    pub(crate) fn open(&self) -> StoreResult<PosixSourceFile> {
        self.source.open(self.source_rel())
    }
}

/// The source a walk of `spec` reads through: its directory, or the directory holding it when
/// it is not one (a single file or link).
fn source_of(spec: &SourceSpec, md: &fs::Metadata) -> Arc<PosixSource> {
    let root = if md.is_dir() { spec.path.clone() } else { spec.path.parent().map(Path::to_path_buf).unwrap_or_default() };
    Arc::new(PosixSource::new(root, spec.beneath.clone()))
}

/// `probe` is where to look (a path through an open directory descriptor, in daemon mode),
/// `path` the entry's own path, for messages and later opens.
fn describe_at(path: &Path, probe: &Path, md: &fs::Metadata, source: &Arc<PosixSource>) -> Option<SrcFile> {
    let ft = md.file_type();
    let (kind, target) = if ft.is_file() {
        (EntryKind::File, Vec::new())
    } else if ft.is_dir() {
        (EntryKind::Dir, Vec::new())
    } else if ft.is_symlink() {
        (EntryKind::Symlink, fs::read_link(probe).ok()?.as_os_str().as_bytes().to_vec())
    } else {
        return None;
    };
    Some(SrcFile {
        kind,
        rel: Vec::new(),
        path: path.to_path_buf(),
        size: if kind == EntryKind::File { md.size() } else { 0 },
        mode: md.mode() & 0o7777,
        mtime_s: md.mtime(),
        mtime_ns: md.mtime_nsec() as u32,
        target,
        source: source.clone(),
        inode: (kind == EntryKind::File && md.nlink() > 1).then(|| (md.dev(), md.ino())),
        stripe: None,
    })
}

fn describe(path: &Path, md: &fs::Metadata, source: &Arc<PosixSource>) -> Option<SrcFile> {
    describe_at(path, path, md, source)
}

/// `lstat` and describe, reporting (and skipping) what cannot be read or is not copyable.
fn inspect(path: &Path, source: &Arc<PosixSource>, unreadable: &str, warn: &mut dyn FnMut(TransferError)) -> Option<SrcFile> {
    inspect_at(path, path, source, unreadable, warn)
}

fn inspect_at(path: &Path, probe: &Path, source: &Arc<PosixSource>, unreadable: &str, warn: &mut dyn FnMut(TransferError)) -> Option<SrcFile> {
    match fs::symlink_metadata(probe) {
        Err(e) => {
            warn(TransferError::io(Side::Source, path.display().to_string(), unreadable, &e));
            None
        }
        Ok(md) => describe_at(path, probe, &md, source).or_else(|| {
            warn(TransferError::file(Side::Source, path.display().to_string(), "not a regular file, directory or symlink; skipped"));
            None
        }),
    }
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    if rel.is_empty() { name.to_vec() } else { [rel, b"/", name].concat() }
}

/// Checks the top-level sources before anything is sent, so a typo fails fast and clearly.
/// With several sources, as cp and rsync do, one that is missing (or a directory without -r)
/// is only reported (by `walk`) and the rest are copied; it is fatal when nothing is left.
pub fn check_sources(sources: &[SourceSpec], recursive: bool) -> Result<(), TransferError> {
    let mut first_problem = None;
    let mut usable = 0;
    for s in sources {
        match source_problem(s, recursive) {
            Some(e) => {
                first_problem.get_or_insert(e);
            }
            None => usable += 1,
        }
    }
    match first_problem {
        Some(e) if sources.len() == 1 || usable == 0 => Err(e.into_fatal()),
        _ => Ok(()),
    }
}

/// Why a top-level source cannot be copied, if it cannot.
fn source_problem(s: &SourceSpec, recursive: bool) -> Option<TransferError> {
    match fs::symlink_metadata(&s.path) {
        Err(e) => Some(TransferError::io(Side::Source, s.path.display().to_string(), "cannot read", &e)),
        Ok(md) if md.is_dir() && !recursive => Some(TransferError::file(Side::Source, s.path.display().to_string(), "is a directory (use -r to copy directories)")),
        Ok(_) => None,
    }
}

/// Walks every source, calling `emit` for each entry and `warn` for entries that cannot be read
/// (those are reported and skipped; the walk goes on). Entries the filter excludes are neither
/// emitted nor, if directories, entered. Stops early if `emit` returns false.
pub fn walk(sources: &[SourceSpec], recursive: bool, filter: &Filter, emit: &mut dyn FnMut(SrcFile) -> bool, warn: &mut dyn FnMut(TransferError)) -> Result<(), TransferError> {
    check_sources(sources, recursive)?;
    for s in sources {
        if let Some(e) = source_problem(s, recursive) {
            warn(e);
            continue;
        }
        let md = fs::symlink_metadata(&s.path).map_err(|e| TransferError::io(Side::Source, s.path.display().to_string(), "cannot read", &e))?;
        let source = source_of(s, &md);
        let Some(mut root) = describe(&s.path, &md, &source) else {
            warn(TransferError::file(Side::Source, s.path.display().to_string(), "not a regular file, directory or symlink; skipped"));
            continue;
        };
        let rel = s.base.clone().unwrap_or_default();
        if s.base.is_none() && root.kind != EntryKind::Dir {
            return Err(TransferError::fatal(Side::Source, format!("{} is not a directory, so it has no contents to copy", s.path.display())));
        }
        let is_dir = root.kind == EntryKind::Dir;
        if filter.excludes(&rel, is_dir) {
            continue;
        }
        root.rel = rel.clone();
        if (s.base.is_some() || !is_dir) && !emit(root) {
            return Ok(());
        }
        if is_dir && !walk_dir(&s.path, &rel, &source, filter, emit, warn) {
            return Ok(());
        }
    }
    Ok(())
}

/// `--files-from`: the listed paths under the one source directory instead of all of it. Parents
/// come before children (each emitted once, however often listed), a listed directory brings
/// its subtree when `recursive`, the filter still applies, and a listed path that is missing or
/// unreadable is reported and skipped.
pub fn walk_list(source: &SourceSpec, list: &[Vec<u8>], recursive: bool, filter: &Filter, emit: &mut dyn FnMut(SrcFile) -> bool, warn: &mut dyn FnMut(TransferError)) -> Result<(), TransferError> {
    let root = &source.path;
    let md = fs::metadata(root).map_err(|e| TransferError::io(Side::Source, root.display().to_string(), "cannot read", &e).into_fatal())?;
    if !md.is_dir() {
        return Err(TransferError::fatal(Side::Source, format!("{}: --files-from needs the source to be a directory", root.display())));
    }
    let src = source_of(source, &md);
    let mut emitted: std::collections::HashSet<Vec<u8>> = std::collections::HashSet::new();
    'paths: for rel in list {
        if rel.is_empty() || emitted.contains(rel) {
            continue;
        }
        let parts: Vec<&[u8]> = rel.split(|&b| b == b'/').collect();
        // Parents first, each once; a parent that is excluded or not a directory drops the path.
        for depth in 1..parts.len() {
            let parent = parts[..depth].join(&b'/');
            if emitted.contains(&parent) {
                continue;
            }
            let path = root.join(std::ffi::OsStr::from_bytes(&parent));
            let Some(mut d) = fs::symlink_metadata(&path).ok().and_then(|m| describe(&path, &m, &src)).filter(|d| d.kind == EntryKind::Dir) else {
                warn(TransferError::file(Side::Source, root.join(std::ffi::OsStr::from_bytes(rel)).display().to_string(), "listed in --files-from, but a parent is not a directory here; skipped"));
                continue 'paths;
            };
            if filter.excludes(&parent, true) {
                continue 'paths;
            }
            d.rel = parent.clone();
            emitted.insert(parent);
            if !emit(d) {
                return Ok(());
            }
        }
        let path = root.join(std::ffi::OsStr::from_bytes(rel));
        let Some(mut f) = inspect(&path, &src, "listed in --files-from, but cannot read", warn) else { continue };
        let is_dir = f.kind == EntryKind::Dir;
        if filter.excludes(rel, is_dir) {
            continue;
        }
        f.rel = rel.clone();
        emitted.insert(rel.clone());
        if !emit(f) {
            return Ok(());
        }
        if is_dir && recursive {
            // Entries under it that are listed too are skipped later (emitted once).
            let mut deduped = |f: SrcFile| if emitted.insert(f.rel.clone()) { emit(f) } else { true };
            if !walk_dir(&path, rel, &src, filter, &mut deduped, warn) {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Depth-first, names sorted for a deterministic order. Returns false if `emit` asked to stop.
fn walk_dir(dir: &Path, rel: &[u8], source: &Arc<PosixSource>, filter: &Filter, emit: &mut dyn FnMut(SrcFile) -> bool, warn: &mut dyn FnMut(TransferError)) -> bool {
    let mut stack: Vec<(PathBuf, Vec<u8>)> = vec![(dir.to_path_buf(), rel.to_vec())];
    while let Some((dir, rel)) = stack.pop() {
        // Daemon mode: the directory is opened beneath the root, then listed and looked into
        // through that descriptor, so a link swapped in for it is refused, not walked.
        let held = match crate::store::fsops::waiting_for_descriptors(|| source.beneath().map(|b| b.open_dir(&dir)).transpose()) {
            Ok(fd) => fd,
            Err(e) => {
                warn(TransferError::io(Side::Source, dir.display().to_string(), "cannot list directory", &e));
                continue;
            }
        };
        let through = held.as_ref().map(|fd| PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(fd))));
        let rd = match crate::store::fsops::waiting_for_descriptors(|| fs::read_dir(through.as_deref().unwrap_or(&dir))) {
            Ok(rd) => rd,
            Err(e) => {
                warn(TransferError::io(Side::Source, dir.display().to_string(), "cannot list directory", &e));
                continue;
            }
        };
        let mut names: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
        names.sort();
        let mut subdirs = Vec::new();
        for name in names {
            let child_rel = join(&rel, name.as_bytes());
            // Decided before the stat where the name alone decides: an excluded subtree of a
            // million files costs nothing. Directory-only rules need the stat.
            let (as_file, as_dir) = (filter.excludes(&child_rel, false), filter.excludes(&child_rel, true));
            if as_file && as_dir {
                continue;
            }
            let path = dir.join(&name);
            let probe = through.as_ref().map(|t| t.join(&name));
            let Some(mut f) = inspect_at(&path, probe.as_deref().unwrap_or(&path), source, "cannot read", warn) else { continue };
            if if f.kind == EntryKind::Dir { as_dir } else { as_file } {
                continue;
            }
            f.rel = child_rel;
            if f.kind == EntryKind::Dir {
                subdirs.push((path, f.rel.clone()));
            }
            if !emit(f) {
                return false;
            }
        }
        // Reverse so the stack pops them in name order.
        stack.extend(subdirs.into_iter().rev());
    }
    true
}

impl TransferError {
    pub fn into_fatal(mut self) -> Self {
        self.scope = crate::error::Scope::Fatal;
        self
    }
}

/// Base name a source gets at the destination; `None` copies its contents (`src/.`, `/`).
pub fn source_spec(path: &Path, contents: bool) -> SourceSpec {
    let bytes = path.as_os_str().as_bytes();
    let trimmed = {
        let mut b = bytes;
        while b.len() > 1 && b.ends_with(b"/") {
            b = &b[..b.len() - 1];
        }
        b
    };
    let is_contents = contents || trimmed == b"." || trimmed.ends_with(b"/.") || trimmed == b"/";
    let base = if is_contents {
        None
    } else {
        let p = Path::new(std::ffi::OsStr::from_bytes(trimmed));
        p.file_name().map(|n| n.as_bytes().to_vec()).or_else(|| p.canonicalize().ok().and_then(|c| c.file_name().map(|n| n.as_bytes().to_vec())))
    };
    SourceSpec { path: path.to_path_buf(), base, beneath: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SourceFile;

    /// Every walked file opens through its source and reads back its bytes, whatever form the
    /// source argument had: a directory, its contents (`dir/.`), a single file.
    #[test]
    fn every_walked_file_reads_through_its_source() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dir");
        fs::create_dir_all(dir.join("sub")).unwrap();
        fs::write(dir.join("a"), b"alpha").unwrap();
        fs::write(dir.join("sub/b"), b"beta").unwrap();
        let specs = [source_spec(&dir, false), source_spec(&dir.join("."), false), source_spec(&dir.join("a"), false), source_spec(&dir.join("sub/"), false)];
        for spec in specs {
            let mut read = Vec::new();
            let mut emit = |f: SrcFile| {
                if f.kind == EntryKind::File {
                    let mut buf = vec![0u8; f.size as usize];
                    f.open().unwrap().read_at(0, &mut buf).unwrap();
                    read.push((f.rel.clone(), buf));
                }
                true
            };
            walk(std::slice::from_ref(&spec), true, &Filter::default(), &mut emit, &mut |e| panic!("{e:?}")).unwrap();
            read.sort();
            let want: Vec<(Vec<u8>, Vec<u8>)> = match spec.base.as_deref() {
                Some(b"dir") => vec![(b"dir/a".to_vec(), b"alpha".to_vec()), (b"dir/sub/b".to_vec(), b"beta".to_vec())],
                None => vec![(b"a".to_vec(), b"alpha".to_vec()), (b"sub/b".to_vec(), b"beta".to_vec())],
                Some(b"a") => vec![(b"a".to_vec(), b"alpha".to_vec())],
                _ => vec![(b"sub/b".to_vec(), b"beta".to_vec())],
            };
            assert_eq!(read, want, "{}", spec.path.display());
        }
    }
}
