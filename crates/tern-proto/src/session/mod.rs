//! The transfer decisions, as machines without I/O (quinn-proto's shape).
//!
//! A driver (in `tern-engine`) feeds a machine what happened — a control message, a chunk that
//! was stored and verified, a store's answer, a failure with its kind — and executes the
//! [`receiver::Action`]s it polls out: set up a file's part, ask for chunks, finalize, publish,
//! report; on the other side, the [`sender::Action`]s: read and send (or only hash) a chunk,
//! send a file's end, report a file done, skipped or failed, finish. The machine never touches a file, a socket or a clock, so unit tests and the
//! deterministic simulation (`sim.rs`, test-only) drive it exactly as the engine does, a
//! thousand times faster than processes and with every fault reproducible from a seed.

pub mod receiver;
pub mod sender;
#[cfg(test)]
mod sim;

/// Why a store operation failed, as far as a decision depends on it. The wording for people
/// travels beside it as text; decisions read only this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trouble {
    /// The destination is full: every later file would fail the same way, so the session stops.
    NoSpace,
    /// Out of descriptors, memory or threads: a limit of the process, not a fault of the file.
    ResourceLimit,
    /// Every chunk verified but the whole-file hash did not (a journal from an older version of
    /// the source, or storage that corrupted data at rest): the file starts over once.
    WholeFileMismatch,
    /// Anything else: this file fails, the others go on.
    Other,
}
