//! `MemSink`: a destination in memory with `PosixSink`'s semantics, for deterministic
//! simulations and tests. No clock, no randomness, no I/O: the same calls give the same state.
//!
//! Its power-loss model (`crash`): file data written since the last `barrier` is lost (each file
//! reverts to what the last barrier saw), while the journal keeps every record — the worst case of
//! docs/journal.md, a journal that outlived its data — and directories, links and the names of
//! published files stay. Handles from before a crash are dead. A publish whose data had not passed
//! a barrier is recorded (`unbarriered_publishes`), so a driver that skips the barrier is caught
//! even when no crash happens to follow.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tern_proto::chunk::chunk_count;
use tern_proto::path::{file_name, parent};

use super::{EntryType, Features, Kind, Listed, Meta, Part, PartSpec, Result, Resume, Sink, Stat, StoreError, check, check_entry, join, rehash_claimed};
use crate::store::journal::JournalHeader;
use tern_proto::journal::{RECORD_LEN, Replay, encode_record, encode_seal};

/// As Linux: at most 40 symlinks followed in one resolution.
const MAX_HOPS: usize = 40;

/// A shared handle: clones see (and change) the same store.
#[derive(Clone)]
pub(crate) struct MemSink {
    state: Arc<Mutex<State>>,
}

struct State {
    /// Entries by canonical path (no symlink among its parents); the root is `""`.
    nodes: BTreeMap<Vec<u8>, Node>,
    /// Partial files by the canonical path they will be published as: invisible until then.
    parts: HashMap<Vec<u8>, PartData>,
    next_id: u64,
    /// Bumped by `crash`: handles of an earlier epoch are dead.
    epoch: u64,
    barriers: u64,
    unbarriered: Vec<Vec<u8>>,
}

/// Bytes with what the last barrier saw of them.
#[derive(Default, Clone)]
struct Data {
    now: Vec<u8>,
    durable: Vec<u8>,
    dirty: bool,
}

impl Data {
    fn changed(&mut self) -> &mut Vec<u8> {
        self.dirty = true;
        &mut self.now
    }
}

enum Node {
    Dir { mode: u32, mtime: (i64, u32) },
    File { data: Data, mode: u32, mtime: (i64, u32) },
    Link { target: Vec<u8>, mtime: (i64, u32) },
}

struct PartData {
    id: u64,
    spec: PartSpec,
    data: Data,
    /// Every record ever made (chunks and seals, encoded as in a journal file): a crash keeps
    /// them all, whatever data it loses.
    journal: Vec<[u8; RECORD_LEN]>,
    meta: Meta,
    finished: bool,
}

pub(super) fn err(kind: Kind, errno: i32, message: &str) -> StoreError {
    StoreError { kind, errno: Some(errno), message: message.into(), what: None }
}

pub(super) fn components(path: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    path.split(|&b| b == b'/').filter(|c| !c.is_empty())
}

fn same_file(a: &PartSpec, b: &PartSpec) -> bool {
    (a.size, a.mtime, a.chunk_size) == (b.size, b.mtime, b.chunk_size)
}

/// What an in-memory store holds at a path, as path resolution needs to know it.
pub(super) enum Looked {
    Link(Vec<u8>),
    File,
    Dir,
    Missing,
}

/// The canonical path `rel` names in an in-memory store whose entries `look` tells: symlinks on
/// the way followed (the final one only with `follow_final`) as long as they stay beneath the
/// root, or with `!links` none at all. A missing final entry is its own path (the caller decides
/// what absent means); a missing one on the way is ENOENT. One resolution for `MemSink` and
/// `MemSource`, so both stores confine paths alike.
pub(super) fn resolve(rel: &[u8], follow_final: bool, links: bool, look: impl Fn(&[u8]) -> Looked) -> Result<Vec<u8>> {
    let mut todo: VecDeque<Vec<u8>> = components(rel).map(<[u8]>::to_vec).collect();
    let mut at: Vec<Vec<u8>> = Vec::new();
    let mut hops = 0;
    while let Some(c) = todo.pop_front() {
        match &c[..] {
            b"." => continue,
            b".." => {
                if at.pop().is_none() {
                    return Err(err(Kind::Refused, libc::EXDEV, "the path resolves outside the root; refused"));
                }
                continue;
            }
            _ => at.push(c),
        }
        let last = todo.is_empty();
        match look(&at.join(&b'/')) {
            Looked::Link(target) if !last || follow_final => {
                if !links {
                    return Err(err(Kind::Refused, libc::ELOOP, "a symlink on the way; refused"));
                }
                hops += 1;
                if hops > MAX_HOPS {
                    return Err(StoreError::errno(libc::ELOOP));
                }
                if target.starts_with(b"/") {
                    return Err(err(Kind::Refused, libc::EXDEV, "an absolute symlink on the way; refused"));
                }
                at.pop();
                for t in components(&target).rev() {
                    todo.push_front(t.to_vec());
                }
            }
            Looked::File if !last => return Err(StoreError::errno(libc::ENOTDIR)),
            Looked::Missing if !last => return Err(StoreError::errno(libc::ENOENT)),
            _ => {}
        }
    }
    Ok(at.join(&b'/'))
}

impl State {
    /// The canonical path `rel` names ([`resolve`]).
    fn resolve(&self, rel: &[u8], follow_final: bool, links: bool) -> Result<Vec<u8>> {
        resolve(rel, follow_final, links, |key| match self.nodes.get(key) {
            Some(Node::Link { target, .. }) => Looked::Link(target.clone()),
            Some(Node::File { .. }) => Looked::File,
            Some(Node::Dir { .. }) => Looked::Dir,
            None => Looked::Missing,
        })
    }

    /// The canonical path of directory `rel`, which must exist.
    fn dir(&self, rel: &[u8], links: bool) -> Result<Vec<u8>> {
        let key = self.resolve(rel, true, links)?;
        match self.nodes.get(&key) {
            Some(Node::Dir { .. }) => Ok(key),
            Some(_) => Err(StoreError::errno(libc::ENOTDIR)),
            None => Err(StoreError::errno(libc::ENOENT)),
        }
    }

    /// Keys strictly under directory `key`, in order.
    fn under<'a>(&'a self, key: &'a [u8]) -> impl Iterator<Item = (&'a Vec<u8>, &'a Node)> + 'a {
        let prefix = if key.is_empty() { Vec::new() } else { [key, b"/"].concat() };
        self.nodes.range(prefix.clone()..).take_while(move |(k, _)| k.starts_with(&prefix)).filter(|(k, _)| !k.is_empty())
    }
}

impl Default for MemSink {
    fn default() -> Self {
        Self::new()
    }
}

impl MemSink {
    pub(crate) fn new() -> Self {
        let mut nodes = BTreeMap::new();
        nodes.insert(Vec::new(), Node::Dir { mode: 0o755, mtime: (0, 0) });
        let state = State { nodes, parts: HashMap::new(), next_id: 0, epoch: 0, barriers: 0, unbarriered: Vec::new() };
        Self { state: Arc::new(Mutex::new(state)) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Power loss: every file's data reverts to what the last barrier saw; journals, names and
    /// directories stay; open handles die.
    pub(crate) fn crash(&self) {
        let mut st = self.lock();
        st.epoch += 1;
        for p in st.parts.values_mut() {
            p.data.now = p.data.durable.clone();
            p.data.dirty = false;
            p.finished = false;
        }
        for node in st.nodes.values_mut() {
            if let Node::File { data, .. } = node {
                data.now = data.durable.clone();
                data.dirty = false;
            }
        }
    }

    /// Paths published with data no barrier had seen (each would be lost or torn by a crash).
    pub(crate) fn unbarriered_publishes(&self) -> Vec<Vec<u8>> {
        self.lock().unbarriered.clone()
    }

    pub(crate) fn barriers(&self) -> u64 {
        self.lock().barriers
    }

    /// A published regular file's bytes (not through a final link).
    pub(crate) fn read_file(&self, rel: &[u8]) -> Option<Vec<u8>> {
        let st = self.lock();
        let key = st.resolve(rel, false, true).ok()?;
        match st.nodes.get(&key) {
            Some(Node::File { data, .. }) => Some(data.now.clone()),
            _ => None,
        }
    }

    /// The claims a journal's `records` can prove against `data` (sealed ones unread), those of
    /// `stripe` only where given, and whether every chunk is sealed; ascending.
    fn proven(data: &[u8], spec: &PartSpec, records: &[[u8; RECORD_LEN]], stripe: Option<(u64, u64)>) -> (Vec<(u64, [u8; 32])>, bool) {
        let header = JournalHeader { size: spec.size, mtime_s: spec.mtime.0, mtime_ns: spec.mtime.1, chunk_size: spec.chunk_size };
        let mut replay = Replay::new(&header);
        for rec in records {
            if !replay.push(rec) {
                break;
            }
        }
        let claims = replay.finish_sealed().into_iter().filter(|(i, _, _)| stripe.is_none_or(|(first, end)| (first..end).contains(i)));
        let read = |buf: &mut [u8], off: u64| data.get(off as usize..off as usize + buf.len()).map(|b| buf.copy_from_slice(b)).is_some();
        let mut chunks = Vec::new();
        let (_, sealed) = rehash_claimed(&read, spec.size, spec.chunk_size, claims, &mut chunks);
        chunks.sort_unstable_by_key(|&(index, _)| index);
        (chunks, sealed && stripe.is_none())
    }
}

impl Sink for MemSink {
    type Part = MemPart;

    fn features(&self) -> Features {
        Features { sparse: true, atomic_publish: true, resumable: true, chunk_size_min: 1, chunk_size_max: u32::MAX, max_chunks: None }
    }

    fn stat(&self, rel: &[u8]) -> Result<Option<Stat>> {
        check(rel)?;
        let st = self.lock();
        let key = st.resolve(rel, false, true)?;
        Ok(st.nodes.get(&key).map(|n| match n {
            Node::Dir { mode, mtime } => Stat { kind: EntryType::Dir, size: 0, mode: *mode, mtime: *mtime },
            Node::File { data, mode, mtime } => Stat { kind: EntryType::File, size: data.now.len() as u64, mode: *mode, mtime: *mtime },
            Node::Link { target, mtime } => Stat { kind: EntryType::Symlink, size: target.len() as u64, mode: 0o777, mtime: *mtime },
        }))
    }

    fn mkdir_all(&self, rel: &[u8]) -> Result<bool> {
        check(rel)?;
        let mut st = self.lock();
        let mut prefix = Vec::new();
        let mut created = false;
        for c in components(rel) {
            prefix = join(&prefix, c);
            if let Some(Node::Link { .. }) = st.nodes.get(&st.resolve(&prefix, false, true)?) {
                // Followed where it leads; a dangling link is in the way, as mkdirat finds it.
                let key = st.resolve(&prefix, true, true)?;
                if !matches!(st.nodes.get(&key), Some(Node::Dir { .. })) {
                    return Err(StoreError::errno(libc::EEXIST));
                }
                created = false;
                continue;
            }
            let key = st.resolve(&prefix, true, true)?;
            created = match st.nodes.get(&key) {
                Some(Node::Dir { .. }) => false,
                Some(_) => return Err(StoreError::errno(libc::ENOTDIR)),
                None => {
                    st.nodes.insert(key, Node::Dir { mode: 0o755, mtime: (0, 0) });
                    true
                }
            };
        }
        Ok(created)
    }

    fn open_part(&self, rel: &[u8], spec: &PartSpec) -> Result<(MemPart, Resume)> {
        check_entry(rel)?;
        let mut st = self.lock();
        let key = join(&st.dir(parent(rel), true)?, file_name(rel));
        let epoch = st.epoch;
        let journaled = chunk_count(spec.size, spec.chunk_size) > 1 || spec.stripe.is_some();
        if let Some(p) = st.parts.get(&key)
            && journaled
            && (spec.resume || spec.stripe.is_some())
            && same_file(&p.spec, spec)
        {
            // A stripe joins the shared part even without `resume`, claiming nothing then.
            let (chunks, sealed) = if spec.resume { Self::proven(&p.data.now, spec, &p.journal, spec.stripe) } else { (Vec::new(), false) };
            return Ok((MemPart { sink: self.clone(), key, id: p.id, epoch }, Resume { chunks, fresh: false, sealed }));
        }
        st.next_id += 1;
        let id = st.next_id;
        st.parts.insert(key.clone(), PartData { id, spec: *spec, data: Data::default(), journal: Vec::new(), meta: Meta::default(), finished: false });
        Ok((MemPart { sink: self.clone(), key, id, epoch }, Resume { chunks: Vec::new(), fresh: spec.stripe.is_none(), sealed: false }))
    }

    fn barrier(&self) -> Result<()> {
        let mut st = self.lock();
        st.barriers += 1;
        let st = &mut *st;
        let files = st.nodes.values_mut().filter_map(|n| match n {
            Node::File { data, .. } => Some(data),
            _ => None,
        });
        for data in files.chain(st.parts.values_mut().map(|p| &mut p.data)).filter(|d| d.dirty) {
            data.durable = data.now.clone();
            data.dirty = false;
        }
        Ok(())
    }

    fn symlink(&self, rel: &[u8], target: &[u8], mtime: Option<(i64, u32)>) -> Result<()> {
        check_entry(rel)?;
        let mut st = self.lock();
        let key = join(&st.dir(parent(rel), true)?, file_name(rel));
        if let Some(Node::Dir { .. }) = st.nodes.get(&key) {
            return Err(StoreError::errno(libc::EISDIR));
        }
        st.nodes.insert(key, Node::Link { target: target.to_vec(), mtime: mtime.unwrap_or((0, 0)) });
        Ok(())
    }

    /// Without links of its own, it copies: `rel` gets the target's bytes (their durability
    /// too), mode and mtime, and a name that already holds the target (the same path) is left
    /// alone. `preserve` changes nothing: a link shares them.
    fn hard_link(&self, rel: &[u8], target: &[u8], _preserve: bool) -> Result<()> {
        check_entry(rel)?;
        check_entry(target)?;
        let mut st = self.lock();
        let from = join(&st.dir(parent(target), true)?, file_name(target));
        let (data, mode, mtime) = match st.nodes.get(&from) {
            Some(Node::File { data, mode, mtime }) => (data.clone(), *mode, *mtime),
            Some(_) => return Err(StoreError::refused("its first name is not a regular file at the destination")),
            None => return Err(StoreError::errno(libc::ENOENT)),
        };
        let key = join(&st.dir(parent(rel), true)?, file_name(rel));
        match st.nodes.get(&key) {
            _ if key == from => return Ok(()),
            Some(Node::Dir { .. }) => return Err(StoreError::errno(libc::EISDIR)),
            _ => {}
        }
        st.nodes.insert(key, Node::File { data, mode, mtime });
        Ok(())
    }

    fn hash_file(&self, rel: &[u8], size: u64, chunk_size: u32) -> Result<[u8; 32]> {
        check_entry(rel)?;
        let st = self.lock();
        let key = join(&st.dir(parent(rel), true)?, file_name(rel));
        let data = match st.nodes.get(&key) {
            Some(Node::File { data, .. }) => &data.now,
            Some(_) => return Err(StoreError::refused("not a regular file; refused")),
            None => return Err(StoreError::errno(libc::ENOENT)),
        };
        let Some(data) = data.get(..size as usize) else { return Err(StoreError::new(Kind::Other, "failed to fill whole buffer")) };
        let hashes: Vec<[u8; 32]> = (0..chunk_count(size, chunk_size))
            .map(|i| {
                let (off, len) = tern_proto::chunk::chunk_range(size, chunk_size, i);
                crate::faults::chunk_hash(&data[off as usize..(off + u64::from(len)) as usize])
            })
            .collect();
        Ok(tern_proto::chunk::file_hash(size, &hashes))
    }

    fn set_dir_meta(&self, rel: &[u8], meta: &Meta) -> Result<()> {
        check(rel)?;
        let mut st = self.lock();
        let key = st.dir(rel, true)?;
        if let Some(Node::Dir { mode, mtime }) = st.nodes.get_mut(&key) {
            *mode = meta.mode.map_or(*mode, |m| m & 0o7777);
            *mtime = meta.mtime.unwrap_or(*mtime);
        }
        Ok(())
    }

    fn list(&self, rel: &[u8]) -> Result<Vec<Listed>> {
        check(rel)?;
        let st = self.lock();
        let key = st.dir(rel, false)?;
        let skip = if key.is_empty() { 0 } else { key.len() + 1 };
        Ok(st.under(&key).filter(|(k, _)| !k[skip..].contains(&b'/')).map(|(k, n)| (k[skip..].to_vec(), matches!(n, Node::Dir { .. }))).collect())
    }

    fn remove_tree(&self, rel: &[u8]) -> Result<()> {
        check_entry(rel)?;
        let mut st = self.lock();
        let key = join(&st.dir(parent(rel), false)?, file_name(rel));
        if let Some(Node::Dir { .. }) = st.nodes.get(&key) {
            let doomed: Vec<Vec<u8>> = st.under(&key).map(|(k, _)| k.clone()).collect();
            for k in doomed {
                st.nodes.remove(&k);
            }
            let prefix = [&key[..], b"/"].concat();
            st.parts.retain(|k, _| !k.starts_with(&prefix));
        }
        st.nodes.remove(&key);
        Ok(())
    }

    fn display(&self, rel: &[u8]) -> String {
        format!("mem:/{}", String::from_utf8_lossy(rel))
    }
}

/// A writer on a partial file of a `MemSink`.
pub(crate) struct MemPart {
    sink: MemSink,
    key: Vec<u8>,
    id: u64,
    epoch: u64,
}

impl MemPart {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
        let mut st = self.sink.lock();
        if st.epoch != self.epoch {
            return Err(StoreError::new(Kind::Other, "the store crashed since this partial file was opened"));
        }
        if st.parts.get(&self.key).is_none_or(|p| p.id != self.id) {
            return Err(StoreError::new(Kind::Other, "this partial file was published, abandoned, replaced or removed"));
        }
        f(&mut st)
    }
}

impl Part for MemPart {
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.with(|st| {
            let now = st.parts.get_mut(&self.key).unwrap().data.changed();
            let end = offset as usize + data.len();
            if now.len() < end {
                now.resize(end, 0);
            }
            now[offset as usize..end].copy_from_slice(data);
            Ok(())
        })
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.with(|st| {
            let p = &st.parts[&self.key];
            if offset.checked_add(buf.len() as u64).is_none_or(|end| end > p.spec.size) {
                return Err(StoreError::new(Kind::Other, "read past the end of the partial file"));
            }
            let have = p.data.now.get(offset as usize..).unwrap_or_default();
            let n = have.len().min(buf.len());
            buf[..n].copy_from_slice(&have[..n]);
            buf[n..].fill(0);
            Ok(())
        })
    }

    fn record_chunk(&self, index: u64, hash: &[u8; 32]) -> Result<()> {
        self.with(|st| {
            st.parts.get_mut(&self.key).unwrap().journal.push(encode_record(index, hash));
            Ok(())
        })
    }

    fn seal(&self, first: u64, end: u64, stripe_hash: &[u8; 32]) -> Result<()> {
        self.with(|st| {
            let p = st.parts.get_mut(&self.key).unwrap();
            // Its data durable first (`fdatasync`), then the seal.
            p.data.durable = p.data.now.clone();
            p.data.dirty = false;
            p.journal.push(encode_seal(first, end, stripe_hash));
            Ok(())
        })
    }

    fn write_whole(&self, data: &[u8], meta: Option<&Meta>) -> Result<()> {
        self.write_at(0, data)?;
        self.with(|st| {
            let p = st.parts.get_mut(&self.key).unwrap();
            p.data.changed().resize(p.spec.size as usize, 0);
            if let Some(meta) = meta {
                p.meta = *meta;
            }
            Ok(())
        })
    }

    fn finish_verified(&self, meta: &Meta, verify: Option<&[u8; 32]>) -> Result<()> {
        self.with(|st| {
            let p = st.parts.get_mut(&self.key).unwrap();
            let size = p.spec.size as usize;
            p.data.changed().resize(size, 0);
            if let Some(expected) = verify {
                let (size, chunk_size) = (p.spec.size, p.spec.chunk_size);
                let hashes: Vec<[u8; 32]> = (0..chunk_count(size, chunk_size))
                    .map(|i| {
                        let (off, len) = tern_proto::chunk::chunk_range(size, chunk_size, i);
                        crate::faults::chunk_hash(&p.data.now[off as usize..(off + u64::from(len)) as usize])
                    })
                    .collect();
                if &tern_proto::chunk::file_hash(size, &hashes) != expected {
                    return Err(StoreError::new(Kind::Corrupt, "whole-file hash of the written data does not match on re-read (--verify full); storage corrupted it"));
                }
            }
            p.meta = *meta;
            p.finished = true;
            Ok(())
        })
    }

    fn publish(&self) -> Result<()> {
        self.with(|st| {
            if !st.parts[&self.key].finished {
                return Err(StoreError::new(Kind::Other, "publish before finish"));
            }
            if let Some(Node::Dir { .. }) = st.nodes.get(&self.key) {
                return Err(StoreError { kind: Kind::Conflict, errno: Some(libc::EISDIR), message: "a directory stands under the final name; nothing was renamed into place".into(), what: None });
            }
            let p = st.parts.remove(&self.key).unwrap();
            if p.data.dirty {
                st.unbarriered.push(self.key.clone());
            }
            st.nodes.insert(self.key.clone(), Node::File { data: p.data, mode: p.meta.mode.unwrap_or(0o644), mtime: p.meta.mtime.unwrap_or((0, 0)) });
            Ok(())
        })
    }

    fn abandon(&self) -> Result<()> {
        self.with(|st| {
            st.parts.remove(&self.key);
            Ok(())
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::faults::chunk_hash;
    use crate::store::conformance::{Harness, spec};

    pub(crate) fn fixture() -> (MemSink, MemSink) {
        let s = MemSink::new();
        (s.clone(), s)
    }

    impl Harness for MemSink {
        fn read_file(&self, rel: &[u8]) -> Option<Vec<u8>> {
            MemSink::read_file(self, rel)
        }

        fn corrupt_part(&self, rel: &[u8], offset: u64, data: &[u8]) {
            let mut st = self.lock();
            let key = join(&st.dir(parent(rel), true).unwrap(), file_name(rel));
            let now = &mut st.parts.get_mut(&key).unwrap().data.now;
            now[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        }

        fn plant_symlink(&self, rel: &[u8], target: &[u8]) {
            self.lock().nodes.insert(rel.to_vec(), Node::Link { target: target.to_vec(), mtime: (0, 0) });
        }

        fn plant_marker(&self, _dir: &[u8]) {
            // A MemSink keeps no markers among the entries: nothing to hide.
        }

        fn outside_untouched(&self) -> bool {
            // Nothing lies outside a MemSink's root: `resolve` refuses to climb above it.
            true
        }
    }

    #[test]
    fn a_crash_loses_unbarriered_data_and_resume_claims_none_of_it() {
        let s = MemSink::new();
        let sp = spec(4 * 8, 8);
        let (p, _) = s.open_part(b"f", &sp).unwrap();
        for i in 0..2u64 {
            p.write_at(i * 8, &[i as u8 + 1; 8]).unwrap();
            p.record_chunk(i, &chunk_hash(&[i as u8 + 1; 8])).unwrap();
        }
        s.barrier().unwrap();
        for i in 2..4u64 {
            p.write_at(i * 8, &[i as u8 + 1; 8]).unwrap();
            p.record_chunk(i, &chunk_hash(&[i as u8 + 1; 8])).unwrap();
        }
        s.crash();
        assert!(p.write_at(0, &[0; 8]).is_err(), "a handle from before the crash is dead");
        let (p, resume) = s.open_part(b"f", &sp).unwrap();
        let claimed: Vec<u64> = resume.chunks.iter().map(|c| c.0).collect();
        assert_eq!(claimed, [0, 1], "the journal names 4 chunks, the data of 2 survived");
        for i in 2..4u64 {
            p.write_at(i * 8, &[i as u8 + 1; 8]).unwrap();
        }
        p.finish(&Meta::default()).unwrap();
        s.barrier().unwrap();
        p.publish().unwrap();
        assert!(s.unbarriered_publishes().is_empty());
        s.crash();
        assert_eq!(s.read_file(b"f").unwrap(), [[1u8; 8], [2; 8], [3; 8], [4; 8]].concat(), "published after a barrier: survives");
    }

    #[test]
    fn a_publish_before_the_barrier_is_recorded_and_a_crash_tears_it() {
        let s = MemSink::new();
        let (p, _) = s.open_part(b"f", &spec(8, 8)).unwrap();
        p.write_at(0, b"12345678").unwrap();
        p.finish(&Meta::default()).unwrap();
        p.publish().unwrap();
        assert_eq!(s.unbarriered_publishes(), [b"f".to_vec()]);
        s.crash();
        assert_ne!(s.read_file(b"f").unwrap(), b"12345678", "the name survived, the data did not");
        assert_eq!(s.barriers(), 0);
    }
}
