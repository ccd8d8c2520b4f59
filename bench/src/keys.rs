//! Bench keys: `k` followed by a fixed number of decimal digits, so that every
//! key has the same length and a reply's key gives back its number without a
//! lookup or an allocation.

use ringlock_proto::eight_digits_ascii;

/// Longest key the load generator writes, in bytes.
pub const KEY_LEN_MAX: usize = 64;

/// The shape of every key of a run.
#[derive(Clone, Copy, Debug)]
pub struct KeyFormat {
    len: usize,
}

/// Room for one key, on the stack.
pub type KeyBuffer = [u8; KEY_LEN_MAX];

impl KeyFormat {
    /// Keys of `len` bytes, able to name `key_count` distinct keys.
    pub fn new(len: usize, key_count: u64) -> Result<KeyFormat, String> {
        if !(2..=KEY_LEN_MAX).contains(&len) {
            return Err(format!("--key-len must be 2 to {KEY_LEN_MAX} bytes, not {len}"));
        }
        let digits = len - 1;
        let needed = key_count.saturating_sub(1).checked_ilog10().map_or(1, |log| log as usize + 1);
        if digits < needed {
            return Err(format!(
                "--key-len {len} leaves {digits} digits, too few for {key_count} keys; use --key-len {} or more",
                needed + 1
            ));
        }
        Ok(KeyFormat { len })
    }

    /// Key bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Writes key number `id` into `buffer` and returns it.
    pub fn write<'a>(&self, id: u64, buffer: &'a mut KeyBuffer) -> &'a [u8] {
        self.write_into(id, &mut buffer[..self.len]);
        &buffer[..self.len]
    }

    /// Writes key number `id` over `key`, which is exactly the key's length
    /// (as in a line whose key bytes are patched in place).
    pub fn write_into(&self, id: u64, key: &mut [u8]) {
        debug_assert_eq!(key.len(), self.len);
        // Eight digits per word, from the right: this runs for every request
        // sent. A word may spill over the digits to its left and the `k`,
        // which are written after it.
        let mut rest = id;
        let mut end = key.len();
        while end >= 8 {
            key[end - 8..end].copy_from_slice(&eight_digits_ascii((rest % 100_000_000) as u32));
            rest /= 100_000_000;
            end -= 8;
        }
        if end > 1 {
            let word = eight_digits_ascii((rest % 100_000_000) as u32);
            key[1..end].copy_from_slice(&word[8 - (end - 1)..]);
        }
        key[0] = b'k';
    }

    /// The number of a key this format wrote; `None` for any other bytes.
    pub fn parse(&self, key: &[u8]) -> Option<u64> {
        if key.len() != self.len || key[0] != b'k' {
            return None;
        }
        // Eight digits at a time, from the left; this runs for every reply.
        let digits = &key[1..];
        let (head, chunks) = digits.split_at(digits.len() % 8);
        let mut id: u64 = if head.len() == 7 {
            // Keys of 8n bytes (the default 16): the `k` and the seven digits
            // of the head make one word, with a `0` for the `k`.
            let mut word = *key.first_chunk::<8>().expect("seven digits and the k");
            word[0] = b'0';
            eight_digits(word)?
        } else {
            let mut id = 0;
            for &byte in head {
                if !byte.is_ascii_digit() {
                    return None;
                }
                id = id * 10 + u64::from(byte - b'0');
            }
            id
        };
        for chunk in chunks.chunks_exact(8) {
            let value = eight_digits(chunk.try_into().expect("chunks of eight"))?;
            id = id.checked_mul(100_000_000)?.checked_add(value)?;
        }
        Some(id)
    }
}

/// Eight ASCII digits as a number, or `None` if any byte is not a digit
/// (the SWAR conversion of Lemire, "Fast number parsing").
fn eight_digits(bytes: [u8; 8]) -> Option<u64> {
    let value = u64::from_le_bytes(bytes);
    let all_digits = (value & 0xf0f0_f0f0_f0f0_f0f0) == 0x3030_3030_3030_3030
        && (value.wrapping_add(0x0606_0606_0606_0606) & 0xf0f0_f0f0_f0f0_f0f0) == 0x3030_3030_3030_3030;
    if !all_digits {
        return None;
    }
    let mut value = value - 0x3030_3030_3030_3030;
    value = value.wrapping_mul(10) + (value >> 8);
    const MASK: u64 = 0x0000_00ff_0000_00ff;
    const MUL1: u64 = 100 + (1_000_000 << 32);
    const MUL2: u64 = 1 + (10_000 << 32);
    value = ((value & MASK).wrapping_mul(MUL1).wrapping_add(((value >> 16) & MASK).wrapping_mul(MUL2))) >> 32;
    Some(value & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_at_their_length() {
        let format = KeyFormat::new(16, 10_000_000).unwrap();
        let mut buffer = [0; KEY_LEN_MAX];
        for id in [0, 1, 9, 10, 9_999_999, 123_456_789_012_345] {
            let key = format.write(id, &mut buffer);
            assert_eq!(key.len(), 16);
            assert!(ringlock_proto::is_valid_key(key));
            let key = key.to_vec();
            assert_eq!(format.parse(&key), Some(id));
        }
        assert_eq!(format.write(42, &mut buffer), b"k000000000000042");
    }

    #[test]
    fn every_length_round_trips() {
        let mut buffer = [0; KEY_LEN_MAX];
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for len in 2..=KEY_LEN_MAX {
            let digits = (len - 1).min(19) as u32;
            let format = KeyFormat::new(len, 10u64.pow(digits)).unwrap();
            for _ in 0..200 {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let id = state % 10u64.pow(digits);
                let key = format.write(id, &mut buffer).to_vec();
                let expected = format!("k{id:0>width$}", width = len - 1);
                assert_eq!(key, expected.as_bytes());
                assert_eq!(format.parse(&key), Some(id), "{expected}");
            }
        }
    }

    #[test]
    fn eight_digits_refuses_neighbours_of_digits() {
        assert_eq!(eight_digits(*b"12345678"), Some(12_345_678));
        assert_eq!(eight_digits(*b"00000000"), Some(0));
        assert_eq!(eight_digits(*b"99999999"), Some(99_999_999));
        for bad in [b'/', b':', b' ', 0, 0xff, b'a'] {
            for at in 0..8 {
                let mut bytes = *b"12345678";
                bytes[at] = bad;
                assert_eq!(eight_digits(bytes), None);
            }
        }
    }

    #[test]
    fn foreign_keys_do_not_parse() {
        let format = KeyFormat::new(4, 100).unwrap();
        assert_eq!(format.parse(b"k12"), None);
        assert_eq!(format.parse(b"x123"), None);
        assert_eq!(format.parse(b"k1a3"), None);
        assert_eq!(format.parse(b"k123"), Some(123));
        // Keys of 16 bytes read their `k` and first seven digits as one word.
        let format = KeyFormat::new(16, 1000).unwrap();
        assert_eq!(format.parse(b"k000000000000042"), Some(42));
        assert_eq!(format.parse(b"k00000x000000042"), None);
        assert_eq!(format.parse(b"0000000000000042"), None);
        assert_eq!(format.parse(b"k000000:00000042"), None);
    }

    #[test]
    fn too_short_a_key_is_refused() {
        assert!(KeyFormat::new(4, 1000).is_ok());
        assert!(KeyFormat::new(4, 1001).is_err());
        assert!(KeyFormat::new(1, 1).is_err());
        assert!(KeyFormat::new(2, 1).is_ok());
    }
}
