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
        // each reply), so it is copied by at most two fixed-size moves, which
        // may overlap, rather than by a call to `memcpy` for `len` bytes.
        // Every move stays within the first `len` bytes, so the rest stay
        // zero, as equality needs.
        let mut inline = [0u8; KEY_INLINE_LEN_MAX];
        if len >= 16 {
            inline[..16].copy_from_slice(&bytes[..16]);
            inline[len - 16..len].copy_from_slice(&bytes[len - 16..]);
        } else if len >= 8 {
            inline[..8].copy_from_slice(&bytes[..8]);
            inline[len - 8..len].copy_from_slice(&bytes[len - 8..]);
        } else if len >= 4 {
            inline[..4].copy_from_slice(&bytes[..4]);
            inline[len - 4..len].copy_from_slice(&bytes[len - 4..]);
        } else if len > 0 {
            // One to three bytes: the first, the middle and the last cover them.
            inline[0] = bytes[0];
            inline[len / 2] = bytes[len / 2];
            inline[len - 1] = bytes[len - 1];
        }
        Key::Inline { len: len as u8, bytes: inline }
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
    fn keys_compare_by_bytes() {
        assert_eq!(Key::new(b"a"), Key::new(b"a"));
        assert_ne!(Key::new(b"a"), Key::new(b"a\0"));
    }
}
