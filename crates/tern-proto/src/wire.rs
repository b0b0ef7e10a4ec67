//! Bounded big-endian readers and writers for message bodies.

use crate::{ProtoError, limits};

/// Appends big-endian fields to a buffer.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    /// Length-prefixed bytes. Callers keep lengths within the bounds the reader enforces.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(u32::try_from(v.len()).expect("byte string longer than u32"));
        self.raw(v)
    }
}

/// Reads big-endian fields from a body, refusing anything out of bounds.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        if self.buf.len() < n {
            return Err(ProtoError::Truncated(what));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    pub fn u8(&mut self, what: &'static str) -> Result<u8, ProtoError> {
        Ok(self.take(1, what)?[0])
    }
    pub fn u16(&mut self, what: &'static str) -> Result<u16, ProtoError> {
        Ok(u16::from_be_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    pub fn u32(&mut self, what: &'static str) -> Result<u32, ProtoError> {
        Ok(u32::from_be_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    pub fn u64(&mut self, what: &'static str) -> Result<u64, ProtoError> {
        Ok(u64::from_be_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    pub fn i64(&mut self, what: &'static str) -> Result<i64, ProtoError> {
        Ok(i64::from_be_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    pub fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ProtoError> {
        Ok(self.take(N, what)?.try_into().unwrap())
    }
    /// Length-prefixed bytes of at most `max`.
    pub fn bytes(&mut self, what: &'static str, max: usize) -> Result<&'a [u8], ProtoError> {
        let len = self.u32(what)? as usize;
        if len > max {
            return Err(ProtoError::TooLong { what, len, max });
        }
        self.take(len, what)
    }
    /// A list count, bounded by [`limits::MAX_LIST`].
    pub fn count(&mut self, what: &'static str) -> Result<usize, ProtoError> {
        let len = self.u32(what)? as usize;
        if len > limits::MAX_LIST {
            return Err(ProtoError::TooLong { what, len, max: limits::MAX_LIST });
        }
        Ok(len)
    }
    pub fn message(&mut self) -> Result<String, ProtoError> {
        let b = self.bytes("message", limits::MAX_MESSAGE)?;
        Ok(String::from_utf8_lossy(b).into_owned())
    }
    pub fn remaining(&self) -> &'a [u8] {
        self.buf
    }
    /// The body must be consumed exactly: trailing bytes mean the peer and we disagree.
    pub fn finish(self) -> Result<(), ProtoError> {
        if self.buf.is_empty() { Ok(()) } else { Err(ProtoError::TrailingBytes(self.buf.len())) }
    }
}
