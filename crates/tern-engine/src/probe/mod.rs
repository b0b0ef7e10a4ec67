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
//! Files, by the engine's dependency rules (ARCHITECTURE.md): `data.rs` the data plane (chunk
//! frames sent and drained, CPU rates); `storage.rs` the scratch file, striped writes and the
//! source read test; `serve.rs` the server's answer (imports no client code); `client.rs` the
//! asking side (imports no server code); this file the shared types and the loopback wiring.

mod client;
mod data;
mod serve;
mod storage;

use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

pub use client::{PathReport, Plan, chosen_streams, run};
pub use data::cpu_rate;
pub use serve::refuse_tests;
pub(crate) use serve::{Request, Served, serve};
pub use storage::{ReadTest, read_test};

use crate::control::{CtrlReader, CtrlWriter};
use crate::error::TransferError;
use crate::progress::Progress;
use crate::transport::random;

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
}

/// A server for a local path's self-test, in this process on loopback (the same code as
/// `tern _remote`, over a socket pair): the control channel's reader and writer, the session
/// key, the server's feature bits and its thread. Here at the module's root because it joins
/// the serving and the asking side (client code imports no server code).
#[allow(clippy::type_complexity)]
fn loopback() -> Result<(CtrlReader, CtrlWriter, [u8; 32], u64, thread::JoinHandle<()>), TransferError> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(crate::control::net_err)?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(crate::control::net_err)?;
    let addr = listener.local_addr().map_err(crate::control::net_err)?.to_string();
    let (tx, rx) = crossbeam_channel::bounded(64);
    thread::spawn(move || crate::server::accept_data_streams(listener, tx));
    let secret = random::<32>();
    let key = tern_proto::auth::token_key(&secret);
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let server = thread::spawn(move || {
        let Ok(halves) = crate::transport::ControlHalves::from_unix(theirs) else { return };
        let hooks = crate::hook::Hooks::default();
        let roots = crate::server::Roots::Home(cwd);
        let served = crate::server::ServedSession {
            exporter: [0; 32],
            secret_key: key,
            roots: &roots,
            session_id: random(),
            data_addr: addr,
            announce: crate::handshake::Announce::No,
            reverse_to: None,
            progress: Arc::new(Progress::default()),
            hooks: &hooks,
            daemon: None,
        };
        if let Err(e) = crate::server::serve_session(halves, rx, served) {
            tracing::debug!("loopback path test server: {e}");
        }
    });
    let halves = crate::transport::ControlHalves::from_unix(ours).map_err(crate::control::net_err)?;
    let mut reader = CtrlReader::new(halves.reader);
    let writer = CtrlWriter::new(halves.writer);
    let (session_key, _, features) = crate::handshake::client(&mut reader, &writer, &key, &[0; 32], "loopback", true, None)?;
    Ok((reader, writer, session_key, features, server))
}
