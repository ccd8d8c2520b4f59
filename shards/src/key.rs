//! Key bytes stored inline when short, so that a held lock with a typical key
//! costs no heap allocation of its own.

use std::fmt;

/// Keys up to this many bytes are stored inline in a [`Key`].
pub const KEY_INLINE_LEN_MAX: usize = 24;

/// An owned key: inline up to [`KEY_INLINE_LEN_MAX`] bytes, boxed beyond.
///
/// A short key is held as three words, so that a new one is built in
/// registers and stored whole (see [`Key::new`]), and no heap allocation is
/// needed for it. `size_of::<Key>()` is 32 bytes.
#[derive(Clone, PartialEq, Eq)]
pub enum Key {
    /// A short key: `len` bytes, in order, in the memory of `words`, then
    /// zeros.
    Inline {
        /// Number of bytes used.
        len: u8,
        /// The key's bytes, eight to a word, then zeros.
        words: [u64; 3],
    },
    /// A longer key.
    Heap(Box<[u8]>),
}

impl Key {
    /// Copies `bytes` into a key.
    ///
    /// A key is copied a few times per request (into the table and into each
    /// reply). A short one is read into three words with loads of a fixed
    /// size, shifted into place in registers, rather than assembled in a
    /// byte array on the stack: such an array, written in pieces and then
    /// moved into the key with loads that span several of those pieces,
    /// stalled each copy until the pieces reached the cache (a load can only
    /// take its bytes from one earlier store while they are in flight).
    #[inline]
    pub fn new(bytes: &[u8]) -> Key {
        let len = bytes.len();
        if len > KEY_INLINE_LEN_MAX {
            return Key::Heap(bytes.into());
        }
        Key::Inline { len: len as u8, words: inline_words(bytes).map(u64::to_le) }
    }

    /// Whether the key's bytes are `bytes`. The table compares a key on
    /// every lookup, so a short one is compared by two words of a fixed size
    /// rather than by a call to `memcmp`.
    #[inline]
    pub fn is(&self, bytes: &[u8]) -> bool {
        let Key::Inline { len, .. } = self else {
            return self.as_bytes() == bytes;
        };
        let len = usize::from(*len);
        if bytes.len() != len {
            return false;
        }
        let stored = self.as_bytes();
        match len {
            16.. => ends_equal::<16>(stored, bytes),
            8.. => ends_equal::<8>(stored, bytes),
            4.. => ends_equal::<4>(stored, bytes),
            2.. => ends_equal::<2>(stored, bytes),
            1 => ends_equal::<1>(stored, bytes),
            0 => true,
        }
    }

    /// The key's bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Key::Inline { len, words } => {
                // SAFETY: three `u64` are 24 initialised bytes, and a byte
                // slice needs no alignment; `len` is at most 24.
                let bytes = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), size_of::<[u64; 3]>()) };
                &bytes[..usize::from(*len)]
            }
            Key::Heap(bytes) => bytes,
        }
    }
}

/// The words of an inline key of `bytes` (at most 24): each byte at its place
/// in little-endian order, zeros after the last. Each word is read with one
/// or two loads of a fixed size; where two overlap, the second is shifted
/// right past the bytes the first already holds.
#[inline(always)]
fn inline_words(bytes: &[u8]) -> [u64; 3] {
    let len = bytes.len();
    debug_assert!(len <= KEY_INLINE_LEN_MAX);
    // The last `width` bytes of `bytes`, shifted so that those before `from`
    // drop out and byte `from` lands in the lowest place.
    let tail = |word: u64, from: usize, width: usize| word.checked_shr((8 * (from + width - len)) as u32).unwrap_or(0);
    let word = |at: usize| u64::from_le_bytes(*bytes[at..].first_chunk::<8>().expect("eight bytes"));
    let half = |at: usize| u64::from(u32::from_le_bytes(*bytes[at..].first_chunk::<4>().expect("four bytes")));
    match len {
        16.. => [word(0), word(8), tail(word(len - 8), 16, 8)],
        8.. => [word(0), tail(word(len - 8), 8, 8), 0],
        // Up to eight bytes in one word: the two halves overlap, and the
        // overlapping bytes are equal in both, so OR joins them.
        4.. => [half(0) | half(len - 4) << (8 * (len - 4)), 0, 0],
        1.. => {
            let (first, middle, last) = (u64::from(bytes[0]), u64::from(bytes[len / 2]), u64::from(bytes[len - 1]));
            [first | middle << (8 * (len / 2)) | last << (8 * (len - 1)), 0, 0]
        }
        0 => [0; 3],
    }
}

/// Whether `a` and `b`, of the same length of `N` to `2 * N` bytes, are
/// equal: their first `N` and their last `N` bytes cover them.
#[inline(always)]
fn ends_equal<const N: usize>(a: &[u8], b: &[u8]) -> bool {
    debug_assert!(a.len() == b.len() && (N..=2 * N).contains(&a.len()));
    a.first_chunk::<N>() == b.first_chunk::<N>() && a.last_chunk::<N>() == b.last_chunk::<N>()
}

impl std::hash::Hash for Key {
    /// Hashes the bytes alone, as equality compares them.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", String::from_utf8_lossy(self.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_are_inline_and_long_ones_boxed() {
        assert_eq!(std::mem::size_of::<Key>(), 32);
        let short = Key::new(b"0123456789abcdef");
        assert!(matches!(short, Key::Inline { len: 16, .. }));
        assert_eq!(short.as_bytes(), b"0123456789abcdef");
        let edge = Key::new(&[b'x'; KEY_INLINE_LEN_MAX]);
        assert!(matches!(edge, Key::Inline { .. }));
        let long = Key::new(&[b'y'; KEY_INLINE_LEN_MAX + 1]);
        assert!(matches!(long, Key::Heap(_)));
        assert_eq!(long.as_bytes(), &[b'y'; KEY_INLINE_LEN_MAX + 1][..]);
    }

    #[test]
    fn every_inline_length_copies_exactly_its_bytes() {
        let source: Vec<u8> = (1..=KEY_INLINE_LEN_MAX as u8 + 1).collect();
        for len in 0..=KEY_INLINE_LEN_MAX {
            let key = Key::new(&source[..len]);
            let mut expected = [0u8; KEY_INLINE_LEN_MAX];
            expected[..len].copy_from_slice(&source[..len]);
            let words = std::array::from_fn(|at| u64::from_ne_bytes(*expected[8 * at..].first_chunk().unwrap()));
            assert_eq!(key, Key::Inline { len: len as u8, words }, "{len} bytes");
            assert_eq!(key.as_bytes(), &source[..len]);
        }
    }

    #[test]
    fn a_key_is_exactly_its_bytes() {
        let source: Vec<u8> = (1..=KEY_INLINE_LEN_MAX as u8 + 2).collect();
        for len in 0..=KEY_INLINE_LEN_MAX + 2 {
            let key = Key::new(&source[..len]);
            assert!(key.is(&source[..len]), "{len} bytes");
            for other_len in 0..=KEY_INLINE_LEN_MAX + 2 {
                if other_len != len {
                    assert!(!key.is(&source[..other_len]), "{len} bytes against {other_len}");
                }
            }
            // A change of any one byte is seen.
            for at in 0..len {
                let mut changed = source[..len].to_vec();
                changed[at] ^= 0x40;
                assert!(!key.is(&changed), "{len} bytes, byte {at} changed");
            }
        }
    }

    #[test]
    fn keys_compare_by_bytes() {
        assert_eq!(Key::new(b"a"), Key::new(b"a"));
        assert_ne!(Key::new(b"a"), Key::new(b"a\0"));
    }
}
