//! The ringlock wire protocol v1: text lines over TCP.
//!
//! This module is shared by the client, the server and the load generator, so
//! that all three agree on every byte. Parsing is zero-copy: decoded requests
//! and replies borrow their keys from the caller's buffer. Encoding appends to
//! a caller's `Vec<u8>`, so a connection can coalesce many lines into one
//! buffer and one `send`.

use std::fmt;

/// Longest key, in bytes.
pub const KEY_LEN_MAX: usize = 250;

/// Longest line, in bytes, not counting its `\n` or `\r\n`.
pub const LINE_LEN_MAX: usize = 1024;

/// Longest wait a request may ask for (86400 s), in milliseconds.
pub const WAIT_MS_MAX: u64 = 86_400_000;

/// Default longest lease (86400 s), in milliseconds; servers may set another.
pub const LEASE_MS_MAX_DEFAULT: u64 = 86_400_000;

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
    /// A code this version does not know (a newer server's).
    Unknown,
}

impl ErrorCode {
    /// Every code this version knows, for tests and documentation.
    pub const ALL: [ErrorCode; 12] = [
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
            ErrorCode::Unknown => "unknown",
        }
    }

    /// The code named by a field; [`ErrorCode::Unknown`] for any other text.
    pub fn from_field(field: &[u8]) -> ErrorCode {
        ErrorCode::ALL
            .into_iter()
            .find(|code| code.as_str().as_bytes() == field)
            .unwrap_or(ErrorCode::Unknown)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
