//! Whole-file hashing by chunks, the same function on both ends.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use tern_proto::chunk::{chunk_count, chunk_range, file_hash};

use super::SourceFile;
use crate::faults::chunk_hash;

/// Hashes chunks `[0, count)` of an open file: one hash per chunk.
pub(crate) fn chunk_hashes(file: &File, size: u64, chunk_size: u32) -> io::Result<Vec<[u8; 32]>> {
    let mut buf = vec![0u8; chunk_size as usize];
    (0..chunk_count(size, chunk_size))
        .map(|i| {
            let (off, len) = chunk_range(size, chunk_size, i);
            file.read_exact_at(&mut buf[..len as usize], off)?;
            Ok(chunk_hash(&buf[..len as usize]))
        })
        .collect()
}

/// The file hash tern compares end to end (see `tern_proto::chunk::file_hash`).
pub(crate) fn hash_file(file: &File, size: u64, chunk_size: u32) -> io::Result<[u8; 32]> {
    Ok(file_hash(size, &chunk_hashes(file, size, chunk_size)?))
}

/// `hash_file` of a source's file, read through the `Source` interface.
pub(crate) fn hash_source_file(file: &impl SourceFile, size: u64, chunk_size: u32) -> super::Result<[u8; 32]> {
    let mut buf = vec![0u8; chunk_size as usize];
    let hashes = (0..chunk_count(size, chunk_size))
        .map(|i| {
            let (off, len) = chunk_range(size, chunk_size, i);
            file.read_at(off, &mut buf[..len as usize])?;
            Ok(chunk_hash(&buf[..len as usize]))
        })
        .collect::<super::Result<Vec<_>>>()?;
    Ok(file_hash(size, &hashes))
}

/// True if every byte is zero (such chunks are left as holes at the destination).
pub(crate) fn is_zero(data: &[u8]) -> bool {
    let (head, body, tail) = unsafe { data.align_to::<u128>() };
    head.iter().all(|&b| b == 0) && body.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}
