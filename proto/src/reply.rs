//! Replies: what a server sends, and how a client reads it.

use std::fmt;

use super::key::{copy_short, is_valid_address, is_valid_key};
use super::line::{Decoded, key_field, line_ending_len, split_fields, split_line, token_field};
use super::number::{DIGITS_WINDOW, decimal_window, parse_u64, write_u64};
use super::{ErrorCode, KEY_LEN_MAX, Op, REPLY_LINE_LEN_MAX};

/// The role of a node in its cluster, as a `P` reply reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The node serves locks.
    Active,
    /// The node follows the active and answers lock requests with `M`.
    Standby,
}

impl Role {
    /// The role's name on the wire.
    ///
    /// # Examples
    ///
    /// ```
    /// use ringlock_proto::Role;
    ///
    /// assert_eq!(Role::Standby.as_str(), "standby");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Active => "active",
            Role::Standby => "standby",
        }
    }

    /// The role named by a field, if it is exactly `active` or `standby`.
    ///
    /// # Examples
    ///
    /// ```
    /// use ringlock_proto::Role;
    ///
    /// assert_eq!(Role::from_field(b"active"), Some(Role::Active));
    /// assert_eq!(Role::from_field(b"Active"), None);
    /// ```
    pub const fn from_field(field: &[u8]) -> Option<Role> {
        match field {
            b"active" => Some(Role::Active),
            b"standby" => Some(Role::Standby),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One reply, borrowing its fields from the buffer it was decoded from.
///
/// Every reply but `S` echoes what a client needs to pair it with its
/// request: see [`op`](Self::op) and [`key`](Self::key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reply<'a> {
    /// `A <key> <token>`: the key is granted with this fencing token.
    Acquired {
        /// The acquired key.
        key: &'a [u8],
        /// The grant's fencing token.
        token: u64,
    },
    /// `T <key>`: the wait ran out and nothing was granted.
    TimedOut {
        /// The key that was waited for.
        key: &'a [u8],
    },
    /// `R <key>`: the grant was released.
    Released {
        /// The released key.
        key: &'a [u8],
    },
    /// `X <key> <token>`: the grant's lease was extended.
    Extended {
        /// The key whose grant was extended.
        key: &'a [u8],
        /// The grant's fencing token, unchanged.
        token: u64,
    },
    /// `M <op> <key> <addr|->`: this node is not active; send the request to
    /// `active` instead.
    Moved {
        /// The request's operation.
        op: Op,
        /// The request's key.
        key: &'a [u8],
        /// The active node's client address, or `None` (`-`) if this node
        /// knows of no active yet.
        active: Option<&'a [u8]>,
    },
    /// `E <op|-> <key|-> <code>`: the request failed and had no effect.
    Error {
        /// The request's operation, or `None` (`-`) if the line named none.
        op: Option<Op>,
        /// The request's key, or `None` (`-`) if it had no valid key.
        key: Option<&'a [u8]>,
        /// Why; [`ErrorCode::Unknown`] for a code this version does not know,
        /// which encodes as `unknown`.
        code: ErrorCode,
    },
    /// `P <role> <epoch> <addr|->`: the answer to a ping.
    Pong {
        /// The node's role.
        role: Role,
        /// The node's current epoch (0 before it has decided anything).
        epoch: u64,
        /// The active node's client address, or `None` (`-`) if unknown.
        active: Option<&'a [u8]>,
    },
    /// `S <json>`: the node's counters and gauges, as the rest of the line.
    Stats {
        /// One JSON object, not parsed here: at least one byte, no CR or LF.
        json: &'a [u8],
    },
    /// `I <key> <token|-> <lease-left-ms> <waiters>`: the state of a key.
    Inspected {
        /// The key.
        key: &'a [u8],
        /// The holder's fencing token; `None` (`-`) if nobody holds the key.
        token: Option<u64>,
        /// Milliseconds left of the holder's lease; 0 if nobody holds it.
        lease_left_ms: u64,
        /// Acquires queued on the key.
        waiters: u64,
    },
    /// `U <name>`: the connection is authenticated as this name.
    Authenticated {
        /// The name of the auth file's entry: like a key, 1 to 250 bytes.
        name: &'a [u8],
    },
}

impl<'a> Reply<'a> {
    /// The operation of the request this reply answers; `None` only for an
    /// `E - - <code>` about a line that named no operation.
    ///
    /// `A` and `T` answer an acquire, `R` a release, `X` an extend, `P` a
    /// ping, `S` a stats request; `M` and `E` name their operation.
    ///
    /// # Examples
    ///
    /// ```
    /// use ringlock_proto::{Op, Reply};
    ///
    /// assert_eq!(Reply::TimedOut { key: b"k" }.op(), Some(Op::Acquire));
    /// ```
    pub fn op(&self) -> Option<Op> {
        match *self {
            Reply::Acquired { .. } | Reply::TimedOut { .. } => Some(Op::Acquire),
            Reply::Released { .. } => Some(Op::Release),
            Reply::Extended { .. } => Some(Op::Extend),
            Reply::Moved { op, .. } => Some(op),
            Reply::Error { op, .. } => op,
            Reply::Pong { .. } => Some(Op::Ping),
            Reply::Stats { .. } => Some(Op::Stats),
            Reply::Inspected { .. } => Some(Op::Inspect),
            Reply::Authenticated { .. } => Some(Op::Authenticate),
        }
    }

    /// The key of the request this reply answers; `None` for `P`, `S` and an
    /// `E` whose key is `-`.
    ///
    /// A client pairs a reply with the oldest in-flight request that has the
    /// same [`Request::op`](super::Request::op) and
    /// [`Request::key`](super::Request::key).
    ///
    /// # Examples
    ///
    /// ```
    /// use ringlock_proto::Reply;
    ///
    /// assert_eq!(Reply::Released { key: b"k" }.key(), Some(&b"k"[..]));
    /// assert_eq!(Reply::Stats { json: b"{}" }.key(), None);
    /// ```
    pub fn key(&self) -> Option<&'a [u8]> {
        match *self {
            Reply::Acquired { key, .. }
            | Reply::TimedOut { key }
            | Reply::Released { key }
            | Reply::Extended { key, .. }
            | Reply::Inspected { key, .. }
            | Reply::Moved { key, .. } => Some(key),
            Reply::Error { key, .. } => key,
            Reply::Pong { .. } | Reply::Stats { .. } | Reply::Authenticated { .. } => None,
        }
    }
}

/// Why a line is not a valid reply. A client that gets one cannot trust the
/// rest of the stream and should drop the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplyError {
    /// The first field is not one of `A T R X M E P S`.
    UnknownKind,
    /// The reply has too few or too many fields, or an empty one.
    FieldCount,
    /// A key field is not a valid key.
    BadKey,
    /// A token or epoch is not a decimal `u64`.
    BadNumber,
    /// The operation of an `M` or `E` reply is not a known one.
    BadOp,
    /// The role of a `P` reply is neither `active` nor `standby`.
    BadRole,
    /// An address field holds a byte no address may hold.
    BadAddress,
    /// The JSON of an `S` reply is empty or holds a CR.
    BadJson,
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reason = match self {
            ReplyError::UnknownKind => "unknown reply kind",
            ReplyError::FieldCount => "wrong number of fields or an empty field",
            ReplyError::BadKey => "invalid key",
            ReplyError::BadNumber => "token or epoch is not a decimal u64",
            ReplyError::BadOp => "unknown operation",
            ReplyError::BadRole => "role is neither active nor standby",
            ReplyError::BadAddress => "invalid address",
            ReplyError::BadJson => "stats JSON is empty or holds a CR",
        };
        write!(f, "malformed reply from the server: {reason}")
    }
}

impl std::error::Error for ReplyError {}

/// Decodes the first reply line of `buf`, as a client does.
///
/// Lines may be up to [`REPLY_LINE_LEN_MAX`] bytes, so that a large `S`
/// reply fits. Every complete line is consumed, valid or not. The reply
/// borrows from `buf`; nothing is allocated.
///
/// # Examples
///
/// ```
/// use ringlock_proto::{Decoded, Reply, Role, decode_reply};
///
/// let buf = b"A orders/42 1099511627777\nP standby 3 10.0.0.1:7700\n";
/// let Decoded::Line { consumed, item } = decode_reply(buf) else { panic!() };
/// assert_eq!(item, Ok(Reply::Acquired { key: b"orders/42", token: 1_099_511_627_777 }));
/// let Decoded::Line { item, .. } = decode_reply(&buf[consumed..]) else { panic!() };
/// assert_eq!(item, Ok(Reply::Pong { role: Role::Standby, epoch: 3, active: Some(b"10.0.0.1:7700") }));
/// ```
pub fn decode_reply(buf: &[u8]) -> Decoded<Result<Reply<'_>, ReplyError>> {
    if let Some((consumed, reply)) = decode_lock_reply(buf) {
        return Decoded::Line { consumed, item: Ok(reply) };
    }
    split_line(buf, REPLY_LINE_LEN_MAX).map(parse_reply)
}

/// Decodes the first line of `buf` if it is a valid `A`, `R`, `T` or `X`
/// reply, reading each of its bytes once: the fields are checked as they are
/// found, and the line's end is found where its last field ends.
///
/// This is the decoder's fast path: nearly every line a client reads answers
/// a lock request. `None` says nothing about the line (it may be another
/// kind, invalid, incomplete, or valid but of a rarer spelling such as a
/// 21-digit token with leading zeros), and [`split_line`] and
/// [`parse_reply`], which read any line, then decide. So that the two paths
/// never disagree, this accepts only lines that those accept too, and
/// returns the same reply.
#[inline(always)]
fn decode_lock_reply(buf: &[u8]) -> Option<(usize, Reply<'_>)> {
    let (&kind, rest) = buf.split_first()?;
    let (reply, rest) = match kind {
        b'A' => {
            let (key, rest) = key_field(rest)?;
            let (token, rest) = token_field(rest)?;
            (Reply::Acquired { key, token }, rest)
        }
        b'R' => {
            let (key, rest) = key_field(rest)?;
            (Reply::Released { key }, rest)
        }
        b'T' => {
            let (key, rest) = key_field(rest)?;
            (Reply::TimedOut { key }, rest)
        }
        b'X' => {
            let (key, rest) = key_field(rest)?;
            let (token, rest) = token_field(rest)?;
            (Reply::Extended { key, token }, rest)
        }
        _ => return None,
    };
    // A kind, a key of at most `KEY_LEN_MAX` bytes and a 20-digit token are
    // far below `REPLY_LINE_LEN_MAX`: no length check is needed.
    const _: () = assert!(1 + 1 + KEY_LEN_MAX + 1 + 20 <= REPLY_LINE_LEN_MAX);
    let line_len = buf.len() - rest.len();
    Some((line_len + line_ending_len(rest)?, reply))
}

/// Reads one line, without its line ending, as a reply.
fn parse_reply(line: &[u8]) -> Result<Reply<'_>, ReplyError> {
    // The JSON of `S` may hold spaces, so it is the rest of the line rather
    // than a field.
    if let Some(json) = line.strip_prefix(b"S ") {
        if !is_valid_json_field(json) {
            return Err(ReplyError::BadJson);
        }
        return Ok(Reply::Stats { json });
    }
    let fields = split_fields::<5>(line);
    let field_count = match fields.get(0) {
        b"T" | b"R" | b"U" => 2,
        b"A" | b"X" => 3,
        b"M" | b"E" | b"P" => 4,
        b"I" => 5,
        // `S` without its JSON.
        b"S" => return Err(ReplyError::FieldCount),
        _ => return Err(ReplyError::UnknownKind),
    };
    if !fields.is_exactly(field_count) {
        return Err(ReplyError::FieldCount);
    }
    let key = parse_key;
    let number = |field| parse_u64(field).ok_or(ReplyError::BadNumber);
    let [kind, first, second, third, fourth] = fields.fields;
    Ok(match kind {
        b"A" => Reply::Acquired { key: key(first)?, token: number(second)? },
        b"T" => Reply::TimedOut { key: key(first)? },
        b"R" => Reply::Released { key: key(first)? },
        b"U" => Reply::Authenticated { name: key(first)? },
        b"X" => Reply::Extended { key: key(first)?, token: number(second)? },
        b"M" => Reply::Moved {
            op: Op::from_field(first).ok_or(ReplyError::BadOp)?,
            key: key(second)?,
            active: parse_address(third)?,
        },
        b"E" => Reply::Error {
            op: match first {
                b"-" => None,
                op => Some(Op::from_field(op).ok_or(ReplyError::BadOp)?),
            },
            key: match second {
                b"-" => None,
                other => Some(key(other)?),
            },
            code: ErrorCode::from_field(third),
        },
        b"P" => Reply::Pong {
            role: Role::from_field(first).ok_or(ReplyError::BadRole)?,
            epoch: number(second)?,
            active: parse_address(third)?,
        },
        b"I" => Reply::Inspected {
            key: key(first)?,
            token: match second {
                b"-" => None,
                token => Some(number(token)?),
            },
            lease_left_ms: number(third)?,
            waiters: number(fourth)?,
        },
        _ => unreachable!("every kind with a field count is decoded above"),
    })
}

/// A key field, which must hold a valid key.
fn parse_key(field: &[u8]) -> Result<&[u8], ReplyError> {
    if is_valid_key(field) { Ok(field) } else { Err(ReplyError::BadKey) }
}

/// An address field: `-` for none, else an address.
fn parse_address(field: &[u8]) -> Result<Option<&[u8]>, ReplyError> {
    match field {
        b"-" => Ok(None),
        address if is_valid_address(address) => Ok(Some(address)),
        _ => Err(ReplyError::BadAddress),
    }
}

/// Whether `json` can be the rest of an `S` line and read back the same.
/// A CR is refused anywhere, not just at the end where the line framing would
/// eat it: compact JSON never holds a raw one.
fn is_valid_json_field(json: &[u8]) -> bool {
    !json.is_empty() && !json.iter().any(|&byte| byte == b'\r' || byte == b'\n')
}

/// Appends `reply` to `out` as one line ended by `\n`.
///
/// The encoder trusts its input, as it runs once per reply on the server's
/// hot path (debug builds assert it): keys must pass [`is_valid_key`],
/// addresses [`is_valid_address`], and the JSON of `S` must be at least one
/// byte with no CR or LF, and make the line at most [`REPLY_LINE_LEN_MAX`]
/// bytes. `Error { key: Some(b"-") }` encodes like `key: None`, since `-`
/// in that position means "no valid key".
///
/// # Examples
///
/// ```
/// use ringlock_proto::{ErrorCode, Op, Reply, encode_reply};
///
/// let mut out = Vec::new();
/// encode_reply(&Reply::Acquired { key: b"k", token: 7 }, &mut out);
/// encode_reply(&Reply::Error { op: Some(Op::Release), key: Some(b"k"), code: ErrorCode::NotHolder }, &mut out);
/// encode_reply(&Reply::Moved { op: Op::Acquire, key: b"k", active: None }, &mut out);
/// assert_eq!(out, b"A k 7\nE R k not-holder\nM A k -\n");
/// ```
#[inline(always)]
pub fn encode_reply(reply: &Reply<'_>, out: &mut Vec<u8>) {
    // The answers to lock requests are most of what a server writes: with a
    // short key they go through one fixed-size line on the stack. This part
    // is inlined, so a caller that builds the reply in place (the server's
    // `ShardReply::to_wire`) has the match folded into its own.
    match *reply {
        Reply::Acquired { key, token } if key.len() <= SHORT_KEY_LEN_MAX => {
            encode_short_lock_reply(b'A', key, Some(token), out)
        }
        Reply::Released { key } if key.len() <= SHORT_KEY_LEN_MAX => encode_short_lock_reply(b'R', key, None, out),
        Reply::TimedOut { key } if key.len() <= SHORT_KEY_LEN_MAX => encode_short_lock_reply(b'T', key, None, out),
        Reply::Extended { key, token } if key.len() <= SHORT_KEY_LEN_MAX => {
            encode_short_lock_reply(b'X', key, Some(token), out)
        }
        _ => encode_any_reply(reply, out),
    }
}

/// Keys up to this long take the fixed-size path of [`encode_reply`].
const SHORT_KEY_LEN_MAX: usize = 32;

/// Room for `<kind> <key> <token>\n` with a short key: the kind and a space,
/// the key, a space, and the token's whole digit window (a token has at most
/// 20 digits, so the newline fits in the window).
const SHORT_LINE_LEN: usize = 2 + SHORT_KEY_LEN_MAX + 1 + DIGITS_WINDOW;

/// Appends `<kind> <key>\n`, or `<kind> <key> <token>\n`, for a key of at
/// most [`SHORT_KEY_LEN_MAX`] bytes. Room of a fixed size is appended from a
/// constant, the fields are stored into it, and it is cut to the line's
/// length: every copy has a size known when compiling (a few moves each),
/// where appending field by field checks the capacity each time and calls
/// `memcpy` for the key. The line is stored in place, not built on the stack
/// and copied, since a copy would read back in whole words bytes just stored
/// in pieces, which stalls (see `DecimalWindow`).
fn encode_short_lock_reply(kind: u8, key: &[u8], token: Option<u64>, out: &mut Vec<u8>) {
    debug_assert!(is_valid_key(key), "encode_reply with an invalid key {key:?}");
    let start = out.len();
    out.extend_from_slice(&[0; SHORT_LINE_LEN]);
    let line: &mut [u8; SHORT_LINE_LEN] = out[start..].first_chunk_mut().expect("room was appended");
    line[0] = kind;
    line[1] = b' ';
    copy_short::<SHORT_KEY_LEN_MAX>(key, line[2..].first_chunk_mut().expect("the key's room"));
    let mut len = 2 + key.len();
    if let Some(token) = token {
        line[len] = b' ';
        len += 1;
        let window = decimal_window(token);
        window.store(line[len..].first_chunk_mut().expect("the token's room"));
        len += window.len;
    }
    // A token has at most 20 digits, so the window leaves room for this.
    line[len] = b'\n';
    out.truncate(start + len + 1);
}

/// [`encode_reply`] for any reply, field by field. Never inlined, so that
/// `encode_reply` stays small where it is inlined.
#[inline(never)]
fn encode_any_reply(reply: &Reply<'_>, out: &mut Vec<u8>) {
    // Besides the key, address and JSON, a reply is at most a kind, an op,
    // a role or code, a 20-digit number and separators: well under 64 bytes.
    let variable_len = match *reply {
        Reply::Moved { key, active, .. } => key.len() + active.map_or(1, <[u8]>::len),
        Reply::Pong { active, .. } => active.map_or(1, <[u8]>::len),
        Reply::Stats { json } => json.len(),
        Reply::Authenticated { name } => name.len(),
        _ => reply.key().map_or(1, <[u8]>::len),
    };
    out.reserve(64 + variable_len);
    match *reply {
        Reply::Acquired { key, token } => {
            out.extend_from_slice(b"A ");
            push_key(key, out);
            out.push(b' ');
            write_u64(token, out);
        }
        Reply::TimedOut { key } => {
            out.extend_from_slice(b"T ");
            push_key(key, out);
        }
        Reply::Released { key } => {
            out.extend_from_slice(b"R ");
            push_key(key, out);
        }
        Reply::Authenticated { name } => {
            out.extend_from_slice(b"U ");
            push_key(name, out);
        }
        Reply::Extended { key, token } => {
            out.extend_from_slice(b"X ");
            push_key(key, out);
            out.push(b' ');
            write_u64(token, out);
        }
        Reply::Moved { op, key, active } => {
            out.extend_from_slice(&[b'M', b' ', op.as_byte(), b' ']);
            push_key(key, out);
            out.push(b' ');
            push_address(active, out);
        }
        Reply::Error { op, key, code } => {
            out.extend_from_slice(&[b'E', b' ', op.map_or(b'-', Op::as_byte), b' ']);
            match key {
                Some(key) => push_key(key, out),
                None => out.push(b'-'),
            }
            out.push(b' ');
            out.extend_from_slice(code.as_str().as_bytes());
        }
        Reply::Pong { role, epoch, active } => {
            out.extend_from_slice(b"P ");
            out.extend_from_slice(role.as_str().as_bytes());
            out.push(b' ');
            write_u64(epoch, out);
            out.push(b' ');
            push_address(active, out);
        }
        Reply::Inspected { key, token, lease_left_ms, waiters } => {
            out.extend_from_slice(b"I ");
            push_key(key, out);
            out.push(b' ');
            match token {
                Some(token) => write_u64(token, out),
                None => out.push(b'-'),
            }
            out.push(b' ');
            write_u64(lease_left_ms, out);
            out.push(b' ');
            write_u64(waiters, out);
        }
        Reply::Stats { json } => {
            debug_assert!(is_valid_json_field(json), "encode_reply with invalid stats JSON");
            debug_assert!(json.len() + 2 <= REPLY_LINE_LEN_MAX, "stats JSON over REPLY_LINE_LEN_MAX");
            out.extend_from_slice(b"S ");
            out.extend_from_slice(json);
        }
    }
    out.push(b'\n');
}

fn push_key(key: &[u8], out: &mut Vec<u8>) {
    debug_assert!(is_valid_key(key), "encode_reply with an invalid key {key:?}");
    out.extend_from_slice(key);
}

fn push_address(address: Option<&[u8]>, out: &mut Vec<u8>) {
    match address {
        Some(address) => {
            debug_assert!(is_valid_address(address), "encode_reply with an invalid address {address:?}");
            out.extend_from_slice(address);
        }
        None => out.push(b'-'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode(line: &[u8]) -> Result<Reply<'_>, ReplyError> {
        match decode_reply(line) {
            Decoded::Line { consumed, item } => {
                assert_eq!(consumed, line.len(), "{:?} is not one whole line", String::from_utf8_lossy(line));
                item
            }
            other => panic!("{:?} decoded as {other:?}", String::from_utf8_lossy(line)),
        }
    }

    fn encode(reply: &Reply<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        encode_reply(reply, &mut out);
        out
    }

    #[test]
    fn short_lock_replies_encode_as_any_reply_does() {
        let mut tokens = vec![0, u64::MAX];
        for power in 0..20 {
            let ten = 10u64.pow(power);
            tokens.extend([ten - 1, ten, ten + 1]);
        }
        for len in 1..=SHORT_KEY_LEN_MAX + 2 {
            let key: Vec<u8> = (0..len).map(|at| b'a' + (at % 26) as u8).collect();
            for &token in &tokens {
                for reply in [
                    Reply::Acquired { key: &key, token },
                    Reply::Released { key: &key },
                    Reply::TimedOut { key: &key },
                    Reply::Extended { key: &key, token },
                ] {
                    let mut expected = b"prefix".to_vec();
                    encode_any_reply(&reply, &mut expected);
                    let mut out = b"prefix".to_vec();
                    encode_reply(&reply, &mut out);
                    assert_eq!(out, expected, "{reply:?}");
                }
            }
        }
    }

    #[test]
    fn decodes_and_encodes_each_kind() {
        let cases: [(&[u8], Reply<'_>); 18] = [
            (b"U billing\n", Reply::Authenticated { name: b"billing" }),
            (
                b"E U - auth-failed\n",
                Reply::Error { op: Some(Op::Authenticate), key: None, code: ErrorCode::AuthFailed },
            ),
            (b"A k 42\n", Reply::Acquired { key: b"k", token: 42 }),
            (b"T k\n", Reply::TimedOut { key: b"k" }),
            (b"R k\n", Reply::Released { key: b"k" }),
            (b"X k 18446744073709551615\n", Reply::Extended { key: b"k", token: u64::MAX }),
            (b"M A k 10.0.0.2:7700\n", Reply::Moved { op: Op::Acquire, key: b"k", active: Some(b"10.0.0.2:7700") }),
            (b"M R k -\n", Reply::Moved { op: Op::Release, key: b"k", active: None }),
            (b"E X k not-holder\n", Reply::Error { op: Some(Op::Extend), key: Some(b"k"), code: ErrorCode::NotHolder }),
            (b"E A - bad-key\n", Reply::Error { op: Some(Op::Acquire), key: None, code: ErrorCode::BadKey }),
            (b"E - - bad-op\n", Reply::Error { op: None, key: None, code: ErrorCode::BadOp }),
            (b"E - - line-too-long\n", Reply::Error { op: None, key: None, code: ErrorCode::LineTooLong }),
            (b"P active 17 [::1]:7700\n", Reply::Pong { role: Role::Active, epoch: 17, active: Some(b"[::1]:7700") }),
            (b"P standby 0 -\n", Reply::Pong { role: Role::Standby, epoch: 0, active: None }),
            (b"S {}\n", Reply::Stats { json: b"{}" }),
            (b"I k - 0 0\n", Reply::Inspected { key: b"k", token: None, lease_left_ms: 0, waiters: 0 }),
            (b"I k 42 1500 3\n", Reply::Inspected { key: b"k", token: Some(42), lease_left_ms: 1500, waiters: 3 }),
            (b"S {\"role\": \"active\", \"keys\": 3}\n", Reply::Stats { json: b"{\"role\": \"active\", \"keys\": 3}" }),
        ];
        for (line, reply) in cases {
            assert_eq!(decode(line), Ok(reply), "{:?}", String::from_utf8_lossy(line));
            assert_eq!(encode(&reply), line, "{reply:?}");
        }
    }

    #[test]
    fn every_error_code_round_trips() {
        for code in ErrorCode::ALL {
            let reply = Reply::Error { op: Some(Op::Acquire), key: Some(b"k"), code };
            let line = encode(&reply);
            assert_eq!(line, format!("E A k {code}\n").into_bytes());
            assert_eq!(decode(&line), Ok(reply));
        }
    }

    #[test]
    fn unknown_error_code_is_unknown() {
        let unknown = Reply::Error { op: Some(Op::Acquire), key: Some(b"k"), code: ErrorCode::Unknown };
        assert_eq!(decode(b"E A k too-many-frobs\n"), Ok(unknown));
        assert_eq!(decode(b"E A k BAD-KEY\n"), Ok(unknown));
        assert_eq!(decode(b"E A k unknown\n"), Ok(unknown));
        assert_eq!(encode(&unknown), b"E A k unknown\n");
    }

    #[test]
    fn crlf_is_accepted() {
        assert_eq!(decode(b"R k\r\n"), Ok(Reply::Released { key: b"k" }));
        assert_eq!(decode(b"S {}\r\n"), Ok(Reply::Stats { json: b"{}" }));
    }

    #[test]
    fn malformed_replies() {
        let cases: [(&[u8], ReplyError); 30] = [
            (b"\n", ReplyError::UnknownKind),
            (b"Q k\n", ReplyError::UnknownKind),
            (b"a k 1\n", ReplyError::UnknownKind),
            (b"AA k 1\n", ReplyError::UnknownKind),
            (b" A k 1\n", ReplyError::UnknownKind),
            (b"\xff\x00\n", ReplyError::UnknownKind),
            (b"A k\n", ReplyError::FieldCount),
            (b"A k 1 2\n", ReplyError::FieldCount),
            (b"A k  1\n", ReplyError::FieldCount),
            (b"A k 1 \n", ReplyError::FieldCount),
            (b"T\n", ReplyError::FieldCount),
            (b"T k 1\n", ReplyError::FieldCount),
            (b"R k \n", ReplyError::FieldCount),
            (b"M A k\n", ReplyError::FieldCount),
            (b"E A k\n", ReplyError::FieldCount),
            (b"E A k bad-key extra\n", ReplyError::FieldCount),
            (b"P active 1\n", ReplyError::FieldCount),
            (b"S\n", ReplyError::FieldCount),
            (b"S \n", ReplyError::BadJson),
            (b"S {\r}\n", ReplyError::BadJson),
            (b"S {}\r\r\n", ReplyError::BadJson),
            (b"A k\0 1\n", ReplyError::BadKey),
            (b"E A k\t bad-key\n", ReplyError::BadKey),
            (b"A k -1\n", ReplyError::BadNumber),
            (b"X k 18446744073709551616\n", ReplyError::BadNumber),
            (b"P active x -\n", ReplyError::BadNumber),
            (b"M Q k -\n", ReplyError::BadOp),
            (b"E a k bad-key\n", ReplyError::BadOp),
            (b"P leader 1 -\n", ReplyError::BadRole),
            (b"M A k host\t1\n", ReplyError::BadAddress),
        ];
        for (line, error) in cases {
            assert_eq!(decode(line), Err(error), "{:?}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn key_length_boundary() {
        let key = vec![b'k'; KEY_LEN_MAX];
        let line = [&b"T "[..], &key, b"\n"].concat();
        assert_eq!(decode(&line), Ok(Reply::TimedOut { key: &key }));
        let key = vec![b'k'; KEY_LEN_MAX + 1];
        let line = [&b"T "[..], &key, b"\n"].concat();
        assert_eq!(decode(&line), Err(ReplyError::BadKey));
    }

    #[test]
    fn error_key_dash_reads_as_no_key() {
        // "-" is a valid key, but not in the key position of an E reply.
        let reply = Reply::Error { op: Some(Op::Acquire), key: Some(b"-"), code: ErrorCode::BadLease };
        assert_eq!(encode(&reply), b"E A - bad-lease\n");
        assert_eq!(
            decode(b"E A - bad-lease\n"),
            Ok(Reply::Error { op: Some(Op::Acquire), key: None, code: ErrorCode::BadLease })
        );
        // Elsewhere "-" is the key "-".
        assert_eq!(decode(b"A - 5\n"), Ok(Reply::Acquired { key: b"-", token: 5 }));
        assert_eq!(decode(b"M A - -\n"), Ok(Reply::Moved { op: Op::Acquire, key: b"-", active: None }));
    }

    #[test]
    fn stats_lines_may_exceed_the_request_limit() {
        let json_len = REPLY_LINE_LEN_MAX - 2;
        let json = vec![b'x'; json_len];
        let line = [&b"S "[..], &json, b"\r\n"].concat();
        assert_eq!(decode(&line), Ok(Reply::Stats { json: &json }));
        assert_eq!(decode_reply(&line[..line.len() - 1]), Decoded::Incomplete);
        let line = [&b"S "[..], &json, b"x\n"].concat();
        assert_eq!(decode_reply(&line), Decoded::LineTooLong);
        assert_eq!(decode_reply(&line[..line.len() - 1]), Decoded::LineTooLong);
    }

    #[test]
    fn pipelined_replies_decode_one_after_another() {
        let buf = b"A k 1\r\nT j\nbogus\nS {\"a\": 1}\nP standby 0 -\nE R k";
        let mut rest = &buf[..];
        let mut decoded = Vec::new();
        while let Decoded::Line { consumed, item } = decode_reply(rest) {
            decoded.push(item);
            rest = &rest[consumed..];
        }
        assert_eq!(
            decoded,
            [
                Ok(Reply::Acquired { key: b"k", token: 1 }),
                Ok(Reply::TimedOut { key: b"j" }),
                Err(ReplyError::UnknownKind),
                Ok(Reply::Stats { json: b"{\"a\": 1}" }),
                Ok(Reply::Pong { role: Role::Standby, epoch: 0, active: None }),
            ]
        );
        assert_eq!(decode_reply(rest), Decoded::Incomplete);
    }

    #[test]
    fn op_and_key_pair_replies_with_requests() {
        type Case<'a> = (Reply<'a>, Option<Op>, Option<&'a [u8]>);
        let cases: [Case<'_>; 10] = [
            (Reply::Acquired { key: b"a", token: 1 }, Some(Op::Acquire), Some(b"a")),
            (Reply::TimedOut { key: b"t" }, Some(Op::Acquire), Some(b"t")),
            (Reply::Released { key: b"r" }, Some(Op::Release), Some(b"r")),
            (Reply::Extended { key: b"x", token: 1 }, Some(Op::Extend), Some(b"x")),
            (Reply::Moved { op: Op::Extend, key: b"m", active: None }, Some(Op::Extend), Some(b"m")),
            (
                Reply::Error { op: Some(Op::Release), key: Some(b"e"), code: ErrorCode::NotHolder },
                Some(Op::Release),
                Some(b"e"),
            ),
            (Reply::Error { op: None, key: None, code: ErrorCode::BadOp }, None, None),
            (Reply::Pong { role: Role::Active, epoch: 1, active: None }, Some(Op::Ping), None),
            (Reply::Stats { json: b"{}" }, Some(Op::Stats), None),
            (
                Reply::Inspected { key: b"i", token: None, lease_left_ms: 0, waiters: 0 },
                Some(Op::Inspect),
                Some(&b"i"[..]),
            ),
        ];
        for (reply, op, key) in cases {
            assert_eq!(reply.op(), op, "{reply:?}");
            assert_eq!(reply.key(), key, "{reply:?}");
        }
    }

    #[test]
    fn role_names() {
        for role in [Role::Active, Role::Standby] {
            assert_eq!(Role::from_field(role.as_str().as_bytes()), Some(role));
            assert_eq!(role.to_string(), role.as_str());
        }
        assert_eq!(Role::from_field(b""), None);
    }

    #[test]
    fn reply_error_is_an_error() {
        let error: Box<dyn std::error::Error> = Box::new(ReplyError::BadRole);
        assert_eq!(error.to_string(), "malformed reply from the server: role is neither active nor standby");
    }

    /// An owned reply, for strategies; `as_reply` borrows from it.
    #[derive(Clone, Debug)]
    enum OwnedReply {
        Acquired(Vec<u8>, u64),
        TimedOut(Vec<u8>),
        Released(Vec<u8>),
        Extended(Vec<u8>, u64),
        Moved(Op, Vec<u8>, Option<Vec<u8>>),
        Error(Option<Op>, Option<Vec<u8>>, ErrorCode),
        Pong(Role, u64, Option<Vec<u8>>),
        Stats(Vec<u8>),
    }

    impl OwnedReply {
        fn as_reply(&self) -> Reply<'_> {
            match self {
                OwnedReply::Acquired(key, token) => Reply::Acquired { key, token: *token },
                OwnedReply::TimedOut(key) => Reply::TimedOut { key },
                OwnedReply::Released(key) => Reply::Released { key },
                OwnedReply::Extended(key, token) => Reply::Extended { key, token: *token },
                OwnedReply::Moved(op, key, active) => Reply::Moved { op: *op, key, active: active.as_deref() },
                OwnedReply::Error(op, key, code) => Reply::Error { op: *op, key: key.as_deref(), code: *code },
                OwnedReply::Pong(role, epoch, active) => {
                    Reply::Pong { role: *role, epoch: *epoch, active: active.as_deref() }
                }
                OwnedReply::Stats(json) => Reply::Stats { json },
            }
        }
    }

    fn valid_key() -> impl Strategy<Value = Vec<u8>> {
        let byte = any::<u8>().prop_filter("forbidden key byte", |&byte| is_valid_key(&[byte]));
        prop_oneof![proptest::collection::vec(byte.clone(), 1..=8), proptest::collection::vec(byte, 1..=KEY_LEN_MAX),]
    }

    fn op() -> impl Strategy<Value = Op> {
        proptest::sample::select(vec![Op::Acquire, Op::Release, Op::Extend, Op::Ping, Op::Stats, Op::Inspect])
    }

    fn address() -> impl Strategy<Value = Option<Vec<u8>>> {
        proptest::option::of(
            "[a-z0-9.:\\[\\]-]{1,60}"
                .prop_filter("- means no address", |address| address != "-")
                .prop_map(String::into_bytes),
        )
    }

    fn valid_reply() -> impl Strategy<Value = OwnedReply> {
        let code =
            proptest::sample::select(ErrorCode::ALL.iter().copied().chain([ErrorCode::Unknown]).collect::<Vec<_>>());
        let role = proptest::sample::select(vec![Role::Active, Role::Standby]);
        let json = proptest::collection::vec(
            any::<u8>().prop_filter("no CR or LF", |&byte| byte != b'\r' && byte != b'\n'),
            1..300,
        );
        prop_oneof![
            (valid_key(), any::<u64>()).prop_map(|(key, token)| OwnedReply::Acquired(key, token)),
            valid_key().prop_map(OwnedReply::TimedOut),
            valid_key().prop_map(OwnedReply::Released),
            (valid_key(), any::<u64>()).prop_map(|(key, token)| OwnedReply::Extended(key, token)),
            (op(), valid_key(), address()).prop_map(|(op, key, active)| OwnedReply::Moved(op, key, active)),
            (
                proptest::option::of(op()),
                proptest::option::of(valid_key().prop_filter("- means no key", |key| key != b"-")),
                code
            )
                .prop_map(|(op, key, code)| OwnedReply::Error(op, key, code)),
            (role, any::<u64>(), address()).prop_map(|(role, epoch, active)| OwnedReply::Pong(role, epoch, active)),
            json.prop_map(OwnedReply::Stats),
        ]
    }

    proptest! {
        #[test]
        fn valid_reply_round_trips(owned in valid_reply(), prefix in proptest::collection::vec(any::<u8>(), 0..4)) {
            let reply = owned.as_reply();
            let mut out = prefix.clone();
            encode_reply(&reply, &mut out);
            prop_assert_eq!(&out[..prefix.len()], &prefix[..], "encoding appends");
            let encoded = &out[prefix.len()..];
            prop_assert_eq!(decode_reply(encoded), Decoded::Line { consumed: encoded.len(), item: Ok(reply) });
        }

        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(
            prop_oneof![Just(b' '), Just(b'\n'), Just(b'-'), Just(b'A'), Just(b'E'), Just(b'S'), Just(b'1'), any::<u8>()], 0..200))
        {
            if let Decoded::Line { consumed, item } = decode_reply(&buf) {
                prop_assert!(consumed > 0 && consumed <= buf.len());
                prop_assert_eq!(buf[consumed - 1], b'\n');
                if let Ok(reply) = item {
                    let line = encode(&reply);
                    prop_assert_eq!(decode_reply(&line), Decoded::Line { consumed: line.len(), item: Ok(reply) });
                }
            }
        }
    }

    /// What `decode_reply` returned before it had a one-pass path: the full
    /// rules alone, which the fast path must agree with on every buffer.
    fn reference_decode(buf: &[u8]) -> Decoded<Result<Reply<'_>, ReplyError>> {
        split_line(buf, REPLY_LINE_LEN_MAX).map(parse_reply)
    }

    /// Bytes at the edges of the grammar, for damaging lines with.
    const EDGE_BYTES: &[u8] = b" \t\r\n\0.09-+ARTXMEPS\x01\x1f\x21\x2f\x3a\x7f\x80\xb0\xff";

    /// A token field as text, near the edges of what a `u64` field accepts.
    fn token_text() -> impl Strategy<Value = Vec<u8>> {
        let decimal = |value: u64| value.to_string().into_bytes();
        prop_oneof![
            any::<u64>().prop_map(decimal),
            (0..25usize, any::<u64>()).prop_map(move |(zeros, value)| [vec![b'0'; zeros], decimal(value)].concat()),
            proptest::sample::select(vec![
                &b"0"[..],
                b"",
                b"9999999999999999999",
                b"10000000000000000000",
                b"18446744073709551615",
                b"18446744073709551616",
                b"99999999999999999999",
                b"099999999999999999999",
                b"+1",
                b"1.5",
            ])
            .prop_map(<[u8]>::to_vec),
        ]
    }

    /// A key field near the edges: short and long valid keys, keys one byte
    /// too long, and keys with control bytes that keys may or may not hold.
    fn key_text() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            4 => valid_key(),
            1 => Just(vec![b'k'; KEY_LEN_MAX]),
            1 => Just(vec![b'k'; KEY_LEN_MAX + 1]),
            1 => proptest::collection::vec(proptest::sample::select(EDGE_BYTES.to_vec()), 0..20),
        ]
    }

    /// Buffers that probe the one-pass decoder: replies of every kind, mostly
    /// of the lock kinds with their own count of fields, then damaged by a few
    /// one-byte edits, with every kind of ending and sometimes more bytes
    /// after them.
    fn probe_buffer() -> impl Strategy<Value = Vec<u8>> {
        let kind = prop_oneof![8 => proptest::sample::select(b"ARTX".to_vec()), 2 => proptest::sample::select(b"MEPS".to_vec()), 1 => any::<u8>()];
        let kind_and_count = kind.prop_flat_map(|kind| {
            let count = match kind {
                b'A' | b'X' => 1,
                _ => 0,
            };
            (Just(kind), prop_oneof![4 => Just(count), 1 => 0..3usize])
        });
        let fields =
            kind_and_count.prop_flat_map(|(kind, count)| (Just(kind), proptest::collection::vec(token_text(), count)));
        let edit = (any::<proptest::sample::Index>(), 0..3u8, proptest::sample::select(EDGE_BYTES.to_vec()));
        let edits = prop_oneof![2 => Just(Vec::new()), 1 => proptest::collection::vec(edit, 1..3)];
        let ending = prop_oneof![
            4 => proptest::sample::select(vec![&b"\n"[..], b"\r\n"]),
            1 => proptest::sample::select(vec![&b"\r"[..], b"", b"\r\r\n", b" \n", b"\n\r"]),
        ];
        let after = proptest::sample::select(vec![&b""[..], b"R k\n", b"\n", b"A k 1"]);
        let key = prop_oneof![8 => key_text().prop_map(Some), 1 => Just(None)];
        (fields, key, edits, ending, after).prop_map(|((kind, fields), key, edits, ending, after)| {
            let mut line = vec![kind];
            for field in key.into_iter().chain(fields) {
                line.push(b' ');
                line.extend_from_slice(&field);
            }
            crate::damage::apply(&mut line, edits);
            line.extend_from_slice(ending);
            line.extend_from_slice(after);
            line
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn probe_buffers_decode_as_the_reference_says(buf in probe_buffer()) {
            prop_assert_eq!(decode_reply(&buf), reference_decode(&buf));
            // The one-pass path accepts only what the full rules accept.
            if let Some((consumed, reply)) = decode_lock_reply(&buf) {
                prop_assert_eq!(reference_decode(&buf), Decoded::Line { consumed, item: Ok(reply) });
            }
            // However the buffer is cut, the decoder agrees with the reference.
            for end in 0..buf.len() {
                prop_assert_eq!(decode_reply(&buf[..end]), reference_decode(&buf[..end]));
            }
        }
    }

    #[test]
    fn the_one_pass_path_reads_the_common_replies() {
        let token = u64::MAX.to_string();
        let cases: [(Vec<u8>, Reply<'_>); 5] = [
            (b"A k 1\n".to_vec(), Reply::Acquired { key: b"k", token: 1 }),
            (format!("X k {token}\r\n").into_bytes(), Reply::Extended { key: b"k", token: u64::MAX }),
            (b"R k\n".to_vec(), Reply::Released { key: b"k" }),
            (b"T k\r\n".to_vec(), Reply::TimedOut { key: b"k" }),
            ([&b"R "[..], &[b'k'; KEY_LEN_MAX], b"\n"].concat(), Reply::Released { key: &[b'k'; KEY_LEN_MAX] }),
        ];
        for (line, reply) in &cases {
            assert_eq!(decode_lock_reply(line), Some((line.len(), *reply)), "{:?}", String::from_utf8_lossy(line));
        }
        // Left to the full rules: other kinds, malformed or incomplete lines,
        // and a token longer than 20 digits, even when it is valid.
        for line in [
            &b"P active 1 -\n"[..],
            b"A k\n",
            b"A k 1 2\n",
            b"A k 1",
            b"R k\r\r\n",
            b"A k 018446744073709551615\n",
            b"A k 18446744073709551616\n",
        ] {
            assert_eq!(decode_lock_reply(line), None, "{:?}", String::from_utf8_lossy(line));
        }
        assert_eq!(decode(b"A k 018446744073709551615\n"), Ok(Reply::Acquired { key: b"k", token: u64::MAX }));
    }
}
