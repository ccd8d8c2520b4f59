//! Feeds arbitrary bytes to `decode_request` as a server would: one line
//! after another, advancing by `consumed`, until it needs more bytes or the
//! line is too long.
//!
//! Besides "never panics", it checks that `consumed` stays within the buffer
//! and the line limit and ends on a newline, that every valid request encodes
//! to a line that decodes to the same request, and that every error reply
//! reads back as the same reply.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringlock_proto::{
    Decoded, LEASE_MS_MAX_DEFAULT, LINE_LEN_MAX, Reply, decode_reply, decode_request, encode_reply,
    encode_request,
};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the server's --max-lease, so that the bound is
    // exercised at other values than the default too.
    let (lease_ms_max, mut rest) = match data.split_first() {
        Some((&0, rest)) => (1, rest),
        Some((&1, rest)) => (u64::MAX, rest),
        _ => (LEASE_MS_MAX_DEFAULT, data),
    };
    let mut encoded = Vec::new();
    loop {
        match decode_request(rest, lease_ms_max) {
            Decoded::Incomplete => {
                assert!(
                    rest.len() <= LINE_LEN_MAX + 1,
                    "incomplete with {} bytes",
                    rest.len()
                );
                assert!(!rest.contains(&b'\n'), "incomplete with a newline");
                break;
            }
            Decoded::LineTooLong => {
                assert!(
                    rest.len() > LINE_LEN_MAX,
                    "too long with {} bytes",
                    rest.len()
                );
                break;
            }
            Decoded::Line { consumed, item } => {
                assert!(consumed > 0 && consumed <= rest.len());
                assert!(consumed <= LINE_LEN_MAX + 2);
                assert_eq!(rest[consumed - 1], b'\n');
                assert!(!rest[..consumed - 1].contains(&b'\n'));
                encoded.clear();
                match item {
                    Ok(request) => {
                        encode_request(&request, &mut encoded);
                        assert_eq!(
                            decode_request(&encoded, lease_ms_max),
                            Decoded::Line {
                                consumed: encoded.len(),
                                item: Ok(request)
                            },
                            "re-encoded as {:?}",
                            String::from_utf8_lossy(&encoded)
                        );
                    }
                    Err(error) => {
                        let reply = error.to_reply();
                        encode_reply(&reply, &mut encoded);
                        // "-" in the key position of an E reply means "no
                        // valid key", so an error about the key "-" reads
                        // back without its key.
                        let expected = match reply {
                            Reply::Error {
                                op,
                                key: Some(b"-"),
                                code,
                            } => Reply::Error {
                                op,
                                key: None,
                                code,
                            },
                            other => other,
                        };
                        assert_eq!(
                            decode_reply(&encoded),
                            Decoded::Line {
                                consumed: encoded.len(),
                                item: Ok(expected)
                            },
                            "error reply {:?}",
                            String::from_utf8_lossy(&encoded)
                        );
                    }
                }
                rest = &rest[consumed..];
            }
        }
    }
});
