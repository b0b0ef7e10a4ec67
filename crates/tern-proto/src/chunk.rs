//! How files are cut into chunks, which chunks a receiver holds, and the whole-file hash.

use crate::ProtoError;

/// Number of chunks of a file. An empty file is one empty chunk, so every file has at least one.
pub fn chunk_count(size: u64, chunk_size: u32) -> u64 {
    size.div_ceil(chunk_size as u64).max(1)
}

/// Offset and length of chunk `index`.
pub fn chunk_range(size: u64, chunk_size: u32, index: u64) -> (u64, u32) {
    let offset = index * chunk_size as u64;
    let len = size.saturating_sub(offset).min(chunk_size as u64) as u32;
    (offset, len)
}

/// BLAKE3 over the chunk hashes in index order, bound to the size: the file's identity.
pub fn file_hash<'a>(size: u64, chunk_hashes: impl IntoIterator<Item = &'a [u8; 32]>) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key("tern file hash v1");
    h.update(&size.to_be_bytes());
    for c in chunk_hashes {
        h.update(c);
    }
    *h.finalize().as_bytes()
}

/// The chunks `first..end` that the byte range `start..end` of a `size`-byte file covers, if it
/// is a stripe of it (`Entry::stripe`): whole chunks (the last may end where the file does),
/// not empty, inside the file. `Ok(None)`: the range is the whole file, which moves and lands as
/// a file. `Err`: it is not a stripe of this file (a peer's bug, or the file changed).
pub fn stripe_chunks(start: u64, end: u64, size: u64, chunk_size: u32) -> Result<Option<(u64, u64)>, NotAStripe> {
    let cs = u64::from(chunk_size.max(1));
    if start >= end || end > size || !start.is_multiple_of(cs) || (!end.is_multiple_of(cs) && end != size) {
        return Err(NotAStripe);
    }
    Ok((start > 0 || end < size).then(|| (start / cs, end.div_ceil(cs))))
}

/// A byte range that is not a stripe of the file ([`stripe_chunks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAStripe;

/// What a sender's `FileEnd` carries for a stripe (chunks `first..` of a file of `size`
/// bytes): the receiver checks the stripe's chunks against it as it checks a whole file's
/// against [`file_hash`]. Keyed apart from it, so one can never pass for the other.
pub fn stripe_hash<'a>(size: u64, first: u64, chunk_hashes: impl IntoIterator<Item = &'a [u8; 32]>) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key("tern stripe hash v1");
    h.update(&size.to_be_bytes());
    h.update(&first.to_be_bytes());
    for c in chunk_hashes {
        h.update(c);
    }
    *h.finalize().as_bytes()
}

/// A set of chunk indices, as a bitmap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkSet {
    bits: Vec<u64>,
    len: u64,
    count: u64,
}

impl ChunkSet {
    pub fn new(len: u64) -> Self {
        Self { bits: vec![0; len.div_ceil(64) as usize], len, count: 0 }
    }
    pub fn len(&self) -> u64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn count(&self) -> u64 {
        self.count
    }
    pub fn is_full(&self) -> bool {
        self.count == self.len
    }
    pub fn contains(&self, i: u64) -> bool {
        i < self.len && self.bits[(i / 64) as usize] & (1 << (i % 64)) != 0
    }
    /// Adds `i`; returns false if it was already there.
    pub fn insert(&mut self, i: u64) -> bool {
        assert!(i < self.len, "chunk index {i} out of {}", self.len);
        let word = &mut self.bits[(i / 64) as usize];
        let mask = 1 << (i % 64);
        if *word & mask != 0 {
            return false;
        }
        *word |= mask;
        self.count += 1;
        true
    }
    pub fn remove(&mut self, i: u64) {
        if self.contains(i) {
            self.bits[(i / 64) as usize] &= !(1 << (i % 64));
            self.count -= 1;
        }
    }
    /// Runs of indices not in the set, as (start, count), each count ≤ `max_run`.
    pub fn missing_ranges(&self, max_run: u32) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.len {
            if self.contains(i) {
                i += 1;
                continue;
            }
            let start = i;
            while i < self.len && !self.contains(i) && i - start < max_run as u64 {
                i += 1;
            }
            out.push((start, (i - start) as u32));
        }
        out
    }
}

/// Checks that wanted ranges lie inside a file of `chunks` chunks and returns the total count.
pub fn validate_ranges(ranges: &[(u64, u32)], chunks: u64) -> Result<u64, ProtoError> {
    let mut total = 0u64;
    for &(start, count) in ranges {
        let end = start.checked_add(count as u64).ok_or(ProtoError::Invalid { what: "range", why: "overflow" })?;
        if count == 0 || end > chunks {
            return Err(ProtoError::Invalid { what: "range", why: "outside the file" });
        }
        total += count as u64;
    }
    Ok(total)
}

/// The receiver's view of one file being assembled from verified chunks.
#[derive(Debug)]
pub struct Assembly {
    pub size: u64,
    pub chunk_size: u32,
    verified: ChunkSet,
    hashes: Vec<[u8; 32]>,
    expected: Option<[u8; 32]>,
    /// The chunks this session moves: all of them, or a stripe's (`Entry::stripe`).
    want: std::ops::Range<u64>,
    /// Chunks of `want` verified.
    verified_wanted: u64,
}

/// Why an assembled file cannot be accepted.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum AssemblyError {
    #[error("chunk {index} hash does not match the data")]
    ChunkMismatch { index: u64 },
    #[error("whole-file hash does not match the source's")]
    FileMismatch,
    #[error("chunk index {index} out of range")]
    OutOfRange { index: u64 },
}

impl Assembly {
    pub fn new(size: u64, chunk_size: u32) -> Self {
        let n = chunk_count(size, chunk_size);
        Self { size, chunk_size, verified: ChunkSet::new(n), hashes: vec![[0; 32]; n as usize], expected: None, want: 0..n, verified_wanted: 0 }
    }
    /// Only chunks `want` of the file are assembled here (a stripe): the rest belong to other
    /// sessions, and the check is [`stripe_hash`]'s.
    pub fn stripe(size: u64, chunk_size: u32, want: std::ops::Range<u64>) -> Self {
        let mut a = Self::new(size, chunk_size);
        assert!(want.start < want.end && want.end <= a.chunks(), "stripe {want:?} of a {}-chunk file", a.chunks());
        a.want = want;
        a
    }
    /// The chunks this session moves.
    pub fn wanted(&self) -> std::ops::Range<u64> {
        self.want.clone()
    }
    pub fn is_stripe(&self) -> bool {
        self.want != (0..self.chunks())
    }
    /// Runs of wanted chunks not yet verified, as `(start, count)` of at most `max` chunks.
    pub fn missing_ranges(&self, max: u32) -> Vec<(u64, u32)> {
        let (lo, hi) = (self.want.start, self.want.end);
        let mut out = Vec::new();
        for (start, count) in self.verified.missing_ranges(max) {
            let (s, e) = (start.max(lo), (start + u64::from(count)).min(hi));
            if s < e {
                out.push((s, (e - s) as u32));
            }
        }
        out
    }
    pub fn chunks(&self) -> u64 {
        self.verified.len()
    }
    pub fn verified(&self) -> &ChunkSet {
        &self.verified
    }
    /// Records a chunk whose data hashed to `hash` (already compared with the sender's hash).
    /// Returns false if it was already recorded (a duplicate delivery): the first stays, as
    /// its data is what the store holds.
    pub fn record(&mut self, index: u64, hash: [u8; 32]) -> Result<bool, AssemblyError> {
        if index >= self.chunks() {
            return Err(AssemblyError::OutOfRange { index });
        }
        if self.verified.contains(index) {
            return Ok(false);
        }
        self.hashes[index as usize] = hash;
        let new = self.verified.insert(index);
        if new && self.want.contains(&index) {
            self.verified_wanted += 1;
        }
        Ok(new)
    }
    /// Forgets a chunk (its data turned out bad on re-read).
    pub fn forget(&mut self, index: u64) {
        if self.verified.contains(index) && self.want.contains(&index) {
            self.verified_wanted -= 1;
        }
        self.verified.remove(index);
    }
    /// The sender's whole-file hash, from `FileEnd` (or the single chunk's hash).
    pub fn set_expected(&mut self, hash: [u8; 32]) {
        self.expected = Some(hash);
    }
    pub fn has_expected(&self) -> bool {
        self.expected.is_some()
    }
    /// True when every wanted chunk is verified and the sender's hash is known.
    pub fn is_ready(&self) -> bool {
        self.verified_wanted == self.want.end - self.want.start && self.expected.is_some()
    }
    pub fn hash_of(&self, index: u64) -> Option<&[u8; 32]> {
        self.verified.contains(index).then(|| &self.hashes[index as usize])
    }
    /// Final check before the file may be renamed into place.
    pub fn verify(&self) -> Result<(), AssemblyError> {
        assert!(self.is_ready(), "verify called before every chunk arrived");
        let have = if self.is_stripe() { stripe_hash(self.size, self.want.start, &self.hashes[self.want.start as usize..self.want.end as usize]) } else { file_hash(self.size, &self.hashes) };
        if Some(have) == self.expected { Ok(()) } else { Err(AssemblyError::FileMismatch) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_are_whole_chunks_of_a_part_of_the_file() {
        assert_eq!(stripe_chunks(8, 16, 20, 4), Ok(Some((2, 4))));
        assert_eq!(stripe_chunks(16, 20, 22, 4), Ok(Some((4, 5))));
        assert_eq!(stripe_chunks(16, 22, 22, 4), Ok(Some((4, 6))), "the last chunk ends where the file does");
        assert_eq!(stripe_chunks(0, 22, 22, 4), Ok(None), "the whole file");
        for (start, end) in [(2, 8), (8, 10), (8, 8), (12, 8), (16, 24)] {
            assert_eq!(stripe_chunks(start, end, 22, 4), Err(NotAStripe), "{start}..{end}");
        }
    }

    #[test]
    fn chunk_math() {
        assert_eq!(chunk_count(0, 4), 1);
        assert_eq!(chunk_count(4, 4), 1);
        assert_eq!(chunk_count(5, 4), 2);
        assert_eq!(chunk_range(10, 4, 2), (8, 2));
        assert_eq!(chunk_range(0, 4, 0), (0, 0));
    }

    #[test]
    fn missing_ranges_split_runs() {
        let mut s = ChunkSet::new(10);
        s.insert(2);
        s.insert(3);
        s.insert(9);
        assert_eq!(s.missing_ranges(100), vec![(0, 2), (4, 5)]);
        assert_eq!(s.missing_ranges(2), vec![(0, 2), (4, 2), (6, 2), (8, 1)]);
        assert!(!s.insert(2));
        assert_eq!(s.count(), 3);
    }

    #[test]
    fn assembly_accepts_only_matching_file_hash() {
        let h = |b: u8| *blake3::hash(&[b]).as_bytes();
        let mut a = Assembly::new(10, 4);
        for i in 0..3 {
            a.record(i, h(i as u8)).unwrap();
        }
        assert!(!a.is_ready());
        a.set_expected(file_hash(10, &[h(0), h(1), h(2)]));
        assert!(a.is_ready());
        a.verify().unwrap();
        assert_eq!(a.record(1, h(9)), Ok(false), "a duplicate does not replace the verified chunk");
        a.verify().unwrap();
        a.set_expected(file_hash(10, &[h(0), h(9), h(2)]));
        assert_eq!(a.verify(), Err(AssemblyError::FileMismatch));
        assert!(a.record(3, h(0)).is_err());
    }

    #[test]
    fn ranges_are_bounded() {
        assert_eq!(validate_ranges(&[(0, 2), (5, 1)], 6), Ok(3));
        assert!(validate_ranges(&[(5, 2)], 6).is_err());
        assert!(validate_ranges(&[(u64::MAX, 2)], 6).is_err());
        assert!(validate_ranges(&[(0, 0)], 6).is_err());
    }
}
