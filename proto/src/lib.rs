//! The ringlock wire protocol v1: text lines over TCP.
//!
//! This crate is shared by the client, the server, the load generator and the
//! fuzz targets, so that all of them agree on every byte; the client
//! re-exports it as `ringlock_client::proto`. Parsing is zero-copy: decoded requests
//! and replies borrow their keys from the caller's buffer. Encoding appends to
//! a caller's `Vec<u8>`, so a connection can coalesce many lines into one
//! buffer and one `send`.
//!
//! A server loop reads into a buffer and calls [`decode_request`] until it
//! says [`Decoded::Incomplete`], advancing by `consumed` after every line; a
//! client does the same with [`decode_reply`]:
//!
//! ```
//! use ringlock_proto::{Decoded, Reply, Request, decode_request, encode_reply, LEASE_MS_MAX_DEFAULT};
//!
//! let mut input: &[u8] = b"A orders/42 30 0\nA orders/42 0 0\nP";
//! let mut output = Vec::new();
//! while let Decoded::Line { consumed, item } = decode_request(input, LEASE_MS_MAX_DEFAULT) {
//!     match item {
//!         Ok(Request::Acquire { key, .. }) => encode_reply(&Reply::Acquired { key, token: 1 }, &mut output),
//!         Ok(_) => unreachable!(),
//!         Err(error) => encode_reply(&error.to_reply(), &mut output),
//!     }
//!     input = &input[consumed..];
//! }
//! assert_eq!(output, b"A orders/42 1\nE A orders/42 bad-lease\n");
//! assert_eq!(input, b"P", "an incomplete line waits for more bytes");
//! ```
//!
//! # Layout
//! - `lib.rs` (this file): the limits, [`Op`] and [`ErrorCode`], shared by
//!   requests and replies.
//! - `line.rs`: line framing: [`Decoded`], the bounded newline search and
//!   the split of a line into fields.
//! - `number.rs`: decimal `u64` and decimal seconds, parsed and written by
//!   hand ([`parse_u64`], [`write_u64`], [`eight_digits_ascii`],
//!   [`parse_seconds_ms`], [`write_seconds`]).
//! - `clusters.rs`: which of several clusters a key goes to
//!   ([`cluster_score`], [`cluster_index`]).
//! - `key.rs`: what a key and an address may hold ([`is_valid_key`],
//!   [`is_valid_address`]).
//! - `request.rs`: [`Request`], [`RequestError`], [`decode_request`],
//!   [`encode_request`]: the rules a server checks every line against, and
//!   the one-pass reading of a valid line that spares most lines the full
//!   checks.
//! - `reply.rs`: [`Reply`], [`Role`], [`ReplyError`], [`decode_reply`],
//!   [`encode_reply`].

use std::fmt;

mod clusters;
mod key;
mod line;
mod number;
mod reply;
mod request;

pub use clusters::{cluster_index, cluster_score};
pub use key::{copy_short, is_valid_address, is_valid_key};
pub use line::Decoded;
pub use number::{eight_digits_ascii, parse_seconds_ms, parse_u64, write_seconds, write_u64};
pub use reply::{Reply, ReplyError, Role, decode_reply, encode_reply};
pub use request::{Request, RequestError, decode_request, encode_request};

/// Longest key, in bytes.
pub const KEY_LEN_MAX: usize = 250;

/// Longest request line, in bytes, not counting its `\n` or `\r\n`. Replies
/// have their own, larger limit, [`REPLY_LINE_LEN_MAX`].
pub const LINE_LEN_MAX: usize = 1024;

/// Longest reply line a client accepts, in bytes, not counting its `\n` or
/// `\r\n`.
///
/// Replies other than `S` are short (a key, an address and a number), but the
/// JSON of `S` grows with the counters a server reports, so replies get more
/// room than requests. A server must keep its `S` line within this.
pub const REPLY_LINE_LEN_MAX: usize = 65_536;

/// Longest wait a request may ask for (86400 s), in milliseconds.
pub const WAIT_MS_MAX: u64 = 86_400_000;

/// Default longest lease (86400 s), in milliseconds; servers may set another.
pub const LEASE_MS_MAX_DEFAULT: u64 = 86_400_000;

/// Most nodes in a cluster: a server refuses a longer `--peers`, the peer
/// protocol refuses a larger cluster, and a client takes at most this many
/// addresses.
///
/// ```
/// assert_eq!(ringlock_proto::NODES_MAX, 16);
/// ```
pub const NODES_MAX: usize = 16;

/// The operation of a request, echoed in its reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `A`: acquire a key.
    Acquire,
    /// `R`: release a grant.
    Release,
    /// `X`: extend a grant's lease.
    Extend,
    /// `P`: ping.
    Ping,
    /// `S`: statistics.
    Stats,
    /// `I`: inspect a key (its holder, lease left and waiters).
    Inspect,
    /// `U`: authenticate the connection with a secret.
    Authenticate,
}

impl Op {
    /// The operation's letter on the wire.
    pub const fn as_byte(self) -> u8 {
        match self {
            Op::Acquire => b'A',
            Op::Release => b'R',
            Op::Extend => b'X',
            Op::Ping => b'P',
            Op::Stats => b'S',
            Op::Inspect => b'I',
            Op::Authenticate => b'U',
        }
    }

    /// The operation named by a field, if it is exactly one known letter.
    pub const fn from_field(field: &[u8]) -> Option<Op> {
        match field {
            b"A" => Some(Op::Acquire),
            b"R" => Some(Op::Release),
            b"X" => Some(Op::Extend),
            b"P" => Some(Op::Ping),
            b"S" => Some(Op::Stats),
            b"I" => Some(Op::Inspect),
            b"U" => Some(Op::Authenticate),
            _ => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.as_byte() as char)
    }
}

/// An error code of an `E` reply. Every code is documented in the README.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// A known operation with missing or extra fields.
    BadRequest,
    /// `R` or `X` with a token that does not hold the key now.
    NotHolder,
    /// A lease that is not a valid decimal number of seconds in range.
    BadLease,
    /// A wait that is not a valid decimal number of seconds in range.
    BadWait,
    /// A token that is not a decimal `u64`.
    BadToken,
    /// A key that is empty, too long, or holds a forbidden byte.
    BadKey,
    /// An unknown operation or an empty line.
    BadOp,
    /// A line over [`LINE_LEN_MAX`] bytes; the server closes the connection.
    LineTooLong,
    /// The key's queue is full.
    TooManyWaiters,
    /// The shard holds as many keys as it may.
    TooManyKeys,
    /// The server has as many connections as it may; it closes this one.
    TooManyConnections,
    /// The server is stopping and has no successor to hand over to.
    ShuttingDown,
    /// A request other than `P` before the connection authenticated (`U`),
    /// on a server with `--auth-file`.
    AuthRequired,
    /// `U` with a secret that names nobody; the connection is then closed.
    AuthFailed,
    /// A key outside the authenticated name's scope, or `S` without `stats`.
    Forbidden,
    /// The connection's name was removed from the auth file by a reload;
    /// the connection is then closed.
    AuthRevoked,
    /// `U` on a server without `--auth-file`.
    AuthDisabled,
    /// `A` or `X` on an active started with `--min-standbys` that has had
    /// too few caught-up standbys for `--failover-ms`: nothing is granted
    /// until enough are back (held locks stay held). Retry later or elsewhere.
    NoStandby,
    /// A code this version does not know (a newer server's).
    Unknown,
}

impl ErrorCode {
    /// Every code this version knows, for tests and documentation.
    pub const ALL: [ErrorCode; 18] = [
        ErrorCode::BadRequest,
        ErrorCode::NotHolder,
        ErrorCode::BadLease,
        ErrorCode::BadWait,
        ErrorCode::BadToken,
        ErrorCode::BadKey,
        ErrorCode::BadOp,
        ErrorCode::LineTooLong,
        ErrorCode::TooManyWaiters,
        ErrorCode::TooManyKeys,
        ErrorCode::TooManyConnections,
        ErrorCode::ShuttingDown,
        ErrorCode::AuthRequired,
        ErrorCode::AuthFailed,
        ErrorCode::Forbidden,
        ErrorCode::AuthRevoked,
        ErrorCode::AuthDisabled,
        ErrorCode::NoStandby,
    ];

    /// The code's name on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad-request",
            ErrorCode::NotHolder => "not-holder",
            ErrorCode::BadLease => "bad-lease",
            ErrorCode::BadWait => "bad-wait",
            ErrorCode::BadToken => "bad-token",
            ErrorCode::BadKey => "bad-key",
            ErrorCode::BadOp => "bad-op",
            ErrorCode::LineTooLong => "line-too-long",
            ErrorCode::TooManyWaiters => "too-many-waiters",
            ErrorCode::TooManyKeys => "too-many-keys",
            ErrorCode::TooManyConnections => "too-many-connections",
            ErrorCode::ShuttingDown => "shutting-down",
            ErrorCode::AuthRequired => "auth-required",
            ErrorCode::AuthFailed => "auth-failed",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::AuthRevoked => "auth-revoked",
            ErrorCode::AuthDisabled => "auth-disabled",
            ErrorCode::NoStandby => "no-standby",
            ErrorCode::Unknown => "unknown",
        }
    }

    /// The code's place in [`ErrorCode::ALL`], for arrays of counters indexed
    /// by code; `None` for [`ErrorCode::Unknown`], which is not counted.
    ///
    /// ```
    /// use ringlock_proto::ErrorCode;
    ///
    /// assert_eq!(ErrorCode::BadRequest.index(), Some(0));
    /// assert_eq!(ErrorCode::Unknown.index(), None);
    /// ```
    pub const fn index(self) -> Option<usize> {
        let index = match self {
            ErrorCode::BadRequest => 0,
            ErrorCode::NotHolder => 1,
            ErrorCode::BadLease => 2,
            ErrorCode::BadWait => 3,
            ErrorCode::BadToken => 4,
            ErrorCode::BadKey => 5,
            ErrorCode::BadOp => 6,
            ErrorCode::LineTooLong => 7,
            ErrorCode::TooManyWaiters => 8,
            ErrorCode::TooManyKeys => 9,
            ErrorCode::TooManyConnections => 10,
            ErrorCode::ShuttingDown => 11,
            ErrorCode::AuthRequired => 12,
            ErrorCode::AuthFailed => 13,
            ErrorCode::Forbidden => 14,
            ErrorCode::AuthRevoked => 15,
            ErrorCode::AuthDisabled => 16,
            ErrorCode::NoStandby => 17,
            ErrorCode::Unknown => return None,
        };
        Some(index)
    }

    /// The code named by a field; [`ErrorCode::Unknown`] for any other text.
    pub fn from_field(field: &[u8]) -> ErrorCode {
        ErrorCode::ALL.into_iter().find(|code| code.as_str().as_bytes() == field).unwrap_or(ErrorCode::Unknown)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_is_the_place_in_all() {
        for (place, code) in ErrorCode::ALL.into_iter().enumerate() {
            assert_eq!(code.index(), Some(place), "{code}");
        }
        assert_eq!(ErrorCode::Unknown.index(), None);
    }
}

/// Test support shared by the codec's property tests.
#[cfg(test)]
pub(crate) mod damage {
    /// One edit of a line: where, what (0 insert, 1 overwrite, 2 remove) and the byte.
    pub type Edit = (proptest::sample::Index, u8, u8);

    /// Applies one-byte edits in turn; one that falls past the end appends.
    pub fn apply(line: &mut Vec<u8>, edits: Vec<Edit>) {
        for (at, kind, byte) in edits {
            let at = at.index(line.len() + 1);
            match kind {
                0 => line.insert(at, byte),
                1 if at < line.len() => line[at] = byte,
                _ if at < line.len() => drop(line.remove(at)),
                _ => line.push(byte),
            }
        }
    }
}
