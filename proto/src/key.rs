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
/// use ringlock_proto::is_valid_key;
///
/// assert!(is_valid_key(b"orders/42"));
/// assert!(is_valid_key("clé".as_bytes()));
/// assert!(!is_valid_key(b""));
/// assert!(!is_valid_key(b"two words"));
/// assert!(!is_valid_key(&[b'k'; 251]));
/// ```
pub fn is_valid_key(key: &[u8]) -> bool {
    (1..=KEY_LEN_MAX).contains(&key.len()) && key_bytes_len(key) == key.len()
}

/// How many bytes at the front of `bytes` a key may hold: the index of the
/// first space, tab, CR, LF or NUL, or `bytes.len()` if there is none.
///
/// It reads eight bytes at a time. Every forbidden byte is below `0x21`, and
/// a key byte rarely is, so a word with no byte below `0x21` is all key bytes.
/// The test for such bytes is the "has a zero byte" trick on `word - 0x2121...`:
/// the lowest byte it flags is always a real one, since a borrow only flags
/// bytes above a real one.
#[inline(always)]
pub(crate) fn key_bytes_len(bytes: &[u8]) -> usize {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let mut len = 0;
    while let Some(word) = bytes.get(len..).and_then(<[u8]>::first_chunk::<8>) {
        let word = u64::from_le_bytes(*word);
        let below_0x21 = word.wrapping_sub(ONES * 0x21) & !word & HIGHS;
        if below_0x21 == 0 {
            len += 8;
            continue;
        }
        let at = len + (below_0x21.trailing_zeros() / 8) as usize;
        if !is_key_byte(bytes[at]) {
            return at;
        }
        // A control byte that keys may hold: go on after it.
        len = at + 1;
    }
    bytes[len..].iter().position(|&byte| !is_key_byte(byte)).map_or(bytes.len(), |offset| len + offset)
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
/// use ringlock_proto::is_valid_address;
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

/// Whether a key may hold `byte`: one load, for the request decoder's scan
/// of a key, instead of five comparisons.
#[inline(always)]
pub(crate) fn is_key_byte(byte: u8) -> bool {
    KEY_BYTES[byte as usize]
}

const KEY_BYTES: [bool; 256] = {
    let mut table = [true; 256];
    table[b' ' as usize] = false;
    table[b'\t' as usize] = false;
    table[b'\r' as usize] = false;
    table[b'\n' as usize] = false;
    table[b'\0' as usize] = false;
    table
};

/// Copies `src`, at most `N` bytes, to the start of `dst` with two copies
/// of a fixed size (see `copy_ends`): a copy of a length known only at run
/// time would call `memcpy`, which costs more than the key is long. Keys are
/// copied like this into replies.
#[inline(always)]
pub fn copy_short<const N: usize>(src: &[u8], dst: &mut [u8; N]) {
    debug_assert!(src.len() <= N && N <= 32);
    match src.len() {
        16.. => copy_ends::<16>(src, dst),
        8.. => copy_ends::<8>(src, dst),
        4.. => copy_ends::<4>(src, dst),
        2.. => copy_ends::<2>(src, dst),
        1 => copy_ends::<1>(src, dst),
        0 => {}
    }
}

/// Copies `src`, of `N` to `2 * N` bytes, to the start of `dst` as its first
/// `N` bytes and its last `N` bytes: two moves of a size known when compiling
/// (a register or two each), which overlap when `src` is shorter than `2 * N`.
#[inline(always)]
fn copy_ends<const N: usize>(src: &[u8], dst: &mut [u8]) {
    let len = src.len();
    debug_assert!((N..=2 * N).contains(&len));
    dst[..N].copy_from_slice(&src[..N]);
    dst[len - N..len].copy_from_slice(&src[len - N..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
    fn key_byte_table_agrees_with_the_rule() {
        for byte in 0..=u8::MAX {
            assert_eq!(is_key_byte(byte), !is_forbidden_byte(byte), "{byte:#04x}");
        }
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

    #[test]
    fn key_bytes_len_finds_the_first_forbidden_byte_at_every_position() {
        for len in 0..40 {
            for byte in [b' ', b'\t', b'\r', b'\n', b'\0'] {
                for at in 0..len {
                    let mut bytes = vec![b'k'; len];
                    bytes[at] = byte;
                    assert_eq!(key_bytes_len(&bytes), at, "{byte:#04x} at {at} of {len}");
                }
            }
            assert_eq!(key_bytes_len(&vec![b'k'; len]), len);
            // Control bytes below 0x21 that keys may hold are not the end.
            assert_eq!(key_bytes_len(&vec![0x01; len]), len);
        }
    }

    proptest! {
        #[test]
        fn key_bytes_len_agrees_with_a_byte_loop(bytes in proptest::collection::vec(
            prop_oneof![
                4 => proptest::sample::select(b"kK-/09".to_vec()),
                1 => proptest::sample::select(vec![b' ', b'\t', b'\r', b'\n', b'\0']),
                1 => proptest::sample::select(vec![0x01, 0x08, 0x0b, 0x1f, 0x20, 0x21, 0x7f, 0x80, 0xa0, 0xa1, 0xff]),
                1 => any::<u8>(),
            ],
            0..48,
        )) {
            let expected = bytes.iter().position(|&byte| is_forbidden_byte(byte)).unwrap_or(bytes.len());
            prop_assert_eq!(key_bytes_len(&bytes), expected);
            let naive = (1..=KEY_LEN_MAX).contains(&bytes.len()) && !bytes.iter().copied().any(is_forbidden_byte);
            prop_assert_eq!(is_valid_key(&bytes), naive);
        }
    }
}
