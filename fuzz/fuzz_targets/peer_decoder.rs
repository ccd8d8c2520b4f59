//! Feeds arbitrary bytes to the peer protocol's `decode` as the replication
//! core would read a peer connection: one frame after another, advancing by
//! the bytes used, until it needs more bytes or the peer is broken.
//!
//! Besides "never panics", it checks that a frame uses at most the bytes
//! there are and at most one frame's worth, that "incomplete" is only said of
//! input shorter than the frame it announces, and that every decoded frame
//! re-encodes to exactly the bytes it came from (every frame has one
//! encoding) and decodes back to the same frame.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringlock::cluster::wire::{FRAME_LEN_MAX, decode, encode};

const LEN_PREFIX_BYTES: usize = 4;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    let mut encoded = Vec::new();
    loop {
        match decode(rest) {
            Ok(None) => {
                if let Some(prefix) = rest.first_chunk::<LEN_PREFIX_BYTES>() {
                    let len = u32::from_le_bytes(*prefix) as usize;
                    assert!(len <= FRAME_LEN_MAX, "incomplete with a {len}-byte length");
                    assert!(rest.len() < LEN_PREFIX_BYTES + len, "incomplete with the whole frame there");
                }
                break;
            }
            Err(_) => break,
            Ok(Some((frame, used))) => {
                assert!(used > LEN_PREFIX_BYTES && used <= rest.len());
                assert!(used - LEN_PREFIX_BYTES <= FRAME_LEN_MAX);
                encoded.clear();
                encode(&frame, &mut encoded);
                assert_eq!(&encoded[..], &rest[..used], "{frame:?} re-encoded differently");
                assert_eq!(decode(&encoded), Ok(Some((frame, used))));
                rest = &rest[used..];
            }
        }
    }
});
