//! `PosixSink`: a destination directory on a POSIX file system, every operation relative to a
//! descriptor opened beneath the root (`fsops::DestRoot`: `openat2(RESOLVE_BENEATH)`, or a walk
//! through no link at all on kernels without it), final names with `O_NOFOLLOW`.
//!
//! A partial file `dir/NAME` is `dir/.tern.TAG.H.part`, its journal `dir/.tern.TAG.H.journal`
//! (`fsops::Tag`, docs/journal.md): tern's reserved namespace in that directory, which `list`
//! leaves out and a user's entry may not take.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, OnceLock};

use tern_proto::chunk::chunk_count;
use tern_proto::path::{file_name, parent};

use super::{EntryType, Features, Kind, Listed, Meta, Part, PartSpec, Result, Resume, Sink, Stat, StoreError, check, check_entry, join, rehash_claimed};
use crate::store::fsops::{self, Beneath, DestRoot, Dir, Tag};
use crate::store::hashing::is_zero;
use crate::store::journal::{Claim, Journal, JournalHeader};

/// A destination directory. `links_beneath`: refuse a symlink whose target could resolve outside
/// that root (a daemon's, unless `serve --allow-links-out`), judged by where the kernel puts the
/// link's directory (`fsops::link_stays_beneath`).
pub(crate) struct PosixSink {
    /// The root, and the directories parts are written in (a part names its directory and takes
    /// the descriptor from here while it uses it).
    dirs: Arc<DirCache>,
    links_beneath: Option<Arc<Beneath>>,
    /// Start each write's writeback at once (`sync_file_range`, no wait), so making a part
    /// durable (a barrier, a seal) waits only for the tail, not the whole file.
    write_behind: bool,
}

impl PosixSink {
    pub(crate) fn new(root: DestRoot, links_beneath: Option<Arc<Beneath>>) -> Self {
        Self::sharing(Arc::new(DirCache::new(root, DirCache::SMALL)), links_beneath)
    }

    /// A store over `dirs`' root that takes its parts' directories from `dirs`, shared with
    /// whoever else uses it (the receiver's main loop, streams and finalizer): one bound on the
    /// directory descriptors open.
    pub(crate) fn sharing(dirs: Arc<DirCache>, links_beneath: Option<Arc<Beneath>>) -> Self {
        Self { dirs, links_beneath, write_behind: false }
    }

    fn root(&self) -> &DestRoot {
        &self.dirs.root
    }

    /// Parts opened from now on start each write's writeback as it lands (durable mode).
    pub(crate) fn with_write_behind(mut self, on: bool) -> Self {
        self.write_behind = on;
        self
    }

    /// The directory `rel` is in, opened beneath the root, with its tag; `rel`'s own name must
    /// not be in tern's namespace there.
    fn parent_of(&self, rel: &[u8]) -> Result<Dir> {
        let dir = Dir::new(self.root().dir(parent(rel))?)?;
        if dir.tag.reserves(file_name(rel)) {
            return Err(reserved(rel));
        }
        Ok(dir)
    }

    /// Directory `rel` opened through no symlink at all. A link on the way is `Refused` (the
    /// kernel says ENOTDIR for a final one: looked at again to tell it from a file).
    fn dir_no_links(&self, rel: &[u8]) -> Result<std::os::fd::OwnedFd> {
        match self.root().dir_no_links(rel) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) && self.link_on_the_way(rel) => {
                Err(StoreError { kind: Kind::Refused, errno: Some(libc::ELOOP), message: "a symlink stands on the way; refused (never followed here)".into(), what: None })
            }
            r => Ok(r?),
        }
    }

    fn link_on_the_way(&self, rel: &[u8]) -> bool {
        let mut prefix = Vec::new();
        for c in rel.split(|&b| b == b'/') {
            prefix = join(&prefix, c);
            let Ok(dir) = self.root().dir_no_links(parent(&prefix)) else { return false };
            match fsops::stat_at(&dir, c) {
                Ok(Some(st)) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => return true,
                Ok(Some(_)) => {}
                _ => return false,
            }
        }
        false
    }

    /// Every name in directory `rel` (opened through no link at all), tern's own included, and
    /// the directory; `.` and `..` left out, sorted.
    fn list_all(&self, rel: &[u8]) -> Result<(Dir, Vec<Listed>)> {
        let dir = Dir::new(self.dir_no_links(rel)?)?;
        let mut items = Vec::new();
        let mut rd = rustix::fs::Dir::read_from(&dir.fd)?;
        while let Some(ent) = rd.read() {
            let ent = ent?;
            let name = ent.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let is_dir = match ent.file_type() {
                rustix::fs::FileType::Directory => true,
                rustix::fs::FileType::Unknown => fsops::stat_at(&dir, name)?.is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR),
                _ => false,
            };
            items.push((name.to_vec(), is_dir));
        }
        items.sort();
        Ok((dir, items))
    }

    /// Depth-first with an explicit stack and one open directory at a time; each step relative
    /// to a directory opened through no link (a link is removed, not entered).
    fn remove_all(&self, rel: &[u8]) -> Result<()> {
        let mut stack = vec![(rel.to_vec(), false)];
        while let Some((rel, emptied)) = stack.pop() {
            let parent_dir = self.dir_no_links(parent(&rel))?;
            let name = file_name(&rel);
            if emptied {
                fsops::rmdir_at(&parent_dir, name)?;
                continue;
            }
            match fsops::stat_at(&parent_dir, name)? {
                None => {}
                Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                    let (_, items) = self.list_all(&rel)?;
                    stack.push((rel.clone(), true));
                    stack.extend(items.into_iter().map(|(n, _)| (join(&rel, &n), false)));
                }
                Some(_) => fsops::unlink_at(&parent_dir, name)?,
            }
        }
        Ok(())
    }
}

/// Why a hard link's target is refused when it is not a regular file (the receiver's message).
const NOT_A_FILE: &str = "its first name is not a regular file at the destination";

fn reserved(rel: &[u8]) -> StoreError {
    StoreError::refused(format!("'{}' is in the name space tern keeps for its own files in that directory; refused", String::from_utf8_lossy(rel)))
}

/// Directory descriptors, opened beneath the root when first needed and kept up to `cap` (one is
/// evicted to make room), so how many directories the files in flight span never decides how
/// many descriptors are open. A user holds a directory's descriptor only while it uses it.
pub(crate) struct DirCache {
    root: DestRoot,
    cap: usize,
    map: Mutex<HashMap<Vec<u8>, Arc<Dir>>>,
}

impl DirCache {
    /// The cap of a store that makes its own (requests, tests): it opens few parts.
    const SMALL: usize = 16;

    pub(crate) fn new(root: DestRoot, cap: usize) -> Self {
        Self { root, cap, map: Mutex::new(HashMap::new()) }
    }

    /// Directory `rel` beneath the root (empty: the root).
    pub(crate) fn get(&self, rel: &[u8]) -> io::Result<Arc<Dir>> {
        if let Some(d) = self.map.lock().unwrap().get(rel) {
            return Ok(d.clone());
        }
        let dir = Arc::new(Dir::new(self.root.dir(rel)?)?);
        let mut map = self.map.lock().unwrap();
        if map.len() >= self.cap
            && !map.contains_key(rel)
            && let Some(evict) = map.keys().next().cloned()
        {
            map.remove(&evict);
        }
        map.insert(rel.to_vec(), dir.clone());
        Ok(dir)
    }

    /// Directory `rel`, the very one whose tag a part's temporary names were made with (out of
    /// descriptors, it waits for files in flight to land and give theirs back).
    pub(crate) fn get_tagged(&self, rel: &[u8], tag: Tag) -> io::Result<Arc<Dir>> {
        let dir = fsops::waiting_for_descriptors(|| self.get(rel))?;
        if dir.tag != tag {
            return Err(io::Error::other("its directory was replaced while the file was in flight"));
        }
        Ok(dir)
    }
}

pub(crate) fn stat_of(st: &rustix::fs::Stat) -> Stat {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => EntryType::File,
        libc::S_IFDIR => EntryType::Dir,
        libc::S_IFLNK => EntryType::Symlink,
        _ => EntryType::Other,
    };
    Stat { kind, size: st.st_size as u64, mode: st.st_mode & 0o7777, mtime: (st.st_mtime, st.st_mtime_nsec as u32) }
}

impl Sink for PosixSink {
    type Part = PosixPart;

    fn features(&self) -> Features {
        Features { sparse: true, atomic_publish: true, resumable: true, chunk_size_min: 1, chunk_size_max: u32::MAX, max_chunks: None }
    }

    fn stat(&self, rel: &[u8]) -> Result<Option<Stat>> {
        check(rel)?;
        if rel.is_empty() {
            return Ok(Some(stat_of(&rustix::fs::fstat(self.root().dir(b"")?)?)));
        }
        // Through the directory cache: the receiver asks this of every file a re-run finds in
        // place, and opening the parent beneath the root each time costs a path walk (a metadata
        // round trip per component on a parallel file system).
        let dir = fsops::waiting_for_descriptors(|| self.dirs.get(parent(rel)))?;
        Ok(fsops::stat_at(&*dir, file_name(rel))?.as_ref().map(stat_of))
    }

    fn mkdir_all(&self, rel: &[u8]) -> Result<bool> {
        check(rel)?;
        Ok(self.root().mkdir_all(rel)?)
    }

    fn open_part(&self, rel: &[u8], spec: &PartSpec) -> Result<(PosixPart, Resume)> {
        check_entry(rel)?;
        let dir = fsops::waiting_for_descriptors(|| self.dirs.get(parent(rel))).map_err(|e| StoreError::from(e).doing("cannot open the directory"))?;
        if dir.tag.reserves(file_name(rel)) {
            return Err(reserved(rel));
        }
        let (tmp, journal_name) = dir.tag.temp_names(file_name(rel));
        let header = JournalHeader { size: spec.size, mtime_s: spec.mtime.0, mtime_ns: spec.mtime.1, chunk_size: spec.chunk_size };
        // Single-chunk files keep no journal: resending one chunk costs what re-hashing it would.
        let journaled = chunk_count(spec.size, spec.chunk_size) > 1 || spec.stripe.is_some();
        let mut resume = Resume { chunks: Vec::new(), fresh: true, sealed: false };
        let mut journal = None;
        if let Some((first, end)) = spec.stripe {
            // Shared with the file's other stripes, which may be writing it now from other
            // nodes: joined (or started), only this stripe's chunks resumed, nothing removed
            // that another stripe wrote, and never sparse (the part is not this writer's).
            let (j, records) = join_shared_part(&*dir, &tmp, &journal_name, &header).map_err(doing("cannot set up the shared partial"))?;
            journal = Some(j);
            resume.fresh = false;
            if spec.resume
                && let Ok(part) = fsops::open_read(&*dir, &tmp)
            {
                rehash_claimed(&|buf, off| part.read_exact_at(buf, off).is_ok(), spec.size, spec.chunk_size, records.into_iter().filter(|(i, _, _)| (first..end).contains(i)), &mut resume.chunks);
            }
        } else if journaled
            && spec.resume
            && !spec.fresh_dir
            && let Some((h, records)) = Journal::read_sealed(&*dir, &journal_name).map_err(doing("cannot read journal"))?
            && h == header
            && let Ok(part) = fsops::open_read(&*dir, &tmp)
        {
            let (_, sealed) = rehash_claimed(&|buf, off| part.read_exact_at(buf, off).is_ok(), spec.size, spec.chunk_size, records, &mut resume.chunks);
            resume.fresh = false;
            resume.sealed = sealed;
            journal = Some(Journal::reopen(&*dir, &journal_name).map_err(doing("cannot open journal"))?);
        }
        if resume.fresh {
            // In a directory created this session nothing stood: nothing to remove.
            if !spec.fresh_dir {
                fsops::unlink_at(&*dir, &tmp).map_err(doing("cannot remove stale temporary"))?;
                // A journal is started over below (its create truncates). A part that keeps
                // none removes an earlier one only when it starts over: a resumed one-chunk
                // file costs one removal (a metadata round trip on a parallel file system), not
                // two.
                if !journaled && !spec.resume {
                    fsops::unlink_at(&*dir, &journal_name).map_err(doing("cannot remove journal"))?;
                }
            }
            if journaled {
                journal = Some(Journal::create(&*dir, &journal_name, &header).map_err(doing("cannot create journal"))?);
            }
        }
        resume.chunks.sort_unstable_by_key(|&(index, _)| index);
        let part = PosixPart {
            dirs: self.dirs.clone(),
            parent: parent(rel).to_vec(),
            tag: dir.tag,
            tmp,
            name: file_name(rel).to_vec(),
            journal_name,
            file: OnceLock::new(),
            written: OnceLock::new(),
            meta_applied: AtomicBool::new(false),
            journal,
            size: spec.size,
            chunk_size: spec.chunk_size,
            fresh: resume.fresh,
            write_behind: self.write_behind,
            written_end: AtomicU64::new(0),
            finished: AtomicBool::new(false),
            gone: AtomicBool::new(false),
        };
        Ok((part, resume))
    }

    fn barrier(&self) -> Result<()> {
        Ok(self.root().syncfs()?)
    }

    fn symlink(&self, rel: &[u8], target: &[u8], mtime: Option<(i64, u32)>) -> Result<()> {
        check_entry(rel)?;
        let dir = self.parent_of(rel)?;
        if let Some(b) = &self.links_beneath
            && !b.depth(&dir).is_some_and(|depth| fsops::link_stays_beneath(depth, target))
        {
            return Err(StoreError::refused(format!(
                "its target '{}' could resolve outside the daemon's root; refused (copy with --safe-links to leave such links out, or the daemon's operator allows them with tern serve --allow-links-out)",
                String::from_utf8_lossy(target)
            )));
        }
        let name = file_name(rel);
        let (tmp, _) = dir.tag.temp_names(name);
        fsops::unlink_at(&dir, &tmp)?;
        fsops::symlink_at(target, &dir, &tmp)?;
        let placed = (|| {
            if mtime.is_some() {
                fsops::set_meta_at(&dir, &tmp, None, mtime, true)?;
            }
            if let Some(st) = fsops::stat_at(&dir, name)?
                && st.st_mode & libc::S_IFMT == libc::S_IFDIR
            {
                return Err(io::Error::from_raw_os_error(libc::EISDIR));
            }
            fsops::rename_at(&dir, &tmp, name)
        })();
        if placed.is_err() {
            let _ = fsops::unlink_at(&dir, &tmp);
        }
        Ok(placed?)
    }

    fn hard_link(&self, rel: &[u8], target: &[u8], preserve: bool) -> Result<()> {
        check_entry(rel)?;
        check_entry(target)?;
        let target_dir = self.root().dir(parent(target))?;
        let target_name = file_name(target);
        let Some(st) = fsops::stat_at(&target_dir, target_name)? else { return Err(StoreError::errno(libc::ENOENT)) };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(StoreError::refused(NOT_A_FILE));
        }
        let dir = self.parent_of(rel)?;
        let name = file_name(rel);
        match fsops::stat_at(&dir, name)? {
            Some(at) if at.st_dev == st.st_dev && at.st_ino == st.st_ino => return Ok(()),
            Some(at) if at.st_mode & libc::S_IFMT == libc::S_IFDIR => return Err(StoreError::errno(libc::EISDIR)),
            _ => {}
        }
        let (tmp, _) = dir.tag.temp_names(name);
        fsops::unlink_at(&dir, &tmp)?;
        match rustix::fs::linkat(&target_dir, target_name, &dir, &tmp[..], rustix::fs::AtFlags::empty()) {
            Ok(()) => {}
            Err(e) if [rustix::io::Errno::XDEV, rustix::io::Errno::PERM, rustix::io::Errno::MLINK, rustix::io::Errno::NOTSUP].contains(&e) => {
                let mut from = fsops::open_read(&target_dir, target_name)?;
                let mut to = fsops::open_temp(&dir, &tmp)?;
                io::copy(&mut from, &mut to)?;
                let md = from.metadata()?;
                use std::os::unix::fs::MetadataExt;
                let mtime = preserve.then(|| (md.mtime(), md.mtime_nsec() as u32));
                fsops::set_meta(&to, preserve.then_some(md.mode() & 0o7777), mtime)?;
                to.sync_all()?;
            }
            Err(e) => return Err(e.into()),
        }
        Ok(fsops::rename_at(&dir, &tmp, name)?)
    }

    fn hash_file(&self, rel: &[u8], size: u64, chunk_size: u32) -> Result<[u8; 32]> {
        check_entry(rel)?;
        let dir = fsops::waiting_for_descriptors(|| self.dirs.get(parent(rel)))?;
        // Looked at first: opening a fifo for reading would wait for a writer.
        match fsops::stat_at(&*dir, file_name(rel))? {
            None => return Err(StoreError::errno(libc::ENOENT)),
            Some(st) if st.st_mode & libc::S_IFMT != libc::S_IFREG => return Err(StoreError::refused("not a regular file; refused")),
            Some(_) => {}
        }
        let f = fsops::open_read(&*dir, file_name(rel))?;
        Ok(crate::store::hashing::hash_file(&f, size, chunk_size)?)
    }

    fn set_dir_meta(&self, rel: &[u8], meta: &Meta) -> Result<()> {
        check(rel)?;
        let (dir, name): (_, &[u8]) = if rel.is_empty() { (self.root().dir(b"")?, b".") } else { (self.root().dir(parent(rel))?, file_name(rel)) };
        match fsops::stat_at(&dir, name)? {
            Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {}
            Some(_) => return Err(StoreError::errno(libc::ENOTDIR)),
            None => return Err(StoreError::errno(libc::ENOENT)),
        }
        Ok(fsops::set_meta_at(&dir, name, meta.mode, meta.mtime, false)?)
    }

    fn list(&self, rel: &[u8]) -> Result<Vec<Listed>> {
        check(rel)?;
        let (dir, items) = self.list_all(rel)?;
        Ok(items.into_iter().filter(|(name, _)| !dir.tag.reserves(name)).collect())
    }

    fn remove_tree(&self, rel: &[u8]) -> Result<()> {
        check_entry(rel)?;
        self.remove_all(rel)
    }

    fn display(&self, rel: &[u8]) -> String {
        self.root().display(rel)
    }
}

/// A partial file: the temporary and (multi-chunk files) its journal, in the directory of the
/// final name, opened at `open_part`.
pub(crate) struct PosixPart {
    /// It holds no directory descriptor: it names its directory (`parent`, with the tag its
    /// temporary names came from) and takes the descriptor from the cache while it uses it.
    dirs: Arc<DirCache>,
    parent: Vec<u8>,
    tag: Tag,
    tmp: Vec<u8>,
    name: Vec<u8>,
    journal_name: Vec<u8>,
    /// The temporary, opened (created) by the first call that needs it, in the writer's thread:
    /// a tree's temporaries are created in parallel by the streams, and a part holds no
    /// descriptor for its data before its data arrives. Or why it could not be opened.
    file: OnceLock<Result<File>>,
    /// Written whole ([`PosixPart::write_whole`]): the temporary was opened, written and closed
    /// at once; its device and inode, for the checks before it is published.
    written: OnceLock<(u64, u64)>,
    /// `write_whole` set the metadata already: `finish` leaves it.
    meta_applied: AtomicBool,
    journal: Option<Journal>,
    size: u64,
    chunk_size: u32,
    /// The temporary did not exist before: all-zero blocks may be left as holes.
    fresh: bool,
    write_behind: bool,
    /// End of the furthest byte written: a fresh file that reached its size needs no truncate.
    written_end: AtomicU64,
    finished: AtomicBool,
    /// Published or abandoned: the handle is spent.
    gone: AtomicBool,
}

/// Names the step that failed on an I/O error: `.map_err(doing("write failed"))`.
fn doing<E: Into<StoreError>>(what: &'static str) -> impl Fn(E) -> StoreError {
    move |e| e.into().doing(what)
}

impl PosixPart {
    /// The part's directory, the very one its temporary names were made for.
    fn dir(&self) -> Result<Arc<Dir>> {
        Ok(self.dirs.get_tagged(&self.parent, self.tag)?)
    }

    /// The temporary, opened on first use; out of descriptors, it waits for files in flight to
    /// land and give theirs back.
    fn file(&self) -> Result<&File> {
        match self.file.get_or_init(|| Ok(fsops::waiting_for_descriptors(|| fsops::open_temp(&*self.dir()?, &self.tmp))?)) {
            Ok(f) => Ok(f),
            Err(e) => Err(StoreError { kind: e.kind, errno: e.errno, message: e.message.clone(), what: Some("cannot create temporary file") }),
        }
    }

    fn live(&self) -> Result<()> {
        if self.gone.load(Relaxed) {
            return Err(StoreError::new(Kind::Other, "this partial file was already published or abandoned"));
        }
        Ok(())
    }

    /// What publish will move must be the file that was written: if anything else took the
    /// temporary's name meanwhile, land nothing.
    fn check_still_holds(&self, written: (u64, u64)) -> Result<()> {
        let dir = self.dir().map_err(|e| e.doing("cannot open the directory"))?;
        match still_holds(&*dir, &self.tmp, written) {
            Ok(true) => Ok(()),
            _ => Err(StoreError::new(Kind::Other, REPLACED)),
        }
    }

    /// `--verify full`: what storage returns of `file` adds up to `expected`.
    fn reread_matches(&self, file: &File, expected: &[u8; 32]) -> Result<()> {
        let have = reread_hash(file, self.size, self.chunk_size).map_err(|(what, e)| StoreError::from(e).doing(what))?;
        if &have != expected {
            return Err(StoreError::new(Kind::Corrupt, "whole-file hash of the written data does not match on re-read (--verify full); storage corrupted it"));
        }
        Ok(())
    }
}

impl Part for PosixPart {
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.live()?;
        let end = write_chunk(self.file()?, data, offset, self.fresh, self.write_behind).map_err(doing("write failed"))?;
        self.written_end.fetch_max(end, Relaxed);
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if offset.checked_add(buf.len() as u64).is_none_or(|end| end > self.size) {
            return Err(StoreError::new(Kind::Other, "read past the end of the partial file"));
        }
        // Written whole and closed: read through a descriptor opened for this read.
        let reopened;
        let file = match self.written.get() {
            Some(_) => {
                reopened = fsops::open_read(&*self.dir()?, &self.tmp)?;
                &reopened
            }
            None => self.file()?,
        };
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        // Past the temporary's end, before `finish` set its length: never written, so zeros.
        buf[done..].fill(0);
        Ok(())
    }

    fn record_chunk(&self, index: u64, hash: &[u8; 32]) -> Result<()> {
        self.live()?;
        match &self.journal {
            Some(j) => j.append(index, hash).map_err(doing("cannot write journal")),
            None => Ok(()),
        }
    }

    fn seal(&self, first: u64, end: u64, stripe_hash: &[u8; 32]) -> Result<()> {
        self.live()?;
        let Some(journal) = &self.journal else {
            return Err(StoreError::new(Kind::Other, "a part of one chunk keeps no journal to seal"));
        };
        // The temporary as written (all of a stripe's chunks resumed: opened now), never created
        // here: a seal over a file that is not there would vouch for data nobody wrote.
        let opened;
        let file = match self.file.get() {
            Some(Ok(f)) => f,
            _ => {
                opened = fsops::open_read(&*self.dir()?, &self.tmp)?;
                &opened
            }
        };
        seal_durable(file, journal, first, end, stripe_hash)
    }

    /// Opens the temporary, writes, sets the length and (given `meta`) the metadata, starts the
    /// writeback (write-behind), remembers which file it wrote, and closes it: `finish` then
    /// needs no descriptor (unless it re-reads, or sets metadata not set here).
    fn write_whole(&self, data: &[u8], meta: Option<&Meta>) -> Result<()> {
        self.live()?;
        debug_assert_eq!(data.len() as u64, self.size);
        let dir = self.dir().map_err(|e| e.doing("cannot open the directory"))?;
        // Out of descriptors, the stream waits for files in flight to land and give theirs back.
        let file = fsops::waiting_for_descriptors(|| fsops::open_temp(&*dir, &self.tmp)).map_err(doing("cannot create temporary file"))?;
        // Its writeback is started below, once length and metadata are set too.
        let end = write_chunk(&file, data, 0, self.fresh, false).map_err(doing("write failed"))?;
        // A trailing hole, or a longer stale temporary.
        if end != self.size || !self.fresh {
            file.set_len(self.size).map_err(doing("cannot set length"))?;
        }
        if let Some(meta) = meta {
            fsops::set_meta(&file, meta.mode, meta.mtime).map_err(doing("cannot set mode/mtime"))?;
            self.meta_applied.store(true, Relaxed);
        }
        if self.write_behind && self.size >= WRITE_BEHIND_MIN {
            // Asynchronous: queues the file for writeback and returns (no wait).
            start_writeback(&file, 0, 0);
        }
        let st = rustix::fs::fstat(&file).map_err(doing("cannot stat"))?;
        self.written_end.fetch_max(end, Relaxed);
        let _ = self.written.set((st.st_dev, st.st_ino));
        Ok(())
    }

    /// The re-read flushes the temporary and drops its cached pages first (`reread_hash`).
    fn finish_verified(&self, meta: &Meta, verify: Option<&[u8; 32]>) -> Result<()> {
        self.live()?;
        if let Some(&written) = self.written.get() {
            // Written whole and closed: opened again (by name beneath its directory, never
            // through a link) only to re-read it or to set what `write_whole` did not.
            let pending = !self.meta_applied.load(Relaxed) && (meta.mode.is_some() || meta.mtime.is_some());
            if verify.is_some() || pending {
                let dir = self.dir().map_err(|e| e.doing("cannot open the directory"))?;
                let file = fsops::waiting_for_descriptors(|| fsops::open_read(&*dir, &self.tmp)).map_err(doing(if verify.is_some() { "cannot re-read for verification" } else { "cannot open" }))?;
                let st = rustix::fs::fstat(&file).map_err(doing("cannot stat"))?;
                if (st.st_dev, st.st_ino) != written {
                    return Err(StoreError::new(Kind::Other, REPLACED));
                }
                if let Some(expected) = verify {
                    self.reread_matches(&file, expected)?;
                }
                fsops::set_meta(&file, meta.mode, meta.mtime).map_err(doing("cannot set mode/mtime"))?;
            }
            self.check_still_holds(written)?;
        } else {
            let file = self.file()?;
            // A fresh file whose last byte was written already has its length; otherwise a hole
            // at the end, or a longer stale temporary, needs the truncate.
            if !(self.fresh && self.written_end.load(Relaxed) == self.size) {
                file.set_len(self.size).map_err(doing("cannot set length"))?;
            }
            if let Some(expected) = verify {
                self.reread_matches(file, expected)?;
            }
            fsops::set_meta(file, meta.mode, meta.mtime).map_err(doing("cannot set mode/mtime"))?;
            let written = rustix::fs::fstat(file).map_err(doing("cannot stat"))?;
            self.check_still_holds((written.st_dev, written.st_ino))?;
        }
        self.finished.store(true, Relaxed);
        Ok(())
    }

    fn publish(&self) -> Result<()> {
        self.live()?;
        if !self.finished.load(Relaxed) {
            return Err(StoreError::new(Kind::Other, "publish before finish"));
        }
        // No look first (a metadata round trip on a parallel file system): a directory under
        // the final name makes the rename itself fail (EISDIR), and nothing changes.
        let dir = self.dir().map_err(|e| e.doing("cannot rename into place"))?;
        fsops::rename_at(&*dir, &self.tmp, &self.name).map_err(|e| match e.raw_os_error() {
            Some(libc::EISDIR) => StoreError {
                kind: Kind::Conflict,
                errno: Some(libc::EISDIR),
                message: "a directory stands under the final name; nothing was renamed into place".into(),
                what: Some("cannot rename into place"),
            },
            _ => StoreError::from(e).doing("cannot rename into place"),
        })?;
        self.gone.store(true, Relaxed);
        if self.journal.is_some() {
            let _ = fsops::unlink_at(&*dir, &self.journal_name);
        }
        Ok(())
    }

    fn abandon(&self) -> Result<()> {
        self.live()?;
        self.gone.store(true, Relaxed);
        let dir = self.dir()?;
        fsops::unlink_at(&*dir, &self.tmp)?;
        Ok(fsops::unlink_at(&*dir, &self.journal_name)?)
    }
}

/// Why a part is not published when its temporary's name no longer holds the file written.
pub(crate) const REPLACED: &str = "the temporary file was replaced or removed while it was written (another process in this directory?); nothing was renamed into place";

/// Whether `tmp` in `dir` is still the file written (`written`: its device and inode): what a
/// publish moves must be the file that was written and verified.
pub(crate) fn still_holds(dir: &impl std::os::fd::AsFd, tmp: &[u8], written: (u64, u64)) -> io::Result<bool> {
    Ok(fsops::stat_at(dir, tmp)?.is_some_and(|st| (st.st_dev, st.st_ino) == written))
}

/// `--verify full`'s read from storage: flushes `file`, drops its cached pages so the read comes
/// from storage, not memory, and hashes it whole as the source side does (`hashing::hash_file`).
/// Err: what failed and the error.
pub(crate) fn reread_hash(file: &File, size: u64, chunk_size: u32) -> std::result::Result<[u8; 32], (&'static str, io::Error)> {
    file.sync_data().map_err(|e| ("cannot flush", e))?;
    // Advice only: a file system that ignores it leaves a re-read from memory, never a wrong one.
    unsafe {
        libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(file), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    crate::store::hashing::hash_file(file, size, chunk_size).map_err(|e| ("cannot re-read for verification", e))
}

/// A file written whole that is smaller than this is left to the batch's barrier (`syncfs`)
/// rather than queued for writeback on its own. On ext4, a writeback started per small file
/// cost the receiver a third more CPU and a real 52,073-file tree 40 % more time (8.7-9.7 s
/// against 6.5-6.8 s onto ext4 over loopback); the barrier writes them in one
/// sweep, and there is little data to overlap. Larger files still start at once, so a barrier
/// waits only for their tail.
const WRITE_BEHIND_MIN: u64 = 1 << 20;

/// Writes one chunk's `data` at `off` of a part's temporary, in one `pwrite` (all-zero 64 KiB
/// blocks of a `fresh` file left as holes), and with `write_behind` starts its writeback
/// (`start_writeback`). Returns where the last write ended.
pub(crate) fn write_chunk(file: &File, data: &[u8], off: u64, fresh: bool, write_behind: bool) -> io::Result<u64> {
    let end = if fresh { write_sparse(file, data, off)? } else { file.write_all_at(data, off).map(|_| off + data.len() as u64)? };
    if write_behind {
        start_writeback(file, off, data.len() as u64);
    }
    Ok(end)
}

/// Queues `len` bytes at `off` of `file` for writeback (0, 0: all of it) and returns at once
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, no wait): what is made durable later waits only
/// for the tail.
pub(crate) fn start_writeback(file: &File, off: u64, len: u64) {
    unsafe {
        libc::sync_file_range(std::os::fd::AsRawFd::as_raw_fd(file), off as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Makes a part's data durable (`fdatasync`: write-behind already started each chunk's
/// writeback, so this waits for the tail), then seals chunks `first..end` in its journal
/// (docs/journal.md "Seals"): never a seal over data that is not durable.
pub(crate) fn seal_durable(file: &File, journal: &Journal, first: u64, end: u64, stripe_hash: &[u8; 32]) -> Result<()> {
    rustix::fs::fdatasync(file)?;
    Ok(journal.seal(first, end, stripe_hash)?)
}

/// Joins the partial file and journal that a file's stripes share, starting them if this is the
/// first stripe here. A journal of another version of the file (a leftover) is started over:
/// its temporary removed before the new header is written, so no stripe joins a stale part.
/// A journal whose header is still being written (another stripe just made it) is waited for;
/// one whose header stays unreadable (torn by a crash) is a leftover too.
pub(crate) fn join_shared_part(dir: &impl std::os::fd::AsFd, tmp: &[u8], jname: &[u8], header: &JournalHeader) -> io::Result<(Journal, Vec<Claim>)> {
    const WAIT: std::time::Duration = std::time::Duration::from_millis(5);
    const TRIES: u32 = 400; // 2 s: a header is one write after the create
    for _ in 0..TRIES {
        match Journal::read_sealed(dir, jname)? {
            Some((h, records)) if &h == header => return Ok((Journal::reopen(dir, jname)?, records)),
            Some(_) => break,
            None => {
                if let Some(j) = Journal::create_shared(dir, jname, header, || fsops::unlink_at(dir, tmp))? {
                    return Ok((j, Vec::new()));
                }
                std::thread::sleep(WAIT);
            }
        }
    }
    // A leftover: its temporary goes, then the journal restarts. A stripe of this version
    // racing here writes the same header, and what either wrote is re-hashed before it counts.
    fsops::unlink_at(dir, tmp)?;
    Ok((Journal::create(dir, jname, header)?, Vec::new()))
}

/// Writes the non-zero 64 KiB blocks of `data` at `off` (all-zero ones read back as zeros from
/// the hole of a fresh file); returns where the last write ended.
pub(crate) fn write_sparse(file: &File, data: &[u8], off: u64) -> io::Result<u64> {
    const BLOCK: usize = 64 << 10;
    let mut start = 0;
    let mut written_end = 0;
    while start < data.len() {
        // Find a run of non-zero blocks and write it in one call.
        while start < data.len() && is_zero(&data[start..(start + BLOCK).min(data.len())]) {
            start += BLOCK;
        }
        let mut end = start;
        while end < data.len() && !is_zero(&data[end..(end + BLOCK).min(data.len())]) {
            end += BLOCK;
        }
        let end = end.min(data.len());
        if start < end {
            file.write_all_at(&data[start..end], off + start as u64)?;
            written_end = off + end as u64;
        }
        start = end;
    }
    Ok(written_end)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::os::unix::ffi::OsStrExt;
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::store::conformance::Harness;

    /// A temporary directory holding the store's root `root/` and, beside it, `outside/keep`,
    /// which nothing done through the store may touch.
    pub(crate) struct PosixHarness {
        _tmp: tempfile::TempDir,
        top: PathBuf,
        root: PathBuf,
    }

    fn harness() -> PosixHarness {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().to_path_buf();
        std::fs::create_dir_all(top.join("root")).unwrap();
        std::fs::create_dir_all(top.join("outside")).unwrap();
        std::fs::write(top.join("outside/keep"), b"precious").unwrap();
        PosixHarness { _tmp: tmp, root: top.join("root"), top }
    }

    pub(crate) fn fixture_unconfined() -> (PosixSink, PosixHarness) {
        let h = harness();
        (PosixSink::new(DestRoot::open(None, &h.root).unwrap(), None), h)
    }

    /// As a daemon opens it: beneath its root, links that could leave it refused.
    pub(crate) fn fixture_beneath() -> (PosixSink, PosixHarness) {
        let h = harness();
        let b = Arc::new(Beneath::open(&h.root).unwrap());
        (PosixSink::new(DestRoot::open(Some(&b), &h.root).unwrap(), Some(b)), h)
    }

    fn path(root: &Path, rel: &[u8]) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        root.join(std::ffi::OsStr::from_bytes(rel))
    }

    impl Harness for PosixHarness {
        fn read_file(&self, rel: &[u8]) -> Option<Vec<u8>> {
            let p = path(&self.root, rel);
            std::fs::symlink_metadata(&p).ok().filter(|m| m.is_file())?;
            std::fs::read(p).ok()
        }

        fn corrupt_part(&self, rel: &[u8], offset: u64, data: &[u8]) {
            let dir = path(&self.root, parent(rel));
            let tag = Tag::of(&File::open(&dir).unwrap()).unwrap();
            let (tmp, _) = tag.temp_names(file_name(rel));
            let f = std::fs::OpenOptions::new().write(true).open(path(&dir, &tmp)).unwrap();
            f.write_all_at(data, offset).unwrap();
        }

        fn plant_symlink(&self, rel: &[u8], target: &[u8]) {
            use std::os::unix::ffi::OsStrExt;
            std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), path(&self.root, rel)).unwrap();
        }

        fn plant_marker(&self, dir: &[u8]) {
            let dir = path(&self.root, dir);
            let tag = Tag::of(&File::open(&dir).unwrap()).unwrap();
            std::fs::write(path(&dir, &tag.marker()), b"src").unwrap();
        }

        fn outside_untouched(&self) -> bool {
            let mut names: Vec<String> = std::fs::read_dir(&self.top).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
            names.sort();
            names == ["outside", "root"] && std::fs::read(self.top.join("outside/keep")).ok().as_deref() == Some(&b"precious"[..])
        }
    }

    /// A one-chunk part written whole holds no descriptor afterwards; finish (metadata set at
    /// the write) and publish open none. One whose temporary was replaced meanwhile (another
    /// inode under its name) is not finished, nor published.
    #[test]
    fn written_whole_a_part_holds_no_descriptor() {
        let (s, h) = fixture_unconfined();
        let meta = Meta { mode: Some(0o640), mtime: Some((1_600_000_000, 7)) };
        let (p, _) = s.open_part(b"a", &crate::store::conformance::spec(5, 64)).unwrap();
        p.write_whole(b"hello", Some(&meta)).unwrap();
        assert!(p.file.get().is_none(), "no descriptor kept");
        p.finish(&meta).unwrap();
        assert!(p.file.get().is_none(), "none opened by finish");
        p.publish().unwrap();
        assert_eq!(h.read_file(b"a").as_deref(), Some(&b"hello"[..]));
        let (p, _) = s.open_part(b"gone", &crate::store::conformance::spec(4, 64)).unwrap();
        p.write_whole(b"abcd", None).unwrap();
        let tag = Tag::of(&File::open(&h.root).unwrap()).unwrap();
        let tmp = h.root.join(std::ffi::OsStr::from_bytes(&tag.temp_names(b"gone").0));
        // Made while the written one still exists, so never its inode again.
        std::fs::write(h.root.join("other"), b"abcd").unwrap();
        std::fs::rename(h.root.join("other"), &tmp).unwrap();
        assert_eq!(p.finish(&Meta::default()).unwrap_err().message, REPLACED);
        assert!(p.publish().is_err());
    }

    /// Errors name the step that failed, as the receiver reports it.
    #[test]
    fn a_temporary_that_cannot_be_created_says_so() {
        use std::os::unix::fs::PermissionsExt;
        let (s, h) = fixture_unconfined();
        s.mkdir_all(b"ro").unwrap();
        let (p, _) = s.open_part(b"ro/f", &crate::store::conformance::spec(8, 4)).unwrap();
        let (q, _) = s.open_part(b"ro/g", &crate::store::conformance::spec(2, 4)).unwrap();
        std::fs::set_permissions(h.root.join("ro"), std::fs::Permissions::from_mode(0o500)).unwrap();
        if std::fs::write(h.root.join("ro/probe"), b"").is_ok() {
            return; // root: permissions do not apply
        }
        assert_eq!(p.write_at(0, b"abcd").unwrap_err().what, Some("cannot create temporary file"));
        assert_eq!(q.write_whole(b"ab", None).unwrap_err().what, Some("cannot create temporary file"));
        std::fs::set_permissions(h.root.join("ro"), std::fs::Permissions::from_mode(0o700)).unwrap();
    }

    #[test]
    fn beneath_a_daemon_root_links_that_could_leave_it_are_refused() {
        let (confined, h) = fixture_beneath();
        confined.mkdir_all(b"d").unwrap();
        for target in [&b"../.."[..], b"/etc", b"d/../.."] {
            let e = confined.symlink(b"d/l", target, None).unwrap_err();
            assert_eq!(e.kind, Kind::Refused, "{}", String::from_utf8_lossy(target));
            assert!(e.message.contains("--allow-links-out"), "{e}");
        }
        assert!(confined.stat(b"d/l").unwrap().is_none());
        confined.symlink(b"d/l", b"../d", None).unwrap();
        assert!(h.outside_untouched());
        // Without a daemon root (local, ssh, --allow-links-out): the user's own links, as given.
        let (open, _h) = fixture_unconfined();
        open.symlink(b"l", b"/etc", None).unwrap();
        assert_eq!(open.stat(b"l").unwrap().unwrap().kind, EntryType::Symlink);
    }
}
