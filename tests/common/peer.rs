//! Bytes of the peer protocol, for tests that play a node against a real one.

use std::net::SocketAddr;

/// A frame: its length, its type byte, its payload.
pub fn frame(type_byte: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = ((1 + payload.len()) as u32).to_le_bytes().to_vec();
    frame.push(type_byte);
    frame.extend_from_slice(payload);
    frame
}

/// The fingerprint of a `--peers` list as nodes put it in their hellos:
/// FNV-1a (64 bits) of its client addresses, joined by `,`.
pub fn fingerprint(clients: &[SocketAddr]) -> u64 {
    let text: Vec<String> = clients.iter().map(ToString::to_string).collect();
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for byte in text.join(",").bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x100_0000_01b3);
    }
    hash
}

/// A Hello frame: protocol `version`, a cluster of `nodes`, sent by `node`
/// in its run `incarnation`, with the `--peers` fingerprint `fingerprint`.
pub fn hello_with(version: u32, nodes: u8, node: u8, incarnation: u64, fingerprint: u64) -> Vec<u8> {
    let mut body = b"RLKP".to_vec();
    body.extend_from_slice(&version.to_le_bytes());
    body.push(nodes);
    body.push(node);
    body.extend_from_slice(&incarnation.to_le_bytes());
    body.extend_from_slice(&0u64.to_le_bytes());
    body.push(2);
    body.extend_from_slice(&fingerprint.to_le_bytes());
    frame(1, &body)
}
