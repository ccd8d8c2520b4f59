//! The proof that a side of a peer connection holds the peer secret: an
//! HMAC-SHA256 over what the connection's two sides agree on. Pure functions
//! of the key and the bound values; the exchange itself (which frame carries
//! what, and when) is in `peers`, the layout in `cluster::wire`.
//!
//! What a proof binds, and why:
//! - both sides' fresh nonces: a proof seen on one connection is worth
//!   nothing on the next, whose nonces differ (no replay);
//! - the label of the side that proves: the acceptor's proof cannot be sent
//!   back as the connector's, on the same connection or another (no
//!   reflection);
//! - the node index of the side that proves: a proof made by node 1 does
//!   not let its sender speak as node 0;
//! - the `--peers` fingerprint: a proof meant for another cluster that
//!   shares the secret is refused here;
//! - the version of the exchange (`SECURED_PROTOCOL_VERSION`): both sides
//!   read the frames the same way.

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

use crate::cluster::wire::{MAC_BYTES, NONCE_BYTES, Proof, SECURED_PROTOCOL_VERSION};

/// The label of the proof the side that dialled sends.
const CONNECTOR_LABEL: &[u8] = b"ringlock/peer-proof/connector";
/// The label of the proof the side that accepted sends.
const ACCEPTOR_LABEL: &[u8] = b"ringlock/peer-proof/acceptor";

/// Which side of a connection proves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The node that dialled (it sends the Hello).
    Connector,
    /// The node that accepted.
    Acceptor,
}

impl Side {
    fn label(self) -> &'static [u8] {
        match self {
            Side::Connector => CONNECTOR_LABEL,
            Side::Acceptor => ACCEPTOR_LABEL,
        }
    }
}

/// A connection's two nonces, the connector's first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nonces {
    pub connector: [u8; NONCE_BYTES],
    pub acceptor: [u8; NONCE_BYTES],
}

/// The HMAC key of a peer secret.
pub fn key(secret: &[u8]) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, secret)
}

/// A fresh nonce from the system's random source; `None` if it failed
/// (the connection is then dropped: a predictable nonce would allow replay).
pub fn fresh_nonce(random: &SystemRandom) -> Option<[u8; NONCE_BYTES]> {
    let mut nonce = [0u8; NONCE_BYTES];
    random.fill(&mut nonce).ok()?;
    Some(nonce)
}

/// The bytes a proof's MAC covers.
fn message(side: Side, nonces: &Nonces, node: usize, peers_fingerprint: u64) -> Vec<u8> {
    let label = side.label();
    let mut bytes = Vec::with_capacity(label.len() + 1 + 4 + 2 * NONCE_BYTES + 1 + 8);
    bytes.extend_from_slice(label);
    // The labels hold no zero byte: this one ends the label unambiguously.
    bytes.push(0);
    bytes.extend_from_slice(&SECURED_PROTOCOL_VERSION.to_le_bytes());
    bytes.extend_from_slice(&nonces.connector);
    bytes.extend_from_slice(&nonces.acceptor);
    bytes.push(u8::try_from(node).expect("a node index fits a byte"));
    bytes.extend_from_slice(&peers_fingerprint.to_le_bytes());
    bytes
}

/// The proof `side`, node `node` of the cluster with `peers_fingerprint`,
/// sends on the connection with `nonces`.
pub fn prove(key: &hmac::Key, side: Side, nonces: &Nonces, node: usize, peers_fingerprint: u64) -> Proof {
    let tag = hmac::sign(key, &message(side, nonces, node, peers_fingerprint));
    let mac: [u8; MAC_BYTES] = tag.as_ref().try_into().expect("HMAC-SHA256 is 32 bytes");
    Proof { node, peers_fingerprint, mac }
}

/// Whether `proof`, received from `side` on the connection with `nonces`,
/// was made with this key for what it says (compared in constant time).
pub fn verify(key: &hmac::Key, side: Side, nonces: &Nonces, proof: &Proof) -> bool {
    hmac::verify(key, &message(side, nonces, proof.node, proof.peers_fingerprint), &proof.mac).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
    const FINGERPRINT: u64 = 0x1234_5678_9abc_def0;

    fn nonces() -> Nonces {
        Nonces { connector: [0x11; NONCE_BYTES], acceptor: [0x22; NONCE_BYTES] }
    }

    #[test]
    fn a_proof_checks_with_the_same_key_side_and_nonces() {
        let key = key(SECRET);
        for side in [Side::Connector, Side::Acceptor] {
            let proof = prove(&key, side, &nonces(), 2, FINGERPRINT);
            assert_eq!((proof.node, proof.peers_fingerprint), (2, FINGERPRINT));
            assert!(verify(&key, side, &nonces(), &proof), "{side:?}");
        }
    }

    #[test]
    fn the_mac_is_hmac_sha256_over_the_documented_bytes() {
        // Computed independently: Python's hmac.new(SECRET, message, "sha256"),
        // with message = b"ringlock/peer-proof/connector\0" + (6).to_bytes(4,
        // "little") + b"\x11" * 32 + b"\x22" * 32 + bytes([2]) +
        // FINGERPRINT.to_bytes(8, "little").
        assert_eq!(SECURED_PROTOCOL_VERSION, 6, "the expected MAC below is for version 6");
        let proof = prove(&key(SECRET), Side::Connector, &nonces(), 2, FINGERPRINT);
        let hex: String = proof.mac.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(hex, EXPECTED_CONNECTOR_MAC_HEX);
    }

    const EXPECTED_CONNECTOR_MAC_HEX: &str = "801816d063891c49c5724a1c4293da5058990a07436d2339ead0e779d1780791";

    #[test]
    fn another_key_fails() {
        let proof = prove(&key(SECRET), Side::Connector, &nonces(), 1, FINGERPRINT);
        assert!(!verify(&key(b"0123456789abcdef0123456789abcdeF"), Side::Connector, &nonces(), &proof));
    }

    #[test]
    fn a_proof_is_not_valid_for_the_other_side() {
        // Reflection: the acceptor's own proof sent back to it as the
        // connector's, even by a connector that claims the acceptor's index.
        let key = key(SECRET);
        let acceptors = prove(&key, Side::Acceptor, &nonces(), 0, FINGERPRINT);
        assert!(!verify(&key, Side::Connector, &nonces(), &acceptors));
        let connectors = prove(&key, Side::Connector, &nonces(), 0, FINGERPRINT);
        assert!(!verify(&key, Side::Acceptor, &nonces(), &connectors));
    }

    #[test]
    fn a_proof_is_not_valid_for_other_nonces() {
        // Replay: a proof taken from one connection, on a connection whose
        // nonces differ in either side's.
        let key = key(SECRET);
        let proof = prove(&key, Side::Connector, &nonces(), 1, FINGERPRINT);
        let mut other = nonces();
        other.acceptor[31] ^= 1;
        assert!(!verify(&key, Side::Connector, &other, &proof));
        let mut other = nonces();
        other.connector[0] ^= 0x80;
        assert!(!verify(&key, Side::Connector, &other, &proof));
        // Swapping the two nonces is another connection too.
        let swapped = Nonces { connector: nonces().acceptor, acceptor: nonces().connector };
        assert!(!verify(&key, Side::Connector, &swapped, &proof));
    }

    #[test]
    fn a_proof_is_not_valid_for_another_node_or_cluster() {
        let key = key(SECRET);
        let proof = prove(&key, Side::Connector, &nonces(), 1, FINGERPRINT);
        assert!(!verify(&key, Side::Connector, &nonces(), &Proof { node: 0, ..proof }));
        assert!(!verify(&key, Side::Connector, &nonces(), &Proof { peers_fingerprint: FINGERPRINT ^ 1, ..proof }));
        let mut mac = proof.mac;
        mac[0] ^= 1;
        assert!(!verify(&key, Side::Connector, &nonces(), &Proof { mac, ..proof }));
    }

    #[test]
    fn fresh_nonces_differ() {
        let random = SystemRandom::new();
        let first = fresh_nonce(&random).unwrap();
        let second = fresh_nonce(&random).unwrap();
        assert_ne!(first, second);
    }
}
