//! tern's transfer engine: everything between the protocol core and the command line.
//!
//! A session has one control channel and N data streams. [`driver::sender::Sending`] walks the
//! source and serves wanted chunks; [`driver::receiver::Receiving`] decides what it needs,
//! verifies, writes and renames. [`client::session`] sets both up over ssh, a daemon or
//! in-process, and retries with resume; [`server`] is the far end, a daemon or `tern _remote`.
//!
//! The folders are the architecture, and their imports follow rules checked by
//! `tests/dependency_rules.rs` (ARCHITECTURE.md, "Dependency rules"):
//!
//! - [`store`]: source and destination file I/O; knows nothing of sockets.
//! - [`net`]: bytes on the wire (control channel, data streams, TLS, handshake); knows nothing
//!   of files.
//! - [`driver`]: executes the tern-proto machines' actions and owns the data-plane threads.
//! - [`client`]: the requesting side: local, ssh, daemon, reverse and relay sessions, hook and
//!   file-system requests.
//! - [`server`]: the serving side: the daemon's accept loop, `tern _remote`, hooks.
//! - at the root, cross-cutting: errors, limits, progress, endpoints, fault injection, this
//!   host's tuning facts (`host`), the path tests' shared types (`probe`).

pub mod client;
pub mod driver;
pub mod endpoint;
pub mod error;
pub mod faults;
pub mod host;
pub mod limits;
pub mod net;
pub mod probe;
pub mod progress;
pub mod server;
pub mod store;
pub mod threads;
