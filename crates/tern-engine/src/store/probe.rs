//! Storage in a path test: the scratch file in tern's own namespace, striped writes made durable, the source read test.

use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::thread;
use std::time::{Duration, Instant};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};

use crate::error::err_text;
use crate::probe::Rate;

/// A scratch file in tern's own namespace of the directory `dir` (`.tern.TAG.test.R`), removed
/// when dropped.
pub(crate) struct Scratch {
    pub(crate) dir: OwnedFd,
    pub(crate) name: Vec<u8>,
    pub(crate) file: std::fs::File,
}

impl Scratch {
    pub(crate) fn create(dir: OwnedFd) -> std::io::Result<Self> {
        let tag = crate::store::fsops::Tag::of(&dir)?;
        let marker = tag.marker();
        let prefix = &marker[..marker.len() - b"incomplete".len()];
        let mut r = [0u8; 8];
        getrandom::fill(&mut r).expect("OS random source");
        let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
        let name = [prefix, b"test.", hex.as_bytes()].concat();
        let fd = rfs::openat(&dir, &name[..], OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::from_raw_mode(0o600))?;
        Ok(Self { dir, name, file: std::fs::File::from(fd) })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = rfs::unlinkat(&self.dir, &self.name[..], AtFlags::empty());
    }
}

/// Bytes that do not compress: a file system that compresses zeros would flatter the writers.
fn pattern(len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    blake3::Hasher::new().update(b"tern path test").finalize_xof().fill(&mut buf);
    buf
}

/// `writers` threads write `file` in `chunk` pieces, each taking the next chunk index (a
/// transfer's striping), until `millis` or `max` bytes; then `fdatasync`. The time includes it.
pub(crate) fn write_striped(file: &std::fs::File, writers: u16, chunk: u32, millis: u32, max: u64) -> std::io::Result<Rate> {
    let buf = pattern(chunk as usize);
    let next = AtomicU64::new(0);
    let start = Instant::now();
    let until = start + Duration::from_millis(millis as u64);
    let written: std::io::Result<u64> = thread::scope(|s| {
        let hs: Vec<_> = (0..writers)
            .map(|_| {
                crate::threads::spawn_scoped(s, "tern-probe-write", || -> std::io::Result<u64> {
                    let mut n = 0u64;
                    while Instant::now() < until {
                        let off = next.fetch_add(1, Relaxed) * chunk as u64;
                        if off + chunk as u64 > max {
                            break;
                        }
                        file.write_all_at(&buf, off)?;
                        n += chunk as u64;
                    }
                    Ok(n)
                })
            })
            .collect();
        // A writer the system would not start fails the measurement; it never panics.
        hs.into_iter().map(|h| h.and_then(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("writer panicked"))))).sum()
    });
    let written = written?;
    file.sync_data()?;
    Ok(Rate::new(written, start.elapsed()))
}

/// The one line a skipped write test gets.
pub(crate) fn write_skip(path: &Path, e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => format!("{}: no space for a scratch file ({})", path.display(), err_text(e)),
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => format!("{}: not writable ({})", path.display(), err_text(e)),
        Some(libc::EXDEV) => format!("{}: leaves the daemon's root through a symlink; refused", path.display()),
        _ => format!("{}: {}", path.display(), err_text(e)),
    }
}

/// Where the source read test reads, and whether its caches may be warm.
#[derive(Clone, Debug)]
pub struct ReadTest {
    pub file: PathBuf,
    /// A scratch file tern wrote just before (its pages are likely cached), or a real file
    /// smaller than what the test read (read again from cache).
    pub warm: bool,
    pub one: Rate,
    pub many: Rate,
    pub readers: u16,
    /// `file` is the directory a scratch file was written in (and removed from).
    pub scratch: bool,
}

/// The source read test: 1 and `readers` readers in `chunk` pieces striped as a transfer's
/// sender reads, each for `millis`. `source`: a file (or a directory: its largest file) to read;
/// none: a scratch file of 256 MiB written in the temporary directory first and removed after.
pub fn read_test(source: Option<&Path>, readers: u16, chunk: u32, millis: u32) -> Result<ReadTest, String> {
    let mut scratch = None;
    let (file, size, mut warm) = match source {
        Some(p) => {
            let f = largest_file(p).map_err(|e| format!("{}: {}", p.display(), err_text(&e)))?;
            let size = std::fs::metadata(&f).map_err(|e| format!("{}: {}", f.display(), err_text(&e)))?.len();
            if size == 0 {
                return Err(format!("{}: empty; name a larger file with --source", f.display()));
            }
            (f, size, false)
        }
        None => {
            let dir = std::env::temp_dir();
            let fd = crate::store::fsops::open_dir(None, &dir).map_err(|e| format!("{}: {}", dir.display(), err_text(&e)))?;
            let s = Scratch::create(fd).map_err(|e| format!("{}: {}", dir.display(), err_text(&e)))?;
            let size = 256u64 << 20;
            write_striped(&s.file, 1, chunk, 60_000, size).map_err(|e| format!("{}: cannot write a scratch file: {}", dir.display(), err_text(&e)))?;
            scratch = Some(s);
            (dir, size, true)
        }
    };
    let is_scratch = scratch.is_some();
    let f = match &scratch {
        Some(s) => s.file.try_clone(),
        None => std::fs::File::open(&file),
    }
    .map_err(|e| format!("{}: {}", file.display(), err_text(&e)))?;
    let run = |n: u16| -> Result<Rate, String> {
        let next = AtomicU64::new(0);
        let start = Instant::now();
        let until = start + Duration::from_millis(millis as u64);
        let chunks = size.div_ceil(chunk as u64);
        let bytes: u64 = thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|_| {
                    crate::threads::spawn_scoped(s, "tern-probe-read", || {
                        let mut buf = vec![0u8; chunk as usize];
                        let mut got = 0u64;
                        while Instant::now() < until {
                            let i = next.fetch_add(1, Relaxed) % chunks;
                            match f.read_at(&mut buf, i * chunk as u64) {
                                Ok(k) => got += k as u64,
                                Err(_) => break,
                            }
                        }
                        got
                    })
                })
                .collect();
            // A reader the system would not start reads nothing; the others still measure.
            hs.into_iter().map(|h| h.ok().and_then(|h| h.join().ok()).unwrap_or(0)).sum()
        });
        Ok(Rate::new(bytes, start.elapsed()))
    };
    let one = run(1)?;
    let many = run(readers)?;
    warm |= one.bytes > size || one.bytes + many.bytes > size;
    drop(scratch);
    Ok(ReadTest { file, warm, one, many, readers, scratch: is_scratch })
}

/// `p` itself, or the largest regular file directly in directory `p` (the first 10,000 entries).
fn largest_file(p: &Path) -> std::io::Result<PathBuf> {
    let md = std::fs::metadata(p)?;
    if !md.is_dir() {
        return Ok(p.to_path_buf());
    }
    let mut best: Option<(u64, PathBuf)> = None;
    for e in std::fs::read_dir(p)?.take(10_000).flatten() {
        if let Ok(m) = e.metadata()
            && m.is_file()
            && best.as_ref().is_none_or(|b| m.len() > b.0)
        {
            best = Some((m.len(), e.path()));
        }
    }
    best.map(|b| b.1).ok_or_else(|| std::io::Error::other("no regular file in this directory; name one with --source"))
}
