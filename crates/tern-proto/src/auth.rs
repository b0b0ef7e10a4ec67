//! Key derivation and proofs of knowledge of a shared secret. Pure functions over bytes.

/// Key derived from a daemon's token secret.
pub fn token_key(secret: &[u8]) -> [u8; 32] {
    blake3::derive_key("tern token v1", secret)
}

/// Which end computes a proof; the two ends' proofs differ so one cannot be replayed as the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Party {
    Client,
    Server,
}

fn party_byte(p: Party) -> &'static [u8] {
    match p {
        Party::Client => b"client",
        Party::Server => b"server",
    }
}

/// Proof for the control channel: binds the secret to both nonces and the TLS exporter value
/// (zeros where the channel is not TLS), so a relay between two TLS sessions cannot forward it.
pub fn control_proof(key: &[u8; 32], party: Party, client_nonce: &[u8; 32], server_nonce: &[u8; 32], exporter: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"tern control proof v1");
    h.update(party_byte(party));
    h.update(client_nonce);
    h.update(server_nonce);
    h.update(exporter);
    *h.finalize().as_bytes()
}

/// Session key shared by both ends after the control handshake.
pub fn session_key(key: &[u8; 32], client_nonce: &[u8; 32], server_nonce: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"tern session key v1");
    h.update(client_nonce);
    h.update(server_nonce);
    *h.finalize().as_bytes()
}

/// Proof that opens a data stream.
pub fn stream_proof(session_key: &[u8; 32], party: Party, session_id: &[u8; 16], stream: u32, nonce: &[u8; 32], exporter: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(session_key);
    h.update(b"tern stream proof v1");
    h.update(party_byte(party));
    h.update(session_id);
    h.update(&stream.to_be_bytes());
    h.update(nonce);
    h.update(exporter);
    *h.finalize().as_bytes()
}

/// Key for the per-chunk tags of one unencrypted data stream.
pub fn stream_tag_key(session_key: &[u8; 32], session_id: &[u8; 16], stream: u32, nonce: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(session_key);
    h.update(b"tern stream tag key v1");
    h.update(session_id);
    h.update(&stream.to_be_bytes());
    h.update(nonce);
    *h.finalize().as_bytes()
}

/// The key a third-party sender proves its data streams with at the receiving daemon. The
/// client derives it from the receiver's session key (which it shares with the receiver) and
/// hands it to the sender: the sender never learns the receiver's token or session key, and
/// the ticket is worthless after this session (session keys are fresh per control handshake).
pub fn stream_ticket(receiver_session_key: &[u8; 32]) -> [u8; 32] {
    blake3::derive_key("tern stream ticket v1", receiver_session_key)
}

/// Constant-time comparison of two proofs.
pub fn proofs_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    blake3::Hash::from(*a) == blake3::Hash::from(*b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_depend_on_every_input() {
        let k = token_key(b"secret");
        let base = control_proof(&k, Party::Client, &[1; 32], &[2; 32], &[3; 32]);
        assert_ne!(base, control_proof(&k, Party::Server, &[1; 32], &[2; 32], &[3; 32]));
        assert_ne!(base, control_proof(&k, Party::Client, &[1; 32], &[2; 32], &[4; 32]));
        assert_ne!(base, control_proof(&token_key(b"other"), Party::Client, &[1; 32], &[2; 32], &[3; 32]));
        assert!(proofs_equal(&base, &base.clone()));
    }
}
