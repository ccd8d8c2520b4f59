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
/// use ringlock_client::proto::parse_u64;
///
/// assert_eq!(parse_u64(b"42"), Some(42));
/// assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
/// assert_eq!(parse_u64(b"18446744073709551616"), None);
/// assert_eq!(parse_u64(b"+1"), None);
/// assert_eq!(parse_u64(b""), None);
/// ```
pub fn parse_u64(field: &[u8]) -> Option<u64> {
    if field.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    for &byte in field {
        let digit = digit_value(byte)?;
        value = value.checked_mul(10)?.checked_add(digit)?;
    }
    Some(value)
}

/// Most decimal digits a `u64` has (`u64::MAX` has 20).
const U64_DIGITS_MAX: usize = 20;

/// Appends `value` in decimal, without leading zeros (`0` is written `0`).
///
/// # Examples
///
/// ```
/// use ringlock_client::proto::write_u64;
///
/// let mut out = Vec::new();
/// write_u64(1234, &mut out);
/// assert_eq!(out, b"1234");
/// ```
pub fn write_u64(value: u64, out: &mut Vec<u8>) {
    let len = decimal_len(value);
    // The number is written right-aligned to end at `U64_DIGITS_MAX`, in
    // groups of eight digits whose quotients do not depend on each other
    // (instead of one long chain of divisions), two digits per table load.
    // The padding after it lets the number be appended as a copy of a fixed
    // size, with no call, then cut to `len`.
    let mut digits = [b'0'; 2 * U64_DIGITS_MAX];
    write_eight_digits((value % 100_000_000) as u32, &mut digits[12..20]);
    if value >= 100_000_000 {
        let high = value / 100_000_000;
        write_eight_digits((high % 100_000_000) as u32, &mut digits[4..12]);
        // At most 1844: four digits.
        write_four_digits((high / 100_000_000) as u32, &mut digits[..4]);
    }
    let start = U64_DIGITS_MAX - len;
    let window: &[u8; U64_DIGITS_MAX] = digits[start..start + U64_DIGITS_MAX].try_into().expect("within the buffer");
    let end = out.len() + len;
    out.extend_from_slice(window);
    out.truncate(end);
}

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

/// Writes `value` (below `10^8`) as eight digits with leading zeros.
#[inline(always)]
fn write_eight_digits(value: u32, out: &mut [u8]) {
    write_four_digits(value / 10_000, &mut out[..4]);
    write_four_digits(value % 10_000, &mut out[4..8]);
}

/// Writes `value` (below `10^4`) as four digits with leading zeros.
#[inline(always)]
fn write_four_digits(value: u32, out: &mut [u8]) {
    let high = (value / 100) as usize * 2;
    let low = (value % 100) as usize * 2;
    out[..2].copy_from_slice(&DIGIT_PAIRS[high..high + 2]);
    out[2..4].copy_from_slice(&DIGIT_PAIRS[low..low + 2]);
}

/// `00`, `01`, ... `99`: two digits per division by 100 halves the
/// divisions of writing a number.
const DIGIT_PAIRS: [u8; 200] = {
    let mut pairs = [0u8; 200];
    let mut value = 0;
    while value < 100 {
        pairs[value * 2] = b'0' + (value / 10) as u8;
        pairs[value * 2 + 1] = b'0' + (value % 10) as u8;
        value += 1;
    }
    pairs
};

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
/// use ringlock_client::proto::parse_seconds_ms;
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

/// Appends `ms` as the shortest decimal seconds that [`parse_seconds_ms`]
/// reads back exactly: at most three fractional digits, no trailing zeros,
/// and no `.` for whole seconds.
///
/// # Examples
///
/// ```
/// use ringlock_client::proto::write_seconds;
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
    use crate::proto::WAIT_MS_MAX;
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
