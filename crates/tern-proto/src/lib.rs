//! The tern wire protocol, with no I/O and no clock.
//!
//! Everything here is deterministic: callers feed bytes in and get frames, messages and decisions
//! out. Sockets, files and threads live in `tern-engine`. The format is specified in
//! `docs/protocol.md`; every length read from the wire is checked against a bound in [`limits`]
//! before anything is allocated.

pub mod auth;
pub mod chunk;
pub mod data;
pub mod filter;
pub mod frame;
pub mod glob;
pub mod journal;
pub mod msg;
pub mod path;
pub mod ramp;
pub mod session;
pub mod wire;

pub use frame::{FrameDecoder, FrameHeader};
pub use msg::{Control, Entry, EntryKind, FsEntry, FsKind, FsOp, Options, Side, TestWhat};

/// Version of the protocol this build speaks. Peers negotiate the highest common version.
pub const PROTOCOL_VERSION: u16 = 1;
/// Oldest version this build still accepts.
pub const MIN_PROTOCOL_VERSION: u16 = 1;

/// Bounds on everything that comes off the wire.
pub mod limits {
    /// Largest control frame (type byte + body).
    pub const MAX_CONTROL_FRAME: u32 = 1 << 20;
    /// Largest chunk a peer may negotiate.
    pub const MAX_CHUNK_SIZE: u32 = 64 << 20;
    /// Smallest chunk a peer may negotiate (keeps chunk counts bounded for huge files).
    pub const MIN_CHUNK_SIZE: u32 = 64 << 10;
    /// Bytes of a data frame besides the payload (header fields and tag), upper bound.
    pub const MAX_DATA_OVERHEAD: u32 = 128;
    /// Longest relative path or symlink target.
    pub const MAX_PATH: usize = 4096;
    /// Longest human-readable message.
    pub const MAX_MESSAGE: usize = 1024;
    /// Most items in any list inside one message.
    pub const MAX_LIST: usize = 4096;
    /// Longest hook name (`tern serve --hook NAME=CMD`).
    pub const MAX_HOOK_NAME: usize = 64;
    /// Most data streams in one session.
    pub const MAX_STREAMS: u16 = 256;
}

/// A protocol violation by the peer. Always fatal for the connection.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtoError {
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge { len: u32, max: u32 },
    #[error("empty frame")]
    EmptyFrame,
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    #[error("truncated {0}")]
    Truncated(&'static str),
    #[error("{what} of {len} exceeds the limit of {max}")]
    TooLong { what: &'static str, len: usize, max: usize },
    #[error("{0} bytes left over after the message")]
    TrailingBytes(usize),
    #[error("invalid {what}: {why}")]
    Invalid { what: &'static str, why: &'static str },
    #[error("not a tern peer (bad magic)")]
    BadMagic,
    #[error("no common protocol version: we speak {ours_min}..={ours_max}, peer {theirs_min}..={theirs_max}")]
    VersionMismatch { ours_min: u16, ours_max: u16, theirs_min: u16, theirs_max: u16 },
}

#[cfg(test)]
mod fuzzish {
    //! Arbitrary bytes through the decoders must give errors, never panics or huge allocations.
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn control_decode_never_panics(t in 0u8..40, body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Control::decode(t, &body);
        }

        /// Rules come from the wire: any pattern compiles or is refused, and matching any path
        /// (bytes, not UTF-8) decides without panicking.
        #[test]
        fn filters_never_panic(patterns in proptest::collection::vec("[-+] [a-z*?/\\[\\]!{},.]{0,12}", 0..6), path in proptest::collection::vec(any::<u8>(), 0..40), dir in any::<bool>()) {
            let rules: Vec<_> = patterns.iter().filter_map(|p| filter::FilterRule::parse(p).ok()).collect();
            if let Ok(f) = filter::Filter::new(&rules) {
                let _ = f.excludes(&path, dir);
            }
        }

        /// A pattern with a `/` (or `**`) matches when a suffix of the path that starts at a
        /// component boundary does: one `**/PATTERN` match decides the same as trying each.
        #[test]
        fn path_patterns_decide_as_suffix_matching(pattern in "[ab*?/{},]{1,8}", path in "[ab/]{0,12}") {
            let pattern = pattern.trim_start_matches('/').to_string();
            let Ok(f) = filter::Filter::new(&[filter::FilterRule::exclude(&pattern)]) else { return Ok(()) };
            let Ok(g) = globset::GlobBuilder::new(pattern.trim_end_matches('/')).literal_separator(true).backslash_escape(true).build() else { return Ok(()) };
            let g = g.compile_matcher();
            let rel = path.as_bytes();
            let whole = pattern.trim_end_matches('/').contains('/') || pattern.contains("**");
            prop_assume!(whole && !rel.is_empty());
            let by_suffix = std::iter::once(rel).chain(rel.iter().enumerate().filter(|&(_, &b)| b == b'/').map(|(i, _)| &rel[i + 1..])).any(|s| g.is_match(std::str::from_utf8(s).unwrap()));
            prop_assert_eq!(f.excludes(rel, true), by_suffix, "{} {}", pattern, path);
        }

        #[test]
        fn frame_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut d = FrameDecoder::new(limits::MAX_CONTROL_FRAME);
            d.push(&bytes);
            while let Ok(Some((t, body))) = d.next_frame() {
                let _ = Control::decode(t, &body);
            }
        }
    }
}
