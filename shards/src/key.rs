//! Key bytes stored inline when short, so that a held lock with a typical key
//! costs no heap allocation of its own.

use std::fmt;

/// Keys up to this many bytes are stored inline in a [`Key`].
pub const KEY_INLINE_LEN_MAX: usize = 22;

/// An owned key: inline up to [`KEY_INLINE_LEN_MAX`] bytes, boxed beyond.
///
/// The inline form keeps `size_of::<Key>()` at 24 bytes, the size of the boxed
/// form plus its tag, so short keys are free of any allocation.
#[derive(Clone, PartialEq, Eq)]
pub enum Key {
    /// A short key, the first `len` bytes of `bytes`.
    Inline {
        /// Number of bytes used.
        len: u8,
        /// The key, then zeros.
        bytes: [u8; KEY_INLINE_LEN_MAX],
    },
    /// A longer key.
    Heap(Box<[u8]>),
}

impl Key {
    /// Copies `bytes` into a key.
    #[inline]
    pub fn new(bytes: &[u8]) -> Key {
        let len = bytes.len();
        if len > KEY_INLINE_LEN_MAX {
            return Key::Heap(bytes.into());
        }
        // A key is copied a few times per request (into the table and into
        // each reply), so a short one is copied by two moves of a fixed size
        // (see `ringlock_client::proto::copy_short`) rather than by a call to `memcpy` for `len`
        // bytes. The bytes after the key stay zero, as equality needs.
        let mut inline = [0u8; KEY_INLINE_LEN_MAX];
        ringlock_client::proto::copy_short(bytes, &mut inline);
        Key::Inline { len: len as u8, bytes: inline }
    }

    /// Whether the key's bytes are `bytes`. The table compares a key on
    /// every lookup, so a short one is compared by two words of a fixed size
    /// (as `ringlock_client::proto::copy_short` copies it) rather than by a call
    /// to `memcmp`.
    #[inline]
    pub fn is(&self, bytes: &[u8]) -> bool {
        let Key::Inline { len, bytes: inline } = self else {
            return self.as_bytes() == bytes;
        };
        let len = usize::from(*len);
        if bytes.len() != len {
            return false;
        }
        let stored = &inline[..len];
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
            Key::Inline { len, bytes } => &bytes[..*len as usize],
            Key::Heap(bytes) => bytes,
        }
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
        assert_eq!(std::mem::size_of::<Key>(), 24);
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
            assert_eq!(key, Key::Inline { len: len as u8, bytes: expected }, "{len} bytes");
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
