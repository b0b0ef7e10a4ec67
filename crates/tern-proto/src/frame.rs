//! Length-delimited frames: `u32 length ‖ u8 type ‖ body`, length checked before allocation.

use crate::ProtoError;

/// Bytes before the body: the length and the type.
pub const HEADER_LEN: usize = 5;

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub frame_type: u8,
    /// Body length (excludes the type byte).
    pub body_len: u32,
}

impl FrameHeader {
    /// Parses and bounds-checks a header. `max_frame` bounds type byte + body.
    pub fn parse(bytes: [u8; HEADER_LEN], max_frame: u32) -> Result<Self, ProtoError> {
        let len = u32::from_be_bytes(bytes[..4].try_into().unwrap());
        if len == 0 {
            return Err(ProtoError::EmptyFrame);
        }
        if len > max_frame {
            return Err(ProtoError::FrameTooLarge { len, max: max_frame });
        }
        Ok(Self { frame_type: bytes[4], body_len: len - 1 })
    }

    pub fn encode(frame_type: u8, body_len: usize) -> [u8; HEADER_LEN] {
        let len = u32::try_from(body_len + 1).expect("frame body longer than u32");
        let mut out = [0u8; HEADER_LEN];
        out[..4].copy_from_slice(&len.to_be_bytes());
        out[4] = frame_type;
        out
    }
}

/// Encodes a whole frame into one buffer.
pub fn encode_frame(frame_type: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&FrameHeader::encode(frame_type, body.len()));
    out.extend_from_slice(body);
    out
}

/// Incremental decoder: push bytes in any split, pop whole frames out.
///
/// It never buffers more than one frame beyond what was pushed, and refuses a frame whose
/// declared length is over `max_frame` as soon as the header is seen.
pub struct FrameDecoder {
    buf: Vec<u8>,
    start: usize,
    max_frame: u32,
}

impl FrameDecoder {
    pub fn new(max_frame: u32) -> Self {
        Self { buf: Vec::new(), start: 0, max_frame }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes pushed but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Next complete frame as (type, body), or `None` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<(u8, Vec<u8>)>, ProtoError> {
        let avail = &self.buf[self.start..];
        if avail.len() < HEADER_LEN {
            return Ok(None);
        }
        let header = FrameHeader::parse(avail[..HEADER_LEN].try_into().unwrap(), self.max_frame)?;
        let total = HEADER_LEN + header.body_len as usize;
        if avail.len() < total {
            return Ok(None);
        }
        let body = avail[HEADER_LEN..total].to_vec();
        self.start += total;
        if self.start > (1 << 20) && self.start * 2 > self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        Ok(Some((header.frame_type, body)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_frames_split_at_every_byte() {
        let mut stream = encode_frame(7, b"hello");
        stream.extend(encode_frame(9, b""));
        for split in 0..stream.len() {
            let mut d = FrameDecoder::new(1024);
            d.push(&stream[..split]);
            let mut got = Vec::new();
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
            d.push(&stream[split..]);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
            assert_eq!(got, vec![(7, b"hello".to_vec()), (9, vec![])]);
            assert_eq!(d.buffered(), 0);
        }
    }

    #[test]
    fn refuses_oversized_frame_from_header_alone() {
        let mut d = FrameDecoder::new(100);
        d.push(&FrameHeader::encode(1, 200));
        assert_eq!(d.next_frame(), Err(ProtoError::FrameTooLarge { len: 201, max: 100 }));
    }

    #[test]
    fn refuses_zero_length() {
        let mut d = FrameDecoder::new(100);
        d.push(&[0, 0, 0, 0, 1]);
        assert_eq!(d.next_frame(), Err(ProtoError::EmptyFrame));
    }
}
