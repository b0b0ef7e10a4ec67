//! The serving side: a `tern serve` daemon's accept loop, `tern _remote` started over ssh, the
//! hook registry and the answers to file-system requests. Never imports `client`.

pub mod cluster;
pub mod hook;
pub mod probe;
pub mod remote_fs;
pub mod session;
