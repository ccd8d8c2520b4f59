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
    pub fn new(bytes: &[u8]) -> Key {
        if bytes.len() <= KEY_INLINE_LEN_MAX {
            let mut inline = [0u8; KEY_INLINE_LEN_MAX];
            inline[..bytes.len()].copy_from_slice(bytes);
            Key::Inline { len: bytes.len() as u8, bytes: inline }
        } else {
            Key::Heap(bytes.into())
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
    fn keys_compare_by_bytes() {
        assert_eq!(Key::new(b"a"), Key::new(b"a"));
        assert_ne!(Key::new(b"a"), Key::new(b"a\0"));
    }
}
