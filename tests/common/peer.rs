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
