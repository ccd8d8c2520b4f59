//! Line framing: finding the first line of a buffer within a length limit,
//! and splitting a line into its space-separated fields.
//!
//! This is the hot path of every connection, so the newline search is bounded
//! (it never looks further than a line may be long, whatever the buffer holds)
//! and reads a word at a time.

use super::KEY_LEN_MAX;
use super::key::key_bytes_len;
use super::number::parse_u64_prefix;

/// The result of decoding one line from the front of a buffer.
///
/// Decoders return this instead of an error type so that "wait for more
/// bytes" and "this connection is beyond saving" are not confused with a line
/// that was read and merely meant nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decoded<T> {
    /// No complete line yet; read more bytes and try again.
    Incomplete,
    /// The buffer starts with a line longer than the decoder's limit (not
    /// counting its `\n` or `\r\n`), whether or not its newline has arrived.
    ///
    /// For requests the limit is [`LINE_LEN_MAX`](super::LINE_LEN_MAX): the
    /// server must answer `E - - line-too-long` (see
    /// [`RequestError::LINE_TOO_LONG`](super::RequestError::LINE_TOO_LONG))
    /// and close the connection, because it can no longer tell where the next
    /// request starts. For replies the limit is
    /// [`REPLY_LINE_LEN_MAX`](super::REPLY_LINE_LEN_MAX), and a client should
    /// drop the connection.
    LineTooLong,
    /// One complete line.
    Line {
        /// Bytes taken from the front of the buffer, including the newline;
        /// always at least 1. Advance the buffer by this much.
        consumed: usize,
        /// What the line meant.
        item: T,
    },
}

impl<T> Decoded<T> {
    /// Applies `f` to the decoded item, keeping `Incomplete`, `LineTooLong`
    /// and `consumed` as they are.
    ///
    /// # Examples
    ///
    /// ```
    /// use ringlock_proto::Decoded;
    ///
    /// let decoded = Decoded::Line { consumed: 3, item: 2 };
    /// assert_eq!(decoded.map(|n| n * 10), Decoded::Line { consumed: 3, item: 20 });
    /// ```
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Decoded<U> {
        match self {
            Decoded::Incomplete => Decoded::Incomplete,
            Decoded::LineTooLong => Decoded::LineTooLong,
            Decoded::Line { consumed, item } => Decoded::Line { consumed, item: f(item) },
        }
    }
}

/// Finds the first line of `buf`, allowing at most `line_len_max` bytes
/// before its `\n` or `\r\n`, and returns the line without its line ending.
///
/// It looks at no more than `line_len_max + 2` bytes: enough to see the end
/// of the longest allowed line ended by `\r\n`. If the buffer holds more than
/// that many bytes without a newline, or more than `line_len_max` bytes that
/// cannot be the start of an allowed line, the line is too long now, and
/// saying so at once spares the caller from buffering a flood.
pub(crate) fn split_line(buf: &[u8], line_len_max: usize) -> Decoded<&[u8]> {
    let window = &buf[..buf.len().min(line_len_max + 2)];
    match find_newline(window) {
        Some(newline) => {
            let line = &buf[..newline];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.len() > line_len_max {
                Decoded::LineTooLong
            } else {
                Decoded::Line { consumed: newline + 1, item: line }
            }
        }
        None => {
            // Without a newline the buffer is still a possible line while it
            // holds at most `line_len_max` bytes, or exactly one more that is
            // the `\r` of a `\r\n` whose `\n` has not arrived yet.
            let could_still_fit =
                buf.len() <= line_len_max || (buf.len() == line_len_max + 1 && buf[line_len_max] == b'\r');
            if could_still_fit { Decoded::Incomplete } else { Decoded::LineTooLong }
        }
    }
}

/// The index of the first `\n` in `haystack`.
///
/// It tests eight bytes at a time with the classic "has a zero byte" trick
/// on `word ^ 0x0a0a...`; in little-endian order the lowest flagged byte is
/// always a real match (borrows only flag bytes above a real match), so its
/// position is exact.
fn find_newline(haystack: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const NEWLINES: u64 = u64::from_ne_bytes([b'\n'; 8]);
    let (words, tail) = haystack.as_chunks::<8>();
    for (index, word) in words.iter().enumerate() {
        let diff = u64::from_le_bytes(*word) ^ NEWLINES;
        let zero_bytes = diff.wrapping_sub(ONES) & !diff & HIGHS;
        if zero_bytes != 0 {
            return Some(index * 8 + (zero_bytes.trailing_zeros() / 8) as usize);
        }
    }
    tail.iter().position(|&byte| byte == b'\n').map(|offset| words.len() * 8 + offset)
}

/// The first `N` fields of a line split on single spaces, and facts about
/// the rest, read in one pass without allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fields<'a, const N: usize> {
    /// The first `min(count, N)` fields; the others are empty.
    pub(crate) fields: [&'a [u8]; N],
    /// How many fields the line has, including any beyond `N`.
    pub(crate) count: usize,
    /// Whether any field after the first is empty (a double, leading or
    /// trailing space), which makes the line malformed whatever its count.
    pub(crate) has_empty_field: bool,
}

impl<'a, const N: usize> Fields<'a, N> {
    /// The field at `index`, or an empty slice if the line has no such field
    /// or it is beyond `N`.
    pub(crate) fn get(&self, index: usize) -> &'a [u8] {
        if index < self.count.min(N) { self.fields[index] } else { b"" }
    }

    /// Whether the line has exactly `count` fields, none of them empty.
    pub(crate) fn is_exactly(&self, count: usize) -> bool {
        self.count == count && !self.has_empty_field
    }
}

/// Splits `line` on every space. An empty line has one empty field.
pub(crate) fn split_fields<const N: usize>(line: &[u8]) -> Fields<'_, N> {
    let mut fields = Fields { fields: [&b""[..]; N], count: 0, has_empty_field: false };
    for field in line.split(|&byte| byte == b' ') {
        if fields.count < N {
            fields.fields[fields.count] = field;
        }
        if fields.count > 0 && field.is_empty() {
            fields.has_empty_field = true;
        }
        fields.count += 1;
    }
    fields
}

/// A space and a valid key at the front of `rest`, and what follows the key:
/// one field of a one-pass decoder, which checks each field as it finds it.
#[inline(always)]
pub(crate) fn key_field(rest: &[u8]) -> Option<(&[u8], &[u8])> {
    let rest = rest.strip_prefix(b" ")?;
    // The key ends at its first byte that no key may hold, which must be the
    // next field's space or the line's end (checked by the caller). Looking
    // one byte past the longest key is enough to tell a key that is too long.
    let key_len = key_bytes_len(&rest[..rest.len().min(KEY_LEN_MAX + 1)]);
    if key_len == 0 || key_len > KEY_LEN_MAX {
        return None;
    }
    Some(rest.split_at(key_len))
}

/// A space and a decimal `u64` at the front of `rest`, and what follows it.
/// Twenty digits at most: a longer field (leading zeros) is left to the full
/// rules, as the caller finds a digit where the field should have ended.
#[inline(always)]
pub(crate) fn token_field(rest: &[u8]) -> Option<(u64, &[u8])> {
    let rest = rest.strip_prefix(b" ")?;
    let (token, len) = parse_u64_prefix(rest)?;
    Some((token, &rest[len..]))
}

/// The length of the line ending (`\n` or `\r\n`) at the front of `rest`,
/// where a one-pass decoder expects its line to end.
#[inline(always)]
pub(crate) fn line_ending_len(rest: &[u8]) -> Option<usize> {
    match rest {
        [b'\n', ..] => Some(1),
        [b'\r', b'\n', ..] => Some(2),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LINE_LEN_MAX;
    use proptest::prelude::*;

    fn line_of(len: usize) -> Vec<u8> {
        vec![b'a'; len]
    }

    fn with(mut bytes: Vec<u8>, suffix: &[u8]) -> Vec<u8> {
        bytes.extend_from_slice(suffix);
        bytes
    }

    #[test]
    fn empty_buffer_is_incomplete() {
        assert_eq!(split_line(b"", LINE_LEN_MAX), Decoded::Incomplete);
    }

    #[test]
    fn line_ends_at_first_newline() {
        assert_eq!(split_line(b"P\nS\n", LINE_LEN_MAX), Decoded::Line { consumed: 2, item: &b"P"[..] });
        assert_eq!(split_line(b"\n", LINE_LEN_MAX), Decoded::Line { consumed: 1, item: &b""[..] });
    }

    #[test]
    fn one_cr_before_newline_is_stripped() {
        assert_eq!(split_line(b"P\r\n", LINE_LEN_MAX), Decoded::Line { consumed: 3, item: &b"P"[..] });
        assert_eq!(split_line(b"\r\n", LINE_LEN_MAX), Decoded::Line { consumed: 2, item: &b""[..] });
        assert_eq!(split_line(b"P\r\r\n", LINE_LEN_MAX), Decoded::Line { consumed: 4, item: &b"P\r"[..] });
        assert_eq!(split_line(b"P\rS\n", LINE_LEN_MAX), Decoded::Line { consumed: 4, item: &b"P\rS"[..] });
    }

    #[test]
    fn longest_line_fits() {
        let line = line_of(LINE_LEN_MAX);
        let buf = with(line.clone(), b"\n");
        assert_eq!(split_line(&buf, LINE_LEN_MAX), Decoded::Line { consumed: LINE_LEN_MAX + 1, item: &line[..] });
        let buf = with(line.clone(), b"\r\n");
        assert_eq!(split_line(&buf, LINE_LEN_MAX), Decoded::Line { consumed: LINE_LEN_MAX + 2, item: &line[..] });
    }

    #[test]
    fn longest_line_without_its_newline_is_incomplete() {
        assert_eq!(split_line(&line_of(LINE_LEN_MAX), LINE_LEN_MAX), Decoded::Incomplete);
        assert_eq!(split_line(&with(line_of(LINE_LEN_MAX), b"\r"), LINE_LEN_MAX), Decoded::Incomplete);
    }

    #[test]
    fn one_byte_over_is_too_long_with_or_without_newline() {
        let over = line_of(LINE_LEN_MAX + 1);
        assert_eq!(split_line(&over, LINE_LEN_MAX), Decoded::LineTooLong);
        assert_eq!(split_line(&with(over.clone(), b"\n"), LINE_LEN_MAX), Decoded::LineTooLong);
        assert_eq!(split_line(&with(over.clone(), b"\r"), LINE_LEN_MAX), Decoded::LineTooLong);
        assert_eq!(split_line(&with(over, b"\r\n"), LINE_LEN_MAX), Decoded::LineTooLong);
    }

    #[test]
    fn longest_line_then_cr_then_other_byte_is_too_long() {
        let buf = with(line_of(LINE_LEN_MAX), b"\rx");
        assert_eq!(split_line(&buf, LINE_LEN_MAX), Decoded::LineTooLong);
        let buf = with(line_of(LINE_LEN_MAX), b"\r\r\n");
        assert_eq!(split_line(&buf, LINE_LEN_MAX), Decoded::LineTooLong);
    }

    #[test]
    fn newline_beyond_the_window_is_not_searched_for() {
        // A megabyte with its newline at the end is too long, judged from
        // the first LINE_LEN_MAX + 2 bytes alone.
        let buf = with(line_of(1 << 20), b"\n");
        assert_eq!(split_line(&buf, LINE_LEN_MAX), Decoded::LineTooLong);
    }

    #[test]
    fn short_line_before_a_long_one_is_decoded() {
        let buf = with(b"P\n".to_vec(), &line_of(5000));
        assert_eq!(split_line(&buf, LINE_LEN_MAX), Decoded::Line { consumed: 2, item: &b"P"[..] });
        assert_eq!(split_line(&buf[2..], LINE_LEN_MAX), Decoded::LineTooLong);
    }

    #[test]
    fn find_newline_at_every_position() {
        for len in 0..40 {
            for at in 0..len {
                let mut buf = vec![b'\x0b'; len];
                buf[at] = b'\n';
                assert_eq!(find_newline(&buf), Some(at), "len {len} at {at}");
            }
            assert_eq!(find_newline(&vec![b'\x0b'; len]), None);
        }
    }

    #[test]
    fn find_newline_ignores_near_misses() {
        // Bytes that differ from '\n' by one bit, or that make the word trick
        // borrow, must not be taken for a newline.
        let near = [0x0b, 0x09, 0x08, 0x0e, 0x02, 0x4a, 0x8a, 0x8b, 0x00, 0xff, 0x01];
        let buf: Vec<u8> = near.iter().copied().cycle().take(64).collect();
        assert_eq!(find_newline(&buf), None);
        let mut buf = buf;
        buf[37] = b'\n';
        assert_eq!(find_newline(&buf), Some(37));
    }

    #[test]
    fn split_fields_counts_and_flags_empty_fields() {
        let fields = split_fields::<4>(b"A k 1 0");
        assert_eq!(fields.count, 4);
        assert!(fields.is_exactly(4));
        assert_eq!([fields.get(0), fields.get(1), fields.get(2), fields.get(3)], [&b"A"[..], b"k", b"1", b"0"]);
        assert_eq!(fields.get(4), b"");

        let fields = split_fields::<4>(b"A k 1 0 extra more");
        assert_eq!(fields.count, 6);
        assert!(!fields.has_empty_field);

        assert!(split_fields::<4>(b"A k  0").has_empty_field);
        assert!(split_fields::<4>(b"A k 1 ").has_empty_field);
        assert!(!split_fields::<4>(b"A k 1 ").is_exactly(4));

        let empty = split_fields::<4>(b"");
        assert_eq!(empty.count, 1);
        assert!(!empty.has_empty_field);
        assert_eq!(split_fields::<4>(b" A").get(0), b"");
    }

    proptest! {
        #[test]
        fn find_newline_agrees_with_position(buf in proptest::collection::vec(
            prop_oneof![Just(b'\n'), Just(0x8a_u8), Just(0x0b_u8), Just(0_u8), any::<u8>()], 0..100))
        {
            prop_assert_eq!(find_newline(&buf), buf.iter().position(|&byte| byte == b'\n'));
        }

        #[test]
        fn split_line_bounds(buf in proptest::collection::vec(
            prop_oneof![Just(b'\n'), Just(b'\r'), Just(b'a')], 0..40), line_len_max in 0usize..20)
        {
            match split_line(&buf, line_len_max) {
                Decoded::Incomplete => {
                    prop_assert!(!buf.contains(&b'\n'));
                    prop_assert!(buf.len() <= line_len_max + 1);
                }
                Decoded::LineTooLong => {
                    let end = buf.iter().position(|&byte| byte == b'\n').unwrap_or(buf.len());
                    let line = &buf[..end];
                    let line = if end < buf.len() { line.strip_suffix(b"\r").unwrap_or(line) } else { line };
                    let awaiting_lf = end == buf.len() && line.len() == line_len_max + 1 && line.ends_with(b"\r");
                    prop_assert!(line.len() > line_len_max && !awaiting_lf);
                }
                Decoded::Line { consumed, item } => {
                    prop_assert!(consumed >= 1 && consumed <= buf.len());
                    prop_assert_eq!(buf[consumed - 1], b'\n');
                    prop_assert!(!buf[..consumed - 1].contains(&b'\n'));
                    prop_assert!(item.len() <= line_len_max);
                    let expected = &buf[..consumed - 1];
                    prop_assert_eq!(item, expected.strip_suffix(b"\r").unwrap_or(expected));
                }
            }
        }
    }
}
