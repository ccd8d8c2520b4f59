//! Just enough RESP (the Redis protocol) for a lock workload: commands as
//! arrays of bulk strings, and the five reply kinds Redis 7 sends to them.

use ringlock_proto::{Decoded, write_u64};

/// Longest reply header or simple line accepted, in bytes.
const LINE_LEN_MAX: usize = 64 << 10;

/// One reply, borrowing from the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RespValue<'a> {
    /// `+text`
    Simple(&'a [u8]),
    /// `-text`
    Error(&'a [u8]),
    /// `:n`
    Integer(i64),
    /// `$n` followed by n bytes.
    Bulk(&'a [u8]),
    /// `$-1`, `*-1` or RESP3 `_`.
    Nil,
}

/// A reply that is not one of the kinds above, or not well formed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RespError;

/// Appends a command: an array of bulk strings.
pub fn encode_command(args: &[&[u8]], out: &mut Vec<u8>) {
    out.push(b'*');
    write_u64(args.len() as u64, out);
    out.extend_from_slice(b"\r\n");
    for arg in args {
        out.push(b'$');
        write_u64(arg.len() as u64, out);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// Decodes the first reply of `buf`.
pub fn decode(buf: &[u8]) -> Decoded<Result<RespValue<'_>, RespError>> {
    let window = &buf[..buf.len().min(LINE_LEN_MAX)];
    let Some(newline) = window.iter().position(|&byte| byte == b'\n') else {
        return if buf.len() >= LINE_LEN_MAX { Decoded::LineTooLong } else { Decoded::Incomplete };
    };
    let line = &buf[..newline];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let consumed = newline + 1;
    let Some((&kind, body)) = line.split_first() else {
        return Decoded::Line { consumed, item: Err(RespError) };
    };
    let item = match kind {
        b'+' => Ok(RespValue::Simple(body)),
        b'-' => Ok(RespValue::Error(body)),
        b':' => parse_i64(body).map(RespValue::Integer).ok_or(RespError),
        b'_' => Ok(RespValue::Nil),
        b'*' if body == b"-1" => Ok(RespValue::Nil),
        b'$' => {
            if body == b"-1" {
                Ok(RespValue::Nil)
            } else {
                let Some(len) = parse_i64(body).and_then(|len| usize::try_from(len).ok()) else {
                    return Decoded::Line { consumed, item: Err(RespError) };
                };
                if len > LINE_LEN_MAX {
                    return Decoded::LineTooLong;
                }
                if buf.len() < consumed + len + 2 {
                    return Decoded::Incomplete;
                }
                if &buf[consumed + len..consumed + len + 2] != b"\r\n" {
                    return Decoded::Line { consumed: consumed + len + 2, item: Err(RespError) };
                }
                return Decoded::Line {
                    consumed: consumed + len + 2,
                    item: Ok(RespValue::Bulk(&buf[consumed..consumed + len])),
                };
            }
        }
        _ => Err(RespError),
    };
    Decoded::Line { consumed, item }
}

fn parse_i64(field: &[u8]) -> Option<i64> {
    let (negative, digits) = match field.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, field),
    };
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let value = digits.iter().fold(0i64, |value, &digit| value * 10 + i64::from(digit - b'0'));
    Some(if negative { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(buf: &[u8]) -> (usize, RespValue<'_>) {
        match decode(buf) {
            Decoded::Line { consumed, item: Ok(value) } => (consumed, value),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode_command(&[b"SET", b"k1", b"77", b"NX", b"PX", b"30000"], &mut out);
        assert_eq!(out, b"*6\r\n$3\r\nSET\r\n$2\r\nk1\r\n$2\r\n77\r\n$2\r\nNX\r\n$2\r\nPX\r\n$5\r\n30000\r\n");
    }

    #[test]
    fn replies_of_every_kind() {
        assert_eq!(one(b"+OK\r\n:1\r\n"), (5, RespValue::Simple(b"OK")));
        assert_eq!(one(b":0\r\n"), (4, RespValue::Integer(0)));
        assert_eq!(one(b":-12\r\n"), (6, RespValue::Integer(-12)));
        assert_eq!(one(b"$-1\r\n"), (5, RespValue::Nil));
        assert_eq!(one(b"_\r\n"), (3, RespValue::Nil));
        assert_eq!(one(b"-NOSCRIPT No matching script\r\n").1, RespValue::Error(b"NOSCRIPT No matching script"));
        assert_eq!(one(b"$3\r\nabc\r\n+OK\r\n"), (9, RespValue::Bulk(b"abc")));
    }

    #[test]
    fn partial_replies_wait() {
        assert_eq!(decode(b"+OK"), Decoded::Incomplete);
        assert_eq!(decode(b"$3\r\nab"), Decoded::Incomplete);
        assert_eq!(decode(b"$3\r\nabc\r"), Decoded::Incomplete);
    }

    #[test]
    fn malformed_replies_are_errors() {
        assert!(matches!(decode(b"?x\r\n"), Decoded::Line { item: Err(_), .. }));
        assert!(matches!(decode(b":x\r\n"), Decoded::Line { item: Err(_), .. }));
        assert!(matches!(decode(b"\r\n"), Decoded::Line { item: Err(_), .. }));
    }
}
