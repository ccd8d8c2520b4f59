//! Feeds arbitrary bytes to `decode_reply` as a client would: one line after
//! another, advancing by `consumed`, until it needs more bytes or the line is
//! too long.
//!
//! Besides "never panics", it checks that `consumed` stays within the buffer
//! and the line limit and ends on a newline, and that every valid reply
//! encodes to a line that decodes to the same reply.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringlock_proto::{Decoded, REPLY_LINE_LEN_MAX, decode_reply, encode_reply};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    let mut encoded = Vec::new();
    loop {
        match decode_reply(rest) {
            Decoded::Incomplete => {
                assert!(
                    rest.len() <= REPLY_LINE_LEN_MAX + 1,
                    "incomplete with {} bytes",
                    rest.len()
                );
                assert!(!rest.contains(&b'\n'), "incomplete with a newline");
                break;
            }
            Decoded::LineTooLong => {
                assert!(
                    rest.len() > REPLY_LINE_LEN_MAX,
                    "too long with {} bytes",
                    rest.len()
                );
                break;
            }
            Decoded::Line { consumed, item } => {
                assert!(consumed > 0 && consumed <= rest.len());
                assert!(consumed <= REPLY_LINE_LEN_MAX + 2);
                assert_eq!(rest[consumed - 1], b'\n');
                assert!(!rest[..consumed - 1].contains(&b'\n'));
                if let Ok(reply) = item {
                    encoded.clear();
                    encode_reply(&reply, &mut encoded);
                    assert_eq!(
                        decode_reply(&encoded),
                        Decoded::Line {
                            consumed: encoded.len(),
                            item: Ok(reply)
                        },
                        "re-encoded as {:?}",
                        String::from_utf8_lossy(&encoded)
                    );
                }
                rest = &rest[consumed..];
            }
        }
    }
});
