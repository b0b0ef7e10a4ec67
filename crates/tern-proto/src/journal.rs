//! The resume journal's bytes (`docs/journal.md`): encoding and a parser with no I/O.
//!
//! A journal is read back from the destination directory, where a crash (torn tail), a power
//! loss (stale records) or a local user (anything at all) may have left it. The parser never
//! panics, allocates nothing the header asks for, and returns at most one record per chunk the
//! header's size and chunk size make, each with an index below that count. `tern-engine`
//! (`store/journal.rs`) opens, appends and streams the file through [`Replay`].

use std::collections::BTreeMap;

use crate::chunk::{chunk_count, stripe_hash};

pub const MAGIC: &[u8; 8] = b"TERNJRN1";
/// `MAGIC ‖ u64 size ‖ i64 mtime_s ‖ u32 mtime_ns ‖ u32 chunk_size ‖ 8 check bytes`.
pub const HEADER_LEN: usize = 8 + 8 + 8 + 4 + 4 + 8;
/// `u64 chunk_index ‖ 32-byte chunk hash ‖ 8 check bytes`.
pub const RECORD_LEN: usize = 8 + 32 + 8;

/// One journal record: a chunk index and the hash it verified with.
pub type Verified = (u64, [u8; 32]);
/// A verified chunk as a replay proves it: index, hash, and whether a seal covers it.
pub type Claim = (u64, [u8; 32], bool);

/// The index field of a seal record has this bit set (no chunk index reaches it): the record
/// says a stripe's chunks, recorded before it, are verified against the source's stripe hash
/// and durable (docs/journal.md "Seals").
pub const SEAL_BIT: u64 = 1 << 63;
/// Bytes of the stripe hash a seal keeps (the rest of its hash field holds the stripe's end).
const SEAL_HASH_LEN: usize = 24;

/// What the journal was written for: a different source or chunking invalidates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalHeader {
    pub size: u64,
    pub mtime_s: i64,
    pub mtime_ns: u32,
    pub chunk_size: u32,
}

fn check(bytes: &[u8]) -> [u8; 8] {
    let mut c = [0u8; 8];
    c.copy_from_slice(&blake3::hash(bytes).as_bytes()[..8]);
    c
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

fn be_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_be_bytes(a)
}

impl JournalHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
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

    /// The header at the start of `b`; `None` if it is short, not a journal, corrupt, or has a
    /// chunk size of zero (which no transfer uses and which would make the chunk count
    /// meaningless).
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < HEADER_LEN || &b[..8] != MAGIC || check(&b[..32]) != b[32..40] {
            return None;
        }
        let h = Self { size: be_u64(&b[8..16]), mtime_s: be_u64(&b[16..24]) as i64, mtime_ns: be_u32(&b[24..28]), chunk_size: be_u32(&b[28..32]) };
        (h.chunk_size > 0).then_some(h)
    }

    /// Chunks of the file this journal was written for: every record's index is below it.
    pub fn chunks(&self) -> u64 {
        chunk_count(self.size, self.chunk_size.max(1))
    }
}

pub fn encode_record(index: u64, hash: &[u8; 32]) -> [u8; RECORD_LEN] {
    let mut rec = [0u8; RECORD_LEN];
    rec[..8].copy_from_slice(&index.to_be_bytes());
    rec[8..40].copy_from_slice(hash);
    let c = check(&rec[..40]);
    rec[40..].copy_from_slice(&c);
    rec
}

/// A seal of the stripe of chunks `first..end` whose chunks added up to `stripe_hash`
/// ([`crate::chunk::stripe_hash`]), written after its data was made durable.
pub fn encode_seal(first: u64, end: u64, stripe_hash: &[u8; 32]) -> [u8; RECORD_LEN] {
    assert!(first < end && end < SEAL_BIT, "a seal covers chunks {first}..{end}");
    let mut field = [0u8; 32];
    field[..8].copy_from_slice(&end.to_be_bytes());
    field[8..].copy_from_slice(&stripe_hash[..SEAL_HASH_LEN]);
    encode_record(SEAL_BIT | first, &field)
}

/// One record; `None` if it is short (torn) or its check bytes do not match.
pub fn decode_record(rec: &[u8]) -> Option<Verified> {
    if rec.len() < RECORD_LEN || check(&rec[..40]) != rec[40..RECORD_LEN] {
        return None;
    }
    let mut hash = [0u8; 32];
    hash.copy_from_slice(&rec[8..40]);
    Some((be_u64(&rec[..8]), hash))
}

/// Replays records in file order: the first torn, corrupt or out-of-range record ends the
/// replay (everything before it stands), and a chunk recorded twice (it was re-sent after a
/// resume found its data missing) keeps its latest hash. Memory is bounded by the records fed
/// and by the header's chunk count, whichever is smaller.
///
/// A seal (of a stripe whose every chunk is recorded before it and adds up to the seal's stripe
/// hash) marks those chunks sealed: verified against the source and durable, so resume may
/// trust them without reading them back. A chunk recorded again after its seal is unsealed (its
/// data was written again and is not known durable). A seal that does not add up is ignored.
#[derive(Debug)]
pub struct Replay {
    size: u64,
    chunks: u64,
    /// Hash, and sealed.
    records: BTreeMap<u64, ([u8; 32], bool)>,
    ended: bool,
}

impl Replay {
    pub fn new(header: &JournalHeader) -> Self {
        Self { size: header.size, chunks: header.chunks(), records: BTreeMap::new(), ended: false }
    }

    /// Feeds the next record's bytes; false once the replay has ended (stop feeding).
    pub fn push(&mut self, rec: &[u8]) -> bool {
        if self.ended {
            return false;
        }
        match decode_record(rec) {
            Some((index, hash)) if index < self.chunks => {
                self.records.insert(index, (hash, false));
                true
            }
            Some((seal, field)) if seal & SEAL_BIT != 0 => {
                self.seal(seal & !SEAL_BIT, &field);
                true
            }
            _ => {
                self.ended = true;
                false
            }
        }
    }

    fn seal(&mut self, first: u64, field: &[u8; 32]) {
        let end = u64::from_be_bytes(field[..8].try_into().expect("8 bytes"));
        if first >= end || end > self.chunks {
            return;
        }
        let hashes: Option<Vec<[u8; 32]>> = (first..end).map(|i| self.records.get(&i).map(|(h, _)| *h)).collect();
        let Some(hashes) = hashes else { return };
        if stripe_hash(self.size, first, &hashes)[..SEAL_HASH_LEN] != field[8..] {
            return;
        }
        for (_, (_, sealed)) in self.records.range_mut(first..end) {
            *sealed = true;
        }
    }

    /// The verified chunks, one per index, in index order.
    pub fn finish(self) -> Vec<Verified> {
        self.records.into_iter().map(|(i, (h, _))| (i, h)).collect()
    }

    /// The verified chunks, one per index, in index order, each with whether it is sealed.
    pub fn finish_sealed(self) -> Vec<Claim> {
        self.records.into_iter().map(|(i, (h, s))| (i, h, s)).collect()
    }
}

/// Parses a whole journal file: its header and its records up to the first torn or corrupt one.
/// `None` if the header is unreadable (no usable journal).
pub fn parse_journal(bytes: &[u8]) -> Option<(JournalHeader, Vec<Verified>)> {
    let header = JournalHeader::decode(bytes)?;
    let mut replay = Replay::new(&header);
    for rec in bytes[HEADER_LEN..].chunks(RECORD_LEN) {
        if !replay.push(rec) {
            break;
        }
    }
    Some((header, replay.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: JournalHeader = JournalHeader { size: 3 * 65536 + 1, mtime_s: -5, mtime_ns: 6, chunk_size: 65536 };

    fn journal(records: &[Verified]) -> Vec<u8> {
        let mut b = H.encode().to_vec();
        for (i, h) in records {
            b.extend_from_slice(&encode_record(*i, h));
        }
        b
    }

    #[test]
    fn roundtrip_torn_tail_and_flipped_bit() {
        let mut b = journal(&[(0, [1; 32]), (1, [2; 32])]);
        b.extend_from_slice(&[9; 20]);
        assert_eq!(parse_journal(&b), Some((H, vec![(0, [1; 32]), (1, [2; 32])])));
        b[HEADER_LEN + RECORD_LEN + 3] ^= 1;
        assert_eq!(parse_journal(&b).unwrap().1, vec![(0, [1; 32])]);
        b[3] ^= 1;
        assert_eq!(parse_journal(&b), None);
        assert_eq!(parse_journal(&b[..HEADER_LEN - 1]), None);
    }

    #[test]
    fn records_are_bounded_by_the_chunk_count() {
        assert_eq!(H.chunks(), 4);
        // A record past the last chunk ends the replay, as a corrupt one does.
        let b = journal(&[(3, [1; 32]), (4, [2; 32]), (0, [3; 32])]);
        assert_eq!(parse_journal(&b).unwrap().1, vec![(3, [1; 32])]);
        // Repeats keep the latest hash: at most one record per chunk.
        let b = journal(&[(2, [1; 32]), (0, [2; 32]), (2, [3; 32]), (2, [4; 32])]);
        assert_eq!(parse_journal(&b).unwrap().1, vec![(0, [2; 32]), (2, [4; 32])]);
    }

    #[test]
    fn a_seal_marks_its_recorded_chunks_and_a_later_record_unseals_one() {
        let replay = |b: &[u8]| {
            let mut r = Replay::new(&H);
            for rec in b[HEADER_LEN..].chunks(RECORD_LEN) {
                assert!(r.push(rec), "a seal never ends the replay");
            }
            r.finish_sealed()
        };
        let good = stripe_hash(H.size, 1, &[[2; 32], [3; 32]]);
        let mut b = journal(&[(0, [1; 32]), (1, [2; 32]), (2, [3; 32])]);
        b.extend_from_slice(&encode_seal(1, 3, &good));
        assert_eq!(replay(&b), vec![(0, [1; 32], false), (1, [2; 32], true), (2, [3; 32], true)]);
        assert_eq!(parse_journal(&b).unwrap().1.len(), 3, "a seal is not a chunk");
        let mut again = b.clone();
        again.extend_from_slice(&encode_record(2, &[9; 32]));
        assert_eq!(replay(&again)[1..], [(1, [2; 32], true), (2, [9; 32], false)]);
        // A seal whose chunks add up to another stripe, or that covers an unrecorded chunk, or
        // reaches past the file, seals nothing.
        for seal in [encode_seal(1, 3, &[7; 32]), encode_seal(0, 4, &good), encode_seal(2, 9, &good)] {
            let mut bad = journal(&[(0, [1; 32]), (1, [2; 32]), (2, [3; 32])]);
            bad.extend_from_slice(&seal);
            assert!(replay(&bad).iter().all(|&(_, _, sealed)| !sealed));
        }
        // A seal recorded before its chunks seals nothing either: it speaks of what precedes it.
        let mut early = H.encode().to_vec();
        early.extend_from_slice(&encode_seal(1, 3, &good));
        early.extend_from_slice(&encode_record(1, &[2; 32]));
        early.extend_from_slice(&encode_record(2, &[3; 32]));
        assert!(replay(&early).iter().all(|&(_, _, sealed)| !sealed));
    }

    #[test]
    fn a_zero_chunk_size_is_no_journal() {
        let h = JournalHeader { chunk_size: 0, ..H };
        assert_eq!(JournalHeader::decode(&h.encode()), None);
        // A header claiming an enormous file allocates nothing for it.
        let h = JournalHeader { size: u64::MAX, chunk_size: 1, ..H };
        assert_eq!(parse_journal(&h.encode()), Some((h, vec![])));
    }
}
