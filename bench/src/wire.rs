//! What the load generator sends to each target and how it reads the answer:
//! ringlock's line protocol (through `ringlock_proto`), Redis used as
//! a lock (RESP), and the echo server (ringlock's request lines, answered by
//! one fixed line each).

use ringlock_proto::{Decoded, ErrorCode, Op, Reply, Request, decode_reply, encode_request};

use crate::echo_server::ECHO_TOKEN;
use crate::keys::KeyFormat;
use crate::pending::PendingOp;
use crate::resp::{self, RespValue};

/// The compare-and-delete release every Redis lock recipe uses.
pub const REDIS_RELEASE_SCRIPT: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// How Redis releases a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisRelease {
    /// `EVALSHA <sha> 1 key token` of [`REDIS_RELEASE_SCRIPT`]: safe.
    CompareAndDelete { sha: [u8; 40] },
    /// `DEL key`: faster, but may delete someone else's lock.
    Delete,
}

/// The protocol of the target under test.
#[derive(Clone, Copy, Debug)]
pub enum Wire {
    Ringlock,
    Redis(RedisRelease),
    Echo,
}

/// Why a request did not do what it asked for, or a reply that made no sense.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ErrorKind {
    /// ringlock's `T`: the wait ran out.
    WaitExpired,
    /// A request still unanswered when the run ended.
    NoReply,
    /// ringlock's `E` codes, in `ErrorCode::ALL` order, then an unknown one.
    Server(ErrorCode),
    /// ringlock's `M`: not the active node.
    Moved,
    /// Redis answered nil to `SET NX`: the key was held.
    Busy,
    /// Redis's compare-and-delete found another token (or no key).
    RedisNotHolder,
    /// Redis answered `-ERR...`.
    RedisError,
    /// A reply that matched no request in flight.
    Unpaired,
    /// A reply that could not be read, or was not one this request can get.
    BadReply,
    /// The server closed the connection (or the socket failed).
    ConnectionClosed,
}

impl ErrorKind {
    /// How many kinds there are: the length of a counter array.
    pub const COUNT: usize = 10 + ErrorCode::ALL.len();

    /// Position in a counter array.
    pub fn index(self) -> usize {
        match self {
            ErrorKind::WaitExpired => 0,
            ErrorKind::NoReply => 1,
            ErrorKind::Moved => 2,
            ErrorKind::Busy => 3,
            ErrorKind::RedisNotHolder => 4,
            ErrorKind::RedisError => 5,
            ErrorKind::Unpaired => 6,
            ErrorKind::BadReply => 7,
            ErrorKind::ConnectionClosed => 8,
            ErrorKind::Server(code) => 9 + code.index().unwrap_or(ErrorCode::ALL.len()),
        }
    }

    /// Every kind, in index order.
    pub fn all() -> [ErrorKind; ErrorKind::COUNT] {
        let mut all = [ErrorKind::WaitExpired; ErrorKind::COUNT];
        let fixed = [
            ErrorKind::WaitExpired,
            ErrorKind::NoReply,
            ErrorKind::Moved,
            ErrorKind::Busy,
            ErrorKind::RedisNotHolder,
            ErrorKind::RedisError,
            ErrorKind::Unpaired,
            ErrorKind::BadReply,
            ErrorKind::ConnectionClosed,
        ];
        all[..fixed.len()].copy_from_slice(&fixed);
        for (slot, code) in all[fixed.len()..].iter_mut().zip(ErrorCode::ALL.into_iter().chain([ErrorCode::Unknown])) {
            *slot = ErrorKind::Server(code);
        }
        all
    }

    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::WaitExpired => "wait-expired",
            ErrorKind::NoReply => "no-reply",
            ErrorKind::Moved => "moved",
            ErrorKind::Busy => "busy",
            ErrorKind::RedisNotHolder => "redis-not-holder",
            ErrorKind::RedisError => "redis-error",
            ErrorKind::Unpaired => "unpaired-reply",
            ErrorKind::BadReply => "bad-reply",
            ErrorKind::ConnectionClosed => "connection-closed",
            ErrorKind::Server(code) => code.as_str(),
        }
    }

    /// Timeouts are reported apart from errors.
    pub fn is_timeout(self) -> bool {
        matches!(self, ErrorKind::WaitExpired | ErrorKind::NoReply)
    }
}

/// What became of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Granted { token: u64 },
    Released,
    Failed(ErrorKind),
}

/// An acquire line encoded once by the codec, whose key digits are written
/// over for every request: acquires of one run differ only by key, and
/// formatting the lease and wait again for each would be the load
/// generator's largest cost after parsing.
#[derive(Clone, Debug)]
pub struct AcquireLine {
    line: Vec<u8>,
    key_at: usize,
}

impl AcquireLine {
    /// Appends the acquire of key number `id`.
    pub fn encode(&self, keys: &KeyFormat, id: u64, out: &mut Vec<u8>) {
        let start = out.len() + self.key_at;
        out.extend_from_slice(&self.line);
        keys.write_into(id, &mut out[start..start + keys.len()]);
    }
}

/// A decoded reply, before it is paired with its lane.
#[derive(Clone, Copy, Debug)]
pub enum Parsed {
    /// ringlock: the reply names its request.
    Keyed { op: PendingOp, key: u64, outcome: Outcome },
    /// ringlock: a reply that names no request of ours (`E - - code`, a
    /// key of another format); it cannot be paired.
    Unkeyed(ErrorKind),
    /// Redis and echo answer in order: the first request in flight is the
    /// one answered, and what the reply means depends on what it asked.
    Ordered(OrderedReply),
}

/// An in-order reply, to be read in the light of its request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderedReply {
    Ok,
    Nil,
    Integer(i64),
    Error,
    /// Unreadable or of an unexpected kind.
    Bad,
    /// The echo server's line.
    Echo,
}

impl OrderedReply {
    /// What the reply says of a request `op` that sent `token`.
    pub fn outcome(self, op: PendingOp, token: u64) -> Outcome {
        match (op, self) {
            (PendingOp::Acquire, OrderedReply::Echo) => Outcome::Granted { token },
            (PendingOp::Release, OrderedReply::Echo) => Outcome::Released,
            (PendingOp::Acquire, OrderedReply::Ok) => Outcome::Granted { token },
            (PendingOp::Acquire, OrderedReply::Nil) => Outcome::Failed(ErrorKind::Busy),
            (PendingOp::Release, OrderedReply::Integer(1)) => Outcome::Released,
            (PendingOp::Release, OrderedReply::Integer(0)) => Outcome::Failed(ErrorKind::RedisNotHolder),
            (_, OrderedReply::Error) => Outcome::Failed(ErrorKind::RedisError),
            _ => Outcome::Failed(ErrorKind::BadReply),
        }
    }
}

impl Wire {
    /// Whether replies come back in request order (and so pair by order).
    pub fn is_ordered(&self) -> bool {
        !matches!(self, Wire::Ringlock)
    }

    /// The token an acquire should send, for targets where the client picks
    /// it (Redis stores it as the lock's value); ringlock ignores it.
    pub fn acquire_token(&self, proposed: u64) -> u64 {
        match self {
            Wire::Echo => ECHO_TOKEN,
            _ => proposed,
        }
    }

    /// The acquire line to patch, for targets that speak ringlock's lines.
    pub fn acquire_line(&self, keys: &KeyFormat, lease_ms: u64, wait_ms: u64) -> Option<AcquireLine> {
        if matches!(self, Wire::Redis(_)) {
            return None;
        }
        let mut key_buffer = [0u8; crate::keys::KEY_LEN_MAX];
        let key = keys.write(0, &mut key_buffer);
        let mut line = Vec::new();
        encode_request(&Request::Acquire { key, lease_ms, wait_ms }, &mut line);
        // `A <key> ...`: the key starts after the op and its space.
        let key_at = 2;
        assert_eq!(&line[key_at..key_at + key.len()], key, "the codec writes `A <key> <lease> <wait>`");
        Some(AcquireLine { line, key_at })
    }

    /// Appends an acquire of `key`.
    pub fn encode_acquire(&self, key: &[u8], token: u64, lease_ms: u64, wait_ms: u64, out: &mut Vec<u8>) {
        match self {
            Wire::Ringlock | Wire::Echo => encode_request(&Request::Acquire { key, lease_ms, wait_ms }, out),
            Wire::Redis(_) => {
                let mut token_text = [0u8; 20];
                let mut lease_text = [0u8; 20];
                resp::encode_command(
                    &[b"SET", key, decimal(token, &mut token_text), b"NX", b"PX", decimal(lease_ms, &mut lease_text)],
                    out,
                );
            }
        }
    }

    /// Appends a release of the grant of `key` with `token`.
    pub fn encode_release(&self, key: &[u8], token: u64, out: &mut Vec<u8>) {
        match self {
            Wire::Ringlock | Wire::Echo => encode_request(&Request::Release { key, token }, out),
            Wire::Redis(RedisRelease::CompareAndDelete { sha }) => {
                let mut token_text = [0u8; 20];
                resp::encode_command(&[b"EVALSHA", sha, b"1", key, decimal(token, &mut token_text)], out);
            }
            Wire::Redis(RedisRelease::Delete) => resp::encode_command(&[b"DEL", key], out),
        }
    }

    /// Decodes the first reply of `buf`.
    pub fn decode(&self, buf: &[u8], keys: &KeyFormat) -> Decoded<Parsed> {
        match self {
            Wire::Ringlock => decode_reply(buf).map(|item| match item {
                Ok(reply) => ringlock_reply(&reply, keys),
                Err(_) => Parsed::Unkeyed(ErrorKind::BadReply),
            }),
            Wire::Redis(_) => resp::decode(buf).map(|item| {
                Parsed::Ordered(match item {
                    Ok(RespValue::Simple(b"OK")) => OrderedReply::Ok,
                    Ok(RespValue::Nil) => OrderedReply::Nil,
                    Ok(RespValue::Integer(value)) => OrderedReply::Integer(value),
                    Ok(RespValue::Error(_)) => OrderedReply::Error,
                    _ => OrderedReply::Bad,
                })
            }),
            Wire::Echo => match buf.iter().position(|&byte| byte == b'\n') {
                Some(newline) => Decoded::Line { consumed: newline + 1, item: Parsed::Ordered(OrderedReply::Echo) },
                None if buf.len() > 4096 => Decoded::LineTooLong,
                None => Decoded::Incomplete,
            },
        }
    }
}

fn ringlock_reply(reply: &Reply<'_>, keys: &KeyFormat) -> Parsed {
    let keyed = |op: PendingOp, key: &[u8], outcome: Outcome| match keys.parse(key) {
        Some(key) => Parsed::Keyed { op, key, outcome },
        None => Parsed::Unkeyed(ErrorKind::Unpaired),
    };
    let pending_op = |op: Op| match op {
        Op::Acquire => Some(PendingOp::Acquire),
        Op::Release => Some(PendingOp::Release),
        _ => None,
    };
    match *reply {
        Reply::Acquired { key, token } => keyed(PendingOp::Acquire, key, Outcome::Granted { token }),
        Reply::TimedOut { key } => keyed(PendingOp::Acquire, key, Outcome::Failed(ErrorKind::WaitExpired)),
        Reply::Released { key } => keyed(PendingOp::Release, key, Outcome::Released),
        Reply::Moved { op, key, .. } => match pending_op(op) {
            Some(op) => keyed(op, key, Outcome::Failed(ErrorKind::Moved)),
            None => Parsed::Unkeyed(ErrorKind::Moved),
        },
        Reply::Error { op: Some(op), key: Some(key), code } => match pending_op(op) {
            Some(op) => keyed(op, key, Outcome::Failed(ErrorKind::Server(code))),
            None => Parsed::Unkeyed(ErrorKind::Server(code)),
        },
        Reply::Error { code, .. } => Parsed::Unkeyed(ErrorKind::Server(code)),
        Reply::Extended { .. }
        | Reply::Pong { .. }
        | Reply::Stats { .. }
        | Reply::Inspected { .. }
        | Reply::Authenticated { .. } => Parsed::Unkeyed(ErrorKind::Unpaired),
    }
}

/// `value` in decimal, written into a stack buffer (the codec's `write_u64`
/// appends to a `Vec`, but a RESP argument needs its length first).
fn decimal(value: u64, buffer: &mut [u8; 20]) -> &[u8] {
    let mut rest = value;
    let mut start = buffer.len();
    loop {
        start -= 1;
        buffer[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    &buffer[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_index_and_name() {
        let all = ErrorKind::all();
        for (index, kind) in all.iter().enumerate() {
            assert_eq!(kind.index(), index, "{kind:?}");
        }
        let mut names: Vec<_> = all.iter().map(|kind| kind.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorKind::COUNT);
    }

    #[test]
    fn ringlock_replies_pair_by_op_and_key() {
        let keys = KeyFormat::new(4, 1000).unwrap();
        let parse = |line: &[u8]| match Wire::Ringlock.decode(line, &keys) {
            Decoded::Line { item, .. } => item,
            other => panic!("{other:?}"),
        };
        assert!(matches!(
            parse(b"A k042 77\n"),
            Parsed::Keyed { op: PendingOp::Acquire, key: 42, outcome: Outcome::Granted { token: 77 } }
        ));
        assert!(matches!(
            parse(b"R k042\n"),
            Parsed::Keyed { op: PendingOp::Release, key: 42, outcome: Outcome::Released }
        ));
        assert!(matches!(
            parse(b"T k001\n"),
            Parsed::Keyed { op: PendingOp::Acquire, key: 1, outcome: Outcome::Failed(ErrorKind::WaitExpired) }
        ));
        assert!(matches!(
            parse(b"E R k001 not-holder\n"),
            Parsed::Keyed {
                op: PendingOp::Release,
                key: 1,
                outcome: Outcome::Failed(ErrorKind::Server(ErrorCode::NotHolder))
            }
        ));
        assert!(matches!(parse(b"E - - bad-op\n"), Parsed::Unkeyed(ErrorKind::Server(ErrorCode::BadOp))));
    }

    #[test]
    fn patched_acquire_lines_match_the_codec() {
        let keys = KeyFormat::new(16, 10_000_000).unwrap();
        let template = Wire::Ringlock.acquire_line(&keys, 30_000, 2_500).unwrap();
        let mut key_buffer = [0u8; crate::keys::KEY_LEN_MAX];
        let mut patched = b"prefix".to_vec();
        let mut expected = patched.clone();
        for id in [0, 7, 9_999_999, 1234] {
            template.encode(&keys, id, &mut patched);
            let key = keys.write(id, &mut key_buffer);
            encode_request(&Request::Acquire { key, lease_ms: 30_000, wait_ms: 2_500 }, &mut expected);
        }
        assert_eq!(patched, expected);
        assert!(Wire::Redis(RedisRelease::Delete).acquire_line(&keys, 1, 1).is_none());
    }

    #[test]
    fn redis_commands_and_meanings() {
        let mut out = Vec::new();
        let wire = Wire::Redis(RedisRelease::CompareAndDelete { sha: [b'a'; 40] });
        wire.encode_acquire(b"k1", 9, 30_000, 0, &mut out);
        assert_eq!(out, b"*6\r\n$3\r\nSET\r\n$2\r\nk1\r\n$1\r\n9\r\n$2\r\nNX\r\n$2\r\nPX\r\n$5\r\n30000\r\n");
        out.clear();
        wire.encode_release(b"k1", 9, &mut out);
        assert!(out.starts_with(b"*5\r\n$7\r\nEVALSHA\r\n$40\r\naaaa"));
        assert_eq!(OrderedReply::Nil.outcome(PendingOp::Acquire, 9), Outcome::Failed(ErrorKind::Busy));
        assert_eq!(OrderedReply::Integer(1).outcome(PendingOp::Release, 9), Outcome::Released);
        assert_eq!(OrderedReply::Ok.outcome(PendingOp::Release, 9), Outcome::Failed(ErrorKind::BadReply));
    }
}
