//! The resume journal of a multi-chunk file: which chunks were verified, with their hashes.
//! Format and durability argument: `docs/journal.md`.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::os::fd::AsFd;

use rustix::fs::{self as rfs, Mode, OFlags};
pub(crate) use tern_proto::journal::{Claim, JournalHeader};
use tern_proto::journal::{HEADER_LEN, RECORD_LEN, Replay, encode_record, encode_seal};

/// Reads up to `buf.len()` bytes; fewer only at the end of the file.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// An open journal, appended to by several stream threads (one `write` per record, `O_APPEND`).
pub(crate) struct Journal {
    file: File,
}

impl Journal {
    /// Starts a fresh journal, replacing any old one.
    pub(crate) fn create(dir: &impl AsFd, name: &[u8], header: &JournalHeader) -> io::Result<Self> {
        let fd = rfs::openat(dir, name, OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::APPEND | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::from_raw_mode(0o600))?;
        let mut file = File::from(fd);
        file.write_all(&header.encode())?;
        Ok(Self { file })
    }

    /// Starts the journal of a part that several sessions share (a file's stripes), if none
    /// exists: `Ok(None)` when another session made it first. `before_header` runs between the
    /// exclusive create and the header: a session that finds the header joins the part, so
    /// whatever must happen before anyone joins (removing a stale temporary) happens there.
    pub(crate) fn create_shared(dir: &impl AsFd, name: &[u8], header: &JournalHeader, before_header: impl FnOnce() -> io::Result<()>) -> io::Result<Option<Self>> {
        let fd = match rfs::openat(dir, name, OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::APPEND | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::from_raw_mode(0o600)) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::EXIST) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut file = File::from(fd);
        before_header()?;
        file.write_all(&header.encode())?;
        Ok(Some(Self { file }))
    }

    /// Reopens an existing journal for appending.
    pub(crate) fn reopen(dir: &impl AsFd, name: &[u8]) -> io::Result<Self> {
        let fd = rfs::openat(dir, name, OFlags::WRONLY | OFlags::APPEND | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
        Ok(Self { file: File::from(fd) })
    }

    pub(crate) fn append(&self, index: u64, hash: &[u8; 32]) -> io::Result<()> {
        (&self.file).write_all(&encode_record(index, hash))
    }

    /// Seals the stripe of chunks `first..end` (docs/journal.md "Seals"): call only once its
    /// chunks are verified against the source's stripe hash and their data is durable.
    pub(crate) fn seal(&self, first: u64, end: u64, stripe_hash: &[u8; 32]) -> io::Result<()> {
        (&self.file).write_all(&encode_seal(first, end, stripe_hash))
    }

    /// Reads a journal: its header and the records up to the first torn or corrupt one.
    /// `None` if there is no journal or its header is unreadable.
    #[cfg(test)]
    pub(crate) fn read(dir: &impl AsFd, name: &[u8]) -> io::Result<Option<(JournalHeader, Vec<tern_proto::journal::Verified>)>> {
        Ok(Self::read_sealed(dir, name)?.map(|(h, claims)| (h, claims.into_iter().map(|(i, hash, _)| (i, hash)).collect())))
    }

    /// [`Journal::read`], each chunk with whether a seal says it is durable and verified.
    pub(crate) fn read_sealed(dir: &impl AsFd, name: &[u8]) -> io::Result<Option<(JournalHeader, Vec<Claim>)>> {
        let fd = match rfs::openat(dir, name, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        // Streamed record by record (`tern_proto::journal::Replay`): a huge file left in the
        // directory costs reading time, never memory beyond one record per chunk.
        let mut r = BufReader::new(File::from(fd));
        let mut head = [0u8; HEADER_LEN];
        if read_full(&mut r, &mut head)? < HEADER_LEN {
            return Ok(None);
        }
        let Some(header) = JournalHeader::decode(&head) else { return Ok(None) };
        let mut replay = Replay::new(&header);
        let mut rec = [0u8; RECORD_LEN];
        loop {
            let n = read_full(&mut r, &mut rec)?;
            if !replay.push(&rec[..n]) || n < RECORD_LEN {
                break;
            }
        }
        Ok(Some((header, replay.finish_sealed())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let d = File::open(dir.path()).unwrap();
        // Three chunks: records past the header's chunk count would end the replay.
        let h = JournalHeader { size: 3 << 16, mtime_s: 5, mtime_ns: 6, chunk_size: 64 << 10 };
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
