//! Path tests: `tern test DEST` (docs/protocol.md "Path tests"). The client measures the round
//! trip to the data port, memory→memory throughput over real data streams (framed, hashed and
//! sealed as a transfer's) with one stream and with tern's count, and asks the server for its
//! destination write rate and its hash and seal rates per core; the local side's source read
//! rate and its own hash and seal rates are measured here too. Judging the numbers is the
//! CLI's (a pure function, like `tern doctor`'s findings).
//!
//! The server side treats every request as hostile: the decoder bounds streams, step lengths
//! and chunk sizes; here the session is held to 64 steps and 60 s, one test runs at a time per
//! process, a daemon may refuse all (`tern serve --no-tests`), and the write test's scratch file
//! is created `O_EXCL` in tern's own namespace of a directory opened beneath the root, at most
//! 4 GiB, and removed whatever happens.
//!
//! Files, by the engine's dependency rules (ARCHITECTURE.md): `net/probe.rs` the data plane
//! (chunk frames sent and drained, CPU rates, a connected control channel); `store/probe.rs`
//! the scratch file, striped writes and the source read test; `server/probe.rs` the server's
//! answer and the in-process server of a local path's self-test; `client/probe.rs` the asking
//! side; this file the types they share.

use std::time::Duration;

/// Most steps one test session may ask for.
pub const MAX_STEPS: usize = 64;
/// A test session's time from `Ready` to its last answer.
pub const MAX_SESSION: Duration = Duration::from_secs(60);
/// The write test's scratch file stops growing here.
pub const MAX_SCRATCH: u64 = 4 << 30;

/// Bytes in a time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rate {
    pub bytes: u64,
    pub secs: f64,
}

impl Rate {
    pub fn new(bytes: u64, took: Duration) -> Self {
        Self { bytes, secs: took.as_secs_f64() }
    }
    /// Gigabits per second (0 if nothing was timed).
    pub fn gbps(&self) -> f64 {
        if self.secs > 0.0 { self.bytes as f64 * 8.0 / self.secs / 1e9 } else { 0.0 }
    }
}

/// A measurement, or why it was not made.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Measured(Rate),
    Skipped(String),
    /// `TestWhat::Cpu`'s answer: usable cores × 1000, the CPU time the last carry used, and
    /// where the usable cores come from.
    Cpu {
        millicores: u64,
        carry_cpu: Duration,
        how: String,
    },
}
