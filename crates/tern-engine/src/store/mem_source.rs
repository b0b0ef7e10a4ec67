//! `MemSource`: a source in memory with `PosixSource`'s semantics beneath a daemon's root, for
//! tests. Files can be rewritten or cut behind its back; open handles see the change, as a POSIX
//! descriptor sees its file truncated.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::mem::{Looked, components, err, resolve};
use super::{EntryType, Kind, Result, Source, SourceFile, Stat, StoreError, check_entry};

/// A shared handle: clones see (and change) the same source.
#[derive(Clone, Default)]
pub(crate) struct MemSource {
    nodes: Arc<Mutex<BTreeMap<Vec<u8>, Node>>>,
}

enum Node {
    Dir,
    File { data: Vec<u8>, mtime: (i64, u32) },
    Link { target: Vec<u8> },
}

impl MemSource {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<Vec<u8>, Node>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Regular file `rel` with `data`, its missing parents created as directories.
    pub(crate) fn put(&self, rel: &[u8], data: &[u8], mtime: (i64, u32)) {
        let mut nodes = self.lock();
        let parts: Vec<&[u8]> = components(rel).collect();
        for depth in 1..parts.len() {
            nodes.entry(parts[..depth].join(&b'/')).or_insert(Node::Dir);
        }
        nodes.insert(rel.to_vec(), Node::File { data: data.to_vec(), mtime });
    }

    /// Cuts file `rel` to `len` bytes, keeping its mtime (as a write that did not touch it yet).
    pub(crate) fn truncate(&self, rel: &[u8], len: u64) {
        if let Some(Node::File { data, .. }) = self.lock().get_mut(rel) {
            data.truncate(len as usize);
        }
    }

    pub(crate) fn symlink(&self, rel: &[u8], target: &[u8]) {
        self.lock().insert(rel.to_vec(), Node::Link { target: target.to_vec() });
    }

    /// The canonical path `rel` names: links on the way followed while they stay beneath the
    /// root, a final one not (`mem::resolve`, as the in-memory sink confines its paths).
    fn resolve(nodes: &BTreeMap<Vec<u8>, Node>, rel: &[u8]) -> Result<Vec<u8>> {
        resolve(rel, false, true, |key| match nodes.get(key) {
            Some(Node::Link { target }) => Looked::Link(target.clone()),
            Some(Node::File { .. }) => Looked::File,
            Some(Node::Dir) => Looked::Dir,
            None => Looked::Missing,
        })
    }
}

impl Source for MemSource {
    type File = MemSourceFile;

    fn open(&self, rel: &[u8]) -> Result<MemSourceFile> {
        check_entry(rel)?;
        let nodes = self.lock();
        let key = Self::resolve(&nodes, rel)?;
        match nodes.get(&key) {
            Some(Node::File { .. }) => Ok(MemSourceFile { source: self.clone(), key }),
            Some(Node::Link { .. }) => Err(err(Kind::Refused, libc::ELOOP, "a symlink is sent as a link, never read through; refused")),
            Some(Node::Dir) => Err(StoreError::errno(libc::EISDIR)),
            None => Err(StoreError::errno(libc::ENOENT)),
        }
    }

    fn stat(&self, rel: &[u8]) -> Result<Stat> {
        check_entry(rel)?;
        let nodes = self.lock();
        let key = Self::resolve(&nodes, rel)?;
        nodes.get(&key).map(stat_of).ok_or_else(|| StoreError::errno(libc::ENOENT))
    }

    fn display(&self, rel: &[u8]) -> String {
        format!("mem:/{}", String::from_utf8_lossy(rel))
    }
}

fn stat_of(node: &Node) -> Stat {
    match node {
        Node::Dir => Stat { kind: EntryType::Dir, size: 0, mode: 0o755, mtime: (0, 0) },
        Node::File { data, mtime } => Stat { kind: EntryType::File, size: data.len() as u64, mode: 0o644, mtime: *mtime },
        Node::Link { target } => Stat { kind: EntryType::Symlink, size: target.len() as u64, mode: 0o777, mtime: (0, 0) },
    }
}

/// An open file of a `MemSource`: reads what the file holds now.
pub(crate) struct MemSourceFile {
    source: MemSource,
    key: Vec<u8>,
}

impl SourceFile for MemSourceFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let nodes = self.source.lock();
        let Some(Node::File { data, .. }) = nodes.get(&self.key) else {
            return Err(StoreError::new(Kind::Changed, "the file was replaced while being read"));
        };
        let range = usize::try_from(offset).ok().and_then(|start| Some(start..start.checked_add(buf.len())?));
        match range.and_then(|r| data.get(r)) {
            Some(bytes) => {
                buf.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(StoreError::new(Kind::Changed, "changed while being read (it ended early)")),
        }
    }

    fn stat(&self) -> Result<Stat> {
        let nodes = self.source.lock();
        nodes.get(&self.key).map(stat_of).ok_or_else(|| StoreError::new(Kind::Changed, "the file was removed while being read"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::source_conformance::SourceHarness;

    pub(crate) fn fixture() -> (MemSource, MemSource) {
        let s = MemSource::default();
        (s.clone(), s)
    }

    impl SourceHarness for MemSource {
        fn put(&self, rel: &[u8], data: &[u8], mtime: (i64, u32)) {
            MemSource::put(self, rel, data, mtime);
        }

        fn truncate(&self, rel: &[u8], len: u64) {
            MemSource::truncate(self, rel, len);
        }

        fn plant_symlink(&self, rel: &[u8], target: &[u8]) {
            self.symlink(rel, target);
        }

        fn confined(&self) -> bool {
            // Nothing lies outside a MemSource's root: `resolve` refuses to climb above it.
            true
        }
    }
}
