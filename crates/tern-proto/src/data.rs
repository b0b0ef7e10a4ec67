//! Frames on data streams: the stream handshake and chunk headers.

use crate::frame::{FrameHeader, HEADER_LEN};
use crate::wire::{Reader, Writer};
use crate::{ProtoError, limits};

pub const DATA_HELLO: u8 = 32;
pub const DATA_ACCEPT: u8 = 33;
pub const CHUNK: u8 = 34;

/// First frame on a data stream, from the connecting side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataHello {
    pub session_id: [u8; 16],
    pub stream: u32,
    pub nonce: [u8; 32],
    pub proof: [u8; 32],
}

impl DataHello {
    pub const BODY_LEN: usize = 16 + 4 + 32 + 32;
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.raw(&FrameHeader::encode(DATA_HELLO, Self::BODY_LEN));
        w.raw(&self.session_id).u32(self.stream).raw(&self.nonce).raw(&self.proof);
        w.buf
    }
    pub fn decode(body: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(body);
        let m = Self { session_id: r.array("session id")?, stream: r.u32("stream")?, nonce: r.array("nonce")?, proof: r.array("proof")? };
        r.finish()?;
        Ok(m)
    }
}

/// The chunk header that precedes the data in a `CHUNK` frame. Fixed size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u8,
    pub file_id: u64,
    pub index: u64,
    pub offset: u64,
    pub hash: [u8; 32],
    /// Keyed BLAKE3 over the sequence number and the fields above; zeros when the stream is TLS.
    pub tag: [u8; 32],
}

/// Flag: the chunk is the whole file (no `FileEnd` follows).
pub const FLAG_WHOLE_FILE: u8 = 1;

impl ChunkHeader {
    pub const LEN: usize = 1 + 8 + 8 + 8 + 32 + 32;
    /// Bytes covered by the tag.
    const TAGGED_LEN: usize = Self::LEN - 32;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..Self::TAGGED_LEN].copy_from_slice(&self.tagged_fields());
        out[Self::TAGGED_LEN..].copy_from_slice(&self.tag);
        out
    }

    fn tagged_fields(&self) -> [u8; Self::TAGGED_LEN] {
        let mut out = [0u8; Self::TAGGED_LEN];
        out[0] = self.flags;
        out[1..9].copy_from_slice(&self.file_id.to_be_bytes());
        out[9..17].copy_from_slice(&self.index.to_be_bytes());
        out[17..25].copy_from_slice(&self.offset.to_be_bytes());
        out[25..57].copy_from_slice(&self.hash);
        out
    }

    pub fn decode(bytes: &[u8; Self::LEN]) -> Self {
        Self {
            flags: bytes[0],
            file_id: u64::from_be_bytes(bytes[1..9].try_into().unwrap()),
            index: u64::from_be_bytes(bytes[9..17].try_into().unwrap()),
            offset: u64::from_be_bytes(bytes[17..25].try_into().unwrap()),
            hash: bytes[25..57].try_into().unwrap(),
            tag: bytes[57..89].try_into().unwrap(),
        }
    }

    /// The tag for this header as the `seq`-th chunk on a stream keyed with `key`.
    pub fn compute_tag(&self, key: &[u8; 32], seq: u64) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(key);
        h.update(&seq.to_be_bytes());
        h.update(&self.tagged_fields());
        *h.finalize().as_bytes()
    }

    /// Frame header for a chunk of `data_len` bytes.
    pub fn frame_header(data_len: usize) -> [u8; HEADER_LEN] {
        FrameHeader::encode(CHUNK, Self::LEN + data_len)
    }
}

/// Largest data-stream frame for a given negotiated chunk size.
pub fn max_data_frame(chunk_size: u32) -> u32 {
    chunk_size.min(limits::MAX_CHUNK_SIZE) + limits::MAX_DATA_OVERHEAD
}

/// Data length of a chunk frame after bounds checks. `trailer` is the AEAD tag length of a
/// sealed stream (0 otherwise).
pub fn chunk_data_len(header: FrameHeader, chunk_size: u32, trailer: usize) -> Result<usize, ProtoError> {
    if header.frame_type != CHUNK {
        return Err(ProtoError::UnknownType(header.frame_type));
    }
    let body = header.body_len as usize;
    if body < ChunkHeader::LEN + trailer {
        return Err(ProtoError::Truncated("chunk header"));
    }
    let data = body - ChunkHeader::LEN - trailer;
    if data > chunk_size as usize {
        return Err(ProtoError::TooLong { what: "chunk", len: data, max: chunk_size as usize });
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_header_roundtrip_and_tag() {
        let h = ChunkHeader { flags: 1, file_id: 7, index: 3, offset: 99, hash: [5; 32], tag: [0; 32] };
        let key = [9u8; 32];
        let tagged = ChunkHeader { tag: h.compute_tag(&key, 4), ..h };
        let back = ChunkHeader::decode(&tagged.encode());
        assert_eq!(back, tagged);
        assert_eq!(back.compute_tag(&key, 4), back.tag);
        assert_ne!(back.compute_tag(&key, 5), back.tag, "replay at another sequence number must fail");
        let moved = ChunkHeader { offset: 100, ..back };
        assert_ne!(moved.compute_tag(&key, 4), back.tag);
    }

    #[test]
    fn chunk_length_is_bounded() {
        let hdr = FrameHeader { frame_type: CHUNK, body_len: (ChunkHeader::LEN + 10) as u32 };
        assert_eq!(chunk_data_len(hdr, 10, 0), Ok(10));
        assert!(chunk_data_len(hdr, 9, 0).is_err());
        assert_eq!(chunk_data_len(hdr, 10, 4), Ok(6));
        let short = FrameHeader { frame_type: CHUNK, body_len: 3 };
        assert!(chunk_data_len(short, 10, 0).is_err());
    }
}
