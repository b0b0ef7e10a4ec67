//! Bytes on the wire: the control channel's framing, TLS and sealed data streams, the session
//! handshake, socket tuning, rate limiting, the daemon's dial policy and ssh connection reuse.
//! Knows nothing of files: imports neither `store` nor `driver`, `client` or `server`.

pub mod control;
pub mod datastream;
pub mod dial;
pub mod handshake;
pub mod probe;
pub mod ratelimit;
pub mod seal;
pub(crate) mod sshmux;
pub mod transport;
