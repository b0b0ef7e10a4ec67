//! The resume journal of a multi-chunk file: which chunks were verified, with their hashes.
//! Format and durability argument: `docs/journal.md`.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;

use rustix::fs::{self as rfs, Mode, OFlags};

const MAGIC: &[u8; 8] = b"TERNJRN1";
const HEADER_LEN: usize = 8 + 8 + 8 + 4 + 4 + 8;
const RECORD_LEN: usize = 8 + 32 + 8;

/// What the journal was written for: a different source or chunking invalidates it.
/// One journal record: a chunk index and the hash it verified with.
pub type Verified = (u64, [u8; 32]);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalHeader {
    pub size: u64,
    pub mtime_s: i64,
    pub mtime_ns: u32,
    pub chunk_size: u32,
}

fn check(bytes: &[u8]) -> [u8; 8] {
    blake3::hash(bytes).as_bytes()[..8].try_into().unwrap()
}

impl JournalHeader {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..8].copy_from_slice(MAGIC);
        b[8..16].copy_from_slice(&self.size.to_be_bytes());
        b[16..24].copy_from_slice(&self.mtime_s.to_be_bytes());
        b[24..28].copy_from_slice(&self.mtime_ns.to_be_bytes());
        b[28..32].copy_from_slice(&self.chunk_size.to_be_bytes());
        let c = check(&b[..32]);
        b[32..].copy_from_slice(&c);
        b
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < HEADER_LEN || &b[..8] != MAGIC || check(&b[..32]) != b[32..40] {
            return None;
        }
        Some(Self {
            size: u64::from_be_bytes(b[8..16].try_into().unwrap()),
            mtime_s: i64::from_be_bytes(b[16..24].try_into().unwrap()),
            mtime_ns: u32::from_be_bytes(b[24..28].try_into().unwrap()),
            chunk_size: u32::from_be_bytes(b[28..32].try_into().unwrap()),
        })
    }
}

/// An open journal, appended to by several stream threads (one `write` per record, `O_APPEND`).
pub struct Journal {
    file: File,
}

impl Journal {
    /// Starts a fresh journal, replacing any old one.
    pub fn create(dir: &impl AsFd, name: &[u8], header: &JournalHeader) -> io::Result<Self> {
        let fd = rfs::openat(dir, name, OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::APPEND | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::from_raw_mode(0o600))?;
        let mut file = File::from(fd);
        file.write_all(&header.encode())?;
        Ok(Self { file })
    }

    /// Reopens an existing journal for appending.
    pub fn reopen(dir: &impl AsFd, name: &[u8]) -> io::Result<Self> {
        let fd = rfs::openat(dir, name, OFlags::WRONLY | OFlags::APPEND | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
        Ok(Self { file: File::from(fd) })
    }

    pub fn append(&self, index: u64, hash: &[u8; 32]) -> io::Result<()> {
        let mut rec = [0u8; RECORD_LEN];
        rec[..8].copy_from_slice(&index.to_be_bytes());
        rec[8..40].copy_from_slice(hash);
        let c = check(&rec[..40]);
        rec[40..].copy_from_slice(&c);
        (&self.file).write_all(&rec)
    }

    /// Reads a journal: its header and the records up to the first torn or corrupt one.
    /// `None` if there is no journal or its header is unreadable.
    pub fn read(dir: &impl AsFd, name: &[u8]) -> io::Result<Option<(JournalHeader, Vec<Verified>)>> {
        let fd = match rfs::openat(dir, name, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut bytes = Vec::new();
        File::from(fd).read_to_end(&mut bytes)?;
        let Some(header) = JournalHeader::decode(&bytes) else { return Ok(None) };
        let mut records = Vec::new();
        for rec in bytes[HEADER_LEN..].chunks(RECORD_LEN) {
            if rec.len() < RECORD_LEN || check(&rec[..40]) != rec[40..] {
                break;
            }
            records.push((u64::from_be_bytes(rec[..8].try_into().unwrap()), rec[8..40].try_into().unwrap()));
        }
        Ok(Some((header, records)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let d = File::open(dir.path()).unwrap();
        let h = JournalHeader { size: 100, mtime_s: 5, mtime_ns: 6, chunk_size: 64 << 10 };
        let j = Journal::create(&d, b"j", &h).unwrap();
        j.append(0, &[1; 32]).unwrap();
        j.append(1, &[2; 32]).unwrap();
        drop(j);
        // A torn third record.
        let mut f = std::fs::OpenOptions::new().append(true).open(dir.path().join("j")).unwrap();
        f.write_all(&[9; 20]).unwrap();
        let (h2, recs) = Journal::read(&d, b"j").unwrap().unwrap();
        assert_eq!(h2, h);
        assert_eq!(recs, vec![(0, [1; 32]), (1, [2; 32])]);
        // A flipped bit in a record ends the replay there.
        let mut bytes = std::fs::read(dir.path().join("j")).unwrap();
        bytes[HEADER_LEN + RECORD_LEN + 3] ^= 1;
        std::fs::write(dir.path().join("j"), &bytes).unwrap();
        let (_, recs) = Journal::read(&d, b"j").unwrap().unwrap();
        assert_eq!(recs.len(), 1);
        assert!(Journal::read(&d, b"missing").unwrap().is_none());
    }
}
