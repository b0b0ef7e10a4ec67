//! The requesting side: a session run locally, over ssh (forward or `--reverse`), to a daemon
//! or relayed between two remotes, and the hook and file-system requests. Never imports
//! `server`.

pub mod bootstrap;
pub mod cluster;
pub mod hook;
pub mod probe;
pub(crate) mod relay;
pub mod remote_fs;
pub mod session;
