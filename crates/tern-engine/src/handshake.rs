//! The control handshake: versions, mutual proof of the shared secret, and the session key.

use tern_proto::auth::{Party, control_proof, proofs_equal, session_key};
use tern_proto::msg::{FEATURE_FILTERS, FEATURE_THIRD_PARTY, negotiate_version};
use tern_proto::{Control, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

use crate::control::{CtrlReader, CtrlWriter};
use crate::error::{Side, TransferError};
use crate::transport::random;

fn hello() -> Control {
    Control::Hello { min_version: MIN_PROTOCOL_VERSION, max_version: PROTOCOL_VERSION, features: crate::faults::faults().features.unwrap_or(FEATURE_THIRD_PARTY | FEATURE_FILTERS) }
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

/// Client side. `exporter` is the TLS exporter value of the control channel (zeros over ssh).
/// Returns the session key, the round-trip time of the first authentication exchange and the
/// server's feature bits.
///
/// `pipelined` sends the hello and the first authentication message in one flight, saving a
/// round trip; the returned time is then meaningless (the caller timed its TCP connect
/// instead). Over ssh the exchanges stay apart: the first answer waits for the login, and the
/// second one is the only clean round-trip sample there is.
pub fn client(r: &mut CtrlReader, w: &CtrlWriter, key: &[u8; 32], exporter: &[u8; 32], peer: &str, pipelined: bool) -> Result<([u8; 32], std::time::Duration, u64), TransferError> {
    let nc = random::<32>();
    w.send(&hello())?;
    if pipelined {
        w.send(&Control::Auth { nonce: nc, proof: [0; 32] })?;
    }
    let features = expect_hello(r.recv()?)?;
    let started = std::time::Instant::now();
    if !pipelined {
        w.send(&Control::Auth { nonce: nc, proof: [0; 32] })?;
    }
    let reply = r.recv()?;
    let rtt = started.elapsed();
    let (ns, proof) = match reply {
        Control::Auth { nonce, proof } => (nonce, proof),
        Control::Fatal { side, message } => return Err(TransferError::fatal(side, message)),
        _ => return Err(TransferError::fatal(Side::Network, "unexpected message during authentication")),
    };
    if !proofs_equal(&proof, &control_proof(key, Party::Server, &nc, &ns, exporter)) {
        return Err(TransferError::fatal(
            Side::Network,
            format!("{peer} does not know our token, or someone is in the middle; check --token-file / TERN_TOKEN_FILE"),
        ));
    }
    w.send(&Control::Auth { nonce: nc, proof: control_proof(key, Party::Client, &nc, &ns, exporter) })?;
    Ok((session_key(key, &nc, &ns), rtt, features))
}

/// Server side; answers a failed proof with a clear `Fatal` before closing.
pub fn server(r: &mut CtrlReader, w: &CtrlWriter, key: &[u8; 32], exporter: &[u8; 32]) -> Result<[u8; 32], TransferError> {
    expect_hello(r.recv()?)?;
    w.send(&hello())?;
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
    Ok(session_key(key, &nc, &ns))
}
