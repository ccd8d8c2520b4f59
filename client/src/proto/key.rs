//! What may stand in a key field and in an address field.

use super::KEY_LEN_MAX;

/// Whether `key` is a valid key: 1 to [`KEY_LEN_MAX`] bytes, none of them
/// space, tab, CR, LF or NUL.
///
/// Any other byte is allowed, UTF-8 or not: the protocol is byte-oriented, so
/// a key is compared byte for byte. Note that `-` is a valid key, but in the
/// key position of an `E` reply `-` means "no valid key", so an error about
/// the key `-` reads back as having no key.
///
/// # Examples
///
/// ```
/// use ringlock_client::proto::is_valid_key;
///
/// assert!(is_valid_key(b"orders/42"));
/// assert!(is_valid_key("clé".as_bytes()));
/// assert!(!is_valid_key(b""));
/// assert!(!is_valid_key(b"two words"));
/// assert!(!is_valid_key(&[b'k'; 251]));
/// ```
pub fn is_valid_key(key: &[u8]) -> bool {
    (1..=KEY_LEN_MAX).contains(&key.len()) && !key.iter().copied().any(is_forbidden_byte)
}

/// Whether `address` can stand in the address field of an `M` or `P` reply:
/// at least one byte, none of them space, tab, CR, LF or NUL, and not `-`
/// (which the field uses for "no active known").
///
/// The protocol does not look inside an address (`host:port`, `[::1]:7700`);
/// it only has to be one field. Servers should check their `--peers` and
/// `--listen` with this at start-up, since [`encode_reply`](super::encode_reply)
/// trusts its input.
///
/// # Examples
///
/// ```
/// use ringlock_client::proto::is_valid_address;
///
/// assert!(is_valid_address(b"10.0.0.1:7700"));
/// assert!(is_valid_address(b"[::1]:7700"));
/// assert!(!is_valid_address(b"-"));
/// assert!(!is_valid_address(b""));
/// ```
pub fn is_valid_address(address: &[u8]) -> bool {
    !address.is_empty() && address != b"-" && !address.iter().copied().any(is_forbidden_byte)
}

/// The bytes no key or address may hold: the field separator, the line
/// ending, and tab and NUL, which too many tools mangle.
fn is_forbidden_byte(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\r' | b'\n' | b'\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_length_bounds() {
        assert!(!is_valid_key(b""));
        assert!(is_valid_key(b"k"));
        assert!(is_valid_key(&[b'k'; KEY_LEN_MAX]));
        assert!(!is_valid_key(&[b'k'; KEY_LEN_MAX + 1]));
    }

    #[test]
    fn key_forbidden_bytes() {
        for byte in [b' ', b'\t', b'\r', b'\n', b'\0'] {
            assert!(!is_valid_key(&[byte]), "{byte:#04x}");
            assert!(!is_valid_key(&[b'a', byte, b'b']), "{byte:#04x}");
            assert!(!is_valid_key(&[b'a', byte]), "{byte:#04x}");
        }
    }

    #[test]
    fn key_allows_every_other_byte() {
        for byte in 0..=u8::MAX {
            let expected = !matches!(byte, b' ' | b'\t' | b'\r' | b'\n' | b'\0');
            assert_eq!(is_valid_key(&[byte]), expected, "{byte:#04x}");
        }
        assert!(is_valid_key(b"-"));
        assert!(is_valid_key(b"\xff\xfe\x01\x7f"));
    }

    #[test]
    fn address_rules() {
        assert!(is_valid_address(b"127.0.0.1:7700"));
        assert!(is_valid_address(b"--"));
        assert!(!is_valid_address(b"-"));
        assert!(!is_valid_address(b""));
        assert!(!is_valid_address(b"host :1"));
        assert!(!is_valid_address(b"host:1\r"));
        // Addresses are not bounded like keys: a long host name is fine.
        assert!(is_valid_address(&[b'h'; 300]));
    }
}
