//! The control handshake: versions, mutual proof of the shared secret, and the session key.

use tern_proto::auth::{Party, control_proof, proofs_equal, session_key};
use tern_proto::msg::{
    FEATURE_EARLY_DATA_ADDR, FEATURE_FILE_LIST, FEATURE_FILTERS, FEATURE_FS_OPS, FEATURE_HARD_LINKS, FEATURE_IGNORE_EXISTING, FEATURE_STREAM_RESET, FEATURE_THIRD_PARTY, negotiate_version,
};
use tern_proto::{Control, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

use crate::error::{Side, TransferError};
use crate::net::control::{CtrlReader, CtrlWriter};
use crate::net::transport::random;

/// The feature bits this build sends in its `Hello` (tests may pose as an older peer).
pub(crate) fn our_features() -> u64 {
    crate::faults::faults().features.unwrap_or(
        FEATURE_THIRD_PARTY
            | FEATURE_EARLY_DATA_ADDR
            | FEATURE_FILTERS
            | FEATURE_FILE_LIST
            | FEATURE_IGNORE_EXISTING
            | FEATURE_STREAM_RESET
            | FEATURE_HARD_LINKS
            | FEATURE_FS_OPS
            | tern_proto::msg::FEATURE_PATH_TESTS
            | tern_proto::msg::FEATURE_TEST_CPU
            | tern_proto::msg::FEATURE_HOST_FACTS
            | tern_proto::msg::FEATURE_CLUSTER
            | tern_proto::msg::FEATURE_STRIPES
            | tern_proto::msg::FEATURE_EARLY_GO,
    )
}

fn hello(features: u64) -> Control {
    Control::Hello { min_version: MIN_PROTOCOL_VERSION, max_version: PROTOCOL_VERSION, features }
}

/// The peer's feature bits, once the versions intersect.
fn expect_hello(m: Control) -> Result<u64, TransferError> {
    match m {
        Control::Hello { min_version, max_version, features } => negotiate_version((MIN_PROTOCOL_VERSION, PROTOCOL_VERSION), (min_version, max_version))
            .map(|_| features)
            .map_err(|e| TransferError::fatal(Side::Network, format!("{e}; upgrade the older tern"))),
        Control::Fatal { side, message } => Err(TransferError::fatal(side, message)),
        _ => Err(TransferError::fatal(Side::Network, "the peer did not start with a tern hello")),
    }
}

/// Called with the data address of a `Listening` (ssh mode), as soon as it arrives.
pub type OnListening<'a> = Option<&'a mut dyn FnMut(&[u8])>;

/// Client side. `exporter` is the TLS exporter value of the control channel (zeros over ssh).
/// Returns the session key, the round-trip time of the first authentication exchange and the
/// server's feature bits.
///
/// `pipelined` sends the hello and the first authentication message in one flight, saving a
/// round trip; the returned time is then meaningless (the caller timed its TCP connect, or
/// needs no sample). Over ssh the first answer waits for the login, so when the stream count
/// is to be sized the exchanges stay apart: the second one is the only clean round-trip
/// sample the control channel gives.
///
/// `on_listening` gets the data address an ssh-mode server announces between its `Hello` and
/// its `Auth` (`FEATURE_EARLY_DATA_ADDR`), so the caller can start the data streams while
/// authentication runs; without it such a message is read and ignored.
pub fn client(
    r: &mut CtrlReader,
    w: &CtrlWriter,
    key: &[u8; 32],
    exporter: &[u8; 32],
    peer: &str,
    pipelined: bool,
    on_listening: OnListening,
) -> Result<([u8; 32], std::time::Duration, u64), TransferError> {
    client_as(our_features(), r, w, key, exporter, peer, pipelined, on_listening)
}

#[allow(clippy::too_many_arguments)]
fn client_as(
    ours: u64,
    r: &mut CtrlReader,
    w: &CtrlWriter,
    key: &[u8; 32],
    exporter: &[u8; 32],
    peer: &str,
    pipelined: bool,
    mut on_listening: OnListening,
) -> Result<([u8; 32], std::time::Duration, u64), TransferError> {
    let nc = random::<32>();
    w.send(&hello(ours))?;
    if pipelined {
        w.send(&Control::Auth { nonce: nc, proof: [0; 32] })?;
    }
    let features = expect_hello(r.recv()?)?;
    let started = std::time::Instant::now();
    if !pipelined {
        w.send(&Control::Auth { nonce: nc, proof: [0; 32] })?;
    }
    let mut reply = r.recv()?;
    // Only between the server's Hello and its Auth, and only when both sides set the bit;
    // anywhere else it falls through to "unexpected message".
    if features & ours & FEATURE_EARLY_DATA_ADDR != 0
        && let Control::Listening { data_addr } = &reply
    {
        if let Some(f) = on_listening.as_mut() {
            f(data_addr);
        }
        reply = r.recv()?;
    }
    let rtt = started.elapsed();
    let (ns, proof) = match reply {
        Control::Auth { nonce, proof } => (nonce, proof),
        Control::Fatal { side, message } => return Err(TransferError::fatal(side, message)),
        _ => return Err(TransferError::fatal(Side::Network, format!("unexpected message from {peer} during authentication (is it a compatible tern?)"))),
    };
    if !proofs_equal(&proof, &control_proof(key, Party::Server, &nc, &ns, exporter)) {
        return Err(TransferError::fatal(Side::Network, format!("{peer} does not know our token, or someone is in the middle; check --token-file / TERN_TOKEN_FILE")));
    }
    w.send(&Control::Auth { nonce: nc, proof: control_proof(key, Party::Client, &nc, &ns, exporter) })?;
    Ok((session_key(key, &nc, &ns), rtt, features))
}

/// Server side; answers a failed proof with a clear `Fatal` before closing. `listening`: the
/// data address to announce right after our `Hello` (ssh mode), if the client understands it.
pub fn server(r: &mut CtrlReader, w: &CtrlWriter, key: &[u8; 32], exporter: &[u8; 32], announce: Announce, data_addr: &[u8]) -> Result<([u8; 32], u64), TransferError> {
    let ours = our_features();
    server_as(ours, r, w, key, exporter, announce, data_addr).map(|(k, theirs)| (k, theirs & ours))
}

/// Whether and when a server tells the client its data address (`Listening`, ssh mode).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Announce {
    /// Nothing to announce (a daemon, `--reverse`).
    No,
    /// After the client's `Hello`, if it has feature bit 1.
    AfterHello,
    /// `Hello` (and `Listening`, if there was an address) went out already, before the client's
    /// `Hello` was read: [`early_hello`].
    Said,
}

/// Set to `1` in `tern _remote`'s environment by a client that understands `Listening` (Hello bit
/// 1): the server then sends its `Hello` and `Listening` before reading anything.
pub const EARLY_HELLO_ENV: &str = "TERN_EARLY_HELLO";

/// ssh mode with a client that said (`TERN_EARLY_HELLO` in the remote command) it understands
/// `Listening`: the server speaks first. The client's bytes reach `tern _remote` only about a
/// round trip after it starts (ssh forwards stdin once the session is set up), and nothing in
/// our `Hello` depends on them, so waiting for them would cost that round trip.
pub fn early_hello(w: &CtrlWriter, data_addr: Option<&[u8]>) -> Result<(), TransferError> {
    w.send(&hello(our_features()))?;
    if let Some(addr) = data_addr {
        w.send(&Control::Listening { data_addr: addr.to_vec() })?;
    }
    Ok(())
}

/// Returns the session key and the client's feature bits.
fn server_as(ours: u64, r: &mut CtrlReader, w: &CtrlWriter, key: &[u8; 32], exporter: &[u8; 32], announce: Announce, data_addr: &[u8]) -> Result<([u8; 32], u64), TransferError> {
    let theirs = expect_hello(r.recv()?)?;
    if announce != Announce::Said {
        w.send(&hello(ours))?;
    }
    if announce == Announce::AfterHello && theirs & ours & FEATURE_EARLY_DATA_ADDR != 0 {
        w.send(&Control::Listening { data_addr: data_addr.to_vec() })?;
    }
    let nc = match r.recv()? {
        Control::Auth { nonce, .. } => nonce,
        _ => return Err(TransferError::fatal(Side::Network, "client skipped authentication")),
    };
    let ns = random::<32>();
    w.send(&Control::Auth { nonce: ns, proof: control_proof(key, Party::Server, &nc, &ns, exporter) })?;
    let proof = match r.recv()? {
        Control::Auth { nonce, proof } if nonce == nc => proof,
        Control::Fatal { side, message } => return Err(TransferError::fatal(side, message)),
        _ => return Err(TransferError::fatal(Side::Network, "bad authentication message")),
    };
    if !proofs_equal(&proof, &control_proof(key, Party::Client, &nc, &ns, exporter)) {
        let msg = "authentication failed: wrong token (check --token-file / TERN_TOKEN_FILE on the client)";
        let _ = w.send(&Control::Fatal { side: Side::Network, message: msg.into() });
        return Err(TransferError::fatal(Side::Network, msg));
    }
    Ok((session_key(key, &nc, &ns), theirs))
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use super::*;

    const ALL: u64 = FEATURE_THIRD_PARTY | FEATURE_EARLY_DATA_ADDR;
    const OLD: u64 = FEATURE_THIRD_PARTY;
    const ADDR: &[u8] = b"192.0.2.1:50000";

    fn ends(s: UnixStream) -> (CtrlReader, CtrlWriter) {
        (CtrlReader::new(Box::new(s.try_clone().unwrap())), CtrlWriter::new(Box::new(s)))
    }

    /// Runs both ends; returns whether the client saw `Listening` (and what it said), and
    /// whether both derived the same session key.
    fn run(client_bits: u64, server_bits: u64, pipelined: bool, announce: bool) -> (Option<Vec<u8>>, bool) {
        let (a, b) = UnixStream::pair().unwrap();
        let key = [7u8; 32];
        let server = std::thread::spawn(move || {
            let (mut r, w) = ends(b);
            server_as(server_bits, &mut r, &w, &key, &[0; 32], if announce { Announce::AfterHello } else { Announce::No }, ADDR).unwrap().0
        });
        let (mut r, w) = ends(a);
        let mut seen = None;
        let mut f = |addr: &[u8]| seen = Some(addr.to_vec());
        let (k, _, features) = client_as(client_bits, &mut r, &w, &key, &[0; 32], "test", pipelined, Some(&mut f)).unwrap();
        assert_eq!(features, server_bits);
        let ks = server.join().unwrap();
        (seen, k == ks)
    }

    #[test]
    fn listening_arrives_between_hello_and_auth() {
        for pipelined in [false, true] {
            assert_eq!(run(ALL, ALL, pipelined, true), (Some(ADDR.to_vec()), true));
        }
    }

    #[test]
    fn older_peers_get_or_send_no_listening() {
        for pipelined in [false, true] {
            // An old client: the new server keeps quiet.
            assert_eq!(run(OLD, ALL, pipelined, true), (None, true));
            // An old server: nothing to wait for.
            assert_eq!(run(ALL, OLD, pipelined, true), (None, true));
            // A daemon or --reverse: nothing to announce.
            assert_eq!(run(ALL, ALL, pipelined, false), (None, true));
        }
    }

    #[test]
    fn a_server_that_spoke_first_is_heard_the_same() {
        // ssh mode with TERN_EARLY_HELLO: Hello and Listening go out before the client's Hello
        // is read; the client sees the same exchange and both derive the same key.
        for pipelined in [false, true] {
            let (a, b) = UnixStream::pair().unwrap();
            let key = [9u8; 32];
            let server = std::thread::spawn(move || {
                let (mut r, w) = ends(b);
                w.send(&hello(ALL)).unwrap();
                w.send(&Control::Listening { data_addr: ADDR.to_vec() }).unwrap();
                server_as(ALL, &mut r, &w, &key, &[0; 32], Announce::Said, ADDR).unwrap().0
            });
            let (mut r, w) = ends(a);
            let mut seen = None;
            let mut f = |addr: &[u8]| seen = Some(addr.to_vec());
            let (k, _, _) = client_as(ALL, &mut r, &w, &key, &[0; 32], "test", pipelined, Some(&mut f)).unwrap();
            assert_eq!((seen.as_deref(), k), (Some(ADDR), server.join().unwrap()));
        }
    }

    #[test]
    fn unannounced_listening_is_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let (mut r, w) = ends(b);
            let _ = r.recv();
            w.send(&hello(OLD)).unwrap();
            w.send(&Control::Listening { data_addr: ADDR.to_vec() }).unwrap();
            let _ = r.recv();
        });
        let (mut r, w) = ends(a);
        let e = client_as(ALL, &mut r, &w, &[0; 32], &[0; 32], "the server", false, None).unwrap_err();
        assert!(e.message.contains("unexpected message from the server"), "{e}");
        t.join().unwrap();
    }
}
