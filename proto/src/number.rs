//! Numbers on the wire: decimal `u64` (tokens, epochs) and decimal seconds
//! with at most three fractional digits (leases, waits).
//!
//! These are hand-written rather than built on `str::parse` because the wire
//! is bytes, not UTF-8, and because the grammar is narrower than Rust's: no
//! sign, no exponent, no leading or trailing `.`. Parsing never allocates and
//! never panics, whatever the input.

/// Parses a field of decimal digits as a `u64`.
///
/// Returns `None` if the field is empty, holds anything other than the ASCII
/// digits `0`-`9` (no sign, no spaces), or does not fit in a `u64`. Leading
/// zeros are accepted, since they do not change the value.
///
/// # Examples
///
/// ```
/// use ringlock_proto::parse_u64;
///
/// assert_eq!(parse_u64(b"42"), Some(42));
/// assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
/// assert_eq!(parse_u64(b"18446744073709551616"), None);
/// assert_eq!(parse_u64(b"+1"), None);
/// assert_eq!(parse_u64(b""), None);
/// ```
pub fn parse_u64(field: &[u8]) -> Option<u64> {
    // Only leading zeros can make a `u64` longer than 20 digits; skipping
    // them (but the last) leaves a field `parse_u64_prefix` reads whole.
    let digits = if field.len() > U64_DIGITS_MAX {
        let zeros = field.iter().take_while(|&&byte| byte == b'0').count();
        &field[zeros.min(field.len() - 1)..]
    } else {
        field
    };
    match parse_u64_prefix(digits) {
        Some((value, len)) if len == digits.len() => Some(value),
        _ => None,
    }
}

/// Most decimal digits a `u64` has (`u64::MAX` has 20).
const U64_DIGITS_MAX: usize = 20;

/// Reads the decimal digits at the front of `bytes`, at most 20 of them, and
/// returns their value and how many there were. The caller checks the byte
/// after them: a 21st digit there means a number this does not read.
///
/// `None` if `bytes` does not start with a digit, or if 20 digits overflow.
/// Nineteen digits always fit in a `u64`, so only the 20th is checked.
#[inline(always)]
pub(crate) fn parse_u64_prefix(bytes: &[u8]) -> Option<(u64, usize)> {
    let (mut value, mut len) = read_digits(bytes, U64_DIGITS_MAX - 1);
    if len == 0 {
        return None;
    }
    if len == U64_DIGITS_MAX - 1
        && let Some(digit) = bytes.get(len).and_then(|&byte| digit_value(byte))
    {
        value = value.checked_mul(10)?.checked_add(digit)?;
        len += 1;
    }
    Some((value, len))
}

/// Reads the decimal digits at the front of `bytes`, at most `len_max` of
/// them (at most 19, so that their value fits), and returns their value and
/// how many there were (0 if `bytes` does not start with a digit).
///
/// It reads eight bytes at a time while eight more digits may follow, then
/// one at a time.
#[inline(always)]
fn read_digits(bytes: &[u8], len_max: usize) -> (u64, usize) {
    debug_assert!(len_max < U64_DIGITS_MAX);
    let mut value: u64 = 0;
    let mut len = 0;
    while len + 8 <= len_max {
        let Some(word) = bytes.get(len..).and_then(<[u8]>::first_chunk::<8>) else { break };
        let (word_value, word_len) = leading_digits_of_word(word);
        value = value * POWERS_OF_TEN[word_len] + word_value;
        len += word_len;
        if word_len < 8 {
            return (value, len);
        }
    }
    while len < len_max {
        let Some(digit) = bytes.get(len).and_then(|&byte| digit_value(byte)) else { break };
        value = value * 10 + digit;
        len += 1;
    }
    (value, len)
}

/// `10^n` for `n` in `0..=8`.
const POWERS_OF_TEN: [u64; 9] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000];

/// The value and count of the decimal digits that `word` starts with (0 to 8).
#[inline(always)]
fn leading_digits_of_word(word: &[u8; 8]) -> (u64, usize) {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // In little-endian order the first byte is the lowest. XOR with `0`
    // maps the digits, and only them, to the byte values 0 to 9.
    let values = u64::from_le_bytes(*word) ^ (ONES * u64::from(b'0'));
    // A byte is not a digit if its value is over 9: adding 0x76 to its low
    // seven bits sets its high bit (with no carry into the next byte), or
    // its own high bit is set.
    let not_digits = (((values & !HIGHS).wrapping_add(ONES * 0x76)) | values) & HIGHS;
    let len = (not_digits.trailing_zeros() / 8) as usize;
    if len == 0 {
        return (0, 0);
    }
    // Shifting the digits to the top of the word drops the bytes after them
    // and brings in zero bytes before them: leading zeros.
    let digits = values << (64 - 8 * len);
    (eight_digits(digits), len)
}

/// The value of eight digit values (0 to 9) in the bytes of `digits`, the
/// first (lowest) byte the most significant: three multiplications instead of
/// eight.
#[inline(always)]
fn eight_digits(digits: u64) -> u64 {
    // Each even byte becomes the two-digit number of itself and the next.
    let pairs = digits.wrapping_mul(10).wrapping_add(digits >> 8);
    // Pairs 0 and 2 (bytes 0 and 4) and pairs 1 and 3 (bytes 2 and 6), each
    // scaled to its place; the sum lands in the high 32 bits.
    const PAIRS_0_2: u64 = 0x0000_00ff_0000_00ff;
    let high = (pairs & PAIRS_0_2).wrapping_mul(100 + (1_000_000 << 32));
    let low = ((pairs >> 16) & PAIRS_0_2).wrapping_mul(1 + (10_000 << 32));
    high.wrapping_add(low) >> 32
}

/// Appends `value` in decimal, without leading zeros (`0` is written `0`).
///
/// # Examples
///
/// ```
/// use ringlock_proto::write_u64;
///
/// let mut out = Vec::new();
/// write_u64(1234, &mut out);
/// assert_eq!(out, b"1234");
/// ```
pub fn write_u64(value: u64, out: &mut Vec<u8>) {
    let start = out.len();
    // Room of a fixed size is appended from a constant, the digits are
    // stored into it word by word, and it is cut to their length: no call,
    // and no bytes stored in pieces and read back whole (see `DecimalWindow`).
    out.extend_from_slice(&[0; DIGITS_WINDOW]);
    let window = decimal_window(value);
    window.store(out[start..].first_chunk_mut().expect("room was appended"));
    out.truncate(start + window.len);
}

/// A number's decimal digits as the first bytes of three little-endian
/// words, with zeros after them, and how many digits there are.
///
/// The words stay in registers until the caller stores them where the digits
/// go. A window built in a byte array on the stack and then copied would be
/// stored in 8-byte pieces and read back in 16-byte loads that straddle them,
/// which the processor cannot forward from its store buffer: every such load
/// waits for the stores to reach the cache (a profile of the server at
/// saturation had the reply encoder as its hottest function for this alone).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DecimalWindow {
    words: [u64; 3],
    pub(crate) len: usize,
}

impl DecimalWindow {
    /// Stores the whole window, its digits first: `len` bytes of digits,
    /// then zeros.
    #[inline(always)]
    pub(crate) fn store(self, out: &mut [u8; DIGITS_WINDOW]) {
        for (chunk, word) in out.chunks_exact_mut(8).zip(self.words) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
    }
}

/// `value` in decimal, as a [`DecimalWindow`].
#[inline(always)]
pub(crate) fn decimal_window(value: u64) -> DecimalWindow {
    let len = decimal_len(value);
    // Each group of eight digits is one word, its first digit in the lowest
    // byte. The quotients by 10^8 do not depend on each other's digits.
    let word = |group: u64| u64::from_le_bytes(eight_digits_ascii(group as u32));
    let low = word(value % 100_000_000);
    // The number is the last `len` bytes of its groups written in order;
    // shifting the groups right by the bytes before it (little-endian, so
    // towards the first byte) brings its first digit to byte 0 and zeros in
    // after its last.
    let words = if len <= 8 {
        [low >> (8 * (8 - len)), 0, 0]
    } else {
        let high = value / 100_000_000;
        let middle = word(high % 100_000_000);
        if len <= 16 {
            let pair = (u128::from(middle) | u128::from(low) << 64) >> (8 * (16 - len));
            [pair as u64, (pair >> 64) as u64, 0]
        } else {
            // At most 1844 above 10^16: 17 to 20 digits, a shift of 4 to 7 bytes.
            let top = word(high / 100_000_000);
            let shift = 8 * (24 - len);
            let pair = (u128::from(top) | u128::from(middle) << 64) >> shift | u128::from(low) << (128 - shift);
            [pair as u64, (pair >> 64) as u64, low >> shift]
        }
    };
    DecimalWindow { words, len }
}

/// Three words of eight digits: room for the 20 digits of a `u64`.
pub(crate) const DIGITS_WINDOW: usize = 24;

/// How many decimal digits `value` has (1 for 0).
#[inline(always)]
fn decimal_len(value: u64) -> usize {
    // `bits * 1233 / 4096` (1233 / 4096 is just over log10(2)) is the digit
    // count or one less; one comparison tells which. `value | 1` has as many
    // digits as `value` and at least one bit.
    let value = value | 1;
    let bits = 64 - value.leading_zeros();
    let guess = ((bits * 1233) >> 12) as usize;
    guess + usize::from(value >= POWERS_OF_TEN_U64[guess])
}

/// `10^n` for `n` in `0..=19`, every power of ten a `u64` holds.
const POWERS_OF_TEN_U64: [u64; 20] = {
    let mut powers = [1u64; 20];
    let mut index = 1;
    while index < powers.len() {
        powers[index] = powers[index - 1] * 10;
        index += 1;
    }
    powers
};

/// `value` (below `10^8`) as eight ASCII digits with leading zeros, the most
/// significant first: the building block of [`write_u64`], for callers that
/// write fixed-width numbers (zero-padded keys, for one).
///
/// All eight are computed at once in the lanes of one `u64`: a split into two
/// 4-digit halves (32-bit lanes), each divided by 100 (16-bit lanes), each of
/// those by 10 (bytes), with multiplications by reciprocals that are exact in
/// these ranges. That is about a dozen instructions, where a digit at a time
/// (or a pair from a table) costs a division or a load per step.
///
/// # Examples
///
/// ```
/// use ringlock_proto::eight_digits_ascii;
///
/// assert_eq!(&eight_digits_ascii(1234), b"00001234");
/// assert_eq!(&eight_digits_ascii(99_999_999), b"99999999");
/// ```
#[inline(always)]
pub fn eight_digits_ascii(value: u32) -> [u8; 8] {
    debug_assert!(value < 100_000_000);
    // In little-endian order the first byte is the lowest, so the first
    // digits go in the low lanes.
    let halves = u64::from(value / 10_000) | u64::from(value % 10_000) << 32;
    // `x * 10486 >> 20` is `x / 100` for every `x` below 10^4, and the
    // product stays inside its 32-bit lane.
    const LOW_7_BITS_OF_32: u64 = 0x7f | 0x7f << 32;
    let hundreds = ((halves * 10_486) >> 20) & LOW_7_BITS_OF_32;
    let pairs = ((halves - 100 * hundreds) << 16) | hundreds;
    // `x * 103 >> 10` is `x / 10` for every `x` below 100, inside its 16-bit lane.
    const LOW_4_BITS_OF_16: u64 = 0x000f_000f_000f_000f;
    let tens = ((pairs * 103) >> 10) & LOW_4_BITS_OF_16;
    let digits = tens | ((pairs - 10 * tens) << 8);
    (digits | u64::from_ne_bytes([b'0'; 8])).to_le_bytes()
}

/// Parses decimal seconds (`30`, `0.5`, `2.125`) into milliseconds.
///
/// The grammar is one or more ASCII digits, optionally followed by `.` and one
/// to three digits. Returns `None` for anything else: an empty field, a sign,
/// an exponent, a leading `.` (`.5`), a trailing `.` (`5.`) or more than three
/// fractional digits (`1.2345`), since the server works in whole milliseconds
/// and would otherwise have to round silently.
///
/// A well-formed value too large for a `u64` of milliseconds **saturates** to
/// `u64::MAX` instead of returning `None`. It stays well-formed, just out of
/// every range a caller checks, so callers can tell "not a number" from "too
/// large" and a huge digit string costs one pass, with no overflow.
///
/// # Examples
///
/// ```
/// use ringlock_proto::parse_seconds_ms;
///
/// assert_eq!(parse_seconds_ms(b"30"), Some(30_000));
/// assert_eq!(parse_seconds_ms(b"0.5"), Some(500));
/// assert_eq!(parse_seconds_ms(b"2.125"), Some(2_125));
/// assert_eq!(parse_seconds_ms(b".5"), None);
/// assert_eq!(parse_seconds_ms(b"1.2345"), None);
/// assert_eq!(parse_seconds_ms(b"99999999999999999999999"), Some(u64::MAX));
/// ```
pub fn parse_seconds_ms(field: &[u8]) -> Option<u64> {
    let (whole, fraction) = match field.iter().position(|&byte| byte == b'.') {
        Some(dot) => (&field[..dot], Some(&field[dot + 1..])),
        None => (field, None),
    };
    if whole.is_empty() {
        return None;
    }
    let mut seconds: u64 = 0;
    for &byte in whole {
        let digit = digit_value(byte)?;
        seconds = seconds.saturating_mul(10).saturating_add(digit);
    }
    let mut fraction_ms: u64 = 0;
    if let Some(fraction) = fraction {
        if fraction.is_empty() || fraction.len() > 3 {
            return None;
        }
        // Scale each digit to its place: tenths are 100 ms, hundredths 10 ms.
        let mut place_ms = 100;
        for &byte in fraction {
            fraction_ms += digit_value(byte)? * place_ms;
            place_ms /= 10;
        }
    }
    Some(seconds.saturating_mul(1000).saturating_add(fraction_ms))
}

/// Most whole-second digits [`parse_seconds_prefix`] reads: 16 digits of
/// seconds and three of milliseconds always fit in a `u64` of milliseconds.
const SECONDS_DIGITS_MAX: usize = 16;

/// Reads decimal seconds at the front of `bytes` (the grammar of
/// [`parse_seconds_ms`]) and returns the milliseconds and how many bytes they
/// took. The caller checks the byte after them: a digit there (a 17th whole
/// or 4th fractional digit) means a number this does not read.
///
/// `None` if `bytes` does not start with a digit, or has a `.` not followed
/// by one. No value read here saturates, so it agrees with
/// [`parse_seconds_ms`] on every field it reads whole.
#[inline(always)]
pub(crate) fn parse_seconds_prefix(bytes: &[u8]) -> Option<(u64, usize)> {
    // Seconds are short (`30`, `0.5`): a word at a time would cost more.
    let mut seconds: u64 = 0;
    let mut len = 0;
    while len < SECONDS_DIGITS_MAX {
        let Some(digit) = bytes.get(len).and_then(|&byte| digit_value(byte)) else { break };
        seconds = seconds * 10 + digit;
        len += 1;
    }
    if len == 0 {
        return None;
    }
    let mut ms = seconds * 1000;
    if bytes.get(len) == Some(&b'.') {
        const PLACE_MS: [u64; 3] = [100, 10, 1];
        let fraction = &bytes[len + 1..];
        let mut fraction_len = 0;
        while fraction_len < PLACE_MS.len() {
            let Some(digit) = fraction.get(fraction_len).and_then(|&byte| digit_value(byte)) else { break };
            ms += digit * PLACE_MS[fraction_len];
            fraction_len += 1;
        }
        if fraction_len == 0 {
            return None;
        }
        len += 1 + fraction_len;
    }
    Some((ms, len))
}

/// Appends `ms` as the shortest decimal seconds that [`parse_seconds_ms`]
/// reads back exactly: at most three fractional digits, no trailing zeros,
/// and no `.` for whole seconds.
///
/// # Examples
///
/// ```
/// use ringlock_proto::write_seconds;
///
/// let mut out = Vec::new();
/// for ms in [30_000, 500, 2_125, 1_010, 0] {
///     write_seconds(ms, &mut out);
///     out.push(b' ');
/// }
/// assert_eq!(out, b"30 0.5 2.125 1.01 0 ");
/// ```
pub fn write_seconds(ms: u64, out: &mut Vec<u8>) {
    write_u64(ms / 1000, out);
    let fraction_ms = (ms % 1000) as u16;
    if fraction_ms == 0 {
        return;
    }
    let digits =
        [b'0' + (fraction_ms / 100) as u8, b'0' + (fraction_ms / 10 % 10) as u8, b'0' + (fraction_ms % 10) as u8];
    let len = if digits[2] != b'0' {
        3
    } else if digits[1] != b'0' {
        2
    } else {
        1
    };
    out.push(b'.');
    out.extend_from_slice(&digits[..len]);
}

/// The value of one ASCII digit, or `None` for any other byte.
fn digit_value(byte: u8) -> Option<u64> {
    let digit = byte.wrapping_sub(b'0');
    if digit <= 9 { Some(u64::from(digit)) } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WAIT_MS_MAX;
    use proptest::prelude::*;

    fn seconds(ms: u64) -> Vec<u8> {
        let mut out = Vec::new();
        write_seconds(ms, &mut out);
        out
    }

    fn decimal(value: u64) -> Vec<u8> {
        let mut out = Vec::new();
        write_u64(value, &mut out);
        out
    }

    #[test]
    fn parse_u64_accepts_digits_up_to_max() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"7"), Some(7));
        assert_eq!(parse_u64(b"007"), Some(7));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"000000000000000000000000018446744073709551615"), Some(u64::MAX));
    }

    #[test]
    fn parse_u64_rejects_overflow_and_non_digits() {
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b"99999999999999999999999"), None);
        for field in [&b""[..], b"-1", b"+1", b" 1", b"1 ", b"1.0", b"1e3", b"0x10", b"\0", b"\xff"] {
            assert_eq!(parse_u64(field), None, "{:?}", field);
        }
    }

    #[test]
    fn write_u64_writes_shortest_decimal() {
        assert_eq!(decimal(0), b"0");
        assert_eq!(decimal(10), b"10");
        assert_eq!(decimal(u64::MAX), b"18446744073709551615");
    }

    #[test]
    fn write_u64_at_every_digit_count() {
        for power in POWERS_OF_TEN_U64 {
            for value in [power - 1, power, power + 1, power.saturating_mul(2), power.saturating_mul(9)] {
                assert_eq!(decimal(value), value.to_string().into_bytes(), "{value}");
                assert_eq!(decimal_len(value), value.to_string().len(), "{value}");
            }
        }
        for value in [u64::MAX, u64::MAX - 1, 99_999_999, 100_000_000, 1_844_674_407_370_955_161] {
            assert_eq!(decimal(value), value.to_string().into_bytes(), "{value}");
        }
    }

    #[test]
    fn eight_digits_ascii_at_the_edges_of_its_lanes() {
        for value in [0, 1, 9, 10, 99, 100, 9_999, 10_000, 10_001, 999_999, 1_000_000, 99_999_999, 12_345_678] {
            assert_eq!(eight_digits_ascii(value), *format!("{value:08}").as_bytes().first_chunk::<8>().unwrap());
        }
    }

    #[test]
    fn parse_seconds_prefix_needs_a_digit_after_the_dot() {
        assert_eq!(parse_seconds_prefix(b"00."), None);
        assert_eq!(parse_seconds_prefix(b"00. "), None);
        assert_eq!(parse_seconds_prefix(b"00.5 "), Some((500, 4)));
        assert_eq!(parse_seconds_prefix(b"30 10"), Some((30_000, 2)));
    }

    #[test]
    fn decimal_window_is_the_digits_then_zeros() {
        for power in POWERS_OF_TEN_U64 {
            for value in [power - 1, power, power + 1, power.saturating_mul(9).saturating_add(power - 1), u64::MAX] {
                let window = decimal_window(value);
                let mut stored = [0xff; DIGITS_WINDOW];
                window.store(&mut stored);
                assert_eq!(&stored[..window.len], value.to_string().as_bytes());
                assert!(stored[window.len..].iter().all(|&byte| byte == 0), "{value}: {stored:?}");
            }
        }
    }

    #[test]
    fn write_u64_appends() {
        let mut out = b"x=".to_vec();
        write_u64(5, &mut out);
        assert_eq!(out, b"x=5");
    }

    #[test]
    fn parse_seconds_accepts_up_to_three_fractional_digits() {
        assert_eq!(parse_seconds_ms(b"0"), Some(0));
        assert_eq!(parse_seconds_ms(b"30"), Some(30_000));
        assert_eq!(parse_seconds_ms(b"0.5"), Some(500));
        assert_eq!(parse_seconds_ms(b"0.05"), Some(50));
        assert_eq!(parse_seconds_ms(b"0.005"), Some(5));
        assert_eq!(parse_seconds_ms(b"2.125"), Some(2_125));
        assert_eq!(parse_seconds_ms(b"2.500"), Some(2_500));
        assert_eq!(parse_seconds_ms(b"007.0"), Some(7_000));
        assert_eq!(parse_seconds_ms(b"86400"), Some(86_400_000));
    }

    #[test]
    fn parse_seconds_rejects_malformed() {
        for field in [
            &b""[..],
            b".",
            b".5",
            b"5.",
            b"1.2345",
            b"+5",
            b"-5",
            b"1e3",
            b"1E3",
            b"1.5e1",
            b"1..5",
            b"1.2.3",
            b" 1",
            b"1 ",
            b"0x1",
            b"inf",
            b"NaN",
            b"1,5",
            b"\xff",
        ] {
            assert_eq!(parse_seconds_ms(field), None, "{:?}", String::from_utf8_lossy(field));
        }
    }

    #[test]
    fn parse_seconds_saturates_huge_values() {
        assert_eq!(parse_seconds_ms(b"99999999999999999999999"), Some(u64::MAX));
        assert_eq!(parse_seconds_ms(b"99999999999999999999999.999"), Some(u64::MAX));
        // The largest value that fits exactly is not saturated, one more is.
        assert_eq!(parse_seconds_ms(b"18446744073709551.615"), Some(u64::MAX));
        assert_eq!(parse_seconds_ms(b"18446744073709551.614"), Some(u64::MAX - 1));
        assert_eq!(parse_seconds_ms(b"18446744073709552"), Some(u64::MAX));
        let long = vec![b'9'; 1024];
        assert_eq!(parse_seconds_ms(&long), Some(u64::MAX));
        // A malformed tail still makes a huge value malformed.
        assert_eq!(parse_seconds_ms(b"99999999999999999999999.1234"), None);
    }

    #[test]
    fn write_seconds_is_shortest() {
        assert_eq!(seconds(0), b"0");
        assert_eq!(seconds(1), b"0.001");
        assert_eq!(seconds(10), b"0.01");
        assert_eq!(seconds(100), b"0.1");
        assert_eq!(seconds(500), b"0.5");
        assert_eq!(seconds(1_010), b"1.01");
        assert_eq!(seconds(2_125), b"2.125");
        assert_eq!(seconds(30_000), b"30");
        assert_eq!(seconds(u64::MAX), b"18446744073709551.615");
    }

    proptest! {
        #[test]
        fn seconds_round_trip_in_wait_range(ms in 0..=WAIT_MS_MAX) {
            prop_assert_eq!(parse_seconds_ms(&seconds(ms)), Some(ms));
        }

        #[test]
        fn seconds_round_trip_any_u64(ms in any::<u64>()) {
            let text = seconds(ms);
            prop_assert_eq!(parse_seconds_ms(&text), Some(ms));
            prop_assert!(text.last() != Some(&b'0') || !text.contains(&b'.'));
        }

        #[test]
        fn eight_digits_ascii_pads_with_zeros(value in 0..100_000_000u32) {
            prop_assert_eq!(eight_digits_ascii(value), *format!("{value:08}").as_bytes().first_chunk::<8>().unwrap());
        }

        #[test]
        fn u64_round_trip(value in any::<u64>()) {
            let text = decimal(value);
            prop_assert_eq!(parse_u64(&text), Some(value));
            prop_assert_eq!(text, value.to_string().into_bytes());
        }

        #[test]
        fn parse_u64_agrees_with_std(field in proptest::collection::vec(any::<u8>(), 0..24)) {
            let expected = std::str::from_utf8(&field)
                .ok()
                .filter(|text| text.bytes().all(|byte| byte.is_ascii_digit()))
                .and_then(|text| text.parse::<u64>().ok());
            prop_assert_eq!(parse_u64(&field), expected);
        }

        #[test]
        fn parse_u64_of_digit_strings(zeros in 0..30usize, digits in "[0-9]{1,22}") {
            let field = format!("{}{digits}", "0".repeat(zeros));
            let expected = digits.parse::<u128>().ok().and_then(|value| u64::try_from(value).ok());
            prop_assert_eq!(parse_u64(field.as_bytes()), expected);
        }

        #[test]
        fn parse_u64_prefix_reads_the_leading_digits(
            digits in "[0-9]{0,24}",
            suffix in proptest::collection::vec(any::<u8>(), 0..12),
        ) {
            let mut bytes = digits.clone().into_bytes();
            bytes.extend_from_slice(&suffix);
            let leading = bytes.iter().take_while(|byte| byte.is_ascii_digit()).count();
            // It reads at most 20 digits, and none if they overflow.
            let read = leading.min(U64_DIGITS_MAX);
            let expected = std::str::from_utf8(&bytes[..read])
                .unwrap()
                .parse::<u128>()
                .ok()
                .and_then(|value| u64::try_from(value).ok())
                .map(|value| (value, read));
            prop_assert_eq!(parse_u64_prefix(&bytes), expected);
        }

        #[test]
        fn leading_digits_of_a_word(word in proptest::array::uniform8(prop_oneof![
            4 => b'0'..=b'9',
            1 => proptest::sample::select(vec![0x00, 0x20, 0x2e, 0x2f, 0x3a, 0x7f, 0x80, 0xb0, 0xb9, 0xff]),
            1 => any::<u8>(),
        ])) {
            let len = word.iter().take_while(|byte| byte.is_ascii_digit()).count();
            let value = word[..len].iter().fold(0u64, |value, &byte| value * 10 + u64::from(byte - b'0'));
            prop_assert_eq!(leading_digits_of_word(&word), (value, len));
        }

        #[test]
        fn parse_seconds_prefix_agrees_with_parse_seconds_ms(
            whole in "[0-9]{0,18}",
            fraction in proptest::option::of("[0-9]{0,4}"),
            suffix in proptest::collection::vec(any::<u8>(), 0..4),
        ) {
            let mut field = whole.clone().into_bytes();
            if let Some(fraction) = &fraction {
                field.push(b'.');
                field.extend_from_slice(fraction.as_bytes());
            }
            let mut bytes = field.clone();
            bytes.extend_from_slice(&suffix);
            match parse_seconds_prefix(&bytes) {
                // What it reads whole is a field of the grammar, with the
                // value `parse_seconds_ms` gives it.
                Some((ms, len)) => {
                    prop_assert!(len >= 1 && len <= bytes.len());
                    prop_assert_eq!(parse_seconds_ms(&bytes[..len]), Some(ms));
                }
                // Only no digit, or a `.` with no digit after it, is nothing.
                // The digits are counted in the bytes, not in `whole`: the
                // suffix may go on with more of them (`0` then `0.`).
                None => {
                    let digits = bytes.iter().take_while(|byte| byte.is_ascii_digit()).count();
                    let dot_alone = digits <= SECONDS_DIGITS_MAX
                        && bytes.get(digits) == Some(&b'.')
                        && !bytes.get(digits + 1).is_some_and(u8::is_ascii_digit);
                    prop_assert!(digits == 0 || dot_alone);
                }
            }
            // It reads every well-formed field of at most 16 whole digits.
            let ends = !matches!(suffix.first(), Some(byte) if byte.is_ascii_digit() || *byte == b'.');
            if ends && whole.len() <= SECONDS_DIGITS_MAX && let Some(ms) = parse_seconds_ms(&field) {
                prop_assert_eq!(parse_seconds_prefix(&bytes), Some((ms, field.len())));
            }
        }

        #[test]
        fn parse_seconds_never_panics(field in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = parse_seconds_ms(&field);
        }

        #[test]
        fn parse_seconds_matches_digit_grammar(whole in "[0-9]{1,12}", fraction in "[0-9]{0,5}") {
            let text = if fraction.is_empty() { whole.clone() } else { format!("{whole}.{fraction}") };
            let parsed = parse_seconds_ms(text.as_bytes());
            if fraction.len() > 3 {
                prop_assert_eq!(parsed, None);
            } else {
                let padded = format!("{fraction:0<3}");
                let expected = whole.parse::<u64>().unwrap() * 1000 + padded.parse::<u64>().unwrap();
                prop_assert_eq!(parsed, Some(expected));
            }
        }
    }
}
