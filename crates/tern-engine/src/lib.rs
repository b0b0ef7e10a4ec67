//! tern's transfer engine: everything between the protocol core and the command line.
//!
//! A session has one control channel and N data streams. [`sender::Sending`] walks the source
//! and serves wanted chunks; [`receiver::Receiving`] decides what it needs, verifies, writes and
//! renames. [`session`] sets both up over ssh, a daemon or in-process, and retries with resume.

pub mod bootstrap;
pub mod control;
pub mod datastream;
pub mod dial;
pub mod endpoint;
pub mod error;
pub mod faults;
pub mod fsops;
pub mod handshake;
pub mod hashing;
pub mod hook;
pub mod journal;
pub mod layout;
pub mod limits;
pub mod probe;
pub mod progress;
pub mod ratelimit;
pub mod receiver;
pub mod relay;
pub mod remote_fs;
pub mod seal;
pub mod sender;
pub mod server;
pub mod session;
pub mod sshmux;
pub(crate) mod store;
pub mod transport;
pub mod walk;
